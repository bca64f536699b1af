//! Building stages and chains from their declarative specs.

use sampler_core::{Chain, ChainSpec, ParamError, Sampler, StageSpec};
use thiserror::Error;

/// A chain could not be built: the stage at `index` (position in
/// [`ChainSpec::stages`]) has an invalid parameter.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("stage {index} of the chain: {source}")]
pub struct ChainBuildError {
    /// Position of the offending stage in the chain, from 0.
    pub index: usize,
    /// What is wrong with it.
    #[source]
    pub source: ParamError,
}

macro_rules! cpu_builder {
    ($( ($Var:ident $module:ident [$($field:ident)*] $device:ident) )*) => {
        /// Build the CPU implementation of one stage, after validating its
        /// parameters ([`StageSpec::validate`]). Generated from the stage
        /// registry: each variant maps to `stages::<module>::<Variant>::new`.
        ///
        /// # Errors
        /// The [`ParamError`] naming the stage, the parameter, the value and the range.
        pub fn build_stage(spec: &StageSpec) -> Result<Box<dyn Sampler>, ParamError> {
            spec.validate()?;
            Ok(match spec.clone() {
                $( StageSpec::$Var { $($field),* } => Box::new(crate::stages::$module::$Var::new($($field),*)), )*
            })
        }
    };
}
sampler_core::for_each_stage!(cpu_builder);

/// Build a [`Chain`] of CPU stages from a spec, validating every stage.
/// `spec.seed == None` draws a seed from the OS. The chain has the fast
/// kernels ([`crate::ROW_KERNELS`]): [`Chain::sample`] on
/// `Candidates::from_logits(row)` takes the fast path. The spec's
/// `logprobs` request is not part of the chain: hand it to
/// [`crate::sample_batch_logprobs`] or [`Chain::sample_logprobs`] with the
/// row (a validated request: [`sampler_core::LogprobsSpec::validate`]).
///
/// # Errors
/// [`ChainBuildError`] with the index of the first invalid stage.
pub fn build_chain(spec: &ChainSpec) -> Result<Chain, ChainBuildError> {
    let stages = spec
        .stages
        .iter()
        .enumerate()
        .map(|(index, s)| build_stage(s).map_err(|source| ChainBuildError { index, source }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Chain::new(stages, spec.seed).with_kernels(crate::ROW_KERNELS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_stage_reports_its_index() {
        let spec = ChainSpec::new(
            vec![
                StageSpec::TopK { k: 4 },
                StageSpec::TopP {
                    p: 2.0,
                    min_keep: 0,
                },
            ],
            Some(1),
        );
        let e = build_chain(&spec).unwrap_err();
        assert_eq!(e.index, 1);
        assert_eq!(e.source.param, "p");
        assert!(e.to_string().contains("stage 1"));
    }

    #[test]
    fn every_stage_reports_its_spec() {
        let specs = vec![
            StageSpec::Greedy,
            StageSpec::Dist,
            StageSpec::TopK { k: 3 },
            StageSpec::TopP {
                p: 0.9,
                min_keep: 1,
            },
            StageSpec::MinP {
                p: 0.1,
                min_keep: 0,
            },
            StageSpec::Typical {
                p: 0.5,
                min_keep: 0,
            },
            StageSpec::Temperature {
                t: 0.7,
                dynatemp_range: 0.2,
                dynatemp_exponent: 1.5,
            },
            StageSpec::Xtc {
                probability: 0.5,
                threshold: 0.1,
                min_keep: 1,
            },
            StageSpec::TopNSigma { n: 1.0 },
            StageSpec::Mirostat {
                tau: 5.0,
                eta: 0.1,
                m: 100,
            },
            StageSpec::MirostatV2 { tau: 5.0, eta: 0.1 },
            StageSpec::Penalties {
                last_n: 64,
                repeat: 1.1,
                frequency: 0.1,
                presence: 0.2,
                scope: sampler_core::HistoryScope::Output,
            },
            StageSpec::Dry {
                multiplier: 0.8,
                base: 1.75,
                allowed_length: 2,
                last_n: 64,
                seq_breakers: vec![vec![3], vec![4, 5]],
                scope: sampler_core::HistoryScope::PromptAndOutput,
            },
            StageSpec::LogitBias {
                bias: vec![(1, 2.0), (2, f32::NEG_INFINITY)],
            },
            StageSpec::NoRepeatNgram {
                n: 3,
                scope: sampler_core::HistoryScope::Output,
            },
        ];
        let defaults = sampler_core::StageKind::ALL
            .into_iter()
            .map(sampler_core::StageSpec::default_for);
        let extra = [
            StageSpec::Epsilon {
                epsilon: 0.02,
                min_keep: 2,
            },
            StageSpec::Eta {
                epsilon: 0.01,
                min_keep: 0,
            },
        ];
        for s in specs.into_iter().chain(extra).chain(defaults) {
            let stage = build_stage(&s).unwrap();
            assert_eq!(stage.spec().as_ref(), Some(&s));
            assert_eq!(stage.name(), s.name());
        }
    }
}
