//! Row validation alone (`first_bad_rows`): each row's first NaN / `+inf`.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{note_bad, shared_min};

#[cube(launch_unchecked)]
pub(crate) fn first_bad_rows(
    logits: &[f32],
    out: &mut [i32],
    width: u32,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best = Shared::<[u32]>::new_slice(units);
    // Bit tests (no float compare, which fast-math may fold): NaN at i is
    // 2i, +inf at i is 2i + 1; a thread's first hit is its lowest.
    let none = 2u32 * width;
    let mut m = none;
    let mut i = tid;
    while i < width {
        m = note_bad(m, logits[(base + i) as usize], i, none);
        i += CUBE_DIM;
    }
    best[tid as usize] = m;
    shared_min(&mut best);
    if tid == 0u32 {
        out[row as usize] = i32::cast_from(best[0]);
    }
}
