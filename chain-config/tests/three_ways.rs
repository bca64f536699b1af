//! Acceptance: the same chain declared three ways (TOML `[[stage]]` tables,
//! a chain string with per-stage tables, flat parameters) samples the same
//! tokens for the same seed on sampler-cpu.

use chain_config::{ChainConfig, SamplingParams, StageSpec};
use sampler_core::Candidates;

const ARRAY_FORM: &str = r#"
seed = 42

[[stage]]
type = "penalties"
last_n = 9223372036854775807
repeat = 1.1
scope = "prompt_and_output"

[[stage]]
type = "top_k"
k = 40

[[stage]]
type = "top_p"
p = 0.9

[[stage]]
type = "min_p"
p = 0.05

[[stage]]
type = "temperature"
t = 0.7

[[stage]]
type = "dist"
"#;

const STRING_FORM: &str = r#"
samplers = "penalties;top-k;nucleus;minp;temp;dist"
seed = 42

[penalties]
last_n = 9223372036854775807
repeat = 1.1

[top-k]
k = 40

[nucleus]
p = 0.9

[minp]
p = 0.05

[temp]
t = 0.7
"#;

const FLAT_FORM: &str = r#"{
  "temperature": 0.7,
  "top_k": 40,
  "top_p": 0.9,
  "min_p": 0.05,
  "repetition_penalty": 1.1,
  "seed": 42
}"#;

/// Deterministic logits for a step: a smooth hill plus a hashed wiggle, so
/// that each step has a different, non-trivial distribution.
fn logits(step: u64, vocab: usize) -> Vec<f32> {
    (0..vocab)
        .map(|i| {
            let mut h = (step.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h ^= h >> 31;
            h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
            h ^= h >> 29;
            let wiggle = (h % 1000) as f32 / 250.0;
            let hill = -((i as f32 - 20.0) / 12.0).powi(2);
            hill + wiggle
        })
        .collect()
}

fn tokens(cfg: &ChainConfig, steps: u64) -> Vec<u32> {
    let mut chain = sampler_cpu::build_chain(&cfg.chain).unwrap_or_else(|e| panic!("{e}"));
    chain.accept_prompt(&[3, 7, 3, 11]);
    (0..steps)
        .map(|step| {
            let mut row = Candidates::from_logits(&logits(step, 64));
            chain
                .sample(&mut row)
                .unwrap_or_else(|e| panic!("step {step}: {e}"))
        })
        .collect()
}

#[test]
fn same_tokens_three_ways() {
    let array = ChainConfig::from_toml_str(ARRAY_FORM).unwrap();
    let string = ChainConfig::from_toml_str(STRING_FORM).unwrap();
    let flat = SamplingParams::from_json_str(FLAT_FORM)
        .unwrap()
        .to_chain()
        .unwrap();
    assert_eq!(array.chain, string.chain);
    assert_eq!(array.chain, flat.chain);

    let a = tokens(&array, 200);
    assert_eq!(a, tokens(&string, 200));
    assert_eq!(a, tokens(&flat, 200));
    // And through the serialised form.
    let again = ChainConfig::from_toml_str(&flat.to_toml_string()).unwrap();
    assert_eq!(a, tokens(&again, 200));
    // The draw is random, not stuck on one token.
    let mut distinct = a.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 5, "{a:?}");
    // Another seed gives another sequence.
    let mut other = flat.clone();
    other.chain.seed = Some(43);
    assert_ne!(a, tokens(&other, 200));
}

/// bug_cases.md case 16: temperature 0, top_k 1, min_p 1 and greedy all
/// return the first maximum.
#[test]
fn greedy_rules_pick_the_first_maximum() {
    let declarations = [
        SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        }
        .to_chain()
        .unwrap(),
        SamplingParams {
            top_k: Some(1),
            ..Default::default()
        }
        .to_chain()
        .unwrap(),
        SamplingParams {
            min_p: Some(1.0),
            ..Default::default()
        }
        .to_chain()
        .unwrap(),
        SamplingParams {
            top_p: Some(0.0),
            ..Default::default()
        }
        .to_chain()
        .unwrap(),
        ChainConfig::from_toml_str("samplers = \"greedy\"").unwrap(),
        ChainConfig::from_chain_string("argmax").unwrap(),
    ];
    for cfg in &declarations {
        let mut chain = sampler_cpu::build_chain(&cfg.chain).unwrap();
        let mut row = Candidates::from_logits(&[1.0, 1.0, 0.5]);
        assert_eq!(chain.sample(&mut row).unwrap(), 0, "{:?}", cfg.chain);
    }
}

/// bug_cases.md case 8 through flat parameters: repetition penalty 1.5,
/// history [0], logits [-2, 1] -> [-3, 1]; a positive logit is divided.
#[test]
fn repetition_penalty_divides_positive_multiplies_negative() {
    let cfg = SamplingParams {
        repetition_penalty: Some(1.5),
        ..Default::default()
    }
    .to_chain()
    .unwrap();
    let mut stages = cfg.chain.stages.clone();
    assert_eq!(stages.pop(), Some(StageSpec::Dist));
    let spec = sampler_core::ChainSpec::new(stages, Some(1));
    let mut chain = sampler_cpu::build_chain(&spec).unwrap();
    chain.accept_prompt(&[0]);
    let mut row = Candidates::from_logits(&[-2.0, 1.0]);
    chain.apply(&mut row).unwrap();
    assert_eq!(row.logits(), &[-3.0, 1.0]);
    let mut chain = sampler_cpu::build_chain(&spec).unwrap();
    chain.accept_prompt(&[0]);
    let mut row = Candidates::from_logits(&[2.0, 1.0]);
    chain.apply(&mut row).unwrap();
    assert!((row.logits()[0] - 2.0 / 1.5).abs() < 1e-6);
}

/// Frequency / presence count output tokens only (vLLM), so the prompt does
/// not move them; repetition counts the prompt too.
#[test]
fn flat_penalty_scopes_on_the_cpu() {
    let cfg = SamplingParams {
        presence_penalty: Some(0.5),
        ..Default::default()
    }
    .to_chain()
    .unwrap();
    let mut stages = cfg.chain.stages.clone();
    stages.pop();
    let spec = sampler_core::ChainSpec::new(stages, Some(1));
    let mut chain = sampler_cpu::build_chain(&spec).unwrap();
    chain.accept_prompt(&[0]);
    let mut row = Candidates::from_logits(&[1.0, 1.0]);
    chain.apply(&mut row).unwrap();
    assert_eq!(row.logits(), &[1.0, 1.0], "prompt tokens do not count");
    chain.commit(1);
    let mut row = Candidates::from_logits(&[1.0, 1.0]);
    chain.apply(&mut row).unwrap();
    assert_eq!(row.logits(), &[1.0, 0.5], "output tokens do");
}
