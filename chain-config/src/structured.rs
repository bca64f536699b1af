//! Structured outputs in the config front ends: what a request's output
//! must match ([`StructuredOutput`]), from a TOML `[structured]` table or
//! the flat keys of OpenAI (`response_format`) and vLLM (`guided_json`,
//! `guided_regex`, `guided_grammar`, `guided_choice`).
//!
//! ```toml
//! samplers = "mask;top_k;temperature;dist"  # `mask` is put first when missing
//! [structured]
//! json_schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}}'
//! # or: json_object = true | regex = "[a-z]+@example\\.com" | grammar = "start: ..."
//! ```
//!
//! A request with structured output gets a `mask` stage first in its chain
//! (where none stands before its selecting stage): the matcher's mask then
//! applies before every other stage, as in vLLM.

use sampler_core::{ChainSpec, StageKind, StageSpec, StructuredOutput};

use crate::ConfigError;
use crate::located::{Doc, Node, Value};
use crate::speculative::json_type;
use crate::suggest::suggest;

/// The keys of the TOML table (one of them).
pub const STRUCTURED_KEYS: [&str; 4] = ["json_schema", "json_object", "regex", "grammar"];

/// Put a `mask` stage first in `chain` unless one acts already (before its
/// first selecting stage).
pub(crate) fn ensure_mask(chain: &mut ChainSpec) {
    for st in &chain.stages {
        if st.kind() == StageKind::Mask {
            return;
        }
        if st.selects() {
            break;
        }
    }
    chain.stages.retain(|s| s.kind() != StageKind::Mask);
    chain.stages.insert(0, StageSpec::Mask);
}

/// A located TOML value as JSON (a TOML table given as a schema); a date
/// or a non-finite float has no JSON form: the error names it (`path`).
fn to_json(doc: Doc<'_>, n: &Node, path: &str) -> Result<serde_json::Value, ConfigError> {
    use serde_json::Value as J;
    let no_json = || ConfigError::WrongType {
        path: path.into(),
        found: doc.found(n),
        expected: "a value JSON can hold (no dates, no nan or inf)".into(),
        location: doc.loc(&n.span),
    };
    Ok(match &n.value {
        Value::Null => J::Null,
        Value::Datetime => return Err(no_json()),
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => i64::try_from(*i)
            .map(J::from)
            .unwrap_or_else(|_| J::from(*i as f64)),
        Value::Float(_) => J::Number(
            n.as_f64()
                .and_then(serde_json::Number::from_f64)
                .ok_or_else(no_json)?,
        ),
        Value::Str(s) => J::String(s.clone()),
        Value::Array(items) => J::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| to_json(doc, x, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Value::Table(entries) => J::Object(
            entries
                .iter()
                .map(|e| {
                    Ok((
                        e.key.clone(),
                        to_json(doc, &e.value, &format!("{path}.{}", e.key))?,
                    ))
                })
                .collect::<Result<_, ConfigError>>()?,
        ),
    })
}

/// A schema given as JSON text: it must parse.
fn schema_text(
    path: &str,
    text: &str,
    location: Option<crate::Location>,
) -> Result<String, ConfigError> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if v.is_object() || v.is_boolean() => Ok(text.to_string()),
        Ok(_) => Err(ConfigError::WrongType {
            path: path.into(),
            found: "JSON that is not an object".into(),
            expected: "a JSON Schema (an object)".into(),
            location,
        }),
        Err(e) => Err(ConfigError::OutOfRange {
            path: path.into(),
            value: format!("{:?}", text.chars().take(40).collect::<String>()),
            expected: format!("a JSON Schema as JSON text (it does not parse: {e})"),
            location,
        }),
    }
}

/// The `[structured]` table of a TOML declaration.
pub(crate) fn parse_toml(doc: Doc<'_>, v: &Node) -> Result<StructuredOutput, ConfigError> {
    let Some(entries) = v.entries() else {
        return Err(ConfigError::WrongType {
            path: "structured".into(),
            found: doc.found(v),
            expected:
                "a table (`[structured]` with one of json_schema, json_object, regex, grammar)"
                    .into(),
            location: doc.loc(&v.span),
        });
    };
    let mut found: Option<(StructuredOutput, &str)> = None;
    for e in entries {
        let path = format!("structured.{}", e.key);
        let at = doc.loc(&e.value.span);
        let wrong = |expected: &str| ConfigError::WrongType {
            path: path.clone(),
            found: doc.found(&e.value),
            expected: expected.into(),
            location: at,
        };
        let out = match (e.key.as_str(), &e.value.value) {
            ("json_schema", Value::Str(s)) => {
                StructuredOutput::JsonSchema(schema_text(&path, s, at)?)
            }
            ("json_schema", Value::Table(_)) => {
                StructuredOutput::JsonSchema(to_json(doc, &e.value, &path)?.to_string())
            }
            ("json_schema", _) => return Err(wrong("a JSON Schema: JSON text or a table")),
            ("json_object", Value::Bool(true)) => StructuredOutput::JsonObject,
            ("json_object", Value::Bool(false)) => continue,
            ("json_object", _) => return Err(wrong("true")),
            ("regex", Value::Str(s)) => StructuredOutput::Regex(s.clone()),
            ("grammar", Value::Str(s)) => StructuredOutput::Grammar(s.clone()),
            ("regex" | "grammar", _) => return Err(wrong("a string")),
            (other, _) => {
                return Err(ConfigError::UnknownKey {
                    path,
                    location: doc.loc(&e.key_span),
                    suggestion: suggest(other, STRUCTURED_KEYS),
                });
            }
        };
        if let Some((_, first)) = &found {
            return Err(ConfigError::Conflict {
                message: format!(
                    "`structured.{first}` and `structured.{}` are both given: a request has one structured output",
                    e.key
                ),
                location: doc.loc(&e.key_span),
            });
        }
        found = Some((out, e.key.as_str()));
    }
    found
        .map(|(o, _)| o)
        .ok_or_else(|| ConfigError::MissingKey {
            path: "structured".into(),
            help: "give one of json_schema, json_object, regex, grammar".into(),
            location: doc.loc(&v.span),
        })
}

/// The table as TOML (after the chain's tables).
pub(crate) fn write_toml(out: &mut String, s: &StructuredOutput) {
    let quote = |t: &str| toml::Value::String(t.to_string()).to_string();
    out.push_str("\n[structured]\n");
    let line = match s {
        StructuredOutput::JsonSchema(t) => format!("json_schema = {}", quote(t)),
        StructuredOutput::JsonObject => "json_object = true".into(),
        StructuredOutput::Regex(r) => format!("regex = {}", quote(r)),
        StructuredOutput::Grammar(g) => format!("grammar = {}", quote(g)),
    };
    out.push_str(&line);
    out.push('\n');
}

/// Escape `s` for a regular expression (a `guided_choice` item).
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The flat keys' structured output: OpenAI's `response_format` (`text`,
/// `json_object`, `json_schema` with its `json_schema.schema`), vLLM's
/// `guided_json` (a schema object or its JSON text), `guided_regex`,
/// `guided_grammar` (Lark), `guided_choice` (a list of strings: the output
/// is one of them).
pub(crate) fn from_flat(
    p: &crate::SamplingParams,
) -> Result<Option<StructuredOutput>, ConfigError> {
    let oor = |path: &str, value: String, expected: &str| ConfigError::OutOfRange {
        path: path.into(),
        value,
        expected: expected.into(),
        location: None,
    };
    let mut given: Vec<(&str, StructuredOutput)> = Vec::new();
    if let Some(rf) = &p.response_format {
        let ty = rf.get("type").and_then(|t| t.as_str());
        match ty {
            Some("text") => {}
            Some("json_object") => given.push(("response_format", StructuredOutput::JsonObject)),
            Some("json_schema") => {
                let Some(schema) = rf.get("json_schema").and_then(|j| j.get("schema")) else {
                    return Err(ConfigError::MissingKey {
                        path: "response_format.json_schema.schema".into(),
                        help: "`{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}`".into(),
                        location: None,
                    });
                };
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(ConfigError::WrongType {
                        path: "response_format.json_schema.schema".into(),
                        found: json_type(schema).into(),
                        expected: "a JSON Schema (an object)".into(),
                        location: None,
                    });
                }
                given.push((
                    "response_format",
                    StructuredOutput::JsonSchema(schema.to_string()),
                ));
            }
            _ => {
                return Err(oor(
                    "response_format.type",
                    rf.get("type").map_or("(missing)".into(), |t| t.to_string()),
                    "\"text\", \"json_object\" or \"json_schema\"",
                ));
            }
        }
    }
    if let Some(g) = &p.guided_json {
        let s = match g {
            serde_json::Value::String(text) => schema_text("guided_json", text, None)?,
            v if v.is_object() || v.is_boolean() => v.to_string(),
            v => {
                return Err(ConfigError::WrongType {
                    path: "guided_json".into(),
                    found: json_type(v).into(),
                    expected: "a JSON Schema (an object, or its JSON text)".into(),
                    location: None,
                });
            }
        };
        given.push(("guided_json", StructuredOutput::JsonSchema(s)));
    }
    if let Some(r) = &p.guided_regex {
        given.push(("guided_regex", StructuredOutput::Regex(r.clone())));
    }
    if let Some(g) = &p.guided_grammar {
        given.push(("guided_grammar", StructuredOutput::Grammar(g.clone())));
    }
    if let Some(choices) = &p.guided_choice {
        if choices.is_empty() {
            return Err(oor(
                "guided_choice",
                "[]".into(),
                "a non-empty list of strings",
            ));
        }
        let alts: Vec<String> = choices.iter().map(|c| regex_escape(c)).collect();
        given.push((
            "guided_choice",
            StructuredOutput::Regex(format!("({})", alts.join("|"))),
        ));
    }
    match given.len() {
        0 => Ok(None),
        1 => Ok(given.pop().map(|(_, s)| s)),
        _ => Err(ConfigError::Conflict {
            message: format!(
                "`{}` and `{}` are both given: a request has one structured output",
                given[0].0, given[1].0
            ),
            location: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChainConfig, SamplingParams};

    #[test]
    fn toml_table_round_trips_and_puts_mask_first() {
        let text = "samplers = \"top_k;dist\"\n[top_k]\nk = 5\n[structured]\njson_schema = '{\"type\": \"object\", \"required\": [\"a\"]}'\n";
        let cfg = ChainConfig::from_toml_str(text).unwrap();
        assert_eq!(cfg.chain.stages[0], StageSpec::Mask);
        assert_eq!(cfg.chain.stages.len(), 3);
        assert!(
            matches!(&cfg.structured, Some(StructuredOutput::JsonSchema(s)) if s.contains("required"))
        );
        let again = ChainConfig::from_toml_str(&cfg.to_toml_string()).unwrap();
        assert_eq!((again.chain, again.structured), (cfg.chain, cfg.structured));
        // A schema as a TOML table; a regex and a grammar with quotes and
        // newlines survive the round trip.
        for table in [
            "json_schema = { type = \"object\", properties = { n = { type = \"integer\", maximum = 9 } } }",
            "regex = '[a-z]+\"\\d'",
            "grammar = \"\"\"\nstart: \"a\" | 'b'\n\"\"\"",
            "json_object = true",
        ] {
            let cfg = ChainConfig::from_toml_str(&format!(
                "samplers = \"mask;dist\"\n[dist]\n[structured]\n{table}\n"
            ))
            .unwrap();
            assert_eq!(cfg.chain.stages.len(), 2, "the mask stage is not doubled");
            let again = ChainConfig::from_toml_str(&cfg.to_toml_string()).unwrap();
            assert_eq!(again.structured, cfg.structured, "{table}");
        }
    }

    #[test]
    fn toml_errors_name_the_key() {
        for (table, says) in [
            ("json_schema = '{\"type\": '", "structured.json_schema"),
            ("json_schema = '[1]'", "not an object"),
            ("json_schema = 3", "JSON text or a table"),
            ("regex = 3", "structured.regex"),
            ("json_object = 1", "true"),
            ("regexp = \"a\"", "did you mean `regex`"),
            ("regex = \"a\"\ngrammar = \"start: x\"", "both given"),
            ("json_object = false", "missing key `structured`"),
            (
                "json_schema = { const = 1979-05-27 }",
                "`structured.json_schema.const` has the wrong type",
            ),
            (
                "json_schema = { maximum = nan }",
                "structured.json_schema.maximum",
            ),
        ] {
            let text = format!("samplers = \"dist\"\n[dist]\n[structured]\n{table}\n");
            let e = ChainConfig::from_toml_str(&text).unwrap_err().to_string();
            assert!(e.contains(says), "{table}: `{e}` does not say `{says}`");
        }
    }

    #[test]
    fn flat_keys_of_openai_and_vllm() {
        let cfg = |json: &str| SamplingParams::from_json_str(json).and_then(|p| p.to_chain());
        let c = cfg(r#"{"temperature": 0.7, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}}}"#).unwrap();
        assert_eq!(
            c.structured,
            Some(StructuredOutput::JsonSchema("{\"type\":\"object\"}".into()))
        );
        assert_eq!(c.chain.stages[0], StageSpec::Mask);
        let c = cfg(r#"{"response_format": {"type": "json_object"}}"#).unwrap();
        assert_eq!(c.structured, Some(StructuredOutput::JsonObject));
        let c = cfg(r#"{"response_format": {"type": "text"}}"#).unwrap();
        assert_eq!(c.structured, None);
        assert!(!c.chain.stages.contains(&StageSpec::Mask));
        let c = cfg(r#"{"guided_json": "{\"type\": \"array\"}"}"#).unwrap();
        assert_eq!(
            c.structured,
            Some(StructuredOutput::JsonSchema("{\"type\": \"array\"}".into()))
        );
        let c = cfg(r#"{"guided_choice": ["yes", "no (1.5)"]}"#).unwrap();
        assert_eq!(
            c.structured,
            Some(StructuredOutput::Regex("(yes|no \\(1\\.5\\))".into()))
        );
        let c = cfg(r#"{"temperature": 0, "guided_regex": "[0-9]+"}"#).unwrap();
        assert_eq!(c.chain.stages, vec![StageSpec::Mask, StageSpec::Greedy]);
        for (json, says) in [
            (
                r#"{"response_format": {"type": "xml"}}"#,
                "response_format.type",
            ),
            (
                r#"{"response_format": {"type": "json_schema"}}"#,
                "response_format.json_schema.schema",
            ),
            (r#"{"response_format": "json"}"#, "response_format"),
            (r#"{"guided_json": 5}"#, "guided_json"),
            (r#"{"guided_json": "{oops"}"#, "does not parse"),
            (r#"{"guided_regex": ["a"]}"#, "guided_regex"),
            (r#"{"guided_choice": []}"#, "non-empty"),
            (
                r#"{"guided_regex": "a", "guided_grammar": "start: x"}"#,
                "both given",
            ),
            (r#"{"guided_regexp": "a"}"#, "guided_regex"),
        ] {
            let e = cfg(json).unwrap_err().to_string();
            assert!(e.contains(says), "{json}: `{e}` does not say `{says}`");
        }
    }
}
