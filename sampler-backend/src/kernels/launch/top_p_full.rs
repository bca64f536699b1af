//! Launch of the full-vocabulary `top_p` kernel.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{float_tensor, full_row_units, int_tensor, output, per_row, resolve_float};
use crate::kernels::cube::top_p_full_rows;

/// [`crate::kernels::top_p_full`] on rows it takes.
pub(crate) fn top_p_full(logits: &Tensor<2>, p: &Tensor<2>) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let p = resolve_float(p)?.0;
    let units = full_row_units(&l);
    let out = output(&l, [b, n], DType::F32);
    let bad = output(&l, [b, 1], DType::I32);
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        top_p_full_rows::launch_unchecked(
            &l.client,
            cubes,
            dim,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(p.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            units as usize,
        )
    }
    // The max / validation pass, 8 radix passes, chunk sums, the walk.
    crate::launches::declare_read("top_p_full_rows", 11 * 4 * b * n + 4 * b);
    Some((float_tensor(out, &fusion), int_tensor(bad, &fusion)))
}
