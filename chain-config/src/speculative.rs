//! Speculative decoding settings, vLLM's `speculative_config` names: in TOML
//! as a `[speculative]` table, in a JSON request (`serve`'s request lines) as
//! a `speculative` object.
//!
//! ```toml
//! [speculative]
//! method = "ngram"            # prompt lookup: drafts copied from the context
//! num_speculative_tokens = 4  # at most this many drafts per step, 1..=64
//! prompt_lookup_min = 2       # shortest suffix n-gram matched, >= 1
//! prompt_lookup_max = 4       # longest suffix n-gram looked for, >= min
//! ```

use crate::ConfigError;
use crate::suggest::suggest;

/// The most draft tokens per step (`sampler_cpu::speculative::MAX_DRAFT_TOKENS`).
pub const MAX_SPECULATIVE_TOKENS: usize = 64;

/// How drafts are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed the earliest earlier
    /// occurrence of the context's longest suffix n-gram (vLLM `ngram`).
    #[default]
    Ngram,
}

/// A request's speculative decoding settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// How drafts are made (`method`).
    pub method: SpeculativeMethod,
    /// Most drafts per step, `1..=64` (default 4).
    pub num_speculative_tokens: usize,
    /// Shortest suffix n-gram matched, `>= 1` (default 2).
    pub prompt_lookup_min: usize,
    /// Longest suffix n-gram looked for, `>= prompt_lookup_min` (default 4).
    pub prompt_lookup_max: usize,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            method: SpeculativeMethod::Ngram,
            num_speculative_tokens: 4,
            prompt_lookup_min: 2,
            prompt_lookup_max: 4,
        }
    }
}

/// A value of the table, as either front end read it.
pub(crate) enum Field<'a> {
    Str(&'a str),
    Int(i128),
    Other,
}

/// What went wrong with one key.
pub(crate) enum Refusal {
    Unknown(Option<String>),
    WrongType(String),
    OutOfRange(String),
}

impl SpeculativeConfig {
    /// The keys, in the order TOML writes them.
    pub const KEYS: [&'static str; 4] = [
        "method",
        "num_speculative_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
    ];

    /// Set one key.
    pub(crate) fn set(&mut self, key: &str, value: Field<'_>) -> Result<(), Refusal> {
        let count = |v: Field<'_>, expected: &str| match v {
            Field::Int(i) => usize::try_from(i).map_err(|_| Refusal::OutOfRange(expected.into())),
            _ => Err(Refusal::WrongType(expected.into())),
        };
        match key {
            "method" => match value {
                Field::Str("ngram") => self.method = SpeculativeMethod::Ngram,
                Field::Str(_) => return Err(Refusal::OutOfRange("\"ngram\"".into())),
                _ => return Err(Refusal::WrongType("a string: \"ngram\"".into())),
            },
            "num_speculative_tokens" => {
                self.num_speculative_tokens = count(value, "an integer in [1, 64]")?;
            }
            "prompt_lookup_min" => self.prompt_lookup_min = count(value, "an integer >= 1")?,
            "prompt_lookup_max" => {
                self.prompt_lookup_max = count(value, "an integer >= prompt_lookup_min")?;
            }
            _ => return Err(Refusal::Unknown(suggest(key, Self::KEYS))),
        }
        Ok(())
    }

    /// The settings' ranges: the key at fault, its value and the range.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String, String)> {
        let k = self.num_speculative_tokens;
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&k) {
            return Err((
                "num_speculative_tokens",
                k.to_string(),
                format!("an integer in [1, {MAX_SPECULATIVE_TOKENS}]"),
            ));
        }
        if self.prompt_lookup_min == 0 {
            return Err(("prompt_lookup_min", "0".into(), "an integer >= 1".into()));
        }
        if self.prompt_lookup_max < self.prompt_lookup_min {
            return Err((
                "prompt_lookup_max",
                self.prompt_lookup_max.to_string(),
                format!(
                    "an integer >= prompt_lookup_min ({})",
                    self.prompt_lookup_min
                ),
            ));
        }
        Ok(())
    }

    /// Settings from a JSON object (a request's `speculative`; `path`
    /// prefixes the keys in errors). Absent keys keep their defaults.
    ///
    /// # Errors
    /// [`ConfigError::WrongType`] (not an object, a key of the wrong type),
    /// [`ConfigError::UnknownKey`] (with the nearest key),
    /// [`ConfigError::OutOfRange`].
    pub fn from_json(v: &serde_json::Value, path: &str) -> Result<Self, ConfigError> {
        let Some(map) = v.as_object() else {
            return Err(ConfigError::WrongType {
                path: path.into(),
                found: json_type(v).into(),
                expected: "an object (`{\"method\": \"ngram\", \"num_speculative_tokens\": 4}`)"
                    .into(),
                location: None,
            });
        };
        let mut cfg = Self::default();
        for (key, value) in map {
            let field = match value {
                serde_json::Value::String(s) => Field::Str(s),
                serde_json::Value::Number(n) => n
                    .as_i64()
                    .map(i128::from)
                    .or(n.as_u64().map(i128::from))
                    .map_or(Field::Other, Field::Int),
                _ => Field::Other,
            };
            let at = format!("{path}.{key}");
            cfg.set(key, field).map_err(|r| match r {
                Refusal::Unknown(suggestion) => ConfigError::UnknownKey {
                    path: at.clone(),
                    location: None,
                    suggestion,
                },
                Refusal::WrongType(expected) => ConfigError::WrongType {
                    path: at.clone(),
                    found: json_type(value).into(),
                    expected,
                    location: None,
                },
                Refusal::OutOfRange(expected) => ConfigError::OutOfRange {
                    path: at.clone(),
                    value: value.to_string(),
                    expected,
                    location: None,
                },
            })?;
        }
        cfg.check()
            .map_err(|(key, value, expected)| ConfigError::OutOfRange {
                path: format!("{path}.{key}"),
                value,
                expected,
                location: None,
            })?;
        Ok(cfg)
    }
}

/// A JSON value's type, as errors name it.
pub(crate) fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(n) if n.is_f64() => "float",
        serde_json::Value::Number(_) => "integer",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn toml_table_and_its_errors() {
        let chain = "samplers = \"greedy\"\n[greedy]\n";
        let cfg = crate::ChainConfig::from_toml_str(&format!(
            "{chain}[speculative]\nmethod = \"ngram\"\nnum_speculative_tokens = 3\n"
        ))
        .unwrap();
        let sp = cfg.speculative.unwrap();
        assert_eq!((sp.num_speculative_tokens, sp.prompt_lookup_min), (3, 2));
        assert!(cfg.to_toml_string().contains("[speculative]"));
        for (table, says) in [
            (
                "num_speculative_tokens = 0",
                "4:26: `speculative.num_speculative_tokens` = 0",
            ),
            ("num_speculative_tokens = 99", "[1, 64]"),
            ("prompt_lookup_min = 5", ">= prompt_lookup_min (5)"),
            ("method = \"medusa\"", "\"ngram\""),
            ("num_tokens = 2", "speculative.num_tokens"),
            ("prompt_lookup_max = \"4\"", "string"),
        ] {
            let text = format!("{chain}[speculative]\n{table}\n");
            let e = crate::ChainConfig::from_toml_str(&text).unwrap_err();
            assert!(
                e.to_string().contains(says),
                "{table}: {e} does not say {says}"
            );
        }
    }

    #[test]
    fn json_settings_and_their_errors() {
        let ok = SpeculativeConfig::from_json(
            &json!({"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 5}),
            "speculative",
        )
        .unwrap();
        assert_eq!(ok.num_speculative_tokens, 6);
        assert_eq!((ok.prompt_lookup_min, ok.prompt_lookup_max), (2, 5));
        for (v, says) in [
            (
                json!({"num_speculative_tokens": 0}),
                "`speculative.num_speculative_tokens` = 0",
            ),
            (json!({"num_speculative_tokens": 65}), "[1, 64]"),
            (json!({"num_speculative_tokens": -1}), "out of range"),
            (json!({"num_speculative_tokens": 2.5}), "float"),
            (json!({"prompt_lookup_min": 0}), "prompt_lookup_min"),
            (
                json!({"prompt_lookup_min": 3, "prompt_lookup_max": 2}),
                ">= prompt_lookup_min (3)",
            ),
            (json!({"method": "eagle"}), "\"ngram\""),
            (
                json!({"num_speculative_token": 4}),
                "num_speculative_tokens",
            ),
            (json!(4), "an object"),
        ] {
            let e = SpeculativeConfig::from_json(&v, "speculative").unwrap_err();
            assert!(e.to_string().contains(says), "{v}: {e} does not say {says}");
        }
    }
}
