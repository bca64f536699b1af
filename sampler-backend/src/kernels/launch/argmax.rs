//! Launch of the greedy kernel.

use burn_cubecl::Cube;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{register, resolve_float, units};
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
    let (client, device) = (cube.client.clone(), cube.device.clone());
    let out =
        empty_device_contiguous_dtype(client.clone(), device.clone(), Shape::new([b]), DType::I32);
    let bad = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        argmax_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
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
    Some((
        Tensor::<1, Int>::from_primitive::<Cube>(register(out, &fusion)),
        Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    ))
}
