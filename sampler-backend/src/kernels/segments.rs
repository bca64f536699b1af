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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_rows_split_until_the_batch_fills_the_device() {
        let h200 = busy_workgroups(Some(132), None);
        assert_eq!(h200, 528);
        // A GPU that does not say (wgpu) is taken for an H200.
        assert_eq!(busy_workgroups(None, None), h200);
        // cuda says, even where the process also knows its CPU threads.
        assert_eq!(busy_workgroups(Some(114), Some(2)), 456);
        // lavapipe on 2 threads: one workgroup per thread.
        let lavapipe = busy_workgroups(None, Some(2));
        assert_eq!(lavapipe, 2);
        assert_eq!(row_segments(1, 151_936, lavapipe), 2);
        assert_eq!(row_segments(2, 151_936, lavapipe), 1);
        // B = 1 at V = 151936 on an H200 (132 SMs): 74 workgroups of 2053.
        assert_eq!(row_segments(1, 151_936, h200), 74);
        // Segments never read fewer than SEGMENT_MIN logits.
        assert_eq!(row_segments(1, 32_000, h200), 15);
        assert_eq!(row_segments(4, 4095, h200), 1);
        assert_eq!(row_segments(4, 4096, h200), 2);
        // The batch fills the device: one workgroup a row.
        assert_eq!(row_segments(528, 151_936, h200), 1);
        assert_eq!(row_segments(4096, 151_936, h200), 1);
        assert_eq!(row_segments(32, 151_936, h200), 17);
        // A huge device and row: capped.
        assert_eq!(
            row_segments(1, 1 << 24, busy_workgroups(Some(1000), None)),
            SEGMENTS_MAX
        );
        assert_eq!(row_segments(0, 10, h200), 1);
        assert_eq!(row_segments(1, 0, 0), 1);
        for b in 1..600 {
            for n in [1usize, 2047, 2048, 50_000, 151_936] {
                let s = row_segments(b, n, h200);
                assert!((1..=SEGMENTS_MAX).contains(&s));
                assert!(s == 1 || n / s >= SEGMENT_MIN, "b {b} n {n}: {s}");
                assert!(
                    s == 1 || b * (s - 1) < 4 * 132,
                    "b {b} n {n}: {s} more than needed"
                );
            }
        }
    }
}
