//! Declarative chain specs: what `chain-config` produces and what
//! `sampler-cpu` / `sampler-backend` build stages from.

use serde::{Deserialize, Serialize};

use crate::{ParamError, StageKind, TokenId};

/// Which accepted tokens count as a history-based stage's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryScope {
    /// Prompt tokens (fed with `accept_prompt`) and generated tokens
    /// (llama.cpp server; transformers' repetition penalty).
    #[default]
    PromptAndOutput,
    /// Generated tokens only (vLLM's frequency/presence penalties).
    Output,
}

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`): the argmax
/// keeps its logit and every other candidate gets `-inf`.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// One stage with its parameters. Serialises with a `"type"` tag holding the
/// canonical stage name (tokenizers-style), so a chain round-trips through JSON.
///
/// Parameters follow llama.cpp's names and semantics; see `docs/semantics.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StageSpec {
    /// Argmax; ties to the lowest token id.
    Greedy,
    /// Draw from softmax of the current candidates (contract 7 randomness).
    Dist,
    /// Keep the `k` highest logits; `k <= 0` is a no-op.
    TopK {
        /// Candidates kept.
        k: i64,
    },
    /// Nucleus sampling; `p >= 1` is a no-op.
    TopP {
        /// Mass kept, in `[0, 1]`.
        p: f32,
        /// Minimum candidates kept.
        #[serde(default)]
        min_keep: usize,
    },
    /// Min-p; `p <= 0` is a no-op.
    MinP {
        /// Fraction of the top probability, `>= 0`.
        p: f32,
        /// Minimum candidates kept.
        #[serde(default)]
        min_keep: usize,
    },
    /// Locally typical sampling; `p >= 1` is a no-op.
    Typical {
        /// Mass kept, in `[0, 1]`.
        p: f32,
        /// Minimum candidates kept.
        #[serde(default)]
        min_keep: usize,
    },
    /// Temperature with optional dynamic range.
    Temperature {
        /// Temperature, `>= 0`; below [`GREEDY_TEMPERATURE`] greedy.
        t: f32,
        /// Dynamic-temperature half range, `>= 0`.
        #[serde(default)]
        dynatemp_range: f32,
        /// Dynamic-temperature exponent, `>= 0`.
        #[serde(default = "one")]
        dynatemp_exponent: f32,
    },
    /// Exclude top choices.
    Xtc {
        /// Chance to act, `[0, 1]`.
        probability: f32,
        /// Top-choice threshold, `[0, 1]`; above 0.5 disables.
        threshold: f32,
        /// Minimum candidates kept.
        #[serde(default)]
        min_keep: usize,
    },
    /// Top-n-sigma; `n <= 0` is a no-op.
    TopNSigma {
        /// Standard deviations below the max that survive.
        n: f32,
    },
    /// Mirostat v1; selects a token.
    Mirostat {
        /// Target surprise (bits).
        tau: f32,
        /// Learning rate.
        eta: f32,
        /// Tokens used to estimate the Zipf exponent.
        #[serde(default = "hundred")]
        m: usize,
    },
    /// Mirostat v2; selects a token.
    MirostatV2 {
        /// Target surprise (bits).
        tau: f32,
        /// Learning rate.
        eta: f32,
    },
    /// Repetition / frequency / presence penalties over the last `last_n` history tokens.
    Penalties {
        /// Window size; 0 disables.
        last_n: usize,
        /// Repetition penalty, `> 0` (1 = off).
        #[serde(default = "one")]
        repeat: f32,
        /// Frequency penalty (per occurrence).
        #[serde(default)]
        frequency: f32,
        /// Presence penalty (once).
        #[serde(default)]
        presence: f32,
        /// History scope.
        #[serde(default)]
        scope: HistoryScope,
    },
    /// DRY n-gram repetition penalty.
    Dry {
        /// Penalty scale; 0 disables.
        multiplier: f32,
        /// Exponential base, `>= 1`.
        #[serde(default = "dry_base")]
        base: f32,
        /// Free repeat length.
        #[serde(default = "two")]
        allowed_length: usize,
        /// Window; 0 disables.
        #[serde(default = "sixty_four")]
        last_n: usize,
        /// Sequence breakers as token-id sequences.
        #[serde(default)]
        seq_breakers: Vec<Vec<TokenId>>,
        /// History scope.
        #[serde(default)]
        scope: HistoryScope,
    },
    /// Additive logit bias per token (`-inf` bans).
    LogitBias {
        /// `(token, bias)` pairs.
        bias: Vec<(TokenId, f32)>,
    },
    /// Ban tokens that would complete an n-gram already in the history.
    NoRepeatNgram {
        /// n-gram size; 0 disables.
        n: usize,
        /// History scope.
        #[serde(default)]
        scope: HistoryScope,
    },
}

fn one() -> f32 {
    1.0
}
fn two() -> usize {
    2
}
fn hundred() -> usize {
    100
}
fn sixty_four() -> usize {
    64
}
fn dry_base() -> f32 {
    1.75
}

fn check(
    stage: &'static str,
    param: &'static str,
    value: f32,
    ok: bool,
    expected: &str,
) -> Result<(), ParamError> {
    if ok {
        Ok(())
    } else {
        Err(ParamError {
            stage,
            param,
            value: format!("{value}"),
            expected: expected.to_string(),
        })
    }
}

impl StageSpec {
    /// The stage's kind.
    pub fn kind(&self) -> StageKind {
        match self {
            StageSpec::Greedy => StageKind::Greedy,
            StageSpec::Dist => StageKind::Dist,
            StageSpec::TopK { .. } => StageKind::TopK,
            StageSpec::TopP { .. } => StageKind::TopP,
            StageSpec::MinP { .. } => StageKind::MinP,
            StageSpec::Typical { .. } => StageKind::Typical,
            StageSpec::Temperature { .. } => StageKind::Temperature,
            StageSpec::Xtc { .. } => StageKind::Xtc,
            StageSpec::TopNSigma { .. } => StageKind::TopNSigma,
            StageSpec::Mirostat { .. } => StageKind::Mirostat,
            StageSpec::MirostatV2 { .. } => StageKind::MirostatV2,
            StageSpec::Penalties { .. } => StageKind::Penalties,
            StageSpec::Dry { .. } => StageKind::Dry,
            StageSpec::LogitBias { .. } => StageKind::LogitBias,
            StageSpec::NoRepeatNgram { .. } => StageKind::NoRepeatNgram,
        }
    }

    /// Canonical stage name.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Whether these parameters make the stage a no-op (llama.cpp's "empty
    /// sampler" rules, DESIGN.md contract 5). A no-op stage is skipped and
    /// never breaks a device prefix.
    pub fn is_noop(&self) -> bool {
        match *self {
            StageSpec::Greedy | StageSpec::Dist => false,
            StageSpec::Mirostat { .. } | StageSpec::MirostatV2 { .. } => false,
            StageSpec::TopK { k } => k <= 0,
            StageSpec::TopP { p, .. } => p >= 1.0,
            StageSpec::MinP { p, .. } => p <= 0.0,
            StageSpec::Typical { p, .. } => p >= 1.0,
            StageSpec::Temperature {
                t, dynatemp_range, ..
            } => t == 1.0 && dynatemp_range <= 0.0,
            StageSpec::Xtc {
                probability,
                threshold,
                ..
            } => probability <= 0.0 || threshold > 0.5,
            StageSpec::TopNSigma { n } => n <= 0.0,
            StageSpec::Penalties {
                last_n,
                repeat,
                frequency,
                presence,
                ..
            } => last_n == 0 || (repeat == 1.0 && frequency == 0.0 && presence == 0.0),
            StageSpec::Dry {
                multiplier, last_n, ..
            } => multiplier == 0.0 || last_n == 0,
            StageSpec::LogitBias { ref bias } => bias.is_empty(),
            StageSpec::NoRepeatNgram { n, .. } => n == 0,
        }
    }

    /// Whether the stage selects a token (greedy, dist, mirostat v1/v2).
    pub fn selects(&self) -> bool {
        self.kind().meta().effects.selects
    }

    /// Check every parameter against its documented range.
    ///
    /// # Errors
    /// The first [`ParamError`] found: stage, parameter, value and range.
    pub fn validate(&self) -> Result<(), ParamError> {
        let name = self.name();
        match *self {
            StageSpec::Greedy | StageSpec::Dist | StageSpec::TopK { .. } => Ok(()),
            StageSpec::TopP { p, .. } | StageSpec::Typical { p, .. } => {
                check(name, "p", p, (0.0..=1.0).contains(&p), "a number in [0, 1]")
            }
            StageSpec::MinP { p, .. } => check(
                name,
                "p",
                p,
                p.is_finite() && p >= 0.0,
                "a finite number >= 0",
            ),
            StageSpec::Temperature {
                t,
                dynatemp_range,
                dynatemp_exponent,
            } => {
                check(
                    name,
                    "t",
                    t,
                    t.is_finite() && t >= 0.0,
                    "a finite number >= 0",
                )?;
                check(
                    name,
                    "dynatemp_range",
                    dynatemp_range,
                    dynatemp_range.is_finite() && dynatemp_range >= 0.0,
                    "a finite number >= 0",
                )?;
                check(
                    name,
                    "dynatemp_exponent",
                    dynatemp_exponent,
                    dynatemp_exponent.is_finite() && dynatemp_exponent >= 0.0,
                    "a finite number >= 0",
                )
            }
            StageSpec::Xtc {
                probability,
                threshold,
                ..
            } => {
                check(
                    name,
                    "probability",
                    probability,
                    (0.0..=1.0).contains(&probability),
                    "a number in [0, 1]",
                )?;
                check(
                    name,
                    "threshold",
                    threshold,
                    (0.0..=1.0).contains(&threshold),
                    "a number in [0, 1]",
                )
            }
            StageSpec::TopNSigma { n } => check(name, "n", n, n.is_finite(), "a finite number"),
            StageSpec::Mirostat { tau, eta, m } => {
                check(
                    name,
                    "tau",
                    tau,
                    tau.is_finite() && tau >= 0.0,
                    "a finite number >= 0",
                )?;
                check(
                    name,
                    "eta",
                    eta,
                    eta.is_finite() && eta >= 0.0,
                    "a finite number >= 0",
                )?;
                if m == 0 {
                    return Err(ParamError {
                        stage: name,
                        param: "m",
                        value: "0".into(),
                        expected: "an integer >= 1".into(),
                    });
                }
                Ok(())
            }
            StageSpec::MirostatV2 { tau, eta } => {
                check(
                    name,
                    "tau",
                    tau,
                    tau.is_finite() && tau >= 0.0,
                    "a finite number >= 0",
                )?;
                check(
                    name,
                    "eta",
                    eta,
                    eta.is_finite() && eta >= 0.0,
                    "a finite number >= 0",
                )
            }
            StageSpec::Penalties {
                repeat,
                frequency,
                presence,
                ..
            } => {
                check(
                    name,
                    "repeat",
                    repeat,
                    repeat.is_finite() && repeat > 0.0 && (1.0 / repeat).is_finite(),
                    "a finite number > 0",
                )?;
                check(
                    name,
                    "frequency",
                    frequency,
                    frequency.is_finite(),
                    "a finite number",
                )?;
                check(
                    name,
                    "presence",
                    presence,
                    presence.is_finite(),
                    "a finite number",
                )
            }
            StageSpec::Dry {
                multiplier,
                base,
                ref seq_breakers,
                ..
            } => {
                check(
                    name,
                    "multiplier",
                    multiplier,
                    multiplier.is_finite() && multiplier >= 0.0,
                    "a finite number >= 0",
                )?;
                check(
                    name,
                    "base",
                    base,
                    base.is_finite() && base >= 1.0,
                    "a finite number >= 1",
                )?;
                if seq_breakers.iter().any(|s| s.is_empty()) {
                    return Err(ParamError {
                        stage: name,
                        param: "seq_breakers",
                        value: "[]".into(),
                        expected: "a list of non-empty token-id lists".into(),
                    });
                }
                Ok(())
            }
            StageSpec::LogitBias { ref bias } => {
                for &(token, b) in bias {
                    if !(b.is_finite() || b == f32::NEG_INFINITY) {
                        return Err(ParamError {
                            stage: name,
                            param: "bias",
                            value: format!("{{{token}: {b}}}"),
                            expected: "a finite number or -inf per token".into(),
                        });
                    }
                }
                Ok(())
            }
            StageSpec::NoRepeatNgram { .. } => Ok(()),
        }
    }
}

/// A whole chain: stages in order plus the row's seed. `seed: None` draws a
/// fresh seed from the OS when the chain is built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ChainSpec {
    /// Stages in application order.
    pub stages: Vec<StageSpec>,
    /// Seed for contract-7 randomness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl ChainSpec {
    /// A chain of these stages with a fixed seed.
    pub fn new(stages: Vec<StageSpec>, seed: Option<u64>) -> Self {
        Self { stages, seed }
    }

    /// Validate every stage's parameters.
    ///
    /// # Errors
    /// The first [`ParamError`] with its stage index.
    pub fn validate(&self) -> Result<(), (usize, ParamError)> {
        for (i, s) in self.stages.iter().enumerate() {
            s.validate().map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Whether some active stage selects a token.
    pub fn selects(&self) -> bool {
        self.stages.iter().any(|s| s.selects())
    }

    /// llama.cpp's chain string of the active stages (`top_k;temperature;dist`).
    pub fn chain_string(&self) -> String {
        self.stages
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noop_rules() {
        assert!(StageSpec::TopK { k: 0 }.is_noop());
        assert!(StageSpec::TopK { k: -1 }.is_noop());
        assert!(
            StageSpec::TopP {
                p: 1.0,
                min_keep: 0
            }
            .is_noop()
        );
        assert!(
            StageSpec::MinP {
                p: 0.0,
                min_keep: 0
            }
            .is_noop()
        );
        assert!(
            !StageSpec::MinP {
                p: 1.05,
                min_keep: 0
            }
            .is_noop()
        );
        assert!(
            StageSpec::Xtc {
                probability: 1.0,
                threshold: 0.6,
                min_keep: 0
            }
            .is_noop()
        );
        assert!(
            StageSpec::Temperature {
                t: 1.0,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0
            }
            .is_noop()
        );
        assert!(
            !StageSpec::Temperature {
                t: 1.0,
                dynatemp_range: 0.5,
                dynatemp_exponent: 1.0
            }
            .is_noop()
        );
        assert!(
            StageSpec::Penalties {
                last_n: 0,
                repeat: 1.5,
                frequency: 0.0,
                presence: 0.0,
                scope: HistoryScope::PromptAndOutput
            }
            .is_noop()
        );
    }

    #[test]
    fn validate_names_param_and_range() {
        let e = StageSpec::TopP {
            p: 1.5,
            min_keep: 0,
        }
        .validate()
        .unwrap_err();
        assert_eq!((e.stage, e.param), ("top_p", "p"));
        assert!(e.to_string().contains("[0, 1]"));
        let e = StageSpec::Penalties {
            last_n: 64,
            repeat: 0.0,
            frequency: 0.0,
            presence: 0.0,
            scope: HistoryScope::Output,
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.param, "repeat");
    }
}
