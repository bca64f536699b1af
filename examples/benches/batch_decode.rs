//! The batch command's decode step on SmolLM2-135M-Instruct (GGUF, vocab
//! 49152) on flex: `C` concurrent requests, one batched model pass and one
//! sampling step per generated token, with the sampling's memory floor
//! measured in the same run.
//!
//! Measured for `C` in `BENCH_CONCURRENCY` (default `1,8,32`):
//! * `step/C`: `Llama2::forward_batch` over `C` rows (each request at
//!   position 16 of its own cache slot) + `SamplingBatch::step` over the
//!   `[C, 49152]` logits: the time of one token for every request, so
//!   tokens/s = `C / step`;
//! * `model/C`: the forward pass alone;
//! * `sampling/C`: `SamplingBatch::step` alone, on a fresh tensor of
//!   logits the model made (built outside the timing, held only by the
//!   step, as a model hands it over);
//! * `floor_read/C`: one pass over the `[C, 49152]` logits on the host.
//!
//! The context is 512 tokens (serve's default for GGUF; the attention's
//! cost follows the context); `BENCH_CONTEXT` changes it.
//!
//! Requests cycle through four chains (`top_k;temperature;top_p;dist`,
//! greedy, `penalties;min_p;dist`, `typical;temperature;dist`), each with
//! its own seed. Needs the model from `../shared/models/smollm2-135m-instruct/`;
//! prints why and measures nothing when it is absent. Results:
//! docs/benchmarks.md.

use std::path::PathBuf;

use burn_tensor::{Tensor, TensorData};
use chain_config::SamplingParams;
use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use sampler_backend::{RequestId, SamplingBatch};
use sampler_core::{OffloadPolicy, TokenId};
use sampler_examples::gguf::{Gguf, llama_checkpoint};
use sampler_examples::llama2::{BatchKvCache, Llama2};

const PARAMS: [&str; 4] = [
    r#"{"temperature": 0.8, "top_k": 40, "top_p": 0.95}"#,
    r#"{"temperature": 0}"#,
    r#"{"min_p": 0.05, "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.1}"#,
    r#"{"temperature": 0.7, "typical_p": 0.9}"#,
];

/// Prompt length before the measured position.
const POS: usize = 16;

fn model_file() -> Option<PathBuf> {
    let f = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    ));
    if f.is_file() {
        Some(f)
    } else {
        println!("SKIP: {} is absent: nothing measured", f.display());
        None
    }
}

fn concurrency() -> Vec<usize> {
    std::env::var("BENCH_CONCURRENCY")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 32])
}

/// `c` requests with their prompts through the model: the batch, its ids,
/// the cache and each request's next token.
fn setup(model: &Llama2, c: usize) -> (SamplingBatch, Vec<RequestId>, BatchKvCache, Vec<TokenId>) {
    let device = model.device().clone();
    let mut batch = SamplingBatch::new(model.config().vocab_size, &device, OffloadPolicy::Auto)
        .expect("a batch on flex");
    let mut cache = model.new_batch_cache(c);
    let mut ids = Vec::new();
    let mut next = Vec::new();
    for i in 0..c {
        let mut cfg = SamplingParams::from_json_str(PARAMS[i % PARAMS.len()])
            .and_then(|p| p.to_chain())
            .expect("valid parameters");
        cfg.chain.seed = Some(7 + i as u64);
        let prompt: Vec<TokenId> = (0..POS as u32).map(|p| 100 + 37 * (i as u32) + p).collect();
        ids.push(batch.insert(cfg.chain, &prompt).expect("insert"));
        let positions: Vec<usize> = (0..POS).collect();
        drop(
            model
                .forward_batch(&prompt, &positions, &[i; POS], &mut cache)
                .expect("prompt pass"),
        );
        next.push(500 + i as u32);
    }
    (batch, ids, cache, next)
}

fn bench(cr: &mut Criterion) {
    let Some(file) = model_file() else { return };
    let g = Gguf::read(&file).expect("the GGUF reads");
    let context = std::env::var("BENCH_CONTEXT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let ckpt = llama_checkpoint(&g, context).expect("a Llama checkpoint");
    let device = sampler_backend::parse_device("flex").expect("flex");
    let model = Llama2::new(&ckpt, &device);
    let vocab = model.config().vocab_size;
    let mut group = cr.benchmark_group("batch_decode");
    group.sample_size(10);
    for c in concurrency() {
        let (mut batch, ids, mut cache, next) = setup(&model, c);
        let positions = vec![POS; c];
        let slots: Vec<usize> = (0..c).collect();
        group.bench_function(BenchmarkId::new("step", c), |b| {
            b.iter(|| {
                let logits = model
                    .forward_batch(&next, &positions, &slots, &mut cache)
                    .expect("forward");
                batch.step(&ids, logits).expect("step")
            })
        });
        group.bench_function(BenchmarkId::new("model", c), |b| {
            b.iter(|| {
                model
                    .forward_batch(&next, &positions, &slots, &mut cache)
                    .expect("forward")
            })
        });
        let rows: Vec<f32> = model
            .forward_batch(&next, &positions, &slots, &mut cache)
            .expect("forward")
            .into_data()
            .iter::<f32>()
            .collect();
        assert_eq!(rows.len(), c * vocab);
        group.bench_function(BenchmarkId::new("sampling", c), |b| {
            b.iter_batched(
                || Tensor::<2>::from_data(TensorData::new(rows.clone(), [c, vocab]), &device),
                |l| batch.step(&ids, l).expect("step"),
                BatchSize::SmallInput,
            )
        });
        group.bench_function(BenchmarkId::new("floor_read", c), |b| {
            b.iter(|| rows.iter().fold(0u32, |acc, x| acc | x.to_bits()))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
