//! Building stages and chains from their declarative specs.

use sampler_core::{Chain, ChainSpec, ParamError, Sampler, StageSpec};
use thiserror::Error;

use crate::stages::{
    dist::Dist, dry::Dry, greedy::Greedy, logit_bias::LogitBias, min_p::MinP, mirostat::Mirostat,
    mirostat_v2::MirostatV2, no_repeat_ngram::NoRepeatNgram, penalties::Penalties,
    temperature::Temperature, top_k::TopK, top_n_sigma::TopNSigma, top_p::TopP, typical::Typical,
    xtc::Xtc,
};

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

/// Build the CPU implementation of one stage, after validating its
/// parameters ([`StageSpec::validate`]).
///
/// # Errors
/// The [`ParamError`] naming the stage, the parameter, the value and the range.
pub fn build_stage(spec: &StageSpec) -> Result<Box<dyn Sampler>, ParamError> {
    spec.validate()?;
    Ok(match spec.clone() {
        StageSpec::Greedy => Box::new(Greedy),
        StageSpec::Dist => Box::new(Dist),
        StageSpec::TopK { k } => Box::new(TopK::new(k)),
        StageSpec::TopP { p, min_keep } => Box::new(TopP::new(p, min_keep)),
        StageSpec::MinP { p, min_keep } => Box::new(MinP::new(p, min_keep)),
        StageSpec::Typical { p, min_keep } => Box::new(Typical::new(p, min_keep)),
        StageSpec::Temperature {
            t,
            dynatemp_range,
            dynatemp_exponent,
        } => Box::new(Temperature::new(t, dynatemp_range, dynatemp_exponent)),
        StageSpec::Xtc {
            probability,
            threshold,
            min_keep,
        } => Box::new(Xtc::new(probability, threshold, min_keep)),
        StageSpec::TopNSigma { n } => Box::new(TopNSigma::new(n)),
        StageSpec::Mirostat { tau, eta, m } => Box::new(Mirostat::new(tau, eta, m)),
        StageSpec::MirostatV2 { tau, eta } => Box::new(MirostatV2::new(tau, eta)),
        StageSpec::Penalties {
            last_n,
            repeat,
            frequency,
            presence,
            scope,
        } => Box::new(Penalties::new(last_n, repeat, frequency, presence, scope)),
        StageSpec::Dry {
            multiplier,
            base,
            allowed_length,
            last_n,
            seq_breakers,
            scope,
        } => Box::new(Dry::new(
            multiplier,
            base,
            allowed_length,
            last_n,
            seq_breakers,
            scope,
        )),
        StageSpec::LogitBias { bias } => Box::new(LogitBias::new(bias)),
        StageSpec::NoRepeatNgram { n, scope } => Box::new(NoRepeatNgram::new(n, scope)),
    })
}

/// Build a [`Chain`] of CPU stages from a spec, validating every stage.
/// `spec.seed == None` draws a seed from the OS.
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
    Ok(Chain::new(stages, spec.seed))
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
        for s in specs {
            let stage = build_stage(&s).unwrap();
            assert_eq!(stage.spec().as_ref(), Some(&s));
            assert_eq!(stage.name(), s.name());
        }
    }
}
