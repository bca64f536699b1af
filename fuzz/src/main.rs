//! `cargo run -p sampler-fuzz --release -- --inputs 10000000`: the seeded
//! fuzz suite over every surface (see the crate docs). Exits non-zero on any
//! panic, divergence or call over one second, after printing a reproducer
//! for each (replay one with `--surface S --seed N --start INDEX --inputs 1`).

use std::process::ExitCode;

use clap::Parser;
use sampler_fuzz::{Surface, run};

#[derive(Debug, Parser)]
#[command(name = "fuzz", version, about)]
struct Args {
    /// Total inputs, split over the surfaces as 80% config, 15% cpu, 1%
    /// executor and 4% files (the executor's steps are the slowest).
    #[arg(long, default_value_t = 100_000)]
    inputs: u64,
    /// Only this surface (config, cpu, executor, files), with all the inputs.
    #[arg(long)]
    surface: Option<String>,
    /// The run's seed: the same seed and index give the same input.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The first input index (to replay one input of a report).
    #[arg(long, default_value_t = 0)]
    start: u64,
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
                eprintln!("error: --surface {name}: expected config, cpu, executor or files");
                return ExitCode::from(2);
            }
        },
        None => vec![
            // The config surface takes what the rounding of the others leaves.
            (
                Surface::Config,
                a.inputs - a.inputs * 15 / 100 - a.inputs / 100 - a.inputs * 4 / 100,
            ),
            (Surface::Cpu, a.inputs * 15 / 100),
            (Surface::Executor, a.inputs / 100),
            (Surface::Files, a.inputs * 4 / 100),
        ],
    };
    let mut clean = true;
    for (surface, n) in plan {
        let report = run(surface, n, a.seed, a.start);
        println!("{:>8}: {report}", surface.name());
        clean &= report.clean();
    }
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
