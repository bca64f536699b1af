//! `min_p` on the device: keep `l >= max + ln(p)` (inclusive, so `p = 1`
//! keeps the maximum: bug_cases §1 and §12), plus the canonical top
//! `max(1, min_keep)` candidates. Order and width are unchanged; dropped
//! candidates become `-inf`. `p <= 0` rows are no-ops.
//!
//! On a cubecl device with `min_keep <= 1` the step's fusion rules run one
//! kernel instead (`kernels::min_p`: the first maximum in canonical order,
//! then the mask; two reads of the row); on a full row they hand it on, so
//! that a following `[temperature] -> dist` draws through it in one kernel
//! (`kernels::cut_dist_full`, about two reads).

use burn_tensor::Tensor;
use sampler_core::StageSpec;

use sampler_core::DeviceRefusal;

use crate::ops::{self, wide};
use crate::recipes::{KeepFilter, or_fill};
use crate::stage::{CutRule, DeviceStage, Fusable, InitContext, StepData};

/// Device min-p with per-row `p` and `min_keep`.
#[derive(Debug)]
pub struct MinP {
    filter: KeepFilter,
    /// `ln p`, `-inf` on no-op rows: the kernels' column.
    log_p_or_all: Option<Tensor<2>>,
}

impl MinP {
    /// From the per-row specs (`StageSpec::MinP`).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let filter = KeepFilter::new(specs, 0.0, |s| match s {
            StageSpec::MinP { p, min_keep } => Some((*p, *min_keep)),
            _ => None,
        });
        Self {
            filter,
            log_p_or_all: None,
        }
    }
}

impl DeviceStage for MinP {
    fn name(&self) -> &'static str {
        "min_p"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let ps = &self.filter.values;
        let log_p: Vec<f32> = ps.iter().map(|&p| if p > 0.0 { p.ln() } else { 0.0 }).collect();
        let noop: Vec<bool> = ps.iter().map(|&p| p.is_nan() || p <= 0.0).collect();
        let log_p_or_all = or_fill(&log_p, &noop, f32::NEG_INFINITY);
        self.log_p_or_all = Some(ops::col_f32(&log_p_or_all, &ctx.device));
        self.filter.upload(&log_p, &noop, ctx);
        ops::top_mask_allowed(self.filter.keep_max, ctx.width, &ctx.device)
    }
    fn fusable(&self) -> Fusable<'_> {
        match &self.log_p_or_all {
            Some(column) => Fusable::Cut {
                rule: CutRule::MinP,
                column,
                keep_max: self.filter.keep_max,
            },
            None => Fusable::Alone,
        }
    }
    fn apply(&self, data: &mut StepData) {
        let Some((log_p, noop, keep_row)) = self.filter.per_row(data) else {
            return;
        };
        let keep_row = &keep_row;
        let n = data.width;
        let m = data.logits.clone().max_dim(1);
        let thr = m.add(log_p.clone());
        let mut keep = data
            .logits
            .clone()
            .greater_equal(wide(thr, n))
            .bool_or(wide(noop.clone(), n));
        if self.filter.keep_max > 1 {
            let ids = data.token_ids();
            let top = ops::canonical_top_mask(&data.logits, &ids, keep_row, self.filter.keep_max);
            keep = keep.bool_or(top);
        } else {
            // The first candidate in canonical order always survives
            // (min_keep 0 and 1 alike; `p > 1` keeps exactly one).
            let ids = data.token_ids();
            let best = ops::argmax_lowest_id(&data.logits, &ids);
            keep = keep.bool_or(ids.equal(wide(best, n)));
        }
        data.logits = ops::mask_logits(data.logits.clone(), keep);
    }
}
