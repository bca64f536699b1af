//! `temperature` on the device, with llama.cpp's dynamic-temperature
//! extension. Per-row `t`; rows whose (dynamic) temperature is below
//! `GREEDY_TEMPERATURE` use the argmax rule (the argmax, lowest id among
//! equal maxima, keeps its logit; every other candidate gets `-inf`): a
//! sentinel temperature never passes through the arithmetic, so greedy rows
//! in a mixed batch stay NaN-free (bug_cases §13).
//!
//! Dynamic temperature (`dynatemp_range > 0`): `H = -sum p ln p` over the
//! current candidates, `H_max = ln(n)` with `n` the number of *finite*
//! candidates (masked `-inf` entries do not count, unlike llama.cpp's device
//! path; the ratio is clamped to `[0, 1]`), `t_dyn = t_min + (t_max - t_min) (H / H_max)^exponent`; rows with
//! `n <= 1` are left unchanged.

use burn_tensor::{Bool, Tensor};
use sampler_core::{GREEDY_TEMPERATURE, StageSpec};

use sampler_core::DeviceRefusal;

use crate::ops::{self, wide};
use crate::stage::{DeviceStage, Fusable, InitContext, StepData};

#[derive(Debug, Clone, Copy)]
struct Params {
    t: f32,
    range: f32,
    exponent: f32,
}

/// Device temperature with per-row parameters.
#[derive(Debug)]
pub struct Temperature {
    rows: Vec<Params>,
    t: Option<Tensor<2>>,
    t_min: Option<Tensor<2>>,
    t_span: Option<Tensor<2>>,
    exponent: Option<Tensor<2>>,
    dynamic: Option<Tensor<2, Bool>>,
    any_dynamic: bool,
}

impl Temperature {
    /// From the per-row specs (`StageSpec::Temperature`).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let rows = specs
            .iter()
            .map(|s| match s {
                StageSpec::Temperature {
                    t,
                    dynatemp_range,
                    dynatemp_exponent,
                } => Params {
                    t: *t,
                    range: *dynatemp_range,
                    exponent: *dynatemp_exponent,
                },
                _ => Params {
                    t: 1.0,
                    range: 0.0,
                    exponent: 1.0,
                },
            })
            .collect();
        Self {
            rows,
            t: None,
            t_min: None,
            t_span: None,
            exponent: None,
            dynamic: None,
            any_dynamic: false,
        }
    }
}

impl DeviceStage for Temperature {
    fn name(&self) -> &'static str {
        "temperature"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let d = &ctx.device;
        let dynamic: Vec<bool> = self.rows.iter().map(|r| r.range > 0.0).collect();
        self.any_dynamic = dynamic.iter().any(|&x| x);
        let t: Vec<f32> = self.rows.iter().map(|r| r.t).collect();
        let t_min: Vec<f32> = self.rows.iter().map(|r| (r.t - r.range).max(0.0)).collect();
        let t_span: Vec<f32> = self
            .rows
            .iter()
            .map(|r| (r.t + r.range) - (r.t - r.range).max(0.0))
            .collect();
        let ex: Vec<f32> = self.rows.iter().map(|r| r.exponent).collect();
        self.t = Some(ops::col_f32(&t, d));
        self.t_min = Some(ops::col_f32(&t_min, d));
        self.t_span = Some(ops::col_f32(&t_span, d));
        self.exponent = Some(ops::col_f32(&ex, d));
        self.dynamic = Some(ops::col_bool(&dynamic, d));
        Ok(())
    }
    fn fusable(&self) -> Fusable<'_> {
        match &self.t {
            Some(t) => Fusable::Temperature {
                t,
                dynamic: self.any_dynamic,
            },
            None => Fusable::Alone,
        }
    }
    fn apply(&self, data: &mut StepData) {
        let (Some(t), Some(t_min), Some(t_span), Some(ex), Some(dynamic)) = (
            &self.t,
            &self.t_min,
            &self.t_span,
            &self.exponent,
            &self.dynamic,
        ) else {
            return;
        };
        let (t, t_min, t_span, ex, dynamic) = (
            &data.per_row(t),
            &data.per_row(t_min),
            &data.per_row(t_span),
            &data.per_row(ex),
            &data.per_row_bool(dynamic),
        );
        if !self.any_dynamic {
            scale_rows(data, t);
            return;
        }
        let n = data.width;
        let l = data.logits.clone();
        // `unchanged`: dynamic rows with at most one finite candidate.
        let (t_eff, unchanged) = if self.any_dynamic {
            let (e, _) = ops::exps(&l);
            let s = e.clone().sum_dim(1).clamp_min(f32::MIN_POSITIVE);
            let p = e.div(wide(s, n));
            let pos = p.clone().greater_elem(0.0);
            let plogp = p
                .clone()
                .mul(p.clamp_min(f32::MIN_POSITIVE).log())
                .mask_fill(pos.bool_not(), 0.0);
            let h = plogp.sum_dim(1).neg();
            let count = l.clone().is_finite().int().sum_dim(1).float();
            let few = count.clone().lower_equal_elem(1.0);
            let h_max = count.clamp_min(2.0).log();
            let ratio = h.div(h_max).clamp(0.0, 1.0);
            // `0^0 = 1` explicitly (powf may compute exp(0 * ln 0) = NaN).
            let pow = ratio
                .powf(ex.clone())
                .mask_fill(ex.clone().equal_elem(0.0), 1.0);
            let t_dyn = t_min.clone().add(t_span.clone().mul(pow));
            // As on the CPU: a dynamic temperature that overflows (inf, or
            // inf * 0 = NaN for huge ranges) falls back to `t`.
            let t_dyn = t_dyn
                .clone()
                .mask_where(t_dyn.is_finite().bool_not(), t.clone());
            let t_eff = t.clone().mask_where(dynamic.clone(), t_dyn);
            (t_eff, dynamic.clone().bool_and(few))
        } else {
            (
                t.clone(),
                ops::col_bool(&vec![false; data.batch], &data.device),
            )
        };
        let greedy = t_eff
            .clone()
            .lower_elem(GREEDY_TEMPERATURE)
            .bool_and(unchanged.clone().bool_not());
        let safe_t = t_eff
            .mask_fill(greedy.clone(), 1.0)
            .mask_fill(unchanged, 1.0);
        divide_or_argmax(data, &safe_t, greedy);
    }
}

/// Temperature without a dynamic range, `t` `[B, 1]` per step row: `l / t`
/// saturated at `±f32::MAX` (`-inf` kept), or on rows with `t` below
/// [`GREEDY_TEMPERATURE`] only the lowest id among the maxima kept. The
/// kernel on a cubecl device, the generic recipe elsewhere.
pub(crate) fn scale_rows(data: &mut StepData, t: &Tensor<2>) {
    let l = data.logits.clone();
    let ids = data.order_ids.as_ref().or(data.ids.as_ref());
    if let Some(out) = crate::kernels::temperature(&l, ids, t, GREEDY_TEMPERATURE) {
        data.logits = out;
        return;
    }
    let greedy = t.clone().lower_elem(GREEDY_TEMPERATURE);
    let safe_t = t.clone().mask_fill(greedy.clone(), 1.0);
    divide_or_argmax(data, &safe_t, greedy);
}

/// `l / t` per row `[B, 1]`, saturated like the CPU (a finite logit never
/// becomes `±inf`, `-inf` kept), or on `greedy` rows only the lowest id
/// among the maxima kept.
fn divide_or_argmax(data: &mut StepData, t: &Tensor<2>, greedy: Tensor<2, Bool>) {
    let (l, n) = (data.logits.clone(), data.width);
    let scaled = l
        .clone()
        .div(wide(t.clone(), n))
        .clamp(-f32::MAX, f32::MAX)
        .mask_fill(l.clone().equal_elem(f32::NEG_INFINITY), f32::NEG_INFINITY);
    let ids = data.token_ids();
    let best = ops::argmax_lowest_id(&l, &ids);
    let argmax_only = ops::mask_logits(l, ids.equal(wide(best, n)));
    data.logits = scaled.mask_where(wide(greedy, n), argmax_only);
}
