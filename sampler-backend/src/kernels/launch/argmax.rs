//! Launch of the greedy kernels: one workgroup a row, or at small batches
//! each row split over several workgroups and merged
//! ([`crate::kernels::row_segments`]).

use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_tensor::{DType, Int, Tensor};

use super::{int_tensor, output, per_row, resolve_float, row_lanes, segments, units};
use crate::kernels::TokenCodes;
use crate::kernels::cube::{argmax_merge_rows, argmax_part_rows, argmax_rows};

/// Threads of the merge kernel's workgroup (one a row).
const MERGE_UNITS: u32 = 64;

/// Read 1 of rows `l [b, n]` split over `segments` workgroups a row
/// (`argmax_part_rows`, `lanes` logits a vector, `units` threads): each
/// segment's largest key, its lowest position and its first validation
/// key, in three new `[b · segments]` buffers. With `zeroed` (a buffer and
/// its words a row), the segments also zero it (the split full-row
/// `top_p`'s histograms). Greedy and the full-row cuts start with it.
pub(super) fn segment_heads(
    l: &CubeTensor,
    b: usize,
    n: usize,
    segments: usize,
    lanes: usize,
    units: u32,
    zeroed: Option<(&CubeTensor, u32)>,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let parts = b * segments;
    let part = || output(l, [parts], DType::U32);
    let (key, pos, pbad) = (part(), part(), part());
    // Segments of whole vectors.
    let seg = (n / lanes).div_ceil(segments);
    // Nothing to zero: any buffer, never written.
    let (zeroed, clear) = zeroed.unwrap_or((&pbad, 0));
    let zeroed_len = if clear > 0 { b * clear as usize } else { parts };
    // SAFETY: every index the kernel forms is inside its buffers (segments
    // inside the row, partials at `row · segments + part`, zeroed words at
    // `row · clear + w` for `w < clear`, shared slices by their sizes).
    unsafe {
        argmax_part_rows::launch_unchecked(
            &l.client,
            CubeCount::Static(segments as u32, b as u32, 1),
            CubeDim::new_1d(units),
            lanes,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(key.handle.clone(), parts),
            BufferArg::from_raw_parts(pos.handle.clone(), parts),
            BufferArg::from_raw_parts(pbad.handle.clone(), parts),
            BufferArg::from_raw_parts(zeroed.handle.clone(), zeroed_len),
            n as u32,
            seg as u32,
            lanes as u32,
            units as usize,
            clear,
        );
    }
    crate::launches::declare_read("argmax_part_rows", 4 * b * n);
    (key, pos, pbad)
}

/// [`crate::kernels::greedy_segments`].
pub(crate) fn greedy_segments(logits: &Tensor<2>) -> Option<usize> {
    let [b, n] = logits.dims();
    let (cube, _) = resolve_float(logits)?;
    Some(segments(&cube, b, n))
}

/// [`crate::kernels::argmax_split`] on rows it takes (`segments`: the
/// device's choice when `None`).
pub(crate) fn argmax(
    logits: &Tensor<2>,
    codes: TokenCodes<'_>,
    segments: Option<usize>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let (mode, keys, _) = codes.resolve(&cube, b, n)?;
    let units = units(&cube);
    let out = output(&cube, [b], DType::I32);
    let bad = output(&cube, [b, 1], DType::I32);
    let segments = segments.unwrap_or_else(|| super::segments(&cube, b, n));
    let lanes = row_lanes(&cube, n);
    if segments > 1 && b <= cube.client.properties().hardware.max_cube_count.1 as usize {
        let (key, pos, pbad) = segment_heads(&cube, b, n, segments, lanes, units, None);
        let parts = b * segments;
        let merge_units = units.min(MERGE_UNITS);
        // SAFETY: every index the kernel forms is inside its buffers
        // (partials at `row · segments + part`, shared slices by their
        // sizes).
        unsafe {
            argmax_merge_rows::launch_unchecked(
                &cube.client,
                CubeCount::Static(b as u32, 1, 1),
                CubeDim::new_1d(merge_units),
                BufferArg::from_raw_parts(key.handle.clone(), parts),
                BufferArg::from_raw_parts(pos.handle.clone(), parts),
                BufferArg::from_raw_parts(pbad.handle.clone(), parts),
                BufferArg::from_raw_parts(keys.handle.clone(), b),
                BufferArg::from_raw_parts(out.handle.clone(), b),
                BufferArg::from_raw_parts(bad.handle.clone(), b),
                n as u32,
                segments as u32,
                merge_units as usize,
                mode,
            );
        }
        crate::launches::declare_read("argmax_merge_rows", 12 * parts + 4 * b);
        return Some((int_tensor(out, &fusion), int_tensor(bad, &fusion)));
    }
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, shared slices by their sizes).
    unsafe {
        argmax_rows::launch_unchecked(
            &cube.client,
            cubes,
            dim,
            lanes,
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(keys.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), b),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            lanes as u32,
            units as usize,
            mode,
        )
    }
    crate::launches::declare_read("argmax_rows", 4 * b * n + 4 * b);
    Some((int_tensor(out, &fusion), int_tensor(bad, &fusion)))
}
