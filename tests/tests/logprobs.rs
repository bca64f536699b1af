//! Logprobs (raw and processed) on the CPU and every compiled device, and
//! the pipelined step: hand-computed values, CPU == device on random rows,
//! bytes read back, submit + finish == step.

mod device_support;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_backend::burn_tensor::{Device, Tensor, TensorData};
use sampler_backend::{BackendError, SamplingBatch};
use sampler_core::{
    ChainSpec, Logprobs, LogprobsMode, LogprobsSpec, OffloadPolicy, Readback, StageSpec, TokenId,
};

const NI: f32 = f32::NEG_INFINITY;

fn temp(t: f32) -> StageSpec {
    StageSpec::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

fn with_lp(stages: Vec<StageSpec>, seed: u64, lp: LogprobsSpec) -> ChainSpec {
    let mut s = ChainSpec::new(stages, Some(seed));
    s.logprobs = Some(lp);
    s
}

fn upload(rows: &[Vec<f32>], d: &Device) -> Tensor<2> {
    let v = rows[0].len();
    let flat: Vec<f32> = rows.concat();
    Tensor::<2>::from_data(TensorData::new(flat, [rows.len(), v]), d)
}

/// `ln softmax` of `logits` over the survivors `keep` (by id), in f64:
/// the hand computation.
fn hand(logits: &[f64], keep: &[usize]) -> Vec<f64> {
    let m = keep.iter().map(|&i| logits[i]).fold(f64::MIN, f64::max);
    let s: f64 = keep.iter().map(|&i| (logits[i] - m).exp()).sum();
    (0..logits.len())
        .map(|i| {
            if keep.contains(&i) {
                logits[i] - m - s.ln()
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect()
}

/// One step of `spec` on `row` in a fresh batch under `policy`.
fn one_step(
    spec: &ChainSpec,
    row: &[f32],
    d: &Device,
    policy: OffloadPolicy,
) -> (TokenId, Logprobs, usize, Readback) {
    let mut batch = SamplingBatch::new(row.len(), d, policy).unwrap();
    let id = batch.insert(spec.clone(), &[]).unwrap();
    let readback = batch.plan(id).unwrap().readback;
    let out = batch.step(&[id], upload(&[row.to_vec()], d)).unwrap();
    let t = *out.tokens[0].as_ref().unwrap();
    let lp = out.logprobs[0].clone().expect("logprobs were asked for");
    (t, lp, out.bytes_read, readback)
}

fn check(name: &str, lp: &Logprobs, want: &[f64], token: TokenId, n: usize, ids: &[TokenId]) {
    let close = |a: f32, b: f64| (a == NI && b == f64::NEG_INFINITY) || (a as f64 - b).abs() < 1e-5;
    assert_eq!(lp.token.0, token, "{name}");
    assert!(
        close(lp.token.1, want[token as usize]),
        "{name}: sampled {lp:?} vs {want:?}"
    );
    // The top n: highest first, ties to the lowest id, finite only.
    let mut order: Vec<usize> = (0..want.len()).filter(|&i| want[i].is_finite()).collect();
    order.sort_by(|&a, &b| want[b].partial_cmp(&want[a]).unwrap().then(a.cmp(&b)));
    order.truncate(n);
    let got: Vec<usize> = lp.top.iter().map(|p| p.0 as usize).collect();
    assert_eq!(got, order, "{name}: top ids");
    for &(t, v) in &lp.top {
        assert!(
            close(v, want[t as usize]),
            "{name}: top {t}: {v} vs {}",
            want[t as usize]
        );
    }
    let mass: f64 = lp.top.iter().map(|p| (p.1 as f64).exp()).sum();
    assert!(mass <= 1.0 + 1e-5, "{name}: top mass {mass}");
    assert_eq!(lp.requested.len(), ids.len(), "{name}");
    for (&(t, v), &want_t) in lp.requested.iter().zip(ids) {
        assert_eq!(t, want_t, "{name}");
        assert!(
            close(v, want[t as usize]),
            "{name}: requested {t}: {v} vs {}",
            want[t as usize]
        );
    }
}

/// (chain, its stages, the processed distribution by hand, the token by
/// hand or `None` for `dist`).
type Case = (&'static str, Vec<StageSpec>, Vec<f64>, Option<TokenId>);

/// Hand-computed raw and processed logprobs after temperature, top_k, top_p
/// and min_p, greedy and dist, on the host and on the device (fully and
/// partly offloaded); the bytes read back per row.
fn hand_computed_values(d: &Device, name: &str) {
    let row = [2.0f32, 1.0, 0.5, -1.0, 1.0, -3.0];
    let l: Vec<f64> = row.iter().map(|&x| x as f64).collect();
    let all: Vec<usize> = (0..row.len()).collect();
    let raw = hand(&l, &all);
    // The example: logits [2, 1] -> -0.3133 for the greedy token.
    let two = hand(&[2.0, 1.0], &[0, 1]);
    assert!((two[0] - -0.3133).abs() < 1e-4);
    let scaled: Vec<f64> = l.iter().map(|x| x / 0.5).collect();
    let ids = [3u32, 4, 5];
    let cases: Vec<Case> = vec![
        ("greedy", vec![StageSpec::Greedy], raw.clone(), Some(0)),
        (
            "temperature(0.5);dist",
            vec![temp(0.5), StageSpec::Dist],
            hand(&scaled, &all),
            None,
        ),
        (
            // Ties at the top-3 boundary (ids 1 and 4, logit 1.0): lowest id kept.
            "top_k(2);dist",
            vec![StageSpec::TopK { k: 2 }, StageSpec::Dist],
            hand(&l, &[0, 1]),
            None,
        ),
        (
            // p = [.496, .183, .111, .025, .183, .003]: .496 + .183 < 0.7,
            // then the tie at .183 goes to id 1 first, id 4 crosses 0.7.
            "top_p(0.7);dist",
            vec![
                StageSpec::TopP {
                    p: 0.7,
                    min_keep: 0,
                },
                StageSpec::Dist,
            ],
            hand(&l, &[0, 1, 4]),
            None,
        ),
        (
            // min_p 0.2: keep p >= 0.2 * p_max, i.e. logit >= 2 + ln 0.2 = 0.39.
            "min_p(0.2);greedy",
            vec![
                StageSpec::MinP {
                    p: 0.2,
                    min_keep: 0,
                },
                StageSpec::Greedy,
            ],
            hand(&l, &[0, 1, 2, 4]),
            Some(0),
        ),
        (
            "top_k(4);temperature(0.5);top_p(0.9);dist",
            vec![
                StageSpec::TopK { k: 4 },
                temp(0.5),
                StageSpec::TopP {
                    p: 0.9,
                    min_keep: 0,
                },
                StageSpec::Dist,
            ],
            // After top_k(4) {0, 1, 2, 4} at t = 0.5: p = [.757, .103, .038,
            // .103] (ids 0, 1, 2, 4): .757 + .103 < 0.9, + .103 (id 4) >= 0.9.
            hand(&scaled, &[0, 1, 4]),
            None,
        ),
    ];
    let mut offloaded = 0;
    for (chain, stages, processed, token) in cases {
        for mode in [LogprobsMode::Raw, LogprobsMode::Processed] {
            for policy in [
                OffloadPolicy::Off,
                OffloadPolicy::Device,
                OffloadPolicy::Stages(1),
            ] {
                let (n, m) = (3, ids.len());
                let spec = with_lp(
                    stages.clone(),
                    9,
                    LogprobsSpec {
                        top_n: n,
                        token_ids: ids.to_vec(),
                        mode,
                    },
                );
                let (t, lp, bytes, readback) = one_step(&spec, &row, d, policy);
                if let Some(want_t) = token {
                    assert_eq!(t, want_t, "[{name}] {chain}");
                }
                let want = match mode {
                    LogprobsMode::Raw => &raw,
                    LogprobsMode::Processed => &processed,
                };
                let what = format!("[{name}] {chain} {mode:?} {policy:?}");
                check(&what, &lp, want, t, n, &ids);
                if policy == OffloadPolicy::Off {
                    assert_eq!(bytes, 4 * row.len(), "{what}: the host reads the row");
                }
                // A fully offloaded chain reads back 4 + 8 (n + m + 1) bytes.
                if readback == Readback::TokenIds && policy == OffloadPolicy::Device {
                    assert_eq!(bytes, 4 + 8 * (n + m + 1), "{what}");
                    offloaded += 1;
                }
            }
        }
    }
    assert_eq!(
        offloaded, 12,
        "[{name}] every chain ran fully on the device"
    );
}

/// Random rows and chains: the device's logprobs equal the CPU's (values
/// within 1e-5, the same top ids), the tokens are the same.
fn cpu_and_device_agree(d: &Device, name: &str) {
    let mut r = ChaCha8Rng::seed_from_u64(0x1095);
    let v = 700;
    let mut compared = 0;
    for case in 0..24 {
        let row: Vec<f32> = (0..v)
            .map(|i| {
                let zipf = -((i % 97 + 1) as f32).ln() * 1.5;
                zipf + r.random_range(-0.5..0.5) + if i % 50 == 0 { 1.0 } else { 0.0 }
            })
            .collect();
        let mut stages = Vec::new();
        if r.random_bool(0.5) {
            stages.push(StageSpec::TopK {
                k: r.random_range(1..60),
            });
        }
        if r.random_bool(0.6) {
            stages.push(temp(r.random_range(0.3..1.5)));
        }
        if r.random_bool(0.5) {
            stages.push(StageSpec::TopP {
                p: r.random_range(0.3..0.99),
                min_keep: 0,
            });
        }
        if r.random_bool(0.3) {
            stages.push(StageSpec::MinP {
                p: r.random_range(0.01..0.3),
                min_keep: 0,
            });
        }
        stages.push(if r.random_bool(0.3) {
            StageSpec::Greedy
        } else {
            StageSpec::Dist
        });
        let mode = if case % 2 == 0 {
            LogprobsMode::Raw
        } else {
            LogprobsMode::Processed
        };
        let lp = LogprobsSpec {
            top_n: r.random_range(0..=20),
            token_ids: (0..r.random_range(0..12))
                .map(|_| r.random_range(0..v as u32))
                .collect(),
            mode,
        };
        let spec = with_lp(stages, case, lp.clone());
        let (t0, host, _, _) = one_step(&spec, &row, d, OffloadPolicy::Off);
        for policy in [OffloadPolicy::Device, OffloadPolicy::Stages(1)] {
            let (t1, dev, _, _) = one_step(&spec, &row, d, policy);
            let what = format!("[{name}] case {case} {policy:?} {}", spec.chain_string());
            assert_eq!(t0, t1, "{what}");
            let ids0: Vec<_> = host.top.iter().map(|p| p.0).collect();
            let ids1: Vec<_> = dev.top.iter().map(|p| p.0).collect();
            assert_eq!(ids0, ids1, "{what}");
            let pairs = std::iter::once((host.token, dev.token))
                .chain(host.top.iter().copied().zip(dev.top.iter().copied()))
                .chain(
                    host.requested
                        .iter()
                        .copied()
                        .zip(dev.requested.iter().copied()),
                );
            for ((ia, a), (ib, b)) in pairs {
                assert_eq!(ia, ib, "{what}");
                assert!(
                    (a == NI && b == NI) || (a - b).abs() < 1e-5,
                    "{what}: token {ia}: host {a} device {b}"
                );
                compared += 1;
            }
            let mass: f32 = dev.top.iter().map(|p| p.1.exp()).sum();
            assert!(mass <= 1.0 + 1e-5, "{what}: {mass}");
        }
    }
    // 128 requested ids after a wide top_k: the device scatters the row back
    // to the vocabulary instead of a [B, m, k] comparison.
    let row: Vec<f32> = (0..v).map(|i| ((i * 7919) % 701) as f32 / 90.0).collect();
    let wide = with_lp(
        vec![StageSpec::TopK { k: 650 }, temp(0.9), StageSpec::Dist],
        3,
        LogprobsSpec {
            top_n: 20,
            token_ids: (0..128).map(|i| i * 5).collect(),
            mode: LogprobsMode::Processed,
        },
    );
    let (t0, host, _, _) = one_step(&wide, &row, d, OffloadPolicy::Off);
    let (t1, dev, _, readback) = one_step(&wide, &row, d, OffloadPolicy::Device);
    assert_eq!(readback, Readback::TokenIds);
    assert_eq!(t0, t1);
    for (a, b) in host.requested.iter().zip(&dev.requested) {
        assert_eq!(a.0, b.0);
        assert!(
            (a.1 == NI && b.1 == NI) || (a.1 - b.1).abs() < 1e-5,
            "[{name}] requested {a:?} vs {b:?}"
        );
    }
    assert!(
        host.requested.iter().any(|p| p.1 == NI),
        "some ids fell outside top_k"
    );
    println!("[{name}] {compared} logprobs compared");
}

/// submit + finish gives the blocking step's tokens and logprobs; the batch
/// refuses changes while a step is in flight and accepts new requests.
fn pipelined_equals_blocking(d: &Device, name: &str) {
    let v = 300;
    let chains = [
        vec![StageSpec::TopK { k: 20 }, temp(0.8), StageSpec::Dist],
        vec![StageSpec::Greedy],
        vec![
            StageSpec::TopP {
                p: 0.9,
                min_keep: 0,
            },
            StageSpec::Dist,
        ],
    ];
    let row = |s: usize, i: usize| -> Vec<f32> {
        (0..v)
            .map(|j| (((j * 31 + s * 7 + i * 13) % 101) as f32 / 17.0).sin() * 3.0)
            .collect()
    };
    let run = |pipelined: bool| {
        let mut batch = SamplingBatch::new(v, d, OffloadPolicy::Device).unwrap();
        let lp = LogprobsSpec {
            top_n: 2,
            token_ids: vec![5],
            mode: LogprobsMode::Processed,
        };
        let ids: Vec<_> = chains
            .iter()
            .enumerate()
            .map(|(i, c)| {
                batch
                    .insert(with_lp(c.clone(), i as u64, lp.clone()), &[1])
                    .unwrap()
            })
            .collect();
        let mut out = Vec::new();
        for s in 0..6 {
            let rows: Vec<Vec<f32>> = (0..ids.len()).map(|i| row(s, i)).collect();
            let step = if pipelined {
                let p = batch.submit(&ids, upload(&rows, d)).unwrap();
                assert!(batch.in_flight());
                assert_eq!(
                    batch.remove(ids[0]),
                    Err(BackendError::StepPending { call: "remove" })
                );
                assert!(matches!(
                    batch.step(&ids, upload(&rows, d)),
                    Err(BackendError::StepPending { .. })
                ));
                batch.finish(p).unwrap()
            } else {
                batch.step(&ids, upload(&rows, d)).unwrap()
            };
            out.push((step.tokens, step.logprobs));
        }
        // A stale pending step is refused.
        let p = batch.submit(&[], Tensor::<2>::zeros([0, v], d)).unwrap();
        let extra = batch.insert(ChainSpec::new(vec![StageSpec::Greedy], None), &[]);
        assert!(extra.is_ok(), "insert is allowed while a step is in flight");
        batch.finish(p).unwrap();
        let p2 = batch.submit(&[], Tensor::<2>::zeros([0, v], d)).unwrap();
        batch.finish(p2).unwrap();
        out
    };
    let blocking = run(false);
    let pipelined = run(true);
    assert_eq!(blocking, pipelined, "[{name}]");
    assert!(blocking.iter().all(|(t, l)| {
        t.iter().all(|t| t.is_ok())
            && l.iter()
                .all(|l| l.as_ref().is_some_and(|l| l.top.len() <= 2))
    }));
}

/// A dropped or cancelled step frees the batch; a step of another batch is
/// refused; the masks of a cancelled step do not leak into the next one.
fn abandoned_and_foreign_steps(d: &Device, name: &str) {
    let v = 64;
    let row = vec![(0..v).map(|i| i as f32 / 10.0).collect::<Vec<f32>>()];
    let mut a = SamplingBatch::new(v, d, OffloadPolicy::Device).unwrap();
    let mut b = SamplingBatch::new(v, d, OffloadPolicy::Device).unwrap();
    let spec = ChainSpec::new(vec![StageSpec::Mask, StageSpec::Greedy], None);
    let ia = a.insert(spec.clone(), &[]).unwrap();
    let ib = b.insert(spec, &[]).unwrap();
    let pa = a.submit(&[ia], upload(&row, d)).unwrap();
    let pb = b.submit(&[ib], upload(&row, d)).unwrap();
    // Another batch's step is refused and given back, not dropped: its own
    // batch still finishes it.
    let err = b.finish(pa).unwrap_err();
    let BackendError::ForeignStep { step } = &err else {
        panic!("[{name}] {err}");
    };
    assert!(err.to_string().contains("another batch"), "{err}");
    let pa = step.take().expect("the step comes back");
    assert!(step.take().is_none(), "once");
    assert!(a.in_flight(), "[{name}] a still waits for its step");
    let pb = match a.cancel(pb) {
        Err(BackendError::ForeignStep { step }) => step.take().unwrap(),
        other => panic!("[{name}] {other:?}"),
    };
    assert_eq!(a.finish(pa).unwrap().tokens, vec![Ok(63)]);
    assert_eq!(b.finish(pb).unwrap().tokens, vec![Ok(63)]);
    // Dropped: the next call abandons it.
    let p = a.submit(&[ia], upload(&row, d)).unwrap();
    assert!(a.in_flight());
    drop(p);
    assert!(!a.in_flight());
    a.set_mask(ia, Some(&[1, 0])).unwrap();
    // Cancelled after a mask: nothing recorded, the mask gone.
    let p = a.submit(&[ia], upload(&row, d)).unwrap();
    a.cancel(p).unwrap();
    assert_eq!(
        a.outputs(ia).unwrap(),
        &[63],
        "[{name}] only the step handed back and finished"
    );
    let out = a.step(&[ia], upload(&row, d)).unwrap();
    assert_eq!(
        out.tokens,
        vec![Ok(63)],
        "[{name}] the cancelled step's mask is gone"
    );
}

/// Every policy's logprobs for one step of `stages` on `row`, against the
/// CPU chain alone (`Chain::sample_logprobs`): the same token, the same top
/// ids in the same order, values within `tol` (relative above 1).
fn same_logprobs_everywhere(
    d: &Device,
    name: &str,
    stages: Vec<StageSpec>,
    row: &[f32],
    lp: LogprobsSpec,
    tol: f32,
) -> Logprobs {
    let spec = with_lp(stages, 7, lp.clone());
    let mut chain = sampler_cpu::build_chain(&spec).unwrap();
    let (t, want) = chain.sample_logprobs(row, &lp).unwrap();
    let close = |a: f32, b: f32| a == b || (a - b).abs() <= tol * b.abs().max(1.0);
    for policy in [
        OffloadPolicy::Off,
        OffloadPolicy::Device,
        OffloadPolicy::Stages(1),
    ] {
        let what = format!("[{name}] {} {lp:?} {policy:?}", spec.chain_string());
        let (t1, got, _, _) = one_step(&spec, row, d, policy);
        assert_eq!(t1, t, "{what}: token");
        let ids = |l: &Logprobs| l.top.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(ids(&got), ids(&want), "{what}: top ids {got:?} vs {want:?}");
        let pairs = std::iter::once((got.token, want.token))
            .chain(got.top.iter().copied().zip(want.top.iter().copied()))
            .chain(
                got.requested
                    .iter()
                    .copied()
                    .zip(want.requested.iter().copied()),
            );
        for ((ia, a), (ib, b)) in pairs {
            assert_eq!(ia, ib, "{what}");
            assert!(
                close(a, b),
                "{what}: token {ia}: {a} vs CPU {b} ({got:?} vs {want:?})"
            );
        }
    }
    want
}

/// Requested ids next to top entries: each value stays with its own token
/// (wgpu once put token 0's logprob in the top entry or a requested one).
fn requested_ids_keep_their_own_values(d: &Device, name: &str) {
    let row: Vec<f32> = (0..8).map(|i| i as f32).collect();
    for stages in [vec![StageSpec::Greedy], vec![StageSpec::Dist]] {
        for (top_n, ids) in [(1, vec![5, 6]), (2, vec![5]), (3, vec![0, 7, 0])] {
            for mode in [LogprobsMode::Raw, LogprobsMode::Processed] {
                let lp = LogprobsSpec {
                    top_n,
                    token_ids: ids.clone(),
                    mode,
                };
                let want = same_logprobs_everywhere(d, name, stages.clone(), &row, lp, 1e-5);
                assert!((want.top[0].1 - -0.4583).abs() < 1e-3, "{want:?}");
            }
        }
    }
}

/// Logprobs are `(l - max) - ln S`, so huge logits keep their precision:
/// two `f32::MAX` logits are ln 0.5 each, not 0.
fn logprobs_keep_precision_at_large_magnitudes(d: &Device, name: &str) {
    let lp = |top_n| LogprobsSpec {
        top_n,
        token_ids: vec![0, 1],
        mode: LogprobsMode::Raw,
    };
    let want = same_logprobs_everywhere(
        d,
        name,
        vec![StageSpec::Dist],
        &[f32::MAX, f32::MAX],
        lp(2),
        1e-6,
    );
    assert!(
        (want.token.1 - -std::f32::consts::LN_2).abs() < 1e-6,
        "{want:?}"
    );
    let want = same_logprobs_everywhere(
        d,
        name,
        vec![StageSpec::Greedy],
        &[1000.0, 999.0, 997.0],
        lp(3),
        2e-7,
    );
    assert!((want.token.1 - -0.349_012_2).abs() < 1e-6, "{want:?}");
}

/// One rule for the top entries on every path: the best by logit (not by
/// the rounded logprob), ties to the lowest id, `-inf` logprobs left out.
fn top_logprobs_rank_by_logit_and_leave_out_minus_inf(d: &Device, name: &str) {
    let raw = |top_n| LogprobsSpec {
        top_n,
        token_ids: vec![],
        mode: LogprobsMode::Raw,
    };
    // Three logits whose logprobs round to one value.
    let want = same_logprobs_everywhere(
        d,
        name,
        vec![StageSpec::Dist],
        &[1e-30, 2e-30, 0.0],
        raw(3),
        1e-6,
    );
    let ids: Vec<TokenId> = want.top.iter().map(|p| p.0).collect();
    assert_eq!(ids, [1, 0, 2]);
    assert_eq!(want.top[0].1, want.top[1].1, "the logprobs do round equal");
    // A logprob that underflows to -inf is not a top entry.
    let want = same_logprobs_everywhere(
        d,
        name,
        vec![StageSpec::Greedy],
        &[f32::MAX, -f32::MAX],
        raw(2),
        1e-6,
    );
    assert_eq!(want.top, [(0, 0.0)]);
}

/// Two spellings of greedy report the same logprobs: `temperature(0)`
/// before the selecting stage gives what `greedy` gives (the log-softmax of
/// the candidates it chose among, vLLM's greedy rows), in both modes, on
/// every path; after a `top_k` the candidates are the `k` kept.
fn greedy_spellings_report_the_same_logprobs(d: &Device, name: &str) {
    let row = [2.0f32, 1.0, 0.5, -1.0, 1.0, -3.0];
    let spellings = [
        (vec![temp(0.0), StageSpec::Dist], vec![StageSpec::Greedy]),
        (
            vec![StageSpec::TopK { k: 3 }, temp(0.0), StageSpec::Dist],
            vec![StageSpec::TopK { k: 3 }, StageSpec::Greedy],
        ),
        (
            vec![temp(0.0), StageSpec::TopK { k: 2 }, StageSpec::Dist],
            vec![StageSpec::Greedy],
        ),
    ];
    for (as_temperature, as_greedy) in spellings {
        for mode in [LogprobsMode::Raw, LogprobsMode::Processed] {
            let lp = LogprobsSpec {
                top_n: 3,
                token_ids: vec![1, 3],
                mode,
            };
            let got =
                same_logprobs_everywhere(d, name, as_temperature.clone(), &row, lp.clone(), 1e-5);
            let want = same_logprobs_everywhere(d, name, as_greedy.clone(), &row, lp, 1e-5);
            assert_eq!(
                got, want,
                "{as_temperature:?} against {as_greedy:?}, {mode:?}"
            );
            assert_eq!(got.token.0, 0, "{got:?}");
            if mode == LogprobsMode::Raw {
                assert!((got.token.1 - -0.700_824_7).abs() < 1e-5, "{got:?}");
            }
        }
    }
    // The value by hand: `[2, 1]`'s log-softmax at 2 is -0.3133, not 0.
    let lp = LogprobsSpec {
        top_n: 0,
        token_ids: vec![],
        mode: LogprobsMode::Processed,
    };
    let got = same_logprobs_everywhere(
        d,
        name,
        vec![temp(0.0), StageSpec::Dist],
        &[2.0, 1.0],
        lp,
        1e-5,
    );
    assert!((got.token.1 - -0.313_261_7).abs() < 1e-5, "{got:?}");
}

device_tests!(
    greedy_spellings_report_the_same_logprobs,
    hand_computed_values,
    cpu_and_device_agree,
    pipelined_equals_blocking,
    abandoned_and_foreign_steps,
    requested_ids_keep_their_own_values,
    logprobs_keep_precision_at_large_magnitudes,
    top_logprobs_rank_by_logit_and_leave_out_minus_inf
);

/// The CPU chain on its own (no batch) gives the same token as without
/// logprobs, and the same logprobs as the batch's host path.
#[test]
fn chain_sample_logprobs_keeps_the_token() {
    let row: Vec<f32> = (0..2000)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    for mode in [LogprobsMode::Raw, LogprobsMode::Processed] {
        let spec = ChainSpec::new(
            vec![StageSpec::TopK { k: 50 }, temp(0.7), StageSpec::Dist],
            Some(3),
        );
        let mut a = sampler_cpu::build_chain(&spec).unwrap();
        let mut b = a.clone();
        let lp = LogprobsSpec {
            top_n: 5,
            token_ids: vec![0, 1999],
            mode,
        };
        for _ in 0..5 {
            let t = a.sample_logits(&row).unwrap();
            let (t2, l) = b.sample_logprobs(&row, &lp).unwrap();
            assert_eq!(t, t2);
            assert_eq!(l.token.0, t);
            assert_eq!(l.top.len(), 5);
        }
        assert_eq!(a.step(), b.step());
        let bad = LogprobsSpec {
            token_ids: vec![2000],
            ..lp.clone()
        };
        assert_eq!(
            b.sample_logprobs(&row, &bad),
            Err(sampler_core::SampleError::TokenOutOfRange {
                token: 2000,
                vocab: 2000
            })
        );
        assert_eq!(a.step(), b.step(), "nothing accepted on error");
        let huge = LogprobsSpec {
            top_n: usize::MAX,
            ..lp.clone()
        };
        assert!(matches!(
            b.sample_logprobs(&row, &huge),
            Err(sampler_core::SampleError::Param(_))
        ));
    }
}

/// Bad logprobs requests are refused at insert with the field and range.
#[test]
fn bad_logprobs_requests_are_refused() {
    let d = sampler_backend::parse_device("flex").unwrap();
    let mut batch = SamplingBatch::new(10, &d, OffloadPolicy::Auto).unwrap();
    let lp = |top_n, ids: Vec<u32>| {
        with_lp(
            vec![StageSpec::Greedy],
            1,
            LogprobsSpec {
                top_n,
                token_ids: ids,
                mode: LogprobsMode::Raw,
            },
        )
    };
    let e = batch.insert(lp(21, vec![]), &[]).unwrap_err().to_string();
    assert!(
        e.contains("logprobs.top_logprobs = 21") && e.contains("[0, 20]"),
        "{e}"
    );
    let e = batch.insert(lp(1, vec![10]), &[]).unwrap_err().to_string();
    assert!(
        e.contains("logprob_token_ids = 10") && e.contains("10"),
        "{e}"
    );
    let e = batch
        .insert(lp(1, vec![0; 129]), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 128"), "{e}");
}

/// `sampler_cpu::sample_batch_logprobs` gives, per row, the tokens of
/// `sample_batch` and the logprobs the serving batch reports for the same
/// request; a count that does not match the rows is refused.
#[test]
fn cpu_batch_logprobs_equal_the_serving_batch() {
    let d = sampler_backend::parse_device("flex").unwrap();
    let (b, v): (usize, usize) = (6, 300);
    let mut r = ChaCha8Rng::seed_from_u64(0xb47c);
    let logits: Vec<f32> = (0..b * v).map(|_| r.random_range(-4.0..4.0)).collect();
    let specs: Vec<ChainSpec> = (0..b)
        .map(|i| {
            let stages = vec![
                StageSpec::TopK { k: 20 + i as i64 },
                temp(0.8),
                StageSpec::Dist,
            ];
            let mode = [LogprobsMode::Raw, LogprobsMode::Processed][i % 2];
            with_lp(
                stages,
                i as u64,
                LogprobsSpec {
                    top_n: i,
                    token_ids: vec![i as u32, 299],
                    mode,
                },
            )
        })
        .collect();
    let lps: Vec<Option<LogprobsSpec>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| s.logprobs.clone().filter(|_| i != 3))
        .collect();
    let mut chains: Vec<_> = specs
        .iter()
        .map(|s| sampler_cpu::build_chain(s).unwrap())
        .collect();
    let mut plain = chains.clone();
    let got = sampler_cpu::sample_batch_logprobs(&logits, b, v, &mut chains, &lps).unwrap();
    let tokens = sampler_cpu::sample_batch(&logits, b, v, &mut plain).unwrap();
    let mut batch = SamplingBatch::new(v, &d, OffloadPolicy::Off).unwrap();
    let ids: Vec<_> = specs
        .iter()
        .map(|s| batch.insert(s.clone(), &[]).unwrap())
        .collect();
    let rows: Vec<Vec<f32>> = logits.chunks(v).map(<[f32]>::to_vec).collect();
    let served = batch.step(&ids, upload(&rows, &d)).unwrap();
    for i in 0..b {
        let (t, lp) = got[i].clone().unwrap();
        assert_eq!(Ok(t), tokens[i], "row {i}");
        assert_eq!(Ok(t), served.tokens[i], "row {i}");
        if i == 3 {
            assert!(lp.is_none());
        } else {
            assert_eq!(lp, served.logprobs[i], "row {i}");
        }
    }
    assert_eq!(
        sampler_cpu::sample_batch_logprobs(&logits, b, v, &mut chains, &lps[..2]),
        Err(sampler_core::SampleError::LogprobsCount { specs: 2, batch: b })
    );
}
