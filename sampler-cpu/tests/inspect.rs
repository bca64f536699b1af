//! `Chain::inspect` (the per-stage view of one row) against the reference
//! stages: after each stage the recorded set is what applying the chain's
//! stages up to it gives (survivors, their logits in canonical order,
//! probabilities renormalised over them), the masses kept are the sets'
//! own sums, the token is what `Chain::sample_logits` draws with the same
//! seed and state (over several steps, so history and step counters stay
//! in sync), and `dist`'s uniform draws that token from the final set.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_core::{Candidates, ChainSpec, HistoryScope, StageSpec as S, TokenId};

fn temp(t: f32) -> S {
    S::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

/// A pool of stages; a chain is a few of them and a selecting stage.
fn pool(x: f32, k: i64) -> Vec<S> {
    vec![
        S::TopK { k },
        S::TopP { p: x, min_keep: 0 },
        S::MinP {
            p: x * 0.3,
            min_keep: 1,
        },
        temp(0.5 + x),
        S::Typical { p: x, min_keep: 0 },
        S::Penalties {
            last_n: 6,
            repeat: 1.4,
            frequency: 0.3,
            presence: 0.2,
            scope: HistoryScope::PromptAndOutput,
        },
        S::TopNSigma { n: 1.0 + x },
        S::Xtc {
            probability: 0.5,
            threshold: 0.1,
            min_keep: 1,
        },
    ]
}

/// The reference set after stages `..=i`: the survivors of the stages'
/// own output, sorted (logit descending, id ascending), softmax in f64.
fn reference(row: &Candidates) -> (Vec<TokenId>, Vec<f32>, Vec<f64>) {
    let mut v: Vec<(TokenId, f32)> = row
        .ids()
        .iter()
        .zip(row.logits())
        .filter(|(_, l)| l.is_finite() || **l == f32::INFINITY)
        .map(|(&i, &l)| (i, l))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let max = v.first().map_or(0.0, |x| x.1);
    let e: Vec<f64> = v
        .iter()
        .map(|x| (f64::from(x.1) - f64::from(max)).exp())
        .collect();
    let s: f64 = e.iter().sum();
    let (ids, logits) = v.into_iter().unzip();
    (ids, logits, e.into_iter().map(|x| x / s).collect())
}

fn check(stages: Vec<S>, seed: u64, vocab: usize, rows: &[Vec<f32>]) {
    let spec = ChainSpec::new(stages.clone(), Some(seed));
    let mut seen = sampler_cpu::build_chain(&spec).unwrap();
    let mut plain = sampler_cpu::build_chain(&spec).unwrap();
    seen.accept_prompt(&[1, 2, 2]);
    plain.accept_prompt(&[1, 2, 2]);
    for (step, row) in rows.iter().enumerate() {
        let before = seen.clone();
        let got = seen.inspect(row);
        let want = plain.sample_logits(row);
        let got = match (got, want) {
            (Ok(g), Ok(w)) => {
                assert_eq!(g.token, w, "{stages:?} step {step}");
                g
            }
            (Err(g), Err(w)) => {
                assert_eq!(g, w, "{stages:?} step {step}");
                // Nothing committed: both chains stay in step.
                assert_eq!(seen.step(), before.step());
                continue;
            }
            (g, w) => panic!("{stages:?} step {step}: inspect {g:?}, sample {w:?}"),
        };
        assert_eq!(got.step, step as u64);
        assert_eq!(got.input.survivors(), vocab);
        let mut prev_probs = got.input.clone();
        for (i, view) in got.stages.iter().enumerate() {
            let mut r = Candidates::from_logits(row);
            let mut c = before.clone();
            c.apply_stages(0..i + 1, &mut r).unwrap();
            let (ids, logits, probs) = reference(&r);
            let what = format!("{stages:?} step {step} stage {i} ({})", view.name);
            assert_eq!(view.index, i);
            assert_eq!(view.set.ids, ids, "{what}");
            assert_eq!(view.set.logits, logits, "{what}");
            for (a, b) in view.set.probs.iter().zip(&probs) {
                assert!((a - b).abs() < 1e-9, "{what}: {a} vs {b}");
            }
            // Masses: what the set before gave to the survivors.
            let kept: f64 = prev_probs
                .ids
                .iter()
                .zip(&prev_probs.probs)
                .filter(|(id, _)| ids.contains(id))
                .map(|(_, p)| p)
                .sum();
            assert!((view.mass_kept - kept).abs() < 1e-9, "{what}");
            if view.noop {
                assert_eq!(view.set, prev_probs, "{what}: a no-op changes nothing");
            }
            prev_probs = view.set.clone();
        }
        let last = got.stages.last().unwrap();
        assert!(last.set.ids.contains(&got.token));
        if stages.last() == Some(&S::Dist) {
            // The uniform draws the token by inverse CDF over the final
            // set in ascending id order.
            let u = got.uniform.expect("dist draws");
            let mut by_id: Vec<(TokenId, f64)> = last
                .set
                .ids
                .iter()
                .copied()
                .zip(last.set.probs.clone())
                .collect();
            by_id.sort_by_key(|x| x.0);
            let mut cum = 0.0;
            let drawn = by_id
                .iter()
                .find(|x| {
                    cum += x.1;
                    cum >= u - 1e-9
                })
                .map_or(by_id.last().unwrap().0, |x| x.0);
            // Rounding may put u on a boundary: the neighbour in id order.
            let at = |t: TokenId| by_id.iter().position(|x| x.0 == t).unwrap() as i64;
            assert!((at(drawn) - at(got.token)).abs() <= 1, "{stages:?} u {u}");
        } else {
            // `greedy` draws nothing; mirostat draws with its own uniform.
            let draws = stages.last() != Some(&S::Greedy);
            assert_eq!(got.uniform.is_some(), draws, "{stages:?}");
        }
    }
    assert_eq!(seen.step(), plain.step());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn inspect_records_the_reference_stages(
        picks in proptest::collection::vec(0usize..8, 0..4),
        x in 0.05f32..0.95,
        k in 1i64..20,
        greedy in any::<bool>(),
        seed in any::<u64>(),
        vocab in 2usize..48,
    ) {
        let pool = pool(x, k);
        let mut stages: Vec<S> = picks.iter().map(|&i| pool[i].clone()).collect();
        stages.push(if greedy { S::Greedy } else { S::Dist });
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let rows: Vec<Vec<f32>> = (0..3)
            .map(|_| (0..vocab).map(|_| f32::from(rng.random_range(-12i8..12)) * 0.5).collect())
            .collect();
        check(stages, seed, vocab, &rows);
    }
}

/// Mirostat draws with its own uniform; a bad row is the row's error and
/// commits nothing; a chain that cannot select is refused.
#[test]
fn mirostat_bad_rows_and_no_selection() {
    let rows: Vec<Vec<f32>> = (0..4)
        .map(|s| (0..16).map(|i| ((i * 5 + s) % 7) as f32).collect())
        .collect();
    check(vec![S::MirostatV2 { tau: 2.0, eta: 0.2 }], 3, 16, &rows);
    let spec = ChainSpec::new(vec![S::Dist], Some(1));
    let mut c = sampler_cpu::build_chain(&spec).unwrap();
    let mut bad = vec![0.0f32; 8];
    bad[3] = f32::NAN;
    assert_eq!(
        c.inspect(&bad).unwrap_err(),
        sampler_core::SampleError::NanLogit { index: 3 }
    );
    assert_eq!(c.step(), 0);
    let mut none = sampler_cpu::build_chain(&ChainSpec::new(vec![temp(0.7)], Some(1))).unwrap();
    assert_eq!(
        none.inspect(&[0.0, 1.0]).unwrap_err(),
        sampler_core::SampleError::NoSelectingStage
    );
}
