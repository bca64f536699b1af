//! Log-probabilities of a sampling step, as OpenAI's `logprobs` /
//! `top_logprobs` and vLLM's `logprob_token_ids` / `logprobs_mode` report
//! them.
//!
//! Two modes ([`LogprobsMode`], vLLM's names):
//! * `raw`: the log-softmax of the model's logits as given, over the whole
//!   vocabulary (never a raw logit: logits `[2.0, 1.0]` give `-0.3133` for
//!   token 0);
//! * `processed`: the log of the distribution the token was drawn from:
//!   the final candidate set after every stage of the chain (transforms and
//!   filters), renormalised over the survivors; a token outside it has
//!   `-inf`. For `dist` that is the softmax `dist` drew from; for `greedy`
//!   it is the log-softmax of the candidates greedy chose among, and so it
//!   is for greedy spelled as a temperature (`temperature(0); dist`: the
//!   candidates as they entered that stage,
//!   [`crate::StageSpec::is_greedy_temperature`]), as vLLM gives greedy rows
//!   no temperature.
//!
//! Numerics (the same on the CPU and the device, within `1e-5`):
//! `logprob_i = (l_i - max) - ln(Σ_j exp(l_j - max))`, with the project's
//! [`crate::numerics::exp`] and f64 sum on the CPU. The top-n tokens are the
//! `n` highest logprobs, ties to the lowest token id, listed in that order;
//! only tokens with a finite logprob are listed, so a row with fewer
//! survivors lists fewer.

use serde::{Deserialize, Serialize};

use crate::{Candidates, ParamError, SampleError, TokenId, numerics};

/// Most top tokens per row (OpenAI's `top_logprobs` cap).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most requested token ids per row.
pub const MAX_LOGPROB_TOKEN_IDS: usize = 128;

/// Which distribution the logprobs describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogprobsMode {
    /// Log-softmax of the logits as given (vLLM `raw_logprobs`).
    #[default]
    #[serde(alias = "raw_logprobs")]
    Raw,
    /// Log of the distribution after the chain's stages (vLLM
    /// `processed_logprobs`).
    #[serde(alias = "processed_logprobs")]
    Processed,
}

impl LogprobsMode {
    /// The config words.
    pub const WORDS: &'static [&'static str] = &["raw", "processed"];

    /// The config word.
    pub fn word(self) -> &'static str {
        match self {
            LogprobsMode::Raw => "raw",
            LogprobsMode::Processed => "processed",
        }
    }

    /// The mode of a config word (`raw`, `processed`; vLLM's
    /// `raw_logprobs` / `processed_logprobs` too).
    pub fn from_word(word: &str) -> Option<LogprobsMode> {
        match word {
            "raw" | "raw_logprobs" => Some(LogprobsMode::Raw),
            "processed" | "processed_logprobs" => Some(LogprobsMode::Processed),
            _ => None,
        }
    }
}

/// What a request asks for: the sampled token's logprob always, plus the
/// `top_n` best tokens and the listed `token_ids`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogprobsSpec {
    /// Top tokens per step, `0..=20` (OpenAI `top_logprobs`).
    #[serde(default)]
    pub top_n: usize,
    /// Tokens whose logprob is reported whether or not they survived, at
    /// most 128 (vLLM `logprob_token_ids`).
    #[serde(default)]
    pub token_ids: Vec<TokenId>,
    /// `raw` or `processed`.
    #[serde(default)]
    pub mode: LogprobsMode,
}

impl LogprobsSpec {
    /// Check the sizes (`top_n <= 20`, at most 128 token ids).
    ///
    /// # Errors
    /// A [`ParamError`] naming `logprobs.top_logprobs` or
    /// `logprobs.logprob_token_ids`.
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.top_n > MAX_TOP_LOGPROBS {
            return Err(ParamError {
                stage: "logprobs",
                param: "top_logprobs",
                value: self.top_n.to_string(),
                expected: format!("an integer in [0, {MAX_TOP_LOGPROBS}]"),
            });
        }
        if self.token_ids.len() > MAX_LOGPROB_TOKEN_IDS {
            return Err(ParamError {
                stage: "logprobs",
                param: "logprob_token_ids",
                value: format!("{} ids", self.token_ids.len()),
                expected: format!("at most {MAX_LOGPROB_TOKEN_IDS} token ids"),
            });
        }
        Ok(())
    }

    /// The first requested id outside `0..vocab`.
    ///
    /// # Errors
    /// [`SampleError::TokenOutOfRange`].
    pub fn check_vocab(&self, vocab: usize) -> Result<(), SampleError> {
        match self.token_ids.iter().find(|&&t| t as usize >= vocab) {
            Some(&token) => Err(SampleError::TokenOutOfRange { token, vocab }),
            None => Ok(()),
        }
    }

    /// Entries (id, logprob) per row on the device readback: `top_n`, the
    /// requested ids, the sampled token.
    pub fn entries(&self) -> usize {
        self.top_n + self.token_ids.len() + 1
    }
}

/// The logprobs of one step of one row.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Logprobs {
    /// The sampled token and its logprob.
    pub token: (TokenId, f32),
    /// Up to `top_n` `(token, logprob)`: the `top_n` best by logit (not by
    /// the rounded logprob: distinct logits can round to one logprob), best
    /// first, ties to the lowest id; entries whose logprob is `-inf` (a
    /// logit so far below the maximum that its probability underflows) are
    /// left out. The device lists the same entries in the same order.
    pub top: Vec<(TokenId, f32)>,
    /// `(token, logprob)` of every requested id, in the order asked
    /// (`-inf` when the token did not survive, in `processed` mode).
    pub requested: Vec<(TokenId, f32)>,
}

/// `max` and `ln Σ exp(l - max)` over finite-or-`-inf` logits; `None` when
/// every logit is `-inf`. The sum follows [`numerics::sum_f64`]'s lane rule
/// (value `i` in lane `i % 8`), in blocks so that it vectorises.
fn log_norm_slice(logits: &[f32]) -> Option<(f32, f64)> {
    const W: usize = 16;
    let mut m = [f32::NEG_INFINITY; W];
    let mut blocks = logits.chunks_exact(W);
    for b in &mut blocks {
        for (m, &x) in m.iter_mut().zip(b) {
            *m = m.max(x);
        }
    }
    let max = blocks
        .remainder()
        .iter()
        .chain(&m)
        .fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    if max == f32::NEG_INFINITY {
        return None;
    }
    Some((max, numerics::exp_sum(logits, max).ln()))
}

fn logprob(l: f32, max: f32, ln_s: f64) -> f32 {
    if l == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        ((l - max) as f64 - ln_s) as f32
    }
}

/// The `n` best `(id, value)` pairs of an iterator, value descending, ties
/// to the lowest id; `-inf` values are never listed. O(len · n) worst case,
/// O(len) typically (a threshold test per value).
fn top_n(values: impl Iterator<Item = (TokenId, f32)>, n: usize) -> Vec<(TokenId, f32)> {
    let mut best: Vec<(TokenId, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    // The n-th best so far: a value below it (or -inf) is skipped with one
    // comparison.
    let mut worst = (f32::NEG_INFINITY, TokenId::MAX);
    for (id, v) in values {
        if v < worst.0 || v == f32::NEG_INFINITY {
            continue;
        }
        if best.len() == n && (v == worst.0 && id > worst.1) {
            continue;
        }
        let at = best.partition_point(|&(bid, bv)| {
            crate::desc_cmp(bv, bid, v, id) == std::cmp::Ordering::Less
        });
        best.insert(at, (id, v));
        best.truncate(n);
        if best.len() == n {
            let &(wid, wv) = &best[n - 1];
            worst = (wv, wid);
        }
    }
    best
}

/// `raw` logprobs of a validated full row `logits` `[vocab]` (token id =
/// position) for the sampled `token`.
///
/// # Errors
/// [`SampleError::TokenOutOfRange`] for a requested id outside the row;
/// [`SampleError::AllMasked`] for an all-`-inf` row.
pub fn raw(logits: &[f32], spec: &LogprobsSpec, token: TokenId) -> Result<Logprobs, SampleError> {
    spec.check_vocab(logits.len())?;
    let (max, ln_s) = log_norm_slice(logits).ok_or(SampleError::AllMasked)?;
    let lp = |l: f32| logprob(l, max, ln_s);
    let top = top_n(
        logits.iter().enumerate().map(|(i, &l)| (i as TokenId, l)),
        spec.top_n,
    )
    .into_iter()
    .map(|(id, l)| (id, lp(l)))
    .filter(|p| p.1 > f32::NEG_INFINITY)
    .collect();
    let at = |t: TokenId| logits.get(t as usize).map_or(f32::NEG_INFINITY, |&l| lp(l));
    Ok(Logprobs {
        token: (token, at(token)),
        top,
        requested: spec.token_ids.iter().map(|&t| (t, at(t))).collect(),
    })
}

/// `processed` logprobs: the log-softmax of the final candidate set `row`
/// (tokens outside it `-inf`) for the sampled `token`.
///
/// # Errors
/// [`SampleError::TokenOutOfRange`] for a requested id outside the
/// vocabulary; [`SampleError::AllMasked`] when no candidate is finite.
pub fn processed(
    row: &Candidates,
    spec: &LogprobsSpec,
    token: TokenId,
) -> Result<Logprobs, SampleError> {
    spec.check_vocab(row.vocab_size())?;
    let (max, ln_s) = log_norm_slice(row.logits()).ok_or(SampleError::AllMasked)?;
    let lp = |l: f32| logprob(l, max, ln_s);
    let pairs = row.ids().iter().copied().zip(row.logits().iter().copied());
    let top = top_n(pairs, spec.top_n)
        .into_iter()
        .map(|(id, l)| (id, lp(l)))
        .filter(|p| p.1 > f32::NEG_INFINITY)
        .collect();
    // The sampled token is usually the selection; requested ids are looked
    // up in one pass (a full row is indexed directly).
    let token_lp = match row.selected() {
        Some(i) if row.ids()[i] == token => lp(row.logits()[i]),
        _ => lp(find(row, &[token])[0]),
    };
    let requested = find(row, &spec.token_ids).into_iter().map(lp);
    Ok(Logprobs {
        token: (token, token_lp),
        top,
        requested: spec.token_ids.iter().copied().zip(requested).collect(),
    })
}

/// The logits of `tokens` in `row` (`-inf` when absent).
fn find(row: &Candidates, tokens: &[TokenId]) -> Vec<f32> {
    let mut out = vec![f32::NEG_INFINITY; tokens.len()];
    if row.is_full_row() {
        for (o, &t) in out.iter_mut().zip(tokens) {
            if let Some(&l) = row.logits().get(t as usize) {
                *o = l;
            }
        }
        return out;
    }
    let mut sorted: Vec<(TokenId, usize)> = tokens.iter().copied().zip(0..).collect();
    sorted.sort_unstable();
    for (&id, &l) in row.ids().iter().zip(row.logits()) {
        let from = sorted.partition_point(|&(t, _)| t < id);
        for &(t, at) in &sorted[from..] {
            if t != id {
                break;
            }
            out[at] = l;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(top_n: usize, ids: &[TokenId], mode: LogprobsMode) -> LogprobsSpec {
        LogprobsSpec {
            top_n,
            token_ids: ids.to_vec(),
            mode,
        }
    }

    #[test]
    fn raw_is_log_softmax_not_a_logit() {
        let lp = raw(&[2.0, 1.0], &spec(2, &[1], LogprobsMode::Raw), 0).unwrap();
        // ln(e^2 / (e^2 + e)) = -ln(1 + e^-1) = -0.31326
        assert!((lp.token.1 - -0.313_261_7).abs() < 1e-6, "{lp:?}");
        assert_eq!(lp.top[0].0, 0);
        assert!((lp.top[1].1 - -1.313_261_7).abs() < 1e-6);
        assert_eq!(lp.requested, vec![(1, lp.top[1].1)]);
    }

    #[test]
    fn top_n_ties_go_to_the_lowest_id_and_skip_minus_inf() {
        let ni = f32::NEG_INFINITY;
        let lp = raw(
            &[1.0, 3.0, 3.0, ni, 3.0, 0.0],
            &spec(4, &[3], LogprobsMode::Raw),
            1,
        )
        .unwrap();
        let ids: Vec<_> = lp.top.iter().map(|p| p.0).collect();
        assert_eq!(ids, vec![1, 2, 4, 0]);
        assert_eq!(lp.requested[0].1, ni);
        let only = raw(&[ni, 0.5, ni], &spec(3, &[], LogprobsMode::Raw), 1).unwrap();
        assert_eq!(only.top, vec![(1, 0.0)]);
    }

    #[test]
    fn processed_renormalises_over_survivors() {
        let row = Candidates::from_parts(vec![4, 1], vec![2.0, 1.0], 6).unwrap();
        let lp = processed(&row, &spec(3, &[1, 5], LogprobsMode::Processed), 4).unwrap();
        assert!((lp.token.1 - -0.313_261_7).abs() < 1e-6, "{lp:?}");
        assert_eq!(lp.top.len(), 2);
        assert_eq!(lp.requested[1], (5, f32::NEG_INFINITY));
        let sum: f32 = lp.top.iter().map(|p| p.1.exp()).sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }

    #[test]
    fn log_norm_follows_the_lane_rule() {
        let row: Vec<f32> = (0..1001)
            .map(|i| ((i * 37) % 101) as f32 / 7.0 - 3.0)
            .collect();
        let (max, ln_s) = log_norm_slice(&row).unwrap();
        assert_eq!(max, row.iter().copied().fold(f32::MIN, f32::max));
        let s = numerics::sum_f64(row.iter().map(|&l| numerics::exp(l - max)));
        assert_eq!(ln_s.to_bits(), s.ln().to_bits());
        assert_eq!(log_norm_slice(&[f32::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn sizes_and_vocab_are_checked() {
        assert!(spec(21, &[], LogprobsMode::Raw).validate().is_err());
        assert!(spec(20, &[0; 128], LogprobsMode::Raw).validate().is_ok());
        assert!(spec(0, &[0; 129], LogprobsMode::Raw).validate().is_err());
        assert_eq!(
            raw(&[0.0, 1.0], &spec(0, &[2], LogprobsMode::Raw), 0),
            Err(SampleError::TokenOutOfRange { token: 2, vocab: 2 })
        );
    }
}
