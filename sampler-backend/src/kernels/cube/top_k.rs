//! The top-k kernel (`topk_rows`): a floor from a sample spread over the
//! row, one pass that compacts the logits above it (and validates the row),
//! a radix select when too many lie above the floor, the rank pass; history
//! penalties applied inside the selection. The row is read as vectors of
//! `N` logits (16-byte loads at `N = 4`; `N = 1` for a width that is not a
//! multiple of 4), the compaction pass with [`LOADS_IN_FLIGHT`] loads
//! issued before the first is used. At small batches the floor and the
//! compaction run as kernels of their own, the compaction split over
//! several workgroups a row (`top_k_split.rs`), and `topk_rows` with
//! `split` takes their results instead of reading the row.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{clear_atomics, logit_at, order_key, shared_min, thread_chunk};
use super::top_k_split::{compact_range, sample_floor};

/// Bins of one radix pass (8 bits).
const BINS: usize = 256;

#[cube(launch_unchecked)]
pub(crate) fn topk_rows<N: Size>(
    logits: &[Vector<f32, N>],
    k_row: &[i32],
    hist_ids: &[i32],
    hist_counts: &[f32],
    repeat: &[f32],
    frequency: &[f32],
    presence: &[f32],
    out_vals: &mut [f32],
    out_pos: &mut [i32],
    out_order: &mut [i32],
    out_bad: &mut [i32],
    out_above: &mut [i32],
    floor_in: &[u32],
    count_in: &[u32],
    cand_in: &[u32],
    part_bad: &[u32],
    width: u32,
    lanes: u32,
    sample_end: u32,
    sample_stride: u32,
    k: u32,
    k_out: u32,
    h: u32,
    pad_base: u32,
    parts: u32,
    #[comptime] units: usize,
    #[comptime] k_cap: usize,
    #[comptime] pen: bool,
    #[comptime] h_cap: usize,
    #[comptime] split: bool,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    // The row's vectors: `row_v` of them from vector `base`.
    let row_v = width / lanes;
    let base = row * row_v;

    // History penalties (`pen`): the row's `h` history tokens, penalised
    // (the CPU rule), with their keys (0 for padding: below every logit's
    // key). The selection below then runs on the raw logits with `k` =
    // `k_out + h`: at most `h` of those are history tokens, so the rest hold
    // the top `k_out` of the tokens the penalties leave alone; the history
    // tokens among them are dropped and the penalised ones join the ranking.
    let mut hkey = Shared::<[u32]>::new_slice(h_cap);
    let mut hpos = Shared::<[u32]>::new_slice(h_cap);
    let mut hval = Shared::<[f32]>::new_slice(h_cap);
    let tally = Shared::<[Atomic<u32>]>::new_slice(2usize);
    if comptime!(pen) {
        if tid == 0u32 {
            tally[0].store(0u32);
            tally[1].store(0u32);
        }
        sync_cube();
        let mut j = tid;
        while j < h {
            let at = row * h + j;
            let c = hist_counts[at as usize];
            let id = u32::cast_from(hist_ids[at as usize]);
            let orig = logit_at::<N>(logits, base, id, lanes);
            let r = repeat[row as usize];
            let scaled = select(orig <= 0.0f32, orig * r, orig / r);
            let l = scaled - (c * frequency[row as usize] + presence[row as usize]);
            // A finite logit saturates at ±f32::MAX; -inf stays -inf.
            let lb = u32::reinterpret(l);
            let sat = select(
                (lb & 0x8000_0000u32) != 0u32,
                f32::reinterpret(0xFF7F_FFFFu32),
                f32::reinterpret(0x7F7F_FFFFu32),
            );
            let l = select((lb & 0x7FFF_FFFFu32) == 0x7F80_0000u32, sat, l);
            let v = select(u32::reinterpret(orig) == 0xFF80_0000u32, orig, l);
            let live = c > 0.0f32;
            hkey[j as usize] = select(live, order_key(v), 0u32);
            hpos[j as usize] = id;
            hval[j as usize] = v;
            if live {
                tally[1].fetch_add(1u32);
            }
            j += CUBE_DIM;
        }
    }

    let hist = Shared::<[Atomic<u32>]>::new_slice(BINS);
    let mut sel = Shared::<[u32]>::new_slice(2usize);
    let mut cnt_gt = Shared::<[u32]>::new_slice(units);
    let mut cnt_eq = Shared::<[u32]>::new_slice(units);
    let mut cand_key = Shared::<[u32]>::new_slice(k_cap);
    let mut cand_pos = Shared::<[u32]>::new_slice(k_cap);
    let mut tmax = Shared::<[u32]>::new_slice(units);
    let mut floor = Shared::<[u32]>::new_slice(1usize);
    let counter = Shared::<[Atomic<u32>]>::new_slice(1usize);
    let mut bads = Shared::<[u32]>::new_slice(units);

    let none = 2u32 * width;
    let mut bad = none;
    // Split: the floor and the compaction ran as kernels of their own
    // (`topk_floor_rows`, `topk_compact_part_rows`): the candidates come
    // from the row's global slots, the validation from the segments'.
    let low = if comptime!(split) {
        floor_in[row as usize]
    } else {
        sample_floor::<N>(
            logits,
            base,
            row_v,
            sample_end,
            sample_stride,
            k,
            &mut tmax,
            &mut floor,
        )
    };
    if comptime!(split) {
        let found = count_in[row as usize];
        let held_g = select(found < k_cap as u32, found, k_cap as u32);
        let mut c = tid;
        while c < held_g {
            let at = 2u32 * (row * k_cap as u32 + c);
            cand_key[c as usize] = cand_in[at as usize];
            cand_pos[c as usize] = cand_in[(at + 1u32) as usize];
            c += CUBE_DIM;
        }
        let mut j = tid;
        while j < parts {
            let pb = part_bad[(row * parts + j) as usize];
            if pb < bad {
                bad = pb;
            }
            j += CUBE_DIM;
        }
    } else {
        // Fast path: the keys at or above the floor, compacted into shared
        // memory (any order); when they fit, ranking them gives the top k
        // without the radix passes below (a uniform flag: the passes still
        // meet every barrier, with nothing to do). The same pass validates
        // the row (first NaN / +inf, as `first_bad`).
        if tid == 0u32 {
            counter[0].store(0u32);
        }
        sync_cube();
        bad = compact_range::<N>(
            logits,
            base,
            0u32,
            row_v,
            lanes,
            low,
            none,
            &counter,
            &mut cand_key,
            &mut cand_pos,
            k_cap,
        );
    }
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
    let compacted = if comptime!(split) {
        count_in[row as usize]
    } else {
        counter[0].load()
    };
    let fast = compacted <= k_cap as u32;
    if tid == 0u32 {
        out_above[row as usize] = i32::cast_from(compacted);
    }

    // Radix select, most significant byte first: `prefix` holds the bytes
    // of the k-th largest key found so far, `remaining` the rank still
    // sought among the keys that share them.
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut remaining = k;
    for pass in 0..4u32 {
        let shift = 24u32 - pass * 8u32;
        clear_atomics(&hist, 256u32);
        sync_cube();
        let mut i = tid;
        while i < row_v && !fast {
            let v = logits[(base + i) as usize];
            #[unroll]
            for j in 0..N::value() {
                let key = order_key(v.extract(j));
                if key >= low && (key & mask) == prefix {
                    hist[((key >> shift) & 255u32) as usize].fetch_add(1u32);
                }
            }
            i += CUBE_DIM;
        }
        sync_cube();
        if tid == 0u32 && !fast {
            let mut above = 0u32;
            let mut chosen = 0u32;
            let mut need = remaining;
            let mut done = false;
            for j in 0..256u32 {
                let bin = 255u32 - j;
                let c = hist[bin as usize].load();
                if !done {
                    if above + c >= remaining {
                        chosen = bin;
                        need = remaining - above;
                        done = true;
                    } else {
                        above += c;
                    }
                }
            }
            sel[0] = chosen;
            sel[1] = need;
        }
        sync_cube();
        prefix |= sel[0] << shift;
        mask |= 255u32 << shift;
        remaining = sel[1];
        sync_cube();
    }
    // `prefix` is the k-th largest key; `remaining` of its ties are kept
    // (the lowest positions), after the `k - remaining` larger keys.
    let count_gt = k - remaining;

    // Survivors in ascending position: each thread owns a contiguous chunk
    // of vectors.
    let (start, end) = thread_chunk(row_v);
    let mut gt = 0u32;
    let mut eq = 0u32;
    if !fast {
        for i in start..end {
            let v = logits[(base + i) as usize];
            #[unroll]
            for j in 0..N::value() {
                let key = order_key(v.extract(j));
                if key > prefix {
                    gt += 1u32;
                } else if key == prefix {
                    eq += 1u32;
                }
            }
        }
    }
    cnt_gt[tid as usize] = gt;
    cnt_eq[tid as usize] = eq;
    sync_cube();
    if tid == 0u32 {
        let mut run_gt = 0u32;
        let mut run_eq = 0u32;
        for t in 0..CUBE_DIM {
            let g = cnt_gt[t as usize];
            let e = cnt_eq[t as usize];
            cnt_gt[t as usize] = run_gt;
            cnt_eq[t as usize] = run_eq;
            run_gt += g;
            run_eq += e;
        }
    }
    sync_cube();
    let mut og = cnt_gt[tid as usize];
    let mut oe = cnt_eq[tid as usize];
    let collect_end = select(fast, start, end);
    for iv in start..collect_end {
        let v = logits[(base + iv) as usize];
        let mut i = iv * lanes;
        #[unroll]
        for j in 0..N::value() {
            let key = order_key(v.extract(j));
            if key > prefix {
                cand_key[og as usize] = key;
                cand_pos[og as usize] = i;
                og += 1u32;
            } else if key == prefix {
                if oe < remaining {
                    cand_key[(count_gt + oe) as usize] = key;
                    cand_pos[(count_gt + oe) as usize] = i;
                }
                oe += 1u32;
            }
            i += 1u32;
        }
    }
    sync_cube();

    // Canonical order: rank = larger keys + equal keys at lower positions,
    // among the compacted keys (fast) or the k survivors; ranks below k are
    // written.
    let k_req = k_row[row as usize];
    let k_own = select(k_req < 1i32, 1i32, k_req);
    let held = select(fast, compacted, k);
    let mut hn = 0u32;
    if comptime!(pen) {
        // History tokens among the held candidates give way to their
        // penalised entries (key 0: never ranked, never written).
        hn = h;
        let mut c0 = tid;
        while c0 < held {
            let pc = cand_pos[c0 as usize];
            let mut found = false;
            for j in 0..h {
                if hkey[j as usize] != 0u32 && hpos[j as usize] == pc {
                    found = true;
                }
            }
            if found {
                cand_key[c0 as usize] = 0u32;
                tally[0].fetch_add(1u32);
            }
            c0 += CUBE_DIM;
        }
        sync_cube();
    }
    let mut c = tid;
    while c < held {
        let kc = cand_key[c as usize];
        let pc = cand_pos[c as usize];
        let rank = ranked_above(kc, pc, &cand_key, &cand_pos, held)
            + ranked_above(kc, pc, &hkey, &hpos, hn);
        // Slots past the row's own k are padding: -inf, ordered after every
        // real candidate (`pad_base + slot`).
        let p = pc;
        let live = i32::cast_from(rank) < k_own;
        if rank < k_out && kc != 0u32 {
            let slot = (row * k_out + rank) as usize;
            out_vals[slot] = select(
                live,
                logit_at::<N>(logits, base, p, lanes),
                f32::reinterpret(0xFF80_0000u32),
            );
            out_pos[slot] = i32::cast_from(p);
            out_order[slot] = select(live, i32::cast_from(p), i32::cast_from(pad_base + rank));
        }
        c += CUBE_DIM;
    }
    // The penalised history tokens, ranked among the same candidates.
    let mut hj = tid;
    while hj < hn {
        let kc = hkey[hj as usize];
        let pc = hpos[hj as usize];
        if kc != 0u32 {
            let rank = ranked_above(kc, pc, &cand_key, &cand_pos, held)
                + ranked_above(kc, pc, &hkey, &hpos, hn);
            let live = i32::cast_from(rank) < k_own;
            if rank < k_out {
                let slot = (row * k_out + rank) as usize;
                out_vals[slot] = select(live, hval[hj as usize], f32::reinterpret(0xFF80_0000u32));
                out_pos[slot] = i32::cast_from(pc);
                out_order[slot] = select(live, i32::cast_from(pc), i32::cast_from(pad_base + rank));
            }
        }
        hj += CUBE_DIM;
    }
    // A row with fewer than k non-NaN logits (an invalid row: its outputs
    // are replaced by its status code) still gets every slot written, as
    // padding at position 0, so later stages never read stale memory.
    let mut filled = held;
    if comptime!(pen) {
        filled = held - tally[0].load() + tally[1].load();
    }
    let mut slot = filled + tid;
    while slot < k_out {
        let at = (row * k_out + slot) as usize;
        out_vals[at] = f32::reinterpret(0xFF80_0000u32);
        out_pos[at] = 0i32;
        out_order[at] = i32::cast_from(pad_base + slot);
        slot += CUBE_DIM;
    }
}

/// How many of the first `n` entries (`keys`, `pos`) rank before the
/// candidate (`key`, `pos`): a larger key, or the same key at a lower
/// position.
#[cube]
fn ranked_above(key: u32, at: u32, keys: &Shared<[u32]>, pos: &Shared<[u32]>, n: u32) -> u32 {
    let mut rank = 0u32;
    for j in 0..n {
        let kj = keys[j as usize];
        if kj > key || (kj == key && pos[j as usize] < at) {
            rank += 1u32;
        }
    }
    rank
}
