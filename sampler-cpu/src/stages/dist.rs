//! `dist`: draw a token from the softmax of the current candidates.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec, TokenId};

/// Draws a token from `softmax(logits)` of the current candidates with the
/// row's contract-7 uniform `ctx.rng.uniform(0)`; see [`dist_select`].
/// Follows llama.cpp `dist` (softmax with max subtraction, inverse CDF,
/// probabilities written in the current order), except that the inverse CDF
/// walks the candidates in ascending token-id order, so the token does not
/// depend on the candidate order.
///
/// # Errors
/// [`SampleError::EmptyRow`], [`SampleError::AllMasked`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Dist;

impl Dist {
    /// The stage (it has no parameters).
    pub fn new() -> Self {
        Self
    }
}

impl Sampler for Dist {
    fn name(&self) -> &str {
        "dist"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Dist)
    }
    fn apply(&mut self, row: &mut Candidates, ctx: &StageContext) -> Result<(), SampleError> {
        dist_select(row, ctx.rng.uniform(0)).map(|_| ())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}

/// Softmax the row and select a candidate by inverse CDF in canonical
/// (ascending token id) order, with the uniform `u` in `[0, 1)`.
///
/// * `e_i = exp(l_i - max)` in f32, `S = Σ e_i` in f64;
/// * writes normalised probabilities `p_i = e_i / S` in the row's CURRENT
///   order (the order and the `sorted` flag are unchanged);
/// * walks candidates in ascending token id, accumulating `e_i` in f64, and
///   selects the first candidate with `e_i > 0` and `cum >= u * S`; if none
///   (rounding), the last candidate in id order with `e_i > 0`.
///
/// Returns the selected index (into the current set) and sets it as the
/// row's selection. Cost O(n) for a row in ascending-id order, otherwise
/// O(n + min(n log n, vocab)).
///
/// # Errors
/// [`SampleError::EmptyRow`] for an empty set, [`SampleError::NanLogit`] /
/// [`SampleError::PosInfLogit`] (position in the set) for an invalid logit,
/// [`SampleError::AllMasked`] when no candidate has positive probability
/// (every logit `-inf`).
pub fn dist_select(row: &mut Candidates, u: f64) -> Result<usize, SampleError> {
    if row.is_empty() {
        return Err(SampleError::EmptyRow);
    }
    // One pass finds the max and refuses NaN / +inf (a row that reached
    // `dist_select` without a chain's validation).
    let mut max = f32::NEG_INFINITY;
    for (index, &l) in row.logits().iter().enumerate() {
        if l.is_nan() {
            return Err(SampleError::NanLogit { index });
        }
        if l == f32::INFINITY {
            return Err(SampleError::PosInfLogit { index });
        }
        max = max.max(l);
    }
    if max == f32::NEG_INFINITY {
        return Err(SampleError::AllMasked);
    }
    let was_sorted = row.is_sorted();
    let vocab = row.vocab_size();
    let (sum, chosen) = {
        let raw = row.raw_mut();
        for (p, &l) in raw.probs.iter_mut().zip(raw.logits.iter()) {
            *p = sampler_core::numerics::exp(l - max);
        }
        let sum = sampler_core::numerics::sum_f64_slice(raw.probs);
        // `probs` hold the exponentials e_i until normalised below.
        let chosen = select_in_id_order(raw.ids, raw.probs, u * sum, vocab);
        if sum > 0.0 {
            let inv = 1.0 / sum;
            for p in raw.probs.iter_mut() {
                *p = (f64::from(*p) * inv) as f32;
            }
        }
        (sum, chosen)
    };
    if sum.is_nan() || sum <= 0.0 {
        return Err(SampleError::AllMasked);
    }
    row.set_probs_valid(true);
    if was_sorted {
        row.set_sorted(true);
    }
    let index = chosen.ok_or(SampleError::AllMasked)?;
    row.select(index);
    Ok(index)
}

/// Index (into `ids`/`e`) of the first candidate in ascending-id order with
/// `e > 0` whose running sum reaches `target`; fallback the last with `e > 0`.
fn select_in_id_order(ids: &[TokenId], e: &[f32], target: f64, vocab: usize) -> Option<usize> {
    let n = ids.len();
    let ascending = ids.windows(2).all(|w| w[0] < w[1]);
    let walk = |order: &mut dyn Iterator<Item = usize>| -> Option<usize> {
        let mut cum = 0.0f64;
        let mut last_pos = None;
        for i in order {
            let ei = e[i];
            if ei > 0.0 {
                cum += f64::from(ei);
                last_pos = Some(i);
                if cum >= target {
                    return Some(i);
                }
            }
        }
        last_pos
    };
    if ascending {
        return walk(&mut (0..n));
    }
    // Sorting n indices costs n log n; a dense id -> position table costs the
    // vocabulary size. Use the cheaper one.
    let log_n = (usize::BITS - n.leading_zeros()) as usize;
    if n.saturating_mul(log_n) <= vocab && vocab > 0 {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by_key(|&i| ids[i]);
        walk(&mut order.into_iter())
    } else {
        let size = vocab.max(ids.iter().map(|&i| i as usize + 1).max().unwrap_or(0));
        let mut table = vec![usize::MAX; size];
        for (pos, &id) in ids.iter().enumerate() {
            if let Some(slot) = table.get_mut(id as usize) {
                *slot = pos;
            }
        }
        walk(&mut table.into_iter().filter(|&p| p != usize::MAX))
    }
}
