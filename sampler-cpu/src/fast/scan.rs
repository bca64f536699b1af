//! One-pass kernels over a raw logits row `[vocab]` (token id = position).
//!
//! Each kernel reads the row once from memory, in ascending id order: pass 1
//! ([`super::simd::block_maxima`], AVX-512F / AVX2 / portable) computes the
//! maximum of every [`BLOCK`] floats with no branch per block; the filters
//! then work on those maxima (a few hundred to a few thousand values) and
//! read again, from the cache, only the blocks whose maximum reaches their
//! threshold, in chunks of [`LANES`] floats whose compare vectorises. Pass 1
//! also detects NaN and `+inf`, so the row's validation costs no extra
//! pass; on a bad row a kernel returns [`Invalid`] and the caller reports
//! [`sampler_core::validate_logits`]'s error (same error, same position as
//! the reference).

use sampler_core::TokenId;

use super::simd::{BLOCK, LANES, block_maxima};

/// The row holds a NaN or a `+inf` (re-run `validate_logits` for the error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invalid;

/// Bit `j` set when `cond(block[j])`; for the rare blocks that pass an
/// `any_*` test (this form compiles to packed compares and a movemask).
#[inline(always)]
pub(crate) fn lane_mask(block: &[f32; LANES], cond: impl Fn(f32) -> bool) -> u32 {
    let c: [bool; LANES] = std::array::from_fn(|j| cond(block[j]));
    c.iter().rev().fold(0u32, |m, &x| (m << 1) | u32::from(x))
}

/// Positions of the set bits of `mask`, lowest first.
#[inline(always)]
pub(crate) fn set_bits(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let j = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        Some(j)
    })
}

#[inline(always)]
fn is_bad(x: f32) -> bool {
    // NaN and +inf fail `< inf`; -inf passes.
    !(x < f32::INFINITY)
}

#[inline(always)]
pub(crate) fn blocks(row: &[f32]) -> (std::slice::ChunksExact<'_, f32>, usize) {
    let c = row.chunks_exact(LANES);
    let tail_start = row.len() - c.remainder().len();
    (c, tail_start)
}

#[inline(always)]
pub(crate) fn as_block(c: &[f32]) -> &[f32; LANES] {
    // `chunks_exact(LANES)` yields exactly LANES floats.
    c.try_into().unwrap_or(&[f32::NEG_INFINITY; LANES])
}

/// The canonical candidate order as one integer: ascending `key` is
/// descending logit, ties by ascending id (`sampler_core::desc_cmp`), for
/// non-NaN logits. `-0.0` and `+0.0` compare equal, as in `desc_cmp`.
#[inline(always)]
pub(crate) fn desc_key(logit: f32, id: TokenId) -> u64 {
    let b = (logit + 0.0).to_bits(); // -0.0 + 0.0 == +0.0
    let ord = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    (u64::from(!ord) << 32) | u64::from(id)
}

/// The logit of a [`desc_key`], read back from its bits: `l + 0.0`, so a
/// `-0.0` comes back as `+0.0` (a caller that must keep the sign of a zero
/// reads such a logit from the row).
#[inline(always)]
pub(crate) fn key_logit(key: u64) -> f32 {
    let ord = !((key >> 32) as u32);
    f32::from_bits(if ord >> 31 == 1 {
        ord & 0x7fff_ffff
    } else {
        !ord
    })
}

/// The row's logit at a [`desc_key`]: [`key_logit`], and the row itself
/// for a zero (whose sign the key does not keep). No random read of the
/// row for the others.
#[inline(always)]
pub(crate) fn key_row_logit(key: u64, row: &[f32]) -> f32 {
    let l = key_logit(key);
    if l == 0.0 {
        row[key_id(key) as usize]
    } else {
        l
    }
}

/// Append the [`desc_key`]s of the lanes of `x` (16 logits, token ids
/// `first..first + 16`) set in `mask` to `keys`, in lane order: the key
/// transform on the floats' bits in one vector, the hits compressed out
/// (two vectors of 8 keys); no branch on the mask.
///
/// # Safety
/// AVX-512F and POPCNT, and room for 16 more keys in `keys` (its capacity); the
/// stores may write past the hits, into that room.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
#[inline]
pub(crate) unsafe fn compress_keys_avx512(
    x: std::arch::x86_64::__m512,
    first: TokenId,
    mask: u16,
    keys: &mut Vec<u64>,
) {
    use std::arch::x86_64::{
        _mm512_add_epi32, _mm512_add_ps, _mm512_castps_si512, _mm512_castsi512_si256,
        _mm512_cvtepu32_epi64, _mm512_extracti64x4_epi64, _mm512_maskz_compress_epi64,
        _mm512_or_si512, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setr_epi32, _mm512_slli_epi64,
        _mm512_srai_epi32, _mm512_storeu_si512, _mm512_xor_si512,
    };
    // desc_key: the order-preserving bits of `l + 0.0`, inverted.
    let bits = _mm512_castps_si512(_mm512_add_ps(x, _mm512_set1_ps(0.0)));
    let ord = _mm512_xor_si512(
        bits,
        _mm512_or_si512(_mm512_srai_epi32::<31>(bits), _mm512_set1_epi32(i32::MIN)),
    );
    let high = _mm512_xor_si512(ord, _mm512_set1_epi32(-1));
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let ids = _mm512_add_epi32(_mm512_set1_epi32(first as i32), lanes);
    let (high_lo, high_hi) = (
        _mm512_cvtepu32_epi64(_mm512_castsi512_si256(high)),
        _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(high)),
    );
    let (ids_lo, ids_hi) = (
        _mm512_cvtepu32_epi64(_mm512_castsi512_si256(ids)),
        _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(ids)),
    );
    let n_lo = (mask & 0xff).count_ones() as usize;
    let n = mask.count_ones() as usize;
    let len = keys.len();
    let at = keys.as_mut_ptr();
    // SAFETY: the caller leaves room for 16 keys past `len`; the first
    // store writes 8 at `len`, the second 8 at `len + n_lo <= len + 8`.
    // Then exactly the compressed keys are counted in.
    unsafe {
        let k = _mm512_or_si512(_mm512_slli_epi64::<32>(high_lo), ids_lo);
        _mm512_storeu_si512(
            at.add(len).cast(),
            _mm512_maskz_compress_epi64(mask as u8, k),
        );
        let k = _mm512_or_si512(_mm512_slli_epi64::<32>(high_hi), ids_hi);
        _mm512_storeu_si512(
            at.add(len + n_lo).cast(),
            _mm512_maskz_compress_epi64((mask >> 8) as u8, k),
        );
        keys.set_len(len + n);
    }
}

/// Token id of a [`desc_key`].
#[inline(always)]
pub(crate) fn key_id(key: u64) -> TokenId {
    key as u32
}

/// Maximum of the row (`-inf` for an all-`-inf` row); one vectorised pass.
///
/// # Errors
/// [`Invalid`] if the row holds a NaN or `+inf`.
pub(crate) fn max_checked(row: &[f32], maxima: &mut Vec<f32>) -> Result<f32, Invalid> {
    let full = row.len() - row.len() % BLOCK;
    let mut bad = block_maxima(&row[..full], maxima);
    let mut m = max_of(maxima);
    for &x in &row[full..] {
        bad |= is_bad(x);
        m = if x > m { x } else { m };
    }
    // A NaN never wins a lane; a `+inf` wins and shows up as the maximum.
    if bad || m == f32::INFINITY {
        Err(Invalid)
    } else {
        Ok(m)
    }
}

/// What [`candidate_blocks`] filters for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Filter {
    /// Blocks that may hold one of the `k` best logits (`k >= 1`).
    TopK(usize),
    /// Blocks that may hold a logit `>= max + ln_p` (`ln_p <= 0`).
    MinP(f32),
}

/// Pass 1 of the filters, one vectorised read of the row (and its
/// validation): the blocks of [`BLOCK`] floats that may hold a survivor,
/// as `(block index, block maximum)` in `out`, ascending; returns the
/// threshold `T` (every survivor is `>= T`, and lies in a listed block: one
/// whose maximum is `>= T`) and the row's maximum.
///
/// The pass computes every block's maximum ([`block_maxima`]: vector lanes,
/// no branch per block); then, over those maxima only, `TopK(k)`: `T` is
/// reached by at least k block maxima ([`kth_largest_bound`]: at most the
/// k-th largest of them, and reached by few more than k), a lower bound of
/// the k-th largest logit since k blocks hold a logit `>=` it; `MinP`:
/// `T = max + ln_p`, as the reference computes it. `buf` is scratch.
///
/// # Errors
/// [`Invalid`] if the row holds a NaN or `+inf`.
pub(crate) fn candidate_blocks(
    row: &[f32],
    filter: Filter,
    out: &mut Vec<(usize, f32)>,
    buf: &mut Vec<f32>,
) -> Result<(f32, f32), Invalid> {
    out.clear();
    row_block_maxima(row, buf)?;
    Ok(blocks_from_maxima(buf, filter, out))
}

/// The read of [`candidate_blocks`]: every block's maximum (the row's
/// short last block too) into `maxima`, and the row's validation; returns
/// the row's maximum. [`blocks_from_maxima`] then filters without reading
/// the row again, as often as a kernel needs (Mirostat's `m` best, then its
/// kept set).
///
/// # Errors
/// [`Invalid`] if the row holds a NaN or `+inf`.
pub(crate) fn row_block_maxima(row: &[f32], maxima: &mut Vec<f32>) -> Result<f32, Invalid> {
    let full = row.len() - row.len() % BLOCK;
    let nan = block_maxima(&row[..full], maxima);
    let tail = &row[full..];
    if !tail.is_empty() {
        let mut m = f32::NEG_INFINITY;
        for &x in tail {
            if is_bad(x) {
                return Err(Invalid);
            }
            m = if x > m { x } else { m };
        }
        maxima.push(m + 0.0);
    }
    let max = max_of(maxima);
    // NaN never wins a lane; +inf wins and shows up as a block maximum.
    if nan || max == f32::INFINITY {
        return Err(Invalid);
    }
    Ok(max)
}

/// The choice of [`candidate_blocks`] from the block maxima of
/// [`row_block_maxima`]: the listed blocks in `out`, the threshold and the
/// row's maximum.
pub(crate) fn blocks_from_maxima(
    maxima: &[f32],
    filter: Filter,
    out: &mut Vec<(usize, f32)>,
) -> (f32, f32) {
    out.clear();
    let buf = maxima;
    let (max, min) = max_and_min_finite(buf);
    let thr = match filter {
        Filter::MinP(ln_p) => max + ln_p,
        Filter::TopK(1) => max,
        Filter::TopK(k) => kth_largest_bound(buf, max, min, k.max(1)),
    };
    // Room for every block: the list never grows from one row to the next
    // (how many blocks reach `T` varies with the row).
    out.reserve(buf.len());
    for_each_reaching(buf, thr, |b, m| out.push((b, m)));
    (thr, max)
}

/// The largest of `values` (no NaN among them), `-inf` when empty; in
/// lanes, so it vectorises.
fn max_of(values: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    acc.iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &m| if m > a { m } else { a })
}

/// `f(i, values[i])` for each `values[i] >= thr`, in order: one 64-bit
/// compare mask per [`BLOCK`] values ([`for_each_at_least`]'s), so the
/// values below `thr` cost no branch.
#[inline(always)]
fn for_each_reaching(values: &[f32], thr: f32, f: impl FnMut(usize, f32)) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { for_each_reaching_avx512(values, thr, f) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { for_each_reaching_avx2(values, thr, f) };
        }
    }
    for_each_reaching_body(values, thr, f, ge_mask);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn for_each_reaching_avx512(values: &[f32], thr: f32, f: impl FnMut(usize, f32)) {
    for_each_reaching_body(values, thr, f, |blk, thr| ge_mask_avx512(blk, thr));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn for_each_reaching_avx2(values: &[f32], thr: f32, f: impl FnMut(usize, f32)) {
    for_each_reaching_body(values, thr, f, |blk, thr| ge_mask_avx2(blk, thr));
}

#[inline(always)]
fn for_each_reaching_body(
    values: &[f32],
    thr: f32,
    mut f: impl FnMut(usize, f32),
    mask: impl Fn(&[f32; BLOCK], f32) -> u64,
) {
    let (chunks, rest) = values.as_chunks::<BLOCK>();
    for (c, chunk) in chunks.iter().enumerate() {
        let mut bits = mask(chunk, thr);
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            f(c * BLOCK + j, chunk[j]);
            bits &= bits - 1;
        }
    }
    let start = values.len() - rest.len();
    for (i, &m) in rest.iter().enumerate() {
        if m >= thr {
            f(start + i, m);
        }
    }
}

/// Bit `j` set when `block[j] >= thr` (in lanes: [`lane_mask`] per 16).
#[inline(always)]
fn ge_mask(block: &[f32; BLOCK], thr: f32) -> u64 {
    (0..BLOCK / LANES).fold(0u64, |m, q| {
        let c = as_block(&block[q * LANES..][..LANES]);
        m | u64::from(lane_mask(c, |x| x >= thr)) << (q * LANES)
    })
}

/// [`ge_mask`] with AVX-512F compares (the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn ge_mask_avx512(block: &[f32; BLOCK], thr: f32) -> u64 {
    use std::arch::x86_64::{_CMP_GE_OQ, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_set1_ps};
    let t = _mm512_set1_ps(thr);
    (0..BLOCK / 16).fold(0u64, |m, q| {
        // SAFETY: `block` holds BLOCK floats; this reads 16 of them.
        let x = unsafe { _mm512_loadu_ps(block.as_ptr().add(q * 16)) };
        m | u64::from(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, t)) << (q * 16)
    })
}

/// [`ge_mask`] with AVX2 compares (the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn ge_mask_avx2(block: &[f32; BLOCK], thr: f32) -> u64 {
    use std::arch::x86_64::{
        _CMP_GE_OQ, _mm256_cmp_ps, _mm256_loadu_ps, _mm256_movemask_ps, _mm256_set1_ps,
    };
    let t = _mm256_set1_ps(thr);
    (0..BLOCK / 8).fold(0u64, |m, q| {
        // SAFETY: `block` holds BLOCK floats; this reads 8 of them.
        let x = unsafe { _mm256_loadu_ps(block.as_ptr().add(q * 8)) };
        let bits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(x, t)) as u8;
        m | u64::from(bits) << (q * 8)
    })
}

/// A threshold `T` for the `k` largest of `values` (no NaN among them): at
/// least `k` values are `>= T`, so `T` is at most the k-th largest (`-inf`
/// when fewer than `k` values are finite), and at most `k + k/4 + 4` are,
/// unless `T` is the k-th largest itself (ties there can add any number).
/// Pass 1's filters need only that: every one of the k best logits is `>=
/// T`, and the blocks that reach `T` are few more than `k`.
///
/// Found by bisection on the value between `min`, the smallest value above
/// `-inf` (`-inf` when there is none), and `max`, the largest (the caller
/// has both), counting the values at or above the midpoint in vector
/// lanes; about 6 counts of a few hundred block maxima on Zipf-like rows,
/// where a selection over a buffer cost about four times as much.
fn kth_largest_bound(values: &[f32], max: f32, min: f32, k: usize) -> f32 {
    debug_assert!(k >= 1);
    if k > values.len() || min == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let slack = k + k / 4 + 4;
    let (mut lo, mut hi) = (min, max);
    if count_at_least(values, hi) >= k {
        return hi;
    }
    // Fewer than `k` values reach `hi`; halve the gap until a midpoint is
    // reached by `k..=slack` values or no float lies between.
    let mut reached = false;
    for _ in 0..64 {
        let mid = lo * 0.5 + hi * 0.5;
        if mid <= lo || mid >= hi {
            break;
        }
        let c = count_at_least(values, mid);
        if c >= k {
            (lo, reached) = (mid, true);
            if c <= slack {
                break;
            }
        } else {
            hi = mid;
        }
    }
    // `lo` is still `min`: the finite values may be fewer than `k`.
    if !reached && count_at_least(values, lo) < k {
        return f32::NEG_INFINITY;
    }
    lo
}

/// The largest of `values` and the smallest above `-inf` (`-inf` when
/// there is none; no NaN among them), in lanes, so it vectorises.
fn max_and_min_finite(values: &[f32]) -> (f32, f32) {
    let mut high = [f32::NEG_INFINITY; LANES];
    let mut low = [f32::INFINITY; LANES];
    let (chunks, rest) = values.as_chunks::<LANES>();
    for c in chunks {
        for j in 0..LANES {
            high[j] = if c[j] > high[j] { c[j] } else { high[j] };
            let v = if c[j] == f32::NEG_INFINITY {
                f32::INFINITY
            } else {
                c[j]
            };
            low[j] = if v < low[j] { v } else { low[j] };
        }
    }
    let max = high
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
    let min = low
        .iter()
        .chain(rest.iter().filter(|&&v| v > f32::NEG_INFINITY))
        .fold(f32::INFINITY, |a, &v| if v < a { v } else { a });
    (
        max,
        if min == f32::INFINITY {
            f32::NEG_INFINITY
        } else {
            min
        },
    )
}

/// How many of `values` are `>= thr` (AVX-512F / AVX2 compares and a
/// population count, chosen at run time; else in lanes).
pub(crate) fn count_at_least(values: &[f32], thr: f32) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { count_at_least_avx512(values, thr) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { count_at_least_avx2(values, thr) };
        }
    }
    count_at_least_body(values, thr)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn count_at_least_avx512(values: &[f32], thr: f32) -> usize {
    use std::arch::x86_64::{_CMP_GE_OQ, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_set1_ps};
    let t = _mm512_set1_ps(thr);
    let chunks = values.chunks_exact(16);
    let rest = chunks.remainder();
    let mut n = 0u32;
    for c in chunks {
        // SAFETY: `c` holds 16 floats.
        let x = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        n += _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, t).count_ones();
    }
    n as usize + rest.iter().filter(|&&v| v >= thr).count()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn count_at_least_avx2(values: &[f32], thr: f32) -> usize {
    use std::arch::x86_64::{
        _CMP_GE_OQ, _mm256_cmp_ps, _mm256_loadu_ps, _mm256_movemask_ps, _mm256_set1_ps,
    };
    let t = _mm256_set1_ps(thr);
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    let mut n = 0u32;
    for c in chunks {
        // SAFETY: `c` holds 8 floats.
        let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        n += (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(x, t)) as u32).count_ones();
    }
    n as usize + rest.iter().filter(|&&v| v >= thr).count()
}

#[inline(always)]
fn count_at_least_body(values: &[f32], thr: f32) -> usize {
    let mut count = [0u32; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            count[j] += u32::from(c[j] >= thr);
        }
    }
    let tail = rest.iter().filter(|&&v| v >= thr).count();
    count.iter().map(|&c| c as usize).sum::<usize>() + tail
}

/// Call `f(position)` for every position `i` of the row, in ascending order,
/// in a listed block whose maximum is `>= thr` and with `row[i] >= thr` (no
/// NaN here: the row passed [`candidate_blocks`]). A whole block's test is
/// one 64-bit mask ([`ge_mask`]; AVX-512F or AVX2 compares, chosen at run
/// time), its set bits visited lowest first.
#[inline(always)]
fn for_each_at_least(row: &[f32], blocks: &[(usize, f32)], thr: f32, f: impl FnMut(usize)) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { for_each_at_least_avx512(row, blocks, thr, f) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { for_each_at_least_avx2(row, blocks, thr, f) };
        }
    }
    for_each_at_least_body(row, blocks, thr, f, ge_mask);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn for_each_at_least_avx512(row: &[f32], blocks: &[(usize, f32)], thr: f32, f: impl FnMut(usize)) {
    for_each_at_least_body(row, blocks, thr, f, |blk, thr| ge_mask_avx512(blk, thr));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn for_each_at_least_avx2(row: &[f32], blocks: &[(usize, f32)], thr: f32, f: impl FnMut(usize)) {
    for_each_at_least_body(row, blocks, thr, f, |blk, thr| ge_mask_avx2(blk, thr));
}

/// [`for_each_at_least`] with `mask(block, thr)`: bit `j` set when
/// `block[j] >= thr`, for a whole block of [`BLOCK`] floats.
#[inline(always)]
fn for_each_at_least_body(
    row: &[f32],
    blocks: &[(usize, f32)],
    thr: f32,
    mut f: impl FnMut(usize),
    mask: impl Fn(&[f32; BLOCK], f32) -> u64,
) {
    for &(b, _) in blocks.iter().filter(|&&(_, m)| m >= thr) {
        let start = b * BLOCK;
        let blk = &row[start..row.len().min(start + BLOCK)];
        match <&[f32; BLOCK]>::try_from(blk) {
            Ok(whole) => {
                let mut bits = mask(whole, thr);
                while bits != 0 {
                    f(start + bits.trailing_zeros() as usize);
                    bits &= bits - 1;
                }
            }
            // The row's last, short block.
            Err(_) => {
                for (j, &x) in blk.iter().enumerate() {
                    if x >= thr {
                        f(start + j);
                    }
                }
            }
        }
    }
}

/// Keys ([`desc_key`]) of the `k` best candidates of the row (descending
/// logit, ties by lowest id), sorted, written to `out`.
///
/// Pass 1 ([`candidate_blocks`]) bounds the k-th largest logit from below by
/// a value `T` that at least k block maxima reach; every one of the k best
/// lies in a block whose maximum is `>= T`, and only those (about k) blocks
/// are read again, from cache ([`gather_best`]: for a `k` above half the
/// block count a higher `T` from a sample of the row, when at least `k`
/// logits reach it). Then a selection over the keys that reach `T` and a
/// sort of k.
///
/// `k == 0` yields nothing; `k >= len` yields the whole row, sorted.
///
/// # Errors
/// [`Invalid`] if the row holds a NaN or `+inf`.
pub(crate) fn top_k_keys(
    row: &[f32],
    k: usize,
    blocks: &mut Vec<(usize, f32)>,
    sel: &mut Vec<f32>,
    out: &mut Vec<u64>,
) -> Result<(), Invalid> {
    out.clear();
    row_block_maxima(row, sel)?;
    top_k_keys_of(row, k, sel, blocks, out);
    Ok(())
}

/// [`top_k_keys`] of a validated row from its [`row_block_maxima`].
pub(crate) fn top_k_keys_of(
    row: &[f32],
    k: usize,
    maxima: &[f32],
    blocks: &mut Vec<(usize, f32)>,
    out: &mut Vec<u64>,
) {
    gather_best(row, k, maxima, blocks, out);
    if out.len() > k {
        out.select_nth_unstable(k - 1);
        out.truncate(k);
    }
    out.sort_unstable();
}

/// The ids of the `k` best candidates of the row (the set [`top_k_keys`]
/// gives), in ascending id and without sorting them, into `ids`, from the
/// block maxima of one read ([`row_block_maxima`], which validated the
/// row): the keys reaching pass 1's threshold ([`gather_best`]) gathered in
/// id order (`keys`), the k-th smallest of them by a selection on a copy
/// (`copy`), and the keys up to it kept.
pub(crate) fn top_k_ids_in_id_order(
    row: &[f32],
    k: usize,
    maxima: &[f32],
    blocks: &mut Vec<(usize, f32)>,
    keys: &mut Vec<u64>,
    copy: &mut Vec<u64>,
    ids: &mut Vec<TokenId>,
) {
    ids.clear();
    gather_best(row, k, maxima, blocks, keys);
    let kth = if keys.len() > k {
        copy.clear();
        copy.extend_from_slice(keys);
        *copy.select_nth_unstable(k - 1).1
    } else {
        u64::MAX
    };
    ids.extend(
        keys.iter()
            .filter(|&&key| key <= kth)
            .map(|&key| key_id(key)),
    );
}

/// The keys ([`desc_key`]) of a superset of the `k` best of a validated
/// row, in id order, into `keys` (empty for `k = 0`): the logits that reach
/// a threshold reached by at least `k` of them, from the block maxima
/// ([`blocks_from_maxima`]). For a k of the order of the block count
/// (Mirostat's kept sets, a wide `top_k`) the k-th largest block maximum
/// says little and most of the row would come through; there a higher
/// threshold from a sample of the row ([`sample_bound`]) is taken when at
/// least `k` logits reach it (then the `k` best all do): about
/// `k + 8.5·sqrt(k)` keys.
fn gather_best(
    row: &[f32],
    k: usize,
    maxima: &[f32],
    blocks: &mut Vec<(usize, f32)>,
    keys: &mut Vec<u64>,
) {
    keys.clear();
    let (thr, _) = blocks_from_maxima(maxima, Filter::TopK(k), blocks);
    if k == 0 {
        return;
    }
    let gather = |thr: f32, keys: &mut Vec<u64>| {
        keys.clear();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("popcnt") {
                // SAFETY: the CPU has AVX-512F and POPCNT (checked just above).
                unsafe { keys_at_least_avx512(row, blocks, thr, keys) };
                return;
            }
        }
        for_each_at_least(row, blocks, thr, |i| {
            keys.push(desc_key(row[i], i as TokenId));
        });
    };
    // The sample goes through `keys` before the gather empties it.
    if k > maxima.len() / 2
        && let Some(t) = sample_bound(row, k, keys)
        && t > thr
    {
        gather(t, keys);
        if keys.len() >= k {
            return;
        }
    }
    gather(thr, keys);
}

/// The keys of the logits `>= thr` of the listed blocks whose maximum
/// reaches it, in id order, appended to `keys` ([`for_each_at_least`]'s
/// tokens): one compare per 16 floats and the hits compressed out
/// ([`compress_keys_avx512`]), no token looked at one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
fn keys_at_least_avx512(row: &[f32], blocks: &[(usize, f32)], thr: f32, keys: &mut Vec<u64>) {
    use std::arch::x86_64::{_CMP_GE_OQ, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_set1_ps};
    let t = _mm512_set1_ps(thr);
    for &(b, _) in blocks.iter().filter(|&&(_, m)| m >= thr) {
        let start = b * BLOCK;
        let blk = &row[start..row.len().min(start + BLOCK)];
        if blk.len() < BLOCK {
            // The row's last, short block.
            for (j, &x) in blk.iter().enumerate() {
                if x >= thr {
                    keys.push(desc_key(x, (start + j) as TokenId));
                }
            }
            continue;
        }
        keys.reserve(BLOCK + 16);
        for q in 0..BLOCK / 16 {
            // SAFETY: the block holds BLOCK floats; this reads 16 of them.
            let x = unsafe { _mm512_loadu_ps(blk.as_ptr().add(q * 16)) };
            let mask = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, t);
            // SAFETY: AVX-512F and POPCNT (this function's); the reserve
            // above leaves room for 16 keys past the block's hits so far.
            unsafe { compress_keys_avx512(x, (start + q * 16) as TokenId, mask, keys) };
        }
    }
}

/// A likely lower bound of the k-th largest logit of `row` (a validated
/// row): the `(k/8 + 3·sqrt(k/8) + 4)`-th largest of every 8th logit
/// (`sample` is scratch), about three standard deviations of the sample below the
/// k-th; `None` when the sample is too short. The caller checks it.
fn sample_bound(row: &[f32], k: usize, sample: &mut Vec<u64>) -> Option<f32> {
    const STRIDE: usize = 8;
    sample.clear();
    sample.extend(
        row.iter()
            .step_by(STRIDE)
            .enumerate()
            .map(|(j, &l)| desc_key(l, j as TokenId)),
    );
    let share = k / STRIDE;
    let rank = share + 3 * share.isqrt() + 4;
    (rank < sample.len()).then(|| key_logit(*sample.select_nth_unstable(rank).1))
}

/// Pass 1 of `penalties -> top_k(k)`: the keys ([`desc_key`], raw logits)
/// of the tokens outside `history` (sorted by token, every token `< len`)
/// whose logit is `>= T`, in id order, written to `out`; returns `T`.
///
/// `T` is reached by at least K block maxima ([`kth_largest_bound`]) with
/// `K = k + h`, `h` the history tokens whose logit is `>= T` (found by
/// raising K from `k` until it holds): K blocks hold a logit `>= T`, at
/// most `h` of them history
/// tokens, so at least `k` tokens outside the history reach `T`. Penalties
/// only lower the history's logits, so the `k` best after them are among
/// these keys and the history's penalised logits that reach `T`. Where the
/// history's tokens are not among the row's best (the usual case) that is
/// the selection of `k`, not of `k + last_n`.
///
/// # Errors
/// [`Invalid`] if the row holds a NaN or `+inf`.
pub(crate) fn top_k_keys_outside(
    row: &[f32],
    k: usize,
    history: &[(TokenId, u32)],
    blocks: &mut Vec<(usize, f32)>,
    maxima: &mut Vec<f32>,
    out: &mut Vec<u64>,
) -> Result<f32, Invalid> {
    out.clear();
    debug_assert!(history.iter().all(|&(t, _)| (t as usize) < row.len()));
    let k = k.max(1);
    let (mut thr, max) = candidate_blocks(row, Filter::TopK(k), blocks, maxima)?;
    let reaching = |thr: f32| {
        history
            .iter()
            .filter(|&&(t, _)| row[t as usize] >= thr)
            .count()
    };
    let mut want = k;
    let mut min = None;
    loop {
        let need = k + reaching(thr);
        if need <= want {
            break;
        }
        want = need;
        let min = *min.get_or_insert_with(|| max_and_min_finite(maxima).1);
        thr = kth_largest_bound(maxima, max, min, want);
    }
    if want > k {
        blocks.clear();
        for_each_reaching(maxima, thr, |b, m| blocks.push((b, m)));
    }
    // Positions come in ascending order, as the history's tokens: one
    // cursor into the history skips its tokens.
    let mut h = 0;
    for_each_at_least(row, blocks, thr, |i| {
        let id = i as TokenId;
        while h < history.len() && history[h].0 < id {
            h += 1;
        }
        if history.get(h).is_none_or(|&(t, _)| t != id) {
            out.push(desc_key(row[i], id));
        }
    });
    Ok(thr)
}

/// `min_p` on a raw row, unsorted path: the ids (ascending) of every token
/// with `logit >= max + ln_p`, where `max` is the row's maximum, written to
/// `out`; returns `max`. The threshold is computed exactly as the reference
/// does (`max + ln_p` in f32), so the kept set is identical; only blocks whose
/// maximum reaches it are read again.
///
/// # Errors
/// [`Invalid`] if the row holds a NaN or `+inf`.
pub(crate) fn min_p_ids(
    row: &[f32],
    ln_p: f32,
    blocks: &mut Vec<(usize, f32)>,
    sel: &mut Vec<f32>,
    out: &mut Vec<TokenId>,
) -> Result<f32, Invalid> {
    out.clear();
    let (thr, max) = candidate_blocks(row, Filter::MinP(ln_p), blocks, sel)?;
    for_each_at_least(row, blocks, thr, |i| out.push(i as TokenId));
    Ok(max)
}

/// The ids of the row's logits `>= thr`, ascending, into `out`: only the
/// blocks whose maximum reaches `thr` are read again (`maxima`: every
/// block's maximum, as [`candidate_blocks`] leaves them in its `buf`).
pub(crate) fn ids_at_least(
    row: &[f32],
    thr: f32,
    maxima: &[f32],
    blocks: &mut Vec<(usize, f32)>,
    out: &mut Vec<TokenId>,
) {
    blocks.clear();
    for_each_reaching(maxima, thr, |b, m| blocks.push((b, m)));
    out.clear();
    for_each_at_least(row, blocks, thr, |i| out.push(i as TokenId));
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_core::desc_cmp;

    /// The `k` best in id order, for k from a few to the whole row: where
    /// the bound from a sample of the row holds (random rows) and where it
    /// misleads (every 8th logit far above the rest, so the sample's bound
    /// lets fewer than `k` through and the block maxima's threshold is
    /// used), with ties, `-inf` and a short last block; always the set of a
    /// full sort.
    #[test]
    fn top_k_in_id_order_is_the_sorted_selection() {
        let mut x = 0x9e37_79b9u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let len = 5000 + 37;
        let rows: Vec<(&str, Vec<f32>)> = vec![
            (
                "random",
                (0..len)
                    .map(|_| (next() % 100_000) as f32 / 1000.0)
                    .collect(),
            ),
            ("ties", (0..len).map(|_| (next() % 7) as f32).collect()),
            (
                "-inf",
                (0..len)
                    .map(|_| match next() % 4 {
                        0 => f32::NEG_INFINITY,
                        v => v as f32,
                    })
                    .collect(),
            ),
            (
                "stride 8",
                (0..len)
                    .map(|i| {
                        if i % 8 == 0 {
                            100.0 + (next() % 100) as f32
                        } else {
                            (next() % 100) as f32
                        }
                    })
                    .collect(),
            ),
        ];
        let (mut blocks, mut sel, mut keys, mut copy, mut ids) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut held, mut misled) = (0, 0);
        for (name, row) in &rows {
            let mut sorted: Vec<u64> = (0..len).map(|i| desc_key(row[i], i as TokenId)).collect();
            sorted.sort_unstable();
            for k in [
                1usize, 40, 100, 200, 500, 700, 1000, 2000, 4000, 5036, 5037, 6000,
            ] {
                row_block_maxima(row, &mut sel).unwrap();
                top_k_ids_in_id_order(row, k, &sel, &mut blocks, &mut keys, &mut copy, &mut ids);
                let mut want: Vec<TokenId> = sorted[..k.min(len)]
                    .iter()
                    .map(|&key| key_id(key))
                    .collect();
                want.sort_unstable();
                assert_eq!(ids, want, "{name}, k {k}");
                top_k_keys(row, k, &mut blocks, &mut sel, &mut keys).unwrap();
                assert_eq!(keys, sorted[..k.min(len)], "{name}, k {k}: sorted keys");
                // Where `gather_best` tries the sample's threshold: held
                // (taken) or misled (the block maxima's used instead).
                let mut maxima = Vec::new();
                row_block_maxima(row, &mut maxima).unwrap();
                let (thr, _) = blocks_from_maxima(&maxima, Filter::TopK(k), &mut blocks);
                if k > maxima.len() / 2
                    && let Some(t) = sample_bound(row, k, &mut copy)
                    && t > thr
                {
                    if row.iter().filter(|&&l| l >= t).count() >= k {
                        held += 1;
                    } else {
                        misled += 1;
                    }
                }
            }
        }
        assert!(
            held > 0 && misled > 0,
            "sample bound held {held}, misled {misled}"
        );
    }

    /// The compressed gather is the lane-by-lane one: the same keys, in id
    /// order, for thresholds from above the row to `-inf`, with `-0.0`,
    /// `-inf` and a short last block, appended after what `keys` held.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn compressed_keys_are_the_lane_by_lane_keys() {
        if !(std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("popcnt")) {
            eprintln!("SKIP compressed_keys_are_the_lane_by_lane_keys: no AVX-512F on this CPU");
            return;
        }
        let mut x = 0x1234_5679u32;
        let row: Vec<f32> = (0..3000 + 21)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match i % 97 {
                    3 => f32::NEG_INFINITY,
                    5 => -0.0,
                    _ => (x % 2000) as f32 / 100.0 - 10.0,
                }
            })
            .collect();
        let (mut maxima, mut blocks) = (Vec::new(), Vec::new());
        row_block_maxima(&row, &mut maxima).unwrap();
        for thr in [11.0f32, 9.9, 5.0, 0.0, -0.0, -9.99, f32::NEG_INFINITY] {
            blocks_from_maxima(&maxima, Filter::MinP(thr - 10.0), &mut blocks);
            let mut want = vec![7u64];
            for_each_at_least(&row, &blocks, thr, |i| {
                want.push(desc_key(row[i], i as TokenId))
            });
            let mut got = vec![7u64];
            // SAFETY: the CPU has AVX-512F and POPCNT (checked above).
            unsafe { keys_at_least_avx512(&row, &blocks, thr, &mut got) };
            assert_eq!(got, want, "threshold {thr}");
        }
    }

    /// A key's logit comes back bit for bit (zeros through the row, with
    /// their sign), for every kind of float a row can hold.
    #[test]
    fn key_logit_reads_the_logit_back() {
        let mut vals = vec![
            f32::NEG_INFINITY,
            -f32::MAX,
            f32::MAX,
            -1.0,
            1.0,
            -0.0,
            0.0,
            1e-45,
            -1e-45,
            1e-40,
            -1.2e-38,
        ];
        let mut x = 0x2545_f491u32;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = f32::from_bits(x);
            if !v.is_nan() && v != f32::INFINITY {
                vals.push(v);
            }
        }
        for (i, &l) in vals.iter().enumerate() {
            let key = desc_key(l, i as TokenId);
            assert_eq!(key_logit(key).to_bits(), (l + 0.0).to_bits(), "{l:e}");
            assert_eq!(key_row_logit(key, &vals).to_bits(), l.to_bits(), "{l:e}");
        }
    }

    #[test]
    fn desc_key_matches_desc_cmp() {
        let vals = [
            f32::NEG_INFINITY,
            -f32::MAX,
            -1.0,
            -0.0,
            0.0,
            1e-40,
            1.0,
            f32::MAX,
        ];
        for (i, &a) in vals.iter().enumerate() {
            for (j, &b) in vals.iter().enumerate() {
                for (ia, ib) in [(1u32, 2u32), (2, 1), (3, 3)] {
                    let want = desc_cmp(a, ia, b, ib);
                    let got = desc_key(a, ia).cmp(&desc_key(b, ib));
                    assert_eq!(got, want, "{a} {ia} vs {b} {ib} ({i},{j})");
                }
            }
        }
    }

    fn best(row: &[f32]) -> Result<Option<u32>, Invalid> {
        let mut out = Vec::new();
        top_k_keys(row, 1, &mut Vec::new(), &mut Vec::new(), &mut out)?;
        Ok(out.first().map(|&k| key_id(k)))
    }

    #[test]
    fn top_1_ties_lowest_id_and_bad_rows() {
        let mut row = vec![0.0f32; 300];
        row[70] = 5.0;
        row[200] = 5.0;
        assert_eq!(best(&row), Ok(Some(70)));
        row[299] = 6.0;
        assert_eq!(best(&row), Ok(Some(299)));
        row[3] = f32::NAN;
        assert_eq!(best(&row), Err(Invalid));
        row[3] = f32::INFINITY;
        assert_eq!(best(&row), Err(Invalid));
        assert_eq!(best(&[f32::NEG_INFINITY; 3]), Ok(Some(0)));
        assert_eq!(best(&[]), Ok(None));
    }

    /// The running-threshold selection gives the k-th largest (ties, `-inf`,
    /// every k from 1 past the length, lengths around the buffer's size) and
    /// keeps the values.
    #[test]
    fn kth_largest_bound_holds_the_k_largest() {
        let mut x = 0x9e37_79b9u32;
        for n in [0usize, 1, 5, 63, 64, 65, 129, 500, 2374] {
            for spread in [0.25f32, 1e-6, 1e30] {
                let values: Vec<f32> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        if x.is_multiple_of(29) {
                            f32::NEG_INFINITY
                        } else {
                            (x % 300) as f32 * spread - 40.0
                        }
                    })
                    .collect();
                let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sorted = values.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                for k in (1..=n + 2).filter(|&k| k <= 70 || k % 37 == 0 || k + 2 >= n) {
                    let exact = if k > n {
                        f32::NEG_INFINITY
                    } else {
                        sorted[k - 1]
                    };
                    let (high, min) = max_and_min_finite(&values);
                    let low = values.iter().copied().filter(|v| v.is_finite()).fold(
                        f32::NEG_INFINITY,
                        |a, v| {
                            if a == f32::NEG_INFINITY { v } else { a.min(v) }
                        },
                    );
                    assert_eq!((high, min), (max, low), "n {n}");
                    let t = kth_largest_bound(&values, max, min, k);
                    let reach = values.iter().filter(|&&v| v >= t).count();
                    let what = format!("n {n} spread {spread} k {k}: {t} against {exact}");
                    assert!(t <= exact, "{what}");
                    assert!(k > n || reach >= k, "{what}");
                    assert!(reach <= k + k / 4 + 4 || t == exact, "{what}: {reach}");
                    assert_eq!(count_at_least(&values, t), reach, "{what}");
                    assert_eq!(count_at_least_body(&values, t), reach, "{what}");
                }
            }
        }
    }

    /// `top_k_keys_outside` on a 40000-token row whose history is its 60
    /// best tokens (and a few others): the threshold drops below the plain
    /// top-k one, no history token is returned, and the k best tokens outside
    /// the history are all among the keys, in id order.
    #[test]
    fn selection_outside_the_history_holds_the_k_best_outside_it() {
        let vocab = 40_000usize;
        let row: Vec<f32> = (0..vocab)
            .map(|i| -1.2 * ((((i * 7919 + 13) % vocab) + 1) as f32).ln())
            .collect();
        let mut ranked: Vec<usize> = (0..vocab).collect();
        ranked.sort_by(|&a, &b| desc_cmp(row[a], a as u32, row[b], b as u32));
        let mut history: Vec<(TokenId, u32)> = ranked[..60]
            .iter()
            .chain(&ranked[5000..5004])
            .map(|&t| (t as TokenId, 1))
            .collect();
        history.sort_unstable();
        for k in [1usize, 10, 40, 100] {
            let (mut blocks, mut maxima, mut out) = (Vec::new(), Vec::new(), Vec::new());
            let plain = candidate_blocks(&row, Filter::TopK(k), &mut blocks, &mut maxima)
                .unwrap()
                .0;
            let thr =
                top_k_keys_outside(&row, k, &history, &mut blocks, &mut maxima, &mut out).unwrap();
            assert!(thr < plain, "k {k}: threshold {thr} not below {plain}");
            let ids: Vec<u32> = out.iter().map(|&key| key_id(key)).collect();
            assert!(ids.is_sorted(), "k {k}");
            assert!(
                ids.iter()
                    .all(|id| history.binary_search_by_key(id, |&(t, _)| t).is_err())
            );
            let best_outside = ranked
                .iter()
                .filter(|&&t| {
                    history
                        .binary_search_by_key(&(t as u32), |&(h, _)| h)
                        .is_err()
                })
                .take(k);
            for &t in best_outside {
                assert!(
                    ids.binary_search(&(t as u32)).is_ok(),
                    "k {k}: token {t} missing"
                );
            }
            assert!(ids.iter().all(|&i| row[i as usize] >= thr));
        }
    }

    #[test]
    fn top_k_keys_small_and_ties() {
        let row: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        let mut out = Vec::new();
        top_k_keys(&row, 5, &mut Vec::new(), &mut Vec::new(), &mut out).unwrap();
        let ids: Vec<u32> = out.iter().map(|&k| key_id(k)).collect();
        let mut want: Vec<u32> = (0..1000).collect();
        want.sort_by(|&a, &b| desc_cmp(row[a as usize], a, row[b as usize], b));
        assert_eq!(ids, want[..5]);
    }
}
