//! The GPU check's benchmark: a sampling step on each compiled-in device at
//! the serving shapes, against one read of the logits measured in the same
//! run, with the kernels per step and the same step done by copying the
//! logits to the host and running sampler-cpu.
//!
//! For every device (`BENCH_DEVICES`, default: every compiled-in device but
//! `flex`/`ndarray`), batch `B` (`BENCH_BATCH`, default `1,32,256`) and
//! vocabulary `V` (`BENCH_VOCAB`, default `32000,128256,151936`) and row
//! shape (`BENCH_ROWS`, default `zipf,model`: Zipf-like rows, and rows
//! shaped like a real model's, ids in frequency bands with the likely
//! tokens at high ids, a third of the vocabulary 16-30 nats deep, bf16
//! ties), on logits already on the device:
//! * `floor`: one read of the `[B, V]` logits (a row sum, read back: the
//!   same readback latency as a step);
//! * the four chains of the device-kernels budgets, fully offloaded (4 bytes
//!   read back per row): `greedy`, `top_k(50); temperature; top_p(0.9);
//!   dist`, `top_p(0.9); temperature; dist` (full vocabulary) and
//!   `penalties(repeat 1.1, last 64); top_k(40); temperature; dist`;
//! * `host/<chain>` for the top_k chain: offloading off, the logits copied
//!   to the host (`4·V` bytes per row) and sampled by sampler-cpu.
//!
//! criterion measures each; the samples it takes are also kept, and a table
//! at the end prints per configuration the median µs per step, x the
//! measured floor, x the HBM floor (`B·V·4` bytes at `BENCH_HBM_GBPS`,
//! default 4800 for an H200), kernels and declared reads of the logits per
//! step. `scripts/gpu-check` runs it on a GPU machine; without a cubecl
//! device compiled in it measures nothing and says so.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sampler_backend::{Executor, Tensor, TensorData, compiled_devices, launches, probe_device};
use sampler_core::{ChainSpec, HistoryScope, OffloadPolicy, StageSpec};

#[path = "common/mod.rs"]
mod common;
use common::{list, logits as shaped_logits};

fn temp(t: f32) -> StageSpec {
    StageSpec::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

fn chains() -> Vec<(&'static str, Vec<StageSpec>)> {
    let top_p = StageSpec::TopP {
        p: 0.9,
        min_keep: 0,
    };
    vec![
        ("greedy", vec![StageSpec::Greedy]),
        (
            "top_k50_temp_top_p_dist",
            vec![
                StageSpec::TopK { k: 50 },
                temp(0.8),
                top_p.clone(),
                StageSpec::Dist,
            ],
        ),
        ("top_p_temp_dist", vec![top_p, temp(0.7), StageSpec::Dist]),
        (
            "penalties_top_k40_temp_dist",
            vec![
                StageSpec::Penalties {
                    last_n: 64,
                    repeat: 1.1,
                    frequency: 0.0,
                    presence: 0.0,
                    scope: HistoryScope::Output,
                },
                StageSpec::TopK { k: 40 },
                temp(0.8),
                StageSpec::Dist,
            ],
        ),
    ]
}

/// One configuration's figures for the closing table.
struct Row {
    device: String,
    b: usize,
    v: usize,
    /// The row shape (`BENCH_ROWS`).
    rows: String,
    what: String,
    median_us: f64,
    kernels: Option<usize>,
    reads: Option<f64>,
}

/// Every sample criterion took of the current benchmark (seconds per step).
static SAMPLES: Mutex<Vec<f64>> = Mutex::new(Vec::new());

fn take_median() -> f64 {
    let mut s = std::mem::take(&mut *SAMPLES.lock().unwrap_or_else(|e| e.into_inner()));
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    s[s.len() / 2] * 1e6
}

/// Time `iters` calls of `f`, keeping each call's time.
fn timed(iters: u64, mut f: impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    let mut samples = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let t0 = Instant::now();
        f();
        let dt = t0.elapsed();
        total += dt;
        samples.push(dt.as_secs_f64());
    }
    SAMPLES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(samples);
    total
}

fn bench(c: &mut Criterion) {
    let cubecl: Vec<&str> = compiled_devices()
        .iter()
        .copied()
        .filter(|d| !matches!(*d, "flex" | "ndarray"))
        .collect();
    if cubecl.is_empty() {
        eprintln!(
            "gpu_check: no cubecl device compiled in (build with --features wgpu, vulkan or cuda)"
        );
    }
    let hbm_gbps: f64 = std::env::var("BENCH_HBM_GBPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4800.0);
    let mut table: Vec<Row> = Vec::new();
    for dev_name in list("BENCH_DEVICES", &cubecl.join(",")) {
        let device = match probe_device(&dev_name) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skip {dev_name}: {e}");
                continue;
            }
        };
        let mut group = c.benchmark_group(format!("gpu_check/{dev_name}"));
        group.sample_size(10);
        group.measurement_time(Duration::from_millis(400));
        group.warm_up_time(Duration::from_millis(100));
        for v in list("BENCH_VOCAB", "32000,128256,151936") {
            let Ok(v) = v.parse::<usize>() else { continue };
            for b in list("BENCH_BATCH", "1,32,256") {
                let Ok(b) = b.parse::<usize>() else { continue };
                for shape in list("BENCH_ROWS", "zipf,model") {
                    let Some(host) = shaped_logits(&shape, b, v) else {
                        eprintln!("skip rows {shape}: not zipf or model");
                        continue;
                    };
                    let logits = Tensor::<2>::from_data(TensorData::new(host, [b, v]), &device);
                    let mut push = |what: String, kernels, reads| {
                        table.push(Row {
                            device: dev_name.clone(),
                            b,
                            v,
                            rows: shape.clone(),
                            what,
                            median_us: take_median(),
                            kernels,
                            reads,
                        })
                    };
                    // One read of the logits, read back like a step's tokens.
                    let read_once = || {
                        let s = logits.clone().sum_dim(1);
                        std::hint::black_box(s.into_data());
                    };
                    read_once();
                    take_median();
                    group.bench_function(
                        BenchmarkId::new(format!("floor/V{v}/{shape}"), b),
                        |bench| bench.iter_custom(|iters| timed(iters, read_once)),
                    );
                    push("floor (one read)".into(), None, None);
                    for (name, stages) in chains() {
                        let modes: &[(&str, OffloadPolicy)] = if name == "top_k50_temp_top_p_dist" {
                            &[
                                ("device", OffloadPolicy::Device),
                                ("host", OffloadPolicy::Off),
                            ]
                        } else {
                            &[("device", OffloadPolicy::Device)]
                        };
                        for &(mode, policy) in modes {
                            let rows: Vec<ChainSpec> = (0..b)
                                .map(|r| ChainSpec::new(stages.clone(), Some(r as u64)))
                                .collect();
                            let mut ex = match Executor::new(rows, v, &device, policy) {
                                Ok(ex) => ex,
                                Err(e) => {
                                    eprintln!("skip {dev_name} {mode}/{name} B={b} V={v}: {e}");
                                    continue;
                                }
                            };
                            // Compile and autotune, then count one warm step.
                            let mut ok = true;
                            for _ in 0..2 {
                                ok &= ex.step(logits.clone()).is_ok();
                            }
                            if !ok {
                                eprintln!(
                                    "skip {dev_name} {mode}/{name} B={b} V={v}: the step failed"
                                );
                                continue;
                            }
                            let (_, count) = launches::count_launches(|| ex.step(logits.clone()));
                            let kernels = count.as_ref().map(|k| k.total());
                            let reads = count
                                .as_ref()
                                .filter(|k| k.undeclared() == 0)
                                .map(|k| k.bytes_read() as f64 / (4 * b * v) as f64);
                            take_median();
                            let id = BenchmarkId::new(format!("{mode}/{name}/V{v}/{shape}"), b);
                            group.bench_function(id, |bench| {
                                bench.iter_custom(|iters| {
                                    timed(iters, || {
                                        std::hint::black_box(ex.step(logits.clone()).is_ok());
                                    })
                                })
                            });
                            push(format!("{mode}/{name}"), kernels, reads);
                        }
                    }
                }
            }
        }
        group.finish();
    }
    print_table(&table, hbm_gbps);
}

fn print_table(table: &[Row], hbm_gbps: f64) {
    if table.is_empty() {
        return;
    }
    println!();
    println!(
        "| device | B | V | rows | step | median µs | x floor (measured) | x HBM floor | kernels | reads of the logits |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut floor = f64::NAN;
    for r in table {
        if r.what.starts_with("floor") {
            floor = r.median_us;
        }
        let hbm_us = (4 * r.b * r.v) as f64 / (hbm_gbps * 1e3);
        println!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.1} | {} | {} |",
            r.device,
            r.b,
            r.v,
            r.rows,
            r.what,
            r.median_us,
            r.median_us / floor,
            r.median_us / hbm_us,
            r.kernels.map_or("-".into(), |k| k.to_string()),
            r.reads.map_or("-".into(), |x| format!("{x:.2}")),
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
