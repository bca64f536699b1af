//! `logprobs`, `top_logprobs`, `logprob_token_ids`, `logprobs_mode` and
//! `min_tokens` in every front end: flat parameters, TOML, tagged JSON and
//! `generation_config.json`; their errors name the key and the range.

use chain_config::{ChainConfig, ConfigError, GenerationConfig, SamplingParams, StageSpec};
use sampler_core::{LogprobsMode, LogprobsSpec};

fn flat(text: &str) -> Result<ChainConfig, ConfigError> {
    SamplingParams::from_json_str(text)?.to_chain()
}

fn out_of_range(e: ConfigError) -> (String, String, String, Option<chain_config::Location>) {
    match e {
        ConfigError::OutOfRange {
            path,
            value,
            expected,
            location,
        } => (path, value, expected, location),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
}

#[test]
fn flat_parameters() {
    let c = flat(
        r#"{"logprobs": true, "top_logprobs": 5, "logprob_token_ids": [1, 2],
            "logprobs_mode": "processed", "min_tokens": 3, "stop_token_ids": [2],
            "logit_bias": {"7": -1.0}}"#,
    )
    .unwrap();
    assert_eq!(
        c.chain.logprobs,
        Some(LogprobsSpec {
            top_n: 5,
            token_ids: vec![1, 2],
            mode: LogprobsMode::Processed
        })
    );
    // min_tokens right after logit_bias, before the penalties and filters.
    assert_eq!(
        c.chain.stages[1],
        StageSpec::MinTokens {
            n: 3,
            stop: vec![2]
        }
    );
    // vLLM's integer form, and its mode names.
    let c = flat(r#"{"logprobs": 3, "logprobs_mode": "raw_logprobs"}"#).unwrap();
    assert_eq!(c.chain.logprobs.unwrap().top_n, 3);
    assert_eq!(flat(r#"{"logprobs": false}"#).unwrap().chain.logprobs, None);
    assert_eq!(flat("{}").unwrap().chain.logprobs, None);
    // Requested ids alone turn logprobs on.
    let c = flat(r#"{"logprob_token_ids": [9]}"#).unwrap();
    assert_eq!(c.chain.logprobs.unwrap().token_ids, vec![9]);
    // min_tokens without stop ids: kept for the host app to add its EOS.
    let mut c = flat(r#"{"min_tokens": 4}"#).unwrap();
    assert_eq!(
        c.chain.stages[0],
        StageSpec::MinTokens { n: 4, stop: vec![] }
    );
    c.chain.fill_stop_ids(&[2]);
    assert_eq!(
        c.chain.stages[0],
        StageSpec::MinTokens {
            n: 4,
            stop: vec![2]
        }
    );
}

#[test]
fn flat_errors_name_the_key() {
    let (path, value, expected, loc) = out_of_range(flat(r#"{"top_logprobs": 21}"#).unwrap_err());
    assert_eq!((path.as_str(), value.as_str()), ("top_logprobs", "21"));
    assert!(expected.contains("[0, 20]"), "{expected}");
    assert!(loc.is_some());
    let (path, _, expected, _) =
        out_of_range(flat(r#"{"logprobs": false, "top_logprobs": 2}"#).unwrap_err());
    assert_eq!(path, "top_logprobs");
    assert!(expected.contains("logprobs` is false"), "{expected}");
    let (path, _, _, _) = out_of_range(flat(r#"{"logprobs": 2, "top_logprobs": 2}"#).unwrap_err());
    assert_eq!(path, "top_logprobs");
    let (path, value, _, _) = out_of_range(flat(r#"{"logprobs_mode": "best"}"#).unwrap_err());
    assert_eq!(
        (path.as_str(), value.as_str()),
        ("logprobs_mode", "\"best\"")
    );
    let (path, _, _, _) = out_of_range(flat(r#"{"logprobs_mode": "raw"}"#).unwrap_err());
    assert_eq!(path, "logprobs_mode");
    let ids: Vec<String> = (0..129).map(|i| i.to_string()).collect();
    let (path, value, _, _) = out_of_range(
        flat(&format!(r#"{{"logprob_token_ids": [{}]}}"#, ids.join(","))).unwrap_err(),
    );
    assert_eq!(
        (path.as_str(), value.as_str()),
        ("logprob_token_ids", "129 ids")
    );
    let (path, value, _, _) = out_of_range(flat(r#"{"min_tokens": -1}"#).unwrap_err());
    assert_eq!((path.as_str(), value.as_str()), ("min_tokens", "-1"));
    assert!(matches!(
        flat(r#"{"logprobs": "yes"}"#).unwrap_err(),
        ConfigError::WrongType { .. }
    ));
}

#[test]
fn toml_keys_and_round_trip() {
    let text = r#"
samplers = "min_tokens;top_k;dist"
logprobs = true
top_logprobs = 2
logprob_token_ids = [4, 5]
logprobs_mode = "processed"

[min_tokens]
n = 4
stop = [2, 3]

[top_k]
k = 10
"#;
    let c = ChainConfig::from_toml_str(text).unwrap();
    assert_eq!(
        c.chain.logprobs,
        Some(LogprobsSpec {
            top_n: 2,
            token_ids: vec![4, 5],
            mode: LogprobsMode::Processed
        })
    );
    assert_eq!(
        c.chain.stages[0],
        StageSpec::MinTokens {
            n: 4,
            stop: vec![2, 3]
        }
    );
    let back = ChainConfig::from_toml_str(&c.to_toml_string()).unwrap();
    assert_eq!(back.chain, c.chain, "{}", c.to_toml_string());

    let bad = "samplers = \"dist\"\ntop_logprobs = 30\n";
    let (path, value, _, loc) = out_of_range(ChainConfig::from_toml_str(bad).unwrap_err());
    assert_eq!((path.as_str(), value.as_str()), ("top_logprobs", "30"));
    let loc = loc.unwrap();
    assert_eq!((loc.line, loc.column), (2, 16));
    let bad = "samplers = \"min_tokens;dist\"\n[min_tokens]\nn = 2\nstop = [\"eos\"]\n";
    assert!(ChainConfig::from_toml_str(bad).is_err());
}

#[test]
fn tagged_json_round_trip() {
    let c = ChainConfig::from_json(
        r#"{"stages": [{"type": "greedy"}], "logprobs": {"top_n": 2, "mode": "processed"}}"#,
    )
    .unwrap();
    assert_eq!(c.chain.logprobs.as_ref().unwrap().top_n, 2);
    let text = serde_json::to_string(&c.chain).unwrap();
    let back = ChainConfig::from_json(&text).unwrap();
    assert_eq!(back.chain, c.chain, "{text}");
    let e = ChainConfig::from_json(r#"{"stages": [{"type": "greedy"}], "logprobs": {"top": 2}}"#)
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::UnknownKey { ref path, .. } if path == "logprobs.top"),
        "{e:?}"
    );
}

#[test]
fn generation_config_min_new_tokens() {
    let g = GenerationConfig::from_json_str(r#"{"min_new_tokens": 5, "eos_token_id": [2, 7]}"#)
        .unwrap();
    let c = g.to_params().to_chain().unwrap();
    assert_eq!(
        c.chain.stages[0],
        StageSpec::MinTokens {
            n: 5,
            stop: vec![2, 7]
        }
    );
    let g = GenerationConfig::from_json_str(r#"{"min_new_tokens": 1, "eos_token_id": 2}"#).unwrap();
    let c = g.to_params().to_chain().unwrap();
    assert_eq!(
        c.chain.stages[0],
        StageSpec::MinTokens {
            n: 1,
            stop: vec![2]
        }
    );
    let e = GenerationConfig::from_json_str(r#"{"min_new_tokens": -2}"#).unwrap_err();
    let (path, _, _, loc) = out_of_range(e);
    assert_eq!(path, "min_new_tokens");
    assert!(loc.is_some());
}

/// `ChainConfig::validated` with bad logprobs is an error, not a panic.
#[test]
fn validated_reports_bad_logprobs() {
    let mut chain = sampler_core::ChainSpec::new(vec![StageSpec::Greedy], None);
    chain.logprobs = Some(LogprobsSpec {
        top_n: 21,
        ..LogprobsSpec::default()
    });
    let e = ChainConfig::validated(
        chain,
        chain_config::DeviceConfig::default(),
        &chain_config::LoadOptions::default(),
    )
    .unwrap_err();
    let (path, value, _, _) = out_of_range(e);
    assert_eq!((path.as_str(), value.as_str()), ("top_logprobs", "21"));
}
