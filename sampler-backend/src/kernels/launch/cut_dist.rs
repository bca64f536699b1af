//! Launch of the fused full-row `cut -> [temperature] -> dist` kernels.

use burn_cubecl::Cube;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{full_row_units, register, resolve_float};
use crate::kernels::cube::{min_p_dist_full_rows, top_p_dist_full_rows};
use crate::kernels::{FullCut, TokenCodes};

/// [`crate::kernels::cut_dist_full`] on rows it takes.
pub(crate) fn cut_dist_full(
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
