//! Launch of the token-or-status-code kernel.

use burn_cubecl::Cube;
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_fusion::FusionTensor;
use burn_tensor::{DType, Int, Shape, Tensor};

use super::{FusionRuntime, register, resolve_int, units};
use crate::kernels::cube::token_codes_rows;

/// [`crate::kernels::token_codes`] on rows it takes.
pub(crate) fn token_codes(
    sampled: &Tensor<1, Int>,
    first_bad: &Tensor<2, Int>,
    vocab: usize,
) -> Option<Tensor<1, Int>> {
    let [b] = sampled.dims();
    let fused: FusionTensor<FusionRuntime> = sampled.clone().try_into_primitive::<Cube>().ok()?;
    let fusion = fused.client.clone();
    let s = into_contiguous(fusion.resolve_tensor_int::<CubeBackend>(fused));
    let f = resolve_int(first_bad)?;
    if s.dtype != DType::I32 || f.dtype != DType::I32 {
        return None;
    }
    let (client, device) = (s.client.clone(), s.device.clone());
    let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([b]), DType::I32);
    let units = units(&s);
    // SAFETY: one thread per row, guarded by `rows`.
    unsafe {
        token_codes_rows::launch_unchecked(
            &client,
            CubeCount::Static((b as u32).div_ceil(units), 1, 1),
            CubeDim::new_1d(units),
            BufferArg::from_raw_parts(s.handle.clone(), b),
            BufferArg::from_raw_parts(f.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            b as u32,
            (2 * vocab) as i32,
        )
    }
    crate::launches::declare_read("token_codes_rows", 8 * b);
    Some(Tensor::<1, Int>::from_primitive::<Cube>(register(
        out, &fusion,
    )))
}
