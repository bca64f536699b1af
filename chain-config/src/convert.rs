//! Located value -> validated stage: the one conversion every front end
//! that declares stages shares (TOML stage tables and `[[stage]]` entries,
//! tagged JSON `stages[i]` objects). Parameters are found, type-checked,
//! converted, set and validated through the stage registry's metadata
//! (`ParamMeta`); every error names its key path, the value, the range
//! and its `line:column`.

use sampler_core::{ParamKind, ParamMeta, StageKind, StageSpec, TokenId};

use crate::error::ConfigError;
use crate::located::{Doc, Entry, Format, Node, Value};
use crate::params::{PValue, SetError, default_stage, scope_from_word, set_param};
use crate::suggest::suggest;
use crate::values::{
    At, TOKEN_RANGE, parse_float, parse_int, parse_token, parse_token_ids, parse_token_seqs,
};

/// One `[[stage]]` entry / `stages[i]` object: `type` names the stage, the
/// other keys are its parameters. `require` asks for every parameter the
/// registry marks required (the tagged JSON form); otherwise a missing
/// parameter takes its registry default.
pub(crate) fn stage_entry(
    doc: Doc<'_>,
    prefix: &str,
    item: &Node,
    require: bool,
) -> Result<StageSpec, ConfigError> {
    let (not_table, missing_type, type_word) = match doc.format {
        Format::Toml => (
            "a table with `type = \"<stage name>\"` and the stage's parameters",
            "every `[[stage]]` needs `type = \"<stage name>\"`, e.g. `type = \"top_k\"`",
            "a stage name (string)",
        ),
        Format::Json => (
            "a stage object, e.g. {\"type\": \"top_k\", \"k\": 40}",
            "every stage needs `\"type\": \"<stage name>\"`, e.g. `\"type\": \"top_k\"`",
            "a stage name (string), e.g. \"top_k\"",
        ),
    };
    if item.entries().is_none() {
        return Err(ConfigError::WrongType {
            path: prefix.to_string(),
            found: doc.found(item),
            expected: not_table.into(),
            location: doc.loc(&item.span),
        });
    }
    let Some(ty) = item.get("type") else {
        return Err(ConfigError::MissingKey {
            path: format!("{prefix}.type"),
            location: doc.loc(&item.span),
            help: missing_type.into(),
        });
    };
    let Some(name) = ty.value.as_str() else {
        return Err(At::entry(doc, ty).wrong(&format!("{prefix}.type"), &ty.value, type_word));
    };
    let Some(kind) = StageKind::from_name(name) else {
        return Err(ConfigError::UnknownStage {
            name: name.to_string(),
            location: doc.loc(&ty.value.span),
            suggestion: suggest(name, StageKind::all_names()),
        });
    };
    stage_from_table(doc, kind, prefix, item, true, require)
}

/// Build one stage from its parameter table. `prefix` is the key path of
/// the table (`top_p`, `stage[2]`, `stages[2]`); `array_entry` skips the
/// `type` key.
pub(crate) fn stage_from_table(
    doc: Doc<'_>,
    kind: StageKind,
    prefix: &str,
    table: &Node,
    array_entry: bool,
    require: bool,
) -> Result<StageSpec, ConfigError> {
    let meta = kind.meta();
    let mut spec = default_stage(kind);
    // (canonical name, the entry)
    let mut seen: Vec<(&'static str, &Entry)> = Vec::new();
    for entry in table.entries().unwrap_or_default() {
        let name = entry.key.as_str();
        if array_entry && name == "type" {
            continue;
        }
        let path = format!("{prefix}.{name}");
        let Some(pm) = meta.param(name) else {
            let known = meta
                .params
                .iter()
                .flat_map(|p| std::iter::once(p.name).chain(p.aliases.iter().copied()));
            let known: Vec<&str> = if array_entry {
                known.chain(["type"]).collect()
            } else {
                known.collect()
            };
            return Err(ConfigError::UnknownKey {
                path,
                location: doc.loc(&entry.key_span),
                suggestion: suggest(name, known.iter().copied()),
            });
        };
        if let Some((_, other)) = seen.iter().find(|(c, _)| *c == pm.name) {
            return Err(ConfigError::DuplicateKey {
                path,
                other: format!("{prefix}.{}", other.key),
                location: doc.loc(&entry.key_span),
            });
        }
        seen.push((pm.name, entry));
        let at = At::entry(doc, entry);
        let pv = convert(at, pm, &path, &entry.value)?;
        set_param(&mut spec, pm.name, pv).map_err(|e| match e {
            SetError::Range | SetError::Unknown | SetError::WrongKind => {
                at.range(&path, &entry.value, pm.range)
            }
        })?;
    }
    if require
        && let Some(pm) = meta
            .params
            .iter()
            .find(|p| p.required && !seen.iter().any(|(c, _)| *c == p.name))
    {
        return Err(ConfigError::MissingKey {
            path: format!("{prefix}.{}", pm.name),
            location: doc.loc(&table.span),
            help: format!(
                "`{}` needs `{}`: {} (default in TOML: {})",
                kind.name(),
                pm.name,
                pm.range,
                pm.default_toml()
            ),
        });
    }
    spec.validate().map_err(|e| {
        let expected = meta
            .param(e.param)
            .map_or_else(|| e.expected.clone(), |pm| pm.range.to_string());
        match seen.iter().find(|(c, _)| *c == e.param) {
            Some((_, entry)) => {
                let structured = matches!(
                    meta.param(e.param).map(|p| p.kind),
                    Some(ParamKind::TokenBiases | ParamKind::TokenSequences | ParamKind::TokenIds)
                );
                let value = if structured {
                    e.value.clone()
                } else {
                    doc.shown(&entry.value, &e.value)
                };
                ConfigError::OutOfRange {
                    path: format!("{prefix}.{}", entry.key),
                    value,
                    expected,
                    location: doc.value_loc(entry),
                }
            }
            None => ConfigError::OutOfRange {
                path: format!("{prefix}.{}", e.param),
                value: e.value.clone(),
                expected,
                location: doc.loc(&table.span),
            },
        }
    })?;
    Ok(spec)
}

/// A bias: finite, or `-inf` (a ban; TOML and Rust only).
fn parse_bias(at: At<'_>, path: &str, pm: &ParamMeta, v: &Node) -> Result<f32, ConfigError> {
    let expected = match at.doc.format {
        Format::Toml => pm.range.to_string(),
        Format::Json => "a finite number (JSON has no -inf)".to_string(),
    };
    let b = match v.as_f32() {
        Ok(Some(x)) => x,
        Err(()) => return Err(at.range(path, v, pm.range)),
        Ok(None) => return Err(at.wrong(path, v, expected)),
    };
    if b.is_finite() || b == f32::NEG_INFINITY {
        Ok(b)
    } else {
        Err(at.range(path, v, pm.range))
    }
}

/// Type-check and convert one parameter value.
fn convert(at: At<'_>, pm: &ParamMeta, path: &str, v: &Node) -> Result<PValue, ConfigError> {
    let doc = at.doc;
    match pm.kind {
        ParamKind::Int => {
            let count = pm.min.is_some_and(|m| m >= 0.0);
            // A count above 2^63 - 1: a JSON integer, or (TOML's largest
            // integer being 2^63 - 1) a decimal string, as the writer spells it.
            let huge = match &v.value {
                Value::Int(i) if doc.format == Format::Json && *i > i128::from(i64::MAX) => {
                    u64::try_from(*i).ok()
                }
                Value::Str(s)
                    if doc.format == Format::Toml
                        && !s.is_empty()
                        && s.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    s.parse::<u64>().ok().filter(|&u| u > i64::MAX as u64)
                }
                _ => None,
            };
            if let Some(u) = huge
                && count
                && usize::try_from(u).is_ok()
            {
                return Ok(PValue::UInt(u));
            }
            let i = parse_int(at, path, pm.range, v)?;
            let x = i as f64;
            if pm.min.is_some_and(|m| x < m) || pm.max.is_some_and(|m| x > m) {
                return Err(at.range(path, v, pm.range));
            }
            Ok(PValue::Int(i))
        }
        ParamKind::Float => parse_float(at, path, pm.range, v).map(PValue::Float),
        ParamKind::Enum(words) => match v.as_str() {
            Some(s) => scope_from_word(s)
                .filter(|_| words.contains(&s))
                .map(PValue::Scope)
                .ok_or_else(|| ConfigError::OutOfRange {
                    path: path.to_string(),
                    value: format!("\"{s}\""),
                    expected: pm.range.to_string(),
                    location: at.loc(v),
                }),
            None => Err(at.wrong(path, v, format!("a string ({})", pm.range))),
        },
        ParamKind::TokenSequences => parse_token_seqs(at, path, pm.range, v).map(PValue::Seqs),
        ParamKind::TokenIds => parse_token_ids(at, path, v).map(PValue::Ids),
        ParamKind::TokenBiases => match &v.value {
            // `{ "token id" = bias }`: TOML's form (the tagged JSON form is
            // serde's: pairs).
            Value::Table(t) if doc.format == Format::Toml => {
                let example = "`\"15043\" = -1.5`";
                let mut out = Vec::with_capacity(t.len());
                for e in t {
                    let k = e.key.as_str();
                    let kpath = format!("{path}.\"{k}\"");
                    let token = if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) {
                        k.parse::<TokenId>().ok()
                    } else {
                        None
                    };
                    let Some(token) = token else {
                        return Err(ConfigError::OutOfRange {
                            path: kpath,
                            value: format!("\"{k}\""),
                            expected: format!("{TOKEN_RANGE} as the key, e.g. {example}"),
                            location: doc.loc(&e.key_span),
                        });
                    };
                    let b = parse_bias(At::entry(doc, e), &kpath, pm, &e.value)?;
                    out.push((token, b));
                }
                Ok(PValue::Biases(out))
            }
            Value::Array(pairs) => {
                // A token may be listed twice: a `ChainSpec` allows it (each
                // entry adds its bias), and every spec must load back.
                let mut out: Vec<(TokenId, f32)> = Vec::with_capacity(pairs.len());
                for (i, pair) in pairs.iter().enumerate() {
                    let ppath = format!("{path}[{i}]");
                    match &pair.value {
                        Value::Array(two) if two.len() == 2 => {
                            let tpath = format!("{ppath}[0]");
                            let token = parse_token(at, &tpath, &two[0])?;
                            let b = parse_bias(at, &format!("{ppath}[1]"), pm, &two[1])?;
                            out.push((token, b));
                        }
                        _ => return Err(at.wrong(&ppath, pair, "a `[token, bias]` pair")),
                    }
                }
                Ok(PValue::Biases(out))
            }
            _ => Err(at.wrong(
                path,
                v,
                match doc.format {
                    Format::Toml => {
                        "a table `{ \"token id\" = bias, ... }` or an array of `[token, bias]` pairs"
                    }
                    Format::Json => {
                        "an array of `[token, bias]` pairs, e.g. [[15043, 5.0]] (a finite bias; JSON has no -inf)"
                    }
                },
            )),
        },
    }
}
