//! One device stage per file.

pub mod dist;
pub mod greedy;
pub mod logit_bias;
pub mod min_p;
pub mod penalties;
pub mod temperature;
pub mod top_k;
pub mod top_p;
