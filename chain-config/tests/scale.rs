//! Every loader is near-linear in its input: a large valid input loads, and
//! round-trips, with the same chain (sizes chosen so that a quadratic loader
//! would take minutes; the assertion is on the results, never on time).

use chain_config::{ChainConfig, SamplingParams};

#[test]
fn sixteen_thousand_json_stages_load_and_round_trip() {
    let stage = r#"{"type": "top_k", "k": 40}"#;
    let mut text = String::from("{\"stages\": [");
    for i in 0..16_000 {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(stage);
        text.push('\n');
    }
    text.push_str(r#", {"type": "dist"}], "seed": 1}"#);
    let cfg = ChainConfig::from_json(&text).expect("loads");
    assert_eq!(cfg.chain.stages.len(), 16_001);
    let again = ChainConfig::from_toml_str(&cfg.to_toml_string()).expect("toml loads");
    assert_eq!(again.chain, cfg.chain);
}

#[test]
fn sixteen_thousand_flat_logit_biases_load() {
    let mut text = String::from("{\"logit_bias\": {");
    for t in 0..16_000 {
        if t > 0 {
            text.push_str(", ");
        }
        text.push_str(&format!("\"{t}\": -1.5"));
    }
    text.push_str("}, \"temperature\": 0.7}");
    let p = SamplingParams::from_json_str(&text).expect("loads");
    assert_eq!(p.logit_bias.as_ref().map(|b| b.len()), Some(16_000));
    let cfg = p.to_chain().expect("chain");
    assert!(cfg.chain.chain_string().starts_with("logit_bias"));
}
