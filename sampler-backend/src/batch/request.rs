//! A request of a serving batch: its id and its own state (chain, plan,
//! history, outputs, next-step mask), which never depends on a batch
//! position.

use std::fmt;
use std::sync::Arc;

use sampler_core::{Chain, ChainSpec, Plan, StageKind, TokenId, TokenOrigin};

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
