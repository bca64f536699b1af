//! Shared pieces of the `plan` and `sample` commands: loading a chain
//! config, choosing the device, and reading logits from `.npy` or
//! `.safetensors` files.

use std::path::Path;

use chain_config::ChainConfig;
use sampler_core::OffloadPolicy;

/// A command error, printed as one line.
pub type CliResult<T> = Result<T, String>;

/// Load and validate a chain TOML file.
pub fn load_config(path: &Path) -> CliResult<ChainConfig> {
    ChainConfig::from_toml_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parse `--offload`: `auto`, `off`, `device` or a stage count.
pub fn parse_offload(s: &str) -> CliResult<OffloadPolicy> {
    s.parse().map_err(|e| format!("--offload {e}"))
}

/// The device: `--device` if given, else the config's `[device] kind`.
/// `cpu` (sampler-cpu only) runs on flex with offloading off.
pub fn device_and_policy(
    cfg: &ChainConfig,
    device: Option<&str>,
    offload: Option<&str>,
) -> CliResult<(String, sampler_backend::Device, OffloadPolicy)> {
    let name = device.unwrap_or(&cfg.device.device).to_string();
    let policy = match offload {
        Some(o) => parse_offload(o)?,
        None => cfg.device.offload,
    };
    let (d, policy) = sampler_backend::resolve_device(&name, policy).map_err(|e| e.to_string())?;
    Ok((name, d, policy))
}

/// Logits `[batch, vocab]` as f32, row-major.
#[derive(Debug, Clone)]
pub struct Logits {
    /// Rows.
    pub batch: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// `batch * vocab` values.
    pub data: Vec<f32>,
}

/// Read `.npy` (f32 / f16 / f64, C order, 1-D or 2-D) or `.safetensors`
/// (the tensor `name`, or the only / first 2-D float tensor).
pub fn read_logits(path: &Path, name: Option<&str>) -> CliResult<Logits> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    parse_logits(&bytes, &ext, name).map_err(|e| format!("{}: {e}", path.display()))
}

/// [`read_logits`] on the bytes of a file whose extension is `ext`
/// (lower case, without the dot): `.npy` by its magic, else safetensors.
///
/// # Errors
/// Why the bytes are not a usable `[batch, vocab]` logits array.
pub fn parse_logits(bytes: &[u8], ext: &str, name: Option<&str>) -> CliResult<Logits> {
    if bytes.starts_with(b"\x93NUMPY") {
        read_npy(bytes)
    } else if ext == "npy" {
        Err("not a .npy file: it does not start with the \\x93NUMPY magic".into())
    } else {
        read_safetensors(bytes, name)
    }
}

/// Element size in bytes of a supported float dtype (`.npy` `f4`/`f8`/`f2`,
/// safetensors `F32`/`F64`/`F16`/`BF16`).
fn dtype_size(dtype: &str) -> CliResult<usize> {
    match dtype {
        "f4" | "F32" => Ok(4),
        "f8" | "F64" => Ok(8),
        "f2" | "F16" | "BF16" => Ok(2),
        other => Err(format!(
            "unsupported dtype {other} (use f32, f16, bf16 or f64)"
        )),
    }
}

/// Little-endian floats of `dtype` to `f32` (f16 and bf16 through `half`).
fn to_f32(raw: &[u8], dtype: &str) -> CliResult<Vec<f32>> {
    Ok(match dtype {
        "f4" | "F32" => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        "f8" | "F64" => {
            let mut out = Vec::with_capacity(raw.len() / 8);
            for (i, c) in raw.chunks_exact(8).enumerate() {
                let x = f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                let f = x as f32;
                if x.is_finite() && f.is_infinite() {
                    return Err(format!(
                        "value {x:e} at position {i} is beyond the f32 range of logits"
                    ));
                }
                out.push(f);
            }
            out
        }
        "f2" | "F16" => raw
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        "BF16" => raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(format!(
                "unsupported dtype {other} (use f32, f16, bf16 or f64)"
            ));
        }
    })
}

/// `[batch, vocab]` of a 1-D or 2-D shape, with at least one row and one
/// token, and the byte size `batch * vocab * elem` checked against
/// `available` before anything is allocated.
fn shape2(shape: &[u64], elem: usize, available: usize) -> CliResult<(usize, usize)> {
    let show = || {
        let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
        format!("({})", dims.join(", "))
    };
    let (b, v) = match *shape {
        [v] => (1, v),
        [b, v] => (b, v),
        _ => {
            return Err(format!(
                "expected a 1-D or 2-D array of logits [batch, vocab], got shape {}",
                show()
            ));
        }
    };
    if b == 0 || v == 0 {
        return Err(format!(
            "shape {} is empty: at least one row [batch >= 1] of at least one logit [vocab >= 1] is needed",
            show()
        ));
    }
    let bytes = b
        .checked_mul(v)
        .and_then(|n| n.checked_mul(elem as u64))
        .and_then(|n| usize::try_from(n).ok());
    match bytes {
        Some(n) if n == available => Ok((b as usize, v as usize)),
        Some(n) => Err(format!(
            "shape {} needs {n} bytes of data, the file has {available}",
            show()
        )),
        None => Err(format!(
            "shape {} is too large ({} x {} values of {elem} bytes overflow)",
            show(),
            b,
            v
        )),
    }
}

/// Read a `.npy` file (format versions 1-3; little-endian f4/f8/f2; C order).
///
/// The header is parsed here rather than with npyz: npyz computes the
/// element count of a hostile shape such as `(4294967296, 4294967296)`
/// without an overflow check (a panic in debug builds); here every size is
/// checked against the file before anything is allocated.
fn read_npy(bytes: &[u8]) -> CliResult<Logits> {
    let truncated = || format!("truncated .npy header ({} bytes)", bytes.len());
    let major = *bytes.get(6).ok_or_else(truncated)?;
    let (hlen, start) = match major {
        1 => {
            let b = bytes.get(8..10).ok_or_else(truncated)?;
            (usize::from(u16::from_le_bytes([b[0], b[1]])), 10usize)
        }
        2 | 3 => {
            let b = bytes.get(8..12).ok_or_else(truncated)?;
            let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            (usize::try_from(n).map_err(|_| truncated())?, 12)
        }
        v => {
            return Err(format!(
                ".npy format version {v} is not supported (1, 2 or 3)"
            ));
        }
    };
    let end = start.checked_add(hlen).ok_or_else(truncated)?;
    let header = bytes.get(start..end).ok_or_else(truncated)?;
    let header = std::str::from_utf8(header).map_err(|_| "non-UTF-8 .npy header")?;
    let h = parse_npy_header(header)?;
    if h.descr.starts_with('>') {
        return Err(format!("big-endian .npy ({}) is not supported", h.descr));
    }
    let dtype = h.descr.trim_start_matches(['<', '|', '=']);
    let elem = dtype_size(dtype)?;
    if h.fortran_order {
        return Err("Fortran-order .npy is not supported".into());
    }
    let shape = h.shape;
    let data = &bytes[end..];
    let (batch, vocab) = shape2(&shape, elem, data.len())?;
    let data = to_f32(data, dtype)?;
    Ok(Logits { batch, vocab, data })
}

/// A `.npy` header: the Python dict literal `{'descr': '<f4',
/// 'fortran_order': False, 'shape': (2, 3), }`, exactly these three keys.
struct NpyHeader {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// Parse a `.npy` header strictly: a missing, repeated or unknown key, or
/// a value of the wrong form, is an error naming it.
fn parse_npy_header(header: &str) -> CliResult<NpyHeader> {
    const KEYS: &str = "descr, fortran_order, shape";
    let shown = |s: &str| -> String { s.chars().take(24).collect() };
    let body = header
        .trim_end_matches(['\n', ' ', '\0'])
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .ok_or("the .npy header is not a dict `{...}`")?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let q = rest.chars().next().filter(|c| *c == '\'' || *c == '"');
        let q = q.ok_or_else(|| {
            format!(
                "bad .npy header at `{}`: expected a quoted key",
                shown(rest)
            )
        })?;
        let close = rest[1..].find(q).ok_or("unterminated key in .npy header")? + 1;
        let key = &rest[1..close];
        rest = rest[close + 1..].trim_start();
        rest = rest
            .strip_prefix(':')
            .ok_or_else(|| format!("bad .npy header: no `:` after key `{}`", shown(key)))?
            .trim_start();
        // The value runs to the next top-level comma (a shape's tuple has
        // commas inside its parentheses).
        let end = if rest.starts_with('(') {
            rest.find(')').map(|i| i + 1)
        } else {
            rest.find(',').or(Some(rest.len()))
        }
        .ok_or("unterminated shape tuple in .npy header")?;
        let value = rest[..end].trim();
        rest = rest[end..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
        let slot_taken = match key {
            "descr" => descr
                .replace(
                    value
                        .strip_prefix(['\'', '"'])
                        .and_then(|v| v.strip_suffix(['\'', '"']))
                        .filter(|v| v.len() <= 16)
                        .ok_or_else(|| {
                            format!("bad .npy descr `{}`: expected a quoted dtype", shown(value))
                        })?
                        .to_string(),
                )
                .is_some(),
            "fortran_order" => fortran
                .replace(match value {
                    "True" => true,
                    "False" => false,
                    _ => {
                        return Err(format!(
                            "bad .npy fortran_order `{}`: expected True or False",
                            shown(value)
                        ));
                    }
                })
                .is_some(),
            "shape" => shape.replace(parse_npy_shape(value)?).is_some(),
            other => {
                return Err(format!(
                    "unknown key `{}` in .npy header (expected {KEYS})",
                    shown(other)
                ));
            }
        };
        if slot_taken {
            return Err(format!("key `{key}` given twice in .npy header"));
        }
    }
    Ok(NpyHeader {
        descr: descr.ok_or("no descr in .npy header")?,
        fortran_order: fortran.ok_or("no fortran_order in .npy header")?,
        shape: shape.ok_or("no shape in .npy header")?,
    })
}

/// A `.npy` shape tuple: `(2, 3)`, `(3,)`, `()`.
fn parse_npy_shape(value: &str) -> CliResult<Vec<u64>> {
    let inner = value
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| {
            let shown: String = value.chars().take(24).collect();
            format!("bad .npy shape `{shown}`: expected a tuple of integers")
        })?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|_| {
                let shown: String = s.chars().take(24).collect();
                format!("bad .npy shape: dimension `{shown}` is not an integer >= 0")
            })
        })
        .collect()
}

/// Read a `.safetensors` file with the `safetensors` crate (which checks the
/// header length, the offsets and that every byte of data belongs to a
/// tensor): the tensor `name`, or the first (by name) 1-D or 2-D one.
fn read_safetensors(bytes: &[u8], name: Option<&str>) -> CliResult<Logits> {
    use safetensors::{Dtype, SafeTensors};
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid .safetensors file: {e}"))?;
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    let tname =
        match name {
            Some(n) => names.iter().find(|k| *k == n).cloned().ok_or_else(|| {
                format!("no tensor named `{n}` (the file has: {})", names.join(", "))
            })?,
            None => names
                .iter()
                .find(|k| st.tensor(k).is_ok_and(|t| t.shape().len() <= 2))
                .cloned()
                .ok_or("no 1-D or 2-D logits tensor in the safetensors file (use --tensor NAME)")?,
        };
    let t = st
        .tensor(&tname)
        .map_err(|e| format!("tensor {tname}: {e}"))?;
    let dtype = match t.dtype() {
        Dtype::F32 => "F32",
        Dtype::F64 => "F64",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        other => {
            return Err(format!(
                "tensor {tname}: unsupported dtype {other:?} (use f32, f16, bf16 or f64)"
            ));
        }
    };
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    let (batch, vocab) = shape2(&shape, dtype_size(dtype)?, t.data().len())
        .map_err(|e| format!("tensor {tname}: {e}"))?;
    let data = to_f32(t.data(), dtype)?;
    Ok(Logits { batch, vocab, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip() {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        let mut h = h.to_string();
        while !(10 + h.len() + 1).is_multiple_of(64) {
            h.push(' ');
        }
        h.push('\n');
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        for x in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0] {
            b.extend(x.to_le_bytes());
        }
        let l = read_npy(&b).unwrap();
        assert_eq!((l.batch, l.vocab), (2, 3));
        assert_eq!(l.data[5], 6.0);
        assert_eq!(to_f32(&0x3c00u16.to_le_bytes(), "f2").unwrap(), [1.0]);
        assert_eq!(to_f32(&0xc000u16.to_le_bytes(), "F16").unwrap(), [-2.0]);
    }

    #[test]
    fn npy_headers_with_unknown_repeated_or_missing_keys_are_refused() {
        let ok = parse_npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }   \n")
            .expect("a numpy-written header");
        assert_eq!(
            (ok.descr.as_str(), ok.fortran_order, ok.shape),
            ("<f4", false, vec![3])
        );
        let err = |h: &str| {
            parse_npy_header(h)
                .err()
                .unwrap_or_else(|| panic!("accepted {h}"))
        };
        let cases = [
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'strides': (4,), }",
                "unknown key `strides` in .npy header (expected descr, fortran_order, shape)",
            ),
            (
                "{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
                "key `descr` given twice",
            ),
            (
                "{'descr': '<f4', 'shape': (2, 3), }",
                "no fortran_order in .npy header",
            ),
            (
                "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
                "expected True or False",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': 2}",
                "expected a tuple",
            ),
            ("'descr': '<f4'", "not a dict"),
        ];
        for (h, want) in cases {
            let e = err(h);
            assert!(e.contains(want), "{h}: {e}");
        }
    }
}
