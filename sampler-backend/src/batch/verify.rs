//! Speculative decoding in the serving batch: each request's draft tokens
//! verified against its `k + 1` target rows through its own chain
//! ([`sampler_cpu::speculative`] holds the rule), the emitted tokens
//! recorded as plain steps would record them.

use std::sync::Arc;

use burn_tensor::{DType, FloatDType, Tensor, Transaction};
use sampler_core::plan::Readback;
use sampler_core::{SampleError, TokenId, TokenOrigin};
use sampler_cpu::speculative::{MAX_DRAFT_TOKENS, Verified};

use super::SamplingBatch;
use super::group::{Member, build_stages};
use super::pending::{InFlight, NEXT_SERIAL, PendingStep, Readback_, foreign};
use super::request::RequestId;
use crate::BackendError;
use crate::ops;
use crate::planner::GroupKey;
use crate::readback::decode_error;
use crate::stage::{DeviceStage, RowState};
use crate::step::decode::as_f32;
use crate::step::device::device_pass;
use crate::step::{Out, StepLayout};

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
    /// Bytes read back: `4` per row verified on the device (its sampled
    /// token), `4 · vocab` per row verified on the host.
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
    sources: Vec<Source>,
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
    /// Where it runs: drafts without a distribution (n-gram / prompt lookup)
    /// of a request whose whole chain runs on the device and that asked for
    /// no logprobs are verified by one device pass over its `k + 1` rows
    /// (row `i` sampled by the chain after the first `i` drafts, at its
    /// step + `i`, as plain decoding samples it; one pass per group, its
    /// rows in one stage set), and only the sampled ids come back: `4 · (k
    /// + 1)` bytes per request. The host compares them with the drafts
    /// (sampler-cpu's rule for such drafts: accept while the draw equals
    /// the draft). Every other request (draft distributions, logprobs, a
    /// host suffix) reads its rows back and is verified on the host by
    /// sampler-cpu: `4 · vocab` bytes per row. Both give the same tokens.
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
        // A mask holds for this verification's rows and is used up by it,
        // whatever happens to it (as a step's).
        for d in drafts {
            let req = self.requests.get_mut(&d.id).expect("checked above");
            if let Some(mask) = req.step_mask(true, self.vocab) {
                req.chain.set_token_mask(Some(mask));
            }
        }
        let mut sources = vec![Source::Host(0); drafts.len()];
        if rows > 0 {
            let logits = if logits.dtype() == DType::F32 {
                logits
            } else {
                logits.cast(FloatDType::F32)
            };
            let tx = self.queue_verify(drafts, logits, &mut sources);
            let mut readback: Readback_ = Box::pin(tx.execute_async());
            step.readback = Some(
                match futures_lite::future::block_on(futures_lite::future::poll_once(&mut readback))
                {
                    Some(done) => InFlight::Done(done),
                    None => InFlight::Waiting(readback),
                },
            );
        }
        self.in_flight = Some(step.mark());
        Ok(PendingVerify {
            step,
            drafts: drafts.to_vec(),
            sources,
        })
    }

    /// Whether a request's drafts are verified by its device pass: drafts
    /// without a distribution, a group whose whole chain runs on the device
    /// (its readback is the sampled token), no logprobs, and drafts the
    /// verifier would take (anything else is verified, or refused, on the
    /// host).
    fn verifies_on_device(&self, d: &Draft) -> bool {
        let req = &self.requests[&d.id];
        d.probs.is_none()
            && !req.key.device.is_empty()
            && req.key.readback == Readback::TokenIds
            && req.key.logprobs.is_none()
            && req.spec.logprobs.is_none()
            && req.chain.selects()
            && d.tokens.len() <= MAX_DRAFT_TOKENS
            && d.tokens.iter().all(|&t| (t as usize) < self.vocab)
    }

    /// Queue the device passes of the requests verified on the device (one
    /// per group, over a stage set with one slot per verified row: row `i`
    /// of a request starts from its history and its first `i` drafts, at
    /// its step + `i`) and register the readback: the host rows' logits
    /// first (when there are any), then each pass's `[R]` token codes.
    fn queue_verify(
        &mut self,
        drafts: &[Draft],
        logits: Tensor<2>,
        sources: &mut [Source],
    ) -> Transaction {
        let d = self.device.clone();
        let mut first_row = Vec::with_capacity(drafts.len());
        let mut at = 0;
        for dr in drafts {
            first_row.push(at);
            at += dr.tokens.len() + 1;
        }
        let total = at;
        // Device requests by group key, in order of first appearance.
        let mut by_key: Vec<(GroupKey, Vec<usize>)> = Vec::new();
        let mut host = Vec::new();
        for (j, dr) in drafts.iter().enumerate() {
            if !self.verifies_on_device(dr) {
                host.push(j);
                continue;
            }
            let key = &self.requests[&dr.id].key;
            match by_key.iter_mut().find(|(k, _)| k == key) {
                Some((_, js)) => js.push(j),
                None => by_key.push((key.clone(), vec![j])),
            }
        }
        let rows_of = |js: &[usize]| -> Vec<i64> {
            js.iter()
                .flat_map(|&j| {
                    let n = drafts[j].tokens.len() + 1;
                    (first_row[j]..first_row[j] + n).map(|r| r as i64)
                })
                .collect()
        };
        let select = |rows: &[i64]| -> Tensor<2> {
            if rows.len() == total {
                logits.clone()
            } else {
                logits.clone().select(0, ops::vec_int(rows, &d))
            }
        };
        let mut runs: Vec<VerifyRun> = Vec::new();
        for (key, js) in by_key {
            // Histories only where a stage keeps one (penalties, min_tokens,
            // ...): otherwise each row's slot starts empty.
            let keeps_history = key.device.iter().any(|(_, k, _)| k.meta().needs_history);
            let mut histories = Vec::new();
            let mut row_states = Vec::new();
            let mut specs = Vec::new();
            for &j in &js {
                let dr = &drafts[j];
                let req = &self.requests[&dr.id];
                let c = &req.chain;
                let mask: Option<Arc<[u32]>> = c
                    .stages()
                    .iter()
                    .find_map(|st| st.token_mask().map(Arc::from));
                for i in 0..=dr.tokens.len() {
                    let mut h = Vec::new();
                    if keeps_history {
                        h.extend_from_slice(&req.history);
                        h.extend(dr.tokens[..i].iter().map(|&t| (t, TokenOrigin::Output)));
                    }
                    histories.push(h);
                    specs.push(&req.spec);
                    row_states.push(RowState {
                        seed: c.seed(),
                        step: c.step() + i as u64,
                        mask: mask.clone(),
                    });
                }
            }
            let members: Vec<Member<'_>> = specs
                .iter()
                .zip(&histories)
                .map(|(s, h)| (*s, &h[..]))
                .collect();
            let stages = build_stages(&key, &members, self.vocab, &d);
            if stages.is_empty() {
                host.extend(js);
            } else {
                runs.push((stages, js, row_states));
            }
        }
        host.sort_unstable();
        let mut tx = Transaction::default();
        if !host.is_empty() {
            let mut at = 0;
            for &j in &host {
                sources[j] = Source::Host(at);
                at += drafts[j].tokens.len() + 1;
            }
            tx = tx.register(select(&rows_of(&host)));
        }
        let first = usize::from(!host.is_empty());
        for (reg, (mut stages, js, row_states)) in (first..).zip(runs) {
            let mut at = 0;
            for &j in &js {
                sources[j] = Source::Device { tensor: reg, at };
                at += drafts[j].tokens.len() + 1;
            }
            let rows = select(&rows_of(&js));
            let out = device_pass(
                &mut stages,
                rows,
                None,
                &row_states,
                Readback::TokenIds,
                None,
                None,
            );
            for t in out {
                tx = match t {
                    Out::F(t) => tx.register(t),
                    Out::I(t) => tx.register(t),
                };
            }
        }
        tx
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
        let PendingVerify {
            mut step,
            drafts,
            sources,
        } = pending;
        if self.in_flight.as_ref().map(|m| m.serial) != Some(step.serial) {
            return Err(foreign(step));
        }
        let ids = std::mem::take(&mut step.ids);
        let out = self.verify_rows(&mut step, &drafts, &sources);
        self.end_step(&ids);
        out
    }

    /// Wait for the readback and verify request by request: rows read back
    /// whole through sampler-cpu's verifier, device-verified requests from
    /// their rows' sampled tokens.
    fn verify_rows(
        &mut self,
        step: &mut PendingStep,
        drafts: &[Draft],
        sources: &[Source],
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
        let v = self.vocab;
        let host_rows = sources.iter().any(|s| matches!(s, Source::Host(_)));
        let raw: &[f32] = match (host_rows, data.first()) {
            (false, _) => &[],
            (true, Some(first)) => as_f32(first)?,
            (true, None) => return Err(BackendError::Readback("no rows came back".into())),
        };
        let codes: Vec<Vec<i64>> = data
            .iter()
            .skip(usize::from(host_rows))
            .map(|t| t.iter::<i64>().collect())
            .collect();
        let bytes_read = raw.len() * 4 + codes.iter().map(|c| c.len() * 4).sum::<usize>();
        let mut results = Vec::with_capacity(drafts.len());
        for (d, src) in drafts.iter().zip(sources) {
            let n = d.tokens.len() + 1;
            let req = self.requests.get_mut(&d.id).expect("checked at submit");
            // A constrained request: no drafts (their rows would need the
            // masks of states the matcher has not reached), and nothing
            // after its constraint failed.
            if let Some(c) = &req.constraint {
                let refused = match c.failure() {
                    Some(e) => Some(e.clone()),
                    None if !d.tokens.is_empty() => Some(sampler_core::ConstraintError {
                        kind: "speculative",
                        message: format!(
                            "{} drafts given for a request with structured output: verify it without drafts (k = 0)",
                            d.tokens.len()
                        ),
                    }),
                    None => None,
                };
                if let Some(e) = refused {
                    results.push(Err(SampleError::Constraint(e)));
                    continue;
                }
            }
            let out = match *src {
                Source::Host(at) => sampler_cpu::verify(
                    &mut req.chain,
                    &d.tokens,
                    d.probs.as_deref(),
                    &raw[at * v..(at + n) * v],
                    v,
                    req.spec.logprobs.as_ref(),
                ),
                Source::Device { tensor, at } => {
                    let mine = codes
                        .get(tensor - usize::from(host_rows))
                        .and_then(|c| c.get(at..at + n))
                        .ok_or_else(|| {
                            BackendError::Readback("a verification pass came back short".into())
                        })?;
                    let out = accept_sampled(&d.tokens, mine, v);
                    if let Ok(ver) = &out {
                        for &t in &ver.tokens {
                            req.chain.commit(t);
                        }
                    }
                    out
                }
            };
            if let Ok(ver) = &out {
                if let Some(c) = &mut req.constraint {
                    c.accept(&ver.tokens);
                }
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
            bytes_read,
        })
    }
}

/// One group's verification pass: its stage set (a slot per row), the
/// requests (indices into the drafts) and each row's state.
type VerifyRun = (Vec<Box<dyn DeviceStage>>, Vec<usize>, Vec<RowState>);

/// Where a request's verification happens.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// On the host, its rows at this row of the host rows' readback.
    Host(usize),
    /// On the device: its rows' token codes at row `at` of readback tensor
    /// `tensor`.
    Device { tensor: usize, at: usize },
}

/// Drafts without a distribution verified from each row's sampled token
/// (`codes`: `k + 1` token codes, row `i` sampled after drafts `..i`): the
/// drafts accepted while the draw equals them, then the first differing
/// draw (or the last row's); sampler-cpu's rule for such drafts. An invalid
/// row anywhere fails the request (the host verifier checks every row
/// first); a row past the first differing draw is not looked at otherwise.
fn accept_sampled(
    drafts: &[TokenId],
    codes: &[i64],
    vocab: usize,
) -> Result<Verified, SampleError> {
    let decode = |c: i64| -> Result<TokenId, SampleError> {
        if c < 0 {
            Err(decode_error(c))
        } else if (c as u64) < vocab as u64 {
            Ok(c as TokenId)
        } else {
            Err(SampleError::Device(format!(
                "device returned token id {c} outside the vocabulary"
            )))
        }
    };
    if let Some(e) = codes
        .iter()
        .filter(|&&c| c < 0)
        .map(|&c| decode_error(c))
        .find(|e| {
            matches!(
                e,
                SampleError::NanLogit { .. } | SampleError::PosInfLogit { .. }
            )
        })
    {
        return Err(e);
    }
    let mut out = Verified::default();
    for (i, &c) in codes.iter().enumerate() {
        let t = decode(c)?;
        out.tokens.push(t);
        match drafts.get(i) {
            Some(&d) if d == t => out.accepted += 1,
            _ => break,
        }
    }
    Ok(out)
}
