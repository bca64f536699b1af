//! Full-vocabulary `top_p` (nucleus) without a full sort.
//!
//! The reference (`stages::top_p`, llama.cpp semantics) computes
//! `e_i = exp(l_i - max)` in f32, `S = Σ e_i` in f64 in id order,
//! `p_i = (e_i · (1/S)) as f32`, sorts descending and keeps the shortest
//! prefix whose f32 running sum reaches `p` (and holds `min_keep`).
//!
//! Here, with the same arithmetic, so the kept set, its order and its
//! probabilities are bit-identical:
//! 1. one pass for the maximum (and the row's validation);
//! 2. one pass for `e_i` and `S`, which also builds a histogram of the
//!    probability mass over logit buckets of 1/8 nat below the maximum;
//! 3. the histogram gives the bucket where the mass crosses `p`; one pass
//!    gathers the tokens of every bucket down to it (plus one bucket of
//!    margin for the f32 rounding of the running sum);
//! 4. only that head is sorted, and the exact f32 running sum finds the cut.
//!
//! If the cut is not inside the gathered head (a running sum that never
//! reaches `p`, or `min_keep` larger than the head) the caller falls back to
//! the reference.

use sampler_core::TokenId;

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
    mass: Vec<f64>,
    keys: Vec<u64>,
    sorted: Vec<u64>,
}

#[inline(always)]
fn bucket(max: f32, l: f32) -> usize {
    // `as` saturates: a -inf logit lands in the last bucket.
    (((max - l) * PER_NAT) as usize).min(BUCKETS - 1)
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
    // Pass 2: exponentials, their f64 sum in id order (as the reference's
    // softmax), and the mass per bucket (approximate; 4 interleaved
    // histograms so that neighbours in the same bucket do not serialise).
    let mass = &mut scratch.mass;
    mass.clear();
    mass.resize(4 * BUCKETS, 0.0);
    let mut sum = 0.0f64;
    let mut e = [0.0f32; 64];
    for chunk in row.chunks(64) {
        // The libm calls first, then the serial sum with no call inside.
        for (ei, &l) in e.iter_mut().zip(chunk) {
            *ei = (l - max).exp();
        }
        for (j, (&ei, &l)) in e.iter().zip(chunk).enumerate() {
            sum += f64::from(ei);
            mass[4 * bucket(max, l) + (j & 3)] += f64::from(ei);
        }
    }
    let inv = 1.0 / sum;
    // The bucket where the mass crosses p, plus one of margin.
    let mut cum = 0.0f64;
    let mut last = BUCKETS - 1;
    for (b, m) in mass.chunks_exact(4).enumerate() {
        cum += (m[0] + m[1] + m[2] + m[3]) * inv;
        if cum >= f64::from(p) {
            last = (b + 1).min(BUCKETS - 1);
            break;
        }
    }
    // Pass 3: gather the head (every bucket <= last).
    let keys = &mut scratch.keys;
    keys.clear();
    if last == BUCKETS - 1 {
        keys.extend(
            row.iter()
                .enumerate()
                .map(|(i, &l)| desc_key(l, i as TokenId)),
        );
    } else {
        // bucket(max, l) <= last  <=>  (max - l) * PER_NAT < last + 1.
        let lim = (last + 1) as f32;
        let (chunks, tail) = blocks(row);
        for (b, c) in chunks.enumerate() {
            let block = as_block(c);
            let mask = lane_mask(block, |l| (max - l) * PER_NAT < lim);
            for j in set_bits(mask) {
                keys.push(desc_key(block[j], (b * LANES + j) as TokenId));
            }
        }
        for (i, &l) in row.iter().enumerate().skip(tail) {
            if (max - l) * PER_NAT < lim {
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
    let mut cum = 0.0f32;
    let mut keep = None;
    for (i, &k) in sorted.iter().enumerate() {
        let id = key_id(k);
        let l = row[id as usize];
        let pi = (f64::from((l - max).exp()) * inv) as f32;
        out.ids.push(id);
        out.logits.push(l);
        out.probs.push(pi);
        cum += pi;
        if cum >= p && i + 1 >= min_keep {
            keep = Some(i + 1);
            break;
        }
    }
    match keep {
        Some(k) if k < row.len() => {
            let cut = sorted[k - 1];
            out.by_id.extend(
                keys.iter()
                    .filter(|&&key| key <= cut)
                    .map(|&key| (key_id(key), row[key_id(key) as usize])),
            );
            Ok(Some(out))
        }
        _ => Ok(None),
    }
}
