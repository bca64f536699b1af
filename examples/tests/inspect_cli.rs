//! `inspect`: the per-stage pictures and JSON of a short generation, on
//! stories260K (in the repository) and SmolLM2 (from the shared model
//! directory, skipped with the reason when absent): every file written and
//! not trivially small, the JSON's stages and tokens consistent with the
//! chain and with `generate` (same seed, same tokens), and each drawn
//! token's label in its step's SVG text.

use std::path::{Path, PathBuf};
use std::process::Command;

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("inspect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// How plotters writes text into SVG.
fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

fn run(bin: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `inspect` with `args` into a fresh directory and check what it wrote;
/// returns the JSON and the drawn tokens.
fn inspect_and_check(name: &str, args: &[&str], stages: &[&str]) -> (serde_json::Value, Vec<u64>) {
    let dir = out_dir(name);
    let mut all = args.to_vec();
    all.extend(["--out", dir.to_str().unwrap()]);
    run(env!("CARGO_BIN_EXE_inspect"), &all);
    let size = |f: &str| std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("inspect.json")).unwrap()).unwrap();
    let steps = doc["steps"].as_array().unwrap();
    assert!(!steps.is_empty());
    let mut tokens = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let stem = format!("step-{i:03}");
        assert!(size(&format!("{stem}.png")) > 10_000, "{name} {stem}.png");
        assert!(size(&format!("{stem}.svg")) > 2_000, "{name} {stem}.svg");
        let names: Vec<&str> = st["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, stages, "{name} step {i}");
        // Survivors never grow along the chain; the drawn token survives
        // the last stage with a positive probability.
        let surv: Vec<u64> = st["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["survivors"].as_u64().unwrap())
            .collect();
        assert!(surv.windows(2).all(|w| w[1] <= w[0]), "{name}: {surv:?}");
        assert!(st["drawn_prob"].as_f64().unwrap() > 0.0);
        let u = st["uniform"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&u));
        // The drawn token's label is in the SVG text.
        let svg = std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap();
        let token = st["token"].as_u64().unwrap();
        let label = format!("{} {token}", st["text"].as_str().unwrap());
        assert!(
            svg.contains(&xml_escape(&label)),
            "{name} {stem}.svg lacks the drawn token's label {label}"
        );
        tokens.push(token);
    }
    for f in ["summary.png", "summary.svg"] {
        assert!(size(f) > 10_000, "{name} {f}");
    }
    let summary = std::fs::read_to_string(dir.join("summary.svg")).unwrap();
    for s in stages {
        assert!(summary.contains(s), "{name}: summary legend lacks {s}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    (doc, tokens)
}

fn generate_tokens(args: &[&str]) -> Vec<u64> {
    let mut all = args.to_vec();
    all.push("--json");
    let out = run(env!("CARGO_BIN_EXE_generate"), &all);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn inspect_stories260k() {
    let chain = [
        "--prompt",
        "Once upon a time",
        "-n",
        "5",
        "--seed",
        "3",
        "--samplers",
        "penalties;top_k;top_p;temperature;dist",
        "--repeat-penalty",
        "1.3",
        "--top-k",
        "30",
        "--top-p",
        "0.9",
        "--temp",
        "1.2",
    ];
    let (doc, tokens) = inspect_and_check(
        "stories",
        &chain,
        &["penalties", "top_k", "top_p", "temperature", "dist"],
    );
    assert_eq!(doc["seed"], 3);
    // The same tokens as generate with the same seed.
    assert_eq!(tokens, generate_tokens(&chain));
    // top_k keeps 30 of the vocabulary.
    let st = &doc["steps"][0]["stages"][1];
    assert_eq!(st["survivors"], 30);
    assert_eq!(st["survivors_before"], 512);
    // Bad input: a clear usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_inspect"))
        .args(["-n", "0", "--out", "/tmp/never-written"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-n 0"));
}

fn smollm2() -> Option<PathBuf> {
    let f = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if f.is_file() {
        Some(f)
    } else {
        println!(
            "SKIP: {} is absent (the shared model directory beside the repository)",
            f.display()
        );
        None
    }
}

#[test]
fn inspect_smollm2() {
    let Some(model) = smollm2() else {
        return;
    };
    let m = model.to_str().unwrap();
    let chain = [
        "--model",
        m,
        "--context",
        "128",
        "--chat",
        "Name a colour.",
        "-n",
        "3",
        "--seed",
        "5",
        "--samplers",
        "top_k;min_p;temperature;dist",
        "--top-k",
        "40",
        "--min-p",
        "0.05",
        "--top",
        "8",
    ];
    let (_, tokens) = inspect_and_check(
        "smollm2",
        &chain,
        &["top_k", "min_p", "temperature", "dist"],
    );
    let gen_args: Vec<&str> = chain[..chain.len() - 2].to_vec();
    assert_eq!(tokens, generate_tokens(&gen_args));
}
