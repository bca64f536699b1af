//! Epsilon and eta sampling (Hugging Face transformers' `EpsilonLogitsWarper`
//! and `EtaLogitsWarper`): hand-computed cases with ties and `min_keep`, on
//! the CPU reference and on every compiled device, and same tokens for the
//! same seed on the CPU and the devices.

mod device_support;

use device_support::{cpu_step, device_step, ln, upload};
use sampler_backend::Executor;
use sampler_backend::burn_tensor::Device;
use sampler_core::{Candidates, ChainSpec, OffloadPolicy, StageSpec as S, TokenId};

/// `(name, stage, logits, surviving ids)`, each computed by hand from the
/// transformers definitions.
fn cases() -> Vec<(&'static str, S, Vec<f32>, Vec<TokenId>)> {
    let eps = |epsilon, min_keep| S::Epsilon { epsilon, min_keep };
    let eta = |epsilon, min_keep| S::Eta { epsilon, min_keep };
    vec![
        // p = [0.5, 0.3, 0.15, 0.05]: only 0.05 is below 0.1.
        (
            "epsilon drops p < epsilon",
            eps(0.1, 0),
            ln(&[0.5, 0.3, 0.15, 0.05]),
            vec![0, 1, 2],
        ),
        // p = 0.25 exactly is not below 0.25 (the cut is strict `<`).
        (
            "epsilon keeps p == epsilon",
            eps(0.25, 0),
            vec![0.0; 4],
            vec![0, 1, 2, 3],
        ),
        // Every p (0.3, 0.3, 0.3, 0.1) is below 0.9; min_keep 2 keeps the two
        // highest logits and every token tied with the second: three tokens.
        (
            "epsilon min_keep keeps ties",
            eps(0.9, 2),
            ln(&[0.3, 0.3, 0.3, 0.1]),
            vec![0, 1, 2],
        ),
        // p = e^2 / (2 e^2 + 1) = 0.468 each for the two maxima, below 0.5:
        // min_keep 0 still keeps the maximum and its tie.
        (
            "epsilon keeps the tied maxima",
            eps(0.5, 0),
            vec![2.0, 2.0, 0.0],
            vec![0, 1],
        ),
        // Masked candidates have p = 0; p = [0.731, 0.269] both stay.
        (
            "epsilon with masked candidates",
            eps(0.2, 0),
            vec![1.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY],
            vec![0, 2],
        ),
        // p = [0.7, 0.2, 0.1]: H = 0.8018 nats, exp(-H) = 0.4485;
        // epsilon 0.3: eta = min(0.3, sqrt(0.3) * 0.4485 = 0.2457) = 0.2457.
        (
            "eta with the entropy cutoff",
            eta(0.3, 0),
            ln(&[0.7, 0.2, 0.1]),
            vec![0],
        ),
        // epsilon 0.15: eta = min(0.15, sqrt(0.15) * 0.4485 = 0.1737) = 0.15.
        (
            "eta with the epsilon cutoff",
            eta(0.15, 0),
            ln(&[0.7, 0.2, 0.1]),
            vec![0, 1],
        ),
        // epsilon 0.05: eta = 0.05, nothing below it.
        (
            "eta keeps everything above epsilon",
            eta(0.05, 0),
            ln(&[0.7, 0.2, 0.1]),
            vec![0, 1, 2],
        ),
        // Uniform over 4: H = ln 4, eta = min(0.2, sqrt(0.2) / 4 = 0.1118);
        // 0.25 survives.
        (
            "eta on a uniform row",
            eta(0.2, 0),
            vec![0.5; 4],
            vec![0, 1, 2, 3],
        ),
        // eta 0.3 removes 0.2 and 0.1; min_keep 2 brings the second back.
        (
            "eta min_keep",
            eta(0.3, 2),
            ln(&[0.7, 0.2, 0.1]),
            vec![0, 1],
        ),
        // epsilon 0 is a no-op.
        (
            "epsilon 0 is a no-op",
            eps(0.0, 0),
            ln(&[0.9, 0.1]),
            vec![0, 1],
        ),
    ]
}

fn finite_ids(row: &Candidates) -> Vec<TokenId> {
    let mut ids: Vec<TokenId> = row
        .ids()
        .iter()
        .zip(row.logits())
        .filter(|(_, l)| l.is_finite())
        .map(|(&i, _)| i)
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn hand_computed_cases_on_the_cpu() {
    for (name, stage, logits, want) in cases() {
        let mut chain = sampler_cpu::build_chain(&ChainSpec::new(vec![stage], Some(1))).unwrap();
        let mut row = Candidates::from_logits(&logits);
        chain.apply(&mut row).expect(name);
        assert_eq!(finite_ids(&row), want, "{name}");
    }
}

fn hand_computed_cases(d: &Device, dev: &str) {
    for (name, stage, logits, want) in cases() {
        let v = logits.len();
        let spec = ChainSpec::new(vec![stage.clone()], Some(1));
        let mut ex = Executor::new(vec![spec], v, d, OffloadPolicy::Device).expect("executor");
        let offloaded: &[usize] = if stage.is_noop() { &[] } else { &[0] };
        assert_eq!(ex.plan().device, offloaded, "{dev} {name}: offloaded");
        let out = ex.filter(upload(&logits, 1, v, d)).expect("filter");
        let row = out.rows[0].clone().expect("row");
        assert_eq!(finite_ids(&row), want, "{dev} {name}");
    }
}

/// Rows with a heavy tail and ties; every seed gives the CPU's token.
fn same_tokens_as_the_cpu(d: &Device, dev: &str) {
    let v = 64;
    let rows = 4;
    let mut logits = Vec::with_capacity(rows * v);
    for r in 0..rows {
        for i in 0..v {
            let x = ((i * 37 + r * 11) % 23) as f32 * 0.25 - (i as f32) * 0.05;
            logits.push(if i % 17 == 5 { f32::NEG_INFINITY } else { x });
        }
    }
    for seed in 0..12u64 {
        let specs: Vec<ChainSpec> = (0..rows)
            .map(|r| {
                let stage = if (seed + r as u64).is_multiple_of(2) {
                    S::Epsilon {
                        epsilon: [0.005, 0.02, 0.05][r % 3],
                        min_keep: [0, 3][r % 2],
                    }
                } else {
                    S::Eta {
                        epsilon: [0.001, 0.01, 0.1][r % 3],
                        min_keep: [0, 2][r % 2],
                    }
                };
                ChainSpec::new(vec![stage, S::Dist], Some(seed * 100 + r as u64))
            })
            .collect();
        // The executor needs one chain shape per batch: one row at a time.
        for (r, spec) in specs.iter().enumerate() {
            let row = &logits[r * v..(r + 1) * v];
            let cpu = cpu_step(std::slice::from_ref(spec), row, v, &[vec![]]);
            let (out, _) = device_step(
                std::slice::from_ref(spec),
                row,
                v,
                d,
                OffloadPolicy::Device,
                &[vec![]],
            );
            assert_eq!(out.tokens[0], cpu[0], "{dev} seed {seed} row {r}");
        }
    }
}

device_tests!(hand_computed_cases, same_tokens_as_the_cpu);
