//! [`BackendError`]: what can go wrong for the whole batch (per-row problems
//! are [`sampler_core::SampleError`]s in [`crate::StepOutput::tokens`]).

use sampler_core::TokenId;
use thiserror::Error;

/// An error that concerns the whole executor or the whole step.
///
/// Per-row problems (a NaN row, an all-`-inf` row) never use this type: they
/// are reported per row in [`crate::StepOutput::tokens`] and the other rows
/// are sampled normally.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BackendError {
    /// The device string is not known, or names a backend whose cargo
    /// feature was not compiled in.
    #[error("unknown or unavailable device `{given}`: {reason}; compiled-in choices: {}", available.join(", "))]
    UnknownDevice {
        /// The string given.
        given: String,
        /// Why it was refused.
        reason: String,
        /// The device names this build accepts ([`crate::compiled_devices`]).
        available: Vec<&'static str>,
    },
    /// The device's backend is compiled in but the device cannot run on this
    /// machine ([`crate::probe_device`]).
    #[error("device `{given}` is not usable here: {reason}")]
    DeviceUnavailable {
        /// The string given.
        given: String,
        /// Why.
        reason: String,
    },
    /// `Executor::new` was given no rows.
    #[error("the executor needs at least one row (chain spec)")]
    EmptyBatch,
    /// The vocabulary size is 0.
    #[error("the vocabulary is empty: nothing can be sampled")]
    EmptyVocab,
    /// The vocabulary is larger than token ids can address (`u32`).
    #[error(
        "a vocabulary of {vocab} tokens is larger than token ids (u32) can address: at most 4294967296"
    )]
    VocabTooLarge {
        /// The vocabulary size given.
        vocab: usize,
    },
    /// A stage parameter is invalid (from `ChainSpec::validate`).
    #[error("row {row}, stage {stage}: {source}")]
    Param {
        /// Row.
        row: usize,
        /// Stage index in the chain.
        stage: usize,
        /// The parameter error.
        source: sampler_core::ParamError,
    },
    /// The CPU chain of a row could not be built.
    #[error("row {row}: the CPU chain could not be built: {source}")]
    Build {
        /// Row.
        row: usize,
        /// The CPU builder's error: the stage index and its parameter error.
        #[source]
        source: sampler_cpu::ChainBuildError,
    },
    /// The logits tensor does not have the `[rows, vocab]` shape of the step
    /// (one row per request stepped, the batch's vocabulary).
    #[error("logits have shape {found:?}, expected [batch = {batch}, vocab = {vocab}]")]
    Shape {
        /// Shape of the tensor given.
        found: Vec<usize>,
        /// Rows of the step.
        batch: usize,
        /// Vocabulary of the batch.
        vocab: usize,
    },
    /// The logits live on another device than the batch's.
    #[error("logits are on {found}, but the batch was built for {expected}")]
    WrongDevice {
        /// Device of the tensor.
        found: String,
        /// Device of the executor.
        expected: String,
    },
    /// A row index out of range (e.g. in `accept_prompt`).
    #[error("row {row} is out of range for a batch of {batch}")]
    RowOutOfRange {
        /// The index given.
        row: usize,
        /// Rows in the batch.
        batch: usize,
    },
    /// A request's chain has a parameter out of range (from
    /// `ChainSpec::validate`): which stage, which field, what range.
    #[error("stage {stage}: {source}")]
    InvalidRequest {
        /// Stage index in the chain.
        stage: usize,
        /// The parameter error.
        source: sampler_core::ParamError,
    },
    /// A request's CPU chain could not be built.
    #[error("the CPU chain could not be built: {source}")]
    RequestBuild {
        /// The CPU builder's error: the stage index and its parameter error.
        #[source]
        source: sampler_cpu::ChainBuildError,
    },
    /// A request id that is not (or no longer) in the batch.
    #[error("request {id} is not in the batch (never inserted, or removed)")]
    UnknownRequest {
        /// The id given.
        id: u64,
    },
    /// A step names one request in two rows.
    #[error(
        "request {id} is in rows {first} and {second} of one step: a request samples once per step"
    )]
    DuplicateRow {
        /// The request.
        id: u64,
        /// Its first row.
        first: usize,
        /// The repeated row.
        second: usize,
    },
    /// A pipelined step is in flight ([`crate::SamplingBatch::submit`]):
    /// finish it before stepping again or changing a request.
    #[error("a submitted step is still in flight: call `finish` before `{call}`")]
    StepPending {
        /// The call refused.
        call: &'static str,
    },
    /// `finish` or `cancel` was given a step submitted to another batch.
    /// The step is not lost: [`ReturnedStep::take`](crate::ReturnedStep::take) gives it back, to be
    /// finished (or cancelled) on its own batch.
    #[error("step {} was submitted to another batch: take it back from the error and finish it there", step.serial())]
    ForeignStep {
        /// The step, given back.
        step: crate::batch::pending::ReturnedStep,
    },
    /// A token mask of the wrong length (`ceil(vocab / 32)` `u32` words).
    #[error(
        "request {id}: the token mask has {found} u32 words, expected ceil(vocab / 32) = {expected}"
    )]
    MaskLength {
        /// The request.
        id: u64,
        /// Words given.
        found: usize,
        /// Words expected.
        expected: usize,
    },
    /// A mask was given to a request whose chain has no `mask` stage
    /// before its selecting stage (a stage after it never runs).
    #[error(
        "request {id} has no `mask` stage before its selecting stage: add one where the mask applies"
    )]
    NoMaskStage {
        /// The request.
        id: u64,
    },
    /// [`crate::SamplingBatch::commit`] was given a token outside the
    /// vocabulary.
    #[error("request {id}: token {token} is outside the vocabulary (0..{vocab})")]
    TokenOutOfRange {
        /// The request.
        id: u64,
        /// The token given.
        token: TokenId,
        /// The vocabulary size.
        vocab: usize,
    },
    /// [`crate::SamplingBatch::fork`] asked for no children or more than
    /// [`crate::MAX_FORK`].
    #[error("request {id}: cannot fork {n} children: expected 1 to {max}")]
    ForkCount {
        /// The request.
        id: u64,
        /// Children asked for.
        n: usize,
        /// The most allowed ([`crate::MAX_FORK`]).
        max: usize,
    },
    /// [`crate::SamplingBatch::top_logprobs`] asked for no entries.
    #[error("top_logprobs: k = {k}: expected at least 1")]
    TopCount {
        /// The count asked for.
        k: usize,
    },
    /// Reading the step's results back from the device failed.
    #[error("device readback failed: {0}")]
    Readback(String),
}
