//! `generate`: text generation with a llama2.c checkpoint on burn, sampled on
//! the same device by a sampler-chain serving batch (one request).
//!
//! ```text
//! cargo run --release -p sampler-examples --bin generate -- \
//!     --model models/stories260K --prompt "Once upon a time" -n 200 \
//!     --samplers "top_k;temperature;top_p;dist" --top-k 40 --temp 0.8 --seed 42 --stats
//! ```
//!
//! See `docs/generate.md`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chain_config::{ChainConfig, ConfigError, DeviceConfig, LoadOptions};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use sampler_backend::{BackendError, SamplingBatch};
use sampler_core::{
    ChainSpec, HistoryScope, LogprobsMode, OffloadPolicy, ParamKind, ParamValue, Plan, StageKind,
    StageSpec, TokenId,
};
use sampler_examples::chat::{ChatTokenizer, Message};
use sampler_examples::gguf::{Gguf, is_gguf, llama_checkpoint};
use sampler_examples::llama2::generate::TextCodec;
use sampler_examples::llama2::generate::{GenerateError, Generation, encode_prompt, generate_with};
use sampler_examples::llama2::{Llama2, Llama2Error, ModelFiles};
use sampler_examples::ngram::NgramDrafter;
use serde_json::json;

/// The chain used when neither `--config` nor `--samplers` is given
/// (llama.cpp's default truncation stages, each with its default parameters:
/// top_k 40, top_p 0.95, min_p 0.05, temperature 0.8).
const DEFAULT_SAMPLERS: &str = "top_k;top_p;min_p;temperature;dist";

/// Where `--model` points when it is not given (tried in order).
const DEFAULT_MODEL_DIRS: [&str; 2] = [
    "models/stories260K",
    concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K"),
];

/// Generate text with a llama2.c checkpoint on burn; the sampler chain runs on
/// the same device as the model and only its result is read back.
#[derive(Debug, Parser)]
#[command(name = "generate", version, about, long_about = None)]
pub(crate) struct Args {
    /// Model: a directory with a llama2.c checkpoint (*.bin) and its tokenizer
    /// (tokenizer.bin or tok*.bin), the checkpoint file itself, or a GGUF file
    /// of a Llama-architecture model (*.gguf: weights, tokenizer and chat
    /// template in one file). Default: the repository's models/stories260K.
    #[arg(long, value_name = "DIR|FILE")]
    model: Option<PathBuf>,
    /// Tokenizer file (llama2.c .bin format); default: found beside the checkpoint.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Prompt text (llama2.c: BOS and its leading space are added; GGUF: the
    /// text as is, no BOS).
    #[arg(long, short = 'p', default_value = "", conflicts_with = "chat")]
    prompt: String,
    /// A user message for a GGUF chat model: the file's chat template is
    /// applied (with `--system`, and the assistant's turn opened), and
    /// generation stops at the end of the assistant's turn.
    #[arg(long, value_name = "MESSAGE")]
    chat: Option<String>,
    /// The system message for `--chat` (default: the template's own).
    #[arg(long, value_name = "MESSAGE", requires = "chat")]
    system: Option<String>,
    /// Context positions for a GGUF model (its KV cache and attention span;
    /// at most the model's own context length).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    context: usize,
    /// Tokens to generate (at least 1; generation also stops when the model
    /// emits BOS/EOS or the context is full).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        value_name = "N"
    )]
    pub(crate) n: usize,
    /// Chain declaration in TOML (chain-config; docs/config.md): stages,
    /// parameters, seed, `[device]`, `[speculative]`.
    #[arg(long, value_name = "chain.toml", conflicts_with = "samplers")]
    config: Option<PathBuf>,
    /// Chain as a llama.cpp sampler string, each stage with its default
    /// parameters (default: "top_k;top_p;min_p;temperature;dist").
    #[arg(long, value_name = "STAGES")]
    samplers: Option<String>,
    /// top_k: candidates kept (<= 0 disables).
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    top_k: Option<i64>,
    /// top_p: nucleus mass kept, in [0, 1] (1 disables).
    #[arg(long, value_name = "P", allow_negative_numbers = true, value_parser = parse_f32)]
    top_p: Option<f32>,
    /// min_p: fraction of the top probability, >= 0 (0 disables).
    #[arg(long, value_name = "P", allow_negative_numbers = true, value_parser = parse_f32)]
    min_p: Option<f32>,
    /// typical: locally typical mass, in [0, 1] (1 disables).
    #[arg(long, value_name = "P", allow_negative_numbers = true, value_parser = parse_f32)]
    typical: Option<f32>,
    /// temperature, >= 0 (0 = greedy, 1 disables).
    #[arg(long, alias = "temperature", value_name = "T", allow_negative_numbers = true, value_parser = parse_f32)]
    temp: Option<f32>,
    /// penalties: repetition penalty, > 0 (1 disables).
    #[arg(long, value_name = "R", allow_negative_numbers = true, value_parser = parse_f32)]
    repeat_penalty: Option<f32>,
    /// penalties: history window in tokens (0 disables).
    #[arg(long, value_name = "N")]
    repeat_last_n: Option<usize>,
    /// penalties: frequency penalty (per occurrence).
    #[arg(long, value_name = "F", allow_negative_numbers = true, value_parser = parse_f32)]
    frequency_penalty: Option<f32>,
    /// penalties: presence penalty (once).
    #[arg(long, value_name = "F", allow_negative_numbers = true, value_parser = parse_f32)]
    presence_penalty: Option<f32>,
    /// Any stage parameter by the registry's names, `STAGE.PARAM=VALUE`
    /// (repeatable), e.g. `--param epsilon.epsilon=0.02 --param dry.base=2`;
    /// applied to every stage of that kind after the flags above.
    #[arg(long, value_name = "STAGE.PARAM=VALUE", allow_hyphen_values = true)]
    param: Vec<String>,
    /// Seed of the chain's counter-based randomness (same seed, same tokens on
    /// every device and split). Default: the config's seed, else random.
    #[arg(long)]
    seed: Option<u64>,
    /// Report logprobs: the sampled token's and the N most likely tokens'
    /// (N in 0..=20; OpenAI `top_logprobs`), printed after the text and in
    /// `--json`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=20))]
    logprobs: Option<u64>,
    /// Logprobs of the model's logits (`raw`) or of the distribution the
    /// token was drawn from (`processed`).
    #[arg(long, value_name = "raw|processed", value_parser = parse_mode)]
    logprobs_mode: Option<LogprobsMode>,
    /// Token ids whose logprobs are reported every step (comma-separated).
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    logprob_token_ids: Vec<u32>,
    /// No end of text (EOS / BOS) before this many generated tokens (vLLM
    /// `min_tokens`): adds a `min_tokens` stage at the front of the chain, or
    /// sets the chain's own.
    #[arg(long, value_name = "N")]
    min_tokens: Option<usize>,
    /// Beam search with this many beams (1..=256; Hugging Face semantics):
    /// the chain may hold logits processors only (penalties, logit_bias,
    /// min_tokens, dry, no_repeat_ngram, mask) and is empty by default.
    #[arg(long, value_name = "W")]
    pub(crate) num_beams: Option<usize>,
    /// Beam search: sequences printed, best first (1..=num_beams).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "num_beams")]
    num_return_sequences: usize,
    /// Beam search: a finished sequence scores sum_logprobs / length^P
    /// (length counts the end-of-text token).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 1.0,
        requires = "num_beams",
        allow_negative_numbers = true
    )]
    length_penalty: f64,
    /// Beam search: stop when num_beams sequences have finished (true),
    /// when the best running beam cannot beat them at its current length
    /// (false), or when no running beam can at the length limit (never).
    #[arg(
        long,
        value_name = "true|false|never",
        default_value = "false",
        requires = "num_beams"
    )]
    early_stopping: String,
    /// Stop where the generated text first contains this string (repeat
    /// for several, at most 16, each 1..=256 bytes; found across token
    /// boundaries, held off by --min-tokens). The text ends before it.
    #[arg(long, value_name = "TEXT")]
    stop: Vec<String>,
    /// With --stop: the matched stop string ends the text.
    #[arg(long, requires = "stop")]
    include_stop_str: bool,
    /// Speculative decoding: `ngram` proposes the tokens that followed the
    /// earliest earlier occurrence of the context's longest suffix n-gram
    /// (prompt lookup); the model runs them with the last token in one pass
    /// and the chain verifies them (the same tokens as plain decoding with
    /// the same seed, greedy or sampled). A config's
    /// `[speculative]` table does the same; these flags take precedence.
    #[arg(long, value_name = "ngram", value_parser = ["ngram"])]
    pub(crate) speculative: Option<String>,
    /// Most draft tokens per pass (1..=64).
    #[arg(long, value_name = "K", default_value_t = 4, requires = "speculative")]
    draft_k: usize,
    /// Shortest suffix n-gram the drafter matches.
    #[arg(long, value_name = "N", default_value_t = 2, requires = "speculative")]
    ngram_min: usize,
    /// Longest suffix n-gram the drafter looks for.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "speculative")]
    ngram_max: usize,
    /// Structured output: the text is JSON valid against this JSON Schema
    /// (a file). The chain gets a `mask` stage first; the mask of each step
    /// comes from llguidance. A config's `[structured]` table does the same.
    #[arg(long, value_name = "FILE", group = "structured")]
    json_schema: Option<std::path::PathBuf>,
    /// Structured output: the text is a JSON object.
    #[arg(long, group = "structured")]
    json_object: bool,
    /// Structured output: the whole text matches this regular expression.
    #[arg(long, value_name = "RE", group = "structured")]
    regex: Option<String>,
    /// Structured output: the text is a sentence of this Lark grammar (a
    /// file, llguidance's dialect).
    #[arg(long, value_name = "FILE", group = "structured")]
    grammar: Option<std::path::PathBuf>,
    /// Device for the model and the chain: flex (burn's CPU backend), ndarray,
    /// wgpu, vulkan, cuda or cuda:N; only compiled-in backends are accepted.
    /// Default: the config's `[device]` kind, else flex.
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// How much of the chain runs on the device: auto (longest capable
    /// prefix), off (host only) or N (at most N active stages).
    #[arg(long, value_name = "auto|off|N")]
    offload: Option<String>,
    /// After generating, print the plan (device stages, host stages, readback
    /// format), bytes read back per step and tokens per second (to stderr).
    #[arg(long)]
    stats: bool,
    /// Print one JSON object (tokens, text, plan, stats) instead of streamed text.
    #[arg(long)]
    json: bool,
    /// Never show the progress bar (shown on stderr when stdout is not a terminal).
    #[arg(long)]
    no_progress: bool,
}

/// A float flag: any number that fits an `f32` (ranges are checked with the
/// chain, naming the stage and parameter); `1e39` is refused as written,
/// never read as `inf`.
fn parse_f32(text: &str) -> Result<f32, String> {
    let x: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    let f = x as f32;
    if x.is_finite() && f.is_infinite() {
        return Err(format!("`{text}` is beyond the f32 range (about ±3.4e38)"));
    }
    Ok(f)
}

/// Everything `generate` can fail with; each names what the user can fix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    #[error("{0}")]
    Usage(String),
    #[error("chain config: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Model(#[from] Llama2Error),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Gguf(#[from] sampler_examples::gguf::GgufError),
    #[error(transparent)]
    Chat(#[from] sampler_examples::chat::ChatError),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

fn parse_mode(s: &str) -> Result<LogprobsMode, String> {
    LogprobsMode::from_word(s).ok_or_else(|| format!("`{s}` is not raw or processed"))
}

fn parse_offload(s: &str) -> Result<OffloadPolicy, AppError> {
    s.parse()
        .map_err(|e| AppError::Usage(format!("--offload {e}")))
}

/// Parse one `--param STAGE.PARAM=VALUE` by the stage registry: the stage
/// and parameter names (aliases accepted) and the value's kind.
fn parse_param(text: &str) -> Result<(StageKind, &'static str, ParamValue), AppError> {
    let usage = |why: String| {
        AppError::Usage(format!(
            "--param {text}: {why} (expected STAGE.PARAM=VALUE, e.g. --param epsilon.epsilon=0.02)"
        ))
    };
    let (key, value) = text.split_once('=').ok_or_else(|| usage("no `=`".into()))?;
    let (stage, param) = key
        .trim()
        .split_once('.')
        .ok_or_else(|| usage("no `.` between the stage and the parameter".into()))?;
    let kind =
        StageKind::from_name(stage).ok_or_else(|| usage(format!("unknown stage `{stage}`")))?;
    let meta = kind.meta();
    let pm = meta.param(param.trim()).ok_or_else(|| {
        let names: Vec<&str> = meta.params.iter().map(|p| p.name).collect();
        usage(format!(
            "`{}` has no parameter `{param}` (it has: {})",
            meta.name,
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ))
    })?;
    let value = value.trim();
    let bad = || usage(format!("`{value}` is not {}", pm.range));
    let v = match pm.kind {
        ParamKind::Int => ParamValue::Int(value.parse().map_err(|_| bad())?),
        ParamKind::Float => ParamValue::Float(parse_f32(value).map_err(&usage)?),
        ParamKind::Enum(_) => ParamValue::Scope(HistoryScope::from_word(value).ok_or_else(bad)?),
        ParamKind::TokenIds => ParamValue::Ids(
            value
                .split(',')
                .map(|t| t.trim().parse::<u32>())
                .collect::<Result<_, _>>()
                .map_err(|_| bad())?,
        ),
        ParamKind::TokenSequences | ParamKind::TokenBiases => {
            return Err(usage(format!(
                "`{}.{}` takes a list; set it in a --config TOML file",
                meta.name, pm.name
            )));
        }
    };
    Ok((kind, pm.name, v))
}

/// Apply the per-stage flags (and every `--param`) to every stage of the
/// matching kind, through the registry's parameter setter; returns warnings
/// for flags whose stage is not in the chain.
fn apply_overrides(chain: &mut ChainSpec, a: &Args) -> Result<Vec<String>, AppError> {
    let f = |x: Option<f32>| x.map(ParamValue::Float);
    let mut sets: Vec<(String, StageKind, &'static str, ParamValue)> = [
        (
            "--top-k",
            StageKind::TopK,
            "k",
            a.top_k.map(ParamValue::Int),
        ),
        ("--top-p", StageKind::TopP, "p", f(a.top_p)),
        ("--min-p", StageKind::MinP, "p", f(a.min_p)),
        ("--typical", StageKind::Typical, "p", f(a.typical)),
        ("--temp", StageKind::Temperature, "t", f(a.temp)),
        (
            "--repeat-penalty",
            StageKind::Penalties,
            "repeat",
            f(a.repeat_penalty),
        ),
        (
            "--repeat-last-n",
            StageKind::Penalties,
            "last_n",
            a.repeat_last_n
                .map(|n| ParamValue::Int(i64::try_from(n).unwrap_or(i64::MAX))),
        ),
        (
            "--frequency-penalty",
            StageKind::Penalties,
            "frequency",
            f(a.frequency_penalty),
        ),
        (
            "--presence-penalty",
            StageKind::Penalties,
            "presence",
            f(a.presence_penalty),
        ),
    ]
    .into_iter()
    .filter_map(|(flag, kind, name, v)| Some((flag.to_string(), kind, name, v?)))
    .collect();
    for text in &a.param {
        let (kind, name, v) = parse_param(text)?;
        sets.push((format!("--param {text}"), kind, name, v));
    }
    let mut warnings = Vec::new();
    for (flag, kind, name, value) in sets {
        let mut hit = false;
        for s in chain.stages.iter_mut().filter(|s| s.kind() == kind) {
            s.set_param(name, value.clone()).map_err(|_| {
                AppError::Usage(format!(
                    "{flag}: not a valid value for `{}.{name}` ({})",
                    kind.name(),
                    kind.meta().param(name).map_or("", |p| p.range)
                ))
            })?;
            hit = true;
        }
        if !hit {
            warnings.push(format!(
                "{flag} has no effect: the chain has no {} stage",
                kind.name()
            ));
        }
    }
    Ok(warnings)
}

/// The chain: `--config` or `--samplers` (or the default), then the flags.
pub(crate) fn build_chain(a: &Args) -> Result<(ChainConfig, Vec<String>), AppError> {
    // Beam search takes a chain of logits processors only (no selecting
    // stage), by default none.
    let beam = a.num_beams.is_some();
    let opts = LoadOptions {
        require_selection: !beam,
    };
    let base = match (&a.config, &a.samplers) {
        (Some(path), _) if beam => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| AppError::Usage(format!("{}: {e}", path.display())))?;
            ChainConfig::from_toml_str_with(&text, &opts)?
        }
        (Some(path), _) => ChainConfig::from_toml_file(path)?,
        (None, Some(s)) => ChainConfig::from_chain_string_with(s, &opts)?,
        (None, None) if beam => ChainConfig::new(ChainSpec::new(Vec::new(), None)),
        (None, None) => ChainConfig::from_chain_string(DEFAULT_SAMPLERS)?,
    };
    let mut chain = base.chain;
    let warnings = apply_overrides(&mut chain, a)?;
    if let Some(n) = a.min_tokens {
        match chain
            .stages
            .iter_mut()
            .find(|s| matches!(s, StageSpec::MinTokens { .. }))
        {
            Some(StageSpec::MinTokens { n: m, .. }) => *m = n,
            _ => chain.stages.insert(
                0,
                StageSpec::MinTokens {
                    n,
                    stop: Vec::new(),
                },
            ),
        }
    }
    if a.logprobs.is_some() || a.logprobs_mode.is_some() || !a.logprob_token_ids.is_empty() {
        let lp = chain.logprobs.get_or_insert_with(Default::default);
        if let Some(n) = a.logprobs {
            lp.top_n = n as usize;
        }
        if let Some(m) = a.logprobs_mode {
            lp.mode = m;
        }
        if !a.logprob_token_ids.is_empty() {
            lp.token_ids = a.logprob_token_ids.clone();
        }
    }
    if a.seed.is_some() {
        chain.seed = a.seed;
    }
    let mut device = base.device;
    if let Some(d) = &a.device {
        device.device = d.clone();
    }
    if let Some(o) = &a.offload {
        device.offload = parse_offload(o)?;
    }
    // Re-validate after the flags (ranges, a selecting stage).
    let mut cfg = if beam && chain.stages.is_empty() {
        let mut c = ChainConfig::new(chain);
        c.device = device;
        c
    } else {
        ChainConfig::validated(chain, device, &opts)?
    };
    cfg.speculative = base.speculative;
    cfg.set_structured(base.structured);
    // The loader's notes, without the ones re-validation found again.
    for d in base.diagnostics {
        if !cfg.diagnostics.contains(&d) {
            cfg.diagnostics.push(d);
        }
    }
    Ok((cfg, warnings))
}

/// A model ready to run: the forward pass, its tokenizer, the prompt's ids.
pub(crate) struct Loaded {
    pub(crate) model: Llama2,
    pub(crate) codec: Box<dyn TextCodec>,
    pub(crate) prompt_tokens: Vec<TokenId>,
    model_file: PathBuf,
    tokenizer_file: PathBuf,
}

/// Load a llama2.c checkpoint or a GGUF model and encode the prompt.
pub(crate) fn load_model(
    a: &Args,
    path: &Path,
    device: &burn_tensor::Device,
) -> Result<Loaded, AppError> {
    if is_gguf(path) {
        let g = Gguf::read(path)?;
        let ckpt = llama_checkpoint(&g, a.context)?;
        let chat = ChatTokenizer::from_gguf(&g)?;
        let prompt_tokens = match &a.chat {
            Some(user) => {
                let mut messages = Vec::new();
                if let Some(system) = &a.system {
                    messages.push(Message::new("system", system));
                }
                messages.push(Message::new("user", user));
                chat.encode(&chat.apply_chat_template(&messages, true)?)?
            }
            None if a.prompt.is_empty() => vec![chat.bos],
            None => chat.encode(&a.prompt)?,
        };
        if prompt_tokens.len() > ckpt.config.seq_len {
            return Err(Llama2Error::PromptTooLong {
                tokens: prompt_tokens.len(),
                seq_len: ckpt.config.seq_len,
            }
            .into());
        }
        return Ok(Loaded {
            model: Llama2::new(&ckpt, device),
            codec: Box::new(chat),
            prompt_tokens,
            model_file: path.to_path_buf(),
            tokenizer_file: path.to_path_buf(),
        });
    }
    if a.chat.is_some() {
        return Err(AppError::Usage(
            "--chat needs a GGUF chat model (--model FILE.gguf): a llama2.c checkpoint has no chat template".into(),
        ));
    }
    let files = ModelFiles::locate(path, a.tokenizer.as_deref())?;
    let (ckpt, tokenizer) = files.load()?;
    let model = Llama2::new(&ckpt, device);
    let prompt_tokens = encode_prompt(&model, &tokenizer, &a.prompt)?;
    Ok(Loaded {
        model,
        codec: Box::new(tokenizer),
        prompt_tokens,
        model_file: files.checkpoint,
        tokenizer_file: files.tokenizer,
    })
}

/// `--model`, or the first default directory that exists.
pub(crate) fn model_path(a: &Args) -> Result<PathBuf, AppError> {
    if let Some(m) = &a.model {
        return Ok(m.clone());
    }
    DEFAULT_MODEL_DIRS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .ok_or_else(|| {
            AppError::Usage(format!(
                "no --model given and the default model directory {} was not found; pass \
                 --model DIR (a llama2.c checkpoint and its tokenizer, e.g. stories260K from \
                 huggingface.co/karpathy/tinyllamas)",
                DEFAULT_MODEL_DIRS[0]
            ))
        })
}

/// The burn device and offload policy: `cpu` means flex with nothing offloaded.
pub(crate) fn device_of(
    cfg: &DeviceConfig,
) -> Result<(burn_tensor::Device, OffloadPolicy), AppError> {
    Ok(sampler_backend::resolve_device(&cfg.device, cfg.offload)?)
}

fn run(a: Args) -> Result<(), AppError> {
    sampler_examples::stop::check_stops(&a.stop)
        .map_err(|e| AppError::Usage(e.to_string().replacen("`stop`", "--stop", 1)))?;
    if a.n == 0 {
        return Err(AppError::Usage(
            "-n 0: the number of tokens to generate must be at least 1".into(),
        ));
    }
    let (mut cfg, warnings) = build_chain(&a)?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    for d in &cfg.diagnostics {
        eprintln!("note: {d}");
    }
    let structured = sampler_examples::structured::from_flags(
        a.json_schema.as_deref(),
        a.json_object,
        a.regex.as_deref(),
        a.grammar.as_deref(),
    )
    .map_err(AppError::Usage)?;
    if let Some(s) = structured {
        if let Some(old) = &cfg.structured {
            eprintln!(
                "note: the {} flag replaces the config's [structured] {}",
                s.kind(),
                old.kind()
            );
        }
        cfg.set_structured(Some(s));
    }
    let (device, policy) = device_of(&cfg.device)?;
    // The flags, else the config's `[speculative]` table.
    let drafter = match (a.speculative.as_deref(), &cfg.speculative) {
        (Some(_), _) => {
            Some(NgramDrafter::new(a.ngram_min, a.ngram_max, a.draft_k).map_err(AppError::Usage)?)
        }
        (None, Some(sp)) => Some(
            NgramDrafter::new(
                sp.prompt_lookup_min,
                sp.prompt_lookup_max,
                sp.num_speculative_tokens,
            )
            .map_err(AppError::Usage)?,
        ),
        (None, None) => None,
    };
    // Drafts are not checked against a grammar: one or the other.
    let drafter = match (&cfg.structured, drafter) {
        (Some(s), Some(_)) => {
            eprintln!(
                "note: speculative decoding is off with structured output ({}): drafts are not checked against it",
                s.kind()
            );
            None
        }
        (_, d) => d,
    };

    let model_dir = model_path(&a)?;
    let loaded = load_model(&a, &model_dir, &device)?;
    let Loaded {
        model,
        codec,
        prompt_tokens,
        model_file,
        tokenizer_file,
    } = loaded;
    let tokenizer: &dyn TextCodec = codec.as_ref();
    // The model's end-of-text tokens are the stop ids of `min_tokens`.
    cfg.chain.fill_stop_ids(&tokenizer.stop_ids());
    let c = *model.config();
    let room = c.seq_len + 1 - prompt_tokens.len();
    let n = if a.n > room {
        eprintln!(
            "note: -n {} does not fit the context ({} tokens, {} used by the prompt); \
             generating at most {room}",
            a.n,
            c.seq_len,
            prompt_tokens.len()
        );
        room
    } else {
        a.n
    };

    let mut batch = SamplingBatch::new(c.vocab_size, &device, policy)?;
    let beam = match a.num_beams {
        Some(w) => Some(sampler_core::BeamSpec {
            num_beams: w,
            num_return_sequences: a.num_return_sequences,
            length_penalty: a.length_penalty,
            early_stopping: sampler_core::EarlyStopping::from_word(&a.early_stopping).ok_or_else(
                || {
                    AppError::Usage(format!(
                        "--early-stopping {}: expected true, false or never",
                        a.early_stopping
                    ))
                },
            )?,
        }),
        None => cfg.sequences.beam,
    };
    if cfg.sequences.n > 1 {
        return Err(AppError::Usage(format!(
            "n = {} in the chain's declaration: generate writes one sequence (use `serve` for several choices, or beam search)",
            cfg.sequences.n
        )));
    }
    if let (Some(_), Some(s)) = (beam, &cfg.structured) {
        return Err(AppError::Usage(format!(
            "beam search with structured output ({}): not supported",
            s.kind()
        )));
    }
    if let Some(b) = beam {
        return run_beams(
            &a,
            b,
            &cfg,
            &model,
            tokenizer,
            &mut batch,
            &prompt_tokens,
            n,
        );
    }
    let id = batch.insert(cfg.chain.clone(), &[])?;
    if let Some(s) = &cfg.structured {
        let refused = |e: sampler_core::ConstraintError| {
            let flag = match s.kind() {
                "json_schema" if a.json_schema.is_some() => "--json-schema",
                "json_object" if a.json_object => "--json-object",
                "regex" if a.regex.is_some() => "--regex",
                "grammar" if a.grammar.is_some() => "--grammar",
                _ => "[structured]",
            };
            AppError::Usage(format!("{flag}: {e}"))
        };
        let view = sampler_examples::structured::view(tokenizer, c.vocab_size).map_err(refused)?;
        let m = sampler_examples::structured::matcher(&std::sync::Arc::new(view), s)
            .map_err(refused)?;
        batch.set_constraint(id, Some(m))?;
    }
    // The seed actually used (drawn from the OS when none was given), so a
    // run can be replayed from its own output.
    let seed = batch.spec(id).and_then(|s| s.seed);

    let stdout = std::io::stdout();
    let to_terminal = stdout.is_terminal();
    let progress = if !to_terminal && !a.no_progress {
        let pb = ProgressBar::new(n as u64);
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} {pos}/{len} tokens [{elapsed_precise}] {per_sec}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(pb)
    } else {
        None
    };

    let mut out = stdout.lock();
    let mut write_err: Option<std::io::Error> = None;
    if !a.json {
        // The prompt as typed (decoded from its tokens, so what the model saw).
        out.write_all(&tokenizer.decode_bytes(&prompt_tokens))?;
        out.flush()?;
    }
    let stream = !a.json;
    let min_tokens = cfg
        .chain
        .stages
        .iter()
        .filter_map(|s| match s {
            StageSpec::MinTokens { n, .. } => Some(*n),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut text_stream =
        sampler_examples::stop::TextStream::new(a.stop.clone(), a.include_stop_str, min_tokens)
            .map_err(|e| AppError::Usage(e.to_string().replacen("`stop`", "--stop", 1)))?;
    let mut stop_string = None;
    let generation: Generation = generate_with(
        &model,
        tokenizer,
        &mut batch,
        id,
        &prompt_tokens,
        n,
        drafter.as_ref(),
        |_, bytes| {
            if let Some(pb) = &progress {
                pb.inc(1);
            }
            let delta = text_stream.push(bytes);
            if stream
                && write_err.is_none()
                && let Err(e) = out
                    .write_all(delta.text.as_bytes())
                    .and_then(|()| out.flush())
            {
                write_err = Some(e);
            }
            match delta.stop {
                Some(s) => {
                    stop_string = Some(s);
                    std::ops::ControlFlow::Break(())
                }
                None => std::ops::ControlFlow::Continue(()),
            }
        },
    )?;
    let tail = text_stream.finish();
    if stream && write_err.is_none() {
        out.write_all(tail.as_bytes())?;
    }
    if let Some(pb) = &progress {
        pb.finish_and_clear();
    }
    if let Some(e) = write_err {
        return Err(e.into());
    }

    let plan = batch.plan(id).expect("the request is live");
    let mut all = generation.prompt_tokens.clone();
    all.extend(&generation.tokens);
    let (text, generated_text) = if a.stop.is_empty() {
        let p = tokenizer.decode_bytes(&generation.prompt_tokens).len();
        let all = tokenizer.decode_bytes(&all);
        (
            String::from_utf8_lossy(&all).into_owned(),
            String::from_utf8_lossy(&all[p..]).into_owned(),
        )
    } else {
        // Cut at the stop string.
        let prompt = tokenizer.decode_bytes(&generation.prompt_tokens);
        let g = text_stream.text().to_string();
        (format!("{}{g}", String::from_utf8_lossy(&prompt)), g)
    };
    let device_name = cfg.device.device.clone();

    if a.json {
        let v = json!({
            "model": model_file.display().to_string(),
            "tokenizer": tokenizer_file.display().to_string(),
            "device": device_name,
            "chain": cfg.chain.chain_string(),
            "seed": seed,
            "prompt": a.prompt,
            "prompt_tokens": generation.prompt_tokens,
            "tokens": generation.tokens,
            "text": text,
            "generated_text": generated_text,
            "stop_reason": generation.stop.as_str(),
            "stop_string": stop_string,
            "logprobs": sampler_examples::report::logprobs_json(tokenizer, &generation.logprobs),
            "plan": sampler_examples::report::plan_json(plan, &device_name, policy),
            "stats": {
                "steps": generation.steps,
                "bytes_read": generation.bytes_read,
                "bytes_read_per_step": generation.bytes_per_step(),
                "bytes_read_per_row_per_step": generation.bytes_per_step(),
                "prompt_seconds": generation.prompt_time.as_secs_f64(),
                "generate_seconds": generation.gen_time.as_secs_f64(),
                "tokens_per_second": generation.tokens_per_second(),
                "speculative": generation.speculative.map(|st| json!({
                    "passes": st.passes,
                    "proposed": st.proposed,
                    "accepted": st.accepted,
                    "acceptance_rate": st.acceptance_rate(),
                    "tokens_per_pass": generation.steps as f64 / st.passes.max(1) as f64,
                    "verify_seconds": st.verify_time.as_secs_f64(),
                })),
                "kernels_per_step": generation.kernels.map(|k| json!({
                    "model": k.model,
                    "sampling": k.sampling,
                    "sampling_bytes_read": k.sampling_bytes_read,
                    "sampling_reads_of_logits": k.reads_of_logits(),
                    "sampling_undeclared": k.sampling_undeclared,
                })),
            },
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
        print_logprobs(&mut out, tokenizer, &generation)?;
    }
    out.flush()?;

    if a.stats {
        print_stats(&model_file, &c, &device_name, plan, seed, &generation);
    }
    Ok(())
}

/// `--num-beams`: beam search; the best sequences, best first.
#[allow(clippy::too_many_arguments)]
fn run_beams(
    a: &Args,
    beam: sampler_core::BeamSpec,
    cfg: &ChainConfig,
    model: &Llama2,
    tokenizer: &dyn TextCodec,
    batch: &mut SamplingBatch,
    prompt_tokens: &[TokenId],
    n: usize,
) -> Result<(), AppError> {
    let num_beams = beam.num_beams;
    let params = sampler_cpu::beam::BeamParams {
        num_beams,
        num_return_sequences: beam.num_return_sequences,
        length_penalty: beam.length_penalty,
        early_stopping: beam.early_stopping,
        eos: Vec::new(),
        max_new_tokens: n,
    };
    let out = sampler_examples::llama2::generate::beam_search(
        model,
        tokenizer,
        batch,
        &cfg.chain,
        prompt_tokens,
        params,
    )?;
    let prompt = tokenizer.decode_bytes(prompt_tokens);
    let text_of = |tokens: &[TokenId]| {
        let mut all = prompt_tokens.to_vec();
        all.extend(tokens);
        let bytes = tokenizer.decode_bytes(&all);
        String::from_utf8_lossy(&bytes[prompt.len().min(bytes.len())..]).into_owned()
    };
    let mut stdout = std::io::stdout().lock();
    if a.json {
        let v = json!({
            "chain": cfg.chain.chain_string(),
            "prompt": a.prompt,
            "prompt_tokens": prompt_tokens,
            "num_beams": num_beams,
            "length_penalty": beam.length_penalty,
            "early_stopping": beam.early_stopping.word(),
            "sequences": out.hypotheses.iter().map(|h| json!({
                "tokens": h.tokens,
                "text": text_of(&h.tokens),
                "sum_logprobs": h.sum_logprobs,
                "score": h.score,
            })).collect::<Vec<_>>(),
            "stats": {
                "steps": out.steps,
                "beam_rows": out.rows,
                "bytes_read": out.bytes_read,
                "prompt_seconds": out.prompt_time.as_secs_f64(),
                "search_seconds": out.gen_time.as_secs_f64(),
                "sampling_seconds": out.sampling_time.as_secs_f64(),
            },
        });
        writeln!(stdout, "{v}")?;
    } else {
        for (i, h) in out.hypotheses.iter().enumerate() {
            writeln!(
                stdout,
                "[{i}] score {:.4} (sum of logprobs {:.4}, {} tokens): {}{}",
                h.score,
                h.sum_logprobs,
                h.tokens.len(),
                String::from_utf8_lossy(&prompt),
                text_of(&h.tokens)
            )?;
        }
    }
    if a.stats {
        let secs = out.gen_time.as_secs_f64().max(1e-9);
        eprintln!(
            "beam search: {} beams, {} steps, {} beam rows ({:.1} rows/s), the chain and top-2W selection {:.1} % of the search time, {} bytes read back",
            num_beams,
            out.steps,
            out.rows,
            out.rows as f64 / secs,
            100.0 * out.sampling_time.as_secs_f64() / secs,
            out.bytes_read
        );
    }
    Ok(())
}

/// A token's text for the logprobs listing (its piece, quoted).
fn piece(tokenizer: &dyn TextCodec, t: TokenId) -> String {
    match tokenizer.token_text(t) {
        Some(p) => format!("{p:?}"),
        None => format!("<{t}>"),
    }
}

/// One line per step: the token, its logprob, the top tokens.
fn print_logprobs(
    out: &mut impl Write,
    tokenizer: &dyn TextCodec,
    g: &Generation,
) -> std::io::Result<()> {
    if g.logprobs.iter().all(Option::is_none) {
        return Ok(());
    }
    writeln!(
        out,
        "logprobs (step: token logprob | top tokens | requested ids):"
    )?;
    for (step, lp) in g.logprobs.iter().enumerate() {
        let Some(lp) = lp else { continue };
        let top: Vec<String> = lp
            .top
            .iter()
            .map(|&(t, l)| format!("{} {l:.4}", piece(tokenizer, t)))
            .collect();
        let req: Vec<String> = lp
            .requested
            .iter()
            .map(|&(t, l)| format!("{t} {l:.4}"))
            .collect();
        writeln!(
            out,
            "{step:>4}: {} {:.4} | {} | {}",
            piece(tokenizer, lp.token.0),
            lp.token.1,
            top.join(", "),
            req.join(", ")
        )?;
    }
    Ok(())
}

fn print_stats(
    ckpt: &Path,
    c: &sampler_examples::llama2::Config,
    device: &str,
    plan: &Plan,
    seed: Option<u64>,
    g: &Generation,
) {
    eprintln!("--- stats ---");
    eprintln!(
        "model:     {} (dim {}, {} layers, {} heads / {} kv heads, vocab {}, context {}) on {device}",
        ckpt.display(),
        c.dim,
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        c.vocab_size,
        c.seq_len
    );
    for line in plan.to_string().lines() {
        eprintln!("plan:      {line}");
    }
    if let Some(seed) = seed {
        eprintln!("seed:      {seed} (--seed {seed} replays this run)");
    }
    eprintln!(
        "prompt:    {} tokens in {:.1} ms",
        g.prompt_tokens.len(),
        g.prompt_time.as_secs_f64() * 1e3
    );
    eprintln!(
        "generated: {} tokens in {:.1} ms = {:.1} tokens/s (stop: {})",
        g.steps,
        g.gen_time.as_secs_f64() * 1e3,
        g.tokens_per_second(),
        g.stop.as_str()
    );
    eprintln!(
        "read back: {} bytes in {} steps = {:.0} bytes/row/step",
        g.bytes_read,
        g.steps,
        g.bytes_per_step()
    );
    if let Some(st) = g.speculative {
        eprintln!(
            "speculative: {} passes, {} drafts proposed, {} accepted ({:.1} %), {:.2} tokens per pass, verification {:.1} % of the generation time",
            st.passes,
            st.proposed,
            st.accepted,
            100.0 * st.acceptance_rate(),
            g.steps as f64 / st.passes.max(1) as f64,
            100.0 * st.verify_time.as_secs_f64() / g.gen_time.as_secs_f64().max(1e-9)
        );
    }
    if let Some(k) = g.kernels {
        eprintln!(
            "kernels:   {} per step: {} sampling + {} model (the second step, counted on {device})",
            k.sampling + k.model,
            k.sampling,
            k.model
        );
        let bound = if k.sampling_undeclared > 0 {
            format!(
                " at least ({} of burn's kernels not counted)",
                k.sampling_undeclared
            )
        } else {
            String::new()
        };
        eprintln!(
            "sampling:  reads {} bytes of device memory per step{bound} = {:.2} reads of the logits",
            k.sampling_bytes_read,
            k.reads_of_logits()
        );
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            let top = e.to_string();
            eprintln!("error: {top}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                let msg = s.to_string();
                if !top.contains(&msg) {
                    eprintln!("  caused by: {msg}");
                }
                src = s.source();
            }
            ExitCode::FAILURE
        }
    }
}
