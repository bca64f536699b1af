//! A fused `[temperature(t)] -> dist` tail over a survivor set, for
//! [`super::sample_row`]: the token the reference stages
//! (`stages::temperature` plain path, then `stages::dist::dist_select`) would
//! select, without building a `Candidates` or sorting ids.
//!
//! Same arithmetic as the reference: `l' = div_saturating(l, t)`;
//! `e_i = exp(l'_i - max)` in f32 and `S = Σ e_i` in f64 lanes over the
//! set's CURRENT order (`sampler_core::numerics`); the inverse CDF walks ascending token ids, accumulating `e_i` in
//! f64, and takes the first `e_i > 0` with `cum >= u·S` (else the last with
//! `e_i > 0`).

use sampler_core::{GREEDY_TEMPERATURE, SampleError, Sampler, StageSpec, TokenId};

use crate::cdf::{BLOCK, certified_crossing};
use crate::util::div_saturating;

/// The tail of a chain after the fast lead stage, when it is exactly
/// (ignoring no-op stages) an optional plain temperature and a final `dist`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TempDist {
    /// Divide by this first (`None`: no temperature stage).
    pub t: Option<f32>,
    /// Index of the `dist` stage in the chain (its random lane).
    pub dist_at: usize,
}

/// Recognise the tail `stages[from..]`.
pub(crate) fn temp_dist_tail(stages: &[Box<dyn Sampler>], from: usize) -> Option<TempDist> {
    let mut t = None;
    let mut dist_at = None;
    for (i, s) in stages.iter().enumerate().skip(from) {
        if s.is_noop() {
            continue;
        }
        if dist_at.is_some() {
            return None;
        }
        match s.spec()? {
            StageSpec::Temperature {
                t: tt,
                dynatemp_range,
                ..
            } if t.is_none() && !(dynatemp_range > 0.0) && tt >= GREEDY_TEMPERATURE => {
                t = Some(tt);
            }
            StageSpec::Dist => dist_at = Some(i),
            _ => return None,
        }
    }
    dist_at.map(|dist_at| TempDist { t, dist_at })
}

#[inline(always)]
fn scaled(l: f32, t: Option<f32>) -> f32 {
    match t {
        Some(t) if t != 1.0 => div_saturating(l, t),
        _ => l,
    }
}

/// A temperature as a loop's scaling, chosen once per loop rather than
/// tested per element (LLVM left the test in the loops, which ran a third
/// slower): [`Divide`] (`div_saturating` by `t`) or [`AsIs`]. Either gives
/// [`scaled`]'s value.
trait Scale: Copy {
    fn of(self, l: f32) -> f32;
}

#[derive(Clone, Copy)]
struct Divide(f32);

#[derive(Clone, Copy)]
struct AsIs;

impl Scale for Divide {
    #[inline(always)]
    fn of(self, l: f32) -> f32 {
        div_saturating(l, self.0)
    }
}

impl Scale for AsIs {
    #[inline(always)]
    fn of(self, l: f32) -> f32 {
        l
    }
}

/// [`e_of`] with the scaling chosen outside the loop.
#[inline(always)]
fn e_scaled(l: f32, scale: impl Scale, max: f32) -> f32 {
    let e = sampler_core::numerics::exp_nonpos(scale.of(l) - max);
    if e.is_nan() { 0.0 } else { e }
}

/// The token `dist` selects from a set given twice: `current`, its logits
/// in the set's order (for the normaliser), and `by_id` in ascending token
/// id (for the walk), both before the temperature. `u` in `[0, 1)`.
///
/// # Errors
/// [`SampleError::AllMasked`] when no candidate has positive probability.
pub(crate) fn temp_dist_token(
    current: &[f32],
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    u: f64,
) -> Result<TokenId, SampleError> {
    temp_dist_draw(current, by_id, t, u).map(|(token, _, _)| token)
}

/// [`temp_dist_token`], with the largest scaled logit and the normaliser
/// `S` it drew with (the token's probability is `exp(l - max) · (1/S)`).
///
/// # Errors
/// As [`temp_dist_token`].
pub(crate) fn temp_dist_draw(
    current: &[f32],
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    u: f64,
) -> Result<(TokenId, f32, f64), SampleError> {
    let t = t.filter(|&t| t != 1.0);
    let (max, sum) = max_exp_sum(current, t);
    if max == f32::NEG_INFINITY || max.is_nan() || !(sum > 0.0) {
        return Err(SampleError::AllMasked);
    }
    let token = walk(by_id, t, max, u * sum).ok_or(SampleError::AllMasked)?;
    Ok((token, max, sum))
}

/// [`temp_dist_draw`] for a set whose current order is ascending token id
/// (a whole row: `ids` is `None` and position is id; or a set kept in id
/// order), the same token, maximum and normaliser, without walking the set
/// from its start.
///
/// The exp-sum pass also records the lane rule's running sum at every
/// block, and the walk starts at the block that holds `u·S`, its crossing
/// proved to be the sequential walk's, else that walk decides
/// ([`crate::cdf`]).
///
/// `known_max`: the set's largest logit (before the temperature), when a
/// pass before this one found it; the largest scaled logit is then its
/// scaled value (division by `t > 0`, saturated, is monotone), and the
/// exponentials are the same (a zero's sign aside, which no `e` sees).
///
/// # Errors
/// As [`temp_dist_token`].
pub(crate) fn temp_dist_draw_in_id_order(
    ids: Option<&[TokenId]>,
    logits: &[f32],
    known_max: Option<f32>,
    t: Option<f32>,
    u: f64,
    prefix: &mut Vec<f64>,
) -> Result<(TokenId, f32, f64), SampleError> {
    debug_assert!(ids.is_none_or(|ids| ids.len() == logits.len() && ids.is_sorted()));
    let t = t.filter(|&t| t != 1.0);
    let max = known_max.map_or_else(|| max_scaled(logits, t), |m| scaled(m, t));
    let sum = exp_sum_prefix(logits, t, max, prefix);
    if max == f32::NEG_INFINITY || max.is_nan() || !(sum > 0.0) {
        return Err(SampleError::AllMasked);
    }
    let token = crossing_in_id_order(ids, logits, t, max, u * sum, sum, prefix)
        .ok_or(SampleError::AllMasked)?;
    Ok((token, max, sum))
}

/// The walk's token for `target` over a set in id order, from the
/// certified crossing or else the sequential walk.
fn crossing_in_id_order(
    ids: Option<&[TokenId]>,
    logits: &[f32],
    t: Option<f32>,
    max: f32,
    target: f64,
    sum: f64,
    prefix: &[f64],
) -> Option<TokenId> {
    let id_at = |j: usize| ids.map_or(j as TokenId, |ids| ids[j]);
    let fill = |start: usize, out: &mut [f32]| {
        for (e, &l) in out.iter_mut().zip(&logits[start..]) {
            *e = e_of(l, t, max);
        }
    };
    if let Some(j) = certified_crossing(logits.len(), target, sum, prefix, 0.0, fill) {
        return Some(id_at(j));
    }
    walk(
        (0..logits.len()).map(|j| (id_at(j), logits[j])),
        t,
        max,
        target,
    )
}

/// [`temp_dist_draw_in_id_order`]'s token.
///
/// # Errors
/// As [`temp_dist_token`].
pub(crate) fn temp_dist_token_in_id_order(
    ids: Option<&[TokenId]>,
    logits: &[f32],
    known_max: Option<f32>,
    t: Option<f32>,
    u: f64,
    prefix: &mut Vec<f64>,
) -> Result<TokenId, SampleError> {
    temp_dist_draw_in_id_order(ids, logits, known_max, t, u, prefix).map(|(token, _, _)| token)
}

/// `[temperature] -> dist` over a whole row whose logits are `-inf` but at
/// the tokens `ids` (ascending; `logits`: theirs; `max`: the row's largest
/// logit), as a stage that masks leaves it (`top_n_sigma`), without reading
/// the masked tokens: `dist`'s normaliser sums the row in the lanes of
/// `numerics::sum_f64` by position (token `i` in lane `i % LANES`), where a
/// masked token adds `+0.0`, which leaves a lane as it is, so each kept
/// token is added in its position's lane, in id order: the same bits; the
/// walk in id order over the kept tokens (a masked one never moves it).
///
/// # Errors
/// As [`temp_dist_token`].
pub(crate) fn temp_dist_token_masked_row(
    ids: &[TokenId],
    logits: &[f32],
    max: f32,
    t: Option<f32>,
    u: f64,
) -> Result<TokenId, SampleError> {
    use sampler_core::numerics::{LANES, combine};
    debug_assert!(ids.len() == logits.len() && ids.is_sorted());
    let t = t.filter(|&t| t != 1.0);
    let max = scaled(max, t);
    let mut lanes = [0.0f64; LANES];
    for (&id, &l) in ids.iter().zip(logits) {
        lanes[id as usize % LANES] += f64::from(e_of(l, t, max));
    }
    let sum = combine(lanes);
    if max == f32::NEG_INFINITY || max.is_nan() || !(sum > 0.0) {
        return Err(SampleError::AllMasked);
    }
    walk(
        ids.iter().copied().zip(logits.iter().copied()),
        t,
        max,
        u * sum,
    )
    .ok_or(SampleError::AllMasked)
}

/// `dist_select`'s token and its probability `(e · (1/S)) as f32` for a set
/// whose reference order is another one (a sorted set), given here in
/// ascending id (`ids`, `logits`; `max` is its largest logit), when both are
/// proved from the normaliser summed in id order: the reference's `S`
/// (the same terms in its own order) is within `δ_S = 4·(n + 16)·2^-53·S`
/// of it, so its target `u·S` lies within `u·δ_S` (and a rounding) of this
/// one, which the walk's certificate takes as slack ([`crate::cdf`]); the
/// probability is known when both ends of `S ± δ_S` give the same f32 (the
/// division, product and rounding are monotone). `None`: not proved (the
/// reference decides).
pub(crate) fn draw_with_reordered_sum(
    ids: &[TokenId],
    logits: &[f32],
    max: f32,
    u: f64,
    prefix: &mut Vec<f64>,
) -> Option<(TokenId, f32)> {
    let n = logits.len();
    let sum = exp_sum_prefix(logits, None, max, prefix);
    if !(sum > 0.0) || n != ids.len() {
        return None;
    }
    let ds = 4.0 * (n + 16) as f64 * (f64::EPSILON * 0.5) * sum;
    let target = u * sum;
    let slack = u * ds + f64::EPSILON * sum;
    let fill = |start: usize, out: &mut [f32]| {
        for (e, &l) in out.iter_mut().zip(&logits[start..]) {
            *e = e_of(l, None, max);
        }
    };
    let j = certified_crossing(n, target, sum, prefix, slack, fill)?;
    let e = f64::from(sampler_core::numerics::exp(logits[j] - max));
    let low = (e * (1.0 / (sum + ds))) as f32;
    let high = (e * (1.0 / (sum - ds))) as f32;
    (low == high).then_some((ids[j], low))
}

/// The most tokens [`temp_dist_draw_order_free`] takes (its exponentials
/// sit in a stack buffer).
pub(crate) const ORDER_FREE_MAX: usize = 128;

/// Whether f64 sums of `n` nonnegative f32 values, whose nonzero ones lie in
/// `[lo, hi]`, are exact in every order: each nonzero value is a multiple
/// of `lo`'s ulp `2^(E(lo) - 23)` (a value at least `lo` has an ulp at
/// least `lo`'s, both powers of two), and every partial sum is below
/// `n · 2^(E(hi) + 1)`, so it is an integer multiple of that ulp below
/// `2^53` of them when `⌈log2 n⌉ + E(hi) + 1 - (E(lo) - 23) <= 53`; every
/// addition then rounds nothing.
fn sums_are_exact(n: usize, lo: f32, hi: f32) -> bool {
    // The unbiased exponent; a subnormal has the smallest normal's ulp.
    let exponent = |x: f32| ((x.to_bits() >> 23) & 0xff).max(1) as i32 - 127;
    let log2_n = n.next_power_of_two().trailing_zeros() as i32;
    log2_n + exponent(hi) + 1 - (exponent(lo) - 23) <= 53
}

/// [`temp_dist_draw`] for a set whose reference order is another one (a
/// sorted set), given here in ascending token id (`ids`, `logits`, at most
/// [`ORDER_FREE_MAX`] tokens), when its normaliser does not depend on the
/// order: the reference sums the `e_i` in f64 lanes in its own order, and
/// when every such sum is exact ([`sums_are_exact`]: every kept `e_i` at
/// least `2^-23` for up to 64 tokens, `2^-22` for up to 128, the largest
/// being 1: within about 15 nats after the temperature, as in a
/// `top_k(40)` set of most rows) it is the exact `Σ e_i`, which the
/// plain sum here gives too; the walk is the reference's (ascending id).
/// So the same token, maximum and normaliser, without sorting the set.
/// `None`: not proved, or every logit `-inf` (the caller's path decides,
/// with its errors).
pub(crate) fn temp_dist_draw_order_free(
    ids: &[TokenId],
    logits: &[f32],
    t: Option<f32>,
    u: f64,
) -> Option<(TokenId, f32, f64)> {
    let n = logits.len();
    if n > ORDER_FREE_MAX || ids.len() != n {
        return None;
    }
    let t = t.filter(|&t| t != 1.0);
    let max = max_scaled(logits, t);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return None;
    }
    let mut es = [0.0f32; ORDER_FREE_MAX];
    exps_into(logits, t, max, &mut es[..n]);
    let es = &es[..n];
    let (mut lo, mut hi, mut sum) = (f32::INFINITY, 0.0f32, 0.0f64);
    for &e in es {
        sum += f64::from(e);
        if e > 0.0 {
            lo = lo.min(e);
            hi = hi.max(e);
        }
    }
    if !(sum > 0.0) || !sums_are_exact(n, lo, hi) {
        return None;
    }
    // The walk: the first `e > 0` whose running sum reaches `u·S`, else
    // the last `e > 0`.
    let target = u * sum;
    let mut cum = 0.0f64;
    let mut last = None;
    for (&id, &e) in ids.iter().zip(es) {
        if e > 0.0 {
            cum += f64::from(e);
            last = Some(id);
            if cum >= target {
                return Some((id, max, sum));
            }
        }
    }
    last.map(|id| (id, max, sum))
}

/// `e_of` of every logit into `out` (`out.len() == logits.len()`), in a
/// loop that vectorises (AVX-512F / AVX2 chosen at run time, the same bits).
fn exps_into(logits: &[f32], t: Option<f32>, max: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exps_into_avx512(logits, t, max, out) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exps_into_avx2(logits, t, max, out) };
        }
    }
    exps_into_body(logits, t, max, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exps_into_avx512(logits: &[f32], t: Option<f32>, max: f32, out: &mut [f32]) {
    exps_into_body(logits, t, max, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exps_into_avx2(logits: &[f32], t: Option<f32>, max: f32, out: &mut [f32]) {
    exps_into_body(logits, t, max, out);
}

#[inline(always)]
fn exps_into_body(logits: &[f32], t: Option<f32>, max: f32, out: &mut [f32]) {
    match t {
        Some(t) if t != 1.0 => {
            for (e, &l) in out.iter_mut().zip(logits) {
                *e = e_scaled(l, Divide(t), max);
            }
        }
        _ => {
            for (e, &l) in out.iter_mut().zip(logits) {
                *e = e_scaled(l, AsIs, max);
            }
        }
    }
}

/// The inverse CDF walk: ascending ids, `cum += e_i` (f64) over `e_i > 0`,
/// the first with `cum >= target`, else the last with `e_i > 0`. Chunks of
/// 64: their exponentials first (that loop vectorises; AVX-512F / AVX2
/// chosen at run time, the same bits), then the sequential sum.
fn walk(
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { walk_avx512(by_id, t, max, target) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { walk_avx2(by_id, t, max, target) };
        }
    }
    walk_body(by_id, t, max, target)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn walk_avx512(
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    walk_body(by_id, t, max, target)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn walk_avx2(
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    walk_body(by_id, t, max, target)
}

#[inline(always)]
fn walk_body(
    mut by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    const W: usize = 64;
    let mut ids = [0 as TokenId; W];
    let mut ls = [0.0f32; W];
    let mut es = [0.0f32; W];
    let mut cum = 0.0f64;
    let mut last = None;
    loop {
        let mut n = 0;
        for (id, l) in by_id.by_ref().take(W) {
            ids[n] = id;
            ls[n] = l;
            n += 1;
        }
        if n == 0 {
            return last;
        }
        match t {
            Some(t) if t != 1.0 => {
                for (e, &l) in es.iter_mut().zip(&ls) {
                    *e = e_scaled(l, Divide(t), max);
                }
            }
            _ => {
                for (e, &l) in es.iter_mut().zip(&ls) {
                    *e = e_scaled(l, AsIs, max);
                }
            }
        }
        for (&id, &ei) in ids[..n].iter().zip(&es[..n]) {
            if ei > 0.0 {
                cum += f64::from(ei);
                last = Some(id);
                if cum >= target {
                    return Some(id);
                }
            }
        }
    }
}

/// `exp(scaled(l) - max)` as the reference computes it, NaN as 0. `max` is
/// the largest scaled logit, so the argument is `<= 0` (or NaN) and
/// `exp_nonpos` gives `exp`'s bits.
#[inline(always)]
fn e_of(l: f32, t: Option<f32>, max: f32) -> f32 {
    let e = sampler_core::numerics::exp_nonpos(scaled(l, t) - max);
    if e.is_nan() { 0.0 } else { e }
}

/// [`max_exp_sum`]'s normaliser for the largest scaled logit `max`, also
/// recording in `prefix` the lane rule's running sum (the lanes combined)
/// at the start of every [`BLOCK`]: `prefix[k]` sums the `e` before
/// position `k·BLOCK`. 0 (and no prefix) when `max` is `-inf` or NaN.
fn exp_sum_prefix(current: &[f32], t: Option<f32>, max: f32, prefix: &mut Vec<f64>) -> f64 {
    prefix.clear();
    if max == f32::NEG_INFINITY || max.is_nan() {
        return 0.0;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_sum_prefix_avx512(current, t, max, prefix) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exp_sum_prefix_avx2(current, t, max, prefix) };
        }
    }
    exp_sum_prefix_body(current, t, max, prefix)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_sum_prefix_avx512(current: &[f32], t: Option<f32>, max: f32, prefix: &mut Vec<f64>) -> f64 {
    exp_sum_prefix_body(current, t, max, prefix)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_sum_prefix_avx2(current: &[f32], t: Option<f32>, max: f32, prefix: &mut Vec<f64>) -> f64 {
    exp_sum_prefix_body(current, t, max, prefix)
}

#[inline(always)]
fn exp_sum_prefix_body(current: &[f32], t: Option<f32>, max: f32, prefix: &mut Vec<f64>) -> f64 {
    match t {
        Some(t) if t != 1.0 => exp_sum_prefix_scaled(current, Divide(t), max, prefix),
        _ => exp_sum_prefix_scaled(current, AsIs, max, prefix),
    }
}

#[inline(always)]
fn exp_sum_prefix_scaled(
    current: &[f32],
    scale: impl Scale,
    max: f32,
    prefix: &mut Vec<f64>,
) -> f64 {
    use sampler_core::numerics::{LANES, add_to_lanes, combine};
    let mut lanes = [0.0f64; LANES];
    let mut e = [0.0f32; 64];
    for block in current.chunks(BLOCK) {
        prefix.push(combine(lanes));
        for chunk in block.chunks(64) {
            let n = chunk.len();
            for (ei, &l) in e.iter_mut().zip(chunk) {
                *ei = e_scaled(l, scale, max);
            }
            add_to_lanes(&mut lanes, &e[..n]);
        }
    }
    combine(lanes)
}

/// The largest scaled logit (vector lanes, then the rest).
#[inline(always)]
fn max_scaled(current: &[f32], t: Option<f32>) -> f32 {
    match t {
        Some(t) if t != 1.0 => max_of_scaled(current, Divide(t)),
        _ => max_of_scaled(current, AsIs),
    }
}

#[inline(always)]
fn max_of_scaled(current: &[f32], scale: impl Scale) -> f32 {
    const W: usize = 16;
    let mut acc = [f32::NEG_INFINITY; W];
    let chunks = current.chunks_exact(W);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..W {
            acc[j] = acc[j].max(scale.of(c[j]));
        }
    }
    acc.iter()
        .copied()
        .chain(rest.iter().map(|&l| scale.of(l)))
        .fold(f32::NEG_INFINITY, f32::max)
}

/// The largest scaled logit of `current` and `Σ e_i` over it with the lane
/// rule of `numerics::sum_f64`, in vector lanes (AVX-512F / AVX2 chosen at
/// run time: the same operations in the same order, so the same bits). The
/// maximum's sign of zero may differ from a serial fold; `e_i` does not
/// (`l - (±0)` is `l` for `l != 0`, and `exp(±0) = 1`).
fn max_exp_sum(current: &[f32], t: Option<f32>) -> (f32, f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { max_exp_sum_avx512(current, t) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { max_exp_sum_avx2(current, t) };
        }
    }
    max_exp_sum_body(current, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn max_exp_sum_avx512(current: &[f32], t: Option<f32>) -> (f32, f64) {
    max_exp_sum_body(current, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn max_exp_sum_avx2(current: &[f32], t: Option<f32>) -> (f32, f64) {
    max_exp_sum_body(current, t)
}

#[inline(always)]
fn max_exp_sum_body(current: &[f32], t: Option<f32>) -> (f32, f64) {
    use sampler_core::numerics::{LANES, add_to_lanes, combine};
    let max = max_scaled(current, t);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return (max, 0.0);
    }
    // Exponentials into a buffer (that loop vectorises), then the lane sums;
    // a chunk of 64 starts at a multiple of the lanes.
    #[inline(always)]
    fn sum(current: &[f32], scale: impl Scale, max: f32) -> f64 {
        let mut lanes = [0.0f64; LANES];
        let mut e = [0.0f32; 64];
        for chunk in current.chunks(64) {
            let n = chunk.len();
            for (ei, &l) in e.iter_mut().zip(chunk) {
                *ei = e_scaled(l, scale, max);
            }
            add_to_lanes(&mut lanes, &e[..n]);
        }
        combine(lanes)
    }
    let total = match t {
        Some(t) if t != 1.0 => sum(current, Divide(t), max),
        _ => sum(current, AsIs, max),
    };
    (max, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(x: &mut u32) -> u32 {
        *x ^= *x << 13;
        *x ^= *x >> 17;
        *x ^= *x << 5;
        *x
    }

    /// The masked-row draw (kept tokens only) gives the whole row's draw
    /// with `-inf` at the masked tokens, also where `u·S` lands on a
    /// boundary between two kept tokens, so that the last bit of `S`
    /// decides (a normaliser summed in other lanes fails here).
    #[test]
    fn masked_row_draw_is_the_whole_rows() {
        let mut x = 0x2545_f491u32;
        let mut boundaries = 0;
        for len in [9usize, 64, 333, 4099] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    let r = xorshift(&mut x);
                    if r % 10 < 6 {
                        f32::NEG_INFINITY
                    } else {
                        (r % 20_000) as f32 / 1000.0 - 10.0
                    }
                })
                .collect();
            let ids: Vec<TokenId> = (0..len as TokenId)
                .filter(|&i| row[i as usize] > f32::NEG_INFINITY)
                .collect();
            let kept: Vec<f32> = ids.iter().map(|&i| row[i as usize]).collect();
            let max = kept.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for t in [None, Some(0.7f32)] {
                let smax = scaled(max, t);
                let e: Vec<f32> = row.iter().map(|&l| e_of(l, t, smax)).collect();
                let sum = sampler_core::numerics::sum_f64(e.iter().copied());
                // `u` at every kept token's running sum, and between.
                let mut cum = 0.0f64;
                let mut us = vec![0.0, 0.5, 1.0 - f64::EPSILON];
                for &i in &ids {
                    cum += f64::from(e[i as usize]);
                    us.push(cum / sum);
                }
                for u in us {
                    let want = temp_dist_token_in_id_order(None, &row, None, t, u, &mut Vec::new());
                    let got = temp_dist_token_masked_row(&ids, &kept, max, t, u);
                    assert_eq!(got, want, "len {len} t {t:?} u {u}");
                    boundaries += 1;
                }
            }
        }
        assert!(boundaries > 1000);
    }

    /// Rows that stress the certificate: ordinary, a few large values over
    /// a sea of tiny ones (where sums in another order round otherwise),
    /// masked stretches, and lengths around the block size.
    fn stress_rows() -> Vec<Vec<f32>> {
        let mut x = 0x2468_ace1u32;
        let mut rows = Vec::new();
        for len in [1usize, 63, 1023, 1024, 1025, 3000, 5003] {
            rows.push(
                (0..len)
                    .map(|_| (xorshift(&mut x) % 20_000) as f32 / 1000.0 - 10.0)
                    .collect(),
            );
            // One value at 0, the rest 33-40 nats below it (e from 5e-15
            // down to 4e-18, around and below the f64 ulp of 1): a
            // sequential sum after the big value rounds them or drops them,
            // a sum that adds them first does not.
            rows.push(
                (0..len)
                    .map(|i| {
                        if i == len / 3 {
                            0.0
                        } else {
                            -33.0 - (xorshift(&mut x) % 7000) as f32 / 1000.0
                        }
                    })
                    .collect(),
            );
            rows.push(
                (0..len)
                    .map(|i| match xorshift(&mut x) % 7 {
                        _ if (i / 100) % 3 == 1 => f32::NEG_INFINITY,
                        0 => -80.0,
                        1 => 0.0,
                        _ => -((xorshift(&mut x) % 4000) as f32) / 100.0,
                    })
                    .collect(),
            );
        }
        rows
    }

    /// The sequential walk's running sums `c_j` (the reference's), to aim
    /// targets exactly at them and at their neighbours.
    fn sequential_sums(row: &[f32], t: Option<f32>, max: f32) -> Vec<f64> {
        let mut cum = 0.0f64;
        let mut out = Vec::new();
        for &l in row {
            let e = e_of(l, t, max);
            if e > 0.0 {
                cum += f64::from(e);
                out.push(cum);
            }
        }
        out
    }

    /// The certified walk gives the sequential walk's token for every
    /// target, including targets exactly at (and one ulp around) each of
    /// the sequential running sums, where any other summation order would
    /// round differently; and it decides almost every random target itself.
    #[test]
    fn the_certified_walk_is_the_sequential_walk() {
        let mut x = 0x0bad_5eedu32;
        let mut certified = 0usize;
        let mut random_targets = 0usize;
        for row in stress_rows() {
            for t in [None, Some(0.7f32), Some(2.0)] {
                let mut prefix = Vec::new();
                let max = max_scaled(&row, t);
                let sum = exp_sum_prefix(&row, t, max, &mut prefix);
                let (m0, s0) = max_exp_sum(&row, t);
                assert_eq!((max.to_bits(), sum.to_bits()), (m0.to_bits(), s0.to_bits()));
                let known = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(scaled(known, t), max);
                assert_eq!(prefix.len(), row.len().div_ceil(BLOCK));
                if !(sum > 0.0) {
                    continue;
                }
                let ids: Vec<TokenId> = (0..row.len() as TokenId).map(|i| 3 * i + 1).collect();
                let mut targets = vec![0.0, sum, sum * 1.5, f64::MIN_POSITIVE];
                for c in sequential_sums(&row, t, max).into_iter().step_by(7) {
                    targets.extend([c, c.next_up(), c.next_down()]);
                }
                let randoms: Vec<f64> = (0..200)
                    .map(|_| f64::from(xorshift(&mut x)) / 4_294_967_296.0 * sum)
                    .collect();
                for &target in targets.iter().chain(&randoms) {
                    for ids in [None, Some(&ids[..])] {
                        let id_at = |j: usize| ids.map_or(j as TokenId, |ids| ids[j]);
                        let seq = walk((0..row.len()).map(|j| (id_at(j), row[j])), t, max, target);
                        let got = crossing_in_id_order(ids, &row, t, max, target, sum, &prefix);
                        assert_eq!(got, seq, "len {} t {t:?} target {target:e}", row.len());
                    }
                }
                for &target in &randoms {
                    random_targets += 1;
                    let fill = |start: usize, out: &mut [f32]| {
                        for (e, &l) in out.iter_mut().zip(&row[start..]) {
                            *e = e_of(l, t, max);
                        }
                    };
                    certified += usize::from(
                        certified_crossing(row.len(), target, sum, &prefix, 0.0, fill).is_some(),
                    );
                }
            }
        }
        assert!(
            certified * 100 >= random_targets * 99,
            "the certificate decided only {certified} of {random_targets} random targets"
        );
    }

    /// A set whose reference order is sorted, drawn from its id order:
    /// whenever the proof holds, the token and probability are those of the
    /// reference (normaliser summed in sorted order, walk by id, `(e ·
    /// (1/S)) as f32`), and it holds for almost every draw.
    #[test]
    fn the_reordered_draw_is_the_sorted_draw() {
        let mut x = 0x6a09_e667u32;
        let (mut proved, mut draws) = (0usize, 0usize);
        let mut prefix = Vec::new();
        for row in stress_rows() {
            if row.len() < 2 {
                continue;
            }
            // Ids in ascending order (every third token of a vocabulary).
            let ids: Vec<TokenId> = (0..row.len() as TokenId).map(|i| 3 * i).collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if max == f32::NEG_INFINITY {
                continue;
            }
            // The reference: sorted order (descending logit, ties by id).
            let mut sorted: Vec<usize> = (0..row.len()).collect();
            sorted.sort_by(|&a, &b| sampler_core::desc_cmp(row[a], ids[a], row[b], ids[b]));
            let e = |l: f32| sampler_core::numerics::exp(l - max);
            let s_ref = sampler_core::numerics::sum_f64(sorted.iter().map(|&i| e(row[i])));
            for k in 0..100 {
                let u = if k == 0 {
                    0.0
                } else {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    f64::from(x) / 4_294_967_296.0
                };
                let by_id = ids.iter().copied().zip(row.iter().copied());
                let token = walk(by_id, None, max, u * s_ref).expect("a positive e");
                let j = ids
                    .iter()
                    .position(|&id| id == token)
                    .expect("an id of the set");
                let p = (f64::from(e(row[j])) * (1.0 / s_ref)) as f32;
                draws += 1;
                if let Some(got) = draw_with_reordered_sum(&ids, &row, max, u, &mut prefix) {
                    proved += 1;
                    assert_eq!(got, (token, p), "len {} u {u}", row.len());
                }
            }
        }
        assert!(proved * 100 >= draws * 97, "proved {proved} of {draws}");
    }

    /// The full draw agrees with [`temp_dist_draw`] (token, maximum,
    /// normaliser) for uniforms across `[0, 1)`.
    #[test]
    fn the_id_order_draw_is_the_draw() {
        let mut prefix = Vec::new();
        for row in stress_rows() {
            for t in [None, Some(0.5f32)] {
                for k in 0..64 {
                    let u = f64::from(k) / 64.0 + 0.003;
                    let by_id = (0..row.len() as TokenId).zip(row.iter().copied());
                    let want = temp_dist_draw(&row, by_id, t, u);
                    let want = want.map(|(id, m, s)| (id, m.to_bits(), s.to_bits()));
                    let known = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    for known_max in [None, Some(known)] {
                        let got =
                            temp_dist_draw_in_id_order(None, &row, known_max, t, u, &mut prefix);
                        assert_eq!(
                            got.map(|(id, m, s)| (id, m.to_bits(), s.to_bits())),
                            want,
                            "len {} t {t:?} u {u} known max {known_max:?}",
                            row.len()
                        );
                    }
                }
            }
        }
        let masked = [f32::NEG_INFINITY; 3000];
        assert_eq!(
            temp_dist_draw_in_id_order(None, &masked, None, None, 0.5, &mut prefix).err(),
            Some(SampleError::AllMasked)
        );
    }

    /// The vectorised normaliser (every level the CPU has) gives the serial
    /// rule's bits: `sum_f64` of `exp(scaled(l) - max)` in the set's order.
    #[test]
    fn the_normaliser_is_the_serial_rule() {
        let mut x = 0x1357_9bdfu32;
        for len in [1usize, 15, 16, 17, 64, 65, 1000, 5003] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    match x % 40 {
                        0 => f32::NEG_INFINITY,
                        1 => -0.0,
                        2 => 0.0,
                        3 => -f32::MAX,
                        4 => f32::MAX,
                        _ => (x % 20_000) as f32 / 500.0 - 20.0,
                    }
                })
                .collect();
            for t in [None, Some(0.7f32), Some(1e-30), Some(3.0)] {
                let serial_max = row
                    .iter()
                    .map(|&l| scaled(l, t))
                    .fold(f32::NEG_INFINITY, f32::max);
                let serial = sampler_core::numerics::sum_f64(row.iter().map(|&l| {
                    let e = sampler_core::numerics::exp(scaled(l, t) - serial_max);
                    if e.is_nan() { 0.0 } else { e }
                }));
                let (max, sum) = max_exp_sum(&row, t);
                assert_eq!(max, serial_max, "len {len} t {t:?}");
                assert_eq!(sum.to_bits(), serial.to_bits(), "len {len} t {t:?}");
                let (_, base) = max_exp_sum_body(&row, t);
                assert_eq!(base.to_bits(), serial.to_bits(), "len {len} t {t:?}");
                // Every level the CPU has, not only the one dispatch picks.
                #[cfg(target_arch = "x86_64")]
                {
                    if std::is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU has AVX2.
                        let (m, s) = unsafe { max_exp_sum_avx2(&row, t) };
                        assert_eq!((m, s.to_bits()), (serial_max, serial.to_bits()), "avx2");
                    }
                    if std::is_x86_feature_detected!("avx512f") {
                        // SAFETY: the CPU has AVX-512F.
                        let (m, s) = unsafe { max_exp_sum_avx512(&row, t) };
                        assert_eq!((m, s.to_bits()), (serial_max, serial.to_bits()), "avx512f");
                    }
                }
            }
        }
    }

    /// Where [`sums_are_exact`] holds, the f64 sum is the same in every
    /// order (forward, backward, the lanes of `numerics::sum_f64`); a set
    /// whose sum does depend on the order is refused.
    #[test]
    fn order_free_sums_are_order_free() {
        let mut x = 0x0bad_cafeu32;
        let mut held = 0;
        for n in [1usize, 2, 3, 16, 40, 64, 65, 128] {
            for depth in [1.0f32, 10.0, 15.0, 15.8, 16.5, 30.0] {
                let e: Vec<f32> = (0..n)
                    .map(|_| {
                        let d = (xorshift(&mut x) % 100_000) as f32 / 100_000.0 * depth;
                        sampler_core::numerics::exp(-d)
                    })
                    .collect();
                let lo = e.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = e.iter().copied().fold(0.0f32, f32::max);
                if !sums_are_exact(n, lo, hi) {
                    continue;
                }
                held += 1;
                let forward: f64 = e.iter().map(|&v| f64::from(v)).sum();
                let backward: f64 = e.iter().rev().map(|&v| f64::from(v)).sum();
                let lanes = sampler_core::numerics::sum_f64(e.iter().copied());
                assert_eq!(forward.to_bits(), backward.to_bits(), "n {n} depth {depth}");
                assert_eq!(forward.to_bits(), lanes.to_bits(), "n {n} depth {depth}");
            }
        }
        assert!(held >= 20, "held {held}");
        // 1 + 2^-53 rounds back to 1 (ties to even) when the two small
        // values come one at a time, not when they come together.
        let tiny = f32::from_bits(0x0500_0000); // 2^-117
        let small = 2f32.powi(-53);
        assert!(!sums_are_exact(3, small, 1.0));
        assert!(!sums_are_exact(2, tiny, 1.0));
        assert!(sums_are_exact(64, 2f32.powi(-23), 1.0));
        assert!(!sums_are_exact(65, 2f32.powi(-23), 1.0));
    }

    /// The order-free draw is the sorted set's draw (its token, largest
    /// scaled logit and normaliser, bit for bit) wherever it answers, also
    /// for targets at the walk's running sums and an ulp around them; it
    /// answers for every shallow set (a `top_k` set of most rows) and for
    /// no set with an `e` far below the f64 ulp of the sum.
    #[test]
    fn the_order_free_draw_is_the_sorted_draw() {
        let mut x = 0x9e37_79b9u32;
        let (mut answered, mut checked) = (0usize, 0usize);
        for n in [1usize, 2, 17, 40, 64, 100, 128] {
            for depth in [2.0f32, 8.0, 14.0, 40.0] {
                let logits: Vec<f32> = (0..n)
                    .map(|i| match i % 29 {
                        5 if n > 1 => f32::NEG_INFINITY,
                        // The deepest at exactly `depth` below the top.
                        7 => 3.0 - depth,
                        0 => 3.0,
                        _ => 3.0 - (xorshift(&mut x) % 100_000) as f32 / 100_000.0 * depth,
                    })
                    .collect();
                // Ascending ids with gaps.
                let ids: Vec<TokenId> = (0..n as TokenId).map(|i| 5 * i + i % 3).collect();
                let mut order: Vec<usize> = (0..n).collect();
                order
                    .sort_by(|&a, &b| sampler_core::desc_cmp(logits[a], ids[a], logits[b], ids[b]));
                let sorted: Vec<f32> = order.iter().map(|&i| logits[i]).collect();
                for t in [None, Some(0.7f32), Some(1.5)] {
                    let by_id = || ids.iter().copied().zip(logits.iter().copied());
                    let (_, max, sum) = temp_dist_draw(&sorted, by_id(), t, 0.0).expect("a draw");
                    let mut us = vec![0.0, 0.5, 0.999_999];
                    for c in sequential_sums(&logits, t, max) {
                        let u = c / sum;
                        us.extend([u, u.next_up(), u.next_down()]);
                    }
                    let shallow = depth / t.unwrap_or(1.0) < 15.0;
                    // An `e` below 2^-43 (30 nats) beside an `e` of 1.
                    let deep = logits
                        .iter()
                        .any(|&l| l.is_finite() && (3.0 - l) / t.unwrap_or(1.0) > 30.0);
                    for u in us.into_iter().filter(|u| (0.0..1.0).contains(u)) {
                        let want = temp_dist_draw(&sorted, by_id(), t, u)
                            .map(|(id, m, s)| (id, m.to_bits(), s.to_bits()));
                        checked += 1;
                        match temp_dist_draw_order_free(&ids, &logits, t, u) {
                            Some((id, m, s)) => {
                                answered += 1;
                                assert!(!deep, "n {n} depth {depth} t {t:?}");
                                assert_eq!(Ok((id, m.to_bits(), s.to_bits())), want);
                            }
                            None => assert!(!shallow, "n {n} depth {depth} t {t:?} u {u}"),
                        }
                    }
                }
            }
        }
        assert!(answered * 2 >= checked, "answered {answered} of {checked}");
        let masked = [f32::NEG_INFINITY; 4];
        assert_eq!(
            temp_dist_draw_order_free(&[1, 2, 3, 4], &masked, None, 0.5),
            None
        );
        let long = vec![0.0f32; ORDER_FREE_MAX + 1];
        let long_ids: Vec<TokenId> = (0..long.len() as TokenId).collect();
        assert_eq!(temp_dist_draw_order_free(&long_ids, &long, None, 0.5), None);
    }
}
