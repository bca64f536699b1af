//! The block scan under every pass-1 kernel, written for the vector width the
//! CPU has: AVX-512F or AVX2 on x86-64 (chosen at run time), the portable
//! loop elsewhere (SSE2 on the baseline x86-64 target, NEON on aarch64, both
//! through LLVM's auto-vectoriser).
//!
//! Every version computes the same thing: lane `j` of a block's maxima is
//! the running `if x > acc { x } else { acc }` over the block's floats
//! `j, j + 16, j + 32, j + 48`, from `-inf`, in that order (`maxps(x, acc)`
//! on x86-64 is exactly that select, NaN and signed zeros included); the
//! block's maximum is the largest lane plus `0.0` (so a zero maximum is
//! `+0.0` whichever zero a reduction tree met last). So the maxima bits and
//! the NaN flag are the same on every level (tested below), and so is
//! everything built on them.

/// Width of the vectorised compares (and of a block's lane maxima).
pub(crate) const LANES: usize = 16;

/// Floats per block of [`block_maxima`] (and of the scan kernels' pass 1).
pub(crate) const BLOCK: usize = 4 * LANES;

/// The maximum of each [`BLOCK`]-float block of `full` (a multiple of
/// [`BLOCK`] floats) into `maxima` (cleared first), with no branch per
/// block. Returns whether `full` holds a NaN (a NaN never wins a lane, so
/// the maxima hold none; a `+inf` shows up as a maximum).
#[inline]
pub(crate) fn block_maxima(full: &[f32], maxima: &mut Vec<f32>) -> bool {
    debug_assert_eq!(full.len() % BLOCK, 0);
    maxima.clear();
    maxima.resize(full.len() / BLOCK, 0.0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { maxima_avx512(full, maxima) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { maxima_avx2(full, maxima) };
        }
    }
    maxima_portable(full, maxima)
}

/// The portable version (auto-vectorised: SSE2 / NEON).
#[inline(always)]
fn maxima_portable(full: &[f32], maxima: &mut [f32]) -> bool {
    let mut nan = [false; LANES];
    for (blk, out) in full.chunks_exact(BLOCK).zip(maxima) {
        let mut acc = [f32::NEG_INFINITY; LANES];
        for c in blk.chunks_exact(LANES) {
            for j in 0..LANES {
                let x = c[j];
                nan[j] |= x.is_nan();
                acc[j] = if x > acc[j] { x } else { acc[j] };
            }
        }
        // A tree over the lanes (no NaN here; the order only decides which
        // zero wins, and `+ 0.0` makes that `+0.0`).
        let mut w = LANES / 2;
        while w > 0 {
            for j in 0..w {
                acc[j] = if acc[j + w] > acc[j] {
                    acc[j + w]
                } else {
                    acc[j]
                };
            }
            w /= 2;
        }
        *out = acc[0] + 0.0;
    }
    nan.iter().any(|&n| n)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn maxima_avx512(full: &[f32], maxima: &mut [f32]) -> bool {
    use std::arch::x86_64::{
        __m512, _CMP_UNORD_Q, _mm512_add_ps, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_max_ps,
        _mm512_permutexvar_ps, _mm512_reduce_max_ps, _mm512_set1_ps, _mm512_setr_epi32,
        _mm512_shuffle_f32x4, _mm512_shuffle_ps, _mm512_storeu_ps,
    };
    const _: () = assert!(LANES == 16 && BLOCK == 64);
    let mut nan = 0u16;
    // One block's 16 lane maxima.
    let lanes = |blk: &[f32], nan: &mut u16| {
        let p = blk.as_ptr();
        let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
        for q in 0..BLOCK / LANES {
            // SAFETY: `blk` holds BLOCK floats; this reads 16 of them.
            let x = unsafe { _mm512_loadu_ps(p.add(q * LANES)) };
            *nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            acc = _mm512_max_ps(x, acc);
        }
        acc
    };
    // Sixteen blocks at a time: their lane maxima reduced together, halving
    // the lanes per block at each of four steps (a 16 x 16 transpose with
    // `max`), so one vector holds the 16 block maxima.
    let groups = full.chunks_exact(16 * BLOCK);
    let rest = groups.remainder();
    let mut outs = maxima.chunks_exact_mut(16);
    // Block `4r + q` ends in lane `4q + r`: gather lane `b` from there.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // The steps below as functions of two vectors, and each step's arrays
    // as literals: `std::array::from_fn` here let LLVM keep the sixteen
    // accumulators on the stack in some builds (a reload through a half-width
    // load of each, which stalls store forwarding: the whole pass measured
    // 15-20 % slower at V = 151936), depending on how the crate's codegen
    // units fell; literals of SSA values stay in registers.
    let halves = |x: __m512, y: __m512| {
        _mm512_max_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    };
    let quarters = |x: __m512, y: __m512| {
        _mm512_max_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    };
    let pairs = |x: __m512, y: __m512| {
        _mm512_max_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    };
    for (group, out) in groups.zip(&mut outs) {
        let mut block = |i: usize| lanes(&group[i * BLOCK..][..BLOCK], &mut nan);
        #[rustfmt::skip]
        let a = [
            block(0), block(1), block(2), block(3), block(4), block(5), block(6), block(7),
            block(8), block(9), block(10), block(11), block(12), block(13), block(14), block(15),
        ];
        // Blocks 2i, 2i+1: 8 lanes each (128-bit quarters 0-1 and 2-3).
        let b = [
            halves(a[0], a[1]),
            halves(a[2], a[3]),
            halves(a[4], a[5]),
            halves(a[6], a[7]),
            halves(a[8], a[9]),
            halves(a[10], a[11]),
            halves(a[12], a[13]),
            halves(a[14], a[15]),
        ];
        // Blocks 4i..4i+4: 4 lanes each, one quarter per block.
        let c = [
            quarters(b[0], b[1]),
            quarters(b[2], b[3]),
            quarters(b[4], b[5]),
            quarters(b[6], b[7]),
        ];
        // Blocks 8i + q (lanes 0-1 of quarter q) and 8i + 4 + q (lanes 2-3).
        let d = [pairs(c[0], c[1]), pairs(c[2], c[3])];
        // Block 4r + q in lane r of quarter q.
        let e = _mm512_max_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(d[0], d[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(d[0], d[1]),
        );
        let m = _mm512_add_ps(_mm512_permutexvar_ps(order, e), _mm512_set1_ps(0.0));
        // SAFETY: `out` holds 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), m) };
    }
    for (blk, out) in rest.chunks_exact(BLOCK).zip(outs.into_remainder()) {
        *out = _mm512_reduce_max_ps(lanes(blk, &mut nan)) + 0.0;
    }
    nan != 0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn maxima_avx2(full: &[f32], maxima: &mut [f32]) -> bool {
    use std::arch::x86_64::{
        _CMP_UNORD_Q, _mm_cvtss_f32, _mm_max_ps, _mm_movehl_ps, _mm_shuffle_ps,
        _mm256_castps256_ps128, _mm256_cmp_ps, _mm256_extractf128_ps, _mm256_loadu_ps,
        _mm256_max_ps, _mm256_movemask_ps, _mm256_or_ps, _mm256_set1_ps, _mm256_setzero_ps,
    };
    const _: () = assert!(LANES == 16 && BLOCK == 64);
    let mut nan = _mm256_setzero_ps();
    for (blk, out) in full.chunks_exact(BLOCK).zip(maxima) {
        let p = blk.as_ptr();
        let mut lo = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut hi = lo;
        for q in 0..BLOCK / LANES {
            // SAFETY: `blk` holds BLOCK floats; this reads 16 of them.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_ps(p.add(q * LANES)),
                    _mm256_loadu_ps(p.add(q * LANES + 8)),
                )
            };
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y));
            lo = _mm256_max_ps(x, lo);
            hi = _mm256_max_ps(y, hi);
        }
        let v = _mm256_max_ps(lo, hi);
        let q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let d = _mm_max_ps(q, _mm_movehl_ps(q, q));
        *out = _mm_cvtss_f32(_mm_max_ps(d, _mm_shuffle_ps::<0b01>(d, d))) + 0.0;
    }
    _mm256_movemask_ps(nan) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level the CPU has gives the portable loop's maxima bits (a zero
    /// maximum always `+0.0`) and NaN flag, on rows with NaN, `-inf`, signed
    /// zeros and ties; each maximum is the block's.
    #[test]
    fn every_level_gives_the_same_maxima() {
        let mut x = 0x2545_f491u32;
        for (len, nan_at) in [
            (0usize, None),
            (64, None),
            (640, Some(300)),
            (64 * 500, None),
            (64 * 77, Some(64 * 76 + 63)),
            // A NaN inside the sixteen-block groups of the AVX-512F path.
            (64 * 40, Some(17)),
        ] {
            let mut row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    match x % 16 {
                        0 => f32::NEG_INFINITY,
                        1 => -0.0,
                        2 => 0.0,
                        3 => 1.5,
                        _ => (x % 4000) as f32 / 1000.0 - 2.5,
                    }
                })
                .collect();
            // A block whose maximum is a zero of both signs, one of `-0.0`
            // only, and one of `-inf` only.
            if len >= 4 * BLOCK {
                for (i, x) in row[BLOCK..3 * BLOCK].iter_mut().enumerate() {
                    *x = [-0.0, -1.0, 0.0, -0.0][i % 4];
                }
                for x in row[2 * BLOCK..3 * BLOCK].iter_mut().step_by(2) {
                    *x = -0.0;
                }
                row[3 * BLOCK..4 * BLOCK].fill(f32::NEG_INFINITY);
            }
            if let Some(i) = nan_at {
                row[i] = f32::NAN;
            }
            let mut want = vec![f32::NAN; 3];
            let nan = maxima_portable(&row, {
                want.resize(len / BLOCK, 0.0);
                &mut want
            });
            assert_eq!(nan, nan_at.is_some(), "len {len}");
            for (b, &m) in want.iter().enumerate() {
                let exact = row[b * BLOCK..(b + 1) * BLOCK]
                    .iter()
                    .copied()
                    .filter(|x| !x.is_nan())
                    .fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(m, exact, "len {len} block {b}");
                assert_ne!(m.to_bits(), (-0.0f32).to_bits(), "len {len} block {b}");
            }
            if len >= 4 * BLOCK {
                assert_eq!(
                    want[1..4].iter().map(|m| m.to_bits()).collect::<Vec<_>>(),
                    [0, 0, f32::NEG_INFINITY.to_bits()]
                );
            }
            let bits = |v: &[f32]| v.iter().map(|m| m.to_bits()).collect::<Vec<_>>();
            let mut got = vec![1.0; 7];
            assert_eq!(block_maxima(&row, &mut got), nan, "len {len}");
            assert_eq!(bits(&got), bits(&want), "len {len}");
            #[cfg(target_arch = "x86_64")]
            {
                let mut got = vec![f32::NAN; len / BLOCK];
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    assert_eq!(
                        unsafe { maxima_avx2(&row, &mut got) },
                        nan,
                        "avx2 len {len}"
                    );
                    assert_eq!(bits(&got), bits(&want), "avx2, len {len}");
                }
                if std::is_x86_feature_detected!("avx512f") {
                    got.fill(f32::NAN);
                    // SAFETY: the CPU has AVX-512F.
                    assert_eq!(
                        unsafe { maxima_avx512(&row, &mut got) },
                        nan,
                        "avx512 len {len}"
                    );
                    assert_eq!(bits(&got), bits(&want), "avx512f, len {len}");
                }
            }
        }
    }
}
