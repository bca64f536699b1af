//! The Llama-2 forward pass on burn tensors, on any run-time [`Device`].
//!
//! One token per call (llama2.c's decoding loop): RMSNorm, rotary position
//! embeddings, grouped-query attention over a device-resident KV cache, and
//! a SwiGLU feed-forward block; the result is a `[1, vocab]` logits tensor
//! that stays on the device.
//!
//! In [`Llama2::forward`] every tensor keeps the same shape at every
//! position: the cache is written through a one-hot position mask and
//! attention covers the whole context with future positions masked out. On
//! the cubecl backends (wgpu, vulkan, cuda) that means each kernel compiles
//! once rather than once per position. [`Llama2::forward_batch`] instead
//! writes the cache in place and attends over the positions its call can
//! see, so its shapes follow the batch (rows, furthest position): faster,
//! at the cost of a kernel choice per shape on cubecl.

use burn_tensor::activation::{silu, softmax};
use burn_tensor::{Device, Int, Tensor, TensorData};
use sampler_core::TokenId;

use super::Llama2Error;
use super::checkpoint::{Checkpoint, Config};

// Defined next to the checkpoint reader that sets it; kept reachable here.
pub use super::checkpoint::ROPE_THETA;

/// RMSNorm epsilon (llama2.c and the reference implementation use 1e-5).
pub const RMS_EPS: f64 = 1e-5;

/// One transformer block's weights on the device, matrices stored `[in, out]`
/// so that `y = x.matmul(w)` for a row vector `x`.
#[derive(Debug, Clone)]
///
/// The query, key and value projections are one `[dim, dim + 2 * kv_dim]`
/// matrix (columns `q | k | v`), and the SwiGLU gate and up projections one
/// `[dim, 2 * hidden]` matrix (`gate | up`): fewer, larger ops per token.
struct Block {
    rms_att: Tensor<2>, // [1, dim]
    wqkv: Tensor<2>,    // [dim, dim + 2 * kv_dim]
    wo: Tensor<2>,      // [dim, dim]
    rms_ffn: Tensor<2>, // [1, dim]
    w13: Tensor<2>,     // [dim, 2 * hidden]
    w2: Tensor<2>,      // [hidden, dim]
}

/// A Llama-2 model resident on one device.
#[derive(Debug, Clone)]
pub struct Llama2 {
    config: Config,
    device: Device,
    embedding: Tensor<2>, // [vocab, dim]
    blocks: Vec<Block>,
    rms_final: Tensor<2>,      // [1, dim]
    classifier: Tensor<2>,     // [dim, vocab]
    rope_cos: Tensor<2>,       // [seq_len, head_size / 2]
    rope_sin: Tensor<2>,       // [seq_len, head_size / 2]
    positions: Tensor<1, Int>, // [seq_len]: 0, 1, ..
    /// Attention as a broadcast product and a sum (a fused reduction) rather
    /// than two matmuls: on the cubecl devices (see [`attend`]).
    fused_attention: bool,
}

/// Keys and values of every past position, one pair of tensors per layer,
/// each `[n_kv_heads, seq_len, head_size]` on the model's device.
#[derive(Debug, Clone)]
pub struct KvCache {
    k: Vec<Tensor<3>>,
    v: Vec<Tensor<3>>,
}

/// Keys and values of up to `slots` sequences at once, for
/// [`Llama2::forward_batch`]: per layer `[slots · seq_len, kv_dim]` on the
/// model's device (row `slot · seq_len + position`). A sequence keeps its
/// slot while it runs; a slot is reused by writing from position 0 again.
#[derive(Debug, Clone)]
pub struct BatchKvCache {
    k: Vec<Tensor<2>>,
    v: Vec<Tensor<2>>,
    slots: usize,
}

impl BatchKvCache {
    /// Sequences it holds.
    pub fn slots(&self) -> usize {
        self.slots
    }
}

/// Upload a row-major `(rows, cols)` matrix as a `[cols, rows]` tensor
/// (transposed on the host so the device copy is contiguous).
fn upload_t(w: &[f32], rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    let mut t = vec![0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    Tensor::from_data(TensorData::new(t, [cols, rows]), device)
}

fn upload_row(w: &[f32], device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(w.to_vec(), [1, w.len()]), device)
}

/// `w ⊙ x / sqrt(mean(x²) + eps)` over the last dimension of `x: [rows, dim]`.
fn rmsnorm(x: Tensor<2>, w: &Tensor<2>) -> Tensor<2> {
    let ms = x.clone().powi_scalar(2).mean_dim(1); // [1, 1]
    x.div(ms.add_scalar(RMS_EPS).sqrt()).mul(w.clone())
}

/// The largest broadcast product (`B · heads · S · head_size` elements, 16
/// MiB of f32) that [`attend`] sums as a fused reduction on a cubecl device:
/// every decode step of stories260K (32 Ki) and of SmolLM2 up to a context
/// of 7281 (`9 · 64 · S`), and short prefills.
pub const FUSED_ATTENTION_MAX: usize = 1 << 22;

/// Grouped-query attention of one query per head over a sequence of keys
/// and values: `q: [B, n_kv, group, hs]` (query head `kv · group + g` reads
/// kv head `kv`), `k`, `v: [B, n_kv, S, hs]`, `future: [B, n_kv, group, S]`
/// (true = masked); returns `[B, n_kv, group, hs]`.
///
/// On a CPU device both products are matmuls (`[group, hs] x [hs, S]`, then
/// `[group, S] x [S, hs]`). On the cubecl devices, up to
/// [`FUSED_ATTENTION_MAX`] elements of the broadcast product, they are that
/// product summed over the contracted axis, which the fusion backend turns
/// into one reduction kernel each: a `group`-row matmul would take the general tiled matmul, whose
/// autotune compiles several shader variants per shape for what is a
/// vector-matrix product per head (on a software Vulkan driver, 15-40 s
/// each, minutes per process). Same values up to summation order.
///
/// Above [`FUSED_ATTENTION_MAX`] (a long prefill: `B` and `S` both the
/// prompt's length) the cubecl devices take the matmuls too, so that a
/// backend that did not fuse the product would not materialise it.
fn attend(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    future: &Tensor<4, burn_tensor::Bool>,
    scale: f64,
    fused: bool,
) -> Tensor<4> {
    let [b, n_kv, group, hs] = q.dims();
    let s = k.dims()[2];
    if !fused || b * n_kv * group * s * hs > FUSED_ATTENTION_MAX {
        let scores = q
            .matmul(k.swap_dims(2, 3))
            .mul_scalar(scale)
            .mask_fill(future.clone(), f32::NEG_INFINITY); // [B, n_kv, group, S]
        return softmax(scores, 3).matmul(v);
    }
    // [B, n_kv, group, 1, hs] * [B, n_kv, 1, S, hs], summed over hs.
    let scores: Tensor<4> = q
        .unsqueeze_dim::<5>(3)
        .mul(k.unsqueeze_dim::<5>(2))
        .sum_dim(4)
        .reshape([b, n_kv, group, s])
        .mul_scalar(scale)
        .mask_fill(future.clone(), f32::NEG_INFINITY);
    // [B, n_kv, group, S, 1] * [B, n_kv, 1, S, hs], summed over S.
    softmax(scores, 3)
        .unsqueeze_dim::<5>(4)
        .mul(v.unsqueeze_dim::<5>(2))
        .sum_dim(3)
        .reshape([b, n_kv, group, hs])
}

impl Llama2 {
    /// Upload a checkpoint's weights to `device` and precompute the RoPE tables.
    pub fn new(ckpt: &Checkpoint, device: &Device) -> Self {
        let c = ckpt.config;
        let (d, h, kv) = (c.dim, c.hidden_dim, c.kv_dim());
        let blocks = ckpt
            .layers
            .iter()
            .map(|l| {
                // Stacking (out, in) matrices along `out` = concatenating their rows.
                let qkv = [l.wq.as_slice(), &l.wk, &l.wv].concat();
                let w13 = [l.w1.as_slice(), &l.w3].concat();
                Block {
                    rms_att: upload_row(&l.rms_att, device),
                    wqkv: upload_t(&qkv, d + 2 * kv, d, device),
                    wo: upload_t(&l.wo, d, d, device),
                    rms_ffn: upload_row(&l.rms_ffn, device),
                    w13: upload_t(&w13, 2 * h, d, device),
                    w2: upload_t(&l.w2, d, h, device),
                }
            })
            .collect();
        let embedding = Tensor::from_data(
            TensorData::new(ckpt.token_embedding.clone(), [c.vocab_size, d]),
            device,
        );
        let classifier = upload_t(
            ckpt.wcls.as_deref().unwrap_or(&ckpt.token_embedding),
            c.vocab_size,
            d,
            device,
        );
        // Angle of pair j at position p: p * theta^(-2j / head_size), in f64, stored as f32.
        let half = c.head_size() / 2;
        let mut cos = Vec::with_capacity(c.seq_len * half);
        let mut sin = Vec::with_capacity(c.seq_len * half);
        for p in 0..c.seq_len {
            for j in 0..half {
                let freq = c.rope_theta.powf(-2.0 * j as f64 / c.head_size() as f64);
                let angle = p as f64 * freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Llama2 {
            config: c,
            device: device.clone(),
            embedding,
            blocks,
            rms_final: upload_row(&ckpt.rms_final, device),
            classifier,
            rope_cos: Tensor::from_data(TensorData::new(cos, [c.seq_len, half]), device),
            rope_sin: Tensor::from_data(TensorData::new(sin, [c.seq_len, half]), device),
            positions: Tensor::arange(0..c.seq_len as i64, device),
            fused_attention: !sampler_backend::is_cpu_device(device),
        }
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty KV cache for one sequence on the model's device.
    pub fn new_cache(&self) -> KvCache {
        let c = &self.config;
        let shape = [c.n_kv_heads, c.seq_len, c.head_size()];
        KvCache {
            k: (0..c.n_layers)
                .map(|_| Tensor::zeros(shape, &self.device))
                .collect(),
            v: (0..c.n_layers)
                .map(|_| Tensor::zeros(shape, &self.device))
                .collect(),
        }
    }

    /// An empty cache for `slots` sequences ([`Llama2::forward_batch`]).
    pub fn new_batch_cache(&self, slots: usize) -> BatchKvCache {
        let c = &self.config;
        let shape = [slots.max(1) * c.seq_len, c.kv_dim()];
        BatchKvCache {
            k: (0..c.n_layers)
                .map(|_| Tensor::zeros(shape, &self.device))
                .collect(),
            v: (0..c.n_layers)
                .map(|_| Tensor::zeros(shape, &self.device))
                .collect(),
            slots: slots.max(1),
        }
    }

    /// Give `cache` room for at least `slots` sequences (existing slots keep
    /// their keys and values).
    pub fn grow_batch_cache(&self, cache: &mut BatchKvCache, slots: usize) {
        if slots <= cache.slots {
            return;
        }
        let c = &self.config;
        let extra = [(slots - cache.slots) * c.seq_len, c.kv_dim()];
        for t in cache.k.iter_mut().chain(cache.v.iter_mut()) {
            *t = Tensor::cat(vec![t.clone(), Tensor::zeros(extra, &self.device)], 0);
        }
        cache.slots = slots;
    }

    /// Copy the keys and values of cache slot `from` into slot `to` (a
    /// forked sequence continuing from the same prompt without running it
    /// again). Both slots must exist.
    ///
    /// # Errors
    /// [`Llama2Error::CacheMismatch`] for a slot outside the cache.
    pub fn copy_slot(
        &self,
        cache: &mut BatchKvCache,
        from: usize,
        to: usize,
    ) -> Result<(), Llama2Error> {
        if from >= cache.slots || to >= cache.slots {
            return Err(Llama2Error::CacheMismatch);
        }
        if from == to {
            return Ok(());
        }
        let (n, width) = (self.config.seq_len, self.config.kv_dim());
        for t in cache.k.iter_mut().chain(cache.v.iter_mut()) {
            let rows = t.clone().slice([from * n..(from + 1) * n, 0..width]);
            *t = t
                .clone()
                .slice_assign([to * n..(to + 1) * n, 0..width], rows);
        }
        Ok(())
    }

    /// Tokens of several sequences in one pass: row `r` is token `tokens[r]`
    /// at position `positions[r]` of the sequence in cache slot `slots[r]`.
    /// Rows may be at different positions, and one sequence may have several
    /// rows (a prompt processed as one batch, or a chunk of it beside other
    /// sequences' decoding rows): every row's keys and values are written
    /// first, then each row attends to its sequence's positions up to its
    /// own. Every position before a row's must be in the cache or in the
    /// same call. Returns the logits `[rows, vocab]` on the device; row `r`
    /// equals what [`Llama2::forward`] gives for that sequence alone (up to
    /// rounding).
    ///
    /// # Errors
    /// As [`Llama2::forward`]; [`Llama2Error::CacheMismatch`] for a slot
    /// outside the cache, one `(slot, position)` in two rows, or rows of
    /// unequal counts.
    pub fn forward_batch(
        &self,
        tokens: &[TokenId],
        positions: &[usize],
        slots: &[usize],
        cache: &mut BatchKvCache,
    ) -> Result<Tensor<2>, Llama2Error> {
        let c = &self.config;
        let b = tokens.len();
        let (hs, n_kv, seq, s_max) = (c.head_size(), c.n_kv_heads, c.seq_len, cache.slots);
        if positions.len() != b || slots.len() != b || b == 0 {
            return Err(Llama2Error::CacheMismatch);
        }
        for (&t, &p) in tokens.iter().zip(positions) {
            if t as usize >= c.vocab_size {
                return Err(Llama2Error::TokenOutOfRange {
                    token: t,
                    vocab: c.vocab_size,
                });
            }
            if p >= seq {
                return Err(Llama2Error::ContextFull {
                    pos: p,
                    seq_len: seq,
                });
            }
        }
        let mut seen = std::collections::HashSet::with_capacity(b);
        for (&s, &p) in slots.iter().zip(positions) {
            if s >= s_max || !seen.insert((s, p)) {
                return Err(Llama2Error::CacheMismatch);
            }
        }
        let (kv_dim, hidden, group) = (c.kv_dim(), c.hidden_dim, c.n_heads / c.n_kv_heads);
        let want = [s_max * seq, kv_dim];
        if cache.k.len() != c.n_layers
            || cache.v.len() != c.n_layers
            || cache.k.iter().chain(&cache.v).any(|t| t.dims() != want)
        {
            return Err(Llama2Error::CacheMismatch);
        }
        let dev = &self.device;
        let ints = |v: Vec<i64>| {
            let n = v.len();
            Tensor::<1, Int>::from_data(TensorData::new(v, [n]), dev)
        };
        let token_ix = ints(tokens.iter().map(|&t| t as i64).collect());
        let pos_ix = ints(positions.iter().map(|&p| p as i64).collect());
        // Cache rows (`slot · seq + position`): where each row writes, and
        // the rows of each row's sequence.
        let write_ix = ints(
            slots
                .iter()
                .zip(positions)
                .map(|(&s, &p)| (s * seq + p) as i64)
                .collect(),
        );
        // Attention reads positions `0..span` of each row's sequence: the
        // positions this call can see. Masked entries contribute zeros; a
        // row's logits may still differ with the call's shape at rounding
        // level (kernels choose their summation order by shape), as they do
        // with the row count.
        let span = positions.iter().max().map_or(1, |&p| p + 1);
        let read_ix = ints(
            slots
                .iter()
                .flat_map(|&s| (s * seq..s * seq + span).map(|i| i as i64))
                .collect(),
        );
        let mut x = self.embedding.clone().select(0, token_ix); // [B, dim]
        let cos: Tensor<4> =
            self.rope_cos
                .clone()
                .select(0, pos_ix.clone())
                .reshape([b, 1, hs / 2, 1]);
        let sin: Tensor<4> = self
            .rope_sin
            .clone()
            .select(0, pos_ix)
            .reshape([b, 1, hs / 2, 1]);
        // Host-built mask: each row's future.
        let mut future = vec![false; b * span];
        for (r, &p) in positions.iter().enumerate() {
            future[r * span + p + 1..(r + 1) * span].fill(true);
        }
        let future = Tensor::<4, burn_tensor::Bool>::from_data(
            TensorData::new(future, [b, 1, 1, span]),
            dev,
        )
        .expand([b, n_kv, group, span]);
        let scale = 1.0 / (hs as f64).sqrt();
        let rope = |t: Tensor<2>, heads: usize| -> Tensor<2> {
            let half = hs / 2;
            let t = t.reshape([b, heads, half, 2]);
            let a = t.clone().slice([0..b, 0..heads, 0..half, 0..1]);
            let bb = t.slice([0..b, 0..heads, 0..half, 1..2]);
            let ra = a.clone().mul(cos.clone()).sub(bb.clone().mul(sin.clone()));
            let rb = a.mul(sin.clone()).add(bb.mul(cos.clone()));
            Tensor::cat(vec![ra, rb], 3).reshape([b, heads * hs])
        };
        // Each row's sequence, `[B, n_kv, span, hs]`.
        let of_rows = |cache: &Tensor<2>| -> Tensor<4> {
            cache
                .clone()
                .select(0, read_ix.clone())
                .reshape([b, span, n_kv, hs])
                .swap_dims(1, 2)
        };
        // The layers' caches are taken and put back, so each is updated in
        // place (its only owner) at the rows' distinct cache rows.
        let (old_k, old_v) = (std::mem::take(&mut cache.k), std::mem::take(&mut cache.v));
        for ((blk, k_cache), v_cache) in self.blocks.iter().zip(old_k).zip(old_v) {
            let h = rmsnorm(x.clone(), &blk.rms_att);
            let qkv = h.matmul(blk.wqkv.clone()); // [B, dim + 2 * kv_dim]
            let qk = rope(
                qkv.clone().slice([0..b, 0..c.dim + kv_dim]),
                c.n_heads + n_kv,
            );
            let v = qkv.slice([0..b, c.dim + kv_dim..c.dim + 2 * kv_dim]);
            let q = qk.clone().slice([0..b, 0..c.dim]);
            let k = qk.slice([0..b, c.dim..c.dim + kv_dim]);
            let assign = burn_tensor::IndexingUpdateOp::Assign;
            let k_cache = k_cache.select_assign(0, write_ix.clone(), k, assign);
            let v_cache = v_cache.select_assign(0, write_ix.clone(), v, assign);
            let q = q.reshape([b, n_kv, group, hs]);
            let out = attend(
                q,
                of_rows(&k_cache),
                of_rows(&v_cache),
                &future,
                scale,
                self.fused_attention,
            )
            .reshape([b, c.dim]);
            cache.k.push(k_cache);
            cache.v.push(v_cache);
            x = x.add(out.matmul(blk.wo.clone()));
            let h = rmsnorm(x.clone(), &blk.rms_ffn);
            let gu = h.matmul(blk.w13.clone());
            let gate = silu(gu.clone().slice([0..b, 0..hidden]));
            let up = gu.slice([0..b, hidden..2 * hidden]);
            x = x.add(gate.mul(up).matmul(blk.w2.clone()));
        }
        let x = rmsnorm(x, &self.rms_final);
        Ok(x.matmul(self.classifier.clone()))
    }

    /// Rotate each adjacent pair `(2j, 2j+1)` of every head of `t: [1, heads * head_size]`.
    /// `cos`, `sin`: `[1, head_size / 2, 1]` for the current position.
    fn rope(&self, t: Tensor<2>, heads: usize, cos: &Tensor<3>, sin: &Tensor<3>) -> Tensor<2> {
        let hs = self.config.head_size();
        let half = hs / 2;
        let t = t.reshape([heads, half, 2]);
        let a = t.clone().slice([0..heads, 0..half, 0..1]);
        let b = t.slice([0..heads, 0..half, 1..2]);
        let ra = a.clone().mul(cos.clone()).sub(b.clone().mul(sin.clone()));
        let rb = a.mul(sin.clone()).add(b.mul(cos.clone()));
        Tensor::cat(vec![ra, rb], 2).reshape([1, heads * hs])
    }

    /// Run one token at position `pos` (0-based), append its keys and values
    /// to `cache`, and return the next-token logits, `[1, vocab]`, on the
    /// model's device (nothing is read back).
    ///
    /// Positions must be fed in order `0, 1, ..` into the same cache.
    ///
    /// # Errors
    /// [`Llama2Error::TokenOutOfRange`] when `token >= vocab`;
    /// [`Llama2Error::ContextFull`] when `pos >= seq_len`;
    /// [`Llama2Error::CacheMismatch`] when `cache` was made by another model.
    pub fn forward(
        &self,
        token: TokenId,
        pos: usize,
        cache: &mut KvCache,
    ) -> Result<Tensor<2>, Llama2Error> {
        let c = &self.config;
        if token as usize >= c.vocab_size {
            return Err(Llama2Error::TokenOutOfRange {
                token,
                vocab: c.vocab_size,
            });
        }
        if pos >= c.seq_len {
            return Err(Llama2Error::ContextFull {
                pos,
                seq_len: c.seq_len,
            });
        }
        let (hs, n_kv, seq) = (c.head_size(), c.n_kv_heads, c.seq_len);
        let want = [n_kv, seq, hs];
        if cache.k.len() != c.n_layers
            || cache.v.len() != c.n_layers
            || cache.k.iter().chain(&cache.v).any(|t| t.dims() != want)
        {
            return Err(Llama2Error::CacheMismatch);
        }
        let (kv_dim, hidden) = (c.kv_dim(), c.hidden_dim);
        let group = c.n_heads / c.n_kv_heads;
        let dev = &self.device;

        let token_ix = Tensor::<1, Int>::from_data(TensorData::new(vec![token as i64], [1]), dev);
        let pos_ix = Tensor::<1, Int>::from_data(TensorData::new(vec![pos as i64], [1]), dev);
        let mut x = self.embedding.clone().select(0, token_ix); // [1, dim]
        let cos: Tensor<3> =
            self.rope_cos
                .clone()
                .select(0, pos_ix.clone())
                .reshape([1, hs / 2, 1]);
        let sin: Tensor<3> = self
            .rope_sin
            .clone()
            .select(0, pos_ix)
            .reshape([1, hs / 2, 1]);
        // Where this position's k/v go, and which cached positions are in the future.
        let write = self
            .positions
            .clone()
            .equal_elem(pos as i64)
            .reshape([1, seq, 1])
            .expand([n_kv, seq, hs]);
        let future = self
            .positions
            .clone()
            .greater_elem(pos as i64)
            .reshape([1, 1, 1, seq])
            .expand([1, n_kv, group, seq]);
        let scale = 1.0 / (hs as f64).sqrt();

        for (l, b) in self.blocks.iter().enumerate() {
            // Attention.
            let h = rmsnorm(x.clone(), &b.rms_att);
            let qkv = h.matmul(b.wqkv.clone()); // [1, dim + 2 * kv_dim]
            let qk = qkv.clone().slice([0..1, 0..c.dim + kv_dim]);
            let v = qkv.slice([0..1, c.dim + kv_dim..c.dim + 2 * kv_dim]);
            // q and k heads rotate alike: one RoPE over all n_heads + n_kv_heads heads.
            let qk = self.rope(qk, c.n_heads + n_kv, &cos, &sin);
            let q = qk.clone().slice([0..1, 0..c.dim]);
            let k = qk.slice([0..1, c.dim..c.dim + kv_dim]);
            let k = k.reshape([n_kv, 1, hs]).expand([n_kv, seq, hs]);
            let v = v.reshape([n_kv, 1, hs]).expand([n_kv, seq, hs]);
            cache.k[l] = cache.k[l].clone().mask_where(write.clone(), k);
            cache.v[l] = cache.v[l].clone().mask_where(write.clone(), v);
            // Query head h = kv * group + g reads kv head h / group.
            let q = q.reshape([1, n_kv, group, hs]);
            let out = attend(
                q,
                cache.k[l].clone().unsqueeze_dim(0),
                cache.v[l].clone().unsqueeze_dim(0),
                &future,
                scale,
                self.fused_attention,
            )
            .reshape([1, c.dim]);
            x = x.add(out.matmul(b.wo.clone()));

            // SwiGLU feed-forward.
            let h = rmsnorm(x.clone(), &b.rms_ffn);
            let gu = h.matmul(b.w13.clone()); // [1, 2 * hidden]
            let gate = silu(gu.clone().slice([0..1, 0..hidden]));
            let up = gu.slice([0..1, hidden..2 * hidden]);
            x = x.add(gate.mul(up).matmul(b.w2.clone()));
        }
        let x = rmsnorm(x, &self.rms_final);
        Ok(x.matmul(self.classifier.clone()))
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;

    /// The fused form of [`attend`] (the cubecl devices' at small sizes)
    /// gives the matmuls' values at `B > 1` with a different mask per row
    /// and `group > 1`, run on flex, where the model itself never takes it:
    /// within 1e-5, and the masked keys and values do not count.
    #[test]
    fn fused_attention_matches_the_matmuls() {
        let dev = sampler_backend::parse_device("flex").expect("flex is compiled in");
        let (b, n_kv, group, s, hs) = (3, 2, 3, 7, 4);
        // Deterministic values in [-2, 2).
        let vals = |n: usize, seed: u64| -> Vec<f32> {
            let mut x = seed;
            (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 40) % 1000) as f32 / 250.0 - 2.0
                })
                .collect()
        };
        let t = |v: Vec<f32>, shape: [usize; 4]| {
            Tensor::<4>::from_data(TensorData::new(v, shape), &dev)
        };
        // Row r sees positions 0..=r + 2.
        let mut mask = vec![false; b * s];
        for r in 0..b {
            mask[r * s + r + 3..(r + 1) * s].fill(true);
        }
        let future = Tensor::<4, burn_tensor::Bool>::from_data(
            TensorData::new(mask.clone(), [b, 1, 1, s]),
            &dev,
        )
        .expand([b, n_kv, group, s]);
        let q = t(vals(b * n_kv * group * hs, 1), [b, n_kv, group, hs]);
        let (kv, vv) = (vals(b * n_kv * s * hs, 2), vals(b * n_kv * s * hs, 3));
        let run = |kv: &[f32], vv: &[f32], fused: bool| -> Vec<f32> {
            let out = attend(
                q.clone(),
                t(kv.to_vec(), [b, n_kv, s, hs]),
                t(vv.to_vec(), [b, n_kv, s, hs]),
                &future,
                0.5,
                fused,
            );
            assert_eq!(out.dims(), [b, n_kv, group, hs]);
            out.into_data().iter::<f32>().collect()
        };
        let max_diff = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        };
        let want = run(&kv, &vv, false);
        let got = run(&kv, &vv, true);
        let worst = max_diff(&want, &got);
        assert!(worst <= 1e-5, "max |fused - matmul| = {worst}");
        // Keys and values at masked positions changed: the same output.
        let (mut kv2, mut vv2) = (kv.clone(), vv.clone());
        for r in 0..b {
            for h in 0..n_kv {
                for p in (0..s).filter(|&p| mask[r * s + p]) {
                    let at = ((r * n_kv + h) * s + p) * hs;
                    kv2[at..at + hs].fill(9.0);
                    vv2[at..at + hs].fill(-9.0);
                }
            }
        }
        let masked = run(&kv2, &vv2, true);
        let worst = max_diff(&got, &masked);
        assert!(
            worst <= 1e-6,
            "masked positions moved the output by {worst}"
        );
    }
}
