//! Tagged JSON (serde of `ChainSpec`) -> `ChainSpec`, with the same
//! suggestions for unknown names and keys as the TOML loader.

use sampler_core::{ChainSpec, StageKind};
use serde_json::Value;

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

pub(crate) fn load(text: &str) -> Result<ChainSpec, ConfigError> {
    let mut value: Value = serde_json::from_str(text).map_err(|e| schema_error(text, &e))?;
    let mut rewritten = false;
    let Value::Object(root) = &mut value else {
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
                location: find_key(text, key),
                suggestion: suggest(key, ["stages", "seed"]),
            });
        }
    }
    if let Some(Value::Array(stages)) = root.get_mut("stages") {
        for (i, stage) in stages.iter_mut().enumerate() {
            let Value::Object(obj) = stage else { continue };
            let Some(Value::String(ty)) = obj.get("type") else {
                continue;
            };
            let Some(kind) = StageKind::from_name(ty) else {
                return Err(ConfigError::UnknownStage {
                    name: ty.clone(),
                    location: find_key(text, ty),
                    suggestion: suggest(ty, StageKind::all_names()),
                });
            };
            if ty != kind.name() {
                obj.insert("type".into(), Value::String(kind.name().into()));
                rewritten = true;
            }
            let meta = kind.meta();
            let keys: Vec<String> = obj.keys().filter(|k| *k != "type").cloned().collect();
            for key in keys {
                match meta.param(&key) {
                    None => {
                        let known = meta
                            .params
                            .iter()
                            .flat_map(|p| std::iter::once(p.name).chain(p.aliases.iter().copied()));
                        return Err(ConfigError::UnknownKey {
                            path: format!("stages[{i}].{key}"),
                            location: find_key(text, &key),
                            suggestion: suggest(&key, known.chain(["type"])),
                        });
                    }
                    Some(pm) if pm.name != key => {
                        if obj.contains_key(pm.name) {
                            return Err(ConfigError::DuplicateKey {
                                path: format!("stages[{i}].{key}"),
                                other: format!("stages[{i}].{}", pm.name),
                                location: find_key(text, &key),
                            });
                        }
                        if let Some(v) = obj.remove(&key) {
                            obj.insert(pm.name.into(), v);
                            rewritten = true;
                        }
                    }
                    Some(_) => {}
                }
            }
        }
    }
    if rewritten {
        serde_json::from_value(value).map_err(|e| schema_error(text, &e))
    } else {
        serde_json::from_str(text).map_err(|e| schema_error(text, &e))
    }
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
