//! Logprobs computed on the device (vLLM's `logprobs` / `logprob_token_ids`
//! semantics, as sampler-core's [`sampler_core::LogprobsSpec`]): `raw`
//! logprobs from the input row whenever the device runs a prefix, and
//! `processed` ones from the candidates entering a device selecting stage;
//! the top `n` entries in canonical order and the requested ids, `[B, L]`
//! ids and values per group, decoded per row after the readback.

use burn_tensor::{Device, Int, IntDType, Tensor};
use sampler_core::{Logprobs, LogprobsMode, TokenId};

use crate::ops::{self, wide};
use crate::stage::StepData;
use crate::step::Out;

/// Logprobs a device computed for one row, decoded from the readback.
pub(crate) struct DeviceRowLp {
    /// Top entries, canonical order (logit descending, ties to the lowest
    /// id), finite logprobs only.
    top: Vec<(TokenId, f32)>,
    /// Requested ids' values, in the order asked.
    requested: Vec<f32>,
    /// The sampled token's value (a fully offloaded chain).
    sampled: Option<f32>,
    /// `raw` logprobs of the read-back candidates `(id, logprob)` (a
    /// candidates readback): the host's token is looked up there.
    cand: Option<Vec<(i64, f32)>>,
}

impl DeviceRowLp {
    /// From one row's entries: `n` top, `m` requested, then (when present)
    /// the sampled token's.
    pub(crate) fn decode(
        ids: &[i64],
        vals: &[f32],
        n: usize,
        m: usize,
        vocab: usize,
        cand: Option<Vec<(i64, f32)>>,
    ) -> Self {
        // In the device's (canonical) order: by logit, ties to the lowest id.
        let top: Vec<(TokenId, f32)> = ids[..n]
            .iter()
            .zip(&vals[..n])
            .filter(|&(&i, &l)| i >= 0 && (i as u64) < vocab as u64 && l.is_finite())
            .map(|(&i, &l)| (i as TokenId, l))
            .collect();
        Self {
            top,
            requested: vals[n..n + m].to_vec(),
            sampled: vals.get(n + m).copied(),
            cand,
        }
    }

    pub(crate) fn into_logprobs(
        self,
        spec: &sampler_core::LogprobsSpec,
        token: TokenId,
    ) -> Logprobs {
        let value = match (&self.sampled, &self.cand) {
            (Some(v), _) => *v,
            (None, Some(c)) => c
                .iter()
                .find(|(i, _)| *i == token as i64)
                .map_or(f32::NEG_INFINITY, |p| p.1),
            (None, None) => f32::NEG_INFINITY,
        };
        Logprobs {
            token: (token, value),
            top: self.top,
            requested: spec.token_ids.iter().copied().zip(self.requested).collect(),
        }
    }
}

/// What a group's device computes for logprobs.
pub(crate) struct DeviceLogprobs {
    pub(crate) mode: LogprobsMode,
    /// Top entries per row.
    pub(crate) n: usize,
    /// The step rows' requested ids `[B, m]` (`None` when `m == 0`).
    pub(crate) ids: Option<Tensor<2, Int>>,
}

/// `(l - max) - ln S` per row `[B, N]`, `S = sum exp(l - max)` (`-inf`
/// stays `-inf`). The sum runs
/// in blocks of [`ops::DIST_BLOCK`] so that its rounding does not grow with
/// the vocabulary.
pub(crate) fn log_softmax(l: &Tensor<2>) -> Tensor<2> {
    let [b, n] = l.dims();
    let (e, m) = ops::exps(l);
    let s = if n > ops::DIST_BLOCK && n % ops::DIST_BLOCK == 0 {
        e.reshape([b, n / ops::DIST_BLOCK, ops::DIST_BLOCK])
            .sum_dim(2)
            .reshape([b, n / ops::DIST_BLOCK])
            .sum_dim(1)
    } else if n > ops::DIST_BLOCK {
        let full = n / ops::DIST_BLOCK * ops::DIST_BLOCK;
        let head = e
            .clone()
            .slice([0..b, 0..full])
            .reshape([b, full / ops::DIST_BLOCK, ops::DIST_BLOCK])
            .sum_dim(2)
            .reshape([b, full / ops::DIST_BLOCK])
            .sum_dim(1);
        head.add(e.slice([0..b, full..n]).sum_dim(1))
    } else {
        e.sum_dim(1)
    };
    // `(l - max) - ln S`, not `l - (max + ln S)`: at large magnitudes
    // `max + ln S` rounds `ln S` away (two `f32::MAX` logits would both get
    // 0); this form is the CPU's, to the last bit of each subtraction.
    l.clone().sub(wide(m, n)).sub(wide(s.log(), n))
}

/// The positions `[B, k]` (`k = min(n, N)`) of the canonical top `n` by
/// `logits` `[B, N]`, in the canonical order (logit descending, ties to the
/// lowest `order` id; ranked by the logits, as the CPU does, not by their
/// rounded logprobs). Every row takes `k`, so every position is a
/// candidate (no padding inside `k`).
pub(crate) fn top_positions(
    logits: &Tensor<2>,
    order: &Tensor<2, Int>,
    n: usize,
    d: &Device,
) -> Tensor<2, Int> {
    let [b, w] = logits.dims();
    let k = n.min(w);
    let n_row = ops::col_int(&vec![k as i64; b], d);
    let (_, pos, _) = ops::canonical_topk_positions(logits, order, &n_row, k);
    // burn's `topk` leaves equal logits in any order: rank the `k` chosen
    // (pairwise, `k <= 20`) and put each at its rank.
    let chosen = logits.clone().gather(1, pos.clone());
    let (rank, _) = ops::rank_and_mass_before(
        &chosen,
        &order.clone().gather(1, pos.clone()),
        &chosen.zeros_like(),
    );
    Tensor::<2, Int>::zeros([b, k], d).scatter(1, rank, pos, burn_tensor::IndexingUpdateOp::Add)
}

/// `(ids, values)` `[B, k]` padded to `[B, n]` with id `-1` / `-inf`.
pub(crate) fn pad_entries(
    ids: Tensor<2, Int>,
    vals: Tensor<2>,
    n: usize,
    d: &Device,
) -> (Tensor<2, Int>, Tensor<2>) {
    let [b, k] = ids.dims();
    if k == n {
        return (ids, vals);
    }
    let pad_i = Tensor::<2, Int>::zeros([b, n - k], d).sub_scalar(1);
    let pad_f = Tensor::<2>::full([b, n - k], f32::NEG_INFINITY, d);
    (
        Tensor::cat(vec![ids, pad_i], 1),
        Tensor::cat(vec![vals, pad_f], 1),
    )
}

/// The top `n` entries ([`top_positions`]) with their values in `lp`:
/// `(ids, values)` `[B, n]` (ids through `gather_ids` when positions are
/// not token ids), padded past the width.
pub(crate) fn lp_top(
    logits: &Tensor<2>,
    lp: &Tensor<2>,
    order: &Tensor<2, Int>,
    gather_ids: Option<&Tensor<2, Int>>,
    n: usize,
    d: &Device,
) -> (Tensor<2, Int>, Tensor<2>) {
    let pos = top_positions(logits, order, n, d);
    let vals = lp.clone().gather(1, pos.clone());
    let ids = match gather_ids {
        Some(g) => g.clone().gather(1, pos),
        None => pos,
    };
    pad_entries(ids, vals, n, d)
}

/// Logprobs of a full row `lp` `[B, V]` (position = token id; raw, or
/// processed where no stage narrowed the row): the top `n` entries and the
/// requested ids `want` `[B, m]`, in **one** gather. Two gathers of one
/// source whose index widths differ read the narrower one's values at the
/// wrong positions on wgpu (burn-fusion 0.22: token 0's logprob in the top
/// entry; `tests/tests/device_ops.rs` pins the one-gather form).
pub(crate) fn full_row_entries(
    logits: &Tensor<2>,
    lp: &Tensor<2>,
    pos: &Tensor<2, Int>,
    n: usize,
    want: Option<&Tensor<2, Int>>,
    d: &Device,
) -> Vec<(Tensor<2, Int>, Tensor<2>)> {
    let top = (n > 0).then(|| top_positions(logits, pos, n, d));
    let k = top.as_ref().map_or(0, |p| p.dims()[1]);
    let index: Vec<Tensor<2, Int>> = top.iter().cloned().chain(want.cloned()).collect();
    if index.is_empty() {
        return Vec::new();
    }
    let vals = lp.clone().gather(1, Tensor::cat(index, 1));
    let [b, width] = vals.dims();
    let mut out = Vec::with_capacity(2);
    if let Some(p) = top {
        out.push(pad_entries(p, vals.clone().slice([0..b, 0..k]), n, d));
    }
    if let Some(w) = want {
        out.push((w.clone(), vals.slice([0..b, k..width])));
    }
    out
}

/// Values of `lp` `[B, N]` at the tokens `want` `[B, m]`, where position
/// `j` of row `b` holds token `order[b, j]`;
/// `-inf` where a token is absent. Small `m · N`: one `[B, m, N]`
/// comparison; larger: the row scattered back to the vocabulary through
/// `gather_ids` (in-vocabulary ids; padding positions, whose `order` id is
/// `>= vocab`, contribute nothing), then a gather.
pub(crate) fn lp_at(
    lp: &Tensor<2>,
    order: &Tensor<2, Int>,
    gather_ids: Option<&Tensor<2, Int>>,
    want: &Tensor<2, Int>,
    vocab: usize,
) -> Tensor<2> {
    /// `[B, m, N]` comparisons up to this many per row.
    const COMPARE_MAX: usize = 1 << 16;
    let [b, w] = lp.dims();
    let [_, m] = want.dims();
    match gather_ids {
        Some(ids) if m * w > COMPARE_MAX => {
            let d = lp.device();
            let pad = order.clone().greater_equal_elem(vocab as i64);
            let vals = lp.clone().mask_fill(pad.clone(), 0.0);
            let ones = Tensor::<2>::ones([b, w], &d).mask_fill(pad, 0.0);
            let op = burn_tensor::IndexingUpdateOp::Add;
            let full = Tensor::<2>::zeros([b, vocab], &d).scatter(1, ids.clone(), vals, op);
            let present = Tensor::<2>::zeros([b, vocab], &d)
                .scatter(1, ids.clone(), ones, op)
                .greater_elem(0.5);
            full.mask_fill(present.bool_not(), f32::NEG_INFINITY)
                .gather(1, want.clone())
        }
        _ => {
            let eq = order
                .clone()
                .reshape([b, 1, w])
                .expand([b, m, w])
                .equal(want.clone().reshape([b, m, 1]).expand([b, m, w]));
            lp.clone()
                .reshape([b, 1, w])
                .expand([b, m, w])
                .mask_fill(eq.bool_not(), f32::NEG_INFINITY)
                .max_dim(2)
                .reshape([b, m])
        }
    }
}

/// The candidates a device selecting stage sees.
struct Selection {
    /// Logits `[B, N]`.
    logits: Tensor<2>,
    /// Their order ids `[B, N]` (`None`: positions are token ids).
    order: Option<Tensor<2, Int>>,
    /// Their token ids to gather with (`None`: positions are token ids).
    gather: Option<Tensor<2, Int>>,
}

/// One group's device logprobs along its device pass: entries `[B, L]`
/// (ids and values) gathered as the pass goes, registered with the
/// readback at its end.
pub(crate) struct LogprobPass {
    spec: DeviceLogprobs,
    /// Raw logprobs of the input rows `[B, V]` (mode `raw`).
    raw: Option<Tensor<2>>,
    /// The candidates entering the device's selecting stage (mode
    /// `processed`, a fully offloaded chain).
    before_select: Option<Selection>,
    entries: Vec<(Tensor<2, Int>, Tensor<2>)>,
    /// Raw logprobs of the read-back candidates `[B, K]`.
    raw_cands: Option<Tensor<2>>,
}

impl LogprobPass {
    /// Start on the step's input rows `clean` `[B, V]` (sanitised; invalid
    /// rows fail anyway); `pos`: positions `[B, V]`. Raw logprobs come from
    /// here.
    pub(crate) fn start(spec: DeviceLogprobs, clean: &Tensor<2>, pos: &Tensor<2, Int>) -> Self {
        let d = clean.device();
        let raw = (spec.mode == LogprobsMode::Raw).then(|| log_softmax(clean));
        let mut entries = Vec::new();
        if let Some(raw) = &raw {
            entries.extend(full_row_entries(
                clean,
                raw,
                pos,
                spec.n,
                spec.ids.as_ref(),
                &d,
            ));
        }
        Self {
            spec,
            raw,
            before_select: None,
            entries,
            raw_cands: None,
        }
    }

    /// Whether the pass looks at the candidates entering the last device
    /// stage (processed logprobs of a chain the device runs whole).
    pub(crate) fn wants_selection(&self, fully_offloaded: bool) -> bool {
        self.spec.mode == LogprobsMode::Processed && fully_offloaded
    }

    /// The candidates the selecting stage sees (every pending cut applied).
    pub(crate) fn see_selection(&mut self, data: &StepData) {
        let order = data.order_ids.clone().or(data.ids.clone());
        self.before_select = Some(Selection {
            logits: data.logits.clone(),
            order,
            gather: data.ids.clone(),
        });
    }

    /// After the device stages: the processed entries.
    pub(crate) fn after_stages(&mut self, pos: &Tensor<2, Int>, vocab: usize) {
        let Some(Selection {
            logits: cl,
            order,
            gather: gids,
        }) = &self.before_select
        else {
            return;
        };
        let (n, want, d) = (self.spec.n, self.spec.ids.as_ref(), cl.device());
        let plp = log_softmax(cl);
        match order {
            // A full row (positions are token ids): as for raw logprobs.
            None => self
                .entries
                .extend(full_row_entries(cl, &plp, pos, n, want, &d)),
            Some(order) => {
                if n > 0 {
                    self.entries
                        .push(lp_top(cl, &plp, order, gids.as_ref(), n, &d));
                }
                if let Some(want) = want {
                    let vals = lp_at(&plp, order, gids.as_ref(), want, vocab);
                    self.entries.push((want.clone(), vals));
                }
            }
        }
    }

    /// The sampled token's entry (`sampled` `[B]`, `-1` on failed rows).
    pub(crate) fn sampled(&mut self, sampled: &Tensor<1, Int>, pos: &Tensor<2, Int>, vocab: usize) {
        let b = sampled.dims()[0];
        let d = sampled.device();
        // The token's value by comparison: a gather at the token the device
        // just drew returned another token's value on wgpu (lavapipe,
        // `dist`'s block path); a failed row (-1) matches nothing.
        let at = sampled.clone().reshape([b, 1]);
        let value = match (&self.raw, &self.before_select) {
            (Some(raw), _) => lp_at(raw, pos, None, &at, vocab),
            (
                None,
                Some(Selection {
                    logits: cl, order, ..
                }),
            ) => {
                let w = cl.dims()[1];
                let ord = order
                    .clone()
                    .unwrap_or_else(|| pos.clone().slice([0..b, 0..w]));
                lp_at(&log_softmax(cl), &ord, None, &at, vocab)
            }
            (None, None) => Tensor::<2>::full([b, 1], f32::NEG_INFINITY, &d),
        };
        self.entries.push((at, value));
    }

    /// The read-back candidates' raw logprobs (`ids` `[B, K]`).
    pub(crate) fn candidates(&mut self, ids: &Tensor<2, Int>) {
        if let Some(raw) = &self.raw {
            self.raw_cands = Some(raw.clone().gather(1, ids.clone()));
        }
    }

    /// What the readback registers: `[B·L]` ids (i32) and `[B, L]` values,
    /// then the candidates' raw logprobs.
    pub(crate) fn outputs(self) -> Vec<Out> {
        let mut out = Vec::with_capacity(3);
        let (ids, vals): (Vec<_>, Vec<_>) = self.entries.into_iter().unzip();
        if !ids.is_empty() {
            let ids = Tensor::cat(ids, 1);
            let [b, e] = ids.dims();
            out.push(Out::I(ids.cast(IntDType::I32).reshape([b * e])));
            out.push(Out::F(Tensor::cat(vals, 1)));
        }
        if let Some(c) = self.raw_cands {
            out.push(Out::F(c));
        }
        out
    }
}
