//! The middle passes of a full-row `top_p` split over several workgroups a
//! row (grid `(segments, B)`): after `argmax_part_rows` (read 1 over the
//! segments, which also zeroes each row's global words),
//! `top_p_histogram_part_rows` (read 2: the row's mass histogram) and
//! `top_p_kept_part_rows` (read 3: the segments' kept weights, the
//! crossing bin's logits gathered); then `top_p_dist_full_rows` with
//! `split` (one workgroup a row: the crossing bin resolved, the drawn
//! segment walked), which reads none of the row but that segment.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::super::common::{
    LOADS_IN_FLIGHT, NEG_INF_KEY, clear_atomics, max_logit_vec, merge_row_parts, segment_vectors,
};
use super::draw::{RowHead, draw_weight, read_row_head};
use super::fixed::{
    first_reaching, fixed_weight, global_wide_add, histogram_range, nucleus_bin, wide_nucleus_goal,
    wide_scan, wide_total,
};
use super::{GATHERED_AT, GROUP_BINS, GROUPS_AT, HIST_GROUPS, HIST_WORDS, ROW_WORDS};
use crate::kernels::NUC_GATHER;

/// Segment `CUBE_POS_X` (of `CUBE_COUNT_X`, `seg` vectors of `N = lanes`
/// logits each) of row `CUBE_POS_Y`: the row's maximum from the segments'
/// partial results (each workgroup merges them, [`merge_row_parts`], and
/// reads the logit at its first position: the `m` of the unsplit kernel),
/// the segment's fixed-point mass histogram of `m - l` in shared memory
/// ([`histogram_range`]), then its non-empty bins added into the row's
/// global histogram `hist` (its bins, then its group sums of
/// [`GROUP_BINS`] bins each: [`ROW_WORDS`] words a row, zeroed by
/// `argmax_part_rows`): 64-bit sums as `u32` pairs, the carry of each low
/// word's atomic add into the high word, so the sums are exact and the
/// same whatever order the segments add in.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn top_p_histogram_part_rows<N: Size>(
    logits: &[Vector<f32, N>],
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    hist: &mut [Atomic<u32>],
    width: u32,
    seg: u32,
    lanes: u32,
    #[comptime] units: usize,
) {
    let part = CUBE_POS_X;
    let row = CUBE_POS_Y;
    let parts = CUBE_COUNT_X;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let pool = Shared::<[Atomic<u32>]>::new_slice(HIST_WORDS as usize);
    merge_row_parts(
        part_key,
        part_pos,
        part_bad,
        row,
        parts,
        width,
        &mut best_key,
        &mut best_pos,
        &mut bads,
    );
    let row_v = width / lanes;
    let base = row * row_v;
    let dead = best_key[0] <= NEG_INF_KEY;
    let m = max_logit_vec::<N>(logits, base, lanes, width, best_pos[0], dead);
    clear_atomics(&pool, HIST_WORDS);
    sync_cube();
    let (start, end) = segment_vectors(part, seg, row_v);
    histogram_range::<N>(logits, base, start, end, m, &pool);
    sync_cube();
    let words = row * ROW_WORDS;
    let mut b = UNIT_POS;
    while b < HIST_WORDS / 2u32 {
        let lo = pool[(2u32 * b) as usize].load();
        let hi = pool[(2u32 * b + 1u32) as usize].load();
        global_wide_add(hist, words + 2u32 * b, hi, lo);
        b += CUBE_DIM;
    }
    // The group sums: thread `g` adds its group's 32 bins.
    let g = UNIT_POS;
    if g < HIST_GROUPS {
        let mut gh = 0u32;
        let mut gl = 0u32;
        for k in 0..GROUP_BINS {
            let b = g * GROUP_BINS + k;
            let lo = pool[(2u32 * b) as usize].load();
            let hi = pool[(2u32 * b + 1u32) as usize].load();
            let nl = gl + lo;
            gh += hi + select(nl < gl, 1u32, 0u32);
            gl = nl;
        }
        global_wide_add(hist, words + GROUPS_AT + 2u32 * g, gh, gl);
    }
}

/// Row `row`'s crossing bin (1024 when the whole row is kept: `all`, or no
/// mass) from its global words, summed by `top_p_histogram_part_rows`: the
/// group sums give `S`, the goal `p·S` and the group where the mass from
/// the top first reaches it, then that group's 32 bins the bin (two
/// parallel scans, [`first_reaching`]). The bins are the same integers the
/// one-workgroup kernel scans, and the first non-empty bin whose running
/// sum reaches the goal does not depend on how the bins are grouped, so
/// this is the bin that kernel finds. Needs `CUBE_DIM >= 32`. Every thread
/// calls; all see the bin.
#[cube]
fn crossing_bin_from_groups(
    hist: &mut [Atomic<u32>],
    row: u32,
    p: f32,
    all: bool,
    #[comptime] units: usize,
) -> u32 {
    let tid = UNIT_POS;
    let mut scan_hi = Shared::<[u32]>::new_slice(units);
    let mut scan_lo = Shared::<[u32]>::new_slice(units);
    let words = row * ROW_WORDS;
    let mut h = 0u32;
    let mut l = 0u32;
    if tid < HIST_GROUPS {
        l = hist[(words + GROUPS_AT + 2u32 * tid) as usize].load();
        h = hist[(words + GROUPS_AT + 2u32 * tid + 1u32) as usize].load();
    }
    scan_hi[tid as usize] = h;
    scan_lo[tid as usize] = l;
    wide_scan(&mut scan_hi, &mut scan_lo);
    let (sh, sl) = wide_total(&scan_hi, &scan_lo);
    let pr = select(all, 1.0f32, p);
    let (goal_hi, goal_lo) = wide_nucleus_goal(pr, sh, sl);
    let (found, g, bh, bl) = first_reaching(&scan_hi, &scan_lo, goal_hi, goal_lo);
    // What the group's bins must still reach (the sum before the group is
    // short of the goal, or nothing lies before it).
    let rl = goal_lo - bl;
    let rh = goal_hi - bh - select(bl > goal_lo, 1u32, 0u32);
    let mut fh = 0u32;
    let mut fl = 0u32;
    if found && tid < GROUP_BINS {
        let b = g * GROUP_BINS + tid;
        fl = hist[(words + 2u32 * b) as usize].load();
        fh = hist[(words + 2u32 * b + 1u32) as usize].load();
    }
    scan_hi[tid as usize] = fh;
    scan_lo[tid as usize] = fl;
    wide_scan(&mut scan_hi, &mut scan_lo);
    let (in_group, k, _bh, _bl) = first_reaching(&scan_hi, &scan_lo, rh, rl);
    let mut cb = 1024u32;
    if found && in_group {
        cb = g * GROUP_BINS + k;
    }
    if all || (sh == 0u32 && sl == 0u32) {
        cb = 1024u32;
    }
    cb
}

/// Read 3 of the split full-row `top_p`: segment `CUBE_POS_X` (of
/// `CUBE_COUNT_X`, `seg` vectors of `N = lanes` logits each) of row
/// `CUBE_POS_Y`. Each workgroup merges the segments' read 1 into the row's
/// head, finds the crossing bin from the row's global histogram
/// ([`crossing_bin_from_groups`]: 512 bytes of it), then reads its segment
/// in whole vectors, coalesced: the fixed-point `dist` weights of the
/// logits above the crossing bin (all kept) summed into `sums` (the 64-bit
/// sum as `(hi, lo)` at `2·(row · parts + segment)`), the crossing bin's
/// logits gathered, first into shared memory, then into the row's slots of
/// `gather` (`(bits, position)` pairs, [`NUC_GATHER`] a row) at an offset
/// taken from the row's count (`hist` at `GATHERED_AT`, one global atomic
/// a workgroup). The count is every crossing logit of the row, so a count
/// above [`NUC_GATHER`] tells the last kernel the gather overflowed, as the
/// one-workgroup kernel's own count does.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn top_p_kept_part_rows<N: Size>(
    logits: &[Vector<f32, N>],
    p: &[f32],
    t: &[f32],
    part_key: &[u32],
    part_pos: &[u32],
    part_bad: &[u32],
    hist: &mut [Atomic<u32>],
    gather: &mut [u32],
    sums: &mut [u32],
    width: u32,
    seg: u32,
    lanes: u32,
    #[comptime] units: usize,
    #[comptime] has_t: bool,
) {
    let part = CUBE_POS_X;
    let row = CUBE_POS_Y;
    let parts = CUBE_COUNT_X;
    let tid = UNIT_POS;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let mut acc_hi = Shared::<[u32]>::new_slice(units);
    let mut acc_lo = Shared::<[u32]>::new_slice(units);
    let mut gathered = Shared::<[u32]>::new_slice((2u32 * NUC_GATHER) as usize);
    let count = Shared::<[Atomic<u32>]>::new_slice(1usize);
    let mut offset = Shared::<[u32]>::new_slice(1usize);
    let head = read_row_head::<N>(
        logits,
        t,
        part_key,
        part_pos,
        part_bad,
        parts,
        row,
        width,
        lanes,
        &mut best_key,
        &mut best_pos,
        &mut bads,
        has_t,
        true,
    );
    let all = p[row as usize] > f32::reinterpret(0x7F7F_FFFFu32);
    let cb = crossing_bin_from_groups(hist, row, p[row as usize], all, units);
    if tid == 0u32 {
        count[0].store(0u32);
    }
    sync_cube();
    let row_v = width / lanes;
    let (start, end) = segment_vectors(part, seg, row_v);
    let (h, l) = nucleus_sum_vec::<N>(
        logits,
        &head,
        cb,
        start,
        end,
        UNIT_POS,
        CUBE_DIM,
        &count,
        &mut gathered,
    );
    acc_hi[tid as usize] = h;
    acc_lo[tid as usize] = l;
    wide_scan(&mut acc_hi, &mut acc_lo);
    let (th, tl) = wide_total(&acc_hi, &acc_lo);
    let mine = count[0].load();
    if tid == 0u32 {
        sums[(2u32 * (row * parts + part)) as usize] = th;
        sums[(2u32 * (row * parts + part) + 1u32) as usize] = tl;
        let mut first = 0u32;
        if mine > 0u32 {
            first = hist[(row * ROW_WORDS + GATHERED_AT) as usize].fetch_add(mine);
        }
        offset[0] = first;
    }
    sync_cube();
    let first = offset[0];
    let mut k = tid;
    while k < mine && first + k < NUC_GATHER {
        let at = 2u32 * (row * NUC_GATHER + first + k);
        gather[at as usize] = gathered[(2u32 * k) as usize];
        gather[(at + 1u32) as usize] = gathered[(2u32 * k + 1u32) as usize];
        k += CUBE_DIM;
    }
}

/// Over the vectors `start..end` of the row, this thread taking vectors
/// `start + lane`, then every `step` (`UNIT_POS` and `CUBE_DIM` when the
/// whole workgroup reads the range; coalesced 16-byte loads,
/// [`LOADS_IN_FLIGHT`] of them issued before the first is used): the
/// fixed-point `dist` weights of the
/// logits above the crossing bin `cb` summed (this thread's share), and the
/// crossing bin's logits with a positive mass weight gathered as `(bits,
/// position)` into `gathered` at slots counted by `count` (up to
/// [`NUC_GATHER`]; the count goes on past it). What the one-workgroup
/// kernel's read 3 does per logit. A barrier must follow before `gathered`
/// or `count` is read.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn nucleus_sum_vec<N: Size>(
    logits: &[Vector<f32, N>],
    head: &RowHead,
    cb: u32,
    start: u32,
    end: u32,
    lane: u32,
    step: u32,
    count: &Shared<[Atomic<u32>]>,
    gathered: &mut Shared<[u32]>,
) -> (u32, u32) {
    let base = head.base;
    let mut hi = 0u32;
    let mut lo = 0u32;
    let mut i = start + lane;
    while i + (LOADS_IN_FLIGHT - 1u32) * step < end {
        let v0 = logits[(base + i) as usize];
        let v1 = logits[(base + i + step) as usize];
        let v2 = logits[(base + i + 2u32 * step) as usize];
        let v3 = logits[(base + i + 3u32 * step) as usize];
        let (h0, l0) = nucleus_add_vector::<N>(v0, i, head, cb, hi, lo, count, gathered);
        let (h1, l1) = nucleus_add_vector::<N>(v1, i + step, head, cb, h0, l0, count, gathered);
        let (h2, l2) =
            nucleus_add_vector::<N>(v2, i + 2u32 * step, head, cb, h1, l1, count, gathered);
        let (h3, l3) =
            nucleus_add_vector::<N>(v3, i + 3u32 * step, head, cb, h2, l2, count, gathered);
        hi = h3;
        lo = l3;
        i += LOADS_IN_FLIGHT * step;
    }
    while i < end {
        let v = logits[(base + i) as usize];
        let (h, l) = nucleus_add_vector::<N>(v, i, head, cb, hi, lo, count, gathered);
        hi = h;
        lo = l;
        i += step;
    }
    (hi, lo)
}

/// The logits of vector `i` (`v`) through [`nucleus_add`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn nucleus_add_vector<N: Size>(
    v: Vector<f32, N>,
    i: u32,
    head: &RowHead,
    cb: u32,
    hi: u32,
    lo: u32,
    count: &Shared<[Atomic<u32>]>,
    gathered: &mut Shared<[u32]>,
) -> (u32, u32) {
    let mut h = hi;
    let mut s = lo;
    let mut j = i * head.lanes;
    #[unroll]
    for k in 0..N::value() {
        let (h2, s2) = nucleus_add(v.extract(k), j, head, cb, h, s, count, gathered);
        h = h2;
        s = s2;
        j += 1u32;
    }
    (h, s)
}

/// Logit `l` at position `j` in read 3 of `top_p`: above the crossing bin
/// `cb`, its `dist` weight added into `(hi, lo)` (returned); in it, with a
/// positive mass weight, gathered (see [`nucleus_sum_vec`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn nucleus_add(
    l: f32,
    j: u32,
    head: &RowHead,
    cb: u32,
    hi: u32,
    lo: u32,
    count: &Shared<[Atomic<u32>]>,
    gathered: &mut Shared<[u32]>,
) -> (u32, u32) {
    let mut h = hi;
    let mut s = lo;
    let b = nucleus_bin(l, head.m);
    if b < cb {
        let q = draw_weight(l, head);
        let ns = s + q;
        h += select(ns < s, 1u32, 0u32);
        s = ns;
    } else if b == cb && fixed_weight(f32::exp(l - head.m)) > 0u32 {
        let at = count[0].fetch_add(1u32);
        if at < NUC_GATHER {
            gathered[(2u32 * at) as usize] = u32::reinterpret(l);
            gathered[(2u32 * at + 1u32) as usize] = j;
        }
    }
    (h, s)
}
