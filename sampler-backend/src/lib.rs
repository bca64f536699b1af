//! # sampler-backend
//!
//! burn device hooks for sampler-chain stages; [`SamplingBatch`], the
//! serving batch that runs each request's device prefix next to the logits
//! and the rest on the CPU (requests join and leave between steps, any chain
//! per request, any subset of rows in any order per step); the fixed-batch
//! [`Executor`] over it; the readback formats; run-time device selection.
//! The serving loop and its costs: docs/serving.md in the repository.
//!
//! ## The per-step loop (fixed batch)
//!
//! ```no_run
//! # #[cfg(feature = "flex")] {
//! use sampler_backend::{Executor, parse_device};
//! use sampler_core::{ChainSpec, OffloadPolicy, StageSpec};
//! use burn_tensor::Tensor;
//!
//! let device = parse_device("flex").unwrap();
//! let chain = ChainSpec::new(vec![StageSpec::TopK { k: 40 }, StageSpec::Dist], Some(42));
//! let mut exec = Executor::new(vec![chain; 2], 8, &device, OffloadPolicy::Auto).unwrap();
//! exec.accept_prompt(0, &[1, 2, 3]).unwrap(); // history for penalties (state change)
//! let logits = Tensor::<2>::zeros([2, 8], &device); // [batch, vocab], from the model
//! let out = exec.step(logits).unwrap();       // one batched pass + one readback
//! // inside `step`:
//! // 1. validate rows (NaN / +inf -> that row's error, others go on);
//! // 2. `set_input`: upload uniforms (contract 7) and history deltas;
//! // 3. `apply`: append each device stage's tensor ops;
//! // 4. read back once: token ids (4 B/row), or the k survivors after a top_k
//! //    (8 k B/row), or full rows (4 V B/row);
//! // 5. the host suffix runs on sampler-cpu (`Chain::sample_from`);
//! // 6. `accept`: every row's chain and the device state record the token.
//! assert_eq!(out.tokens.len(), 2);
//! println!("{} bytes read back", out.bytes_read);
//! # }
//! ```
//!
//! `Executor::plan` is a pure check (what runs where); `step`,
//! `accept_prompt` and `reset` change state.
//!
//! Design notes: `docs/architecture.md`.

#![warn(missing_docs)]

mod batch;
mod device;
mod error;
mod executor;
mod fusion;
pub mod kernels;
pub mod launches;
mod logprobs;
pub mod ops;
mod planner;
pub mod readback;
mod recipes;
mod stage;
pub mod stages;
mod step;

/// The most children one [`SamplingBatch::fork`] call makes (a request's
/// `n` is at most `MAX_FORK + 1`).
pub const MAX_FORK: usize = sampler_core::MAX_SEQUENCES - 1;

pub use batch::pending::{PendingStep, ReturnedStep};
pub use batch::request::RequestId;
pub use batch::verify::{BatchVerify, Draft, PendingVerify};
pub use batch::{BatchFilter, BatchStep, BatchTopLogprobs, SamplingBatch, is_cpu_device};
pub use burn_tensor;
pub use burn_tensor::{Device, Tensor, TensorData};
pub use device::{
    compiled_devices, is_software_device, parse_device, probe_device, resolve_device,
    usable_devices,
};
pub use error::BackendError;
pub use executor::{Executor, FilterOutput, StepOutput};
pub use sampler_cpu::speculative::Verified;
pub use stage::{
    CutRule, DeviceStage, Fusable, HistoryPenalties, InitContext, RowState, StepData,
    build_device_stage,
};
