//! The bounded fuzz run of every submission: at least 100,000 config inputs,
//! 10,000 CPU sampling calls, 1,000 executor steps on flex and 2,000 file
//! reads; any panic, divergence or call over one second fails, with the
//! reproducers printed. One test, so the surfaces run one after another
//! (the suite swaps the panic hook while it runs).

use sampler_fuzz::{Surface, run};

#[test]
fn bounded_fuzz_run_finds_nothing() {
    let budget = [
        (Surface::Config, 100_000),
        (Surface::Cpu, 10_000),
        (Surface::Executor, 1_000),
        (Surface::Files, 2_000),
    ];
    let mut failed = Vec::new();
    for (surface, n) in budget {
        let report = run(surface, n, 20261201, 0);
        println!("{:>8}: {report}", surface.name());
        assert_eq!(report.inputs, n, "{}: every input ran", surface.name());
        if !report.clean() {
            failed.push(format!("{}: {report}", surface.name()));
        }
    }
    assert!(failed.is_empty(), "fuzz failures:\n{}", failed.join("\n"));
}
