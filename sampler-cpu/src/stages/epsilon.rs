//! `epsilon`: epsilon sampling (truncation by an absolute probability cutoff).

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Epsilon sampling with Hugging Face `EpsilonLogitsWarper` semantics
/// (Hewitt et al. 2022): `p = softmax(logits)` over the current candidates,
/// and every candidate with `p < epsilon` is removed, except the
/// `max(1, min_keep)` highest logits and every candidate tied with the last
/// of those (`logit >= k-th largest logit`, as transformers' `topk` threshold
/// keeps ties). The survivors keep their order; nothing is renormalised.
///
/// `epsilon <= 0` is a no-op; a row with no finite logit is left as it is
/// (the selecting stage reports it).
#[derive(Debug, Clone, Copy)]
pub struct Epsilon {
    epsilon: f32,
    min_keep: usize,
}

impl Epsilon {
    /// An epsilon stage; `epsilon` in `[0, 1)`, 0 disables it.
    pub fn new(epsilon: f32, min_keep: usize) -> Self {
        Self { epsilon, min_keep }
    }
}

/// Remove the candidates whose probability (softmax over the current set) is
/// below `cutoff(row)` (the row softmaxed), keeping the `max(1, min_keep)` highest logits and
/// their ties. Shared by [`Epsilon`] and [`Eta`](super::Eta).
pub(crate) fn cut_below(
    row: &mut Candidates,
    min_keep: usize,
    cutoff: impl FnOnce(&Candidates) -> f32,
) -> Result<(), SampleError> {
    if row.is_empty() || row.max_logit() == f32::NEG_INFINITY {
        return Ok(());
    }
    row.softmax()?;
    let threshold = cutoff(row);
    let probs = row.probs().unwrap_or(&[]);
    // `min_keep` counts drawable candidates: never a `-inf` one.
    let finite = row.logits().iter().filter(|l| l.is_finite()).count();
    let k = min_keep.clamp(1, finite.max(1));
    let kth = kth_largest(row.logits(), k);
    let keep: Vec<bool> = probs
        .iter()
        .zip(row.logits())
        .map(|(&p, &l)| p >= threshold || l >= kth)
        .collect();
    if keep.iter().any(|k| !k) {
        row.retain_mask(&keep);
    }
    Ok(())
}

/// The `k`-th largest value (1-based, `1 <= k <= len`).
fn kth_largest(logits: &[f32], k: usize) -> f32 {
    if k == 1 {
        return logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    }
    let mut v = logits.to_vec();
    let (_, kth, _) = v.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

impl Sampler for Epsilon {
    fn name(&self) -> &str {
        "epsilon"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Epsilon {
            epsilon: self.epsilon,
            min_keep: self.min_keep,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.epsilon.is_nan() || self.epsilon <= 0.0 {
            return Ok(());
        }
        let epsilon = self.epsilon;
        cut_below(row, self.min_keep, |_| epsilon)
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
