//! Static stage metadata (DESIGN.md contract 2). The planner and the config
//! loader reason from this alone; they never run a stage to learn what it does.

/// Every built-in stage kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StageKind {
    /// Argmax (first maximum; ties to the lowest id).
    Greedy,
    /// Draw from the softmax of the current candidates.
    Dist,
    /// Keep the k highest logits.
    TopK,
    /// Nucleus: smallest set whose probability mass reaches p.
    TopP,
    /// Keep tokens with p >= min_p * p_max.
    MinP,
    /// Locally typical sampling.
    Typical,
    /// Temperature, with the dynamic-temperature (entropy) extension.
    Temperature,
    /// Exclude top choices.
    Xtc,
    /// Keep logits within n standard deviations of the max.
    TopNSigma,
    /// Mirostat v1 (selects).
    Mirostat,
    /// Mirostat v2 (selects).
    MirostatV2,
    /// Repetition / frequency / presence penalties.
    Penalties,
    /// DRY ("don't repeat yourself") n-gram penalty.
    Dry,
    /// Additive per-token bias.
    LogitBias,
    /// Ban tokens that would repeat an n-gram.
    NoRepeatNgram,
}

/// What a stage does to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Effects {
    /// Edits logits.
    pub logits: bool,
    /// May remove candidates (size shrinks).
    pub candidates: bool,
    /// Computes probabilities.
    pub probs: bool,
    /// Selects a token.
    pub selects: bool,
}

/// The value type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A signed integer.
    Int,
    /// A float (f32 at run time).
    Float,
    /// One of a fixed set of words.
    Enum(&'static [&'static str]),
    /// A list of token-id sequences.
    TokenSequences,
    /// A map token id -> bias.
    TokenBiases,
}

/// A stage parameter: name, type, default, valid range and meaning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamMeta {
    /// Key name in configs, e.g. `p`.
    pub name: &'static str,
    /// Other accepted key names.
    pub aliases: &'static [&'static str],
    /// Value type.
    pub kind: ParamKind,
    /// Default value as it would be written in TOML.
    pub default: &'static str,
    /// Lower bound (numbers), if any.
    pub min: Option<f64>,
    /// Upper bound (numbers), if any.
    pub max: Option<f64>,
    /// The valid range in words, used verbatim in errors.
    pub range: &'static str,
    /// One-line meaning, with units.
    pub doc: &'static str,
}

/// Static description of a stage kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageMeta {
    /// The kind.
    pub kind: StageKind,
    /// Canonical name (used when serialising).
    pub name: &'static str,
    /// Accepted aliases (matched case-insensitively, `-` and `_` alike).
    pub aliases: &'static [&'static str],
    /// Parameters.
    pub params: &'static [ParamMeta],
    /// What it changes.
    pub effects: Effects,
    /// Needs the accepted-token history.
    pub needs_history: bool,
    /// Needs random numbers (contract 7).
    pub needs_randomness: bool,
    /// A device recipe exists (sampler-backend); the device's `init` may still refuse.
    pub device_hook: bool,
    /// When the parameters make the stage a no-op, in words.
    pub noop_rule: &'static str,
    /// Whose semantics it follows.
    pub source: &'static str,
}

const fn fx(logits: bool, candidates: bool, probs: bool, selects: bool) -> Effects {
    Effects {
        logits,
        candidates,
        probs,
        selects,
    }
}

const MIN_KEEP: ParamMeta = ParamMeta {
    name: "min_keep",
    aliases: &[],
    kind: ParamKind::Int,
    default: "0",
    min: Some(0.0),
    max: None,
    range: "an integer >= 0",
    doc: "never keep fewer than this many candidates (0 and 1 both mean at least one)",
};

const SCOPE: ParamMeta = ParamMeta {
    name: "scope",
    aliases: &[],
    kind: ParamKind::Enum(&["prompt_and_output", "output"]),
    default: "\"prompt_and_output\"",
    min: None,
    max: None,
    range: "\"prompt_and_output\" or \"output\"",
    doc: "which accepted tokens count as history: prompt and generated tokens (llama.cpp server), or generated tokens only",
};

macro_rules! float_param {
    ($name:expr, $default:expr, $min:expr, $max:expr, $range:expr, $doc:expr) => {
        ParamMeta {
            name: $name,
            aliases: &[],
            kind: ParamKind::Float,
            default: $default,
            min: $min,
            max: $max,
            range: $range,
            doc: $doc,
        }
    };
}
macro_rules! int_param {
    ($name:expr, $default:expr, $min:expr, $max:expr, $range:expr, $doc:expr) => {
        ParamMeta {
            name: $name,
            aliases: &[],
            kind: ParamKind::Int,
            default: $default,
            min: $min,
            max: $max,
            range: $range,
            doc: $doc,
        }
    };
}

static METAS: [StageMeta; 15] = [
    StageMeta {
        kind: StageKind::Greedy,
        name: "greedy",
        aliases: &["argmax"],
        params: &[],
        effects: fx(false, false, false, true),
        needs_history: false,
        needs_randomness: false,
        device_hook: true,
        noop_rule: "never a no-op",
        source: "llama.cpp greedy; ties go to the lowest token id (vLLM, TensorRT-LLM)",
    },
    StageMeta {
        kind: StageKind::Dist,
        name: "dist",
        aliases: &["sample", "random"],
        params: &[],
        effects: fx(false, false, true, true),
        needs_history: false,
        needs_randomness: true,
        device_hook: true,
        noop_rule: "never a no-op",
        source: "llama.cpp dist (softmax, inverse CDF); canonical ascending-id order and counter-based uniforms (DESIGN.md contract 7)",
    },
    StageMeta {
        kind: StageKind::TopK,
        name: "top_k",
        aliases: &["top-k", "topk"],
        params: &[int_param!(
            "k",
            "40",
            None,
            None,
            "an integer (k <= 0 disables)",
            "number of highest-logit candidates kept"
        )],
        effects: fx(false, true, false, false),
        needs_history: false,
        needs_randomness: false,
        device_hook: true,
        noop_rule: "k <= 0",
        source: "llama.cpp top-k; boundary ties go to the lowest token id",
    },
    StageMeta {
        kind: StageKind::TopP,
        name: "top_p",
        aliases: &["top-p", "topp", "nucleus"],
        params: &[
            float_param!(
                "p",
                "0.95",
                Some(0.0),
                Some(1.0),
                "a number in [0, 1]",
                "cumulative probability mass to keep (inclusive of the crossing token)"
            ),
            MIN_KEEP,
        ],
        effects: fx(false, true, true, false),
        needs_history: false,
        needs_randomness: false,
        device_hook: true,
        noop_rule: "p >= 1",
        source: "llama.cpp top-p (Holtzman et al. 2019, nucleus sampling)",
    },
    StageMeta {
        kind: StageKind::MinP,
        name: "min_p",
        aliases: &["min-p", "minp"],
        params: &[
            float_param!(
                "p",
                "0.05",
                Some(0.0),
                None,
                "a finite number >= 0 (p >= 1 keeps only the maximum)",
                "keep tokens whose probability is at least p times the top probability"
            ),
            MIN_KEEP,
        ],
        effects: fx(false, true, false, false),
        needs_history: false,
        needs_randomness: false,
        device_hook: true,
        noop_rule: "p <= 0",
        source: "llama.cpp min-p (threshold max_logit + ln p, inclusive)",
    },
    StageMeta {
        kind: StageKind::Typical,
        name: "typical",
        aliases: &["typ_p", "typ-p", "typp", "typ", "typical_p", "typical-p"],
        params: &[
            float_param!(
                "p",
                "1.0",
                Some(0.0),
                Some(1.0),
                "a number in [0, 1]",
                "probability mass of the most typical tokens to keep"
            ),
            MIN_KEEP,
        ],
        effects: fx(false, true, true, false),
        needs_history: false,
        needs_randomness: false,
        device_hook: false,
        noop_rule: "p >= 1",
        source: "llama.cpp typical (Meister et al. 2022, locally typical sampling)",
    },
    StageMeta {
        kind: StageKind::Temperature,
        name: "temperature",
        aliases: &["temp", "temp_ext", "temp-ext"],
        params: &[
            float_param!(
                "t",
                "0.8",
                Some(0.0),
                None,
                "a finite number >= 0 (t < 1e-5 means greedy)",
                "divide logits by t"
            ),
            float_param!(
                "dynatemp_range",
                "0.0",
                Some(0.0),
                None,
                "a finite number >= 0",
                "dynamic temperature: t varies in [t - range, t + range] with the entropy"
            ),
            float_param!(
                "dynatemp_exponent",
                "1.0",
                Some(0.0),
                None,
                "a finite number >= 0",
                "dynamic temperature exponent on the normalised entropy"
            ),
        ],
        effects: fx(true, false, false, false),
        needs_history: false,
        needs_randomness: false,
        device_hook: true,
        noop_rule: "t == 1 and dynatemp_range == 0",
        source: "llama.cpp temp / temp-ext (dynamic temperature, Zhu et al. 2024); greedy below 1e-5 (vLLM)",
    },
    StageMeta {
        kind: StageKind::Xtc,
        name: "xtc",
        aliases: &[],
        params: &[
            float_param!(
                "probability",
                "0.0",
                Some(0.0),
                Some(1.0),
                "a number in [0, 1]",
                "chance that XTC acts at a step"
            ),
            float_param!(
                "threshold",
                "0.1",
                Some(0.0),
                Some(1.0),
                "a number in [0, 1] (above 0.5 disables)",
                "tokens with p >= threshold are 'top choices'"
            ),
            MIN_KEEP,
        ],
        effects: fx(false, true, true, false),
        needs_history: false,
        needs_randomness: true,
        device_hook: false,
        noop_rule: "probability <= 0 or threshold > 0.5",
        source: "llama.cpp xtc (exclude top choices, oobabooga text-generation-webui PR #6335)",
    },
    StageMeta {
        kind: StageKind::TopNSigma,
        name: "top_n_sigma",
        aliases: &["top-n-sigma", "topnsigma", "top_nsigma"],
        params: &[float_param!(
            "n",
            "-1.0",
            None,
            None,
            "a finite number (n <= 0 disables)",
            "keep logits >= max - n * std (std over finite logits)"
        )],
        effects: fx(true, false, false, false),
        needs_history: false,
        needs_randomness: false,
        device_hook: false,
        noop_rule: "n <= 0",
        source: "llama.cpp top-n-sigma (Tang et al. 2024)",
    },
    StageMeta {
        kind: StageKind::Mirostat,
        name: "mirostat",
        aliases: &["mirostat_v1", "mirostat1"],
        params: &[
            float_param!(
                "tau",
                "5.0",
                Some(0.0),
                None,
                "a finite number >= 0",
                "target surprise, bits"
            ),
            float_param!(
                "eta",
                "0.1",
                Some(0.0),
                None,
                "a finite number >= 0",
                "learning rate of mu"
            ),
            int_param!(
                "m",
                "100",
                Some(1.0),
                None,
                "an integer >= 1",
                "tokens used to estimate the Zipf exponent"
            ),
        ],
        effects: fx(false, true, true, true),
        needs_history: false,
        needs_randomness: true,
        device_hook: false,
        noop_rule: "never a no-op",
        source: "llama.cpp mirostat (Basu et al. 2021, algorithm 1)",
    },
    StageMeta {
        kind: StageKind::MirostatV2,
        name: "mirostat_v2",
        aliases: &["mirostat-v2", "mirostatv2", "mirostat2"],
        params: &[
            float_param!(
                "tau",
                "5.0",
                Some(0.0),
                None,
                "a finite number >= 0",
                "target surprise, bits"
            ),
            float_param!(
                "eta",
                "0.1",
                Some(0.0),
                None,
                "a finite number >= 0",
                "learning rate of mu"
            ),
        ],
        effects: fx(false, true, true, true),
        needs_history: false,
        needs_randomness: true,
        device_hook: false,
        noop_rule: "never a no-op",
        source: "llama.cpp mirostat v2 (Basu et al. 2021, algorithm 2)",
    },
    StageMeta {
        kind: StageKind::Penalties,
        name: "penalties",
        aliases: &["penalty", "repetition_penalty"],
        params: &[
            int_param!(
                "last_n",
                "64",
                Some(0.0),
                None,
                "an integer >= 0 (0 disables)",
                "window: the last N history tokens count"
            ),
            float_param!(
                "repeat",
                "1.0",
                Some(f64::MIN_POSITIVE),
                None,
                "a finite number > 0",
                "repetition penalty: positive logits divided, negative multiplied"
            ),
            float_param!(
                "frequency",
                "0.0",
                None,
                None,
                "a finite number",
                "subtracted once per occurrence in the window"
            ),
            float_param!(
                "presence",
                "0.0",
                None,
                None,
                "a finite number",
                "subtracted once if present in the window"
            ),
            SCOPE,
        ],
        effects: fx(true, false, false, false),
        needs_history: true,
        needs_randomness: false,
        device_hook: true,
        noop_rule: "last_n == 0, or repeat == 1 and frequency == 0 and presence == 0",
        source: "llama.cpp penalties (CTRL, Keskar et al. 2019 for repetition; OpenAI for frequency/presence)",
    },
    StageMeta {
        kind: StageKind::Dry,
        name: "dry",
        aliases: &[],
        params: &[
            float_param!(
                "multiplier",
                "0.0",
                Some(0.0),
                None,
                "a finite number >= 0 (0 disables)",
                "penalty scale"
            ),
            float_param!(
                "base",
                "1.75",
                Some(1.0),
                None,
                "a finite number >= 1",
                "penalty grows as base^(match length - allowed_length)"
            ),
            int_param!(
                "allowed_length",
                "2",
                Some(0.0),
                None,
                "an integer >= 0",
                "repeats up to this length are free"
            ),
            int_param!(
                "last_n",
                "64",
                Some(0.0),
                None,
                "an integer >= 0 (0 disables)",
                "window of history tokens scanned"
            ),
            ParamMeta {
                name: "seq_breakers",
                aliases: &["sequence_breakers"],
                kind: ParamKind::TokenSequences,
                default: "[]",
                min: None,
                max: None,
                range: "a list of non-empty token-id lists",
                doc: "token sequences that end a repeat (first token = head, rest = tail)",
            },
            SCOPE,
        ],
        effects: fx(true, false, false, false),
        needs_history: true,
        needs_randomness: false,
        device_hook: false,
        noop_rule: "multiplier == 0 or last_n == 0",
        source: "llama.cpp DRY (p-e-w, oobabooga text-generation-webui PR #5677)",
    },
    StageMeta {
        kind: StageKind::LogitBias,
        name: "logit_bias",
        aliases: &["logit-bias", "bias"],
        params: &[ParamMeta {
            name: "bias",
            aliases: &["biases"],
            kind: ParamKind::TokenBiases,
            default: "{}",
            min: None,
            max: None,
            range: "token id -> a finite number or -inf (ban)",
            doc: "added to the token's logit",
        }],
        effects: fx(true, false, false, false),
        needs_history: false,
        needs_randomness: false,
        device_hook: true,
        noop_rule: "no biases",
        source: "llama.cpp logit-bias / OpenAI logit_bias",
    },
    StageMeta {
        kind: StageKind::NoRepeatNgram,
        name: "no_repeat_ngram",
        aliases: &["no-repeat-ngram", "no_repeat_ngram_size"],
        params: &[
            int_param!(
                "n",
                "0",
                Some(0.0),
                None,
                "an integer >= 0 (0 disables)",
                "n-gram size that may not repeat"
            ),
            SCOPE,
        ],
        effects: fx(true, false, false, false),
        needs_history: true,
        needs_randomness: false,
        device_hook: false,
        noop_rule: "n == 0",
        source: "Hugging Face transformers NoRepeatNGramLogitsProcessor",
    },
];

impl StageKind {
    /// Every built-in kind, in a fixed order.
    pub const ALL: [StageKind; 15] = [
        StageKind::Greedy,
        StageKind::Dist,
        StageKind::TopK,
        StageKind::TopP,
        StageKind::MinP,
        StageKind::Typical,
        StageKind::Temperature,
        StageKind::Xtc,
        StageKind::TopNSigma,
        StageKind::Mirostat,
        StageKind::MirostatV2,
        StageKind::Penalties,
        StageKind::Dry,
        StageKind::LogitBias,
        StageKind::NoRepeatNgram,
    ];

    /// This kind's static metadata.
    pub fn meta(self) -> &'static StageMeta {
        let m = &METAS[self as usize];
        debug_assert_eq!(m.kind, self);
        m
    }

    /// Canonical name.
    pub fn name(self) -> &'static str {
        self.meta().name
    }

    /// Look a stage up by canonical name or alias: case-insensitive, `-` and
    /// `_` equivalent (llama.cpp `--samplers` names).
    pub fn from_name(name: &str) -> Option<StageKind> {
        let norm = normalize_name(name);
        Self::ALL.into_iter().find(|k| {
            let m = k.meta();
            normalize_name(m.name) == norm || m.aliases.iter().any(|a| normalize_name(a) == norm)
        })
    }

    /// llama.cpp's `--sampling-seq` letters: `e` penalties, `d` dry,
    /// `s` top_n_sigma, `k` top_k, `y` typical, `p` top_p, `m` min_p,
    /// `x` xtc, `t` temperature.
    pub fn from_seq_char(c: char) -> Option<StageKind> {
        Some(match c.to_ascii_lowercase() {
            'e' => StageKind::Penalties,
            'd' => StageKind::Dry,
            's' => StageKind::TopNSigma,
            'k' => StageKind::TopK,
            'y' => StageKind::Typical,
            'p' => StageKind::TopP,
            'm' => StageKind::MinP,
            'x' => StageKind::Xtc,
            't' => StageKind::Temperature,
            _ => return None,
        })
    }

    /// Every name and alias, for "did you mean" suggestions.
    pub fn all_names() -> impl Iterator<Item = &'static str> {
        Self::ALL
            .into_iter()
            .flat_map(|k| std::iter::once(k.meta().name).chain(k.meta().aliases.iter().copied()))
    }
}

fn normalize_name(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace('-', "_")
}

impl StageMeta {
    /// The parameter called `name` (or an alias of it).
    pub fn param(&self, name: &str) -> Option<&'static ParamMeta> {
        let params: &'static [ParamMeta] = METAS[self.kind as usize].params;
        params
            .iter()
            .find(|p| p.name == name || p.aliases.contains(&name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metas_are_indexed_by_kind() {
        for k in StageKind::ALL {
            assert_eq!(k.meta().kind, k);
        }
    }

    #[test]
    fn llama_cpp_aliases_resolve() {
        for (alias, kind) in [
            ("top-k", StageKind::TopK),
            ("TOPK", StageKind::TopK),
            ("temp", StageKind::Temperature),
            ("typ_p", StageKind::Typical),
            ("typical", StageKind::Typical),
            ("nucleus", StageKind::TopP),
            ("top-n-sigma", StageKind::TopNSigma),
            ("min-p", StageKind::MinP),
        ] {
            assert_eq!(StageKind::from_name(alias), Some(kind), "{alias}");
        }
        assert_eq!(StageKind::from_name("top_kk"), None);
    }

    #[test]
    fn names_map_to_one_kind() {
        let mut seen = std::collections::HashMap::new();
        for k in StageKind::ALL {
            let m = k.meta();
            for n in std::iter::once(m.name).chain(m.aliases.iter().copied()) {
                let prev = seen.insert(normalize_name(n), k);
                assert!(
                    prev.is_none() || prev == Some(k),
                    "name {n} used by two kinds"
                );
            }
        }
    }
}
