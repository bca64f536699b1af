//! `eta` on the device, CPU semantics: `p = softmax(logits)`, entropy
//! `H = -sum p ln p` (nats), keep `p >= min(epsilon, sqrt(epsilon) * exp(-H))`
//! plus the `max(1, min_keep)` highest logits and their ties. Width
//! unchanged; dropped candidates become `-inf`. `epsilon <= 0` rows are no-ops.

use sampler_core::StageSpec;

use super::epsilon::{Cutoff, ProbCut};
use sampler_core::DeviceRefusal;

use crate::stage::{DeviceStage, InitContext, StepData};

/// Device eta sampling with per-row `epsilon` and `min_keep`.
#[derive(Debug)]
pub struct Eta(ProbCut);

impl Eta {
    /// From the per-row specs (`StageSpec::Eta`; other kinds are no-op rows).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let rows = specs
            .iter()
            .map(|s| match s {
                StageSpec::Eta { epsilon, min_keep } => (*epsilon, *min_keep),
                _ => (0.0, 0),
            })
            .collect();
        Self(ProbCut::new("eta", Cutoff::Eta, rows))
    }
}

impl DeviceStage for Eta {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        self.0.init(ctx)
    }
    fn apply(&self, data: &mut StepData) {
        self.0.apply(data);
    }
}
