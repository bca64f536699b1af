//! Custom cubecl kernels for the hot path on the cubecl devices (wgpu,
//! vulkan, cuda), launched on burn's own tensor handles.
//!
//! burn's generic ops build a row top-k out of two `topk`s, a dozen
//! element-wise ops and gathers, greedy out of three reductions, and a
//! full-vocabulary top-p out of a 64-step bisection (about 600 kernels).
//! Each kernel here does one stage's work in one launch for the whole
//! batch, one workgroup (cube) per row (greedy at small batches: several
//! a row, and a merge), with the device recipe's rules (which are the
//! CPU's):
//!
//! * [`top_k`]: the canonical top `K` of each row of `[B, N]` logits (logit
//!   descending, ties to the lowest position), with per-row `k`, padding and
//!   order ids as the `top_k` stage leaves them, and the rows' validation
//!   keys from the same pass. A floor under the `K`-th key (from a sample
//!   spread over the row), one pass that compacts the logits above it into
//!   shared memory (at small batches split over several workgroups a row,
//!   [`top_k_split`]), and a rank pass; a radix select on order-preserving
//!   `u32` keys when too many logits tie above the floor.
//! * [`argmax`]: greedy, the lowest position of each row's maximum, and the
//!   validation keys, in one pass; at small batches each row split over
//!   several workgroups and merged ([`row_segments`]), so that B = 1 does
//!   not leave most of a GPU idle.
//! * [`first_bad`]: row validation alone (first NaN / `+inf`).
//! * [`temperature`]: `l / t` saturated, or the greedy-temperature argmax.
//! * [`top_p`] and [`dist`] on narrow rows (after a top-k, `N <= TOP_K_MAX`),
//!   the row in shared memory; [`top_p_full`] on whole vocabulary rows
//!   (`cut_dist_full`'s cut, then the row written).
//! * [`min_p`]: `l >= max + ln p` and the first maximum, any width.
//! * [`cut_dist_full`]: a whole-vocabulary `top_p` or `min_p`, an optional
//!   temperature and `dist` in one kernel (about three reads of the row for
//!   `top_p`, two for `min_p`; fixed-point sums), what a fully offloaded
//!   `top_p; temperature; dist` runs.
//! * [`token_codes`]: the sampled token or the row's status code, per row.
//!
//! They need only shared memory, `u32` shared atomics and workgroup barriers
//! (no subgroup operations), so they run on lavapipe as on CUDA and NVIDIA
//! Vulkan. `-0.0` and `0.0` are the same logit; NaN and `+inf` are found by
//! bit tests. Design and costs: docs/architecture.md ("Custom kernels").
//!
//! Each function returns `None` when the tensor does not live on a cubecl
//! device, the kernels are off ([`set_enabled`]), the crate is built
//! without a cubecl device (no `cubecl-kernels` feature: every function
//! returns `None`, every `*_applies` is false) or the shape is outside
//! what the kernel handles (`K` above [`TOP_K_MAX`]); the stage then uses
//! its generic recipe ([`crate::ops`]). The outputs are registered with
//! burn's fusion stream like uploaded data, so later ops use them as any
//! other tensor.
//!
//! Layout: this file is the interface (the switch, the limits, which
//! shapes each kernel takes, the docs). With the `cubecl-kernels` feature,
//! `cube/` holds the `#[cube]` device code, one file per kernel (and
//! `cube/common.rs` the helpers several kernels share), and `launch/` the
//! host code that resolves burn's tensors, launches a kernel and registers
//! its outputs, one file per kernel under the same name (and
//! `launch/mod.rs` the glue they share). `ptx_offline.rs` (a test, `cuda`
//! feature) compiles every kernel to PTX without a GPU.

use std::sync::atomic::{AtomicBool, Ordering};

use burn_tensor::{Int, Tensor};

use crate::HistoryPenalties;
pub use segments::{SEGMENT_MIN, SEGMENTS_MAX, busy_workgroups, row_segments};

#[cfg(feature = "cubecl-kernels")]
mod cube;
#[cfg(feature = "cubecl-kernels")]
mod launch;
#[cfg(all(test, any(feature = "wgpu", feature = "cuda")))]
mod offline;
#[cfg(all(test, feature = "cuda"))]
mod ptx_offline;
mod segments;

/// Whether the stages use the kernels (default: yes). Process-wide; for
/// side-by-side measurements of the kernels against the generic recipes
/// (`benches/device_step.rs`) and tests of both paths, not for serving.
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turn the custom kernels on or off for every step started afterwards
/// (off: every stage runs its generic burn-op recipe).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the custom kernels are on ([`set_enabled`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The most storage buffers one custom kernel binds (the top-k kernel's 16
/// arrays and the buffer of its scalars). A device that allows fewer per
/// shader stage (wgpu on OpenGL: 16; WebGPU's default limits: 8) would
/// refuse the kernel's pipeline at its first launch, failing the step: on
/// such a device every stage runs its generic burn-op recipe instead (the
/// same semantics, more launches).
pub const KERNEL_BUFFERS_MAX: u32 = 17;

/// Whether the custom kernels run on `device`: a cubecl device (wgpu,
/// vulkan, cuda) that binds [`KERNEL_BUFFERS_MAX`] storage buffers per
/// stage (whatever [`set_enabled`] says). `false` on flex and ndarray and
/// on a device such as wgpu on OpenGL, whose stages run the generic
/// recipes. Opens the device (one tiny upload).
pub fn runs_on(device: &burn_tensor::Device) -> bool {
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::runs_on(device)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = device;
        false
    }
}

/// The largest `K` the top-k kernel keeps (its survivors live in shared
/// memory: `8·K` bytes); larger `K` use the generic recipe.
pub const TOP_K_MAX: usize = 1024;

/// The most history tokens per row the top-k kernel penalises in its
/// selection (they live in shared memory); longer histories use the
/// generic recipe.
pub const HISTORY_MAX: usize = 256;

/// Histogram bins of `max - l` in [`cut_dist_full`]'s `top_p`: 64 a nat
/// over `[0, 16)` nats, the last bin also holds everything deeper.
pub const NUC_BINS: u32 = 1024;

/// Logits of the crossing bin [`cut_dist_full`]'s `top_p` resolves in
/// shared memory; a crossing bin with more is resolved over the row (more
/// reads).
pub const NUC_GATHER: u32 = 1024;

/// What a selecting kernel ([`argmax`], [`dist`], [`cut_dist_full`]) writes per
/// row: the tokens alone, or what a fully offloaded step reads back, the
/// token or the row's status code (`-key - 2` for a validation key below
/// `2·vocab`, see `crate::readback`), so that no separate codes kernel runs.
#[derive(Debug, Clone, Copy)]
pub enum TokenCodes<'a> {
    /// The sampled tokens (`-1` for a row with nothing to sample).
    Tokens,
    /// Status codes from the kernel's own validation pass ([`argmax`] on
    /// unsanitised rows).
    OwnKeys,
    /// Status codes from validation keys `[B, 1]` an earlier kernel wrote
    /// ([`top_k`], [`top_p_full`], [`first_bad`]), for rows of `vocab`.
    Keys(&'a Tensor<2, Int>, usize),
}

/// The cut a full-row draw kernel applies before its `dist`.
#[derive(Debug, Clone, Copy)]
pub enum FullCut<'a> {
    /// `top_p` with `p` `[B, 1]` (`+inf` keeps the whole row).
    TopP(&'a Tensor<2>),
    /// `min_p` with `ln p` `[B, 1]` (`-inf` keeps the whole row).
    MinP(&'a Tensor<2>),
    /// No cut: the whole row (`[temperature] -> dist` alone).
    All,
}

/// What the top-k kernel writes (ints as i32).
#[derive(Debug, Clone)]
pub struct TopK {
    /// The candidates' logits `[B, k]`, `-inf` in padding slots.
    pub logits: Tensor<2>,
    /// Their positions in the input row `[B, k]`.
    pub positions: Tensor<2, Int>,
    /// Their positions, `pad_base + slot` in padding slots `[B, k]`.
    pub order_ids: Tensor<2, Int>,
    /// The row validation keys `[B, 1]`, as [`first_bad`] (same pass).
    pub first_bad: Tensor<2, Int>,
    /// How many logits of each row `[B, 1]` lay at or above the kernel's
    /// floor (the `K`-th largest of the threads' sampled maxima). Up to
    /// [`TOP_K_MAX`] the kernel ranks them in shared memory after one read
    /// of the row; above it, it runs a radix select (about five more
    /// reads). Nothing reads it in a step: it is there for tests and
    /// benchmarks to see which path a row took.
    pub above_floor: Tensor<2, Int>,
}

/// Whether [`top_k`] takes `[b, n]` rows at this `k` (kernels on, `k` in
/// `1..=min(n, TOP_K_MAX)`, `b·n` within `u32`), on a cubecl device.
/// Always false without the `cubecl-kernels` feature.
pub fn top_k_applies(b: usize, n: usize, k: usize) -> bool {
    enabled() && k > 0 && k <= n && k <= TOP_K_MAX && argmax_applies(b, n)
}

/// Whether [`argmax`] takes `[b, n]` rows (kernels on, `b·n` within `u32`),
/// on a cubecl device. Always false without the `cubecl-kernels` feature.
pub fn argmax_applies(b: usize, n: usize) -> bool {
    cfg!(feature = "cubecl-kernels") && enabled() && b > 0 && n > 0 && u32::try_from(b * n).is_ok()
}

/// Narrow rows `[B, N]` (after a top-k, `N <= TOP_K_MAX`) that [`top_p`]
/// and [`dist`] take.
fn narrow(logits: &Tensor<2>) -> Option<(usize, usize)> {
    let [b, n] = logits.dims();
    (b > 0 && n > 0 && n <= TOP_K_MAX && u32::try_from(b * n).is_ok()).then_some((b, n))
}

/// The canonical top `k` of each row of `logits [B, N]` (logit descending,
/// ties to the lowest position), as a device `top_k` leaves it ([`TopK`]),
/// and the rows' validation keys from the same pass. `k_row` `[B, 1]` is each row's own `k` (clamped to
/// `1..=k`): its slots past that are padding, with logit `-inf` and order id
/// `pad_base + slot` (after every real candidate). `None` when `logits` is
/// not on a cubecl device, or `k` is 0, above `N` or above [`TOP_K_MAX`].
/// A row with a NaN gets some candidates of that row (discarded by the
/// caller: an invalid row's outputs are replaced by its status code).
///
/// With `penalties` ([`HistoryPenalties`], `H` history tokens per row) the
/// top `k` is that of the penalised row (the CPU `penalties` rule applied
/// to the history tokens inside the selection; the logits are not
/// rewritten); `None` when `H > HISTORY_MAX` or `k + H > TOP_K_MAX`.
pub fn top_k(
    logits: &Tensor<2>,
    k: usize,
    k_row: &Tensor<2, Int>,
    pad_base: usize,
    penalties: Option<&HistoryPenalties>,
) -> Option<TopK> {
    top_k_split(logits, k, k_row, pad_base, penalties, None)
}

/// [`top_k`] with the floor and the compaction split over `segments`
/// workgroups a row (at most [`SEGMENTS_MAX`]; 1: one workgroup a row, no
/// split), or the device's own choice ([`greedy_segments`], `None`): the
/// same candidates for any split. A split row takes two more launches (the
/// floor from the sample, one workgroup a row; the compaction by segments
/// into the row's global slots, 8 KiB a row) before the rank. Rows are
/// split only where the kernel takes a floor (`k + H` at most the threads
/// of a workgroup, 256). For tests and for tuning on a given device.
pub fn top_k_split(
    logits: &Tensor<2>,
    k: usize,
    k_row: &Tensor<2, Int>,
    pad_base: usize,
    penalties: Option<&HistoryPenalties>,
    segments: Option<usize>,
) -> Option<TopK> {
    let [b, n] = logits.dims();
    if !top_k_applies(b, n, k) || u32::try_from(pad_base + k).is_err() {
        return None;
    }
    let h = penalties.map_or(0, |p| p.ids.dims()[1]);
    if h > HISTORY_MAX || k + h > TOP_K_MAX {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        let segments = segments.map(|s| s.clamp(1, SEGMENTS_MAX));
        launch::top_k(logits, k, k_row, pad_base, penalties, h, segments)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (k_row, h, segments);
        None
    }
}

/// The workgroups [`argmax`] (and [`cut_dist_full`]'s first reads) split
/// each row of `logits` over on their device ([`row_segments`]); `None`
/// where the kernel does not run (no cubecl device, kernels off).
pub fn greedy_segments(logits: &Tensor<2>) -> Option<usize> {
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::greedy_segments(logits)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = logits;
        None
    }
}

/// The lowest position of each row's maximum logit, `[B]` as i32
/// ([`crate::readback::CODE_ALL_MASKED`] for a row of `-inf`), or with
/// `codes` the rows' status codes in place of the tokens of invalid rows
/// ([`TokenCodes`]), and the rows' validation keys `[B, 1]` from the same
/// pass (as [`first_bad`]). `None` when `logits` is not on a cubecl device.
/// Without codes, a row with a NaN gets some position of that row. Small
/// batches split each row over several workgroups ([`row_segments`]) and
/// merge them in a second launch: same tokens and codes.
pub fn argmax(
    logits: &Tensor<2>,
    codes: TokenCodes<'_>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    argmax_split(logits, codes, None)
}

/// [`argmax`] with each row split over `segments` workgroups (clamped to
/// `1..=`[`SEGMENTS_MAX`]; 1: one workgroup a row, one kernel) instead of
/// the device's own choice ([`greedy_segments`], `None`): the same tokens
/// and codes for any split. For tests and for tuning on a given device.
pub fn argmax_split(
    logits: &Tensor<2>,
    codes: TokenCodes<'_>,
    segments: Option<usize>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    if !argmax_applies(b, n) {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::argmax(logits, codes, segments.map(|s| s.clamp(1, SEGMENTS_MAX)))
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (codes, segments);
        None
    }
}

/// Row validation in one pass: per row of `logits [B, V]`, `2i` for a NaN
/// at position `i`, `2i + 1` for a `+inf` at `i`, whichever comes first,
/// and `2V` for a valid row; `[B, 1]` as i32. `None` off the cubecl devices
/// (or when `2V` overflows i32).
pub fn first_bad(logits: &Tensor<2>) -> Option<Tensor<2, Int>> {
    let [b, n] = logits.dims();
    if b == 0 || n == 0 || i32::try_from(2 * n).is_err() || u32::try_from(b * n).is_err() {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::first_bad(logits)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        None
    }
}

/// Temperature over `logits [B, N]` (no dynamic range), the device recipe's
/// rule in one kernel: rows with `t < greedy_below` keep only the lowest id
/// among their maxima (ids from `ids` `[B, N]`, or positions when `None`);
/// other rows get `l / t`, finite results saturated at `±f32::MAX`, `-inf`
/// kept. `t` `[B, 1]`. `None` off the cubecl devices.
pub fn temperature(
    logits: &Tensor<2>,
    ids: Option<&Tensor<2, Int>>,
    t: &Tensor<2>,
    greedy_below: f32,
) -> Option<Tensor<2>> {
    let [b, n] = logits.dims();
    if !argmax_applies(b, n) {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::temperature(logits, ids, t, greedy_below)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (ids, t, greedy_below);
        None
    }
}

/// `top_p` over narrow rows `[B, N]` (`N <= TOP_K_MAX`), the one `top_p`
/// rule in one kernel: in canonical order (logit descending, ties to the
/// lowest of `ids`), keep a candidate iff the fixed-point mass before it
/// (`sampler_core::numerics::fixed_weight` of `exp(l - max)`, summed
/// exactly in 64 bits) is below `numerics::nucleus_goal(p, W)` or its rank
/// is `< keep`; the others become `-inf`.
/// `p` `[B, 1]` (`+inf` keeps the whole row), `keep` `[B, 1]`. `None` off
/// the cubecl devices or for wider rows.
pub fn top_p(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    p: &Tensor<2>,
    keep: &Tensor<2, Int>,
) -> Option<Tensor<2>> {
    let (b, n) = narrow(logits)?;
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::top_p(logits, b, n, ids, p, keep)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (b, n, ids, p, keep);
        None
    }
}

/// `dist` over narrow rows `[B, N]` (`N <= TOP_K_MAX`), the device recipe's
/// rule in one kernel: weights `exp(l - max)`, walked in ascending `ids`
/// order, the first with a positive weight whose cumulative weight reaches
/// `u·S` (the last positive one if rounding leaves none); `-1`
/// ([`crate::readback::CODE_ALL_MASKED`]) when `S = 0`. Returns the chosen
/// id `[B]` (or with `codes` the status code of an invalid row,
/// [`TokenCodes`]). `u` `[B, 1]`. `None` off the cubecl devices or for wider rows.
pub fn dist(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    u: &Tensor<2>,
    codes: TokenCodes<'_>,
) -> Option<Tensor<1, Int>> {
    let (b, n) = narrow(logits)?;
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::dist(logits, b, n, ids, u, codes)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (b, n, ids, u, codes);
        None
    }
}

/// Full-vocabulary `top_p` over `logits [B, V]` (positions are token ids,
/// `min_keep <= 1`): the logits the cut drops set to `-inf`, the others
/// unchanged, `[B, V]`, and the rows' validation keys `[B, 1]` (as
/// [`first_bad`]; a row with a NaN gets some output of that row). The
/// rule is the fused draw's ([`cut_dist_full`], the CPU's up to rounding):
/// keep a candidate iff the mass `exp(l - max)` before it in canonical
/// order is `< p·S`, and always the first maximum; masses are 64-bit fixed
/// point (`round(w · 2^31)`, exact and order-free), so a logit more than
/// 22 nats below the maximum weighs nothing and is dropped where the
/// CPU would keep it only for `p > 0.999` (on vocabularies up to a
/// million: such logits hold less than `3e-4` of the mass). `p` `[B, 1]`
/// (`+inf` keeps the whole row). The fused kernel without its draw (the row's maximum, mass
/// histogram, crossing bin and its exact resolution; at small batches
/// split over several workgroups a row first, [`greedy_segments`]), then
/// `top_p_mask_rows` writes the row (grid `(tiles, B)`): 2 launches, or 5
/// split; four reads of the row and one write. `None` off the cubecl
/// devices.
pub fn top_p_full(logits: &Tensor<2>, p: &Tensor<2>) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    top_p_full_split(logits, p, None)
}

/// [`top_p_full`] with each row's first reads split over `segments`
/// workgroups (clamped to `1..=`[`SEGMENTS_MAX`]; 1: unsplit) instead of
/// the device's choice (`None`): the same output for any split. For tests
/// and for tuning on a given device.
pub fn top_p_full_split(
    logits: &Tensor<2>,
    p: &Tensor<2>,
    segments: Option<usize>,
) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    if !argmax_applies(b, n) || i32::try_from(2 * n).is_err() {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        let segments = segments.map(|s| s.clamp(1, SEGMENTS_MAX));
        launch::top_p_full(logits, p, segments)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (p, segments);
        None
    }
}

/// `min_p` over `logits [B, N]` (`min_keep <= 1`), the device recipe's rule
/// in one kernel: keep `l >= max + ln p` (`log_p` `[B, 1]`, `-inf` on no-op
/// rows) and the first candidate in canonical order (logit descending, ties
/// to the lowest of `ids` `[B, N]`, or of the positions without); the
/// others become `-inf`. Also returns the rows' validation keys `[B, 1]`
/// from its first pass (as [`first_bad`]; meaningful on full rows). Two
/// reads of the row. `None` off the cubecl devices.
pub fn min_p(
    logits: &Tensor<2>,
    ids: Option<&Tensor<2, Int>>,
    log_p: &Tensor<2>,
) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    if !argmax_applies(b, n) || i32::try_from(2 * n).is_err() {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::min_p(logits, ids, log_p)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (ids, log_p);
        None
    }
}

/// Full-vocabulary `cut -> [temperature(t)] -> dist(u)` over `logits
/// [B, V]` (positions are token ids, `min_keep <= 1`) in one kernel: `[B]`
/// token ids (or with `codes` the status code of an invalid row,
/// [`TokenCodes`]; `-1` for a row without a finite logit) and the rows'
/// validation keys `[B, 1]` (as [`first_bad`]). `t` `[B, 1]` (`None`: no
/// temperature; rows with `t < greedy_below` take the first maximum), `u`
/// `[B, 1]` in `[0, 1)`. A `top_p` cut reads the row about three times
/// (`cube/cut_dist/mod.rs` says how), a `min_p` cut about twice (the
/// maximum, then the kept weights in chunks; `All` the same without a
/// cut), and the drawn chunk once more and a part of it (`1 / units` of a
/// row and `1 / units` of that). Small batches split each row's passes
/// over the whole row across several workgroups first ([`greedy_segments`]
/// of them, as greedy): `argmax_part_rows` (each segment's maximum and
/// validation), for `top_p` `top_p_histogram_part_rows` (the row's mass
/// histogram, exact 64-bit fixed point) and `top_p_kept_part_rows` (kept
/// weights above the crossing bin, its logits gathered), else
/// `kept_sums_part_rows` (kept weights); one workgroup a row merges them
/// and reads the segment holding `u·W` alone: 4 launches (`top_p`) or 3,
/// not 1, the same tokens and codes. `None` off the cubecl devices.
pub fn cut_dist_full(
    logits: &Tensor<2>,
    cut: FullCut<'_>,
    t: Option<&Tensor<2>>,
    u: &Tensor<2>,
    greedy_below: f32,
    codes: TokenCodes<'_>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    cut_dist_full_split(logits, cut, t, u, greedy_below, codes, None)
}

/// [`cut_dist_full`] with each row's first reads split over `segments`
/// workgroups (clamped to `1..=`[`SEGMENTS_MAX`]; 1: one workgroup a row,
/// one kernel) instead of the device's own choice ([`greedy_segments`],
/// `None`): the same tokens and codes for any split. For tests and for
/// tuning on a given device.
pub fn cut_dist_full_split(
    logits: &Tensor<2>,
    cut: FullCut<'_>,
    t: Option<&Tensor<2>>,
    u: &Tensor<2>,
    greedy_below: f32,
    codes: TokenCodes<'_>,
    segments: Option<usize>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    if !argmax_applies(b, n) || i32::try_from(2 * n).is_err() {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        let segments = segments.map(|s| s.clamp(1, SEGMENTS_MAX));
        launch::cut_dist_full(logits, cut, t, u, greedy_below, codes, segments)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = (cut, t, u, greedy_below, codes, segments);
        None
    }
}

/// [`cut_dist_full`] with a `top_p` cut (`p` `[B, 1]`, `+inf` keeps the
/// whole row).
pub fn top_p_dist_full(
    logits: &Tensor<2>,
    p: &Tensor<2>,
    t: Option<&Tensor<2>>,
    u: &Tensor<2>,
    greedy_below: f32,
    codes: TokenCodes<'_>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    cut_dist_full(logits, FullCut::TopP(p), t, u, greedy_below, codes)
}

/// What a fully offloaded step reads back, `[B]` i32: each row's sampled
/// token, or its status code when the row is invalid (`first_bad [B, 1]`
/// below `2·vocab`: `-key - 2`, see `crate::readback`). One launch instead
/// of burn's mask-where and cast. `None` off the cubecl devices (or for an
/// int dtype other than i32).
pub fn token_codes(
    sampled: &Tensor<1, Int>,
    first_bad: &Tensor<2, Int>,
    vocab: usize,
) -> Option<Tensor<1, Int>> {
    let [b] = sampled.dims();
    if b == 0 || !enabled() || i32::try_from(2 * vocab).is_err() {
        return None;
    }
    #[cfg(feature = "cubecl-kernels")]
    {
        launch::token_codes(sampled, first_bad, vocab)
    }
    #[cfg(not(feature = "cubecl-kernels"))]
    {
        let _ = first_bad;
        None
    }
}
