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
/// Stages see sanitised rows (invalid rows zeroed) unless the step's fusion
/// rules let a validating kernel take them as they are; what a step hands
/// on between stages (pending penalties, a pending cut, validation keys)
/// is the fusion rules' own state, not part of this value.
#[derive(Debug, Clone)]
pub struct StepData {
    /// Logits `[B, N]` (f32, natural-log units).
    pub logits: Tensor<2>,
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

/// Repetition / frequency / presence penalties of one step (the CPU
/// `penalties` rule), per step row: each row's distinct history tokens and
/// their counts in its window (`count 0` marks padding, at a token outside
/// the window). What a `penalties` stage hands the fusion rules; the
/// top-k kernel takes it ([`crate::kernels::top_k`]).
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

/// What a stage offers the step's fusion rules: its per-slot parameters
/// (`[S, 1]` tensors, read per step row through [`StepData::per_row`]) in
/// the form the fused and validating kernels take. The rules (which stage
/// sequences become which kernel, which kernel validates the rows and which
/// writes the status codes) live in one place, the step's fusion module;
/// a stage only says what it is. [`Fusable::Alone`]: the stage always runs
/// its own [`DeviceStage::apply`].
#[derive(Debug, Clone)]
pub enum Fusable<'a> {
    /// Runs alone (the default).
    Alone,
    /// `penalties`: each slot's history and parameters, `[S, H]` and
    /// `[S, 1]` ([`HistoryPenalties`] per slot; `None` before the history is
    /// uploaded). Handed on to the stage after it.
    Penalties(Option<&'a HistoryPenalties>),
    /// `top_k`: each slot's `k` `[S, 1]` (clamped to the width) and the
    /// width it narrows to.
    TopK {
        /// Per-slot `k` `[S, 1]`.
        k_row: &'a Tensor<2, Int>,
        /// The largest `k` (the width after the stage, before clamping).
        k_max: usize,
    },
    /// `top_p` or `min_p`: the per-slot column a full-row kernel takes
    /// `[S, 1]` ([`CutRule`]) and the largest `min_keep` (at least 1).
    Cut {
        /// Which cut.
        rule: CutRule,
        /// `p` (`+inf` on no-op slots) for `top_p`, `ln p` (`-inf` on
        /// no-op slots) for `min_p`.
        column: &'a Tensor<2>,
        /// The largest `min_keep`.
        keep_max: usize,
    },
    /// `temperature`: `t` `[S, 1]`, and whether any slot has a dynamic range
    /// (then it always runs alone).
    Temperature {
        /// Per-slot `t`.
        t: &'a Tensor<2>,
        /// Some slot has `dynatemp_range > 0`.
        dynamic: bool,
    },
    /// `dist`: this step's uniforms `[B, 1]` (per step row, contract 7).
    Dist {
        /// One uniform per step row.
        u: &'a Tensor<2>,
    },
    /// `greedy`.
    Greedy,
}

/// The rule of a [`Fusable::Cut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutRule {
    /// `top_p` (nucleus): the mass before a candidate in canonical order
    /// below `p`.
    TopP,
    /// `min_p`: `l >= max + ln p`.
    MinP,
}

impl HistoryPenalties {
    /// Per-slot penalties (`[S, H]`, `[S, 1]`) seen per step row
    /// ([`StepData::per_row`]).
    pub fn per_row(&self, data: &StepData) -> Self {
        Self {
            ids: data.per_row(&self.ids),
            counts: data.per_row(&self.counts),
            repeat: data.per_row(&self.repeat),
            frequency: data.per_row(&self.frequency),
            presence: data.per_row(&self.presence),
        }
    }
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
    /// Append this stage's tensor ops to the step: its generic burn-op
    /// recipe (and kernels that need nothing from the rest of the step).
    /// The fusion rules may run the stage's work inside a fused or
    /// validating kernel instead ([`DeviceStage::fusable`]).
    fn apply(&self, data: &mut StepData);
    /// What the step's fusion rules may take from this stage instead of
    /// calling `apply` ([`Fusable`]). Default: [`Fusable::Alone`].
    fn fusable(&self) -> Fusable<'_> {
        Fusable::Alone
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
        /// metadata's `device_hook` is false: xtc, top_n_sigma, mirostat, dry,
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
