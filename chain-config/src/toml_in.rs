//! TOML -> [`ChainConfig`]. The document is parsed once into the located
//! tree ([`crate::located`]) and read from there, so that every error names
//! its key path and its `line:column`; stage tables go through the
//! conversion every front end shares ([`crate::convert`]).

use std::ops::Range;

use sampler_core::{ChainSpec, OffloadPolicy, StageKind, StageSpec};

use crate::chain_string::parse_names;
use crate::convert::{stage_entry, stage_from_table};
use crate::error::{ConfigError, Location};
use crate::located::{Doc, Entry, Node, Value, parse_toml};
use crate::params::default_stage;
use crate::speculative::{Field, Refusal};
use crate::suggest::suggest;
use crate::values::{At, parse_seed};
use crate::{ChainConfig, DeviceConfig, LoadOptions, SpeculativeConfig};

/// Top-level keys other than stage tables.
pub(crate) const TOP_KEYS: [&str; 11] = [
    "samplers",
    "seed",
    "device",
    "speculative",
    "structured",
    "sequences",
    "stage",
    "logprobs",
    "top_logprobs",
    "logprob_token_ids",
    "logprobs_mode",
];
/// Keys of the `[device]` table.
pub(crate) const DEVICE_KEYS: [&str; 2] = ["kind", "offload"];

/// Parse a whole TOML document.
pub(crate) fn load(text: &str, opts: &LoadOptions) -> Result<ChainConfig, ConfigError> {
    let (doc, root) = parse_toml(text, |name| StageKind::from_name(name).map(StageKind::name))?;
    let mut seed: Option<u64> = None;
    let mut device = DeviceConfig::default();
    let mut speculative = None;
    let mut structured = None;
    let mut sequences = sampler_core::Sequences::default();
    let mut order: Option<(Vec<StageKind>, Range<usize>)> = None;
    let mut stage_array: Option<&Entry> = None;
    // (kind, the table's entry)
    let mut tables: Vec<(StageKind, &Entry)> = Vec::new();

    let mut lp_entries: Vec<&Entry> = Vec::new();
    for entry in root.entries().unwrap_or_default() {
        let name = entry.key.as_str();
        let value = &entry.value;
        match name {
            "logprobs" | "top_logprobs" | "logprob_token_ids" | "logprobs_mode" => {
                crate::flat::check_field_type(doc, entry)?;
                lp_entries.push(entry);
            }
            "seed" => seed = parse_seed(At::entry(doc, entry), value)?,
            "samplers" => order = Some((parse_samplers(doc, value)?, value.span.clone())),
            "device" => device = parse_device(doc, value)?,
            "speculative" => speculative = Some(parse_speculative(doc, value)?),
            "structured" => structured = Some(crate::structured::parse_toml(doc, value)?),
            "sequences" => sequences = parse_sequences(doc, value)?,
            "stage" => stage_array = Some(entry),
            _ => match StageKind::from_name(name) {
                Some(kind) => {
                    if value.entries().is_none() {
                        return Err(ConfigError::WrongType {
                            path: name.to_string(),
                            found: doc.found(value),
                            expected: format!(
                                "a table of `{}` parameters (`[{}]` followed by its keys)",
                                kind.name(),
                                name
                            ),
                            location: doc.loc(&value.span),
                        });
                    }
                    if let Some((_, first)) = tables.iter().find(|t| t.0 == kind) {
                        return Err(ConfigError::DuplicateStage {
                            stage: kind.name(),
                            first: first.key.clone(),
                            second: name.to_string(),
                            location: doc.loc(&entry.key_span),
                        });
                    }
                    tables.push((kind, entry));
                }
                None => {
                    let stage_hint = suggest(name, StageKind::all_names());
                    return Err(if value.entries().is_some() && stage_hint.is_some() {
                        ConfigError::UnknownStage {
                            name: name.to_string(),
                            location: doc.loc(&entry.key_span),
                            suggestion: stage_hint,
                        }
                    } else {
                        ConfigError::UnknownKey {
                            path: name.to_string(),
                            location: doc.loc(&entry.key_span),
                            suggestion: suggest(
                                name,
                                TOP_KEYS.into_iter().chain(StageKind::all_names()),
                            ),
                        }
                    });
                }
            },
        }
    }

    let order_span;
    let stages: Vec<StageSpec> = if let Some(array) = stage_array {
        if let Some((_, ospan)) = &order {
            return Err(ConfigError::Conflict {
                message: "`samplers` and `[[stage]]` both give the chain: use one of them".into(),
                location: doc.loc(ospan),
            });
        }
        if let Some((_, table)) = tables.first() {
            return Err(ConfigError::Conflict {
                message: format!(
                    "`[{}]` cannot be combined with `[[stage]]`: put its keys in the `[[stage]]` entry",
                    table.key
                ),
                location: doc.loc(&table.key_span),
            });
        }
        order_span = Some(array.key_span.clone());
        parse_stage_array(doc, array)?
    } else if let Some((kinds, ospan)) = order {
        order_span = Some(ospan.clone());
        for (kind, table) in &tables {
            if !kinds.contains(kind) {
                return Err(ConfigError::UnlistedStage {
                    table: table.key.clone(),
                    stage: kind.name(),
                    location: doc.loc(&table.key_span),
                });
            }
        }
        let mut configured: Vec<(StageKind, StageSpec)> = Vec::with_capacity(tables.len());
        for (kind, table) in &tables {
            let spec = stage_from_table(doc, *kind, &table.key, &table.value, false, false)?;
            configured.push((*kind, spec));
        }
        if kinds.is_empty() {
            return Err(ConfigError::EmptyChain {
                location: doc.loc(&ospan),
            });
        }
        kinds
            .iter()
            .map(|k| {
                configured
                    .iter()
                    .find(|(ck, _)| ck == k)
                    .map_or_else(|| default_stage(*k), |(_, s)| s.clone())
            })
            .collect()
    } else if let Some((_, table)) = tables.first() {
        let mut kinds: Vec<StageKind> = tables.iter().map(|t| t.0).collect();
        kinds.sort_by_key(|k| k.meta().order);
        let mut names: Vec<String> = kinds.iter().map(|k| k.name().to_string()).collect();
        let tables_given = names.clone();
        if !kinds.iter().any(|k| k.meta().effects.selects) {
            names.push("dist".into());
        }
        return Err(ConfigError::MissingOrder {
            tables: tables_given,
            suggestion: names.join(";"),
            location: doc.loc(&table.key_span),
        });
    } else {
        return Err(ConfigError::EmptyChain { location: None });
    };

    let mut chain = ChainSpec::new(stages, seed);
    chain.logprobs = toml_logprobs(doc, &lp_entries)?;
    let mut cfg = ChainConfig::finish(
        "stage",
        chain,
        device,
        Vec::new(),
        opts,
        order_span.and_then(|s| doc.loc(&s)),
    )?;
    cfg.speculative = speculative;
    cfg.sequences = sequences;
    if structured.is_some() {
        crate::structured::ensure_mask(&mut cfg.chain);
    }
    cfg.structured = structured;
    Ok(cfg)
}

/// The `[sequences]` table (the flat keys' names and rules).
fn parse_sequences(doc: Doc<'_>, v: &Node) -> Result<sampler_core::Sequences, ConfigError> {
    use crate::sequences::{EarlyStoppingFlag, SEQUENCE_KEYS, SeqFields};
    let Some(entries) = v.entries() else {
        return Err(ConfigError::WrongType {
            path: "sequences".into(),
            found: doc.found(v),
            expected:
                "a table (`[sequences]` with `n`, or `num_beams`, `num_return_sequences`, ...)"
                    .into(),
            location: doc.loc(&v.span),
        });
    };
    let mut f = SeqFields::default();
    for e in entries {
        let at = At::entry(doc, e);
        let path = format!("sequences.{}", e.key);
        let range = crate::flat::range_of(&e.key);
        let int = || crate::values::parse_int(at, &path, range, &e.value).map(Some);
        match e.key.as_str() {
            "n" => f.n = int()?,
            "num_beams" => f.num_beams = int()?,
            "num_return_sequences" => f.num_return_sequences = int()?,
            "length_penalty" => {
                f.length_penalty = Some(f64::from(crate::values::parse_float(
                    at, &path, range, &e.value,
                )?));
            }
            "early_stopping" => {
                f.early_stopping = Some(match &e.value.value {
                    Value::Bool(b) => EarlyStoppingFlag::Bool(*b),
                    Value::Str(s) => EarlyStoppingFlag::Word(s.clone()),
                    _ => return Err(at.wrong(&path, &e.value, range)),
                });
            }
            other => {
                return Err(ConfigError::UnknownKey {
                    path,
                    location: doc.loc(&e.key_span),
                    suggestion: suggest(other, SEQUENCE_KEYS),
                });
            }
        }
    }
    f.build().map_err(|(key, value, expected)| {
        let entry = entries.iter().find(|e| e.key.as_str() == key);
        ConfigError::OutOfRange {
            path: format!("sequences.{key}"),
            value,
            expected,
            location: entry
                .map(|e| doc.loc(&e.value.span))
                .unwrap_or_else(|| doc.loc(&v.span)),
        }
    })
}

fn parse_speculative(doc: Doc<'_>, v: &Node) -> Result<SpeculativeConfig, ConfigError> {
    let Some(entries) = v.entries() else {
        return Err(ConfigError::WrongType {
            path: "speculative".into(),
            found: doc.found(v),
            expected: "a table (`[speculative]` with `method`, `num_speculative_tokens`, ...)"
                .into(),
            location: doc.loc(&v.span),
        });
    };
    let mut cfg = SpeculativeConfig::default();
    let mut at = None;
    for entry in entries {
        let (name, value) = (entry.key.as_str(), &entry.value);
        let path = format!("speculative.{name}");
        let field = match &value.value {
            Value::Str(s) => Field::Str(s),
            Value::Int(i) => Field::Int(*i),
            _ => Field::Other,
        };
        cfg.set(name, field).map_err(|r| match r {
            Refusal::Unknown(suggestion) => ConfigError::UnknownKey {
                path: path.clone(),
                location: doc.loc(&entry.key_span),
                suggestion,
            },
            Refusal::WrongType(expected) => ConfigError::WrongType {
                path: path.clone(),
                found: doc.found(value),
                expected,
                location: doc.loc(&value.span),
            },
            Refusal::OutOfRange(expected) => ConfigError::OutOfRange {
                path: path.clone(),
                value: doc.written(value),
                expected,
                location: doc.loc(&value.span),
            },
        })?;
        at = at.or(doc.loc(&v.span));
    }
    cfg.check().map_err(|(key, value, expected)| {
        let entry = entries.iter().find(|e| e.key.as_str() == key);
        ConfigError::OutOfRange {
            path: format!("speculative.{key}"),
            value,
            expected,
            location: entry.and_then(|e| doc.loc(&e.value.span)).or(at),
        }
    })?;
    Ok(cfg)
}

/// The top-level logprobs keys (the flat parameters' names and rules).
fn toml_logprobs(
    doc: Doc<'_>,
    entries: &[&Entry],
) -> Result<Option<sampler_core::LogprobsSpec>, ConfigError> {
    use crate::flat::LogprobsFlag;
    let mut flag = None;
    let mut top = None;
    let mut ids = None;
    let mut mode = None;
    for e in entries {
        let at = At::entry(doc, e);
        let v = &e.value;
        match e.key.as_str() {
            "logprobs" => {
                flag = Some(match &v.value {
                    crate::located::Value::Bool(b) => LogprobsFlag::On(*b),
                    _ => LogprobsFlag::Top(crate::values::parse_int(
                        at,
                        &e.key,
                        crate::flat::range_of("logprobs"),
                        v,
                    )?),
                })
            }
            "top_logprobs" => {
                top = Some(crate::values::parse_int(
                    at,
                    &e.key,
                    crate::flat::range_of("top_logprobs"),
                    v,
                )?)
            }
            "logprob_token_ids" => ids = Some(crate::values::parse_token_ids(at, &e.key, v)?),
            _ => mode = v.as_str().and_then(sampler_core::LogprobsMode::from_word),
        }
    }
    crate::flat::logprobs_of(flag, top, ids.as_ref(), mode).map_err(|err| match err {
        ConfigError::OutOfRange {
            path,
            value,
            expected,
            location: None,
        } => ConfigError::OutOfRange {
            location: entries
                .iter()
                .find(|e| e.key == path)
                .and_then(|e| doc.loc(&e.value.span)),
            path,
            value,
            expected,
        },
        other => other,
    })
}

/// Byte offset of the decoded string's first character in the source, when
/// the string is written plainly (no escapes), so that positions inside the
/// string map to source columns.
fn string_body_start(doc: Doc<'_>, span: &Range<usize>, decoded: &str) -> Option<usize> {
    let raw = doc.raw(span);
    let body = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))?;
    (body == decoded).then_some(span.start + 1)
}

fn parse_samplers(doc: Doc<'_>, v: &Node) -> Result<Vec<StageKind>, ConfigError> {
    let locate = |span: Range<usize>, decoded: &str| {
        let body = string_body_start(doc, &span, decoded);
        move |offset: usize| match body {
            Some(start) => Some(Location::from_offset(doc.text, start + offset)),
            None => doc.loc(&span),
        }
    };
    match &v.value {
        Value::Str(s) => parse_names(s, locate(v.span.clone(), s)),
        Value::Array(items) => {
            let mut kinds = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let Some(s) = item.as_str() else {
                    return Err(ConfigError::WrongType {
                        path: format!("samplers[{i}]"),
                        found: doc.found(item),
                        expected: "a stage name (string)".into(),
                        location: doc.loc(&item.span),
                    });
                };
                let mut one = parse_names(s, locate(item.span.clone(), s))?;
                if one.len() != 1 {
                    return Err(ConfigError::WrongType {
                        path: format!("samplers[{i}]"),
                        found: format!("{} names", one.len()),
                        expected: "exactly one stage name per array element".into(),
                        location: doc.loc(&item.span),
                    });
                }
                kinds.append(&mut one);
            }
            Ok(kinds)
        }
        _ => Err(ConfigError::WrongType {
            path: "samplers".into(),
            found: doc.found(v),
            expected: "a `;`-separated string of stage names (or an array of names)".into(),
            location: doc.loc(&v.span),
        }),
    }
}

fn parse_device(doc: Doc<'_>, v: &Node) -> Result<DeviceConfig, ConfigError> {
    let Some(entries) = v.entries() else {
        return Err(ConfigError::WrongType {
            path: "device".into(),
            found: doc.found(v),
            expected: "a table (`[device]` with `kind` and `offload`)".into(),
            location: doc.loc(&v.span),
        });
    };
    let mut cfg = DeviceConfig::default();
    for entry in entries {
        let name = entry.key.as_str();
        let value = &entry.value;
        let vloc = doc.loc(&value.span);
        match name {
            "kind" => {
                let Some(s) = value.as_str() else {
                    return Err(ConfigError::WrongType {
                        path: "device.kind".into(),
                        found: doc.found(value),
                        expected: "a device name (string)".into(),
                        location: vloc,
                    });
                };
                cfg.device =
                    crate::check_device(s).map_err(|expected| ConfigError::OutOfRange {
                        path: "device.kind".into(),
                        value: format!("\"{s}\""),
                        expected,
                        location: vloc,
                    })?;
            }
            "offload" => {
                let bad = || ConfigError::OutOfRange {
                    path: "device.offload".into(),
                    value: doc.written(value),
                    expected: crate::OFFLOAD_RANGE.into(),
                    location: vloc,
                };
                cfg.offload = match &value.value {
                    Value::Str(s) => match s.as_str() {
                        "auto" => OffloadPolicy::Auto,
                        "off" => OffloadPolicy::Off,
                        "device" => OffloadPolicy::Device,
                        _ => return Err(bad()),
                    },
                    Value::Int(i) => OffloadPolicy::Stages(
                        i64::try_from(*i)
                            .ok()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(bad)?,
                    ),
                    _ => {
                        return Err(ConfigError::WrongType {
                            path: "device.offload".into(),
                            found: doc.found(value),
                            expected: crate::OFFLOAD_RANGE.into(),
                            location: vloc,
                        });
                    }
                };
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    path: format!("device.{name}"),
                    location: doc.loc(&entry.key_span),
                    suggestion: suggest(name, DEVICE_KEYS.into_iter().chain(["device"]))
                        .map(|s| if s == "device" { "kind".to_string() } else { s }),
                });
            }
        }
    }
    Ok(cfg)
}

fn parse_stage_array(doc: Doc<'_>, array: &Entry) -> Result<Vec<StageSpec>, ConfigError> {
    let Value::Array(items) = &array.value.value else {
        return Err(ConfigError::WrongType {
            path: "stage".into(),
            found: doc.found(&array.value),
            expected: "an array of tables (`[[stage]]` entries, each with `type = \"...\"`)".into(),
            location: doc.loc(&array.value.span),
        });
    };
    if items.is_empty() {
        return Err(ConfigError::EmptyChain {
            location: doc.loc(&array.key_span),
        });
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| stage_entry(doc, &format!("stage[{i}]"), item, false))
        .collect()
}
