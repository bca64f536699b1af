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

/// Seconds of the fastest of three calls of `f`.
fn fastest(f: impl Fn()) -> f64 {
    (0..3)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// How much longer `load(n · 16)` takes than `load(n)`: 16 for a linear
/// loader, 256 for a quadratic one (the last one took 1.2 s for 16k TOML
/// biases, locating every key from the start of the text).
fn growth(n: usize, load: impl Fn(usize)) -> f64 {
    load(n); // warm up
    fastest(|| load(n * 16)) / fastest(|| load(n)).max(1e-6)
}

#[test]
fn bias_tables_load_in_time_linear_in_their_size() {
    let toml_table = |n: usize| {
        let mut t = String::from("samplers = [\"logit_bias\", \"dist\"]\n[logit_bias.bias]\n");
        for i in 0..n {
            t.push_str(&format!("\"{i}\" = -1.5\n"));
        }
        let cfg = ChainConfig::from_toml_str(&t).expect("loads");
        assert_eq!(cfg.chain.stages.len(), 2);
    };
    let flat = |n: usize| {
        let body: Vec<String> = (0..n).map(|i| format!("\"{i}\": -1.5")).collect();
        let text = format!("{{\"logit_bias\": {{{}}}}}", body.join(",\n"));
        let p = SamplingParams::from_json_str(&text).expect("loads");
        assert_eq!(p.logit_bias.map(|b| b.len()), Some(n));
    };
    let tagged = |n: usize| {
        let body: Vec<String> = (0..n).map(|i| format!("[{i}, -1.5]")).collect();
        let text = format!(
            "{{\"stages\": [{{\"type\": \"logit_bias\", \"bias\": [{}]}}, {{\"type\": \"dist\"}}]}}",
            body.join(",\n")
        );
        ChainConfig::from_json(&text).expect("loads");
    };
    for (name, load) in [
        ("TOML table", &toml_table as &dyn Fn(usize)),
        ("flat JSON", &flat),
        ("tagged JSON", &tagged),
    ] {
        let g = growth(2000, load);
        println!("{name}: 16x the entries took {g:.1}x the time");
        // Linear: 16 (noise on a loaded machine allowed up to 6x); quadratic: 256.
        assert!(g < 100.0, "{name}: 16x the entries took {g:.0}x the time");
    }
}
