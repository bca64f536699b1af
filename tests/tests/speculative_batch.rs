//! `SamplingBatch::verify` on every compiled device against the CPU
//! verifier (`sampler_cpu::verify`) and plain decoding: requests drafting
//! without a distribution emit plain decoding's tokens (greedy or sampled;
//! verified on the device, one id per row read back, where the whole chain
//! runs there), a seeded request's result does not
//! depend on its neighbours or their order, the emitted tokens are recorded
//! as plain steps (the next step continues from them, device history
//! included), bad drafts fail their own request only.

mod device_support;

use device_support::upload;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_backend::burn_tensor::Device;
use sampler_backend::{BackendError, Draft, SamplingBatch};
use sampler_core::{ChainSpec, HistoryScope, OffloadPolicy, SampleError, StageSpec as S, TokenId};

fn temp(t: f32) -> S {
    S::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

fn penalties() -> S {
    S::Penalties {
        last_n: 8,
        repeat: 1.3,
        frequency: 0.2,
        presence: 0.1,
        scope: HistoryScope::PromptAndOutput,
    }
}

/// Random chains: greedy ones and sampling ones, some with a device prefix
/// that keeps a history (penalties).
fn chains() -> Vec<Vec<S>> {
    vec![
        vec![S::Greedy],
        vec![temp(0.0), S::Dist],
        vec![penalties(), S::TopK { k: 1 }, S::Dist],
        vec![penalties(), S::Greedy],
        vec![S::TopK { k: 5 }, temp(0.8), S::Dist],
        vec![
            penalties(),
            S::TopP {
                p: 0.9,
                min_keep: 0,
            },
            S::Dist,
        ],
        vec![
            S::MinP {
                p: 0.05,
                min_keep: 0,
            },
            S::Dist,
        ],
    ]
}

/// Rounds of 64 requests with random drafts (accepted by plain greedy
/// decoding, a first mismatch, none, at the vocabulary's end), verified in
/// one call with the rows in a shuffled request order; each request against
/// the CPU verifier on a chain of its own, and greedy ones against plain
/// greedy decoding. The next plain step continues as the CPU chain does.
fn verification_matches_the_cpu_and_plain_greedy(d: &Device, dev: &str) {
    let rounds = if dev == "flex" { 160 } else { 6 };
    let v = 40;
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let chains = chains();
    let mut greedy_cases = 0;
    let mut device_verified = 0;
    for round in 0..rounds {
        let policy = [
            OffloadPolicy::Auto,
            OffloadPolicy::Device,
            OffloadPolicy::Off,
        ][round % 3];
        let mut batch = SamplingBatch::new(v, d, policy).unwrap();
        let mut reqs = Vec::new();
        for r in 0..64u64 {
            let stages = chains[rng.random_range(0..chains.len())].clone();
            let seed = round as u64 * 1000 + r;
            let prompt: Vec<TokenId> = (0..rng.random_range(0..4))
                .map(|_| rng.random_range(0..v as TokenId))
                .collect();
            let spec = ChainSpec::new(stages.clone(), Some(seed));
            let id = batch.insert(spec.clone(), &prompt).unwrap();
            let mut cpu = sampler_cpu::build_chain(&spec).unwrap();
            cpu.accept_prompt(&prompt);
            let k = rng.random_range(0..=5usize);
            let kind = rng.random_range(0..4);
            let mut rows: Vec<f32> = (0..(k + 1) * v)
                .map(|_| rng.random_range(-3..=3) as f32)
                .collect();
            if kind == 3 {
                for row in rows.chunks_exact_mut(v) {
                    row[v - 1] = 9.0;
                }
            }
            reqs.push((id, spec, cpu, (k, kind), rows, Vec::new(), Vec::new()));
        }
        // A plain step first, so that the device stages exist (and keep a
        // history) when the verification records its tokens.
        let ids: Vec<_> = reqs.iter().map(|r| r.0).collect();
        let first: Vec<f32> = (0..ids.len() * v)
            .map(|_| rng.random_range(-3.0..3.0))
            .collect();
        let step = batch.step(&ids, upload(&first, ids.len(), v, d)).unwrap();
        for (r, req) in reqs.iter_mut().enumerate() {
            let want = req.2.sample_logits(&first[r * v..(r + 1) * v]);
            assert_eq!(
                step.tokens[r], want,
                "{dev} round {round} request {r} first step"
            );
            // Plain decoding's tokens on the verification rows (the greedy
            // reference), and the drafts.
            let mut plain = req.2.clone();
            let plain_tokens: Vec<TokenId> = req
                .4
                .chunks_exact(v)
                .map(|row| plain.sample_logits(row).unwrap())
                .collect();
            let (k, kind) = req.3;
            let drafts = match kind {
                0 | 3 => plain_tokens[..k].to_vec(),
                1 if k > 0 => {
                    let mut t = plain_tokens[..k].to_vec();
                    let j = rng.random_range(0..k);
                    t[j] = (t[j] + 1) % v as TokenId;
                    t
                }
                2 => (0..k).map(|_| rng.random_range(0..v as TokenId)).collect(),
                _ => vec![],
            };
            req.4.truncate((drafts.len() + 1) * v);
            req.5 = plain_tokens;
            req.6 = drafts;
        }
        // Shuffled order in the call.
        let mut order: Vec<usize> = (0..reqs.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let drafts: Vec<Draft> = order
            .iter()
            .map(|&i| Draft {
                id: reqs[i].0,
                tokens: reqs[i].6.clone(),
                probs: None,
            })
            .collect();
        let flat: Vec<f32> = order.iter().flat_map(|&i| reqs[i].4.clone()).collect();
        let n_rows = flat.len() / v;
        let out = batch.verify(&drafts, upload(&flat, n_rows, v, d)).unwrap();
        // Requests whose whole chain runs on the device read back one id
        // per row; the others their rows.
        let on_device = |r: &Draft| batch.plan(r.id).unwrap().fully_offloaded();
        let want_bytes: usize = drafts
            .iter()
            .map(|r| (r.tokens.len() + 1) * if on_device(r) { 4 } else { 4 * v })
            .sum();
        assert_eq!(out.bytes_read, want_bytes, "{dev} round {round}");
        device_verified += drafts.iter().filter(|r| on_device(r)).count();
        for (slot, &i) in order.iter().enumerate() {
            let (id, spec, cpu, _, rows, plain_tokens, dr) = &mut reqs[i];
            let what = format!("{dev} round {round} {:?} drafts {dr:?}", spec.stages);
            let want = sampler_cpu::verify(cpu, dr, None, rows, v, None).unwrap();
            let got = out.results[slot].clone().unwrap();
            assert_eq!(got, want, "{what}");
            // Drafts without a distribution emit plain decoding's tokens,
            // greedy or sampled.
            let n = got.tokens.len();
            assert_eq!(got.tokens, plain_tokens[..n], "{what}: plain decoding");
            if matches!(spec.stages.last(), Some(S::Greedy)) || spec.stages[0] == temp(0.0) {
                greedy_cases += 1;
            }
            assert_eq!(batch.outputs(*id).unwrap()[1..], got.tokens, "{what}");
        }
        // One plain step after: every request continues as its CPU chain.
        let ids: Vec<_> = reqs.iter().map(|r| r.0).collect();
        let next: Vec<f32> = (0..ids.len() * v)
            .map(|_| rng.random_range(-3.0..3.0))
            .collect();
        let step = batch.step(&ids, upload(&next, ids.len(), v, d)).unwrap();
        for (r, req) in reqs.iter_mut().enumerate() {
            let want = req.2.sample_logits(&next[r * v..(r + 1) * v]);
            assert_eq!(
                step.tokens[r], want,
                "{dev} round {round} request {r} next step"
            );
        }
    }
    assert!(greedy_cases >= rounds * 20, "{greedy_cases}");
    // The `device` rounds (a third) verify every request on the device.
    assert!(
        device_verified >= rounds / 3 * 64,
        "{dev}: {device_verified}"
    );
}

/// Bad drafts fail their own request (nothing recorded) and leave the
/// others verified; a call with the wrong row count fails as a whole.
fn bad_drafts_fail_their_own_request(d: &Device, dev: &str) {
    let v = 6;
    let mut batch = SamplingBatch::new(v, d, OffloadPolicy::Auto).unwrap();
    let good = batch
        .insert(ChainSpec::new(vec![S::Greedy], Some(1)), &[])
        .unwrap();
    let bad = batch
        .insert(ChainSpec::new(vec![S::Dist], Some(2)), &[])
        .unwrap();
    let miro = batch
        .insert(
            ChainSpec::new(vec![S::MirostatV2 { tau: 5.0, eta: 0.1 }], Some(3)),
            &[],
        )
        .unwrap();
    let row: Vec<f32> = (0..v).map(|i| i as f32).collect();
    // (the bad request's drafts, their distributions, what the error says)
    type Case = (Vec<TokenId>, Option<Vec<f32>>, &'static str);
    let cases: Vec<Case> = vec![
        (vec![9], None, "out of range"),
        (
            vec![1],
            Some(vec![0.5, 0.5, 0.0, 0.0, 0.0, f32::NAN]),
            "NaN",
        ),
        (
            vec![5],
            Some(vec![0.5, 0.5, 0.0, 0.0, 0.0, 0.0]),
            "probability 0",
        ),
        (vec![1], Some(vec![0.5; 3]), "[k, vocab]"),
    ];
    for (tokens, probs, says) in cases {
        let k = tokens.len();
        let drafts = vec![
            Draft {
                id: good,
                tokens: vec![5],
                probs: None,
            },
            Draft {
                id: bad,
                tokens,
                probs,
            },
            // Draft distributions need a chain ending in `dist` or `greedy`.
            Draft {
                id: miro,
                tokens: vec![0],
                probs: Some(vec![1.0 / v as f32; v]),
            },
        ];
        let n = 4 + k + 1;
        let rows: Vec<f32> = row.iter().copied().cycle().take(n * v).collect();
        let before_good = batch.outputs(good).unwrap().len();
        let out = batch.verify(&drafts, upload(&rows, n, v, d)).unwrap();
        let err = out.results[1].clone().unwrap_err();
        assert!(
            err.to_string().contains(says),
            "{dev}: {err} does not say {says}"
        );
        assert!(batch.outputs(bad).unwrap().is_empty(), "{dev}");
        assert_eq!(out.results[0].clone().unwrap().tokens, [5, 5], "{dev}");
        assert_eq!(batch.outputs(good).unwrap().len(), before_good + 2);
        let miro_err = out.results[2].clone().unwrap_err();
        assert!(
            matches!(miro_err, SampleError::Param(_)),
            "{dev}: {miro_err}"
        );
    }
    // Verified on the device: a NaN in any of a request's rows fails that
    // request alone, as the host verifier does (it checks every row first).
    let mut dev_batch = SamplingBatch::new(v, d, OffloadPolicy::Device).unwrap();
    let ok = dev_batch
        .insert(ChainSpec::new(vec![S::Greedy], Some(1)), &[])
        .unwrap();
    let nan = dev_batch
        .insert(
            ChainSpec::new(vec![S::TopK { k: 3 }, S::Dist], Some(2)),
            &[],
        )
        .unwrap();
    let mut rows: Vec<f32> = row.iter().copied().cycle().take(6 * v).collect();
    rows[5 * v + 2] = f32::NAN;
    let drafts = [
        Draft {
            id: ok,
            tokens: vec![5, 5],
            probs: None,
        },
        Draft {
            id: nan,
            tokens: vec![0, 1],
            probs: None,
        },
    ];
    let out = dev_batch.verify(&drafts, upload(&rows, 6, v, d)).unwrap();
    assert_eq!(out.bytes_read, 6 * 4, "{dev}: verified on the device");
    assert_eq!(out.results[0].clone().unwrap().tokens, [5, 5, 5], "{dev}");
    assert_eq!(
        out.results[1].clone().unwrap_err(),
        SampleError::NanLogit { index: 2 },
        "{dev}"
    );
    assert!(dev_batch.outputs(nan).unwrap().is_empty(), "{dev}");
    assert_eq!(dev_batch.chain(nan).unwrap().step(), 0, "{dev}");
    // A one-hot draft of a mirostat request is verified by its own draws.
    let m = dev_batch
        .insert(
            ChainSpec::new(vec![S::MirostatV2 { tau: 5.0, eta: 0.1 }], Some(3)),
            &[],
        )
        .unwrap();
    let out = dev_batch
        .verify(
            &[Draft {
                id: m,
                tokens: vec![0],
                probs: None,
            }],
            upload(&row.repeat(2), 2, v, d),
        )
        .unwrap();
    assert!(out.results[0].is_ok(), "{dev}: {:?}", out.results[0]);

    // The wrong number of rows, and a request named twice: the whole call.
    let drafts = vec![Draft {
        id: good,
        tokens: vec![1, 2],
        probs: None,
    }];
    let err = batch.verify(&drafts, upload(&row, 1, v, d)).unwrap_err();
    assert!(matches!(err, BackendError::Shape { .. }), "{dev}: {err}");
    let twice = vec![drafts[0].clone(), drafts[0].clone()];
    let rows: Vec<f32> = row.iter().copied().cycle().take(6 * v).collect();
    let err = batch.verify(&twice, upload(&rows, 6, v, d)).unwrap_err();
    assert!(
        matches!(err, BackendError::DuplicateRow { .. }),
        "{dev}: {err}"
    );
}

/// `submit_verify` + `finish_verify` gives what `verify` gives; while a
/// verification is in flight the batch refuses what would change it; a
/// dropped one records nothing; a mask holds for the verification's rows
/// and is used up by it.
fn pipelined_verification_equals_blocking(d: &Device, dev: &str) {
    let v = 32;
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let specs: Vec<ChainSpec> = chains()
        .into_iter()
        .enumerate()
        .map(|(i, st)| ChainSpec::new(st, Some(i as u64)))
        .collect();
    let mut a = SamplingBatch::new(v, d, OffloadPolicy::Auto).unwrap();
    let mut b = SamplingBatch::new(v, d, OffloadPolicy::Auto).unwrap();
    let ids_a: Vec<_> = specs
        .iter()
        .map(|s| a.insert(s.clone(), &[1]).unwrap())
        .collect();
    let ids_b: Vec<_> = specs
        .iter()
        .map(|s| b.insert(s.clone(), &[1]).unwrap())
        .collect();
    for round in 0..4 {
        let ks: Vec<usize> = ids_a.iter().map(|_| rng.random_range(0..4)).collect();
        let rows: usize = ks.iter().map(|k| k + 1).sum();
        let logits: Vec<f32> = (0..rows * v).map(|_| rng.random_range(-2.0..2.0)).collect();
        let drafts = |ids: &[sampler_backend::RequestId]| -> Vec<Draft> {
            ids.iter()
                .zip(&ks)
                .map(|(&id, &k)| Draft {
                    id,
                    tokens: (0..k as u32).map(|i| (i * 7 + round) % v as u32).collect(),
                    probs: None,
                })
                .collect()
        };
        let want = a
            .verify(&drafts(&ids_a), upload(&logits, rows, v, d))
            .unwrap();
        let pending = b
            .submit_verify(&drafts(&ids_b), upload(&logits, rows, v, d))
            .unwrap();
        let row = upload(&logits[..v], 1, v, d);
        assert!(matches!(
            b.step(&ids_b[..1], row.clone()),
            Err(BackendError::StepPending { .. })
        ));
        assert!(matches!(
            b.verify(&drafts(&ids_b)[..1], row),
            Err(BackendError::StepPending { .. })
        ));
        let got = b.finish_verify(pending).unwrap();
        assert_eq!(got, want, "{dev} round {round}");
    }
    // A dropped verification records nothing; the batch takes calls again.
    let before = b.outputs(ids_b[0]).unwrap().to_vec();
    let pending = b
        .submit_verify(
            &[Draft {
                id: ids_b[0],
                tokens: vec![1],
                probs: None,
            }],
            upload(&vec![0.0; 2 * v], 2, v, d),
        )
        .unwrap();
    drop(pending);
    assert_eq!(b.outputs(ids_b[0]).unwrap(), before.as_slice(), "{dev}");
    // A mask allowing only token 5 holds for every row of the verification.
    let masked = b
        .insert(ChainSpec::new(vec![S::Mask, S::Greedy], None), &[])
        .unwrap();
    b.set_mask(masked, Some(&[1 << 5])).unwrap();
    let row: Vec<f32> = (0..v).map(|i| i as f32).collect();
    let three: Vec<f32> = row.iter().copied().cycle().take(3 * v).collect();
    let out = b
        .verify(
            &[Draft {
                id: masked,
                tokens: vec![5, 5],
                probs: None,
            }],
            upload(&three, 3, v, d),
        )
        .unwrap();
    assert_eq!(out.results[0].clone().unwrap().tokens, [5, 5, 5], "{dev}");
    // Used up: the next step is unmasked (the argmax, v - 1).
    let next = b.step(&[masked], upload(&row, 1, v, d)).unwrap();
    assert_eq!(next.tokens[0], Ok(v as u32 - 1), "{dev}");
}

device_tests!(
    pipelined_verification_equals_blocking,
    verification_matches_the_cpu_and_plain_greedy,
    bad_drafts_fail_their_own_request
);
