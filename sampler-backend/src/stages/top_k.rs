//! `top_k` on the device: a native `topk` at the batch's largest `k`, the
//! boundary ties resolved to the lowest token ids (CPU rule) by a second
//! `topk` over a tie key, and a per-row mask for rows with a smaller `k`.
//! `k` is clamped to the width (bug_cases §12: `top_k(10)` over 4 logits);
//! `k <= 0` rows keep everything (no-op). On a cubecl device a full row
//! goes through one custom kernel instead ([`crate::kernels`]'s top-k: the
//! same candidates in the same order), which also applies pending history
//! penalties ([`StepData::penalties`]) inside its selection.
//!
//! After this stage `ids [B, K]` maps positions to token ids and the width
//! is `K`; later stages look tokens up through it.

use burn_tensor::{Device, Int, Tensor};
use sampler_core::StageSpec;

use crate::ops;
use sampler_core::DeviceRefusal;

use crate::stage::{DeviceStage, HistoryPenalties, InitContext, StepData};
use crate::stages::penalties::apply_history_penalties;

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

/// The top-k kernel on a cubecl device, for a full-vocabulary row
/// (positions are token ids): `([B, k] logits, [B, k] ids, [B, k] order
/// ids)` with each row's slots past its own k as padding, as the recipe
/// leaves them; on unsanitised rows it also hands the step the rows'
/// validation keys from its first pass. `None` elsewhere (the generic
/// recipe).
fn kernel_top_k(
    data: &mut StepData,
    k_row: &Tensor<2, Int>,
    k: usize,
    penalties: Option<&HistoryPenalties>,
) -> Option<Selected> {
    if data.ids.is_some() || data.order_ids.is_some() {
        return None;
    }
    let (selected, first_bad) = kernel_select(&data.logits, k, k_row, data.vocab, penalties)?;
    // The input rows' validation: the first stage's (later stages see
    // rows an earlier kernel rewrote).
    if data.invalid.is_none() && data.first_bad.is_none() {
        data.first_bad = Some(first_bad);
    }
    Some(selected)
}

#[cfg(feature = "cubecl-kernels")]
fn kernel_applies(b: usize, n: usize, k: usize, device: &Device) -> bool {
    !crate::is_cpu_device(device) && crate::kernels::top_k_applies(b, n, k)
}

#[cfg(not(feature = "cubecl-kernels"))]
fn kernel_applies(_b: usize, _n: usize, _k: usize, _device: &Device) -> bool {
    false
}

/// `(logits, ids, order ids)` of the selected candidates, `[B, k]` each.
type Selected = (Tensor<2>, Tensor<2, Int>, Tensor<2, Int>);

#[cfg(feature = "cubecl-kernels")]
fn kernel_select(
    logits: &Tensor<2>,
    k: usize,
    k_row: &Tensor<2, Int>,
    vocab: usize,
    penalties: Option<&HistoryPenalties>,
) -> Option<(Selected, Tensor<2, Int>)> {
    let t = crate::kernels::top_k(logits, k, k_row, vocab, penalties)?;
    Some(((t.logits, t.positions, t.order_ids), t.first_bad))
}

#[cfg(not(feature = "cubecl-kernels"))]
fn kernel_select(
    _logits: &Tensor<2>,
    _k: usize,
    _k_row: &Tensor<2, Int>,
    _vocab: usize,
    _penalties: Option<&HistoryPenalties>,
) -> Option<(Selected, Tensor<2, Int>)> {
    None
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
        // applied first, the kernel then runs without it: see `apply`).
        let k = self.out_width(ctx.width);
        if ctx.has_ids || !kernel_applies(ctx.batch, ctx.width, k, &ctx.device) {
            ops::generic_topk_allowed(k, &ctx.device)?;
        }
        Ok(())
    }
    fn out_width(&self, width: usize) -> usize {
        self.k_max.min(width).max(1)
    }
    fn takes_unsanitised_rows(&self, batch: usize, width: usize, device: &Device) -> bool {
        kernel_applies(batch, width, self.out_width(width), device)
    }
    fn applies_penalties(&self) -> bool {
        true
    }
    fn apply(&self, data: &mut StepData) {
        let Some(k_row) = &self.k_row else { return };
        let k_row = &data.per_row(k_row);
        let k = self.out_width(data.width);
        let penalties = data.penalties.take();
        let mut selected = kernel_top_k(data, k_row, k, penalties.as_ref());
        if selected.is_none() && penalties.is_some() {
            // A history beyond the fused kernel's: penalise the rows first,
            // then the kernel without penalties (the same selection).
            data.penalties = penalties;
            apply_history_penalties(data);
            selected = kernel_top_k(data, k_row, k, None);
        }
        let (vals, index, order) = match selected {
            // Positions are token ids here: the kernel's ties to the lowest
            // position are ties to the lowest id. Penalties, if any, were
            // applied inside the kernel's selection or before it.
            Some(selected) => selected,
            None => {
                apply_history_penalties(data);
                // Padding (past the row's own k) ranks after every real candidate.
                let pad =
                    ops::positions(data.batch, k, &data.device).add_scalar(data.vocab as i64);
                let order = data.token_ids();
                let (vals, pos, live) =
                    ops::canonical_topk_positions(&data.logits, &order, k_row, k);
                let index = match &data.ids {
                    Some(ids) => ids.clone().gather(1, pos.clone()),
                    None => pos.clone(),
                };
                (
                    vals,
                    index,
                    order.gather(1, pos).mask_where(live.bool_not(), pad),
                )
            }
        };
        data.logits = vals;
        data.ids = Some(index);
        data.order_ids = Some(order);
        data.probs = None;
        data.width = k;
    }
}
