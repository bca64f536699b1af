//! `typical`: locally typical sampling.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

use crate::fast::scan::desc_key;

/// Locally typical sampling (Meister et al. 2022), llama.cpp's rule with
/// an order-free entropy:
///
/// * softmax over the set as it comes (the project's `exp`, `e_i = exp(l_i
///   − max)`, `S` their f64 lane sum, `p_i = (e_i / S) as f32`);
/// * surprise `−ln p_i` taken as `ln S − (l_i − max)` (in f64: the same
///   value without a logarithm per candidate), entropy
///   `H = ln S − Σ e_i (l_i − max) / S` (over `e_i > 0`, the f64 lane sum),
///   score `|surprise_i − H|`;
/// * candidates ordered by ascending score, ties in the canonical order
///   (higher logit, then lower id); the shortest prefix whose f32 running
///   sum of `p` is strictly `> p` and that holds at least `min_keep`
///   candidates is kept, in score order, probabilities not renormalised.
///
/// `p >= 1` is a no-op. The whole set is never sorted: the kept prefix is
/// found by selection on its mass (O(n) expected) and only it is sorted.
///
/// # Errors
/// [`SampleError::AllMasked`] when every candidate is `-inf`.
#[derive(Debug, Clone, Copy)]
pub struct Typical {
    p: f32,
    min_keep: usize,
}

impl Typical {
    /// A typical stage; `p >= 1` disables it.
    pub fn new(p: f32, min_keep: usize) -> Self {
        Self { p, min_keep }
    }
}

impl Sampler for Typical {
    fn name(&self) -> &str {
        "typical"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Typical {
            p: self.p,
            min_keep: self.min_keep,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.p >= 1.0 || row.is_empty() {
            return Ok(());
        }
        row.softmax()?;
        let order = typical_order(row, self.p, self.min_keep);
        row.permute(&order);
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}

/// The kept positions of a softmaxed set, in score order (see [`Typical`]).
fn typical_order(row: &Candidates, p: f32, min_keep: usize) -> Vec<usize> {
    let (ids, logits) = (row.ids(), row.logits());
    let probs = row.probs().unwrap_or(&[]);
    let n = logits.len();
    let max = row.max_logit();
    let (sum, entropy) = crate::util::log_norm_entropy(logits, max);
    let ln_sum = sum.ln();
    // One key per candidate, ordered as the rule orders them: the score
    // (non-negative, so its bits order it), then the canonical order
    // (`desc_key`: higher logit, then lower id), then the position.
    let mut keys: Vec<(u64, u64, u32)> = logits
        .iter()
        .zip(ids)
        .enumerate()
        .map(|(i, (&l, &id))| {
            let score = (ln_sum - f64::from(l - max) - entropy).abs();
            (score.to_bits(), desc_key(l, id), i as u32)
        })
        .collect();
    let prob = |k: &(u64, u64, u32)| probs[k.2 as usize];
    // A prefix (in score order) whose f64 mass exceeds `p` by a margin far
    // beyond the f32 running sum's rounding, found by selection; only it is
    // sorted and walked. Should the walk still not pass `p` in it, the
    // margin grows, up to the whole set.
    let mut keep = n;
    for margin in [1e-4, 1e-2, f64::INFINITY] {
        let bound = if margin.is_finite() {
            mass_prefix(&mut keys, &prob, f64::from(p) + margin).max(min_keep)
        } else {
            n
        };
        let bound = bound.min(n);
        if bound < n {
            keys.select_nth_unstable(bound - 1);
        }
        keys[..bound].sort_unstable();
        let mut cum = 0.0f32;
        let walked = keys[..bound].iter().enumerate().find(|&(i, k)| {
            cum += prob(k);
            cum > p && (min_keep == 0 || i + 1 >= min_keep)
        });
        if let Some((i, _)) = walked {
            keep = i + 1;
            break;
        }
        if bound == n {
            break;
        }
    }
    keys[..keep].iter().map(|k| k.2 as usize).collect()
}

/// A count `c` such that the `c` first keys in their order hold an f64
/// mass above `target` (or `keys.len()`), at most 32 more than the least
/// such count; `keys` is left with those `c` keys first (in any order).
/// Median splits, O(n) expected.
fn mass_prefix<K: Ord>(keys: &mut [K], prob: &impl Fn(&K) -> f32, target: f64) -> usize {
    let (mut lo, mut hi) = (0, keys.len());
    let mut before = 0.0f64;
    while hi - lo > 32 {
        let mid = (hi - lo) / 2;
        keys[lo..hi].select_nth_unstable(mid);
        let left: f64 = keys[lo..lo + mid].iter().map(|k| f64::from(prob(k))).sum();
        if before + left > target {
            hi = lo + mid;
        } else {
            before += left;
            lo += mid;
        }
    }
    hi
}
