//! Error types. Every error has structured fields so callers can match on them;
//! nothing in this workspace panics on user input.

use thiserror::Error;

/// A parameter value outside its documented range.
///
/// Carries the stage's canonical name, the parameter name, the offending value
/// (as text, so ints, floats and lists all fit) and the valid range in words.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{stage}.{param} = {value} is out of range: expected {expected}")]
pub struct ParamError {
    /// Canonical stage name, e.g. `top_p`.
    pub stage: &'static str,
    /// Parameter name, e.g. `p`.
    pub param: &'static str,
    /// The rejected value, formatted.
    pub value: String,
    /// The valid range in words, e.g. `a finite number in [0, 1]`.
    pub expected: String,
}

/// Why one row could not be sampled. Errors are per row: in a batch, one bad
/// row never spoils the others.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SampleError {
    /// The row has no logits at all (vocabulary of size 0).
    #[error("the row is empty: a vocabulary of 0 tokens cannot be sampled")]
    EmptyRow,
    /// A NaN logit makes the whole row invalid (NaN or `+inf` anywhere in a row is that row's error).
    #[error("logit at position {index} is NaN: the row is invalid")]
    NanLogit {
        /// Position in the row (== token id for a raw vocabulary row).
        index: usize,
    },
    /// A `+inf` logit has no probability interpretation; the row is invalid.
    #[error("logit at position {index} is +inf: the row is invalid")]
    PosInfLogit {
        /// Position in the row.
        index: usize,
    },
    /// A token mask whose length does not match the vocabulary.
    #[error(
        "the token mask has {found} u32 words, but the vocabulary needs ceil(vocab / 32) = {expected}"
    )]
    TokenMaskLength {
        /// Words given.
        found: usize,
        /// Words the row's vocabulary needs.
        expected: usize,
    },
    /// Every remaining candidate has logit `-inf` (probability 0), so no
    /// token can be drawn. llama.cpp would return NaN probabilities here.
    #[error("every candidate logit is -inf: no token has positive probability")]
    AllMasked,
    /// A token was asked for but no stage in the chain selects one
    /// (e.g. `top_k;top_p` without `dist` or `greedy`).
    #[error("the chain has no stage that selects a token (add `dist` or `greedy` at the end)")]
    NoSelectingStage,
    /// Logits buffer does not match the declared `[batch, vocab]` shape.
    #[error(
        "logits have {len} values but the shape [batch = {batch}, vocab = {vocab}] needs {expected}"
    )]
    Shape {
        /// Values supplied.
        len: usize,
        /// Declared batch size.
        batch: usize,
        /// Declared vocabulary size.
        vocab: usize,
        /// `batch * vocab` (saturating).
        expected: usize,
    },
    /// `batch * vocab` does not fit in memory's address space (`usize`).
    #[error(
        "the shape [batch = {batch}, vocab = {vocab}] overflows: batch * vocab is larger than usize"
    )]
    ShapeOverflow {
        /// Declared batch size.
        batch: usize,
        /// Declared vocabulary size.
        vocab: usize,
    },
    /// The number of per-row chains does not match the batch size.
    #[error("{chains} chains were given for a batch of {batch} rows")]
    ChainCount {
        /// Chains supplied.
        chains: usize,
        /// Rows in the batch.
        batch: usize,
    },
    /// The number of per-row logprobs requests does not match the batch
    /// size (`sample_batch_logprobs`).
    #[error(
        "{specs} logprobs requests (one per row, `None` for none) were given for a batch of {batch} rows"
    )]
    LogprobsCount {
        /// Requests supplied.
        specs: usize,
        /// Rows in the batch.
        batch: usize,
    },
    /// A token id at or beyond the vocabulary size.
    #[error("token id {token} is out of range for a vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A candidate set that lists a token twice (a set has distinct ids).
    #[error("token id {token} appears twice in one candidate set")]
    DuplicateToken {
        /// The repeated id.
        token: u32,
    },
    /// Invalid stage parameter.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A custom stage (one without a spec) left a NaN or `+inf` logit,
    /// which no later stage may see; the row is that stage's error.
    #[error(
        "stage {stage} (`{name}`) left a {value} logit at position {index}: a custom stage must keep logits finite or -inf"
    )]
    CustomStageOutput {
        /// Position of the stage in the chain, from 0.
        stage: usize,
        /// The stage's name.
        name: String,
        /// Position in the row of the first bad logit.
        index: usize,
        /// `NaN` or `+inf`.
        value: &'static str,
    },
    /// A device error reported by a backend (sampler-backend maps its own
    /// errors into this variant when they concern a single row).
    #[error("device error: {0}")]
    Device(String),
    /// The request's structured-output constraint failed (its matcher's
    /// error); the request can take no more tokens under it.
    #[error("structured output: {0}")]
    Constraint(#[from] crate::structured::ConstraintError),
}

impl SampleError {
    /// The error's kind as one snake_case word, for scripts (the JSON
    /// output of the example commands): `empty_row`, `nan_logit`,
    /// `pos_inf_logit`, `all_masked`, `token_mask_length`, `no_selecting_stage`, `shape`,
    /// `shape_overflow`, `chain_count`, `logprobs_count`, `token_out_of_range`,
    /// `duplicate_token`, `param`, `custom_stage_output`, `device`, `constraint`.
    pub fn kind(&self) -> &'static str {
        match self {
            SampleError::EmptyRow => "empty_row",
            SampleError::NanLogit { .. } => "nan_logit",
            SampleError::PosInfLogit { .. } => "pos_inf_logit",
            SampleError::AllMasked => "all_masked",
            SampleError::TokenMaskLength { .. } => "token_mask_length",
            SampleError::NoSelectingStage => "no_selecting_stage",
            SampleError::Shape { .. } => "shape",
            SampleError::ShapeOverflow { .. } => "shape_overflow",
            SampleError::ChainCount { .. } => "chain_count",
            SampleError::LogprobsCount { .. } => "logprobs_count",
            SampleError::TokenOutOfRange { .. } => "token_out_of_range",
            SampleError::DuplicateToken { .. } => "duplicate_token",
            SampleError::Param(_) => "param",
            SampleError::CustomStageOutput { .. } => "custom_stage_output",
            SampleError::Device(_) => "device",
            SampleError::Constraint(_) => "constraint",
        }
    }
}
