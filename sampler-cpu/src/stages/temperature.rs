//! `temperature`: divide logits by `t`, with llama.cpp's dynamic-temperature extension.

use sampler_core::{Candidates, GREEDY_TEMPERATURE, SampleError, Sampler, StageContext, StageSpec};

use crate::util::{div_saturating, is_sorted_desc};

/// Temperature scaling, following llama.cpp `temp` / `temp-ext`.
///
/// * `dynatemp_range <= 0`: plain temperature. `t < GREEDY_TEMPERATURE`
///   (1e-5) is the argmax rule: the maximum (ties: lowest id) keeps its logit,
///   every other candidate gets `-inf`, the size is unchanged. Otherwise every
///   logit is divided by `t`; a finite logit never becomes `±inf` (it
///   saturates to `±f32::MAX`). `t == 1` is a no-op.
/// * `dynatemp_range > 0` (Zhu et al. 2024, llama.cpp temp-ext): on sets of
///   2 or more, `H` is the entropy of their softmax (in the order they come,
///   `ln S − Σ e_i (l_i − max) / S` in f64: no sort, no logarithm per
///   candidate) and `H_max = ln(n)` with `n` the number of finite-logit
///   candidates; the temperature is
///   `max(0, t - range) + 2·range·(H / H_max)^exponent`, applied as above,
///   and the probabilities are recomputed (order kept, normalised).
///
/// # Errors
/// None for plain temperature; the dynamic path on an all-`-inf` set leaves it unchanged.
#[derive(Debug, Clone, Copy)]
pub struct Temperature {
    t: f32,
    range: f32,
    exponent: f32,
}

impl Temperature {
    /// A temperature stage (`range`, `exponent`: dynamic temperature; range 0 disables it).
    pub fn new(t: f32, range: f32, exponent: f32) -> Self {
        Self { t, range, exponent }
    }
}

/// Apply a fixed temperature `t` to the row (argmax rule below [`GREEDY_TEMPERATURE`]).
pub(crate) fn apply_temperature(row: &mut Candidates, t: f32) {
    if row.is_empty() {
        return;
    }
    if t.is_nan() || t < GREEDY_TEMPERATURE {
        let Some(best) = row.argmax() else { return };
        for (i, l) in row.logits_mut().iter_mut().enumerate() {
            if i != best {
                *l = f32::NEG_INFINITY;
            }
        }
        return;
    }
    if t == 1.0 {
        return;
    }
    let was_sorted = row.is_sorted();
    for l in row.logits_mut() {
        *l = div_saturating(*l, t);
    }
    if was_sorted && is_sorted_desc(row.logits(), row.ids()) {
        row.set_sorted(true);
    }
}

/// The dynamic temperature for entropy `entropy` (nats) over `finite`
/// drawable candidates: `max(0, t − range) + 2·range·(H / ln n)^exponent`
/// (the ratio clamped to `[0, 1]`, 0 when `ln n <= 0`), `t` when that is
/// not finite.
pub(crate) fn dynamic_t(t: f32, range: f32, exponent: f32, entropy: f64, finite: usize) -> f32 {
    let min_t = (t - range).max(0.0);
    let max_t = t + range;
    let entropy = entropy as f32;
    let max_entropy = (finite as f32).ln();
    let norm = if max_entropy > 0.0 {
        (entropy / max_entropy).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let dyn_t = min_t + (max_t - min_t) * norm.powf(exponent);
    if dyn_t.is_finite() { dyn_t } else { t }
}

impl Sampler for Temperature {
    fn name(&self) -> &str {
        "temperature"
    }
    fn spec(&self) -> Option<StageSpec> {
        Some(StageSpec::Temperature {
            t: self.t,
            dynatemp_range: self.range,
            dynatemp_exponent: self.exponent,
        })
    }
    fn apply(&mut self, row: &mut Candidates, _ctx: &StageContext) -> Result<(), SampleError> {
        if self.range.is_nan() || self.range <= 0.0 {
            apply_temperature(row, self.t);
            return Ok(());
        }
        if row.len() <= 1 {
            return Ok(());
        }
        // An all-`-inf` set is left as it is.
        let max = row.max_logit();
        if max == f32::NEG_INFINITY {
            return Ok(());
        }
        let (_, entropy) = crate::util::log_norm_entropy(row.logits(), max);
        // H_max counts the candidates that can still be drawn (finite logits):
        // a `-inf` entry left by an earlier mask is not a choice. llama.cpp's
        // CPU path counts the physical set size and its device path the
        // tensor length; counting finite candidates makes the result
        // independent of whether a filter removed or masked (docs/semantics.md).
        let finite = row.logits().iter().filter(|l| l.is_finite()).count();
        let dyn_t = dynamic_t(self.t, self.range, self.exponent, entropy, finite);
        apply_temperature(row, dyn_t);
        // Marked sorted when the order is the sorted one (llama.cpp sorts
        // here; division keeps a sorted set sorted, the argmax rule may not).
        row.set_sorted(is_sorted_desc(row.logits(), row.ids()));
        let _ = row.softmax();
        Ok(())
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(*self)
    }
}
