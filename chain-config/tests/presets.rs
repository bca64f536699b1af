//! Every preset in `examples/chains/` loads, has the chain it documents, and
//! survives load -> serialise -> load.

use std::path::PathBuf;

use chain_config::{ChainConfig, HistoryScope, OffloadPolicy, StageSpec, WHOLE_HISTORY};

fn preset(name: &str) -> ChainConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/chains")
        .join(format!("{name}.toml"));
    match ChainConfig::from_toml_file(&path) {
        Ok(c) => c,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

fn round_trip(cfg: &ChainConfig) {
    let text = cfg.to_toml_string();
    let again = ChainConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(again.chain, cfg.chain, "{text}");
    assert_eq!(again.device, cfg.device, "{text}");
}

#[test]
fn llama_cpp_default() {
    let c = preset("llama_cpp_default");
    assert_eq!(
        c.chain.chain_string(),
        "penalties;dry;top_n_sigma;top_k;typical;top_p;min_p;xtc;temperature;dist"
    );
    // The same as llama.cpp's `--sampling-seq edskypmxt` with default values.
    assert_eq!(
        c.chain,
        ChainConfig::from_sampling_seq("edskypmxt").unwrap().chain
    );
    let active: Vec<&str> = c
        .chain
        .stages
        .iter()
        .filter(|s| !s.is_noop())
        .map(|s| s.name())
        .collect();
    assert_eq!(active, ["top_k", "top_p", "min_p", "temperature", "dist"]);
    assert_eq!(c.chain.seed, None);
    assert_eq!(c.device.offload, OffloadPolicy::Auto);
    assert!(c.diagnostics.is_empty());
    round_trip(&c);
}

#[test]
fn vllm() {
    let c = preset("vllm");
    assert_eq!(
        c.chain.chain_string(),
        "penalties;penalties;temperature;min_p;top_k;top_p;dist"
    );
    assert_eq!(
        c.chain.stages[0],
        StageSpec::Penalties {
            last_n: WHOLE_HISTORY,
            repeat: 1.05,
            frequency: 0.0,
            presence: 0.0,
            scope: HistoryScope::PromptAndOutput
        }
    );
    assert_eq!(
        c.chain.stages[1],
        StageSpec::Penalties {
            last_n: WHOLE_HISTORY,
            repeat: 1.0,
            frequency: 0.1,
            presence: 0.1,
            scope: HistoryScope::Output
        }
    );
    assert!(c.chain.stages[4].is_noop(), "top_k = 0 is off");
    assert_eq!(c.chain.seed, Some(0));
    round_trip(&c);
    // Different repeated stages serialise as [[stage]] tables.
    assert!(c.to_toml_string().contains("[[stage]]"));
}

#[test]
fn greedy() {
    let c = preset("greedy");
    assert_eq!(c.chain.stages, vec![StageSpec::Greedy]);
    round_trip(&c);
}

#[test]
fn code() {
    let c = preset("code");
    assert_eq!(c.chain.chain_string(), "top_k;top_p;temperature;dist");
    assert_eq!(
        c.chain.stages[2],
        StageSpec::Temperature {
            t: 0.2,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0
        }
    );
    assert_eq!(c.chain.seed, Some(1234));
    round_trip(&c);
}

#[test]
fn creative() {
    let c = preset("creative");
    assert_eq!(
        c.chain.chain_string(),
        "penalties;dry;min_p;xtc;temperature;dist"
    );
    assert_eq!(
        c.chain.stages[2],
        StageSpec::MinP {
            p: 0.05,
            min_keep: 0
        }
    );
    assert!(c.chain.stages.iter().all(|s| !s.is_noop()));
    round_trip(&c);
}

/// Every `examples/chains/*.toml` (presets and example chains) loads and
/// round-trips.
#[test]
fn every_chain_file_loads() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/chains");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let cfg = ChainConfig::from_toml_file(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            round_trip(&cfg);
            n += 1;
        }
    }
    assert!(n >= 5, "{n} chain files");
}
