//! Token or status code per row (`token_codes_rows`), one thread a row.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

#[cube(launch_unchecked)]
pub(crate) fn token_codes_rows(
    sampled: &[i32],
    first_bad: &[i32],
    out: &mut [i32],
    rows: u32,
    none: i32,
) {
    let r = ABSOLUTE_POS;
    if r < rows as usize {
        let bad = first_bad[r];
        out[r] = select(bad < none, 0i32 - bad - 2i32, sampled[r]);
    }
}
