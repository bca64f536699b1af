//! A custom stage written by a user of the library: ban words (Hugging
//! Face's `bad_words_ids`), taking part in a [`sampler_backend::SamplingBatch`]
//! through [`sampler_backend::SamplingBatch::insert_chain`].
//!
//! A word is banned as the token sequences it is written with: for each
//! sequence `s`, when the request's tokens (prompt and generated) end with
//! `s[..len - 1]`, the token `s[len - 1]` gets `-inf`; a one-token sequence
//! is banned everywhere. So the sequence never appears in the output (the
//! same word written with other tokens is not caught: that is
//! `bad_words_ids`' rule too). `serve --ban-words dog,cat` runs it.
//!
//! ```
//! use sampler_core::{Chain, StageSpec};
//! use sampler_examples::ban_words::BanWords;
//!
//! // Ban the token sequence [5, 6] and the single token 9.
//! let ban = BanWords::new(vec![vec![5, 6], vec![9]]);
//! let stages: Vec<Box<dyn sampler_core::Sampler>> = vec![
//!     Box::new(ban),
//!     sampler_cpu::build_stage(&StageSpec::Greedy).unwrap(),
//! ];
//! let mut chain = Chain::new(stages, Some(1)).with_kernels(sampler_cpu::ROW_KERNELS);
//! let mut row = vec![0.0f32; 12];
//! row[9] = 3.0; // the best token, banned
//! row[6] = 2.0;
//! assert_eq!(chain.sample_logits(&row), Ok(6));
//! chain.accept(5, sampler_core::TokenOrigin::Output);
//! // After 5, token 6 would complete [5, 6]: the next best wins.
//! assert_eq!(chain.sample_logits(&row), Ok(0));
//! ```

use sampler_core::{Candidates, SampleError, Sampler, StageContext, TokenId, TokenOrigin};

use crate::llama2::Tokenizer;

/// Bans token sequences (see the module docs).
#[derive(Debug, Clone)]
pub struct BanWords {
    seqs: Vec<Vec<TokenId>>,
    /// The last `longest - 1` accepted tokens.
    recent: Vec<TokenId>,
    keep: usize,
}

impl BanWords {
    /// Ban these token sequences (empty ones are ignored).
    pub fn new(seqs: Vec<Vec<TokenId>>) -> Self {
        let seqs: Vec<Vec<TokenId>> = seqs.into_iter().filter(|s| !s.is_empty()).collect();
        let keep = seqs.iter().map(Vec::len).max().unwrap_or(1) - 1;
        Self {
            seqs,
            recent: Vec::with_capacity(keep + 1),
            keep,
        }
    }

    /// Ban `words` as the tokenizer writes them at the start of the text and
    /// after a space (`"dog"` -> the tokens of `"dog"` and of `" dog"`).
    pub fn from_words(tokenizer: &Tokenizer, words: &[&str]) -> Self {
        let mut seqs = Vec::new();
        for w in words.iter().map(|w| w.trim()).filter(|w| !w.is_empty()) {
            // `encode` adds SentencePiece's dummy leading space: this is " w".
            seqs.push(tokenizer.encode(w, false, false));
            // Without the leading space: the tokens of "w" glued to a previous word.
            let plain = tokenizer.encode(&format!("a{w}"), false, false);
            let a = tokenizer.encode("a", false, false);
            if plain.starts_with(&a) && plain.len() > a.len() {
                seqs.push(plain[a.len()..].to_vec());
            }
        }
        seqs.sort();
        seqs.dedup();
        Self::new(seqs)
    }

    /// The banned sequences.
    pub fn sequences(&self) -> &[Vec<TokenId>] {
        &self.seqs
    }

    /// The tokens banned after the current history.
    fn banned_now(&self) -> Vec<TokenId> {
        self.seqs
            .iter()
            .filter(|s| self.recent.ends_with(&s[..s.len() - 1]))
            .map(|s| s[s.len() - 1])
            .collect()
    }
}

impl Sampler for BanWords {
    fn name(&self) -> &str {
        "ban_words"
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        let banned = self.banned_now();
        if banned.is_empty() {
            return Ok(());
        }
        if row.is_full_row() {
            // Token id = position; editing logits keeps the row a full row,
            // so the fast path's kernel for the next stage still runs.
            let logits = row.logits_mut();
            for &t in &banned {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        }
        let hit = row
            .ids()
            .iter()
            .zip(row.logits())
            .any(|(id, &l)| l != f32::NEG_INFINITY && banned.contains(id));
        if !hit {
            return Ok(());
        }
        let raw = row.raw_mut();
        for (id, l) in raw.ids.iter().zip(raw.logits.iter_mut()) {
            if banned.contains(id) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn accept(&mut self, token: TokenId, _origin: TokenOrigin) {
        if self.keep == 0 {
            return;
        }
        if self.recent.len() == self.keep {
            self.recent.remove(0);
        }
        self.recent.push(token);
    }
    fn reset(&mut self) {
        self.recent.clear();
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
