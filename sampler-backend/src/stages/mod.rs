//! One device stage per file. Each type is named like its `StageSpec`
//! variant and has `new(stage_index, specs)` (the per-row specs of its chain
//! position); `build_device_stage` is generated from the stage registry for
//! every stage whose metadata says `device_hook`, and so is the list of
//! modules below (one per such stage).

macro_rules! declare_device_modules {
    (@one yes $module:ident) => {
        pub mod $module;
    };
    (@one no $module:ident) => {};
    ($( ($Var:ident $module:ident [$($field:ident)*] $device:ident) )*) => {
        $( declare_device_modules!(@one $device $module); )*
    };
}
sampler_core::for_each_stage!(declare_device_modules);
