//! Text generation with a llama2.c checkpoint on burn.
//!
//! * [`checkpoint`]: the llama2.c legacy checkpoint format ([`Checkpoint`], [`Config`]);
//! * [`tokenizer`]: llama2.c's `.bin` tokenizer ([`Tokenizer`]: encode and decode);
//! * [`generate`]: the generation loop (model logits -> sampler executor on the same device);
//! * [`model`]: the Llama-2 forward pass on any run-time `Device` ([`Llama2`], [`KvCache`]);
//! * [`ModelFiles`]: find the checkpoint and tokenizer in a model directory.
//!
//! The format and the verification data are described in
//! `models/stories260K/README.md`; `docs/generate.md` shows the CLI.

use std::path::{Path, PathBuf};

use sampler_core::TokenId;

pub mod checkpoint;
pub mod generate;
pub mod model;
pub mod tokenizer;

pub use checkpoint::{Checkpoint, Config};
pub use model::{BatchKvCache, KvCache, Llama2};
pub use tokenizer::{BOS, EOS, Tokenizer};

/// Everything that can go wrong loading or running a llama2.c model.
#[derive(Debug, thiserror::Error)]
pub enum Llama2Error {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint header is invalid.
    #[error("{}: invalid checkpoint header: {reason}", path.display())]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file is shorter than its header says.
    #[error("{}: truncated {what}: expected {expected} bytes, found {actual}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read.
        what: String,
        /// Bytes the header implies.
        expected: u128,
        /// Bytes in the file.
        actual: u128,
    },
    /// A checkpoint is longer than its header says (not the llama2.c legacy format?).
    #[error(
        "{}: checkpoint has {actual} bytes but its header implies {expected}; \
         only llama2.c's legacy (version 0) format is supported",
        path.display()
    )]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Bytes the header implies.
        expected: u128,
        /// Bytes in the file.
        actual: u128,
    },
    /// The tokenizer's vocabulary does not match the model's.
    #[error(
        "{}: tokenizer holds {actual} tokens but the model's vocabulary has {expected}",
        path.display()
    )]
    VocabMismatch {
        /// The tokenizer file.
        path: PathBuf,
        /// The checkpoint's vocab_size.
        expected: usize,
        /// Tokens in the tokenizer file.
        actual: usize,
    },
    /// A malformed tokenizer entry.
    #[error("{}: malformed tokenizer at byte {offset}: {reason}", path.display())]
    BadTokenizer {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad entry.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
    /// Model files could not be located.
    #[error("{0}")]
    ModelFiles(String),
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary (0..{vocab})")]
    TokenOutOfRange {
        /// The id.
        token: TokenId,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The context window is full.
    #[error("position {pos} is beyond the model's context of {seq_len} tokens")]
    ContextFull {
        /// The position asked for.
        pos: usize,
        /// The model's context length.
        seq_len: usize,
    },
    /// A KV cache from [`Llama2::new_cache`] of a model with another shape.
    #[error("the KV cache was made for a model of another shape; use this model's new_cache()")]
    CacheMismatch,
    /// The prompt does not fit the context.
    #[error("the prompt is {tokens} tokens (with BOS) but the model's context is {seq_len} tokens")]
    PromptTooLong {
        /// Prompt tokens including BOS.
        tokens: usize,
        /// The model's context length.
        seq_len: usize,
    },
}

/// The two files of a llama2.c model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// The checkpoint (`*.bin`).
    pub checkpoint: PathBuf,
    /// The tokenizer (`tokenizer.bin` or `tok*.bin`).
    pub tokenizer: PathBuf,
}

fn is_tokenizer_name(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "tokenizer.bin" || n.starts_with("tok"))
}

impl ModelFiles {
    /// Locate a model. `model` is a directory holding one checkpoint `*.bin`
    /// and a tokenizer (`tokenizer.bin` or `tok*.bin`), or a checkpoint file.
    /// An explicit `tokenizer` overrides the search.
    ///
    /// # Errors
    /// [`Llama2Error::ModelFiles`] naming the path and what was (not) found.
    pub fn locate(model: &Path, tokenizer: Option<&Path>) -> Result<Self, Llama2Error> {
        let err = |m: String| Err(Llama2Error::ModelFiles(m));
        if !model.exists() {
            return err(format!("model path {} does not exist", model.display()));
        }
        let (dir, checkpoint) = if model.is_dir() {
            (model.to_path_buf(), None)
        } else {
            let dir = model.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, Some(model.to_path_buf()))
        };
        let mut bins: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "bin"))
                .collect(),
            Err(e) => return err(format!("cannot list {}: {e}", dir.display())),
        };
        bins.sort();
        let tokenizer = match tokenizer {
            Some(t) => t.to_path_buf(),
            None => {
                let named = dir.join("tokenizer.bin");
                if named.is_file() {
                    named
                } else if let Some(t) = bins.iter().find(|p| is_tokenizer_name(p)) {
                    t.clone()
                } else {
                    return err(format!(
                        "no tokenizer (tokenizer.bin or tok*.bin) in {}; pass --tokenizer FILE",
                        dir.display()
                    ));
                }
            }
        };
        let checkpoint = match checkpoint {
            Some(c) => c,
            None => {
                let cands: Vec<&PathBuf> = bins
                    .iter()
                    .filter(|p| **p != tokenizer && !is_tokenizer_name(p))
                    .collect();
                match cands.as_slice() {
                    [one] => (*one).clone(),
                    [] => {
                        return err(format!(
                            "no checkpoint (*.bin other than the tokenizer) in {}",
                            dir.display()
                        ));
                    }
                    many => {
                        let names: Vec<String> =
                            many.iter().map(|p| p.display().to_string()).collect();
                        return err(format!(
                            "several checkpoints in {} ({}); pass --model FILE",
                            dir.display(),
                            names.join(", ")
                        ));
                    }
                }
            }
        };
        Ok(ModelFiles {
            checkpoint,
            tokenizer,
        })
    }

    /// Read the checkpoint and a tokenizer with the checkpoint's vocabulary size.
    ///
    /// # Errors
    /// Any loader error of [`Checkpoint::read`] or [`Tokenizer::read`].
    pub fn load(&self) -> Result<(Checkpoint, Tokenizer), Llama2Error> {
        let ckpt = Checkpoint::read(&self.checkpoint)?;
        let tok = Tokenizer::read(&self.tokenizer, ckpt.config.vocab_size)?;
        Ok((ckpt, tok))
    }
}
