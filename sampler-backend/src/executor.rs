//! The fixed-batch executor: a thin layer over [`SamplingBatch`] for callers
//! whose batch is the same requests in the same rows every step.

use burn_tensor::{Device, Tensor};
use sampler_core::plan::{OffloadPolicy, Plan};
use sampler_core::{Chain, ChainSpec, TokenId};

use crate::BackendError;
use crate::batch::SamplingBatch;
use crate::batch::request::RequestId;

/// The result of one [`Executor::step`]: one entry per row, and the bytes read back.
pub type StepOutput = crate::batch::BatchStep;

/// The result of one [`Executor::filter`]: each row's candidates after the
/// whole chain ran without selecting (for chains without a selecting stage).
pub type FilterOutput = crate::batch::BatchFilter;

/// A fixed batch: row `r` is always the request built from `rows[r]`.
///
/// Every step samples every row ([`SamplingBatch::step`] with the rows in
/// order). Rows may have any chains (kinds, orders and parameters differ
/// freely); each row is planned alone ([`Executor::row_plan`]).
pub struct Executor {
    batch: SamplingBatch,
    ids: Vec<RequestId>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("rows", &self.ids.len())
            .field("batch", &self.batch)
            .finish()
    }
}

impl Executor {
    /// Build an executor for `rows.len()` rows over a vocabulary of `vocab`;
    /// `rows[r]` is row `r`'s chain.
    ///
    /// # Errors
    /// [`BackendError::EmptyBatch`], [`BackendError::EmptyVocab`],
    /// [`BackendError::VocabTooLarge`], [`BackendError::Param`] (invalid
    /// parameters: row, stage, field, range), [`BackendError::Build`].
    pub fn new(
        rows: Vec<ChainSpec>,
        vocab: usize,
        device: &Device,
        policy: OffloadPolicy,
    ) -> Result<Self, BackendError> {
        if rows.is_empty() {
            return Err(BackendError::EmptyBatch);
        }
        let mut batch = SamplingBatch::new(vocab, device, policy)?;
        let mut ids = Vec::with_capacity(rows.len());
        for (row, spec) in rows.into_iter().enumerate() {
            let id = batch.insert(spec, &[]).map_err(|e| match e {
                BackendError::InvalidRequest { stage, source } => {
                    BackendError::Param { row, stage, source }
                }
                BackendError::RequestBuild { source } => BackendError::Build { row, source },
                other => other,
            })?;
            ids.push(id);
        }
        Ok(Self { batch, ids })
    }

    /// Row 0's plan (every row's when the rows share a chain; see
    /// [`Executor::row_plan`]).
    pub fn plan(&self) -> &Plan {
        self.batch.plan(self.ids[0]).expect("row 0 is live")
    }
    /// Row `row`'s plan, planned for that row alone.
    pub fn row_plan(&self, row: usize) -> Option<&Plan> {
        self.batch.plan(*self.ids.get(row)?)
    }
    /// Rows per step.
    pub fn batch(&self) -> usize {
        self.ids.len()
    }
    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.batch.vocab()
    }
    /// The device the executor runs on.
    pub fn device(&self) -> &Device {
        self.batch.device()
    }
    /// Row `row`'s CPU chain (seed, step, host stages).
    pub fn chain(&self, row: usize) -> Option<&Chain> {
        self.batch.chain(*self.ids.get(row)?)
    }
    /// The serving batch underneath, and row `r`'s request id at `[r]`.
    pub fn sampling_batch(&self) -> (&SamplingBatch, &[RequestId]) {
        (&self.batch, &self.ids)
    }

    /// Feed prompt tokens of one row to its history-based stages (device
    /// counts and CPU chain). Token ids outside the vocabulary never reach
    /// the device.
    ///
    /// # Errors
    /// [`BackendError::RowOutOfRange`] when `row >= batch` (nothing changes).
    pub fn accept_prompt(&mut self, row: usize, tokens: &[TokenId]) -> Result<(), BackendError> {
        let batch = self.ids.len();
        let Some(&id) = self.ids.get(row) else {
            return Err(BackendError::RowOutOfRange { row, batch });
        };
        self.batch.accept_prompt(id, tokens)
    }

    /// Forget every row's history and restart its step counter (a fixed seed
    /// then replays the same random numbers).
    pub fn reset(&mut self) {
        for &id in &self.ids {
            // Every id is live: the executor never removes one.
            let _ = self.batch.reset(id);
        }
    }

    /// Sample one token per row from `logits` `[batch, vocab]` on the
    /// executor's device ([`SamplingBatch::step`]).
    ///
    /// # Errors
    /// [`BackendError::Shape`], [`BackendError::WrongDevice`],
    /// [`BackendError::Readback`]. Per-row problems (NaN rows, all `-inf`)
    /// are `Err` entries of [`StepOutput::tokens`]; the other rows are sampled.
    pub fn step(&mut self, logits: Tensor<2>) -> Result<StepOutput, BackendError> {
        self.batch.step(&self.ids, logits)
    }

    /// Run the chain on `logits` `[batch, vocab]` without selecting or
    /// accepting anything, and return each row's candidates. Meant for
    /// chains without a selecting stage (filters only); nothing advances.
    ///
    /// # Errors
    /// As [`Executor::step`].
    pub fn filter(&mut self, logits: Tensor<2>) -> Result<FilterOutput, BackendError> {
        self.batch.filter(&self.ids, logits)
    }
}
