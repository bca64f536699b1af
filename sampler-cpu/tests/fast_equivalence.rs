//! The fast paths (`sampler_cpu::fast`) select exactly the same candidates
//! and tokens as the straightforward reference (`Candidates::from_logits` +
//! `Chain::sample` / `Chain::apply`), on random rows (ties, `±0`, `-inf`,
//! huge magnitudes, NaN / `+inf`, tiny and large vocabularies), random chains
//! and seeds, over several steps (so history and step counters stay in sync).

use proptest::prelude::*;
use rand::{Rng, SeedableRng, seq::IndexedRandom, seq::SliceRandom};
use rand_chacha::ChaCha8Rng;
use sampler_core::{Candidates, ChainSpec, HistoryScope, StageSpec};
use sampler_cpu::fast::{apply_row, sample_row};

/// A row of `vocab` logits in one of several shapes, from `seed`.
fn row(seed: u64, vocab: usize, shape: u8) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut perm: Vec<usize> = (0..vocab).collect();
    perm.shuffle(&mut rng);
    let mut r = vec![0.0f32; vocab];
    for (rank, &id) in perm.iter().enumerate() {
        r[id] = match shape {
            // Zipf-like, scattered over ids.
            0 => -1.2 * ((rank + 1) as f32).ln() + rng.random_range(-0.05..0.05),
            // Heavy ties.
            1 => f32::from(rng.random_range(0u8..4)),
            // -inf sprinkled in.
            2 => {
                if rng.random_bool(0.4) {
                    f32::NEG_INFINITY
                } else {
                    rng.random_range(-8.0..8.0)
                }
            }
            // Signed zeros and small integers.
            3 => *[-0.0f32, 0.0, 1.0, -1.0].choose(&mut rng).unwrap_or(&0.0),
            // Huge magnitudes.
            4 => *[f32::MAX, -f32::MAX, 1e30, -1e30, 0.0, f32::MIN_POSITIVE]
                .choose(&mut rng)
                .unwrap_or(&0.0),
            // Almost everything masked.
            5 => {
                if rank < 2 {
                    rng.random_range(-3.0..3.0)
                } else {
                    f32::NEG_INFINITY
                }
            }
            // Everything masked.
            6 => f32::NEG_INFINITY,
            // Logits exactly at the min_p thresholds `0 + ln p` of the
            // strategies' p values, and quarter steps (many exact ties).
            _ => {
                if rng.random_bool(0.5) {
                    *[0.0f32, 0.05f32.ln(), 0.5f32.ln(), 0.25f32.ln(), 0.9f32.ln()]
                        .choose(&mut rng)
                        .unwrap_or(&0.0)
                } else {
                    rng.random_range(-20.0f32..0.0).round() / 4.0
                }
            }
        };
    }
    // Shape 8+: an invalid row (NaN or +inf somewhere).
    if shape >= 8 && vocab > 0 {
        let at = rng.random_range(0..vocab);
        r[at] = if shape.is_multiple_of(2) {
            f32::NAN
        } else {
            f32::INFINITY
        };
    }
    r
}

fn temp(t: f32) -> StageSpec {
    StageSpec::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

/// llama.cpp's default shape: `top_k`, `top_p` and `min_p` cuts, the tail.
fn cuts(k: i64, p: f32, min_p: f32, min_keep: usize, t: f32) -> Vec<StageSpec> {
    vec![
        StageSpec::TopK { k },
        StageSpec::TopP { p, min_keep },
        StageSpec::MinP { p: min_p, min_keep },
        temp(t),
        StageSpec::Dist,
    ]
}

fn penalties(last_n: usize, repeat: f32, frequency: f32, presence: f32) -> StageSpec {
    StageSpec::Penalties {
        last_n,
        repeat,
        frequency,
        presence,
        scope: HistoryScope::PromptAndOutput,
    }
}

/// Chains whose first active stage has a fast path, and a few that do not.
fn chain_strategy() -> impl Strategy<Value = Vec<StageSpec>> {
    let k = prop_oneof![
        Just(1i64),
        Just(2),
        1i64..64,
        Just(40),
        Just(100_000),
        Just(0)
    ];
    let p = prop_oneof![
        Just(0.0f32),
        Just(0.05),
        Just(0.5),
        Just(0.9),
        Just(0.95),
        0.0f32..1.0
    ];
    let min_p = prop_oneof![
        Just(0.05f32),
        Just(0.5),
        Just(0.25),
        Just(1.0),
        Just(1.05),
        0.001f32..1.0
    ];
    let t = prop_oneof![Just(0.8f32), Just(1.0), Just(0.0), Just(0.7), 0.1f32..2.0];
    let min_keep = prop_oneof![Just(0usize), Just(1), 0usize..50];
    let repeat = prop_oneof![Just(1.1f32), Just(1.0), Just(0.8), 0.5f32..2.0];
    let fp = prop_oneof![Just(0.0f32), Just(0.5), -0.5f32..1.0];
    let last_n = prop_oneof![Just(64usize), Just(0), 1usize..10];
    let tau_eta = (
        prop_oneof![Just(5.0f32), Just(3.0), Just(0.0), 0.0f32..12.0],
        prop_oneof![Just(0.1f32), Just(0.0), Just(1.0), 0.0f32..2.0],
    );
    (
        k,
        p,
        min_p,
        t,
        min_keep,
        repeat,
        fp.clone(),
        fp,
        last_n,
        tau_eta,
        0u8..38,
    )
        .prop_map(
            |(k, p, mp, t, mk, rep, freq, pres, last_n, (tau, eta), which)| match which {
                0 => vec![StageSpec::Greedy],
                1 => vec![StageSpec::TopK { k }, temp(t), StageSpec::Dist],
                2 => cuts(k, p, mp, mk, t),
                3 => vec![
                    StageSpec::TopP { p, min_keep: mk },
                    temp(t),
                    StageSpec::Dist,
                ],
                4 => vec![
                    StageSpec::MinP {
                        p: mp,
                        min_keep: mk,
                    },
                    temp(t),
                    StageSpec::Dist,
                ],
                5 => vec![
                    penalties(last_n, rep, freq, pres),
                    StageSpec::TopK { k },
                    temp(t),
                    StageSpec::Dist,
                ],
                6 => vec![StageSpec::TopK { k }, StageSpec::Greedy],
                7 => vec![
                    StageSpec::TopK { k: 0 },
                    StageSpec::TopP { p, min_keep: mk },
                    StageSpec::Greedy,
                ],
                8 => vec![
                    StageSpec::MinP {
                        p: mp,
                        min_keep: mk,
                    },
                    StageSpec::TopK { k },
                ],
                9 => vec![StageSpec::MirostatV2 { tau, eta }],
                10 => vec![StageSpec::TopK { k }, StageSpec::MirostatV2 { tau, eta }],
                // m from 1 to 120 (llama.cpp's default is 100).
                11 => vec![StageSpec::Mirostat {
                    tau,
                    eta,
                    m: 1 + last_n % 120,
                }],
                12 => vec![
                    StageSpec::TopK { k },
                    StageSpec::Mirostat {
                        tau,
                        eta,
                        m: 1 + last_n % 120,
                    },
                ],
                // Stages after a selecting stage run on its set; the last
                // selecting stage picks the token (the fuzz's find).
                22 => vec![
                    StageSpec::Mirostat {
                        tau,
                        eta,
                        m: 1 + last_n % 120,
                    },
                    StageSpec::TopK { k },
                    StageSpec::Greedy,
                ],
                23 => vec![
                    penalties(last_n, rep, freq, pres),
                    StageSpec::Mirostat {
                        tau,
                        eta,
                        m: 1 + last_n % 120,
                    },
                    temp(t),
                    StageSpec::Dist,
                ],
                24 => vec![
                    StageSpec::Typical { p, min_keep: mk },
                    StageSpec::Mirostat {
                        tau,
                        eta,
                        m: 1 + last_n % 120,
                    },
                    StageSpec::Greedy,
                ],
                13 => vec![temp(t), StageSpec::Dist],
                14 => vec![StageSpec::Dist],
                // An edit on the full row, then the whole-row tail.
                15 => vec![penalties(last_n, rep, freq, pres), temp(t), StageSpec::Dist],
                // epsilon from 0 to 0.02 (the min_p draw / 50; 0 is a no-op).
                16 => vec![
                    StageSpec::Epsilon {
                        epsilon: mp / 50.0,
                        min_keep: mk,
                    },
                    temp(t),
                    StageSpec::Dist,
                ],
                17 => vec![
                    StageSpec::Eta {
                        epsilon: mp / 50.0,
                        min_keep: mk,
                    },
                    StageSpec::Dist,
                ],
                18 => vec![
                    StageSpec::Eta {
                        epsilon: p / 2.0,
                        min_keep: mk,
                    },
                    StageSpec::TopK { k },
                    StageSpec::Dist,
                ],
                19 => vec![
                    StageSpec::Typical { p, min_keep: mk },
                    temp(t),
                    StageSpec::Dist,
                ],
                20 => vec![StageSpec::Typical { p, min_keep: mk }, StageSpec::Greedy],
                21 => vec![
                    StageSpec::Temperature {
                        t,
                        dynatemp_range: p,
                        dynatemp_exponent: 1.0 + mp,
                    },
                    StageSpec::Dist,
                ],
                // Edits with a full-row path (`Sampler::apply_full_row`)
                // before a kernel; a bias or stop token past a small
                // vocabulary is the stage's error.
                25 => vec![
                    StageSpec::LogitBias {
                        bias: vec![
                            ((k.unsigned_abs() % 100) as u32, freq * 8.0),
                            (7, f32::NEG_INFINITY),
                            ((last_n % 100) as u32, pres * 4.0),
                        ],
                    },
                    temp(t),
                    StageSpec::Dist,
                ],
                26 => vec![
                    StageSpec::MinTokens {
                        n: last_n % 3,
                        stop: vec![(k.unsigned_abs() % 90) as u32, 1],
                    },
                    penalties(last_n, rep, freq, pres),
                    StageSpec::Dist,
                ],
                27 => vec![
                    StageSpec::Mask,
                    penalties(last_n, rep, freq, pres),
                    StageSpec::TopK { k },
                    temp(t),
                    StageSpec::Dist,
                ],
                28 => vec![
                    StageSpec::Mask,
                    StageSpec::MinP {
                        p: mp,
                        min_keep: mk,
                    },
                    StageSpec::Dist,
                ],
                // A full-row edit, then one without that path (the set's
                // way from the start).
                29 => vec![
                    StageSpec::LogitBias {
                        bias: vec![(3, 2.0)],
                    },
                    StageSpec::TopNSigma { n: 1.0 + t },
                    StageSpec::Dist,
                ],
                30 => vec![
                    StageSpec::NoRepeatNgram {
                        n: 1 + last_n % 3,
                        scope: HistoryScope::PromptAndOutput,
                    },
                    penalties(last_n, rep, freq, pres),
                    temp(t),
                    StageSpec::Dist,
                ],
                // `top_n_sigma` masks (the set keeps its size): the fused
                // tail sums the kept tokens in their positions' lanes. `n`
                // from 0.01 (almost only the maximum) to 3.
                31 => vec![
                    StageSpec::TopNSigma { n: 0.01 + mp * 3.0 },
                    temp(t),
                    StageSpec::Dist,
                ],
                32 => vec![StageSpec::TopNSigma { n: 1.0 }, StageSpec::Dist],
                // Before another kernel: it edits the row in place
                // (`apply_full_row`), then `top_k`'s kernel runs.
                33 => vec![
                    StageSpec::TopNSigma { n: 0.01 + mp * 3.0 },
                    StageSpec::TopK { k },
                    temp(t),
                    StageSpec::Dist,
                ],
                // `xtc` with its tail: decided without a `Candidates` (the
                // row copied without the removed top choices).
                34 => vec![
                    StageSpec::Xtc {
                        probability: 1.0,
                        threshold: mp * 0.3,
                        min_keep: mk,
                    },
                    temp(t),
                    StageSpec::Dist,
                ],
                35 => vec![
                    StageSpec::Xtc {
                        probability: 0.5,
                        threshold: 0.1,
                        min_keep: 1,
                    },
                    StageSpec::Dist,
                ],
                // llama.cpp's default chain with its penalties active.
                36 => [
                    vec![penalties(last_n, rep, freq, pres)],
                    cuts(k, p, mp, mk, t),
                ]
                .concat(),
                _ => vec![temp(t), StageSpec::TopK { k }, StageSpec::Dist],
            },
        )
}

fn vocab_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 1usize..80, 3 => 80usize..3000, 1 => Just(20_000)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Same tokens, errors and chain state over four steps; same candidates
    /// from `apply_row` as from `Chain::apply`.
    #[test]
    fn fast_paths_match_reference(
        stages in chain_strategy(),
        vocab in vocab_strategy(),
        row_seed in any::<u64>(),
        shapes in proptest::collection::vec(0u8..10, 4),
        seed in any::<u64>(),
        history in proptest::collection::vec(0u32..100, 0..20),
    ) {
        let spec = ChainSpec::new(stages, Some(seed));
        let mut fast = sampler_cpu::build_chain(&spec).unwrap();
        fast.accept_prompt(&history.iter().map(|&t| t % vocab as u32).collect::<Vec<_>>());
        // A mask stage's bitmask: random bits, now and then a word short
        // (the stage's length error).
        let words = vocab.div_ceil(32) - usize::from(seed % 13 == 0 && vocab > 32);
        let mut bits = ChaCha8Rng::seed_from_u64(seed);
        let mask: Vec<u32> = (0..words).map(|_| bits.random::<u32>() | 1).collect();
        fast.set_token_mask(Some(mask.into()));
        let mut slow = fast.clone();
        for (step, &shape) in shapes.iter().enumerate() {
            let logits = row(row_seed.wrapping_add(step as u64), vocab, shape);
            // Candidates (no accept, no step).
            let mut reference = Candidates::from_logits(&logits);
            let want = slow.apply_from(0, &mut reference).map(|()| reference);
            let got = apply_row(&logits, &mut fast.clone());
            prop_assert_eq!(&got, &want, "apply, step {}, shape {}", step, shape);
            // Tokens (accept and step).
            let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
            let got = sample_row(&logits, &mut fast);
            prop_assert_eq!(got, want, "sample, step {}, shape {}", step, shape);
            prop_assert_eq!(fast.step(), slow.step());
            // Stage state: mirostat's surprise target moved the same way.
            for (f, s) in fast.stages().iter().zip(slow.stages()) {
                prop_assert_eq!(f.mirostat_mu(), s.mirostat_mu(), "mu, step {}", step);
            }
        }
    }
}

/// The realistic large rows the benchmark uses, full-vocabulary top_p and
/// min_p in particular, at a real vocabulary size.
#[test]
fn large_zipf_rows_match_reference() {
    let chains: Vec<Vec<StageSpec>> = vec![
        vec![StageSpec::Greedy],
        vec![StageSpec::TopK { k: 40 }, temp(0.8), StageSpec::Dist],
        vec![
            StageSpec::TopP {
                p: 0.9,
                min_keep: 1,
            },
            temp(0.7),
            StageSpec::Dist,
        ],
        vec![
            StageSpec::TopP {
                p: 0.99,
                min_keep: 1,
            },
            StageSpec::Dist,
        ],
        vec![
            StageSpec::MinP {
                p: 0.05,
                min_keep: 1,
            },
            temp(1.0),
            StageSpec::Dist,
        ],
        vec![
            penalties(64, 1.1, 0.0, 0.0),
            StageSpec::TopK { k: 40 },
            temp(0.8),
            StageSpec::Dist,
        ],
        vec![StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 }],
        vec![StageSpec::MirostatV2 { tau: 2.0, eta: 0.5 }],
        vec![StageSpec::Mirostat {
            tau: 5.0,
            eta: 0.1,
            m: 100,
        }],
        // A selecting stage that is not the last: the stages after it run
        // on its set and the last one picks the token.
        vec![
            StageSpec::Mirostat {
                tau: 5.0,
                eta: 0.1,
                m: 100,
            },
            StageSpec::TopK { k: 3 },
            StageSpec::Greedy,
        ],
        vec![temp(0.8), StageSpec::Dist],
        vec![StageSpec::Dist],
        vec![
            StageSpec::Temperature {
                t: 0.8,
                dynatemp_range: 0.5,
                dynatemp_exponent: 1.0,
            },
            StageSpec::Dist,
        ],
        vec![
            StageSpec::Typical {
                p: 0.95,
                min_keep: 1,
            },
            StageSpec::Dist,
        ],
        vec![
            StageSpec::Typical {
                p: 0.5,
                min_keep: 0,
            },
            temp(0.8),
            StageSpec::Dist,
        ],
        vec![StageSpec::TopNSigma { n: 1.0 }, temp(0.8), StageSpec::Dist],
        vec![StageSpec::TopNSigma { n: 3.0 }, StageSpec::Dist],
        vec![
            StageSpec::Xtc {
                probability: 1.0,
                threshold: 0.05,
                min_keep: 1,
            },
            temp(0.8),
            StageSpec::Dist,
        ],
        vec![
            StageSpec::Xtc {
                probability: 0.5,
                threshold: 0.0,
                min_keep: 1,
            },
            StageSpec::Dist,
        ],
        vec![
            StageSpec::Epsilon {
                epsilon: 3e-4,
                min_keep: 1,
            },
            StageSpec::Dist,
        ],
        vec![
            StageSpec::Eta {
                epsilon: 3e-4,
                min_keep: 5,
            },
            temp(0.9),
            StageSpec::Dist,
        ],
        vec![StageSpec::Mirostat {
            tau: 3.0,
            eta: 0.5,
            m: 20,
        }],
    ];
    for (c, stages) in chains.into_iter().enumerate() {
        let spec = ChainSpec::new(stages, Some(7 + c as u64));
        let mut fast = sampler_cpu::build_chain(&spec).unwrap();
        let mut slow = fast.clone();
        for step in 0..6u64 {
            let logits = row(1000 * c as u64 + step, 32_000, 0);
            let mut reference = Candidates::from_logits(&logits);
            let want = slow.apply_from(0, &mut reference).map(|()| reference);
            assert_eq!(
                apply_row(&logits, &mut fast.clone()),
                want,
                "chain {c} step {step}"
            );
            let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
            assert_eq!(
                sample_row(&logits, &mut fast),
                want,
                "chain {c} step {step}"
            );
        }
    }
}

/// Mirostat v1 with targets that keep hundreds of tokens, a quarter of the row or more (and the
/// whole row): the fast path gathers those sets unsorted and proves the
/// draw and its probability from their sum in id order; the tokens and the
/// `mu` after every step are the reference's.
#[test]
fn mirostat_large_kept_sets_match_reference() {
    let vocab = 4000;
    for tau in [4.0f32, 6.0, 8.0, 10.0, 14.0] {
        for eta in [0.1f32, 1.0] {
            let spec = ChainSpec::new(vec![StageSpec::Mirostat { tau, eta, m: 100 }], Some(7));
            let mut fast = sampler_cpu::build_chain(&spec).unwrap();
            let mut slow = fast.clone();
            for step in 0..25u64 {
                let logits = row(1000 + step, vocab, if step % 5 == 4 { 7 } else { 0 });
                let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
                let got = sample_row(&logits, &mut fast);
                assert_eq!(got, want, "tau {tau} eta {eta} step {step}");
                let (f, s) = (&fast.stages()[0], &slow.stages()[0]);
                assert_eq!(f.mirostat_mu(), s.mirostat_mu(), "tau {tau} step {step}");
            }
        }
    }
}

/// Mirostat v2 as the chain's last stage is decided whole: its kept set
/// gathered in id order, the draw and its probability proved from their sum
/// in id order. Targets from "keep only the first" to most of the row, and
/// learning rates that move `mu` far between steps: the tokens and the `mu`
/// after every step are the reference's. With a stage after it, its set
/// goes on to that stage (the last selecting stage picks the token).
#[test]
fn mirostat_v2_kept_sets_match_reference() {
    let vocab = 4000;
    for tau in [0.0f32, 0.5, 3.0, 6.0, 10.0, 14.0] {
        for eta in [0.1f32, 1.0] {
            for rest in [vec![], vec![StageSpec::TopK { k: 3 }, StageSpec::Greedy]] {
                let mut stages = vec![StageSpec::MirostatV2 { tau, eta }];
                stages.extend(rest.iter().cloned());
                let spec = ChainSpec::new(stages, Some(7));
                let mut fast = sampler_cpu::build_chain(&spec).unwrap();
                let mut slow = fast.clone();
                for step in 0..25u64 {
                    let shape = [0u8, 7, 1, 0, 5, 2, 8][step as usize % 7];
                    let logits = row(2000 + step, vocab, shape);
                    let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
                    let got = sample_row(&logits, &mut fast);
                    assert_eq!(got, want, "tau {tau} eta {eta} {rest:?} step {step}");
                    let (f, s) = (&fast.stages()[0], &slow.stages()[0]);
                    assert_eq!(f.mirostat_mu(), s.mirostat_mu(), "tau {tau} step {step}");
                }
            }
        }
    }
}

/// Custom stages (no spec) for the equivalence with custom stages.
#[derive(Debug, Clone)]
enum Custom {
    /// Ban one token by editing its logit (the row stays a full row).
    Ban(u32),
    /// Add a constant to every logit (stays a full row).
    Shift(f32),
    /// Sort the row (no longer a full row).
    Sort,
    /// Put a NaN at one position (the reference validates only before the
    /// first stage).
    Nan(u32),
    /// Select the maximum (a custom selecting stage).
    PickMax,
}

impl sampler_core::Sampler for Custom {
    fn name(&self) -> &str {
        "custom"
    }
    fn selects(&self) -> bool {
        matches!(self, Custom::PickMax)
    }
    fn apply(
        &mut self,
        row: &mut Candidates,
        _: &sampler_core::StageContext,
    ) -> Result<(), sampler_core::SampleError> {
        match *self {
            Custom::Ban(t) | Custom::Nan(t) => {
                let value = if matches!(self, Custom::Ban(_)) {
                    f32::NEG_INFINITY
                } else {
                    f32::NAN
                };
                if let Some(i) = row.ids().iter().position(|&id| id == t) {
                    row.logits_mut()[i] = value;
                }
            }
            Custom::Shift(x) => row.logits_mut().iter_mut().for_each(|l| *l += x),
            Custom::Sort => row.sort_desc(),
            Custom::PickMax => {
                let i = row.checked_argmax()?;
                row.select(i);
            }
        }
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn sampler_core::Sampler> {
        Box::new(self.clone())
    }
}

fn custom_strategy() -> impl Strategy<Value = Custom> {
    prop_oneof![
        4 => (0u32..40).prop_map(Custom::Ban),
        2 => (-3.0f32..3.0).prop_map(Custom::Shift),
        1 => Just(Custom::Sort),
        1 => (0u32..40).prop_map(Custom::Nan),
        1 => Just(Custom::PickMax),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Chains with custom stages anywhere (first, between built-ins, last),
    /// through the default entry points (`Chain::sample` / `Chain::apply` on
    /// `Candidates::from_logits` with the fast kernels installed), give the
    /// reference stages' tokens, errors, candidates and state.
    #[test]
    fn chains_with_custom_stages_match_reference(
        stages in chain_strategy(),
        customs in proptest::collection::vec((custom_strategy(), 0usize..6), 1..3),
        vocab in vocab_strategy(),
        row_seed in any::<u64>(),
        shapes in proptest::collection::vec(0u8..10, 3),
        seed in any::<u64>(),
    ) {
        let mut boxed: Vec<Box<dyn sampler_core::Sampler>> = stages
            .iter()
            .map(|s| sampler_cpu::build_stage(s).unwrap())
            .collect();
        for (custom, at) in customs {
            let at = at.min(boxed.len());
            boxed.insert(at, Box::new(custom));
        }
        let mut fast = sampler_core::Chain::new(boxed, Some(seed))
            .with_kernels(sampler_cpu::ROW_KERNELS);
        let mut slow = fast.clone();
        for (step, &shape) in shapes.iter().enumerate() {
            let logits = row(row_seed.wrapping_add(step as u64), vocab, shape);
            let mut reference = Candidates::from_logits(&logits);
            let want = slow.clone().apply_from(0, &mut reference).map(|()| reference);
            let mut got = Candidates::from_logits(&logits);
            let got = fast.clone().apply(&mut got).map(|()| got);
            prop_assert_eq!(&got, &want, "apply, step {}, shape {}", step, shape);
            let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
            let got = fast.sample(&mut Candidates::from_logits(&logits));
            prop_assert_eq!(got, want, "sample, step {}, shape {}", step, shape);
            prop_assert_eq!(fast.step(), slow.step());
        }
    }
}

/// `Chain::sample` on a full row takes the kernels when they are installed
/// (`build_chain` installs them): the row is left as given, where the
/// reference stages leave the final candidate set in it. Without kernels
/// (`Chain::new`) it is the reference.
#[test]
fn chain_sample_on_a_full_row_uses_the_kernels() {
    let logits = row(3, 5000, 0);
    let spec = ChainSpec::new(
        vec![StageSpec::TopK { k: 40 }, temp(0.8), StageSpec::Dist],
        Some(9),
    );
    let mut with = sampler_cpu::build_chain(&spec).unwrap();
    assert!(with.kernels().is_some());
    let mut row_a = Candidates::from_logits(&logits);
    let a = with.sample(&mut row_a).unwrap();
    assert_eq!(
        row_a,
        Candidates::from_logits(&logits),
        "kernels leave the row"
    );
    assert!(row_a.is_full_row());

    let stages = spec
        .stages
        .iter()
        .map(|s| sampler_cpu::build_stage(s).unwrap())
        .collect();
    let mut without = sampler_core::Chain::new(stages, Some(9));
    assert!(without.kernels().is_none());
    let mut row_b = Candidates::from_logits(&logits);
    let b = without.sample(&mut row_b).unwrap();
    assert_eq!(a, b);
    assert_eq!(row_b.len(), 40, "the reference filtered the row");
    assert!(!row_b.is_full_row());
    // A row that is not a full row (already filtered) takes the stages.
    let mut again = row_b.clone();
    assert_eq!(with.clone().sample(&mut again).map(|_| again.len()), Ok(40));
}

/// Full-vocabulary top_p gathers its head in tiers by depth below the maximum
/// (5, 7, 8.5, 10, 14, 20, 28 nats, then the rest): nuclei at every depth, and a
/// `min_keep` that asks for more than the nucleus, match the reference.
#[test]
fn top_p_at_every_depth_matches_reference() {
    let vocab = 20_000;
    for (r, spread) in [4.0f32, 12.0, 17.0, 24.0, 35.0, 120.0]
        .into_iter()
        .enumerate()
    {
        let mut rng = ChaCha8Rng::seed_from_u64(r as u64);
        let logits: Vec<f32> = (0..vocab)
            .map(|_| -spread * rng.random::<f32>().powi(2))
            .collect();
        for (p, min_keep) in [(0.5, 1), (0.9, 1), (0.99, 1), (0.9, 5_000), (0.3, 19_999)] {
            let spec = ChainSpec::new(
                vec![StageSpec::TopP { p, min_keep }, temp(0.7), StageSpec::Dist],
                Some(r as u64),
            );
            let mut fast = sampler_cpu::build_chain(&spec).unwrap();
            let mut slow = fast.clone();
            let mut reference = Candidates::from_logits(&logits);
            let want = slow.apply_from(0, &mut reference).map(|()| reference);
            let kept = want.as_ref().map(|c| c.len()).unwrap_or(0);
            assert!(kept >= min_keep, "spread {spread} p {p}: kept {kept}");
            assert_eq!(
                apply_row(&logits, &mut fast.clone()),
                want,
                "spread {spread} p {p} min_keep {min_keep}"
            );
            let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
            assert_eq!(
                sample_row(&logits, &mut fast),
                want,
                "spread {spread} p {p} min_keep {min_keep}"
            );
        }
    }
}

/// The fused `penalties -> top_k -> [temperature] -> dist` tail: without a
/// temperature, with no-op stages between and after, frequency and presence
/// penalties, a small `k`; tokens and state as the reference over steps
/// (the history grows with the sampled tokens).
#[test]
fn fused_penalties_tails_match_reference() {
    let noop = StageSpec::TopP {
        p: 1.0,
        min_keep: 1,
    };
    assert!(noop.is_noop());
    let chains: Vec<Vec<StageSpec>> = vec![
        vec![
            penalties(64, 1.1, 0.0, 0.0),
            StageSpec::TopK { k: 40 },
            StageSpec::Dist,
        ],
        vec![
            penalties(64, 1.3, 0.0, 0.0),
            noop.clone(),
            StageSpec::TopK { k: 40 },
            noop.clone(),
            temp(0.8),
            StageSpec::Dist,
        ],
        vec![
            penalties(16, 1.0, 0.5, 0.3),
            StageSpec::TopK { k: 3 },
            temp(1.5),
            StageSpec::Dist,
        ],
        vec![
            penalties(8, 2.0, 0.1, 0.0),
            StageSpec::TopK { k: 1 },
            StageSpec::Dist,
        ],
    ];
    for (c, stages) in chains.into_iter().enumerate() {
        let spec = ChainSpec::new(stages, Some(90 + c as u64));
        let mut fast = sampler_cpu::build_chain(&spec).unwrap();
        let mut slow = fast.clone();
        for step in 0..24u64 {
            // Peaked rows repeat their top tokens, so the history matters.
            let logits = row(7 * c as u64 + step % 3, 32_000, 0);
            let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
            assert_eq!(
                sample_row(&logits, &mut fast),
                want,
                "chain {c} step {step}"
            );
            assert_eq!(fast.step(), slow.step(), "chain {c} step {step}");
        }
    }
}

/// The fused `top_k -> [temperature] -> dist` tails draw from the kept set
/// in id order, their normaliser summed in that order where every order
/// gives the same bits (shallow sets) and in the sorted order otherwise
/// (sets spanning 20 nats and more): both give the reference's tokens, for
/// `k` on both sides of the order-free limit (128), with and without
/// penalties or `top_p` / `min_p` cuts between, at draws spread over
/// `[0, 1)` (one seed per step).
#[test]
fn fused_top_k_tails_match_reference_on_shallow_and_deep_sets() {
    let vocab = 4096;
    for slope in [0.4f32, 1.2, 6.0] {
        let mut rng = ChaCha8Rng::seed_from_u64(slope.to_bits().into());
        let mut perm: Vec<usize> = (0..vocab).collect();
        perm.shuffle(&mut rng);
        let mut logits = vec![0.0f32; vocab];
        for (rank, &id) in perm.iter().enumerate() {
            logits[id] = -slope * ((rank + 1) as f32).ln() + rng.random_range(-0.05..0.05);
        }
        for k in [1i64, 40, 128, 129, 300] {
            for t in [None, Some(0.5f32), Some(1.7)] {
                for (with_penalties, cuts) in
                    [(false, 0), (true, 0), (false, 1), (false, 2), (true, 2)]
                {
                    let mut stages = Vec::new();
                    if with_penalties {
                        stages.push(penalties(8, 1.3, 0.2, 0.1));
                    }
                    stages.push(StageSpec::TopK { k });
                    // top_k, then top_p / min_p cuts (llama.cpp's default).
                    if cuts >= 1 {
                        stages.push(StageSpec::TopP {
                            p: 0.95,
                            min_keep: 1,
                        });
                    }
                    if cuts >= 2 {
                        stages.push(StageSpec::MinP {
                            p: 0.05,
                            min_keep: 3,
                        });
                    }
                    stages.extend(t.map(temp));
                    stages.push(StageSpec::Dist);
                    let spec = ChainSpec::new(stages, Some(k.unsigned_abs() ^ 0x77));
                    let mut fast = sampler_cpu::build_chain(&spec).unwrap();
                    let mut slow = fast.clone();
                    for step in 0..16 {
                        let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
                        assert_eq!(
                            sample_row(&logits, &mut fast),
                            want,
                            "slope {slope} k {k} t {t:?} penalties {with_penalties} cuts {cuts} \
                             step {step}"
                        );
                    }
                }
            }
        }
    }
}
