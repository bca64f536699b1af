//! `top_k` on the device: a native `topk` at the batch's largest `k`, the
//! boundary ties resolved to the lowest token ids (CPU rule) by a second
//! `topk` over a tie key, and a per-row mask for rows with a smaller `k`.
//! `k` is clamped to the width (bug_cases §12: `top_k(10)` over 4 logits);
//! `k <= 0` rows keep everything (no-op). On a cubecl device a full row
//! goes through one custom kernel instead ([`crate::kernels::top_k`]: the
//! same candidates in the same order), which also applies the history
//! penalties of a `penalties` stage before it inside its selection (the
//! step's fusion rules decide).
//!
//! After this stage `ids [B, K]` maps positions to token ids and the width
//! is `K`; later stages look tokens up through it.

use burn_tensor::{Int, Tensor};
use sampler_core::StageSpec;

use sampler_core::DeviceRefusal;

use crate::stage::{DeviceStage, Fusable, InitContext, StepData};
use crate::{kernels, ops};

/// Device top-k with per-row `k`.
#[derive(Debug)]
pub struct TopK {
    ks: Vec<i64>,
    k_max: usize,
    k_row: Option<Tensor<2, Int>>,
}

impl TopK {
    /// From the per-row specs (`StageSpec::TopK`).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let ks = specs
            .iter()
            .map(|s| match s {
                StageSpec::TopK { k } => *k,
                _ => 0,
            })
            .collect();
        Self {
            ks,
            k_max: 0,
            k_row: None,
        }
    }

    /// The effective `k` of each row at width `n` (`k <= 0` keeps all).
    pub fn effective_k(&self, n: usize) -> Vec<usize> {
        self.ks
            .iter()
            .map(|&k| {
                if k <= 0 {
                    n
                } else {
                    (k as u64).min(n as u64) as usize
                }
            })
            .collect()
    }
}

impl DeviceStage for TopK {
    fn name(&self) -> &'static str {
        "top_k"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let eff = self.effective_k(ctx.width);
        self.k_max = eff.iter().copied().max().unwrap_or(0).max(1);
        let v: Vec<i64> = eff.iter().map(|&k| k as i64).collect();
        self.k_row = Some(ops::col_int(&v, &ctx.device));
        if ctx.width == 0 {
            return Err(DeviceRefusal::EmptyWidth);
        }
        // Without the custom kernel the selection is burn's generic top-k,
        // bounded on a GPU (a penalties history too long for the kernel is
        // applied first, the kernel then runs without it).
        let k = self.out_width(ctx.width);
        let kernel = !crate::is_cpu_device(&ctx.device)
            && kernels::top_k_applies(ctx.batch, ctx.width, k);
        if ctx.has_ids || !kernel {
            ops::generic_topk_allowed(k, &ctx.device)?;
        }
        Ok(())
    }
    fn out_width(&self, width: usize) -> usize {
        self.k_max.min(width).max(1)
    }
    fn fusable(&self) -> Fusable<'_> {
        match &self.k_row {
            Some(k_row) => Fusable::TopK {
                k_row,
                k_max: self.k_max,
            },
            None => Fusable::Alone,
        }
    }
    fn apply(&self, data: &mut StepData) {
        let Some(k_row) = &self.k_row else { return };
        let k_row = &data.per_row(k_row);
        let k = self.out_width(data.width);
        // Padding (past the row's own k) ranks after every real candidate.
        let pad = ops::positions(data.batch, k, &data.device).add_scalar(data.vocab as i64);
        let order = data.token_ids();
        let (vals, pos, live) = ops::canonical_topk_positions(&data.logits, &order, k_row, k);
        let index = match &data.ids {
            Some(ids) => ids.clone().gather(1, pos.clone()),
            None => pos.clone(),
        };
        data.logits = vals;
        data.ids = Some(index);
        data.order_ids = Some(order.gather(1, pos).mask_where(live.bool_not(), pad));
        data.width = k;
    }
}
