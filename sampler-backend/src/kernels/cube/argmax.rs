//! The greedy kernel (`argmax_rows`): the lowest position of each row's
//! maximum and the row's validation in one pass, the token or status code.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::common::{NEG_INF_KEY, code_key, row_max_and_validation, with_code};

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
    let base = row * width;
    let mut best_key = Shared::<[u32]>::new_slice(units);
    let mut best_pos = Shared::<[u32]>::new_slice(units);
    let mut bads = Shared::<[u32]>::new_slice(units);

    // One pass: the maximum's lowest position and the row's validation.
    row_max_and_validation(logits, base, width, &mut best_key, &mut best_pos, &mut bads);
    let none = 2u32 * width;
    if UNIT_POS == 0u32 {
        out_bad[row as usize] = i32::cast_from(bads[0]);
        let key = best_key[0];
        let pos = i32::cast_from(best_pos[0]);
        let tok = select(key <= NEG_INF_KEY, -1i32, pos);
        let code = code_key(bad_in, bads[0], row, none, codes);
        out[row as usize] = with_code(tok, code, none);
    }
}
