//! One stage per file. Each type is named like its [`sampler_core::StageSpec`]
//! variant, implements [`sampler_core::Sampler`], reports its spec, and has a
//! `new(fields...)` taking the variant's fields in declaration order: the
//! builder (`build_stage`) is generated from the stage registry
//! ([`sampler_core::for_each_stage!`]).

pub mod dist;
pub mod dry;
pub mod epsilon;
pub mod eta;
pub mod greedy;
pub mod logit_bias;
pub mod min_p;
pub mod mirostat;
pub mod mirostat_v2;
pub mod no_repeat_ngram;
pub mod penalties;
pub mod temperature;
pub mod top_k;
pub mod top_n_sigma;
pub mod top_p;
pub mod typical;
pub mod xtc;

pub use dist::{Dist, dist_select};
pub use dry::Dry;
pub use epsilon::Epsilon;
pub use eta::Eta;
pub use greedy::Greedy;
pub use logit_bias::LogitBias;
pub use min_p::MinP;
pub use mirostat::Mirostat;
pub use mirostat_v2::MirostatV2;
pub use no_repeat_ngram::NoRepeatNgram;
pub use penalties::Penalties;
pub use temperature::Temperature;
pub use top_k::TopK;
pub use top_n_sigma::TopNSigma;
pub use top_p::TopP;
pub use typical::Typical;
pub use xtc::Xtc;
