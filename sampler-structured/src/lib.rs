//! Structured outputs for sampler-chain: a request's output held to a JSON
//! Schema, any JSON object, a regular expression or a Lark grammar, through
//! [llguidance](https://github.com/guidance-ai/llguidance)'s matcher.
//!
//! Two pieces:
//! - [`TokenizerView`]: the model's vocabulary as bytes per token id (text
//!   tokens, special tokens, unused padding rows) and its end-of-sequence
//!   ids, built once per model and shared by every request
//!   (`Arc<TokenizerView>`); it holds llguidance's token trie and parser
//!   factory.
//! - [`Matcher`]: one per constrained request, a
//!   [`TokenConstraint`](sampler_core::TokenConstraint): each step's
//!   allowed-token bitmask (`ceil(vocab / 32)` `u32` words, least
//!   significant bit first, the format of the chain's `mask` stage), the
//!   accepted tokens consumed, rollback and reset.
//!
//! ```
//! use std::sync::Arc;
//! use sampler_core::{StructuredOutput, TokenConstraint};
//! use sampler_structured::{Matcher, TokenBytes, TokenizerView};
//!
//! // A vocabulary of the 256 bytes plus an end-of-sequence token.
//! let mut tokens: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
//! tokens.push(TokenBytes::Special("</s>".into()));
//! let view = Arc::new(TokenizerView::new(tokens, &[256]).unwrap());
//! let mut m = Matcher::new(&view, &StructuredOutput::Regex("ab|ac".into())).unwrap();
//! let mut mask = vec![0u32; view.mask_words()];
//! m.fill_mask(&mut mask).unwrap();
//! assert_eq!(mask[(b'a' / 32) as usize], 1 << (b'a' % 32)); // only `a`
//! m.consume(u32::from(b'a')).unwrap();
//! m.consume(u32::from(b'c')).unwrap();
//! m.fill_mask(&mut mask).unwrap();
//! assert_eq!(mask[256 / 32], 1); // now only the end of sequence
//! ```
//!
//! JSON is generated compactly by default (`", "` between items, `": "`
//! after keys, no other whitespace), so a model cannot spend its tokens on
//! blank space; a schema's own `x-guidance` object (llguidance's JSON
//! options) overrides that.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, ParserFactory};
use sampler_core::{ConstraintError, StructuredOutput, TokenConstraint, TokenId};

/// One token of the model's vocabulary, as the grammar engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenBytes {
    /// A token that writes these bytes (the tokenizer's decoded bytes,
    /// byte-fallback tokens as their one byte).
    Text(Vec<u8>),
    /// A control token (`<|im_end|>`, `</s>`): never part of the text a
    /// grammar matches; allowed only as an end-of-sequence id where the
    /// grammar accepts.
    Special(String),
    /// A row of the model's output with no token behind it (padding past
    /// the tokenizer's vocabulary): never allowed.
    Unused,
}

/// The model's vocabulary for the grammar engine: built once per model,
/// shared by every request's [`Matcher`].
pub struct TokenizerView {
    factory: ParserFactory,
    vocab: usize,
    eos: Vec<TokenId>,
}

impl std::fmt::Debug for TokenizerView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizerView")
            .field("vocab", &self.vocab)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

/// An error of `kind`; the engine's dump of its parser state (`<state>...`)
/// is left out of the message.
fn error(kind: &'static str, message: impl Into<String>) -> ConstraintError {
    let mut message = message.into();
    if let Some(at) = message.find("<state>") {
        message.truncate(at);
        message.truncate(message.trim_end().len());
    }
    ConstraintError { kind, message }
}

impl TokenizerView {
    /// A view of `tokens` (one entry per row of the model's logits, so
    /// `tokens.len()` is the logits' `vocab`) whose end-of-sequence ids are
    /// `eos` (at least one; the tokens a finished output ends with, such as
    /// `</s>` or `<|im_end|>`).
    ///
    /// # Errors
    /// No tokens, more than `u32::MAX`, no `eos` id or one outside the
    /// vocabulary (kind `tokenizer`).
    pub fn new(tokens: Vec<TokenBytes>, eos: &[TokenId]) -> Result<Self, ConstraintError> {
        let vocab = tokens.len();
        if vocab == 0 || u32::try_from(vocab).is_err() {
            return Err(error(
                "tokenizer",
                format!("a vocabulary of {vocab} tokens (1..=u32::MAX)"),
            ));
        }
        let Some(&first) = eos.first() else {
            return Err(error("tokenizer", "no end-of-sequence token id"));
        };
        if let Some(&bad) = eos.iter().find(|&&t| t as usize >= vocab) {
            return Err(error(
                "tokenizer",
                format!("end-of-sequence id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let words: Vec<Vec<u8>> = tokens
            .into_iter()
            .enumerate()
            .map(|(id, t)| match t {
                TokenBytes::Text(b) => b,
                TokenBytes::Special(name) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(
                        if name.is_empty() {
                            format!("<special_{id}>").into_bytes()
                        } else {
                            name.into_bytes()
                        }
                        .as_slice(),
                    );
                    w
                }
                TokenBytes::Unused => Vec::new(),
            })
            .collect();
        let info = TokRxInfo::new(vocab as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| error("tokenizer", e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            vocab,
            eos: eos.to_vec(),
        })
    }

    /// The vocabulary size (rows of the logits).
    pub fn vocab(&self) -> usize {
        self.vocab
    }
    /// The end-of-sequence ids.
    pub fn eos(&self) -> &[TokenId] {
        &self.eos
    }
    /// Words of a mask: `ceil(vocab / 32)`.
    pub fn mask_words(&self) -> usize {
        self.vocab.div_ceil(32)
    }
}

/// The engine's error; a bare code (`NoExtensionBias`: the lexer found no
/// token sequence at all) said in words.
fn engine_error(kind: &'static str, e: &dyn std::fmt::Display) -> ConstraintError {
    let msg = e.to_string();
    let first = msg.lines().next().unwrap_or_default();
    if first.contains(' ') {
        error(kind, msg)
    } else {
        error(
            kind,
            format!("no output of this vocabulary's tokens can match it ({first})"),
        )
    }
}

/// A regex in Rust's syntax (the parser's own error, with the position in
/// the regex as given); verbose mode (`x`), whose comments the engine does
/// not end at a newline, is refused rather than misread.
fn check_regex(rx: &str) -> Result<(), String> {
    regex_syntax::ast::parse::Parser::new()
        .parse(rx)
        .map_err(|e| format!("not a valid regex:\n{e}"))?;
    let mut rest = rx;
    while let Some(at) = rest.find("(?") {
        let flags: String = rest[at + 2..]
            .chars()
            .take_while(|&c| c != ')' && c != ':')
            .collect();
        if flags.split('-').next().is_some_and(|on| on.contains('x')) {
            return Err("the `x` flag (verbose mode, comments) is not supported: write the regex without it".into());
        }
        rest = &rest[at + 2..];
    }
    Ok(())
}

/// The JSON options when a schema names none: compact separators, no free
/// whitespace.
fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    }
}

fn json_grammar(mut schema: serde_json::Value) -> TopLevelGrammar {
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        json_options().apply_to(&mut schema);
    }
    TopLevelGrammar::from_json_schema(schema)
}

/// The longest schema, regex or grammar text [`Matcher::new`] compiles
/// (512 KiB).
pub const MAX_CONSTRAINT_BYTES: usize = 512 << 10;

/// The compiling thread's stack: llguidance's compiler recurses once per
/// nested rule (about 2.7 KB a level), so 512 KiB of the densest nesting
/// fits in it (reserved, not committed, memory).
const COMPILE_STACK_BYTES: usize = 512 << 20;

/// One request's matcher (see the crate docs).
#[derive(Clone)]
pub struct Matcher {
    inner: llguidance::Matcher,
    view: Arc<TokenizerView>,
    kind: &'static str,
}

impl std::fmt::Debug for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matcher")
            .field("kind", &self.kind)
            .field("finished", &self.inner.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Matcher {
    /// A matcher for `spec` over `view`'s vocabulary, in its first state.
    ///
    /// # Errors
    /// With the constraint's kind: a schema that is not JSON (line and
    /// column) or not a schema, a regex or grammar that does not parse (the
    /// engine's message and position), a constraint no output of the
    /// vocabulary's tokens can satisfy, one that accepts only the empty
    /// output.
    pub fn new(
        view: &Arc<TokenizerView>,
        spec: &StructuredOutput,
    ) -> Result<Self, ConstraintError> {
        let kind = spec.kind();
        let len = match spec {
            StructuredOutput::JsonSchema(t)
            | StructuredOutput::Regex(t)
            | StructuredOutput::Grammar(t) => t.len(),
            StructuredOutput::JsonObject => 0,
        };
        if len > MAX_CONSTRAINT_BYTES {
            return Err(error(
                kind,
                format!("{len} bytes: at most {MAX_CONSTRAINT_BYTES} bytes are compiled"),
            ));
        }
        // The grammar compiler recurses once per nested rule: on a thread
        // of its own with a stack that holds the deepest input allowed.
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("grammar-compile".into())
                .stack_size(COMPILE_STACK_BYTES)
                .spawn_scoped(s, || Self::compile(view, spec))
                .map_err(|e| error(kind, format!("no thread to compile it on: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(error(kind, "the grammar compiler panicked")))
        })
    }

    fn compile(
        view: &Arc<TokenizerView>,
        spec: &StructuredOutput,
    ) -> Result<Self, ConstraintError> {
        let kind = spec.kind();
        let grammar = match spec {
            StructuredOutput::JsonSchema(text) => {
                let v: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| error(kind, format!("the schema is not JSON: {e}")))?;
                if !(v.is_object() || v.is_boolean()) {
                    return Err(error(kind, "a JSON Schema is an object (or true / false)"));
                }
                json_grammar(v)
            }
            StructuredOutput::JsonObject => json_grammar(serde_json::json!({"type": "object"})),
            StructuredOutput::Regex(rx) => {
                check_regex(rx).map_err(|m| error(kind, m))?;
                TopLevelGrammar::from_regex(rx)
            }
            StructuredOutput::Grammar(g) => {
                if g.trim().is_empty() {
                    return Err(error(kind, "the grammar is empty"));
                }
                TopLevelGrammar::from_lark(g.clone())
            }
        };
        let parser = view
            .factory
            .create_parser(grammar)
            .map_err(|e| engine_error(kind, &e))?;
        let mut m = Self {
            inner: llguidance::Matcher::new(Ok(parser)),
            view: Arc::clone(view),
            kind,
        };
        // Refused before any step: nothing allowed, or only the end.
        let first = m.inner.compute_mask().map_err(|e| engine_error(kind, &e))?;
        let mut text = false;
        first.iter_set_entries(|t| text |= !view.eos.contains(&(t as TokenId)));
        if !text {
            let accepts_empty = view.eos.iter().any(|&e| first.is_allowed(e));
            return Err(error(
                kind,
                if accepts_empty {
                    "it accepts only the empty output"
                } else {
                    "no output of this vocabulary's tokens can match it"
                },
            ));
        }
        Ok(m)
    }

    /// The constraint's kind (`json_schema`, `json_object`, `regex`,
    /// `grammar`).
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

impl TokenConstraint for Matcher {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError> {
        let expected = self.view.mask_words();
        if mask.len() != expected {
            return Err(error(
                "mask",
                format!(
                    "{} words given, the vocabulary needs {expected}",
                    mask.len()
                ),
            ));
        }
        let vob = self
            .inner
            .compute_mask_or_eos()
            .map_err(|e| error("mask", e.to_string()))?;
        let words = vob.as_slice();
        for (i, w) in mask.iter_mut().enumerate() {
            *w = words.get(i).copied().unwrap_or(0);
        }
        let tail = self.view.vocab % 32;
        if tail != 0
            && let Some(last) = mask.last_mut()
        {
            *last &= (1u32 << tail) - 1;
        }
        Ok(())
    }

    fn consume(&mut self, token: TokenId) -> Result<(), ConstraintError> {
        if token as usize >= self.view.vocab {
            return Err(error(
                "consume",
                format!(
                    "token {token} is outside the vocabulary of {}",
                    self.view.vocab
                ),
            ));
        }
        // The end of a finished output: nothing left to match.
        if self.inner.is_stopped() && self.view.eos.contains(&token) {
            return Ok(());
        }
        self.inner
            .consume_token(token)
            .map_err(|e| error("consume", e.to_string()))
    }

    fn validate(&mut self, tokens: &[TokenId]) -> Result<usize, ConstraintError> {
        self.inner
            .validate_tokens(tokens)
            .map_err(|e| error("validate", e.to_string()))
    }

    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        self.inner
            .rollback(n)
            .map_err(|e| error("rollback", e.to_string()))
    }

    fn reset(&mut self) -> Result<(), ConstraintError> {
        self.inner
            .reset()
            .map_err(|e| error("reset", e.to_string()))
    }

    fn is_finished(&self) -> bool {
        self.inner.is_stopped()
    }

    fn box_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}
