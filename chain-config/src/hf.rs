//! Hugging Face `generation_config.json` import.

use std::path::Path;

use crate::error::{ConfigError, Diagnostic};
use crate::flat::{SamplingParams, StageKeys, locate_range_error, range_of, registered_keys};
use crate::located::{Doc, Entry, Value as LValue, parse_json};
use crate::values::{At, parse_float, parse_int, parse_token_ids};

/// The sampling keys of a model's `generation_config.json` (transformers'
/// `GenerationConfig`) that map onto this crate's stages. Only keys present
/// in the file (and not `null`) are set: transformers' own defaults for
/// absent keys (e.g. `top_k = 50`) are *not* applied, as in vLLM.
///
/// Semantics: `top_k = 0` is off (transformers); `repetition_penalty`
/// counts prompt and output tokens over the whole history;
/// `no_repeat_ngram_size` bans n-gram repeats over prompt and output;
/// `do_sample = false` means greedy (but see [`SamplingParams::over`]);
/// `min_new_tokens` bans `eos_token_id` until that many tokens were
/// generated (transformers' `MinNewTokensLengthLogitsProcessor`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_k` (`0` = off).
    pub top_k: Option<i64>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `typical_p`.
    pub typical_p: Option<f32>,
    /// The keys stages declare in the stage registry
    /// ([`sampler_core::StageMeta::flat_key`]: `epsilon_cutoff`,
    /// `eta_cutoff`; 0 = off), as in flat parameters.
    pub stage_keys: StageKeys,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// `no_repeat_ngram_size`.
    pub no_repeat_ngram_size: Option<i64>,
    /// `do_sample`.
    pub do_sample: Option<bool>,
    /// `min_new_tokens` (the stop ids are `eos_token_id`).
    pub min_new_tokens: Option<i64>,
    /// `eos_token_id` (one id or a list).
    pub eos_token_id: Option<Vec<sampler_core::TokenId>>,
    /// `num_beams` (1 = no beam search).
    pub num_beams: Option<i64>,
    /// `num_return_sequences`.
    pub num_return_sequences: Option<i64>,
    /// `length_penalty`.
    pub length_penalty: Option<f32>,
    /// `early_stopping` (`true`, `false` or `"never"`).
    pub early_stopping: Option<crate::EarlyStoppingFlag>,
    /// Sampling-related keys present in the file with a non-neutral value
    /// that this crate does not implement (beam search, contrastive search,
    /// ...): [`Diagnostic::Unsupported`].
    pub diagnostics: Vec<Diagnostic>,
}

/// Keys with an effect on decoding that have no stage here, with the value
/// that means "off" (`None`: any non-empty value matters).
const UNSUPPORTED: [(&str, Option<f64>); 9] = [
    ("num_beam_groups", Some(1.0)),
    ("penalty_alpha", Some(0.0)),
    ("diversity_penalty", Some(0.0)),
    ("encoder_repetition_penalty", Some(1.0)),
    ("guidance_scale", Some(1.0)),
    ("bad_words_ids", None),
    ("sequence_bias", None),
    ("suppress_tokens", None),
    ("begin_suppress_tokens", None),
];

fn number(doc: Doc<'_>, e: &Entry) -> Result<f32, ConfigError> {
    parse_float(At::entry(doc, e), &e.key, range_of(&e.key), &e.value)
}

fn integer(doc: Doc<'_>, e: &Entry) -> Result<i64, ConfigError> {
    parse_int(At::entry(doc, e), &e.key, range_of(&e.key), &e.value)
}

impl GenerationConfig {
    /// Parse `generation_config.json` text. Keys that are not about
    /// sampling (`bos_token_id`, `max_length`, `transformers_version`, ...)
    /// are ignored; the sampling ones are type- and range-checked.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] with `line:column`; [`ConfigError::WrongType`]
    /// / [`ConfigError::OutOfRange`] naming the key, located at it;
    /// [`ConfigError::DuplicateKey`] for a key given twice.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let (doc, root) = parse_json(text)?;
        if root.entries().is_none() {
            return Err(ConfigError::WrongType {
                path: "(root)".into(),
                found: root.type_word(doc.format).into(),
                expected: "a JSON object".into(),
                location: Some(crate::Location { line: 1, column: 1 }),
            });
        }
        let get = |k: &str| root.get(k).filter(|e| !e.value.is_null());
        let mut cfg = GenerationConfig::default();
        if let Some(e) = get("temperature") {
            cfg.temperature = Some(number(doc, e)?);
        }
        if let Some(e) = get("top_k") {
            cfg.top_k = Some(integer(doc, e)?);
        }
        if let Some(e) = get("top_p") {
            cfg.top_p = Some(number(doc, e)?);
        }
        if let Some(e) = get("min_p") {
            cfg.min_p = Some(number(doc, e)?);
        }
        if let Some(e) = get("typical_p") {
            cfg.typical_p = Some(number(doc, e)?);
        }
        for (_, key) in registered_keys() {
            if let Some(e) = get(key) {
                cfg.stage_keys.0.insert(key.to_string(), number(doc, e)?);
            }
        }
        if let Some(e) = get("repetition_penalty") {
            cfg.repetition_penalty = Some(number(doc, e)?);
        }
        if let Some(e) = get("no_repeat_ngram_size") {
            cfg.no_repeat_ngram_size = Some(integer(doc, e)?);
        }
        if let Some(e) = get("do_sample") {
            let LValue::Bool(b) = e.value.value else {
                return Err(ConfigError::WrongType {
                    path: "do_sample".into(),
                    found: doc.found(&e.value),
                    expected: range_of("do_sample").into(),
                    location: doc.loc(&e.key_span),
                });
            };
            cfg.do_sample = Some(b);
        }
        if let Some(e) = get("min_new_tokens") {
            let at = At::entry(doc, e);
            let n = parse_int(at, &e.key, range_of("min_tokens"), &e.value)?;
            if n < 0 {
                return Err(at.range(&e.key, &e.value, range_of("min_tokens")));
            }
            cfg.min_new_tokens = Some(n);
        }
        if let Some(e) = get("eos_token_id") {
            cfg.eos_token_id = Some(parse_token_ids(At::entry(doc, e), &e.key, &e.value)?);
        }
        if let Some(e) = get("num_beams") {
            cfg.num_beams = Some(integer(doc, e)?);
        }
        if let Some(e) = get("num_return_sequences") {
            cfg.num_return_sequences = Some(integer(doc, e)?);
        }
        if let Some(e) = get("length_penalty") {
            cfg.length_penalty = Some(number(doc, e)?);
        }
        if let Some(e) = get("early_stopping") {
            crate::flat::check_field_type(doc, e)?;
            cfg.early_stopping = Some(match &e.value.value {
                LValue::Bool(b) => crate::EarlyStoppingFlag::Bool(*b),
                _ => {
                    crate::EarlyStoppingFlag::Word(e.value.as_str().unwrap_or_default().to_string())
                }
            });
        }
        for (key, neutral) in UNSUPPORTED {
            let Some(e) = get(key) else { continue };
            let v = &e.value;
            let matters = match (neutral, &v.value) {
                (Some(n), LValue::Int(_) | LValue::Float(_)) => v.as_f64() != Some(n),
                (_, LValue::Array(a)) => !a.is_empty(),
                (_, LValue::Table(o)) => !o.is_empty(),
                (_, LValue::Bool(b)) => *b,
                _ => true,
            };
            if matters {
                cfg.diagnostics.push(Diagnostic::Unsupported {
                    key: key.to_string(),
                    // Compact, as serde_json writes it.
                    value: serde_json::from_str::<serde_json::Value>(doc.raw(&v.span))
                        .map_or_else(|_| doc.raw(&v.span).trim().to_string(), |x| x.to_string()),
                });
            }
        }
        cfg.to_params()
            .check()
            .map_err(|e| locate_range_error(doc, &root, e))?;
        Ok(cfg)
    }

    /// Read and parse a `generation_config.json` file.
    ///
    /// # Errors
    /// [`ConfigError::Io`], or as [`GenerationConfig::from_json_str`].
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_json_str(&text)
    }

    /// The file's values as flat parameters (absent keys stay `None`).
    pub fn to_params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            stage_keys: self.stage_keys.clone(),
            repetition_penalty: self.repetition_penalty,
            no_repeat_ngram_size: self.no_repeat_ngram_size,
            do_sample: self.do_sample,
            min_tokens: self.min_new_tokens,
            stop_token_ids: self.eos_token_id.clone(),
            num_beams: self.num_beams,
            num_return_sequences: self.num_return_sequences,
            length_penalty: self.length_penalty,
            early_stopping: self.early_stopping.clone(),
            ..SamplingParams::default()
        }
    }
}
