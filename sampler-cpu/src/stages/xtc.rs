//! `xtc`: exclude top choices.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec, desc_cmp};

use crate::util::is_sorted_desc;

/// Exclude Top Choices (oobabooga text-generation-webui #6335) with llama.cpp
/// semantics. With chance `probability` per step (the row's contract-7
/// uniform `ctx.rng.uniform(0)` as f32; `chance > probability` is a no-op),
/// on sets of 2 or more: softmax (in the order the set comes in); the top
/// choices are the candidates of probability `>= threshold` (and `> 0`);
/// when there are two or more and at least `min_keep` candidates would
/// remain, every top choice but the least probable (the last in the
/// canonical order) is removed. The rest keep their order and their
/// probabilities (not renormalised); the set is marked sorted when that
/// order is the sorted one. No sort: O(n). `probability <= 0` or `threshold > 0.5` is a no-op.
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
        row.softmax()?;
        let (ids, logits) = (row.ids(), row.logits());
        let probs = row.probs().unwrap_or(&[]);
        // The top choices: probability >= threshold. A candidate of
        // probability 0 (a banned, `-inf` logit) never is one, even at
        // threshold 0: XTC keeps a drawable token.
        let top = |i: usize| probs[i] >= self.threshold && probs[i] > 0.0;
        let mut count = 0usize;
        let mut last: Option<usize> = None;
        for i in (0..probs.len()).filter(|&i| top(i)) {
            count += 1;
            // The least of them in the canonical order (lowest logit, ties
            // the highest id) stays.
            if last.is_none_or(|j| desc_cmp(logits[i], ids[i], logits[j], ids[j]).is_gt()) {
                last = Some(i);
            }
        }
        let Some(last) = last else { return Ok(()) };
        if count >= 2 && row.len() - (count - 1) >= self.min_keep {
            let keep: Vec<bool> = (0..probs.len()).map(|i| i == last || !top(i)).collect();
            row.retain_mask(&keep);
        }
        // llama.cpp's output is sorted; here it is marked so whenever the
        // order it kept is the sorted one.
        if !row.is_sorted() && is_sorted_desc(row.logits(), row.ids()) {
            row.set_sorted(true);
        }
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
