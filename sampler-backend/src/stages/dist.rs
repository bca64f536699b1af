//! `dist` on the device: the same draw as the CPU oracle.
//!
//! `e_i = exp(l_i - max)`, `S = sum e_i`, `u = rng::uniform(seed, step,
//! lane(stage_index, 0))` computed on the host and uploaded as `[B, 1]`;
//! candidates are walked in ascending token-id order and the first with
//! `e_i > 0 && cum_i >= u * S` is chosen. No sort and no full-row cumsum:
//! * width `<= PAIRWISE_MAX` (after a `top_k`): `cum_i = sum_j e_j [id_j <= id_i]`
//!   from a pairwise `[B, N, N]` comparison (on a cubecl device, widths up to
//!   `kernels::TOP_K_MAX` run the same rule as one custom kernel);
//! * full rows: a two-level prefix sum over blocks of `DIST_BLOCK` tokens
//!   (block sums, a short cumsum over blocks, then a short cumsum inside
//!   the crossing block). Wide rows with `ids` are first scattered back to
//!   vocabulary order. On a cubecl device the step's fusion rules run a
//!   kernel instead: narrow rows `kernels::dist`, rows of the whole
//!   vocabulary `kernels::cut_dist_full` (the same rule with fixed-point
//!   weights, two reads of the row), with a full-row `top_p` / `min_p` /
//!   `temperature` before it applied inside it.
//!
//! Sums run in f32 in a different order than the CPU's sequential walk: a
//! token can differ only when `u * S` lies within rounding of a cumulative
//! boundary; the equivalence tests detect and report
//! such draws.

use burn_tensor::{Int, Tensor};
use sampler_core::{StageSpec, rng};

use sampler_core::DeviceRefusal;

use crate::ops::{self, DIST_BLOCK, PAIRWISE_MAX, wide};
use crate::readback::CODE_ALL_MASKED;
use crate::stage::{DeviceStage, Fusable, InitContext, RowState, StepData};

/// Device `dist` (contract-7 uniforms, canonical ascending-id order).
#[derive(Debug)]
pub struct Dist {
    stage_index: usize,
    uniforms: Option<Tensor<2>>,
    device: Option<burn_tensor::Device>,
}

impl Dist {
    /// `stage_index`: this stage's position in the chain (its RNG lane).
    pub fn new(stage_index: usize, _specs: &[StageSpec]) -> Self {
        Self {
            stage_index,
            uniforms: None,
            device: None,
        }
    }
}

impl DeviceStage for Dist {
    fn name(&self) -> &'static str {
        "dist"
    }
    fn init(&mut self, ctx: &InitContext) -> Result<(), DeviceRefusal> {
        self.device = Some(ctx.device.clone());
        Ok(())
    }
    fn set_input(&mut self, rows: &[RowState]) {
        let Some(device) = &self.device else { return };
        let lane = rng::lane(self.stage_index, 0);
        let u: Vec<f32> = rows
            .iter()
            .map(|r| rng::uniform(r.seed, r.step, lane) as f32)
            .collect();
        self.uniforms = Some(ops::col_f32(&u, device));
    }
    fn fusable(&self) -> Fusable<'_> {
        match &self.uniforms {
            Some(u) => Fusable::Dist { u },
            None => Fusable::Alone,
        }
    }
    fn apply(&self, data: &mut StepData) {
        let Some(u) = &self.uniforms else { return };
        let tok = if data.width <= PAIRWISE_MAX {
            let ids = data.token_ids();
            pairwise(&data.logits, &ids, u)
        } else if let Some(ids) = &data.ids {
            // Back to vocabulary order: scatter the weights at their ids.
            let (e, _) = ops::exps(&data.logits);
            let full = Tensor::<2>::zeros([data.batch, data.vocab], &data.device).scatter(
                1,
                ids.clone(),
                e,
                burn_tensor::IndexingUpdateOp::Add,
            );
            blocked(full, u)
        } else {
            let (e, _) = ops::exps(&data.logits);
            blocked(e, u)
        };
        data.sampled = Some(tok.reshape([data.batch]));
    }
}

/// Exact id-ordered cumulative sums by pairwise comparison; `[B, 1]` token ids.
fn pairwise(logits: &Tensor<2>, ids: &Tensor<2, Int>, u: &Tensor<2>) -> Tensor<2, Int> {
    let [b, n] = logits.dims();
    let (e, _) = ops::exps(logits);
    let ii = ids.clone().reshape([b, n, 1]).expand([b, n, n]);
    let ij = ids.clone().reshape([b, 1, n]).expand([b, n, n]);
    let le = ij.lower_equal(ii);
    let w = e.clone().reshape([b, 1, n]).expand([b, n, n]);
    let cum = w.mask_fill(le.bool_not(), 0.0).sum_dim(2).reshape([b, n]);
    let s = e.clone().sum_dim(1);
    let target = u.clone().mul(s.clone());
    let pos = e.clone().greater_elem(0.0);
    let hit = pos.clone().bool_and(cum.greater_equal(wide(target, n)));
    let none = i32::MAX as i64;
    let first = ops::min_where_int(ids.clone(), hit, none);
    // Rounding fallback: the last positive candidate in id order.
    let last = ops::max_where_int(ids.clone(), pos, CODE_ALL_MASKED);
    let tok = first.clone().mask_where(first.equal_elem(none), last);
    tok.mask_fill(s.equal_elem(0.0), CODE_ALL_MASKED)
}

/// Two-level prefix sum over a vocabulary-ordered weight row `e` `[B, V]`.
fn blocked(e: Tensor<2>, u: &Tensor<2>) -> Tensor<2, Int> {
    let [b, v] = e.dims();
    let device = e.device();
    let bs = DIST_BLOCK;
    let nb = v.div_ceil(bs);
    let padded = if nb * bs == v {
        e
    } else {
        Tensor::cat(vec![e, Tensor::<2>::zeros([b, nb * bs - v], &device)], 1)
    };
    let eb = padded.reshape([b, nb, bs]);
    let bsum = eb.clone().sum_dim(2).reshape([b, nb]);
    let cb = bsum.clone().cumsum(1);
    let s = cb.clone().slice([0..b, nb - 1..nb]);
    let target = u.clone().mul(s.clone());
    let blocks = ops::positions(b, nb, &device);
    let hit = cb
        .clone()
        .greater_equal(wide(target.clone(), nb))
        .bool_and(bsum.clone().greater_elem(0.0));
    let nonempty = bsum.clone().greater_elem(0.0);
    let first = ops::min_where_int(blocks.clone(), hit, nb as i64);
    let last = ops::max_where_int(blocks, nonempty, 0);
    let bi = first.clone().mask_where(first.equal_elem(nb as i64), last);
    let prefix = cb.gather(1, bi.clone()).sub(bsum.gather(1, bi.clone()));
    let idx = bi.clone().reshape([b, 1, 1]).expand([b, 1, bs]);
    let inblock = eb.gather(1, idx).reshape([b, bs]);
    let cin = inblock.clone().cumsum(1).add(wide(prefix, bs));
    let pos = inblock.greater_elem(0.0);
    let j = ops::positions(b, bs, &device);
    let jhit = pos.clone().bool_and(cin.greater_equal(wide(target, bs)));
    let jfirst = ops::min_where_int(j.clone(), jhit, bs as i64);
    let jlast = ops::max_where_int(j, pos, 0);
    let jj = jfirst
        .clone()
        .mask_where(jfirst.equal_elem(bs as i64), jlast);
    let tok = bi.mul_scalar(bs as i64).add(jj);
    tok.mask_fill(s.equal_elem(0.0), CODE_ALL_MASKED)
}
