//! The serving step: one `SamplingBatch::step` over `B` requests with mixed
//! chains, against sampler-cpu on the same rows and chains, with the memory
//! floor measured in the same run.
//!
//! Chains (request `i` gets `CHAINS[i % 4]`, each with its own seed):
//! * `top_k(40); temperature(0.8); top_p(0.95); dist`
//! * `penalties(64, 1.1); top_k(20); min_p(0.05); temperature(0.7); dist`
//! * `greedy`
//! * `temperature(1.0); min_p(0.1); dist` (no top_k)
//!
//! Measured per configuration:
//! * `batch/<device>`: `SamplingBatch::step` (auto policy; on flex that is
//!   sampler-cpu's fast path over the tensor's memory); the tensor is made
//!   from the rows outside the timing, as an engine's model would hand it;
//! * `sampler_cpu`: `sampler_cpu::sample_batch` over the same rows and
//!   chains, given fresh rows each step (freed inside the step, as the
//!   batch frees the tensor it consumes);
//! * `floor_read`: one pass OR-ing every logit's bits (the rows read once).
//!
//! Sizes: `BENCH_BATCH` (default `1,32,256`) x `BENCH_VOCAB` (default
//! `32000,151936`); devices: `BENCH_DEVICES` (default: every compiled-in
//! one). Results: docs/benchmarks.md.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use sampler_backend::{
    RequestId, SamplingBatch, Tensor, TensorData, compiled_devices, parse_device,
};
use sampler_core::{ChainSpec, HistoryScope, OffloadPolicy, StageSpec};

#[path = "common/mod.rs"]
mod common;
use common::{list, zipf_logits};

fn temp(t: f32) -> StageSpec {
    StageSpec::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

fn chain(i: usize) -> ChainSpec {
    let stages = match i % 4 {
        0 => vec![
            StageSpec::TopK { k: 40 },
            temp(0.8),
            StageSpec::TopP {
                p: 0.95,
                min_keep: 0,
            },
            StageSpec::Dist,
        ],
        1 => vec![
            StageSpec::Penalties {
                last_n: 64,
                repeat: 1.1,
                frequency: 0.0,
                presence: 0.0,
                scope: HistoryScope::PromptAndOutput,
            },
            StageSpec::TopK { k: 20 },
            StageSpec::MinP {
                p: 0.05,
                min_keep: 0,
            },
            temp(0.7),
            StageSpec::Dist,
        ],
        2 => vec![StageSpec::Greedy],
        _ => vec![
            temp(1.0),
            StageSpec::MinP {
                p: 0.1,
                min_keep: 0,
            },
            StageSpec::Dist,
        ],
    };
    ChainSpec::new(stages, Some(1000 + i as u64))
}

fn bench(c: &mut Criterion) {
    let batches: Vec<usize> = list("BENCH_BATCH", "1,32,256")
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let vocabs: Vec<usize> = list("BENCH_VOCAB", "32000,151936")
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let default_devices = compiled_devices().join(",");
    let devices = list("BENCH_DEVICES", &default_devices);
    let mut g = c.benchmark_group("serving_step");
    g.sample_size(10);
    for &v in &vocabs {
        for &b in &batches {
            let logits = zipf_logits(b, v);
            let cfg = format!("B{b}_V{v}");
            g.throughput(criterion::Throughput::Bytes((b * v * 4) as u64));
            g.bench_function(BenchmarkId::new("floor_read", &cfg), |bench| {
                // Every logit's bits OR-ed together: one vectorised pass, the
                // time to read the rows once.
                bench.iter(|| {
                    std::hint::black_box(&logits)
                        .iter()
                        .fold(0u32, |acc, x| acc | x.to_bits())
                })
            });
            let mut chains: Vec<_> = (0..b)
                .map(|i| sampler_cpu::build_chain(&chain(i)).expect("valid chain"))
                .collect();
            // Like the batch below, each step gets fresh rows and frees them.
            g.bench_function(BenchmarkId::new("sampler_cpu", &cfg), |bench| {
                bench.iter_batched(
                    || logits.clone(),
                    |rows| {
                        let out =
                            sampler_cpu::sample_batch(&rows, b, v, &mut chains).expect("shape");
                        drop(rows);
                        out
                    },
                    BatchSize::LargeInput,
                )
            });
            for name in &devices {
                let Ok(device) = parse_device(name) else {
                    continue;
                };
                let mut batch = SamplingBatch::new(v, &device, OffloadPolicy::Auto).expect("batch");
                let ids: Vec<RequestId> = (0..b)
                    .map(|i| batch.insert(chain(i), &[1, 2, 3]).expect("insert"))
                    .collect();
                let upload =
                    || Tensor::<2>::from_data(TensorData::new(logits.clone(), [b, v]), &device);
                let first = batch.step(&ids, upload()).expect("step");
                println!(
                    "serving_step {name} {cfg}: {} bytes read back per step, {} device groups",
                    first.bytes_read,
                    batch.groups()
                );
                g.bench_function(BenchmarkId::new(format!("batch/{name}"), &cfg), |bench| {
                    bench.iter_batched(
                        upload,
                        |t| batch.step(&ids, t).expect("step"),
                        BatchSize::LargeInput,
                    )
                });
            }
        }
    }
    g.finish();

    // The other calls of the serving loop, at V = 32000 on each device.
    let mut g = c.benchmark_group("serving_calls");
    g.sample_size(20);
    for name in &devices {
        let Ok(device) = parse_device(name) else {
            continue;
        };
        let v = 32000;
        let mut batch = SamplingBatch::new(v, &device, OffloadPolicy::Auto).expect("batch");
        let _live: Vec<RequestId> = (0..31)
            .map(|i| batch.insert(chain(i), &[1, 2, 3]).expect("insert"))
            .collect();
        g.bench_function(BenchmarkId::new("insert_remove", name), |bench| {
            bench.iter(|| {
                let id = batch.insert(chain(1), &[1, 2, 3]).expect("insert");
                batch.remove(id).expect("remove");
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
