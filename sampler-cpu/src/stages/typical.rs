//! `typical`: locally typical sampling.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Locally typical sampling (Meister et al. 2022) with llama.cpp semantics:
/// softmax over the sorted set, entropy `H = -Σ p ln p` (over `p > 0`), score
/// `|−ln p_i − H|`; candidates are reordered by ascending score (ties keep the
/// sorted order: higher logit, then lower id) and the shortest prefix whose
/// cumulative probability is strictly `> p` and that holds at least
/// `min_keep` candidates is kept. Output is in score order (not sorted),
/// probabilities not renormalised. `p >= 1` is a no-op.
///
/// # Errors
/// [`SampleError::AllMasked`] when every candidate is `-inf`.
#[derive(Debug, Clone, Copy)]
pub struct Typical {
    p: f32,
    min_keep: usize,
}

impl Typical {
    /// A typical stage; `p >= 1` disables it.
    pub fn new(p: f32, min_keep: usize) -> Self {
        Self { p, min_keep }
    }
}

impl Sampler for Typical {
    fn name(&self) -> &str {
        "typical"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Typical {
            p: self.p,
            min_keep: self.min_keep,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.p >= 1.0 || row.is_empty() {
            return Ok(());
        }
        row.sort_desc();
        row.softmax()?;
        let probs = row.probs().unwrap_or(&[]);
        let n = probs.len();
        let entropy: f32 = probs
            .iter()
            .filter(|&&p| p > 0.0)
            .map(|&p| -p * p.ln())
            .sum();
        let scores: Vec<f32> = probs.iter().map(|&p| (-p.ln() - entropy).abs()).collect();
        let mut order: Vec<usize> = (0..n).collect();
        // Stable sort: equal scores keep the canonical (sorted) order.
        order.sort_by(|&a, &b| {
            scores[a]
                .partial_cmp(&scores[b])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let mut cum = 0.0f32;
        let mut keep = n;
        for (i, &idx) in order.iter().enumerate() {
            cum += probs[idx];
            if cum > self.p && (self.min_keep == 0 || i + 1 >= self.min_keep) {
                keep = i + 1;
                break;
            }
        }
        order.truncate(keep);
        row.permute(&order);
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
