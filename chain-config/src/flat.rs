//! OpenAI / vLLM-style flat sampling parameters -> the canonical chain.

use std::collections::BTreeMap;

use sampler_core::logprobs::{MAX_LOGPROB_TOKEN_IDS, MAX_TOP_LOGPROBS};
use sampler_core::{
    ChainSpec, GREEDY_TEMPERATURE, HistoryScope, ParamValue as PValue, StageKind, StageSpec,
    TokenId,
};
use sampler_core::{LogprobsMode, LogprobsSpec};
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Diagnostic, schema_error};
use crate::located::{Doc, Entry, Node, Value as LValue, parse_json};
use crate::suggest::suggest;
use crate::values::{
    At, SEED_RANGE, TOKEN_RANGE, parse_float, parse_int, parse_seed, parse_token_ids,
    parse_token_seqs,
};
use crate::{ChainConfig, DeviceConfig, LoadOptions};

/// The window of the penalties stages built from flat parameters when
/// `repeat_last_n` is not given: the whole history (vLLM and transformers
/// count every token). The largest count a TOML integer can hold, so the
/// chain still round-trips through TOML.
pub const WHOLE_HISTORY: usize = if usize::BITS >= 64 {
    i64::MAX as usize
} else {
    usize::MAX
};

/// Flat sampling parameters as in OpenAI / vLLM requests (plus the
/// llama.cpp-server and Hugging Face extras listed below). Every field is
/// optional; an absent field takes the neutral OpenAI / vLLM default noted
/// on it (not llama.cpp's defaults: `temperature` is 1, not 0.8).
///
/// [`SamplingParams::to_chain`] builds the canonical chain in llama.cpp's
/// default order (`logit_bias; penalties; no_repeat_ngram; dry; top_n_sigma;
/// top_k; typical; top_p; min_p; xtc; temperature; dist`), leaving out every
/// stage whose parameters make it a no-op. Note that vLLM itself applies
/// temperature *before* top-k / top-p / min-p; declare that order
/// explicitly (preset `examples/chains/vllm.toml`) when it matters.
///
/// Greedy rules (vLLM / TensorRT-LLM): `temperature < 1e-5` (i.e. 0),
/// `top_k == 1`, `top_p == 0`, `min_p == 1` or `do_sample == false` give the
/// chain `[logit_bias] [penalties...] [no_repeat_ngram] [dry] greedy`, with a
/// [`Diagnostic::IgnoredByGreedy`] naming every other parameter that thereby
/// has no effect.
///
/// History scopes: `repetition_penalty` counts prompt and output tokens
/// ([`HistoryScope::PromptAndOutput`], vLLM and transformers);
/// `frequency_penalty` / `presence_penalty` count output tokens only
/// ([`HistoryScope::Output`], vLLM / OpenAI). So each gets its own
/// `penalties` stage. Both use the window `repeat_last_n`, by default
/// [`WHOLE_HISTORY`].
///
/// Deserialises from JSON with unknown fields refused; prefer
/// [`SamplingParams::from_json_str`], whose errors carry suggestions and
/// `line:column`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Temperature, `>= 0`; `< 1e-5` (i.e. 0) means greedy. Default 1 (off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Top-k: `-1` or `0` off (vLLM uses -1), `1` greedy, `k >= 1` keeps k. Default off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Nucleus mass in `[0, 1]`; `0` greedy, `1` off. Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Min-p in `[0, 1]`; `0` off, `1` greedy. Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Locally typical mass in `[0, 1]`; `1` off (transformers / llama.cpp server). Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typical_p: Option<f32>,
    /// Top-n-sigma, finite; `<= 0` off (llama.cpp server). Default off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_n_sigma: Option<f32>,
    /// XTC chance in `[0, 1]`; `0` off (llama.cpp server). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xtc_probability: Option<f32>,
    /// XTC threshold in `[0, 1]`; `> 0.5` off. Default 0.1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xtc_threshold: Option<f32>,
    /// Dynamic-temperature half range, `>= 0` (llama.cpp server). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynatemp_range: Option<f32>,
    /// Dynamic-temperature exponent, `>= 0`. Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynatemp_exponent: Option<f32>,
    /// Repetition penalty, finite `> 0`; `1` off. Positive logits of tokens
    /// seen in the prompt or output are divided by it, negative ones
    /// multiplied (CTRL / vLLM / transformers). Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Subtracted once per occurrence in the output, in `[-2, 2]` (OpenAI / vLLM). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Subtracted once if present in the output, in `[-2, 2]` (OpenAI / vLLM). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Penalty window in tokens, `>= 0`; `0` disables the penalties
    /// (llama.cpp server `repeat_last_n`; alias `penalty_last_n`). Default
    /// [`WHOLE_HISTORY`]. Negative values are an error (llama.cpp #9356).
    #[serde(alias = "penalty_last_n", skip_serializing_if = "Option::is_none")]
    pub repeat_last_n: Option<i64>,
    /// Ban any token that would repeat an n-gram of this size from the prompt
    /// or output, `>= 0`; `0` off (transformers). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_repeat_ngram_size: Option<i64>,
    /// DRY multiplier, `>= 0`; `0` off (llama.cpp server). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_multiplier: Option<f32>,
    /// DRY base, `>= 1`. Default 1.75.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_base: Option<f32>,
    /// DRY free repeat length, `>= 0`. Default 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_allowed_length: Option<i64>,
    /// DRY window, `>= 0`; `0` off. Default 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_penalty_last_n: Option<i64>,
    /// DRY sequence breakers as token-id sequences (tokenise llama.cpp's
    /// strings first). Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_sequence_breakers: Option<Vec<Vec<TokenId>>>,
    /// Mirostat mode: `0` off, `1` v1, `2` v2 (llama.cpp: replaces the
    /// truncation stages by `temperature; mirostat`). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat: Option<i64>,
    /// Mirostat target surprise in bits, `>= 0`. Default 5.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat_tau: Option<f32>,
    /// Mirostat learning rate, `>= 0`. Default 0.1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat_eta: Option<f32>,
    /// `min_keep` of top_p / min_p / typical / xtc, `>= 0`. Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_keep: Option<i64>,
    /// Token id -> bias added to its logit (OpenAI / vLLM `logit_bias`; JSON
    /// keys are decimal token ids). Finite, or `-inf` to ban (Rust only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<BTreeMap<TokenId, f32>>,
    /// Row seed (contract-7 randomness). Default: fresh from the OS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// `false` means greedy (transformers). Default sampling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub do_sample: Option<bool>,
    /// Report logprobs: `true` / `false` (OpenAI chat), or the number of top
    /// tokens, `0..=20` (vLLM, OpenAI completions). Default off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobsFlag>,
    /// Top tokens reported per step, `0..=20` (OpenAI chat; needs
    /// `logprobs` not `false`). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<i64>,
    /// Token ids whose logprobs are reported every step, at most 128 (vLLM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprob_token_ids: Option<Vec<TokenId>>,
    /// `"raw"` (log-softmax of the model's logits) or `"processed"` (after
    /// the chain's stages); vLLM's `raw_logprobs` / `processed_logprobs` too.
    /// Default raw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs_mode: Option<LogprobsMode>,
    /// Generated tokens before a stop token may be sampled, `>= 0` (vLLM);
    /// the stop tokens are `stop_token_ids` (the host app adds its EOS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<i64>,
    /// Stop token ids (vLLM); `min_tokens` bans them. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<TokenId>>,
    /// Independent samples of the prompt, `1..=256` (OpenAI / vLLM). Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<i64>,
    /// Beam search width, `1..=256`; 1 samples (Hugging Face). Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_beams: Option<i64>,
    /// Sequences a beam search returns, `1..=num_beams`; without beam
    /// search the same as `n` (Hugging Face). Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_return_sequences: Option<i64>,
    /// Beam search: exponent of the length in a finished hypothesis' score,
    /// finite (Hugging Face). Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length_penalty: Option<f32>,
    /// Beam search: `true`, `false` or `"never"` (Hugging Face). Default false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<crate::sequences::EarlyStoppingFlag>,
    /// OpenAI structured output: `{"type": "text"}` (none),
    /// `{"type": "json_object"}`, or `{"type": "json_schema", "json_schema":
    /// {"name": ..., "schema": {...}}}`. At most one of this and the
    /// `guided_*` keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<serde_json::Value>,
    /// vLLM: the output is JSON valid against this JSON Schema (an object,
    /// or its JSON text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<serde_json::Value>,
    /// vLLM: the whole output matches this regular expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guided_regex: Option<String>,
    /// vLLM: the output is a sentence of this Lark grammar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guided_grammar: Option<String>,
    /// vLLM: the output is exactly one of these strings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guided_choice: Option<Vec<String>>,
    /// The keys that stages declare in the stage registry
    /// ([`sampler_core::StageMeta::flat_key`]: `epsilon_cutoff`,
    /// `eta_cutoff`), written at the top level like the others. Each sets
    /// its stage's first parameter (range: that parameter's); absent means
    /// the stage is off.
    #[serde(flatten)]
    pub stage_keys: StageKeys,
}

/// `logprobs` as OpenAI chat (`true`) or vLLM (`5`) write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LogprobsFlag {
    /// On or off.
    On(bool),
    /// On, with this many top tokens.
    Top(i64),
}

/// The logprobs a request asks for, from the four flat keys (`None`: off).
///
/// # Errors
/// [`ConfigError::OutOfRange`] (no location) naming the key: a count
/// outside `0..=20`, more than 128 ids, `top_logprobs` / `logprob_token_ids`
/// / `logprobs_mode` with `logprobs = false`, or both `logprobs = N` and
/// `top_logprobs`.
pub(crate) fn logprobs_of(
    flag: Option<LogprobsFlag>,
    top: Option<i64>,
    ids: Option<&Vec<TokenId>>,
    mode: Option<LogprobsMode>,
) -> Result<Option<LogprobsSpec>, ConfigError> {
    let top_range = range_of("top_logprobs");
    let count_ok = |n: i64| (0..=MAX_TOP_LOGPROBS as i64).contains(&n);
    if let Some(LogprobsFlag::Top(n)) = flag
        && !count_ok(n)
    {
        return Err(range_err("logprobs", n.to_string(), range_of("logprobs")));
    }
    if let Some(n) = top
        && !count_ok(n)
    {
        return Err(range_err("top_logprobs", n.to_string(), top_range));
    }
    if let Some(ids) = ids
        && ids.len() > MAX_LOGPROB_TOKEN_IDS
    {
        return Err(range_err(
            "logprob_token_ids",
            format!("{} ids", ids.len()),
            range_of("logprob_token_ids"),
        ));
    }
    let asked = [
        ("top_logprobs", top.is_some()),
        ("logprob_token_ids", ids.is_some()),
        ("logprobs_mode", mode.is_some()),
    ];
    let on = match flag {
        Some(LogprobsFlag::On(false)) => {
            if let Some((key, _)) = asked.iter().find(|(_, given)| *given) {
                return Err(range_err(
                    key,
                    "given".into(),
                    "absent when `logprobs` is false (set `logprobs` to true)",
                ));
            }
            false
        }
        Some(LogprobsFlag::Top(_)) if top.is_some() => {
            return Err(range_err(
                "top_logprobs",
                top.unwrap_or_default().to_string(),
                "absent when `logprobs` is a number (that number is the top count)",
            ));
        }
        Some(_) => true,
        None => top.is_some() || ids.is_some(),
    };
    if !on {
        if mode.is_some() {
            return Err(range_err(
                "logprobs_mode",
                "given".into(),
                "absent unless logprobs are asked for (`logprobs`, `top_logprobs` or `logprob_token_ids`)",
            ));
        }
        return Ok(None);
    }
    let top_n = match flag {
        Some(LogprobsFlag::Top(n)) => n,
        _ => top.unwrap_or(0),
    };
    Ok(Some(LogprobsSpec {
        top_n: usize::try_from(top_n).unwrap_or(0),
        token_ids: ids.cloned().unwrap_or_default(),
        mode: mode.unwrap_or_default(),
    }))
}

/// Values of the flat keys declared by stages in the registry, by key
/// (`{"epsilon_cutoff": 0.02}`). Deserialising refuses any other key.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct StageKeys(pub BTreeMap<String, f32>);

impl StageKeys {
    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<f32> {
        self.0.get(key).copied()
    }
}

/// The stages whose registry entry declares a flat key, with the key.
pub(crate) fn registered_keys() -> impl Iterator<Item = (StageKind, &'static str)> {
    StageKind::ALL
        .into_iter()
        .filter_map(|k| k.meta().flat_key.map(|key| (k, key)))
}

/// The stage parameter a registered flat key sets (the stage's first).
fn registered_param(key: &str) -> Option<(StageKind, &'static sampler_core::ParamMeta)> {
    registered_keys()
        .find(|(_, k)| *k == key)
        .and_then(|(kind, _)| kind.meta().params.first().map(|p| (kind, p)))
}

impl<'de> Deserialize<'de> for StageKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = StageKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("flat sampling parameters")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StageKeys, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if registered_param(&key).is_none() {
                        return Err(serde::de::Error::custom(format!("unknown field `{key}`")));
                    }
                    if let Some(v) = map.next_value::<Option<f32>>()? {
                        out.insert(key, v);
                    }
                }
                Ok(StageKeys(out))
            }
        }
        d.deserialize_map(Keys)
    }
}

/// The JSON keys of [`SamplingParams`]'s own fields (and their aliases);
/// [`flat_keys`] adds the registry's.
pub const FIELDS: [&str; 44] = [
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "top_n_sigma",
    "xtc_probability",
    "xtc_threshold",
    "dynatemp_range",
    "dynatemp_exponent",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "repeat_last_n",
    "penalty_last_n",
    "no_repeat_ngram_size",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "min_keep",
    "logit_bias",
    "seed",
    "do_sample",
    "logprobs",
    "top_logprobs",
    "logprob_token_ids",
    "logprobs_mode",
    "min_tokens",
    "stop_token_ids",
    "n",
    "num_beams",
    "num_return_sequences",
    "length_penalty",
    "early_stopping",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
];

/// Every flat key: the keys of `SamplingParams`'s own fields, then the keys stages declare in the
/// registry ([`sampler_core::StageMeta::flat_key`]).
pub fn flat_keys() -> Vec<&'static str> {
    FIELDS
        .iter()
        .copied()
        .chain(registered_keys().map(|(_, k)| k))
        .collect()
}

/// How a flat parameter is typed in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldKind {
    /// A number read as `f32`.
    Float,
    /// An integer (`i64`).
    Int,
    /// The row seed (`u64`).
    Seed,
    /// `true` / `false`.
    Bool,
    /// A list of token-id lists.
    Seqs,
    /// `{"token id": bias}`.
    Bias,
    /// `true` / `false` or an integer.
    BoolOrInt,
    /// A list of token ids.
    Ids,
    /// One of a fixed set of strings.
    Word(&'static [&'static str]),
    /// `true` / `false` or one of a fixed set of strings.
    BoolOrWord(&'static [&'static str]),
    /// A JSON object.
    Object,
    /// A JSON object or a string (a schema or its text).
    Schema,
    /// A string.
    Str,
    /// A list of strings.
    Strs,
}

/// Every JSON key of [`SamplingParams`] with its kind and valid range in
/// words (used verbatim in errors, also for `generation_config.json`).
pub(crate) const FIELD_RANGES: [(&str, FieldKind, &str); 44] = [
    (
        "temperature",
        FieldKind::Float,
        "a finite number >= 0 (0 = greedy)",
    ),
    (
        "top_k",
        FieldKind::Int,
        "-1 or 0 (off), or an integer >= 1 (1 = greedy)",
    ),
    (
        "top_p",
        FieldKind::Float,
        "a number in [0, 1] (0 = greedy, 1 = off)",
    ),
    (
        "min_p",
        FieldKind::Float,
        "a number in [0, 1] (0 = off, 1 = greedy)",
    ),
    (
        "typical_p",
        FieldKind::Float,
        "a number in [0, 1] (1 = off)",
    ),
    (
        "top_n_sigma",
        FieldKind::Float,
        "a finite number (<= 0 = off)",
    ),
    ("xtc_probability", FieldKind::Float, "a number in [0, 1]"),
    (
        "xtc_threshold",
        FieldKind::Float,
        "a number in [0, 1] (above 0.5 disables)",
    ),
    ("dynatemp_range", FieldKind::Float, "a number in [0, 100]"),
    ("dynatemp_exponent", FieldKind::Float, "a number in [0, 10]"),
    (
        "repetition_penalty",
        FieldKind::Float,
        "a finite number >= 2.938736e-39 (> 0, and 1/repeat finite; 1 = off)",
    ),
    ("frequency_penalty", FieldKind::Float, "a number in [-2, 2]"),
    ("presence_penalty", FieldKind::Float, "a number in [-2, 2]"),
    (
        "repeat_last_n",
        FieldKind::Int,
        "an integer >= 0 (0 disables)",
    ),
    (
        "penalty_last_n",
        FieldKind::Int,
        "an integer >= 0 (0 disables)",
    ),
    (
        "no_repeat_ngram_size",
        FieldKind::Int,
        "an integer >= 0 (0 = off)",
    ),
    (
        "dry_multiplier",
        FieldKind::Float,
        "a finite number >= 0 (0 = off)",
    ),
    ("dry_base", FieldKind::Float, "a finite number >= 1"),
    ("dry_allowed_length", FieldKind::Int, "an integer >= 0"),
    (
        "dry_penalty_last_n",
        FieldKind::Int,
        "an integer >= 0 (0 disables)",
    ),
    (
        "dry_sequence_breakers",
        FieldKind::Seqs,
        "a list of non-empty token-id lists",
    ),
    ("mirostat", FieldKind::Int, "0 (off), 1 or 2"),
    ("mirostat_tau", FieldKind::Float, "a finite number >= 0"),
    ("mirostat_eta", FieldKind::Float, "a finite number >= 0"),
    ("min_keep", FieldKind::Int, "an integer >= 0"),
    (
        "logit_bias",
        FieldKind::Bias,
        "a finite number, or -inf to ban the token",
    ),
    ("seed", FieldKind::Seed, SEED_RANGE),
    ("do_sample", FieldKind::Bool, "a boolean (false = greedy)"),
    (
        "logprobs",
        FieldKind::BoolOrInt,
        "true / false, or the number of top logprobs in [0, 20]",
    ),
    ("top_logprobs", FieldKind::Int, "an integer in [0, 20]"),
    (
        "logprob_token_ids",
        FieldKind::Ids,
        "a list of at most 128 token ids",
    ),
    (
        "logprobs_mode",
        FieldKind::Word(&["raw", "processed", "raw_logprobs", "processed_logprobs"]),
        "\"raw\" or \"processed\"",
    ),
    ("min_tokens", FieldKind::Int, "an integer >= 0 (0 = off)"),
    ("stop_token_ids", FieldKind::Ids, "a list of token ids"),
    ("n", FieldKind::Int, "an integer in 1..=256"),
    (
        "num_beams",
        FieldKind::Int,
        "an integer in 1..=256 (1 = no beam search)",
    ),
    (
        "num_return_sequences",
        FieldKind::Int,
        "an integer in 1..=num_beams",
    ),
    ("length_penalty", FieldKind::Float, "a finite number"),
    (
        "early_stopping",
        FieldKind::BoolOrWord(&["true", "false", "never"]),
        "true, false or \"never\"",
    ),
    (
        "response_format",
        FieldKind::Object,
        "an object: {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}",
    ),
    (
        "guided_json",
        FieldKind::Schema,
        "a JSON Schema (an object, or its JSON text)",
    ),
    (
        "guided_regex",
        FieldKind::Str,
        "a regular expression (a string)",
    ),
    (
        "guided_grammar",
        FieldKind::Str,
        "a Lark grammar (a string)",
    ),
    (
        "guided_choice",
        FieldKind::Strs,
        "a non-empty list of strings",
    ),
];

/// An [`ConfigError::OutOfRange`] from [`SamplingParams::check`] (which
/// has no document) located at its top-level key.
pub(crate) fn locate_range_error(doc: Doc<'_>, root: &Node, e: ConfigError) -> ConfigError {
    match e {
        ConfigError::OutOfRange {
            path,
            value,
            expected,
            location: None,
        } => {
            let key = path.split(['.', '[']).next().unwrap_or(&path).to_string();
            // The key as the document wrote it (an alias: `penalty_last_n`).
            let written = std::iter::once(key.as_str())
                .chain(ALIASES.iter().filter(|(_, k)| *k == key).map(|(a, _)| *a))
                .find_map(|k| root.get(k));
            ConfigError::OutOfRange {
                location: written.and_then(|e| doc.loc(&e.key_span)),
                path: match written {
                    Some(e) => format!("{}{}", e.key, &path[key.len()..]),
                    None => path,
                },
                value,
                expected,
            }
        }
        other => other,
    }
}

/// Flat keys accepted under a second name: `(alias, key)`.
const ALIASES: [(&str, &str); 1] = [("penalty_last_n", "repeat_last_n")];

/// The valid range of a flat parameter, in words.
pub(crate) fn range_of(key: &str) -> &'static str {
    field_of(key).map_or("a valid value", |(_, r)| r)
}

/// How a flat key is typed and its range in words: [`FIELD_RANGES`], or
/// for a registered key its parameter's metadata.
fn field_of(key: &str) -> Option<(FieldKind, &'static str)> {
    FIELD_RANGES
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|&(_, kind, range)| (kind, range))
        .or_else(|| registered_param(key).map(|(_, p)| (FieldKind::Float, p.range)))
}

/// Check the JSON type of one flat parameter (and, for numbers, that it
/// fits its Rust type), before serde reads it; ranges are checked by
/// [`SamplingParams::check`]. `null` means absent.
pub(crate) fn check_field_type(doc: Doc<'_>, entry: &Entry) -> Result<(), ConfigError> {
    let key = entry.key.as_str();
    let v = &entry.value;
    let Some((kind, range)) = field_of(key) else {
        return Ok(());
    };
    if v.is_null() {
        return Ok(());
    }
    let at = At::entry(doc, entry);
    let wrong = |found: String, expected: &str| ConfigError::WrongType {
        path: key.to_string(),
        found,
        expected: expected.to_string(),
        location: at.loc(v),
    };
    match kind {
        FieldKind::Float => parse_float(at, key, range, v).map(|_| ()),
        FieldKind::Int => parse_int(at, key, range, v).map(|_| ()),
        FieldKind::Seed => parse_seed(at, v).map(|_| ()),
        FieldKind::Bool => match &v.value {
            LValue::Bool(_) => Ok(()),
            _ => Err(wrong(doc.found(v), range)),
        },
        FieldKind::Seqs => parse_token_seqs(at, key, range, v).map(|_| ()),
        FieldKind::BoolOrInt => match &v.value {
            LValue::Bool(_) => Ok(()),
            _ => parse_int(at, key, range, v).map(|_| ()),
        },
        FieldKind::Ids => match &v.value {
            LValue::Array(_) => parse_token_ids(at, key, v).map(|_| ()),
            _ => Err(wrong(doc.found(v), range)),
        },
        FieldKind::Object => match &v.value {
            LValue::Table(_) => Ok(()),
            _ => Err(wrong(doc.found(v), range)),
        },
        FieldKind::Schema => match &v.value {
            LValue::Table(_) | LValue::Str(_) | LValue::Bool(_) => Ok(()),
            _ => Err(wrong(doc.found(v), range)),
        },
        FieldKind::Str => match &v.value {
            LValue::Str(_) => Ok(()),
            _ => Err(wrong(doc.found(v), range)),
        },
        FieldKind::Strs => match &v.value {
            LValue::Array(items) if items.iter().all(|i| matches!(i.value, LValue::Str(_))) => {
                Ok(())
            }
            _ => Err(wrong(doc.found(v), range)),
        },
        FieldKind::BoolOrWord(_) if matches!(v.value, LValue::Bool(_)) => Ok(()),
        FieldKind::Word(words) | FieldKind::BoolOrWord(words) => match v.as_str() {
            Some(w) if words.contains(&w) => Ok(()),
            Some(w) => Err(ConfigError::OutOfRange {
                path: key.to_string(),
                value: format!("\"{w}\""),
                expected: range.to_string(),
                location: at.loc(v),
            }),
            None => Err(wrong(doc.found(v), range)),
        },
        FieldKind::Bias => {
            let Some(map) = v.entries() else {
                return Err(wrong(
                    doc.found(v),
                    "an object `{\"token id\": bias}`, e.g. {\"15043\": -1.5}",
                ));
            };
            for e in map {
                let token = e.key.as_str();
                let path = format!("{key}.\"{token}\"");
                // Located only for an error: computing a location scans
                // the text up to it (once per key would be quadratic).
                let bloc = || doc.loc(&e.key_span);
                // Decimal without leading zeros: serde reads `"007"` as no
                // number at all, so refuse it here with the key's path.
                let ok_id = !token.is_empty()
                    && token.bytes().all(|b| b.is_ascii_digit())
                    && (token == "0" || !token.starts_with('0'))
                    && token.parse::<TokenId>().is_ok();
                if !ok_id {
                    return Err(ConfigError::OutOfRange {
                        path,
                        value: format!("\"{token}\""),
                        expected: format!("{TOKEN_RANGE} as the key, e.g. {{\"15043\": -1.5}}"),
                        location: bloc(),
                    });
                }
                match e.value.as_f32() {
                    Ok(Some(_)) => {}
                    Err(()) => {
                        return Err(ConfigError::OutOfRange {
                            path,
                            value: doc.written(&e.value),
                            expected: range.to_string(),
                            location: bloc(),
                        });
                    }
                    Ok(None) => {
                        return Err(ConfigError::WrongType {
                            path,
                            found: doc.found(&e.value),
                            expected: "a finite number (JSON has no -inf: a bias of -100 or less bans the token in practice)".into(),
                            location: bloc(),
                        });
                    }
                }
            }
            Ok(())
        }
    }
}

fn fmt_f(x: f32) -> String {
    format!("{x}")
}

fn range_err(path: &str, value: String, expected: &str) -> ConfigError {
    ConfigError::OutOfRange {
        path: path.to_string(),
        value,
        expected: expected.to_string(),
        location: None,
    }
}

fn check_f(
    path: &str,
    v: Option<f32>,
    ok: impl Fn(f32) -> bool,
    expected: &str,
) -> Result<(), ConfigError> {
    match v {
        Some(x) if !ok(x) => Err(range_err(path, fmt_f(x), expected)),
        _ => Ok(()),
    }
}

fn check_i(
    path: &str,
    v: Option<i64>,
    ok: impl Fn(i64) -> bool,
    expected: &str,
) -> Result<(), ConfigError> {
    match v {
        Some(x) if !ok(x) => Err(range_err(path, x.to_string(), expected)),
        _ => Ok(()),
    }
}

/// A stage of `kind` at the registry's defaults, with the parameters given
/// here set (values already range-checked by [`SamplingParams::check`]).
fn stage(kind: StageKind, set: &[(&str, Option<PValue>)]) -> StageSpec {
    let mut spec = StageSpec::default_for(kind);
    for (name, value) in set {
        if let Some(v) = value {
            // Checked before: a refusal here would be a registry mismatch,
            // caught by the flat tests.
            let _ = spec.set_param(name, v.clone());
        }
    }
    spec
}

/// A count parameter as a value (negative counts were refused by `check`).
fn int(v: Option<i64>) -> Option<PValue> {
    v.map(PValue::Int)
}

fn count(v: Option<i64>, default: usize) -> usize {
    v.and_then(|x| usize::try_from(x).ok()).unwrap_or(default)
}

impl SamplingParams {
    /// Parse a JSON object of flat parameters (e.g. the sampling part of an
    /// OpenAI / vLLM request body) and check every range.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] / [`ConfigError::Schema`] with `line:column`;
    /// [`ConfigError::UnknownKey`] with a suggestion (`top_kk` -> `top_k`);
    /// [`ConfigError::WrongType`] naming the key, the value found and the
    /// range (`"temperature": "0.7"`, `"top_k": 40.5`, a `logit_bias` value
    /// that is not a number); [`ConfigError::OutOfRange`] naming the key
    /// (`logit_bias."abc"` for a key that is not a token id, a number beyond
    /// `f32` as written), as [`SamplingParams::check`].
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let (doc, root) = parse_json(text)?;
        let Some(entries) = root.entries() else {
            return Err(ConfigError::WrongType {
                path: "(root)".into(),
                found: root.type_word(doc.format).into(),
                expected: "an object of sampling parameters".into(),
                location: Some(crate::Location { line: 1, column: 1 }),
            });
        };
        let known = flat_keys();
        for e in entries {
            if !known.contains(&e.key.as_str()) {
                return Err(ConfigError::UnknownKey {
                    path: e.key.clone(),
                    location: doc.loc(&e.key_span),
                    suggestion: suggest(&e.key, known.iter().copied()),
                });
            }
        }
        for (alias, key) in ALIASES {
            if let (Some(a), Some(b)) = (root.get(alias), root.get(key)) {
                let (first, second) = if a.key_span.start < b.key_span.start {
                    (a, b)
                } else {
                    (b, a)
                };
                return Err(ConfigError::DuplicateKey {
                    path: second.key.clone(),
                    other: first.key.clone(),
                    location: doc.loc(&second.key_span),
                });
            }
        }
        for e in entries {
            check_field_type(doc, e)?;
        }
        let params: SamplingParams =
            serde_json::from_str(doc.text).map_err(|e| schema_error(doc.text, &e))?;
        params
            .check()
            .map_err(|e| locate_range_error(doc, &root, e))?;
        Ok(params)
    }

    /// Check every given value against its range (listed on each field).
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] with the field name as the path (no location).
    pub fn check(&self) -> Result<(), ConfigError> {
        let finite_ge0 = |x: f32| x.is_finite() && x >= 0.0;
        let unit = |x: f32| (0.0..=1.0).contains(&x);
        check_f(
            "temperature",
            self.temperature,
            finite_ge0,
            range_of("temperature"),
        )?;
        check_i("top_k", self.top_k, |k| k >= -1, range_of("top_k"))?;
        check_i(
            "min_tokens",
            self.min_tokens,
            |n| n >= 0,
            range_of("min_tokens"),
        )?;
        logprobs_of(
            self.logprobs,
            self.top_logprobs,
            self.logprob_token_ids.as_ref(),
            self.logprobs_mode,
        )?;
        check_f("top_p", self.top_p, unit, range_of("top_p"))?;
        check_f("min_p", self.min_p, unit, range_of("min_p"))?;
        check_f("typical_p", self.typical_p, unit, range_of("typical_p"))?;
        for (key, &x) in &self.stage_keys.0 {
            let Some((kind, pm)) = registered_param(key) else {
                return Err(ConfigError::UnknownKey {
                    path: key.clone(),
                    location: None,
                    suggestion: suggest(key, flat_keys()),
                });
            };
            let mut spec = StageSpec::default_for(kind);
            if spec.set_param(pm.name, PValue::Float(x)).is_err() || spec.validate().is_err() {
                return Err(range_err(key, fmt_f(x), pm.range));
            }
        }
        check_f(
            "top_n_sigma",
            self.top_n_sigma,
            f32::is_finite,
            range_of("top_n_sigma"),
        )?;
        check_f(
            "xtc_probability",
            self.xtc_probability,
            unit,
            range_of("xtc_probability"),
        )?;
        check_f(
            "xtc_threshold",
            self.xtc_threshold,
            unit,
            range_of("xtc_threshold"),
        )?;
        check_f(
            "dynatemp_range",
            self.dynatemp_range,
            |x| (0.0..=sampler_core::DYNATEMP_RANGE_MAX).contains(&x),
            range_of("dynatemp_range"),
        )?;
        check_f(
            "dynatemp_exponent",
            self.dynatemp_exponent,
            |x| (0.0..=sampler_core::DYNATEMP_EXPONENT_MAX).contains(&x),
            range_of("dynatemp_exponent"),
        )?;
        check_f(
            "repetition_penalty",
            self.repetition_penalty,
            |x| x.is_finite() && x > 0.0 && (1.0 / x).is_finite(),
            range_of("repetition_penalty"),
        )?;
        let pm2 = |x: f32| (-2.0..=2.0).contains(&x);
        check_f(
            "frequency_penalty",
            self.frequency_penalty,
            pm2,
            range_of("frequency_penalty"),
        )?;
        check_f(
            "presence_penalty",
            self.presence_penalty,
            pm2,
            range_of("presence_penalty"),
        )?;
        let ge0 = |x: i64| x >= 0;
        check_i(
            "repeat_last_n",
            self.repeat_last_n,
            ge0,
            range_of("repeat_last_n"),
        )?;
        check_i(
            "no_repeat_ngram_size",
            self.no_repeat_ngram_size,
            ge0,
            range_of("no_repeat_ngram_size"),
        )?;
        check_f(
            "dry_multiplier",
            self.dry_multiplier,
            finite_ge0,
            range_of("dry_multiplier"),
        )?;
        check_f(
            "dry_base",
            self.dry_base,
            |x| x.is_finite() && x >= 1.0,
            range_of("dry_base"),
        )?;
        check_i(
            "dry_allowed_length",
            self.dry_allowed_length,
            ge0,
            range_of("dry_allowed_length"),
        )?;
        check_i(
            "dry_penalty_last_n",
            self.dry_penalty_last_n,
            ge0,
            range_of("dry_penalty_last_n"),
        )?;
        if let Some(seqs) = &self.dry_sequence_breakers
            && let Some(i) = seqs.iter().position(Vec::is_empty)
        {
            return Err(range_err(
                &format!("dry_sequence_breakers[{i}]"),
                "[]".into(),
                "a list of non-empty token-id lists",
            ));
        }
        check_i(
            "mirostat",
            self.mirostat,
            |m| (0..=2).contains(&m),
            range_of("mirostat"),
        )?;
        check_f(
            "mirostat_tau",
            self.mirostat_tau,
            finite_ge0,
            range_of("mirostat_tau"),
        )?;
        check_f(
            "mirostat_eta",
            self.mirostat_eta,
            finite_ge0,
            range_of("mirostat_eta"),
        )?;
        check_i("min_keep", self.min_keep, ge0, range_of("min_keep"))?;
        self.sequences()?;
        if let Some(bias) = &self.logit_bias {
            for (t, b) in bias {
                if !(b.is_finite() || *b == f32::NEG_INFINITY) {
                    return Err(range_err(
                        &format!("logit_bias.\"{t}\""),
                        fmt_f(*b),
                        "a finite number, or -inf to ban the token",
                    ));
                }
            }
        }
        Ok(())
    }

    /// This request over `file` (e.g. a model's `generation_config.json`):
    /// every field the request sets wins, every other field comes from the
    /// file, and what neither sets keeps the default.
    ///
    /// One rule beyond field-by-field: a `do_sample = false` from the file
    /// does not turn a request that asks for sampling into greedy. If the
    /// request sets none of `do_sample` but some of `temperature`, `top_k`,
    /// `top_p`, `min_p`, `typical_p`, the file's `do_sample = false` is
    /// dropped and a [`Diagnostic::DoSampleOverridden`] says so.
    pub fn over(&self, file: &SamplingParams) -> (SamplingParams, Vec<Diagnostic>) {
        macro_rules! pick {
            ($($f:ident),*) => {
                SamplingParams {
                    $($f: self.$f.clone().or_else(|| file.$f.clone()),)*
                    stage_keys: StageKeys::default(),
                }
            };
        }
        let mut merged = pick!(
            temperature,
            top_k,
            top_p,
            min_p,
            typical_p,
            top_n_sigma,
            xtc_probability,
            xtc_threshold,
            dynatemp_range,
            dynatemp_exponent,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
            repeat_last_n,
            no_repeat_ngram_size,
            dry_multiplier,
            dry_base,
            dry_allowed_length,
            dry_penalty_last_n,
            dry_sequence_breakers,
            mirostat,
            mirostat_tau,
            mirostat_eta,
            min_keep,
            logit_bias,
            seed,
            do_sample,
            logprobs,
            top_logprobs,
            logprob_token_ids,
            logprobs_mode,
            min_tokens,
            stop_token_ids,
            n,
            num_beams,
            num_return_sequences,
            length_penalty,
            early_stopping,
            response_format,
            guided_json,
            guided_regex,
            guided_grammar,
            guided_choice
        );
        let mut keys = file.stage_keys.0.clone();
        keys.extend(self.stage_keys.0.iter().map(|(k, v)| (k.clone(), *v)));
        merged.stage_keys = StageKeys(keys);
        let mut notes = Vec::new();
        if self.do_sample.is_none() && file.do_sample == Some(false) {
            let by: Vec<String> = [
                ("temperature", self.temperature.is_some()),
                ("top_k", self.top_k.is_some()),
                ("top_p", self.top_p.is_some()),
                ("min_p", self.min_p.is_some()),
                ("typical_p", self.typical_p.is_some()),
            ]
            .into_iter()
            .filter(|(_, set)| *set)
            .map(|(n, _)| n.to_string())
            .collect();
            if !by.is_empty() {
                merged.do_sample = None;
                notes.push(Diagnostic::DoSampleOverridden { by });
            }
        }
        (merged, notes)
    }

    /// The sequences the five keys declare (`n`, `num_beams`,
    /// `num_return_sequences`, `length_penalty`, `early_stopping`).
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] naming the key.
    pub fn sequences(&self) -> Result<sampler_core::Sequences, ConfigError> {
        crate::sequences::SeqFields {
            n: self.n,
            num_beams: self.num_beams,
            num_return_sequences: self.num_return_sequences,
            length_penalty: self.length_penalty.map(f64::from),
            early_stopping: self.early_stopping.clone(),
        }
        .build()
        .map_err(|(key, value, expected)| range_err(key, value, &expected))
    }

    /// Build the canonical chain (see the type's documentation for the
    /// order, the greedy rules and the history scopes). The result always
    /// selects a token; the device is the default one.
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] from [`SamplingParams::check`].
    pub fn to_chain(&self) -> Result<ChainConfig, ConfigError> {
        use PValue as V;
        self.check()?;
        let mut diagnostics = Vec::new();
        let min_keep = count(self.min_keep, 0);
        let window = count(self.repeat_last_n, WHOLE_HISTORY);

        // Stages that act whatever the sampling mode.
        let mut head = Vec::new();
        let min_tokens = count(self.min_tokens, 0);
        if let Some(bias) = &self.logit_bias {
            head.push(StageSpec::LogitBias {
                bias: bias.iter().map(|(t, b)| (*t, *b)).collect(),
            });
        }
        head.push(StageSpec::Penalties {
            last_n: window,
            repeat: self.repetition_penalty.unwrap_or(1.0),
            frequency: 0.0,
            presence: 0.0,
            scope: HistoryScope::PromptAndOutput,
        });
        head.push(StageSpec::Penalties {
            last_n: window,
            repeat: 1.0,
            frequency: self.frequency_penalty.unwrap_or(0.0),
            presence: self.presence_penalty.unwrap_or(0.0),
            scope: HistoryScope::Output,
        });
        head.push(StageSpec::NoRepeatNgram {
            n: count(self.no_repeat_ngram_size, 0),
            scope: HistoryScope::PromptAndOutput,
        });
        head.push(stage(
            StageKind::Dry,
            &[
                (
                    "multiplier",
                    Some(V::Float(self.dry_multiplier.unwrap_or(0.0))),
                ),
                ("base", self.dry_base.map(V::Float)),
                ("allowed_length", int(self.dry_allowed_length)),
                ("last_n", int(self.dry_penalty_last_n)),
                (
                    "seq_breakers",
                    self.dry_sequence_breakers.clone().map(V::Seqs),
                ),
            ],
        ));

        // Greedy rules.
        let t = self.temperature.unwrap_or(1.0);
        let mut rules = Vec::new();
        if t < GREEDY_TEMPERATURE {
            rules.push(format!("temperature = {}", fmt_f(t)));
        }
        if self.top_k == Some(1) {
            rules.push("top_k = 1".to_string());
        }
        if self.top_p == Some(0.0) {
            rules.push("top_p = 0".to_string());
        }
        if self.min_p == Some(1.0) {
            rules.push("min_p = 1".to_string());
        }
        if self.do_sample == Some(false) {
            rules.push("do_sample = false".to_string());
        }

        // Parameters of the sampling stages that are set to a non-neutral
        // value, for "ignored" diagnostics.
        let mut shaping: Vec<(&str, String)> = Vec::new();
        let mut note_f = |name: &'static str, v: Option<f32>, neutral: f32| {
            if let Some(x) = v
                && x != neutral
            {
                shaping.push((name, format!("{name} = {}", fmt_f(x))));
            }
        };
        note_f("temperature", self.temperature, 1.0);
        note_f("top_p", self.top_p, 1.0);
        note_f("min_p", self.min_p, 0.0);
        note_f("typical_p", self.typical_p, 1.0);
        note_f("top_n_sigma", self.top_n_sigma.filter(|n| *n > 0.0), -1.0);
        note_f("xtc_probability", self.xtc_probability, 0.0);
        note_f("dynatemp_range", self.dynatemp_range, 0.0);
        // A registered key is neutral when it makes its stage a no-op.
        let registered: Vec<(StageSpec, &'static str, f32)> = registered_keys()
            .filter_map(|(kind, key)| {
                let x = self.stage_keys.get(key)?;
                let pm = kind.meta().params.first()?;
                let spec = stage(
                    kind,
                    &[
                        (pm.name, Some(V::Float(x))),
                        ("min_keep", Some(V::Int(min_keep as i64))),
                    ],
                );
                Some((spec, key, x))
            })
            .collect();
        for (spec, key, x) in &registered {
            if !spec.is_noop() {
                shaping.push((key, format!("{key} = {}", fmt_f(*x))));
            }
        }
        if let Some(k) = self.top_k
            && k > 0
        {
            shaping.push(("top_k", format!("top_k = {k}")));
        }
        if let Some(m) = self.mirostat
            && m != 0
        {
            shaping.push(("mirostat", format!("mirostat = {m}")));
        }

        let mut stages = head;
        if min_tokens > 0 {
            // Kept even without stop ids: the host app adds its EOS
            // (`ChainSpec::fill_stop_ids`), as vLLM adds the model's.
            let at = usize::from(matches!(stages.first(), Some(StageSpec::LogitBias { .. })));
            stages.insert(
                at,
                StageSpec::MinTokens {
                    n: min_tokens,
                    stop: self.stop_token_ids.clone().unwrap_or_default(),
                },
            );
        }
        if !rules.is_empty() {
            let triggers = ["temperature", "top_k", "top_p", "min_p"];
            let ignored: Vec<String> = shaping
                .iter()
                .filter(|(name, _)| {
                    !(triggers.contains(name) && rules.iter().any(|r| r.starts_with(*name)))
                })
                .map(|(_, text)| text.clone())
                .collect();
            if !ignored.is_empty() {
                diagnostics.push(Diagnostic::IgnoredByGreedy { rules, ignored });
            }
            stages.push(StageSpec::Greedy);
        } else if let Some(mode) = self.mirostat.filter(|m| *m != 0) {
            let ignored: Vec<String> = shaping
                .iter()
                .filter(|(name, _)| !matches!(*name, "temperature" | "mirostat"))
                .map(|(_, text)| text.clone())
                .collect();
            if !ignored.is_empty() {
                diagnostics.push(Diagnostic::IgnoredByMirostat {
                    mode: if mode == 1 { 1 } else { 2 },
                    ignored,
                });
            }
            stages.push(StageSpec::Temperature {
                t,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0,
            });
            let kind = if mode == 1 {
                StageKind::Mirostat
            } else {
                StageKind::MirostatV2
            };
            stages.push(stage(
                kind,
                &[
                    ("tau", self.mirostat_tau.map(V::Float)),
                    ("eta", self.mirostat_eta.map(V::Float)),
                ],
            ));
        } else {
            stages.push(StageSpec::TopNSigma {
                n: self.top_n_sigma.unwrap_or(-1.0),
            });
            stages.push(StageSpec::TopK {
                k: self.top_k.unwrap_or(0),
            });
            stages.push(StageSpec::Typical {
                p: self.typical_p.unwrap_or(1.0),
                min_keep,
            });
            stages.push(StageSpec::TopP {
                p: self.top_p.unwrap_or(1.0),
                min_keep,
            });
            stages.push(StageSpec::MinP {
                p: self.min_p.unwrap_or(0.0),
                min_keep,
            });
            let sampling_from = stages.len();
            stages.push(stage(
                StageKind::Xtc,
                &[
                    (
                        "probability",
                        Some(V::Float(self.xtc_probability.unwrap_or(0.0))),
                    ),
                    ("threshold", self.xtc_threshold.map(V::Float)),
                    ("min_keep", Some(V::Int(min_keep as i64))),
                ],
            ));
            stages.push(stage(
                StageKind::Temperature,
                &[
                    ("t", Some(V::Float(t))),
                    ("dynatemp_range", self.dynatemp_range.map(V::Float)),
                    ("dynatemp_exponent", self.dynatemp_exponent.map(V::Float)),
                ],
            ));
            stages.push(StageSpec::Dist);
            // Each registered stage joins the sampling part at its place in
            // llama.cpp's order (epsilon and eta after min_p, as
            // transformers applies them after the other truncations).
            for (spec, _, _) in registered {
                let order = spec.kind().meta().order;
                let at = (sampling_from..stages.len())
                    .find(|&i| stages[i].kind().meta().order > order)
                    .unwrap_or(stages.len());
                stages.insert(at, spec);
            }
        }
        stages.retain(|s| !s.is_noop() || matches!(s, StageSpec::MinTokens { n, .. } if *n > 0));
        let mut chain = ChainSpec::new(stages, self.seed);
        chain.logprobs = logprobs_of(
            self.logprobs,
            self.top_logprobs,
            self.logprob_token_ids.as_ref(),
            self.logprobs_mode,
        )?;
        let mut cfg = ChainConfig::finish(
            "stage",
            chain,
            DeviceConfig::default(),
            diagnostics,
            &LoadOptions::default(),
            None,
        )?;
        cfg.sequences = self.sequences()?;
        cfg.structured = crate::structured::from_flat(self)?;
        if cfg.structured.is_some() {
            crate::structured::ensure_mask(&mut cfg.chain);
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_list_matches_serde() {
        let full = SamplingParams {
            temperature: Some(1.0),
            top_k: Some(1),
            top_p: Some(1.0),
            min_p: Some(0.0),
            typical_p: Some(1.0),
            top_n_sigma: Some(1.0),
            xtc_probability: Some(0.0),
            xtc_threshold: Some(0.1),
            dynatemp_range: Some(0.0),
            dynatemp_exponent: Some(1.0),
            repetition_penalty: Some(1.0),
            frequency_penalty: Some(0.0),
            presence_penalty: Some(0.0),
            repeat_last_n: Some(1),
            no_repeat_ngram_size: Some(0),
            dry_multiplier: Some(0.0),
            dry_base: Some(1.75),
            dry_allowed_length: Some(2),
            dry_penalty_last_n: Some(64),
            dry_sequence_breakers: Some(vec![]),
            mirostat: Some(0),
            mirostat_tau: Some(5.0),
            mirostat_eta: Some(0.1),
            min_keep: Some(0),
            logit_bias: Some(BTreeMap::new()),
            seed: Some(1),
            do_sample: Some(true),
            logprobs: Some(LogprobsFlag::On(true)),
            top_logprobs: Some(1),
            logprob_token_ids: Some(vec![]),
            logprobs_mode: Some(LogprobsMode::Raw),
            min_tokens: Some(0),
            stop_token_ids: Some(vec![]),
            n: Some(1),
            num_beams: Some(1),
            num_return_sequences: Some(1),
            length_penalty: Some(1.0),
            early_stopping: Some(crate::sequences::EarlyStoppingFlag::Bool(false)),
            response_format: Some(serde_json::json!({"type": "text"})),
            guided_json: Some(serde_json::json!({})),
            guided_regex: Some(String::new()),
            guided_grammar: Some(String::new()),
            guided_choice: Some(vec![]),
            stage_keys: StageKeys::default(),
        };
        let v = serde_json::to_value(&full).unwrap_or_default();
        let keys: Vec<&str> = v
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(keys.len(), FIELDS.len() - 1);
        for k in keys {
            assert!(FIELDS.contains(&k), "{k}");
        }
    }
}
