//! `sample --config chain.toml --device D --logits rows.npy [--json]`: sample
//! one token per row of a `[batch, vocab]` logits file (.npy or
//! .safetensors) with the chain's device prefix on `D` and the rest on the
//! CPU; print the tokens, or JSON with the plan and the bytes read back.
//! Each row is one request of a serving batch with the chain (a chain without
//! a seed draws one per row; `--json` reports them). Exit status: 0 when
//! every row was sampled, 2 when some row failed (its error is printed and
//! the other rows are sampled), 1 when nothing could run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sampler_backend::{SamplingBatch, Tensor, TensorData};

use sampler_examples::{report, sample_cli};

/// Sample tokens from a file of logits.
#[derive(Parser, Debug)]
#[command(name = "sample", version)]
struct Args {
    /// Chain declaration (TOML; docs/config.md).
    #[arg(long)]
    config: PathBuf,
    /// Device: flex, ndarray, wgpu, vulkan, cuda, cuda:N, or cpu (host only).
    #[arg(long)]
    device: Option<String>,
    /// Offload policy: auto, off, device, or a number of stages.
    #[arg(long)]
    offload: Option<String>,
    /// Logits `[batch, vocab]` (or `[vocab]`): .npy (f32/f16/f64) or .safetensors.
    #[arg(long)]
    logits: PathBuf,
    /// Tensor name inside a .safetensors file (default: the first 1-D/2-D tensor).
    #[arg(long)]
    tensor: Option<String>,
    /// Steps: sample the same rows this many times (the step counter advances), at least 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// Print JSON (plan, tokens, bytes read back per step).
    #[arg(long)]
    json: bool,
}

/// Whether every row of every step was sampled.
fn run(a: Args) -> Result<bool, String> {
    let cfg = sample_cli::load_config(&a.config)?;
    let (name, device, policy) =
        sample_cli::device_and_policy(&cfg, a.device.as_deref(), a.offload.as_deref())?;
    let logits = sample_cli::read_logits(&a.logits, a.tensor.as_deref())?;
    let mut batch = SamplingBatch::new(logits.vocab, &device, policy).map_err(|e| e.to_string())?;
    let mut ids = Vec::with_capacity(logits.batch);
    for _ in 0..logits.batch {
        ids.push(
            batch
                .insert(cfg.chain.clone(), &[])
                .map_err(|e| e.to_string())?,
        );
    }
    let mut steps = Vec::new();
    for _ in 0..a.steps {
        let t = Tensor::<2>::from_data(
            TensorData::new(logits.data.clone(), [logits.batch, logits.vocab]),
            &device,
        );
        let start = std::time::Instant::now();
        let out = batch.step(&ids, t).map_err(|e| e.to_string())?;
        steps.push((out, start.elapsed()));
    }
    let all_ok = steps
        .iter()
        .all(|(out, _)| out.tokens.iter().all(|t| t.is_ok()));
    if a.json {
        let plan = batch.plan(ids[0]).expect("inserted above");
        let seeds: Vec<Option<u64>> = ids
            .iter()
            .map(|&id| batch.spec(id).and_then(|s| s.seed))
            .collect();
        let steps_json: Vec<_> = steps
            .iter()
            .map(|(out, dt)| {
                let tokens: Vec<Option<u32>> = out
                    .tokens
                    .iter()
                    .map(|t| t.as_ref().ok().copied())
                    .collect();
                let errors: Vec<_> = out
                    .tokens
                    .iter()
                    .enumerate()
                    .filter_map(|(r, t)| t.as_ref().err().map(|e| (r, e)))
                    .map(|(r, e)| report::row_error_json(r, e))
                    .collect();
                serde_json::json!({
                    "tokens": tokens,
                    "errors": errors,
                    "bytes_read": out.bytes_read,
                    "micros": dt.as_micros() as u64,
                })
            })
            .collect();
        let v = serde_json::json!({
            "chain": cfg.chain.chain_string(),
            "batch": logits.batch,
            "vocab": logits.vocab,
            "seeds": seeds,
            "plan": report::plan_json(plan, &name, policy),
            "steps": steps_json,
        });
        println!("{v:#}");
    } else {
        for (s, (out, _)) in steps.iter().enumerate() {
            for (r, t) in out.tokens.iter().enumerate() {
                match t {
                    Ok(t) => println!("step {s} row {r}: {t}"),
                    Err(e) => println!("step {s} row {r}: error ({}): {e}", e.kind()),
                }
            }
            eprintln!("step {s}: {} bytes read back", out.bytes_read);
        }
    }
    if !all_ok {
        eprintln!("error: some rows could not be sampled (see their errors); exit status 2");
    }
    Ok(all_ok)
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
