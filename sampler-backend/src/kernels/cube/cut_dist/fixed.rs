//! Fixed-point weights and 64-bit sums `(hi, lo)` of the full-row draws,
//! the histogram bin of a logit, a key's logit, and `top_p`'s read 2 (the
//! fixed-point mass histogram of a range of the row).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// Fixed-point mass of a weight `w` in `[0, 1]`: `round(w · 2^31)`
/// (halves up). Clamped as a float before the cast, as [`nucleus_bin`]:
/// an invalid row (a NaN or `+inf` logit, whose status code replaces its
/// token) makes `w` NaN or `+inf`, and converting either to `u32` is
/// undefined on some backends; NaN weighs 0, anything above 1 weighs 1.
#[cube]
pub(crate) fn fixed_weight(w: f32) -> u32 {
    let v = w * 2_147_483_648.0f32 + 0.5f32;
    let v = select(v > 0.0f32, v, 0.0f32);
    u32::cast_from(select(v < 2_147_483_648.0f32, v, 2_147_483_648.0f32))
}

/// The 64-bit sum `(hi, lo)` added by atomics into the shared pair
/// `buf[at]` (low word) and `buf[at + 1]` (high word), the low word's
/// carry into the high one: exact, the same integers whatever order threads
/// add them in (each `fetch_add` sees its own wrap of the low word).
#[cube]
pub(crate) fn wide_atomic_add(buf: &Shared<[Atomic<u32>]>, at: u32, hi: u32, lo: u32) {
    let old = buf[at as usize].fetch_add(lo);
    let h = hi + select(old > 0xFFFF_FFFFu32 - lo, 1u32, 0u32);
    if h > 0u32 {
        buf[(at + 1u32) as usize].fetch_add(h);
    }
}

/// [`wide_atomic_add`] into global memory: the pair at `at` of `words`
/// (low word first). Nothing is added for 0.
#[cube]
pub(crate) fn global_wide_add(words: &mut [Atomic<u32>], at: u32, hi: u32, lo: u32) {
    if lo > 0u32 || hi > 0u32 {
        let old = words[at as usize].fetch_add(lo);
        let h = hi + select(old > 0xFFFF_FFFFu32 - lo, 1u32, 0u32);
        if h > 0u32 {
            words[(at + 1u32) as usize].fetch_add(h);
        }
    }
}

/// The histogram bin of a logit `l` below the row maximum `m`.
#[cube]
pub(crate) fn nucleus_bin(l: f32, m: f32) -> u32 {
    // Clamped as a float before the cast: converting a float beyond the
    // u32 range (the infinite depth of a `-inf` logit) or a NaN is
    // undefined on some backends.
    let d = (m - l) * 64.0f32;
    let d = select(d < 1023.0f32, d, 1023.0f32);
    u32::cast_from(select(d > 0.0f32, d, 0.0f32))
}

/// A 64-bit sum `(hi, lo)` as f32.
#[cube]
pub(crate) fn wide_f32(hi: u32, lo: u32) -> f32 {
    f32::cast_from(hi) * 4_294_967_296.0f32 + f32::cast_from(lo)
}

/// `(hi, lo) >= (hi2, lo2)` as 64-bit integers.
#[cube]
pub(crate) fn wide_ge(hi: u32, lo: u32, hi2: u32, lo2: u32) -> bool {
    hi > hi2 || (hi == hi2 && lo >= lo2)
}

/// The high word of `x · (hi, lo)` for `x` in `[0, 1]`, rounded down
/// through f32 (with [`frac_lo`], the fixed-point goal `p·S` or draw `u·W`).
#[cube]
pub(crate) fn frac_hi(x: f32, hi: u32, lo: u32) -> u32 {
    let v = x * wide_f32(hi, lo);
    u32::cast_from(v / 4_294_967_296.0f32)
}

/// The low word of `x · (hi, lo)` (see [`frac_hi`]).
#[cube]
pub(crate) fn frac_lo(x: f32, hi: u32, lo: u32) -> u32 {
    let v = x * wide_f32(hi, lo);
    let h = u32::cast_from(v / 4_294_967_296.0f32);
    u32::cast_from(v - f32::cast_from(h) * 4_294_967_296.0f32)
}

/// The logit of an order-preserving key (`order_key`'s inverse).
#[cube]
pub(crate) fn key_logit(key: u32) -> f32 {
    let bits = select(
        (key & 0x8000_0000u32) != 0u32,
        key & 0x7FFF_FFFFu32,
        key ^ 0xFFFF_FFFFu32,
    );
    f32::reinterpret(bits)
}

/// The threads' pairs `(hi[t], lo[t])`, `t < CUBE_DIM`, replaced by their
/// inclusive prefix sums in thread order (64-bit, exact): `log2(CUBE_DIM)`
/// steps of every thread adding the pair `2^k` before it (Hillis-Steele),
/// instead of one thread walking them all. The last pair is then the
/// total. Every thread calls, after writing its pair; all see the sums.
#[cube]
pub(crate) fn wide_scan(hi: &mut Shared<[u32]>, lo: &mut Shared<[u32]>) {
    sync_cube();
    let tid = UNIT_POS;
    let mut off = 1u32;
    while off < CUBE_DIM {
        let mut ah = 0u32;
        let mut al = 0u32;
        if tid >= off {
            ah = hi[(tid - off) as usize];
            al = lo[(tid - off) as usize];
        }
        sync_cube();
        if tid >= off {
            let l0 = lo[tid as usize];
            let nl = l0 + al;
            hi[tid as usize] = hi[tid as usize] + ah + select(nl < l0, 1u32, 0u32);
            lo[tid as usize] = nl;
        }
        sync_cube();
        off *= 2u32;
    }
}

/// The total of pairs scanned by [`wide_scan`].
#[cube]
pub(crate) fn wide_total(hi: &Shared<[u32]>, lo: &Shared<[u32]>) -> (u32, u32) {
    let last = (CUBE_DIM - 1u32) as usize;
    (hi[last], lo[last])
}

/// The sum of the pairs before thread `t`'s, from pairs scanned by
/// [`wide_scan`] (0 for thread 0).
#[cube]
pub(crate) fn wide_before(hi: &Shared<[u32]>, lo: &Shared<[u32]>, t: u32) -> (u32, u32) {
    let mut bh = 0u32;
    let mut bl = 0u32;
    if t > 0u32 {
        bh = hi[(t - 1u32) as usize];
        bl = lo[(t - 1u32) as usize];
    }
    (bh, bl)
}

/// `x · (hi, lo)` for `x` in `[0, 1]` as a 64-bit goal ([`frac_hi`],
/// [`frac_lo`]), at most `(hi, lo)` (rounding through f32 may overshoot).
#[cube]
pub(crate) fn wide_goal(x: f32, hi: u32, lo: u32) -> (u32, u32) {
    let mut gh = frac_hi(x, hi, lo);
    let mut gl = frac_lo(x, hi, lo);
    if !wide_ge(hi, lo, gh, gl) {
        gh = hi;
        gl = lo;
    }
    (gh, gl)
}

/// The nucleus goal `p·W` of a 64-bit mass `W = (hi, lo)`, so that a
/// running sum `>= goal` is exactly "the mass before the next candidate
/// would be `>= p·W`": for `p >= 1/2`, `W - floor((1 - p)·W)` (`1 - p` is
/// exact there; `p·W` through f32 would round a tail of tiny weights away
/// when `p` is within rounding of 1), else [`wide_goal`].
#[cube]
pub(crate) fn wide_nucleus_goal(p: f32, hi: u32, lo: u32) -> (u32, u32) {
    let mut gh = 0u32;
    let mut gl = 0u32;
    if p >= 0.5f32 {
        let (th, tl) = wide_goal(1.0f32 - p, hi, lo);
        gl = lo - tl;
        gh = hi - th - select(tl > lo, 1u32, 0u32);
    } else {
        let (ph, pl) = wide_goal(p, hi, lo);
        gh = ph;
        gl = pl;
    }
    (gh, gl)
}

/// In thread order, the first non-empty pair whose running 64-bit sum
/// reaches the goal `(goal_hi, goal_lo)`, from pairs scanned by
/// [`wide_scan`]: whether there is one, its `t`, and the sum before it.
/// Each thread tests its own pair (non-empty, its sum reaching the goal,
/// and no earlier non-empty pair's: the sum before it short of the goal,
/// or nothing before it), so at most one finds it. Every thread calls; all
/// see the result.
#[cube]
pub(crate) fn first_reaching(
    hi: &Shared<[u32]>,
    lo: &Shared<[u32]>,
    goal_hi: u32,
    goal_lo: u32,
) -> (bool, u32, u32, u32) {
    let tid = UNIT_POS;
    let mut res = Shared::<[u32]>::new_slice(4usize);
    if tid == 0u32 {
        res[0] = 0u32;
        res[1] = 0u32;
        res[2] = 0u32;
        res[3] = 0u32;
    }
    sync_cube();
    let ih = hi[tid as usize];
    let il = lo[tid as usize];
    let (eh, el) = wide_before(hi, lo, tid);
    let non_empty = ih != eh || il != el;
    let nothing_before = eh == 0u32 && el == 0u32;
    if non_empty
        && wide_ge(ih, il, goal_hi, goal_lo)
        && (nothing_before || !wide_ge(eh, el, goal_hi, goal_lo))
    {
        res[0] = 1u32;
        res[1] = tid;
        res[2] = eh;
        res[3] = el;
    }
    sync_cube();
    let found = res[0] == 1u32;
    let at = res[1];
    let bh = res[2];
    let bl = res[3];
    sync_cube();
    (found, at, bh, bl)
}

/// Read 2 over the vectors `start..end` of the row whose first vector is
/// `base`: the fixed-point mass of `exp(l - m)` of their logits added into
/// `pool` (1024 bins of `m - l`, 64-bit sums as `u32` pairs, zeroed
/// before). The last bin (16 nats down and deeper, still a weight up to 22
/// nats down) holds the deep tail of a real model's row, a third of its
/// vocabulary: every thread adds its share in registers and once into the
/// bin, instead of every lane of the workgroup adding into one shared
/// address. Whole vectors, two loads issued before the first is used (each
/// lane's work here, an exp and a shared atomic, is longer than in read 1,
/// which keeps four in flight). Every thread calls; a barrier must follow
/// before `pool` is read.
#[cube]
pub(crate) fn histogram_range<N: Size>(
    logits: &[Vector<f32, N>],
    base: u32,
    start: u32,
    end: u32,
    m: f32,
    pool: &Shared<[Atomic<u32>]>,
) {
    let mut deep_hi = 0u32;
    let mut deep_lo = 0u32;
    let mut i2 = start + UNIT_POS;
    while i2 + CUBE_DIM < end {
        let v0 = logits[(base + i2) as usize];
        let v1 = logits[(base + i2 + CUBE_DIM) as usize];
        let (h0, l0) = histogram_add_vector::<N>(v0, m, pool, deep_hi, deep_lo);
        let (h1, l1) = histogram_add_vector::<N>(v1, m, pool, h0, l0);
        deep_hi = h1;
        deep_lo = l1;
        i2 += 2u32 * CUBE_DIM;
    }
    while i2 < end {
        let v = logits[(base + i2) as usize];
        let (h, l) = histogram_add_vector::<N>(v, m, pool, deep_hi, deep_lo);
        deep_hi = h;
        deep_lo = l;
        i2 += CUBE_DIM;
    }
    if deep_lo > 0u32 || deep_hi > 0u32 {
        wide_atomic_add(pool, 2046u32, deep_hi, deep_lo);
    }
}

/// The `N` logits of `v` into read 2's histogram ([`histogram_add`]).
#[cube]
fn histogram_add_vector<N: Size>(
    v: Vector<f32, N>,
    m: f32,
    pool: &Shared<[Atomic<u32>]>,
    deep_hi: u32,
    deep_lo: u32,
) -> (u32, u32) {
    let mut dh = deep_hi;
    let mut dl = deep_lo;
    #[unroll]
    for k in 0..N::value() {
        let (h, l) = histogram_add(v.extract(k), m, pool, dh, dl);
        dh = h;
        dl = l;
    }
    (dh, dl)
}

/// Logit `l` into read 2's histogram of `m - l` (`pool`: 1024 bins of
/// 64-bit fixed-point sums, as `u32` pairs): the deepest bin into the
/// thread's own `(deep_hi, deep_lo)`, returned; the others by atomics.
#[cube]
fn histogram_add(
    l: f32,
    m: f32,
    pool: &Shared<[Atomic<u32>]>,
    deep_hi: u32,
    deep_lo: u32,
) -> (u32, u32) {
    let mut dh = deep_hi;
    let mut dl = deep_lo;
    let q = fixed_weight(f32::exp(l - m));
    if q > 0u32 {
        let b = nucleus_bin(l, m);
        if b == 1023u32 {
            let nl = dl + q;
            dh += select(nl < dl, 1u32, 0u32);
            dl = nl;
        } else {
            wide_atomic_add(pool, 2u32 * b, 0u32, q);
        }
    }
    (dh, dl)
}
