//! Launch of the `min_p` kernel.

use burn_cubecl::Cube;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{register, resolve_float, resolve_int, units};
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
    let ids = match ids {
        Some(ids) => Some(resolve_int(ids)?),
        None => None,
    };
    let units = units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(
        client.clone(),
        device.clone(),
        Shape::new([b, n]),
        DType::F32,
    );
    let bad = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, 1]), DType::I32);
    // Without ids the kernel never reads them: any int buffer will do.
    let ids_handle = ids
        .as_ref()
        .map_or(bad.handle.clone(), |i| i.handle.clone());
    let ids_len = if ids.is_some() { b * n } else { b };
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        min_p_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
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
    Some((
        Tensor::<2>::from_primitive::<Cube>(register(out, &fusion)),
        Tensor::<2, Int>::from_primitive::<Cube>(register(bad, &fusion)),
    ))
}
