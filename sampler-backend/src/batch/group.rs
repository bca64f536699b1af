//! Device groups: requests whose device prefixes match share one set of
//! device stages, one slot per member (join, leave, per-slot uploads).

use std::collections::{BTreeMap, HashMap};

use burn_tensor::{Device, Int, Tensor, TensorData};

use sampler_core::{ChainSpec, TokenId, TokenOrigin};

use crate::batch::request::{Request, RequestId};
use crate::planner::GroupKey;
use crate::stage::{DeviceStage, InitContext, build_device_stage};

/// One group: its members (slot -> request) and their device stages.
#[derive(Default)]
pub(crate) struct Group {
    /// Slot -> request.
    pub(crate) members: Vec<RequestId>,
    /// The device stages for `members`, `None` until (re)built.
    pub(crate) stages: Option<Vec<Box<dyn DeviceStage>>>,
    /// The members' requested logprob token ids `[S, m]`, with the stages.
    pub(crate) lp_ids: Option<Tensor<2, Int>>,
}

/// One slot of a stage set: its request's spec and the history its
/// history-based stages start from.
pub(crate) type Member<'a> = (&'a ChainSpec, &'a [(TokenId, TokenOrigin)]);

/// The device stages of `key` for one slot per member, in slot order; empty
/// when a stage cannot be built at this size (the rows then run on the host,
/// full rows, still exact: every member's own plan was accepted at one slot,
/// but at this slot count a table may be too large).
pub(crate) fn build_stages(
    key: &GroupKey,
    members: &[Member<'_>],
    vocab: usize,
    device: &Device,
) -> Vec<Box<dyn DeviceStage>> {
    let mut stages = Vec::with_capacity(key.device.len());
    let mut width = vocab;
    let mut has_ids = false;
    for &(i, _, _) in &key.device {
        let specs: Vec<_> = members.iter().map(|m| m.0.stages[i].clone()).collect();
        let Some(mut st) = build_device_stage(i, &specs) else {
            break;
        };
        if st.needs_history() {
            for (slot, m) in members.iter().enumerate() {
                st.restore(slot, m.1);
            }
        }
        let ctx = InitContext {
            batch: members.len(),
            vocab,
            width,
            has_ids,
            device: device.clone(),
        };
        if st.init(&ctx).is_err() {
            break;
        }
        let w = st.out_width(width);
        has_ids |= w != width;
        width = w;
        stages.push(st);
    }
    if stages.len() != key.device.len() {
        stages.clear();
    }
    stages
}

/// The live groups by key.
#[derive(Default)]
pub(crate) struct Groups(HashMap<GroupKey, Group>);

impl Groups {
    /// Live groups.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// A live group.
    pub(crate) fn get(&self, key: &GroupKey) -> Option<&Group> {
        self.0.get(key)
    }

    /// A live group, to run or update.
    pub(crate) fn get_mut(&mut self, key: &GroupKey) -> Option<&mut Group> {
        self.0.get_mut(key)
    }

    /// Request `id` joins the group of `key` (a host-only key has none);
    /// the group's stages are rebuilt before its next step.
    pub(crate) fn join(&mut self, id: RequestId, key: &GroupKey) {
        if key.device.is_empty() {
            return;
        }
        let g = self.0.entry(key.clone()).or_default();
        g.members.push(id);
        g.stages = None;
    }

    /// Request `id` leaves the group of `key`; an empty group is dropped.
    pub(crate) fn leave(&mut self, id: RequestId, key: &GroupKey) {
        if let Some(g) = self.0.get_mut(key) {
            g.members.retain(|&m| m != id);
            g.stages = None;
            if g.members.is_empty() {
                self.0.remove(key);
            }
        }
    }

    /// A member's parameters or history changed: the group's stages are
    /// rebuilt before its next step.
    pub(crate) fn dirty(&mut self, key: &GroupKey) {
        if let Some(g) = self.0.get_mut(key) {
            g.stages = None;
        }
    }

    /// (Re)build a group's device stages for its members (`requests`: every
    /// live request), unless they are built.
    pub(crate) fn build(
        &mut self,
        key: &GroupKey,
        requests: &BTreeMap<RequestId, Request>,
        vocab: usize,
        device: &Device,
    ) {
        let Some(g) = self.0.get_mut(key) else {
            return;
        };
        if g.stages.is_some() {
            return;
        }
        let slots = g.members.len();
        let members: Vec<Member<'_>> = g
            .members
            .iter()
            .map(|m| (&requests[m].spec, &requests[m].history[..]))
            .collect();
        let stages = build_stages(key, &members, vocab, device);
        g.lp_ids = match key.logprobs {
            Some((_, _, m)) if m > 0 => {
                let ids: Vec<i32> = g
                    .members
                    .iter()
                    .flat_map(|mem| {
                        let lp = requests[mem].spec.logprobs.as_ref();
                        lp.map(|l| l.token_ids.clone()).unwrap_or_default()
                    })
                    .map(|t| t as i32)
                    .collect();
                Some(Tensor::<2, Int>::from_data(
                    TensorData::new(ids, [slots, m]),
                    device,
                ))
            }
            _ => None,
        };
        g.stages = Some(stages);
    }
}
