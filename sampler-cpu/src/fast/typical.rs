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
//! exactly as the stage does (`util::log_norm_entropy`'s bits) and, from
//! the same exponentials, the mass `Σ e` and the count per 1/16-nat band
//! of `x`. Bands enter in the order of the distance at which they lie
//! wholly within `[x* − D, x* + D]`; the first `D` whose whole bands hold
//! more than `p + 1e-4` of the mass (and `min_keep` tokens) bounds the kept
//! set. One pass gathers the tokens within `D + 1/16` of `x*` (a vectorised
//! test per block), which are counting-sorted by score into 1/256-nat
//! buckets and walked with the stage's f32 running sum in their exact
//! (score, canonical) order, each bucket sorted only when the walk reaches
//! it. The result is used only when the walk ends on a token whose exact
//! score lies below every token left out (all of them are farther than
//! `D + 1/16` in f32, so their score exceeds it but for the rounding of
//! `x − x*`, far below 1/16); otherwise the stage runs.

use sampler_core::TokenId;

use super::scan::{
    as_block, blocks, desc_key, key_id, key_row_logit, lane_mask, max_checked, set_bits,
};
use super::simd::LANES;

/// Bands per nat of `x`.
const PER_NAT: f32 = 16.0;
/// Bands: `x` from 0 down to −64 nats; deeper tokens share the last band.
const BANDS: usize = 1024;
/// Score buckets per nat of the walk's order (by distance from the center).
const SCORE_PER_NAT: f64 = 256.0;

/// Reused buffers of the typical kernel.
#[derive(Debug, Default)]
pub(crate) struct TypicalScratch {
    /// Tokens and their mass `Σ e` per band (the last slot: `-inf`, not
    /// counted), in four tables while they are summed.
    count: Vec<u32>,
    mass: Vec<f64>,
    /// `(score bits, desc_key, p bits)` of the gathered tokens, in id
    /// order, and their `x = l − max`.
    keys: Vec<(u64, u64, u32)>,
    xs: Vec<f32>,
    /// The same, by score bucket (each sorted when the walk reaches it).
    sorted: Vec<(u64, u64, u32)>,
    /// Score bucket starts in `sorted`, and the next free slot of each.
    starts: Vec<u32>,
    next: Vec<u32>,
}

/// The kept tokens (score order) with their logits and probabilities.
#[derive(Debug, Default)]
pub(crate) struct TypicalSet {
    pub ids: Vec<TokenId>,
    pub logits: Vec<f32>,
    pub probs: Vec<f32>,
    /// The same tokens in ascending id: `(id, logit)`.
    pub by_id: Vec<(TokenId, f32)>,
}

#[inline]
fn band(x: f32) -> usize {
    // `x <= 0`; NaN cannot reach here (the row is validated first).
    ((-x * PER_NAT) as usize).min(BANDS - 1)
}

/// [`band`] of a finite or `-inf` `x <= 0`, `BANDS` for `-inf`, in
/// operations that vectorise: a floor, and 2^23 added so that the integer
/// (at most `BANDS - 1`) lands in the low mantissa bits, then selects. (A
/// float-to-integer `as` saturates, which LLVM compiled to a scalar convert
/// and two conditional moves per token: a seventh of the stage at V =
/// 128256 on an AVX2 machine.)
#[inline(always)]
fn band_or_masked(x: f32) -> u16 {
    const _: () = assert!(BANDS.is_power_of_two() && BANDS <= 1 << 15);
    let v = (-x * PER_NAT).min((BANDS - 1) as f32).floor();
    let b = ((v + 8_388_608.0).to_bits() & (BANDS as u32 - 1)) as u16;
    if x > f32::NEG_INFINITY {
        b
    } else {
        BANDS as u16
    }
}

/// Tables of [`typical_full`]'s band scatter.
const TABLES: usize = 4;
/// Slots per table: the bands and `-inf`.
const SLOTS: usize = BANDS + 1;

/// Add the tokens of `bands` (a chunk's bands, [`band_or_masked`]) and
/// their exponentials `e` to their slots: position `i` to table `i % 4`,
/// so that a run of one band (a row's deep tail) does not wait on its own
/// additions; the counts only when `COUNT`.
#[inline(always)]
fn scatter<const COUNT: bool>(bands: &[u16], e: &[f32], count: &mut [u32], mass: &mut [f64]) {
    for (quad, eq) in bands.chunks(TABLES).zip(e.chunks(TABLES)) {
        for (table, (&b, &ei)) in quad.iter().zip(eq).enumerate() {
            let slot = table * SLOTS + usize::from(b);
            if COUNT {
                count[slot] += 1;
            }
            mass[slot] += f64::from(ei);
        }
    }
}

/// The stage's sums (`numerics::exp_entropy_sums`) and, from the same
/// exponentials, the [`scatter`] of the row into its bands.
#[inline(always)]
fn band_sums<const COUNT: bool>(
    logits: &[f32],
    max: f32,
    count: &mut [u32],
    mass: &mut [f64],
) -> (f64, f64) {
    sampler_core::numerics::exp_entropy_sums_visit(logits, max, |chunk, e| {
        let mut bands = [0u16; sampler_core::numerics::CHUNK];
        for (b, &l) in bands.iter_mut().zip(chunk) {
            *b = band_or_masked(l - max);
        }
        scatter::<COUNT>(&bands[..chunk.len()], e, count, mass);
    })
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
    typical_full_body(logits, p, min_keep, maxima, s, out, near_mask)
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
    typical_full_body(logits, p, min_keep, maxima, s, out, |block, near| {
        near_mask_avx512(block, near)
    })
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
    typical_full_body(logits, p, min_keep, maxima, s, out, |block, near| {
        near_mask_avx2(block, near)
    })
}

/// The gather's test, `|(l − max) − center| <= bound`.
#[derive(Clone, Copy, Debug)]
struct Near {
    max: f32,
    center: f32,
    bound: f32,
}

impl Near {
    #[inline(always)]
    fn test(self, l: f32) -> bool {
        ((l - self.max) - self.center).abs() <= self.bound
    }
}

/// [`Near`]'s test on a block of the row: bit `j` set when `block[j]`
/// passes. In plain code ([`lane_mask`]).
#[inline(always)]
fn near_mask(block: &[f32; LANES], near: Near) -> u32 {
    lane_mask(block, |l| near.test(l))
}

/// [`near_mask`] with AVX-512F operations: the same subtractions, the
/// absolute value as a cleared sign bit, an ordered `<=`, so the same bits.
/// (LLVM compiled [`lane_mask`]'s fold to a shift of the mask register per
/// lane here.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn near_mask_avx512(block: &[f32; LANES], near: Near) -> u32 {
    use std::arch::x86_64::{
        _CMP_LE_OQ, _mm512_abs_ps, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_set1_ps,
        _mm512_sub_ps,
    };
    const _: () = assert!(LANES == 16);
    // SAFETY: `block` holds 16 floats.
    let x = unsafe { _mm512_loadu_ps(block.as_ptr()) };
    let d = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_set1_ps(near.max)),
        _mm512_set1_ps(near.center),
    );
    u32::from(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(
        _mm512_abs_ps(d),
        _mm512_set1_ps(near.bound),
    ))
}

/// [`near_mask`] with AVX2 operations (the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn near_mask_avx2(block: &[f32; LANES], near: Near) -> u32 {
    use std::arch::x86_64::{
        _CMP_LE_OQ, _mm256_andnot_ps, _mm256_cmp_ps, _mm256_loadu_ps, _mm256_movemask_ps,
        _mm256_set1_ps, _mm256_sub_ps,
    };
    const _: () = assert!(LANES == 16);
    let (max, center) = (_mm256_set1_ps(near.max), _mm256_set1_ps(near.center));
    let (sign, bound) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(near.bound));
    let half = |h: usize| {
        // SAFETY: `block` holds 16 floats; this reads 8 of them.
        let x = unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * h)) };
        let d = _mm256_andnot_ps(sign, _mm256_sub_ps(_mm256_sub_ps(x, max), center));
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(d, bound)) as u32
    };
    half(0) | (half(1) << 8)
}

#[inline(always)]
fn typical_full_body(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
    mask: impl Fn(&[f32; LANES], Near) -> u32,
) -> bool {
    use sampler_core::numerics;
    let Ok(max) = max_checked(logits, maxima) else {
        return false;
    };
    if max == f32::NEG_INFINITY || logits.len() > u32::MAX as usize {
        return false;
    }
    // The stage's sums (`util::log_norm_entropy`'s bits) and, in the same
    // pass, the tokens per band (`-inf` in an extra slot, not counted).
    // Four tables ([`scatter`]).
    s.count.clear();
    s.count.resize(TABLES * SLOTS, 0);
    s.mass.clear();
    s.mass.resize(TABLES * SLOTS, 0.0);
    let (count, band_mass) = (&mut s.count, &mut s.mass);
    // The counts matter only for `min_keep > 1` (a band with mass holds a
    // token): without them the scatter stores half as much.
    let counted = min_keep > 1;
    let (sum, t) = if counted {
        band_sums::<true>(logits, max, count, band_mass)
    } else {
        band_sums::<false>(logits, max, count, band_mass)
    };
    let (first, rest) = s.count.split_at_mut(SLOTS);
    for table in rest.chunks_exact(SLOTS) {
        for (c, &d) in first.iter_mut().zip(table) {
            *c += d;
        }
    }
    let (first, rest) = s.mass.split_at_mut(SLOTS);
    for table in rest.chunks_exact(SLOTS) {
        for (m, &d) in first.iter_mut().zip(table) {
            *m += d;
        }
    }
    let (count, band_mass) = (&s.count[..SLOTS], &s.mass[..SLOTS]);
    let entropy = crate::util::entropy_from_sums(sum, t);
    let ln_sum = sum.ln();
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
    let (mut mass, mut kept) = (0.0f64, 0usize);
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
        mass += band_mass[b];
        kept += count[b] as usize;
        // Uncounted (`min_keep <= 1`): a band with mass holds a token.
        if mass > target && (!counted || kept >= min_keep) {
            reach = whole_at(b);
            break;
        }
    }
    if !reach.is_finite() {
        return false;
    }
    // Everything within `reach + 1/16` of the center, by exact key: a
    // vectorised test per block, the tokens that pass one by one.
    let bound = reach + 1.0 / PER_NAT;
    let near = Near { max, center, bound };
    s.keys.clear();
    s.xs.clear();
    let mut push = |i: usize| {
        let l = logits[i];
        let x = l - max;
        let score = (ln_sum - f64::from(x) - entropy).abs();
        s.keys.push((score.to_bits(), desc_key(l, i as TokenId), 0));
        s.xs.push(x);
    };
    let (full, rest) = blocks(logits);
    for (k, block) in full.enumerate() {
        for j in set_bits(mask(as_block(block), near)) {
            push(k * LANES + j);
        }
    }
    for (i, &l) in logits.iter().enumerate().skip(rest) {
        if near.test(l) {
            push(i);
        }
    }
    // Their probabilities, `(exp(x) · (1/S)) as f32` (a loop that
    // vectorises).
    for x in &mut s.xs {
        *x = (f64::from(numerics::exp_nonpos(*x)) * inv) as f32;
    }
    for (k, &p) in s.keys.iter_mut().zip(&s.xs) {
        k.2 = p.to_bits();
    }
    // The walk's order, (score, canonical): counting-sorted by score bucket
    // (non-decreasing in the score), each bucket sorted when the walk gets
    // there, so nothing past the crossing bucket is sorted.
    let buckets = ((f64::from(bound) + 1.0) * SCORE_PER_NAT) as usize + 2;
    let bucket =
        |score_bits: u64| ((f64::from_bits(score_bits) * SCORE_PER_NAT) as usize).min(buckets - 1);
    s.starts.clear();
    s.starts.resize(buckets + 1, 0);
    for k in &s.keys {
        s.starts[bucket(k.0) + 1] += 1;
    }
    for b in 0..buckets {
        s.starts[b + 1] += s.starts[b];
    }
    s.next.clear();
    s.next.extend_from_slice(&s.starts[..buckets]);
    s.sorted.clear();
    s.sorted.resize(s.keys.len(), (0, 0, 0));
    for &k in &s.keys {
        let slot = &mut s.next[bucket(k.0)];
        s.sorted[*slot as usize] = k;
        *slot += 1;
    }
    let mut cum = 0.0f32;
    let mut keep = None;
    'walk: for b in 0..buckets {
        let (lo, hi) = (s.starts[b] as usize, s.starts[b + 1] as usize);
        let slice = &mut s.sorted[lo..hi];
        slice.sort_unstable();
        for (i, k) in (lo..).zip(slice.iter()) {
            cum += f32::from_bits(k.2);
            if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
                keep = Some(i + 1);
                break 'walk;
            }
        }
    }
    let Some(keep) = keep else {
        return false;
    };
    // Every token left out is farther than `bound` from the center in f32;
    // its exact score is above `bound` less the rounding of `x − center`
    // (relative 2^-24 of the operands) and of the f64 score.
    let last_score = f64::from_bits(s.sorted[keep - 1].0);
    let slack = 1e-3 + 4.0 * f64::from(f32::EPSILON) * (f64::from(center.abs()) + 64.0);
    if !(last_score < f64::from(bound) - slack) {
        return false;
    }
    out.ids.clear();
    out.logits.clear();
    out.probs.clear();
    for k in &s.sorted[..keep] {
        let id = key_id(k.1);
        out.ids.push(id);
        // From the key: a random read of the row per kept token measured
        // 12 % of the stage at V = 151936.
        out.logits.push(key_row_logit(k.1, logits));
        out.probs.push(f32::from_bits(k.2));
    }
    // The kept tokens are the gathered ones at or before the last in the
    // walk's order; the gathered list is in id order.
    let last = s.sorted[keep - 1];
    out.by_id.clear();
    out.by_id.extend(
        s.keys
            .iter()
            .filter(|&&k| k <= last)
            .map(|k| (key_id(k.1), key_row_logit(k.1, logits))),
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_core::{Candidates, ChainSpec, StageSpec};

    /// The vectorisable band is the truncating one on every kind of `x`:
    /// band edges (multiples of 1/16) and the floats either side of them,
    /// signed zeros, the last band's edge and far below it, and `-inf`.
    #[test]
    fn band_or_masked_is_band() {
        let mut xs = vec![0.0f32, -0.0, -1e-30, -1e30, -f32::MAX, -64.0, -1e3];
        for k in 0..=(BANDS as u32 + 8) {
            let edge = -(k as f32) / PER_NAT;
            xs.extend([edge, edge.next_up().min(0.0), edge.next_down()]);
            xs.push(edge - 0.5 / PER_NAT);
        }
        for &x in &xs {
            assert_eq!(usize::from(band_or_masked(x)), band(x), "x = {x:e}");
        }
        assert_eq!(band(-64.0 + 1.0 / PER_NAT), BANDS - 1);
        assert_eq!(band((-64.0f32 + 1.0 / PER_NAT).next_up()), BANDS - 2);
        assert_eq!(band_or_masked(f32::NEG_INFINITY), BANDS as u16);
    }

    /// The gather's vector masks are the scalar test lane by lane: random
    /// blocks with `-inf`, signed zeros, the maximum itself and values
    /// exactly `bound` from the center (where `<=` decides; all values are
    /// multiples of 1/64, so those distances are exact) among them.
    #[test]
    fn near_masks_are_the_test_lane_by_lane() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x9e37_79b9);
        let mut next = move || rng.random::<u32>();
        let (mut hits, mut on_bound) = (0u32, 0usize);
        // Which vector copies ran (set only on x86-64).
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let (mut avx2, mut avx512) = (false, false);
        for _ in 0..4000 {
            let max = (next() % 1280) as f32 / 64.0 - 5.0;
            let center = -((next() % 1024) as f32) / 64.0;
            let bound = (next() % 512) as f32 / 64.0;
            let near = Near { max, center, bound };
            let block: [f32; LANES] = std::array::from_fn(|_| match next() % 8 {
                0 => f32::NEG_INFINITY,
                1 => -0.0,
                2 => max,
                3 => (max + center) + bound,
                4 => (max + center) - bound,
                _ => max - (next() % 2048) as f32 / 64.0,
            });
            on_bound += block
                .iter()
                .filter(|&&l| ((l - max) - center).abs() == bound)
                .count();
            let want = (0..LANES).fold(0u32, |m, j| m | u32::from(near.test(block[j])) << j);
            assert_eq!(near_mask(&block, near), want, "{near:?} {block:?}");
            hits += want.count_ones();
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    let got = unsafe { near_mask_avx2(&block, near) };
                    assert_eq!(got, want, "avx2: {near:?} {block:?}");
                    avx2 = true;
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    let got = unsafe { near_mask_avx512(&block, near) };
                    assert_eq!(got, want, "avx512f: {near:?} {block:?}");
                    avx512 = true;
                }
            }
        }
        // Neither all in nor all out, and many lanes exactly on the bound.
        assert!(
            hits > 4000 && hits < 4000 * 15,
            "{hits} of {}",
            4000 * LANES
        );
        assert!(on_bound > 1000, "{on_bound} lanes on the bound");
        if !(avx2 && avx512) {
            println!("SKIP: vector masks checked on this CPU: avx2 {avx2}, avx512f {avx512}");
        }
    }

    /// On ordinary rows (`-c·ln(rank)`, ranks scattered over ids, the top
    /// logit `-0.0`) the kernel decides, with and without the band counts
    /// (`min_keep` 1 and above), and its set is the stage's: ids, logits
    /// bit for bit (zeros with their sign), probabilities, and the same set
    /// in id order. A kernel that quietly hands every row to the stage
    /// would give the same tokens, only slower: this test catches that.
    #[test]
    fn decides_ordinary_rows_as_the_stage() {
        let vocab = 20_000;
        let (mut maxima, mut scratch) = (Vec::new(), TypicalScratch::default());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for c in [0.8f32, 1.0, 1.3, 2.0] {
            let row: Vec<f32> = (0..vocab)
                .map(|i| -c * ((((i * 7919 + 13) % vocab) + 1) as f32).ln())
                .collect();
            for p in [0.2f32, 0.5, 0.9, 0.95] {
                for min_keep in [1usize, 3, 50] {
                    let at = format!("c {c} p {p} min_keep {min_keep}");
                    let spec = ChainSpec::new(vec![StageSpec::Typical { p, min_keep }], None);
                    let mut chain = crate::build_chain(&spec).unwrap();
                    let mut want = Candidates::from_logits(&row);
                    chain.apply_from(0, &mut want).unwrap();
                    let mut got = TypicalSet::default();
                    let decided =
                        typical_full(&row, p, min_keep, &mut maxima, &mut scratch, &mut got);
                    assert!(decided, "{at}: the kernel fell back ({} kept)", want.len());
                    assert_eq!(got.ids, want.ids(), "{at}");
                    assert_eq!(bits(&got.logits), bits(want.logits()), "{at}");
                    assert_eq!(bits(&got.probs), bits(want.probs().unwrap()), "{at}");
                    let mut by_id: Vec<(TokenId, f32)> = got
                        .ids
                        .iter()
                        .copied()
                        .zip(got.logits.iter().copied())
                        .collect();
                    by_id.sort_unstable_by_key(|&(id, _)| id);
                    assert_eq!(got.by_id.len(), by_id.len(), "{at}");
                    for (g, w) in got.by_id.iter().zip(&by_id) {
                        assert_eq!((g.0, g.1.to_bits()), (w.0, w.1.to_bits()), "{at}");
                    }
                }
            }
        }
    }
}
