//! conformance helpers
//!
//! Shared by the conformance tests: locating and loading the reference data
//! in `tests/data/` (llama.cpp golden cases, checked into the repository).

use std::path::{Path, PathBuf};

/// Path of the golden llama.cpp cases: `tests/data/llama_cpp_cases.json`.
pub const LLAMA_CPP_CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/llama_cpp_cases.json");

/// The path of a file under `tests/data/`.
pub fn reference_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// Read and parse a JSON reference file.
///
/// # Panics
/// With a message naming the path when the file is absent or not valid JSON
/// (a damaged checkout).
pub fn load_reference_json(path: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "cannot read the reference file {path}: {e}. It is part of the repository \
             (tests/data/); restore it with git."
        )
    });
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the reference file {path} is not valid JSON: {e}"))
}

/// `llama_cpp_cases.json`, parsed.
///
/// # Panics
/// As [`load_reference_json`].
pub fn llama_cpp_cases() -> serde_json::Value {
    load_reference_json(LLAMA_CPP_CASES)
}
