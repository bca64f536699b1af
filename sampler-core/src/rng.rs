//! Counter-based randomness: a token depends on (seed, step, stage lane), never on the backend or the batch.
//!
//! A row's random numbers are a pure function of `(seed, step, lane)`:
//! * `seed`: the row's (request's) seed,
//! * `step`: how many tokens this row has sampled since its chain was reset,
//! * `lane`: which consumer asks: [`lane`] of the stage's index in the chain and a
//!   sub-index for stages that need several numbers per step.
//!
//! Nothing depends on the batch position or on other rows, so the same seed
//! gives the same numbers on the CPU, on every device (the executor uploads
//! the host-computed uniforms) and in any batch. The generator is ChaCha8
//! (`rand_chacha`) keyed by the seed, with the step as the stream id and the
//! lane as the word position: random access, no state to carry.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Lanes reserved per stage; a stage may draw up to this many numbers per step.
pub const LANES_PER_STAGE: u32 = 16;

/// The lane of sub-draw `sub` of the stage at `stage_index` in its chain.
///
/// Stages are indexed by their position in the declared chain, disabled
/// (no-op) stages included, so that dropping a no-op stage from a device plan
/// never shifts another stage's random numbers.
pub fn lane(stage_index: usize, sub: u32) -> u32 {
    (stage_index as u32)
        .saturating_mul(LANES_PER_STAGE)
        .saturating_add(sub.min(LANES_PER_STAGE - 1))
}

/// A uniform `f64` in `[0, 1)` with 53 random bits, as a pure function of
/// `(seed, step, lane)`.
///
/// ```
/// use sampler_core::rng::uniform;
/// assert_eq!(uniform(42, 3, 0), uniform(42, 3, 0));
/// assert_ne!(uniform(42, 3, 0), uniform(42, 4, 0));
/// assert!((0.0..1.0).contains(&uniform(7, 0, 5)));
/// ```
pub fn uniform(seed: u64, step: u64, lane: u32) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(step);
    rng.set_word_pos(u128::from(lane) * 2);
    let bits = rng.next_u64() >> 11;
    bits as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The seed of child `index` of a request with seed `seed`
/// (`SamplingBatch::fork`, a request's `n` choices): SplitMix64's output for
/// the state `seed + index · 0x9E3779B97F4A7C15`. Child 0 is the request
/// itself (`child_seed(s, 0)` is `s`); children `1, 2, ...` get seeds that
/// depend only on the parent's seed and the index, never on the step at
/// which they were forked or on the order of the forks, and a child's own
/// children are seeded apart from its siblings.
///
/// ```
/// use sampler_core::rng::child_seed;
/// assert_eq!(child_seed(42, 0), 42);
/// assert_ne!(child_seed(42, 1), child_seed(42, 2));
/// assert_ne!(child_seed(child_seed(42, 1), 1), child_seed(42, 2));
/// ```
pub fn child_seed(seed: u64, index: u64) -> u64 {
    if index == 0 {
        return seed;
    }
    let mut z = seed.wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A fresh seed from the operating system, for rows declared without a seed.
pub fn entropy_seed() -> u64 {
    rand::random()
}

/// The random numbers of one row at one step, handed to a stage's `apply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRng {
    /// The row's seed.
    pub seed: u64,
    /// Tokens sampled so far by this row since its chain was reset.
    pub step: u64,
    /// Index of the stage in its chain (its lanes are `lane(stage_index, 0..16)`).
    pub stage_index: usize,
}

impl RowRng {
    /// Uniform number `sub` (0..16) for this stage at this step, in `[0, 1)`.
    pub fn uniform(&self, sub: u32) -> f64 {
        uniform(self.seed, self.step, lane(self.stage_index, sub))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_function_of_seed_step_lane() {
        let a: Vec<f64> = (0..8).map(|l| uniform(1, 2, l)).collect();
        let b: Vec<f64> = (0..8).map(|l| uniform(1, 2, l)).collect();
        assert_eq!(a, b);
        // Lanes, steps and seeds all change the value.
        assert_ne!(uniform(1, 2, 0), uniform(1, 2, 1));
        assert_ne!(uniform(1, 2, 0), uniform(1, 3, 0));
        assert_ne!(uniform(1, 2, 0), uniform(2, 2, 0));
    }

    #[test]
    fn uniform_mean_is_half() {
        let n = 20_000;
        let mean: f64 = (0..n).map(|s| uniform(9, s, 0)).sum::<f64>() / n as f64;
        // Standard error of the mean is 1/sqrt(12 n) ~ 0.002; 5 sigma.
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn lanes_do_not_collide_between_stages() {
        assert_eq!(lane(0, 0), 0);
        assert_eq!(lane(1, 0), LANES_PER_STAGE);
        assert_eq!(lane(0, 99), LANES_PER_STAGE - 1);
    }
}
