//! `typical(p)` as a chain's first stage on a raw row, without building the
//! full candidate set or ordering the whole row by score.
//!
//! The stage's rule (`stages::typical`): `x_i = l_i − max` (f32), the
//! softmax `p_i = (exp(x_i) · (1/S)) as f32`, the entropy `H` and the score
//! `|ln S − x_i − H|` (f64); the shortest prefix in (score, canonical) order
//! whose f32 running sum of `p` exceeds `p` (and holds `min_keep`).
//!
//! The score is a distance from `x* = ln S − H` in `x`, so the kept set is
//! the tokens whose `x` lies nearest `x*`. One pass computes `S` and `H`
//! exactly as the stage does (`util::log_norm_entropy`), a second a
//! histogram of the mass `Σ e` and the count per 1/16-nat band of `x`. Bands enter in the order of the distance at which they lie
//! wholly within `[x* − D, x* + D]`; the first `D` whose whole bands hold
//! more than `p + 1e-4` of the mass (and `min_keep` tokens) bounds the kept
//! set. One pass gathers the tokens within `D + 1/16` of `x*`, which are
//! sorted by their exact (score, canonical) key and walked with the stage's
//! f32 running sum. The result is used only when the walk ends on a token
//! whose exact score lies below every token left out (all of them are
//! farther than `D + 1/16` in f32, so their score exceeds it but for the
//! rounding of `x − x*`, far below 1/16); otherwise the stage runs.

use sampler_core::TokenId;

use super::scan::{desc_key, max_checked};

/// Bands per nat of `x`.
const PER_NAT: f32 = 16.0;
/// Bands: `x` from 0 down to −64 nats; deeper tokens share the last band.
const BANDS: usize = 1024;

/// Reused buffers of the typical kernel.
#[derive(Debug, Default)]
pub(crate) struct TypicalScratch {
    mass: Vec<f64>,
    count: Vec<u32>,
    /// `(score bits, desc_key, x bits)` of the gathered tokens.
    keys: Vec<(u64, u64, u32)>,
}

/// The kept tokens (score order) with their logits and probabilities.
#[derive(Debug, Default)]
pub(crate) struct TypicalSet {
    pub ids: Vec<TokenId>,
    pub logits: Vec<f32>,
    pub probs: Vec<f32>,
}

#[inline]
fn band(x: f32) -> usize {
    // `x <= 0`; NaN cannot reach here (the row is validated first).
    ((-x * PER_NAT) as usize).min(BANDS - 1)
}

/// The typical set of a raw row into `out`. `false`: not decided here (a
/// bad or all-`-inf` row, or a case the bounds above do not settle); the
/// stage runs.
pub(crate) fn typical_full(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { typical_full_avx512(logits, p, min_keep, maxima, s, out) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { typical_full_avx2(logits, p, min_keep, maxima, s, out) };
        }
    }
    typical_full_body(logits, p, min_keep, maxima, s, out)
}

/// [`typical_full`] compiled for AVX-512F (the same operations, so the same
/// result).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn typical_full_avx512(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
) -> bool {
    typical_full_body(logits, p, min_keep, maxima, s, out)
}

/// [`typical_full`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn typical_full_avx2(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
) -> bool {
    typical_full_body(logits, p, min_keep, maxima, s, out)
}

#[inline(always)]
fn typical_full_body(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
) -> bool {
    use sampler_core::numerics;
    let Ok(max) = max_checked(logits, maxima) else {
        return false;
    };
    if max == f32::NEG_INFINITY || logits.len() > u32::MAX as usize {
        return false;
    }
    s.mass.clear();
    s.mass.resize(BANDS, 0.0);
    s.count.clear();
    s.count.resize(BANDS, 0);
    // The stage's sums (`util::log_norm_entropy`), then the bands: each
    // chunk's exponentials first (that loop vectorises), then the scatter.
    let (sum, entropy) = crate::util::log_norm_entropy(logits, max);
    let ln_sum = sum.ln();
    let mut e = [0.0f32; 64];
    for chunk in logits.chunks(64) {
        for (ei, &l) in e.iter_mut().zip(chunk) {
            *ei = numerics::exp_nonpos(l - max);
        }
        for (&ei, &l) in e.iter().zip(chunk) {
            let x = l - max;
            if x > f32::NEG_INFINITY {
                let b = band(x);
                s.mass[b] += f64::from(ei);
                s.count[b] += 1;
            }
        }
    }
    let inv = 1.0 / sum;
    let center = (ln_sum - entropy) as f32;
    // Band b holds x in (−(b+1)/16, −b/16] (the last one everything below);
    // it lies wholly within distance D of the center from
    // D = max(center − lo, hi − center).
    let whole_at = |b: usize| -> f32 {
        let hi = -(b as f32) / PER_NAT;
        let lo = if b == BANDS - 1 {
            f32::NEG_INFINITY
        } else {
            -((b + 1) as f32) / PER_NAT
        };
        (center - lo).max(hi - center)
    };
    // Merge the bands above and below the center's by that distance.
    let mid = band(center.min(0.0));
    let (mut up, mut down) = (mid as isize, mid + 1);
    let target = (f64::from(p) + 1e-4) * sum;
    let (mut mass, mut count) = (0.0f64, 0usize);
    let mut reach = f32::NAN;
    loop {
        let take_up = match (up >= 0, down < BANDS) {
            (true, true) => whole_at(up as usize) <= whole_at(down),
            (true, false) => true,
            (false, true) => false,
            (false, false) => break,
        };
        let b = if take_up {
            up -= 1;
            (up + 1) as usize
        } else {
            down += 1;
            down - 1
        };
        mass += s.mass[b];
        count += s.count[b] as usize;
        if mass > target && count >= min_keep {
            reach = whole_at(b);
            break;
        }
    }
    if !reach.is_finite() {
        return false;
    }
    // Everything within `reach + 1/16` of the center, by exact key.
    let bound = reach + 1.0 / PER_NAT;
    s.keys.clear();
    for (i, &l) in logits.iter().enumerate() {
        let x = l - max;
        if (x - center).abs() <= bound {
            let score = (ln_sum - f64::from(x) - entropy).abs();
            s.keys
                .push((score.to_bits(), desc_key(l, i as TokenId), x.to_bits()));
        }
    }
    s.keys.sort_unstable();
    let prob = |x: f32| (f64::from(numerics::exp(x)) * inv) as f32;
    let mut cum = 0.0f32;
    let mut keep = None;
    for (i, k) in s.keys.iter().enumerate() {
        cum += prob(f32::from_bits(k.2));
        if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
            keep = Some(i + 1);
            break;
        }
    }
    let Some(keep) = keep else {
        return false;
    };
    // Every token left out is farther than `bound` from the center in f32;
    // its exact score is above `bound` less the rounding of `x − center`
    // (relative 2^-24 of the operands) and of the f64 score.
    let last = f64::from_bits(s.keys[keep - 1].0);
    let slack = 1e-3 + 4.0 * f64::from(f32::EPSILON) * (f64::from(center.abs()) + 64.0);
    if !(last < f64::from(bound) - slack) {
        return false;
    }
    out.ids.clear();
    out.logits.clear();
    out.probs.clear();
    for k in &s.keys[..keep] {
        let x = f32::from_bits(k.2);
        let id = super::scan::key_id(k.1);
        out.ids.push(id);
        out.logits.push(logits[id as usize]);
        out.probs.push(prob(x));
    }
    true
}
