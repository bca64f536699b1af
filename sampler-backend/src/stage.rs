//! The device hook trait and the data a step passes
//! from stage to stage.

use burn_tensor::kind::Basic;
use burn_tensor::{Bool, Device, Int, Tensor};
use sampler_core::{DeviceRefusal, StageKind, StageSpec, TokenId, TokenOrigin};

/// What a stage's `init` learns about the step it will join.
#[derive(Debug, Clone)]
pub struct InitContext {
    /// Rows per step (`B`).
    pub batch: usize,
    /// Vocabulary size (`V`).
    pub vocab: usize,
    /// Width `N` of the logits entering this stage: `V`, or the batch's
    /// largest `k` after a device `top_k`.
    pub width: usize,
    /// Whether an `ids [B, N]` tensor maps positions to token ids here
    /// (true after a device `top_k`).
    pub has_ids: bool,
    /// The device.
    pub device: Device,
}

/// Host data of one row for one step, handed to [`DeviceStage::set_input`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    /// The row's seed (its CPU chain's seed).
    pub seed: u64,
    /// Tokens the row has sampled since its chain was reset.
    pub step: u64,
    /// The row's allowed-token bitmask for this step (`ceil(V / 32)` words),
    /// `None`: every token allowed (the `mask` stage's input).
    pub mask: Option<std::sync::Arc<[u32]>>,
}

/// The tensors of one step, passed through the device stages in order.
///
/// Masked candidates are `-inf` logits; filters never change the width
/// except `top_k`, which narrows it to the batch's largest `k` and sets `ids`.
#[derive(Debug, Clone)]
pub struct StepData {
    /// Logits `[B, N]` (f32, natural-log units).
    pub logits: Tensor<2>,
    /// Probabilities `[B, N]`, when a stage computed them (unused by the built-in stages).
    pub probs: Option<Tensor<2>>,
    /// Position -> token id `[B, N]`; `None` means position == token id.
    /// Always inside the vocabulary (safe to gather and scatter with); at
    /// padding positions (past a row's own `top_k`) it repeats a real id.
    pub ids: Option<Tensor<2, Int>>,
    /// The ids that order candidates (ties to the lowest id) `[B, N]`: as
    /// `ids`, but padding positions get `vocab + position`, so they rank after
    /// every real candidate and never equal one. Set with `ids` by `top_k`.
    pub order_ids: Option<Tensor<2, Int>>,
    /// The selected token id per row `[B]`, set by a selecting stage.
    pub sampled: Option<Tensor<1, Int>>,
    /// Whether `sampled` already holds what a fully offloaded step reads
    /// back: each invalid row's status code in place of its token (a
    /// selecting kernel that wrote them from [`StepData::first_bad`] or its
    /// own validation), so the step writes no codes of its own.
    pub sampled_codes: bool,
    /// Per-row invalid mask `[B, 1]` (NaN / `+inf` in the input row). Stages
    /// see sanitised logits (zeros) on invalid rows and need not look at it.
    /// `None` when the first stage takes the rows unsanitised
    /// ([`DeviceStage::takes_unsanitised_rows`]) and validates them in its
    /// own pass: then the stages see the input rows as they are, that stage
    /// sets [`StepData::first_bad`], and every output of an invalid row is
    /// replaced by its status code.
    pub invalid: Option<Tensor<2, Bool>>,
    /// Validation keys `[B, 1]` (int) set by a first stage that validated
    /// the unsanitised rows itself (`invalid` is `None`): `2i` for a NaN at
    /// position `i`, `2i + 1` for a `+inf`, `2V` for a valid row. When no
    /// stage sets it, the step validates the input rows after the stages.
    pub first_bad: Option<Tensor<2, Int>>,
    /// History penalties handed on by a `penalties` stage and not applied
    /// yet ([`DeviceStage::defers_to_next`]): the next stage applies them
    /// inside its own kernel when it can ([`DeviceStage::applies_penalties`]),
    /// else the step penalises the logits before that stage runs
    /// (`stages::penalties::apply_history_penalties`).
    pub penalties: Option<HistoryPenalties>,
    /// A full-vocabulary `top_p` or `min_p` handed on and not applied yet
    /// (the logits are still the rows it would filter): a following
    /// `temperature` adds its `t` and `dist` runs all three as one kernel
    /// (`kernels::cut_dist_full`: about three reads of the row for
    /// `top_p`, where three kernels read it fifteen times, two for
    /// `min_p`). Any other stage, and the end of the device prefix, get the
    /// filtered (and scaled) logits first
    /// ([`DeviceStage::takes_pending_nucleus`]).
    pub nucleus: Option<PendingNucleus>,
    /// Step row -> slot `[B]`: the slot (row of the stage's own per-row
    /// tensors, `[S, ..]`) of each step row; `None` when step row `r` is
    /// slot `r`. Stages read per-row tensors through [`StepData::per_row`].
    pub slots: Option<Tensor<1, Int>>,
    /// Rows `B`.
    pub batch: usize,
    /// Vocabulary `V`.
    pub vocab: usize,
    /// Current width `N`.
    pub width: usize,
    /// The device.
    pub device: Device,
}

/// Pending repetition / frequency / presence penalties of one step (the
/// CPU `penalties` rule), per step row: each row's distinct history tokens
/// and their counts in its window (`count 0` marks padding, at a token
/// outside the window).
#[derive(Debug, Clone)]
pub struct HistoryPenalties {
    /// History token ids `[B, H]` (inside the vocabulary).
    pub ids: Tensor<2, Int>,
    /// Their occurrences in the window `[B, H]` (f32; 0 for padding).
    pub counts: Tensor<2>,
    /// `repeat` per row `[B, 1]`.
    pub repeat: Tensor<2>,
    /// `frequency` per row `[B, 1]`.
    pub frequency: Tensor<2>,
    /// `presence` per row `[B, 1]`.
    pub presence: Tensor<2>,
}

/// A pending full-vocabulary `top_p` or `min_p` (and the `temperature`
/// after it), or a full-row `temperature` alone, of one step, per step row ([`StepData::nucleus`]).
#[derive(Debug, Clone)]
pub struct PendingNucleus {
    /// The cut.
    pub cut: PendingCut,
    /// The temperature `[B, 1]` of a `temperature` stage that followed
    /// (no dynamic range), or `None`.
    pub t: Option<Tensor<2>>,
}

/// The cut of a [`PendingNucleus`] (`min_keep <= 1`).
#[derive(Debug, Clone)]
pub enum PendingCut {
    /// `top_p`: `p` `[B, 1]`, `+inf` on rows where it is a no-op.
    TopP(Tensor<2>),
    /// `min_p`: `ln p` `[B, 1]`, `-inf` on rows where it is a no-op.
    MinP(Tensor<2>),
    /// No cut: a full-row `temperature` handed on alone.
    All,
}

impl StepData {
    /// A stage's per-slot tensor `[S, M]` seen per step row `[B, M]`
    /// (through [`StepData::slots`]).
    pub fn per_row<K: Basic>(&self, t: &Tensor<2, K>) -> Tensor<2, K> {
        match &self.slots {
            Some(slots) => t.clone().select(0, slots.clone()),
            None => t.clone(),
        }
    }

    /// [`StepData::per_row`] for a bool tensor (gathered as ints: flex's
    /// bool `select` returns another bool storage that its bool ops refuse).
    pub fn per_row_bool(&self, t: &Tensor<2, Bool>) -> Tensor<2, Bool> {
        match &self.slots {
            Some(slots) => t.clone().int().select(0, slots.clone()).bool(),
            None => t.clone(),
        }
    }

    /// Token ids `[B, N]` of the current positions for ordering and
    /// equality (`order_ids`, or `ids`, or `0..N`): padding positions rank
    /// last and match no real token. Gather and scatter with `ids` instead.
    pub fn token_ids(&self) -> Tensor<2, Int> {
        match self.order_ids.as_ref().or(self.ids.as_ref()) {
            Some(ids) => ids.clone(),
            None => crate::ops::positions(self.batch, self.width, &self.device),
        }
    }
}

/// Device hooks of one stage, for the whole batch (as llama.cpp's
/// `backend_init / backend_set_input / backend_apply`).
///
/// A stage is built from the per-slot specs of its chain position (same
/// kind, parameters may differ per slot) and keeps per-slot parameters as
/// `[S, 1]` tensors, uploaded once in `init`; a step runs any subset of the
/// slots in any order ([`StepData::slots`]), as one batched pass whatever
/// the parameters. A slot is one request of a serving batch.
pub trait DeviceStage: Send {
    /// Canonical stage name.
    fn name(&self) -> &'static str;
    /// Whether the batch must feed this stage accepted tokens (`accept`,
    /// `accept_prompt`, `restore`). From the stage's registry metadata
    /// (`needs_history`); a stage the registry does not know gets them.
    fn needs_history(&self) -> bool {
        registered(self.name()).is_none_or(|k| k.meta().needs_history)
    }
    /// Whether the batch must call `set_input` before each step: the stage
    /// needs history deltas, the rows' random streams or other per-step row
    /// data (`needs_history`, `needs_randomness`, `needs_step_input` in its
    /// metadata). A stage the registry does not know is called.
    fn needs_step_input(&self) -> bool {
        registered(self.name()).is_none_or(|k| {
            let meta = k.meta();
            meta.needs_history || meta.needs_randomness || meta.needs_step_input
        })
    }
    /// Allocate state and upload per-row parameters.
    ///
    /// # Errors
    /// Why the device recipe cannot honour these parameters here
    /// ([`DeviceRefusal`]); the planner then keeps this stage and everything
    /// after it on the host and `plan` shows the reason.
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal>;
    /// Upload per-step host data (uniforms, history deltas) before `apply`;
    /// `rows` are the step's rows, in step order.
    fn set_input(&mut self, _rows: &[RowState]) {}
    /// Append this stage's tensor ops to the step.
    fn apply(&self, data: &mut StepData);
    /// Whether, as the first device stage of a step over `[batch, width]`
    /// logits on `device`, this stage's `apply` can take the input rows
    /// unsanitised: each row's outputs depend on that row alone and nothing
    /// fails on a NaN or `+inf` (the outputs of invalid rows are replaced by
    /// their status codes). Then the step skips the `[B, V]` copy that zeroes
    /// invalid rows and leaves [`StepData::invalid`] `None`; the stage may
    /// validate the rows in its own pass ([`StepData::first_bad`]). Default:
    /// no (the custom cubecl kernels say yes).
    fn takes_unsanitised_rows(&self, _batch: usize, _width: usize, _device: &Device) -> bool {
        false
    }
    /// Whether `apply` leaves the logits as they are and hands its work to
    /// the next stage ([`StepData::penalties`]); such a stage never decides
    /// how the step treats invalid rows: the next one does. Default: no.
    fn defers_to_next(&self) -> bool {
        false
    }
    /// Whether `apply` takes pending [`StepData::penalties`] itself (inside
    /// its kernel, or by applying them first); otherwise the step applies
    /// them before this stage runs. Default: no.
    fn applies_penalties(&self) -> bool {
        false
    }
    /// Whether `apply` takes a pending full-vocabulary `top_p`
    /// ([`StepData::nucleus`]) as it is (`temperature` adds its `t`, `dist`
    /// draws through it); otherwise the step applies it first. Default: no.
    fn takes_pending_nucleus(&self) -> bool {
        false
    }
    /// Width after this stage given the width before (only `top_k` narrows).
    fn out_width(&self, width: usize) -> usize {
        width
    }
    /// Record the tokens selected this step, per slot (`None` for slots
    /// that failed or did not run this step).
    fn accept(&mut self, _tokens: &[Option<TokenId>]) {}
    /// Record prompt tokens of one slot.
    fn accept_prompt(&mut self, _slot: usize, _tokens: &[TokenId]) {}
    /// Give one slot the history of a request that already ran: every token
    /// it accepted (prompt and generated), in order, with its origin (called
    /// before `init`, when a serving batch rebuilds a group). Only
    /// history-based stages care.
    fn restore(&mut self, _slot: usize, _history: &[(TokenId, TokenOrigin)]) {}
    /// Forget history.
    fn reset(&mut self) {}
}

/// The registered kind whose canonical name is `name` (device stages report
/// canonical names). Asked per step, so an exact comparison: no alias
/// normalisation, no allocation.
fn registered(name: &str) -> Option<StageKind> {
    StageKind::ALL.into_iter().find(|k| k.name() == name)
}

macro_rules! device_builder {
    (@one yes $Var:ident $module:ident $stage_index:ident $specs:ident) => {
        Some(Box::new(crate::stages::$module::$Var::new($stage_index, $specs)))
    };
    (@one no $Var:ident $module:ident $stage_index:ident $specs:ident) => {
        None
    };
    ($( ($Var:ident $module:ident [$($field:ident)*] $device:ident) )*) => {
        /// Build the device stage for chain position `stage_index` from the
        /// per-row specs (`specs[row]`; rows whose spec is of another kind
        /// are no-op rows). `None` when the kind has no device recipe (its
        /// metadata's `device_hook` is false: typical, xtc, mirostat, dry,
        /// ...). Generated from the stage registry.
        pub fn build_device_stage(
            stage_index: usize,
            specs: &[StageSpec],
        ) -> Option<Box<dyn DeviceStage>> {
            match specs.iter().find(|s| !s.is_noop()).or(specs.first())?.kind() {
                $( StageKind::$Var => device_builder!(@one $device $Var $module stage_index specs), )*
            }
        }
    };
}
sampler_core::for_each_stage!(device_builder);
