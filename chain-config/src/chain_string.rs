//! llama.cpp chain strings (`--samplers "top_k;top_p;temperature"`) and
//! `--sampling-seq` letters (`kpt`).

use sampler_core::StageKind;

use crate::error::{ConfigError, Location};
use crate::suggest::suggest;

/// llama.cpp's default sampler order (`common_params_sampling::samplers`,
/// letters `edskypmxt`): penalties, dry, top_n_sigma, top_k, typical, top_p,
/// min_p, xtc, temperature. `dist` follows; `logit_bias` goes first when
/// present.
pub const DEFAULT_ORDER: [StageKind; 9] = [
    StageKind::Penalties,
    StageKind::Dry,
    StageKind::TopNSigma,
    StageKind::TopK,
    StageKind::Typical,
    StageKind::TopP,
    StageKind::MinP,
    StageKind::Xtc,
    StageKind::Temperature,
];

/// Split a `;`-separated list of stage names (llama.cpp `--samplers`;
/// case-insensitive, `-` and `_` alike, aliases accepted). Blank entries
/// (`"top_k;;dist"`, a trailing `;`) are skipped. `locate` maps a byte
/// offset in `s` to a source location.
pub(crate) fn parse_names(
    s: &str,
    locate: impl Fn(usize) -> Option<Location>,
) -> Result<Vec<StageKind>, ConfigError> {
    let mut kinds = Vec::new();
    let mut offset = 0;
    for part in s.split(';') {
        let lead = part.len() - part.trim_start().len();
        let name = part.trim();
        if !name.is_empty() {
            match StageKind::from_name(name) {
                Some(k) => kinds.push(k),
                None => {
                    return Err(ConfigError::UnknownStage {
                        name: name.to_string(),
                        location: locate(offset + lead),
                        suggestion: split_suggestion(name)
                            .or_else(|| suggest(name, StageKind::all_names())),
                    });
                }
            }
        }
        offset += part.len() + 1;
    }
    Ok(kinds)
}

/// `top_k,dist` or `top_k dist`: stage names separated by commas or
/// spaces instead of `;`. The same names joined by `;`, when every one is known.
fn split_suggestion(name: &str) -> Option<String> {
    let parts: Vec<&str> = name
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .collect();
    (parts.len() > 1 && parts.iter().all(|p| StageKind::from_name(p).is_some()))
        .then(|| parts.join(";"))
}

/// Kinds of a `--sampling-seq` string (`e d s k y p m x t`, case-insensitive;
/// whitespace skipped).
pub(crate) fn parse_seq(s: &str) -> Result<Vec<StageKind>, ConfigError> {
    let mut kinds = Vec::new();
    for (position, letter) in s.chars().enumerate() {
        if letter.is_whitespace() {
            continue;
        }
        match StageKind::from_seq_char(letter) {
            Some(k) => kinds.push(k),
            None => return Err(ConfigError::UnknownSeqLetter { letter, position }),
        }
    }
    Ok(kinds)
}

#[cfg(test)]
mod order_tests {
    use super::*;

    /// llama.cpp's default order is the registry's order of the stages that
    /// have a `--sampling-seq` letter.
    #[test]
    fn default_order_follows_the_registry() {
        let mut lettered: Vec<StageKind> = StageKind::ALL
            .into_iter()
            .filter(|k| k.meta().seq_letter.is_some())
            .collect();
        lettered.sort_by_key(|k| k.meta().order);
        assert_eq!(lettered, DEFAULT_ORDER);
        let letters: String = DEFAULT_ORDER
            .iter()
            .filter_map(|k| k.meta().seq_letter)
            .collect();
        assert_eq!(letters, "edskypmxt");
    }
}
