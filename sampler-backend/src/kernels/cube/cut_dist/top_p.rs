//! Full-vocabulary `top_p -> [temperature] -> dist` in one kernel
//! (`top_p_dist_full_rows`); the design is in this folder's `mod.rs`.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{chunk_len, clear_atomics, logit_at, order_key, thread_chunk};
use super::chunks::chunk_sums;
use super::draw::{Cut, draw_token, draw_weight, read_row_head};
use super::fixed::{
    first_reaching, fixed_weight, histogram_range, key_logit, nucleus_bin, wide_atomic_add,
    wide_f32, wide_ge, wide_nucleus_goal, wide_scan, wide_total,
};
use super::split::nucleus_sum_vec;
use super::{
    CUT_WORDS, GATHERED_AT, HIST_WORDS, ROW_WORDS, S_ABOVE_HI, S_ABOVE_LO, S_BIN, S_CB, S_CHUNK,
    S_GOAL_HI, S_GOAL_LO, S_LEN,
};
use crate::kernels::NUC_GATHER;

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn top_p_dist_full_rows<N: Size>(
    logits: &[Vector<f32, N>],
    p: &[f32],
    t: &[f32],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    hist: &[u32],
    gather: &[u32],
    sums: &[u32],
    width: u32,
    lanes: u32,
    none: u32,
    greedy_below: f32,
    parts: u32,
    seg: u32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
    #[comptime] codes: u32,
    #[comptime] split: bool,
    #[comptime] cut_only: bool,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut part_hi = Shared::<[u32]>::new_slice(units);
    let mut part_lo = Shared::<[u32]>::new_slice(units);
    let pool = Shared::<[Atomic<u32>]>::new_slice(HIST_WORDS as usize);
    let rbin = Shared::<[Atomic<u32>]>::new_slice(32usize);
    let counter = Shared::<[Atomic<u32>]>::new_slice(1usize);
    let mut sel = Shared::<[u32]>::new_slice(S_LEN);
    let seg_sums = Shared::<[Atomic<u32>]>::new_slice(2usize * units);
    // Unsplit, read 3 gathers the crossing bin here first.
    let staged_len = comptime!(if split {
        1usize
    } else {
        2 * NUC_GATHER as usize
    });
    let mut staged = Shared::<[u32]>::new_slice(staged_len);

    // Read 1: the maximum and its lowest position, the row's validation
    // (with `split`, merged from `argmax_part_rows`' segments).
    let head = read_row_head::<N>(
        logits,
        t,
        part_key,
        part_pos,
        part_bad,
        parts,
        row,
        width,
        lanes,
        &mut best_key,
        &mut best_pos,
        &mut bads,
        has_t,
        split,
    );
    let m = head.m;
    let base = head.base;
    let all = p[row as usize] > f32::reinterpret(0x7F7F_FFFFu32);

    // Read 2: the fixed-point mass histogram of `m - l` ([`histogram_range`];
    // with `split`, `top_p_histogram_part_rows` summed the segments' into
    // the row's `hist`, exactly the same integers).
    if comptime!(split) {
        let mut z = tid;
        while z < HIST_WORDS {
            pool[z as usize].store(hist[(row * ROW_WORDS + z) as usize]);
            z += CUBE_DIM;
        }
    } else {
        clear_atomics(&pool, HIST_WORDS);
        sync_cube();
        histogram_range::<N>(logits, base, 0u32, width / lanes, m, &pool);
    }
    sync_cube();
    // Each thread sums a group of consecutive bins.
    let per = (1024u32 + CUBE_DIM - 1u32) / CUBE_DIM;
    let mut gh = 0u32;
    let mut gl = 0u32;
    for k in 0..per {
        let b = tid * per + k;
        if b < 1024u32 {
            let lo = pool[(2u32 * b) as usize].load();
            let hi = pool[(2u32 * b + 1u32) as usize].load();
            let nl = gl + lo;
            gh += hi + select(nl < gl, 1u32, 0u32);
            gl = nl;
        }
    }
    part_hi[tid as usize] = gh;
    part_lo[tid as usize] = gl;
    // S, the goal p·S, then the crossing group (every thread: a parallel
    // scan of the groups' sums) and in it the bin (thread 0).
    wide_scan(&mut part_hi, &mut part_lo);
    let (sh, sl) = wide_total(&part_hi, &part_lo);
    let pr = select(all, 1.0f32, p[row as usize]);
    let (goal_hi, goal_lo) = wide_nucleus_goal(pr, sh, sl);
    let (found, g, before_hi, before_lo) = first_reaching(&part_hi, &part_lo, goal_hi, goal_lo);
    if tid == 0u32 {
        let mut cb = 1024u32;
        let mut ah = 0u32;
        let mut al = 0u32;
        if found {
            // The bin inside this group.
            let mut bh = before_hi;
            let mut bl = before_lo;
            let mut inner = false;
            for k in 0..per {
                let b = g * per + k;
                if b < 1024u32 && !inner {
                    let lo = pool[(2u32 * b) as usize].load();
                    let hi = pool[(2u32 * b + 1u32) as usize].load();
                    let xl = bl + lo;
                    let xh = bh + hi + select(xl < bl, 1u32, 0u32);
                    if (hi > 0u32 || lo > 0u32) && wide_ge(xh, xl, goal_hi, goal_lo) {
                        inner = true;
                        cb = b;
                        ah = bh;
                        al = bl;
                    }
                    bh = xh;
                    bl = xl;
                }
            }
        }
        // No bin (an empty row, or the whole row kept): everything is above.
        if all || (sh == 0u32 && sl == 0u32) {
            cb = 1024u32;
        }
        sel[S_CB] = cb;
        sel[S_ABOVE_HI] = ah;
        sel[S_ABOVE_LO] = al;
        sel[S_GOAL_HI] = goal_hi;
        sel[S_GOAL_LO] = goal_lo;
        counter[0].store(0u32);
    }
    sync_cube();
    let cb = sel[S_CB];
    let goal_hi = sel[S_GOAL_HI];
    let goal_lo = sel[S_GOAL_LO];

    // Read 3, by chunks (thread `t` ends with chunk `t`'s sum): dist
    // weights of the logits above the crossing bin; the crossing bin's
    // logits gathered. With
    // `split`, `top_p_kept_part_rows` read the row by segments: thread `s`
    // takes segment `s`'s sum, and the row's gathered logits (and their
    // count, which goes on past `NUC_GATHER`) are copied in.
    let mut wh = 0u32;
    let mut wl = 0u32;
    let mut start = 0u32;
    let mut end = 0u32;
    let mut chunk = 0u32;
    if comptime!(split) {
        let at = 2u32 * (row * parts + tid);
        if tid < parts {
            wh = sums[at as usize];
            wl = sums[(at + 1u32) as usize];
        }
        chunk = seg * lanes;
        let n = hist[(row * ROW_WORDS + GATHERED_AT) as usize];
        if tid == 0u32 {
            counter[0].store(n);
        }
        let mut k = tid;
        while k < n && k < NUC_GATHER {
            let from = 2u32 * (row * NUC_GATHER + k);
            pool[(2u32 * k) as usize].store(gather[from as usize]);
            pool[(2u32 * k + 1u32) as usize].store(gather[(from + 1u32) as usize]);
            k += CUBE_DIM;
        }
    } else {
        let row_v = width / lanes;
        if comptime!(cut_only) {
            // Only the gather (no draw follows): vectors `CUBE_DIM` apart,
            // coalesced.
            if cb < 1024u32 {
                nucleus_sum_vec::<N>(
                    logits,
                    &head,
                    cb,
                    0u32,
                    row_v,
                    tid,
                    CUBE_DIM,
                    &counter,
                    &mut staged,
                );
            }
            sync_cube();
        } else {
            // Thread `t` ends with chunk `t`'s sum (the draw finds `u·W`
            // in the chunks' position order), each chunk read coalesced by
            // a few threads together (`chunks.rs`).
            let (vs, ve) = thread_chunk(row_v);
            start = vs * lanes;
            end = ve * lanes;
            chunk = chunk_len(row_v) * lanes;
            let no_cut = Cut {
                cb,
                prefix: 0u32,
                last_pos: 0u32,
                thr: 0.0f32,
            };
            let (h, s) = chunk_sums::<N>(
                logits,
                &head,
                &no_cut,
                cb,
                row_v,
                &seg_sums,
                &counter,
                &mut staged,
                units,
                true,
                false,
            );
            wh = h;
            wl = s;
        }
        let n = counter[0].load();
        let mut k = tid;
        while k < 2u32 * n && k < 2u32 * NUC_GATHER {
            pool[k as usize].store(staged[k as usize]);
            k += CUBE_DIM;
        }
    }
    sync_cube();

    // The crossing bin, resolved: T (its crossing key), `above` (the mass
    // strictly above T) and P (the last kept position among T's ties).
    let gathered = counter[0].load();
    let overflow = gathered > NUC_GATHER;
    let n_src = select(overflow, width, gathered);
    let resolve = cb < 1024u32;
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut ah = sel[S_ABOVE_HI];
    let mut al = sel[S_ABOVE_LO];
    let mut last_pos = width;
    if resolve {
        for pass in 0..8u32 {
            let shift = 28u32 - pass * 4u32;
            clear_atomics(&rbin, 32u32);
            sync_cube();
            let mut j = tid;
            while j < n_src {
                let mut bits = 0u32;
                if overflow {
                    bits = u32::reinterpret(logit_at::<N>(logits, base, j, lanes));
                } else {
                    bits = pool[(2u32 * j) as usize].load();
                }
                let l = f32::reinterpret(bits);
                let q = fixed_weight(f32::exp(l - m));
                let key = order_key(l);
                if nucleus_bin(l, m) == cb && q > 0u32 && (key & mask) == prefix {
                    wide_atomic_add(&rbin, 2u32 * ((key >> shift) & 15u32), 0u32, q);
                }
                j += CUBE_DIM;
            }
            sync_cube();
            if tid == 0u32 {
                // From the top bin down: the first non-empty one where the
                // mass reaches the goal (the histogram's sums are the same
                // integers, so one does).
                let mut ch = ah;
                let mut cl = al;
                let mut done = false;
                let mut chosen = 0u32;
                let mut ch_hi = ah;
                let mut ch_lo = al;
                for r in 0..16u32 {
                    let b = 15u32 - r;
                    let lo = rbin[(2u32 * b) as usize].load();
                    let hi = rbin[(2u32 * b + 1u32) as usize].load();
                    if !done && (hi > 0u32 || lo > 0u32) {
                        let xl = cl + lo;
                        let xh = ch + hi + select(xl < cl, 1u32, 0u32);
                        // The lowest non-empty bin, if rounding never reaches.
                        chosen = b;
                        ch_hi = ch;
                        ch_lo = cl;
                        if wide_ge(xh, xl, goal_hi, goal_lo) {
                            done = true;
                        }
                        ch = xh;
                        cl = xl;
                    }
                }
                sel[S_BIN] = chosen;
                sel[S_ABOVE_HI] = ch_hi;
                sel[S_ABOVE_LO] = ch_lo;
            }
            sync_cube();
            prefix |= sel[S_BIN] << shift;
            mask |= 15u32 << shift;
            ah = sel[S_ABOVE_HI];
            al = sel[S_ABOVE_LO];
            sync_cube();
        }
        // T's ties: how many there are, how many the goal keeps.
        let wt = fixed_weight(f32::exp(key_logit(prefix) - m));
        // `goal - above` in 64 bits (both are near `W` when `p` is near 1).
        let lacking = select(
            wide_ge(goal_hi, goal_lo, ah, al),
            wide_f32(
                goal_hi - ah - select(al > goal_lo, 1u32, 0u32),
                goal_lo - al,
            ),
            0.0f32,
        );
        let need_f = f32::ceil(lacking / f32::cast_from(select(wt > 0u32, wt, 1u32)));
        let need_f = select(need_f > 4.0e9f32, 4.0e9f32, need_f);
        let need = select(need_f >= 1.0f32, u32::cast_from(need_f), 1u32);
        // The smallest position P with `need` ties at or before it (every
        // tie when there are no more than `need`): one pass counts the ties;
        // when there are more, a radix select on their positions, 4 bits a
        // pass from the highest bit `width - 1` has (5 passes at V = 151936;
        // bf16-origin rows tie often, and a binary search over positions
        // took up to `log2 V` passes, each a read of the row when the
        // crossing bin did not fit the gather).
        if tid == 0u32 {
            counter[0].store(0u32);
        }
        sync_cube();
        let mut mine = 0u32;
        let mut j = tid;
        while j < n_src {
            let mut bits = 0u32;
            if overflow {
                bits = u32::reinterpret(logit_at::<N>(logits, base, j, lanes));
            } else {
                bits = pool[(2u32 * j) as usize].load();
            }
            if order_key(f32::reinterpret(bits)) == prefix {
                mine += 1u32;
            }
            j += CUBE_DIM;
        }
        if mine > 0u32 {
            counter[0].fetch_add(mine);
        }
        sync_cube();
        let ties = counter[0].load();
        sync_cube();
        last_pos = width - 1u32;
        if ties > need {
            let mut pos_prefix = 0u32;
            let mut pos_mask = 0u32;
            let mut left = need;
            for pass in 0..8u32 {
                let shift = 28u32 - pass * 4u32;
                // Passes above the row's highest position bit have one bin.
                if ((width - 1u32) >> shift) != 0u32 {
                    clear_atomics(&rbin, 16u32);
                    sync_cube();
                    let mut jr = tid;
                    while jr < n_src {
                        let mut bits = 0u32;
                        let mut pos = 0u32;
                        if overflow {
                            bits = u32::reinterpret(logit_at::<N>(logits, base, jr, lanes));
                            pos = jr;
                        } else {
                            bits = pool[(2u32 * jr) as usize].load();
                            pos = pool[(2u32 * jr + 1u32) as usize].load();
                        }
                        if order_key(f32::reinterpret(bits)) == prefix
                            && (pos & pos_mask) == pos_prefix
                        {
                            rbin[((pos >> shift) & 15u32) as usize].fetch_add(1u32);
                        }
                        jr += CUBE_DIM;
                    }
                    sync_cube();
                    if tid == 0u32 {
                        // From the lowest positions up: the bin holding the
                        // `left`-th tie.
                        let mut below = 0u32;
                        let mut chosen = 0u32;
                        let mut rest = left;
                        let mut done = false;
                        for r in 0..16u32 {
                            let c = rbin[r as usize].load();
                            if !done {
                                if below + c >= left {
                                    chosen = r;
                                    rest = left - below;
                                    done = true;
                                } else {
                                    below += c;
                                }
                            }
                        }
                        sel[S_BIN] = chosen;
                        sel[S_CHUNK] = rest;
                    }
                    sync_cube();
                    pos_prefix |= sel[S_BIN] << shift;
                    pos_mask |= 15u32 << shift;
                    left = sel[S_CHUNK];
                    sync_cube();
                }
            }
            last_pos = pos_prefix;
        }

        // The kept crossing logits join their chunks' sums (with `split`,
        // their segments' sums, added in shared atomics).
        if comptime!(cut_only) {
            // No draw: the cut is written below.
        } else if comptime!(split) {
            clear_atomics(&seg_sums, 2u32 * CUBE_DIM);
            sync_cube();
            let mut k = tid;
            while k < n_src {
                let mut l = 0.0f32;
                let mut pos = 0u32;
                if overflow {
                    l = logit_at::<N>(logits, base, k, lanes);
                    pos = k;
                } else {
                    l = f32::reinterpret(pool[(2u32 * k) as usize].load());
                    pos = pool[(2u32 * k + 1u32) as usize].load();
                }
                let key = order_key(l);
                if nucleus_bin(l, m) == cb
                    && fixed_weight(f32::exp(l - m)) > 0u32
                    && (key > prefix || (key == prefix && pos <= last_pos))
                {
                    let e = draw_weight(l, &head);
                    wide_atomic_add(&seg_sums, 2u32 * (pos / chunk), 0u32, e);
                }
                k += CUBE_DIM;
            }
            sync_cube();
            if tid < parts {
                let al = seg_sums[(2u32 * tid) as usize].load();
                let ahi = seg_sums[(2u32 * tid + 1u32) as usize].load();
                let nl = wl + al;
                wh += ahi + select(nl < wl, 1u32, 0u32);
                wl = nl;
            }
        } else if overflow {
            for j in start..end {
                let l = logit_at::<N>(logits, base, j, lanes);
                let key = order_key(l);
                let q = fixed_weight(f32::exp(l - m));
                if nucleus_bin(l, m) == cb
                    && q > 0u32
                    && (key > prefix || (key == prefix && j <= last_pos))
                {
                    let e = draw_weight(l, &head);
                    let nl = wl + e;
                    wh += select(nl < wl, 1u32, 0u32);
                    wl = nl;
                }
            }
        } else {
            for k in 0..gathered {
                let pos = pool[(2u32 * k + 1u32) as usize].load();
                if pos >= start && pos < end {
                    let l = f32::reinterpret(pool[(2u32 * k) as usize].load());
                    let key = order_key(l);
                    if key > prefix || (key == prefix && pos <= last_pos) {
                        let e = draw_weight(l, &head);
                        let nl = wl + e;
                        wh += select(nl < wl, 1u32, 0u32);
                        wl = nl;
                    }
                }
            }
        }
    }
    if comptime!(cut_only) {
        // The row's cut for `top_p_mask_rows`, and its validation key.
        if tid == 0u32 {
            let c = row * CUT_WORDS;
            out[c as usize] = i32::reinterpret(m);
            out[(c + 1u32) as usize] = i32::cast_from(cb);
            out[(c + 2u32) as usize] = i32::reinterpret(prefix);
            out[(c + 3u32) as usize] = i32::cast_from(last_pos);
            out_bad[row as usize] = i32::cast_from(head.own_bad);
        }
    } else {
        let cut = Cut {
            cb,
            prefix,
            last_pos,
            thr: 0.0f32,
        };
        draw_token::<N>(
            logits,
            u,
            bad_in,
            out,
            out_bad,
            none,
            greedy_below,
            &head,
            &cut,
            wh,
            wl,
            chunk,
            &mut part_hi,
            &mut part_lo,
            &mut bads,
            units,
            false,
            codes,
        );
    }
}
