//! A GGUF (v3) reader: metadata, tensor directory, and dequantisation of the
//! ggml block formats real small models ship in (`F32`, `F16`, `Q8_0`,
//! `Q4_1`) into f32.
//!
//! Layout (little-endian): magic `GGUF`, version `u32`, tensor count `u64`,
//! metadata count `u64`; the metadata (`key: string`, `type: u32`, value);
//! the tensor directory (`name: string`, `n_dims: u32`, `dims: [u64]`
//! (innermost first), `type: u32`, `offset: u64` relative to the data
//! section); padding to `general.alignment` (default 32); the data. A string
//! is a `u64` byte length and UTF-8 bytes.
//!
//! Every size read from the file is checked against the bytes that are left
//! before anything is allocated, so a truncated or hostile file is an error
//! ([`GgufError`]: the file, what was being read, the byte offset), never a
//! panic or a huge allocation.
//!
//! Block formats (ggml): `Q8_0`: blocks of 32 values, an f16 scale `d` and
//! 32 `i8` `q`: `x = d·q`. `Q4_1`: blocks of 32, f16 `d` and `m`, 16 bytes
//! of 4-bit `q` (value `j` in the low nibble of byte `j`, value `j + 16` in
//! its high nibble): `x = d·q + m`.

use std::path::{Path, PathBuf};

use half::f16;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A tensor element type this reader can dequantise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 4-bit blocks with a scale and a minimum.
    Q4_1,
    /// 8-bit blocks with a scale.
    Q8_0,
}

impl GgmlType {
    /// From ggml's type id (`ggml_type`).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        match id {
            0 => Some(GgmlType::F32),
            1 => Some(GgmlType::F16),
            3 => Some(GgmlType::Q4_1),
            8 => Some(GgmlType::Q8_0),
            _ => None,
        }
    }

    /// `(values per block, bytes per block)`.
    pub fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 => (1, 2),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `uint8` .. `int64`, `bool`: as a signed 128-bit integer.
    Int(i128),
    /// `float32`, `float64`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    Str(String),
    /// `array` (of any one type).
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            MetaValue::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
    /// The value as a float (integers too).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            MetaValue::Float(x) => Some(*x),
            MetaValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The value as an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions, innermost first (ggml order: `[columns, rows]` for a matrix).
    pub dims: Vec<u64>,
    /// Element type.
    pub kind: GgmlType,
    /// Byte offset of its data from the start of the file.
    pub offset: u64,
    /// Bytes of its data.
    pub bytes: u64,
}

impl TensorInfo {
    /// Number of values.
    pub fn len(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Whether it has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not GGUF, or a version this reader does not know.
    #[error("{}: not a GGUF v2/v3 file: {reason}", path.display())]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What was found.
        reason: String,
    },
    /// The file ends (or a size points) past its end.
    #[error("{}: truncated at byte {offset} while reading {what}: {need} bytes needed, {have} left", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read (`metadata key 12`, `tensor blk.0.attn_q.weight`, ...).
        what: String,
        /// Byte offset where it starts.
        offset: u64,
        /// Bytes it needs.
        need: u64,
        /// Bytes left in the file from there.
        have: u64,
    },
    /// Something in the file is invalid (bad UTF-8, unknown metadata type,
    /// a tensor type this reader cannot dequantise, a shape that does not fit).
    #[error("{}: byte {offset}: {what}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was being read.
        what: String,
        /// Byte offset.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A tensor or key the caller asked for is not in the file.
    #[error("{}: no {what} `{name}`", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
        /// `tensor` or `metadata key`.
        what: &'static str,
        /// The name asked for.
        name: String,
    },
}

/// A GGUF file in memory: its metadata and tensor directory.
#[derive(Debug)]
pub struct Gguf {
    path: PathBuf,
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata, in file order.
    pub metadata: Vec<(String, MetaValue)>,
    /// Tensor directory, in file order.
    pub tensors: Vec<TensorInfo>,
    bytes: Vec<u8>,
}

/// A cursor over the file's bytes that reports where it failed.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&[u8], GgufError> {
        let have = (self.bytes.len() - self.pos) as u64;
        if n > have {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                need: n,
                have,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn invalid(&self, what: String, offset: usize, reason: String) -> GgufError {
        GgufError::Invalid {
            path: self.path.to_path_buf(),
            what,
            offset: offset as u64,
            reason,
        }
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|e| self.invalid(what(), at, format!("not UTF-8: {e}")))
    }
    /// One value of metadata type `ty`; `depth` guards nested arrays.
    fn value(
        &mut self,
        ty: u32,
        what: &dyn Fn() -> String,
        depth: u32,
    ) -> Result<MetaValue, GgufError> {
        let at = self.pos;
        let int = |b: &[u8], signed: bool| -> i128 {
            let mut a = [0u8; 16];
            a[..b.len()].copy_from_slice(b);
            if signed && b.last().is_some_and(|&x| x & 0x80 != 0) {
                a[b.len()..].fill(0xff);
            }
            i128::from_le_bytes(a)
        };
        Ok(match ty {
            0 => MetaValue::Int(int(self.take(1, what)?, false)),
            1 => MetaValue::Int(int(self.take(1, what)?, true)),
            2 => MetaValue::Int(int(self.take(2, what)?, false)),
            3 => MetaValue::Int(int(self.take(2, what)?, true)),
            4 => MetaValue::Int(int(self.take(4, what)?, false)),
            5 => MetaValue::Int(int(self.take(4, what)?, true)),
            6 => MetaValue::Float(f64::from(f32::from_bits(self.u32(what)?))),
            7 => MetaValue::Bool(self.take(1, what)?[0] != 0),
            8 => MetaValue::Str(self.string(what)?),
            9 => {
                if depth > 4 {
                    return Err(self.invalid(what(), at, "arrays nested too deep".into()));
                }
                let elem = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least one byte: a count beyond the
                // bytes left is a truncated file, before any allocation.
                let left = (self.bytes.len() - self.pos) as u64;
                if n > left {
                    return Err(GgufError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("{} (an array of {n} values)", what()),
                        offset: self.pos as u64,
                        need: n,
                        have: left,
                    });
                }
                let mut out = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    out.push(self.value(elem, what, depth + 1)?);
                }
                MetaValue::Array(out)
            }
            10 => MetaValue::Int(int(self.take(8, what)?, false)),
            11 => MetaValue::Int(int(self.take(8, what)?, true)),
            12 => {
                let b = self.take(8, what)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                MetaValue::Float(f64::from_le_bytes(a))
            }
            other => {
                return Err(self.invalid(what(), at, format!("unknown metadata type {other}")));
            }
        })
    }
}

/// Whether `path` is a GGUF file: a file starting with the magic `GGUF`.
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == b"GGUF"
}

impl Gguf {
    /// Read and parse a GGUF file.
    ///
    /// # Errors
    /// [`GgufError`] naming the file, what was being read and the offset.
    pub fn read(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Gguf::from_bytes(path, bytes)
    }

    /// Parse a GGUF file already in memory (`path` names it in errors).
    ///
    /// # Errors
    /// As [`Gguf::read`].
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        let mut r = Reader {
            path,
            bytes: &bytes,
            pos: 0,
        };
        let not = |reason: String| GgufError::NotGguf {
            path: path.to_path_buf(),
            reason,
        };
        let magic = r
            .take(4, &|| "the magic".into())
            .map_err(|_| not(format!("{} bytes, too short for the header", bytes.len())))?;
        if magic != MAGIC {
            return Err(not(format!("magic {magic:?}, expected \"GGUF\"")));
        }
        let version = r.u32(&|| "the version".into())?;
        if !(2..=3).contains(&version) {
            return Err(not(format!("version {version}")));
        }
        let n_tensors = r.u64(&|| "the tensor count".into())?;
        let n_meta = r.u64(&|| "the metadata count".into())?;
        let left = (bytes.len() - r.pos) as u64;
        // A metadata entry takes at least 12 bytes, a tensor entry 24.
        if n_meta.saturating_mul(12) > left || n_tensors.saturating_mul(24) > left {
            return Err(GgufError::Truncated {
                path: path.to_path_buf(),
                what: format!("the directory ({n_meta} metadata entries, {n_tensors} tensors)"),
                offset: r.pos as u64,
                need: n_meta
                    .saturating_mul(12)
                    .saturating_add(n_tensors.saturating_mul(24)),
                have: left,
            });
        }
        let mut metadata = Vec::with_capacity(n_meta as usize);
        for i in 0..n_meta {
            let key = r.string(&|| format!("metadata key {i}"))?;
            let what = || format!("metadata `{key}`");
            let ty = r.u32(&what)?;
            let v = r.value(ty, &what, 0)?;
            metadata.push((key, v));
        }
        let alignment = metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(r.invalid(
                "metadata `general.alignment`".into(),
                r.pos,
                format!("{alignment} is not a power of two"),
            ));
        }
        let mut dir = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&|| format!("tensor {i}'s name"))?;
            let what = || format!("tensor `{name}`");
            let at = r.pos;
            let n_dims = r.u32(&what)?;
            if !(1..=4).contains(&n_dims) {
                return Err(r.invalid(
                    what(),
                    at,
                    format!("{n_dims} dimensions (1 to 4 expected)"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&what)?);
            }
            let at = r.pos;
            let ty = r.u32(&what)?;
            let kind = GgmlType::from_id(ty).ok_or_else(|| {
                r.invalid(
                    what(),
                    at,
                    format!("tensor type {ty} (this reader dequantises F32, F16, Q4_1, Q8_0)"),
                )
            })?;
            let offset = r.u64(&what)?;
            dir.push((name, dims, kind, offset, at));
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        let mut tensors = Vec::with_capacity(dir.len());
        for (name, dims, kind, offset, at) in dir {
            let invalid = |reason: String| GgufError::Invalid {
                path: path.to_path_buf(),
                what: format!("tensor `{name}`"),
                offset: at as u64,
                reason,
            };
            let len = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| invalid(format!("dimensions {dims:?} overflow")))?;
            let (per, size) = kind.block();
            if len % per != 0 || (per > 1 && dims[0] % per != 0) {
                return Err(invalid(format!(
                    "{dims:?} is not a whole number of {kind:?} blocks of {per}"
                )));
            }
            let nbytes = len / per * size;
            let start = data_start
                .checked_add(offset)
                .ok_or_else(|| invalid(format!("offset {offset} overflows")))?;
            if start % alignment != 0 {
                return Err(invalid(format!(
                    "data offset {offset} is not aligned to {alignment}"
                )));
            }
            if start.saturating_add(nbytes) > file_len {
                return Err(GgufError::Truncated {
                    path: path.to_path_buf(),
                    what: format!("tensor `{name}` ({kind:?} {dims:?})"),
                    offset: start,
                    need: nbytes,
                    have: file_len.saturating_sub(start),
                });
            }
            tensors.push(TensorInfo {
                name,
                dims,
                kind,
                offset: start,
                bytes: nbytes,
            });
        }
        Ok(Gguf {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            bytes,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata value by key.
    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A metadata value by key, or [`GgufError::Missing`].
    ///
    /// # Errors
    /// [`GgufError::Missing`].
    pub fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.meta(key).ok_or_else(|| GgufError::Missing {
            path: self.path.clone(),
            what: "metadata key",
            name: key.to_string(),
        })
    }

    /// A tensor's directory entry by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor's values as f32, in the file's order (innermost dimension
    /// fastest), with its dimensions.
    ///
    /// # Errors
    /// [`GgufError::Missing`] for a name not in the file.
    pub fn dequantize(&self, name: &str) -> Result<(Vec<f32>, Vec<u64>), GgufError> {
        let t = self.tensor(name).ok_or_else(|| GgufError::Missing {
            path: self.path.clone(),
            what: "tensor",
            name: name.to_string(),
        })?;
        // In bounds: checked when the directory was read.
        let data = &self.bytes[t.offset as usize..(t.offset + t.bytes) as usize];
        Ok((dequantize(t.kind, data), t.dims.clone()))
    }
}

/// Dequantise whole blocks of `kind` (`data.len()` a multiple of the block
/// size) into f32.
pub fn dequantize(kind: GgmlType, data: &[u8]) -> Vec<f32> {
    let h = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
    match kind {
        GgmlType::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => data.chunks_exact(2).map(h).collect(),
        GgmlType::Q8_0 => {
            let mut out = Vec::with_capacity(data.len() / 34 * 32);
            for b in data.chunks_exact(34) {
                let d = h(&b[..2]);
                out.extend(b[2..].iter().map(|&q| d * f32::from(q as i8)));
            }
            out
        }
        GgmlType::Q4_1 => {
            let mut out = Vec::with_capacity(data.len() / 20 * 32);
            for b in data.chunks_exact(20) {
                let (d, m) = (h(&b[..2]), h(&b[2..4]));
                let qs = &b[4..];
                out.extend(qs.iter().map(|&q| d * f32::from(q & 0x0f) + m));
                out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
            }
            out
        }
    }
}

/// A Llama-architecture GGUF model as a [`crate::llama2::Checkpoint`] (all
/// tensors dequantised to f32), for [`crate::llama2::Llama2::new`]: the
/// hyper-parameters from `llama.*` metadata, the context capped at
/// `max_seq_len` (the KV cache and attention cover the whole context), the
/// output projection tied to the embedding unless `output.weight` is
/// present. GGUF stores Q and K for RoPE on adjacent pairs, the rotation the
/// model applies.
///
/// # Errors
/// [`GgufError::Invalid`] for another architecture, a hyper-parameter that
/// is missing or inconsistent, or a tensor whose shape does not match them
/// (naming the tensor); [`GgufError::Missing`] for a missing tensor.
pub fn llama_checkpoint(
    g: &Gguf,
    max_seq_len: usize,
) -> Result<crate::llama2::Checkpoint, GgufError> {
    use crate::llama2::checkpoint::{Checkpoint, Config, LayerWeights};
    let invalid = |what: &str, reason: String| GgufError::Invalid {
        path: g.path.clone(),
        what: what.to_string(),
        offset: 0,
        reason,
    };
    let arch = g.require("general.architecture")?.as_str().unwrap_or("");
    if arch != "llama" {
        return Err(invalid(
            "metadata `general.architecture`",
            format!("`{arch}`: only `llama` models are supported"),
        ));
    }
    let count = |key: &str| -> Result<usize, GgufError> {
        let v = g.require(key)?;
        v.as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .filter(|&x| x > 0)
            .ok_or_else(|| {
                invalid(
                    &format!("metadata `{key}`"),
                    format!("{v:?} is not a positive count"),
                )
            })
    };
    let dim = count("llama.embedding_length")?;
    let hidden_dim = count("llama.feed_forward_length")?;
    let n_layers = count("llama.block_count")?;
    let n_heads = count("llama.attention.head_count")?;
    let n_kv_heads = match g.meta("llama.attention.head_count_kv") {
        Some(_) => count("llama.attention.head_count_kv")?,
        None => n_heads,
    };
    let context = count("llama.context_length")?;
    let rope_theta = g
        .meta("llama.rope.freq_base")
        .and_then(MetaValue::as_f64)
        .unwrap_or(crate::llama2::checkpoint::ROPE_THETA);
    if let Some(eps) = g
        .meta("llama.attention.layer_norm_rms_epsilon")
        .and_then(MetaValue::as_f64)
        && (eps - crate::llama2::model::RMS_EPS).abs() > 1e-9
    {
        return Err(invalid(
            "metadata `llama.attention.layer_norm_rms_epsilon`",
            format!("{eps}: the model's RMSNorm uses 1e-5"),
        ));
    }
    if !dim.is_multiple_of(n_heads)
        || !n_heads.is_multiple_of(n_kv_heads)
        || !(dim / n_heads).is_multiple_of(2)
    {
        return Err(invalid(
            "the attention heads",
            format!("dim {dim}, {n_heads} heads, {n_kv_heads} kv heads do not divide evenly"),
        ));
    }
    let emb = g
        .tensor("token_embd.weight")
        .ok_or_else(|| GgufError::Missing {
            path: g.path.clone(),
            what: "tensor",
            name: "token_embd.weight".into(),
        })?;
    let vocab_size = match emb.dims.as_slice() {
        [d, v] if *d as usize == dim => *v as usize,
        other => {
            return Err(invalid(
                "tensor `token_embd.weight`",
                format!("dimensions {other:?}, expected [{dim}, vocab]"),
            ));
        }
    };
    let head_size = dim / n_heads;
    let kv_dim = n_kv_heads * head_size;
    // A tensor's values with the expected ggml dimensions `[in, out]` / `[n]`.
    let load = |name: &str, want: &[usize]| -> Result<Vec<f32>, GgufError> {
        let (v, dims) = g.dequantize(name)?;
        if dims.iter().map(|&d| d as usize).ne(want.iter().copied()) {
            return Err(invalid(
                &format!("tensor `{name}`"),
                format!("dimensions {dims:?}, the metadata implies {want:?}"),
            ));
        }
        Ok(v)
    };
    let mut layers = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let t = |s: &str| format!("blk.{l}.{s}.weight");
        layers.push(LayerWeights {
            rms_att: load(&t("attn_norm"), &[dim])?,
            wq: load(&t("attn_q"), &[dim, dim])?,
            wk: load(&t("attn_k"), &[dim, kv_dim])?,
            wv: load(&t("attn_v"), &[dim, kv_dim])?,
            wo: load(&t("attn_output"), &[dim, dim])?,
            rms_ffn: load(&t("ffn_norm"), &[dim])?,
            w1: load(&t("ffn_gate"), &[dim, hidden_dim])?,
            w2: load(&t("ffn_down"), &[hidden_dim, dim])?,
            w3: load(&t("ffn_up"), &[dim, hidden_dim])?,
        });
    }
    let wcls = match g.tensor("output.weight") {
        Some(_) => Some(load("output.weight", &[dim, vocab_size])?),
        None => None,
    };
    Ok(Checkpoint {
        path: g.path.clone(),
        config: Config {
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab_size,
            seq_len: context.min(max_seq_len.max(1)),
            shared_classifier: wcls.is_none(),
            rope_theta,
        },
        token_embedding: load("token_embd.weight", &[dim, vocab_size])?,
        layers,
        rms_final: load("output_norm.weight", &[dim])?,
        wcls,
    })
}
