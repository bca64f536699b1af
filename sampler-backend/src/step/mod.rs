//! One step of a [`SamplingBatch`](crate::SamplingBatch), in the order it
//! runs:
//!
//! - [`submit`]: validate the step, sort its rows into host rows and groups
//!   (a [`StepLayout`]), queue each group's device pass ([`device`]) and
//!   start the one readback;
//! - [`decode`]: the readback decoded into each row's [`Work`];
//! - [`host`]: the host suffixes (in parallel, each request's own chain),
//!   then every request and group records its token.

pub(crate) mod decode;
pub(crate) mod device;
pub(crate) mod host;
pub(crate) mod submit;

use burn_tensor::{Int, Tensor};
use sampler_core::{Candidates, Logprobs, SampleError, TokenId};

use crate::planner::GroupKey;

/// Where a step's rows went, and where their outputs sit in the readback.
#[derive(Debug, Default)]
pub(crate) struct StepLayout {
    /// Step rows read back whole for the host, ascending; when there are
    /// any, their `[R, V]` logits are the readback's first tensor.
    pub(crate) host_rows: Vec<usize>,
    /// The groups that run on the device this step, in order of first row.
    pub(crate) groups: Vec<GroupRun>,
}

/// One group's part of a step.
#[derive(Debug)]
pub(crate) struct GroupRun {
    /// The group.
    pub(crate) key: GroupKey,
    /// Its step rows, in step order.
    pub(crate) rows: Vec<usize>,
    /// Each of those rows' slot in the group.
    pub(crate) slots: Vec<i64>,
    /// The index of the group's first tensor in the readback.
    pub(crate) at: usize,
    /// `top_logprobs(k)` computed on the device for this group: its
    /// readback is `[R, k]` ids, `[R, k]` logits and `[R, 1]` log-sum-exps
    /// instead of the full rows.
    pub(crate) top: Option<usize>,
}

/// What a step produced per step row.
#[derive(Default)]
pub(crate) struct StepRows {
    pub(crate) rows: Vec<Result<RowResult, SampleError>>,
    pub(crate) logprobs: Vec<Option<Logprobs>>,
    pub(crate) bytes_read: usize,
}

/// A row's work after the readback, before the host runs.
pub(crate) enum Work {
    /// The full raw row at this offset of the host buffer `raw`.
    Raw(usize),
    /// The device selected (or failed).
    Token(Result<TokenId, SampleError>),
    /// Candidates read back; the host runs the chain from `host_start`.
    Cands(Result<Candidates, SampleError>, usize),
    /// The top `k` of the processed row computed on the device
    /// (`top_logprobs`): `(token, logprob)`, canonical order.
    Top(Result<Vec<(TokenId, f32)>, SampleError>),
}

/// A row's result.
pub(crate) enum RowResult {
    Token(TokenId),
    Cands(Candidates),
    /// `top_logprobs`: `(token, logprob)`, canonical order.
    Top(Vec<(TokenId, f32)>),
}

/// A tensor a group's device pass registers with the step's readback.
pub(crate) enum Out {
    F(Tensor<2>),
    I(Tensor<1, Int>),
}
