//! `#[cube]` helpers several kernels share: the order-preserving key of a
//! logit, row validation (first NaN / `+inf`), the shared-memory minimum,
//! the row maximum with its validation (one pass), the maximum as a logit,
//! each thread's contiguous chunk of a row, the saturating temperature
//! divide, and what a selecting kernel writes (token or status code).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// A selecting kernel writes tokens only ([`code_key`]).
pub(crate) const CODES_NONE: u32 = 0;
/// ... or status codes from its own validation pass.
pub(crate) const CODES_OWN: u32 = 1;
/// ... or status codes from validation keys an earlier kernel wrote.
pub(crate) const CODES_GIVEN: u32 = 2;

/// The key of `-inf`: every row whose best key is this has no finite logit.
pub(crate) const NEG_INF_KEY: u32 = 0x007F_FFFF;

/// Order-preserving key of a logit: `a > b` as floats iff `key(a) > key(b)`
/// (for non-NaN values; `-0.0` is keyed as `0.0`).
#[cube]
pub(crate) fn order_key(x: f32) -> u32 {
    // Bit tests only (no float compare): a device that flushes subnormals
    // must not merge them with zero.
    let raw = u32::reinterpret(x);
    let bits = select(raw == 0x8000_0000u32, 0u32, raw);
    select(
        (bits & 0x8000_0000u32) != 0u32,
        bits ^ 0xFFFF_FFFFu32,
        bits | 0x8000_0000u32,
    )
}

/// The validation key of position `i`: `2i` for a NaN, `2i + 1` for a
/// `+inf`, `none` otherwise (bit tests: fast-math cannot fold them).
#[cube]
pub(crate) fn bad_key(x: f32, i: u32, none: u32) -> u32 {
    let bits = u32::reinterpret(x);
    let nan = (bits & 0x7FFF_FFFFu32) > 0x7F80_0000u32;
    let inf = bits == 0x7F80_0000u32;
    select(nan, 2u32 * i, select(inf, 2u32 * i + 1u32, none))
}

/// Zero `buf[0..n]` (every thread calls; a barrier must follow before
/// the buffer is used).
#[cube]
pub(crate) fn clear_atomics(buf: &Shared<[Atomic<u32>]>, n: u32) {
    let mut z = UNIT_POS;
    while z < n {
        buf[z as usize].store(0u32);
        z += CUBE_DIM;
    }
}

/// One element of a thread's row validation: its first hit so far `bad`
/// (`none` before one) after logit `x` at position `i` ([`bad_key`]). A
/// thread that visits ascending positions keeps its lowest hit.
#[cube]
pub(crate) fn note_bad(bad: u32, x: f32, i: u32, none: u32) -> u32 {
    let mut hit = bad;
    // NaN and ±inf have every exponent bit set.
    if hit == none && (u32::reinterpret(x) & 0x7F80_0000u32) == 0x7F80_0000u32 {
        hit = bad_key(x, i, none);
    }
    hit
}

/// Minimum of `buf[0..CUBE_DIM]` into `buf[0]` (a tree; every thread calls).
#[cube]
pub(crate) fn shared_min(buf: &mut Shared<[u32]>) {
    sync_cube();
    let tid = UNIT_POS;
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let other = buf[(tid + half) as usize];
            if other < buf[tid as usize] {
                buf[tid as usize] = other;
            }
        }
        sync_cube();
        half /= 2u32;
    }
}

/// Vectors each thread loads before it uses the first, in the vectorized
/// row passes ([`range_max_and_validation_vec`]): four 16-byte loads, 64
/// bytes in flight per thread, 16 KiB per 256-thread workgroup (a GPU's
/// memory needs about 20-40 KiB in flight per SM to run at its bandwidth,
/// which a few resident workgroups per SM give).
pub(crate) const LOADS_IN_FLIGHT: u32 = 4;

/// One vector of `N` logits at positions `at..at + N` folded into a
/// thread's running maximum key `bk` at position `bp` and its first
/// validation key `bad` (`none` before a hit): the lanes in ascending
/// position, so the first maximum stays the lowest.
#[cube]
fn fold_vector<N: Size>(
    v: Vector<f32, N>,
    at: u32,
    bk: u32,
    bp: u32,
    bad: u32,
    none: u32,
) -> (u32, u32, u32) {
    let mut k = bk;
    let mut p = bp;
    let mut b = bad;
    let mut i = at;
    #[unroll]
    for j in 0..N::value() {
        let x = v.extract(j);
        let key = order_key(x);
        if key > k {
            k = key;
            p = i;
        }
        b = note_bad(b, x, i, none);
        i += 1u32;
    }
    (k, p, b)
}

/// One pass over the vectors `start..end` of a row whose first vector is
/// `base` (`lanes = N` logits a vector, so vector `i` holds positions
/// `i·lanes..(i + 1)·lanes`; `width` is the row's length in logits; a
/// segment of a row split over several workgroups, or all of it): its
/// largest key into `best_key[0]`, that key's lowest position into
/// `best_pos[0]` (`width` when every key is 0: a row of NaNs with the sign
/// bit set and all mantissa bits set) and its validation key (first NaN
/// `2i` / `+inf` `2i + 1`, else `2·width`) into `bads[0]`; positions and
/// keys are the row's. Each thread takes vectors `CUBE_DIM` apart, loading
/// [`LOADS_IN_FLIGHT`] of them before it folds the first (a compile-time
/// unroll: the loads are independent, so they are all in flight at once),
/// then the rest one at a time; every thread visits ascending positions,
/// so the first maximum it meets is its lowest, and the tree then keeps
/// the larger key, ties to the lower position. Every thread calls; all see
/// the results. (Greedy and the full-row kernels; `min_p` orders ties by
/// id and keeps its own pass.)
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn range_max_and_validation_vec<N: Size>(
    logits: &[Vector<f32, N>],
    base: u32,
    start: u32,
    end: u32,
    lanes: u32,
    width: u32,
    best_key: &mut Shared<[u32]>,
    best_pos: &mut Shared<[u32]>,
    bads: &mut Shared<[u32]>,
) {
    let tid = UNIT_POS;
    let none_pos = 2u32 * width;
    let step = CUBE_DIM;
    let mut bad = none_pos;
    let mut bk = 0u32;
    let mut bp = width;
    let mut i = start + tid;
    while i + (LOADS_IN_FLIGHT - 1u32) * step < end {
        let v0 = logits[(base + i) as usize];
        let v1 = logits[(base + i + step) as usize];
        let v2 = logits[(base + i + 2u32 * step) as usize];
        let v3 = logits[(base + i + 3u32 * step) as usize];
        let (k0, p0, b0) = fold_vector::<N>(v0, i * lanes, bk, bp, bad, none_pos);
        let (k1, p1, b1) = fold_vector::<N>(v1, (i + step) * lanes, k0, p0, b0, none_pos);
        let (k2, p2, b2) = fold_vector::<N>(v2, (i + 2u32 * step) * lanes, k1, p1, b1, none_pos);
        let (k3, p3, b3) = fold_vector::<N>(v3, (i + 3u32 * step) * lanes, k2, p2, b2, none_pos);
        bk = k3;
        bp = p3;
        bad = b3;
        i += LOADS_IN_FLIGHT * step;
    }
    while i < end {
        let v = logits[(base + i) as usize];
        let (k, p, b) = fold_vector::<N>(v, i * lanes, bk, bp, bad, none_pos);
        bk = k;
        bp = p;
        bad = b;
        i += step;
    }
    bads[tid as usize] = bad;
    shared_min(bads);
    best_key[tid as usize] = bk;
    best_pos[tid as usize] = bp;
    reduce_first_max(best_key, best_pos);
}

/// The largest of the threads' keys `keys[0..CUBE_DIM]` into `keys[0]`,
/// ties to the lowest tie-breaker `ties[..]` (a position or an id), which
/// lands in `ties[0]` (a tree; every thread calls, after writing its own
/// pair).
#[cube]
pub(crate) fn reduce_first_max<T: Int>(keys: &mut Shared<[u32]>, ties: &mut Shared<[T]>) {
    sync_cube();
    let tid = UNIT_POS;
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let k2 = keys[(tid + half) as usize];
            let t2 = ties[(tid + half) as usize];
            let k1 = keys[tid as usize];
            if k2 > k1 || (k2 == k1 && t2 < ties[tid as usize]) {
                keys[tid as usize] = k2;
                ties[tid as usize] = t2;
            }
        }
        sync_cube();
        half /= 2u32;
    }
}

/// Row `row`'s `parts` segment results (`argmax_part_rows`: each segment's
/// largest key, that key's lowest position, its first validation key, at
/// `row · parts + segment`) merged as one pass over the row would give
/// them: the largest key into `best_key[0]`, ties to the lowest position
/// (segments hold ascending positions, so this is the row's first
/// maximum) into `best_pos[0]`, the lowest validation key into `bads[0]`.
/// Every thread calls; all see the results.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn merge_row_parts(
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    row: u32,
    parts: u32,
    width: u32,
    best_key: &mut Shared<[u32]>,
    best_pos: &mut Shared<[u32]>,
    bads: &mut Shared<[u32]>,
) {
    let tid = UNIT_POS;
    let mut bk = 0u32;
    let mut bp = width;
    let mut bad = 2u32 * width;
    let mut j = tid;
    while j < parts {
        let at = (row * parts + j) as usize;
        let k = part_key[at];
        let p = part_pos[at];
        if k > bk || (k == bk && p < bp) {
            bk = k;
            bp = p;
        }
        let b = part_bad[at];
        if b < bad {
            bad = b;
        }
        j += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(bads);
    best_key[tid as usize] = bk;
    best_pos[tid as usize] = bp;
    reduce_first_max(best_key, best_pos);
}

/// The vectors `start..end` of segment `part` (`seg` vectors a segment) of
/// a row of `row_v` vectors, clamped to the row: what each workgroup of a
/// split row pass reads.
#[cube]
pub(crate) fn segment_vectors(part: u32, seg: u32, row_v: u32) -> (u32, u32) {
    let start = select(part * seg < row_v, part * seg, row_v);
    let end = select(start + seg < row_v, start + seg, row_v);
    (start, end)
}

/// The logit at position `i` of the row whose first vector is `base`
/// (`lanes = N` logits a vector): for scattered reads, the passes that walk
/// contiguous chunks position by position and the rare passes (a full-row
/// `top_p`'s oversized crossing bin); the main passes over the row load
/// whole vectors.
#[cube]
pub(crate) fn logit_at<N: Size>(logits: &[Vector<f32, N>], base: u32, i: u32, lanes: u32) -> f32 {
    logits[(base + i / lanes) as usize].extract_dynamic(usize::cast_from(i % lanes))
}

/// [`max_logit`] on a row of vectors (`base` its first vector).
#[cube]
pub(crate) fn max_logit_vec<N: Size>(
    logits: &[Vector<f32, N>],
    base: u32,
    lanes: u32,
    width: u32,
    first: u32,
    dead: bool,
) -> f32 {
    let m_raw = logit_at::<N>(logits, base, select(first < width, first, 0u32), lanes);
    select(dead, 0.0f32, m_raw)
}

/// The row maximum as a logit, read at its first position `first`
/// (`width` when the row has none): 0 for a row without a finite logit
/// (`dead`: its best key at or below [`NEG_INF_KEY`]), so that `l - m`
/// stays finite.
#[cube]
pub(crate) fn max_logit(logits: &[f32], base: u32, width: u32, first: u32, dead: bool) -> f32 {
    let m_raw = logits[(base + select(first < width, first, 0u32)) as usize];
    select(dead, 0.0f32, m_raw)
}

/// Positions per thread when each thread owns a contiguous chunk of a row
/// of `width`.
#[cube]
pub(crate) fn chunk_len(width: u32) -> u32 {
    (width + CUBE_DIM - 1u32) / CUBE_DIM
}

/// This thread's contiguous chunk `start..end` of a row of `width`
/// ([`chunk_len`] positions; fewer, or none, at the end).
#[cube]
pub(crate) fn thread_chunk(width: u32) -> (u32, u32) {
    chunk_bounds(UNIT_POS, width)
}

/// Chunk `c`'s positions `start..end` of a row of `width`, the row cut
/// into `CUBE_DIM` chunks of [`chunk_len`] positions (fewer, or none, at
/// the end).
#[cube]
pub(crate) fn chunk_bounds(c: u32, width: u32) -> (u32, u32) {
    let chunk = chunk_len(width);
    let start = select(c * chunk < width, c * chunk, width);
    let end = select(start + chunk < width, start + chunk, width);
    (start, end)
}

/// `l / t` saturated at `±f32::MAX` (`-inf` stays `-inf`): the temperature
/// kernel's rule, also applied inside the full-row draws.
#[cube]
pub(crate) fn scaled(l: f32, t: f32) -> f32 {
    let max = f32::reinterpret(0x7F7F_FFFFu32);
    let q = l / t;
    let q = select(q > max, max, q);
    let q = select(q < -max, -max, q);
    select(u32::reinterpret(l) == 0xFF80_0000u32, l, q)
}

/// What a selecting kernel writes for a row: its token, or the row's
/// status code (`-key - 2`, `crate::readback`) when its validation `key`
/// says it is invalid (`key < none`).
#[cube]
pub(crate) fn with_code(tok: i32, key: u32, none: u32) -> i32 {
    select(key < none, 0i32 - i32::cast_from(key) - 2i32, tok)
}

/// The validation key a selecting kernel's codes come from
/// (`CODES_NONE`: none, the token is written as it is; `CODES_OWN`: the
/// kernel's own pass, `own`; `CODES_GIVEN`: an earlier kernel's,
/// `given[row]`).
#[cube]
pub(crate) fn code_key(
    given: &[i32],
    own: u32,
    row: u32,
    none: u32,
    #[comptime] codes: u32,
) -> u32 {
    let mut key = none;
    if comptime!(codes == CODES_OWN) {
        key = own;
    }
    if comptime!(codes == CODES_GIVEN) {
        key = u32::cast_from(given[row as usize]);
    }
    key
}
