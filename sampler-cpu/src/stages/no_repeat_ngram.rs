//! `no_repeat_ngram`: ban tokens that would repeat an n-gram.

use std::collections::HashMap;

use sampler_core::{
    Candidates, HistoryScope, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin,
};

use crate::util::for_each_token_position;

/// Hugging Face transformers' `NoRepeatNGramLogitsProcessor`: with `h` the
/// in-scope history (all accepted tokens, or generated ones only), every
/// token `x` such that `h[len-n+1..] + [x]` already occurs as an n-gram of
/// `h` gets logit `-inf`. Nothing is banned while `len(h) + 1 < n`. `n == 1`
/// bans every token already in the history; `n == 0` is a no-op. Tokens are
/// matched by id, whatever the row's order. The n-grams are indexed as
/// tokens are accepted (by their first `n - 1` tokens), so a step costs
/// one lookup and the banned tokens, not a scan of the history
/// (transformers scans it: O(len(h)·n) per step).
#[derive(Debug, Clone)]
pub struct NoRepeatNgram {
    n: usize,
    scope: HistoryScope,
    history: Vec<TokenId>,
    /// Every n-gram of the history, by its first `n - 1` tokens: the tokens
    /// that followed them, in history order (repeats kept).
    follows: HashMap<Vec<TokenId>, Vec<TokenId>>,
}

impl NoRepeatNgram {
    /// A no-repeat-n-gram stage.
    pub fn new(n: usize, scope: HistoryScope) -> Self {
        Self {
            n,
            scope,
            history: Vec::new(),
            follows: HashMap::new(),
        }
    }

    /// The tokens banned at the next step (may contain duplicates), in
    /// history order.
    pub fn banned(&self) -> Vec<TokenId> {
        let (n, h) = (self.n, &self.history);
        if n == 0 || h.len() + 1 < n {
            return Vec::new();
        }
        let prefix = &h[h.len() + 1 - n..];
        self.follows.get(prefix).cloned().unwrap_or_default()
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
    fn apply_full_row(
        &mut self,
        logits: &mut [f32],
        _ctx: &StageContext,
    ) -> Option<Result<(), SampleError>> {
        let (n, h) = (self.n, &self.history);
        if n > 0
            && h.len() + 1 >= n
            && let Some(next) = self.follows.get(&h[h.len() + 1 - n..])
        {
            for &t in next {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Some(Ok(()))
    }
    fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        if self.n == 0 || (self.scope == HistoryScope::Output && origin == TokenOrigin::Prompt) {
            return;
        }
        self.history.push(token);
        let h = &self.history;
        if h.len() >= self.n {
            let gram = &h[h.len() - self.n..];
            let (prefix, last) = gram.split_at(self.n - 1);
            match self.follows.get_mut(prefix) {
                Some(next) => next.push(last[0]),
                None => {
                    self.follows.insert(prefix.to_vec(), vec![last[0]]);
                }
            }
        }
    }
    fn reset(&mut self) {
        self.history.clear();
        self.follows.clear();
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index gives what scanning the history gives (transformers' way):
    /// the same banned tokens in the same order, at every step of random
    /// histories, for n = 1..5, with prompt tokens in and out of scope.
    #[test]
    fn the_index_is_the_scan() {
        let scan = |h: &[TokenId], n: usize| -> Vec<TokenId> {
            if n == 0 || h.len() + 1 < n {
                return Vec::new();
            }
            let prefix = &h[h.len() + 1 - n..];
            h.windows(n)
                .filter(|w| &w[..n - 1] == prefix)
                .map(|w| w[n - 1])
                .collect()
        };
        let mut x = 0x00dd_ba11_u32;
        for n in 0..6 {
            for scope in [HistoryScope::PromptAndOutput, HistoryScope::Output] {
                let mut stage = NoRepeatNgram::new(n, scope);
                let mut in_scope = Vec::new();
                for step in 0..400 {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    // A small alphabet, so that n-grams repeat.
                    let token = x % 4;
                    let origin = if step < 30 {
                        TokenOrigin::Prompt
                    } else {
                        TokenOrigin::Output
                    };
                    stage.accept(token, origin);
                    if n > 0 && !(scope == HistoryScope::Output && origin == TokenOrigin::Prompt) {
                        in_scope.push(token);
                    }
                    assert_eq!(stage.banned(), scan(&in_scope, n), "n {n} step {step}");
                    if step == 200 {
                        stage.reset();
                        in_scope.clear();
                    }
                }
            }
        }
    }
}
