//! The hybrid executor: the device prefix as one batched pass, one readback,
//! the host suffix on `sampler-cpu`.

use burn_tensor::{DType, Device, FloatDType, Int, IntDType, Tensor, TensorData, Transaction};
use sampler_core::plan::{self, OffloadPolicy, Plan, PlanStage, Readback};
use sampler_core::{Candidates, Chain, ChainSpec, DeviceRefusal, SampleError, StageSpec, TokenId};

use crate::BackendError;
use crate::ops::{self, wide};
use crate::readback::decode_error;
use crate::stage::{DeviceStage, InitContext, RowState, StepData, build_device_stage};

/// The result of one [`Executor::step`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// One entry per row: the token, or why that row could not be sampled.
    pub tokens: Vec<Result<TokenId, SampleError>>,
    /// Bytes read back from the device in this step (all rows together).
    pub bytes_read: usize,
}

/// The result of one [`Executor::filter`]: each row's candidates after the
/// whole chain ran without selecting (for chains without a selecting stage).
#[derive(Debug, Clone, PartialEq)]
pub struct FilterOutput {
    /// One entry per row.
    pub rows: Vec<Result<Candidates, SampleError>>,
    /// Bytes read back from the device.
    pub bytes_read: usize,
}

enum DeviceOut {
    /// `[B]` codes / token ids.
    Tokens(Vec<i64>),
    /// `[B, K]` ids (first id negative = status code) and logits.
    Candidates {
        ids: Vec<i64>,
        logits: Vec<f32>,
        k: usize,
    },
    /// `[B, V]` logits (raw on invalid rows).
    Full(Vec<f32>),
}

/// Runs a batch of per-row chains: the planned device prefix on the device
/// holding the logits, the rest on the host.
///
/// Per step (see the crate docs): validate rows and upload per-step inputs
/// (`set_input`), append every device stage's ops (`apply`), read back once
/// (token ids, or `k` survivors, or full rows), run the host suffix per row,
/// then `accept` the tokens on the device and in each row's CPU chain.
pub struct Executor {
    device: Device,
    batch: usize,
    vocab: usize,
    chains: Vec<Chain>,
    stages: Vec<Box<dyn DeviceStage>>,
    plan: Plan,
    /// Survivors per row when the readback is `Candidates`.
    row_keep: Vec<usize>,
    /// Per row: a device stage active in this row masks candidates that the
    /// CPU removes (metadata `device_effects.masks_removed`: top_p, min_p,
    /// epsilon, eta): drop its `-inf` entries before the host suffix. A row
    /// where that stage is a no-op keeps its `-inf` candidates, as on the CPU.
    drop_masked: Vec<bool>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("device", &self.device)
            .field("batch", &self.batch)
            .field("vocab", &self.vocab)
            .field("plan", &self.plan)
            .finish()
    }
}

fn effective_k(k: i64, n: usize) -> usize {
    if k <= 0 {
        n
    } else {
        (k as u64).min(n as u64) as usize
    }
}

impl Executor {
    /// Build an executor for `rows.len()` rows over a vocabulary of `vocab`.
    ///
    /// `rows[r]` is row `r`'s chain: every row has the same stage kinds in the
    /// same order; parameters and seeds may differ. A stage that is a no-op
    /// in some rows only is run as a no-op for those rows.
    ///
    /// # Errors
    /// [`BackendError::EmptyBatch`], [`BackendError::EmptyVocab`],
    /// [`BackendError::Param`] (invalid parameters),
    /// [`BackendError::ChainMismatch`], [`BackendError::Build`].
    pub fn new(
        rows: Vec<ChainSpec>,
        vocab: usize,
        device: &Device,
        policy: OffloadPolicy,
    ) -> Result<Self, BackendError> {
        if rows.is_empty() {
            return Err(BackendError::EmptyBatch);
        }
        if vocab == 0 {
            return Err(BackendError::EmptyVocab);
        }
        if vocab as u64 > 1 << 32 {
            return Err(BackendError::VocabTooLarge { vocab });
        }
        for (row, spec) in rows.iter().enumerate() {
            spec.validate()
                .map_err(|(stage, source)| BackendError::Param { row, stage, source })?;
        }
        let kinds = |c: &ChainSpec| c.stages.iter().map(|s| s.kind()).collect::<Vec<_>>();
        let k0 = kinds(&rows[0]);
        for (row, spec) in rows.iter().enumerate().skip(1) {
            if kinds(spec) != k0 {
                return Err(BackendError::ChainMismatch {
                    row,
                    expected: rows[0].chain_string(),
                    found: spec.chain_string(),
                });
            }
        }
        let chains = rows
            .iter()
            .enumerate()
            .map(|(row, spec)| {
                sampler_cpu::build_chain(spec).map_err(|source| BackendError::Build { row, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let batch = rows.len();
        let n_stages = k0.len();

        // Per stage: the per-row specs, a representative spec for planning,
        // and the device's init answer along the prefix.
        let mut plan_stages = Vec::with_capacity(n_stages);
        let mut built: Vec<Option<Box<dyn DeviceStage>>> = Vec::with_capacity(n_stages);
        let mut width = vocab;
        let mut has_ids = false;
        let mut prefix_alive = policy != OffloadPolicy::Off;
        for i in 0..n_stages {
            let specs: Vec<StageSpec> = rows.iter().map(|r| r.stages[i].clone()).collect();
            let active = specs.iter().any(|s| !s.is_noop());
            let rep = representative(&specs, width);
            let mut device_ok = false;
            let mut answer = Ok(());
            let mut stage = None;
            if active && prefix_alive && rep.kind().meta().device_hook {
                if let Some(mut st) = build_device_stage(i, &specs) {
                    let ctx = InitContext {
                        batch,
                        vocab,
                        width,
                        has_ids,
                        device: device.clone(),
                    };
                    answer = st.init(&ctx);
                    device_ok = answer.is_ok();
                    if device_ok {
                        let w = st.out_width(width);
                        if w != width {
                            has_ids = true;
                        }
                        width = w;
                        stage = Some(st);
                    }
                }
                prefix_alive = device_ok;
            } else if active {
                prefix_alive = false;
            }
            plan_stages.push(PlanStage {
                name: rep.name().to_string(),
                spec: Some(if active { rep } else { specs[0].clone() }),
                device: answer,
            });
            built.push(stage);
        }
        let mut plan = plan::plan(&plan_stages, vocab, policy);
        // The host drops the `-inf` candidates a masking device stage left
        // (top_p, min_p, epsilon, eta); a later device stage that bans
        // candidates (`-inf`, kept on the CPU) would make them
        // indistinguishable. Unless the whole chain runs on the device, the
        // first such stage goes to the host.
        if plan.readback != Readback::TokenIds {
            let mut masked = false;
            for &i in &plan.device {
                if masked && rows.iter().any(|r| r.stages[i].bans()) {
                    plan_stages[i].device = Err(DeviceRefusal::BansAfterMask);
                    plan = plan::plan(&plan_stages, vocab, policy);
                    break;
                }
                masked |= rows.iter().any(|r| {
                    let st = &r.stages[i];
                    st.kind().meta().device_effects.masks_removed && !st.is_noop()
                });
            }
        }
        let mut stages = Vec::new();
        for &i in &plan.device {
            if let Some(st) = built[i].take() {
                stages.push(st);
            }
        }
        // Per-row survivors after the device stages that narrow the width
        // (metadata `device_effects.narrows`, count from `StageSpec::survivors`).
        let mut row_keep = vec![vocab; batch];
        let mut w = vocab;
        for &i in &plan.device {
            if !rows[0].stages[i].kind().meta().device_effects.narrows {
                continue;
            }
            let row_k = |r: &ChainSpec| {
                r.stages[i]
                    .survivors()
                    .map_or(w, |k| effective_k(k as i64, w))
            };
            for (keep, r) in row_keep.iter_mut().zip(&rows) {
                *keep = (*keep).min(row_k(r));
            }
            w = rows.iter().map(row_k).max().unwrap_or(w).max(1);
        }
        // A device stage that masks what the CPU removes: the host drops the
        // `-inf` candidates it left, so both sides see the same set.
        let drop_masked = rows
            .iter()
            .map(|r| {
                plan.device.iter().any(|&i| {
                    let st = &r.stages[i];
                    st.kind().meta().device_effects.masks_removed && !st.is_noop()
                })
            })
            .collect();
        Ok(Self {
            device: device.clone(),
            batch,
            vocab,
            chains,
            stages,
            plan,
            row_keep,
            drop_masked,
        })
    }

    /// The plan: device stages, host stages, readback format.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
    /// Rows per step.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
    /// The device the executor runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// Row `row`'s CPU chain (seed, step, host stages).
    pub fn chain(&self, row: usize) -> Option<&Chain> {
        self.chains.get(row)
    }

    /// Feed prompt tokens of one row to its history-based stages (device
    /// counts and CPU chain). Token ids outside the vocabulary never reach
    /// the device.
    ///
    /// # Errors
    /// [`BackendError::RowOutOfRange`] when `row >= batch` (nothing changes).
    pub fn accept_prompt(&mut self, row: usize, tokens: &[TokenId]) -> Result<(), BackendError> {
        let batch = self.batch;
        let Some(chain) = self.chains.get_mut(row) else {
            return Err(BackendError::RowOutOfRange { row, batch });
        };
        chain.accept_prompt(tokens);
        for st in &mut self.stages {
            st.accept_prompt(row, tokens);
        }
        Ok(())
    }

    /// Forget every row's history and restart its step counter (a fixed seed
    /// then replays the same random numbers).
    pub fn reset(&mut self) {
        for c in &mut self.chains {
            c.reset();
        }
        for st in &mut self.stages {
            st.reset();
        }
    }

    /// Sample one token per row from `logits` `[batch, vocab]` on the
    /// executor's device: one batched device pass, one readback, the host
    /// suffix, then every row's chain (and the device state) accepts its token.
    ///
    /// # Errors
    /// [`BackendError::Shape`], [`BackendError::WrongDevice`],
    /// [`BackendError::Readback`]. Per-row problems (NaN rows, all `-inf`)
    /// are `Err` entries of [`StepOutput::tokens`]; the other rows are sampled.
    pub fn step(&mut self, logits: Tensor<2>) -> Result<StepOutput, BackendError> {
        let (out, bytes_read) = self.run_device(logits)?;
        let host_start = self.plan.host_start;
        let mut tokens = Vec::with_capacity(self.batch);
        match out {
            DeviceOut::Tokens(codes) => {
                for (r, &c) in codes.iter().enumerate() {
                    let res = self.decode_token(c);
                    if let (Ok(t), Some(chain)) = (&res, self.chains.get_mut(r)) {
                        chain.commit(*t);
                    }
                    tokens.push(res);
                }
            }
            other => {
                for r in 0..self.batch {
                    let res = match self.host_row(&other, r) {
                        Ok(mut cand) => self.chains[r].sample_from(host_start, &mut cand),
                        Err(e) => Err(e),
                    };
                    tokens.push(res);
                }
            }
        }
        let accepted: Vec<Option<TokenId>> =
            tokens.iter().map(|t| t.as_ref().ok().copied()).collect();
        for st in &mut self.stages {
            st.accept(&accepted);
        }
        Ok(StepOutput { tokens, bytes_read })
    }

    /// Run the chain on `logits` `[batch, vocab]` without selecting or
    /// accepting anything, and return each row's candidates (device prefix
    /// read back, host suffix applied with `Chain::apply_from`). Meant for
    /// chains without a selecting stage (filters only), e.g. to inspect the
    /// surviving set; nothing advances.
    ///
    /// # Errors
    /// As [`Executor::step`].
    pub fn filter(&mut self, logits: Tensor<2>) -> Result<FilterOutput, BackendError> {
        let (out, bytes_read) = self.run_device(logits)?;
        let host_start = self.plan.host_start;
        let mut rows = Vec::with_capacity(self.batch);
        for r in 0..self.batch {
            let res = match &out {
                DeviceOut::Tokens(codes) => match self.decode_token(codes[r]) {
                    Ok(t) => Candidates::from_parts(vec![t], vec![0.0], self.vocab),
                    Err(e) => Err(e),
                },
                other => match self.host_row(other, r) {
                    Ok(mut cand) => self.chains[r]
                        .apply_from(host_start, &mut cand)
                        .map(|_| cand),
                    Err(e) => Err(e),
                },
            };
            rows.push(res);
        }
        Ok(FilterOutput { rows, bytes_read })
    }

    fn decode_token(&self, code: i64) -> Result<TokenId, SampleError> {
        if code < 0 {
            Err(decode_error(code))
        } else if (code as u64) < self.vocab as u64 {
            Ok(code as TokenId)
        } else {
            Err(SampleError::TokenOutOfRange {
                token: code.min(u32::MAX as i64) as u32,
                vocab: self.vocab,
            })
        }
    }

    fn host_row(&self, out: &DeviceOut, r: usize) -> Result<Candidates, SampleError> {
        match out {
            DeviceOut::Full(all) => {
                let v = self.vocab;
                let row = &all[r * v..(r + 1) * v];
                // Invalid rows come back raw: keep positions for the error index.
                let valid = row.iter().all(|l| !l.is_nan() && *l != f32::INFINITY);
                if self.drop_masked[r] && valid && row.iter().any(|l| l.is_finite()) {
                    let (ids, logits): (Vec<TokenId>, Vec<f32>) = row
                        .iter()
                        .enumerate()
                        .filter(|(_, l)| **l != f32::NEG_INFINITY)
                        .map(|(i, &l)| (i as TokenId, l))
                        .unzip();
                    return Candidates::from_parts(ids, logits, v);
                }
                Ok(Candidates::from_logits(row))
            }
            DeviceOut::Candidates { ids, logits, k } => {
                let row_ids = &ids[r * k..(r + 1) * k];
                if let Some(&c) = row_ids.first()
                    && c < 0
                {
                    return Err(decode_error(c));
                }
                let keep = self.row_keep[r].min(*k);
                let mut out_ids = Vec::with_capacity(keep);
                for &id in &row_ids[..keep] {
                    if id < 0 || id as u64 >= self.vocab as u64 {
                        return Err(SampleError::Device(format!(
                            "device returned token id {id} outside the vocabulary"
                        )));
                    }
                    out_ids.push(id as TokenId);
                }
                let mut row_logits = logits[r * k..r * k + keep].to_vec();
                if self.drop_masked[r] && row_logits.iter().any(|l| l.is_finite()) {
                    let (i2, l2): (Vec<TokenId>, Vec<f32>) = out_ids
                        .iter()
                        .zip(&row_logits)
                        .filter(|(_, l)| **l != f32::NEG_INFINITY)
                        .map(|(&i, &l)| (i, l))
                        .unzip();
                    out_ids = i2;
                    row_logits = l2;
                }
                Candidates::from_parts(out_ids, row_logits, self.vocab)
            }
            DeviceOut::Tokens(_) => Err(SampleError::Device("no candidates were read back".into())),
        }
    }

    /// The device pass and the single readback.
    fn run_device(&mut self, logits: Tensor<2>) -> Result<(DeviceOut, usize), BackendError> {
        let dims = logits.dims();
        if dims != [self.batch, self.vocab] {
            return Err(BackendError::Shape {
                found: dims.to_vec(),
                batch: self.batch,
                vocab: self.vocab,
            });
        }
        let ldev = logits.device();
        if ldev != self.device {
            return Err(BackendError::WrongDevice {
                found: format!("{ldev:?}"),
                expected: format!("{:?}", self.device),
            });
        }
        let logits = if logits.dtype() == DType::F32 {
            logits
        } else {
            logits.cast(FloatDType::F32)
        };
        let (b, v) = (self.batch, self.vocab);
        if self.stages.is_empty() {
            let data = Transaction::default()
                .register(logits)
                .try_execute()
                .map_err(|e| BackendError::Readback(format!("{e:?}")))?;
            let bytes = data.iter().map(|d| d.as_bytes().len()).sum();
            let all = read_f32(&data[0])?;
            return Ok((DeviceOut::Full(all), bytes));
        }

        // Row validation: first NaN / +inf position, encoded as a status code.
        let d = &self.device;
        let pos = ops::positions(b, v, d);
        let nan = logits.clone().is_nan();
        let posinf = logits
            .clone()
            .is_inf()
            .bool_and(logits.clone().greater_elem(0.0));
        let nan_first = ops::min_where_int(pos.clone(), nan, v as i64);
        let inf_first = ops::min_where_int(pos, posinf, v as i64);
        let invalid = nan_first
            .clone()
            .lower_elem(v as i64)
            .bool_or(inf_first.clone().lower_elem(v as i64));
        let nan_code = nan_first.clone().mul_scalar(-2).sub_scalar(2);
        let inf_code = inf_first.clone().mul_scalar(-2).sub_scalar(3);
        let code = inf_code.mask_where(nan_first.lower_equal(inf_first), nan_code);
        let clean = logits.clone().mask_fill(wide(invalid.clone(), v), 0.0);

        let mut data = StepData {
            logits: clean,
            probs: None,
            ids: None,
            order_ids: None,
            sampled: None,
            invalid: invalid.clone(),
            batch: b,
            vocab: v,
            width: v,
            device: d.clone(),
        };
        let rows: Vec<RowState> = self
            .chains
            .iter()
            .map(|c| RowState {
                seed: c.seed(),
                step: c.step(),
            })
            .collect();
        for st in &mut self.stages {
            st.set_input(&rows);
            st.apply(&mut data);
        }

        match self.plan.readback {
            Readback::TokenIds => {
                let Some(sampled) = data.sampled else {
                    return Err(BackendError::Readback(
                        "the device prefix selected no token".into(),
                    ));
                };
                let out = sampled
                    .reshape([b, 1])
                    .mask_where(invalid, code)
                    .cast(IntDType::I32)
                    .reshape([b]);
                let res = Transaction::default()
                    .register(out)
                    .try_execute()
                    .map_err(|e| BackendError::Readback(format!("{e:?}")))?;
                let bytes = res.iter().map(|x| x.as_bytes().len()).sum();
                Ok((DeviceOut::Tokens(read_i64(&res[0])), bytes))
            }
            Readback::Candidates { .. } if data.ids.is_some() => {
                let k = data.width;
                let ids = data.ids.unwrap_or_else(|| ops::positions(b, k, d));
                let first = ops::positions(b, k, d)
                    .equal_elem(0)
                    .bool_and(wide(invalid, k));
                let ids: Tensor<2, Int> = ids.mask_where(first, wide(code, k)).cast(IntDType::I32);
                let res = Transaction::default()
                    .register(ids)
                    .register(data.logits)
                    .try_execute()
                    .map_err(|e| BackendError::Readback(format!("{e:?}")))?;
                let bytes = res.iter().map(|x| x.as_bytes().len()).sum();
                let ids = read_i64(&res[0]);
                let logits = read_f32(&res[1])?;
                Ok((DeviceOut::Candidates { ids, logits, k }, bytes))
            }
            _ => {
                let out = data.logits.mask_where(wide(invalid, v), logits);
                let res = Transaction::default()
                    .register(out)
                    .try_execute()
                    .map_err(|e| BackendError::Readback(format!("{e:?}")))?;
                let bytes = res.iter().map(|x| x.as_bytes().len()).sum();
                Ok((DeviceOut::Full(read_f32(&res[0])?), bytes))
            }
        }
    }
}

fn read_i64(d: &TensorData) -> Vec<i64> {
    d.iter::<i64>().collect()
}

fn read_f32(d: &TensorData) -> Result<Vec<f32>, BackendError> {
    if d.dtype() != DType::F32 {
        return Err(BackendError::Readback(format!(
            "expected f32 logits, the device returned {:?}",
            d.dtype()
        )));
    }
    Ok(d.iter::<f32>().collect())
}

/// The spec the planner sees for a stage whose parameters differ per row:
/// an active row's spec (the stage runs on the device for every row), and
/// for a stage that narrows the width the row with the most survivors
/// (a row without a bound counts as the full width).
fn representative(specs: &[StageSpec], width: usize) -> StageSpec {
    let first_active = specs.iter().find(|s| !s.is_noop()).unwrap_or(&specs[0]);
    if first_active.kind().meta().device_effects.narrows {
        let most = |s: &&StageSpec| {
            s.survivors()
                .map_or(width, |k| effective_k(k as i64, width))
        };
        if let Some(widest) = specs
            .iter()
            .filter(|s| s.kind() == first_active.kind())
            .max_by_key(most)
        {
            let mut rep = widest.clone();
            if widest.survivors().is_none() {
                // A no-op row of a narrowing stage: the planner sees the full width.
                rep = first_active.clone();
                let _ = rep.set_param("k", sampler_core::ParamValue::Int(width as i64));
            }
            return rep;
        }
    }
    first_active.clone()
}
