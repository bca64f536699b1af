//! CPU-vs-device equivalence: random chains of
//! device-capable stages, random logits (ties, `-inf`, NaN rows), random
//! seeds and per-row parameters. For every split point and every device
//! built, each row's token equals the CPU reference, unless the row's draw
//! lies within float rounding of a boundary; such rows are reported
//! (printed with the reason) and counted, never silently accepted.

mod device_support;

use std::sync::atomic::{AtomicUsize, Ordering};

use device_support::{boundary_reason, cpu_step, device_step};
use proptest::prelude::*;
use sampler_backend::burn_tensor::Device;
use sampler_core::{ChainSpec, HistoryScope, OffloadPolicy, StageSpec as S, TokenId};

static CHECKED: AtomicUsize = AtomicUsize::new(0);
static BOUNDARY: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone)]
struct Case {
    rows: Vec<ChainSpec>,
    logits: Vec<f32>,
    vocab: usize,
    prompts: Vec<Vec<TokenId>>,
}

/// One stage kind with per-row parameters drawn by `pick(row)`.
fn stage_for(kind: u8, r: &mut impl FnMut() -> u32, vocab: usize) -> S {
    match kind {
        0 => S::TopK {
            k: [0i64, 1, 2, 3, 5, 8, 40, 1000][(r() % 8) as usize],
        },
        1 => S::TopP {
            p: [0.0f32, 0.3, 0.5, 0.7, 0.9, 0.95, 1.0][(r() % 7) as usize],
            min_keep: [0usize, 0, 1, 3][(r() % 4) as usize],
        },
        2 => S::MinP {
            p: [0.0f32, 0.05, 0.2, 0.5, 1.0, 1.05][(r() % 6) as usize],
            min_keep: [0usize, 0, 2][(r() % 3) as usize],
        },
        3 => S::Temperature {
            t: [0.0f32, 0.5, 0.8, 1.0, 1.5][(r() % 5) as usize],
            dynatemp_range: [0.0f32, 0.0, 0.5][(r() % 3) as usize],
            dynatemp_exponent: [1.0f32, 0.0, 2.0][(r() % 3) as usize],
        },
        4 => S::Penalties {
            last_n: [0usize, 3, 64][(r() % 3) as usize],
            repeat: [1.0f32, 1.3, 2.0][(r() % 3) as usize],
            frequency: [0.0f32, 0.2][(r() % 2) as usize],
            presence: [0.0f32, 0.5][(r() % 2) as usize],
            scope: if r().is_multiple_of(2) {
                HistoryScope::PromptAndOutput
            } else {
                HistoryScope::Output
            },
        },
        5 => S::Epsilon {
            epsilon: [0.0f32, 0.01, 0.05, 0.2, 0.6][(r() % 5) as usize],
            min_keep: [0usize, 0, 1, 3][(r() % 4) as usize],
        },
        6 => S::Eta {
            epsilon: [0.0f32, 0.001, 0.02, 0.2, 0.9][(r() % 5) as usize],
            min_keep: [0usize, 0, 2][(r() % 3) as usize],
        },
        7 => S::Typical {
            p: [0.2f32, 0.5, 0.9, 0.95, 1.0][(r() % 5) as usize],
            min_keep: [0usize, 0, 2][(r() % 3) as usize],
        },
        _ => {
            let n = r() % 3;
            S::LogitBias {
                bias: (0..n)
                    .map(|_| {
                        let t = r() as usize % vocab;
                        let b = [2.0f32, -1.0, f32::NEG_INFINITY, 0.5][(r() % 4) as usize];
                        (t as TokenId, b)
                    })
                    .collect(),
            }
        }
    }
}

/// Random cases. `few_shapes`: only `[3, 16]` and `[3, 300]` (cubecl devices
/// compile kernels per shape, seconds each on lavapipe).
fn case(few_shapes: bool) -> BoxedStrategy<Case> {
    let shape = if few_shapes {
        (
            Just(3usize),
            prop_oneof![3 => Just(16usize), 1 => Just(300usize)],
        )
            .boxed()
    } else {
        (1usize..4, prop_oneof![4 => 2usize..40, 1 => 257usize..420]).boxed()
    };
    (
        prop::collection::vec(0u8..9, 0..4),
        0u8..3,
        shape,
        any::<u64>(),
    )
        .prop_map(|(kinds, last, (batch, vocab), seed)| {
            let mut state = seed | 1;
            let mut r = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 16) as u32
            };
            let rows: Vec<ChainSpec> = (0..batch)
                .map(|_| {
                    let mut st: Vec<S> =
                        kinds.iter().map(|&k| stage_for(k, &mut r, vocab)).collect();
                    match last {
                        0 => st.push(S::Dist),
                        1 => st.push(S::Greedy),
                        _ => st.push(S::Dist),
                    }
                    ChainSpec::new(st, Some(r() as u64))
                })
                .collect();
            let mut logits = Vec::with_capacity(batch * vocab);
            for _ in 0..batch {
                let style = r() % 4;
                for _ in 0..vocab {
                    let x = match style {
                        // Coarse values: many ties.
                        0 => (r() % 5) as f32 - 2.0,
                        1 => (r() % 1000) as f32 * 0.01 - 5.0,
                        2 => {
                            if r().is_multiple_of(4) {
                                f32::NEG_INFINITY
                            } else {
                                (r() % 7) as f32 * 0.5
                            }
                        }
                        _ => ((r() % 10_000) as f32 * 1e-3).ln(),
                    };
                    logits.push(x);
                }
            }
            // Sometimes a NaN row.
            if r().is_multiple_of(10) {
                let row = (r() as usize) % batch;
                let pos = (r() as usize) % vocab;
                logits[row * vocab + pos] = f32::NAN;
            }
            let prompts = (0..batch)
                .map(|_| (0..r() % 6).map(|_| r() % vocab as u32).collect())
                .collect();
            Case {
                rows,
                logits,
                vocab,
                prompts,
            }
        })
        .boxed()
}

fn check(d: &Device, name: &str, c: &Case) -> Result<(), String> {
    let want = cpu_step(&c.rows, &c.logits, c.vocab, &c.prompts);
    let n_stages = c.rows[0].stages.len();
    let mut policies = vec![OffloadPolicy::Device, OffloadPolicy::Off];
    policies.extend((0..n_stages).map(OffloadPolicy::Stages));
    for policy in policies {
        let (out, ex) = device_step(&c.rows, &c.logits, c.vocab, d, policy, &c.prompts);
        for (r, (got, want)) in out.tokens.iter().zip(&want).enumerate() {
            CHECKED.fetch_add(1, Ordering::Relaxed);
            if got == want {
                continue;
            }
            let row = &c.logits[r * c.vocab..(r + 1) * c.vocab];
            match boundary_reason(&c.rows[r], row, &c.prompts[r]) {
                Some(why) => {
                    BOUNDARY.fetch_add(1, Ordering::Relaxed);
                    println!(
                        "TIE-BOUNDARY EXCEPTION [{name}] row {r} policy {policy:?}: device {got:?} vs cpu {want:?}: {why}"
                    );
                }
                None => {
                    return Err(format!(
                        "[{name}] row {r} policy {policy:?} plan:\n{}\ndevice {got:?} != cpu {want:?}\nchain {:?}\nrow {row:?}\nprompt {:?}",
                        ex.plan(),
                        c.rows[r],
                        c.prompts[r]
                    ));
                }
            }
        }
    }
    Ok(())
}

fn equivalence_random_chains(d: &Device, name: &str) {
    let cases = std::env::var("EQUIV_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if name == "flex" || name == "ndarray" {
            256
        } else {
            24
        });
    let few_shapes = !(name == "flex" || name == "ndarray");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&case(few_shapes), |c| {
            check(d, name, &c).map_err(TestCaseError::fail)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "[{name}] equivalence: {} row-checks, {} tie-boundary exceptions",
        CHECKED.load(Ordering::Relaxed),
        BOUNDARY.load(Ordering::Relaxed)
    );
}

device_tests!(equivalence_random_chains);
