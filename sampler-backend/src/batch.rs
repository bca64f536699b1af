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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use burn_tensor::{DType, Device, FloatDType, Int, IntDType, Tensor, TensorData, Transaction};
use rayon::prelude::*;
use sampler_core::plan::{self, HostReason, OffloadPolicy, Plan, PlanStage, Readback};
use sampler_core::{
    Candidates, Chain, ChainSpec, DeviceRefusal, Logprobs, LogprobsMode, SampleError, StageKind,
    StageSpec, TokenId, TokenOrigin,
};

use crate::BackendError;
use crate::ops::{self, wide};
use crate::readback::decode_error;
use crate::stage::{DeviceStage, InitContext, RowState, StepData, build_device_stage};
use crate::stages::penalties::apply_history_penalties;
use crate::stages::top_p::materialize_nucleus;

/// The largest vocabulary a device stage takes: device token ids are
/// `i32` (ids `0..2^31`).
const DEVICE_VOCAB_LIMIT: u64 = 1 << 31;

/// A request of a [`SamplingBatch`]: returned by [`SamplingBatch::insert`],
/// valid until [`SamplingBatch::remove`]. Ids are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(u64);

impl RequestId {
    /// The id as a number (unique within its batch).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}", self.0)
    }
}

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

/// A pipelined step in flight: returned by [`SamplingBatch::submit`],
/// consumed by [`SamplingBatch::finish`].
pub struct PendingStep {
    serial: u64,
    /// Its strong count tells the batch whether this step was dropped.
    alive: std::sync::Arc<()>,
    select: bool,
    ids: Vec<RequestId>,
    row_of: HashMap<RequestId, usize>,
    host_rows: Vec<usize>,
    host_at: Option<usize>,
    group_rows: Vec<(GroupKey, Vec<usize>)>,
    group_at: Vec<usize>,
    group_slots: Vec<Vec<i64>>,
    readback: Option<InFlight>,
}

/// A submitted step's readback: still running, or already done (a CPU
/// device reads synchronously).
enum InFlight {
    Waiting(Readback_),
    Done(Result<Vec<TensorData>, burn_tensor::ExecutionError>),
}

/// A step dropped without `finish` still waits for its readback: a GPU
/// backend must see its read finish (wgpu refuses the next submission while
/// a buffer it maps for reading is left mapped).
impl Drop for PendingStep {
    fn drop(&mut self) {
        if let Some(InFlight::Waiting(f)) = self.readback.take() {
            let _ = futures_lite::future::block_on(f);
        }
    }
}

impl PendingStep {
    fn mark(&self) -> InFlightMark {
        InFlightMark {
            serial: self.serial,
            alive: std::sync::Arc::downgrade(&self.alive),
            ids: self.ids.clone(),
        }
    }
}

/// A [`PendingStep`] handed back inside [`BackendError::ForeignStep`]
/// (errors are `Clone`: the step is taken out once, by whichever copy asks
/// first).
#[derive(Clone)]
pub struct ReturnedStep {
    serial: u64,
    step: Arc<std::sync::Mutex<Option<PendingStep>>>,
}

impl ReturnedStep {
    fn new(step: PendingStep) -> Self {
        Self {
            serial: step.serial,
            step: Arc::new(std::sync::Mutex::new(Some(step))),
        }
    }

    /// The step, the first time (`None` after that).
    pub fn take(&self) -> Option<PendingStep> {
        self.step.lock().ok()?.take()
    }

    /// The step's serial (unique across batches).
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

impl PartialEq for ReturnedStep {
    fn eq(&self, other: &Self) -> bool {
        self.serial == other.serial
    }
}

impl fmt::Debug for ReturnedStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReturnedStep")
            .field("serial", &self.serial)
            .finish()
    }
}

impl fmt::Debug for PendingStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingStep")
            .field("serial", &self.serial)
            .field("rows", &self.ids.len())
            .finish()
    }
}

/// The readback future of a submitted step.
type Readback_ = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<Vec<TensorData>, burn_tensor::ExecutionError>>
            + Send,
    >,
>;

/// What `finish_inner` produced per step row.
#[derive(Default)]
struct StepRows {
    rows: Vec<Result<RowResult, SampleError>>,
    logprobs: Vec<Option<Logprobs>>,
    bytes_read: usize,
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

/// The device prefix a request runs: `(chain position, kind, survivors)` of
/// each device stage, and the readback. Requests with equal keys share a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    device: Vec<(usize, StageKind, Option<usize>)>,
    readback: Readback,
    /// Logprobs the device computes: mode, top `n`, `m` requested ids.
    logprobs: Option<(LogprobsMode, usize, usize)>,
}

struct Request {
    /// The spec with the seed actually used.
    spec: ChainSpec,
    chain: Chain,
    plan: Plan,
    key: GroupKey,
    /// Survivors kept from a `Candidates` readback.
    keep: usize,
    /// A device stage of this request masks what the CPU removes (top_p,
    /// min_p, epsilon, eta): the host drops the `-inf` entries it left.
    drop_masked: bool,
    /// Every accepted token in order (prompt and generated), for device
    /// state rebuilt at a group change and chains rebuilt by `update`.
    history: Vec<(TokenId, TokenOrigin)>,
    /// The generated tokens since insert / reset.
    outputs: Vec<TokenId>,
    /// The token mask for the next step ([`SamplingBatch::set_mask`]).
    mask: Option<Arc<[u32]>>,
}

#[derive(Default)]
struct Group {
    /// Slot -> request.
    members: Vec<RequestId>,
    /// The device stages for `members`, `None` until (re)built.
    stages: Option<Vec<Box<dyn DeviceStage>>>,
    /// The members' requested logprob token ids `[S, m]`, with the stages.
    lp_ids: Option<Tensor<2, Int>>,
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
    device: Device,
    vocab: usize,
    policy: OffloadPolicy,
    /// The logits live on a CPU device and the policy is `auto`: every
    /// request runs on sampler-cpu over the rows.
    host_kernels: bool,
    requests: BTreeMap<RequestId, Request>,
    groups: HashMap<GroupKey, Group>,
    next_id: u64,
    /// The submitted step waiting for `finish`.
    in_flight: Option<InFlightMark>,
}

/// What the batch remembers of its step in flight.
struct InFlightMark {
    /// The [`PendingStep`]'s serial (unique across batches).
    serial: u64,
    /// Dead when the caller dropped the `PendingStep` without `finish`.
    alive: std::sync::Weak<()>,
    /// The step's rows (their one-step masks are cleared when it ends).
    ids: Vec<RequestId>,
}

/// Serials of submitted steps, unique in the process, so that a
/// [`PendingStep`] of another batch is recognised.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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

fn effective_k(k: u64, n: usize) -> usize {
    if k == 0 { n } else { k.min(n as u64) as usize }
}

/// A row's work after the readback, before the host runs.
enum Work {
    /// The full raw row at this offset of the host buffer `raw`.
    Raw(usize),
    /// The device selected (or failed).
    Token(Result<TokenId, SampleError>),
    /// Candidates read back; the host runs the chain from `host_start`.
    Cands(Result<Candidates, SampleError>, usize),
}

/// A row's result.
enum RowResult {
    Token(TokenId),
    Cands(Candidates),
}

impl SamplingBatch {
    /// An empty batch over a vocabulary of `vocab` tokens on `device`.
    ///
    /// `policy` caps each request's device prefix ([`OffloadPolicy`]). With
    /// `Auto` on a CPU device (`flex`, `ndarray`) nothing is offloaded: the
    /// rows are read and sampler-cpu runs each chain (its plans say
    /// [`HostReason::CpuDevice`]); `Stages(n)` offloads there too.
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
            groups: HashMap::new(),
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

    /// Add a request: its chain (a `seed: None` draws one from the OS; read
    /// it back with [`SamplingBatch::spec`]) and the prompt tokens its
    /// history-based stages count. Nothing runs until the next step.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] (a parameter out of range: which
    /// stage, which field, what range), [`BackendError::RequestBuild`].
    pub fn insert(
        &mut self,
        mut spec: ChainSpec,
        prompt: &[TokenId],
    ) -> Result<RequestId, BackendError> {
        let (chain, planned) = self.prepare(&mut spec, &[])?;
        Ok(self.add(spec, chain, planned, prompt))
    }

    /// Add a request whose chain the caller built, custom stages included
    /// (any [`sampler_core::Sampler`]; e.g. `Chain::new(stages, seed)`),
    /// with the logprobs it asks for. The planner offloads the built-in
    /// stages before the first custom stage (as for any request) and runs the
    /// custom stage and everything after it on the host, on the candidates
    /// that come back; the plan names the custom stage as the reason
    /// ([`HostReason::CustomStage`]). The chain keeps its own seed, state
    /// and fast kernels (sampler-cpu's are installed when it has none).
    /// [`SamplingBatch::spec`] then returns the built-in stages before the
    /// first custom one; [`SamplingBatch::update`] replaces the whole chain.
    /// Insert a fresh chain (no accepted tokens) and give its history as
    /// `prompt`: the batch cannot see what a chain accepted before, and its
    /// device stages are built from the history the batch records.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for a built-in stage's parameter
    /// out of range or bad logprobs; [`BackendError::StepPending`] never
    /// (inserting is allowed while a step is in flight).
    pub fn insert_chain(
        &mut self,
        chain: Chain,
        logprobs: Option<sampler_core::LogprobsSpec>,
        prompt: &[TokenId],
    ) -> Result<RequestId, BackendError> {
        let specs = chain.specs();
        let first_custom = specs
            .iter()
            .position(Option::is_none)
            .unwrap_or(specs.len());
        let mut spec = ChainSpec {
            stages: specs[..first_custom].iter().flatten().cloned().collect(),
            seed: Some(chain.seed()),
            logprobs,
        };
        let tail: Vec<PlanStage> = chain.stages()[first_custom..]
            .iter()
            .zip(&specs[first_custom..])
            .map(|(st, sp)| PlanStage {
                name: st.name().to_string(),
                spec: sp.clone(),
                device: Ok(()),
            })
            .collect();
        let (_, planned) = self.prepare(&mut spec, &tail)?;
        let chain = match chain.kernels() {
            Some(_) => chain,
            None => chain.with_kernels(sampler_cpu::ROW_KERNELS),
        };
        Ok(self.add(spec, chain, planned, prompt))
    }

    fn add(
        &mut self,
        spec: ChainSpec,
        chain: Chain,
        planned: Planned,
        prompt: &[TokenId],
    ) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        let mut req = Request {
            spec,
            chain,
            plan: planned.plan,
            key: planned.key,
            keep: planned.keep,
            drop_masked: planned.drop_masked,
            history: Vec::new(),
            outputs: Vec::new(),
            mask: None,
        };
        req.chain.accept_prompt(prompt);
        req.history
            .extend(prompt.iter().map(|&t| (t, TokenOrigin::Prompt)));
        self.join(id, &req.key);
        self.requests.insert(id, req);
        id
    }

    /// Remove a request (finished or cancelled); its id becomes unknown.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn remove(&mut self, id: RequestId) -> Result<(), BackendError> {
        self.idle("remove")?;
        let req = self
            .requests
            .remove(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        self.leave(id, &req.key);
        Ok(())
    }

    /// Forget a request's history (prompt and generated tokens, adaptive
    /// state) and restart its step counter: its seed then replays the same
    /// random numbers. Other requests are unaffected.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn reset(&mut self, id: RequestId) -> Result<(), BackendError> {
        self.idle("reset")?;
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        req.chain.reset();
        req.history.clear();
        req.outputs.clear();
        let key = req.key.clone();
        self.dirty(&key);
        Ok(())
    }

    /// Feed more prompt tokens to a request's history-based stages (e.g. a
    /// chat turn appended to a running request).
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn accept_prompt(&mut self, id: RequestId, tokens: &[TokenId]) -> Result<(), BackendError> {
        self.idle("accept_prompt")?;
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        req.chain.accept_prompt(tokens);
        req.history
            .extend(tokens.iter().map(|&t| (t, TokenOrigin::Prompt)));
        let key = req.key.clone();
        let group = self.groups.get_mut(&key);
        if let Some(g) = group
            && let Some(slot) = g.members.iter().position(|&m| m == id)
            && let Some(stages) = &mut g.stages
        {
            for st in stages.iter_mut().filter(|st| st.needs_history()) {
                st.accept_prompt(slot, tokens);
            }
        }
        Ok(())
    }

    /// Constrain a request's next step to the tokens of `mask`: an
    /// allowed-token bitmask of `ceil(vocab / 32)` `u32` words (bit
    /// `id % 32` of word `id / 32` allows token `id`; the format of
    /// llguidance and XGrammar), applied where the chain's `mask` stage
    /// stands, on the device or the host. It holds for the next step only
    /// (`None`, or no call, allows every token). A mask that allows nothing
    /// left makes that row's step fail with [`SampleError::AllMasked`]; the
    /// other rows are unaffected.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::NoMaskStage`],
    /// [`BackendError::MaskLength`], [`BackendError::StepPending`].
    pub fn set_mask(&mut self, id: RequestId, mask: Option<&[u32]>) -> Result<(), BackendError> {
        self.idle("set_mask")?;
        let vocab = self.vocab;
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        if !masks_act(&req.chain) {
            return Err(BackendError::NoMaskStage { id: id.0 });
        }
        if let Some(m) = mask
            && m.len() != vocab.div_ceil(32)
        {
            return Err(BackendError::MaskLength {
                id: id.0,
                found: m.len(),
                expected: vocab.div_ceil(32),
            });
        }
        req.mask = mask.map(Arc::from);
        Ok(())
    }

    /// Change a request's chain between steps (new parameters, stages
    /// added or removed). The request keeps its seed (unless `spec` names
    /// one), its step counter, its prompt and generated tokens: the new
    /// chain's history-based stages are given that history, and a stage
    /// whose spec is unchanged at the same position keeps its adaptive
    /// state (mirostat `mu`). Only the request's group uploads anything.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::InvalidRequest`],
    /// [`BackendError::RequestBuild`]; on error nothing changes.
    pub fn update(&mut self, id: RequestId, mut spec: ChainSpec) -> Result<(), BackendError> {
        self.idle("update")?;
        let old_seed = self
            .requests
            .get(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?
            .spec
            .seed;
        spec.seed = spec.seed.or(old_seed);
        let (mut chain, planned) = self.prepare(&mut spec, &[])?;
        let Some(req) = self.requests.get_mut(&id) else {
            return Err(BackendError::UnknownRequest { id: id.0 });
        };
        if spec.stages.iter().any(|s| s.kind().meta().needs_history) {
            for &(t, origin) in &req.history {
                chain.accept(t, origin);
            }
        }
        chain.set_step(req.chain.step());
        for (i, (old, new)) in req.spec.stages.iter().zip(&spec.stages).enumerate() {
            if old == new && spec.seed == req.spec.seed {
                std::mem::swap(&mut chain.stages_mut()[i], &mut req.chain.stages_mut()[i]);
            }
        }
        let old_key = std::mem::replace(&mut req.key, planned.key.clone());
        req.spec = spec;
        req.chain = chain;
        // A mask given for the old chain cannot act on a chain whose mask
        // stage is gone (or now after its selecting stage): dropped, not
        // kept for a later chain that has one again.
        if !masks_act(&req.chain) {
            req.mask = None;
        }
        req.plan = planned.plan;
        req.keep = planned.keep;
        req.drop_masked = planned.drop_masked;
        if old_key == planned.key {
            self.dirty(&old_key);
        } else {
            self.leave(id, &old_key);
            self.join(id, &planned.key);
        }
        Ok(())
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
        self.submit_inner(ids, logits, true)
    }

    /// The second half of a pipelined step (see [`SamplingBatch::submit`]).
    ///
    /// # Errors
    /// [`BackendError::ForeignStep`] (the step given back) for a step
    /// submitted to another batch; [`BackendError::Readback`]. Per-row errors as
    /// [`SamplingBatch::step`].
    pub fn finish(&mut self, pending: PendingStep) -> Result<BatchStep, BackendError> {
        let out = self.finish_inner(pending)?;
        let tokens = out
            .rows
            .into_iter()
            .map(|r| match r {
                Ok(RowResult::Token(t)) => Ok(t),
                Ok(RowResult::Cands(_)) => Err(SampleError::NoSelectingStage),
                Err(e) => Err(e),
            })
            .collect();
        Ok(BatchStep {
            tokens,
            logprobs: out.logprobs,
            bytes_read: out.bytes_read,
        })
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
        let pending = self.submit_inner(ids, logits, false)?;
        let out = self.finish_inner(pending)?;
        let vocab = self.vocab;
        let rows = out
            .rows
            .into_iter()
            .map(|r| match r {
                Ok(RowResult::Cands(c)) => Ok(c),
                Ok(RowResult::Token(t)) => Candidates::from_parts(vec![t], vec![0.0], vocab),
                Err(e) => Err(e),
            })
            .collect();
        Ok(BatchFilter {
            rows,
            bytes_read: out.bytes_read,
        })
    }

    /// Refuse `call` while a submitted step waits for `finish`; a step whose
    /// [`PendingStep`] was dropped is abandoned here.
    fn idle(&mut self, call: &'static str) -> Result<(), BackendError> {
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

    fn join(&mut self, id: RequestId, key: &GroupKey) {
        if key.device.is_empty() {
            return;
        }
        let g = self.groups.entry(key.clone()).or_default();
        g.members.push(id);
        g.stages = None;
    }

    fn leave(&mut self, id: RequestId, key: &GroupKey) {
        if let Some(g) = self.groups.get_mut(key) {
            g.members.retain(|&m| m != id);
            g.stages = None;
            if g.members.is_empty() {
                self.groups.remove(key);
            }
        }
    }

    fn dirty(&mut self, key: &GroupKey) {
        if let Some(g) = self.groups.get_mut(key) {
            g.stages = None;
        }
    }

    /// Validate and plan a request alone; fills in its seed. `tail`: the
    /// stages of a caller-built chain from its first custom stage on.
    fn prepare(
        &self,
        spec: &mut ChainSpec,
        tail: &[PlanStage],
    ) -> Result<(Chain, Planned), BackendError> {
        spec.validate()
            .map_err(|(stage, source)| BackendError::InvalidRequest { stage, source })?;
        if let Some(lp) = &spec.logprobs
            && let Some(&t) = lp.token_ids.iter().find(|&&t| t as usize >= self.vocab)
        {
            return Err(BackendError::InvalidRequest {
                stage: spec.stages.len(),
                source: sampler_core::ParamError {
                    stage: "logprobs",
                    param: "logprob_token_ids",
                    value: t.to_string(),
                    expected: format!("token ids below the vocabulary size {}", self.vocab),
                },
            });
        }
        // Stop ids the vocabulary does not have could never be sampled:
        // refused here, like logprob ids, not at every step.
        for (i, st) in spec.stages.iter().enumerate() {
            if let StageSpec::MinTokens { stop, .. } = st
                && let Some(&t) = stop.iter().find(|&&t| t as usize >= self.vocab)
            {
                return Err(BackendError::InvalidRequest {
                    stage: i,
                    source: sampler_core::ParamError {
                        stage: "min_tokens",
                        param: "stop",
                        value: t.to_string(),
                        expected: format!("token ids below the vocabulary size {}", self.vocab),
                    },
                });
            }
        }
        let chain = sampler_cpu::build_chain(spec)
            .map_err(|source| BackendError::RequestBuild { source })?;
        spec.seed = Some(chain.seed());
        let planned = plan_request(
            spec,
            tail,
            self.vocab,
            &self.device,
            self.policy,
            self.host_kernels,
        );
        Ok((chain, planned))
    }

    /// (Re)build a group's device stages for its members.
    fn build_group(&mut self, key: &GroupKey) {
        let Some(g) = self.groups.get_mut(key) else {
            return;
        };
        if g.stages.is_some() {
            return;
        }
        let slots = g.members.len();
        let mut stages = Vec::with_capacity(key.device.len());
        let mut width = self.vocab;
        let mut has_ids = false;
        for &(i, _, _) in &key.device {
            let specs: Vec<_> = g
                .members
                .iter()
                .map(|m| self.requests[m].spec.stages[i].clone())
                .collect();
            let Some(mut st) = build_device_stage(i, &specs) else {
                break;
            };
            if st.needs_history() {
                for (slot, m) in g.members.iter().enumerate() {
                    st.restore(slot, &self.requests[m].history);
                }
            }
            let ctx = InitContext {
                batch: slots,
                vocab: self.vocab,
                width,
                has_ids,
                device: self.device.clone(),
            };
            if st.init(&ctx).is_err() {
                // Every member's own plan was accepted at one slot; at this
                // group size a table would be too large. The group's rows
                // then run on the host (full rows), still exact.
                stages.clear();
                break;
            }
            let w = st.out_width(width);
            has_ids |= w != width;
            width = w;
            stages.push(st);
        }
        if stages.len() != key.device.len() {
            stages.clear();
        }
        g.lp_ids = match key.logprobs {
            Some((_, _, m)) if m > 0 => {
                let ids: Vec<i32> = g
                    .members
                    .iter()
                    .flat_map(|mem| {
                        let lp = self.requests[mem].spec.logprobs.as_ref();
                        lp.map(|l| l.token_ids.clone()).unwrap_or_default()
                    })
                    .map(|t| t as i32)
                    .collect();
                Some(Tensor::<2, Int>::from_data(
                    TensorData::new(ids, [slots, m]),
                    &self.device,
                ))
            }
            _ => None,
        };
        g.stages = Some(stages);
    }

    /// Validate a step, queue every group's device work and start the
    /// readback; nothing is accepted yet.
    fn submit_inner(
        &mut self,
        ids: &[RequestId],
        logits: Tensor<2>,
        select: bool,
    ) -> Result<PendingStep, BackendError> {
        self.idle(if select { "step" } else { "filter" })?;
        let dims = logits.dims();
        if dims != [ids.len(), self.vocab] {
            return Err(BackendError::Shape {
                found: dims.to_vec(),
                batch: ids.len(),
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
        let mut row_of: HashMap<RequestId, usize> = HashMap::with_capacity(ids.len());
        for (r, &id) in ids.iter().enumerate() {
            if !self.requests.contains_key(&id) {
                return Err(BackendError::UnknownRequest { id: id.0 });
            }
            if let Some(first) = row_of.insert(id, r) {
                return Err(BackendError::DuplicateRow {
                    id: id.0,
                    first,
                    second: r,
                });
            }
        }
        let mut pending = PendingStep {
            serial: NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            alive: std::sync::Arc::new(()),
            select,
            ids: ids.to_vec(),
            row_of,
            host_rows: Vec::new(),
            host_at: None,
            group_rows: Vec::new(),
            group_at: Vec::new(),
            group_slots: Vec::new(),
            readback: None,
        };
        if ids.is_empty() {
            self.in_flight = Some(pending.mark());
            return Ok(pending);
        }
        let logits = if logits.dtype() == DType::F32 {
            logits
        } else {
            logits.cast(FloatDType::F32)
        };
        let b = ids.len();
        // This step's token masks go to the rows' chains (the host stages)
        // and, through them, to the device stages.
        for id in ids {
            // `filter` looks without stepping: the mask stays for the step.
            let mask = self.requests.get_mut(id).and_then(|req| {
                if select {
                    req.mask.take()
                } else {
                    req.mask.clone()
                }
            });
            if let (Some(req), Some(mask)) = (self.requests.get_mut(id), mask) {
                req.chain.set_token_mask(Some(mask));
            }
        }

        // Rows by group, in order of first appearance; host rows apart.
        let mut host_rows = Vec::new();
        let mut group_rows: Vec<(GroupKey, Vec<usize>)> = Vec::new();
        for (r, id) in ids.iter().enumerate() {
            let key = &self.requests[id].key;
            if key.device.is_empty() {
                host_rows.push(r);
            } else if let Some((_, rows)) = group_rows.iter_mut().find(|(k, _)| k == key) {
                rows.push(r);
            } else {
                group_rows.push((key.clone(), vec![r]));
            }
        }
        for (key, _) in &group_rows {
            self.build_group(key);
        }
        // Groups whose stages could not be built at their size run on the host.
        group_rows.retain(|(key, rows)| {
            let empty = self.groups[key]
                .stages
                .as_ref()
                .is_none_or(|s| s.is_empty());
            if empty {
                host_rows.extend(rows);
            }
            !empty
        });
        host_rows.sort_unstable();

        let d = self.device.clone();
        let select_rows = |logits: &Tensor<2>, rows: &[usize]| -> Tensor<2> {
            if rows.len() == b {
                logits.clone()
            } else {
                let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
                logits.clone().select(0, ops::vec_int(&idx, &d))
            }
        };
        let mut tx = Transaction::default();
        let mut n_reg = 0;
        let mut logits = Some(logits);
        let host_at = if host_rows.is_empty() {
            None
        } else if host_rows.len() == b {
            // Every row on the host: the tensor itself is read (on a CPU
            // device without a copy when the caller kept no clone).
            tx = tx.register(logits.take().expect("not taken yet"));
            n_reg += 1;
            Some(0)
        } else {
            tx = tx.register(select_rows(logits.as_ref().expect("not taken"), &host_rows));
            n_reg += 1;
            Some(0)
        };
        // Per group: the index of its first registered tensor, and each of
        // its step rows' slot.
        let mut group_at = Vec::with_capacity(group_rows.len());
        let mut group_slots = Vec::with_capacity(group_rows.len());
        for (key, rows) in &group_rows {
            let g = self.groups.get_mut(key).expect("group built above");
            let slot_of: HashMap<RequestId, usize> =
                g.members.iter().enumerate().map(|(s, &m)| (m, s)).collect();
            let slots: Vec<i64> = rows.iter().map(|&r| slot_of[&ids[r]] as i64).collect();
            let identity = slots.len() == g.members.len()
                && slots.iter().enumerate().all(|(i, &s)| s == i as i64);
            let row_states: Vec<RowState> = rows
                .iter()
                .map(|&r| {
                    let c = &self.requests[&ids[r]].chain;
                    RowState {
                        seed: c.seed(),
                        step: c.step(),
                        mask: c
                            .stages()
                            .iter()
                            .find_map(|st| st.token_mask().map(Arc::from)),
                    }
                })
                .collect();
            let slots_t = (!identity).then(|| ops::vec_int(&slots, &d));
            // `filter` reports no logprobs.
            let lp = key
                .logprobs
                .filter(|_| select)
                .map(|(mode, n, _)| DeviceLogprobs {
                    mode,
                    n,
                    ids: g.lp_ids.as_ref().map(|t| match &slots_t {
                        Some(s) => t.clone().select(0, s.clone()),
                        None => t.clone(),
                    }),
                });
            let stages = g.stages.as_mut().expect("built above");
            let out = device_pass(
                stages,
                select_rows(logits.as_ref().expect("some rows run on the device"), rows),
                slots_t,
                &row_states,
                key.readback,
                lp,
                &d,
            );
            group_slots.push(slots);
            group_at.push(n_reg);
            for t in out {
                tx = match t {
                    Out::F(t) => tx.register(t),
                    Out::I(t) => tx.register(t),
                };
                n_reg += 1;
            }
        }
        // Start the readback now (device work is queued and, on a GPU, the
        // copy is requested); `finish` waits for it.
        let mut readback: Readback_ = Box::pin(tx.execute_async());
        pending.readback = Some(
            match futures_lite::future::block_on(futures_lite::future::poll_once(&mut readback)) {
                Some(done) => InFlight::Done(done),
                None => InFlight::Waiting(readback),
            },
        );
        pending.host_rows = host_rows;
        pending.host_at = host_at;
        pending.group_rows = group_rows;
        pending.group_at = group_at;
        pending.group_slots = group_slots;
        self.in_flight = Some(pending.mark());
        Ok(pending)
    }

    /// Wait for a submitted step's readback, run the host parts and record
    /// the tokens.
    fn finish_inner(&mut self, pending: PendingStep) -> Result<StepRows, BackendError> {
        if self.in_flight.as_ref().map(|m| m.serial) != Some(pending.serial) {
            return Err(foreign(pending));
        }
        let ids = pending.ids.clone();
        let out = self.finish_rows(pending);
        // A mask holds for one step, whatever happened in it.
        self.end_step(&ids);
        out
    }

    /// The step in flight is over (finished, failed or abandoned): clear its
    /// rows' one-step masks.
    fn end_step(&mut self, ids: &[RequestId]) {
        self.in_flight = None;
        for id in ids {
            if let Some(req) = self.requests.get_mut(id) {
                req.chain.set_token_mask(None);
            }
        }
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

    /// The decoding and host half of `finish_inner`.
    fn finish_rows(&mut self, mut pending: PendingStep) -> Result<StepRows, BackendError> {
        use std::mem::take;
        let select = pending.select;
        let ids = take(&mut pending.ids);
        let row_of = take(&mut pending.row_of);
        let host_rows = take(&mut pending.host_rows);
        let host_at = pending.host_at;
        let group_rows = take(&mut pending.group_rows);
        let group_at = take(&mut pending.group_at);
        let group_slots = take(&mut pending.group_slots);
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

        // Decode into per-row work.
        let mut work: Vec<Option<(Work, Option<DeviceRowLp>)>> = (0..b).map(|_| None).collect();
        let raw: &[f32] = match host_at {
            Some(i) => as_f32(&data[i])?,
            None => &[],
        };
        for (j, &r) in host_rows.iter().enumerate() {
            work[r] = Some((Work::Raw(j * v), None));
        }
        for ((key, rows), &at) in group_rows.iter().zip(&group_at) {
            let mut next = at;
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
            let rows_n = rows.len().max(1);
            let k = ints.len() / rows_n;
            for (j, &r) in rows.iter().enumerate() {
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

        // The host part of every row, in parallel; each request's own chain.
        let mut reqs: Vec<(usize, &mut Request)> = self
            .requests
            .iter_mut()
            .filter_map(|(id, req)| row_of.get(id).map(|&r| (r, req)))
            .collect();
        reqs.sort_unstable_by_key(|(r, _)| *r);
        let host = |req: &mut Request, w: Option<(Work, Option<DeviceRowLp>)>| {
            let (w, lp) = w.expect("every row has work");
            let res = run_host(req, w, lp, raw, v, select);
            if select && let Ok((RowResult::Token(t), _)) = &res {
                req.outputs.push(*t);
                req.history.push((*t, TokenOrigin::Output));
            }
            res
        };
        // One row: no thread pool round trip (a few microseconds).
        let results: Vec<Result<(RowResult, Option<Logprobs>), SampleError>> = if reqs.len() == 1 {
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

        // Device state records each group's tokens, per slot.
        if select {
            for ((key, rows), slots) in group_rows.iter().zip(&group_slots) {
                let Some(g) = self.groups.get_mut(key) else {
                    continue;
                };
                let Some(stages) = &mut g.stages else {
                    // Rebuilt before the next step, from the histories.
                    continue;
                };
                let mut per_slot = vec![None; g.members.len()];
                for (&r, &s) in rows.iter().zip(slots) {
                    if let Ok((RowResult::Token(t), _)) = results[r] {
                        per_slot[s as usize] = Some(t);
                    }
                }
                for st in stages.iter_mut().filter(|st| st.needs_history()) {
                    st.accept(&per_slot);
                }
            }
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

/// The error for another batch's step: the step itself travels back in it
/// (a `PendingStep` has exactly one owner batch: the only step of this
/// batch that can exist is its step in flight).
fn foreign(pending: PendingStep) -> BackendError {
    BackendError::ForeignStep {
        step: ReturnedStep::new(pending),
    }
}

/// Whether a mask given to `chain` acts: it has a `mask` stage before its
/// first selecting stage (stages after it never run).
fn masks_act(chain: &Chain) -> bool {
    for st in chain.stages() {
        match st.spec() {
            Some(sp) if sp.kind() == StageKind::Mask => return true,
            Some(sp) if sp.selects() => return false,
            _ => {}
        }
    }
    false
}

/// Logprobs a device computed for one row, decoded from the readback.
struct DeviceRowLp {
    /// Top entries, canonical order (logit descending, ties to the lowest
    /// id), finite logprobs only.
    top: Vec<(TokenId, f32)>,
    /// Requested ids' values, in the order asked.
    requested: Vec<f32>,
    /// The sampled token's value (a fully offloaded chain).
    sampled: Option<f32>,
    /// `raw` logprobs of the read-back candidates `(id, logprob)` (a
    /// candidates readback): the host's token is looked up there.
    cand: Option<Vec<(i64, f32)>>,
}

impl DeviceRowLp {
    /// From one row's entries: `n` top, `m` requested, then (when present)
    /// the sampled token's.
    fn decode(
        ids: &[i64],
        vals: &[f32],
        n: usize,
        m: usize,
        vocab: usize,
        cand: Option<Vec<(i64, f32)>>,
    ) -> Self {
        // In the device's (canonical) order: by logit, ties to the lowest id.
        let top: Vec<(TokenId, f32)> = ids[..n]
            .iter()
            .zip(&vals[..n])
            .filter(|&(&i, &l)| i >= 0 && (i as u64) < vocab as u64 && l.is_finite())
            .map(|(&i, &l)| (i as TokenId, l))
            .collect();
        Self {
            top,
            requested: vals[n..n + m].to_vec(),
            sampled: vals.get(n + m).copied(),
            cand,
        }
    }

    fn into_logprobs(self, spec: &sampler_core::LogprobsSpec, token: TokenId) -> Logprobs {
        let value = match (&self.sampled, &self.cand) {
            (Some(v), _) => *v,
            (None, Some(c)) => c
                .iter()
                .find(|(i, _)| *i == token as i64)
                .map_or(f32::NEG_INFINITY, |p| p.1),
            (None, None) => f32::NEG_INFINITY,
        };
        Logprobs {
            token: (token, value),
            top: self.top,
            requested: spec.token_ids.iter().copied().zip(self.requested).collect(),
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
            let mut c = c?;
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
                    req.chain.apply_from(start, &mut c)?;
                    let (t, lp) = req.chain.commit_logprobs(&c, s)?;
                    Ok((RowResult::Token(t), Some(lp)))
                }
                (None, _) => req
                    .chain
                    .sample_from(start, &mut c)
                    .map(|t| (RowResult::Token(t), None)),
            }
        }
        (Work::Cands(c, start), false) => {
            let mut c = c?;
            req.chain.apply_from(start, &mut c)?;
            Ok((RowResult::Cands(c), None))
        }
    }
}

/// What a request's own plan says.
struct Planned {
    plan: Plan,
    key: GroupKey,
    keep: usize,
    drop_masked: bool,
}

/// Plan one request alone: each device-capable stage's `init` at one slot,
/// along the prefix.
fn plan_request(
    spec: &ChainSpec,
    tail: &[PlanStage],
    vocab: usize,
    device: &Device,
    policy: OffloadPolicy,
    host_kernels: bool,
) -> Planned {
    let policy = if host_kernels {
        OffloadPolicy::Off
    } else {
        policy
    };
    let mut plan_stages = Vec::with_capacity(spec.stages.len());
    let mut width = vocab;
    let mut has_ids = false;
    let mut prefix_alive = policy != OffloadPolicy::Off;
    for (i, st) in spec.stages.iter().enumerate() {
        let active = !st.is_noop();
        let mut answer = Ok(());
        if active && prefix_alive && st.kind().meta().device_hook {
            if vocab as u64 > DEVICE_VOCAB_LIMIT {
                answer = Err(DeviceRefusal::VocabBeyondDeviceIds {
                    vocab,
                    limit: DEVICE_VOCAB_LIMIT,
                });
            } else if let Some(mut ds) = build_device_stage(i, std::slice::from_ref(st)) {
                let ctx = InitContext {
                    batch: 1,
                    vocab,
                    width,
                    has_ids,
                    device: device.clone(),
                };
                answer = ds.init(&ctx);
                if answer.is_ok() {
                    let w = ds.out_width(width);
                    has_ids |= w != width;
                    width = w;
                }
            }
            prefix_alive = answer.is_ok();
        } else if active {
            prefix_alive = false;
        }
        plan_stages.push(PlanStage {
            name: st.name().to_string(),
            spec: Some(st.clone()),
            device: answer,
        });
    }
    plan_stages.extend(tail.iter().cloned());
    let mut plan = plan::plan(&plan_stages, vocab, policy);
    // The host drops the `-inf` candidates a masking device stage left
    // (top_p, min_p, epsilon, eta); a later device stage that bans
    // candidates (`-inf`, kept on the CPU) would make them
    // indistinguishable. Unless the whole chain runs on the device, the
    // first such stage goes to the host.
    if plan.readback != Readback::TokenIds {
        let mut masked = false;
        for &i in &plan.device {
            let st = &spec.stages[i];
            if masked && st.bans() {
                plan_stages[i].device = Err(DeviceRefusal::BansAfterMask);
                plan = plan::plan(&plan_stages, vocab, policy);
                break;
            }
            masked |= st.kind().meta().device_effects.masks_removed;
        }
    }
    if host_kernels && !plan.host.is_empty() {
        plan.host_reason = Some(HostReason::CpuDevice);
    }
    let lp = spec.logprobs.as_ref();
    if lp.is_some_and(|l| l.mode == LogprobsMode::Raw)
        && matches!(plan.readback, Readback::FullLogits { .. })
        && !plan.device.is_empty()
    {
        plan = plan::plan(&plan_stages, vocab, OffloadPolicy::Off);
        plan.host_reason = Some(HostReason::RawLogprobs);
    }
    let mut keep = vocab;
    for &i in &plan.device {
        let st = &spec.stages[i];
        if st.kind().meta().device_effects.narrows
            && let Some(k) = st.survivors()
        {
            keep = keep.min(effective_k(k as u64, keep));
        }
    }
    let drop_masked = plan
        .device
        .iter()
        .any(|&i| spec.stages[i].kind().meta().device_effects.masks_removed);
    let key = GroupKey {
        device: plan
            .device
            .iter()
            .map(|&i| {
                let st = &spec.stages[i];
                (i, st.kind(), st.survivors().map(|k| k.min(vocab)))
            })
            .collect(),
        readback: plan.readback,
        // The device computes raw logprobs whenever it runs a prefix, and
        // processed ones when it runs the whole chain.
        logprobs: lp
            .filter(|l| {
                !plan.device.is_empty()
                    && (l.mode == LogprobsMode::Raw || plan.readback == Readback::TokenIds)
            })
            .map(|l| (l.mode, l.top_n, l.token_ids.len())),
    };
    Planned {
        plan,
        key,
        keep,
        drop_masked,
    }
}

enum Out {
    F(Tensor<2>),
    I(Tensor<1, Int>),
}

/// What a group's device computes for logprobs.
struct DeviceLogprobs {
    mode: LogprobsMode,
    /// Top entries per row.
    n: usize,
    /// The step rows' requested ids `[B, m]` (`None` when `m == 0`).
    ids: Option<Tensor<2, Int>>,
}

/// `(l - max) - ln S` per row `[B, N]`, `S = sum exp(l - max)` (`-inf`
/// stays `-inf`). The sum runs
/// in blocks of [`ops::DIST_BLOCK`] so that its rounding does not grow with
/// the vocabulary.
fn log_softmax(l: &Tensor<2>) -> Tensor<2> {
    let [b, n] = l.dims();
    let (e, m) = ops::exps(l);
    let s = if n > ops::DIST_BLOCK && n % ops::DIST_BLOCK == 0 {
        e.reshape([b, n / ops::DIST_BLOCK, ops::DIST_BLOCK])
            .sum_dim(2)
            .reshape([b, n / ops::DIST_BLOCK])
            .sum_dim(1)
    } else if n > ops::DIST_BLOCK {
        let full = n / ops::DIST_BLOCK * ops::DIST_BLOCK;
        let head = e
            .clone()
            .slice([0..b, 0..full])
            .reshape([b, full / ops::DIST_BLOCK, ops::DIST_BLOCK])
            .sum_dim(2)
            .reshape([b, full / ops::DIST_BLOCK])
            .sum_dim(1);
        head.add(e.slice([0..b, full..n]).sum_dim(1))
    } else {
        e.sum_dim(1)
    };
    // `(l - max) - ln S`, not `l - (max + ln S)`: at large magnitudes
    // `max + ln S` rounds `ln S` away (two `f32::MAX` logits would both get
    // 0); this form is the CPU's, to the last bit of each subtraction.
    l.clone().sub(wide(m, n)).sub(wide(s.log(), n))
}

/// The positions `[B, k]` (`k = min(n, N)`) of the canonical top `n` by
/// `logits` `[B, N]`, in the canonical order (logit descending, ties to the
/// lowest `order` id; ranked by the logits, as the CPU does, not by their
/// rounded logprobs). Every row takes `k`, so every position is a
/// candidate (no padding inside `k`).
fn top_positions(
    logits: &Tensor<2>,
    order: &Tensor<2, Int>,
    n: usize,
    d: &Device,
) -> Tensor<2, Int> {
    let [b, w] = logits.dims();
    let k = n.min(w);
    let n_row = ops::col_int(&vec![k as i64; b], d);
    let (_, pos, _) = ops::canonical_topk_positions(logits, order, &n_row, k);
    // burn's `topk` leaves equal logits in any order: rank the `k` chosen
    // (pairwise, `k <= 20`) and put each at its rank.
    let chosen = logits.clone().gather(1, pos.clone());
    let (rank, _) = ops::rank_and_mass_before(
        &chosen,
        &order.clone().gather(1, pos.clone()),
        &chosen.zeros_like(),
    );
    Tensor::<2, Int>::zeros([b, k], d).scatter(1, rank, pos, burn_tensor::IndexingUpdateOp::Add)
}

/// `(ids, values)` `[B, k]` padded to `[B, n]` with id `-1` / `-inf`.
fn pad_entries(
    ids: Tensor<2, Int>,
    vals: Tensor<2>,
    n: usize,
    d: &Device,
) -> (Tensor<2, Int>, Tensor<2>) {
    let [b, k] = ids.dims();
    if k == n {
        return (ids, vals);
    }
    let pad_i = Tensor::<2, Int>::zeros([b, n - k], d).sub_scalar(1);
    let pad_f = Tensor::<2>::full([b, n - k], f32::NEG_INFINITY, d);
    (
        Tensor::cat(vec![ids, pad_i], 1),
        Tensor::cat(vec![vals, pad_f], 1),
    )
}

/// The top `n` entries ([`top_positions`]) with their values in `lp`:
/// `(ids, values)` `[B, n]` (ids through `gather_ids` when positions are
/// not token ids), padded past the width.
fn lp_top(
    logits: &Tensor<2>,
    lp: &Tensor<2>,
    order: &Tensor<2, Int>,
    gather_ids: Option<&Tensor<2, Int>>,
    n: usize,
    d: &Device,
) -> (Tensor<2, Int>, Tensor<2>) {
    let pos = top_positions(logits, order, n, d);
    let vals = lp.clone().gather(1, pos.clone());
    let ids = match gather_ids {
        Some(g) => g.clone().gather(1, pos),
        None => pos,
    };
    pad_entries(ids, vals, n, d)
}

/// Logprobs of a full row `lp` `[B, V]` (position = token id; raw, or
/// processed where no stage narrowed the row): the top `n` entries and the
/// requested ids `want` `[B, m]`, in **one** gather. Two gathers of one
/// source whose index widths differ read the narrower one's values at the
/// wrong positions on wgpu (burn-fusion 0.22: token 0's logprob in the top
/// entry; `tests/tests/device_ops.rs` pins the one-gather form).
fn full_row_entries(
    logits: &Tensor<2>,
    lp: &Tensor<2>,
    pos: &Tensor<2, Int>,
    n: usize,
    want: Option<&Tensor<2, Int>>,
    d: &Device,
) -> Vec<(Tensor<2, Int>, Tensor<2>)> {
    let top = (n > 0).then(|| top_positions(logits, pos, n, d));
    let k = top.as_ref().map_or(0, |p| p.dims()[1]);
    let index: Vec<Tensor<2, Int>> = top.iter().cloned().chain(want.cloned()).collect();
    if index.is_empty() {
        return Vec::new();
    }
    let vals = lp.clone().gather(1, Tensor::cat(index, 1));
    let [b, width] = vals.dims();
    let mut out = Vec::with_capacity(2);
    if let Some(p) = top {
        out.push(pad_entries(p, vals.clone().slice([0..b, 0..k]), n, d));
    }
    if let Some(w) = want {
        out.push((w.clone(), vals.slice([0..b, k..width])));
    }
    out
}

/// Values of `lp` `[B, N]` at the tokens `want` `[B, m]`, where position
/// `j` of row `b` holds token `order[b, j]`;
/// `-inf` where a token is absent. Small `m · N`: one `[B, m, N]`
/// comparison; larger: the row scattered back to the vocabulary through
/// `gather_ids` (in-vocabulary ids; padding positions, whose `order` id is
/// `>= vocab`, contribute nothing), then a gather.
fn lp_at(
    lp: &Tensor<2>,
    order: &Tensor<2, Int>,
    gather_ids: Option<&Tensor<2, Int>>,
    want: &Tensor<2, Int>,
    vocab: usize,
) -> Tensor<2> {
    /// `[B, m, N]` comparisons up to this many per row.
    const COMPARE_MAX: usize = 1 << 16;
    let [b, w] = lp.dims();
    let [_, m] = want.dims();
    match gather_ids {
        Some(ids) if m * w > COMPARE_MAX => {
            let d = lp.device();
            let pad = order.clone().greater_equal_elem(vocab as i64);
            let vals = lp.clone().mask_fill(pad.clone(), 0.0);
            let ones = Tensor::<2>::ones([b, w], &d).mask_fill(pad, 0.0);
            let op = burn_tensor::IndexingUpdateOp::Add;
            let full = Tensor::<2>::zeros([b, vocab], &d).scatter(1, ids.clone(), vals, op);
            let present = Tensor::<2>::zeros([b, vocab], &d)
                .scatter(1, ids.clone(), ones, op)
                .greater_elem(0.5);
            full.mask_fill(present.bool_not(), f32::NEG_INFINITY)
                .gather(1, want.clone())
        }
        _ => {
            let eq = order
                .clone()
                .reshape([b, 1, w])
                .expand([b, m, w])
                .equal(want.clone().reshape([b, m, 1]).expand([b, m, w]));
            lp.clone()
                .reshape([b, 1, w])
                .expand([b, m, w])
                .mask_fill(eq.bool_not(), f32::NEG_INFINITY)
                .max_dim(2)
                .reshape([b, m])
        }
    }
}

/// One group's device pass over its rows: validation, the stages, the
/// outputs its readback registers (`[B]` codes, or `[B, K]` ids and logits,
/// or `[B, V]` logits), then, with logprobs, `[B, L]` ids and values (and
/// for `raw` logprobs with a candidates readback the candidates' `[B, K]`
/// raw logprobs).
fn device_pass(
    stages: &mut [Box<dyn DeviceStage>],
    logits: Tensor<2>,
    slots: Option<Tensor<1, Int>>,
    rows: &[RowState],
    readback: Readback,
    lp: Option<DeviceLogprobs>,
    d: &Device,
) -> Vec<Out> {
    let [b, v] = logits.dims();
    // Row validation in one reduction: the key is 2i at a NaN, 2i + 1 at a
    // +inf and 2V elsewhere, so the row minimum m is the first bad position
    // (m / 2) and its kind (m % 2), and the status code is -m - 2 (NaN at i:
    // -2i - 2, +inf at i: -2i - 3; a valid row's code is never read).
    let pos = ops::positions(b, v, d);
    let none = 2 * v as i64;
    let validate = |logits: &Tensor<2>| {
        kernel_first_bad(logits).unwrap_or_else(|| {
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
    // Invalid rows are zeroed for the stages, unless the first stage takes
    // them as they are (a kernel that validates them in its own pass and
    // whose invalid rows' outputs are replaced by their codes below): then
    // no validation pass and no `[B, V]` copy here.
    // Stages that only hand their work on (penalties) leave that choice to
    // the stage after them, which must then take their work too.
    let deferring = stages.iter().take_while(|st| st.defers_to_next()).count();
    let unsanitised = lp.is_none()
        && stages.get(deferring).is_some_and(|st| {
            (deferring == 0 || st.applies_penalties()) && st.takes_unsanitised_rows(b, v, d)
        });
    let (validated, clean) = if unsanitised {
        (None, logits.clone())
    } else {
        let first_bad = validate(&logits);
        let invalid = first_bad.clone().lower_elem(none);
        let clean = logits.clone().mask_fill(wide(invalid.clone(), v), 0.0);
        (Some((first_bad, invalid)), clean)
    };

    // Raw logprobs come from the input row (invalid rows fail anyway).
    let raw_lp = lp
        .as_ref()
        .filter(|l| l.mode == LogprobsMode::Raw)
        .map(|_| log_softmax(&clean));
    let mut entries: Vec<(Tensor<2, Int>, Tensor<2>)> = Vec::new();
    if let (Some(l), Some(raw)) = (&lp, &raw_lp) {
        entries.extend(full_row_entries(&clean, raw, &pos, l.n, l.ids.as_ref(), d));
    }

    let mut data = StepData {
        logits: clean,
        probs: None,
        ids: None,
        order_ids: None,
        sampled: None,
        sampled_codes: false,
        penalties: None,
        nucleus: None,
        invalid: validated.as_ref().map(|(_, invalid)| invalid.clone()),
        first_bad: None,
        slots,
        batch: b,
        vocab: v,
        width: v,
        device: d.clone(),
    };
    // Processed logprobs: the candidates entering the (device) selecting stage.
    let processed = lp
        .as_ref()
        .is_some_and(|l| l.mode == LogprobsMode::Processed)
        && readback == Readback::TokenIds;
    let mut before_select = None;
    let last = stages.len().saturating_sub(1);
    for (i, st) in stages.iter_mut().enumerate() {
        if st.needs_step_input() {
            st.set_input(rows);
        }
        if !st.takes_pending_nucleus() {
            materialize_nucleus(&mut data);
        }
        if !st.applies_penalties() {
            apply_history_penalties(&mut data);
        }
        if processed && i == last {
            // The candidates the draw sees: the pending top_p applied.
            materialize_nucleus(&mut data);
            let order = data.order_ids.clone().or(data.ids.clone());
            before_select = Some((data.logits.clone(), order, data.ids.clone()));
        }
        st.apply(&mut data);
    }
    // A top_p or penalties last in the device prefix: the host suffix and
    // the readback get them applied.
    materialize_nucleus(&mut data);
    apply_history_penalties(&mut data);
    if let (Some(l), Some((cl, order, gids))) = (&lp, &before_select) {
        let plp = log_softmax(cl);
        match order {
            // A full row (positions are token ids): as for raw logprobs.
            None => entries.extend(full_row_entries(cl, &plp, &pos, l.n, l.ids.as_ref(), d)),
            Some(order) => {
                if l.n > 0 {
                    entries.push(lp_top(cl, &plp, order, gids.as_ref(), l.n, d));
                }
                if let Some(want) = &l.ids {
                    entries.push((want.clone(), lp_at(&plp, order, gids.as_ref(), want, v)));
                }
            }
        }
    }
    // The validation keys: from before the stages, from the first stage's
    // own pass, or (a first stage that did not validate) from the input now.
    let (first_bad, checked) = match (validated, data.first_bad.take()) {
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
    let mut out = Vec::with_capacity(5);
    let mut raw_cands = None;
    match readback {
        Readback::TokenIds => {
            let sampled = data
                .sampled
                .unwrap_or_else(|| Tensor::<1, Int>::zeros([b], d).sub_scalar(1));
            if lp.is_some() {
                // The token's value by comparison: a gather at the token the
                // device just drew returned another token's value on wgpu
                // (lavapipe, `dist`'s block path); a failed row (-1) matches
                // nothing.
                let at = sampled.clone().reshape([b, 1]);
                let value = match (&raw_lp, &before_select) {
                    (Some(raw), _) => lp_at(raw, &pos, None, &at, v),
                    (None, Some((cl, order, _))) => {
                        let w = cl.dims()[1];
                        let ord = order
                            .clone()
                            .unwrap_or_else(|| pos.clone().slice([0..b, 0..w]));
                        lp_at(&log_softmax(cl), &ord, None, &at, v)
                    }
                    (None, None) => Tensor::<2>::full([b, 1], f32::NEG_INFINITY, d),
                };
                entries.push((at, value));
            }
            let written = data.sampled_codes.then(|| sampled.clone());
            let codes = written.or_else(|| kernel_codes(&sampled, &first_bad, v));
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
            if let Some(raw) = &raw_lp {
                raw_cands = Some(raw.clone().gather(1, ids.clone()));
            }
            let (invalid, code) = masks();
            let first = ops::positions(b, k, d)
                .equal_elem(0)
                .bool_and(wide(invalid, k));
            let ids: Tensor<2, Int> = ids.mask_where(first, wide(code, k)).cast(IntDType::I32);
            out.push(Out::I(ids.reshape([b * k])));
            out.push(Out::F(data.logits));
        }
        Readback::FullLogits { .. } => {
            let (invalid, _) = masks();
            out.push(Out::F(data.logits.mask_where(wide(invalid, v), logits)));
        }
    }
    if lp.is_some() {
        let (ids, vals): (Vec<_>, Vec<_>) = entries.into_iter().unzip();
        if !ids.is_empty() {
            let ids = Tensor::cat(ids, 1);
            let [_, e] = ids.dims();
            out.push(Out::I(ids.cast(IntDType::I32).reshape([b * e])));
            out.push(Out::F(Tensor::cat(vals, 1)));
        }
        if let Some(c) = raw_cands {
            out.push(Out::F(c));
        }
    }
    out
}

/// The row validation kernel on a cubecl device (same keys as the recipe
/// in [`device_pass`]); `None` elsewhere.
#[cfg(feature = "cubecl-kernels")]
pub(crate) fn kernel_first_bad(logits: &Tensor<2>) -> Option<Tensor<2, Int>> {
    crate::kernels::first_bad(logits)
}

#[cfg(not(feature = "cubecl-kernels"))]
pub(crate) fn kernel_first_bad(_logits: &Tensor<2>) -> Option<Tensor<2, Int>> {
    None
}

/// The token codes kernel on a cubecl device: `[B]` i32, the sampled token
/// or the row's status code; `None` elsewhere.
#[cfg(feature = "cubecl-kernels")]
fn kernel_codes(
    sampled: &Tensor<1, Int>,
    first_bad: &Tensor<2, Int>,
    vocab: usize,
) -> Option<Tensor<1, Int>> {
    crate::kernels::token_codes(sampled, first_bad, vocab)
}

#[cfg(not(feature = "cubecl-kernels"))]
fn kernel_codes(
    _sampled: &Tensor<1, Int>,
    _first_bad: &Tensor<2, Int>,
    _vocab: usize,
) -> Option<Tensor<1, Int>> {
    None
}

fn read_i64(d: &TensorData) -> Vec<i64> {
    d.iter::<i64>().collect()
}

fn as_f32(d: &TensorData) -> Result<&[f32], BackendError> {
    d.as_slice::<f32>().map_err(|e| {
        BackendError::Readback(format!(
            "expected f32 logits, the device returned {:?}: {e:?}",
            d.dtype()
        ))
    })
}
