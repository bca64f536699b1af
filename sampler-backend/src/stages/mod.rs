//! One device stage per file. Each type is named like its `StageSpec`
//! variant and has `new(stage_index, specs)` (the per-row specs of its chain
//! position); `build_device_stage` is generated from the stage registry for
//! every stage whose metadata says `device_hook`.

pub mod dist;
pub mod epsilon;
pub mod eta;
pub mod greedy;
pub mod logit_bias;
pub mod min_p;
pub mod penalties;
pub mod temperature;
pub mod top_k;
pub mod top_p;
