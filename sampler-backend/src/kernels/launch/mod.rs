//! The host side of the kernels: each file launches the kernel(s) of one
//! op (same file names as in `cube/`); this file holds the glue they
//! share: a burn tensor resolved to its contiguous cubecl tensor (pending
//! ops run first), threads per row for a device, new outputs and the grid
//! of one cube a row, the status-code mode of a selecting kernel, and each
//! output registered with burn's fusion stream (as uploaded data is), so
//! later ops see an ordinary tensor.

use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{Cube, CubeBackend};
use burn_fusion::stream::StreamId;
use burn_fusion::{FusionTensor, NoOp};
use burn_ir::{BackendIr, InitOperationIr, OperationIr};
use burn_tensor::{DType, Int, Shape, Tensor};

use super::cube::{CODES_GIVEN, CODES_NONE, CODES_OWN};
use super::{KERNEL_BUFFERS_MAX, TokenCodes, busy_workgroups, enabled, row_segments};

mod argmax;
mod cut_dist;
mod first_bad;
mod min_p;
mod narrow;
mod temperature;
mod token_codes;
mod top_k;
mod top_p_full;

pub(crate) use argmax::{argmax, greedy_segments};
pub(crate) use cut_dist::cut_dist_full;
pub(crate) use first_bad::first_bad;
pub(crate) use min_p::min_p;
pub(crate) use narrow::{dist, top_p};
pub(crate) use temperature::temperature;
pub(crate) use token_codes::token_codes;
pub(crate) use top_k::top_k;
pub(crate) use top_p_full::top_p_full;

/// Threads per row (one workgroup per row). A power of two.
pub(crate) const UNITS: u32 = 256;

type FusionRuntime = burn_cubecl::fusion::FusionCubeRuntime;
type FusionClient = burn_fusion::Client<FusionRuntime>;

/// The contiguous cubecl tensor under a float tensor, with its pending ops
/// executed, and its fusion client; `None` off the cubecl backends.
fn resolve_float(t: &Tensor<2>) -> Option<(CubeTensor, FusionClient)> {
    if !enabled() {
        return None;
    }
    let fused: FusionTensor<FusionRuntime> = t.clone().try_into_primitive::<Cube>().ok()?;
    let client = fused.client.clone();
    let cube = client.resolve_tensor_float::<CubeBackend>(fused);
    if !binds_enough(&cube) {
        return None;
    }
    Some((into_contiguous(cube), client))
}

/// [`crate::kernels::runs_on`]: whether a tiny tensor on `device` is a
/// cubecl tensor on a device that [`binds_enough`].
pub(crate) fn runs_on(device: &burn_tensor::Device) -> bool {
    let t = Tensor::<2>::zeros([1, 1], device);
    let Ok(fused) = t.try_into_primitive::<Cube>() else {
        return false;
    };
    let fused: FusionTensor<FusionRuntime> = fused;
    let client = fused.client.clone();
    binds_enough(&client.resolve_tensor_float::<CubeBackend>(fused))
}

/// Whether `cube`'s device lets a kernel bind [`KERNEL_BUFFERS_MAX`]
/// storage buffers (cubecl's `max_bindings` leaves one of the device's
/// limit to wgpu's own buffer): every kernel launch resolves its logits
/// through [`resolve_float`], so on a device that does not (wgpu on
/// OpenGL) each stage falls back to its generic recipe.
fn binds_enough(cube: &CubeTensor) -> bool {
    cube.client
        .properties()
        .hardware
        .max_bindings
        .saturating_add(1)
        >= KERNEL_BUFFERS_MAX
}

/// The contiguous cubecl tensor under an int tensor, pending ops executed,
/// and its fusion client.
fn resolve_int_client<const D: usize>(t: &Tensor<D, Int>) -> Option<(CubeTensor, FusionClient)> {
    let fused: FusionTensor<FusionRuntime> = t.clone().try_into_primitive::<Cube>().ok()?;
    let client = fused.client.clone();
    let cube = into_contiguous(client.resolve_tensor_int::<CubeBackend>(fused));
    Some((cube, client))
}

/// The contiguous cubecl tensor under an int tensor, pending ops executed.
fn resolve_int(t: &Tensor<2, Int>) -> Option<CubeTensor> {
    Some(resolve_int_client(t)?.0)
}

/// An optional input resolved by `resolve`: `Some(None)` without one,
/// `None` when it does not resolve.
fn resolve_optional<T, U>(
    input: Option<T>,
    resolve: impl FnOnce(T) -> Option<U>,
) -> Option<Option<U>> {
    match input {
        Some(x) => Some(Some(resolve(x)?)),
        None => Some(None),
    }
}

/// A new contiguous output `dims` of `dtype` on `like`'s device (not
/// initialised: the kernel writes every element).
fn output<const D: usize>(like: &CubeTensor, dims: [usize; D], dtype: DType) -> CubeTensor {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new(dims),
        dtype,
    )
}

/// One cube of `units` threads per row, `b` rows.
fn per_row(b: usize, units: u32) -> (CubeCount, CubeDim) {
    (CubeCount::Static(b as u32, 1, 1), CubeDim::new_1d(units))
}

/// Register a kernel's output with the fusion stream (as uploaded data is),
/// so that later ops see an ordinary tensor.
fn register(out: CubeTensor, client: &FusionClient) -> FusionTensor<FusionRuntime> {
    let shape = out.meta.shape().clone();
    let dtype = out.dtype;
    let handle = <CubeBackend as BackendIr>::float_tensor_handle(out);
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    let mut outs = client.register(
        StreamId::current(),
        OperationIr::Init(desc),
        NoOp::<CubeBackend>::new(),
    );
    outs.remove(0)
}

/// A kernel's float output as a tensor ([`register`]).
fn float_tensor<const D: usize>(out: CubeTensor, fusion: &FusionClient) -> Tensor<D> {
    Tensor::<D>::from_primitive::<Cube>(register(out, fusion))
}

/// A kernel's int output as a tensor ([`register`]).
fn int_tensor<const D: usize>(out: CubeTensor, fusion: &FusionClient) -> Tensor<D, Int> {
    Tensor::<D, Int>::from_primitive::<Cube>(register(out, fusion))
}

/// Segments per row of `[b, n]` logits on `cube`'s device
/// ([`crate::kernels::row_segments`]), for greedy and the full-row cuts: a
/// software device (no physical device behind it: lavapipe) is kept busy
/// by one workgroup per CPU thread.
fn segments(cube: &CubeTensor, b: usize, n: usize) -> usize {
    let props = cube.client.properties();
    let software = props
        .identity
        .physical
        .is_none()
        .then(|| std::thread::available_parallelism().map_or(1, |t| t.get()));
    let busy = busy_workgroups(props.hardware.num_streaming_multiprocessors, software);
    row_segments(b, n, busy)
}

/// Logits per vector load for rows of `n` in `cube`: 4 (16 bytes) when
/// `n` is a multiple of 4 (every vocabulary of a real model, padded to a
/// multiple of 64 or 128), the buffer starts 16-byte aligned and the device
/// loads 4-wide vectors of `f32` well; 1 otherwise (any width still runs).
fn row_lanes(cube: &CubeTensor, n: usize) -> usize {
    const LANES: usize = 4;
    let aligned = cube
        .handle
        .offset_start
        .unwrap_or(0)
        .is_multiple_of(4 * LANES as u64);
    let wide = cube.client.io_optimized_vector_sizes(4).any(|v| v == LANES);
    if n.is_multiple_of(LANES) && aligned && wide {
        LANES
    } else {
        1
    }
}

/// Threads per row for this device: [`UNITS`], or the largest power of two
/// its workgroups allow.
fn units(cube: &CubeTensor) -> u32 {
    let max = cube.client.properties().hardware.max_units_per_cube.max(1);
    let cap = UNITS.min(max);
    if cap.is_power_of_two() {
        cap
    } else {
        cap.next_power_of_two() >> 1
    }
}

impl TokenCodes<'_> {
    /// The kernel's mode, the keys' buffer (an unread placeholder of `b`
    /// entries without keys) and the "valid row" key `2·vocab`; `None` when
    /// the keys are not on this cubecl device or `2·vocab` overflows i32.
    fn resolve(&self, cube: &CubeTensor, b: usize, width: usize) -> Option<(u32, CubeTensor, u32)> {
        let placeholder = || output(cube, [b, 1], DType::I32);
        let none = |v: usize| {
            u32::try_from(2 * v)
                .ok()
                .filter(|n| i32::try_from(*n).is_ok())
        };
        match self {
            Self::Tokens => Some((CODES_NONE, placeholder(), none(width)?)),
            Self::OwnKeys => Some((CODES_OWN, placeholder(), none(width)?)),
            Self::Keys(keys, vocab) => {
                let keys = resolve_int(keys)?;
                (keys.dtype == DType::I32 && keys.meta.shape().num_elements() == b).then_some(())?;
                Some((CODES_GIVEN, keys, none(*vocab)?))
            }
        }
    }
}
