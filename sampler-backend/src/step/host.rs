//! The second half of a step: wait for the readback, decode it
//! ([`super::decode`]), run every row's host suffix on its own chain (in
//! parallel), and record the tokens in the requests and their groups'
//! device state.

use rayon::prelude::*;
use sampler_core::{Candidates, Logprobs, SampleError, TokenOrigin};

use super::decode::{RowWork, as_f32};
use super::{RowResult, StepLayout, StepRows, Work};
use crate::BackendError;
use crate::batch::pending::{InFlight, PendingStep, foreign};
use crate::batch::request::Request;
use crate::batch::{BatchFilter, BatchStep, BatchTopLogprobs, SamplingBatch};
use crate::logprobs::DeviceRowLp;

/// A row's host result: what it produced and its logprobs.
type HostResult = Result<(RowResult, Option<Logprobs>), SampleError>;

impl SamplingBatch {
    /// [`SamplingBatch::finish`]: the step's tokens (a row whose chain
    /// only filters fails with [`SampleError::NoSelectingStage`]).
    pub(crate) fn finish_step(&mut self, pending: PendingStep) -> Result<BatchStep, BackendError> {
        let out = self.finish_inner(pending)?;
        let tokens = out
            .rows
            .into_iter()
            .map(|r| match r {
                Ok(RowResult::Token(t)) => Ok(t),
                Ok(RowResult::Cands(_) | RowResult::Top(_)) => Err(SampleError::NoSelectingStage),
                Err(e) => Err(e),
            })
            .collect();
        Ok(BatchStep {
            tokens,
            logprobs: out.logprobs,
            bytes_read: out.bytes_read,
        })
    }

    /// [`SamplingBatch::filter`]'s second half: each row's candidates (a
    /// token a device selected counts as one candidate).
    pub(crate) fn finish_filter(
        &mut self,
        pending: PendingStep,
    ) -> Result<BatchFilter, BackendError> {
        let out = self.finish_inner(pending)?;
        let vocab = self.vocab;
        let rows = out
            .rows
            .into_iter()
            .map(|r| match r {
                Ok(RowResult::Cands(c)) => Ok(c),
                Ok(RowResult::Token(t)) => Candidates::from_parts(vec![t], vec![0.0], vocab),
                Ok(RowResult::Top(t)) => {
                    let (ids, logprobs) = t.into_iter().unzip();
                    Candidates::from_parts(ids, logprobs, vocab)
                }
                Err(e) => Err(e),
            })
            .collect();
        Ok(BatchFilter {
            rows,
            bytes_read: out.bytes_read,
        })
    }

    /// The second half of [`SamplingBatch::top_logprobs`].
    pub(crate) fn finish_top(
        &mut self,
        pending: PendingStep,
        k: usize,
    ) -> Result<BatchTopLogprobs, BackendError> {
        let out = self.finish_inner(pending)?;
        let rows = out
            .rows
            .into_iter()
            .map(|r| match r {
                Ok(RowResult::Top(t)) => Ok(t),
                Ok(RowResult::Cands(c)) => Ok(sampler_cpu::beam::top_logprobs(
                    c.logits(),
                    Some(c.ids()),
                    k,
                )),
                Ok(RowResult::Token(t)) => Ok(vec![(t, 0.0)]),
                Err(e) => Err(e),
            })
            .collect();
        Ok(BatchTopLogprobs {
            rows,
            bytes_read: out.bytes_read,
        })
    }

    /// Wait for a submitted step's readback, run the host parts and record
    /// the tokens.
    fn finish_inner(&mut self, pending: PendingStep) -> Result<StepRows, BackendError> {
        if self.in_flight.as_ref().map(|m| m.serial) != Some(pending.serial) {
            return Err(foreign(pending));
        }
        let ids = pending.ids.clone();
        let mut out = self.finish_rows(pending);
        // A mask holds for one step, whatever happened in it.
        self.end_step(&ids);
        // A failed constraint's rows were masked whole: its error, not
        // "all masked".
        // A constrained row that "all masked" hit: say why.
        if let Ok(out) = &mut out {
            for (row, id) in out.rows.iter_mut().zip(&ids) {
                let Some(c) = self.requests.get(id).and_then(|r| r.constraint.as_ref()) else {
                    continue;
                };
                match (row, c.failure()) {
                    (Err(e), Some(fail)) => *e = SampleError::Constraint(fail.clone()),
                    (Err(e @ SampleError::AllMasked), None) => {
                        *e = SampleError::Constraint(sampler_core::ConstraintError {
                            kind: "mask",
                            message: "no token is allowed both by the structured output and by the chain's other stages (a `min_tokens` that bans the end of a complete output, a `logit_bias` that bans what the grammar allows, a truncation before the `mask` stage)".into(),
                        });
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// The decoding and host half of `finish_inner`.
    fn finish_rows(&mut self, mut pending: PendingStep) -> Result<StepRows, BackendError> {
        let select = pending.select;
        let top = pending.top;
        let ids = std::mem::take(&mut pending.ids);
        let row_of = std::mem::take(&mut pending.row_of);
        let layout = std::mem::take(&mut pending.layout);
        let Some(readback) = pending.readback.take() else {
            return Ok(StepRows::default());
        };
        let data = match readback {
            InFlight::Done(done) => done,
            InFlight::Waiting(f) => futures_lite::future::block_on(f),
        }
        .map_err(|e| BackendError::Readback(format!("{e:?}")))?;
        let bytes_read = data.iter().map(|x| x.as_bytes().len()).sum();
        let (b, v) = (ids.len(), self.vocab);
        let work = self.decode_rows(&data, &layout, &ids, select)?;
        let raw: &[f32] = if layout.host_rows.is_empty() {
            &[]
        } else {
            as_f32(&data[0])?
        };

        // The host part of every row, in parallel; each request's own chain.
        let mut reqs: Vec<(usize, &mut Request)> = self
            .requests
            .iter_mut()
            .filter_map(|(id, req)| row_of.get(id).map(|&r| (r, req)))
            .collect();
        reqs.sort_unstable_by_key(|(r, _)| *r);
        let host = |req: &mut Request, w: Option<RowWork>| {
            let (w, lp) = w.expect("every row has work");
            let res = run_host(req, w, lp, raw, v, select).map(|(row, lp)| match (top, row) {
                // `top_logprobs` where the host ran the chain: select here.
                (Some(k), RowResult::Cands(c)) => (
                    RowResult::Top(sampler_cpu::beam::top_logprobs(
                        c.logits(),
                        Some(c.ids()),
                        k,
                    )),
                    lp,
                ),
                (Some(_), RowResult::Token(t)) => (RowResult::Top(vec![(t, 0.0)]), lp),
                (_, row) => (row, lp),
            });
            if select && let Ok((RowResult::Token(t), _)) = &res {
                if let Some(c) = &mut req.constraint {
                    c.accept(&[*t]);
                }
                req.outputs.push(*t);
                req.history.push((*t, TokenOrigin::Output));
            }
            res
        };
        // One row: no thread pool round trip (a few microseconds).
        let results: Vec<HostResult> = if reqs.len() == 1 {
            reqs.iter_mut()
                .zip(work)
                .map(|((_, req), w)| host(req, w))
                .collect()
        } else {
            reqs.par_iter_mut()
                .zip(work.into_par_iter())
                .map(|((_, req), w)| host(req, w))
                .collect()
        };
        if select {
            self.accept_on_device(&layout, &results);
        }
        // A mask holds for one step.
        for (_, req) in self
            .requests
            .iter_mut()
            .filter(|(id, _)| row_of.contains_key(id))
        {
            req.chain.set_token_mask(None);
        }
        let mut rows = Vec::with_capacity(b);
        let mut logprobs = Vec::with_capacity(b);
        for r in results {
            match r {
                Ok((row, lp)) => {
                    rows.push(Ok(row));
                    logprobs.push(lp);
                }
                Err(e) => {
                    rows.push(Err(e));
                    logprobs.push(None);
                }
            }
        }
        Ok(StepRows {
            rows,
            logprobs,
            bytes_read,
        })
    }

    /// Device state records each group's tokens, per slot.
    fn accept_on_device(&mut self, layout: &StepLayout, results: &[HostResult]) {
        for run in &layout.groups {
            let Some(g) = self.groups.get_mut(&run.key) else {
                continue;
            };
            let Some(stages) = &mut g.stages else {
                // Rebuilt before the next step, from the histories.
                continue;
            };
            let mut per_slot = vec![None; g.members.len()];
            for (&r, &s) in run.rows.iter().zip(&run.slots) {
                if let Ok((RowResult::Token(t), _)) = results[r] {
                    per_slot[s as usize] = Some(t);
                }
            }
            for st in stages.iter_mut().filter(|st| st.needs_history()) {
                st.accept(&per_slot);
            }
        }
    }
}

fn run_host(
    req: &mut Request,
    work: Work,
    device_lp: Option<DeviceRowLp>,
    raw: &[f32],
    vocab: usize,
    select: bool,
) -> Result<(RowResult, Option<Logprobs>), SampleError> {
    // A chain that cannot select fails before its row is looked at (the
    // CPU's `Chain::sample` order: the request's error, then the row's).
    if select && !req.chain.selects() {
        return Err(SampleError::NoSelectingStage);
    }
    let spec = if select {
        req.spec.logprobs.as_ref()
    } else {
        None
    };
    match (work, select) {
        (Work::Raw(off), true) => {
            let row = &raw[off..off + vocab];
            match spec {
                Some(lp) => req
                    .chain
                    .sample_logprobs(row, lp)
                    .map(|(t, l)| (RowResult::Token(t), Some(l))),
                None => sampler_cpu::fast::sample_row(row, &mut req.chain)
                    .map(|t| (RowResult::Token(t), None)),
            }
        }
        (Work::Raw(off), false) => {
            sampler_cpu::fast::apply_row(&raw[off..off + vocab], &mut req.chain)
                .map(|c| (RowResult::Cands(c), None))
        }
        (Work::Token(t), true) => {
            let t = t?;
            req.chain.commit(t);
            let lp = spec.zip(device_lp).map(|(s, d)| d.into_logprobs(s, t));
            Ok((RowResult::Token(t), lp))
        }
        (Work::Token(t), false) => t.map(|t| (RowResult::Token(t), None)),
        (Work::Cands(c, start), true) => {
            let mut c = all_masked_first(req, c?, start)?;
            match (spec, device_lp) {
                // Raw logprobs from the device: the host only picks the token.
                (Some(s), Some(d)) => {
                    let t = req.chain.sample_from(start, &mut c)?;
                    Ok((RowResult::Token(t), Some(d.into_logprobs(s, t))))
                }
                // Processed logprobs: the host's final candidate set.
                (Some(s), None) => {
                    if !req.chain.selects() {
                        return Err(SampleError::NoSelectingStage);
                    }
                    c.validate()?;
                    let (t, lp) = req.chain.finish_logprobs(start, &mut c, s)?;
                    Ok((RowResult::Token(t), Some(lp)))
                }
                (None, _) => req
                    .chain
                    .sample_from(start, &mut c)
                    .map(|t| (RowResult::Token(t), None)),
            }
        }
        (Work::Cands(c, start), false) => {
            let mut c = all_masked_first(req, c?, start)?;
            req.chain.apply_from(start, &mut c)?;
            Ok((RowResult::Cands(c), None))
        }
        // Only a `top_logprobs` step reads tops back, and never selects.
        (Work::Top(t), _) => t.map(|t| (RowResult::Top(t), None)),
    }
}

/// A row without a finite candidate after a device prefix that holds a
/// stage rejecting such a row on the CPU (`top_p`, `typical`:
/// [`sampler_core::StageSpec::rejects_all_masked`]) fails there, with
/// `AllMasked`, before any host stage's own error. Exact because the planner
/// runs no banning stage on the device after a masking one when the chain
/// goes on on the host (`BansAfterMask`): a row that reaches the host
/// without a finite logit had none when the first such stage saw it.
fn all_masked_first(req: &Request, c: Candidates, start: usize) -> Result<Candidates, SampleError> {
    let rejects = req.spec.stages[..start.min(req.spec.stages.len())]
        .iter()
        .any(sampler_core::StageSpec::rejects_all_masked);
    if rejects && c.logits().iter().all(|&l| l == f32::NEG_INFINITY) {
        return Err(SampleError::AllMasked);
    }
    Ok(c)
}
