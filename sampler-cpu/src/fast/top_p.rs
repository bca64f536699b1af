//! Full-vocabulary `top_p` (nucleus) without a full sort.
//!
//! The reference (`stages::top_p`, llama.cpp semantics) computes
//! `e_i = exp(l_i - max)` in f32 and `S = Σ e_i` in f64 with the project's
//! numerics (`sampler_core::numerics`: its `exp`, lane sums in id order),
//! `p_i = (e_i · (1/S)) as f32`, sorts descending and keeps the shortest
//! prefix whose f32 running sum reaches `p` (and holds `min_keep`).
//!
//! Here, with the same arithmetic, so the kept set, its order and its
//! probabilities are bit-identical:
//! 1. one pass for the maximum (and the row's validation);
//! 2. one pass for `e_i` and `S`, which also counts the logits in buckets
//!    of 1/8 nat below the maximum;
//! 3. the counts estimate the bucket where the mass crosses `p`; one pass
//!    gathers the tokens of every bucket down to it (plus a margin; widened
//!    and gathered again if the exact cut lies further);
//! 4. only that head is sorted, and the exact f32 running sum finds the cut.
//!
//! If the running sum never reaches `p` (the reference then keeps the whole
//! set) the caller falls back to the reference.

use sampler_core::TokenId;
use sampler_core::numerics::{LANES as SUM_LANES, combine, exp};

use super::scan::{
    Invalid, LANES, as_block, blocks, desc_key, key_id, lane_mask, max_checked, set_bits,
};

/// Histogram buckets per nat below the maximum.
const PER_NAT: f32 = 8.0;
/// Buckets; the last one collects everything further than 64 nats below.
const BUCKETS: usize = 512;

/// The kept head of a nucleus cut: sorted (descending logit, ties by id),
/// with the reference's un-renormalised probabilities.
#[derive(Debug, Default)]
pub(crate) struct Nucleus {
    pub ids: Vec<TokenId>,
    pub logits: Vec<f32>,
    pub probs: Vec<f32>,
    /// The same set in ascending token id: `(id, logit)`.
    pub by_id: Vec<(TokenId, f32)>,
}

/// Reusable buffers for [`top_p_full`].
#[derive(Debug, Default)]
pub(crate) struct TopPScratch {
    counts: Vec<u32>,
    keys: Vec<u64>,
    sorted: Vec<u64>,
}

/// The bucket of logit `l`: `(max - l) · PER_NAT` rounded to an integer and
/// clamped to the last bucket (a `-inf` logit lands there). Any
/// non-decreasing function of `max - l` works (gathering `bucket <= last`
/// then takes a prefix of the sorted order); this one is branch-free and
/// vectorises: adding 2^23 rounds a value in `[0, 511]` to an integer held
/// in the low mantissa bits.
#[inline(always)]
fn bucket(max: f32, l: f32) -> usize {
    let v = ((max - l) * PER_NAT).min((BUCKETS - 1) as f32);
    ((v + 8_388_608.0).to_bits() & (BUCKETS as u32 - 1)) as usize
}

/// Pass 2: `Σ exp(l - max)` with the lane rule of `numerics::sum_f64`, and
/// the bucket counts (`counts`: `4 · BUCKETS`, zeroed). On x86-64 with AVX2
/// an AVX2 copy of the same code runs (chosen at run time): the same
/// operations in the same order, so the same bits (tested below).
fn exp_sum_histogram(row: &[f32], max: f32, counts: &mut [u32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { exp_sum_histogram_avx2(row, max, counts) };
    }
    exp_sum_histogram_body(row, max, counts)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_sum_histogram_avx2(row: &[f32], max: f32, counts: &mut [u32]) -> f64 {
    exp_sum_histogram_body(row, max, counts)
}

#[inline(always)]
fn exp_sum_histogram_body(row: &[f32], max: f32, counts: &mut [u32]) -> f64 {
    // The sum in the lanes of `numerics::sum_f64` (position mod its LANES;
    // a chunk of 64 starts at a multiple of them).
    let mut lanes = [0.0f64; SUM_LANES];
    let mut e = [0.0f32; 64];
    let mut bk = [0usize; 64];
    for chunk in row.chunks(64) {
        let n = chunk.len();
        for (ei, &l) in e.iter_mut().zip(chunk) {
            *ei = exp(l - max);
        }
        // Whole blocks with the lanes in registers; only the row's last
        // chunk has a partial block.
        let full = n - n % SUM_LANES;
        for block in e[..full].chunks_exact(SUM_LANES) {
            for (lane, &v) in lanes.iter_mut().zip(block) {
                *lane += f64::from(v);
            }
        }
        for (lane, &v) in lanes.iter_mut().zip(&e[full..n]) {
            *lane += f64::from(v);
        }
        for (b, &l) in bk.iter_mut().zip(chunk) {
            *b = bucket(max, l);
        }
        for (j, &b) in bk[..n].iter().enumerate() {
            counts[4 * b + (j & 3)] += 1;
        }
    }
    combine(lanes)
}

/// Nucleus of the full row `[vocab]` (token id = position), or `None` when the
/// reference must decide (all `-inf`, or the cut is not inside the head).
///
/// # Errors
/// [`Invalid`] for a row with NaN or `+inf`.
pub(crate) fn top_p_full(
    row: &[f32],
    p: f32,
    min_keep: usize,
    scratch: &mut TopPScratch,
) -> Result<Option<Nucleus>, Invalid> {
    let max = max_checked(row)?;
    if max == f32::NEG_INFINITY || row.is_empty() {
        return Ok(None);
    }
    // Pass 2: exponentials and their f64 sum in id order (as the
    // reference's softmax), and a count histogram of the logits over
    // buckets of 1/8 nat below the maximum (4 interleaved copies so that
    // neighbours in the same bucket do not serialise).
    let counts = &mut scratch.counts;
    counts.clear();
    counts.resize(4 * BUCKETS, 0);
    let sum = exp_sum_histogram(row, max, counts);
    let inv = 1.0 / sum;
    // The bucket where the estimated mass (count x the bucket's middle
    // exponential) crosses p, plus two of margin; widened below if the exact
    // running sum has not crossed within it.
    let mut est = 0.0f64;
    let mut last = BUCKETS - 1;
    for (b, c) in counts.chunks_exact(4).enumerate() {
        let n = f64::from(c[0] + c[1] + c[2] + c[3]);
        est += n * (-(b as f64) / f64::from(PER_NAT)).exp() * inv;
        if est >= f64::from(p) {
            last = (b + 2).min(BUCKETS - 1);
            break;
        }
    }
    loop {
        if let Some(nucleus) = head_cut(row, max, sum, p, min_keep, last, scratch) {
            return Ok(Some(nucleus));
        }
        if last == BUCKETS - 1 {
            // The running sum never reached p: the reference keeps everything.
            return Ok(None);
        }
        last = (last + 16).min(BUCKETS - 1);
    }
}

/// Gather every token of bucket `<= last` (a prefix of the sorted order),
/// sort only those, and find the reference's cut by the exact f32 running
/// sum. `None` if the cut is not inside.
fn head_cut(
    row: &[f32],
    max: f32,
    sum: f64,
    p: f32,
    min_keep: usize,
    last: usize,
    scratch: &mut TopPScratch,
) -> Option<Nucleus> {
    let keys = &mut scratch.keys;
    keys.clear();
    if last == BUCKETS - 1 {
        keys.extend(
            row.iter()
                .enumerate()
                .map(|(i, &l)| desc_key(l, i as TokenId)),
        );
    } else {
        let (chunks, tail) = blocks(row);
        for (b, c) in chunks.enumerate() {
            let block = as_block(c);
            let mask = lane_mask(block, |l| bucket(max, l) <= last);
            for j in set_bits(mask) {
                keys.push(desc_key(block[j], (b * LANES + j) as TokenId));
            }
        }
        for (i, &l) in row.iter().enumerate().skip(tail) {
            if bucket(max, l) <= last {
                keys.push(desc_key(l, i as TokenId));
            }
        }
    }
    // `keys` is in id order; sort a copy.
    let sorted = &mut scratch.sorted;
    sorted.clear();
    sorted.extend_from_slice(keys);
    sorted.sort_unstable();
    // The exact f32 running sum in sorted order.
    let mut out = Nucleus::default();
    let mut cum = 0.0f64;
    let mut keep = None;
    for (i, &k) in sorted.iter().enumerate() {
        let id = key_id(k);
        let l = row[id as usize];
        let e = exp(l - max);
        let pi = (f64::from(e) * (1.0 / sum)) as f32;
        out.ids.push(id);
        out.logits.push(l);
        out.probs.push(pi);
        cum += f64::from(e);
        if cum >= f64::from(p) * sum && i + 1 >= min_keep {
            keep = Some(i + 1);
            break;
        }
    }
    match keep {
        // A cut that reaches a `-inf` candidate (min_keep beyond the finite
        // ones) is left to the reference, which never keeps one.
        Some(k) if k < row.len() && out.logits[k - 1].is_finite() => {
            let cut = sorted[k - 1];
            out.by_id.extend(
                keys.iter()
                    .filter(|&&key| key <= cut)
                    .map(|&key| (key_id(key), row[key_id(key) as usize])),
            );
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run-time dispatched pass (AVX2 where the CPU has it) gives the
    /// baseline build's sum bits and counts.
    #[test]
    fn pass_two_is_the_same_on_every_level() {
        let mut x = 0x9e37_79b9u32;
        for len in [1usize, 63, 64, 129, 5000, 151_936] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if x.is_multiple_of(97) {
                        f32::NEG_INFINITY
                    } else {
                        (x % 30_000) as f32 / 1000.0 - 20.0
                    }
                })
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut a = vec![0u32; 4 * BUCKETS];
            let mut b = vec![0u32; 4 * BUCKETS];
            let sa = exp_sum_histogram(&row, max, &mut a);
            let sb = exp_sum_histogram_body(&row, max, &mut b);
            assert_eq!(sa.to_bits(), sb.to_bits(), "len {len}");
            assert_eq!(a, b, "len {len}");
            assert_eq!(a.iter().map(|&c| c as usize).sum::<usize>(), len);
        }
    }
}
