//! `GET /inspect` (a page: plain HTML and a small script, no build step)
//! and `POST /v1/inspect` (what the page calls): a prompt and a chain, run
//! step by step through `Chain::inspect` on the model thread, answered with
//! every step's per-stage candidate sets as JSON and SVG.
//!
//! The body takes the completions or the chat fields (`prompt` or
//! `messages`, `sampler_chain` as TOML or a chain string, every flat
//! sampling key, `seed`, `stop_token_ids`), `max_tokens` as the number of
//! steps (1..=[`MAX_STEPS`], default 8) and `top`, the tokens shown per
//! stage (1..=40, default 12). Unknown fields are refused (`400`, `param`
//! naming them) whatever `--strict` says: a typo in a hand-edited
//! parameter would otherwise show a chain the user did not mean. `stream`,
//! `n` > 1, `logprobs`, `stop` and `speculative` do not apply to an
//! inspection and are refused by name.
//!
//! An inspection runs the reference stages on the host (exact, slow by
//! design) and holds the model thread for its steps: the batch's running
//! requests wait that long. It is a debugging tool, not a serving path; it
//! counts against `--max-queue` like a request (`429` past it), and one
//! whose client has gone stops at its next step.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{Html, IntoResponse, Response};
use chain_config::ChainConfig;
use sampler_core::{Chain, TokenId};
use sampler_examples::inspect as draw;
use sampler_examples::requests::Prompt;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::Server;
use super::http::{ApiError, Endpoint, Shared, Work, server_error, to_request};

/// The most steps one inspection runs.
pub const MAX_STEPS: usize = 64;

/// The page, served as it is.
const PAGE: &str = include_str!("inspect.html");

/// An inspection for the model thread.
pub struct InspectJob {
    prompt: Prompt,
    config: ChainConfig,
    stop_ids: Vec<TokenId>,
    steps: usize,
    top: usize,
    /// The prompt's field (`prompt` or `messages`), for errors.
    prompt_field: &'static str,
    reply: oneshot::Sender<Result<Value, ApiError>>,
}

/// The largest seed a JavaScript number holds exactly (2^53 - 1): fresh
/// seeds stay below it, so that the page can send them back.
const MAX_SAFE_SEED: u64 = (1 << 53) - 1;

pub async fn page() -> Response {
    Html(PAGE).into_response()
}

/// A whole number field in `lo..=hi`, `default` when absent or null.
fn bounded(
    obj: &Map<String, Value>,
    key: &str,
    lo: u64,
    hi: u64,
    default: u64,
) -> Result<u64, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(
                format!("`{key}` = {v}: an inspection takes a whole number in {lo}..={hi}"),
                Some(key),
            )),
        },
    }
}

/// Parse an inspection body: the request, its steps and top.
fn parse(body: &[u8], context: usize) -> Result<(InspectJobParts, usize, usize), ApiError> {
    let present = |obj: &Map<String, Value>, key: &str| obj.get(key).is_some_and(|v| !v.is_null());
    let root: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}"), None))?;
    let Value::Object(mut obj) = root else {
        return Err(ApiError::invalid(
            "the body is a JSON object of request fields",
            None,
        ));
    };
    for key in [
        "stream",
        "n",
        "logprobs",
        "top_logprobs",
        "stop",
        "speculative",
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_grammar",
        "guided_choice",
    ] {
        let given = match obj.get(key) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(v) if key == "response_format" => {
                v.get("type").and_then(Value::as_str) != Some("text")
            }
            Some(v) => !(key == "n" && v.as_u64() == Some(1)),
        };
        if given {
            return Err(ApiError::invalid(
                format!(
                    "`{key}` does not apply to an inspection (one sequence, the model's own distribution shown, stopped by token ids only)"
                ),
                Some(key),
            ));
        }
    }
    // `max_completion_tokens` is `max_tokens`' other name (not both).
    let steps_key = if present(&obj, "max_completion_tokens") && !present(&obj, "max_tokens") {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let steps = bounded(&obj, steps_key, 1, MAX_STEPS as u64, 8)? as usize;
    let top = bounded(&obj, "top", 1, draw::MAX_TOP as u64, 12)? as usize;
    obj.remove("top");
    obj.remove(steps_key);
    obj.insert(steps_key.into(), Value::from(steps));
    let endpoint = if present(&obj, "messages") {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let body = Value::Object(obj).to_string();
    let (request, _) = to_request(body.as_bytes(), endpoint, true, context)?;
    // The flat keys were refused above; a TOML chain's `[structured]` too.
    if let Some(s) = &request.config.structured {
        return Err(ApiError::invalid(
            format!(
                "`sampler_chain` has a [structured] table ({}): structured output does not apply to an inspection (the model's own distribution is shown)",
                s.kind()
            ),
            Some("sampler_chain"),
        ));
    }
    Ok((
        InspectJobParts {
            prompt: request.prompt,
            config: request.config,
            stop_ids: request.stop_ids,
            prompt_field: match endpoint {
                Endpoint::Chat => "messages",
                Endpoint::Completions => "prompt",
            },
        },
        steps,
        top,
    ))
}

/// The parsed request's parts an inspection keeps.
struct InspectJobParts {
    prompt: Prompt,
    config: ChainConfig,
    stop_ids: Vec<TokenId>,
    prompt_field: &'static str,
}

/// `POST /v1/inspect`.
pub async fn inspect(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rej) => return ApiError::rejected(&rej).into_response(),
    };
    let (parts, steps, top) = match parse(&body, s.context) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    // Counted with the requests: `--max-queue` bounds inspections too.
    if let Err(e) = s.enqueue() {
        return e.into_response();
    }
    let (tx, rx) = oneshot::channel();
    let job = InspectJob {
        prompt: parts.prompt,
        config: parts.config,
        stop_ids: parts.stop_ids,
        steps,
        top,
        prompt_field: parts.prompt_field,
        reply: tx,
    };
    if s.jobs.send(Work::Inspect(job)).is_err() {
        s.pending.fetch_sub(1, Ordering::SeqCst);
        return server_error("the server is shutting down".into()).into_response();
    }
    match rx.await {
        Ok(Ok(mut v)) => {
            v["model"] = Value::from(s.model.clone());
            axum::Json(v).into_response()
        }
        Ok(Err(e)) => e.into_response(),
        Err(_) => server_error("the model thread stopped".into()).into_response(),
    }
}

/// Run an inspection on the model thread and answer it; it leaves the
/// `pending` count when done (`cancelled` when its client has gone).
pub fn run(server: &Server<'_>, job: InspectJob, pending: &AtomicUsize, cancelled: &AtomicUsize) {
    let gone = || job.reply.is_closed();
    let out = answer(server, &job, &gone);
    if gone() {
        cancelled.fetch_add(1, Ordering::SeqCst);
    }
    pending.fetch_sub(1, Ordering::SeqCst);
    let _ = job.reply.send(out);
}

fn answer(
    server: &Server<'_>,
    job: &InspectJob,
    gone: &dyn Fn() -> bool,
) -> Result<Value, ApiError> {
    let (stop_ids, steps, top) = (&job.stop_ids[..], job.steps, job.top);
    let mut config = job.config.clone();
    let codec = server.codec.text();
    let vocab = server.model.config().vocab_size;
    let prompt_err = |e: String| ApiError::invalid(e, Some(job.prompt_field));
    let tokens = server.codec.encode(&job.prompt).map_err(prompt_err)?;
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(prompt_err(format!(
            "prompt token {t} is outside the model's vocabulary (0..{vocab})"
        )));
    }
    // A bias for a token the model does not have fails every step: refused
    // before the first, as `/v1/completions` does.
    for st in &config.chain.stages {
        if let sampler_core::StageSpec::LogitBias { bias } = st
            && let Some(&(t, _)) = bias.iter().find(|&&(t, _)| t as usize >= vocab)
        {
            return Err(ApiError::invalid(
                format!(
                    "`logit_bias`: token id {t} is outside the model's vocabulary (0..{vocab})"
                ),
                Some("logit_bias"),
            ));
        }
    }
    config.chain.fill_stop_ids(&codec.stop_ids());
    let seed = *config
        .chain
        .seed
        .get_or_insert_with(|| clock_seed() & MAX_SAFE_SEED);
    let built = sampler_cpu::build_chain(&config.chain).map_err(|e| {
        ApiError::invalid(
            format!("the chain cannot be built: {e}"),
            Some("sampler_chain"),
        )
    })?;
    // The server's own `--ban-words` stage first, as its requests have it.
    let (mut chain, chain_string) = match &server.ban {
        None => (built, config.chain.chain_string()),
        Some(ban) => {
            let mut stages: Vec<Box<dyn sampler_core::Sampler>> = vec![Box::new(ban.clone())];
            stages.extend(built.stages().iter().cloned());
            (
                Chain::new(stages, Some(seed)),
                format!("ban_words;{}", config.chain.chain_string()),
            )
        }
    };
    let failed = |e: draw::InspectError| match e {
        // The prompt, or the chain on a row: the request's.
        draw::InspectError::Prompt(m) => prompt_err(m),
        e @ draw::InspectError::Sample { .. } => ApiError::invalid(e.to_string(), None),
        // The model, the read-back, the drawing: the server's.
        e => server_error(e.to_string()),
    };
    let run = draw::generate(
        server.model,
        codec,
        &tokens,
        &mut chain,
        steps,
        stop_ids,
        gone,
    )
    .map_err(failed)?;
    let mut out = Vec::with_capacity(run.len());
    for step in &run {
        let mut v = draw::step_json(step, codec, top);
        v["svg"] = Value::from(draw::step_svg(step, codec, top).map_err(failed)?);
        out.push(v);
    }
    let ids: Vec<TokenId> = run.iter().map(|s| s.seen.token).collect();
    let is_stop = |t: &TokenId| codec.stop_ids().contains(t) || stop_ids.contains(t);
    let stopped = ids.last().is_some_and(is_stop);
    // The text as `/v1/completions` gives it: each token's piece after the
    // one before it, the stop token left out.
    let mut text = Vec::new();
    for s in run.iter().filter(|s| !is_stop(&s.seen.token)) {
        text.extend(codec.piece_bytes(s.prev, s.seen.token));
    }
    Ok(json!({
        "object": "inspection",
        "seed": seed,
        "chain": chain_string,
        "config": config.to_toml_string(),
        "prompt_tokens": tokens.len(),
        "max_tokens": steps,
        "tokens": ids,
        "text": String::from_utf8_lossy(&text),
        "finish_reason": if stopped { "stop" } else { "length" },
        "top": top,
        "steps": out,
        "summary_svg": draw::summary_svg(&run).map_err(failed)?,
    }))
}

/// A seed for a request that gave none (returned, so that it replays).
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> ApiError {
        match parse(body.as_bytes(), 512) {
            Ok(_) => panic!("{body}: accepted"),
            Err(e) => e,
        }
    }

    #[test]
    fn bodies_are_checked_field_by_field() {
        let (parts, steps, top) = parse(br#"{"prompt": "Once", "seed": 3}"#, 512).unwrap();
        assert_eq!((steps, top), (8, 12));
        assert_eq!(parts.prompt, Prompt::Text("Once".into()));
        assert_eq!(parts.config.chain.seed, Some(3));
        let (_, steps, top) = parse(
            br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "top": 40}"#,
            512,
        )
        .unwrap();
        assert_eq!((steps, top), (64, 40));
        for (body, param) in [
            (r#"{"prompt": "a", "max_tokens": 65}"#, "max_tokens"),
            (r#"{"prompt": "a", "max_tokens": 0}"#, "max_tokens"),
            (r#"{"prompt": "a", "top": 41}"#, "top"),
            (r#"{"prompt": "a", "top": "many"}"#, "top"),
            (r#"{"prompt": "a", "stream": true}"#, "stream"),
            (
                r#"{"prompt": "a", "response_format": {"type": "json_object"}}"#,
                "response_format",
            ),
            (
                r#"{"prompt": "a", "sampler_chain": "samplers = \"dist\"\n[structured]\nregex = \"no\"\n"}"#,
                "sampler_chain",
            ),
            (r#"{"prompt": "a", "n": 2}"#, "n"),
            (r#"{"prompt": "a", "logprobs": 2}"#, "logprobs"),
            (r#"{"prompt": "a", "stop": ["."]}"#, "stop"),
            (r#"{"prompt": "a", "temprature": 0.5}"#, "temprature"),
            (r#"{"prompt": "a", "top_p": 1.5}"#, "top_p"),
        ] {
            let e = err(body);
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(param), "{body}: {}", e.message);
        }
        assert_eq!(err(r#"{"max_tokens": 2}"#).param.as_deref(), Some("prompt"));
        assert!(err("[1]").param.is_none());
    }
}
