//! The temperature kernel (`temperature_rows`): `l / t` saturated, or at a
//! greedy temperature the lowest id among the maxima.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{order_key, reduce_first_max, scaled};

#[cube(launch_unchecked)]
pub(crate) fn temperature_rows(
    logits: &[f32],
    ids: &[i32],
    t: &[f32],
    out: &mut [f32],
    width: u32,
    greedy_below: f32,
    #[comptime] has_ids: bool,
    #[comptime] units: usize,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let tr = t[row as usize];
    let neg_inf = f32::reinterpret(0xFF80_0000u32);
    if tr < greedy_below {
        // Greedy temperature: only the lowest id among the maxima stays.
        let mut best_key = Shared::<[u32]>::new_slice(units);
        let mut best_id = Shared::<[i32]>::new_slice(units);
        let mut bk = 0u32;
        let mut bid = i32::cast_from(0x7FFF_FFFFu32);
        let mut i = tid;
        while i < width {
            let key = order_key(logits[(base + i) as usize]);
            let mut id = i32::cast_from(i);
            if comptime!(has_ids) {
                id = ids[(base + i) as usize];
            }
            if key > bk || (key == bk && id < bid) {
                bk = key;
                bid = id;
            }
            i += CUBE_DIM;
        }
        best_key[tid as usize] = bk;
        best_id[tid as usize] = bid;
        reduce_first_max(&mut best_key, &mut best_id);
        let winner = best_id[0];
        let mut j = tid;
        while j < width {
            let mut id = i32::cast_from(j);
            if comptime!(has_ids) {
                id = ids[(base + j) as usize];
            }
            let l = logits[(base + j) as usize];
            out[(base + j) as usize] = select(id == winner, l, neg_inf);
            j += CUBE_DIM;
        }
    } else {
        // l / t, finite results saturated at ±f32::MAX, -inf kept.
        let mut j = tid;
        while j < width {
            out[(base + j) as usize] = scaled(logits[(base + j) as usize], tr);
            j += CUBE_DIM;
        }
    }
}
