//! `inspect`: what a sampler chain does at each step of a generation, as
//! pictures and JSON.
//!
//! ```text
//! cargo run --release -p sampler-examples --bin inspect -- \
//!     --prompt "Once upon a time" -n 6 --seed 7 \
//!     --samplers "top_k;top_p;min_p;temperature;dist" --top-k 20 --top-p 0.9 \
//!     --out inspect-out
//! ```
//!
//! Every flag of `generate` that picks the model, the prompt and the chain
//! works here (`--model`, `--chat`, `--config`, `--samplers`, `--top-k`,
//! `--param`, `--seed`, ...). Each step runs the chain's reference stages
//! one by one on the host (`Chain::inspect`: exact, and as slow as a
//! debugging tool may be) and writes into `--out`:
//!
//! * `step-NNN.svg` and `step-NNN.png`: one panel per stage, the top tokens
//!   (their text) before the stage as grey bars, and the drawn token
//!   wherever it ranks, their probability after it
//!   (renormalised over the survivors) in blue, the tokens the stage removed
//!   marked `x` with a line where the cut falls, the drawn token in red;
//! * `summary.svg` and `summary.png`: over the steps, the survivors after
//!   each stage, the entropy of the input and of the final set, and the
//!   drawn token's probability;
//! * `inspect.json`: the same data (every stage's top tokens with ids,
//!   text, logits, probabilities before and after, survivors, masses, the
//!   uniform that drew the token).
//!
//! See `docs/inspect.md`.

#[allow(dead_code)]
#[path = "generate.rs"]
mod generate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use generate::AppError;
use sampler_core::TokenId;
use sampler_examples::inspect::{self as draw, InspectError};
use sampler_examples::llama2::generate::TextCodec;
use serde_json::json;

/// Draw what a sampler chain does at each step of a generation: per-stage
/// candidate sets as pictures (SVG and PNG) and JSON.
#[derive(Debug, Parser)]
#[command(name = "inspect", version, about, long_about = None)]
struct InspectArgs {
    #[command(flatten)]
    run: generate::Args,
    /// Directory the pictures and `inspect.json` are written to (created).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Tokens shown per stage (1..=40).
    #[arg(long, value_name = "N", default_value_t = 12,
          value_parser = clap::value_parser!(u64).range(1..=40))]
    top: u64,
}

/// The most steps one run draws (`-n` above it is refused).
const MAX_STEPS: usize = 256;

fn main() -> ExitCode {
    let args = InspectArgs::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn inspect_err(e: InspectError) -> AppError {
    match e {
        InspectError::Model(m) => AppError::Model(m),
        InspectError::Sample { step, source } => {
            AppError::Generate(sampler_examples::llama2::generate::GenerateError::Sample {
                step,
                source,
            })
        }
        other => AppError::Usage(other.to_string()),
    }
}

fn run(a: &InspectArgs) -> Result<(), AppError> {
    if a.run.n == 0 || a.run.n > MAX_STEPS {
        return Err(AppError::Usage(format!(
            "-n {}: inspect draws 1..={MAX_STEPS} steps",
            a.run.n
        )));
    }
    if a.run.num_beams.is_some() || a.run.speculative.is_some() {
        return Err(AppError::Usage(
            "inspect shows a sampling chain step by step: --num-beams and --speculative do not apply"
                .into(),
        ));
    }
    let (mut cfg, warnings) = generate::build_chain(&a.run)?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let (device, _) = generate::device_of(&cfg.device)?;
    let path = generate::model_path(&a.run)?;
    let loaded = generate::load_model(&a.run, &path, &device)?;
    let codec: &dyn TextCodec = loaded.codec.as_ref();
    cfg.chain.fill_stop_ids(&codec.stop_ids());
    let mut spec = cfg.chain.clone();
    let seed = *spec
        .seed
        .get_or_insert_with(|| rand_seed(&loaded.prompt_tokens));
    let mut chain = sampler_cpu::build_chain(&spec)
        .map_err(|e| AppError::Usage(format!("the chain cannot be built: {e}")))?;
    std::fs::create_dir_all(&a.out)?;
    draw::register_font().map_err(inspect_err)?;

    let prompt = &loaded.prompt_tokens;
    let steps = draw::generate(
        &loaded.model,
        codec,
        prompt,
        &mut chain,
        a.run.n,
        &[],
        &|| false,
    )
    .map_err(inspect_err)?;
    let top = a.top as usize;
    let mut json_steps = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        draw::write_step(step, codec, top, &a.out.join(format!("step-{i:03}")))
            .map_err(inspect_err)?;
        json_steps.push(draw::step_json(step, codec, top));
        println!("{}", draw::step_title(step, codec));
    }
    draw::write_summary(&steps, &a.out.join("summary")).map_err(inspect_err)?;
    let doc = json!({
        "model": path.display().to_string(),
        "chain": cfg.chain.chain_string(),
        "seed": seed,
        "prompt_tokens": prompt,
        "top": top,
        "steps": json_steps,
    });
    std::fs::write(
        a.out.join("inspect.json"),
        serde_json::to_string_pretty(&doc).map_err(|e| AppError::Usage(e.to_string()))?,
    )?;
    eprintln!(
        "wrote {} steps to {} (step-NNN.svg/.png, summary.svg/.png, inspect.json)",
        steps.len(),
        a.out.display()
    );
    Ok(())
}

/// A seed for a run that gave none: from the clock, printed in the JSON so
/// that the run can be replayed.
fn rand_seed(prompt: &[TokenId]) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (prompt.len() as u64).rotate_left(32)
}
