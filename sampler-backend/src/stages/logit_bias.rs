//! `logit_bias` on the device: per-row `(token, bias)` pairs (bias may be
//! `-inf` to ban), applied **by token id**: after a device `top_k` the bias
//! is looked up through `ids` (llama.cpp biased raw positions or aborted:
//! bug_cases §12). Duplicate entries for one token are summed in listed order and
//! added once with the CPU stage's rule (`sampler_core::numerics::add_bias`:
//! a `-inf` bans, `+inf + -inf` included; finite sums saturate); a logit
//! that reaches `+inf` saturates to `f32::MAX` like the CPU. Ids outside the vocabulary make
//! `init` refuse, so the host reports the row's error.
//!
//! The per-row biases are expanded once, in `init`, into a dense `[B, V]`
//! tensor (one upload; `4 B V` bytes of device memory).

use burn_tensor::{Tensor, TensorData};
use sampler_core::{StageSpec, TokenId};

use sampler_core::DeviceRefusal;

use crate::stage::{DeviceStage, InitContext, StepData};

/// Device logit bias with per-row entries.
#[derive(Debug)]
pub struct LogitBias {
    rows: Vec<Vec<(TokenId, f32)>>,
    dense: Option<Tensor<2>>,
}

impl LogitBias {
    /// From the per-row specs (`StageSpec::LogitBias`).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let rows = specs
            .iter()
            .map(|s| match s {
                StageSpec::LogitBias { bias } => bias.clone(),
                _ => Vec::new(),
            })
            .collect();
        Self { rows, dense: None }
    }
}

impl DeviceStage for LogitBias {
    fn name(&self) -> &'static str {
        "logit_bias"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let (b, v) = (ctx.batch, ctx.vocab);
        // Dense bias up to 2^26 entries (256 MiB); larger batches keep the
        // stage on the host.
        const LIMIT: usize = 1 << 26;
        let Some(len) = b.checked_mul(v).filter(|&n| n <= LIMIT) else {
            return Err(DeviceRefusal::TooLarge {
                entries: (b as u64).saturating_mul(v as u64),
                limit: LIMIT as u64,
            });
        };
        // Out-of-vocabulary tokens are a per-row error on the CPU: leave
        // this stage (and what follows) to the host so the row reports it.
        for (row, biases) in self.rows.iter().enumerate() {
            if let Some(&(token, _)) = biases.iter().find(|&&(t, _)| t as usize >= v) {
                return Err(DeviceRefusal::TokenOutOfVocab {
                    row,
                    token,
                    vocab: v,
                });
            }
        }
        let mut dense = vec![0f32; len];
        for (r, row) in self.rows.iter().enumerate().take(b) {
            for &(t, x) in row {
                if (t as usize) < v {
                    let at = &mut dense[r * v + t as usize];
                    *at = sampler_core::numerics::add_bias(*at, x);
                }
            }
        }
        self.dense = Some(Tensor::<2>::from_data(
            TensorData::new(dense, [b, v]),
            &ctx.device,
        ));
        Ok(())
    }
    fn apply(&self, data: &mut StepData) {
        let Some(dense) = &self.dense else { return };
        let dense = &data.per_row(dense);
        let bias = match &data.ids {
            Some(ids) => dense.clone().gather(1, ids.clone()),
            None => dense.clone(),
        };
        data.logits = data.logits.clone().add(bias).clamp_max(f32::MAX);
    }
}
