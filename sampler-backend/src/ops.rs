//! Tensor building blocks shared by the device stages. Every helper works on
//! a whole batch `[B, N]` with per-row parameters as `[B, 1]` columns, and
//! uses only element-wise ops, reductions along dim 1, `topk`, `gather` and
//! short `cumsum`s (never a sort or a cumsum over a full vocabulary row).

use std::cell::RefCell;

use burn_tensor::{Bool, Device, Int, Tensor, TensorData};
use sampler_core::DeviceRefusal;

/// Widths up to this use exact pairwise `[B, N, N]` comparisons (ranks,
/// id-ordered cumulative sums); wider rows use reductions.
pub const PAIRWISE_MAX: usize = 256;

/// Block size of the two-level prefix sum used by `dist` on full rows.
pub const DIST_BLOCK: usize = 256;

/// A `[B, 1]` float column from per-row values.
pub fn col_f32(vals: &[f32], device: &Device) -> Tensor<2> {
    Tensor::<2>::from_data(TensorData::new(vals.to_vec(), [vals.len(), 1]), device)
}

/// A `[B, 1]` int column from per-row values.
pub fn col_int(vals: &[i64], device: &Device) -> Tensor<2, Int> {
    let v: Vec<i32> = vals
        .iter()
        .map(|&x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
        .collect();
    Tensor::<2, Int>::from_data(TensorData::new(v, [vals.len(), 1]), device)
}

/// A `[N]` int vector (row or slot indices).
pub fn vec_int(vals: &[i64], device: &Device) -> Tensor<1, Int> {
    let v: Vec<i32> = vals
        .iter()
        .map(|&x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
        .collect();
    Tensor::<1, Int>::from_data(TensorData::new(v, [vals.len()]), device)
}

/// A `[B, 1]` bool column.
pub fn col_bool(vals: &[bool], device: &Device) -> Tensor<2, Bool> {
    Tensor::<2, Bool>::from_data(TensorData::new(vals.to_vec(), [vals.len(), 1]), device)
}

/// Positions `0..n` broadcast to `[b, n]` (from [`arange`]).
pub fn positions(b: usize, n: usize, device: &Device) -> Tensor<2, Int> {
    arange(n, device).reshape([1, n]).expand([b, n])
}

/// How many `0..n` vectors [`arange`] keeps per thread (one per distinct
/// width: the vocabulary, `k`, block counts).
const ARANGE_CACHED: usize = 16;

thread_local! {
    static ARANGE: RefCell<Vec<(Device, usize, Tensor<1, Int>)>> = const { RefCell::new(Vec::new()) };
}

/// `0..n` as a `[n]` int tensor on `device`, uploaded once per device and
/// width and then shared (a cached tensor is never written in place).
///
/// Not `Tensor::arange`: under burn's fusion (wgpu, vulkan, cuda) that is a
/// `cumsum` of ones, and cubecl's cumsum loops over each output's prefix,
/// O(n²) work per call (seconds at n = 151936 on a software Vulkan driver).
pub fn arange(n: usize, device: &Device) -> Tensor<1, Int> {
    ARANGE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, _, t)) = cache.iter().find(|(d, m, _)| *m == n && d == device) {
            return t.clone();
        }
        let vals: Vec<i32> = (0..n)
            .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
            .collect();
        let t = Tensor::<1, Int>::from_data(TensorData::new(vals, [n]), device);
        if cache.len() == ARANGE_CACHED {
            cache.remove(0);
        }
        cache.push((device.clone(), n, t.clone()));
        t
    })
}

/// Broadcast a `[B, 1]` column to `[B, n]`.
pub fn wide<K: burn_tensor::kind::Basic>(col: Tensor<2, K>, n: usize) -> Tensor<2, K> {
    let [b, _] = col.dims();
    col.expand([b, n])
}

/// `-inf` where `keep` is false.
pub fn mask_logits(logits: Tensor<2>, keep: Tensor<2, Bool>) -> Tensor<2> {
    logits.mask_fill(keep.bool_not(), f32::NEG_INFINITY)
}

/// Row max `[B, 1]`, with all-`-inf` rows mapped to 0 so that `l - max`
/// never computes `-inf - -inf`. Also returns whether the row had any finite logit.
pub fn safe_max(logits: &Tensor<2>) -> (Tensor<2>, Tensor<2, Bool>) {
    let m = logits.clone().max_dim(1);
    let dead = m.clone().equal_elem(f32::NEG_INFINITY);
    (m.mask_fill(dead.clone(), 0.0), dead.bool_not())
}

/// `exp(l - max)` `[B, N]` (0 for `-inf`), and the row max `[B, 1]` (0 on dead rows).
pub fn exps(logits: &Tensor<2>) -> (Tensor<2>, Tensor<2>) {
    let [_, n] = logits.dims();
    let (m, _) = safe_max(logits);
    (logits.clone().sub(wide(m.clone(), n)).exp(), m)
}

/// `top_p`'s fixed-point weights of softmax terms `e` `[B, N]` (from
/// [`exps`]): `trunc(fl(e·2^31 + 0.5))` clamped to `[0, 2^31]`, as
/// `sampler_core::numerics::fixed_weight`, in units of `2^-31` of the row
/// maximum's weight (held in f32: exact integers below `2^24`, rounded
/// above), so a weight below `2^-32` of the maximum's is 0 here as on the
/// CPU and in the kernels.
pub fn fixed_weights(e: Tensor<2>) -> Tensor<2> {
    e.mul_scalar(2_147_483_648.0f32)
        .add_scalar(0.5f32)
        .clamp(0.0, 2_147_483_648.0f32)
        .floor()
}

/// Minimum of `vals` where `mask` is set, else `none` (ints), `[B, 1]`.
pub fn min_where_int(vals: Tensor<2, Int>, mask: Tensor<2, Bool>, none: i64) -> Tensor<2, Int> {
    vals.mask_fill(mask.bool_not(), none).min_dim(1)
}

/// Maximum of `vals` where `mask` is set, else `none` (ints), `[B, 1]`.
pub fn max_where_int(vals: Tensor<2, Int>, mask: Tensor<2, Bool>, none: i64) -> Tensor<2, Int> {
    vals.mask_fill(mask.bool_not(), none).max_dim(1)
}

/// Greedy choice: the lowest token id among the row's maximum logits, `[B, 1]`.
/// All-`-inf` rows give the lowest id overall.
pub fn argmax_lowest_id(logits: &Tensor<2>, ids: &Tensor<2, Int>) -> Tensor<2, Int> {
    let [_, n] = logits.dims();
    let m = logits.clone().max_dim(1);
    let is_max = logits.clone().equal(wide(m, n));
    min_where_int(ids.clone(), is_max, i32::MAX as i64)
}

/// Pairwise "j comes before i" in the canonical order (logit descending, ties
/// by ascending token id): `[B, N(i), N(j)]`.
pub fn before_pairwise(logits: &Tensor<2>, ids: &Tensor<2, Int>) -> Tensor<3, Bool> {
    let [b, n] = logits.dims();
    let li = logits.clone().reshape([b, n, 1]).expand([b, n, n]);
    let lj = logits.clone().reshape([b, 1, n]).expand([b, n, n]);
    let ii = ids.clone().reshape([b, n, 1]).expand([b, n, n]);
    let ij = ids.clone().reshape([b, 1, n]).expand([b, n, n]);
    let gt = lj.clone().greater(li.clone());
    let tie = lj.equal(li).bool_and(ij.lower(ii));
    gt.bool_or(tie)
}

/// Canonical rank `[B, N]` (0 = best) and the sum of `weights` over the
/// candidates ranked before each one `[B, N]` (pairwise; `N <= PAIRWISE_MAX`).
pub fn rank_and_mass_before(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    weights: &Tensor<2>,
) -> (Tensor<2, Int>, Tensor<2>) {
    let (rank, before, _) = rank_and_masses(logits, ids, weights, false);
    (rank, before)
}

/// [`rank_and_mass_before`], and with `from` the weight of the candidates
/// at or after each one (itself included) `[B, N]`, summed directly (not
/// `S - before`, which loses a tail of tiny weights next to `S`);
/// zeros when `from` is false.
pub fn rank_and_masses(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    weights: &Tensor<2>,
    from: bool,
) -> (Tensor<2, Int>, Tensor<2>, Tensor<2>) {
    let [b, n] = logits.dims();
    let before = before_pairwise(logits, ids);
    let rank = before.clone().int().sum_dim(2).reshape([b, n]);
    let w = weights.clone().reshape([b, 1, n]).expand([b, n, n]);
    let mass = w
        .clone()
        .mask_fill(before.clone().bool_not(), 0.0)
        .sum_dim(2)
        .reshape([b, n]);
    let after = if from {
        w.mask_fill(before, 0.0).sum_dim(2).reshape([b, n])
    } else {
        logits.zeros_like()
    };
    (rank, mass, after)
}

/// A `topk` key that every backend orders like the logits: cubecl's `topk`
/// starts from the lowest finite float and returns that value with index
/// `-1` for `-inf` entries, so `-inf` maps to [`TOPK_NEG_INF`] (above the
/// lowest finite float) and finite logits below `-1e38` are clamped to
/// `-1e38` (their order among themselves is lost; they have probability 0
/// next to any ordinary logit).
pub fn topk_key(logits: &Tensor<2>) -> Tensor<2> {
    logits
        .clone()
        .clamp_min(-1.0e38)
        .mask_fill(logits.clone().equal_elem(f32::NEG_INFINITY), TOPK_NEG_INF)
}

/// The largest `k` given to burn's generic `topk` on a cubecl device:
/// its reduction unrolls `k` accumulators per thread, so its compile time
/// grows with `k` (measured on lavapipe: see `docs/benchmarks.md`). A
/// stage that would need more refuses the device
/// ([`DeviceRefusal::SelectionTooWide`]) and runs on the host.
pub const GENERIC_TOPK_MAX: usize = 64;

/// `Ok` when `device` may run burn's generic `topk` at `k`: any `k` on a
/// CPU device (no compile step), at most [`GENERIC_TOPK_MAX`] on a cubecl
/// one.
///
/// # Errors
/// [`DeviceRefusal::SelectionTooWide`].
pub fn generic_topk_allowed(k: usize, device: &Device) -> Result<(), DeviceRefusal> {
    if k <= GENERIC_TOPK_MAX || crate::is_cpu_device(device) {
        Ok(())
    } else {
        Err(DeviceRefusal::SelectionTooWide {
            k,
            limit: GENERIC_TOPK_MAX,
        })
    }
}

/// `Ok` when [`canonical_top_mask`] at `m_max` over rows of `width` stays
/// within [`generic_topk_allowed`] (narrow rows take the pairwise path, no
/// `topk`): the `min_keep` of `top_p`, `min_p` and `epsilon`.
///
/// # Errors
/// [`DeviceRefusal::SelectionTooWide`].
pub fn top_mask_allowed(m_max: usize, width: usize, device: &Device) -> Result<(), DeviceRefusal> {
    if m_max <= 1 || width <= PAIRWISE_MAX {
        return Ok(());
    }
    generic_topk_allowed(m_max, device)
}

/// The `topk` key of a `-inf` logit (and of "not a tie" in tie keys).
pub const TOPK_NEG_INF: f32 = -3.0e38;

/// Membership `[B, N]` in each row's canonical top-`m_row` (logit descending,
/// ties to the lowest id) for any width, with `m_row` in `1..=m_max`, `[B, 1]`.
/// Uses two native `topk`s at `m_max` (values, then a tie key) and no sort.
pub fn canonical_top_mask(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    m_row: &Tensor<2, Int>,
    m_max: usize,
) -> Tensor<2, Bool> {
    let [_, n] = logits.dims();
    let m_max = m_max.clamp(1, n);
    if n <= PAIRWISE_MAX {
        let zeros = logits.zeros_like();
        let (rank, _) = rank_and_mass_before(logits, ids, &zeros);
        return rank.lower(wide(m_row.clone(), n));
    }
    let key = topk_key(logits);
    let v = key.clone().topk(m_max, 1);
    let vm = v.gather(1, m_row.clone().sub_scalar(1).clamp(0, m_max as i64 - 1));
    let gt = key.clone().greater(wide(vm.clone(), n));
    let tie = key.equal(wide(vm, n));
    let count_gt = gt.clone().int().sum_dim(1);
    let need = m_row.clone().sub(count_gt).clamp(1, m_max as i64);
    let tie_key = ids
        .clone()
        .float()
        .neg()
        .mask_fill(tie.clone().bool_not(), TOPK_NEG_INF);
    let kv = tie_key.topk(m_max, 1);
    let thr = kv.gather(1, need.sub_scalar(1)).neg();
    let id_ok = ids.clone().float().lower_equal(wide(thr, n));
    gt.bool_or(tie.bool_and(id_ok))
}

/// Canonical top-`k` per row over `[B, N]`: `(logits, ids)` of shape `[B, K]`
/// with `K = k_max`, sorted by logit descending with ties at the boundary
/// resolved to the lowest token ids (the CPU rule). Positions `>= k_row` are
/// masked to `-inf`. `k_row`: `[B, 1]` in `1..=K`.
///
/// burn's `topk` returns values in descending order but an unspecified
/// member of a tie; a second `topk` over the tie key `-id` (only where the
/// key equals the row's k-th value) picks the lowest ids, spliced in after
/// the strictly greater ones. The output logits are gathered from the input
/// at the chosen positions (exact values, `-inf` kept).
pub fn canonical_topk(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    k_row: &Tensor<2, Int>,
    k_max: usize,
) -> (Tensor<2>, Tensor<2, Int>) {
    let (vals, pos, _) = canonical_topk_positions(logits, ids, k_row, k_max);
    (vals, ids.clone().gather(1, pos))
}

/// As [`canonical_topk`], returning the chosen input positions `[B, K]`
/// instead of their ids, and the live mask `[B, K]` (`j < k_row`): the
/// positions past a row's own `k` are padding, not candidates.
pub fn canonical_topk_positions(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    k_row: &Tensor<2, Int>,
    k_max: usize,
) -> (Tensor<2>, Tensor<2, Int>, Tensor<2, Bool>) {
    let [b, n] = logits.dims();
    let k = k_max.clamp(1, n);
    let device = logits.device();
    let key = topk_key(logits);
    let (v1, p1) = key.clone().topk_with_indices(k, 1);
    let kr = k_row.clone().clamp(1, k as i64);
    let vk = v1.gather(1, kr.clone().sub_scalar(1));
    let gt = key.clone().greater(wide(vk.clone(), n));
    let tie = key.equal(wide(vk, n));
    let count_gt = gt.int().sum_dim(1);
    let tie_key = ids
        .clone()
        .float()
        .neg()
        .mask_fill(tie.bool_not(), TOPK_NEG_INF);
    let (_, p2) = tie_key.topk_with_indices(k, 1);
    let j = positions(b, k, &device);
    let src = j
        .clone()
        .sub(wide(count_gt.clone(), k))
        .clamp(0, k as i64 - 1);
    let p2s = p2.gather(1, src);
    let use_tie = j.clone().greater_equal(wide(count_gt, k));
    let pos = p1.mask_where(use_tie, p2s).clamp(0, n as i64 - 1);
    let vals = logits.clone().gather(1, pos.clone());
    let live = j.lower(wide(kr, k));
    (mask_logits(vals, live.clone()), pos, live)
}
