//! Launch of the `min_p` kernel.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{
    float_tensor, int_tensor, output, per_row, resolve_float, resolve_int, resolve_optional, units,
};
use crate::kernels::cube::min_p_rows;

/// [`crate::kernels::min_p`] on rows it takes.
pub(crate) fn min_p(
    logits: &Tensor<2>,
    ids: Option<&Tensor<2, Int>>,
    log_p: &Tensor<2>,
) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let log_p = resolve_float(log_p)?.0;
    let ids = resolve_optional(ids, resolve_int)?;
    let units = units(&l);
    let out = output(&l, [b, n], DType::F32);
    let bad = output(&l, [b, 1], DType::I32);
    // Without ids the kernel never reads them: any int buffer will do.
    let ids_handle = ids
        .as_ref()
        .map_or(bad.handle.clone(), |i| i.handle.clone());
    let ids_len = if ids.is_some() { b * n } else { b };
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        min_p_rows::launch_unchecked(
            &l.client,
            cubes,
            dim,
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
    Some((float_tensor(out, &fusion), int_tensor(bad, &fusion)))
}
