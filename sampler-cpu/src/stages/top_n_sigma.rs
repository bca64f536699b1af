//! `top_n_sigma`: mask logits more than `n` standard deviations below the max.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec};

/// Top-nσ (Tang et al. 2024) with llama.cpp semantics: over the finite
/// (not `-inf`) logits compute the maximum, the mean and the population
/// standard deviation (divide by the count; the sums in f64 with the
/// project's lane rule, `sampler_core::numerics::sum_f64`, over the set's
/// order with 0 for a `-inf`); every logit `< max - n·std` becomes `-inf`. The set keeps its size and order (no sort,
/// no softmax). `n <= 0` or a set of at most one candidate is a no-op.
#[derive(Debug, Clone, Copy)]
pub struct TopNSigma {
    n: f32,
}

impl TopNSigma {
    /// A top-n-sigma stage; `n <= 0` disables it.
    pub fn new(n: f32) -> Self {
        Self { n }
    }
}

impl Sampler for TopNSigma {
    fn name(&self) -> &str {
        "top_n_sigma"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::TopNSigma { n: self.n })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        // The set's flags stay as they are when nothing is masked.
        if let Some(c) = cut_to_apply(row.logits(), self.n) {
            mask_below(row.logits_mut(), c);
        }
        Ok(())
    }
    fn apply_full_row(
        &mut self,
        logits: &mut [f32],
        _ctx: &StageContext,
    ) -> Option<Result<(), SampleError>> {
        if let Some(c) = cut_to_apply(logits, self.n) {
            mask_below(logits, c);
        }
        Some(Ok(()))
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}

/// The cut the stage applies to a set's logits, `None` when it leaves the
/// set as it is: `n` not positive, one candidate or fewer, no cut
/// ([`cut_logit`]), or no logit below it.
fn cut_to_apply(logits: &[f32], n: f32) -> Option<f32> {
    if n.is_nan() || n <= 0.0 || logits.len() <= 1 {
        return None;
    }
    let c = cut_logit(logits, n)?;
    logits.iter().fold(false, |any, &l| any | (l < c)).then_some(c)
}

/// Every logit below `c` to `-inf` (size and order kept).
fn mask_below(logits: &mut [f32], c: f32) {
    for l in logits {
        *l = if *l < c { f32::NEG_INFINITY } else { *l };
    }
}

/// The stage's cut on `logits` (`n > 0`): a logit is masked when it is
/// below the returned f32, the least f32 at or above the threshold
/// `max - n·std` (f64), so that `f64(l) < threshold` <=> `l < c` and the
/// test is an f32 compare that vectorises. `None` when the stage leaves the
/// set as it is: no finite logit, or a NaN threshold.
pub(crate) fn cut_logit(logits: &[f32], n: f32) -> Option<f32> {
    let threshold = threshold(logits, n)?;
    if threshold.is_nan() {
        return None;
    }
    let c = threshold as f32;
    Some(if f64::from(c) < threshold {
        c.next_up()
    } else {
        c
    })
}

/// `max - n·std` over the finite logits (`None` without one), with the
/// lane-rule sums; vectorised, on x86-64 the AVX-512F or AVX2 copy of the
/// same code chosen at run time (the same operations in the same order, so
/// the same bits).
fn threshold(logits: &[f32], n: f32) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { threshold_avx512(logits, n) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { threshold_avx2(logits, n) };
        }
    }
    threshold_body(logits, n)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn threshold_avx512(logits: &[f32], n: f32) -> Option<f64> {
    threshold_body(logits, n)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn threshold_avx2(logits: &[f32], n: f32) -> Option<f64> {
    threshold_body(logits, n)
}

#[inline(always)]
fn threshold_body(logits: &[f32], n: f32) -> Option<f64> {
    use sampler_core::numerics::{LANES, add_f64_to_lanes, add_to_lanes, combine};
    // Pass 1: count, sum and maximum of the finite logits, by chunks of 64
    // (which start at multiples of the lanes): the chunk with 0.0 for a
    // non-finite logit (adding 0.0 leaves a lane as it is) into the lane
    // sums, the count and maximum over it.
    let mut count = 0u64;
    let mut sum = [0.0f64; LANES];
    let mut max = [f32::NEG_INFINITY; 16];
    let mut v = [0.0f32; 64];
    for chunk in logits.chunks(64) {
        let mut c = 0u32;
        for (x, &l) in v.iter_mut().zip(chunk) {
            let f = l.is_finite();
            c += u32::from(f);
            *x = if f { l } else { 0.0 };
        }
        count += u64::from(c);
        for block in chunk.chunks(16) {
            for (m, &l) in max.iter_mut().zip(block) {
                *m = if l.is_finite() && l > *m { l } else { *m };
            }
        }
        add_to_lanes(&mut sum, &v[..chunk.len()]);
    }
    if count == 0 {
        return None;
    }
    let max = max.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mean = combine(sum) / count as f64;
    // Pass 2: the squared deviations, the same lanes.
    let mut sq = [0.0f64; LANES];
    let mut d = [0.0f64; 64];
    for chunk in logits.chunks(64) {
        for (x, &l) in d.iter_mut().zip(chunk) {
            let dev = f64::from(l) - mean;
            *x = if l.is_finite() { dev * dev } else { 0.0 };
        }
        add_f64_to_lanes(&mut sq, &d[..chunk.len()]);
    }
    let var = combine(sq) / count as f64;
    Some(f64::from(max) - f64::from(n) * var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The threshold follows the serial lane rule (`sum_f64` over the set
    /// with 0 for a non-finite logit) on every level the CPU has.
    #[test]
    fn the_threshold_is_the_lane_rule() {
        let mut x = 0x9e37_79b9u32;
        for len in [1usize, 7, 8, 9, 100, 1001] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if x.is_multiple_of(9) {
                        f32::NEG_INFINITY
                    } else {
                        (x % 100_000) as f32 / 997.0 - 50.0
                    }
                })
                .collect();
            let finite = |l: f32| if l.is_finite() { l } else { 0.0 };
            let count = row.iter().filter(|l| l.is_finite()).count();
            let want = (count > 0).then(|| {
                let mean = sampler_core::numerics::sum_f64(row.iter().map(|&l| finite(l)))
                    / count as f64;
                let mut lanes = [0.0f64; 8];
                for (i, &l) in row.iter().enumerate() {
                    let d = f64::from(l) - mean;
                    lanes[i % 8] += if l.is_finite() { d * d } else { 0.0 };
                }
                let var = sampler_core::numerics::combine(lanes) / count as f64;
                let max = row.iter().copied().filter(|l| l.is_finite()).fold(f32::MIN, f32::max);
                f64::from(max) - 1.5 * var.sqrt()
            });
            let bits = |t: Option<f64>| t.map(f64::to_bits);
            assert_eq!(bits(threshold_body(&row, 1.5)), bits(want), "len {len}");
            assert_eq!(bits(threshold(&row, 1.5)), bits(want), "len {len}");
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    assert_eq!(bits(unsafe { threshold_avx2(&row, 1.5) }), bits(want));
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    assert_eq!(bits(unsafe { threshold_avx512(&row, 1.5) }), bits(want));
                }
            }
        }
        assert_eq!(threshold(&[f32::NEG_INFINITY; 20], 1.0), None);
    }

    /// The stage masks exactly `f64(l) < threshold`: logits one ulp around
    /// the threshold's f32 neighbours.
    #[test]
    fn the_mask_is_the_f64_compare() {
        use sampler_core::{RowRng, StageContext};
        let mut x = 0x1234_5678u32;
        for len in [3usize, 40, 333] {
            let mut row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    (x % 10_000) as f32 / 313.0 - 16.0
                })
                .collect();
            let thr = threshold(&row, 1.0).expect("finite logits");
            // Put logits right at the threshold's f32 neighbours.
            let near = thr as f32;
            for (i, v) in [near.next_down(), near, near.next_up()].into_iter().enumerate() {
                row[i] = v;
            }
            let thr = threshold(&row, 1.0).expect("finite logits");
            let want: Vec<f32> = row
                .iter()
                .map(|&l| if f64::from(l) < thr { f32::NEG_INFINITY } else { l })
                .collect();
            let mut set = Candidates::from_logits(&row);
            let ctx = StageContext {
                rng: RowRng {
                    seed: 1,
                    step: 0,
                    stage_index: 0,
                },
            };
            TopNSigma::new(1.0).apply(&mut set, &ctx).expect("applies");
            assert_eq!(set.logits(), &want[..], "len {len}");
        }
    }
}
