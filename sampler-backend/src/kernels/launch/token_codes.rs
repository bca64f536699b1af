//! Launch of the token-or-status-code kernel.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{int_tensor, output, resolve_int, resolve_int_client, units};
use crate::kernels::cube::token_codes_rows;

/// [`crate::kernels::token_codes`] on rows it takes.
pub(crate) fn token_codes(
    sampled: &Tensor<1, Int>,
    first_bad: &Tensor<2, Int>,
    vocab: usize,
) -> Option<Tensor<1, Int>> {
    let [b] = sampled.dims();
    let (s, fusion) = resolve_int_client(sampled)?;
    let f = resolve_int(first_bad)?;
    if s.dtype != DType::I32 || f.dtype != DType::I32 {
        return None;
    }
    let out = output(&s, [b], DType::I32);
    let units = units(&s);
    // SAFETY: one thread per row, guarded by `rows`.
    unsafe {
        token_codes_rows::launch_unchecked(
            &s.client,
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
    Some(int_tensor(out, &fusion))
}
