//! `typical` (locally typical sampling, Meister et al. 2022) on the device,
//! the CPU's llama.cpp semantics: `p = softmax(logits)` over the current
//! candidates, entropy `H = -sum p ln p` (over `p > 0`), score
//! `|-ln p - H|`; in ascending score (ties in the canonical order: logit
//! descending, then ascending id) keep every candidate whose probability
//! mass *before* it is `<= p` (the shortest prefix whose mass exceeds `p`),
//! and at least the first `min_keep`. `p >= 1` rows are no-ops. Width
//! unchanged; dropped candidates become `-inf` (the CPU also reorders the
//! survivors by score; every later stage orders candidates itself).
//!
//! The rank and mass before each candidate come from pairwise `[B, N, N]`
//! comparisons, so the device takes rows of at most
//! [`PAIRWISE_MAX`](crate::ops::PAIRWISE_MAX) candidates (after a device
//! `top_k`, as in llama.cpp's default chain); on wider rows `init` refuses
//! ([`DeviceRefusal::PairwiseTooWide`]) and the stage runs on the host.
//!
//! Sums run in f32 in another order than the CPU's (f64 softmax sum,
//! sequential entropy and mass): a candidate can differ only when its mass
//! before lies within rounding of `p`, or two scores within rounding of
//! each other; the equivalence tests report such rows as ties.

use burn_tensor::{Bool, Int, Tensor};
use sampler_core::{DeviceRefusal, StageSpec};

use crate::ops::{self, PAIRWISE_MAX, wide};
use crate::stage::{DeviceStage, InitContext, StepData};

/// Device typical sampling with per-row `p` and `min_keep`.
#[derive(Debug)]
pub struct Typical {
    ps: Vec<f32>,
    keeps: Vec<usize>,
    p: Option<Tensor<2>>,
    noop: Option<Tensor<2, Bool>>,
    keep_row: Option<Tensor<2, Int>>,
}

impl Typical {
    /// From the per-row specs (`StageSpec::Typical`; other kinds are no-op rows).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let (ps, keeps) = specs
            .iter()
            .map(|s| match s {
                StageSpec::Typical { p, min_keep } => (*p, *min_keep),
                _ => (1.0, 0),
            })
            .unzip();
        Self {
            ps,
            keeps,
            p: None,
            noop: None,
            keep_row: None,
        }
    }
}

impl DeviceStage for Typical {
    fn name(&self) -> &'static str {
        "typical"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        if ctx.width > PAIRWISE_MAX {
            return Err(DeviceRefusal::PairwiseTooWide {
                width: ctx.width,
                limit: PAIRWISE_MAX,
            });
        }
        let d = &ctx.device;
        let noop: Vec<bool> = self.ps.iter().map(|&p| p >= 1.0).collect();
        let keep: Vec<i64> = self.keeps.iter().map(|&k| k.max(1) as i64).collect();
        self.p = Some(ops::col_f32(&self.ps, d));
        self.noop = Some(ops::col_bool(&noop, d));
        self.keep_row = Some(ops::col_int(&keep, d));
        Ok(())
    }
    fn apply(&self, data: &mut StepData) {
        let (Some(p), Some(noop), Some(keep_row)) = (&self.p, &self.noop, &self.keep_row) else {
            return;
        };
        let (p, noop, keep_row) = (
            data.per_row(p),
            data.per_row_bool(noop),
            data.per_row(keep_row),
        );
        let [b, n] = data.logits.dims();
        let (e, _) = ops::exps(&data.logits);
        let sum = e.clone().sum_dim(1).clamp_min(f32::MIN_POSITIVE);
        let probs = e.div(wide(sum, n));
        let live = probs.clone().greater_elem(0.0);
        let plogp = probs
            .clone()
            .mul(probs.clone().clamp_min(f32::MIN_POSITIVE).log())
            .mask_fill(live.clone().bool_not(), 0.0);
        let entropy = plogp.sum_dim(1).neg();
        // `-ln 0 = +inf`: candidates without mass rank last.
        let score = probs
            .clone()
            .log()
            .neg()
            .sub(wide(entropy, n))
            .abs()
            .mask_fill(live.bool_not(), f32::INFINITY);
        // j before i: a lower score, or an equal score and j first in the
        // canonical order.
        let canonical = ops::before_pairwise(&data.logits, &data.token_ids());
        let si = score.clone().reshape([b, n, 1]).expand([b, n, n]);
        let sj = score.reshape([b, 1, n]).expand([b, n, n]);
        let before = sj
            .clone()
            .lower(si.clone())
            .bool_or(sj.equal(si).bool_and(canonical));
        let rank = before.clone().int().sum_dim(2).reshape([b, n]);
        let mass = probs
            .reshape([b, 1, n])
            .expand([b, n, n])
            .mask_fill(before.bool_not(), 0.0)
            .sum_dim(2)
            .reshape([b, n]);
        let keep = mass
            .lower_equal(wide(p, n))
            .bool_or(rank.lower(wide(keep_row, n)))
            .bool_or(wide(noop, n));
        data.logits = ops::mask_logits(data.logits.clone(), keep);
    }
}
