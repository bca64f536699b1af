//! One located value -> a typed Rust value, with errors that point at it:
//! [`At`] (where the errors about a value point) and the readers of seeds,
//! integers, floats and token ids that every front end shares (TOML, tagged
//! JSON, flat parameters, `generation_config.json`).

use sampler_core::TokenId;

use crate::error::{ConfigError, Location};
use crate::located::{Doc, Entry, Format, Node, Value};

pub(crate) const SEED_RANGE: &str = "an integer in [0, 2^64 - 1]";
pub(crate) const TOKEN_RANGE: &str = "a token id in [0, 4294967295]";

/// Where the errors about one value point: in TOML the value itself (or
/// the element of it that is wrong), in JSON the key it was given under.
#[derive(Clone, Copy)]
pub(crate) struct At<'d> {
    pub(crate) doc: Doc<'d>,
    /// Where the key starts; its `line:column` is computed only for an error
    /// (computing it scans the text up to it: once per entry of a large
    /// table would be quadratic).
    pub(crate) key: Option<usize>,
}

impl<'d> At<'d> {
    /// For the value of `entry`.
    pub(crate) fn entry(doc: Doc<'d>, entry: &Entry) -> Self {
        Self {
            doc,
            key: Some(entry.key_span.start),
        }
    }

    pub(crate) fn loc(&self, node: &Node) -> Option<Location> {
        match self.doc.format {
            Format::Toml => self.doc.loc(&node.span),
            Format::Json => match self.key {
                Some(at) => self.doc.loc(&(at..at)),
                None => self.doc.loc(&node.span),
            },
        }
    }

    pub(crate) fn wrong(
        &self,
        path: &str,
        node: &Node,
        expected: impl Into<String>,
    ) -> ConfigError {
        ConfigError::WrongType {
            path: path.to_string(),
            found: self.doc.found(node),
            expected: expected.into(),
            location: self.loc(node),
        }
    }

    pub(crate) fn range(
        &self,
        path: &str,
        node: &Node,
        expected: impl Into<String>,
    ) -> ConfigError {
        ConfigError::OutOfRange {
            path: path.to_string(),
            value: self.doc.written(node),
            expected: expected.into(),
            location: self.loc(node),
        }
    }
}

/// The row seed: an unsigned 64-bit integer (in TOML, one above 2^63 - 1
/// is written as a decimal string).
pub(crate) fn parse_seed(at: At<'_>, v: &Node) -> Result<Option<u64>, ConfigError> {
    let expected = match at.doc.format {
        Format::Toml => "an integer in [0, 2^64 - 1] (seeds above 2^63 - 1 as a decimal string)",
        Format::Json => SEED_RANGE,
    };
    match &v.value {
        Value::Null if at.doc.format == Format::Json => Ok(None),
        // TOML integers stop at 2^63 - 1 (larger seeds: a decimal string).
        Value::Int(i) if at.doc.format == Format::Toml && i64::try_from(*i).is_err() => {
            Err(at.range("seed", v, expected))
        }
        Value::Int(i) => u64::try_from(*i)
            .map(Some)
            .map_err(|_| at.range("seed", v, expected)),
        Value::Str(s) if at.doc.format == Format::Toml => {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(at.range("seed", v, expected));
            }
            s.parse::<u64>()
                .map(Some)
                .map_err(|_| at.range("seed", v, expected))
        }
        _ => Err(at.wrong("seed", v, expected)),
    }
}

/// An integer (`i64`).
pub(crate) fn parse_int(
    at: At<'_>,
    path: &str,
    expected: &str,
    v: &Node,
) -> Result<i64, ConfigError> {
    match &v.value {
        Value::Int(i) => i64::try_from(*i).map_err(|_| at.range(path, v, expected)),
        // An integer literal too long for any integer type.
        Value::Float(text) if !text.contains(['.', 'e', 'E', 'i', 'n']) => {
            Err(at.range(path, v, expected))
        }
        _ => Err(at.wrong(path, v, expected)),
    }
}

/// A number that fits an `f32` (only TOML's `inf` / `-inf` are infinite).
pub(crate) fn parse_float(
    at: At<'_>,
    path: &str,
    expected: &str,
    v: &Node,
) -> Result<f32, ConfigError> {
    match v.as_f32() {
        Ok(Some(x)) => Ok(x),
        Err(()) => Err(at.range(path, v, expected)),
        Ok(None) => Err(at.wrong(path, v, expected)),
    }
}

/// One token id (a `u32`).
pub(crate) fn parse_token(at: At<'_>, path: &str, v: &Node) -> Result<TokenId, ConfigError> {
    let expected = match at.doc.format {
        Format::Toml => TOKEN_RANGE.to_string(),
        Format::Json => format!("{TOKEN_RANGE} (tokenise strings first)"),
    };
    match &v.value {
        Value::Int(i) => TokenId::try_from(*i).map_err(|_| at.range(path, v, TOKEN_RANGE)),
        _ => Err(at.wrong(path, v, expected)),
    }
}

/// Token-id sequences (`dry` sequence breakers): non-empty lists of ids.
pub(crate) fn parse_token_seqs(
    at: At<'_>,
    path: &str,
    expected_range: &str,
    v: &Node,
) -> Result<Vec<Vec<TokenId>>, ConfigError> {
    let shape = "an array of non-empty token-id arrays, e.g. [[13], [29901, 29871]] (tokenise strings first)";
    let Value::Array(outer) = &v.value else {
        return Err(at.wrong(path, v, shape));
    };
    let mut seqs = Vec::with_capacity(outer.len());
    for (i, seq) in outer.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let Value::Array(inner) = &seq.value else {
            return Err(at.wrong(&p, seq, shape));
        };
        if inner.is_empty() {
            return Err(ConfigError::OutOfRange {
                path: p,
                value: "[]".into(),
                expected: expected_range.to_string(),
                location: at.loc(seq),
            });
        }
        let mut ids = Vec::with_capacity(inner.len());
        for (j, tok) in inner.iter().enumerate() {
            ids.push(parse_token(at, &format!("{p}[{j}]"), tok)?);
        }
        seqs.push(ids);
    }
    Ok(seqs)
}

/// A list of token ids: `[2, 32000]`, or one id (`2`, as Hugging Face's
/// `eos_token_id` may be written).
pub(crate) fn parse_token_ids(
    at: At<'_>,
    path: &str,
    v: &Node,
) -> Result<Vec<TokenId>, ConfigError> {
    match &v.value {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, tok)| parse_token(at, &format!("{path}[{i}]"), tok))
            .collect(),
        Value::Int(_) => Ok(vec![parse_token(at, path, v)?]),
        _ => Err(at.wrong(path, v, "an array of token ids, e.g. [2, 32000]")),
    }
}
