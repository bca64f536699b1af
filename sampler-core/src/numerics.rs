//! The project's softmax numerics: one exponential and one summation order,
//! used by the reference stages and by sampler-cpu's fast kernels alike, so
//! the two give bit-identical probabilities, and fast enough to run at
//! memory speed over a whole vocabulary.
//!
//! * [`exp`]: `e^x` in f32 by range reduction (`x = n·ln 2 + r`,
//!   `|r| <= ln 2 / 2`, `ln 2` split in two parts) and a degree-7 polynomial
//!   for `e^r`, scaled by `2^n` through the exponent bits. Plain f32
//!   multiplies and adds in a fixed order (Rust never fuses them into FMA),
//!   so every x86-64 level and aarch64 give the same bits, scalar or
//!   auto-vectorised. Error at most 2 ulp over `[-87.3, 88.7]` (1.18 ulp
//!   the worst in the tests' sweep against f64); `exp(x) = 0` below `-87.33` (where `e^x` is no
//!   longer a normal f32), `+inf` above `88.72`, `exp(-inf) = 0`, NaN stays
//!   NaN.
//! * [`sum_f64`]: the sum of f32 values in f64 in [`LANES`] lanes (value
//!   `i` goes to lane `i % LANES`), the lanes added as a fixed pairwise tree.
//!   Any implementation that follows this rule gets the same bits.

/// Lanes of [`sum_f64`].
pub const LANES: usize = 8;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n · LN2_HI` is exact for `|n| <= 128` (9
/// significant bits) and `LN2_HI + LN2_LO` is `ln 2` to f32 precision.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this `e^x` is not a normal f32.
const MIN_X: f32 = -87.336_55;
/// Above this `e^x` overflows.
const MAX_X: f32 = 88.722_83;

/// `x = n · ln 2 + r`: `n = round(x / ln 2)` by adding and subtracting
/// 1.5 · 2^23 (the integer is the difference of the bit patterns, no
/// float-to-int conversion; wrapping, as below the normal range the caller
/// discards it), `r` with `ln 2` in two parts.
#[inline(always)]
fn reduce(x: f32) -> (i32, f32) {
    let shifter = 12_582_912.0f32;
    let t = x * LOG2_E + shifter;
    let n = t - shifter;
    let ni = (t.to_bits() as i32).wrapping_sub(shifter.to_bits() as i32);
    (ni, (x - n * LN2_HI) - n * LN2_LO)
}

/// `e^r` on `|r| <= 0.3466`: Taylor to degree 7 in Horner form.
#[inline(always)]
fn exp_reduced(r: f32) -> f32 {
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    p * r + 1.0
}

/// `e^x` in f32 with the project's numerics (module docs): at most 2 ulp
/// from the exact value, the same bits on every platform.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Branch-free (selects only), so that loops over rows vectorise.
    let xc = x.clamp(MIN_X, MAX_X);
    let (ni, r) = reduce(xc);
    let p = exp_reduced(r);
    // 2^n through the exponent bits, in two halves (n in [-126, 128]).
    let half = ni >> 1;
    let scale_a = f32::from_bits(((half + 127) as u32) << 23);
    let scale_b = f32::from_bits(((ni - half + 127) as u32) << 23);
    let y = p * scale_a * scale_b;
    // The ends: 0 below the normal range, +inf above; NaN went through.
    let y = if x < MIN_X { 0.0 } else { y };
    if x > MAX_X { f32::INFINITY } else { y }
}

/// [`exp`] for `x <= 0` (`-inf` included; a softmax's `l - max`): the same
/// bits, with fewer operations (no upper clamp, one scale `2^n` instead of
/// two halves: for `n >= -126` the product rounds once either way, and no
/// lower clamp: below `-87.33` the result is 0 whatever the polynomial gave).
/// For `x > 0` or NaN the result is unspecified.
#[inline(always)]
pub fn exp_nonpos(x: f32) -> f32 {
    let (ni, r) = reduce(x);
    let p = exp_reduced(r);
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    let y = p * scale;
    if x < MIN_X { 0.0 } else { y }
}

/// The sum of `values` in f64, in [`LANES`] lanes combined as a fixed
/// pairwise tree (module docs).
pub fn sum_f64(values: impl IntoIterator<Item = f32>) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let mut it = values.into_iter();
    'outer: loop {
        for lane in &mut lanes {
            match it.next() {
                Some(v) => *lane += f64::from(v),
                None => break 'outer,
            }
        }
    }
    combine(lanes)
}

/// [`sum_f64`] of a slice (the same result, faster: whole blocks of
/// [`LANES`] values at a time).
pub fn sum_f64_slice(values: &[f32]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    add_to_lanes(&mut lanes, values);
    combine(lanes)
}

/// Add `values`, the row's values from a position that is a multiple of
/// [`LANES`], to their lanes of the [`sum_f64`] rule (value `i` of the
/// slice to lane `i % LANES`). Inlined into each caller, so that it
/// vectorises for the caller's instruction set.
#[inline(always)]
pub fn add_to_lanes(lanes: &mut [f64; LANES], values: &[f32]) {
    let blocks = values.chunks_exact(LANES);
    let rest = blocks.remainder();
    for block in blocks {
        for (lane, &v) in lanes.iter_mut().zip(block) {
            *lane += f64::from(v);
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(rest) {
        *lane += f64::from(v);
    }
}

/// [`add_to_lanes`] for values already in f64 (value `i` of the slice to
/// lane `i % LANES`).
#[inline(always)]
pub fn add_f64_to_lanes(lanes: &mut [f64; LANES], values: &[f64]) {
    let blocks = values.chunks_exact(LANES);
    let rest = blocks.remainder();
    for block in blocks {
        for (lane, &v) in lanes.iter_mut().zip(block) {
            *lane += v;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(rest) {
        *lane += v;
    }
}

/// Values per chunk of the vectorised passes over a row ([`for_each_exp_chunk`]).
pub const CHUNK: usize = 64;
const _: () = assert!(CHUNK.is_multiple_of(LANES));

/// Calls `f(chunk, n)` on `row`'s chunks of [`CHUNK`] values in order, `n`
/// the chunk's own length: the last, shorter chunk comes padded with `-inf`
/// (whose `exp(-inf - max)` is 0, and adding `+0.0` leaves a [`sum_f64`]
/// lane as it was: a lane starts at `+0.0` and is never `-0.0`). Every
/// chunk has a length the compiler sees, so the loops `f` runs over it
/// unroll and keep their lane sums in registers (with the last chunk's
/// length unknown in the loop, the AVX-512F exp-sum pass kept its lanes in
/// memory and ran about 30 % slower). Inlined into each caller, so that it
/// vectorises for the caller's instruction set; give `f` as an
/// `#[inline(always)]` closure: a closure is compiled without the caller's
/// target features, and one LLVM did not inline ran as SSE2 code, three
/// times slower (a chunk iterator chained from the two parts instead of two
/// calls was 50 % slower).
#[inline(always)]
fn for_each_chunk(row: &[f32], mut f: impl FnMut(&[f32; CHUNK], usize)) {
    let (chunks, rest) = row.as_chunks::<CHUNK>();
    for chunk in chunks {
        f(chunk, CHUNK);
    }
    if !rest.is_empty() {
        let mut padded = [f32::NEG_INFINITY; CHUNK];
        padded[..rest.len()].copy_from_slice(rest);
        f(&padded, rest.len());
    }
}

/// Calls `f(chunk, e, n)` on `row`'s chunks of [`CHUNK`] values in order,
/// with each chunk's exponentials and its own length `n` (the last, shorter
/// chunk padded with `-inf`, `for_each_chunk`),
/// `e[i] = exp(chunk[i] − max)` (as [`exp_nonpos`]: `max` is the row's
/// maximum), 0 for the padding, which adds `+0.0` to a [`sum_f64`] lane and
/// so leaves it as it was. Whole chunks keep a caller's lane sums in
/// registers. Give `f` as an `#[inline(always)]` closure: a closure is
/// compiled without the caller's target features, and one LLVM did not
/// inline ran as SSE2 code, three times slower.
#[inline(always)]
pub fn for_each_exp_chunk(
    row: &[f32],
    max: f32,
    mut f: impl FnMut(&[f32; CHUNK], &[f32; CHUNK], usize),
) {
    let mut e = [0.0f32; CHUNK];
    for_each_chunk(
        row,
        #[inline(always)]
        |chunk, n| {
            for (ei, &l) in e.iter_mut().zip(chunk) {
                *ei = exp_nonpos(l - max);
            }
            f(chunk, &e, n);
        },
    );
}

/// Lanes `[a0..a7]` -> `((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7))`.
#[inline]
pub fn combine(l: [f64; LANES]) -> f64 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// `Σ exp(l - max)` over `row` with the project's [`exp`] and the
/// [`sum_f64`] lane rule, in chunks so that it vectorises. `max` is the
/// row's maximum (no value lies above it): the terms are then computed with
/// [`exp_nonpos`], [`exp`]'s bits in fewer operations. On x86-64 with
/// AVX-512F or AVX2 it runs a copy of the same code compiled for it (chosen
/// at run time): the same operations in the same order, 16 or 8 floats at a
/// time instead of 4, so the same bits (tested).
pub fn exp_sum(row: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_sum_avx512(row, max) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exp_sum_avx2(row, max) };
        }
    }
    exp_sum_body(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_sum_avx512(row: &[f32], max: f32) -> f64 {
    exp_sum_body(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_sum_avx2(row: &[f32], max: f32) -> f64 {
    exp_sum_body(row, max)
}

#[inline(always)]
fn exp_sum_body(row: &[f32], max: f32) -> f64 {
    // Exponentials into a buffer (that loop vectorises), then the lane sums;
    // a chunk starts at a multiple of the lanes. A padding `-inf` adds 0.
    let mut lanes = [0.0f64; LANES];
    for_each_exp_chunk(
        row,
        max,
        #[inline(always)]
        |_, e, _| add_to_lanes(&mut lanes, e),
    );
    combine(lanes)
}

/// `(Σ e_i, Σ e_i · x_i)` with `x_i = l_i − max` and `e_i = exp(x_i)` (the
/// project's [`exp`]), the second over `e_i > 0` only, both with the
/// [`sum_f64`] lane rule (`f64(e_i) · f64(x_i)` for the second): the
/// softmax's normaliser `S` and what the entropy `H = ln S − Σ e x / S`
/// needs, in one pass without a logarithm per value. `max` is the row's
/// maximum, as for [`exp_sum`]. Vectorised and dispatched as [`exp_sum`]
/// (the same bits on every level; the first value is [`exp_sum`]'s).
pub fn exp_entropy_sums(row: &[f32], max: f32) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_entropy_sums_avx512(row, max) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exp_entropy_sums_avx2(row, max) };
        }
    }
    exp_entropy_sums_body(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_entropy_sums_avx512(row: &[f32], max: f32) -> (f64, f64) {
    exp_entropy_sums_body(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_entropy_sums_avx2(row: &[f32], max: f32) -> (f64, f64) {
    exp_entropy_sums_body(row, max)
}

#[inline(always)]
fn exp_entropy_sums_body(row: &[f32], max: f32) -> (f64, f64) {
    exp_entropy_sums_visit(row, max, |_, _| {})
}

/// [`exp_entropy_sums`]' pass (the same bits), calling `visit(chunk, e)`
/// on each chunk of the row in order (64 logits, the last one shorter) with
/// its exponentials, so that a kernel can take more from the same pass.
/// Inlined into each caller, so that it vectorises for the caller's
/// instruction set (the caller dispatches, as [`exp_entropy_sums`] does).
#[inline(always)]
pub fn exp_entropy_sums_visit(
    row: &[f32],
    max: f32,
    mut visit: impl FnMut(&[f32], &[f32]),
) -> (f64, f64) {
    let mut lanes_e = [0.0f64; LANES];
    let mut lanes_t = [0.0f64; LANES];
    let mut t = [0.0f64; CHUNK];
    for_each_exp_chunk(
        row,
        max,
        #[inline(always)]
        |chunk, e, n| {
            // The products in their own loop, so that the exponentials
            // vectorise at the f32 width (in one loop with the f64 products
            // they ran at half of it).
            for ((ti, &v), &l) in t.iter_mut().zip(e).zip(chunk) {
                // Adding 0.0 leaves a lane as skipping it would (a lane is
                // never -0.0 before: it starts at +0.0); so does a padding
                // `-inf`, whose `e` is 0.
                *ti = if v > 0.0 {
                    f64::from(v) * f64::from(l - max)
                } else {
                    0.0
                };
            }
            add_to_lanes(&mut lanes_e, e);
            add_f64_to_lanes(&mut lanes_t, &t);
            visit(&chunk[..n], &e[..n]);
        },
    );
    (combine(lanes_e), combine(lanes_t))
}

/// One unit of [`fixed_weight`]: the weight of `e = 1` (the row's maximum).
pub const FIXED_ONE: u32 = 1 << 31;

/// The fixed-point weight of a softmax term `e = exp(l - max)` in `[0, 1]`
/// for `top_p`'s cut: `trunc(fl(e·2^31 + 0.5))`, the integer nearest
/// `e·2^31` with the addition rounded to f32 as IEEE 754 rounds it (ties to
/// even), clamped to `[0, 2^31]` as a float before the conversion (NaN
/// weighs 0). A weight below `2^-32` of the maximum's is 0. Plain f32
/// operations on every device (`e·2^31` is exact), so the CPU and the
/// device kernels compute the same integer from the same `e`.
#[inline(always)]
pub fn fixed_weight(e: f32) -> u32 {
    let v = e * 2_147_483_648.0f32 + 0.5f32;
    let v = if v > 0.0 { v } else { 0.0 };
    let v = if v < 2_147_483_648.0f32 {
        v
    } else {
        2_147_483_648.0f32
    };
    v as u32
}

/// [`fixed_weight`] of an `e` in `[0, 1]` (a softmax term of a valid row)
/// as an f64 (exact: at most `2^31`), without the clamps, which change
/// nothing there (`fl(2^31 + 0.5) = 2^31`): three operations for a
/// vectorised pass. Sums of up to `2^22` of them stay below `2^53`, so
/// they are exact in f64 in any order.
#[inline(always)]
pub fn fixed_weight_f64(e: f32) -> f64 {
    debug_assert!((0.0..=1.0).contains(&e), "{e} outside [0, 1]");
    f64::from((e * 2_147_483_648.0f32 + 0.5f32).trunc())
}

/// A 64-bit total as the device kernels read it into f32: the high and
/// low 32-bit words each converted, then `hi·2^32 + lo` in f32.
fn wide_f32(total: u64) -> f32 {
    ((total >> 32) as u32 as f32) * 4_294_967_296.0f32 + (total as u32 as f32)
}

/// `floor(fl(x · wide_f32(total)))` for `x` in `[0, 1]`, at most `total`:
/// the fraction `x` of a fixed-point total, rounded through f32.
fn fraction_of(x: f32, total: u64) -> u64 {
    let v = x * wide_f32(total);
    let hi = (v / 4_294_967_296.0f32) as u32;
    let lo = (v - hi as f32 * 4_294_967_296.0f32) as u32;
    ((u64::from(hi) << 32) | u64::from(lo)).min(total)
}

/// `top_p`'s goal `G` for a fixed-point total `W = Σ fixed_weight(e_i)`
/// (exact, in any order): a candidate is kept while the fixed-point mass
/// before it (in sorted order) is `< G`, so the crossing candidate is
/// kept. For `p >= 1/2`, `G = W - floor(fl((1 - p)·W))` (`1 - p` is exact
/// there, and the small side keeps a tail of tiny weights that `p·W`
/// rounded to f32 would lose when `p` is within rounding of 1); below,
/// `G = floor(fl(p·W))`; `W` is read as [`wide_f32`] and `G <= W`. `p`
/// in `[0, 1)` (`p >= 1` is a no-op stage and never asks for a goal).
/// The CPU stage, the CPU fast path and the cubecl kernels all compute it
/// so, bit for bit.
pub fn nucleus_goal(p: f32, total: u64) -> u64 {
    if p >= 0.5 {
        total - fraction_of(1.0 - p, total)
    } else {
        fraction_of(p.max(0.0), total)
    }
}

/// Two biases of one token summed (a `logit_bias` list that names a token
/// more than once): `-inf` (a ban) wins over anything, `+inf` + `-inf`
/// included; otherwise the f32 sum saturated to `±f32::MAX`, so that
/// finite biases never ban a token nor make `+inf`. The CPU stage and the
/// device's dense table both sum with it.
pub fn add_bias(a: f32, b: f32) -> f32 {
    if a == f32::NEG_INFINITY || b == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    (a + b).clamp(-f32::MAX, f32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fixed_weight`: the maximum weighs `2^31`, nothing weighs more, a
    /// weight rounds to the nearest unit (within f32's rounding of the half),
    /// below `2^-32` of the maximum is 0, NaN is 0; the f64 form agrees.
    #[test]
    fn fixed_weights_round_to_units_of_two_to_the_minus_31() {
        assert_eq!(fixed_weight(1.0), FIXED_ONE);
        assert_eq!(fixed_weight(f32::INFINITY), FIXED_ONE);
        assert_eq!(fixed_weight(0.0), 0);
        assert_eq!(fixed_weight(f32::NAN), 0);
        assert_eq!(fixed_weight(0.5), 1 << 30);
        assert_eq!(fixed_weight(2f32.powi(-32)), 1);
        assert_eq!(fixed_weight(2f32.powi(-33)), 0);
        assert_eq!(fixed_weight(exp(-30.0)), 0);
        for e in [
            0.0f32,
            1.0,
            0.5,
            f32::from_bits(1),
            1.0 - f32::EPSILON / 2.0,
        ] {
            assert_eq!(fixed_weight_f64(e), f64::from(fixed_weight(e)), "{e}");
        }
        let mut x = 0x1357_9bdfu32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let e = exp(-((x % 40_000) as f32) / 1000.0);
            let w = fixed_weight(e);
            let exact = f64::from(e) * 2_147_483_648.0;
            assert!(
                (f64::from(w) - exact).abs() <= 0.5 + exact * 2f64.powi(-24),
                "{e}"
            );
            assert_eq!(fixed_weight_f64(e), f64::from(w), "{e}");
        }
    }

    /// `nucleus_goal` is `p·W` to f32 precision, never above `W`, on the
    /// small side for `p >= 1/2`: with `p` one f32 step below 1, a tail of
    /// tiny weights still counts (`W - G` is their share, not 0).
    #[test]
    fn nucleus_goal_is_p_of_the_total_to_f32_precision() {
        for total in [1u64 << 31, 3 << 31, 123_456_789_012, (1 << 49) - 7] {
            for p in [
                0.0f32, 1e-9, 0.1, 0.3, 0.4999, 0.5, 0.7, 0.9, 0.95, 0.99, 0.999_999,
            ] {
                let g = nucleus_goal(p, total);
                let exact = f64::from(p) * total as f64;
                assert!(g <= total, "p {p} total {total}");
                assert!(
                    (g as f64 - exact).abs() <= 1.0 + exact * 2f64.powi(-22),
                    "p {p} total {total}: {g} vs {exact}"
                );
            }
        }
        // Ten tokens at the maximum and 103 each about 7e-9 of it.
        let tiny = fixed_weight(exp(-18.8));
        assert!(tiny > 0);
        let total = 10 * u64::from(FIXED_ONE) + 103 * u64::from(tiny);
        let g = nucleus_goal(0.999_999_94, total);
        assert!(g > 10 * u64::from(FIXED_ONE), "the tail is lost: {g}");
        assert_eq!(nucleus_goal(0.0, total), 0);
    }

    /// `exp_entropy_sums` on every level gives the serial rule's bits.
    #[test]
    fn exp_entropy_sums_are_the_serial_rule() {
        let mut x = 0x2468_ace1u32;
        for len in [0usize, 1, 7, 63, 64, 65, 1000, 32_003] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    match x % 40 {
                        0 => f32::NEG_INFINITY,
                        1 => -200.0,
                        2 => -0.0,
                        _ => (x % 30_000) as f32 / 1000.0 - 20.0,
                    }
                })
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let max = if max.is_finite() { max } else { 0.0 };
            let mut lanes_e = [0.0f64; LANES];
            let mut lanes_t = [0.0f64; LANES];
            for (i, &l) in row.iter().enumerate() {
                let e = exp(l - max);
                lanes_e[i % LANES] += f64::from(e);
                if e > 0.0 {
                    lanes_t[i % LANES] += f64::from(e) * f64::from(l - max);
                }
            }
            let want = (combine(lanes_e).to_bits(), combine(lanes_t).to_bits());
            let got = exp_entropy_sums(&row, max);
            assert_eq!((got.0.to_bits(), got.1.to_bits()), want, "len {len}");
            let base = exp_entropy_sums_body(&row, max);
            assert_eq!((base.0.to_bits(), base.1.to_bits()), want, "len {len}");
            assert_eq!(got.0.to_bits(), exp_sum(&row, max).to_bits(), "len {len}");
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    let g = unsafe { exp_entropy_sums_avx2(&row, max) };
                    assert_eq!((g.0.to_bits(), g.1.to_bits()), want, "avx2");
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    let g = unsafe { exp_entropy_sums_avx512(&row, max) };
                    assert_eq!((g.0.to_bits(), g.1.to_bits()), want, "avx512f");
                }
            }
        }
    }

    /// The run-time dispatched `exp_sum` (AVX-512F or AVX2 where the CPU has it) gives
    /// the baseline build's bits, and follows the lane rule.
    #[test]
    fn exp_sum_is_the_same_on_every_level() {
        let mut x = 0x1234_5678u32;
        // Beyond the clamp too: -87.3 (the normal range's end), -100,
        // huge magnitudes, signed zeros, and a few positive arguments.
        let specials = [
            -87.3f32,
            -87.34,
            -100.0,
            -1e30,
            -f32::MAX,
            -0.0,
            0.0,
            3.5,
            f32::NEG_INFINITY,
        ];
        for len in [0usize, 1, 7, 63, 64, 65, 1000, 32_000] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    match x % 50 {
                        0 => f32::NEG_INFINITY,
                        1..=4 => specials[(x / 50) as usize % specials.len()],
                        _ => (x % 20_000) as f32 / 1000.0 - 15.0,
                    }
                })
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let max = if max.is_finite() { max } else { 0.0 };
            let base = exp_sum_body(&row, max);
            assert_eq!(exp_sum(&row, max).to_bits(), base.to_bits(), "len {len}");
            // Every level the CPU has, not only the one dispatch picks.
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    let got = unsafe { exp_sum_avx2(&row, max) };
                    assert_eq!(got.to_bits(), base.to_bits(), "avx2, len {len}");
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    let got = unsafe { exp_sum_avx512(&row, max) };
                    assert_eq!(got.to_bits(), base.to_bits(), "avx512f, len {len}");
                }
            }
            let rule = sum_f64(row.iter().map(|&l| exp(l - max)));
            assert_eq!(base.to_bits(), rule.to_bits(), "len {len}");
        }
        #[cfg(target_arch = "x86_64")]
        println!(
            "avx2 on this CPU: {}, avx512f: {}",
            std::is_x86_feature_detected!("avx2"),
            std::is_x86_feature_detected!("avx512f")
        );
    }

    /// ulp distance between an f32 result and the exact (f64) value.
    fn ulps(got: f32, exact: f64) -> f64 {
        let e = exact as f32;
        let ulp = f64::from(f32::from_bits(e.to_bits() + 1) - e);
        (f64::from(got) - exact).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0.0f64;
        let mut x = -87.3f32;
        while x < 88.7 {
            let d = ulps(exp(x), f64::from(x).exp());
            assert!(d <= 2.0, "exp({x}) = {} is {d} ulp off", exp(x));
            worst = worst.max(d);
            x += 0.000_731;
        }
        // Every f32 in [-1, 0] and around 0.
        let mut b = (-1.0f32).to_bits();
        while b > 0x8000_0000 {
            let x = f32::from_bits(b);
            assert!(ulps(exp(x), f64::from(x).exp()) <= 2.0, "{x}");
            b -= 97;
        }
        assert!(worst > 0.0);
    }

    /// `exp_nonpos` gives `exp`'s bits on every `x <= 0` tried: a sweep of
    /// `[-100, 0]`, every 61st f32 in `[-1, 0]`, the normal range's end, and
    /// the specials.
    #[test]
    fn exp_nonpos_is_exp() {
        let check = |x: f32| {
            assert_eq!(exp_nonpos(x).to_bits(), exp(x).to_bits(), "exp({x})");
        };
        let mut x = 0.0f32;
        while x > -100.0 {
            check(x);
            x -= 0.000_37;
        }
        let mut b = (-1.0f32).to_bits();
        while b > 0x8000_0000 {
            check(f32::from_bits(b));
            b -= 61;
        }
        let mut b = MIN_X.to_bits() - 5000;
        while b < MIN_X.to_bits() + 5000 {
            check(f32::from_bits(b));
            b += 1;
        }
        for x in [
            0.0,
            -0.0,
            f32::NEG_INFINITY,
            -f32::MAX,
            -1e30,
            -87.0,
            -f32::MIN_POSITIVE,
        ] {
            check(x);
        }
        // A NaN stays NaN (a row's `-inf - -inf`, `+inf - +inf`), as in `exp`:
        // the sums over such a row are NaN either way.
        for x in [f32::NAN, f32::NEG_INFINITY - f32::NEG_INFINITY] {
            assert!(exp_nonpos(x).is_nan(), "exp_nonpos({x})");
        }
    }

    #[test]
    fn exp_ends() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-90.0), 0.0);
        assert_eq!(exp(-1e30), 0.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-87.3) > 0.0 && exp(-87.3).is_normal());
        assert!(exp(88.7).is_finite());
    }

    /// The same bits on every platform: pinned outputs (computed once with
    /// this code; a platform or compiler that fuses or reorders operations
    /// would change them).
    #[test]
    fn exp_bits_are_pinned() {
        let cases: [(f32, u32); 8] = [
            (-0.5, 0x3f1b_4598),
            (-1.0, 0x3ebc_5ab2),
            (-std::f32::consts::LN_10, 0x3dcc_cccc),
            (-10.0, 0x383e_6bce),
            (-50.5, 0x1b0d_6cfa),
            (-87.0, 0x00b3_3687),
            (0.3, 0x3fac_c82c),
            (5.0, 0x4314_69c5),
        ];
        for (x, bits) in cases {
            assert_eq!(exp(x).to_bits(), bits, "exp({x}) = {:#x}", exp(x).to_bits());
        }
    }

    #[test]
    fn sums_follow_the_lane_rule() {
        let v: Vec<f32> = (0..1001).map(|i| ((i * 37) % 101) as f32 * 0.013).collect();
        let a = sum_f64(v.iter().copied());
        let b = sum_f64_slice(&v);
        assert_eq!(a.to_bits(), b.to_bits());
        let mut lanes = [0.0f64; LANES];
        for (i, &x) in v.iter().enumerate() {
            lanes[i % LANES] += f64::from(x);
        }
        assert_eq!(combine(lanes).to_bits(), a.to_bits());
        assert!((a - v.iter().map(|&x| f64::from(x)).sum::<f64>()).abs() < 1e-9);
        assert_eq!(sum_f64([]), 0.0);
    }
}
