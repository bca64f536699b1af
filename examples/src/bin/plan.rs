//! `plan --config chain.toml --device D [--offload auto|off|N] [--vocab V] [--batch B]`:
//! print where each stage of the chain runs and what is read back per step.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sampler_backend::SamplingBatch;

use sampler_examples::{report, sample_cli};

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
    /// Offload policy: auto, off, device, or a number of stages. Default: the config's.
    #[arg(long)]
    offload: Option<String>,
    /// Vocabulary size the plan is made for, 1 to 4294967296 (token ids are u32).
    #[arg(long, default_value_t = 32000, value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    vocab: u64,
    /// Requests of this chain in one step, 1 to 65536: each is planned
    /// alone (the plan is the same at any batch size); all of them are
    /// inserted, so per-request limits are checked.
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
    let mut sampling = SamplingBatch::new(vocab, &device, policy).map_err(|e| e.to_string())?;
    let mut ids = Vec::with_capacity(batch);
    for _ in 0..batch {
        ids.push(
            sampling
                .insert(cfg.chain.clone(), &[])
                .map_err(|e| e.to_string())?,
        );
    }
    let plan = sampling.plan(ids[0]).expect("inserted above");
    if a.json {
        let v = serde_json::json!({
            "chain": cfg.chain.chain_string(),
            "vocab": a.vocab,
            "batch": a.batch,
            "plan": report::plan_json(plan, &name, policy),
        });
        println!("{v:#}");
    } else {
        println!("chain:         {}", cfg.chain.chain_string());
        println!(
            "device:        {name} (offload {policy}, vocab {})",
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
