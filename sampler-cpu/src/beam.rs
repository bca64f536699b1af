//! Beam search's bookkeeping: which `(beam, token)` candidates continue,
//! which hypotheses finish, when the search is done, which sequences it
//! returns. The engine supplies, per running beam and step, the top `2W`
//! `(token, logprob)` of the log-softmax of that beam's logits after the
//! request's logits processors (penalties, bias, mask, `min_tokens`):
//! [`top_logprobs`] of the row the chain's processors leave (the serving
//! batch's `filter` gives that row).
//!
//! Semantics (Hugging Face transformers' beam search, `do_sample = false`;
//! TensorRT-LLM's is the same scheme):
//! - The search starts from one beam (the prompt), score 0. A step scores
//!   every candidate `(b, t)` as `score(b) + logprob_b(t)` (the cumulative
//!   log-probability) and takes the best `2W` over all beams, best first
//!   (ties: the lower beam index, then the beam's own candidate order).
//! - Going down that list: a candidate whose token is an end-of-sequence
//!   token finishes a hypothesis if its rank is below `W` (candidates at
//!   rank `W` or beyond are dropped, as transformers drops them); any other
//!   candidate becomes a beam of the next step, until `W` are taken.
//! - A finished hypothesis is ranked by `sum_logprobs / length^length_penalty`
//!   where `length` is the number of generated tokens **including** the
//!   end-of-sequence token (so it is at least 1 and the score is always
//!   finite). At most `W` finished hypotheses are kept (the best).
//! - `early_stopping` (checked after each step, once `W` hypotheses have
//!   finished): `True` stops then; `False` stops when the worst kept
//!   hypothesis scores at least the best running beam's
//!   `sum / current_length^length_penalty`, `current_length` counting this
//!   step's token (after transformers' heuristic: a beam could still
//!   improve if it grows, which this ignores); `Never`
//!   stops only when no running beam can beat the worst kept one:
//!   `sum / max_new_tokens^length_penalty` for `length_penalty > 0`
//!   (longer is better), `sum / current_length^length_penalty` otherwise.
//! - At `max_new_tokens` without being done, every running beam becomes a
//!   hypothesis (length = tokens generated); the best `num_return_sequences`
//!   of all are returned, best first.

use sampler_core::TokenId;

/// The most beams a search may keep.
pub const MAX_BEAMS: usize = 4096;

pub use sampler_core::EarlyStopping;

/// Beam search settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamParams {
    /// Beams kept per step (`num_beams`, `W`), `1..=MAX_BEAMS`.
    pub num_beams: usize,
    /// Sequences returned, `1..=num_beams`.
    pub num_return_sequences: usize,
    /// Exponent of the length in the finished score (transformers'
    /// default 1.0): above 0 favours longer sequences, below 0 shorter.
    pub length_penalty: f64,
    /// When to stop.
    pub early_stopping: EarlyStopping,
    /// Tokens that end a hypothesis.
    pub eos: Vec<TokenId>,
    /// Tokens generated at most, at least 1.
    pub max_new_tokens: usize,
}

/// A bad beam search setting or candidate list.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BeamError {
    /// `num_beams` outside `1..=MAX_BEAMS`.
    #[error("num_beams = {0}: expected 1 to {MAX_BEAMS}")]
    NumBeams(usize),
    /// `num_return_sequences` outside `1..=num_beams`.
    #[error("num_return_sequences = {0}: expected 1 to num_beams ({1})")]
    NumReturn(usize, usize),
    /// `length_penalty` not finite.
    #[error("length_penalty = {0}: expected a finite number")]
    LengthPenalty(f64),
    /// `max_new_tokens` of 0.
    #[error("max_new_tokens = 0: expected at least 1")]
    MaxNewTokens,
    /// A step's candidate lists do not match the running beams.
    #[error("{found} candidate lists for {beams} running beams")]
    Beams {
        /// Lists given.
        found: usize,
        /// Running beams.
        beams: usize,
    },
    /// A candidate logprob that is NaN or positive.
    #[error("beam {beam}: token {token} has logprob {logprob}: expected a number <= 0")]
    Logprob {
        /// The beam.
        beam: usize,
        /// The token.
        token: TokenId,
        /// Its logprob.
        logprob: f32,
    },
    /// A step after the search is done.
    #[error("the search is done")]
    Done,
}

/// A finished (or, at the length limit, running) sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Generated tokens, an end-of-sequence token last when it finished.
    pub tokens: Vec<TokenId>,
    /// Sum of the tokens' logprobs.
    pub sum_logprobs: f64,
    /// `sum_logprobs / length^length_penalty`.
    pub score: f64,
}

/// The state of one beam search.
#[derive(Debug, Clone)]
pub struct BeamSearch {
    params: BeamParams,
    /// Running beams: generated tokens and cumulative logprob.
    beams: Vec<(Vec<TokenId>, f64)>,
    /// Finished hypotheses, best first, at most `num_beams`.
    finished: Vec<Hypothesis>,
    done: bool,
}

fn normalised(sum: f64, len: usize, penalty: f64) -> f64 {
    sum / (len.max(1) as f64).powf(penalty)
}

impl BeamSearch {
    /// A search from the prompt (one running beam, no tokens).
    ///
    /// # Errors
    /// [`BeamError`] naming the setting out of range.
    pub fn new(params: BeamParams) -> Result<Self, BeamError> {
        if params.num_beams == 0 || params.num_beams > MAX_BEAMS {
            return Err(BeamError::NumBeams(params.num_beams));
        }
        if params.num_return_sequences == 0 || params.num_return_sequences > params.num_beams {
            return Err(BeamError::NumReturn(
                params.num_return_sequences,
                params.num_beams,
            ));
        }
        if !params.length_penalty.is_finite() {
            return Err(BeamError::LengthPenalty(params.length_penalty));
        }
        if params.max_new_tokens == 0 {
            return Err(BeamError::MaxNewTokens);
        }
        Ok(Self {
            params,
            beams: vec![(Vec::new(), 0.0)],
            finished: Vec::new(),
            done: false,
        })
    }

    /// The settings.
    pub fn params(&self) -> &BeamParams {
        &self.params
    }

    /// Candidates the engine should supply per beam (`2W`, the most a step
    /// can use).
    pub fn candidates_per_beam(&self) -> usize {
        2 * self.params.num_beams
    }

    /// The running beams: their tokens and cumulative logprobs.
    pub fn beams(&self) -> &[(Vec<TokenId>, f64)] {
        &self.beams
    }

    /// Whether the search has stopped (no more steps).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// One step: `candidates[b]` are running beam `b`'s best `(token,
    /// logprob)` (at least the best `2W` of the row, in any order; ties in
    /// logprob keep this order). Returns the next step's beams as
    /// `(parent beam, token)`, empty once the search is done.
    ///
    /// # Errors
    /// [`BeamError::Beams`], [`BeamError::Logprob`], [`BeamError::Done`].
    pub fn step(
        &mut self,
        candidates: &[Vec<(TokenId, f32)>],
    ) -> Result<Vec<(usize, TokenId)>, BeamError> {
        if self.done {
            return Err(BeamError::Done);
        }
        if candidates.len() != self.beams.len() {
            return Err(BeamError::Beams {
                found: candidates.len(),
                beams: self.beams.len(),
            });
        }
        let w = self.params.num_beams;
        let mut scored: Vec<(f64, usize, usize, TokenId)> = Vec::new();
        for (b, row) in candidates.iter().enumerate() {
            for (i, &(t, lp)) in row.iter().enumerate() {
                if lp.is_nan() || lp > 0.0 {
                    return Err(BeamError::Logprob {
                        beam: b,
                        token: t,
                        logprob: lp,
                    });
                }
                if lp == f32::NEG_INFINITY {
                    continue;
                }
                scored.push((self.beams[b].1 + f64::from(lp), b, i, t));
            }
        }
        scored.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        scored.truncate(2 * w);
        let len = self.beams[0].0.len() + 1;
        let mut next = Vec::with_capacity(w);
        let mut next_beams = Vec::with_capacity(w);
        for (rank, &(score, b, _, t)) in scored.iter().enumerate() {
            if self.params.eos.contains(&t) {
                if rank < w {
                    let mut tokens = self.beams[b].0.clone();
                    tokens.push(t);
                    self.add(tokens, score);
                }
            } else {
                let mut tokens = self.beams[b].0.clone();
                tokens.push(t);
                next.push((b, t));
                next_beams.push((tokens, score));
                if next.len() == w {
                    break;
                }
            }
        }
        self.beams = next_beams;
        let best_running = self
            .beams
            .iter()
            .map(|b| b.1)
            .fold(f64::NEG_INFINITY, f64::max);
        if self.beams.is_empty() || self.stops(best_running, len) {
            self.done = true;
            self.beams.clear();
            return Ok(Vec::new());
        }
        if len >= self.params.max_new_tokens {
            // The length limit: the running beams become hypotheses.
            for (tokens, sum) in std::mem::take(&mut self.beams) {
                self.add(tokens, sum);
            }
            self.done = true;
            return Ok(Vec::new());
        }
        Ok(next)
    }

    /// Keep a finished hypothesis if it is among the best `num_beams`.
    fn add(&mut self, tokens: Vec<TokenId>, sum: f64) {
        let score = normalised(sum, tokens.len(), self.params.length_penalty);
        let at = self
            .finished
            .iter()
            .position(|h| h.score < score)
            .unwrap_or(self.finished.len());
        if at < self.params.num_beams {
            self.finished.insert(
                at,
                Hypothesis {
                    tokens,
                    sum_logprobs: sum,
                    score,
                },
            );
            self.finished.truncate(self.params.num_beams);
        }
    }

    /// Whether the search stops after a step that generated `len` tokens,
    /// the best running beam having cumulative logprob `best`.
    fn stops(&self, best: f64, len: usize) -> bool {
        if self.finished.len() < self.params.num_beams {
            return false;
        }
        let worst = self.finished.last().map_or(f64::NEG_INFINITY, |h| h.score);
        let lp = self.params.length_penalty;
        match self.params.early_stopping {
            EarlyStopping::True => true,
            EarlyStopping::False => worst >= normalised(best, len, lp),
            EarlyStopping::Never => {
                let reach = if lp > 0.0 {
                    self.params.max_new_tokens
                } else {
                    len
                };
                worst >= normalised(best, reach, lp)
            }
        }
    }

    /// The best `num_return_sequences` hypotheses, best first. Before the
    /// search is done (an engine stopping early, e.g. at the end of its
    /// context), the running beams count as hypotheses.
    pub fn finish(mut self) -> Vec<Hypothesis> {
        for (tokens, sum) in std::mem::take(&mut self.beams) {
            self.add(tokens, sum);
        }
        self.finished.truncate(self.params.num_return_sequences);
        self.finished
    }
}

/// The best `n` `(token, logprob)` of the log-softmax of `logits` (a row
/// after the request's processors, `-inf` for banned tokens), best first,
/// ties to the lower id; `-inf` entries left out. For a row with no finite
/// logit, nothing.
pub fn top_logprobs(logits: &[f32], ids: Option<&[TokenId]>, n: usize) -> Vec<(TokenId, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return Vec::new();
    }
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let id = |i: usize| ids.map_or(i as TokenId, |ids| ids[i]);
    let mut order: Vec<usize> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect();
    let by = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(id(*a).cmp(&id(*b)));
    if order.len() > n && n > 0 {
        order.select_nth_unstable_by(n - 1, by);
        order.truncate(n);
    }
    order.sort_by(by);
    order.truncate(n);
    order
        .into_iter()
        .map(|i| (id(i), (f64::from(logits[i]) - lse) as f32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(w: usize, r: usize, lp: f64, es: EarlyStopping, max: usize) -> BeamParams {
        BeamParams {
            num_beams: w,
            num_return_sequences: r,
            length_penalty: lp,
            early_stopping: es,
            eos: vec![0],
            max_new_tokens: max,
        }
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let e = |p| BeamSearch::new(p).unwrap_err().to_string();
        assert!(e(params(0, 1, 1.0, EarlyStopping::False, 4)).contains("num_beams = 0"));
        assert!(e(params(4097, 1, 1.0, EarlyStopping::False, 4)).contains("num_beams = 4097"));
        assert!(e(params(2, 3, 1.0, EarlyStopping::False, 4)).contains("num_return_sequences = 3"));
        assert!(e(params(2, 1, f64::NAN, EarlyStopping::False, 4)).contains("length_penalty"));
        assert!(e(params(2, 1, 1.0, EarlyStopping::False, 0)).contains("max_new_tokens"));
        let mut s = BeamSearch::new(params(2, 1, 1.0, EarlyStopping::False, 4)).unwrap();
        assert!(matches!(
            s.step(&[vec![], vec![]]),
            Err(BeamError::Beams { found: 2, beams: 1 })
        ));
        assert!(matches!(
            s.step(&[vec![(1, 0.5)]]),
            Err(BeamError::Logprob { .. })
        ));
        assert_eq!(
            EarlyStopping::from_word("never"),
            Some(EarlyStopping::Never)
        );
    }

    #[test]
    fn top_logprobs_normalise_over_the_whole_row() {
        let row = [1.0f32, 3.0, f32::NEG_INFINITY, 3.0, 0.0];
        let top = top_logprobs(&row, None, 3);
        assert_eq!(top.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3, 0]);
        let total: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(top[0].1) - (3.0 - total.ln())).abs() < 1e-6);
        assert!(top_logprobs(&[f32::NEG_INFINITY; 3], None, 2).is_empty());
        assert_eq!(top_logprobs(&[0.0, 1.0], Some(&[7, 9]), 5)[0].0, 9);
    }
}
