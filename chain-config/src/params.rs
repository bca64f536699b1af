//! The bridge between [`StageSpec`] fields and the parameter names of the
//! stage metadata (`ParamMeta::name`): defaults, setting one parameter by
//! name, and listing a stage's parameters for serialisation.

use sampler_core::{HistoryScope, StageKind, StageSpec, TokenId};

/// One parameter value, already type-checked against its `ParamKind`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PValue {
    /// `ParamKind::Int`.
    Int(i64),
    /// `ParamKind::Float`.
    Float(f32),
    /// `ParamKind::Enum` (only `scope` today).
    Scope(HistoryScope),
    /// `ParamKind::TokenSequences`.
    Seqs(Vec<Vec<TokenId>>),
    /// `ParamKind::TokenBiases`.
    Biases(Vec<(TokenId, f32)>),
}

/// The TOML word of a scope.
pub(crate) fn scope_word(s: HistoryScope) -> &'static str {
    match s {
        HistoryScope::PromptAndOutput => "prompt_and_output",
        HistoryScope::Output => "output",
    }
}

/// The scope of a TOML word.
pub(crate) fn scope_from_word(s: &str) -> Option<HistoryScope> {
    match s {
        "prompt_and_output" => Some(HistoryScope::PromptAndOutput),
        "output" => Some(HistoryScope::Output),
        _ => None,
    }
}

/// A stage of `kind` with every parameter at its documented default
/// (`ParamMeta::default`; llama.cpp's `common_params_sampling` values).
pub fn default_stage(kind: StageKind) -> StageSpec {
    match kind {
        StageKind::Greedy => StageSpec::Greedy,
        StageKind::Dist => StageSpec::Dist,
        StageKind::TopK => StageSpec::TopK { k: 40 },
        StageKind::TopP => StageSpec::TopP {
            p: 0.95,
            min_keep: 0,
        },
        StageKind::MinP => StageSpec::MinP {
            p: 0.05,
            min_keep: 0,
        },
        StageKind::Typical => StageSpec::Typical {
            p: 1.0,
            min_keep: 0,
        },
        StageKind::Temperature => StageSpec::Temperature {
            t: 0.8,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        },
        StageKind::Xtc => StageSpec::Xtc {
            probability: 0.0,
            threshold: 0.1,
            min_keep: 0,
        },
        StageKind::TopNSigma => StageSpec::TopNSigma { n: -1.0 },
        StageKind::Mirostat => StageSpec::Mirostat {
            tau: 5.0,
            eta: 0.1,
            m: 100,
        },
        StageKind::MirostatV2 => StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 },
        StageKind::Penalties => StageSpec::Penalties {
            last_n: 64,
            repeat: 1.0,
            frequency: 0.0,
            presence: 0.0,
            scope: HistoryScope::PromptAndOutput,
        },
        StageKind::Dry => StageSpec::Dry {
            multiplier: 0.0,
            base: 1.75,
            allowed_length: 2,
            last_n: 64,
            seq_breakers: Vec::new(),
            scope: HistoryScope::PromptAndOutput,
        },
        StageKind::LogitBias => StageSpec::LogitBias { bias: Vec::new() },
        StageKind::NoRepeatNgram => StageSpec::NoRepeatNgram {
            n: 0,
            scope: HistoryScope::PromptAndOutput,
        },
    }
}

/// Why [`set_param`] refused.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SetError {
    /// The stage has no parameter of that name.
    Unknown,
    /// The value does not fit the field (e.g. a negative count).
    Range,
}

fn to_usize(i: i64) -> Result<usize, SetError> {
    usize::try_from(i).map_err(|_| SetError::Range)
}

/// Set the parameter `name` (a canonical `ParamMeta::name`) of `spec`.
/// The value's variant must match the parameter's kind.
pub(crate) fn set_param(spec: &mut StageSpec, name: &str, v: PValue) -> Result<(), SetError> {
    use PValue as V;
    use StageSpec as S;
    match (spec, name, v) {
        (S::TopK { k }, "k", V::Int(i)) => *k = i,
        (S::TopP { p, .. } | S::MinP { p, .. } | S::Typical { p, .. }, "p", V::Float(x)) => *p = x,
        (
            S::TopP { min_keep, .. }
            | S::MinP { min_keep, .. }
            | S::Typical { min_keep, .. }
            | S::Xtc { min_keep, .. },
            "min_keep",
            V::Int(i),
        ) => *min_keep = to_usize(i)?,
        (S::Temperature { t, .. }, "t", V::Float(x)) => *t = x,
        (S::Temperature { dynatemp_range, .. }, "dynatemp_range", V::Float(x)) => {
            *dynatemp_range = x
        }
        (
            S::Temperature {
                dynatemp_exponent, ..
            },
            "dynatemp_exponent",
            V::Float(x),
        ) => *dynatemp_exponent = x,
        (S::Xtc { probability, .. }, "probability", V::Float(x)) => *probability = x,
        (S::Xtc { threshold, .. }, "threshold", V::Float(x)) => *threshold = x,
        (S::TopNSigma { n }, "n", V::Float(x)) => *n = x,
        (S::Mirostat { tau, .. } | S::MirostatV2 { tau, .. }, "tau", V::Float(x)) => *tau = x,
        (S::Mirostat { eta, .. } | S::MirostatV2 { eta, .. }, "eta", V::Float(x)) => *eta = x,
        (S::Mirostat { m, .. }, "m", V::Int(i)) => *m = to_usize(i)?,
        (S::Penalties { last_n, .. } | S::Dry { last_n, .. }, "last_n", V::Int(i)) => {
            *last_n = to_usize(i)?
        }
        (S::Penalties { repeat, .. }, "repeat", V::Float(x)) => *repeat = x,
        (S::Penalties { frequency, .. }, "frequency", V::Float(x)) => *frequency = x,
        (S::Penalties { presence, .. }, "presence", V::Float(x)) => *presence = x,
        (
            S::Penalties { scope, .. } | S::Dry { scope, .. } | S::NoRepeatNgram { scope, .. },
            "scope",
            V::Scope(s),
        ) => *scope = s,
        (S::Dry { multiplier, .. }, "multiplier", V::Float(x)) => *multiplier = x,
        (S::Dry { base, .. }, "base", V::Float(x)) => *base = x,
        (S::Dry { allowed_length, .. }, "allowed_length", V::Int(i)) => {
            *allowed_length = to_usize(i)?
        }
        (S::Dry { seq_breakers, .. }, "seq_breakers", V::Seqs(s)) => *seq_breakers = s,
        (S::LogitBias { bias }, "bias", V::Biases(b)) => *bias = b,
        (S::NoRepeatNgram { n, .. }, "n", V::Int(i)) => *n = to_usize(i)?,
        _ => return Err(SetError::Unknown),
    }
    Ok(())
}

fn int(u: usize) -> PValue {
    PValue::Int(i64::try_from(u).unwrap_or(i64::MAX))
}

/// Every parameter of `spec` as `(ParamMeta::name, value)`, in metadata order.
pub(crate) fn params_of(spec: &StageSpec) -> Vec<(&'static str, PValue)> {
    use PValue as V;
    use StageSpec as S;
    match spec {
        S::Greedy | S::Dist => vec![],
        S::TopK { k } => vec![("k", V::Int(*k))],
        S::TopP { p, min_keep } | S::MinP { p, min_keep } | S::Typical { p, min_keep } => {
            vec![("p", V::Float(*p)), ("min_keep", int(*min_keep))]
        }
        S::Temperature {
            t,
            dynatemp_range,
            dynatemp_exponent,
        } => vec![
            ("t", V::Float(*t)),
            ("dynatemp_range", V::Float(*dynatemp_range)),
            ("dynatemp_exponent", V::Float(*dynatemp_exponent)),
        ],
        S::Xtc {
            probability,
            threshold,
            min_keep,
        } => vec![
            ("probability", V::Float(*probability)),
            ("threshold", V::Float(*threshold)),
            ("min_keep", int(*min_keep)),
        ],
        S::TopNSigma { n } => vec![("n", V::Float(*n))],
        S::Mirostat { tau, eta, m } => vec![
            ("tau", V::Float(*tau)),
            ("eta", V::Float(*eta)),
            ("m", int(*m)),
        ],
        S::MirostatV2 { tau, eta } => vec![("tau", V::Float(*tau)), ("eta", V::Float(*eta))],
        S::Penalties {
            last_n,
            repeat,
            frequency,
            presence,
            scope,
        } => vec![
            ("last_n", int(*last_n)),
            ("repeat", V::Float(*repeat)),
            ("frequency", V::Float(*frequency)),
            ("presence", V::Float(*presence)),
            ("scope", V::Scope(*scope)),
        ],
        S::Dry {
            multiplier,
            base,
            allowed_length,
            last_n,
            seq_breakers,
            scope,
        } => vec![
            ("multiplier", V::Float(*multiplier)),
            ("base", V::Float(*base)),
            ("allowed_length", int(*allowed_length)),
            ("last_n", int(*last_n)),
            ("seq_breakers", V::Seqs(seq_breakers.clone())),
            ("scope", V::Scope(*scope)),
        ],
        S::LogitBias { bias } => vec![("bias", V::Biases(bias.clone()))],
        S::NoRepeatNgram { n, scope } => vec![("n", int(*n)), ("scope", V::Scope(*scope))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toml_out::render_value;

    /// The defaults here and in sampler-core's metadata must agree.
    #[test]
    fn defaults_match_metadata() {
        for kind in StageKind::ALL {
            let meta = kind.meta();
            let spec = default_stage(kind);
            let params = params_of(&spec);
            assert_eq!(params.len(), meta.params.len(), "{}", meta.name);
            for ((name, value), pm) in params.iter().zip(meta.params) {
                assert_eq!(*name, pm.name);
                let written = render_value(value);
                let a: f64 = written.parse().unwrap_or(f64::NAN);
                let b: f64 = pm.default.parse().unwrap_or(f64::NAN);
                assert!(
                    written == pm.default || a == b,
                    "{}.{}: {written} vs {}",
                    meta.name,
                    name,
                    pm.default
                );
            }
        }
    }

    /// Every listed parameter can be set back by name.
    #[test]
    fn params_round_trip_through_set_param() {
        for kind in StageKind::ALL {
            let spec = default_stage(kind);
            let mut copy = default_stage(kind);
            for (name, value) in params_of(&spec) {
                assert_eq!(set_param(&mut copy, name, value), Ok(()), "{name}");
            }
            assert_eq!(copy, spec);
        }
    }
}
