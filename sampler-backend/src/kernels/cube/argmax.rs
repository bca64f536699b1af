//! The greedy kernel (`argmax_rows`): the lowest position of each row's
//! maximum and the row's validation in one pass, the token or status code.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{NEG_INF_KEY, bad_key, code_key, order_key, shared_min, with_code};

#[cube(launch_unchecked)]
pub(crate) fn argmax_rows(
    logits: &[f32],
    bad_in: &[i32],
    out: &mut [i32],
    out_bad: &mut [i32],
    width: u32,
    #[comptime] units: usize,
    #[comptime] codes: u32,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);

    // Each thread visits ascending positions: the first maximum it meets is
    // its lowest. The same pass validates the row.
    let none = 2u32 * width;
    let mut bad = none;
    let mut bk = 0u32;
    let mut bp = width;
    let mut i = tid;
    while i < width {
        let x = logits[(base + i) as usize];
        let key = order_key(x);
        if key > bk {
            bk = key;
            bp = i;
        }
        // NaN and ±inf have every exponent bit set.
        if bad == none && (u32::reinterpret(x) & 0x7F80_0000u32) == 0x7F80_0000u32 {
            bad = bad_key(x, i, none);
        }
        i += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
    best_key[tid as usize] = bk;
    best_pos[tid as usize] = bp;
    sync_cube();
    let mut s = CUBE_DIM / 2u32;
    while s > 0u32 {
        if tid < s {
            let k1 = best_key[tid as usize];
            let p1 = best_pos[tid as usize];
            let k2 = best_key[(tid + s) as usize];
            let p2 = best_pos[(tid + s) as usize];
            if k2 > k1 || (k2 == k1 && p2 < p1) {
                best_key[tid as usize] = k2;
                best_pos[tid as usize] = p2;
            }
        }
        sync_cube();
        s /= 2u32;
    }
    if tid == 0u32 {
        let key = best_key[0];
        let pos = i32::cast_from(best_pos[0]);
        let tok = select(key <= NEG_INF_KEY, -1i32, pos);
        let code = code_key(bad_in, bads[0], row, none, codes);
        out[row as usize] = with_code(tok, code, none);
    }
}
