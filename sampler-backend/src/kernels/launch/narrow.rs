//! Launches of `top_p` and `dist` on narrow rows.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{float_tensor, int_tensor, output, per_row, resolve_float, resolve_int, units};
use crate::kernels::cube::{dist_rows, top_p_rows};
use crate::kernels::{TOP_K_MAX, TokenCodes};

/// [`crate::kernels::top_p`] on narrow rows `[b, n]`.
pub(crate) fn top_p(
    logits: &Tensor<2>,
    b: usize,
    n: usize,
    ids: &Tensor<2, Int>,
    p: &Tensor<2>,
    keep: &Tensor<2, Int>,
) -> Option<Tensor<2>> {
    let (l, fusion) = resolve_float(logits)?;
    let (ids, p, keep) = (resolve_int(ids)?, resolve_float(p)?.0, resolve_int(keep)?);
    let units = units(&l);
    let out = output(&l, [b, n], DType::F32);
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        top_p_rows::launch_unchecked(
            &l.client,
            cubes,
            dim,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(ids.handle.clone(), b * n),
            BufferArg::from_raw_parts(p.handle.clone(), b),
            BufferArg::from_raw_parts(keep.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b * n),
            n as u32,
            TOP_K_MAX,
        )
    }
    crate::launches::declare_read("top_p_rows", 8 * b * n + 8 * b);
    Some(float_tensor(out, &fusion))
}

/// [`crate::kernels::dist`] on narrow rows `[b, n]`.
pub(crate) fn dist(
    logits: &Tensor<2>,
    b: usize,
    n: usize,
    ids: &Tensor<2, Int>,
    u: &Tensor<2>,
    codes: TokenCodes<'_>,
) -> Option<Tensor<1, Int>> {
    let (l, fusion) = resolve_float(logits)?;
    let (ids, u) = (resolve_int(ids)?, resolve_float(u)?.0);
    let (mode, keys, none) = codes.resolve(&l, b, n)?;
    let units = units(&l);
    let out = output(&l, [b], DType::I32);
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        dist_rows::launch_unchecked(
            &l.client,
            cubes,
            dim,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(ids.handle.clone(), b * n),
            BufferArg::from_raw_parts(u.handle.clone(), b),
            BufferArg::from_raw_parts(keys.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            n as u32,
            none,
            TOP_K_MAX,
            units as usize,
            mode,
        )
    }
    crate::launches::declare_read("dist_rows", 8 * b * n + 8 * b);
    Some(int_tensor(out, &fusion))
}
