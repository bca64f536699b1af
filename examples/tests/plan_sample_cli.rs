//! The `plan` and `sample` commands as a user runs them: outputs, per-row
//! errors, and clear messages for bad input (never a panic).

use std::path::PathBuf;
use std::process::{Command, Output};

fn run(bin: &str, args: &[&str]) -> Output {
    let out = Command::new(bin)
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{bin} panicked: {stderr}");
    out
}

/// Write `[rows, vocab]` f32 logits as a NumPy `.npy` (format 1.0) file.
fn write_npy(name: &str, rows: &[Vec<f32>]) -> PathBuf {
    let (b, v) = (rows.len(), rows[0].len());
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({b}, {v}), }}");
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for r in rows {
        for x in r {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    let path = std::env::temp_dir().join(format!("sampler-chain-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).expect("write npy");
    path
}

#[test]
fn plan_prints_device_and_host_stages_and_bytes() {
    let out = run(
        env!("CARGO_BIN_EXE_plan"),
        &[
            "--config",
            "examples/chains/llama_cpp_default.toml",
            "--device",
            "flex",
            "--offload",
            "device",
        ],
    );
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("device stages: top_k -> top_p -> min_p -> temperature -> dist"),
        "{text}"
    );
    assert!(text.contains("token ids = 4 bytes/row/step"), "{text}");

    // `auto` on a CPU device: sampler-cpu over the rows, and the plan says why.
    let out = run(
        env!("CARGO_BIN_EXE_plan"),
        &[
            "--config",
            "examples/chains/llama_cpp_default.toml",
            "--device",
            "flex",
            "--json",
        ],
    );
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let plan = &v["plan"];
    assert_eq!(plan["offload"], "auto", "{v}");
    assert_eq!(plan["device"], "flex", "{v}");
    assert_eq!(plan["host_reason"]["kind"], "cpu_device", "{v}");
    assert_eq!(plan["readback"], "full_logits", "{v}");
    assert_eq!(plan["bytes_per_row"], 4 * 32000, "{v}");
    assert_eq!(
        plan["skipped_stages"],
        serde_json::json!(["penalties", "dry", "top_n_sigma", "typical", "xtc"]),
        "{v}"
    );
}

#[test]
fn sample_reports_a_nan_row_and_samples_the_other() {
    let path = write_npy(
        "nan.npy",
        &[vec![0.0, 1.0, 2.0, f32::NAN], vec![3.0, 1.0, 2.0, 0.0]],
    );
    let out = run(
        env!("CARGO_BIN_EXE_sample"),
        &[
            "--config",
            "examples/chains/greedy.toml",
            "--logits",
            path.to_str().unwrap(),
            "--json",
            "--offload",
            "device",
        ],
    );
    // Some row failed: exit status 2, the other row sampled.
    assert_eq!(out.status.code(), Some(2));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let step = &json["steps"][0];
    assert_eq!(step["tokens"], serde_json::json!([null, 0]), "{json}");
    let err = &step["errors"][0];
    assert_eq!(err["row"], 0, "{json}");
    assert_eq!(err["kind"], "nan_logit", "{json}");
    assert!(
        err["message"]
            .as_str()
            .unwrap_or("")
            .contains("position 3 is NaN"),
        "{json}"
    );
    assert_eq!(
        step["bytes_read"], 8,
        "4 bytes per row for a fully offloaded chain"
    );
    assert_eq!(json["plan"]["readback"], "token_ids", "{json}");
    assert_eq!(json["plan"]["offload"], "device", "{json}");

    // Every row fine: exit status 0; on flex under `auto` the rows are read.
    let ok = write_npy(
        "ok.npy",
        &[vec![0.0, 1.0, 2.0, 0.5], vec![3.0, 1.0, 2.0, 0.0]],
    );
    let out = run(
        env!("CARGO_BIN_EXE_sample"),
        &[
            "--config",
            "examples/chains/greedy.toml",
            "--logits",
            ok.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(
        json["steps"][0]["tokens"],
        serde_json::json!([2, 0]),
        "{json}"
    );
    assert_eq!(json["steps"][0]["errors"], serde_json::json!([]), "{json}");
    assert_eq!(json["steps"][0]["bytes_read"], 2 * 4 * 4, "{json}");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(ok);
}

#[test]
fn sample_rejects_a_file_that_is_not_npy() {
    let path =
        std::env::temp_dir().join(format!("sampler-chain-{}-garbage.npy", std::process::id()));
    std::fs::write(&path, b"garbage").unwrap();
    let out = run(
        env!("CARGO_BIN_EXE_sample"),
        &[
            "--config",
            "examples/chains/greedy.toml",
            "--logits",
            path.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("garbage.npy") && err.contains("not a .npy file"),
        "{err}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn unknown_device_lists_the_compiled_choices() {
    let out = run(
        env!("CARGO_BIN_EXE_plan"),
        &["--config", "examples/chains/greedy.toml", "--device", "tpu"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`tpu`") && err.contains("compiled-in choices"),
        "{err}"
    );
}

#[test]
fn missing_config_names_the_file() {
    let out = run(
        env!("CARGO_BIN_EXE_plan"),
        &["--config", "no/such/chain.toml"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/chain.toml"));
}

/// `plan` never allocates a `[batch, vocab]` table to print a plan: a
/// 2^32-token vocabulary plans (every stage stays on the host: device ids
/// are i32, and the reason is shown), and sizes beyond the valid ranges are clear range errors.
#[test]
fn plan_huge_shapes_are_planned_or_refused_without_allocating() {
    let out = run(
        env!("CARGO_BIN_EXE_plan"),
        &[
            "--config",
            "examples/chains/creative.toml",
            "--vocab",
            "4294967296",
            "--batch",
            "2",
            "--offload",
            "device",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "host from:     penalties (the device refused it: token ids of a vocabulary of 4294967296 do not fit the device's i32 ids"
        ),
        "{text}"
    );
    for (flag, value, range) in [
        ("--vocab", "18446744073709551615", "1..=4294967296"),
        ("--vocab", "0", "1..=4294967296"),
        ("--batch", "1000000000", "1..=65536"),
    ] {
        let out = run(
            env!("CARGO_BIN_EXE_plan"),
            &["--config", "examples/chains/creative.toml", flag, value],
        );
        assert!(!out.status.success(), "{flag} {value} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(range) && err.contains(flag),
            "{flag} {value}: {err}"
        );
    }
}

/// `cpu` takes no device index (the error says so, not "`flex` takes no
/// device index"), and `sample --steps 0` is a range error, not one step.
#[test]
fn cpu_index_and_zero_steps_are_clear_errors() {
    let out = run(
        env!("CARGO_BIN_EXE_plan"),
        &[
            "--config",
            "examples/chains/creative.toml",
            "--device",
            "cpu:7",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`cpu` takes no device index"), "{err}");
    let path = write_npy("steps.npy", &[vec![0.0, 1.0]]);
    let out = run(
        env!("CARGO_BIN_EXE_sample"),
        &[
            "--config",
            "examples/chains/greedy.toml",
            "--logits",
            path.to_str().unwrap(),
            "--steps",
            "0",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1.."));
    let _ = std::fs::remove_file(path);
}
