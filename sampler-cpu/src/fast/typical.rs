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
//! set. One pass gathers the positions of the tokens within `D + 1/16` of
//! `x*` (a vectorised test per block, the hits written without a branch per
//! lane). They are counting-sorted by score into buckets, those below `x*`
//! apart from those above it, and walked with the stage's f32 running sum
//! in their exact (score, canonical) order, each bucket ordered only when
//! the walk reaches it: below `x*` the score falls as the logit rises, so
//! the canonical order (one integer key) is the score order; above it the
//! score rises with the logit, so that side is taken by rising logit, each
//! run of one score in canonical order, and the two sides of a bucket are
//! merged. The result is used only when the walk ends on a token whose exact
//! score lies below every token left out (all of them are farther than
//! `D + 1/16` in f32, so their score exceeds it but for the rounding of
//! `x − x*`, far below 1/16); otherwise the stage runs.

use sampler_core::TokenId;

use super::scan::{
    as_block, blocks, desc_key, key_id, key_logit, key_row_logit, lane_mask, max_checked,
};
use super::simd::LANES;

/// Bands per nat of `x`.
const PER_NAT: f32 = 16.0;
/// Bands: `x` from 0 down to −64 nats; deeper tokens share the last band.
const BANDS: usize = 1024;
/// Score buckets per nat of the walk's order (by distance from the
/// center): about four gathered tokens per bucket on average, within these
/// bounds. (A fixed 1/256 nat gave a small set thousands of nearly empty
/// buckets; the tail's buckets, where the tokens are densest, hold many
/// times the average either way, and finer buckets measured no faster.)
const MIN_PER_NAT: f64 = 16.0;
const MAX_PER_NAT: f64 = 4096.0;

/// Reused buffers of the typical kernel.
#[derive(Debug, Default)]
pub(crate) struct TypicalScratch {
    /// Tokens and their mass `Σ e` per band (the last slot: `-inf`, not
    /// counted), in four tables while they are summed.
    count: Vec<u32>,
    mass: Vec<f64>,
    /// Positions of the gathered tokens (id order), with room for a block
    /// past the last one.
    idx: Vec<u32>,
    /// Their `desc_key`s, signed scores and walk slots, in id order.
    keys: Vec<u64>,
    scores: Vec<f64>,
    slots: Vec<u32>,
    /// The keys by slot (each bucket ordered when the walk reaches it).
    sorted: Vec<u64>,
    /// Slot starts in `sorted`, and the next free place of each.
    starts: Vec<u32>,
    next: Vec<u32>,
    /// A merged bucket, and the walked tokens' probabilities.
    merged: Vec<u64>,
    walked_p: Vec<f32>,
}

/// The kept tokens: their logits in score order, and either their ids and
/// probabilities in that order (a chain that goes on) or the same tokens in
/// ascending id with their logits (a fused `temperature -> dist` tail, which
/// needs no more); the other fields are left empty.
#[derive(Debug, Default)]
pub(crate) struct TypicalSet {
    pub ids: Vec<TokenId>,
    pub logits: Vec<f32>,
    pub probs: Vec<f32>,
    /// `(id, logit)` in ascending id (`fused` only).
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

/// The typical set of a raw row into `out` ([`TypicalSet`]: `fused` for a
/// fused tail). `false`: not decided here (a bad or all-`-inf` row, or a
/// case the bounds above do not settle); the stage runs.
pub(crate) fn typical_full(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    fused: bool,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { typical_full_avx512(logits, p, min_keep, fused, maxima, s, out) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { typical_full_avx2(logits, p, min_keep, fused, maxima, s, out) };
        }
    }
    typical_full_body(logits, p, min_keep, fused, maxima, s, out, near_mask)
}

/// [`typical_full`] compiled for AVX-512F (the same operations, so the same
/// result).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn typical_full_avx512(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    fused: bool,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
) -> bool {
    typical_full_body(logits, p, min_keep, fused, maxima, s, out, |block, near| {
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
    fused: bool,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
) -> bool {
    typical_full_body(logits, p, min_keep, fused, maxima, s, out, |block, near| {
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

/// [`typical_full`]'s body, compiled into each instruction set's copy with
/// its block test `mask`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn typical_full_body(
    logits: &[f32],
    p: f32,
    min_keep: usize,
    fused: bool,
    maxima: &mut Vec<f32>,
    s: &mut TypicalScratch,
    out: &mut TypicalSet,
    mask: impl Fn(&[f32; LANES], Near) -> u32,
) -> bool {
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
    // Everything within `reach + 1/16` of the center: a vectorised test
    // per block, the positions of the lanes that pass written without a
    // branch per lane ([`compress_positions`]: each block writes 16 slots
    // from the count on, which the row's length always leaves room for).
    let bound = reach + 1.0 / PER_NAT;
    let near = Near { max, center, bound };
    if s.idx.len() < logits.len() + LANES {
        s.idx.resize(logits.len() + LANES, 0);
    }
    // (Local slices here and below, so that the loops' stores need not be
    // assumed to reach the vectors' own pointers in `s`.)
    let mut n = 0usize;
    let (full, rest) = blocks(logits);
    let idx = &mut s.idx[..];
    for (k, block) in full.enumerate() {
        let m = mask(as_block(block), near);
        n += compress_positions(m, (k * LANES) as u32, &mut idx[n..n + LANES]);
    }
    for (i, &l) in logits.iter().enumerate().skip(rest) {
        idx[n] = i as u32;
        n += usize::from(near.test(l));
    }
    let idx = &s.idx[..n];
    // In id order: their keys and signed scores `ln S − x − H` (the
    // stage's `f64` operations, so `|·|` is its score; `>= 0` below the
    // center in `x`, where the score falls as the logit rises), in loops
    // that vectorise.
    let score = Score {
        max,
        ln_sum,
        entropy,
    };
    fill(&mut s.keys, idx, |&i| desc_key(logits[i as usize], i));
    fill(&mut s.scores, &s.keys, |&k| score.signed(key_logit(k)));
    // The walk's order, (score, canonical), by bucket of score (about four
    // gathered tokens per bucket on average, [`MIN_PER_NAT`]), and in each
    // the tokens below the center apart from those above it (slots `2b`
    // and `2b + 1`). Below the center the canonical order is the score
    // order; above it the score rises with the logit. Counting-sorted (in
    // id order within a slot), each bucket ordered only when the walk
    // reaches it.
    let per_nat = (n as f64 / (4.0 * (f64::from(bound) + 1.0))).clamp(MIN_PER_NAT, MAX_PER_NAT);
    let buckets = ((f64::from(bound) + 1.0) * per_nat) as usize + 2;
    let last = (buckets - 1) as f64;
    fill(&mut s.slots, &s.scores, |&sc| {
        // `floor(|sc| · per_nat)`, clamped, as the low bits of `v + 2^52`.
        let v = (sc.abs() * per_nat).min(last).floor();
        let b = (v + 4_503_599_627_370_496.0).to_bits() as u32;
        2 * b + u32::from(sc < 0.0)
    });
    s.starts.clear();
    s.starts.resize(2 * buckets + 1, 0);
    let starts = &mut s.starts[..];
    for &slot in &s.slots {
        starts[slot as usize + 1] += 1;
    }
    for b in 0..2 * buckets {
        starts[b + 1] += starts[b];
    }
    s.next.clear();
    s.next.extend_from_slice(&s.starts[..2 * buckets]);
    s.sorted.clear();
    s.sorted.resize(n, 0);
    let (next, sorted) = (&mut s.next[..], &mut s.sorted[..]);
    for (&slot, &k) in s.slots.iter().zip(&s.keys) {
        let at = &mut next[slot as usize];
        sorted[*at as usize] = k;
        *at += 1;
    }
    // The walk, on `sorted` in place: bucket by bucket, the tokens below
    // the center put in key order, those above it by rising logit with each
    // run of one score in key order, the two merged by (score, key) (through
    // `merged`); then their probabilities `(exp(x) · (1/S)) as f32` (a loop
    // that vectorises) and the stage's f32 running sum, 64 or more tokens at
    // a time (the last bucket's may be fewer).
    s.walked_p.clear();
    let mut cum = 0.0f32;
    let mut keep = None;
    for b in 0..buckets {
        let (lo, mid, hi) = (
            s.starts[2 * b] as usize,
            s.starts[2 * b + 1] as usize,
            s.starts[2 * b + 2] as usize,
        );
        if hi - lo > 1 {
            let (below, above) = s.sorted[lo..hi].split_at_mut(mid - lo);
            sort_small(below);
            if !above.is_empty() {
                above.sort_unstable_by(|a, b| b.cmp(a));
                score.runs_in_key_order(above);
                if !below.is_empty() {
                    s.merged.clear();
                    score.merge(below, above, &mut s.merged);
                    s.sorted[lo..hi].copy_from_slice(&s.merged);
                }
            }
        }
        let from = s.walked_p.len();
        if hi - from >= 64 || b + 1 == buckets {
            keep = score.sum(
                &s.sorted[..hi],
                &mut s.walked_p,
                from,
                inv,
                &mut cum,
                p,
                min_keep,
            );
            if keep.is_some() {
                break;
            }
        }
    }
    let Some(keep) = keep else {
        return false;
    };
    // Every token left out is farther than `bound` from the center in f32;
    // its exact score is above `bound` less the rounding of `x − center`
    // (relative 2^-24 of the operands) and of the f64 score.
    let last_key = s.sorted[keep - 1];
    let last_score = score.signed(key_logit(last_key)).abs();
    let slack = 1e-3 + 4.0 * f64::from(f32::EPSILON) * (f64::from(center.abs()) + 64.0);
    if !(last_score < f64::from(bound) - slack) {
        return false;
    }
    let kept = &s.sorted[..keep];
    out.ids.clear();
    out.probs.clear();
    out.by_id.clear();
    // From the key: a random read of the row per kept token measured 12 %
    // of the stage at V = 151936.
    fill(&mut out.logits, kept, |&k| key_row_logit(k, logits));
    if fused {
        // The kept tokens are the gathered ones at or before the last in
        // the walk's order; the gathered list is in id order. Each is
        // written, the count advancing only for the kept.
        out.by_id.resize(n, (0, 0.0));
        let (mut len, by_id) = (0, &mut out.by_id[..]);
        for (&k, &sc) in s.keys.iter().zip(&s.scores) {
            let sc = sc.abs();
            by_id[len] = (key_id(k), key_row_logit(k, logits));
            len += usize::from(sc < last_score || (sc == last_score && k <= last_key));
        }
        out.by_id.truncate(len);
    } else {
        fill(&mut out.ids, kept, |&k| key_id(k));
        out.probs.extend_from_slice(&s.walked_p[..keep]);
    }
    true
}

/// For each byte `m`, the lanes whose bits are set in it, ascending (then
/// zeros), and their number.
const SET_LANES: [[u32; 8]; 256] = {
    let mut t = [[0u32; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let (mut c, mut j) = (0, 0);
        while j < 8 {
            if (m >> j) & 1 == 1 {
                t[m][c] = j as u32;
                c += 1;
            }
            j += 1;
        }
        m += 1;
    }
    t
};
const SET_COUNT: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut m = 0;
    while m < 256 {
        t[m] = (m as u32).count_ones() as u8;
        m += 1;
    }
    t
};

/// The positions `base + j` of the lanes `j` set in `mask` (16 lanes) to
/// the front of `dst`, ascending, and their number: per 8 lanes, one row of
/// [`SET_LANES`] plus `base` written whole (the entries past the count are
/// scratch, for the next block to write over), with no branch per lane.
#[inline(always)]
fn compress_positions(mask: u32, base: u32, dst: &mut [u32]) -> usize {
    const _: () = assert!(LANES == 16);
    let (lo, hi) = ((mask & 0xff) as usize, ((mask >> 8) & 0xff) as usize);
    for (d, &j) in dst[..8].iter_mut().zip(&SET_LANES[lo]) {
        *d = base + j;
    }
    let c = usize::from(SET_COUNT[lo]);
    for (d, &j) in dst[c..c + 8].iter_mut().zip(&SET_LANES[hi]) {
        *d = base + 8 + j;
    }
    c + usize::from(SET_COUNT[hi])
}

/// `dst` set to `f` of each of `src`, in a plain loop over the two
/// slices (inlined, so that it vectorises for the caller's instruction set:
/// `Vec::extend` over a `map` was left out of line, without it).
#[inline(always)]
fn fill<S, T: Copy + Default>(dst: &mut Vec<T>, src: &[S], f: impl Fn(&S) -> T) {
    dst.clear();
    dst.resize(src.len(), T::default());
    for (d, x) in dst.iter_mut().zip(src) {
        *d = f(x);
    }
}

/// `keys` in ascending order: in place by insertion when short (most
/// buckets of the walk hold a few tokens), else `sort_unstable`.
#[inline(always)]
fn sort_small(keys: &mut [u64]) {
    if keys.len() > 16 {
        keys.sort_unstable();
        return;
    }
    for i in 1..keys.len() {
        let k = keys[i];
        let mut j = i;
        while j > 0 && keys[j - 1] > k {
            keys[j] = keys[j - 1];
            j -= 1;
        }
        keys[j] = k;
    }
}

/// The stage's score of a logit, from the row's `max`, `ln S` and entropy.
#[derive(Clone, Copy, Debug)]
struct Score {
    max: f32,
    ln_sum: f64,
    entropy: f64,
}

impl Score {
    /// `ln S − (l − max) − H` in the stage's operations: the score is its
    /// magnitude; non-increasing in `l` (every rounding is monotone), so
    /// `>= 0` below the center.
    #[inline(always)]
    fn signed(self, l: f32) -> f64 {
        self.ln_sum - f64::from(l - self.max) - self.entropy
    }

    /// The walk's key of a [`desc_key`]: its score's bits (non-negative, so
    /// they order it), then the key.
    #[inline(always)]
    fn order(self, key: u64) -> (u64, u64) {
        (self.signed(key_logit(key)).abs().to_bits(), key)
    }

    /// The stage's probability of a logit, `(exp(l − max) · inv) as f32`.
    #[inline(always)]
    fn prob(self, l: f32, inv: f64) -> f32 {
        (f64::from(sampler_core::numerics::exp_nonpos(l - self.max)) * inv) as f32
    }

    /// Keys above the center in descending order (rising logit, so rising
    /// score) put in the walk's order: each run of one score, which is in
    /// descending key order, reversed.
    fn runs_in_key_order(self, keys: &mut [u64]) {
        let mut start = 0;
        while start < keys.len() {
            let sc = self.signed(key_logit(keys[start]));
            let mut end = start + 1;
            while end < keys.len() && self.signed(key_logit(keys[end])) == sc {
                end += 1;
            }
            keys[start..end].reverse();
            start = end;
        }
    }

    /// The probabilities of `walked[from..]` (a loop that vectorises) onto
    /// `walked_p`, and the stage's f32 running sum `cum` over them: the
    /// length of the kept prefix if it passes `p` there (holding
    /// `min_keep`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn sum(
        self,
        walked: &[u64],
        walked_p: &mut Vec<f32>,
        from: usize,
        inv: f64,
        cum: &mut f32,
        p: f32,
        min_keep: usize,
    ) -> Option<usize> {
        walked_p.resize(walked.len(), 0.0);
        for (pk, &k) in walked_p[from..].iter_mut().zip(&walked[from..]) {
            *pk = self.prob(key_logit(k), inv);
        }
        for (i, &pk) in walked_p.iter().enumerate().skip(from) {
            *cum += pk;
            if *cum > p && (min_keep == 0 || i + 1 >= min_keep) {
                return Some(i + 1);
            }
        }
        None
    }

    /// `a` and `b`, each in the walk's order, merged into `out` in it.
    fn merge(self, a: &[u64], b: &[u64], out: &mut Vec<u64>) {
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            if self.order(a[i]) <= self.order(b[j]) {
                out.push(a[i]);
                i += 1;
            } else {
                out.push(b[j]);
                j += 1;
            }
        }
        out.extend_from_slice(&a[i..]);
        out.extend_from_slice(&b[j..]);
    }
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

    /// The compressed positions are the set lanes in order, for every
    /// mask of one byte in either half and a sample of whole masks.
    #[test]
    fn compress_positions_are_the_set_lanes() {
        let mut dst = [u32::MAX; LANES + 3];
        let masks = (0..256u32)
            .flat_map(|m| [m, m << 8, m | (m.rotate_left(3) & 0xff) << 8])
            .chain([0xffff, 0x8001, 0x0180]);
        for m in masks {
            let base = 1000 + m;
            let c = compress_positions(m, base, &mut dst);
            let want: Vec<u32> = (0..16)
                .filter(|j| (m >> j) & 1 == 1)
                .map(|j| base + j)
                .collect();
            assert_eq!(&dst[..c], &want[..], "mask {m:#06x}");
            assert_eq!(dst[LANES..], [u32::MAX; 3], "mask {m:#06x}: wrote past 16");
        }
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

    /// The kernel decides `row` (it does not hand it to the stage), in
    /// both forms of its output, and its set is the stage's: ids, logits bit
    /// for bit (zeros with their sign), probabilities in score order, and,
    /// fused, the same logits and the same set in id order. A kernel that
    /// quietly handed rows to the stage would give the same tokens, only
    /// slower: this catches that.
    fn assert_decides_as_stage(row: &[f32], p: f32, min_keep: usize, at: &str) {
        let (mut maxima, mut scratch) = (Vec::new(), TypicalScratch::default());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let spec = ChainSpec::new(vec![StageSpec::Typical { p, min_keep }], None);
        let mut chain = crate::build_chain(&spec).unwrap();
        let mut want = Candidates::from_logits(row);
        chain.apply_from(0, &mut want).unwrap();
        let mut got = TypicalSet::default();
        let decided = typical_full(row, p, min_keep, false, &mut maxima, &mut scratch, &mut got);
        assert!(decided, "{at}: the kernel fell back ({} kept)", want.len());
        assert_eq!(got.ids, want.ids(), "{at}");
        assert_eq!(bits(&got.logits), bits(want.logits()), "{at}");
        assert_eq!(bits(&got.probs), bits(want.probs().unwrap()), "{at}");
        assert!(got.by_id.is_empty(), "{at}");
        let mut by_id: Vec<(TokenId, f32)> = got
            .ids
            .iter()
            .copied()
            .zip(got.logits.iter().copied())
            .collect();
        by_id.sort_unstable_by_key(|&(id, _)| id);
        let mut fused = TypicalSet::default();
        let decided = typical_full(
            row,
            p,
            min_keep,
            true,
            &mut maxima,
            &mut scratch,
            &mut fused,
        );
        assert!(decided, "{at}: fused, the kernel fell back");
        assert_eq!(bits(&fused.logits), bits(want.logits()), "{at}");
        assert!(fused.ids.is_empty() && fused.probs.is_empty(), "{at}");
        assert_eq!(fused.by_id.len(), by_id.len(), "{at}");
        for (g, w) in fused.by_id.iter().zip(&by_id) {
            assert_eq!((g.0, g.1.to_bits()), (w.0, w.1.to_bits()), "{at}");
        }
    }

    /// On ordinary rows (`-c·ln(rank)`, ranks scattered over ids, the top
    /// logit `-0.0`), with and without the band counts (`min_keep` 1 and
    /// above).
    #[test]
    fn decides_ordinary_rows_as_the_stage() {
        let vocab = 20_000;
        for c in [0.8f32, 1.0, 1.3, 2.0] {
            let row: Vec<f32> = (0..vocab)
                .map(|i| -c * ((((i * 7919 + 13) % vocab) + 1) as f32).ln())
                .collect();
            for p in [0.2f32, 0.5, 0.9, 0.95] {
                for min_keep in [1usize, 3, 50] {
                    let at = format!("c {c} p {p} min_keep {min_keep}");
                    assert_decides_as_stage(&row, p, min_keep, &at);
                }
            }
        }
    }

    /// On rows full of ties: logits on a grid of 1/8 (runs of equal logits,
    /// so of equal scores, on both sides of the center, ordered by id), the
    /// maximum as `+0.0` and `-0.0` both, and logits a hair below it
    /// (`-1e-30`, `-1e-38`) whose scores are equal in f64 to the maximum's
    /// though their logits differ: the walk puts such a run above the center
    /// back in the canonical order, and merges the two sides of each bucket
    /// by (score, canonical).
    #[test]
    fn orders_ties_as_the_stage() {
        let vocab = 6_000;
        for (c, grid) in [(1.0f32, 8.0f32), (2.0, 8.0), (0.7, 4.0), (1.3, 64.0)] {
            let mut row: Vec<f32> = (0..vocab)
                .map(|i| {
                    let l = -c * ((((i * 4007 + 5) % vocab) / 3 + 1) as f32).ln();
                    (l * grid).round() / grid
                })
                .collect();
            for (i, l) in [(17, 0.0f32), (4000, -0.0), (9, -1e-30), (2500, -1e-38)] {
                row[i] = l;
            }
            let zeros = row.iter().filter(|&&l| l == 0.0).count();
            assert!(zeros >= 4, "{zeros}");
            for p in [0.05f32, 0.3, 0.9, 0.99] {
                for min_keep in [1usize, 7] {
                    let at = format!("c {c} grid {grid} p {p} min_keep {min_keep}");
                    assert_decides_as_stage(&row, p, min_keep, &at);
                }
            }
        }
    }
}
