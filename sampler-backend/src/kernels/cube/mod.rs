//! The kernels' device code: `#[cube]` functions that cubecl compiles for
//! each device (WGSL / SPIR-V / PTX), one file per kernel, named after the
//! public function that launches it (`narrow.rs`: `top_p` and `dist` on
//! narrow rows; `cut_dist/`: the fused full-row `cut -> [temperature] ->
//! dist` kernels of `cut_dist_full`, and the unfused full-row `top_p`,
//! the same kernel cut only, then `top_p_mask_rows`); `launch/` holds their launches under
//! the same file names. `common.rs` holds the helpers several kernels
//! share.
//!
//! Every kernel runs one workgroup (cube) per row (`CUBE_POS_X`), its
//! threads (`UNIT_POS` of `CUBE_DIM`) striding over the row, except greedy
//! and the full-row cuts at small batches, whose rows are split over
//! several workgroups (`argmax_part_rows`, then `kept_sums_part_rows`, or
//! for `top_p` `top_p_histogram_part_rows` and `top_p_kept_part_rows`,
//! grid `(segments, B)`) before a kernel of one workgroup a row merges
//! them, and `top_p_mask_rows` (grid `(tiles, B)`).

// `(a + b - 1) / b` inside `#[cube]` functions: cubecl's frontend has no
// `div_ceil` for runtime values; and a position counted beside an unrolled
// `for j in 0..N::value()` over a vector's lanes: it expands `for` over a
// range only, not `zip`.
#![allow(clippy::manual_div_ceil, clippy::explicit_counter_loop)]

mod argmax;
mod common;
mod cut_dist;
mod first_bad;
mod min_p;
mod narrow;
mod temperature;
mod token_codes;
mod top_k;
mod top_k_split;

pub(crate) use argmax::{argmax_merge_rows, argmax_part_rows, argmax_rows};
pub(crate) use common::LOADS_IN_FLIGHT;
pub(crate) use common::{CODES_GIVEN, CODES_NONE, CODES_OWN};
pub(crate) use cut_dist::{
    CUT_WORDS, HIST_WORDS, ROW_WORDS, kept_sums_part_rows, min_p_dist_full_rows,
    top_p_dist_full_rows, top_p_histogram_part_rows, top_p_kept_part_rows, top_p_mask_rows,
};
pub(crate) use first_bad::first_bad_rows;
pub(crate) use min_p::min_p_rows;
pub(crate) use narrow::{dist_rows, top_p_rows};
pub(crate) use temperature::temperature_rows;
pub(crate) use token_codes::token_codes_rows;
pub(crate) use top_k::topk_rows;
pub(crate) use top_k_split::{topk_compact_part_rows, topk_floor_rows};
