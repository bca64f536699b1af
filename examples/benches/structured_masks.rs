//! Structured outputs on SmolLM2-135M-Instruct (GGUF, vocab 49152) on flex:
//! what a mask costs and what it adds to a decode step.
//!
//! * Per mask: for five JSON schemas (nested objects, arrays, enums,
//!   numbers with ranges, optional keys) and a regex, a valid output
//!   tokenized by the model's tokenizer is replayed through a fresh matcher
//!   (`Matcher::fill_mask`, then `consume`, token by token). Printed: the
//!   median, p99 and mean microseconds per mask over 40 replays; criterion
//!   measures `masks/<name>`, every mask of one output.
//! * Per step, 8 requests (`top_k;temperature;top_p;dist` after `mask`),
//!   measured in the same run: `model/8` (the forward pass alone),
//!   `step_plain/8` (forward + `SamplingBatch::step`, no constraint),
//!   `step_constrained/8` (the same, every request held to a JSON schema:
//!   the batch computes each next mask on the thread pool while the next
//!   forward pass runs). Without the overlap a step would wait for its
//!   rows' masks one after the other: 8 x the per-mask figures above. The
//!   constrained requests are reset every 24 steps (outside the
//!   timing), so their matchers stay inside the JSON.
//!
//! Needs the model from `../shared/models/smollm2-135m-instruct/`; prints
//! why and measures nothing when it is absent. Results: docs/benchmarks.md.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chain_config::SamplingParams;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sampler_backend::SamplingBatch;
use sampler_core::{OffloadPolicy, StructuredOutput, TokenConstraint, TokenId};
use sampler_examples::chat::ChatTokenizer;
use sampler_examples::gguf::{Gguf, llama_checkpoint};
use sampler_examples::llama2::Llama2;
use sampler_structured::{Matcher, TokenizerView};

/// (name, constraint, a valid output).
fn cases() -> Vec<(&'static str, StructuredOutput, &'static str)> {
    let s = |t: &str| StructuredOutput::JsonSchema(t.into());
    vec![
        (
            "person",
            s(
                r#"{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}"#,
            ),
            r#"{"name": "Ada Lovelace", "age": 36}"#,
        ),
        (
            "pets",
            s(
                r#"{"type": "object", "properties": {"pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish", "bird"]}, "minItems": 1, "maxItems": 4}, "owner": {"type": "string", "maxLength": 12}}, "required": ["pets"], "additionalProperties": false}"#,
            ),
            r#"{"pets": ["cat", "dog", "fish"], "owner": "Sam"}"#,
        ),
        (
            "city",
            s(
                r#"{"type": "object", "properties": {"city": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "population": {"type": "integer", "minimum": 1, "maximum": 100000000}}, "required": ["name", "population"], "additionalProperties": false}, "capital": {"type": "boolean"}}, "required": ["city", "capital"], "additionalProperties": false}"#,
            ),
            r#"{"city": {"name": "Paris", "population": 2100000}, "capital": true}"#,
        ),
        (
            "weather",
            s(
                r#"{"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60}, "sky": {"enum": ["sunny", "cloudy", "rainy"]}, "wind": {"type": "integer", "minimum": 0, "maximum": 200}}, "required": ["temperature", "sky"], "additionalProperties": false}"#,
            ),
            r#"{"temperature": 21.5, "sky": "sunny", "wind": 12}"#,
        ),
        (
            "review",
            s(
                r#"{"type": "object", "properties": {"title": {"type": "string", "maxLength": 24}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}, "rating": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["title", "rating"], "additionalProperties": false}"#,
            ),
            r#"{"title": "The Hobbit", "tags": ["fantasy", "classic"], "rating": 5}"#,
        ),
        (
            "email_regex",
            StructuredOutput::Regex(" [a-z]{3,10}@(gmail|example)\\.com".into()),
            " sam@gmail.com",
        ),
    ]
}

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

/// Every mask of one output through a fresh matcher; each mask's time.
fn replay(view: &Arc<TokenizerView>, spec: &StructuredOutput, tokens: &[TokenId]) -> Vec<Duration> {
    let mut m = Matcher::new(view, spec).expect("a valid constraint");
    let mut mask = vec![0u32; view.mask_words()];
    let mut times = Vec::with_capacity(tokens.len());
    for &t in tokens {
        let t0 = Instant::now();
        m.fill_mask(&mut mask).expect("mask");
        times.push(t0.elapsed());
        assert!(
            mask[t as usize / 32] >> (t % 32) & 1 == 1,
            "token {t} refused"
        );
        m.consume(t).expect("consume");
    }
    times
}

fn bench(cr: &mut Criterion) {
    let Some(file) = model_file() else { return };
    let g = Gguf::read(&file).expect("the GGUF reads");
    let tok = ChatTokenizer::from_gguf(&g).expect("the tokenizer");
    let ckpt = llama_checkpoint(&g, 512).expect("a Llama checkpoint");
    let device = sampler_backend::parse_device("flex").expect("flex");
    let model = Llama2::new(&ckpt, &device);
    let vocab = model.config().vocab_size;
    let t0 = Instant::now();
    let view = Arc::new(sampler_examples::structured::view(&tok, vocab).expect("the view"));
    println!(
        "tokenizer view: {vocab} tokens in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );

    let mut group = cr.benchmark_group("structured");
    group.sample_size(10);
    println!("| constraint | masks per output | median µs | p99 µs | mean µs |");
    for (name, spec, text) in cases() {
        let tokens = tok.encode(text).expect("encode");
        let mut all: Vec<f64> = (0..40)
            .flat_map(|_| replay(&view, &spec, &tokens))
            .map(|d| d.as_secs_f64() * 1e6)
            .collect();
        all.sort_by(f64::total_cmp);
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let p = |q: f64| all[((all.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {name} | {} | {:.1} | {:.1} | {mean:.1} |",
            tokens.len(),
            p(0.5),
            p(0.99)
        );
        group.bench_function(BenchmarkId::new("masks", name), |b| {
            b.iter(|| replay(&view, &spec, &tokens))
        });
    }

    // Eight requests, plain and constrained, in the same run.
    let c = 8;
    let person = cases().remove(0).1;
    let mut batches = Vec::new();
    for constrained in [false, true] {
        let mut batch = SamplingBatch::new(vocab, &device, OffloadPolicy::Auto).expect("batch");
        let mut cache = model.new_batch_cache(c);
        let mut ids = Vec::new();
        for i in 0..c {
            let mut cfg = SamplingParams::from_json_str(
                r#"{"temperature": 1.0, "top_k": 40, "top_p": 0.95}"#,
            )
            .and_then(|p| p.to_chain())
            .expect("params");
            cfg.set_structured(Some(person.clone()));
            cfg.chain.seed = Some(11 + i as u64);
            let prompt: Vec<TokenId> = (0..16u32).map(|p| 100 + 37 * i as u32 + p).collect();
            let id = batch.insert(cfg.chain, &prompt).expect("insert");
            if constrained {
                let m = Matcher::new(&view, &person).expect("matcher");
                batch
                    .set_constraint(id, Some(Box::new(m)))
                    .expect("constraint");
            }
            ids.push(id);
            let positions: Vec<usize> = (0..16).collect();
            drop(
                model
                    .forward_batch(&prompt, &positions, &[i; 16], &mut cache)
                    .expect("prompt"),
            );
        }
        batches.push((batch, ids, cache));
    }
    let positions = vec![16; c];
    let slots: Vec<usize> = (0..c).collect();
    for (which, (batch, ids, cache)) in ["step_plain", "step_constrained"].iter().zip(&mut batches)
    {
        let mut next: Vec<TokenId> = vec![500; c];
        let mut steps = 0usize;
        group.bench_function(BenchmarkId::new(*which, c), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if steps.is_multiple_of(24) {
                        for &id in ids.iter() {
                            batch.reset(id).expect("reset");
                        }
                    }
                    steps += 1;
                    let t0 = Instant::now();
                    let logits = model
                        .forward_batch(&next, &positions, &slots, cache)
                        .expect("forward");
                    let out = batch.step(ids, logits).expect("step");
                    total += t0.elapsed();
                    for (n, t) in next.iter_mut().zip(out.tokens) {
                        *n = t.expect("a token");
                    }
                }
                total
            })
        });
    }
    let (_, _, cache) = &mut batches[0];
    let next: Vec<TokenId> = vec![500; c];
    group.bench_function(BenchmarkId::new("model", c), |b| {
        b.iter(|| {
            model
                .forward_batch(&next, &positions, &slots, cache)
                .expect("forward")
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
