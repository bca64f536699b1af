//! `penalties`: repetition, frequency and presence penalties.

use std::collections::VecDeque;

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
    /// `(token, occurrences)` of each distinct token in the window, in
    /// ascending token order (the CPU fast path reads it as it is).
    counts: Vec<(TokenId, u32)>,
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
            counts: Vec::new(),
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
        match self.counts.binary_search_by_key(&token, |&(t, _)| t) {
            Ok(i) => self.counts[i].1,
            Err(_) => 0,
        }
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
        let tokens: Vec<TokenId> = self.counts.iter().map(|&(t, _)| t).collect();
        let mut edits: Vec<(usize, u32)> = Vec::with_capacity(tokens.len());
        for_each_token_position(row, &tokens, |pos, k| {
            edits.push((pos, self.counts[k].1));
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
            for &(t, c) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = self.penalised(*l, c);
                }
            }
        }
        Some(Ok(()))
    }
    fn history_counts(&self, out: &mut Vec<(TokenId, u32)>) -> bool {
        out.extend_from_slice(&self.counts);
        true
    }
    fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        if self.last_n == 0 || (self.scope == HistoryScope::Output && origin == TokenOrigin::Prompt)
        {
            return;
        }
        self.window.push_back(token);
        match self.counts.binary_search_by_key(&token, |&(t, _)| t) {
            Ok(i) => self.counts[i].1 += 1,
            Err(i) => self.counts.insert(i, (token, 1)),
        }
        while self.window.len() > self.last_n {
            if let Some(old) = self.window.pop_front()
                && let Ok(i) = self.counts.binary_search_by_key(&old, |&(t, _)| t)
            {
                self.counts[i].1 -= 1;
                if self.counts[i].1 == 0 {
                    self.counts.remove(i);
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
