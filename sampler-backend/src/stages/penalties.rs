//! Repetition / frequency / presence penalties on the device.
//!
//! The host keeps each row's window (the last `last_n` in-scope tokens, the
//! explicit history scope) and its distinct tokens with their counts. Each
//! step uploads them as `[S, H]` ids and counts (`H`: the most distinct
//! tokens of any row; a row's padding has count 0 at a token outside its
//! window), a few bytes per history token instead of a `[S, V]` count
//! table. The step's fusion rules hand them on ([`Fusable::Penalties`]) to
//! the stage after it: a device `top_k` kernel applies them inside its
//! selection (no `[B, V]` pass or copy); any other stage first gets the
//! logits penalised by its recipe (a gather, the rule on `[B, H]`, and a
//! scatter back). The rule, for a token with count
//! `c > 0`: `l <= 0 ? l * repeat : l / repeat`, then `l -= c * frequency +
//! presence`, saturated at `±f32::MAX`, `-inf` kept (llama.cpp;
//! transformers #2302 for the sign rule).

use std::collections::{BTreeMap, VecDeque};

use burn_tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};
use sampler_core::{HistoryScope, StageSpec, TokenId, TokenOrigin};

use sampler_core::DeviceRefusal;

use crate::ops::{self, wide};
use crate::stage::{DeviceStage, Fusable, HistoryPenalties, InitContext, RowState, StepData};

#[derive(Debug, Clone)]
struct Row {
    last_n: usize,
    repeat: f32,
    frequency: f32,
    presence: f32,
    scope: HistoryScope,
    window: VecDeque<TokenId>,
    /// Occurrences in the window of each in-vocabulary token.
    counts: BTreeMap<TokenId, u32>,
}

/// Device penalties with per-row parameters; the history travels as
/// `[S, H]` ids and counts each step.
#[derive(Debug)]
pub struct Penalties {
    rows: Vec<Row>,
    vocab: usize,
    device: Option<Device>,
    /// The history uploaded for this step with the parameters, per slot.
    uploaded: Option<HistoryPenalties>,
    repeat: Option<Tensor<2>>,
    frequency: Option<Tensor<2>>,
    presence: Option<Tensor<2>>,
}

impl Penalties {
    /// From the per-row specs (`StageSpec::Penalties`). No-op rows get neutral parameters.
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let row = |last_n, repeat, frequency, presence, scope| Row {
            last_n,
            repeat,
            frequency,
            presence,
            scope,
            window: VecDeque::new(),
            counts: BTreeMap::new(),
        };
        let rows = specs
            .iter()
            .map(|s| match s {
                StageSpec::Penalties {
                    last_n,
                    repeat,
                    frequency,
                    presence,
                    scope,
                } if !s.is_noop() => row(*last_n, *repeat, *frequency, *presence, *scope),
                _ => row(0, 1.0, 0.0, 0.0, HistoryScope::Output),
            })
            .collect();
        Self {
            rows,
            vocab: 0,
            device: None,
            uploaded: None,
            repeat: None,
            frequency: None,
            presence: None,
        }
    }

    fn push(row: &mut Row, token: TokenId, vocab: usize) {
        if row.last_n == 0 {
            return;
        }
        // Out-of-vocabulary tokens occupy the window (as on the CPU) but
        // never reach the device.
        row.window.push_back(token);
        if (token as usize) < vocab {
            *row.counts.entry(token).or_insert(0) += 1;
        }
        while row.window.len() > row.last_n {
            if let Some(old) = row.window.pop_front()
                && let Some(c) = row.counts.get_mut(&old)
            {
                *c -= 1;
                if *c == 0 {
                    row.counts.remove(&old);
                }
            }
        }
    }

    /// Recount every row's window (after `init` changed the vocabulary).
    fn recount(&mut self) {
        let vocab = self.vocab;
        for row in &mut self.rows {
            row.counts.clear();
            for &t in &row.window {
                if (t as usize) < vocab {
                    *row.counts.entry(t).or_insert(0) += 1;
                }
            }
        }
    }

    /// Upload the windows as `[S, H]` ids and counts (`H >= 1`); a row's
    /// padding is count 0 at the lowest token outside its window, so a
    /// scatter of the penalised values never writes one position twice
    /// with different values.
    fn upload(&mut self) {
        let Some(device) = &self.device else { return };
        let h = self.rows.iter().map(|r| r.counts.len()).max().unwrap_or(0).max(1);
        let s = self.rows.len();
        let mut ids = vec![0i32; s * h];
        let mut counts = vec![0f32; s * h];
        for (r, row) in self.rows.iter().enumerate() {
            let mut j = 0;
            for (&t, &c) in &row.counts {
                ids[r * h + j] = t as i32;
                counts[r * h + j] = c as f32;
                j += 1;
            }
            if j < h {
                // Fewer distinct tokens than the vocabulary: one is free.
                let free = (0..self.vocab as TokenId)
                    .find(|t| !row.counts.contains_key(t))
                    .unwrap_or(0);
                for slot in j..h {
                    ids[r * h + slot] = free as i32;
                }
            }
        }
        let (Some(repeat), Some(frequency), Some(presence)) =
            (&self.repeat, &self.frequency, &self.presence)
        else {
            return;
        };
        self.uploaded = Some(HistoryPenalties {
            ids: Tensor::<2, Int>::from_data(TensorData::new(ids, [s, h]), device),
            counts: Tensor::<2>::from_data(TensorData::new(counts, [s, h]), device),
            repeat: repeat.clone(),
            frequency: frequency.clone(),
            presence: presence.clone(),
        });
    }
}

/// Penalise `data.logits` with history penalties `pen` (per step row):
/// the generic recipe, wherever no kernel applies them inside its
/// selection. Full rows: the logits at the history ids are gathered,
/// penalised (`[B, H]`) and scattered back; after a device `top_k`
/// (`ids [B, N]`) each candidate's count is looked up among the row's `H`
/// history ids.
pub(crate) fn penalise(data: &mut StepData, pen: &HistoryPenalties) {
    let rule = |l: Tensor<2>, c: Tensor<2>, n: usize| {
        let active = c.clone().greater_elem(0.0);
        let r = wide(pen.repeat.clone(), n);
        let rep = l
            .clone()
            .div(r.clone())
            .mask_where(l.clone().lower_equal_elem(0.0), l.clone().mul(r));
        let sub = c
            .mul(wide(pen.frequency.clone(), n))
            .add(active.clone().float().mul(wide(pen.presence.clone(), n)));
        let penalised = rep
            .sub(sub)
            .clamp(-f32::MAX, f32::MAX)
            .mask_fill(l.clone().equal_elem(f32::NEG_INFINITY), f32::NEG_INFINITY);
        l.mask_where(active, penalised)
    };
    let [b, h] = pen.ids.dims();
    data.logits = match &data.ids {
        None => {
            let at = data.logits.clone().gather(1, pen.ids.clone());
            let vals = rule(at, pen.counts.clone(), h);
            data.logits
                .clone()
                .scatter(1, pen.ids.clone(), vals, IndexingUpdateOp::Assign)
        }
        Some(ids) => {
            let n = data.width;
            let hit = ids
                .clone()
                .reshape([b, n, 1])
                .equal(pen.ids.clone().reshape([b, 1, h]));
            let c = hit
                .float()
                .mul(pen.counts.clone().reshape([b, 1, h]))
                .sum_dim(2)
                .reshape([b, n]);
            rule(data.logits.clone(), c, n)
        }
    };
}

impl DeviceStage for Penalties {
    fn name(&self) -> &'static str {
        "penalties"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let d = &ctx.device;
        self.vocab = ctx.vocab;
        self.device = Some(d.clone());
        let col = |f: fn(&Row) -> f32| -> Vec<f32> { self.rows.iter().map(f).collect() };
        self.repeat = Some(ops::col_f32(&col(|r| r.repeat), d));
        self.frequency = Some(ops::col_f32(&col(|r| r.frequency), d));
        self.presence = Some(ops::col_f32(&col(|r| r.presence), d));
        // History recorded before init, counted against this vocabulary.
        self.recount();
        self.uploaded = None;
        Ok(())
    }
    fn set_input(&mut self, _rows: &[RowState]) {
        self.upload();
    }
    fn fusable(&self) -> Fusable<'_> {
        Fusable::Penalties(self.uploaded.as_ref())
    }
    /// On its own (the fusion rules hand the penalties on instead): the
    /// recipe, now.
    fn apply(&self, data: &mut StepData) {
        if let Some(pen) = &self.uploaded {
            let per_row = pen.per_row(data);
            penalise(data, &per_row);
        }
    }
    fn accept(&mut self, tokens: &[Option<TokenId>]) {
        let vocab = self.vocab;
        for (row, t) in self.rows.iter_mut().zip(tokens) {
            if let Some(t) = t {
                Self::push(row, *t, vocab);
            }
        }
    }
    fn accept_prompt(&mut self, row: usize, tokens: &[TokenId]) {
        let vocab = self.vocab;
        if let Some(r) = self.rows.get_mut(row)
            && r.scope == HistoryScope::PromptAndOutput
        {
            for &t in tokens {
                Self::push(r, t, vocab);
            }
        }
    }
    fn restore(&mut self, slot: usize, history: &[(TokenId, TokenOrigin)]) {
        let vocab = self.vocab;
        let Some(r) = self.rows.get_mut(slot) else {
            return;
        };
        let scope = r.scope;
        let in_scope =
            |o: &TokenOrigin| *o == TokenOrigin::Output || scope == HistoryScope::PromptAndOutput;
        // Only the last `last_n` in-scope tokens can be in the window.
        let count = history.iter().filter(|(_, o)| in_scope(o)).count();
        let skip = count.saturating_sub(r.last_n);
        let tail: Vec<TokenId> = history
            .iter()
            .filter(|(_, o)| in_scope(o))
            .skip(skip)
            .map(|&(t, _)| t)
            .collect();
        for t in tail {
            Self::push(r, t, vocab);
        }
    }
    fn reset(&mut self) {
        for row in &mut self.rows {
            row.window.clear();
            row.counts.clear();
        }
        self.uploaded = None;
    }
}
