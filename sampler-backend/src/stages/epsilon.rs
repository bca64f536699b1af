//! `epsilon` on the device, CPU semantics: `p = softmax(logits)` over the
//! current candidates, keep `p >= epsilon`, plus the `max(1, min_keep)`
//! highest logits and every candidate tied with the last of them (Hugging
//! Face's `topk` threshold). Width unchanged; dropped candidates become
//! `-inf`. `epsilon <= 0` rows are no-ops.


/// Device epsilon sampling with per-row `epsilon` and `min_keep`: the
/// recipe shared with `eta` (the cutoff rule comes from the specs).
pub type Epsilon = crate::recipes::ProbCut;
