//! Kernels and bytes read per step of the fully offloaded chains, counted
//! through cubecl's launch observer and the custom kernels' declared reads
//! (`sampler_backend::launches`): a warm step of each chain at B = 1 and
//! B = 4 launches kernels (one batched pass, never a kernel per row), a
//! repeated step launches as many, and every step stays within the issue's
//! budgets (docs/architecture.md, "Kernels per step"):
//!
//! | chain | kernels | reads of the `[B, V]` logits |
//! |---|---|---|
//! | greedy (rows split over workgroups and merged at these batches) | 2 | 1 |
//! | `top_k(50); temperature; top_p(0.9); dist` | 4 (at B = 1 split over workgroups: 6, the floor and the compaction by segments first) | 1 (1.25 with the top-k floor's sample, counted; split, the row's candidate slots too: 8 KiB a row) |
//! | `top_p(0.9); temperature; dist` (full vocabulary) | 6 | 3 (one fused kernel: 3 reads and the drawn chunk, about `1 / 256` of a read; at B = 1 split over workgroups, 3 kernels) |
//! | `penalties; top_k(40); temperature; dist` | 5 (3, at B = 1 split as the top-k chain's: 5) | no `[B, V]` copy: 1.25 as the top-k chain |
//! | `min_p(0.05); temperature; dist` (no budget in the issue) | 3 | 2 (one fused kernel; at B = 1 its two passes split over workgroups first, and the drawn segment read again: `1 / S` of a read more) |
//! | `temperature(0.8); dist` (no budget in the issue) | 3 | 2 (as `min_p`) |
//! | `kernels::top_p_full` alone (a full-row `top_p` followed by a stage other than `dist`; no budget in the issue) | 2 (5 split at B = 1) | 4 (and the row written; split, 4.2 with the row's histogram words and gathered logits) |
//!
//! Every launch of these chains is one of the custom kernels, so every
//! byte is declared (`undeclared() == 0`). Run on wgpu (CI: lavapipe); the
//! observer is process-wide, so this file holds one device test. flex runs
//! burn's ops without cubecl kernels: a build without a cubecl backend
//! reports no count.
// The helpers serve the wgpu test only.
#![cfg_attr(
    not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")),
    allow(dead_code)
)]

mod device_support;

use sampler_backend::burn_tensor::Device;
use sampler_backend::launches::{KernelCount, count_launches};
use sampler_backend::{Executor, StepOutput, Tensor, TensorData};
use sampler_core::{ChainSpec, HistoryScope, OffloadPolicy, StageSpec};

use device_support::upload;

const V: usize = 32_000;

fn temp(t: f32) -> StageSpec {
    StageSpec::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

/// The four chains with their kernel budgets and read ceilings
/// (in reads of the `[B, V]` logits).
fn chains() -> Vec<(&'static str, Vec<StageSpec>, usize, f64)> {
    vec![
        ("greedy", vec![StageSpec::Greedy], 2, 1.01),
        (
            "top_k(50); temperature; top_p(0.9); dist",
            vec![
                StageSpec::TopK { k: 50 },
                temp(0.8),
                StageSpec::TopP {
                    p: 0.9,
                    min_keep: 0,
                },
                StageSpec::Dist,
            ],
            6,
            1.35,
        ),
        (
            "top_p(0.9); temperature; dist",
            vec![
                StageSpec::TopP {
                    p: 0.9,
                    min_keep: 0,
                },
                temp(0.7),
                StageSpec::Dist,
            ],
            6,
            READ_CEILING_FULL_TOP_P,
        ),
        (
            "min_p(0.05); temperature; dist",
            vec![
                StageSpec::MinP {
                    p: 0.05,
                    min_keep: 0,
                },
                temp(0.8),
                StageSpec::Dist,
            ],
            3,
            READ_CEILING_FULL_DRAW,
        ),
        (
            "temperature(0.8); dist",
            vec![temp(0.8), StageSpec::Dist],
            3,
            READ_CEILING_FULL_DRAW,
        ),
        (
            "penalties; top_k(40); temperature; dist",
            vec![
                StageSpec::Penalties {
                    last_n: 64,
                    repeat: 1.1,
                    frequency: 0.0,
                    presence: 0.0,
                    scope: HistoryScope::PromptAndOutput,
                },
                StageSpec::TopK { k: 40 },
                temp(0.8),
                StageSpec::Dist,
            ],
            5,
            1.35,
        ),
    ]
}

/// The full-vocabulary chain's reads: the fused kernel's max, histogram and
/// chunk passes, and the drawn chunk read once and a part of it walked
/// (`1 / units` of a row and a little more; at least 1/32 on a device with
/// 64 threads a workgroup). Split over `S` workgroups a row (B = 1): the
/// three passes by segments, then the drawn segment (`1 / S` of a row: 0.5
/// on a 2-thread lavapipe, about 0.014 on an H200's 74 segments at V =
/// 151936), and the row's histogram and gathered crossing logits, written
/// by the segments and read by the last kernel (25 KiB a row, counted
/// whole: 0.2 of a read at this test's V = 32000, 0.04 at V = 151936).
const READ_CEILING_FULL_TOP_P: f64 = 3.8;

/// The full-row `min_p` and no-cut draws: the maximum and the kept weights
/// (2 reads), and the drawn chunk: unsplit a thread's chunk (`1 / units`
/// of a row), split over `S` workgroups a row (B = 1) the drawn segment
/// (`1 / S` of a row: 0.5 on a 2-thread lavapipe, about 0.014 on an H200's
/// 74 segments at V = 151936).
const READ_CEILING_FULL_DRAW: f64 = 2.55;

fn rows(b: usize) -> Vec<f32> {
    (0..b * V)
        .map(|i| {
            let (r, t) = (i / V, i % V);
            -((((t * 7919 + r * 13) % V) + 1) as f32).ln()
        })
        .collect()
}

/// Kernels of the third step (the first compiles and autotunes, the second
/// is warm) and of the fourth, and the third's count; the steps' tokens
/// must all be valid.
fn warm_counts(
    stages: &[StageSpec],
    b: usize,
    device: &Device,
) -> (usize, usize, Option<KernelCount>) {
    let specs: Vec<ChainSpec> = (0..b)
        .map(|r| ChainSpec::new(stages.to_vec(), Some(r as u64)))
        .collect();
    let mut ex = Executor::new(specs, V, device, OffloadPolicy::Device).expect("executor");
    let logits = rows(b);
    let check = |out: &StepOutput| {
        assert_eq!(out.tokens.len(), b);
        assert!(out.tokens.iter().all(|t| t.is_ok()), "{:?}", out.tokens);
    };
    for _ in 0..2 {
        check(&ex.step(upload(&logits, b, V, device)).expect("step"));
    }
    let mut counts = [0; 2];
    let mut first = None;
    for c in &mut counts {
        let t = upload(&logits, b, V, device);
        // Work still queued from earlier steps runs before the count.
        device.sync().expect("sync");
        let (out, kernels) = count_launches(|| ex.step(t));
        check(&out.expect("step"));
        *c = kernels.as_ref().map_or(0, |k| k.total());
        if first.is_none() {
            if let Some(k) = &kernels {
                println!("  {:?}", k.by_name());
            }
            first = Some(kernels);
        }
    }
    (counts[0], counts[1], first.flatten())
}

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
#[test]
fn kernels_and_reads_per_step_are_fixed_and_within_budgets() {
    let Some((device, dev)) = device_support::cubecl_device() else {
        return;
    };
    for (chain, stages, budget, read_ceiling) in chains() {
        for b in [1, 4] {
            let (n, again, count) = warm_counts(&stages, b, &device);
            let count = count.expect("a cubecl build counts");
            let reads = count.bytes_read() as f64 / (4 * b * V) as f64;
            println!(
                "[{dev}] {chain}: {n} kernels, {reads:.3} reads of the logits per step (B = {b})"
            );
            assert!(n > 0, "[{dev}] {chain}: the observer saw no launch");
            assert_eq!(
                n, again,
                "[{dev}] {chain}, B = {b}: {n} kernels, then {again} on a repeated step"
            );
            assert!(
                n <= budget,
                "[{dev}] {chain}, B = {b}: {n} kernels per step, budget {budget}: {:?}",
                count.by_name()
            );
            assert_eq!(
                count.undeclared(),
                0,
                "[{dev}] {chain}, B = {b}: launches without declared reads: {:?}",
                count.by_name()
            );
            assert!(
                reads >= 1.0 && reads <= read_ceiling,
                "[{dev}] {chain}, B = {b}: {reads:.3} reads of the logits, ceiling {read_ceiling}: {:?}",
                count.reads
            );
            // Below a batch that fills the device each row is split over
            // several workgroups (greedy, and the first reads of the
            // full-row cuts) and merged; B = 1 always is, on any device
            // with more than one core or thread.
            let (split, whole): (&[&str], &[&str]) = match chain {
                "greedy" => (&["argmax_part_rows", "argmax_merge_rows"], &["argmax_rows"]),
                "top_p(0.9); temperature; dist" => (
                    &[
                        "argmax_part_rows",
                        "top_p_histogram_part_rows",
                        "top_p_kept_part_rows",
                        "top_p_dist_full_rows",
                    ],
                    &["top_p_dist_full_rows"],
                ),
                "min_p(0.05); temperature; dist" => (
                    &[
                        "argmax_part_rows",
                        "kept_sums_part_rows",
                        "min_p_dist_full_rows",
                    ],
                    &["min_p_dist_full_rows"],
                ),
                "temperature(0.8); dist" => (
                    &[
                        "argmax_part_rows",
                        "kept_sums_part_rows",
                        "dist_all_full_rows",
                    ],
                    &["dist_all_full_rows"],
                ),
                // The top-k chains: the selection's first kernels, then the
                // narrow ones on the k candidates.
                _ => (
                    &["topk_floor_rows", "topk_compact_part_rows", "topk_rows"],
                    &["topk_rows"],
                ),
            };
            let logits =
                Tensor::<2>::from_data(TensorData::new(vec![0.0f32; b * V], [b, V]), &device);
            let segments = sampler_backend::kernels::greedy_segments(&logits)
                .expect("a cubecl device splits rows");
            let names: Vec<&str> = count.reads.iter().map(|(k, _)| k.as_str()).collect();
            let want = if segments > 1 { split } else { whole };
            if chain.contains("top_k") {
                assert!(
                    names.starts_with(want) && !names[want.len()..].contains(&"topk_rows"),
                    "[{dev}] {chain}, B = {b}, {segments} segments: {names:?}"
                );
            } else {
                assert_eq!(names, want, "[{dev}] {chain}, B = {b}, {segments} segments");
            }
            if b == 1 && std::thread::available_parallelism().map_or(1, |t| t.get()) > 1 {
                assert!(
                    segments > 1,
                    "[{dev}] {chain} at B = 1: one workgroup a row"
                );
            }
        }
    }
    unfused_full_row_top_p(&device, dev);
}

/// The unfused full-row `top_p` (`kernels::top_p_full`: what a chain runs
/// when a full-row `top_p` is followed by something other than `dist`):
/// the fused kernel cut only, then the row write; 2 launches, or split
/// (B = 1) 5: the fused kernel's three split passes first. Reads: its
/// three (split: the segments' three), the row again for the write, and
/// split the row's histogram words and gathered logits (0.2 of a read at
/// V = 32000: 4.204 on lavapipe). In the one device test of this file (the
/// observer is process-wide).
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
fn unfused_full_row_top_p(device: &Device, dev: &str) {
    use sampler_backend::kernels;
    for b in [1, 4] {
        let logits = upload(&rows(b), b, V, device);
        let p = Tensor::<2>::from_data(TensorData::new(vec![0.9f32; b], [b, 1]), device);
        let run = || {
            let (out, keys) = kernels::top_p_full(&logits, &p).expect("kernel");
            let bits: Vec<u32> = out.into_data().iter::<f32>().map(f32::to_bits).collect();
            let keys: Vec<i64> = keys.into_data().convert::<i64>().iter::<i64>().collect();
            (bits, keys)
        };
        // The first run compiles.
        let (first, keys) = run();
        assert_eq!(keys, vec![2 * V as i64; b], "[{dev}] valid rows");
        device.sync().expect("sync");
        let ((again, _), count) = count_launches(run);
        assert_eq!(again, first, "[{dev}] top_p_full, B = {b}: a repeated run");
        let count = count.expect("a cubecl build counts");
        let names: Vec<&str> = count.reads.iter().map(|(k, _)| k.as_str()).collect();
        let reads = count.bytes_read() as f64 / (4 * b * V) as f64;
        println!("[{dev}] top_p_full: {names:?}, {reads:.3} reads (B = {b})");
        let segments = kernels::greedy_segments(&logits).expect("a cubecl device splits rows");
        let want: &[&str] = if segments > 1 {
            &[
                "argmax_part_rows",
                "top_p_histogram_part_rows",
                "top_p_kept_part_rows",
                "top_p_dist_full_rows",
                "top_p_mask_rows",
            ]
        } else {
            &["top_p_dist_full_rows", "top_p_mask_rows"]
        };
        assert_eq!(
            names, want,
            "[{dev}] top_p_full, B = {b}, {segments} segments"
        );
        assert_eq!(count.total(), want.len(), "{:?}", count.by_name());
        assert!(
            (4.0..=4.25).contains(&reads),
            "[{dev}] top_p_full, B = {b}: {reads:.3} reads: {:?}",
            count.reads
        );
        // Some of the row is kept, the rest dropped.
        let kept = first
            .iter()
            .filter(|&&x| f32::from_bits(x).is_finite())
            .count();
        assert!(kept >= b && kept < b * V, "[{dev}] B = {b}: {kept} kept");
    }
}

/// Without a cubecl backend there is nothing to count, and a step says so
/// (`None`, not a count of 0).
#[cfg(not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")))]
#[test]
fn flex_build_has_no_kernel_count() {
    let device = device_support::device("flex").expect("flex always starts");
    let mut ex = Executor::new(
        vec![ChainSpec::new(vec![StageSpec::Greedy], Some(1))],
        V,
        &device,
        OffloadPolicy::Device,
    )
    .expect("executor");
    let logits = upload(&rows(1), 1, V, &device);
    let (out, kernels) = count_launches(|| ex.step(logits));
    assert!(out.expect("step").tokens[0].is_ok());
    assert_eq!(kernels, None);
}
