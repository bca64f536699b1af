//! Per-step token masks and `min_tokens`, on the CPU and every compiled
//! device: tokens always inside the mask, CPU == device, the all-zero mask
//! row errors alone; stop ids banned until `n` generated tokens.

mod device_support;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_backend::burn_tensor::{Device, Tensor, TensorData};
use sampler_backend::{BackendError, SamplingBatch};
use sampler_core::{ChainSpec, OffloadPolicy, SampleError, StageSpec, TokenId};

fn upload(rows: &[Vec<f32>], d: &Device) -> Tensor<2> {
    let v = rows[0].len();
    Tensor::<2>::from_data(TensorData::new(rows.concat(), [rows.len(), v]), d)
}

fn allowed(words: &[u32], t: TokenId) -> bool {
    words[t as usize / 32] >> (t % 32) & 1 == 1
}

fn random_chain(r: &mut ChaCha8Rng, seed: u64) -> ChainSpec {
    let mut stages = Vec::new();
    if r.random_bool(0.5) {
        stages.push(StageSpec::TopK {
            k: r.random_range(1..80),
        });
    }
    if r.random_bool(0.5) {
        stages.push(StageSpec::Temperature {
            t: r.random_range(0.5..1.5),
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        });
    }
    if r.random_bool(0.4) {
        stages.push(StageSpec::TopP {
            p: r.random_range(0.5..0.99),
            min_keep: 0,
        });
    }
    if r.random_bool(0.3) {
        stages.push(StageSpec::MinP {
            p: r.random_range(0.01..0.2),
            min_keep: 0,
        });
    }
    let at = r.random_range(0..=stages.len());
    stages.insert(at, StageSpec::Mask);
    stages.push(if r.random_bool(0.3) {
        StageSpec::Greedy
    } else {
        StageSpec::Dist
    });
    ChainSpec::new(stages, Some(seed))
}

/// Random masks over random chains: every token is inside its row's mask,
/// the host (policy `off`) and the device (every offload split) agree, and
/// the row whose mask allows nothing fails alone.
fn random_masks_stay_inside(d: &Device, name: &str) {
    let v: usize = 333;
    let w = v.div_ceil(32);
    let mut r = ChaCha8Rng::seed_from_u64(0x3a5c);
    let rows = 8;
    let chains: Vec<ChainSpec> = (0..rows).map(|i| random_chain(&mut r, i as u64)).collect();
    let mut results = Vec::new();
    let mut checked = 0;
    for policy in [
        OffloadPolicy::Off,
        OffloadPolicy::Device,
        OffloadPolicy::Stages(1),
        OffloadPolicy::Stages(2),
    ] {
        let mut r = ChaCha8Rng::seed_from_u64(7);
        let mut batch = SamplingBatch::new(v, d, policy).unwrap();
        let ids: Vec<_> = chains
            .iter()
            .map(|c| batch.insert(c.clone(), &[]).unwrap())
            .collect();
        if policy == OffloadPolicy::Device {
            for (c, &id) in chains.iter().zip(&ids) {
                let at = c.stages.iter().position(|s| *s == StageSpec::Mask).unwrap();
                let plan = batch.plan(id).unwrap();
                assert!(
                    plan.device.contains(&at),
                    "[{name}] the mask runs on the device"
                );
            }
        }
        let mut got = Vec::new();
        for step in 0..6 {
            let logits: Vec<Vec<f32>> = (0..rows)
                .map(|_| (0..v).map(|_| r.random_range(-4.0..4.0)).collect())
                .collect();
            let mut masks: Vec<Option<Vec<u32>>> = Vec::new();
            for (i, &id) in ids.iter().enumerate() {
                let mask = match (i + step) % 4 {
                    0 => None,
                    // Sparse: a few allowed tokens.
                    1 => {
                        let mut m = vec![0u32; w];
                        for _ in 0..r.random_range(1..6) {
                            let t = r.random_range(0..v);
                            m[t / 32] |= 1 << (t % 32);
                        }
                        Some(m)
                    }
                    // Dense random.
                    _ => Some((0..w).map(|_| r.random::<u32>()).collect()),
                };
                // Row 3 allows nothing at step 2.
                let mask = if i == 3 && step == 2 {
                    Some(vec![0u32; w])
                } else {
                    mask
                };
                batch.set_mask(id, mask.as_deref()).unwrap();
                masks.push(mask);
            }
            let out = batch.step(&ids, upload(&logits, d)).unwrap();
            for (i, t) in out.tokens.iter().enumerate() {
                match (t, &masks[i]) {
                    (Ok(t), Some(m)) => {
                        assert!(
                            allowed(m, *t),
                            "[{name}] {policy:?} row {i}: {t} not allowed"
                        );
                        checked += 1;
                    }
                    (Ok(_), None) => {}
                    (Err(SampleError::AllMasked), Some(_)) => {}
                    (Err(e), _) => panic!("[{name}] {policy:?} row {i} step {step}: {e}"),
                }
            }
            assert_eq!(
                out.tokens[3].is_err(),
                step == 2,
                "[{name}] {policy:?}: only the all-zero mask row fails at step 2"
            );
            got.push(out.tokens);
        }
        results.push((policy, got));
    }
    for (policy, got) in &results[1..] {
        assert_eq!(got, &results[0].1, "[{name}] {policy:?} == host");
    }
    assert!(checked > 50, "{checked}");
}

/// A mask holds for one step; wrong lengths and chains without a mask stage
/// are refused with the request named.
fn mask_errors_and_lifetime(d: &Device, name: &str) {
    let v = 70;
    let mut batch = SamplingBatch::new(v, d, OffloadPolicy::Device).unwrap();
    let masked = batch
        .insert(
            ChainSpec::new(vec![StageSpec::Mask, StageSpec::Greedy], None),
            &[],
        )
        .unwrap();
    let plain = batch
        .insert(ChainSpec::new(vec![StageSpec::Greedy], None), &[])
        .unwrap();
    assert_eq!(
        batch.set_mask(masked, Some(&[0; 2])),
        Err(BackendError::MaskLength {
            id: masked.get(),
            found: 2,
            expected: 3
        })
    );
    assert_eq!(
        batch.set_mask(plain, Some(&[0; 3])),
        Err(BackendError::NoMaskStage { id: plain.get() })
    );
    // Token 0 is the argmax; the mask allows only token 65.
    let row: Vec<f32> = (0..v).map(|i| -(i as f32)).collect();
    let mut only = vec![0u32; 3];
    only[2] = 1 << (65 - 64);
    batch.set_mask(masked, Some(&only)).unwrap();
    let out = batch
        .step(&[masked], upload(std::slice::from_ref(&row), d))
        .unwrap();
    assert_eq!(out.tokens[0], Ok(65), "[{name}]");
    let out = batch.step(&[masked], upload(&[row], d)).unwrap();
    assert_eq!(out.tokens[0], Ok(0), "[{name}] the mask held one step only");
}

/// `min_tokens`: the stop ids are banned until `n` tokens were generated
/// (prompt tokens do not count); `reset` starts counting again.
fn min_tokens_bans_stop_ids(d: &Device, name: &str) {
    let v = 90;
    let stop = vec![7, 40, 89];
    // The stop ids have the highest logits (89 the best), then 3.
    let mut row: Vec<f32> = (0..v).map(|i| -(i as f32) / 100.0).collect();
    row[89] = 9.0;
    row[40] = 8.5;
    row[7] = 8.0;
    row[3] = 5.0;
    for policy in [OffloadPolicy::Off, OffloadPolicy::Device] {
        for chain in [
            vec![
                StageSpec::MinTokens {
                    n: 3,
                    stop: stop.clone(),
                },
                StageSpec::Greedy,
            ],
            vec![
                StageSpec::TopK { k: 5 },
                StageSpec::MinTokens {
                    n: 3,
                    stop: stop.clone(),
                },
                StageSpec::Greedy,
            ],
        ] {
            let mut batch = SamplingBatch::new(v, d, policy).unwrap();
            let spec = ChainSpec::new(chain, Some(1));
            let what = format!("[{name}] {policy:?} {}", spec.chain_string());
            let id = batch.insert(spec, &[1, 2, 3, 4]).unwrap();
            let mut tokens = Vec::new();
            for _ in 0..5 {
                let out = batch.step(&[id], upload(&[row.clone()], d)).unwrap();
                tokens.push(out.tokens[0].clone().unwrap());
            }
            assert_eq!(tokens, vec![3, 3, 3, 89, 89], "{what}");
            batch.reset(id).unwrap();
            let out = batch.step(&[id], upload(&[row.clone()], d)).unwrap();
            assert_eq!(out.tokens[0], Ok(3), "{what}: reset counts again");
        }
    }
}

device_tests!(
    random_masks_stay_inside,
    mask_errors_and_lifetime,
    min_tokens_bans_stop_ids
);

/// The CPU chain keeps its mask until replaced; a mask of the wrong length
/// is the row's error.
#[test]
fn chain_mask_on_the_cpu() {
    let spec = ChainSpec::new(vec![StageSpec::Mask, StageSpec::Greedy], None);
    let mut chain = sampler_cpu::build_chain(&spec).unwrap();
    let row: Vec<f32> = (0..40).map(|i| i as f32).collect();
    assert_eq!(chain.sample_logits(&row), Ok(39));
    assert!(chain.set_token_mask(Some(vec![0b1010, 0].into())));
    assert_eq!(chain.sample_logits(&row), Ok(3));
    assert_eq!(chain.sample_logits(&row), Ok(3), "the mask stays");
    chain.set_token_mask(Some(vec![1].into()));
    assert_eq!(
        chain.sample_logits(&row),
        Err(SampleError::TokenMaskLength {
            found: 1,
            expected: 2
        })
    );
    chain.set_token_mask(Some(vec![0, 0].into()));
    assert_eq!(chain.sample_logits(&row), Err(SampleError::AllMasked));
    chain.set_token_mask(None);
    assert_eq!(chain.sample_logits(&row), Ok(39));
}

/// The fast path with a `mask` (or `min_tokens`) first equals the reference
/// stages one by one: tokens and chain state, over random masks and rows.
#[test]
fn masked_fast_path_equals_the_reference() {
    let mut r = ChaCha8Rng::seed_from_u64(0xfa57);
    let v: usize = 5000;
    for case in 0..60 {
        let mut spec = random_chain(&mut r, case);
        // The mask first, so that the fast path's edit-first route runs.
        spec.stages.retain(|s| *s != StageSpec::Mask);
        spec.stages.insert(0, StageSpec::Mask);
        if case % 3 == 0 {
            spec.stages.insert(
                1,
                StageSpec::MinTokens {
                    n: 2,
                    stop: vec![1, 2, 3],
                },
            );
        }
        let mut fast = sampler_cpu::build_chain(&spec).unwrap();
        let mut reference = fast.clone();
        for step in 0..4 {
            let row: Vec<f32> = (0..v).map(|_| r.random_range(-5.0..5.0)).collect();
            let words: Vec<u32> = match step % 3 {
                0 => (0..v.div_ceil(32)).map(|_| r.random::<u32>()).collect(),
                1 => (0..v.div_ceil(32))
                    .map(|_| r.random::<u32>() & r.random::<u32>() & r.random::<u32>())
                    .collect(),
                _ => vec![u32::MAX; v.div_ceil(32)],
            };
            fast.set_token_mask(Some(words.clone().into()));
            reference.set_token_mask(Some(words.clone().into()));
            let a = fast.sample_logits(&row);
            let b = reference.sample_from(0, &mut sampler_core::Candidates::from_logits(&row));
            assert_eq!(a, b, "case {case} step {step}: {}", spec.chain_string());
            if let Ok(t) = a {
                assert!(allowed(&words, t));
            }
        }
        assert_eq!(fast.step(), reference.step());
    }
}

/// Inputs that could never act are refused at the call that gives them
/// (no device needed: the batch decides before any step): a mask for a
/// chain whose `mask` stage comes after its selecting stage, a mask kept
/// across an `update` that removed the stage, stop ids the vocabulary does
/// not have.
#[test]
fn masks_and_stop_ids_that_cannot_act_are_refused() {
    let d = sampler_backend::parse_device("flex").unwrap();
    let v = 40;
    let mut batch = SamplingBatch::new(v, &d, OffloadPolicy::Auto).unwrap();
    let late = batch
        .insert(
            ChainSpec::new(vec![StageSpec::Greedy, StageSpec::Mask], None),
            &[],
        )
        .unwrap();
    let e = batch.set_mask(late, Some(&[0; 2])).unwrap_err();
    assert_eq!(e, BackendError::NoMaskStage { id: late.get() });
    assert!(e.to_string().contains("before its selecting stage"), "{e}");

    // A mask set, then the mask stage removed and put back: the old mask
    // does not come back.
    let masked = ChainSpec::new(vec![StageSpec::Mask, StageSpec::Greedy], None);
    let id = batch.insert(masked.clone(), &[]).unwrap();
    batch.set_mask(id, Some(&[1 << 5, 0])).unwrap();
    batch
        .update(id, ChainSpec::new(vec![StageSpec::Greedy], None))
        .unwrap();
    assert_eq!(
        batch.set_mask(id, Some(&[1, 0])),
        Err(BackendError::NoMaskStage { id: id.get() })
    );
    batch.update(id, masked).unwrap();
    let row: Vec<f32> = (0..v).map(|i| -(i as f32)).collect();
    let out = batch.step(&[id], upload(&[row], &d)).unwrap();
    assert_eq!(
        out.tokens[0],
        Ok(0),
        "the mask of the removed stage is gone"
    );

    // Stop ids outside the vocabulary: refused at insert and at update,
    // naming the stage, the parameter and the range.
    let stop = |stop: Vec<TokenId>| {
        ChainSpec::new(
            vec![StageSpec::MinTokens { n: 2, stop }, StageSpec::Greedy],
            None,
        )
    };
    let e = batch
        .insert(stop(vec![3, 40]), &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("min_tokens.stop = 40") && e.contains("below the vocabulary size 40"),
        "{e}"
    );
    assert!(batch.update(id, stop(vec![41])).is_err());
    assert!(batch.insert(stop(vec![39]), &[]).is_ok());
}
