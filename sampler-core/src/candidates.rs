//! [`Candidates`]: the CPU working set of one row.

use crate::{SampleError, TokenId};

/// The working set of one row: token ids, their logits, optional
/// probabilities, flags, and the selected token. Semantics follow
/// llama.cpp's `llama_token_data_array`, with deterministic tie rules.
///
/// Invariants kept by every method:
/// * `ids`, `logits` and `probs` have the same length;
/// * `sorted` means "descending by logit, ties by ascending token id";
/// * `probs()` is `Some` only while the probabilities were computed from the
///   current logits of the current set (any logit edit or filter clears or
///   marks them un-normalised);
/// * `selected` is an index into the current set, cleared by any edit;
/// * `ids_in_order` true means "the ids are ascending" (a full row from
///   [`Candidates::from_logits`] has ids `0..vocab`; reordering methods
///   clear it, so false only means "not known").
///
/// Fields are private on purpose (no `Deref` to `Vec`): the flags would
/// silently lie after an outside edit. Fast kernels use [`Candidates::raw_mut`]
/// and then state the flags explicitly.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    ids: Vec<TokenId>,
    logits: Vec<f32>,
    probs: Vec<f32>,
    has_probs: bool,
    sorted: bool,
    normalized: bool,
    selected: Option<usize>,
    vocab_size: usize,
    ids_in_order: bool,
}

/// Equal sets: same ids, logits, probabilities, flags and selection
/// (`ids_in_order` is a cache of what the ids say, not compared).
impl PartialEq for Candidates {
    fn eq(&self, other: &Self) -> bool {
        self.ids == other.ids
            && self.logits == other.logits
            && self.probs == other.probs
            && self.has_probs == other.has_probs
            && self.sorted == other.sorted
            && self.normalized == other.normalized
            && self.selected == other.selected
            && self.vocab_size == other.vocab_size
    }
}

/// Mutable access to the three parallel arrays of a [`Candidates`], for fast
/// kernels. Obtaining it clears `sorted`, `normalized`, the probabilities'
/// validity and `selected`; the caller restores what it guarantees with
/// [`Candidates::set_sorted`] / [`Candidates::set_probs_valid`].
#[derive(Debug)]
pub struct RawCandidates<'a> {
    /// Token ids, `[len]`.
    pub ids: &'a mut Vec<TokenId>,
    /// Logits, `[len]`.
    pub logits: &'a mut Vec<f32>,
    /// Probabilities, `[len]` (meaningful only once marked valid).
    pub probs: &'a mut Vec<f32>,
}

impl Candidates {
    /// An empty working set (vocabulary size 0); reuse it with [`Self::fill_from_logits`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A full-vocabulary row: candidate `i` is token `i` with `logits[i]`,
    /// unsorted, no probabilities. `logits`: `[vocab]`.
    pub fn from_logits(logits: &[f32]) -> Self {
        let mut c = Self::new();
        c.fill_from_logits(logits);
        c
    }

    /// Refill this set from a full-vocabulary row `[vocab]`, reusing its
    /// allocations (no allocation after the first row of a given size).
    pub fn fill_from_logits(&mut self, logits: &[f32]) {
        let n = logits.len();
        self.ids.clear();
        self.ids.extend(0..n as TokenId);
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        self.probs.clear();
        self.probs.resize(n, 0.0);
        self.has_probs = false;
        self.sorted = false;
        self.normalized = false;
        self.selected = None;
        self.vocab_size = n;
        self.ids_in_order = true;
    }

    /// A candidate set from parallel arrays (e.g. the k survivors a device
    /// read back). `ids` and `logits`: `[len]`; every id must be `< vocab_size`.
    ///
    /// # Errors
    /// [`SampleError::Shape`] if the lengths differ,
    /// [`SampleError::TokenOutOfRange`] for an id `>= vocab_size`,
    /// [`SampleError::DuplicateToken`] for an id listed twice.
    pub fn from_parts(
        ids: Vec<TokenId>,
        logits: Vec<f32>,
        vocab_size: usize,
    ) -> Result<Self, SampleError> {
        if ids.len() != logits.len() {
            return Err(SampleError::Shape {
                len: logits.len(),
                batch: 1,
                vocab: ids.len(),
                expected: ids.len(),
            });
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(SampleError::TokenOutOfRange {
                token: bad,
                vocab: vocab_size,
            });
        }
        let ids_in_order = ids.windows(2).all(|w| w[0] < w[1]);
        if !ids_in_order {
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                return Err(SampleError::DuplicateToken { token: w[0] });
            }
        }
        let n = ids.len();
        Ok(Self {
            ids,
            logits,
            probs: vec![0.0; n],
            has_probs: false,
            sorted: false,
            normalized: false,
            selected: None,
            vocab_size,
            ids_in_order,
        })
    }

    /// Whether this is a whole vocabulary row as [`Candidates::from_logits`]
    /// builds it: every token id `0..vocab` once, in id order, with no
    /// probabilities and no selection (logits may have been edited). The
    /// chain's fast kernels ([`crate::RowKernels`]) take such a row.
    pub fn is_full_row(&self) -> bool {
        self.ids_in_order
            && self.ids.len() == self.vocab_size
            && !self.has_probs
            && self.selected.is_none()
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// Size of the vocabulary this row was drawn from (ids are `< vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    /// Token ids, `[len]`.
    pub fn ids(&self) -> &[TokenId] {
        &self.ids
    }
    /// Logits, `[len]` (natural-log units, unnormalised).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
    /// Probabilities `[len]`, if a stage computed them for the current set.
    /// They sum to 1 when [`Self::is_normalized`]; filters that drop
    /// candidates after a softmax leave them un-renormalised (llama.cpp).
    pub fn probs(&self) -> Option<&[f32]> {
        self.has_probs.then_some(&self.probs[..])
    }
    /// Descending by logit, ties by ascending id.
    pub fn is_sorted(&self) -> bool {
        self.sorted
    }
    /// Probabilities are present and sum to 1 over the current set.
    pub fn is_normalized(&self) -> bool {
        self.has_probs && self.normalized
    }
    /// Index (into the current set) of the selected candidate.
    pub fn selected(&self) -> Option<usize> {
        self.selected
    }
    /// Token id of the selected candidate.
    pub fn selected_token(&self) -> Option<TokenId> {
        self.selected.and_then(|i| self.ids.get(i).copied())
    }

    /// Select candidate `index` (an index into the current set).
    /// Out-of-range indices clear the selection.
    pub fn select(&mut self, index: usize) {
        self.selected = (index < self.len()).then_some(index);
    }
    /// Clear the selection.
    pub fn clear_selection(&mut self) {
        self.selected = None;
    }

    /// Mutable logits. Clears `sorted`, the probabilities and the selection,
    /// since any edit may invalidate them.
    pub fn logits_mut(&mut self) -> &mut [f32] {
        self.sorted = false;
        self.has_probs = false;
        self.normalized = false;
        self.selected = None;
        &mut self.logits
    }

    /// Raw access for fast kernels; see [`RawCandidates`].
    pub fn raw_mut(&mut self) -> RawCandidates<'_> {
        self.ids_in_order = false;
        self.sorted = false;
        self.has_probs = false;
        self.normalized = false;
        self.selected = None;
        RawCandidates {
            ids: &mut self.ids,
            logits: &mut self.logits,
            probs: &mut self.probs,
        }
    }

    /// Declare the set sorted (descending logit, ties by ascending id).
    /// Callers must only say `true` when it holds; debug builds check it.
    pub fn set_sorted(&mut self, sorted: bool) {
        debug_assert!(
            !sorted || self.check_sorted(),
            "set_sorted(true) on an unsorted set"
        );
        self.sorted = sorted;
    }

    /// Declare the probabilities valid for the current set, and whether they
    /// sum to 1. Used by kernels that wrote `probs` through [`Self::raw_mut`].
    pub fn set_probs_valid(&mut self, normalized: bool) {
        debug_assert_eq!(self.probs.len(), self.ids.len());
        self.has_probs = true;
        self.normalized = normalized;
    }

    fn check_sorted(&self) -> bool {
        self.logits
            .windows(2)
            .zip(self.ids.windows(2))
            .all(|(l, i)| {
                l[0] > l[1] || (l[0] == l[1] && i[0] < i[1]) || (l[0].is_nan() || l[1].is_nan())
            })
    }

    /// Keep the first `n` candidates (order and `sorted` kept; probabilities
    /// stay but are no longer normalised).
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len() {
            return;
        }
        self.ids.truncate(n);
        self.logits.truncate(n);
        self.probs.truncate(n);
        self.normalized = false;
        self.selected = None;
    }

    /// Keep the candidates at positions where `keep[i]` is true, in their
    /// current order. `keep`: `[len]`. Flags as for [`Self::truncate`].
    pub fn retain_mask(&mut self, keep: &[bool]) {
        debug_assert_eq!(keep.len(), self.len());
        let mut w = 0;
        for (r, &k) in keep.iter().enumerate().take(self.len()) {
            if k {
                self.ids[w] = self.ids[r];
                self.logits[w] = self.logits[r];
                self.probs[w] = self.probs[r];
                w += 1;
            }
        }
        let was_all = w == self.len();
        self.ids.truncate(w);
        self.logits.truncate(w);
        self.probs.truncate(w);
        if !was_all {
            self.normalized = false;
        }
        self.selected = None;
    }

    /// Remove the first `n` candidates (XTC). Order kept; probabilities no longer normalised.
    pub fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        if n == 0 {
            return;
        }
        self.ids.drain(..n);
        self.logits.drain(..n);
        self.probs.drain(..n);
        self.normalized = false;
        self.selected = None;
    }

    /// Sort the whole set descending by logit, ties by ascending id, and set
    /// `sorted`. No-op if already sorted. O(n log n).
    pub fn sort_desc(&mut self) {
        if self.sorted {
            return;
        }
        self.ids_in_order = false;
        let n = self.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by(|&a, &b| {
            desc_cmp(self.logits[a], self.ids[a], self.logits[b], self.ids[b])
        });
        self.permute(&order);
        self.sorted = true;
    }

    /// Keep the `k` best candidates (descending logit, ties by lowest id),
    /// sorted. `k >= len` sorts the whole set (llama.cpp top-k semantics).
    /// Uses selection, then sorts only the kept `k`: O(n + k log k).
    pub fn top_k_sorted(&mut self, k: usize) {
        self.ids_in_order = false;
        let n = self.len();
        let k = k.min(n);
        if self.sorted {
            self.truncate(k);
            return;
        }
        let mut order: Vec<usize> = (0..n).collect();
        let cmp = |&a: &usize, &b: &usize| {
            desc_cmp(self.logits[a], self.ids[a], self.logits[b], self.ids[b])
        };
        if k > 0 && k < n {
            order.select_nth_unstable_by(k - 1, cmp);
            order.truncate(k);
        }
        order.sort_unstable_by(cmp);
        self.permute(&order);
        self.sorted = true;
        self.normalized = false;
    }

    /// Reorder the set by `order` (positions into the current set; may be a
    /// prefix, which also truncates). Keeps probabilities' validity; clears
    /// `sorted` (callers re-set it) and the selection.
    pub fn permute(&mut self, order: &[usize]) {
        self.ids_in_order = false;
        let ids: Vec<TokenId> = order.iter().map(|&i| self.ids[i]).collect();
        let logits: Vec<f32> = order.iter().map(|&i| self.logits[i]).collect();
        let probs: Vec<f32> = order.iter().map(|&i| self.probs[i]).collect();
        if order.len() != self.ids.len() {
            self.normalized = false;
        }
        self.ids = ids;
        self.logits = logits;
        self.probs = probs;
        self.sorted = false;
        self.selected = None;
    }

    /// Position of the maximum logit: the first strict maximum in the current
    /// order when unsorted; among equal maxima the lowest token id.
    /// `None` for an empty set.
    pub fn argmax(&self) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        if self.sorted {
            return Some(0);
        }
        let mut best = 0;
        for i in 1..self.len() {
            let (l, b) = (self.logits[i], self.logits[best]);
            if l > b || (l == b && self.ids[i] < self.ids[best]) {
                best = i;
            }
        }
        Some(best)
    }

    /// [`Candidates::argmax`] for a set that may not have been validated
    /// (a stage applied outside a [`Chain`](crate::Chain)): one pass that also
    /// refuses a NaN or `+inf` logit, so the answer is never a NaN candidate.
    ///
    /// # Errors
    /// [`SampleError::EmptyRow`], [`SampleError::NanLogit`] /
    /// [`SampleError::PosInfLogit`] with the candidate's position.
    pub fn checked_argmax(&self) -> Result<usize, SampleError> {
        if self.is_empty() {
            return Err(SampleError::EmptyRow);
        }
        let mut best = 0;
        for (i, &l) in self.logits.iter().enumerate() {
            if l.is_nan() {
                return Err(SampleError::NanLogit { index: i });
            }
            if l == f32::INFINITY {
                return Err(SampleError::PosInfLogit { index: i });
            }
            let b = self.logits[best];
            if l > b || (l == b && self.ids[i] < self.ids[best]) {
                best = i;
            }
        }
        Ok(best)
    }

    /// The maximum logit (`-inf` for an empty set).
    pub fn max_logit(&self) -> f32 {
        if self.sorted && !self.is_empty() {
            return self.logits[0];
        }
        self.logits
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max)
    }

    /// Softmax over the current set, in its current order (no sort):
    /// `p_i = exp(l_i - max) / sum` with the project's numerics
    /// ([`crate::numerics`]: its f32 `exp`, the sum in f64 lanes over the
    /// current order). Sets normalised probabilities.
    ///
    /// # Errors
    /// [`SampleError::EmptyRow`] for an empty set, [`SampleError::AllMasked`]
    /// when every logit is `-inf`.
    pub fn softmax(&mut self) -> Result<(), SampleError> {
        if self.is_empty() {
            return Err(SampleError::EmptyRow);
        }
        let max = self.max_logit();
        if max == f32::NEG_INFINITY {
            return Err(SampleError::AllMasked);
        }
        softmax_into(&self.logits, max, &mut self.probs);
        self.has_probs = true;
        self.normalized = true;
        Ok(())
    }

    /// Check a raw row before the first stage: empty, NaN and `+inf` logits
    /// are errors (NaN or `+inf` anywhere in a row is that row's error).
    ///
    /// # Errors
    /// [`SampleError::EmptyRow`], [`SampleError::NanLogit`], [`SampleError::PosInfLogit`].
    pub fn validate(&self) -> Result<(), SampleError> {
        validate_logits(&self.logits)
    }
}

/// Check a raw logits row `[vocab]`: empty, NaN and `+inf` are errors.
///
/// # Errors
/// [`SampleError::EmptyRow`], [`SampleError::NanLogit`], [`SampleError::PosInfLogit`]
/// (with the first offending position).
pub fn validate_logits(logits: &[f32]) -> Result<(), SampleError> {
    if logits.is_empty() {
        return Err(SampleError::EmptyRow);
    }
    if !has_nan_or_pos_inf(logits) {
        return Ok(());
    }
    for (index, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return Err(SampleError::NanLogit { index });
        }
        if l == f32::INFINITY {
            return Err(SampleError::PosInfLogit { index });
        }
    }
    Ok(())
}

/// `probs = (exp(l - max) · (1/S)) as f32` with `S` the f64 lane sum of the
/// exponentials (the project's numerics; `max` is the set's maximum, so
/// [`crate::numerics::exp_nonpos`] gives `exp`'s bits), in three vectorised loops; on
/// x86-64 the AVX-512F or AVX2 copy of the same code, chosen at run time
/// (the same operations in the same order, so the same bits).
fn softmax_into(logits: &[f32], max: f32, probs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { softmax_into_avx512(logits, max, probs) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { softmax_into_avx2(logits, max, probs) };
        }
    }
    softmax_into_body(logits, max, probs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn softmax_into_avx512(logits: &[f32], max: f32, probs: &mut [f32]) {
    softmax_into_body(logits, max, probs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn softmax_into_avx2(logits: &[f32], max: f32, probs: &mut [f32]) {
    softmax_into_body(logits, max, probs);
}

#[inline(always)]
fn softmax_into_body(logits: &[f32], max: f32, probs: &mut [f32]) {
    for (p, &l) in probs.iter_mut().zip(logits) {
        *p = crate::numerics::exp_nonpos(l - max);
    }
    let mut lanes = [0.0f64; crate::numerics::LANES];
    crate::numerics::add_to_lanes(&mut lanes, probs);
    let inv = 1.0 / crate::numerics::combine(lanes);
    for p in probs.iter_mut() {
        *p = (f64::from(*p) * inv) as f32;
    }
}

/// Whether `logits` holds a NaN or `+inf`: `!(l < +inf)` is exactly that
/// (`-inf` is a legal logit), one compare per value, or-ed in lanes without
/// a branch so that the loop vectorises (on x86-64 the AVX-512F or AVX2
/// copy of the same loop, chosen at run time).
fn has_nan_or_pos_inf(logits: &[f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { has_nan_or_pos_inf_avx512(logits) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { has_nan_or_pos_inf_avx2(logits) };
        }
    }
    has_nan_or_pos_inf_body(logits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn has_nan_or_pos_inf_avx512(logits: &[f32]) -> bool {
    has_nan_or_pos_inf_body(logits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn has_nan_or_pos_inf_avx2(logits: &[f32]) -> bool {
    has_nan_or_pos_inf_body(logits)
}

// `!(l < +inf)` is the point: it is true for NaN.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[inline(always)]
fn has_nan_or_pos_inf_body(logits: &[f32]) -> bool {
    // One or-reduction over the row: the shape the loop vectoriser handles
    // with whole-vector loads (no exit before the end, no closures: a
    // generic adapter is compiled apart from this function, without its
    // target features; lanes of 16 in an array it turned into gathers).
    let mut bad = 0u32;
    for &l in logits {
        bad |= u32::from(!(l < f32::INFINITY));
    }
    bad != 0
}

/// The canonical candidate order: descending logit, ties by ascending id.
#[inline]
pub fn desc_cmp(la: f32, ia: TokenId, lb: f32, ib: TokenId) -> std::cmp::Ordering {
    lb.partial_cmp(&la)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(ia.cmp(&ib))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_logits_is_vocab_order() {
        let c = Candidates::from_logits(&[0.5, 1.0, -1.0]);
        assert_eq!(c.ids(), &[0, 1, 2]);
        assert!(!c.is_sorted());
        assert!(c.probs().is_none());
        assert_eq!(c.vocab_size(), 3);
    }

    #[test]
    fn top_k_sorted_breaks_ties_by_lowest_id() {
        let mut c = Candidates::from_logits(&[1.0, 2.0, 2.0, 2.0, 0.0]);
        c.top_k_sorted(2);
        assert_eq!(c.ids(), &[1, 2]);
        assert!(c.is_sorted());
    }

    /// The vectorised softmax gives the serial rule's bits on every level.
    #[test]
    fn softmax_is_the_serial_rule_on_every_level() {
        let mut x = 0x2545_f491u32;
        for len in [1usize, 7, 64, 65, 1000] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if x.is_multiple_of(11) {
                        f32::NEG_INFINITY
                    } else {
                        (x % 40_000) as f32 / 1000.0 - 20.0
                    }
                })
                .collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = row.iter().map(|&l| crate::numerics::exp(l - max)).collect();
            let inv = 1.0 / crate::numerics::sum_f64(e.iter().copied());
            let want: Vec<u32> = e
                .iter()
                .map(|&v| ((f64::from(v) * inv) as f32).to_bits())
                .collect();
            type Level = fn(&[f32], f32, &mut [f32]);
            let mut levels: Vec<Level> = vec![softmax_into_body];
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    levels.push(|l, m, p| unsafe { softmax_into_avx2(l, m, p) });
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    levels.push(|l, m, p| unsafe { softmax_into_avx512(l, m, p) });
                }
            }
            for f in levels {
                let mut probs = vec![0.0f32; len];
                f(&row, max, &mut probs);
                let got: Vec<u32> = probs.iter().map(|p| p.to_bits()).collect();
                assert_eq!(got, want, "len {len}");
            }
            let mut c = Candidates::from_logits(&row);
            c.softmax().expect("a finite logit");
            let got: Vec<u32> = c
                .probs()
                .expect("probs")
                .iter()
                .map(|p| p.to_bits())
                .collect();
            assert_eq!(got, want, "len {len}");
        }
    }

    #[test]
    fn softmax_all_masked_is_an_error() {
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]);
        assert_eq!(c.softmax(), Err(SampleError::AllMasked));
    }

    #[test]
    fn logits_mut_clears_flags() {
        let mut c = Candidates::from_logits(&[3.0, 1.0]);
        c.sort_desc();
        c.softmax().unwrap();
        c.logits_mut()[0] = 0.0;
        assert!(!c.is_sorted());
        assert!(c.probs().is_none());
    }

    #[test]
    fn validate_reports_first_bad_position() {
        assert_eq!(
            validate_logits(&[0.0, f32::NAN, f32::INFINITY]),
            Err(SampleError::NanLogit { index: 1 })
        );
        assert_eq!(
            validate_logits(&[0.0, f32::INFINITY]),
            Err(SampleError::PosInfLogit { index: 1 })
        );
        assert_eq!(validate_logits(&[]), Err(SampleError::EmptyRow));
        assert_eq!(validate_logits(&[f32::NEG_INFINITY]), Ok(()));
    }

    /// The vectorised check finds one NaN or `+inf` at every position of
    /// rows around its block sizes (on every x86-64 level the CPU has), and
    /// passes rows of `-inf`, `±f32::MAX` and subnormals.
    #[test]
    fn the_bad_logit_check_sees_every_position() {
        let mut levels: Vec<fn(&[f32]) -> bool> = vec![has_nan_or_pos_inf_body];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                levels.push(|l| unsafe { has_nan_or_pos_inf_avx2(l) });
            }
            if std::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                levels.push(|l| unsafe { has_nan_or_pos_inf_avx512(l) });
            }
        }
        let legal = [f32::NEG_INFINITY, f32::MAX, -f32::MAX, 1e-45, -0.0, 3.5];
        for len in [1usize, 15, 16, 17, 255, 256, 257, 600] {
            let row: Vec<f32> = (0..len).map(|i| legal[i % legal.len()]).collect();
            for check in &levels {
                assert!(!check(&row), "len {len}: a legal row");
            }
            assert_eq!(validate_logits(&row), Ok(()));
            for at in 0..len {
                for (bad, want) in [
                    (f32::NAN, SampleError::NanLogit { index: at }),
                    (-f32::NAN, SampleError::NanLogit { index: at }),
                    (f32::INFINITY, SampleError::PosInfLogit { index: at }),
                ] {
                    let mut r = row.clone();
                    r[at] = bad;
                    for check in &levels {
                        assert!(check(&r), "len {len}: {bad} at {at}");
                    }
                    assert_eq!(validate_logits(&r), Err(want));
                }
            }
        }
    }
}
