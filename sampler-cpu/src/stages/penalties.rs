//! `penalties`: repetition, frequency and presence penalties.

use std::collections::{HashMap, VecDeque};

use sampler_core::{
    Candidates, HistoryScope, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin,
};

use crate::util::{for_each_token_position, saturate};

/// Repetition (CTRL, Keskar et al. 2019), frequency and presence (OpenAI)
/// penalties with llama.cpp semantics, over the last `last_n` tokens of the
/// in-scope history ([`HistoryScope::PromptAndOutput`]: every accepted token;
/// [`HistoryScope::Output`]: generated tokens only).
///
/// For every candidate whose token occurs `c > 0` times in the window:
/// the logit is multiplied by `repeat` if it is `<= 0`, divided by `repeat`
/// otherwise (once per distinct token), then `c·frequency + presence` is
/// subtracted. Tokens are matched by id, whatever the row's order.
/// `last_n == 0` (or `repeat == 1` with zero frequency and presence) is a no-op.
#[derive(Debug, Clone)]
pub struct Penalties {
    last_n: usize,
    repeat: f32,
    frequency: f32,
    presence: f32,
    scope: HistoryScope,
    window: VecDeque<TokenId>,
    counts: HashMap<TokenId, u32>,
}

impl Penalties {
    /// A penalties stage.
    pub fn new(
        last_n: usize,
        repeat: f32,
        frequency: f32,
        presence: f32,
        scope: HistoryScope,
    ) -> Self {
        Self {
            last_n,
            repeat,
            frequency,
            presence,
            scope,
            window: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// The logit `orig` of a token that occurs `c >= 1` times in the window,
    /// penalised: `-inf` stays `-inf`; otherwise multiplied by `repeat` if
    /// `<= 0`, else divided by it, then `c·frequency + presence` subtracted;
    /// a finite logit saturates at `±f32::MAX` instead of overflowing.
    pub fn penalised(&self, orig: f32, c: u32) -> f32 {
        if orig == f32::NEG_INFINITY {
            // Banned stays banned (`-inf - -inf` would be NaN).
            return orig;
        }
        let l = if orig <= 0.0 {
            orig * self.repeat
        } else {
            orig / self.repeat
        };
        let l = l - (c as f32 * self.frequency + self.presence);
        saturate(l, orig)
    }

    /// Occurrences of `token` in the current window.
    pub fn count(&self, token: TokenId) -> u32 {
        self.counts.get(&token).copied().unwrap_or(0)
    }
}

impl Sampler for Penalties {
    fn name(&self) -> &str {
        "penalties"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Penalties {
            last_n: self.last_n,
            repeat: self.repeat,
            frequency: self.frequency,
            presence: self.presence,
            scope: self.scope,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.last_n == 0 || self.counts.is_empty() || row.is_empty() {
            return Ok(());
        }
        let tokens: Vec<TokenId> = self.counts.keys().copied().collect();
        let mut edits: Vec<(usize, u32)> = Vec::with_capacity(tokens.len());
        for_each_token_position(row, &tokens, |pos, k| {
            edits.push((pos, self.count(tokens[k])));
        });
        if edits.is_empty() {
            return Ok(());
        }
        let logits = row.logits_mut();
        for (pos, c) in edits {
            logits[pos] = self.penalised(logits[pos], c);
        }
        Ok(())
    }
    fn apply_full_row(
        &mut self,
        logits: &mut [f32],
        _ctx: &StageContext,
    ) -> Option<Result<(), SampleError>> {
        if self.last_n > 0 {
            for (&t, &c) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = self.penalised(*l, c);
                }
            }
        }
        Some(Ok(()))
    }
    fn history_counts(&self, out: &mut Vec<(TokenId, u32)>) -> bool {
        out.extend(self.counts.iter().map(|(&t, &c)| (t, c)));
        true
    }
    fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        if self.last_n == 0 || (self.scope == HistoryScope::Output && origin == TokenOrigin::Prompt)
        {
            return;
        }
        self.window.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
        while self.window.len() > self.last_n {
            if let Some(old) = self.window.pop_front()
                && let Some(c) = self.counts.get_mut(&old)
            {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&old);
                }
            }
        }
    }
    fn reset(&mut self) {
        self.window.clear();
        self.counts.clear();
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
