//! Property tests: load -> serialise -> load gives the same chain for random
//! chains; the loaders only ever return `Ok` or a typed error on arbitrary
//! input (no panic), and whatever loads also round-trips.

use chain_config::{
    ChainConfig, ChainSpec, ConfigError, DeviceConfig, GenerationConfig, HistoryScope, LoadOptions,
    OffloadPolicy, SamplingParams, StageKind, StageSpec, StructuredOutput, WHOLE_HISTORY,
};
use proptest::num::f32 as f;
use proptest::prelude::*;

const NO_SELECT: LoadOptions = LoadOptions {
    require_selection: false,
};

/// Every float in [0, 1] (all bit patterns, not just round decimals).
fn unit() -> impl Strategy<Value = f32> {
    (0u32..=0x3f80_0000).prop_map(f32::from_bits)
}
fn nonneg() -> impl Strategy<Value = f32> {
    f::POSITIVE | f::ZERO | f::NORMAL | f::SUBNORMAL
}
/// `[0, 100]`, the edges included.
fn dynatemp_range() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(100.0f32), 0.0f32..=100.0]
}
/// `[0, 10]`, the edges included.
fn dynatemp_exponent() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(10.0f32), 0.0f32..=10.0]
}
fn finite() -> impl Strategy<Value = f32> {
    f::POSITIVE | f::NEGATIVE | f::ZERO | f::NORMAL | f::SUBNORMAL
}
/// [1, f32::MAX].
fn at_least_one() -> impl Strategy<Value = f32> {
    (0x3f80_0000u32..0x7f80_0000).prop_map(f32::from_bits)
}
fn repeat() -> impl Strategy<Value = f32> {
    (1u32..0x7f80_0000)
        .prop_map(f32::from_bits)
        .prop_filter("1/repeat finite", |x| (1.0 / x).is_finite())
}
fn count() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..300, Just(WHOLE_HISTORY), 0usize..(1 << 40)]
}
fn scope() -> impl Strategy<Value = HistoryScope> {
    prop_oneof![
        Just(HistoryScope::PromptAndOutput),
        Just(HistoryScope::Output)
    ]
}
fn bias() -> impl Strategy<Value = f32> {
    prop_oneof![finite(), Just(f32::NEG_INFINITY)]
}

fn stage() -> impl Strategy<Value = StageSpec> {
    prop_oneof![
        Just(StageSpec::Greedy),
        Just(StageSpec::Dist),
        any::<i64>().prop_map(|k| StageSpec::TopK { k }),
        (unit(), 0usize..100).prop_map(|(p, min_keep)| StageSpec::TopP { p, min_keep }),
        (nonneg(), 0usize..100).prop_map(|(p, min_keep)| StageSpec::MinP { p, min_keep }),
        (unit(), 0usize..100).prop_map(|(p, min_keep)| StageSpec::Typical { p, min_keep }),
        (nonneg(), dynatemp_range(), dynatemp_exponent()).prop_map(
            |(t, dynatemp_range, dynatemp_exponent)| {
                StageSpec::Temperature {
                    t,
                    dynatemp_range,
                    dynatemp_exponent,
                }
            }
        ),
        (unit(), unit(), 0usize..10).prop_map(|(probability, threshold, min_keep)| {
            StageSpec::Xtc {
                probability,
                threshold,
                min_keep,
            }
        }),
        finite().prop_map(|n| StageSpec::TopNSigma { n }),
        (nonneg(), nonneg(), 1usize..1000).prop_map(|(tau, eta, m)| StageSpec::Mirostat {
            tau,
            eta,
            m
        }),
        (nonneg(), nonneg()).prop_map(|(tau, eta)| StageSpec::MirostatV2 { tau, eta }),
        (count(), repeat(), finite(), finite(), scope()).prop_map(
            |(last_n, repeat, frequency, presence, scope)| StageSpec::Penalties {
                last_n,
                repeat,
                frequency,
                presence,
                scope
            }
        ),
        (
            nonneg(),
            at_least_one(),
            0usize..10,
            count(),
            prop::collection::vec(prop::collection::vec(any::<u32>(), 1..4), 0..4),
            scope()
        )
            .prop_map(
                |(multiplier, base, allowed_length, last_n, seq_breakers, scope)| {
                    StageSpec::Dry {
                        multiplier,
                        base,
                        allowed_length,
                        last_n,
                        seq_breakers,
                        scope,
                    }
                }
            ),
        prop::collection::vec((prop_oneof![0u32..8, any::<u32>()], bias()), 0..6)
            .prop_map(|bias| StageSpec::LogitBias { bias }),
        (0usize..10, scope()).prop_map(|(n, scope)| StageSpec::NoRepeatNgram { n, scope }),
    ]
}

fn device() -> impl Strategy<Value = DeviceConfig> {
    (
        prop_oneof![
            Just("cpu".to_string()),
            Just("flex".to_string()),
            Just("ndarray".to_string()),
            Just("wgpu".to_string()),
            Just("vulkan".to_string()),
            (0u32..8).prop_map(|i| format!("cuda:{i}")),
        ],
        prop_oneof![
            Just(OffloadPolicy::Auto),
            Just(OffloadPolicy::Off),
            Just(OffloadPolicy::Device),
            (0usize..20).prop_map(OffloadPolicy::Stages)
        ],
    )
        .prop_map(|(device, offload)| DeviceConfig { device, offload })
}

fn speculative() -> impl Strategy<Value = Option<chain_config::SpeculativeConfig>> {
    prop::option::of(
        (1usize..=64, 1usize..6, 0usize..4).prop_map(|(k, min, extra)| {
            chain_config::SpeculativeConfig {
                method: chain_config::SpeculativeMethod::Ngram,
                num_speculative_tokens: k,
                prompt_lookup_min: min,
                prompt_lookup_max: min + extra,
            }
        }),
    )
}

fn sequences() -> impl Strategy<Value = chain_config::Sequences> {
    use chain_config::{BeamSpec, EarlyStopping, Sequences};
    prop_oneof![
        (1usize..=256).prop_map(|n| Sequences { n, beam: None }),
        (2usize..=256, 0usize..256, -3.0f32..3.0, 0usize..3).prop_map(|(w, r, lp, es)| {
            Sequences {
                n: 1,
                beam: Some(BeamSpec {
                    num_beams: w,
                    num_return_sequences: 1 + r % w,
                    length_penalty: f64::from(lp),
                    early_stopping: [
                        EarlyStopping::True,
                        EarlyStopping::False,
                        EarlyStopping::Never,
                    ][es],
                }),
            }
        }),
    ]
}

fn chain_config() -> impl Strategy<Value = ChainConfig> {
    (
        prop::collection::vec(stage(), 1..8),
        any::<Option<u64>>(),
        device(),
        speculative(),
        sequences(),
        structured(),
    )
        .prop_map(
            |(mut stages, seed, device, speculative, sequences, structured)| {
                // A structured output's chain has its mask stage first.
                if structured.is_some() {
                    stages.retain(|s| *s != StageSpec::Mask);
                    stages.insert(0, StageSpec::Mask);
                }
                ChainConfig {
                    chain: ChainSpec::new(stages, seed),
                    device,
                    speculative,
                    sequences,
                    structured,
                    diagnostics: Vec::new(),
                }
            },
        )
}

fn structured() -> impl Strategy<Value = Option<StructuredOutput>> {
    prop_oneof![
        Just(None),
        Just(Some(StructuredOutput::JsonObject)),
        "[ -~\\n]{0,12}".prop_map(|s| Some(StructuredOutput::Regex(s))),
        "[ -~\\n]{0,12}".prop_map(|s| Some(StructuredOutput::Grammar(s))),
        (0u32..1000).prop_map(|n| Some(StructuredOutput::JsonSchema(format!(
            "{{\"maxLength\": {n}}}"
        )))),
    ]
}

/// The loaders' only outcomes: a chain, or a typed error with a message.
fn typed<T>(r: Result<T, ConfigError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            None
        }
    }
}

/// Fragments of plausible (and implausible) TOML, to get past the parser.
fn toml_line() -> impl Strategy<Value = String> {
    let names = prop::sample::select(vec![
        "top_k",
        "top-k",
        "topk",
        "top_p",
        "nucleus",
        "min_p",
        "typical",
        "typ_p",
        "temp",
        "temperature",
        "xtc",
        "top_n_sigma",
        "mirostat",
        "mirostat_v2",
        "penalties",
        "dry",
        "logit_bias",
        "no_repeat_ngram",
        "greedy",
        "dist",
        "top_kk",
        "",
        "k",
    ]);
    let keys = prop::sample::select(vec![
        "k",
        "p",
        "t",
        "min_keep",
        "n",
        "tau",
        "eta",
        "m",
        "last_n",
        "repeat",
        "frequency",
        "presence",
        "scope",
        "multiplier",
        "base",
        "allowed_length",
        "seq_breakers",
        "sequence_breakers",
        "bias",
        "probability",
        "threshold",
        "dynatemp_range",
        "dynatemp_exponent",
        "type",
        "seed",
        "samplers",
        "kind",
        "offload",
        "kk",
    ]);
    let values = prop::sample::select(vec![
        "0",
        "1",
        "-1",
        "40",
        "0.5",
        "1.5",
        "-0.0",
        "inf",
        "-inf",
        "nan",
        "1e39",
        "9223372036854775807",
        "\"auto\"",
        "\"off\"",
        "\"output\"",
        "\"prompt_and_output\"",
        "\"cuda\"",
        "\"top_k;dist\"",
        "\"dist\"",
        "\"\"",
        "[]",
        "[[1], [2, 3]]",
        "[[]]",
        "{ \"1\" = -inf, \"2\" = 0.5 }",
        "[[1, 2.0], [1, -1]]",
        "{}",
        "true",
        "\"18446744073709551615\"",
        "[\"top_k\", \"dist\"]",
        "1979-05-27",
    ]);
    prop_oneof![
        (keys.clone(), values.clone()).prop_map(|(k, v)| format!("{k} = {v}")),
        names.clone().prop_map(|n| format!("[{n}]")),
        Just("[[stage]]".to_string()),
        Just("[device]".to_string()),
        (names.clone(), names).prop_map(|(a, b)| format!("samplers = \"{a};{b};dist\"")),
        (names_clone_type(), values).prop_map(|(n, v)| format!("type = \"{n}\"\nk = {v}")),
    ]
}

/// A `samplers` line over random kinds, then a table per kind with some of
/// its own keys and values from a pool of plausible (and some bad) values.
fn well_formed_document() -> impl Strategy<Value = String> {
    let kinds = prop::collection::vec(prop::sample::select(StageKind::ALL.to_vec()), 1..6);
    let values = prop::collection::vec(
        prop::sample::select(vec![
            "0",
            "1",
            "2",
            "40",
            "0.5",
            "0.95",
            "1.0",
            "-1",
            "\"output\"",
            "[[1], [2, 3]]",
            "{ \"1\" = -inf, \"7\" = 0.5 }",
            "[[1, 2.0], [1, -1]]",
            "1.5",
            "64",
            "0.05",
        ]),
        12,
    );
    (kinds, values, any::<Option<u32>>()).prop_map(|(kinds, values, seed)| {
        let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        let mut doc = format!("samplers = \"{}\"\n", names.join(";"));
        if let Some(s) = seed {
            doc.push_str(&format!("seed = {s}\n"));
        }
        let mut done = Vec::new();
        let mut v = values.iter().cycle();
        for k in kinds {
            if done.contains(&k) {
                continue;
            }
            done.push(k);
            doc.push_str(&format!("[{}]\n", k.name()));
            for (i, p) in k.meta().params.iter().enumerate() {
                if i % 2 == 0 {
                    doc.push_str(&format!("{} = {}\n", p.name, v.next().unwrap_or(&"0")));
                }
            }
        }
        doc
    })
}

fn names_clone_type() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "top_k",
        "temp",
        "dist",
        "greedy",
        "penalties",
        "bogus",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Acceptance: load -> serialise -> load gives the same chain.
    #[test]
    fn toml_round_trip(cfg in chain_config()) {
        let speculative = cfg.speculative;
        let mut cfg = ChainConfig::validated(cfg.chain, cfg.device, &NO_SELECT)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        cfg.speculative = speculative;
        let text = cfg.to_toml_string();
        let again = ChainConfig::from_toml_str_with(&text, &NO_SELECT)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&again.chain, &cfg.chain, "{}", text);
        prop_assert_eq!(&again.device, &cfg.device);
        prop_assert_eq!(&again.speculative, &cfg.speculative);
        // Serialising is stable.
        prop_assert_eq!(again.to_toml_string(), text);
    }

    /// The tagged JSON form round-trips too (JSON has no infinities, so
    /// chains with `-inf` biases are left out).
    #[test]
    fn json_round_trip(mut cfg in chain_config()) {
        for s in &mut cfg.chain.stages {
            if let StageSpec::LogitBias { bias } = s {
                for b in bias.iter_mut().filter(|b| b.1.is_infinite()) {
                    b.1 = -100.0;
                }
            }
        }
        let text = serde_json::to_string(&cfg.chain).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let again = ChainConfig::from_json_with(&text, &NO_SELECT)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(again.chain, cfg.chain);
    }

    #[test]
    fn toml_loader_never_panics_on_any_string(s in any::<String>()) {
        let _ = typed(ChainConfig::from_toml_str(&s));
        let _ = typed(ChainConfig::from_chain_string(&s));
        let _ = typed(ChainConfig::from_sampling_seq(&s));
        let _ = typed(ChainConfig::from_json(&s));
        let _ = typed(SamplingParams::from_json_str(&s));
        let _ = typed(GenerationConfig::from_json_str(&s));
    }

    /// Documents assembled from schema fragments reach the deeper checks;
    /// whatever loads must also round-trip.
    #[test]
    fn toml_loader_on_schema_fragments(lines in prop::collection::vec(toml_line(), 0..12)) {
        let text = lines.join("\n");
        if let Some(cfg) = typed(ChainConfig::from_toml_str_with(&text, &NO_SELECT)) {
            let out = cfg.to_toml_string();
            let again = ChainConfig::from_toml_str_with(&out, &NO_SELECT)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{text}\n---\n{out}")))?;
            prop_assert_eq!(again.chain, cfg.chain);
        }
    }

    /// Well-formed documents (a `samplers` line and tables with the stages'
    /// own keys) with plausible values: most load, and must round-trip.
    #[test]
    fn toml_loader_on_well_formed_documents(text in well_formed_document()) {
        if let Some(cfg) = typed(ChainConfig::from_toml_str_with(&text, &NO_SELECT)) {
            if std::env::var("COUNT_OK").is_ok() { eprintln!("OUTCOME ok"); }
            let out = cfg.to_toml_string();
            let again = ChainConfig::from_toml_str_with(&out, &NO_SELECT)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{text}\n---\n{out}")))?;
            prop_assert_eq!(again.chain, cfg.chain);
        } else if std::env::var("COUNT_OK").is_ok() { eprintln!("OUTCOME err"); }
    }

    #[test]
    fn chain_strings_of_names(names in prop::collection::vec(prop::sample::select(vec![
        "top_k", "TOP-K", "topk", "nucleus", "temp", "typ", "min-p", "dist", "greedy", "xtc",
        "penalties", "dry", "top_n_sigma", "mirostat", "bogus", " ", "",
    ]), 0..8)) {
        let s = names.join(";");
        if let Some(cfg) = typed(ChainConfig::from_chain_string(&s)) {
            prop_assert!(cfg.chain.selects());
            let again = ChainConfig::from_toml_str(&cfg.to_toml_string())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(again.chain, cfg.chain);
        }
    }

    /// Flat parameters: any values give a selecting, valid chain or a
    /// range error; never a panic.
    #[test]
    fn flat_params_never_panic(
        temperature in prop::option::of(prop_oneof![finite(), Just(0.0f32), Just(f32::NAN)]),
        top_k in prop::option::of(-3i64..100),
        top_p in prop::option::of(prop_oneof![unit(), finite()]),
        min_p in prop::option::of(prop_oneof![unit(), finite()]),
        repetition_penalty in prop::option::of(finite()),
        frequency_penalty in prop::option::of(-3.0f32..3.0),
        presence_penalty in prop::option::of(-3.0f32..3.0),
        repeat_last_n in prop::option::of(-2i64..100),
        mirostat in prop::option::of(-1i64..4),
        do_sample in prop::option::of(any::<bool>()),
        seed in any::<Option<u64>>(),
    ) {
        let p = SamplingParams {
            temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty,
            presence_penalty, repeat_last_n, mirostat, do_sample, seed,
            ..SamplingParams::default()
        };
        if let Some(cfg) = typed(p.to_chain()) {
            prop_assert!(cfg.chain.selects());
            prop_assert!(cfg.chain.validate().is_ok());
            prop_assert_eq!(cfg.chain.seed, seed);
            let again = ChainConfig::from_toml_str(&cfg.to_toml_string())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(again.chain, cfg.chain);
        }
    }
}
