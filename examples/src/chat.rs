//! The tokenizer and chat template of a GGUF chat model.
//!
//! * The byte-level BPE (`tokenizer.ggml.model = gpt2`) is built with the
//!   `tokenizers` crate from the file's vocabulary and merges: the GPT-2 /
//!   SmolLM pre-tokenisation (single digits, then the GPT-2 byte-level split,
//!   no prefix space) and the byte-level decoder; control tokens
//!   (`tokenizer.ggml.token_type = 3`, e.g. `<|im_start|>`) are special
//!   tokens, matched whole in the text.
//! * The chat template (`tokenizer.chat_template`, Hugging Face's Jinja
//!   template) is rendered with `minijinja`, with `messages`,
//!   `add_generation_prompt`, `bos_token` and `eos_token`.

use std::path::PathBuf;

use minijinja::{Environment, context};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer};

use crate::gguf::{Gguf, GgufError, MetaValue};

/// What can go wrong building or using a GGUF model's tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The GGUF file lacks or garbles a tokenizer key.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The `tokenizers` crate refused the vocabulary or an input.
    #[error("{}: tokenizer: {message}", path.display())]
    Tokenizer {
        /// The model file.
        path: PathBuf,
        /// The crate's message.
        message: String,
    },
    /// The chat template does not parse or render.
    #[error("{}: chat template: {message}", path.display())]
    Template {
        /// The model file.
        path: PathBuf,
        /// minijinja's message (with the template line).
        message: String,
    },
    /// The file has no chat template.
    #[error("{}: no `tokenizer.chat_template` in the file", path.display())]
    NoTemplate {
        /// The model file.
        path: PathBuf,
    },
}

/// GPT-2's byte-level alphabet, inverted: the byte a vocabulary character
/// stands for. Printable Latin-1 bytes (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) stand
/// for themselves; the other 68 bytes, in increasing order, are U+0100
/// onwards.
fn byte_table() -> [Option<u8>; 256 + 68] {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut table = [None; 256 + 68];
    let mut n = 0u32;
    for b in 0..=255u32 {
        let c = if printable(b) {
            b
        } else {
            n += 1;
            255 + n
        };
        table[c as usize] = Some(b as u8);
    }
    table
}

/// A chat message: `role` (`system`, `user`, `assistant`) and `content`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    /// Who speaks.
    pub role: String,
    /// What they say.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A GGUF chat model's tokenizer and chat template.
pub struct ChatTokenizer {
    path: PathBuf,
    tokenizer: Tokenizer,
    template: Option<String>,
    /// Beginning-of-sequence token id (`tokenizer.ggml.bos_token_id`).
    pub bos: u32,
    /// End-of-sequence (end of turn) token id (`tokenizer.ggml.eos_token_id`).
    pub eos: u32,
    tokens: Vec<String>,
    /// Per id: a control token (`tokenizer.ggml.token_type` 3), matched
    /// whole and never part of text.
    control: Vec<bool>,
    /// GPT-2's byte alphabet inverted (by character), built once.
    byte_of: [Option<u8>; 256 + 68],
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("path", &self.path)
            .field("vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

fn strings(g: &Gguf, key: &str) -> Result<Vec<String>, ChatError> {
    let v = g.require(key)?;
    let invalid = || GgufError::Invalid {
        path: g.path().to_path_buf(),
        what: format!("metadata `{key}`"),
        offset: 0,
        reason: "not an array of strings".into(),
    };
    v.as_array()
        .ok_or_else(invalid)?
        .iter()
        .map(|s| s.as_str().map(str::to_string).ok_or_else(invalid))
        .collect::<Result<_, _>>()
        .map_err(ChatError::from)
}

impl ChatTokenizer {
    /// The tokenizer of a GGUF file with a `gpt2` (byte-level BPE) vocabulary.
    ///
    /// # Errors
    /// [`ChatError::Gguf`] for missing or malformed tokenizer keys (another
    /// tokenizer model included); [`ChatError::Tokenizer`] if the crate
    /// refuses the vocabulary.
    pub fn from_gguf(g: &Gguf) -> Result<Self, ChatError> {
        let path = g.path().to_path_buf();
        let model = g.require("tokenizer.ggml.model")?.as_str().unwrap_or("");
        if model != "gpt2" {
            return Err(GgufError::Invalid {
                path,
                what: "metadata `tokenizer.ggml.model`".into(),
                offset: 0,
                reason: format!("`{model}`: only byte-level BPE (`gpt2`) is supported"),
            }
            .into());
        }
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = strings(g, "tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| match m.split_once(' ') {
                Some((a, b)) => Ok((a.to_string(), b.to_string())),
                None => Err(GgufError::Invalid {
                    path: path.clone(),
                    what: "metadata `tokenizer.ggml.merges`".into(),
                    offset: 0,
                    reason: format!("merge `{m}` is not two tokens"),
                }),
            })
            .collect::<Result<_, _>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let tk_err = |e: Box<dyn std::error::Error + Send + Sync>| ChatError::Tokenizer {
            path: path.clone(),
            message: e.to_string(),
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tk_err)?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        // Control tokens are matched whole and never split.
        let mut control = vec![false; tokens.len()];
        if let Some(types) = g
            .meta("tokenizer.ggml.token_type")
            .and_then(MetaValue::as_array)
        {
            for (c, ty) in control.iter_mut().zip(types) {
                *c = ty.as_u64() == Some(3);
            }
            let special: Vec<AddedToken> = types
                .iter()
                .zip(&tokens)
                .filter(|(ty, _)| ty.as_u64() == Some(3))
                .map(|(_, t)| AddedToken::from(t.clone(), true))
                .collect();
            tokenizer.add_special_tokens(&special);
        }
        let id = |key: &str, default: u32| {
            g.meta(key)
                .and_then(MetaValue::as_u64)
                .and_then(|x| u32::try_from(x).ok())
                .unwrap_or(default)
        };
        Ok(Self {
            bos: id("tokenizer.ggml.bos_token_id", 1),
            eos: id("tokenizer.ggml.eos_token_id", 2),
            template: g
                .meta("tokenizer.chat_template")
                .and_then(MetaValue::as_str)
                .map(str::to_string),
            tokenizer,
            tokens,
            control,
            byte_of: byte_table(),
            path,
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The raw bytes of token `id`: a byte-level token's characters mapped
    /// back through GPT-2's byte alphabet, a special token's text as written;
    /// empty for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let byte = |c: char| self.byte_of.get(c as usize).copied().flatten();
        match t.chars().map(byte).collect::<Option<Vec<u8>>>() {
            Some(bytes) => bytes,
            // Not in the byte alphabet: a special token, written as is.
            None => t.as_bytes().to_vec(),
        }
    }

    /// Token ids of `text`; special tokens written in the text (e.g.
    /// `<|im_start|>`) become their ids. No BOS is added.
    ///
    /// # Errors
    /// [`ChatError::Tokenizer`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| ChatError::Tokenizer {
                path: self.path.clone(),
                message: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids` (special tokens included, as written).
    ///
    /// # Errors
    /// [`ChatError::Tokenizer`] (an id outside the vocabulary).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ChatError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| ChatError::Tokenizer {
                path: self.path.clone(),
                message: e.to_string(),
            })
    }

    /// The file's chat template applied to `messages`, with the assistant's
    /// turn opened when `add_generation_prompt`.
    ///
    /// # Errors
    /// [`ChatError::NoTemplate`], [`ChatError::Template`].
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let template = self
            .template
            .as_deref()
            .ok_or_else(|| ChatError::NoTemplate {
                path: self.path.clone(),
            })?;
        let terr = |e: minijinja::Error| ChatError::Template {
            path: self.path.clone(),
            message: e.to_string(),
        };
        let mut env = Environment::new();
        env.add_template("chat", template).map_err(terr)?;
        let name = |id: u32| self.tokens.get(id as usize).cloned().unwrap_or_default();
        env.get_template("chat")
            .map_err(terr)?
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => name(self.bos),
                eos_token => name(self.eos),
            })
            .map_err(terr)
    }
}

impl crate::llama2::generate::TextCodec for ChatTokenizer {
    fn piece_bytes(&self, _prev: Option<u32>, id: u32) -> Vec<u8> {
        if id == self.bos || id == self.eos {
            return Vec::new();
        }
        self.token_bytes(id)
    }
    fn token_text(&self, id: u32) -> Option<String> {
        self.tokens
            .get(id as usize)
            .map(|_| String::from_utf8_lossy(&self.token_bytes(id)).into_owned())
    }
    fn stop_ids(&self) -> Vec<u32> {
        vec![self.eos, self.bos]
    }
    fn bos(&self) -> Option<u32> {
        Some(self.bos)
    }
    fn grammar_token(&self, id: u32) -> sampler_structured::TokenBytes {
        use sampler_structured::TokenBytes;
        let Some(t) = self.tokens.get(id as usize) else {
            return TokenBytes::Unused;
        };
        let byte = |c: char| self.byte_of.get(c as usize).copied().flatten();
        let text: Option<Vec<u8>> = t.chars().map(byte).collect();
        match text {
            Some(bytes) if !self.control.get(id as usize).copied().unwrap_or(false) => {
                TokenBytes::Text(bytes)
            }
            _ => TokenBytes::Special(t.clone()),
        }
    }
}
