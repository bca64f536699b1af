//! `dry`: "don't repeat yourself" n-gram penalty.

use std::collections::{HashMap, VecDeque};

use sampler_core::{
    Candidates, HistoryScope, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin,
};

use crate::util::{for_each_token_position, saturate};

/// DRY (p-e-w, oobabooga text-generation-webui #5677) with llama.cpp
/// semantics, over the last `last_n` tokens of the in-scope history.
///
/// If the context ends with a sequence that already occurred earlier, the
/// token that followed the earlier occurrence would extend the repeat; it is
/// penalised by `multiplier · base^(len − allowed_length)` where `len` is the
/// longest such match (only when `len >= allowed_length`; the exponent is
/// clamped so the penalty stays finite). Matches never reach back past the
/// most recent sequence breaker: a breaker is given as token ids
/// `[head, tail...]`; a single-token breaker is never penalised itself.
/// Nothing happens while the window holds `<= allowed_length` tokens.
/// `multiplier == 0` or `last_n == 0` is a no-op. Matching uses the Z
/// algorithm: O(last_n) per step.
#[derive(Debug, Clone)]
pub struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: usize,
    last_n: usize,
    seq_breakers: Vec<Vec<TokenId>>,
    scope: HistoryScope,
    /// head token -> tails of the breakers starting with it.
    breakers: HashMap<TokenId, Vec<Vec<TokenId>>>,
    window: VecDeque<TokenId>,
}

impl Dry {
    /// A DRY stage.
    pub fn new(
        multiplier: f32,
        base: f32,
        allowed_length: usize,
        last_n: usize,
        seq_breakers: Vec<Vec<TokenId>>,
        scope: HistoryScope,
    ) -> Self {
        let mut breakers: HashMap<TokenId, Vec<Vec<TokenId>>> = HashMap::new();
        for b in &seq_breakers {
            if let Some((&head, tail)) = b.split_first() {
                breakers.entry(head).or_default().push(tail.to_vec());
            }
        }
        Self {
            multiplier,
            base,
            allowed_length,
            last_n,
            seq_breakers,
            scope,
            breakers,
            window: VecDeque::new(),
        }
    }

    fn is_single_token_breaker(&self, token: TokenId) -> bool {
        self.breakers
            .get(&token)
            .is_some_and(|tails| tails.iter().any(|t| t.is_empty()))
    }

    /// Penalty exponents per token: `token -> longest repeat length`.
    fn repeats(&self) -> HashMap<TokenId, usize> {
        let mut out = HashMap::new();
        let n = self.window.len().min(self.last_n);
        if n <= self.allowed_length {
            return out;
        }
        // rev[j] = j-th most recent token.
        let rev: Vec<TokenId> = self.window.iter().rev().take(n).copied().collect();
        // Most recent breaker: matches may not reach back past it.
        let mut rep_limit = n;
        for i in 0..n {
            let Some(tails) = self.breakers.get(&rev[i]) else {
                continue;
            };
            let mut longest: Option<usize> = None;
            for tail in tails {
                let len = tail.len();
                if len > i || longest.is_some_and(|l| len <= l) {
                    continue;
                }
                // The tail follows the head in time: rev[i-1], rev[i-2], ...
                if tail.iter().enumerate().all(|(o, &t)| rev[i - o - 1] == t) {
                    longest = Some(len);
                }
            }
            if let Some(len) = longest {
                rep_limit = i - len;
                break;
            }
        }
        if rep_limit < self.allowed_length {
            return out;
        }
        // Z function of rev: z[k] = longest common prefix of rev and rev[k..],
        // i.e. how far the sequence ending k tokens ago matches the context end.
        let mut z = vec![0usize; n];
        let (mut l, mut r) = (0usize, 0usize);
        for k in 1..n {
            let mut len = if k < r { (r - k).min(z[k - l]) } else { 0 };
            while k + len < n && rev[len] == rev[k + len] {
                len += 1;
            }
            z[k] = len;
            if k + len > r {
                l = k;
                r = k + len;
            }
        }
        for (k, &zk) in z.iter().enumerate().skip(1) {
            let len = zk.min(rep_limit);
            if len >= self.allowed_length {
                // The token that followed that earlier occurrence.
                let next = rev[k - 1];
                let e = out.entry(next).or_insert(0);
                if *e < len {
                    *e = len;
                }
            }
        }
        out
    }
}

impl Sampler for Dry {
    fn name(&self) -> &str {
        "dry"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Dry {
            multiplier: self.multiplier,
            base: self.base,
            allowed_length: self.allowed_length,
            last_n: self.last_n,
            seq_breakers: self.seq_breakers.clone(),
            scope: self.scope,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.multiplier == 0.0 || self.last_n == 0 || row.is_empty() {
            return Ok(());
        }
        let repeats = self.repeats();
        if repeats.is_empty() {
            return Ok(());
        }
        let max_exponent = if self.base > 1.000_001 {
            (88.722_84_f32 / self.base.ln()) as usize
        } else {
            0
        };
        let tokens: Vec<TokenId> = repeats
            .keys()
            .copied()
            .filter(|&t| !self.is_single_token_breaker(t))
            .collect();
        let mut edits = Vec::with_capacity(tokens.len());
        for_each_token_position(row, &tokens, |pos, k| {
            let len = repeats.get(&tokens[k]).copied().unwrap_or(0);
            let mut exp = len - self.allowed_length;
            if max_exponent > 0 && exp > max_exponent {
                exp = max_exponent;
            }
            let exp = i32::try_from(exp).unwrap_or(i32::MAX);
            edits.push((pos, self.multiplier * self.base.powi(exp)));
        });
        if edits.is_empty() {
            return Ok(());
        }
        let logits = row.logits_mut();
        for (pos, penalty) in edits {
            let orig = logits[pos];
            logits[pos] = saturate(orig - penalty, orig);
        }
        Ok(())
    }
    fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        if self.last_n == 0 || (self.scope == HistoryScope::Output && origin == TokenOrigin::Prompt)
        {
            return;
        }
        self.window.push_back(token);
        while self.window.len() > self.last_n {
            self.window.pop_front();
        }
    }
    fn reset(&mut self) {
        self.window.clear();
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
