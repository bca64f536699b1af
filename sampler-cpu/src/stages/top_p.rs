//! `top_p` (nucleus): keep the smallest head whose probability mass reaches `p`.

use sampler_core::numerics::{exp, fixed_weight, nucleus_goal};
use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec, desc_cmp};

/// Nucleus sampling (Holtzman et al. 2019), llama.cpp's top-p on the
/// CURRENT candidates (so it works on the renormalised distribution of
/// whatever survived earlier stages): in canonical order (descending logit,
/// ties by ascending id) keep the shortest prefix whose mass reaches `p`
/// (the crossing token is kept) and that holds at least `min_keep`
/// candidates. The mass is the project's one rule on every device, in fixed
/// point: each candidate weighs `fixed_weight(exp(l - max))` (units of
/// `2^-31` of the maximum's weight), summed exactly as integers, and a
/// candidate is kept while the mass before it is below
/// `numerics::nucleus_goal(p, total)`. `p = 0` keeps exactly one (unless
/// `min_keep > 1`); `p >= 1` is a no-op (no sort, no softmax).
///
/// Output: sorted, probabilities present (the softmax's, not renormalised
/// after the cut).
/// Cost: a selection of the top 256 first, widened only while the mass is
/// not reached, so a peaked row never pays a full sort.
///
/// # Errors
/// [`SampleError::AllMasked`] when every candidate is `-inf`.
#[derive(Debug, Clone, Copy)]
pub struct TopP {
    p: f32,
    min_keep: usize,
}

impl TopP {
    /// A top-p stage; `p >= 1` disables it.
    pub fn new(p: f32, min_keep: usize) -> Self {
        Self { p, min_keep }
    }
}

/// Length of the kept prefix, given the candidates' fixed-point weights in
/// canonical order (descending logit, ties by ascending id) and the goal
/// (`numerics::nucleus_goal`): a candidate is kept while the mass before it
/// is `< goal`, so the prefix ends at the first candidate whose running sum
/// reaches the goal (and holds `min_keep`); `None` when that lies beyond
/// the given prefix.
fn cut(w: impl Iterator<Item = u32>, goal: u64, min_keep: usize) -> Option<usize> {
    let mut cum = 0u64;
    for (i, wi) in w.enumerate() {
        cum += u64::from(wi);
        if cum >= goal && i + 1 >= min_keep {
            return Some(i + 1);
        }
    }
    None
}

impl Sampler for TopP {
    fn name(&self) -> &str {
        "top_p"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::TopP {
            p: self.p,
            min_keep: self.min_keep,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.p >= 1.0 || row.is_empty() {
            return Ok(());
        }
        row.softmax()?;
        let n = row.len();
        // `min_keep` counts drawable candidates: a `-inf` (banned) one is
        // never kept for it, and when the mass is not reached (rounding) the
        // finite candidates are kept (the device masks, the host drops alike).
        let finite = row.logits().iter().filter(|l| l.is_finite()).count();
        let min_keep = self.min_keep.min(finite);
        let max = row.max_logit();
        let w: Vec<u32> = row
            .logits()
            .iter()
            .map(|&l| fixed_weight(exp(l - max)))
            .collect();
        let total: u64 = w.iter().map(|&x| u64::from(x)).sum();
        let goal = nucleus_goal(self.p, total);
        if row.is_sorted() {
            let keep = cut(w.iter().copied(), goal, min_keep).unwrap_or(finite);
            if keep < n {
                row.truncate(keep.max(1));
            }
            return Ok(());
        }
        let (ids, logits) = (row.ids(), row.logits());
        let cmp = |&a: &usize, &b: &usize| desc_cmp(logits[a], ids[a], logits[b], ids[b]);
        let mut order: Vec<usize> = (0..n).collect();
        let mut k = 256usize.max(min_keep);
        let mut keep = None;
        while k < n {
            order.select_nth_unstable_by(k - 1, cmp);
            order[..k].sort_unstable_by(cmp);
            if let Some(c) = cut(order[..k].iter().map(|&i| w[i]), goal, min_keep) {
                keep = Some(c);
                break;
            }
            k = k.saturating_mul(4);
        }
        if keep.is_none() {
            order.sort_unstable_by(cmp);
            keep = Some(cut(order.iter().map(|&i| w[i]), goal, min_keep).unwrap_or(finite));
        }
        let keep = keep.unwrap_or(n).max(1);
        order.truncate(keep);
        row.permute(&order);
        row.set_sorted(true);
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(row: &[f32], p: f32, min_keep: usize) -> usize {
        let mut c = Candidates::from_logits(row);
        let ctx = StageContext {
            rng: sampler_core::RowRng {
                seed: 1,
                step: 0,
                stage_index: 0,
            },
        };
        TopP::new(p, min_keep).apply(&mut c, &ctx).unwrap();
        c.len()
    }

    /// The fixed-point rule: a tail whose weights round to 0 (below `2^-32`
    /// of the maximum's) carries no mass, however many tokens it holds; one
    /// just above it counts, and `p` within rounding of 1 then keeps it down
    /// to its last `(1 - p)` of mass; `min_keep` still keeps zero weights.
    #[test]
    fn weights_below_two_to_the_minus_32_carry_no_mass() {
        let row = |tail: f32| -> Vec<f32> {
            std::iter::once(0.0)
                .chain((0..10_000).map(|i| tail - (i % 7) as f32 * 1e-3))
                .collect()
        };
        let p = 0.999_999_94;
        assert_eq!(kept(&row(-23.0), p, 0), 1);
        assert_eq!(kept(&row(-23.0), p, 40), 40);
        // exp(-21) · 2^31 ≈ 1.6: each tail token weighs 2 units, the tail
        // 20000 of them against (1 - p)·W ≈ 128 (ties broken by id).
        let n = kept(&row(-21.0), p, 0);
        assert!(n > 9_900 && n < 10_001, "{n} kept");
        // p = 0 keeps one, a p below the maximum's share keeps one.
        assert_eq!(kept(&row(-21.0), 0.0, 0), 1);
        // Masses before: 0, 0.42, 0.84 of W.
        assert_eq!(kept(&[0.0, 0.0, -1.0], 0.3, 0), 1);
        assert_eq!(kept(&[0.0, 0.0, -1.0], 0.5, 0), 2);
        assert_eq!(kept(&[0.0, 0.0, -1.0], 0.9, 0), 3);
    }
}
