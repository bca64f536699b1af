//! # sampler-fuzz
//!
//! Seeded fuzzing on the stable toolchain (no cargo-fuzz, no nightly): every
//! input is generated from a ChaCha8 stream keyed by the run's seed and the
//! input's index, so any failure replays from `(surface, seed, index)`.
//!
//! Surfaces ([`Surface`]):
//! * `config`: generated and mutated TOML, llama.cpp chain strings and
//!   `--sampling-seq` letters, tagged JSON, OpenAI-style flat parameters,
//!   `generation_config.json`, and the writers' round trips (load, write,
//!   load again gives the same chain);
//! * `cpu`: random chains on hostile rows (NaN, `±inf`, huge values, ties,
//!   empty rows), the reference path (`Chain::sample`) against the fast path
//!   (`sample_batch`): same token or same error;
//! * `executor`: the [`Executor`] on `flex` against the CPU oracle per row,
//!   over random chains (repeated stages, greedy temperatures in the middle,
//!   selecting stages not last, `min_keep` with masked candidates, host-only
//!   stages), every offload policy; float-boundary ties are counted, not
//!   failures;
//! * `files`: the CLIs' readers (`.npy`, `.safetensors`, llama2.c tokenizer
//!   and checkpoint) on valid, mutated and hostile bytes;
//! * `batch`: sessions of a `SamplingBatch` driven as an engine drives it
//!   (requests inserted, removed, updated and reset between steps, random
//!   subsets stepped in random order, pipelined and cancelled steps, masks,
//!   `min_tokens`, logprobs, every offload policy) against each request run
//!   alone on sampler-cpu: tokens, errors and logprobs, each step timed.
//!
//! Each input runs under `catch_unwind`; the report counts inputs, panics,
//! divergences, calls over one second and tie exceptions per surface, and
//! keeps a shrunk reproducer of each failure.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use chain_config::{ChainConfig, GenerationConfig, LoadOptions, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_backend::burn_tensor::{Device, Tensor, TensorData};
use sampler_backend::{Executor, RequestId, SamplingBatch};
use sampler_core::{
    Candidates, Chain, ChainSpec, HistoryScope, Logprobs, LogprobsMode, LogprobsSpec,
    OffloadPolicy, ParamKind, ParamValue, StageKind, StageSpec, TokenId, TokenOrigin,
};

/// What one run exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Every config front end and the writers.
    Config,
    /// CPU sampling: reference against fast path, hostile rows.
    Cpu,
    /// The executor on flex against the CPU oracle.
    Executor,
    /// The CLIs' file readers.
    Files,
    /// Serving-batch sessions against each request run alone on the CPU.
    Batch,
}

impl Surface {
    /// Every surface.
    pub const ALL: [Surface; 5] = [
        Surface::Config,
        Surface::Cpu,
        Surface::Executor,
        Surface::Files,
        Surface::Batch,
    ];

    /// The surface's name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Surface::Config => "config",
            Surface::Cpu => "cpu",
            Surface::Executor => "executor",
            Surface::Files => "files",
            Surface::Batch => "batch",
        }
    }
}

/// One failure, with what replays it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// `panic`, `divergence` or `slow`.
    pub kind: &'static str,
    /// The input's index in the run (replay: same seed, same index).
    pub index: u64,
    /// A minimal reproducer (shrunk where the input is text or bytes).
    pub reproducer: String,
    /// What went wrong.
    pub detail: String,
}

/// Figures of one surface.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Inputs run.
    pub inputs: u64,
    /// Inputs that panicked.
    pub panics: u64,
    /// Inputs where two paths that must agree did not.
    pub divergences: u64,
    /// Calls that took over one second.
    pub slow: u64,
    /// CPU/device differences explained by a float-boundary tie.
    pub ties: u64,
    /// Batch steps run (the batch surface; cancelled ones included).
    pub steps: u64,
    /// Request rows those steps sampled and compared.
    pub rows: u64,
    /// The first failures (at most 20), with reproducers.
    pub failures: Vec<Failure>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl Report {
    /// No panic, no divergence, nothing slow.
    pub fn clean(&self) -> bool {
        self.panics == 0 && self.divergences == 0 && self.slow == 0
    }

    fn fail(&mut self, f: Failure) {
        match f.kind {
            "panic" => self.panics += 1,
            "slow" => self.slow += 1,
            _ => self.divergences += 1,
        }
        if self.failures.len() < 20 {
            self.failures.push(f);
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} inputs, {} panics, {} divergences, {} over the time bound, {} tie exceptions, {:.1} s",
            self.inputs,
            self.panics,
            self.divergences,
            self.slow,
            self.ties,
            self.elapsed.as_secs_f64()
        )?;
        if self.steps > 0 {
            write!(f, " ({} steps, {} rows)", self.steps, self.rows)?;
        }
        for x in &self.failures {
            write!(
                f,
                "\n  {} at input {}: {}\n    reproducer: {}",
                x.kind, x.index, x.detail, x.reproducer
            )?;
        }
        Ok(())
    }
}

const SLOW: Duration = Duration::from_secs(1);

/// The RNG of input `index` of a run with `seed`.
fn rng_for(seed: u64, index: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(index);
    r
}

/// Run `f` under `catch_unwind`, timing it: `Err(kind, detail)` on a panic
/// or a call over one second.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, (&'static str, String)> {
    let t0 = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(f));
    let dt = t0.elapsed();
    match r {
        Ok(v) if dt > SLOW => {
            let _ = v;
            Err(("slow", format!("took {:.2} s", dt.as_secs_f64())))
        }
        Ok(v) => Ok(v),
        Err(p) => Err(("panic", panic_message(&*p))),
    }
}

/// The text of a caught panic.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

/// Shrink `input` while `fails` holds: drop chunks of halving size, then
/// single bytes, at most a few thousand tries.
fn shrink(input: &[u8], fails: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut cur = input.to_vec();
    let mut chunk = (cur.len() / 2).max(1);
    let mut tries = 0;
    while chunk >= 1 && tries < 4000 {
        let mut i = 0;
        let mut progress = false;
        while i < cur.len() && tries < 4000 {
            let mut cand = cur.clone();
            let end = (i + chunk).min(cand.len());
            cand.drain(i..end);
            tries += 1;
            if fails(&cand) {
                cur = cand;
                progress = true;
            } else {
                i += chunk;
            }
        }
        if !progress {
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    cur
}

/// Run one text input through `f` (which may panic or be slow); on failure
/// record it with a shrunk reproducer.
fn check_text(report: &mut Report, index: u64, label: &str, text: &str, f: impl Fn(&str) + Copy) {
    if let Err((kind, detail)) = guarded(|| f(text)) {
        let still = |b: &[u8]| {
            let t = String::from_utf8_lossy(b);
            matches!(guarded(|| f(&t)), Err((k, _)) if k == kind)
        };
        let small = if kind == "panic" {
            shrink(text.as_bytes(), still)
        } else {
            text.as_bytes().to_vec()
        };
        let shown: String = String::from_utf8_lossy(&small).chars().take(2000).collect();
        report.fail(Failure {
            kind,
            index,
            reproducer: format!("{label}: {shown:?}"),
            detail,
        });
    }
}

// ---------------------------------------------------------------- config ---

const WEIRD_VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "1.0",
    "2",
    "40",
    "-0",
    "1e-39",
    "1e39",
    "-1e39",
    "3.4e38",
    "inf",
    "-inf",
    "nan",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "\"x\"",
    "\"output\"",
    "\"prompt_and_output\"",
    "true",
    "[]",
    "[[]]",
    "[[1, 2], [3]]",
    "{}",
    "{ 5 = 1.5 }",
    "{ 5 = -inf, 7 = 2 }",
    "[[5, -inf]]",
    "0x10",
    "1_000",
    "+1",
    "01",
    "1.5e",
    "\"\"",
];

const TOML_NOISE: &[&str] = &[
    "\n", "[", "]", "[[", "]]", "=", "\"", "'", "#", ",", ".", "{", "}", "stage", "type",
    "samplers", "seed", "device", "kind", "offload", "\"auto\"", "\"off\"", "\u{0}", "é", "\r\n",
    "\t", "top_k", "k",
];

fn pick<'a, T>(r: &mut ChaCha8Rng, xs: &'a [T]) -> &'a T {
    &xs[r.random_range(0..xs.len())]
}

fn random_kind(r: &mut ChaCha8Rng) -> StageKind {
    StageKind::ALL[r.random_range(0..StageKind::COUNT)]
}

/// A stage name: canonical, an alias, in odd case, or a typo.
fn random_name(r: &mut ChaCha8Rng) -> String {
    let m = random_kind(r).meta();
    let mut name = match r.random_range(0..4) {
        0 if !m.aliases.is_empty() => pick(r, m.aliases).to_string(),
        1 => m.name.to_ascii_uppercase(),
        2 => {
            let mut s = m.name.to_string();
            if !s.is_empty() {
                let at = r.random_range(0..s.len());
                s.replace_range(at..at + 1, "x");
            }
            s
        }
        _ => m.name.to_string(),
    };
    if r.random_bool(0.05) {
        name = name.replace('_', "-");
    }
    name
}

/// A value for a parameter: its default, an edge of its range, or noise.
fn random_value_text(r: &mut ChaCha8Rng, kind: ParamKind, default: &ParamValue) -> String {
    if r.random_bool(0.5) {
        return pick(r, WEIRD_VALUES).to_string();
    }
    match kind {
        ParamKind::Int => r.random_range(-3i64..200).to_string(),
        ParamKind::Float => format!("{:?}", r.random_range(-1.5f32..2.5)),
        ParamKind::Enum(words) => format!("\"{}\"", pick(r, words)),
        _ => default.to_toml(),
    }
}

fn random_toml(r: &mut ChaCha8Rng) -> String {
    let n = r.random_range(0..6);
    let mut out = String::new();
    if r.random_bool(0.3) {
        out.push_str(&format!("seed = {}\n", pick(r, WEIRD_VALUES)));
    }
    let kinds: Vec<StageKind> = (0..n).map(|_| random_kind(r)).collect();
    if r.random_bool(0.8) {
        let names: Vec<String> = kinds
            .iter()
            .map(|k| {
                if r.random_bool(0.9) {
                    k.name().to_string()
                } else {
                    random_name(r)
                }
            })
            .collect();
        out.push_str(&format!("samplers = \"{}\"\n", names.join(";")));
        for k in &kinds {
            let m = k.meta();
            if m.params.is_empty() || r.random_bool(0.3) {
                continue;
            }
            out.push_str(&format!("\n[{}]\n", m.name));
            for p in m.params {
                if r.random_bool(0.6) {
                    let v = random_value_text(r, p.kind, &p.default_value());
                    out.push_str(&format!("{} = {v}\n", p.name));
                }
            }
        }
    } else {
        for k in &kinds {
            let m = k.meta();
            out.push_str(&format!("\n[[stage]]\ntype = \"{}\"\n", m.name));
            for p in m.params {
                if r.random_bool(0.5) {
                    let v = random_value_text(r, p.kind, &p.default_value());
                    out.push_str(&format!("{} = {v}\n", p.name));
                }
            }
        }
    }
    if r.random_bool(0.2) {
        out.push_str(&format!(
            "\n[device]\nkind = \"{}\"\noffload = {}\n",
            pick(r, &["cpu", "flex", "cuda:1", "flex:0", "gpu", "wgpu"]),
            pick(r, &["\"auto\"", "\"off\"", "2", "-1", "\"x\""])
        ));
    }
    out
}

/// Random byte-level edits: insert noise, delete, duplicate a line.
fn mutate(r: &mut ChaCha8Rng, text: &str) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for _ in 0..r.random_range(1..5) {
        match r.random_range(0..4) {
            0 => {
                let at = r.random_range(0..=s.len());
                let noise: Vec<char> = pick(r, TOML_NOISE).chars().collect();
                s.splice(at..at, noise);
            }
            1 if !s.is_empty() => {
                let at = r.random_range(0..s.len());
                let end = (at + r.random_range(1..8)).min(s.len());
                s.drain(at..end);
            }
            2 => {
                let t: String = s.iter().collect();
                let lines: Vec<&str> = t.lines().collect();
                if !lines.is_empty() {
                    let l = pick(r, &lines).to_string();
                    s.extend(format!("\n{l}\n").chars());
                }
            }
            _ if !s.is_empty() => {
                let at = r.random_range(0..s.len());
                s[at] = *pick(r, &['0', '9', '"', '[', '-', 'e', '.', ' ']);
            }
            _ => {}
        }
    }
    s.into_iter().collect()
}

/// A random, valid chain spec (every parameter inside its range).
fn random_spec(r: &mut ChaCha8Rng) -> ChainSpec {
    let n = r.random_range(1..5);
    let stages = (0..n)
        .map(|_| {
            let kind = random_kind(r);
            let mut s = StageSpec::default_for(kind);
            for pm in kind.meta().params {
                let v = match pm.kind {
                    ParamKind::Int => {
                        let lo = pm.min.unwrap_or(-3.0) as i64;
                        ParamValue::Int(r.random_range(lo..lo + 60))
                    }
                    ParamKind::Float => {
                        let lo = pm.min.unwrap_or(-2.0) as f32;
                        let hi = pm.max.map_or(lo + 3.0, |m| m as f32);
                        let x = if r.random_bool(0.2) {
                            lo
                        } else {
                            r.random_range(lo..=hi.max(lo))
                        };
                        ParamValue::Float(x)
                    }
                    ParamKind::Enum(_) => ParamValue::Scope(if r.random_bool(0.5) {
                        HistoryScope::Output
                    } else {
                        HistoryScope::PromptAndOutput
                    }),
                    ParamKind::TokenSequences => ParamValue::Seqs(
                        (0..r.random_range(0..3))
                            .map(|_| {
                                (0..r.random_range(1..3))
                                    .map(|_| r.random_range(0..20))
                                    .collect()
                            })
                            .collect(),
                    ),
                    ParamKind::TokenIds => ParamValue::Ids(
                        (0..r.random_range(0..3))
                            .map(|_| r.random_range(0..20))
                            .collect(),
                    ),
                    ParamKind::TokenBiases => ParamValue::Biases(
                        (0..r.random_range(0..4))
                            .map(|_| {
                                let b = if r.random_bool(0.2) {
                                    f32::NEG_INFINITY
                                } else {
                                    r.random_range(-3.0f32..3.0)
                                };
                                (r.random_range(0..40), b)
                            })
                            .collect(),
                    ),
                };
                let _ = s.set_param(pm.name, v);
            }
            if s.validate().is_err() {
                StageSpec::default_for(kind)
            } else {
                s
            }
        })
        .collect();
    ChainSpec::new(stages, Some(r.random()))
}

/// Keys the flat and `generation_config` generators draw from: every flat
/// key, plus decoding keys that only `generation_config.json` has and a typo.
const EXTRA_KEYS: &[&str] = &["num_beams", "suppress_tokens", "top_kk"];

const JSON_VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "2.5",
    "1e39",
    "-1e39",
    "1e-39",
    "40",
    "-2",
    "9223372036854775808",
    "18446744073709551615",
    "null",
    "true",
    "false",
    "\"x\"",
    "[]",
    "[[1,2],[3]]",
    "[[]]",
    "{}",
    "{\"5\": -1.5}",
    "{\"007\": 1}",
    "{\"x\": 1}",
    "{\"4294967296\": 1}",
    "[1, 2]",
];

fn random_flat_json(r: &mut ChaCha8Rng) -> String {
    let n = r.random_range(0..6);
    let keys = chain_config::flat_keys();
    let fields: Vec<String> = (0..n)
        .map(|_| {
            let k = if r.random_bool(0.1) {
                pick(r, EXTRA_KEYS)
            } else {
                pick(r, &keys)
            };
            let v = if r.random_bool(0.4) {
                pick(r, JSON_VALUES).to_string()
            } else {
                format!("{:?}", r.random_range(-0.5f32..1.5))
            };
            format!("\"{k}\": {v}")
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

fn run_config_one(r: &mut ChaCha8Rng, report: &mut Report, index: u64) {
    let no_select = LoadOptions {
        require_selection: false,
    };
    match r.random_range(0..8) {
        0 | 1 => {
            let mut t = random_toml(r);
            if r.random_bool(0.5) {
                t = mutate(r, &t);
            }
            check_text(report, index, "toml", &t, |t| {
                if let Ok(cfg) = ChainConfig::from_toml_str_with(t, &no_select) {
                    let again = ChainConfig::from_toml_str_with(&cfg.to_toml_string(), &no_select)
                        .expect("a loaded chain's TOML loads");
                    assert_eq!(again.chain, cfg.chain, "TOML round trip changed the chain");
                }
            });
        }
        2 => {
            let names: Vec<String> = (0..r.random_range(0..6)).map(|_| random_name(r)).collect();
            let sep = pick(r, &[";", ",", " ", "; ", ";;"]);
            let mut s = names.join(sep);
            if r.random_bool(0.3) {
                s = mutate(r, &s);
            }
            check_text(report, index, "chain string", &s, |s| {
                let _ = ChainConfig::from_chain_string(s);
                let _ = ChainConfig::from_sampling_seq(s);
            });
        }
        3 | 4 => {
            let spec = random_spec(r);
            let mut text = serde_json::to_string(&spec).expect("serialises");
            let mutated = r.random_bool(0.5);
            if mutated {
                text = mutate(r, &text);
            }
            check_text(report, index, "tagged json", &text, |t| {
                if let Ok(cfg) = ChainConfig::from_json_with(t, &no_select) {
                    let again = serde_json::to_string(&cfg.chain).expect("serialises");
                    let back = ChainConfig::from_json_with(&again, &no_select)
                        .expect("a loaded chain's JSON loads");
                    assert_eq!(back.chain, cfg.chain, "JSON round trip changed the chain");
                }
            });
            if !mutated {
                // A valid spec's own JSON loads, as that spec.
                let text = serde_json::to_string(&spec).expect("serialises");
                check_text(report, index, "tagged json of a valid spec", &text, |t| {
                    let back =
                        serde_json::from_str::<ChainSpec>(t).expect("a valid spec's JSON loads");
                    assert_eq!(back, spec, "JSON round trip changed a valid spec");
                });
                // A valid spec written as TOML loads back to itself.
                let cfg = ChainConfig::validated(spec.clone(), Default::default(), &no_select);
                if let Ok(cfg) = cfg {
                    let t = cfg.to_toml_string();
                    check_text(report, index, "toml writer", &t, |t| {
                        let back = ChainConfig::from_toml_str_with(t, &no_select)
                            .expect("the writer's TOML loads");
                        assert_eq!(
                            back.chain.stages.len(),
                            cfg.chain.stages.len(),
                            "TOML writer lost stages"
                        );
                    });
                }
            }
        }
        5 | 6 => {
            let mut t = random_flat_json(r);
            if r.random_bool(0.3) {
                t = mutate(r, &t);
            }
            check_text(report, index, "flat json", &t, |t| {
                if let Ok(p) = SamplingParams::from_json_str(t) {
                    let _ = p.to_chain();
                }
            });
        }
        _ => {
            let mut t = random_flat_json(r);
            if r.random_bool(0.3) {
                t = mutate(r, &t);
            }
            check_text(report, index, "generation_config", &t, |t| {
                if let Ok(g) = GenerationConfig::from_json_str(t) {
                    let _ = g.to_params().to_chain();
                }
            });
        }
    }
}

// ------------------------------------------------------------------- cpu ---

/// A hostile row: ties, `-inf`, huge values, sometimes NaN or `+inf`, or empty.
fn random_row(r: &mut ChaCha8Rng, vocab: usize) -> Vec<f32> {
    let style = r.random_range(0..6);
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| match style {
            0 => r.random_range(0..5) as f32 - 2.0,
            1 => r.random_range(-8.0f32..8.0),
            2 => {
                if r.random_bool(0.3) {
                    f32::NEG_INFINITY
                } else {
                    r.random_range(0..7) as f32 * 0.5
                }
            }
            3 => *pick(r, &[f32::MAX, -f32::MAX, 1e30, -1e30, 0.0, 1e-30]),
            4 => 0.0,
            _ => r.random_range(1e-4f32..1.0).ln(),
        })
        .collect();
    if vocab > 0 && r.random_bool(0.05) {
        let at = r.random_range(0..vocab);
        row[at] = *pick(r, &[f32::NAN, f32::INFINITY]);
    }
    row
}

fn run_cpu_one(r: &mut ChaCha8Rng, report: &mut Report, index: u64) {
    let mut spec = random_spec(r);
    if !spec.selects() || r.random_bool(0.5) {
        spec.stages.push(if r.random_bool(0.5) {
            StageSpec::Dist
        } else {
            StageSpec::Greedy
        });
    }
    let vocab = *pick(r, &[0usize, 1, 2, 3, 8, 40, 300, 2000]);
    let row = random_row(r, vocab);
    let history: Vec<TokenId> = (0..r.random_range(0..8))
        .map(|_| r.random_range(0..vocab.max(1) as u32))
        .collect();
    let case = format!("spec {spec:?} row {row:?} history {history:?}");
    let outcome = guarded(|| {
        let mut reference = sampler_cpu::build_chain(&spec).expect("valid spec");
        reference.accept_prompt(&history);
        let mut fast = reference.clone();
        let a = reference.sample_from(0, &mut Candidates::from_logits(&row));
        let b = sampler_cpu::sample_batch(&row, 1, vocab, std::slice::from_mut(&mut fast))
            .map(|mut v| v.remove(0));
        (a, b)
    });
    match outcome {
        Err((kind, detail)) => report.fail(Failure {
            kind,
            index,
            reproducer: case,
            detail,
        }),
        Ok((a, Ok(b))) if a != b => report.fail(Failure {
            kind: "divergence",
            index,
            reproducer: case,
            detail: format!("reference {a:?} != fast {b:?}"),
        }),
        Ok(_) => {}
    }
}

// -------------------------------------------------------------- executor ---

/// One stage of a device-capable or host kind with per-row parameters.
fn exec_stage(kind: u8, r: &mut ChaCha8Rng, vocab: usize) -> StageSpec {
    match kind {
        0 => StageSpec::TopK {
            k: *pick(r, &[0i64, 1, 2, 3, 5, 8, 40]),
        },
        1 => StageSpec::TopP {
            p: *pick(r, &[0.0f32, 0.3, 0.5, 0.9, 1.0]),
            min_keep: *pick(r, &[0usize, 1, 3, 6]),
        },
        2 => StageSpec::MinP {
            p: *pick(r, &[0.0f32, 0.05, 0.5, 1.0, 1.2]),
            min_keep: *pick(r, &[0usize, 2, 6]),
        },
        3 => StageSpec::Temperature {
            t: *pick(r, &[0.0f32, 1e-6, 0.5, 1.0, 1.7]),
            dynatemp_range: *pick(r, &[0.0f32, 0.0, 0.5]),
            dynatemp_exponent: *pick(r, &[1.0f32, 0.0, 2.0]),
        },
        4 => StageSpec::Penalties {
            last_n: *pick(r, &[0usize, 3, 64]),
            repeat: *pick(r, &[1.0f32, 1.3]),
            frequency: *pick(r, &[0.0f32, 0.2]),
            presence: *pick(r, &[0.0f32, 0.5]),
            scope: HistoryScope::Output,
        },
        5 => StageSpec::LogitBias {
            bias: (0..r.random_range(0..3))
                .map(|_| {
                    (
                        r.random_range(0..vocab as u32),
                        *pick(r, &[2.0f32, -1.0, f32::NEG_INFINITY]),
                    )
                })
                .collect(),
        },
        6 => StageSpec::Epsilon {
            epsilon: *pick(r, &[0.0f32, 0.02, 0.2, 0.6]),
            min_keep: *pick(r, &[0usize, 3]),
        },
        7 => StageSpec::Eta {
            epsilon: *pick(r, &[0.0f32, 0.01, 0.3]),
            min_keep: *pick(r, &[0usize, 2]),
        },
        8 => StageSpec::Mirostat {
            tau: 3.0,
            eta: 0.1,
            m: 20,
        },
        9 => StageSpec::Typical {
            p: *pick(r, &[0.5f32, 0.9]),
            min_keep: 0,
        },
        10 => StageSpec::Xtc {
            probability: *pick(r, &[0.5f32, 1.0]),
            threshold: *pick(r, &[0.0f32, 0.1, 0.3]),
            min_keep: 0,
        },
        11 => StageSpec::Greedy,
        _ => StageSpec::Dist,
    }
}

fn run_executor_one(r: &mut ChaCha8Rng, device: &Device, report: &mut Report, index: u64) {
    let batch = r.random_range(1..4);
    let vocab = *pick(r, &[2usize, 5, 16, 40, 300]);
    let kinds: Vec<u8> = (0..r.random_range(0..5))
        .map(|_| r.random_range(0..13))
        .collect();
    let last = *pick(r, &[11u8, 12, 12]);
    let rows: Vec<ChainSpec> = (0..batch)
        .map(|_| {
            // Half the rows share the batch's chain shape, half have their own
            // (kinds, order, length and selecting stage all differ).
            let (own, own_last): (Vec<u8>, u8) = if r.random_bool(0.5) {
                let n = r.random_range(0..5);
                (
                    (0..n).map(|_| r.random_range(0..13)).collect(),
                    *pick(r, &[11u8, 12, 12]),
                )
            } else {
                (kinds.clone(), last)
            };
            let mut st: Vec<StageSpec> = own.iter().map(|&k| exec_stage(k, r, vocab)).collect();
            st.push(exec_stage(own_last, r, vocab));
            ChainSpec::new(st, Some(r.random()))
        })
        .collect();
    let logits: Vec<f32> = (0..batch).flat_map(|_| random_row(r, vocab)).collect();
    let prompts: Vec<Vec<TokenId>> = (0..batch)
        .map(|_| {
            (0..r.random_range(0..5))
                .map(|_| r.random_range(0..vocab as u32))
                .collect()
        })
        .collect();
    let mut policies = vec![
        OffloadPolicy::Auto,
        OffloadPolicy::Off,
        OffloadPolicy::Device,
    ];
    policies.push(OffloadPolicy::Stages(r.random_range(0..kinds.len() + 2)));
    let case = format!("rows {rows:?} logits {logits:?} prompts {prompts:?}");
    let outcome = guarded(|| {
        let mut chains: Vec<_> = rows
            .iter()
            .map(|s| sampler_cpu::build_chain(s).expect("valid"))
            .collect();
        for (c, p) in chains.iter_mut().zip(&prompts) {
            c.accept_prompt(p);
        }
        let want = sampler_cpu::sample_batch(&logits, batch, vocab, &mut chains).expect("shape");
        let mut got = Vec::new();
        for &policy in &policies {
            let mut ex = Executor::new(rows.clone(), vocab, device, policy).expect("executor");
            for (i, p) in prompts.iter().enumerate() {
                ex.accept_prompt(i, p).expect("row");
            }
            let t = Tensor::<2>::from_data(TensorData::new(logits.clone(), [batch, vocab]), device);
            got.push((policy, ex.step(t).expect("step").tokens));
        }
        (want, got)
    });
    match outcome {
        Err((kind, detail)) => report.fail(Failure {
            kind,
            index,
            reproducer: case,
            detail,
        }),
        Ok((want, got)) => {
            for (policy, tokens) in got {
                for (row, (g, w)) in tokens.iter().zip(&want).enumerate() {
                    if g == w {
                        continue;
                    }
                    let lrow = &logits[row * vocab..(row + 1) * vocab];
                    if conformance::boundary_reason(&rows[row], lrow, &prompts[row]).is_some() {
                        report.ties += 1;
                    } else {
                        report.fail(Failure {
                            kind: "divergence",
                            index,
                            reproducer: format!(
                                "row {row} policy {policy:?}: chain {:?} row {lrow:?} prompt {:?}",
                                rows[row], prompts[row]
                            ),
                            detail: format!("device {g:?} != cpu {w:?}"),
                        });
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------- batch ---

/// One request of a batch session, with its oracle: the same request run
/// alone on sampler-cpu (same seed, prompt, masks and accepted tokens).
struct Live {
    id: RequestId,
    spec: ChainSpec,
    oracle: Chain,
    prompt: Vec<TokenId>,
    outputs: Vec<TokenId>,
}

/// A serving request's chain: the executor's stages, sometimes a `mask`
/// and a `min_tokens` in front, sometimes logprobs.
fn batch_spec(r: &mut ChaCha8Rng, vocab: usize) -> ChainSpec {
    let mut st = Vec::new();
    if r.random_bool(0.25) {
        st.push(StageSpec::Mask);
    }
    if r.random_bool(0.2) {
        st.push(StageSpec::MinTokens {
            n: r.random_range(1..4),
            stop: (0..r.random_range(1..3))
                .map(|_| r.random_range(0..vocab as u32))
                .collect(),
        });
    }
    for _ in 0..r.random_range(0..4) {
        st.push(exec_stage(r.random_range(0..13), r, vocab));
    }
    st.push(exec_stage(*pick(r, &[11u8, 12, 12]), r, vocab));
    let mut spec = ChainSpec::new(st, Some(r.random()));
    if r.random_bool(0.35) {
        spec.logprobs = Some(LogprobsSpec {
            top_n: r.random_range(0..5),
            token_ids: (0..r.random_range(0..3))
                .map(|_| r.random_range(0..vocab as u32))
                .collect(),
            mode: *pick(r, &[LogprobsMode::Raw, LogprobsMode::Processed]),
        });
    }
    spec
}

/// Relative closeness of two logprobs (`-inf` only equals `-inf`).
fn lp_close(a: f32, b: f32) -> bool {
    a == b || (a - b).abs() <= 1e-4 * b.abs().max(1.0)
}

/// Where two steps' logprobs differ beyond the tolerance, if anywhere.
fn logprobs_differ(got: &Option<Logprobs>, want: &Option<Logprobs>) -> Option<String> {
    let (g, w) = match (got, want) {
        (None, None) => return None,
        (Some(g), Some(w)) => (g, w),
        _ => return Some(format!("logprobs {got:?} vs {want:?}")),
    };
    let ids = |l: &Logprobs| l.top.iter().map(|p| p.0).collect::<Vec<_>>();
    let pairs = std::iter::once((g.token, w.token))
        .chain(g.requested.iter().copied().zip(w.requested.iter().copied()))
        .chain(g.top.iter().copied().zip(w.top.iter().copied()));
    let values_ok = pairs
        .into_iter()
        .all(|((ia, a), (ib, b))| ia == ib && lp_close(a, b));
    if ids(g) != ids(w) || g.requested.len() != w.requested.len() || !values_ok {
        Some(format!("logprobs {g:?} vs CPU {w:?}"))
    } else {
        None
    }
}

/// A session of a [`SamplingBatch`] driven the way an engine drives it:
/// requests inserted, removed, updated and reset between steps, random
/// subsets of them stepped in random order, `step` or pipelined
/// `submit` / `finish` or a cancelled step, one-step masks, `min_tokens`,
/// logprobs, one offload policy; every request's tokens, errors and
/// logprobs against the request run alone on sampler-cpu.
fn run_batch_one(
    r: &mut ChaCha8Rng,
    device: &Device,
    step_limit: Duration,
    report: &mut Report,
    index: u64,
) {
    let vocab = *pick(r, &[2usize, 5, 16, 40, 300]);
    let policy = *pick(
        r,
        &[
            OffloadPolicy::Auto,
            OffloadPolicy::Off,
            OffloadPolicy::Device,
            OffloadPolicy::Stages(1),
            OffloadPolicy::Stages(2),
        ],
    );
    let mut log: Vec<String> = vec![format!("vocab {vocab} policy {policy:?}")];
    let mut failures: Vec<Failure> = Vec::new();
    let (mut ties, mut steps, mut compared) = (0u64, 0u64, 0u64);
    // Each step is timed on its own (`step_limit`); the session is not.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut batch = SamplingBatch::new(vocab, device, policy).expect("batch");
        let mut live: Vec<Live> = Vec::new();
        let insert = |r: &mut ChaCha8Rng,
                      batch: &mut SamplingBatch,
                      live: &mut Vec<Live>,
                      log: &mut Vec<String>| {
            let spec = batch_spec(r, vocab);
            let prompt: Vec<TokenId> = (0..r.random_range(0..6))
                .map(|_| r.random_range(0..vocab as u32))
                .collect();
            log.push(format!("insert {spec:?} prompt {prompt:?}"));
            let id = batch
                .insert(spec.clone(), &prompt)
                .expect("a valid request");
            let mut oracle = sampler_cpu::build_chain(&spec).expect("valid");
            oracle.accept_prompt(&prompt);
            live.push(Live {
                id,
                spec,
                oracle,
                prompt,
                outputs: Vec::new(),
            });
        };
        for _ in 0..r.random_range(1..4) {
            insert(r, &mut batch, &mut live, &mut log);
        }
        for step in 0..r.random_range(2..9) {
            // Between steps: the request set and the chains change.
            if r.random_bool(0.2) {
                insert(r, &mut batch, &mut live, &mut log);
            }
            if !live.is_empty() && r.random_bool(0.1) {
                let gone = live.swap_remove(r.random_range(0..live.len()));
                log.push(format!("remove {:?}", gone.id));
                batch.remove(gone.id).expect("remove");
            }
            if !live.is_empty() && r.random_bool(0.1) {
                let l = r.random_range(0..live.len());
                let spec = ChainSpec {
                    seed: live[l].spec.seed,
                    ..batch_spec(r, vocab)
                };
                log.push(format!("update {:?} to {spec:?}", live[l].id));
                batch.update(live[l].id, spec.clone()).expect("update");
                // The batch's rule: the new chain sees the whole history at
                // the same step; an unchanged stage at the same position keeps
                // its state.
                let l = &mut live[l];
                let mut oracle = sampler_cpu::build_chain(&spec).expect("valid");
                oracle.accept_prompt(&l.prompt);
                for &t in &l.outputs {
                    oracle.accept(t, TokenOrigin::Output);
                }
                oracle.set_step(l.oracle.step());
                for (i, (old, new)) in l.spec.stages.iter().zip(&spec.stages).enumerate() {
                    if old == new {
                        std::mem::swap(&mut oracle.stages_mut()[i], &mut l.oracle.stages_mut()[i]);
                    }
                }
                l.oracle = oracle;
                l.spec = spec;
            }
            if !live.is_empty() && r.random_bool(0.05) {
                let at = r.random_range(0..live.len());
                let l = &mut live[at];
                log.push(format!("reset {:?}", l.id));
                batch.reset(l.id).expect("reset");
                l.oracle = sampler_cpu::build_chain(&l.spec).expect("valid");
                l.prompt.clear();
                l.outputs.clear();
            }
            // The step: a random subset in random order.
            let mut rows: Vec<usize> = (0..live.len()).filter(|_| r.random_bool(0.75)).collect();
            if rows.is_empty() {
                continue;
            }
            for i in (1..rows.len()).rev() {
                rows.swap(i, r.random_range(0..=i));
            }
            let logits: Vec<Vec<f32>> = rows.iter().map(|_| random_row(r, vocab)).collect();
            let mut masks: Vec<Option<Vec<u32>>> = Vec::new();
            for &l in &rows {
                let words = vocab.div_ceil(32);
                let mask = (live[l].spec.stages.first() == Some(&StageSpec::Mask)
                    && r.random_bool(0.7))
                .then(|| {
                    (0..words)
                        .map(|_| r.random::<u32>() & r.random::<u32>())
                        .collect::<Vec<u32>>()
                });
                if let Some(m) = &mask {
                    batch.set_mask(live[l].id, Some(m)).expect("mask");
                }
                masks.push(mask);
            }
            let ids: Vec<RequestId> = rows.iter().map(|&l| live[l].id).collect();
            let flat: Vec<f32> = logits.concat();
            let t = Tensor::<2>::from_data(TensorData::new(flat, [rows.len(), vocab]), device);
            let mode = r.random_range(0..20);
            log.push(format!(
                "step {step}: rows {ids:?} masks {masks:?} logits {logits:?} mode {mode}"
            ));
            let t0 = Instant::now();
            let out = match mode {
                0..=9 => Some(batch.step(&ids, t).expect("step")),
                10..=16 => {
                    let p = batch.submit(&ids, t).expect("submit");
                    Some(batch.finish(p).expect("finish"))
                }
                _ => {
                    let p = batch.submit(&ids, t).expect("submit");
                    batch.cancel(p).expect("cancel");
                    None
                }
            };
            steps += 1;
            if t0.elapsed() > step_limit {
                failures.push(Failure {
                    kind: "slow",
                    index,
                    reproducer: log.join("\n"),
                    detail: format!("step {step} took {:?}", t0.elapsed()),
                });
            }
            let Some(out) = out else {
                continue; // cancelled: nothing recorded, the masks gone
            };
            for (j, &l) in rows.iter().enumerate() {
                compared += 1;
                let req = &mut live[l];
                let mut oracle = req.oracle.clone();
                if let Some(m) = &masks[j] {
                    oracle.set_token_mask(Some(std::sync::Arc::from(m.as_slice())));
                }
                let want = match &req.spec.logprobs {
                    Some(lp) => oracle
                        .sample_logprobs(&logits[j], lp)
                        .map(|(t, l)| (t, Some(l))),
                    None => oracle.sample_logits(&logits[j]).map(|t| (t, None)),
                };
                oracle.set_token_mask(None);
                let got = out.tokens[j].clone().map(|t| (t, out.logprobs[j].clone()));
                let diverged = |detail: String| Failure {
                    kind: "divergence",
                    index,
                    reproducer: format!("{}\n(row {j}, request {:?})", log.join("\n"), req.id),
                    detail,
                };
                // A difference within float rounding of a boundary (a top_p
                // or dist cut) is a tie exception, not a failure.
                let mut tie_or_fail = |detail: String| {
                    let tie = conformance::boundary_reason_after(
                        &req.spec,
                        &logits[j],
                        &req.prompt,
                        &req.outputs,
                    );
                    match tie {
                        Some(_) => ties += 1,
                        None => failures.push(diverged(detail)),
                    }
                };
                match (&got, &want) {
                    (Ok((g, glp)), Ok((w, wlp))) if g == w => {
                        // Processed logprobs depend on the final set: a cut
                        // at its boundary (a uniform row at top_p = k / N)
                        // may keep one candidate more.
                        if let Some(d) = logprobs_differ(glp, wlp) {
                            tie_or_fail(d);
                        }
                        req.oracle = oracle;
                        req.outputs.push(*g);
                    }
                    (Ok((g, _)), Ok((w, _))) => {
                        tie_or_fail(format!("token {g} vs CPU {w}"));
                        // Follow the batch: the request accepted its token.
                        req.oracle.commit(*g);
                        req.outputs.push(*g);
                    }
                    (Err(g), Err(w)) if g == w => {}
                    _ => {
                        let detail = format!("{got:?} vs CPU {want:?}");
                        failures.push(diverged(detail));
                    }
                }
            }
        }
    }));
    report.ties += ties;
    report.steps += steps;
    report.rows += compared;
    if let Err(p) = outcome {
        failures.push(Failure {
            kind: "panic",
            index,
            reproducer: log.join("\n"),
            detail: panic_message(&*p),
        });
    }
    // One failure per input is enough to replay it.
    if let Some(f) = failures.into_iter().next() {
        report.fail(f);
    }
}

// ----------------------------------------------------------------- files ---

fn npy_bytes(r: &mut ChaCha8Rng) -> Vec<u8> {
    let shape = pick(
        r,
        &[
            "(2, 3)",
            "(3,)",
            "(0, 8)",
            "(-2, 8)",
            "(4294967296, 4294967296)",
            "(2, 9223372036854775808)",
            "(1, 2, 3)",
            "()",
            "(2, x)",
            "(18446744073709551616,)",
        ],
    );
    let descr = pick(r, &["<f4", "<f8", "<f2", ">f4", "<i4", "|u1", "<f16"]);
    let fortran = pick(r, &["False", "True"]);
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY".to_vec();
    b.push(*pick(r, &[1u8, 2, 3, 9]));
    b.push(0);
    if b[6] == 1 {
        b.extend((header.len() as u16).to_le_bytes());
    } else {
        b.extend((header.len() as u32).to_le_bytes());
    }
    b.extend(header.as_bytes());
    let n = r.random_range(0..64);
    b.extend((0..n).map(|_| r.random::<u8>()));
    b
}

fn safetensors_bytes(r: &mut ChaCha8Rng) -> Vec<u8> {
    let dtype = pick(r, &["F32", "F16", "BF16", "F64", "I32", "X"]);
    let shape = pick(
        r,
        &[
            "[1,3]",
            "[2,2]",
            "[3]",
            "[]",
            "[-2,2]",
            "[\"2\",2]",
            "[4611686018427387904,8]",
        ],
    );
    let offs = pick(
        r,
        &[
            "[0,12]",
            "[0,16]",
            "[0,18446744073709551615]",
            "[8,4]",
            "[0,0]",
        ],
    );
    let header =
        format!(r#"{{"logits":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offs}}}}}"#);
    let len: u64 = if r.random_bool(0.1) {
        u64::MAX
    } else {
        header.len() as u64
    };
    let mut b = len.to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    let n = r.random_range(0..40);
    b.extend((0..n).map(|_| r.random::<u8>()));
    b
}

fn mutate_bytes(r: &mut ChaCha8Rng, bytes: &mut [u8]) {
    if bytes.is_empty() {
        return;
    }
    for _ in 0..r.random_range(1..6) {
        let at = if r.random_bool(0.7) {
            r.random_range(0..bytes.len().min(64))
        } else {
            r.random_range(0..bytes.len())
        };
        bytes[at] = r.random();
    }
}

fn run_files_one(r: &mut ChaCha8Rng, report: &mut Report, index: u64, models: &Models) {
    use sampler_examples::llama2::{Checkpoint, Tokenizer};
    use sampler_examples::sample_cli::parse_logits;
    use std::path::Path;
    let which = r.random_range(0..4);
    let mut bytes = match which {
        0 => npy_bytes(r),
        1 => safetensors_bytes(r),
        2 => models.tokenizer.clone(),
        _ => models.checkpoint[..models.checkpoint.len().min(4096)].to_vec(),
    };
    if r.random_bool(0.6) {
        mutate_bytes(r, &mut bytes);
    }
    if r.random_bool(0.2) {
        let cut = r.random_range(0..=bytes.len());
        bytes.truncate(cut);
    }
    let run = |b: &[u8]| match which {
        0 => {
            let _ = parse_logits(b, "npy", None);
        }
        1 => {
            let _ = parse_logits(b, "safetensors", None);
        }
        2 => {
            let _ = Tokenizer::from_bytes(Path::new("tok.bin"), b, 512);
        }
        _ => {
            let _ = Checkpoint::from_bytes(Path::new("model.bin"), b);
        }
    };
    if let Err((kind, detail)) = guarded(|| run(&bytes)) {
        let small = shrink(
            &bytes,
            |b| matches!(guarded(|| run(b)), Err((k, _)) if k == kind),
        );
        report.fail(Failure {
            kind,
            index,
            reproducer: format!(
                "{} bytes {:?}",
                ["npy", "safetensors", "tokenizer", "checkpoint"][which],
                &small[..small.len().min(512)]
            ),
            detail,
        });
    }
}

/// The shipped model files the file fuzzer mutates.
struct Models {
    tokenizer: Vec<u8>,
    checkpoint: Vec<u8>,
}

impl Models {
    fn load() -> Models {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K");
        Models {
            tokenizer: std::fs::read(format!("{dir}/tok512.bin")).unwrap_or_default(),
            checkpoint: std::fs::read(format!("{dir}/stories260K.bin")).unwrap_or_default(),
        }
    }
}

/// Run `inputs` inputs of `surface` from `seed`, starting at input `start`,
/// on `flex` (the executor and batch surfaces' device; a batch step over
/// one second is a failure).
pub fn run(surface: Surface, inputs: u64, seed: u64, start: u64) -> Report {
    match sampler_backend::parse_device("flex") {
        Ok(d) => run_on(surface, inputs, seed, start, &d, SLOW),
        Err(_) => Report::default(),
    }
}

/// [`run`] with the executor and batch surfaces on `device`, a batch step
/// over `step_limit` being a failure (a GPU compiles each kernel shape the
/// first time it runs: seconds on a software driver).
pub fn run_on(
    surface: Surface,
    inputs: u64,
    seed: u64,
    start: u64,
    device: &Device,
    step_limit: Duration,
) -> Report {
    // Panics are caught and counted; keep the default hook from printing a
    // backtrace for each one.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let t0 = Instant::now();
    let mut report = Report::default();
    let models = Models::load();
    for index in start..start.saturating_add(inputs) {
        let mut r = rng_for(seed ^ (surface as u64) << 56, index);
        match surface {
            Surface::Config => run_config_one(&mut r, &mut report, index),
            Surface::Cpu => run_cpu_one(&mut r, &mut report, index),
            Surface::Executor => run_executor_one(&mut r, device, &mut report, index),
            Surface::Files => run_files_one(&mut r, &mut report, index, &models),
            Surface::Batch => run_batch_one(&mut r, device, step_limit, &mut report, index),
        }
        report.inputs += 1;
    }
    report.elapsed = t0.elapsed();
    std::panic::set_hook(hook);
    report
}
