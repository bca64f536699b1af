//! Launch of the fused full-row `cut -> [temperature] -> dist` kernels.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{
    full_row_units, int_tensor, output, per_row, resolve_float, resolve_optional, row_lanes,
};
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
    let t = resolve_optional(t, |t| Some(resolve_float(t)?.0))?;
    let (mode, keys, none) = codes.resolve(&l, b, n)?;
    let units = full_row_units(&l);
    let out = output(&l, [b], DType::I32);
    let bad = output(&l, [b, 1], DType::I32);
    // Without a temperature the kernel never reads `t`: any f32 buffer will do.
    let t_handle = t
        .as_ref()
        .map_or(param.handle.clone(), |t| t.handle.clone());
    let (cubes, dim) = per_row(b, units);
    // 16-byte vectors where the row allows them (the passes over the whole
    // row load vectors; the chunk walks read lanes out of them).
    let lanes = row_lanes(&l, n);
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
        // The two kernels take the same arguments (`min_p_dist_full_rows`
        // one more, last).
        macro_rules! launch {
            ($kernel:ident $(, $more:expr)?) => {
                $kernel::launch_unchecked(
                    &l.client,
                    cubes,
                    dim,
                    lanes,
                    a0,
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    n as u32,
                    lanes as u32,
                    none,
                    greedy_below,
                    units as usize,
                    t.is_some(),
                    mode,
                    $($more)?
                )
            };
        }
        if min_p {
            launch!(min_p_dist_full_rows, keep_all)
        } else {
            launch!(top_p_dist_full_rows)
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
    Some((int_tensor(out, &fusion), int_tensor(bad, &fusion)))
}
