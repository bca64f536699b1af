//! Full-vocabulary `min_p -> [temperature] -> dist`, or `[temperature] ->
//! dist` without a cut, in one kernel (`min_p_dist_full_rows`).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{NEG_INF_KEY, row_max_and_validation, scaled};
use super::S_LEN;
use super::draw::{draw_position, write_token};
use super::fixed::fixed_weight;

#[cube(launch_unchecked)]
pub(crate) fn min_p_dist_full_rows(
    logits: &[f32],
    log_p: &[f32],
    t: &[f32],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    width: u32,
    none: u32,
    greedy_below: f32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
    #[comptime] codes: u32,
    #[comptime] keep_all: bool,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut part_hi = Shared::<[u32]>::new_slice(units);
    let mut part_lo = Shared::<[u32]>::new_slice(units);
    let mut chunk_hi = Shared::<[u32]>::new_slice(units);
    let mut chunk_lo = Shared::<[u32]>::new_slice(units);
    let mut sel = Shared::<[u32]>::new_slice(S_LEN);

    // Read 1: the maximum and its lowest position, the row's validation.
    row_max_and_validation(logits, base, width, &mut best_key, &mut best_pos, &mut bads);
    let own_bad = bads[0];
    let first = best_pos[0];
    let dead = best_key[0] <= NEG_INF_KEY;
    let m_raw = logits[(base + select(first < width, first, 0u32)) as usize];
    let m = select(dead, 0.0f32, m_raw);
    let mut tr = 1.0f32;
    if comptime!(has_t) {
        tr = t[row as usize];
    }
    let qm = scaled(m, tr);
    // `l >= max + ln p`, as the CPU computes it (`-inf` on no-op rows).
    let mut thr = f32::reinterpret(0xFF80_0000u32);
    if comptime!(!keep_all) {
        thr = m + log_p[row as usize];
    }

    // Read 2: each thread's contiguous chunk, the dist weights of the kept.
    let chunk = (width + CUBE_DIM - 1u32) / CUBE_DIM;
    let start = select(tid * chunk < width, tid * chunk, width);
    let end = select(start + chunk < width, start + chunk, width);
    let mut wh = 0u32;
    let mut wl = 0u32;
    for j in start..end {
        let l = logits[(base + j) as usize];
        if l >= thr || j == first {
            let q = fixed_weight(f32::exp(scaled(l, tr) - qm));
            let nl = wl + q;
            wh += select(nl < wl, 1u32, 0u32);
            wl = nl;
        }
    }
    chunk_hi[tid as usize] = wh;
    chunk_lo[tid as usize] = wl;
    sync_cube();

    draw_position(
        logits,
        base,
        width,
        chunk,
        u[row as usize],
        tr,
        qm,
        m,
        0u32,
        0u32,
        0u32,
        thr,
        first,
        &mut chunk_hi,
        &mut chunk_lo,
        &mut part_hi,
        &mut part_lo,
        &mut bads,
        &mut sel,
        true,
    );
    write_token(
        out,
        out_bad,
        bad_in,
        row,
        width,
        none,
        tr,
        greedy_below,
        first,
        dead,
        own_bad,
        &bads,
        &sel,
        codes,
    );
}
