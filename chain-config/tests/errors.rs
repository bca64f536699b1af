//! Bad input: every error is typed, names its key path, value, range and
//! `line:column`, and its message is pinned here.

use chain_config::{
    ChainConfig, ConfigError, GenerationConfig, LoadOptions, Location, SamplingParams,
};

fn toml_err(text: &str) -> ConfigError {
    match ChainConfig::from_toml_str(text) {
        Ok(c) => panic!("accepted: {:?}\n{text}", c.chain),
        Err(e) => e,
    }
}

fn msg(text: &str) -> String {
    toml_err(text).to_string()
}

fn at(line: usize, column: usize) -> Option<Location> {
    Some(Location { line, column })
}

#[test]
fn unknown_stage_in_samplers_suggests() {
    let e = toml_err("samplers = \"top_k;top_kk;dist\"");
    assert_eq!(
        e,
        ConfigError::UnknownStage {
            name: "top_kk".into(),
            location: at(1, 19),
            suggestion: Some("top_k".into()),
        }
    );
    assert_eq!(
        e.to_string(),
        "1:19: unknown stage `top_kk` (did you mean `top_k`?)"
    );
    assert_eq!(e.suggestion(), Some("top_k"));
}

#[test]
fn unknown_stage_table_suggests() {
    assert_eq!(
        msg("samplers = \"top_k;dist\"\n[top_kk]\nk = 3\n"),
        "2:2: unknown stage `top_kk` (did you mean `top_k`?)"
    );
    assert_eq!(
        msg("[[stage]]\ntype = \"topkk\"\n"),
        "2:8: unknown stage `topkk` (did you mean `top_k`?)"
    );
    assert_eq!(
        msg("samplers = \"temprature;dist\""),
        "1:13: unknown stage `temprature` (did you mean `temperature`?)"
    );
}

#[test]
fn unknown_keys_suggest() {
    assert_eq!(
        msg("samplers = \"top_k;dist\"\n[top_k]\nkk = 3\n"),
        "3:1: unknown key `top_k.kk` (did you mean `k`?)"
    );
    assert_eq!(
        msg("samplers = \"top_k;dist\"\ntop_kk = 3\n"),
        "2:1: unknown key `top_kk` (did you mean `top_k`?)"
    );
    assert_eq!(
        msg("sampler = \"top_k;dist\"\n"),
        "1:1: unknown key `sampler` (did you mean `samplers`?)"
    );
    assert_eq!(
        msg("[[stage]]\ntype = \"top_k\"\nk = 3\n[[stage]]\ntype = \"temp\"\ntt = 3\n"),
        "6:1: unknown key `stage[1].tt` (did you mean `t`?)"
    );
    assert_eq!(
        msg("samplers = \"dist\"\n[device]\nknd = \"cuda\"\n"),
        "3:1: unknown key `device.knd` (did you mean `kind`?)"
    );
    assert_eq!(
        msg("samplers = \"dist\"\nfoo = 1"),
        "2:1: unknown key `foo`"
    );
}

#[test]
fn out_of_range_names_path_value_range_and_position() {
    let e = toml_err("samplers = \"top_p;dist\"\n[top_p]\np = 1.50\n");
    assert_eq!(
        e,
        ConfigError::OutOfRange {
            path: "top_p.p".into(),
            value: "1.50".into(),
            expected: "a number in [0, 1]".into(),
            location: at(3, 5),
        }
    );
    assert_eq!(
        e.to_string(),
        "3:5: `top_p.p` = 1.50 is out of range: expected a number in [0, 1]"
    );
    assert_eq!(
        msg("samplers = \"temp;dist\"\n[temp]\nt = -0.5\n"),
        "3:5: `temp.t` = -0.5 is out of range: expected a finite number >= 0 (t < 1e-5 means greedy)"
    );
    assert_eq!(
        msg("samplers = \"top_k;dist\"\n[top_k]\nk = 99999999999999999999\n"),
        "3:5: `top_k.k` = 99999999999999999999 is out of range: expected an integer (k <= 0 disables)"
    );
    assert_eq!(
        msg("samplers = \"penalties;dist\"\n[penalties]\nrepeat = 0.0\n"),
        "3:10: `penalties.repeat` = 0.0 is out of range: expected a finite number >= 2.938736e-39 (> 0, and 1/repeat finite)"
    );
    assert_eq!(
        msg("[[stage]]\ntype = \"mirostat\"\nm = 0\n"),
        "3:5: `stage[0].m` = 0 is out of range: expected an integer >= 1"
    );
    assert_eq!(
        msg("samplers = \"penalties;dist\"\n[penalties]\nscope = \"outputs\"\n"),
        "3:9: `penalties.scope` = \"outputs\" is out of range: expected \"prompt_and_output\" or \"output\""
    );
}

/// bug_cases.md case 9: a negative window from config names the field.
#[test]
fn negative_last_n_is_a_config_error() {
    let e = toml_err("samplers = \"penalties;dist\"\n[penalties]\nlast_n = -1\n");
    assert_eq!(
        e.to_string(),
        "3:10: `penalties.last_n` = -1 is out of range: expected an integer >= 0 (0 disables)"
    );
    assert_eq!(
        msg("samplers = \"dry;dist\"\n[dry]\nlast_n = -64\n"),
        "3:10: `dry.last_n` = -64 is out of range: expected an integer >= 0 (0 disables)"
    );
    let e = SamplingParams::from_json_str(r#"{"repeat_last_n": -1}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "1:2: `repeat_last_n` = -1 is out of range: expected an integer >= 0 (0 disables)"
    );
}

#[test]
fn wrong_types() {
    assert_eq!(
        msg("samplers = \"top_p;dist\"\n[top_p]\np = \"high\"\n"),
        "3:5: `top_p.p` has the wrong type: found string \"high\", expected a number in [0, 1]"
    );
    assert_eq!(
        msg("samplers = \"top_k;dist\"\n[top_k]\nk = 4.5\n"),
        "3:5: `top_k.k` has the wrong type: found float 4.5, expected an integer (k <= 0 disables)"
    );
    assert_eq!(
        msg("samplers = 3"),
        "1:12: `samplers` has the wrong type: found integer 3, expected a `;`-separated string of stage names (or an array of names)"
    );
    assert_eq!(
        msg("samplers = [\"top_k\", 3]"),
        "1:22: `samplers[1]` has the wrong type: found integer 3, expected a stage name (string)"
    );
    assert_eq!(
        msg("samplers = \"dist\"\nseed = 1.5\n"),
        "2:8: `seed` has the wrong type: found float 1.5, expected an integer in [0, 2^64 - 1] (seeds above 2^63 - 1 as a decimal string)"
    );
    assert_eq!(
        msg("samplers = \"top_k;dist\"\ntop_k = 40\n"),
        "2:9: `top_k` has the wrong type: found integer 40, expected a table of `top_k` parameters (`[top_k]` followed by its keys)"
    );
}

#[test]
fn seeds() {
    assert_eq!(
        msg("samplers = \"dist\"\nseed = -3\n"),
        "2:8: `seed` = -3 is out of range: expected an integer in [0, 2^64 - 1] (seeds above 2^63 - 1 as a decimal string)"
    );
    let c = ChainConfig::from_toml_str("samplers = \"dist\"\nseed = \"18446744073709551615\"\n")
        .unwrap();
    assert_eq!(c.chain.seed, Some(u64::MAX));
}

#[test]
fn token_lists_and_biases() {
    assert_eq!(
        msg(
            "samplers = \"logit_bias;dist\"\n[logit_bias]\nbias = { \"15043\" = 5.0, \"abc\" = 1 }\n"
        ),
        "3:25: `logit_bias.bias.\"abc\"` = \"abc\" is out of range: expected a token id in [0, 4294967295] as the key, e.g. `\"15043\" = -1.5`"
    );
    assert_eq!(
        msg(
            "samplers = \"logit_bias;dist\"\n[logit_bias]\nbias = { \"15043\" = 5.0, \"2\" = inf }\n"
        ),
        "3:31: `logit_bias.bias.\"2\"` = inf is out of range: expected token id -> a finite number or -inf (ban)"
    );
    assert_eq!(
        msg("samplers = \"dry;dist\"\n[dry]\nseq_breakers = [[13], []]\n"),
        "3:23: `dry.seq_breakers[1]` = [] is out of range: expected a list of non-empty token-id lists"
    );
    assert_eq!(
        msg("samplers = \"dry;dist\"\n[dry]\nseq_breakers = [[13], [-1]]\n"),
        "3:24: `dry.seq_breakers[1][0]` = -1 is out of range: expected a token id in [0, 4294967295]"
    );
    assert_eq!(
        msg("samplers = \"dry;dist\"\n[dry]\nseq_breakers = [[13]]\nsequence_breakers = [[1]]\n"),
        "4:1: `dry.sequence_breakers` is given twice (also as `dry.seq_breakers`)"
    );
}

#[test]
fn empty_chains() {
    assert_eq!(
        msg("samplers = \"\""),
        "1:12: the chain is empty: list its stages, e.g. `samplers = \"top_k;top_p;temperature;dist\"`"
    );
    assert_eq!(toml_err(""), ConfigError::EmptyChain { location: None });
    assert_eq!(
        toml_err("stage = []"),
        ConfigError::EmptyChain { location: at(1, 1) }
    );
    assert_eq!(
        ChainConfig::from_chain_string(" ; ")
            .unwrap_err()
            .to_string(),
        "1:1: the chain is empty: list its stages, e.g. `samplers = \"top_k;top_p;temperature;dist\"`"
    );
}

/// bug_cases.md case 2: a chain that never selects, asked for a token.
#[test]
fn no_selecting_stage() {
    let e = toml_err("samplers = \"top_k;top_p\"");
    assert_eq!(
        e.to_string(),
        "1:12: the chain `top_k;top_p` never selects a token: add `dist` (random) or `greedy` at the end"
    );
    assert_eq!(
        ChainConfig::from_chain_string("top_k")
            .unwrap_err()
            .to_string(),
        "1:1: the chain `top_k` never selects a token: add `dist` (random) or `greedy` at the end"
    );
    // Filtering only is fine when no token is asked for.
    let opts = LoadOptions {
        require_selection: false,
    };
    let c = ChainConfig::from_toml_str_with("samplers = \"top_k;top_p\"", &opts).unwrap();
    assert_eq!(c.chain.chain_string(), "top_k;top_p");
}

#[test]
fn duplicate_stage_tables() {
    let e = toml_err("samplers = \"top_k;dist\"\n[top_k]\nk = 3\n[top-k]\nk = 4\n");
    assert_eq!(
        e,
        ConfigError::DuplicateStage {
            stage: "top_k",
            first: "top_k".into(),
            second: "top-k".into(),
            location: at(4, 2),
        }
    );
    assert_eq!(
        e.to_string(),
        "4:2: duplicate stage table `[top-k]`: `[top_k]` already configures stage `top_k`"
    );
    assert_eq!(
        msg("samplers = \"top_k;dist\"\n[top_k]\nk = 3\n[top_k]\nk = 4\n"),
        "4:2: duplicate stage table `[top_k]`: `[top_k]` already configures stage `top_k`"
    );
    assert_eq!(
        msg("samplers = \"top_k;dist\"\n[top_k]\nk = 3\nk = 4\n"),
        "4:1: TOML syntax error: duplicate key `top_k.k`: each key may be given once per table"
    );
}

#[test]
fn order_must_be_explicit() {
    let e = toml_err("[temp]\nt = 0.5\n[top_k]\nk = 3\n");
    assert_eq!(
        e.to_string(),
        "1:2: stage tables [\"top_k\", \"temperature\"] are given but the order is not: add `samplers = \"top_k;temperature;dist\"` (or use `[[stage]]` tables)"
    );
    assert_eq!(e.suggestion(), Some("top_k;temperature;dist"));
    assert_eq!(
        msg("samplers = \"top_k;dist\"\n[min_p]\np = 0.1\n"),
        "2:2: table `[min_p]` configures stage `min_p`, which `samplers` does not list: add it to `samplers` or remove the table"
    );
    assert_eq!(
        msg("samplers = \"dist\"\n[[stage]]\ntype = \"dist\"\n"),
        "1:12: `samplers` and `[[stage]]` both give the chain: use one of them"
    );
    assert_eq!(
        msg("[[stage]]\ntype = \"dist\"\n[top_k]\nk = 1\n"),
        "3:2: `[top_k]` cannot be combined with `[[stage]]`: put its keys in the `[[stage]]` entry"
    );
    assert_eq!(
        msg("[[stage]]\nk = 3\n"),
        "1:1: missing key `stage[0].type`: every `[[stage]]` needs `type = \"<stage name>\"`, e.g. `type = \"top_k\"`"
    );
}

#[test]
fn device_section() {
    assert_eq!(
        msg("samplers = \"dist\"\n[device]\noffload = \"sometimes\"\n"),
        "3:11: `device.offload` = \"sometimes\" is out of range: expected \"auto\" (fastest where known: the longest device-capable prefix on a GPU, the host on a CPU device), \"off\" (host only), \"device\" (longest device-capable prefix on any device) or an integer N >= 0 (at most N active stages on the device)"
    );
    assert_eq!(
        msg("samplers = \"dist\"\n[device]\nkind = \"cdua\"\n"),
        "3:8: `device.kind` = \"cdua\" is out of range: expected one of cpu, flex, ndarray, wgpu, vulkan, cuda, optionally with `:index` (e.g. \"cuda:1\"); did you mean \"cuda\"?"
    );
    assert_eq!(
        msg("samplers = \"dist\"\n[device]\noffload = -2\n"),
        "3:11: `device.offload` = -2 is out of range: expected \"auto\" (fastest where known: the longest device-capable prefix on a GPU, the host on a CPU device), \"off\" (host only), \"device\" (longest device-capable prefix on any device) or an integer N >= 0 (at most N active stages on the device)"
    );
}

#[test]
fn toml_syntax() {
    let e = toml_err("samplers = \"dist\"\n[device\n");
    assert_eq!(
        e.to_string(),
        "2:8: TOML syntax error: unclosed table, expected `]`"
    );
    assert_eq!(e.location(), at(2, 8));
}

#[test]
fn chain_strings_and_letters() {
    assert_eq!(
        ChainConfig::from_chain_string("top_k;  nucleuss")
            .unwrap_err()
            .to_string(),
        "1:9: unknown stage `nucleuss` (did you mean `nucleus`?)"
    );
    assert_eq!(
        ChainConfig::from_sampling_seq("kpq").unwrap_err(),
        ConfigError::UnknownSeqLetter {
            letter: 'q',
            position: 2
        }
    );
    assert_eq!(
        ChainConfig::from_sampling_seq("kpq")
            .unwrap_err()
            .to_string(),
        "unknown --sampling-seq letter `q` at position 2 (letters: e d s k y p m x t)"
    );
}

#[test]
fn json_errors() {
    let err = |j: &str| ChainConfig::from_json(j).unwrap_err().to_string();
    assert_eq!(
        err(r#"{"stages":[{"type":"top_kk","k":40}]}"#),
        "1:20: unknown stage `top_kk` (did you mean `top_k`?)"
    );
    assert_eq!(
        err(r#"{"stages":[{"type":"top_k","kk":40}]}"#),
        "1:28: unknown key `stages[0].kk` (did you mean `k`?)"
    );
    assert_eq!(
        err(r#"{"stages":[{"type":"top_k","k":"a"}]}"#),
        "1:28: `stages[0].k` has the wrong type: found string \"a\", expected an integer (k <= 0 disables)"
    );
    assert_eq!(
        err(r#"{"stage":[]}"#),
        "1:2: unknown key `stage` (did you mean `stages`?)"
    );
    assert_eq!(
        err(r#"{"stages":[{"type":"top_p","p":2.0},{"type":"dist"}]}"#),
        "1:28: `stages[0].p` = 2 is out of range: expected a number in [0, 1]"
    );
    assert_eq!(
        err(r#"{"stages":[{"type":"top_p"}]"#),
        "1:28: JSON syntax error: EOF while parsing an object"
    );
    assert_eq!(
        err(r#"{"stages":[]}"#),
        "the chain is empty: list its stages, e.g. `samplers = \"top_k;top_p;temperature;dist\"`"
    );
}

#[test]
fn flat_parameter_errors() {
    let err = |j: &str| SamplingParams::from_json_str(j).unwrap_err().to_string();
    assert_eq!(
        err(r#"{"top_kk": 3}"#),
        "1:2: unknown key `top_kk` (did you mean `top_k`?)"
    );
    assert_eq!(
        err(r#"{"temperature": -1}"#),
        "1:2: `temperature` = -1 is out of range: expected a finite number >= 0 (0 = greedy)"
    );
    assert_eq!(
        err(r#"{"temperature": "hot"}"#),
        "1:2: `temperature` has the wrong type: found string \"hot\", expected a finite number >= 0 (0 = greedy)"
    );
    assert_eq!(
        err(r#"{"top_k": -2}"#),
        "1:2: `top_k` = -2 is out of range: expected -1 or 0 (off), or an integer >= 1 (1 = greedy)"
    );
    assert_eq!(
        err(r#"{"presence_penalty": 2.5}"#),
        "1:2: `presence_penalty` = 2.5 is out of range: expected a number in [-2, 2]"
    );
    let p = SamplingParams {
        top_p: Some(1.5),
        ..Default::default()
    };
    assert_eq!(
        p.to_chain().unwrap_err().to_string(),
        "`top_p` = 1.5 is out of range: expected a number in [0, 1] (0 = greedy, 1 = off)"
    );
}

#[test]
fn generation_config_errors() {
    let err = |j: &str| GenerationConfig::from_json_str(j).unwrap_err().to_string();
    assert_eq!(
        err("{\n  \"temperature\": \"warm\"\n}"),
        "2:3: `temperature` has the wrong type: found string \"warm\", expected a finite number >= 0 (0 = greedy)"
    );
    assert_eq!(
        err("{\n  \"top_p\": 1.2\n}"),
        "2:3: `top_p` = 1.2 is out of range: expected a number in [0, 1] (0 = greedy, 1 = off)"
    );
    assert_eq!(
        err("{\"top_k\": 5.5}"),
        "1:2: `top_k` has the wrong type: found number 5.5, expected -1 or 0 (off), or an integer >= 1 (1 = greedy)"
    );
    assert_eq!(
        err("[1]"),
        "1:1: `(root)` has the wrong type: found array, expected a JSON object"
    );
}

#[test]
fn io_error() {
    let e = ChainConfig::from_toml_file("/nonexistent/chain.toml").unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(
        e.to_string()
            .starts_with("cannot read `/nonexistent/chain.toml`: "),
        "{e}"
    );
}
