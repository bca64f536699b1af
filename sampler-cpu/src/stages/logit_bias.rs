//! `logit_bias`: add a per-token bias.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec, TokenId};

use crate::util::for_each_token_position;

/// Adds `bias` to the logit of each listed token (`-inf` bans it), by token
/// id whatever the row's order (llama.cpp logit-bias / OpenAI `logit_bias`).
/// A token listed twice gets both biases. Tokens no longer in the set are
/// skipped. An empty list is a no-op.
///
/// # Errors
/// [`SampleError::TokenOutOfRange`] when a listed id is `>= vocab` of the
/// row; the row is then left unchanged.
#[derive(Debug, Clone)]
pub struct LogitBias {
    bias: Vec<(TokenId, f32)>,
    tokens: Vec<TokenId>,
    values: Vec<f32>,
}

impl LogitBias {
    /// A logit-bias stage from `(token, bias)` pairs.
    pub fn new(bias: Vec<(TokenId, f32)>) -> Self {
        let tokens = bias.iter().map(|&(t, _)| t).collect();
        let values = bias.iter().map(|&(_, b)| b).collect();
        Self {
            bias,
            tokens,
            values,
        }
    }
}

impl Sampler for LogitBias {
    fn name(&self) -> &str {
        "logit_bias"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::LogitBias {
            bias: self.bias.clone(),
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        let vocab = row.vocab_size();
        if let Some(&token) = self.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(SampleError::TokenOutOfRange { token, vocab });
        }
        if self.tokens.is_empty() || row.is_empty() {
            return Ok(());
        }
        let mut edits: Vec<(usize, f32)> = Vec::with_capacity(self.tokens.len());
        for_each_token_position(row, &self.tokens, |pos, k| {
            edits.push((pos, self.values[k]));
        });
        if edits.is_empty() {
            return Ok(());
        }
        let logits = row.logits_mut();
        for (pos, b) in edits {
            let v = logits[pos] + b;
            // A finite bias never creates `+inf`; `-inf` bans.
            logits[pos] = if v == f32::INFINITY { f32::MAX } else { v };
        }
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
