//! The bridge between the config loaders and the stage registry
//! (sampler-core): defaults, parameters by name and their values all come
//! from the registry; nothing here repeats a default or a range.

use sampler_core::{HistoryScope, StageKind, StageSpec};

pub(crate) use sampler_core::ParamValue as PValue;
pub(crate) use sampler_core::SetParamError as SetError;

/// The scope of a TOML word.
pub(crate) fn scope_from_word(s: &str) -> Option<HistoryScope> {
    HistoryScope::from_word(s)
}

/// A stage of `kind` with every parameter at the registry's default
/// ([`StageSpec::default_for`]; llama.cpp's `common_params_sampling` values).
pub fn default_stage(kind: StageKind) -> StageSpec {
    StageSpec::default_for(kind)
}

/// Set the parameter `name` (a canonical `ParamMeta::name`) of `spec`.
pub(crate) fn set_param(spec: &mut StageSpec, name: &str, v: PValue) -> Result<(), SetError> {
    spec.set_param(name, v)
}

/// Every parameter of `spec` as `(ParamMeta::name, value)`, in metadata order.
pub(crate) fn params_of(spec: &StageSpec) -> Vec<(&'static str, PValue)> {
    spec.params()
}
