//! `top_k(k)`, then `top_p` / `min_p` cuts, then a `[temperature] -> dist`
//! tail (llama.cpp's default shape, `top_k; top_p; min_p; temperature;
//! dist`), decided without a `Candidates` or the stages one by one.
//!
//! After `top_k` the set is sorted (descending logit, ties by id), and each
//! cut keeps a prefix of it: `top_p` (`stages::top_p`) the shortest prefix
//! whose fixed-point mass reaches `numerics::nucleus_goal(p, W)` and holds
//! `min_keep`, `min_p` (`stages::min_p`) the candidates at or above `max +
//! ln p` (or up to `min_keep`), the first always. Here the same arithmetic
//! on the `k` best, sorted once, gives the prefix's length; the prefix is
//! then taken in id order from the `k` gathered in id order (no second
//! sort) and drawn from by the fused tail (`Scratch::draw_sorted_set_in_id_order`).

use sampler_core::numerics::{exp, fixed_weight, nucleus_goal};
use sampler_core::{Chain, SampleError, Sampler, StageSpec, TokenId};

use super::scan::desc_key;
use super::{Scratch, tail, tail_uniform};

/// One cut after `top_k`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    TopP { p: f32, min_keep: usize },
    MinP { p: f32, min_keep: usize },
}

/// The most cuts recognised between `top_k` and the tail.
const MAX_CUTS: usize = 4;

/// The stages after a `top_k`: up to [`MAX_CUTS`] active `top_p` / `min_p`
/// stages (no-op stages between them skipped), then the tail.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Cuts {
    cuts: [Cut; MAX_CUTS],
    len: usize,
    tail: tail::TempDist,
}

impl Cuts {
    /// No cut: the tail right after the `top_k`.
    pub(super) fn none(tail: tail::TempDist) -> Self {
        Self {
            cuts: [Cut::MinP {
                p: 0.0,
                min_keep: 0,
            }; MAX_CUTS],
            len: 0,
            tail,
        }
    }

    /// Whether there is no cut before the tail.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Recognise `stages[from..]` as [`Cuts`] (none, or up to [`MAX_CUTS`],
/// then a `[temperature] -> dist` tail).
pub(super) fn cuts_tail(stages: &[Box<dyn Sampler>], from: usize) -> Option<Cuts> {
    let mut found = Cuts::none(tail::TempDist {
        t: None,
        dist_at: 0,
    });
    for (i, stage) in stages.iter().enumerate().skip(from) {
        if stage.is_noop() {
            continue;
        }
        let cut = match stage.spec()? {
            StageSpec::TopP { p, min_keep } => Cut::TopP { p, min_keep },
            StageSpec::MinP { p, min_keep } => Cut::MinP { p, min_keep },
            _ => {
                found.tail = tail::temp_dist_tail(stages, i)?;
                return Some(found);
            }
        };
        if found.len == MAX_CUTS {
            return None;
        }
        found.cuts[found.len] = cut;
        found.len += 1;
    }
    None
}

/// The token of `top_k(k)`, `cuts` and their tail on the raw row `logits`.
/// `None`: not decided here (a bad row, every logit `-inf` before a cut:
/// the reference decides, with its errors).
pub(super) fn top_k_cuts_token(
    logits: &[f32],
    k: usize,
    cuts: &Cuts,
    chain: &Chain,
    s: &mut Scratch,
) -> Option<Result<TokenId, SampleError>> {
    s.top_k_in_id_order(logits, k)?;
    if s.ids.is_empty() {
        return None;
    }
    cut_and_draw(s, cuts, chain)
}

/// The token for a `top_k` set given in ascending id in `s.ids` /
/// `s.current` (its logits, as the stages after the `top_k` see them):
/// the cuts' prefix of the set in the stages' order (descending logit, ties
/// by id), sorted once, taken back in id order, then the fused tail
/// (`Scratch::draw_sorted_set_in_id_order`). `None` when a cut would meet
/// a set of `-inf` (`top_p`'s softmax fails there: the reference decides).
pub(super) fn cut_and_draw(
    s: &mut Scratch,
    cuts: &Cuts,
    chain: &Chain,
) -> Option<Result<TokenId, SampleError>> {
    if !cuts.is_empty() {
        s.sort_kept();
        let sorted = &s.sorted_logits;
        // The maximum (the first) is never cut, so it stays what it is
        // through every cut.
        if sorted.first().is_none_or(|&max| max == f32::NEG_INFINITY) {
            return None;
        }
        let mut n = sorted.len();
        for cut in &cuts.cuts[..cuts.len] {
            n = match *cut {
                Cut::TopP { p, min_keep } => top_p_keeps(&sorted[..n], p, min_keep, &mut s.weights),
                Cut::MinP { p, min_keep } => min_p_keeps(&sorted[..n], p, min_keep),
            };
        }
        // The kept prefix, in id order: the set up to its last key.
        let last = s.keyed[n - 1].0;
        let mut kept = 0;
        for i in 0..s.ids.len() {
            let (id, l) = (s.ids[i], s.current[i]);
            if desc_key(l, id) <= last {
                s.ids[kept] = id;
                s.current[kept] = l;
                kept += 1;
            }
        }
        s.ids.truncate(kept);
        s.current.truncate(kept);
    }
    let u = tail_uniform(chain, cuts.tail);
    Some(
        s.draw_sorted_set_in_id_order(cuts.tail.t, u)
            .map(|(token, _, _)| token),
    )
}

/// How many of the sorted logits `l` (`l[0]` finite: the maximum)
/// `stages::TopP` keeps: the fixed-point mass of each, `fixed_weight(exp(l -
/// max))`, summed exactly; the shortest prefix whose running mass reaches
/// `nucleus_goal(p, W)` and holds `min_keep` (capped at the finite ones),
/// else the finite ones; at least one. `p >= 1` keeps all.
/// `weights` is scratch.
fn top_p_keeps(l: &[f32], p: f32, min_keep: usize, weights: &mut Vec<u32>) -> usize {
    let n = l.len();
    if p >= 1.0 || n == 0 {
        return n;
    }
    let finite = l.iter().filter(|x| x.is_finite()).count();
    let min_keep = min_keep.min(finite);
    let max = l[0];
    // The weights in a loop of their own (it vectorises), then the sums.
    weights.clear();
    weights.resize(n, 0);
    for (w, &x) in weights.iter_mut().zip(l) {
        *w = fixed_weight(exp(x - max));
    }
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    let goal = nucleus_goal(p, total);
    let mut cum = 0u64;
    let mut keep = finite;
    for (i, &w) in weights.iter().enumerate() {
        cum += u64::from(w);
        if cum >= goal && i + 1 >= min_keep {
            keep = i + 1;
            break;
        }
    }
    if keep < n { keep.max(1) } else { n }
}

/// How many of the sorted logits `l` `stages::MinP` keeps: the first, then
/// each while it is `>= max + ln p` or fewer than `min_keep` (capped at the
/// leading finite ones) are kept. `p <= 0` (or NaN) keeps all.
fn min_p_keeps(l: &[f32], p: f32, min_keep: usize) -> usize {
    if p.is_nan() || p <= 0.0 || l.is_empty() {
        return l.len();
    }
    let min_logit = l[0] + p.ln();
    let finite = l.iter().take_while(|x| x.is_finite()).count();
    let min_keep = min_keep.min(finite);
    let mut keep = 1;
    while keep < l.len() && (l[keep] >= min_logit || keep < min_keep) {
        keep += 1;
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_core::{Candidates, Sampler, StageContext};

    fn ctx() -> StageContext {
        StageContext {
            rng: sampler_core::RowRng {
                seed: 1,
                step: 0,
                stage_index: 0,
            },
        }
    }

    /// Both counts are the stages' own on sorted sets: ties, `-inf` tails,
    /// `min_keep` beyond the finite ones, `p` at 0, 1 and between.
    #[test]
    fn the_counts_are_the_stages() {
        let mut x = 0x5151_7a7au32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for n in [1usize, 2, 3, 17, 40, 100] {
            for shape in 0..4 {
                let mut row: Vec<f32> = (0..n)
                    .map(|i| match shape {
                        0 => -((next() % 4000) as f32) / 400.0,
                        1 => -((next() % 4) as f32),
                        2 if i > n / 2 => f32::NEG_INFINITY,
                        _ => -((next() % 3000) as f32) / 100.0,
                    })
                    .collect();
                row[0] = 0.5;
                let ids: Vec<TokenId> = (0..n as TokenId).map(|i| 3 * i + 1).collect();
                let mut sorted = Candidates::from_parts(ids, row, 3 * n + 1).unwrap();
                sorted.sort_desc();
                let l = sorted.logits().to_vec();
                for p in [0.0f32, 0.05, 0.3, 0.9, 0.95, 0.999_999_94, 1.0, 2.0] {
                    for min_keep in [0usize, 1, 5, 60, 1000] {
                        let mut want = sorted.clone();
                        crate::stages::TopP::new(p, min_keep)
                            .apply(&mut want, &ctx())
                            .unwrap();
                        assert_eq!(
                            top_p_keeps(&l, p, min_keep, &mut Vec::new()),
                            want.len(),
                            "top_p {p} {min_keep}"
                        );
                        let mut want = sorted.clone();
                        crate::stages::MinP::new(p, min_keep)
                            .apply(&mut want, &ctx())
                            .unwrap();
                        assert_eq!(
                            min_p_keeps(&l, p, min_keep),
                            want.len(),
                            "min_p {p} {min_keep}"
                        );
                    }
                }
            }
        }
    }
}
