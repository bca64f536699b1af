//! `mask` on the device: each step uploads the step rows' allowed-token
//! bitmasks as one `[B, ceil(V / 32)]` int tensor (`u32` words as their
//! `i32` bit patterns; rows without a mask get all bits set) and bans what
//! they do not allow, looking tokens up through `ids` after a device
//! `top_k`: token `id` is allowed when bit `id % 32` of word `id / 32` is
//! set. A step where no row has a mask uploads and runs nothing.

use burn_tensor::{Int, Tensor, TensorData};
use sampler_core::{DeviceRefusal, StageSpec};

use crate::ops;
use crate::stage::{DeviceStage, InitContext, RowState, StepData};

/// Device token masks, per step row.
#[derive(Debug, Default)]
pub struct Mask {
    vocab: usize,
    device: Option<burn_tensor::Device>,
    words: Option<Tensor<2, Int>>,
}

impl Mask {
    /// From the per-row specs (`StageSpec::Mask`; it has no parameters).
    pub fn new(_stage_index: usize, _specs: &[StageSpec]) -> Self {
        Self::default()
    }
}

impl DeviceStage for Mask {
    fn name(&self) -> &'static str {
        "mask"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        self.vocab = ctx.vocab;
        self.device = Some(ctx.device.clone());
        Ok(())
    }
    fn set_input(&mut self, rows: &[RowState]) {
        let w = self.vocab.div_ceil(32);
        self.words = None;
        let Some(d) = &self.device else { return };
        if rows.iter().all(|r| r.mask.is_none()) {
            return;
        }
        let mut words = Vec::with_capacity(rows.len() * w);
        for r in rows {
            match &r.mask {
                // The batch checked the length when the mask was set.
                Some(m) if m.len() == w => words.extend(m.iter().map(|&x| x as i32)),
                _ => words.extend(std::iter::repeat_n(-1i32, w)),
            }
        }
        self.words = Some(Tensor::<2, Int>::from_data(
            TensorData::new(words, [rows.len(), w]),
            d,
        ));
    }
    fn apply(&self, data: &mut StepData) {
        let Some(words) = &self.words else { return };
        let tok = match &data.ids {
            Some(ids) => ids.clone(),
            None => ops::positions(data.batch, data.width, &data.device),
        };
        let word = words.clone().gather(1, tok.clone().div_scalar(32));
        let bit = tok.remainder_scalar(32);
        let allowed = word.bitwise_right_shift(bit).bitwise_and_scalar(1).equal_elem(1);
        data.logits = ops::mask_logits(data.logits.clone(), allowed);
    }
}
