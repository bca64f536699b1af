//! llama2.c's `.bin` tokenizer: a scored vocabulary with byte fallback.
//!
//! File layout (little-endian): `i32 max_token_length`, then for each token
//! in id order `f32 score`, `i32 len`, `len` raw UTF-8 bytes. The file does
//! not store the vocabulary size; it comes from the checkpoint header.
//!
//! Encoding follows the SentencePiece-BPE procedure llama2.c uses: a dummy
//! leading space, one piece per UTF-8 character (or one byte-fallback token
//! `<0xHH>` per byte when the character is not in the vocabulary), then
//! repeated merging of the adjacent pair whose concatenation is the
//! highest-scoring vocabulary entry (leftmost pair on ties).

use std::collections::HashMap;
use std::path::Path;

use sampler_core::TokenId;

use super::Llama2Error;

/// Id of `<unk>`.
pub const UNK: TokenId = 0;
/// Id of the beginning-of-sequence token (llama2.c's models also emit it to end a story).
pub const BOS: TokenId = 1;
/// Id of the end-of-sequence token.
pub const EOS: TokenId = 2;
/// Id of the first byte-fallback token `<0x00>`; `<0xHH>` is `BYTE_BASE + 0xHH`.
pub const BYTE_BASE: TokenId = 3;

/// A loaded tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pieces: Vec<Vec<u8>>,
    scores: Vec<f32>,
    /// Piece bytes -> id, for text pieces only (no specials, no `<0xHH>`).
    lookup: HashMap<Vec<u8>, TokenId>,
    /// Per id: the raw byte a `<0xHH>` piece stands for.
    byte_of: Vec<Option<u8>>,
    max_token_length: usize,
}

/// The byte a `<0xHH>` piece stands for, if it is one.
fn parse_byte_piece(piece: &[u8]) -> Option<u8> {
    let hex = piece.strip_prefix(b"<0x")?.strip_suffix(b">")?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

impl Tokenizer {
    /// Read a tokenizer file holding exactly `vocab_size` tokens (the
    /// checkpoint's vocabulary).
    ///
    /// # Errors
    /// [`Llama2Error::Io`] when unreadable; [`Llama2Error::VocabMismatch`]
    /// when the file holds fewer or more tokens than `vocab_size` (with both
    /// counts); [`Llama2Error::BadTokenizer`] for a malformed entry.
    pub fn read(path: impl AsRef<Path>, vocab_size: usize) -> Result<Self, Llama2Error> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Llama2Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(path, &bytes, vocab_size)
    }

    /// Parse tokenizer bytes; `path` only names the source in errors.
    ///
    /// # Errors
    /// As [`Tokenizer::read`], without the I/O case.
    pub fn from_bytes(path: &Path, bytes: &[u8], vocab_size: usize) -> Result<Self, Llama2Error> {
        let bad = |offset: usize, reason: String| Llama2Error::BadTokenizer {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        let mut pos = 0usize;
        let read_u32 = |pos: &mut usize| -> Option<[u8; 4]> {
            let b = bytes.get(*pos..*pos + 4)?;
            *pos += 4;
            Some([b[0], b[1], b[2], b[3]])
        };
        let max_len = read_u32(&mut pos)
            .map(i32::from_le_bytes)
            .ok_or_else(|| bad(0, "file shorter than its 4-byte header".into()))?;
        if max_len <= 0 || max_len as usize > bytes.len() {
            return Err(bad(
                0,
                format!(
                    "max_token_length = {max_len}, expected 1 to the file size ({} bytes)",
                    bytes.len()
                ),
            ));
        }
        let mut pieces = Vec::with_capacity(vocab_size);
        let mut scores = Vec::with_capacity(vocab_size);
        while pos < bytes.len() {
            let start = pos;
            let (Some(score), Some(len)) = (read_u32(&mut pos), read_u32(&mut pos)) else {
                return Err(bad(
                    start,
                    format!("token {} entry is cut short", pieces.len()),
                ));
            };
            let score = f32::from_le_bytes(score);
            let len = i32::from_le_bytes(len);
            let piece = usize::try_from(len)
                .ok()
                .and_then(|n| bytes.get(pos..pos.checked_add(n)?));
            let Some(piece) = piece else {
                return Err(bad(
                    start,
                    format!(
                        "token {} has length {len} but {} bytes remain",
                        pieces.len(),
                        bytes.len() - pos
                    ),
                ));
            };
            pos += piece.len();
            pieces.push(piece.to_vec());
            scores.push(score);
        }
        if pieces.len() != vocab_size {
            return Err(Llama2Error::VocabMismatch {
                path: path.to_path_buf(),
                expected: vocab_size,
                actual: pieces.len(),
            });
        }
        let byte_of: Vec<Option<u8>> = pieces.iter().map(|p| parse_byte_piece(p)).collect();
        let mut lookup = HashMap::with_capacity(vocab_size);
        for (id, piece) in pieces.iter().enumerate() {
            let special = id <= EOS as usize;
            if !special && byte_of[id].is_none() && !piece.is_empty() {
                // First id wins for duplicated pieces.
                lookup.entry(piece.clone()).or_insert(id as TokenId);
            }
        }
        Ok(Tokenizer {
            pieces,
            scores,
            lookup,
            byte_of,
            max_token_length: max_len as usize,
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The longest piece in bytes, as the file declares it.
    pub fn max_token_length(&self) -> usize {
        self.max_token_length
    }

    /// A token's raw piece (`None` for an out-of-range id).
    pub fn piece(&self, id: TokenId) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// Encode `text` into token ids: optional BOS, the dummy leading space,
    /// characters (or byte fallback), then best-score pair merges; optional EOS.
    pub fn encode(&self, text: &str, bos: bool, eos: bool) -> Vec<TokenId> {
        let mut tokens: Vec<TokenId> = Vec::with_capacity(text.len() + 3);
        if bos {
            tokens.push(BOS);
        }
        let first = tokens.len();
        if !text.is_empty() {
            // The leading space SentencePiece adds (`add_dummy_prefix`).
            self.push_text(" ", &mut tokens);
        }
        self.push_text(text, &mut tokens);
        self.merge(&mut tokens, first);
        if eos {
            tokens.push(EOS);
        }
        tokens
    }

    /// One token per character, or byte-fallback tokens for unknown characters.
    fn push_text(&self, text: &str, out: &mut Vec<TokenId>) {
        let mut buf = [0u8; 4];
        for ch in text.chars() {
            let s = ch.encode_utf8(&mut buf).as_bytes();
            match self.lookup.get(s) {
                Some(&id) => out.push(id),
                None => out.extend(s.iter().map(|&b| self.byte_token(b))),
            }
        }
    }

    /// The id of byte `b`'s fallback token (`<unk>` when the vocabulary lacks it).
    fn byte_token(&self, b: u8) -> TokenId {
        let id = BYTE_BASE as usize + b as usize;
        if self.byte_of.get(id).copied().flatten() == Some(b) {
            id as TokenId
        } else {
            self.byte_of
                .iter()
                .position(|&x| x == Some(b))
                .map_or(UNK, |i| i as TokenId)
        }
    }

    /// Merge adjacent pairs in `tokens[first..]` greedily by score: at each
    /// step the pair with the highest score (ties: the leftmost) is merged,
    /// as llama2.c does, in O(n log n) with a heap of candidate pairs over a
    /// linked list (llama2.c rescans every pair per merge: O(n^2)).
    fn merge(&self, tokens: &mut Vec<TokenId>, first: usize) {
        use std::cmp::{Ordering, Reverse};
        use std::collections::BinaryHeap;

        /// A candidate merge: higher score first, then the leftmost node.
        #[derive(PartialEq)]
        struct Cand {
            score: f32,
            left: Reverse<usize>,
            versions: (u32, u32),
            right: usize,
            id: TokenId,
        }
        impl Eq for Cand {}
        impl PartialOrd for Cand {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }
        impl Ord for Cand {
            fn cmp(&self, other: &Self) -> Ordering {
                self.score
                    .total_cmp(&other.score)
                    .then(self.left.cmp(&other.left))
            }
        }

        let toks = &mut tokens[first..];
        let n = toks.len();
        if n < 2 {
            return;
        }
        let mut next: Vec<usize> = (1..=n).collect(); // n = none
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut version = vec![0u32; n];
        let mut alive = vec![true; n];
        let mut joined = Vec::with_capacity(2 * self.max_token_length.clamp(8, 1 << 16));
        let mut heap = BinaryHeap::new();
        let mut push =
            |heap: &mut BinaryHeap<Cand>, toks: &[TokenId], version: &[u32], i: usize, j: usize| {
                joined.clear();
                joined.extend_from_slice(&self.pieces[toks[i] as usize]);
                joined.extend_from_slice(&self.pieces[toks[j] as usize]);
                if let Some(&id) = self.lookup.get(&joined) {
                    heap.push(Cand {
                        score: self.scores[id as usize],
                        left: Reverse(i),
                        versions: (version[i], version[j]),
                        right: j,
                        id,
                    });
                }
            };
        for i in 0..n - 1 {
            push(&mut heap, toks, &version, i, i + 1);
        }
        while let Some(c) = heap.pop() {
            let (i, j) = (c.left.0, c.right);
            if !alive[i] || !alive[j] || next[i] != j || (version[i], version[j]) != c.versions {
                continue; // stale: one side was merged since
            }
            toks[i] = c.id;
            version[i] += 1;
            alive[j] = false;
            next[i] = next[j];
            if next[j] < n {
                prev[next[j]] = i;
            }
            if prev[i] < n {
                push(&mut heap, toks, &version, prev[i], i);
            }
            if next[i] < n {
                push(&mut heap, toks, &version, i, next[i]);
            }
        }
        let mut w = 0;
        for r in 0..n {
            if alive[r] {
                toks[w] = toks[r];
                w += 1;
            }
        }
        tokens.truncate(first + w);
    }

    /// llama2.c's merge loop as written (rescan every pair per merge), the
    /// reference the heap version is tested against.
    #[cfg(test)]
    fn merge_naive(&self, tokens: &mut Vec<TokenId>, first: usize) {
        let mut joined = Vec::new();
        loop {
            let mut best: Option<(f32, usize, TokenId)> = None;
            for i in first..tokens.len().saturating_sub(1) {
                joined.clear();
                joined.extend_from_slice(&self.pieces[tokens[i] as usize]);
                joined.extend_from_slice(&self.pieces[tokens[i + 1] as usize]);
                if let Some(&id) = self.lookup.get(&joined) {
                    let score = self.scores[id as usize];
                    if best.is_none_or(|(s, _, _)| score > s) {
                        best = Some((score, i, id));
                    }
                }
            }
            let Some((_, i, id)) = best else { break };
            tokens[i] = id;
            tokens.remove(i + 1);
        }
    }

    /// The bytes token `id` contributes when it follows `prev`: `<0xHH>` is
    /// the raw byte, and a piece after BOS loses one leading space. Out of
    /// range ids decode to nothing.
    pub fn decode_piece(&self, prev: Option<TokenId>, id: TokenId) -> &[u8] {
        let i = id as usize;
        let Some(piece) = self.pieces.get(i) else {
            return &[];
        };
        if let Some(&Some(b)) = self.byte_of.get(i) {
            return std::slice::from_ref(&BYTES[b as usize]);
        }
        if prev == Some(BOS) {
            piece.strip_prefix(b" ").unwrap_or(piece)
        } else {
            piece
        }
    }

    /// Decode a sequence to bytes. A leading BOS (and any BOS/EOS) is not
    /// printed; the piece after a BOS loses one leading space.
    pub fn decode_bytes(&self, tokens: &[TokenId]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut prev = None;
        for &t in tokens {
            if t != BOS && t != EOS {
                out.extend_from_slice(self.decode_piece(prev, t));
            }
            prev = Some(t);
        }
        out
    }

    /// Decode a sequence to text (invalid UTF-8 replaced by U+FFFD).
    pub fn decode(&self, tokens: &[TokenId]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(tokens)).into_owned()
    }
}

/// Every byte value, so byte-fallback decoding can hand out `&[u8]`.
static BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

#[cfg(test)]
mod merge_tests {
    use super::*;

    /// The heap merge gives llama2.c's tokens (the naive rescan) on the
    /// shipped tokenizer, for assorted and random texts.
    #[test]
    fn heap_merge_equals_the_rescan() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/stories260K/tok512.bin"
        );
        let tok = Tokenizer::read(path, 512).expect("tokenizer");
        let mut texts: Vec<String> = [
            "Once upon a time, there was a little girl named Lily.",
            "aaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbb  the the the",
            "Ünïcödé ✓ 日本語 and emoji 🦀🦀",
            "",
            " ",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut x = 0x2545_f491_u32;
        for len in [3usize, 17, 64, 300] {
            let t: String = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    b" etaoinshrdlu.,"[x as usize % 15] as char
                })
                .collect();
            texts.push(t);
        }
        for t in texts {
            let mut a = Vec::new();
            tok.push_text(&t, &mut a);
            let mut b = a.clone();
            tok.merge(&mut a, 0);
            tok.merge_naive(&mut b, 0);
            assert_eq!(a, b, "{t:?}");
        }
    }
}
