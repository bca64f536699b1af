//! Full-vocabulary `top_p` (nucleus) without a full sort.
//!
//! The reference (`stages::top_p`, llama.cpp semantics) computes
//! `e_i = exp(l_i - max)` in f32 and `S = Σ e_i` in f64 with the project's
//! numerics (`sampler_core::numerics`: its `exp`, lane sums in id order),
//! `p_i = (e_i · (1/S)) as f32`, sorts descending and keeps the shortest
//! prefix whose running sum (in f64, of the `e_i`) reaches `p · S` (and holds
//! `min_keep`).
//!
//! Here, with the same arithmetic, so the kept set, its order and its
//! probabilities are bit-identical:
//! 1. one pass for the maximum (and the row's validation);
//! 2. one vectorised pass for `e_i` and `S`, which also gathers the tokens
//!    within 10 nats of the maximum, in tiers by depth (5, 7, 8.5, 10 nats);
//! 3. the exact running sum walks the head tier by tier: each tier is
//!    counting-sorted into buckets of 1/8 nat (linear in its size), and each
//!    bucket is sorted only when the walk gets there, so no comparison sort
//!    runs past the cut's bucket, and no tier past the cut's is touched. A cut
//!    deeper than 10 nats (or a `min_keep` asking for more) gathers the next
//!    tier (14, 20, 28 nats, then the rest of the row) with one more pass and
//!    the walk goes on.
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
/// Buckets; the last one collects everything from 63.8125 nats below on.
const BUCKETS: usize = 512;
/// The tiers of the head: tier `t` holds the tokens of buckets
/// `TIER_LAST[t - 1] + 1 ..= TIER_LAST[t]` (5, 7, 8.5, 10, 14, 20, 28 nats,
/// then the rest of the row). Pass 2 gathers the first [`PASS2_TIERS`]; a
/// deeper one is gathered (one more pass over the row) only when the walk
/// gets there.
const TIER_LAST: [usize; 8] = [40, 56, 68, 80, 112, 160, 224, BUCKETS - 1];
const PASS2_TIERS: usize = 4;
const TIERS: usize = TIER_LAST.len();

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
    /// Per tier, the gathered tokens in id order: [`desc_key`] and bucket.
    tiers: [Tier; TIERS],
    /// One tier ordered by bucket (then sorted bucket by bucket).
    sorted: Vec<u64>,
    /// Bucket starts in `sorted`, and the next free slot of each.
    starts: Vec<u32>,
    next: Vec<u32>,
}

#[derive(Debug, Default)]
struct Tier {
    keys: Vec<u64>,
    buckets: Vec<u16>,
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

/// The tier of bucket `b` among the pass-2 tiers.
#[inline(always)]
fn pass2_tier(b: usize) -> usize {
    usize::from(b > TIER_LAST[0]) + usize::from(b > TIER_LAST[1]) + usize::from(b > TIER_LAST[2])
}

/// Pass 2: `Σ exp(l - max)` with the lane rule of `numerics::sum_f64`, and
/// the tokens of the first [`PASS2_TIERS`] tiers gathered into them in id
/// order. On x86-64 with AVX-512F or AVX2 a copy of the same code compiled
/// for it runs
/// (chosen at run time): the same operations in the same order, so the same
/// bits (tested below).
fn exp_sum_gather(row: &[f32], max: f32, tiers: &mut [Tier; TIERS]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_sum_gather_avx512(row, max, tiers) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exp_sum_gather_avx2(row, max, tiers) };
        }
    }
    exp_sum_gather_body(row, max, tiers)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_sum_gather_avx512(row: &[f32], max: f32, tiers: &mut [Tier; TIERS]) -> f64 {
    exp_sum_gather_body(row, max, tiers)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_sum_gather_avx2(row: &[f32], max: f32, tiers: &mut [Tier; TIERS]) -> f64 {
    exp_sum_gather_body(row, max, tiers)
}

#[inline(always)]
fn exp_sum_gather_body(row: &[f32], max: f32, tiers: &mut [Tier; TIERS]) -> f64 {
    // The sum in the lanes of `numerics::sum_f64` (position mod its LANES;
    // a chunk of 64 starts at a multiple of them).
    let mut lanes = [0.0f64; SUM_LANES];
    let mut e = [0.0f32; 64];
    let last = TIER_LAST[PASS2_TIERS - 1];
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
        gather_chunk(chunk, c * 64, max, 0, last, |b, key| {
            let t = &mut tiers[pass2_tier(b)];
            t.keys.push(key);
            t.buckets.push(b as u16);
        });
    }
    combine(lanes)
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
    // A logit more than `hi + 1` buckets below the maximum has a bucket
    // above `hi`: a float compare against `reach` finds a superset of the
    // lanes (it vectorises), and only a chunk whose maximum reaches it is
    // looked at lane by lane.
    let reach = if hi < BUCKETS - 1 {
        max - (hi + 1) as f32 / PER_NAT
    } else {
        f32::NEG_INFINITY
    };
    let (blocks_of, tail) = blocks(chunk);
    if hi < BUCKETS - 1 && tail == chunk.len() {
        let mut top = [f32::NEG_INFINITY; LANES];
        for block in blocks_of {
            for (t, &l) in top.iter_mut().zip(as_block(block)) {
                *t = if l > *t { l } else { *t };
            }
        }
        if !top.iter().any(|&t| t >= reach) {
            return;
        }
    }
    for (b, block) in chunk.chunks_exact(LANES).enumerate() {
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

/// Nucleus of the full row `[vocab]` (token id = position), or `None` when the
/// reference must decide (all `-inf`, the running sum never reaches `p`, or
/// the cut keeps the whole row or a `-inf` candidate).
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
    let TopPScratch {
        tiers,
        sorted,
        starts,
        next,
    } = scratch;
    for t in tiers.iter_mut() {
        t.keys.clear();
        t.buckets.clear();
    }
    // Pass 2: exponentials and their f64 sum in id order (as the
    // reference's softmax), gathering the head's first tiers.
    let sum = exp_sum_gather(row, max, tiers);
    let inv = 1.0 / sum;
    let target = f64::from(p) * sum;
    // The exact running sum in sorted order: tier by tier, bucket by
    // bucket, each bucket sorted only when the walk gets there.
    let mut out = Nucleus::default();
    let mut cum = 0.0f64;
    for t in 0..TIERS {
        let lo = if t == 0 { 0 } else { TIER_LAST[t - 1] + 1 };
        let hi = TIER_LAST[t];
        if t >= PASS2_TIERS {
            // A deeper tier: one more pass over the row.
            let tier = &mut tiers[t];
            for (c, chunk) in row.chunks(64).enumerate() {
                gather_chunk(chunk, c * 64, max, lo, hi, |b, key| {
                    tier.keys.push(key);
                    tier.buckets.push(b as u16);
                });
            }
        }
        let tier = &tiers[t];
        // Counting sort of the tier by bucket.
        starts.clear();
        starts.resize(hi - lo + 2, 0);
        for &b in &tier.buckets {
            starts[usize::from(b) - lo + 1] += 1;
        }
        for b in 0..=hi - lo {
            starts[b + 1] += starts[b];
        }
        sorted.clear();
        sorted.resize(tier.keys.len(), 0);
        next.clear();
        next.extend_from_slice(starts);
        for (&k, &b) in tier.keys.iter().zip(&tier.buckets) {
            let at = &mut next[usize::from(b) - lo];
            sorted[*at as usize] = k;
            *at += 1;
        }
        for b in 0..=hi - lo {
            let bucket_keys = &mut sorted[starts[b] as usize..starts[b + 1] as usize];
            bucket_keys.sort_unstable();
            for &k in bucket_keys.iter() {
                let id = key_id(k);
                let l = row[id as usize];
                let e = exp(l - max);
                out.ids.push(id);
                out.logits.push(l);
                out.probs.push((f64::from(e) * inv) as f32);
                cum += f64::from(e);
                if cum >= target && out.ids.len() >= min_keep {
                    // A cut that reaches a `-inf` candidate (min_keep beyond
                    // the finite ones), or keeps the whole row, is left to
                    // the reference.
                    if out.ids.len() >= row.len() || !l.is_finite() {
                        return Ok(None);
                    }
                    // The kept set in id order: the tiers before this one
                    // whole, and this one up to the cut.
                    for done in &tiers[..t] {
                        out.by_id.extend(
                            done.keys
                                .iter()
                                .map(|&key| (key_id(key), row[key_id(key) as usize])),
                        );
                    }
                    out.by_id.extend(
                        tier.keys
                            .iter()
                            .filter(|&&key| key <= k)
                            .map(|&key| (key_id(key), row[key_id(key) as usize])),
                    );
                    if t > 0 {
                        out.by_id.sort_unstable_by_key(|&(id, _)| id);
                    }
                    return Ok(Some(out));
                }
            }
        }
    }
    // The running sum never reached p: the reference keeps everything.
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run-time dispatched pass (AVX-512F or AVX2 where the CPU has it),
    /// and every level the CPU has, give the
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
            let mut a: [Tier; TIERS] = Default::default();
            let mut b: [Tier; TIERS] = Default::default();
            let sa = exp_sum_gather(&row, max, &mut a);
            let sb = exp_sum_gather_body(&row, max, &mut b);
            assert_eq!(sa.to_bits(), sb.to_bits(), "len {len}");
            let rule = sampler_core::numerics::sum_f64(row.iter().map(|&l| exp(l - max)));
            assert_eq!(sa.to_bits(), rule.to_bits(), "len {len}");
            // Every level the CPU has, not only the one dispatch picks.
            #[cfg(target_arch = "x86_64")]
            for (level, has) in [
                ("avx2", std::is_x86_feature_detected!("avx2")),
                ("avx512f", std::is_x86_feature_detected!("avx512f")),
            ] {
                if has {
                    let mut c: [Tier; TIERS] = Default::default();
                    // SAFETY: the CPU has the level (checked above).
                    let sc = unsafe {
                        if level == "avx2" {
                            exp_sum_gather_avx2(&row, max, &mut c)
                        } else {
                            exp_sum_gather_avx512(&row, max, &mut c)
                        }
                    };
                    assert_eq!(sc.to_bits(), sb.to_bits(), "{level}, len {len}");
                    for t in 0..PASS2_TIERS {
                        assert_eq!(c[t].keys, b[t].keys, "{level}, len {len} tier {t}");
                        assert_eq!(c[t].buckets, b[t].buckets, "{level}, len {len} tier {t}");
                    }
                }
            }
            // The gathered tiers: every logit of their buckets, in id order.
            for t in 0..PASS2_TIERS {
                let lo = if t == 0 { 0 } else { TIER_LAST[t - 1] + 1 };
                let want: Vec<u64> = (0..len)
                    .filter(|&i| (lo..=TIER_LAST[t]).contains(&bucket(max, row[i])))
                    .map(|i| desc_key(row[i], i as TokenId))
                    .collect();
                assert!(t > 0 || !want.is_empty(), "len {len}");
                assert_eq!(a[t].keys, want, "len {len} tier {t}");
                assert_eq!(b[t].keys, want, "len {len} tier {t}");
                let buckets: Vec<u16> = want
                    .iter()
                    .map(|&k| bucket(max, row[key_id(k) as usize]) as u16)
                    .collect();
                assert_eq!(a[t].buckets, buckets, "len {len} tier {t}");
            }
        }
    }

    /// The deeper tiers' gather (one more pass, `lo > 0`, the last up to
    /// bucket 511 with `-inf` and huge magnitudes): exactly the tokens of
    /// their buckets, in id order.
    #[test]
    fn deeper_tiers_gather_their_buckets() {
        let mut x = 0x51ed_270bu32;
        let specials = [f32::NEG_INFINITY, -f32::MAX, -1e30, -0.0, 0.0];
        for (len, scale) in [
            (5usize, 40.0f32),
            (1000, 40.0),
            (20_001, 90.0),
            (4096, 1e30),
        ] {
            let row: Vec<f32> = (0..len)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if i % 37 == 5 {
                        specials[(x % 5) as usize]
                    } else {
                        -((x % 10_000) as f32 / 10_000.0) * scale
                    }
                })
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for t in PASS2_TIERS..TIERS {
                let (lo, hi) = (TIER_LAST[t - 1] + 1, TIER_LAST[t]);
                let mut got = Tier::default();
                for (c, chunk) in row.chunks(64).enumerate() {
                    gather_chunk(chunk, c * 64, max, lo, hi, |b, key| {
                        got.keys.push(key);
                        got.buckets.push(b as u16);
                    });
                }
                let want: Vec<usize> = (0..len)
                    .filter(|&i| (lo..=hi).contains(&bucket(max, row[i])))
                    .collect();
                let keys: Vec<u64> = want
                    .iter()
                    .map(|&i| desc_key(row[i], i as TokenId))
                    .collect();
                assert_eq!(got.keys, keys, "len {len} scale {scale} tier {t}");
                let buckets: Vec<u16> = want.iter().map(|&i| bucket(max, row[i]) as u16).collect();
                assert_eq!(got.buckets, buckets, "len {len} scale {scale} tier {t}");
            }
        }
    }

    /// Cuts in every tier (p-driven in the first four, `min_keep`-driven
    /// beyond 10 nats): the kernel decides (no fallback) and its nucleus is
    /// the reference stage's: ids, order, logits, probabilities, and the same
    /// set in id order.
    #[test]
    fn every_tier_holds_a_cut_that_matches_the_reference() {
        use sampler_core::{Candidates, ChainSpec, StageSpec};
        let vocab = 20_000;
        let mut hit = [0usize; TIERS];
        let mut scratch = TopPScratch::default();
        for c in [0.8f32, 1.0, 1.3, 2.0, 3.0] {
            // -c·ln(rank), ranks scattered over ids: with c = 1 the mass is
            // spread evenly over the ~9.9 nats of depth.
            let row: Vec<f32> = (0..vocab)
                .map(|i| -c * ((((i * 7919 + 13) % vocab) + 1) as f32).ln())
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for p in [0.3f32, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99] {
                for min_keep in [1usize, 100, 1000, 5000, 12_000, 19_999] {
                    let at = format!("c {c} p {p} min_keep {min_keep}");
                    let spec = ChainSpec::new(vec![StageSpec::TopP { p, min_keep }], None);
                    let mut chain = crate::build_chain(&spec).unwrap();
                    let mut want = Candidates::from_logits(&row);
                    chain.apply_from(0, &mut want).unwrap();
                    let Some(got) = top_p_full(&row, p, min_keep, &mut scratch).unwrap() else {
                        panic!("{at}: the kernel fell back ({} kept)", want.len());
                    };
                    assert_eq!(got.ids, want.ids(), "{at}");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got.logits), bits(want.logits()), "{at}");
                    assert_eq!(bits(&got.probs), bits(want.probs().unwrap()), "{at}");
                    let mut by_id: Vec<(TokenId, f32)> = want
                        .ids()
                        .iter()
                        .copied()
                        .zip(want.logits().iter().copied())
                        .collect();
                    by_id.sort_unstable_by_key(|&(id, _)| id);
                    assert_eq!(got.by_id, by_id, "{at}");
                    let last = bucket(max, *got.logits.last().unwrap());
                    hit[TIER_LAST.iter().position(|&h| last <= h).unwrap()] += 1;
                }
            }
        }
        assert!(hit.iter().all(|&n| n > 0), "cuts per tier: {hit:?}");
    }
}
