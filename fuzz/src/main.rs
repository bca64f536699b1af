//! `cargo run -p sampler-fuzz --release -- --inputs 10000000`: the seeded
//! fuzz suite over every surface (see the crate docs). Exits non-zero on any
//! panic, divergence or call over one second, after printing a reproducer
//! for each (replay one with `--surface S --seed N --start INDEX --inputs 1`).

use std::process::ExitCode;

use clap::Parser;
use sampler_fuzz::{Surface, run_on};

#[derive(Debug, Parser)]
#[command(name = "fuzz", version, about)]
struct Args {
    /// Total inputs, split over the surfaces as 79% config, 15% cpu, 1%
    /// executor, 4% files and 1% batch sessions (the executor's and the
    /// batch's steps are the slowest).
    #[arg(long, default_value_t = 100_000)]
    inputs: u64,
    /// Only this surface (config, cpu, executor, files, batch), with all the
    /// inputs.
    #[arg(long)]
    surface: Option<String>,
    /// The run's seed: the same seed and index give the same input.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The first input index (to replay one input of a report).
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// The device of the executor and batch surfaces (`flex`, or a compiled-in
    /// GPU device such as `wgpu`).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Seconds a batch step may take (a GPU compiles each new kernel shape
    /// on its first run).
    #[arg(long, default_value_t = 1.0)]
    step_limit: f64,
}

fn main() -> ExitCode {
    let a = Args::parse();
    if a.start.checked_add(a.inputs).is_none() {
        eprintln!(
            "error: --start {} + --inputs {} overflows the input index (u64)",
            a.start, a.inputs
        );
        return ExitCode::from(2);
    }
    let plan: Vec<(Surface, u64)> = match a.surface.as_deref() {
        Some(name) => match Surface::ALL.into_iter().find(|s| s.name() == name) {
            Some(s) => vec![(s, a.inputs)],
            None => {
                eprintln!(
                    "error: --surface {name}: expected config, cpu, executor, files or batch"
                );
                return ExitCode::from(2);
            }
        },
        None => vec![
            // The config surface takes what the rounding of the others leaves.
            (
                Surface::Config,
                a.inputs - a.inputs * 15 / 100 - 2 * (a.inputs / 100) - a.inputs * 4 / 100,
            ),
            (Surface::Cpu, a.inputs * 15 / 100),
            (Surface::Executor, a.inputs / 100),
            (Surface::Files, a.inputs * 4 / 100),
            (Surface::Batch, a.inputs / 100),
        ],
    };
    let device = match sampler_backend::probe_device(&a.device) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: --device {}: {e}", a.device);
            return ExitCode::from(2);
        }
    };
    if !(a.step_limit > 0.0 && a.step_limit.is_finite()) {
        eprintln!("error: --step-limit {}: expected seconds > 0", a.step_limit);
        return ExitCode::from(2);
    }
    let limit = std::time::Duration::from_secs_f64(a.step_limit);
    let mut clean = true;
    for (surface, n) in plan {
        let report = run_on(surface, n, a.seed, a.start, &device, limit);
        println!("{:>8}: {report}", surface.name());
        clean &= report.clean();
    }
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
