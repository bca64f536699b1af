//! The unfused full-row `top_p`'s second kernel (`top_p_mask_rows`): the
//! row written with the logits its cut drops set to `-inf`.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::LOADS_IN_FLIGHT;
use super::CUT_WORDS;
use super::draw::{Cut, RowHead, kept_at};

/// Grid `(tiles, B)`: workgroup `(x, row)` writes the vectors
/// `x·per..(x + 1)·per` of the row (`per` = [`LOADS_IN_FLIGHT`] vectors a
/// thread, each thread's loads issued before its first store) from the
/// row's cut, which `top_p_dist_full_rows` with `cut_only` wrote to `cut`
/// (`CUT_WORDS` a row: the maximum's bits, the crossing bin, the crossing
/// key, the last kept position of its ties). A position is kept by the
/// rule the fused draw keeps it by ([`kept_at`]); the others become `-inf`.
#[cube(launch_unchecked)]
pub(crate) fn top_p_mask_rows<N: Size>(
    logits: &[Vector<f32, N>],
    cut: &[i32],
    out: &mut [Vector<f32, N>],
    width: u32,
    lanes: u32,
    per: u32,
) {
    let row = CUBE_POS_Y;
    let row_v = width / lanes;
    let base = row * row_v;
    let c = row * CUT_WORDS;
    let m = f32::reinterpret(cut[c as usize]);
    let head = RowHead {
        row,
        base,
        lanes,
        width,
        first: width,
        dead: false,
        own_bad: 0u32,
        m,
        tr: 1.0f32,
        qm: m,
    };
    let rule = Cut {
        cb: u32::cast_from(cut[(c + 1u32) as usize]),
        prefix: u32::reinterpret(cut[(c + 2u32) as usize]),
        last_pos: u32::cast_from(cut[(c + 3u32) as usize]),
        thr: 0.0f32,
    };
    let start = CUBE_POS_X * per;
    let end = select(start + per < row_v, start + per, row_v);
    let step = CUBE_DIM;
    let i = start + UNIT_POS;
    if i + (LOADS_IN_FLIGHT - 1u32) * step < end {
        let v0 = logits[(base + i) as usize];
        let v1 = logits[(base + i + step) as usize];
        let v2 = logits[(base + i + 2u32 * step) as usize];
        let v3 = logits[(base + i + 3u32 * step) as usize];
        out[(base + i) as usize] = masked::<N>(v0, i, &head, &rule);
        out[(base + i + step) as usize] = masked::<N>(v1, i + step, &head, &rule);
        out[(base + i + 2u32 * step) as usize] = masked::<N>(v2, i + 2u32 * step, &head, &rule);
        out[(base + i + 3u32 * step) as usize] = masked::<N>(v3, i + 3u32 * step, &head, &rule);
    } else {
        let mut k = i;
        while k < end {
            out[(base + k) as usize] = masked::<N>(logits[(base + k) as usize], k, &head, &rule);
            k += step;
        }
    }
}

/// Vector `i` of the row (`v`) with the logits the cut drops set to `-inf`.
#[cube]
fn masked<N: Size>(v: Vector<f32, N>, i: u32, head: &RowHead, rule: &Cut) -> Vector<f32, N> {
    let neg_inf = f32::reinterpret(0xFF80_0000u32);
    let mut w = Vector::<f32, N>::empty();
    let mut j = i * head.lanes;
    #[unroll]
    for k in 0..N::value() {
        let l = v.extract(k);
        w.insert(k, select(kept_at(l, j, head, rule, false), l, neg_inf));
        j += 1u32;
    }
    w
}
