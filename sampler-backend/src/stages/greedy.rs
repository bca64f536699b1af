//! `greedy` on the device: the maximum logit, ties to the lowest token id
//! (vLLM / TensorRT-LLM rule), mapped through `ids` after a
//! device `top_k` (llama.cpp returned the position instead: bug_cases §12).
//! On a cubecl device a full row goes through one custom kernel
//! ([`crate::kernels`]'s argmax, same rule).

use burn_tensor::Device;
use sampler_core::StageSpec;

use crate::ops;
use sampler_core::DeviceRefusal;

use crate::stage::{DeviceStage, InitContext, StepData};

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
    fn takes_unsanitised_rows(&self, batch: usize, width: usize, device: &Device) -> bool {
        kernel_applies(batch, width, device)
    }
    fn apply(&self, data: &mut StepData) {
        if let Some((tok, codes)) = kernel_argmax(data) {
            data.sampled = Some(tok);
            data.sampled_codes = codes;
            return;
        }
        let ids = data.token_ids();
        let (_, live) = ops::safe_max(&data.logits);
        let tok = ops::argmax_lowest_id(&data.logits, &ids);
        let tok = tok.mask_fill(live.bool_not(), crate::readback::CODE_ALL_MASKED);
        data.sampled = Some(tok.reshape([data.batch]));
    }
}

/// The argmax kernel on a cubecl device for a full-vocabulary row
/// (positions are token ids), and whether it wrote the rows' status codes
/// too. On unsanitised rows it writes the codes, from an earlier kernel's
/// validation keys or else from its own pass (whose keys it hands the
/// step). `None` elsewhere (the generic recipe).
#[cfg(feature = "cubecl-kernels")]
fn kernel_argmax(
    data: &mut StepData,
) -> Option<(burn_tensor::Tensor<1, burn_tensor::Int>, bool)> {
    use crate::kernels::TokenCodes;
    if data.ids.is_some() || data.order_ids.is_some() {
        return None;
    }
    let codes = match (&data.invalid, &data.first_bad) {
        (Some(_), _) => TokenCodes::Tokens,
        (None, Some(keys)) => TokenCodes::Keys(keys, data.vocab),
        (None, None) => TokenCodes::OwnKeys,
    };
    let wrote = !matches!(codes, TokenCodes::Tokens);
    let (tok, first_bad) = crate::kernels::argmax(&data.logits, codes)?;
    if data.invalid.is_none() && data.first_bad.is_none() {
        data.first_bad = Some(first_bad);
    }
    Some((tok, wrote))
}

#[cfg(feature = "cubecl-kernels")]
fn kernel_applies(b: usize, n: usize, device: &Device) -> bool {
    !crate::is_cpu_device(device) && crate::kernels::argmax_applies(b, n)
}

#[cfg(not(feature = "cubecl-kernels"))]
fn kernel_applies(_b: usize, _n: usize, _device: &Device) -> bool {
    false
}

#[cfg(not(feature = "cubecl-kernels"))]
fn kernel_argmax(
    _data: &mut StepData,
) -> Option<(burn_tensor::Tensor<1, burn_tensor::Int>, bool)> {
    None
}
