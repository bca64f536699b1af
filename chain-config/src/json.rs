//! Tagged JSON (serde of `ChainSpec`) -> `ChainSpec`, through the located
//! tree and the stage conversion the TOML loader uses, with the same
//! suggestions for unknown names and keys and errors that name the key path
//! (`stages[1].min_keep`) and its `line:column`.

use sampler_core::ChainSpec;

use crate::convert::{At, parse_seed, stage_entry};
use crate::error::{ConfigError, Location};
use crate::located::{Value, parse_json};
use crate::suggest::suggest;

/// `line:column` of a serde_json error in `text`, the column in characters
/// (serde_json counts bytes from 1 on the line; line 0 = no position).
pub(crate) fn json_location(text: &str, e: &serde_json::Error) -> Option<Location> {
    if e.line() == 0 {
        return None;
    }
    let line_start = if e.line() == 1 {
        0
    } else {
        text.match_indices('\n')
            .nth(e.line() - 2)
            .map_or(text.len(), |(i, _)| i + 1)
    };
    let offset = line_start + e.column().saturating_sub(1);
    Some(Location::from_offset(text, offset.min(text.len())))
}

pub(crate) fn schema_error(text: &str, e: &serde_json::Error) -> ConfigError {
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
            location: json_location(text, e),
        }
    } else {
        ConfigError::Schema {
            format: "JSON",
            message: msg,
            location: json_location(text, e),
        }
    }
}

pub(crate) fn load(text: &str) -> Result<ChainSpec, ConfigError> {
    let (doc, root) = parse_json(text)?;
    let Some(entries) = root.entries() else {
        return Err(ConfigError::WrongType {
            path: "(root)".into(),
            found: root.type_word(doc.format).into(),
            expected: "an object `{\"stages\": [...], \"seed\": 42}`".into(),
            location: Some(Location { line: 1, column: 1 }),
        });
    };
    const KEYS: [&str; 3] = ["stages", "seed", "logprobs"];
    for e in entries {
        if !KEYS.contains(&e.key.as_str()) {
            return Err(ConfigError::UnknownKey {
                path: e.key.clone(),
                location: doc.loc(&e.key_span),
                suggestion: suggest(&e.key, KEYS),
            });
        }
    }
    let logprobs = match root.get("logprobs").filter(|e| !e.value.is_null()) {
        Some(e) => Some(logprobs_object(doc, e)?),
        None => None,
    };
    let seed = match root.get("seed") {
        Some(e) => parse_seed(At::entry(doc, e), &e.value)?,
        None => None,
    };
    let items = match root.get("stages") {
        Some(e) => match &e.value.value {
            Value::Array(items) => items,
            _ => {
                return Err(ConfigError::WrongType {
                    path: "stages".into(),
                    found: doc.found(&e.value),
                    expected: "an array of stage objects, e.g. [{\"type\": \"top_k\", \"k\": 40}, {\"type\": \"dist\"}]".into(),
                    location: doc.loc(&e.key_span),
                });
            }
        },
        None => {
            return Err(ConfigError::MissingKey {
                path: "stages".into(),
                location: Some(Location { line: 1, column: 1 }),
                help: "list the chain, e.g. {\"stages\": [{\"type\": \"top_k\", \"k\": 40}, {\"type\": \"dist\"}]}".into(),
            });
        }
    };
    let stages = items
        .iter()
        .enumerate()
        .map(|(i, item)| stage_entry(doc, &format!("stages[{i}]"), item, true))
        .collect::<Result<Vec<_>, _>>()?;
    let mut chain = ChainSpec::new(stages, seed);
    chain.logprobs = logprobs;
    Ok(chain)
}

/// `"logprobs": {"top_n": 5, "token_ids": [1, 2], "mode": "processed"}`
/// (the serde form of [`sampler_core::LogprobsSpec`]).
fn logprobs_object(
    doc: crate::located::Doc<'_>,
    e: &crate::located::Entry,
) -> Result<sampler_core::LogprobsSpec, ConfigError> {
    const KEYS: [&str; 3] = ["top_n", "token_ids", "mode"];
    let Some(items) = e.value.entries() else {
        return Err(ConfigError::WrongType {
            path: "logprobs".into(),
            found: doc.found(&e.value),
            expected: "an object {\"top_n\": 5, \"token_ids\": [..], \"mode\": \"raw\"}".into(),
            location: doc.loc(&e.key_span),
        });
    };
    let mut spec = sampler_core::LogprobsSpec::default();
    for item in items {
        let path = format!("logprobs.{}", item.key);
        let at = At::entry(doc, item);
        match item.key.as_str() {
            "top_n" => {
                let range = crate::flat::range_of("top_logprobs");
                let n = crate::convert::parse_int(at, &path, range, &item.value)?;
                spec.top_n = usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= sampler_core::logprobs::MAX_TOP_LOGPROBS)
                    .ok_or_else(|| at.range(&path, &item.value, range))?;
            }
            "token_ids" => {
                spec.token_ids = crate::convert::parse_token_ids(at, &path, &item.value)?;
                if spec.token_ids.len() > sampler_core::logprobs::MAX_LOGPROB_TOKEN_IDS {
                    return Err(at.range(
                        &path,
                        &item.value,
                        crate::flat::range_of("logprob_token_ids"),
                    ));
                }
            }
            "mode" => {
                spec.mode = item
                    .value
                    .as_str()
                    .and_then(sampler_core::LogprobsMode::from_word)
                    .ok_or_else(|| at.range(&path, &item.value, "\"raw\" or \"processed\""))?;
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    path,
                    location: doc.loc(&item.key_span),
                    suggestion: suggest(&item.key, KEYS),
                });
            }
        }
    }
    Ok(spec)
}
