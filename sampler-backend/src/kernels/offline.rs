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
