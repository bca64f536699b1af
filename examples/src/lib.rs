//! Host apps for sampler-chain: the llama2.c model on burn used by the
//! `generate` command (`src/bin/generate.rs`), plus the `plan` and `sample`
//! commands (`src/bin/plan.rs`, `src/bin/sample.rs`).

pub mod llama2;

/// The README's Rust snippets, compiled and run as doctests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
