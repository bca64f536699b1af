//! `top_p` and `dist` on narrow rows (after a top-k, at most `TOP_K_MAX`
//! wide): the row and its weights in shared memory (`top_p_rows`,
//! `dist_rows`).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{code_key, with_code};
use super::cut_dist::{fixed_weight, wide_ge, wide_nucleus_goal};

/// Row max (0 for a row of `-inf`, so `l - max` stays finite) and the sum of
/// `exp(l - max)`, from a row held in shared memory; thread 0 walks the row
/// in position order, so the sum's order is fixed.
#[cube]
fn shared_max_and_sum(
    sl: &Shared<[f32]>,
    se: &mut Shared<[f32]>,
    stat: &mut Shared<[f32]>,
    width: u32,
) {
    if UNIT_POS == 0u32 {
        // -inf from its bits: cubecl's WGSL backend prints an infinite
        // literal as `-Inf`, which WGSL does not know.
        let neg_inf = f32::reinterpret(0xFF80_0000u32);
        let mut m = neg_inf;
        for i in 0..width {
            let l = sl[i as usize];
            if l > m {
                m = l;
            }
        }
        stat[0] = select(m == neg_inf, 0.0f32, m);
    }
    sync_cube();
    let m = stat[0];
    let mut i = UNIT_POS;
    while i < width {
        se[i as usize] = f32::exp(sl[i as usize] - m);
        i += CUBE_DIM;
    }
    sync_cube();
    if UNIT_POS == 0u32 {
        let mut s = 0.0f32;
        for i in 0..width {
            s += se[i as usize];
        }
        stat[1] = s;
    }
    sync_cube();
}

/// The narrow row `base..base + width` of `logits` and `ids` into shared
/// memory (`sl`, `sid`). Every thread calls.
#[cube]
fn load_row(
    logits: &[f32],
    ids: &[i32],
    base: u32,
    width: u32,
    sl: &mut Shared<[f32]>,
    sid: &mut Shared<[i32]>,
) {
    let mut i = UNIT_POS;
    while i < width {
        sl[i as usize] = logits[(base + i) as usize];
        sid[i as usize] = ids[(base + i) as usize];
        i += CUBE_DIM;
    }
    sync_cube();
}

#[cube(launch_unchecked)]
pub(crate) fn top_p_rows(
    logits: &[f32],
    ids: &[i32],
    p: &[f32],
    keep: &[i32],
    out: &mut [f32],
    width: u32,
    #[comptime] cap: usize,
) {
    let row = CUBE_POS_X;
    let base = row * width;
    let mut sl = Shared::<[f32]>::new_slice(cap);
    let mut sid = Shared::<[i32]>::new_slice(cap);
    let mut se = Shared::<[f32]>::new_slice(cap);
    let mut stat = Shared::<[f32]>::new_slice(2usize);
    load_row(logits, ids, base, width, &mut sl, &mut sid);
    shared_max_and_sum(&sl, &mut se, &mut stat, width);
    // `stages::top_p`'s rule in fixed point: each candidate weighs
    // `fixed_weight(e)`, and it is kept while the mass before it (64-bit,
    // exact) is below `wide_nucleus_goal(p, total)`. `p = +inf` marks a
    // no-op row (everything kept). Each weight once, into shared memory;
    // the total and the goal once per thread (the same for every candidate).
    let mut sw = Shared::<[u32]>::new_slice(cap);
    let mut i = UNIT_POS;
    while i < width {
        sw[i as usize] = fixed_weight(se[i as usize]);
        i += CUBE_DIM;
    }
    sync_cube();
    let mut th = 0u32;
    let mut tl = 0u32;
    for j in 0..width {
        let nt = tl + sw[j as usize];
        th += select(nt < tl, 1u32, 0u32);
        tl = nt;
    }
    let pr = p[row as usize];
    let all = pr >= 1.0f32;
    let (gh, gl) = wide_nucleus_goal(select(all, 0.5f32, pr), th, tl);
    let min_keep = u32::cast_from(keep[row as usize]);
    let mut c = UNIT_POS;
    while c < width {
        let lc = sl[c as usize];
        let dc = sid[c as usize];
        let mut rank = 0u32;
        let mut bh = 0u32;
        let mut bl = 0u32;
        for j in 0..width {
            let lj = sl[j as usize];
            if lj > lc || (lj == lc && sid[j as usize] < dc) {
                rank += 1u32;
                let nb = bl + sw[j as usize];
                bh += select(nb < bl, 1u32, 0u32);
                bl = nb;
            }
        }
        let kept = all || !wide_ge(bh, bl, gh, gl) || rank < min_keep;
        out[(base + c) as usize] = select(kept, lc, f32::reinterpret(0xFF80_0000u32));
        c += CUBE_DIM;
    }
}

#[cube(launch_unchecked)]
pub(crate) fn dist_rows(
    logits: &[f32],
    ids: &[i32],
    u: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    width: u32,
    none: u32,
    #[comptime] cap: usize,
    #[comptime] units: usize,
    #[comptime] codes: u32,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut sl = Shared::<[f32]>::new_slice(cap);
    let mut sid = Shared::<[i32]>::new_slice(cap);
    let mut se = Shared::<[f32]>::new_slice(cap);
    let mut stat = Shared::<[f32]>::new_slice(2usize);
    let mut first = Shared::<[i32]>::new_slice(units);
    let mut last = Shared::<[i32]>::new_slice(units);
    load_row(logits, ids, base, width, &mut sl, &mut sid);
    shared_max_and_sum(&sl, &mut se, &mut stat, width);
    let s = stat[1];
    let target = u[row as usize] * s;
    // Candidates in ascending id order: the first whose cumulative weight
    // reaches u·S; the last positive one when rounding leaves none.
    let mut f = i32::cast_from(0x7FFF_FFFFu32);
    let mut l = i32::cast_from(0u32) - 1i32;
    let mut c = tid;
    while c < width {
        let ec = se[c as usize];
        let dc = sid[c as usize];
        if ec > 0.0f32 {
            let mut cum = 0.0f32;
            for j in 0..width {
                if sid[j as usize] <= dc {
                    cum += se[j as usize];
                }
            }
            if cum >= target && dc < f {
                f = dc;
            }
            if dc > l {
                l = dc;
            }
        }
        c += CUBE_DIM;
    }
    first[tid as usize] = f;
    last[tid as usize] = l;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let f2 = first[(tid + half) as usize];
            let l2 = last[(tid + half) as usize];
            if f2 < first[tid as usize] {
                first[tid as usize] = f2;
            }
            if l2 > last[tid as usize] {
                last[tid as usize] = l2;
            }
        }
        sync_cube();
        half /= 2u32;
    }
    if tid == 0u32 {
        let f = first[0];
        let tok = select(f == 2_147_483_647i32, last[0], f);
        let tok = select(s == 0.0f32, -1i32, tok);
        let code = code_key(bad_in, none, row, none, codes);
        out[row as usize] = with_code(tok, code, none);
    }
}
