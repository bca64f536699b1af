//! `dist`: draw a token from the softmax of the current candidates.

use sampler_core::{Candidates, SampleError, Sampler, StageContext, StageSpec, TokenId};

/// Draws a token from `softmax(logits)` of the current candidates with the
/// row's contract-7 uniform `ctx.rng.uniform(0)`; see [`dist_select`].
/// Follows llama.cpp `dist` (softmax with max subtraction, inverse CDF,
/// probabilities written in the current order), except that the inverse CDF
/// walks the candidates in ascending token-id order, so the token does not
/// depend on the candidate order.
///
/// # Errors
/// [`SampleError::EmptyRow`], [`SampleError::AllMasked`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Dist;

impl Dist {
    /// The stage (it has no parameters).
    pub fn new() -> Self {
        Self
    }
}

impl Sampler for Dist {
    fn name(&self) -> &str {
        "dist"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Dist)
    }
    fn apply(&mut self, row: &mut Candidates, ctx: &StageContext) -> Result<(), SampleError> {
        dist_select(row, ctx.rng.uniform(0)).map(|_| ())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}

/// Softmax the row and select a candidate by inverse CDF in canonical
/// (ascending token id) order, with the uniform `u` in `[0, 1)`.
///
/// * `e_i = exp(l_i - max)` in f32, `S = Σ e_i` in f64;
/// * writes normalised probabilities `p_i = e_i / S` in the row's CURRENT
///   order (the order and the `sorted` flag are unchanged);
/// * walks candidates in ascending token id, accumulating `e_i` in f64, and
///   selects the first candidate with `e_i > 0` and `cum >= u * S`; if none
///   (rounding), the last candidate in id order with `e_i > 0`.
///
/// Returns the selected index (into the current set) and sets it as the
/// row's selection. Cost O(n) for a row in ascending-id order, otherwise
/// O(n + min(n log n, vocab)).
///
/// # Errors
/// [`SampleError::EmptyRow`] for an empty set, [`SampleError::NanLogit`] /
/// [`SampleError::PosInfLogit`] (position in the set) for an invalid logit,
/// [`SampleError::AllMasked`] when no candidate has positive probability
/// (every logit `-inf`).
pub fn dist_select(row: &mut Candidates, u: f64) -> Result<usize, SampleError> {
    if row.is_empty() {
        return Err(SampleError::EmptyRow);
    }
    // Refuse NaN / +inf (a row that reached `dist_select` without a
    // chain's validation), then the maximum.
    sampler_core::validate_logits(row.logits())?;
    let max = crate::cdf::max_of(row.logits());
    if max == f32::NEG_INFINITY {
        return Err(SampleError::AllMasked);
    }
    let was_sorted = row.is_sorted();
    let vocab = row.vocab_size();
    let (sum, chosen) = PREFIX.with_borrow_mut(|prefix| {
        let raw = row.raw_mut();
        // `probs` hold the exponentials e_i until normalised below; the
        // sum is `sum_f64_slice`'s.
        let sum = crate::cdf::exp_into_with_prefix(raw.logits, max, raw.probs, prefix);
        let chosen = select_in_id_order(raw.ids, raw.probs, u * sum, sum, prefix, vocab);
        if sum > 0.0 {
            crate::cdf::scale_in_place(raw.probs, 1.0 / sum);
        }
        (sum, chosen)
    });
    if sum.is_nan() || sum <= 0.0 {
        return Err(SampleError::AllMasked);
    }
    row.set_probs_valid(true);
    if was_sorted {
        row.set_sorted(true);
    }
    let index = chosen.ok_or(SampleError::AllMasked)?;
    row.select(index);
    Ok(index)
}

thread_local! {
    /// The block prefix sums of [`dist_select`]'s walk (`crate::cdf`),
    /// reused from row to row.
    static PREFIX: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Index (into `ids`/`e`) of the first candidate in ascending-id order with
/// `e > 0` whose running sum reaches `target`; fallback the last with `e > 0`.
/// A set already in ascending id starts at the block that holds the target
/// (`prefix`, `sum`: [`crate::cdf`]).
fn select_in_id_order(
    ids: &[TokenId],
    e: &[f32],
    target: f64,
    sum: f64,
    prefix: &[f64],
    vocab: usize,
) -> Option<usize> {
    let n = ids.len();
    let ascending = crate::cdf::strictly_ascending(ids);
    if ascending {
        let fill = |start: usize, out: &mut [f32]| out.copy_from_slice(&e[start..start + out.len()]);
        if let Some(i) = crate::cdf::certified_crossing(n, target, sum, prefix, 0.0, fill) {
            return Some(i);
        }
    }
    let walk = |order: &mut dyn Iterator<Item = usize>| -> Option<usize> {
        let mut cum = 0.0f64;
        let mut last_pos = None;
        for i in order {
            let ei = e[i];
            if ei > 0.0 {
                cum += f64::from(ei);
                last_pos = Some(i);
                if cum >= target {
                    return Some(i);
                }
            }
        }
        last_pos
    };
    if ascending {
        return walk(&mut (0..n));
    }
    // Sorting n indices costs n log n; a dense id -> position table costs the
    // vocabulary size. Use the cheaper one.
    let log_n = (usize::BITS - n.leading_zeros()) as usize;
    if n.saturating_mul(log_n) <= vocab && vocab > 0 {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by_key(|&i| ids[i]);
        walk(&mut order.into_iter())
    } else {
        let size = vocab.max(ids.iter().map(|&i| i as usize + 1).max().unwrap_or(0));
        let mut table = vec![usize::MAX; size];
        for (pos, &id) in ids.iter().enumerate() {
            if let Some(slot) = table.get_mut(id as usize) {
                *slot = pos;
            }
        }
        walk(&mut table.into_iter().filter(|&p| p != usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule as written, one step after another: the oracle.
    fn spec_select(ids: &[TokenId], logits: &[f32], u: f64) -> (Option<TokenId>, Vec<u32>) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = logits
            .iter()
            .map(|&l| sampler_core::numerics::exp(l - max))
            .collect();
        let sum = sampler_core::numerics::sum_f64(e.iter().copied());
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i]);
        let (mut cum, mut last, mut token) = (0.0f64, None, None);
        for i in order {
            if e[i] > 0.0 {
                cum += f64::from(e[i]);
                last = Some(ids[i]);
                if cum >= u * sum {
                    token = Some(ids[i]);
                    break;
                }
            }
        }
        let probs = e.iter().map(|&x| ((f64::from(x) * (1.0 / sum)) as f32).to_bits());
        (token.or(last), probs.collect())
    }

    /// `dist_select` is the rule as written: token, probabilities (bits)
    /// and order, for sets in id order (where the walk starts at the
    /// target's block) and out of it, with uniforms aimed at the running
    /// sums' boundaries and rows where sums in another order round otherwise.
    #[test]
    fn dist_select_is_the_rule_as_written() {
        let mut x = 0x51ed_2701u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for len in [1usize, 2, 1023, 1025, 4100] {
            for shape in 0..3 {
                let logits: Vec<f32> = (0..len)
                    .map(|i| match shape {
                        0 => (next() % 20_000) as f32 / 1000.0 - 10.0,
                        // One at 0 over a sea 33-40 nats below.
                        1 if i == len / 2 => 0.0,
                        1 => -33.0 - (next() % 7000) as f32 / 1000.0,
                        _ if (i / 50) % 4 == 1 => f32::NEG_INFINITY,
                        _ => -((next() % 3000) as f32) / 100.0,
                    })
                    .collect();
                let ascending: Vec<TokenId> = (0..len as TokenId).map(|i| 2 * i + 5).collect();
                let mut shuffled = ascending.clone();
                shuffled.reverse();
                let vocab = 2 * len + 10;
                for ids in [&ascending, &shuffled] {
                    let mut us: Vec<f64> = (0..40).map(|k| f64::from(k) / 40.0 + 1e-3).collect();
                    us.extend([0.0, 0.999_999_999_999]);
                    // Uniforms whose target lands on a running sum.
                    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = logits
                        .iter()
                        .map(|&l| sampler_core::numerics::exp(l - max))
                        .collect();
                    let sum = sampler_core::numerics::sum_f64(e.iter().copied());
                    let mut cum = 0.0f64;
                    for (j, &v) in e.iter().enumerate() {
                        cum += f64::from(v);
                        if j % 97 == 0 && sum > 0.0 {
                            let u = cum / sum;
                            us.extend([u, u.next_up(), u.next_down()]);
                        }
                    }
                    for &u in us.iter().filter(|u| (0.0..1.0).contains(*u)) {
                        let mut row = Candidates::from_parts(ids.clone(), logits.clone(), vocab)
                            .expect("valid set");
                        let (want_token, want_probs) = spec_select(ids, &logits, u);
                        let got = dist_select(&mut row, u).ok().map(|i| row.ids()[i]);
                        assert_eq!(got, want_token, "len {len} shape {shape} u {u}");
                        let probs: Vec<u32> =
                            row.probs().expect("probs").iter().map(|p| p.to_bits()).collect();
                        assert_eq!(probs, want_probs, "len {len} shape {shape} u {u}");
                        assert_eq!(row.ids(), &ids[..]);
                    }
                }
            }
        }
    }

    #[test]
    fn dist_select_errors() {
        let mut row = Candidates::from_logits(&[0.0, f32::INFINITY, f32::NAN]);
        assert_eq!(
            dist_select(&mut row, 0.5),
            Err(SampleError::PosInfLogit { index: 1 })
        );
        let mut row = Candidates::from_logits(&[0.0, f32::NAN, f32::INFINITY]);
        assert_eq!(dist_select(&mut row, 0.5), Err(SampleError::NanLogit { index: 1 }));
        let mut row = Candidates::from_logits(&[f32::NEG_INFINITY; 3]);
        assert_eq!(dist_select(&mut row, 0.5), Err(SampleError::AllMasked));
        let mut row = Candidates::from_logits(&[]);
        assert_eq!(dist_select(&mut row, 0.5), Err(SampleError::EmptyRow));
    }
}
