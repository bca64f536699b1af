//! The `generate` command end to end on stories260K: greedy reproduction,
//! seeded sampling identical across runs, devices and offload splits, and the
//! readback that `--stats` reports.

use std::process::Command;

use serde_json::Value;

const MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K");

/// The CPU devices every case runs on: the compiled-in `flex` / `ndarray`,
/// or the comma-separated list in `SAMPLER_TEST_DEVICES` (CPU names only).
/// GPU devices get one short run each ([`gpu_devices_match_flex_in_a_short_run`]):
/// every fresh cubecl process compiles its kernels, slow on software Vulkan.
fn devices() -> Vec<String> {
    listed()
        .into_iter()
        .filter(|d| ["flex", "ndarray", "cpu"].contains(&d.as_str()))
        .collect()
}

/// The compiled-in devices, or `SAMPLER_TEST_DEVICES`.
fn listed() -> Vec<String> {
    match std::env::var("SAMPLER_TEST_DEVICES") {
        Ok(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        Err(_) => sampler_backend::compiled_devices()
            .iter()
            .map(|s| s.to_string())
            .collect(),
    }
}

/// The cubecl devices listed that start on this machine (the others are
/// skipped with the reason printed).
fn gpu_devices() -> Vec<String> {
    listed()
        .into_iter()
        .filter(|d| ["wgpu", "vulkan", "cuda"].contains(&d.as_str()))
        .filter(|d| match sampler_backend::probe_device(d) {
            Ok(_) => true,
            Err(e) => {
                println!("SKIP {d}: {e}");
                false
            }
        })
        .collect()
}

/// A chain with every kind of device stage: history penalties, a top_k cut,
/// temperature, a top_p cut and the draw.
const PENALTIES_CHAIN: &[&str] = &[
    "--samplers",
    "penalties;top_k;temperature;top_p;dist",
    "--repeat-penalty",
    "1.2",
    "--top-k",
    "50",
    "--temp",
    "1.1",
    "--top-p",
    "0.9",
];

/// Run `generate --json` with `args`; returns the parsed object and stderr.
fn run_json(args: &[&str]) -> (Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(["--model", MODEL_DIR, "--json", "--no-progress"])
        .args(args)
        .output()
        .expect("generate runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "generate {args:?} failed:\n{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    (v, stderr)
}

fn ids(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn greedy40() -> (Vec<u64>, String) {
    let text = std::fs::read_to_string(format!("{MODEL_DIR}/greedy40.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let ids = v["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    (ids, v["greedy_text"].as_str().unwrap().to_string())
}

/// `--speculative ngram`: a greedy chain emits plain greedy decoding's
/// tokens (the reference's 40 from BOS, and 150 after a prompt that repeats
/// itself, where drafts are accepted); the stats count passes, drafts and
/// acceptances; a seeded sampling chain replays its own tokens; bad drafter
/// settings are refused with the setting named.
#[test]
fn speculative_greedy_is_plain_greedy() {
    let (want_ids, _) = greedy40();
    let (v, _) = run_json(&["--samplers", "greedy", "-n", "40", "--speculative", "ngram"]);
    assert_eq!(ids(&v), want_ids);
    let prompt = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a";
    let plain = run_json(&["--samplers", "greedy", "-n", "150", "--prompt", prompt]).0;
    let (spec, _) = run_json(&[
        "--samplers",
        "greedy",
        "-n",
        "150",
        "--prompt",
        prompt,
        "--speculative",
        "ngram",
        "--draft-k",
        "5",
    ]);
    assert_eq!(ids(&spec), ids(&plain));
    let st = &spec["stats"]["speculative"];
    let (passes, proposed, accepted) = (
        st["passes"].as_u64().unwrap(),
        st["proposed"].as_u64().unwrap(),
        st["accepted"].as_u64().unwrap(),
    );
    assert!(accepted > 0 && accepted <= proposed, "{st}");
    assert_eq!(passes + accepted, ids(&spec).len() as u64, "{st}");
    let sampled = |extra: &[&str]| {
        let mut args = vec![
            "--samplers",
            "top_k;temperature;dist",
            "--top-k",
            "20",
            "--temp",
            "0.9",
            "--seed",
            "3",
            "-n",
            "60",
            "--prompt",
            prompt,
        ];
        args.extend_from_slice(extra);
        run_json(&args).0
    };
    // Drafts without a distribution: plain decoding's tokens with the same
    // seed, verified on the host or (the whole chain offloaded) on the
    // device, where only the sampled ids come back.
    let plain_sampled = ids(&sampled(&[]));
    let spec_host = sampled(&["--speculative", "ngram"]);
    assert_eq!(ids(&spec_host), plain_sampled);
    let spec_dev = sampled(&["--speculative", "ngram", "--offload", "device"]);
    assert_eq!(ids(&spec_dev), plain_sampled);
    let bytes = |v: &serde_json::Value| v["stats"]["bytes_read"].as_u64().unwrap();
    assert!(
        bytes(&spec_dev) * 100 < bytes(&spec_host),
        "device {} host {}",
        bytes(&spec_dev),
        bytes(&spec_host)
    );
    // A config's `[speculative]` table turns it on too.
    let dir = std::env::temp_dir().join(format!("spec-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("chain.toml");
    std::fs::write(
        &cfg,
        "samplers = \"greedy\"\n[greedy]\n[speculative]\nmethod = \"ngram\"\nnum_speculative_tokens = 5\n",
    )
    .unwrap();
    let (from_cfg, _) = run_json(&[
        "--config",
        cfg.to_str().unwrap(),
        "-n",
        "150",
        "--prompt",
        prompt,
    ]);
    assert_eq!(ids(&from_cfg), ids(&plain));
    for key in ["passes", "proposed", "accepted"] {
        assert_eq!(
            from_cfg["stats"]["speculative"][key],
            spec["stats"]["speculative"][key]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args([
            "--model",
            MODEL_DIR,
            "-n",
            "4",
            "--speculative",
            "ngram",
            "--draft-k",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("draft k (0)"));
}

#[test]
fn greedy40_from_bos_on_every_device_and_split() {
    let (want_ids, want_text) = greedy40();
    for (d, device) in devices().into_iter().enumerate() {
        // The host-sampled path of the other devices is in the next tests
        // (every fresh cubecl process compiles its kernels, slow on software
        // Vulkan).
        let offloads: &[&str] = if d == 0 { &["auto", "off"] } else { &["auto"] };
        for &offload in offloads {
            let (v, _) = run_json(&[
                "--samplers",
                "greedy",
                "-n",
                "40",
                "--device",
                &device,
                "--offload",
                offload,
            ]);
            assert_eq!(ids(&v), want_ids, "{device} offload {offload}");
            assert_eq!(v["text"], want_text.as_str(), "{device} offload {offload}");
            assert_eq!(v["stop_reason"], "length");
        }
    }
    // temperature 0 is greedy too.
    let (v, _) = run_json(&[
        "--samplers",
        "top_k;temperature;dist",
        "--temp",
        "0",
        "-n",
        "40",
    ]);
    assert_eq!(ids(&v), want_ids);
}

#[test]
fn seeded_sampling_is_identical_across_runs_devices_and_splits() {
    let chains: [&[&str]; 2] = [
        &["--samplers", "top_k;top_p;min_p;temperature;dist"],
        PENALTIES_CHAIN,
    ];
    for (c, chain) in chains.into_iter().enumerate() {
        let mut reference: Option<Vec<u64>> = None;
        for (d, device) in devices().into_iter().enumerate() {
            // Every split on the first device; a few on the others (a cubecl
            // device compiles its kernels in every fresh process, which is slow on
            // software Vulkan).
            let offloads: &[&str] = match (d, c) {
                (0, _) => &["auto", "off", "1", "2", "3", "4", "auto"],
                (_, 0) => &["auto", "off", "2"],
                _ => &["auto", "2"],
            };
            for &offload in offloads {
                let mut args = chain.to_vec();
                args.extend([
                    "--seed",
                    "1234",
                    "-n",
                    "64",
                    "--prompt",
                    "Lily and Tom",
                    "--device",
                    &device,
                    "--offload",
                    offload,
                ]);
                let (v, _) = run_json(&args);
                let got = ids(&v);
                assert!(!got.is_empty());
                match &reference {
                    None => reference = Some(got),
                    Some(r) => assert_eq!(&got, r, "{chain:?} on {device}, offload {offload}"),
                }
            }
        }
    }
    // A different seed gives a different text (the model is not collapsed to greedy).
    let (a, _) = run_json(&["--seed", "1", "-n", "64", "--temp", "1.0"]);
    let (b, _) = run_json(&["--seed", "2", "-n", "64", "--temp", "1.0"]);
    assert_ne!(ids(&a), ids(&b));
}

#[test]
fn stats_show_token_ids_only_when_fully_offloaded() {
    for (d, device) in devices().into_iter().enumerate() {
        // The text report is the same code on every device: checked on the
        // first one.
        if d == 0 {
            let out = Command::new(env!("CARGO_BIN_EXE_generate"))
                .args([
                    "--model",
                    MODEL_DIR,
                    "--no-progress",
                    "--stats",
                    "--seed",
                    "7",
                ])
                .args(["-n", "16", "--device", &device, "--offload", "device"])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stderr}");
            assert!(stderr.contains("host stages:   (none)"), "{stderr}");
            assert!(stderr.contains("readback:      token ids"), "{stderr}");
            assert!(stderr.contains("= 4 bytes/row/step"), "{stderr}");
            assert!(stderr.contains("tokens/s"), "{stderr}");
        }

        let (v, _) = run_json(&[
            "--seed",
            "7",
            "-n",
            "16",
            "--device",
            &device,
            "--offload",
            "device",
        ]);
        assert_eq!(v["plan"]["fully_offloaded"], true);
        assert_eq!(v["plan"]["bytes_per_row"], 4);
        let steps = v["stats"]["steps"].as_u64().unwrap();
        assert_eq!(v["stats"]["bytes_read"].as_u64().unwrap(), 4 * steps);
        assert_eq!(v["stats"]["bytes_read_per_step"].as_f64().unwrap(), 4.0);
        // Kernels are counted on cubecl devices only.
        assert!(v["stats"]["kernels_per_step"].is_null(), "{device}");

        // Host only: the full row of logits crosses every step.
        let (v, _) = run_json(&[
            "--seed",
            "7",
            "-n",
            "16",
            "--device",
            &device,
            "--offload",
            "off",
        ]);
        assert_eq!(v["plan"]["fully_offloaded"], false);
        assert_eq!(v["stats"]["bytes_read_per_step"].as_f64().unwrap(), 2048.0);
    }
}

#[test]
fn text_output_streams_prompt_and_continuation() {
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(["--model", MODEL_DIR, "--samplers", "greedy", "-n", "40"])
        .args(["--prompt", "Once upon a time"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("Once upon a time, there was"), "{text}");
    assert!(text.ends_with('\n'));
}

/// `--stop`: generation ends where the text first contains a stop string
/// (here one spanning two tokens of the greedy text); the JSON and the
/// streamed text end before it (`--include-stop-str`: after it), the
/// tokens up to the one that completed it; a bad stop list is refused.
#[test]
fn stop_strings_cut_the_text() {
    let (full, _) = run_json(&[
        "--samplers",
        "greedy",
        "-n",
        "40",
        "--prompt",
        "Once upon a time",
    ]);
    let text = full["generated_text"].as_str().unwrap().to_string();
    // ", there was" spans several tokens; "e w" spans "there" and " was".
    let stop = "e w";
    let cut = text.find(stop).expect("the stop occurs in the greedy text");
    let (v, _) = run_json(&[
        "--samplers",
        "greedy",
        "-n",
        "40",
        "--prompt",
        "Once upon a time",
        "--stop",
        stop,
        "--stop",
        "zzz",
    ]);
    assert_eq!(v["generated_text"], text[..cut], "{v}");
    assert_eq!(v["stop_reason"], "stop");
    assert_eq!(v["stop_string"], stop);
    let n = ids(&v).len();
    assert!(n < 40 && ids(&full)[..n] == ids(&v)[..], "{v}");
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(["--model", MODEL_DIR, "--samplers", "greedy", "-n", "40"])
        .args([
            "--prompt",
            "Once upon a time",
            "--stop",
            stop,
            "--include-stop-str",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        printed.trim_end(),
        format!("Once upon a time{}", &text[..cut + stop.len()])
    );
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(["--model", MODEL_DIR, "--stop", ""])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--stop: item 0 is an empty string"), "{err}");
}

#[test]
fn config_file_and_flags() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("generate_cli_config");
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("chain.toml");
    std::fs::write(
        &toml,
        "samplers = \"top_k;temperature;dist\"\nseed = 99\n\n[top_k]\nk = 20\n\n[temperature]\nt = 0.9\n",
    )
    .unwrap();
    let t = toml.to_str().unwrap();
    let (a, _) = run_json(&["--config", t, "-n", "32"]);
    assert_eq!(a["chain"], "top_k;temperature;dist");
    assert_eq!(a["seed"], 99);
    // The same chain given on the command line samples the same tokens.
    let (b, _) = run_json(&[
        "--samplers",
        "top_k;temperature;dist",
        "--top-k",
        "20",
        "--temp",
        "0.9",
        "--seed",
        "99",
        "-n",
        "32",
    ]);
    assert_eq!(ids(&a), ids(&b));
    // A flag for a stage the chain lacks is a warning, not an error.
    let (_, stderr) = run_json(&["--config", t, "-n", "4", "--min-p", "0.1"]);
    assert!(stderr.contains("--min-p has no effect"), "{stderr}");
}

#[test]
fn n_is_clamped_to_the_context() {
    let (v, stderr) = run_json(&["--samplers", "greedy", "-n", "5000", "--prompt", "Lily"]);
    assert!(stderr.contains("does not fit the context"), "{stderr}");
    let total = v["prompt_tokens"].as_array().unwrap().len() + ids(&v).len();
    assert!(total <= 513, "{total}");
}

/// A run without `--seed` reports the seed it drew, and that seed replays it.
#[test]
fn json_reports_the_seed_actually_used() {
    let (a, _) = run_json(&["-n", "24", "--temp", "1.0"]);
    let seed = a["seed"]
        .as_u64()
        .expect("a drawn seed is reported, not null");
    let (b, _) = run_json(&["-n", "24", "--temp", "1.0", "--seed", &seed.to_string()]);
    assert_eq!(b["seed"].as_u64(), Some(seed));
    assert_eq!(ids(&a), ids(&b), "the reported seed replays the run");
    // The plan names fields as `plan --json` does.
    assert_eq!(a["plan"]["offload"], "auto");
    assert!(a["plan"]["skipped_stages"].is_array());
    assert!(a["plan"]["readback"].is_string());
}

/// `--logprobs N`: per step the sampled token's logprob and the N best, the
/// same on every device and offload split; `--min-tokens` keeps the end of
/// text away.
#[test]
fn logprobs_on_every_device_and_min_tokens() {
    let mut first: Option<Value> = None;
    for device in devices() {
        for offload in ["off", "device"] {
            let (v, _) = run_json(&[
                "--prompt",
                "Once upon a time",
                "-n",
                "12",
                "--seed",
                "7",
                "--logprobs",
                "3",
                "--logprob-token-ids",
                "2,5",
                "--device",
                &device,
                "--offload",
                offload,
            ]);
            let tokens = ids(&v);
            let lps = v["logprobs"].as_array().expect("logprobs");
            assert_eq!(lps.len(), tokens.len());
            for (lp, &t) in lps.iter().zip(&tokens) {
                assert_eq!(lp["token"].as_u64(), Some(t));
                let x = lp["logprob"]
                    .as_f64()
                    .expect("finite for the sampled token");
                assert!(x <= 0.0, "{lp}");
                let top = lp["top"].as_array().unwrap();
                assert_eq!(top.len(), 3, "{lp}");
                let mass: f64 = top
                    .iter()
                    .map(|e| e["logprob"].as_f64().unwrap().exp())
                    .sum();
                assert!(mass <= 1.0 + 1e-5);
                assert_eq!(lp["requested"].as_array().unwrap().len(), 2);
            }
            match &first {
                None => first = Some(v),
                Some(f) => {
                    assert_eq!(ids(f), tokens, "{device} {offload}");
                    for (a, b) in f["logprobs"].as_array().unwrap().iter().zip(lps) {
                        let (x, y) = (
                            a["logprob"].as_f64().unwrap(),
                            b["logprob"].as_f64().unwrap(),
                        );
                        assert!((x - y).abs() < 1e-5, "{device} {offload}: {a} vs {b}");
                    }
                }
            }
        }
    }
    // The plain output lists them after the text.
    let out = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args([
            "--model",
            MODEL_DIR,
            "--no-progress",
            "-n",
            "4",
            "--seed",
            "1",
        ])
        .args(["--logprobs", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("logprobs (step: token logprob"), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("   ")).count(),
        4,
        "{stdout}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(["--model", MODEL_DIR, "--logprobs", "21"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("21"));

    // Seed 8 reaches the end of text at token 225; with --min-tokens it
    // cannot before that many tokens.
    let args = ["--seed", "8", "-n", "250", "--prompt", "The end."];
    let (free, _) = run_json(&args);
    assert_eq!(free["stop_reason"], "end_of_text", "{free}");
    let free_len = ids(&free).len();
    let hold = (free_len + 5).to_string();
    let mut held_args = args.to_vec();
    held_args.extend(["--min-tokens", hold.as_str()]);
    let (held, _) = run_json(&held_args);
    let held_ids = ids(&held);
    assert!(held_ids.len() >= free_len + 5, "{held}");
    assert!(
        held_ids[..free_len + 5].iter().all(|&t| t != 1 && t != 2),
        "no BOS/EOS in the first {} tokens: {held_ids:?}",
        free_len + 5
    );
}

/// Each GPU device, in two short processes: greedy with logprobs and a
/// seeded penalties -> top_k -> temperature -> top_p -> dist chain, both
/// fully offloaded, give flex's tokens and logprobs, and the stats count
/// the model's and the sampling kernels of a warm step.
#[test]
fn gpu_devices_match_flex_in_a_short_run() {
    // Three tokens each: every fresh process compiles the model's and the
    // sampler's kernels again, which a software Vulkan driver does slowly
    // (this file's tests: 38 s in a CI run from nothing).
    let greedy: &[&str] = &[
        "--samplers",
        "greedy",
        "-n",
        "3",
        "--logprobs",
        "3",
        "--logprob-token-ids",
        "2,5",
    ];
    let seeded = &[PENALTIES_CHAIN, &["--seed", "1234", "-n", "3"]].concat();
    let on = |device: &str, args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--device", device, "--offload", "device"]);
        run_json(&a).0
    };
    let (want_greedy, want_seeded) = (on("flex", greedy), on("flex", seeded));
    let (greedy40_ids, _) = greedy40();
    assert_eq!(ids(&want_greedy), greedy40_ids[..3]);
    for device in gpu_devices() {
        let v = on(&device, greedy);
        assert_eq!(ids(&v), ids(&want_greedy), "{device}");
        let (a, b) = (&want_greedy["logprobs"], &v["logprobs"]);
        for (x, y) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
            let (x, y) = (
                x["logprob"].as_f64().unwrap(),
                y["logprob"].as_f64().unwrap(),
            );
            assert!((x - y).abs() < 1e-5, "{device}: {a} vs {b}");
        }
        assert_eq!(v["plan"]["fully_offloaded"], true);
        let kernels = &v["stats"]["kernels_per_step"];
        for part in ["model", "sampling"] {
            let n = kernels[part].as_u64().unwrap_or(0);
            assert!(n > 0, "{device}: {part} kernels {kernels}");
        }
        // The sampling kernels declare what they read: a fully offloaded
        // step reads its logits at least once.
        let undeclared = kernels["sampling_undeclared"].as_u64().unwrap();
        let reads = kernels["sampling_reads_of_logits"].as_f64().unwrap();
        assert!(undeclared > 0 || reads >= 1.0, "{device}: {kernels}");

        let v = on(&device, seeded);
        assert_eq!(ids(&v), ids(&want_seeded), "{device}");
        assert_eq!(v["stats"]["bytes_read_per_step"].as_f64().unwrap(), 4.0);
    }
}
