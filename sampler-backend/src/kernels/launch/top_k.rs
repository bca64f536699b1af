//! Launch of the top-k kernel, and the length of the sample its floor
//! comes from.

use burn_cubecl::cubecl::prelude::*;
use burn_tensor::{DType, Int, Tensor};

use super::{float_tensor, int_tensor, output, per_row, resolve_float, resolve_int, units};
use crate::HistoryPenalties;
use crate::kernels::cube::topk_rows;
use crate::kernels::{HISTORY_MAX, TOP_K_MAX, TopK};

/// The most elements per thread whose maximum stands for the thread in the
/// top-k kernel's floor.
const FLOOR_SAMPLE: u32 = 128;

/// Logits expected above the top-k kernel's floor (well inside the
/// compaction's [`TOP_K_MAX`] slots).
const FLOOR_TARGET: f64 = 256.0;

/// The length of the row prefix whose per-thread maxima give the top-k
/// kernel's floor (the `k`-th largest of `units` maxima). With `s` elements
/// per thread, a logit of a row without structure lies above the floor
/// with probability about `-ln(1 - k/units) / s`, so `s` is chosen to
/// expect [`FLOOR_TARGET`] logits above it: the sample is a small part of
/// the row (about `0.22·V` at `k = 50`) instead of a second read of it.
/// (256 rather than more: ranking the compacted logits costs O(n²) in
/// shared memory, and 256 fewer ranked is worth 0.1 of a read.)
/// 0 when `k` exceeds `units` (the kernel takes no floor then).
fn floor_sample(n: usize, k: usize, units: u32) -> usize {
    let units = units as usize;
    if k > units || n == 0 {
        return 0;
    }
    let tail = -(1.0 - k as f64 / units as f64).ln();
    let per_thread = (n as f64 * tail / FLOOR_TARGET).ceil() as usize;
    (per_thread.clamp(1, FLOOR_SAMPLE as usize) * units).min(n)
}

/// [`crate::kernels::top_k`] on rows it takes, `h` history tokens per row.
pub(crate) fn top_k(
    logits: &Tensor<2>,
    k: usize,
    k_row: &Tensor<2, Int>,
    pad_base: usize,
    penalties: Option<&HistoryPenalties>,
    h: usize,
) -> Option<TopK> {
    let [b, n] = logits.dims();
    let (cube, fusion) = resolve_float(logits)?;
    let k_row = resolve_int(k_row)?;
    let units = units(&cube);
    // The history's tensors, or unread placeholders without penalties.
    let (hist_ids, hist_counts, repeat, frequency, presence) = match penalties {
        Some(p) => (
            resolve_int(&p.ids)?,
            resolve_float(&p.counts)?.0,
            resolve_float(&p.repeat)?.0,
            resolve_float(&p.frequency)?.0,
            resolve_float(&p.presence)?.0,
        ),
        None => (
            output(&cube, [b, 1], DType::I32),
            output(&cube, [b, 1], DType::F32),
            output(&cube, [b, 1], DType::F32),
            output(&cube, [b, 1], DType::F32),
            output(&cube, [b, 1], DType::F32),
        ),
    };
    if hist_ids.dtype != DType::I32 {
        return None;
    }
    let (vals, pos, order) = (
        output(&cube, [b, k], DType::F32),
        output(&cube, [b, k], DType::I32),
        output(&cube, [b, k], DType::I32),
    );
    let bad = output(&cube, [b, 1], DType::I32);
    let k_sel = (k + h).min(n);
    let sample = floor_sample(n, k_sel, units);
    let hb = b * h.max(1);
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, history ids inside the
    // vocabulary by construction, shared slices by their sizes).
    unsafe {
        topk_rows::launch_unchecked(
            &cube.client,
            cubes,
            dim,
            BufferArg::from_raw_parts(cube.handle.clone(), b * n),
            BufferArg::from_raw_parts(k_row.handle.clone(), b),
            BufferArg::from_raw_parts(hist_ids.handle.clone(), hb),
            BufferArg::from_raw_parts(hist_counts.handle.clone(), hb),
            BufferArg::from_raw_parts(repeat.handle.clone(), b),
            BufferArg::from_raw_parts(frequency.handle.clone(), b),
            BufferArg::from_raw_parts(presence.handle.clone(), b),
            BufferArg::from_raw_parts(vals.handle.clone(), b * k),
            BufferArg::from_raw_parts(pos.handle.clone(), b * k),
            BufferArg::from_raw_parts(order.handle.clone(), b * k),
            BufferArg::from_raw_parts(bad.handle.clone(), b),
            n as u32,
            sample as u32,
            k_sel as u32,
            k as u32,
            h as u32,
            pad_base as u32,
            units as usize,
            TOP_K_MAX,
            penalties.is_some(),
            HISTORY_MAX,
        )
    }
    // The fast path: the floor's sample and one pass over the row, the
    // history's ids, counts and logits, the k written values' re-reads.
    crate::launches::declare_read(
        "topk_rows",
        4 * b * (n + sample + 1 + k) + 12 * b * h + 12 * b,
    );
    Some(TopK {
        logits: float_tensor(vals, &fusion),
        positions: int_tensor(pos, &fusion),
        order_ids: int_tensor(order, &fusion),
        first_bad: int_tensor(bad, &fusion),
    })
}
