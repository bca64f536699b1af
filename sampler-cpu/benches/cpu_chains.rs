//! CPU sampler-chain benchmarks against the floor (one read of the row).
//!
//! Rows ([`zipf_pool`]) are realistic and fixed: heavy-tailed, Zipf-like
//! logits with a fixed seed. Per row, a tail exponent `s` in [1.1, 1.5] and a
//! target top-1 probability in [0.1, 0.6] (evenly spaced over the pool, in
//! random row order); the
//! token of rank `r >= 2` gets `-s·ln r + noise` (noise uniform in
//! ±0.25 nats), the top token the logit that gives it the target probability
//! (kept at least 0.05 above the second); ranks are scattered over token ids
//! by a fresh random permutation per row. The generator checks every row's
//! top-1 probability lies in [0.1, 0.6] and prints, once per vocabulary, the
//! top-1 range and the sizes of the `top_p(0.9)` nucleus and of the
//! `min_p(0.05)` set.
//!
//! Rows rotate through a pool of twice the machine's last-level cache (at
//! least 64 MiB, at most 1 GiB; at batch 32 at least 4 batches), so every
//! iteration reads its row from memory, as a sampler does right after a
//! forward pass. The
//! floor is measured in the same run on the same pool: one pass over the row
//! (a max reduction in 16 independent lanes, so it is bound by memory).
//!
//! Groups: `stages/V=...` (every registered stage as a chain's first
//! stage, `stage; dist`, and after `top_k(40)`, through
//! `Chain::sample_logits`, with the floor and the softmax floor: the
//! maximum and the normaliser `numerics::exp_sum`, what any stage that
//! needs the whole row's softmax pays at least) and `stages_batch32/V=...` (the
//! first-stage chains, 32 rows); `batch1/V=...` (floor, the seven chains through
//! `sampler_cpu::fast::sample_row`; at the largest vocabulary also the
//! README's loop `Chain::sample(&mut Candidates::from_logits(row))`,
//! `Chain::sample_logits(row)`, and the reference stages
//! `Candidates::fill_from_logits` + `Chain::sample_from(0, ..)`) and
//! `batch32/V=...` (`sampler_cpu::sample_batch`, 32 rows, one chain per row;
//! throughput is per token).
//!
//! Run: `cargo bench -p sampler-cpu --bench cpu_chains` (add a filter such as
//! `-- batch1/V=32000`). Results and the machine: docs/benchmarks.md.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::{Rng, SeedableRng, seq::SliceRandom};
use rand_chacha::ChaCha8Rng;
use sampler_core::{Candidates, Chain, ChainSpec, HistoryScope, StageSpec};

/// The pool's least size: twice the last-level cache (read from Linux's
/// sysfs; 32 MiB when unknown), at least 64 MiB and at most 1 GiB; or
/// `BENCH_POOL_MIB` MiB when set (e.g. 4: rows from the cache, to compare
/// the kernels' compute without the memory's noise).
fn min_pool_bytes() -> usize {
    if let Some(mib) = std::env::var("BENCH_POOL_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        return mib.max(1) << 20;
    }
    let l3 = (0..8)
        .filter_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let level = std::fs::read_to_string(format!("{dir}/level")).ok()?;
            let size = std::fs::read_to_string(format!("{dir}/size")).ok()?;
            let size = size.trim();
            let kib: usize = size.strip_suffix('K')?.parse().ok()?;
            (level.trim() == "3").then_some(kib << 10)
        })
        .max()
        .unwrap_or(32 << 20);
    let bytes = (2 * l3).clamp(64 << 20, 1 << 30);
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "last-level cache {} MiB: pools of at least {} MiB",
            l3 >> 20,
            bytes >> 20
        )
    });
    bytes
}
const VOCABS: [usize; 3] = [32_000, 128_256, 151_936];
const BATCH: usize = 32;

/// A pool of `rows` Zipf-like rows `[rows, vocab]` (row-major), at least
/// `min_bytes` in all; see the module docs.
fn zipf_pool(vocab: usize, min_bytes: usize, seed: u64) -> (Vec<f32>, usize) {
    let rows = min_bytes.div_ceil(4 * vocab).max(8);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(rows * vocab);
    let mut perm: Vec<usize> = (0..vocab).collect();
    let mut row = vec![0f32; vocab];
    // Target top-1 probabilities evenly spaced over [0.1, 0.6], in random
    // row order (so any window of rows, e.g. a batch, mixes them).
    let mut order: Vec<usize> = (0..rows).collect();
    order.shuffle(&mut rng);
    for &slot in &order {
        let s: f32 = rng.random_range(1.1..1.5);
        let target_p1: f64 = 0.1 + 0.5 * (slot as f64 + 0.5) / rows as f64;
        perm.shuffle(&mut rng);
        let mut second = f32::NEG_INFINITY;
        let mut rest = 0.0f64;
        for (rank, &id) in perm.iter().enumerate().skip(1) {
            let noise: f32 = rng.random_range(-0.25..0.25);
            let l = -s * ((rank + 1) as f32).ln() + noise;
            row[id] = l;
            second = second.max(l);
            rest += f64::from(l).exp();
        }
        // e^L / (e^L + rest) = target  =>  L = ln(target / (1 - target) * rest).
        let top = (target_p1 / (1.0 - target_p1) * rest).ln() as f32;
        row[perm[0]] = top.max(second + 0.05);
        out.extend_from_slice(&row);
    }
    (out, rows)
}

/// Top-1 probability, `top_p(0.9)` nucleus size and `min_p(0.05)` set size of a row.
fn row_stats(row: &[f32]) -> (f64, usize, usize) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut e: Vec<f64> = row.iter().map(|&l| f64::from(l - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.sort_by(|a, b| b.total_cmp(a));
    let mut cum = 0.0;
    let nucleus = e
        .iter()
        .position(|&x| {
            cum += x / sum;
            cum >= 0.9
        })
        .map_or(e.len(), |i| i + 1);
    let min_p = row.iter().filter(|&&l| l >= max + 0.05f32.ln()).count();
    (e[0] / sum, nucleus, min_p)
}

fn check_and_describe(pool: &[f32], vocab: usize) {
    let mut p1 = Vec::new();
    let mut nucleus = Vec::new();
    let mut min_p = Vec::new();
    for row in pool.chunks_exact(vocab) {
        let (p, n, m) = row_stats(row);
        assert!(
            (0.1..=0.6).contains(&p),
            "generator: top-1 probability {p} outside [0.1, 0.6]"
        );
        p1.push(p);
        nucleus.push(n);
        min_p.push(m);
    }
    nucleus.sort_unstable();
    min_p.sort_unstable();
    let q = |v: &[usize], f: f64| v[((v.len() - 1) as f64 * f) as usize];
    eprintln!(
        "V={vocab}: {} rows; top-1 p in [{:.3}, {:.3}]; top_p(0.9) nucleus min/median/max {}/{}/{}; \
         min_p(0.05) set min/median/max {}/{}/{}",
        p1.len(),
        p1.iter().copied().fold(1.0, f64::min),
        p1.iter().copied().fold(0.0, f64::max),
        q(&nucleus, 0.0),
        q(&nucleus, 0.5),
        q(&nucleus, 1.0),
        q(&min_p, 0.0),
        q(&min_p, 0.5),
        q(&min_p, 1.0),
    );
}

/// The floor: one pass over the row's `vocab` f32 values (a max reduction
/// in 16 independent lanes, so it is bound by memory, not by latency).
fn floor_read(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = row.chunks_exact(16);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    let mut m = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &x in rem {
        m = m.max(x);
    }
    m
}

fn temp(t: f32) -> StageSpec {
    StageSpec::Temperature {
        t,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    }
}

fn chains() -> Vec<(&'static str, Vec<StageSpec>)> {
    vec![
        ("greedy", vec![StageSpec::Greedy]),
        (
            "top_k40_temp_dist",
            vec![StageSpec::TopK { k: 40 }, temp(0.8), StageSpec::Dist],
        ),
        (
            "top_k40_top_p_min_p_temp_dist",
            vec![
                StageSpec::TopK { k: 40 },
                StageSpec::TopP {
                    p: 0.95,
                    min_keep: 1,
                },
                StageSpec::MinP {
                    p: 0.05,
                    min_keep: 1,
                },
                temp(0.8),
                StageSpec::Dist,
            ],
        ),
        (
            "top_p0.9_temp_dist",
            vec![
                StageSpec::TopP {
                    p: 0.9,
                    min_keep: 1,
                },
                temp(0.7),
                StageSpec::Dist,
            ],
        ),
        (
            "min_p0.05_temp_dist",
            vec![
                StageSpec::MinP {
                    p: 0.05,
                    min_keep: 1,
                },
                temp(1.0),
                StageSpec::Dist,
            ],
        ),
        (
            "penalties_top_k40_temp_dist",
            vec![
                StageSpec::Penalties {
                    last_n: 64,
                    repeat: 1.1,
                    frequency: 0.0,
                    presence: 0.0,
                    scope: HistoryScope::PromptAndOutput,
                },
                StageSpec::TopK { k: 40 },
                temp(0.8),
                StageSpec::Dist,
            ],
        ),
        (
            "mirostat_v2",
            vec![StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 }],
        ),
    ]
}

/// A chain with a 64-token history spread over the vocabulary (for the
/// penalties chain; the others ignore it). Sampling keeps it at 64 tokens.
fn chain_with_history(stages: &[StageSpec], vocab: usize, seed: u64) -> Chain {
    let spec = ChainSpec::new(stages.to_vec(), Some(seed));
    let mut chain = sampler_cpu::build_chain(&spec).expect("valid bench chain");
    let history: Vec<u32> = (0..64u64)
        .map(|i| ((i * 2_654_435_761 + seed) % vocab as u64) as u32)
        .collect();
    chain.accept_prompt(&history);
    chain
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
}

fn bench_batch1(c: &mut Criterion) {
    for vocab in VOCABS {
        let (pool, rows) = zipf_pool(vocab, min_pool_bytes(), 0x5eed);
        check_and_describe(&pool, vocab);
        let mut group = c.benchmark_group(format!("batch1/V={vocab}"));
        group.throughput(Throughput::Elements(1));
        let mut r = 0usize;
        group.bench_function("floor_read", |b| {
            b.iter(|| {
                r = (r + 1) % rows;
                black_box(floor_read(&pool[r * vocab..(r + 1) * vocab]))
            })
        });
        for (name, stages) in chains() {
            let mut chain = chain_with_history(&stages, vocab, 42);
            let mut r = 0usize;
            group.bench_function(BenchmarkId::new("fast", name), |b| {
                b.iter(|| {
                    r = (r + 1) % rows;
                    let row = &pool[r * vocab..(r + 1) * vocab];
                    black_box(sampler_cpu::fast::sample_row(row, &mut chain).expect("sampled"))
                })
            });
        }
        // The README's loop (`Chain::sample` on `Candidates::from_logits`,
        // kernels installed by `build_chain`) and `Chain::sample_logits`
        // (the row read in place), largest vocabulary only.
        if vocab == 151_936 {
            for (name, stages) in chains() {
                let mut chain = chain_with_history(&stages, vocab, 42);
                let mut r = 0usize;
                group.bench_function(BenchmarkId::new("chain_sample_from_logits", name), |b| {
                    b.iter(|| {
                        r = (r + 1) % rows;
                        let row = &pool[r * vocab..(r + 1) * vocab];
                        black_box(
                            chain
                                .sample(&mut Candidates::from_logits(row))
                                .expect("sampled"),
                        )
                    })
                });
                let mut r = 0usize;
                group.bench_function(BenchmarkId::new("chain_sample_logits", name), |b| {
                    b.iter(|| {
                        r = (r + 1) % rows;
                        let row = &pool[r * vocab..(r + 1) * vocab];
                        black_box(chain.sample_logits(row).expect("sampled"))
                    })
                });
            }
        }
        // The reference path, for comparison (largest vocabulary only).
        if vocab == 151_936 {
            for (name, stages) in chains() {
                let mut chain = chain_with_history(&stages, vocab, 42);
                let mut cand = Candidates::new();
                let mut r = 0usize;
                group.bench_function(BenchmarkId::new("reference", name), |b| {
                    b.iter(|| {
                        r = (r + 1) % rows;
                        cand.fill_from_logits(&pool[r * vocab..(r + 1) * vocab]);
                        black_box(chain.sample_from(0, &mut cand).expect("sampled"))
                    })
                });
            }
        }
        group.finish();
    }
}

/// One batch-32 `sampler_cpu::sample_batch` per iteration over windows of
/// the pool `[rows, vocab]`, one chain per row.
fn iter_batch32(
    b: &mut criterion::Bencher<'_>,
    pool: &[f32],
    rows: usize,
    vocab: usize,
    chains: &mut [Chain],
) {
    let mut r = 0usize;
    b.iter(|| {
        // A step coprime with the window count: every window is used.
        r = (r + BATCH + 1) % (rows - BATCH);
        let out =
            sampler_cpu::sample_batch(&pool[r * vocab..(r + BATCH) * vocab], BATCH, vocab, chains)
                .expect("shape ok");
        black_box(out)
    })
}

fn bench_batch32(c: &mut Criterion) {
    for vocab in VOCABS {
        let (pool, rows) = zipf_pool(vocab, min_pool_bytes().max(4 * BATCH * 4 * vocab), 0xba7c);
        let mut group = c.benchmark_group(format!("batch32/V={vocab}"));
        group.throughput(Throughput::Elements(BATCH as u64));
        for (name, stages) in chains() {
            let mut chains: Vec<Chain> = (0..BATCH as u64)
                .map(|i| chain_with_history(&stages, vocab, 42 + i))
                .collect();
            group.bench_function(BenchmarkId::new("fast", name), |b| {
                iter_batch32(b, &pool, rows, vocab, &mut chains)
            });
        }
        group.finish();
    }
}

/// What logprobs and a per-step token mask add to `top_k(40);
/// temperature(0.8); dist`, batch 1, with the floor in the same group.
fn bench_extras(c: &mut Criterion) {
    use sampler_core::{LogprobsMode, LogprobsSpec};
    let stages = vec![StageSpec::TopK { k: 40 }, temp(0.8), StageSpec::Dist];
    for vocab in [32_000, 151_936] {
        let (pool, rows) = zipf_pool(vocab, min_pool_bytes(), 0x5eed);
        let mut group = c.benchmark_group(format!("extras/V={vocab}"));
        group.throughput(Throughput::Elements(1));
        let mut r = 0usize;
        group.bench_function("floor_read", |b| {
            b.iter(|| {
                r = (r + 1) % rows;
                black_box(floor_read(&pool[r * vocab..(r + 1) * vocab]))
            })
        });
        let mut chain = chain_with_history(&stages, vocab, 42);
        let mut r = 0usize;
        group.bench_function("top_k40_t0.8_dist", |b| {
            b.iter(|| {
                r = (r + 1) % rows;
                black_box(
                    chain
                        .sample_logits(&pool[r * vocab..(r + 1) * vocab])
                        .unwrap(),
                )
            })
        });
        for (name, mode) in [
            ("logprobs_raw_top5_ids4", LogprobsMode::Raw),
            ("logprobs_processed_top5_ids4", LogprobsMode::Processed),
        ] {
            let spec = LogprobsSpec {
                top_n: 5,
                token_ids: vec![0, 1, 2, 3],
                mode,
            };
            let mut chain = chain_with_history(&stages, vocab, 42);
            let mut r = 0usize;
            group.bench_function(name, |b| {
                b.iter(|| {
                    r = (r + 1) % rows;
                    let row = &pool[r * vocab..(r + 1) * vocab];
                    black_box(chain.sample_logprobs(row, &spec).unwrap())
                })
            });
        }
        // A dense mask (every other token allowed), set each step as a
        // grammar engine would.
        let mut masked = vec![StageSpec::Mask];
        masked.extend(stages.iter().cloned());
        let mut chain = chain_with_history(&masked, vocab, 42);
        let words: std::sync::Arc<[u32]> = vec![0x5555_5555u32; vocab.div_ceil(32)].into();
        let mut r = 0usize;
        group.bench_function("mask_dense_then_chain", |b| {
            b.iter(|| {
                r = (r + 1) % rows;
                chain.set_token_mask(Some(words.clone()));
                black_box(
                    chain
                        .sample_logits(&pool[r * vocab..(r + 1) * vocab])
                        .unwrap(),
                )
            })
        });
        group.finish();
    }
}

/// Every registered stage with realistic parameters, for the per-stage
/// grid: `(name, spec, selects)`.
fn stage_grid() -> Vec<(&'static str, StageSpec, bool)> {
    let scope = HistoryScope::PromptAndOutput;
    vec![
        ("greedy", StageSpec::Greedy, true),
        ("dist", StageSpec::Dist, true),
        ("top_k40", StageSpec::TopK { k: 40 }, false),
        (
            "top_p0.9",
            StageSpec::TopP {
                p: 0.9,
                min_keep: 1,
            },
            false,
        ),
        (
            "min_p0.05",
            StageSpec::MinP {
                p: 0.05,
                min_keep: 1,
            },
            false,
        ),
        (
            "typical0.95",
            StageSpec::Typical {
                p: 0.95,
                min_keep: 1,
            },
            false,
        ),
        ("temperature0.8", temp(0.8), false),
        (
            "dynatemp0.8_0.5",
            StageSpec::Temperature {
                t: 0.8,
                dynatemp_range: 0.5,
                dynatemp_exponent: 1.0,
            },
            false,
        ),
        (
            "xtc0.5_0.1",
            StageSpec::Xtc {
                probability: 0.5,
                threshold: 0.1,
                min_keep: 1,
            },
            false,
        ),
        ("top_n_sigma1", StageSpec::TopNSigma { n: 1.0 }, false),
        (
            "mirostat",
            StageSpec::Mirostat {
                tau: 5.0,
                eta: 0.1,
                m: 100,
            },
            true,
        ),
        (
            "mirostat_v2",
            StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 },
            true,
        ),
        (
            "penalties",
            StageSpec::Penalties {
                last_n: 64,
                repeat: 1.1,
                frequency: 0.1,
                presence: 0.1,
                scope,
            },
            false,
        ),
        (
            "dry",
            StageSpec::Dry {
                multiplier: 0.8,
                base: 1.75,
                allowed_length: 2,
                last_n: 64,
                seq_breakers: vec![vec![13]],
                scope,
            },
            false,
        ),
        (
            "logit_bias8",
            StageSpec::LogitBias {
                bias: (0..8).map(|i| (i * 997, -2.0 + i as f32)).collect(),
            },
            false,
        ),
        ("mask_dense", StageSpec::Mask, false),
        (
            "min_tokens",
            StageSpec::MinTokens {
                n: 1 << 30,
                stop: vec![2],
            },
            false,
        ),
        (
            "no_repeat_ngram3",
            StageSpec::NoRepeatNgram { n: 3, scope },
            false,
        ),
        (
            "epsilon3e-4",
            StageSpec::Epsilon {
                epsilon: 3e-4,
                min_keep: 1,
            },
            false,
        ),
        (
            "eta3e-4",
            StageSpec::Eta {
                epsilon: 3e-4,
                min_keep: 1,
            },
            false,
        ),
    ]
}

/// The grid's chain for a stage: `[top_k(40);] stage[; dist]` (no `dist`
/// after a stage that selects), with the bench history and a dense mask.
fn grid_chain(
    spec: &StageSpec,
    selects: bool,
    after_top_k: bool,
    vocab: usize,
    seed: u64,
) -> Chain {
    let mut stages = Vec::new();
    if after_top_k {
        stages.push(StageSpec::TopK { k: 40 });
    }
    stages.push(spec.clone());
    if !selects {
        stages.push(StageSpec::Dist);
    }
    let mut chain = chain_with_history(&stages, vocab, seed);
    let words: std::sync::Arc<[u32]> = vec![0x5555_5555u32; vocab.div_ceil(32)].into();
    chain.set_token_mask(Some(words));
    chain
}

/// Every stage as a chain's first stage (`stage; dist`) and after
/// `top_k(40)`, at the three vocabularies, batch 1 through
/// `Chain::sample_logits` (the fast paths where a kernel exists, the stages
/// on the full row otherwise), with the floor in the same group; and the
/// first-stage chains at batch 32 (`sampler_cpu::sample_batch`).
fn bench_stages(c: &mut Criterion) {
    for vocab in VOCABS {
        let (pool, rows) = zipf_pool(vocab, min_pool_bytes(), 0x5eed);
        let mut group = c.benchmark_group(format!("stages/V={vocab}"));
        group.throughput(Throughput::Elements(1));
        let mut r = 0usize;
        group.bench_function("floor_read", |b| {
            b.iter(|| {
                r = (r + 1) % rows;
                black_box(floor_read(&pool[r * vocab..(r + 1) * vocab]))
            })
        });
        // The least a stage that needs the whole row's softmax can cost
        // with the project's numerics: the maximum, then the normaliser
        // (`numerics::exp_sum`, the pinned `exp` and the f64 lane sums).
        let mut r = 0usize;
        group.bench_function("softmax_floor", |b| {
            b.iter(|| {
                r = (r + 1) % rows;
                let row = &pool[r * vocab..(r + 1) * vocab];
                black_box(sampler_core::numerics::exp_sum(row, floor_read(row)))
            })
        });
        for after_top_k in [false, true] {
            for (name, spec, selects) in stage_grid() {
                if after_top_k && matches!(spec, StageSpec::TopK { .. }) {
                    continue;
                }
                let mut chain = grid_chain(&spec, selects, after_top_k, vocab, 42);
                let place = if after_top_k {
                    "after_top_k40"
                } else {
                    "first"
                };
                let mut r = 0usize;
                group.bench_function(BenchmarkId::new(place, name), |b| {
                    b.iter(|| {
                        r = (r + 1) % rows;
                        let row = &pool[r * vocab..(r + 1) * vocab];
                        black_box(chain.sample_logits(row).expect("sampled"))
                    })
                });
            }
        }
        group.finish();
        drop(pool);
        let (pool, rows) = zipf_pool(vocab, min_pool_bytes().max(4 * BATCH * 4 * vocab), 0xba7c);
        let mut group = c.benchmark_group(format!("stages_batch32/V={vocab}"));
        group.throughput(Throughput::Elements(BATCH as u64));
        for (name, spec, selects) in stage_grid() {
            let mut chains: Vec<Chain> = (0..BATCH as u64)
                .map(|i| grid_chain(&spec, selects, false, vocab, 42 + i))
                .collect();
            group.bench_function(BenchmarkId::new("first", name), |b| {
                iter_batch32(b, &pool, rows, vocab, &mut chains)
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_batch1, bench_batch32, bench_extras, bench_stages
}
criterion_main!(benches);
