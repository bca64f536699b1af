//! Full-vocabulary `top_p` (`top_p_full_rows`): the maximum and the row's
//! validation, a weighted radix search for the crossing key, its ties kept
//! in position order.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{NEG_INF_KEY, max_logit, order_key, row_max_and_validation, thread_chunk};

/// Bits per pass of the weighted radix search (16 bins).
const MASS_BITS: u32 = 4;

#[cube(launch_unchecked)]
pub(crate) fn top_p_full_rows(
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
    let mut sel = Shared::<[f32]>::new_slice(4usize);
    let mut sel_bin = Shared::<[u32]>::new_slice(1usize);
    let mut chunk_mass = Shared::<[f32]>::new_slice(units);
    let mut chunk_before = Shared::<[f32]>::new_slice(units);
    let mut chunk_after = Shared::<[f32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);

    // Pass 1: the maximum and its lowest position (rank 0, always kept),
    // and the row's validation (first NaN / +inf).
    row_max_and_validation(logits, base, width, &mut best_key, &mut best_pos, &mut bads);
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
    let first = best_pos[0];
    let m = max_logit(logits, base, width, first, best_key[0] <= NEG_INF_KEY);

    // Weighted radix search, 4 bits a pass: T = the largest key whose mass
    // at or above it reaches p·S; `above` / `below` = the mass strictly
    // above / below T. Rows with `p >= 1/2` test the small side, the mass
    // below a bin `<= (1 - p)·S` (`stages::top_p`): the lower bins' sums
    // keep a tail of tiny weights that a running sum near `S` rounds away.
    let pr = p[row as usize];
    let high = pr >= 0.5f32;
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut above = 0.0f32;
    let mut below = 0.0f32;
    let mut target = 0.0f32;
    let mut tail = 0.0f32;
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
                sel[1] = pr * s;
                sel[2] = (1.0f32 - pr) * s;
            }
            let goal = sel[1];
            let small = sel[2];
            // From the top bin down: the first non-empty bin where the mass
            // reaches the goal; rounding that never reaches it takes the
            // lowest non-empty bin (every candidate kept).
            let mut cum = above;
            let mut chosen = 0u32;
            let mut chosen_above = above;
            let mut chosen_below = below;
            let mut done = false;
            let mut lowest = 16u32;
            let mut lowest_above = above;
            for r in 0..16u32 {
                let b = 15u32 - r;
                let mass = tot[b as usize];
                if !done && mass > 0.0f32 {
                    // The mass below this bin, summed from the bottom.
                    let mut under = below;
                    for c in 0..16u32 {
                        if c < b {
                            under += tot[c as usize];
                        }
                    }
                    lowest = b;
                    lowest_above = cum;
                    if select(high, under <= small, cum + mass >= goal) {
                        chosen = b;
                        chosen_above = cum;
                        chosen_below = under;
                        done = true;
                    }
                    cum += mass;
                }
            }
            if !done {
                chosen = select(lowest < 16u32, lowest, 0u32);
                chosen_above = lowest_above;
                chosen_below = below;
            }
            sel_bin[0] = chosen;
            sel[0] = chosen_above;
            sel[3] = chosen_below;
        }
        sync_cube();
        prefix |= sel_bin[0] << shift;
        mask |= 15u32 << shift;
        above = sel[0];
        below = sel[3];
        target = sel[1];
        tail = sel[2];
        sync_cube();
    }

    // Ties at T in position order: each thread owns a contiguous chunk; the
    // mass before a tie (`above` plus the ties before it), and for `high`
    // rows the mass from it on (`below` plus the ties from it on, summed
    // from the row's end).
    let (start, end) = thread_chunk(width);
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
            chunk_before[t as usize] = run;
            run += x;
        }
        let mut back = 0.0f32;
        for r in 0..CUBE_DIM {
            let t = CUBE_DIM - 1u32 - r;
            chunk_after[t as usize] = back;
            back += chunk_mass[t as usize];
        }
    }
    sync_cube();
    // p = +inf: a no-op row keeps everything.
    let all = pr > f32::reinterpret(0x7F7F_FFFFu32);
    if high {
        let mut from = below + chunk_after[tid as usize];
        let mut j = end;
        while j > start {
            j -= 1u32;
            let l = logits[(base + j) as usize];
            let key = order_key(l);
            let mut kept = all || key > prefix || j == first;
            if key == prefix {
                from += f32::exp(l - m);
                kept = kept || from > tail;
            }
            out[(base + j) as usize] = select(kept, l, neg_inf);
        }
    } else {
        let mut before = above + chunk_before[tid as usize];
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
}
