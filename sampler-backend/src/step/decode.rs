//! The readback decoded into each step row's [`Work`]: the host rows' raw
//! logits, a group's token codes, `k` candidates or full rows, and the
//! logprobs a device computed.

use burn_tensor::TensorData;
use sampler_core::plan::Readback;
use sampler_core::{Candidates, LogprobsMode, SampleError, TokenId};

use super::{StepLayout, Work};
use crate::BackendError;
use crate::batch::SamplingBatch;
use crate::batch::request::{Request, RequestId};
use crate::logprobs::DeviceRowLp;
use crate::readback::decode_error;

/// One step row's work and the logprobs its device computed.
pub(crate) type RowWork = (Work, Option<DeviceRowLp>);

impl SamplingBatch {
    /// Each step row's work from the readback `data` of a step laid out as
    /// `layout` over the requests `ids`; `raw` is the host rows' `[R, V]`
    /// logits (empty without host rows).
    pub(crate) fn decode_rows(
        &self,
        data: &[TensorData],
        layout: &StepLayout,
        ids: &[RequestId],
        select: bool,
    ) -> Result<Vec<Option<RowWork>>, BackendError> {
        let (b, v) = (ids.len(), self.vocab);
        let mut work: Vec<Option<RowWork>> = (0..b).map(|_| None).collect();
        for (j, &r) in layout.host_rows.iter().enumerate() {
            work[r] = Some((Work::Raw(j * v), None));
        }
        for run in &layout.groups {
            let key = &run.key;
            if let Some(k) = run.top {
                self.decode_top(data, run, k, &mut work)?;
                continue;
            }
            let mut next = run.at;
            let mut take = || {
                next += 1;
                &data[next - 1]
            };
            // Each registered tensor converted once per group.
            let main: Vec<&TensorData> = match key.readback {
                Readback::Candidates { .. } => vec![take(), take()],
                _ => vec![take()],
            };
            let ints = match key.readback {
                Readback::FullLogits { .. } => Vec::new(),
                _ => read_i64(main[0]),
            };
            let floats = match key.readback {
                Readback::TokenIds => &[][..],
                Readback::Candidates { .. } => as_f32(main[1])?,
                Readback::FullLogits { .. } => as_f32(main[0])?,
            };
            let lp = match key.logprobs.filter(|_| select) {
                Some((mode, n, m)) => {
                    let sampled = usize::from(key.readback == Readback::TokenIds);
                    let (lids, lvals) = if n + m + sampled > 0 {
                        (read_i64(take()), as_f32(take())?)
                    } else {
                        (Vec::new(), &[][..])
                    };
                    let cand = match (mode, key.readback) {
                        (LogprobsMode::Raw, Readback::Candidates { .. }) => Some(as_f32(take())?),
                        _ => None,
                    };
                    Some((n, m, lids, lvals, cand))
                }
                None => None,
            };
            let rows_n = run.rows.len().max(1);
            let k = ints.len() / rows_n;
            for (j, &r) in run.rows.iter().enumerate() {
                let req = &self.requests[&ids[r]];
                let w = match key.readback {
                    Readback::TokenIds => Work::Token(self.decode_token(ints[j])),
                    Readback::Candidates { .. } => {
                        let c = self.candidates_row(
                            req,
                            &ints[j * k..(j + 1) * k],
                            &floats[j * k..(j + 1) * k],
                        );
                        Work::Cands(c, req.plan.host_start)
                    }
                    Readback::FullLogits { .. } => {
                        let c = full_row(req, &floats[j * v..(j + 1) * v], v);
                        Work::Cands(c, req.plan.host_start)
                    }
                };
                let row_lp = lp.as_ref().map(|(n, m, lids, lvals, cand)| {
                    let e = lvals.len() / rows_n;
                    let (ri, rv) = (&lids[j * e..(j + 1) * e], &lvals[j * e..(j + 1) * e]);
                    let cand = cand.map(|c| {
                        ints[j * k..(j + 1) * k]
                            .iter()
                            .zip(&c[j * k..(j + 1) * k])
                            .map(|(&i, &l)| (i, l))
                            .collect()
                    });
                    DeviceRowLp::decode(ri, rv, *n, *m, v, cand)
                });
                work[r] = Some((w, row_lp));
            }
        }
        Ok(work)
    }

    /// A group's `top_logprobs(k)` computed on the device: `[R, k]` ids
    /// (an invalid row's first id its code), `[R, k]` logits, `[R, 1]`
    /// log-sum-exps; each row's finite entries as `(id, logit - lse)`.
    fn decode_top(
        &self,
        data: &[TensorData],
        run: &super::GroupRun,
        k: usize,
        work: &mut [Option<RowWork>],
    ) -> Result<(), BackendError> {
        let k = k.clamp(1, self.vocab);
        let tok = read_i64(&data[run.at]);
        let logits = as_f32(&data[run.at + 1])?;
        let lse = as_f32(&data[run.at + 2])?;
        for (j, &r) in run.rows.iter().enumerate() {
            let row_ids = &tok[j * k..(j + 1) * k];
            let row = &logits[j * k..(j + 1) * k];
            let w = match row_ids.first() {
                Some(&c) if c < 0 => Err(decode_error(c)),
                _ => top_entries(row_ids, row, lse[j], self.vocab),
            };
            work[r] = Some((Work::Top(w), None));
        }
        Ok(())
    }

    fn decode_token(&self, code: i64) -> Result<TokenId, SampleError> {
        if code < 0 {
            Err(decode_error(code))
        } else if (code as u64) < self.vocab as u64 {
            Ok(code as TokenId)
        } else {
            Err(SampleError::TokenOutOfRange {
                token: code.min(u32::MAX as i64) as u32,
                vocab: self.vocab,
            })
        }
    }

    fn candidates_row(
        &self,
        req: &Request,
        row_ids: &[i64],
        row_logits: &[f32],
    ) -> Result<Candidates, SampleError> {
        if let Some(&c) = row_ids.first()
            && c < 0
        {
            return Err(decode_error(c));
        }
        let keep = req.keep.min(row_ids.len());
        let mut ids = Vec::with_capacity(keep);
        let mut logits = Vec::with_capacity(keep);
        let drop = req.drop_masked && row_logits[..keep].iter().any(|l| l.is_finite());
        for (&id, &l) in row_ids[..keep].iter().zip(&row_logits[..keep]) {
            if id < 0 || id as u64 >= self.vocab as u64 {
                return Err(SampleError::Device(format!(
                    "device returned token id {id} outside the vocabulary"
                )));
            }
            if drop && l == f32::NEG_INFINITY {
                continue;
            }
            ids.push(id as TokenId);
            logits.push(l);
        }
        Candidates::from_parts(ids, logits, self.vocab)
    }
}

/// A full row read back after device stages (raw on invalid rows).
fn full_row(req: &Request, row: &[f32], vocab: usize) -> Result<Candidates, SampleError> {
    // Invalid rows come back raw: keep positions for the error index.
    let valid = row.iter().all(|l| !l.is_nan() && *l != f32::INFINITY);
    if req.drop_masked && valid && row.iter().any(|l| l.is_finite()) {
        let (ids, logits): (Vec<TokenId>, Vec<f32>) = row
            .iter()
            .enumerate()
            .filter(|(_, l)| **l != f32::NEG_INFINITY)
            .map(|(i, &l)| (i as TokenId, l))
            .unzip();
        return Candidates::from_parts(ids, logits, vocab);
    }
    Ok(Candidates::from_logits(row))
}

/// A row's top entries: finite logits only, logprob `logit - lse` (in
/// `f64`, as sampler-cpu's `top_logprobs`), canonical order (logit
/// descending, ties to the lowest id).
fn top_entries(
    ids: &[i64],
    logits: &[f32],
    lse: f32,
    vocab: usize,
) -> Result<Vec<(TokenId, f32)>, SampleError> {
    let mut out = Vec::with_capacity(ids.len());
    for (&id, &l) in ids.iter().zip(logits) {
        if !l.is_finite() {
            continue;
        }
        if id < 0 || id as u64 >= vocab as u64 {
            return Err(SampleError::Device(format!(
                "device returned token id {id} outside the vocabulary"
            )));
        }
        out.push((id as TokenId, l));
    }
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(out
        .into_iter()
        .map(|(t, l)| (t, (f64::from(l) - f64::from(lse)) as f32))
        .collect())
}

fn read_i64(d: &TensorData) -> Vec<i64> {
    d.iter::<i64>().collect()
}

pub(crate) fn as_f32(d: &TensorData) -> Result<&[f32], BackendError> {
    d.as_slice::<f32>().map_err(|e| {
        BackendError::Readback(format!(
            "expected f32 logits, the device returned {:?}: {e:?}",
            d.dtype()
        ))
    })
}
