//! `serve`: continuous batching with one [`SamplingBatch`] and one batched
//! model pass per step. Requests (each with its own prompt, sampling chain,
//! seed and length) arrive at different steps; every step runs one
//! `Llama2::forward_batch` over the live requests (new requests' prompts,
//! in chunks of at most `--prefill-budget` tokens, the others' last token,
//! each sequence in its own slot of one KV cache), whose `[rows, vocab]`
//! logits stay on the device, and samples every request's row in one call;
//! a request leaves when it stops, and its output is printed. A request's
//! sampling is the same as running it alone, and so are its tokens up to
//! the model's floating-point rounding (docs/serving.md).
//!
//! Models: a llama2.c checkpoint directory (default `models/stories260K`)
//! or a Llama-architecture GGUF file (`--model FILE.gguf`, e.g.
//! SmolLM2-135M-Instruct, whose requests may be chat `messages`).
//! Requests: a built-in stream of mixed parameters (`--requests N`), a
//! JSON-lines file (`--requests-file FILE.jsonl`, format in
//! `sampler_examples::requests`), one JSON line out per request, or an
//! OpenAI-compatible HTTP server (`--http ADDR`, see [`http`]).
//!
//! ```text
//! cargo run --release -p sampler-examples --bin serve -- --requests 12 --device flex
//! cargo run --release -p sampler-examples --bin serve -- --model smollm2.gguf --requests-file requests.jsonl
//! cargo run --release -p sampler-examples --bin serve -- --http 127.0.0.1:8080
//! ```
//!
//! See `docs/serving.md`.

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use burn_tensor::{Int, Tensor, TensorData};
use chain_config::SamplingParams;
use clap::Parser;
use sampler_backend::{Draft, RequestId, SamplingBatch};
use sampler_core::logprobs::Logprobs;
use sampler_core::{Chain, ChainSpec, OffloadPolicy, TokenId};
use sampler_examples::ban_words::BanWords;
use sampler_examples::chat::ChatTokenizer;
use sampler_examples::gguf::{Gguf, is_gguf, llama_checkpoint};
use sampler_examples::llama2::generate::{BeamFamily, BeamHost, GenerateError, TextCodec};
use sampler_examples::llama2::{Llama2, ModelFiles, Tokenizer};
use sampler_examples::ngram::NgramDrafter;
use sampler_examples::report::logprobs_json;
use sampler_examples::requests::{Prompt, parse_request};
use sampler_examples::stop::TextStream;
use serde_json::{Value, json};

mod http;
mod inspect;

const DEFAULT_MODEL_DIRS: [&str; 2] = [
    "models/stories260K",
    concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K"),
];

/// Prompts the built-in stream cycles through.
const PROMPTS: [&str; 6] = [
    "Once upon a time",
    "The little dog",
    "Lily wanted to",
    "One day, a big",
    "Tom and his mom",
    "In the park",
];

/// OpenAI-style sampling parameters the built-in stream cycles through:
/// different stages, orders and parameters in one batch.
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
    /// Model: a llama2.c directory (checkpoint + tokenizer) or a GGUF file
    /// (*.gguf). Default: models/stories260K.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Context of a GGUF model in tokens (the KV cache per sequence), at
    /// least 1; capped by the model's own.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    context: u64,
    /// Device for the model and the sampling: flex, ndarray, wgpu, vulkan,
    /// cuda, cuda:N (compiled-in backends only).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Offload policy: auto, off, device, or a number of stages.
    #[arg(long, default_value = "auto")]
    offload: String,
    /// Requests of the built-in stream (mixed prompts and parameters), at
    /// least 1. Default 12 when no --requests-file is given.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096), conflicts_with = "requests_file")]
    requests: Option<u64>,
    /// Requests as JSON lines (`-`: standard input), one OpenAI-style
    /// completion body per line: `prompt` or `messages`, `max_tokens`,
    /// `seed`, `arrival` (step), and the sampling chain as flat keys
    /// (`temperature`, `top_p`, ...), `toml` or `chain`. Prints one JSON
    /// line per request.
    #[arg(long, value_name = "FILE.jsonl", conflicts_with = "http")]
    requests_file: Option<PathBuf>,
    /// Serve the OpenAI API over HTTP on this address (e.g.
    /// 127.0.0.1:8080): /v1/completions, /v1/chat/completions, /v1/models,
    /// /health. Stops on Ctrl-C after the running requests finish.
    #[arg(long, value_name = "ADDR", conflicts_with = "requests")]
    http: Option<std::net::SocketAddr>,
    /// HTTP: requests waiting or running at most; one more is answered
    /// 429.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    max_queue: u64,
    /// HTTP: refuse request fields the server does not know (400), instead
    /// of ignoring them as OpenAI does.
    #[arg(long)]
    strict: bool,
    /// Built-in stream: a new request arrives every this many steps (0:
    /// all at once).
    #[arg(long, default_value_t = 3, conflicts_with = "requests_file")]
    every: usize,
    /// Built-in stream: seed of request 0; request i uses seed + i.
    #[arg(long, default_value_t = 42, conflicts_with = "requests_file")]
    seed: u64,
    /// At most this many requests generate at once; the others wait for
    /// one to finish.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    concurrency: u64,
    /// Prompt tokens the model takes per step, at least 1: a longer prompt
    /// (or several) is processed in chunks over several steps, beside the
    /// other requests' decoding rows.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    prefill_budget: u64,
    /// One JSON line per request on stdout (always with --requests-file).
    #[arg(long)]
    json: bool,
    /// Comma-separated words no request may write: a custom stage
    /// (`sampler_examples::ban_words`, Hugging Face `bad_words_ids`) put
    /// first in every request's chain, through `SamplingBatch::insert_chain`.
    #[arg(long, value_delimiter = ',')]
    ban_words: Vec<String>,
}

/// The model's tokenizer: llama2.c's, or a GGUF chat model's.
enum Codec {
    Llama2(Tokenizer),
    Chat(Box<ChatTokenizer>),
}

impl Codec {
    fn text(&self) -> &dyn TextCodec {
        match self {
            Codec::Llama2(t) => t,
            Codec::Chat(t) => t.as_ref(),
        }
    }

    /// The prompt's ids: llama2.c adds BOS and its dummy space; a GGUF
    /// model's text is encoded as it is (BOS alone for an empty prompt), its
    /// messages through the chat template.
    fn encode(&self, prompt: &Prompt) -> Result<Vec<TokenId>, String> {
        match (self, prompt) {
            (Codec::Llama2(t), Prompt::Text(p)) => Ok(t.encode(p, true, false)),
            // No chat template in a llama2.c checkpoint: ChatML, as
            // llama.cpp's server falls back to.
            (Codec::Llama2(t), Prompt::Messages(m)) => Ok(t.encode(&chatml(m), true, false)),
            (Codec::Chat(t), Prompt::Text(p)) if p.is_empty() => Ok(vec![t.bos]),
            (Codec::Chat(t), Prompt::Text(p)) => t.encode(p).map_err(|e| e.to_string()),
            (Codec::Chat(t), Prompt::Messages(m)) => t
                .apply_chat_template(m, true)
                .and_then(|text| t.encode(&text))
                .map_err(|e| e.to_string()),
        }
    }

    /// A stage banning `words` at the start of the text and after a space.
    fn ban_words(&self, words: &[&str]) -> Result<BanWords, String> {
        match self {
            Codec::Llama2(t) => Ok(BanWords::from_words(t, words)),
            Codec::Chat(t) => {
                let mut seqs = Vec::new();
                for w in words.iter().map(|w| w.trim()).filter(|w| !w.is_empty()) {
                    seqs.push(t.encode(w).map_err(|e| e.to_string())?);
                    seqs.push(t.encode(&format!(" {w}")).map_err(|e| e.to_string())?);
                }
                seqs.sort();
                seqs.dedup();
                Ok(BanWords::new(seqs))
            }
        }
    }
}

/// Messages in ChatML, the assistant's turn opened: the chat format of a
/// model without a template of its own.
fn chatml(messages: &[sampler_examples::chat::Message]) -> String {
    let mut text = String::new();
    for m in messages {
        text.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    text.push_str("<|im_start|>assistant\n");
    text
}

fn load(a: &Args, device: &burn_tensor::Device) -> Result<(Llama2, Codec), String> {
    let path = match &a.model {
        Some(p) => p.clone(),
        None => DEFAULT_MODEL_DIRS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .ok_or(
                "no model: pass --model DIR or FILE.gguf (models/stories260K is in the repository)",
            )?,
    };
    if is_gguf(&path) {
        let g = Gguf::read(&path).map_err(|e| e.to_string())?;
        let ckpt = llama_checkpoint(&g, a.context as usize).map_err(|e| e.to_string())?;
        let chat = ChatTokenizer::from_gguf(&g).map_err(|e| e.to_string())?;
        return Ok((Llama2::new(&ckpt, device), Codec::Chat(Box::new(chat))));
    }
    let files = ModelFiles::locate(&path, None).map_err(|e| e.to_string())?;
    let (ckpt, tokenizer) = files.load().map_err(|e| e.to_string())?;
    Ok((Llama2::new(&ckpt, device), Codec::Llama2(tokenizer)))
}

/// A request as read: its prompt (or why it cannot run), chain and length.
struct Job {
    index: usize,
    /// Where it came from, for errors: `FILE:LINE` or `request N`.
    origin: String,
    id: Value,
    parsed: Result<(Prompt, ChainSpec), String>,
    max_tokens: usize,
    arrival: usize,
    stop: Vec<TokenId>,
    /// Stop strings and `include_stop_str_in_output`.
    stop_strings: Vec<String>,
    include_stop_str: bool,
    /// Speculative decoding (the request's `speculative`).
    speculative: Option<chain_config::SpeculativeConfig>,
    /// Structured output (`response_format`, `guided_*`, `[structured]`).
    structured: Option<sampler_core::StructuredOutput>,
    /// Where its events go (HTTP requests); `None`: printed at the end.
    sink: Option<http::Sink>,
    /// Refuse it when the prompt and `max_tokens` do not fit the context
    /// (HTTP requests that give `max_tokens`); otherwise it stops there.
    fit_context: bool,
    /// Choices (`n`): the request forks into `n` sequences once its prompt
    /// is through the model.
    n: usize,
    /// Beam search instead of sampling (`num_beams` > 1).
    beam: Option<sampler_core::BeamSpec>,
}

impl Job {
    /// A job from a parsed request.
    fn new(index: usize, origin: String, r: sampler_examples::requests::Request) -> Self {
        Job {
            index,
            origin,
            id: r.id,
            parsed: Ok((r.prompt, r.config.chain)),
            max_tokens: r.max_tokens,
            arrival: r.arrival,
            stop: r.stop_ids,
            stop_strings: r.stop_strings,
            include_stop_str: r.include_stop_str,
            speculative: r.config.speculative,
            structured: r.config.structured,
            sink: None,
            fit_context: false,
            n: r.n,
            beam: r.config.sequences.beam,
        }
    }

    /// A job that fails with `error` when it is admitted.
    fn failed(index: usize, origin: String, id: Value, error: String) -> Self {
        Job {
            index,
            origin,
            id,
            parsed: Err(error),
            max_tokens: 1,
            arrival: 0,
            stop: Vec::new(),
            stop_strings: Vec::new(),
            include_stop_str: false,
            speculative: None,
            structured: None,
            sink: None,
            fit_context: false,
            n: 1,
            beam: None,
        }
    }
}

/// The built-in stream: prompts and parameters cycled, request i arriving
/// at step `i * every` with seed `seed + i`.
fn builtin_jobs(a: &Args) -> Vec<Job> {
    let n = a.requests.unwrap_or(12) as usize;
    (0..n)
        .map(|i| {
            let parsed = SamplingParams::from_json_str(PARAMS[i % PARAMS.len()])
                .and_then(|p| p.to_chain())
                .map(|cfg| {
                    let mut chain = cfg.chain;
                    chain.seed = Some(a.seed.wrapping_add(i as u64));
                    (Prompt::Text(PROMPTS[i % PROMPTS.len()].into()), chain)
                })
                .map_err(|e| e.to_string());
            Job {
                max_tokens: 16 + (i * 7) % 32,
                arrival: i.saturating_mul(a.every),
                parsed,
                ..Job::failed(i, format!("request {i}"), Value::from(i), String::new())
            }
        })
        .collect()
}

/// Requests from a JSON-lines file; a bad line (not UTF-8, not a valid
/// request) is a job that fails with its error (the other requests run).
fn file_jobs(path: &Path) -> Result<Vec<Job>, String> {
    let mut reader: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut jobs = Vec::new();
    let mut bytes = Vec::new();
    for n in 1.. {
        bytes.clear();
        let read = reader
            .read_until(b'\n', &mut bytes)
            .map_err(|e| format!("{}:{n}: {e}", path.display()))?;
        if read == 0 {
            break;
        }
        let origin = format!("{}:{n}", path.display());
        let index = jobs.len();
        let line = match std::str::from_utf8(&bytes) {
            Ok(l) if l.trim().is_empty() => continue,
            Ok(l) => l,
            Err(e) => {
                let error = format!("{origin}: not UTF-8: {e}");
                jobs.push(Job::failed(index, origin, Value::from(index), error));
                continue;
            }
        };
        jobs.push(match parse_request(line, index) {
            Ok(r) => Job::new(index, origin, r),
            Err(e) => {
                // The line's own `id` when it has one, for the error line.
                let id = serde_json::from_str::<Value>(line)
                    .ok()
                    .and_then(|v| v.get("id").cloned())
                    .unwrap_or(Value::from(index));
                let error = format!("{origin}: {e}");
                Job::failed(index, origin, id, error)
            }
        });
    }
    if jobs.is_empty() {
        return Err(format!("{}: no requests in the file", path.display()));
    }
    Ok(jobs)
}

#[derive(Clone)]
struct Live {
    index: usize,
    /// Which of the request's `n` choices this sequence is (0: the request
    /// itself), and `n`.
    choice: usize,
    n: usize,
    /// The request forks into its other choices when its prompt is through.
    fork_pending: bool,
    id: Value,
    rid: RequestId,
    /// Its slot in the batch KV cache.
    slot: usize,
    /// Prompt tokens already through the model.
    prefilled: usize,
    /// The next token to feed, and its position (once the prompt is in).
    token: TokenId,
    pos: usize,
    prompt: Vec<TokenId>,
    tokens: Vec<TokenId>,
    logprobs: Vec<Option<Logprobs>>,
    wants_logprobs: bool,
    max_tokens: usize,
    /// The model's stop tokens and the request's `stop_token_ids`.
    stop: Vec<TokenId>,
    arrival: usize,
    started: usize,
    chain: String,
    seed: Option<u64>,
    /// The request's drafter, when it asked for speculative decoding.
    drafter: Option<NgramDrafter>,
    /// Drafts proposed and accepted so far.
    drafted: (usize, usize),
    /// The generated text and its stop strings.
    text: TextStream,
    /// Why it stopped, beyond the finish reason: the stop string matched or
    /// the stop token sampled (vLLM's `stop_reason`).
    stop_reason: Value,
    /// Where its events go (HTTP requests).
    sink: Option<http::Sink>,
    /// Beam search: its settings until the prompt is through, then the
    /// search (which owns the request's batch entries and cache slots).
    beam: Option<sampler_cpu::beam::BeamParams>,
    family: Option<BeamFamily>,
    /// A finished beam search's sequences, best first.
    hypotheses: Vec<sampler_cpu::beam::Hypothesis>,
}

impl Live {
    /// Record a generated token (with its logprobs); the reason the request
    /// ends there, if it does.
    fn emit(
        &mut self,
        codec: &dyn TextCodec,
        tok: TokenId,
        lp: Option<Logprobs>,
        seq_len: usize,
    ) -> Option<String> {
        // The first token after the prompt goes at its end.
        self.pos = if self.tokens.is_empty() {
            self.prompt.len()
        } else {
            self.pos + 1
        };
        let prev = self.tokens.last().copied().or(self.prompt.last().copied());
        self.tokens.push(tok);
        let stop_token = self.stop.contains(&tok);
        // A stop token adds no text.
        let bytes = if stop_token {
            Vec::new()
        } else {
            codec.piece_bytes(prev, tok)
        };
        let delta = self.text.push(&bytes);
        if let Some(sink) = &self.sink {
            sink.token(codec, &delta.text, lp.as_ref());
        }
        self.logprobs.push(lp);
        self.token = tok;
        if let Some(s) = delta.stop {
            self.stop_reason = Value::from(s);
            Some("stop".to_string())
        } else if stop_token {
            self.stop_reason = Value::from(tok);
            Some("stop".to_string())
        } else if self.tokens.len() >= self.max_tokens {
            Some("length".into())
        } else if self.pos + 1 >= seq_len {
            // Prompt and generated tokens fill the context.
            Some("context".into())
        } else {
            None
        }
    }
}

/// What the run printed and measured.
#[derive(Default)]
struct Totals {
    steps: usize,
    rows: usize,
    max_rows: usize,
    max_sampled: usize,
    bytes: usize,
    generated: usize,
    model: Duration,
    sampling: Duration,
    failed: usize,
}

/// A free slot of `cache` (it grows when none is free, doubling up to
/// `max_slots`, then one at a time).
fn alloc_slot(
    model: &Llama2,
    cache: &mut sampler_examples::llama2::BatchKvCache,
    free: &mut Vec<usize>,
    max_slots: usize,
) -> usize {
    match free.pop() {
        Some(s) => s,
        None => {
            let s = cache.slots();
            let grown = (2 * s).clamp(s + 1, max_slots.max(s + 1));
            model.grow_batch_cache(cache, grown);
            free.extend((s + 1..cache.slots()).rev());
            s
        }
    }
}

/// The server's batch and cache as a beam search's [`BeamHost`].
struct ServerBeams<'a> {
    model: &'a Llama2,
    batch: &'a mut SamplingBatch,
    cache: &'a mut sampler_examples::llama2::BatchKvCache,
    free: &'a mut Vec<usize>,
    max_slots: usize,
}

impl BeamHost for ServerBeams<'_> {
    fn batch(&mut self) -> &mut SamplingBatch {
        self.batch
    }
    fn alloc_slot(&mut self) -> Result<usize, GenerateError> {
        Ok(alloc_slot(
            self.model,
            self.cache,
            self.free,
            self.max_slots,
        ))
    }
    fn free_slot(&mut self, slot: usize) {
        self.free.push(slot);
    }
    fn copy_slot(&mut self, from: usize, to: usize) -> Result<(), GenerateError> {
        Ok(self.model.copy_slot(self.cache, from, to)?)
    }
}

struct Server<'a> {
    model: &'a Llama2,
    codec: &'a Codec,
    batch: SamplingBatch,
    cache: sampler_examples::llama2::BatchKvCache,
    /// Slots the cache may grow to (the concurrency).
    max_slots: usize,
    free: Vec<usize>,
    prefill_budget: usize,
    ban: Option<BanWords>,
    json: bool,
    /// Finished choices of requests with `n > 1`, by request index, until
    /// the last one ends.
    choices: std::collections::HashMap<usize, Vec<Value>>,
    /// The grammar engine's view of the tokenizer, built at the first
    /// request with structured output.
    grammar: Option<std::sync::Arc<sampler_structured::TokenizerView>>,
}

impl Server<'_> {
    /// A free cache slot (the cache grows when none is free).
    fn alloc_slot(&mut self) -> usize {
        alloc_slot(self.model, &mut self.cache, &mut self.free, self.max_slots)
    }

    /// The parts a beam search works with.
    fn beam_host(&mut self) -> ServerBeams<'_> {
        ServerBeams {
            model: self.model,
            batch: &mut self.batch,
            cache: &mut self.cache,
            free: &mut self.free,
            max_slots: self.max_slots,
        }
    }

    /// Fork live request `k` into its other choices: `SamplingBatch::fork`,
    /// a cache slot each with a copy of the parent's keys and values (its
    /// prompt, just through the model); the children sample from the
    /// parent's row `row` in this step.
    fn fork(
        &mut self,
        live: &mut Vec<Live>,
        k: usize,
        row: usize,
        take: &mut Vec<(usize, usize)>,
    ) -> Result<(), String> {
        live[k].fork_pending = false;
        let n = live[k].n;
        let ids = self
            .batch
            .fork(live[k].rid, n - 1)
            .map_err(|e| e.to_string())?;
        for (i, rid) in ids.into_iter().enumerate() {
            let slot = self.alloc_slot();
            self.model
                .copy_slot(&mut self.cache, live[k].slot, slot)
                .map_err(|e| e.to_string())?;
            let mut child = live[k].clone();
            child.rid = rid;
            child.slot = slot;
            child.choice = i + 1;
            child.seed = self.batch.spec(rid).and_then(|s| s.seed);
            child.sink = child.sink.map(|s| s.choice(i + 1));
            live.push(child);
            take.push((live.len() - 1, row));
        }
        Ok(())
    }

    /// Put a job into the batch and give it a cache slot.
    fn admit(&mut self, job: Job, step: usize) -> Result<Live, String> {
        let origin = job.origin;
        let fail = |e: String| format!("{origin}: {e}");
        let (prompt, mut spec) = job.parsed?;
        if job.beam.is_some() {
            spec = sampler_examples::llama2::generate::beam_chain(&spec)
                .map_err(|e| fail(e.to_string()))?;
            let refuse = |what: &str| {
                fail(format!(
                    "beam search with {what}: not supported (beam search returns each sequence's sum of logprobs; its end is the model's end-of-text or `stop_token_ids`)"
                ))
            };
            if job.speculative.is_some() {
                return Err(refuse("speculative decoding"));
            }
            if job.structured.is_some() {
                return Err(refuse("structured output"));
            }
            if spec.logprobs.is_some() {
                return Err(refuse("per-token logprobs"));
            }
            if !job.stop_strings.is_empty() {
                return Err(refuse("stop strings"));
            }
            if job.sink.is_some() {
                return Err(refuse("the HTTP API"));
            }
        }
        if let (Some(_), Some(s)) = (&job.speculative, &job.structured) {
            return Err(fail(format!(
                "`speculative` with structured output ({}): not supported (drafts are not checked against the grammar)",
                s.kind()
            )));
        }
        // The request's matcher, before anything else is set up for it: a
        // bad schema, regex or grammar refuses the request alone.
        let constraint = match &job.structured {
            None => None,
            Some(s) => {
                let vocab = self.model.config().vocab_size;
                let view = match &self.grammar {
                    Some(v) => v.clone(),
                    None => {
                        let v = std::sync::Arc::new(
                            sampler_examples::structured::view(self.codec.text(), vocab)
                                .map_err(|e| fail(e.to_string()))?,
                        );
                        self.grammar = Some(v.clone());
                        v
                    }
                };
                Some(
                    sampler_examples::structured::matcher(&view, s)
                        .map_err(|e| fail(format!("structured output: {e}")))?,
                )
            }
        };
        let drafter = match job.speculative {
            Some(sp) => Some(
                NgramDrafter::new(
                    sp.prompt_lookup_min,
                    sp.prompt_lookup_max,
                    sp.num_speculative_tokens,
                )
                .map_err(fail)?,
            ),
            None => None,
        };

        let prompt = self.codec.encode(&prompt).map_err(fail)?;
        let c = self.model.config();
        if prompt.is_empty() {
            return Err(fail("the prompt encodes to no tokens".into()));
        }
        // `--context` sets a GGUF model's; a llama2.c checkpoint has its own.
        let flag = if matches!(self.codec, Codec::Chat(_)) {
            "; --context"
        } else {
            ""
        };
        if prompt.len() > c.seq_len {
            return Err(fail(format!(
                "the prompt has {} tokens, more than the context ({}{flag})",
                prompt.len(),
                c.seq_len
            )));
        }
        if prompt.len() == c.seq_len {
            return Err(fail(format!(
                "the prompt has {} tokens, the whole context ({}{flag}): no room to generate",
                prompt.len(),
                c.seq_len
            )));
        }
        if job.fit_context && prompt.len() + job.max_tokens > c.seq_len {
            return Err(fail(format!(
                "the prompt has {} tokens and max_tokens asks for {} more: more than the context ({} tokens{flag})",
                prompt.len(),
                job.max_tokens,
                c.seq_len
            )));
        }
        // A bias for a token the model does not have would fail every
        // step of this request: refused before it starts.
        for st in &spec.stages {
            if let sampler_core::StageSpec::LogitBias { bias } = st
                && let Some(&(t, _)) = bias.iter().find(|&&(t, _)| t as usize >= c.vocab_size)
            {
                return Err(fail(format!(
                    "`logit_bias`: token id {t} is outside the model's vocabulary (0..{})",
                    c.vocab_size
                )));
            }
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(fail(format!(
                "prompt token {t} is outside the model's vocabulary (0..{})",
                c.vocab_size
            )));
        }
        let model_stops = self.codec.text().stop_ids();
        // `min_tokens` holds off the model's end-of-text tokens too, beside
        // the request's own stop ids.
        for s in &mut spec.stages {
            if let sampler_core::StageSpec::MinTokens { stop, .. } = s {
                for &t in &model_stops {
                    if !stop.contains(&t) {
                        stop.push(t);
                    }
                }
            }
        }
        let min_tokens = spec
            .stages
            .iter()
            .filter_map(|s| match s {
                sampler_core::StageSpec::MinTokens { n, .. } => Some(*n),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let text = TextStream::new(job.stop_strings, job.include_stop_str, min_tokens)
            .map_err(|e| fail(e.to_string()))?;
        let mut stop = model_stops;
        for t in job.stop {
            if !stop.contains(&t) {
                stop.push(t);
            }
        }
        // Penalty-style stages see the prompt as history (BOS excluded).
        let bos = self.codec.text().bos();
        let history: Vec<TokenId> = prompt.iter().copied().filter(|&t| Some(t) != bos).collect();
        let wants_logprobs = spec.logprobs.is_some();
        let (rid, chain) = match &self.ban {
            None => (
                self.batch.insert(spec.clone(), &history),
                spec.chain_string(),
            ),
            Some(ban) => {
                let built = sampler_cpu::build_chain(&spec).map_err(|e| fail(e.to_string()))?;
                let mut stages: Vec<Box<dyn sampler_core::Sampler>> = vec![Box::new(ban.clone())];
                stages.extend(built.stages().iter().cloned());
                (
                    self.batch.insert_chain(
                        Chain::new(stages, Some(built.seed())),
                        spec.logprobs.clone(),
                        &history,
                    ),
                    format!("ban_words;{}", spec.chain_string()),
                )
            }
        };
        let rid = rid.map_err(|e| fail(e.to_string()))?;
        if constraint.is_some()
            && let Err(e) = self.batch.set_constraint(rid, constraint)
        {
            let _ = self.batch.remove(rid);
            return Err(fail(e.to_string()));
        }
        let slot = self.alloc_slot();
        let seed = self.batch.spec(rid).and_then(|s| s.seed);
        let beam = job.beam.map(|b| sampler_cpu::beam::BeamParams {
            num_beams: b.num_beams,
            num_return_sequences: b.num_return_sequences,
            length_penalty: b.length_penalty,
            early_stopping: b.early_stopping,
            eos: stop.clone(),
            max_new_tokens: job.max_tokens,
        });
        Ok(Live {
            index: job.index,
            choice: 0,
            n: job.n,
            fork_pending: job.n > 1,
            id: job.id,
            rid,
            slot,
            prefilled: 0,
            token: 0,
            pos: 0,
            prompt,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            wants_logprobs,
            max_tokens: job.max_tokens,
            stop,
            arrival: job.arrival,
            started: step,
            chain,
            seed,
            drafter,
            drafted: (0, 0),
            text,
            stop_reason: Value::Null,
            sink: job.sink,
            beam,
            family: None,
            hypotheses: Vec::new(),
        })
    }

    /// One step: one batched model pass over the live requests (a chunk of
    /// each unfinished prompt within the prefill budget, every other
    /// request's last token), one sampling call over the requests with a
    /// row to sample; returns each live request's stop reason (or none).
    fn step(
        &mut self,
        live: &mut Vec<Live>,
        step: usize,
        t: &mut Totals,
    ) -> Result<Vec<Option<String>>, String> {
        let (mut tokens, mut positions, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        // (live request, its row in the pass) for the requests sampled now.
        let mut take: Vec<(usize, usize)> = Vec::with_capacity(live.len());
        // (live request, its first row, its drafts) for the requests that
        // verify drafts now: the last token and the drafts, `k + 1` rows.
        let mut drafted: Vec<(usize, usize, Vec<TokenId>)> = Vec::new();
        // (live request, its first row, rows) for the beam searches: one
        // row per running beam, or the prompt's last row at the first step.
        let mut beamed: Vec<(usize, usize, usize)> = Vec::new();
        let mut beam_errors: Vec<(usize, String)> = Vec::new();
        let seq_len = self.model.config().seq_len;
        let mut budget = self.prefill_budget;
        for (k, r) in live.iter_mut().enumerate() {
            if let Some(f) = &r.family {
                let first = tokens.len();
                for (tok, slot) in f.rows() {
                    tokens.push(tok);
                    positions.push(f.pos());
                    slots.push(slot);
                }
                beamed.push((k, first, tokens.len() - first));
                continue;
            }
            if r.prefilled < r.prompt.len() {
                if budget == 0 {
                    continue;
                }
                let end = (r.prefilled + budget).min(r.prompt.len());
                budget -= end - r.prefilled;
                tokens.extend(&r.prompt[r.prefilled..end]);
                positions.extend(r.prefilled..end);
                slots.extend(std::iter::repeat_n(r.slot, end - r.prefilled));
                r.prefilled = end;
                if end < r.prompt.len() {
                    continue;
                }
                if let Some(params) = r.beam.take() {
                    // The prompt is through: the search starts from its
                    // last row, and owns the request and its slot from now.
                    let last = r.prompt.len() - 1;
                    match BeamFamily::new(r.rid, r.slot, r.prompt[last], last, seq_len, params) {
                        Ok(f) => {
                            r.family = Some(f);
                            beamed.push((k, tokens.len() - 1, 1));
                        }
                        Err(e) => beam_errors.push((k, e.to_string())),
                    }
                    continue;
                }
            } else {
                if let Some(d) = &r.drafter
                    && !r.tokens.is_empty()
                {
                    let mut context = r.prompt.clone();
                    context.extend(&r.tokens);
                    let mut drafts = d.propose(&context);
                    let room = (r.max_tokens - r.tokens.len() - 1).min(seq_len - 1 - r.pos);
                    drafts.truncate(room);
                    if !drafts.is_empty() {
                        drafted.push((k, tokens.len(), drafts.clone()));
                        tokens.push(r.token);
                        tokens.extend(&drafts);
                        positions.extend(r.pos..=r.pos + drafts.len());
                        slots.extend(std::iter::repeat_n(r.slot, drafts.len() + 1));
                        continue;
                    }
                }
                tokens.push(r.token);
                positions.push(r.pos);
                slots.push(r.slot);
            }
            take.push((k, tokens.len() - 1));
        }
        let t0 = Instant::now();
        let mut logits = self
            .model
            .forward_batch(&tokens, &positions, &slots, &mut self.cache)
            .map_err(|e| format!("step {step}: model: {e}"))?; // [rows, vocab], on the device
        t.rows += tokens.len();
        t.max_rows = t.max_rows.max(tokens.len());
        // Requests with `n` choices whose prompt is through: fork now, the
        // children sampling from the parent's row.
        let mut fork_errors = Vec::new();
        let pending: Vec<(usize, usize)> = take
            .iter()
            .copied()
            .filter(|&(k, _)| live[k].fork_pending)
            .collect();
        for (k, row) in pending {
            if let Err(e) = self.fork(live, k, row, &mut take) {
                fork_errors.push((k, e));
            }
        }
        let mut reasons = vec![None; live.len()];
        for (k, e) in fork_errors {
            reasons[k] = Some(format!("error: step {step}: fork: {e}"));
            take.retain(|&(j, _)| j != k);
        }
        for (k, e) in beam_errors {
            reasons[k] = Some(format!("error: step {step}: beam search: {e}"));
        }
        if take.is_empty() && drafted.is_empty() && beamed.is_empty() {
            // Only prompt chunks this step: nothing to sample yet.
            t.model += t0.elapsed();
            return Ok(reasons);
        }
        let device = self.model.device().clone();
        let pick = |logits: &Tensor<2>, rows: Vec<i64>| {
            let n = rows.len();
            logits.clone().select(
                0,
                Tensor::<1, Int>::from_data(TensorData::new(rows, [n]), &device),
            )
        };
        let t1 = Instant::now();
        t.model += t1 - t0;
        for &(k, first, count) in &beamed {
            let rows = pick(&logits, (first..first + count).map(|r| r as i64).collect());
            let Some(f) = live[k].family.as_mut() else {
                continue;
            };
            match f.advance(&mut self.beam_host(), rows, step) {
                Ok((bytes, _)) => {
                    t.bytes += bytes;
                    t.generated += count;
                    if f.is_done() {
                        reasons[k] = Some("beam".into());
                    }
                }
                Err(e) => reasons[k] = Some(format!("error: step {step}: beam search: {e}")),
            }
        }
        if !drafted.is_empty() {
            let rows: Vec<i64> = drafted
                .iter()
                .flat_map(|(_, first, d)| (*first..=first + d.len()).map(|r| r as i64))
                .collect();
            let drafts: Vec<Draft> = drafted
                .iter()
                .map(|(k, _, d)| Draft {
                    id: live[*k].rid,
                    tokens: d.clone(),
                    probs: None,
                })
                .collect();
            let out = self
                .batch
                .verify(&drafts, pick(&logits, rows))
                .map_err(|e| format!("step {step}: verification: {e}"))?;
            t.bytes += out.bytes_read;
            for ((k, _, d), res) in drafted.iter().zip(out.results) {
                let r = &mut live[*k];
                reasons[*k] = match res {
                    Ok(v) => {
                        r.drafted.0 += d.len();
                        r.drafted.1 += v.accepted;
                        let mut lps = v.logprobs.into_iter();
                        let mut why = None;
                        for tok in v.tokens {
                            why = r.emit(self.codec.text(), tok, lps.next(), seq_len);
                            t.generated += 1;
                            if why.is_some() {
                                break;
                            }
                        }
                        why
                    }
                    Err(e) => Some(format!("error: step {step}: {e}")),
                };
            }
        }
        if !take.is_empty() {
            if take.len() != tokens.len() || take.iter().enumerate().any(|(i, &(_, row))| row != i)
            {
                // Keep only the rows sampled now (each prompt's last row).
                logits = pick(&logits, take.iter().map(|&(_, row)| row as i64).collect());
            }
            let ids: Vec<RequestId> = take.iter().map(|&(k, _)| live[k].rid).collect();
            let out = self
                .batch
                .step(&ids, logits)
                .map_err(|e| format!("step {step}: sampling: {e}"))?;
            t.max_sampled = t.max_sampled.max(ids.len());
            t.bytes += out.bytes_read;
            debug_assert_eq!(out.tokens.len(), ids.len());
            debug_assert_eq!(out.logprobs.len(), ids.len());
            for ((&(k, _), tok), lp) in take.iter().zip(out.tokens).zip(out.logprobs) {
                reasons[k] = match tok {
                    Ok(tok) => {
                        t.generated += 1;
                        live[k].emit(self.codec.text(), tok, lp, seq_len)
                    }
                    Err(e) => Some(format!("error: step {step}: {e}")),
                };
            }
        }
        t.sampling += t1.elapsed();
        Ok(reasons)
    }

    /// Print a finished request.
    fn report(&mut self, r: &Live, why: &str, step: usize) {
        let codec = self.codec.text();
        let (finish, error) = match why.strip_prefix("error: ") {
            Some(e) => ("error", Some(e)),
            None => (why, None),
        };
        if why == "beam" {
            self.report_beams(r, step);
            return;
        }
        if self.json && r.n > 1 {
            // One of several choices: kept until the last one ends, then
            // one line with them all.
            let mut c = json!({
                "index": r.choice,
                "completion_tokens": r.tokens.len(),
                "tokens": r.tokens,
                "text": r.text.text(),
                "finish_reason": finish,
                "stop_reason": r.stop_reason,
                "seed": r.seed,
            });
            if let Some(e) = error {
                c["error"] = json!(e);
            }
            if r.wants_logprobs {
                c["logprobs"] = logprobs_json(codec, &r.logprobs);
            }
            let done = self.choices.entry(r.index).or_default();
            done.push(c);
            if done.len() < r.n {
                return;
            }
            let mut done = self.choices.remove(&r.index).unwrap_or_default();
            done.sort_by_key(|c| c["index"].as_u64());
            let completion: u64 = done
                .iter()
                .filter_map(|c| c["completion_tokens"].as_u64())
                .sum();
            let line = json!({
                "id": r.id,
                "index": r.index,
                "prompt_tokens": r.prompt.len(),
                "completion_tokens": completion,
                "choices": done,
                "arrival": r.arrival,
                "start_step": r.started,
                "end_step": step,
                "chain": r.chain,
                "seed": done.first().map_or(Value::Null, |c| c["seed"].clone()),
            });
            println!("{line}");
            return;
        }
        if self.json {
            let mut line = json!({
                "id": r.id,
                "index": r.index,
                "prompt_tokens": r.prompt.len(),
                "completion_tokens": r.tokens.len(),
                "tokens": r.tokens,
                "text": r.text.text(),
                "finish_reason": finish,
                "stop_reason": r.stop_reason,
                "arrival": r.arrival,
                "start_step": r.started,
                "end_step": step,
                "chain": r.chain,
                "seed": r.seed,
            });
            if let Some(e) = error {
                line["error"] = json!(e);
            }
            if r.wants_logprobs {
                line["logprobs"] = logprobs_json(codec, &r.logprobs);
            }
            if r.drafter.is_some() {
                line["speculative"] = json!({
                    "proposed": r.drafted.0,
                    "accepted": r.drafted.1,
                });
            }
            println!("{line}");
        } else {
            if let Some(e) = error {
                eprintln!("request {}: {e}", r.index);
            }
            let mut all = r.prompt.clone();
            all.extend(&r.tokens);
            let tag = if r.n > 1 {
                format!("{:>2}.{}", r.index, r.choice)
            } else {
                format!("{:>2}", r.index)
            };
            println!(
                "[request {tag}] steps {}..{} ({finish}), {} tokens, {}: {}",
                r.started,
                step,
                r.tokens.len(),
                r.chain,
                String::from_utf8_lossy(&codec.decode_bytes(&all)).trim()
            );
        }
    }

    /// A finished beam search: its sequences as choices, best first, each
    /// with its sum of logprobs and its length-penalised score.
    fn report_beams(&self, r: &Live, step: usize) {
        let codec = self.codec.text();
        let text_of = |tokens: &[TokenId]| {
            let mut prev = r.prompt.last().copied();
            let mut bytes = Vec::new();
            for &t in tokens {
                if !r.stop.contains(&t) {
                    bytes.extend(codec.piece_bytes(prev, t));
                }
                prev = Some(t);
            }
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let finish_of = |tokens: &[TokenId]| match tokens.last() {
            Some(t) if r.stop.contains(t) => "stop",
            _ if r.prompt.len() + tokens.len() >= self.model.config().seq_len => "context",
            _ => "length",
        };
        if self.json {
            let choices: Vec<Value> = r
                .hypotheses
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    json!({
                        "index": i,
                        "completion_tokens": h.tokens.len(),
                        "tokens": h.tokens,
                        "text": text_of(&h.tokens),
                        "finish_reason": finish_of(&h.tokens),
                        "cumulative_logprob": h.sum_logprobs,
                        "score": h.score,
                    })
                })
                .collect();
            let line = json!({
                "id": r.id,
                "index": r.index,
                "prompt_tokens": r.prompt.len(),
                "completion_tokens": r.hypotheses.iter().map(|h| h.tokens.len()).sum::<usize>(),
                "choices": choices,
                "arrival": r.arrival,
                "start_step": r.started,
                "end_step": step,
                "chain": r.chain,
                "beam_search": true,
            });
            println!("{line}");
        } else {
            for (i, h) in r.hypotheses.iter().enumerate() {
                println!(
                    "[request {:>2}.{i}] steps {}..{step} (beam search, score {:.4}), {} tokens: {}{}",
                    r.index,
                    r.started,
                    h.score,
                    h.tokens.len(),
                    String::from_utf8_lossy(&codec.decode_bytes(&r.prompt)).trim(),
                    text_of(&h.tokens)
                );
            }
        }
    }

    /// A request that could not start.
    fn refuse(&self, index: usize, id: &Value, e: &str) {
        if self.json {
            println!(
                "{}",
                json!({"id": id, "index": index, "finish_reason": "error", "error": e})
            );
        }
        eprintln!("request {index}: {e}");
    }

    /// Take a finished request out of the batch and print it (or send its
    /// end to its HTTP client).
    fn finish(&mut self, mut r: Live, why: &str, step: usize) -> Result<(), String> {
        match r.family.take() {
            // The search owns the beams' requests and slots.
            Some(f) => r.hypotheses = f.finish(&mut self.beam_host()),
            None => {
                self.batch.remove(r.rid).map_err(|e| e.to_string())?;
                self.free.push(r.slot);
            }
        }
        let tail = r.text.finish();
        match &r.sink {
            Some(sink) => sink.finish(&tail, why, &r.stop_reason, r.prompt.len(), r.tokens.len()),
            None => self.report(&r, why, step),
        }
        Ok(())
    }
}

fn run(a: Args) -> Result<(), String> {
    if a.http.is_some() {
        return http::run(a);
    }
    let policy: OffloadPolicy = a.offload.parse().map_err(|e| format!("--offload {e}"))?;
    let (device, policy) =
        sampler_backend::resolve_device(&a.device, policy).map_err(|e| e.to_string())?;
    let mut jobs = match &a.requests_file {
        Some(p) => file_jobs(p)?,
        None => builtin_jobs(&a),
    };
    // Arrival order; requests arriving at the same step in file order.
    jobs.sort_by_key(|j| (j.arrival, j.index));
    let n = jobs.len();
    let concurrency = (a.concurrency as usize).min(n);
    let (model, codec) = load(&a, &device)?;
    let words: Vec<&str> = a.ban_words.iter().map(String::as_str).collect();
    let slots = concurrency.min(4);
    let mut server = Server {
        model: &model,
        codec: &codec,
        batch: SamplingBatch::new(model.config().vocab_size, &device, policy)
            .map_err(|e| e.to_string())?,
        // Cache slots are reused; the cache grows up to the concurrency.
        cache: model.new_batch_cache(slots),
        max_slots: concurrency,
        free: (0..slots).rev().collect(),
        prefill_budget: a.prefill_budget as usize,
        ban: if words.is_empty() {
            None
        } else {
            Some(codec.ban_words(&words)?)
        },
        json: a.json || a.requests_file.is_some(),
        choices: Default::default(),
        grammar: None,
    };

    let mut queue: VecDeque<Job> = jobs.into();
    let mut live: Vec<Live> = Vec::new();
    let mut t = Totals::default();
    let mut step = 0;
    let started = Instant::now();
    while !queue.is_empty() || !live.is_empty() {
        while live.len() < concurrency && queue.front().is_some_and(|j| j.arrival <= step) {
            let Some(job) = queue.pop_front() else { break };
            let (index, id) = (job.index, job.id.clone());
            match server.admit(job, step) {
                Ok(r) => live.push(r),
                Err(e) => {
                    server.refuse(index, &id, &e);
                    t.failed += 1;
                }
            }
        }
        if live.is_empty() {
            // Nothing to run: jump to the next arrival.
            step = queue.front().map_or(step + 1, |j| j.arrival.max(step + 1));
            continue;
        }
        match server.step(&mut live, step, &mut t) {
            Ok(reasons) => {
                for (k, why) in reasons.into_iter().enumerate().rev() {
                    let Some(why) = why else { continue };
                    let r = live.remove(k);
                    if why.starts_with("error") {
                        t.failed += 1;
                    }
                    server.finish(r, &why, step)?;
                }
            }
            Err(e) => {
                // The pass failed as a whole: every live request ends with the error.
                for r in std::mem::take(&mut live) {
                    t.failed += 1;
                    server.finish(r, &format!("error: {e}"), step)?;
                }
            }
        }
        t.steps += 1;
        step += 1;
    }
    let wall = started.elapsed();
    let steps = t.steps.max(1);
    let step_time = (t.model + t.sampling).as_secs_f64().max(1e-9);
    eprintln!(
        "{n} requests on {} (offload {policy}, concurrency {concurrency}): {} steps, at most {} requests sampled in a step, {:.1} model rows per step on average, at most {}",
        a.device,
        t.steps,
        t.max_sampled,
        t.rows as f64 / steps as f64,
        t.max_rows
    );
    eprintln!(
        "{} tokens in {:.2} s = {:.1} tokens/s; model {:.1} ms, sampling {:.1} ms = {:.1}% of step time ({:.1} us per sampled row)",
        t.generated,
        wall.as_secs_f64(),
        t.generated as f64 / wall.as_secs_f64().max(1e-9),
        t.model.as_secs_f64() * 1e3,
        t.sampling.as_secs_f64() * 1e3,
        100.0 * t.sampling.as_secs_f64() / step_time,
        t.sampling.as_secs_f64() * 1e6 / t.generated.max(1) as f64,
    );
    if !matches!(a.device.trim(), "flex" | "ndarray" | "cpu") {
        eprintln!(
            "note: {} runs asynchronously: the model time counts queuing its work, the sampling time includes waiting for it",
            a.device
        );
    }
    eprintln!(
        "{} bytes read back ({:.1} per sampled row)",
        t.bytes,
        t.bytes as f64 / t.generated.max(1) as f64
    );
    if t.failed > 0 {
        return Err(format!("{} of {n} requests failed", t.failed));
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
