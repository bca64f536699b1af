//! The GGUF reader: hand-built files with known values in every supported
//! block format, bad files (each a clear error with the file, what and the
//! offset), and the SmolLM2-135M-Instruct file from `../shared` when it is
//! there.

use std::path::{Path, PathBuf};

use half::f16;
use sampler_examples::gguf::{GgmlType, Gguf, GgufError, MetaValue};

/// A GGUF v3 file: `kv` (key, type, value bytes) then `tensors` (name,
/// dims, type id, data).
fn build(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let s = |out: &mut Vec<u8>, t: &str| {
        out.extend((t.len() as u64).to_le_bytes());
        out.extend(t.as_bytes());
    };
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kv.len() as u64).to_le_bytes());
    for (k, ty, v) in kv {
        s(&mut out, k);
        out.extend(ty.to_le_bytes());
        out.extend(v);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, dims, ty, data) in tensors {
        s(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset += (data.len() as u64).div_ceil(32) * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    for ((_, _, _, data), _) in tensors.iter().zip(offsets) {
        out.extend(data);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
    }
    out
}

fn f16b(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

fn parse(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
    Gguf::from_bytes(Path::new("test.gguf"), bytes)
}

fn sample_file() -> Vec<u8> {
    // Q8_0: d = 0.5, q = -16..16.
    let mut q8 = f16b(0.5).to_vec();
    q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
    // Q4_1: d = 0.25, m = -1, q_j = j % 16 (low nibble j, high nibble j + 16).
    let mut q4 = f16b(0.25).to_vec();
    q4.extend(f16b(-1.0));
    q4.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let f32s: Vec<u8> = [1.5f32, -2.0, 0.25, 8.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let f16s: Vec<u8> = [0.5f32, -3.0].iter().flat_map(|&x| f16b(x)).collect();
    let mut arr = 8u32.to_le_bytes().to_vec(); // array of strings
    arr.extend(2u64.to_le_bytes());
    for t in ["<s>", "héllo"] {
        arr.extend((t.len() as u64).to_le_bytes());
        arr.extend(t.as_bytes());
    }
    build(
        &[
            ("general.architecture", 8, {
                let mut v = 5u64.to_le_bytes().to_vec();
                v.extend(b"llama");
                v
            }),
            ("llama.block_count", 4, 30u32.to_le_bytes().to_vec()),
            ("llama.rope.freq_base", 6, 100000f32.to_le_bytes().to_vec()),
            ("neg", 5, (-7i32).to_le_bytes().to_vec()),
            ("tokenizer.ggml.tokens", 9, arr),
        ],
        &[
            ("q8", vec![32], 8, q8),
            ("q4", vec![32, 1], 3, q4),
            ("f32", vec![2, 2], 0, f32s),
            ("f16", vec![2], 1, f16s),
        ],
    )
}

#[test]
fn known_values_in_every_format() {
    let g = parse(sample_file()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(
        g.meta("general.architecture").and_then(MetaValue::as_str),
        Some("llama")
    );
    assert_eq!(
        g.meta("llama.block_count").and_then(MetaValue::as_u64),
        Some(30)
    );
    assert_eq!(
        g.meta("llama.rope.freq_base").and_then(MetaValue::as_f64),
        Some(100000.0)
    );
    assert_eq!(g.meta("neg"), Some(&MetaValue::Int(-7)));
    let toks = g
        .meta("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .unwrap();
    assert_eq!(toks[1].as_str(), Some("héllo"));
    let (q8, dims) = g.dequantize("q8").unwrap();
    assert_eq!(dims, vec![32]);
    assert_eq!(
        q8,
        (0..32).map(|i| 0.5 * (i - 16) as f32).collect::<Vec<_>>()
    );
    let (q4, _) = g.dequantize("q4").unwrap();
    let want: Vec<f32> = (0..16)
        .map(|j| 0.25 * j as f32 - 1.0)
        .chain((0..16).map(|j| 0.25 * (15 - j) as f32 - 1.0))
        .collect();
    assert_eq!(q4, want);
    assert_eq!(g.dequantize("f32").unwrap().0, vec![1.5, -2.0, 0.25, 8.0]);
    assert_eq!(g.dequantize("f16").unwrap().0, vec![0.5, -3.0]);
    assert_eq!(g.tensor("q4").unwrap().kind, GgmlType::Q4_1);
    assert!(matches!(
        g.dequantize("nope"),
        Err(GgufError::Missing { .. })
    ));
}

#[test]
fn bad_files_are_clear_errors() {
    let good = sample_file();
    let msg = |r: Result<Gguf, GgufError>| r.unwrap_err().to_string();
    // Wrong magic, unknown version.
    let mut b = good.clone();
    b[0] = b'X';
    assert!(msg(parse(b)).contains("magic"), "magic");
    let mut b = good.clone();
    b[4] = 9;
    assert!(msg(parse(b)).contains("version 9"));
    assert!(msg(parse(b"GG".to_vec())).contains("too short"));
    // Truncated anywhere: an error naming the offset, never a panic.
    let g = parse(good.clone()).unwrap();
    // Past the last tensor's data there is only padding.
    let end = g.tensors.iter().map(|t| t.offset + t.bytes).max().unwrap() as usize;
    assert!(parse(good[..end].to_vec()).is_ok());
    for cut in (0..end).step_by(7).chain([end - 1]) {
        let e = parse(good[..cut].to_vec());
        assert!(e.is_err(), "cut at {cut}");
        let m = e.unwrap_err().to_string();
        assert!(m.contains("test.gguf"), "{m}");
    }
    let e = msg(parse(good[..good.len() - 40].to_vec()));
    assert!(
        e.contains("truncated at byte") && e.contains("tensor `"),
        "{e}"
    );
    // Counts far beyond the file: refused before allocating.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(msg(parse(b)).contains("truncated"));
    // An unknown tensor type names the tensor and the offset.
    let bad = build(&[], &[("w", vec![4], 99, vec![0; 16])]);
    let e = msg(parse(bad));
    assert!(
        e.contains("tensor `w`") && e.contains("tensor type 99") && e.contains("byte "),
        "{e}"
    );
    // A shape that is not whole blocks, and dimensions that overflow.
    let bad = build(&[], &[("w", vec![33], 8, vec![0; 68])]);
    assert!(msg(parse(bad)).contains("whole number"));
    let bad = build(&[], &[("w", vec![u64::MAX, 4], 0, vec![0; 16])]);
    assert!(msg(parse(bad)).contains("overflow"));
    // Bad UTF-8 in a key.
    let bad = build(&[("k\u{e9}", 4, 1u32.to_le_bytes().to_vec())], &[]);
    let mut bad2 = bad.clone();
    let at = bad2.windows(2).position(|w| w == "é".as_bytes()).unwrap();
    bad2[at] = 0xff;
    assert!(msg(parse(bad2)).contains("UTF-8"));
    assert!(parse(bad).is_ok());
}

fn shared_model() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    ));
    if p.is_file() {
        Some(p)
    } else {
        println!(
            "SKIP: {} is absent (the shared model directory beside the repository)",
            p.display()
        );
        None
    }
}

/// The real SmolLM2-135M-Instruct file: the facts its README lists.
#[test]
fn smollm2_metadata_and_tensors() {
    let Some(path) = shared_model() else { return };
    let g = Gguf::read(&path).unwrap();
    assert_eq!(g.version, 3);
    let u = |k: &str| g.require(k).unwrap().as_u64().unwrap();
    assert_eq!(
        g.require("general.architecture").unwrap().as_str(),
        Some("llama")
    );
    assert_eq!(u("llama.block_count"), 30);
    assert_eq!(u("llama.embedding_length"), 576);
    assert_eq!(u("llama.feed_forward_length"), 1536);
    assert_eq!(u("llama.attention.head_count"), 9);
    assert_eq!(u("llama.attention.head_count_kv"), 3);
    assert_eq!(
        g.require("llama.rope.freq_base").unwrap().as_f64(),
        Some(100000.0)
    );
    let tokens = g
        .require("tokenizer.ggml.tokens")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1].as_str(), Some("<|im_start|>"));
    assert_eq!(tokens[2].as_str(), Some("<|im_end|>"));
    let merges = g
        .require("tokenizer.ggml.merges")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(merges.len(), 48900);
    assert!(
        g.require("tokenizer.chat_template")
            .unwrap()
            .as_str()
            .is_some()
    );
    assert_eq!(g.tensors.len(), 272);
    let count = |k: GgmlType| g.tensors.iter().filter(|t| t.kind == k).count();
    assert_eq!(
        (
            count(GgmlType::Q8_0),
            count(GgmlType::Q4_1),
            count(GgmlType::F32)
        ),
        (1, 210, 61)
    );
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, vec![576, 49152]);
    let (w, dims) = g.dequantize("blk.0.attn_q.weight").unwrap();
    assert_eq!(dims, vec![576, 576]);
    assert_eq!(w.len(), 576 * 576);
    assert!(w.iter().all(|x| x.is_finite()));
    let (norm, _) = g.dequantize("output_norm.weight").unwrap();
    assert_eq!(norm.len(), 576);
    // A trained norm weight: positive, around 1.
    let mean = norm.iter().sum::<f32>() / norm.len() as f32;
    assert!(mean > 0.1 && mean < 10.0, "{mean}");
}
