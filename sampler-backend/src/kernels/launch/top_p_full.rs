//! Launch of the full-vocabulary `top_p` kernel.

use burn_cubecl::Cube;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{full_row_units, register, resolve_float};
use crate::kernels::cube::top_p_full_rows;

/// [`crate::kernels::top_p_full`] on rows it takes.
pub(crate) fn top_p_full(logits: &Tensor<2>, p: &Tensor<2>) -> Option<(Tensor<2>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (l, fusion) = resolve_float(logits)?;
    let p = resolve_float(p)?.0;
    let units = full_row_units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(
        client.clone(),
        device.clone(),
        Shape::new([b, n]),
        DType::F32,
    );
    let bad = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        top_p_full_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
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
    Some((
        Tensor::<2>::from_primitive::<Cube>(register(out, &fusion)),
        Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    ))
}
