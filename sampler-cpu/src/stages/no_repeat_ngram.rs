//! `no_repeat_ngram`: ban tokens that would repeat an n-gram.

use sampler_core::{
    Candidates, HistoryScope, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin,
};

use crate::util::for_each_token_position;

/// Hugging Face transformers' `NoRepeatNGramLogitsProcessor`: with `h` the
/// in-scope history (all accepted tokens, or generated ones only), every
/// token `x` such that `h[len-n+1..] + [x]` already occurs as an n-gram of
/// `h` gets logit `-inf`. Nothing is banned while `len(h) + 1 < n`. `n == 1`
/// bans every token already in the history; `n == 0` is a no-op. Tokens are
/// matched by id, whatever the row's order. Cost O(len(h)·n) per step.
#[derive(Debug, Clone)]
pub struct NoRepeatNgram {
    n: usize,
    scope: HistoryScope,
    history: Vec<TokenId>,
}

impl NoRepeatNgram {
    /// A no-repeat-n-gram stage.
    pub fn new(n: usize, scope: HistoryScope) -> Self {
        Self {
            n,
            scope,
            history: Vec::new(),
        }
    }

    /// The tokens banned at the next step (may contain duplicates).
    pub fn banned(&self) -> Vec<TokenId> {
        let (n, h) = (self.n, &self.history);
        if n == 0 || h.len() + 1 < n {
            return Vec::new();
        }
        let prefix = &h[h.len() + 1 - n..];
        h.windows(n)
            .filter(|w| &w[..n - 1] == prefix)
            .map(|w| w[n - 1])
            .collect()
    }
}

impl Sampler for NoRepeatNgram {
    fn name(&self) -> &str {
        "no_repeat_ngram"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::NoRepeatNgram {
            n: self.n,
            scope: self.scope,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        let mut banned = self.banned();
        if banned.is_empty() || row.is_empty() {
            return Ok(());
        }
        banned.sort_unstable();
        banned.dedup();
        let mut positions = Vec::with_capacity(banned.len());
        for_each_token_position(row, &banned, |pos, _| positions.push(pos));
        if positions.is_empty() {
            return Ok(());
        }
        let logits = row.logits_mut();
        for pos in positions {
            logits[pos] = f32::NEG_INFINITY;
        }
        Ok(())
    }
    fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        if self.n == 0 || (self.scope == HistoryScope::Output && origin == TokenOrigin::Prompt) {
            return;
        }
        self.history.push(token);
    }
    fn reset(&mut self) {
        self.history.clear();
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
