//! The per-request device plan: which of a request's stages run on the
//! device (each device-capable stage's `init` at one slot, along the
//! prefix), what comes back, and the group the request joins; decided from
//! the request's own metadata, never from the batch it shares.

use burn_tensor::Device;
use sampler_core::plan::{self, HostReason, OffloadPolicy, Plan, PlanStage, Readback};
use sampler_core::{ChainSpec, DeviceRefusal, LogprobsMode, StageKind};

use crate::stage::{InitContext, build_device_stage};

/// The device prefix a request runs: `(chain position, kind, survivors)` of
/// each device stage, and the readback. Requests with equal keys share a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey {
    pub(crate) device: Vec<(usize, StageKind, Option<usize>)>,
    pub(crate) readback: Readback,
    /// Logprobs the device computes: mode, top `n`, `m` requested ids.
    pub(crate) logprobs: Option<(LogprobsMode, usize, usize)>,
}

/// The largest vocabulary a device stage takes: device token ids are
/// `i32` (ids `0..2^31`).
const DEVICE_VOCAB_LIMIT: u64 = 1 << 31;

fn effective_k(k: u64, n: usize) -> usize {
    if k == 0 { n } else { k.min(n as u64) as usize }
}

/// What a request's own plan says.
pub(crate) struct Planned {
    pub(crate) plan: Plan,
    pub(crate) key: GroupKey,
    pub(crate) keep: usize,
    pub(crate) drop_masked: bool,
}

/// Plan one request alone: each device-capable stage's `init` at one slot,
/// along the prefix.
pub(crate) fn plan_request(
    spec: &ChainSpec,
    tail: &[PlanStage],
    vocab: usize,
    device: &Device,
    policy: OffloadPolicy,
    host_kernels: bool,
) -> Planned {
    let policy = if host_kernels {
        OffloadPolicy::Off
    } else {
        policy
    };
    let mut plan_stages = Vec::with_capacity(spec.stages.len());
    let mut width = vocab;
    let mut has_ids = false;
    let mut prefix_alive = policy != OffloadPolicy::Off;
    let processed = spec
        .logprobs
        .as_ref()
        .is_some_and(|l| l.mode == LogprobsMode::Processed);
    for (i, st) in spec.stages.iter().enumerate() {
        let active = !st.is_noop();
        let mut answer = Ok(());
        if active && prefix_alive && st.kind().meta().device_hook {
            if processed && st.is_greedy_temperature() {
                answer = Err(DeviceRefusal::GreedyTemperatureLogprobs);
            } else if vocab as u64 > DEVICE_VOCAB_LIMIT {
                answer = Err(DeviceRefusal::VocabBeyondDeviceIds {
                    vocab,
                    limit: DEVICE_VOCAB_LIMIT,
                });
            } else if let Some(mut ds) = build_device_stage(i, std::slice::from_ref(st)) {
                let ctx = InitContext {
                    batch: 1,
                    vocab,
                    width,
                    has_ids,
                    device: device.clone(),
                };
                answer = ds.init(&ctx);
                if answer.is_ok() {
                    let w = ds.out_width(width);
                    has_ids |= w != width;
                    width = w;
                }
            }
            prefix_alive = answer.is_ok();
        } else if active {
            prefix_alive = false;
        }
        plan_stages.push(PlanStage {
            name: st.name().to_string(),
            spec: Some(st.clone()),
            device: answer,
        });
    }
    plan_stages.extend(tail.iter().cloned());
    let mut plan = plan::plan(&plan_stages, vocab, policy);
    // The host drops the `-inf` candidates a masking device stage left
    // (top_p, min_p, epsilon, eta); a later device stage that bans
    // candidates (`-inf`, kept on the CPU) would make them
    // indistinguishable. Unless the whole chain runs on the device, the
    // first such stage goes to the host.
    if plan.readback != Readback::TokenIds {
        let mut masked = false;
        for &i in &plan.device {
            let st = &spec.stages[i];
            if masked && st.bans() {
                plan_stages[i].device = Err(DeviceRefusal::BansAfterMask);
                plan = plan::plan(&plan_stages, vocab, policy);
                break;
            }
            masked |= st.kind().meta().device_effects.masks_removed;
        }
    }
    if host_kernels && !plan.host.is_empty() {
        plan.host_reason = Some(HostReason::CpuDevice);
    }
    let lp = spec.logprobs.as_ref();
    if lp.is_some_and(|l| l.mode == LogprobsMode::Raw)
        && matches!(plan.readback, Readback::FullLogits { .. })
        && !plan.device.is_empty()
    {
        plan = plan::plan(&plan_stages, vocab, OffloadPolicy::Off);
        plan.host_reason = Some(HostReason::RawLogprobs);
    }
    let mut keep = vocab;
    for &i in &plan.device {
        let st = &spec.stages[i];
        if st.kind().meta().device_effects.narrows
            && let Some(k) = st.survivors()
        {
            keep = keep.min(effective_k(k as u64, keep));
        }
    }
    let drop_masked = plan
        .device
        .iter()
        .any(|&i| spec.stages[i].kind().meta().device_effects.masks_removed);
    let key = GroupKey {
        device: plan
            .device
            .iter()
            .map(|&i| {
                let st = &spec.stages[i];
                (i, st.kind(), st.survivors().map(|k| k.min(vocab)))
            })
            .collect(),
        readback: plan.readback,
        // The device computes raw logprobs whenever it runs a prefix, and
        // processed ones when it runs the whole chain.
        logprobs: lp
            .filter(|l| {
                !plan.device.is_empty()
                    && (l.mode == LogprobsMode::Raw || plan.readback == Readback::TokenIds)
            })
            .map(|l| (l.mode, l.top_n, l.token_ids.len())),
    };
    Planned {
        plan,
        key,
        keep,
        drop_masked,
    }
}
