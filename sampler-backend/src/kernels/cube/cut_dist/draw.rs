//! The draw both full-row kernels end with: which positions the cut keeps
//! (`kept_at`), the chunk holding `u·W` and the walk of it
//! (`draw_position`), and the token or status code written
//! (`write_token`).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{code_key, order_key, scaled, shared_min, with_code};
use super::fixed::{fixed_weight, frac_hi, frac_lo, nucleus_bin, wide_ge};
use super::{S_BEFORE_HI, S_BEFORE_LO, S_CHUNK, S_TARGET_HI, S_TARGET_LO, S_TOTAL_ZERO};

/// Whether position `j` (logit `l`) is kept: with `min_p`, `l >= thr` or
/// the first maximum; else the nucleus (bins above the crossing bin `cb`,
/// and in it the keys above `prefix` and its ties up to `last_pos`).
#[cube]
pub(crate) fn kept_at(
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
pub(crate) fn draw_position(
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
pub(crate) fn write_token(
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
