//! Full-vocabulary `min_p -> [temperature] -> dist`, or `[temperature] ->
//! dist` without a cut, in one kernel (`min_p_dist_full_rows`).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::thread_chunk;
use super::draw::{Cut, draw_token, kept_weight_sum, read_row_head};

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn min_p_dist_full_rows<N: Size>(
    logits: &[Vector<f32, N>],
    log_p: &[f32],
    t: &[f32],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    width: u32,
    lanes: u32,
    none: u32,
    greedy_below: f32,
    parts: u32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
    #[comptime] codes: u32,
    #[comptime] keep_all: bool,
    #[comptime] split: bool,
) {
    let row = CUBE_POS_X;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut part_hi = Shared::<[u32]>::new_slice(units);
    let mut part_lo = Shared::<[u32]>::new_slice(units);

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
    // `l >= max + ln p`, as the CPU computes it (`-inf` on no-op rows).
    let mut thr = f32::reinterpret(0xFF80_0000u32);
    if comptime!(!keep_all) {
        thr = head.m + log_p[row as usize];
    }
    let cut = Cut {
        cb: 0u32,
        prefix: 0u32,
        last_pos: 0u32,
        thr,
    };

    // Read 2: each thread's contiguous chunk, the dist weights of the kept.
    let (start, end) = thread_chunk(width);
    let (wh, wl) = kept_weight_sum::<N>(logits, &head, &cut, start, end, true);

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
        &mut part_hi,
        &mut part_lo,
        &mut bads,
        units,
        true,
        codes,
    );
}
