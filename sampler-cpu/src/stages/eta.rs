//! `eta`: eta sampling (truncation by an entropy-dependent cutoff).

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

use super::epsilon::cut_below;

/// Eta sampling with Hugging Face `EtaLogitsWarper` semantics (Hewitt et al.
/// 2022): `p = softmax(logits)` over the current candidates, entropy
/// `H = -sum p ln p` (nats, over `p > 0`; in f64 as
/// `ln S − Σ e_i (l_i − max) / S`, no logarithm per candidate), cutoff
/// `eta = min(epsilon, sqrt(epsilon) * exp(-H))`; every candidate with
/// `p < eta` is removed, except the `max(1, min_keep)` highest logits and
/// their ties (as [`Epsilon`](super::Epsilon)). Order kept; not renormalised.
///
/// `epsilon <= 0` is a no-op.
#[derive(Debug, Clone, Copy)]
pub struct Eta {
    epsilon: f32,
    min_keep: usize,
}

impl Eta {
    /// An eta stage; `epsilon` in `[0, 1)`, 0 disables it.
    pub fn new(epsilon: f32, min_keep: usize) -> Self {
        Self { epsilon, min_keep }
    }
}

/// `min(epsilon, sqrt(epsilon) * exp(-H))` (in f32) for the entropy `H`
/// (nats).
pub(crate) fn eta_cutoff(epsilon: f32, entropy: f64) -> f32 {
    let h = entropy as f32;
    epsilon.min(epsilon.sqrt() * (-h).exp())
}

impl Sampler for Eta {
    fn name(&self) -> &str {
        "eta"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Eta {
            epsilon: self.epsilon,
            min_keep: self.min_keep,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.epsilon.is_nan() || self.epsilon <= 0.0 {
            return Ok(());
        }
        let epsilon = self.epsilon;
        cut_below(row, self.min_keep, |row| {
            let (_, h) = crate::util::log_norm_entropy(row.logits(), row.max_logit());
            eta_cutoff(epsilon, h)
        })
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
