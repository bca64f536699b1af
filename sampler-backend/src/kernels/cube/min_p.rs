//! The `min_p` kernel (`min_p_rows`): the first maximum in canonical order
//! and the row's validation, then `l >= max + ln p` kept, any width.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{NEG_INF_KEY, max_logit, note_bad, order_key, shared_min};

#[cube(launch_unchecked)]
pub(crate) fn min_p_rows(
    logits: &[f32],
    ids: &[i32],
    log_p: &[f32],
    out: &mut [f32],
    out_bad: &mut [i32],
    width: u32,
    #[comptime] units: usize,
    #[comptime] has_ids: bool,
) {
    let row = CUBE_POS_X;
    let tid = UNIT_POS;
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_id = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);
    let neg_inf = f32::reinterpret(0xFF80_0000u32);

    // Pass 1: the first maximum in canonical order (ties to the lowest id)
    // and the row's validation. Not `range_max_and_validation_vec`: ties go to
    // the lowest id, and even without ids a key-0 element (a NaN with every
    // bit set) is taken at the start (`id < bid`), where that helper keeps
    // none.
    let none_pos = 2u32 * width;
    let mut bad = none_pos;
    let mut bk = 0u32;
    let mut bid = 0xFFFF_FFFFu32;
    let mut bp = width;
    let mut i = tid;
    while i < width {
        let x = logits[(base + i) as usize];
        let key = order_key(x);
        let mut id = i;
        if comptime!(has_ids) {
            id = u32::cast_from(ids[(base + i) as usize]);
        }
        if key > bk || (key == bk && id < bid) {
            bk = key;
            bid = id;
            bp = i;
        }
        bad = note_bad(bad, x, i, none_pos);
        i += CUBE_DIM;
    }
    bads[tid as usize] = bad;
    shared_min(&mut bads);
    best_key[tid as usize] = bk;
    best_id[tid as usize] = bid;
    best_pos[tid as usize] = bp;
    sync_cube();
    let mut half = CUBE_DIM / 2u32;
    while half > 0u32 {
        if tid < half {
            let k2 = best_key[(tid + half) as usize];
            let d2 = best_id[(tid + half) as usize];
            let k1 = best_key[tid as usize];
            if k2 > k1 || (k2 == k1 && d2 < best_id[tid as usize]) {
                best_key[tid as usize] = k2;
                best_id[tid as usize] = d2;
                best_pos[tid as usize] = best_pos[(tid + half) as usize];
            }
        }
        sync_cube();
        half /= 2u32;
    }
    let first = best_pos[0];
    let m = max_logit(logits, base, width, first, best_key[0] <= NEG_INF_KEY);
    let thr = m + log_p[row as usize];
    // Pass 2: the kept logits, `-inf` elsewhere.
    let mut j = tid;
    while j < width {
        let l = logits[(base + j) as usize];
        out[(base + j) as usize] = select(l >= thr || j == first, l, neg_inf);
        j += CUBE_DIM;
    }
    if tid == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
    }
}
