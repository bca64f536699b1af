//! Serde for [`StageSpec`]: `{"type": "<canonical name>", <param>: <value>,
//! ...}`. Required parameters (`ParamMeta::required`) must be present; the
//! others take the registry default when missing; unknown keys are errors.
//! (`Serialize` is generated with the table, by `define_stages!`.)

use super::{StageKind, StageSpec};
use crate::{HistoryScope, ParamValue, TokenId};

/// Any self-describing value, for [`StageSpec`]'s `Deserialize`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Raw {
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Null(()),
    List(Vec<Raw>),
}

impl Raw {
    fn into_value(self, kind: crate::ParamKind) -> Option<ParamValue> {
        use crate::ParamKind as K;
        fn token(r: &Raw) -> Option<TokenId> {
            match r {
                Raw::Int(i) => TokenId::try_from(*i).ok(),
                _ => None,
            }
        }
        fn float(r: &Raw) -> Option<f32> {
            match r {
                Raw::Int(i) => Some(*i as f32),
                Raw::UInt(u) => Some(*u as f32),
                Raw::Float(x) => Some(*x as f32),
                // serde_json writes non-finite floats as null; -inf is the only
                // non-finite value a parameter can hold (a logit_bias ban).
                Raw::Null(()) => Some(f32::NEG_INFINITY),
                _ => None,
            }
        }
        match (kind, self) {
            (K::Int, Raw::Int(i)) => Some(ParamValue::Int(i)),
            (K::Int, Raw::UInt(u)) => Some(ParamValue::UInt(u)),
            (K::Float, r) => float(&r).map(ParamValue::Float),
            (K::Enum(_), Raw::Str(s)) => HistoryScope::from_word(&s).map(ParamValue::Scope),
            (K::TokenIds, Raw::List(ids)) => ids
                .iter()
                .map(token)
                .collect::<Option<Vec<_>>>()
                .map(ParamValue::Ids),
            (K::TokenSequences, Raw::List(seqs)) => seqs
                .iter()
                .map(|s| match s {
                    Raw::List(ids) => ids.iter().map(token).collect::<Option<Vec<_>>>(),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .map(ParamValue::Seqs),
            (K::TokenBiases, Raw::List(pairs)) => pairs
                .iter()
                .map(|p| match p {
                    Raw::List(two) if two.len() == 2 => Some((token(&two[0])?, float(&two[1])?)),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .map(ParamValue::Biases),
            _ => None,
        }
    }
}

impl<'de> serde::Deserialize<'de> for StageSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut map: std::collections::BTreeMap<String, Raw> =
            serde::Deserialize::deserialize(deserializer)?;
        let ty = match map.remove("type") {
            Some(Raw::Str(s)) => s,
            _ => return Err(D::Error::missing_field("type")),
        };
        let kind = StageKind::ALL
            .into_iter()
            .find(|k| k.name() == ty)
            .ok_or_else(|| D::Error::unknown_variant(&ty, &[]))?;
        let meta = kind.meta();
        if let Some(pm) = meta.params.iter().find(|pm| {
            pm.required
                && !map
                    .keys()
                    .any(|k| meta.param(k).is_some_and(|p| p.name == pm.name))
        }) {
            return Err(D::Error::missing_field(pm.name));
        }
        let mut spec = StageSpec::default_for(kind);
        for (key, raw) in map {
            let pm = meta
                .param(&key)
                .ok_or_else(|| D::Error::unknown_field(&key, &[]))?;
            let value = raw.into_value(pm.kind).ok_or_else(|| {
                D::Error::custom(format!("{}.{}: expected {}", meta.name, pm.name, pm.range))
            })?;
            spec.set_param(pm.name, value).map_err(|_| {
                D::Error::custom(format!("{}.{}: expected {}", meta.name, pm.name, pm.range))
            })?;
        }
        Ok(spec)
    }
}
