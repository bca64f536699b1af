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
/// cubecl ones, where a fresh process compiles every kernel of the model
/// (about 20 s on a software Vulkan driver; those get the three steps of
/// the next test).
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

/// Beam search (`beam_search`): every returned sequence's score is the sum
/// of its tokens' logprobs recomputed by a plain forward pass (one token at
/// a time, the chain's processors on a CPU chain, a log-softmax), within
/// 1e-4, and its length-penalised score follows; the host path (offload
/// off) and the device path (the processors as device recipes) return the
/// same sequences and scores. (The device half of it, the processors and
/// the top-2W selection with its log-sum-exp, is checked on every device,
/// wgpu included, by `serving_batch`'s top_logprobs test on synthetic rows:
/// a batched model step on a software Vulkan driver costs minutes of shader
/// compilation for its general matmuls.)
#[test]
fn beam_search_scores_are_the_sequences_logprobs() {
    use sampler_core::{ChainSpec, HistoryScope, OffloadPolicy, StageSpec};
    use sampler_cpu::beam::{BeamParams, EarlyStopping, top_logprobs};
    use sampler_examples::llama2::generate::beam_search;
    let (ckpt, tok) = load();
    let spec = ChainSpec::new(
        vec![
            StageSpec::Penalties {
                last_n: 16,
                repeat: 1.3,
                frequency: 0.1,
                presence: 0.0,
                scope: HistoryScope::PromptAndOutput,
            },
            StageSpec::LogitBias {
                bias: vec![(13, -2.0), (400, 1.5)],
            },
        ],
        Some(1),
    );
    let prompt = tok.encode("Once upon a time", true, false);
    let params = |w: usize, r: usize, max: usize| BeamParams {
        num_beams: w,
        num_return_sequences: r,
        length_penalty: 1.0,
        early_stopping: EarlyStopping::False,
        eos: Vec::new(),
        max_new_tokens: max,
    };
    let search = |device: &Device, policy: OffloadPolicy, p: BeamParams| {
        let model = Llama2::new(&ckpt, device);
        let mut batch = sampler_backend::SamplingBatch::new(512, device, policy).unwrap();
        let w = p.num_beams;
        let out = beam_search(&model, &tok, &mut batch, &spec, &prompt, p).unwrap();
        assert!(batch.is_empty(), "every beam's request removed");
        if policy == OffloadPolicy::Device {
            // The processors and the top-2W selection on the device: only
            // the 2W (id, logit) pairs and the log-sum-exp come back.
            assert_eq!(out.bytes_read, out.rows * (8 * 2 * w + 4));
        }
        out.hypotheses
    };
    let flex = sampler_backend::parse_device("flex").unwrap();
    let host = search(&flex, OffloadPolicy::Off, params(4, 3, 24));
    assert_eq!(host.len(), 3);
    // Recompute each sequence's logprobs.
    let model = Llama2::new(&ckpt, &flex);
    for h in &host {
        let mut cache = model.new_cache();
        let mut chain = sampler_cpu::build_chain(&spec).unwrap();
        chain.accept_prompt(&prompt[1..]);
        for (pos, &t) in prompt[..prompt.len() - 1].iter().enumerate() {
            drop(model.forward(t, pos, &mut cache).unwrap());
        }
        let mut token = prompt[prompt.len() - 1];
        let mut sum = 0.0f64;
        for (i, &next) in h.tokens.iter().enumerate() {
            let logits = row(model
                .forward(token, prompt.len() - 1 + i, &mut cache)
                .unwrap());
            let c = chain.apply_logits(&logits).unwrap();
            let lp = top_logprobs(c.logits(), Some(c.ids()), 512);
            let l = lp
                .iter()
                .find(|e| e.0 == next)
                .expect("the token survives")
                .1;
            sum += f64::from(l);
            chain.commit(next);
            token = next;
        }
        assert!(
            (sum - h.sum_logprobs).abs() < 1e-4,
            "{sum} vs {}",
            h.sum_logprobs
        );
        let len = h.tokens.len() as f64;
        assert!((h.score - h.sum_logprobs / len).abs() < 1e-9);
    }
    assert!(host.windows(2).all(|p| p[0].score >= p[1].score));
    let device = search(&flex, OffloadPolicy::Device, params(4, 3, 24));
    for (a, b) in host.iter().zip(&device) {
        assert_eq!(a.tokens, b.tokens, "host vs device path");
        assert!((a.score - b.score).abs() < 1e-4);
    }
}
