//! "Did you mean" suggestions: the closest known name by edit distance.

/// Edit distance between two strings, counted in Unicode scalar values:
/// insertions, deletions, substitutions and transpositions of two adjacent
/// characters each cost 1 (`cdua` -> `cuda` costs 1), i.e. the "optimal
/// string alignment" distance (strsim).
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    strsim::osa_distance(a, b)
}

fn normalize(s: &str) -> String {
    s.trim().to_lowercase().replace('-', "_")
}

/// The candidate closest to `input` (case-insensitive, `-` and `_` alike),
/// if it is within `max(1, len / 3)` edits (at most 3). Ties go to the
/// earlier candidate.
pub(crate) fn suggest<'a>(
    input: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let norm = normalize(input);
    if norm.chars().count() > 64 {
        return None;
    }
    let limit = (norm.chars().count() / 3).clamp(1, 3);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = levenshtein(&norm, &normalize(c));
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance() {
        assert_eq!(levenshtein("top_kk", "top_k"), 1);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("temp", "temp"), 0);
        assert_eq!(levenshtein("cdua", "cuda"), 1);
        assert_eq!(levenshtein("abc", ""), 3);
    }

    #[test]
    fn suggestions() {
        let names = ["top_k", "top_p", "min_p", "temperature"];
        assert_eq!(suggest("top_kk", names).as_deref(), Some("top_k"));
        assert_eq!(suggest("TOP-KK", names).as_deref(), Some("top_k"));
        assert_eq!(suggest("temprature", names).as_deref(), Some("temperature"));
        assert_eq!(suggest("zzzzzz", names), None);
    }
}
