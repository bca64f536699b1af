//! The first half of a step: validate it, sort its rows into host rows and
//! device groups, queue every group's device pass and start the one
//! readback. Nothing is accepted yet.

use std::collections::HashMap;
use std::sync::Arc;

use burn_tensor::{DType, FloatDType, Tensor, Transaction};

use super::device::device_pass;
use super::{GroupRun, Out, StepLayout};
use crate::BackendError;
use crate::batch::SamplingBatch;
use crate::batch::pending::{InFlight, NEXT_SERIAL, PendingStep, Readback_};
use crate::batch::request::RequestId;
use crate::logprobs::DeviceLogprobs;
use crate::ops;
use crate::planner::GroupKey;
use crate::stage::RowState;

impl SamplingBatch {
    /// Validate a step, queue every group's device work and start the
    /// readback; nothing is accepted yet. `select`: a sampling step
    /// (`false`: `filter`, or with `top` `top_logprobs`).
    pub(crate) fn submit_inner(
        &mut self,
        ids: &[RequestId],
        logits: Tensor<2>,
        select: bool,
        top: Option<usize>,
    ) -> Result<PendingStep, BackendError> {
        let call = match (select, top) {
            (true, _) => "step",
            (false, None) => "filter",
            (false, Some(_)) => "top_logprobs",
        };
        self.idle(call)?;
        let top = top.filter(|_| !select);
        let row_of = self.check_step(ids, ids.len(), &logits)?;
        let mut pending = PendingStep {
            serial: NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            alive: Arc::new(()),
            select,
            top,
            ids: ids.to_vec(),
            row_of,
            layout: StepLayout::default(),
            readback: None,
        };
        if ids.is_empty() {
            self.in_flight = Some(pending.mark());
            return Ok(pending);
        }
        let logits = if logits.dtype() == DType::F32 {
            logits
        } else {
            logits.cast(FloatDType::F32)
        };
        self.hand_out_masks(ids, select);
        let (mut host_rows, groups) = self.layout_rows(ids);
        // `top_logprobs` of rows with nothing to run (no stages: a beam
        // search without processors) where the policy offloads: the
        // selection alone on the device, so the rows need not come back.
        let bare: Vec<usize> = match top {
            Some(k) if self.offloads_selection(k) => host_rows
                .iter()
                .copied()
                .filter(|&r| self.requests[&ids[r]].spec.stages.is_empty())
                .collect(),
            _ => Vec::new(),
        };
        host_rows.retain(|r| !bare.contains(r));

        let b = ids.len();
        let d = self.device.clone();
        let select_rows = |logits: &Tensor<2>, rows: &[usize]| -> Tensor<2> {
            if rows.len() == b {
                logits.clone()
            } else {
                let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
                logits.clone().select(0, ops::vec_int(&idx, &d))
            }
        };
        let mut tx = Transaction::default();
        let mut n_reg = 0;
        let mut logits = Some(logits);
        if host_rows.len() == b {
            // Every row on the host: the tensor itself is read (on a CPU
            // device without a copy when the caller kept no clone).
            tx = tx.register(logits.take().expect("not taken yet"));
            n_reg += 1;
        } else if !host_rows.is_empty() {
            tx = tx.register(select_rows(logits.as_ref().expect("not taken"), &host_rows));
            n_reg += 1;
        }
        let mut runs = Vec::with_capacity(groups.len() + 1);
        if let (Some(k), Some(&first)) = (top, bare.first()) {
            let rows_logits = select_rows(logits.as_ref().expect("some rows on the device"), &bare);
            let out = device_pass(
                &mut [],
                rows_logits,
                None,
                &[],
                sampler_core::plan::Readback::FullLogits { vocab: self.vocab },
                Some(k),
                None,
            );
            runs.push(GroupRun {
                // A key no device group has: nothing to accept.
                key: self.requests[&ids[first]].key.clone(),
                slots: (0..bare.len() as i64).collect(),
                rows: bare,
                at: n_reg,
                top: Some(k),
            });
            for t in out {
                tx = match t {
                    Out::F(t) => tx.register(t),
                    Out::I(t) => tx.register(t),
                };
                n_reg += 1;
            }
        }
        for (key, rows) in groups {
            let rows_logits = select_rows(logits.as_ref().expect("some rows on the device"), &rows);
            let group_top = top.filter(|&k| self.top_on_device(&key, ids, &rows, k));
            let (slots, out) = self.queue_group(&key, ids, &rows, rows_logits, select, group_top);
            runs.push(GroupRun {
                key,
                rows,
                slots,
                at: n_reg,
                top: group_top,
            });
            for t in out {
                tx = match t {
                    Out::F(t) => tx.register(t),
                    Out::I(t) => tx.register(t),
                };
                n_reg += 1;
            }
        }
        // Start the readback now (device work is queued and, on a GPU, the
        // copy is requested); `finish` waits for it.
        let mut readback: Readback_ = Box::pin(tx.execute_async());
        pending.readback = Some(
            match futures_lite::future::block_on(futures_lite::future::poll_once(&mut readback)) {
                Some(done) => InFlight::Done(done),
                None => InFlight::Waiting(readback),
            },
        );
        pending.layout = StepLayout {
            host_rows,
            groups: runs,
        };
        self.in_flight = Some(pending.mark());
        Ok(pending)
    }

    /// The whole step's errors: the logits' shape (`[rows, vocab]`) and
    /// device, unknown and repeated ids. Returns each request's position in
    /// `ids`.
    pub(crate) fn check_step(
        &self,
        ids: &[RequestId],
        rows: usize,
        logits: &Tensor<2>,
    ) -> Result<HashMap<RequestId, usize>, BackendError> {
        let dims = logits.dims();
        if dims != [rows, self.vocab] {
            return Err(BackendError::Shape {
                found: dims.to_vec(),
                batch: rows,
                vocab: self.vocab,
            });
        }
        let ldev = logits.device();
        if ldev != self.device {
            return Err(BackendError::WrongDevice {
                found: format!("{ldev:?}"),
                expected: format!("{:?}", self.device),
            });
        }
        let mut row_of: HashMap<RequestId, usize> = HashMap::with_capacity(ids.len());
        for (r, &id) in ids.iter().enumerate() {
            if !self.requests.contains_key(&id) {
                return Err(BackendError::UnknownRequest { id: id.0 });
            }
            if let Some(first) = row_of.insert(id, r) {
                return Err(BackendError::DuplicateRow {
                    id: id.0,
                    first,
                    second: r,
                });
            }
        }
        Ok(row_of)
    }

    /// This step's token masks go to the rows' chains (the host stages)
    /// and, through them, to the device stages. A sampling step uses a mask
    /// up; `filter` looks without stepping, so the mask stays for the step.
    fn hand_out_masks(&mut self, ids: &[RequestId], select: bool) {
        for id in ids {
            let Some(req) = self.requests.get_mut(id) else {
                continue;
            };
            if let Some(mask) = req.step_mask(select, self.vocab) {
                req.chain.set_token_mask(Some(mask));
            }
        }
    }

    /// The step rows by group, in order of first appearance, each group's
    /// stages built; host rows apart, ascending (with the rows of groups
    /// whose stages could not be built at their size).
    fn layout_rows(&mut self, ids: &[RequestId]) -> (Vec<usize>, Vec<(GroupKey, Vec<usize>)>) {
        let mut host_rows = Vec::new();
        let mut groups: Vec<(GroupKey, Vec<usize>)> = Vec::new();
        for (r, id) in ids.iter().enumerate() {
            let key = &self.requests[id].key;
            if key.device.is_empty() {
                host_rows.push(r);
            } else if let Some((_, rows)) = groups.iter_mut().find(|(k, _)| k == key) {
                rows.push(r);
            } else {
                groups.push((key.clone(), vec![r]));
            }
        }
        for (key, _) in &groups {
            self.groups
                .build(key, &self.requests, self.vocab, &self.device);
        }
        groups.retain(|(key, rows)| {
            let empty = self
                .groups
                .get(key)
                .and_then(|g| g.stages.as_ref())
                .is_none_or(|s| s.is_empty());
            if empty {
                host_rows.extend(rows);
            }
            !empty
        });
        host_rows.sort_unstable();
        (host_rows, groups)
    }

    /// Whether the policy puts a `top_logprobs(k)` selection of rows
    /// without stages on the device: `device`, a stage cap above 0, or
    /// `auto` on a GPU; and the device may select `k`.
    fn offloads_selection(&self, k: usize) -> bool {
        let offload = match self.policy {
            sampler_core::OffloadPolicy::Off => false,
            sampler_core::OffloadPolicy::Device => true,
            sampler_core::OffloadPolicy::Stages(n) => n > 0,
            sampler_core::OffloadPolicy::Auto => !crate::is_cpu_device(&self.device),
        };
        offload && ops::generic_topk_allowed(k.min(self.vocab), &self.device).is_ok()
    }

    /// Whether a group's `top_logprobs(k)` runs on the device: its rows
    /// are read back whole (no selecting stage on the device), every row's
    /// whole chain runs there (no host suffix to apply first), and the
    /// device may select `k` ([`ops::generic_topk_allowed`]).
    fn top_on_device(&self, key: &GroupKey, ids: &[RequestId], rows: &[usize], k: usize) -> bool {
        matches!(
            key.readback,
            sampler_core::plan::Readback::FullLogits { .. }
        ) && rows.iter().all(|&r| {
            let req = &self.requests[&ids[r]];
            req.plan.host_start >= req.spec.stages.len()
        }) && ops::generic_topk_allowed(k.min(self.vocab), &self.device).is_ok()
    }

    /// Queue one group's device pass over its step rows `rows` (logits
    /// `[R, V]`): each row's slot, and the tensors its readback registers.
    fn queue_group(
        &mut self,
        key: &GroupKey,
        ids: &[RequestId],
        rows: &[usize],
        logits: Tensor<2>,
        select: bool,
        top: Option<usize>,
    ) -> (Vec<i64>, Vec<Out>) {
        let d = self.device.clone();
        let g = self
            .groups
            .get_mut(key)
            .expect("group built by layout_rows");
        let slot_of: HashMap<RequestId, usize> =
            g.members.iter().enumerate().map(|(s, &m)| (m, s)).collect();
        let slots: Vec<i64> = rows.iter().map(|&r| slot_of[&ids[r]] as i64).collect();
        let identity =
            slots.len() == g.members.len() && slots.iter().enumerate().all(|(i, &s)| s == i as i64);
        let row_states: Vec<RowState> = rows
            .iter()
            .map(|&r| {
                let c = &self.requests[&ids[r]].chain;
                RowState {
                    seed: c.seed(),
                    step: c.step(),
                    mask: c
                        .stages()
                        .iter()
                        .find_map(|st| st.token_mask().map(Arc::from)),
                }
            })
            .collect();
        let slots_t = (!identity).then(|| ops::vec_int(&slots, &d));
        // `filter` reports no logprobs.
        let lp = key
            .logprobs
            .filter(|_| select)
            .map(|(mode, n, _)| DeviceLogprobs {
                mode,
                n,
                ids: g.lp_ids.as_ref().map(|t| match &slots_t {
                    Some(s) => t.clone().select(0, s.clone()),
                    None => t.clone(),
                }),
            });
        let stages = g.stages.as_mut().expect("built by layout_rows");
        let out = device_pass(stages, logits, slots_t, &row_states, key.readback, top, lp);
        (slots, out)
    }
}
