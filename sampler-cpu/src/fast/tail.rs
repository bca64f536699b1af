//! A fused `[temperature(t)] -> dist` tail over a survivor set, for
//! [`super::sample_row`]: the token the reference stages
//! (`stages::temperature` plain path, then `stages::dist::dist_select`) would
//! select, without building a `Candidates` or sorting ids.
//!
//! Same arithmetic as the reference: `l' = div_saturating(l, t)`;
//! `e_i = exp(l'_i - max)` in f32 and `S = Σ e_i` in f64 lanes over the
//! set's CURRENT order (`sampler_core::numerics`); the inverse CDF walks ascending token ids, accumulating `e_i` in
//! f64, and takes the first `e_i > 0` with `cum >= u·S` (else the last with
//! `e_i > 0`).

use sampler_core::{GREEDY_TEMPERATURE, SampleError, Sampler, StageSpec, TokenId};

use crate::util::div_saturating;

/// The tail of a chain after the fast lead stage, when it is exactly
/// (ignoring no-op stages) an optional plain temperature and a final `dist`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TempDist {
    /// Divide by this first (`None`: no temperature stage).
    pub t: Option<f32>,
    /// Index of the `dist` stage in the chain (its random lane).
    pub dist_at: usize,
}

/// Recognise the tail `stages[from..]`.
pub(crate) fn temp_dist_tail(stages: &[Box<dyn Sampler>], from: usize) -> Option<TempDist> {
    let mut t = None;
    let mut dist_at = None;
    for (i, s) in stages.iter().enumerate().skip(from) {
        if s.is_noop() {
            continue;
        }
        if dist_at.is_some() {
            return None;
        }
        match s.spec()? {
            StageSpec::Temperature {
                t: tt,
                dynatemp_range,
                ..
            } if t.is_none() && !(dynatemp_range > 0.0) && tt >= GREEDY_TEMPERATURE => {
                t = Some(tt);
            }
            StageSpec::Dist => dist_at = Some(i),
            _ => return None,
        }
    }
    dist_at.map(|dist_at| TempDist { t, dist_at })
}

#[inline(always)]
fn scaled(l: f32, t: Option<f32>) -> f32 {
    match t {
        Some(t) if t != 1.0 => div_saturating(l, t),
        _ => l,
    }
}

/// The token `dist` selects from a set given twice: `current`, its logits
/// in the set's order (for the normaliser), and `by_id` in ascending token
/// id (for the walk), both before the temperature. `u` in `[0, 1)`.
///
/// # Errors
/// [`SampleError::AllMasked`] when no candidate has positive probability.
pub(crate) fn temp_dist_token(
    current: &[f32],
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    u: f64,
) -> Result<TokenId, SampleError> {
    temp_dist_draw(current, by_id, t, u).map(|(token, _, _)| token)
}

/// [`temp_dist_token`], with the largest scaled logit and the normaliser
/// `S` it drew with (the token's probability is `exp(l - max) · (1/S)`).
///
/// # Errors
/// As [`temp_dist_token`].
pub(crate) fn temp_dist_draw(
    current: &[f32],
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    u: f64,
) -> Result<(TokenId, f32, f64), SampleError> {
    let t = t.filter(|&t| t != 1.0);
    let (max, sum) = max_exp_sum(current, t);
    if max == f32::NEG_INFINITY || max.is_nan() || !(sum > 0.0) {
        return Err(SampleError::AllMasked);
    }
    let token = walk(by_id, t, max, u * sum).ok_or(SampleError::AllMasked)?;
    Ok((token, max, sum))
}

/// The inverse CDF walk: ascending ids, `cum += e_i` (f64) over `e_i > 0`,
/// the first with `cum >= target`, else the last with `e_i > 0`. Chunks of
/// 64: their exponentials first (that loop vectorises; AVX-512F / AVX2
/// chosen at run time, the same bits), then the sequential sum.
fn walk(
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { walk_avx512(by_id, t, max, target) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { walk_avx2(by_id, t, max, target) };
        }
    }
    walk_body(by_id, t, max, target)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn walk_avx512(
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    walk_body(by_id, t, max, target)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn walk_avx2(
    by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    walk_body(by_id, t, max, target)
}

#[inline(always)]
fn walk_body(
    mut by_id: impl Iterator<Item = (TokenId, f32)>,
    t: Option<f32>,
    max: f32,
    target: f64,
) -> Option<TokenId> {
    const W: usize = 64;
    let mut ids = [0 as TokenId; W];
    let mut ls = [0.0f32; W];
    let mut es = [0.0f32; W];
    let mut cum = 0.0f64;
    let mut last = None;
    loop {
        let mut n = 0;
        for (id, l) in by_id.by_ref().take(W) {
            ids[n] = id;
            ls[n] = l;
            n += 1;
        }
        if n == 0 {
            return last;
        }
        match t {
            Some(t) => {
                for (e, &l) in es.iter_mut().zip(&ls) {
                    *e = e_of(l, Some(t), max);
                }
            }
            None => {
                for (e, &l) in es.iter_mut().zip(&ls) {
                    *e = e_of(l, None, max);
                }
            }
        }
        for (&id, &ei) in ids[..n].iter().zip(&es[..n]) {
            if ei > 0.0 {
                cum += f64::from(ei);
                last = Some(id);
                if cum >= target {
                    return Some(id);
                }
            }
        }
    }
}

/// `exp(scaled(l) - max)` as the reference computes it, NaN as 0. `max` is
/// the largest scaled logit, so the argument is `<= 0` (or NaN) and
/// `exp_nonpos` gives `exp`'s bits.
#[inline(always)]
fn e_of(l: f32, t: Option<f32>, max: f32) -> f32 {
    let e = sampler_core::numerics::exp_nonpos(scaled(l, t) - max);
    if e.is_nan() { 0.0 } else { e }
}

/// The largest scaled logit of `current` and `Σ e_i` over it with the lane
/// rule of `numerics::sum_f64`, in vector lanes (AVX-512F / AVX2 chosen at
/// run time: the same operations in the same order, so the same bits). The
/// maximum's sign of zero may differ from a serial fold; `e_i` does not
/// (`l - (±0)` is `l` for `l != 0`, and `exp(±0) = 1`).
fn max_exp_sum(current: &[f32], t: Option<f32>) -> (f32, f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { max_exp_sum_avx512(current, t) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { max_exp_sum_avx2(current, t) };
        }
    }
    max_exp_sum_body(current, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn max_exp_sum_avx512(current: &[f32], t: Option<f32>) -> (f32, f64) {
    max_exp_sum_body(current, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn max_exp_sum_avx2(current: &[f32], t: Option<f32>) -> (f32, f64) {
    max_exp_sum_body(current, t)
}

#[inline(always)]
fn max_exp_sum_body(current: &[f32], t: Option<f32>) -> (f32, f64) {
    use sampler_core::numerics::{LANES, add_to_lanes, combine};
    const W: usize = 16;
    let mut acc = [f32::NEG_INFINITY; W];
    let chunks = current.chunks_exact(W);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..W {
            acc[j] = acc[j].max(scaled(c[j], t));
        }
    }
    let max = acc
        .iter()
        .copied()
        .chain(rest.iter().map(|&l| scaled(l, t)))
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return (max, 0.0);
    }
    // Exponentials into a buffer (that loop vectorises), then the lane sums;
    // a chunk of 64 starts at a multiple of the lanes.
    let mut lanes = [0.0f64; LANES];
    let mut e = [0.0f32; 64];
    for chunk in current.chunks(64) {
        let n = chunk.len();
        for (ei, &l) in e.iter_mut().zip(chunk) {
            *ei = e_of(l, t, max);
        }
        add_to_lanes(&mut lanes, &e[..n]);
    }
    (max, combine(lanes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised normaliser (every level the CPU has) gives the serial
    /// rule's bits: `sum_f64` of `exp(scaled(l) - max)` in the set's order.
    #[test]
    fn the_normaliser_is_the_serial_rule() {
        let mut x = 0x1357_9bdfu32;
        for len in [1usize, 15, 16, 17, 64, 65, 1000, 5003] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    match x % 40 {
                        0 => f32::NEG_INFINITY,
                        1 => -0.0,
                        2 => 0.0,
                        3 => -f32::MAX,
                        4 => f32::MAX,
                        _ => (x % 20_000) as f32 / 500.0 - 20.0,
                    }
                })
                .collect();
            for t in [None, Some(0.7f32), Some(1e-30), Some(3.0)] {
                let serial_max = row
                    .iter()
                    .map(|&l| scaled(l, t))
                    .fold(f32::NEG_INFINITY, f32::max);
                let serial = sampler_core::numerics::sum_f64(row.iter().map(|&l| {
                    let e = sampler_core::numerics::exp(scaled(l, t) - serial_max);
                    if e.is_nan() { 0.0 } else { e }
                }));
                let (max, sum) = max_exp_sum(&row, t);
                assert_eq!(max, serial_max, "len {len} t {t:?}");
                assert_eq!(sum.to_bits(), serial.to_bits(), "len {len} t {t:?}");
                let (_, base) = max_exp_sum_body(&row, t);
                assert_eq!(base.to_bits(), serial.to_bits(), "len {len} t {t:?}");
                // Every level the CPU has, not only the one dispatch picks.
                #[cfg(target_arch = "x86_64")]
                {
                    if std::is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU has AVX2.
                        let (m, s) = unsafe { max_exp_sum_avx2(&row, t) };
                        assert_eq!((m, s.to_bits()), (serial_max, serial.to_bits()), "avx2");
                    }
                    if std::is_x86_feature_detected!("avx512f") {
                        // SAFETY: the CPU has AVX-512F.
                        let (m, s) = unsafe { max_exp_sum_avx512(&row, t) };
                        assert_eq!((m, s.to_bits()), (serial_max, serial.to_bits()), "avx512f");
                    }
                }
            }
        }
    }
}
