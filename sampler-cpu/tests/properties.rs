//! Property tests: arbitrary logits (NaN, ±inf, empty, one token, huge
//! values, ties) and arbitrary parameters never panic, never empty a
//! non-empty set, give normalised probabilities, and rows are independent.

use proptest::prelude::*;
use sampler_core::{Candidates, ChainSpec, HistoryScope, RowRng, StageContext, StageSpec};
use sampler_cpu::{build_chain, build_stage, sample_batch};

fn ctx(seed: u64) -> StageContext {
    StageContext {
        rng: RowRng {
            seed,
            step: 0,
            stage_index: 0,
        },
    }
}

/// One logit: mostly ordinary values, with ties, huge values and specials.
fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -20.0f32..20.0,
        2 => prop::sample::select(vec![0.0f32, 1.0, -1.0, 2.5]),
        1 => prop::sample::select(vec![f32::MAX, -f32::MAX, 1e30, -1e30]),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NAN),
    ]
}

fn finite_logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -20.0f32..20.0,
        2 => prop::sample::select(vec![0.0f32, 1.0, -1.0, 2.5]),
        1 => prop::sample::select(vec![f32::MAX, -f32::MAX, 1e30, -1e30]),
        1 => Just(f32::NEG_INFINITY),
    ]
}

fn unit() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => 0.0f32..=1.0,
        1 => prop::sample::select(vec![0.0f32, 1.0, 0.5, 1e-7]),
    ]
}

/// Any valid stage spec (parameters within their documented ranges).
fn stage() -> impl Strategy<Value = StageSpec> {
    let scope = prop::sample::select(vec![HistoryScope::PromptAndOutput, HistoryScope::Output]);
    prop_oneof![
        Just(StageSpec::Greedy),
        Just(StageSpec::Dist),
        (-3i64..70).prop_map(|k| StageSpec::TopK { k }),
        (unit(), 0usize..5).prop_map(|(p, min_keep)| StageSpec::TopP { p, min_keep }),
        (0.0f32..2.0, 0usize..5).prop_map(|(p, min_keep)| StageSpec::MinP { p, min_keep }),
        (unit(), 0usize..5).prop_map(|(p, min_keep)| StageSpec::Typical { p, min_keep }),
        (
            prop_oneof![0.0f32..3.0, Just(0.0), Just(1e-6), Just(1.0)],
            prop_oneof![Just(0.0f32), 0.0f32..2.0],
            0.0f32..3.0
        )
            .prop_map(
                |(t, dynatemp_range, dynatemp_exponent)| StageSpec::Temperature {
                    t,
                    dynatemp_range,
                    dynatemp_exponent
                }
            ),
        (unit(), unit(), 0usize..5).prop_map(|(probability, threshold, min_keep)| {
            StageSpec::Xtc {
                probability,
                threshold,
                min_keep,
            }
        }),
        (-1.0f32..4.0).prop_map(|n| StageSpec::TopNSigma { n }),
        (0.0f32..10.0, 0.0f32..1.0, 1usize..120).prop_map(|(tau, eta, m)| StageSpec::Mirostat {
            tau,
            eta,
            m
        }),
        (0.0f32..10.0, 0.0f32..1.0).prop_map(|(tau, eta)| StageSpec::MirostatV2 { tau, eta }),
        (
            0usize..10,
            0.1f32..3.0,
            -2.0f32..2.0,
            -2.0f32..2.0,
            scope.clone()
        )
            .prop_map(|(last_n, repeat, frequency, presence, scope)| {
                StageSpec::Penalties {
                    last_n,
                    repeat,
                    frequency,
                    presence,
                    scope,
                }
            }),
        (
            0.0f32..3.0,
            1.0f32..3.0,
            0usize..4,
            0usize..12,
            prop::collection::vec(prop::collection::vec(0u32..8, 1..3), 0..3),
            scope.clone()
        )
            .prop_map(
                |(multiplier, base, allowed_length, last_n, seq_breakers, scope)| {
                    StageSpec::Dry {
                        multiplier,
                        base,
                        allowed_length,
                        last_n,
                        seq_breakers,
                        scope,
                    }
                }
            ),
        prop::collection::vec(
            (
                0u32..8,
                prop_oneof![-5.0f32..5.0, Just(f32::NEG_INFINITY), Just(f32::MAX)]
            ),
            0..4
        )
        .prop_map(|bias| StageSpec::LogitBias { bias }),
        (0usize..4, scope).prop_map(|(n, scope)| StageSpec::NoRepeatNgram { n, scope }),
    ]
}

fn min_keep_of(s: &StageSpec) -> usize {
    match *s {
        StageSpec::TopP { min_keep, .. }
        | StageSpec::MinP { min_keep, .. }
        | StageSpec::Typical { min_keep, .. }
        | StageSpec::Xtc { min_keep, .. } => min_keep,
        _ => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any valid stage on any row: no panic; a non-empty set stays non-empty
    /// and keeps at least min(drawable, max(1, min_keep)) candidates, where
    /// drawable counts the finite logits (a `-inf`, banned candidate is never
    /// kept for min_keep; at least one candidate always stays); probabilities,
    /// when normalised, sum to 1.
    #[test]
    fn single_stage_never_panics_or_empties(
        logits in prop::collection::vec(finite_logit(), 0..40),
        spec in stage(),
        history in prop::collection::vec(0u32..8, 0..12),
        seed in any::<u64>(),
    ) {
        let mut s = build_stage(&spec).expect("valid spec");
        for &t in &history {
            s.accept(t, sampler_core::TokenOrigin::Output);
        }
        let mut row = Candidates::from_logits(&logits);
        let n = row.len();
        let r = s.apply(&mut row, &ctx(seed));
        if r.is_ok() && n > 0 {
            let drawable = logits.iter().filter(|l| l.is_finite()).count().max(1);
            let floor = n.min(drawable).min(min_keep_of(&spec).max(1));
            prop_assert!(row.len() >= floor, "{spec:?}: {} < {floor}", row.len());
        }
        if row.is_normalized() {
            let sum: f64 = row.probs().unwrap_or(&[]).iter().map(|&p| f64::from(p)).sum();
            prop_assert!((sum - 1.0).abs() < 1e-5, "sum {sum}");
        }
        if let Some(sel) = row.selected() {
            prop_assert!(sel < row.len());
        }
        // Logits never become +inf or NaN.
        prop_assert!(row.logits().iter().all(|l| !l.is_nan() && *l != f32::INFINITY));
    }

    /// Random chains over arbitrary rows (NaN and +inf included): no panic;
    /// invalid rows are errors, valid rows either select a token within the
    /// set or give a documented error.
    #[test]
    fn chains_never_panic(
        logits in prop::collection::vec(logit(), 0..40),
        mut stages in prop::collection::vec(stage(), 0..5),
        tail in prop::sample::select(vec![StageSpec::Dist, StageSpec::Greedy]),
        seed in any::<u64>(),
    ) {
        stages.push(tail);
        let mut chain = build_chain(&ChainSpec::new(stages, Some(seed))).expect("valid");
        let mut row = Candidates::from_logits(&logits);
        let invalid = logits.is_empty() || logits.iter().any(|l| l.is_nan() || *l == f32::INFINITY);
        match chain.sample(&mut row) {
            Ok(t) => {
                prop_assert!(!invalid);
                prop_assert!((t as usize) < logits.len());
                // A banned (-inf) token is never drawn.
                prop_assert!(logits[t as usize] != f32::NEG_INFINITY);
            }
            Err(e) => {
                use sampler_core::SampleError::*;
                prop_assert!(
                    matches!(e, EmptyRow | NanLogit { .. } | PosInfLogit { .. } | AllMasked | TokenOutOfRange { .. } | NoSelectingStage),
                    "unexpected error {e:?}"
                );
            }
        }
    }

    /// Normalised probabilities after dist sum to 1 within 1e-5 and the
    /// selected token has positive probability.
    #[test]
    fn dist_probs_sum_to_one(
        logits in prop::collection::vec(finite_logit(), 1..60),
        seed in any::<u64>(),
    ) {
        let mut row = Candidates::from_logits(&logits);
        match sampler_cpu::dist_select(&mut row, sampler_core::rng::uniform(seed, 0, 0)) {
            Ok(i) => {
                let probs = row.probs().expect("probs");
                let sum: f64 = probs.iter().map(|&p| f64::from(p)).sum();
                prop_assert!((sum - 1.0).abs() < 1e-5, "sum {sum}");
                prop_assert!(probs[i] > 0.0);
                prop_assert!(logits[row.ids()[i] as usize] > f32::NEG_INFINITY);
            }
            Err(e) => {
                prop_assert_eq!(e, sampler_core::SampleError::AllMasked);
                prop_assert!(logits.iter().all(|&l| l == f32::NEG_INFINITY));
            }
        }
    }

    /// dist picks the same token whatever the candidate order (canonical id order).
    #[test]
    fn dist_token_independent_of_order(
        logits in prop::collection::vec(-10.0f32..10.0, 1..50),
        u in 0.0f64..1.0,
        k in 1usize..50,
    ) {
        let mut a = Candidates::from_logits(&logits);
        let mut b = Candidates::from_logits(&logits);
        b.top_k_sorted(logits.len()); // same set, sorted order
        let ia = sampler_cpu::dist_select(&mut a, u).expect("finite row");
        let ib = sampler_cpu::dist_select(&mut b, u).expect("finite row");
        prop_assert_eq!(a.ids()[ia], b.ids()[ib]);
        // And after a top-k, the token is one of the survivors.
        let mut c = Candidates::from_logits(&logits);
        c.top_k_sorted(k);
        let ic = sampler_cpu::dist_select(&mut c, u).expect("finite row");
        prop_assert!(ic < c.len());
    }

    /// top_k keeps exactly min(k, n), sorted, and they are the k largest.
    #[test]
    fn top_k_keeps_min_k_n(
        logits in prop::collection::vec(finite_logit(), 1..80),
        k in 1i64..100,
    ) {
        let mut s = build_stage(&StageSpec::TopK { k }).expect("valid");
        let mut row = Candidates::from_logits(&logits);
        s.apply(&mut row, &ctx(0)).expect("top_k");
        let n = logits.len();
        prop_assert_eq!(row.len(), (k as usize).min(n));
        prop_assert!(row.is_sorted());
        let mut all = logits.clone();
        all.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
        for (i, &l) in row.logits().iter().enumerate() {
            prop_assert_eq!(l.to_bits(), all[i].to_bits());
        }
    }

    /// Same seed, same tokens; a row's tokens do not depend on its batch
    /// position or on the other rows.
    #[test]
    fn rows_are_independent(
        rows in prop::collection::vec(prop::collection::vec(-8.0f32..8.0, 12), 2..6),
        seeds in prop::collection::vec(any::<u64>(), 6),
        probe in 0usize..6,
    ) {
        let batch = rows.len();
        let probe = probe % batch;
        let vocab = 12;
        let spec = |seed| ChainSpec::new(vec![
            StageSpec::TopK { k: 8 },
            StageSpec::Temperature { t: 0.9, dynatemp_range: 0.0, dynatemp_exponent: 1.0 },
            StageSpec::TopP { p: 0.95, min_keep: 1 },
            StageSpec::Dist,
        ], Some(seed));
        let steps = 4;
        // The probe row alone.
        let mut alone = vec![build_chain(&spec(seeds[probe])).expect("valid")];
        let mut alone_tokens = Vec::new();
        for _ in 0..steps {
            let out = sample_batch(&rows[probe], 1, vocab, &mut alone).expect("shape");
            alone_tokens.push(out[0].clone().expect("valid row"));
        }
        // The whole batch, then the batch reversed (probe at another position).
        for reversed in [false, true] {
            let order: Vec<usize> = if reversed { (0..batch).rev().collect() } else { (0..batch).collect() };
            let flat: Vec<f32> = order.iter().flat_map(|&r| rows[r].iter().copied()).collect();
            let mut chains: Vec<_> = order.iter().map(|&r| build_chain(&spec(seeds[r])).expect("valid")).collect();
            let pos = order.iter().position(|&r| r == probe).expect("probe present");
            let mut tokens = Vec::new();
            for _ in 0..steps {
                let out = sample_batch(&flat, batch, vocab, &mut chains).expect("shape");
                tokens.push(out[pos].clone().expect("valid row"));
            }
            prop_assert_eq!(&tokens, &alone_tokens);
        }
    }
}

#[test]
fn batch_shape_and_chain_count_are_outer_errors() {
    let spec = ChainSpec::new(vec![StageSpec::Greedy], Some(1));
    let mut chains = vec![build_chain(&spec).unwrap()];
    assert!(matches!(
        sample_batch(&[0.0; 5], 2, 3, &mut chains),
        Err(sampler_core::SampleError::Shape {
            len: 5,
            batch: 2,
            vocab: 3,
            expected: 6
        })
    ));
    assert!(matches!(
        sample_batch(&[0.0; 6], 2, 3, &mut chains),
        Err(sampler_core::SampleError::ChainCount {
            chains: 1,
            batch: 2
        })
    ));
    // vocab 0: every row is an empty-row error, no panic.
    let mut two = vec![build_chain(&spec).unwrap(), build_chain(&spec).unwrap()];
    let out = sample_batch(&[], 2, 0, &mut two).unwrap();
    assert_eq!(out, vec![Err(sampler_core::SampleError::EmptyRow); 2]);
}
