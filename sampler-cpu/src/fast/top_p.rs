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
//! 2. one vectorised pass for `e_i` and `S`, which also adds up (roughly,
//!    in f32) the mass within 1, 2, ..., 20 nats of the maximum;
//! 3. one pass gathers the tokens within the shallowest of those depths
//!    whose mass reaches `p` (a prefix of the sorted order);
//! 4. the head is ordered by buckets of 1/8 nat (a counting sort), and the
//!    exact running sum walks it bucket by bucket, sorting each bucket only
//!    when it gets there, so nothing past the cut is sorted. If the cut lies
//!    deeper than the head (the f32 estimate was a little high, or
//!    `min_keep` asks for more), the next depth is gathered.
//!
//! If the running sum never reaches `p` (the reference then keeps the whole
//! set) the caller falls back to the reference.

use sampler_core::TokenId;
use sampler_core::numerics::{LANES as SUM_LANES, combine, exp};

use super::scan::{
    Invalid, LANES, as_block, blocks, desc_key, key_id, lane_mask, max_checked, set_bits,
};

/// Buckets per nat below the maximum, for ordering the gathered head.
const PER_NAT: f32 = 8.0;
/// Buckets; the last one collects everything further than 64 nats below.
const BUCKETS: usize = 512;
/// Depths below the maximum (nats) of the heads gathered, shallowest first:
/// pass 2 gathers the first; a deeper one is gathered (the band below the
/// last) only when the cut lies deeper; past the last, the whole row.
const DEPTHS: [f32; 4] = [10.0, 14.0, 20.0, 28.0];

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
    /// The gathered head in id order, as [`desc_key`]s.
    keys: Vec<u64>,
    /// The head ordered by bucket (then sorted bucket by bucket).
    sorted: Vec<u64>,
    /// Bucket of each gathered key.
    bucket_of: Vec<u16>,
    /// Bucket starts in `sorted` (`BUCKETS + 1`).
    starts: Vec<u32>,
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

/// Pass 2: `Σ exp(l - max)` with the lane rule of `numerics::sum_f64`, and
/// the [`desc_key`]s of the logits `>= floor` appended to `keys` in id
/// order. On x86-64 with AVX2 a copy of the same code compiled
/// for it runs (chosen at run time): the same operations in the same order,
/// so the same bits (tested below).
fn exp_sum_gather(row: &[f32], max: f32, floor: f32, keys: &mut Vec<u64>) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exp_sum_gather_avx2(row, max, floor, keys) };
        }
    }
    exp_sum_gather_body(row, max, floor, keys)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_sum_gather_avx2(row: &[f32], max: f32, floor: f32, keys: &mut Vec<u64>) -> f64 {
    exp_sum_gather_body(row, max, floor, keys)
}

#[inline(always)]
fn exp_sum_gather_body(row: &[f32], max: f32, floor: f32, keys: &mut Vec<u64>) -> f64 {
    // The sum in the lanes of `numerics::sum_f64` (position mod its LANES;
    // a chunk of 64 starts at a multiple of them).
    let mut lanes = [0.0f64; SUM_LANES];
    let mut e = [0.0f32; 64];
    for (c, chunk) in row.chunks(64).enumerate() {
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
        gather_band(chunk, c * 64, floor, f32::INFINITY, keys);
    }
    combine(lanes)
}

/// Append the [`desc_key`]s of the logits `l` of `part` (the row from
/// position `start`) with `floor <= l < ceil`, in id order.
#[inline(always)]
fn gather_band(part: &[f32], start: usize, floor: f32, ceil: f32, keys: &mut Vec<u64>) {
    for (c, chunk) in part.chunks(4 * LANES).enumerate() {
        // Only a chunk whose maximum reaches the floor is looked at lane by
        // lane (the maximum vectorises; the lane test is the rare path).
        let mut top = [f32::NEG_INFINITY; LANES];
        let (blocks_of, tail) = blocks(chunk);
        for block in blocks_of {
            for (t, &l) in top.iter_mut().zip(as_block(block)) {
                *t = if l > *t { l } else { *t };
            }
        }
        if tail == chunk.len() && !top.iter().any(|&t| t >= floor) {
            continue;
        }
        let at = start + c * 4 * LANES;
        for (b, block) in chunk.chunks_exact(LANES).enumerate() {
            let block = as_block(block);
            let mask = lane_mask(block, |l| l >= floor && l < ceil);
            for j in set_bits(mask) {
                keys.push(desc_key(block[j], (at + b * LANES + j) as TokenId));
            }
        }
        for (i, &l) in chunk.iter().enumerate().skip(tail) {
            if l >= floor && l < ceil {
                keys.push(desc_key(l, (at + i) as TokenId));
            }
        }
    }
}

/// Nucleus of the full row `[vocab]` (token id = position), or `None` when the
/// reference must decide (all `-inf`, or the running sum never reaches `p`).
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
    // reference's softmax), gathering the head within the first depth.
    scratch.keys.clear();
    let mut floor = max - DEPTHS[0];
    let sum = exp_sum_gather(row, max, floor, &mut scratch.keys);
    let mut depth = 0;
    loop {
        if let Some(mut nucleus) = head_cut(row, max, sum, p, min_keep, scratch) {
            if depth > 0 {
                // Bands were appended after the first: back to id order.
                nucleus.by_id.sort_unstable_by_key(|&(id, _)| id);
            }
            return Ok(Some(nucleus));
        }
        if floor == f32::NEG_INFINITY {
            // The running sum never reached p: the reference keeps everything.
            return Ok(None);
        }
        // The cut lies deeper (or min_keep asks for more): the next band.
        depth += 1;
        let next = DEPTHS.get(depth).map_or(f32::NEG_INFINITY, |&d| max - d);
        gather_band(row, 0, next, floor, &mut scratch.keys);
        floor = next;
    }
}

/// Order the gathered head (`scratch.keys`, every token with logit at or
/// above some floor: a prefix of the sorted order) bucket by bucket, sort
/// each bucket only when the running sum gets there, and find the
/// reference's cut by the exact running sum. `None` if the cut is not
/// inside.
fn head_cut(
    row: &[f32],
    max: f32,
    sum: f64,
    p: f32,
    min_keep: usize,
    scratch: &mut TopPScratch,
) -> Option<Nucleus> {
    let TopPScratch {
        keys,
        sorted,
        bucket_of,
        starts,
    } = scratch;
    // Counting sort by bucket (a non-increasing function of the logit, so
    // the canonical order is bucket by bucket).
    starts.clear();
    starts.resize(BUCKETS + 1, 0);
    bucket_of.clear();
    bucket_of.extend(keys.iter().map(|&k| {
        let b = bucket(max, row[key_id(k) as usize]);
        starts[b + 1] += 1;
        b as u16
    }));
    for b in 0..BUCKETS {
        starts[b + 1] += starts[b];
    }
    sorted.clear();
    sorted.resize(keys.len(), 0);
    let mut next: [u32; BUCKETS] = std::array::from_fn(|b| starts[b]);
    for (&k, &b) in keys.iter().zip(bucket_of.iter()) {
        let at = &mut next[usize::from(b)];
        sorted[*at as usize] = k;
        *at += 1;
    }
    // The exact running sum in sorted order, sorting one bucket at a time.
    let mut out = Nucleus::default();
    let inv = 1.0 / sum;
    let target = f64::from(p) * sum;
    let mut cum = 0.0f64;
    let mut keep = None;
    'walk: for b in 0..BUCKETS {
        let (lo, hi) = (starts[b] as usize, starts[b + 1] as usize);
        let bucket_keys = &mut sorted[lo..hi];
        bucket_keys.sort_unstable();
        for (j, &k) in bucket_keys.iter().enumerate() {
            let id = key_id(k);
            let l = row[id as usize];
            let e = exp(l - max);
            out.ids.push(id);
            out.logits.push(l);
            out.probs.push((f64::from(e) * inv) as f32);
            cum += f64::from(e);
            if cum >= target && lo + j + 1 >= min_keep {
                keep = Some(lo + j + 1);
                break 'walk;
            }
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
    /// baseline build's sum bits and the same head.
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
            let floor = max - DEPTHS[0];
            let (mut ka, mut kb) = (Vec::new(), Vec::new());
            let sa = exp_sum_gather(&row, max, floor, &mut ka);
            let sb = exp_sum_gather_body(&row, max, floor, &mut kb);
            assert_eq!(sa.to_bits(), sb.to_bits(), "len {len}");
            let rule = sampler_core::numerics::sum_f64(row.iter().map(|&l| exp(l - max)));
            assert_eq!(sa.to_bits(), rule.to_bits(), "len {len}");
            // The gathered head: every logit at or above the floor, in id order.
            let head: Vec<u64> = (0..len)
                .filter(|&i| row[i] >= floor)
                .map(|i| desc_key(row[i], i as TokenId))
                .collect();
            assert_eq!(ka, head, "len {len}");
            assert_eq!(kb, head, "len {len}");
        }
    }
}
