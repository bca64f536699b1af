//! llama.cpp golden cases (../shared/reference/llama_cpp_cases.json) for the
//! device-capable stages, run through the device path: the chain (without
//! its final `dist(0)`, which only computes probabilities there) runs on the
//! device with `Executor::filter`, and the surviving candidates'
//! probabilities must match the expected ones by token id (|diff| < 1e-5).
//! The sampler-queue cases (V = 10 000, chains of top_k / top_p / min_p)
//! must keep exactly the CPU oracle's set.

mod device_support;

use std::collections::BTreeMap;

use sampler_backend::Executor;
use sampler_backend::burn_tensor::Device;
use sampler_core::{Candidates, ChainSpec, HistoryScope, OffloadPolicy, StageSpec as S, TokenId};
use serde_json::Value;

fn cases() -> Option<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/llama_cpp_cases.json");
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s).ok(),
        Err(e) => {
            println!("SKIP golden cases: {path}: {e}");
            None
        }
    }
}

fn f(v: &Value, k: &str) -> f32 {
    v[k].as_f64().unwrap_or(0.0) as f32
}

/// A golden chain entry as a device-capable stage; `None` for host-only
/// stages (xtc, typical, dry, top_n_sigma) and for `dist`.
fn stage(v: &Value) -> Option<S> {
    Some(match v["sampler"].as_str()? {
        "temp" => S::Temperature {
            t: f(v, "t"),
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        },
        "temp_ext" => S::Temperature {
            t: f(v, "t"),
            dynatemp_range: f(v, "delta"),
            dynatemp_exponent: f(v, "exponent"),
        },
        "top_k" => S::TopK {
            k: v["k"].as_i64()?,
        },
        "top_p" => S::TopP {
            p: f(v, "p"),
            min_keep: v["min_keep"].as_u64().unwrap_or(0) as usize,
        },
        "min_p" => S::MinP {
            p: f(v, "p"),
            min_keep: v["min_keep"].as_u64().unwrap_or(0) as usize,
        },
        "penalties" => S::Penalties {
            last_n: v["last_n"].as_u64()? as usize,
            repeat: f(v, "repeat"),
            frequency: f(v, "freq"),
            presence: f(v, "present"),
            scope: HistoryScope::PromptAndOutput,
        },
        _ => return None,
    })
}

/// Finite survivors of one row after running `stages` on the device: id -> logit.
fn run_filter(
    d: &Device,
    stages: Vec<S>,
    logits: &[f32],
    history: &[TokenId],
) -> (Executor, Candidates) {
    let v = logits.len();
    let spec = ChainSpec::new(stages, Some(0));
    let mut ex = Executor::new(vec![spec], v, d, OffloadPolicy::Device).expect("executor");
    ex.accept_prompt(0, history).expect("row 0 exists");
    let out = ex
        .filter(device_support::upload(logits, 1, v, d))
        .expect("filter");
    let row = out.rows[0].clone().expect("row");
    (ex, row)
}

fn golden_cases_on_device(d: &Device, name: &str) {
    let Some(all) = cases() else { return };
    let mut ran = 0;
    for case in all["cases"].as_array().into_iter().flatten() {
        let id = case["id"].as_str().unwrap_or("?");
        let chain = case["chain"].as_array().cloned().unwrap_or_default();
        let filters: Vec<&Value> = chain
            .iter()
            .filter(|c| c["sampler"].as_str() != Some("dist"))
            .collect();
        let stages: Option<Vec<S>> = filters.iter().map(|c| stage(c)).collect();
        let Some(stages) = stages else {
            println!("[{name}] {id}: host-only stage, not a device case");
            continue;
        };
        let logits: Vec<f32> = case["input_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let history: Vec<TokenId> = case["accepted_history"]
            .as_array()
            .map(|a| a.iter().map(|x| x.as_u64().unwrap() as TokenId).collect())
            .unwrap_or_default();
        let (ex, row) = run_filter(d, stages, &logits, &history);
        assert!(ex.plan().host.is_empty(), "[{name}] {id}: {}", ex.plan());
        // Probabilities over the finite survivors.
        let max = row
            .logits()
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row
            .logits()
            .iter()
            .map(|&l| f64::from((l - max).exp()))
            .collect();
        let s: f64 = e.iter().sum();
        let got: BTreeMap<TokenId, f64> = row
            .ids()
            .iter()
            .zip(&e)
            .filter(|(_, e)| **e > 0.0)
            .map(|(&i, &e)| (i, e / s))
            .collect();
        let ids = case["expected_ids_derived"].as_array().unwrap();
        let probs = case["expected_probs"].as_array().unwrap();
        let want: BTreeMap<TokenId, f64> = ids
            .iter()
            .zip(probs)
            .map(|(i, p)| (i.as_u64().unwrap() as TokenId, p.as_f64().unwrap()))
            .collect();
        for (&tok, &p) in &want {
            let g = got.get(&tok).copied().unwrap_or(0.0);
            assert!(
                (g - p).abs() < 1e-5,
                "[{name}] {id}: token {tok}: device {g} vs expected {p}"
            );
        }
        for tok in got.keys() {
            assert!(
                want.contains_key(tok),
                "[{name}] {id}: device kept token {tok}"
            );
        }
        ran += 1;
    }
    println!("[{name}] {ran} golden cases passed on the device path");
    assert!(ran >= 20, "only {ran} device golden cases ran");
}

fn golden_sampler_queue_on_device(d: &Device, name: &str) {
    let Some(all) = cases() else { return };
    let cubecl = !(name == "flex" || name == "ndarray");
    for case in all["sampler_queue"]["cases"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let n = case["n_vocab"].as_u64().unwrap() as usize;
        let seq = case["seq"].as_str().unwrap();
        let k = case["top_k"].as_i64().unwrap();
        let p = case["top_p"].as_f64().unwrap() as f32;
        let mp = case["min_p"].as_f64().unwrap() as f32;
        if cubecl && seq.contains('k') && k > 100 {
            println!(
                "[{name}] sampler_queue {seq} k={k}: skipped on a cubecl device (top_k cost grows with k; burn_notes.md)"
            );
            continue;
        }
        let stages: Vec<S> = seq
            .chars()
            .map(|c| match c {
                'k' => S::TopK { k },
                'p' => S::TopP { p, min_keep: 1 },
                _ => S::MinP { p: mp, min_keep: 1 },
            })
            .collect();
        let logits: Vec<f32> = (0..n).map(|i| (i as f32).ln()).collect();
        let (_, row) = run_filter(d, stages.clone(), &logits, &[]);
        let mut dev: Vec<TokenId> = row
            .ids()
            .iter()
            .zip(row.logits())
            .filter(|(_, l)| l.is_finite())
            .map(|(&i, _)| i)
            .collect();
        dev.sort_unstable();
        let mut chain = sampler_cpu::build_chain(&ChainSpec::new(stages, Some(0))).unwrap();
        let mut c = Candidates::from_logits(&logits);
        chain.apply(&mut c).unwrap();
        let want_size = case["steps"].as_array().unwrap().last().unwrap()["size"]
            .as_u64()
            .unwrap() as usize;
        assert_eq!(c.len(), want_size, "cpu oracle vs golden size for {seq}");
        let mut cpu: Vec<TokenId> = c
            .ids()
            .iter()
            .zip(c.logits())
            .filter(|(_, l)| l.is_finite())
            .map(|(&i, _)| i)
            .collect();
        cpu.sort_unstable();
        assert_eq!(
            dev.len(),
            cpu.len(),
            "[{name}] sampler_queue {seq} k={k} p={p} min_p={mp}"
        );
        assert_eq!(dev, cpu, "[{name}] sampler_queue {seq}");
    }
}

device_tests!(golden_cases_on_device, golden_sampler_queue_on_device);
