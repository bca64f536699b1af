//! Launch of the greedy kernel.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{int_tensor, output, per_row, resolve_float, units};
use crate::kernels::TokenCodes;
use crate::kernels::cube::argmax_rows;

/// [`crate::kernels::argmax`] on rows it takes.
pub(crate) fn argmax(
    logits: &Tensor<2>,
    codes: TokenCodes<'_>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let (mode, keys, _) = codes.resolve(&cube, b, n)?;
    let units = units(&cube);
    let out = output(&cube, [b], DType::I32);
    let bad = output(&cube, [b, 1], DType::I32);
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        argmax_rows::launch_unchecked(
            &cube.client,
            cubes,
            dim,
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(keys.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            units as usize,
            mode,
        )
    }
    crate::launches::declare_read("argmax_rows", 4 * b * n + 4 * b);
    Some((int_tensor(out, &fusion), int_tensor(bad, &fusion)))
}
