//! The planner and the readback formats.
//!
//! Pure functions of stage metadata, parameters and the device's `init`
//! answers: a [`Plan`] is a value that prints and can be compared in tests.

use std::fmt;

use crate::StageSpec;

/// Why a device cannot run a stage that has a device recipe: the answer of
/// the recipe's `init` (sampler-backend), shown by `plan`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceRefusal {
    /// The step has no candidates (`width == 0`).
    #[error("the row has no candidates")]
    EmptyWidth,
    /// A dense `[batch, vocab]` table would exceed the recipe's size limit.
    #[error("a dense [batch, vocab] table of {entries} entries exceeds the limit of {limit}")]
    TooLarge {
        /// `batch * vocab`, saturated.
        entries: u64,
        /// The limit.
        limit: u64,
    },
    /// The device holds token ids as `i32`: a vocabulary of more than
    /// `2^31` tokens has ids it cannot hold, so every stage runs on the host.
    #[error(
        "token ids of a vocabulary of {vocab} do not fit the device's i32 ids (at most {limit} tokens)"
    )]
    VocabBeyondDeviceIds {
        /// Vocabulary size.
        vocab: usize,
        /// The largest vocabulary the device takes (`2^31`).
        limit: u64,
    },
    /// The stage can set logits to `-inf` without removing the candidate
    /// (a logit_bias ban, a greedy temperature) after a device stage that
    /// masks the candidates it removes, and the chain goes on on the host:
    /// the host could not tell the two apart, so it runs this stage.
    #[error("it can ban candidates (-inf) after a masking device stage, before host stages")]
    BansAfterMask,
    /// The stage would need burn's generic top-k at `k` (no custom kernel
    /// takes it: `k` above the top-k kernel's 1024, a `top_k` after
    /// another, a `min_keep` above the limit on a full row). That
    /// reduction unrolls `k` accumulators per thread: on a GPU its compile
    /// time grows with `k` (minutes at `k = 1000`) and would stall the
    /// first step of every request in the batch, so above `limit` the
    /// stage runs on the host, at the host's cost.
    #[error(
        "a top-{k} selection outside the custom kernels would compile burn's generic top-k for k = {k} (at most {limit})"
    )]
    SelectionTooWide {
        /// The selection size.
        k: usize,
        /// The largest `k` given to the generic top-k on a GPU.
        limit: usize,
    },
    /// The stage's device recipe compares the candidates pairwise
    /// (`[B, N, N]`): it takes rows of at most `limit` candidates (after a
    /// device `top_k`); a wider row runs it on the host.
    #[error(
        "its device recipe compares candidates pairwise, at most {limit} of them; the row has {width} (a device top_k before it narrows the row)"
    )]
    PairwiseTooWide {
        /// The row's width.
        width: usize,
        /// The widest row the recipe takes.
        limit: usize,
    },
    /// `processed` logprobs are taken from the candidates entering a greedy
    /// temperature (`temperature(0)`, as `greedy`'s are), which the device
    /// does not keep: the stage and the rest of the chain run on the host.
    #[error(
        "processed logprobs are taken before a greedy temperature (t < 1e-5), which runs on the host"
    )]
    GreedyTemperatureLogprobs,
    /// A parameter names a token outside the vocabulary: the host reports it
    /// as that row's error.
    #[error("row {row}: token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// Row.
        row: usize,
        /// The token id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
}

/// Why the device prefix ends where it does (the first active stage left to
/// the host), as [`Plan::host_reason`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostReason {
    /// The offload policy caps the prefix.
    Policy,
    /// A custom stage (no built-in spec) runs on the host.
    CustomStage,
    /// The stage kind has no device recipe (its metadata's `device_hook`).
    NoDeviceRecipe,
    /// The device's `init` refused the stage.
    Refused(DeviceRefusal),
    /// A selecting stage with active stages after it.
    SelectsBeforeEnd,
    /// The logits live on a CPU device (`flex`, `ndarray`) and the policy is
    /// `auto`: sampler-cpu's kernels over the rows beat burn's generic ops
    /// there, so the whole chain runs on the host.
    CpuDevice,
    /// The request wants `raw` logprobs and its device prefix would read
    /// back full rows: the raw row read once and everything on the host is
    /// cheaper than both rows.
    RawLogprobs,
}

impl HostReason {
    /// The reason as one snake_case word, for scripts: `policy`,
    /// `custom_stage`, `no_device_recipe`, `refused`, `selects_before_end`,
    /// `cpu_device`, `raw_logprobs`.
    pub fn word(&self) -> &'static str {
        match self {
            HostReason::Policy => "policy",
            HostReason::CustomStage => "custom_stage",
            HostReason::NoDeviceRecipe => "no_device_recipe",
            HostReason::Refused(_) => "refused",
            HostReason::SelectsBeforeEnd => "selects_before_end",
            HostReason::CpuDevice => "cpu_device",
            HostReason::RawLogprobs => "raw_logprobs",
        }
    }
}

impl fmt::Display for HostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostReason::Policy => write!(f, "the offload policy caps the device prefix"),
            HostReason::CustomStage => write!(f, "a custom stage runs on the host"),
            HostReason::NoDeviceRecipe => write!(f, "the stage has no device recipe"),
            HostReason::Refused(r) => write!(f, "the device refused it: {r}"),
            HostReason::SelectsBeforeEnd => {
                write!(f, "it selects a token but active stages follow it")
            }
            HostReason::CpuDevice => write!(
                f,
                "the logits are on a CPU device: sampler-cpu's kernels over the rows are faster than burn ops there (offload \"device\" offloads anyway)"
            ),
            HostReason::RawLogprobs => write!(
                f,
                "raw logprobs need the input row, and the device prefix would read back full rows: one raw row and the whole chain on the host is cheaper"
            ),
        }
    }
}

/// How much of a chain may run on the device. Spelled as in the config's
/// `device.offload` and `--offload`: `auto`, `off`, `device`, or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffloadPolicy {
    /// What is fastest where it can be known: the longest device-capable
    /// prefix on a GPU; nothing offloaded when the logits are on a CPU
    /// device (`flex`, `ndarray`), where sampler-cpu's kernels over the rows
    /// beat burn's generic ops ([`HostReason::CpuDevice`]).
    #[default]
    Auto,
    /// Everything on the host.
    Off,
    /// The longest device-capable prefix, on any device (a CPU device too).
    Device,
    /// At most this many active (non-no-op) stages on the device, on any device.
    Stages(usize),
}

impl fmt::Display for OffloadPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffloadPolicy::Auto => write!(f, "auto"),
            OffloadPolicy::Off => write!(f, "off"),
            OffloadPolicy::Device => write!(f, "device"),
            OffloadPolicy::Stages(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for OffloadPolicy {
    type Err = String;
    /// `auto`, `off`, `device` or a stage count (case-insensitive, spaces
    /// around ignored).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(OffloadPolicy::Auto),
            "off" => Ok(OffloadPolicy::Off),
            "device" => Ok(OffloadPolicy::Device),
            n => n.parse().map(OffloadPolicy::Stages).map_err(|_| {
                format!("`{s}`: expected auto, off, device or a number of stages (0, 1, 2, ...)")
            }),
        }
    }
}

/// What crosses from the device to the host after the device prefix, per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Readback {
    /// The whole chain ran on the device: one `u32` token id (4 bytes).
    TokenIds,
    /// A device `top_k` truncated the row: the `k` survivors' ids and logits (8·k bytes).
    Candidates {
        /// Survivors per row.
        k: usize,
    },
    /// Nothing truncated: the full row of (possibly masked) logits (4·vocab bytes).
    FullLogits {
        /// Vocabulary size.
        vocab: usize,
    },
}

impl Readback {
    /// The format as one snake_case word, for scripts: `token_ids`,
    /// `candidates`, `full_logits`.
    pub fn word(&self) -> &'static str {
        match self {
            Readback::TokenIds => "token_ids",
            Readback::Candidates { .. } => "candidates",
            Readback::FullLogits { .. } => "full_logits",
        }
    }
    /// Values per row: 1 token id, `k` candidates, or `vocab` logits.
    pub fn per_row(&self) -> usize {
        match *self {
            Readback::TokenIds => 1,
            Readback::Candidates { k } => k,
            Readback::FullLogits { vocab } => vocab,
        }
    }
    /// Bytes read back per row per step.
    pub fn bytes_per_row(&self) -> usize {
        match *self {
            Readback::TokenIds => 4,
            Readback::Candidates { k } => 8 * k,
            Readback::FullLogits { vocab } => 4 * vocab,
        }
    }
}

impl fmt::Display for Readback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Readback::TokenIds => write!(f, "token ids"),
            Readback::Candidates { k } => write!(f, "candidates (ids + logits of {k} survivors)"),
            Readback::FullLogits { vocab } => write!(f, "full logits ({vocab} per row)"),
        }
    }
}

/// Where each stage of a chain runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Stage names in chain order (index = stage index).
    pub names: Vec<String>,
    /// Indices of active stages run on the device, in order.
    pub device: Vec<usize>,
    /// Indices of active stages run on the host, in order.
    pub host: Vec<usize>,
    /// Indices of no-op stages and of stages after the last selecting stage
    /// (dropped everywhere).
    pub skipped: Vec<usize>,
    /// The first stage index the host runs (`Chain::apply_from`).
    pub host_start: usize,
    /// What is read back per row.
    pub readback: Readback,
    /// Why the first host stage is not on the device (`None` when the
    /// whole chain is offloaded or empty).
    pub host_reason: Option<HostReason>,
}

impl Plan {
    /// Bytes read back per row per step.
    pub fn bytes_per_row(&self) -> usize {
        self.readback.bytes_per_row()
    }
    /// Whether the device selects the token (nothing left for the host).
    pub fn fully_offloaded(&self) -> bool {
        self.readback == Readback::TokenIds
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |ix: &[usize]| {
            if ix.is_empty() {
                "(none)".to_string()
            } else {
                ix.iter()
                    .map(|&i| self.names[i].as_str())
                    .collect::<Vec<_>>()
                    .join(" -> ")
            }
        };
        writeln!(f, "device stages: {}", list(&self.device))?;
        writeln!(f, "host stages:   {}", list(&self.host))?;
        if !self.skipped.is_empty() {
            writeln!(f, "no-op stages:  {}", list(&self.skipped))?;
        }
        if let (Some(reason), Some(name)) = (&self.host_reason, self.names.get(self.host_start)) {
            writeln!(f, "host from:     {name} ({reason})")?;
        }
        write!(
            f,
            "readback:      {} = {} bytes/row/step",
            self.readback,
            self.bytes_per_row()
        )
    }
}

/// The planner's view of one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanStage {
    /// Display name.
    pub name: String,
    /// Built-in spec, or `None` for a custom (host-only) stage.
    pub spec: Option<StageSpec>,
    /// The device's `init` answer for this stage: `Ok` when the device runs
    /// it, else why not ([`DeviceRefusal`]; ignored when no hook exists).
    pub device: Result<(), DeviceRefusal>,
}

/// Plan a chain over a vocabulary of `vocab` tokens.
///
/// The device prefix is the longest run of active stages from the start whose
/// device hook exists and whose `init` succeeded (`device`); no-op stages
/// are skipped and never break it. A selecting stage joins the prefix only if
/// no active stage follows it. [`OffloadPolicy::Stages`] caps the prefix.
pub fn plan(stages: &[PlanStage], vocab: usize, policy: OffloadPolicy) -> Plan {
    let cap = match policy {
        OffloadPolicy::Auto | OffloadPolicy::Device => usize::MAX,
        OffloadPolicy::Off => 0,
        OffloadPolicy::Stages(n) => n,
    };
    // Stages after the last active selecting stage never run (the token is
    // already chosen): they are skipped like no-ops.
    let end = stages
        .iter()
        .rposition(|s| s.spec.as_ref().is_some_and(|s| !s.is_noop() && s.selects()))
        .map_or(stages.len(), |i| i + 1);
    let active: Vec<usize> = (0..end)
        .filter(|&i| !stages[i].spec.as_ref().is_some_and(|s| s.is_noop()))
        .collect();
    let skipped: Vec<usize> = (0..stages.len()).filter(|i| !active.contains(i)).collect();

    let mut device = Vec::new();
    let mut host_reason = None;
    for (pos, &i) in active.iter().enumerate() {
        let st = &stages[i];
        let why = match &st.spec {
            None => Some(HostReason::CustomStage),
            Some(_) if device.len() >= cap => Some(HostReason::Policy),
            Some(spec) if !spec.kind().meta().device_hook => Some(HostReason::NoDeviceRecipe),
            Some(_) if st.device.is_err() => st.device.clone().err().map(HostReason::Refused),
            Some(spec) if spec.selects() && pos + 1 != active.len() => {
                Some(HostReason::SelectsBeforeEnd)
            }
            Some(_) => None,
        };
        if why.is_some() {
            host_reason = why;
            break;
        }
        device.push(i);
    }
    let host: Vec<usize> = active[device.len()..].to_vec();
    let host_start = host.first().copied().unwrap_or(stages.len());

    let selects_on_device = device
        .last()
        .is_some_and(|&i| stages[i].spec.as_ref().is_some_and(|s| s.selects()));
    let min_k = device
        .iter()
        .filter_map(|&i| stages[i].spec.as_ref()?.survivors())
        .map(|k| k.min(vocab))
        .min();
    let readback = if selects_on_device {
        Readback::TokenIds
    } else if let Some(k) = min_k {
        Readback::Candidates { k }
    } else {
        Readback::FullLogits { vocab }
    };
    Plan {
        names: stages.iter().map(|s| s.name.clone()).collect(),
        device,
        host,
        skipped,
        host_start,
        readback,
        host_reason,
    }
}

/// Plan stages given as specs, with a device that accepts every stage that
/// has a device hook.
pub fn plan_specs(specs: &[StageSpec], vocab: usize, policy: OffloadPolicy) -> Plan {
    let stages: Vec<PlanStage> = specs
        .iter()
        .map(|s| PlanStage {
            name: s.name().to_string(),
            spec: Some(s.clone()),
            device: Ok(()),
        })
        .collect();
    plan(&stages, vocab, policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StageSpec as S;

    fn temp(t: f32) -> S {
        S::Temperature {
            t,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        }
    }

    #[test]
    fn whole_chain_offloaded_reads_ids() {
        let p = plan_specs(
            &[
                S::TopK { k: 40 },
                temp(0.8),
                S::TopP {
                    p: 0.9,
                    min_keep: 0,
                },
                S::Dist,
            ],
            32000,
            OffloadPolicy::Auto,
        );
        assert_eq!(p.device, vec![0, 1, 2, 3]);
        assert!(p.host.is_empty());
        assert_eq!(p.bytes_per_row(), 4);
    }

    #[test]
    fn noop_stage_does_not_break_prefix() {
        let p = plan_specs(
            &[
                S::Typical {
                    p: 1.0,
                    min_keep: 0,
                },
                S::TopK { k: 40 },
                S::Dist,
            ],
            100,
            OffloadPolicy::Auto,
        );
        assert_eq!(p.device, vec![1, 2]);
        assert_eq!(p.skipped, vec![0]);
    }

    #[test]
    fn host_only_stage_ends_prefix_and_top_k_reads_candidates() {
        let p = plan_specs(
            &[S::TopK { k: 40 }, S::TopNSigma { n: 1.0 }, S::Dist],
            32000,
            OffloadPolicy::Auto,
        );
        assert_eq!(p.device, vec![0]);
        assert_eq!(p.host, vec![1, 2]);
        assert_eq!(p.host_start, 1);
        assert_eq!(p.readback, Readback::Candidates { k: 40 });
        assert_eq!(p.bytes_per_row(), 320);
    }

    #[test]
    fn no_truncation_reads_full_rows_and_policy_caps() {
        let p = plan_specs(
            &[
                temp(0.7),
                S::Xtc {
                    probability: 0.5,
                    threshold: 0.1,
                    min_keep: 0,
                },
                S::Dist,
            ],
            1000,
            OffloadPolicy::Auto,
        );
        assert_eq!(p.readback, Readback::FullLogits { vocab: 1000 });
        let off = plan_specs(&[S::TopK { k: 5 }, S::Dist], 1000, OffloadPolicy::Off);
        assert!(off.device.is_empty());
        let one = plan_specs(&[S::TopK { k: 5 }, S::Dist], 1000, OffloadPolicy::Stages(1));
        assert_eq!(one.device, vec![0]);
        assert!(format!("{one}").contains("device stages: top_k"));
    }

    #[test]
    fn k_is_clamped_to_vocab() {
        let p = plan_specs(&[S::TopK { k: 10 }], 4, OffloadPolicy::Auto);
        assert_eq!(p.readback, Readback::Candidates { k: 4 });
    }
}
