//! A request of a serving batch: its id and its own state (chain, plan,
//! history, outputs, next-step mask), which never depends on a batch
//! position.

use std::fmt;
use std::sync::Arc;

use sampler_core::{Chain, ChainSpec, Plan, StageKind, TokenId, TokenOrigin};

use crate::batch::constrained::Constrained;
use crate::planner::GroupKey;

/// A request of a [`SamplingBatch`](crate::SamplingBatch): returned by
/// [`SamplingBatch::insert`](crate::SamplingBatch::insert), valid until
/// [`SamplingBatch::remove`](crate::SamplingBatch::remove). Ids are never
/// reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub(crate) u64);

impl RequestId {
    /// The id as a number (unique within its batch).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}", self.0)
    }
}

/// One request's state.
pub(crate) struct Request {
    /// The spec with the seed actually used.
    pub(crate) spec: ChainSpec,
    pub(crate) chain: Chain,
    pub(crate) plan: Plan,
    pub(crate) key: GroupKey,
    /// Survivors kept from a `Candidates` readback.
    pub(crate) keep: usize,
    /// A device stage of this request masks what the CPU removes (top_p,
    /// min_p, epsilon, eta): the host drops the `-inf` entries it left.
    pub(crate) drop_masked: bool,
    /// Every accepted token in order (prompt and generated), for device
    /// state rebuilt at a group change and chains rebuilt by `update`.
    pub(crate) history: Vec<(TokenId, TokenOrigin)>,
    /// The generated tokens since insert / reset.
    pub(crate) outputs: Vec<TokenId>,
    /// The token mask for the next step ([`SamplingBatch::set_mask`]).
    pub(crate) mask: Option<Arc<[u32]>>,
    /// The structured-output constraint
    /// ([`SamplingBatch::set_constraint`]).
    pub(crate) constraint: Option<Constrained>,
}

impl Request {
    /// This step's mask: the engine's ([`SamplingBatch::set_mask`], used
    /// up by a sampling step, kept by a look), combined with the
    /// constraint's; a failed constraint allows nothing (the row's error is
    /// the constraint's, at finish).
    pub(crate) fn step_mask(&mut self, select: bool, vocab: usize) -> Option<Arc<[u32]>> {
        let mask = if select {
            self.mask.take()
        } else {
            self.mask.clone()
        };
        match self.constraint.as_mut().map(Constrained::mask) {
            None => mask,
            Some(Err(_)) => Some(Arc::from(vec![0u32; vocab.div_ceil(32)])),
            Some(Ok(c)) => Some(match mask {
                Some(m) => m.iter().zip(c.iter()).map(|(a, b)| a & b).collect(),
                None => c,
            }),
        }
    }
}

/// Whether a mask given to `chain` acts: it has a `mask` stage before its
/// first selecting stage (stages after it never run).
pub(crate) fn masks_act(chain: &Chain) -> bool {
    for st in chain.stages() {
        match st.spec() {
            Some(sp) if sp.kind() == StageKind::Mask => return true,
            Some(sp) if sp.selects() => return false,
            _ => {}
        }
    }
    false
}
