//! # sampler-cpu
//!
//! The CPU reference implementation of every sampler-chain stage: the
//! semantics oracle that device paths are compared against, with fast paths
//! (no full-vocabulary sort where the kept set is small).
//!
//! Semantics follow llama.cpp's `src/llama-sampler.cpp` with the project's
//! deterministic decisions (ties by ascending token id, canonical id-order
//! `dist`, counter-based randomness); see `docs/semantics.md`.
//!
//! The usage loop for one row:
//! 1. [`build_chain`] from a [`ChainSpec`] (parameters are validated);
//! 2. per step: fill a [`Candidates`] from the row's logits `[vocab]` and call
//!    [`Chain::sample`] (applies every stage, accepts the token, advances the
//!    step); or call [`sample_batch`] for `[batch, vocab]` logits with one
//!    chain per row.
//!
//! ```
//! use sampler_core::{ChainSpec, StageSpec};
//! let spec = ChainSpec::new(vec![StageSpec::TopK { k: 2 }, StageSpec::Dist], Some(42));
//! let mut chains = vec![sampler_cpu::build_chain(&spec).unwrap()];
//! let logits = [0.0f32, 1.0, 2.0, -1.0];
//! let out = sampler_cpu::sample_batch(&logits, 1, 4, &mut chains).unwrap();
//! let token = out[0].clone().unwrap();
//! assert!(token == 1 || token == 2);
//! ```

#![warn(missing_docs)]

mod batch;
pub mod beam;
mod build;
mod cdf;
pub mod fast;
pub mod speculative;
pub mod stages;
mod util;

pub use batch::{RowLogprobs, apply_batch, sample_batch, sample_batch_logprobs};
pub use build::{ChainBuildError, build_chain, build_stage};
pub use fast::ROW_KERNELS;
pub use speculative::{Verified, verify};
pub use stages::dist::dist_select;

pub use sampler_core::{Candidates, Chain, ChainSpec, SampleError, Sampler, StageSpec, TokenId};
