//! What a chain does to one row, stage by stage: a debugging tool.
//!
//! [`Chain::inspect`] runs the chain's reference stages one at a time on a
//! row (`[vocab]` logits, token id = position) and records the candidate
//! set after each: ids, logits, probabilities renormalised over the
//! survivors, how many survived, the mass kept, and finally the token drawn
//! and the uniform that drew it. It is exact (the stages' own
//! [`Sampler::apply`](crate::Sampler::apply), no fast path) and costs what it
//! costs: a full-vocabulary set per stage, sorted. Use it to see why a
//! setting bites or does not, not in a serving loop.

use crate::chain::Chain;
use crate::rng::RowRng;
use crate::{Candidates, SampleError, StageKind, TokenId, desc_cmp};

/// One candidate set: its survivors in canonical order (logit descending,
/// ties to the lowest id), a probability each.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateSet {
    /// The surviving token ids (candidates whose logit is not `-inf`).
    pub ids: Vec<TokenId>,
    /// Their logits after the stage.
    pub logits: Vec<f32>,
    /// Their probabilities, `softmax` over the survivors (computed in
    /// `f64`: the stages' own `f32` probabilities may differ in the last
    /// bits).
    pub probs: Vec<f64>,
}

impl CandidateSet {
    /// The survivors of `row` (logit not `-inf`), canonical order, softmax
    /// over them.
    pub fn of(row: &Candidates) -> Self {
        let mut pairs: Vec<(TokenId, f32)> = row
            .ids()
            .iter()
            .zip(row.logits())
            .filter(|(_, l)| **l != f32::NEG_INFINITY)
            .map(|(&i, &l)| (i, l))
            .collect();
        pairs.sort_by(|a, b| desc_cmp(a.1, a.0, b.1, b.0));
        let max = pairs.first().map_or(0.0, |p| p.1);
        let e: Vec<f64> = pairs
            .iter()
            .map(|p| (f64::from(p.1) - f64::from(max)).exp())
            .collect();
        let sum: f64 = e.iter().sum();
        let (ids, logits) = pairs.into_iter().unzip();
        Self {
            ids,
            logits,
            probs: e
                .into_iter()
                .map(|x| x / sum.max(f64::MIN_POSITIVE))
                .collect(),
        }
    }

    /// How many candidates survived.
    pub fn survivors(&self) -> usize {
        self.ids.len()
    }

    /// The probability mass `other` gives to this set's survivors (`other`
    /// the set before a stage, or the input row).
    pub fn mass_in(&self, other: &CandidateSet) -> f64 {
        let mut mine: Vec<TokenId> = self.ids.clone();
        mine.sort_unstable();
        other
            .ids
            .iter()
            .zip(&other.probs)
            .filter(|(id, _)| mine.binary_search(id).is_ok())
            .map(|(_, p)| p)
            .sum()
    }

    /// Shannon entropy of the set's distribution, in nats.
    pub fn entropy(&self) -> f64 {
        self.probs
            .iter()
            .filter(|&&p| p > 0.0)
            .map(|&p| -p * p.ln())
            .sum()
    }

    /// A token's probability in this set (0 when it did not survive).
    pub fn prob_of(&self, token: TokenId) -> f64 {
        self.ids
            .iter()
            .position(|&i| i == token)
            .map_or(0.0, |at| self.probs[at])
    }
}

/// One stage's effect.
#[derive(Debug, Clone, PartialEq)]
pub struct StageView {
    /// The stage's index in the chain.
    pub index: usize,
    /// Its canonical name.
    pub name: String,
    /// The parameters made it a no-op: it did not run, the set is the one
    /// before it.
    pub noop: bool,
    /// The candidate set after it.
    pub set: CandidateSet,
    /// The probability mass the set before this stage gives to its
    /// survivors (1 when nothing was removed; a stage that reshapes, like
    /// `temperature`, keeps 1).
    pub mass_kept: f64,
    /// The input row's mass on its survivors.
    pub mass_kept_of_input: f64,
}

/// What [`Chain::inspect`] recorded for one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// The step (tokens sampled before this one since the chain's reset).
    pub step: u64,
    /// The raw row as a candidate set (every token, softmax of the logits).
    pub input: CandidateSet,
    /// After each stage up to the selecting one, in chain order.
    pub stages: Vec<StageView>,
    /// The token the chain selected.
    pub token: TokenId,
    /// The uniform in `[0, 1)` the selecting stage drew with (`dist`,
    /// `mirostat`, `mirostat_v2`: `rng::uniform(seed, step, lane(stage, 0))`);
    /// `None` for `greedy`, which draws nothing.
    pub uniform: Option<f64>,
}

impl Chain {
    /// Run the chain on one raw row `[vocab]` stage by stage, recording the
    /// candidate set after each (module docs), then commit the selected
    /// token and advance the step as [`Chain::sample_logits`] does: the
    /// token is the one `sample_logits` gives with the same seed and state.
    ///
    /// # Errors
    /// As [`Chain::sample`]: the row's validation error, the first stage
    /// error, [`SampleError::NoSelectingStage`]. Nothing is committed on
    /// error.
    pub fn inspect(&mut self, logits: &[f32]) -> Result<Inspection, SampleError> {
        if !self.selects() {
            return Err(SampleError::NoSelectingStage);
        }
        let mut row = Candidates::from_logits(logits);
        row.validate()?;
        let input = CandidateSet::of(&row);
        let end = self.end();
        let mut stages = Vec::with_capacity(end);
        let mut prev = input.clone();
        let mut uniform = None;
        for index in 0..end {
            let (name, noop, spec) = {
                let st = &self.stages()[index];
                let spec = st.spec();
                let noop = spec.as_ref().map_or_else(|| st.is_noop(), |s| s.is_noop());
                (st.name().to_string(), noop, spec)
            };
            self.apply_stages(index..index + 1, &mut row)?;
            if !noop
                && let Some(kind) = spec.map(|s| s.kind())
                && matches!(
                    kind,
                    StageKind::Dist | StageKind::Mirostat | StageKind::MirostatV2
                )
            {
                let rng = RowRng {
                    seed: self.seed(),
                    step: self.step(),
                    stage_index: index,
                };
                uniform = Some(rng.uniform(0));
            }
            let set = CandidateSet::of(&row);
            let view = StageView {
                index,
                name,
                noop,
                mass_kept: set.mass_in(&prev),
                mass_kept_of_input: set.mass_in(&input),
                set,
            };
            prev = view.set.clone();
            stages.push(view);
        }
        let token = row.selected_token().ok_or(SampleError::NoSelectingStage)?;
        let step = self.step();
        self.commit(token);
        Ok(Inspection {
            step,
            input,
            stages,
            token,
            uniform,
        })
    }
}
