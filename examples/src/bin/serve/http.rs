//! `serve --http ADDR`: the OpenAI API over the serving batch.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions` (the GGUF's
//! chat template; ChatML for a llama2.c checkpoint, which has none),
//! `GET /v1/models`, `GET /health`. One model thread runs the same
//! continuous-batching loop as the JSON-lines mode: requests join the
//! `SamplingBatch` at the next step after they arrive and leave when they
//! finish or their client goes away. The HTTP side (tokio + axum) only
//! parses, queues and formats. Field by field, what is accepted and how
//! it maps onto the chain is in `docs/http.md`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc as std_mpsc};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chain_config::ConfigError;
use sampler_core::TokenId;
use sampler_core::logprobs::Logprobs;
use sampler_examples::llama2::generate::TextCodec;
use sampler_examples::requests::{RequestError, parse_request};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::{Job, Live, Server, Totals};

/// `logprob` written for a token whose probability is zero (`-inf` has no
/// JSON spelling; vLLM writes the same).
const NEG_INF_LOGPROB: f32 = -9999.0;

/// What the model thread tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// Admitted into the batch.
    Started,
    /// Not admitted: the request cannot run (prompt too long, chain refused
    /// by the batch, ...).
    Refused(String),
    /// A generated token: the text it releases (possibly empty: held back
    /// as a possible stop string or an unfinished character) and its
    /// logprobs when asked for.
    Token {
        /// The choice (0 to `n - 1`).
        index: usize,
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    /// The end: the text held back until now, the reason, the counts.
    Finished {
        index: usize,
        text: String,
        finish_reason: &'static str,
        stop_reason: Value,
        error: Option<String>,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
}

/// One token's logprobs with the texts of the tokens.
#[derive(Debug, Clone)]
pub struct TokenLogprobs {
    token: Piece,
    top: Vec<Piece>,
}

#[derive(Debug, Clone)]
struct Piece {
    text: String,
    bytes: Vec<u8>,
    logprob: f32,
}

/// Where a request's events go, and which of its choices sends them.
#[derive(Debug, Clone)]
pub struct Sink(mpsc::UnboundedSender<Event>, usize);

fn piece(codec: &dyn TextCodec, (t, l): (TokenId, f32)) -> Piece {
    let bytes = codec.piece_bytes(None, t);
    Piece {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob: if l.is_finite() { l } else { NEG_INF_LOGPROB },
    }
}

impl Sink {
    /// The sink of choice `index` of the same request.
    pub fn choice(self, index: usize) -> Sink {
        Sink(self.0, index)
    }

    /// A generated token.
    pub fn token(&self, codec: &dyn TextCodec, text: &str, lp: Option<&Logprobs>) {
        let logprobs = lp.map(|lp| TokenLogprobs {
            token: piece(codec, lp.token),
            top: lp.top.iter().map(|&e| piece(codec, e)).collect(),
        });
        let _ = self.0.send(Event::Token {
            index: self.1,
            text: text.to_string(),
            logprobs,
        });
    }

    /// The request's end: `why` is the loop's reason (`stop`, `length`,
    /// `context`, `cancelled` or `error: ...`).
    pub fn finish(
        &self,
        text: &str,
        why: &str,
        stop_reason: &Value,
        prompt_tokens: usize,
        completion_tokens: usize,
    ) {
        let (finish_reason, error) = match why {
            "stop" => ("stop", None),
            // OpenAI has one reason for both limits.
            "length" | "context" => ("length", None),
            "cancelled" => ("cancelled", None),
            e => (
                "error",
                Some(e.strip_prefix("error: ").unwrap_or(e).to_string()),
            ),
        };
        let _ = self.0.send(Event::Finished {
            index: self.1,
            text: text.to_string(),
            finish_reason,
            stop_reason: stop_reason.clone(),
            error,
            prompt_tokens,
            completion_tokens,
        });
    }

    fn started(&self) {
        let _ = self.0.send(Event::Started);
    }

    fn refuse(&self, e: String) {
        let _ = self.0.send(Event::Refused(e));
    }

    /// The client went away.
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Work for the model thread.
pub(super) enum Work {
    /// A completion: it joins the batch.
    Generate(Job),
    /// An inspection (`POST /v1/inspect`): run whole between two steps.
    Inspect(super::inspect::InspectJob),
}

/// What the handlers share with each other and the model thread.
pub(super) struct Shared {
    pub(super) jobs: std_mpsc::Sender<Work>,
    /// Requests queued or running (the handlers add, the model thread
    /// takes away); inspections count too.
    pub(super) pending: Arc<AtomicUsize>,
    /// Rows in the sampling batch (published by the model thread).
    running: Arc<AtomicUsize>,
    /// Requests whose client went away before they finished.
    pub(super) cancelled: Arc<AtomicUsize>,
    max_queue: usize,
    strict: bool,
    pub(super) model: String,
    pub(super) context: usize,
    next_id: AtomicU64,
    created: u64,
}

impl Shared {
    /// Count one more request (or inspection) waiting or running; `429`
    /// past `--max-queue`. The model thread takes it away when it ends.
    pub(super) fn enqueue(&self) -> Result<(), ApiError> {
        if self.pending.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: format!(
                    "the queue is full ({} requests waiting or running; --max-queue)",
                    self.max_queue
                ),
                kind: "rate_limit_error",
                param: None,
                code: Some("queue_full"),
            });
        }
        Ok(())
    }
}

/// An OpenAI error response.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    pub(super) message: String,
    kind: &'static str,
    pub(super) param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    /// A body that could not be read (too large, cut off): its status.
    pub(super) fn rejected(rej: &BytesRejection) -> Self {
        ApiError {
            status: rej.status(),
            message: rej.body_text(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub(super) fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// The key a configuration error is about.
fn config_param(e: &ConfigError) -> Option<String> {
    match e {
        ConfigError::UnknownKey { path, .. }
        | ConfigError::MissingKey { path, .. }
        | ConfigError::WrongType { path, .. }
        | ConfigError::OutOfRange { path, .. }
        | ConfigError::DuplicateKey { path, .. } => {
            // `logit_bias."50256"` -> `logit_bias`.
            Some(path.split('.').next().unwrap_or(path).to_string())
        }
        _ => None,
    }
}

fn request_param(e: &RequestError) -> Option<String> {
    match e {
        RequestError::UnknownKey { key, .. } => Some(key.clone()),
        RequestError::WrongValue { key, .. } => Some(key.to_string()),
        RequestError::Prompt => Some("prompt".into()),
        RequestError::Conflict(key, _) => Some(key.clone()),
        RequestError::StructuredTwice(key) => Some(key.clone()),
        RequestError::Stop(_) => Some("stop".into()),
        RequestError::Sampling { what, source } => match *what {
            "toml" | "chain" => Some("sampler_chain".into()),
            _ => config_param(source).or_else(|| match source {
                // Two structured outputs: the message names both keys.
                ConfigError::Conflict { message, .. } => {
                    message.split('`').nth(1).map(str::to_string)
                }
                _ => None,
            }),
        },
        RequestError::Json(_) | RequestError::NotObject(_) => None,
    }
}

/// Which endpoint a body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Completions,
    Chat,
}

/// What the response needs besides the request itself.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    endpoint: Endpoint,
    /// Choices.
    n: usize,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
    /// `max_tokens` given: the prompt and it must fit the context.
    max_tokens_given: bool,
}

fn wrong(key: &str, expected: &str, found: &Value) -> ApiError {
    ApiError::invalid(
        format!("`{key}`: expected {expected}, found {found}"),
        Some(key),
    )
}

/// A chat message's `content`: a string or a list of text parts.
fn content_text(i: usize, c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) => Ok(c.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            format!(
                                "`messages[{i}].content`: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported, found {p}"
                            ),
                            Some("messages"),
                        ));
                    }
                }
            }
            Ok(Value::String(text))
        }
        other => Err(wrong(
            "messages",
            "a message content string or a list of text parts",
            other,
        )),
    }
}

/// An OpenAI body as a `serve` request line (`parse_request`'s format) and
/// the response's shape.
pub(super) fn to_request(
    body: &[u8],
    endpoint: Endpoint,
    strict: bool,
    context: usize,
) -> Result<(sampler_examples::requests::Request, Shape), ApiError> {
    let root: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}"), None))?;
    let Value::Object(obj) = root else {
        return Err(ApiError::invalid(
            "the body is a JSON object of request fields",
            None,
        ));
    };
    let flat = chain_config::flat_keys();
    let (prompt_key, other_prompt) = match endpoint {
        Endpoint::Completions => ("prompt", "messages"),
        Endpoint::Chat => ("messages", "prompt"),
    };
    let mut line = Map::new();
    let mut shape = Shape {
        endpoint,
        n: 1,
        stream: false,
        include_usage: false,
        logprobs: false,
        max_tokens_given: false,
    };
    let mut max_tokens = None;
    for (key, v) in &obj {
        // A null field is an absent one.
        if v.is_null() {
            continue;
        }
        match key.as_str() {
            "model" | "user" => {}
            "stream" => shape.stream = v.as_bool().ok_or_else(|| wrong(key, "a boolean", v))?,
            "stream_options" => {
                shape.include_usage = match v.get("include_usage") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(x) => {
                        return Err(wrong("stream_options", "{\"include_usage\": boolean}", x));
                    }
                }
            }
            "n" => {
                line.insert(key.clone(), v.clone());
            }
            "best_of" => {
                if v != obj.get("n").unwrap_or(&Value::from(1)) {
                    return Err(ApiError::invalid(
                        format!(
                            "`best_of` = {v}: only equal to `n` is supported (every sequence is returned)"
                        ),
                        Some(key),
                    ));
                }
            }
            "echo" => {
                if v.as_bool() != Some(false) {
                    return Err(ApiError::invalid(
                        format!("`echo` = {v}: only false is supported"),
                        Some(key),
                    ));
                }
            }
            "max_tokens" | "max_completion_tokens" => {
                if max_tokens.is_some() {
                    return Err(ApiError::invalid(
                        "give one of `max_tokens` and `max_completion_tokens`",
                        Some(key),
                    ));
                }
                max_tokens = Some(v.clone());
            }
            "sampler_chain" => {
                let Value::String(text) = v else {
                    return Err(wrong(key, "a TOML chain or a chain string", v));
                };
                // A TOML declaration has tables or `key = value` lines.
                let as_toml = text.contains('[') || text.contains('=');
                line.insert(if as_toml { "toml" } else { "chain" }.into(), v.clone());
            }
            "messages" if endpoint == Endpoint::Chat => {
                let Value::Array(items) = v else {
                    return Err(wrong(key, "a list of messages", v));
                };
                let mut out = Vec::with_capacity(items.len());
                for (i, m) in items.iter().enumerate() {
                    let Value::Object(m) = m else {
                        return Err(wrong(key, "a list of message objects", v));
                    };
                    let mut kept = Map::new();
                    for (k, x) in m {
                        match k.as_str() {
                            "role" | "name" => {
                                kept.insert(k.clone(), x.clone());
                            }
                            "content" => {
                                kept.insert(k.clone(), content_text(i, x)?);
                            }
                            // Tool calls and the like are not supported.
                            _ if strict => {
                                return Err(ApiError::invalid(
                                    format!("`messages[{i}]`: unknown field `{k}`"),
                                    Some("messages"),
                                ));
                            }
                            _ => {}
                        }
                    }
                    out.push(Value::Object(kept));
                }
                line.insert(key.clone(), Value::Array(out));
            }
            "prompt" if endpoint == Endpoint::Completions => {
                let p = match v {
                    Value::String(_) => v.clone(),
                    Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].clone(),
                    _ => return Err(wrong(key, "a string (or a list of one string)", v)),
                };
                line.insert(key.clone(), p);
            }
            "logprobs" => {
                shape.logprobs = match v {
                    Value::Bool(b) => *b,
                    // Completions: the number of top logprobs.
                    Value::Number(_) => true,
                    _ => false,
                };
                line.insert(key.clone(), v.clone());
            }
            "stop" | "include_stop_str_in_output" | "speculative" => {
                line.insert(key.clone(), v.clone());
            }
            k if k == other_prompt || !flat.contains(&k) => {
                if strict || k == other_prompt {
                    return Err(ApiError::invalid(
                        format!(
                            "unknown field `{k}`{}",
                            if k == other_prompt {
                                format!(" (this endpoint takes `{prompt_key}`)")
                            } else {
                                String::new()
                            }
                        ),
                        Some(k),
                    ));
                }
            }
            _ => {
                line.insert(key.clone(), v.clone());
            }
        }
    }
    if !line.contains_key(prompt_key) {
        return Err(ApiError::invalid(
            format!("`{prompt_key}` is required"),
            Some(prompt_key),
        ));
    }
    shape.max_tokens_given = max_tokens.is_some();
    // OpenAI's defaults: 16 for completions, the context's room for chat.
    let default_max = match endpoint {
        Endpoint::Completions => Value::from(16),
        Endpoint::Chat => Value::from(context),
    };
    line.insert("max_tokens".into(), max_tokens.unwrap_or(default_max));
    let text = Value::Object(line).to_string();
    let request = parse_request(&text, 0).map_err(|e| {
        let param = request_param(&e);
        // The key as the client wrote it.
        let param = param.map(|p| {
            if p == "max_tokens" && obj.contains_key("max_completion_tokens") {
                "max_completion_tokens".to_string()
            } else {
                p
            }
        });
        ApiError {
            param,
            ..ApiError::invalid(e.to_string(), None)
        }
    })?;
    if request.config.sequences.beam.is_some() {
        return Err(ApiError::invalid(
            "beam search (`num_beams` > 1) is not served over HTTP: use the JSON-lines `serve` or `generate --num-beams`",
            Some("num_beams"),
        ));
    }
    shape.n = request.n;
    Ok((request, shape))
}

/// One sequence of request `index` ends (its row leaves `running`, it
/// is out of `live`): whether it was the request's last. Counted from the
/// sequences still live, so a request whose fork failed half way still ends.
fn retire(live: &[Live], index: usize, running: &AtomicUsize) -> bool {
    let _ = running.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
        Some(r.saturating_sub(1))
    });
    !live.iter().any(|l| l.index == index)
}

/// The model thread: the continuous-batching loop over the jobs that
/// arrive from the handlers, until every sender is gone and nothing runs.
fn model_loop(
    server: &mut Server<'_>,
    jobs: std_mpsc::Receiver<Work>,
    concurrency: usize,
    pending: &AtomicUsize,
    running: &AtomicUsize,
    cancelled: &AtomicUsize,
) {
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut live: Vec<Live> = Vec::new();
    let mut t = Totals::default();
    let mut step = 0;
    let done = |n: usize| {
        pending.fetch_sub(n, Ordering::SeqCst);
    };
    loop {
        if live.is_empty() && queue.is_empty() {
            match jobs.recv() {
                Ok(Work::Generate(j)) => queue.push_back(j),
                Ok(Work::Inspect(i)) => super::inspect::run(server, i, pending, cancelled),
                Err(_) => break,
            }
        }
        while let Ok(w) = jobs.try_recv() {
            match w {
                Work::Generate(j) => queue.push_back(j),
                Work::Inspect(i) => super::inspect::run(server, i, pending, cancelled),
            }
        }
        // Clients gone before their request started.
        let before = queue.len();
        queue.retain(|j| !j.sink.as_ref().is_some_and(Sink::closed));
        done(before - queue.len());
        cancelled.fetch_add(before - queue.len(), Ordering::SeqCst);
        while live.len() < concurrency {
            let Some(job) = queue.pop_front() else { break };
            let sink = job.sink.clone();
            match server.admit(job, step) {
                Ok(r) => {
                    if let Some(s) = &sink {
                        s.started();
                    }
                    live.push(r);
                }
                Err(e) => {
                    // Counted out before the client hears of it.
                    done(1);
                    if let Some(s) = &sink {
                        s.refuse(e);
                    }
                }
            }
        }
        // Clients gone mid-generation: their rows leave the batch now.
        for k in (0..live.len()).rev() {
            if live[k].sink.as_ref().is_some_and(Sink::closed) {
                let r = live.remove(k);
                if retire(&live, r.index, running) {
                    done(1);
                    cancelled.fetch_add(1, Ordering::SeqCst);
                }
                if let Err(e) = server.finish(r, "cancelled", step) {
                    eprintln!("step {step}: {e}");
                }
            }
        }
        running.store(server.batch.len(), Ordering::SeqCst);
        if live.is_empty() {
            continue;
        }
        let reasons = match server.step(&mut live, step, &mut t) {
            Ok(reasons) => reasons,
            // The pass failed as a whole: every live request ends with it.
            Err(e) => vec![Some(format!("error: {e}")); live.len()],
        };
        for (k, why) in reasons.into_iter().enumerate().rev() {
            let Some(why) = why else { continue };
            let r = live.remove(k);
            // The counts first: a client that hears of the end and sends its
            // next request at once finds the room free.
            if retire(&live, r.index, running) {
                done(1);
            }
            if let Err(e) = server.finish(r, &why, step) {
                eprintln!("step {step}: {e}");
            }
        }
        running.store(server.batch.len(), Ordering::SeqCst);
        step += 1;
    }
}

/// Ctrl-C, its handler installed when made (SIGINT on Unix).
struct CtrlC {
    #[cfg(unix)]
    sig: Option<tokio::signal::unix::Signal>,
}

impl CtrlC {
    fn new() -> Self {
        Self {
            #[cfg(unix)]
            sig: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok(),
        }
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(sig) = &mut self.sig {
            sig.recv().await;
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Run the HTTP server until Ctrl-C; the running requests finish first.
pub fn run(a: super::Args) -> Result<(), String> {
    let Some(addr) = a.http else {
        return Err("no --http address".into());
    };
    let policy: sampler_core::OffloadPolicy =
        a.offload.parse().map_err(|e| format!("--offload {e}"))?;
    let (device, policy) =
        sampler_backend::resolve_device(&a.device, policy).map_err(|e| e.to_string())?;
    // Ctrl-C is watched from the start: one during the model's loading
    // ends the process once the load returns.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shutdown = Arc::new(tokio::sync::Notify::new());
    {
        let (interrupted, shutdown) = (interrupted.clone(), shutdown.clone());
        let (tx, rx) = std_mpsc::channel();
        runtime.spawn(async move {
            let mut ctrl_c = CtrlC::new();
            let _ = tx.send(());
            ctrl_c.recv().await;
            interrupted.store(true, Ordering::SeqCst);
            eprintln!("Ctrl-C: finishing the running requests (Ctrl-C again: exit now)");
            shutdown.notify_one();
            ctrl_c.recv().await;
            std::process::exit(130);
        });
        // The handler is in place before the (long) load starts.
        let _ = rx.recv();
    }
    let (model, codec) = super::load(&a, &device)?;
    if interrupted.load(Ordering::SeqCst) {
        return Ok(());
    }
    let context = model.config().seq_len;
    let model_name = a
        .model
        .as_ref()
        .and_then(|p| p.file_stem())
        .map_or("stories260K".to_string(), |s| {
            s.to_string_lossy().into_owned()
        });
    let concurrency = a.concurrency as usize;
    let words: Vec<&str> = a.ban_words.iter().map(String::as_str).collect();
    let ban = if words.is_empty() {
        None
    } else {
        Some(codec.ban_words(&words)?)
    };
    let batch = sampler_backend::SamplingBatch::new(model.config().vocab_size, &device, policy)
        .map_err(|e| e.to_string())?;

    let (tx, rx) = std_mpsc::channel::<Work>();
    let pending = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let shared = Arc::new(Shared {
        jobs: tx,
        pending: pending.clone(),
        running: running.clone(),
        cancelled: cancelled.clone(),
        max_queue: a.max_queue as usize,
        strict: a.strict,
        model: model_name,
        context,
        next_id: AtomicU64::new(0),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });

    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| format!("--http {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/inspect", get(super::inspect::page))
        .route("/v1/inspect", post(super::inspect::inspect))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared);

    std::thread::scope(|scope| {
        let model_thread = scope.spawn(|| {
            let slots = concurrency.min(4);
            let mut server = Server {
                model: &model,
                codec: &codec,
                batch,
                cache: model.new_batch_cache(slots),
                max_slots: concurrency,
                free: (0..slots).rev().collect(),
                prefill_budget: a.prefill_budget as usize,
                ban,
                json: true,
                choices: Default::default(),
                grammar: None,
            };
            model_loop(&mut server, rx, concurrency, &pending, &running, &cancelled);
        });
        // The line a script waits for (the port when ADDR asked for 0).
        println!("listening on http://{local}");
        let served = runtime.block_on(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.notified().await })
                .await
        });
        // The router (and with it the job sender) is gone: the model thread
        // ends once its requests have.
        let joined = model_thread.join();
        served.map_err(|e| format!("http: {e}"))?;
        joined.map_err(|_| "the model thread panicked".to_string())
    })
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    let running = s.running.load(Ordering::SeqCst);
    let pending = s.pending.load(Ordering::SeqCst);
    axum::Json(json!({
        "status": "ok",
        "running": running,
        "waiting": pending.saturating_sub(running),
        "cancelled": s.cancelled.load(Ordering::SeqCst),
    }))
    .into_response()
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": s.model,
            "object": "model",
            "created": s.created,
            "owned_by": "sampler-chain",
            "max_model_len": s.context,
        }],
    }))
    .into_response()
}

async fn completions(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(s, Endpoint::Completions, body).await
}

async fn chat_completions(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(s, Endpoint::Chat, body).await
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "no route {}: the routes are POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /inspect, POST /v1/inspect",
            uri.path()
        ),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    }
    .into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{method} is not allowed on {}", uri.path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("method_not_allowed"),
    }
    .into_response()
}

/// A request's response so far.
struct Reply {
    id: String,
    created: u64,
    model: String,
    shape: Shape,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.shape.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// Logprobs of some tokens in the endpoint's shape; `offset` is the
    /// text's length before them (completions' `text_offset`).
    fn logprobs(&self, lps: &[TokenLogprobs], offset: usize) -> Value {
        if !self.shape.logprobs {
            return Value::Null;
        }
        match self.shape.endpoint {
            Endpoint::Chat => {
                let entry =
                    |p: &Piece| json!({"token": p.text, "logprob": p.logprob, "bytes": p.bytes});
                json!({"content": lps.iter().map(|lp| {
                    let mut e = entry(&lp.token);
                    e["top_logprobs"] = Value::Array(lp.top.iter().map(entry).collect());
                    e
                }).collect::<Vec<_>>()})
            }
            Endpoint::Completions => {
                let mut at = offset;
                let mut offsets = Vec::with_capacity(lps.len());
                for lp in lps {
                    offsets.push(at);
                    at += lp.token.text.chars().count();
                }
                json!({
                    "tokens": lps.iter().map(|lp| lp.token.text.clone()).collect::<Vec<_>>(),
                    "token_logprobs": lps.iter().map(|lp| lp.token.logprob).collect::<Vec<_>>(),
                    "top_logprobs": lps.iter().map(|lp| {
                        lp.top.iter().map(|p| (p.text.clone(), json!(p.logprob))).collect::<Map<_, _>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    fn usage(prompt: usize, completion: usize) -> Value {
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    /// One streamed chunk: `text` and the logprobs of its tokens, and the
    /// finish reason on the last.
    fn chunk(
        &self,
        index: usize,
        text: &str,
        lps: &[TokenLogprobs],
        offset: usize,
        finish: Option<(&str, &Value)>,
    ) -> Value {
        let mut choice = match self.shape.endpoint {
            Endpoint::Completions => json!({"index": index, "text": text}),
            Endpoint::Chat => {
                json!({"index": index, "delta": if text.is_empty() { json!({}) } else { json!({"content": text}) }})
            }
        };
        choice["logprobs"] = if lps.is_empty() {
            Value::Null
        } else {
            self.logprobs(lps, offset)
        };
        choice["finish_reason"] = finish.map_or(Value::Null, |(f, _)| Value::from(f));
        if let Some((_, stop_reason)) = finish {
            choice["stop_reason"] = stop_reason.clone();
        }
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }
}

pub(super) fn server_error(message: String) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message,
        kind: "server_error",
        param: None,
        code: None,
    }
}

async fn respond(
    s: Arc<Shared>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // A body that could not be read (too large, cut off): its status, in
    // OpenAI's error body.
    let body = match body {
        Ok(b) => b,
        Err(rej) => return ApiError::rejected(&rej).into_response(),
    };
    match start(&s, endpoint, &body).await {
        Err(e) => e.into_response(),
        Ok((reply, events)) if reply.shape.stream => stream(reply, events).into_response(),
        Ok((reply, events)) => whole(reply, events).await.into_response(),
    }
}

/// Parse, queue, and wait until the request is in the batch.
async fn start(
    s: &Shared,
    endpoint: Endpoint,
    body: &[u8],
) -> Result<(Reply, mpsc::UnboundedReceiver<Event>), ApiError> {
    let (request, shape) = to_request(body, endpoint, s.strict, s.context)?;
    // The key a structured-output refusal is about, as the client wrote it.
    let structured_key = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        [
            "response_format",
            "guided_json",
            "guided_regex",
            "guided_grammar",
            "guided_choice",
            "sampler_chain",
        ]
        .into_iter()
        .find(|k| v.get(k).is_some_and(|x| !x.is_null()))
    });
    s.enqueue()?;
    let n = s.next_id.fetch_add(1, Ordering::SeqCst);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut job = Job::new(n as usize, "request".into(), request);
    job.sink = Some(Sink(tx, 0));
    job.fit_context = shape.max_tokens_given;
    if s.jobs.send(Work::Generate(job)).is_err() {
        s.pending.fetch_sub(1, Ordering::SeqCst);
        return Err(server_error("the server is shutting down".into()));
    }
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Refused(e)) => {
            let e = e.strip_prefix("request: ").unwrap_or(&e).to_string();
            // The field the refusal is about (the batch names its stage
            // and parameter; the prompt checks name the prompt).
            let prompt_field = match endpoint {
                Endpoint::Completions => "prompt",
                Endpoint::Chat => "messages",
            };
            let param = [
                "speculative",
                "logit_bias",
                "logprob_token_ids",
                "stop_token_ids",
            ]
            .into_iter()
            .find(|k| e.contains(k))
            .or(e
                .contains("structured output")
                .then_some(structured_key)
                .flatten())
            .or((e.contains("context") || e.contains("prompt")).then_some(prompt_field));
            return Err(ApiError::invalid(e, param));
        }
        _ => return Err(server_error("the request ended before it started".into())),
    }
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let reply = Reply {
        id: format!("{prefix}-{n}"),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: s.model.clone(),
        shape,
    };
    Ok((reply, rx))
}

/// One choice's text, logprobs and end, as they arrive.
#[derive(Default)]
struct ChoiceState {
    text: String,
    lps: Vec<TokenLogprobs>,
    /// Characters of the tokens' texts so far (completions'
    /// `text_offset` of the next token, as the whole response counts it).
    offset: usize,
    end: Option<(&'static str, Value)>,
    completion_tokens: usize,
}

/// The whole response at once, when every choice has ended.
async fn whole(
    reply: Reply,
    mut events: mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut choices: Vec<ChoiceState> =
        (0..reply.shape.n).map(|_| ChoiceState::default()).collect();
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Token {
                index,
                text,
                logprobs,
            } => {
                if let Some(c) = choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.lps.extend(logprobs);
                }
            }
            Event::Finished {
                index,
                text,
                finish_reason,
                stop_reason,
                error,
                prompt_tokens,
                completion_tokens,
            } => {
                if let Some(e) = error {
                    return Err(server_error(e));
                }
                if let Some(c) = choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.end = Some((finish_reason, stop_reason));
                    c.completion_tokens = completion_tokens;
                }
                if choices.iter().all(|c| c.end.is_some()) {
                    let completion = choices.iter().map(|c| c.completion_tokens).sum();
                    let out: Vec<Value> = choices
                        .into_iter()
                        .enumerate()
                        .map(|(i, c)| {
                            let mut choice = match reply.shape.endpoint {
                                Endpoint::Completions => json!({"index": i, "text": c.text}),
                                Endpoint::Chat => {
                                    json!({"index": i, "message": {"role": "assistant", "content": c.text}})
                                }
                            };
                            choice["logprobs"] = reply.logprobs(&c.lps, 0);
                            let (finish, stop) = c.end.unwrap_or(("stop", Value::Null));
                            choice["finish_reason"] = Value::from(finish);
                            choice["stop_reason"] = stop;
                            choice
                        })
                        .collect();
                    return Ok(axum::Json(json!({
                        "id": reply.id,
                        "object": reply.object(false),
                        "created": reply.created,
                        "model": reply.model,
                        "choices": out,
                        "usage": Reply::usage(prompt_tokens, completion),
                    }))
                    .into_response());
                }
            }
            Event::Started | Event::Refused(_) => {}
        }
    }
    Err(server_error("the model thread stopped".into()))
}

/// Server-sent events: a chunk per token that releases text (or carries
/// logprobs), tagged with its choice's index; each choice's last chunk with
/// its finish reason; when every choice has ended, the usage chunk when
/// asked, then `[DONE]`.
fn stream(
    reply: Reply,
    events: mpsc::UnboundedReceiver<Event>,
) -> Sse<impl futures_lite::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
    // The chat stream opens with the assistant's role, per choice.
    let mut first = VecDeque::new();
    if reply.shape.endpoint == Endpoint::Chat {
        for i in 0..reply.shape.n {
            let mut c = reply.chunk(i, "", &[], 0, None);
            c["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
            first.push_back(data(c));
        }
    }
    let choices: Vec<ChoiceState> = (0..reply.shape.n).map(|_| ChoiceState::default()).collect();
    let state = (reply, events, first, choices, false);
    let s = futures_lite::stream::unfold(
        state,
        move |(reply, mut events, mut out, mut choices, mut ended)| async move {
            loop {
                if let Some(item) = out.pop_front() {
                    return Some((item, (reply, events, out, choices, ended)));
                }
                if ended {
                    return None;
                }
                match events.recv().await {
                    Some(Event::Token {
                        index,
                        text,
                        logprobs,
                    }) => {
                        if text.is_empty() && logprobs.is_none() {
                            continue;
                        }
                        let Some(c) = choices.get_mut(index) else {
                            continue;
                        };
                        let lps: Vec<TokenLogprobs> = logprobs.into_iter().collect();
                        out.push_back(data(reply.chunk(index, &text, &lps, c.offset, None)));
                        c.offset += lps
                            .iter()
                            .map(|l| l.token.text.chars().count())
                            .sum::<usize>();
                    }
                    Some(Event::Finished {
                        index,
                        text,
                        finish_reason,
                        stop_reason,
                        error,
                        prompt_tokens,
                        completion_tokens,
                    }) => {
                        if let Some(e) = error {
                            out.push_back(data(server_error(e).body()));
                            out.push_back(Ok(SseEvent::default().data("[DONE]")));
                            ended = true;
                            continue;
                        }
                        let Some(c) = choices.get_mut(index) else {
                            continue;
                        };
                        out.push_back(data(reply.chunk(
                            index,
                            &text,
                            &[],
                            c.offset,
                            Some((finish_reason, &stop_reason)),
                        )));
                        c.end = Some((finish_reason, stop_reason));
                        c.completion_tokens = completion_tokens;
                        if choices.iter().all(|c| c.end.is_some()) {
                            if reply.shape.include_usage {
                                let completion = choices.iter().map(|c| c.completion_tokens).sum();
                                out.push_back(data(json!({
                                    "id": reply.id,
                                    "object": reply.object(true),
                                    "created": reply.created,
                                    "model": reply.model,
                                    "choices": [],
                                    "usage": Reply::usage(prompt_tokens, completion),
                                })));
                            }
                            out.push_back(Ok(SseEvent::default().data("[DONE]")));
                            ended = true;
                        }
                    }
                    Some(Event::Started | Event::Refused(_)) => {}
                    None => {
                        out.push_back(data(server_error("the model thread stopped".into()).body()));
                        ended = true;
                    }
                }
            }
        },
    );
    Sse::new(s).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(
        body: &str,
        endpoint: Endpoint,
        strict: bool,
    ) -> Result<(sampler_examples::requests::Request, Shape), ApiError> {
        to_request(body.as_bytes(), endpoint, strict, 512)
    }

    #[test]
    fn openai_fields_map_onto_the_request() {
        let (r, shape) = req(
            r#"{"model": "m", "prompt": "Hi", "max_tokens": 5, "temperature": 0, "stop": ["\n"], "seed": 3, "stream": true, "stream_options": {"include_usage": true}, "logprobs": 2, "user": null, "frequency_penalty": null}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap();
        assert_eq!(r.max_tokens, 5);
        assert_eq!(r.stop_strings, vec!["\n".to_string()]);
        assert_eq!(r.config.chain.seed, Some(3));
        assert_eq!(r.config.chain.logprobs.as_ref().map(|l| l.top_n), Some(2));
        assert!(shape.stream && shape.include_usage && shape.logprobs && shape.max_tokens_given);
        // Chat: max_completion_tokens, top_logprobs, content parts, sampler_chain.
        let (r, shape) = req(
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 3, "sampler_chain": "top_k;dist", "seed": 1}"#,
            Endpoint::Chat,
            false,
        )
        .unwrap();
        assert_eq!(r.max_tokens, 7);
        assert_eq!(r.config.chain.chain_string(), "top_k;dist");
        assert!(
            matches!(&r.prompt, sampler_examples::requests::Prompt::Messages(m) if m[0].content == "ab")
        );
        assert!(shape.logprobs && !shape.stream);
        // Defaults: 16 tokens for completions, the context for chat.
        assert_eq!(
            req(r#"{"prompt": "x"}"#, Endpoint::Completions, false)
                .unwrap()
                .0
                .max_tokens,
            16
        );
        assert_eq!(
            req(
                r#"{"messages": [{"role": "user", "content": "x"}]}"#,
                Endpoint::Chat,
                false
            )
            .unwrap()
            .0
            .max_tokens,
            512
        );
        // A TOML sampler_chain.
        let (r, _) = req(
            r#"{"prompt": "x", "sampler_chain": "[[stage]]\ntype = \"greedy\""}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap();
        assert_eq!(r.config.chain.chain_string(), "greedy");
        // Speculative decoding per request, as in the request lines.
        let (r, _) = req(
            r#"{"prompt": "x", "speculative": {"num_speculative_tokens": 3}}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap();
        assert_eq!(
            r.config.speculative.map(|s| s.num_speculative_tokens),
            Some(3)
        );
    }

    #[test]
    fn unknown_fields_are_ignored_unless_strict_and_errors_name_the_param() {
        assert!(
            req(
                r#"{"prompt": "x", "frobnicate": 1}"#,
                Endpoint::Completions,
                false
            )
            .is_ok()
        );
        let e = req(
            r#"{"prompt": "x", "frobnicate": 1}"#,
            Endpoint::Completions,
            true,
        )
        .unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("frobnicate"))
        );
        let e = req(
            r#"{"prompt": "x", "temperature": -1}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
        assert!(e.message.contains("temperature"), "{}", e.message);
        let body = e.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "temperature");
        let e = req(
            r#"{"prompt": "x", "max_completion_tokens": 0}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("max_completion_tokens"),
            "{}",
            e.message
        );
        let e = req(
            r#"{"prompt": "x", "stop": ["a", ""]}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        let e = req(r#"{"prompt": "x", "n": 0}"#, Endpoint::Completions, false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        let (r, shape) = req(
            r#"{"prompt": "x", "n": 3, "best_of": 3}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap();
        assert_eq!((r.n, shape.n), (3, 3));
        let e = req(
            r#"{"prompt": "x", "n": 2, "best_of": 4}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("best_of"));
        let e = req(
            r#"{"prompt": "x", "logit_bias": {"abc": 1}}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"), "{}", e.message);
        let e = req(
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = req(
            r#"{"prompt": "x", "sampler_chain": "top_q;dist"}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("sampler_chain"));
        let e = req(
            r#"{"prompt": "x", "top_k": 4, "sampler_chain": "top_k;dist"}"#,
            Endpoint::Completions,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_k"), "{}", e.message);
        let e = req("[1]", Endpoint::Completions, false).unwrap_err();
        assert_eq!(e.param, None);
        let e = req(r#"{"temperature": 1}"#, Endpoint::Completions, false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
