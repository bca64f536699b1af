//! `top_k`: keep the `k` highest logits.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Keeps the `k` candidates with the highest logits, sorted descending (ties
/// by ascending token id, also at the boundary). Follows llama.cpp top-k:
/// `k <= 0` is a no-op (order unchanged, no work); `k` is clamped to the set
/// size (`k >= size` keeps all but still sorts). Uses selection, so the cost
/// is O(n + k log k), never a full sort when `k < n`.
#[derive(Debug, Clone, Copy)]
pub struct TopK {
    k: i64,
}

impl TopK {
    /// A top-k stage; `k <= 0` disables it.
    pub fn new(k: i64) -> Self {
        Self { k }
    }
}

impl Sampler for TopK {
    fn name(&self) -> &str {
        "top_k"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::TopK { k: self.k })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.k <= 0 || row.is_empty() {
            return Ok(());
        }
        let k = usize::try_from(self.k).unwrap_or(usize::MAX).min(row.len());
        row.top_k_sorted(k);
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
