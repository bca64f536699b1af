//! [`Chain`]: an ordered list of stages with one row's seed and step; itself a
//! [`Sampler`].

use crate::{
    Candidates, RowRng, SampleError, Sampler, StageContext, StageSpec, TokenId, TokenOrigin,
    rng::entropy_seed,
};

/// A sampler chain for one row (one request): stages in order, the row's
/// seed, and its step counter (tokens sampled since the last reset).
///
/// The usage loop, per generated token:
/// 1. fill a [`Candidates`] from the row's logits `[vocab]`;
/// 2. [`Chain::sample`] applies every stage, takes the selected token, feeds
///    it to every stage's `accept` and advances the step;
/// 3. repeat. Prompt tokens that history-based stages should count are fed
///    once with [`Chain::accept_prompt`].
#[derive(Clone)]
pub struct Chain {
    stages: Vec<Box<dyn Sampler>>,
    seed: u64,
    step: u64,
    kernels: Option<RowKernels>,
}

/// Kernels that sample or filter a whole vocabulary row without building
/// the full candidate set, with exactly the result of the stages (same
/// token, candidates, errors and chain state). `sampler_cpu::build_chain`
/// installs sampler-cpu's ([`Chain::with_kernels`]); [`Chain::sample`] and
/// [`Chain::apply`] then use them for a full row
/// ([`Candidates::is_full_row`]).
#[derive(Debug, Clone, Copy)]
pub struct RowKernels {
    /// [`Chain::sample`] of the row `[vocab]` (token id = position).
    pub sample: fn(&[f32], &mut Chain) -> Result<TokenId, SampleError>,
    /// [`Chain::apply`] of the row `[vocab]`: the final candidate set.
    pub apply: fn(&[f32], &mut Chain) -> Result<Candidates, SampleError>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("stages", &self.names())
            .field("seed", &self.seed)
            .field("step", &self.step)
            .field("kernels", &self.kernels.is_some())
            .finish()
    }
}

impl Chain {
    /// A chain of `stages`. `seed: None` draws a seed from the OS.
    pub fn new(stages: Vec<Box<dyn Sampler>>, seed: Option<u64>) -> Self {
        Self {
            stages,
            seed: seed.unwrap_or_else(entropy_seed),
            step: 0,
            kernels: None,
        }
    }

    /// This chain with fast kernels for full rows (`sampler_cpu::ROW_KERNELS`;
    /// `sampler_cpu::build_chain` does this). Results are unchanged.
    pub fn with_kernels(mut self, kernels: RowKernels) -> Self {
        self.kernels = Some(kernels);
        self
    }

    /// The installed full-row kernels, if any.
    pub fn kernels(&self) -> Option<RowKernels> {
        self.kernels
    }

    /// The row's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// Change the row's seed; the step counter and every stage's state stay
    /// (a forked request continuing with its own random numbers).
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }
    /// Tokens sampled (or committed) since the last reset.
    pub fn step(&self) -> u64 {
        self.step
    }
    /// Set the step counter (a serving batch carrying a request's state into
    /// a rebuilt chain).
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }
    /// The stages, mutable (to carry a stage's state into another chain).
    pub fn stages_mut(&mut self) -> &mut [Box<dyn Sampler>] {
        &mut self.stages
    }
    /// Number of stages, no-op ones included.
    pub fn len(&self) -> usize {
        self.stages.len()
    }
    /// Whether the chain has no stages.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }
    /// Stage names in order.
    pub fn names(&self) -> Vec<String> {
        self.stages.iter().map(|s| s.name().to_string()).collect()
    }
    /// The stages.
    pub fn stages(&self) -> &[Box<dyn Sampler>] {
        &self.stages
    }
    /// Specs of the stages (`None` for custom ones).
    pub fn specs(&self) -> Vec<Option<StageSpec>> {
        self.stages.iter().map(|s| s.spec()).collect()
    }
    /// Whether some active stage selects a token.
    pub fn selects(&self) -> bool {
        self.stages.iter().any(|s| !s.is_noop() && s.selects())
    }

    /// Apply every stage to `row` (validated first: empty, NaN and `+inf`
    /// rows are errors). Does not accept or advance the step.
    ///
    /// With [`RowKernels`] installed and a full row
    /// ([`Candidates::is_full_row`]), the kernels compute the same result
    /// without the full-vocabulary passes of the stages; `row` is replaced by
    /// the result (and left as given on error).
    ///
    /// # Errors
    /// The first stage error, or the validation error.
    pub fn apply(&mut self, row: &mut Candidates) -> Result<(), SampleError> {
        if let Some(k) = self.kernels
            && row.is_full_row()
        {
            let out = (k.apply)(row.logits(), self)?;
            *row = out;
            return Ok(());
        }
        self.apply_from(0, row)
    }

    /// Index one past the last active selecting stage, or the chain's length
    /// when nothing selects: stages after the token is chosen are ignored
    /// (on the CPU and on every device alike; the loaders warn about them).
    pub fn end(&self) -> usize {
        self.stages
            .iter()
            .rposition(|s| !s.is_noop() && s.selects())
            .map_or(self.stages.len(), |i| i + 1)
    }

    /// Apply stages `start..` only: the host suffix after a device prefix.
    /// Stages after the last selecting stage are not run ([`Chain::end`]).
    ///
    /// # Errors
    /// As [`Chain::apply`].
    pub fn apply_from(&mut self, start: usize, row: &mut Candidates) -> Result<(), SampleError> {
        row.validate()?;
        self.apply_stages(start..self.stages.len(), row)
    }

    /// Apply the stages in `range` to a row the caller has validated (no
    /// validation here); stages after the last selecting stage
    /// ([`Chain::end`]) are not run.
    ///
    /// # Errors
    /// The first stage error; [`SampleError::CustomStageOutput`] when a
    /// custom stage leaves a NaN or `+inf` logit.
    pub fn apply_stages(
        &mut self,
        range: std::ops::Range<usize>,
        row: &mut Candidates,
    ) -> Result<(), SampleError> {
        let end = self.end().min(range.end);
        for (index, stage) in self
            .stages
            .iter_mut()
            .enumerate()
            .take(end)
            .skip(range.start)
        {
            // One `spec()` per stage (it clones a built-in's parameters): a
            // built-in's no-op rule is its spec's; a custom stage answers
            // `is_noop` itself.
            let spec = stage.spec();
            let custom = spec.is_none();
            let noop = match &spec {
                Some(s) => s.is_noop(),
                None => stage.is_noop(),
            };
            if noop {
                continue;
            }
            let ctx = StageContext {
                rng: RowRng {
                    seed: self.seed,
                    step: self.step,
                    stage_index: index,
                },
            };
            stage.apply(row, &ctx)?;
            // Built-in stages keep logits finite or -inf; a custom one is
            // checked, so that no later stage sees NaN or +inf.
            if custom
                && let Some(i) = row
                    .logits()
                    .iter()
                    .position(|l| l.is_nan() || *l == f32::INFINITY)
            {
                return Err(SampleError::CustomStageOutput {
                    stage: index,
                    name: stage.name().to_string(),
                    index: i,
                    value: if row.logits()[i].is_nan() {
                        "NaN"
                    } else {
                        "+inf"
                    },
                });
            }
        }
        Ok(())
    }

    /// Apply the chain, take the selected token, accept it and advance the step.
    ///
    /// With [`RowKernels`] installed and a full row
    /// ([`Candidates::is_full_row`], e.g. `Candidates::from_logits`), the
    /// kernels give the same token, errors and chain state without the
    /// full-vocabulary passes of the stages, and `row` is left as given (it
    /// is not the final candidate set then: use [`Chain::apply`] to look at
    /// the candidates).
    ///
    /// # Errors
    /// [`SampleError::NoSelectingStage`] when no active stage selects; any
    /// stage or validation error. On error nothing is accepted.
    pub fn sample(&mut self, row: &mut Candidates) -> Result<TokenId, SampleError> {
        if let Some(k) = self.kernels
            && row.is_full_row()
        {
            return (k.sample)(row.logits(), self);
        }
        self.sample_from(0, row)
    }

    /// [`Chain::sample`] of a raw logits row `[vocab]` (token id =
    /// position): with [`RowKernels`] installed the row is read in place
    /// (no candidate set of the vocabulary's size is built); otherwise
    /// `Candidates::from_logits` and the stages.
    ///
    /// # Errors
    /// As [`Chain::sample`].
    pub fn sample_logits(&mut self, logits: &[f32]) -> Result<TokenId, SampleError> {
        match self.kernels {
            Some(k) => (k.sample)(logits, self),
            None => self.sample_from(0, &mut Candidates::from_logits(logits)),
        }
    }

    /// [`Chain::apply`] of a raw logits row `[vocab]`: the final candidate
    /// set (read in place with [`RowKernels`]).
    ///
    /// # Errors
    /// As [`Chain::apply`].
    pub fn apply_logits(&mut self, logits: &[f32]) -> Result<Candidates, SampleError> {
        match self.kernels {
            Some(k) => (k.apply)(logits, self),
            None => {
                let mut row = Candidates::from_logits(logits);
                self.apply_from(0, &mut row)?;
                Ok(row)
            }
        }
    }

    /// [`Chain::sample_logits`] that also reports the step's logprobs
    /// ([`crate::logprobs`]): `raw` ones from `logits`, `processed` ones from
    /// the final candidate set (the chain runs as [`Chain::apply_logits`],
    /// then the selected token is committed). Same token and chain state as
    /// [`Chain::sample_logits`].
    ///
    /// # Errors
    /// As [`Chain::sample`]; [`SampleError::Param`] for a spec beyond its
    /// limits (top 20, 128 ids); [`SampleError::TokenOutOfRange`] for a
    /// requested id outside the vocabulary (nothing is accepted then).
    pub fn sample_logprobs(
        &mut self,
        logits: &[f32],
        spec: &crate::LogprobsSpec,
    ) -> Result<(TokenId, crate::Logprobs), SampleError> {
        spec.validate().map_err(SampleError::Param)?;
        spec.check_vocab(logits.len())?;
        match spec.mode {
            crate::LogprobsMode::Raw => {
                let t = self.sample_logits(logits)?;
                Ok((t, crate::logprobs::raw(logits, spec, t)?))
            }
            crate::LogprobsMode::Processed => {
                if !self.selects() {
                    return Err(SampleError::NoSelectingStage);
                }
                if self.greedy_temperature(0).is_some() {
                    let mut row = Candidates::from_logits(logits);
                    row.validate()?;
                    return self.finish_logprobs(0, &mut row, spec);
                }
                let row = self.apply_logits(logits)?;
                self.commit_logprobs(&row, spec)
            }
        }
    }

    /// The logprobs a step on the row `logits` `[vocab]` reports when it
    /// emits `token`, given `set`, the chain's final candidate set for that
    /// row ([`Chain::apply_logits`]), without committing anything: `raw`
    /// from the row, `processed` from `set` (or, for a chain with a greedy
    /// temperature, from the candidates entering it, as
    /// [`Chain::finish_logprobs`]). For tokens chosen elsewhere, such as
    /// accepted speculative drafts.
    ///
    /// # Errors
    /// As [`Chain::sample_logprobs`].
    pub fn logprobs_of(
        &mut self,
        logits: &[f32],
        set: &Candidates,
        spec: &crate::LogprobsSpec,
        token: TokenId,
    ) -> Result<crate::Logprobs, SampleError> {
        spec.validate().map_err(SampleError::Param)?;
        spec.check_vocab(logits.len())?;
        if spec.mode == crate::LogprobsMode::Raw {
            return crate::logprobs::raw(logits, spec, token);
        }
        match self.greedy_temperature(0) {
            Some(j) => {
                let mut entering = Candidates::from_logits(logits);
                entering.validate()?;
                self.apply_stages(0..j, &mut entering)?;
                crate::logprobs::processed(&entering, spec, token)
            }
            None => crate::logprobs::processed(set, spec, token),
        }
    }

    /// The first active stage at or after `start` (and before
    /// [`Chain::end`]) that is greedy spelled as a temperature
    /// ([`StageSpec::is_greedy_temperature`]).
    pub fn greedy_temperature(&self, start: usize) -> Option<usize> {
        let end = self.end();
        (start..end).find(|&i| {
            self.stages[i]
                .spec()
                .is_some_and(|s| !s.is_noop() && s.is_greedy_temperature())
        })
    }

    /// The host half of a `processed`-logprobs step from stage `start` on
    /// (the row validated, stages before `start` applied): run the stages,
    /// commit the selected token and compute the logprobs from the final
    /// candidate set, or, when a greedy temperature
    /// ([`StageSpec::is_greedy_temperature`]) is among the stages, from the
    /// candidates as they entered it: `temperature(0); dist` reports what
    /// `greedy` reports.
    ///
    /// # Errors
    /// As [`Chain::apply_stages`] and [`Chain::commit_logprobs`]; nothing is
    /// accepted on error.
    pub fn finish_logprobs(
        &mut self,
        start: usize,
        row: &mut Candidates,
        spec: &crate::LogprobsSpec,
    ) -> Result<(TokenId, crate::Logprobs), SampleError> {
        let all = start..self.stages.len();
        let Some(j) = self.greedy_temperature(start) else {
            self.apply_stages(all, row)?;
            return self.commit_logprobs(row, spec);
        };
        self.apply_stages(start..j, row)?;
        let entering = row.clone();
        self.apply_stages(j..all.end, row)?;
        let t = row.selected_token().ok_or(SampleError::NoSelectingStage)?;
        let lp = crate::logprobs::processed(&entering, spec, t)?;
        self.commit(t);
        Ok((t, lp))
    }

    /// The host half of a `processed`-logprobs step on a final candidate set
    /// `row` (the chain already applied): commit its selected token and
    /// compute the logprobs.
    ///
    /// # Errors
    /// [`SampleError::NoSelectingStage`] when `row` has no selection; as
    /// [`crate::logprobs::processed`].
    pub fn commit_logprobs(
        &mut self,
        row: &Candidates,
        spec: &crate::LogprobsSpec,
    ) -> Result<(TokenId, crate::Logprobs), SampleError> {
        let t = row.selected_token().ok_or(SampleError::NoSelectingStage)?;
        let lp = crate::logprobs::processed(row, spec, t)?;
        self.commit(t);
        Ok((t, lp))
    }

    /// [`Chain::sample`] running stages `start..` only.
    ///
    /// # Errors
    /// As [`Chain::sample`].
    pub fn sample_from(
        &mut self,
        start: usize,
        row: &mut Candidates,
    ) -> Result<TokenId, SampleError> {
        if !self.selects() {
            return Err(SampleError::NoSelectingStage);
        }
        row.validate()?;
        self.finish_sample(start, row)
    }

    /// [`Chain::sample_from`] on a row the caller has validated: run stages
    /// `start..`, take the selected token, accept it, advance the step.
    ///
    /// # Errors
    /// [`SampleError::NoSelectingStage`]; any stage error.
    pub fn finish_sample(
        &mut self,
        start: usize,
        row: &mut Candidates,
    ) -> Result<TokenId, SampleError> {
        self.apply_stages(start..self.stages.len(), row)?;
        let token = row.selected_token().ok_or(SampleError::NoSelectingStage)?;
        self.commit(token);
        Ok(token)
    }

    /// Record a token chosen elsewhere (e.g. on a device) as this row's
    /// output: every stage accepts it and the step advances.
    pub fn commit(&mut self, token: TokenId) {
        self.accept(token, TokenOrigin::Output);
        self.step += 1;
    }

    /// Feed one accepted token to every stage (does not advance the step).
    pub fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        for s in &mut self.stages {
            s.accept(token, origin);
        }
    }

    /// Feed prompt tokens, in order, to history-based stages.
    pub fn accept_prompt(&mut self, tokens: &[TokenId]) {
        for &t in tokens {
            self.accept(t, TokenOrigin::Prompt);
        }
    }

    /// Give every `mask` stage of the chain this allowed-token bitmask (see
    /// [`Sampler::set_token_mask`]); it applies until replaced. Returns
    /// whether the chain has a `mask` stage.
    pub fn set_token_mask(&mut self, mask: Option<std::sync::Arc<[u32]>>) -> bool {
        let mut any = false;
        for s in &mut self.stages {
            if s.spec()
                .is_some_and(|sp| sp.kind() == crate::StageKind::Mask)
            {
                s.set_token_mask(mask.clone());
                any = true;
            }
        }
        any
    }

    /// Forget history and adaptive state; the step restarts at 0, so a fixed
    /// seed replays the same random numbers.
    pub fn reset(&mut self) {
        for s in &mut self.stages {
            s.reset();
        }
        self.step = 0;
    }
}

/// A chain is itself a sampler (tokenizers' `Sequence`): its stages run with
/// lanes relative to the inner chain and the outer step.
impl Sampler for Chain {
    fn name(&self) -> &str {
        "chain"
    }
    fn selects(&self) -> bool {
        Chain::selects(self)
    }
    fn apply(&mut self, row: &mut Candidates, ctx: &StageContext) -> Result<(), SampleError> {
        let saved = self.step;
        self.step = ctx.rng.step;
        let r = Chain::apply(self, row);
        self.step = saved;
        r
    }
    fn accept(&mut self, token: TokenId, origin: TokenOrigin) {
        Chain::accept(self, token, origin);
    }
    fn reset(&mut self) {
        Chain::reset(self);
    }
    fn box_clone(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
