//! `docs/config.md` lists every stage, alias and parameter with the default
//! and range of sampler-core's metadata: the reference cannot drift.

use chain_config::StageKind;
use sampler_core::ParamKind;

fn kind_word(k: ParamKind) -> &'static str {
    match k {
        ParamKind::Int => "integer",
        ParamKind::Float => "float",
        ParamKind::Enum(_) => "string",
        ParamKind::TokenSequences => "array of token-id arrays",
        ParamKind::TokenBiases => "table token id -> float",
        ParamKind::TokenIds => "array of token ids",
    }
}

/// The reference section of docs/config.md, generated from the metadata.
fn stage_reference() -> String {
    let mut out = String::new();
    for kind in StageKind::ALL {
        let m = kind.meta();
        out.push_str(&format!("### `{}`\n\n", m.name));
        if !m.aliases.is_empty() {
            let a: Vec<String> = m.aliases.iter().map(|a| format!("`{a}`")).collect();
            out.push_str(&format!("Aliases: {}. ", a.join(", ")));
        }
        out.push_str(&format!(
            "No-op when: {}. Semantics: {}.\n\n",
            m.noop_rule, m.source
        ));
        if m.params.is_empty() {
            out.push_str("No parameters.\n\n");
            continue;
        }
        out.push_str("| key | type | default | valid range | meaning |\n|---|---|---|---|---|\n");
        for p in m.params {
            let name = if p.aliases.is_empty() {
                format!("`{}`", p.name)
            } else {
                let a: Vec<String> = p.aliases.iter().map(|a| format!("`{a}`")).collect();
                format!("`{}` (alias {})", p.name, a.join(", "))
            };
            out.push_str(&format!(
                "| {name} | {} | `{}` | {} | {} |\n",
                kind_word(p.kind),
                p.default_toml(),
                p.range.replace('|', "\\|"),
                p.doc.replace('|', "\\|")
            ));
        }
        out.push('\n');
    }
    out
}

/// The rows of the flat-parameter table for the keys stages declare in the
/// registry (`StageMeta::flat_key`).
fn registered_flat_rows() -> String {
    let mut out = String::new();
    for kind in StageKind::ALL {
        let m = kind.meta();
        let (Some(key), Some(p)) = (m.flat_key, m.params.first()) else {
            continue;
        };
        let with = if m.param("min_keep").is_some() {
            " (with `min_keep`)"
        } else {
            ""
        };
        out.push_str(&format!(
            "| `{key}` | off | {} | `{}.{}`{with} |\n",
            p.range.replace('|', "\\|"),
            m.name,
            p.name
        ));
    }
    out
}

/// The text of docs/config.md (empty if missing: the assertions then fail).
fn config_md() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md");
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn docs_config_lists_the_registered_flat_keys() {
    let doc = config_md();
    let rows = registered_flat_rows();
    assert!(
        rows.contains("`epsilon_cutoff`") && rows.contains("`eta_cutoff`"),
        "{rows}"
    );
    assert!(
        doc.contains(&format!(
            "| `do_sample` | sampling | `false` = greedy (transformers) | — |\n{rows}"
        )),
        "docs/config.md's flat-parameter table must end with these rows:\n\n{rows}"
    );
}

#[test]
fn docs_config_lists_every_stage_and_parameter() {
    let doc = config_md();
    let reference = stage_reference();
    assert!(
        doc.contains(&reference),
        "docs/config.md is out of date with the stage metadata; its stage reference must read:\n\n{reference}"
    );
}

/// `cargo test -p chain-config --test docs -- --ignored --nocapture` prints
/// the generated section.
#[test]
#[ignore]
fn print_stage_reference() {
    println!("{}", stage_reference());
}
