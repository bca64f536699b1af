//! Launch of the temperature kernel.

use burn_cubecl::Cube;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{register, resolve_float, resolve_int, units};
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
    let ids = match ids {
        Some(ids) => Some(resolve_int(ids)?),
        None => None,
    };
    let units = units(&l);
    let (client, device) = (l.client.clone(), l.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b, n]), DType::F32);
    // Without ids the kernel never reads them: any int buffer will do.
    let ids_handle = ids.as_ref().map_or(t.handle.clone(), |i| i.handle.clone());
    let ids_len = if ids.is_some() { b * n } else { b };
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        temperature_rows::launch_unchecked(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
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
    Some(Tensor::<2>::from_primitive::<Cube>(register(out, &fusion)))
}
