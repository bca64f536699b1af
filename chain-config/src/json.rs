//! Tagged JSON (serde of `ChainSpec`) -> `ChainSpec`, through the located
//! tree and the stage conversion the TOML loader uses, with the same
//! suggestions for unknown names and keys and errors that name the key path
//! (`stages[1].min_keep`) and its `line:column`.

use sampler_core::ChainSpec;

use crate::convert::stage_entry;
use crate::error::{ConfigError, Location};
use crate::flat::range_of;
use crate::located::{Doc, Entry, Value, parse_json};
use crate::suggest::suggest;
use crate::values::{At, parse_int, parse_seed, parse_token_ids};

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
fn logprobs_object(doc: Doc<'_>, e: &Entry) -> Result<sampler_core::LogprobsSpec, ConfigError> {
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
                let range = range_of("top_logprobs");
                let n = parse_int(at, &path, range, &item.value)?;
                spec.top_n = usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= sampler_core::logprobs::MAX_TOP_LOGPROBS)
                    .ok_or_else(|| at.range(&path, &item.value, range))?;
            }
            "token_ids" => {
                spec.token_ids = parse_token_ids(at, &path, &item.value)?;
                if spec.token_ids.len() > sampler_core::logprobs::MAX_LOGPROB_TOKEN_IDS {
                    return Err(at.range(&path, &item.value, range_of("logprob_token_ids")));
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
