//! Launch of the fused full-row `cut -> [temperature] -> dist` kernels:
//! one workgroup a row, or at small batches the passes over the whole row
//! split over several workgroups a row first (read 1; `top_p`'s histogram;
//! `min_p`'s kept sums).

use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_tensor::{DType, Int, Tensor};

use super::argmax::segment_heads;
use super::{int_tensor, output, per_row, resolve_float, resolve_optional, row_lanes, units};
use crate::kernels::cube::{
    CUT_WORDS, HIST_WORDS, ROW_WORDS, kept_sums_part_rows, min_p_dist_full_rows,
    top_p_dist_full_rows, top_p_histogram_part_rows, top_p_kept_part_rows,
};
use crate::kernels::{FullCut, NUC_GATHER, TokenCodes};

/// [`crate::kernels::cut_dist_full_split`] on rows it takes (`segments`:
/// the device's choice when `None`).
pub(crate) fn cut_dist_full(
    logits: &Tensor<2>,
    cut: FullCut<'_>,
    t: Option<&Tensor<2>>,
    u: &Tensor<2>,
    greedy_below: f32,
    codes: TokenCodes<'_>,
    segments: Option<usize>,
) -> Option<(Tensor<1, Int>, Tensor<2, Int>)> {
    let (l, fusion) = resolve_float(logits)?;
    let (out, bad) = launch_full(
        &l,
        logits.dims(),
        cut,
        t,
        Some(u),
        greedy_below,
        codes,
        segments,
    )?;
    Some((int_tensor(out, &fusion), int_tensor(bad, &fusion)))
}

/// The launches of [`cut_dist_full`] on the resolved logits `l` `[b, n]`:
/// the rows' tokens (or codes) `[B]` and validation keys `[B, 1]`. Without
/// `u`, a `top_p` cut only ([`crate::kernels::top_p_full`]): the kernel
/// writes each row's cut (`CUT_WORDS` i32 a row) instead of drawing.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_full(
    l: &CubeTensor,
    [b, n]: [usize; 2],
    cut: FullCut<'_>,
    t: Option<&Tensor<2>>,
    u: Option<&Tensor<2>>,
    greedy_below: f32,
    codes: TokenCodes<'_>,
    segments: Option<usize>,
) -> Option<(CubeTensor, CubeTensor)> {
    let cut_only = u.is_none();
    // Only `top_p` writes its cut.
    if cut_only && !matches!(cut, FullCut::TopP(_)) {
        return None;
    }
    let u = resolve_optional(u, |u| Some(resolve_float(u)?.0))?;
    // `All` never reads its parameter: any f32 buffer of `B` will do.
    let (param, min_p) = match cut {
        FullCut::TopP(p) => (resolve_float(p)?.0, false),
        FullCut::MinP(log_p) => (resolve_float(log_p)?.0, true),
        FullCut::All => (u.clone()?, true),
    };
    // Cut only, the kernel never reads `u`: the parameter stands in.
    let u = u.unwrap_or_else(|| param.clone());
    let keep_all = matches!(cut, FullCut::All);
    let t = resolve_optional(t, |t| Some(resolve_float(t)?.0))?;
    let (mode, keys, none) = codes.resolve(l, b, n)?;
    // 256 threads a row where the device allows (the sums are fixed point,
    // so the thread count never changes a token).
    let units = units(l);
    let out_len = if cut_only { b * CUT_WORDS as usize } else { b };
    let out = output(l, [out_len], DType::I32);
    let bad = output(l, [b, 1], DType::I32);
    // Without a temperature the kernel never reads `t`: any f32 buffer will do.
    let t_handle = t
        .as_ref()
        .map_or(param.handle.clone(), |t| t.handle.clone());
    // 16-byte vectors where the row allows them (the passes over the whole
    // row load vectors; the chunk walks read lanes out of them).
    let lanes = row_lanes(l, n);
    // At most one segment a thread (the split `min_p` draw gives segment
    // `s` to thread `s`).
    let segments = segments
        .unwrap_or_else(|| super::segments(l, b, n))
        .min(units as usize);
    // (The split `top_p` finds its crossing bin with 32 threads a group.)
    let split = segments > 1
        && units >= 32
        && b <= l.client.properties().hardware.max_cube_count.1 as usize;
    let segments = if split { segments } else { 1 };
    // Segments of whole vectors.
    let seg = (n / lanes).div_ceil(segments);
    let parts = b * segments;
    let hist_words = if split && !min_p {
        b * ROW_WORDS as usize
    } else {
        1
    };
    // The split `top_p`'s gathered crossing logits (`(bits, position)`,
    // `NUC_GATHER` a row) and its segments' kept sums (`(hi, lo)`).
    let gather_words = if split && !min_p {
        b * 2 * NUC_GATHER as usize
    } else {
        1
    };
    let top_p_sums_words = if split && !min_p { 2 * parts } else { 1 };
    // The segments' read 1, the rows' histograms (`top_p`) and the
    // segments' kept sums (`min_p`), split; unsplit, the kernels never read
    // them, and the keys' buffer (`b` words, bound read-only as well)
    // stands in for them.
    let words = |len: usize| {
        if split {
            output(l, [len], DType::U32)
        } else {
            keys.clone()
        }
    };
    let hist = words(hist_words);
    let gather = words(gather_words);
    let top_p_sums = words(top_p_sums_words);
    let sums_words = if split && min_p { parts } else { 1 };
    let (sums_hi, sums_lo) = (words(sums_words), words(sums_words));
    // Read 1 over the segments (zeroing `top_p`'s histograms).
    let (key, pos, pbad) = if split {
        let zeroed = (!min_p).then_some((&hist, ROW_WORDS));
        segment_heads(l, b, n, segments, lanes, units, zeroed)
    } else {
        (words(parts), words(parts), words(parts))
    };
    if split {
        let grid = || CubeCount::Static(segments as u32, b as u32, 1);
        // SAFETY: every index the kernels form is inside their buffers
        // (segments inside the row, partials at `row · segments + part`, kept
        // sums at `2·(row · segments + part)`, gathered slots at
        // `2·(row · NUC_GATHER + slot)` for `slot < NUC_GATHER`,
        // row words at `row · ROW_WORDS + w`, shared slices by
        // their sizes).
        unsafe {
            if min_p {
                kept_sums_part_rows::launch_unchecked(
                    &l.client,
                    grid(),
                    CubeDim::new_1d(units),
                    lanes,
                    BufferArg::from_raw_parts(l.handle.clone(), b * n),
                    BufferArg::from_raw_parts(param.handle.clone(), b),
                    BufferArg::from_raw_parts(t_handle.clone(), b),
                    BufferArg::from_raw_parts(key.handle.clone(), parts),
                    BufferArg::from_raw_parts(pos.handle.clone(), parts),
                    BufferArg::from_raw_parts(pbad.handle.clone(), parts),
                    BufferArg::from_raw_parts(sums_hi.handle.clone(), parts),
                    BufferArg::from_raw_parts(sums_lo.handle.clone(), parts),
                    n as u32,
                    seg as u32,
                    lanes as u32,
                    units as usize,
                    t.is_some(),
                    keep_all,
                );
            } else {
                top_p_histogram_part_rows::launch_unchecked(
                    &l.client,
                    grid(),
                    CubeDim::new_1d(units),
                    lanes,
                    BufferArg::from_raw_parts(l.handle.clone(), b * n),
                    BufferArg::from_raw_parts(key.handle.clone(), parts),
                    BufferArg::from_raw_parts(pos.handle.clone(), parts),
                    BufferArg::from_raw_parts(pbad.handle.clone(), parts),
                    BufferArg::from_raw_parts(hist.handle.clone(), hist_words),
                    n as u32,
                    seg as u32,
                    lanes as u32,
                    units as usize,
                );
                // Read 3 over the segments: their kept sums, the crossing
                // bin's logits gathered.
                top_p_kept_part_rows::launch_unchecked(
                    &l.client,
                    grid(),
                    CubeDim::new_1d(units),
                    lanes,
                    BufferArg::from_raw_parts(l.handle.clone(), b * n),
                    BufferArg::from_raw_parts(param.handle.clone(), b),
                    BufferArg::from_raw_parts(t_handle.clone(), b),
                    BufferArg::from_raw_parts(key.handle.clone(), parts),
                    BufferArg::from_raw_parts(pos.handle.clone(), parts),
                    BufferArg::from_raw_parts(pbad.handle.clone(), parts),
                    BufferArg::from_raw_parts(hist.handle.clone(), hist_words),
                    BufferArg::from_raw_parts(gather.handle.clone(), gather_words),
                    BufferArg::from_raw_parts(top_p_sums.handle.clone(), top_p_sums_words),
                    n as u32,
                    seg as u32,
                    lanes as u32,
                    units as usize,
                    t.is_some(),
                );
            }
        }
        // Each workgroup of the second pass merges its row's read 1 (12
        // bytes a segment); the histogram's words are read and written by
        // atomics.
        let second = if min_p {
            "kept_sums_part_rows"
        } else {
            "top_p_histogram_part_rows"
        };
        let second_extra = if min_p { 0 } else { 4 * hist_words };
        crate::launches::declare_read(
            second,
            4 * b * n + 12 * parts * segments + 16 * b + second_extra,
        );
        if !min_p {
            // Each workgroup: the merged read 1, 512 bytes of the row's
            // histogram (the group sums, one group's bins), its segment;
            // the gathered logits written (at most 8 KB a row).
            crate::launches::declare_read(
                "top_p_kept_part_rows",
                4 * b * n + 12 * parts * segments + 12 * b + 512 * parts,
            );
        }
    }
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernels form is inside their buffers (row
    // bases and loops bounded by the width, bins clamped to `NUC_BINS`,
    // gathered slots to `NUC_GATHER`, shared slices by their sizes,
    // partials and sums at `row · segments + j` for `j < segments`, only
    // read with `split`).
    unsafe {
        let (a0, a1, a2, a3, a4, a5, a6) = (
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(param.handle.clone(), b),
            BufferArg::from_raw_parts(t_handle, b),
            BufferArg::from_raw_parts(u.handle.clone(), b),
            BufferArg::from_raw_parts(keys.handle.clone(), b),
            BufferArg::from_raw_parts(out.handle.clone(), out_len),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
        );
        let (p0, p1, p2) = (
            BufferArg::from_raw_parts(key.handle.clone(), parts),
            BufferArg::from_raw_parts(pos.handle.clone(), parts),
            BufferArg::from_raw_parts(pbad.handle.clone(), parts),
        );
        if min_p {
            min_p_dist_full_rows::launch_unchecked(
                &l.client,
                cubes,
                dim,
                lanes,
                a0,
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
                p0,
                p1,
                p2,
                BufferArg::from_raw_parts(sums_hi.handle.clone(), sums_words),
                BufferArg::from_raw_parts(sums_lo.handle.clone(), sums_words),
                n as u32,
                lanes as u32,
                none,
                greedy_below,
                segments as u32,
                seg as u32,
                units as usize,
                t.is_some(),
                mode,
                keep_all,
                split,
            )
        } else {
            top_p_dist_full_rows::launch_unchecked(
                &l.client,
                cubes,
                dim,
                lanes,
                a0,
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
                p0,
                p1,
                p2,
                BufferArg::from_raw_parts(hist.handle.clone(), hist_words),
                BufferArg::from_raw_parts(gather.handle.clone(), gather_words),
                BufferArg::from_raw_parts(top_p_sums.handle.clone(), top_p_sums_words),
                n as u32,
                lanes as u32,
                none,
                greedy_below,
                segments as u32,
                seg as u32,
                units as usize,
                t.is_some(),
                mode,
                split,
                cut_only,
            )
        }
    }
    // Passes over the whole row in this kernel: unsplit, top_p's max,
    // histogram and chunk passes, min_p's max and chunk passes; split,
    // none. Then the drawn chunk (a thread's contiguous chunk, or split the
    // drawn segment) summed in parts and the part holding `u·W` walked, the
    // row scalars, and split, the merged read 1 (12 bytes a segment), the
    // segments' sums and for top_p the histogram, its gathered count and
    // the gathered logits (at most 8 KB a row; counted whole).
    // A top_p crossing bin of more than `NUC_GATHER` logits adds passes
    // over the row (module doc); not counted here.
    // Cut only: no draw (read 3 only gathers; the cut is 16 bytes a row).
    let passes = match (split, min_p) {
        (true, _) => 0,
        (false, true) => 2,
        (false, false) => 3,
    };
    let chunk = if split {
        seg * lanes
    } else {
        n.div_ceil(units as usize)
    };
    let drawn = if cut_only {
        0
    } else {
        chunk + chunk.div_ceil(units as usize)
    };
    let merged = if !split {
        0
    } else if min_p {
        12 * parts + 8 * parts
    } else {
        12 * parts + 8 * parts + 4 * b * (HIST_WORDS as usize + 1) + 8 * b * NUC_GATHER as usize
    };
    let name = match cut {
        FullCut::TopP(_) => "top_p_dist_full_rows",
        FullCut::MinP(_) => "min_p_dist_full_rows",
        FullCut::All => "dist_all_full_rows",
    };
    crate::launches::declare_read(name, 4 * b * (passes * n + drawn) + 16 * b + merged);
    Some((out, bad))
}
