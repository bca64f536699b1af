//! Fast paths: sampling a raw row without building the full-vocabulary
//! [`Candidates`] when the chain's first active stage allows it.
//!
//! [`sample_row`] gives exactly the token (and the same chain state
//! afterwards) that [`Chain::sample`] gives on `Candidates::from_logits(row)`.
//! It looks at the chain's first active (non-no-op) stage and, when it is one
//! of the shapes below, runs a one-pass kernel over the raw logits that
//! builds the candidate set ONLY for what survives that stage, then hands the
//! survivors to the chain's own stages for the rest
//! ([`Chain::sample_from`]). The survivors are the reference stage's output
//! bit for bit (same ids, logits, order, probabilities and flags), so every
//! later stage computes what it computes in the reference. Two tails are
//! fused instead of run stage by stage, with the same arithmetic: a
//! `[temperature] -> dist` tail after any kernel (decided from reused
//! buffers: no `Candidates`, no allocation per token; over a sorted set such
//! as `top_k`'s taken in id order without sorting it when every `e` lies
//! close enough to the largest that the f64 normaliser is exact in any
//! order, `tail::temp_dist_draw_order_free`), and `penalties -> top_k ->
//! [temperature] -> dist` as a whole (the history's tokens penalised inside
//! the top-k selection, read from the stage through
//! [`Sampler::history_counts`]).
//!
//! | first active stage | kernel | survivors |
//! |---|---|---|
//! | `greedy` (the only active stage) | `top_k(1)`'s kernel | the token |
//! | `top_k(k)` then `top_p` / `min_p` cuts and a `[temperature] -> dist` tail | `top_k`'s kernel, the `k` best in id order sorted once; each cut's count on the sorted logits with the stage's arithmetic (`cuts`); the kept prefix taken in id order, the fused tail | the token |
//! | `top_k(k)` | every block's maximum, a threshold that at least `k` of them reach (bisection with vector counts), the blocks that reach it read again (for a `k` above half the block count a higher threshold from a sample of the row, taken when `k` logits reach it); selection (with a `[temperature] -> dist` tail: the `k` best in id order, no sort, where the tail's normaliser is exact in any order) | `k`, sorted |
//! | `penalties` (never raising a logit) then `top_k(k)` | with a `[temperature] -> dist` tail: selection of the tokens outside the history down to a threshold `k` of them reach (raised by the history tokens above it), the history's tokens penalised and added where they still reach it, the `k` best keys, the fused tail; otherwise selection of `k + last_n` and the penalties stage on it | the token; otherwise `k + last_n`, id order |
//! | `min_p(p)`, `p <= 1` | every block's maximum, the blocks that reach `max + ln p` read again | tokens `>= max + ln p`, id order |
//! | `top_p(p)` | max; exp + sum with mass estimates per depth; gather the head down to the estimate's depth from the blocks that reach it (a wide deep tier narrowed by band counts first); bucket it, sort only up to the cut | nucleus, sorted |
//! | `typical(p)` | max; one pass for the stage's `S` and entropy with, from the same exponentials, the mass (and for `min_keep > 1` the count) per 1/16-nat band of `l - max`; bands taken by their distance from `ln S - H` until they hold `p + 1e-4`; the tokens within that distance gathered (a vectorised test per block, the hits' positions written without a branch per lane), counting-sorted by score into buckets (below and above `ln S - H` apart), each ordered when the walk (the stage's f32 running sum) reaches it (below: the canonical key; above: rising logit, then merged); accepted when the walk ends inside | the kept tokens in score order with their probabilities, and in id order for a fused tail |
//! | `epsilon` / `eta` | max; exp + sum (`eta`: the entropy pass, which gives the sum too); the `min_keep`-th logit by selection; tokens within 1e-3 nats of the cut gathered by `min_p`'s block scan, tested with the stage's test | the kept tokens, id order, the row's probabilities |
//! | `top_n_sigma(n)` with a `[temperature] -> dist` tail | every block's maximum (and the row's validation); the stage's threshold passes (count, sum and maximum of the finite logits, then the squared deviations); the tokens at or above its cut logit gathered by the blocks that reach it; the tail sums them in their positions' lanes (the masked tokens add `+0.0`) and walks them | the token |
//! | `xtc` with a `[temperature] -> dist` tail | not acting this step (its uniform above `probability`): the tail over the row; acting: max; exp + sum; the tokens within 1e-3 nats of `ln(threshold · S)` gathered by `min_p`'s block scan and tested with the stage's test; when it removes its top choices but the least probable, the row copied without them and the tail over the copy (the set it leaves: id order, compacted), the drawn position mapped back to its token | the token |
//! | dynamic temperature then `dist` (the whole chain) | max; the stage's entropy pass and finite count give its temperature; the fused tail with it over the row (the argmax rule runs the stage) | the token |
//! | `[temperature] -> dist` (the whole chain) | a validating max pass, the fused tail over the row (it is in id order: the exp-sum pass records block sums, and the walk starts at the block that holds `u·S`, `crate::cdf`) | the token |
//! | `mirostat` (v1; its `mu` read from the stage), the chain's last active stage | max and every block's maximum (one read, which both selections filter); exp + sum; the `m` best by `top_k`'s selection for the estimate; the `k` best by the same selection (256 or more: gathered in id order, unsorted, the draw and its probability proved from their sum in id order; the whole row: the whole-row draw); the stage's draw, the token and its probability handed to the stage ([`Sampler::record_selection`]) | the token |
//! | `mirostat_v2` (its `mu` read from the stage, [`Sampler::mirostat_mu`]) | max; exp + sum; the smallest kept probability (a search over the floats' bits), tokens within 1e-3 nats of its logit gathered in id order by `min_p`'s block scan and tested with the stage's own test (only those near the cut: the rest are kept for sure); as the last active stage the draw and its probability proved from the kept set's sum in id order (`tail::draw_with_reordered_sum`), handed to the stage ([`Sampler::record_selection`]); otherwise the kept tokens sorted, and the stage runs on them (it keeps them all: checked) | the token, or the kept tokens, sorted |
//!
//! Each kernel validates the row on the way (NaN, `+inf`); a bad row, an
//! empty row, or any case the kernel cannot decide exactly (e.g. `min_p`
//! keeping fewer than `min_keep`, an all-`-inf` row for `min_p` and `top_p`)
//! runs the reference (an all-`-inf` row through `top_k` and a fused tail
//! gets the reference's `AllMasked` from the tail itself):
//! `Candidates::from_logits` and the stages one by one
//! ([`Chain::sample_from`]). A first stage that only edits logits (a custom
//! stage, `logit_bias`, `mask`, `min_tokens`) runs on the full row, in a
//! buffer reused across rows; when the row is still
//! [`Candidates::is_full_row`] afterwards, the next stage's kernel runs on
//! the edited logits.
//!
//! Why `penalties; top_k(k)` may look at only `k + last_n` tokens: when
//! `repeat >= 1`, `frequency >= 0` and `presence >= 0` a penalty never raises
//! a logit, and at most `last_n` distinct tokens are penalised, so a token
//! among the `k` best after the penalties is among the `k + last_n` best
//! before them.
//!
//! Built-in stages are recognised by their [`Sampler::spec`]; a custom stage
//! (no spec) is never replaced.

// Negated float comparisons are deliberate here: `!(x < t)` is true for NaN,
// which is how the kernels route NaN to their (erroring) slow path.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

mod cuts;
pub(crate) mod scan;
mod simd;
mod tail;
mod top_p;
mod typical;

use std::cell::RefCell;

use sampler_core::{
    Candidates, Chain, RowKernels, RowRng, SampleError, Sampler, StageContext, StageSpec, TokenId,
};

use self::scan::{
    Filter, candidate_blocks, desc_key, ids_at_least, key_id, max_checked, min_p_ids,
    row_block_maxima, top_k_ids_in_id_order, top_k_keys, top_k_keys_of, top_k_keys_outside,
};
use self::tail::{
    temp_dist_draw, temp_dist_draw_in_id_order, temp_dist_tail, temp_dist_token,
    temp_dist_token_in_id_order,
};
use self::top_p::{Nucleus, TopPScratch, top_p_full};
use self::typical::{TypicalScratch, TypicalSet, typical_full};

/// What the first active stage of a chain lets the fast path do.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lead {
    /// `greedy`, and no other active stage.
    Greedy,
    /// `top_k(k)` at stage `at`.
    TopK { at: usize, k: usize },
    /// `penalties` at stage `at` that never raise a logit, then `top_k(k)`
    /// at stage `top_k_at`: the `k` best after penalties are among the
    /// `keep` best before.
    PenaltiesTopK {
        at: usize,
        keep: usize,
        top_k_at: usize,
        k: usize,
    },
    /// `min_p(p)` at stage `at`, `0 < p <= 1`.
    MinP { at: usize, p: f32, min_keep: usize },
    /// `top_p(p)` at stage `at`, `p < 1`.
    TopP { at: usize, p: f32, min_keep: usize },
    /// `mirostat_v2` at stage `at`, its maximum surprise `mu` now.
    MirostatV2 { at: usize, mu: f32 },
    /// `mirostat` (v1) at stage `at`: `m` for its estimate, `mu` now.
    Mirostat { at: usize, m: usize, mu: f32 },
    /// `xtc` at stage `at` (active: `probability > 0`, `threshold <= 0.5`),
    /// then a `[temperature] -> dist` tail.
    Xtc {
        at: usize,
        probability: f32,
        threshold: f32,
        min_keep: usize,
    },
    /// `top_n_sigma(n)` at stage `at`, `n > 0`, then a `[temperature] ->
    /// dist` tail.
    TopNSigma { at: usize, n: f32 },
    /// `[temperature] -> dist` over the whole row.
    Dist { tail: tail::TempDist },
    /// Dynamic temperature (`range > 0`), then `dist` at `dist_at`, over the
    /// whole row.
    DynDist {
        t: f32,
        range: f32,
        exponent: f32,
        dist_at: usize,
    },
    /// `typical(p)` at stage `at`, `p < 1`.
    Typical { at: usize, p: f32, min_keep: usize },
    /// `epsilon` (or `eta` when `eta`) at stage `at`, `epsilon > 0`.
    Cut {
        at: usize,
        eta: bool,
        epsilon: f32,
        min_keep: usize,
    },
}

/// The fast kernels as [`RowKernels`], for [`Chain::with_kernels`]
/// ([`crate::build_chain`] installs them): [`Chain::sample`] and
/// [`Chain::apply`] on a full row then run [`sample_row`] / [`apply_row`].
/// A chain with custom stages gets them with
/// `Chain::new(stages, seed).with_kernels(sampler_cpu::ROW_KERNELS)`.
pub const ROW_KERNELS: RowKernels = RowKernels {
    sample: sample_row,
    apply: apply_row,
};

fn lead(stages: &[Box<dyn Sampler>]) -> Option<Lead> {
    lead_from(stages, 0)
}

/// The lead of the stages from `start` on.
fn lead_from(stages: &[Box<dyn Sampler>], start: usize) -> Option<Lead> {
    let mut active = stages
        .iter()
        .enumerate()
        .skip(start)
        .filter(|(_, s)| !s.is_noop());
    let (at, first) = active.next()?;
    match first.spec()? {
        StageSpec::Greedy => active.next().is_none().then_some(Lead::Greedy),
        StageSpec::TopK { k } if k > 0 => Some(Lead::TopK {
            at,
            k: usize::try_from(k).unwrap_or(usize::MAX),
        }),
        StageSpec::Penalties {
            last_n,
            repeat,
            frequency,
            presence,
            ..
        } if repeat >= 1.0 && frequency >= 0.0 && presence >= 0.0 => {
            let (top_k_at, next) = active.next()?;
            match next.spec()? {
                StageSpec::TopK { k } if k > 0 => {
                    let k = usize::try_from(k).unwrap_or(usize::MAX);
                    Some(Lead::PenaltiesTopK {
                        at,
                        keep: k.saturating_add(last_n),
                        top_k_at,
                        k,
                    })
                }
                _ => None,
            }
        }
        StageSpec::MinP { p, min_keep } if p > 0.0 && p <= 1.0 => {
            Some(Lead::MinP { at, p, min_keep })
        }
        StageSpec::TopP { p, min_keep } if p < 1.0 => Some(Lead::TopP { at, p, min_keep }),
        StageSpec::MirostatV2 { .. } => first
            .mirostat_mu()
            .filter(|mu| mu.is_finite())
            .map(|mu| Lead::MirostatV2 { at, mu }),
        StageSpec::Typical { p, min_keep } if p < 1.0 => Some(Lead::Typical { at, p, min_keep }),
        // Decided with its tail (it removes candidates: anything else runs
        // the reference).
        StageSpec::Xtc {
            probability,
            threshold,
            min_keep,
        } if probability > 0.0 && threshold <= 0.5 && temp_dist_tail(stages, at + 1).is_some() => {
            Some(Lead::Xtc {
                at,
                probability,
                threshold,
                min_keep,
            })
        }
        // Decided with its tail; before anything else it edits the row
        // (`Sampler::apply_full_row`) and the next stage's kernel runs.
        StageSpec::TopNSigma { n } if n > 0.0 && temp_dist_tail(stages, at + 1).is_some() => {
            Some(Lead::TopNSigma { at, n })
        }
        StageSpec::Epsilon { epsilon, min_keep } if epsilon > 0.0 => Some(Lead::Cut {
            at,
            eta: false,
            epsilon,
            min_keep,
        }),
        StageSpec::Eta { epsilon, min_keep } if epsilon > 0.0 => Some(Lead::Cut {
            at,
            eta: true,
            epsilon,
            min_keep,
        }),
        StageSpec::Temperature {
            t,
            dynatemp_range,
            dynatemp_exponent,
        } if dynatemp_range > 0.0 => match temp_dist_tail(stages, at + 1)? {
            tail::TempDist { t: None, dist_at } => Some(Lead::DynDist {
                t,
                range: dynatemp_range,
                exponent: dynatemp_exponent,
                dist_at,
            }),
            _ => None,
        },
        StageSpec::Dist | StageSpec::Temperature { .. } => {
            temp_dist_tail(stages, at).map(|tail| Lead::Dist { tail })
        }
        // Decided whole (the token): only as the chain's last active stage
        // (stages after a selecting stage still run on its set, and a later
        // selecting stage picks the token).
        StageSpec::Mirostat { m, .. } if active.next().is_none() => first
            .mirostat_mu()
            .filter(|mu| mu.is_finite())
            .map(|mu| Lead::Mirostat { at, m, mu }),
        _ => None,
    }
}

/// Per-thread reusable buffers (rayon workers each get their own).
#[derive(Debug, Default)]
struct Scratch {
    keys: Vec<u64>,
    ids: Vec<TokenId>,
    blocks: Vec<(usize, f32)>,
    sel: Vec<f32>,
    /// The row's block maxima ([`scan::row_block_maxima`]), for a kernel
    /// that filters the row more than once after one read.
    maxima: Vec<f32>,
    /// The penalties' history window, sorted by token.
    counts: Vec<(TokenId, u32)>,
    /// `(key, logit)` of the penalised top-k superset.
    keyed: Vec<(u64, f32)>,
    top_p: TopPScratch,
    nucleus: Nucleus,
    typical: TypicalScratch,
    typical_set: TypicalSet,
    /// The logits of a kept set in `ids`, in its order, for a fused tail.
    current: Vec<f32>,
    /// The running sums at every block of a fused tail over a set in id
    /// order (`tail::temp_dist_draw_in_id_order`).
    prefix: Vec<f64>,
    /// A full row for stages that edit logits before a lead.
    row: Candidates,
    /// The same as logits only, for stages with a full-row path
    /// ([`Sampler::apply_full_row`]).
    edited: Vec<f32>,
    /// A copy of keys for a selection that must leave them in order.
    copy: Vec<u64>,
    /// A row without some of its tokens (`xtc`'s top choices).
    compact: Vec<f32>,
    /// A kept set's logits in its sorted order (descending logit, ties by
    /// id), for a normaliser that must be summed in that order.
    sorted_logits: Vec<f32>,
    /// `top_p`'s fixed-point weights of a set after `top_k` (`cuts`).
    weights: Vec<u32>,
}

impl Scratch {
    /// The fused tail's draw (token, largest scaled logit, normaliser) over
    /// the kept set in `ids` / `current` (ascending id), whose reference
    /// order is sorted (descending logit, ties by id: a `top_k` set): from
    /// the normaliser summed in id order where every order gives its bits
    /// ([`tail::temp_dist_draw_order_free`]), else sorted first (the keys
    /// in `keyed`, the logits in `sorted_logits`).
    ///
    /// # Errors
    /// As [`temp_dist_draw`].
    fn draw_sorted_set_in_id_order(
        &mut self,
        t: Option<f32>,
        u: f64,
    ) -> Result<(TokenId, f32, f64), SampleError> {
        if let Some(drawn) = tail::temp_dist_draw_order_free(&self.ids, &self.current, t, u) {
            return Ok(drawn);
        }
        self.sort_kept();
        let by_id = self.ids.iter().copied().zip(self.current.iter().copied());
        temp_dist_draw(&self.sorted_logits, by_id, t, u)
    }

    /// The kept set in `ids` / `current` in its sorted order (descending
    /// logit, ties by id): `(key, logit)` in `keyed`, the logits alone in
    /// `sorted_logits`.
    fn sort_kept(&mut self) {
        self.keyed.clear();
        self.keyed.extend(
            self.ids
                .iter()
                .zip(&self.current)
                .map(|(&id, &l)| (desc_key(l, id), l)),
        );
        self.keyed.sort_unstable_by_key(|&(key, _)| key);
        self.sorted_logits.clear();
        self.sorted_logits
            .extend(self.keyed.iter().map(|&(_, l)| l));
    }

    /// The `k` best tokens of the raw row `logits` in ascending id into
    /// `ids`, their logits into `current` (`scan::top_k_ids_in_id_order`).
    /// `None` for a row with a NaN or `+inf`.
    fn top_k_in_id_order(&mut self, logits: &[f32], k: usize) -> Option<()> {
        row_block_maxima(logits, &mut self.maxima).ok()?;
        self.top_k_in_id_order_of_maxima(logits, k);
        Some(())
    }

    /// [`Self::top_k_in_id_order`] of a row whose block maxima are in
    /// `maxima` ([`scan::row_block_maxima`]): no read for them.
    fn top_k_in_id_order_of_maxima(&mut self, logits: &[f32], k: usize) {
        top_k_ids_in_id_order(
            logits,
            k,
            &self.maxima,
            &mut self.blocks,
            &mut self.keys,
            &mut self.copy,
            &mut self.ids,
        );
        self.kept_logits(logits);
    }

    /// The logits of the tokens in `ids` (a kept set, in its order) into
    /// `current`.
    fn kept_logits(&mut self, logits: &[f32]) {
        self.current.clear();
        self.current
            .extend(self.ids.iter().map(|&i| logits[i as usize]));
    }

    /// Empty the buffers that a kept set of up to the whole row passes
    /// through (`current`, `sel`, `ids`, `prefix`, `blocks`) and give them
    /// room for it at once, so that a set whose size follows the chain's
    /// state from step to step never grows them per token. Emptied first: a
    /// reserve counts from the length, which the previous token's set left,
    /// so it grew them whenever a larger set had come before.
    fn room_for_row_sets(&mut self, vocab: usize) {
        for buffer in [&mut self.current, &mut self.sel] {
            buffer.clear();
            buffer.reserve(vocab);
        }
        self.ids.clear();
        self.ids.reserve(vocab);
        self.prefix.clear();
        self.prefix.reserve(vocab.div_ceil(crate::cdf::BLOCK));
        self.blocks.clear();
        self.blocks.reserve(vocab.div_ceil(simd::BLOCK));
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        // Re-entered (a custom stage sampling inside a stage): fresh buffers.
        Err(_) => f(&mut Scratch::default()),
    })
}

/// The reference: the full-vocabulary candidate set and every stage.
fn reference(logits: &[f32], chain: &mut Chain) -> Result<TokenId, SampleError> {
    let mut row = Candidates::from_logits(logits);
    chain.sample_from(0, &mut row)
}

/// Whether stage `i` only edits logits of a full row without a kernel of
/// its own: a custom stage (checked afterwards: still a full row?), or a
/// built-in that only edits logits and is not a lead (`logit_bias`, `mask`,
/// `min_tokens`, penalties not followed by `top_k`, ...).
fn edits_only(stages: &[Box<dyn Sampler>], i: usize) -> bool {
    match stages[i].spec() {
        None => true,
        Some(spec) => {
            let fx = spec.kind().meta().effects;
            fx.logits
                && !fx.candidates
                && !fx.probs
                && !fx.selects
                && lead_from(stages, i).is_none()
        }
    }
}

/// The first active stage only edits logits (custom, or a built-in such as
/// `logit_bias`, `mask`, `min_tokens`): run it (and any such stages right
/// after it) on a full row in a reused buffer as the reference does; when the
/// row is still a full row afterwards and the next stage is a lead, its
/// kernel runs on the edited logits.
fn edit_first(logits: &[f32], chain: &mut Chain, first: usize) -> Result<TokenId, SampleError> {
    if let Some(out) = edit_first_slice(logits, chain, first) {
        return out;
    }
    let mut row = with_scratch(|s| std::mem::take(&mut s.row));
    row.fill_from_logits(logits);
    let out = edit_first_in(&mut row, chain, first);
    with_scratch(|s| s.row = row);
    out
}

/// [`edit_first`] without a `Candidates`: the stages before the first
/// kernel on a copy of the logits through [`Sampler::apply_full_row`],
/// then that kernel. `None`: not decided here, nothing changed (a bad row,
/// whose error the set's validation reports; no kernel after the edits; a
/// stage without a full-row path).
fn edit_first_slice(
    logits: &[f32],
    chain: &mut Chain,
    first: usize,
) -> Option<Result<TokenId, SampleError>> {
    let stages = chain.stages();
    let next = (first..stages.len())
        .find(|&i| !stages[i].is_noop() && !edits_only(stages, i))
        .unwrap_or(stages.len());
    if next >= chain.end() {
        return None;
    }
    // The built-in stages with a full-row path (others would send the row
    // the set's way after the copy).
    let full_row_path = |s: &dyn Sampler| {
        s.is_noop()
            || matches!(
                s.spec(),
                Some(
                    StageSpec::Penalties { .. }
                        | StageSpec::LogitBias { .. }
                        | StageSpec::Mask
                        | StageSpec::MinTokens { .. }
                        | StageSpec::NoRepeatNgram { .. }
                )
            )
    };
    if !stages[first..next]
        .iter()
        .all(|s| full_row_path(s.as_ref()))
    {
        return None;
    }
    let lead = lead_from(stages, next)?;
    // The copy reads the row first (a streaming copy), the validation then
    // reads the copy from the cache.
    let mut edited = with_scratch(|s| std::mem::take(&mut s.edited));
    edited.clear();
    edited.extend_from_slice(logits);
    if with_scratch(|s| max_checked(&edited, &mut s.sel)).is_err() {
        with_scratch(|s| s.edited = edited);
        return None;
    }
    let (seed, step) = (chain.seed(), chain.step());
    let mut applied = Some(Ok(()));
    for (i, stage) in chain.stages_mut()[..next]
        .iter_mut()
        .enumerate()
        .skip(first)
    {
        if stage.is_noop() {
            continue;
        }
        let ctx = StageContext {
            rng: RowRng {
                seed,
                step,
                stage_index: i,
            },
        };
        applied = stage.apply_full_row(&mut edited, &ctx);
        if !matches!(applied, Some(Ok(()))) {
            break;
        }
    }
    let out = match applied {
        Some(Ok(())) => Some(run_lead(&edited, lead, chain, next)),
        Some(Err(e)) => Some(Err(e)),
        None => None,
    };
    with_scratch(|s| s.edited = edited);
    out
}

fn edit_first_in(
    row: &mut Candidates,
    chain: &mut Chain,
    first: usize,
) -> Result<TokenId, SampleError> {
    row.validate()?;
    let stages = chain.stages();
    let next = (first..stages.len())
        .find(|&i| !stages[i].is_noop() && !edits_only(stages, i))
        .unwrap_or(stages.len());
    chain.apply_stages(first..next, row)?;
    if next < chain.end()
        && row.is_full_row()
        && row.validate().is_ok()
        && let Some(lead) = lead_from(chain.stages(), next)
    {
        return run_lead(row.logits(), lead, chain, next);
    }
    chain.finish_sample(next, row)
}

/// What the kernel of a [`Lead`] produced.
enum Survivors {
    /// The token (greedy).
    Token(TokenId),
    /// Every logit is `-inf` (greedy's error).
    AllMasked,
    /// The candidate set after the lead stage; resume the chain at `resume`.
    /// `by_id`: the same set in ascending token id, when the kernel has it.
    Set {
        row: Candidates,
        resume: usize,
        by_id: Option<Vec<(TokenId, f32)>>,
    },
    /// Run the reference (bad row, or a case the kernel does not decide).
    Reference,
}

fn survivors(logits: &[f32], lead: Lead, s: &mut Scratch) -> Survivors {
    let vocab = logits.len();
    let from_parts = |ids: Vec<TokenId>, l: Vec<f32>| Candidates::from_parts(ids, l, vocab).ok();
    match lead {
        // greedy == top_k(1): the maximum, ties to the lowest id.
        Lead::Greedy => match top_k_keys(logits, 1, &mut s.blocks, &mut s.sel, &mut s.keys) {
            Ok(()) => match s.keys.first() {
                Some(&key) if logits[key_id(key) as usize] == f32::NEG_INFINITY => {
                    Survivors::AllMasked
                }
                Some(&key) => Survivors::Token(key_id(key)),
                None => Survivors::Reference,
            },
            Err(_) => Survivors::Reference,
        },
        Lead::TopK { at, k } => {
            if top_k_keys(logits, k, &mut s.blocks, &mut s.sel, &mut s.keys).is_err() {
                return Survivors::Reference;
            }
            sorted_set(logits, &s.keys, at + 1)
        }
        Lead::PenaltiesTopK { at, keep, .. } => {
            // Not worth it when the superset is a large part of the row.
            if keep >= vocab / 4
                || top_k_keys(logits, keep, &mut s.blocks, &mut s.sel, &mut s.keys).is_err()
            {
                return Survivors::Reference;
            }
            // Vocabulary order, as the reference row the penalties see.
            let mut ids: Vec<TokenId> = s.keys.iter().map(|&k| key_id(k)).collect();
            ids.sort_unstable();
            let l: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
            match from_parts(ids, l) {
                Some(row) => Survivors::Set {
                    row,
                    resume: at,
                    by_id: None,
                },
                None => Survivors::Reference,
            }
        }
        Lead::MinP { at, p, min_keep } => {
            let max = match min_p_ids(logits, p.ln(), &mut s.blocks, &mut s.sel, &mut s.ids) {
                Ok(m) => m,
                Err(_) => return Survivors::Reference,
            };
            if max == f32::NEG_INFINITY || s.ids.len() < min_keep.max(1) {
                return Survivors::Reference;
            }
            let ids = s.ids.clone();
            let l: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
            match from_parts(ids, l) {
                Some(row) => Survivors::Set {
                    row,
                    resume: at + 1,
                    by_id: None,
                },
                None => Survivors::Reference,
            }
        }
        // Decided whole by `mirostat_token` when sampling; `apply_row`
        // (the candidates, no draw accepted) runs the stage itself.
        Lead::Mirostat { .. } => Survivors::Reference,
        // The whole row is the set: nothing to narrow for `apply_row`
        // (`top_n_sigma` keeps the row's size, its cut logits set to `-inf`).
        // `xtc` is decided with its tail only.
        Lead::Dist { .. } | Lead::DynDist { .. } | Lead::TopNSigma { .. } | Lead::Xtc { .. } => {
            Survivors::Reference
        }
        Lead::Typical { at, p, min_keep } => {
            let set = &mut s.typical_set;
            if !typical_full(logits, p, min_keep, false, &mut s.sel, &mut s.typical, set) {
                return Survivors::Reference;
            }
            let all = set.ids.len() == logits.len();
            match from_parts(set.ids.clone(), set.logits.clone()) {
                Some(mut row) => {
                    row.raw_mut().probs.copy_from_slice(&set.probs);
                    row.set_probs_valid(all);
                    Survivors::Set {
                        row,
                        resume: at + 1,
                        by_id: None,
                    }
                }
                None => Survivors::Reference,
            }
        }
        Lead::Cut {
            at,
            eta,
            epsilon,
            min_keep,
        } => cut_survivors(logits, at, eta, epsilon, min_keep, s),
        Lead::MirostatV2 { at, mu } => {
            if !mirostat_v2_head(logits, mu, s) {
                return Survivors::Reference;
            }
            // The stage itself runs on its own survivors: it keeps them all
            // (checked) and draws as on the whole row.
            sorted_set(logits, &s.keys, at)
        }
        Lead::TopP { at, p, min_keep } => {
            let nucleus = &mut s.nucleus;
            if top_p_full(logits, p, min_keep, true, &mut s.top_p, nucleus) != Ok(true) {
                return Survivors::Reference;
            }
            match from_parts(nucleus.ids.clone(), nucleus.logits.clone()) {
                Some(mut row) => {
                    row.raw_mut().probs.copy_from_slice(&nucleus.probs);
                    row.set_probs_valid(false);
                    row.set_sorted(true);
                    Survivors::Set {
                        row,
                        resume: at + 1,
                        by_id: Some(nucleus.by_id.clone()),
                    }
                }
                None => Survivors::Reference,
            }
        }
    }
}

/// The tokens of `keys` ([`desc_key`]s, in their sorted order) as a sorted
/// candidate set; the chain resumes at `resume`.
fn sorted_set(logits: &[f32], keys: &[u64], resume: usize) -> Survivors {
    let ids: Vec<TokenId> = keys.iter().map(|&k| key_id(k)).collect();
    let l: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
    match Candidates::from_parts(ids, l, logits.len()) {
        Ok(mut row) => {
            row.set_sorted(true);
            Survivors::Set {
                row,
                resume,
                by_id: None,
            }
        }
        Err(_) => Survivors::Reference,
    }
}

/// The candidates of `mirostat_v2`'s cut on a raw row, into `s.ids`
/// (ascending): a max pass, an exp-sum pass (the reference's softmax: its
/// `exp`, the f64 lane sum in id order, `p = (e · (1/S)) as f32`), the
/// smallest kept probability (a search over the positive floats' bits), and
/// the tokens within a margin of its logit gathered by `min_p`'s block scan.
/// Every token it kept is among them; so is the row's first (largest logit,
/// lowest id). Returns the row's maximum, `1 / S`, and a logit at or above
/// which a token is kept for sure: its probability is at least `1 + 2^-8`
/// times the smallest kept one, beyond every rounding, so its surprise lies
/// `log2(1 + 2^-8) = 0.0056` bits below that one's, hundreds of ulps of
/// `log2f` at any surprise up to 150 bits (libm's `log2f` is within an ulp
/// or two), and the stage's test keeps it. `None`: a bad or all-`-inf` row
/// (the reference reports it).
fn mirostat_v2_candidates(logits: &[f32], mu: f32, s: &mut Scratch) -> Option<(f32, f64, f32)> {
    // One read for the maximum and the block maxima the gather filters.
    let max = row_block_maxima(logits, &mut s.maxima).ok()?;
    if max == f32::NEG_INFINITY {
        return None;
    }
    let sum = sampler_core::numerics::exp_sum(logits, max);
    let margin = 1e-3 + 8.0 * f64::from(max.abs() * f32::EPSILON);
    // Nothing but the first token when even p = 1 is too surprising
    // (mu < 0).
    let (ln_cut, sure) = if mirostat_v2_keeps(1.0, mu) {
        let (mut lo, mut hi) = (0u32, 1.0f32.to_bits());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if mirostat_v2_keeps(f32::from_bits(mid), mu) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        // p >= p_min <=> e >= p_min · S (up to the rounding of e and p):
        // gather 1e-3 nats below, far beyond both roundings, and beyond the
        // rounding of the threshold `max + ln_cut` in f32 at large `max`;
        // `(1 + 2^-8) p_min` 1e-3 nats above for sure.
        let ln_min = (f64::from(f32::from_bits(hi)) * sum).ln();
        let sure = f64::from(max) + ln_min + (1.0f64 / 256.0).ln_1p() + margin;
        ((ln_min - margin).min(0.0) as f32, sure as f32)
    } else {
        (0.0, f32::INFINITY)
    };
    ids_at_least(logits, max + ln_cut, &s.maxima, &mut s.blocks, &mut s.ids);
    Some((max, 1.0 / sum, sure))
}

/// The stage's test: a candidate of probability `p` is kept while its
/// surprise `-log2 p` is at most `mu`.
#[inline]
fn mirostat_v2_keeps(p: f32, mu: f32) -> bool {
    !(-p.log2() > mu)
}

/// The tokens `mirostat_v2` keeps of a raw row, into `s.keys` ([`desc_key`]
/// order), without sorting the row: [`mirostat_v2_candidates`], sorted and
/// walked with the reference's own test up to the first token it drops (at
/// least the first). The stage then runs on these tokens alone
/// ([`Survivors::Set`] resuming at the stage): it renormalises over them,
/// which only raises their probabilities, so it keeps them all; that is
/// checked here with the stage's arithmetic, and any other outcome (or a
/// bad row) returns `false`: the reference runs.
fn mirostat_v2_head(logits: &[f32], mu: f32, s: &mut Scratch) -> bool {
    let Some((max, inv, _)) = mirostat_v2_candidates(logits, mu, s) else {
        return false;
    };
    s.keys.clear();
    s.keys
        .extend(s.ids.iter().map(|&i| desc_key(logits[i as usize], i)));
    s.keys.sort_unstable();
    let keep = s
        .keys
        .iter()
        .position(|&k| !mirostat_v2_keeps(cut_prob(logits[key_id(k) as usize], max, inv), mu))
        .unwrap_or(s.keys.len())
        .max(1);
    s.keys.truncate(keep);
    // The stage's pass over these tokens: softmax in their (sorted) order.
    s.current.clear();
    s.current.extend(
        s.keys
            .iter()
            .map(|&k| sampler_core::numerics::exp(logits[key_id(k) as usize] - max)),
    );
    let inv_kept = 1.0 / sampler_core::numerics::sum_f64_slice(&s.current);
    s.current
        .iter()
        .all(|&e| mirostat_v2_keeps((f64::from(e) * inv_kept) as f32, mu))
}

/// Mirostat v2 on a raw row as the chain's last active stage, decided whole
/// and without sorting anything: [`mirostat_v2_candidates`], filtered in id
/// order with the stage's test (those at or above its sure logit kept
/// without it). The stage keeps the sorted prefix before the
/// first token it drops (at least the first); the filtered set is that
/// prefix when every gathered token it drops lies below every token it keeps
/// (equal logits get the same probability), which is checked, so the
/// stage's `exp` need not be monotone. The stage then renormalises the kept
/// set in its sorted order and draws with `dist_select`; here the token and
/// its probability (what the stage records for its `mu` update) are proved
/// from the normaliser summed in id order
/// (`tail::draw_with_reordered_sum`). `None`: not decided here (a bad or
/// all-`-inf` row, a kept set that is not a prefix, or a draw the proof does
/// not settle: the probability's f32 rounding within the normaliser's
/// bound).
fn mirostat_v2_token(
    logits: &[f32],
    chain: &Chain,
    at: usize,
    mu: f32,
    s: &mut Scratch,
) -> Option<(TokenId, f32)> {
    // The kept set follows `mu` from step to step.
    s.room_for_row_sets(logits.len());
    let (max, inv, sure) = mirostat_v2_candidates(logits, mu, s)?;
    // The row's first token (kept when the test drops every token).
    let first = *s.ids.iter().find(|&&i| logits[i as usize] == max)?;
    let (mut lowest_kept, mut highest_dropped) = (f32::INFINITY, f32::NEG_INFINITY);
    s.ids.retain(|&i| {
        let l = logits[i as usize];
        let kept = l >= sure || mirostat_v2_keeps(cut_prob(l, max, inv), mu);
        if kept {
            lowest_kept = lowest_kept.min(l);
        } else {
            highest_dropped = highest_dropped.max(l);
        }
        kept
    });
    if s.ids.is_empty() {
        s.ids.push(first);
    } else if highest_dropped >= lowest_kept {
        return None;
    }
    s.kept_logits(logits);
    let u = stage_uniform(chain, at);
    tail::draw_with_reordered_sum(&s.ids, &s.current, max, u, &mut s.prefix)
}

/// `epsilon` / `eta` on a raw row (the stages' `cut_below`): a max pass, an
/// exp-sum pass (and for `eta` the entropy pass, `util::log_norm_entropy`)
/// give the reference's softmax and cutoff; the `min_keep`-th logit comes
/// from `top_k`'s selection; the tokens within a margin of the cut's logit
/// (or at that logit) are gathered in id order by `min_p`'s block scan and
/// tested with the stage's own test (`p >= cutoff` or `logit >= k-th`).
/// The kept ids, ascending, into `s.ids`; returns the row's maximum and
/// `1 / S` (each kept token's probability is `(exp(l - max) · (1/S)) as
/// f32`). `None`: not decided here (a bad or all-`-inf` row, fewer finite
/// logits than `min_keep`).
fn cut_ids(
    logits: &[f32],
    eta: bool,
    epsilon: f32,
    min_keep: usize,
    s: &mut Scratch,
) -> Option<(f32, f64)> {
    let vocab = logits.len();
    // One read for the maximum and the block maxima both selections filter.
    let max = row_block_maxima(logits, &mut s.maxima).ok()?;
    if max == f32::NEG_INFINITY {
        return None;
    }
    // `eta`'s entropy pass gives `S` too (`exp_sum`'s bits).
    let (sum, cutoff) = if eta {
        let (sum, entropy) = crate::util::log_norm_entropy(logits, max);
        (sum, crate::stages::eta::eta_cutoff(epsilon, entropy))
    } else {
        (sampler_core::numerics::exp_sum(logits, max), epsilon)
    };
    let inv = 1.0 / sum;
    let kth = if min_keep <= 1 {
        max
    } else {
        top_k_keys_of(
            logits,
            min_keep.min(vocab),
            &s.maxima,
            &mut s.blocks,
            &mut s.keys,
        );
        // Fewer finite logits than `min_keep`: the reference's clamp.
        let l = logits[key_id(*s.keys.last()?) as usize];
        if l == f32::NEG_INFINITY {
            return None;
        }
        l
    };
    // p >= cutoff <=> e >= cutoff · S up to the roundings of e, p and the
    // f32 threshold `max + ln_p`: 1e-3 nats below, as `mirostat_v2_head`.
    let margin = 1e-3 + 8.0 * f64::from(max.abs() * f32::EPSILON);
    let ln_p = ((f64::from(cutoff) * sum).ln())
        .min(f64::from(kth) - f64::from(max))
        .min(0.0)
        - margin;
    ids_at_least(
        logits,
        max + ln_p as f32,
        &s.maxima,
        &mut s.blocks,
        &mut s.ids,
    );
    s.ids.retain(|&i| {
        let l = logits[i as usize];
        cut_prob(l, max, inv) >= cutoff || l >= kth
    });
    Some((max, inv))
}

/// A token's probability in the reference's softmax of a raw row.
#[inline]
fn cut_prob(l: f32, max: f32, inv: f64) -> f32 {
    (f64::from(sampler_core::numerics::exp(l - max)) * inv) as f32
}

/// [`cut_ids`] as the candidate set the stage leaves: id order, the row's
/// probabilities (normalised only when nothing was cut).
fn cut_survivors(
    logits: &[f32],
    at: usize,
    eta: bool,
    epsilon: f32,
    min_keep: usize,
    s: &mut Scratch,
) -> Survivors {
    let Some((max, inv)) = cut_ids(logits, eta, epsilon, min_keep, s) else {
        return Survivors::Reference;
    };
    let ids = s.ids.clone();
    let l: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
    let all = ids.len() == logits.len();
    match Candidates::from_parts(ids, l, logits.len()) {
        Ok(mut row) => {
            let raw = row.raw_mut();
            for (p, &l) in raw.probs.iter_mut().zip(raw.logits.iter()) {
                *p = cut_prob(l, max, inv);
            }
            row.set_probs_valid(all);
            Survivors::Set {
                row,
                resume: at + 1,
                by_id: None,
            }
        }
        Err(_) => Survivors::Reference,
    }
}

/// `[temperature] -> dist` over a whole raw row, which is both the set's
/// order and id order: a validating max pass (a bad row is left to the
/// reference, which reports it), then the fused tail. `None`: not decided
/// here.
fn row_tail_token(
    logits: &[f32],
    chain: &Chain,
    tail: tail::TempDist,
    s: &mut Scratch,
) -> Option<Result<TokenId, SampleError>> {
    let max = max_checked(logits, &mut s.sel).ok()?;
    Some(row_tail_token_at(logits, max, chain, tail, s))
}

/// [`row_tail_token`] on a row already validated, whose maximum is `max`.
fn row_tail_token_at(
    logits: &[f32],
    max: f32,
    chain: &Chain,
    tail: tail::TempDist,
    s: &mut Scratch,
) -> Result<TokenId, SampleError> {
    temp_dist_token_in_id_order(
        None,
        logits,
        Some(max),
        tail.t,
        tail_uniform(chain, tail),
        &mut s.prefix,
    )
}

/// The dynamic temperature the stage computes on a raw row
/// (`stages::temperature::dynamic_t` of its entropy and finite count), as
/// the fused tail's temperature: `Some(None)` for 1 (no division), with the
/// row's maximum (the row is valid: the tail needs no second max pass).
/// `None`: not decided here (a bad, all-`-inf` or one-token row, or the
/// argmax rule).
fn dynamic_row_t(
    logits: &[f32],
    t: f32,
    range: f32,
    exponent: f32,
    s: &mut Scratch,
) -> Option<(Option<f32>, f32)> {
    if logits.len() <= 1 {
        return None;
    }
    let max = max_checked(logits, &mut s.sel).ok()?;
    if max == f32::NEG_INFINITY {
        return None;
    }
    let (_, entropy) = crate::util::log_norm_entropy(logits, max);
    // Finite: `>= -f32::MAX` (no NaN or `+inf` passed the max pass), a
    // vectorised count.
    let finite = scan::count_at_least(logits, -f32::MAX);
    let t = crate::stages::temperature::dynamic_t(t, range, exponent, entropy, finite);
    if t.is_nan() || t < sampler_core::GREEDY_TEMPERATURE {
        return None;
    }
    Some(((t != 1.0).then_some(t), max))
}

/// `xtc` (its `probability`, `threshold`, `min_keep`) at stage `at` on a
/// raw row, then its `[temperature] -> dist` tail, without a `Candidates`:
/// when the stage does not act this step (its uniform above
/// `probability`, fewer than two tokens) the tail runs over the row; when
/// it acts, an exp-sum pass gives the stage's softmax (the f64 lane sum in
/// id order, `p = (e · (1/S)) as f32`), the tokens within 1e-3 nats below
/// `ln(threshold · S)` are gathered by `min_p`'s block scan and tested with
/// the stage's test (`p >= threshold`, `p > 0`: every top choice is among
/// them), and when the stage removes its top choices but the least
/// probable (two or more of them, `min_keep` left) the row is copied
/// without them and the tail runs over the copy, which is the set the stage
/// leaves (id order, compacted: the normaliser's lanes by its positions);
/// the drawn position is mapped back to its token. `None`: not decided here
/// (a bad or all-`-inf` row).
fn xtc_tail_token(
    logits: &[f32],
    chain: &Chain,
    at: usize,
    (probability, threshold, min_keep): (f32, f32, usize),
    tail: tail::TempDist,
    s: &mut Scratch,
) -> Option<Result<TokenId, SampleError>> {
    // One read for the maximum and the block maxima the gather filters.
    let max = row_block_maxima(logits, &mut s.maxima).ok()?;
    if max == f32::NEG_INFINITY {
        return None;
    }
    let u = tail_uniform(chain, tail);
    let whole_row = |s: &mut Scratch| {
        temp_dist_token_in_id_order(None, logits, Some(max), tail.t, u, &mut s.prefix)
    };
    let chance = stage_uniform(chain, at) as f32;
    if logits.len() < 2 || probability.is_nan() || chance > probability {
        return Some(whole_row(s));
    }
    let sum = sampler_core::numerics::exp_sum(logits, max);
    let inv = 1.0 / sum;
    let margin = 1e-3 + 8.0 * f64::from(max.abs() * f32::EPSILON);
    let ln_p = ((f64::from(threshold) * sum).ln() - margin).min(0.0) as f32;
    ids_at_least(logits, max + ln_p, &s.maxima, &mut s.blocks, &mut s.ids);
    s.ids.retain(|&i| {
        let p = cut_prob(logits[i as usize], max, inv);
        p >= threshold && p > 0.0
    });
    // The least probable top choice stays: the last in the canonical order.
    let Some(&last) = s
        .ids
        .iter()
        .max_by_key(|&&i| desc_key(logits[i as usize], i))
    else {
        return Some(whole_row(s));
    };
    let count = s.ids.len();
    if count < 2 || logits.len() - (count - 1) < min_keep {
        return Some(whole_row(s));
    }
    s.ids.retain(|&i| i != last);
    // The row without the removed tokens (ascending ids), then the tail.
    s.compact.clear();
    let mut from = 0usize;
    for &r in &s.ids {
        s.compact.extend_from_slice(&logits[from..r as usize]);
        from = r as usize + 1;
    }
    s.compact.extend_from_slice(&logits[from..]);
    let drawn = temp_dist_token_in_id_order(None, &s.compact, None, tail.t, u, &mut s.prefix);
    Some(drawn.map(|j| {
        // Position `j` of the copy: the removed tokens before it shift it.
        let mut id = j;
        for &r in &s.ids {
            if r <= id {
                id += 1;
            } else {
                break;
            }
        }
        id
    }))
}

/// The kept-set size from which [`mirostat_token`] gathers the set in id
/// order and proves its draw from that order's sum, instead of selecting
/// and sorting it (a quarter of the row before: on the benchmark's Zipf
/// rows, kept sets of 140 tokens to the whole row, the chain measured about
/// 9 % faster with this bound).
const MIROSTAT_UNSORTED_FROM: usize = 256;

/// Mirostat v1 on a raw row, with the stage's arithmetic
/// ([`crate::stages::mirostat::keep_count`]) and without sorting the row:
/// a max pass and an exp-sum pass give the softmax the stage computes (its
/// `exp`, the f64 lane sum in id order, `(e · (1/S)) as f32`); the `m` best
/// by `top_k`'s selection give the estimate and `k`. Then, by the size of
/// the kept set:
/// * the whole row (the stage keeps it in its order): the whole-row draw;
/// * [`MIROSTAT_UNSORTED_FROM`] tokens or more: the `k` best gathered in
///   id order without sorting them, the token and its probability proved from their
///   normaliser summed in id order (`tail::draw_with_reordered_sum`; the
///   stage sums it in sorted order);
/// * fewer: the `k` best by the same selection, sorted, from which the
///   fused tail draws with `dist_select`'s arithmetic.
///
/// Returns the token and its probability after the truncation (what the
/// stage records for its `mu` update). `None`: not decided here (a bad or
/// all-`-inf` row, or a large kept set where the proof does not hold:
/// under one draw in 10^3, where the probability's f32 rounding lies within
/// the normaliser's bound).
fn mirostat_token(
    logits: &[f32],
    chain: &Chain,
    at: usize,
    m: usize,
    mu: f32,
    s: &mut Scratch,
) -> Option<Result<(TokenId, f32), SampleError>> {
    let vocab = logits.len();
    // One read for the maximum and the block maxima, which both selections
    // below (the `m` best, then the kept set) filter without a read of
    // their own.
    let max = row_block_maxima(logits, &mut s.maxima).ok()?;
    if max == f32::NEG_INFINITY || m == 0 {
        return None;
    }
    let inv = 1.0 / sampler_core::numerics::exp_sum(logits, max);
    top_k_keys_of(logits, m.min(vocab), &s.maxima, &mut s.blocks, &mut s.keys);
    s.current.clear();
    s.current.extend(s.keys.iter().map(|&key| {
        let e = sampler_core::numerics::exp(logits[key_id(key) as usize] - max);
        (f64::from(e) * inv) as f32
    }));
    let keep = crate::stages::mirostat::keep_count(&s.current, m, mu, vocab, vocab);
    // `keep` follows `mu` from step to step.
    s.room_for_row_sets(vocab);
    for buffer in [&mut s.keys, &mut s.copy] {
        buffer.clear();
        buffer.reserve(vocab);
    }
    // A kept set below `MIROSTAT_UNSORTED_FROM` may be sorted for its
    // normaliser (`Scratch::draw_sorted_set_in_id_order`).
    s.keyed.clear();
    s.keyed.reserve(MIROSTAT_UNSORTED_FROM);
    s.sorted_logits.clear();
    s.sorted_logits.reserve(MIROSTAT_UNSORTED_FROM);
    let u = stage_uniform(chain, at);
    if keep >= vocab {
        // The stage keeps the row in its order (id order): the whole-row
        // draw, whose normaliser is the stage's.
        let (token, kept_max, kept_sum) =
            match temp_dist_draw_in_id_order(None, logits, Some(max), None, u, &mut s.prefix) {
                Ok(drawn) => drawn,
                Err(e) => return Some(Err(e)),
            };
        let e = sampler_core::numerics::exp(logits[token as usize] - kept_max);
        return Some(Ok((token, (f64::from(e) * (1.0 / kept_sum)) as f32)));
    }
    s.top_k_in_id_order_of_maxima(logits, keep);
    if keep >= MIROSTAT_UNSORTED_FROM {
        // A large kept set: not sorted (the stage sorts it and sums its
        // normaliser in that order), gathered in id order, the token and
        // its probability proved from the sum in id order.
        return tail::draw_with_reordered_sum(&s.ids, &s.current, max, u, &mut s.prefix).map(Ok);
    }
    // `dist_select`'s arithmetic, as the fused tails.
    let (token, kept_max, kept_sum) = match s.draw_sorted_set_in_id_order(None, u) {
        Ok(drawn) => drawn,
        Err(e) => return Some(Err(e)),
    };
    // Its probability as `dist_select` writes it: `e · (1/S)` in f64, as f32.
    let e = sampler_core::numerics::exp(logits[token as usize] - kept_max);
    Some(Ok((token, (f64::from(e) * (1.0 / kept_sum)) as f32)))
}

/// Sample one token from a raw logits row `[vocab]` (token id = position)
/// with `chain`, which accepts the token and advances its step.
///
/// Exactly [`Chain::sample`] on `Candidates::from_logits(logits)` (same
/// token, same errors, same chain state afterwards), but when the chain's
/// first active stage has a kernel (`greedy`, `top_k`, `penalties` +
/// `top_k`, `min_p`, `top_p`, `typical`, `epsilon`, `eta`, `mirostat`,
/// `mirostat_v2`, and with a `[temperature] -> dist` tail `top_n_sigma`,
/// `xtc`, dynamic temperature or the tail alone; stages that only edit
/// logits run on a copy of the row first), the full-vocabulary candidate
/// set is never built: a few passes over the row keep only that stage's
/// survivors (see the module docs).
///
/// # Errors
/// As [`Chain::sample`]: [`SampleError::NoSelectingStage`],
/// [`SampleError::EmptyRow`], [`SampleError::NanLogit`],
/// [`SampleError::PosInfLogit`], [`SampleError::AllMasked`], or a stage's error.
pub fn sample_row(logits: &[f32], chain: &mut Chain) -> Result<TokenId, SampleError> {
    if logits.is_empty() || !chain.selects() {
        return reference(logits, chain);
    }
    // One look at the first active stage: custom, a lead, or neither.
    let Some(first) = chain.stages().iter().position(|s| !s.is_noop()) else {
        return reference(logits, chain);
    };
    let Some(lead) = lead_from(chain.stages(), first) else {
        if edits_only(chain.stages(), first) {
            return edit_first(logits, chain, first);
        }
        return reference(logits, chain);
    };
    run_lead(logits, lead, chain, 0)
}

/// `penalties -> top_k(k) -> [temperature] -> dist` with the history read
/// from the penalties stage ([`Sampler::history_counts`]): one selection
/// over the raw logits that skips the history's tokens
/// ([`scan::top_k_keys_outside`]: the tokens outside the history that
/// reach a threshold `T` below which `k` of them lie), the history's tokens
/// penalised with the stage's own arithmetic
/// ([`crate::stages::Penalties::penalised`]) and kept where they still
/// reach `T`, then the `k` best keys and the fused tail. `None`: not
/// decided here (no history window, a bad row, a history too large to be
/// worth it, a NaN after a penalty); the caller goes on as without this
/// path.
fn penalised_top_k_token(
    logits: &[f32],
    chain: &Chain,
    at: usize,
    k: usize,
    cuts: &cuts::Cuts,
    s: &mut Scratch,
) -> Option<Result<TokenId, SampleError>> {
    let stage = &chain.stages()[at];
    let Some(StageSpec::Penalties {
        last_n,
        repeat,
        frequency,
        presence,
        scope,
    }) = stage.spec()
    else {
        return None;
    };
    let vocab = logits.len();
    s.counts.clear();
    if !stage.history_counts(&mut s.counts) {
        return None;
    }
    // Tokens outside the row are never penalised (the stage matches ids).
    s.counts.retain(|&(t, c)| (t as usize) < vocab && c > 0);
    // The built-in stage hands them over sorted by token.
    if !s.counts.is_sorted() {
        s.counts.sort_unstable();
    }
    if k.saturating_add(s.counts.len()) >= vocab / 4 {
        return None;
    }
    let thr =
        top_k_keys_outside(logits, k, &s.counts, &mut s.blocks, &mut s.sel, &mut s.keys).ok()?;
    let pen = crate::stages::Penalties::new(last_n, repeat, frequency, presence, scope);
    s.keyed.clear();
    s.keyed.extend(
        s.keys
            .iter()
            .map(|&key| (key, logits[key_id(key) as usize])),
    );
    let outside = s.keyed.len();
    // A history token whose penalised logit is below `thr` is beaten by `k`
    // tokens outside the history.
    for &(t, c) in &s.counts {
        let l = pen.penalised(logits[t as usize], c);
        if l.is_nan() {
            return None;
        }
        if l >= thr {
            s.keyed.push((desc_key(l, t), l));
        }
    }
    top_k_tail_token(s, outside, k, chain, cuts)
}

/// The uniform in `[0, 1)` that the `dist` stage at `tail.dist_at` draws at
/// the chain's current step.
fn tail_uniform(chain: &Chain, tail: tail::TempDist) -> f64 {
    stage_uniform(chain, tail.dist_at)
}

/// The uniform in `[0, 1)` that the stage at `at` draws at the chain's
/// current step (its lane 0).
fn stage_uniform(chain: &Chain, at: usize) -> f64 {
    RowRng {
        seed: chain.seed(),
        step: chain.step(),
        stage_index: at,
    }
    .uniform(0)
}

/// `top_k(k)`, `cuts` and their `[temperature] -> dist` tail over the
/// `(key, logit)` pairs ([`desc_key`]) in `s.keyed`, two runs each in
/// ascending id (`..split` and `split..`): the `k` best keys (the k-th by
/// a selection on a copy), merged into ascending id in `s.ids` /
/// `s.current`, then [`cuts::cut_and_draw`] (`None` as there).
fn top_k_tail_token(
    s: &mut Scratch,
    split: usize,
    k: usize,
    chain: &Chain,
    cuts: &cuts::Cuts,
) -> Option<Result<TokenId, SampleError>> {
    debug_assert!(k >= 1, "top_k(0) is no lead");
    let kth = if k < s.keyed.len() {
        s.copy.clear();
        s.copy.extend(s.keyed.iter().map(|&(key, _)| key));
        *s.copy.select_nth_unstable(k - 1).1
    } else {
        u64::MAX
    };
    let (first, second) = s.keyed.split_at(split);
    debug_assert!(first.is_sorted_by_key(|&(key, _)| key_id(key)));
    debug_assert!(second.is_sorted_by_key(|&(key, _)| key_id(key)));
    s.ids.clear();
    s.current.clear();
    let kept = |&&(key, _): &&(u64, f32)| key <= kth;
    let mut a = first.iter().filter(kept).peekable();
    let mut b = second.iter().filter(kept).peekable();
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if key_id(y.0) < key_id(x.0) => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        };
        let Some(&(key, l)) = next else { break };
        s.ids.push(key_id(key));
        s.current.push(l);
    }
    cuts::cut_and_draw(s, cuts, chain)
}

/// The fused tail over the kept ids in `s.ids` (ascending, a set that holds
/// the row's maximum `max`): one order for the normaliser and the walk.
fn kept_ids_tail_token(
    logits: &[f32],
    max: f32,
    chain: &Chain,
    tail: tail::TempDist,
    s: &mut Scratch,
) -> Result<TokenId, SampleError> {
    s.kept_logits(logits);
    let u = tail_uniform(chain, tail);
    temp_dist_token_in_id_order(
        Some(&s.ids),
        &s.current,
        Some(max),
        tail.t,
        u,
        &mut s.prefix,
    )
}

/// A `top_k`, `min_p` or `top_p` lead followed by a `[temperature] -> dist`
/// tail: the token from the kernel's survivors in the scratch buffers, with
/// no `Candidates` and no allocation once the buffers have grown. `None`:
/// not decided here (a bad row, a case the kernel leaves to the
/// reference); the caller goes on as without this path.
fn lead_tail_token(
    logits: &[f32],
    lead: Lead,
    chain: &Chain,
    tail: tail::TempDist,
    s: &mut Scratch,
) -> Option<Result<TokenId, SampleError>> {
    match lead {
        Lead::TopK { k, .. } => {
            // The k best gathered in id order (no sort), the walk's order.
            s.top_k_in_id_order(logits, k)?;
            if s.ids.is_empty() {
                return None;
            }
            let u = tail_uniform(chain, tail);
            Some(
                s.draw_sorted_set_in_id_order(tail.t, u)
                    .map(|(token, _, _)| token),
            )
        }
        Lead::MinP { p, min_keep, .. } => {
            let max = min_p_ids(logits, p.ln(), &mut s.blocks, &mut s.sel, &mut s.ids).ok()?;
            if max == f32::NEG_INFINITY || s.ids.len() < min_keep.max(1) {
                return None;
            }
            Some(kept_ids_tail_token(logits, max, chain, tail, s))
        }
        Lead::TopP { p, min_keep, .. } => {
            let nucleus = &mut s.nucleus;
            // The tail needs the set alone: no probabilities, no `S`.
            if !top_p_full(logits, p, min_keep, false, &mut s.top_p, nucleus).ok()? {
                return None;
            }
            let u = tail_uniform(chain, tail);
            Some(temp_dist_token(
                &nucleus.logits,
                nucleus.by_id.iter().copied(),
                tail.t,
                u,
            ))
        }
        Lead::Typical { p, min_keep, .. } => {
            let set = &mut s.typical_set;
            if !typical_full(logits, p, min_keep, true, &mut s.sel, &mut s.typical, set) {
                return None;
            }
            // The set's (score) order for the normaliser, ids for the walk.
            let u = tail_uniform(chain, tail);
            Some(temp_dist_token(
                &set.logits,
                set.by_id.iter().copied(),
                tail.t,
                u,
            ))
        }
        Lead::Cut {
            eta,
            epsilon,
            min_keep,
            ..
        } => {
            let (max, _) = cut_ids(logits, eta, epsilon, min_keep, s)?;
            Some(kept_ids_tail_token(logits, max, chain, tail, s))
        }
        Lead::Xtc {
            at,
            probability,
            threshold,
            min_keep,
        } => xtc_tail_token(
            logits,
            chain,
            at,
            (probability, threshold, min_keep),
            tail,
            s,
        ),
        Lead::TopNSigma { n, .. } => {
            // The stage's threshold and cut logit on the raw row; the kept
            // tokens in id order, read again only in the blocks that reach it.
            let (_, max) =
                candidate_blocks(logits, Filter::TopK(1), &mut s.blocks, &mut s.sel).ok()?;
            if max == f32::NEG_INFINITY || logits.len() <= 1 {
                return None;
            }
            let cut = crate::stages::top_n_sigma::cut_logit(logits, n)?;
            ids_at_least(logits, cut, &s.sel, &mut s.blocks, &mut s.ids);
            s.kept_logits(logits);
            let u = tail_uniform(chain, tail);
            Some(tail::temp_dist_token_masked_row(
                &s.ids, &s.current, max, tail.t, u,
            ))
        }
        Lead::Greedy
        | Lead::PenaltiesTopK { .. }
        | Lead::MirostatV2 { .. }
        | Lead::Mirostat { .. }
        | Lead::Dist { .. }
        | Lead::DynDist { .. } => None,
    }
}

/// Run `lead`'s kernel on `logits` and the rest of the chain on its
/// survivors. `start`: where the reference resumes when the kernel cannot
/// decide (0: the whole chain, with validation; otherwise the stages from
/// `start` on a row validated before).
fn run_lead(
    logits: &[f32],
    lead: Lead,
    chain: &mut Chain,
    start: usize,
) -> Result<TokenId, SampleError> {
    if let Lead::PenaltiesTopK {
        at, top_k_at, k, ..
    } = lead
        && let Some(cuts) = cuts::cuts_tail(chain.stages(), top_k_at + 1)
        && let Some(token) = with_scratch(|s| penalised_top_k_token(logits, chain, at, k, &cuts, s))
    {
        let token = token?;
        chain.commit(token);
        return Ok(token);
    }
    if let Lead::TopK { at, .. }
    | Lead::MinP { at, .. }
    | Lead::TopP { at, .. }
    | Lead::Typical { at, .. }
    | Lead::Cut { at, .. }
    | Lead::TopNSigma { at, .. }
    | Lead::Xtc { at, .. } = lead
        && let Some(tail) = temp_dist_tail(chain.stages(), at + 1)
        && let Some(token) = with_scratch(|s| lead_tail_token(logits, lead, chain, tail, s))
    {
        let token = token?;
        chain.commit(token);
        return Ok(token);
    }
    // top_k, then top_p / min_p cuts, then the tail (llama.cpp's default).
    if let Lead::TopK { at, k } = lead
        && let Some(cuts) = cuts::cuts_tail(chain.stages(), at + 1)
        && !cuts.is_empty()
        && let Some(token) = with_scratch(|s| cuts::top_k_cuts_token(logits, k, &cuts, chain, s))
    {
        let token = token?;
        chain.commit(token);
        return Ok(token);
    }
    if let Lead::Dist { tail } = lead
        && let Some(token) = with_scratch(|s| row_tail_token(logits, chain, tail, s))
    {
        let token = token?;
        chain.commit(token);
        return Ok(token);
    }
    if let Lead::DynDist {
        t,
        range,
        exponent,
        dist_at,
    } = lead
        && let Some(token) = with_scratch(|s| {
            let (t, max) = dynamic_row_t(logits, t, range, exponent, s)?;
            let tail = tail::TempDist { t, dist_at };
            Some(row_tail_token_at(logits, max, chain, tail, s))
        })
    {
        let token = token?;
        chain.commit(token);
        return Ok(token);
    }
    if let Lead::Mirostat { at, m, mu } = lead
        && let Some(out) = with_scratch(|s| mirostat_token(logits, chain, at, m, mu, s))
    {
        let (token, prob) = out?;
        chain.stages_mut()[at].record_selection(token, prob);
        chain.commit(token);
        return Ok(token);
    }
    if let Lead::MirostatV2 { at, mu } = lead
        && chain.stages()[at + 1..].iter().all(|stage| stage.is_noop())
        && let Some((token, prob)) = with_scratch(|s| mirostat_v2_token(logits, chain, at, mu, s))
    {
        chain.stages_mut()[at].record_selection(token, prob);
        chain.commit(token);
        return Ok(token);
    }
    match with_scratch(|s| survivors(logits, lead, s)) {
        Survivors::Token(t) => {
            chain.commit(t);
            Ok(t)
        }
        Survivors::AllMasked => Err(SampleError::AllMasked),
        Survivors::Set {
            mut row,
            resume,
            by_id: _,
        } if let Lead::PenaltiesTopK { top_k_at, k, .. } = lead
            && let Some(tail) = temp_dist_tail(chain.stages(), top_k_at + 1) =>
        {
            // penalties -> top_k -> [temperature] -> dist: the chain's own
            // penalties stage on the superset (id order, as it would see the
            // full row), then top_k on its keys and the fused tail.
            chain.apply_stages(resume..top_k_at, &mut row)?;
            let drawn = with_scratch(|s| {
                s.keyed.clear();
                s.keyed.extend(
                    row.ids()
                        .iter()
                        .zip(row.logits())
                        .map(|(&id, &l)| (desc_key(l, id), l)),
                );
                // One run in ascending id (sorted, should the stage have
                // reordered the row).
                if !s.keyed.is_sorted_by_key(|&(key, _)| key_id(key)) {
                    s.keyed.sort_unstable_by_key(|&(key, _)| key_id(key));
                }
                let split = s.keyed.len();
                top_k_tail_token(s, split, k, chain, &cuts::Cuts::none(tail))
            });
            match drawn {
                Some(token) => {
                    let token = token?;
                    chain.commit(token);
                    Ok(token)
                }
                // Not decided there: the stages from `top_k` on.
                None => chain.sample_from(top_k_at, &mut row),
            }
        }
        Survivors::Set {
            mut row,
            resume,
            by_id,
        } => match temp_dist_tail(chain.stages(), resume) {
            // A `[temperature] -> dist` tail: fused, no id sort of the set.
            Some(tail) => {
                let u = tail_uniform(chain, tail);
                let current = row.logits();
                let pairs = row.ids().iter().copied().zip(row.logits().iter().copied());
                let token = match by_id {
                    Some(by_id) => temp_dist_token(current, by_id.into_iter(), tail.t, u),
                    None if row.ids().is_sorted() => with_scratch(|s| {
                        temp_dist_token_in_id_order(
                            Some(row.ids()),
                            current,
                            None,
                            tail.t,
                            u,
                            &mut s.prefix,
                        )
                    }),
                    None => {
                        let mut by_id: Vec<(TokenId, f32)> = pairs.collect();
                        by_id.sort_unstable_by_key(|&(id, _)| id);
                        temp_dist_token(current, by_id.into_iter(), tail.t, u)
                    }
                }?;
                chain.commit(token);
                Ok(token)
            }
            None => chain.sample_from(resume, &mut row),
        },
        Survivors::Reference if start == 0 => reference(logits, chain),
        Survivors::Reference => chain.finish_sample(start, &mut Candidates::from_logits(logits)),
    }
}

/// Apply every stage of `chain` to a raw logits row `[vocab]` and return the
/// final candidate set, without accepting or advancing the step.
///
/// Exactly [`Chain::apply`] on `Candidates::from_logits(logits)` (same
/// candidates, order, probabilities, flags and selection, same errors), with
/// the fast paths of [`sample_row`] for the first active stage (except
/// `greedy`, whose output is the full set).
///
/// # Errors
/// As [`Chain::apply`].
pub fn apply_row(logits: &[f32], chain: &mut Chain) -> Result<Candidates, SampleError> {
    let lead = match lead(chain.stages()) {
        Some(Lead::Greedy) | None => None,
        other => other,
    };
    if let Some(lead) = lead.filter(|_| !logits.is_empty())
        && let Survivors::Set {
            mut row, resume, ..
        } = with_scratch(|s| survivors(logits, lead, s))
    {
        chain.apply_from(resume, &mut row)?;
        return Ok(row);
    }
    let mut row = Candidates::from_logits(logits);
    chain.apply_from(0, &mut row)?;
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_core::ChainSpec;

    fn zipf(vocab: usize) -> Vec<f32> {
        // Ranks scattered over ids by a multiplicative permutation.
        let mut r = vec![0.0f32; vocab];
        for rank in 0..vocab {
            r[(rank * 7919 + 13) % vocab] = -1.1 * ((rank + 1) as f32).ln();
        }
        r
    }

    /// Every fast path really runs (does not fall back) on a realistic row.
    #[test]
    fn fast_paths_take_their_kernel() {
        let temp = StageSpec::Temperature {
            t: 0.8,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        };
        let pen = StageSpec::Penalties {
            last_n: 64,
            repeat: 1.1,
            frequency: 0.0,
            presence: 0.0,
            scope: sampler_core::HistoryScope::PromptAndOutput,
        };
        let cases = [
            vec![StageSpec::Greedy],
            vec![StageSpec::TopK { k: 40 }, temp.clone(), StageSpec::Dist],
            vec![pen, StageSpec::TopK { k: 40 }, StageSpec::Dist],
            vec![
                StageSpec::MinP {
                    p: 0.05,
                    min_keep: 1,
                },
                StageSpec::Dist,
            ],
            vec![
                StageSpec::TopP {
                    p: 0.9,
                    min_keep: 1,
                },
                temp,
                StageSpec::Dist,
            ],
            vec![StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 }],
            vec![StageSpec::MirostatV2 { tau: 1.0, eta: 0.1 }],
            vec![
                StageSpec::Epsilon {
                    epsilon: 3e-4,
                    min_keep: 1,
                },
                StageSpec::Dist,
            ],
            vec![
                StageSpec::Eta {
                    epsilon: 3e-4,
                    min_keep: 10,
                },
                StageSpec::Dist,
            ],
            vec![
                StageSpec::Typical {
                    p: 0.95,
                    min_keep: 1,
                },
                StageSpec::Dist,
            ],
            vec![
                StageSpec::Typical {
                    p: 0.2,
                    min_keep: 5,
                },
                StageSpec::Dist,
            ],
        ];
        let logits = zipf(10_007);
        for stages in cases {
            let chain = crate::build_chain(&ChainSpec::new(stages, Some(1))).unwrap();
            let lead = lead(chain.stages()).unwrap();
            let out = with_scratch(|s| survivors(&logits, lead, s));
            assert!(!matches!(out, Survivors::Reference), "{lead:?} fell back");
        }
        // `[temperature] -> dist` over the whole row, decided by its tail.
        for stages in [
            vec![StageSpec::Dist],
            vec![
                StageSpec::Temperature {
                    t: 0.7,
                    dynatemp_range: 0.0,
                    dynatemp_exponent: 1.0,
                },
                StageSpec::Dist,
            ],
        ] {
            let chain = crate::build_chain(&ChainSpec::new(stages, Some(1))).unwrap();
            let Some(Lead::Dist { tail }) = lead(chain.stages()) else {
                panic!("no whole-row tail lead");
            };
            let out = with_scratch(|s| row_tail_token(&logits, &chain, tail, s));
            assert!(matches!(out, Some(Ok(_))), "{tail:?} fell back");
        }
        // `top_n_sigma` and `xtc`, then the tail: decided by their fused tail.
        let xtc = |threshold| StageSpec::Xtc {
            probability: 1.0,
            threshold,
            min_keep: 1,
        };
        for first in [
            StageSpec::TopNSigma { n: 0.5 },
            StageSpec::TopNSigma { n: 3.0 },
            xtc(0.0),
            xtc(0.01),
            xtc(0.5),
        ] {
            let spec = ChainSpec::new(vec![first, StageSpec::Dist], Some(1));
            let chain = crate::build_chain(&spec).unwrap();
            let lead = lead(chain.stages()).unwrap();
            let tail = temp_dist_tail(chain.stages(), 1).unwrap();
            let out = with_scratch(|s| lead_tail_token(&logits, lead, &chain, tail, s));
            assert!(matches!(out, Some(Ok(_))), "{lead:?} fell back");
        }
        // Dynamic temperature then `dist`: its temperature from the row.
        let spec = ChainSpec::new(
            vec![
                StageSpec::Temperature {
                    t: 0.8,
                    dynatemp_range: 0.5,
                    dynatemp_exponent: 1.0,
                },
                StageSpec::Dist,
            ],
            Some(1),
        );
        let chain = crate::build_chain(&spec).unwrap();
        let Some(Lead::DynDist {
            t, range, exponent, ..
        }) = lead(chain.stages())
        else {
            panic!("no dynamic-temperature lead");
        };
        let got = with_scratch(|s| dynamic_row_t(&logits, t, range, exponent, s));
        assert!(
            matches!(got, Some((Some(t), max)) if t > 0.3 && t < 1.3 && max == 0.0),
            "{got:?}"
        );
        // Mirostat v1 is decided whole (token and probability), over steps
        // as its `mu` moves.
        for (tau, m) in [(5.0, 100), (3.0, 20)] {
            let spec = ChainSpec::new(vec![StageSpec::Mirostat { tau, eta: 0.1, m }], Some(1));
            let mut chain = crate::build_chain(&spec).unwrap();
            for step in 0..4 {
                let Some(Lead::Mirostat { at, m, mu }) = lead(chain.stages()) else {
                    panic!("mirostat is no lead");
                };
                let out = with_scratch(|s| mirostat_token(&logits, &chain, at, m, mu, s));
                assert!(
                    matches!(out, Some(Ok((_, p))) if p > 0.0),
                    "tau {tau} m {m} step {step}: fell back ({out:?})"
                );
                sample_row(&logits, &mut chain).unwrap();
            }
        }
        // So is Mirostat v2 as the last stage.
        for tau in [5.0, 3.0, 0.0] {
            let spec = ChainSpec::new(vec![StageSpec::MirostatV2 { tau, eta: 0.1 }], Some(1));
            let mut chain = crate::build_chain(&spec).unwrap();
            for step in 0..4 {
                let Some(Lead::MirostatV2 { at, mu }) = lead(chain.stages()) else {
                    panic!("mirostat_v2 is no lead");
                };
                let out = with_scratch(|s| mirostat_v2_token(&logits, &chain, at, mu, s));
                assert!(
                    matches!(out, Some((_, p)) if p > 0.0),
                    "tau {tau} step {step}: fell back ({out:?})"
                );
                sample_row(&logits, &mut chain).unwrap();
            }
        }
    }

    /// `penalties -> top_k -> [temperature] -> dist` decided by the fused
    /// path (history read from the stage, penalised in the selection): the
    /// same tokens and chain state as the stages one by one, over steps, with
    /// repeated history tokens, tokens outside the vocabulary, a `-inf` and
    /// a huge logit on history tokens, ties, and each kind of penalty.
    #[test]
    fn penalised_top_k_matches_the_stages() {
        let vocab = 5000;
        // Positive logits near the top (division by `repeat` matters),
        // ties among the first ranks.
        let mut logits: Vec<f32> = zipf(vocab).iter().map(|&l| 0.1 * l + 3.0).collect();
        logits[17] = f32::NEG_INFINITY;
        logits[18] = -f32::MAX;
        for t in 100..140 {
            logits[t] = logits[(7919 + 13) % vocab];
        }
        let top = (0..vocab)
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap();
        let history: Vec<TokenId> = [top, top, 17, 18, 100, 101, 101, 9999, 70_000]
            .iter()
            .map(|&t| t as TokenId)
            .chain((0..60).map(|i| (i * 613 % vocab) as TokenId))
            .collect();
        // A history of the row's 60 best tokens: the selection's threshold
        // has to drop past all of them.
        let mut ranked: Vec<usize> = (0..vocab).collect();
        ranked.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let best: Vec<TokenId> = ranked[..60].iter().map(|&t| t as TokenId).collect();
        for (history, (repeat, frequency, presence, last_n)) in
            [&history, &best].into_iter().flat_map(|h| {
                [
                    (1.1f32, 0.0f32, 0.0f32, 64usize),
                    (1.0, 0.5, 0.0, 64),
                    (1.0, 0.0, 1.5, 16),
                    (1.3, 0.2, 0.4, 200),
                    (5.0, 3.0, 3.0, 8),
                ]
                .map(|p| (h, p))
            })
        {
            for (k, t) in [
                (1i64, None),
                (40, Some(0.8f32)),
                (7, Some(1.0)),
                (300, Some(1.5)),
            ] {
                let mut stages = vec![
                    StageSpec::Penalties {
                        last_n,
                        repeat,
                        frequency,
                        presence,
                        scope: sampler_core::HistoryScope::PromptAndOutput,
                    },
                    StageSpec::TopK { k },
                ];
                if let Some(t) = t {
                    stages.push(StageSpec::Temperature {
                        t,
                        dynatemp_range: 0.0,
                        dynatemp_exponent: 1.0,
                    });
                }
                stages.push(StageSpec::Dist);
                let at = format!(
                    "repeat {repeat} freq {frequency} pres {presence} last_n {last_n} k {k} t {t:?}"
                );
                let mut fast = crate::build_chain(&ChainSpec::new(stages, Some(7))).unwrap();
                fast.accept_prompt(history);
                let mut slow = fast.clone();
                // Without the penalties the same seed samples other tokens:
                // the history matters here.
                let mut plain = crate::build_chain(&ChainSpec::new(
                    fast.stages()[1..].iter().filter_map(|s| s.spec()).collect(),
                    Some(7),
                ))
                .unwrap();
                let mut differs = false;
                for step in 0..6 {
                    let lead = lead(fast.stages()).unwrap();
                    let Lead::PenaltiesTopK {
                        at: p_at,
                        top_k_at,
                        k,
                        ..
                    } = lead
                    else {
                        panic!("{at}: lead {lead:?}");
                    };
                    let cuts = cuts::cuts_tail(fast.stages(), top_k_at + 1).unwrap();
                    let decided =
                        with_scratch(|s| penalised_top_k_token(&logits, &fast, p_at, k, &cuts, s));
                    assert!(decided.is_some(), "{at}: the fused path fell back");
                    let got = sample_row(&logits, &mut fast);
                    let want = slow.sample_from(0, &mut Candidates::from_logits(&logits));
                    assert_eq!(got, want, "{at}, step {step}");
                    differs |= plain.sample_from(0, &mut Candidates::from_logits(&logits)) != want;
                    assert_eq!(fast.step(), slow.step(), "{at}, step {step}");
                }
                // (Greedy over a uniformly penalised head keeps its token.)
                let uniform_head = std::ptr::eq(history, &best) && k == 1;
                assert!(
                    differs || uniform_head,
                    "{at}: the penalties never changed the token"
                );
                // Same history afterwards: one more step on a fresh row agrees.
                let shifted: Vec<f32> = logits.iter().rev().copied().collect();
                assert_eq!(
                    sample_row(&shifted, &mut fast),
                    slow.sample_from(0, &mut Candidates::from_logits(&shifted)),
                    "{at}, after"
                );
            }
        }
    }
}
