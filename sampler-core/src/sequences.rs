//! Several sequences per request: `n` parallel samples (OpenAI / vLLM) and
//! beam search (Hugging Face `generate`: `num_beams`,
//! `num_return_sequences`, `length_penalty`, `early_stopping`). The
//! declaration only; the serving batch forks requests
//! (`SamplingBatch::fork`) and sampler-cpu's `beam` module runs the search.

/// The most sequences one request may run: the largest `n` and the largest
/// `num_beams`.
pub const MAX_SEQUENCES: usize = 256;

/// When beam search stops (Hugging Face's `early_stopping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EarlyStopping {
    /// As soon as `num_beams` hypotheses have finished.
    True,
    /// When the worst finished hypothesis beats the best running beam at
    /// its current length (transformers' default heuristic).
    #[default]
    False,
    /// Only when no running beam can still beat the worst finished one.
    Never,
}

impl EarlyStopping {
    /// From `true`, `false` or `never`.
    pub fn from_word(w: &str) -> Option<Self> {
        match w {
            "true" => Some(Self::True),
            "false" => Some(Self::False),
            "never" => Some(Self::Never),
            _ => None,
        }
    }

    /// `true`, `false` or `never`.
    pub fn word(self) -> &'static str {
        match self {
            Self::True => "true",
            Self::False => "false",
            Self::Never => "never",
        }
    }
}

/// Beam search settings (Hugging Face's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamSpec {
    /// Beams kept per step (`W`), `1..=MAX_SEQUENCES` (the loaders read
    /// `num_beams = 1` as no beam search, as Hugging Face does).
    pub num_beams: usize,
    /// Sequences returned, `1..=num_beams`. Default 1.
    pub num_return_sequences: usize,
    /// Exponent of the length in a finished hypothesis' score
    /// `sum_logprobs / length^length_penalty`, finite. Default 1.
    pub length_penalty: f64,
    /// When the search stops. Default [`EarlyStopping::False`].
    pub early_stopping: EarlyStopping,
}

/// How many sequences a request runs: `n` independent samples, or a beam
/// search. Default: one sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sequences {
    /// Independent samples of the prompt (OpenAI / vLLM `n`),
    /// `1..=MAX_SEQUENCES`; child `i` samples with the seed
    /// [`crate::rng::child_seed`]`(seed, i)`. Must be 1 with beam search
    /// (it returns `num_return_sequences`).
    pub n: usize,
    /// Beam search instead of sampling; `None` samples.
    pub beam: Option<BeamSpec>,
}

impl Default for Sequences {
    fn default() -> Self {
        Self { n: 1, beam: None }
    }
}

/// A setting of [`Sequences`] out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequencesError {
    /// The key (`n`, `num_beams`, `num_return_sequences`, `length_penalty`).
    pub param: &'static str,
    /// The value given.
    pub value: String,
    /// The range in words.
    pub expected: String,
}

impl Sequences {
    /// Whether this is the default (one sample).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`SequencesError`] naming the first setting out of range.
    pub fn validate(&self) -> Result<(), SequencesError> {
        let err = |param, value: String, expected: String| SequencesError {
            param,
            value,
            expected,
        };
        if !(1..=MAX_SEQUENCES).contains(&self.n) {
            return Err(err(
                "n",
                self.n.to_string(),
                format!("an integer in 1..={MAX_SEQUENCES}"),
            ));
        }
        let Some(b) = self.beam else {
            return Ok(());
        };
        if !(1..=MAX_SEQUENCES).contains(&b.num_beams) {
            return Err(err(
                "num_beams",
                b.num_beams.to_string(),
                format!("an integer in 1..={MAX_SEQUENCES}"),
            ));
        }
        if self.n != 1 {
            return Err(err(
                "n",
                self.n.to_string(),
                "1 with beam search (set num_return_sequences for several sequences)".into(),
            ));
        }
        if !(1..=b.num_beams).contains(&b.num_return_sequences) {
            return Err(err(
                "num_return_sequences",
                b.num_return_sequences.to_string(),
                format!("an integer in 1..=num_beams ({})", b.num_beams),
            ));
        }
        if !b.length_penalty.is_finite() {
            return Err(err(
                "length_penalty",
                b.length_penalty.to_string(),
                "a finite number".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beam(w: usize, r: usize, lp: f64) -> Sequences {
        Sequences {
            n: 1,
            beam: Some(BeamSpec {
                num_beams: w,
                num_return_sequences: r,
                length_penalty: lp,
                early_stopping: EarlyStopping::Never,
            }),
        }
    }

    #[test]
    fn ranges() {
        assert!(Sequences::default().validate().is_ok());
        assert!(beam(4, 2, 1.0).validate().is_ok());
        let e = Sequences { n: 0, beam: None }.validate().unwrap_err();
        assert_eq!((e.param, e.value.as_str()), ("n", "0"));
        let e = Sequences { n: 257, beam: None }.validate().unwrap_err();
        assert!(e.expected.contains("1..=256"), "{e:?}");
        assert!(beam(1, 1, 1.0).validate().is_ok());
        assert_eq!(beam(0, 1, 1.0).validate().unwrap_err().param, "num_beams");
        assert_eq!(beam(257, 1, 1.0).validate().unwrap_err().param, "num_beams");
        let e = beam(4, 5, 1.0).validate().unwrap_err();
        assert_eq!(e.param, "num_return_sequences");
        assert!(e.expected.contains("num_beams (4)"), "{e:?}");
        assert_eq!(
            beam(4, 1, f64::NAN).validate().unwrap_err().param,
            "length_penalty"
        );
        let mut s = beam(4, 1, 1.0);
        s.n = 2;
        assert!(
            s.validate()
                .unwrap_err()
                .expected
                .contains("num_return_sequences")
        );
    }

    #[test]
    fn words() {
        for e in [
            EarlyStopping::True,
            EarlyStopping::False,
            EarlyStopping::Never,
        ] {
            assert_eq!(EarlyStopping::from_word(e.word()), Some(e));
        }
        assert_eq!(EarlyStopping::from_word("maybe"), None);
    }
}
