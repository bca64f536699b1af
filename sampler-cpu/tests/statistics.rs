//! Statistical tests: tokens drawn through `filter; dist` follow the
//! filtered, renormalised distribution.
//!
//! Method: Pearson's chi-square goodness of fit. For each filter, N draws
//! with a fixed seed (the chain's step advances, so every draw uses fresh
//! contract-7 uniforms); expected counts are `N · softmax(logits of the
//! survivors)`; categories with an expected count below 5 are pooled. The
//! p-value is the upper tail of the chi-square distribution with
//! `categories − 1` degrees of freedom, computed from the regularised
//! incomplete gamma function below. A test fails when `p < ALPHA`.
//!
//! False-alarm rate: ALPHA = 1e-4 per goodness-of-fit check for a correct
//! sampler; with 9 fixed-seed checks (dist, top_k, top_p, min_p, typical,
//! three temperatures, top_n_sigma) the family-wise rate is below 9e-4, and
//! since seeds are fixed the outcome is deterministic (a pass stays a pass). Tokens outside
//! the filtered set must never be drawn (checked exactly).

use sampler_core::{Candidates, ChainSpec, StageSpec};
use sampler_cpu::build_chain;

mod chi2;
use chi2::{chi2_sf, p_value};

/// Per-test false-alarm rate.
const ALPHA: f64 = 1e-4;
/// Draws per test.
const N: usize = 40_000;

#[test]
fn chi_square_tail_matches_tables() {
    // Critical values from standard tables: (df, x, upper tail).
    for (df, x, p) in [
        (1, 3.841_458_820_694_124, 0.05),
        (1, 15.136_705_226_623_606, 1e-4),
        (10, 18.307_038_053_275_146, 0.05),
        (10, 35.564_013_915_7, 1e-4),
        (30, 43.772_971_825_742_19, 0.05),
    ] {
        let got = chi2_sf(x, df);
        assert!(
            (got - p).abs() < p * 1e-6,
            "df {df}: Q = {got}, expected {p}"
        );
    }
    // And the Wilson–Hilferty approximation agrees on the critical value.
    let z = 3.719_016_485_455_68; // standard normal upper 1e-4 quantile
    let df = 10.0f64;
    let wh = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    assert!((chi2_sf(wh, 10) - 1e-4).abs() < 2e-5);
}

/// Logits of 14 tokens, not in sorted order, with a tie.
fn row() -> Vec<f32> {
    vec![
        0.3, 2.0, -1.0, 1.2, 1.2, -0.4, 0.9, -2.5, 1.7, 0.0, -3.0, 0.6, -0.2, 1.5,
    ]
}

/// Sample N tokens through `stages; dist` and compare with the survivors'
/// renormalised softmax. Returns the p-value.
fn check(stages: Vec<StageSpec>, seed: u64) -> f64 {
    let logits = row();
    let vocab = logits.len();
    // Expected distribution: the filter alone, then softmax of the survivors.
    let mut filter = build_chain(&ChainSpec::new(stages.clone(), Some(seed))).expect("valid");
    let mut survivors = Candidates::from_logits(&logits);
    filter.apply(&mut survivors).expect("apply");
    survivors.softmax().expect("some survivor");
    let mut expected = vec![0.0f64; vocab];
    for (&id, &p) in survivors.ids().iter().zip(survivors.probs().expect("p")) {
        expected[id as usize] += f64::from(p);
    }
    let mut full = stages;
    full.push(StageSpec::Dist);
    let mut chain = build_chain(&ChainSpec::new(full, Some(seed))).expect("valid");
    let mut counts = vec![0usize; vocab];
    let mut cands = Candidates::new();
    for _ in 0..N {
        cands.fill_from_logits(&logits);
        let t = chain.sample(&mut cands).expect("sample");
        counts[t as usize] += 1;
    }
    for (t, (&c, &e)) in counts.iter().zip(&expected).enumerate() {
        assert!(
            e > 0.0 || c == 0,
            "token {t} is outside the filtered set but was drawn {c} times"
        );
    }
    p_value(&counts, &expected)
}

fn assert_fits(name: &str, stages: Vec<StageSpec>, seed: u64) {
    let p = check(stages, seed);
    assert!(p >= ALPHA, "{name}: chi-square p-value {p} < alpha {ALPHA}");
}

#[test]
fn dist_matches_softmax() {
    assert_fits("dist", vec![], 11);
}

#[test]
fn top_k_matches_renormalised() {
    assert_fits("top_k(5)", vec![StageSpec::TopK { k: 5 }], 12);
}

#[test]
fn top_p_matches_renormalised() {
    assert_fits(
        "top_p(0.8)",
        vec![StageSpec::TopP {
            p: 0.8,
            min_keep: 1,
        }],
        13,
    );
}

#[test]
fn epsilon_matches_renormalised() {
    assert_fits(
        "epsilon(0.02)",
        vec![StageSpec::Epsilon {
            epsilon: 0.02,
            min_keep: 1,
        }],
        21,
    );
}

#[test]
fn eta_matches_renormalised() {
    assert_fits(
        "eta(0.05)",
        vec![StageSpec::Eta {
            epsilon: 0.05,
            min_keep: 0,
        }],
        22,
    );
}

#[test]
fn min_p_matches_renormalised() {
    assert_fits(
        "min_p(0.2)",
        vec![StageSpec::MinP {
            p: 0.2,
            min_keep: 1,
        }],
        14,
    );
}

#[test]
fn typical_matches_renormalised() {
    assert_fits(
        "typical(0.6)",
        vec![StageSpec::Typical {
            p: 0.6,
            min_keep: 1,
        }],
        15,
    );
}

#[test]
fn temperature_matches_scaled_softmax() {
    for (t, range) in [(0.7, 0.0), (1.6, 0.0), (0.9, 0.5)] {
        assert_fits(
            "temperature",
            vec![StageSpec::Temperature {
                t,
                dynatemp_range: range,
                dynatemp_exponent: 1.0,
            }],
            16,
        );
    }
}

#[test]
fn top_n_sigma_matches_renormalised() {
    assert_fits("top_n_sigma(1)", vec![StageSpec::TopNSigma { n: 1.0 }], 17);
}

/// The test has power: a distribution that ignores the filter is rejected.
#[test]
fn chi_square_rejects_a_wrong_distribution() {
    let logits = row();
    let mut chain = build_chain(&ChainSpec::new(
        vec![
            StageSpec::Temperature {
                t: 0.8,
                dynatemp_range: 0.0,
                dynatemp_exponent: 1.0,
            },
            StageSpec::Dist,
        ],
        Some(18),
    ))
    .expect("valid");
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..N {
        let t = chain
            .sample(&mut Candidates::from_logits(&logits))
            .expect("sample");
        counts[t as usize] += 1;
    }
    // Claim the draws follow temperature 1 instead of 0.8.
    let mut wrong = Candidates::from_logits(&logits);
    wrong.softmax().expect("finite");
    let expected: Vec<f64> = wrong
        .probs()
        .expect("p")
        .iter()
        .map(|&p| f64::from(p))
        .collect();
    let p = p_value(&counts, &expected);
    assert!(p < ALPHA, "a wrong distribution was accepted (p = {p})");
}
