//! What compiling a custom kernel without a device needs (the tests that
//! read the code a kernel compiles to: PTX through cuda's LLVM in
//! `ptx_offline`, WGSL for wgpu beside the launches): the device
//! properties code generation reads and the kernel's constructor.

use std::sync::Arc;

use burn_cubecl::cubecl::ir::{
    DeviceIdentity, HardwareProperties, MemoryDeviceProperties, features::Features,
};
use burn_cubecl::cubecl::prelude::*;

/// What an NVIDIA GPU reports to cubecl that matters to code generation:
/// 32-lane warps, 1024 threads and 48 KiB of shared memory per block.
pub(crate) fn nvidia_properties() -> Arc<DeviceProperties> {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 32,
        max_shared_memory_size: 48 * 1024,
        max_cube_count: (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: None,
        num_tensor_cores: None,
        min_tensor_cores_dim: None,
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    Arc::new(DeviceProperties::new(
        Features::default(),
        MemoryDeviceProperties::new(u64::MAX, 256),
        hardware,
        burn_cubecl::cubecl::profile::TimingMethod::Device,
        DeviceIdentity {
            name: "offline NVIDIA".to_string(),
            fingerprint: "offline".to_string(),
            physical: None,
        },
    ))
}

pub(crate) fn settings(units: u32) -> KernelSettings {
    KernelSettings::new(
        *CubeDim::new_1d(units),
        ExecutionMode::Unchecked,
        AddressType::U32,
    )
}

pub(crate) fn buf() -> BufferCompilationArg {
    BufferCompilationArg { inplace: None }
}

/// `new(settings, properties, target, buffers.., scalars.., comptime..)` of
/// a kernel's `#[cube]` struct: one `b` per buffer argument and one `s` per
/// scalar argument (compile-time arguments of their own: none), in the
/// order of the kernel's signature, then its compile-time arguments.
macro_rules! kernel {
    ($new:path, $units:expr, [$($b:ident)*], [$($s:ident)*] $(, $ct:expr)* $(,)?) => {
        $new(
            $crate::kernels::offline::settings($units),
            $crate::kernels::offline::nvidia_properties(),
            ::std::sync::Arc::new(::burn_cubecl::cubecl::prelude::TargetProperties::default()),
            $($crate::kernels::offline::kernel!(@$b),)*
            $($crate::kernels::offline::kernel!(@$s),)*
            $($ct),*
        )
    };
    (@b) => { $crate::kernels::offline::buf() };
    (@s) => { () };
}
pub(crate) use kernel;

/// `[(name, $compile(name, &kernel)), ..]` for every kernel whose passes
/// over the whole row load vectors, built at `$lanes` logits a vector (4:
/// 16-byte loads; 1: scalars), with the compile-time arguments a launch
/// passes: the kernels the WGSL and the PTX tests read for vector loads.
/// `$compile` is a function generic over the kernel type.
macro_rules! vector_row_kernels {
    ($lanes:expr, $compile:path) => {{
        use $crate::kernels::cube::{
            CODES_NONE, CODES_OWN, argmax_part_rows, argmax_rows, kept_sums_part_rows,
            min_p_dist_full_rows, top_p_dist_full_rows, top_p_histogram_part_rows,
            top_p_kept_part_rows, top_p_mask_rows, topk_compact_part_rows, topk_rows,
        };
        use $crate::kernels::launch::UNITS;
        use $crate::kernels::{HISTORY_MAX, TOP_K_MAX};
        let lanes: usize = $lanes;
        let units = UNITS as usize;
        [
            (
                "argmax_part_rows",
                $compile(
                    "argmax_part_rows",
                    &$crate::kernels::offline::kernel!(argmax_part_rows::ArgmaxPartRows::new, UNITS, [b b b b b], [s s s], lanes, units, 0u32),
                ),
            ),
            (
                "argmax_rows",
                $compile(
                    "argmax_rows",
                    &$crate::kernels::offline::kernel!(argmax_rows::ArgmaxRows::new, UNITS, [b b b b], [s s], lanes, units, CODES_OWN),
                ),
            ),
            (
                "topk_rows",
                $compile(
                    "topk_rows",
                    &$crate::kernels::offline::kernel!(
                        topk_rows::TopkRows::new,
                        UNITS,
                        [b b b b b b b b b b b b b b b b],
                        [s s s s s s s s s],
                        lanes,
                        units,
                        TOP_K_MAX,
                        true,
                        HISTORY_MAX,
                        false
                    ),
                ),
            ),
            (
                "topk_compact_part_rows",
                $compile(
                    "topk_compact_part_rows",
                    &$crate::kernels::offline::kernel!(
                        topk_compact_part_rows::TopkCompactPartRows::new,
                        UNITS,
                        [b b b b b],
                        [s s s],
                        lanes,
                        units,
                        TOP_K_MAX
                    ),
                ),
            ),
            (
                "top_p_dist_full_rows",
                $compile(
                    "top_p_dist_full_rows",
                    &$crate::kernels::offline::kernel!(
                        top_p_dist_full_rows::TopPDistFullRows::new,
                        UNITS,
                        [b b b b b b b b b b b b b],
                        [s s s s s s],
                        lanes,
                        units,
                        true,
                        CODES_OWN,
                        false,
                        false
                    ),
                ),
            ),
            (
                "top_p_dist_full_rows (cut only)",
                $compile(
                    "top_p_dist_full_rows (cut only)",
                    &$crate::kernels::offline::kernel!(
                        top_p_dist_full_rows::TopPDistFullRows::new,
                        UNITS,
                        [b b b b b b b b b b b b b],
                        [s s s s s s],
                        lanes,
                        units,
                        false,
                        CODES_NONE,
                        false,
                        true
                    ),
                ),
            ),
            (
                "top_p_mask_rows",
                $compile(
                    "top_p_mask_rows",
                    &$crate::kernels::offline::kernel!(top_p_mask_rows::TopPMaskRows::new, UNITS, [b b b], [s s s], lanes),
                ),
            ),
            (
                "min_p_dist_full_rows",
                $compile(
                    "min_p_dist_full_rows",
                    &$crate::kernels::offline::kernel!(
                        min_p_dist_full_rows::MinPDistFullRows::new,
                        UNITS,
                        [b b b b b b b b b b b b],
                        [s s s s s s],
                        lanes,
                        units,
                        true,
                        CODES_OWN,
                        false,
                        false
                    ),
                ),
            ),
            (
                "kept_sums_part_rows",
                $compile(
                    "kept_sums_part_rows",
                    &$crate::kernels::offline::kernel!(
                        kept_sums_part_rows::KeptSumsPartRows::new,
                        UNITS,
                        [b b b b b b b b],
                        [s s s],
                        lanes,
                        units,
                        true,
                        false
                    ),
                ),
            ),
            (
                "top_p_kept_part_rows",
                $compile(
                    "top_p_kept_part_rows",
                    &$crate::kernels::offline::kernel!(
                        top_p_kept_part_rows::TopPKeptPartRows::new,
                        UNITS,
                        [b b b b b b b b b],
                        [s s s],
                        lanes,
                        units,
                        true
                    ),
                ),
            ),
            (
                "top_p_histogram_part_rows",
                $compile(
                    "top_p_histogram_part_rows",
                    &$crate::kernels::offline::kernel!(
                        top_p_histogram_part_rows::TopPHistogramPartRows::new,
                        UNITS,
                        [b b b b b],
                        [s s s],
                        lanes,
                        units
                    ),
                ),
            ),
        ]
    }};
}
pub(crate) use vector_row_kernels;

/// The WGSL wgpu runs for the row passes that read vectors: the row is
/// bound and read as 16-byte vectors (`array<vec4<f32>>`) when launched
/// with 4 lanes, as scalars with 1.
#[cfg(feature = "wgpu")]
mod wgsl {
    use burn_cubecl::cubecl::wgpu::WgslCompiler;
    use burn_cubecl::cubecl::{Compiler, CubeKernel, WgpuCompilationOptions};

    fn wgsl(name: &str, kernel: &impl CubeKernel) -> String {
        WgslCompiler
            .compile(kernel.define(), &WgpuCompilationOptions::default())
            .unwrap_or_else(|e| panic!("{name} does not compile to WGSL: {e:?}"))
            .to_string()
    }

    /// No kernel binds more storage buffers than
    /// [`crate::kernels::KERNEL_BUFFERS_MAX`] (its arrays and the buffer of
    /// its scalars), the limit the launches check a device against; the
    /// top-k kernel (the one with the most arrays) binds exactly that many.
    #[test]
    fn no_kernel_binds_more_buffers_than_the_checked_limit() {
        use crate::kernels::KERNEL_BUFFERS_MAX;
        for (name, text) in super::vector_row_kernels!(4, wgsl) {
            let bound = text.matches("@binding(").count();
            assert!(
                bound <= KERNEL_BUFFERS_MAX as usize,
                "{name} binds {bound} buffers"
            );
            if name == "topk_rows" {
                assert_eq!(bound, KERNEL_BUFFERS_MAX as usize, "{name}");
            }
        }
    }

    #[test]
    fn row_passes_load_16_byte_vectors() {
        for lanes in [4usize, 1] {
            for (name, text) in super::vector_row_kernels!(lanes, wgsl) {
                let vector = text.contains("array<vec4<f32>>");
                assert_eq!(
                    vector,
                    lanes == 4,
                    "{name} at {lanes} lanes: vec4 bindings {vector}:\n{text}"
                );
            }
        }
    }
}
