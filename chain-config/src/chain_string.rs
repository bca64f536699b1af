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

/// Rank of a kind in the canonical order: `logit_bias`, then the llama.cpp
/// default order (with `no_repeat_ngram` next to the other history
/// penalties), then the selecting stages.
pub(crate) fn order_rank(kind: StageKind) -> usize {
    match kind {
        StageKind::LogitBias => 0,
        StageKind::Penalties => 1,
        StageKind::NoRepeatNgram => 2,
        StageKind::Dry => 3,
        StageKind::TopNSigma => 4,
        StageKind::TopK => 5,
        StageKind::Typical => 6,
        StageKind::TopP => 7,
        StageKind::MinP => 8,
        StageKind::Xtc => 9,
        StageKind::Temperature => 10,
        StageKind::Mirostat => 11,
        StageKind::MirostatV2 => 12,
        StageKind::Greedy => 13,
        StageKind::Dist => 14,
    }
}

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
