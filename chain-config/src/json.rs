//! Tagged JSON (serde of `ChainSpec`) -> `ChainSpec`, with the same
//! suggestions for unknown names and keys as the TOML loader, and errors
//! that name the key path (`stages[1].min_keep`) and its `line:column`.

use sampler_core::{ChainSpec, ParamKind, ParamMeta, StageKind, StageSpec};
use serde_json::{Map, Value};

use crate::error::{ConfigError, Location};
use crate::suggest::suggest;

/// `line:column` of a serde_json error (serde_json counts from 1; 0 = none).
pub(crate) fn json_location(e: &serde_json::Error) -> Option<Location> {
    (e.line() > 0).then(|| Location {
        line: e.line(),
        column: e.column().max(1),
    })
}

/// Location of the first `"key"` in the text: a best effort for errors found
/// after parsing (serde_json's `Value` keeps no positions).
pub(crate) fn find_key(text: &str, key: &str) -> Option<Location> {
    let needle = format!("\"{key}\"");
    text.find(&needle).map(|o| Location::from_offset(text, o))
}

/// One step of a path into a JSON document.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step<'a> {
    /// A member of an object, by its key as written (no escapes).
    Key(&'a str),
    /// An element of an array, from 0.
    Index(usize),
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Index just past the string that starts at `i` (a `"`).
fn skip_string(b: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// Index just past the value that starts at `i`.
fn skip_value(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_string(b, j);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            b.len()
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']') && !b[j].is_ascii_whitespace()
            {
                j += 1;
            }
            j
        }
    }
}

/// Byte offset of what `path` names in `text`: the key of the last
/// `Step::Key`, or the start of the element of the last `Step::Index`.
/// `None` when the text does not have it (or the path is empty).
pub(crate) fn find_path(text: &str, path: &[Step<'_>]) -> Option<usize> {
    let b = text.as_bytes();
    let mut cur = skip_ws(b, 0);
    let mut found = None;
    for step in path {
        match *step {
            Step::Key(key) => {
                if b.get(cur) != Some(&b'{') {
                    return None;
                }
                let mut i = skip_ws(b, cur + 1);
                let mut hit = None;
                while b.get(i) == Some(&b'"') {
                    let end = skip_string(b, i);
                    let name = text.get(i + 1..end.saturating_sub(1))?;
                    let v = skip_ws(b, skip_ws(b, end) + 1);
                    if name == key {
                        hit = Some((i, v));
                        break;
                    }
                    i = skip_ws(b, skip_value(b, v));
                    if b.get(i) == Some(&b',') {
                        i = skip_ws(b, i + 1);
                    }
                }
                let (k, v) = hit?;
                found = Some(k);
                cur = v;
            }
            Step::Index(n) => {
                if b.get(cur) != Some(&b'[') {
                    return None;
                }
                let mut i = skip_ws(b, cur + 1);
                for _ in 0..n {
                    if i >= b.len() || b[i] == b']' {
                        return None;
                    }
                    i = skip_ws(b, skip_value(b, i));
                    if b.get(i) == Some(&b',') {
                        i = skip_ws(b, i + 1);
                    }
                }
                if i >= b.len() || b[i] == b']' {
                    return None;
                }
                found = Some(i);
                cur = i;
            }
        }
    }
    found
}

/// [`find_path`] as a location.
pub(crate) fn locate(text: &str, path: &[Step<'_>]) -> Option<Location> {
    find_path(text, path).map(|o| Location::from_offset(text, o))
}

/// Location of the top-level key `key` (the key itself, not the first
/// textual match of `"key"` anywhere), else of its first textual match.
pub(crate) fn locate_top_key(text: &str, key: &str) -> Option<Location> {
    locate(text, &[Step::Key(key)]).or_else(|| find_key(text, key))
}

/// Location of the value of `path`'s last key (`"type": "top_kk"` points at
/// `"top_kk"`), else of the key.
pub(crate) fn locate_value(text: &str, path: &[Step<'_>]) -> Option<Location> {
    let key = find_path(text, path)?;
    let b = text.as_bytes();
    let colon = skip_ws(b, skip_string(b, key));
    let at = if b.get(colon) == Some(&b':') {
        skip_ws(b, colon + 1)
    } else {
        key
    };
    Some(Location::from_offset(text, at))
}

/// Location of `stages[index].key`, else of `stages[index]`, else of the
/// first `"key"` in the text.
pub(crate) fn locate_stage_key(text: &str, index: usize, key: &str) -> Option<Location> {
    locate(
        text,
        &[Step::Key("stages"), Step::Index(index), Step::Key(key)],
    )
    .or_else(|| locate(text, &[Step::Key("stages"), Step::Index(index)]))
    .or_else(|| find_key(text, key))
}

pub(crate) fn schema_error(text: &str, e: &serde_json::Error) -> ConfigError {
    let _ = text;
    // serde_json appends " at line L column C"; the location says it.
    let msg = e.to_string();
    let msg = msg
        .rsplit_once(" at line ")
        .map_or(msg.as_str(), |(m, _)| m)
        .to_string();
    if e.is_syntax() || e.is_eof() {
        ConfigError::Syntax {
            format: "JSON",
            message: msg,
            location: json_location(e),
        }
    } else {
        ConfigError::Schema {
            format: "JSON",
            message: msg,
            location: json_location(e),
        }
    }
}

/// What a JSON value is, for "found ..." in messages: the type, or for a
/// number that should have been an integer, the number itself.
pub(crate) fn found_of(v: &Value) -> String {
    match v {
        Value::Number(_) | Value::String(_) | Value::Bool(_) => {
            let mut text = num_text(v);
            if text.chars().count() > 40 {
                text = text.chars().take(37).collect::<String>() + "...";
            }
            format!("{} {text}", json_type(v))
        }
        other => json_type(other).to_string(),
    }
}

/// A JSON value as text, numbers as usually written (`1e39`, not serde's `1e+39`).
pub(crate) fn num_text(v: &Value) -> String {
    v.to_string().replace("e+", "e")
}

/// A JSON number that fits an `f32`: `Ok(None)` when `v` is not a number,
/// `Err(())` when it is finite but beyond `f32` (it would read as `±inf`).
pub(crate) fn f32_of(v: &Value) -> Result<Option<f32>, ()> {
    match v.as_f64() {
        None => Ok(None),
        Some(x) => {
            let f = x as f32;
            if x.is_finite() && f.is_infinite() {
                Err(())
            } else {
                Ok(Some(f))
            }
        }
    }
}

pub(crate) const SEED_RANGE: &str = "an integer in [0, 2^64 - 1]";
pub(crate) const TOKEN_RANGE: &str = "a token id in [0, 4294967295]";

/// Check the row seed: an unsigned 64-bit integer.
pub(crate) fn check_seed(text: &str, v: &Value) -> Result<Option<u64>, ConfigError> {
    let location = locate(text, &[Step::Key("seed")]);
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_u64() {
            Some(s) => Ok(Some(s)),
            None if n.is_f64() => Err(ConfigError::WrongType {
                path: "seed".into(),
                found: found_of(v),
                expected: SEED_RANGE.into(),
                location,
            }),
            None => Err(ConfigError::OutOfRange {
                path: "seed".into(),
                value: n.to_string(),
                expected: SEED_RANGE.into(),
                location,
            }),
        },
        other => Err(ConfigError::WrongType {
            path: "seed".into(),
            found: found_of(other),
            expected: SEED_RANGE.into(),
            location,
        }),
    }
}

/// Check a list of token-id lists (`dry` sequence breakers) at `path`.
pub(crate) fn check_token_seqs(
    path: &str,
    v: &Value,
    location: Option<Location>,
) -> Result<(), ConfigError> {
    let wrong = |p: String, at: &Value| {
        ConfigError::WrongType {
        path: p,
        found: found_of(at),
        expected: "a list of non-empty token-id lists, e.g. [[13], [29901, 29871]] (token ids: tokenise strings first)".into(),
        location,
    }
    };
    let Value::Array(outer) = v else {
        return Err(wrong(path.to_string(), v));
    };
    for (i, seq) in outer.iter().enumerate() {
        let Value::Array(inner) = seq else {
            return Err(wrong(format!("{path}[{i}]"), seq));
        };
        if inner.is_empty() {
            return Err(ConfigError::OutOfRange {
                path: format!("{path}[{i}]"),
                value: "[]".into(),
                expected: "a list of non-empty token-id lists".into(),
                location,
            });
        }
        for (j, tok) in inner.iter().enumerate() {
            check_token(&format!("{path}[{i}][{j}]"), tok, location)?;
        }
    }
    Ok(())
}

/// Check one token id.
pub(crate) fn check_token(
    path: &str,
    v: &Value,
    location: Option<Location>,
) -> Result<(), ConfigError> {
    match v {
        Value::Number(n) if n.as_u64().is_some_and(|t| u32::try_from(t).is_ok()) => Ok(()),
        Value::Number(n) if !n.is_f64() => Err(ConfigError::OutOfRange {
            path: path.to_string(),
            value: n.to_string(),
            expected: TOKEN_RANGE.into(),
            location,
        }),
        other => Err(ConfigError::WrongType {
            path: path.to_string(),
            found: found_of(other),
            expected: format!("{TOKEN_RANGE} (tokenise strings first)"),
            location,
        }),
    }
}

/// Type-check one stage parameter of the tagged JSON form against its
/// metadata (ranges of floats are checked later by `StageSpec::validate`).
fn check_param(
    path: &str,
    pm: &ParamMeta,
    v: &Value,
    location: Option<Location>,
) -> Result<(), ConfigError> {
    let wrong = |found: String, expected: String| ConfigError::WrongType {
        path: path.to_string(),
        found,
        expected,
        location,
    };
    let range = |value: String| ConfigError::OutOfRange {
        path: path.to_string(),
        value,
        expected: pm.range.to_string(),
        location,
    };
    match pm.kind {
        ParamKind::Int => match v {
            Value::Number(n) => match n.as_i64() {
                Some(x) => {
                    let x = x as f64;
                    if pm.min.is_some_and(|m| x < m) || pm.max.is_some_and(|m| x > m) {
                        Err(range(n.to_string()))
                    } else {
                        Ok(())
                    }
                }
                None if n.is_f64() => Err(wrong(found_of(v), pm.range.to_string())),
                // A count (`usize`) above i64::MAX: what serde of a Rust
                // `ChainSpec` writes for e.g. `min_keep: usize::MAX`.
                None if pm.min.is_some_and(|m| m >= 0.0)
                    && n.as_u64().is_some_and(|u| usize::try_from(u).is_ok()) =>
                {
                    Ok(())
                }
                None => Err(range(n.to_string())),
            },
            other => Err(wrong(found_of(other), pm.range.to_string())),
        },
        ParamKind::Float => match f32_of(v) {
            Ok(Some(_)) => Ok(()),
            Err(()) => Err(range(num_text(v))),
            Ok(None) => Err(wrong(found_of(v), pm.range.to_string())),
        },
        ParamKind::Enum(words) => match v {
            Value::String(s) if words.contains(&s.as_str()) => Ok(()),
            Value::String(s) => Err(range(format!("\"{s}\""))),
            other => Err(wrong(found_of(other), format!("a string ({})", pm.range))),
        },
        ParamKind::TokenSequences => check_token_seqs(path, v, location),
        ParamKind::TokenBiases => {
            let Value::Array(pairs) = v else {
                return Err(wrong(found_of(v),
                    "an array of `[token, bias]` pairs, e.g. [[15043, 5.0]] (a finite bias; JSON has no -inf)".into(),
                ));
            };
            for (i, pair) in pairs.iter().enumerate() {
                let p = format!("{path}[{i}]");
                match pair {
                    Value::Array(two) if two.len() == 2 => {
                        check_token(&format!("{p}[0]"), &two[0], location)?;
                        let bp = format!("{p}[1]");
                        match f32_of(&two[1]) {
                            Ok(Some(_)) => {}
                            Err(()) => {
                                return Err(ConfigError::OutOfRange {
                                    path: bp,
                                    value: num_text(&two[1]),
                                    expected: pm.range.to_string(),
                                    location,
                                });
                            }
                            Ok(None) => {
                                return Err(ConfigError::WrongType {
                                    path: bp,
                                    found: found_of(&two[1]),
                                    expected: "a finite number (JSON has no -inf)".into(),
                                    location,
                                });
                            }
                        }
                    }
                    other => {
                        return Err(ConfigError::WrongType {
                            path: p,
                            found: found_of(other),
                            expected: "a `[token, bias]` pair".into(),
                            location,
                        });
                    }
                }
            }
            Ok(())
        }
    }
}

/// The help of a missing required parameter.
fn missing_help(kind: StageKind, field: &str) -> String {
    match kind.meta().param(field) {
        Some(pm) => format!(
            "`{}` needs `{}`: {} (default in TOML: {})",
            kind.name(),
            pm.name,
            pm.range,
            pm.default_toml()
        ),
        None => format!("`{}` needs `{field}`", kind.name()),
    }
}

pub(crate) fn load(text: &str) -> Result<ChainSpec, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| schema_error(text, &e))?;
    crate::json_dup::reject_duplicate_keys(text)?;
    let Value::Object(root) = &value else {
        return Err(ConfigError::WrongType {
            path: "(root)".into(),
            found: json_type(&value).into(),
            expected: "an object `{\"stages\": [...], \"seed\": 42}`".into(),
            location: Some(Location { line: 1, column: 1 }),
        });
    };
    for key in root.keys() {
        if key != "stages" && key != "seed" {
            return Err(ConfigError::UnknownKey {
                path: key.clone(),
                location: locate_top_key(text, key),
                suggestion: suggest(key, ["stages", "seed"]),
            });
        }
    }
    let seed = match root.get("seed") {
        Some(v) => check_seed(text, v)?,
        None => None,
    };
    let items = match root.get("stages") {
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ConfigError::WrongType {
                path: "stages".into(),
                found: found_of(other),
                expected: "an array of stage objects, e.g. [{\"type\": \"top_k\", \"k\": 40}, {\"type\": \"dist\"}]".into(),
                location: locate(text, &[Step::Key("stages")]),
            });
        }
        None => {
            return Err(ConfigError::MissingKey {
                path: "stages".into(),
                location: Some(Location { line: 1, column: 1 }),
                help: "list the chain, e.g. {\"stages\": [{\"type\": \"top_k\", \"k\": 40}, {\"type\": \"dist\"}]}".into(),
            });
        }
    };
    let mut stages = Vec::with_capacity(items.len());
    for (i, stage) in items.iter().enumerate() {
        // Locations are looked up only for an input that fails (each lookup
        // scans the text).
        let stage_loc = || locate(text, &[Step::Key("stages"), Step::Index(i)]);
        let key_loc = |key: &str| locate_stage_key(text, i, key);
        let Value::Object(obj) = stage else {
            return Err(ConfigError::WrongType {
                path: format!("stages[{i}]"),
                found: found_of(stage),
                expected: "a stage object, e.g. {\"type\": \"top_k\", \"k\": 40}".into(),
                location: stage_loc(),
            });
        };
        let ty = match obj.get("type") {
            Some(Value::String(ty)) => ty,
            Some(other) => {
                return Err(ConfigError::WrongType {
                    path: format!("stages[{i}].type"),
                    found: found_of(other),
                    expected: "a stage name (string), e.g. \"top_k\"".into(),
                    location: key_loc("type"),
                });
            }
            None => {
                return Err(ConfigError::MissingKey {
                    path: format!("stages[{i}].type"),
                    location: stage_loc(),
                    help:
                        "every stage needs `\"type\": \"<stage name>\"`, e.g. `\"type\": \"top_k\"`"
                            .into(),
                });
            }
        };
        let Some(kind) = StageKind::from_name(ty) else {
            return Err(ConfigError::UnknownStage {
                name: ty.clone(),
                location: locate_value(
                    text,
                    &[Step::Key("stages"), Step::Index(i), Step::Key("type")],
                )
                .or_else(|| find_key(text, ty)),
                suggestion: suggest(ty, StageKind::all_names()),
            });
        };
        let meta = kind.meta();
        let mut canonical = Map::new();
        canonical.insert("type".into(), Value::String(kind.name().into()));
        for (key, v) in obj.iter().filter(|(k, _)| *k != "type") {
            let Some(pm) = meta.param(key) else {
                let known = meta
                    .params
                    .iter()
                    .flat_map(|p| std::iter::once(p.name).chain(p.aliases.iter().copied()));
                return Err(ConfigError::UnknownKey {
                    path: format!("stages[{i}].{key}"),
                    location: key_loc(key),
                    suggestion: suggest(key, known.chain(["type"])),
                });
            };
            if canonical.contains_key(pm.name) {
                let other = obj
                    .keys()
                    .find(|k| {
                        *k != key
                            && *k != "type"
                            && meta.param(k).is_some_and(|p| p.name == pm.name)
                    })
                    .map_or(pm.name, String::as_str);
                return Err(ConfigError::DuplicateKey {
                    path: format!("stages[{i}].{key}"),
                    other: format!("stages[{i}].{other}"),
                    location: key_loc(key),
                });
            }
            check_param(&format!("stages[{i}].{key}"), pm, v, None)
                .map_err(|e| e.located(|| key_loc(key)))?;
            canonical.insert(pm.name.into(), v.clone());
        }
        let spec: StageSpec = serde_json::from_value(Value::Object(canonical)).map_err(|e| {
            let msg = e.to_string();
            match msg
                .strip_prefix("missing field `")
                .and_then(|r| r.split_once('`'))
            {
                Some((field, _)) => ConfigError::MissingKey {
                    path: format!("stages[{i}].{field}"),
                    location: stage_loc(),
                    help: missing_help(kind, field),
                },
                None => ConfigError::Schema {
                    format: "JSON",
                    message: format!("`stages[{i}]`: {msg}"),
                    location: stage_loc(),
                },
            }
        })?;
        stages.push(spec);
    }
    Ok(ChainSpec::new(stages, seed))
}

pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
