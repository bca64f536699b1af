//! Row validation alone (`first_bad_rows`): each row's first NaN / `+inf`.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

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
        let bits = u32::reinterpret(logits[(base + i) as usize]);
        let abs = bits & 0x7FFF_FFFFu32;
        if m == none {
            if abs > 0x7F80_0000u32 {
                m = 2u32 * i;
            } else if bits == 0x7F80_0000u32 {
                m = 2u32 * i + 1u32;
            }
        }
        i += CUBE_DIM;
    }
    best[tid as usize] = m;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let other = best[(tid + half) as usize];
            if other < best[tid as usize] {
                best[tid as usize] = other;
            }
        }
        sync_cube();
        half /= 2u32;
    }
    if tid == 0u32 {
        out[row as usize] = i32::cast_from(best[0]);
    }
}
