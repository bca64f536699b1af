//! Structured outputs: what a request's output must match, and the
//! per-request matcher that turns it into a token bitmask each step.
//!
//! The matcher itself (a grammar engine over the model's tokenizer) lives
//! outside this crate: `sampler-structured` implements [`TokenConstraint`]
//! with llguidance; an engine may plug in its own (XGrammar, Outlines) the
//! same way. The serving batch drives it: the mask for the next step comes
//! from the tokens accepted so far, every accepted token is consumed, and
//! the next mask is computed while the engine runs its forward pass.

use serde::{Deserialize, Serialize};

use crate::TokenId;

/// What a request's output must match (OpenAI's `response_format`, vLLM's
/// `guided_json` / `guided_regex` / `guided_grammar`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// A JSON value valid against this JSON Schema document (its JSON text).
    JsonSchema(String),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// The whole output matches this regular expression (Rust `regex`
    /// syntax; anchored at both ends).
    Regex(String),
    /// The output is a sentence of this Lark grammar (llguidance's Lark
    /// dialect; the `start` rule).
    Grammar(String),
}

impl StructuredOutput {
    /// The kind's name, as the config keys write it: `json_schema`,
    /// `json_object`, `regex`, `grammar`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) => "json_schema",
            Self::JsonObject => "json_object",
            Self::Regex(_) => "regex",
            Self::Grammar(_) => "grammar",
        }
    }
}

/// Why a constraint failed: building it (an invalid schema, regex or
/// grammar; one that can produce nothing) or during generation (a token it
/// does not allow, the grammar engine's own limits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ConstraintError {
    /// The constraint's kind ([`StructuredOutput::kind`]) or the operation
    /// that failed (`mask`, `consume`).
    pub kind: &'static str,
    /// What went wrong and where, as the grammar engine says it.
    pub message: String,
}

/// A per-request matcher that produces each step's allowed-token bitmask
/// and follows the tokens the request accepts.
///
/// Masks are `ceil(vocab / 32)` `u32` words, bit `id % 32` of word `id / 32`
/// set where token `id` is allowed (llguidance's and XGrammar's format).
/// End-of-sequence tokens are allowed only where the constraint accepts
/// the output so far; once it has finished, only they are.
pub trait TokenConstraint: Send {
    /// Write the mask for the next token into `mask` (`ceil(vocab / 32)`
    /// words; every word is written).
    ///
    /// # Errors
    /// The matcher's error (it is then unusable).
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError>;
    /// Advance over an accepted token.
    ///
    /// # Errors
    /// A token the constraint does not allow here, or the matcher's error.
    fn consume(&mut self, token: TokenId) -> Result<(), ConstraintError>;
    /// How many of `tokens`, from the first, the constraint would accept in
    /// order from its current state (nothing is consumed).
    ///
    /// # Errors
    /// The matcher's error.
    fn validate(&mut self, tokens: &[TokenId]) -> Result<usize, ConstraintError>;
    /// Undo the last `n` consumed tokens.
    ///
    /// # Errors
    /// More than were consumed, or the matcher's error.
    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError>;
    /// Back to the state before the first token.
    ///
    /// # Errors
    /// The matcher's error.
    fn reset(&mut self) -> Result<(), ConstraintError>;
    /// Whether the constraint is complete and allows nothing but an
    /// end-of-sequence token.
    fn is_finished(&self) -> bool;
    /// An independent copy in the same state (for `fork`).
    fn box_clone(&self) -> Box<dyn TokenConstraint>;
}
