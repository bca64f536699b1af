//! The kernels' device code and launches (being split into one file per
//! kernel): resolving burn's tensors to cubecl handles, launching, and
//! registering the outputs with the fusion stream.

// `(a + b - 1) / b` inside `#[cube]` functions: cubecl's frontend has no
// `div_ceil` for runtime values.
#![allow(clippy::manual_div_ceil)]

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{Cube, CubeBackend};
use burn_fusion::stream::StreamId;
use burn_fusion::{FusionTensor, NoOp};
use burn_ir::{BackendIr, InitOperationIr, OperationIr};
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{FullCut, HISTORY_MAX, NUC_GATHER, TOP_K_MAX, TokenCodes, TopK, enabled};
use crate::HistoryPenalties;

mod nucleus;
pub(super) use nucleus::{cut_dist_full, min_p};
#[cfg(all(test, feature = "cuda"))]
pub(super) use nucleus::{min_p_dist_full_rows, min_p_rows, top_p_dist_full_rows};

/// Threads per row (one workgroup per row). A power of two.
pub(super) const UNITS: u32 = 256;

/// The most elements per thread whose maximum stands for the thread in the
/// top-k kernel's floor.
const FLOOR_SAMPLE: u32 = 128;

/// Logits expected above the top-k kernel's floor (well inside the
/// compaction's [`TOP_K_MAX`] slots).
const FLOOR_TARGET: f64 = 256.0;

/// The length of the row prefix whose per-thread maxima give the top-k
/// kernel's floor (the `k`-th largest of `units` maxima). With `s` elements
/// per thread, a logit of a row without structure lies above the floor
/// with probability about `-ln(1 - k/units) / s`, so `s` is chosen to
/// expect [`FLOOR_TARGET`] logits above it: the sample is a small part of
/// the row (about `0.22·V` at `k = 50`) instead of a second read of it.
/// (256 rather than more: ranking the compacted logits costs O(n²) in
/// shared memory, and 256 fewer ranked is worth 0.1 of a read.)
/// 0 when `k` exceeds `units` (the kernel takes no floor then).
fn floor_sample(n: usize, k: usize, units: u32) -> usize {
    let units = units as usize;
    if k > units || n == 0 {
        return 0;
    }
    let tail = -(1.0 - k as f64 / units as f64).ln();
    let per_thread = (n as f64 * tail / FLOOR_TARGET).ceil() as usize;
    (per_thread.clamp(1, FLOOR_SAMPLE as usize) * units).min(n)
}

/// Bins of one radix pass (8 bits).
const BINS: usize = 256;

/// Order-preserving key of a logit: `a > b` as floats iff `key(a) > key(b)`
/// (for non-NaN values; `-0.0` is keyed as `0.0`).
#[cube]
fn order_key(x: f32) -> u32 {
    // Bit tests only (no float compare): a device that flushes subnormals
    // must not merge them with zero.
    let raw = u32::reinterpret(x);
    let bits = select(raw == 0x8000_0000u32, 0u32, raw);
    select(
        (bits & 0x8000_0000u32) != 0u32,
        bits ^ 0xFFFF_FFFFu32,
        bits | 0x8000_0000u32,
    )
}

/// The validation key of position `i`: `2i` for a NaN, `2i + 1` for a
/// `+inf`, `none` otherwise (bit tests: fast-math cannot fold them).
#[cube]
fn bad_key(x: f32, i: u32, none: u32) -> u32 {
    let bits = u32::reinterpret(x);
    let nan = (bits & 0x7FFF_FFFFu32) > 0x7F80_0000u32;
    let inf = bits == 0x7F80_0000u32;
    select(nan, 2u32 * i, select(inf, 2u32 * i + 1u32, none))
}

/// Minimum of `buf[0..CUBE_DIM]` into `buf[0]` (a tree; every thread calls).
#[cube]
fn shared_min(buf: &mut Shared<[u32]>) {
    sync_cube();
    let tid = UNIT_POS;
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let other = buf[(tid + half) as usize];
            if other < buf[tid as usize] {
                buf[tid as usize] = other;
            }
        }
        sync_cube();
        half /= 2u32;
    }
}

/// A selecting kernel writes tokens only ([`code_key`]).
pub(super) const CODES_NONE: u32 = 0;
/// ... or status codes from its own validation pass.
pub(super) const CODES_OWN: u32 = 1;
/// ... or status codes from validation keys an earlier kernel wrote.
pub(super) const CODES_GIVEN: u32 = 2;

/// The key of `-inf`: every row whose best key is this has no finite logit.
const NEG_INF_KEY: u32 = 0x007F_FFFF;

#[cube(launch_unchecked)]
pub(super) fn topk_rows(
    logits: &[f32],
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
    width: u32,
    sample_end: u32,
    k: u32,
    k_out: u32,
    h: u32,
    pad_base: u32,
    #[comptime] units: usize,
    #[comptime] k_cap: usize,
    #[comptime] pen: bool,
    #[comptime] h_cap: usize,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;

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
            let orig = logits[(base + id) as usize];
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

    // A floor under the k-th largest key: the k-th largest of the threads'
    // own maxima (k distinct elements at or above it). Keys below it are
    // never among the top k, so the histograms skip them (few atomics).
    let none = 2u32 * width;
    let mut bad = none;
    // Float compares here (cheaper than keys): any element of the thread is
    // a valid stand-in for its maximum, so a device that flushes subnormals
    // only lowers the floor. A thread without elements offers -inf, the
    // lowest non-NaN key, which keeps the floor at or below every element.
    // The maxima come from a sample (a prefix of the row, `sample_end`
    // long, chosen by the host: `floor_sample`): any k distinct elements
    // give a valid floor, and a short sample keeps this pass a small part
    // of a read of the row.
    let neg_inf = f32::reinterpret(0xFF80_0000u32);
    let mut own_f = neg_inf;
    let mut i0 = tid;
    while i0 < sample_end {
        let x = logits[(base + i0) as usize];
        if x > own_f {
            own_f = x;
        }
        i0 += CUBE_DIM;
    }
    let own = order_key(own_f);
    tmax[tid as usize] = own;
    if tid == 0u32 {
        floor[0] = 0u32;
    }
    sync_cube();
    if k <= CUBE_DIM {
        let mut rank = 0u32;
        for t in 0..CUBE_DIM {
            let o = tmax[t as usize];
            if o > own || (o == own && t < tid) {
                rank += 1u32;
            }
        }
        if rank == k - 1u32 {
            floor[0] = own;
        }
    }
    sync_cube();
    let low = floor[0];

    // Fast path: the keys at or above the floor, compacted into shared
    // memory (any order); when they fit, ranking them gives the top k
    // without the radix passes below (a uniform flag: the passes still
    // meet every barrier, with nothing to do).
    if tid == 0u32 {
        counter[0].store(0u32);
    }
    sync_cube();
    // The floor as a logit: `x >= low_f` keeps a superset of `key >= low`
    // (flushed subnormals compare equal, never in the wrong order); the keys
    // decide below.
    let low_bits = select(
        (low & 0x8000_0000u32) != 0u32,
        low & 0x7FFF_FFFFu32,
        low ^ 0xFFFF_FFFFu32,
    );
    // No floor (0) or one at -inf: every non-NaN logit passes.
    let low_f = select(low <= NEG_INF_KEY, neg_inf, f32::reinterpret(low_bits));
    // The same pass validates the row (first NaN / +inf, as `first_bad`).
    let mut ic = tid;
    while ic < width {
        let x = logits[(base + ic) as usize];
        // NaN and ±inf have every exponent bit set.
        if bad == none && (u32::reinterpret(x) & 0x7F80_0000u32) == 0x7F80_0000u32 {
            bad = bad_key(x, ic, none);
        }
        if x >= low_f {
            let key = order_key(x);
            if key >= low {
                let at = counter[0].fetch_add(1u32);
                if at < k_cap as u32 {
                    cand_key[at as usize] = key;
                    cand_pos[at as usize] = ic;
                }
            }
        }
        ic += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
    let compacted = counter[0].load();
    let fast = compacted <= k_cap as u32;

    // Radix select, most significant byte first: `prefix` holds the bytes
    // of the k-th largest key found so far, `remaining` the rank still
    // sought among the keys that share them.
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut remaining = k;
    for pass in 0..4u32 {
        let shift = 24u32 - pass * 8u32;
        let mut b = tid;
        while b < 256u32 {
            hist[b as usize].store(0u32);
            b += CUBE_DIM;
        }
        sync_cube();
        let mut i = tid;
        while i < width && !fast {
            let key = order_key(logits[(base + i) as usize]);
            if key >= low && (key & mask) == prefix {
                hist[((key >> shift) & 255u32) as usize].fetch_add(1u32);
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

    // Survivors in ascending position: each thread owns a contiguous chunk.
    let chunk = (width + CUBE_DIM - 1u32) / CUBE_DIM;
    let start = select(tid * chunk < width, tid * chunk, width);
    let end = select(start + chunk < width, start + chunk, width);
    let mut gt = 0u32;
    let mut eq = 0u32;
    if !fast {
        for i in start..end {
            let key = order_key(logits[(base + i) as usize]);
            if key > prefix {
                gt += 1u32;
            } else if key == prefix {
                eq += 1u32;
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
    for i in start..collect_end {
        let key = order_key(logits[(base + i) as usize]);
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
                logits[(base + p) as usize],
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

#[cube(launch_unchecked)]
pub(super) fn argmax_rows(
    logits: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    width: u32,
    #[comptime] units: usize,
    #[comptime] codes: u32,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);

    // Each thread visits ascending positions: the first maximum it meets is
    // its lowest. The same pass validates the row.
    let none = 2u32 * width;
    let mut bad = none;
    let mut bk = 0u32;
    let mut bp = width;
    let mut i = tid;
    while i < width {
        let x = logits[(base + i) as usize];
        let key = order_key(x);
        if key > bk {
            bk = key;
            bp = i;
        }
        // NaN and ±inf have every exponent bit set.
        if bad == none && (u32::reinterpret(x) & 0x7F80_0000u32) == 0x7F80_0000u32 {
            bad = bad_key(x, i, none);
        }
        i += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
    best_key[tid as usize] = bk;
    best_pos[tid as usize] = bp;
    sync_cube();
    let mut s = CUBE_DIM / 2u32;
    while s > 0u32 {
        if tid < s {
            let k1 = best_key[tid as usize];
            let p1 = best_pos[tid as usize];
            let k2 = best_key[(tid + s) as usize];
            let p2 = best_pos[(tid + s) as usize];
            if k2 > k1 || (k2 == k1 && p2 < p1) {
                best_key[tid as usize] = k2;
                best_pos[tid as usize] = p2;
            }
        }
        sync_cube();
        s /= 2u32;
    }
    if tid == 0u32 {
        let key = best_key[0];
        let pos = i32::cast_from(best_pos[0]);
        let tok = select(key <= NEG_INF_KEY, -1i32, pos);
        let code = code_key(bad_in, bads[0], row, none, codes);
        out[row as usize] = with_code(tok, code, none);
    }
}

/// What a selecting kernel writes for a row: its token, or the row's
/// status code (`-key - 2`, `crate::readback`) when its validation `key`
/// says it is invalid (`key < none`).
#[cube]
fn with_code(tok: i32, key: u32, none: u32) -> i32 {
    select(key < none, 0i32 - i32::cast_from(key) - 2i32, tok)
}

/// The validation key a selecting kernel's codes come from
/// (`CODES_NONE`: none, the token is written as it is; `CODES_OWN`: the
/// kernel's own pass, `own`; `CODES_GIVEN`: an earlier kernel's,
/// `given[row]`).
#[cube]
fn code_key(given: &[i32], own: u32, row: u32, none: u32, #[comptime] codes: u32) -> u32 {
    let mut key = none;
    if comptime!(codes == CODES_OWN) {
        key = own;
    }
    if comptime!(codes == CODES_GIVEN) {
        key = u32::cast_from(given[row as usize]);
    }
    key
}

type FusionRuntime = burn_cubecl::fusion::FusionCubeRuntime;
type FusionClient = burn_fusion::Client<FusionRuntime>;

/// The contiguous cubecl tensor under a float tensor, with its pending ops
/// executed, and its fusion client; `None` off the cubecl backends.
fn resolve_float(t: &Tensor<2>) -> Option<(CubeTensor, FusionClient)> {
    if !enabled() {
        return None;
    }
    let fused: FusionTensor<FusionRuntime> = t.clone().try_into_primitive::<Cube>().ok()?;
    let client = fused.client.clone();
    let cube = client.resolve_tensor_float::<CubeBackend>(fused);
    Some((into_contiguous(cube), client))
}

/// Register a kernel's output with the fusion stream (as uploaded data is),
/// so that later ops see an ordinary tensor.
fn register(out: CubeTensor, client: &FusionClient) -> FusionTensor<FusionRuntime> {
    let shape = out.meta.shape().clone();
    let dtype = out.dtype;
    let handle = <CubeBackend as BackendIr>::float_tensor_handle(out);
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    let mut outs = client.register(
        StreamId::current(),
        OperationIr::Init(desc),
        NoOp::<CubeBackend>::new(),
    );
    outs.remove(0)
}

/// Threads per row for this device: [`UNITS`], or the largest power of two
/// its workgroups allow.
fn units(cube: &CubeTensor) -> u32 {
    let max = cube.client.properties().hardware.max_units_per_cube.max(1);
    let cap = UNITS.min(max);
    if cap.is_power_of_two() {
        cap
    } else {
        cap.next_power_of_two() >> 1
    }
}

impl TokenCodes<'_> {
    /// The kernel's mode, the keys' buffer (an unread placeholder of `b`
    /// entries without keys) and the "valid row" key `2·vocab`; `None` when
    /// the keys are not on this cubecl device or `2·vocab` overflows i32.
    fn resolve(&self, cube: &CubeTensor, b: usize, width: usize) -> Option<(u32, CubeTensor, u32)> {
        let placeholder = || {
            empty_device_contiguous_dtype(
                cube.client.clone(),
                cube.device.clone(),
                Shape::new([b, 1]),
                DType::I32,
            )
        };
        let none = |v: usize| {
            u32::try_from(2 * v)
                .ok()
                .filter(|n| i32::try_from(*n).is_ok())
        };
        match self {
            Self::Tokens => Some((CODES_NONE, placeholder(), none(width)?)),
            Self::OwnKeys => Some((CODES_OWN, placeholder(), none(width)?)),
            Self::Keys(keys, vocab) => {
                let keys = resolve_int(keys)?;
                (keys.dtype == DType::I32 && keys.meta.shape().num_elements() == b).then_some(())?;
                Some((CODES_GIVEN, keys, none(*vocab)?))
            }
        }
    }
}

/// [`super::top_k`] on rows it takes, `h` history tokens per row.
pub(super) fn top_k(
    logits: &Tensor<2>,
    k: usize,
    k_row: &Tensor<2, Int>,
    pad_base: usize,
    penalties: Option<&HistoryPenalties>,
    h: usize,
) -> Option<TopK> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let k_row = resolve_int(k_row)?;
    let units = units(&cube);
    let (client, device) = (cube.client.clone(), cube.device.clone());
    let new_dev = |shape: Shape, dtype| {
        empty_device_contiguous_dtype(client.clone(), device.clone(), shape, dtype)
    };
    // The history's tensors, or unread placeholders without penalties.
    let (hist_ids, hist_counts, repeat, frequency, presence) = match penalties {
        Some(p) => (
            resolve_int(&p.ids)?,
            resolve_float(&p.counts)?.0,
            resolve_float(&p.repeat)?.0,
            resolve_float(&p.frequency)?.0,
            resolve_float(&p.presence)?.0,
        ),
        None => (
            new_dev(Shape::new([b, 1]), DType::I32),
            new_dev(Shape::new([b, 1]), DType::F32),
            new_dev(Shape::new([b, 1]), DType::F32),
            new_dev(Shape::new([b, 1]), DType::F32),
            new_dev(Shape::new([b, 1]), DType::F32),
        ),
    };
    if hist_ids.dtype != DType::I32 {
        return None;
    }
    let shape = Shape::new([b, k]);
    let (vals, pos, order) = (
        new_dev(shape.clone(), DType::F32),
        new_dev(shape.clone(), DType::I32),
        new_dev(shape, DType::I32),
    );
    let bad = new_dev(Shape::new([b, 1]), DType::I32);
    let k_sel = (k + h).min(n);
    let sample = floor_sample(n, k_sel, units);
    let hb = b * h.max(1);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, history ids inside the
    // vocabulary by construction, shared slices by their sizes).
    unsafe {
        topk_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(k_row.handle.clone(), b),
            BufferArg::from_raw_parts(hist_ids.handle.clone(), hb),
            BufferArg::from_raw_parts(hist_counts.handle.clone(), hb),
            BufferArg::from_raw_parts(repeat.handle.clone(), b),
            BufferArg::from_raw_parts(frequency.handle.clone(), b),
            BufferArg::from_raw_parts(presence.handle.clone(), b),
            BufferArg::from_raw_parts(vals.handle.clone(), b * k),
            BufferArg::from_raw_parts(pos.handle.clone(), b * k),
            BufferArg::from_raw_parts(order.handle.clone(), b * k),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            sample as u32,
            k_sel as u32,
            k as u32,
            h as u32,
            pad_base as u32,
            units as usize,
            TOP_K_MAX,
            penalties.is_some(),
            HISTORY_MAX,
        )
    }
    // The fast path: the floor's sample and one pass over the row, the
    // history's ids, counts and logits, the k written values' re-reads.
    crate::launches::declare_read(
        "topk_rows",
        4 * b * (n + sample + 1 + k) + 12 * b * h + 12 * b,
    );
    Some(TopK {
        logits: Tensor::<2>::from_primitive::<Cube>(register(vals, &fusion)),
        positions: Tensor::<2, Int>::from_primitive::<Cube>(register(pos, &fusion)),
        order_ids: Tensor::<2, Int>::from_primitive::<Cube>(register(order, &fusion)),
        first_bad: Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    })
}

/// [`super::argmax`] on rows it takes.
pub(super) fn argmax(
    logits: &Tensor<2>,
    codes: TokenCodes<'_>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let (mode, keys, _) = codes.resolve(&cube, b, n)?;
    let units = units(&cube);
    let (client, device) = (cube.client.clone(), cube.device.clone());
    let out =
        empty_device_contiguous_dtype(client.clone(), device.clone(), Shape::new([b]), DType::I32);
    let bad = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        argmax_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(keys.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            units as usize,
            mode,
        )
    }
    crate::launches::declare_read("argmax_rows", 4 * b * n + 4 * b);
    Some((
        Tensor::<1, Int>::from_primitive::<Cube>(register(out, &fusion)),
        Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    ))
}

/// Row max (0 for a row of `-inf`, so `l - max` stays finite) and the sum of
/// `exp(l - max)`, from a row held in shared memory; thread 0 walks the row
/// in position order, so the sum's order is fixed.
#[cube]
fn shared_max_and_sum(
    sl: &Shared<[f32]>,
    se: &mut Shared<[f32]>,
    stat: &mut Shared<[f32]>,
    width: u32,
) {
    if UNIT_POS == 0u32 {
        // -inf from its bits: cubecl's WGSL backend prints an infinite
        // literal as `-Inf`, which WGSL does not know.
        let neg_inf = f32::reinterpret(0xFF80_0000u32);
        let mut m = neg_inf;
        for i in 0..width {
            let l = sl[i as usize];
            if l > m {
                m = l;
            }
        }
        stat[0] = select(m == neg_inf, 0.0f32, m);
    }
    sync_cube();
    let m = stat[0];
    let mut i = UNIT_POS;
    while i < width {
        se[i as usize] = f32::exp(sl[i as usize] - m);
        i += CUBE_DIM;
    }
    sync_cube();
    if UNIT_POS == 0u32 {
        let mut s = 0.0f32;
        for i in 0..width {
            s += se[i as usize];
        }
        stat[1] = s;
    }
    sync_cube();
}

#[cube(launch_unchecked)]
pub(super) fn top_p_rows(
    logits: &[f32],
    ids: &[i32],
    p: &[f32],
    keep: &[i32],
    out: &mut [f32],
    width: u32,
    #[comptime] cap: usize,
) {
    let row = CUBE_POS_X;
    let base = row * width;
    let mut sl = Shared::<[f32]>::new_slice(cap);
    let mut sid = Shared::<[i32]>::new_slice(cap);
    let mut se = Shared::<[f32]>::new_slice(cap);
    let mut stat = Shared::<[f32]>::new_slice(2usize);
    let mut i = UNIT_POS;
    while i < width {
        sl[i as usize] = logits[(base + i) as usize];
        sid[i as usize] = ids[(base + i) as usize];
        i += CUBE_DIM;
    }
    sync_cube();
    shared_max_and_sum(&sl, &mut se, &mut stat, width);
    let target = p[row as usize] * stat[1];
    let min_keep = u32::cast_from(keep[row as usize]);
    let mut c = UNIT_POS;
    while c < width {
        let lc = sl[c as usize];
        let dc = sid[c as usize];
        let mut rank = 0u32;
        let mut before = 0.0f32;
        for j in 0..width {
            let lj = sl[j as usize];
            if lj > lc || (lj == lc && sid[j as usize] < dc) {
                rank += 1u32;
                before += se[j as usize];
            }
        }
        let kept = before < target || rank < min_keep;
        out[(base + c) as usize] = select(kept, lc, f32::reinterpret(0xFF80_0000u32));
        c += CUBE_DIM;
    }
}

#[cube(launch_unchecked)]
pub(super) fn dist_rows(
    logits: &[f32],
    ids: &[i32],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    width: u32,
    none: u32,
    #[comptime] cap: usize,
    #[comptime] units: usize,
    #[comptime] codes: u32,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut sl = Shared::<[f32]>::new_slice(cap);
    let mut sid = Shared::<[i32]>::new_slice(cap);
    let mut se = Shared::<[f32]>::new_slice(cap);
    let mut stat = Shared::<[f32]>::new_slice(2usize);
    let mut first = Shared::<[i32]>::new_slice(units);
    let mut last = Shared::<[i32]>::new_slice(units);
    let mut i = tid;
    while i < width {
        sl[i as usize] = logits[(base + i) as usize];
        sid[i as usize] = ids[(base + i) as usize];
        i += CUBE_DIM;
    }
    sync_cube();
    shared_max_and_sum(&sl, &mut se, &mut stat, width);
    let s = stat[1];
    let target = u[row as usize] * s;
    // Candidates in ascending id order: the first whose cumulative weight
    // reaches u·S; the last positive one when rounding leaves none.
    let mut f = i32::cast_from(0x7FFF_FFFFu32);
    let mut l = i32::cast_from(0u32) - 1i32;
    let mut c = tid;
    while c < width {
        let ec = se[c as usize];
        let dc = sid[c as usize];
        if ec > 0.0f32 {
            let mut cum = 0.0f32;
            for j in 0..width {
                if sid[j as usize] <= dc {
                    cum += se[j as usize];
                }
            }
            if cum >= target && dc < f {
                f = dc;
            }
            if dc > l {
                l = dc;
            }
        }
        c += CUBE_DIM;
    }
    first[tid as usize] = f;
    last[tid as usize] = l;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let f2 = first[(tid + half) as usize];
            let l2 = last[(tid + half) as usize];
            if f2 < first[tid as usize] {
                first[tid as usize] = f2;
            }
            if l2 > last[tid as usize] {
                last[tid as usize] = l2;
            }
        }
        sync_cube();
        half /= 2u32;
    }
    if tid == 0u32 {
        let f = first[0];
        let tok = select(f == 2_147_483_647i32, last[0], f);
        let tok = select(s == 0.0f32, -1i32, tok);
        let code = code_key(bad_in, none, row, none, codes);
        out[row as usize] = with_code(tok, code, none);
    }
}

/// The contiguous cubecl tensor under an int tensor, pending ops executed.
fn resolve_int(t: &Tensor<2, Int>) -> Option<CubeTensor> {
    let fused: FusionTensor<FusionRuntime> = t.clone().try_into_primitive::<Cube>().ok()?;
    let client = fused.client.clone();
    Some(into_contiguous(
        client.resolve_tensor_int::<CubeBackend>(fused),
    ))
}

/// [`super::top_p`] on narrow rows `[b, n]`.
pub(super) fn top_p(
    logits: &Tensor<2>,
    b: usize,
    n: usize,
    ids: &Tensor<2, Int>,
    p: &Tensor<2>,
    keep: &Tensor<2, Int>,
) -> Option<Tensor<2>> {
    let (l, fusion) = resolve_float(logits)?;
    let (ids, p, keep) = (resolve_int(ids)?, resolve_float(p)?.0, resolve_int(keep)?);
    let units = units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, n]), DType::F32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        top_p_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(ids.handle.clone(), b * n),
            BufferArg::from_raw_parts(p.handle.clone(), b),
            BufferArg::from_raw_parts(keep.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            n as u32,
            TOP_K_MAX,
        )
    }
    crate::launches::declare_read("top_p_rows", 8 * b * n + 8 * b);
    Some(Tensor::<2>::from_primitive::<Cube>(register(out, &fusion)))
}

/// [`super::dist`] on narrow rows `[b, n]`.
pub(super) fn dist(
    logits: &Tensor<2>,
    b: usize,
    n: usize,
    ids: &Tensor<2, Int>,
    u: &Tensor<2>,
    codes: TokenCodes<'_>,
) -> Option<Tensor<1, Int>> {
    let (l, fusion) = resolve_float(logits)?;
    let (ids, u) = (resolve_int(ids)?, resolve_float(u)?.0);
    let (mode, keys, none) = codes.resolve(&l, b, n)?;
    let units = units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b]), DType::I32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        dist_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(ids.handle.clone(), b * n),
            BufferArg::from_raw_parts(u.handle.clone(), b),
            BufferArg::from_raw_parts(keys.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            n as u32,
            none,
            TOP_K_MAX,
            units as usize,
            mode,
        )
    }
    crate::launches::declare_read("dist_rows", 8 * b * n + 8 * b);
    Some(Tensor::<1, Int>::from_primitive::<Cube>(register(
        out, &fusion,
    )))
}

#[cube(launch_unchecked)]
pub(super) fn first_bad_rows(
    logits: &[f32],
    out: &mut [i32],
    width: u32,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best = Shared::<[u32]>::new_slice(units);
    // Bit tests (no float compare, which fast-math may fold): NaN at i is
    // 2i, +inf at i is 2i + 1; a thread's first hit is its lowest.
    let none = 2u32 * width;
    let mut m = none;
    let mut i = tid;
    while i < width {
        let bits = u32::reinterpret(logits[(base + i) as usize]);
        let abs = bits & 0x7FFF_FFFFu32;
        if m == none {
            if abs > 0x7F80_0000u32 {
                m = 2u32 * i;
            } else if bits == 0x7F80_0000u32 {
                m = 2u32 * i + 1u32;
            }
        }
        i += CUBE_DIM;
    }
    best[tid as usize] = m;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let other = best[(tid + half) as usize];
            if other < best[tid as usize] {
                best[tid as usize] = other;
            }
        }
        sync_cube();
        half /= 2u32;
    }
    if tid == 0u32 {
        out[row as usize] = i32::cast_from(best[0]);
    }
}

/// [`super::first_bad`] on rows it takes.
pub(super) fn first_bad(logits: &Tensor<2>) -> Option<Tensor<2, Int>> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let units = units(&cube);
    let (client, device) = (cube.client.clone(), cube.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        first_bad_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            n as u32,
            units as usize,
        )
    }
    crate::launches::declare_read("first_bad_rows", 4 * b * n);
    Some(Tensor::<2, Int>::from_primitive::<Cube>(register(
        out, &fusion,
    )))
}

#[cube(launch_unchecked)]
pub(super) fn temperature_rows(
    logits: &[f32],
    ids: &[i32],
    t: &[f32],
    out: &mut [f32],
    width: u32,
    greedy_below: f32,
    #[comptime] has_ids: bool,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let tr = t[row as usize];
    let neg_inf = f32::reinterpret(0xFF80_0000u32);
    if tr < greedy_below {
        // Greedy temperature: only the lowest id among the maxima stays.
        let mut best_key = Shared::<[u32]>::new_slice(units);
        let mut best_id = Shared::<[i32]>::new_slice(units);
        let mut bk = 0u32;
        let mut bid = i32::cast_from(0x7FFF_FFFFu32);
        let mut i = tid;
        while i < width {
            let key = order_key(logits[(base + i) as usize]);
            let mut id = i32::cast_from(i);
            if comptime!(has_ids) {
                id = ids[(base + i) as usize];
            }
            if key > bk || (key == bk && id < bid) {
                bk = key;
                bid = id;
            }
            i += CUBE_DIM;
        }
        best_key[tid as usize] = bk;
        best_id[tid as usize] = bid;
        sync_cube();
        let mut half = CUBE_DIM / 2u32;
        while half > 0u32 {
            if tid < half {
                let k2 = best_key[(tid + half) as usize];
                let d2 = best_id[(tid + half) as usize];
                let k1 = best_key[tid as usize];
                if k2 > k1 || (k2 == k1 && d2 < best_id[tid as usize]) {
                    best_key[tid as usize] = k2;
                    best_id[tid as usize] = d2;
                }
            }
            sync_cube();
            half /= 2u32;
        }
        let winner = best_id[0];
        let mut j = tid;
        while j < width {
            let mut id = i32::cast_from(j);
            if comptime!(has_ids) {
                id = ids[(base + j) as usize];
            }
            let l = logits[(base + j) as usize];
            out[(base + j) as usize] = select(id == winner, l, neg_inf);
            j += CUBE_DIM;
        }
    } else {
        // l / t, finite results saturated at ±f32::MAX, -inf kept.
        let max = f32::reinterpret(0x7F7F_FFFFu32);
        let mut j = tid;
        while j < width {
            let l = logits[(base + j) as usize];
            let q = l / tr;
            let q = select(q > max, max, q);
            let q = select(q < -max, -max, q);
            let dead = u32::reinterpret(l) == 0xFF80_0000u32;
            out[(base + j) as usize] = select(dead, neg_inf, q);
            j += CUBE_DIM;
        }
    }
}

/// [`super::temperature`] on rows it takes.
pub(super) fn temperature(
    logits: &Tensor<2>,
    ids: Option<&Tensor<2, Int>>,
    t: &Tensor<2>,
    greedy_below: f32,
) -> Option<Tensor<2>> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let t = resolve_float(t)?.0;
    let ids = match ids {
        Some(ids) => Some(resolve_int(ids)?),
        None => None,
    };
    let units = units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, n]), DType::F32);
    // Without ids the kernel never reads them: any int buffer will do.
    let ids_handle = ids.as_ref().map_or(t.handle.clone(), |i| i.handle.clone());
    let ids_len = if ids.is_some() { b * n } else { b };
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        temperature_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(ids_handle, ids_len),
            BufferArg::from_raw_parts(t.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            n as u32,
            greedy_below,
            ids.is_some(),
            units as usize,
        )
    }
    // One pass (two for a row at a greedy temperature), ids when present.
    crate::launches::declare_read("temperature_rows", 4 * b * n + 4 * ids_len + 4 * b);
    Some(Tensor::<2>::from_primitive::<Cube>(register(out, &fusion)))
}

/// Threads per row of the full-row kernels (their per-thread bins live in
/// shared memory: `16 · 4` bytes a thread).
pub(super) const FULL_ROW_UNITS: u32 = 128;

/// Bits per pass of the weighted radix search (16 bins).
const MASS_BITS: u32 = 4;

#[cube(launch_unchecked)]
pub(super) fn top_p_full_rows(
    logits: &[f32],
    p: &[f32],
    out: &mut [f32],
    out_bad: &mut [i32],
    width: u32,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let neg_inf = f32::reinterpret(0xFF80_0000u32);
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bins = Shared::<[f32]>::new_slice(units * 16usize);
    let mut tot = Shared::<[f32]>::new_slice(16usize);
    let mut sel = Shared::<[f32]>::new_slice(2usize);
    let mut sel_bin = Shared::<[u32]>::new_slice(1usize);
    let mut chunk_mass = Shared::<[f32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);

    // Pass 1: the maximum and its lowest position (rank 0, always kept),
    // and the row's validation (first NaN / +inf).
    let none = 2u32 * width;
    let mut bad = none;
    let mut bk = 0u32;
    let mut bp = width;
    let mut i = tid;
    while i < width {
        let x = logits[(base + i) as usize];
        let key = order_key(x);
        if key > bk {
            bk = key;
            bp = i;
        }
        // NaN and ±inf have every exponent bit set.
        if bad == none && (u32::reinterpret(x) & 0x7F80_0000u32) == 0x7F80_0000u32 {
            bad = bad_key(x, i, none);
        }
        i += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
    best_key[tid as usize] = bk;
    best_pos[tid as usize] = bp;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let k2 = best_key[(tid + half) as usize];
            let p2 = best_pos[(tid + half) as usize];
            let k1 = best_key[tid as usize];
            if k2 > k1 || (k2 == k1 && p2 < best_pos[tid as usize]) {
                best_key[tid as usize] = k2;
                best_pos[tid as usize] = p2;
            }
        }
        sync_cube();
        half /= 2u32;
    }
    let first = best_pos[0];
    let m_raw = logits[(base + select(first < width, first, 0u32)) as usize];
    let m = select(best_key[0] <= NEG_INF_KEY, 0.0f32, m_raw);

    // Weighted radix search, 4 bits a pass: T = the largest key whose mass
    // at or above it reaches p·S; `above` = the mass strictly above T.
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut above = 0.0f32;
    let mut target = 0.0f32;
    for pass in 0..8u32 {
        let shift = 28u32 - pass * MASS_BITS;
        for b in 0..16u32 {
            bins[(tid * 16u32 + b) as usize] = 0.0f32;
        }
        let mut j = tid;
        while j < width {
            let l = logits[(base + j) as usize];
            let key = order_key(l);
            if (key & mask) == prefix {
                let slot = (tid * 16u32 + ((key >> shift) & 15u32)) as usize;
                bins[slot] += f32::exp(l - m);
            }
            j += CUBE_DIM;
        }
        sync_cube();
        if tid < 16u32 {
            let mut s = 0.0f32;
            for t in 0..CUBE_DIM {
                s += bins[(t * 16u32 + tid) as usize];
            }
            tot[tid as usize] = s;
        }
        sync_cube();
        if tid == 0u32 {
            if pass == 0u32 {
                let mut s = 0.0f32;
                for b in 0..16u32 {
                    s += tot[b as usize];
                }
                sel[1] = p[row as usize] * s;
            }
            let goal = sel[1];
            // From the top bin down: the first non-empty bin where the mass
            // reaches the goal; rounding that never reaches it takes the
            // lowest non-empty bin (every candidate kept).
            let mut cum = above;
            let mut chosen = 0u32;
            let mut chosen_above = above;
            let mut done = false;
            let mut lowest = 16u32;
            let mut lowest_above = above;
            for r in 0..16u32 {
                let b = 15u32 - r;
                let mass = tot[b as usize];
                if !done && mass > 0.0f32 {
                    lowest = b;
                    lowest_above = cum;
                    if cum + mass >= goal {
                        chosen = b;
                        chosen_above = cum;
                        done = true;
                    }
                    cum += mass;
                }
            }
            if !done {
                chosen = select(lowest < 16u32, lowest, 0u32);
                chosen_above = lowest_above;
            }
            sel_bin[0] = chosen;
            sel[0] = chosen_above;
        }
        sync_cube();
        prefix |= sel_bin[0] << shift;
        mask |= 15u32 << shift;
        above = sel[0];
        target = sel[1];
        sync_cube();
    }

    // Ties at T in position order: each thread owns a contiguous chunk.
    let chunk = (width + CUBE_DIM - 1u32) / CUBE_DIM;
    let start = select(tid * chunk < width, tid * chunk, width);
    let end = select(start + chunk < width, start + chunk, width);
    let mut mine = 0.0f32;
    for j in start..end {
        let l = logits[(base + j) as usize];
        if order_key(l) == prefix {
            mine += f32::exp(l - m);
        }
    }
    chunk_mass[tid as usize] = mine;
    sync_cube();
    if tid == 0u32 {
        let mut run = 0.0f32;
        for t in 0..CUBE_DIM {
            let x = chunk_mass[t as usize];
            chunk_mass[t as usize] = run;
            run += x;
        }
    }
    sync_cube();
    let mut before = above + chunk_mass[tid as usize];
    // p = +inf: a no-op row keeps everything.
    let all = p[row as usize] > f32::reinterpret(0x7F7F_FFFFu32);
    for j in start..end {
        let l = logits[(base + j) as usize];
        let key = order_key(l);
        let mut kept = all || key > prefix || j == first;
        if key == prefix {
            kept = kept || before < target;
            before += f32::exp(l - m);
        }
        out[(base + j) as usize] = select(kept, l, neg_inf);
    }
}

/// Threads per row of the full-row kernels on this device.
fn full_row_units(cube: &CubeTensor) -> u32 {
    units(cube).min(FULL_ROW_UNITS)
}

/// [`super::top_p_full`] on rows it takes.
pub(super) fn top_p_full(logits: &Tensor<2>, p: &Tensor<2>) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let p = resolve_float(p)?.0;
    let units = full_row_units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(
        client.clone(),
        device.clone(),
        Shape::new([b, n]),
        DType::F32,
    );
    let bad = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        top_p_full_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(p.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            units as usize,
        )
    }
    // The max / validation pass, 8 radix passes, chunk sums, the walk.
    crate::launches::declare_read("top_p_full_rows", 11 * 4 * b * n + 4 * b);
    Some((
        Tensor::<2>::from_primitive::<Cube>(register(out, &fusion)),
        Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    ))
}

#[cube(launch_unchecked)]
pub(super) fn token_codes_rows(
    sampled: &[i32],
    first_bad: &[i32],
    out: &mut [i32],
    rows: u32,
    none: i32,
) {
    let r = ABSOLUTE_POS;
    if r < rows as usize {
        let bad = first_bad[r];
        out[r] = select(bad < none, 0i32 - bad - 2i32, sampled[r]);
    }
}

/// [`super::token_codes`] on rows it takes.
pub(super) fn token_codes(
    sampled: &Tensor<1, Int>,
    first_bad: &Tensor<2, Int>,
    vocab: usize,
) -> Option<Tensor<1, Int>> {
    let [b] = sampled.dims();
    let fused: FusionTensor<FusionRuntime> = sampled.clone().try_into_primitive::<Cube>().ok()?;
    let fusion = fused.client.clone();
    let s = into_contiguous(fusion.resolve_tensor_int::<CubeBackend>(fused));
    let f = resolve_int(first_bad)?;
    if s.dtype != DType::I32 || f.dtype != DType::I32 {
        return None;
    }
    let (client, device) = (s.client.clone(), s.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b]), DType::I32);
    let units = units(&s);
    // SAFETY: one thread per row, guarded by `rows`.
    unsafe {
        token_codes_rows::launch_unchecked(
            &client,
            CubeCount::Static((b as u32).div_ceil(units), 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(s.handle.clone(), b),
            BufferArg::from_raw_parts(f.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            b as u32,
            (2 * vocab) as i32,
        )
    }
    crate::launches::declare_read("token_codes_rows", 8 * b);
    Some(Tensor::<1, Int>::from_primitive::<Cube>(register(
        out, &fusion,
    )))
}
