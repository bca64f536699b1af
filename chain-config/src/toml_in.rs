//! TOML -> [`ChainConfig`]. The document is parsed into toml's spanned tree
//! (`toml::de::DeTable`) and walked by hand, so that every error can name
//! its key path and its `line:column`.

use std::ops::Range;

use sampler_core::{ChainSpec, OffloadPolicy, ParamKind, ParamMeta, StageKind, StageSpec, TokenId};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::chain_string::parse_names;
use crate::error::{ConfigError, Location};
use crate::params::{PValue, SetError, default_stage, scope_from_word, set_param};
use crate::suggest::suggest;
use crate::{ChainConfig, DeviceConfig, LoadOptions};

/// Top-level keys other than stage tables.
pub(crate) const TOP_KEYS: [&str; 4] = ["samplers", "seed", "device", "stage"];
/// Keys of the `[device]` table.
pub(crate) const DEVICE_KEYS: [&str; 2] = ["kind", "offload"];

type SValue<'i> = Spanned<DeValue<'i>>;

/// The source text, for turning byte spans into locations.
#[derive(Clone, Copy)]
pub(crate) struct Src<'a>(pub(crate) &'a str);

impl<'a> Src<'a> {
    pub(crate) fn loc(self, span: &Range<usize>) -> Option<Location> {
        Some(Location::from_offset(self.0, span.start))
    }
    /// The raw text of a span (empty when the span is not in the text).
    fn raw(self, span: &Range<usize>) -> &'a str {
        self.0.get(span.clone()).unwrap_or("")
    }
}

/// What a value is, for "found ..." in messages: the type, and for a
/// scalar its value (`string "5"`, `float 4.5`, `boolean true`).
fn type_name(v: &DeValue<'_>) -> String {
    let value = match v {
        DeValue::String(s) => format!("\"{s}\""),
        DeValue::Integer(i) => {
            let prefix = match i.radix() {
                16 => "0x",
                8 => "0o",
                2 => "0b",
                _ => "",
            };
            format!("{prefix}{}", i.as_str())
        }
        DeValue::Float(f) => f.as_str().to_string(),
        DeValue::Boolean(b) => b.to_string(),
        _ => return v.type_str().to_string(),
    };
    let value = if value.chars().count() > 40 {
        value.chars().take(37).collect::<String>() + "..."
    } else {
        value
    };
    format!("{} {value}", v.type_str())
}

/// A TOML value as written, for error messages (shortened if long).
fn written(src: Src<'_>, v: &SValue<'_>) -> String {
    let raw = src.raw(&v.span()).trim();
    let raw = if raw.is_empty() {
        match v.get_ref() {
            DeValue::String(s) => format!("\"{s}\""),
            DeValue::Integer(i) => i.to_string(),
            DeValue::Float(f) => f.to_string(),
            DeValue::Boolean(b) => b.to_string(),
            other => other.type_str().to_string(),
        }
    } else {
        raw.to_string()
    };
    if raw.chars().count() > 60 {
        let mut s: String = raw.chars().take(57).collect();
        s.push_str("...");
        s
    } else {
        raw
    }
}

pub(crate) fn syntax_error(src: &str, e: &toml::de::Error) -> ConfigError {
    let location = e.span().map(|s| Location::from_offset(src, s.start));
    let message = e.message().trim().to_string();
    // toml reports a table or key defined twice as "duplicate key": name it,
    // and report a stage table given twice as a duplicate stage.
    if message.starts_with("duplicate key")
        && let Some(key) = e.span().and_then(|s| src.get(s)).map(str::trim)
        && !key.is_empty()
    {
        let bare = key.trim_matches(|c| c == '"' || c == '\'');
        if let Some(kind) = StageKind::from_name(bare) {
            let before = e.span().and_then(|s| src.get(..s.start)).unwrap_or("");
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let header = src
                .get(line_start..)
                .unwrap_or("")
                .trim_start()
                .starts_with('[');
            if header {
                return ConfigError::DuplicateStage {
                    stage: kind.name(),
                    first: bare.to_string(),
                    second: bare.to_string(),
                    location,
                };
            }
        }
        // Name the key with its table: `top_k.k`, not `k`.
        let before = e.span().and_then(|s| src.get(..s.start)).unwrap_or("");
        let table = before.lines().rev().find_map(|line| {
            let line = line.trim();
            let inner = line.strip_prefix('[')?;
            let (inner, array) = match inner.strip_prefix('[') {
                Some(i) => (i, true),
                None => (inner, false),
            };
            let end = inner.find(']')?;
            let name = inner[..end].trim();
            if !array {
                return Some(name.to_string());
            }
            // `[[stage]]`: name the entry, `stage[2]`.
            let entries = before
                .lines()
                .filter(|l| {
                    l.trim()
                        .strip_prefix("[[")
                        .and_then(|r| r.split_once("]]"))
                        .is_some_and(|(n, _)| n.trim() == name)
                })
                .count();
            Some(format!("{name}[{}]", entries.saturating_sub(1)))
        });
        let path = match table {
            Some(t) if !t.is_empty() => format!("{t}.{bare}"),
            _ => bare.to_string(),
        };
        return ConfigError::Syntax {
            format: "TOML",
            message: format!("duplicate key `{path}`: each key may be given once per table"),
            location,
        };
    }
    ConfigError::Syntax {
        format: "TOML",
        message,
        location,
    }
}

/// Parse a whole TOML document.
pub(crate) fn load(text: &str, opts: &LoadOptions) -> Result<ChainConfig, ConfigError> {
    let doc = DeTable::parse(text).map_err(|e| syntax_error(text, &e))?;
    let src = Src(text);
    let root = doc.get_ref();

    let mut seed: Option<u64> = None;
    let mut device = DeviceConfig::default();
    let mut order: Option<(Vec<StageKind>, Range<usize>)> = None;
    let mut stage_array: Option<(&SValue<'_>, Range<usize>)> = None;
    // (kind, table name as written, table, span of the key)
    let mut tables: Vec<(StageKind, String, &SValue<'_>, Range<usize>)> = Vec::new();

    for (key, value) in root.iter() {
        let name: &str = key.get_ref();
        let kspan = key.span();
        match name {
            "seed" => seed = Some(parse_seed(src, value)?),
            "samplers" => order = Some((parse_samplers(src, value)?, value.span())),
            "device" => device = parse_device(src, value)?,
            "stage" => stage_array = Some((value, kspan)),
            _ => match StageKind::from_name(name) {
                Some(kind) => {
                    if !matches!(value.get_ref(), DeValue::Table(_)) {
                        return Err(ConfigError::WrongType {
                            path: name.to_string(),
                            found: type_name(value.get_ref()),
                            expected: format!(
                                "a table of `{}` parameters (`[{}]` followed by its keys)",
                                kind.name(),
                                name
                            ),
                            location: src.loc(&value.span()),
                        });
                    }
                    if let Some((_, first, _, _)) = tables.iter().find(|t| t.0 == kind) {
                        return Err(ConfigError::DuplicateStage {
                            stage: kind.name(),
                            first: first.clone(),
                            second: name.to_string(),
                            location: src.loc(&kspan),
                        });
                    }
                    tables.push((kind, name.to_string(), value, kspan));
                }
                None => {
                    let stage_hint = suggest(name, StageKind::all_names());
                    return Err(
                        if matches!(value.get_ref(), DeValue::Table(_)) && stage_hint.is_some() {
                            ConfigError::UnknownStage {
                                name: name.to_string(),
                                location: src.loc(&kspan),
                                suggestion: stage_hint,
                            }
                        } else {
                            ConfigError::UnknownKey {
                                path: name.to_string(),
                                location: src.loc(&kspan),
                                suggestion: suggest(
                                    name,
                                    TOP_KEYS.into_iter().chain(StageKind::all_names()),
                                ),
                            }
                        },
                    );
                }
            },
        }
    }

    let order_span;
    let stages: Vec<StageSpec> = if let Some((array, aspan)) = stage_array {
        if let Some((_, ospan)) = &order {
            return Err(ConfigError::Conflict {
                message: "`samplers` and `[[stage]]` both give the chain: use one of them".into(),
                location: src.loc(ospan),
            });
        }
        if let Some((_, written_name, _, tspan)) = tables.first() {
            return Err(ConfigError::Conflict {
                message: format!(
                    "`[{written_name}]` cannot be combined with `[[stage]]`: put its keys in the `[[stage]]` entry"
                ),
                location: src.loc(tspan),
            });
        }
        order_span = Some(aspan.clone());
        parse_stage_array(src, array, &aspan)?
    } else if let Some((kinds, ospan)) = order {
        order_span = Some(ospan.clone());
        for (kind, written_name, _, tspan) in &tables {
            if !kinds.contains(kind) {
                return Err(ConfigError::UnlistedStage {
                    table: written_name.clone(),
                    stage: kind.name(),
                    location: src.loc(tspan),
                });
            }
        }
        let mut configured: Vec<(StageKind, StageSpec)> = Vec::with_capacity(tables.len());
        for (kind, written_name, value, _) in &tables {
            if let DeValue::Table(t) = value.get_ref() {
                let spec = stage_from_table(src, *kind, written_name, t, &value.span(), false)?;
                configured.push((*kind, spec));
            }
        }
        if kinds.is_empty() {
            return Err(ConfigError::EmptyChain {
                location: src.loc(&ospan),
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
    } else if let Some((_, _, _, tspan)) = tables.first() {
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
            location: src.loc(tspan),
        });
    } else {
        return Err(ConfigError::EmptyChain { location: None });
    };

    let chain = ChainSpec::new(stages, seed);
    ChainConfig::finish(
        "stage",
        chain,
        device,
        Vec::new(),
        opts,
        order_span.and_then(|s| src.loc(&s)),
    )
}

fn parse_seed(src: Src<'_>, v: &SValue<'_>) -> Result<u64, ConfigError> {
    let expected = "an integer in [0, 2^64 - 1] (seeds above 2^63 - 1 as a decimal string)";
    let out_of_range = || ConfigError::OutOfRange {
        path: "seed".into(),
        value: written(src, v),
        expected: expected.into(),
        location: src.loc(&v.span()),
    };
    match v.get_ref() {
        DeValue::Integer(i) => u64::from_str_radix(i.as_str(), i.radix())
            .ok()
            // `-0` is a TOML integer (zero), which u64's parser refuses.
            .or_else(|| {
                i64::from_str_radix(i.as_str(), i.radix())
                    .ok()
                    .and_then(|n| u64::try_from(n).ok())
            })
            .ok_or_else(out_of_range),
        DeValue::String(s) => {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(out_of_range());
            }
            s.parse::<u64>().map_err(|_| out_of_range())
        }
        other => Err(ConfigError::WrongType {
            path: "seed".into(),
            found: type_name(other),
            expected: expected.into(),
            location: src.loc(&v.span()),
        }),
    }
}

/// Byte offset of the decoded string's first character in the source, when
/// the string is written plainly (no escapes), so that positions inside the
/// string map to source columns.
fn string_body_start(src: Src<'_>, span: &Range<usize>, decoded: &str) -> Option<usize> {
    let raw = src.raw(span);
    let body = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))?;
    (body == decoded).then_some(span.start + 1)
}

fn parse_samplers(src: Src<'_>, v: &SValue<'_>) -> Result<Vec<StageKind>, ConfigError> {
    let locate = |span: Range<usize>, decoded: &str| {
        let body = string_body_start(src, &span, decoded);
        move |offset: usize| match body {
            Some(start) => Some(Location::from_offset(src.0, start + offset)),
            None => src.loc(&span),
        }
    };
    match v.get_ref() {
        DeValue::String(s) => parse_names(s, locate(v.span(), s)),
        DeValue::Array(items) => {
            let mut kinds = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item.get_ref() {
                    DeValue::String(s) => {
                        let span = item.span();
                        let mut one = parse_names(s, locate(span.clone(), s))?;
                        if one.len() != 1 {
                            return Err(ConfigError::WrongType {
                                path: format!("samplers[{i}]"),
                                found: format!("{} names", one.len()),
                                expected: "exactly one stage name per array element".into(),
                                location: src.loc(&span),
                            });
                        }
                        kinds.append(&mut one);
                    }
                    other => {
                        return Err(ConfigError::WrongType {
                            path: format!("samplers[{i}]"),
                            found: type_name(other),
                            expected: "a stage name (string)".into(),
                            location: src.loc(&item.span()),
                        });
                    }
                }
            }
            Ok(kinds)
        }
        other => Err(ConfigError::WrongType {
            path: "samplers".into(),
            found: type_name(other),
            expected: "a `;`-separated string of stage names (or an array of names)".into(),
            location: src.loc(&v.span()),
        }),
    }
}

fn parse_device(src: Src<'_>, v: &SValue<'_>) -> Result<DeviceConfig, ConfigError> {
    let DeValue::Table(t) = v.get_ref() else {
        return Err(ConfigError::WrongType {
            path: "device".into(),
            found: type_name(v.get_ref()),
            expected: "a table (`[device]` with `kind` and `offload`)".into(),
            location: src.loc(&v.span()),
        });
    };
    let mut cfg = DeviceConfig::default();
    for (key, value) in t.iter() {
        let name: &str = key.get_ref();
        let vloc = src.loc(&value.span());
        match name {
            "kind" => {
                let DeValue::String(s) = value.get_ref() else {
                    return Err(ConfigError::WrongType {
                        path: "device.kind".into(),
                        found: type_name(value.get_ref()),
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
                cfg.offload = match value.get_ref() {
                    DeValue::String(s) => match s.as_ref() {
                        "auto" => OffloadPolicy::Auto,
                        "off" => OffloadPolicy::Off,
                        "device" => OffloadPolicy::Device,
                        _ => {
                            return Err(ConfigError::OutOfRange {
                                path: "device.offload".into(),
                                value: format!("\"{s}\""),
                                expected: crate::OFFLOAD_RANGE.into(),
                                location: vloc,
                            });
                        }
                    },
                    DeValue::Integer(i) => {
                        let n = i64::from_str_radix(i.as_str(), i.radix())
                            .ok()
                            .and_then(|n| usize::try_from(n).ok());
                        match n {
                            Some(n) => OffloadPolicy::Stages(n),
                            None => {
                                return Err(ConfigError::OutOfRange {
                                    path: "device.offload".into(),
                                    value: written(src, value),
                                    expected: crate::OFFLOAD_RANGE.into(),
                                    location: vloc,
                                });
                            }
                        }
                    }
                    other => {
                        return Err(ConfigError::WrongType {
                            path: "device.offload".into(),
                            found: type_name(other),
                            expected: crate::OFFLOAD_RANGE.into(),
                            location: vloc,
                        });
                    }
                };
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    path: format!("device.{name}"),
                    location: src.loc(&key.span()),
                    suggestion: suggest(name, DEVICE_KEYS.into_iter().chain(["device"]))
                        .map(|s| if s == "device" { "kind".to_string() } else { s }),
                });
            }
        }
    }
    Ok(cfg)
}

fn parse_stage_array(
    src: Src<'_>,
    v: &SValue<'_>,
    key_span: &Range<usize>,
) -> Result<Vec<StageSpec>, ConfigError> {
    let DeValue::Array(items) = v.get_ref() else {
        return Err(ConfigError::WrongType {
            path: "stage".into(),
            found: type_name(v.get_ref()),
            expected: "an array of tables (`[[stage]]` entries, each with `type = \"...\"`)".into(),
            location: src.loc(&v.span()),
        });
    };
    if items.is_empty() {
        return Err(ConfigError::EmptyChain {
            location: src.loc(key_span),
        });
    }
    let mut stages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let prefix = format!("stage[{i}]");
        let DeValue::Table(t) = item.get_ref() else {
            return Err(ConfigError::WrongType {
                path: prefix,
                found: type_name(item.get_ref()),
                expected: "a table with `type = \"<stage name>\"` and the stage's parameters"
                    .into(),
                location: src.loc(&item.span()),
            });
        };
        let Some(ty) = t.get("type") else {
            return Err(ConfigError::MissingKey {
                path: format!("{prefix}.type"),
                location: src.loc(&item.span()),
                help: "every `[[stage]]` needs `type = \"<stage name>\"`, e.g. `type = \"top_k\"`"
                    .into(),
            });
        };
        let DeValue::String(name) = ty.get_ref() else {
            return Err(ConfigError::WrongType {
                path: format!("{prefix}.type"),
                found: type_name(ty.get_ref()),
                expected: "a stage name (string)".into(),
                location: src.loc(&ty.span()),
            });
        };
        let Some(kind) = StageKind::from_name(name) else {
            return Err(ConfigError::UnknownStage {
                name: name.to_string(),
                location: src.loc(&ty.span()),
                suggestion: suggest(name, StageKind::all_names()),
            });
        };
        stages.push(stage_from_table(src, kind, &prefix, t, &item.span(), true)?);
    }
    Ok(stages)
}

/// Build one stage from its parameter table. `prefix` is the key path of
/// the table (`top_p`, `stage[2]`); `array_entry` skips the `type` key.
fn stage_from_table(
    src: Src<'_>,
    kind: StageKind,
    prefix: &str,
    table: &DeTable<'_>,
    table_span: &Range<usize>,
    array_entry: bool,
) -> Result<StageSpec, ConfigError> {
    let meta = kind.meta();
    let mut spec = default_stage(kind);
    // (canonical name, key as written, span of the value)
    let mut seen: Vec<(&'static str, String, Range<usize>)> = Vec::new();
    for (key, value) in table.iter() {
        let name: &str = key.get_ref();
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
            let suggestion = suggest(name, known.iter().copied());
            return Err(ConfigError::UnknownKey {
                path,
                location: src.loc(&key.span()),
                suggestion,
            });
        };
        if let Some((_, other, _)) = seen.iter().find(|(c, _, _)| *c == pm.name) {
            return Err(ConfigError::DuplicateKey {
                path,
                other: format!("{prefix}.{other}"),
                location: src.loc(&key.span()),
            });
        }
        seen.push((pm.name, name.to_string(), value.span()));
        let pv = convert(src, pm, &path, value)?;
        set_param(&mut spec, pm.name, pv).map_err(|e| match e {
            SetError::Range | SetError::Unknown | SetError::WrongKind => ConfigError::OutOfRange {
                path: path.clone(),
                value: written(src, value),
                expected: pm.range.to_string(),
                location: src.loc(&value.span()),
            },
        })?;
    }
    spec.validate().map_err(|e| {
        let found = seen.iter().find(|(c, _, _)| *c == e.param);
        let expected = meta
            .param(e.param)
            .map_or_else(|| e.expected.clone(), |pm| pm.range.to_string());
        match found {
            Some((_, as_written, vspan)) => ConfigError::OutOfRange {
                path: format!("{prefix}.{as_written}"),
                value: {
                    let raw = src.raw(vspan).trim();
                    if raw.is_empty()
                        || matches!(
                            meta.param(e.param).map(|p| p.kind),
                            Some(ParamKind::TokenBiases | ParamKind::TokenSequences)
                        )
                    {
                        e.value.clone()
                    } else {
                        raw.to_string()
                    }
                },
                expected,
                location: src.loc(vspan),
            },
            None => ConfigError::OutOfRange {
                path: format!("{prefix}.{}", e.param),
                value: e.value.clone(),
                expected,
                location: src.loc(table_span),
            },
        }
    })?;
    Ok(spec)
}

fn parse_int(src: Src<'_>, path: &str, expected: &str, v: &SValue<'_>) -> Result<i64, ConfigError> {
    match v.get_ref() {
        DeValue::Integer(i) => {
            i64::from_str_radix(i.as_str(), i.radix()).map_err(|_| ConfigError::OutOfRange {
                path: path.to_string(),
                value: written(src, v),
                expected: expected.to_string(),
                location: src.loc(&v.span()),
            })
        }
        other => Err(ConfigError::WrongType {
            path: path.to_string(),
            found: type_name(other),
            expected: expected.to_string(),
            location: src.loc(&v.span()),
        }),
    }
}

fn parse_float(
    src: Src<'_>,
    path: &str,
    expected: &str,
    v: &SValue<'_>,
) -> Result<f32, ConfigError> {
    let bad = || ConfigError::OutOfRange {
        path: path.to_string(),
        value: written(src, v),
        expected: expected.to_string(),
        location: src.loc(&v.span()),
    };
    // A number written finite but beyond f32 (`-1e39`) is out of range, not
    // `-inf`: only `inf` / `-inf` written as such are infinite.
    let fits = |x: f32, text: &str| {
        if x.is_infinite() && !text.contains("inf") {
            Err(bad())
        } else {
            Ok(x)
        }
    };
    match v.get_ref() {
        DeValue::Float(f) => fits(f.as_str().parse::<f32>().map_err(|_| bad())?, f.as_str()),
        DeValue::Integer(i) if i.radix() == 10 => {
            fits(i.as_str().parse::<f32>().map_err(|_| bad())?, i.as_str())
        }
        DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
            .map(|n| n as f32)
            .map_err(|_| bad()),
        other => Err(ConfigError::WrongType {
            path: path.to_string(),
            found: type_name(other),
            expected: expected.to_string(),
            location: src.loc(&v.span()),
        }),
    }
}

const TOKEN_RANGE: &str = "a token id in [0, 4294967295]";

fn parse_token(src: Src<'_>, path: &str, v: &SValue<'_>) -> Result<TokenId, ConfigError> {
    let i = parse_int(src, path, TOKEN_RANGE, v)?;
    TokenId::try_from(i).map_err(|_| ConfigError::OutOfRange {
        path: path.to_string(),
        value: written(src, v),
        expected: TOKEN_RANGE.into(),
        location: src.loc(&v.span()),
    })
}

/// A bias must be finite or `-inf` (a ban).
fn check_bias(
    src: Src<'_>,
    path: &str,
    pm: &ParamMeta,
    v: &SValue<'_>,
    b: f32,
) -> Result<(), ConfigError> {
    if b.is_finite() || b == f32::NEG_INFINITY {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            path: path.to_string(),
            value: written(src, v),
            expected: pm.range.to_string(),
            location: src.loc(&v.span()),
        })
    }
}

/// Type-check and convert one parameter value.
fn convert(
    src: Src<'_>,
    pm: &ParamMeta,
    path: &str,
    v: &SValue<'_>,
) -> Result<PValue, ConfigError> {
    match pm.kind {
        ParamKind::Int => {
            // A count above TOML's largest integer (2^63 - 1), as the writer
            // spells it: a decimal string, like a large seed.
            if let DeValue::String(s) = v.get_ref()
                && !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && pm.min.is_some_and(|m| m >= 0.0)
                && let Ok(u) = s.parse::<u64>()
                && u > i64::MAX as u64
            {
                return Ok(PValue::UInt(u));
            }
            let i = parse_int(src, path, pm.range, v)?;
            let x = i as f64;
            if pm.min.is_some_and(|m| x < m) || pm.max.is_some_and(|m| x > m) {
                return Err(ConfigError::OutOfRange {
                    path: path.to_string(),
                    value: written(src, v),
                    expected: pm.range.to_string(),
                    location: src.loc(&v.span()),
                });
            }
            Ok(PValue::Int(i))
        }
        ParamKind::Float => parse_float(src, path, pm.range, v).map(PValue::Float),
        ParamKind::Enum(words) => match v.get_ref() {
            DeValue::String(s) => scope_from_word(s)
                .filter(|_| words.contains(&s.as_ref()))
                .map(PValue::Scope)
                .ok_or_else(|| ConfigError::OutOfRange {
                    path: path.to_string(),
                    value: format!("\"{s}\""),
                    expected: pm.range.to_string(),
                    location: src.loc(&v.span()),
                }),
            other => Err(ConfigError::WrongType {
                path: path.to_string(),
                found: type_name(other),
                expected: format!("a string ({})", pm.range),
                location: src.loc(&v.span()),
            }),
        },
        ParamKind::TokenSequences => {
            let wrong = |at: &SValue<'_>, p: String| ConfigError::WrongType {
                path: p,
                found: type_name(at.get_ref()),
                expected: "an array of arrays of token ids, e.g. `[[13], [29901, 29871]]`".into(),
                location: src.loc(&at.span()),
            };
            let DeValue::Array(outer) = v.get_ref() else {
                return Err(wrong(v, path.to_string()));
            };
            let mut seqs = Vec::with_capacity(outer.len());
            for (i, seq) in outer.iter().enumerate() {
                let DeValue::Array(inner) = seq.get_ref() else {
                    return Err(wrong(seq, format!("{path}[{i}]")));
                };
                if inner.is_empty() {
                    return Err(ConfigError::OutOfRange {
                        path: format!("{path}[{i}]"),
                        value: "[]".into(),
                        expected: pm.range.to_string(),
                        location: src.loc(&seq.span()),
                    });
                }
                let mut ids = Vec::with_capacity(inner.len());
                for (j, tok) in inner.iter().enumerate() {
                    ids.push(parse_token(src, &format!("{path}[{i}][{j}]"), tok)?);
                }
                seqs.push(ids);
            }
            Ok(PValue::Seqs(seqs))
        }
        ParamKind::TokenBiases => match v.get_ref() {
            DeValue::Table(t) => {
                let mut out = Vec::with_capacity(t.len());
                for (key, bias) in t.iter() {
                    let k: &str = key.get_ref();
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
                            expected:
                                "a token id in [0, 4294967295] as the key, e.g. `\"15043\" = -1.5`"
                                    .into(),
                            location: src.loc(&key.span()),
                        });
                    };
                    let b = parse_float(src, &kpath, pm.range, bias)?;
                    check_bias(src, &kpath, pm, bias, b)?;
                    out.push((token, b));
                }
                Ok(PValue::Biases(out))
            }
            DeValue::Array(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                for (i, pair) in pairs.iter().enumerate() {
                    let ppath = format!("{path}[{i}]");
                    match pair.get_ref() {
                        DeValue::Array(two) if two.len() == 2 => {
                            let token = parse_token(src, &format!("{ppath}[0]"), &two[0])?;
                            let bpath = format!("{ppath}[1]");
                            let b = parse_float(src, &bpath, pm.range, &two[1])?;
                            check_bias(src, &bpath, pm, &two[1], b)?;
                            out.push((token, b));
                        }
                        other => {
                            return Err(ConfigError::WrongType {
                                path: ppath,
                                found: type_name(other),
                                expected: "a `[token, bias]` pair".into(),
                                location: src.loc(&pair.span()),
                            });
                        }
                    }
                }
                Ok(PValue::Biases(out))
            }
            other => Err(ConfigError::WrongType {
                path: path.to_string(),
                found: type_name(other),
                expected:
                    "a table `{ \"token id\" = bias, ... }` or an array of `[token, bias]` pairs"
                        .into(),
                location: src.loc(&v.span()),
            }),
        },
    }
}
