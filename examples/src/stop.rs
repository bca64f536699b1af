//! Stop strings over a stream of tokens: incremental detokenisation (whole
//! UTF-8 characters only) and the search for the request's stop strings
//! across token boundaries, with the text held back that could still become
//! a stop.
//!
//! Semantics (OpenAI's `stop`, as vLLM implements it, made independent of
//! how the text splits into tokens):
//! - Each token's bytes are appended; a character split across tokens is
//!   held back until it is whole. Bytes that can never be valid UTF-8 become
//!   U+FFFD.
//! - Generation stops at the first character position where any stop string
//!   ends; when several end at the same character (`"bc"` and `"abc"`), the
//!   longer one, which starts first, is the match. So several stop strings
//!   completed by one token give the one a character-by-character stream
//!   would have met first, whatever the token boundaries.
//! - The text before the match is sent; the stop string itself only with
//!   `include_stop_str_in_output`; nothing after it, ever.
//! - Text that is not sent yet is the shortest that could still become a
//!   stop: the longest suffix of the pending text that is a prefix of some
//!   stop string (plus an unfinished character). Everything before it is
//!   released at once.
//! - `min_tokens` holds stops off: a stop string counts only when it ends
//!   in the text of a token after the first `min_tokens` (vLLM's rule: stop
//!   strings are checked once more than `min_tokens` tokens are out); one
//!   that ended earlier stays plain text.

/// At most this many stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// A stop string is at most this many bytes long.
pub const MAX_STOP_BYTES: usize = 256;

/// A bad `stop` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// More stop strings than [`MAX_STOP_STRINGS`].
    #[error("`stop`: at most {MAX_STOP_STRINGS} strings, found {0}")]
    TooMany(usize),
    /// An empty stop string (it would match everywhere).
    #[error("`stop`: item {0} is an empty string (a stop string needs at least one character)")]
    Empty(usize),
    /// A stop string longer than [`MAX_STOP_BYTES`].
    #[error("`stop`: item {0} is {1} bytes long, at most {MAX_STOP_BYTES} allowed")]
    TooLong(usize, usize),
}

/// Check a request's stop strings (count, each non-empty and not too long).
///
/// # Errors
/// [`StopError`] naming the item at fault.
pub fn check_stops(stops: &[String]) -> Result<(), StopError> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(StopError::TooMany(stops.len()));
    }
    for (i, s) in stops.iter().enumerate() {
        if s.is_empty() {
            return Err(StopError::Empty(i));
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(StopError::TooLong(i, s.len()));
        }
    }
    Ok(())
}

/// What one token added to the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// Text that may be sent now (possibly empty).
    pub text: String,
    /// The stop string that ended the generation with this token.
    pub stop: Option<String>,
}

/// The text of one generation, token by token, with its stop strings.
#[derive(Debug, Clone)]
pub struct TextStream {
    stops: Vec<String>,
    include_stop: bool,
    min_tokens: usize,
    tokens: usize,
    /// The bytes of an unfinished character.
    partial: Vec<u8>,
    /// Decoded text not sent yet.
    held: String,
    /// All text sent so far.
    sent: String,
    stopped: bool,
}

impl TextStream {
    /// A stream stopping at `stops` (checked with [`check_stops`]), which
    /// count from the token after the first `min_tokens`.
    ///
    /// # Errors
    /// [`StopError`] for a bad stop string.
    pub fn new(
        stops: Vec<String>,
        include_stop: bool,
        min_tokens: usize,
    ) -> Result<Self, StopError> {
        check_stops(&stops)?;
        Ok(Self {
            stops,
            include_stop,
            min_tokens,
            tokens: 0,
            partial: Vec::new(),
            held: String::new(),
            sent: String::new(),
            stopped: false,
        })
    }

    /// A stream with no stop strings (detokenisation only).
    pub fn plain() -> Self {
        Self {
            stops: Vec::new(),
            include_stop: false,
            min_tokens: 0,
            tokens: 0,
            partial: Vec::new(),
            held: String::new(),
            sent: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched (later pushes add nothing).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Every character sent so far.
    pub fn text(&self) -> &str {
        &self.sent
    }

    /// Add one token's bytes (empty for a token with no text, such as an
    /// end-of-text token; it still counts for `min_tokens`).
    pub fn push(&mut self, bytes: &[u8]) -> Delta {
        if self.stopped {
            return Delta {
                text: String::new(),
                stop: None,
            };
        }
        self.tokens += 1;
        let new_from = self.held.len();
        self.partial.extend_from_slice(bytes);
        self.decode_partial(false);
        if self.tokens > self.min_tokens
            && let Some((start, end, stop)) = self.first_stop(new_from)
        {
            let cut = if self.include_stop { end } else { start };
            let text = self.held[..cut].to_string();
            self.sent.push_str(&text);
            self.held.clear();
            self.partial.clear();
            self.stopped = true;
            return Delta {
                text,
                stop: Some(stop),
            };
        }
        let keep = self.stop_prefix_len();
        let text: String = self.held.drain(..self.held.len() - keep).collect();
        self.sent.push_str(&text);
        Delta { text, stop: None }
    }

    /// The end of the generation (no stop string): everything held back,
    /// an unfinished character as U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        self.decode_partial(true);
        let text = std::mem::take(&mut self.held);
        self.sent.push_str(&text);
        text
    }

    /// Move the whole characters of `partial` into `held`; at the end,
    /// everything (lossy).
    fn decode_partial(&mut self, end: bool) {
        let mut rest: &[u8] = &self.partial;
        let mut out = String::new();
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (ok, after) = rest.split_at(e.valid_up_to());
                    // Checked by from_utf8 just now.
                    out.push_str(std::str::from_utf8(ok).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        None if end => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.held.push_str(&out);
        self.partial = rest.to_vec();
    }

    /// The first stop string ending after byte `new_from` of `held`: its
    /// (start, end) bytes and the string. Earliest end first, then the
    /// longest (earliest start).
    fn first_stop(&self, new_from: usize) -> Option<(usize, usize, String)> {
        let h = &self.held;
        let ends = h
            .char_indices()
            .map(|(i, c)| i + c.len_utf8())
            .filter(|&e| e > new_from);
        for end in ends {
            let best = self
                .stops
                .iter()
                .filter(|s| h[..end].ends_with(s.as_str()))
                .max_by_key(|s| s.len());
            if let Some(s) = best {
                return Some((end - s.len(), end, s.clone()));
            }
        }
        None
    }

    /// Bytes at the end of `held` that could still grow into a stop string:
    /// the longest suffix (on a character boundary) that is a proper prefix
    /// of one.
    fn stop_prefix_len(&self) -> usize {
        let h = &self.held;
        let mut keep = 0;
        for s in &self.stops {
            // Longest proper prefix of `s` that `h` ends with.
            let max = (s.len() - 1).min(h.len());
            for n in (keep + 1..=max).rev() {
                if h.is_char_boundary(h.len() - n) && s.is_char_boundary(n) && h.ends_with(&s[..n])
                {
                    keep = n;
                    break;
                }
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stops: &[&str]) -> TextStream {
        TextStream::new(stops.iter().map(|s| s.to_string()).collect(), false, 0).unwrap()
    }

    /// Push the pieces; the text sent per piece and the stop.
    fn run(s: &mut TextStream, pieces: &[&[u8]]) -> (Vec<String>, Option<String>) {
        let mut out = Vec::new();
        for p in pieces {
            let d = s.push(p);
            out.push(d.text);
            if d.stop.is_some() {
                return (out, d.stop);
            }
        }
        out.push(s.finish());
        (out, None)
    }

    #[test]
    fn a_stop_across_two_tokens_is_found_and_nothing_after_it_is_sent() {
        let mut s = stream(&["\nEnd"]);
        let (out, stop) = run(&mut s, &[b"Hello", b" there\nE", b"nd of it", b"more"]);
        assert_eq!(stop.as_deref(), Some("\nEnd"));
        assert_eq!(out, ["Hello", " there", ""]);
        assert_eq!(s.text(), "Hello there");
        assert!(s.stopped());
        assert_eq!(s.push(b"x").text, "");
    }

    #[test]
    fn held_back_text_is_only_what_could_still_become_a_stop() {
        let mut s = stream(&["abc"]);
        assert_eq!(s.push(b"xxab").text, "xx");
        // "abx" can no longer become "abc": released at once.
        assert_eq!(s.push(b"x").text, "abx");
        assert_eq!(s.push(b"a").text, "");
        assert_eq!(s.push(b"a").text, "a");
        assert_eq!(s.finish(), "a");
        assert_eq!(s.text(), "xxabxaa");
    }

    #[test]
    fn a_partial_match_that_is_not_a_stop_is_released_whole() {
        let mut s = stream(&["stop here"]);
        let (out, stop) = run(&mut s, &[b"we stop", b" he", b"re?", b"!"]);
        // " he" + "re?" does not complete "stop here": " stop here?" contains it.
        assert_eq!(stop.as_deref(), Some("stop here"));
        assert_eq!(out.concat(), "we ");
        let mut s = stream(&["stop here"]);
        let (out, stop) = run(&mut s, &[b"we stop", b" hence", b"!"]);
        assert_eq!(stop, None);
        assert_eq!(out, ["we ", "stop hence", "!", ""]);
    }

    #[test]
    fn a_character_split_across_tokens_is_held_until_whole() {
        // "é" is C3 A9; "日" is E6 97 A5.
        let mut s = TextStream::plain();
        assert_eq!(s.push(b"caf\xC3").text, "caf");
        assert_eq!(s.push(b"\xA9 \xE6\x97").text, "é ");
        assert_eq!(s.push(b"\xA5").text, "日");
        // An unfinished character at the end is U+FFFD; invalid bytes too.
        assert_eq!(s.push(b"\xFFok\xE6").text, "\u{FFFD}ok");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    #[test]
    fn a_multi_byte_stop_string_split_inside_its_character() {
        let mut s = stream(&["日"]);
        let (out, stop) = run(&mut s, &[b"ab\xE6", b"\x97", b"\xA5cd"]);
        assert_eq!(stop.as_deref(), Some("日"));
        assert_eq!(out.concat(), "ab");
        // A different character with the same first byte is not a stop.
        let mut s = stream(&["日"]);
        let (out, stop) = run(&mut s, &[b"ab\xE6", b"\x97\xA4"]);
        assert_eq!(stop, None);
        assert_eq!(out.concat(), "ab\u{65E4}");
    }

    #[test]
    fn of_several_stops_completed_in_one_token_the_earliest_ending_wins() {
        // In one token "xabcd": "bc" ends before "abcd".
        let mut s = stream(&["abcd", "bc", "x"]);
        let d = s.push(b"yyabcd");
        assert_eq!(d.stop.as_deref(), Some("bc"));
        assert_eq!(d.text, "yya");
        // Ending at the same character: the longer one (it starts first).
        let mut s = stream(&["bc", "abc"]);
        let d = s.push(b"zabcq");
        assert_eq!((d.stop.as_deref(), d.text.as_str()), (Some("abc"), "z"));
        // The same text split otherwise gives the same result.
        let mut s = stream(&["abcd", "bc"]);
        let (out, stop) = run(&mut s, &[b"yya", b"b", b"cd"]);
        assert_eq!(
            (stop.as_deref(), out.concat().as_str()),
            (Some("bc"), "yya")
        );
    }

    #[test]
    fn include_stop_str_in_output_sends_the_stop_and_nothing_after() {
        let mut s = TextStream::new(vec!["END".into()], true, 0).unwrap();
        let (out, stop) = run(&mut s, &[b"a E", b"NDb"]);
        assert_eq!(stop.as_deref(), Some("END"));
        assert_eq!(out.concat(), "a END");
    }

    #[test]
    fn min_tokens_holds_off_stops() {
        // Tokens 1 and 2 are held off (min_tokens 2): "." in them is text.
        let mut s = TextStream::new(vec![".".into()], false, 2).unwrap();
        assert_eq!(s.push(b"a.").stop, None);
        assert_eq!(s.push(b"b.").stop, None);
        let d = s.push(b"c.d");
        assert_eq!(d.stop.as_deref(), Some("."));
        assert_eq!(s.text(), "a.b.c");
        // A stop that starts in a held-off token and ends after counts.
        let mut s = TextStream::new(vec!["xy".into()], false, 1).unwrap();
        assert_eq!(s.push(b"ax").text, "a");
        let d = s.push(b"yz");
        assert_eq!((d.stop.as_deref(), s.text()), (Some("xy"), "a"));
        // A token with no text still counts.
        let mut s = TextStream::new(vec!["!".into()], false, 1).unwrap();
        assert_eq!(s.push(b"").stop, None);
        assert_eq!(s.push(b"!").stop.as_deref(), Some("!"));
    }

    #[test]
    fn bad_stop_lists_are_refused_naming_the_item() {
        assert_eq!(
            check_stops(&["a".into(), String::new()]),
            Err(StopError::Empty(1))
        );
        let long = "x".repeat(MAX_STOP_BYTES + 1);
        assert_eq!(check_stops(&[long]), Err(StopError::TooLong(0, 257)));
        let many = vec!["a".to_string(); MAX_STOP_STRINGS + 1];
        assert_eq!(check_stops(&many), Err(StopError::TooMany(17)));
        assert!(StopError::Empty(1).to_string().contains("item 1"));
    }

    #[test]
    fn random_splits_give_the_text_of_one_piece() {
        // Whatever the token boundaries, the text sent and the stop are
        // those of the text pushed as one piece.
        let text = "xa日bé日cab\u{1F600}abc end".as_bytes();
        let stops = ["日c", "ab\u{1F600}a", "end", "zz"];
        let whole = {
            let mut s = stream(&stops);
            run(&mut s, &[text])
        };
        let mut state = 12345u64;
        for _ in 0..500 {
            let mut pieces = Vec::new();
            let mut at = 0;
            while at < text.len() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let n = 1 + (state >> 33) as usize % 4;
                let end = (at + n).min(text.len());
                pieces.push(&text[at..end]);
                at = end;
            }
            let mut s = stream(&stops);
            let (out, stop) = run(&mut s, &pieces);
            assert_eq!(stop, whole.1);
            assert_eq!(out.concat(), whole.0.concat());
        }
        assert_eq!(whole.1.as_deref(), Some("日c"));
        assert_eq!(whole.0.concat(), "xa日bé");
    }
}
