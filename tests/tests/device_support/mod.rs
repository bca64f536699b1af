//! Shared helpers of the device conformance tests (`device_*.rs`): the
//! compiled-in devices, the CPU reference, and the tie-boundary detector.
#![allow(dead_code)]

use sampler_backend::burn_tensor::{Device, Tensor, TensorData};
use sampler_backend::{Executor, StepOutput};
use sampler_core::{ChainSpec, OffloadPolicy, SampleError, TokenId};

/// Run one test body on every device compiled into this test binary.
/// GPU devices that cannot start print why and skip.
#[macro_export]
macro_rules! device_tests {
    ($($name:ident),* $(,)?) => {
        #[cfg(feature = "flex")]
        mod flex {
            $( #[test] fn $name() { if let Some(d) = $crate::device_support::device("flex") { super::$name(&d, "flex"); } } )*
        }
        #[cfg(feature = "ndarray")]
        mod ndarray {
            $( #[test] fn $name() { if let Some(d) = $crate::device_support::device("ndarray") { super::$name(&d, "ndarray"); } } )*
        }
        #[cfg(feature = "wgpu")]
        mod wgpu {
            $( #[test] fn $name() { if let Some(d) = $crate::device_support::device("wgpu") { super::$name(&d, "wgpu"); } } )*
        }
        #[cfg(feature = "vulkan")]
        mod vulkan {
            $( #[test] fn $name() { if let Some(d) = $crate::device_support::device("vulkan") { super::$name(&d, "vulkan"); } } )*
        }
        #[cfg(feature = "cuda")]
        mod cuda {
            $( #[test] fn $name() { if let Some(d) = $crate::device_support::device("cuda") { super::$name(&d, "cuda"); } } )*
        }
    };
}

/// The device named `name`, or `None` (with a printed reason) when it cannot
/// start on this machine (no GPU adapter, no driver).
///
/// `wgpu` on a software adapter that cannot bind the custom kernels' buffers
/// (OpenGL's llvmpipe, on a machine without Vulkan) is skipped too: its
/// stages would run the generic recipes, many times slower than on
/// lavapipe, and test nothing of the kernels.
pub fn device(name: &str) -> Option<Device> {
    match sampler_backend::probe_device(name) {
        Ok(d)
            if name == "wgpu"
                && sampler_backend::is_software_device(&d)
                && !sampler_backend::kernels::runs_on(&d) =>
        {
            println!(
                "SKIP {name}: only a software adapter that cannot bind the custom kernels' {} \
                 storage buffers (OpenGL's llvmpipe?); install Mesa's lavapipe \
                 (.ci/install-lavapipe.sh) to run the device tests",
                sampler_backend::kernels::KERNEL_BUFFERS_MAX
            );
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            println!("SKIP {name}: {e}");
            None
        }
    }
}

/// The cubecl device the kernel tests run on: `SAMPLER_TEST_DEVICE` when
/// set (`wgpu`, `vulkan`, `cuda`), else the first compiled in of wgpu,
/// vulkan and cuda; `None` (with a printed reason) when it cannot start.
pub fn cubecl_device() -> Option<(Device, &'static str)> {
    let compiled = sampler_backend::compiled_devices();
    let name = match std::env::var("SAMPLER_TEST_DEVICE") {
        Ok(want) => match ["wgpu", "vulkan", "cuda"].into_iter().find(|d| *d == want) {
            Some(name) => name,
            None => {
                println!("SKIP: SAMPLER_TEST_DEVICE={want} is not a cubecl device");
                return None;
            }
        },
        Err(_) => ["wgpu", "vulkan", "cuda"]
            .into_iter()
            .find(|d| compiled.contains(d))?,
    };
    device(name).map(|d| (d, name))
}

/// `ln(p)` per entry (llama.cpp's probability constructor).
pub fn ln(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

/// Upload `[b, v]` logits.
pub fn upload(logits: &[f32], b: usize, v: usize, device: &Device) -> Tensor<2> {
    Tensor::<2>::from_data(TensorData::new(logits.to_vec(), [b, v]), device)
}

/// One device step on a fresh executor.
pub fn device_step(
    rows: &[ChainSpec],
    logits: &[f32],
    v: usize,
    device: &Device,
    policy: OffloadPolicy,
    prompts: &[Vec<TokenId>],
) -> (StepOutput, Executor) {
    let mut ex = Executor::new(rows.to_vec(), v, device, policy).expect("executor");
    for (r, p) in prompts.iter().enumerate() {
        ex.accept_prompt(r, p).expect("row in range");
    }
    let out = ex
        .step(upload(logits, rows.len(), v, device))
        .expect("step");
    (out, ex)
}

/// The CPU reference for one step.
pub fn cpu_step(
    rows: &[ChainSpec],
    logits: &[f32],
    v: usize,
    prompts: &[Vec<TokenId>],
) -> Vec<Result<TokenId, SampleError>> {
    let mut chains: Vec<_> = rows
        .iter()
        .map(|s| sampler_cpu::build_chain(s).expect("cpu chain"))
        .collect();
    for (c, p) in chains.iter_mut().zip(prompts) {
        c.accept_prompt(p);
    }
    sampler_cpu::sample_batch(logits, rows.len(), v, &mut chains).expect("cpu batch")
}

#[allow(unused_imports)]
pub use conformance::boundary_reason;
