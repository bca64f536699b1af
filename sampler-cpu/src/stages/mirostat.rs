//! `mirostat`: Mirostat v1 (selects a token).

use sampler_core::{
    Candidates, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin, desc_cmp,
};

use super::dist::dist_select;
use crate::util::is_sorted_desc;

/// Mirostat v1 (Basu et al. 2021, algorithm 1) with llama.cpp semantics.
///
/// Per step: softmax (its sum in the order the set comes in: id order for
/// a raw row); estimate the Zipf exponent `s` from the `m` most probable
/// (`t_i = ln((i+2)/(i+1))`, `b_i = ln(p_i / p_{i+1})`, `s = Σ t b / Σ t²`);
/// `k = ((ε·2^μ) / (1 − V^(−ε)))^(1/s)` with `ε = s − 1` and `V` the
/// vocabulary size; keep the top `max(k, 1)`, sorted, softmax again and
/// draw with [`dist_select`] (uniform `ctx.rng.uniform(0)`). A non-finite `k`
/// (or one of at least the set's size) keeps every candidate, in the order
/// they came. Never sorts the whole set: the `m` best and the `k` best are
/// found by selection, O(n + m log m + k log k).
///
/// State: `μ`, initialised (and reset) to `2τ`. When the drawn token is then
/// accepted as output, `μ -= η·(−log2 p_token − τ)`, with `p_token` its
/// probability after truncation. (llama.cpp updates `μ` inside `apply`; here
/// `apply` has no lasting effect until the token is accepted.)
///
/// # Errors
/// [`SampleError::EmptyRow`], [`SampleError::AllMasked`].
#[derive(Debug, Clone, Copy)]
pub struct Mirostat {
    tau: f32,
    eta: f32,
    m: usize,
    mu: f32,
    pending: Option<(TokenId, f32)>,
}

impl Mirostat {
    /// A Mirostat v1 stage: target surprise `tau` (bits), learning rate `eta`,
    /// `m` tokens for the exponent estimate.
    pub fn new(tau: f32, eta: f32, m: usize) -> Self {
        Self {
            tau,
            eta,
            m,
            mu: 2.0 * tau,
            pending: None,
        }
    }

    /// The current `μ` (bits).
    pub fn mu(&self) -> f32 {
        self.mu
    }
}

/// The probabilities of the `h` best candidates of a softmaxed set, in the
/// canonical order (descending logit, ties by ascending id), by selection.
fn head_probs(row: &Candidates, h: usize) -> Vec<f32> {
    let probs = row.probs().unwrap_or(&[]);
    if row.is_sorted() {
        return probs[..h.min(probs.len())].to_vec();
    }
    if h == 0 {
        return Vec::new();
    }
    let (ids, logits) = (row.ids(), row.logits());
    let cmp = |&a: &usize, &b: &usize| desc_cmp(logits[a], ids[a], logits[b], ids[b]);
    let mut order: Vec<usize> = (0..row.len()).collect();
    if h < order.len() {
        order.select_nth_unstable_by(h - 1, cmp);
        order.truncate(h);
    }
    order.sort_unstable_by(cmp);
    order.iter().map(|&i| probs[i]).collect()
}

/// How many candidates Mirostat v1 keeps: `k` from the exponent estimated on
/// `head` (the most probable candidates' probabilities, descending, at
/// least `min(m, len)` of them), `m`, `mu` and the vocabulary size; at
/// least 1, `len` when `k` is not finite.
pub(crate) fn keep_count(head: &[f32], m: usize, mu: f32, vocab: usize, len: usize) -> usize {
    let pairs = m
        .saturating_sub(1)
        .min(len.saturating_sub(1))
        .min(head.len().saturating_sub(1));
    let (mut sum_tb, mut sum_t2) = (0.0f64, 0.0f64);
    for i in 0..pairs {
        let t = ((i as f64 + 2.0) / (i as f64 + 1.0)).ln();
        let b = (f64::from(head[i]) / f64::from(head[i + 1])).ln();
        sum_tb += t * b;
        sum_t2 += t * t;
    }
    let s_hat = sum_tb / sum_t2;
    let eps = s_hat - 1.0;
    let vocab = vocab as f64;
    let k = ((eps * 2f64.powf(f64::from(mu))) / (1.0 - vocab.powf(-eps))).powf(1.0 / s_hat);
    if k.is_finite() {
        (k.max(1.0) as usize).min(len)
    } else {
        len
    }
}

/// Record the selected token and its probability (for the `μ` update on accept).
pub(crate) fn selected_surprise(row: &Candidates, index: usize) -> Option<(TokenId, f32)> {
    let token = *row.ids().get(index)?;
    let p = *row.probs()?.get(index)?;
    Some((token, p))
}

/// `μ` after accepting a token of probability `p`.
pub(crate) fn update_mu(mu: f32, tau: f32, eta: f32, p: f32) -> f32 {
    let surprise = -p.log2();
    let next = mu - eta * (surprise - tau);
    if next.is_finite() { next } else { mu }
}

impl Sampler for Mirostat {
    fn name(&self) -> &str {
        "mirostat"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Mirostat {
            tau: self.tau,
            eta: self.eta,
            m: self.m,
        })
    }
    fn apply(&mut self, row: &mut Candidates, ctx: &StageContext) -> Result<(), SampleError> {
        if row.is_empty() {
            return Err(SampleError::EmptyRow);
        }
        row.softmax()?;
        let head = head_probs(row, self.m.min(row.len()));
        let vocab = row.vocab_size().max(row.len());
        let keep = keep_count(&head, self.m, self.mu, vocab, row.len());
        if keep < row.len() {
            row.top_k_sorted(keep);
        } else if !row.is_sorted() && is_sorted_desc(row.logits(), row.ids()) {
            row.set_sorted(true);
        }
        let index = dist_select(row, ctx.rng.uniform(0))?;
        self.pending = selected_surprise(row, index);
        Ok(())
    }
    fn mirostat_mu(&self) -> Option<f32> {
        Some(self.mu)
    }
    fn record_selection(&mut self, token: TokenId, prob: f32) {
        self.pending = Some((token, prob));
    }
    fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        if origin != TokenOrigin::Output {
            return;
        }
        if let Some((t, p)) = self.pending.take()
            && t == token
        {
            self.mu = update_mu(self.mu, self.tau, self.eta, p);
        }
    }
    fn reset(&mut self) {
        self.mu = 2.0 * self.tau;
        self.pending = None;
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
