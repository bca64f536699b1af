//! Structured outputs through the example apps: `generate --regex /
//! --grammar / --json-schema` on stories260K (the host path and the device
//! path give the same tokens; bad constraints are refused naming their flag)
//! and, on SmolLM2, 50 requests over 5 JSON schemas and 10 regex requests
//! through `serve` at temperature 1: every finished output validates
//! against its schema (the `jsonschema` crate, not the grammar engine) or
//! matches its regex in full (the `regex` crate). The SmolLM2 part needs
//! the model from `../shared/models/smollm2-135m-instruct/` and is skipped
//! with a printed reason when it is absent.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

fn generate(args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(["--json", "--no-progress"])
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.success(),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tmp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("structured-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn full_match(re: &str, text: &str) -> bool {
    regex::Regex::new(&format!("^(?:{re})$"))
        .unwrap()
        .is_match(text)
}

/// stories260K: a regex and a grammar hold the text on the host path and
/// the device path (flex's burn ops, `--offload device`) with the same
/// tokens; the text matches in full where it ended with end-of-text.
#[test]
fn generate_holds_stories260k_to_a_regex_and_a_grammar_on_both_paths() {
    let re = ", (a|the) [a-z]{2,8} (was|had) [a-z ]{3,30}\\.";
    let grammar = tmp(
        "story.lark",
        "start: \" and \" WHO \" \" DID \".\"\nWHO: \"Tim\" | \"Lily\" | \"the dog\"\nDID: /[a-z]{3,12}/\n",
    );
    let cases: [(&str, &str); 2] = [("--regex", re), ("--grammar", grammar.to_str().unwrap())];
    for (flag, value) in cases {
        let mut texts = Vec::new();
        for seed in ["1", "2", "3", "4"] {
            let mut runs = Vec::new();
            for offload in ["off", "device"] {
                let (ok, v, err) = generate(&[
                    "--prompt",
                    "Once upon a time",
                    "-n",
                    "60",
                    "--seed",
                    seed,
                    "--offload",
                    offload,
                    flag,
                    value,
                ]);
                assert!(ok, "{flag} {offload}: {err}");
                runs.push(v);
            }
            assert_eq!(
                runs[0]["tokens"], runs[1]["tokens"],
                "{flag} seed {seed}: host and device paths differ"
            );
            assert!(
                runs[0]["plan"].to_string().contains("mask"),
                "{}",
                runs[0]["plan"]
            );
            if runs[0]["stop_reason"] == "end_of_text" {
                texts.push(runs[0]["text"].as_str().unwrap().to_string());
            }
        }
        assert!(
            texts.len() >= 2,
            "{flag}: only {} of 4 outputs ended",
            texts.len()
        );
        for t in &texts {
            let t = t.strip_prefix("Once upon a time").unwrap_or(t);
            let ok = match flag {
                "--regex" => full_match(re, t),
                _ => full_match(" and (Tim|Lily|the dog) [a-z]{3,12}\\.", t),
            };
            assert!(ok, "{flag}: {t:?}");
        }
    }
}

/// Bad constraints: each refused before generating, naming the flag and
/// what is wrong.
#[test]
fn generate_refuses_bad_constraints_naming_the_flag() {
    let empty = tmp("empty.lark", "start: \"\"\n");
    let bad_schema = tmp("bad.json", "{\"type\": \"object\", \"properties\": ");
    let missing = std::env::temp_dir().join("no-such-schema.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--regex", "a(b"], "--regex"),
        (vec!["--regex", "[^\\x00-\\u{10FFFF}]"], "can match"),
        (
            vec!["--grammar", empty.to_str().unwrap()],
            "only the empty output",
        ),
        (
            vec!["--json-schema", bad_schema.to_str().unwrap()],
            "not JSON",
        ),
        (
            vec!["--json-schema", missing.to_str().unwrap()],
            "no-such-schema.json",
        ),
        (vec!["--regex", "a", "--json-object"], "cannot be used with"),
    ];
    for (args, says) in cases {
        let mut all = vec!["--prompt", "Once", "-n", "4"];
        all.extend(&args);
        let (ok, _, err) = generate(&all);
        assert!(!ok, "{args:?} was accepted");
        assert!(
            err.contains(says),
            "{args:?}: `{err}` does not say `{says}`"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A config's `[structured]` table holds `generate`'s output as the flag
/// does; a flag replaces it (with a note).
#[test]
fn generate_takes_the_configs_structured_table() {
    let cfg = tmp(
        "yes-no.toml",
        "samplers = \"dist\"\n[structured]\nregex = \" (yes|no)\"\n",
    );
    let (ok, v, err) = generate(&[
        "--prompt",
        "Once",
        "-n",
        "20",
        "--seed",
        "1",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let text = v["text"].as_str().unwrap();
    assert!(text == "Once yes" || text == "Once no", "{text:?}");
    let (ok, v, err) = generate(&[
        "--prompt",
        "Once",
        "-n",
        "20",
        "--seed",
        "1",
        "--config",
        cfg.to_str().unwrap(),
        "--regex",
        " maybe",
    ]);
    assert!(ok, "{err}");
    assert_eq!(v["text"], "Once maybe");
    assert!(err.contains("replaces the config's [structured]"), "{err}");
}

fn smollm2() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    ));
    if p.is_file() {
        Some(p)
    } else {
        println!(
            "SKIP: {} is absent (the shared model directory beside the repository)",
            p.display()
        );
        None
    }
}

/// The five schemas: nested objects, arrays, enums, numbers with ranges,
/// required and optional keys; each with the chat message that asks for it.
fn schemas() -> Vec<(Value, &'static str)> {
    vec![
        (
            json!({"type": "object", "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 16},
                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": false}),
            "Describe a person as JSON with a name and an age.",
        ),
        (
            json!({"type": "object", "properties": {
                "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish", "bird"]}, "minItems": 1, "maxItems": 4},
                "owner": {"type": "string", "maxLength": 12}},
                "required": ["pets"], "additionalProperties": false}),
            "List some pets as JSON.",
        ),
        (
            json!({"type": "object", "properties": {
                "city": {"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "population": {"type": "integer", "minimum": 1, "maximum": 100000000}},
                    "required": ["name", "population"], "additionalProperties": false},
                "capital": {"type": "boolean"}},
                "required": ["city", "capital"], "additionalProperties": false}),
            "Give a city as JSON.",
        ),
        (
            json!({"type": "object", "properties": {
                "temperature": {"type": "number", "minimum": -50, "maximum": 60},
                "sky": {"enum": ["sunny", "cloudy", "rainy"]},
                "wind": {"type": "integer", "minimum": 0, "maximum": 200}},
                "required": ["temperature", "sky"], "additionalProperties": false}),
            "Report the weather as JSON.",
        ),
        (
            json!({"type": "object", "properties": {
                "title": {"type": "string", "maxLength": 24},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
                "rating": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["title", "rating"], "additionalProperties": false}),
            "Review a book as JSON.",
        ),
    ]
}

const REGEXES: [(&str, &str); 2] = [
    ("My email address is", " [a-z]{3,10}@(gmail|example)\\.com"),
    (
        "The date today is",
        " (19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]",
    ),
];

/// 50 JSON-schema requests (5 schemas x 10 seeds) and 10 regex requests
/// through one `serve` batch on flex at temperature 1.
#[test]
fn smollm2_outputs_validate_against_their_schema_or_regex() {
    let Some(model) = smollm2() else { return };
    let mut lines = Vec::new();
    for (i, (schema, ask)) in schemas().iter().enumerate() {
        for seed in 0..10 {
            let format = if seed % 2 == 0 {
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
            } else {
                json!({"guided_json": schema})
            };
            let mut line = json!({
                "id": format!("s{i}-{seed}"),
                "messages": [{"role": "user", "content": ask}],
                "max_tokens": 96, "temperature": 1.0, "seed": 100 + seed,
            });
            line.as_object_mut()
                .unwrap()
                .extend(format.as_object().unwrap().clone());
            lines.push(line.to_string());
        }
    }
    for (i, (prompt, re)) in REGEXES.iter().enumerate() {
        for seed in 0..5 {
            lines.push(
                json!({"id": format!("r{i}-{seed}"), "prompt": prompt, "max_tokens": 24,
                       "temperature": 1.0, "seed": seed, "guided_regex": re})
                .to_string(),
            );
        }
    }
    let file = tmp("structured.jsonl", &lines.join("\n"));
    let out = Command::new(env!("CARGO_BIN_EXE_serve"))
        .arg("--model")
        .arg(&model)
        .arg("--requests-file")
        .arg(&file)
        .args(["--concurrency", "30"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let schemas = schemas();
    let (mut finished, mut total) = (0, 0);
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let id = v["id"].as_str().unwrap();
        let text = v["text"].as_str().unwrap();
        total += 1;
        if v["finish_reason"] != "stop" {
            assert_eq!(v["finish_reason"], "length", "{id}: {v}");
            continue;
        }
        finished += 1;
        let (kind, rest) = id.split_at(1);
        let which: usize = rest.split('-').next().unwrap().parse().unwrap();
        if kind == "s" {
            let doc: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("{id}: {text:?} is not JSON: {e}"));
            let validator = jsonschema::validator_for(&schemas[which].0).unwrap();
            let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
            assert!(
                errors.is_empty(),
                "{id}: {text} breaks its schema: {errors:?}"
            );
        } else {
            assert!(full_match(REGEXES[which].1, text), "{id}: {text:?}");
        }
    }
    assert_eq!(total, 60, "{stderr}");
    assert!(
        finished >= 54,
        "only {finished} of 60 outputs finished within max_tokens"
    );
}

/// SmolLM2 with a JSON schema: the host path (`--offload off`) and the
/// device path on flex (`--offload device`: the chain as burn ops, the
/// mask uploaded as a tensor) give the same tokens, and the output
/// validates.
#[test]
fn smollm2_json_schema_host_and_device_paths_agree() {
    let Some(model) = smollm2() else { return };
    let schema = &schemas()[2].0;
    let file = tmp("city.json", &schema.to_string());
    let mut runs = Vec::new();
    for offload in ["off", "device"] {
        let (ok, v, err) = generate(&[
            "--model",
            model.to_str().unwrap(),
            "--chat",
            "Give a city as JSON.",
            "-n",
            "48",
            "--seed",
            "21",
            "--temperature",
            "1.0",
            "--offload",
            offload,
            "--json-schema",
            file.to_str().unwrap(),
        ]);
        assert!(ok, "{offload}: {err}");
        runs.push(v);
    }
    assert_eq!(
        runs[0]["tokens"], runs[1]["tokens"],
        "host and device paths differ"
    );
    assert!(
        runs[1]["plan"]["device_stages"]
            .to_string()
            .contains("mask"),
        "{}",
        runs[1]["plan"]
    );
    if runs[0]["stop_reason"] == "end_of_text" {
        // `text` holds the rendered prompt too: the answer follows the
        // assistant's turn.
        let text = runs[0]["text"].as_str().unwrap();
        let text = text.rsplit("assistant\n").next().unwrap();
        let doc: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let validator = jsonschema::validator_for(schema).unwrap();
        assert!(validator.is_valid(&doc), "{text}");
    }
}
