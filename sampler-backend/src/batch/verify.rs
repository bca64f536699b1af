//! Speculative decoding in the serving batch: each request's draft tokens
//! verified against its `k + 1` target rows through its own chain
//! ([`sampler_cpu::speculative`] holds the rule), the emitted tokens
//! recorded as plain steps would record them.

use std::sync::Arc;

use burn_tensor::{DType, FloatDType, Tensor, Transaction};
use sampler_core::{SampleError, TokenId};
use sampler_cpu::speculative::Verified;

use super::SamplingBatch;
use super::pending::{InFlight, NEXT_SERIAL, PendingStep, Readback_, foreign};
use super::request::RequestId;
use crate::BackendError;
use crate::step::StepLayout;
use crate::step::decode::as_f32;

/// One request's drafts in [`SamplingBatch::verify`].
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// The request.
    pub id: RequestId,
    /// Its draft tokens `d_1..d_k` (`k` may be 0: a plain step).
    pub tokens: Vec<TokenId>,
    /// The draft model's distributions `[k, vocab]` (probabilities), or
    /// `None` for drafts without one (n-gram / prompt lookup: one-hot).
    pub probs: Option<Vec<f32>>,
}

/// What [`SamplingBatch::verify`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchVerify {
    /// Per request, in the order given: the emitted tokens (`1..=k + 1`),
    /// the drafts accepted and the logprobs its spec asks for, or why it
    /// could not be verified (nothing recorded; other requests unaffected).
    pub results: Vec<Result<Verified, SampleError>>,
    /// Bytes read back: the whole `[sum(k + 1), vocab]` logits (this first
    /// implementation verifies on the host).
    pub bytes_read: usize,
}

/// A pipelined verification in flight: returned by
/// [`SamplingBatch::submit_verify`], consumed by
/// [`SamplingBatch::finish_verify`]. Dropping it gives the verification up
/// (nothing recorded), as dropping a [`PendingStep`] does.
#[derive(Debug)]
pub struct PendingVerify {
    step: PendingStep,
    drafts: Vec<Draft>,
}

impl SamplingBatch {
    /// Verify each request's drafts against its target rows: `logits`
    /// `[sum over requests of (k_r + 1), vocab]`, the requests' rows one
    /// after the other in the order given (request `r`'s row `i` is the
    /// target model's logits at the position of its draft `i`, the last one
    /// after its last draft). Row `i` runs through the request's chain as if
    /// the drafts before it had been emitted; a draft is accepted with
    /// probability `min(1, p/q)`, the first rejection emits a token drawn
    /// from the residual `max(0, p - q)`, and when every draft is accepted a
    /// bonus token is sampled from the last row (Leviathan et al. 2023; vLLM
    /// V1's rejection sampler). Greedy chains emit exactly what plain greedy
    /// steps emit. The emitted tokens are recorded as that many plain steps
    /// (outputs, history, the chain's state and step counter); a mask set
    /// with [`SamplingBatch::set_mask`] holds for this call's rows.
    /// `verify` = [`SamplingBatch::submit_verify`] +
    /// [`SamplingBatch::finish_verify`].
    ///
    /// This first implementation reads the rows back and verifies on the
    /// host (sampler-cpu), on every device: `4 · vocab` bytes per row.
    ///
    /// # Errors
    /// For the whole call: [`BackendError::Shape`] (rows other than
    /// `sum(k_r + 1)` or another vocabulary), [`BackendError::WrongDevice`],
    /// [`BackendError::UnknownRequest`], [`BackendError::DuplicateRow`] (a
    /// request named twice), [`BackendError::StepPending`],
    /// [`BackendError::Readback`]. Per request (an `Err` entry): more than
    /// [`MAX_DRAFT_TOKENS`](sampler_cpu::speculative::MAX_DRAFT_TOKENS) drafts,
    /// draft ids outside the vocabulary, draft distributions that are not
    /// `[k, vocab]` distributions or give a draft probability 0, a chain that
    /// does not end in `dist` or `greedy`, the rows' and stages' errors.
    pub fn verify(
        &mut self,
        drafts: &[Draft],
        logits: Tensor<2>,
    ) -> Result<BatchVerify, BackendError> {
        let pending = self.submit_verify(drafts, logits)?;
        self.finish_verify(pending)
    }

    /// The first half of a pipelined [`SamplingBatch::verify`]: check the
    /// call and start the rows' readback without waiting for it, so that
    /// the host can queue the next forward pass; until
    /// [`SamplingBatch::finish_verify`] the batch refuses the calls a
    /// submitted step refuses ([`BackendError::StepPending`]).
    ///
    /// # Errors
    /// As [`SamplingBatch::verify`] for the whole call.
    pub fn submit_verify(
        &mut self,
        drafts: &[Draft],
        logits: Tensor<2>,
    ) -> Result<PendingVerify, BackendError> {
        self.idle("submit_verify")?;
        let rows: usize = drafts.iter().map(|d| d.tokens.len() + 1).sum();
        let ids: Vec<RequestId> = drafts.iter().map(|d| d.id).collect();
        let row_of = self.check_step(&ids, rows, &logits)?;
        let mut step = PendingStep {
            serial: NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            alive: Arc::new(()),
            select: true,
            top: None,
            ids,
            row_of,
            layout: StepLayout::default(),
            readback: None,
        };
        if rows > 0 {
            let logits = if logits.dtype() == DType::F32 {
                logits
            } else {
                logits.cast(FloatDType::F32)
            };
            let mut readback: Readback_ =
                Box::pin(Transaction::default().register(logits).execute_async());
            step.readback = Some(
                match futures_lite::future::block_on(futures_lite::future::poll_once(&mut readback))
                {
                    Some(done) => InFlight::Done(done),
                    None => InFlight::Waiting(readback),
                },
            );
        }
        // A mask holds for this verification's rows and is used up by it,
        // whatever happens to it (as a step's).
        for d in drafts {
            let req = self.requests.get_mut(&d.id).expect("checked above");
            if let Some(mask) = req.mask.take() {
                req.chain.set_token_mask(Some(mask));
            }
        }
        self.in_flight = Some(step.mark());
        Ok(PendingVerify {
            step,
            drafts: drafts.to_vec(),
        })
    }

    /// The second half of a pipelined verification: wait for the rows,
    /// verify each request's drafts and record the emitted tokens (the same
    /// result as [`SamplingBatch::verify`]).
    ///
    /// # Errors
    /// [`BackendError::ForeignStep`] for a verification submitted to another
    /// batch (its step comes back inside the error; give it up with
    /// [`SamplingBatch::cancel`] on its own batch, or drop it);
    /// [`BackendError::Readback`]. Per request as [`SamplingBatch::verify`].
    pub fn finish_verify(&mut self, pending: PendingVerify) -> Result<BatchVerify, BackendError> {
        let PendingVerify { mut step, drafts } = pending;
        if self.in_flight.as_ref().map(|m| m.serial) != Some(step.serial) {
            return Err(foreign(step));
        }
        let ids = std::mem::take(&mut step.ids);
        let out = self.verify_rows(&mut step, &drafts);
        self.end_step(&ids);
        out
    }

    /// Wait for the rows and verify on the host, request by request.
    fn verify_rows(
        &mut self,
        step: &mut PendingStep,
        drafts: &[Draft],
    ) -> Result<BatchVerify, BackendError> {
        let Some(readback) = step.readback.take() else {
            return Ok(BatchVerify {
                results: Vec::new(),
                bytes_read: 0,
            });
        };
        let data = match readback {
            InFlight::Done(done) => done,
            InFlight::Waiting(f) => futures_lite::future::block_on(f),
        }
        .map_err(|e| BackendError::Readback(format!("{e:?}")))?;
        let first = data
            .first()
            .ok_or_else(|| BackendError::Readback("no rows came back".into()))?;
        let rows = as_f32(first)?;
        let v = self.vocab;
        let mut at = 0;
        let mut results = Vec::with_capacity(drafts.len());
        for d in drafts {
            let n = (d.tokens.len() + 1) * v;
            let mine = &rows[at..at + n];
            at += n;
            let req = self.requests.get_mut(&d.id).expect("checked at submit");
            let out = sampler_cpu::verify(
                &mut req.chain,
                &d.tokens,
                d.probs.as_deref(),
                mine,
                v,
                req.spec.logprobs.as_ref(),
            );
            if let Ok(ver) = &out {
                for &t in &ver.tokens {
                    req.outputs.push(t);
                    req.history.push((t, sampler_core::TokenOrigin::Output));
                }
                // Device stages that keep a history are rebuilt from it.
                let key = req.key.clone();
                self.groups.dirty(&key);
            }
            results.push(out);
        }
        Ok(BatchVerify {
            results,
            bytes_read: rows.len() * 4,
        })
    }
}
