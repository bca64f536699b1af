//! The JSON the example commands print, in one place, so `plan --json`,
//! `generate --json` and `sample --json` name the same things the same way
//! and spell enum values as the config does (`offload = "auto"`).

use sampler_core::logprobs::Logprobs;
use sampler_core::plan::{OffloadPolicy, Plan};
use sampler_core::{SampleError, TokenId};
use serde_json::{Value, json};

use crate::llama2::generate::TextCodec;

/// A plan: `device`, `offload`, `device_stages`, `host_stages`,
/// `skipped_stages` (no-ops and stages after the last selecting one),
/// `readback` (`token_ids` | `candidates` | `full_logits`),
/// `readback_per_row` (values: 1, `k` or `vocab`), `bytes_per_row`,
/// `fully_offloaded`, `host_reason` (`null`, or `{kind, message}` with kind
/// one of `policy`, `custom_stage`, `no_device_recipe`, `refused`,
/// `selects_before_end`, `cpu_device`).
pub fn plan_json(plan: &Plan, device: &str, policy: OffloadPolicy) -> Value {
    let names =
        |ix: &[usize]| -> Vec<&str> { ix.iter().map(|&i| plan.names[i].as_str()).collect() };
    json!({
        "device": device,
        "offload": policy.to_string(),
        "device_stages": names(&plan.device),
        "host_stages": names(&plan.host),
        "skipped_stages": names(&plan.skipped),
        "readback": plan.readback.word(),
        "readback_per_row": plan.readback.per_row(),
        "bytes_per_row": plan.bytes_per_row(),
        "fully_offloaded": plan.fully_offloaded(),
        "host_reason": plan.host_reason.as_ref().map(|r| json!({
            "kind": r.word(),
            "message": r.to_string(),
        })),
    })
}

/// A row's error: `{"row": r, "kind": k, "message": m}` (kind from
/// [`SampleError::kind`], e.g. `nan_logit`).
pub fn row_error_json(row: usize, e: &SampleError) -> Value {
    json!({ "row": row, "kind": e.kind(), "message": e.to_string() })
}

/// Per-step logprobs as JSON: `null` for a step without them, else
/// `{token, logprob, top: [{token, text, logprob}], requested: [...]}`
/// (`-inf` is written as `null`).
pub fn logprobs_json(codec: &dyn TextCodec, steps: &[Option<Logprobs>]) -> Value {
    let num = |l: f32| if l.is_finite() { json!(l) } else { Value::Null };
    let entry = |t: TokenId, l: f32| {
        let text = codec.token_text(t);
        json!({"token": t, "text": text, "logprob": num(l)})
    };
    Value::Array(
        steps
            .iter()
            .map(|lp| match lp {
                None => Value::Null,
                Some(lp) => json!({
                    "token": lp.token.0,
                    "logprob": num(lp.token.1),
                    "top": lp.top.iter().map(|&(t, l)| entry(t, l)).collect::<Vec<_>>(),
                    "requested": lp.requested.iter().map(|&(t, l)| entry(t, l)).collect::<Vec<_>>(),
                }),
            })
            .collect(),
    )
}
