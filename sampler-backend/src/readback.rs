//! Per-row status codes carried inside the readback itself, so a fully
//! offloaded chain reads back exactly one `i32` per row:
//!
//! | value | meaning |
//! |---|---|
//! | `>= 0` | the sampled token id |
//! | `-1` | every candidate was `-inf` ([`SampleError::AllMasked`]) |
//! | `-2 - 2 i` | the input row's first invalid logit is NaN at position `i` |
//! | `-3 - 2 i` | the input row's first invalid logit is `+inf` at position `i` |
//!
//! After a device `top_k` (candidates readback) the code of an invalid row
//! replaces the first id of that row.

use sampler_core::SampleError;

/// The code of an all-`-inf` row.
pub const CODE_ALL_MASKED: i64 = -1;

/// Decode a negative status code into the row's error.
pub fn decode_error(code: i64) -> SampleError {
    if code == CODE_ALL_MASKED {
        return SampleError::AllMasked;
    }
    if code <= -2 {
        let c = -code - 2;
        let index = (c / 2) as usize;
        return if c % 2 == 0 {
            SampleError::NanLogit { index }
        } else {
            SampleError::PosInfLogit { index }
        };
    }
    SampleError::Device(format!("unexpected status code {code}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        assert_eq!(decode_error(-1), SampleError::AllMasked);
        assert_eq!(decode_error(-2), SampleError::NanLogit { index: 0 });
        assert_eq!(decode_error(-3), SampleError::PosInfLogit { index: 0 });
        assert_eq!(decode_error(-2 - 2 * 7), SampleError::NanLogit { index: 7 });
        assert_eq!(
            decode_error(-3 - 2 * 7),
            SampleError::PosInfLogit { index: 7 }
        );
    }
}
