//! [`ConfigError`] (what stops a chain from loading) and [`Diagnostic`]
//! (what loaded, but deserves a word to the user); and the located
//! [`ConfigError`] of a serde_json error, which every JSON reader shares.

use std::fmt;

use thiserror::Error;

/// A 1-based position in the source text: line and column (columns count
/// Unicode scalar values, not bytes). Prints as `line:column`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

impl Location {
    /// The location of byte offset `offset` in `source` (clamped to the end
    /// of the text, and to the previous character boundary).
    pub fn from_offset(source: &str, offset: usize) -> Self {
        let mut offset = offset.min(source.len());
        while offset > 0 && !source.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &source[..offset];
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        // A byte-order mark at the start of the text is not a column.
        let line_text = &before[line_start..];
        let line_text = if line_start == 0 {
            line_text.strip_prefix('\u{feff}').unwrap_or(line_text)
        } else {
            line_text
        };
        let column = line_text.chars().count() + 1;
        Self { line, column }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// `"line:col: "` or nothing.
fn at(location: &Option<Location>) -> String {
    location.map_or_else(String::new, |l| format!("{l}: "))
}

/// `" (also as `other`)"` when the other spelling differs, else nothing.
fn also(path: &str, other: &str) -> String {
    if path == other {
        String::new()
    } else {
        format!(" (also as `{other}`)")
    }
}

/// `" (did you mean `x`?)"` or nothing.
fn hint(suggestion: &Option<String>) -> String {
    suggestion
        .as_ref()
        .map_or_else(String::new, |s| format!(" (did you mean `{s}`?)"))
}

/// Why a chain declaration was rejected. Every variant has structured fields
/// so callers can match on them; the `Display` text is what a user sees.
///
/// Locations are 1-based `line:column` into the source text (TOML or JSON),
/// or into the chain string for [`crate::ChainConfig::from_chain_string`]
/// (line 1); `None` where the input has no text (Rust structs).
///
/// Key paths name the offending key the way it is written in TOML:
/// `top_p.p`, `stage[2].k` (array-of-tables, 0-based), `device.offload`,
/// `logit_bias.bias."15043"`; for flat parameters the field name
/// (`temperature`), for `generation_config.json` the JSON key.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The text is not valid TOML / JSON.
    #[error("{}{format} syntax error: {message}", at(.location))]
    Syntax {
        /// `"TOML"` or `"JSON"`.
        format: &'static str,
        /// The parser's message.
        message: String,
        /// Where the parser stopped.
        location: Option<Location>,
    },
    /// A stage name that is neither a canonical name nor an alias.
    #[error("{}unknown stage `{name}`{}", at(.location), hint(.suggestion))]
    UnknownStage {
        /// The name as written.
        name: String,
        /// Where it was written.
        location: Option<Location>,
        /// The closest known name, if one is close.
        suggestion: Option<String>,
    },
    /// JSON that parses but does not fit the schema (serde's message).
    #[error("{}{format} does not match the schema: {message}", at(.location))]
    Schema {
        /// `"JSON"`.
        format: &'static str,
        /// serde's message.
        message: String,
        /// Where serde stopped, when known.
        location: Option<Location>,
    },
    /// A key that this schema does not have.
    #[error("{}unknown key `{path}`{}", at(.location), hint(.suggestion))]
    UnknownKey {
        /// Full key path, e.g. `top_p.pp`.
        path: String,
        /// Where the key was written.
        location: Option<Location>,
        /// The closest known key, if one is close.
        suggestion: Option<String>,
    },
    /// A required key is absent (e.g. `type` in a `[[stage]]` table).
    #[error("{}missing key `{path}`: {help}", at(.location))]
    MissingKey {
        /// Full key path of the absent key.
        path: String,
        /// The table that lacks it.
        location: Option<Location>,
        /// What to write.
        help: String,
    },
    /// A value of the wrong type (a string where a number belongs, ...).
    #[error("{}`{path}` has the wrong type: found {found}, expected {expected}", at(.location))]
    WrongType {
        /// Full key path.
        path: String,
        /// The type found (`string`, `integer`, `float`, `boolean`, `array`, `table`, ...).
        found: String,
        /// The type and range expected, in words.
        expected: String,
        /// Where the value is.
        location: Option<Location>,
    },
    /// A value outside its valid range.
    #[error("{}`{path}` = {value} is out of range: expected {expected}", at(.location))]
    OutOfRange {
        /// Full key path.
        path: String,
        /// The rejected value as written / formatted.
        value: String,
        /// The valid range in words (the stage metadata's `ParamMeta::range`).
        expected: String,
        /// Where the value is.
        location: Option<Location>,
    },
    /// One key given twice under two spellings (`seq_breakers` and `sequence_breakers`).
    #[error("{}`{path}` is given twice{}", at(.location), also(.path, .other))]
    DuplicateKey {
        /// Full key path of the second occurrence.
        path: String,
        /// The other spelling.
        other: String,
        /// Where the second occurrence is.
        location: Option<Location>,
    },
    /// Two tables configure the same stage (`[top_k]` and `[top-k]`).
    #[error(
        "{}duplicate stage table `[{second}]`: `[{first}]` already configures stage `{stage}`",
        at(.location)
    )]
    DuplicateStage {
        /// Canonical stage name.
        stage: &'static str,
        /// The first table's name as written.
        first: String,
        /// The second table's name as written.
        second: String,
        /// Where the second table is.
        location: Option<Location>,
    },
    /// The chain has no stages.
    #[error(
        "{}the chain is empty: list its stages, e.g. `samplers = \"top_k;top_p;temperature;dist\"`",
        at(.location)
    )]
    EmptyChain {
        /// Where the (empty) order was given, if anywhere.
        location: Option<Location>,
    },
    /// A token was asked for but no stage selects one.
    #[error(
        "{}the chain `{chain}` never selects a token: add `dist` (random) or `greedy` at the end",
        at(.location)
    )]
    NoSelectingStage {
        /// The chain string.
        chain: String,
        /// Where the order was given.
        location: Option<Location>,
    },
    /// Stage tables were given without an order.
    #[error(
        "{}stage tables {tables:?} are given but the order is not: add `samplers = \"{suggestion}\"` (or use `[[stage]]` tables)",
        at(.location)
    )]
    MissingOrder {
        /// Canonical names of the tables given.
        tables: Vec<String>,
        /// A chain string in llama.cpp's default order for those tables, plus `dist`.
        suggestion: String,
        /// The first table.
        location: Option<Location>,
    },
    /// A stage table for a stage that the `samplers` order does not list.
    #[error(
        "{}table `[{table}]` configures stage `{stage}`, which `samplers` does not list: add it to `samplers` or remove the table",
        at(.location)
    )]
    UnlistedStage {
        /// The table's name as written.
        table: String,
        /// Canonical stage name.
        stage: &'static str,
        /// Where the table is.
        location: Option<Location>,
    },
    /// Two ways of giving the order were mixed.
    #[error("{}{message}", at(.location))]
    Conflict {
        /// What conflicts with what.
        message: String,
        /// Where the second declaration is.
        location: Option<Location>,
    },
    /// A `--sampling-seq` letter that names no stage.
    #[error(
        "unknown --sampling-seq letter `{letter}` at position {position} (letters: e d s k y p m x t)"
    )]
    UnknownSeqLetter {
        /// The letter.
        letter: char,
        /// 0-based character position.
        position: usize,
    },
    /// A file could not be read.
    #[error("cannot read `{path}`: {message}")]
    Io {
        /// The path as given.
        path: String,
        /// The OS error.
        message: String,
    },
}

impl ConfigError {
    /// The location, when the error has one.
    pub fn location(&self) -> Option<Location> {
        let mut copy = self.clone();
        copy.location_slot().and_then(|l| *l)
    }

    /// The same error without its location: for an error found in text
    /// the caller built (a re-serialised object), whose `line:column` would
    /// point into text the user never wrote.
    #[must_use]
    pub fn without_location(mut self) -> Self {
        if let Some(l) = self.location_slot() {
            *l = None;
        }
        self
    }

    /// The error's location field, for the variants that have one.
    fn location_slot(&mut self) -> Option<&mut Option<Location>> {
        match self {
            ConfigError::Syntax { location, .. }
            | ConfigError::Schema { location, .. }
            | ConfigError::UnknownStage { location, .. }
            | ConfigError::UnknownKey { location, .. }
            | ConfigError::MissingKey { location, .. }
            | ConfigError::WrongType { location, .. }
            | ConfigError::OutOfRange { location, .. }
            | ConfigError::DuplicateKey { location, .. }
            | ConfigError::DuplicateStage { location, .. }
            | ConfigError::EmptyChain { location }
            | ConfigError::NoSelectingStage { location, .. }
            | ConfigError::MissingOrder { location, .. }
            | ConfigError::UnlistedStage { location, .. }
            | ConfigError::Conflict { location, .. } => Some(location),
            ConfigError::UnknownSeqLetter { .. } | ConfigError::Io { .. } => None,
        }
    }

    /// The "did you mean" suggestion, when the error has one.
    pub fn suggestion(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownStage { suggestion, .. }
            | ConfigError::UnknownKey { suggestion, .. } => suggestion.as_deref(),
            ConfigError::MissingOrder { suggestion, .. } => Some(suggestion),
            _ => None,
        }
    }
}

/// A note about a chain that loaded: nothing is wrong enough to refuse it,
/// but the user may not get what they expect. Collected in
/// [`crate::ChainConfig::diagnostics`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Diagnostic {
    /// A greedy rule (temperature 0, top_k 1, top_p 0, min_p 1,
    /// `do_sample = false`) made the chain greedy, so these parameters have
    /// no effect.
    IgnoredByGreedy {
        /// The rule(s) that made it greedy, e.g. `["temperature = 0"]`.
        rules: Vec<String>,
        /// The parameters ignored, e.g. `["top_p = 0.9"]`.
        ignored: Vec<String>,
    },
    /// `mirostat` (1 or 2) replaces the truncation stages, as in llama.cpp,
    /// so these parameters have no effect.
    IgnoredByMirostat {
        /// The mirostat mode.
        mode: u8,
        /// The parameters ignored.
        ignored: Vec<String>,
    },
    /// The request's own sampling parameters overrode a `do_sample = false`
    /// from `generation_config.json`.
    DoSampleOverridden {
        /// The request parameters that did it.
        by: Vec<String>,
    },
    /// A known key that this crate has no stage for; it has no effect.
    Unsupported {
        /// The key.
        key: String,
        /// Its value as written.
        value: String,
    },
    /// Active stages follow the last selecting stage: they are ignored (the
    /// CPU and every device stop at the selecting stage).
    AfterSelection {
        /// Canonical names of those stages.
        stages: Vec<String>,
    },
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Diagnostic::IgnoredByGreedy { rules, ignored } => write!(
                f,
                "{} makes sampling greedy, so {} {} ignored",
                rules.join(" and "),
                ignored.join(", "),
                if ignored.len() == 1 { "is" } else { "are" }
            ),
            Diagnostic::IgnoredByMirostat { mode, ignored } => write!(
                f,
                "mirostat = {mode} replaces the truncation stages, so {} {} ignored",
                ignored.join(", "),
                if ignored.len() == 1 { "is" } else { "are" }
            ),
            Diagnostic::DoSampleOverridden { by } => write!(
                f,
                "generation_config.json says do_sample = false, but the request sets {}: sampling as requested",
                by.join(", ")
            ),
            Diagnostic::Unsupported { key, value } => {
                write!(f, "`{key}` = {value} is not supported and has no effect")
            }
            Diagnostic::AfterSelection { stages } => write!(
                f,
                "{} after the last selecting stage: ignored, the token is already chosen; move them before `dist`/`greedy`",
                stages
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

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

/// A serde_json error on `text` as a [`ConfigError`]: `Syntax` for text
/// that is not JSON, `Schema` for JSON serde could not read; located, its
/// message without serde_json's own position.
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
