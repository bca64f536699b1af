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
//! [`PAIRWISE_MAX`] candidates (after a device
//! `top_k`, as in llama.cpp's default chain); on wider rows `init` refuses
//! ([`DeviceRefusal::PairwiseTooWide`]) and the stage runs on the host.
//!
//! Sums run in f32 in another order than the CPU's (f64 softmax and
//! entropy sums, the surprise from the logit, a sequential f32 mass): a
//! candidate can differ only when its mass
//! before lies within rounding of `p`, or two scores within rounding of
//! each other; the equivalence tests report such rows as ties.

use sampler_core::{DeviceRefusal, StageSpec};

use crate::ops::{self, PAIRWISE_MAX, wide};
use crate::recipes::KeepFilter;
use crate::stage::{DeviceStage, InitContext, StepData};

/// Device typical sampling with per-row `p` and `min_keep`.
#[derive(Debug)]
pub struct Typical {
    filter: KeepFilter,
}

impl Typical {
    /// From the per-row specs (`StageSpec::Typical`; other kinds are no-op rows).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let filter = KeepFilter::new(specs, 1.0, |s| match s {
            StageSpec::Typical { p, min_keep } => Some((*p, *min_keep)),
            _ => None,
        });
        Self { filter }
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
        let p = self.filter.values.clone();
        let noop: Vec<bool> = p.iter().map(|&p| p >= 1.0).collect();
        self.filter.upload(&p, &noop, ctx);
        Ok(())
    }
    fn apply(&self, data: &mut StepData) {
        let Some((p, noop, keep_row)) = self.filter.per_row(data) else {
            return;
        };
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
