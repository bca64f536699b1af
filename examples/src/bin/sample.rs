//! `sample --config chain.toml --device D --logits rows.npy [--json]`: sample
//! one token per row of a `[batch, vocab]` logits file (.npy or
//! .safetensors) with the chain's device prefix on `D` and the rest on the
//! CPU; print the tokens, or JSON with the plan and the bytes read back.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sampler_backend::{Executor, Tensor, TensorData};

use sampler_examples::sample_cli;

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
    /// Offload policy: auto, off, or a number of stages.
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

fn run(a: Args) -> Result<(), String> {
    let cfg = sample_cli::load_config(&a.config)?;
    let (name, device, policy) =
        sample_cli::device_and_policy(&cfg, a.device.as_deref(), a.offload.as_deref())?;
    let logits = sample_cli::read_logits(&a.logits, a.tensor.as_deref())?;
    let rows = vec![cfg.chain.clone(); logits.batch];
    let mut ex = Executor::new(rows, logits.vocab, &device, policy).map_err(|e| e.to_string())?;
    let mut steps = Vec::new();
    for _ in 0..a.steps {
        let t = Tensor::<2>::from_data(
            TensorData::new(logits.data.clone(), [logits.batch, logits.vocab]),
            &device,
        );
        let start = std::time::Instant::now();
        let out = ex.step(t).map_err(|e| e.to_string())?;
        steps.push((out, start.elapsed()));
    }
    if a.json {
        let plan = ex.plan();
        let names =
            |ix: &[usize]| -> Vec<String> { ix.iter().map(|&i| plan.names[i].clone()).collect() };
        let steps_json: Vec<_> = steps
            .iter()
            .map(|(out, dt)| {
                let toks: Vec<serde_json::Value> = out
                    .tokens
                    .iter()
                    .map(|t| match t {
                        Ok(t) => serde_json::json!(t),
                        Err(e) => serde_json::json!({ "error": e.to_string() }),
                    })
                    .collect();
                serde_json::json!({
                    "tokens": toks,
                    "bytes_read": out.bytes_read,
                    "micros": dt.as_micros() as u64,
                })
            })
            .collect();
        let v = serde_json::json!({
            "device": name,
            "batch": logits.batch,
            "vocab": logits.vocab,
            "plan": {
                "device_stages": names(&plan.device),
                "host_stages": names(&plan.host),
                "noop_stages": names(&plan.skipped),
                "readback": plan.readback.to_string(),
                "bytes_per_row": plan.bytes_per_row(),
            },
            "steps": steps_json,
        });
        println!("{v:#}");
    } else {
        for (s, (out, _)) in steps.iter().enumerate() {
            for (r, t) in out.tokens.iter().enumerate() {
                match t {
                    Ok(t) => println!("step {s} row {r}: {t}"),
                    Err(e) => println!("step {s} row {r}: error: {e}"),
                }
            }
            eprintln!("step {s}: {} bytes read back", out.bytes_read);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
