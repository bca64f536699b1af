//! The llguidance matcher over a small vocabulary: masks, end of sequence,
//! padding rows, rollback, and every kind of bad constraint refused before
//! any step with its kind and reason.

use std::sync::Arc;

use sampler_core::{StructuredOutput, TokenConstraint, TokenId};
use sampler_structured::{Matcher, TokenBytes, TokenizerView};

/// The 256 bytes, a few multi-byte tokens, `</s>` (id 262) and two
/// padding rows: vocab 265.
fn view() -> Arc<TokenizerView> {
    let mut t: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
    for w in ["{\"", "\": ", "true", "false", "12", "ab"] {
        t.push(TokenBytes::Text(w.as_bytes().to_vec()));
    }
    t.push(TokenBytes::Special("</s>".into()));
    t.push(TokenBytes::Unused);
    t.push(TokenBytes::Unused);
    Arc::new(TokenizerView::new(t, &[EOS]).unwrap())
}
const EOS: TokenId = 262;

fn allowed(mask: &[u32]) -> Vec<TokenId> {
    (0..mask.len() as u32 * 32)
        .filter(|&t| mask[(t / 32) as usize] >> (t % 32) & 1 == 1)
        .collect()
}

fn mask_of(m: &mut Matcher, v: &TokenizerView) -> Vec<TokenId> {
    let mut mask = vec![0u32; v.mask_words()];
    m.fill_mask(&mut mask).unwrap();
    allowed(&mask)
}

fn bytes_of(s: &str) -> Vec<TokenId> {
    s.bytes().map(TokenId::from).collect()
}

#[test]
fn json_schema_masks_follow_the_schema_and_end_only_when_complete() {
    let v = view();
    let schema = r#"{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}"#;
    let mut m = Matcher::new(&v, &StructuredOutput::JsonSchema(schema.into())).unwrap();
    let first = mask_of(&mut m, &v);
    // `{` or the `{"` token; never the end, never a padding row.
    assert!(
        first.contains(&u32::from(b'{')) && first.contains(&256),
        "{first:?}"
    );
    assert!(!first.contains(&EOS) && !first.contains(&263) && !first.contains(&264));
    assert!(
        !first.contains(&u32::from(b' ')),
        "compact JSON: no leading space"
    );
    for t in [256].into_iter().chain(bytes_of("ok")).chain([257, 258]) {
        assert!(mask_of(&mut m, &v).contains(&t), "token {t} refused");
        m.consume(t).unwrap();
    }
    assert!(
        !mask_of(&mut m, &v).contains(&EOS),
        "`{{\"ok\": true` is not complete"
    );
    m.consume(u32::from(b'}')).unwrap();
    assert_eq!(mask_of(&mut m, &v), vec![EOS]);
    assert!(m.is_finished());
    m.consume(EOS).unwrap();
}

#[test]
fn a_disallowed_token_is_an_error_and_rollback_and_reset_restore_the_state() {
    let v = view();
    let mut m = Matcher::new(&v, &StructuredOutput::Regex("a[0-9]+b".into())).unwrap();
    assert_eq!(mask_of(&mut m, &v), bytes_of("a"));
    let e = m.consume(u32::from(b'x')).unwrap_err();
    assert_eq!(e.kind, "consume");
    let mut m = Matcher::new(&v, &StructuredOutput::Regex("a[0-9]+b".into())).unwrap();
    assert_eq!(m.validate(&bytes_of("a12bz")).unwrap(), 4);
    m.consume(u32::from(b'a')).unwrap();
    let digits = mask_of(&mut m, &v);
    assert!(digits.contains(&260), "the `12` token is allowed after `a`");
    m.consume(260).unwrap();
    assert!(mask_of(&mut m, &v).contains(&u32::from(b'b')));
    m.rollback(1).unwrap();
    assert_eq!(mask_of(&mut m, &v), digits);
    let forked = m.box_clone();
    m.reset().unwrap();
    assert_eq!(mask_of(&mut m, &v), bytes_of("a"));
    drop(forked);
    assert!(m.consume(999).is_err(), "out of the vocabulary");
    let mut short = vec![0u32; 3];
    assert!(m.fill_mask(&mut short).is_err(), "wrong mask length");
}

#[test]
fn bad_constraints_are_refused_with_their_kind_and_reason() {
    let v = view();
    let cases: Vec<(StructuredOutput, &str, &str)> = vec![
        (
            StructuredOutput::JsonSchema("{\"type\": ".into()),
            "json_schema",
            "line 1",
        ),
        (
            StructuredOutput::JsonSchema("[1, 2]".into()),
            "json_schema",
            "object",
        ),
        (
            StructuredOutput::JsonSchema(
                r#"{"type": "integer", "minimum": 5, "maximum": 2}"#.into(),
            ),
            "json_schema",
            "minimum",
        ),
        (StructuredOutput::Regex("a(b".into()), "regex", "a(b"),
        (
            StructuredOutput::Regex("a\\".into()),
            "regex",
            "not a valid regex",
        ),
        (
            StructuredOutput::Regex("(?x)a # c\nb".into()),
            "regex",
            "verbose mode",
        ),
        (
            StructuredOutput::Regex("[^\\x00-\\u{10FFFF}]".into()),
            "regex",
            "can match",
        ),
        (StructuredOutput::Regex("".into()), "regex", "empty output"),
        (StructuredOutput::Grammar("   ".into()), "grammar", "empty"),
        (
            StructuredOutput::Grammar("start: foo".into()),
            "grammar",
            "foo",
        ),
        (
            StructuredOutput::Grammar("start: \"\"".into()),
            "grammar",
            "empty output",
        ),
    ];
    for (spec, kind, says) in cases {
        let e = Matcher::new(&v, &spec).unwrap_err();
        assert_eq!(e.kind, kind, "{spec:?}: {e}");
        assert!(
            e.message.contains(says),
            "{spec:?}: `{e}` does not say `{says}`"
        );
    }
}

#[test]
fn the_view_refuses_a_bad_vocabulary() {
    assert!(TokenizerView::new(Vec::new(), &[0]).is_err());
    let t = vec![TokenBytes::Text(b"a".to_vec())];
    assert!(TokenizerView::new(t.clone(), &[]).is_err());
    let e = TokenizerView::new(t, &[5]).unwrap_err();
    assert!(e.message.contains("outside"), "{e}");
}

/// Deeply nested inputs (a chain of 30000 Lark rules, of 8000 `$ref`s):
/// compiled on the compiler's own stack, their masks computed on a thread
/// with a 2 MiB stack (a thread pool's); input past the size limit refused.
#[test]
fn deep_grammars_compile_and_mask_without_overflowing_the_stack() {
    let v = view();
    let n = 30_000;
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i}: r{}\n", i + 1));
    }
    g.push_str(&format!("r{n}: \"z\"\n"));
    let mut defs = serde_json::Map::new();
    for i in 0..8000 {
        defs.insert(
            format!("d{i}"),
            serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert("d8000".into(), serde_json::json!({"type": "boolean"}));
    let schema = serde_json::json!({"$ref": "#/$defs/d0", "$defs": defs}).to_string();
    for spec in [
        StructuredOutput::Grammar(g),
        StructuredOutput::JsonSchema(schema),
    ] {
        let mut m = Matcher::new(&v, &spec).unwrap();
        let words = v.mask_words();
        let allowed = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let mut mask = vec![0u32; words];
                m.fill_mask(&mut mask).map(|()| allowed(&mask))
            })
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert!(
            !allowed.is_empty() && !allowed.contains(&EOS),
            "{allowed:?}"
        );
    }
    let big = StructuredOutput::Regex("a".repeat(sampler_structured::MAX_CONSTRAINT_BYTES + 1));
    let e = Matcher::new(&v, &big).unwrap_err();
    assert!(e.message.contains("at most"), "{e}");
}
