//! Launch of the row validation kernel.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{int_tensor, output, per_row, resolve_float, units};
use crate::kernels::cube::first_bad_rows;

/// [`crate::kernels::first_bad`] on rows it takes.
pub(crate) fn first_bad(logits: &Tensor<2>) -> Option<Tensor<2, Int>> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let units = units(&cube);
    let out = output(&cube, [b, 1], DType::I32);
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        first_bad_rows::launch_unchecked(
            &cube.client,
            cubes,
            dim,
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            n as u32,
            units as usize,
        )
    }
    crate::launches::declare_read("first_bad_rows", 4 * b * n);
    Some(int_tensor(out, &fusion))
}
