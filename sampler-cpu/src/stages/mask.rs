//! `mask`: allow only the tokens of a per-step bitmask.

use std::sync::Arc;

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Sets the logit of every candidate the bitmask does not allow to `-inf`
/// (the bitmask format of llguidance and XGrammar: `ceil(vocab / 32)` `u32`
/// words, token `id` allowed when bit `id % 32` of word `id / 32` is set).
/// The mask is given between steps with [`Sampler::set_token_mask`] and
/// stays until replaced; without one every token is allowed. When nothing
/// the mask allows is left, the selecting stage reports
/// [`SampleError::AllMasked`].
///
/// # Errors
/// [`SampleError::TokenMaskLength`] when the mask's length is not
/// `ceil(vocab / 32)` words.
#[derive(Debug, Clone, Default)]
pub struct Mask {
    words: Option<Arc<[u32]>>,
}

impl Mask {
    /// A mask stage that allows every token until a mask is set.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Whether bit `id` of `words` is set (ids past the words are not allowed).
#[inline]
pub fn allowed(words: &[u32], id: usize) -> bool {
    words.get(id / 32).is_some_and(|w| w >> (id % 32) & 1 == 1)
}

impl Sampler for Mask {
    fn name(&self) -> &str {
        "mask"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Mask)
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        let Some(words) = &self.words else {
            return Ok(());
        };
        let expected = row.vocab_size().div_ceil(32);
        if words.len() != expected {
            return Err(SampleError::TokenMaskLength {
                found: words.len(),
                expected,
            });
        }
        if row.is_full_row() {
            // Token id = position: word by word, keeping the row a full row
            // (the fast path's next kernel then runs on it).
            let logits = row.logits_mut();
            for (&w, chunk) in words.iter().zip(logits.chunks_mut(32)) {
                if w == u32::MAX {
                    continue;
                }
                for (b, l) in chunk.iter_mut().enumerate() {
                    if w >> b & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            return Ok(());
        }
        let banned = row
            .ids()
            .iter()
            .zip(row.logits())
            .any(|(&id, &l)| l != f32::NEG_INFINITY && !allowed(words, id as usize));
        if !banned {
            return Ok(());
        }
        let raw = row.raw_mut();
        for (&id, l) in raw.ids.iter().zip(raw.logits.iter_mut()) {
            if !allowed(words, id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn set_token_mask(&mut self, mask: Option<Arc<[u32]>>) {
        self.words = mask;
    }
    fn token_mask(&self) -> Option<&[u32]> {
        self.words.as_deref()
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
