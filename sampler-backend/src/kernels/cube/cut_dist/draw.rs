//! What both full-row kernels share: the row head (read 1: the maximum,
//! its first position, the row's validation and its temperature), which
//! positions a cut keeps (`kept_at`), the `dist` weight of a logit, and
//! the draw both end with (`draw_token`: the chunk holding `u·W`, the walk
//! of it, the token or status code written).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{
    LOADS_IN_FLIGHT, NEG_INF_KEY, chunk_len, code_key, logit_at, max_logit_vec, merge_row_parts,
    order_key, range_max_and_validation_vec, scaled, shared_min, with_code,
};
use super::fixed::{
    first_reaching, fixed_weight, nucleus_bin, wide_ge, wide_goal, wide_scan, wide_total,
};

/// A row of a full-row kernel after read 1 ([`read_row_head`]).
#[derive(CubeType, Clone)]
pub(crate) struct RowHead {
    /// The row (one cube each).
    pub(crate) row: u32,
    /// The index of the row's first vector (`lanes` logits each).
    pub(crate) base: u32,
    /// Logits per vector (`N`: 4 where the row allows 16-byte loads, else 1).
    pub(crate) lanes: u32,
    /// The row's width in logits.
    pub(crate) width: u32,
    /// The first maximum's position (`width` for a row without one).
    pub(crate) first: u32,
    /// Whether the row has no finite logit.
    pub(crate) dead: bool,
    /// The row's validation key (`2·width` for a valid row).
    pub(crate) own_bad: u32,
    /// The maximum (0 for a dead row).
    pub(crate) m: f32,
    /// The row's temperature (1 without one).
    pub(crate) tr: f32,
    /// The maximum at that temperature, `sat(m / tr)`.
    pub(crate) qm: f32,
}

/// Read 1 of the full-row kernels ([`range_max_and_validation_vec`]: whole
/// vectors, several loads in flight) and the row's temperature (`t[row]`
/// with `has_t`). `width` is a multiple of `lanes`. With `split`, read 1
/// was done by `argmax_part_rows` over `parts` segments of the row, and
/// its partial results are merged instead ([`merge_row_parts`]: the same
/// maximum, first position and validation key). Every thread calls.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_row_head<N: Size>(
    logits: &[Vector<f32, N>],
    t: &[f32],
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    parts: u32,
    row: u32,
    width: u32,
    lanes: u32,
    best_key: &mut Shared<[u32]>,
    best_pos: &mut Shared<[u32]>,
    bads: &mut Shared<[u32]>,
    #[comptime] has_t: bool,
    #[comptime] split: bool,
) -> RowHead {
    let row_v = width / lanes;
    let base = row * row_v;
    if comptime!(split) {
        merge_row_parts(
            part_key, part_pos, part_bad, row, parts, width, best_key, best_pos, bads,
        );
    } else {
        range_max_and_validation_vec::<N>(
            logits, base, 0u32, row_v, lanes, width, best_key, best_pos, bads,
        );
    }
    let own_bad = bads[0];
    let first = best_pos[0];
    let dead = best_key[0] <= NEG_INF_KEY;
    let m = max_logit_vec::<N>(logits, base, lanes, width, first, dead);
    let mut tr = 1.0f32;
    if comptime!(has_t) {
        tr = t[row as usize];
    }
    let qm = scaled(m, tr);
    RowHead {
        row,
        base,
        lanes,
        width,
        first,
        dead,
        own_bad,
        m,
        tr,
        qm,
    }
}

/// The positions a full-row kernel's cut keeps ([`kept_at`]).
#[derive(CubeType, Clone)]
pub(crate) struct Cut {
    /// `top_p`: the crossing bin (the bins above it are kept; 1024 keeps
    /// every bin) ...
    pub(crate) cb: u32,
    /// ... and in it the keys above `prefix` ...
    pub(crate) prefix: u32,
    /// ... and `prefix`'s ties up to this position.
    pub(crate) last_pos: u32,
    /// `min_p`: `l >= thr` is kept (`-inf` keeps the whole row).
    pub(crate) thr: f32,
}

/// Whether position `j` (logit `l`) is kept: with `min_p`, `l >= thr` or
/// the first maximum; else the nucleus (bins above the crossing bin `cb`,
/// and in it the keys above `prefix` and its ties up to `last_pos`).
#[cube]
pub(crate) fn kept_at(l: f32, j: u32, head: &RowHead, cut: &Cut, #[comptime] min_p: bool) -> bool {
    let mut kept = false;
    if comptime!(min_p) {
        kept = l >= cut.thr || j == head.first;
    } else {
        let b = nucleus_bin(l, head.m);
        let key = order_key(l);
        let q = fixed_weight(f32::exp(l - head.m));
        kept = b < cut.cb
            || (b == cut.cb
                && q > 0u32
                && (key > cut.prefix || (key == cut.prefix && j <= cut.last_pos)));
    }
    kept
}

/// The fixed-point `dist` weight of a kept logit `l`:
/// `round(exp(sat(l / t) - sat(m / t)) · 2^31)`.
#[cube]
pub(crate) fn draw_weight(l: f32, head: &RowHead) -> u32 {
    fixed_weight(f32::exp(scaled(l, head.tr) - head.qm))
}

/// The fixed-point `dist` weights of the kept logits at positions
/// `start..end` of the row, summed as a 64-bit `(hi, lo)`.
#[cube]
pub(crate) fn kept_weight_sum<N: Size>(
    logits: &[Vector<f32, N>],
    head: &RowHead,
    cut: &Cut,
    start: u32,
    end: u32,
    #[comptime] min_p: bool,
) -> (u32, u32) {
    let mut hi = 0u32;
    let mut lo = 0u32;
    for j in start..end {
        let l = logit_at::<N>(logits, head.base, j, head.lanes);
        let (h, s) = add_kept(l, j, head, cut, hi, lo, min_p);
        hi = h;
        lo = s;
    }
    (hi, lo)
}

/// Logit `l` at position `j` added into the 64-bit fixed-point sum
/// `(hi, lo)` of the kept `dist` weights when the cut keeps it.
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_kept(
    l: f32,
    j: u32,
    head: &RowHead,
    cut: &Cut,
    hi: u32,
    lo: u32,
    #[comptime] min_p: bool,
) -> (u32, u32) {
    let mut h = hi;
    let mut s = lo;
    if kept_at(l, j, head, cut, min_p) {
        let e = draw_weight(l, head);
        let ns = s + e;
        h += select(ns < s, 1u32, 0u32);
        s = ns;
    }
    (h, s)
}

/// [`kept_weight_sum`] over the vectors `start..end` of the row, this
/// thread taking vectors `start + lane`, then every `step` (`UNIT_POS` and
/// `CUBE_DIM` when the whole workgroup reads the range; coalesced 16-byte
/// loads, [`LOADS_IN_FLIGHT`] of them issued before the first is used):
/// this thread's share of the sum.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn kept_weight_sum_vec<N: Size>(
    logits: &[Vector<f32, N>],
    head: &RowHead,
    cut: &Cut,
    start: u32,
    end: u32,
    lane: u32,
    step: u32,
    #[comptime] min_p: bool,
) -> (u32, u32) {
    let base = head.base;
    let mut hi = 0u32;
    let mut lo = 0u32;
    let mut i = start + lane;
    while i + (LOADS_IN_FLIGHT - 1u32) * step < end {
        let v0 = logits[(base + i) as usize];
        let v1 = logits[(base + i + step) as usize];
        let v2 = logits[(base + i + 2u32 * step) as usize];
        let v3 = logits[(base + i + 3u32 * step) as usize];
        let (h0, l0) = kept_add_vector::<N>(v0, i, head, cut, hi, lo, min_p);
        let (h1, l1) = kept_add_vector::<N>(v1, i + step, head, cut, h0, l0, min_p);
        let (h2, l2) = kept_add_vector::<N>(v2, i + 2u32 * step, head, cut, h1, l1, min_p);
        let (h3, l3) = kept_add_vector::<N>(v3, i + 3u32 * step, head, cut, h2, l2, min_p);
        hi = h3;
        lo = l3;
        i += LOADS_IN_FLIGHT * step;
    }
    while i < end {
        let v = logits[(base + i) as usize];
        let (h, l) = kept_add_vector::<N>(v, i, head, cut, hi, lo, min_p);
        hi = h;
        lo = l;
        i += step;
    }
    (hi, lo)
}

/// The kept logits of vector `i` (`v`) added into the 64-bit fixed-point
/// sum `(hi, lo)` of their `dist` weights.
#[cube]
#[allow(clippy::too_many_arguments)]
fn kept_add_vector<N: Size>(
    v: Vector<f32, N>,
    i: u32,
    head: &RowHead,
    cut: &Cut,
    hi: u32,
    lo: u32,
    #[comptime] min_p: bool,
) -> (u32, u32) {
    let mut h = hi;
    let mut l = lo;
    let mut j = i * head.lanes;
    #[unroll]
    for k in 0..N::value() {
        let (h2, l2) = add_kept(v.extract(k), j, head, cut, h, l, min_p);
        h = h2;
        l = l2;
        j += 1u32;
    }
    (h, l)
}

/// The end of both full-row kernels, once thread `t` holds the
/// fixed-point `dist` weight `(wh, wl)` of the kept logits of chunk `t`,
/// positions `t·chunk..(t + 1)·chunk` of the row (its `thread_chunk`, or
/// with the `min_p` kernel split, segment `t`): the chunk holding `u·W`
/// from the chunks' prefix, then that chunk split over the threads, each
/// part summed, and the part that holds `u·W` walked by its thread alone
/// (the drawn position lands in `bads[0]`, `2·width` when nothing is
/// kept). Thread 0 then writes the row's token (the drawn position; the
/// first maximum at a greedy temperature; `-1` with nothing to draw) or
/// its status code ([`code_key`]), and the row's own validation key.
/// Every thread calls.
#[cube]
pub(crate) fn draw_token<N: Size>(
    logits: &[Vector<f32, N>],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    none: u32,
    greedy_below: f32,
    head: &RowHead,
    cut: &Cut,
    wh: u32,
    wl: u32,
    chunk: u32,
    part_hi: &mut Shared<[u32]>,
    part_lo: &mut Shared<[u32]>,
    bads: &mut Shared<[u32]>,
    #[comptime] units: usize,
    #[comptime] min_p: bool,
    #[comptime] codes: u32,
) {
    let tid = UNIT_POS;
    let row = head.row;
    let base = head.base;
    let width = head.width;
    let none_pos = 2u32 * width;
    let mut chunk_hi = Shared::<[u32]>::new_slice(units);
    let mut chunk_lo = Shared::<[u32]>::new_slice(units);
    chunk_hi[tid as usize] = wh;
    chunk_lo[tid as usize] = wl;

    // The chunk holding u·W, from the chunks' prefix (a parallel scan).
    wide_scan(&mut chunk_hi, &mut chunk_lo);
    let (th, tl) = wide_total(&chunk_hi, &chunk_lo);
    let (target_hi, target_lo) = wide_goal(u[row as usize], th, tl);
    let (_found, at, before_hi, before_lo) =
        first_reaching(&chunk_hi, &chunk_lo, target_hi, target_lo);
    let total_zero = th == 0u32 && tl == 0u32;

    // The chunk, split over the threads: each sums its part, then the part
    // that holds u·W finds the token, from the parts' prefix (a parallel
    // scan) after the chunks before.
    let c_start = at * chunk;
    let c_end = select(c_start + chunk < width, c_start + chunk, width);
    let sub = chunk_len(chunk);
    let s_start = select(c_start + tid * sub < c_end, c_start + tid * sub, c_end);
    let s_end = select(s_start + sub < c_end, s_start + sub, c_end);
    let (sh, sl) = kept_weight_sum::<N>(logits, head, cut, s_start, s_end, min_p);
    part_hi[tid as usize] = sh;
    part_lo[tid as usize] = sl;
    wide_scan(part_hi, part_lo);
    let mut xh = 0u32;
    let mut xl = 0u32;
    if tid > 0u32 {
        xh = part_hi[(tid - 1u32) as usize];
        xl = part_lo[(tid - 1u32) as usize];
    }
    let mut cl = before_lo + xl;
    let mut ch = before_hi + xh + select(cl < xl, 1u32, 0u32);
    // Only the part that holds u·W walks: its running sum reaches the
    // target, and the sum before it does not (or nothing of the chunk lies
    // before it). An earlier part ends short of the target; a later one can
    // only hold later positions.
    let il = cl + sl;
    let ih = ch + sh + select(il < cl, 1u32, 0u32);
    let walks = wide_ge(ih, il, target_hi, target_lo)
        && (!wide_ge(ch, cl, target_hi, target_lo) || (ch == before_hi && cl == before_lo));
    let mut hit = none_pos;
    if walks {
        for j in s_start..s_end {
            let l = logit_at::<N>(logits, base, j, head.lanes);
            if kept_at(l, j, head, cut, min_p) {
                let e = draw_weight(l, head);
                let nl = cl + e;
                ch += select(nl < cl, 1u32, 0u32);
                cl = nl;
                if e > 0u32 && hit == none_pos && wide_ge(ch, cl, target_hi, target_lo) {
                    hit = j;
                }
            }
        }
    }
    bads[tid as usize] = hit;
    shared_min(bads);

    if tid == 0u32 {
        let found = bads[0];
        let mut tok = select(found < width, i32::cast_from(found), -1i32);
        tok = select(total_zero, -1i32, tok);
        if head.tr < greedy_below {
            tok = i32::cast_from(head.first);
        }
        tok = select(head.dead, -1i32, tok);
        let code = code_key(bad_in, head.own_bad, row, none, codes);
        out[row as usize] = with_code(tok, code, none);
        out_bad[row as usize] = i32::cast_from(head.own_bad);
    }
}
