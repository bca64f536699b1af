//! `n` and beam search from the loaders' keys (flat parameters,
//! `[sequences]` in TOML, `generation_config.json`) into
//! [`sampler_core::Sequences`]: one rule set for every front end.
//!
//! - `n` (OpenAI / vLLM): independent samples, `1..=256`.
//! - `num_beams` (Hugging Face): `1` (default) samples, `2..=256` runs
//!   beam search; with it `num_return_sequences` (default 1, at most
//!   `num_beams`), `length_penalty` (default 1) and `early_stopping`
//!   (`true`, `false` (default) or `"never"`). `n` must then be 1.
//! - Without beam search, `num_return_sequences` counts independent
//!   samples as `n` does (Hugging Face's sampling); giving both with
//!   different values is an error.
//! - `length_penalty` and `early_stopping` without beam search have no
//!   effect (as in Hugging Face).

use sampler_core::{BeamSpec, EarlyStopping, MAX_SEQUENCES, Sequences};
use serde::{Deserialize, Serialize};

/// The keys, in order.
pub(crate) const SEQUENCE_KEYS: [&str; 5] = [
    "n",
    "num_beams",
    "num_return_sequences",
    "length_penalty",
    "early_stopping",
];

/// `early_stopping` as Hugging Face writes it: `true`, `false` or `"never"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EarlyStoppingFlag {
    /// `true` or `false`.
    Bool(bool),
    /// `"never"` (also `"true"` / `"false"`).
    Word(String),
}

impl EarlyStoppingFlag {
    pub(crate) fn get(&self) -> Option<EarlyStopping> {
        match self {
            Self::Bool(true) => Some(EarlyStopping::True),
            Self::Bool(false) => Some(EarlyStopping::False),
            Self::Word(w) => EarlyStopping::from_word(w),
        }
    }
}

/// The five keys as given (`None`: absent).
#[derive(Debug, Clone, Default)]
pub(crate) struct SeqFields {
    pub(crate) n: Option<i64>,
    pub(crate) num_beams: Option<i64>,
    pub(crate) num_return_sequences: Option<i64>,
    pub(crate) length_penalty: Option<f64>,
    pub(crate) early_stopping: Option<EarlyStoppingFlag>,
}

/// A key out of range: `(key, value, expected)`.
pub(crate) type SeqError = (&'static str, String, String);

impl SeqFields {
    /// The sequences these keys declare.
    pub(crate) fn build(&self) -> Result<Sequences, SeqError> {
        let count = |key: &'static str, v: Option<i64>| -> Result<Option<usize>, SeqError> {
            match v {
                None => Ok(None),
                Some(x) if (1..=MAX_SEQUENCES as i64).contains(&x) => Ok(Some(x as usize)),
                Some(x) => Err((
                    key,
                    x.to_string(),
                    format!("an integer in 1..={MAX_SEQUENCES}"),
                )),
            }
        };
        let n = count("n", self.n)?;
        let beams = count("num_beams", self.num_beams)?.unwrap_or(1);
        let ret = count("num_return_sequences", self.num_return_sequences)?;
        let early_stopping = match &self.early_stopping {
            None => EarlyStopping::default(),
            Some(f) => f.get().ok_or_else(|| {
                (
                    "early_stopping",
                    format!("{f:?}"),
                    "true, false or \"never\"".to_string(),
                )
            })?,
        };
        let seqs = if beams > 1 {
            Sequences {
                n: n.unwrap_or(1),
                beam: Some(BeamSpec {
                    num_beams: beams,
                    num_return_sequences: ret.unwrap_or(1),
                    length_penalty: self.length_penalty.unwrap_or(1.0),
                    early_stopping,
                }),
            }
        } else {
            if let (Some(n), Some(r)) = (n, ret)
                && n != r
            {
                return Err((
                    "num_return_sequences",
                    r.to_string(),
                    format!(
                        "absent or equal to n ({n}): without beam search both count independent samples"
                    ),
                ));
            }
            Sequences {
                n: n.or(ret).unwrap_or(1),
                beam: None,
            }
        };
        seqs.validate()
            .map_err(|e| (e.param, e.value, e.expected))?;
        Ok(seqs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(n: Option<i64>, w: Option<i64>, r: Option<i64>) -> SeqFields {
        SeqFields {
            n,
            num_beams: w,
            num_return_sequences: r,
            ..SeqFields::default()
        }
    }

    #[test]
    fn rules() {
        assert_eq!(f(None, None, None).build().unwrap(), Sequences::default());
        assert_eq!(f(Some(4), None, None).build().unwrap().n, 4);
        // Hugging Face's sampling: num_return_sequences is n.
        assert_eq!(f(None, Some(1), Some(3)).build().unwrap().n, 3);
        assert_eq!(
            f(Some(3), None, Some(2)).build().unwrap_err().0,
            "num_return_sequences"
        );
        let s = f(None, Some(4), Some(2)).build().unwrap();
        let b = s.beam.unwrap();
        assert_eq!((s.n, b.num_beams, b.num_return_sequences), (1, 4, 2));
        assert_eq!(
            (b.length_penalty, b.early_stopping),
            (1.0, EarlyStopping::False)
        );
        assert_eq!(f(Some(2), Some(4), None).build().unwrap_err().0, "n");
        assert_eq!(
            f(None, Some(4), Some(5)).build().unwrap_err().0,
            "num_return_sequences"
        );
        assert_eq!(f(Some(0), None, None).build().unwrap_err().0, "n");
        assert_eq!(f(None, Some(257), None).build().unwrap_err().0, "num_beams");
        let mut g = f(None, Some(2), None);
        g.early_stopping = Some(EarlyStoppingFlag::Word("soon".into()));
        assert_eq!(g.build().unwrap_err().0, "early_stopping");
        g.early_stopping = Some(EarlyStoppingFlag::Word("never".into()));
        g.length_penalty = Some(-0.5);
        let b = g.build().unwrap().beam.unwrap();
        assert_eq!(
            (b.early_stopping, b.length_penalty),
            (EarlyStopping::Never, -0.5)
        );
    }
}
