//! `top_p` (nucleus): keep the smallest head whose probability mass reaches `p`.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec, desc_cmp};

/// Nucleus sampling (Holtzman et al. 2019) with llama.cpp top-p semantics:
/// softmax over the CURRENT candidates (so it works on the renormalised
/// distribution of whatever survived earlier stages), candidates in
/// descending logit order (ties by ascending id), keep the shortest prefix
/// whose cumulative mass reaches `p` (an f64 running sum of the f32
/// `exp(l - max)` against `p · Σ`; the crossing token is kept)
/// and that holds at least `min_keep` candidates. `p = 0` keeps exactly one
/// (unless `min_keep > 1`); `p >= 1` is a no-op (no sort, no softmax).
///
/// Output: sorted, probabilities present but not renormalised after the cut.
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

/// Length of the kept prefix, given the candidates' `e = exp(l - max)` in
/// canonical order (descending logit, ties by ascending id) and their sum
/// `s` (f64, in the set's order): a candidate is kept while the mass before it
/// is `< p * s` (so the crossing token is kept), the device's rule computed
/// the same way; `None` when the mass is not reached within the prefix.
fn cut(e: impl Iterator<Item = f32>, s: f64, p: f32, min_keep: usize) -> Option<usize> {
    let target = f64::from(p) * s;
    let mut cum = 0.0f64;
    for (i, ei) in e.enumerate() {
        cum += f64::from(ei);
        if cum >= target && i + 1 >= min_keep {
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
        let e: Vec<f32> = row
            .logits()
            .iter()
            .map(|&l| sampler_core::numerics::exp(l - max))
            .collect();
        let s = sampler_core::numerics::sum_f64_slice(&e);
        if row.is_sorted() {
            let keep = cut(e.iter().copied(), s, self.p, min_keep).unwrap_or(finite);
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
            if let Some(c) = cut(order[..k].iter().map(|&i| e[i]), s, self.p, min_keep) {
                keep = Some(c);
                break;
            }
            k = k.saturating_mul(4);
        }
        if keep.is_none() {
            order.sort_unstable_by(cmp);
            keep = Some(cut(order.iter().map(|&i| e[i]), s, self.p, min_keep).unwrap_or(finite));
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
