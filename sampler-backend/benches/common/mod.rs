//! Helpers shared by the sampler-backend benchmarks.

// Each benchmark includes this file and uses a part of it.
#![allow(dead_code)]

/// A comma-separated list from the environment variable `var`, else `default`.
pub fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Heavy-tailed logits: `ln(1 / rank^1.1)` with ranks shuffled per row.
pub fn zipf_logits(b: usize, v: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(b * v);
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..b {
        for i in 0..v {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let rank = ((i as u64 * 2_654_435_761 + (s & 0xff)) % v as u64) as f32 + 1.0;
            out.push(-1.1 * rank.ln() + 8.0);
        }
    }
    out
}

/// Rows shaped like a real model's, where the Zipf rows above are not:
/// ids ordered by frequency band with the likely tokens at high ids (a
/// vocabulary puts byte and special tokens first, so a row's prefix holds
/// only unlikely tokens), a third of the vocabulary 16-30 nats below the
/// maximum (a deep tail), and every logit rounded to bf16 (exact ties, as
/// from a bf16 model).
pub fn model_logits(b: usize, v: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(b * v);
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let bands = 16;
    for r in 0..b {
        for i in 0..v {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let noise = (s >> 40) as f32 / (1u64 << 24) as f32;
            let x = if (i + r) % 3 == 1 {
                -16.0 - 14.0 * noise
            } else {
                let band = (i * bands / v) as f32;
                band - bands as f32 + 2.0 * noise
            };
            out.push(f32::from_bits(x.to_bits() & 0xFFFF_0000));
        }
    }
    out
}

/// The rows a benchmark runs on, by name: `zipf` ([`zipf_logits`]) or
/// `model` ([`model_logits`]); `None` for another name.
pub fn logits(kind: &str, b: usize, v: usize) -> Option<Vec<f32>> {
    match kind {
        "zipf" => Some(zipf_logits(b, v)),
        "model" => Some(model_logits(b, v)),
        _ => None,
    }
}
