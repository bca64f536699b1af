//! One stage per file. Each type is named like its [`sampler_core::StageSpec`]
//! variant, implements [`sampler_core::Sampler`], reports its spec, and has a
//! `new(fields...)` taking the variant's fields in declaration order: the
//! builder (`build_stage`) is generated from the stage registry
//! ([`sampler_core::for_each_stage!`]), and so is the list of modules below:
//! a stage's file is picked up from its registry entry.

macro_rules! declare_stage_modules {
    ($( ($Var:ident $module:ident [$($field:ident)*] $device:ident) )*) => {
        $( pub mod $module; pub use $module::$Var; )*
    };
}
sampler_core::for_each_stage!(declare_stage_modules);

pub use dist::dist_select;
