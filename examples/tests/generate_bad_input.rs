//! Bad input for the llama2.c loader, tokenizer, model and the `generate`
//! command: each case is a clear error naming the file, the sizes or the
//! valid choices, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use burn_tensor::Device;
use sampler_examples::llama2::generate::encode_prompt;
use sampler_examples::llama2::{Checkpoint, Llama2, Llama2Error, ModelFiles, Tokenizer};

const MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K");
const CKPT_BYTES: usize = 1_056_540;

fn model_file(name: &str) -> PathBuf {
    Path::new(MODEL_DIR).join(name)
}

/// A fresh directory under cargo's per-test scratch dir.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("generate_bad_input_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A model directory with a (possibly modified) checkpoint and tokenizer.
fn model_dir_with(name: &str, ckpt: &[u8], tok: &[u8]) -> PathBuf {
    let d = scratch(name);
    std::fs::write(d.join("model.bin"), ckpt).unwrap();
    std::fs::write(d.join("tok512.bin"), tok).unwrap();
    d
}

fn ckpt_bytes() -> Vec<u8> {
    std::fs::read(model_file("stories260K.bin")).unwrap()
}

fn tok_bytes() -> Vec<u8> {
    std::fs::read(model_file("tok512.bin")).unwrap()
}

/// Byte length of the first `n` tokenizer entries (after the 4-byte header).
fn tok_prefix_len(tok: &[u8], n: usize) -> usize {
    let mut pos = 4;
    for _ in 0..n {
        let len = i32::from_le_bytes(tok[pos + 4..pos + 8].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    pos
}

#[test]
fn missing_model_path_is_named() {
    let e = ModelFiles::locate(Path::new("/no/such/model/dir"), None).unwrap_err();
    assert!(matches!(e, Llama2Error::ModelFiles(_)));
    assert!(e.to_string().contains("/no/such/model/dir"), "{e}");
    let e = Checkpoint::read("/no/such/model.bin").unwrap_err();
    assert!(matches!(e, Llama2Error::Io { .. }));
    assert!(e.to_string().contains("/no/such/model.bin"), "{e}");
}

#[test]
fn truncated_checkpoint_reports_expected_and_actual_bytes() {
    let bytes = ckpt_bytes();
    for keep in [0usize, 10, 28, 1000, CKPT_BYTES - 1] {
        let e = Checkpoint::from_bytes(Path::new("cut.bin"), &bytes[..keep]).unwrap_err();
        match &e {
            Llama2Error::Truncated {
                expected, actual, ..
            } => {
                assert_eq!(*actual, keep as u128);
                let want = if keep < 28 { 28 } else { CKPT_BYTES as u128 };
                assert_eq!(*expected, want);
            }
            other => panic!("keep {keep}: {other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("cut.bin") && msg.contains(&keep.to_string()),
            "{msg}"
        );
    }
    let mut long = bytes.clone();
    long.extend([0u8; 8]);
    let e = Checkpoint::from_bytes(Path::new("long.bin"), &long).unwrap_err();
    assert!(
        matches!(e, Llama2Error::TrailingBytes { expected, actual, .. }
        if expected == CKPT_BYTES as u128 && actual == CKPT_BYTES as u128 + 8)
    );
}

#[test]
fn invalid_header_is_named() {
    let mut bytes = ckpt_bytes();
    bytes[12..16].copy_from_slice(&0i32.to_le_bytes()); // n_heads = 0
    let e = Checkpoint::from_bytes(Path::new("h.bin"), &bytes).unwrap_err();
    assert!(e.to_string().contains("n_heads = 0"), "{e}");
    let mut bytes = ckpt_bytes();
    bytes[16..20].copy_from_slice(&3i32.to_le_bytes()); // n_kv_heads = 3
    let e = Checkpoint::from_bytes(Path::new("h.bin"), &bytes).unwrap_err();
    assert!(e.to_string().contains("n_kv_heads = 3"), "{e}");
    let mut bytes = ckpt_bytes();
    bytes[0..4].copy_from_slice(&i32::MAX.to_le_bytes()); // huge dim
    assert!(Checkpoint::from_bytes(Path::new("h.bin"), &bytes).is_err());
}

#[test]
fn tokenizer_vocab_mismatch_names_both_sizes() {
    let tok = tok_bytes();
    let e = Tokenizer::from_bytes(Path::new("tok512.bin"), &tok, 1000).unwrap_err();
    assert!(matches!(
        e,
        Llama2Error::VocabMismatch {
            expected: 1000,
            actual: 512,
            ..
        }
    ));
    let msg = e.to_string();
    assert!(msg.contains("tok512.bin") && msg.contains("1000") && msg.contains("512"));
    let short = &tok[..tok_prefix_len(&tok, 300)];
    let e = Tokenizer::from_bytes(Path::new("t.bin"), short, 512).unwrap_err();
    assert!(matches!(
        e,
        Llama2Error::VocabMismatch {
            expected: 512,
            actual: 300,
            ..
        }
    ));
    // Cut inside an entry.
    let cut = &tok[..tok_prefix_len(&tok, 300) + 5];
    let e = Tokenizer::from_bytes(Path::new("t.bin"), cut, 512).unwrap_err();
    assert!(matches!(e, Llama2Error::BadTokenizer { .. }), "{e:?}");
    assert!(Tokenizer::from_bytes(Path::new("t.bin"), &[], 512).is_err());
}

/// A tokenizer header claiming `max_token_length = i32::MAX` is refused (it
/// would size a 4 GiB buffer), naming the file and the valid range.
#[test]
fn tokenizer_max_token_length_beyond_the_file_is_refused() {
    let mut tok = tok_bytes();
    tok[..4].copy_from_slice(&i32::MAX.to_le_bytes());
    let e = Tokenizer::from_bytes(Path::new("tok512.bin"), &tok, 512).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("tok512.bin") && msg.contains("max_token_length = 2147483647"),
        "{msg}"
    );
}

#[test]
fn prompt_longer_than_context_and_positions_past_it() {
    let (ckpt, tok) = ModelFiles::locate(Path::new(MODEL_DIR), None)
        .unwrap()
        .load()
        .unwrap();
    let device = Device::flex();
    let model = Llama2::new(&ckpt, &device);
    let long = "Lily went to the park. ".repeat(200);
    let e = encode_prompt(&model, &tok, &long).unwrap_err();
    match e {
        Llama2Error::PromptTooLong { tokens, seq_len } => {
            assert!(tokens > 512);
            assert_eq!(seq_len, 512);
        }
        other => panic!("{other:?}"),
    }
    let mut cache = model.new_cache();
    assert!(matches!(
        model.forward(1, 512, &mut cache),
        Err(Llama2Error::ContextFull { pos: 512, .. })
    ));
    assert!(matches!(
        model.forward(512, 0, &mut cache),
        Err(Llama2Error::TokenOutOfRange { token: 512, .. })
    ));

    // A cache made by a one-layer model of the same width.
    let mut header = Vec::new();
    for v in [64i32, 172, 1, 8, 4, 512, 512] {
        header.extend(v.to_le_bytes());
    }
    let cfg = sampler_examples::llama2::Config::from_header(
        Path::new("one_layer.bin"),
        header.as_slice().try_into().unwrap(),
    )
    .unwrap();
    let mut bytes = header;
    bytes.resize(cfg.file_bytes() as usize, 0);
    let small = Checkpoint::from_bytes(Path::new("one_layer.bin"), &bytes).unwrap();
    let mut other = Llama2::new(&small, &device).new_cache();
    assert!(matches!(
        model.forward(1, 0, &mut other),
        Err(Llama2Error::CacheMismatch)
    ));
}

// --- the `generate` command -------------------------------------------------

/// Run `generate` with `args`; returns (success, stdout, stderr).
fn generate(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(args)
        .output()
        .expect("generate runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "generate panicked: {stderr}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

fn assert_fails(args: &[&str], needles: &[&str]) {
    let (ok, _, err) = generate(args);
    assert!(!ok, "{args:?} should fail");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
}

#[test]
fn cli_zero_tokens() {
    assert_fails(&["--model", MODEL_DIR, "-n", "0"], &["-n 0", "at least 1"]);
}

#[test]
fn cli_unknown_or_missing_device_lists_choices() {
    assert_fails(&["--model", MODEL_DIR, "--device", "tpu"], &["tpu", "flex"]);
    // What the binary was built with (the workspace's test build unifies
    // sampler-backend's features across crates).
    let compiled = sampler_backend::compiled_devices();
    if !compiled.contains(&"cuda") {
        assert_fails(
            &["--model", MODEL_DIR, "--device", "cuda:1"],
            &["cuda", "cargo feature", "flex"],
        );
    }
    if !compiled.contains(&"vulkan") {
        assert_fails(
            &["--model", MODEL_DIR, "--device", "vulkan"],
            &["vulkan", "cargo feature"],
        );
    }
}

#[test]
fn cli_missing_model() {
    assert_fails(&["--model", "/no/such/dir", "-n", "4"], &["/no/such/dir"]);
}

#[test]
fn cli_truncated_checkpoint() {
    let ckpt = ckpt_bytes();
    let d = model_dir_with("cli_truncated", &ckpt[..500_000], &tok_bytes());
    let ds = d.to_str().unwrap();
    assert_fails(
        &["--model", ds, "-n", "4"],
        &["model.bin", "truncated", "1056540", "500000"],
    );
}

#[test]
fn cli_tokenizer_vocab_mismatch() {
    let tok = tok_bytes();
    let d = model_dir_with(
        "cli_vocab",
        &ckpt_bytes(),
        &tok[..tok_prefix_len(&tok, 256)],
    );
    let ds = d.to_str().unwrap();
    assert_fails(&["--model", ds, "-n", "4"], &["tok512.bin", "256", "512"]);
}

#[test]
fn cli_prompt_longer_than_context() {
    let long = "Lily went to the park. ".repeat(200);
    assert_fails(
        &["--model", MODEL_DIR, "-n", "4", "--prompt", &long],
        &["prompt", "512"],
    );
}

#[test]
fn cli_bad_chain_and_flags() {
    assert_fails(
        &["--model", MODEL_DIR, "--samplers", "top_k;nuclues;dist"],
        &["nuclues"],
    );
    assert_fails(
        &[
            "--model",
            MODEL_DIR,
            "--samplers",
            "top_p;dist",
            "--top-p",
            "1.5",
        ],
        &["1.5", "[0, 1]"],
    );
    assert_fails(&["--model", MODEL_DIR, "--offload", "some"], &["--offload"]);
    assert_fails(
        &["--model", MODEL_DIR, "--config", "/no/such/chain.toml"],
        &["/no/such/chain.toml"],
    );
}

/// Negative and out-of-f32 numbers reach the range check (never clap's
/// "unexpected argument '-1'", never `inf`), and `--param` sets any stage
/// parameter by the registry's names.
#[test]
fn cli_numbers_and_params_by_name() {
    assert_fails(&["--temp", "-1", "-n", "2"], &["`stage[3].t` = -1", ">= 0"]);
    assert_fails(
        &["--temp", "1e39", "-n", "2"],
        &["`1e39` is beyond the f32 range"],
    );
    assert_fails(
        &["--param", "epsilon.eps=1", "-n", "2"],
        &["`epsilon` has no parameter `eps` (it has: epsilon, min_keep)"],
    );
    assert_fails(
        &[
            "--samplers",
            "eta;dist",
            "--param",
            "eta.epsilon=2",
            "-n",
            "2",
        ],
        &["`stage[0].epsilon` = 2", "[0, 1)"],
    );
    let (ok, out, err) = generate(&[
        "--samplers",
        "epsilon;dist",
        "--param",
        "epsilon.epsilon=0.02",
        "--param",
        "epsilon.min_keep=2",
        "-n",
        "4",
        "--seed",
        "3",
        "--json",
        "--no-progress",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("\"tokens\""), "{out}");
}

/// A loader note (stages after the selecting stage) is printed once, not
/// once per validation, and the chain still samples.
#[test]
fn cli_prints_each_config_note_once() {
    let (ok, _, err) = generate(&["--samplers", "top_k;dist;temp", "-n", "2", "--no-progress"]);
    assert!(ok, "{err}");
    assert_eq!(
        err.matches("`temperature` after the last selecting stage: ignored")
            .count(),
        1,
        "{err}"
    );
}

/// `--param` numbers beyond f32 are refused as written, like the flags.
#[test]
fn cli_param_beyond_f32_is_refused_as_written() {
    assert_fails(
        &[
            "--samplers",
            "temperature;dist",
            "--param",
            "temperature.t=1e39",
            "-n",
            "2",
        ],
        &["`1e39` is beyond the f32 range"],
    );
}

/// Beam search settings out of range and chains it cannot honour: each a
/// clear error naming the setting or the stage.
#[test]
fn cli_beam_search_bad_settings() {
    let base = ["--model", MODEL_DIR, "-n", "4", "--no-progress"];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        a
    };
    assert_fails(&with(&["--num-beams", "0"]), &["num_beams = 0", "1 to"]);
    assert_fails(
        &with(&["--num-beams", "300"]),
        &["num_beams = 300", "1 to 256"],
    );
    assert_fails(
        &with(&["--num-beams", "2", "--num-return-sequences", "3"]),
        &["num_return_sequences = 3", "num_beams (2)"],
    );
    assert_fails(
        &with(&["--num-beams", "2", "--early-stopping", "sometimes"]),
        &["--early-stopping sometimes", "true, false or never"],
    );
    assert_fails(
        &with(&["--num-beams", "2", "--samplers", "penalties;temperature"]),
        &["`temperature`", "cannot honour"],
    );
    assert_fails(
        &with(&["--num-beams", "2", "--length-penalty", "nan"]),
        &["length_penalty"],
    );
    // A processors-only chain runs.
    let (ok, out, err) = generate(&with(&[
        "--num-beams",
        "2",
        "--num-return-sequences",
        "2",
        "--samplers",
        "penalties",
    ]));
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with('[')).count(),
        2,
        "{out}"
    );
}
