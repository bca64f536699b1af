//! Structured outputs for the example apps: the grammar engine's view of a
//! model's tokenizer (built once per model) and a matcher per request.
//!
//! `generate --json-schema FILE | --json-object | --regex RE | --grammar
//! FILE`, `serve`'s request lines (`response_format`, `guided_json`,
//! `guided_regex`, `guided_grammar`, `guided_choice`, or a `toml` chain's
//! `[structured]`) and the HTTP server's `response_format` all end here.

use std::path::Path;
use std::sync::Arc;

use sampler_core::{ConstraintError, StructuredOutput, TokenConstraint, TokenId};
use sampler_structured::{Matcher, TokenizerView};

use crate::llama2::generate::TextCodec;

/// The grammar engine's view of `codec` over a model's `vocab` output rows
/// (rows past the tokenizer's vocabulary are never allowed); the model's
/// stop ids end a finished output.
///
/// # Errors
/// A vocabulary the engine refuses (kind `tokenizer`).
pub fn view(codec: &dyn TextCodec, vocab: usize) -> Result<TokenizerView, ConstraintError> {
    let tokens = (0..vocab as TokenId)
        .map(|id| codec.grammar_token(id))
        .collect();
    let eos: Vec<TokenId> = codec
        .stop_ids()
        .into_iter()
        .filter(|&t| (t as usize) < vocab)
        .collect();
    TokenizerView::new(tokens, &eos)
}

/// A request's matcher.
///
/// # Errors
/// An invalid schema, regex or grammar, or one no output can satisfy
/// ([`Matcher::new`]).
pub fn matcher(
    view: &Arc<TokenizerView>,
    spec: &StructuredOutput,
) -> Result<Box<dyn TokenConstraint>, ConstraintError> {
    Ok(Box::new(Matcher::new(view, spec)?))
}

/// The structured output the command-line flags ask for (at most one is
/// given; clap enforces it): a JSON Schema file, any JSON object, a regex,
/// a Lark grammar file.
///
/// # Errors
/// An unreadable file, with its flag and path.
pub fn from_flags(
    json_schema: Option<&Path>,
    json_object: bool,
    regex: Option<&str>,
    grammar: Option<&Path>,
) -> Result<Option<StructuredOutput>, String> {
    let read = |flag: &str, p: &Path| {
        std::fs::read_to_string(p).map_err(|e| format!("{flag} {}: {e}", p.display()))
    };
    Ok(if let Some(p) = json_schema {
        Some(StructuredOutput::JsonSchema(read("--json-schema", p)?))
    } else if json_object {
        Some(StructuredOutput::JsonObject)
    } else if let Some(r) = regex {
        Some(StructuredOutput::Regex(r.to_string()))
    } else if let Some(p) = grammar {
        Some(StructuredOutput::Grammar(read("--grammar", p)?))
    } else {
        None
    })
}
