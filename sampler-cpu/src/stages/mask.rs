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

/// `-inf` at every position of a full row whose bit is clear: word by word,
/// a select per logit (no branch per bit, so it vectorises; on x86-64 the
/// AVX-512F or AVX2 copy of the same code, chosen at run time), words with
/// every bit set skipped. `words` covers the row (`ceil(len / 32)`).
pub(crate) fn mask_full_row(logits: &mut [f32], words: &[u32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { mask_full_row_avx512(logits, words) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { mask_full_row_avx2(logits, words) };
        }
    }
    mask_full_row_body(logits, words);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn mask_full_row_avx512(logits: &mut [f32], words: &[u32]) {
    mask_full_row_body(logits, words);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn mask_full_row_avx2(logits: &mut [f32], words: &[u32]) {
    mask_full_row_body(logits, words);
}

#[inline(always)]
fn mask_full_row_body(logits: &mut [f32], words: &[u32]) {
    let full = logits.len() / 32;
    let mut chunks = logits.chunks_exact_mut(32);
    for (&w, chunk) in words.iter().zip(&mut chunks) {
        if w == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            *l = if w >> b & 1 == 0 { f32::NEG_INFINITY } else { *l };
        }
    }
    let rest = chunks.into_remainder();
    if let Some(&w) = words.get(full) {
        for (b, l) in rest.iter_mut().enumerate() {
            if w >> b & 1 == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
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
            mask_full_row(row.logits_mut(), words);
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
    fn apply_full_row(
        &mut self,
        logits: &mut [f32],
        _ctx: &StageContext,
    ) -> Option<Result<(), SampleError>> {
        let Some(words) = &self.words else {
            return Some(Ok(()));
        };
        let expected = logits.len().div_ceil(32);
        if words.len() != expected {
            return Some(Err(SampleError::TokenMaskLength {
                found: words.len(),
                expected,
            }));
        }
        mask_full_row(logits, words);
        Some(Ok(()))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The full-row mask bans exactly the clear bits, on every level, rows
    /// that end inside a word included.
    #[test]
    fn the_full_row_mask_is_the_bit_rule() {
        let mut x = 0x7f4a_7c15u32;
        for len in [1usize, 31, 32, 33, 100, 1000] {
            let words: Vec<u32> = (0..len.div_ceil(32))
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if i % 3 == 0 { u32::MAX } else { x }
                })
                .collect();
            let row: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 7.0).collect();
            let want: Vec<f32> = row
                .iter()
                .enumerate()
                .map(|(i, &l)| if allowed(&words, i) { l } else { f32::NEG_INFINITY })
                .collect();
            type Level = fn(&mut [f32], &[u32]);
            let mut levels: Vec<Level> = vec![mask_full_row_body, mask_full_row];
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    levels.push(|l, w| unsafe { mask_full_row_avx2(l, w) });
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    levels.push(|l, w| unsafe { mask_full_row_avx512(l, w) });
                }
            }
            for f in levels {
                let mut got = row.clone();
                f(&mut got, &words);
                assert_eq!(got, want, "len {len}");
            }
        }
    }
}
