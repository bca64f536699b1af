//! Hostile `.npy` and `.safetensors` files through the `sample` command:
//! every one gives a clear error naming the file, never a panic or a huge
//! allocation (sizes are checked against the file first).

use std::process::Command;

fn npy(shape: &str, data_bytes: usize) -> Vec<u8> {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, data_bytes));
    bytes
}

fn safetensors(header: &str, data_bytes: usize) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, data_bytes));
    bytes
}

/// Run `sample` on `bytes` written as `name`; the error must contain every
/// one of `expect`.
fn rejects(name: &str, bytes: &[u8], expect: &[&str]) {
    let path = std::env::temp_dir().join(format!("sampler-chain-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sample"))
        .args(["--config", "examples/chains/greedy.toml", "--logits"])
        .arg(&path)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("sample runs");
    let _ = std::fs::remove_file(&path);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{name}: accepted");
    assert!(!err.contains("panicked"), "{name}: panicked: {err}");
    assert!(
        err.contains(name),
        "{name}: the error does not name the file: {err}"
    );
    for e in expect {
        assert!(err.contains(e), "{name}: expected `{e}` in: {err}");
    }
}

#[test]
fn npy_shapes_that_overflow_or_exceed_the_file_are_errors() {
    rejects(
        "overflow.npy",
        &npy("(4294967296, 4294967296)", 16),
        &["too large"],
    );
    rejects(
        "huge-vocab.npy",
        &npy("(2, 9223372036854775808)", 16),
        &["too large"],
    );
    rejects(
        "short.npy",
        &npy("(2, 8)", 16),
        &["needs 64 bytes", "has 16"],
    );
    rejects(
        "trailing.npy",
        &npy("(1, 2)", 12),
        &["needs 8 bytes", "has 12"],
    );
    rejects("empty-rows.npy", &npy("(0, 8)", 0), &["(0, 8) is empty"]);
    rejects(
        "negative.npy",
        &npy("(-2, 8)", 64),
        &["dimension `-2` is not an integer >= 0"],
    );
    rejects(
        "truncated.npy",
        b"\x93NUMPY\x01",
        &["truncated .npy header"],
    );
}

#[test]
fn safetensors_with_bad_headers_or_offsets_are_errors() {
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    rejects(
        "huge-header.safetensors",
        &huge,
        &["not a valid .safetensors file"],
    );
    rejects(
        "offsets.safetensors",
        &safetensors(
            r#"{"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,18446744073709551615]}}"#,
            16,
        ),
        &["not a valid .safetensors file"],
    );
    rejects(
        "negative-shape.safetensors",
        &safetensors(
            r#"{"x":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}}"#,
            16,
        ),
        &["not a valid .safetensors file"],
    );
    rejects(
        "string-shape.safetensors",
        &safetensors(
            r#"{"x":{"dtype":"F32","shape":["2",2],"data_offsets":[0,16]}}"#,
            16,
        ),
        &["not a valid .safetensors file"],
    );
    rejects(
        "big-shape.safetensors",
        &safetensors(
            r#"{"x":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,16]}}"#,
            16,
        ),
        &["not a valid .safetensors file"],
    );
    rejects(
        "trailing.safetensors",
        &safetensors(
            r#"{"x":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}"#,
            12,
        ),
        &["not a valid .safetensors file"],
    );
}

#[test]
fn a_valid_safetensors_file_samples() {
    let header = r#"{"logits":{"dtype":"F32","shape":[1,3],"data_offsets":[0,12]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for x in [0.5f32, 3.0, 1.0] {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    let path = std::env::temp_dir().join(format!(
        "sampler-chain-{}-ok.safetensors",
        std::process::id()
    ));
    std::fs::write(&path, &bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sample"))
        .args(["--config", "examples/chains/greedy.toml", "--logits"])
        .arg(&path)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("sample runs");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains('1'));
}

/// An f64 `.npy` value beyond f32 is named as written, not read as `+inf`.
#[test]
fn npy_f64_values_beyond_f32_are_named() {
    let mut header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.0f64.to_le_bytes());
    bytes.extend_from_slice(&1e300f64.to_le_bytes());
    rejects(
        "big-f64.npy",
        &bytes,
        &["value 1e300 at position 1 is beyond the f32 range"],
    );
}
