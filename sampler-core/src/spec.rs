//! Declarative chain specs: what `chain-config` produces and what
//! `sampler-cpu` / `sampler-backend` build stages from.

use serde::{Deserialize, Serialize};

use crate::ParamError;
use crate::logprobs::LogprobsSpec;
pub use crate::registry::StageSpec;

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

impl HistoryScope {
    /// The config words, in declaration order.
    pub const WORDS: &'static [&'static str] = &["prompt_and_output", "output"];

    /// The config word of this scope.
    pub fn word(self) -> &'static str {
        match self {
            HistoryScope::PromptAndOutput => "prompt_and_output",
            HistoryScope::Output => "output",
        }
    }

    /// The scope of a config word.
    pub fn from_word(word: &str) -> Option<HistoryScope> {
        match word {
            "prompt_and_output" => Some(HistoryScope::PromptAndOutput),
            "output" => Some(HistoryScope::Output),
            _ => None,
        }
    }
}

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`): the argmax
/// keeps its logit and every other candidate gets `-inf`.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// A whole chain: stages in order plus the row's seed. `seed: None` draws a
/// fresh seed from the OS when the chain is built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ChainSpec {
    /// Stages in application order.
    pub stages: Vec<StageSpec>,
    /// Seed of the row's counter-based random stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Logprobs to report with each sampled token (off when `None`); see
    /// [`crate::logprobs`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobsSpec>,
}

impl ChainSpec {
    /// A chain of these stages with a fixed seed.
    pub fn new(stages: Vec<StageSpec>, seed: Option<u64>) -> Self {
        Self {
            stages,
            seed,
            logprobs: None,
        }
    }

    /// Validate every stage's parameters.
    ///
    /// # Errors
    /// The first [`ParamError`] with its stage index.
    /// A stage's error comes with its index; a logprobs error with the
    /// index `stages.len()`.
    pub fn validate(&self) -> Result<(), (usize, ParamError)> {
        if let Some(lp) = &self.logprobs {
            lp.validate().map_err(|e| (self.stages.len(), e))?;
        }
        for (i, s) in self.stages.iter().enumerate() {
            s.validate().map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Give every `min_tokens` stage that lists no stop ids these (the
    /// model's EOS ids, as vLLM adds them): flat parameters and
    /// `generation_config.json` without stop ids leave them to the host app.
    pub fn fill_stop_ids(&mut self, ids: &[crate::TokenId]) {
        for s in &mut self.stages {
            if let StageSpec::MinTokens { stop, .. } = s
                && stop.is_empty()
            {
                stop.extend_from_slice(ids);
            }
        }
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
