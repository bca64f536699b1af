//! Full-vocabulary `min_p -> [temperature] -> dist`, or `[temperature] ->
//! dist` without a cut, in one kernel (`min_p_dist_full_rows`); split over
//! several workgroups a row at small batches: `argmax_part_rows` (read 1),
//! `kept_sums_part_rows` (read 2: each segment's kept `dist` weight), then
//! `min_p_dist_full_rows` with `split`, which finds the segment holding
//! `u·W` and walks it.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{chunk_len, segment_vectors};
use super::chunks::chunk_sums;
use super::draw::{Cut, RowHead, draw_token, kept_weight_sum_vec, read_row_head};
use super::fixed::{wide_scan, wide_total};

/// The `min_p` cut of a row: `l >= max + ln p`, as the CPU computes it
/// (`-inf` keeps the whole row: no-op rows, and `keep_all`).
#[cube]
pub(crate) fn min_p_cut(head: &RowHead, log_p: &[f32], #[comptime] keep_all: bool) -> Cut {
    let mut thr = f32::reinterpret(0xFF80_0000u32);
    if comptime!(!keep_all) {
        thr = head.m + log_p[head.row as usize];
    }
    Cut {
        cb: 0u32,
        prefix: 0u32,
        last_pos: 0u32,
        thr,
    }
}

/// With `split`, `sums_hi` / `sums_lo` hold each segment's kept weight
/// (`kept_sums_part_rows`, `seg` vectors a segment, at most `CUBE_DIM`
/// segments) and `part_key` / `part_pos` / `part_bad` the segments' read 1;
/// without, the kernel reads the row twice itself and never reads them.
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
    sums_hi: &[u32],
    sums_lo: &[u32],
    width: u32,
    lanes: u32,
    none: u32,
    greedy_below: f32,
    parts: u32,
    seg: u32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
    #[comptime] codes: u32,
    #[comptime] keep_all: bool,
    #[comptime] split: bool,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
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
    let cut = min_p_cut(&head, log_p, keep_all);

    // Read 2: the dist weights of the kept logits, by chunk (thread `t`
    // ends with chunk `t`'s sum), or with `split` each segment's sum,
    // thread `s` taking segment `s`.
    let mut wh = 0u32;
    let mut wl = 0u32;
    let mut chunk = 0u32;
    if comptime!(split) {
        if tid < parts {
            wh = sums_hi[(row * parts + tid) as usize];
            wl = sums_lo[(row * parts + tid) as usize];
        }
        chunk = seg * lanes;
    } else {
        // Thread `t` ends with chunk `t`'s sum, each chunk read coalesced
        // by a few threads together (`chunks.rs`).
        let row_v = width / lanes;
        let sums = Shared::<[Atomic<u32>]>::new_slice(2usize * units);
        let unread_count = Shared::<[Atomic<u32>]>::new_slice(1usize);
        let mut unread_gathered = Shared::<[u32]>::new_slice(1usize);
        let (h, l) = chunk_sums::<N>(
            logits,
            &head,
            &cut,
            0u32,
            row_v,
            &sums,
            &unread_count,
            &mut unread_gathered,
            units,
            false,
            true,
        );
        wh = h;
        wl = l;
        chunk = chunk_len(row_v) * lanes;
    }

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
        true,
        codes,
    );
}

/// Read 2 of the split `min_p` / no-cut draw: segment `CUBE_POS_X` (of
/// `CUBE_COUNT_X`, `seg` vectors each) of row `CUBE_POS_Y`. Each workgroup
/// merges the segments' read 1 into the row's head (the maximum, its
/// first position, the temperature: what the one-workgroup kernel sees),
/// sums the fixed-point `dist` weights of its segment's kept logits
/// (whole vectors, coalesced) and writes the 64-bit sum at `row · parts +
/// segment` of `sums_hi` / `sums_lo`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn kept_sums_part_rows<N: Size>(
    logits: &[Vector<f32, N>],
    log_p: &[f32],
    t: &[f32],
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    sums_hi: &mut [u32],
    sums_lo: &mut [u32],
    width: u32,
    seg: u32,
    lanes: u32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
    #[comptime] keep_all: bool,
) {
    let part = CUBE_POS_X;
    let row = CUBE_POS_Y;
    let parts = CUBE_COUNT_X;
    let tid = UNIT_POS;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut acc_hi = Shared::<[u32]>::new_slice(units);
    let mut acc_lo = Shared::<[u32]>::new_slice(units);
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
        true,
    );
    let cut = min_p_cut(&head, log_p, keep_all);
    let row_v = width / lanes;
    let (start, end) = segment_vectors(part, seg, row_v);
    let (h, l) =
        kept_weight_sum_vec::<N>(logits, &head, &cut, start, end, UNIT_POS, CUBE_DIM, true);
    acc_hi[tid as usize] = h;
    acc_lo[tid as usize] = l;
    wide_scan(&mut acc_hi, &mut acc_lo);
    let (th, tl) = wide_total(&acc_hi, &acc_lo);
    if tid == 0u32 {
        sums_hi[(row * parts + part) as usize] = th;
        sums_lo[(row * parts + part) as usize] = tl;
    }
}
