//! One group's device pass over its step rows: row validation, the device
//! stages in order (with the fusion rules of [`crate::fusion`]), the
//! tensors the readback registers, and the device logprobs.

use burn_tensor::{Int, IntDType, Tensor};
use sampler_core::plan::Readback;

use super::Out;
use crate::fusion::{self, Fusion};
use crate::kernels;
use crate::logprobs::{DeviceLogprobs, LogprobPass};
use crate::ops::{self, wide};
use crate::stage::{DeviceStage, RowState, StepData};

/// One group's device pass over its rows: validation, the stages (through
/// the fusion rules), the outputs its readback registers (`[B]` codes, or
/// `[B, K]` ids and logits, or `[B, V]` logits; with `top = Some(k)` and a
/// full-row readback, `[B, k]` ids, `[B, k]` logits and `[B, 1]`
/// log-sum-exps instead of the rows), then, with logprobs,
/// `[B, L]` ids and values (and for `raw` logprobs with a candidates
/// readback the candidates' `[B, K]` raw logprobs).
pub(crate) fn device_pass(
    stages: &mut [Box<dyn DeviceStage>],
    logits: Tensor<2>,
    slots: Option<Tensor<1, Int>>,
    rows: &[RowState],
    readback: Readback,
    top: Option<usize>,
    lp: Option<DeviceLogprobs>,
) -> Vec<Out> {
    let device = logits.device();
    let d = &device;
    let [b, v] = logits.dims();
    // Row validation in one reduction: the key is 2i at a NaN, 2i + 1 at a
    // +inf and 2V elsewhere, so the row minimum m is the first bad position
    // (m / 2) and its kind (m % 2), and the status code is -m - 2 (NaN at i:
    // -2i - 2, +inf at i: -2i - 3; a valid row's code is never read).
    let pos = ops::positions(b, v, d);
    let none = 2 * v as i64;
    let validate = |logits: &Tensor<2>| {
        kernels::first_bad(logits).unwrap_or_else(|| {
            let nan = logits.clone().is_nan();
            let posinf = logits
                .clone()
                .is_inf()
                .bool_and(logits.clone().greater_elem(0.0));
            let pos2 = pos.clone().mul_scalar(2);
            pos2.clone()
                .add_scalar(1)
                .mask_fill(posinf.bool_not(), none)
                .mask_where(nan, pos2)
                .min_dim(1)
        })
    };
    // Invalid rows are zeroed for the stages, unless the fusion rules let
    // the first stage take them as they are (a kernel that validates them
    // in its own pass and whose invalid rows' outputs are replaced by their
    // codes below): then no validation pass and no `[B, V]` copy here.
    let unsanitised = lp.is_none() && fusion::takes_unsanitised(stages, b, v, d);
    let (validated, clean) = if unsanitised {
        (None, logits.clone())
    } else {
        let first_bad = validate(&logits);
        let invalid = first_bad.clone().lower_elem(none);
        let clean = logits.clone().mask_fill(wide(invalid.clone(), v), 0.0);
        (Some((first_bad, invalid)), clean)
    };
    let mut lp = lp.map(|spec| LogprobPass::start(spec, &clean, &pos));
    let mut fusion = Fusion::new(validated.as_ref().map(|(_, invalid)| invalid.clone()));
    let mut data = StepData {
        logits: clean,
        ids: None,
        order_ids: None,
        sampled: None,
        slots,
        batch: b,
        vocab: v,
        width: v,
        device: d.clone(),
    };
    // Processed logprobs: the candidates entering the (device) selecting stage.
    let see_selection = lp
        .as_ref()
        .is_some_and(|l| l.wants_selection(readback == Readback::TokenIds));
    let last = stages.len().saturating_sub(1);
    for (i, st) in stages.iter_mut().enumerate() {
        if st.needs_step_input() {
            st.set_input(rows);
        }
        fusion.before(st.as_ref(), &mut data);
        if see_selection && i == last {
            // The candidates the draw sees: a pending cut applied.
            fusion.settle(&mut data);
            if let Some(lp) = &mut lp {
                lp.see_selection(&data);
            }
        }
        fusion.apply(st.as_ref(), &mut data);
    }
    // A cut or penalties last in the device prefix: the host suffix and
    // the readback get them applied.
    fusion.settle(&mut data);
    if let Some(lp) = &mut lp {
        lp.after_stages(&pos, v);
    }
    // The validation keys: from before the stages, from the first stage's
    // own pass, or (a first stage that did not validate) from the input now.
    let (first_bad, checked) = match (validated, fusion.first_bad.take()) {
        (Some((first_bad, invalid)), _) => (first_bad, Some(invalid)),
        (None, found) => (found.unwrap_or_else(|| validate(&logits)), None),
    };
    // The invalid mask and the status codes `[B, 1]`, built only where a
    // readback needs them (the codes kernel writes token codes directly).
    let masks = || {
        let invalid = match &checked {
            Some(invalid) => invalid.clone(),
            None => first_bad.clone().lower_elem(none),
        };
        (invalid, first_bad.clone().neg().sub_scalar(2))
    };
    // `[B, K]` ids as `[B * K]` i32, an invalid row's first id its code.
    let coded_ids = |ids: Tensor<2, Int>| -> Tensor<1, Int> {
        let [_, k] = ids.dims();
        let (invalid, code) = masks();
        let first = ops::positions(b, k, d)
            .equal_elem(0)
            .bool_and(wide(invalid, k));
        let ids: Tensor<2, Int> = ids.mask_where(first, wide(code, k)).cast(IntDType::I32);
        ids.reshape([b * k])
    };
    let mut out = Vec::with_capacity(5);
    match readback {
        Readback::TokenIds => {
            let sampled = data
                .sampled
                .unwrap_or_else(|| Tensor::<1, Int>::zeros([b], d).sub_scalar(1));
            if let Some(lp) = &mut lp {
                lp.sampled(&sampled, &pos, v);
            }
            let written = fusion.sampled_codes.then(|| sampled.clone());
            let codes = written.or_else(|| kernels::token_codes(&sampled, &first_bad, v));
            let codes = codes.unwrap_or_else(|| {
                let (invalid, code) = masks();
                sampled
                    .reshape([b, 1])
                    .mask_where(invalid, code)
                    .cast(IntDType::I32)
                    .reshape([b])
            });
            out.push(Out::I(codes));
        }
        Readback::Candidates { .. } => {
            let k = data.width;
            let ids = data.ids.unwrap_or_else(|| ops::positions(b, k, d));
            if let Some(lp) = &mut lp {
                lp.candidates(&ids);
            }
            out.push(Out::I(coded_ids(ids)));
            out.push(Out::F(data.logits));
        }
        Readback::FullLogits { .. } if top.is_some() => {
            // `top_logprobs(k)`: the canonical top `k` of the processed row
            // and its log-sum-exp; an invalid row's first id is its code.
            let k = top.unwrap_or(1).clamp(1, v);
            let row = data.logits;
            let row_ids = data.ids.unwrap_or_else(|| pos.clone());
            let (e, m) = ops::exps(&row);
            let lse = e.sum_dim(1).log().add(m);
            let k_col = Tensor::<2, Int>::full([b, 1], k as i64, d);
            let (vals, ids) = ops::canonical_topk(&row, &row_ids, &k_col, k);
            out.push(Out::I(coded_ids(ids)));
            out.push(Out::F(vals));
            out.push(Out::F(lse));
        }
        Readback::FullLogits { .. } => {
            let (invalid, _) = masks();
            out.push(Out::F(data.logits.mask_where(wide(invalid, v), logits)));
        }
    }
    if let Some(lp) = lp {
        out.extend(lp.outputs());
    }
    out
}
