//! Full-vocabulary `top_p` (nucleus) without a full sort.
//!
//! The reference (`stages::top_p`, llama.cpp semantics) computes
//! `e_i = exp(l_i - max)` in f32 and `S = Σ e_i` in f64 with the project's
//! numerics (`sampler_core::numerics`: its `exp`, lane sums in id order),
//! `p_i = (e_i · (1/S)) as f32`, sorts descending and keeps the shortest
//! prefix whose running fixed-point mass (`numerics::fixed_weight` of the
//! `e_i`, exact integer sums) reaches `numerics::nucleus_goal(p, W)` of the
//! row's total `W` (and holds `min_keep`): the one `top_p` rule of the CPU
//! and the device kernels.
//!
//! Here, with the same arithmetic, so the kept set, its order and its
//! probabilities are bit-identical:
//! 1. one pass for the maximum (and the row's validation);
//! 2. one vectorised pass for `e_i`, `S` and `W` (exact: integers below
//!    `2^53` summed in f64), which also estimates (in f32)
//!    the mass within each tier end's depth below the maximum (7, 8.5, 10,
//!    12, 14, 20 nats: six compares and masked adds per 16 logits, a quarter
//!    of the pass; the head within 7 nats is gathered whole, since it holds
//!    few tokens and finer tiers there cost more in this pass than their
//!    tokens cost the walk);
//! 3. one pass gathers the tokens down to the first tier end whose estimate
//!    reaches `p · S` (a vectorised compare; only tokens that reach it are
//!    looked at one by one; a block of 64 logits whose maximum, from pass
//!    1, lies below the range is not read), and the exact running sum walks
//!    them: they are counting-sorted into buckets of 1/8 nat (linear in
//!    their number), and each bucket is sorted only when the walk gets
//!    there, so no comparison sort runs past the cut's bucket. When the
//!    exact walk has not reached the cut at the end of the gathered tokens
//!    (the estimate is only an estimate, or `min_keep` asks for more), one
//!    more pass gathers the next tier (or the rest of the current one) and
//!    the walk goes on; the result never depends on the estimate. When the
//!    first tier is a wide deep one (8.5 nats and deeper), its tokens are
//!    first counted per band (`narrowed_end`, again skipping the blocks
//!    wholly below the tier) and the first gather stops at the band where
//!    the estimated mass crosses.
//!
//! If the running sum never reaches `p` (the reference then keeps the whole
//! set) the caller falls back to the reference.

use sampler_core::TokenId;
use sampler_core::numerics::{
    CHUNK, LANES as SUM_LANES, add_to_lanes, combine, exp, exp_nonpos, fixed_weight,
    fixed_weight_f64, for_each_exp_chunk, nucleus_goal,
};

#[cfg(target_arch = "x86_64")]
use super::scan::compress_keys_avx512;
use super::scan::{
    Invalid, as_block, blocks, desc_key, key_id, key_row_logit, lane_mask, max_checked, set_bits,
};
use super::simd::{BLOCK, LANES};

/// The longest row whose fixed-point total the exp pass sums exactly.
const FIXED_ROW_MAX: usize = 1 << 22;

/// Buckets per nat below the maximum, for ordering the gathered head.
const PER_NAT: f32 = 8.0;
/// Buckets; the last one collects everything from 63.8125 nats below on.
const BUCKETS: usize = 512;
/// The tiers of the head: tier `t` holds the tokens of buckets
/// `TIER_LAST[t - 1] + 1 ..= TIER_LAST[t]` (7, 8.5, 10, 12, 14, 20 nats,
/// then the rest of the row, whose deeper tokens weigh at most `e^-20` of
/// the maximum each). The exp pass estimates the mass
/// within each tier's end; the walk starts by gathering every tier up to the
/// first whose estimate reaches the cut (or a band of it: `narrowed_end`),
/// in one pass, and gathers the rest of that tier or a deeper one (one more
/// pass each) only when the exact walk gets there.
const TIER_LAST: [usize; 7] = [56, 68, 80, 96, 112, 160, BUCKETS - 1];
const TIERS: usize = TIER_LAST.len();
/// Tier ends with a mass estimate (the last tier is the whole row).
const LEVELS: usize = TIERS - 1;
/// f32 lanes of the mass estimates.
const MASS_LANES: usize = 16;

/// The kept head of a nucleus cut: sorted (descending logit, ties by id),
/// with the reference's un-renormalised probabilities.
#[derive(Debug, Default)]
pub(crate) struct Nucleus {
    pub ids: Vec<TokenId>,
    pub logits: Vec<f32>,
    /// Empty when [`top_p_full`] was not asked for them.
    pub probs: Vec<f32>,
    /// The same set in ascending token id: `(id, logit)`.
    pub by_id: Vec<(TokenId, f32)>,
}

/// Reusable buffers for [`top_p_full`].
#[derive(Debug, Default)]
pub(crate) struct TopPScratch {
    /// The gathered tokens in id order ([`desc_key`]) and their buckets:
    /// the first walked range at the start, each deeper tier after it.
    keys: Vec<u64>,
    buckets: Vec<u16>,
    /// One range ordered by bucket (then sorted bucket by bucket).
    sorted: Vec<u64>,
    /// Bucket starts in `sorted`, and the next free slot of each.
    starts: Vec<u32>,
    next: Vec<u32>,
    /// The row's block maxima (the max pass).
    maxima: Vec<f32>,
    /// The walked bucket's exponentials and fixed-point weights.
    exps: Vec<f32>,
    weights: Vec<u32>,
}

/// The bucket of logit `l`: `(max - l) · PER_NAT` rounded to an integer and
/// clamped to the last bucket (a `-inf` logit lands there). Any
/// non-decreasing function of `max - l` works (the sorted order is then
/// bucket by bucket); this one is branch-free: adding 2^23 rounds a value in
/// `[0, 511]` to an integer held in the low mantissa bits.
#[inline(always)]
fn bucket(max: f32, l: f32) -> usize {
    let v = ((max - l) * PER_NAT).min((BUCKETS - 1) as f32);
    ((v + 8_388_608.0).to_bits() & (BUCKETS as u32 - 1)) as usize
}

/// The mass estimates' thresholds on `e = exp(l - max)`: level `j` counts
/// the `e` at or above `exp(-(TIER_LAST[j] + 0.5) / PER_NAT)`, about the
/// tokens of buckets `0..=TIER_LAST[j]` (only the walk's speed depends on
/// the estimate, never its result).
fn level_thresholds() -> [f32; LEVELS] {
    std::array::from_fn(|j| exp(-(TIER_LAST[j] as f32 + 0.5) / PER_NAT))
}

/// Pass 2: `S = Σ exp(l - max)` with the lane rule of `numerics::sum_f64`
/// (only when `with_sum`; 0 otherwise), the fixed-point total
/// `W = Σ fixed_weight(exp(l - max))` (exact), and per level `j` an f32
/// estimate of the mass at or above `thresholds[j]`.
/// On x86-64 with AVX-512F or AVX2 a copy of the same code compiled for it
/// runs (chosen at run time): the same operations in the same order, so the
/// same bits (tested below).
fn exp_sum_levels(
    row: &[f32],
    max: f32,
    thresholds: &[f32; LEVELS],
    with_sum: bool,
) -> (f64, f64, [f32; LEVELS]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe {
                if with_sum {
                    exp_sum_levels_avx512::<true>(row, max, thresholds)
                } else {
                    exp_sum_levels_avx512::<false>(row, max, thresholds)
                }
            };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe {
                if with_sum {
                    exp_sum_levels_avx2::<true>(row, max, thresholds)
                } else {
                    exp_sum_levels_avx2::<false>(row, max, thresholds)
                }
            };
        }
    }
    if with_sum {
        exp_sum_levels_body::<true>(row, max, thresholds)
    } else {
        exp_sum_levels_body::<false>(row, max, thresholds)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_sum_levels_avx512<const SUM: bool>(
    row: &[f32],
    max: f32,
    thresholds: &[f32; LEVELS],
) -> (f64, f64, [f32; LEVELS]) {
    exp_sum_levels_body::<SUM>(row, max, thresholds)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_sum_levels_avx2<const SUM: bool>(
    row: &[f32],
    max: f32,
    thresholds: &[f32; LEVELS],
) -> (f64, f64, [f32; LEVELS]) {
    exp_sum_levels_body::<SUM>(row, max, thresholds)
}

#[inline(always)]
fn exp_sum_levels_body<const SUM: bool>(
    row: &[f32],
    max: f32,
    thresholds: &[f32; LEVELS],
) -> (f64, f64, [f32; LEVELS]) {
    // The sum in the lanes of `numerics::sum_f64` (position mod its LANES;
    // a chunk starts at a multiple of them).
    const _: () = assert!(CHUNK.is_multiple_of(MASS_LANES) && CHUNK.is_multiple_of(SUM_LANES));
    let mut lanes = [0.0f64; SUM_LANES];
    let mut mass = [[0.0f32; MASS_LANES]; LEVELS];
    // Fixed-point weights are integers below 2^31: their f64 sums are exact.
    let mut fixed = [0.0f64; MASS_LANES];
    // `l - max <= 0` (a validated row, its maximum): `exp`'s bits. A padding
    // `-inf` gives 0, which adds nothing below.
    for_each_exp_chunk(
        row,
        max,
        #[inline(always)]
        |_, e, _| {
            // A chunk starts at a multiple of the lanes.
            if SUM {
                add_to_lanes(&mut lanes, e);
            }
            for block in e.as_chunks::<MASS_LANES>().0 {
                // A padding slot weighs `fixed_weight(0) = 0`.
                for (f, &x) in fixed.iter_mut().zip(block) {
                    *f += fixed_weight_f64(x);
                }
                // Written out level by level: as a loop, LLVM vectorises across
                // the levels (gathers and scatters) instead of across the lanes.
                macro_rules! levels {
                    ($($j:literal)*) => { $( add_at_or_above(&mut mass[$j], block, thresholds[$j]); )* };
                }
                const _: () = assert!(LEVELS == 6);
                levels!(0 1 2 3 4 5);
            }
        },
    );
    (
        combine(lanes),
        fixed.iter().sum(),
        mass.map(|m| m.iter().sum()),
    )
}

/// `acc[i] += e[i]` where `e[i] >= thr` (lane-wise, so it vectorises).
#[inline(always)]
fn add_at_or_above(acc: &mut [f32; MASS_LANES], e: &[f32; MASS_LANES], thr: f32) {
    for i in 0..MASS_LANES {
        acc[i] += if e[i] >= thr { e[i] } else { 0.0 };
    }
}

/// A bound below every logit of buckets `..=hi`: a logit more than
/// `hi + 1` buckets below the maximum has a bucket above `hi` (`-inf` when
/// `hi` is the last bucket, which holds everything deeper).
#[inline(always)]
fn reach(max: f32, hi: usize) -> f32 {
    if hi < BUCKETS - 1 {
        max - (hi + 1) as f32 / PER_NAT
    } else {
        f32::NEG_INFINITY
    }
}

/// Call `put(bucket, key)` for the logits of `chunk` (the row from position
/// `start`, at most 64 floats) whose bucket is in `lo..=hi`, in id order.
#[inline(always)]
fn gather_chunk(
    chunk: &[f32],
    start: usize,
    max: f32,
    lo: usize,
    hi: usize,
    mut put: impl FnMut(usize, u64),
) {
    // A float compare against `reach` finds a superset of the lanes (it
    // vectorises); only those are looked at one by one.
    let reach = reach(max, hi);
    let (blocks_of, tail) = blocks(chunk);
    for (b, block) in blocks_of.enumerate() {
        let block = as_block(block);
        let mask = lane_mask(block, |l| l >= reach);
        for j in set_bits(mask) {
            let k = bucket(max, block[j]);
            if k >= lo && k <= hi {
                put(k, desc_key(block[j], (start + b * LANES + j) as TokenId));
            }
        }
    }
    for (i, &l) in chunk.iter().enumerate().skip(tail) {
        let k = bucket(max, l);
        if k >= lo && k <= hi {
            put(k, desc_key(l, (start + i) as TokenId));
        }
    }
}

/// Gather the tokens of buckets `lo..=hi` of `row` in id order into `keys`
/// and `buckets` (appended). `maxima`: the maximum of each whole block of
/// [`BLOCK`] floats of the row, in order ([`max_checked`]'s); a block whose
/// maximum lies below [`reach`] holds none of the range and is not read
/// (rows whose nucleus lies within a few nats of the maximum skip most of
/// the row). With AVX-512F (checked at run time) each 16 floats' buckets are
/// computed in one vector and the hits compressed out (no token looked at
/// one by one); the same keys and buckets (tested below).
fn gather(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    lo: usize,
    hi: usize,
    keys: &mut Vec<u64>,
    buckets: &mut Vec<u16>,
) {
    debug_assert_eq!(maxima.len(), row.len() / BLOCK);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("popcnt") {
            // SAFETY: the CPU has AVX-512F and POPCNT (checked just above).
            unsafe { gather_avx512(row, maxima, max, lo, hi, keys, buckets) };
            return;
        }
    }
    gather_lanes(row, maxima, max, lo, hi, keys, buckets);
}

/// [`gather`] lane by lane (any CPU).
fn gather_lanes(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    lo: usize,
    hi: usize,
    keys: &mut Vec<u64>,
    buckets: &mut Vec<u16>,
) {
    let reach = reach(max, hi);
    for (c, chunk) in row.chunks(BLOCK).enumerate() {
        // The last, partial block has no maximum: it is read.
        if maxima.get(c).is_some_and(|&m| m < reach) {
            continue;
        }
        gather_chunk(chunk, c * BLOCK, max, lo, hi, |b, key| {
            keys.push(key);
            buckets.push(b as u16);
        });
    }
}

/// [`gather`] with AVX-512F: per 16 floats the buckets of [`bucket`] (the
/// same operations: `min((max - l) · PER_NAT, 511) + 2^23`, the integer in
/// the low bits), the lanes in `lo..=hi` compressed into `keys`
/// ([`compress_keys_avx512`]) and `buckets`, in the blocks whose maximum
/// reaches the range; the row's last `len % 16` floats lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
fn gather_avx512(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    lo: usize,
    hi: usize,
    keys: &mut Vec<u64>,
    buckets: &mut Vec<u16>,
) {
    use std::arch::x86_64::{
        _mm256_storeu_si256, _mm512_add_ps, _mm512_and_si512, _mm512_castps_si512,
        _mm512_cmpge_epi32_mask, _mm512_cmple_epi32_mask, _mm512_cvtepi32_epi16, _mm512_loadu_ps,
        _mm512_maskz_compress_epi32, _mm512_min_ps, _mm512_mul_ps, _mm512_set1_epi32,
        _mm512_set1_ps, _mm512_sub_ps,
    };
    const STEP: usize = 16;
    let full = row.len() - row.len() % STEP;
    let (lo_v, hi_v) = (_mm512_set1_epi32(lo as i32), _mm512_set1_epi32(hi as i32));
    let max_v = _mm512_set1_ps(max);
    let per_nat = _mm512_set1_ps(PER_NAT);
    let last = _mm512_set1_ps((BUCKETS - 1) as f32);
    let magic = _mm512_set1_ps(8_388_608.0);
    let low_bits = _mm512_set1_epi32(BUCKETS as i32 - 1);
    // A block whose maximum lies below `reach` holds no logit of the range
    // (as in `gather_lanes`): it is not read. After the whole blocks, the
    // whole vectors of the last, partial one.
    let reach = reach(max, hi);
    // Never more blocks than the row holds (the loads below rely on it).
    let maxima = &maxima[..maxima.len().min(row.len() / BLOCK)];
    let stretches = maxima
        .iter()
        .enumerate()
        .filter(|&(_, &m)| m >= reach)
        .map(|(blk, _)| (blk * BLOCK, (blk + 1) * BLOCK))
        .chain(std::iter::once((maxima.len() * BLOCK, full)));
    for (start, end) in stretches {
        // Room for every lane of this stretch, and one vector's overhang.
        keys.reserve(end - start + STEP);
        buckets.reserve(end - start + STEP);
        for at in (start..end).step_by(STEP) {
            // SAFETY: `at + 16 <= end <= full <= row.len()` (a block ends
            // by `maxima.len() · 64 <= full`, clamped above).
            let x = unsafe { _mm512_loadu_ps(row.as_ptr().add(at)) };
            let v = _mm512_min_ps(_mm512_mul_ps(_mm512_sub_ps(max_v, x), per_nat), last);
            let b = _mm512_and_si512(_mm512_castps_si512(_mm512_add_ps(v, magic)), low_bits);
            // No branch on the mask: in a block that reaches the range, a
            // fraction of the lanes hits at random, and a branch would
            // mispredict more than the stores cost.
            let mask = _mm512_cmpge_epi32_mask(b, lo_v) & _mm512_cmple_epi32_mask(b, hi_v);
            let blen = buckets.len();
            // SAFETY: AVX-512F and POPCNT (this function's); the reserve
            // above leaves room for 16 more keys.
            unsafe { compress_keys_avx512(x, at as TokenId, mask, keys) };
            let packed = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(mask, b));
            // SAFETY: as above, room for 16 more buckets; then exactly the
            // compressed lanes are counted in.
            unsafe {
                _mm256_storeu_si256(buckets.as_mut_ptr().add(blen).cast(), packed);
                buckets.set_len(blen + mask.count_ones() as usize);
            }
        }
    }
    for (i, &l) in row.iter().enumerate().skip(full) {
        let k = bucket(max, l);
        if k >= lo && k <= hi {
            keys.push(desc_key(l, i as TokenId));
            buckets.push(k as u16);
        }
    }
}

/// The first tier whose mass estimate reaches `target` with a margin for the
/// estimate's f32 rounding (the last tier, the whole row, when none does).
fn first_tier(mass: &[f32; LEVELS], target: f64) -> usize {
    mass.iter()
        .position(|&m| f64::from(m) >= target * (1.0 + 1e-3))
        .unwrap_or(TIERS - 1)
}

/// Bands a wide tier is split into by [`narrowed_end`].
const BANDS: usize = 8;
/// The first tier wide enough to narrow (8.5 - 10 nats and deeper; the last
/// tier, the rest of the row, is not narrowed).
const FIRST_WIDE: usize = 2;

/// Where the first gathered range should end when the estimate's tier
/// `start` is wide: the tier's buckets split into [`BANDS`] bands, the
/// tokens of each counted in one vectorised pass over the logits (no
/// exponentials), each band's mass estimated as its count times `e` three
/// quarters down the band, added to the mass estimate above the tier; the
/// end of the first band where that reaches `target` (the tier's end when
/// none does). `None` for the narrow tiers. Deep tiers hold most of the
/// row's tokens (a 2-nat tier 10 - 12 nats down holds about 40000 of a
/// heavy-tailed 151936-token row), so this saves gathering and sorting
/// most of them; the walk gathers the rest of the tier when the estimate
/// falls short, so only the speed depends on it.
fn narrowed_end(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    mass: &[f32; LEVELS],
    start: usize,
    target: f64,
) -> Option<usize> {
    if !(FIRST_WIDE..LEVELS).contains(&start) {
        return None;
    }
    let (b_lo, b_hi) = (TIER_LAST[start - 1] + 1, TIER_LAST[start]);
    let w = (b_hi - b_lo + 1).div_ceil(BANDS);
    let band_end = |j: usize| (b_lo + w * (j + 1) - 1).min(b_hi);
    // Depth (in buckets) limits: above the tier, then each band's end.
    let limits: [f32; BANDS + 1] = std::array::from_fn(|j| {
        if j == 0 {
            b_lo as f32 - 0.5
        } else {
            band_end(j - 1) as f32 + 0.5
        }
    });
    let counts = band_counts(row, maxima, max, &limits);
    let mut cum = f64::from(mass[start - 1]);
    for j in 0..BANDS {
        let n = counts[j + 1].saturating_sub(counts[j]);
        let depth = (limits[j] + 3.0 * limits[j + 1]) / 4.0;
        cum += f64::from(n) * f64::from(exp(-depth / PER_NAT));
        if cum >= target {
            return Some(band_end(j));
        }
    }
    Some(b_hi)
}

/// For each limit `d` (ascending), the logits with `(max - l) · PER_NAT < d`
/// (cumulative counts; vectorised, AVX-512F / AVX2 chosen at run time);
/// `maxima` as for [`gather`]: a block wholly at or past the last limit is
/// not read.
fn band_counts(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    limits: &[f32; BANDS + 1],
) -> [u32; BANDS + 1] {
    debug_assert_eq!(maxima.len(), row.len() / BLOCK);
    debug_assert!(limits.is_sorted());
    let maxima = &maxima[..maxima.len().min(row.len() / BLOCK)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { band_counts_avx512(row, maxima, max, limits) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { band_counts_avx2(row, maxima, max, limits) };
        }
    }
    band_counts_body(row, maxima, max, limits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn band_counts_avx512(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    limits: &[f32; BANDS + 1],
) -> [u32; BANDS + 1] {
    band_counts_body(row, maxima, max, limits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn band_counts_avx2(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    limits: &[f32; BANDS + 1],
) -> [u32; BANDS + 1] {
    band_counts_body(row, maxima, max, limits)
}

#[inline(always)]
fn band_counts_body(
    row: &[f32],
    maxima: &[f32],
    max: f32,
    limits: &[f32; BANDS + 1],
) -> [u32; BANDS + 1] {
    // Counts in f32 lanes (exact: at most 2^24 per lane), as the mass
    // estimates, which vectorise the same way.
    let mut acc = [[0.0f32; MASS_LANES]; BANDS + 1];
    // A block whose maximum `m` has `(max - m) · PER_NAT >= ` the last limit
    // counts in no band: every `l <= m` has a depth at least `m`'s (the same
    // roundings, monotone), so it is not read.
    let last = limits[BANDS];
    let (whole, _) = row.as_chunks::<BLOCK>();
    for (block, &m) in whole.iter().zip(maxima) {
        if (max - m) * PER_NAT < last {
            for c in block.as_chunks::<MASS_LANES>().0 {
                count_chunk(&mut acc, c, max, limits);
            }
        }
    }
    let (chunks, rest) = row[maxima.len() * BLOCK..].as_chunks::<MASS_LANES>();
    for c in chunks {
        count_chunk(&mut acc, c, max, limits);
    }
    let mut out = acc.map(|a| a.iter().sum::<f32>() as u32);
    for &l in rest {
        let d = (max - l) * PER_NAT;
        for (o, &lim) in out.iter_mut().zip(limits) {
            *o += u32::from(d < lim);
        }
    }
    out
}

/// [`band_counts_body`]'s counts of 16 logits.
#[inline(always)]
fn count_chunk(
    acc: &mut [[f32; MASS_LANES]; BANDS + 1],
    c: &[f32; MASS_LANES],
    max: f32,
    limits: &[f32; BANDS + 1],
) {
    let mut d = [0.0f32; MASS_LANES];
    for (di, &l) in d.iter_mut().zip(c) {
        *di = (max - l) * PER_NAT;
    }
    // Band by band (a loop over the bands vectorises across them).
    macro_rules! bands {
        ($($j:literal)*) => { $( count_below(&mut acc[$j], &d, limits[$j]); )* };
    }
    const _: () = assert!(BANDS == 8);
    bands!(0 1 2 3 4 5 6 7 8);
}

/// `acc[i] += 1` where `d[i] < limit` (lane-wise, so it vectorises).
#[inline(always)]
fn count_below(acc: &mut [f32; MASS_LANES], d: &[f32; MASS_LANES], limit: f32) {
    for i in 0..MASS_LANES {
        acc[i] += if d[i] < limit { 1.0 } else { 0.0 };
    }
}

/// Nucleus of the full row `[vocab]` (token id = position) into `out`
/// (cleared first; its buffers are reused), `false` when the reference must
/// decide (all `-inf`, a row longer than `2^22`, the running sum never
/// reaches `p`, or the cut keeps the whole row or a `-inf` candidate).
///
/// # Errors
/// [`Invalid`] for a row with NaN or `+inf`.
pub(crate) fn top_p_full(
    row: &[f32],
    p: f32,
    min_keep: usize,
    probs: bool,
    scratch: &mut TopPScratch,
    out: &mut Nucleus,
) -> Result<bool, Invalid> {
    top_p_from(row, p, min_keep, probs, scratch, None, out)
}

/// [`top_p_full`], the walk starting with the tiers up to `start` when given
/// (else the estimate's first): the tests check that every start gives the
/// same nucleus.
fn top_p_from(
    row: &[f32],
    p: f32,
    min_keep: usize,
    probs: bool,
    scratch: &mut TopPScratch,
    start: Option<usize>,
    out: &mut Nucleus,
) -> Result<bool, Invalid> {
    out.ids.clear();
    out.logits.clear();
    out.probs.clear();
    out.by_id.clear();
    let TopPScratch {
        keys,
        buckets,
        sorted,
        starts,
        next,
        maxima,
        exps,
        weights,
    } = scratch;
    let max = max_checked(row, maxima)?;
    // The fixed-point total is summed in f64, exact up to 2^53: at most
    // 2^22 weights of at most 2^31 (longer rows: the reference, in u64).
    if max == f32::NEG_INFINITY || row.is_empty() || row.len() > FIXED_ROW_MAX {
        return Ok(false);
    }
    keys.clear();
    buckets.clear();
    // Pass 2: exponentials and their f64 sum in id order (as the
    // reference's softmax), and the mass estimates per tier end.
    let (sum, fixed_total, mass) = exp_sum_levels(row, max, &level_thresholds(), probs);
    let inv = 1.0 / sum;
    // The estimates' target (only the walk's speed depends on it: without
    // `S`, `W` in units of the maximum's weight) and the rule's exact goal.
    let scale = if probs {
        sum
    } else {
        fixed_total / 2_147_483_648.0
    };
    let target = f64::from(p) * scale;
    let goal = nucleus_goal(p, fixed_total as u64);
    // The exact running sum in sorted order: range by range (the tiers up
    // to the estimate's first, then one tier at a time), bucket by bucket,
    // each bucket sorted only when the walk gets there.
    let mut cum = 0u64;
    let mut lo = 0;
    let start = start.unwrap_or_else(|| first_tier(&mass, target));
    // A wide tier's first range ends at the band where the mass crosses.
    let first = narrowed_end(row, maxima, max, &mass, start, target).unwrap_or(TIER_LAST[start]);
    let ends =
        std::iter::once(first).chain(TIER_LAST[start..].iter().copied().filter(|&h| h > first));
    for hi in ends {
        let from = keys.len();
        gather(row, maxima, max, lo, hi, keys, buckets);
        // Counting sort of the range by bucket.
        starts.clear();
        starts.resize(hi - lo + 2, 0);
        for &b in &buckets[from..] {
            starts[usize::from(b) - lo + 1] += 1;
        }
        for b in 0..=hi - lo {
            starts[b + 1] += starts[b];
        }
        sorted.clear();
        sorted.resize(keys.len() - from, 0);
        next.clear();
        next.extend_from_slice(starts);
        for (&k, &b) in keys[from..].iter().zip(&buckets[from..]) {
            let at = &mut next[usize::from(b) - lo];
            sorted[*at as usize] = k;
            *at += 1;
        }
        for b in 0..=hi - lo {
            let bucket_keys = &mut sorted[starts[b] as usize..starts[b + 1] as usize];
            bucket_keys.sort_unstable();
            // The bucket's tokens taken whole, their exponentials and
            // weights in one loop over them (it vectorises), then the walk
            // adds the weights; the tokens after the cut are dropped again.
            let base = out.ids.len();
            out.ids.extend(bucket_keys.iter().map(|&k| key_id(k)));
            out.logits
                .extend(bucket_keys.iter().map(|&k| key_row_logit(k, row)));
            exps.clear();
            exps.resize(bucket_keys.len(), 0.0);
            weights.clear();
            weights.resize(bucket_keys.len(), 0);
            for ((e, w), &l) in exps
                .iter_mut()
                .zip(weights.iter_mut())
                .zip(&out.logits[base..])
            {
                *e = exp_nonpos(l - max);
                *w = fixed_weight(*e);
            }
            for (j, (&w, &k)) in weights.iter().zip(bucket_keys.iter()).enumerate() {
                cum += u64::from(w);
                let kept = base + j + 1;
                if cum >= goal && kept >= min_keep {
                    out.ids.truncate(kept);
                    out.logits.truncate(kept);
                    if probs {
                        out.probs
                            .extend(exps[..=j].iter().map(|&e| (f64::from(e) * inv) as f32));
                    }
                    // A cut that reaches a `-inf` candidate (min_keep beyond
                    // the finite ones), or keeps the whole row, is left to
                    // the reference.
                    if kept >= row.len() || !out.logits[kept - 1].is_finite() {
                        return Ok(false);
                    }
                    // The kept set in id order: the ranges before this one
                    // whole, and this one up to the cut.
                    out.by_id.extend(
                        keys[..from]
                            .iter()
                            .chain(keys[from..].iter().filter(|&&key| key <= k))
                            .map(|&key| (key_id(key), key_row_logit(key, row))),
                    );
                    if from > 0 {
                        out.by_id.sort_unstable_by_key(|&(id, _)| id);
                    }
                    return Ok(true);
                }
            }
            if probs {
                out.probs
                    .extend(exps.iter().map(|&e| (f64::from(e) * inv) as f32));
            }
        }
        lo = hi + 1;
    }
    // The running sum never reached p: the reference keeps everything.
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift_row(len: usize, seed: u32, mut f: impl FnMut(usize, u32) -> f32) -> Vec<f32> {
        let mut x = seed;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f(i, x)
            })
            .collect()
    }

    /// The run-time dispatched pass (AVX-512F or AVX2 where the CPU has it),
    /// and every level the CPU has, give the baseline build's sum and mass
    /// bits; the sum is `numerics::sum_f64`'s and each mass estimate is
    /// close to the exact mass at or above its threshold.
    #[test]
    fn pass_two_is_the_same_on_every_level() {
        let thresholds = level_thresholds();
        for len in [1usize, 63, 64, 129, 5000, 151_936] {
            let row = xorshift_row(len, 0x9e37_79b9, |_, x| {
                if x.is_multiple_of(97) {
                    f32::NEG_INFINITY
                } else {
                    (x % 30_000) as f32 / 1000.0 - 20.0
                }
            });
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (sa, fa, ma) = exp_sum_levels(&row, max, &thresholds, true);
            let (s0, f0, m0) = exp_sum_levels(&row, max, &thresholds, false);
            assert_eq!((s0, f0 as u64), (0.0, fa as u64), "len {len}");
            assert_eq!(m0.map(f32::to_bits), ma.map(f32::to_bits), "len {len}");
            let (sb, fb, mb) = exp_sum_levels_body::<true>(&row, max, &thresholds);
            assert_eq!(sa.to_bits(), sb.to_bits(), "len {len}");
            let fixed: u64 = row
                .iter()
                .map(|&l| u64::from(fixed_weight(exp(l - max))))
                .sum();
            assert_eq!((fa as u64, fb as u64), (fixed, fixed), "len {len}");
            assert_eq!(ma.map(f32::to_bits), mb.map(f32::to_bits), "len {len}");
            let rule = sampler_core::numerics::sum_f64(row.iter().map(|&l| exp(l - max)));
            assert_eq!(sa.to_bits(), rule.to_bits(), "len {len}");
            for (j, &thr) in thresholds.iter().enumerate() {
                let exact: f64 = row
                    .iter()
                    .map(|&l| exp(l - max))
                    .filter(|&e| e >= thr)
                    .map(f64::from)
                    .sum();
                let got = f64::from(ma[j]);
                assert!(
                    (got - exact).abs() <= 1e-4 * exact + 1e-30,
                    "len {len} level {j}: {got} vs {exact}"
                );
                assert!(j == 0 || ma[j] >= ma[j - 1], "len {len} level {j}");
            }
            // Every level the CPU has, not only the one dispatch picks.
            #[cfg(target_arch = "x86_64")]
            for (level, has) in [
                ("avx2", std::is_x86_feature_detected!("avx2")),
                ("avx512f", std::is_x86_feature_detected!("avx512f")),
            ] {
                if has {
                    // SAFETY: the CPU has the level (checked above).
                    let (sc, fc, mc) = unsafe {
                        if level == "avx2" {
                            exp_sum_levels_avx2::<true>(&row, max, &thresholds)
                        } else {
                            exp_sum_levels_avx512::<true>(&row, max, &thresholds)
                        }
                    };
                    assert_eq!(sc.to_bits(), sb.to_bits(), "{level}, len {len}");
                    assert_eq!(fc as u64, fixed, "{level}, len {len}");
                    assert_eq!(
                        mc.map(f32::to_bits),
                        mb.map(f32::to_bits),
                        "{level}, len {len}"
                    );
                }
            }
        }
    }

    /// The gather of any bucket range (one tier or several, from bucket 0 or
    /// deeper, the last up to bucket 511 with `-inf` and huge magnitudes):
    /// exactly the tokens of its buckets, in id order, with their buckets.
    #[test]
    fn gather_takes_exactly_its_buckets() {
        let specials = [f32::NEG_INFINITY, -f32::MAX, -1e30, -0.0, 0.0];
        // Blocks left unread (their maximum below the range's reach).
        let mut skipped = 0;
        for (len, scale) in [
            (5usize, 40.0f32),
            (1000, 40.0),
            (20_001, 90.0),
            // Skipped blocks before a partial block and a scalar tail.
            (4096 + 37, 1e30),
        ] {
            let row = xorshift_row(len, 0x51ed_270b, |i, x| {
                if i % 37 == 5 {
                    specials[(x % 5) as usize]
                } else {
                    -((x % 10_000) as f32 / 10_000.0) * scale
                }
            });
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut maxima = Vec::new();
            assert_eq!(max_checked(&row, &mut maxima), Ok(max));
            let mut ranges: Vec<(usize, usize)> = (0..TIERS)
                .map(|t| (if t == 0 { 0 } else { TIER_LAST[t - 1] + 1 }, TIER_LAST[t]))
                .collect();
            ranges.extend(TIER_LAST.iter().map(|&hi| (0, hi)));
            for (lo, hi) in ranges {
                skipped += maxima.iter().filter(|&&m| m < reach(max, hi)).count();
                let (mut keys, mut buckets) = (Vec::new(), Vec::new());
                gather(&row, &maxima, max, lo, hi, &mut keys, &mut buckets);
                // The lane-by-lane path (the one without AVX-512F), appended
                // after a stale entry: the same tokens.
                let (mut lane_keys, mut lane_buckets) = (vec![7u64], vec![7u16]);
                gather_lanes(
                    &row,
                    &maxima,
                    max,
                    lo,
                    hi,
                    &mut lane_keys,
                    &mut lane_buckets,
                );
                assert_eq!(
                    (&lane_keys[1..], &lane_buckets[1..]),
                    (&keys[..], &buckets[..])
                );
                let want: Vec<usize> = (0..len)
                    .filter(|&i| (lo..=hi).contains(&bucket(max, row[i])))
                    .collect();
                let want_keys: Vec<u64> = want
                    .iter()
                    .map(|&i| desc_key(row[i], i as TokenId))
                    .collect();
                assert_eq!(
                    keys, want_keys,
                    "len {len} scale {scale} buckets {lo}..={hi}"
                );
                let want_buckets: Vec<u16> =
                    want.iter().map(|&i| bucket(max, row[i]) as u16).collect();
                assert_eq!(
                    buckets, want_buckets,
                    "len {len} scale {scale} buckets {lo}..={hi}"
                );
            }
        }
        assert!(skipped > 100, "skipped {skipped} blocks");
    }

    /// Cuts in every tier (p-driven in the first ones, `min_keep`-driven
    /// deeper), the walk started from the estimate's tier and from every
    /// other tier: the kernel decides (no fallback) and its nucleus is the
    /// reference stage's: ids, order, logits, probabilities, and the same set
    /// in id order.
    #[test]
    fn every_tier_holds_a_cut_that_matches_the_reference() {
        use sampler_core::{Candidates, ChainSpec, StageSpec};
        let vocab = 20_000;
        let mut hit = [0usize; TIERS];
        let mut scratch = TopPScratch::default();
        for c in [0.5f32, 0.8, 1.0, 1.3, 2.0, 3.0] {
            // -c·ln(rank), ranks scattered over ids: with c = 1 the mass is
            // spread evenly over the ~9.9 nats of depth.
            let row: Vec<f32> = (0..vocab)
                .map(|i| -c * ((((i * 7919 + 13) % vocab) + 1) as f32).ln())
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for p in [0.1f32, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99] {
                for min_keep in [1usize, 100, 1000, 5000, 12_000, 19_999] {
                    let spec = ChainSpec::new(vec![StageSpec::TopP { p, min_keep }], None);
                    let mut chain = crate::build_chain(&spec).unwrap();
                    let mut want = Candidates::from_logits(&row);
                    chain.apply_from(0, &mut want).unwrap();
                    let mut by_id: Vec<(TokenId, f32)> = want
                        .ids()
                        .iter()
                        .copied()
                        .zip(want.logits().iter().copied())
                        .collect();
                    by_id.sort_unstable_by_key(|&(id, _)| id);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    for start in std::iter::once(None).chain((0..TIERS).map(Some)) {
                        let at = format!("c {c} p {p} min_keep {min_keep} start {start:?}");
                        let mut got = Nucleus::default();
                        let decided =
                            top_p_from(&row, p, min_keep, true, &mut scratch, start, &mut got)
                                .unwrap();
                        assert!(decided, "{at}: the kernel fell back ({} kept)", want.len());
                        assert_eq!(got.ids, want.ids(), "{at}");
                        assert_eq!(bits(&got.logits), bits(want.logits()), "{at}");
                        assert_eq!(bits(&got.probs), bits(want.probs().unwrap()), "{at}");
                        assert_eq!(got.by_id, by_id, "{at}");
                        // Without the probabilities (the fused tail's call):
                        // the same set, its estimates from `W` instead of `S`.
                        let mut bare = Nucleus::default();
                        let decided =
                            top_p_from(&row, p, min_keep, false, &mut scratch, start, &mut bare)
                                .unwrap();
                        assert!(decided, "{at}: the kernel fell back without probabilities");
                        assert_eq!(bare.ids, got.ids, "{at}");
                        assert_eq!(bare.by_id, got.by_id, "{at}");
                        assert!(bare.probs.is_empty(), "{at}");
                        if start.is_none() {
                            let last = bucket(max, *got.logits.last().unwrap());
                            hit[TIER_LAST.iter().position(|&h| last <= h).unwrap()] += 1;
                        }
                    }
                }
            }
        }
        assert!(
            hit[..TIERS - 1].iter().all(|&n| n > 0),
            "cuts per tier: {hit:?}"
        );
    }

    /// On heavy-tailed rows whose cut lies deep (a wide tier), the first range
    /// ends inside the tier, at or past the cut (one gather), and the
    /// band counts are exact.
    #[test]
    fn a_wide_tier_is_narrowed_to_the_cut() {
        let vocab = 151_936;
        let mut narrowed = 0;
        let mut skipped = 0;
        for c in [0.9f32, 1.0, 1.1, 1.2] {
            let row: Vec<f32> = (0..vocab)
                .map(|i| -c * ((((i * 7919 + 13) % vocab) + 1) as f32).ln())
                .collect();
            let mut maxima = Vec::new();
            let max = max_checked(&row, &mut maxima).unwrap();
            for p in [0.8f32, 0.9, 0.95] {
                let (sum, _, mass) = exp_sum_levels(&row, max, &level_thresholds(), true);
                let target = f64::from(p) * sum;
                let start = first_tier(&mass, target);
                let mut got = Nucleus::default();
                assert!(
                    top_p_full(&row, p, 1, true, &mut TopPScratch::default(), &mut got).unwrap()
                );
                let cut = bucket(max, *got.logits.last().unwrap());
                let Some(end) = narrowed_end(&row, &maxima, max, &mass, start, target) else {
                    assert!(start < FIRST_WIDE, "c {c} p {p}: tier {start}");
                    continue;
                };
                assert!(
                    end >= cut && end <= TIER_LAST[start],
                    "c {c} p {p}: end {end} cut {cut}"
                );
                narrowed += usize::from(end < TIER_LAST[start]);
            }
            // Deep limits (no block skipped) and shallow ones (most blocks
            // lie wholly below the last and are skipped), over whole blocks
            // and with a partial last block.
            let deep = [3.0f32, 10.5, 40.0, 80.25, 100.0, 150.5, 200.0, 300.0, 600.0];
            let shallow = [1.0f32, 2.0, 4.5, 8.0, 16.0, 24.0, 32.0, 40.25, 48.0];
            for (len, limits) in [(vocab, deep), (vocab, shallow), (vocab - 36, shallow)] {
                let row = &row[..len];
                let mut maxima = Vec::new();
                let max = max_checked(row, &mut maxima).unwrap();
                let counts = band_counts(row, &maxima, max, &limits);
                for (j, &lim) in limits.iter().enumerate() {
                    let want = row.iter().filter(|&&l| (max - l) * PER_NAT < lim).count();
                    assert_eq!(counts[j] as usize, want, "c {c} len {len} limit {lim}");
                }
                skipped += maxima
                    .iter()
                    .filter(|&&m| (max - m) * PER_NAT >= limits[BANDS])
                    .count();
                assert_eq!(band_counts_body(row, &maxima, max, &limits), counts);
                #[cfg(target_arch = "x86_64")]
                {
                    if std::is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU has AVX2.
                        let got = unsafe { band_counts_avx2(row, &maxima, max, &limits) };
                        assert_eq!(got, counts);
                    }
                    if std::is_x86_feature_detected!("avx512f") {
                        // SAFETY: the CPU has AVX-512F.
                        let got = unsafe { band_counts_avx512(row, &maxima, max, &limits) };
                        assert_eq!(got, counts);
                    }
                }
            }
        }
        assert!(skipped > 1000, "skipped {skipped} blocks");
        assert!(narrowed >= 3, "narrowed {narrowed} first ranges");
    }

    /// On heavy-tailed rows the estimate's first tier is the cut's own (or
    /// the one before, when the cut lies within the estimate's margin): the
    /// walk gathers one range, not one per tier.
    #[test]
    fn the_estimate_starts_at_the_cut_tier() {
        let vocab = 32_000;
        for c in [1.1f32, 1.3, 1.5] {
            let row: Vec<f32> = (0..vocab)
                .map(|i| -c * ((((i * 7919 + 13) % vocab) + 1) as f32).ln())
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for p in [0.5f32, 0.8, 0.9, 0.95] {
                let (sum, _, mass) = exp_sum_levels(&row, max, &level_thresholds(), true);
                let start = first_tier(&mass, f64::from(p) * sum);
                let mut got = Nucleus::default();
                assert!(
                    top_p_full(&row, p, 1, true, &mut TopPScratch::default(), &mut got).unwrap()
                );
                let last = bucket(max, *got.logits.last().unwrap());
                let cut_tier = TIER_LAST.iter().position(|&h| last <= h).unwrap();
                assert!(
                    start == cut_tier || start == cut_tier + 1,
                    "c {c} p {p}: estimate tier {start}, cut in tier {cut_tier}"
                );
            }
        }
    }
}
