//! `top_p` (nucleus) on the device, CPU semantics: in canonical order
//! (logit descending, ties by ascending id) keep every candidate whose
//! probability mass *before* it is `< p` (so the crossing token is kept),
//! and at least `max(1, min_keep)` candidates (bug_cases §12). `p >= 1` rows
//! are no-ops. Width unchanged; dropped candidates become `-inf`. The mass
//! is the one rule of docs/semantics.md: fixed-point weights
//! (`ops::fixed_weights`, `sampler_core::numerics::fixed_weight`) against
//! `numerics::nucleus_goal`. The cubecl kernels sum them exactly (64-bit)
//! and give the CPU's kept set from the same exponentials; the recipes
//! below sum them in f32, so on the other devices (flex, ndarray) a kept
//! set can differ only where the mass before a candidate lies within f32
//! rounding of the goal.
//!
//! * width `<= PAIRWISE_MAX` (after a `top_k`): exact ranks and masses
//!   before each candidate from pairwise `[B, N, N]` comparisons (on a
//!   cubecl device, widths up to `kernels::TOP_K_MAX` run the same rule as
//!   one custom kernel);
//! * full rows: no sort and no cumsum. The crossing logit `v*` (the largest
//!   logit whose mass `sum(e where l >= v*) >= p * S`) is found by a
//!   bisection that snaps every midpoint to an actual logit (two reductions
//!   per iteration, `BISECT_ITERS` iterations); candidates equal to `v*` are
//!   then kept in ascending id order while the mass before them is `< p * S`,
//!   with the id cut found by an integer bisection over counts. On a cubecl
//!   device, rows of the whole vocabulary with `min_keep <= 1` are handed on
//!   by the step's fusion rules: a following `[temperature] -> dist` draws
//!   through the cut in one kernel (`kernels::cut_dist_full`, about three
//!   reads of the row), anything else gets the rows filtered by
//!   `kernels::top_p_full` (that kernel's cut, then the row written: four
//!   reads and a write).

use burn_tensor::{Bool, Int, Tensor};
use sampler_core::StageSpec;

use sampler_core::DeviceRefusal;

use crate::kernels;
use crate::ops::{self, PAIRWISE_MAX, wide};
use crate::recipes::{KeepFilter, or_fill};
use crate::stage::{CutRule, DeviceStage, Fusable, InitContext, StepData};

/// Iterations of the bisection on full rows (`key_midpoint`'s steps): one
/// step across zero, at most 8 geometric ones down from the 277 binades of
/// f32 (subnormals included) to a factor of 4, then at most 25 halvings of
/// a range `[a, 4a]` (2^24 floats): 34 resolve any two adjacent f32
/// logits, whatever their scale; 40 leave a margin.
pub const BISECT_ITERS: usize = 40;

/// A point strictly between `lo < hi` (per row `[B, 1]`) that halves the
/// range in the floats' own spacing rather than in value: `0` across zero;
/// for ends of one sign more than a factor of 4 apart, their geometric
/// mean `±sqrt|lo|·sqrt|hi|` (an end at zero taken as the smallest
/// subnormal); otherwise `lo/2 + hi/2` (no overflow at `±f32::MAX`). A value
/// bisection alone needs about 130 halvings to tell `1e-40` from `1.2e-38`
/// in a row that also holds ordinary logits.
fn key_midpoint(lo: &Tensor<2>, hi: &Tensor<2>) -> Tensor<2> {
    let tiny = f32::from_bits(1);
    let a_lo = lo.clone().abs().clamp_min(tiny);
    let a_hi = hi.clone().abs().clamp_min(tiny);
    let across = lo.clone().lower_elem(0.0).bool_and(hi.clone().greater_elem(0.0));
    let negative = hi.clone().lower_equal_elem(0.0);
    let (small, big) = (
        a_lo.clone().min_pair(a_hi.clone()),
        a_lo.clone().max_pair(a_hi.clone()),
    );
    let far = big.greater(small.mul_scalar(4.0));
    let geometric = a_lo.sqrt().mul(a_hi.sqrt());
    let geometric = geometric.clone().mask_where(negative, geometric.neg());
    lo.clone()
        .mul_scalar(0.5)
        .add(hi.clone().mul_scalar(0.5))
        .mask_where(far, geometric)
        .mask_fill(across, 0.0)
}

/// Device top-p with per-row `p` and `min_keep`.
#[derive(Debug)]
pub struct TopP {
    filter: KeepFilter,
    /// `p`, `+inf` on no-op rows: the kernels' column.
    p_or_all: Option<Tensor<2>>,
}

impl TopP {
    /// From the per-row specs (`StageSpec::TopP`).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let filter = KeepFilter::new(specs, 1.0, |s| match s {
            StageSpec::TopP { p, min_keep } => Some((*p, *min_keep)),
            _ => None,
        });
        Self {
            filter,
            p_or_all: None,
        }
    }
}

impl DeviceStage for TopP {
    fn name(&self) -> &'static str {
        "top_p"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let ps = &self.filter.values;
        let p: Vec<f32> = ps.iter().map(|&p| p.clamp(0.0, 1.0)).collect();
        let noop: Vec<bool> = ps.iter().map(|&p| p >= 1.0).collect();
        self.p_or_all = Some(ops::col_f32(&or_fill(&p, &noop, f32::INFINITY), &ctx.device));
        self.filter.upload(&p, &noop, ctx);
        ops::top_mask_allowed(self.filter.keep_max, ctx.width, &ctx.device)
    }
    fn fusable(&self) -> Fusable<'_> {
        match &self.p_or_all {
            Some(column) => Fusable::Cut {
                rule: CutRule::TopP,
                column,
                keep_max: self.filter.keep_max,
            },
            None => Fusable::Alone,
        }
    }
    fn apply(&self, data: &mut StepData) {
        let Some((p, noop, keep_row)) = self.filter.per_row(data) else {
            return;
        };
        let keep_row = &keep_row;
        let n = data.width;
        let ids = data.token_ids();
        if let Some(p_or_all) = &self.p_or_all
            && let Some(out) = kernels::top_p(&data.logits, &ids, &data.per_row(p_or_all), keep_row)
        {
            data.logits = out;
            return;
        }
        // The rule's fixed-point weights, summed here in f32 (the kernels
        // and the CPU sum them exactly; so a kept set can differ only where
        // the mass before a candidate lies within f32 rounding of the goal).
        let e = ops::fixed_weights(ops::exps(&data.logits).0);
        let s = e.clone().sum_dim(1);
        let keep = if n <= PAIRWISE_MAX {
            let (rank, before, from) = ops::rank_and_masses(&data.logits, &ids, &e, true);
            let side = NucleusSide::new(&p, &s);
            side.by_before(before, n)
                .bool_and(wide(side.high.clone(), n).bool_not())
                .bool_or(side.by_from(from, n).bool_and(wide(side.high, n)))
                .bool_or(rank.lower(wide(keep_row.clone(), n)))
        } else {
            let nucleus = full_row_nucleus(&data.logits, &ids, &e, &p, &s, data.vocab);
            let top = if self.filter.keep_max > 1 {
                ops::canonical_top_mask(&data.logits, &ids, keep_row, self.filter.keep_max)
            } else {
                let best = ops::argmax_lowest_id(&data.logits, &ids);
                ids.clone().equal(wide(best, n))
            };
            nucleus.bool_or(top)
        };
        let keep = keep.bool_or(wide(noop.clone(), n));
        data.logits = ops::mask_logits(data.logits.clone(), keep);
    }
}

/// Which side of the nucleus rule a row evaluates: the rule is "the mass
/// before a candidate is `< p·S`"; for `p >= 1/2` it is evaluated as "the
/// mass from it on is `> (1 - p)·S`" (`1 - p` is exact there), summing the
/// small side, so that `p` within rounding of 1 cuts a tail of tiny
/// probabilities where the exact rule does (f32 sums next to `S` cannot
/// resolve them, and `p·S` rounds to `S`).
pub(crate) struct NucleusSide {
    /// `[B, 1]`: rows evaluated from the tail (`p >= 1/2`).
    pub(crate) high: Tensor<2, Bool>,
    /// `[B, 1]`: `p·S`.
    pub(crate) target: Tensor<2>,
    /// `[B, 1]`: `(1 - p)·S`.
    pub(crate) tail: Tensor<2>,
}

impl NucleusSide {
    /// From `p` and `S` per row `[B, 1]`.
    pub(crate) fn new(p: &Tensor<2>, s: &Tensor<2>) -> Self {
        Self {
            high: p.clone().greater_equal_elem(0.5),
            target: p.clone().mul(s.clone()),
            tail: p.clone().neg().add_scalar(1.0).mul(s.clone()),
        }
    }

    /// Kept by the mass before each candidate `[B, N]`.
    fn by_before(&self, before: Tensor<2>, n: usize) -> Tensor<2, Bool> {
        before.lower(wide(self.target.clone(), n))
    }

    /// Kept by the mass from each candidate on `[B, N]`.
    fn by_from(&self, from: Tensor<2>, n: usize) -> Tensor<2, Bool> {
        from.greater(wide(self.tail.clone(), n))
    }
}

/// The nucleus mask `[B, N]` of full rows by reductions only; `p` and `S`
/// per row `[B, 1]`.
pub(crate) fn full_row_nucleus(
    logits: &Tensor<2>,
    ids: &Tensor<2, Int>,
    e: &Tensor<2>,
    p: &Tensor<2>,
    s: &Tensor<2>,
    vocab: usize,
) -> Tensor<2, Bool> {
    let [_, n] = logits.dims();
    let side = NucleusSide::new(p, s);
    let high = wide(side.high.clone(), n);
    // Whether the candidates at or above `v` `[B, 1]` reach the goal: their
    // mass `>= p·S`, or (high rows) the mass below `v` `<= (1 - p)·S`.
    let reaches = |v: &Tensor<2>| {
        let ge = logits.clone().greater_equal(wide(v.clone(), n));
        let counted = ge
            .clone()
            .bool_and(high.clone().bool_not())
            .bool_or(ge.bool_not().bool_and(high.clone()));
        let mass = e.clone().mask_fill(counted.bool_not(), 0.0).sum_dim(1);
        mass.clone()
            .greater_equal(side.target.clone())
            .bool_and(side.high.clone().bool_not())
            .bool_or(mass.lower_equal(side.tail.clone()).bool_and(side.high.clone()))
    };
    let finite = logits.clone().is_finite();
    let m = logits.clone().max_dim(1);
    // If the maxima alone reach the goal, v* = max. Otherwise bisect with
    // lo: a logit whose candidates at or above reach it (the smallest
    // finite one) and hi: one whose do not (the max); midpoints from
    // `key_midpoint`.
    let top_ok = reaches(&m).bool_or(side.target.clone().lower_equal_elem(0.0));
    let mut lo = logits
        .clone()
        .mask_fill(finite.bool_not(), f32::INFINITY)
        .min_dim(1);
    let mut hi = m.clone();
    for _ in 0..BISECT_ITERS {
        let mid = key_midpoint(&lo, &hi);
        let snap = logits
            .clone()
            .mask_fill(logits.clone().lower(wide(mid.clone(), n)), f32::INFINITY)
            .min_dim(1);
        let inside = snap.clone().lower(hi.clone());
        let ok = inside.clone().bool_and(reaches(&snap));
        let shrink = inside.clone().bool_and(ok.clone().bool_not());
        lo = lo.mask_where(ok, snap.clone());
        hi = hi
            .mask_where(shrink, snap)
            .mask_where(inside.bool_not(), mid);
    }
    let vstar = lo.mask_where(top_ok, m);
    let gt = logits.clone().greater(wide(vstar.clone(), n));
    let eq = logits.clone().equal(wide(vstar, n));
    let e_v = e.clone().mask_fill(eq.clone().bool_not(), 0.0).max_dim(1);
    let count_eq = eq.clone().int().sum_dim(1);
    // Equal candidates kept in id order while the mass before them is < p·S:
    // `need` of them, the mass they must add past those above,
    // `p·S - mass(l > v*)`, or (high rows) `mass(l <= v*) - (1 - p)·S`.
    let mass_gt = e.clone().mask_fill(gt.clone().bool_not(), 0.0).sum_dim(1);
    let mass_le = e.clone().mask_fill(gt.clone(), 0.0).sum_dim(1);
    let lacking = side
        .target
        .clone()
        .sub(mass_gt)
        .mask_where(side.high.clone(), mass_le.sub(side.tail.clone()));
    let need = lacking
        .div(e_v.clone().clamp_min(f32::MIN_POSITIVE))
        .ceil()
        .clamp(1.0, vocab as f32)
        .int();
    let need = need.min_pair(count_eq.clone()).clamp_min(1);
    // Smallest id cut with count(eq & id <= cut) >= need.
    let mut lo_id = need.zeros_like().sub_scalar(1);
    let mut hi_id = need.zeros_like().add_scalar(vocab as i64);
    let steps = usize::BITS - vocab.leading_zeros() + 1;
    for _ in 0..steps {
        let mid = lo_id.clone().add(hi_id.clone()).div_scalar(2);
        let cnt = eq
            .clone()
            .bool_and(ids.clone().lower_equal(wide(mid.clone(), n)))
            .int()
            .sum_dim(1);
        let enough = cnt.greater_equal(need.clone());
        hi_id = hi_id.mask_where(enough.clone(), mid.clone());
        lo_id = lo_id.mask_where(enough.bool_not(), mid);
    }
    gt.bool_or(eq.bool_and(ids.clone().lower_equal(wide(hi_id, n))))
}
