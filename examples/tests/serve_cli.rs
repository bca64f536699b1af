//! The `serve` command: a stream of requests with mixed parameters through
//! the stories260K model with continuous batching.

use std::process::Command;

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
