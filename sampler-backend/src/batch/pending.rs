//! Pipelining: a submitted step in flight ([`PendingStep`]), what the batch
//! remembers of it, and the one-step-at-a-time rule (calls that would change
//! what the step samples wait for `finish`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use burn_tensor::TensorData;

use crate::BackendError;
use crate::batch::request::RequestId;
use crate::step::StepLayout;

/// A pipelined step in flight: returned by
/// [`SamplingBatch::submit`](crate::SamplingBatch::submit), consumed by
/// [`SamplingBatch::finish`](crate::SamplingBatch::finish).
pub struct PendingStep {
    pub(crate) serial: u64,
    /// Its strong count tells the batch whether this step was dropped.
    pub(crate) alive: Arc<()>,
    /// A sampling step (`false`: `filter` or `top_logprobs`).
    pub(crate) select: bool,
    /// `top_logprobs(k)`: each row's top `k` `(token, logprob)` instead of
    /// its candidates.
    pub(crate) top: Option<usize>,
    pub(crate) ids: Vec<RequestId>,
    pub(crate) row_of: HashMap<RequestId, usize>,
    pub(crate) layout: StepLayout,
    pub(crate) readback: Option<InFlight>,
}

/// A submitted step's readback: still running, or already done (a CPU
/// device reads synchronously).
pub(crate) enum InFlight {
    Waiting(Readback_),
    Done(Result<Vec<TensorData>, burn_tensor::ExecutionError>),
}

/// A step dropped without `finish` still waits for its readback: a GPU
/// backend must see its read finish (wgpu refuses the next submission while
/// a buffer it maps for reading is left mapped).
impl Drop for PendingStep {
    fn drop(&mut self) {
        if let Some(InFlight::Waiting(f)) = self.readback.take() {
            let _ = futures_lite::future::block_on(f);
        }
    }
}

impl PendingStep {
    pub(crate) fn mark(&self) -> InFlightMark {
        InFlightMark {
            serial: self.serial,
            alive: Arc::downgrade(&self.alive),
            ids: self.ids.clone(),
        }
    }
}

/// A [`PendingStep`] handed back inside [`BackendError::ForeignStep`]
/// (errors are `Clone`: the step is taken out once, by whichever copy asks
/// first).
#[derive(Clone)]
pub struct ReturnedStep {
    serial: u64,
    step: Arc<std::sync::Mutex<Option<PendingStep>>>,
}

impl ReturnedStep {
    fn new(step: PendingStep) -> Self {
        Self {
            serial: step.serial,
            step: Arc::new(std::sync::Mutex::new(Some(step))),
        }
    }

    /// The step, the first time (`None` after that).
    pub fn take(&self) -> Option<PendingStep> {
        self.step.lock().ok()?.take()
    }

    /// The step's serial (unique across batches).
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

impl PartialEq for ReturnedStep {
    fn eq(&self, other: &Self) -> bool {
        self.serial == other.serial
    }
}

impl fmt::Debug for ReturnedStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReturnedStep")
            .field("serial", &self.serial)
            .finish()
    }
}

impl fmt::Debug for PendingStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingStep")
            .field("serial", &self.serial)
            .field("rows", &self.ids.len())
            .finish()
    }
}

/// The readback future of a submitted step.
pub(crate) type Readback_ = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<Vec<TensorData>, burn_tensor::ExecutionError>>
            + Send,
    >,
>;

/// What the batch remembers of its step in flight.
pub(crate) struct InFlightMark {
    /// The [`PendingStep`]'s serial (unique across batches).
    pub(crate) serial: u64,
    /// Dead when the caller dropped the `PendingStep` without `finish`.
    pub(crate) alive: std::sync::Weak<()>,
    /// The step's rows (their one-step masks are cleared when it ends).
    pub(crate) ids: Vec<RequestId>,
}

/// Serials of submitted steps, unique in the process, so that a
/// [`PendingStep`] of another batch is recognised.
pub(crate) static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The error for another batch's step: the step itself travels back in it
/// (a `PendingStep` has exactly one owner batch: the only step of this
/// batch that can exist is its step in flight).
pub(crate) fn foreign(pending: PendingStep) -> BackendError {
    BackendError::ForeignStep {
        step: ReturnedStep::new(pending),
    }
}
