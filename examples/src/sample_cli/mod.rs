//! Shared pieces of the `plan` and `sample` commands: loading a chain
//! config, choosing the device, and reading logits from `.npy` or
//! `.safetensors` files. Included by both binaries with `#[path]`.
#![allow(dead_code)]

use std::path::Path;

use chain_config::ChainConfig;
use sampler_core::OffloadPolicy;

/// A command error, printed as one line.
pub type CliResult<T> = Result<T, String>;

/// Load and validate a chain TOML file.
pub fn load_config(path: &Path) -> CliResult<ChainConfig> {
    ChainConfig::from_toml_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parse `--offload`: `auto`, `off` or a stage count.
pub fn parse_offload(s: &str) -> CliResult<OffloadPolicy> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(OffloadPolicy::Auto),
        "off" => Ok(OffloadPolicy::Off),
        n => n
            .parse()
            .map(OffloadPolicy::Stages)
            .map_err(|_| format!("--offload {s}: expected auto, off or a number of stages")),
    }
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
    let is_npy = bytes.starts_with(b"\x93NUMPY");
    let r = if is_npy {
        read_npy(&bytes)
    } else if ext == "npy" {
        Err("not a .npy file: it does not start with the \\x93NUMPY magic".into())
    } else {
        read_safetensors(&bytes, name)
    };
    r.map_err(|e| format!("{}: {e}", path.display()))
}

fn to_f32(raw: &[u8], dtype: &str) -> CliResult<Vec<f32>> {
    Ok(match dtype {
        "f4" | "F32" => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        "f8" | "F64" => raw
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        "f2" | "F16" => raw
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        "BF16" => raw
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        other => {
            return Err(format!(
                "unsupported dtype {other} (use f32, f16, bf16 or f64)"
            ));
        }
    })
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = (h >> 10) & 0x1f;
    let man = u32::from(h & 0x3ff);
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal: normalise.
            let mut m = man;
            let mut e = 127 - 15 + 1;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((u32::from(exp) + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

fn shape2(shape: &[usize]) -> CliResult<(usize, usize)> {
    match *shape {
        [v] => Ok((1, v)),
        [b, v] => Ok((b, v)),
        _ => Err(format!(
            "expected a 1-D or 2-D array of logits, got shape {shape:?}"
        )),
    }
}

fn read_npy(bytes: &[u8]) -> CliResult<Logits> {
    if bytes.len() < 10 {
        return Err("truncated .npy header".into());
    }
    let major = bytes[6];
    let (hlen, start) = if major == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else {
        if bytes.len() < 12 {
            return Err("truncated .npy header".into());
        }
        (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        )
    };
    let header = bytes
        .get(start..start + hlen)
        .ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "non-UTF-8 .npy header")?;
    let field = |key: &str| -> Option<&str> {
        let i = header.find(key)? + key.len();
        let rest = header[i..].trim_start_matches([' ', ':', '\'', '"']);
        Some(rest)
    };
    let descr = field("descr").ok_or("no descr in .npy header")?;
    let descr: String = descr
        .chars()
        .take_while(|c| *c != '\'' && *c != '"')
        .collect();
    if descr.starts_with('>') {
        return Err(format!("big-endian .npy ({descr}) is not supported"));
    }
    let dtype = descr.trim_start_matches(['<', '|', '=']);
    if field("fortran_order").is_some_and(|s| s.starts_with("True")) {
        return Err("Fortran-order .npy is not supported".into());
    }
    let shape_txt = field("shape").ok_or("no shape in .npy header")?;
    let inner: String = shape_txt
        .trim_start_matches('(')
        .chars()
        .take_while(|c| *c != ')')
        .collect();
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("bad .npy shape {shape_txt}")))
        .collect::<CliResult<_>>()?;
    let (batch, vocab) = shape2(&shape)?;
    let data = to_f32(&bytes[start + hlen..], dtype)?;
    if data.len() != batch * vocab {
        return Err(format!("{} values for shape {shape:?}", data.len()));
    }
    Ok(Logits { batch, vocab, data })
}

fn read_safetensors(bytes: &[u8], name: Option<&str>) -> CliResult<Logits> {
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as usize)
        .ok_or("not a .npy or .safetensors file")?;
    let header = bytes.get(8..8 + n).ok_or("truncated safetensors header")?;
    let header: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| format!("bad safetensors header: {e}"))?;
    let obj = header.as_object().ok_or("bad safetensors header")?;
    let pick = match name {
        Some(n) => obj.get(n).map(|v| (n.to_string(), v)),
        None => obj
            .iter()
            .find(|(k, v)| {
                *k != "__metadata__" && v["shape"].as_array().is_some_and(|s| s.len() <= 2)
            })
            .map(|(k, v)| (k.clone(), v)),
    };
    let (tname, t) = pick.ok_or("no logits tensor in the safetensors file (use --tensor NAME)")?;
    let dtype = t["dtype"].as_str().ok_or("tensor without dtype")?;
    let shape: Vec<usize> = t["shape"]
        .as_array()
        .ok_or("tensor without shape")?
        .iter()
        .map(|x| x.as_u64().unwrap_or(0) as usize)
        .collect();
    let offs = t["data_offsets"]
        .as_array()
        .ok_or("tensor without data_offsets")?;
    let (a, b) = (
        offs.first().and_then(|x| x.as_u64()).unwrap_or(0) as usize,
        offs.get(1).and_then(|x| x.as_u64()).unwrap_or(0) as usize,
    );
    let raw = bytes
        .get(8 + n + a..8 + n + b)
        .ok_or(format!("tensor {tname}: data outside the file"))?;
    let (batch, vocab) = shape2(&shape)?;
    let data = to_f32(raw, dtype)?;
    if data.len() != batch * vocab {
        return Err(format!(
            "tensor {tname}: {} values for shape {shape:?}",
            data.len()
        ));
    }
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
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
    }
}
