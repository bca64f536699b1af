//! Full-vocabulary `top_p -> [temperature] -> dist` as one kernel that
//! reads each row three times (plus a small part of it for the walk).
//!
//! The separate kernels ([`super::top_p_full`], [`super::temperature`] and
//! a full-row `dist`) read the row about fifteen times: eight weighted
//! radix passes over the whole row find the crossing logit, the masked row
//! is written out, scaled, and read three more times to draw. Here:
//!
//! 1. **max**: the row maximum `m`, its lowest position (always kept) and
//!    the row's validation key (first NaN / `+inf`);
//! 2. **histogram**: the mass of `w = exp(l - m)` in [`NUC_BINS`] bins of
//!    `m - l` (1/64 nat each over `[0, 16)` nats, deeper logits in the last
//!    bin), summed in fixed point ([`fixed_weight`]: `round(w · 2^31)`, 64-bit
//!    sums from `u32` shared atomics), so the sums are exact and do not
//!    depend on the order threads add them in. Scanning the bins from the
//!    top gives the crossing bin: the one where the mass from the maximum
//!    down first reaches `p·S`;
//! 3. **chunks**: each thread owns a contiguous chunk of positions and sums
//!    the `dist` weights `exp(sat(l / t) - sat(m / t))` (fixed point) of
//!    its logits in bins above the crossing bin (all kept); the crossing
//!    bin's logits are gathered into shared memory (up to [`NUC_GATHER`]).
//!
//! The crossing bin is then resolved exactly where it was gathered: a
//! weighted radix search over its order-preserving keys gives the crossing
//! key `T`, and its ties are kept in ascending position while the mass
//! before them is `< p·S` (as many as `ceil((p·S - above) / w_T)`, at
//! least one). The kept crossing logits join their chunks' sums, the chunk
//! holding `u·W` is found from the chunks' prefix, and that one chunk is
//! walked (read twice: `2/units` of a row). A crossing bin with more than
//! [`NUC_GATHER`] logits (near-flat rows, long runs of ties) is resolved
//! over the row instead: eight radix passes, a binary search over the
//! positions of the crossing key's ties (up to `log2 V + 1` passes) and the
//! chunks' crossing logits, each a read of the row (about 30 reads at
//! V = 151936 in the worst case).
//!
//! The rule is the device recipe's (and the CPU's, up to rounding): keep a
//! candidate iff the mass before it in canonical order (logit descending,
//! ties to the lowest position) is `< p·S`, always the first maximum; then
//! `dist` over the kept candidates in ascending id: the first with a
//! positive weight whose cumulative weight reaches `u·W`. Weights below
//! `2^-32` of the maximum's (logits more than 22 nats below it at `t = 1`)
//! count as zero mass: for `p <= 0.999` and vocabularies up to a million
//! such logits are never inside the nucleus (their total mass is below
//! `1e6 · e^-22 < 3e-4` of the maximum's), so the tokens are the CPU's.

// cubecl's frontend wants a variable declared before the branches that
// assign it (the radix and tie passes read shared memory or the row).
#![allow(unused_assignments)]

use super::*;

/// Fixed-point mass of a weight `w` in `[0, 1]`: `round(w · 2^31)`.
#[cube]
fn fixed_weight(w: f32) -> u32 {
    u32::cast_from(w * 2_147_483_648.0f32 + 0.5f32)
}

/// The histogram bin of a logit `l` below the row maximum `m`.
#[cube]
fn nucleus_bin(l: f32, m: f32) -> u32 {
    // Clamped as a float before the cast: converting a float beyond the
    // u32 range (the infinite depth of a `-inf` logit) or a NaN is
    // undefined on some backends.
    let d = (m - l) * 64.0f32;
    let d = select(d < 1023.0f32, d, 1023.0f32);
    u32::cast_from(select(d > 0.0f32, d, 0.0f32))
}

/// `l / t` saturated at `±f32::MAX` (`-inf` stays `-inf`), as the
/// temperature kernel writes it.
#[cube]
fn scaled(l: f32, t: f32) -> f32 {
    let max = f32::reinterpret(0x7F7F_FFFFu32);
    let q = l / t;
    let q = select(q > max, max, q);
    let q = select(q < -max, -max, q);
    select(u32::reinterpret(l) == 0xFF80_0000u32, l, q)
}

/// A 64-bit sum `(hi, lo)` as f32.
#[cube]
fn wide_f32(hi: u32, lo: u32) -> f32 {
    f32::cast_from(hi) * 4_294_967_296.0f32 + f32::cast_from(lo)
}

/// `(hi, lo) >= (hi2, lo2)` as 64-bit integers.
#[cube]
fn wide_ge(hi: u32, lo: u32, hi2: u32, lo2: u32) -> bool {
    hi > hi2 || (hi == hi2 && lo >= lo2)
}

/// The high word of `x · (hi, lo)` for `x` in `[0, 1]`, rounded down
/// through f32 (with [`frac_lo`], the fixed-point goal `p·S` or draw `u·W`).
#[cube]
fn frac_hi(x: f32, hi: u32, lo: u32) -> u32 {
    let v = x * wide_f32(hi, lo);
    u32::cast_from(v / 4_294_967_296.0f32)
}

/// The low word of `x · (hi, lo)` (see [`frac_hi`]).
#[cube]
fn frac_lo(x: f32, hi: u32, lo: u32) -> u32 {
    let v = x * wide_f32(hi, lo);
    let h = u32::cast_from(v / 4_294_967_296.0f32);
    u32::cast_from(v - f32::cast_from(h) * 4_294_967_296.0f32)
}

/// The logit of an order-preserving key ([`order_key`]'s inverse).
#[cube]
fn key_logit(key: u32) -> f32 {
    let bits = select(
        (key & 0x8000_0000u32) != 0u32,
        key & 0x7FFF_FFFFu32,
        key ^ 0xFFFF_FFFFu32,
    );
    f32::reinterpret(bits)
}

// Slots of the kernel's shared scalars.
const S_CB: usize = 0;
const S_ABOVE_HI: usize = 1;
const S_ABOVE_LO: usize = 2;
const S_GOAL_HI: usize = 3;
const S_GOAL_LO: usize = 4;
const S_BIN: usize = 5;
const S_CHUNK: usize = 6;
const S_BEFORE_HI: usize = 7;
const S_BEFORE_LO: usize = 8;
const S_TARGET_HI: usize = 9;
const S_TARGET_LO: usize = 10;
const S_TOTAL_ZERO: usize = 11;
const S_LEN: usize = 12;

/// Read 1 of the full-row kernels: the row's largest key into
/// `best_key[0]`, its lowest position into `best_pos[0]` and the row's
/// validation key (first NaN `2i` / `+inf` `2i + 1`, else `2·width`) into
/// `bads[0]`. Every thread calls; all see the results.
#[cube]
fn row_max_and_validation(
    logits: &[f32],
    base: u32,
    width: u32,
    best_key: &mut Shared<[u32]>,
    best_pos: &mut Shared<[u32]>,
    bads: &mut Shared<[u32]>,
) {
    let tid = UNIT_POS;
    let none_pos = 2u32 * width;
    let mut bad = none_pos;
    let mut bk = 0u32;
    let mut bp = width;
    let mut i = tid;
    while i < width {
        let x = logits[(base + i) as usize];
        let key = order_key(x);
        if key > bk {
            bk = key;
            bp = i;
        }
        if bad == none_pos && (u32::reinterpret(x) & 0x7F80_0000u32) == 0x7F80_0000u32 {
            bad = bad_key(x, i, none_pos);
        }
        i += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(bads);
    best_key[tid as usize] = bk;
    best_pos[tid as usize] = bp;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let k2 = best_key[(tid + half) as usize];
            let p2 = best_pos[(tid + half) as usize];
            let k1 = best_key[tid as usize];
            if k2 > k1 || (k2 == k1 && p2 < best_pos[tid as usize]) {
                best_key[tid as usize] = k2;
                best_pos[tid as usize] = p2;
            }
        }
        sync_cube();
        half /= 2u32;
    }
}

/// Whether position `j` (logit `l`) is kept: with `min_p`, `l >= thr` or
/// the first maximum; else the nucleus (bins above the crossing bin `cb`,
/// and in it the keys above `prefix` and its ties up to `last_pos`).
#[cube]
fn kept_at(
    l: f32,
    j: u32,
    m: f32,
    cb: u32,
    prefix: u32,
    last_pos: u32,
    thr: f32,
    first: u32,
    #[comptime] min_p: bool,
) -> bool {
    let mut kept = false;
    if comptime!(min_p) {
        kept = l >= thr || j == first;
    } else {
        let b = nucleus_bin(l, m);
        let key = order_key(l);
        let q = fixed_weight(f32::exp(l - m));
        kept =
            b < cb || (b == cb && q > 0u32 && (key > prefix || (key == prefix && j <= last_pos)));
    }
    kept
}

/// The draw of the full-row kernels, once every thread has put the
/// fixed-point `dist` weight of the kept logits of its contiguous chunk
/// (`chunk` positions) in `chunk_hi/lo[tid]`: the chunk holding `u·W` from
/// the chunks' prefix, then that chunk split over the threads, each part
/// summed, and the part that holds `u·W` walked. Leaves the drawn position
/// in `bads[0]` (`2·width` when nothing is kept) and whether `W = 0` in
/// `sel[S_TOTAL_ZERO]`. Every thread calls.
#[cube]
fn draw_position(
    logits: &[f32],
    base: u32,
    width: u32,
    chunk: u32,
    u_row: f32,
    tr: f32,
    qm: f32,
    m: f32,
    cb: u32,
    prefix: u32,
    last_pos: u32,
    thr: f32,
    first: u32,
    chunk_hi: &mut Shared<[u32]>,
    chunk_lo: &mut Shared<[u32]>,
    part_hi: &mut Shared<[u32]>,
    part_lo: &mut Shared<[u32]>,
    bads: &mut Shared<[u32]>,
    sel: &mut Shared<[u32]>,
    #[comptime] min_p: bool,
) {
    let tid = UNIT_POS;
    let none_pos = 2u32 * width;
    // The draw: the chunk holding u·W, from the chunks' prefix.
    if tid == 0u32 {
        let mut th = 0u32;
        let mut tl = 0u32;
        for c in 0..CUBE_DIM {
            let nl = tl + chunk_lo[c as usize];
            th += chunk_hi[c as usize] + select(nl < tl, 1u32, 0u32);
            tl = nl;
        }
        let mut gh2 = frac_hi(u_row, th, tl);
        let mut gl2 = frac_lo(u_row, th, tl);
        if !wide_ge(th, tl, gh2, gl2) {
            gh2 = th;
            gl2 = tl;
        }
        let mut ch = 0u32;
        let mut cl = 0u32;
        let mut found = false;
        let mut at = 0u32;
        let mut bh = 0u32;
        let mut bl = 0u32;
        for c in 0..CUBE_DIM {
            let xh0 = chunk_hi[c as usize];
            let xl0 = chunk_lo[c as usize];
            let nl = cl + xl0;
            let nh = ch + xh0 + select(nl < cl, 1u32, 0u32);
            if !found && (xh0 > 0u32 || xl0 > 0u32) && wide_ge(nh, nl, gh2, gl2) {
                found = true;
                at = c;
                bh = ch;
                bl = cl;
            }
            ch = nh;
            cl = nl;
        }
        sel[S_CHUNK] = at;
        sel[S_BEFORE_HI] = bh;
        sel[S_BEFORE_LO] = bl;
        sel[S_TARGET_HI] = gh2;
        sel[S_TARGET_LO] = gl2;
        sel[S_TOTAL_ZERO] = select(th == 0u32 && tl == 0u32, 1u32, 0u32);
    }
    sync_cube();

    // The chunk, split over the threads: each sums its part, then the part
    // that holds u·W finds the token.
    let c_start = sel[S_CHUNK] * chunk;
    let c_end = select(c_start + chunk < width, c_start + chunk, width);
    let sub = (chunk + CUBE_DIM - 1u32) / CUBE_DIM;
    let s_start = select(c_start + tid * sub < c_end, c_start + tid * sub, c_end);
    let s_end = select(s_start + sub < c_end, s_start + sub, c_end);
    let mut sh = 0u32;
    let mut sl = 0u32;
    for j in s_start..s_end {
        let l = logits[(base + j) as usize];
        if kept_at(l, j, m, cb, prefix, last_pos, thr, first, min_p) {
            let e = fixed_weight(f32::exp(scaled(l, tr) - qm));
            let nl = sl + e;
            sh += select(nl < sl, 1u32, 0u32);
            sl = nl;
        }
    }
    part_hi[tid as usize] = sh;
    part_lo[tid as usize] = sl;
    sync_cube();
    if tid == 0u32 {
        let mut ch = sel[S_BEFORE_HI];
        let mut cl = sel[S_BEFORE_LO];
        for c in 0..CUBE_DIM {
            let xh0 = part_hi[c as usize];
            let xl0 = part_lo[c as usize];
            part_hi[c as usize] = ch;
            part_lo[c as usize] = cl;
            let nl = cl + xl0;
            ch = ch + xh0 + select(nl < cl, 1u32, 0u32);
            cl = nl;
        }
    }
    sync_cube();
    let target_hi = sel[S_TARGET_HI];
    let target_lo = sel[S_TARGET_LO];
    let mut ch = part_hi[tid as usize];
    let mut cl = part_lo[tid as usize];
    let mut hit = none_pos;
    for j in s_start..s_end {
        let l = logits[(base + j) as usize];
        if kept_at(l, j, m, cb, prefix, last_pos, thr, first, min_p) {
            let e = fixed_weight(f32::exp(scaled(l, tr) - qm));
            let nl = cl + e;
            ch += select(nl < cl, 1u32, 0u32);
            cl = nl;
            if e > 0u32 && hit == none_pos && wide_ge(ch, cl, target_hi, target_lo) {
                hit = j;
            }
        }
    }
    bads[tid as usize] = hit;
    shared_min(bads);
}

/// Thread 0 writes the row's token (the drawn position in `bads[0]`; the
/// first maximum at a greedy temperature; `-1` with nothing to draw), or
/// its status code ([`code_key`]), and its own validation key.
#[cube]
fn write_token(
    out: &mut [i32],
    out_bad: &mut [i32],
    bad_in: &[i32],
    row: u32,
    width: u32,
    none: u32,
    tr: f32,
    greedy_below: f32,
    first: u32,
    dead: bool,
    own_bad: u32,
    bads: &Shared<[u32]>,
    sel: &Shared<[u32]>,
    #[comptime] codes: u32,
) {
    if UNIT_POS == 0u32 {
        let found = bads[0];
        let mut tok = select(found < width, i32::cast_from(found), -1i32);
        tok = select(sel[S_TOTAL_ZERO] == 1u32, -1i32, tok);
        if tr < greedy_below {
            tok = i32::cast_from(first);
        }
        tok = select(dead, -1i32, tok);
        let code = code_key(bad_in, own_bad, row, none, codes);
        out[row as usize] = with_code(tok, code, none);
        out_bad[row as usize] = i32::cast_from(own_bad);
    }
}

#[cube(launch_unchecked)]
pub(in crate::kernels) fn top_p_dist_full_rows(
    logits: &[f32],
    p: &[f32],
    t: &[f32],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    width: u32,
    none: u32,
    greedy_below: f32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
    #[comptime] codes: u32,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut part_hi = Shared::<[u32]>::new_slice(units);
    let mut part_lo = Shared::<[u32]>::new_slice(units);
    let mut chunk_hi = Shared::<[u32]>::new_slice(units);
    let mut chunk_lo = Shared::<[u32]>::new_slice(units);
    let pool = Shared::<[Atomic<u32>]>::new_slice(2usize * 1024usize);
    let rbin = Shared::<[Atomic<u32>]>::new_slice(32usize);
    let counter = Shared::<[Atomic<u32>]>::new_slice(1usize);
    let mut sel = Shared::<[u32]>::new_slice(S_LEN);

    // Read 1: the maximum and its lowest position, the row's validation.
    row_max_and_validation(logits, base, width, &mut best_key, &mut best_pos, &mut bads);
    let own_bad = bads[0];
    let first = best_pos[0];
    let dead = best_key[0] <= NEG_INF_KEY;
    let m_raw = logits[(base + select(first < width, first, 0u32)) as usize];
    let m = select(dead, 0.0f32, m_raw);
    let mut tr = 1.0f32;
    if comptime!(has_t) {
        tr = t[row as usize];
    }
    let qm = scaled(m, tr);
    let all = p[row as usize] > f32::reinterpret(0x7F7F_FFFFu32);

    // Read 2: the fixed-point mass histogram of `m - l`.
    let mut z = tid;
    while z < 2048u32 {
        pool[z as usize].store(0u32);
        z += CUBE_DIM;
    }
    sync_cube();
    let mut j2 = tid;
    while j2 < width {
        let l = logits[(base + j2) as usize];
        let q = fixed_weight(f32::exp(l - m));
        if q > 0u32 {
            let b = nucleus_bin(l, m);
            let old = pool[(2u32 * b) as usize].fetch_add(q);
            if old > 0xFFFF_FFFFu32 - q {
                pool[(2u32 * b + 1u32) as usize].fetch_add(1u32);
            }
        }
        j2 += CUBE_DIM;
    }
    sync_cube();
    // Each thread sums a group of consecutive bins.
    let per = (1024u32 + CUBE_DIM - 1u32) / CUBE_DIM;
    let mut gh = 0u32;
    let mut gl = 0u32;
    for k in 0..per {
        let b = tid * per + k;
        if b < 1024u32 {
            let lo = pool[(2u32 * b) as usize].load();
            let hi = pool[(2u32 * b + 1u32) as usize].load();
            let nl = gl + lo;
            gh += hi + select(nl < gl, 1u32, 0u32);
            gl = nl;
        }
    }
    part_hi[tid as usize] = gh;
    part_lo[tid as usize] = gl;
    sync_cube();
    if tid == 0u32 {
        // S, the goal p·S, then the crossing group and bin from the top.
        let mut sh = 0u32;
        let mut sl = 0u32;
        for g in 0..CUBE_DIM {
            let nl = sl + part_lo[g as usize];
            sh += part_hi[g as usize] + select(nl < sl, 1u32, 0u32);
            sl = nl;
        }
        let pr = select(all, 1.0f32, p[row as usize]);
        let mut goal_hi = frac_hi(pr, sh, sl);
        let mut goal_lo = frac_lo(pr, sh, sl);
        if !wide_ge(sh, sl, goal_hi, goal_lo) {
            goal_hi = sh;
            goal_lo = sl;
        }
        let mut ch = 0u32;
        let mut cl = 0u32;
        let mut found = false;
        let mut cb = 1024u32;
        let mut ah = 0u32;
        let mut al = 0u32;
        for g in 0..CUBE_DIM {
            let ph = part_hi[g as usize];
            let pl = part_lo[g as usize];
            let nl = cl + pl;
            let nh = ch + ph + select(nl < cl, 1u32, 0u32);
            if !found && (ph > 0u32 || pl > 0u32) && wide_ge(nh, nl, goal_hi, goal_lo) {
                found = true;
                // The bin inside this group.
                let mut bh = ch;
                let mut bl = cl;
                let mut inner = false;
                for k in 0..per {
                    let b = g * per + k;
                    if b < 1024u32 && !inner {
                        let lo = pool[(2u32 * b) as usize].load();
                        let hi = pool[(2u32 * b + 1u32) as usize].load();
                        let xl = bl + lo;
                        let xh = bh + hi + select(xl < bl, 1u32, 0u32);
                        if (hi > 0u32 || lo > 0u32) && wide_ge(xh, xl, goal_hi, goal_lo) {
                            inner = true;
                            cb = b;
                            ah = bh;
                            al = bl;
                        }
                        bh = xh;
                        bl = xl;
                    }
                }
            }
            ch = nh;
            cl = nl;
        }
        // No bin (an empty row, or the whole row kept): everything is above.
        if all || (sh == 0u32 && sl == 0u32) {
            cb = 1024u32;
        }
        sel[S_CB] = cb;
        sel[S_ABOVE_HI] = ah;
        sel[S_ABOVE_LO] = al;
        sel[S_GOAL_HI] = goal_hi;
        sel[S_GOAL_LO] = goal_lo;
        counter[0].store(0u32);
    }
    sync_cube();
    let cb = sel[S_CB];
    let goal_hi = sel[S_GOAL_HI];
    let goal_lo = sel[S_GOAL_LO];

    // Read 3: each thread's contiguous chunk: dist weights of the logits
    // above the crossing bin; the crossing bin's logits gathered.
    let chunk = (width + CUBE_DIM - 1u32) / CUBE_DIM;
    let start = select(tid * chunk < width, tid * chunk, width);
    let end = select(start + chunk < width, start + chunk, width);
    let mut wh = 0u32;
    let mut wl = 0u32;
    for j in start..end {
        let l = logits[(base + j) as usize];
        let b = nucleus_bin(l, m);
        if b < cb {
            let q = fixed_weight(f32::exp(scaled(l, tr) - qm));
            let nl = wl + q;
            wh += select(nl < wl, 1u32, 0u32);
            wl = nl;
        } else if b == cb && fixed_weight(f32::exp(l - m)) > 0u32 {
            let at = counter[0].fetch_add(1u32);
            if at < NUC_GATHER {
                pool[(2u32 * at) as usize].store(u32::reinterpret(l));
                pool[(2u32 * at + 1u32) as usize].store(j);
            }
        }
    }
    sync_cube();

    // The crossing bin, resolved: T (its crossing key), `above` (the mass
    // strictly above T) and P (the last kept position among T's ties).
    let gathered = counter[0].load();
    let overflow = gathered > NUC_GATHER;
    let n_src = select(overflow, width, gathered);
    let resolve = cb < 1024u32;
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut ah = sel[S_ABOVE_HI];
    let mut al = sel[S_ABOVE_LO];
    let mut last_pos = width;
    if resolve {
        for pass in 0..8u32 {
            let shift = 28u32 - pass * 4u32;
            if tid < 32u32 {
                rbin[tid as usize].store(0u32);
            }
            sync_cube();
            let mut j = tid;
            while j < n_src {
                let mut bits = 0u32;
                if overflow {
                    bits = u32::reinterpret(logits[(base + j) as usize]);
                } else {
                    bits = pool[(2u32 * j) as usize].load();
                }
                let l = f32::reinterpret(bits);
                let q = fixed_weight(f32::exp(l - m));
                let key = order_key(l);
                if nucleus_bin(l, m) == cb && q > 0u32 && (key & mask) == prefix {
                    let slot = 2u32 * ((key >> shift) & 15u32);
                    let old = rbin[slot as usize].fetch_add(q);
                    if old > 0xFFFF_FFFFu32 - q {
                        rbin[(slot + 1u32) as usize].fetch_add(1u32);
                    }
                }
                j += CUBE_DIM;
            }
            sync_cube();
            if tid == 0u32 {
                // From the top bin down: the first non-empty one where the
                // mass reaches the goal (the histogram's sums are the same
                // integers, so one does).
                let mut ch = ah;
                let mut cl = al;
                let mut done = false;
                let mut chosen = 0u32;
                let mut ch_hi = ah;
                let mut ch_lo = al;
                for r in 0..16u32 {
                    let b = 15u32 - r;
                    let lo = rbin[(2u32 * b) as usize].load();
                    let hi = rbin[(2u32 * b + 1u32) as usize].load();
                    if !done && (hi > 0u32 || lo > 0u32) {
                        let xl = cl + lo;
                        let xh = ch + hi + select(xl < cl, 1u32, 0u32);
                        // The lowest non-empty bin, if rounding never reaches.
                        chosen = b;
                        ch_hi = ch;
                        ch_lo = cl;
                        if wide_ge(xh, xl, goal_hi, goal_lo) {
                            done = true;
                        }
                        ch = xh;
                        cl = xl;
                    }
                }
                sel[S_BIN] = chosen;
                sel[S_ABOVE_HI] = ch_hi;
                sel[S_ABOVE_LO] = ch_lo;
            }
            sync_cube();
            prefix |= sel[S_BIN] << shift;
            mask |= 15u32 << shift;
            ah = sel[S_ABOVE_HI];
            al = sel[S_ABOVE_LO];
            sync_cube();
        }
        // T's ties: how many there are, how many the goal keeps.
        let wt = fixed_weight(f32::exp(key_logit(prefix) - m));
        let lacking = wide_f32(goal_hi, goal_lo) - wide_f32(ah, al);
        let need_f = f32::ceil(lacking / f32::cast_from(select(wt > 0u32, wt, 1u32)));
        let need_f = select(need_f > 4.0e9f32, 4.0e9f32, need_f);
        let need = select(need_f >= 1.0f32, u32::cast_from(need_f), 1u32);
        // The smallest position P with `need` ties at or before it (every
        // tie when there are no more than `need`).
        let mut lo_p = 0u32;
        let mut hi_p = width;
        let mut searching = true;
        while searching {
            let mid = select(hi_p == width, width - 1u32, (lo_p + hi_p) / 2u32);
            if tid == 0u32 {
                counter[0].store(0u32);
            }
            sync_cube();
            let mut mine = 0u32;
            let mut j = tid;
            while j < n_src {
                let mut bits = 0u32;
                let mut pos = 0u32;
                if overflow {
                    bits = u32::reinterpret(logits[(base + j) as usize]);
                    pos = j;
                } else {
                    bits = pool[(2u32 * j) as usize].load();
                    pos = pool[(2u32 * j + 1u32) as usize].load();
                }
                if order_key(f32::reinterpret(bits)) == prefix && pos <= mid {
                    mine += 1u32;
                }
                j += CUBE_DIM;
            }
            if mine > 0u32 {
                counter[0].fetch_add(mine);
            }
            sync_cube();
            let cnt = counter[0].load();
            sync_cube();
            if hi_p == width {
                // The first round counts every tie.
                if cnt <= need {
                    lo_p = width - 1u32;
                    hi_p = width - 1u32;
                } else {
                    hi_p = width - 1u32;
                }
            } else if cnt >= need {
                hi_p = mid;
            } else {
                lo_p = mid + 1u32;
            }
            searching = lo_p < hi_p;
        }
        last_pos = lo_p;

        // The kept crossing logits join their chunks' sums.
        if overflow {
            for j in start..end {
                let l = logits[(base + j) as usize];
                let key = order_key(l);
                let q = fixed_weight(f32::exp(l - m));
                if nucleus_bin(l, m) == cb
                    && q > 0u32
                    && (key > prefix || (key == prefix && j <= last_pos))
                {
                    let e = fixed_weight(f32::exp(scaled(l, tr) - qm));
                    let nl = wl + e;
                    wh += select(nl < wl, 1u32, 0u32);
                    wl = nl;
                }
            }
        } else {
            for k in 0..gathered {
                let pos = pool[(2u32 * k + 1u32) as usize].load();
                if pos >= start && pos < end {
                    let l = f32::reinterpret(pool[(2u32 * k) as usize].load());
                    let key = order_key(l);
                    if key > prefix || (key == prefix && pos <= last_pos) {
                        let e = fixed_weight(f32::exp(scaled(l, tr) - qm));
                        let nl = wl + e;
                        wh += select(nl < wl, 1u32, 0u32);
                        wl = nl;
                    }
                }
            }
        }
    }
    chunk_hi[tid as usize] = wh;
    chunk_lo[tid as usize] = wl;
    sync_cube();

    // The draw.
    draw_position(
        logits,
        base,
        width,
        chunk,
        u[row as usize],
        tr,
        qm,
        m,
        cb,
        prefix,
        last_pos,
        0.0f32,
        first,
        &mut chunk_hi,
        &mut chunk_lo,
        &mut part_hi,
        &mut part_lo,
        &mut bads,
        &mut sel,
        false,
    );
    write_token(
        out,
        out_bad,
        bad_in,
        row,
        width,
        none,
        tr,
        greedy_below,
        first,
        dead,
        own_bad,
        &bads,
        &sel,
        codes,
    );
}

#[cube(launch_unchecked)]
pub(in crate::kernels) fn min_p_dist_full_rows(
    logits: &[f32],
    log_p: &[f32],
    t: &[f32],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    width: u32,
    none: u32,
    greedy_below: f32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
    #[comptime] codes: u32,
    #[comptime] keep_all: bool,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut part_hi = Shared::<[u32]>::new_slice(units);
    let mut part_lo = Shared::<[u32]>::new_slice(units);
    let mut chunk_hi = Shared::<[u32]>::new_slice(units);
    let mut chunk_lo = Shared::<[u32]>::new_slice(units);
    let mut sel = Shared::<[u32]>::new_slice(S_LEN);

    // Read 1: the maximum and its lowest position, the row's validation.
    row_max_and_validation(logits, base, width, &mut best_key, &mut best_pos, &mut bads);
    let own_bad = bads[0];
    let first = best_pos[0];
    let dead = best_key[0] <= NEG_INF_KEY;
    let m_raw = logits[(base + select(first < width, first, 0u32)) as usize];
    let m = select(dead, 0.0f32, m_raw);
    let mut tr = 1.0f32;
    if comptime!(has_t) {
        tr = t[row as usize];
    }
    let qm = scaled(m, tr);
    // `l >= max + ln p`, as the CPU computes it (`-inf` on no-op rows).
    let mut thr = f32::reinterpret(0xFF80_0000u32);
    if comptime!(!keep_all) {
        thr = m + log_p[row as usize];
    }

    // Read 2: each thread's contiguous chunk, the dist weights of the kept.
    let chunk = (width + CUBE_DIM - 1u32) / CUBE_DIM;
    let start = select(tid * chunk < width, tid * chunk, width);
    let end = select(start + chunk < width, start + chunk, width);
    let mut wh = 0u32;
    let mut wl = 0u32;
    for j in start..end {
        let l = logits[(base + j) as usize];
        if l >= thr || j == first {
            let q = fixed_weight(f32::exp(scaled(l, tr) - qm));
            let nl = wl + q;
            wh += select(nl < wl, 1u32, 0u32);
            wl = nl;
        }
    }
    chunk_hi[tid as usize] = wh;
    chunk_lo[tid as usize] = wl;
    sync_cube();

    draw_position(
        logits,
        base,
        width,
        chunk,
        u[row as usize],
        tr,
        qm,
        m,
        0u32,
        0u32,
        0u32,
        thr,
        first,
        &mut chunk_hi,
        &mut chunk_lo,
        &mut part_hi,
        &mut part_lo,
        &mut bads,
        &mut sel,
        true,
    );
    write_token(
        out,
        out_bad,
        bad_in,
        row,
        width,
        none,
        tr,
        greedy_below,
        first,
        dead,
        own_bad,
        &bads,
        &sel,
        codes,
    );
}

#[cube(launch_unchecked)]
pub(in crate::kernels) fn min_p_rows(
    logits: &[f32],
    ids: &[i32],
    log_p: &[f32],
    out: &mut [f32],
    out_bad: &mut [i32],
    width: u32,
    #[comptime] units: usize,
    #[comptime] has_ids: bool,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_id = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let neg_inf = f32::reinterpret(0xFF80_0000u32);

    // Pass 1: the first maximum in canonical order (ties to the lowest id)
    // and the row's validation.
    let none_pos = 2u32 * width;
    let mut bad = none_pos;
    let mut bk = 0u32;
    let mut bid = 0xFFFF_FFFFu32;
    let mut bp = width;
    let mut i = tid;
    while i < width {
        let x = logits[(base + i) as usize];
        let key = order_key(x);
        let mut id = i;
        if comptime!(has_ids) {
            id = u32::cast_from(ids[(base + i) as usize]);
        }
        if key > bk || (key == bk && id < bid) {
            bk = key;
            bid = id;
            bp = i;
        }
        if bad == none_pos && (u32::reinterpret(x) & 0x7F80_0000u32) == 0x7F80_0000u32 {
            bad = bad_key(x, i, none_pos);
        }
        i += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    best_key[tid as usize] = bk;
    best_id[tid as usize] = bid;
    best_pos[tid as usize] = bp;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let k2 = best_key[(tid + half) as usize];
            let d2 = best_id[(tid + half) as usize];
            let k1 = best_key[tid as usize];
            if k2 > k1 || (k2 == k1 && d2 < best_id[tid as usize]) {
                best_key[tid as usize] = k2;
                best_id[tid as usize] = d2;
                best_pos[tid as usize] = best_pos[(tid + half) as usize];
            }
        }
        sync_cube();
        half /= 2u32;
    }
    let first = best_pos[0];
    let m_raw = logits[(base + select(first < width, first, 0u32)) as usize];
    let m = select(best_key[0] <= NEG_INF_KEY, 0.0f32, m_raw);
    let thr = m + log_p[row as usize];
    // Pass 2: the kept logits, `-inf` elsewhere.
    let mut j = tid;
    while j < width {
        let l = logits[(base + j) as usize];
        out[(base + j) as usize] = select(l >= thr || j == first, l, neg_inf);
        j += CUBE_DIM;
    }
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
}

/// [`super::super::min_p`] on rows it takes.
pub(in crate::kernels) fn min_p(
    logits: &Tensor<2>,
    ids: Option<&Tensor<2, Int>>,
    log_p: &Tensor<2>,
) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let log_p = resolve_float(log_p)?.0;
    let ids = match ids {
        Some(ids) => Some(resolve_int(ids)?),
        None => None,
    };
    let units = units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(
        client.clone(),
        device.clone(),
        Shape::new([b, n]),
        DType::F32,
    );
    let bad = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // Without ids the kernel never reads them: any int buffer will do.
    let ids_handle = ids
        .as_ref()
        .map_or(bad.handle.clone(), |i| i.handle.clone());
    let ids_len = if ids.is_some() { b * n } else { b };
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        min_p_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(ids_handle, ids_len),
            BufferArg::from_raw_parts(log_p.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            units as usize,
            ids.is_some(),
        )
    }
    crate::launches::declare_read("min_p_rows", 8 * b * n + 4 * ids_len + 4 * b);
    Some((
        Tensor::<2>::from_primitive::<Cube>(register(out, &fusion)),
        Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    ))
}

/// [`super::super::cut_dist_full`] on rows it takes.
pub(in crate::kernels) fn cut_dist_full(
    logits: &Tensor<2>,
    cut: FullCut<'_>,
    t: Option<&Tensor<2>>,
    u: &Tensor<2>,
    greedy_below: f32,
    codes: TokenCodes<'_>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let u = resolve_float(u)?.0;
    // `All` never reads its parameter: any f32 buffer of `B` will do.
    let (param, min_p) = match cut {
        FullCut::TopP(p) => (resolve_float(p)?.0, false),
        FullCut::MinP(log_p) => (resolve_float(log_p)?.0, true),
        FullCut::All => (u.clone(), true),
    };
    let keep_all = matches!(cut, FullCut::All);
    let t = match t {
        Some(t) => Some(resolve_float(t)?.0),
        None => None,
    };
    let (mode, keys, none) = codes.resolve(&l, b, n)?;
    let units = full_row_units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out =
        empty_device_contiguous_dtype(client.clone(), device.clone(), Shape::new([b]), DType::I32);
    let bad = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // Without a temperature the kernel never reads `t`: any f32 buffer will do.
    let t_handle = t
        .as_ref()
        .map_or(param.handle.clone(), |t| t.handle.clone());
    let (cubes, dim) = (CubeCount::Static(b as u32, 1, 1), CubeDim::new_1d(units));
    // SAFETY: every index the kernels form is inside their buffers (row
    // bases and loops bounded by the width, bins clamped to `NUC_BINS`,
    // gathered slots to `NUC_GATHER`, shared slices by their sizes).
    unsafe {
        let (a0, a1, a2, a3, a4, a5, a6) = (
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(param.handle.clone(), b),
            BufferArg::from_raw_parts(t_handle, b),
            BufferArg::from_raw_parts(u.handle.clone(), b),
            BufferArg::from_raw_parts(keys.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
        );
        if min_p {
            min_p_dist_full_rows::launch_unchecked(
                &client,
                cubes,
                dim,
                a0,
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
                n as u32,
                none,
                greedy_below,
                units as usize,
                t.is_some(),
                mode,
                keep_all,
            )
        } else {
            top_p_dist_full_rows::launch_unchecked(
                &client,
                cubes,
                dim,
                a0,
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
                n as u32,
                none,
                greedy_below,
                units as usize,
                t.is_some(),
                mode,
            )
        }
    }
    // top_p: max, histogram and chunk passes; min_p: max and chunk passes;
    // the drawn chunk twice; the row scalars. A top_p crossing bin of more
    // than `NUC_GATHER` logits adds passes over the row (module doc); not
    // counted here.
    let passes = if min_p { 2 } else { 3 };
    let chunk = n.div_ceil(units as usize);
    let name = match cut {
        FullCut::TopP(_) => "top_p_dist_full_rows",
        FullCut::MinP(_) => "min_p_dist_full_rows",
        FullCut::All => "dist_all_full_rows",
    };
    crate::launches::declare_read(name, 4 * b * (passes * n + 2 * chunk) + 16 * b);
    Some((
        Tensor::<1, Int>::from_primitive::<Cube>(register(out, &fusion)),
        Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    ))
}
