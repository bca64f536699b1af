//! `epsilon` on the device, CPU semantics: `p = softmax(logits)` over the
//! current candidates, keep `p >= epsilon`, plus the `max(1, min_keep)`
//! highest logits and every candidate tied with the last of them (Hugging
//! Face's `topk` threshold). Width unchanged; dropped candidates become
//! `-inf`. `epsilon <= 0` rows are no-ops.

use burn_tensor::{Bool, Int, Tensor};
use sampler_core::StageSpec;

use crate::ops::{self, wide};
use sampler_core::DeviceRefusal;

use crate::stage::{DeviceStage, InitContext, StepData};

/// How the probability cutoff of a row is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cutoff {
    /// `epsilon` itself (epsilon sampling).
    Epsilon,
    /// `min(epsilon, sqrt(epsilon) * exp(-entropy))` (eta sampling).
    Eta,
}

/// The device recipe shared by [`Epsilon`] and [`Eta`](super::eta::Eta).
#[derive(Debug)]
pub(crate) struct ProbCut {
    name: &'static str,
    cutoff: Cutoff,
    eps: Vec<f32>,
    keeps: Vec<usize>,
    eps_t: Option<Tensor<2>>,
    noop: Option<Tensor<2, Bool>>,
    keep_row: Option<Tensor<2, Int>>,
    keep_max: usize,
}

impl ProbCut {
    pub(crate) fn new(name: &'static str, cutoff: Cutoff, rows: Vec<(f32, usize)>) -> Self {
        let (eps, keeps) = rows.into_iter().unzip();
        Self {
            name,
            cutoff,
            eps,
            keeps,
            eps_t: None,
            noop: None,
            keep_row: None,
            keep_max: 1,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let n = ctx.width.max(1);
        let noop: Vec<bool> = self.eps.iter().map(|&e| e.is_nan() || e <= 0.0).collect();
        let eps: Vec<f32> = self
            .eps
            .iter()
            .map(|&e| if e > 0.0 { e } else { 0.0 })
            .collect();
        let keep: Vec<i64> = self.keeps.iter().map(|&k| k.clamp(1, n) as i64).collect();
        self.keep_max = keep.iter().copied().max().unwrap_or(1) as usize;
        self.eps_t = Some(ops::col_f32(&eps, &ctx.device));
        self.noop = Some(ops::col_bool(&noop, &ctx.device));
        self.keep_row = Some(ops::col_int(&keep, &ctx.device));
        ops::top_mask_allowed(self.keep_max, ctx.width, &ctx.device)
    }

    pub(crate) fn apply(&self, data: &mut StepData) {
        let (Some(eps), Some(noop), Some(keep_row)) = (&self.eps_t, &self.noop, &self.keep_row)
        else {
            return;
        };
        let (eps, noop, keep_row) = (
            data.per_row(eps),
            data.per_row_bool(noop),
            data.per_row(keep_row),
        );
        let keep_row = &keep_row;
        let n = data.width;
        let (e, _) = ops::exps(&data.logits);
        let sum = e.clone().sum_dim(1);
        let p = e.div(wide(sum, n));
        let cut = match self.cutoff {
            Cutoff::Epsilon => eps.clone(),
            Cutoff::Eta => {
                let zero = p.clone().equal_elem(0.0);
                let plogp = p.clone().log().mul(p.clone()).mask_fill(zero, 0.0);
                let entropy = plogp.sum_dim(1).neg();
                let eta = eps.clone().sqrt().mul(entropy.neg().exp());
                eta.min_pair(eps.clone())
            }
        };
        let mut keep = p.greater_equal(wide(cut, n)).bool_or(wide(noop.clone(), n));
        // The k-th largest logit (k = max(1, min_keep)): every candidate at or
        // above it survives, ties included.
        let kth = if self.keep_max > 1 {
            let ids = data.token_ids();
            let top = ops::canonical_top_mask(&data.logits, &ids, keep_row, self.keep_max);
            data.logits
                .clone()
                .mask_fill(top.bool_not(), f32::INFINITY)
                .min_dim(1)
        } else {
            data.logits.clone().max_dim(1)
        };
        keep = keep.bool_or(data.logits.clone().greater_equal(wide(kth, n)));
        data.logits = ops::mask_logits(data.logits.clone(), keep);
    }
}

/// Device epsilon sampling with per-row `epsilon` and `min_keep`.
#[derive(Debug)]
pub struct Epsilon(ProbCut);

impl Epsilon {
    /// From the per-row specs (`StageSpec::Epsilon`; other kinds are no-op rows).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let rows = specs
            .iter()
            .map(|s| match s {
                StageSpec::Epsilon { epsilon, min_keep } => (*epsilon, *min_keep),
                _ => (0.0, 0),
            })
            .collect();
        Self(ProbCut::new("epsilon", Cutoff::Epsilon, rows))
    }
}

impl DeviceStage for Epsilon {
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
