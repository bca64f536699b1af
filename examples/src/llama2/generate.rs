//! The generation loop: the model's `[1, vocab]` logits go straight from the
//! forward pass to the sampling batch on the same device; only what the
//! request's plan reads back (token ids when the whole chain is offloaded)
//! crosses to the host.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use sampler_backend::{BackendError, Draft, RequestId, SamplingBatch, launches};
use sampler_core::{SampleError, TokenId};

use super::tokenizer::{BOS, EOS, Tokenizer};
use super::{Llama2, Llama2Error};
use crate::ngram::NgramDrafter;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `max_new_tokens` were generated.
    Length,
    /// The model emitted BOS (llama2.c's models end a story with it) or EOS.
    EndOfText,
    /// The context window is full.
    Context,
    /// The caller stopped it (`on_token` returned `Break`: a stop string).
    Stop,
}

impl StopReason {
    /// A short lowercase name (`length`, `end_of_text`, `context`).
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Length => "length",
            StopReason::EndOfText => "end_of_text",
            StopReason::Context => "context",
            StopReason::Stop => "stop",
        }
    }
}

/// The result of [`generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The prompt's tokens, BOS first.
    pub prompt_tokens: Vec<TokenId>,
    /// Generated tokens, in order; a final BOS/EOS is included.
    pub tokens: Vec<TokenId>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Sampling steps run (= `tokens.len()`).
    pub steps: usize,
    /// Bytes read back from the device over all steps.
    pub bytes_read: usize,
    /// Time to run the prompt through the model (excluding its last token).
    pub prompt_time: Duration,
    /// Time of the generation steps (forward + sampling + readback).
    pub gen_time: Duration,
    /// Per step, the logprobs the chain asked for (`ChainSpec::logprobs`);
    /// `None` when it asked for none.
    pub logprobs: Vec<Option<sampler_core::Logprobs>>,
    /// Speculative decoding's figures, when a drafter proposed tokens
    /// ([`generate_with`]).
    pub speculative: Option<SpeculativeStats>,
    /// Kernels the second (warm) step launched on a cubecl device: the
    /// model's forward pass and the sampling step, counted apart
    /// ([`sampler_backend::launches`]); `None` on a CPU device, in a build
    /// without a cubecl backend, or with fewer than two steps.
    pub kernels: Option<StepKernels>,
}

/// What speculative decoding did over a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpeculativeStats {
    /// Model passes (each runs the last token and the step's drafts).
    pub passes: usize,
    /// Draft tokens proposed.
    pub proposed: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Time in [`SamplingBatch::verify`] (readback and verification).
    pub verify_time: Duration,
}

impl SpeculativeStats {
    /// Accepted over proposed drafts (0 when none were proposed).
    pub fn acceptance_rate(&self) -> f64 {
        if self.proposed == 0 {
            0.0
        } else {
            self.accepted as f64 / self.proposed as f64
        }
    }
}

/// Kernels of one generation step on a cubecl device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepKernels {
    /// The model's forward pass for the step's token.
    pub model: usize,
    /// The sampling step (device prefix of the chain and its readback).
    pub sampling: usize,
    /// Bytes of device memory the sampling step's kernels read, as they
    /// declare them ([`launches::KernelCount::bytes_read`]): a lower bound
    /// when `sampling_undeclared > 0`.
    pub sampling_bytes_read: u64,
    /// Sampling kernels that declare no reads (burn's own ops).
    pub sampling_undeclared: usize,
    /// The vocabulary: `sampling_bytes_read / (4 · vocab)` is the step's
    /// reads of the logits row.
    pub vocab: usize,
}

impl StepKernels {
    /// Reads of the `[1, vocab]` f32 logits the sampling step's kernels
    /// declare.
    pub fn reads_of_logits(&self) -> f64 {
        self.sampling_bytes_read as f64 / (4.0 * self.vocab.max(1) as f64)
    }
}

impl Generation {
    /// Generated tokens per second (`steps / gen_time`).
    pub fn tokens_per_second(&self) -> f64 {
        let s = self.gen_time.as_secs_f64();
        if s > 0.0 { self.steps as f64 / s } else { 0.0 }
    }

    /// Average bytes read back per step.
    pub fn bytes_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.bytes_read as f64 / self.steps as f64
        }
    }
}

/// What can stop [`generate`].
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// `max_new_tokens` was 0.
    #[error("the number of tokens to generate must be at least 1 (got -n 0)")]
    ZeroTokens,
    /// The model failed (prompt too long, bad token id).
    #[error(transparent)]
    Model(#[from] Llama2Error),
    /// The sampling batch failed for the whole step.
    #[error("sampling batch: {0}")]
    Backend(#[from] BackendError),
    /// The row could not be sampled (e.g. NaN logits).
    #[error("step {step}: sampling failed: {source}")]
    Sample {
        /// Generation step (0-based).
        step: usize,
        /// The row's error.
        source: SampleError,
    },
    /// The sampling batch answered with no row.
    #[error("step {step}: the sampling batch returned no token")]
    NoToken {
        /// Generation step.
        step: usize,
    },
    /// Beam search settings, or a chain beam search cannot honour.
    #[error("beam search: {0}")]
    Beam(String),
}

/// What generation needs of a tokenizer: the bytes of tokens, for
/// streaming and for the final text. llama2.c's [`Tokenizer`] and a GGUF
/// model's [`crate::chat::ChatTokenizer`] implement it.
pub trait TextCodec {
    /// The bytes token `id` adds after `prev` (empty for BOS / EOS and ids
    /// outside the vocabulary; may be part of a UTF-8 character).
    fn piece_bytes(&self, prev: Option<TokenId>, id: TokenId) -> Vec<u8>;
    /// The bytes of a whole sequence (BOS / EOS not written).
    fn decode_bytes(&self, ids: &[TokenId]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut prev = None;
        for &t in ids {
            out.extend(self.piece_bytes(prev, t));
            prev = Some(t);
        }
        out
    }
    /// The token's own text as the vocabulary writes it (for listings).
    fn token_text(&self, id: TokenId) -> Option<String>;
    /// The tokens that end a generation (end of text / end of turn, and
    /// the beginning-of-sequence token).
    fn stop_ids(&self) -> Vec<TokenId>;
    /// The beginning-of-sequence token, left out of the history that
    /// penalty-style stages see.
    fn bos(&self) -> Option<TokenId>;
    /// The token as a grammar engine sees it (structured outputs): the
    /// bytes it writes, or a control token ([`crate::structured::view`]).
    fn grammar_token(&self, id: TokenId) -> sampler_structured::TokenBytes;
}

impl TextCodec for Tokenizer {
    fn piece_bytes(&self, prev: Option<TokenId>, id: TokenId) -> Vec<u8> {
        if id == BOS || id == EOS {
            return Vec::new();
        }
        self.decode_piece(prev, id).to_vec()
    }
    fn decode_bytes(&self, ids: &[TokenId]) -> Vec<u8> {
        Tokenizer::decode_bytes(self, ids)
    }
    fn token_text(&self, id: TokenId) -> Option<String> {
        self.piece(id)
            .map(|p| String::from_utf8_lossy(p).into_owned())
    }
    fn stop_ids(&self) -> Vec<TokenId> {
        vec![EOS, BOS]
    }
    fn bos(&self) -> Option<TokenId> {
        Some(BOS)
    }
    fn grammar_token(&self, id: TokenId) -> sampler_structured::TokenBytes {
        use sampler_structured::TokenBytes;
        match self.piece(id) {
            None => TokenBytes::Unused,
            Some(p) if matches!(id, super::tokenizer::UNK | BOS | EOS) => {
                TokenBytes::Special(String::from_utf8_lossy(p).into_owned())
            }
            // Byte-fallback pieces (`<0xHH>`) are their byte; a piece keeps
            // its leading space (the text after a prompt).
            Some(_) => TokenBytes::Text(self.decode_piece(None, id).to_vec()),
        }
    }
}

/// Encode `prompt` (BOS + dummy space + merges) and check it fits the context.
///
/// # Errors
/// [`Llama2Error::PromptTooLong`] when the prompt, BOS included, is longer
/// than the model's context (`seq_len`).
pub fn encode_prompt(
    model: &Llama2,
    tokenizer: &Tokenizer,
    prompt: &str,
) -> Result<Vec<TokenId>, Llama2Error> {
    let tokens = tokenizer.encode(prompt, true, false);
    let seq_len = model.config().seq_len;
    if tokens.len() > seq_len {
        return Err(Llama2Error::PromptTooLong {
            tokens: tokens.len(),
            seq_len,
        });
    }
    Ok(tokens)
}

/// Generate up to `max_new_tokens` tokens after `prompt_tokens` (BOS first,
/// from [`encode_prompt`]) for request `id` of `batch`.
///
/// The prompt (all but its last token) runs through the model in one batched
/// pass (`Llama2::forward_batch`; its logits stay on the device);
/// then every step hands the `[1, vocab]` logits tensor to
/// [`SamplingBatch::step`], which samples on the device and reads back only the
/// plan's readback format. `on_token(token, bytes)` is called for each
/// generated token with its decoded bytes (empty for BOS/EOS), for streaming;
/// returning `ControlFlow::Break(())` ends the generation there
/// ([`StopReason::Stop`]: the caller found a stop string, [`crate::stop`]).
/// Stops early when the model emits one of the tokenizer's stop ids
/// ([`TextCodec::stop_ids`]), or the context is full.
///
/// # Errors
/// [`GenerateError::ZeroTokens`] for `max_new_tokens == 0`; model, executor
/// and per-row sampling errors.
pub fn generate(
    model: &Llama2,
    tokenizer: &dyn TextCodec,
    batch: &mut SamplingBatch,
    id: RequestId,
    prompt_tokens: &[TokenId],
    max_new_tokens: usize,
    on_token: impl FnMut(TokenId, &[u8]) -> ControlFlow<()>,
) -> Result<Generation, GenerateError> {
    generate_with(
        model,
        tokenizer,
        batch,
        id,
        prompt_tokens,
        max_new_tokens,
        None,
        on_token,
    )
}

/// [`generate`] with speculative decoding when `drafter` is given: each
/// pass proposes up to `k` tokens from the context ([`NgramDrafter`]), runs
/// the last token and the drafts through the model in one batched pass
/// (`k + 1` rows of one sequence) and verifies them
/// ([`SamplingBatch::verify`]), emitting 1 to `k + 1` tokens. The tokens are
/// the ones plain decoding samples for a greedy chain, and follow the same
/// distribution for a sampling one; a pass without a draft is a plain step.
///
/// # Errors
/// As [`generate`].
#[allow(clippy::too_many_arguments)]
pub fn generate_with(
    model: &Llama2,
    tokenizer: &dyn TextCodec,
    batch: &mut SamplingBatch,
    id: RequestId,
    prompt_tokens: &[TokenId],
    max_new_tokens: usize,
    drafter: Option<&NgramDrafter>,
    mut on_token: impl FnMut(TokenId, &[u8]) -> ControlFlow<()>,
) -> Result<Generation, GenerateError> {
    if max_new_tokens == 0 {
        return Err(GenerateError::ZeroTokens);
    }
    let seq_len = model.config().seq_len;
    if prompt_tokens.is_empty() || prompt_tokens.len() > seq_len {
        return Err(Llama2Error::PromptTooLong {
            tokens: prompt_tokens.len(),
            seq_len,
        }
        .into());
    }
    // Penalty-style stages see the prompt as history (BOS excluded).
    let bos = tokenizer.bos();
    let history: Vec<TokenId> = prompt_tokens
        .iter()
        .copied()
        .filter(|&t| Some(t) != bos)
        .collect();
    batch.accept_prompt(id, &history)?;

    // One cache slot; the prompt (but its last token) in one batched pass.
    let mut cache = model.new_batch_cache(1);
    let (last, prompt_time) = prefill(model, prompt_tokens, &mut cache)?;

    let t1 = Instant::now();
    let mut tokens = Vec::with_capacity(max_new_tokens);
    let mut logprobs = Vec::with_capacity(max_new_tokens);
    let mut bytes_read = 0usize;
    let mut token = prompt_tokens[last];
    let mut pos = last;
    let mut prev = token;
    let stops = tokenizer.stop_ids();
    // The second step is counted: the forward pass, then (after a sync, so
    // that none of the model's queued ops lands in the sampling count) the
    // sampling step.
    let count_kernels = !sampler_backend::is_cpu_device(model.device());
    let mut kernels = None;
    let mut context: Vec<TokenId> = prompt_tokens.to_vec();
    let mut spec_stats = drafter.map(|_| SpeculativeStats::default());
    let stop = 'decode: loop {
        // Drafts: no more than the tokens still wanted (less the bonus) and
        // the context's room.
        let room = (max_new_tokens - tokens.len() - 1).min(seq_len - 1 - pos);
        let mut drafts = drafter.map(|d| d.propose(&context)).unwrap_or_default();
        drafts.truncate(room);
        if let Some(st) = spec_stats.as_mut() {
            st.passes += 1;
            st.proposed += drafts.len();
        }
        if !drafts.is_empty() {
            let mut run = vec![token];
            run.extend(&drafts);
            let positions: Vec<usize> = (pos..pos + run.len()).collect();
            let logits = model.forward_batch(&run, &positions, &vec![0; run.len()], &mut cache)?;
            let tv = Instant::now();
            let out = batch.verify(
                &[Draft {
                    id,
                    tokens: drafts,
                    probs: None,
                }],
                logits,
            )?;
            bytes_read += out.bytes_read;
            let step = tokens.len();
            let ver = match out.results.into_iter().next() {
                Some(Ok(v)) => v,
                Some(Err(source)) => return Err(GenerateError::Sample { step, source }),
                None => return Err(GenerateError::NoToken { step }),
            };
            if let Some(st) = spec_stats.as_mut() {
                st.accepted += ver.accepted;
                st.verify_time += tv.elapsed();
            }
            let mut lps = ver.logprobs.into_iter();
            for next in ver.tokens {
                logprobs.push(lps.next());
                tokens.push(next);
                context.push(next);
                if stops.contains(&next) {
                    let _ = on_token(next, &[]);
                    break 'decode StopReason::EndOfText;
                }
                if on_token(next, &tokenizer.piece_bytes(Some(prev), next)).is_break() {
                    break 'decode StopReason::Stop;
                }
                prev = next;
                if tokens.len() >= max_new_tokens {
                    break 'decode StopReason::Length;
                }
                pos += 1;
                if pos >= seq_len {
                    break 'decode StopReason::Context;
                }
                token = next;
            }
            continue;
        }
        let out = if count_kernels && tokens.len() == 1 {
            let (logits, m) = launches::count_launches(|| {
                let logits = model.forward_batch(&[token], &[pos], &[0], &mut cache);
                let _ = model.device().sync();
                logits
            });
            let logits = logits?; // [1, vocab], on the device
            let (out, s) = launches::count_launches(|| batch.step(&[id], logits));
            if let (Some(m), Some(s)) = (m, s) {
                kernels = Some(StepKernels {
                    model: m.total(),
                    sampling: s.total(),
                    sampling_bytes_read: s.bytes_read(),
                    sampling_undeclared: s.undeclared(),
                    vocab: model.config().vocab_size,
                });
            }
            out?
        } else {
            let logits = model.forward_batch(&[token], &[pos], &[0], &mut cache)?; // [1, vocab], on the device
            batch.step(&[id], logits)?
        };
        bytes_read += out.bytes_read;
        logprobs.push(out.logprobs.into_iter().next().flatten());
        let step = tokens.len();
        let next = match out.tokens.into_iter().next() {
            Some(Ok(t)) => t,
            Some(Err(source)) => return Err(GenerateError::Sample { step, source }),
            None => return Err(GenerateError::NoToken { step }),
        };
        tokens.push(next);
        context.push(next);
        if stops.contains(&next) {
            let _ = on_token(next, &[]);
            break StopReason::EndOfText;
        }
        if on_token(next, &tokenizer.piece_bytes(Some(prev), next)).is_break() {
            break StopReason::Stop;
        }
        prev = next;
        if tokens.len() >= max_new_tokens {
            break StopReason::Length;
        }
        pos += 1;
        if pos >= seq_len {
            break StopReason::Context;
        }
        token = next;
    };
    let gen_time = t1.elapsed();
    Ok(Generation {
        prompt_tokens: prompt_tokens.to_vec(),
        steps: tokens.len(),
        tokens,
        stop,
        bytes_read,
        prompt_time,
        gen_time,
        logprobs,
        speculative: spec_stats,
        kernels,
    })
}

/// The prompt but its last token through the model in one batched pass, in
/// cache slot 0 (the logits of inner positions are not needed: dropped on
/// the device); the index of the last token and the time taken.
fn prefill(
    model: &Llama2,
    prompt_tokens: &[TokenId],
    cache: &mut super::BatchKvCache,
) -> Result<(usize, Duration), GenerateError> {
    let t0 = Instant::now();
    let last = prompt_tokens.len().saturating_sub(1);
    if last > 0 {
        let positions: Vec<usize> = (0..last).collect();
        drop(model.forward_batch(&prompt_tokens[..last], &positions, &vec![0; last], cache)?);
    }
    Ok((last, t0.elapsed()))
}

/// Stages beam search honours: the logits processors, which only edit
/// logits from the history (bans, biases, penalties, masks). Truncation,
/// temperature and selecting stages are sampling-only: beam search scores
/// the model's log-probabilities after the processors and picks by score
/// (Hugging Face ignores its warpers when `do_sample` is false; here they
/// are refused, so that nothing is silently dropped).
pub const BEAM_STAGES: [sampler_core::StageKind; 6] = [
    sampler_core::StageKind::Penalties,
    sampler_core::StageKind::LogitBias,
    sampler_core::StageKind::Mask,
    sampler_core::StageKind::MinTokens,
    sampler_core::StageKind::Dry,
    sampler_core::StageKind::NoRepeatNgram,
];

/// The most beams `beam_search` takes (cache slots and forks per step).
pub const MAX_SEARCH_BEAMS: usize = sampler_core::MAX_SEQUENCES;

/// The result of [`beam_search`].
#[derive(Debug, Clone)]
pub struct BeamOutput {
    /// The best `num_return_sequences` sequences, best first.
    pub hypotheses: Vec<sampler_cpu::beam::Hypothesis>,
    /// Steps (model passes over the beams).
    pub steps: usize,
    /// Beam rows processed (model rows sampled), over all steps.
    pub rows: usize,
    /// Bytes read back from the device.
    pub bytes_read: usize,
    /// Time of the prompt pass.
    pub prompt_time: Duration,
    /// Time of the search (model passes, the chain's processors, the
    /// bookkeeping).
    pub gen_time: Duration,
    /// Of which in the batch's `filter` and the top-`2W` selection.
    pub sampling_time: Duration,
}

/// What a [`BeamFamily`] needs from its engine: the serving batch, and the
/// KV cache slots of the model (one per running beam).
pub trait BeamHost {
    /// The batch the beams are requests of.
    fn batch(&mut self) -> &mut SamplingBatch;
    /// A free cache slot.
    ///
    /// # Errors
    /// None free.
    fn alloc_slot(&mut self) -> Result<usize, GenerateError>;
    /// A slot no beam uses any more.
    fn free_slot(&mut self, slot: usize);
    /// Copy the keys and values of slot `from` into slot `to`.
    ///
    /// # Errors
    /// The model's.
    fn copy_slot(&mut self, from: usize, to: usize) -> Result<(), GenerateError>;
}

/// The check of a chain for beam search: processors only ([`BEAM_STAGES`]),
/// the selecting stages (`dist`, `greedy`) dropped (beam search does not
/// sample; the flat parameters always end in one).
///
/// # Errors
/// [`GenerateError::Beam`] naming the first stage beam search cannot honour.
pub fn beam_chain(
    spec: &sampler_core::ChainSpec,
) -> Result<sampler_core::ChainSpec, GenerateError> {
    use sampler_core::StageKind;
    let mut out = spec.clone();
    out.stages
        .retain(|s| !matches!(s.kind(), StageKind::Dist | StageKind::Greedy));
    if let Some(st) = out.stages.iter().find(|s| !BEAM_STAGES.contains(&s.kind())) {
        return Err(GenerateError::Beam(format!(
            "the chain has `{}`, which beam search cannot honour: it scores the model's log-probabilities after the logits processors ({}) and keeps the best beams, it does not sample",
            st.kind().meta().name,
            BEAM_STAGES.map(|k| k.meta().name).join(", ")
        )));
    }
    Ok(out)
}

/// One beam search in progress inside an engine's batch: each running beam
/// is a request of the batch (the chain's processors, [`BEAM_STAGES`]) and
/// a KV cache slot. Per step the engine runs the model over [`BeamFamily::rows`]
/// (every beam at [`BeamFamily::pos`]), gives the rows' logits to
/// [`BeamFamily::advance`], which takes the top `2W` logprobs per beam
/// after the processors with [`SamplingBatch::top_logprobs`] (on the device
/// where the whole chain runs there: only the `2W` pairs come back) and
/// reorders the beams by parent: a parent with several
/// children is forked ([`SamplingBatch::fork`], cache slot copied), one
/// without any is removed, each child's token committed
/// ([`SamplingBatch::commit`]).
#[derive(Debug, Clone)]
pub struct BeamFamily {
    search: sampler_cpu::beam::BeamSearch,
    /// Running beams: request, cache slot, last token; all at `pos`.
    beams: Vec<(RequestId, usize, TokenId)>,
    pos: usize,
    seq_len: usize,
}

impl BeamFamily {
    /// A search from a request already in the batch whose prompt is
    /// through the model in cache slot `slot`: `last` its last prompt token
    /// at position `pos` (fed at the first step). `params.max_new_tokens`
    /// is capped to the context `seq_len`. The root request's chain must
    /// pass [`beam_chain`].
    ///
    /// # Errors
    /// [`GenerateError::Beam`] for settings out of range.
    pub fn new(
        root: RequestId,
        slot: usize,
        last: TokenId,
        pos: usize,
        seq_len: usize,
        mut params: sampler_cpu::beam::BeamParams,
    ) -> Result<Self, GenerateError> {
        if params.num_beams > MAX_SEARCH_BEAMS {
            return Err(GenerateError::Beam(format!(
                "num_beams = {}: expected 1 to {MAX_SEARCH_BEAMS}",
                params.num_beams
            )));
        }
        params.max_new_tokens = params.max_new_tokens.min(seq_len.saturating_sub(pos));
        let search = sampler_cpu::beam::BeamSearch::new(params)
            .map_err(|e| GenerateError::Beam(e.to_string()))?;
        Ok(Self {
            search,
            beams: vec![(root, slot, last)],
            pos,
            seq_len,
        })
    }

    /// The running beams' `(last token, cache slot)`, in row order.
    pub fn rows(&self) -> impl Iterator<Item = (TokenId, usize)> + '_ {
        self.beams.iter().map(|b| (b.2, b.1))
    }

    /// The position of every running beam's last token.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Whether the search has stopped.
    pub fn is_done(&self) -> bool {
        self.search.is_done() || self.beams.is_empty() || self.pos >= self.seq_len
    }

    /// The running beams' requests (for the batch's bookkeeping).
    pub fn requests(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.beams.iter().map(|b| b.0)
    }

    /// One step over the beams' logits `[beams, vocab]` (rows in
    /// [`BeamFamily::rows`] order). Returns the bytes read back and the
    /// time spent in the batch's `filter` and the top-`2W` selection.
    ///
    /// # Errors
    /// A row's error (NaN logits, ...), a batch error, a cache error; the
    /// family is then left for [`BeamFamily::finish`].
    pub fn advance(
        &mut self,
        host: &mut dyn BeamHost,
        logits: burn_tensor::Tensor<2>,
        step: usize,
    ) -> Result<(usize, Duration), GenerateError> {
        let ts = Instant::now();
        let ids: Vec<RequestId> = self.beams.iter().map(|b| b.0).collect();
        let out = host
            .batch()
            .top_logprobs(&ids, logits, self.search.candidates_per_beam())?;
        let cands = out
            .rows
            .into_iter()
            .map(|row| row.map_err(|source| GenerateError::Sample { step, source }))
            .collect::<Result<Vec<_>, _>>()?;
        let sampling = ts.elapsed();
        let next = self
            .search
            .step(&cands)
            .map_err(|e| GenerateError::Beam(e.to_string()))?;
        // Reorder by parent: beams without a child leave (their slots freed
        // first); the first child keeps the parent's request and slot, the
        // others are forks (before any commit).
        let mut has_child = vec![false; self.beams.len()];
        for &(parent, _) in &next {
            has_child[parent] = true;
        }
        let old = std::mem::take(&mut self.beams);
        for (parent, &(rid, slot, _)) in old.iter().enumerate() {
            if !has_child[parent] {
                host.batch().remove(rid)?;
                host.free_slot(slot);
            }
        }
        // First children first, so that every request and slot is tracked
        // (and freed by `finish`) whatever fails after.
        let mut new: Vec<Option<(RequestId, usize, TokenId)>> = vec![None; next.len()];
        let mut taken = vec![false; old.len()];
        for (i, &(parent, token)) in next.iter().enumerate() {
            if !taken[parent] {
                taken[parent] = true;
                let (rid, slot, _) = old[parent];
                new[i] = Some((rid, slot, token));
            }
        }
        let mut forks = || -> Result<(), GenerateError> {
            for (i, &(parent, token)) in next.iter().enumerate() {
                if new[i].is_some() {
                    continue;
                }
                let (rid, slot, _) = old[parent];
                let s = host.alloc_slot()?;
                match host.batch().fork(rid, 1) {
                    Ok(child) => new[i] = Some((child[0], s, token)),
                    Err(e) => {
                        host.free_slot(s);
                        return Err(e.into());
                    }
                }
                host.copy_slot(slot, s)?;
            }
            Ok(())
        };
        let forked = forks();
        self.beams = new.into_iter().flatten().collect();
        forked?;
        for &(rid, _, token) in &self.beams {
            host.batch().commit(rid, token)?;
        }
        self.pos += 1;
        Ok((out.bytes_read, sampling))
    }

    /// End the search: its running beams leave the batch and free their
    /// slots; the best `num_return_sequences` sequences, best first.
    pub fn finish(self, host: &mut dyn BeamHost) -> Vec<sampler_cpu::beam::Hypothesis> {
        for &(rid, slot, _) in &self.beams {
            let _ = host.batch().remove(rid);
            host.free_slot(slot);
        }
        self.search.finish()
    }
}

/// [`BeamHost`] over one model's cache with a free list.
struct SlotsHost<'a> {
    model: &'a Llama2,
    batch: &'a mut SamplingBatch,
    cache: &'a mut crate::llama2::BatchKvCache,
    free: Vec<usize>,
}

impl BeamHost for SlotsHost<'_> {
    fn batch(&mut self) -> &mut SamplingBatch {
        self.batch
    }
    fn alloc_slot(&mut self) -> Result<usize, GenerateError> {
        self.free
            .pop()
            .ok_or(GenerateError::Beam("no free cache slot".into()))
    }
    fn free_slot(&mut self, slot: usize) {
        self.free.push(slot);
    }
    fn copy_slot(&mut self, from: usize, to: usize) -> Result<(), GenerateError> {
        Ok(self.model.copy_slot(self.cache, from, to)?)
    }
}

/// Beam search over `model` (Hugging Face semantics, [`sampler_cpu::beam`])
/// with a [`BeamFamily`] over `batch`: the chain `spec` (checked by
/// [`beam_chain`]), one KV cache of `num_beams` slots, one batched model
/// pass over the beams per step. The end-of-sequence tokens are the
/// tokenizer's stop ids; `params.eos` is set from them.
///
/// # Errors
/// [`GenerateError::Beam`] for a stage beam search cannot honour or
/// settings out of range; model, batch and per-row errors.
pub fn beam_search(
    model: &Llama2,
    tokenizer: &dyn TextCodec,
    batch: &mut SamplingBatch,
    spec: &sampler_core::ChainSpec,
    prompt_tokens: &[TokenId],
    mut params: sampler_cpu::beam::BeamParams,
) -> Result<BeamOutput, GenerateError> {
    let spec = beam_chain(spec)?;
    params.eos = tokenizer.stop_ids();
    let w = params.num_beams.clamp(1, MAX_SEARCH_BEAMS);
    let seq_len = model.config().seq_len;
    if prompt_tokens.is_empty() || prompt_tokens.len() > seq_len {
        return Err(Llama2Error::PromptTooLong {
            tokens: prompt_tokens.len(),
            seq_len,
        }
        .into());
    }
    let bos = tokenizer.bos();
    let history: Vec<TokenId> = prompt_tokens
        .iter()
        .copied()
        .filter(|&t| Some(t) != bos)
        .collect();
    let mut cache = model.new_batch_cache(w);
    let (last, prompt_time) = prefill(model, prompt_tokens, &mut cache)?;
    let root = batch.insert(spec, &history)?;
    let mut family = match BeamFamily::new(root, 0, prompt_tokens[last], last, seq_len, params) {
        Ok(f) => f,
        Err(e) => {
            let _ = batch.remove(root);
            return Err(e);
        }
    };
    let mut host = SlotsHost {
        model,
        batch,
        cache: &mut cache,
        free: (1..w).rev().collect(),
    };
    let t1 = Instant::now();
    let (mut steps, mut rows, mut bytes_read) = (0, 0, 0);
    let mut sampling_time = Duration::ZERO;
    let result = (|| -> Result<(), GenerateError> {
        while !family.is_done() {
            let (tokens, slots): (Vec<TokenId>, Vec<usize>) = family.rows().unzip();
            let logits = model.forward_batch(
                &tokens,
                &vec![family.pos(); tokens.len()],
                &slots,
                host.cache,
            )?;
            let (bytes, sampling) = family.advance(&mut host, logits, steps)?;
            bytes_read += bytes;
            sampling_time += sampling;
            rows += tokens.len();
            steps += 1;
        }
        Ok(())
    })();
    let hypotheses = family.finish(&mut host);
    result?;
    Ok(BeamOutput {
        hypotheses,
        steps,
        rows,
        bytes_read,
        prompt_time,
        gen_time: t1.elapsed(),
        sampling_time,
    })
}
