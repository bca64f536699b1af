//! The tensor building blocks of `sampler_backend::ops` on every device:
//! `arange` / `positions` give `0..n` for every width, including more widths
//! than the per-thread cache holds and the vocabulary sizes of real models;
//! the one-gather form of the raw logprobs.

mod device_support;

use sampler_backend::burn_tensor::Device;
use sampler_backend::ops;

fn ints(t: sampler_backend::burn_tensor::Tensor<2, sampler_backend::burn_tensor::Int>) -> Vec<i64> {
    t.into_data()
        .convert::<i64>()
        .iter::<i64>()
        .collect::<Vec<_>>()
}

fn positions_are_0_to_n_on_every_width(device: &Device, name: &str) {
    // 20 distinct widths (more than the cache keeps), then the first ones
    // again (evicted and uploaded anew), then a cached one twice.
    let mut widths: Vec<usize> = (1..=18).collect();
    widths.extend([151_936, 49_152, 1, 2, 151_936, 151_936]);
    for &n in &widths {
        let b = if n > 1000 { 2 } else { 3 };
        let got = ints(ops::positions(b, n, device));
        assert_eq!(got.len(), b * n, "{name}: positions({b}, {n})");
        for (r, row) in got.chunks(n).enumerate() {
            assert!(
                row.iter().enumerate().all(|(i, &x)| x == i as i64),
                "{name}: row {r} of positions({b}, {n}) is not 0..{n}"
            );
        }
    }
    // The cached vector is shared, never written: an op on one use leaves
    // the next use untouched.
    let a = ops::positions(1, 5, device).add_scalar(100);
    assert_eq!(ints(a), vec![100, 101, 102, 103, 104], "{name}");
    assert_eq!(
        ints(ops::positions(1, 5, device)),
        vec![0, 1, 2, 3, 4],
        "{name}"
    );
}

/// The device's raw logprobs gather the top entries (positions from a
/// `topk`) and the requested ids (an uploaded tensor) in one gather over the
/// concatenated indices: every value comes from its own position. (Two
/// gathers of one source with index widths 1 and 2 in one fused graph read
/// the first at position 0 on wgpu, burn 0.22: why the batch uses one.)
fn one_gather_reads_every_index_at_its_position(device: &Device, name: &str) {
    use sampler_backend::burn_tensor::{Int, Tensor, TensorData};
    let row: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let l = Tensor::<2>::from_data(TensorData::new(row, [1, 8]), device);
    let (e, m) = ops::exps(&l);
    let ln_s = e.sum_dim(1).log();
    let lp = l.clone().sub(ops::wide(m, 8)).sub(ops::wide(ln_s, 8));
    let (_, top, _) = ops::canonical_topk_positions(
        &l,
        &ops::positions(1, 8, device),
        &ops::col_int(&[1], device),
        1,
    );
    let want = Tensor::<2, Int>::from_data(TensorData::new(vec![5i64, 6], [1, 2]), device);
    let got: Vec<f32> = lp
        .gather(1, Tensor::cat(vec![top, want], 1))
        .into_data()
        .convert::<f32>()
        .iter::<f32>()
        .collect();
    let ln_s = (0..8).map(|i| (i as f64 - 7.0).exp()).sum::<f64>().ln();
    for (g, t) in got.iter().zip([7.0, 5.0, 6.0]) {
        let want = (t - 7.0 - ln_s) as f32;
        assert!(
            (g - want).abs() < 1e-6,
            "{name}: {got:?}, token {t}: {want}"
        );
    }
}

device_tests!(
    positions_are_0_to_n_on_every_width,
    one_gather_reads_every_index_at_its_position
);
