//! OpenAI / vLLM flat parameters and Hugging Face generation_config.json:
//! the canonical chain, the greedy rules with their diagnostics, the
//! history scopes, and the precedence request > file > default.

use std::collections::BTreeMap;

use chain_config::{
    ChainConfig, Diagnostic, GenerationConfig, HistoryScope, SamplingParams, StageSpec,
    WHOLE_HISTORY,
};

fn chain(p: &SamplingParams) -> ChainConfig {
    p.to_chain().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn defaults_are_plain_sampling() {
    let c = chain(&SamplingParams::default());
    assert_eq!(c.chain.stages, vec![StageSpec::Dist]);
    assert!(c.diagnostics.is_empty());
}

#[test]
fn canonical_llama_cpp_order() {
    let p = SamplingParams {
        temperature: Some(0.7),
        top_k: Some(40),
        top_p: Some(0.9),
        min_p: Some(0.05),
        typical_p: Some(0.95),
        top_n_sigma: Some(1.5),
        xtc_probability: Some(0.5),
        repetition_penalty: Some(1.1),
        frequency_penalty: Some(0.2),
        presence_penalty: Some(0.1),
        no_repeat_ngram_size: Some(3),
        dry_multiplier: Some(0.8),
        logit_bias: Some(BTreeMap::from([(15043, -5.0), (2, 1.0)])),
        seed: Some(7),
        ..SamplingParams::default()
    };
    let c = chain(&p);
    assert_eq!(
        c.chain.chain_string(),
        "logit_bias;penalties;penalties;no_repeat_ngram;dry;top_n_sigma;top_k;typical;top_p;min_p;xtc;temperature;dist"
    );
    assert_eq!(c.chain.seed, Some(7));
    assert_eq!(
        c.chain.stages[0],
        StageSpec::LogitBias {
            bias: vec![(2, 1.0), (15043, -5.0)]
        }
    );
    assert!(c.diagnostics.is_empty());
}

/// vLLM: repetition over prompt + output, frequency / presence over output
/// only; one stage per scope, whole history unless a window is given.
#[test]
fn penalty_scopes() {
    let p = SamplingParams {
        repetition_penalty: Some(1.2),
        frequency_penalty: Some(0.5),
        presence_penalty: Some(0.25),
        ..SamplingParams::default()
    };
    assert_eq!(
        chain(&p).chain.stages,
        vec![
            StageSpec::Penalties {
                last_n: WHOLE_HISTORY,
                repeat: 1.2,
                frequency: 0.0,
                presence: 0.0,
                scope: HistoryScope::PromptAndOutput
            },
            StageSpec::Penalties {
                last_n: WHOLE_HISTORY,
                repeat: 1.0,
                frequency: 0.5,
                presence: 0.25,
                scope: HistoryScope::Output
            },
            StageSpec::Dist,
        ]
    );
    let windowed = SamplingParams {
        repeat_last_n: Some(32),
        ..p.clone()
    };
    let c = chain(&windowed);
    assert!(matches!(
        c.chain.stages[0],
        StageSpec::Penalties { last_n: 32, .. }
    ));
    // A window of 0 disables the penalties (llama.cpp).
    let off = SamplingParams {
        repeat_last_n: Some(0),
        ..p
    };
    assert_eq!(chain(&off).chain.stages, vec![StageSpec::Dist]);
}

#[test]
fn top_k_off_values() {
    for k in [-1, 0] {
        let p = SamplingParams {
            top_k: Some(k),
            ..SamplingParams::default()
        };
        assert_eq!(chain(&p).chain.stages, vec![StageSpec::Dist], "top_k = {k}");
    }
}

#[test]
fn greedy_rules() {
    let greedy = vec![StageSpec::Greedy];
    for p in [
        SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        },
        SamplingParams {
            temperature: Some(1e-6),
            ..Default::default()
        },
        SamplingParams {
            top_k: Some(1),
            ..Default::default()
        },
        SamplingParams {
            top_p: Some(0.0),
            ..Default::default()
        },
        SamplingParams {
            min_p: Some(1.0),
            ..Default::default()
        },
        SamplingParams {
            do_sample: Some(false),
            ..Default::default()
        },
    ] {
        let c = chain(&p);
        assert_eq!(c.chain.stages, greedy, "{p:?}");
        assert!(c.diagnostics.is_empty(), "{p:?}: {:?}", c.diagnostics);
    }
    // Bias and penalties still apply before the argmax.
    let p = SamplingParams {
        temperature: Some(0.0),
        repetition_penalty: Some(1.3),
        logit_bias: Some(BTreeMap::from([(5, f32::NEG_INFINITY)])),
        ..Default::default()
    };
    assert_eq!(
        chain(&p).chain.chain_string(),
        "logit_bias;penalties;greedy"
    );
}

#[test]
fn greedy_diagnostic_lists_ignored_parameters() {
    let p = SamplingParams {
        temperature: Some(0.0),
        top_p: Some(0.9),
        top_k: Some(50),
        min_p: Some(0.1),
        ..Default::default()
    };
    let c = chain(&p);
    assert_eq!(c.chain.stages, vec![StageSpec::Greedy]);
    assert_eq!(
        c.diagnostics,
        vec![Diagnostic::IgnoredByGreedy {
            rules: vec!["temperature = 0".into()],
            ignored: vec![
                "top_p = 0.9".into(),
                "min_p = 0.1".into(),
                "top_k = 50".into()
            ],
        }]
    );
    assert_eq!(
        c.diagnostics[0].to_string(),
        "temperature = 0 makes sampling greedy, so top_p = 0.9, min_p = 0.1, top_k = 50 are ignored"
    );
    // Two rules at once; the rules themselves are not "ignored".
    let p = SamplingParams {
        top_k: Some(1),
        temperature: Some(0.7),
        ..Default::default()
    };
    assert_eq!(
        chain(&p).diagnostics[0].to_string(),
        "top_k = 1 makes sampling greedy, so temperature = 0.7 is ignored"
    );
    let p = SamplingParams {
        top_k: Some(1),
        temperature: Some(0.0),
        ..Default::default()
    };
    assert!(chain(&p).diagnostics.is_empty());
}

#[test]
fn mirostat_replaces_truncation() {
    let p = SamplingParams {
        mirostat: Some(2),
        temperature: Some(0.5),
        top_k: Some(5),
        ..Default::default()
    };
    let c = chain(&p);
    assert_eq!(
        c.chain.stages,
        vec![
            StageSpec::Temperature {
                t: 0.5,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0
            },
            StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 },
        ]
    );
    assert_eq!(
        c.diagnostics[0].to_string(),
        "mirostat = 2 replaces the truncation stages, so top_k = 5 is ignored"
    );
    let v1 = SamplingParams {
        mirostat: Some(1),
        ..Default::default()
    };
    assert_eq!(chain(&v1).chain.chain_string(), "mirostat");
}

#[test]
fn json_request_body() {
    let p = SamplingParams::from_json_str(
        r#"{"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1,
            "presence_penalty": 0.5, "logit_bias": {"15043": -5}, "seed": 3,
            "penalty_last_n": 128}"#,
    )
    .unwrap();
    assert_eq!(p.repeat_last_n, Some(128));
    assert_eq!(p.logit_bias, Some(BTreeMap::from([(15043, -5.0)])));
    assert_eq!(
        chain(&p).chain.chain_string(),
        "logit_bias;penalties;penalties;top_p;temperature;dist"
    );
}

const LLAMA3_GENERATION_CONFIG: &str = r#"{
  "bos_token_id": 128000,
  "do_sample": true,
  "eos_token_id": [128001, 128008, 128009],
  "temperature": 0.6,
  "top_p": 0.9,
  "transformers_version": "4.45.0.dev0"
}"#;

#[test]
fn generation_config_import() {
    let file = GenerationConfig::from_json_str(LLAMA3_GENERATION_CONFIG).unwrap();
    assert_eq!(file.temperature, Some(0.6));
    assert_eq!(file.top_p, Some(0.9));
    assert_eq!(
        file.top_k, None,
        "transformers' default top_k = 50 is not applied"
    );
    assert!(file.diagnostics.is_empty());
    let c = ChainConfig::from_request(&SamplingParams::default(), Some(&file)).unwrap();
    assert_eq!(
        c.chain.stages,
        vec![
            StageSpec::TopP {
                p: 0.9,
                min_keep: 0
            },
            StageSpec::Temperature {
                t: 0.6,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0
            },
            StageSpec::Dist,
        ]
    );
}

/// A value in the request beats a value in the file, which beats the default.
#[test]
fn precedence_request_file_default() {
    let file = GenerationConfig::from_json_str(
        r#"{"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05,
            "no_repeat_ngram_size": 3}"#,
    )
    .unwrap();
    let request = SamplingParams {
        temperature: Some(1.2),
        top_k: Some(0),
        ..Default::default()
    };
    let c = ChainConfig::from_request(&request, Some(&file)).unwrap();
    assert_eq!(
        c.chain.stages,
        vec![
            StageSpec::Penalties {
                last_n: WHOLE_HISTORY,
                repeat: 1.05,
                frequency: 0.0,
                presence: 0.0,
                scope: HistoryScope::PromptAndOutput
            },
            StageSpec::NoRepeatNgram {
                n: 3,
                scope: HistoryScope::PromptAndOutput
            },
            // top_k: the request's 0 (off) beats the file's 20.
            StageSpec::TopP {
                p: 0.9,
                min_keep: 0
            },
            StageSpec::Temperature {
                t: 1.2,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0
            },
            StageSpec::Dist,
        ]
    );
    // Neither sets min_p: the default (off) holds.
    assert!(!c.chain.chain_string().contains("min_p"));
}

#[test]
fn do_sample_false_in_the_file() {
    let file =
        GenerationConfig::from_json_str(r#"{"do_sample": false, "temperature": 0.6}"#).unwrap();
    // Alone: greedy, and the file's temperature is reported as ignored.
    let c = ChainConfig::from_request(&SamplingParams::default(), Some(&file)).unwrap();
    assert_eq!(c.chain.stages, vec![StageSpec::Greedy]);
    assert_eq!(
        c.diagnostics[0].to_string(),
        "do_sample = false makes sampling greedy, so temperature = 0.6 is ignored"
    );
    // A request that asks for sampling wins, with a note.
    let request = SamplingParams {
        top_p: Some(0.8),
        ..Default::default()
    };
    let c = ChainConfig::from_request(&request, Some(&file)).unwrap();
    assert_eq!(c.chain.chain_string(), "top_p;temperature;dist");
    assert_eq!(
        c.diagnostics,
        vec![Diagnostic::DoSampleOverridden {
            by: vec!["top_p".into()]
        }]
    );
    assert_eq!(
        c.diagnostics[0].to_string(),
        "generation_config.json says do_sample = false, but the request sets top_p: sampling as requested"
    );
}

#[test]
fn generation_config_unsupported_keys() {
    let file = GenerationConfig::from_json_str(
        r#"{"num_beam_groups": 4, "penalty_alpha": null, "epsilon_cutoff": 0.0, "suppress_tokens": [1, 2]}"#,
    )
    .unwrap();
    assert_eq!(
        file.diagnostics,
        vec![
            Diagnostic::Unsupported {
                key: "num_beam_groups".into(),
                value: "4".into()
            },
            Diagnostic::Unsupported {
                key: "suppress_tokens".into(),
                value: "[1,2]".into()
            },
        ]
    );
    assert_eq!(
        file.diagnostics[0].to_string(),
        "`num_beam_groups` = 4 is not supported and has no effect"
    );
    let c = ChainConfig::from_request(&SamplingParams::default(), Some(&file)).unwrap();
    assert_eq!(c.diagnostics.len(), 2);
}

/// `n` and beam search from every front end: flat keys, `[sequences]` in
/// TOML (round trip), `generation_config.json` under a request.
#[test]
fn sequences_in_every_front_end() {
    use chain_config::{EarlyStopping, Sequences};
    let c = SamplingParams::from_json_str(r#"{"n": 4, "seed": 7}"#)
        .unwrap()
        .to_chain()
        .unwrap();
    assert_eq!(c.sequences, Sequences { n: 4, beam: None });
    let back = ChainConfig::from_toml_str(&c.to_toml_string()).unwrap();
    assert_eq!(back.sequences, c.sequences);

    let c = SamplingParams::from_json_str(
        r#"{"num_beams": 4, "num_return_sequences": 2, "length_penalty": 0.5, "early_stopping": "never"}"#,
    )
    .unwrap()
    .to_chain()
    .unwrap();
    let b = c.sequences.beam.unwrap();
    assert_eq!(
        (
            b.num_beams,
            b.num_return_sequences,
            b.length_penalty,
            b.early_stopping
        ),
        (4, 2, 0.5, EarlyStopping::Never)
    );
    let text = c.to_toml_string();
    assert!(text.contains("[sequences]\nnum_beams = 4\n"), "{text}");
    assert_eq!(
        ChainConfig::from_toml_str(&text).unwrap().sequences,
        c.sequences
    );

    let t = ChainConfig::from_toml_str(
        "samplers = \"dist\"\n[sequences]\nnum_beams = 3\nearly_stopping = true\n",
    )
    .unwrap();
    assert_eq!(
        t.sequences.beam.unwrap().early_stopping,
        EarlyStopping::True
    );

    let file = GenerationConfig::from_json_str(
        r#"{"num_beams": 4, "num_return_sequences": 4, "early_stopping": true}"#,
    )
    .unwrap();
    assert!(file.diagnostics.is_empty(), "{:?}", file.diagnostics);
    let c = ChainConfig::from_request(&SamplingParams::default(), Some(&file)).unwrap();
    assert_eq!(c.sequences.beam.unwrap().num_return_sequences, 4);
}

#[test]
fn sequences_bad_input_names_the_key() {
    let flat = |t: &str| {
        SamplingParams::from_json_str(t)
            .and_then(|p| p.to_chain())
            .unwrap_err()
            .to_string()
    };
    let e = flat(r#"{"n": 0}"#);
    assert!(e.contains("`n`") && e.contains("1..=256"), "{e}");
    let e = flat(r#"{"n": 300}"#);
    assert!(e.contains("`n`") && e.contains("300"), "{e}");
    let e = flat(r#"{"num_beams": 2, "num_return_sequences": 3}"#);
    assert!(
        e.contains("num_return_sequences") && e.contains("num_beams (2)"),
        "{e}"
    );
    let e = flat(r#"{"num_beams": 2, "n": 2}"#);
    assert!(e.contains("num_return_sequences"), "{e}");
    let e = flat(r#"{"early_stopping": "soon"}"#);
    assert!(e.contains("early_stopping") && e.contains("never"), "{e}");
    let e = flat(r#"{"n": "4"}"#);
    assert!(e.contains("`n`"), "{e}");
    let toml = |t: &str| ChainConfig::from_toml_str(t).unwrap_err().to_string();
    let e = toml("samplers = \"dist\"\n[sequences]\nnum_beam = 4\n");
    assert!(
        e.contains("sequences.num_beam") && e.contains("num_beams"),
        "{e}"
    );
    let e = toml("samplers = \"dist\"\n[sequences]\nnum_beams = 4\nnum_return_sequences = 9\n");
    assert!(
        e.contains("sequences.num_return_sequences") && e.starts_with("4:"),
        "{e}"
    );
    let e = toml("samplers = \"dist\"\nsequences = 4\n");
    assert!(e.contains("sequences") && e.contains("table"), "{e}");
}

#[test]
fn after_selection_diagnostic() {
    let c = ChainConfig::from_chain_string("top_k;dist;temp").unwrap();
    assert_eq!(
        c.diagnostics[0].to_string(),
        "`temperature` after the last selecting stage: ignored, the token is already chosen; move them before `dist`/`greedy`"
    );
}

#[test]
fn chain_string_aliases_and_letters() {
    let c = ChainConfig::from_chain_string("Top-K; temp ;typical;nucleus;minp;dist").unwrap();
    assert_eq!(
        c.chain.chain_string(),
        "top_k;temperature;typical;top_p;min_p;dist"
    );
    assert_eq!(c.chain.stages[0], StageSpec::TopK { k: 40 });
    let s = ChainConfig::from_sampling_seq("kpt").unwrap();
    assert_eq!(s.chain.chain_string(), "top_k;top_p;temperature;dist");
}

#[test]
fn default_order_is_llama_cpp_sampling_seq() {
    let kinds: Vec<chain_config::StageKind> = ChainConfig::from_sampling_seq("edskypmxt")
        .unwrap()
        .chain
        .stages
        .iter()
        .map(StageSpec::kind)
        .filter(|k| *k != chain_config::StageKind::Dist)
        .collect();
    assert_eq!(kinds, chain_config::DEFAULT_ORDER);
}

/// `epsilon_cutoff` and `eta_cutoff` come from the stages' registry entries
/// (`StageMeta::flat_key`), not from fields written per stage: they set the
/// stage's cutoff, share the request's `min_keep`, join the chain after
/// `min_p` (llama.cpp order, as transformers applies them after the other
/// truncations), are range-checked with the parameter's own range, merge
/// by precedence, serialise at the top level and are read from
/// `generation_config.json`.
#[test]
fn registered_flat_keys_epsilon_and_eta() {
    let p = SamplingParams::from_json_str(
        r#"{"top_p": 0.9, "min_p": 0.05, "epsilon_cutoff": 0.02, "eta_cutoff": 0.001,
            "min_keep": 2, "temperature": 0.7, "xtc_probability": 0.5}"#,
    )
    .unwrap();
    assert_eq!(p.stage_keys.get("epsilon_cutoff"), Some(0.02));
    let stages = chain(&p).chain.stages;
    let names: Vec<&str> = stages.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "top_p",
            "min_p",
            "epsilon",
            "eta",
            "xtc",
            "temperature",
            "dist"
        ]
    );
    assert_eq!(
        stages[2],
        StageSpec::Epsilon {
            epsilon: 0.02,
            min_keep: 2
        }
    );
    assert_eq!(
        stages[3],
        StageSpec::Eta {
            epsilon: 0.001,
            min_keep: 2
        }
    );
    // 0 is the no-op: no stage.
    let off =
        SamplingParams::from_json_str(r#"{"epsilon_cutoff": 0, "eta_cutoff": null}"#).unwrap();
    assert_eq!(chain(&off).chain.stages, vec![StageSpec::Dist]);

    // The range is the parameter's (registry) range, with the key as the path.
    let e = SamplingParams::from_json_str("{\n  \"eta_cutoff\": 1.0\n}").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("eta_cutoff") && msg.contains("[0, 1)"),
        "{msg}"
    );
    assert!(msg.contains("2:"), "located: {msg}");
    let e = SamplingParams::from_json_str(r#"{"eta_cutoff": "0.1"}"#).unwrap_err();
    assert!(e.to_string().contains("string"), "{e}");
    // A misspelt registered key gets a suggestion.
    let e = SamplingParams::from_json_str(r#"{"epsilon_cutof": 0.1}"#).unwrap_err();
    assert!(e.to_string().contains("epsilon_cutoff"), "{e}");
    // serde of the struct: flat at the top level, unknown keys refused.
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains("\"epsilon_cutoff\":0.02"), "{json}");
    let back: SamplingParams = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p);
    assert!(serde_json::from_str::<SamplingParams>(r#"{"bogus": 1.0}"#).is_err());

    // Greedy lists them as ignored.
    let g = SamplingParams::from_json_str(r#"{"temperature": 0, "epsilon_cutoff": 0.02}"#).unwrap();
    let c = chain(&g);
    assert_eq!(c.chain.stages, vec![StageSpec::Greedy]);
    assert!(
        c.diagnostics.iter().any(|d| matches!(d,
            Diagnostic::IgnoredByGreedy { ignored, .. } if ignored.contains(&"epsilon_cutoff = 0.02".to_string()))),
        "{:?}",
        c.diagnostics
    );

    // generation_config.json: read, and the request overrides the file.
    let file = GenerationConfig::from_json_str(
        r#"{"epsilon_cutoff": 0.0003, "eta_cutoff": 0.0002, "do_sample": true}"#,
    )
    .unwrap();
    assert_eq!(file.stage_keys.get("eta_cutoff"), Some(0.0002));
    let req = SamplingParams::from_json_str(r#"{"eta_cutoff": 0.01}"#).unwrap();
    let (merged, _) = req.over(&file.to_params());
    assert_eq!(merged.stage_keys.get("epsilon_cutoff"), Some(0.0003));
    assert_eq!(merged.stage_keys.get("eta_cutoff"), Some(0.01));
    let e = GenerationConfig::from_json_str(r#"{"epsilon_cutoff": 2}"#).unwrap_err();
    assert!(e.to_string().contains("epsilon_cutoff"), "{e}");
}

/// `SamplingParams::logprobs` is set from Rust with the exported
/// `LogprobsFlag` (OpenAI's `true`, vLLM's count).
#[test]
fn logprobs_flag_is_set_from_rust() {
    use chain_config::LogprobsFlag;
    let p = SamplingParams {
        temperature: Some(0.7),
        logprobs: Some(LogprobsFlag::Top(3)),
        ..Default::default()
    };
    let lp = p
        .to_chain()
        .unwrap()
        .chain
        .logprobs
        .expect("logprobs asked for");
    assert_eq!(lp.top_n, 3);
    let on = SamplingParams {
        logprobs: Some(LogprobsFlag::On(true)),
        ..Default::default()
    };
    assert_eq!(
        on.to_chain().unwrap().chain.logprobs.map(|l| l.top_n),
        Some(0)
    );
}
