//! Repetition / frequency / presence penalties on the device.
//!
//! Per-row token counts `[B, V]` live on the device. The host keeps each
//! row's window (the last `last_n` in-scope tokens, the explicit
//! history scope) and turns every change into count deltas (+1 for a token
//! entering the window, -1 for one leaving it), applied by one scatter-add
//! in `accept` (generated tokens) or `set_input` (prompt tokens). `apply`:
//! for a candidate with count `c > 0`, `l <= 0 ? l * repeat : l / repeat`,
//! then `l -= c * frequency + presence` (llama.cpp; transformers #2302 for
//! the sign rule). Counts are looked up through `ids` after a device `top_k`.

use std::collections::VecDeque;

use burn_tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};
use sampler_core::{HistoryScope, StageSpec, TokenId, TokenOrigin};

use crate::ops::{self, wide};
use sampler_core::DeviceRefusal;

use crate::stage::{DeviceStage, InitContext, RowState, StepData};

#[derive(Debug, Clone)]
struct Row {
    last_n: usize,
    repeat: f32,
    frequency: f32,
    presence: f32,
    scope: HistoryScope,
    window: VecDeque<TokenId>,
    pending: Vec<(TokenId, f32)>,
}

/// Device penalties with per-row parameters and device-resident counts.
#[derive(Debug)]
pub struct Penalties {
    rows: Vec<Row>,
    vocab: usize,
    device: Option<Device>,
    counts: Option<Tensor<2>>,
    repeat: Option<Tensor<2>>,
    frequency: Option<Tensor<2>>,
    presence: Option<Tensor<2>>,
}

impl Penalties {
    /// From the per-row specs (`StageSpec::Penalties`). No-op rows get neutral parameters.
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let rows = specs
            .iter()
            .map(|s| match s {
                StageSpec::Penalties {
                    last_n,
                    repeat,
                    frequency,
                    presence,
                    scope,
                } if !s.is_noop() => Row {
                    last_n: *last_n,
                    repeat: *repeat,
                    frequency: *frequency,
                    presence: *presence,
                    scope: *scope,
                    window: VecDeque::new(),
                    pending: Vec::new(),
                },
                _ => Row {
                    last_n: 0,
                    repeat: 1.0,
                    frequency: 0.0,
                    presence: 0.0,
                    scope: HistoryScope::Output,
                    window: VecDeque::new(),
                    pending: Vec::new(),
                },
            })
            .collect();
        Self {
            rows,
            vocab: 0,
            device: None,
            counts: None,
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
            row.pending.push((token, 1.0));
        }
        while row.window.len() > row.last_n {
            if let Some(old) = row.window.pop_front()
                && (old as usize) < vocab
            {
                row.pending.push((old, -1.0));
            }
        }
    }

    /// Apply every pending delta with one scatter-add.
    fn flush(&mut self) {
        let (Some(device), Some(_)) = (&self.device, &self.counts) else {
            return;
        };
        let m = self.rows.iter().map(|r| r.pending.len()).max().unwrap_or(0);
        if m == 0 {
            return;
        }
        let b = self.rows.len();
        let mut ids = vec![0i32; b * m];
        let mut vals = vec![0f32; b * m];
        for (r, row) in self.rows.iter_mut().enumerate() {
            for (j, (t, d)) in row.pending.drain(..).enumerate() {
                ids[r * m + j] = t as i32;
                vals[r * m + j] = d;
            }
        }
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, m]), device);
        let vals = Tensor::<2>::from_data(TensorData::new(vals, [b, m]), device);
        // The table is moved into the scatter, not cloned: when no earlier
        // step still holds it, the cubecl backends add into it in place
        // instead of copying the whole [B, V] table every step.
        self.counts = self
            .counts
            .take()
            .map(|counts| counts.scatter(1, ids, vals, IndexingUpdateOp::Add));
    }
}

impl DeviceStage for Penalties {
    fn name(&self) -> &'static str {
        "penalties"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        // The count table is a dense f32 [batch, vocab]: up to 2^28 entries
        // (1 GiB); larger shapes keep the stage on the host.
        const LIMIT: u64 = 1 << 28;
        let entries = (ctx.batch as u64).saturating_mul(ctx.vocab as u64);
        if entries > LIMIT {
            return Err(DeviceRefusal::TooLarge {
                entries,
                limit: LIMIT,
            });
        }
        let d = &ctx.device;
        self.vocab = ctx.vocab;
        self.device = Some(d.clone());
        self.counts = Some(Tensor::<2>::zeros([ctx.batch, ctx.vocab], d));
        let col = |f: fn(&Row) -> f32| -> Vec<f32> { self.rows.iter().map(f).collect() };
        self.repeat = Some(ops::col_f32(&col(|r| r.repeat), d));
        self.frequency = Some(ops::col_f32(&col(|r| r.frequency), d));
        self.presence = Some(ops::col_f32(&col(|r| r.presence), d));
        // Re-upload any history recorded before init.
        let vocab = self.vocab;
        for row in &mut self.rows {
            row.pending = row.window.iter().map(|&t| (t, 1.0)).collect();
            row.pending.retain(|&(t, _)| (t as usize) < vocab);
        }
        Ok(())
    }
    fn set_input(&mut self, _rows: &[RowState]) {
        self.flush();
    }
    fn apply(&self, data: &mut StepData) {
        let (Some(counts), Some(r), Some(f), Some(p)) =
            (&self.counts, &self.repeat, &self.frequency, &self.presence)
        else {
            return;
        };
        let (counts, r, f, p) = (
            &data.per_row(counts),
            &data.per_row(r),
            &data.per_row(f),
            &data.per_row(p),
        );
        let n = data.width;
        let c = match &data.ids {
            Some(ids) => counts.clone().gather(1, ids.clone()),
            None => counts.clone(),
        };
        let l = data.logits.clone();
        let active = c.clone().greater_elem(0.0);
        let r = wide(r.clone(), n);
        let rep = l
            .clone()
            .div(r.clone())
            .mask_where(l.clone().lower_equal_elem(0.0), l.clone().mul(r));
        let l = l.mask_where(active.clone(), rep);
        let sub = c
            .mul(wide(f.clone(), n))
            .add(active.float().mul(wide(p.clone(), n)));
        let orig = data.logits.clone();
        data.logits = l
            .sub(sub)
            .clamp(-f32::MAX, f32::MAX)
            .mask_fill(orig.equal_elem(f32::NEG_INFINITY), f32::NEG_INFINITY);
        data.probs = None;
    }
    fn accept(&mut self, tokens: &[Option<TokenId>]) {
        let vocab = self.vocab;
        for (row, t) in self.rows.iter_mut().zip(tokens) {
            if let Some(t) = t {
                Self::push(row, *t, vocab);
            }
        }
        self.flush();
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
            row.pending.clear();
        }
        if let (Some(d), Some(c)) = (&self.device, &self.counts) {
            let [b, v] = c.dims();
            self.counts = Some(Tensor::<2>::zeros([b, v], d));
        }
    }
}
