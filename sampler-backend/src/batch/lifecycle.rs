//! The calls that add, change and remove requests between steps, and the
//! per-request validation and planning they share.

use std::sync::Arc;

use sampler_core::plan::PlanStage;
use sampler_core::{Chain, ChainSpec, StageSpec, TokenId, TokenOrigin};

use crate::BackendError;
use crate::batch::SamplingBatch;
use crate::batch::constrained::Constrained;
use crate::batch::request::{Request, RequestId, masks_act};
use crate::planner::{Planned, plan_request};

impl SamplingBatch {
    /// Add a request: its chain (a `seed: None` draws one from the OS; read
    /// it back with [`SamplingBatch::spec`]) and the prompt tokens its
    /// history-based stages count. Nothing runs until the next step.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] (a parameter out of range: which
    /// stage, which field, what range), [`BackendError::RequestBuild`].
    pub fn insert(
        &mut self,
        mut spec: ChainSpec,
        prompt: &[TokenId],
    ) -> Result<RequestId, BackendError> {
        let (chain, planned) = self.prepare(&mut spec, &[])?;
        Ok(self.add(spec, chain, planned, prompt))
    }

    /// Add a request whose chain the caller built, custom stages included
    /// (any [`sampler_core::Sampler`]; e.g. `Chain::new(stages, seed)`),
    /// with the logprobs it asks for. The planner offloads the built-in
    /// stages before the first custom stage (as for any request) and runs the
    /// custom stage and everything after it on the host, on the candidates
    /// that come back; the plan names the custom stage as the reason
    /// ([`HostReason::CustomStage`](sampler_core::plan::HostReason::CustomStage)). The chain keeps its own seed, state
    /// and fast kernels (sampler-cpu's are installed when it has none).
    /// [`SamplingBatch::spec`] then returns the built-in stages before the
    /// first custom one; [`SamplingBatch::update`] replaces the whole chain.
    /// Insert a fresh chain (no accepted tokens) and give its history as
    /// `prompt`: the batch cannot see what a chain accepted before, and its
    /// device stages are built from the history the batch records.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for a built-in stage's parameter
    /// out of range or bad logprobs; [`BackendError::StepPending`] never
    /// (inserting is allowed while a step is in flight).
    pub fn insert_chain(
        &mut self,
        chain: Chain,
        logprobs: Option<sampler_core::LogprobsSpec>,
        prompt: &[TokenId],
    ) -> Result<RequestId, BackendError> {
        let specs = chain.specs();
        let first_custom = specs
            .iter()
            .position(Option::is_none)
            .unwrap_or(specs.len());
        let mut spec = ChainSpec {
            stages: specs[..first_custom].iter().flatten().cloned().collect(),
            seed: Some(chain.seed()),
            logprobs,
        };
        let tail: Vec<PlanStage> = chain.stages()[first_custom..]
            .iter()
            .zip(&specs[first_custom..])
            .map(|(st, sp)| PlanStage {
                name: st.name().to_string(),
                spec: sp.clone(),
                device: Ok(()),
            })
            .collect();
        let (_, planned) = self.prepare(&mut spec, &tail)?;
        let chain = match chain.kernels() {
            Some(_) => chain,
            None => chain.with_kernels(sampler_cpu::ROW_KERNELS),
        };
        Ok(self.add(spec, chain, planned, prompt))
    }

    pub(crate) fn add(
        &mut self,
        spec: ChainSpec,
        chain: Chain,
        planned: Planned,
        prompt: &[TokenId],
    ) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        let mut req = Request {
            spec,
            chain,
            plan: planned.plan,
            key: planned.key,
            keep: planned.keep,
            drop_masked: planned.drop_masked,
            history: Vec::new(),
            outputs: Vec::new(),
            mask: None,
            constraint: None,
        };
        req.chain.accept_prompt(prompt);
        req.history
            .extend(prompt.iter().map(|&t| (t, TokenOrigin::Prompt)));
        self.groups.join(id, &req.key);
        self.requests.insert(id, req);
        id
    }

    /// Remove a request (finished or cancelled); its id becomes unknown.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn remove(&mut self, id: RequestId) -> Result<(), BackendError> {
        self.idle("remove")?;
        let req = self
            .requests
            .remove(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        self.groups.leave(id, &req.key);
        Ok(())
    }

    /// Record `token` as the request's next generated token, chosen by the
    /// engine rather than sampled (beam search picks among the candidates
    /// [`SamplingBatch::filter`] returns): its history-based stages accept
    /// it (penalty window, DRY, `min_tokens` count) and its step counter
    /// advances, exactly as if a step had sampled it. The request's device
    /// state is rebuilt from its history at its group's next step.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::TokenOutOfRange`]
    /// for a token outside the vocabulary, [`BackendError::StepPending`].
    pub fn commit(&mut self, id: RequestId, token: TokenId) -> Result<(), BackendError> {
        self.idle("commit")?;
        if token as usize >= self.vocab {
            return Err(BackendError::TokenOutOfRange {
                id: id.0,
                token,
                vocab: self.vocab,
            });
        }
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        req.chain.commit(token);
        if let Some(c) = &mut req.constraint {
            c.accept(&[token]);
        }
        req.outputs.push(token);
        req.history.push((token, TokenOrigin::Output));
        let key = req.key.clone();
        self.groups.dirty(&key);
        Ok(())
    }

    /// Fork a request into `n` more: each child continues from the
    /// parent's exact state (step counter, history and penalty window, DRY
    /// and `min_tokens` counts, mirostat `mu`, the next step's mask) with
    /// its own randomness: child `i` (1-based, in the order returned) gets
    /// the seed [`sampler_core::rng::child_seed`]`(parent_seed, i)`, the
    /// parent being child 0. The seeds depend only on the parent's seed and
    /// the index, so a child continues exactly as a fresh request with that
    /// seed fed the same history (prompt, then the generated tokens
    /// committed) would, whatever the step of the fork. The parent is
    /// unchanged; a request's `n` choices (OpenAI / vLLM `n`) are the parent
    /// and `fork(id, n - 1)`.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::ForkCount`] for
    /// `n` of 0 or above [`crate::MAX_FORK`], [`BackendError::StepPending`].
    pub fn fork(&mut self, id: RequestId, n: usize) -> Result<Vec<RequestId>, BackendError> {
        self.idle("fork")?;
        if n == 0 || n > crate::MAX_FORK {
            return Err(BackendError::ForkCount {
                id: id.0,
                n,
                max: crate::MAX_FORK,
            });
        }
        let parent = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        let mut constraints: Vec<Option<Constrained>> = (0..n)
            .map(|_| parent.constraint.as_mut().map(Constrained::fork))
            .collect();
        let parent = &*parent;
        let seed = parent.chain.seed();
        let children: Vec<Request> = (1..=n as u64)
            .map(|i| {
                let child_seed = sampler_core::rng::child_seed(seed, i);
                let mut chain = parent.chain.clone();
                chain.set_seed(child_seed);
                let mut spec = parent.spec.clone();
                spec.seed = Some(child_seed);
                Request {
                    spec,
                    chain,
                    plan: parent.plan.clone(),
                    key: parent.key.clone(),
                    keep: parent.keep,
                    drop_masked: parent.drop_masked,
                    history: parent.history.clone(),
                    outputs: parent.outputs.clone(),
                    mask: parent.mask.clone(),
                    constraint: constraints[i as usize - 1].take(),
                }
            })
            .collect();
        let mut ids = Vec::with_capacity(n);
        for req in children {
            let child = RequestId(self.next_id);
            self.next_id += 1;
            self.groups.join(child, &req.key);
            self.requests.insert(child, req);
            ids.push(child);
        }
        Ok(ids)
    }

    /// Forget a request's history (prompt and generated tokens, adaptive
    /// state) and restart its step counter: its seed then replays the same
    /// random numbers. Other requests are unaffected.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn reset(&mut self, id: RequestId) -> Result<(), BackendError> {
        self.idle("reset")?;
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        req.chain.reset();
        if let Some(c) = &mut req.constraint {
            c.reset();
        }
        req.history.clear();
        req.outputs.clear();
        let key = req.key.clone();
        self.groups.dirty(&key);
        Ok(())
    }

    /// Feed more prompt tokens to a request's history-based stages (e.g. a
    /// chat turn appended to a running request).
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn accept_prompt(&mut self, id: RequestId, tokens: &[TokenId]) -> Result<(), BackendError> {
        self.idle("accept_prompt")?;
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        req.chain.accept_prompt(tokens);
        req.history
            .extend(tokens.iter().map(|&t| (t, TokenOrigin::Prompt)));
        let key = req.key.clone();
        let group = self.groups.get_mut(&key);
        if let Some(g) = group
            && let Some(slot) = g.members.iter().position(|&m| m == id)
            && let Some(stages) = &mut g.stages
        {
            for st in stages.iter_mut().filter(|st| st.needs_history()) {
                st.accept_prompt(slot, tokens);
            }
        }
        Ok(())
    }

    /// Constrain a request's next step to the tokens of `mask`: an
    /// allowed-token bitmask of `ceil(vocab / 32)` `u32` words (bit
    /// `id % 32` of word `id / 32` allows token `id`; the format of
    /// llguidance and XGrammar), applied where the chain's `mask` stage
    /// stands, on the device or the host. It holds for the next step only
    /// (`None`, or no call, allows every token). A mask that allows nothing
    /// left makes that row's step fail with [`SampleError::AllMasked`](sampler_core::SampleError::AllMasked); the
    /// other rows are unaffected.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::NoMaskStage`],
    /// [`BackendError::MaskLength`], [`BackendError::StepPending`].
    pub fn set_mask(&mut self, id: RequestId, mask: Option<&[u32]>) -> Result<(), BackendError> {
        self.idle("set_mask")?;
        let vocab = self.vocab;
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        if !masks_act(&req.chain) {
            return Err(BackendError::NoMaskStage { id: id.0 });
        }
        if let Some(m) = mask
            && m.len() != vocab.div_ceil(32)
        {
            return Err(BackendError::MaskLength {
                id: id.0,
                found: m.len(),
                expected: vocab.div_ceil(32),
            });
        }
        req.mask = mask.map(Arc::from);
        Ok(())
    }

    /// Hold a request's output to a structured-output constraint (a JSON
    /// schema, regex or grammar matcher; `sampler-structured` builds them
    /// with llguidance), or release it (`None`). From the next step on,
    /// every step's mask comes from the constraint in the state the
    /// request's accepted tokens left it: each token a step samples (or
    /// [`SamplingBatch::commit`] records) is consumed, and the next mask is
    /// computed on the thread pool right away, while the engine runs its
    /// forward pass; `submit` only collects it. A mask given with
    /// [`SamplingBatch::set_mask`] for the same step is combined with it
    /// (a token must be allowed by both). `reset` resets the constraint,
    /// `fork` copies it, `update` keeps it.
    ///
    /// The constraint's end-of-sequence tokens are allowed only where it
    /// accepts the output; [`SamplingBatch::constraint_finished`] says when
    /// nothing else is. If the matcher fails (its error, a committed token
    /// it refuses), that request's later steps fail with
    /// [`SampleError::Constraint`](sampler_core::SampleError::Constraint)
    /// and accept nothing; other requests are unaffected. Speculative
    /// verification of a constrained request takes no drafts
    /// ([`SamplingBatch::submit_verify`]).
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::NoMaskStage`] (the
    /// chain needs a `mask` stage before its selecting stage; the config
    /// front ends put one first when a request asks for structured output),
    /// [`BackendError::StepPending`].
    pub fn set_constraint(
        &mut self,
        id: RequestId,
        constraint: Option<Box<dyn sampler_core::TokenConstraint>>,
    ) -> Result<(), BackendError> {
        self.idle("set_constraint")?;
        let words = self.vocab.div_ceil(32);
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        if constraint.is_some() && !masks_act(&req.chain) {
            return Err(BackendError::NoMaskStage { id: id.0 });
        }
        req.constraint = constraint.map(|c| Constrained::new(c, words));
        Ok(())
    }

    /// Whether a request's constraint has finished: its output is complete
    /// and only an end-of-sequence token is allowed next (`false` without a
    /// constraint). An engine may end the request here rather than sample
    /// that token.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn constraint_finished(&mut self, id: RequestId) -> Result<bool, BackendError> {
        let req = self
            .requests
            .get_mut(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?;
        Ok(req
            .constraint
            .as_mut()
            .is_some_and(Constrained::is_finished))
    }

    /// Change a request's chain between steps (new parameters, stages
    /// added or removed). The request keeps its seed (unless `spec` names
    /// one), its step counter, its prompt and generated tokens: the new
    /// chain's history-based stages are given that history, and a stage
    /// whose spec is unchanged at the same position keeps its adaptive
    /// state (mirostat `mu`). Only the request's group uploads anything.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::InvalidRequest`],
    /// [`BackendError::RequestBuild`]; on error nothing changes.
    pub fn update(&mut self, id: RequestId, mut spec: ChainSpec) -> Result<(), BackendError> {
        self.idle("update")?;
        let old_seed = self
            .requests
            .get(&id)
            .ok_or(BackendError::UnknownRequest { id: id.0 })?
            .spec
            .seed;
        spec.seed = spec.seed.or(old_seed);
        let (mut chain, planned) = self.prepare(&mut spec, &[])?;
        let Some(req) = self.requests.get_mut(&id) else {
            return Err(BackendError::UnknownRequest { id: id.0 });
        };
        if req.constraint.is_some() && !masks_act(&chain) {
            return Err(BackendError::NoMaskStage { id: id.0 });
        }
        if spec.stages.iter().any(|s| s.kind().meta().needs_history) {
            for &(t, origin) in &req.history {
                chain.accept(t, origin);
            }
        }
        chain.set_step(req.chain.step());
        for (i, (old, new)) in req.spec.stages.iter().zip(&spec.stages).enumerate() {
            if old == new && spec.seed == req.spec.seed {
                std::mem::swap(&mut chain.stages_mut()[i], &mut req.chain.stages_mut()[i]);
            }
        }
        let old_key = std::mem::replace(&mut req.key, planned.key.clone());
        req.spec = spec;
        req.chain = chain;
        // A mask given for the old chain cannot act on a chain whose mask
        // stage is gone (or now after its selecting stage): dropped, not
        // kept for a later chain that has one again.
        if !masks_act(&req.chain) {
            req.mask = None;
        }
        req.plan = planned.plan;
        req.keep = planned.keep;
        req.drop_masked = planned.drop_masked;
        if old_key == planned.key {
            self.groups.dirty(&old_key);
        } else {
            self.groups.leave(id, &old_key);
            self.groups.join(id, &planned.key);
        }
        Ok(())
    }

    /// Validate and plan a request alone; fills in its seed. `tail`: the
    /// stages of a caller-built chain from its first custom stage on.
    pub(crate) fn prepare(
        &self,
        spec: &mut ChainSpec,
        tail: &[PlanStage],
    ) -> Result<(Chain, Planned), BackendError> {
        spec.validate()
            .map_err(|(stage, source)| BackendError::InvalidRequest { stage, source })?;
        if let Some(lp) = &spec.logprobs
            && let Some(&t) = lp.token_ids.iter().find(|&&t| t as usize >= self.vocab)
        {
            return Err(BackendError::InvalidRequest {
                stage: spec.stages.len(),
                source: sampler_core::ParamError {
                    stage: "logprobs",
                    param: "logprob_token_ids",
                    value: t.to_string(),
                    expected: format!("token ids below the vocabulary size {}", self.vocab),
                },
            });
        }
        // Stop ids the vocabulary does not have could never be sampled:
        // refused here, like logprob ids, not at every step.
        for (i, st) in spec.stages.iter().enumerate() {
            if let StageSpec::MinTokens { stop, .. } = st
                && let Some(&t) = stop.iter().find(|&&t| t as usize >= self.vocab)
            {
                return Err(BackendError::InvalidRequest {
                    stage: i,
                    source: sampler_core::ParamError {
                        stage: "min_tokens",
                        param: "stop",
                        value: t.to_string(),
                        expected: format!("token ids below the vocabulary size {}", self.vocab),
                    },
                });
            }
        }
        let chain = sampler_cpu::build_chain(spec)
            .map_err(|source| BackendError::RequestBuild { source })?;
        spec.seed = Some(chain.seed());
        let planned = plan_request(
            spec,
            tail,
            self.vocab,
            &self.device,
            self.policy,
            self.host_kernels,
        );
        Ok((chain, planned))
    }
}
