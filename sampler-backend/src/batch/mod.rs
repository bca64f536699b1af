//! The serving batch: requests join and leave between steps, each with its
//! own chain; a step samples any subset of the live requests, in any row
//! order, in one batched device pass and one readback.
//!
//! A request's state (its CPU chain: seed, step counter, penalty window,
//! mirostat `mu`, DRY history; its prompt and generated tokens) lives with
//! the request, never with a batch position. So a request's tokens are the
//! same whether it runs alone, joins mid-way, moves to another row every
//! step, or shares the step with any other requests.
//!
//! ## Groups
//! Each request is planned alone ([`SamplingBatch::plan`]): which of its
//! stages run on the device and what comes back (token ids, `k` survivors,
//! or full rows). Requests whose device prefixes have the same stages at the
//! same chain positions and read back the same shape form a *group*; a group
//! keeps one set of device stages with one slot per member, whose per-slot
//! parameters (`[S, 1]` tensors, logit-bias tables `[S, V]`) are uploaded
//! when the group's membership or a member's parameters change, not per step
//! (the penalties' history windows, `[S, H]` ids and counts, every step). A
//! step gathers each group's rows (and, when the rows are not the slots in
//! order, its slots) and runs the group's stages; every group's output joins
//! one transaction, read back once. A row's device work and bytes read back
//! depend only on its own chain.
//!
//! Requests with no device stage (a host-only chain, policy `off`, or
//! logits on a CPU device under `auto`) read their full rows back and run
//! sampler-cpu's fast path ([`sampler_cpu::fast::sample_row`]) on them, in
//! parallel.

//!
//! ## Layout
//! This file: the batch and its public calls, a few lines each. The
//! request registry ([`request`]: each request's own state;
//! `lifecycle`: the calls that add, change and remove requests); the device
//! groups ([`group`]); the step in flight ([`pending`]); speculative
//! verification ([`verify`]). A step itself runs
//! in `crate::step`, its device plan comes from `crate::planner`.

pub(crate) mod constrained;
pub(crate) mod group;
mod lifecycle;
pub(crate) mod pending;
pub(crate) mod request;
pub(crate) mod verify;

use std::collections::BTreeMap;
use std::fmt;

use burn_tensor::{Device, Tensor};
use sampler_core::plan::{OffloadPolicy, Plan};
use sampler_core::{Candidates, Chain, ChainSpec, Logprobs, SampleError, TokenId};

use self::group::Groups;
use self::pending::{InFlightMark, PendingStep, foreign};
use self::request::{Request, RequestId};
use crate::BackendError;

/// What one step row produced in [`SamplingBatch::step`].
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStep {
    /// One entry per step row, in the order of the ids given: the token, or
    /// why that row could not be sampled (the other rows are unaffected).
    pub tokens: Vec<Result<TokenId, SampleError>>,
    /// Per step row: the logprobs its request asked for
    /// ([`ChainSpec::logprobs`]), `None` when it asked for none or failed.
    pub logprobs: Vec<Option<Logprobs>>,
    /// Bytes read back from the device in this step (all rows together):
    /// the sum of each row's own [`Plan::bytes_per_row`] and, for requests
    /// with logprobs computed on the device, `8` per entry (plus `4 k` for
    /// `raw` logprobs after a device `top_k(k)`).
    pub bytes_read: usize,
}

/// What [`SamplingBatch::top_logprobs`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchTopLogprobs {
    /// One entry per step row, in the order of the ids given: the row's top
    /// `k` `(token, logprob)`, best first.
    pub rows: Vec<Result<Vec<(TokenId, f32)>, SampleError>>,
    /// Bytes read back from the device.
    pub bytes_read: usize,
}

/// What [`SamplingBatch::filter`] produced: each row's candidates after its
/// whole chain ran without selecting.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchFilter {
    /// One entry per step row, in the order of the ids given.
    pub rows: Vec<Result<Candidates, SampleError>>,
    /// Bytes read back from the device.
    pub bytes_read: usize,
}

/// A persistent batch of sampling requests for a serving engine (vLLM's
/// persistent batch, TensorRT-LLM's request slots, llama.cpp's per-sequence
/// chains), on one device and vocabulary.
///
/// ```no_run
/// # #[cfg(feature = "flex")] {
/// use sampler_backend::{SamplingBatch, parse_device};
/// use sampler_core::{ChainSpec, OffloadPolicy, StageSpec};
/// use burn_tensor::Tensor;
///
/// let device = parse_device("flex").unwrap();
/// let mut batch = SamplingBatch::new(32000, &device, OffloadPolicy::Auto).unwrap();
/// let a = batch
///     .insert(ChainSpec::new(vec![StageSpec::TopK { k: 40 }, StageSpec::Dist], Some(1)), &[1, 2])
///     .unwrap();
/// let b = batch.insert(ChainSpec::new(vec![StageSpec::Greedy], None), &[]).unwrap();
/// // Each step: the logits of the requests running now, rows in any order.
/// let logits = Tensor::<2>::zeros([2, 32000], &device);
/// let out = batch.step(&[b, a], logits).unwrap();
/// assert_eq!(out.tokens.len(), 2);
/// batch.remove(b).unwrap();
/// # }
/// ```
pub struct SamplingBatch {
    pub(crate) device: Device,
    pub(crate) vocab: usize,
    pub(crate) policy: OffloadPolicy,
    /// The logits live on a CPU device and the policy is `auto`: every
    /// request runs on sampler-cpu over the rows.
    pub(crate) host_kernels: bool,
    pub(crate) requests: BTreeMap<RequestId, Request>,
    pub(crate) groups: Groups,
    pub(crate) next_id: u64,
    /// The submitted step waiting for `finish`.
    pub(crate) in_flight: Option<InFlightMark>,
}

impl fmt::Debug for SamplingBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SamplingBatch")
            .field("device", &self.device)
            .field("vocab", &self.vocab)
            .field("policy", &self.policy)
            .field("requests", &self.requests.len())
            .field("groups", &self.groups.len())
            .finish()
    }
}

/// Whether `device` is a CPU device (the logits live in host memory).
pub fn is_cpu_device(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    if *device == Device::flex() {
        return true;
    }
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)]
    if *device == Device::ndarray() {
        return true;
    }
    let _ = device;
    false
}

impl SamplingBatch {
    /// An empty batch over a vocabulary of `vocab` tokens on `device`.
    ///
    /// `policy` caps each request's device prefix ([`OffloadPolicy`]). With
    /// `Auto` on a CPU device (`flex`, `ndarray`) nothing is offloaded: the
    /// rows are read and sampler-cpu runs each chain (its plans say
    /// [`HostReason::CpuDevice`](sampler_core::plan::HostReason::CpuDevice)); `Stages(n)` offloads there too.
    ///
    /// # Errors
    /// [`BackendError::EmptyVocab`], [`BackendError::VocabTooLarge`].
    pub fn new(vocab: usize, device: &Device, policy: OffloadPolicy) -> Result<Self, BackendError> {
        if vocab == 0 {
            return Err(BackendError::EmptyVocab);
        }
        if vocab as u64 > 1 << 32 {
            return Err(BackendError::VocabTooLarge { vocab });
        }
        Ok(Self {
            device: device.clone(),
            vocab,
            policy,
            host_kernels: policy == OffloadPolicy::Auto && is_cpu_device(device),
            requests: BTreeMap::new(),
            groups: Groups::default(),
            next_id: 0,
            in_flight: None,
        })
    }

    /// An empty batch for a config's `[device]` (`kind`, `offload`; `cpu`
    /// means flex with nothing offloaded, as everywhere) over `vocab` tokens.
    /// Insert the config's chain with `batch.insert(cfg.chain.clone(), prompt)`.
    ///
    /// # Errors
    /// [`BackendError::UnknownDevice`] (not compiled in, bad index), and as
    /// [`SamplingBatch::new`].
    pub fn from_config(
        device: &chain_config::DeviceConfig,
        vocab: usize,
    ) -> Result<Self, BackendError> {
        let (d, policy) = crate::resolve_device(&device.device, device.offload)?;
        Self::new(vocab, &d, policy)
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
    /// The device the logits must be on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The offload policy.
    pub fn policy(&self) -> OffloadPolicy {
        self.policy
    }
    /// Live requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }
    /// Whether no request is live.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
    /// The live requests, in insertion order.
    pub fn ids(&self) -> Vec<RequestId> {
        self.requests.keys().copied().collect()
    }
    /// Device groups (requests sharing one set of device stages) now live.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }
    /// A request's plan (what runs where, what is read back), planned for
    /// that request alone: the batch never changes it.
    pub fn plan(&self, id: RequestId) -> Option<&Plan> {
        self.requests.get(&id).map(|r| &r.plan)
    }
    /// A request's CPU chain (seed, step counter, host stages).
    pub fn chain(&self, id: RequestId) -> Option<&Chain> {
        self.requests.get(&id).map(|r| &r.chain)
    }
    /// A request's chain spec, with the seed it actually uses.
    pub fn spec(&self, id: RequestId) -> Option<&ChainSpec> {
        self.requests.get(&id).map(|r| &r.spec)
    }
    /// The tokens a request has generated since it was inserted or reset.
    pub fn outputs(&self, id: RequestId) -> Option<&[TokenId]> {
        self.requests.get(&id).map(|r| r.outputs.as_slice())
    }

    /// Sample one token for each request in `ids` from `logits`
    /// `[ids.len(), vocab]` (row `r` is request `ids[r]`'s logits; any subset
    /// of the live requests, in any order): one device pass per group, one
    /// readback for the whole step, the host suffixes on sampler-cpu, then
    /// each request records its token.
    ///
    /// # Errors
    /// For the whole step: [`BackendError::Shape`],
    /// [`BackendError::WrongDevice`], [`BackendError::UnknownRequest`],
    /// [`BackendError::DuplicateRow`], [`BackendError::Readback`]. Per row
    /// (an `Err` entry; other rows are sampled and the failed request
    /// accepts nothing): NaN / `+inf` logits, all candidates masked, a
    /// chain without a selecting stage, a stage's error.
    pub fn step(
        &mut self,
        ids: &[RequestId],
        logits: Tensor<2>,
    ) -> Result<BatchStep, BackendError> {
        let pending = self.submit(ids, logits)?;
        self.finish(pending)
    }

    /// The first half of a pipelined [`SamplingBatch::step`]: validate the
    /// step, queue each group's device work and start the readback, without
    /// waiting for it. The host can then queue the next forward pass;
    /// [`SamplingBatch::finish`] waits for the readback, runs the host
    /// suffixes and records the tokens, which equal the blocking step's.
    ///
    /// Until `finish`, the batch refuses calls that would change what the
    /// step samples or records ([`BackendError::StepPending`]): `step`,
    /// `submit`, `filter`, `remove`, `reset`, `update`, `accept_prompt`,
    /// `set_mask`. `insert` is allowed (the new request joins the next step).
    ///
    /// # Errors
    /// As [`SamplingBatch::step`], and [`BackendError::StepPending`].
    pub fn submit(
        &mut self,
        ids: &[RequestId],
        logits: Tensor<2>,
    ) -> Result<PendingStep, BackendError> {
        self.submit_inner(ids, logits, true, None)
    }

    /// The second half of a pipelined step (see [`SamplingBatch::submit`]).
    ///
    /// # Errors
    /// [`BackendError::ForeignStep`] (the step given back) for a step
    /// submitted to another batch; [`BackendError::Readback`]. Per-row errors as
    /// [`SamplingBatch::step`].
    pub fn finish(&mut self, pending: PendingStep) -> Result<BatchStep, BackendError> {
        self.finish_step(pending)
    }

    /// Whether a submitted step waits for [`SamplingBatch::finish`] (a
    /// dropped [`PendingStep`] does not count).
    pub fn in_flight(&self) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|m| m.alive.strong_count() > 0)
    }

    /// Run each request's chain on its row of `logits` `[ids.len(), vocab]`
    /// without selecting or recording anything, and return its candidates
    /// (for chains without a selecting stage; nothing advances).
    ///
    /// # Errors
    /// As [`SamplingBatch::step`].
    pub fn filter(
        &mut self,
        ids: &[RequestId],
        logits: Tensor<2>,
    ) -> Result<BatchFilter, BackendError> {
        let pending = self.submit_inner(ids, logits, false, None)?;
        self.finish_filter(pending)
    }

    /// Each request's top `k` `(token, logprob)` of the log-softmax of its
    /// row of `logits` `[ids.len(), vocab]` after its chain (a chain
    /// without a selecting stage: the logits processors beam search
    /// scores with), canonical order (logit descending, ties to the lowest
    /// id), finite entries only; nothing is selected or recorded (as
    /// [`SamplingBatch::filter`]). The logprob is `logit - logsumexp(row)`,
    /// `logsumexp` over the whole processed row.
    ///
    /// Where the whole chain runs on a device and the device may select
    /// `k` (any `k` on a CPU device, at most
    /// [`ops::GENERIC_TOPK_MAX`](crate::ops::GENERIC_TOPK_MAX) on a cubecl
    /// one), the selection and the log-sum-exp run there and only
    /// `8·k + 4` bytes per row come back; otherwise the processed row is
    /// read back (`4·vocab` bytes) and the host selects.
    ///
    /// # Errors
    /// As [`SamplingBatch::filter`]; `k` of 0 is [`BackendError::TopCount`].
    pub fn top_logprobs(
        &mut self,
        ids: &[RequestId],
        logits: Tensor<2>,
        k: usize,
    ) -> Result<BatchTopLogprobs, BackendError> {
        if k == 0 {
            return Err(BackendError::TopCount { k });
        }
        let pending = self.submit_inner(ids, logits, false, Some(k))?;
        self.finish_top(pending, k)
    }

    /// Give up a submitted step: it waits for the step's readback (a GPU
    /// read cannot be abandoned half way), records nothing, clears its
    /// masks, and the batch takes calls again. Dropping the [`PendingStep`]
    /// does the same (the wait at the drop, the rest at the batch's next
    /// call).
    ///
    /// # Errors
    /// [`BackendError::ForeignStep`] (the step given back) for a step
    /// submitted to another batch.
    pub fn cancel(&mut self, pending: PendingStep) -> Result<(), BackendError> {
        if self.in_flight.as_ref().map(|m| m.serial) != Some(pending.serial) {
            return Err(foreign(pending));
        }
        self.end_step(&pending.ids);
        Ok(())
    }

    /// Refuse `call` while a submitted step waits for `finish`; a step whose
    /// [`PendingStep`] was dropped is abandoned here.
    pub(crate) fn idle(&mut self, call: &'static str) -> Result<(), BackendError> {
        match &self.in_flight {
            Some(m) if m.alive.strong_count() > 0 => Err(BackendError::StepPending { call }),
            Some(m) => {
                let ids = m.ids.clone();
                self.end_step(&ids);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The step in flight is over (finished, failed or abandoned): clear its
    /// rows' one-step masks.
    pub(crate) fn end_step(&mut self, ids: &[RequestId]) {
        self.in_flight = None;
        for id in ids {
            if let Some(req) = self.requests.get_mut(id) {
                req.chain.set_token_mask(None);
            }
        }
    }
}
