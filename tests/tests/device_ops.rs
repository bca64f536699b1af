//! The tensor building blocks of `sampler_backend::ops` on every device:
//! `arange` / `positions` give `0..n` for every width, including more widths
//! than the per-thread cache holds and the vocabulary sizes of real models.

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

device_tests!(positions_are_0_to_n_on_every_width);
