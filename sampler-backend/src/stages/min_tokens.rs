//! `min_tokens` on the device: a per-slot `[S, V]` table marks the stop ids
//! (uploaded once, in `init`); the host counts each slot's generated tokens
//! and, before each step, uploads a `[S, 1]` column saying which slots are
//! still below `n`. `apply` bans the marked tokens of those slots, looked up
//! through `ids` after a device `top_k`.

use burn_tensor::{Device, Int, Tensor, TensorData};
use sampler_core::{DeviceRefusal, StageSpec, TokenId, TokenOrigin};

use crate::ops::{self, wide};
use crate::stage::{DeviceStage, InitContext, RowState, StepData};

/// Device `min_tokens` with per-slot `n` and stop ids.
#[derive(Debug)]
pub struct MinTokens {
    /// Per slot: `n`, stop ids, tokens generated so far.
    slots: Vec<(usize, Vec<TokenId>, usize)>,
    device: Option<Device>,
    table: Option<Tensor<2, Int>>,
    active: Option<Tensor<2, Int>>,
}

impl MinTokens {
    /// From the per-slot specs (`StageSpec::MinTokens`; other kinds are no-op slots).
    pub fn new(_stage_index: usize, specs: &[StageSpec]) -> Self {
        let slots = specs
            .iter()
            .map(|s| match s {
                StageSpec::MinTokens { n, stop } => (*n, stop.clone(), 0),
                _ => (0, Vec::new(), 0),
            })
            .collect();
        Self {
            slots,
            device: None,
            table: None,
            active: None,
        }
    }
}

impl DeviceStage for MinTokens {
    fn name(&self) -> &'static str {
        "min_tokens"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        let (b, v) = (ctx.batch, ctx.vocab);
        const LIMIT: usize = 1 << 26;
        let Some(len) = b.checked_mul(v).filter(|&n| n <= LIMIT) else {
            return Err(DeviceRefusal::TooLarge {
                entries: (b as u64).saturating_mul(v as u64),
                limit: LIMIT as u64,
            });
        };
        // An out-of-vocabulary stop id is the row's error on the CPU.
        for (row, (_, stop, _)) in self.slots.iter().enumerate() {
            if let Some(&token) = stop.iter().find(|&&t| t as usize >= v) {
                return Err(DeviceRefusal::TokenOutOfVocab {
                    row,
                    token,
                    vocab: v,
                });
            }
        }
        let mut table = vec![0i32; len];
        for (r, (_, stop, _)) in self.slots.iter().enumerate().take(b) {
            for &t in stop {
                table[r * v + t as usize] = 1;
            }
        }
        self.table = Some(Tensor::<2, Int>::from_data(
            TensorData::new(table, [b, v]),
            &ctx.device,
        ));
        self.device = Some(ctx.device.clone());
        Ok(())
    }
    fn set_input(&mut self, _rows: &[RowState]) {
        let Some(d) = &self.device else { return };
        let active: Vec<i64> = self
            .slots
            .iter()
            .map(|(n, _, generated)| i64::from(generated < n))
            .collect();
        self.active = Some(ops::col_int(&active, d));
    }
    fn apply(&self, data: &mut StepData) {
        let (Some(table), Some(active)) = (&self.table, &self.active) else {
            return;
        };
        let table = data.per_row(table);
        let marked = match &data.ids {
            Some(ids) => table.gather(1, ids.clone()),
            None => table,
        };
        let ban = marked
            .mul(wide(data.per_row(active), data.width))
            .equal_elem(1);
        data.logits = data.logits.clone().mask_fill(ban, f32::NEG_INFINITY);
        data.probs = None;
    }
    fn accept(&mut self, tokens: &[Option<TokenId>]) {
        for (slot, t) in self.slots.iter_mut().zip(tokens) {
            if t.is_some() {
                slot.2 += 1;
            }
        }
    }
    fn restore(&mut self, slot: usize, history: &[(TokenId, TokenOrigin)]) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.2 = history
                .iter()
                .filter(|(_, o)| *o == TokenOrigin::Output)
                .count();
        }
    }
    fn reset(&mut self) {
        for s in &mut self.slots {
            s.2 = 0;
        }
    }
}
