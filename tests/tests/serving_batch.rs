//! The serving batch (`SamplingBatch`) against sampler-cpu running each
//! request alone: continuous batching with random chains, random arrival
//! and finish steps, rows shuffled every step, a random subset of the live
//! requests stepped each time, on every compiled device and every offload
//! policy. And: bytes read back per row follow that row's own plan.

mod device_support;

use conformance::boundary_reason_after;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_backend::burn_tensor::{Device, Tensor, TensorData};
use sampler_backend::{BackendError, RequestId, SamplingBatch};
use sampler_core::{
    ChainSpec, HistoryScope, OffloadPolicy, ParamValue, SampleError, StageKind, StageSpec, TokenId,
};

const VOCAB: usize = 48;

/// A random chain: filters drawn from every family (device-capable and
/// host-only), in random order, then a selecting stage.
fn random_chain(r: &mut ChaCha8Rng) -> ChainSpec {
    let mut stages = Vec::new();
    let with = |stages: &mut Vec<StageSpec>, kind: StageKind, params: &[(&str, ParamValue)]| {
        let mut s = StageSpec::default_for(kind);
        for (name, v) in params {
            s.set_param(name, v.clone()).expect("valid test parameter");
        }
        stages.push(s);
    };
    let f = |r: &mut ChaCha8Rng, lo: f32, hi: f32| ParamValue::Float(r.random_range(lo..hi));
    if r.random_bool(0.4) {
        let scope = if r.random_bool(0.5) {
            HistoryScope::Output
        } else {
            HistoryScope::PromptAndOutput
        };
        let params = [
            ("last_n", ParamValue::Int(r.random_range(0..12))),
            ("repeat", f(r, 1.0, 2.0)),
            ("frequency", f(r, 0.0, 0.6)),
            ("presence", f(r, 0.0, 0.6)),
            ("scope", ParamValue::Scope(scope)),
        ];
        with(&mut stages, StageKind::Penalties, &params);
    }
    if r.random_bool(0.3) {
        let n = r.random_range(1..4);
        let bias = (0..n)
            .map(|_| {
                let t = r.random_range(0..VOCAB as u32);
                let b = if r.random_bool(0.2) {
                    f32::NEG_INFINITY
                } else {
                    r.random_range(-3.0..3.0)
                };
                (t, b)
            })
            .collect();
        stages.push(StageSpec::LogitBias { bias });
    }
    if r.random_bool(0.5) {
        // k = 0 (no-op) and k beyond the vocabulary included.
        let k = ParamValue::Int(r.random_range(0..VOCAB as i64 + 5));
        with(&mut stages, StageKind::TopK, &[("k", k)]);
    }
    if r.random_bool(0.4) {
        let params = [
            ("p", f(r, 0.3, 1.0)),
            ("min_keep", ParamValue::Int(r.random_range(0..3))),
        ];
        with(&mut stages, StageKind::TopP, &params);
    }
    if r.random_bool(0.3) {
        let params = [
            ("p", f(r, 0.0, 0.3)),
            ("min_keep", ParamValue::Int(r.random_range(0..3))),
        ];
        with(&mut stages, StageKind::MinP, &params);
    }
    if r.random_bool(0.5) {
        let range = if r.random_bool(0.3) { 0.5 } else { 0.0 };
        let params = [
            ("t", f(r, 0.3, 1.5)),
            ("dynatemp_range", ParamValue::Float(range)),
        ];
        with(&mut stages, StageKind::Temperature, &params);
    }
    if r.random_bool(0.2) {
        with(&mut stages, StageKind::Typical, &[("p", f(r, 0.5, 1.0))]);
    }
    if r.random_bool(0.2) {
        let params = [
            ("probability", f(r, 0.0, 1.0)),
            ("threshold", f(r, 0.05, 0.3)),
        ];
        with(&mut stages, StageKind::Xtc, &params);
    }
    if r.random_bool(0.2) {
        let params = [
            ("multiplier", f(r, 0.5, 1.5)),
            ("allowed_length", ParamValue::Int(r.random_range(0..3))),
            ("last_n", ParamValue::Int(r.random_range(0..16))),
        ];
        with(&mut stages, StageKind::Dry, &params);
    }
    if r.random_bool(0.15) {
        with(
            &mut stages,
            StageKind::Epsilon,
            &[("epsilon", f(r, 0.001, 0.02))],
        );
    }
    stages.shuffle(r);
    let select = match r.random_range(0..10) {
        0 | 1 => StageSpec::Greedy,
        2 => StageSpec::default_for(StageKind::Mirostat),
        3 => StageSpec::default_for(StageKind::MirostatV2),
        _ => StageSpec::Dist,
    };
    stages.push(select);
    ChainSpec::new(stages, Some(r.random()))
}

/// The logits request `req` sees at its own step `k`: a function of the
/// request and its step only, so every schedule feeds it the same rows.
/// Quantised (ties) and with some `-inf` entries.
fn logits_of(req: usize, k: usize) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64((req as u64) << 32 | k as u64);
    (0..VOCAB)
        .map(|_| {
            if r.random_bool(0.05) {
                f32::NEG_INFINITY
            } else {
                (r.random_range(-40..40) as f32) * 0.125
            }
        })
        .collect()
}

/// The bad row case: request `req` at step `k` gets a NaN row sometimes.
fn poisoned(req: usize, k: usize) -> bool {
    (req * 31 + k * 7).is_multiple_of(53)
}

fn row_for(req: usize, k: usize) -> Vec<f32> {
    let mut row = logits_of(req, k);
    if poisoned(req, k) {
        row[(req + k) % VOCAB] = f32::NAN;
    }
    row
}

struct Schedule {
    chains: Vec<ChainSpec>,
    prompts: Vec<Vec<TokenId>>,
    arrive: Vec<usize>,
    length: Vec<usize>,
}

fn schedule(seed: u64, n: usize) -> Schedule {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let chains = (0..n).map(|_| random_chain(&mut r)).collect();
    let prompts = (0..n)
        .map(|_| {
            let len = r.random_range(0..6);
            (0..len).map(|_| r.random_range(0..VOCAB as u32)).collect()
        })
        .collect();
    let arrive = (0..n).map(|_| r.random_range(0..16)).collect();
    let length = (0..n).map(|_| r.random_range(3..14)).collect();
    Schedule {
        chains,
        prompts,
        arrive,
        length,
    }
}

/// Request `i` alone on sampler-cpu: its tokens (or row errors), step by step.
fn alone(s: &Schedule, i: usize) -> Vec<Result<TokenId, SampleError>> {
    let mut chain = sampler_cpu::build_chain(&s.chains[i]).expect("valid chain");
    chain.accept_prompt(&s.prompts[i]);
    (0..s.length[i])
        .map(|k| sampler_cpu::fast::sample_row(&row_for(i, k), &mut chain))
        .collect()
}

fn upload(rows: &[Vec<f32>], d: &Device) -> Tensor<2> {
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::<2>::from_data(TensorData::new(flat, [rows.len(), VOCAB]), d)
}

/// Run the schedule through one `SamplingBatch`: requests join at their
/// arrival step, leave when done; each step a random subset of the live
/// requests runs, rows shuffled.
fn served(
    s: &Schedule,
    d: &Device,
    policy: OffloadPolicy,
    seed: u64,
) -> (Vec<Vec<Result<TokenId, SampleError>>>, usize) {
    let n = s.chains.len();
    let mut max_groups = 0;
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let mut batch = SamplingBatch::new(VOCAB, d, policy).expect("batch");
    let mut ids: Vec<Option<RequestId>> = vec![None; n];
    let mut got: Vec<Vec<Result<TokenId, SampleError>>> = vec![Vec::new(); n];
    let mut step = 0;
    while got.iter().zip(&s.length).any(|(g, &l)| g.len() < l) {
        for (i, id) in ids.iter_mut().enumerate() {
            if s.arrive[i] == step {
                *id = Some(
                    batch
                        .insert(s.chains[i].clone(), &s.prompts[i])
                        .expect("insert"),
                );
            }
        }
        let mut live: Vec<usize> = (0..n)
            .filter(|&i| ids[i].is_some() && got[i].len() < s.length[i])
            .collect();
        live.shuffle(&mut r);
        // Any subset of the live requests (most of them, usually).
        live.retain(|_| r.random_bool(0.85));
        if !live.is_empty() {
            let rows: Vec<Vec<f32>> = live.iter().map(|&i| row_for(i, got[i].len())).collect();
            let step_ids: Vec<RequestId> = live.iter().map(|&i| ids[i].unwrap()).collect();
            let out = batch.step(&step_ids, upload(&rows, d)).expect("step");
            max_groups = max_groups.max(batch.groups());
            assert_eq!(out.tokens.len(), live.len());
            for (&i, t) in live.iter().zip(out.tokens) {
                got[i].push(t);
            }
        }
        for i in 0..n {
            if let Some(id) = ids[i]
                && got[i].len() == s.length[i]
            {
                batch.remove(id).expect("remove");
                ids[i] = None;
            }
        }
        step += 1;
        assert!(step < 10_000, "the schedule does not finish");
    }
    assert!(batch.is_empty());
    (got, max_groups)
}

fn continuous_batching_matches_each_request_alone(d: &Device, name: &str) {
    let n = 36;
    let s = schedule(0x5eed, n);
    let want: Vec<_> = (0..n).map(|i| alone(&s, i)).collect();
    // Every request is checked; a request whose token legitimately differs
    // (a float boundary within rounding, reported) stops being compared there.
    let mut boundary = 0;
    let mut compared = 0;
    for (pi, policy) in [
        OffloadPolicy::Auto,
        OffloadPolicy::Off,
        OffloadPolicy::Device,
        OffloadPolicy::Stages(1),
        OffloadPolicy::Stages(2),
    ]
    .into_iter()
    .enumerate()
    {
        let (got, groups) = served(&s, d, policy, 77 + pi as u64);
        let offloads = policy == OffloadPolicy::Device
            || !sampler_backend::is_cpu_device(d) && policy == OffloadPolicy::Auto;
        if offloads {
            assert!(
                groups >= 3,
                "[{name}] {policy:?}: {groups} device groups at most"
            );
        }
        for i in 0..n {
            for k in 0..s.length[i] {
                compared += 1;
                if got[i][k] == want[i][k] {
                    continue;
                }
                let outputs: Vec<TokenId> =
                    want[i][..k].iter().map(|t| *t.as_ref().unwrap()).collect();
                match boundary_reason_after(&s.chains[i], &logits_of(i, k), &s.prompts[i], &outputs)
                {
                    Some(why) => {
                        boundary += 1;
                        println!(
                            "TIE-BOUNDARY EXCEPTION [{name}] {policy:?} request {i} step {k}: {:?} vs {:?}: {why}",
                            got[i][k], want[i][k]
                        );
                        break;
                    }
                    None => panic!(
                        "[{name}] {policy:?}: request {i} step {k}: served {:?}, alone {:?}\nchain {}\nprompt {:?}",
                        got[i][k],
                        want[i][k],
                        s.chains[i].chain_string(),
                        s.prompts[i]
                    ),
                }
            }
        }
    }
    println!("[{name}] {compared} tokens compared, {boundary} boundary exceptions");
    assert!(boundary * 100 <= compared, "too many boundary exceptions");
    // The poisoned rows are errors for their request only.
    assert!(
        want.iter()
            .flatten()
            .any(|t| matches!(t, Err(SampleError::NanLogit { .. }))),
        "the schedule has a NaN row"
    );
}

fn mixed_chains_read_back_what_each_plan_says(d: &Device, _: &str) {
    let mut batch = SamplingBatch::new(VOCAB, d, OffloadPolicy::Device).unwrap();
    let top_k = ChainSpec::new(vec![StageSpec::TopK { k: 40 }, StageSpec::Dist], Some(1));
    let top_k_host = ChainSpec::new(
        vec![
            StageSpec::TopK { k: 40 },
            StageSpec::default_for(StageKind::Mirostat),
        ],
        Some(2),
    );
    let no_top_k = ChainSpec::new(
        vec![
            StageSpec::Temperature {
                t: 0.7,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0,
            },
            StageSpec::Dist,
        ],
        Some(3),
    );
    let no_top_k_host = ChainSpec::new(
        vec![
            StageSpec::Temperature {
                t: 0.7,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0,
            },
            StageSpec::default_for(StageKind::Mirostat),
        ],
        Some(4),
    );
    let specs = [top_k, top_k_host, no_top_k, no_top_k_host];
    let ids: Vec<RequestId> = specs
        .iter()
        .map(|s| batch.insert(s.clone(), &[]).unwrap())
        .collect();
    let per_row: Vec<usize> = ids
        .iter()
        .map(|&id| batch.plan(id).unwrap().bytes_per_row())
        .collect();
    // Each row's own plan: token ids; 40 survivors; token ids; a full row.
    assert_eq!(per_row, vec![4, 8 * 40, 4, 4 * VOCAB]);
    let rows: Vec<Vec<f32>> = (0..4).map(|i| logits_of(i, 0)).collect();
    let out = batch.step(&ids, upload(&rows, d)).unwrap();
    assert!(out.tokens.iter().all(|t| t.is_ok()), "{:?}", out.tokens);
    assert_eq!(out.bytes_read, per_row.iter().sum::<usize>());
    // Any subset: what it reads is the sum of its rows' plans.
    for subset in [vec![0], vec![2, 0], vec![3, 1], vec![1, 2]] {
        let step_ids: Vec<RequestId> = subset.iter().map(|&i| ids[i]).collect();
        let rows: Vec<Vec<f32>> = subset.iter().map(|&i| logits_of(i, 1)).collect();
        let out = batch.step(&step_ids, upload(&rows, d)).unwrap();
        let want: usize = subset.iter().map(|&i| per_row[i]).sum();
        assert_eq!(out.bytes_read, want, "subset {subset:?}");
    }
}

fn batch_errors_name_the_request(d: &Device, _: &str) {
    let mut batch = SamplingBatch::new(VOCAB, d, OffloadPolicy::Auto).unwrap();
    let spec = ChainSpec::new(vec![StageSpec::Greedy], Some(1));
    let a = batch.insert(spec.clone(), &[]).unwrap();
    let b = batch.insert(spec.clone(), &[]).unwrap();
    let two = || upload(&[logits_of(0, 0), logits_of(1, 0)], d);
    let e = batch.step(&[a, a], two()).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::DuplicateRow {
                first: 0,
                second: 1,
                ..
            }
        ),
        "{e}"
    );
    let e = batch.step(&[a], two()).unwrap_err();
    assert!(matches!(e, BackendError::Shape { batch: 1, .. }), "{e}");
    batch.remove(b).unwrap();
    let e = batch.step(&[a, b], two()).unwrap_err();
    assert_eq!(e, BackendError::UnknownRequest { id: b.get() });
    assert!(e.to_string().contains("not in the batch"), "{e}");
    assert_eq!(
        batch.remove(b),
        Err(BackendError::UnknownRequest { id: b.get() })
    );
    // A bad parameter names the stage, the field and the range.
    let bad = ChainSpec::new(
        vec![
            StageSpec::TopP {
                p: 2.0,
                min_keep: 0,
            },
            StageSpec::Dist,
        ],
        None,
    );
    let e = batch.insert(bad, &[]).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, BackendError::InvalidRequest { stage: 0, .. }),
        "{msg}"
    );
    assert!(msg.contains("p") && msg.contains("[0, 1]"), "{msg}");
    // The batch still works, and a seedless request reports the seed it uses.
    let c = batch
        .insert(ChainSpec::new(vec![StageSpec::Dist], None), &[])
        .unwrap();
    let seed = batch.spec(c).unwrap().seed.expect("a seed was drawn");
    assert_eq!(batch.chain(c).unwrap().seed(), seed);
    let out = batch.step(&[c, a], two()).unwrap();
    assert!(out.tokens.iter().all(|t| t.is_ok()));
}

fn update_and_reset_keep_the_request_reproducible(d: &Device, _: &str) {
    // A request whose parameters change mid-way gives the tokens of a
    // sampler-cpu chain changed at the same step; a reset replays its seed.
    let first = ChainSpec::new(
        vec![
            StageSpec::Penalties {
                last_n: 8,
                repeat: 1.3,
                frequency: 0.2,
                presence: 0.1,
                scope: HistoryScope::PromptAndOutput,
            },
            StageSpec::TopK { k: 10 },
            StageSpec::Dist,
        ],
        Some(9),
    );
    let mut second = first.clone();
    second.stages[1] = StageSpec::TopK { k: 3 };
    for policy in [
        OffloadPolicy::Auto,
        OffloadPolicy::Device,
        OffloadPolicy::Off,
    ] {
        let mut batch = SamplingBatch::new(VOCAB, d, policy).unwrap();
        let other = batch.insert(second.clone(), &[1, 2]).unwrap();
        let id = batch.insert(first.clone(), &[5, 5, 6]).unwrap();
        let mut cpu = sampler_cpu::build_chain(&first).unwrap();
        cpu.accept_prompt(&[5, 5, 6]);
        let mut got = Vec::new();
        let mut want = Vec::new();
        for k in 0..12 {
            if k == 6 {
                batch.update(id, second.clone()).unwrap();
                let mut next = sampler_cpu::build_chain(&second).unwrap();
                next.accept_prompt(&[5, 5, 6]);
                for &t in &want {
                    next.accept(t, sampler_core::TokenOrigin::Output);
                }
                next.set_step(cpu.step());
                cpu = next;
            }
            let out = batch
                .step(
                    &[other, id],
                    upload(&[logits_of(50, k), logits_of(7, k)], d),
                )
                .unwrap();
            got.push(out.tokens[1].clone().unwrap());
            want.push(sampler_cpu::fast::sample_row(&logits_of(7, k), &mut cpu).unwrap());
        }
        assert_eq!(got, want, "{policy:?}");
        batch.reset(id).unwrap();
        batch.accept_prompt(id, &[5, 5, 6]).unwrap();
        let mut again = Vec::new();
        let mut fresh = sampler_cpu::build_chain(&second).unwrap();
        fresh.accept_prompt(&[5, 5, 6]);
        for k in 0..4 {
            let out = batch.step(&[id], upload(&[logits_of(7, k)], d)).unwrap();
            again.push(out.tokens[0].clone().unwrap());
            assert_eq!(
                again[k],
                sampler_cpu::fast::sample_row(&logits_of(7, k), &mut fresh).unwrap(),
                "{policy:?} after reset, step {k}"
            );
        }
    }
}

fn cpu_device_auto_uses_the_cpu_kernels(d: &Device, name: &str) {
    let spec = ChainSpec::new(vec![StageSpec::TopK { k: 5 }, StageSpec::Dist], Some(3));
    let mut batch = SamplingBatch::new(VOCAB, d, OffloadPolicy::Auto).unwrap();
    let id = batch.insert(spec.clone(), &[]).unwrap();
    let plan = batch.plan(id).unwrap();
    if sampler_backend::is_cpu_device(d) {
        assert!(plan.device.is_empty(), "[{name}] {plan}");
        assert_eq!(plan.host_reason, Some(sampler_core::HostReason::CpuDevice));
        assert!(plan.to_string().contains("CPU device"), "{plan}");
    } else {
        assert!(plan.fully_offloaded(), "[{name}] {plan}");
    }
    let mut forced = SamplingBatch::new(VOCAB, d, OffloadPolicy::Device).unwrap();
    let f = forced.insert(spec, &[]).unwrap();
    assert!(forced.plan(f).unwrap().fully_offloaded());
}

/// `fork`: children continue from the parent's exact state with their own
/// seeds (`child_seed(parent, i)`): the same tokens as sampler-cpu's chain
/// run on the parent's rows up to the fork, then cloned with the child's
/// seed; a fork before any step equals fresh requests with the derived
/// seeds (a request's `n` choices). Random chains (penalties, DRY,
/// mirostat, ...), forks at steps 0 and 5, every offload policy.
fn fork_continues_from_the_parents_state(d: &Device, name: &str) {
    const CHILDREN: usize = 3;
    let mut r = ChaCha8Rng::seed_from_u64(0xf0e1);
    let prompt: Vec<TokenId> = vec![3, 9, 9, 4];
    for case in 0..6 {
        let spec = random_chain(&mut r);
        let seed = spec.seed.expect("seeded");
        let fork_at = if case % 2 == 0 { 0 } else { 5 };
        let policy = [
            OffloadPolicy::Auto,
            OffloadPolicy::Device,
            OffloadPolicy::Off,
        ][case % 3];
        let mut batch = SamplingBatch::new(VOCAB, d, policy).unwrap();
        // A neighbour that is never forked.
        let other = batch.insert(random_chain(&mut r), &[1]).unwrap();
        let parent = batch.insert(spec.clone(), &prompt).unwrap();
        let mut cpu = sampler_cpu::build_chain(&spec).unwrap();
        cpu.accept_prompt(&prompt);
        for k in 0..fork_at {
            let out = batch
                .step(
                    &[other, parent],
                    upload(&[logits_of(1, k), logits_of(2, k)], d),
                )
                .unwrap();
            let want = sampler_cpu::fast::sample_row(&logits_of(2, k), &mut cpu);
            assert_eq!(out.tokens[1], want, "[{name}] case {case}, step {k}");
        }
        let children = batch.fork(parent, CHILDREN).unwrap();
        assert_eq!(children.len(), CHILDREN);
        let mut ids = vec![parent];
        ids.extend(&children);
        let mut refs: Vec<_> = (0..=CHILDREN as u64)
            .map(|i| {
                let mut c = cpu.clone();
                c.set_seed(sampler_core::rng::child_seed(seed, i));
                c
            })
            .collect();
        // A fork before any step: fresh requests with the derived seeds.
        let mut fresh: Vec<_> = (0..=CHILDREN as u64)
            .map(|i| {
                let mut sp = spec.clone();
                sp.seed = Some(sampler_core::rng::child_seed(seed, i));
                let mut c = sampler_cpu::build_chain(&sp).unwrap();
                c.accept_prompt(&prompt);
                c
            })
            .collect();
        for (i, &c) in children.iter().enumerate() {
            assert_eq!(
                batch.spec(c).unwrap().seed,
                Some(sampler_core::rng::child_seed(seed, i as u64 + 1))
            );
        }
        for k in fork_at..fork_at + 6 {
            // Each sequence its own rows from here; rows shuffled.
            let mut order: Vec<usize> = (0..ids.len()).collect();
            order.shuffle(&mut r);
            let rows: Vec<Vec<f32>> = order.iter().map(|&j| logits_of(10 + j, k)).collect();
            let step_ids: Vec<RequestId> = order.iter().map(|&j| ids[j]).collect();
            let out = batch.step(&step_ids, upload(&rows, d)).unwrap();
            for (&j, got) in order.iter().zip(&out.tokens) {
                let want = sampler_cpu::fast::sample_row(&logits_of(10 + j, k), &mut refs[j]);
                assert_eq!(
                    *got, want,
                    "[{name}] case {case} ({policy:?}), sequence {j}, step {k}"
                );
                if fork_at == 0 {
                    let f = sampler_cpu::fast::sample_row(&logits_of(10 + j, k), &mut fresh[j]);
                    assert_eq!(
                        *got, f,
                        "[{name}] case {case}: fork at 0 vs fresh, sequence {j}"
                    );
                }
            }
        }
    }
    // Bad counts and ids are errors naming them.
    let mut batch = SamplingBatch::new(VOCAB, d, OffloadPolicy::Auto).unwrap();
    let id = batch
        .insert(ChainSpec::new(vec![StageSpec::Dist], Some(1)), &[])
        .unwrap();
    let e = batch.fork(id, 0).unwrap_err();
    assert!(matches!(e, BackendError::ForkCount { n: 0, .. }), "{e}");
    assert!(e.to_string().contains("expected 1 to 255"), "{e}");
    assert!(matches!(
        batch.fork(id, sampler_backend::MAX_FORK + 1),
        Err(BackendError::ForkCount { .. })
    ));
    batch.remove(id).unwrap();
    assert!(matches!(
        batch.fork(id, 1),
        Err(BackendError::UnknownRequest { .. })
    ));
}

/// `top_logprobs(ids, logits, k)` (what beam search scores with): each
/// row's top `k` `(token, logprob)` after its chain of logits processors
/// equal sampler-cpu's chain and `sampler_cpu::beam::top_logprobs` on the
/// same row (tokens and order exactly, tied logits included; logprobs
/// within 1e-4), step after step as tokens are committed, under every
/// offload policy; a NaN row fails alone; where the whole chain runs on
/// the device only `8·k + 4` bytes per row come back.
fn top_logprobs_equal_the_host_selection(d: &Device, name: &str) {
    let mut r = ChaCha8Rng::seed_from_u64(0x70b5);
    let prompt: Vec<TokenId> = vec![3, 9, 9, 4];
    for case in 0..8u64 {
        let mut stages = vec![
            StageSpec::Penalties {
                last_n: 8,
                repeat: 1.0 + r.random_range(0..10) as f32 * 0.1,
                frequency: r.random_range(0..5) as f32 * 0.1,
                presence: 0.2,
                scope: HistoryScope::PromptAndOutput,
            },
            StageSpec::LogitBias {
                bias: vec![(r.random_range(0..VOCAB as u32), 2.0), (7, -1.5)],
            },
            StageSpec::MinTokens {
                n: 2,
                stop: vec![0, 1],
            },
        ];
        if case == 5 {
            // A host-only processor: the rows come back whole.
            stages.push(StageSpec::NoRepeatNgram {
                n: 2,
                scope: HistoryScope::PromptAndOutput,
            });
        }
        let spec = ChainSpec::new(stages, Some(case));
        let policy = [
            OffloadPolicy::Device,
            OffloadPolicy::Off,
            OffloadPolicy::Auto,
        ][case as usize % 3];
        let k = [1, 5, 2 * VOCAB][(case as usize / 3) % 3];
        let mut batch = SamplingBatch::new(VOCAB, d, policy).unwrap();
        let ids: Vec<RequestId> = (0..3)
            .map(|_| batch.insert(spec.clone(), &prompt).unwrap())
            .collect();
        let mut cpu: Vec<_> = (0..3)
            .map(|_| {
                let mut c = sampler_cpu::build_chain(&spec).unwrap();
                c.accept_prompt(&prompt);
                c
            })
            .collect();
        let plan = batch.plan(ids[0]).unwrap().clone();
        let on_device = plan.host_start >= spec.stages.len() && plan.host_start > 0;
        // Penalties, logit_bias and min_tokens are device recipes
        // (`auto` offloads them on a GPU only); no_repeat_ngram is not.
        let offloads = match policy {
            OffloadPolicy::Device => true,
            OffloadPolicy::Auto => !sampler_backend::is_cpu_device(d),
            _ => false,
        };
        assert_eq!(on_device, offloads && case != 5, "[{name}] {plan}");
        for step in 0..5 {
            let rows: Vec<Vec<f32>> = (0..3)
                .map(|j| {
                    let mut row = logits_of(20 + j, step);
                    if j == 1 && step == 3 {
                        row[5] = f32::NAN;
                    }
                    row
                })
                .collect();
            let out = batch.top_logprobs(&ids, upload(&rows, d), k).unwrap();
            if on_device {
                assert_eq!(
                    out.bytes_read,
                    3 * (8 * k.min(VOCAB) + 4),
                    "[{name}] case {case} ({policy:?}): {plan}"
                );
            } else {
                assert!(out.bytes_read >= 3 * 4 * VOCAB, "[{name}] case {case}");
            }
            for (j, got) in out.rows.iter().enumerate() {
                let at =
                    format!("[{name}] case {case} ({policy:?}, k = {k}), row {j}, step {step}");
                if j == 1 && step == 3 {
                    assert_eq!(got, &Err(SampleError::NanLogit { index: 5 }), "{at}");
                    continue;
                }
                let c = cpu[j].apply_logits(&rows[j]).unwrap();
                let want = sampler_cpu::beam::top_logprobs(c.logits(), Some(c.ids()), k);
                let got = got.as_ref().unwrap_or_else(|e| panic!("{at}: {e}"));
                let ids_of = |v: &[(TokenId, f32)]| v.iter().map(|e| e.0).collect::<Vec<_>>();
                assert_eq!(ids_of(got), ids_of(&want), "{at}");
                for (a, b) in got.iter().zip(&want) {
                    assert!((a.1 - b.1).abs() < 1e-4, "{at}: {} vs {}", a.1, b.1);
                }
            }
            // Advance: each sequence records its best token (the NaN row
            // its step's first id).
            for j in 0..3 {
                let t = out.rows[j].as_ref().map_or(0, |v| v[0].0);
                batch.commit(ids[j], t).unwrap();
                cpu[j].commit(t);
            }
        }
    }
    // Chains without stages (a beam search without processors), beside a
    // chain the host runs, rows in any order: the selection alone runs on
    // the device wherever the policy offloads.
    for policy in [
        OffloadPolicy::Device,
        OffloadPolicy::Auto,
        OffloadPolicy::Off,
    ] {
        let mut batch = SamplingBatch::new(VOCAB, d, policy).unwrap();
        let bare = [
            batch
                .insert(ChainSpec::new(vec![], Some(1)), &prompt)
                .unwrap(),
            batch
                .insert(ChainSpec::new(vec![], Some(2)), &prompt)
                .unwrap(),
        ];
        let ngram = ChainSpec::new(
            vec![StageSpec::NoRepeatNgram {
                n: 2,
                scope: HistoryScope::PromptAndOutput,
            }],
            Some(3),
        );
        let host = batch.insert(ngram.clone(), &prompt).unwrap();
        let mut cpu = sampler_cpu::build_chain(&ngram).unwrap();
        cpu.accept_prompt(&prompt);
        let rows: Vec<Vec<f32>> = (0..3).map(|j| logits_of(40 + j, 0)).collect();
        let k = 6;
        let out = batch
            .top_logprobs(&[bare[1], host, bare[0]], upload(&rows, d), k)
            .unwrap();
        let offloads = match policy {
            OffloadPolicy::Device => true,
            OffloadPolicy::Auto => !sampler_backend::is_cpu_device(d),
            _ => false,
        };
        let want_bytes = if offloads {
            2 * (8 * k + 4) + 4 * VOCAB
        } else {
            3 * 4 * VOCAB
        };
        assert_eq!(out.bytes_read, want_bytes, "[{name}] {policy:?}");
        for (j, got) in out.rows.iter().enumerate() {
            let want = if j == 1 {
                let c = cpu.apply_logits(&rows[1]).unwrap();
                sampler_cpu::beam::top_logprobs(c.logits(), Some(c.ids()), k)
            } else {
                sampler_cpu::beam::top_logprobs(&rows[j], None, k)
            };
            let got = got.as_ref().unwrap();
            assert_eq!(
                got.iter().map(|e| e.0).collect::<Vec<_>>(),
                want.iter().map(|e| e.0).collect::<Vec<_>>(),
                "[{name}] {policy:?}, row {j}"
            );
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a.1 - b.1).abs() < 1e-4,
                    "[{name}] {policy:?}: {} vs {}",
                    a.1,
                    b.1
                );
            }
        }
    }
    let mut batch = SamplingBatch::new(VOCAB, d, OffloadPolicy::Auto).unwrap();
    let id = batch.insert(ChainSpec::new(vec![], Some(1)), &[]).unwrap();
    let e = batch
        .top_logprobs(&[id], upload(&[logits_of(0, 0)], d), 0)
        .unwrap_err();
    assert!(e.to_string().contains("k = 0"), "{e}");
}

device_tests!(
    top_logprobs_equal_the_host_selection,
    continuous_batching_matches_each_request_alone,
    mixed_chains_read_back_what_each_plan_says,
    batch_errors_name_the_request,
    update_and_reset_keep_the_request_reproducible,
    cpu_device_auto_uses_the_cpu_kernels,
    fork_continues_from_the_parents_state,
);

/// The batch feeds a device stage accepted tokens and per-step inputs
/// according to the stage's registry metadata (`needs_history`,
/// `needs_randomness`), never according to its name: every registered
/// device recipe answers what its metadata says, and a stage the registry
/// does not know is fed everything.
#[test]
fn device_hooks_follow_the_metadata() {
    let mut seen = 0;
    for kind in StageKind::ALL {
        let meta = kind.meta();
        let spec = StageSpec::default_for(kind);
        let Some(st) = sampler_backend::build_device_stage(0, std::slice::from_ref(&spec)) else {
            assert!(
                !meta.device_hook,
                "{kind:?} has a device hook but no device stage"
            );
            continue;
        };
        seen += 1;
        assert_eq!(st.needs_history(), meta.needs_history, "{kind:?}");
        assert_eq!(
            st.needs_step_input(),
            meta.needs_history || meta.needs_randomness || meta.needs_step_input,
            "{kind:?}"
        );
    }
    assert!(seen >= 8, "only {seen} device stages");
    // Penalties take history; dist takes the random stream; top_k neither.
    assert!(StageKind::Penalties.meta().needs_history);
    assert!(StageKind::Dist.meta().needs_randomness);
    assert!(!StageKind::TopK.meta().needs_history && !StageKind::TopK.meta().needs_randomness);

    struct Unregistered;
    impl sampler_backend::DeviceStage for Unregistered {
        fn name(&self) -> &'static str {
            "my_stage"
        }
        fn init(
            &mut self,
            _: &sampler_backend::InitContext,
        ) -> Result<(), sampler_core::DeviceRefusal> {
            Ok(())
        }
        fn apply(&self, _: &mut sampler_backend::StepData) {}
    }
    use sampler_backend::DeviceStage;
    assert!(Unregistered.needs_history() && Unregistered.needs_step_input());
}
