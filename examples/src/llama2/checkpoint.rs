//! Reader for llama2.c's legacy ("version 0") checkpoint format.
//!
//! Layout (all little-endian): a header of seven `i32` (`dim`, `hidden_dim`,
//! `n_layers`, `n_heads`, `n_kv_heads`, `vocab_size`, `seq_len`), then `f32`
//! weights in a fixed order, each matrix row-major `(out_features, in_features)`.
//! A negative `vocab_size` means the classifier is stored separately at the
//! end instead of being shared with the token embedding.

use std::path::{Path, PathBuf};

use super::Llama2Error;

/// Bytes in the checkpoint header (seven `i32`).
pub const HEADER_BYTES: usize = 28;

/// RoPE base frequency of llama2.c checkpoints (GGUF files give their own:
/// [`Config::rope_theta`]).
pub const ROPE_THETA: f64 = 10_000.0;

/// Hyper-parameters from a checkpoint header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Model (residual stream) width.
    pub dim: usize,
    /// Width of the SwiGLU feed-forward hidden layer.
    pub hidden_dim: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention: query head `h` reads kv head
    /// `h / (n_heads / n_kv_heads)`).
    pub n_kv_heads: usize,
    /// Vocabulary size (tokens).
    pub vocab_size: usize,
    /// Context length (positions).
    pub seq_len: usize,
    /// Whether the classifier shares the token-embedding matrix.
    pub shared_classifier: bool,
    /// RoPE base frequency (llama2.c: 10000; a GGUF file's
    /// `<arch>.rope.freq_base`).
    pub rope_theta: f64,
}

impl Config {
    /// Width of one attention head: `dim / n_heads`.
    pub fn head_size(&self) -> usize {
        self.dim / self.n_heads
    }

    /// Width of the key/value projections: `n_kv_heads * head_size`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_size()
    }

    /// Parse and validate a 28-byte header.
    ///
    /// # Errors
    /// [`Llama2Error::BadHeader`] when a field is not positive or the head
    /// geometry is inconsistent (`dim` not divisible by `n_heads`, `n_heads`
    /// not divisible by `n_kv_heads`, odd head size).
    pub fn from_header(path: &Path, header: &[u8; HEADER_BYTES]) -> Result<Self, Llama2Error> {
        let mut f = [0i32; 7];
        for (i, v) in f.iter_mut().enumerate() {
            *v = i32::from_le_bytes([
                header[4 * i],
                header[4 * i + 1],
                header[4 * i + 2],
                header[4 * i + 3],
            ]);
        }
        let bad = |reason: String| Llama2Error::BadHeader {
            path: path.to_path_buf(),
            reason,
        };
        let names = [
            "dim",
            "hidden_dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "vocab_size",
            "seq_len",
        ];
        for (i, (&v, name)) in f.iter().zip(names).enumerate() {
            // vocab_size may be negative (separate classifier), never zero.
            let ok = if i == 5 {
                v != 0 && v != i32::MIN
            } else {
                v > 0
            };
            if !ok {
                return Err(bad(format!("{name} = {v}, expected a positive integer")));
            }
        }
        let [
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab,
            seq_len,
        ] = f;
        let cfg = Config {
            dim: dim as usize,
            hidden_dim: hidden_dim as usize,
            n_layers: n_layers as usize,
            n_heads: n_heads as usize,
            n_kv_heads: n_kv_heads as usize,
            vocab_size: vocab.unsigned_abs() as usize,
            seq_len: seq_len as usize,
            shared_classifier: vocab > 0,
            rope_theta: ROPE_THETA,
        };
        if !cfg.dim.is_multiple_of(cfg.n_heads) {
            return Err(bad(format!(
                "dim = {} is not divisible by n_heads = {}",
                cfg.dim, cfg.n_heads
            )));
        }
        if !cfg.n_heads.is_multiple_of(cfg.n_kv_heads) {
            return Err(bad(format!(
                "n_heads = {} is not divisible by n_kv_heads = {}",
                cfg.n_heads, cfg.n_kv_heads
            )));
        }
        if !cfg.head_size().is_multiple_of(2) {
            return Err(bad(format!(
                "head size dim / n_heads = {} is odd; rotary embeddings need pairs",
                cfg.head_size()
            )));
        }
        Ok(cfg)
    }

    /// Number of `f32` values after the header, including the legacy RoPE
    /// tables and, when not shared, the classifier.
    pub fn weight_floats(&self) -> u128 {
        let (d, h, l, v, s) = (
            self.dim as u128,
            self.hidden_dim as u128,
            self.n_layers as u128,
            self.vocab_size as u128,
            self.seq_len as u128,
        );
        let kv = self.kv_dim() as u128;
        let hs = self.head_size() as u128;
        let mut n = v * d // token embedding
            + l * d // rms_att
            + l * d * d // wq
            + 2 * l * kv * d // wk, wv
            + l * d * d // wo
            + l * d // rms_ffn
            + 3 * l * h * d // w1, w2, w3
            + d // rms_final
            + s * hs; // freq_cis real + imag: 2 * seq_len * head_size / 2
        if !self.shared_classifier {
            n += v * d;
        }
        n
    }

    /// Exact size of a checkpoint file with this header, in bytes.
    pub fn file_bytes(&self) -> u128 {
        HEADER_BYTES as u128 + 4 * self.weight_floats()
    }
}

/// Weights of one transformer block, host-side, row-major `(out, in)`.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// Attention RMSNorm gain, `[dim]`.
    pub rms_att: Vec<f32>,
    /// Query projection, `[dim, dim]`.
    pub wq: Vec<f32>,
    /// Key projection, `[kv_dim, dim]`.
    pub wk: Vec<f32>,
    /// Value projection, `[kv_dim, dim]`.
    pub wv: Vec<f32>,
    /// Attention output projection, `[dim, dim]`.
    pub wo: Vec<f32>,
    /// Feed-forward RMSNorm gain, `[dim]`.
    pub rms_ffn: Vec<f32>,
    /// SwiGLU gate projection, `[hidden_dim, dim]`.
    pub w1: Vec<f32>,
    /// SwiGLU down projection, `[dim, hidden_dim]`.
    pub w2: Vec<f32>,
    /// SwiGLU up projection, `[hidden_dim, dim]`.
    pub w3: Vec<f32>,
}

/// A whole checkpoint in host memory (the legacy RoPE tables are skipped:
/// the model computes its own).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Where it was read from.
    pub path: PathBuf,
    /// Hyper-parameters.
    pub config: Config,
    /// Token embedding, `[vocab, dim]`.
    pub token_embedding: Vec<f32>,
    /// Per-layer weights, `n_layers` of them.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm gain, `[dim]`.
    pub rms_final: Vec<f32>,
    /// Classifier `[vocab, dim]`; `None` when shared with the embedding.
    pub wcls: Option<Vec<f32>>,
}

impl Checkpoint {
    /// Read a checkpoint file.
    ///
    /// # Errors
    /// [`Llama2Error::Io`] when the file cannot be read,
    /// [`Llama2Error::Truncated`] when it is shorter than its header says
    /// (expected and actual byte counts), [`Llama2Error::BadHeader`] for an
    /// invalid header, [`Llama2Error::TrailingBytes`] when it is longer.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, Llama2Error> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Llama2Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(path, &bytes)
    }

    /// Parse checkpoint bytes; `path` only names the source in errors.
    ///
    /// # Errors
    /// As [`Checkpoint::read`], without the I/O case.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, Llama2Error> {
        let Some(header) = bytes.first_chunk::<HEADER_BYTES>() else {
            return Err(Llama2Error::Truncated {
                path: path.to_path_buf(),
                what: "checkpoint header".into(),
                expected: HEADER_BYTES as u128,
                actual: bytes.len() as u128,
            });
        };
        let config = Config::from_header(path, header)?;
        let expected = config.file_bytes();
        let actual = bytes.len() as u128;
        if actual < expected {
            return Err(Llama2Error::Truncated {
                path: path.to_path_buf(),
                what: format!(
                    "checkpoint (dim {}, {} layers, vocab {})",
                    config.dim, config.n_layers, config.vocab_size
                ),
                expected,
                actual,
            });
        }
        if actual > expected {
            return Err(Llama2Error::TrailingBytes {
                path: path.to_path_buf(),
                expected,
                actual,
            });
        }

        let mut reader = FloatReader {
            bytes: &bytes[HEADER_BYTES..],
        };
        let c = config;
        let (d, h, l, kv) = (c.dim, c.hidden_dim, c.n_layers, c.kv_dim());
        let token_embedding = reader.take(c.vocab_size * d);
        let rms_att = reader.take_layers(l, d);
        let wq = reader.take_layers(l, d * d);
        let wk = reader.take_layers(l, kv * d);
        let wv = reader.take_layers(l, kv * d);
        let wo = reader.take_layers(l, d * d);
        let rms_ffn = reader.take_layers(l, d);
        let w1 = reader.take_layers(l, h * d);
        let w2 = reader.take_layers(l, d * h);
        let w3 = reader.take_layers(l, h * d);
        let rms_final = reader.take(d);
        reader.skip(c.seq_len * c.head_size()); // legacy freq_cis_real + imag
        let wcls = (!c.shared_classifier).then(|| reader.take(c.vocab_size * d));

        let mut it = [rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3].map(Vec::into_iter);
        let layers = (0..l)
            .map(|_| {
                let [rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3] =
                    it.each_mut().map(|i| i.next().unwrap_or_default());
                LayerWeights {
                    rms_att,
                    wq,
                    wk,
                    wv,
                    wo,
                    rms_ffn,
                    w1,
                    w2,
                    w3,
                }
            })
            .collect();
        Ok(Checkpoint {
            path: path.to_path_buf(),
            config,
            token_embedding,
            layers,
            rms_final,
            wcls,
        })
    }

    /// Number of parameters, excluding the legacy RoPE tables.
    pub fn n_params(&self) -> usize {
        let c = &self.config;
        (self.config.weight_floats() - (c.seq_len * c.head_size()) as u128) as usize
    }
}

/// Sequential `f32` reader over a buffer whose length was checked up front.
struct FloatReader<'a> {
    bytes: &'a [u8],
}

impl FloatReader<'_> {
    fn take(&mut self, n: usize) -> Vec<f32> {
        let (head, rest) = self.bytes.split_at(4 * n);
        self.bytes = rest;
        head.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn take_layers(&mut self, layers: usize, per_layer: usize) -> Vec<Vec<f32>> {
        (0..layers).map(|_| self.take(per_layer)).collect()
    }

    fn skip(&mut self, n: usize) {
        self.bytes = &self.bytes[4 * n..];
    }
}
