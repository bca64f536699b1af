//! Recipes shared by several device stages: the per-slot columns of a
//! filter with a `min_keep`, and the probability cutoff of `epsilon` and
//! `eta` (one recipe, two stage files).

use burn_tensor::{Bool, Int, Tensor};
use sampler_core::{DeviceRefusal, StageSpec};

use crate::ops::{self, wide};
use crate::stage::{DeviceStage, InitContext, StepData};

/// A filter with a `min_keep` (`top_p`, `min_p`, `typical`, `epsilon`,
/// `eta`): each slot's parameter and `min_keep` as given, and once
/// uploaded its columns `[S, 1]` (the parameter as the recipe takes it,
/// whether the slot is a no-op, `min_keep` clamped to `[1, width]`).
#[derive(Debug)]
pub(crate) struct KeepFilter {
    /// Each slot's parameter (`p`, `epsilon`) as given.
    pub(crate) values: Vec<f32>,
    keeps: Vec<usize>,
    cols: Option<(Tensor<2>, Tensor<2, Bool>, Tensor<2, Int>)>,
    /// The largest clamped `min_keep` (at least 1).
    pub(crate) keep_max: usize,
}

impl KeepFilter {
    /// From the per-slot specs: `pick` reads a spec's parameter and
    /// `min_keep`; a spec of another kind is a no-op slot with parameter
    /// `neutral`.
    pub(crate) fn new(
        specs: &[StageSpec],
        neutral: f32,
        pick: impl Fn(&StageSpec) -> Option<(f32, usize)>,
    ) -> Self {
        let (values, keeps) = specs
            .iter()
            .map(|s| pick(s).unwrap_or((neutral, 0)))
            .unzip();
        Self {
            values,
            keeps,
            cols: None,
            keep_max: 1,
        }
    }

    /// Upload each slot's `value` (as the recipe takes it) and `noop` flag.
    pub(crate) fn upload(&mut self, value: &[f32], noop: &[bool], ctx: &InitContext) {
        let n = ctx.width.max(1);
        let keep: Vec<i64> = self.keeps.iter().map(|&k| k.clamp(1, n) as i64).collect();
        self.keep_max = keep.iter().copied().max().unwrap_or(1) as usize;
        let d = &ctx.device;
        self.cols = Some((
            ops::col_f32(value, d),
            ops::col_bool(noop, d),
            ops::col_int(&keep, d),
        ));
    }

    /// The columns per step row `[B, 1]`: value, no-op, `min_keep`
    /// (`None` before `upload`).
    pub(crate) fn per_row(
        &self,
        data: &StepData,
    ) -> Option<(Tensor<2>, Tensor<2, Bool>, Tensor<2, Int>)> {
        let (value, noop, keep) = self.cols.as_ref()?;
        Some((
            data.per_row(value),
            data.per_row_bool(noop),
            data.per_row(keep),
        ))
    }
}

/// `values` with `fill` on no-op slots: the column a kernel takes.
pub(crate) fn or_fill(values: &[f32], noop: &[bool], fill: f32) -> Vec<f32> {
    values
        .iter()
        .zip(noop)
        .map(|(&v, &all)| if all { fill } else { v })
        .collect()
}

/// How the probability cutoff of a row is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cutoff {
    /// `epsilon` itself (epsilon sampling).
    Epsilon,
    /// `min(epsilon, sqrt(epsilon) * exp(-entropy))` (eta sampling).
    Eta,
}

/// The device recipe of `epsilon` and `eta` (the stage files name it):
/// per-row `epsilon` and `min_keep`, the cutoff rule from the rows' kind.
#[derive(Debug)]
pub struct ProbCut {
    name: &'static str,
    cutoff: Cutoff,
    filter: KeepFilter,
}

impl ProbCut {
    /// From the per-row specs (`StageSpec::Epsilon` or `StageSpec::Eta`,
    /// one kind per chain position; other kinds are no-op rows).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let eta = specs.iter().any(|s| matches!(s, StageSpec::Eta { .. }));
        let filter = KeepFilter::new(specs, 0.0, |s| match s {
            StageSpec::Epsilon { epsilon, min_keep } | StageSpec::Eta { epsilon, min_keep } => {
                Some((*epsilon, *min_keep))
            }
            _ => None,
        });
        let (name, cutoff) = if eta {
            ("eta", Cutoff::Eta)
        } else {
            ("epsilon", Cutoff::Epsilon)
        };
        Self {
            name,
            cutoff,
            filter,
        }
    }
}

impl DeviceStage for ProbCut {
    fn name(&self) -> &'static str {
        self.name
    }

    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let eps = &self.filter.values;
        let noop: Vec<bool> = eps.iter().map(|&e| e.is_nan() || e <= 0.0).collect();
        let eps: Vec<f32> = eps.iter().map(|&e| if e > 0.0 { e } else { 0.0 }).collect();
        self.filter.upload(&eps, &noop, ctx);
        ops::top_mask_allowed(self.filter.keep_max, ctx.width, &ctx.device)
    }

    fn apply(&self, data: &mut StepData) {
        let Some((eps, noop, keep_row)) = self.filter.per_row(data) else {
            return;
        };
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
        let kth = if self.filter.keep_max > 1 {
            let ids = data.token_ids();
            let top = ops::canonical_top_mask(&data.logits, &ids, keep_row, self.filter.keep_max);
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
