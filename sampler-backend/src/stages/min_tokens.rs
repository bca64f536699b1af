//! `min_tokens` on the device: the slots' stop ids as an `[S, L]` table
//! (`L`: the most stop ids of any slot, padded with `-1`; uploaded once, in
//! `init`); the host counts each slot's generated tokens and, before each
//! step, uploads an `[S, 1]` column saying which slots are still below `n`.
//! `apply` compares the row's tokens (`ids` after a device `top_k`) with the
//! slot's stop ids, `[B, N, L]`, and bans the matches of those slots.

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
        let l = self.slots.iter().map(|s| s.1.len()).max().unwrap_or(0).max(1);
        let mut table = vec![-1i32; b * l];
        for (r, (_, stop, _)) in self.slots.iter().enumerate().take(b) {
            for (j, &t) in stop.iter().enumerate() {
                table[r * l + j] = t as i32;
            }
        }
        self.table = Some(Tensor::<2, Int>::from_data(
            TensorData::new(table, [b, l]),
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
        let stops = data.per_row(table);
        let [b, l] = stops.dims();
        let n = data.width;
        let tok = match &data.ids {
            Some(ids) => ids.clone(),
            None => ops::positions(b, n, &data.device),
        };
        let hit = tok
            .reshape([b, n, 1])
            .expand([b, n, l])
            .equal(stops.reshape([b, 1, l]).expand([b, n, l]))
            .int()
            .sum_dim(2)
            .reshape([b, n]);
        let ban = hit
            .mul(wide(data.per_row(active), n))
            .greater_elem(0);
        data.logits = data.logits.clone().mask_fill(ban, f32::NEG_INFINITY);
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
