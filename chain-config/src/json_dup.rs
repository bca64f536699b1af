//! Duplicate keys in JSON input. serde_json's `Value` keeps the last of two
//! equal keys silently (and a typed struct fails on the first with a type
//! error), so every JSON front end first walks the document once with this
//! visitor, under `serde_path_to_error` for the key path and serde_json for
//! the position: a key given twice is a [`ConfigError::DuplicateKey`].

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::ConfigError;
use crate::json::json_location;

/// Prefix of the custom error that carries the repeated key.
const MARK: &str = "\u{0}duplicate key:";

struct NoDuplicates;

impl<'de> Deserialize<'de> for NoDuplicates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Walk)
    }
}

struct Walk;

impl<'de> Visitor<'de> for Walk {
    type Value = NoDuplicates;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_i64<E>(self, _: i64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_u64<E>(self, _: u64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_f64<E>(self, _: f64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_str<E>(self, _: &str) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_unit<E>(self) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NoDuplicates, A::Error> {
        while seq.next_element::<NoDuplicates>()?.is_some() {}
        Ok(NoDuplicates)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoDuplicates, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("{MARK}{key}")));
            }
            map.next_value::<NoDuplicates>()?;
        }
        Ok(NoDuplicates)
    }
}

/// `Err(DuplicateKey)` when some object of `text` has a key twice, naming the
/// full key path (`stages[1].k`) and the line:column after the second one.
/// Syntax errors are left to the caller's own parse (this returns `Ok`).
pub(crate) fn reject_duplicate_keys(text: &str) -> Result<(), ConfigError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let Err(e) = serde_path_to_error::deserialize::<_, NoDuplicates>(&mut de) else {
        return Ok(());
    };
    let message = e.inner().to_string();
    let Some(rest) = message.strip_prefix(MARK) else {
        return Ok(());
    };
    // serde_json appends " at line L column C" to the message.
    let key = rest.rsplit_once(" at line ").map_or(rest, |(k, _)| k);
    let outer = e.path().to_string();
    let path = if outer.is_empty() || outer == "." {
        key.to_string()
    } else {
        format!("{outer}.{key}")
    };
    Err(ConfigError::DuplicateKey {
        other: path.clone(),
        path,
        location: json_location(e.inner()),
    })
}
