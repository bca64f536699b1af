//! Host apps for sampler-chain: the llama2.c model on burn used by the
//! `generate` command (`src/bin/generate.rs`), plus the `plan` and `sample`
//! commands (`src/bin/plan.rs`, `src/bin/sample.rs`) and their shared pieces
//! ([`sample_cli`]: config, device, and the `.npy` / `.safetensors` readers;
//! [`report`]: the JSON they print), [`ban_words`], a custom stage
//! written against the library's `Sampler` trait, and [`gguf`], a GGUF v3
//! reader (metadata, tensors, dequantisation) for real models, and [`ngram`],
//! an n-gram (prompt lookup) drafter for speculative decoding,
//! [`stop`], stop strings over a stream of tokens, [`inspect`], pictures
//! and JSON of what a chain does at each step, and [`http_client`], a
//! minimal client for `serve --http`'s tests and load benchmark.

pub mod ban_words;
pub mod chat;
pub mod gguf;
pub mod http_client;
pub mod inspect;
pub mod llama2;
pub mod ngram;
pub mod report;
pub mod requests;
pub mod sample_cli;
pub mod stop;
pub mod structured;

/// The README's Rust snippets, compiled and run as doctests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
