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

/// The token `dist` selects from a set given twice: `current` in the set's
/// order (for the normaliser) and `by_id` in ascending token id (for the
/// walk), both as `(id, logit)` before the temperature. `u` in `[0, 1)`.
///
/// # Errors
/// [`SampleError::AllMasked`] when no candidate has positive probability.
pub(crate) fn temp_dist_token(
    current: impl Iterator<Item = f32> + Clone,
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    u: f64,
) -> Result<TokenId, SampleError> {
    let max = current
        .clone()
        .map(|l| scaled(l, t))
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return Err(SampleError::AllMasked);
    }
    let e = |l: f32| {
        let e = sampler_core::numerics::exp(scaled(l, t) - max);
        if e.is_nan() { 0.0 } else { e }
    };
    let sum = sampler_core::numerics::sum_f64(current.map(e));
    if !(sum > 0.0) {
        return Err(SampleError::AllMasked);
    }
    let target = u * sum;
    let mut cum = 0.0f64;
    let mut last = None;
    for (id, l) in by_id {
        let ei = e(l);
        if ei > 0.0 {
            cum += f64::from(ei);
            last = Some(id);
            if cum >= target {
                return Ok(id);
            }
        }
    }
    last.ok_or(SampleError::AllMasked)
}
