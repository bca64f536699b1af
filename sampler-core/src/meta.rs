//! Static stage metadata. The planner and the config
//! loader reason from this alone; they never run a stage to learn what it does.
//! The values themselves are declared once per stage in the registry
//! (`registry/mod.rs`), which generates [`StageKind`], [`StageSpec`](crate::StageSpec)
//! and every lookup from them.

use crate::{HistoryScope, StageKind, TokenId};

/// What a stage does to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Effects {
    /// Edits logits.
    pub logits: bool,
    /// May remove candidates (size shrinks).
    pub candidates: bool,
    /// Computes probabilities.
    pub probs: bool,
    /// Selects a token.
    pub selects: bool,
}

/// The value type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A signed integer.
    Int,
    /// A float (f32 at run time).
    Float,
    /// One of a fixed set of words.
    Enum(&'static [&'static str]),
    /// A list of token-id sequences.
    TokenSequences,
    /// A map token id -> bias.
    TokenBiases,
    /// A list of token ids.
    TokenIds,
}

/// A parameter value, type-checked against its [`ParamKind`]: what the config
/// loaders and CLIs pass to [`StageSpec::set_param`](crate::StageSpec::set_param)
/// and read back from [`StageSpec::params`](crate::StageSpec::params).
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    /// [`ParamKind::Int`].
    Int(i64),
    /// [`ParamKind::Int`] above `i64::MAX` (a count read from JSON).
    UInt(u64),
    /// [`ParamKind::Float`].
    Float(f32),
    /// [`ParamKind::Enum`] (the history scope).
    Scope(HistoryScope),
    /// [`ParamKind::TokenSequences`].
    Seqs(Vec<Vec<TokenId>>),
    /// [`ParamKind::TokenBiases`].
    Biases(Vec<(TokenId, f32)>),
    /// [`ParamKind::TokenIds`].
    Ids(Vec<TokenId>),
}

impl ParamValue {
    /// The value as written in TOML (`0.95`, `"output"`, `[[1, 2]]`,
    /// `{ "5" = -inf }`): floats in the shortest text that reads back to the
    /// same `f32`, `inf`/`-inf`/`nan` as TOML spells them; biases as a table,
    /// or as `[token, bias]` pairs when a token is listed twice.
    pub fn to_toml(&self) -> String {
        fn float(x: f32) -> String {
            if x.is_nan() {
                "nan".into()
            } else if x.is_infinite() {
                if x > 0.0 { "inf".into() } else { "-inf".into() }
            } else {
                format!("{x:?}")
            }
        }
        match self {
            ParamValue::Int(i) => i.to_string(),
            // TOML integers stop at 2^63 - 1: larger counts as a decimal string.
            ParamValue::UInt(u) => format!("\"{u}\""),
            ParamValue::Float(x) => float(*x),
            ParamValue::Scope(s) => format!("\"{}\"", s.word()),
            ParamValue::Seqs(seqs) => {
                let inner: Vec<String> = seqs
                    .iter()
                    .map(|s| {
                        let ids: Vec<String> = s.iter().map(u32::to_string).collect();
                        format!("[{}]", ids.join(", "))
                    })
                    .collect();
                format!("[{}]", inner.join(", "))
            }
            ParamValue::Ids(ids) => {
                let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                format!("[{}]", ids.join(", "))
            }
            ParamValue::Biases(b) => {
                let mut ids: Vec<TokenId> = b.iter().map(|(t, _)| *t).collect();
                ids.sort_unstable();
                ids.dedup();
                let entries: Vec<String> = if ids.len() == b.len() {
                    b.iter()
                        .map(|(t, x)| format!("\"{t}\" = {}", float(*x)))
                        .collect()
                } else {
                    // A token listed twice cannot be a table key twice: pairs.
                    b.iter()
                        .map(|(t, x)| format!("[{t}, {}]", float(*x)))
                        .collect()
                };
                if b.is_empty() {
                    "{}".into()
                } else if ids.len() == b.len() {
                    format!("{{ {} }}", entries.join(", "))
                } else {
                    format!("[{}]", entries.join(", "))
                }
            }
        }
    }
}

/// Why [`StageSpec::set_param`](crate::StageSpec::set_param) refused a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetParamError {
    /// The stage has no parameter of that name.
    Unknown,
    /// The value's variant does not match the parameter's [`ParamKind`].
    WrongKind,
    /// The value does not fit the field (a negative count, or a count past `usize`).
    Range,
}

/// A Rust type that holds a stage parameter: how it converts to and from a
/// [`ParamValue`]. Implemented for the field types the registry uses.
pub trait ParamField: Sized {
    /// The config-level kind.
    const KIND: ParamKind;
    /// The value of this field.
    fn to_value(&self) -> ParamValue;
    /// Convert a value back.
    ///
    /// # Errors
    /// [`SetParamError::WrongKind`] or [`SetParamError::Range`].
    fn from_value(v: ParamValue) -> Result<Self, SetParamError>;
}

impl ParamField for i64 {
    const KIND: ParamKind = ParamKind::Int;
    fn to_value(&self) -> ParamValue {
        ParamValue::Int(*self)
    }
    fn from_value(v: ParamValue) -> Result<Self, SetParamError> {
        match v {
            ParamValue::Int(i) => Ok(i),
            ParamValue::UInt(_) => Err(SetParamError::Range),
            _ => Err(SetParamError::WrongKind),
        }
    }
}

impl ParamField for usize {
    const KIND: ParamKind = ParamKind::Int;
    fn to_value(&self) -> ParamValue {
        match i64::try_from(*self) {
            Ok(i) => ParamValue::Int(i),
            Err(_) => ParamValue::UInt(*self as u64),
        }
    }
    fn from_value(v: ParamValue) -> Result<Self, SetParamError> {
        match v {
            ParamValue::Int(i) => usize::try_from(i).map_err(|_| SetParamError::Range),
            ParamValue::UInt(u) => usize::try_from(u).map_err(|_| SetParamError::Range),
            _ => Err(SetParamError::WrongKind),
        }
    }
}

impl ParamField for f32 {
    const KIND: ParamKind = ParamKind::Float;
    fn to_value(&self) -> ParamValue {
        ParamValue::Float(*self)
    }
    fn from_value(v: ParamValue) -> Result<Self, SetParamError> {
        match v {
            ParamValue::Float(x) => Ok(x),
            _ => Err(SetParamError::WrongKind),
        }
    }
}

impl ParamField for HistoryScope {
    const KIND: ParamKind = ParamKind::Enum(HistoryScope::WORDS);
    fn to_value(&self) -> ParamValue {
        ParamValue::Scope(*self)
    }
    fn from_value(v: ParamValue) -> Result<Self, SetParamError> {
        match v {
            ParamValue::Scope(s) => Ok(s),
            _ => Err(SetParamError::WrongKind),
        }
    }
}

impl ParamField for Vec<Vec<TokenId>> {
    const KIND: ParamKind = ParamKind::TokenSequences;
    fn to_value(&self) -> ParamValue {
        ParamValue::Seqs(self.clone())
    }
    fn from_value(v: ParamValue) -> Result<Self, SetParamError> {
        match v {
            ParamValue::Seqs(s) => Ok(s),
            _ => Err(SetParamError::WrongKind),
        }
    }
}

impl ParamField for Vec<TokenId> {
    const KIND: ParamKind = ParamKind::TokenIds;
    fn to_value(&self) -> ParamValue {
        ParamValue::Ids(self.clone())
    }
    fn from_value(v: ParamValue) -> Result<Self, SetParamError> {
        match v {
            ParamValue::Ids(ids) => Ok(ids),
            _ => Err(SetParamError::WrongKind),
        }
    }
}

impl ParamField for Vec<(TokenId, f32)> {
    const KIND: ParamKind = ParamKind::TokenBiases;
    fn to_value(&self) -> ParamValue {
        ParamValue::Biases(self.clone())
    }
    fn from_value(v: ParamValue) -> Result<Self, SetParamError> {
        match v {
            ParamValue::Biases(b) => Ok(b),
            _ => Err(SetParamError::WrongKind),
        }
    }
}

/// A stage parameter: name, type, default, valid range and meaning. Built by
/// the stage registry from the stage's declaration, the one place where the
/// default and the range are written.
#[derive(Debug, Clone, Copy)]
pub struct ParamMeta {
    /// Key name in configs, e.g. `p`.
    pub name: &'static str,
    /// Other accepted key names.
    pub aliases: &'static [&'static str],
    /// Whether the tagged JSON form must give it (no serde default).
    pub required: bool,
    /// Value type.
    pub kind: ParamKind,
    /// The default value (the same one `StageSpec::default_for` and serde use).
    pub default: fn() -> ParamValue,
    /// Lower bound (numbers), if any.
    pub min: Option<f64>,
    /// Upper bound (numbers), if any.
    pub max: Option<f64>,
    /// The valid range in words, used verbatim in errors.
    pub range: &'static str,
    /// One-line meaning, with units.
    pub doc: &'static str,
}

impl ParamMeta {
    /// The default value.
    pub fn default_value(&self) -> ParamValue {
        (self.default)()
    }
    /// The default value as written in TOML.
    pub fn default_toml(&self) -> String {
        self.default_value().to_toml()
    }
}

/// What the device recipe of a stage does to the candidates, as the
/// executor needs to know it (read from metadata, never from the stage's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceEffects {
    /// The device marks removed candidates with `-inf` logits (keeping the
    /// width) where the CPU stage removes them: the host drops `-inf`
    /// candidates after such a stage, so both sides see the same set.
    pub masks_removed: bool,
    /// The device narrows the width to the stage's survivors
    /// ([`StageSpec::survivors`](crate::StageSpec::survivors)) and adds an
    /// `ids` tensor.
    pub narrows: bool,
}

/// Static description of a stage kind.
#[derive(Debug, Clone, Copy)]
pub struct StageMeta {
    /// The kind.
    pub kind: StageKind,
    /// Canonical name (used when serialising).
    pub name: &'static str,
    /// Accepted aliases (matched case-insensitively, `-` and `_` alike).
    pub aliases: &'static [&'static str],
    /// Parameters.
    pub params: &'static [ParamMeta],
    /// What it changes.
    pub effects: Effects,
    /// Needs the accepted-token history.
    pub needs_history: bool,
    /// Needs random numbers (the row's counter-based stream).
    pub needs_randomness: bool,
    /// Needs per-step host data per row besides history and randomness
    /// (the `mask` stage's allowed-token bitmask).
    pub needs_step_input: bool,
    /// A device recipe exists (sampler-backend); the device's `init` may still refuse.
    pub device_hook: bool,
    /// What the device recipe does to the candidates.
    pub device_effects: DeviceEffects,
    /// When the parameters make the stage a no-op, in words.
    pub noop_rule: &'static str,
    /// Whose semantics it follows.
    pub source: &'static str,
    /// Position in llama.cpp's canonical order (used to order stage tables
    /// given without an explicit order, and flat parameters).
    pub order: u32,
    /// llama.cpp's `--sampling-seq` letter, if it has one.
    pub seq_letter: Option<char>,
    /// The key of this stage in OpenAI / vLLM-style flat parameters and in
    /// Hugging Face `generation_config.json` (e.g. `epsilon_cutoff`), for a
    /// stage those front ends build from its metadata alone: the key sets
    /// the stage's first parameter, the request's `min_keep` its `min_keep`
    /// (if it has one), and the stage joins the sampling chain at its
    /// `order` unless the value makes it a no-op. `None`: the front ends
    /// have no key for it, or map it by hand (temperature, top_k, ...).
    pub flat_key: Option<&'static str>,
}

impl StageMeta {
    /// The parameter called `name` (or an alias of it).
    pub fn param(&self, name: &str) -> Option<&'static ParamMeta> {
        let params: &'static [ParamMeta] = self.kind.meta().params;
        params
            .iter()
            .find(|p| p.name == name || p.aliases.contains(&name))
    }
}

impl StageKind {
    /// Canonical name.
    pub fn name(self) -> &'static str {
        self.meta().name
    }

    /// Look a stage up by canonical name or alias: case-insensitive, `-` and
    /// `_` equivalent (llama.cpp `--samplers` names).
    pub fn from_name(name: &str) -> Option<StageKind> {
        let norm = normalize_name(name);
        Self::ALL.into_iter().find(|k| {
            let m = k.meta();
            normalize_name(m.name) == norm || m.aliases.iter().any(|a| normalize_name(a) == norm)
        })
    }

    /// llama.cpp's `--sampling-seq` letters (`e` penalties, `d` dry,
    /// `s` top_n_sigma, `k` top_k, `y` typical, `p` top_p, `m` min_p,
    /// `x` xtc, `t` temperature), from each stage's metadata.
    pub fn from_seq_char(c: char) -> Option<StageKind> {
        let c = c.to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|k| k.meta().seq_letter == Some(c))
    }

    /// Every name and alias, for "did you mean" suggestions.
    pub fn all_names() -> impl Iterator<Item = &'static str> {
        Self::ALL
            .into_iter()
            .flat_map(|k| std::iter::once(k.meta().name).chain(k.meta().aliases.iter().copied()))
    }
}

pub(crate) fn normalize_name(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metas_are_indexed_by_kind() {
        for k in StageKind::ALL {
            assert_eq!(k.meta().kind, k);
        }
    }

    #[test]
    fn llama_cpp_aliases_resolve() {
        for (alias, kind) in [
            ("top-k", StageKind::TopK),
            ("TOPK", StageKind::TopK),
            ("temp", StageKind::Temperature),
            ("typ_p", StageKind::Typical),
            ("typical", StageKind::Typical),
            ("nucleus", StageKind::TopP),
            ("top-n-sigma", StageKind::TopNSigma),
            ("min-p", StageKind::MinP),
        ] {
            assert_eq!(StageKind::from_name(alias), Some(kind), "{alias}");
        }
        assert_eq!(StageKind::from_name("top_kk"), None);
    }

    #[test]
    fn names_map_to_one_kind() {
        let mut seen = std::collections::HashMap::new();
        for k in StageKind::ALL {
            let m = k.meta();
            for n in std::iter::once(m.name).chain(m.aliases.iter().copied()) {
                let prev = seen.insert(normalize_name(n), k);
                assert!(
                    prev.is_none() || prev == Some(k),
                    "name {n} used by two kinds"
                );
            }
        }
    }
}
