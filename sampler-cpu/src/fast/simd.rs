//! The block scan under every pass-1 kernel, written for the vector width the
//! CPU has: AVX-512F or AVX2 on x86-64 (chosen at run time), the portable
//! loop elsewhere (SSE2 on the baseline x86-64 target, NEON on aarch64, both
//! through LLVM's auto-vectoriser).
//!
//! Every version computes the same thing: lane `j` of a block's maxima is
//! the running `if x > acc { x } else { acc }` over the block's floats
//! `j, j + 16, j + 32, j + 48`, from `-inf`, in that order (`maxps(x, acc)`
//! on x86-64 is exactly that select, NaN and signed zeros included). So the
//! blocks reported, their maxima bits and the NaN flag are the same on every
//! level (tested below), and so is everything built on them.

use super::scan::{BLOCK, LANES};

/// Scan `full` (a multiple of [`BLOCK`] floats) block by block. For each
/// block `b` with a lane maximum `>= thr`, call `thr = on_block(b, max)`
/// with the block's maximum `max` (the running threshold: a block whose 16
/// lane maxima are all below it is skipped without a horizontal reduction).
/// Returns whether `full` holds a NaN (a NaN never wins a lane, so the
/// maxima hold none).
///
/// The block maximum is canonical: `+0.0` where the largest value is a
/// zero of either sign (a reduction tree may meet the two zeros in any
/// order), so it is the same on every level.
#[inline]
pub(crate) fn scan_blocks<F: FnMut(usize, f32) -> f32>(
    full: &[f32],
    thr: f32,
    mut on_block: F,
) -> bool {
    debug_assert_eq!(full.len() % BLOCK, 0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { scan_avx512(full, thr, &mut on_block) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { scan_avx2(full, thr, &mut on_block) };
        }
    }
    scan_portable(full, thr, &mut on_block)
}

/// The portable version (auto-vectorised: SSE2 / NEON).
#[inline(always)]
fn scan_portable<F: FnMut(usize, f32) -> f32>(
    full: &[f32],
    mut thr: f32,
    on_block: &mut F,
) -> bool {
    let mut nan = [false; LANES];
    for (b, blk) in full.chunks_exact(BLOCK).enumerate() {
        let mut acc = [f32::NEG_INFINITY; LANES];
        for c in blk.chunks_exact(LANES) {
            for j in 0..LANES {
                let x = c[j];
                nan[j] |= x.is_nan();
                acc[j] = if x > acc[j] { x } else { acc[j] };
            }
        }
        if acc.iter().fold(false, |a, &x| a | (x >= thr)) {
            let m = acc
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            thr = on_block(b, m + 0.0);
        }
    }
    nan.iter().any(|&n| n)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn scan_avx512<F: FnMut(usize, f32) -> f32>(full: &[f32], thr: f32, on_block: &mut F) -> bool {
    use std::arch::x86_64::{
        _CMP_GE_OQ, _CMP_UNORD_Q, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_max_ps,
        _mm512_reduce_max_ps, _mm512_set1_ps,
    };
    const _: () = assert!(LANES == 16 && BLOCK == 64);
    let mut nan = 0u16;
    let mut t = _mm512_set1_ps(thr);
    for (b, blk) in full.chunks_exact(BLOCK).enumerate() {
        let p = blk.as_ptr();
        let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
        for q in 0..BLOCK / LANES {
            // SAFETY: `blk` holds BLOCK floats; this reads 16 of them.
            let x = unsafe { _mm512_loadu_ps(p.add(q * LANES)) };
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            acc = _mm512_max_ps(x, acc);
        }
        if _mm512_cmp_ps_mask::<_CMP_GE_OQ>(acc, t) != 0 {
            t = _mm512_set1_ps(on_block(b, _mm512_reduce_max_ps(acc) + 0.0));
        }
    }
    nan != 0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scan_avx2<F: FnMut(usize, f32) -> f32>(full: &[f32], thr: f32, on_block: &mut F) -> bool {
    use std::arch::x86_64::{
        _CMP_GE_OQ, _CMP_UNORD_Q, _mm256_cmp_ps, _mm256_loadu_ps, _mm256_max_ps,
        _mm256_movemask_ps, _mm256_or_ps, _mm256_set1_ps, _mm256_setzero_ps,
    };
    const _: () = assert!(LANES == 16 && BLOCK == 64);
    let mut nan = _mm256_setzero_ps();
    let mut t = _mm256_set1_ps(thr);
    for (b, blk) in full.chunks_exact(BLOCK).enumerate() {
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
        let reach = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(lo, t),
            _mm256_cmp_ps::<_CMP_GE_OQ>(hi, t),
        );
        if _mm256_movemask_ps(reach) != 0 {
            t = _mm256_set1_ps(on_block(b, hmax256(_mm256_max_ps(lo, hi)) + 0.0));
        }
    }
    _mm256_movemask_ps(nan) != 0
}

/// The largest of the 8 lanes (no NaN among them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn hmax256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::{
        _mm_cvtss_f32, _mm_max_ps, _mm_movehl_ps, _mm_shuffle_ps, _mm256_castps256_ps128,
        _mm256_extractf128_ps,
    };
    let q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let d = _mm_max_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_max_ps(d, _mm_shuffle_ps::<0b01>(d, d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a scan reported: every call's block and maximum bits, the NaN flag.
    type Trace = (Vec<(usize, u32)>, bool);

    /// A running threshold like the top-k one: the 3rd largest block maximum
    /// so far (`-inf` until three blocks were seen).
    fn run(
        scan: impl FnOnce(&[f32], f32, &mut dyn FnMut(usize, f32) -> f32) -> bool,
        row: &[f32],
    ) -> Trace {
        let mut calls = Vec::new();
        let mut best: Vec<f32> = Vec::new();
        let nan = scan(row, f32::NEG_INFINITY, &mut |b, m| {
            calls.push((b, m.to_bits()));
            let block = &row[b * BLOCK..(b + 1) * BLOCK];
            let want = block
                .iter()
                .copied()
                .filter(|x| !x.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(m, want, "block {b}");
            assert_ne!(m.to_bits(), (-0.0f32).to_bits(), "block {b}");
            best.push(m);
            best.sort_by(|a, b| b.total_cmp(a));
            best.truncate(3);
            if best.len() == 3 {
                best[2]
            } else {
                f32::NEG_INFINITY
            }
        });
        (calls, nan)
    }

    /// Every level the CPU has reports the portable loop's blocks, maximum
    /// bits (a zero maximum always `+0.0`) and NaN flag, on rows with NaN,
    /// `-inf`, signed zeros and ties.
    #[test]
    fn every_level_scans_the_same() {
        let mut x = 0x2545_f491u32;
        for (len, nan_at) in [
            (64usize, None),
            (640, Some(300)),
            (64 * 500, None),
            (64 * 77, Some(64 * 76 + 63)),
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
            // A block whose maximum is a zero of both signs, and one of
            // `-0.0` only.
            if len >= 3 * BLOCK {
                for (i, x) in row[BLOCK..3 * BLOCK].iter_mut().enumerate() {
                    *x = [-0.0, -1.0, 0.0, -0.0][i % 4];
                }
                for x in row[2 * BLOCK..3 * BLOCK].iter_mut().step_by(2) {
                    *x = -0.0;
                }
            }
            if let Some(i) = nan_at {
                row[i] = f32::NAN;
            }
            let want = run(|r, t, f| scan_portable(r, t, &mut |b, m| f(b, m)), &row);
            assert!(!want.0.is_empty());
            if len >= 3 * BLOCK {
                let zero = 0.0f32.to_bits();
                assert!(want.0.contains(&(1, zero)) && want.0.contains(&(2, zero)));
            }
            assert_eq!(want.1, nan_at.is_some(), "len {len}");
            assert_eq!(run(|r, t, f| scan_blocks(r, t, f), &row), want, "len {len}");
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    let got = run(
                        |r, t, f| unsafe { scan_avx2(r, t, &mut |b, m| f(b, m)) },
                        &row,
                    );
                    assert_eq!(got, want, "avx2, len {len}");
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    let got = run(
                        |r, t, f| unsafe { scan_avx512(r, t, &mut |b, m| f(b, m)) },
                        &row,
                    );
                    assert_eq!(got, want, "avx512f, len {len}");
                }
            }
        }
    }
}
