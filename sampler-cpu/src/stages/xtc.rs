//! `xtc`: exclude top choices.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Exclude Top Choices (oobabooga text-generation-webui #6335) with llama.cpp
/// semantics. With chance `probability` per step (the row's contract-7
/// uniform `ctx.rng.uniform(0)` as f32; `chance > probability` is a no-op),
/// on sets of 2 or more: sort, softmax, find the LAST candidate whose
/// probability is `>= threshold` (scanning from the top while it holds); if
/// that is not the first one and at least `min_keep` candidates remain,
/// every candidate above it is removed. The remaining probabilities are not
/// renormalised. `probability <= 0` or `threshold > 0.5` is a no-op.
///
/// # Errors
/// [`SampleError::AllMasked`] when every candidate is `-inf` and XTC fires.
#[derive(Debug, Clone, Copy)]
pub struct Xtc {
    probability: f32,
    threshold: f32,
    min_keep: usize,
}

impl Xtc {
    /// An XTC stage.
    pub fn new(probability: f32, threshold: f32, min_keep: usize) -> Self {
        Self {
            probability,
            threshold,
            min_keep,
        }
    }
}

impl Sampler for Xtc {
    fn name(&self) -> &str {
        "xtc"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Xtc {
            probability: self.probability,
            threshold: self.threshold,
            min_keep: self.min_keep,
        })
    }
    fn apply(&mut self, row: &mut Candidates, ctx: &StageContext) -> Result<(), SampleError> {
        if self.probability.is_nan()
            || self.probability <= 0.0
            || self.threshold > 0.5
            || row.len() < 2
        {
            return Ok(());
        }
        let chance = ctx.rng.uniform(0) as f32;
        if chance > self.probability {
            return Ok(());
        }
        row.sort_desc();
        row.softmax()?;
        let probs = row.probs().unwrap_or(&[]);
        let mut pos_last = 0;
        for (i, &p) in probs.iter().enumerate() {
            // A candidate of probability 0 (a banned, `-inf` logit) is never a
            // top choice, even at threshold 0: XTC keeps a drawable token.
            if p >= self.threshold && p > 0.0 {
                pos_last = i;
            } else {
                break;
            }
        }
        if pos_last > 0 && row.len() - pos_last >= self.min_keep {
            row.drop_front(pos_last);
        }
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
