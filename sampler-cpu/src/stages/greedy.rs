//! `greedy`: select the maximum logit.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Selects the candidate with the highest logit; among equal maxima the
/// lowest token id (vLLM / TensorRT-LLM convention; llama.cpp takes the first
/// in array order, which is the same for a vocabulary-order row). Does not
/// compute probabilities and does not change the set.
///
/// # Errors
/// [`SampleError::EmptyRow`] on an empty set; [`SampleError::AllMasked`] when
/// every logit is `-inf` (llama.cpp would pick index 0).
#[derive(Debug, Clone, Copy, Default)]
pub struct Greedy;

impl Greedy {
    /// The stage (it has no parameters).
    pub fn new() -> Self {
        Self
    }
}

impl Sampler for Greedy {
    fn name(&self) -> &str {
        "greedy"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Greedy)
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        // Sorted sets were ordered by an earlier stage of a validated row;
        // anything else is checked in the same pass (NaN / +inf are errors).
        let best = if row.is_sorted() {
            row.argmax().ok_or(SampleError::EmptyRow)?
        } else {
            row.checked_argmax()?
        };
        if row.logits()[best] == f32::NEG_INFINITY {
            return Err(SampleError::AllMasked);
        }
        row.select(best);
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
