//! Batch entry points: `[batch, vocab]` logits, one chain per row.

use rayon::prelude::*;
use sampler_core::{Candidates, Chain, Logprobs, LogprobsSpec, SampleError, TokenId};

fn check_shape(
    logits: &[f32],
    batch: usize,
    vocab: usize,
    chains: usize,
) -> Result<(), SampleError> {
    let Some(expected) = batch.checked_mul(vocab) else {
        return Err(SampleError::ShapeOverflow { batch, vocab });
    };
    if expected != logits.len() {
        return Err(SampleError::Shape {
            len: logits.len(),
            batch,
            vocab,
            expected,
        });
    }
    if chains != batch {
        return Err(SampleError::ChainCount { chains, batch });
    }
    Ok(())
}

/// Run `f` on every row (its index, row logits `[vocab]`, its chain), in
/// parallel with rayon when `batch > 1`. Results are in row order.
fn per_row<T: Send>(
    logits: &[f32],
    vocab: usize,
    chains: &mut [Chain],
    f: impl Fn(usize, &[f32], &mut Chain) -> Result<T, SampleError> + Sync + Send,
) -> Vec<Result<T, SampleError>> {
    if vocab == 0 {
        // `chunks(0)` is not allowed; every row is empty.
        return chains.iter().map(|_| Err(SampleError::EmptyRow)).collect();
    }
    if chains.len() <= 1 {
        return chains
            .iter_mut()
            .zip(logits.chunks_exact(vocab))
            .enumerate()
            .map(|(i, (chain, row))| f(i, row, chain))
            .collect();
    }
    chains
        .par_iter_mut()
        .zip(logits.par_chunks_exact(vocab))
        .enumerate()
        .map(|(i, (chain, row))| f(i, row, chain))
        .collect()
}

/// Sample one token per row of `logits` (`[batch, vocab]`, row-major) with
/// `chains[row]`, which accepts the token and advances its step
/// ([`Chain::sample`]).
///
/// Rows are independent: a row's token depends only on
/// its logits and its chain (seed, step, history), never on its position or
/// on other rows. Rows run in parallel with rayon when `batch > 1`.
///
/// # Errors
/// Outer: [`SampleError::Shape`] when `logits.len() != batch * vocab`,
/// [`SampleError::ChainCount`] when `chains.len() != batch`. Inner, per row:
/// [`SampleError::NanLogit`] / [`SampleError::PosInfLogit`] /
/// [`SampleError::EmptyRow`] for an invalid row,
/// [`SampleError::NoSelectingStage`], [`SampleError::AllMasked`] and any stage
/// error. A failing row accepts nothing; the other rows are sampled normally.
pub fn sample_batch(
    logits: &[f32],
    batch: usize,
    vocab: usize,
    chains: &mut [Chain],
) -> Result<Vec<Result<TokenId, SampleError>>, SampleError> {
    check_shape(logits, batch, vocab, chains.len())?;
    // Same result as `Chain::sample` on `Candidates::from_logits(row)`, via
    // the fast paths (crate::fast).
    Ok(per_row(logits, vocab, chains, |_, row, chain| {
        crate::fast::sample_row(row, chain)
    }))
}

/// One row of [`sample_batch_logprobs`]: its token and, when asked for, the
/// step's logprobs; or the row's error.
pub type RowLogprobs = Result<(TokenId, Option<Logprobs>), SampleError>;

/// [`sample_batch`] with logprobs: row `r` is sampled with `chains[r]`
/// and, when `logprobs[r]` is `Some` (a request's
/// [`ChainSpec::logprobs`](sampler_core::ChainSpec::logprobs): `build_chain`
/// builds the stages, the logprobs request stays with the caller), also
/// reports that step's [`Logprobs`] ([`Chain::sample_logprobs`]: `raw` from
/// the row, `processed` from the final candidate set). The tokens and chain
/// states are those of [`sample_batch`]; the values are those a
/// `SamplingBatch` (sampler-backend) reports for the same request.
///
/// # Errors
/// As [`sample_batch`], and [`SampleError::LogprobsCount`] when
/// `logprobs.len() != batch`. Per row also [`SampleError::Param`] for a
/// request beyond its limits (top 20, 128 ids) and
/// [`SampleError::TokenOutOfRange`] for a requested id outside the
/// vocabulary (nothing is accepted then).
pub fn sample_batch_logprobs(
    logits: &[f32],
    batch: usize,
    vocab: usize,
    chains: &mut [Chain],
    logprobs: &[Option<LogprobsSpec>],
) -> Result<Vec<RowLogprobs>, SampleError> {
    check_shape(logits, batch, vocab, chains.len())?;
    if logprobs.len() != batch {
        return Err(SampleError::LogprobsCount {
            specs: logprobs.len(),
            batch,
        });
    }
    Ok(per_row(
        logits,
        vocab,
        chains,
        |i, row, chain| match &logprobs[i] {
            Some(lp) => chain.sample_logprobs(row, lp).map(|(t, l)| (t, Some(l))),
            None => crate::fast::sample_row(row, chain).map(|t| (t, None)),
        },
    ))
}

/// Apply every stage of `chains[row]` to each row of `logits`
/// (`[batch, vocab]`) and return the resulting [`Candidates`] per row
/// (filtered set, probabilities if a stage computed them, the selection if a
/// stage selected). Nothing is accepted and no step advances, so this works
/// for chains without a selecting stage (e.g. `top_k;top_p`).
///
/// # Errors
/// As [`sample_batch`], except that a chain without a selecting stage is not
/// an error here.
pub fn apply_batch(
    logits: &[f32],
    batch: usize,
    vocab: usize,
    chains: &mut [Chain],
) -> Result<Vec<Result<Candidates, SampleError>>, SampleError> {
    check_shape(logits, batch, vocab, chains.len())?;
    // Same result as `Chain::apply` on `Candidates::from_logits(row)`, via
    // the fast paths (crate::fast).
    Ok(per_row(logits, vocab, chains, |_, row, chain| {
        crate::fast::apply_row(row, chain)
    }))
}
