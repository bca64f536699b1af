//! The `serve` command: a stream of requests with mixed parameters through
//! the stories260K model with continuous batching.

use std::process::Command;

use serde_json::json;

fn line_of(stdout: &str, i: usize) -> String {
    let tag = format!("[request {i:>2}]");
    stdout
        .lines()
        .find(|l| l.starts_with(&tag))
        .unwrap_or_else(|| panic!("no line for request {i}:\n{stdout}"))
        .to_string()
}

#[test]
fn serve_finishes_every_request_and_batch_company_does_not_change_tokens() {
    let out = Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--requests", "8", "--every", "3", "--device", "flex"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("serve runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("[request")).count(),
        8,
        "{stdout}"
    );
    assert!(stderr.contains("8 requests on flex"), "{stderr}");
    // Requests 1 and 7 have the same prompt and the same (greedy) chain but
    // run at different steps beside different requests: the shorter one's
    // text is a prefix of the longer one's.
    let text = |l: &str| {
        l.split_once(": ")
            .map(|(_, t)| t.to_string())
            .unwrap_or_default()
    };
    let (a, b) = (line_of(&stdout, 1), line_of(&stdout, 7));
    assert!(a.contains("greedy") && b.contains("greedy"), "{a}\n{b}");
    let (ta, tb) = (text(&a), text(&b));
    assert!(ta.len() > 20 && tb.starts_with(&ta), "{ta:?}\n{tb:?}");
}

/// `--ban-words`: a custom stage first in every chain (through
/// `SamplingBatch::insert_chain`); the requests finish and their texts lose
/// the word where the unconstrained run wrote it.
#[test]
fn serve_with_a_custom_ban_words_stage() {
    let run = |extra: &[&str]| {
        let mut args = vec!["--requests", "6", "--every", "2", "--device", "flex"];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_serve"))
            .args(&args)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .output()
            .expect("serve runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let free = run(&[]);
    let banned = run(&["--ban-words", "little,park"]);
    let count = |s: &str, w: &str| s.matches(w).count();
    assert!(
        count(&free, " little") + count(&free, " park") > 0,
        "the unconstrained run writes the words: {free}"
    );
    for i in 0..6 {
        let l = line_of(&banned, i);
        assert!(l.contains("ban_words;"), "{l}");
    }
    // The prompts "The little dog" and "In the park" contain the words;
    // what follows them must not.
    let generated: String = banned
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(_, t)| t.to_string()))
        .map(|t| {
            t.replacen("The little dog", "", 1)
                .replacen("In the park", "", 1)
        })
        .collect();
    assert!(
        count(&generated, " little") + count(&generated, " park")
            < count(&free, " little") + count(&free, " park"),
        "{generated}"
    );
}

/// Runs `serve` on a JSON-lines request file; returns (success, stdout
/// lines by id, stderr).
fn serve_file(
    lines: &[&str],
    extra: &[&str],
) -> (
    bool,
    std::collections::BTreeMap<String, serde_json::Value>,
    String,
) {
    // One directory per call: tests run in parallel, often with the same flags.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "serve-test-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("requests.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_serve"))
        .arg("--requests-file")
        .arg(&file)
        .args(extra)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("serve runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let by_id = stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["id"].to_string(), v)
        })
        .collect();
    (
        out.status.success(),
        by_id,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Eight mixed requests from a JSON-lines file (flat OpenAI-style keys, a
/// TOML chain, a chain string; greedy, top_k/top_p, min_p, penalties,
/// different seeds, lengths and arrival steps) through one batch: each
/// request's tokens equal its tokens when it runs alone (`--concurrency
/// 1`); a bad line is an error line of its own and the others run.
#[test]
fn request_file_batched_equals_alone() {
    // Longer than stories260K's 512-token context.
    let long = format!(r#"{{"id": "long", "prompt": "{}"}}"#, "dog ".repeat(600));
    let lines = [
        r#"{"id": "greedy", "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}"#,
        r#"{"id": "topk", "prompt": "The little dog", "max_tokens": 25, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 1}"#,
        r#"{"id": "minp", "prompt": "Lily wanted to", "max_tokens": 20, "min_p": 0.1, "seed": 2, "arrival": 2}"#,
        r#"{"id": "pen", "prompt": "One day", "max_tokens": 18, "temperature": 0.7, "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.2, "seed": 3, "arrival": 3}"#,
        r#"{"id": "toml", "prompt": "Tom and his mom", "max_tokens": 12, "toml": "[[stage]]\ntype = \"top_k\"\nk = 5\n[[stage]]\ntype = \"dist\"", "seed": 4, "arrival": 1}"#,
        r#"{"id": "chain", "prompt": "In the park", "max_tokens": 22, "chain": "top_k;temperature;min_p;dist", "seed": 5, "arrival": 5}"#,
        r#"{"id": "lp", "prompt": "The sun", "max_tokens": 6, "temperature": 0, "logprobs": 2}"#,
        r#"{"id": "miro", "prompt": "Once upon a time", "max_tokens": 15, "mirostat": 2, "seed": 6, "arrival": 4}"#,
        r#"{"id": "bad", "prompt": "x", "top_p": 2}"#,
        r#"{"id": "msgs", "messages": [{"role": "user", "content": "Hi"}]}"#,
        &long,
        r#"{"id": "late", "prompt": "The end", "max_tokens": 3, "seed": 8, "arrival": 100}"#,
    ];
    let (ok8, batched, err8) = serve_file(&lines, &["--concurrency", "8"]);
    let (ok1, alone, _) = serve_file(&lines, &["--concurrency", "1"]);
    // The bad request fails the run (exit status), not the others.
    assert!(!ok8 && !ok1, "{err8}");
    assert!(err8.contains("2 of 12 requests failed"), "{err8}");
    let error_of = |id: &str| -> String {
        let v = &batched[&format!("\"{id}\"")];
        assert_eq!(v["finish_reason"], "error", "{v}");
        v["error"].as_str().unwrap().to_string()
    };
    assert!(error_of("bad").contains("top_p"));
    assert!(
        error_of("bad").contains("requests.jsonl:9:"),
        "{}",
        error_of("bad")
    );
    assert!(
        error_of("long").contains("more than the context (512"),
        "{}",
        error_of("long")
    );
    assert_eq!(batched.len(), 12);
    // Chat messages on a checkpoint without a chat template: ChatML.
    assert_ne!(batched["\"msgs\""]["finish_reason"], "error");
    assert!(batched["\"msgs\""]["prompt_tokens"].as_u64() > Some(10));
    // Nothing is live between the others' end and step 100: the run jumps there.
    assert_eq!(batched["\"late\""]["start_step"], 100);
    assert_eq!(batched["\"late\""]["completion_tokens"], 3);
    let mut overlapped = 0;
    for (id, b) in &batched {
        if ["\"bad\"", "\"msgs\"", "\"long\""].contains(&id.as_str()) {
            continue;
        }
        let a = &alone[id];
        assert_ne!(b["finish_reason"], "error", "{b}");
        assert!(!b["tokens"].as_array().unwrap().is_empty(), "{b}");
        assert_eq!(b["tokens"], a["tokens"], "{id}: batched vs alone");
        assert_eq!(b["text"], a["text"], "{id}");
        // Alone, requests wait for each other: they start later.
        if a["start_step"].as_u64() > b["start_step"].as_u64() {
            overlapped += 1;
        }
    }
    assert!(overlapped >= 6, "{batched:?}");
    assert_eq!(batched["\"toml\""]["chain"], "top_k;dist");
    assert_eq!(batched["\"toml\""]["seed"], 4);
    assert_eq!(batched["\"pen\""]["completion_tokens"], 18);
    let lp = batched["\"lp\""]["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), 6);
    assert_eq!(lp[0]["top"].as_array().unwrap().len(), 2);
    // One sampling step held several requests at once.
    let at_most: usize = err8
        .split("at most ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(at_most >= 3, "{err8}");
}

/// Requests from standard input (`--requests-file -`), and a prompt longer
/// than the prefill budget processed in chunks over several steps: the
/// same tokens as in one pass.
#[test]
fn requests_from_stdin_and_chunked_prefill() {
    use std::io::Write;
    let run = |budget: &str| -> serde_json::Value {
        let mut child = Command::new(env!("CARGO_BIN_EXE_serve"))
            .args(["--requests-file", "-", "--prefill-budget", budget])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("serve runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(
                br#"{"id": 1, "prompt": "Once upon a time, there was a little girl named Lily. She loved to play", "max_tokens": 20, "temperature": 0.8, "seed": 3}"#,
            )
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (whole, chunked) = (run("512"), run("4"));
    assert_eq!(whole["tokens"], chunked["tokens"]);
    assert_eq!(whole["completion_tokens"], 20);
    // Four tokens of the prompt per step: sampling starts steps later.
    assert!(
        chunked["end_step"].as_u64() > whole["end_step"].as_u64(),
        "{chunked}"
    );
}

/// Speculative decoding per request (`"speculative"`): greedy requests with
/// n-gram drafts emit what they emit without (in a batch beside requests
/// that do not draft, and alone), accepted drafts are reported, a seeded
/// sampling request with drafts gives the same tokens alone and batched,
/// and a bad setting is that request's error.
#[test]
fn speculative_requests_in_the_batch() {
    let repeat = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a";
    let spec = r#""speculative": {"method": "ngram", "num_speculative_tokens": 4}"#;
    let lines = [
        format!(r#"{{"id": "g", "prompt": "{repeat}", "max_tokens": 60, "temperature": 0, {spec}}}"#),
        format!(r#"{{"id": "g0", "prompt": "{repeat}", "max_tokens": 60, "temperature": 0}}"#),
        format!(r#"{{"id": "s", "prompt": "{repeat}", "max_tokens": 40, "top_k": 20, "seed": 9, {spec}, "arrival": 2}}"#),
        r#"{"id": "plain", "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0.8, "seed": 3, "arrival": 1}"#.to_string(),
        r#"{"id": "bad", "prompt": "x", "speculative": {"num_speculative_tokens": 0}}"#.to_string(),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (_, batched, err) = serve_file(&lines, &["--concurrency", "8", "--json"]);
    let (_, alone, _) = serve_file(&lines, &["--concurrency", "1", "--json"]);
    let get = |m: &std::collections::BTreeMap<String, serde_json::Value>, id: &str| {
        m[&format!("\"{id}\"")].clone()
    };
    assert_eq!(
        get(&batched, "g")["tokens"],
        get(&batched, "g0")["tokens"],
        "{err}"
    );
    let accepted = get(&batched, "g")["speculative"]["accepted"]
        .as_u64()
        .unwrap();
    assert!(accepted > 0, "{}", get(&batched, "g"));
    for id in ["g", "s", "plain"] {
        assert_eq!(
            get(&batched, id)["tokens"],
            get(&alone, id)["tokens"],
            "{id}"
        );
        assert_ne!(get(&batched, id)["finish_reason"], "error");
    }
    let bad = get(&batched, "bad");
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("speculative.num_speculative_tokens"),
        "{bad}"
    );
}

/// `stop` in a request line: the text ends before the first stop string
/// (across token boundaries), `finish_reason` `stop` and `stop_reason` the
/// string; the tokens are the free run's up to the one that completed it.
#[test]
fn stop_strings_in_request_lines() {
    let (_, free, _) = serve_file(
        &[r#"{"id": "a", "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}"#],
        &["--concurrency", "3"],
    );
    let text = free["\"a\""]["text"].as_str().unwrap().to_string();
    let cut = text
        .find("e w")
        .expect("the stop occurs in the greedy text");
    let (ok, stopped, err) = serve_file(
        &[
            r#"{"id": "a", "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": ["zz", "e w"]}"#,
            r#"{"id": "b", "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": "e w", "include_stop_str_in_output": true}"#,
        ],
        &["--concurrency", "2"],
    );
    assert!(ok, "{err}");
    let a = &stopped["\"a\""];
    assert_eq!(a["text"], text[..cut], "{a}");
    assert_eq!(
        (&a["finish_reason"], &a["stop_reason"]),
        (&json!("stop"), &json!("e w"))
    );
    let n = a["tokens"].as_array().unwrap().len();
    assert_eq!(
        a["tokens"].as_array().unwrap()[..],
        free["\"a\""]["tokens"].as_array().unwrap()[..n]
    );
    assert_eq!(stopped["\"b\""]["text"], text[..cut + 3]);
}

/// `n`: the prompt runs once, then the request forks into `n` sequences
/// (the KV cache slot copied); choice `i` equals a separate request with
/// the seed `child_seed(seed, i)`, token for token. One output line with
/// the choices in order.
#[test]
fn n_choices_equal_separate_requests_with_the_derived_seeds() {
    let seed = 77u64;
    let body = |seed: u64, n: usize| {
        format!(
            r#"{{"id": "s{seed}-{n}", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0.9, "top_k": 40, "frequency_penalty": 0.4, "seed": {seed}, "n": {n}}}"#
        )
    };
    let one = body(seed, 4);
    let mut lines = vec![one.as_str()];
    let separate: Vec<String> = (0..4)
        .map(|i| body(sampler_core::rng::child_seed(seed, i), 1))
        .collect();
    lines.extend(separate.iter().map(String::as_str));
    let (ok, out, err) = serve_file(&lines, &["--concurrency", "5"]);
    assert!(ok, "{err}");
    let forked = &out[&format!("\"s{seed}-4\"")];
    let choices = forked["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4, "{forked}");
    let mut total = 0;
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let s = sampler_core::rng::child_seed(seed, i as u64);
        assert_eq!(c["seed"], s);
        let alone = &out[&format!("\"s{s}-1\"")];
        assert_eq!(c["tokens"], alone["tokens"], "choice {i}");
        assert_eq!(c["text"], alone["text"], "choice {i}");
        total += c["completion_tokens"].as_u64().unwrap();
    }
    assert_eq!(forked["completion_tokens"], total);
    // Different seeds: the choices differ.
    assert_ne!(choices[0]["tokens"], choices[1]["tokens"]);
    let (ok, _, err) = serve_file(&[r#"{"prompt": "x", "n": 0}"#], &["--concurrency", "4"]);
    assert!(
        !ok && err.contains("`n` = 0") && err.contains("1..=256"),
        "{err}"
    );
}

/// Beam search as a request line (`num_beams`, `num_return_sequences`,
/// `length_penalty`, with a penalty processor), batched with a sampled
/// request: the same sequences and scores as `generate --num-beams` runs
/// alone. Settings beam search cannot honour fail only their line.
#[test]
fn beam_search_requests_equal_generate() {
    let lines = [
        r#"{"id": "beam", "prompt": "Once upon a time", "num_beams": 4, "num_return_sequences": 3, "length_penalty": 0.5, "repetition_penalty": 1.3, "max_tokens": 16}"#,
        r#"{"id": "sampled", "prompt": "The little dog", "seed": 5, "max_tokens": 12, "n": 2}"#,
        r#"{"id": "top_k", "prompt": "x", "num_beams": 2, "top_k": 40}"#,
        r#"{"id": "logprobs", "prompt": "x", "num_beams": 2, "logprobs": 2}"#,
        r#"{"id": "too_many", "prompt": "x", "num_beams": 2, "num_return_sequences": 3}"#,
    ];
    let (ok, out, err) = serve_file(&lines, &["--concurrency", "4"]);
    assert!(!ok && err.contains("3 of 5 requests failed"), "{err}");
    assert!(
        out["\"top_k\""]["error"]
            .as_str()
            .unwrap()
            .contains("`top_k`")
    );
    assert!(
        out["\"logprobs\""]["error"]
            .as_str()
            .unwrap()
            .contains("logprobs")
    );
    assert!(
        out["\"too_many\""]["error"]
            .as_str()
            .unwrap()
            .contains("num_return_sequences")
    );
    assert_eq!(out["\"sampled\""]["choices"].as_array().unwrap().len(), 2);
    let beam = &out["\"beam\""];
    let choices = beam["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{beam}");

    let g = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args([
            "--prompt",
            "Once upon a time",
            "--num-beams",
            "4",
            "--num-return-sequences",
            "3",
            "--length-penalty",
            "0.5",
            "--samplers",
            "penalties",
            "--repeat-penalty",
            "1.3",
            "-n",
            "16",
            "--json",
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("generate runs");
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let v: serde_json::Value = serde_json::from_slice(&g.stdout).unwrap();
    let seqs = v["sequences"].as_array().unwrap();
    assert_eq!(seqs.len(), 3);
    for (c, s) in choices.iter().zip(seqs) {
        assert_eq!(c["tokens"], s["tokens"], "{beam}\n{v}");
        let (a, b) = (c["score"].as_f64().unwrap(), s["score"].as_f64().unwrap());
        assert!((a - b).abs() < 1e-9, "{a} {b}");
        assert_eq!(c["cumulative_logprob"], s["sum_logprobs"]);
    }
    // Best first.
    let scores: Vec<f64> = choices
        .iter()
        .map(|c| c["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
}
