//! The device fusion rules, all in one place: which stage sequences of a
//! group's device prefix run as one kernel, which kernel validates the
//! step's rows, and which writes the rows' status codes. A stage only says
//! what it is ([`Fusable`]); everything it hands on within a step lives in
//! [`Fusion`], never in [`StepData`].
//!
//! | stages (device prefix) | what runs |
//! |---|---|
//! | `penalties` then `top_k` | the history penalised inside the top-k kernel's selection (no `[B, V]` pass); a history beyond the kernel's, or no kernel: the penalties' recipe (a gather, the rule on `[B, H]`, a scatter), then the selection |
//! | `penalties` then any other stage | the penalties' recipe before that stage |
//! | full-row `top_p` / `min_p` (`min_keep <= 1`), optional `temperature` (no dynamic range), `dist` | one draw kernel (`kernels::cut_dist_full`: about three reads of the row for `top_p`, two for `min_p`) |
//! | full-row `temperature` (no dynamic range), `dist` | the same kernel without a cut |
//! | full-row cut or temperature followed by anything else | the cut's full-row kernel (`top_p_full`, `min_p`), then the temperature kernel, before that stage |
//! | `top_k`, `greedy`, a full-row cut or temperature first (after `penalties`: `top_k` only), no logprobs | that stage takes the rows unsanitised and its kernel validates them in its first pass (no validation pass, no `[B, V]` copy) |
//! | `greedy` or `dist` last on unsanitised rows | its kernel writes each invalid row's status code in place of its token (no codes kernel) |
//!
//! "Full row": the logits are still the whole vocabulary (no `top_k`
//! before), the device runs cubecl kernels (not a CPU device, kernels on)
//! and the row is wider than [`kernels::TOP_K_MAX`] (narrower rows run the
//! narrow-row kernels of each stage). Elsewhere every stage runs its own
//! [`DeviceStage::apply`], with the same tokens.

use burn_tensor::{Bool, Device, Int, Tensor};
use sampler_core::GREEDY_TEMPERATURE;

use crate::kernels::{self, FullCut, TokenCodes};
use crate::ops::{self, wide};
use crate::stage::{CutRule, DeviceStage, Fusable, HistoryPenalties, StepData};
use crate::stages::penalties::penalise;
use crate::stages::temperature::scale_rows;
use crate::stages::top_p::full_row_nucleus;

/// A full-vocabulary cut handed on to the stage after it, per step row.
struct PendingNucleus {
    cut: PendingCut,
    /// The temperature `[B, 1]` of a `temperature` stage that followed (no
    /// dynamic range), or `None`.
    t: Option<Tensor<2>>,
}

/// The cut of a [`PendingNucleus`] (`min_keep <= 1`).
enum PendingCut {
    /// `top_p`: `p` `[B, 1]`, `+inf` on rows where it is a no-op.
    TopP(Tensor<2>),
    /// `min_p`: `ln p` `[B, 1]`, `-inf` on rows where it is a no-op.
    MinP(Tensor<2>),
    /// No cut: a full-row `temperature` handed on alone.
    All,
}

/// What one step's fusion rules hand on between stages, per step row.
pub(crate) struct Fusion {
    /// History penalties handed on by a `penalties` stage, not applied yet.
    penalties: Option<HistoryPenalties>,
    /// A full-row cut (and temperature) handed on, not applied yet.
    nucleus: Option<PendingNucleus>,
    /// Per-row invalid mask `[B, 1]` (NaN / `+inf` in the input row) when
    /// the step sanitised the rows (stages see zeros there); `None` when a
    /// validating kernel takes them as they are.
    invalid: Option<Tensor<2, Bool>>,
    /// Validation keys `[B, 1]` from the first kernel that validated
    /// unsanitised rows: `2i` for a NaN at position `i`, `2i + 1` for a
    /// `+inf`, `2V` for a valid row.
    pub(crate) first_bad: Option<Tensor<2, Int>>,
    /// Whether the selected tokens already hold each invalid row's status
    /// code (a selecting kernel wrote them).
    pub(crate) sampled_codes: bool,
}

/// Whether the full-row kernels serve `[b, n]` rows on `device`.
fn full_row_kernels(b: usize, n: usize, device: &Device) -> bool {
    n > kernels::TOP_K_MAX && !crate::is_cpu_device(device) && kernels::argmax_applies(b, n)
}

/// Whether positions are still token ids over the whole vocabulary.
fn is_full_row(data: &StepData) -> bool {
    data.ids.is_none() && data.order_ids.is_none()
}

/// The width a `top_k` narrows `width` to.
fn top_k_width(k_max: usize, width: usize) -> usize {
    k_max.min(width).max(1)
}

/// Whether the first stages of a step over `[b, v]` rows take them
/// unsanitised: the first stage that does not only hand its work on
/// (`penalties`) validates the rows in its own kernel, and each row's
/// outputs depend on that row alone.
pub(crate) fn takes_unsanitised(
    stages: &[Box<dyn DeviceStage>],
    b: usize,
    v: usize,
    d: &Device,
) -> bool {
    let handing_on = stages
        .iter()
        .take_while(|st| matches!(st.fusable(), Fusable::Penalties(_)))
        .count();
    let Some(first) = stages.get(handing_on) else {
        return false;
    };
    match first.fusable() {
        Fusable::TopK { k_max, .. } => {
            let k = top_k_width(k_max, v);
            !crate::is_cpu_device(d) && kernels::top_k_applies(b, v, k)
        }
        _ if handing_on > 0 => false,
        Fusable::Cut { keep_max, .. } => keep_max <= 1 && full_row_kernels(b, v, d),
        Fusable::Temperature { dynamic: false, .. } => full_row_kernels(b, v, d),
        Fusable::Greedy => !crate::is_cpu_device(d) && kernels::argmax_applies(b, v),
        _ => false,
    }
}

impl Fusion {
    /// A step's rules; `invalid`: the rows' invalid mask when the step
    /// sanitised them.
    pub(crate) fn new(invalid: Option<Tensor<2, Bool>>) -> Self {
        Self {
            penalties: None,
            nucleus: None,
            invalid,
            first_bad: None,
            sampled_codes: false,
        }
    }

    /// What a stage gets before it runs: a pending cut applied unless the
    /// stage takes it (a `temperature` without a dynamic range adds its
    /// `t`, `dist` draws through it), pending penalties applied unless it
    /// is a `top_k` (which takes them into its selection).
    pub(crate) fn before(&mut self, st: &dyn DeviceStage, data: &mut StepData) {
        let f = st.fusable();
        if !matches!(
            f,
            Fusable::Temperature { dynamic: false, .. } | Fusable::Dist { .. }
        ) {
            self.materialize(data);
        }
        if !matches!(f, Fusable::TopK { .. }) {
            self.apply_penalties(data);
        }
    }

    /// The end of the device prefix (or a look at its candidates): every
    /// pending cut and penalty applied.
    pub(crate) fn settle(&mut self, data: &mut StepData) {
        self.materialize(data);
        self.apply_penalties(data);
    }

    /// A stage's work, once `before` ran.
    pub(crate) fn apply(&mut self, st: &dyn DeviceStage, data: &mut StepData) {
        let full = is_full_row(data);
        let fused = full_row_kernels(data.batch, data.width, &data.device);
        match st.fusable() {
            Fusable::Penalties(Some(p)) => {
                // A second penalties stage in one step: the first one's first.
                self.apply_penalties(data);
                self.penalties = Some(p.per_row(data));
            }
            Fusable::TopK { k_row, k_max } => self.top_k(st, data, k_row, k_max),
            Fusable::Cut {
                rule: CutRule::TopP,
                column,
                keep_max,
            } if keep_max <= 1 && full && fused => {
                self.nucleus = Some(PendingNucleus {
                    cut: PendingCut::TopP(data.per_row(column)),
                    t: None,
                });
            }
            Fusable::Cut {
                rule: CutRule::MinP,
                column,
                keep_max,
            } if keep_max <= 1 => {
                let log_p = data.per_row(column);
                if full && fused {
                    self.nucleus = Some(PendingNucleus {
                        cut: PendingCut::MinP(log_p),
                        t: None,
                    });
                    return;
                }
                let order = data.order_ids.clone().or(data.ids.clone());
                let kernel = (!crate::is_cpu_device(&data.device))
                    .then(|| kernels::min_p(&data.logits, order.as_ref(), &log_p))
                    .flatten();
                match kernel {
                    Some((out, first_bad)) => {
                        if full {
                            self.keep_keys(first_bad);
                        }
                        data.logits = out;
                    }
                    None => st.apply(data),
                }
            }
            Fusable::Temperature { t, dynamic: false } => {
                if let Some(nucleus) = &mut self.nucleus
                    && nucleus.t.is_none()
                {
                    // Handed on with the pending cut: the draw scales in its kernel.
                    nucleus.t = Some(data.per_row(t));
                    return;
                }
                self.materialize(data);
                if is_full_row(data) && full_row_kernels(data.batch, data.width, &data.device) {
                    // Handed on, so that a `dist` after it scales and draws
                    // in one kernel; anything else gets the scaled rows first.
                    self.nucleus = Some(PendingNucleus {
                        cut: PendingCut::All,
                        t: Some(data.per_row(t)),
                    });
                    return;
                }
                st.apply(data);
            }
            Fusable::Dist { u } => {
                if self.nucleus.is_some()
                    && let Some((tok, codes)) = self.cut_draw(data, u)
                {
                    self.nucleus = None;
                    data.sampled = Some(tok);
                    self.sampled_codes = codes;
                    return;
                }
                self.materialize(data);
                match self.draw(data, u) {
                    Some((tok, codes)) => {
                        data.sampled = Some(tok);
                        self.sampled_codes = codes;
                    }
                    None => st.apply(data),
                }
            }
            Fusable::Greedy => match self.argmax(data) {
                Some((tok, codes)) => {
                    data.sampled = Some(tok);
                    self.sampled_codes = codes;
                }
                None => st.apply(data),
            },
            _ => st.apply(data),
        }
    }

    /// Validation keys from a kernel's first pass over the input rows: the
    /// first validating kernel's (later kernels see rows an earlier one
    /// rewrote), and only when the step did not sanitise the rows.
    fn keep_keys(&mut self, first_bad: Tensor<2, Int>) {
        if self.invalid.is_none() && self.first_bad.is_none() {
            self.first_bad = Some(first_bad);
        }
    }

    /// The codes a selecting kernel writes: from an earlier kernel's keys
    /// on unsanitised rows, else (`own`) its own pass's, else tokens only.
    fn codes(&self, vocab: usize, own: bool) -> TokenCodes<'_> {
        match (&self.invalid, &self.first_bad) {
            (None, Some(keys)) => TokenCodes::Keys(keys, vocab),
            (None, None) if own => TokenCodes::OwnKeys,
            _ => TokenCodes::Tokens,
        }
    }

    /// Pending penalties applied by their recipe.
    fn apply_penalties(&mut self, data: &mut StepData) {
        if let Some(pen) = self.penalties.take() {
            penalise(data, &pen);
        }
    }

    /// `top_k`: its kernel (pending penalties inside the selection; a
    /// history too long for the kernel is applied first, then the kernel
    /// runs without it), else its recipe.
    fn top_k(
        &mut self,
        st: &dyn DeviceStage,
        data: &mut StepData,
        k_row: &Tensor<2, Int>,
        k_max: usize,
    ) {
        let k_row = data.per_row(k_row);
        let k = top_k_width(k_max, data.width);
        let penalties = self.penalties.take();
        let mut selected = self.top_k_kernel(data, &k_row, k, penalties.as_ref());
        if selected.is_none() && penalties.is_some() {
            self.penalties = penalties;
            self.apply_penalties(data);
            selected = self.top_k_kernel(data, &k_row, k, None);
        }
        let Some(t) = selected else {
            self.apply_penalties(data);
            st.apply(data);
            return;
        };
        // Positions are token ids here: the kernel's ties to the lowest
        // position are ties to the lowest id.
        data.logits = t.logits;
        data.ids = Some(t.positions);
        data.order_ids = Some(t.order_ids);
        data.width = k;
    }

    /// The top-k kernel over a full-vocabulary row, its validation keys kept.
    fn top_k_kernel(
        &mut self,
        data: &StepData,
        k_row: &Tensor<2, Int>,
        k: usize,
        penalties: Option<&HistoryPenalties>,
    ) -> Option<kernels::TopK> {
        if !is_full_row(data) {
            return None;
        }
        let t = kernels::top_k(&data.logits, k, k_row, data.vocab, penalties)?;
        self.keep_keys(t.first_bad.clone());
        Some(t)
    }

    /// `greedy`'s argmax kernel over a full-vocabulary row, and whether it
    /// wrote the rows' status codes.
    fn argmax(&mut self, data: &StepData) -> Option<(Tensor<1, Int>, bool)> {
        if !is_full_row(data) {
            return None;
        }
        let codes = self.codes(data.vocab, true);
        let wrote = !matches!(codes, TokenCodes::Tokens);
        let (tok, first_bad) = kernels::argmax(&data.logits, codes)?;
        self.keep_keys(first_bad);
        Some((tok, wrote))
    }

    /// `dist`'s kernel (narrow rows, or a full row drawn without a cut),
    /// and whether it wrote the rows' status codes (from an earlier
    /// kernel's keys).
    fn draw(&self, data: &StepData, u: &Tensor<2>) -> Option<(Tensor<1, Int>, bool)> {
        let codes = self.codes(data.vocab, false);
        let wrote = !matches!(codes, TokenCodes::Tokens);
        let tok = if data.width > kernels::TOP_K_MAX {
            if !is_full_row(data) {
                return None;
            }
            let all = FullCut::All;
            kernels::cut_dist_full(&data.logits, all, None, u, GREEDY_TEMPERATURE, codes)?.0
        } else {
            kernels::dist(&data.logits, &data.token_ids(), u, codes)?
        };
        Some((tok, wrote))
    }

    /// The pending cut, its temperature and `dist` as one kernel, and
    /// whether it wrote the rows' status codes (it validates unsanitised
    /// rows itself).
    fn cut_draw(&mut self, data: &StepData, u: &Tensor<2>) -> Option<(Tensor<1, Int>, bool)> {
        let nucleus = self.nucleus.as_ref()?;
        let codes = self.codes(data.vocab, true);
        let wrote = !matches!(codes, TokenCodes::Tokens);
        let own = matches!(codes, TokenCodes::OwnKeys);
        let cut = match &nucleus.cut {
            PendingCut::TopP(p) => FullCut::TopP(p),
            PendingCut::MinP(log_p) => FullCut::MinP(log_p),
            PendingCut::All => FullCut::All,
        };
        let t = nucleus.t.as_ref();
        let (tok, first_bad) =
            kernels::cut_dist_full(&data.logits, cut, t, u, GREEDY_TEMPERATURE, codes)?;
        if own {
            self.first_bad = Some(first_bad);
        }
        Some((tok, wrote))
    }

    /// Apply a pending cut and the temperature handed on with it: the
    /// full-row kernels (their validation keys kept when the rows came in
    /// unsanitised), the recipes elsewhere. Nothing when none is pending.
    fn materialize(&mut self, data: &mut StepData) {
        let Some(nucleus) = self.nucleus.take() else {
            return;
        };
        let kernel = match &nucleus.cut {
            PendingCut::TopP(p) => kernels::top_p_full(&data.logits, p),
            PendingCut::MinP(log_p) if !crate::is_cpu_device(&data.device) => {
                kernels::min_p(&data.logits, None, log_p)
            }
            PendingCut::MinP(_) | PendingCut::All => None,
        };
        let n = data.width;
        let keep = match (kernel, &nucleus.cut) {
            (Some((out, first_bad)), _) => {
                self.keep_keys(first_bad);
                data.logits = out;
                None
            }
            (None, PendingCut::All) => {
                // A temperature alone, on rows that may be unsanitised:
                // validate them before scaling (a `+inf` becomes `f32::MAX`).
                if self.invalid.is_none() && self.first_bad.is_none() {
                    self.first_bad = kernels::first_bad(&data.logits);
                }
                None
            }
            (None, PendingCut::TopP(p)) => {
                let e = ops::fixed_weights(ops::exps(&data.logits).0);
                let noop = p.clone().greater_elem(1.0);
                let s = e.clone().sum_dim(1);
                let ids = data.token_ids();
                let p = p.clone().clamp_max(1.0);
                Some(
                    full_row_nucleus(&data.logits, &ids, &e, &p, &s, data.vocab)
                        .bool_or(wide(noop, n)),
                )
            }
            (None, PendingCut::MinP(log_p)) => {
                let thr = data.logits.clone().max_dim(1).add(log_p.clone());
                Some(data.logits.clone().greater_equal(wide(thr, n)))
            }
        };
        if let Some(keep) = keep {
            // The first maximum in canonical order always survives.
            let ids = data.token_ids();
            let best = ops::argmax_lowest_id(&data.logits, &ids);
            let keep = keep.bool_or(ids.equal(wide(best, n)));
            data.logits = ops::mask_logits(data.logits.clone(), keep);
        }
        if let Some(t) = &nucleus.t {
            scale_rows(data, t);
        }
    }
}
