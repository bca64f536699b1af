//! The custom-stage example (`sampler_examples::ban_words`) inside a
//! serving batch with the stories260K model: the banned token sequences
//! never appear, the built-in stages before it still run on the device, and
//! host and device give the same tokens.

use std::path::PathBuf;

use sampler_backend::{RequestId, SamplingBatch};
use sampler_core::{Chain, HostReason, OffloadPolicy, Sampler, StageSpec, TokenId};
use sampler_examples::ban_words::BanWords;
use sampler_examples::llama2::generate::{encode_prompt, generate};
use sampler_examples::llama2::{Llama2, ModelFiles, Tokenizer};

fn model() -> (Llama2, Tokenizer) {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/stories260K"
    ));
    let (ckpt, tok) = ModelFiles::locate(&dir, None)
        .and_then(|f| f.load())
        .expect("stories260K loads");
    let device = sampler_backend::parse_device("flex").unwrap();
    (Llama2::new(&ckpt, &device), tok)
}

fn run(
    model: &Llama2,
    tok: &Tokenizer,
    policy: OffloadPolicy,
    ban: Option<BanWords>,
    seed: u64,
) -> (Vec<TokenId>, Vec<TokenId>, SamplingBatch, RequestId) {
    let device = model.device().clone();
    let mut batch = SamplingBatch::new(model.config().vocab_size, &device, policy).unwrap();
    let mut stages: Vec<Box<dyn Sampler>> =
        vec![sampler_cpu::build_stage(&StageSpec::TopK { k: 20 }).unwrap()];
    if let Some(b) = ban {
        stages.push(Box::new(b));
    }
    stages.push(
        sampler_cpu::build_stage(&StageSpec::Temperature {
            t: 0.9,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        })
        .unwrap(),
    );
    stages.push(sampler_cpu::build_stage(&StageSpec::Dist).unwrap());
    let id = batch
        .insert_chain(Chain::new(stages, Some(seed)), None, &[])
        .unwrap();
    let prompt = encode_prompt(model, tok, "Once upon a time").unwrap();
    let out = generate(model, tok, &mut batch, id, &prompt, 60, |_, _| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    (prompt, out.tokens, batch, id)
}

fn contains(haystack: &[TokenId], needle: &[TokenId]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn banned_sequences_never_appear_and_devices_agree() {
    let (model, tok) = model();
    let (prompt, free, _, _) = run(&model, &tok, OffloadPolicy::Off, None, 5);
    // Ban two-token sequences the unconstrained run produced, and a word.
    let seqs: Vec<Vec<TokenId>> = vec![free[2..4].to_vec(), free[10..12].to_vec()];
    let text = tok.decode(&free);
    let word = text
        .split_whitespace()
        .find(|w| w.len() >= 4 && w.chars().all(|c| c.is_ascii_alphabetic()))
        .expect("a word in the output")
        .to_string();
    let by_word = BanWords::from_words(&tok, &[&word]);
    let mut all = seqs.clone();
    all.extend(by_word.sequences().iter().cloned());
    for policy in [OffloadPolicy::Off, OffloadPolicy::Device] {
        let (_, banned, batch, id) = run(&model, &tok, policy, Some(BanWords::new(all.clone())), 5);
        let full: Vec<TokenId> = prompt.iter().chain(&banned).copied().collect();
        for s in &all {
            assert!(
                !contains(&full, s),
                "{policy:?}: {s:?} appears in {banned:?} ({word})"
            );
        }
        assert_ne!(banned, free, "{policy:?}: banning changed the text");
        let plan = batch.plan(id).unwrap();
        if policy == OffloadPolicy::Device {
            // top_k runs on the device, the custom stage and the rest on the host.
            assert_eq!(plan.device, vec![0]);
            assert_eq!(plan.host_reason, Some(HostReason::CustomStage));
        }
    }
    let (_, off, _, _) = run(
        &model,
        &tok,
        OffloadPolicy::Off,
        Some(BanWords::new(all.clone())),
        5,
    );
    let (_, dev, _, _) = run(
        &model,
        &tok,
        OffloadPolicy::Device,
        Some(BanWords::new(all)),
        5,
    );
    assert_eq!(off, dev, "host and device prefix give the same tokens");
}
