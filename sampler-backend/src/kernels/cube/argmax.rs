//! The greedy kernels: `argmax_rows`, the lowest position of each row's
//! maximum and the row's validation in one pass, the token or status code,
//! one workgroup a row; and for small batches, where one workgroup a row
//! leaves most of a GPU idle, each row split over several workgroups
//! (`argmax_part_rows`: a segment's maximum, its lowest position and the
//! segment's first NaN / `+inf`) and merged (`argmax_merge_rows`: the
//! largest key, ties to the lowest position; the lowest validation key),
//! which gives the same token and code. Both row passes read the row as
//! 16-byte vectors where its width and alignment allow (`N = 4`), with
//! four loads in flight per thread.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{
    NEG_INF_KEY, code_key, merge_row_parts, range_max_and_validation_vec, segment_vectors,
    with_code,
};

/// Row `CUBE_POS_X` read as vectors of `N = lanes` logits (`lanes`
/// divides `width`; 4 where the row allows it, 1 otherwise).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn argmax_rows<N: Size>(
    logits: &[Vector<f32, N>],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    width: u32,
    lanes: u32,
    #[comptime] units: usize,
    #[comptime] codes: u32,
) {
    let row = CUBE_POS_X;
    let row_vectors = width / lanes;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);

    // One pass: the maximum's lowest position and the row's validation.
    range_max_and_validation_vec::<N>(
        logits,
        row * row_vectors,
        0u32,
        row_vectors,
        lanes,
        width,
        &mut best_key,
        &mut best_pos,
        &mut bads,
    );
    if UNIT_POS == 0u32 {
        write_greedy(
            bad_in,
            out,
            out_bad,
            row,
            best_key[0],
            best_pos[0],
            bads[0],
            width,
            codes,
        );
    }
}

/// Segment `CUBE_POS_X` (of `CUBE_COUNT_X`, `seg` vectors of `N = lanes`
/// logits each) of row `CUBE_POS_Y`: its largest key, that key's lowest
/// position (`width` when every key is 0) and its first validation key
/// (`2·width` when none), at `row · CUBE_COUNT_X + segment` of the partial
/// buffers. With `clear` (`> 0`), the segments also zero the row's
/// `clear` words of `zeroed` (at `row · clear`), the global histogram the
/// split full-row `top_p` adds into next (`top_p_histogram_part_rows`);
/// greedy passes 0 and any buffer.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn argmax_part_rows<N: Size>(
    logits: &[Vector<f32, N>],
    part_key: &mut [u32],
    part_pos: &mut [u32],
    part_bad: &mut [u32],
    zeroed: &mut [u32],
    width: u32,
    seg: u32,
    lanes: u32,
    #[comptime] units: usize,
    #[comptime] clear: u32,
) {
    if comptime!(clear > 0) {
        // Each segment a stripe of the row's words.
        let mut z = CUBE_POS_X * CUBE_DIM + UNIT_POS;
        while z < clear {
            zeroed[(CUBE_POS_Y * clear + z) as usize] = 0u32;
            z += CUBE_COUNT_X * CUBE_DIM;
        }
    }
    let part = CUBE_POS_X;
    let row = CUBE_POS_Y;
    let row_vectors = width / lanes;
    let (start, end) = segment_vectors(part, seg, row_vectors);
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    range_max_and_validation_vec::<N>(
        logits,
        row * row_vectors,
        start,
        end,
        lanes,
        width,
        &mut best_key,
        &mut best_pos,
        &mut bads,
    );
    if UNIT_POS == 0u32 {
        let at = (row * CUBE_COUNT_X + part) as usize;
        part_key[at] = best_key[0];
        part_pos[at] = best_pos[0];
        part_bad[at] = bads[0];
    }
}

/// Row `CUBE_POS_X`'s `parts` partial results merged: the largest key,
/// ties to the lowest position (segments hold ascending positions, so this
/// is the row's first maximum), and the lowest validation key; then what
/// `argmax_rows` writes.
#[cube(launch_unchecked)]
pub(crate) fn argmax_merge_rows(
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    width: u32,
    parts: u32,
    #[comptime] units: usize,
    #[comptime] codes: u32,
) {
    let row = CUBE_POS_X;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
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
    if UNIT_POS == 0u32 {
        write_greedy(
            bad_in,
            out,
            out_bad,
            row,
            best_key[0],
            best_pos[0],
            bads[0],
            width,
            codes,
        );
    }
}

/// What both greedy kernels write for `row` (one thread): its validation
/// key `bad`, and its token (the first maximum's position `pos`, -1 when
/// the best key `key` is at most -inf's) or its status code ([`code_key`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_greedy(
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    row: u32,
    key: u32,
    pos: u32,
    bad: u32,
    width: u32,
    #[comptime] codes: u32,
) {
    let none = 2u32 * width;
    out_bad[row as usize] = i32::cast_from(bad);
    let tok = select(key <= NEG_INF_KEY, -1i32, i32::cast_from(pos));
    let code = code_key(bad_in, bad, row, none, codes);
    out[row as usize] = with_code(tok, code, none);
}
