//! Small shared helpers for the stages.

use sampler_core::{Candidates, TokenId};

/// Whether `logits`/`ids` are descending by logit with ties by ascending id.
pub(crate) fn is_sorted_desc(logits: &[f32], ids: &[TokenId]) -> bool {
    logits
        .windows(2)
        .zip(ids.windows(2))
        .all(|(l, i)| l[0] > l[1] || (l[0] == l[1] && i[0] < i[1]))
}

/// Call `f(position, k)` for every token `tokens[k]` present in `row`, by
/// token id (never by position). A row still in vocabulary order is handled
/// in O(1) per token; otherwise one pass over the row resolves the rest.
/// Tokens absent from the row are skipped; a token listed twice is visited twice.
pub(crate) fn for_each_token_position(
    row: &Candidates,
    tokens: &[TokenId],
    mut f: impl FnMut(usize, usize),
) {
    let ids = row.ids();
    // `(token, k)` sorted: one allocation, binary search per row position
    // (the fast paths hand small, reordered rows here).
    let mut slow: Vec<(TokenId, usize)> = Vec::new();
    for (k, &t) in tokens.iter().enumerate() {
        let i = t as usize;
        if ids.get(i) == Some(&t) {
            f(i, k);
        } else {
            slow.push((t, k));
        }
    }
    slow.sort_unstable();
    let (Some(&(lo, _)), Some(&(hi, _))) = (slow.first(), slow.last()) else {
        return;
    };
    for (pos, &id) in ids.iter().enumerate() {
        if id < lo || id > hi {
            continue;
        }
        let start = slow.partition_point(|&(t, _)| t < id);
        for &(t, k) in &slow[start..] {
            if t != id {
                break;
            }
            f(pos, k);
        }
    }
}

/// Divide `l` by a positive `t`, never turning a finite logit into `±inf`
/// (saturate to `±f32::MAX`); `-inf` stays `-inf`.
#[inline]
pub(crate) fn div_saturating(l: f32, t: f32) -> f32 {
    let v = l / t;
    if v.is_infinite() && l.is_finite() {
        if v > 0.0 { f32::MAX } else { -f32::MAX }
    } else {
        v
    }
}

/// Replace a `±inf` produced from the finite logit `orig` by `±f32::MAX`.
#[inline]
pub(crate) fn saturate(v: f32, orig: f32) -> f32 {
    if v.is_infinite() && orig.is_finite() {
        if v > 0.0 { f32::MAX } else { -f32::MAX }
    } else {
        v
    }
}

/// `(S, H)` of the softmax of `logits` (in their order), without a
/// logarithm per candidate: `e_i = exp(l_i − max)` (the project's `exp`),
/// `S = Σ e_i` in the f64 lane rule (the softmax's normaliser, same bits),
/// `H = ln S − Σ e_i (l_i − max) / S` over `e_i > 0` (the same lane rule),
/// which is `−Σ p_i ln p_i` with `−ln p_i` taken as `ln S − (l_i − max)`.
/// `max`: the largest logit, finite.
pub(crate) fn log_norm_entropy(logits: &[f32], max: f32) -> (f64, f64) {
    let (sum, t) = sampler_core::numerics::exp_entropy_sums(logits, max);
    (sum, entropy_from_sums(sum, t))
}

/// `H = ln S − t / S` from `numerics::exp_entropy_sums`' `(S, t)`, as
/// [`log_norm_entropy`] computes it.
#[inline]
pub(crate) fn entropy_from_sums(sum: f64, t: f64) -> f64 {
    sum.ln() - t / sum
}
