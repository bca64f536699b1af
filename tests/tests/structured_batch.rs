//! Structured outputs in the serving batch on every compiled device:
//! requests held to a JSON schema, a regex or a Lark grammar (llguidance
//! matchers from sampler-structured) over a small byte-level vocabulary
//! with random logits. Every finished output matches its constraint, the
//! device path gives the CPU path's tokens, unconstrained neighbours give
//! the tokens they give alone, and a failing constraint fails only its own
//! request.

mod device_support;

use std::sync::Arc;

use device_support::upload;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sampler_backend::burn_tensor::Device;
use sampler_backend::{BackendError, Draft, RequestId, SamplingBatch};
use sampler_core::{
    ChainSpec, ConstraintError, OffloadPolicy, SampleError, StageSpec as S, StructuredOutput,
    TokenConstraint, TokenId,
};
use sampler_structured::{Matcher, TokenBytes, TokenizerView};

/// Multi-byte tokens on top of the 256 bytes.
const WORDS: [&str; 14] = [
    "{\"", "\": ", "\", \"", "\"}", "true", "false", "name", "age", "ok", "12", "abc", "@", ".com",
    "cat",
];
/// `</s>`, after the bytes and the words; two padding rows follow.
const EOS: TokenId = 256 + WORDS.len() as TokenId;
const V: usize = EOS as usize + 3;

fn view() -> Arc<TokenizerView> {
    let mut t: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
    t.extend(
        WORDS
            .iter()
            .map(|w| TokenBytes::Text(w.as_bytes().to_vec())),
    );
    t.push(TokenBytes::Special("</s>".into()));
    t.push(TokenBytes::Unused);
    t.push(TokenBytes::Unused);
    Arc::new(TokenizerView::new(t, &[EOS]).unwrap())
}

fn text(tokens: &[TokenId]) -> String {
    let mut out = Vec::new();
    for &t in tokens {
        match t {
            0..=255 => out.push(t as u8),
            t if t < EOS => out.extend_from_slice(WORDS[t as usize - 256].as_bytes()),
            _ => {}
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

const SCHEMA: &str = r#"{"type": "object", "properties": {"name": {"type": "string", "enum": ["cat", "abc"]}, "age": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}, "required": ["name", "age"], "additionalProperties": false}"#;
const REGEX: &str = "[a-c]{1,4}@(abc|cat)\\.com";
const GRAMMAR: &str =
    "start: item (\";\" item)*\nitem: \"cat\" | \"ok\" | NUM\nNUM: /[0-9]{1,2}/\n";

/// The constraints, each with a check of a finished output written
/// without llguidance.
/// A check of a finished output, written without llguidance.
type Check = fn(&str) -> bool;

fn constraints() -> Vec<(StructuredOutput, Check)> {
    vec![
        (StructuredOutput::JsonSchema(SCHEMA.into()), |s| {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(s) else {
                return false;
            };
            let Some(o) = v.as_object() else { return false };
            let name_ok = matches!(o.get("name").and_then(|n| n.as_str()), Some("cat" | "abc"));
            let age_ok = o
                .get("age")
                .and_then(|a| a.as_i64())
                .is_some_and(|a| (0..=99).contains(&a));
            let ok_ok = o.get("ok").is_none_or(|b| b.is_boolean());
            name_ok
                && age_ok
                && ok_ok
                && o.keys()
                    .all(|k| ["name", "age", "ok"].contains(&k.as_str()))
        }),
        (StructuredOutput::JsonObject, |s| {
            serde_json::from_str::<serde_json::Value>(s).is_ok_and(|v| v.is_object())
        }),
        (StructuredOutput::Regex(REGEX.into()), |s| {
            let Some((user, host)) = s.split_once('@') else {
                return false;
            };
            (1..=4).contains(&user.len())
                && user.bytes().all(|b| (b'a'..=b'c').contains(&b))
                && (host == "abc.com" || host == "cat.com")
        }),
        (StructuredOutput::Grammar(GRAMMAR.into()), |s| {
            s.split(';').all(|it| {
                it == "cat"
                    || it == "ok"
                    || ((1..=2).contains(&it.len()) && it.bytes().all(|b| b.is_ascii_digit()))
            })
        }),
    ]
}

fn chain(i: usize) -> Vec<S> {
    let temp = S::Temperature {
        t: 1.0 + 0.25 * (i % 3) as f32,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
    };
    match i % 3 {
        0 => vec![S::Mask, S::Dist],
        1 => vec![S::Mask, S::TopK { k: 40 }, temp, S::Dist],
        _ => vec![S::Mask, temp, S::Dist],
    }
}

/// Logits favouring the bytes a model would write (letters, digits,
/// punctuation), so that outputs finish within the steps given.
fn logits(rng: &mut ChaCha8Rng, rows: usize) -> Vec<f32> {
    (0..rows * V)
        .map(|i| {
            let t = i % V;
            let base = if t >= 256 || (32..127).contains(&t) {
                1.0
            } else {
                -4.0
            };
            base + rng.random_range(-2.0f32..2.0)
        })
        .collect()
}

/// Run `n` requests (constraint `i % 4`, or none where `plain(i)`) to the
/// end of sequence or `steps`: each one's tokens and whether it finished.
fn run(
    d: &Device,
    policy: OffloadPolicy,
    n: usize,
    plain: impl Fn(usize) -> bool,
    steps: usize,
) -> Vec<(Vec<TokenId>, bool)> {
    let view = view();
    let cons = constraints();
    let mut batch = SamplingBatch::new(V, d, policy).unwrap();
    let ids: Vec<RequestId> = (0..n)
        .map(|i| {
            let id = batch
                .insert(ChainSpec::new(chain(i), Some(1000 + i as u64)), &[])
                .unwrap();
            if !plain(i) {
                let m = Matcher::new(&view, &cons[i % cons.len()].0).unwrap();
                batch.set_constraint(id, Some(Box::new(m))).unwrap();
            }
            id
        })
        .collect();
    let mut done = vec![false; n];
    // Logits per request and step, whatever else runs.
    let mut rngs: Vec<ChaCha8Rng> = (0..n)
        .map(|i| ChaCha8Rng::seed_from_u64(77 + i as u64))
        .collect();
    for _ in 0..steps {
        let live: Vec<usize> = (0..n).filter(|&i| !done[i]).collect();
        if live.is_empty() {
            break;
        }
        let rows: Vec<f32> = live.iter().flat_map(|&i| logits(&mut rngs[i], 1)).collect();
        let step_ids: Vec<RequestId> = live.iter().map(|&i| ids[i]).collect();
        let out = batch
            .step(&step_ids, upload(&rows, live.len(), V, d))
            .unwrap();
        for (&i, t) in live.iter().zip(&out.tokens) {
            let t = *t.as_ref().unwrap_or_else(|e| panic!("request {i}: {e}"));
            done[i] |= t == EOS;
        }
    }
    ids.iter()
        .zip(&done)
        .map(|(&id, &fin)| (batch.outputs(id).unwrap().to_vec(), fin))
        .collect()
}

/// Every finished constrained output matches its constraint, the device
/// path (everything offloaded) gives the CPU path's tokens, and the
/// unconstrained requests among them give the tokens they give alone.
fn constrained_requests_match_their_constraint_and_the_cpu(d: &Device, dev: &str) {
    let (n, steps) = if dev == "flex" { (24, 48) } else { (8, 40) };
    let plain = |i: usize| i % 5 == 4;
    let cpu = run(d, OffloadPolicy::Off, n, plain, steps);
    let cons = constraints();
    let mut finished = 0;
    for (i, (tokens, fin)) in cpu.iter().enumerate() {
        if plain(i) || !fin {
            continue;
        }
        finished += 1;
        let s = text(&tokens[..tokens.len() - 1]);
        assert!(
            cons[i % cons.len()].1(&s),
            "request {i}: {s:?} breaks {:?}",
            cons[i % cons.len()].0
        );
        assert!(
            tokens.iter().all(|&t| (t as usize) < V - 2),
            "a padding row was sampled"
        );
    }
    assert!(
        finished * 2 >= n,
        "{finished} of {n} outputs finished in {steps} steps"
    );
    let device = run(d, OffloadPolicy::Device, n, plain, steps);
    assert_eq!(device, cpu, "{dev}: device and CPU paths differ");
    let alone = run(d, OffloadPolicy::Device, n, |_| true, steps);
    for i in (0..n).filter(|&i| plain(i)) {
        assert_eq!(alone[i], cpu[i], "{dev}: unconstrained request {i} changed");
    }
}

/// A matcher that fails its third mask.
#[derive(Clone)]
struct FailsAt {
    left: usize,
}
impl TokenConstraint for FailsAt {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError> {
        if self.left == 0 {
            return Err(ConstraintError {
                kind: "mask",
                message: "planted failure".into(),
            });
        }
        self.left -= 1;
        mask.fill(u32::MAX);
        Ok(())
    }
    fn consume(&mut self, _: TokenId) -> Result<(), ConstraintError> {
        Ok(())
    }
    fn validate(&mut self, t: &[TokenId]) -> Result<usize, ConstraintError> {
        Ok(t.len())
    }
    fn rollback(&mut self, _: usize) -> Result<(), ConstraintError> {
        Ok(())
    }
    fn reset(&mut self) -> Result<(), ConstraintError> {
        Ok(())
    }
    fn is_finished(&self) -> bool {
        false
    }
    fn box_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

/// A failed matcher, a committed token the grammar refuses and drafts for a
/// constrained request fail that request only; `fork` copies the matcher,
/// `reset` rewinds it; a chain without a `mask` stage is refused.
fn failures_stay_with_their_request(d: &Device, dev: &str) {
    let view = view();
    let mut batch = SamplingBatch::new(V, d, OffloadPolicy::Device).unwrap();
    let greedy = || ChainSpec::new(vec![S::Mask, S::Greedy], None);
    let plain = batch.insert(greedy(), &[]).unwrap();
    let failing = batch.insert(greedy(), &[]).unwrap();
    batch
        .set_constraint(failing, Some(Box::new(FailsAt { left: 2 })))
        .unwrap();
    let rx = batch.insert(greedy(), &[]).unwrap();
    let m = Matcher::new(&view, &StructuredOutput::Regex("cat|ok".into())).unwrap();
    batch.set_constraint(rx, Some(Box::new(m))).unwrap();
    // Without a mask stage a constraint cannot act.
    let bare = batch
        .insert(ChainSpec::new(vec![S::Greedy], None), &[])
        .unwrap();
    let m = Matcher::new(&view, &StructuredOutput::JsonObject).unwrap();
    assert!(matches!(
        batch.set_constraint(bare, Some(Box::new(m))),
        Err(BackendError::NoMaskStage { .. })
    ));
    assert!(matches!(
        batch.update(rx, ChainSpec::new(vec![S::Greedy], None)),
        Err(BackendError::NoMaskStage { .. })
    ));

    // Logits that favour `x`: the regex request must still write `cat`/`ok`.
    let mut row = vec![0.0f32; V];
    row[usize::from(b'x')] = 9.0;
    row[usize::from(b'o')] = 1.0;
    row[usize::from(b'c')] = 2.0;
    let rows = |k: usize| upload(&row.repeat(k), k, V, d);
    let ids = [plain, failing, rx];
    for step in 0..3 {
        let out = batch.step(&ids, rows(3)).unwrap();
        assert_eq!(
            out.tokens[0],
            Ok(u32::from(b'x')),
            "{dev}: the plain request"
        );
        if step < 2 {
            assert_eq!(out.tokens[1], Ok(u32::from(b'x')));
        } else {
            match &out.tokens[1] {
                Err(SampleError::Constraint(e)) => assert!(e.message.contains("planted"), "{e}"),
                other => panic!("{dev}: the failed matcher's row gave {other:?}"),
            }
        }
    }
    assert_eq!(
        batch.outputs(failing).unwrap().len(),
        2,
        "nothing accepted after the failure"
    );
    assert_eq!(text(batch.outputs(rx).unwrap()), "cat");
    assert!(batch.constraint_finished(rx).unwrap());
    // A `min_tokens` that bans the end of a complete output: the row's
    // error says so, nothing is accepted.
    let other = batch.insert(greedy(), &[]).unwrap();
    let m = Matcher::new(&view, &StructuredOutput::Regex("cat|ok".into())).unwrap();
    batch.set_constraint(other, Some(Box::new(m))).unwrap();
    let min_tokens = ChainSpec::new(
        vec![
            S::Mask,
            S::MinTokens {
                n: 10,
                stop: vec![EOS],
            },
            S::Greedy,
        ],
        None,
    );
    batch.update(other, min_tokens).unwrap();
    for _ in 0..3 {
        batch.step(&[other], rows(1)).unwrap();
    }
    match &batch.step(&[other], rows(1)).unwrap().tokens[0] {
        Err(SampleError::Constraint(e)) => assert!(e.message.contains("min_tokens"), "{e}"),
        other => panic!("{dev}: {other:?}"),
    }
    assert_eq!(text(batch.outputs(other).unwrap()), "cat");
    assert_eq!(batch.step(&[rx], rows(1)).unwrap().tokens[0], Ok(EOS));

    // `reset` rewinds the matcher; a fork continues from the same state.
    batch.reset(rx).unwrap();
    assert!(!batch.constraint_finished(rx).unwrap());
    batch.step(&[rx], rows(1)).unwrap();
    let child = batch.fork(rx, 1).unwrap()[0];
    let out = batch.step(&[rx, child], rows(2)).unwrap();
    assert_eq!(out.tokens, vec![Ok(u32::from(b'a')), Ok(u32::from(b'a'))]);

    // Drafts for a constrained request fail it alone.
    let drafts = [
        Draft {
            id: rx,
            tokens: vec![u32::from(b't')],
            probs: None,
        },
        Draft {
            id: plain,
            tokens: vec![u32::from(b'x')],
            probs: None,
        },
    ];
    let res = batch.verify(&drafts, rows(4)).unwrap().results;
    assert!(
        matches!(&res[0], Err(SampleError::Constraint(e)) if e.kind == "speculative"),
        "{:?}",
        res[0]
    );
    assert!(res[1].is_ok(), "{:?}", res[1]);
    // Without drafts it is a plain constrained step.
    let drafts = [Draft {
        id: rx,
        tokens: vec![],
        probs: None,
    }];
    let res = batch.verify(&drafts, rows(1)).unwrap().results;
    assert_eq!(res[0].as_ref().unwrap().tokens, vec![u32::from(b't')]);

    // A committed token the grammar refuses ends the constraint.
    batch.commit(child, u32::from(b'x')).unwrap();
    match &batch.step(&[child, plain], rows(2)).unwrap().tokens[..] {
        [Err(SampleError::Constraint(e)), Ok(_)] => assert_eq!(e.kind, "consume"),
        other => panic!("{dev}: {other:?}"),
    }
}

/// An engine that steps from inside a one-thread pool (its only worker
/// waits for the mask the batch computes on that pool) still gets its
/// tokens: the wait runs the pool's jobs.
fn stepping_from_a_one_thread_pool_finishes(d: &Device, dev: &str) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let view = view();
    let tokens = pool.install(|| {
        let mut batch = SamplingBatch::new(V, d, OffloadPolicy::Device).unwrap();
        let ids: Vec<RequestId> = (0..2)
            .map(|_| {
                let id = batch
                    .insert(ChainSpec::new(vec![S::Mask, S::Greedy], None), &[])
                    .unwrap();
                let m = Matcher::new(&view, &StructuredOutput::Regex("cat|ok".into())).unwrap();
                batch.set_constraint(id, Some(Box::new(m))).unwrap();
                id
            })
            .collect();
        let mut row = vec![0.0f32; V];
        row[usize::from(b'c')] = 1.0;
        for _ in 0..3 {
            batch.step(&ids, upload(&row.repeat(2), 2, V, d)).unwrap();
        }
        ids.iter()
            .map(|&id| text(batch.outputs(id).unwrap()))
            .collect::<Vec<_>>()
    });
    assert_eq!(tokens, vec!["cat", "cat"], "{dev}");
}

device_tests!(
    constrained_requests_match_their_constraint_and_the_cpu,
    failures_stay_with_their_request,
    stepping_from_a_one_thread_pool_finishes
);
