//! The middle pass of a full-row `top_p` split over several workgroups a
//! row (`top_p_histogram_part_rows`, grid `(segments, B)`): between
//! `argmax_part_rows` (read 1 over the segments, which also zeroes each
//! row's global histogram) and `top_p_dist_full_rows` with `split` (the
//! rest of the kernel, one workgroup a row, which takes the merged maximum
//! and the summed histogram instead of reading the row twice).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{NEG_INF_KEY, clear_atomics, max_logit_vec, merge_row_parts};
use super::HIST_WORDS;
use super::top_p::histogram_range;

/// Segment `CUBE_POS_X` (of `CUBE_COUNT_X`, `seg` vectors of `N = lanes`
/// logits each) of row `CUBE_POS_Y`: the row's maximum from the segments'
/// partial results (each workgroup merges them, [`merge_row_parts`], and
/// reads the logit at its first position: the `m` of the unsplit kernel),
/// the segment's fixed-point mass histogram of `m - l` in shared memory
/// ([`histogram_range`]), then its non-empty bins added into the row's
/// global histogram `hist` (`HIST_WORDS` words a row, zeroed by
/// `argmax_part_rows`): 64-bit sums as `u32` pairs, the carry of each low
/// word's atomic add into the high word, so the sums are exact and the
/// same whatever order the segments add in.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn top_p_histogram_part_rows<N: Size>(
    logits: &[Vector<f32, N>],
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    hist: &mut [Atomic<u32>],
    width: u32,
    seg: u32,
    lanes: u32,
    #[comptime] units: usize,
) {
    let part = CUBE_POS_X;
    let row = CUBE_POS_Y;
    let parts = CUBE_COUNT_X;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let pool = Shared::<[Atomic<u32>]>::new_slice(HIST_WORDS as usize);
    merge_row_parts(
        part_key,
        part_pos,
        part_bad,
        row,
        parts,
        width,
        &mut best_key,
        &mut best_pos,
        &mut bads,
    );
    let row_v = width / lanes;
    let base = row * row_v;
    let dead = best_key[0] <= NEG_INF_KEY;
    let m = max_logit_vec::<N>(logits, base, lanes, width, best_pos[0], dead);
    clear_atomics(&pool, HIST_WORDS);
    sync_cube();
    let start = select(part * seg < row_v, part * seg, row_v);
    let end = select(start + seg < row_v, start + seg, row_v);
    histogram_range::<N>(logits, base, start, end, m, &pool);
    sync_cube();
    let mut b = UNIT_POS;
    while b < HIST_WORDS / 2u32 {
        let lo = pool[(2u32 * b) as usize].load();
        let hi = pool[(2u32 * b + 1u32) as usize].load();
        if lo > 0u32 || hi > 0u32 {
            let at = row * HIST_WORDS + 2u32 * b;
            let old = hist[at as usize].fetch_add(lo);
            let carry = select(old > 0xFFFF_FFFFu32 - lo, 1u32, 0u32);
            if hi + carry > 0u32 {
                hist[(at + 1u32) as usize].fetch_add(hi + carry);
            }
        }
        b += CUBE_DIM;
    }
}
