//! An n-gram (prompt lookup) drafter for speculative decoding: the draft is
//! what followed the earliest earlier occurrence of the context's longest
//! suffix n-gram (vLLM's n-gram proposer rule: `n` in `[min, max]`, up to
//! `k` tokens). Linear in the context: a prefix-function (KMP) pass over the
//! reversed context, capped at `max`.

use sampler_core::TokenId;

/// The drafter's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramDrafter {
    /// Shortest suffix n-gram that may match (`>= 1`).
    pub min: usize,
    /// Longest suffix n-gram looked for (`>= min`).
    pub max: usize,
    /// Most tokens proposed per step (`>= 1`).
    pub k: usize,
}

impl NgramDrafter {
    /// A drafter, its settings checked.
    ///
    /// # Errors
    /// A message naming the setting when `min` is 0, `max < min` or `k` is
    /// 0 or above `sampler_cpu::speculative::MAX_DRAFT_TOKENS`.
    pub fn new(min: usize, max: usize, k: usize) -> Result<Self, String> {
        let limit = sampler_cpu::speculative::MAX_DRAFT_TOKENS;
        if min == 0 {
            return Err("ngram min must be at least 1".into());
        }
        if max < min {
            return Err(format!(
                "ngram max ({max}) must be at least ngram min ({min})"
            ));
        }
        if k == 0 || k > limit {
            return Err(format!("draft k ({k}) must be in [1, {limit}]"));
        }
        Ok(Self { min, max, k })
    }

    /// The draft for `context` (prompt and generated tokens so far): up to
    /// `k` tokens, empty when no suffix of at least `min` tokens occurred
    /// before.
    pub fn propose(&self, context: &[TokenId]) -> Vec<TokenId> {
        let n = context.len();
        if n < 2 {
            return Vec::new();
        }
        // `r(i)`: the context read backwards, so that a suffix of the
        // context is a prefix of `r` and its matches are found by the prefix
        // function of `r`.
        let r = |i: usize| context[n - 1 - i];
        let mut fail = vec![0usize; self.max.min(n)];
        let (mut best, mut best_end, mut m) = (0usize, 0usize, 0usize);
        let mut i = 1;
        while i < n {
            if r(m) == r(i) {
                m += 1;
                // `>=`: a later end in `r` is an earlier occurrence.
                if m >= best {
                    best = m;
                    best_end = i;
                }
                if i < fail.len() {
                    fail[i] = m;
                }
                if m == self.max {
                    m = fail[m - 1];
                }
                i += 1;
            } else if m > 0 {
                m = fail[m - 1];
            } else {
                i += 1;
            }
        }
        if best < self.min {
            return Vec::new();
        }
        // The occurrence ends at position `n - 1 - best_end + best - 1` of
        // the context; the draft is what follows it.
        let start = n - 1 - best_end + best;
        let len = self.k.min(n - start);
        context[start..start + len].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The straightforward rule, for comparison: for `n` from `max` down to
    /// `min`, the earliest earlier occurrence of the last `n` tokens.
    fn by_search(d: &NgramDrafter, c: &[TokenId]) -> Vec<TokenId> {
        let len = c.len();
        for n in (d.min..=d.max.min(len.saturating_sub(1))).rev() {
            let suffix = &c[len - n..];
            if let Some(at) = (0..len - n).find(|&s| &c[s..s + n] == suffix) {
                let start = at + n;
                return c[start..(start + d.k).min(len)].to_vec();
            }
        }
        Vec::new()
    }

    #[test]
    fn the_documented_example() {
        let d = NgramDrafter::new(2, 3, 4).unwrap();
        assert_eq!(d.propose(&[1, 2, 3, 4, 2, 3]), [4, 2, 3]);
        assert_eq!(d.propose(&[1, 2, 3, 4, 5]), Vec::<TokenId>::new());
        assert_eq!(d.propose(&[7]), Vec::<TokenId>::new());
        let d1 = NgramDrafter::new(1, 1, 2).unwrap();
        assert_eq!(d1.propose(&[5, 6, 7, 5]), [6, 7]);
    }

    #[test]
    fn equals_the_straightforward_search() {
        // A small alphabet makes repeats (and overlapping ones) common.
        let mut x = 12345u64;
        for case in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (x >> 33) as usize % 40;
            let alphabet = 2 + (x >> 20) as u32 % 4;
            let c: Vec<TokenId> = (0..len)
                .map(|i| {
                    ((x >> (i % 50)) as u32 ^ (i as u32).wrapping_mul(2_654_435_761)) % alphabet
                })
                .collect();
            let min = 1 + case % 3;
            let d = NgramDrafter::new(min, min + case % 4, 1 + case % 5).unwrap();
            assert_eq!(d.propose(&c), by_search(&d, &c), "{d:?} {c:?}");
        }
    }

    #[test]
    fn bad_settings_are_named() {
        assert!(NgramDrafter::new(0, 3, 4).unwrap_err().contains("min"));
        assert!(NgramDrafter::new(3, 2, 4).unwrap_err().contains("max"));
        assert!(NgramDrafter::new(1, 2, 0).unwrap_err().contains("draft k"));
        assert!(NgramDrafter::new(1, 2, 65).unwrap_err().contains("[1, 64]"));
    }
}
