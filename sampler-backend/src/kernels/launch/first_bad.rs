//! Launch of the row validation kernel.

use burn_cubecl::Cube;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{register, resolve_float, units};
use crate::kernels::cube::first_bad_rows;

/// [`crate::kernels::first_bad`] on rows it takes.
pub(crate) fn first_bad(logits: &Tensor<2>) -> Option<Tensor<2, Int>> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let units = units(&cube);
    let (client, device) = (cube.client.clone(), cube.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        first_bad_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            n as u32,
            units as usize,
        )
    }
    crate::launches::declare_read("first_bad_rows", 4 * b * n);
    Some(Tensor::<2, Int>::from_primitive::<Cube>(register(
        out, &fusion,
    )))
}
