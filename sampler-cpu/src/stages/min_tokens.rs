//! `min_tokens`: no stop token before `n` generated tokens.

use sampler_core::{
    Candidates, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin,
};

use crate::util::for_each_token_position;

/// Bans the `stop` token ids (logit `-inf`) while fewer than `n` tokens have
/// been generated since the chain was built or reset (vLLM `min_tokens`,
/// Hugging Face `min_new_tokens`). Prompt tokens do not count. `n = 0` or no
/// stop ids is a no-op.
///
/// # Errors
/// [`SampleError::TokenOutOfRange`] when a stop id is `>= vocab` of the row.
#[derive(Debug, Clone)]
pub struct MinTokens {
    n: usize,
    stop: Vec<TokenId>,
    generated: usize,
}

impl MinTokens {
    /// Ban `stop` until `n` tokens have been generated.
    pub fn new(n: usize, stop: Vec<TokenId>) -> Self {
        Self {
            n,
            stop,
            generated: 0,
        }
    }
}

impl Sampler for MinTokens {
    fn name(&self) -> &str {
        "min_tokens"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::MinTokens {
            n: self.n,
            stop: self.stop.clone(),
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        let vocab = row.vocab_size();
        if let Some(&token) = self.stop.iter().find(|&&t| t as usize >= vocab) {
            return Err(SampleError::TokenOutOfRange { token, vocab });
        }
        if self.generated >= self.n || row.is_empty() {
            return Ok(());
        }
        let mut hits = Vec::with_capacity(self.stop.len());
        for_each_token_position(row, &self.stop, |pos, _| hits.push(pos));
        let logits = row.logits();
        if hits.iter().all(|&p| logits[p] == f32::NEG_INFINITY) {
            return Ok(());
        }
        let logits = row.logits_mut();
        for p in hits {
            logits[p] = f32::NEG_INFINITY;
        }
        Ok(())
    }
    fn apply_full_row(
        &mut self,
        logits: &mut [f32],
        _ctx: &StageContext,
    ) -> Option<Result<(), SampleError>> {
        let vocab = logits.len();
        if let Some(&token) = self.stop.iter().find(|&&t| t as usize >= vocab) {
            return Some(Err(SampleError::TokenOutOfRange { token, vocab }));
        }
        if self.generated < self.n {
            for &t in &self.stop {
                logits[t as usize] = f32::NEG_INFINITY;
            }
        }
        Some(Ok(()))
    }
    fn accept(&mut self, _token: TokenId, origin: TokenOrigin) {
        if origin == TokenOrigin::Output {
            self.generated += 1;
        }
    }
    fn reset(&mut self) {
        self.generated = 0;
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
