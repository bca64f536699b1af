//! The README's TOML snippet loads and declares the same chain as its Rust snippet.

use chain_config::ChainConfig;
use sampler_core::StageSpec;

#[test]
fn readme_toml_snippet_loads_as_the_rust_snippet_chain() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md beside the workspace root");
    let start = readme
        .find("```toml\n")
        .expect("a ```toml block in the README")
        + "```toml\n".len();
    let len = readme[start..].find("```").expect("closed block");
    let cfg = ChainConfig::from_toml_str(&readme[start..start + len]).expect("README TOML loads");
    assert_eq!(
        cfg.chain.stages,
        vec![
            StageSpec::TopK { k: 40 },
            StageSpec::Temperature {
                t: 0.8,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0
            },
            StageSpec::TopP {
                p: 0.95,
                min_keep: 1
            },
            StageSpec::Dist,
        ]
    );
    assert_eq!(cfg.chain.seed, Some(42));
}
