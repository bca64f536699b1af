//! `serve`: continuous batching with a llama2.c model and one
//! [`SamplingBatch`]. A stream of requests (OpenAI-style sampling
//! parameters, each with its own seed) arrives at different steps; every
//! step runs one batched model pass over the live requests (each at its own
//! position, in its own slot of one KV cache: `Llama2::forward_batch`), whose
//! `[rows, vocab]` logits stay on the device, and samples all rows in one
//! call; a request leaves when it has its tokens, and its text is
//! printed. The tokens of each request are the same as running it alone
//! (`generate` with its parameters and seed).
//!
//! ```text
//! cargo run --release -p sampler-examples --bin serve -- --requests 12 --device flex
//! ```
//!
//! See `docs/serving.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use chain_config::SamplingParams;
use clap::Parser;
use sampler_backend::{RequestId, SamplingBatch};
use sampler_core::{Chain, OffloadPolicy, TokenId};
use sampler_examples::ban_words::BanWords;
use sampler_examples::llama2::generate::encode_prompt;
use sampler_examples::llama2::{BOS, EOS, Llama2, ModelFiles};

const DEFAULT_MODEL_DIRS: [&str; 2] = [
    "models/stories260K",
    concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K"),
];

/// Prompts the requests cycle through.
const PROMPTS: [&str; 6] = [
    "Once upon a time",
    "The little dog",
    "Lily wanted to",
    "One day, a big",
    "Tom and his mom",
    "In the park",
];

/// OpenAI-style sampling parameters the requests cycle through: different
/// stages, orders and parameters in one batch.
const PARAMS: [&str; 6] = [
    r#"{"temperature": 0.8, "top_k": 40, "top_p": 0.95}"#,
    r#"{"temperature": 0}"#,
    r#"{"temperature": 1.0, "min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": 0.3}"#,
    r#"{"temperature": 0.7, "typical_p": 0.9, "repetition_penalty": 1.2}"#,
    r#"{"mirostat": 2, "mirostat_tau": 4.0}"#,
    r#"{"temperature": 0.9, "top_k": 20, "xtc_probability": 0.5, "xtc_threshold": 0.1}"#,
];

/// Serve a stream of requests with continuous batching.
#[derive(Debug, Parser)]
#[command(name = "serve", version, about, long_about = None)]
struct Args {
    /// Model directory (llama2.c checkpoint + tokenizer). Default: models/stories260K.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Device for the model and the sampling: flex, ndarray, wgpu, vulkan,
    /// cuda, cuda:N (compiled-in backends only).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Offload policy: auto, off, device, or a number of stages.
    #[arg(long, default_value = "auto")]
    offload: String,
    /// Requests in the stream, at least 1.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u64).range(1..=4096))]
    requests: u64,
    /// A new request arrives every this many steps (0: all at once).
    #[arg(long, default_value_t = 3)]
    every: usize,
    /// Seed of request 0; request i uses seed + i.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Comma-separated words no request may write: a custom stage
    /// (`sampler_examples::ban_words`, Hugging Face `bad_words_ids`) put
    /// first in every request's chain, through `SamplingBatch::insert_chain`.
    #[arg(long, value_delimiter = ',')]
    ban_words: Vec<String>,
}

struct Live {
    index: usize,
    id: RequestId,
    /// Its slot in the batch KV cache.
    slot: usize,
    token: TokenId,
    pos: usize,
    prompt: Vec<TokenId>,
    tokens: Vec<TokenId>,
    max_tokens: usize,
    arrived: usize,
    chain: String,
}

fn run(a: Args) -> Result<(), String> {
    let policy: OffloadPolicy = a.offload.parse().map_err(|e| format!("--offload {e}"))?;
    let (device, policy) =
        sampler_backend::resolve_device(&a.device, policy).map_err(|e| e.to_string())?;
    let dir = match &a.model {
        Some(p) => p.clone(),
        None => DEFAULT_MODEL_DIRS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .ok_or("no model: pass --model DIR (models/stories260K is in the repository)")?,
    };
    let files = ModelFiles::locate(&dir, None).map_err(|e| e.to_string())?;
    let (ckpt, tokenizer) = files.load().map_err(|e| e.to_string())?;
    let model = Llama2::new(&ckpt, &device);
    let vocab = model.config().vocab_size;
    let seq_len = model.config().seq_len;
    let mut batch = SamplingBatch::new(vocab, &device, policy).map_err(|e| e.to_string())?;

    let n = a.requests as usize;
    let mut live: Vec<Live> = Vec::new();
    // One KV cache for every live request; slots are reused.
    let mut cache = model.new_batch_cache(4);
    let mut free: Vec<usize> = (0..4).rev().collect();
    let mut next = 0;
    let mut step = 0;
    let (mut rows_total, mut max_rows, mut bytes_total) = (0usize, 0usize, 0usize);
    let (mut model_time, mut sample_time) = (Duration::ZERO, Duration::ZERO);
    let mut failed = 0;
    while next < n || !live.is_empty() {
        // Arrivals: plan the request, run its prompt through the model.
        while next < n && step >= next * a.every {
            let i = next;
            next += 1;
            let params = SamplingParams::from_json_str(PARAMS[i % PARAMS.len()])
                .map_err(|e| format!("request {i}: {e}"))?;
            let mut cfg = params.to_chain().map_err(|e| format!("request {i}: {e}"))?;
            cfg.chain.seed = Some(a.seed + i as u64);
            // `min_tokens` without stop ids stops at the model's end of text.
            cfg.chain.fill_stop_ids(&[EOS, BOS]);
            let prompt = encode_prompt(&model, &tokenizer, PROMPTS[i % PROMPTS.len()])
                .map_err(|e| e.to_string())?;
            let history: Vec<TokenId> = prompt.iter().copied().filter(|&t| t != BOS).collect();
            let id = if a.ban_words.is_empty() {
                batch.insert(cfg.chain.clone(), &history)
            } else {
                let words: Vec<&str> = a.ban_words.iter().map(String::as_str).collect();
                let built = sampler_cpu::build_chain(&cfg.chain).map_err(|e| e.to_string())?;
                let mut stages: Vec<Box<dyn sampler_core::Sampler>> =
                    vec![Box::new(BanWords::from_words(&tokenizer, &words))];
                stages.extend(built.stages().iter().cloned());
                batch.insert_chain(Chain::new(stages, Some(built.seed())), None, &history)
            }
            .map_err(|e| format!("request {i}: {e}"))?;
            let slot = match free.pop() {
                Some(s) => s,
                None => {
                    let s = cache.slots();
                    model.grow_batch_cache(&mut cache, 2 * s.max(4));
                    free.extend((s + 1..cache.slots()).rev());
                    s
                }
            };
            // The prompt (but its last token) in one batched pass.
            let last = prompt.len() - 1;
            if last > 0 {
                let positions: Vec<usize> = (0..last).collect();
                drop(
                    model
                        .forward_batch(&prompt[..last], &positions, &vec![slot; last], &mut cache)
                        .map_err(|e| e.to_string())?,
                );
            }
            live.push(Live {
                index: i,
                id,
                slot,
                token: prompt[last],
                pos: last,
                prompt,
                tokens: Vec::new(),
                max_tokens: 16 + (i * 7) % 32,
                arrived: step,
                chain: if a.ban_words.is_empty() {
                    cfg.chain.chain_string()
                } else {
                    format!("ban_words;{}", cfg.chain.chain_string())
                },
            });
        }
        if live.is_empty() {
            step += 1;
            continue;
        }
        // One batched model pass for every live request (each at its own
        // position, in its own cache slot), one sampling call for all rows.
        let t0 = Instant::now();
        let tokens: Vec<TokenId> = live.iter().map(|r| r.token).collect();
        let positions: Vec<usize> = live.iter().map(|r| r.pos).collect();
        let slots: Vec<usize> = live.iter().map(|r| r.slot).collect();
        let logits = model
            .forward_batch(&tokens, &positions, &slots, &mut cache)
            .map_err(|e| e.to_string())?; // [rows, vocab], on the device
        let ids: Vec<RequestId> = live.iter().map(|r| r.id).collect();
        let t1 = Instant::now();
        let out = batch.step(&ids, logits).map_err(|e| e.to_string())?;
        let t2 = Instant::now();
        model_time += t1 - t0;
        sample_time += t2 - t1;
        rows_total += ids.len();
        max_rows = max_rows.max(ids.len());
        bytes_total += out.bytes_read;

        let mut done = Vec::new();
        for (k, (r, t)) in live.iter_mut().zip(out.tokens).enumerate() {
            let stop = match t {
                Ok(t) => {
                    r.tokens.push(t);
                    r.token = t;
                    r.pos += 1;
                    if t == BOS || t == EOS {
                        Some("end_of_text")
                    } else if r.tokens.len() >= r.max_tokens {
                        Some("length")
                    } else if r.pos >= seq_len {
                        Some("context")
                    } else {
                        None
                    }
                }
                Err(e) => {
                    eprintln!("request {}: step {step}: {e}", r.index);
                    failed += 1;
                    Some("error")
                }
            };
            if let Some(why) = stop {
                done.push((k, why));
            }
        }
        for &(k, why) in done.iter().rev() {
            let r = live.remove(k);
            batch.remove(r.id).map_err(|e| e.to_string())?;
            free.push(r.slot);
            let mut all = r.prompt.clone();
            all.extend(&r.tokens);
            println!(
                "[request {:>2}] steps {}..{} ({why}), {} tokens, {}: {}",
                r.index,
                r.arrived,
                step,
                r.tokens.len(),
                r.chain,
                tokenizer.decode(&all).trim()
            );
        }
        step += 1;
    }
    let steps = step.max(1);
    eprintln!(
        "{n} requests on {} (offload {policy}): {step} steps, {:.1} rows/step on average, at most {max_rows}",
        a.device,
        rows_total as f64 / steps as f64
    );
    eprintln!(
        "model {:.1} ms, sampling {:.1} ms ({:.1} us per row), {} bytes read back ({:.1} per row)",
        model_time.as_secs_f64() * 1e3,
        sample_time.as_secs_f64() * 1e3,
        sample_time.as_secs_f64() * 1e6 / rows_total.max(1) as f64,
        bytes_total,
        bytes_total as f64 / rows_total.max(1) as f64
    );
    if failed > 0 {
        return Err(format!("{failed} requests failed"));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
