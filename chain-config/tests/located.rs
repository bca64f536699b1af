//! Every front end reads one located tree and the stage tables of TOML and
//! tagged JSON go through one conversion: the same bad parameter gives the
//! same error in both (key path, value, range), located at its key or value,
//! with columns counted in characters. Keys given twice are found from the
//! tree, with their full path, in TOML and in JSON.

use chain_config::{ChainConfig, ConfigError, GenerationConfig, Location, SamplingParams};

fn at(line: usize, column: usize) -> Option<Location> {
    Some(Location { line, column })
}

fn toml_err(text: &str) -> ConfigError {
    ChainConfig::from_toml_str(text).expect_err(text)
}

fn json_err(text: &str) -> ConfigError {
    ChainConfig::from_json(text).expect_err(text)
}

/// The error without its location and with `stage[`/`stages[` unified.
fn shape(e: &ConfigError) -> (String, String) {
    let kind = format!("{e:?}")
        .split([' ', '{'])
        .next()
        .unwrap_or("")
        .to_string();
    let (path, detail) = match e {
        ConfigError::OutOfRange {
            path,
            value,
            expected,
            ..
        } => (path.clone(), format!("{value} / {expected}")),
        ConfigError::WrongType { path, expected, .. } => (path.clone(), expected.clone()),
        ConfigError::UnknownKey {
            path, suggestion, ..
        } => (path.clone(), format!("{suggestion:?}")),
        ConfigError::DuplicateKey { path, other, .. } => (path.clone(), other.clone()),
        ConfigError::UnknownStage {
            name, suggestion, ..
        } => (name.clone(), format!("{suggestion:?}")),
        other => (String::new(), other.to_string()),
    };
    (
        format!("{kind} {}", path.replace("stages[", "stage[")),
        detail,
    )
}

#[test]
fn toml_and_json_stage_tables_share_one_conversion() {
    // (TOML value, JSON value) of one parameter of a `top_p` stage.
    let cases = [
        ("min_keep = -3", r#""min_keep": -3"#),
        ("p = 1.5", r#""p": 1.5"#),
        ("p = \"0.5\"", r#""p": "0.5""#),
        ("p = 1e39", r#""p": 1e39"#),
        ("min_kep = 1", r#""min_kep": 1"#),
        (
            "p = 0.5\nmin_keep = 1\nmin_keep_ = 2",
            r#""p": 0.5, "min_keep": 1, "min_keep_": 2"#,
        ),
    ];
    for (toml_kv, json_kv) in cases {
        let t = toml_err(&format!(
            "[[stage]]\ntype = \"top_p\"\n{toml_kv}\n[[stage]]\ntype = \"dist\"\n"
        ));
        let j = json_err(&format!(
            r#"{{"stages": [{{"type": "top_p", {json_kv}}}, {{"type": "dist"}}]}}"#
        ));
        let (ts, js) = (shape(&t), shape(&j));
        assert_eq!(ts.0, js.0, "TOML: {t}\nJSON: {j}");
        // The value is shown as written in TOML and as read in JSON; the
        // range is the registry's in both.
        let range = |d: &str| d.rsplit(" / ").next().unwrap_or("").to_string();
        assert_eq!(range(&ts.1), range(&js.1), "TOML: {t}\nJSON: {j}");
        assert!(
            t.location().is_some() && j.location().is_some(),
            "{t} / {j}"
        );
    }
    // A bad `dry` sequence breaker and a bad `logit_bias` token in both forms.
    let t = toml_err(
        "[[stage]]\ntype = \"dry\"\nmultiplier = 0.5\nseq_breakers = [[1], []]\n[[stage]]\ntype = \"dist\"\n",
    );
    let j = json_err(
        r#"{"stages": [{"type": "dry", "multiplier": 0.5, "seq_breakers": [[1], []]}, {"type": "dist"}]}"#,
    );
    assert_eq!(shape(&t), shape(&j), "TOML: {t}\nJSON: {j}");
    let t = toml_err(
        "[[stage]]\ntype = \"logit_bias\"\nbias = [[-1, 2.0]]\n[[stage]]\ntype = \"dist\"\n",
    );
    let j =
        json_err(r#"{"stages": [{"type": "logit_bias", "bias": [[-1, 2.0]]}, {"type": "dist"}]}"#);
    assert_eq!(shape(&t), shape(&j), "TOML: {t}\nJSON: {j}");
    assert!(t.to_string().contains("bias[0][0]"), "{t}");
}

#[test]
fn columns_count_characters_not_bytes() {
    // `é` and `✓` are 2 and 3 bytes: columns are characters.
    let e = json_err(r#"{"seed": 1, "stages": [{"type": "top_k", "é✓": 1, "kk": 2}]}"#);
    assert!(matches!(e, ConfigError::UnknownKey { .. }), "{e}");
    assert_eq!(e.location(), at(1, 42), "{e}");
    let e = SamplingParams::from_json_str("{\"logit_bias\": {\"1\": 0.5}, \"✓\": 1}").unwrap_err();
    assert_eq!(e.location(), at(1, 28), "{e}");
    let e = toml_err("samplers = \"top_k;dist\" # ✓✓\n[top_k]\nk = \"é\"\n");
    assert_eq!(e.location(), at(3, 5), "{e}");
}

#[test]
fn keys_given_twice_are_found_from_the_tree() {
    // TOML: a key twice in a table, a table header twice, a dotted key over
    // a table, a key twice in an array-of-tables entry, twice in [device].
    let e = toml_err("samplers = \"top_k;dist\"\n[top_k]\nk = 1\nk = 2\n");
    assert!(e.to_string().contains("duplicate key `top_k.k`"), "{e}");
    assert_eq!(e.location(), at(4, 1));
    let e = toml_err("[device]\nkind = \"flex\"\n[device]\nkind = \"flex\"\n");
    assert!(e.to_string().contains("duplicate key `device`"), "{e}");
    assert_eq!(e.location(), at(3, 2));
    let e = toml_err("samplers = \"top_k;dist\"\n[top_k]\nk = 1\n[top_k]\nk = 2\n");
    assert!(
        matches!(e, ConfigError::DuplicateStage { stage: "top_k", .. }),
        "{e}"
    );
    let e = toml_err(
        "[[stage]]\ntype = \"top_k\"\nk = 1\n[[stage]]\ntype = \"top_p\"\np = 0.5\np = 0.6\n",
    );
    assert!(e.to_string().contains("duplicate key `stage[1].p`"), "{e}");
    assert_eq!(e.location(), at(7, 1));
    let e = toml_err("seed = 1\nsamplers = \"dist\"\nseed.x = 2\n");
    assert!(e.to_string().contains("duplicate key `seed`"), "{e}");
    // Other syntax errors keep toml's own message and location.
    let e = toml_err("samplers = \"top_k;dist\"\n[top_k\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    assert!(!e.to_string().contains("duplicate"), "{e}");
    assert_eq!(e.location().map(|l| l.line), Some(2), "{e}");

    // JSON: the path of the second key and its location, at any depth.
    let e = json_err(
        "{\"stages\": [{\"type\": \"dist\"},\n  {\"type\": \"top_k\", \"k\": 3,\n   \"k\": 4}]}",
    );
    assert!(
        matches!(e, ConfigError::DuplicateKey { ref path, .. } if path == "stages[1].k"),
        "{e}"
    );
    assert_eq!(e.location(), at(3, 4), "{e}");
    let e = GenerationConfig::from_json_str("{\"top_p\": 0.9,\n\"top_p\": 0.8}").unwrap_err();
    assert_eq!(e.location(), at(2, 1), "{e}");
    // Equal keys in different objects are not duplicates.
    let ok = ChainConfig::from_json(
        r#"{"stages": [{"type": "top_k", "k": 3}, {"type": "top_k", "k": 4}, {"type": "dist"}]}"#,
    );
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn json_is_strict_json() {
    // Comments and trailing commas are not JSON: serde_json's syntax errors.
    for text in [
        "{\"stages\": [{\"type\": \"dist\"}],}",
        "{\"stages\": [{\"type\": \"dist\"}] // c\n}",
        "{stages: [{\"type\": \"dist\"}]}",
    ] {
        let e = json_err(text);
        assert!(matches!(e, ConfigError::Syntax { .. }), "{text}: {e}");
        assert!(e.location().is_some(), "{e}");
    }
}

/// Findings of a hostile review of the located pipeline, one assertion each.
#[test]
fn review_findings_stay_fixed() {
    // JSON syntax errors: columns in characters (serde_json counts bytes).
    let e = json_err(r#"{"a": "ü✓✓✓", "stages": [{"type": "dist"},]}"#);
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    assert_eq!(e.location(), at(1, 43), "{e}");
    // A TOML value that looks like an earlier key is not a duplicate key.
    let e = toml_err("samplers = \"top_k;top_p;dist\"\n[top_k]\nk = 1\n[top_p]\np = k");
    assert!(!e.to_string().contains("duplicate"), "{e}");
    let e = toml_err("seed = 1\nsamplers = seed");
    assert!(!e.to_string().contains("duplicate"), "{e}");
    // A dotted duplicate names its own table.
    let e =
        toml_err("samplers = \"top_p;min_p;dist\"\ntop_p.p = 0.9\nmin_p.p = 0.05\ntop_p.p = 0.95");
    assert!(e.to_string().contains("duplicate key `top_p.p`"), "{e}");
    // Flat aliases: the key as written, located; both spellings refused.
    let e = SamplingParams::from_json_str(r#"{"penalty_last_n": -2}"#).unwrap_err();
    assert!(
        e.to_string().starts_with("1:2: `penalty_last_n` = -2"),
        "{e}"
    );
    let e =
        SamplingParams::from_json_str(r#"{"repeat_last_n": 1, "penalty_last_n": 2}"#).unwrap_err();
    assert!(
        matches!(e, ConfigError::DuplicateKey { ref path, ref other, .. }
            if path == "penalty_last_n" && other == "repeat_last_n"),
        "{e}"
    );
    assert_eq!(e.location(), at(1, 22), "{e}");
    // A byte-order mark: no column in TOML, skipped in JSON.
    let e = toml_err("\u{feff}samplers = \"top_kk;dist\"");
    assert_eq!(e.location(), at(1, 13), "{e}");
    assert!(GenerationConfig::from_json_str("\u{feff}{\"top_k\": 5}").is_ok());
    assert!(ChainConfig::from_json("\u{feff}{\"stages\": [{\"type\": \"dist\"}]}").is_ok());
    // The same key twice is not "also as" itself.
    let e = json_err(r#"{"stages": [{"type": "top_k", "k": 1, "k": 2}]}"#);
    assert_eq!(e.to_string(), "1:39: `stages[0].k` is given twice");
    // JSON values that reading changes are shown as written.
    let e = json_err(r#"{"stages": [{"type": "epsilon", "epsilon": 0.99999999}]}"#);
    assert!(
        e.to_string().contains("= 0.99999999 is out of range"),
        "{e}"
    );
    let e = json_err(r#"{"stages": [{"type": "top_p", "p": -1e-45}]}"#);
    assert!(e.to_string().contains("= -1e-45 is out of range"), "{e}");
    let e = json_err(r#"{"stages": [{"type": "top_k", "k": 1e2}]}"#);
    assert!(e.to_string().contains("found number 1e2"), "{e}");
    // An integer too long for any integer type is out of range, as written.
    let big = "9".repeat(41);
    let e = json_err(&format!(
        r#"{{"stages": [{{"type": "top_k", "k": {big}}}]}}"#
    ));
    assert!(matches!(e, ConfigError::OutOfRange { .. }), "{e}");
    let e = toml_err(&format!("seed = {big}\nsamplers = \"dist\""));
    assert!(matches!(e, ConfigError::OutOfRange { .. }), "{e}");
    // TOML integers stop at 2^63 - 1: larger seeds and counts are strings.
    for text in [
        "seed = 18446744073709551615\nsamplers = \"dist\"",
        "samplers = \"top_p;dist\"\n[top_p]\np = 0.5\nmin_keep = 18446744073709551615",
        "samplers = \"dist\"\n[device]\noffload = 18446744073709551615",
    ] {
        let e = toml_err(text);
        assert!(matches!(e, ConfigError::OutOfRange { .. }), "{text}: {e}");
    }
    assert!(
        ChainConfig::from_toml_str("seed = \"18446744073709551615\"\nsamplers = \"dist\"").is_ok()
    );
}
