//! Launch of the top-k kernel (one workgroup a row, or below a batch that
//! fills the device its floor and compaction first, the compaction split
//! over several workgroups a row), and the length of the floor's sample.

use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_tensor::{DType, Int, Tensor};

use super::{
    float_tensor, int_tensor, output, per_row, resolve_float, resolve_int, row_lanes, units,
};
use crate::HistoryPenalties;
use crate::kernels::cube::{topk_compact_part_rows, topk_floor_rows, topk_rows};
use crate::kernels::{HISTORY_MAX, TOP_K_MAX, TopK};

/// The most elements per thread whose maximum stands for the thread in the
/// top-k kernel's floor.
const FLOOR_SAMPLE: u32 = 128;

/// The fewest runs the floor's sample takes (each `units` consecutive
/// vectors): at a small `k` one run would be the row's first `units`
/// vectors, and a row whose likely tokens sit at high ids (bands of
/// frequency) would send most of itself above that floor.
const FLOOR_RUNS_MIN: usize = 8;

/// Logits expected above the top-k kernel's floor (well inside the
/// compaction's [`TOP_K_MAX`] slots).
const FLOOR_TARGET: f64 = 256.0;

/// How many vectors (`lanes` logits each), and how far apart their runs
/// start, of the sample whose per-thread maxima give the top-k kernel's
/// floor (the `k`-th largest of `units` maxima), on a row of `n` logits.
/// The sample is `r` runs of `units` consecutive vectors spread evenly over
/// the row, the first at its start, the last ending within `r` vectors of
/// its end (`stride >= units` vectors apart, so the runs never overlap; at
/// least [`FLOOR_RUNS_MIN`] runs; the whole row when it is that short),
/// so that a row whose likely tokens sit at high ids (byte and special
/// tokens first, bands of frequency after them) gets the floor of the whole
/// row, not of its prefix. With `s = r·lanes` elements
/// per thread, a logit of a row without structure lies above the floor
/// with probability about `-ln(1 - k/units) / s`, so `s` is chosen to
/// expect [`FLOOR_TARGET`] logits above it: the sample is a small part of
/// the row (about `0.22·V` at `k = 50`) instead of a second read of it.
/// (256 rather than more: ranking the compacted logits costs O(n²) in
/// shared memory, and 256 fewer ranked is worth 0.1 of a read.)
/// `(0, units)` when `k` exceeds `units` (the kernel takes no floor then).
fn floor_sample(n: usize, k: usize, units: u32, lanes: usize) -> (usize, usize) {
    let units = units as usize;
    let nv = n / lanes;
    if k > units || nv == 0 {
        return (0, units);
    }
    let tail = -(1.0 - k as f64 / units as f64).ln();
    let runs_max = (FLOOR_SAMPLE as usize / lanes).max(FLOOR_RUNS_MIN);
    let runs = ((n as f64 * tail / FLOOR_TARGET) / lanes as f64)
        .ceil()
        .clamp(FLOOR_RUNS_MIN as f64, runs_max as f64) as usize;
    if runs * units >= nv {
        // The whole row, in consecutive runs.
        return (nv, units);
    }
    // `nv >= (runs + 1)·units` here, so the stride is at least `units`
    // and the last run, at `(runs - 1)·stride`, ends inside the row.
    (runs * units, (nv - units) / (runs - 1))
}

/// What `topk_rows` with `split` reads instead of the row: each row's
/// floor, candidate count and [`TOP_K_MAX`] global candidate slots, and the
/// segments' validation keys.
struct SplitFloor {
    floor: CubeTensor,
    count: CubeTensor,
    cand: CubeTensor,
    part_bad: CubeTensor,
    segments: usize,
}

/// The floor (`topk_floor_rows`, one workgroup a row reading the sample of
/// `sample` vectors `stride` apart) and the compaction split over
/// `segments` workgroups a row (`topk_compact_part_rows`) of rows
/// `l [b, n]`, for `topk_rows` with `split`.
#[allow(clippy::too_many_arguments)]
fn split_floor(
    l: &CubeTensor,
    b: usize,
    n: usize,
    segments: usize,
    lanes: usize,
    units: u32,
    (sample, stride): (usize, usize),
    k_sel: usize,
) -> SplitFloor {
    let word = |len: usize| output(l, [len], DType::U32);
    let parts = b * segments;
    let (floor, count) = (word(b), word(b));
    let (cand, part_bad) = (word(2 * b * TOP_K_MAX), word(parts));
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and the sample's runs inside the row, `floor` / `count` at the
    // row, shared slices by their sizes).
    unsafe {
        topk_floor_rows::launch_unchecked(
            &l.client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(units),
            lanes,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(floor.handle.clone(), b),
            BufferArg::from_raw_parts(count.handle.clone(), b),
            n as u32,
            lanes as u32,
            sample as u32,
            stride as u32,
            k_sel as u32,
            units as usize,
        );
    }
    crate::launches::declare_read("topk_floor_rows", 4 * b * sample * lanes);
    let seg = (n / lanes).div_ceil(segments);
    // SAFETY: as above; segments inside the row, the candidate slots at
    // `2·(row · TOP_K_MAX + slot)` for `slot < TOP_K_MAX`, the segments'
    // validation keys at `row · segments + segment`.
    unsafe {
        topk_compact_part_rows::launch_unchecked(
            &l.client,
            CubeCount::Static(segments as u32, b as u32, 1),
            CubeDim::new_1d(units),
            lanes,
            BufferArg::from_raw_parts(l.handle.clone(), b * n),
            BufferArg::from_raw_parts(floor.handle.clone(), b),
            BufferArg::from_raw_parts(count.handle.clone(), b),
            BufferArg::from_raw_parts(cand.handle.clone(), 2 * b * TOP_K_MAX),
            BufferArg::from_raw_parts(part_bad.handle.clone(), parts),
            n as u32,
            seg as u32,
            lanes as u32,
            units as usize,
            TOP_K_MAX,
        );
    }
    // The row, and each workgroup's read of the row's floor.
    crate::launches::declare_read("topk_compact_part_rows", 4 * b * n + 4 * parts);
    SplitFloor {
        floor,
        count,
        cand,
        part_bad,
        segments,
    }
}

/// [`crate::kernels::top_k_split`] on rows it takes, `h` history tokens
/// per row (`segments`: the device's choice when `None`).
pub(crate) fn top_k(
    logits: &Tensor<2>,
    k: usize,
    k_row: &Tensor<2, Int>,
    pad_base: usize,
    penalties: Option<&HistoryPenalties>,
    h: usize,
    segments: Option<usize>,
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
    let above = output(&cube, [b, 1], DType::I32);
    let k_sel = (k + h).min(n);
    let lanes = row_lanes(&cube, n);
    let (sample, stride) = floor_sample(n, k_sel, units, lanes);
    let hb = b * h.max(1);
    let segments = segments.unwrap_or_else(|| super::segments(&cube, b, n));
    // Split only where the kernel takes a floor (`k` at most the threads):
    // without one every logit is a candidate and the slots overflow. The
    // grid's second axis holds the batch, the slots' indices a `u32`.
    let fits = b <= cube.client.properties().hardware.max_cube_count.1 as usize
        && u32::try_from(2 * b * TOP_K_MAX).is_ok();
    let split = (segments > 1 && sample > 0 && fits)
        .then(|| split_floor(&cube, b, n, segments, lanes, units, (sample, stride), k_sel));
    // Without a split: one unread placeholder for the four buffers (read
    // only by `topk_rows`, never written), one allocation a step, not four.
    let (floor, count, cand, part_bad, parts) = match &split {
        Some(s) => (
            s.floor.clone(),
            s.count.clone(),
            s.cand.clone(),
            s.part_bad.clone(),
            s.segments,
        ),
        None => {
            let unread = output(&cube, [1], DType::U32);
            (unread.clone(), unread.clone(), unread.clone(), unread, 1)
        }
    };
    let (cubes, dim) = per_row(b, units);
    // SAFETY: every index the kernel forms is inside its buffers (row
    // bases and loops bounded by the width, history ids inside the
    // vocabulary by construction, shared slices by their sizes).
    unsafe {
        topk_rows::launch_unchecked(
            &cube.client,
            cubes,
            dim,
            lanes,
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
            BufferArg::from_raw_parts(above.handle.clone(), b),
            BufferArg::from_raw_parts(floor.handle.clone(), floor.meta.shape().num_elements()),
            BufferArg::from_raw_parts(count.handle.clone(), count.meta.shape().num_elements()),
            BufferArg::from_raw_parts(cand.handle.clone(), cand.meta.shape().num_elements()),
            BufferArg::from_raw_parts(
                part_bad.handle.clone(),
                part_bad.meta.shape().num_elements(),
            ),
            n as u32,
            lanes as u32,
            sample as u32,
            stride as u32,
            k_sel as u32,
            k as u32,
            h as u32,
            pad_base as u32,
            parts as u32,
            units as usize,
            TOP_K_MAX,
            penalties.is_some(),
            HISTORY_MAX,
            split.is_some(),
        )
    }
    // The fast path: the floor's sample and one pass over the row (split:
    // the row's floor and count, its slots counted whole, the segments'
    // validation keys), the history's ids, counts and logits, the k written
    // values' re-reads.
    let first_reads = match &split {
        Some(s) => 8 + 8 * TOP_K_MAX + 4 * s.segments,
        None => 4 * (n + sample * lanes),
    };
    crate::launches::declare_read(
        "topk_rows",
        b * (first_reads + 4 + 4 * k) + 12 * b * h + 12 * b,
    );
    Some(TopK {
        logits: float_tensor(vals, &fusion),
        positions: int_tensor(pos, &fusion),
        order_ids: int_tensor(order, &fusion),
        first_bad: int_tensor(bad, &fusion),
        above_floor: int_tensor(above, &fusion),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample's runs lie inside the row, never overlap, and spread over
    /// it: the last run starts in the row's last `stride` positions.
    #[test]
    fn floor_sample_runs_cover_the_row_without_overlap() {
        for (units, lanes) in [(32u32, 1usize), (64, 1), (256, 1), (256, 4)] {
            let u = units as usize;
            for n in [4usize, 32, 256, 1000, 32_000, 49_152, 151_936, 262_144] {
                for k in [1usize, 2, 40, 50, u, u + 1] {
                    let (sample, stride) = floor_sample(n, k, units, lanes);
                    if k > u {
                        assert_eq!(sample, 0, "no floor when k > units");
                        continue;
                    }
                    // In vectors from here.
                    let n = n / lanes;
                    assert!(sample >= 1 && sample <= n, "n {n} k {k}: {sample}");
                    assert!(stride >= u, "runs overlap: n {n} k {k} stride {stride}");
                    if sample == n {
                        assert_eq!(stride, u, "the whole row in consecutive runs");
                        continue;
                    }
                    assert_eq!(sample % u, 0, "whole runs only");
                    let runs = sample / u;
                    assert!(runs >= FLOOR_RUNS_MIN && runs * lanes <= FLOOR_SAMPLE as usize);
                    let last = (runs - 1) * stride;
                    assert!(last + u <= n, "n {n} k {k}: a run past the row");
                    // (n - u) - (runs - 1)·⌊(n - u) / (runs - 1)⌋ < runs - 1:
                    // the last run ends within `runs` positions of the end.
                    assert!(
                        n - (last + u) < runs,
                        "n {n} k {k}: the sample stops short of the row's end"
                    );
                }
            }
        }
    }
}
