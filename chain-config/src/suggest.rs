//! "Did you mean" suggestions: the closest known name by edit distance.

/// Edit distance between two strings, counted in Unicode scalar values:
/// Levenshtein (insertions, deletions, substitutions; each costs 1) plus
/// transpositions of two adjacent characters (`cdua` -> `cuda` costs 1),
/// i.e. the "optimal string alignment" distance.
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let w = b.len() + 1;
    // Three rows: i-2, i-1, i.
    let mut rows = vec![vec![0usize; w]; 3];
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        let (cur, prev, prev2) = (i % 3, (i + 2) % 3, (i + 1) % 3);
        rows[cur][0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[prev][j - 1] + cost)
                .min(rows[prev][j] + 1)
                .min(rows[cur][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[prev2][j - 2] + 1);
            }
            rows[cur][j] = d;
        }
    }
    rows[a.len() % 3][b.len()]
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
