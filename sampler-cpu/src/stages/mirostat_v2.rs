//! `mirostat_v2`: Mirostat v2 (selects a token).

use sampler_core::{
    Candidates, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin,
};

use super::dist::dist_select;
use super::mirostat::{selected_surprise, update_mu};

/// Mirostat v2 (Basu et al. 2021, algorithm 2) with llama.cpp semantics:
/// sort and softmax; keep the head before the first candidate whose surprise
/// `−log2 p` exceeds `μ` (at least one); softmax again and draw with
/// [`dist_select`] (uniform `ctx.rng.uniform(0)`). `μ` starts (and resets)
/// at `2τ` and is updated when the drawn token is accepted as output:
/// `μ -= η·(−log2 p_token − τ)`.
///
/// # Errors
/// [`SampleError::EmptyRow`], [`SampleError::AllMasked`].
#[derive(Debug, Clone, Copy)]
pub struct MirostatV2 {
    tau: f32,
    eta: f32,
    mu: f32,
    pending: Option<(TokenId, f32)>,
}

impl MirostatV2 {
    /// A Mirostat v2 stage: target surprise `tau` (bits), learning rate `eta`.
    pub fn new(tau: f32, eta: f32) -> Self {
        Self {
            tau,
            eta,
            mu: 2.0 * tau,
            pending: None,
        }
    }

    /// The current `μ` (bits).
    pub fn mu(&self) -> f32 {
        self.mu
    }
}

impl Sampler for MirostatV2 {
    fn name(&self) -> &str {
        "mirostat_v2"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::MirostatV2 {
            tau: self.tau,
            eta: self.eta,
        })
    }
    fn apply(&mut self, row: &mut Candidates, ctx: &StageContext) -> Result<(), SampleError> {
        if row.is_empty() {
            return Err(SampleError::EmptyRow);
        }
        // Softmax before the sort: its sum runs in the order the row comes in
        // (id order for a raw row), so that the fast path's one-pass sum
        // gives the same bits (the order of `top_p`'s sum too).
        row.softmax()?;
        row.sort_desc();
        let probs = row.probs().unwrap_or(&[]);
        let keep = probs
            .iter()
            .position(|&p| -p.log2() > self.mu)
            .unwrap_or(probs.len())
            .max(1);
        row.truncate(keep);
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
