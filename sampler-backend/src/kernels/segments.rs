//! How many workgroups a row is split over below a batch that fills the
//! device (greedy, the full-row cuts, the top-k compaction).

/// The fewest logits one workgroup of a split row reads (8 KiB).
pub const SEGMENT_MIN: usize = 2048;

/// The most workgroups a row is split over (greedy, the full-row cuts, the
/// top-k compaction).
pub const SEGMENTS_MAX: usize = 256;

/// The workgroups that keep a device busy, what [`row_segments`] fills:
/// four per streaming multiprocessor (compute unit) where the device says
/// how many it has (cuda does); 4 · 132 (an H100 / H200) on a GPU that does
/// not (wgpu never does); on a software device (`software_threads`: Mesa's
/// lavapipe, no physical device behind it, which runs the workgroups on
/// its CPU threads one after another at a fixed cost of tens of µs each),
/// one per thread.
pub fn busy_workgroups(sms: Option<u32>, software_threads: Option<usize>) -> usize {
    match (sms, software_threads) {
        (Some(sms), _) => 4 * sms.max(1) as usize,
        (None, Some(threads)) => threads.max(1),
        (None, None) => 4 * 132,
    }
}

/// Workgroups [`argmax`](super::argmax) splits each row of `[b, n]` logits over on a
/// device kept busy by `busy` workgroups ([`busy_workgroups`]): enough that
/// the batch has `busy` of them, each reading at least [`SEGMENT_MIN`]
/// logits, at most [`SEGMENTS_MAX`]; 1 (one workgroup a row, one kernel)
/// once the batch alone fills the device. A split row costs a second,
/// small launch that merges the segments' maxima (`12` bytes a segment).
/// At B = 1 and V = 151936 on an H200: 74 workgroups a row.
pub fn row_segments(b: usize, n: usize, busy: usize) -> usize {
    if b == 0 || n == 0 {
        return 1;
    }
    busy.max(1)
        .div_ceil(b)
        .min(n / SEGMENT_MIN)
        .clamp(1, SEGMENTS_MAX)
}
