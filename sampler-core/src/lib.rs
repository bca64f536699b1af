//! # sampler-core
//!
//! The vocabulary of sampler-chain, with no burn dependency: a user who only
//! samples on the CPU never compiles a tensor library.
//!
//! * [`TokenId`], [`Candidates`]: one row's working set (ids, logits, probs, flags, selection);
//! * [`StageKind`], [`StageMeta`]: static metadata of every stage (contract 2);
//! * [`StageSpec`], [`ChainSpec`]: declarative chains (what `chain-config` builds);
//! * [`Sampler`], [`Chain`]: the CPU hooks `apply` / `accept` / `reset` (contract 3);
//! * [`plan`]: the planner and readback formats (contracts 5 and 6);
//! * [`logprobs`]: raw and processed log-probabilities of a step;
//! * [`inspect`]: a chain's effect on one row, stage by stage (debugging);
//! * [`rng`]: counter-based randomness (contract 7);
//! * [`SampleError`], [`ParamError`]: structured errors (contract 9).
//!
//! Implementations of the stages live in `sampler-cpu`; device hooks in
//! `sampler-backend`.

#![warn(missing_docs)]

mod candidates;
mod chain;
mod error;
pub mod inspect;
pub mod logprobs;
mod meta;
pub mod plan;
mod registry;
pub mod rng;
mod sampler;
pub mod sequences;
mod spec;
pub mod structured;

pub use candidates::{Candidates, RawCandidates, desc_cmp, validate_logits};
pub mod numerics;
pub use chain::{Chain, RowKernels};
pub use error::{ParamError, SampleError};
pub use inspect::{CandidateSet, Inspection, StageView};
pub use logprobs::{Logprobs, LogprobsMode, LogprobsSpec};
pub use meta::{
    DeviceEffects, Effects, ParamField, ParamKind, ParamMeta, ParamValue, SetParamError, StageMeta,
};
pub use plan::{DeviceRefusal, HostReason, OffloadPolicy, Plan, PlanStage, Readback};
pub use registry::{DYNATEMP_EXPONENT_MAX, DYNATEMP_RANGE_MAX, StageKind};
pub use rng::RowRng;
pub use sampler::{Sampler, StageContext, TokenOrigin};
pub use sequences::{BeamSpec, EarlyStopping, MAX_SEQUENCES, Sequences, SequencesError};
pub use spec::{ChainSpec, GREEDY_TEMPERATURE, HistoryScope, StageSpec};
pub use structured::{ConstraintError, StructuredOutput, TokenConstraint};

/// A token id: an index into the vocabulary, `0..vocab`.
pub type TokenId = u32;
