//! The llama2.c loader, tokenizer and forward pass against stories260K's
//! verification data (`models/stories260K/README.md`).

use std::path::{Path, PathBuf};

use burn_tensor::{Device, Tensor};
use sampler_examples::llama2::{BOS, Checkpoint, Llama2, ModelFiles, Tokenizer};

const MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K");

fn model_dir() -> PathBuf {
    PathBuf::from(MODEL_DIR)
}

fn load() -> (Checkpoint, Tokenizer) {
    ModelFiles::locate(&model_dir(), None)
        .and_then(|f| f.load())
        .expect("stories260K loads")
}

fn greedy40() -> (Vec<u32>, String) {
    let text = std::fs::read_to_string(model_dir().join("greedy40.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = v["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    (ids, v["greedy_text"].as_str().unwrap().to_string())
}

fn row(logits: Tensor<2>) -> Vec<f32> {
    logits.into_data().iter::<f32>().collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding from BOS with a host argmax; returns ids and every step's logits.
fn greedy(device: &Device, steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (ckpt, _) = load();
    let model = Llama2::new(&ckpt, device);
    let mut cache = model.new_cache();
    let mut token = BOS;
    let (mut ids, mut all) = (Vec::new(), Vec::new());
    for pos in 0..steps {
        let logits = row(model.forward(token, pos, &mut cache).unwrap());
        token = argmax(&logits);
        ids.push(token);
        all.push(logits);
    }
    (ids, all)
}

/// The devices to test: every backend compiled in, or the comma-separated
/// list in `SAMPLER_TEST_DEVICES`; one that cannot start on this machine is
/// skipped with the reason printed.
fn devices() -> Vec<(String, Device)> {
    let names: Vec<String> = match std::env::var("SAMPLER_TEST_DEVICES") {
        Ok(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        Err(_) => sampler_backend::compiled_devices()
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    names
        .into_iter()
        .filter_map(|n| match sampler_backend::probe_device(&n) {
            Ok(d) => Some((n, d)),
            Err(e) => {
                println!("SKIP {n}: {e}");
                None
            }
        })
        .collect()
}

#[test]
fn header_matches_readme() {
    let (ckpt, tok) = load();
    let c = ckpt.config;
    assert_eq!(
        (c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads),
        (64, 172, 5, 8, 4)
    );
    assert_eq!((c.vocab_size, c.seq_len), (512, 512));
    assert!(c.shared_classifier);
    assert_eq!(ckpt.n_params(), 260_032);
    assert_eq!(tok.vocab_size(), 512);
    assert_eq!(tok.max_token_length(), 7);
}

/// Devices on which a step of the model is cheap: every device but the
/// cubecl ones, where a step of stories260K costs about 2 s on a software
/// Vulkan driver (those get the three steps of the next test).
fn is_gpu(name: &str) -> bool {
    ["wgpu", "vulkan", "cuda"].contains(&name)
}

#[test]
fn greedy40_ids_and_text_on_every_cpu_device() {
    let (want_ids, want_text) = greedy40();
    let (_, tok) = load();
    for (name, device) in devices().into_iter().filter(|(n, _)| !is_gpu(n)) {
        let (ids, _) = greedy(&device, 40);
        assert_eq!(ids, want_ids, "greedy ids on {name}");
        let mut seq = vec![BOS];
        seq.extend(&ids);
        assert_eq!(tok.decode(&seq), want_text, "greedy text on {name}");
    }
}

/// Every device, GPU ones included: the first three steps' logits within
/// 1e-4 of the reference and their greedy ids the reference's.
#[test]
fn first_three_logits_within_1e4() {
    let bytes = std::fs::read(model_dir().join("greedy_logits_first3.f32")).unwrap();
    let want: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), 3 * 512);
    let (want_ids, _) = greedy40();
    for (name, device) in devices() {
        let (ids, logits) = greedy(&device, 3);
        assert_eq!(ids, want_ids[..3], "greedy ids on {name}");
        for (step, got) in logits.iter().enumerate() {
            let exp = &want[step * 512..(step + 1) * 512];
            let worst = got
                .iter()
                .zip(exp)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-4, "{name} step {step}: max |diff| = {worst}");
        }
    }
}

#[test]
fn tokenizer_round_trips_english() {
    let (_, tok) = load();
    let sentences = [
        "Once upon a time, there was a little girl named Lily.",
        "She loved to play outside in the park.",
        "The quick brown fox jumps over the lazy dog.",
        "Tom said, \"I'm sorry, mom. I didn't know what to do.\"",
        "It was 3 o'clock; the sun was high!",
        "Hello world",
        "  two leading spaces and trailing ones  ",
        "A line\nand another line.",
        "Café, naïve, 東京 — non-ASCII falls back to bytes.",
        "",
    ];
    for s in sentences {
        let ids = tok.encode(s, true, false);
        assert_eq!(ids[0], BOS);
        assert_eq!(tok.decode(&ids), s, "round trip of {s:?} via {ids:?}");
    }
}

#[test]
fn encode_uses_merges_and_dummy_prefix() {
    let (_, tok) = load();
    let (ids, text) = greedy40();
    // The greedy text, re-encoded, gives back the model's own tokens up to the
    // last (partial) word.
    let enc = tok.encode(&text, true, false);
    assert_eq!(enc[0], BOS);
    assert_eq!(&enc[1..], &ids[..], "encode({text:?})");
    assert_eq!(tok.encode("", false, false), Vec::<u32>::new());
}

#[test]
fn locate_accepts_a_checkpoint_file() {
    let f = ModelFiles::locate(&model_dir().join("stories260K.bin"), None).unwrap();
    assert!(f.tokenizer.ends_with("tok512.bin"));
    let f = ModelFiles::locate(Path::new(MODEL_DIR), None).unwrap();
    assert!(f.checkpoint.ends_with("stories260K.bin"));
}
