//! The bounded fuzz run of every submission: at least 100,000 config inputs,
//! 10,000 CPU sampling calls, 1,000 executor steps on flex, 2,000 file
//! reads and 2,000 serving-batch sessions on flex (and 60 on wgpu where a
//! Vulkan adapter starts: lavapipe in CI); any panic, divergence or call
//! over its time bound fails, with the reproducers printed. One test, so the surfaces run one after another
//! (the suite swaps the panic hook while it runs).

use sampler_fuzz::{Surface, run, run_on};

#[test]
fn bounded_fuzz_run_finds_nothing() {
    let budget = [
        (Surface::Config, 100_000),
        (Surface::Cpu, 10_000),
        (Surface::Executor, 1_000),
        (Surface::Files, 2_000),
        (Surface::Batch, 2_000),
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

/// The batch surface on a GPU device (lavapipe in CI): few sessions, small
/// vocabularies; a step may take 20 s (each new kernel shape compiles on
/// its first run, seconds on a software driver).
#[test]
fn batch_sessions_on_a_gpu_device_find_nothing() {
    if !sampler_backend::compiled_devices().contains(&"wgpu") {
        println!("SKIP: wgpu is not compiled in");
        return;
    }
    let d = match sampler_backend::probe_device("wgpu") {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP wgpu: {e}");
            return;
        }
    };
    let report = run_on(
        Surface::Batch,
        60,
        20261204,
        0,
        &d,
        std::time::Duration::from_secs(20),
    );
    println!("batch on wgpu: {report}");
    assert_eq!(report.inputs, 60);
    assert!(report.clean(), "fuzz failures on wgpu:\n{report}");
}
