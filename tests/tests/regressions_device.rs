//! Regressions found by hostile inputs on the device path, each named after
//! the behaviour it pins; run on every compiled device.

mod device_support;

use device_support::{cpu_step, device_step};
use sampler_backend::burn_tensor::Device;
use sampler_core::{ChainSpec, OffloadPolicy, StageSpec as S};

fn mirostat() -> S {
    S::Mirostat {
        tau: 3.0,
        eta: 0.1,
        m: 50,
    }
}

fn greedy_temp() -> S {
    S::Temperature {
        t: 0.0,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

/// `top_k -> temperature(0) -> top_k` with different `k` per row: each row
/// gets its own candidates (no duplicated ids from a neighbour's padding), and
/// a host `mirostat` after it samples instead of panicking.
fn top_k_after_greedy_temperature_keeps_rows_apart(d: &Device, dev: &str) {
    let rows = vec![
        ChainSpec::new(
            vec![
                S::TopK { k: 3 },
                greedy_temp(),
                S::TopK { k: 3 },
                mirostat(),
            ],
            Some(1),
        ),
        ChainSpec::new(
            vec![
                S::TopK { k: 4 },
                greedy_temp(),
                S::TopK { k: 3 },
                mirostat(),
            ],
            Some(2),
        ),
    ];
    let logits = [5.0, -3.0, 3.0, -10.0, 9.0, -9.0, 3.0, -7.0, 0.0, 4.0];
    let cpu = cpu_step(&rows, &logits, 5, &[vec![], vec![]]);
    for policy in [
        OffloadPolicy::Device,
        OffloadPolicy::Stages(1),
        OffloadPolicy::Stages(2),
    ] {
        let (out, _) = device_step(&rows, &logits, 5, d, policy, &[vec![], vec![]]);
        assert_eq!(out.tokens, cpu, "{dev} {policy:?}");
    }
    // The filtered candidates themselves: distinct ids per row.
    let filters = vec![
        ChainSpec::new(
            vec![S::TopK { k: 3 }, greedy_temp(), S::TopK { k: 3 }],
            Some(1),
        ),
        ChainSpec::new(
            vec![S::TopK { k: 4 }, greedy_temp(), S::TopK { k: 3 }],
            Some(2),
        ),
    ];
    let mut ex = sampler_backend::Executor::new(filters, 5, d, OffloadPolicy::Device).unwrap();
    let out = ex
        .filter(device_support::upload(&logits, 2, 5, d))
        .expect("filter");
    for (r, row) in out.rows.iter().enumerate() {
        let row = row.as_ref().expect("row");
        let mut ids = row.ids().to_vec();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            ids.len(),
            row.len(),
            "{dev} row {r}: duplicate ids {:?}",
            row.ids()
        );
    }
}

/// Stages after the selecting stage are ignored on the CPU and the device
/// alike, at every split point: `[top_k 1, dist, min_p 1.2]` samples as
/// `[top_k 1, dist]`, and `[dist, top_p]` samples instead of failing.
fn stages_after_the_selecting_stage_are_ignored(d: &Device, dev: &str) {
    let cases = [
        (
            vec![
                S::TopK { k: 1 },
                S::Dist,
                S::MinP {
                    p: 1.2,
                    min_keep: 0,
                },
            ],
            vec![0.0, 1.0, 2.0],
        ),
        (
            vec![
                S::Dist,
                S::TopP {
                    p: 0.5,
                    min_keep: 0,
                },
            ],
            vec![0.5, 1.0, -1.0, 2.0],
        ),
    ];
    for (stages, logits) in cases {
        let v = logits.len();
        let rows = vec![ChainSpec::new(stages.clone(), Some(7))];
        let cpu = cpu_step(&rows, &logits, v, &[vec![]]);
        assert!(cpu[0].is_ok(), "cpu {stages:?}: {:?}", cpu[0]);
        let mut cut = stages.clone();
        cut.truncate(stages.iter().rposition(|s| s.selects()).unwrap() + 1);
        let plain = cpu_step(&[ChainSpec::new(cut, Some(7))], &logits, v, &[vec![]]);
        assert_eq!(cpu, plain, "{stages:?}");
        for policy in [
            OffloadPolicy::Device,
            OffloadPolicy::Off,
            OffloadPolicy::Stages(1),
        ] {
            let (out, _) = device_step(&rows, &logits, v, d, policy, &[vec![]]);
            assert_eq!(out.tokens, cpu, "{dev} {policy:?} {stages:?}");
        }
    }
}

/// A dynamic temperature at the edge of f32 (`t = 3e38`, the largest range
/// and exponent validation takes; once `range = exponent = 3e38`, which
/// overflowed) gives the CPU's tokens on the device, instead of NaN logits
/// (which answered AllMasked).
fn overflowing_dynamic_temperature_falls_back_to_t(d: &Device, dev: &str) {
    let stages = vec![
        // The largest range and exponent validation takes
        // (`DYNATEMP_RANGE_MAX`, `DYNATEMP_EXPONENT_MAX`).
        S::Temperature {
            t: 3e38,
            dynatemp_range: sampler_core::DYNATEMP_RANGE_MAX,
            dynatemp_exponent: sampler_core::DYNATEMP_EXPONENT_MAX,
        },
        S::Dist,
    ];
    let logits = vec![1.0, 2.0, 0.5, -1.0, 3.0];
    for seed in 0..8 {
        let rows = vec![ChainSpec::new(stages.clone(), Some(seed))];
        let cpu = cpu_step(&rows, &logits, 5, &[vec![]]);
        assert!(cpu[0].is_ok(), "cpu: {:?}", cpu[0]);
        let (out, _) = device_step(&rows, &logits, 5, d, OffloadPolicy::Device, &[vec![]]);
        assert_eq!(out.tokens, cpu, "{dev} seed {seed}");
    }
}

/// `min_keep` never keeps a `-inf` candidate, so a device filter that masks
/// and a host that drops masked candidates see the CPU's set: the host stage
/// after it (mirostat counts candidates, xtc drops top choices) agrees.
fn min_keep_never_keeps_banned_candidates(d: &Device, dev: &str) {
    let logits = vec![1.0, 2.0, f32::NEG_INFINITY, 0.5, f32::NEG_INFINITY];
    let tails = [
        S::Mirostat {
            tau: 1.0,
            eta: 0.1,
            m: 10,
        },
        S::Xtc {
            probability: 1.0,
            threshold: 0.1,
            min_keep: 0,
        },
    ];
    let heads = [
        S::MinP {
            p: 1.2,
            min_keep: 5,
        },
        S::TopP {
            p: 0.5,
            min_keep: 5,
        },
        S::Epsilon {
            epsilon: 0.9,
            min_keep: 5,
        },
    ];
    for head in &heads {
        for tail in &tails {
            let mut stages = vec![head.clone(), tail.clone()];
            if !tail.selects() {
                stages.push(S::Dist);
            }
            for seed in 0..6 {
                let rows = vec![ChainSpec::new(stages.clone(), Some(seed))];
                let cpu = cpu_step(&rows, &logits, 5, &[vec![]]);
                for policy in [OffloadPolicy::Device, OffloadPolicy::Off] {
                    let (out, _) = device_step(&rows, &logits, 5, d, policy, &[vec![]]);
                    assert_eq!(out.tokens, cpu, "{dev} {policy:?} {stages:?} seed {seed}");
                }
            }
        }
    }
    // The CPU set itself: three finite candidates, no banned one.
    let mut chain =
        sampler_cpu::build_chain(&ChainSpec::new(vec![heads[0].clone()], Some(1))).unwrap();
    let mut row = sampler_core::Candidates::from_logits(&logits);
    chain.apply(&mut row).unwrap();
    assert_eq!(row.len(), 3, "{:?}", row.ids());
}

/// Found by the fuzz suite: `[epsilon, mirostat, top_k 3, dist]` where
/// epsilon is a no-op in one row and active in another: the no-op row keeps
/// its `-inf` candidates on the host (only rows where a masking stage acted
/// drop them), so mirostat sees the CPU's set.
fn selecting_stage_before_the_last_matches_the_cpu(d: &Device, dev: &str) {
    let rows = vec![ChainSpec::new(
        vec![
            S::Epsilon {
                epsilon: 0.0,
                min_keep: 0,
            },
            S::Mirostat {
                tau: 3.0,
                eta: 0.1,
                m: 20,
            },
            S::TopK { k: 3 },
            S::Dist,
        ],
        Some(143379901672525641),
    )];
    let logits = vec![1.5, 3.0, f32::NEG_INFINITY, 1.5, 3.0];
    let prompts = [vec![4, 0, 3, 4]];
    let cpu = cpu_step(&rows, &logits, 5, &prompts);
    // With a second row whose epsilon is active, the device runs epsilon for
    // the batch; the first row's `-inf` candidate must stay (its epsilon is a
    // no-op on the CPU), or mirostat counts one candidate less.
    let mut other = rows[0].clone();
    other.stages[0] = S::Epsilon {
        epsilon: 0.05,
        min_keep: 0,
    };
    let both = vec![rows[0].clone(), other];
    let both_logits: Vec<f32> = logits.iter().chain(&logits).copied().collect();
    let both_prompts = [prompts[0].clone(), prompts[0].clone()];
    let cpu_both = cpu_step(&both, &both_logits, 5, &both_prompts);
    assert_eq!(cpu_both[0], cpu[0]);
    for policy in [OffloadPolicy::Device, OffloadPolicy::Stages(4)] {
        let (out, _) = device_step(&both, &both_logits, 5, d, policy, &both_prompts);
        assert_eq!(out.tokens, cpu_both, "{dev} {policy:?} (two rows)");
    }
    for policy in [
        OffloadPolicy::Device,
        OffloadPolicy::Off,
        OffloadPolicy::Stages(4),
    ] {
        let (out, _) = device_step(&rows, &logits, 5, d, policy, &prompts);
        assert_eq!(out.tokens, cpu, "{dev} {policy:?}");
    }
}

/// The same error on the CPU and the device when two rules compete: a NaN
/// row in a chain that never selects (filter only), and an all `-inf` row
/// with a bias on a token outside the vocabulary.
fn competing_errors_have_one_priority(d: &Device, dev: &str) {
    // Filter-only chain, NaN row: the row's error is the NaN (validation
    // comes first), on the CPU's apply and the device's filter alike.
    let spec = ChainSpec::new(vec![S::TopK { k: 2 }], Some(1));
    let logits = vec![0.5, f32::NAN, 1.0, 2.0];
    let mut chain = sampler_cpu::build_chain(&spec).unwrap();
    let cpu = chain
        .apply(&mut sampler_core::Candidates::from_logits(&logits))
        .unwrap_err();
    assert_eq!(cpu, sampler_core::SampleError::NanLogit { index: 1 });
    for policy in [OffloadPolicy::Device, OffloadPolicy::Off] {
        let mut ex = sampler_backend::Executor::new(vec![spec.clone()], 4, d, policy).unwrap();
        let out = ex
            .filter(device_support::upload(&logits, 1, 4, d))
            .expect("filter");
        assert_eq!(out.rows[0].as_ref().unwrap_err(), &cpu, "{dev} {policy:?}");
    }
    // Stepped (a token asked for) with a chain that never selects, on NaN
    // and `+inf` rows among good ones: the request's error comes first, as
    // in the CPU's `Chain::sample`, on every row.
    let (b, v) = (362, 8);
    let rows = vec![spec.clone(); b];
    let logits: Vec<f32> = (0..b * v)
        .map(|i| match i % 29 {
            2 => f32::NAN,
            5 => f32::INFINITY,
            _ => (i % v) as f32,
        })
        .collect();
    let cpu = cpu_step(&rows, &logits, v, &vec![vec![]; b]);
    assert!(
        cpu.iter()
            .all(|t| *t == Err(sampler_core::SampleError::NoSelectingStage)),
        "{:?}",
        &cpu[..4]
    );
    for policy in [OffloadPolicy::Device, OffloadPolicy::Off] {
        let (out, _) = device_step(&rows, &logits, v, d, policy, &vec![vec![]; b]);
        assert_eq!(out.tokens, cpu, "{dev} {policy:?}");
    }
    // All `-inf` with an out-of-vocabulary bias: the same error everywhere.
    let rows = vec![ChainSpec::new(
        vec![
            S::LogitBias {
                bias: vec![(9, 1.0)],
            },
            S::Dist,
        ],
        Some(2),
    )];
    let logits = vec![f32::NEG_INFINITY; 4];
    let cpu = cpu_step(&rows, &logits, 4, &[vec![]]);
    let mut reference = sampler_cpu::build_chain(&rows[0]).unwrap();
    let slow = reference.sample(&mut sampler_core::Candidates::from_logits(&logits));
    assert_eq!(cpu[0], slow, "fast path and reference");
    for policy in [OffloadPolicy::Device, OffloadPolicy::Off] {
        let (out, _) = device_step(&rows, &logits, 4, d, policy, &[vec![]]);
        assert_eq!(out.tokens, cpu, "{dev} {policy:?}");
    }
    // The same row behind a device stage that rejects an all `-inf` row
    // (the CPU's `AllMasked` comes before the host stage's out-of-vocabulary
    // bias), and behind one that does not (top_k keeps the `-inf`
    // candidates: the bias's error comes first), full rows and narrow ones.
    let bias = S::LogitBias {
        bias: vec![(9, 1.0)],
    };
    let top_p = S::TopP {
        p: 0.9,
        min_keep: 0,
    };
    let min_p = S::MinP {
        p: 0.1,
        min_keep: 0,
    };
    for (v, first) in [
        (4, vec![top_p.clone()]),
        (4, vec![min_p.clone()]),
        (300, vec![top_p]),
        (300, vec![S::TopK { k: 2 }, min_p]),
        (4, vec![S::TopK { k: 2 }]),
    ] {
        let mut stages = first;
        stages.extend([bias.clone(), S::Dist]);
        let rows = vec![ChainSpec::new(stages, Some(2)); 2];
        let mut logits = vec![f32::NEG_INFINITY; 2 * v];
        logits[v] = 1.0;
        let cpu = cpu_step(&rows, &logits, v, &[vec![], vec![]]);
        let mut reference = sampler_cpu::build_chain(&rows[0]).unwrap();
        let slow = reference.sample(&mut sampler_core::Candidates::from_logits(&logits[..v]));
        assert_eq!(cpu[0], slow, "fast path and reference");
        for policy in [
            OffloadPolicy::Device,
            OffloadPolicy::Stages(1),
            OffloadPolicy::Off,
        ] {
            let what = format!("{dev} {policy:?} {}", rows[0].chain_string());
            let (out, _) = device_step(&rows, &logits, v, d, policy, &[vec![], vec![]]);
            assert_eq!(out.tokens, cpu, "{what}");
        }
    }
}

/// Found by the fuzz suite: a ban (`logit_bias` `-inf`) after a masking
/// device stage keeps the banned token a candidate on the CPU; the host
/// must not drop it with the masked ones, so the planner leaves the ban to
/// the host when the chain goes on there (`BansAfterMask`).
fn bans_after_a_masking_stage_stay_candidates(d: &Device, dev: &str) {
    let cases: Vec<(Vec<S>, Vec<f32>)> = vec![
        (
            vec![
                S::MinP {
                    p: 0.05,
                    min_keep: 2,
                },
                S::LogitBias {
                    bias: vec![(13, f32::NEG_INFINITY)],
                },
                S::Mirostat {
                    tau: 3.0,
                    eta: 0.1,
                    m: 20,
                },
            ],
            vec![0.0; 16],
        ),
        (
            vec![
                S::Epsilon {
                    epsilon: 0.02,
                    min_keep: 3,
                },
                S::LogitBias {
                    bias: vec![(3, f32::NEG_INFINITY), (0, 2.0)],
                },
                S::Mirostat {
                    tau: 3.0,
                    eta: 0.1,
                    m: 20,
                },
            ],
            vec![
                -2.2406542,
                -0.006891338,
                -0.044970963,
                -1.1970395,
                -0.197357,
            ],
        ),
        (
            vec![
                S::TopP {
                    p: 0.9,
                    min_keep: 0,
                },
                S::Temperature {
                    t: 0.0,
                    dynatemp_range: 0.0,
                    dynatemp_exponent: 1.0,
                },
                S::TopNSigma { n: 1.0 },
                S::Dist,
            ],
            vec![1.0, 2.0, 0.5, 1.5, -1.0],
        ),
    ];
    for (stages, logits) in cases {
        let v = logits.len();
        for seed in [17650170025983401538u64, 9664937335416166648, 3] {
            let rows = vec![ChainSpec::new(stages.clone(), Some(seed))];
            let cpu = cpu_step(&rows, &logits, v, &[vec![0]]);
            for policy in [OffloadPolicy::Device, OffloadPolicy::Stages(2)] {
                let (out, ex) = device_step(&rows, &logits, v, d, policy, &[vec![0]]);
                assert_eq!(
                    out.tokens,
                    cpu,
                    "{dev} {policy:?} {stages:?}\n{}",
                    ex.plan()
                );
                if policy == OffloadPolicy::Device {
                    assert_eq!(
                        ex.plan().host_reason,
                        Some(sampler_core::HostReason::Refused(
                            sampler_core::DeviceRefusal::BansAfterMask
                        )),
                        "{dev} {stages:?}"
                    );
                }
            }
        }
    }
}

/// top_p at exact ties: on a uniform row the mass before a candidate can
/// equal `p` exactly; the CPU and the device apply one rule (keep while the
/// mass before the candidate is `< p * S`, sums of `exp(l - max)`), so they
/// keep the same candidates and draw the same token.
fn top_p_at_exact_ties_matches_the_cpu(d: &Device, dev: &str) {
    for vocab in [2usize, 4, 10, 24, 100, 300] {
        let logits = vec![0.0f32; vocab];
        for seed in 0..16u64 {
            let rows = vec![ChainSpec::new(
                vec![
                    S::TopP {
                        p: 0.5,
                        min_keep: 0,
                    },
                    S::Dist,
                ],
                Some(seed),
            )];
            let cpu = cpu_step(&rows, &logits, vocab, &[vec![]]);
            let (out, _) = device_step(&rows, &logits, vocab, d, OffloadPolicy::Device, &[vec![]]);
            assert_eq!(out.tokens, cpu, "{dev} vocab {vocab} seed {seed}");
        }
    }
}

/// Rows with a NaN or `+inf` get their error (first bad position) whichever
/// stage validates them: the fused full-row draws (`top_p` / `min_p` /
/// `temperature` handed on to `dist`), a handed-on `temperature` that a
/// `top_k` or `top_p` after it gets applied first (a `+inf` scaled to
/// `f32::MAX` must not hide the row's error), and a `top_k` after a
/// `top_p`; the valid rows beside them match the CPU.
fn invalid_rows_are_reported_whatever_stage_validates_them(d: &Device, dev: &str) {
    let v = 2000;
    let t = |t| S::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    };
    let top_p = S::TopP {
        p: 0.9,
        min_keep: 0,
    };
    let min_p = S::MinP {
        p: 0.05,
        min_keep: 0,
    };
    let chains = vec![
        vec![t(0.8), S::Dist],
        vec![t(0.8), S::TopK { k: 5 }, S::Dist],
        vec![t(0.8), top_p.clone(), S::Dist],
        vec![top_p.clone(), t(0.7), S::Dist],
        vec![top_p.clone(), S::TopK { k: 5 }, S::Dist],
        vec![min_p.clone(), t(1.5), S::Dist],
        vec![min_p, S::TopK { k: 3 }, t(0.5), S::Dist],
        vec![top_p, t(0.0), S::Dist],
    ];
    let mut logits: Vec<f32> = (0..4 * v)
        .map(|i| -((((i % v) * 7919 + i / v) % v + 1) as f32).ln())
        .collect();
    logits[v + 700] = f32::NAN;
    logits[2 * v + 1500] = f32::INFINITY;
    logits[3 * v + 3] = f32::INFINITY;
    logits[3 * v + 900] = f32::NAN;
    for stages in chains {
        let rows: Vec<ChainSpec> = (0..4)
            .map(|r| ChainSpec::new(stages.clone(), Some(r as u64 + 5)))
            .collect();
        let prompts = vec![vec![]; 4];
        let cpu = cpu_step(&rows, &logits, v, &prompts);
        assert!(
            cpu[0].is_ok() && cpu[1..].iter().all(|t| t.is_err()),
            "{cpu:?}"
        );
        let (out, _) = device_step(&rows, &logits, v, d, OffloadPolicy::Device, &prompts);
        assert_eq!(out.tokens, cpu, "{dev} {stages:?}");
    }
}

/// A token listed twice in `logit_bias` gets the sum of its biases, added
/// once, on every path (`(l + 50) - 50` is not `l`, `l + (50 - 50)` is).
fn duplicate_bias_ids_add_their_sum_once(d: &Device, dev: &str) {
    let bias = S::LogitBias {
        bias: vec![(0, 50.0), (2, 1e-7), (0, -50.0), (2, -1e-7), (1, -0.5)],
    };
    let rows = vec![ChainSpec::new(vec![bias.clone(), S::Greedy], Some(1))];
    let logits = [0.272_050_38f32; 3];
    let cpu = cpu_step(&rows, &logits, 3, &[vec![]]);
    assert_eq!(cpu, vec![Ok(0)], "the biases of token 0 cancel exactly");
    for policy in [OffloadPolicy::Device, OffloadPolicy::Off] {
        let (out, _) = device_step(&rows, &logits, 3, d, policy, &[vec![]]);
        assert_eq!(out.tokens, cpu, "{dev} {policy:?}");
    }
    // The candidates themselves: bit for bit.
    let filter = vec![ChainSpec::new(vec![bias], Some(1))];
    let mut chain = sampler_cpu::build_chain(&filter[0]).unwrap();
    let want = chain.apply_logits(&logits).unwrap();
    let mut ex = sampler_backend::Executor::new(filter, 3, d, OffloadPolicy::Device).unwrap();
    let out = ex
        .filter(device_support::upload(&logits, 1, 3, d))
        .expect("filter");
    let by_id = |c: &sampler_core::Candidates| {
        let mut p: Vec<(u32, u32)> = c
            .ids()
            .iter()
            .zip(c.logits())
            .map(|(&i, l)| (i, l.to_bits()))
            .collect();
        p.sort_unstable();
        p
    };
    let got = out.rows[0].as_ref().expect("row");
    assert_eq!(by_id(got), by_id(&want), "{dev}");
}

/// Selections no custom kernel takes never compile burn's generic top-k at
/// a large `k` on a GPU (minutes for the first step of the whole batch):
/// they run on the host (`SelectionTooWide` in the plan), or, for a
/// penalties history too long for the fused kernel, the rows are penalised
/// first and the kernel runs without it. Tokens equal the CPU's.
fn wide_selections_never_stall_a_step(d: &Device, dev: &str) {
    use sampler_core::{DeviceRefusal, HistoryScope, HostReason};
    let penalties = S::Penalties {
        last_n: 45,
        repeat: 1.1,
        frequency: 0.0,
        presence: 0.0,
        scope: HistoryScope::PromptAndOutput,
    };
    let top_p = S::TopP {
        p: 0.5,
        min_keep: 600,
    };
    let prompt: Vec<u32> = (0..45).map(|i| i * 37 % 2154).collect();
    let cases = [
        (1100, vec![S::TopK { k: 1025 }, S::Dist], vec![], true),
        (
            2154,
            vec![penalties, S::TopK { k: 1000 }, S::Dist],
            prompt,
            false,
        ),
        (3000, vec![top_p, S::Dist], vec![], true),
    ];
    let cubecl = !sampler_backend::is_cpu_device(d);
    for (v, stages, prompt, refused) in cases {
        let spec = ChainSpec::new(stages, Some(3));
        let logits: Vec<f32> = (0..v).map(|i| ((i * 7919) % 613) as f32 / 97.0).collect();
        let prompts = vec![prompt.clone()];
        let cpu = cpu_step(std::slice::from_ref(&spec), &logits, v, &prompts);
        let mut batch = sampler_backend::SamplingBatch::new(v, d, OffloadPolicy::Device).unwrap();
        let id = batch.insert(spec.clone(), &prompt).unwrap();
        let plan = batch.plan(id).unwrap();
        let what = format!("{dev} {}", spec.chain_string());
        if cubecl && refused {
            assert!(
                matches!(
                    plan.host_reason,
                    Some(HostReason::Refused(DeviceRefusal::SelectionTooWide { .. }))
                ),
                "{what}: {plan:?}"
            );
        } else {
            assert!(plan.fully_offloaded(), "{what}: {plan:?}");
        }
        let out = batch
            .step(&[id], device_support::upload(&logits, 1, v, d))
            .unwrap();
        assert_eq!(out.tokens, cpu, "{what}");
    }
}

/// Logits of every f32 scale in one row: a few ordinary ones and thousands
/// of subnormal-scale ones that differ only below `1e-38` (`exp(l - max)`
/// equal, the canonical order by value then id). The full-row nucleus finds
/// the crossing value among them (a value bisection from the row's minimum
/// to its maximum needs about 130 halvings to tell `1e-40` from
/// `1.2e-38`), so the device keeps the CPU's candidates; also after
/// penalties, the fuzz suite's case.
fn top_p_resolves_subnormal_scale_ties(d: &Device, dev: &str) {
    let v = 2651;
    let classes = [1.175_494_4e-38f32, 1e-40, 1e-45, 0.0, -0.0, -1e-45];
    let logits: Vec<f32> = (0..v)
        .map(|i| match i {
            10 | 20 => 0.28,
            _ if i % 97 == 0 => -1.5,
            _ => classes[(i * 7) % classes.len()],
        })
        .collect();
    let top_p = |p, min_keep| S::TopP { p, min_keep };
    let penalties = S::Penalties {
        last_n: 50,
        repeat: 0.01,
        frequency: 1.718_632_5,
        presence: -2.0,
        scope: sampler_core::HistoryScope::default(),
    };
    let prompt = vec![0u32, 2, 0, 5, 6, 5, 5];
    let cases = [
        (vec![top_p(0.01, 0), S::Dist], vec![]),
        (vec![top_p(0.3, 0), S::Dist], vec![]),
        (vec![top_p(0.3, 2), S::Dist], vec![]),
        (
            vec![penalties.clone(), top_p(0.001, 2), S::Dist],
            prompt.clone(),
        ),
        (vec![penalties, top_p(0.2, 0), S::Dist], prompt),
    ];
    for (stages, prompt) in cases {
        for seed in [5_441_666_697_039_819_282u64, 1, 2, 3] {
            let rows = vec![ChainSpec::new(stages.clone(), Some(seed))];
            let prompts = [prompt.clone()];
            let cpu = cpu_step(&rows, &logits, v, &prompts);
            for policy in [
                OffloadPolicy::Device,
                OffloadPolicy::Stages(stages.len() - 1),
            ] {
                let (out, _) = device_step(&rows, &logits, v, d, policy, &prompts);
                let what = format!("{dev} {policy:?} {stages:?} seed {seed}");
                assert_eq!(out.tokens, cpu, "{what}");
            }
        }
    }
}

/// `p` within f32 rounding of 1 (`0.99999994`): a candidate is kept while
/// the fixed-point mass before it is below the goal `W - (1 - p)·W`, i.e.
/// while the mass from it on is above `(1 - p)·W`; the tail of tiny
/// probabilities is cut where the CPU cuts it, not where `p·W` rounds to
/// `W`. A tail below `2^-32` of the maximum's
/// weight (at -23 nats) weighs 0 in the fixed-point rule on every device
/// and path (full row, after a top-k): only the head (or `min_keep`) is
/// kept, however long the tail.
fn top_p_within_rounding_of_one_matches_the_cpu(d: &Device, dev: &str) {
    let hot = S::Temperature {
        t: 1e30,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    };
    let top_p = |min_keep| S::TopP {
        p: 0.999_999_94,
        min_keep,
    };
    // Narrow rows, full rows (the fused draw, the filter before a top_k,
    // min_keep above 1), each with a tail of tiny probabilities.
    for (v, head, tail_logit) in [
        (113, 10, -16.5f32),
        (113, 3, -17.0),
        (600, 20, -16.0),
        (3000, 40, -15.5),
        (3000, 1, -23.0),
    ] {
        let logits: Vec<f32> = (0..v)
            .map(|i| {
                if i < head {
                    0.0
                } else {
                    tail_logit - (i % 5) as f32 * 0.01
                }
            })
            .collect();
        if tail_logit < -22.2 {
            let mut nucleus =
                sampler_cpu::build_chain(&ChainSpec::new(vec![top_p(0)], None)).unwrap();
            let mut row = sampler_core::Candidates::from_logits(&logits);
            nucleus.apply_from(0, &mut row).unwrap();
            assert_eq!(row.len(), head, "a tail of zero weights is cut");
        }
        for stages in [
            vec![top_p(5), hot.clone(), S::Dist],
            vec![top_p(0), hot.clone(), S::Dist],
            vec![top_p(0), S::TopK { k: 1000 }, hot.clone(), S::Dist],
            // The narrow kernel after a top-k (its 999 survivors of the
            // -23 tail weigh 0; their f32 mass would have kept them).
            vec![S::TopK { k: 1000 }, top_p(0), hot.clone(), S::Dist],
        ] {
            let seeds = 0..24u64;
            let rows: Vec<ChainSpec> = seeds
                .map(|seed| ChainSpec::new(stages.clone(), Some(seed)))
                .collect();
            let b = rows.len();
            let batch: Vec<f32> = logits.iter().copied().cycle().take(b * v).collect();
            let prompts = vec![vec![]; b];
            let cpu = cpu_step(&rows, &batch, v, &prompts);
            for (spec, want) in rows.iter().zip(&cpu) {
                let mut reference = sampler_cpu::build_chain(spec).unwrap();
                let mut row = sampler_core::Candidates::from_logits(&logits);
                reference.apply_from(0, &mut row).unwrap();
                assert_eq!(
                    &reference.sample(&mut sampler_core::Candidates::from_logits(&logits)),
                    want,
                    "fast path and reference, v {v} head {head}: {} kept",
                    row.len()
                );
            }
            for policy in [OffloadPolicy::Device, OffloadPolicy::Stages(1)] {
                let (out, _) = device_step(&rows, &batch, v, d, policy, &prompts);
                let what = format!("{dev} {policy:?} v {v} head {head} {stages:?}");
                assert_eq!(out.tokens, cpu, "{what}");
            }
        }
    }
}

device_tests!(
    top_p_resolves_subnormal_scale_ties,
    top_p_within_rounding_of_one_matches_the_cpu,
    wide_selections_never_stall_a_step,
    duplicate_bias_ids_add_their_sum_once,
    invalid_rows_are_reported_whatever_stage_validates_them,
    top_p_at_exact_ties_matches_the_cpu,
    bans_after_a_masking_stage_stay_candidates,
    competing_errors_have_one_priority,
    selecting_stage_before_the_last_matches_the_cpu,
    min_keep_never_keeps_banned_candidates,
    overflowing_dynamic_temperature_falls_back_to_t,
    top_k_after_greedy_temperature_keeps_rows_apart,
    stages_after_the_selecting_stage_are_ignored
);
