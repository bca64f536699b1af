//! [`ChainConfig`] -> TOML text that loads back to the same chain.
//!
//! Written by hand rather than through serde so that floats are written as
//! the shortest text that reads back to the same `f32` (the loader parses
//! floats straight to `f32`), and so that the layout is the reviewable one
//! of `docs/config.md`: top-level keys, `[device]`, then one table per stage.

use std::fmt::Write as _;

use sampler_core::{OffloadPolicy, StageSpec};

use crate::ChainConfig;
use crate::params::{PValue, params_of};

/// A TOML basic string.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One parameter value as TOML.
pub(crate) fn render_value(v: &PValue) -> String {
    v.to_toml()
}

fn write_params(out: &mut String, spec: &StageSpec) {
    for (name, value) in params_of(spec) {
        let _ = writeln!(out, "{name} = {}", render_value(&value));
    }
}

/// Serialise. Uses `samplers` + one table per stage when every repeated
/// stage has the same parameters; otherwise the `[[stage]]` form.
pub(crate) fn to_toml(cfg: &ChainConfig) -> String {
    let chain = &cfg.chain;
    let mut out = String::new();
    if let Some(seed) = chain.seed {
        if i64::try_from(seed).is_ok() {
            let _ = writeln!(out, "seed = {seed}");
        } else {
            let _ = writeln!(out, "seed = \"{seed}\"");
        }
    }
    if let Some(lp) = &chain.logprobs {
        let _ = writeln!(out, "logprobs = true");
        if lp.top_n > 0 {
            let _ = writeln!(out, "top_logprobs = {}", lp.top_n);
        }
        if !lp.token_ids.is_empty() {
            let _ = writeln!(
                out,
                "logprob_token_ids = {}",
                PValue::Ids(lp.token_ids.clone()).to_toml()
            );
        }
        let _ = writeln!(out, "logprobs_mode = \"{}\"", lp.mode.word());
    }
    // A kind listed twice with different parameters needs `[[stage]]`
    // tables. Equality is transitive, so comparing each stage with the first
    // of its kind is enough (linear in the chain).
    let mut first_of = std::collections::HashMap::new();
    let repeats_differ = chain
        .stages
        .iter()
        .any(|a| *first_of.entry(a.kind()).or_insert(a) != a);
    if !repeats_differ {
        let _ = writeln!(out, "samplers = {}", quote(&chain.chain_string()));
    }
    out.push_str("\n[device]\n");
    let _ = writeln!(out, "kind = {}", quote(&cfg.device.device));
    match cfg.device.offload {
        OffloadPolicy::Auto => out.push_str("offload = \"auto\"\n"),
        OffloadPolicy::Off => out.push_str("offload = \"off\"\n"),
        OffloadPolicy::Device => out.push_str("offload = \"device\"\n"),
        OffloadPolicy::Stages(n) => {
            // Any cap at or above the chain's length offloads the whole
            // prefix; TOML integers stop at 2^63 - 1.
            let _ = writeln!(out, "offload = {}", n.min(i64::MAX as usize));
        }
    }
    if let Some(s) = &cfg.structured {
        crate::structured::write_toml(&mut out, s);
    }
    if let Some(sp) = &cfg.speculative {
        out.push_str("\n[speculative]\n");
        out.push_str("method = \"ngram\"\n");
        let _ = writeln!(
            out,
            "num_speculative_tokens = {}",
            sp.num_speculative_tokens
        );
        let _ = writeln!(out, "prompt_lookup_min = {}", sp.prompt_lookup_min);
        let _ = writeln!(out, "prompt_lookup_max = {}", sp.prompt_lookup_max);
    }
    if !cfg.sequences.is_default() {
        let seq = &cfg.sequences;
        out.push_str("\n[sequences]\n");
        match &seq.beam {
            None => {
                let _ = writeln!(out, "n = {}", seq.n);
            }
            Some(b) => {
                let _ = writeln!(out, "num_beams = {}", b.num_beams);
                let _ = writeln!(out, "num_return_sequences = {}", b.num_return_sequences);
                let _ = writeln!(
                    out,
                    "length_penalty = {}",
                    render_value(&PValue::Float(b.length_penalty as f32))
                );
                let es = match b.early_stopping {
                    sampler_core::EarlyStopping::Never => "\"never\"",
                    other => other.word(),
                };
                let _ = writeln!(out, "early_stopping = {es}");
            }
        }
    }
    if repeats_differ {
        for spec in &chain.stages {
            out.push_str("\n[[stage]]\n");
            let _ = writeln!(out, "type = {}", quote(spec.name()));
            write_params(&mut out, spec);
        }
    } else {
        let mut done = Vec::new();
        for spec in &chain.stages {
            if done.contains(&spec.kind()) || params_of(spec).is_empty() {
                continue;
            }
            done.push(spec.kind());
            let _ = writeln!(out, "\n[{}]", spec.name());
            write_params(&mut out, spec);
        }
    }
    out
}
