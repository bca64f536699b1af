//! `plan --config chain.toml --device D [--offload auto|off|N] [--vocab V] [--batch B]`:
//! print where each stage of the chain runs and what is read back per step.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sampler_backend::Executor;

#[path = "../sample_cli/mod.rs"]
mod sample_cli;

/// Print the device/host plan of a sampler chain.
#[derive(Parser, Debug)]
#[command(name = "plan", version)]
struct Args {
    /// Chain declaration (TOML; docs/config.md).
    #[arg(long)]
    config: PathBuf,
    /// Device: flex, ndarray, wgpu, vulkan, cuda, cuda:N, or cpu (host only).
    /// Default: the config's `[device] kind`.
    #[arg(long)]
    device: Option<String>,
    /// Offload policy: auto, off, or a number of stages. Default: the config's.
    #[arg(long)]
    offload: Option<String>,
    /// Vocabulary size the plan is made for.
    #[arg(long, default_value_t = 32000)]
    vocab: usize,
    /// Rows per step.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn run(a: Args) -> Result<(), String> {
    let cfg = sample_cli::load_config(&a.config)?;
    let (name, device, policy) =
        sample_cli::device_and_policy(&cfg, a.device.as_deref(), a.offload.as_deref())?;
    let rows = vec![cfg.chain.clone(); a.batch.max(1)];
    let ex = Executor::new(rows, a.vocab, &device, policy).map_err(|e| e.to_string())?;
    let plan = ex.plan();
    if a.json {
        let names =
            |ix: &[usize]| -> Vec<String> { ix.iter().map(|&i| plan.names[i].clone()).collect() };
        let v = serde_json::json!({
            "device": name,
            "offload": format!("{policy:?}"),
            "chain": cfg.chain.chain_string(),
            "device_stages": names(&plan.device),
            "host_stages": names(&plan.host),
            "noop_stages": names(&plan.skipped),
            "readback": plan.readback.to_string(),
            "bytes_per_row": plan.bytes_per_row(),
            "host_reason": plan.host_reason.as_ref().map(|r| r.to_string()),
            "vocab": a.vocab,
        });
        println!("{v:#}");
    } else {
        println!("chain:         {}", cfg.chain.chain_string());
        println!(
            "device:        {name} (offload {policy:?}, vocab {})",
            a.vocab
        );
        println!("{plan}");
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
