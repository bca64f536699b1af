//! Beam search (`sampler_cpu::beam`) against brute force and a plain
//! reference: on random "models" given as tables of logits per prefix
//! (vocabulary 8, token 0 the end of sequence, 4 steps), `num_beams =
//! 8^4` finds the true best sequences by the length-penalised score, and
//! every smaller width returns what a straightforward implementation of the
//! same rules (every token of every beam expanded, no top-`2W` shortcut)
//! returns, for each `early_stopping` and several length penalties.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_core::TokenId;
use sampler_cpu::beam::{BeamParams, BeamSearch, EarlyStopping, top_logprobs};

const V: usize = 8;
const DEPTH: usize = 4;
const EOS: TokenId = 0;

/// The model: logits of the next token after `prefix`, a pure function of
/// (table seed, prefix).
fn logits(seed: u64, prefix: &[TokenId]) -> Vec<f32> {
    let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
    for &t in prefix {
        h = (h ^ u64::from(t) ^ 0x55).wrapping_mul(0x100_0000_01b3);
    }
    let mut r = ChaCha8Rng::seed_from_u64(h);
    (0..V).map(|_| r.random_range(-3.0f32..3.0)).collect()
}

fn logprobs(seed: u64, prefix: &[TokenId]) -> Vec<(TokenId, f32)> {
    top_logprobs(&logits(seed, prefix), None, V)
}

fn score(sum: f64, len: usize, lp: f64) -> f64 {
    sum / (len.max(1) as f64).powf(lp)
}

/// Every complete sequence: ended by EOS within DEPTH tokens, or DEPTH
/// tokens without it; with its sum of logprobs.
fn all_sequences(seed: u64) -> Vec<(Vec<TokenId>, f64)> {
    let mut out = Vec::new();
    let mut stack = vec![(Vec::new(), 0.0f64)];
    while let Some((seq, sum)) = stack.pop() {
        for (t, lp) in logprobs(seed, &seq) {
            let mut s = seq.clone();
            s.push(t);
            let total = sum + f64::from(lp);
            if t == EOS || s.len() == DEPTH {
                out.push((s, total));
            } else {
                stack.push((s, total));
            }
        }
    }
    out
}

fn run(seed: u64, p: &BeamParams) -> Vec<(Vec<TokenId>, f64, f64)> {
    let mut search = BeamSearch::new(p.clone()).expect("valid");
    while !search.is_done() {
        let cands: Vec<Vec<(TokenId, f32)>> = search
            .beams()
            .iter()
            .map(|(tokens, _)| {
                top_logprobs(&logits(seed, tokens), None, search.candidates_per_beam())
            })
            .collect();
        search.step(&cands).expect("a step");
    }
    search
        .finish()
        .into_iter()
        .map(|h| (h.tokens, h.sum_logprobs, h.score))
        .collect()
}

/// The rules written out plainly: every beam's every token scored, the
/// whole list sorted, EOS candidates in the first W ranks finish, the first
/// W others continue; the same stopping rules.
fn reference(seed: u64, p: &BeamParams) -> Vec<(Vec<TokenId>, f64, f64)> {
    let w = p.num_beams;
    let lp = p.length_penalty;
    let mut beams: Vec<(Vec<TokenId>, f64)> = vec![(Vec::new(), 0.0)];
    let mut done: Vec<(Vec<TokenId>, f64, f64)> = Vec::new();
    let keep = |done: &mut Vec<(Vec<TokenId>, f64, f64)>| {
        done.sort_by(|a, b| b.2.total_cmp(&a.2));
        done.truncate(w);
    };
    for len in 1..=p.max_new_tokens {
        let mut all = Vec::new();
        for (b, (seq, sum)) in beams.iter().enumerate() {
            for (i, (t, l)) in logprobs(seed, seq).into_iter().enumerate() {
                all.push((sum + f64::from(l), b, i, t));
            }
        }
        all.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        all.truncate(2 * w);
        let mut next = Vec::new();
        for (rank, (s, b, _, t)) in all.into_iter().enumerate() {
            let mut seq = beams[b].0.clone();
            seq.push(t);
            if t == EOS {
                if rank < w {
                    let n = seq.len();
                    done.push((seq, s, score(s, n, lp)));
                    keep(&mut done);
                }
            } else if next.len() < w {
                next.push((seq, s));
            }
        }
        beams = next;
        let best = beams.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
        let full = done.len() >= w;
        let worst = done.last().map_or(f64::NEG_INFINITY, |d| d.2);
        let stop = beams.is_empty()
            || full
                && match p.early_stopping {
                    EarlyStopping::True => true,
                    EarlyStopping::False => worst >= score(best, len, lp),
                    EarlyStopping::Never => {
                        worst >= score(best, if lp > 0.0 { p.max_new_tokens } else { len }, lp)
                    }
                };
        if stop {
            beams.clear();
            break;
        }
    }
    for (seq, s) in beams {
        let n = seq.len();
        done.push((seq, s, score(s, n, lp)));
        keep(&mut done);
    }
    done.truncate(p.num_return_sequences);
    done
}

fn params(w: usize, r: usize, lp: f64, es: EarlyStopping) -> BeamParams {
    BeamParams {
        num_beams: w,
        num_return_sequences: r,
        length_penalty: lp,
        early_stopping: es,
        eos: vec![EOS],
        max_new_tokens: DEPTH,
    }
}

#[test]
fn every_beam_kept_finds_the_true_best_sequences() {
    for seed in 0..6 {
        let all = all_sequences(seed);
        for lp in [-1.0, 0.0, 1.0, 2.0] {
            let mut best: Vec<(Vec<TokenId>, f64)> = all
                .iter()
                .map(|(s, sum)| (s.clone(), score(*sum, s.len(), lp)))
                .collect();
            best.sort_by(|a, b| b.1.total_cmp(&a.1));
            for es in [
                EarlyStopping::True,
                EarlyStopping::False,
                EarlyStopping::Never,
            ] {
                let got = run(seed, &params(V.pow(DEPTH as u32), 5, lp, es));
                assert_eq!(got.len(), 5);
                for (g, b) in got.iter().zip(&best) {
                    assert_eq!(g.0, b.0, "seed {seed}, lp {lp}, {es:?}");
                    assert!((g.2 - b.1).abs() < 1e-9, "seed {seed}: {} vs {}", g.2, b.1);
                }
            }
        }
    }
}

#[test]
fn smaller_widths_follow_the_reference() {
    let mut compared = 0;
    for seed in 0..40 {
        for w in [1, 2, 3, 5, 8] {
            for lp in [-0.5, 0.0, 1.0, 1.5] {
                for es in [
                    EarlyStopping::True,
                    EarlyStopping::False,
                    EarlyStopping::Never,
                ] {
                    let p = params(w, w.min(3), lp, es);
                    let got = run(seed, &p);
                    let want = reference(seed, &p);
                    assert_eq!(got.len(), want.len(), "seed {seed} w {w} lp {lp} {es:?}");
                    for (g, r) in got.iter().zip(&want) {
                        assert_eq!(g.0, r.0, "seed {seed} w {w} lp {lp} {es:?}");
                        assert!((g.1 - r.1).abs() < 1e-12 && (g.2 - r.2).abs() < 1e-12);
                    }
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, 40 * 5 * 4 * 3);
}

#[test]
fn width_one_is_greedy_and_eos_ends_it() {
    // num_beams = 1 follows the argmax until EOS or the length limit.
    for seed in 0..20 {
        let got = run(seed, &params(1, 1, 1.0, EarlyStopping::False));
        let mut seq = Vec::new();
        loop {
            let l = logits(seed, &seq);
            let t = (0..V)
                .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
                .unwrap() as TokenId;
            seq.push(t);
            if t == EOS || seq.len() == DEPTH {
                break;
            }
        }
        assert_eq!(got[0].0, seq, "seed {seed}");
    }
}
