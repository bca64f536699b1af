//! The custom cubecl kernels (`sampler_backend::kernels`) against a plain
//! Rust reference: the canonical top `k` of each row (logit descending,
//! ties to the lowest position) and the greedy argmax (lowest position of
//! the maximum, `-1` for a row of `-inf`), on rows built to break them:
//! long runs of ties at the boundary, `-inf`, `-0.0` next to `0.0`, `±f32::MAX`,
//! subnormals, widths around the workgroup size, `k` of 1, the width and the
//! kernel's cap, and rows whose keys share their high bytes (every radix
//! pass must narrow). Run on wgpu (CI: lavapipe); other builds have no
//! kernels and report it.
#![cfg_attr(
    not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")),
    allow(dead_code, unused_imports)
)]

mod device_support;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_backend::burn_tensor::{Device, Tensor, TensorData};

/// Positions of the canonical top `k` of `row`.
fn reference_top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    // `-0.0 == 0.0` under `partial_cmp`, as the kernel keys them.
    idx.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

fn reference_argmax(row: &[f32]) -> i64 {
    let top = reference_top_k(row, 1)[0];
    if row[top] == f32::NEG_INFINITY {
        -1
    } else {
        top as i64
    }
}

/// Rows of one kind: `kind` picks the hazard.
fn row(kind: usize, n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..n)
        .map(|i| match kind {
            // Few distinct values: long tie runs at any boundary.
            0 => (rng.random_range(0..4) as f32) * 0.5,
            // Zipf-like, a few -inf, a few ties.
            1 => {
                if rng.random_range(0..10) == 0 {
                    f32::NEG_INFINITY
                } else {
                    -((rng.random_range(1..1000) as f32).ln())
                }
            }
            // Signed zeros, extremes and subnormals.
            2 => [0.0, -0.0, f32::MAX, -f32::MAX, 1e-45, -1e-45, 1.0, -1.0][rng.random_range(0..8)],
            // Keys sharing their top bytes: values in [1, 1 + 2^-10).
            3 => 1.0 + (rng.random_range(0..1024) as f32) * f32::EPSILON,
            // All -inf except maybe one.
            4 => {
                if i == n / 2 && n.is_multiple_of(2) {
                    3.0
                } else {
                    f32::NEG_INFINITY
                }
            }
            // Distinct values, descending with position (worst order).
            _ => -(i as f32),
        })
        .collect()
}

fn upload(rows: &[Vec<f32>], device: &Device) -> Tensor<2> {
    let (b, n) = (rows.len(), rows[0].len());
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::<2>::from_data(TensorData::new(flat, [b, n]), device)
}

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_top_k_and_argmax_kernels_match_the_reference() {
    use sampler_backend::burn_tensor::Int;
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut checked = 0;
    for &n in &[1usize, 3, 255, 256, 257, 1000, 4099, 32_000] {
        let rows: Vec<Vec<f32>> = (0..6).map(|kind| row(kind, n, &mut rng)).collect();
        let t = upload(&rows, &device);

        // The device's own split, one workgroup a row, and rows split over
        // 2, 7 and the most workgroups (segments past the row's end empty).
        for split in [None, Some(1), Some(2), Some(7), Some(kernels::SEGMENTS_MAX)] {
            let got: Vec<i64> = kernels::argmax_split(&t, kernels::TokenCodes::Tokens, split)
                .expect("wgpu has the argmax kernel")
                .0
                .into_data()
                .convert::<i64>()
                .iter::<i64>()
                .collect();
            for (r, rrow) in rows.iter().enumerate() {
                assert_eq!(
                    got[r],
                    reference_argmax(rrow),
                    "argmax, n = {n}, row kind {r}, split {split:?}"
                );
            }
        }

        let mut ks = vec![1, 2, 50, n, kernels::TOP_K_MAX];
        ks.retain(|&k| k <= n && k <= kernels::TOP_K_MAX);
        ks.dedup();
        // The device's own split, one workgroup a row, and the floor and
        // compaction split over 3 and the most workgroups (a `k` above the
        // threads takes no floor and is never split).
        let splits = [None, Some(1), Some(3), Some(kernels::SEGMENTS_MAX)];
        for (&k, split) in ks.iter().flat_map(|k| splits.iter().map(move |s| (k, *s))) {
            // Each row's own k: the batch's k, or less (padding after it).
            let own: Vec<i32> = (0..rows.len())
                .map(|r| (k as i32 - r as i32).max(1))
                .collect();
            let k_row =
                Tensor::<2, Int>::from_data(TensorData::new(own.clone(), [rows.len(), 1]), &device);
            let pad_base = 1_000_000;
            let kernels::TopK {
                logits: vals,
                positions: pos,
                order_ids: order,
                first_bad,
                ..
            } = kernels::top_k_split(&t, k, &k_row, pad_base, None, split)
                .expect("wgpu has the top-k kernel");
            let valid = 2 * n as i64;
            let bad: Vec<i64> = first_bad
                .into_data()
                .convert::<i64>()
                .iter::<i64>()
                .collect();
            assert_eq!(
                bad,
                vec![valid; rows.len()],
                "first_bad of valid rows, n = {n}"
            );
            assert_eq!(vals.dims(), [rows.len(), k]);
            let vals: Vec<f32> = vals.into_data().iter::<f32>().collect();
            let pos: Vec<i64> = pos.into_data().convert::<i64>().iter::<i64>().collect();
            let order: Vec<i64> = order.into_data().convert::<i64>().iter::<i64>().collect();
            for (r, rrow) in rows.iter().enumerate() {
                let want = reference_top_k(rrow, k);
                let got_pos: Vec<usize> = pos[r * k..(r + 1) * k]
                    .iter()
                    .map(|&p| p as usize)
                    .collect();
                assert_eq!(
                    got_pos, want,
                    "top_k positions, n = {n}, k = {k}, row kind {r}, split {split:?}"
                );
                for (j, &p) in want.iter().enumerate() {
                    let (v, o) = if j < own[r] as usize {
                        (rrow[p], p as i64)
                    } else {
                        (f32::NEG_INFINITY, (pad_base + j) as i64)
                    };
                    let at = format!("n = {n}, k = {k}, row kind {r}, slot {j}, split {split:?}");
                    assert_eq!(vals[r * k + j].to_bits(), v.to_bits(), "top_k value, {at}");
                    assert_eq!(order[r * k + j], o, "top_k order id, {at}");
                }
                checked += 1;
            }
        }
    }
    // Outside the kernel's range the caller falls back to the recipe.
    let t = upload(&[vec![0.0; 2000]], &device);
    let one = Tensor::<2, Int>::ones([1, 1], &device);
    assert!(kernels::top_k(&t, kernels::TOP_K_MAX + 1, &one, 2000, None).is_none());
    assert!(kernels::top_k(&t, 0, &one, 2000, None).is_none());
    assert!(kernels::top_k(&t, 2001, &one, 2000, None).is_none());
    assert!(checked > 600, "{checked} rows checked");
}

/// Narrow rows as a top-k leaves them: logits with ties and `-inf`, ids a
/// shuffled subset of the vocabulary with padding ids past it.
fn narrow_case(n: usize, rng: &mut ChaCha8Rng) -> (Vec<f32>, Vec<i32>) {
    let logits = (0..n)
        .map(|_| match rng.random_range(0..8) {
            0 => f32::NEG_INFINITY,
            1 => 1.5,
            _ => rng.random_range(-6.0f32..6.0),
        })
        .collect();
    let mut ids: Vec<i32> = (0..n as i32).map(|i| i * 7 + 3).collect();
    for i in (1..n).rev() {
        ids.swap(i, rng.random_range(0..=i));
    }
    (logits, ids)
}

/// The device recipe's top_p rule in f64: keep iff the weight before a
/// candidate (canonical order) is `< p·S` or its rank is `< keep`;
/// `None` when `p·S` lies within `1e-5` (relative) of a kept/dropped edge.
fn reference_top_p(l: &[f32], ids: &[i32], p: f64, keep: usize) -> Option<Vec<bool>> {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m = if m == f32::NEG_INFINITY {
        0.0
    } else {
        m as f64
    };
    let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let target = p * s;
    let mut out = Vec::new();
    for i in 0..l.len() {
        let before_i = |j: usize| l[j] > l[i] || (l[j] == l[i] && ids[j] < ids[i]);
        let rank = (0..l.len()).filter(|&j| before_i(j)).count();
        let before: f64 = (0..l.len()).filter(|&j| before_i(j)).map(|j| e[j]).sum();
        let exact = target == 0.0 || target.is_infinite();
        if !exact && rank >= keep && (before - target).abs() <= 1e-5 * s {
            return None;
        }
        out.push(before < target || rank < keep);
    }
    Some(out)
}

/// The device recipe's dist rule in f64: ascending ids, the first positive
/// weight whose cumulative weight reaches `u·S`; `None` near an edge.
fn reference_dist(l: &[f32], ids: &[i32], u: f64) -> Option<i64> {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return Some(-1);
    }
    let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by_key(|&i| ids[i]);
    let mut cum = 0.0;
    for &i in &order {
        if e[i] > 0.0 {
            cum += e[i];
            if (cum - u * s).abs() <= 1e-5 * s {
                return None;
            }
            if cum >= u * s {
                return Some(ids[i] as i64);
            }
        }
    }
    order
        .iter()
        .rev()
        .find(|&&i| e[i] > 0.0)
        .map(|&i| ids[i] as i64)
}

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_narrow_top_p_dist_and_validation_kernels_match_the_reference() {
    use sampler_backend::burn_tensor::Int;
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (mut checked, mut edges) = (0, 0);
    for &n in &[1usize, 2, 40, 255, 256, 257, 1024] {
        let b = 5;
        let cases: Vec<(Vec<f32>, Vec<i32>)> = (0..b).map(|_| narrow_case(n, &mut rng)).collect();
        let mut cases = cases;
        cases[b - 1].0 = vec![f32::NEG_INFINITY; n]; // a dead row
        let ps: Vec<f32> = vec![0.9, 0.0, 0.5, f32::INFINITY, 0.3];
        let keeps: Vec<i32> = vec![1, 1, 3, 1, 2];
        let us: Vec<f32> = (0..b).map(|_| rng.random_range(0.0f32..1.0)).collect();
        let logits = upload(
            &cases.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
            &device,
        );
        let flat_ids: Vec<i32> = cases.iter().flat_map(|c| c.1.clone()).collect();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(flat_ids, [b, n]), &device);
        let col = |v: &[f32]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [b, 1]), &device);
        let keep = Tensor::<2, Int>::from_data(TensorData::new(keeps.clone(), [b, 1]), &device);

        let kept: Vec<f32> = kernels::top_p(&logits, &ids, &col(&ps), &keep)
            .expect("top_p kernel")
            .into_data()
            .iter::<f32>()
            .collect();
        let toks: Vec<i64> = kernels::dist(&logits, &ids, &col(&us), kernels::TokenCodes::Tokens)
            .expect("dist kernel")
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .collect();
        for (r, (l, id)) in cases.iter().enumerate() {
            match reference_top_p(l, id, ps[r] as f64, keeps[r] as usize) {
                Some(want) => {
                    for (i, &w) in want.iter().enumerate() {
                        let got = kept[r * n + i];
                        let expect = if w { l[i] } else { f32::NEG_INFINITY };
                        assert_eq!(
                            got.to_bits(),
                            expect.to_bits(),
                            "top_p n = {n} row {r} slot {i}"
                        );
                    }
                    checked += 1;
                }
                None => {
                    println!("edge at n = {n} row {r}");
                    edges += 1
                }
            }
            match reference_dist(l, id, us[r] as f64) {
                Some(want) => {
                    assert_eq!(toks[r], want, "dist n = {n} row {r}");
                    checked += 1;
                }
                None => {
                    println!("edge at n = {n} row {r}");
                    edges += 1
                }
            }
        }
    }
    assert!(
        checked >= 60 && edges <= 3,
        "{checked} checked, {edges} at an edge"
    );
    assert!(
        kernels::top_p(
            &upload(&[vec![0.0; 1025]], &device),
            &Tensor::<2, Int>::zeros([1, 1025], &device),
            &Tensor::<2>::ones([1, 1], &device),
            &Tensor::<2, Int>::ones([1, 1], &device)
        )
        .is_none()
    );

    // Validation: 2i at the first NaN, 2i + 1 at the first +inf, 2V if none.
    let v = 3000;
    let mut rows = vec![vec![0.5f32; v]; 5];
    rows[1][2500] = f32::NAN;
    rows[1][2700] = f32::INFINITY;
    rows[2][7] = f32::INFINITY;
    rows[2][9] = f32::NAN;
    rows[3][0] = f32::NEG_INFINITY;
    rows[4][v - 1] = -f32::NAN;
    let got: Vec<i64> = kernels::first_bad(&upload(&rows, &device))
        .expect("validation kernel")
        .into_data()
        .convert::<i64>()
        .iter::<i64>()
        .collect();
    let want = vec![2 * v as i64, 5000, 15, 2 * v as i64, 2 * (v as i64 - 1)];
    assert_eq!(got, want);
    // The top-k and argmax kernels validate in their first pass: same keys.
    let t = upload(&rows, &device);
    let k_row = Tensor::<2, Int>::ones([5, 1], &device);
    let from_top_k = kernels::top_k(&t, 3, &k_row, v, None)
        .expect("kernel")
        .first_bad;
    let from_argmax = kernels::argmax(&t, kernels::TokenCodes::Tokens)
        .expect("kernel")
        .1;
    let p = Tensor::<2>::from_data(TensorData::new(vec![0.9f32; 5], [5, 1]), &device);
    let from_top_p = kernels::top_p_full(&t, &p).expect("kernel").1;
    let read =
        |t: Tensor<2, Int>| -> Vec<i64> { t.into_data().convert::<i64>().iter::<i64>().collect() };
    let given = from_top_k.clone();
    for keys in [from_top_k, from_argmax, from_top_p] {
        assert_eq!(read(keys), want);
    }
    // The selecting kernels write what a fully offloaded step reads back:
    // the token of a valid row, `-key - 2` for an invalid one, from their
    // own pass or from another kernel's keys.
    let read1 =
        |t: Tensor<1, Int>| -> Vec<i64> { t.into_data().convert::<i64>().iter::<i64>().collect() };
    let (plain, _) = kernels::argmax(&t, kernels::TokenCodes::Tokens).expect("kernel");
    let plain = read1(plain);
    let coded = |plain: &[i64], got: Vec<i64>, what: &str| {
        for (r, (&key, &tok)) in want.iter().zip(plain).enumerate() {
            let expect = if key < 2 * v as i64 { -key - 2 } else { tok };
            assert_eq!(got[r], expect, "{what}, row {r}");
        }
    };
    let own = kernels::argmax(&t, kernels::TokenCodes::OwnKeys)
        .expect("kernel")
        .0;
    coded(&plain, read1(own), "argmax, own keys");
    let keyed = kernels::argmax(&t, kernels::TokenCodes::Keys(&given, v))
        .expect("kernel")
        .0;
    coded(&plain, read1(keyed), "argmax, given keys");
    for split in [1, 2, 5, kernels::SEGMENTS_MAX] {
        let (own, keys) =
            kernels::argmax_split(&t, kernels::TokenCodes::OwnKeys, Some(split)).expect("kernel");
        coded(
            &plain,
            read1(own),
            &format!("argmax split {split}, own keys"),
        );
        assert_eq!(read(keys), want, "argmax split {split}: validation keys");
    }
    let u = Tensor::<2>::from_data(TensorData::new(vec![0.5f32; 5], [5, 1]), &device);
    let finite = upload(&vec![vec![0.25f32; v]; 5], &device);
    let dist_all = |codes| {
        kernels::cut_dist_full(&finite, kernels::FullCut::All, None, &u, 1e-5, codes)
            .expect("kernel")
            .0
    };
    let drawn = read1(dist_all(kernels::TokenCodes::Tokens));
    let keyed = dist_all(kernels::TokenCodes::Keys(&given, v));
    coded(&drawn, read1(keyed), "full-row dist, given keys");
    let narrow = upload(&vec![vec![0.25f32; 8]; 5], &device);
    let ids = Tensor::<2, Int>::from_data(
        TensorData::new((0..40).map(|i| (i % 8) * 3).collect::<Vec<i32>>(), [5, 8]),
        &device,
    );
    let drawn =
        read1(kernels::dist(&narrow, &ids, &u, kernels::TokenCodes::Tokens).expect("kernel"));
    assert!(
        drawn.iter().all(|&tok| tok >= 0 && tok % 3 == 0),
        "{drawn:?}"
    );
    let keyed =
        kernels::dist(&narrow, &ids, &u, kernels::TokenCodes::Keys(&given, v)).expect("kernel");
    coded(&drawn, read1(keyed), "dist, given keys");
    // A row of NaN but two logits has fewer than k candidates: every slot
    // is still written (positions inside the row, padding at -inf), so the
    // stages after it never gather at stale positions.
    let mut nan_row = vec![f32::NAN; v];
    nan_row[10] = 1.0;
    nan_row[20] = 2.0;
    // Split over 3 workgroups, the first bad logit of the last row lies in
    // the second segment and another one in the third: the merge takes the
    // row's first.
    let mut late_bad = vec![0.25f32; v];
    late_bad[1500] = f32::INFINITY;
    late_bad[2900] = f32::NAN;
    let t = upload(&[nan_row, vec![0.5; v], late_bad], &device);
    let k_row = Tensor::<2, Int>::from_data(TensorData::new(vec![5i32; 3], [3, 1]), &device);
    for split in [1, 3] {
        let got = kernels::top_k_split(&t, 5, &k_row, v, None, Some(split)).expect("kernel");
        let pos: Vec<i64> = got
            .positions
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .collect();
        let vals: Vec<f32> = got.logits.into_data().iter::<f32>().collect();
        let bad: Vec<i64> = got
            .first_bad
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .collect();
        assert_eq!(bad, vec![0, 2 * v as i64, 2 * 1500 + 1], "split {split}");
        assert!(pos.iter().all(|&p| (0..v as i64).contains(&p)), "{pos:?}");
        assert_eq!(&pos[5..10], &[0, 1, 2, 3, 4], "split {split}");
        assert_eq!((vals[0], vals[1]), (2.0, 1.0), "split {split}");
        assert!(
            vals[2..5].iter().all(|&x| x == f32::NEG_INFINITY),
            "split {split}: {vals:?}"
        );
    }
}

/// Temperature: `l / t` saturated at `±f32::MAX` with `-inf` kept, and
/// `t < 1e-5` keeping only the lowest id among the maxima (through `ids`,
/// or positions without them).
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_temperature_kernel_matches_the_reference() {
    use sampler_backend::burn_tensor::Int;
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let row0 = vec![1.0, -2.0, f32::NEG_INFINITY, 3.0e38, -3.0e38, 0.0, 2.5];
    let row1 = vec![2.0, 5.0, 5.0, f32::NEG_INFINITY, 5.0, -1.0, 0.0];
    let row2 = vec![f32::NEG_INFINITY; 7];
    let rows = vec![row0.clone(), row1.clone(), row2];
    let n = 7;
    let t = Tensor::<2>::from_data(TensorData::new(vec![0.5f32, 0.0, 1e-6], [3, 1]), &device);
    let ids: Vec<i32> = [6, 5, 4, 3, 2, 1, 0].repeat(3);
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [3, n]), &device);
    let bits = |x: Tensor<2>| {
        x.into_data()
            .iter::<f32>()
            .map(f32::to_bits)
            .collect::<Vec<_>>()
    };
    let ninf = f32::NEG_INFINITY;
    let scaled: Vec<f32> = row0
        .iter()
        .map(|&l| {
            if l == ninf {
                ninf
            } else {
                (l / 0.5).clamp(-f32::MAX, f32::MAX)
            }
        })
        .collect();

    // Positions as ids: row 1's maxima are at 1, 2, 4 -> 1 stays; a row of
    // -inf keeps its first.
    let got = bits(kernels::temperature(&upload(&rows, &device), None, &t, 1e-5).expect("kernel"));
    let mut want = scaled.clone();
    want.extend([ninf, 5.0, ninf, ninf, ninf, ninf, ninf]);
    want.extend([ninf; 7]);
    assert_eq!(got, want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());

    // With ids reversed, the lowest id among row 1's maxima is at position 4.
    let got =
        bits(kernels::temperature(&upload(&rows, &device), Some(&ids), &t, 1e-5).expect("kernel"));
    let mut want = scaled;
    want.extend([ninf, ninf, ninf, ninf, 5.0, ninf, ninf]);
    want.extend([ninf; 7]);
    assert_eq!(got, want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
}

/// The CPU's top_p rule on a full row in f64 (positions are ids,
/// `min_keep = 1`): keep iff the weight before it in canonical order is
/// `< p·S`, and always the first maximum; `None` when `p·S` lies within
/// `1e-5` (relative) of a kept candidate's edge.
fn reference_top_p_full(l: &[f32], p: f64) -> Option<Vec<bool>> {
    let order = reference_top_k(l, l.len());
    let m = l[order[0]];
    let m = if m == f32::NEG_INFINITY {
        0.0
    } else {
        m as f64
    };
    let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let target = p * s;
    let mut keep = vec![false; l.len()];
    let mut before = 0.0;
    for (rank, &i) in order.iter().enumerate() {
        if target.is_finite() && target > 0.0 && (before - target).abs() <= 1e-5 * s {
            return None;
        }
        keep[i] = before < target || rank == 0;
        before += e[i];
    }
    Some(keep)
}

/// The token of `top_p(p) -> temperature(t) -> dist(u)` on a full row
/// (f64 sums) when it does not depend on rounding: the draw is made with
/// the nucleus cut moved by `±1e-5` of the row's mass and the draw's
/// threshold moved by `±1e-5` of the nucleus's, and all four must agree.
/// (On rows of tens of thousands of small weights some running sum always
/// lies within `1e-5` of the target, so asking that none does, as
/// [`reference_top_p_full`] and [`reference_dist`] do, would call nearly
/// every draw an edge; what matters is whether the token can change.)
fn robust_top_p_draw(l: &[f32], p: f64, t: f32, u: f64) -> Option<i64> {
    let order = reference_top_k(l, l.len());
    let m = f64::from(l[order[0]]);
    if !m.is_finite() {
        return None;
    }
    let e: Vec<f64> = l.iter().map(|&x| (f64::from(x) - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let mut tokens = Vec::new();
    for cut in [p * s - 1e-5 * s, p * s + 1e-5 * s] {
        let mut keep = vec![false; l.len()];
        let mut before = 0.0;
        for (rank, &i) in order.iter().enumerate() {
            keep[i] = before < cut || rank == 0;
            before += e[i];
        }
        let ms = f64::from(scaled(l[order[0]], t));
        let w: Vec<f64> = l
            .iter()
            .zip(&keep)
            .map(|(&x, &k)| {
                if k {
                    (f64::from(scaled(x, t)) - ms).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        for at in [u * total - 1e-5 * total, u * total + 1e-5 * total] {
            let mut cum = 0.0;
            let last = w.iter().rposition(|&x| x > 0.0)?;
            let token = w
                .iter()
                .position(|&x| {
                    cum += x;
                    x > 0.0 && cum >= at
                })
                .unwrap_or(last);
            tokens.push(token as i64);
        }
    }
    tokens.windows(2).all(|w| w[0] == w[1]).then(|| tokens[0])
}

/// Full-row top_p and dist: Zipf-like rows with ties and `-inf`, p from 0
/// to 1 and `+inf` (a no-op row), against the references above.
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_full_row_top_p_and_dist_kernels_match_the_reference() {
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (mut checked, mut edges) = (0, 0);
    for &n in &[1025usize, 5000, 32_000] {
        let mut rows: Vec<Vec<f32>> = (0..6).map(|kind| row(kind % 4, n, &mut rng)).collect();
        rows[5] = vec![f32::NEG_INFINITY; n];
        rows[4][n / 3] = 40.0; // one token dominates
        let ps = [0.9f32, 0.5, 0.0, 1.0, 0.99, 0.7];
        let p_col = |ps: &[f32]| {
            let v: Vec<f32> = ps
                .iter()
                .map(|&p| if p >= 1.0 { f32::INFINITY } else { p })
                .collect();
            Tensor::<2>::from_data(TensorData::new(v, [ps.len(), 1]), &device)
        };
        let t = upload(&rows, &device);
        let (kept, bad) = kernels::top_p_full(&t, &p_col(&ps)).expect("kernel");
        let got: Vec<f32> = kept.into_data().iter::<f32>().collect();
        let bad: Vec<i64> = bad.into_data().convert::<i64>().iter::<i64>().collect();
        assert_eq!(bad, vec![2 * n as i64; rows.len()], "valid rows, n = {n}");
        let us: Vec<f32> = (0..rows.len())
            .map(|_| rng.random_range(0.0f32..1.0))
            .collect();
        let u = Tensor::<2>::from_data(TensorData::new(us.clone(), [rows.len(), 1]), &device);
        let toks: Vec<i64> = kernels::cut_dist_full(
            &t,
            kernels::FullCut::All,
            None,
            &u,
            1e-5,
            kernels::TokenCodes::Tokens,
        )
        .expect("kernel")
        .0
        .into_data()
        .convert::<i64>()
        .iter::<i64>()
        .collect();
        let positions: Vec<i32> = (0..n as i32).collect();
        for (r, l) in rows.iter().enumerate() {
            let p = if ps[r] >= 1.0 {
                f64::INFINITY
            } else {
                ps[r] as f64
            };
            match reference_top_p_full(l, p) {
                Some(want) => {
                    for (i, &w) in want.iter().enumerate() {
                        let expect = if w { l[i] } else { f32::NEG_INFINITY };
                        assert_eq!(
                            got[r * n + i].to_bits(),
                            expect.to_bits(),
                            "top_p n = {n} row {r} (p = {p}) position {i}"
                        );
                    }
                    checked += 1;
                }
                None => edges += 1,
            }
            match reference_dist(l, &positions, us[r] as f64) {
                Some(want) => {
                    assert_eq!(toks[r], want, "dist n = {n} row {r}");
                    checked += 1;
                }
                None => edges += 1,
            }
        }
    }
    // Rows of many near-equal weights often put a cumulative weight within
    // 1e-5 of p·S (f32 sums in another order): those are not compared.
    assert!(
        checked >= 28 && edges <= 8,
        "{checked} checked, {edges} at an edge"
    );
}

/// A full vocabulary row at the sizes of real models, many rows at once.
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_top_k_kernel_on_large_vocabularies() {
    use sampler_backend::burn_tensor::Int;
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let n = 151_936;
    let rows: Vec<Vec<f32>> = (0..4).map(|kind| row(kind, n, &mut rng)).collect();
    let t = upload(&rows, &device);
    let k = 40;
    let k_row = Tensor::<2, Int>::from_data(TensorData::new(vec![40i32; 4], [4, 1]), &device);
    let pos = kernels::top_k(&t, k, &k_row, n, None)
        .expect("kernel")
        .positions;
    let pos: Vec<i64> = pos.into_data().convert::<i64>().iter::<i64>().collect();
    for (r, rrow) in rows.iter().enumerate() {
        let want: Vec<i64> = reference_top_k(rrow, k)
            .into_iter()
            .map(|p| p as i64)
            .collect();
        assert_eq!(&pos[r * k..(r + 1) * k], &want[..], "row kind {r}");
    }
}

/// Rows shaped like a real model's (the Zipf rows above never go deep and
/// have few ties): `kind` 0, logits of bf16 origin (exact ties throughout);
/// 1, a deep tail (a third of the vocabulary 16-30 nats below the maximum,
/// the rest within 14 nats); 2, ids ordered by frequency band with the
/// likely tokens at the highest ids (a prefix of the row holds only
/// unlikely tokens: byte and special tokens come first in a vocabulary);
/// 3, the same bands the other way round.
fn model_row(kind: usize, n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let bands = 16usize;
    (0..n)
        .map(|i| match kind {
            0 => {
                // A normal-ish bulk and a few strong tokens, rounded to bf16.
                let bulk: f32 = (0..4).map(|_| rng.random_range(-2.0f32..2.0)).sum();
                let x = if rng.random_range(0..500) == 0 {
                    bulk + 12.0
                } else {
                    bulk
                };
                f32::from_bits(x.to_bits() & 0xFFFF_0000)
            }
            1 => {
                if i % 3 == 1 {
                    -rng.random_range(16.0f32..30.0)
                } else {
                    -rng.random_range(0.0f32..14.0)
                }
            }
            2 | 3 => {
                let band = i * bands / n;
                let band = if kind == 2 { band } else { bands - 1 - band };
                band as f32 - bands as f32 + rng.random_range(0.0f32..1.0)
            }
            _ => unreachable!(),
        })
        .collect()
}

/// The kernels on rows shaped like a real model's ([`model_row`]): the
/// top-k kernel keeps the canonical top `k` after one read (the sample its
/// floor comes from spreads over the row, so no more than
/// `kernels::TOP_K_MAX` logits lie above the floor on any of them: no
/// radix fallback), greedy finds the first maximum, and the fused full-row
/// `top_p -> temperature -> dist` kernel draws the reference's tokens.
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_kernels_on_real_model_row_shapes() {
    use sampler_backend::burn_tensor::Int;
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let n = 49_152;
    let rows: Vec<Vec<f32>> = (0..4).map(|kind| model_row(kind, n, &mut rng)).collect();
    let b = rows.len();
    // The shapes are what they claim to be.
    let ties = {
        let mut v = rows[0].clone();
        v.sort_by(|a, b| b.total_cmp(a));
        v.windows(2).filter(|w| w[0] == w[1]).count()
    };
    assert!(ties > n / 2, "bf16 row: {ties} exact ties");
    let deep = rows[1].iter().filter(|&&x| x <= -16.0).count();
    assert!(deep >= n / 3 - 1, "deep tail: {deep}");
    let t = upload(&rows, &device);

    // (At `k` near the workgroup size the floor is the least of the
    // threads' maxima, and any row may send more than the cap above it.)
    for k in [1usize, 50, 100] {
        let k_row =
            Tensor::<2, Int>::from_data(TensorData::new(vec![k as i32; b], [b, 1]), &device);
        let out = kernels::top_k(&t, k, &k_row, n, None).expect("kernel");
        let pos: Vec<i64> = out
            .positions
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .collect();
        let above: Vec<i64> = out
            .above_floor
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .collect();
        for (r, row) in rows.iter().enumerate() {
            let want: Vec<i64> = reference_top_k(row, k)
                .into_iter()
                .map(|p| p as i64)
                .collect();
            assert_eq!(&pos[r * k..(r + 1) * k], &want[..], "k {k} row kind {r}");
            assert!(
                above[r] >= k as i64 && above[r] <= kernels::TOP_K_MAX as i64,
                "k {k} row kind {r}: {} logits above the floor (radix fallback)",
                above[r]
            );
        }
    }

    let (greedy, _) = kernels::argmax(&t, kernels::TokenCodes::Tokens).expect("kernel");
    let greedy: Vec<i64> = greedy.into_data().convert::<i64>().iter::<i64>().collect();
    let want: Vec<i64> = rows.iter().map(|r| reference_argmax(r)).collect();
    assert_eq!(greedy, want);

    let col = |v: Vec<f32>| {
        let b = v.len();
        Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device)
    };
    let (mut checked, mut edges) = (0, 0);
    for (p, tr) in [(0.9f32, 0.7f32), (0.99, 1.0), (0.5, 1.3)] {
        let us: Vec<f32> = (0..b).map(|_| rng.random_range(0.0f32..1.0)).collect();
        let (toks, bad) = kernels::top_p_dist_full(
            &t,
            &col(vec![p; b]),
            Some(&col(vec![tr; b])),
            &col(us.clone()),
            sampler_core::GREEDY_TEMPERATURE,
            kernels::TokenCodes::OwnKeys,
        )
        .expect("kernel");
        let toks: Vec<i64> = toks.into_data().convert::<i64>().iter::<i64>().collect();
        let bad: Vec<i64> = bad.into_data().convert::<i64>().iter::<i64>().collect();
        assert_eq!(bad, vec![2 * n as i64; b], "valid rows");
        for (r, l) in rows.iter().enumerate() {
            match robust_top_p_draw(l, f64::from(p), tr, f64::from(us[r])) {
                Some(want) => {
                    assert_eq!(
                        toks[r], want,
                        "row kind {r} (p = {p}, t = {tr}, u = {})",
                        us[r]
                    );
                    checked += 1;
                }
                None => edges += 1,
            }
        }
    }
    println!("model-shaped rows: {checked} draws checked, {edges} at an edge");
    assert!(
        checked >= 10 && edges <= 2,
        "{checked} checked, {edges} at an edge"
    );
}

/// The full-row cuts with each row's first reads split over several
/// workgroups (`argmax_part_rows`, and for `top_p` the segments' mass
/// histograms summed in global memory) draw exactly the tokens and codes
/// of one workgroup a row, on Zipf and model-shaped rows, invalid and dead
/// rows among them (segments of whole 16-byte vectors; the scalar form
/// runs the same code at `N = 1` and is compiled by the PTX check); the
/// unsplit kernel is checked against the references above. The unfused
/// full-row `top_p` (`kernels::top_p_full_split`) writes the same rows for
/// any split, and they keep what the CPU rule keeps.
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_full_row_cuts_split_over_workgroups_draw_the_same_tokens() {
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let col = |v: Vec<f32>| {
        let b = v.len();
        Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device)
    };
    let read = |t: Tensor<1, sampler_backend::burn_tensor::Int>| -> Vec<i64> {
        t.into_data().convert::<i64>().iter::<i64>().collect()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let (mut compared, mut checked_masks) = (0, 0);
    for &n in &[4100usize, 32_000] {
        let mut rows: Vec<Vec<f32>> = (0..4).map(|kind| model_row(kind, n, &mut rng)).collect();
        rows.extend((0..2).map(|kind| row(kind, n, &mut rng)));
        let mut nan = row(0, n, &mut rng);
        nan[n - 3] = f32::NAN;
        let mut inf = row(1, n, &mut rng);
        inf[n / 2] = f32::INFINITY;
        // The crossing bin one run of ties at `-1` spread over the row
        // (every segment holds some), which `p` keeps only in part: 500
        // (gathered), and 1500 (more than `NUC_GATHER`: resolved over the
        // row); the maximum last, the rest too deep to weigh.
        for ties in [500usize, 1500] {
            let mut r = vec![-40.0f32; n];
            for k in 0..ties {
                r[k * (n - 1) / ties] = -1.0;
            }
            r[n - 1] = 0.0;
            rows.push(r);
        }
        rows.extend([nan, inf, vec![f32::NEG_INFINITY; n]]);
        let b = rows.len();
        let t = upload(&rows, &device);
        let mut ps: Vec<f32> = (0..b)
            .map(|r| [0.9f32, 0.5, 0.99, 0.0, f32::INFINITY][r % 5])
            .collect();
        // Half the ties' mass: some kept, the rest not.
        ps[6] = 0.5;
        ps[7] = 0.5;
        let log_p: Vec<f32> = (0..b).map(|r| [0.05f32, 0.2, 1e-4][r % 3].ln()).collect();
        let mut temps: Vec<f32> = (0..b).map(|r| [0.7f32, 1.0, 1.4, 1e-6][r % 4]).collect();
        temps[7] = 1.0;
        let mut us: Vec<f32> = (0..b).map(|_| rng.random_range(0.0f32..1.0)).collect();
        // u = 0: the target is the sum before the drawn chunk itself.
        us[0] = 0.0;
        let (p, lp, tc, u) = (col(ps.clone()), col(log_p), col(temps), col(us));
        let cuts = [
            ("top_p", kernels::FullCut::TopP(&p)),
            ("min_p", kernels::FullCut::MinP(&lp)),
            ("all", kernels::FullCut::All),
        ];
        // With a temperature (a greedy one on some rows): the variant a
        // chain with temperature compiles (the kernels cubecl builds for
        // lavapipe are what this test pays for).
        for (name, cut) in cuts {
            {
                let temp = Some(&tc);
                let run = |split| {
                    let (toks, keys) = kernels::cut_dist_full_split(
                        &t,
                        cut,
                        temp,
                        &u,
                        sampler_core::GREEDY_TEMPERATURE,
                        kernels::TokenCodes::OwnKeys,
                        Some(split),
                    )
                    .expect("kernel");
                    let keys: Vec<i64> = keys.into_data().convert::<i64>().iter::<i64>().collect();
                    (read(toks), keys)
                };
                let (whole, keys) = run(1);
                assert_eq!(
                    keys[b - 3],
                    2 * (n as i64 - 3),
                    "{name} n = {n}: NaN row's key"
                );
                assert!(
                    whole[b - 1] < 0,
                    "{name} n = {n}: dead row drew {}",
                    whole[b - 1]
                );
                assert!(whole[0] >= 0, "{name} n = {n}: u = 0 drew {}", whole[0]);
                for split in [2, 3, 7, kernels::SEGMENTS_MAX] {
                    let (got, got_keys) = run(split);
                    assert_eq!(
                        got, whole,
                        "{name} n = {n}: tokens split over {split} workgroups"
                    );
                    assert_eq!(
                        got_keys, keys,
                        "{name} n = {n}: validation keys, split {split}"
                    );
                    compared += b;
                }
            }
        }
        // The unfused full-row top_p (the fused kernel cut only, then the
        // row written): the same rows and keys for any split, and the CPU
        // rule's kept set up to `1e-5` of the row's mass either side of
        // the cut, on every row but the NaN and `+inf` ones.
        let masked = |split| {
            let (out, keys) = kernels::top_p_full_split(&t, &p, Some(split)).expect("kernel");
            let bits: Vec<u32> = out.into_data().iter::<f32>().map(f32::to_bits).collect();
            let keys: Vec<i64> = keys.into_data().convert::<i64>().iter::<i64>().collect();
            (bits, keys)
        };
        let (whole, keys) = masked(1);
        assert_eq!(
            keys[b - 3],
            2 * (n as i64 - 3),
            "top_p_full n = {n}: NaN row"
        );
        for split in [3, kernels::SEGMENTS_MAX] {
            let got = masked(split);
            assert!(
                got.0 == whole && got.1 == keys,
                "top_p_full n = {n}: split over {split} workgroups"
            );
            compared += b;
        }
        for (r, l) in rows
            .iter()
            .enumerate()
            .filter(|(r, _)| *r + 3 != b && *r + 2 != b)
        {
            let (sure, maybe) = robust_top_p_kept(l, f64::from(ps[r]));
            let mut unsure = 0;
            for i in 0..n {
                let got = whole[r * n + i];
                if sure[i] {
                    assert_eq!(got, l[i].to_bits(), "top_p_full n = {n} row {r}: {i} kept");
                } else if !maybe[i] {
                    let dropped = f32::NEG_INFINITY.to_bits();
                    assert_eq!(got, dropped, "top_p_full n = {n} row {r}: {i} dropped");
                } else {
                    unsure += 1;
                }
            }
            assert!(
                unsure <= n / 100,
                "top_p_full n = {n} row {r}: {unsure} unsure"
            );
            checked_masks += 1;
        }
    }
    assert_eq!(compared, 2 * 3 * 4 * 11 + 2 * 2 * 11);
    assert_eq!(checked_masks, 2 * 9);
}

/// The positions the CPU's full-row `top_p(p)` keeps (positions are ids,
/// `min_keep = 1`) whichever way the sums round, and those it may keep:
/// its rule in f64 with the cut `p·S` moved down and up by `1e-5·S`.
fn robust_top_p_kept(l: &[f32], p: f64) -> (Vec<bool>, Vec<bool>) {
    let order = reference_top_k(l, l.len());
    let m = f64::from(l[order[0]]);
    let m = if m == f64::NEG_INFINITY { 0.0 } else { m };
    let e: Vec<f64> = l.iter().map(|&x| (f64::from(x) - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let kept = |cut: f64| {
        let mut keep = vec![false; l.len()];
        let mut before = 0.0;
        for (rank, &i) in order.iter().enumerate() {
            keep[i] = before < cut || rank == 0;
            before += e[i];
        }
        keep
    };
    (kept(p * s - 1e-5 * s), kept(p * s + 1e-5 * s))
}

/// Builds without a cubecl backend have no kernels module: the stages run
/// the generic recipe (covered by every other device test).
#[cfg(not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")))]
#[test]
fn reference_helpers_agree_on_a_small_row() {
    let r = [1.0, 3.0, -0.0, 3.0, 0.0, f32::NEG_INFINITY];
    assert_eq!(reference_top_k(&r, 4), vec![1, 3, 0, 2]);
    assert_eq!(reference_argmax(&r), 1);
    assert_eq!(reference_argmax(&[f32::NEG_INFINITY; 3]), -1);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    assert_eq!(row(5, 4, &mut rng), vec![0.0, -1.0, -2.0, -3.0]);
}

/// The CPU `penalties` rule for a token seen `c >= 1` times (sampler-cpu's
/// `Penalties::penalised`): `-inf` stays, `l <= 0` is multiplied by
/// `repeat`, else divided, then `c·frequency + presence` subtracted, a
/// finite logit saturated at `±f32::MAX`.
fn reference_penalised(orig: f32, c: u32, repeat: f32, frequency: f32, presence: f32) -> f32 {
    if orig == f32::NEG_INFINITY {
        return orig;
    }
    let l = if orig <= 0.0 {
        orig * repeat
    } else {
        orig / repeat
    };
    let l = l - (c as f32 * frequency + presence);
    if l.is_infinite() && orig.is_finite() {
        if l > 0.0 { f32::MAX } else { -f32::MAX }
    } else {
        l
    }
}

/// The top-k kernel with history penalties equals the canonical top k of
/// the row penalised on the host: history tokens pushed out of the top k
/// and pulled into it (a repeat below 1, a negative presence), ties with
/// unpenalised tokens, `-inf` and `±f32::MAX` history logits, padding
/// entries (count 0), rows without history, per-row k.
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn top_k_kernel_applies_history_penalties_in_its_selection() {
    use sampler_backend::HistoryPenalties;
    use sampler_backend::burn_tensor::Int;
    use sampler_backend::kernels;
    let Some((device, dev)) = device_support::cubecl_device() else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    // (repeat, frequency, presence) per row: push down, pull up, mixed.
    let params = [
        (1.3f32, 0.0f32, 0.0f32),
        (0.5, 0.0, -3.0),
        (1.1, 0.4, 0.6),
        (2.0, -0.2, 0.0),
        (1.0, 0.0, 0.0),
        (0.8, 1.0, -1.0),
    ];
    for &n in &[300usize, 4099, 32_000] {
        let rows: Vec<Vec<f32>> = (0..6).map(|kind| row(kind, n, &mut rng)).collect();
        let b = rows.len();
        let h = 24;
        let (mut ids, mut counts) = (vec![0i32; b * h], vec![0f32; b * h]);
        for (r, rrow) in rows.iter().enumerate() {
            // The row's own top tokens (so penalties move the boundary),
            // then random ones; the last row has no history at all.
            let mut hist: Vec<usize> = reference_top_k(rrow, 8);
            while hist.len() < 18 {
                let t = rng.random_range(0..n);
                if !hist.contains(&t) {
                    hist.push(t);
                }
            }
            if r == 5 {
                hist.clear();
            }
            let free = (0..n).find(|t| !hist.contains(t)).unwrap();
            for j in 0..h {
                let (id, c) = match hist.get(j) {
                    Some(&t) => (t, rng.random_range(1..4)),
                    None => (free, 0),
                };
                ids[r * h + j] = id as i32;
                counts[r * h + j] = c as f32;
            }
        }
        let col = |f: fn(&(f32, f32, f32)) -> f32| {
            let v: Vec<f32> = params.iter().map(f).collect();
            Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device)
        };
        let pen = HistoryPenalties {
            ids: Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [b, h]), &device),
            counts: Tensor::<2>::from_data(TensorData::new(counts.clone(), [b, h]), &device),
            repeat: col(|p| p.0),
            frequency: col(|p| p.1),
            presence: col(|p| p.2),
        };
        let t = upload(&rows, &device);
        // One workgroup a row, and the floor and the compaction split over
        // three workgroups a row.
        for (k, split) in [(1usize, 1), (40, 1), (40, 3)] {
            let k = k.min(n);
            let own: Vec<i32> = (0..b).map(|r| (k as i32 - r as i32).max(1)).collect();
            let k_row = Tensor::<2, Int>::from_data(TensorData::new(own.clone(), [b, 1]), &device);
            let got =
                kernels::top_k_split(&t, k, &k_row, n, Some(&pen), Some(split)).expect("kernel");
            let vals: Vec<f32> = got.logits.into_data().iter::<f32>().collect();
            let pos: Vec<i64> = got
                .positions
                .into_data()
                .convert::<i64>()
                .iter::<i64>()
                .collect();
            let bad: Vec<i64> = got
                .first_bad
                .into_data()
                .convert::<i64>()
                .iter::<i64>()
                .collect();
            assert_eq!(bad, vec![2 * n as i64; b], "[{dev}] valid rows, n = {n}");
            for (r, rrow) in rows.iter().enumerate() {
                let (rp, fr, pr) = params[r];
                let mut penalised = rrow.clone();
                for j in 0..h {
                    let c = counts[r * h + j] as u32;
                    if c > 0 {
                        let id = ids[r * h + j] as usize;
                        penalised[id] = reference_penalised(rrow[id], c, rp, fr, pr);
                    }
                }
                let want = reference_top_k(&penalised, k);
                let got_pos: Vec<usize> = pos[r * k..(r + 1) * k]
                    .iter()
                    .map(|&p| p as usize)
                    .collect();
                let at = format!("[{dev}] n = {n}, k = {k}, row kind {r}, split {split}");
                assert_eq!(got_pos, want, "penalised top_k positions, {at}");
                for (j, &p) in want.iter().enumerate().take(own[r] as usize) {
                    assert_eq!(
                        vals[r * k + j].to_bits(),
                        penalised[p].to_bits(),
                        "penalised value, {at}, slot {j}"
                    );
                }
            }
        }
    }
    // Too long a history for the kernel's shared memory: the caller's recipe.
    let t = upload(&[vec![0.5f32; 600]], &device);
    let h = kernels::HISTORY_MAX + 1;
    let one = |v: f32| Tensor::<2>::from_data(TensorData::new(vec![v], [1, 1]), &device);
    let long = HistoryPenalties {
        ids: Tensor::<2, Int>::from_data(
            TensorData::new((0..h as i32).collect::<Vec<_>>(), [1, h]),
            &device,
        ),
        counts: Tensor::<2>::from_data(TensorData::new(vec![1.0f32; h], [1, h]), &device),
        repeat: one(1.1),
        frequency: one(0.0),
        presence: one(0.0),
    };
    let k_row = Tensor::<2, Int>::ones([1, 1], &device);
    assert!(kernels::top_k(&t, 5, &k_row, 600, Some(&long)).is_none());
}

/// `l / t` saturated at `±f32::MAX`, `-inf` kept (the temperature kernel's
/// rule, in f32 as the kernels compute it).
fn scaled(l: f32, t: f32) -> f32 {
    if l == f32::NEG_INFINITY {
        l
    } else {
        (l / t).clamp(-f32::MAX, f32::MAX)
    }
}

/// The fused full-row `top_p -> [temperature] -> dist` kernel
/// (`kernels::top_p_dist_full`: a fixed-point histogram, the crossing bin
/// resolved in shared memory or, when it holds more than
/// `kernels::NUC_GATHER` logits, over the row) against the f64 references
/// of the three stages: Zipf-like rows with `-inf`, rows of four values
/// and rows whose logits all lie within 1.2e-4 (a crossing bin far larger
/// than the gather: the over-the-row path), runs of ties at `f32::MAX`,
/// a row that is all `-inf`, one dominant token, descending rows; `p` from
/// 0 to 0.99 and `+inf` (a no-op row); no temperature, `t` from 0.5 to 2
/// and a greedy temperature. Tokens within `1e-5` of a boundary are not
/// compared (the sums differ in rounding).
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_fused_full_row_top_p_dist_kernel_matches_the_reference() {
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let col = |v: Vec<f32>| {
        let b = v.len();
        Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut checked, mut edges, mut overflowing) = (0, 0, 0);
    for &n in &[1025usize, 5000, 32_000] {
        let mut rows: Vec<Vec<f32>> = (0..7).map(|kind| row(kind % 6, n, &mut rng)).collect();
        rows[4][n / 3] = 40.0; // one token dominates (the rest -inf or 3.0)
        rows[6] = vec![f32::NEG_INFINITY; n];
        for (r, l) in rows.iter().enumerate() {
            // Rows whose logits mostly share a 1/64-nat bin of the maximum.
            let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let top = l.iter().filter(|&&x| m - x < 1.0 / 64.0).count();
            if top > kernels::NUC_GATHER as usize && r != 6 {
                overflowing += 1;
            }
        }
        let ps = [0.9f32, 0.5, 0.0, f32::INFINITY, 0.99, 0.7, 0.9];
        for temps in [None, Some([0.7f32, 1.5, 1e-6, 1.0, 0.5, 2.0, 0.7])] {
            let us: Vec<f32> = (0..rows.len())
                .map(|_| rng.random_range(0.0f32..1.0))
                .collect();
            let t = temps.map(|t| col(t.to_vec()));
            let (toks, bad) = kernels::top_p_dist_full(
                &upload(&rows, &device),
                &col(ps.to_vec()),
                t.as_ref(),
                &col(us.clone()),
                sampler_core::GREEDY_TEMPERATURE,
                kernels::TokenCodes::OwnKeys,
            )
            .expect("kernel");
            let toks: Vec<i64> = toks.into_data().convert::<i64>().iter::<i64>().collect();
            let bad: Vec<i64> = bad.into_data().convert::<i64>().iter::<i64>().collect();
            assert_eq!(bad, vec![2 * n as i64; rows.len()], "valid rows, n = {n}");
            let positions: Vec<i32> = (0..n as i32).collect();
            for (r, l) in rows.iter().enumerate() {
                let tr = temps.map_or(1.0, |t| t[r]);
                let p = if ps[r].is_finite() {
                    f64::from(ps[r])
                } else {
                    f64::INFINITY
                };
                let Some(kept) = reference_top_p_full(l, p) else {
                    edges += 1;
                    continue;
                };
                let want = if tr < sampler_core::GREEDY_TEMPERATURE {
                    Some(reference_argmax(l))
                } else {
                    let masked: Vec<f32> = l
                        .iter()
                        .zip(&kept)
                        .map(|(&x, &k)| if k { scaled(x, tr) } else { f32::NEG_INFINITY })
                        .collect();
                    reference_dist(&masked, &positions, f64::from(us[r]))
                };
                match want {
                    Some(want) => {
                        assert_eq!(
                            toks[r], want,
                            "n = {n} row {r} (p = {p}, t = {tr}, u = {})",
                            us[r]
                        );
                        checked += 1;
                    }
                    None => edges += 1,
                }
            }
        }
    }
    println!(
        "fused top_p/dist: {checked} checked, {edges} at an edge, {overflowing} rows over the gather"
    );
    // Both ways of resolving the crossing bin ran.
    assert!(overflowing >= 4, "{overflowing} rows over the gather");
    assert!(
        checked >= 30 && edges <= 12,
        "{checked} checked, {edges} at an edge"
    );

    // Invalid rows: the kernel's own validation writes their status codes
    // (NaN at i: -2i - 2; +inf at i: -2i - 3) and keys; the valid row beside
    // them is sampled as usual.
    let n = 3000;
    let mut rows = vec![
        row(1, n, &mut rng),
        row(5, n, &mut rng),
        row(5, n, &mut rng),
    ];
    rows[0][1200] = f32::NAN;
    rows[0][2000] = f32::INFINITY;
    rows[2][7] = f32::INFINITY;
    let (toks, bad) = kernels::top_p_dist_full(
        &upload(&rows, &device),
        &col(vec![0.9; 3]),
        None,
        &col(vec![0.5; 3]),
        sampler_core::GREEDY_TEMPERATURE,
        kernels::TokenCodes::OwnKeys,
    )
    .expect("kernel");
    let toks: Vec<i64> = toks.into_data().convert::<i64>().iter::<i64>().collect();
    let bad: Vec<i64> = bad.into_data().convert::<i64>().iter::<i64>().collect();
    assert_eq!(bad, vec![2400, 2 * n as i64, 15]);
    // Row 1 descends by a nat a token: the nucleus of 0.9 is tokens 0..=2.
    assert_eq!(toks, vec![-2402, 0, -17]);
}

/// The min_p kernels against the plain rule (`l >= max + ln p`, computed in
/// f32 as the CPU does, plus the first maximum in canonical order): the
/// masking kernel on full rows and on narrow rows with ids (ties among the
/// maxima to the lowest id, not the lowest position), and the fused
/// `min_p -> [temperature] -> dist` kernel against the f64 draw.
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn wgpu_min_p_kernels_match_the_reference() {
    use sampler_backend::burn_tensor::Int;
    use sampler_backend::kernels;
    let Some((device, _)) = device_support::cubecl_device() else {
        return;
    };
    let col = |v: Vec<f32>| {
        let b = v.len();
        Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let (mut checked, mut edges) = (0, 0);
    for &n in &[300usize, 5000, 32_000] {
        let rows: Vec<Vec<f32>> = (0..6).map(|kind| row(kind, n, &mut rng)).collect();
        // p = 0 (no-op: every logit kept, -inf too), 0.05, 0.5, 1 (every
        // maximum), 2 (only the first maximum).
        let ps = [0.05f32, 0.5, 0.0, 1.0, 2.0, 0.05];
        let log_p: Vec<f32> = ps
            .iter()
            .map(|&p| if p > 0.0 { p.ln() } else { f32::NEG_INFINITY })
            .collect();
        // Ids reversed: the canonical first maximum is the last position.
        let ids: Vec<i32> = (0..rows.len()).flat_map(|_| (0..n as i32).rev()).collect();
        let ids_t = Tensor::<2, Int>::from_data(TensorData::new(ids, [rows.len(), n]), &device);
        for with_ids in [false, true] {
            let (kept, bad) = kernels::min_p(
                &upload(&rows, &device),
                with_ids.then_some(&ids_t),
                &col(log_p.clone()),
            )
            .expect("kernel");
            let got: Vec<f32> = kept.into_data().iter::<f32>().collect();
            if !with_ids {
                let bad: Vec<i64> = bad.into_data().convert::<i64>().iter::<i64>().collect();
                assert_eq!(bad, vec![2 * n as i64; rows.len()]);
            }
            for (r, l) in rows.iter().enumerate() {
                let mut order: Vec<usize> = (0..n).collect();
                let id = |i: usize| if with_ids { n - 1 - i } else { i };
                order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(id(a).cmp(&id(b))));
                let first = order[0];
                let m = if l[first] == f32::NEG_INFINITY {
                    0.0
                } else {
                    l[first]
                };
                let thr = m + log_p[r];
                for (i, &x) in l.iter().enumerate() {
                    let want = if x >= thr || i == first {
                        x
                    } else {
                        f32::NEG_INFINITY
                    };
                    assert_eq!(
                        got[r * n + i].to_bits(),
                        want.to_bits(),
                        "n = {n} row {r} (p = {}, ids: {with_ids}) position {i}",
                        ps[r]
                    );
                }
            }
        }
        let temps = [0.8f32, 1.0, 1.5, 1e-6, 0.5, 2.0];
        let us: Vec<f32> = (0..rows.len())
            .map(|_| rng.random_range(0.0f32..1.0))
            .collect();
        let (toks, _) = kernels::cut_dist_full(
            &upload(&rows, &device),
            kernels::FullCut::MinP(&col(log_p.clone())),
            Some(&col(temps.to_vec())),
            &col(us.clone()),
            sampler_core::GREEDY_TEMPERATURE,
            kernels::TokenCodes::Tokens,
        )
        .expect("kernel");
        let toks: Vec<i64> = toks.into_data().convert::<i64>().iter::<i64>().collect();
        let positions: Vec<i32> = (0..n as i32).collect();
        for (r, l) in rows.iter().enumerate() {
            let first = reference_top_k(l, 1)[0];
            let m = if l[first] == f32::NEG_INFINITY {
                0.0
            } else {
                l[first]
            };
            let thr = m + log_p[r];
            let want = if temps[r] < sampler_core::GREEDY_TEMPERATURE {
                Some(reference_argmax(l))
            } else {
                let masked: Vec<f32> = l
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        if x >= thr || i == first {
                            scaled(x, temps[r])
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                    .collect();
                reference_dist(&masked, &positions, f64::from(us[r]))
            };
            match want {
                Some(want) => {
                    assert_eq!(
                        toks[r], want,
                        "fused n = {n} row {r} (p = {}, t = {})",
                        ps[r], temps[r]
                    );
                    checked += 1;
                }
                None => edges += 1,
            }
        }
    }
    println!("fused min_p/dist: {checked} checked, {edges} at an edge");
    assert!(
        checked >= 15 && edges <= 3,
        "{checked} checked, {edges} at an edge"
    );
}
