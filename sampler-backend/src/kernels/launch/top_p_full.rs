//! Launch of the unfused full-vocabulary `top_p`: the fused full-row
//! kernel cut only ([`super::cut_dist`]), then `top_p_mask_rows` (both in
//! `cube/cut_dist/`).

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::cut_dist::launch_full;
use super::{float_tensor, int_tensor, output, resolve_float, row_lanes, units};
use crate::kernels::cube::{CUT_WORDS, LOADS_IN_FLIGHT, top_p_mask_rows};
use crate::kernels::{FullCut, TokenCodes};

/// [`crate::kernels::top_p_full_split`] on rows it takes (`segments`: the
/// device's choice when `None`).
pub(crate) fn top_p_full(
    logits: &Tensor<2>,
    p: &Tensor<2>,
    segments: Option<usize>,
) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    // The row write's grid: `per` vectors a workgroup, `(tiles, B)`.
    let lanes = row_lanes(&l, n);
    let units = units(&l);
    let per = LOADS_IN_FLIGHT as usize * units as usize;
    let tiles = (n / lanes).div_ceil(per);
    let max = l.client.properties().hardware.max_cube_count;
    if b > max.1 as usize || tiles > max.0 as usize {
        return None;
    }
    let (cut, bad) = launch_full(
        &l,
        [b, n],
        FullCut::TopP(p),
        None,
        None,
        0.0,
        TokenCodes::Tokens,
        segments,
    )?;
    let out = output(&l, [b, n], DType::F32);
    // SAFETY: workgroup `(x, row)` reads and writes the vectors
    // `x·per..min((x + 1)·per, n / lanes)` of its row and the row's
    // `CUT_WORDS` words of `cut`; `row < b` and `x < tiles` by the grid.
    unsafe {
        top_p_mask_rows::launch_unchecked(
            &l.client,
            CubeCount::Static(tiles as u32, b as u32, 1),
            CubeDim::new_1d(units),
            lanes,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(cut.handle.clone(), b * CUT_WORDS as usize),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            n as u32,
            lanes as u32,
            per as u32,
        )
    }
    // The row and its cut; the row written.
    crate::launches::declare_read("top_p_mask_rows", 4 * b * n + 4 * CUT_WORDS as usize * b);
    Some((float_tensor(out, &fusion), int_tensor(bad, &fusion)))
}
