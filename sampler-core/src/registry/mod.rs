//! The stage registry: every built-in stage declared once, with its
//! parameters (type, default, valid range, meaning), its no-op rule, its
//! static metadata and its place in llama.cpp's order.
//!
//! `define_stages!` (in `registry/machinery.rs`, with its helper macros)
//! turns the table below into [`StageKind`] (and `StageKind::ALL`),
//! [`StageSpec`] (the declarative stage, serde-tagged by its canonical name;
//! its `Deserialize` is in `registry/deserialize.rs`), `StageKind::meta`,
//! `StageSpec::{kind, is_noop, validate, params, set_param, default_for,
//! survivors}`, and the exported [`for_each_stage!`](crate::for_each_stage)
//! macro through which `sampler-cpu` generates its stage builder and
//! `sampler-backend` its device-stage builder. Nothing else lists the stages.
//!
//! Adding a stage: one entry here, the CPU file
//! `sampler-cpu/src/stages/<module>.rs` (a type named like the variant with
//! `new(fields in declaration order)`), and, with `device: yes`, the device
//! file `sampler-backend/src/stages/<module>.rs` (a type named like the
//! variant with `new(stage_index, specs)`). Both crates declare their stage
//! modules from this table. An optional `flat_key` gives the stage a key in
//! the flat (OpenAI-style) and `generation_config.json` front ends. Nothing
//! else needs an edit, apart from the stage's section in `docs/semantics.md`.
//!
//! # How to read an entry
//!
//! The table starts with a lone `$` (it lets `define_stages!` write the `$`
//! variables of the `for_each_stage!` macro it defines). Then, per stage:
//!
//! ```text
//! /// Docs of the variant.
//! Variant(module) {
//!     name: "...", aliases: [...],
//!     params: [
//!         /// Docs of the field.
//!         field: Type = default => {
//!             aliases: [...], required: bool, min: .., max: .., valid: ..,
//!             range: "...", doc: "...",
//!         },
//!     ],
//!     effects: [...], needs: [...], device: yes|no [...],
//!     noop: expr, noop_rule: "...", survivors: expr, bans: expr,
//!     order: n, seq: Some('c') | None, flat_key: "..." (optional), source: "...",
//! }
//! ```
//!
//! * `Variant(module)`: the [`StageKind`] and [`StageSpec`] variant (the doc
//!   comment above it documents both), and the module of the stage in
//!   `sampler-cpu/src/stages/` (and, with `device: yes`, in
//!   `sampler-backend/src/stages/`).
//! * `name`: the canonical name ([`StageMeta::name`]), written when
//!   serialising; `aliases`: other names accepted when reading
//!   (case-insensitive, `-` and `_` alike).
//! * `params`: the parameters, in declaration order (the order of the
//!   variant's fields, of `new(...)`'s arguments in both crates and of
//!   `StageSpec::params`). `field: Type = default` is the field, its Rust
//!   type (a [`ParamField`]) and its default (`StageSpec::default_for`, and
//!   what a config that omits it gets; llama.cpp's value where llama.cpp has
//!   the stage). Then, into its [`ParamMeta`]:
//!   * `aliases`: other key names accepted in configs;
//!   * `required`: whether the tagged JSON form must give it;
//!   * `min` / `max`: numeric bounds (`None`: unbounded), which the config
//!     loaders read;
//!   * `valid`: the check `StageSpec::validate` runs, a
//!     `fn(&Type) -> Result<(), String>` whose `Err` is the value as shown
//!     in the error (`any`, `finite`, `finite_ge0`, `unit_interval`, or a
//!     closure over `num`, defined below);
//!   * `range`: the valid range in words, used verbatim in errors and in
//!     `docs/config.md`;
//!   * `doc`: the parameter's meaning in one line.
//! * `effects`: what the stage does to a row ([`Effects`]: `logits`,
//!   `candidates`, `probs`, `selects`).
//! * `needs`: what it needs besides the row: `history` (the accepted
//!   tokens), `randomness` (the row's counter-based stream), `input`
//!   (per-step host data: the `mask` stage's bitmask).
//! * `device: yes|no [...]`: whether `sampler-backend` has a device recipe,
//!   and what that recipe does to the candidates ([`DeviceEffects`]:
//!   `masks_removed`, `narrows`).
//! * `noop`: an expression over the fields (each bound by reference, hence
//!   `*k <= 0`), true when the parameters make the stage a no-op
//!   (`StageSpec::is_noop`); `noop_rule`: the same rule in words.
//! * `survivors`: the most candidates the parameters alone can leave
//!   (`StageSpec::survivors`; `None` when the row decides).
//! * `bans`: an expression, true when the parameters can set a kept
//!   candidate's logit to `-inf` (`StageSpec::bans`).
//! * `order`: the position in llama.cpp's canonical order
//!   ([`StageMeta::order`]); unique.
//! * `seq`: llama.cpp's `--sampling-seq` letter, if it has one; unique.
//! * `flat_key` (optional): the stage's key in flat (OpenAI / vLLM-style)
//!   parameters and `generation_config.json` ([`StageMeta::flat_key`]).
//! * `source`: whose semantics the stage follows.

use std::fmt::Display;

// The code `define_stages!` generates below names these.
use crate::meta::{DeviceEffects, Effects, ParamField, ParamMeta, ParamValue, SetParamError};
use crate::{HistoryScope, ParamError, StageMeta, TokenId};

// First: a `macro_rules!` macro is usable only after its definition.
#[macro_use]
mod machinery;

mod deserialize;

use machinery::Needs;

/// `Ok` when `ok`, else the value as shown in the error.
fn num<T: Display>(v: &T, ok: bool) -> Result<(), String> {
    if ok { Ok(()) } else { Err(v.to_string()) }
}

fn any<T>(_: &T) -> Result<(), String> {
    Ok(())
}

/// The largest dynamic-temperature half range. llama.cpp takes any; beyond
/// this the temperature is so high that the row is flat anyway, and the
/// entropy-derived `t` (computed in another order on a device) gets
/// ill-conditioned: with a range and exponent of `1e30` the last bit of the
/// entropy flipped tokens between the CPU and the device.
pub const DYNATEMP_RANGE_MAX: f32 = 100.0;

/// The largest dynamic-temperature exponent (same reason as
/// [`DYNATEMP_RANGE_MAX`]: `(H / H_max)^e` jumps from 0 to 1 at `H = H_max`
/// for a huge `e`).
pub const DYNATEMP_EXPONENT_MAX: f32 = 10.0;

fn finite_ge0(x: &f32) -> Result<(), String> {
    num(x, x.is_finite() && *x >= 0.0)
}

fn unit_interval(x: &f32) -> Result<(), String> {
    num(x, (0.0..=1.0).contains(x))
}

fn finite(x: &f32) -> Result<(), String> {
    num(x, x.is_finite())
}

fn scope_default() -> HistoryScope {
    HistoryScope::PromptAndOutput
}

define_stages! {
    $
    /// Argmax (first maximum; ties to the lowest id).
    Greedy(greedy) {
        name: "greedy",
        aliases: ["argmax"],
        params: [],
        effects: [selects],
        needs: [],
        device: yes [],
        noop: false,
        noop_rule: "never a no-op",
        survivors: None,
        bans: false,
        order: 130,
        seq: None,
        source: "llama.cpp greedy; ties go to the lowest token id (vLLM, TensorRT-LLM)",
    }
    /// Draw from the softmax of the current candidates.
    Dist(dist) {
        name: "dist",
        aliases: ["sample", "random"],
        params: [],
        effects: [probs, selects],
        needs: [randomness],
        device: yes [],
        noop: false,
        noop_rule: "never a no-op",
        survivors: None,
        bans: false,
        order: 140,
        seq: None,
        source: "llama.cpp dist (softmax, inverse CDF); canonical ascending-id order and counter-based uniforms, so every device draws the same token",
    }
    /// Keep the `k` highest logits; `k <= 0` is a no-op.
    TopK(top_k) {
        name: "top_k",
        aliases: ["top-k", "topk"],
        params: [
            /// Candidates kept.
            k: i64 = 40 => {
                aliases: [], required: true, min: None, max: None, valid: any,
                range: "an integer (k <= 0 disables)",
                doc: "number of highest-logit candidates kept",
            },
        ],
        effects: [candidates],
        needs: [],
        device: yes [narrows],
        noop: *k <= 0,
        noop_rule: "k <= 0",
        survivors: if *k > 0 { usize::try_from(*k).ok() } else { None },
        bans: false,
        order: 50,
        seq: Some('k'),
        source: "llama.cpp top-k; boundary ties go to the lowest token id",
    }
    /// Nucleus sampling; `p >= 1` is a no-op.
    TopP(top_p) {
        name: "top_p",
        aliases: ["top-p", "topp", "nucleus"],
        params: [
            /// Mass kept, in `[0, 1]`.
            p: f32 = 0.95 => {
                aliases: [], required: true, min: Some(0.0), max: Some(1.0), valid: unit_interval,
                range: "a number in [0, 1]",
                doc: "cumulative probability mass to keep (inclusive of the crossing token)",
            },
            /// Minimum candidates kept.
            min_keep: usize = 0 => {
                aliases: [], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0",
                doc: "never keep fewer than this many candidates (0 and 1 both mean at least one)",
            },
        ],
        effects: [candidates, probs],
        needs: [],
        device: yes [masks_removed],
        noop: *p >= 1.0,
        noop_rule: "p >= 1",
        survivors: None,
        bans: false,
        order: 70,
        seq: Some('p'),
        source: "llama.cpp top-p (Holtzman et al. 2019, nucleus sampling)",
    }
    /// Min-p; `p <= 0` is a no-op.
    MinP(min_p) {
        name: "min_p",
        aliases: ["min-p", "minp"],
        params: [
            /// Fraction of the top probability, `>= 0`.
            p: f32 = 0.05 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: finite_ge0,
                range: "a finite number >= 0 (p >= 1 keeps only the maximum)",
                doc: "keep tokens whose probability is at least p times the top probability",
            },
            /// Minimum candidates kept.
            min_keep: usize = 0 => {
                aliases: [], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0",
                doc: "never keep fewer than this many candidates (0 and 1 both mean at least one)",
            },
        ],
        effects: [candidates],
        needs: [],
        device: yes [masks_removed],
        noop: *p <= 0.0,
        noop_rule: "p <= 0",
        survivors: None,
        bans: false,
        order: 80,
        seq: Some('m'),
        source: "llama.cpp min-p (threshold max_logit + ln p, inclusive)",
    }
    /// Locally typical sampling; `p >= 1` is a no-op.
    Typical(typical) {
        name: "typical",
        aliases: ["typ_p", "typ-p", "typp", "typ", "typical_p", "typical-p"],
        params: [
            /// Mass kept, in `[0, 1]`.
            p: f32 = 1.0 => {
                aliases: [], required: true, min: Some(0.0), max: Some(1.0), valid: unit_interval,
                range: "a number in [0, 1]",
                doc: "probability mass of the most typical tokens to keep",
            },
            /// Minimum candidates kept.
            min_keep: usize = 0 => {
                aliases: [], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0",
                doc: "never keep fewer than this many candidates (0 and 1 both mean at least one)",
            },
        ],
        effects: [candidates, probs],
        needs: [],
        device: yes [masks_removed],
        noop: *p >= 1.0,
        noop_rule: "p >= 1",
        survivors: None,
        bans: false,
        order: 60,
        seq: Some('y'),
        source: "llama.cpp typical (Meister et al. 2022, locally typical sampling)",
    }
    /// Temperature with optional dynamic range.
    Temperature(temperature) {
        name: "temperature",
        aliases: ["temp", "temp_ext", "temp-ext"],
        params: [
            /// Temperature, `>= 0`; below [`GREEDY_TEMPERATURE`](crate::GREEDY_TEMPERATURE) greedy.
            t: f32 = 0.8 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: finite_ge0,
                range: "a finite number >= 0 (t < 1e-5 means greedy)",
                doc: "divide logits by t",
            },
            /// Dynamic-temperature half range, `[0, 100]`.
            dynatemp_range: f32 = 0.0 => {
                aliases: [], required: false, min: Some(0.0), max: Some(100.0),
                valid: |r: &f32| num(r, (0.0..=DYNATEMP_RANGE_MAX).contains(r)),
                range: "a number in [0, 100]",
                doc: "dynamic temperature: t varies in [t - range, t + range] with the entropy",
            },
            /// Dynamic-temperature exponent, `[0, 10]`.
            dynatemp_exponent: f32 = 1.0 => {
                aliases: [], required: false, min: Some(0.0), max: Some(10.0),
                valid: |e: &f32| num(e, (0.0..=DYNATEMP_EXPONENT_MAX).contains(e)),
                range: "a number in [0, 10]",
                doc: "dynamic temperature exponent on the normalised entropy",
            },
        ],
        effects: [logits],
        needs: [],
        device: yes [],
        noop: *t == 1.0 && *dynatemp_range <= 0.0,
        noop_rule: "t == 1 and dynatemp_range == 0",
        survivors: None,
        bans: *t < crate::GREEDY_TEMPERATURE || (*dynatemp_range > 0.0 && *t - *dynatemp_range < crate::GREEDY_TEMPERATURE),
        order: 100,
        seq: Some('t'),
        source: "llama.cpp temp / temp-ext (dynamic temperature, Zhu et al. 2024); greedy below 1e-5 (vLLM)",
    }
    /// Exclude top choices.
    Xtc(xtc) {
        name: "xtc",
        aliases: [],
        params: [
            /// Chance to act, `[0, 1]`.
            probability: f32 = 0.0 => {
                aliases: [], required: true, min: Some(0.0), max: Some(1.0), valid: unit_interval,
                range: "a number in [0, 1]",
                doc: "chance that XTC acts at a step",
            },
            /// Top-choice threshold, `[0, 1]`; above 0.5 disables.
            threshold: f32 = 0.1 => {
                aliases: [], required: true, min: Some(0.0), max: Some(1.0), valid: unit_interval,
                range: "a number in [0, 1] (above 0.5 disables)",
                doc: "tokens with p >= threshold are 'top choices'",
            },
            /// Minimum candidates kept.
            min_keep: usize = 0 => {
                aliases: [], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0",
                doc: "never keep fewer than this many candidates (0 and 1 both mean at least one)",
            },
        ],
        effects: [candidates, probs],
        needs: [randomness],
        device: no [],
        noop: *probability <= 0.0 || *threshold > 0.5,
        noop_rule: "probability <= 0 or threshold > 0.5",
        survivors: None,
        bans: false,
        order: 90,
        seq: Some('x'),
        source: "llama.cpp xtc (exclude top choices, oobabooga text-generation-webui PR #6335)",
    }
    /// Top-n-sigma; `n <= 0` is a no-op.
    TopNSigma(top_n_sigma) {
        name: "top_n_sigma",
        aliases: ["top-n-sigma", "topnsigma", "top_nsigma"],
        params: [
            /// Standard deviations below the max that survive.
            n: f32 = -1.0 => {
                aliases: [], required: true, min: None, max: None, valid: finite,
                range: "a finite number (n <= 0 disables)",
                doc: "keep logits >= max - n * std (std over finite logits)",
            },
        ],
        effects: [logits],
        needs: [],
        device: no [],
        noop: *n <= 0.0,
        noop_rule: "n <= 0",
        survivors: None,
        bans: false,
        order: 40,
        seq: Some('s'),
        source: "llama.cpp top-n-sigma (Tang et al. 2024)",
    }
    /// Mirostat v1; selects a token.
    Mirostat(mirostat) {
        name: "mirostat",
        aliases: ["mirostat_v1", "mirostat1"],
        params: [
            /// Target surprise (bits).
            tau: f32 = 5.0 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: finite_ge0,
                range: "a finite number >= 0",
                doc: "target surprise, bits",
            },
            /// Learning rate.
            eta: f32 = 0.1 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: finite_ge0,
                range: "a finite number >= 0",
                doc: "learning rate of mu",
            },
            /// Tokens used to estimate the Zipf exponent.
            m: usize = 100 => {
                aliases: [], required: false, min: Some(1.0), max: None, valid: |m: &usize| num(m, *m >= 1),
                range: "an integer >= 1",
                doc: "tokens used to estimate the Zipf exponent",
            },
        ],
        effects: [candidates, probs, selects],
        needs: [randomness],
        device: no [],
        noop: false,
        noop_rule: "never a no-op",
        survivors: None,
        bans: false,
        order: 110,
        seq: None,
        source: "llama.cpp mirostat (Basu et al. 2021, algorithm 1)",
    }
    /// Mirostat v2; selects a token.
    MirostatV2(mirostat_v2) {
        name: "mirostat_v2",
        aliases: ["mirostat-v2", "mirostatv2", "mirostat2"],
        params: [
            /// Target surprise (bits).
            tau: f32 = 5.0 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: finite_ge0,
                range: "a finite number >= 0",
                doc: "target surprise, bits",
            },
            /// Learning rate.
            eta: f32 = 0.1 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: finite_ge0,
                range: "a finite number >= 0",
                doc: "learning rate of mu",
            },
        ],
        effects: [candidates, probs, selects],
        needs: [randomness],
        device: no [],
        noop: false,
        noop_rule: "never a no-op",
        survivors: None,
        bans: false,
        order: 120,
        seq: None,
        source: "llama.cpp mirostat v2 (Basu et al. 2021, algorithm 2)",
    }
    /// Repetition / frequency / presence penalties over the last `last_n` history tokens.
    Penalties(penalties) {
        name: "penalties",
        aliases: ["penalty", "repetition_penalty"],
        params: [
            /// Window size; 0 disables.
            last_n: usize = 64 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0 (0 disables)",
                doc: "window: the last N history tokens count",
            },
            /// Repetition penalty, `> 0` (1 = off).
            repeat: f32 = 1.0 => {
                aliases: [], required: false, min: Some(2.938736e-39), max: None,
                valid: |r: &f32| num(r, r.is_finite() && *r > 0.0 && (1.0 / *r).is_finite()),
                range: "a finite number >= 2.938736e-39 (> 0, and 1/repeat finite)",
                doc: "repetition penalty: positive logits divided, negative multiplied",
            },
            /// Frequency penalty (per occurrence).
            frequency: f32 = 0.0 => {
                aliases: [], required: false, min: None, max: None, valid: finite,
                range: "a finite number",
                doc: "subtracted once per occurrence in the window",
            },
            /// Presence penalty (once).
            presence: f32 = 0.0 => {
                aliases: [], required: false, min: None, max: None, valid: finite,
                range: "a finite number",
                doc: "subtracted once if present in the window",
            },
            /// History scope.
            scope: HistoryScope = scope_default() => {
                aliases: [], required: false, min: None, max: None, valid: any,
                range: "\"prompt_and_output\" or \"output\"",
                doc: "which accepted tokens count as history: prompt and generated tokens (llama.cpp server), or generated tokens only",
            },
        ],
        effects: [logits],
        needs: [history],
        device: yes [],
        noop: *last_n == 0 || (*repeat == 1.0 && *frequency == 0.0 && *presence == 0.0),
        noop_rule: "last_n == 0, or repeat == 1 and frequency == 0 and presence == 0",
        survivors: None,
        bans: false,
        order: 10,
        seq: Some('e'),
        source: "llama.cpp penalties (CTRL, Keskar et al. 2019 for repetition; OpenAI for frequency/presence)",
    }
    /// DRY n-gram repetition penalty.
    Dry(dry) {
        name: "dry",
        aliases: [],
        params: [
            /// Penalty scale; 0 disables.
            multiplier: f32 = 0.0 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: finite_ge0,
                range: "a finite number >= 0 (0 disables)",
                doc: "penalty scale",
            },
            /// Exponential base, `>= 1`.
            base: f32 = 1.75 => {
                aliases: [], required: false, min: Some(1.0), max: None,
                valid: |b: &f32| num(b, b.is_finite() && *b >= 1.0),
                range: "a finite number >= 1",
                doc: "penalty grows as base^(match length - allowed_length)",
            },
            /// Free repeat length.
            allowed_length: usize = 2 => {
                aliases: [], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0",
                doc: "repeats up to this length are free",
            },
            /// Window; 0 disables.
            last_n: usize = 64 => {
                aliases: [], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0 (0 disables)",
                doc: "window of history tokens scanned",
            },
            /// Sequence breakers as token-id sequences.
            seq_breakers: Vec<Vec<TokenId>> = Vec::new() => {
                aliases: ["sequence_breakers"], required: false, min: None, max: None,
                valid: |s: &Vec<Vec<TokenId>>| if s.iter().any(|b| b.is_empty()) { Err("[]".into()) } else { Ok(()) },
                range: "a list of non-empty token-id lists",
                doc: "token sequences that end a repeat (first token = head, rest = tail)",
            },
            /// History scope.
            scope: HistoryScope = scope_default() => {
                aliases: [], required: false, min: None, max: None, valid: any,
                range: "\"prompt_and_output\" or \"output\"",
                doc: "which accepted tokens count as history: prompt and generated tokens (llama.cpp server), or generated tokens only",
            },
        ],
        effects: [logits],
        needs: [history],
        device: no [],
        noop: *multiplier == 0.0 || *last_n == 0,
        noop_rule: "multiplier == 0 or last_n == 0",
        survivors: None,
        bans: false,
        order: 30,
        seq: Some('d'),
        source: "llama.cpp DRY (p-e-w, oobabooga text-generation-webui PR #5677)",
    }
    /// Additive logit bias per token (`-inf` bans).
    LogitBias(logit_bias) {
        name: "logit_bias",
        aliases: ["logit-bias", "bias"],
        params: [
            /// `(token, bias)` pairs.
            bias: Vec<(TokenId, f32)> = Vec::new() => {
                aliases: ["biases"], required: true, min: None, max: None,
                valid: |b: &Vec<(TokenId, f32)>| match b.iter().find(|(_, x)| !(x.is_finite() || *x == f32::NEG_INFINITY)) {
                    Some((t, x)) => Err(format!("{{{t}: {x}}}")),
                    None => Ok(()),
                },
                range: "token id -> a finite number or -inf (ban)",
                doc: "added to the token's logit",
            },
        ],
        effects: [logits],
        needs: [],
        device: yes [],
        noop: bias.is_empty(),
        noop_rule: "no biases",
        survivors: None,
        bans: bias.iter().any(|(_, b)| *b == f32::NEG_INFINITY),
        order: 0,
        seq: None,
        source: "llama.cpp logit-bias / OpenAI logit_bias",
    }
    /// Allow only the tokens of a per-step bitmask (grammar-constrained
    /// decoding); no mask at a step allows every token.
    Mask(mask) {
        name: "mask",
        aliases: ["token_mask", "bitmask", "grammar"],
        params: [],
        effects: [logits],
        needs: [input],
        device: yes [],
        noop: false,
        noop_rule: "never a no-op (a step without a mask allows every token)",
        survivors: None,
        bans: true,
        order: 1,
        seq: None,
        source: "llguidance / XGrammar token bitmasks: u32 words, bit (id % 32) of word (id / 32) allows token id",
    }
    /// Ban the stop tokens until `n` tokens have been generated.
    MinTokens(min_tokens) {
        name: "min_tokens",
        aliases: ["min-tokens", "min_new_tokens"],
        params: [
            /// Generated tokens before a stop token may be sampled.
            n: usize = 0 => {
                aliases: ["min_tokens", "min_new_tokens"], required: true, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0 (0 disables)",
                doc: "generated tokens (since the request started or was reset) before a stop token may be sampled",
            },
            /// The stop (end-of-sequence) token ids.
            stop: Vec<TokenId> = Vec::new() => {
                aliases: ["stop_token_ids", "eos_token_id"], required: false, min: None, max: None, valid: any,
                range: "a list of token ids",
                doc: "token ids banned (logit -inf) while fewer than n tokens have been generated",
            },
        ],
        effects: [logits],
        needs: [history],
        device: yes [],
        noop: *n == 0 || stop.is_empty(),
        noop_rule: "n = 0 or no stop ids",
        survivors: None,
        bans: true,
        order: 2,
        seq: None,
        source: "vLLM min_tokens / Hugging Face MinNewTokensLengthLogitsProcessor (stop ids masked until n generated tokens)",
    }
    /// Ban tokens that would complete an n-gram already in the history.
    NoRepeatNgram(no_repeat_ngram) {
        name: "no_repeat_ngram",
        aliases: ["no-repeat-ngram", "no_repeat_ngram_size"],
        params: [
            /// n-gram size; 0 disables.
            n: usize = 0 => {
                aliases: [], required: true, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0 (0 disables)",
                doc: "n-gram size that may not repeat",
            },
            /// History scope.
            scope: HistoryScope = scope_default() => {
                aliases: [], required: false, min: None, max: None, valid: any,
                range: "\"prompt_and_output\" or \"output\"",
                doc: "which accepted tokens count as history: prompt and generated tokens (llama.cpp server), or generated tokens only",
            },
        ],
        effects: [logits],
        needs: [history],
        device: no [],
        noop: *n == 0,
        noop_rule: "n == 0",
        survivors: None,
        bans: false,
        order: 20,
        seq: None,
        source: "Hugging Face transformers NoRepeatNGramLogitsProcessor",
    }
    /// Epsilon sampling: drop tokens whose probability is below `epsilon`.
    Epsilon(epsilon) {
        name: "epsilon",
        aliases: ["epsilon_cutoff", "epsilon-cutoff"],
        params: [
            /// Probability cutoff, in `[0, 1)`; 0 disables.
            epsilon: f32 = 0.0 => {
                aliases: ["epsilon_cutoff"], required: true, min: Some(0.0), max: Some(1.0),
                valid: |e: &f32| num(e, (0.0..1.0).contains(e)),
                range: "a number in [0, 1) (0 disables)",
                doc: "tokens whose probability is below epsilon are removed",
            },
            /// Minimum candidates kept (with every token tied with the last one kept).
            min_keep: usize = 0 => {
                aliases: ["min_tokens_to_keep"], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0",
                doc: "never keep fewer than this many candidates, plus ties with the last (0 and 1 both mean at least one)",
            },
        ],
        effects: [candidates, probs],
        needs: [],
        device: yes [masks_removed],
        noop: *epsilon <= 0.0,
        noop_rule: "epsilon <= 0",
        survivors: None,
        bans: false,
        order: 82,
        seq: None,
        flat_key: "epsilon_cutoff",
        source: "Hugging Face transformers EpsilonLogitsWarper (Hewitt et al. 2022, truncation sampling)",
    }
    /// Eta sampling: an entropy-dependent probability cutoff.
    Eta(eta) {
        name: "eta",
        aliases: ["eta_cutoff", "eta-cutoff"],
        params: [
            /// The epsilon of eta sampling, in `[0, 1)`; 0 disables.
            epsilon: f32 = 0.0 => {
                aliases: ["eta_cutoff"], required: true, min: Some(0.0), max: Some(1.0),
                valid: |e: &f32| num(e, (0.0..1.0).contains(e)),
                range: "a number in [0, 1) (0 disables)",
                doc: "tokens with probability below min(epsilon, sqrt(epsilon) * exp(-entropy)) are removed (entropy in nats)",
            },
            /// Minimum candidates kept (with every token tied with the last one kept).
            min_keep: usize = 0 => {
                aliases: ["min_tokens_to_keep"], required: false, min: Some(0.0), max: None, valid: any,
                range: "an integer >= 0",
                doc: "never keep fewer than this many candidates, plus ties with the last (0 and 1 both mean at least one)",
            },
        ],
        effects: [candidates, probs],
        needs: [],
        device: yes [masks_removed],
        noop: *epsilon <= 0.0,
        noop_rule: "epsilon <= 0",
        survivors: None,
        bans: false,
        order: 84,
        seq: None,
        flat_key: "eta_cutoff",
        source: "Hugging Face transformers EtaLogitsWarper (Hewitt et al. 2022, truncation sampling)",
    }
}

impl StageSpec {
    /// Canonical stage name.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Whether the stage selects a token (greedy, dist, mirostat v1/v2).
    pub fn selects(&self) -> bool {
        self.kind().meta().effects.selects
    }

    /// Whether the stage, active, fails with
    /// [`SampleError::AllMasked`](crate::SampleError::AllMasked) on a set
    /// without a finite logit although it does not select: `top_p` and
    /// `typical` (their softmax). The serving batch reports that error for a
    /// row such a device stage saw, before the host stages after it, as the
    /// CPU does.
    pub fn rejects_all_masked(&self) -> bool {
        matches!(self, StageSpec::TopP { .. } | StageSpec::Typical { .. }) && !self.is_noop()
    }

    /// Whether the stage is greedy spelled as a temperature: a fixed
    /// temperature (no dynamic range) below
    /// [`GREEDY_TEMPERATURE`](crate::GREEDY_TEMPERATURE), such as
    /// `temperature(0)` or OpenAI's `temperature = 0`. It keeps the maximum
    /// and bans the rest, so `processed` logprobs are taken from the
    /// candidates as they enter it, the set greedy would choose among
    /// ([`crate::logprobs`]; vLLM gives greedy rows no temperature).
    pub fn is_greedy_temperature(&self) -> bool {
        match self {
            StageSpec::Temperature {
                t, dynatemp_range, ..
            } => {
                (dynatemp_range.is_nan() || *dynatemp_range <= 0.0)
                    && (t.is_nan() || *t < crate::GREEDY_TEMPERATURE)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_valid_and_round_trips_by_name() {
        for kind in StageKind::ALL {
            let spec = StageSpec::default_for(kind);
            spec.validate().expect("defaults are valid");
            let meta = kind.meta();
            let params = spec.params();
            assert_eq!(params.len(), meta.params.len(), "{}", meta.name);
            let mut copy = StageSpec::default_for(kind);
            for ((name, value), pm) in params.into_iter().zip(meta.params) {
                assert_eq!(name, pm.name);
                assert_eq!(value, pm.default_value(), "{}.{name}", meta.name);
                assert_eq!(copy.set_param(name, value), Ok(()));
            }
            assert_eq!(copy, spec);
            assert_eq!(
                copy.set_param("no_such_param", ParamValue::Int(1)),
                Err(SetParamError::Unknown)
            );
        }
    }

    #[test]
    fn orders_and_letters_are_unique() {
        let mut orders: Vec<u32> = StageKind::ALL.iter().map(|k| k.meta().order).collect();
        orders.sort_unstable();
        orders.dedup();
        assert_eq!(orders.len(), StageKind::ALL.len());
        let letters: Vec<char> = StageKind::ALL
            .iter()
            .filter_map(|k| k.meta().seq_letter)
            .collect();
        assert_eq!(letters.len(), 9);
        for c in letters {
            assert_eq!(
                StageKind::from_seq_char(c).and_then(|k| k.meta().seq_letter),
                Some(c)
            );
        }
    }
}
