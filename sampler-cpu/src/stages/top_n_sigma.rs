//! `top_n_sigma`: mask logits more than `n` standard deviations below the max.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Top-nσ (Tang et al. 2024) with llama.cpp semantics: over the finite
/// (not `-inf`) logits compute the maximum, the mean and the population
/// standard deviation (divide by the count; accumulated in f64); every logit
/// `< max - n·std` becomes `-inf`. The set keeps its size and order (no sort,
/// no softmax). `n <= 0` or a set of at most one candidate is a no-op.
#[derive(Debug, Clone, Copy)]
pub struct TopNSigma {
    n: f32,
}

impl TopNSigma {
    /// A top-n-sigma stage; `n <= 0` disables it.
    pub fn new(n: f32) -> Self {
        Self { n }
    }
}

impl Sampler for TopNSigma {
    fn name(&self) -> &str {
        "top_n_sigma"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::TopNSigma { n: self.n })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.n.is_nan() || self.n <= 0.0 || row.len() <= 1 {
            return Ok(());
        }
        let (mut count, mut sum, mut max) = (0usize, 0.0f64, f64::NEG_INFINITY);
        for &l in row.logits() {
            if l.is_finite() {
                count += 1;
                sum += f64::from(l);
                max = max.max(f64::from(l));
            }
        }
        if count == 0 {
            return Ok(());
        }
        let mean = sum / count as f64;
        let var = row
            .logits()
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| (f64::from(l) - mean).powi(2))
            .sum::<f64>()
            / count as f64;
        let threshold = max - f64::from(self.n) * var.sqrt();
        if !row.logits().iter().any(|&l| f64::from(l) < threshold) {
            return Ok(());
        }
        for l in row.logits_mut() {
            if f64::from(*l) < threshold {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
