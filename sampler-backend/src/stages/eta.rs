//! `eta` on the device, CPU semantics: `p = softmax(logits)`, entropy
//! `H = -sum p ln p` (nats), keep `p >= min(epsilon, sqrt(epsilon) * exp(-H))`
//! plus the `max(1, min_keep)` highest logits and their ties. Width
//! unchanged; dropped candidates become `-inf`. `epsilon <= 0` rows are no-ops.


/// Device eta sampling with per-row `epsilon` and `min_keep`: the
/// recipe shared with `epsilon` (the cutoff rule comes from the specs).
pub type Eta = crate::recipes::ProbCut;
