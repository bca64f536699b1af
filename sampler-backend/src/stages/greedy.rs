//! `greedy` on the device: the maximum logit, ties to the lowest token id
//! (vLLM / TensorRT-LLM rule), mapped through `ids` after a
//! device `top_k` (llama.cpp returned the position instead: bug_cases §12).
//! On a cubecl device the step's fusion rules run a full row through one
//! custom kernel instead ([`crate::kernels::argmax`], same rule).

use sampler_core::{DeviceRefusal, StageSpec};

use crate::ops;
use crate::stage::{DeviceStage, Fusable, InitContext, StepData};

/// Device greedy selection. All-`-inf` rows report `AllMasked`, like the CPU.
#[derive(Debug, Default)]
pub struct Greedy;

impl Greedy {
    /// A greedy stage (no parameters).
    pub fn new(_stage_index: usize, _specs: &[StageSpec]) -> Self {
        Self
    }
}

impl DeviceStage for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }
    fn init(&mut self, _ctx: &InitContext) -> Result<(), DeviceRefusal> {
        Ok(())
    }
    fn fusable(&self) -> Fusable<'_> {
        Fusable::Greedy
    }
    fn apply(&self, data: &mut StepData) {
        let ids = data.token_ids();
        let (_, live) = ops::safe_max(&data.logits);
        let tok = ops::argmax_lowest_id(&data.logits, &ids);
        let tok = tok.mask_fill(live.bool_not(), crate::readback::CODE_ALL_MASKED);
        data.sampled = Some(tok.reshape([data.batch]));
    }
}
