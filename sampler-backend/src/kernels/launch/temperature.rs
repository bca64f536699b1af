//! Launch of the temperature kernel.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{float_tensor, output, per_row, resolve_float, resolve_int, resolve_optional, units};
use crate::kernels::cube::temperature_rows;

/// [`crate::kernels::temperature`] on rows it takes.
pub(crate) fn temperature(
    logits: &Tensor<2>,
    ids: Option<&Tensor<2, Int>>,
    t: &Tensor<2>,
    greedy_below: f32,
) -> Option<Tensor<2>> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let t = resolve_float(t)?.0;
    let ids = resolve_optional(ids, resolve_int)?;
    let units = units(&l);
    let out = output(&l, [b, n], DType::F32);
    // Without ids the kernel never reads them: any int buffer will do.
    let ids_handle = ids.as_ref().map_or(t.handle.clone(), |i| i.handle.clone());
    let ids_len = if ids.is_some() { b * n } else { b };
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        temperature_rows::launch_unchecked(
            &l.client,
            cubes,
            dim,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(ids_handle, ids_len),
            BufferArg::from_raw_parts(t.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            n as u32,
            greedy_below,
            ids.is_some(),
            units as usize,
        )
    }
    // One pass (two for a row at a greedy temperature), ids when present.
    crate::launches::declare_read("temperature_rows", 4 * b * n + 4 * ids_len + 4 * b);
    Some(float_tensor(out, &fusion))
}
