//! conformance helpers
//!
//! Shared by the conformance tests: locating and loading the reference data
//! in `tests/data/` (llama.cpp golden cases, checked into the repository).

use std::path::{Path, PathBuf};

#[cfg(test)]
mod layout;

use sampler_core::{Candidates, ChainSpec, StageSpec, TokenId, desc_cmp, rng};

/// Path of the golden llama.cpp cases: `tests/data/llama_cpp_cases.json`.
pub const LLAMA_CPP_CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/llama_cpp_cases.json");

/// The path of a file under `tests/data/`.
pub fn reference_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// Read and parse a JSON reference file.
///
/// # Panics
/// With a message naming the path when the file is absent or not valid JSON
/// (a damaged checkout).
pub fn load_reference_json(path: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "cannot read the reference file {path}: {e}. It is part of the repository \
             (tests/data/); restore it with git."
        )
    });
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the reference file {path} is not valid JSON: {e}"))
}

/// `llama_cpp_cases.json`, parsed.
///
/// # Panics
/// As [`load_reference_json`].
pub fn llama_cpp_cases() -> serde_json::Value {
    load_reference_json(LLAMA_CPP_CASES)
}

/// `H = -sum p ln p` in nats over `p > 0`.
fn entropy(probs: impl Iterator<Item = f64>) -> f64 {
    probs.filter(|&p| p > 0.0).map(|p| -p * p.ln()).sum()
}

/// Why a row's token may legitimately differ between the CPU and a device:
/// a float sum in another order can cross a boundary that lies within
/// rounding. `None` when the row is not near any boundary.
pub fn boundary_reason(spec: &ChainSpec, row: &[f32], prompt: &[TokenId]) -> Option<String> {
    boundary_reason_after(spec, row, prompt, &[])
}

/// [`boundary_reason`] for a request that already generated `outputs` (its
/// step is `outputs.len()`, its history-based stages have seen them).
pub fn boundary_reason_after(
    spec: &ChainSpec,
    row: &[f32],
    prompt: &[TokenId],
    outputs: &[TokenId],
) -> Option<String> {
    const TOL: f64 = 1e-4;
    let step = outputs.len() as u64;
    for (i, st) in spec.stages.iter().enumerate() {
        if st.is_noop() {
            continue;
        }
        let prefix = ChainSpec::new(spec.stages[..i].to_vec(), spec.seed);
        let mut chain = sampler_cpu::build_chain(&prefix).ok()?;
        chain.accept_prompt(prompt);
        for &t in outputs {
            chain.commit(t);
        }
        let mut c = Candidates::from_logits(row);
        if chain.apply_from(0, &mut c).is_err() {
            return None;
        }
        let (ids, logits) = (c.ids().to_vec(), c.logits().to_vec());
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return None;
        }
        let e: Vec<f64> = logits.iter().map(|&l| f64::from((l - max).exp())).collect();
        let s: f64 = e.iter().sum();
        match st {
            StageSpec::TopP { p, .. } => {
                let mut order: Vec<usize> = (0..ids.len()).collect();
                order.sort_by(|&a, &b| desc_cmp(logits[a], ids[a], logits[b], ids[b]));
                let mut cum = 0.0;
                for &j in &order {
                    if (cum / s - f64::from(*p)).abs() < TOL {
                        return Some(format!("top_p boundary: mass {} ~ p {p}", cum / s));
                    }
                    cum += e[j];
                }
            }
            StageSpec::Epsilon { epsilon, .. } | StageSpec::Eta { epsilon, .. } => {
                // The probability cutoff (eta's depends on the entropy, a sum
                // whose order differs between the CPU and a device).
                let eps = f64::from(*epsilon);
                let thr = if matches!(st, StageSpec::Eta { .. }) {
                    let h = entropy(e.iter().map(|&x| x / s));
                    eps.min(eps.sqrt() * (-h).exp())
                } else {
                    eps
                };
                if thr > 0.0
                    && let Some(p) = e
                        .iter()
                        .map(|&x| x / s)
                        .find(|&p| ((p - thr) / thr).abs() < TOL)
                {
                    return Some(format!("{} boundary: p {p} ~ cutoff {thr}", st.name()));
                }
            }
            StageSpec::Typical { p, .. } => {
                // Scores `|-ln p - H|` in ascending order (ties canonical),
                // the cut where the mass before a candidate passes `p`.
                let probs: Vec<f64> = e.iter().map(|&x| x / s).collect();
                let h = entropy(probs.iter().copied());
                let score: Vec<f64> = probs.iter().map(|&q| (-q.ln() - h).abs()).collect();
                let mut order: Vec<usize> = (0..ids.len()).collect();
                order.sort_by(|&a, &b| {
                    score[a]
                        .total_cmp(&score[b])
                        .then(desc_cmp(logits[a], ids[a], logits[b], ids[b]))
                });
                let mut cum = 0.0;
                for (k, &j) in order.iter().enumerate() {
                    if (cum - f64::from(*p)).abs() < TOL {
                        return Some(format!("typical boundary: mass {cum} ~ p {p}"));
                    }
                    if let Some(&next) = order.get(k + 1)
                        && score[j] != score[next]
                        && (score[next] - score[j]).abs() < TOL * score[j].abs().max(1.0)
                    {
                        return Some(format!(
                            "typical boundary: scores {} ~ {}",
                            score[j], score[next]
                        ));
                    }
                    cum += probs[j];
                }
            }
            StageSpec::Dist => {
                let u = rng::uniform(spec.seed?, step, rng::lane(i, 0));
                let target = u * s;
                let mut order: Vec<usize> = (0..ids.len()).collect();
                order.sort_by_key(|&j| ids[j]);
                let mut cum = 0.0;
                for &j in &order {
                    cum += e[j];
                    if e[j] > 0.0 && ((cum - target) / s).abs() < TOL {
                        return Some(format!("dist boundary: u*S {target} ~ cum {cum}"));
                    }
                }
            }
            _ => {}
        }
    }
    None
}
