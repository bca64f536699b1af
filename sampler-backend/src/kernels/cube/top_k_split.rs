//! The top-k kernel's first two passes: the floor from a sample spread
//! over the row ([`sample_floor`]) and the compaction of the logits at or
//! above it ([`compact_range`]), inlined in `topk_rows` at large batches,
//! or below a batch that fills the device as kernels of their own:
//! `topk_floor_rows` (one workgroup a row reads the sample) and
//! `topk_compact_part_rows` (grid `(segments, B)`: each workgroup compacts
//! its segment into shared memory, then into the row's global slots at an
//! offset taken with one global atomic add). `topk_rows` with `split` then
//! ranks the row's slots without reading the row (unless they overflowed).
//! The candidates are the same set in another order, and the rank does not
//! depend on the order: the same top k at any split.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{
    LOADS_IN_FLIGHT, NEG_INF_KEY, note_bad, order_key, segment_vectors, shared_min,
};

/// Row `CUBE_POS_X`'s floor ([`sample_floor`]) into `floor_out`, and its
/// candidate count in `count` zeroed for `topk_compact_part_rows`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn topk_floor_rows<N: Size>(
    logits: &[Vector<f32, N>],
    floor_out: &mut [u32],
    count: &mut [u32],
    width: u32,
    lanes: u32,
    sample_end: u32,
    sample_stride: u32,
    k: u32,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X;
    let row_v = width / lanes;
    let mut tmax = Shared::<[u32]>::new_slice(units);
    let mut floor = Shared::<[u32]>::new_slice(1usize);
    let low = sample_floor::<N>(
        logits,
        row * row_v,
        row_v,
        sample_end,
        sample_stride,
        k,
        &mut tmax,
        &mut floor,
    );
    if UNIT_POS == 0u32 {
        floor_out[row as usize] = low;
        count[row as usize] = 0u32;
    }
}

/// Segment `CUBE_POS_X` (of `CUBE_COUNT_X`, `seg` vectors of `N = lanes`
/// logits each) of row `CUBE_POS_Y`: its keys at or above the row's floor
/// (`floor_in`) compacted into shared memory ([`compact_range`], up to
/// `k_cap`), then copied into the row's `k_cap` global slots of `cand`
/// (`(key, position)` pairs) at an offset taken from the row's `count` (one
/// global atomic add a workgroup, of every key it found: a count above
/// `k_cap` tells `topk_rows` the slots overflowed); the segment's first
/// validation key into `part_bad` at `row · segments + segment`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn topk_compact_part_rows<N: Size>(
    logits: &[Vector<f32, N>],
    floor_in: &[u32],
    count: &mut [Atomic<u32>],
    cand: &mut [u32],
    part_bad: &mut [u32],
    width: u32,
    seg: u32,
    lanes: u32,
    #[comptime] units: usize,
    #[comptime] k_cap: usize,
) {
    let part = CUBE_POS_X;
    let row = CUBE_POS_Y;
    let parts = CUBE_COUNT_X;
    let tid = UNIT_POS;
    let row_v = width / lanes;
    let (start, end) = segment_vectors(part, seg, row_v);
    let mut cand_key = Shared::<[u32]>::new_slice(k_cap);
    let mut cand_pos = Shared::<[u32]>::new_slice(k_cap);
    let counter = Shared::<[Atomic<u32>]>::new_slice(1usize);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut offset = Shared::<[u32]>::new_slice(1usize);
    if tid == 0u32 {
        counter[0].store(0u32);
    }
    sync_cube();
    let bad = compact_range::<N>(
        logits,
        row * row_v,
        start,
        end,
        lanes,
        floor_in[row as usize],
        2u32 * width,
        &counter,
        &mut cand_key,
        &mut cand_pos,
        k_cap,
    );
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    let mine = counter[0].load();
    if tid == 0u32 {
        part_bad[(row * parts + part) as usize] = bads[0];
        let mut first = 0u32;
        if mine > 0u32 {
            first = count[row as usize].fetch_add(mine);
        }
        offset[0] = first;
    }
    sync_cube();
    let first = offset[0];
    let held = select(mine < k_cap as u32, mine, k_cap as u32);
    let mut c = tid;
    while c < held && first + c < k_cap as u32 {
        let at = 2u32 * (row * k_cap as u32 + first + c);
        cand[at as usize] = cand_key[c as usize];
        cand[(at + 1u32) as usize] = cand_pos[c as usize];
        c += CUBE_DIM;
    }
}

/// A floor under the `k`-th largest key of the row whose first vector is
/// `base` (`row_v` vectors): the `k`-th largest of the threads' own maxima
/// over a sample (`k` distinct elements at or above it); 0 (no floor) when
/// `k` exceeds the threads. Keys below it are never among the top `k`.
///
/// Float compares (cheaper than keys): any element of the thread is a
/// valid stand-in for its maximum, so a device that flushes subnormals only
/// lowers the floor. A thread without elements offers -inf, the lowest
/// non-NaN key, which keeps the floor at or below every element. The
/// sample is `sample_end` vectors chosen by the host (`floor_sample`): runs
/// of CUBE_DIM consecutive vectors (one coalesced load per thread),
/// `sample_stride >= CUBE_DIM` apart, so it spreads over the whole row. A
/// prefix would not do: vocabularies are ordered by id (byte and special
/// tokens first, then bands of frequency), and a prefix of unlikely tokens
/// gives a floor far below the row's k-th logit, with thousands of logits
/// above it. Any k distinct elements give a valid floor (the runs never
/// overlap), and a short sample keeps this pass a small part of a read.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn sample_floor<N: Size>(
    logits: &[Vector<f32, N>],
    base: u32,
    row_v: u32,
    sample_end: u32,
    sample_stride: u32,
    k: u32,
    tmax: &mut Shared<[u32]>,
    floor: &mut Shared<[u32]>,
) -> u32 {
    let tid = UNIT_POS;
    let mut own_f = f32::reinterpret(0xFF80_0000u32);
    let mut run = 0u32;
    while run * CUBE_DIM + tid < sample_end {
        let at = run * sample_stride + tid;
        if at < row_v {
            let v = logits[(base + at) as usize];
            #[unroll]
            for j in 0..N::value() {
                let x = v.extract(j);
                if x > own_f {
                    own_f = x;
                }
            }
        }
        run += 1u32;
    }
    let own = order_key(own_f);
    tmax[tid as usize] = own;
    if tid == 0u32 {
        floor[0] = 0u32;
    }
    sync_cube();
    if k <= CUBE_DIM {
        let mut rank = 0u32;
        for t in 0..CUBE_DIM {
            let o = tmax[t as usize];
            if o > own || (o == own && t < tid) {
                rank += 1u32;
            }
        }
        if rank == k - 1u32 {
            floor[0] = own;
        }
    }
    sync_cube();
    floor[0]
}

/// The vectors `start..end` of the row whose first vector is `base`
/// compacted ([`compact_vector`]: every key at or above the floor `low`
/// into `cand_key` / `cand_pos`, counted by `counter`) and validated: each
/// thread takes vectors CUBE_DIM apart, [`LOADS_IN_FLIGHT`] loaded before
/// the first is used (ascending positions within the thread); returns the
/// thread's first validation key (`none` without a NaN / `+inf`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn compact_range<N: Size>(
    logits: &[Vector<f32, N>],
    base: u32,
    start: u32,
    end: u32,
    lanes: u32,
    low: u32,
    none: u32,
    counter: &Shared<[Atomic<u32>]>,
    cand_key: &mut Shared<[u32]>,
    cand_pos: &mut Shared<[u32]>,
    #[comptime] k_cap: usize,
) -> u32 {
    // The floor as a logit: `x >= low_f` keeps a superset of `key >= low`
    // (flushed subnormals compare equal, never in the wrong order); the keys
    // decide. No floor (0) or one at -inf: every non-NaN logit passes.
    let low_bits = select(
        (low & 0x8000_0000u32) != 0u32,
        low & 0x7FFF_FFFFu32,
        low ^ 0xFFFF_FFFFu32,
    );
    let low_f = select(
        low <= NEG_INF_KEY,
        f32::reinterpret(0xFF80_0000u32),
        f32::reinterpret(low_bits),
    );
    let mut bad = none;
    let step = CUBE_DIM;
    let mut ic = start + UNIT_POS;
    while ic + (LOADS_IN_FLIGHT - 1u32) * step < end {
        let v0 = logits[(base + ic) as usize];
        let v1 = logits[(base + ic + step) as usize];
        let v2 = logits[(base + ic + 2u32 * step) as usize];
        let v3 = logits[(base + ic + 3u32 * step) as usize];
        bad = compact_vector::<N>(
            v0,
            ic * lanes,
            low,
            low_f,
            bad,
            none,
            counter,
            cand_key,
            cand_pos,
            k_cap,
        );
        bad = compact_vector::<N>(
            v1,
            (ic + step) * lanes,
            low,
            low_f,
            bad,
            none,
            counter,
            cand_key,
            cand_pos,
            k_cap,
        );
        bad = compact_vector::<N>(
            v2,
            (ic + 2u32 * step) * lanes,
            low,
            low_f,
            bad,
            none,
            counter,
            cand_key,
            cand_pos,
            k_cap,
        );
        bad = compact_vector::<N>(
            v3,
            (ic + 3u32 * step) * lanes,
            low,
            low_f,
            bad,
            none,
            counter,
            cand_key,
            cand_pos,
            k_cap,
        );
        ic += LOADS_IN_FLIGHT * step;
    }
    while ic < end {
        let v = logits[(base + ic) as usize];
        bad = compact_vector::<N>(
            v,
            ic * lanes,
            low,
            low_f,
            bad,
            none,
            counter,
            cand_key,
            cand_pos,
            k_cap,
        );
        ic += step;
    }
    bad
}

/// The compaction of one vector of `N` logits at positions `at..at + N`:
/// each lane at or above the floor (`low_f` as a logit, `low` as a key)
/// takes a slot of `cand_key` / `cand_pos` (up to `k_cap`; `counter` counts
/// every one); returns the thread's first validation key after the lanes
/// (`bad`, `none` before a hit).
#[cube]
#[allow(clippy::too_many_arguments)]
fn compact_vector<N: Size>(
    v: Vector<f32, N>,
    at: u32,
    low: u32,
    low_f: f32,
    bad: u32,
    none: u32,
    counter: &Shared<[Atomic<u32>]>,
    cand_key: &mut Shared<[u32]>,
    cand_pos: &mut Shared<[u32]>,
    #[comptime] k_cap: usize,
) -> u32 {
    let mut b = bad;
    let mut i = at;
    #[unroll]
    for j in 0..N::value() {
        let x = v.extract(j);
        b = note_bad(b, x, i, none);
        if x >= low_f {
            let key = order_key(x);
            if key >= low {
                let slot = counter[0].fetch_add(1u32);
                if slot < k_cap as u32 {
                    cand_key[slot as usize] = key;
                    cand_pos[slot as usize] = i;
                }
            }
        }
        i += 1u32;
    }
    b
}
