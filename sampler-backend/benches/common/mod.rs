//! Helpers shared by the sampler-backend benchmarks.

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
