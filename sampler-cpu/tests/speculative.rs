//! Speculative verification (`sampler_cpu::verify`) against plain decoding.
//!
//! * Greedy chains: the emitted tokens are plain greedy decoding's, token
//!   for token, over 10,000 random cases (all drafts accepted, a first
//!   mismatch, no draft, drafts at the vocabulary's end), and the chain is
//!   left as plain decoding leaves it.
//! * Random chains: over 50,000 seeded trials per case, the first emitted
//!   token follows the chain's distribution `p_1` and the number of accepted
//!   drafts follows `P(L >= 1) = a_1`, `P(L >= 2) = sum_d min(q_1, p_1)(d)
//!   a_2(d)` with `a_i = sum_x min(p_i(x), q_i(x))`, by Pearson's chi-square
//!   test (chi2/mod.rs). False-alarm rate: ALPHA = 1e-4 per check; 12 cases
//!   with two checks each keep the family-wise rate below 2.4e-3, and the
//!   seeds are fixed, so the outcome is deterministic.

mod chi2;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_core::{Candidates, Chain, ChainSpec, HistoryScope, StageSpec as S, TokenId};
use sampler_cpu::{Verified, build_chain, verify};

const ALPHA: f64 = 1e-4;
const TRIALS: usize = 50_000;

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

fn new_chain(stages: &[S], seed: u64, prompt: &[TokenId]) -> Chain {
    let mut c = build_chain(&ChainSpec::new(stages.to_vec(), Some(seed))).unwrap();
    c.accept_prompt(prompt);
    c
}

/// Greedy verification emits what plain greedy decoding emits, accepts
/// exactly the drafts' common prefix with it, and leaves the chain where
/// plain decoding of the emitted tokens leaves it.
#[test]
fn greedy_verification_is_plain_greedy_decoding() {
    let chains: Vec<Vec<S>> = vec![
        vec![S::Greedy],
        vec![temp(0.0), S::Dist],
        vec![S::TopK { k: 1 }, S::Dist],
        vec![penalties(), S::Greedy],
        vec![
            S::LogitBias {
                bias: vec![(0, 1.5), (1, -0.5)],
            },
            S::TopK { k: 3 },
            S::Greedy,
        ],
        vec![
            penalties(),
            S::TopP {
                p: 0.7,
                min_keep: 0,
            },
            temp(0.0),
            S::Dist,
        ],
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut kinds = [0usize; 4];
    for case in 0..10_000 {
        let stages = &chains[case % chains.len()];
        let v = rng.random_range(2..=48usize);
        let k = rng.random_range(0..=6usize);
        let kind = case / chains.len() % 4;
        // Integer logits in a small range: ties are common.
        let mut rows: Vec<f32> = (0..(k + 1) * v)
            .map(|_| rng.random_range(-3..=3) as f32)
            .collect();
        if kind == 3 {
            // The vocabulary's last token wins every row.
            for r in rows.chunks_exact_mut(v) {
                r[v - 1] = 10.0;
            }
        }
        let prompt: Vec<TokenId> = (0..rng.random_range(0..4))
            .map(|_| rng.random_range(0..v as TokenId))
            .collect();
        let seed = rng.random();
        // Plain greedy decoding over the same rows.
        let mut plain = new_chain(stages, seed, &prompt);
        let mut states = vec![plain.clone()];
        let mut greedy = Vec::with_capacity(k + 1);
        for r in rows.chunks_exact(v) {
            greedy.push(plain.sample_logits(r).unwrap());
            states.push(plain.clone());
        }
        let drafts: Vec<TokenId> = match kind {
            0 | 3 => greedy[..k].to_vec(),
            1 if k > 0 => {
                let j = rng.random_range(0..k);
                let mut d = greedy[..k].to_vec();
                d[j] = (d[j] + 1) % v as TokenId;
                d
            }
            _ => vec![],
        };
        kinds[kind] += 1;
        let rows = &rows[..(drafts.len() + 1) * v];
        let mut spec = new_chain(stages, seed, &prompt);
        let got = verify(&mut spec, &drafts, None, rows, v, None).unwrap();
        let accepted = drafts
            .iter()
            .zip(&greedy)
            .take_while(|(d, g)| d == g)
            .count();
        let what = format!("case {case}: {stages:?} v {v} drafts {drafts:?} greedy {greedy:?}");
        assert_eq!(
            got,
            Verified {
                tokens: greedy[..=accepted].to_vec(),
                accepted,
                logprobs: vec![],
            },
            "{what}"
        );
        // The same state: the next token on a fresh row agrees.
        let next: Vec<f32> = (0..v).map(|_| rng.random_range(-3..=3) as f32).collect();
        let mut after = states[accepted + 1].clone();
        assert_eq!(spec.step(), after.step(), "{what}");
        assert_eq!(
            spec.sample_logits(&next),
            after.sample_logits(&next),
            "{what}"
        );
    }
    assert!(kinds.iter().all(|&n| n >= 2000), "{kinds:?}");
}

/// The chain's distribution of a row after `history` was emitted:
/// `[vocab]` probabilities (0 outside the final candidate set).
fn target(stages: &[S], prompt: &[TokenId], history: &[TokenId], row: &[f32]) -> Vec<f64> {
    let mut c = new_chain(stages, 0, prompt);
    for &t in history {
        c.commit(t);
    }
    // The filters alone: the stages before the selecting `dist`.
    let filters = &stages[..stages.len() - 1];
    let mut f = new_chain(filters, 0, prompt);
    for &t in history {
        f.commit(t);
    }
    let mut set = Candidates::from_logits(row);
    f.apply(&mut set).unwrap();
    set.softmax().unwrap();
    let mut p = vec![0.0; row.len()];
    for (&id, &q) in set.ids().iter().zip(set.probs().unwrap()) {
        p[id as usize] = f64::from(q);
    }
    p
}

fn overlap(p: &[f64], q: &[f64]) -> f64 {
    p.iter().zip(q).map(|(a, b)| a.min(*b)).sum()
}

/// Draft distributions for a case: dense, one-hot (n-gram drafts: `None`),
/// disjoint from `p_1`, equal to `p_i`.
#[derive(Debug, Clone, Copy)]
enum Draft {
    Dense,
    OneHot,
    Disjoint,
    Equal,
}

/// `k = 2` drafts per trial, vocab 8: the first emitted token's frequencies
/// against `p_1`, the accepted count's against the exact histogram.
#[test]
fn emitted_tokens_follow_the_chain_and_acceptance_the_overlap() {
    let v = 8usize;
    let rows: Vec<f32> = [
        [0.3f32, 2.0, -1.0, 1.2, 1.2, -0.4, 0.9, -2.5],
        [1.0, 0.0, 0.5, 2.5, -1.0, 0.7, 0.7, 1.9],
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
    ]
    .concat();
    let prompt = [1u32, 3, 3];
    let chains: Vec<Vec<S>> = vec![
        vec![S::TopK { k: 5 }, temp(0.8), S::Dist],
        vec![
            S::TopP {
                p: 0.8,
                min_keep: 0,
            },
            S::Dist,
        ],
        vec![
            penalties(),
            S::MinP {
                p: 0.1,
                min_keep: 0,
            },
            temp(1.3),
            S::Dist,
        ],
    ];
    let mut case = 0;
    for stages in &chains {
        for draft in [Draft::Dense, Draft::OneHot, Draft::Disjoint, Draft::Equal] {
            case += 1;
            let row = |i: usize| &rows[i * v..(i + 1) * v];
            let p1 = target(stages, &prompt, &[], row(0));
            let mut rng = ChaCha8Rng::seed_from_u64(case);
            // q_1, q_2 as distributions over the vocabulary; for `Equal`,
            // q_2 is p_2 after the drafted d_1 (computed per trial).
            let dense = |rng: &mut ChaCha8Rng| -> Vec<f64> {
                let w: Vec<f64> = (0..v).map(|_| rng.random_range(0.05..1.0)).collect();
                let s: f64 = w.iter().sum();
                w.into_iter().map(|x| x / s).collect()
            };
            let q1 = match draft {
                Draft::Dense => dense(&mut rng),
                Draft::OneHot => {
                    let mut q = vec![0.0; v];
                    q[3] = 1.0;
                    q
                }
                Draft::Disjoint => {
                    let out: Vec<usize> = (0..v).filter(|&i| p1[i] == 0.0).collect();
                    assert!(!out.is_empty(), "{stages:?}: p_1 covers the vocabulary");
                    let mut q = vec![0.0; v];
                    for &i in &out {
                        q[i] = 1.0 / out.len() as f64;
                    }
                    q
                }
                Draft::Equal => p1.clone(),
            };
            let q2_fixed = dense(&mut rng);
            let q2_for = |d1: TokenId| -> Vec<f64> {
                match draft {
                    Draft::OneHot => {
                        let mut q = vec![0.0; v];
                        q[5] = 1.0;
                        q
                    }
                    Draft::Equal => target(stages, &prompt, &[d1], row(1)),
                    _ => q2_fixed.clone(),
                }
            };
            // The exact accepted-count histogram.
            let mut at_least = [1.0, overlap(&p1, &q1), 0.0];
            for d1 in 0..v {
                let m = p1[d1].min(q1[d1]);
                if m > 0.0 {
                    let p2 = target(stages, &prompt, &[d1 as TokenId], row(1));
                    at_least[2] += m * overlap(&p2, &q2_for(d1 as TokenId));
                }
            }
            let hist = [1.0 - at_least[1], at_least[1] - at_least[2], at_least[2]];
            let mut first = vec![0usize; v];
            let mut lengths = [0usize; 3];
            let mut draws = ChaCha8Rng::seed_from_u64(1000 + case);
            let pick = |q: &[f64], rng: &mut ChaCha8Rng| -> TokenId {
                let u: f64 = rng.random();
                let mut cum = 0.0;
                for (i, &x) in q.iter().enumerate() {
                    cum += x;
                    if u < cum && x > 0.0 {
                        return i as TokenId;
                    }
                }
                q.iter().rposition(|&x| x > 0.0).unwrap() as TokenId
            };
            for trial in 0..TRIALS {
                let d1 = pick(&q1, &mut draws);
                let q2 = q2_for(d1);
                let d2 = pick(&q2, &mut draws);
                let q: Option<Vec<f32>> = match draft {
                    Draft::OneHot => None,
                    _ => Some(q1.iter().chain(&q2).map(|&x| x as f32).collect()),
                };
                let mut c = new_chain(stages, trial as u64, &prompt);
                let got = verify(&mut c, &[d1, d2], q.as_deref(), &rows, v, None).unwrap();
                first[got.tokens[0] as usize] += 1;
                lengths[got.accepted] += 1;
                if trial < 50 {
                    // The chain continues as plain decoding of the emitted
                    // tokens would.
                    let mut plain = new_chain(stages, trial as u64, &prompt);
                    for &t in &got.tokens {
                        plain.commit(t);
                    }
                    for r in 0..3 {
                        assert_eq!(c.sample_logits(row(r)), plain.sample_logits(row(r)));
                    }
                }
            }
            let name = format!("{stages:?} {draft:?}");
            for (t, (&n, &p)) in first.iter().zip(&p1).enumerate() {
                assert!(
                    p > 0.0 || n == 0,
                    "{name}: token {t} outside p_1 emitted {n} times"
                );
            }
            let pv = chi2::p_value(&first, &p1);
            assert!(
                pv >= ALPHA,
                "{name}: first token p-value {pv} ({first:?} vs {p1:?})"
            );
            let pv = chi2::p_value(&lengths, &hist);
            assert!(
                pv >= ALPHA,
                "{name}: accepted counts p-value {pv} ({lengths:?} vs {hist:?})"
            );
            if matches!(draft, Draft::Disjoint) {
                assert_eq!(
                    lengths[0], TRIALS,
                    "{name}: a disjoint draft is never accepted"
                );
            }
            if matches!(draft, Draft::Equal) {
                assert_eq!(lengths[2], TRIALS, "{name}: q = p is always accepted");
            }
        }
    }
}

/// A seeded request's verification depends on its own seed, rows and drafts
/// only: two chains with the same seed give the same tokens whatever other
/// chains verified in between, and the same emitted prefix reached by
/// different drafts leaves the same state.
#[test]
fn verification_is_a_pure_function_of_the_request() {
    let v = 16;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let rows: Vec<f32> = (0..4 * v).map(|_| rng.random_range(-2.0..2.0)).collect();
    let stages = vec![penalties(), S::TopK { k: 6 }, S::Dist];
    let drafts = [3u32, 7, 1];
    let alone = verify(
        &mut new_chain(&stages, 42, &[]),
        &drafts,
        None,
        &rows,
        v,
        None,
    )
    .unwrap();
    // Neighbours verifying other drafts on other rows first.
    for n in 0..20u64 {
        let mut other = new_chain(&stages, n, &[2]);
        let _ = verify(&mut other, &[n as u32 % 16], None, &rows[..2 * v], v, None).unwrap();
        let again = verify(
            &mut new_chain(&stages, 42, &[]),
            &drafts,
            None,
            &rows,
            v,
            None,
        )
        .unwrap();
        assert_eq!(again, alone);
    }
}

/// With logprobs asked for, each emitted token carries what a plain step
/// reports for it (raw and processed, greedy and greedy spelled as a
/// temperature).
#[test]
fn emitted_tokens_carry_a_plain_steps_logprobs() {
    let v = 12;
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for stages in [
        vec![S::Greedy],
        vec![temp(0.0), S::Dist],
        vec![penalties(), S::Greedy],
    ] {
        for mode in [
            sampler_core::LogprobsMode::Raw,
            sampler_core::LogprobsMode::Processed,
        ] {
            let spec = sampler_core::LogprobsSpec {
                top_n: 3,
                token_ids: vec![0, 11],
                mode,
            };
            let rows: Vec<f32> = (0..4 * v).map(|_| rng.random_range(-2.0..2.0)).collect();
            let mut plain = new_chain(&stages, 1, &[2, 2]);
            let mut want = Vec::new();
            for r in rows.chunks_exact(v) {
                want.push(plain.sample_logprobs(r, &spec).unwrap());
            }
            let drafts: Vec<TokenId> = want[..2].iter().map(|w| w.0).collect();
            let mut c = new_chain(&stages, 1, &[2, 2]);
            let got = verify(&mut c, &drafts, None, &rows[..3 * v], v, Some(&spec)).unwrap();
            assert_eq!(got.accepted, 2);
            let lps: Vec<_> = want[..3].iter().map(|w| w.1.clone()).collect();
            assert_eq!(got.logprobs, lps, "{stages:?} {mode:?}");
        }
    }
}

/// Drafts without a distribution are verified by the chain's own draws: a
/// seeded request emits exactly the tokens plain decoding emits, whatever
/// it drafted (random chains, including mirostat, penalties and sampled
/// chains), accepts exactly the drafts' common prefix with them, and is
/// left where plain decoding leaves it.
#[test]
fn one_hot_verification_is_plain_decoding_for_any_chain() {
    let v = 24usize;
    let chains: Vec<Vec<S>> = vec![
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
            temp(1.5),
            S::Dist,
        ],
        vec![S::Mirostat {
            tau: 3.0,
            eta: 0.2,
            m: 10,
        }],
        vec![S::MirostatV2 { tau: 2.0, eta: 0.3 }],
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..2_000u64 {
        let stages = &chains[case as usize % chains.len()];
        let k = rng.random_range(0..=6usize);
        let rows: Vec<f32> = (0..(k + 1) * v)
            .map(|_| rng.random_range(-3.0..3.0))
            .collect();
        let prompt: Vec<TokenId> = (0..3).map(|_| rng.random_range(0..v as u32)).collect();
        let mut plain = new_chain(stages, case, &prompt);
        let want: Vec<TokenId> = rows
            .chunks_exact(v)
            .map(|r| plain.sample_logits(r).unwrap())
            .collect();
        // Drafts: plain decoding's tokens up to a random miss (or none).
        let miss = rng.random_range(0..=k);
        let drafts: Vec<TokenId> = (0..k)
            .map(|i| {
                if i < miss {
                    want[i]
                } else {
                    rng.random_range(0..v as u32)
                }
            })
            .collect();
        let mut c = new_chain(stages, case, &prompt);
        let got = verify(&mut c, &drafts, None, &rows, v, None).unwrap();
        let accepted = drafts.iter().zip(&want).take_while(|(d, w)| d == w).count();
        assert_eq!(got.accepted, accepted, "case {case}");
        assert_eq!(got.tokens, want[..=accepted], "case {case} {stages:?}");
        // The state continues as plain decoding's.
        let mut p = new_chain(stages, case, &prompt);
        for r in rows.chunks_exact(v).take(accepted + 1) {
            p.sample_logits(r).unwrap();
        }
        let next = &rows[..v];
        assert_eq!(c.sample_logits(next), p.sample_logits(next), "case {case}");
    }
}
