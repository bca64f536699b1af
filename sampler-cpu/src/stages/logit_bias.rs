//! `logit_bias`: add a per-token bias.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec, TokenId};

use crate::util::for_each_token_position;

/// Adds `bias` to the logit of each listed token (`-inf` bans it), by token
/// id whatever the row's order (llama.cpp logit-bias / OpenAI `logit_bias`).
/// A token listed more than once gets the sum of its biases, summed in the
/// listed order and added once (`l + (b1 + b2)`, as the device adds its
/// dense table; not `(l + b1) + b2`), by `sampler_core::numerics::add_bias`:
/// a `-inf` among them bans the token, finite sums saturate at `±f32::MAX`. Tokens no longer in the set are
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
        // One entry per token (first listed first), its biases summed.
        let mut tokens: Vec<TokenId> = Vec::with_capacity(bias.len());
        let mut values: Vec<f32> = Vec::with_capacity(bias.len());
        let mut at = std::collections::HashMap::with_capacity(bias.len());
        for &(t, b) in &bias {
            match at.entry(t) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    let v = &mut values[*e.get()];
                    *v = sampler_core::numerics::add_bias(*v, b);
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(tokens.len());
                    tokens.push(t);
                    values.push(b);
                }
            }
        }
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
    fn apply_full_row(
        &mut self,
        logits: &mut [f32],
        _ctx: &StageContext,
    ) -> Option<Result<(), SampleError>> {
        let vocab = logits.len();
        if let Some(&token) = self.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Some(Err(SampleError::TokenOutOfRange { token, vocab }));
        }
        for (&t, &b) in self.tokens.iter().zip(&self.values) {
            let v = logits[t as usize] + b;
            logits[t as usize] = if v == f32::INFINITY { f32::MAX } else { v };
        }
        Some(Ok(()))
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
