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

use burn_tensor::{Bool, Int, Tensor};
use sampler_core::StageSpec;

use sampler_core::DeviceRefusal;

use crate::ops::{self, wide};
use crate::stage::{DeviceStage, Fusable, InitContext, StepData};

/// Device min-p with per-row `p` and `min_keep`.
#[derive(Debug)]
pub struct MinP {
    ps: Vec<f32>,
    keeps: Vec<usize>,
    log_p: Option<Tensor<2>>,
    noop: Option<Tensor<2, Bool>>,
    keep_row: Option<Tensor<2, Int>>,
    keep_max: usize,
    /// `ln p`, `-inf` on no-op rows: the kernels' column.
    log_p_or_all: Option<Tensor<2>>,
}

impl MinP {
    /// From the per-row specs (`StageSpec::MinP`).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let mut ps = Vec::new();
        let mut keeps = Vec::new();
        for s in specs {
            let (p, k) = match s {
                StageSpec::MinP { p, min_keep } => (*p, *min_keep),
                _ => (0.0, 0),
            };
            ps.push(p);
            keeps.push(k);
        }
        Self {
            ps,
            keeps,
            log_p: None,
            noop: None,
            keep_row: None,
            keep_max: 1,
            log_p_or_all: None,
        }
    }
}

impl DeviceStage for MinP {
    fn name(&self) -> &'static str {
        "min_p"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let n = ctx.width.max(1);
        let log_p: Vec<f32> = self
            .ps
            .iter()
            .map(|&p| if p > 0.0 { p.ln() } else { 0.0 })
            .collect();
        let noop: Vec<bool> = self.ps.iter().map(|&p| p.is_nan() || p <= 0.0).collect();
        let keep: Vec<i64> = self.keeps.iter().map(|&k| k.clamp(1, n) as i64).collect();
        self.keep_max = keep.iter().copied().max().unwrap_or(1) as usize;
        let log_p_or_all: Vec<f32> = log_p
            .iter()
            .zip(&noop)
            .map(|(&l, &all)| if all { f32::NEG_INFINITY } else { l })
            .collect();
        self.log_p_or_all = Some(ops::col_f32(&log_p_or_all, &ctx.device));
        self.log_p = Some(ops::col_f32(&log_p, &ctx.device));
        self.noop = Some(ops::col_bool(&noop, &ctx.device));
        self.keep_row = Some(ops::col_int(&keep, &ctx.device));
        ops::top_mask_allowed(self.keep_max, ctx.width, &ctx.device)
    }
    fn fusable(&self) -> Fusable<'_> {
        match &self.log_p_or_all {
            Some(log_p) => Fusable::MinP {
                log_p,
                keep_max: self.keep_max,
            },
            None => Fusable::Alone,
        }
    }
    fn apply(&self, data: &mut StepData) {
        let (Some(log_p), Some(noop), Some(keep_row)) = (&self.log_p, &self.noop, &self.keep_row)
        else {
            return;
        };
        let (log_p, noop, keep_row) = (
            data.per_row(log_p),
            data.per_row_bool(noop),
            data.per_row(keep_row),
        );
        let keep_row = &keep_row;
        let n = data.width;
        let m = data.logits.clone().max_dim(1);
        let thr = m.add(log_p.clone());
        let mut keep = data
            .logits
            .clone()
            .greater_equal(wide(thr, n))
            .bool_or(wide(noop.clone(), n));
        if self.keep_max > 1 {
            let ids = data.token_ids();
            let top = ops::canonical_top_mask(&data.logits, &ids, keep_row, self.keep_max);
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
