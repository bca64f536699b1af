//! Per-step time and bytes read back of the hybrid executor.
//!
//! Chain (`BENCH_CHAIN`): `top_k` (default) is `top_k(40); temperature(0.8);
//! top_p(0.9); dist` (llama.cpp's common order), `top_p` the full-vocabulary
//! `top_p(0.9); temperature(0.7); dist`, `min_p` the full-vocabulary
//! `min_p(0.05); temperature(0.8); dist`; on Zipf-like logits (`BENCH_ROWS`:
//! `zipf`, the default, or `model`, rows shaped like a real model's: see
//! `gpu_check`), for every compiled-in device:
//! * `offloaded`: the whole chain on the device (4 B/row read back), with
//!   the custom kernels on a cubecl device;
//! * `offloaded_recipes`: the same with the kernels turned off (burn's
//!   generic ops only; cubecl devices), side by side in the same run;
//! * `topk_prefix`: only `top_k` on the device (8·40 B/row), the rest on sampler-cpu;
//! * `cpu_only`: offloading off (full rows read back, 4·V B/row).
//!
//! Sizes: `BENCH_BATCH` (default `1,32,256`) x `BENCH_VOCAB` (default
//! `32000,151936`); `BENCH_DEVICES` (default: every compiled-in device).
//! Bytes and kernels (cubecl devices) per step are printed once per
//! configuration. Results: docs/benchmarks.md.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sampler_backend::{Executor, Tensor, TensorData, compiled_devices, launches, parse_device};
use sampler_core::{ChainSpec, OffloadPolicy, StageSpec};

#[path = "common/mod.rs"]
mod common;
use common::{list, logits as shaped_logits};

fn chain(name: &str, seed: u64) -> ChainSpec {
    let temp = |t| StageSpec::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    };
    let stages = match name {
        "top_p" => vec![
            StageSpec::TopP {
                p: 0.9,
                min_keep: 0,
            },
            temp(0.7),
            StageSpec::Dist,
        ],
        "min_p" => vec![
            StageSpec::MinP {
                p: 0.05,
                min_keep: 0,
            },
            temp(0.8),
            StageSpec::Dist,
        ],
        _ => vec![
            StageSpec::TopK { k: 40 },
            temp(0.8),
            StageSpec::TopP {
                p: 0.9,
                min_keep: 0,
            },
            StageSpec::Dist,
        ],
    };
    ChainSpec::new(stages, Some(seed))
}

fn bench(c: &mut Criterion) {
    let default_devices = compiled_devices().join(",");
    let chain_name = std::env::var("BENCH_CHAIN").unwrap_or_else(|_| "top_k".into());
    for dev_name in list("BENCH_DEVICES", &default_devices) {
        let Ok(device) = parse_device(&dev_name) else {
            eprintln!("skip {dev_name}: not compiled in");
            continue;
        };
        let group_name = match chain_name.as_str() {
            "top_k" => format!("step/{dev_name}"),
            other => format!("step_{other}/{dev_name}"),
        };
        let mut group = c.benchmark_group(group_name);
        group.sample_size(10);
        group.measurement_time(std::time::Duration::from_secs(3));
        group.warm_up_time(std::time::Duration::from_millis(500));
        for v in list("BENCH_VOCAB", "32000,151936") {
            let Ok(v) = v.parse::<usize>() else { continue };
            for b in list("BENCH_BATCH", "1,32,256") {
                let Ok(b) = b.parse::<usize>() else { continue };
                let rows_kind = std::env::var("BENCH_ROWS").unwrap_or_else(|_| "zipf".into());
                let Some(logits) = shaped_logits(&rows_kind, b, v) else {
                    eprintln!("skip rows {rows_kind}: not zipf or model");
                    continue;
                };
                for (mode, policy, kernels_on) in [
                    ("offloaded", OffloadPolicy::Device, true),
                    ("offloaded_recipes", OffloadPolicy::Device, false),
                    ("topk_prefix", OffloadPolicy::Stages(1), true),
                    ("cpu_only", OffloadPolicy::Off, true),
                ] {
                    if !kernels_on && !set_kernels(false) {
                        continue; // no custom kernels in this build or on this device
                    }
                    let rows: Vec<ChainSpec> =
                        (0..b).map(|r| chain(&chain_name, r as u64)).collect();
                    let Ok(mut ex) = Executor::new(rows, v, &device, policy) else {
                        continue;
                    };
                    let upload =
                        || Tensor::<2>::from_data(TensorData::new(logits.clone(), [b, v]), &device);
                    // Warm-up (kernel compilation on cubecl devices), then
                    // one warm step's bytes and kernels.
                    if ex.step(upload()).is_err() {
                        continue;
                    }
                    let logits = upload();
                    let (out, kernels) = launches::count_launches(|| ex.step(logits));
                    let Ok(out) = out else { continue };
                    let kernels = kernels
                        .map(|k| format!(", {} kernels per step", k.total()))
                        .unwrap_or_default();
                    eprintln!(
                        "{dev_name} {mode} B={b} V={v}: {} bytes read back per step ({} per row){kernels}",
                        out.bytes_read,
                        out.bytes_read / b
                    );
                    let id = BenchmarkId::new(format!("{mode}/V{v}"), b);
                    group.bench_function(id, |bench| {
                        bench.iter_batched(
                            upload,
                            |t| ex.step(t).map(|o| o.bytes_read).unwrap_or(0),
                            criterion::BatchSize::PerIteration,
                        )
                    });
                    set_kernels(true);
                }
            }
        }
        group.finish();
    }
}

/// Turn the custom cubecl kernels on or off; false when this build has none.
fn set_kernels(on: bool) -> bool {
    #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
    {
        sampler_backend::kernels::set_enabled(on);
        true
    }
    #[cfg(not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")))]
    {
        let _ = on;
        false
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
