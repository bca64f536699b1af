//! # chain-config
//!
//! The one front door for declaring a sampler chain. Every way in produces a
//! [`ChainConfig`]: a validated [`ChainSpec`] (sampler-core's declarative
//! chain), a [`DeviceConfig`] for the device planner, and [`Diagnostic`]s.
//!
//! | source | entry point |
//! |---|---|
//! | TOML file or text (`docs/config.md`) | [`ChainConfig::from_toml_file`], [`ChainConfig::from_toml_str`] |
//! | llama.cpp `--samplers` string (`"top_k;top_p;temperature;dist"`) | [`ChainConfig::from_chain_string`] |
//! | llama.cpp `--sampling-seq` letters (`"kpt"`, `dist` appended) | [`ChainConfig::from_sampling_seq`] |
//! | tagged JSON (serde of [`ChainSpec`]) | [`ChainConfig::from_json`] |
//! | OpenAI / vLLM flat parameters | [`SamplingParams::to_chain`] |
//! | Hugging Face `generation_config.json` under a request | [`ChainConfig::from_request`] |
//!
//! ```
//! use chain_config::ChainConfig;
//!
//! let cfg = ChainConfig::from_toml_str(r#"
//! samplers = "top_k;top_p;temperature;dist"
//! seed = 42
//!
//! [top_k]
//! k = 40
//!
//! [temp]          # aliases work for tables too
//! t = 0.7
//! "#)?;
//! assert_eq!(cfg.chain.chain_string(), "top_k;top_p;temperature;dist");
//! assert_eq!(cfg.chain.seed, Some(42));
//! // Serialising and loading again gives the same chain.
//! assert_eq!(ChainConfig::from_toml_str(&cfg.to_toml_string())?, cfg);
//! # Ok::<(), chain_config::ConfigError>(())
//! ```
//!
//! Errors ([`ConfigError`]) name the key path, the value, the valid range and
//! the `line:column`, and suggest the closest name for unknown stages and
//! keys. Nothing in this crate panics on user input.

#![warn(missing_docs)]

mod chain_string;
mod convert;
mod error;
mod flat;
mod hf;
mod json;
mod located;
mod params;
mod sequences;
mod speculative;
mod structured;
mod suggest;
mod toml_in;
mod toml_out;
mod values;

use std::path::Path;

pub use chain_string::DEFAULT_ORDER;
pub use error::{ConfigError, Diagnostic, Location};
pub use flat::{LogprobsFlag, SamplingParams, StageKeys, WHOLE_HISTORY, flat_keys};
pub use hf::GenerationConfig;
pub use params::default_stage;
pub use sampler_core::StructuredOutput;
pub use sampler_core::{BeamSpec, EarlyStopping, MAX_SEQUENCES, Sequences};
pub use sampler_core::{ChainSpec, HistoryScope, OffloadPolicy, StageKind, StageSpec};
pub use sequences::EarlyStoppingFlag;
pub use speculative::{MAX_SPECULATIVE_TOKENS, SpeculativeConfig, SpeculativeMethod};
pub use structured::STRUCTURED_KEYS;

/// Device names accepted in `[device] kind`, optionally followed by
/// `:index` (`cuda:1`; GPU backends only). `cpu` is the whole chain on the
/// host with sampler-cpu, nothing offloaded (a burn app keeps its logits on
/// `flex`, see `sampler_backend::resolve_device`); the others are
/// sampler-backend's burn backends (whether one is compiled in is checked
/// when the chain is built, not here).
pub const KNOWN_DEVICES: [&str; 6] = ["cpu", "flex", "ndarray", "wgpu", "vulkan", "cuda"];

pub(crate) const OFFLOAD_RANGE: &str = "\"auto\" (fastest where known: the longest device-capable prefix on a GPU, the host on a CPU device), \"off\" (host only), \"device\" (longest device-capable prefix on any device) or an integer N >= 0 (at most N active stages on the device)";

/// Check a device name: a [`KNOWN_DEVICES`] entry, optionally `:index`.
/// Returns the name, or the expected range in words.
pub(crate) fn check_device(name: &str) -> Result<String, String> {
    let (base, index) = match name.split_once(':') {
        Some((b, i)) => (b, Some(i)),
        None => (name, None),
    };
    let indexed = matches!(base, "wgpu" | "vulkan" | "cuda");
    let index_ok =
        index.is_none_or(|i| indexed && !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    if KNOWN_DEVICES.contains(&base) && index_ok {
        Ok(name.to_string())
    } else {
        let mut expected = format!(
            "one of {}, optionally with `:index` (e.g. \"cuda:1\")",
            KNOWN_DEVICES.join(", ")
        );
        if let Some(s) = suggest::suggest(base, KNOWN_DEVICES) {
            expected.push_str(&format!("; did you mean \"{s}\"?"));
        }
        Err(expected)
    }
}

/// Where the chain runs: read by the device planner (sampler-backend).
///
/// TOML: `[device] kind = "cuda"`, `offload = "auto" | "off" | "device" | N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name (TOML key `kind`): one of [`KNOWN_DEVICES`], optionally
    /// `:index`. Default `"flex"` (burn's CPU backend).
    pub device: String,
    /// How much of the chain may be offloaded. Default [`OffloadPolicy::Auto`].
    pub offload: OffloadPolicy,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            device: "flex".into(),
            offload: OffloadPolicy::Auto,
        }
    }
}

/// Options of the loaders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Refuse a chain with no selecting stage (`greedy`, `dist`, `mirostat`,
    /// `mirostat_v2`) with [`ConfigError::NoSelectingStage`]. Default `true`:
    /// a chain is asked for tokens. Set `false` for a chain used only to
    /// filter candidates or compute probabilities.
    pub require_selection: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            require_selection: true,
        }
    }
}

/// A loaded, validated chain declaration.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainConfig {
    /// The chain: stages in order, every parameter in range, and the seed.
    pub chain: ChainSpec,
    /// Device and offload policy.
    pub device: DeviceConfig,
    /// Speculative decoding (TOML `[speculative]`), `None` when not asked for.
    pub speculative: Option<SpeculativeConfig>,
    /// Several sequences per request: `n` samples or a beam search (TOML
    /// `[sequences]`; flat keys `n`, `num_beams`, `num_return_sequences`,
    /// `length_penalty`, `early_stopping`). Default one sample.
    pub sequences: Sequences,
    /// Structured output (TOML `[structured]`; flat keys `response_format`,
    /// `guided_json`, `guided_regex`, `guided_grammar`, `guided_choice`),
    /// `None` when not asked for. The chain then has a `mask` stage first.
    pub structured: Option<StructuredOutput>,
    /// Notes about the declaration (ignored parameters, ...). Not serialised.
    pub diagnostics: Vec<Diagnostic>,
}

impl ChainConfig {
    /// Wrap a chain built in code (default device, no diagnostics). Not
    /// validated: use [`ChainConfig::validated`] for that.
    pub fn new(chain: ChainSpec) -> Self {
        Self {
            chain,
            device: DeviceConfig::default(),
            speculative: None,
            sequences: Sequences::default(),
            structured: None,
            diagnostics: Vec::new(),
        }
    }

    /// Give the request a structured output (or none): with one, a `mask`
    /// stage goes first in the chain unless one already stands before its
    /// selecting stage.
    pub fn set_structured(&mut self, structured: Option<StructuredOutput>) {
        if structured.is_some() {
            structured::ensure_mask(&mut self.chain);
        }
        self.structured = structured;
    }

    /// Validate a chain built in code, as the loaders do.
    ///
    /// # Errors
    /// As [`ChainConfig::from_toml_str_with`]: empty chain, a parameter out of
    /// range (path `stage[i].param`), no selecting stage when `opts` requires one.
    pub fn validated(
        chain: ChainSpec,
        device: DeviceConfig,
        opts: &LoadOptions,
    ) -> Result<Self, ConfigError> {
        Self::finish("stage", chain, device, Vec::new(), opts, None)
    }

    /// Common final checks of every loader.
    pub(crate) fn finish(
        stages_key: &str,
        chain: ChainSpec,
        device: DeviceConfig,
        mut diagnostics: Vec<Diagnostic>,
        opts: &LoadOptions,
        order_location: Option<Location>,
    ) -> Result<Self, ConfigError> {
        if chain.stages.is_empty() {
            return Err(ConfigError::EmptyChain {
                location: order_location,
            });
        }
        if let Err((i, e)) = chain.validate() {
            // Index `stages.len()`: the logprobs request (its own range text).
            let Some(stage) = chain.stages.get(i) else {
                return Err(ConfigError::OutOfRange {
                    path: e.param.to_string(),
                    value: e.value,
                    expected: e.expected,
                    location: None,
                });
            };
            let expected = stage
                .kind()
                .meta()
                .param(e.param)
                .map_or(e.expected, |p| p.range.to_string());
            return Err(ConfigError::OutOfRange {
                path: format!("{stages_key}[{i}].{}", e.param),
                value: e.value,
                expected,
                location: None,
            });
        }
        if opts.require_selection && !chain.selects() {
            return Err(ConfigError::NoSelectingStage {
                chain: chain.chain_string(),
                location: order_location,
            });
        }
        if let Some(last) = chain.stages.iter().rposition(StageSpec::selects) {
            let after: Vec<String> = chain.stages[last + 1..]
                .iter()
                .filter(|s| !s.is_noop())
                .map(|s| s.name().to_string())
                .collect();
            if !after.is_empty() {
                diagnostics.push(Diagnostic::AfterSelection { stages: after });
            }
        }
        Ok(Self {
            chain,
            device,
            speculative: None,
            sequences: Sequences::default(),
            structured: None,
            diagnostics,
        })
    }

    /// Load a TOML declaration (schema: `docs/config.md`) with default
    /// [`LoadOptions`] (a selecting stage is required).
    ///
    /// # Errors
    /// Every [`ConfigError`] variant but `Schema`, `UnknownSeqLetter` and `Io`, with the
    /// key path and `line:column`.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::from_toml_str_with(text, &LoadOptions::default())
    }

    /// [`ChainConfig::from_toml_str`] with explicit options.
    ///
    /// # Errors
    /// As [`ChainConfig::from_toml_str`].
    pub fn from_toml_str_with(text: &str, opts: &LoadOptions) -> Result<Self, ConfigError> {
        toml_in::load(text, opts)
    }

    /// Read and load a TOML file.
    ///
    /// # Errors
    /// [`ConfigError::Io`] when the file cannot be read (or is not UTF-8);
    /// otherwise as [`ChainConfig::from_toml_str`].
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_toml_str(&text)
    }

    /// The declaration as TOML: `seed`, `samplers`, `[device]`, then one
    /// table per stage with every parameter written out (or `[[stage]]`
    /// tables when a repeated stage has different parameters). Loading the
    /// text gives back the same chain and device (diagnostics are not kept).
    pub fn to_toml_string(&self) -> String {
        toml_out::to_toml(self)
    }

    /// A llama.cpp-style chain string: `;`-separated stage names or aliases
    /// (case-insensitive, `-` and `_` alike: `top-k`, `topk`, `temp`,
    /// `typical`, `nucleus`, ...), each stage with its default parameters
    /// ([`default_stage`]). The string is the whole chain: `dist` is not
    /// appended (list it), and a selecting stage is required.
    ///
    /// # Errors
    /// [`ConfigError::UnknownStage`] (location = line 1, column of the name),
    /// [`ConfigError::EmptyChain`], [`ConfigError::NoSelectingStage`].
    pub fn from_chain_string(s: &str) -> Result<Self, ConfigError> {
        Self::from_chain_string_with(s, &LoadOptions::default())
    }

    /// [`ChainConfig::from_chain_string`] with explicit options.
    ///
    /// # Errors
    /// As [`ChainConfig::from_chain_string`].
    pub fn from_chain_string_with(s: &str, opts: &LoadOptions) -> Result<Self, ConfigError> {
        let kinds = chain_string::parse_names(s, |offset| Some(Location::from_offset(s, offset)))?;
        let stages = kinds.into_iter().map(default_stage).collect();
        Self::finish(
            "stage",
            ChainSpec::new(stages, None),
            DeviceConfig::default(),
            Vec::new(),
            opts,
            Some(Location { line: 1, column: 1 }),
        )
    }

    /// llama.cpp `--sampling-seq` letters (`e` penalties, `d` dry, `s`
    /// top_n_sigma, `k` top_k, `y` typical, `p` top_p, `m` min_p, `x` xtc,
    /// `t` temperature), each stage with default parameters, then `dist`
    /// appended as llama.cpp does. `"edskypmxt"` is llama.cpp's default chain.
    ///
    /// # Errors
    /// [`ConfigError::UnknownSeqLetter`].
    pub fn from_sampling_seq(s: &str) -> Result<Self, ConfigError> {
        let kinds = chain_string::parse_seq(s)?;
        let mut stages: Vec<StageSpec> = kinds.into_iter().map(default_stage).collect();
        stages.push(StageSpec::Dist);
        Self::finish(
            "stage",
            ChainSpec::new(stages, None),
            DeviceConfig::default(),
            Vec::new(),
            &LoadOptions::default(),
            None,
        )
    }

    /// The tagged JSON form, i.e. serde of [`ChainSpec`]:
    /// `{"stages": [{"type": "top_k", "k": 40}, {"type": "dist"}], "seed": 42}`.
    /// Stage `type`s and parameter keys may use aliases; omitted parameters
    /// take sampler-core's serde defaults, required ones must be present.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] (JSON, with `line:column`),
    /// [`ConfigError::UnknownStage`] / [`ConfigError::UnknownKey`] with a
    /// suggestion, [`ConfigError::MissingKey`], [`ConfigError::DuplicateKey`],
    /// [`ConfigError::WrongType`], [`ConfigError::OutOfRange`] (key paths such
    /// as `stages[1].min_keep`, located at that key in its stage),
    /// [`ConfigError::EmptyChain`], [`ConfigError::NoSelectingStage`].
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        Self::from_json_with(text, &LoadOptions::default())
    }

    /// [`ChainConfig::from_json`] with explicit options.
    ///
    /// # Errors
    /// As [`ChainConfig::from_json`].
    pub fn from_json_with(text: &str, opts: &LoadOptions) -> Result<Self, ConfigError> {
        // Every stage is validated where it is read (with its location).
        // Errors about the chain as a whole (empty, nothing selects) carry
        // no location in JSON, as pinned in the error tests.
        let chain = json::load(text)?;
        Self::finish(
            "stages",
            chain,
            DeviceConfig::default(),
            Vec::new(),
            opts,
            None,
        )
    }

    /// OpenAI / vLLM flat parameters: the same as [`SamplingParams::to_chain`].
    ///
    /// # Errors
    /// As [`SamplingParams::to_chain`].
    pub fn from_params(params: &SamplingParams) -> Result<Self, ConfigError> {
        params.to_chain()
    }

    /// A request's flat parameters over a model's `generation_config.json`:
    /// a value in the request beats a value in the file, which beats this
    /// crate's default (OpenAI / vLLM neutral values). See
    /// [`SamplingParams::over`] for the one special rule (`do_sample`).
    ///
    /// # Errors
    /// As [`SamplingParams::to_chain`].
    pub fn from_request(
        request: &SamplingParams,
        generation_config: Option<&GenerationConfig>,
    ) -> Result<Self, ConfigError> {
        match generation_config {
            None => request.to_chain(),
            Some(file) => {
                let (merged, mut notes) = request.over(&file.to_params());
                let mut cfg = merged.to_chain()?;
                notes.extend(file.diagnostics.iter().cloned());
                notes.append(&mut cfg.diagnostics);
                cfg.diagnostics = notes;
                Ok(cfg)
            }
        }
    }
}
