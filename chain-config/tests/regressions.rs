//! Regressions found by feeding odd inputs to every loader: each test is
//! named after the failure it pins (a panic, an unclear message or a wrong
//! answer). Messages must name the key path, the value, the valid range
//! and, where there is text, the `line:column`.

use chain_config::{ChainConfig, ConfigError, GenerationConfig, Location, SamplingParams};

fn at(line: usize, column: usize) -> Option<Location> {
    Some(Location { line, column })
}

fn flat_err(text: &str) -> ConfigError {
    match SamplingParams::from_json_str(text) {
        Ok(p) => panic!("accepted: {p:?}\n{text}"),
        Err(e) => e,
    }
}

fn hf_err(text: &str) -> ConfigError {
    match GenerationConfig::from_json_str(text) {
        Ok(g) => panic!("accepted: {g:?}\n{text}"),
        Err(e) => e,
    }
}

fn json_err(text: &str) -> ConfigError {
    match ChainConfig::from_json(text) {
        Ok(c) => panic!("accepted: {:?}\n{text}", c.chain),
        Err(e) => e,
    }
}

/// `(path, location)` of an error, and its message.
fn path_of(e: &ConfigError) -> (String, Option<Location>) {
    let path = match e {
        ConfigError::WrongType { path, .. }
        | ConfigError::OutOfRange { path, .. }
        | ConfigError::MissingKey { path, .. }
        | ConfigError::UnknownKey { path, .. } => path.clone(),
        other => panic!("no key path in {other:?}: {other}"),
    };
    (path, e.location())
}

#[test]
fn flat_param_of_wrong_json_type_names_key_and_range() {
    // Was: "1:14: JSON does not match the schema: invalid type: floating point `1e+30`, expected i64".
    let e = flat_err(r#"{"top_k": 1e30}"#);
    assert!(matches!(e, ConfigError::WrongType { .. }), "{e:?}");
    assert_eq!(path_of(&e), ("top_k".into(), at(1, 2)));
    assert!(e.to_string().contains("-1 or 0 (off)"), "{e}");
    assert!(e.to_string().contains("1e30"), "{e}");

    let e = flat_err(r#"{"top_p": 0.9, "temperature": "0.7"}"#);
    assert!(matches!(e, ConfigError::WrongType { ref found, .. } if found == "string \"0.7\""));
    assert_eq!(path_of(&e), ("temperature".into(), at(1, 16)));
    assert!(e.to_string().contains("a finite number >= 0"), "{e}");

    let e = flat_err(r#"{"do_sample": "false"}"#);
    assert_eq!(path_of(&e), ("do_sample".into(), at(1, 2)));
    assert!(e.to_string().contains("boolean"), "{e}");

    let e = flat_err(r#"{"mirostat": 1.5}"#);
    assert_eq!(path_of(&e), ("mirostat".into(), at(1, 2)));
    assert!(e.to_string().contains("0 (off), 1 or 2"), "{e}");
}

#[test]
fn flat_integer_beyond_i64_or_negative_seed_is_out_of_range_with_key() {
    let e = flat_err(r#"{"top_k": 9223372036854775808}"#);
    assert!(
        matches!(e, ConfigError::OutOfRange { ref value, .. } if value == "9223372036854775808"),
        "{e:?}"
    );
    assert_eq!(path_of(&e).0, "top_k");

    for text in [r#"{"seed": -1}"#, r#"{"seed": 1.5}"#, r#"{"seed": "42"}"#] {
        let e = flat_err(text);
        assert_eq!(path_of(&e), ("seed".into(), at(1, 2)), "{text}");
        assert!(e.to_string().contains("[0, 2^64 - 1]"), "{e}");
    }
}

#[test]
fn flat_logit_bias_bad_token_key_names_the_key() {
    // Was a "JSON syntax error" for "abc", and serde's "expected u32" for the others.
    for (text, key, col) in [
        (r#"{"logit_bias": {"abc": 1}}"#, "abc", 17),
        (r#"{"logit_bias": {"99999999999": 1}}"#, "99999999999", 17),
        (r#"{"logit_bias": {"-1": 1}}"#, "-1", 17),
    ] {
        let e = flat_err(text);
        assert!(matches!(e, ConfigError::OutOfRange { .. }), "{e:?}");
        assert_eq!(path_of(&e), (format!("logit_bias.\"{key}\""), at(1, col)));
        assert!(e.to_string().contains("[0, 4294967295]"), "{e}");
    }
}

#[test]
fn flat_logit_bias_string_minus_inf_is_a_clear_type_error() {
    let e = flat_err(r#"{"logit_bias": {"15": "-inf"}}"#);
    assert!(
        matches!(e, ConfigError::WrongType { ref found, .. } if found == "string \"-inf\""),
        "{e:?}"
    );
    assert_eq!(path_of(&e), ("logit_bias.\"15\"".into(), at(1, 17)));
    assert!(e.to_string().contains("-100"), "{e}");
    let e = flat_err(r#"{"logit_bias": [[15, 1.0]]}"#);
    assert_eq!(path_of(&e), ("logit_bias".into(), at(1, 2)));
}

#[test]
fn float_overflowing_f32_reports_the_written_value_not_inf() {
    // Was: "`temperature` = inf is out of range" for 1e39.
    let e = flat_err(r#"{"temperature": 1e39}"#);
    assert!(
        matches!(e, ConfigError::OutOfRange { ref value, .. } if value == "1e39"),
        "{e:?}"
    );
    assert_eq!(path_of(&e), ("temperature".into(), at(1, 2)));
    let e = flat_err(r#"{"logit_bias": {"3": -1e39}}"#);
    assert!(
        matches!(e, ConfigError::OutOfRange { ref value, .. } if value == "-1e39"),
        "{e:?}"
    );
    let e = hf_err(r#"{"temperature": 1e39}"#);
    assert!(
        matches!(e, ConfigError::OutOfRange { ref value, .. } if value == "1e39"),
        "{e:?}"
    );
    let e = json_err(r#"{"stages": [{"type": "temperature", "t": 1e39}, {"type": "dist"}]}"#);
    assert!(
        matches!(e, ConfigError::OutOfRange { ref value, .. } if value == "1e39"),
        "{e:?}"
    );
    assert_eq!(path_of(&e).0, "stages[0].t");
}

#[test]
fn flat_dry_breakers_as_strings_name_the_element() {
    let e = flat_err(r#"{"dry_sequence_breakers": [[13], ["\n"]]}"#);
    assert!(matches!(e, ConfigError::WrongType { .. }), "{e:?}");
    assert_eq!(
        path_of(&e),
        ("dry_sequence_breakers[1][0]".into(), at(1, 2))
    );
    assert!(e.to_string().contains("token id"), "{e}");
    // The empty-breaker error had no location.
    let e = flat_err(r#"{"dry_sequence_breakers": [[]]}"#);
    assert_eq!(path_of(&e), ("dry_sequence_breakers[0]".into(), at(1, 2)));
}

#[test]
fn generation_config_wrong_type_names_the_valid_range() {
    // Was: "expected a number" / "found a non-integer number" (for 50.0).
    let e = hf_err(r#"{"temperature": "0.7"}"#);
    assert_eq!(path_of(&e), ("temperature".into(), at(1, 2)));
    assert!(e.to_string().contains("a finite number >= 0"), "{e}");
    let e = hf_err(r#"{"top_k": 50.0}"#);
    assert_eq!(path_of(&e), ("top_k".into(), at(1, 2)));
    assert!(!e.to_string().contains("non-integer"), "{e}");
    assert!(e.to_string().contains("50.0"), "{e}");
    assert!(e.to_string().contains("-1 or 0 (off)"), "{e}");
}

#[test]
fn tagged_json_schema_errors_name_the_stage_key() {
    // Were serde messages without a key path ("expected usize", "missing field `k`").
    let e =
        json_err(r#"{"stages": [{"type": "top_p", "p": 0.5, "min_keep": -3}, {"type": "dist"}]}"#);
    assert!(
        matches!(e, ConfigError::OutOfRange { ref value, .. } if value == "-3"),
        "{e:?}"
    );
    assert_eq!(path_of(&e), ("stages[0].min_keep".into(), at(1, 41)));
    assert!(e.to_string().contains("an integer >= 0"), "{e}");

    let e = json_err(r#"{"stages": [{"type": "penalties", "last_n": -1}, {"type": "dist"}]}"#);
    assert_eq!(path_of(&e).0, "stages[0].last_n");
    assert!(matches!(e, ConfigError::OutOfRange { .. }));

    let e = json_err(r#"{"stages": [{"type": "top_k", "k": 1e30}, {"type": "dist"}]}"#);
    assert!(matches!(e, ConfigError::WrongType { .. }), "{e:?}");
    assert_eq!(path_of(&e), ("stages[0].k".into(), at(1, 31)));

    let e = json_err(r#"{"stages": [{"type": "dist"}, {"type": "top_k"}]}"#);
    assert!(matches!(e, ConfigError::MissingKey { .. }), "{e:?}");
    assert_eq!(path_of(&e), ("stages[1].k".into(), at(1, 31)));

    let e = json_err(r#"{"stages": [{"k": 3}, {"type": "dist"}]}"#);
    assert!(matches!(e, ConfigError::MissingKey { .. }), "{e:?}");
    assert_eq!(path_of(&e), ("stages[0].type".into(), at(1, 13)));

    let e = json_err(r#"{"stages": [{"type": 3}]}"#);
    assert!(matches!(e, ConfigError::WrongType { .. }), "{e:?}");
    assert_eq!(path_of(&e).0, "stages[0].type");

    let e = json_err(r#"{"stages": [{"type": "logit_bias", "bias": {"1": 2}}, {"type": "dist"}]}"#);
    assert!(matches!(e, ConfigError::WrongType { .. }), "{e:?}");
    assert_eq!(path_of(&e).0, "stages[0].bias");

    let e = json_err(r#"{"seed": -1, "stages": [{"type": "dist"}]}"#);
    assert_eq!(path_of(&e), ("seed".into(), at(1, 2)));
    assert!(e.to_string().contains("[0, 2^64 - 1]"), "{e}");

    let e = json_err(r#"{"stages": "top_k;dist"}"#);
    assert_eq!(path_of(&e), ("stages".into(), at(1, 2)));
}

#[test]
fn tagged_json_out_of_range_points_at_the_offending_stage() {
    // Was 1:31, the `"p"` of stage 0, for an error in stage 1.
    let text = r#"{"stages": [{"type": "top_p", "p": 0.5}, {"type": "min_p", "p": -1}, {"type": "dist"}]}"#;
    let e = json_err(text);
    assert_eq!(path_of(&e), ("stages[1].p".into(), at(1, 60)));
}

#[test]
fn chain_string_with_commas_or_spaces_suggests_semicolons() {
    for s in ["top_k,dist", "top_k dist", "top_k, temperature, dist"] {
        let e = ChainConfig::from_chain_string(s).unwrap_err();
        assert!(matches!(e, ConfigError::UnknownStage { .. }), "{e:?}");
        let want = s.replace(", ", ";").replace([',', ' '], ";");
        assert_eq!(e.suggestion(), Some(want.as_str()), "{s}");
    }
}

#[test]
fn toml_wrong_type_names_the_value_found() {
    // Was "found string" / "found float": the value was not named.
    let e =
        ChainConfig::from_toml_str("samplers = \"top_k;dist\"\n[top_k]\nk = \"40\"\n").unwrap_err();
    assert_eq!(
        e,
        ConfigError::WrongType {
            path: "top_k.k".into(),
            found: "string \"40\"".into(),
            expected: "an integer (k <= 0 disables)".into(),
            location: at(3, 5),
        }
    );
    let e =
        ChainConfig::from_toml_str("samplers = \"top_k;dist\"\n[top_k]\nk = 1e30\n").unwrap_err();
    assert!(e.to_string().contains("found float 1e30"), "{e}");
    let e = ChainConfig::from_toml_str("samplers = \"dist\"\nseed = true\n").unwrap_err();
    assert!(e.to_string().contains("found boolean true"), "{e}");
}

#[test]
fn toml_duplicate_key_names_its_table() {
    // Was "4:1: TOML syntax error: duplicate key `k`".
    let e = ChainConfig::from_toml_str("samplers = \"top_k;dist\"\n[top_k]\nk = 1\nk = 2\n")
        .unwrap_err();
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    assert_eq!(e.location(), at(4, 1));
    assert!(e.to_string().contains("duplicate key `top_k.k`"), "{e}");
    let e =
        ChainConfig::from_toml_str("[[stage]]\ntype = \"dist\"\ntype = \"greedy\"\n").unwrap_err();
    assert!(
        e.to_string().contains("duplicate key `stage[0].type`"),
        "{e}"
    );
    let e = ChainConfig::from_toml_str("seed = 1\nseed = 2\nsamplers = \"dist\"\n").unwrap_err();
    assert!(e.to_string().contains("duplicate key `seed`"), "{e}");
}

#[test]
fn tagged_json_of_a_rust_spec_with_huge_counts_loads_back() {
    use chain_config::{DeviceConfig, LoadOptions, StageSpec};
    // serde writes `min_keep: usize::MAX` as 18446744073709551615; the
    // loader must read back what serde of a valid `ChainSpec` writes.
    let spec = chain_config::ChainSpec::new(
        vec![
            StageSpec::TopP {
                p: 0.5,
                min_keep: usize::MAX,
            },
            StageSpec::Dist,
        ],
        Some(u64::MAX),
    );
    let cfg = ChainConfig::validated(
        spec.clone(),
        DeviceConfig::default(),
        &LoadOptions::default(),
    )
    .expect("valid");
    let text = serde_json::to_string(&cfg.chain).expect("serialises");
    assert_eq!(ChainConfig::from_json(&text).expect("loads").chain, spec);
    // But an i64 parameter beyond i64 is out of range, with its path.
    let e =
        json_err(r#"{"stages": [{"type": "top_k", "k": 9223372036854775808}, {"type": "dist"}]}"#);
    assert_eq!(path_of(&e).0, "stages[0].k");
}

#[test]
fn toml_seed_minus_zero_is_zero() {
    // Was "`seed` = -0 is out of range": `-0` is the TOML integer 0.
    let cfg = ChainConfig::from_toml_str("samplers = \"dist\"\nseed = -0\n").expect("loads");
    assert_eq!(cfg.chain.seed, Some(0));
    let cfg = ChainConfig::from_toml_str("samplers = \"dist\"\nseed = +7\n").expect("loads");
    assert_eq!(cfg.chain.seed, Some(7));
    let e = ChainConfig::from_toml_str("samplers = \"dist\"\nseed = -1\n").unwrap_err();
    assert!(
        matches!(e, ConfigError::OutOfRange { ref value, .. } if value == "-1"),
        "{e:?}"
    );
}

/// `cpu`, `flex` and `ndarray` have no device index: `cpu:7` or `flex:0` is
/// refused by the loader, not later by the backend.
#[test]
fn device_index_only_on_gpu_backends() {
    for kind in ["cpu:7", "flex:0", "ndarray:1"] {
        let text = format!("samplers = \"greedy\"\n[device]\nkind = \"{kind}\"\n");
        let e = ChainConfig::from_toml_str(&text).expect_err(kind);
        assert!(e.to_string().contains("`device.kind`"), "{kind}: {e}");
    }
    for kind in ["cuda:1", "wgpu:0", "vulkan:2", "cpu", "flex"] {
        let text = format!("samplers = \"greedy\"\n[device]\nkind = \"{kind}\"\n");
        assert!(ChainConfig::from_toml_str(&text).is_ok(), "{kind}");
    }
}

/// `repeat = 1e-39` is finite and > 0, but its reciprocal is not: the error
/// says the real rule (the smallest accepted value), not "a finite number > 0".
#[test]
fn repeat_below_the_reciprocal_limit_names_the_real_rule() {
    let e =
        ChainConfig::from_toml_str("samplers = \"penalties;dist\"\n[penalties]\nrepeat = 1e-39\n")
            .unwrap_err()
            .to_string();
    assert!(
        e.contains(">= 2.938736e-39") && e.contains("1/repeat finite"),
        "{e}"
    );
    assert!(
        ChainConfig::from_toml_str(
            "samplers = \"penalties;dist\"\n[penalties]\nrepeat = 2.94e-39\n"
        )
        .is_ok()
    );
}

/// TOML `logit_bias` of `-1e39` (finite as written, beyond f32) is out of
/// range like `+1e39`, never silently a ban; `-inf` written as such bans.
#[test]
fn toml_bias_beyond_f32_is_out_of_range_not_a_ban() {
    for b in ["-1e39", "1e39"] {
        let text = format!("samplers = \"logit_bias;dist\"\n[logit_bias]\nbias = {{ 5 = {b} }}\n");
        let e = ChainConfig::from_toml_str(&text).unwrap_err();
        assert!(
            matches!(e, ConfigError::OutOfRange { ref value, .. } if value == b),
            "{b}: {e}"
        );
    }
    let ok = ChainConfig::from_toml_str(
        "samplers = \"logit_bias;dist\"\n[logit_bias]\nbias = { 5 = -inf }\n",
    )
    .unwrap();
    assert_eq!(
        ok.chain.stages[0],
        chain_config::StageSpec::LogitBias {
            bias: vec![(5, f32::NEG_INFINITY)]
        }
    );
}

/// A flat `logit_bias` key with a leading zero (`"007"`) is an out-of-range
/// key naming its path, not "a JSON syntax error".
#[test]
fn flat_bias_key_with_leading_zero_names_the_key() {
    let e = flat_err(r#"{"logit_bias": {"007": 1.0}}"#);
    assert!(
        matches!(e, ConfigError::OutOfRange { ref path, .. } if path == "logit_bias.\"007\""),
        "{e}"
    );
    assert!(!e.to_string().contains("syntax"), "{e}");
}

/// A JSON key given twice is refused with its full path and location in
/// every JSON front end (serde_json alone keeps the last one silently, or
/// fails on the first with a type error).
#[test]
fn duplicate_json_keys_are_refused_everywhere() {
    let e = json_err(r#"{"stages": [{"type": "top_k", "k": 3, "k": 4}, {"type": "dist"}]}"#);
    assert!(
        matches!(e, ConfigError::DuplicateKey { ref path, .. } if path == "stages[0].k"),
        "{e}"
    );
    assert_eq!(e.location().map(|l| l.line), Some(1), "{e}");
    let e = json_err(r#"{"seed": 1, "stages": [{"type": "dist"}], "seed": 2}"#);
    assert!(
        matches!(e, ConfigError::DuplicateKey { ref path, .. } if path == "seed"),
        "{e}"
    );
    let e = flat_err("{\"top_p\": 0.5,\n \"top_p\": \"x\"}");
    assert!(
        matches!(e, ConfigError::DuplicateKey { ref path, .. } if path == "top_p"),
        "{e}"
    );
    assert_eq!(e.location().map(|l| l.line), Some(2), "{e}");
    let e = flat_err(r#"{"logit_bias": {"5": 1.0, "5": 2.0}}"#);
    assert!(
        matches!(e, ConfigError::DuplicateKey { ref path, .. } if path == "logit_bias.5"),
        "{e}"
    );
    let e = hf_err(r#"{"temperature": 0.7, "temperature": 0.9}"#);
    assert!(
        matches!(e, ConfigError::DuplicateKey { ref path, .. } if path == "temperature"),
        "{e}"
    );
}

/// Locations point at the key or value the error is about, not at the first
/// textual match of its name elsewhere in the document.
#[test]
fn json_error_locations_name_the_key_not_a_textual_match() {
    // `"top_kk"` appears first as a key of stage 0, then as its type.
    let e = json_err(r#"{"stages": [{"top_kk": 1, "type": "top_kk"}]}"#);
    let at = e.location().expect("a location");
    assert_eq!((at.line, at.column), (1, 35), "{e}");
    // A top-level unknown key named like a nested one (line 1): the error
    // points at the top-level one (line 2).
    let e = json_err("{\"stages\": [{\"type\": \"dist\", \"x\": 1}],\n \"x\": 2}");
    assert!(matches!(e, ConfigError::UnknownKey { .. }), "{e}");
    let at = e.location().expect("a location");
    assert_eq!((at.line, at.column), (2, 2), "{e}");
    let e = flat_err("{\"logit_bias\": {\"5\": 1},\n \"top_pp\": 1}");
    assert_eq!(
        e.location().map(|l| (l.line, l.column)),
        Some((2, 2)),
        "{e}"
    );
}

/// A count above 2^63 - 1 (JSON `min_keep` = 2^64 - 1) survives
/// load -> TOML -> load: the writer spells it as a decimal string, which the
/// TOML loader reads back.
#[test]
fn huge_counts_survive_load_save_load() {
    let cfg = ChainConfig::from_json(
        r#"{"stages": [{"type": "top_p", "p": 0.5, "min_keep": 18446744073709551615}, {"type": "dist"}]}"#,
    )
    .expect("loads");
    let toml = cfg.to_toml_string();
    assert!(
        toml.contains("min_keep = \"18446744073709551615\""),
        "{toml}"
    );
    let again = ChainConfig::from_toml_str(&toml).expect("reloads");
    assert_eq!(again.chain, cfg.chain);
}

/// Every stage, with every parameter away from its default, round-trips
/// through `ChainSpec`'s serde form and loads through `ChainConfig::from_json`
/// (a `min_tokens` stage once could not be read back: "expected a list of
/// token ids").
#[test]
fn every_stage_with_every_parameter_set_round_trips_through_serde() {
    use sampler_core::{ChainSpec, HistoryScope, ParamKind, ParamValue, StageKind, StageSpec};
    for kind in StageKind::ALL {
        let mut spec = StageSpec::default_for(kind);
        for pm in kind.meta().params {
            let value = match pm.kind {
                ParamKind::Int => {
                    let lo = pm.min.map_or(0, |m| m as i64);
                    [lo + 2, lo + 3]
                        .map(ParamValue::Int)
                        .into_iter()
                        .find(|v| *v != pm.default_value())
                        .unwrap()
                }
                ParamKind::Float => {
                    let lo = pm.min.unwrap_or(0.0);
                    let hi = pm.max.unwrap_or(lo + 2.0);
                    [0.37, 0.61]
                        .map(|x| ParamValue::Float((lo + x * (hi - lo)) as f32))
                        .into_iter()
                        .find(|v| *v != pm.default_value())
                        .unwrap()
                }
                ParamKind::Enum(_) => ParamValue::Scope(HistoryScope::Output),
                ParamKind::TokenIds => ParamValue::Ids(vec![2, 7]),
                ParamKind::TokenSequences => ParamValue::Seqs(vec![vec![3], vec![4, 5]]),
                ParamKind::TokenBiases => {
                    ParamValue::Biases(vec![(3, 1.5), (9, f32::NEG_INFINITY), (3, -0.5)])
                }
            };
            assert_ne!(value, pm.default_value(), "{}.{}", kind.name(), pm.name);
            spec.set_param(pm.name, value)
                .unwrap_or_else(|e| panic!("{}.{}: {e:?}", kind.name(), pm.name));
        }
        spec.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
        let chain = ChainSpec::new(vec![spec, StageSpec::Dist], Some(5));
        let text = serde_json::to_string(&chain).unwrap();
        let back: ChainSpec =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", kind.name()));
        assert_eq!(back, chain, "{text}");
        if !text.contains("null") {
            // JSON has no -inf: serde writes it as null, the loader refuses it.
            let cfg = ChainConfig::from_json(&text)
                .unwrap_or_else(|e| panic!("{}: {e}\n{text}", kind.name()));
            assert_eq!(cfg.chain, chain, "{text}");
        }
    }
}

/// Dynamic temperature is refused outside `[0, 100]` (range) and `[0, 10]`
/// (exponent) in Rust, TOML and flat parameters: at `1e30` the
/// entropy-derived temperature jumped between its ends on the last bit of
/// the entropy, and the CPU and a device drew different tokens.
#[test]
fn dynamic_temperature_beyond_its_range_is_refused() {
    use sampler_core::StageSpec;
    let temp = |r: f32, e: f32| StageSpec::Temperature {
        t: 0.7,
        dynatemp_range: r,
        dynatemp_exponent: e,
    };
    let e = temp(1e30, 1.0).validate().unwrap_err().to_string();
    assert!(
        e.contains("temperature.dynatemp_range = ") && e.contains("[0, 100]"),
        "{e}"
    );
    let e = temp(1.5, 11.0).validate().unwrap_err().to_string();
    assert!(
        e.contains("dynatemp_exponent") && e.contains("[0, 10]"),
        "{e}"
    );
    assert!(temp(100.0, 10.0).validate().is_ok());
    let toml = "samplers = \"temperature;dist\"\n[temperature]\nt = 0.7\ndynatemp_range = 1e30\n";
    let e = ChainConfig::from_toml_str(toml).unwrap_err().to_string();
    assert!(
        e.contains("dynatemp_range") && e.contains("[0, 100]"),
        "{e}"
    );
    let e = flat_err(r#"{"temperature": 0.7, "dynatemp_exponent": 1e30}"#).to_string();
    assert!(
        e.contains("dynatemp_exponent") && e.contains("[0, 10]"),
        "{e}"
    );
}
