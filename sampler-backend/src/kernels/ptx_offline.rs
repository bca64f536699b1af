//! Every custom kernel compiled for CUDA without a GPU.
//!
//! burn's `cuda` backend compiles cubecl kernels through LLVM to PTX
//! (cubecl-llvm's NVPTX target) when a kernel is first launched. That
//! compiler needs no device: here each kernel of `cube/` is built with
//! the compile-time arguments its launch passes and compiled for the
//! compute capabilities we care about (Ampere sm_80, Hopper sm_90), so a
//! codegen error shows in CI on a machine without a GPU instead of at the
//! first step on one. The PTX is checked for the kernel's entry point and
//! its thread count. Run with `cargo test -p sampler-backend --features
//! vulkan,cuda --profile ptx-check --lib kernels::ptx_offline` (`cargo
//! test-cuda-ptx`; needs the LLVM of `.ci/install-cuda-llvm.sh` to build).

use std::ffi::CStr;

use burn_cubecl::cubecl::ir::nvidia::SmArch;
use burn_cubecl::cubecl::{Compiler, CubeKernel};
use cubecl_llvm::nvptx::ptx_version::PtxVersion;
use cubecl_llvm::{LlvmTarget, PlironArtifact, PlironCompiler, PlironOptions};

use super::cube::{
    CODES_GIVEN, CODES_NONE, CODES_OWN, ROW_WORDS, argmax_merge_rows, argmax_part_rows,
    argmax_rows, dist_rows, first_bad_rows, kept_sums_part_rows, min_p_dist_full_rows, min_p_rows,
    temperature_rows, token_codes_rows, top_p_dist_full_rows, top_p_histogram_part_rows,
    top_p_kept_part_rows, top_p_mask_rows, top_p_rows, topk_compact_part_rows, topk_floor_rows,
    topk_rows,
};
use super::launch::UNITS;
use super::offline::kernel;
use super::{HISTORY_MAX, TOP_K_MAX};

/// The PTX of `kernel` for compute capability `sm` (80, 90), as burn's CUDA
/// runtime would compile it; panics with the compiler's message on failure.
fn ptx(name: &str, kernel: &impl CubeKernel, sm: u32) -> String {
    let mut compiler = PlironCompiler {
        target: LlvmTarget::Nvptx,
    };
    let options = PlironOptions {
        sm_arch: Some(SmArch::new(sm, true)),
        // The PTX ISA of a CUDA 12.8 driver: what an H200 machine has or newer.
        ptx_version: PtxVersion::for_driver(12080),
        grid_constants: true,
        ..Default::default()
    };
    match compiler.compile(kernel.define(), &options) {
        Ok(PlironArtifact::NvptxCode(module)) => {
            // SAFETY: cubecl-llvm's PTX is NUL-terminated.
            unsafe { CStr::from_ptr(module.ptx.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        }
        Ok(_) => panic!("{name}: the NVPTX target gave no PTX"),
        Err(e) => panic!("{name} does not compile for sm_{sm}: {e}"),
    }
}

/// Compile for sm_80 and sm_90 and check the entry point and launch bounds.
fn check(name: &str, kernel: impl CubeKernel, units: u32) {
    for sm in [80, 90] {
        let text = ptx(name, &kernel, sm);
        assert!(
            text.contains(".entry") && text.contains(&format!(".target sm_{sm}")),
            "{name} sm_{sm}: no entry point for the target:\n{text}"
        );
        assert!(
            text.contains(&format!(".reqntid {units}, 1, 1"))
                || text.contains(&format!(".maxntid {units}, 1, 1")),
            "{name} sm_{sm}: launch bounds of {units} threads missing:\n{text}"
        );
    }
}

#[test]
fn top_k_compiles_with_and_without_penalties() {
    for pen in [false, true] {
        // Whole (the floor and the compaction inside) and split (their
        // results read from the kernels below).
        for split in [false, true] {
            let k = kernel!(
                topk_rows::TopkRows::new,
                UNITS,
                [b b b b b b b b b b b b b b b b],
                [s s s s s s s s s],
                4usize,
                UNITS as usize,
                TOP_K_MAX,
                pen,
                HISTORY_MAX,
                split
            );
            check(
                &format!("topk_rows (penalties {pen}, split {split})"),
                k,
                UNITS,
            );
        }
    }
    for lanes in [4usize, 1] {
        let f = kernel!(
            topk_floor_rows::TopkFloorRows::new,
            UNITS,
            [b b b],
            [s s s s s],
            lanes,
            UNITS as usize
        );
        check(&format!("topk_floor_rows ({lanes} lanes)"), f, UNITS);
        let c = kernel!(
            topk_compact_part_rows::TopkCompactPartRows::new,
            UNITS,
            [b b b b b],
            [s s s],
            lanes,
            UNITS as usize,
            TOP_K_MAX
        );
        check(&format!("topk_compact_part_rows ({lanes} lanes)"), c, UNITS);
    }
}

#[test]
fn split_greedy_segments_compile() {
    for lanes in [4usize, 1] {
        // Greedy's (nothing to zero) and the split full-row top_p's (the
        // rows' histograms zeroed).
        for clear in [0u32, ROW_WORDS] {
            let k = kernel!(
                argmax_part_rows::ArgmaxPartRows::new,
                UNITS,
                [b b b b b],
                [s s s],
                lanes,
                UNITS as usize,
                clear
            );
            check(
                &format!("argmax_part_rows ({lanes} lanes, clear {clear})"),
                k,
                UNITS,
            );
        }
        let h = kernel!(
            top_p_histogram_part_rows::TopPHistogramPartRows::new,
            UNITS,
            [b b b b b],
            [s s s],
            lanes,
            UNITS as usize
        );
        check(
            &format!("top_p_histogram_part_rows ({lanes} lanes)"),
            h,
            UNITS,
        );
        for has_t in [false, true] {
            let k = kernel!(
                top_p_kept_part_rows::TopPKeptPartRows::new,
                UNITS,
                [b b b b b b b b b],
                [s s s],
                lanes,
                UNITS as usize,
                has_t
            );
            check(
                &format!("top_p_kept_part_rows ({lanes} lanes, t {has_t})"),
                k,
                UNITS,
            );
        }
        for (has_t, keep_all) in [(true, false), (true, true), (false, true)] {
            let s = kernel!(
                kept_sums_part_rows::KeptSumsPartRows::new,
                UNITS,
                [b b b b b b b b],
                [s s s],
                lanes,
                UNITS as usize,
                has_t,
                keep_all
            );
            check(
                &format!("kept_sums_part_rows ({lanes} lanes, t {has_t}, all {keep_all})"),
                s,
                UNITS,
            );
        }
    }
}

/// The row passes at 4 lanes (greedy, top-k, the fused full-row cuts) load
/// 16-byte vectors, at least
/// `LOADS_IN_FLIGHT` of them in the unrolled loop (`ld.global.v4`, or
/// `ld.global.nc.v4` through the read-only path).
#[test]
fn row_passes_load_16_byte_vectors() {
    fn sm_90(name: &str, kernel: &impl CubeKernel) -> String {
        ptx(name, kernel, 90)
    }
    for (name, text) in super::offline::vector_row_kernels!(4, sm_90) {
        let loads = text
            .lines()
            .filter(|l| l.contains("ld.global") && l.contains(".v4."))
            .count();
        assert!(
            loads >= super::cube::LOADS_IN_FLIGHT as usize,
            "{name}: {loads} 16-byte loads:\n{text}"
        );
    }
}

#[test]
fn selecting_kernels_compile_for_every_status_mode() {
    for codes in [CODES_NONE, CODES_OWN, CODES_GIVEN] {
        let a = kernel!(
            argmax_rows::ArgmaxRows::new,
            UNITS,
            [b b b b],
            [s s],
            4usize,
            UNITS as usize,
            codes
        );
        check(&format!("argmax_rows (codes {codes})"), a, UNITS);
        let m = kernel!(
            argmax_merge_rows::ArgmaxMergeRows::new,
            64,
            [b b b b b b],
            [s s],
            64usize,
            codes
        );
        check(&format!("argmax_merge_rows (codes {codes})"), m, 64);
        let d = kernel!(
            dist_rows::DistRows::new,
            UNITS,
            [b b b b b],
            [s s],
            TOP_K_MAX,
            UNITS as usize,
            codes
        );
        check(&format!("dist_rows (codes {codes})"), d, UNITS);
        // 16-byte vectors, and scalars (a width not a multiple of 4).
        // Unsplit at 4 lanes without a temperature; unsplit and split with
        // one at 4 lanes and at 1.
        let shapes = [
            (false, 4usize, false),
            (true, 4, false),
            (true, 4, true),
            (true, 1, false),
            (true, 1, true),
        ];
        for (has_t, lanes, split) in shapes {
            let t = kernel!(
                top_p_dist_full_rows::TopPDistFullRows::new,
                UNITS,
                [b b b b b b b b b b b b b],
                [s s s s s s],
                lanes,
                UNITS as usize,
                has_t,
                codes,
                split,
                false
            );
            check(
                &format!(
                    "top_p_dist_full_rows (codes {codes}, t {has_t}, {lanes} lanes, split {split})"
                ),
                t,
                UNITS,
            );
            for keep_all in [false, true] {
                let m = kernel!(
                    min_p_dist_full_rows::MinPDistFullRows::new,
                    UNITS,
                    [b b b b b b b b b b b b],
                    [s s s s s s],
                    lanes,
                    UNITS as usize,
                    has_t,
                    codes,
                    keep_all,
                    split
                );
                check(
                    &format!(
                        "min_p_dist_full_rows (codes {codes}, t {has_t}, all {keep_all}, {lanes} lanes, split {split})"
                    ),
                    m,
                    UNITS,
                );
            }
        }
    }
}

#[test]
fn filtering_and_validating_kernels_compile() {
    let p = kernel!(
        top_p_rows::TopPRows::new,
        UNITS,
        [b b b b b],
        [s],
        TOP_K_MAX
    );
    check("top_p_rows", p, UNITS);
    let f = kernel!(
        first_bad_rows::FirstBadRows::new,
        UNITS,
        [b b],
        [s],
        UNITS as usize
    );
    check("first_bad_rows", f, UNITS);
    // The unfused full-row top_p: the fused kernel cut only, unsplit and
    // split, then the row write.
    for (lanes, split) in [(4usize, false), (4, true), (1, false), (1, true)] {
        let cut = kernel!(
            top_p_dist_full_rows::TopPDistFullRows::new,
            UNITS,
            [b b b b b b b b b b b b b],
            [s s s s s s],
            lanes,
            UNITS as usize,
            false,
            CODES_NONE,
            split,
            true
        );
        let name = format!("top_p_dist_full_rows (cut only, {lanes} lanes, split {split})");
        check(&name, cut, UNITS);
        let mask = kernel!(top_p_mask_rows::TopPMaskRows::new, UNITS, [b b b], [s s s], lanes);
        check(&format!("top_p_mask_rows ({lanes} lanes)"), mask, UNITS);
    }
    let codes = kernel!(
        token_codes_rows::TokenCodesRows::new,
        UNITS,
        [b b b],
        [s s]
    );
    check("token_codes_rows", codes, UNITS);
    for has_ids in [false, true] {
        let t = kernel!(
            temperature_rows::TemperatureRows::new,
            UNITS,
            [b b b b],
            [s s],
            has_ids,
            UNITS as usize
        );
        check(&format!("temperature_rows (ids {has_ids})"), t, UNITS);
        let m = kernel!(
            min_p_rows::MinPRows::new,
            UNITS,
            [b b b b b],
            [s],
            UNITS as usize,
            has_ids
        );
        check(&format!("min_p_rows (ids {has_ids})"), m, UNITS);
    }
}
