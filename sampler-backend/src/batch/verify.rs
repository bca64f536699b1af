//! Speculative decoding in the serving batch: each request's draft tokens
//! verified against its `k + 1` target rows through its own chain
//! ([`sampler_cpu::speculative`] holds the rule), the emitted tokens
//! recorded as plain steps would record them.

use burn_tensor::{DType, Tensor};
use sampler_core::{SampleError, TokenId};
use sampler_cpu::speculative::Verified;

use super::SamplingBatch;
use super::request::RequestId;
use crate::BackendError;

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
    /// [`MAX_DRAFT_TOKENS`](sampler_cpu::speculative::MAX_DRAFT_TOKENS) drafts, draft ids outside the vocabulary, draft
    /// distributions that are not `[k, vocab]` distributions or give a draft
    /// probability 0, a chain that does not end in `dist` or `greedy`, the
    /// rows' and stages' errors.
    pub fn verify(
        &mut self,
        drafts: &[Draft],
        logits: Tensor<2>,
    ) -> Result<BatchVerify, BackendError> {
        self.idle("verify")?;
        let rows: usize = drafts.iter().map(|d| d.tokens.len() + 1).sum();
        let dims = logits.dims();
        if dims != [rows, self.vocab] {
            return Err(BackendError::Shape {
                found: dims.to_vec(),
                batch: rows,
                vocab: self.vocab,
            });
        }
        let ldev = logits.device();
        if ldev != self.device {
            return Err(BackendError::WrongDevice {
                found: format!("{ldev:?}"),
                expected: format!("{:?}", self.device),
            });
        }
        let mut seen = std::collections::HashMap::with_capacity(drafts.len());
        for (r, d) in drafts.iter().enumerate() {
            if !self.requests.contains_key(&d.id) {
                return Err(BackendError::UnknownRequest { id: d.id.0 });
            }
            if let Some(first) = seen.insert(d.id, r) {
                return Err(BackendError::DuplicateRow {
                    id: d.id.0,
                    first,
                    second: r,
                });
            }
        }
        if rows == 0 {
            return Ok(BatchVerify {
                results: Vec::new(),
                bytes_read: 0,
            });
        }
        let logits = if logits.dtype() == DType::F32 {
            logits
        } else {
            logits.cast(burn_tensor::FloatDType::F32)
        };
        let data = logits
            .into_data()
            .try_into_vec::<f32>()
            .map_err(|e| BackendError::Readback(format!("{e:?}")))?;
        let v = self.vocab;
        let mut at = 0;
        let mut results = Vec::with_capacity(drafts.len());
        for d in drafts {
            let n = (d.tokens.len() + 1) * v;
            let rows = &data[at..at + n];
            at += n;
            let req = self.requests.get_mut(&d.id).expect("checked above");
            // A mask holds for this call, then is used up.
            if let Some(mask) = req.mask.take() {
                req.chain.set_token_mask(Some(mask));
            }
            let lp = req.spec.logprobs.clone();
            let out = sampler_cpu::verify(
                &mut req.chain,
                &d.tokens,
                d.probs.as_deref(),
                rows,
                v,
                lp.as_ref(),
            );
            req.chain.set_token_mask(None);
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
            bytes_read: rows * v * 4,
        })
    }
}
