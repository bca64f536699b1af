//! `plan --config chain.toml --device D [--offload auto|off|N] [--vocab V] [--batch B]`:
//! print where each stage of the chain runs and what is read back per step.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sampler_backend::Executor;

use sampler_examples::sample_cli;

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
    /// Vocabulary size the plan is made for, 1 to 4294967296 (token ids are u32).
    #[arg(long, default_value_t = 32000, value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    vocab: u64,
    /// Rows per step, 1 to 65536.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=65536))]
    batch: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn run(a: Args) -> Result<(), String> {
    let cfg = sample_cli::load_config(&a.config)?;
    let (name, device, policy) =
        sample_cli::device_and_policy(&cfg, a.device.as_deref(), a.offload.as_deref())?;
    // Both ranges are checked by clap; they fit usize on 64-bit targets.
    let vocab =
        usize::try_from(a.vocab).map_err(|_| format!("--vocab {} is too large here", a.vocab))?;
    let batch =
        usize::try_from(a.batch).map_err(|_| format!("--batch {} is too large here", a.batch))?;
    let rows = vec![cfg.chain.clone(); batch];
    let ex = Executor::new(rows, vocab, &device, policy).map_err(|e| e.to_string())?;
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
