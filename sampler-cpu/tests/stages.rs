//! Unit checks of individual stages beyond the golden cases: DRY,
//! no-repeat-n-gram, logit bias, mirostat state, temperature edges, dist.

use sampler_core::{
    Candidates, ChainSpec, HistoryScope, RowRng, SampleError, Sampler, StageContext, StageSpec,
    TokenId, TokenOrigin,
};
use sampler_cpu::{build_chain, build_stage, dist_select};

fn ctx(seed: u64) -> StageContext {
    StageContext {
        rng: RowRng {
            seed,
            step: 0,
            stage_index: 0,
        },
    }
}

fn run(spec: StageSpec, history: &[TokenId], logits: &[f32]) -> Candidates {
    let mut s = build_stage(&spec).expect("valid");
    for &t in history {
        s.accept(t, TokenOrigin::Output);
    }
    let mut row = Candidates::from_logits(logits);
    s.apply(&mut row, &ctx(0)).expect("apply");
    row
}

fn dry(base: f32, breakers: Vec<Vec<TokenId>>) -> StageSpec {
    StageSpec::Dry {
        multiplier: 1.0,
        base,
        allowed_length: 2,
        last_n: 64,
        seq_breakers: breakers,
        scope: HistoryScope::PromptAndOutput,
    }
}

#[test]
fn dry_penalises_the_token_that_extends_a_repeat() {
    let zeros = [0.0f32; 10];
    // "0 1" repeated, followed by 2 before: token 2 gets multiplier * base^0.
    let row = run(dry(2.0, vec![]), &[0, 1, 2, 0, 1], &zeros);
    assert_eq!(row.logits()[2], -1.0);
    assert!(
        row.logits()
            .iter()
            .enumerate()
            .all(|(i, &l)| i == 2 || l == 0.0)
    );
    // "0 1 2" repeated (length 3): token 3 gets base^(3-2) = 2.
    let row = run(dry(2.0, vec![]), &[0, 1, 2, 3, 0, 1, 2], &zeros);
    assert_eq!(row.logits()[3], -2.0);
    // A breaker limits the match length: "9 0 1" would be length 3, but the
    // match may not reach back past the last 9, so it counts as 2.
    let row = run(dry(2.0, vec![vec![9]]), &[9, 0, 1, 2, 9, 0, 1], &zeros);
    assert_eq!(row.logits()[2], -1.0);
    let row = run(dry(2.0, vec![]), &[9, 0, 1, 2, 9, 0, 1], &zeros);
    assert_eq!(row.logits()[2], -2.0);
    // A window of <= allowed_length tokens does nothing.
    let row = run(dry(2.0, vec![]), &[0, 1], &zeros);
    assert_eq!(row.logits(), &zeros);
    // Multi-token breaker [5, 6]: the match stops at it.
    let row = run(dry(2.0, vec![vec![5, 6]]), &[0, 1, 2, 5, 6, 0, 1], &zeros);
    assert_eq!(row.logits()[2], -1.0);
    // Huge repeats stay finite (exponent clamped).
    let long: Vec<TokenId> = (0..60).map(|i| i % 2).collect();
    let row = run(dry(1.75, vec![]), &long, &zeros);
    assert!(row.logits().iter().all(|l| l.is_finite()));
    // Penalises by id on a reordered row.
    let mut s = build_stage(&dry(2.0, vec![])).unwrap();
    for t in [0, 1, 2, 0, 1] {
        s.accept(t, TokenOrigin::Output);
    }
    let mut row = Candidates::from_parts(vec![3, 2, 1, 0], vec![0.0; 4], 4).unwrap();
    s.apply(&mut row, &ctx(0)).unwrap();
    assert_eq!(row.logits(), &[0.0, -1.0, 0.0, 0.0]);
}

#[test]
fn dry_output_scope_ignores_prompt() {
    let mut spec = dry(2.0, vec![]);
    if let StageSpec::Dry { scope, .. } = &mut spec {
        *scope = HistoryScope::Output;
    }
    let mut s = build_stage(&spec).unwrap();
    for t in [0, 1, 2, 0] {
        s.accept(t, TokenOrigin::Prompt);
    }
    s.accept(1, TokenOrigin::Output);
    let mut row = Candidates::from_logits(&[0.0; 4]);
    s.apply(&mut row, &ctx(0)).unwrap();
    assert_eq!(row.logits(), &[0.0; 4]);
}

#[test]
fn no_repeat_ngram_follows_hugging_face() {
    let ng = |n| StageSpec::NoRepeatNgram {
        n,
        scope: HistoryScope::PromptAndOutput,
    };
    let ninf = f32::NEG_INFINITY;
    // n = 2: "1 2" occurred; the context ends in 1, so 2 is banned.
    let row = run(ng(2), &[1, 2, 3, 1], &[0.0; 5]);
    assert_eq!(row.logits(), &[0.0, 0.0, ninf, 0.0, 0.0]);
    // n = 3: "1 2 3" occurred; the context ends in "1 2", so 3 is banned.
    let row = run(ng(3), &[1, 2, 3, 1, 2], &[0.0; 5]);
    assert_eq!(row.logits(), &[0.0, 0.0, 0.0, ninf, 0.0]);
    // n = 1 bans every token in the history.
    let row = run(ng(1), &[4, 1], &[0.0; 5]);
    assert_eq!(row.logits(), &[0.0, ninf, 0.0, 0.0, ninf]);
    // Too short a history bans nothing.
    let row = run(ng(3), &[1], &[0.0; 5]);
    assert_eq!(row.logits(), &[0.0; 5]);
    // Output scope ignores the prompt.
    let mut s = build_stage(&StageSpec::NoRepeatNgram {
        n: 2,
        scope: HistoryScope::Output,
    })
    .unwrap();
    for t in [1, 2, 3] {
        s.accept(t, TokenOrigin::Prompt);
    }
    s.accept(1, TokenOrigin::Output);
    let mut row = Candidates::from_logits(&[0.0; 5]);
    s.apply(&mut row, &ctx(0)).unwrap();
    assert_eq!(row.logits(), &[0.0; 5]);
}

#[test]
fn logit_bias_by_id_and_out_of_range() {
    let spec = StageSpec::LogitBias {
        bias: vec![(1, 2.0), (3, f32::NEG_INFINITY), (1, 0.5)],
    };
    let row = run(spec.clone(), &[], &[0.0; 4]);
    assert_eq!(row.logits(), &[0.0, 2.5, 0.0, f32::NEG_INFINITY]);
    // A reordered (sorted) row is biased by id, not position.
    let mut s = build_stage(&spec).unwrap();
    let mut row = Candidates::from_parts(vec![3, 1, 0], vec![3.0, 2.0, 1.0], 4).unwrap();
    s.apply(&mut row, &ctx(0)).unwrap();
    assert_eq!(row.logits(), &[f32::NEG_INFINITY, 4.5, 1.0]);
    // Out of range for the row's vocabulary: typed error, row unchanged.
    let mut s = build_stage(&StageSpec::LogitBias {
        bias: vec![(0, 1.0), (4, 1.0)],
    })
    .unwrap();
    let mut row = Candidates::from_logits(&[0.0; 4]);
    assert_eq!(
        s.apply(&mut row, &ctx(0)),
        Err(SampleError::TokenOutOfRange { token: 4, vocab: 4 })
    );
    assert_eq!(row.logits(), &[0.0; 4]);
    // A finite bias never creates +inf.
    let row = run(
        StageSpec::LogitBias {
            bias: vec![(0, f32::MAX)],
        },
        &[],
        &[f32::MAX, 0.0],
    );
    assert_eq!(row.logits()[0], f32::MAX);
}

#[test]
fn mirostat_updates_mu_only_on_accept() {
    let logits: Vec<f32> = (0..50).map(|i| -(i as f32) * 0.3).collect();
    for spec in [
        StageSpec::Mirostat {
            tau: 3.0,
            eta: 0.5,
            m: 100,
        },
        StageSpec::MirostatV2 { tau: 3.0, eta: 0.5 },
    ] {
        let mut a = build_chain(&ChainSpec::new(vec![spec.clone()], Some(9))).unwrap();
        let mut b = build_chain(&ChainSpec::new(vec![spec.clone()], Some(9))).unwrap();
        let ta: Vec<TokenId> = (0..20)
            .map(|_| a.sample(&mut Candidates::from_logits(&logits)).unwrap())
            .collect();
        let tb: Vec<TokenId> = (0..20)
            .map(|_| b.sample(&mut Candidates::from_logits(&logits)).unwrap())
            .collect();
        assert_eq!(ta, tb, "{spec:?}: same seed, same tokens");
        assert!(ta.iter().all(|&t| (t as usize) < logits.len()));
        // Reset replays the stream.
        a.reset();
        let tr: Vec<TokenId> = (0..20)
            .map(|_| a.sample(&mut Candidates::from_logits(&logits)).unwrap())
            .collect();
        assert_eq!(tr, ta);
    }
    // mu moves toward the target surprise after an accepted token.
    let mut s = sampler_cpu::stages::MirostatV2::new(3.0, 0.5);
    assert_eq!(s.mu(), 6.0);
    let mut row = Candidates::from_logits(&logits);
    s.apply(&mut row, &ctx(1)).unwrap();
    assert_eq!(s.mu(), 6.0, "apply alone does not change mu");
    let token = row.selected_token().unwrap();
    s.accept(token, TokenOrigin::Output);
    assert_ne!(s.mu(), 6.0);
    s.reset();
    assert_eq!(s.mu(), 6.0);
}

#[test]
fn temperature_edges() {
    let t = |t, range, exponent| StageSpec::Temperature {
        t,
        dynatemp_range: range,
        dynatemp_exponent: exponent,
    };
    // Saturation instead of +inf.
    let row = run(t(0.5, 0.0, 1.0), &[], &[f32::MAX, 1.0, f32::NEG_INFINITY]);
    assert_eq!(row.logits(), &[f32::MAX, 2.0, f32::NEG_INFINITY]);
    // Greedy rule: size unchanged, lowest id among tied maxima keeps its logit.
    let row = run(t(0.0, 0.0, 1.0), &[], &[1.0, 3.0, 3.0]);
    assert_eq!(row.logits(), &[f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY]);
    // Dynamic: a uniform row has maximal entropy -> t + range.
    let row = run(t(1.0, 0.5, 1.0), &[], &[2.0, 2.0, 2.0, 2.0]);
    for &l in row.logits() {
        assert!((l - 2.0 / 1.5).abs() < 1e-5, "{l}");
    }
    // Dynamic: a nearly one-hot row has entropy ~0 -> ~(t - range).
    let row = run(t(1.0, 0.5, 1.0), &[], &[30.0, 0.0, 0.0, 0.0]);
    assert!((row.logits()[0] - 60.0).abs() < 0.1, "{:?}", row.logits());
    // The set keeps its order (no sort) and gets normalised probabilities.
    let row = run(t(1.0, 0.5, 1.0), &[], &[0.0, 30.0, 1.0, 0.0]);
    assert_eq!(row.ids(), &[0, 1, 2, 3]);
    assert!(!row.is_sorted() && row.is_normalized());
    let p = row.probs().unwrap();
    assert!(
        p[1] > 0.99 && (p.iter().sum::<f32>() - 1.0).abs() < 1e-6,
        "{p:?}"
    );
}

#[test]
fn dist_select_edges() {
    let ninf = f32::NEG_INFINITY;
    // u = 0 picks the first positive-probability token in id order.
    let mut row = Candidates::from_logits(&[ninf, 1.0, 0.0]);
    assert_eq!(dist_select(&mut row, 0.0), Ok(1));
    // u just below 1 picks the last positive-probability token in id order.
    let mut row = Candidates::from_logits(&[1.0, 0.0, ninf]);
    assert_eq!(dist_select(&mut row, 0.999_999_999), Ok(1));
    // Probabilities are written in the current order; order and sortedness kept.
    let mut row = Candidates::from_logits(&[0.0, 2.0, 1.0]);
    row.sort_desc();
    let i = dist_select(&mut row, 0.5).unwrap();
    assert!(row.is_sorted());
    assert_eq!(row.ids(), &[1, 2, 0]);
    assert_eq!(row.selected(), Some(i));
    let p = row.probs().unwrap();
    assert!(p[0] > p[1] && p[1] > p[2]);
    // Empty row.
    assert_eq!(
        dist_select(&mut Candidates::new(), 0.5),
        Err(SampleError::EmptyRow)
    );
    // Large vocabulary, few survivors in a scrambled order: same token as id order.
    let mut scrambled = Candidates::from_parts(
        vec![90_000, 5, 70_000, 12],
        vec![0.5, 1.0, 0.2, 0.9],
        100_000,
    )
    .unwrap();
    let mut ordered = Candidates::from_parts(
        vec![5, 12, 70_000, 90_000],
        vec![1.0, 0.9, 0.2, 0.5],
        100_000,
    )
    .unwrap();
    for k in 0..20 {
        let u = f64::from(k) / 20.0;
        let a = dist_select(&mut scrambled, u).unwrap();
        let b = dist_select(&mut ordered, u).unwrap();
        assert_eq!(scrambled.ids()[a], ordered.ids()[b], "u = {u}");
    }
}

#[test]
fn typical_keeps_the_most_typical_first() {
    // Golden-style: a peaked row keeps only the peak (score order, unsorted).
    let row = run(
        StageSpec::Typical {
            p: 0.5,
            min_keep: 0,
        },
        &[],
        &[0.97f32.ln(), 0.01f32.ln(), 0.01f32.ln(), 0.01f32.ln()],
    );
    assert_eq!(row.ids(), &[0]);
    // min_keep is honoured.
    let row = run(
        StageSpec::Typical {
            p: 0.5,
            min_keep: 3,
        },
        &[],
        &[0.97f32.ln(), 0.01f32.ln(), 0.01f32.ln(), 0.01f32.ln()],
    );
    assert_eq!(row.len(), 3);
}

/// Rows for the full-sort oracles: Zipf-like with scattered ranks, exact
/// ties (bf16-like rounding), `-inf` entries, flat rows, one huge spread.
fn oracle_rows() -> Vec<Vec<f32>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(36);
    let mut rows = Vec::new();
    for (n, shape) in [1usize, 2, 3, 7, 40, 100, 333, 1000, 5000, 20_000]
        .into_iter()
        .flat_map(|n| (0..4).map(move |s| (n, s)))
    {
        let row: Vec<f32> = (0..n)
            .map(|i| {
                let rank = ((i * 7919 + 13) % n + 1) as f32;
                let x = -1.2 * rank.ln() + rng.random_range(-0.3f32..0.3);
                match shape {
                    0 => x,
                    // bf16-like: 8 bits of mantissa, many exact ties.
                    1 => f32::from_bits(x.to_bits() & 0xffff_0000),
                    2 if i % 5 == 3 => f32::NEG_INFINITY,
                    2 => x,
                    _ => rng.random_range(-0.5f32..0.5),
                }
            })
            .collect();
        rows.push(row);
    }
    rows.push(vec![0.0, -200.0, -200.0, 5.0, -1e30, 5.0]);
    rows
}

/// `typical` without a full sort equals the documented rule computed with
/// one: softmax, surprise `ln S − (l − max)`, entropy, every candidate
/// sorted by (score, canonical order), the f32 walk.
#[test]
fn typical_matches_its_rule_with_a_full_sort() {
    for (r, logits) in oracle_rows().iter().enumerate() {
        for (p, min_keep) in [(0.2f32, 0usize), (0.5, 1), (0.9, 0), (0.95, 10), (0.999, 0)] {
            let got = run(StageSpec::Typical { p, min_keep }, &[], logits);
            // The oracle.
            let mut row = Candidates::from_logits(logits);
            row.softmax().unwrap();
            let probs = row.probs().unwrap().to_vec();
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits
                .iter()
                .map(|&l| sampler_core::numerics::exp(l - max))
                .collect();
            let sum = sampler_core::numerics::sum_f64_slice(&e);
            let mut lanes = [0.0f64; sampler_core::numerics::LANES];
            for (i, (&e, &l)) in e.iter().zip(logits).enumerate() {
                if e > 0.0 {
                    lanes[i % lanes.len()] += f64::from(e) * f64::from(l - max);
                }
            }
            let h = sum.ln() - sampler_core::numerics::combine(lanes) / sum;
            let score = |i: usize| (sum.ln() - f64::from(logits[i] - max) - h).abs();
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| {
                score(a).total_cmp(&score(b)).then_with(|| {
                    sampler_core::desc_cmp(logits[a], a as TokenId, logits[b], b as TokenId)
                })
            });
            let mut cum = 0.0f32;
            let mut keep = order.len();
            for (i, &at) in order.iter().enumerate() {
                cum += probs[at];
                if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
                    keep = i + 1;
                    break;
                }
            }
            let want: Vec<TokenId> = order[..keep].iter().map(|&i| i as TokenId).collect();
            assert_eq!(got.ids(), &want[..], "row {r}, p {p}, min_keep {min_keep}");
            let want_p: Vec<f32> = order[..keep].iter().map(|&i| probs[i]).collect();
            assert_eq!(got.probs().unwrap(), &want_p[..], "row {r}, p {p}");
        }
    }
}

/// `mirostat` (v1) without a full sort equals its rule computed with one:
/// the same kept set (sorted), the same token, the same `mu` afterwards;
/// over steps, so `mu` moves (and, with a large `tau`, reaches "keep all").
#[test]
fn mirostat_matches_its_rule_with_a_full_sort() {
    for (r, logits) in oracle_rows().iter().enumerate() {
        for (tau, eta, m) in [(5.0f32, 0.1f32, 100usize), (2.0, 0.5, 7), (12.0, 1.0, 2)] {
            let mut stage = build_stage(&StageSpec::Mirostat { tau, eta, m }).unwrap();
            let mut mu = 2.0 * tau;
            for step in 0..5u64 {
                let at = format!("row {r}, tau {tau}, m {m}, step {step}");
                let ctx = StageContext {
                    rng: RowRng {
                        seed: 9,
                        step,
                        stage_index: 0,
                    },
                };
                let mut got = Candidates::from_logits(logits);
                let out = stage.apply(&mut got, &ctx);
                // The oracle: softmax in id order, the full sort, the head.
                let mut row = Candidates::from_logits(logits);
                if row.softmax().is_err() {
                    assert!(out.is_err(), "{at}");
                    break;
                }
                out.unwrap();
                row.sort_desc();
                let probs = row.probs().unwrap();
                let pairs = (m - 1).min(row.len() - 1);
                let (mut tb, mut t2) = (0.0f64, 0.0f64);
                for i in 0..pairs {
                    let t = ((i as f64 + 2.0) / (i as f64 + 1.0)).ln();
                    tb += t * (f64::from(probs[i]) / f64::from(probs[i + 1])).ln();
                    t2 += t * t;
                }
                let s = tb / t2;
                let v = row.len() as f64;
                let k =
                    ((s - 1.0) * 2f64.powf(f64::from(mu)) / (1.0 - v.powf(1.0 - s))).powf(1.0 / s);
                let keep = if k.is_finite() {
                    (k.max(1.0) as usize).min(row.len())
                } else {
                    row.len()
                };
                let mut want = if keep < row.len() {
                    row.truncate(keep);
                    row
                } else {
                    Candidates::from_logits(logits)
                };
                let index = dist_select(&mut want, ctx.rng.uniform(0)).unwrap();
                assert_eq!(got.ids(), want.ids(), "{at}");
                assert_eq!(got.selected(), Some(index), "{at}");
                let p = want.probs().unwrap()[index];
                let token = want.ids()[index];
                stage.accept(token, TokenOrigin::Output);
                let next = mu - eta * (-p.log2() - tau);
                if next.is_finite() {
                    mu = next;
                }
                assert_eq!(stage.mirostat_mu(), Some(mu), "{at}");
            }
        }
    }
}

/// `xtc` without a sort removes what llama.cpp's rule removes (sort, scan
/// from the top while `p >= threshold`, drop all above the last such) and
/// keeps the rest in the order they came.
#[test]
fn xtc_matches_its_rule_with_a_full_sort() {
    for (r, logits) in oracle_rows().iter().enumerate() {
        for (threshold, min_keep) in [(0.1f32, 0usize), (0.0, 1), (0.02, 3), (0.3, 100), (0.5, 0)] {
            let spec = StageSpec::Xtc {
                probability: 1.0,
                threshold,
                min_keep,
            };
            let got = run(spec, &[], logits);
            let mut sorted = Candidates::from_logits(logits);
            if sorted.softmax().is_err() {
                continue;
            }
            sorted.sort_desc();
            let probs = sorted.probs().unwrap();
            let last = probs
                .iter()
                .take_while(|&&p| p >= threshold && p > 0.0)
                .count()
                .saturating_sub(1);
            let dropped: Vec<TokenId> =
                if logits.len() >= 2 && last > 0 && logits.len() - last >= min_keep {
                    sorted.ids()[..last].to_vec()
                } else {
                    Vec::new()
                };
            let want: Vec<TokenId> = (0..logits.len() as TokenId)
                .filter(|t| !dropped.contains(t))
                .collect();
            assert_eq!(got.ids(), &want[..], "row {r}, threshold {threshold}");
        }
    }
}

/// A token listed several times: its biases summed with a ban winning and
/// finite sums saturated (summing `MAX`, `MAX`, `-inf` in f32 gave NaN).
#[test]
fn logit_bias_sums_saturate_and_bans_win() {
    let max = f32::MAX;
    let cases: [(Vec<(TokenId, f32)>, f32); 5] = [
        (
            vec![(1, max), (1, max), (1, f32::NEG_INFINITY)],
            f32::NEG_INFINITY,
        ),
        (
            vec![(1, f32::NEG_INFINITY), (1, max), (1, max)],
            f32::NEG_INFINITY,
        ),
        (vec![(1, max), (1, max)], max),
        (vec![(1, -max), (1, -max)], -max),
        (vec![(1, 2.0), (1, -0.5)], 2.5),
    ];
    for (bias, want) in cases {
        let row = run(
            StageSpec::LogitBias { bias: bias.clone() },
            &[],
            &[1.0, 1.0, 0.0],
        );
        assert_eq!(row.logits()[1], want, "{bias:?}");
        assert_eq!(row.logits()[0], 1.0);
    }
}
