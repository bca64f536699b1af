//! The inverse CDF walk of `dist` over a set in ascending token id, from
//! the block that holds the target instead of the set's start, with the
//! same token as the sequential walk.
//!
//! The reference walk (`stages::dist::dist_select`) adds the `e_i > 0` in
//! f64 one after the other and takes the first whose running sum reaches
//! `u·S`. Here the exp-sum pass also records the lane rule's running sum
//! (`sampler_core::numerics::sum_f64`, the lanes combined) at the start of
//! every [`BLOCK`]: `prefix[k]` sums the `e` before position `k·BLOCK`, in
//! another order than the walk's. The walk starts at the last block whose
//! prefix is below the target and goes on from that prefix.
//!
//! Why the token is the same: both running sums add nonnegative terms over
//! summation trees no deeper than `d = n + BLOCK + 16`, so each is within
//! `γ_d·Σe` (`γ_d ≈ d·2^-53`) of the exact sum at the same position, and
//! the two are within `δ = 4·d·2^-53·S` of each other. A candidate is taken
//! only when the sum before it is below `target - δ` and the sum after it
//! is at least `target + δ`: then the sequential sum is below the target
//! before it and reaches it at it, and, the sequential sums never
//! decreasing, no earlier candidate reaches it. When that is not proved
//! (the target within `δ` of a running sum, about `1e-10` of the mass at
//! `n = 151936`; or past the end, where the reference takes the last
//! candidate), the caller walks sequentially.

/// Positions per block of the prefix sums, a multiple of the exp chunks'
/// 64.
pub(crate) const BLOCK: usize = 1024;

/// The position where the sequential walk provably crosses `target` (see
/// the module docs), or `None` when that is not proved. `n`: the set's
/// size; `sum`: its normaliser `S`; `prefix`: the block prefix sums;
/// `fill(start, out)`: the `e` of positions `start..start + out.len()`;
/// `slack`: how far the walk's true target may lie from `target` (0 when
/// `target` is it), added to the bound.
pub(crate) fn certified_crossing(
    n: usize,
    target: f64,
    sum: f64,
    prefix: &[f64],
    slack: f64,
    mut fill: impl FnMut(usize, &mut [f32]),
) -> Option<usize> {
    if prefix.len() != n.div_ceil(BLOCK) || n == 0 || slack.is_nan() || slack < 0.0 {
        return None;
    }
    let depth = (n + BLOCK + 16) as f64;
    let delta = 4.0 * depth * (f64::EPSILON * 0.5) * sum + slack;
    // The last block whose prefix is below the target (prefix[0] = 0).
    let k = prefix.partition_point(|&p| p < target).saturating_sub(1);
    let start = k * BLOCK;
    let end = (start + BLOCK).min(n);
    let mut cum = prefix[k];
    let mut es = [0.0f32; 64];
    for chunk_start in (start..end).step_by(64) {
        let len = (end - chunk_start).min(64);
        fill(chunk_start, &mut es[..len]);
        for (i, &e) in es[..len].iter().enumerate() {
            if e > 0.0 {
                let before = cum;
                cum += f64::from(e);
                if cum >= target {
                    return (before + delta < target && cum - delta >= target)
                        .then_some(chunk_start + i);
                }
            }
        }
    }
    None
}

/// `e_i = exp(l_i - max)` (the project's `exp`, as `exp_nonpos`: `max` is
/// the row's maximum) into `e`, and their sum
/// with the lane rule (`sum_f64_slice`'s bits), recording the running sum
/// at the start of every [`BLOCK`] in `prefix`. Vectorised: on x86-64 the
/// AVX-512F or AVX2 copy of the same code, chosen at run time (the same
/// operations in the same order, so the same bits).
pub(crate) fn exp_into_with_prefix(
    logits: &[f32],
    max: f32,
    e: &mut [f32],
    prefix: &mut Vec<f64>,
) -> f64 {
    prefix.clear();
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_into_with_prefix_avx512(logits, max, e, prefix) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exp_into_with_prefix_avx2(logits, max, e, prefix) };
        }
    }
    exp_into_with_prefix_body(logits, max, e, prefix)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_into_with_prefix_avx512(
    logits: &[f32],
    max: f32,
    e: &mut [f32],
    prefix: &mut Vec<f64>,
) -> f64 {
    exp_into_with_prefix_body(logits, max, e, prefix)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_into_with_prefix_avx2(
    logits: &[f32],
    max: f32,
    e: &mut [f32],
    prefix: &mut Vec<f64>,
) -> f64 {
    exp_into_with_prefix_body(logits, max, e, prefix)
}

#[inline(always)]
fn exp_into_with_prefix_body(
    logits: &[f32],
    max: f32,
    e: &mut [f32],
    prefix: &mut Vec<f64>,
) -> f64 {
    use sampler_core::numerics::{LANES, add_to_lanes, combine, exp_nonpos};
    let mut lanes = [0.0f64; LANES];
    for (lb, eb) in logits.chunks(BLOCK).zip(e.chunks_mut(BLOCK)) {
        prefix.push(combine(lanes));
        for (lc, ec) in lb.chunks(64).zip(eb.chunks_mut(64)) {
            for (ei, &l) in ec.iter_mut().zip(lc) {
                *ei = exp_nonpos(l - max);
            }
            add_to_lanes(&mut lanes, ec);
        }
    }
    combine(lanes)
}

/// `p = (e · inv) as f32` in place (f64 product), vectorised as
/// [`exp_into_with_prefix`].
pub(crate) fn scale_in_place(p: &mut [f32], inv: f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { scale_in_place_avx512(p, inv) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { scale_in_place_avx2(p, inv) };
        }
    }
    scale_in_place_body(p, inv);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn scale_in_place_avx512(p: &mut [f32], inv: f64) {
    scale_in_place_body(p, inv);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scale_in_place_avx2(p: &mut [f32], inv: f64) {
    scale_in_place_body(p, inv);
}

#[inline(always)]
fn scale_in_place_body(p: &mut [f32], inv: f64) {
    for x in p {
        *x = (f64::from(*x) * inv) as f32;
    }
}

/// The largest value of a row without NaN (`-inf` for an empty one), in
/// vector lanes.
pub(crate) fn max_of(logits: &[f32]) -> f32 {
    const W: usize = 16;
    let mut acc = [f32::NEG_INFINITY; W];
    let chunks = logits.chunks_exact(W);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &l) in acc.iter_mut().zip(c) {
            *a = if l > *a { l } else { *a };
        }
    }
    acc.iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// Whether `ids` ascend strictly: or-ed compares over blocks (vectorised),
/// an early exit per block.
pub(crate) fn strictly_ascending(ids: &[u32]) -> bool {
    if ids.len() < 2 {
        return true;
    }
    let (a, b) = (&ids[..ids.len() - 1], &ids[1..]);
    a.chunks(1024)
        .zip(b.chunks(1024))
        .all(|(a, b)| a.iter().zip(b).fold(true, |ok, (x, y)| ok & (x < y)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_ascending_sees_every_pair() {
        assert!(strictly_ascending(&[]));
        assert!(strictly_ascending(&[7]));
        let up: Vec<u32> = (0..3000).map(|i| 2 * i + 1).collect();
        assert!(strictly_ascending(&up));
        for at in [0usize, 1, 1023, 1024, 1025, 2998] {
            let mut ids = up.clone();
            ids[at + 1] = ids[at]; // a tie is not ascending
            assert!(!strictly_ascending(&ids), "tie at {at}");
            let mut ids = up.clone();
            ids.swap(at, at + 1);
            assert!(!strictly_ascending(&ids), "swap at {at}");
        }
        assert!(!strictly_ascending(&[u32::MAX, 0]));
    }

    #[test]
    fn max_of_is_the_maximum() {
        for len in [0usize, 1, 15, 16, 17, 100] {
            let row: Vec<f32> = (0..len).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
            let want = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max_of(&row), want, "len {len}");
        }
        assert_eq!(max_of(&[f32::NEG_INFINITY, -f32::MAX]), -f32::MAX);
    }
}
