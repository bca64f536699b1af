//! Hugging Face `generation_config.json` import.

use std::path::Path;

use serde_json::Value;

use crate::error::{ConfigError, Diagnostic};
use crate::flat::{SamplingParams, StageKeys, range_of, registered_keys};
use crate::json::{Step, f32_of, found_of, json_type, locate, num_text, schema_error};

/// The sampling keys of a model's `generation_config.json` (transformers'
/// `GenerationConfig`) that map onto this crate's stages. Only keys present
/// in the file (and not `null`) are set: transformers' own defaults for
/// absent keys (e.g. `top_k = 50`) are *not* applied, as in vLLM.
///
/// Semantics: `top_k = 0` is off (transformers); `repetition_penalty`
/// counts prompt and output tokens over the whole history;
/// `no_repeat_ngram_size` bans n-gram repeats over prompt and output;
/// `do_sample = false` means greedy (but see [`SamplingParams::over`]).
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
    /// Sampling-related keys present in the file with a non-neutral value
    /// that this crate does not implement (beam search, contrastive search,
    /// ...): [`Diagnostic::Unsupported`].
    pub diagnostics: Vec<Diagnostic>,
}

/// Keys with an effect on decoding that have no stage here, with the value
/// that means "off" (`None`: any non-empty value matters).
const UNSUPPORTED: [(&str, Option<f64>); 10] = [
    ("num_beams", Some(1.0)),
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

fn number(text: &str, key: &str, v: &Value) -> Result<f32, ConfigError> {
    let location = locate(text, &[Step::Key(key)]);
    match f32_of(v) {
        Ok(Some(x)) => Ok(x),
        Err(()) => Err(ConfigError::OutOfRange {
            path: key.to_string(),
            value: num_text(v),
            expected: range_of(key).into(),
            location,
        }),
        Ok(None) => Err(ConfigError::WrongType {
            path: key.to_string(),
            found: found_of(v),
            expected: range_of(key).into(),
            location,
        }),
    }
}

fn integer(text: &str, key: &str, v: &Value) -> Result<i64, ConfigError> {
    let location = locate(text, &[Step::Key(key)]);
    match v {
        Value::Number(n) if n.as_i64().is_some() => Ok(n.as_i64().unwrap_or_default()),
        Value::Number(n) if !n.is_f64() => Err(ConfigError::OutOfRange {
            path: key.to_string(),
            value: n.to_string(),
            expected: range_of(key).into(),
            location,
        }),
        other => Err(ConfigError::WrongType {
            path: key.to_string(),
            found: found_of(other),
            expected: range_of(key).into(),
            location,
        }),
    }
}

impl GenerationConfig {
    /// Parse `generation_config.json` text. Keys that are not about
    /// sampling (`bos_token_id`, `max_length`, `transformers_version`, ...)
    /// are ignored; the sampling ones are type- and range-checked.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] with `line:column`; [`ConfigError::WrongType`]
    /// / [`ConfigError::OutOfRange`] naming the key (location: its first
    /// occurrence in the text).
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| schema_error(text, &e))?;
        crate::json_dup::reject_duplicate_keys(text)?;
        let Value::Object(map) = &value else {
            return Err(ConfigError::WrongType {
                path: "(root)".into(),
                found: json_type(&value).into(),
                expected: "a JSON object".into(),
                location: Some(crate::Location { line: 1, column: 1 }),
            });
        };
        let get = |k: &str| map.get(k).filter(|v| !v.is_null());
        let mut cfg = GenerationConfig::default();
        if let Some(v) = get("temperature") {
            cfg.temperature = Some(number(text, "temperature", v)?);
        }
        if let Some(v) = get("top_k") {
            cfg.top_k = Some(integer(text, "top_k", v)?);
        }
        if let Some(v) = get("top_p") {
            cfg.top_p = Some(number(text, "top_p", v)?);
        }
        if let Some(v) = get("min_p") {
            cfg.min_p = Some(number(text, "min_p", v)?);
        }
        if let Some(v) = get("typical_p") {
            cfg.typical_p = Some(number(text, "typical_p", v)?);
        }
        for (_, key) in registered_keys() {
            if let Some(v) = get(key) {
                cfg.stage_keys
                    .0
                    .insert(key.to_string(), number(text, key, v)?);
            }
        }
        if let Some(v) = get("repetition_penalty") {
            cfg.repetition_penalty = Some(number(text, "repetition_penalty", v)?);
        }
        if let Some(v) = get("no_repeat_ngram_size") {
            cfg.no_repeat_ngram_size = Some(integer(text, "no_repeat_ngram_size", v)?);
        }
        if let Some(v) = get("do_sample") {
            cfg.do_sample = Some(v.as_bool().ok_or_else(|| ConfigError::WrongType {
                path: "do_sample".into(),
                found: found_of(v),
                expected: range_of("do_sample").into(),
                location: locate(text, &[Step::Key("do_sample")]),
            })?);
        }
        for (key, neutral) in UNSUPPORTED {
            let Some(v) = get(key) else { continue };
            let matters = match (neutral, v) {
                (Some(n), Value::Number(x)) => x.as_f64() != Some(n),
                (_, Value::Array(a)) => !a.is_empty(),
                (_, Value::Object(o)) => !o.is_empty(),
                (_, Value::Bool(b)) => *b,
                _ => true,
            };
            if matters {
                cfg.diagnostics.push(Diagnostic::Unsupported {
                    key: key.to_string(),
                    value: v.to_string(),
                });
            }
        }
        cfg.to_params().check().map_err(|e| match e {
            ConfigError::OutOfRange {
                path,
                value,
                expected,
                ..
            } => ConfigError::OutOfRange {
                location: crate::json::locate_top_key(text, &path),
                path,
                value,
                expected,
            },
            other => other,
        })?;
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
            ..SamplingParams::default()
        }
    }
}
