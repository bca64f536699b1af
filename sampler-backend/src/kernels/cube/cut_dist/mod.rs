//! Full-vocabulary `top_p -> [temperature] -> dist` as one kernel that
//! reads each row three times (plus a small part of it for the walk).
//!
//! The separate kernels ([`crate::kernels::top_p_full`],
//! [`crate::kernels::temperature`] and
//! a full-row `dist`) read the row about fifteen times: eight weighted
//! radix passes over the whole row find the crossing logit, the masked row
//! is written out, scaled, and read three more times to draw. Here:
//!
//! 1. **max**: the row maximum `m`, its lowest position (always kept) and
//!    the row's validation key (first NaN / `+inf`);
//! 2. **histogram**: the mass of `w = exp(l - m)` in [`NUC_BINS`](crate::kernels::NUC_BINS) bins of
//!    `m - l` (1/64 nat each over `[0, 16)` nats, deeper logits in the last
//!    bin), summed in fixed point ([`fixed_weight`]: `round(w · 2^31)`, 64-bit
//!    sums from `u32` shared atomics), so the sums are exact and do not
//!    depend on the order threads add them in. Scanning the bins from the
//!    top gives the crossing bin: the one where the mass from the maximum
//!    down first reaches `p·S`;
//! 3. **chunks**: the row is cut into `CUBE_DIM` chunks of consecutive
//!    positions and thread `t` ends holding chunk `t`'s sum of the `dist`
//!    weights `exp(sat(l / t) - sat(m / t))` (fixed point) of its logits in
//!    bins above the crossing bin (all kept); each chunk is read by a few
//!    neighbouring threads together (`chunks.rs`), and the crossing bin's
//!    logits are gathered into shared memory (up to [`NUC_GATHER`](crate::kernels::NUC_GATHER)).
//!
//! The crossing bin is then resolved exactly where it was gathered: a
//! weighted radix search over its order-preserving keys gives the crossing
//! key `T`, and its ties are kept in ascending position while the mass
//! before them is `< p·S` (as many as `ceil((p·S - above) / w_T)`, at
//! least one). The kept crossing logits join their chunks' sums, the chunk
//! holding `u·W` is found from the chunks' prefix, and that one chunk is
//! walked (read twice: `2/units` of a row). A crossing bin with more than
//! [`NUC_GATHER`](crate::kernels::NUC_GATHER) logits (near-flat rows, long runs of ties) is resolved
//! over the row instead: eight radix passes, a count of the crossing key's
//! ties and, when the goal keeps only some of them, a radix select on their
//! positions (4 bits a pass: 5 passes at V = 151936), and the chunks'
//! crossing logits, each a read of the row (about 18 reads at V = 151936
//! in the worst case).
//!
//! Below a batch that fills the device, every pass over the whole row is
//! split over several workgroups a row first (`kernels::row_segments`, as
//! greedy): `argmax_part_rows` (each segment's maximum, first position and
//! first NaN / `+inf`; it also zeroes the rows' global words) and, for
//! `top_p`, in `split.rs`: `top_p_histogram_part_rows` (each workgroup
//! merges the segments' maxima into `m` and adds its segment's histogram,
//! and the sums of its groups of 32 bins, into the row's in global `u32`
//! atomics, the low word's carry into the high word: the same integers in
//! any order), then `top_p_kept_part_rows` (read 3 by segments: each
//! workgroup finds the crossing bin from the group sums and one group's
//! bins, sums its segment's kept weights above it and gathers the crossing
//! bin's logits into the row's global slots). The last kernel of one
//! workgroup a row then runs with `split`: read 1 becomes the merge of the
//! segments' results ([`merge_row_parts`](super::common::merge_row_parts)),
//! read 2 a copy of the row's histogram into shared memory, read 3 a copy
//! of the gathered logits; the crossing bin is resolved as unsplit, its
//! kept logits added into their segments' sums, and thread `s` holds
//! segment `s`'s sum, so the draw finds the segment holding `u·W` and
//! walks it alone. `min_p` and the no-cut draw split their read 2 the same
//! way (`kept_sums_part_rows` in `min_p.rs`: each segment's kept weight).
//!
//! 256 threads a row where the device allows; the walks over the threads'
//! 64-bit sums (the nucleus group, the drawn chunk, the parts' prefix) are
//! parallel scans ([`wide_scan`](fixed::wide_scan), then each thread tests
//! its own pair, [`first_reaching`](fixed::first_reaching)).
//!
//! The row is bound as `Vector<f32, N>` (16 bytes at `N = 4`, where the
//! width is a multiple of 4 and the buffer 16-byte aligned; the same kernel
//! at `N = 1` otherwise). Read 1 and `top_p`'s histogram pass load whole
//! vectors, each thread taking vectors `CUBE_DIM` apart (coalesced); the
//! chunk passes (`min_p`'s read 2, `top_p`'s read 3) load whole vectors
//! too, [`CHUNK_READERS`](chunks::CHUNK_READERS) neighbouring threads
//! taking consecutive vectors of one chunk (128 bytes a load for the
//! eight: a warp touches 4 whole cache lines, where one thread a chunk
//! made it touch 32, 16 bytes of each), their shares added into the
//! chunk's shared 64-bit sum; the walk of the drawn chunk's parts (a few
//! positions a thread), the unsplit crossing bin's kept logits beyond the
//! gather (a thread's own chunk) and the crossing bin's resolution over the
//! row (when it holds more than `NUC_GATHER` logits) read single lanes
//! (`logit_at`).
//!
//! The rule is the device recipe's (and the CPU's, up to rounding): keep a
//! candidate iff the mass before it in canonical order (logit descending,
//! ties to the lowest position) is `< p·S`, always the first maximum; then
//! `dist` over the kept candidates in ascending id: the first with a
//! positive weight whose cumulative weight reaches `u·W`. Weights below
//! `2^-32` of the maximum's (logits more than 22 nats below it at `t = 1`)
//! count as zero mass: for `p <= 0.999` and vocabularies up to a million
//! such logits are never inside the nucleus (their total mass is below
//! `1e6 · e^-22 < 3e-4` of the maximum's), so the tokens are the CPU's.
//!
//! **The unfused full-row `top_p`** ([`crate::kernels::top_p_full`], for a
//! chain that goes on after the cut with something other than `dist`) is
//! the same kernel with `cut_only`: reads 1 and 2 and the crossing bin as
//! above (split the same way), then read 3 only gathers the crossing bin's
//! logits (whole vectors, coalesced; no sums, no draw), and the resolved
//! cut is written out (`CUT_WORDS` a row); `top_p_mask_rows` then writes
//! the row with the dropped logits set to `-inf`, by the rule the draw
//! keeps them by, with a grid of `(tiles, B)` workgroups. Four reads of the
//! row and one write (unsplit), where the kernel it replaced read it
//! eleven times with one workgroup a row.
//!
//! Files: `top_p.rs` and `min_p.rs` hold the two kernels
//! (`top_p_dist_full_rows`; `min_p_dist_full_rows`, which also draws
//! without a cut, and its split read 2), `split.rs` `top_p`'s split
//! histogram and read 3 passes, `draw.rs` what both share (read 1, the cut, the draw
//! they end with), `fixed.rs` the fixed-point sums and the histogram's
//! bins, `chunks.rs` the unsplit chunk pass both kernels read coalesced,
//! `mask.rs` the unfused `top_p`'s row write.

// cubecl's frontend wants a variable declared before the branches that
// assign it (the radix and tie passes read shared memory or the row).
#![allow(unused_assignments)]

mod chunks;
mod draw;
mod fixed;
mod mask;
mod min_p;
mod split;
mod top_p;

pub(crate) use fixed::{fixed_weight, wide_ge, wide_nucleus_goal};
pub(crate) use mask::top_p_mask_rows;
pub(crate) use min_p::{kept_sums_part_rows, min_p_dist_full_rows};
pub(crate) use split::{top_p_histogram_part_rows, top_p_kept_part_rows};
pub(crate) use top_p::top_p_dist_full_rows;

/// Words of a row's cut in the unfused `top_p` (`top_p_dist_full_rows`
/// with `cut_only` writes them, `top_p_mask_rows` reads them): the
/// maximum's bits, the crossing bin, the crossing key, the last kept
/// position of its ties.
pub(crate) const CUT_WORDS: u32 = 4;

/// Words of a row's mass histogram: [`NUC_BINS`](crate::kernels::NUC_BINS)
/// 64-bit fixed-point sums as `u32` pairs (low word first).
pub(crate) const HIST_WORDS: u32 = 2 * crate::kernels::NUC_BINS;

/// Bins of the histogram's coarse groups (the split `top_p` keeps each
/// group's sum beside the bins, so that a workgroup finds the crossing bin
/// from 32 group sums and one group's 32 bins: 512 bytes, not 8 KB).
pub(crate) const GROUP_BINS: u32 = 32;

/// Coarse groups of a row's histogram.
pub(crate) const HIST_GROUPS: u32 = crate::kernels::NUC_BINS / GROUP_BINS;

/// Where the group sums start in a row's global words (after the bins).
pub(crate) const GROUPS_AT: u32 = HIST_WORDS;

/// The row's count of gathered crossing-bin logits in its global words.
pub(crate) const GATHERED_AT: u32 = GROUPS_AT + 2 * HIST_GROUPS;

/// Global words a row of the split `top_p` keeps (zeroed by
/// `argmax_part_rows`): the histogram's bins, its group sums, the count of
/// the crossing bin's gathered logits.
pub(crate) const ROW_WORDS: u32 = GATHERED_AT + 1;

// Slots of the kernels' shared scalars (`sel`).
pub(crate) const S_CB: usize = 0;
pub(crate) const S_ABOVE_HI: usize = 1;
pub(crate) const S_ABOVE_LO: usize = 2;
pub(crate) const S_GOAL_HI: usize = 3;
pub(crate) const S_GOAL_LO: usize = 4;
pub(crate) const S_BIN: usize = 5;
pub(crate) const S_CHUNK: usize = 6;
pub(crate) const S_LEN: usize = 7;
