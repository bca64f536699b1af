//! The unsplit kernels' chunk pass (`top_p`'s read 3, `min_p`'s read 2),
//! read coalesced.
//!
//! The draw needs one 64-bit sum per chunk of consecutive positions (it
//! finds the chunk holding `u·W` from the chunks' prefix in position
//! order, then walks that chunk alone), so the row is cut into `CUBE_DIM`
//! chunks ([`chunk_bounds`]) and thread `t` ends holding chunk `t`'s sum.
//! A thread that read its own chunk alone made every load of a warp touch
//! 32 cache lines, 16 bytes of each. Here [`CHUNK_READERS`] neighbouring
//! threads read a chunk together, thread `q` of them taking vectors `q`,
//! `q + CHUNK_READERS`, ... of it (16-byte vectors: 128 consecutive bytes
//! a load for the eight, so a warp's 32 lanes touch 4 whole lines), with
//! [`LOADS_IN_FLIGHT`](super::super::common::LOADS_IN_FLIGHT) loads issued
//! before the first is used. The workgroup takes `CUBE_DIM /
//! CHUNK_READERS` chunks at a time, `CHUNK_READERS` rounds in all; each
//! reader adds its share into the chunk's shared 64-bit pair
//! ([`wide_atomic_add`]), the same integers in any order, so the chunks'
//! sums, and the tokens, are those of one thread a chunk.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{chunk_bounds, clear_atomics};
use super::draw::{Cut, RowHead, kept_weight_sum_vec};
use super::fixed::wide_atomic_add;
use super::split::nucleus_sum_vec;

/// Threads that read one chunk together (fewer where the workgroup has
/// fewer threads).
pub(crate) const CHUNK_READERS: u32 = 8;

/// Chunk `UNIT_POS`'s 64-bit `dist` weight `(hi, lo)` over the row's
/// `row_v` vectors, every chunk read by [`CHUNK_READERS`] threads. With
/// `nucleus`, `top_p`'s read 3 ([`nucleus_sum_vec`]: the weights above
/// the crossing bin `cb`, the crossing bin's logits gathered through
/// `count` / `gathered`; `cut` unread); without, the weights of the logits
/// `cut` keeps ([`kept_weight_sum_vec`]; `cb`, `count`, `gathered`
/// unread). `sums` holds `2 · CUBE_DIM` words of scratch. Every thread
/// calls; it ends with a barrier (so `gathered` and `count` may be read
/// after it).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_sums<N: Size>(
    logits: &[Vector<f32, N>],
    head: &RowHead,
    cut: &Cut,
    cb: u32,
    row_v: u32,
    sums: &Shared<[Atomic<u32>]>,
    count: &Shared<[Atomic<u32>]>,
    gathered: &mut Shared<[u32]>,
    #[comptime] units: usize,
    #[comptime] nucleus: bool,
    #[comptime] min_p: bool,
) -> (u32, u32) {
    let readers = comptime!(if (units as u32) < CHUNK_READERS {
        units as u32
    } else {
        CHUNK_READERS
    });
    let tid = UNIT_POS;
    clear_atomics(sums, 2u32 * CUBE_DIM);
    sync_cube();
    let lane = tid % readers;
    let group = tid / readers;
    let groups = CUBE_DIM / readers;
    for r in 0..readers {
        let c = r * groups + group;
        let (vs, ve) = chunk_bounds(c, row_v);
        let mut h = 0u32;
        let mut l = 0u32;
        if comptime!(nucleus) {
            let (h2, l2) =
                nucleus_sum_vec::<N>(logits, head, cb, vs, ve, lane, readers, count, gathered);
            h = h2;
            l = l2;
        } else {
            let (h2, l2) =
                kept_weight_sum_vec::<N>(logits, head, cut, vs, ve, lane, readers, min_p);
            h = h2;
            l = l2;
        }
        if h > 0u32 || l > 0u32 {
            wide_atomic_add(sums, 2u32 * c, h, l);
        }
    }
    sync_cube();
    (
        sums[(2u32 * tid + 1u32) as usize].load(),
        sums[(2u32 * tid) as usize].load(),
    )
}
