//! Speculative decoding: verify a request's draft tokens against the target
//! model's rows through the request's own chain, so that the emitted tokens
//! follow exactly the distribution plain decoding would draw from
//! (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
//! Decoding"; vLLM V1's rejection sampler as the engine reference).
//!
//! A request proposes `k` draft tokens `d_1..d_k` and hands `k + 1` target
//! rows `[k + 1, vocab]` (row `i` is the target model's logits for the
//! position of `d_i`; the last row follows `d_k`). Row `i` goes through the
//! chain as if `d_1..d_{i-1}` had been emitted (penalty windows, DRY,
//! `min_tokens` counts and masks see that prefix); its final candidate set
//! is the target distribution `p_i`.
//!
//! **Drafts with a distribution** (`q_i`, `[k, vocab]` probabilities, from a
//! draft model), for `i = 1..k`:
//!
//! * `d_i` is accepted when `u · q_i(d_i) < p_i(d_i)` (probability
//!   `min(1, p_i(d_i) / q_i(d_i))`), `p_i` the softmax over the survivors
//!   for a chain ending in `dist`, one-hot at the choice for `greedy`;
//! * at the first rejection a token is drawn from the residual
//!   `normalize(max(0, p_i - q_i))` and verification stops;
//! * when all `k` are accepted, a bonus token is sampled from row `k + 1`
//!   by the chain exactly as plain decoding samples it.
//!
//! The acceptance uniform and the residual draw at output position `t` are
//! `rng::uniform(seed, t, lane)` on two lanes no stage uses
//! ([`ACCEPT_LANE`], [`RESIDUAL_LANE`]).
//!
//! **Drafts without one** (n-gram / prompt lookup: `q_i` one-hot at `d_i`):
//! row `i` is sampled by the chain exactly as plain decoding samples it at
//! that position (its own draw, its own uniform); `d_i` is accepted when the
//! draw is `d_i`, otherwise the draw is emitted and verification stops. This
//! is the rule above with the residual drawn by a coupled uniform: the draw
//! is `d_i` with probability `p_i(d_i) = min(1, p_i(d_i) / 1)`, and given it
//! is not, it follows `p_i` without `d_i`, normalised, which is the
//! residual. It gives more than the distribution: a seeded request emits
//! **the tokens plain decoding emits**, whatever it drafted, and every
//! selecting stage works (mirostat's state follows its own draw, which is
//! the emitted token). A device verifies such drafts with its ordinary
//! sampling pass and reads back one id per row.
//!
//! A greedy chain accepts while the draft equals its choice and emits its
//! choice: `k + 1` plain greedy steps, token for token. The chain is left
//! exactly as plain decoding of the emitted tokens leaves it (step, history,
//! `min_tokens` count): only emitted tokens are committed.
//!
//! Randomness is counter-based like every draw of the project, so a seeded
//! request's tokens do not depend on the batch, its neighbours or earlier
//! drafts beyond the tokens emitted.
//!
//! Drafts with a distribution need a chain that ends in `dist` or `greedy`
//! (any stages before them); `mirostat` / `mirostat_v2` (their state update
//! follows their own draw) and custom selecting stages are refused for them
//! with a clear error.

use sampler_core::rng::uniform;
use sampler_core::{
    Candidates, Chain, Logprobs, LogprobsSpec, ParamError, SampleError, StageKind, TokenId,
    numerics, validate_logits,
};

/// The most draft tokens one verification takes (vLLM serves up to about
/// ten; 64 leaves room for tree-free long n-gram drafts).
pub const MAX_DRAFT_TOKENS: usize = 64;

/// The lane of the acceptance uniform (no stage reaches it: stage lanes are
/// `16 · index + sub`).
pub const ACCEPT_LANE: u32 = u32::MAX - 1;

/// The lane of the residual draw's uniform.
pub const RESIDUAL_LANE: u32 = u32::MAX - 2;

/// What one verification emitted.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verified {
    /// The emitted tokens, `1..=k + 1`: the accepted drafts, then the
    /// correction drawn at the first rejection or, when every draft was
    /// accepted, the bonus token.
    pub tokens: Vec<TokenId>,
    /// How many drafts were accepted (`tokens.len() - 1`).
    pub accepted: usize,
    /// Per emitted token, the logprobs a plain step would report for it
    /// (`raw` from its row, `processed` from the chain's distribution at
    /// that position); empty when none were asked for.
    pub logprobs: Vec<Logprobs>,
}

fn bad(param: &'static str, value: String, expected: &str) -> SampleError {
    SampleError::Param(ParamError {
        stage: "speculative",
        param,
        value,
        expected: expected.to_string(),
    })
}

/// Check every input before anything is committed: shapes, draft ids, the
/// draft distributions, the chain's selecting stage, the rows' values.
fn check(
    chain: &Chain,
    drafts: &[TokenId],
    draft_probs: Option<&[f32]>,
    logits: &[f32],
    vocab: usize,
) -> Result<(), SampleError> {
    let k = drafts.len();
    if k > MAX_DRAFT_TOKENS {
        return Err(bad(
            "draft_tokens",
            format!("{k} tokens"),
            &format!("at most {MAX_DRAFT_TOKENS} draft tokens"),
        ));
    }
    if vocab == 0 {
        return Err(SampleError::EmptyRow);
    }
    let rows = k + 1;
    if logits.len() != rows.saturating_mul(vocab) {
        return Err(SampleError::Shape {
            len: logits.len(),
            batch: rows,
            vocab,
            expected: rows.saturating_mul(vocab),
        });
    }
    if let Some(&token) = drafts.iter().find(|&&t| t as usize >= vocab) {
        return Err(SampleError::TokenOutOfRange { token, vocab });
    }
    if let Some(q) = draft_probs {
        if q.len() != k.saturating_mul(vocab) {
            return Err(bad(
                "draft_probs",
                format!("{} values", q.len()),
                &format!("[k, vocab] = [{k}, {vocab}] = {} values", k * vocab),
            ));
        }
        let expected = "a distribution: finite, >= 0, with a positive sum";
        for (i, row) in q.chunks_exact(vocab).enumerate() {
            if let Some(j) = row.iter().position(|x| !x.is_finite() || *x < 0.0) {
                return Err(bad(
                    "draft_probs",
                    format!("row {i}, token {j}: {}", row[j]),
                    expected,
                ));
            }
            if numerics::sum_f64_slice(row) <= 0.0 {
                return Err(bad("draft_probs", format!("row {i} sums to 0"), expected));
            }
            let d = drafts[i];
            if row[d as usize] <= 0.0 {
                return Err(bad(
                    "draft_probs",
                    format!("row {i}: the draft token {d} has probability 0"),
                    "the draft token drawn from its own distribution (q(d) > 0)",
                ));
            }
        }
    }
    if !chain.selects() {
        return Err(SampleError::NoSelectingStage);
    }
    if draft_probs.is_none() {
        // One-hot drafts: the chain's own draws (any selecting stage).
        for row in logits.chunks_exact(vocab) {
            validate_logits(row)?;
        }
        return Ok(());
    }
    let end = chain.end();
    match chain.stages()[end - 1].spec().map(|s| s.kind()) {
        Some(StageKind::Dist | StageKind::Greedy) => {}
        other => {
            let name = other.map_or("a custom stage", StageKind::name);
            return Err(bad(
                "chain",
                format!("selecting stage `{name}`"),
                "a chain ending in `dist` or `greedy` (mirostat's state follows its own draw)",
            ));
        }
    }
    for row in logits.chunks_exact(vocab) {
        validate_logits(row)?;
    }
    Ok(())
}

/// The target distribution of a final candidate set, as `(id, p)` pairs in
/// ascending id order with `p > 0`: one-hot at the selection for `greedy`,
/// the softmax over the survivors for `dist`.
fn target(row: &Candidates, greedy: bool) -> Vec<(TokenId, f64)> {
    if greedy {
        return row
            .selected_token()
            .map(|t| vec![(t, 1.0)])
            .unwrap_or_default();
    }
    let max = row.max_logit();
    let e: Vec<f32> = row
        .logits()
        .iter()
        .map(|&l| numerics::exp(l - max))
        .collect();
    let s = numerics::sum_f64_slice(&e);
    let mut p: Vec<(TokenId, f64)> = row
        .ids()
        .iter()
        .zip(&e)
        .filter(|&(_, &e)| e > 0.0)
        .map(|(&id, &e)| (id, f64::from(e) / s))
        .collect();
    p.sort_unstable_by_key(|&(id, _)| id);
    p
}

/// Draw from `weights` (id order) with `u` in `[0, 1)`: the first id whose
/// running sum reaches `u · total`; `None` when the total is 0.
fn draw(weights: impl Iterator<Item = (TokenId, f64)> + Clone, u: f64) -> Option<TokenId> {
    let total: f64 = weights.clone().map(|(_, w)| w).sum();
    if total <= 0.0 {
        return None;
    }
    let goal = u * total;
    let mut cum = 0.0;
    let mut last = None;
    for (id, w) in weights {
        if w > 0.0 {
            cum += w;
            last = Some(id);
            if cum >= goal {
                return Some(id);
            }
        }
    }
    last
}

/// Verify `drafts` (`k` ids) with the draft distributions `draft_probs`
/// (`[k, vocab]` probabilities, `None` for one-hot drafts) against the
/// target rows `logits` (`[k + 1, vocab]`) through `chain`, committing the
/// emitted tokens (module docs for the rule); with `logprobs`, each emitted
/// token's logprobs as a plain step reports them.
///
/// # Errors
/// Nothing is committed on error. [`SampleError::Param`] (stage
/// `speculative`) for more than [`MAX_DRAFT_TOKENS`] drafts, draft
/// distributions of the wrong size or that are not distributions (NaN,
/// negative, zero sum, a draft token with probability 0), a chain whose
/// selecting stage is not `dist` or `greedy`; [`SampleError::Shape`] when
/// `logits` is not `[k + 1, vocab]`; [`SampleError::TokenOutOfRange`] for a
/// draft id outside the vocabulary; [`SampleError::NoSelectingStage`]; the
/// rows' validation errors; any stage error (the chain is then restored);
/// the logprobs spec's errors.
pub fn verify(
    chain: &mut Chain,
    drafts: &[TokenId],
    draft_probs: Option<&[f32]>,
    logits: &[f32],
    vocab: usize,
    logprobs: Option<&LogprobsSpec>,
) -> Result<Verified, SampleError> {
    check(chain, drafts, draft_probs, logits, vocab)?;
    if let Some(spec) = logprobs {
        spec.validate().map_err(SampleError::Param)?;
        spec.check_vocab(vocab)?;
    }
    let greedy = chain.stages()[chain.end() - 1]
        .spec()
        .is_some_and(|s| s.kind() == StageKind::Greedy);
    let before = chain.clone();
    let out = match draft_probs {
        None => run_one_hot(chain, drafts, logits, vocab, logprobs),
        Some(q) => run(chain, drafts, q, logits, vocab, greedy, logprobs),
    };
    if out.is_err() {
        *chain = before;
    }
    out
}

/// Drafts without a distribution: each row sampled as plain decoding
/// samples it, until a draw differs from its draft (module docs).
fn run_one_hot(
    chain: &mut Chain,
    drafts: &[TokenId],
    logits: &[f32],
    vocab: usize,
    logprobs: Option<&LogprobsSpec>,
) -> Result<Verified, SampleError> {
    let mut out = Verified::default();
    for (i, row) in logits.chunks_exact(vocab).enumerate() {
        let t = match logprobs {
            Some(spec) => {
                let (t, lp) = chain.sample_logprobs(row, spec)?;
                out.logprobs.push(lp);
                t
            }
            None => crate::fast::sample_row(row, chain)?,
        };
        out.tokens.push(t);
        match drafts.get(i) {
            Some(&d) if d == t => out.accepted += 1,
            _ => break,
        }
    }
    Ok(out)
}

fn run(
    chain: &mut Chain,
    drafts: &[TokenId],
    draft_probs: &[f32],
    logits: &[f32],
    vocab: usize,
    greedy: bool,
    logprobs: Option<&LogprobsSpec>,
) -> Result<Verified, SampleError> {
    let mut out = Verified::default();
    let report =
        |chain: &mut Chain, row: &[f32], set: &Candidates, t: TokenId, out: &mut Verified| {
            if let Some(spec) = logprobs {
                out.logprobs.push(chain.logprobs_of(row, set, spec, t)?);
            }
            Ok::<(), SampleError>(())
        };
    for (i, (&d, row)) in drafts.iter().zip(logits.chunks_exact(vocab)).enumerate() {
        let set = chain.apply_logits(row)?;
        let p = target(&set, greedy);
        let q_row = &draft_probs[i * vocab..(i + 1) * vocab];
        let q_sum = numerics::sum_f64_slice(q_row);
        let q = |t: TokenId| f64::from(q_row[t as usize]) / q_sum;
        let p_d = p
            .binary_search_by_key(&d, |&(id, _)| id)
            .map_or(0.0, |at| p[at].1);
        let (seed, step) = (chain.seed(), chain.step());
        if uniform(seed, step, ACCEPT_LANE) * q(d) < p_d {
            report(chain, row, &set, d, &mut out)?;
            chain.commit(d);
            out.tokens.push(d);
            out.accepted += 1;
            continue;
        }
        // Rejected: the residual max(0, p - q), or p itself when rounding
        // left it no mass (p <= q everywhere means p == q: never rejected
        // in exact arithmetic).
        let u = uniform(seed, step, RESIDUAL_LANE);
        let residual = p.iter().map(|&(id, pi)| (id, (pi - q(id)).max(0.0)));
        let t = draw(residual, u)
            .or_else(|| draw(p.iter().copied(), u))
            .ok_or(SampleError::AllMasked)?;
        report(chain, row, &set, t, &mut out)?;
        chain.commit(t);
        out.tokens.push(t);
        return Ok(out);
    }
    let bonus = &logits[drafts.len() * vocab..];
    match logprobs {
        Some(spec) => {
            let (t, lp) = chain.sample_logprobs(bonus, spec)?;
            out.tokens.push(t);
            out.logprobs.push(lp);
        }
        None => out.tokens.push(chain.sample_logits(bonus)?),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_core::{ChainSpec, StageSpec};

    fn chain(stages: Vec<StageSpec>) -> Chain {
        crate::build_chain(&ChainSpec::new(stages, Some(9))).unwrap()
    }

    #[test]
    fn bad_inputs_are_refused_and_nothing_is_committed() {
        let v = 4;
        let rows = vec![0.0f32; 3 * v];
        let mut c = chain(vec![StageSpec::Dist]);
        // (drafts, draft distributions, rows, what the error says)
        type Case = (Vec<TokenId>, Option<Vec<f32>>, Vec<f32>, &'static str);
        let cases: Vec<Case> = vec![
            (vec![0, 9], None, rows.clone(), "out of range"),
            (
                vec![0],
                None,
                rows.clone(),
                "[batch = 2, vocab = 4] needs 8",
            ),
            (vec![0, 1], Some(vec![0.25; 4]), rows.clone(), "[k, vocab]"),
            (
                vec![0, 1],
                Some(vec![0.5, 0.5, 0.0, 0.0, f32::NAN, 1.0, 0.0, 0.0]),
                rows.clone(),
                "row 1, token 0: NaN",
            ),
            (
                vec![0, 1],
                Some(vec![0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
                rows.clone(),
                "row 1 sums to 0",
            ),
            (
                vec![0, 3],
                Some(vec![0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0]),
                rows.clone(),
                "draft token 3 has probability 0",
            ),
            (
                vec![0, 1],
                None,
                {
                    let mut r = rows.clone();
                    r[9] = f32::NAN;
                    r
                },
                "NaN",
            ),
            (
                vec![0; MAX_DRAFT_TOKENS + 1],
                None,
                vec![0.0; (MAX_DRAFT_TOKENS + 2) * v],
                "at most 64",
            ),
        ];
        for (drafts, q, logits, want) in cases {
            let err = verify(&mut c, &drafts, q.as_deref(), &logits, v, None).unwrap_err();
            assert!(err.to_string().contains(want), "{err} does not say {want}");
            assert_eq!(c.step(), 0);
        }
        // Draft distributions need a chain ending in `dist` or `greedy`.
        let mut m = chain(vec![StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 }]);
        let q = [0.25f32; 4];
        let err = verify(&mut m, &[0], Some(&q), &rows[..2 * v], v, None).unwrap_err();
        assert!(err.to_string().contains("mirostat_v2"), "{err}");
        assert_eq!(m.step(), 0);
    }

    #[test]
    fn one_hot_drafts_emit_what_plain_decoding_emits() {
        // Any selecting stage, mirostat included: the draws are the chain's
        // own, so the emitted tokens and the state are plain decoding's.
        let v = 6;
        let rows: Vec<f32> = (0..5 * v).map(|i| ((i * 7) % 11) as f32 * 0.3).collect();
        let chains = [
            vec![StageSpec::Dist],
            vec![StageSpec::MirostatV2 { tau: 1.0, eta: 0.3 }],
            vec![StageSpec::TopK { k: 3 }, StageSpec::Dist],
        ];
        for stages in chains {
            for seed in 0..50 {
                let spec = ChainSpec::new(stages.clone(), Some(seed));
                let mut plain = crate::build_chain(&spec).unwrap();
                let want: Vec<TokenId> = rows
                    .chunks_exact(v)
                    .map(|r| plain.sample_logits(r).unwrap())
                    .collect();
                // Draft the first two right and the third wrong.
                let wrong = (want[2] + 1) % v as TokenId;
                let mut c = crate::build_chain(&spec).unwrap();
                let got =
                    verify(&mut c, &[want[0], want[1], wrong, 0], None, &rows, v, None).unwrap();
                assert_eq!(got.tokens, want[..3], "{stages:?} seed {seed}");
                assert_eq!(got.accepted, 2);
                assert_eq!(c.step(), 3);
                // The state continues as plain decoding's.
                let mut p3 = crate::build_chain(&spec).unwrap();
                for r in rows.chunks_exact(v).take(3) {
                    p3.sample_logits(r).unwrap();
                }
                let last = &rows[4 * v..];
                assert_eq!(c.sample_logits(last), p3.sample_logits(last));
            }
        }
    }

    #[test]
    fn greedy_accepts_its_own_choices_and_corrects_the_first_miss() {
        let v = 5;
        let rows: Vec<f32> = [
            [0.0, 3.0, 1.0, 0.0, 0.0],
            [2.0, 0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 4.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 1.0],
        ]
        .concat();
        let mut c = chain(vec![StageSpec::Greedy]);
        let got = verify(&mut c, &[1, 0, 3], None, &rows, v, None).unwrap();
        assert_eq!(
            got,
            Verified {
                tokens: vec![1, 0, 3, 4],
                accepted: 3,
                logprobs: vec![],
            }
        );
        let mut c = chain(vec![StageSpec::Greedy]);
        let got = verify(&mut c, &[1, 2, 3], None, &rows, v, None).unwrap();
        assert_eq!(
            got,
            Verified {
                tokens: vec![1, 0],
                accepted: 1,
                logprobs: vec![],
            }
        );
        assert_eq!(c.step(), 2);
        let mut c = chain(vec![StageSpec::Greedy]);
        let got = verify(&mut c, &[], None, &rows[..v], v, None).unwrap();
        assert_eq!(
            got,
            Verified {
                tokens: vec![1],
                accepted: 0,
                logprobs: vec![],
            }
        );
    }

    #[test]
    fn ngram_rule_examples() {
        // A residual never re-emits the rejected one-hot draft.
        let v = 3;
        let rows = [1.0f32, 1.0, 1.0, 0.0, 0.0, 0.0];
        for seed in 0..200 {
            let mut c =
                crate::build_chain(&ChainSpec::new(vec![StageSpec::Dist], Some(seed))).unwrap();
            let got = verify(&mut c, &[2], None, &rows, v, None).unwrap();
            if got.accepted == 0 {
                assert_ne!(got.tokens[0], 2, "seed {seed}");
            } else {
                assert_eq!(got.tokens[0], 2);
            }
        }
    }
}
