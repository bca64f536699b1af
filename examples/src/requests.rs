//! Request lines for the `serve` command (`--requests-file FILE.jsonl`):
//! one JSON object per line, an OpenAI-style completion body.
//!
//! ```json
//! {"id": "a", "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.8, "top_p": 0.95, "seed": 7}
//! {"id": "b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, "temperature": 0}
//! {"id": "c", "prompt": "The dog", "toml": "[[stage]]\ntype = \"top_k\"\nk = 5\n[[stage]]\ntype = \"dist\""}
//! {"id": "d", "prompt": "The dog", "chain": "top_k;temperature;min_p;dist", "arrival": 4}
//! ```
//!
//! Keys of the request itself:
//! - `id` (any JSON value, echoed in the output; default: the line's index);
//! - `prompt` (text) or `messages` (`[{role, content}]`, rendered with the
//!   model's chat template; GGUF chat models only); exactly one of them;
//! - `max_tokens` (tokens to generate, `1..=1048576`; default 64);
//! - `n` (choices, `1..=256`; default 1): the prompt runs through the model
//!   once, then the request forks into `n` sequences
//!   (`SamplingBatch::fork`: choice `i` has the seed
//!   `sampler_core::rng::child_seed(seed, i)`, choice 0 the request's own);
//! - `arrival` (the step at which the request arrives; default 0);
//! - the sampling chain, one of: the flat OpenAI / vLLM sampling keys at the
//!   top level (`temperature`, `top_p`, `top_k`, `min_p`, the penalties,
//!   `logit_bias`, `logprobs`, ... as `docs/config.md` lists them); `toml`,
//!   a whole TOML chain declaration as a string; or `chain`, a llama.cpp
//!   chain string of stage names with default parameters. Beside `toml` or
//!   `chain` only the keys that are not stages may stand: `seed` (it
//!   overrides the chain's), `logprobs`, `top_logprobs`,
//!   `logprob_token_ids`, `logprobs_mode` and `stop_token_ids`;
//! - `stop_token_ids` (with any chain): generation also stops at these
//!   tokens (the model's end-of-text tokens always stop it);
//! - `stop` (a string or a list of at most 16 non-empty strings, each at
//!   most 256 bytes): generation stops where the text first contains one
//!   ([`crate::stop`]: across token boundaries, held off by `min_tokens`);
//!   the output's text ends before it, or after it with
//!   `include_stop_str_in_output: true`;
//! - structured output (with any chain): OpenAI's `response_format`
//!   (`{"type": "json_object"}`, `{"type": "json_schema", "json_schema":
//!   {"name": ..., "schema": {...}}}`) or vLLM's `guided_json`,
//!   `guided_regex`, `guided_grammar` (Lark), `guided_choice`; a `toml`
//!   chain's `[structured]` table does the same. The output is held to it
//!   token by token (`docs/serving.md`, "Structured outputs");
//! - `speculative` (with any chain): speculative decoding with n-gram
//!   drafts, `{"method": "ngram", "num_speculative_tokens": 4,
//!   "prompt_lookup_min": 2, "prompt_lookup_max": 4}` (every key optional;
//!   `docs/config.md`, `[speculative]`); a `toml` chain's `[speculative]`
//!   table does the same.
//!
//! Every error names the key and what was expected; an unknown key gets the
//! nearest known one as a suggestion.

use chain_config::{ChainConfig, ConfigError, SamplingParams, flat_keys};
use serde_json::{Map, Value};

use crate::chat::Message;

/// The request's own keys (the rest are sampling parameters).
pub const REQUEST_KEYS: [&str; 10] = [
    "id",
    "prompt",
    "messages",
    "max_tokens",
    "arrival",
    "toml",
    "chain",
    "speculative",
    "stop",
    "include_stop_str_in_output",
];

/// Largest `n` (choices per request) and `num_beams`: the parent and
/// [`sampler_backend::MAX_FORK`] children.
pub const MAX_N: u64 = sampler_core::MAX_SEQUENCES as u64;

/// Largest `max_tokens` accepted (the context caps it further).
pub const MAX_TOKENS_LIMIT: u64 = 1 << 20;

/// Flat keys that are not stages: allowed beside `toml` / `chain`.
pub const NON_STAGE_KEYS: [&str; 16] = [
    "seed",
    "n",
    "num_beams",
    "num_return_sequences",
    "length_penalty",
    "early_stopping",
    "logprobs",
    "top_logprobs",
    "logprob_token_ids",
    "logprobs_mode",
    "stop_token_ids",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
];

/// `max_tokens` when a request does not say.
pub const DEFAULT_MAX_TOKENS: usize = 64;

/// What a request asks the model to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text, encoded as it is.
    Text(String),
    /// Chat messages, rendered with the model's chat template (the
    /// assistant's turn opened).
    Messages(Vec<Message>),
}

/// One parsed request line.
#[derive(Debug, Clone)]
pub struct Request {
    /// `id` as given, or the line's index.
    pub id: Value,
    /// The prompt.
    pub prompt: Prompt,
    /// The sampling chain (seed set when the request gave one).
    pub config: ChainConfig,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// The step at which it arrives.
    pub arrival: usize,
    /// Tokens that end the generation besides the model's own
    /// (`stop_token_ids`).
    pub stop_ids: Vec<sampler_core::TokenId>,
    /// Stop strings (`stop`), checked by [`crate::stop::check_stops`].
    pub stop_strings: Vec<String>,
    /// `include_stop_str_in_output`: the matched stop string ends the text.
    pub include_stop_str: bool,
    /// Choices (`n`, from `config.sequences`), at least 1; a beam search
    /// (`config.sequences.beam`) has `n = 1` and returns
    /// `num_return_sequences` choices.
    pub n: usize,
}

/// Why a request line was refused.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not JSON.
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// JSON, but not an object.
    #[error("a request is a JSON object, found {0}")]
    NotObject(&'static str),
    /// A key neither the request nor the sampling parameters know.
    #[error("unknown key `{key}`{}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownKey {
        /// The key.
        key: String,
        /// The nearest known key, if one is near.
        suggestion: Option<String>,
    },
    /// A request key of the wrong type or out of its range.
    #[error("`{key}`: expected {expected}, found {found}")]
    WrongValue {
        /// The key.
        key: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        found: String,
    },
    /// Neither `prompt` nor `messages`, or both.
    #[error("give exactly one of `prompt` and `messages`")]
    Prompt,
    /// Two ways of giving the chain at once.
    #[error("`{0}` and `{1}` both give the sampling chain: give one")]
    Conflict(String, &'static str),
    /// A structured-output key beside a `toml` chain that has its own
    /// `[structured]` table.
    #[error("`{0}` and the `[structured]` table of `toml` both give a structured output: give one")]
    StructuredTwice(String),
    /// A bad stop string.
    #[error(transparent)]
    Stop(#[from] crate::stop::StopError),
    /// The sampling parameters or the chain declaration.
    #[error("{what}: {source}")]
    Sampling {
        /// `sampling parameters`, `toml` or `chain`.
        what: &'static str,
        /// The configuration error (key, range, location in that text).
        source: ConfigError,
    },
}

fn type_word(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn count(
    obj: &Map<String, Value>,
    key: &'static str,
    range: std::ops::RangeInclusive<u64>,
    expected: &'static str,
    default: usize,
) -> Result<usize, RequestError> {
    match obj.get(key) {
        None => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if range.contains(&n) => Ok(n as usize),
            _ => Err(RequestError::WrongValue {
                key,
                expected,
                found: v.to_string(),
            }),
        },
    }
}

fn string<'a>(
    obj: &'a Map<String, Value>,
    key: &'static str,
) -> Result<Option<&'a str>, RequestError> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(RequestError::WrongValue {
            key,
            expected: "a string",
            found: type_word(v).into(),
        }),
    }
}

fn messages(v: &Value) -> Result<Vec<Message>, RequestError> {
    let wrong = |found: String| RequestError::WrongValue {
        key: "messages",
        expected: "a non-empty array of {\"role\": string, \"content\": string} (\"name\" allowed, ignored)",
        found,
    };
    let Value::Array(items) = v else {
        return Err(wrong(type_word(v).into()));
    };
    if items.is_empty() {
        return Err(wrong("an empty array".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(o) = m else {
                return Err(wrong(format!("item {i}: {}", type_word(m))));
            };
            if let Some(k) = o
                .keys()
                .find(|k| !["role", "content", "name"].contains(&k.as_str()))
            {
                return Err(wrong(format!("item {i}: the key `{k}`")));
            }
            match (o.get("role"), o.get("content")) {
                (Some(Value::String(r)), Some(Value::String(c))) => Ok(Message::new(r, c)),
                (Some(Value::String(_)), c) => Err(wrong(format!(
                    "item {i}: `content` {}",
                    c.map_or("missing", type_word)
                ))),
                (r, _) => Err(wrong(format!(
                    "item {i}: `role` {}",
                    r.map_or("missing", type_word)
                ))),
            }
        })
        .collect()
}

/// Parse one request line; `index` is its default `id`.
///
/// # Errors
/// [`RequestError`]: the key at fault and what was expected.
pub fn parse_request(line: &str, index: usize) -> Result<Request, RequestError> {
    let root: Value = serde_json::from_str(line)?;
    let Value::Object(obj) = root else {
        return Err(RequestError::NotObject(type_word(&root)));
    };
    let flat = flat_keys();
    for key in obj.keys() {
        if !REQUEST_KEYS.contains(&key.as_str()) && !flat.contains(&key.as_str()) {
            let suggestion = REQUEST_KEYS
                .iter()
                .chain(flat.iter())
                .map(|k| (strsim::jaro_winkler(key, k), *k))
                .filter(|(s, _)| *s > 0.8)
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, k)| k.to_string());
            return Err(RequestError::UnknownKey {
                key: key.clone(),
                suggestion,
            });
        }
    }
    let prompt = match (obj.get("prompt"), obj.get("messages")) {
        (Some(_), None) => Prompt::Text(string(&obj, "prompt")?.unwrap_or_default().to_string()),
        (None, Some(m)) => Prompt::Messages(messages(m)?),
        _ => return Err(RequestError::Prompt),
    };
    let max_tokens = count(
        &obj,
        "max_tokens",
        1..=MAX_TOKENS_LIMIT,
        "an integer in 1..=1048576",
        DEFAULT_MAX_TOKENS,
    )?;
    let arrival = count(
        &obj,
        "arrival",
        0..=u32::MAX as u64,
        "a step number, an integer in 0..=4294967295",
        0,
    )?;
    let sampling: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| !REQUEST_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let toml = string(&obj, "toml")?;
    let chain = string(&obj, "chain")?;
    let declared = match (toml, chain) {
        (Some(_), Some(_)) => return Err(RequestError::Conflict("toml".into(), "chain")),
        (Some(t), None) => Some(("toml", ChainConfig::from_toml_str(t))),
        (None, Some(c)) => Some(("chain", ChainConfig::from_chain_string(c))),
        (None, None) => None,
    };
    let flat_error = |source: ConfigError| RequestError::Sampling {
        what: "sampling parameters",
        // Found in the rebuilt object of sampling keys: its `line:column`
        // would not point into the request line.
        source: source.without_location(),
    };
    let parse_flat = |m: Map<String, Value>| {
        SamplingParams::from_json_str(&Value::Object(m).to_string())
            .and_then(|p| p.to_chain())
            .map_err(flat_error)
    };
    let config = match declared {
        Some((what, parsed)) => {
            if let Some(k) = sampling
                .keys()
                .find(|k| !NON_STAGE_KEYS.contains(&k.as_str()))
            {
                return Err(RequestError::Conflict(k.clone(), what));
            }
            let mut config = parsed.map_err(|source| RequestError::Sampling { what, source })?;
            // The non-stage keys through the flat parser (types, ranges):
            // a default chain carrying the seed and the logprobs.
            let extra = parse_flat(sampling.clone())?;
            if !extra.sequences.is_default() {
                config.sequences = extra.sequences;
            }
            let structured = extra.structured;
            let extra = extra.chain;
            if extra.seed.is_some() {
                config.chain.seed = extra.seed;
            }
            if extra.logprobs.is_some() {
                config.chain.logprobs = extra.logprobs;
            }
            if structured.is_some() {
                if config.structured.is_some() {
                    let key = sampling
                        .keys()
                        .find(|k| NON_STAGE_KEYS[11..].contains(&k.as_str()))
                        .cloned()
                        .unwrap_or_else(|| "response_format".into());
                    return Err(RequestError::StructuredTwice(key));
                }
                config.set_structured(structured);
            }
            config
        }
        None => parse_flat(sampling)?,
    };
    let mut config = config;
    if let Some(v) = obj.get("speculative") {
        config.speculative = Some(
            chain_config::SpeculativeConfig::from_json(v, "speculative").map_err(|source| {
                RequestError::Sampling {
                    what: "speculative",
                    source,
                }
            })?,
        );
    }
    let stop = match obj.get("stop_token_ids") {
        None => Vec::new(),
        // Its type and range were checked by the flat parser.
        Some(v) => v
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default(),
    };
    let stop_strings = stop_strings(obj.get("stop"))?;
    let include_stop_str = match obj.get("include_stop_str_in_output") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(RequestError::WrongValue {
                key: "include_stop_str_in_output",
                expected: "a boolean",
                found: type_word(v).into(),
            });
        }
    };
    Ok(Request {
        id: obj.get("id").cloned().unwrap_or(Value::from(index)),
        prompt,
        max_tokens,
        arrival,
        stop_ids: stop,
        stop_strings,
        include_stop_str,
        n: config.sequences.n,
        config,
    })
}

/// `stop`: absent or null (none), a string, or a list of strings; checked
/// by [`crate::stop::check_stops`].
///
/// # Errors
/// [`RequestError::WrongValue`] for another type, [`RequestError::Stop`]
/// for an empty, too long or too many strings.
pub fn stop_strings(v: Option<&Value>) -> Result<Vec<String>, RequestError> {
    let wrong = |found: String| RequestError::WrongValue {
        key: "stop",
        expected: "a string or a list of strings",
        found,
    };
    let stops = match v {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(s.clone()),
                other => Err(wrong(format!("item {i}: {}", type_word(other)))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(wrong(type_word(other).into())),
    };
    crate::stop::check_stops(&stops)?;
    Ok(stops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_parameters_build_the_chain() {
        let r = parse_request(
            r#"{"id": "a", "prompt": "Hi", "max_tokens": 5, "temperature": 0.7, "top_k": 40, "seed": 9, "arrival": 3}"#,
            0,
        )
        .unwrap();
        assert_eq!(r.id, Value::from("a"));
        assert_eq!(r.prompt, Prompt::Text("Hi".into()));
        assert_eq!((r.max_tokens, r.arrival), (5, 3));
        assert_eq!(r.config.chain.seed, Some(9));
        assert_eq!(r.config.chain.chain_string(), "top_k;temperature;dist");
    }

    #[test]
    fn defaults_and_messages() {
        let r =
            parse_request(r#"{"messages": [{"role": "user", "content": "Hello"}]}"#, 4).unwrap();
        assert_eq!(r.id, Value::from(4));
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(
            r.prompt,
            Prompt::Messages(vec![Message::new("user", "Hello")])
        );
    }

    #[test]
    fn toml_and_chain_strings() {
        let r = parse_request(
            r#"{"prompt": "x", "toml": "[[stage]]\ntype = \"top_k\"\nk = 5\n[[stage]]\ntype = \"dist\"", "seed": 3}"#,
            0,
        )
        .unwrap();
        assert_eq!(r.config.chain.chain_string(), "top_k;dist");
        assert_eq!(r.config.chain.seed, Some(3));
        let r = parse_request(
            r#"{"prompt": "x", "chain": "min_p;temperature;dist", "top_logprobs": 3, "stop_token_ids": [7, 9]}"#,
            0,
        )
        .unwrap();
        assert_eq!(r.config.chain.chain_string(), "min_p;temperature;dist");
        assert_eq!(r.config.chain.logprobs.as_ref().map(|l| l.top_n), Some(3));
        assert_eq!(r.stop_ids, vec![7, 9]);
        assert!(
            parse_request(r#"{"prompt": "x", "chain": "top_k;dist", "seed": -1}"#, 0)
                .unwrap_err()
                .to_string()
                .contains("seed")
        );
    }

    #[test]
    fn stop_strings_one_or_a_list() {
        let r = parse_request(r#"{"prompt": "a", "stop": "\n"}"#, 0).unwrap();
        assert_eq!(
            (r.stop_strings, r.include_stop_str),
            (vec!["\n".to_string()], false)
        );
        let r = parse_request(
            r#"{"prompt": "a", "chain": "greedy", "stop": ["x", "日"], "include_stop_str_in_output": true}"#,
            0,
        )
        .unwrap();
        assert_eq!(
            (r.stop_strings, r.include_stop_str),
            (vec!["x".into(), "日".into()], true)
        );
        let err = |line: &str| parse_request(line, 0).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"prompt": "a", "stop": 3}"#),
            "`stop`: expected a string or a list of strings, found a number"
        );
        assert_eq!(
            err(r#"{"prompt": "a", "stop": ["a", 1]}"#),
            "`stop`: expected a string or a list of strings, found item 1: a number"
        );
        assert!(err(r#"{"prompt": "a", "stop": ["a", ""]}"#).contains("item 1 is an empty string"));
        assert!(err(r#"{"prompt": "a", "include_stop_str_in_output": 1}"#).contains("a boolean"));
        assert_eq!(parse_request(r#"{"prompt": "a", "n": 4}"#, 0).unwrap().n, 4);
        let e = err(r#"{"prompt": "a", "n": 0}"#);
        assert!(e.contains("`n` = 0") && e.contains("1..=256"), "{e}");
        assert!(err(r#"{"prompt": "a", "n": 257}"#).contains("1..=256"));
        // Beside a declared chain, and beam search's keys.
        let r = parse_request(r#"{"prompt": "a", "chain": "top_k;dist", "n": 3}"#, 0).unwrap();
        assert_eq!((r.n, r.config.sequences.n), (3, 3));
        let r = parse_request(
            r#"{"prompt": "a", "num_beams": 4, "num_return_sequences": 2, "early_stopping": "never"}"#,
            0,
        )
        .unwrap();
        let b = r.config.sequences.beam.unwrap();
        assert_eq!((r.n, b.num_beams, b.num_return_sequences), (1, 4, 2));
        let e = err(r#"{"prompt": "a", "num_beams": 2, "num_return_sequences": 3}"#);
        assert!(
            e.contains("num_return_sequences") && e.contains("num_beams (2)"),
            "{e}"
        );
    }

    #[test]
    fn speculative_settings() {
        let r = parse_request(
            r#"{"prompt": "a", "speculative": {"num_speculative_tokens": 3}}"#,
            0,
        )
        .unwrap();
        assert_eq!(r.config.speculative.unwrap().num_speculative_tokens, 3);
        let r = parse_request(
            r#"{"prompt": "a", "chain": "greedy", "speculative": {"method": "ngram"}}"#,
            0,
        )
        .unwrap();
        assert!(r.config.speculative.is_some());
        let e = parse_request(
            r#"{"prompt": "a", "speculative": {"num_speculative_tokens": 100}}"#,
            0,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("speculative: `speculative.num_speculative_tokens` = 100"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_key() {
        let err = |line: &str| parse_request(line, 0).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"promt": "x"}"#),
            "unknown key `promt` (did you mean `prompt`?)"
        );
        assert_eq!(
            err(r#"{"prompt": "x", "max_tokens": 0}"#),
            "`max_tokens`: expected an integer in 1..=1048576, found 0"
        );
        assert_eq!(
            err(r#"{"max_tokens": 3}"#),
            "give exactly one of `prompt` and `messages`"
        );
        assert!(err(r#"[1]"#).contains("found an array"));
        assert!(err("{").starts_with("not JSON"));
        assert!(
            err(r#"{"prompt": "x", "top_p": 1.5}"#).starts_with("sampling parameters: "),
            "{}",
            err(r#"{"prompt": "x", "top_p": 1.5}"#)
        );
        assert!(err(r#"{"prompt": "x", "top_p": 1.5}"#).contains("top_p"));
        assert_eq!(
            err(r#"{"prompt": "x", "chain": "top_k;dist", "temperature": 1}"#),
            "`temperature` and `chain` both give the sampling chain: give one"
        );
        assert!(err(r#"{"prompt": "x", "chain": "top_q;dist"}"#).starts_with("chain: "));
        assert!(err(r#"{"messages": []}"#).contains("an empty array"));
        assert!(
            err(r#"{"messages": [{"role": "user"}]}"#).contains("item 0: `content` missing"),
            "{}",
            err(r#"{"messages": [{"role": "user"}]}"#)
        );
        assert!(
            err(r#"{"messages": [{"role": "user", "content": "x", "tone": 1}]}"#)
                .contains("item 0: the key `tone`")
        );
        // No `line:column` into the rebuilt object of sampling keys.
        assert!(
            !err(r#"{"prompt": "x", "top_p": 1.5}"#).contains("1:"),
            "{}",
            err(r#"{"prompt": "x", "top_p": 1.5}"#)
        );
        assert!(err(r#"{"prompt": 5}"#).contains("`prompt`: expected a string, found a number"));
    }
}
