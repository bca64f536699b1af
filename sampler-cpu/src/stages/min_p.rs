//! `min_p`: keep tokens whose probability is at least `p` times the top one.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Min-p with llama.cpp semantics, in logit space: the threshold is
/// `max_logit + ln(p)` and a candidate is kept when its logit is `>=` it
/// (inclusive: `p = 1` keeps every token equal to the maximum).
///
/// * Unsorted input: one pass keeps the qualifying candidates in their
///   ORIGINAL order (the set stays unsorted); accepted when it keeps at least
///   `max(1, min_keep)` candidates.
/// * Otherwise (sorted input, or the pass kept too few, e.g. `p > 1`): sort,
///   keep the first candidate always, then every candidate while its logit is
///   `>=` the threshold or fewer than `min_keep` are kept.
///
/// So the result is never empty (bug case 1). `p <= 0` is a no-op.
#[derive(Debug, Clone, Copy)]
pub struct MinP {
    p: f32,
    min_keep: usize,
}

impl MinP {
    /// A min-p stage; `p <= 0` disables it.
    pub fn new(p: f32, min_keep: usize) -> Self {
        Self { p, min_keep }
    }
}

impl Sampler for MinP {
    fn name(&self) -> &str {
        "min_p"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::MinP {
            p: self.p,
            min_keep: self.min_keep,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.p.is_nan() || self.p <= 0.0 || row.is_empty() {
            return Ok(());
        }
        let min_logit = row.max_logit() + self.p.ln();
        if !row.is_sorted() {
            let keep: Vec<bool> = row.logits().iter().map(|&l| l >= min_logit).collect();
            let count = keep.iter().filter(|&&k| k).count();
            if count >= self.min_keep.max(1) {
                if count < row.len() {
                    row.retain_mask(&keep);
                }
                return Ok(());
            }
        }
        row.sort_desc();
        let logits = row.logits();
        // `min_keep` counts drawable candidates: a `-inf` (banned) one is
        // never kept for it (the device masks and the host drops them alike).
        let finite = logits.iter().take_while(|l| l.is_finite()).count();
        let min_keep = self.min_keep.min(finite);
        let mut keep = 1;
        while keep < logits.len() && (logits[keep] >= min_logit || keep < min_keep) {
            keep += 1;
        }
        row.truncate(keep);
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
