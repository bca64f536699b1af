//! The fast path allocates nothing per token once its buffers have grown:
//! `Chain::sample_logits` on the chains with a fused tail, counted by a
//! global allocator that counts this thread's allocations.
//!
//! (One test in this binary: the counter is per thread, so the harness's
//! other threads do not disturb it.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sampler_core::{ChainSpec, HistoryScope, StageSpec};

struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocs() -> usize {
    ALLOCS.with(Cell::get)
}

/// Heavy-tailed rows, ranks scattered over ids differently per row.
fn rows(vocab: usize, n: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|r| {
            let mut row = vec![0.0f32; vocab];
            for rank in 0..vocab {
                let id = (rank * 7919 + 13 + r * 104_729) % vocab;
                row[id] = -(1.1 + 0.1 * r as f32) * ((rank + 1) as f32).ln();
            }
            row
        })
        .collect()
}

#[test]
fn fused_chains_allocate_nothing_per_token() {
    let temp = StageSpec::Temperature {
        t: 0.8,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    };
    let penalties = StageSpec::Penalties {
        last_n: 64,
        repeat: 1.1,
        frequency: 0.0,
        presence: 0.0,
        scope: HistoryScope::PromptAndOutput,
    };
    // llama.cpp's default shape: top_k, top_p and min_p cuts, the tail.
    let cuts = vec![
        StageSpec::TopK { k: 40 },
        StageSpec::TopP {
            p: 0.95,
            min_keep: 1,
        },
        StageSpec::MinP {
            p: 0.05,
            min_keep: 1,
        },
        temp.clone(),
        StageSpec::Dist,
    ];
    let chains = [
        vec![StageSpec::Greedy],
        vec![StageSpec::TopK { k: 40 }, temp.clone(), StageSpec::Dist],
        cuts.clone(),
        vec![
            StageSpec::MinP {
                p: 0.05,
                min_keep: 1,
            },
            temp.clone(),
            StageSpec::Dist,
        ],
        vec![
            StageSpec::TopP {
                p: 0.9,
                min_keep: 1,
            },
            temp.clone(),
            StageSpec::Dist,
        ],
        vec![
            penalties.clone(),
            StageSpec::TopK { k: 40 },
            temp.clone(),
            StageSpec::Dist,
        ],
        [vec![penalties], cuts].concat(),
        // The whole-row tail, epsilon / eta, Mirostat v1 and v2, xtc, typical.
        vec![temp.clone(), StageSpec::Dist],
        vec![StageSpec::Dist],
        vec![
            StageSpec::Epsilon {
                epsilon: 3e-4,
                min_keep: 1,
            },
            temp.clone(),
            StageSpec::Dist,
        ],
        vec![
            StageSpec::Eta {
                epsilon: 3e-4,
                min_keep: 3,
            },
            StageSpec::Dist,
        ],
        vec![StageSpec::Mirostat {
            tau: 5.0,
            eta: 0.1,
            m: 100,
        }],
        vec![StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 }],
        vec![
            StageSpec::Xtc {
                probability: 0.5,
                threshold: 0.05,
                min_keep: 1,
            },
            temp.clone(),
            StageSpec::Dist,
        ],
        vec![
            StageSpec::Typical {
                p: 0.95,
                min_keep: 1,
            },
            temp.clone(),
            StageSpec::Dist,
        ],
    ];
    let vocab = 32_000;
    let rows = rows(vocab, 4);
    for stages in chains {
        let name = format!("{stages:?}");
        let mut chain = sampler_cpu::build_chain(&ChainSpec::new(stages, Some(11))).unwrap();
        let history: Vec<u32> = (0..64).map(|i| (i * 491 % vocab) as u32).collect();
        chain.accept_prompt(&history);
        // Warm up: the buffers grow to the largest row's needs.
        for _ in 0..3 {
            for row in &rows {
                chain.sample_logits(row).unwrap();
            }
        }
        let mut reference = chain.clone();
        let mut tokens = Vec::with_capacity(40);
        let before = allocs();
        for _ in 0..10 {
            for row in &rows {
                tokens.push(chain.sample_logits(row).unwrap());
            }
        }
        let n = allocs() - before;
        assert_eq!(n, 0, "{name}: {n} allocations over {} tokens", tokens.len());
        // The same tokens as the stages one by one (outside the count).
        let want: Vec<u32> = (0..10)
            .flat_map(|_| &rows)
            .map(|row| {
                reference
                    .sample_from(0, &mut sampler_core::Candidates::from_logits(row))
                    .unwrap()
            })
            .collect();
        assert_eq!(tokens, want, "{name}");
    }
}
