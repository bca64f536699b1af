//! `serve --http`: the OpenAI API on a loopback port, driven by a small
//! HTTP/1.1 client over `TcpStream` (no client crate): many concurrent
//! streaming clients each get exactly their own tokens, clients that leave
//! free their rows, a full queue answers 429, bad requests answer 400 with
//! OpenAI's error body. Every request loop here is bounded in count and
//! time and talks to 127.0.0.1 only.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sampler_examples::http_client::{call, connect, read_events, send};
use serde_json::{Value, json};

/// A `serve --http 127.0.0.1:0` process, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_serve"))
            .args(["--http", "127.0.0.1:0", "--device", "flex"])
            .args(extra)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the listening line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server { child, port }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn connect(&self) -> TcpStream {
        connect(self.addr(), Duration::from_secs(120)).expect("connect")
    }

    /// One request; the status and the body.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        call(self.addr(), method, path, body).expect("a response")
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.call("POST", path, Some(body));
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
        )
    }

    fn health(&self) -> Value {
        let (status, text) = self.call("GET", "/health", None);
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).expect("health JSON")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A streaming request's `data:` payloads, `[DONE]` included.
fn stream_events(s: &mut TcpStream) -> Vec<String> {
    let mut events = Vec::new();
    read_events(s, |d| {
        events.push(d.to_string());
        true
    })
    .expect("read");
    events
}

/// The text of a completions stream, its finish reason and whether it
/// ended with `[DONE]`.
fn stream_text(events: &[String]) -> (String, Option<String>, bool) {
    let mut text = String::new();
    let mut finish = None;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}"));
        for c in v["choices"].as_array().expect("choices") {
            text.push_str(c["text"].as_str().unwrap_or_default());
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    (text, finish, events.last().is_some_and(|e| e == "[DONE]"))
}

const PROMPTS: [&str; 4] = [
    "Once upon a time",
    "The little dog",
    "Lily wanted to",
    "In the park",
];

fn body(i: usize, stream: bool) -> Value {
    // Half greedy, half seeded sampling; each its own prompt and seed.
    let mut b = json!({
        "prompt": PROMPTS[i % 4],
        "max_tokens": 10 + i % 5,
        "seed": 100 + i,
        "stream": stream,
    });
    if i.is_multiple_of(2) {
        b["temperature"] = json!(0);
    } else {
        b["temperature"] = json!(0.9);
        b["top_p"] = json!(0.95);
    }
    b
}

#[test]
fn concurrent_streaming_clients_each_get_their_own_tokens() {
    const CLIENTS: usize = 64;
    let server = Server::start(&["--concurrency", "64"]);
    // Each request alone first (non-streaming), one after the other.
    let alone: Vec<(String, String)> = (0..CLIENTS)
        .map(|i| {
            let (status, v) = server.post("/v1/completions", &body(i, false));
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["object"], "text_completion");
            let usage = &v["usage"];
            assert_eq!(
                usage["total_tokens"].as_u64(),
                Some(
                    usage["prompt_tokens"].as_u64().unwrap()
                        + usage["completion_tokens"].as_u64().unwrap()
                )
            );
            let c = &v["choices"][0];
            (
                c["text"].as_str().unwrap().to_string(),
                c["finish_reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // Then all at once, streaming.
    let started = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let port = server.port;
            std::thread::spawn(move || {
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                let mut s = connect(addr, Duration::from_secs(120)).expect("connect");
                send(&mut s, "POST", "/v1/completions", Some(&body(i, true))).expect("send");
                stream_events(&mut s)
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let events = h.join().expect("client thread");
        let (text, finish, done) = stream_text(&events);
        assert!(done, "client {i}: no [DONE]: {events:?}");
        assert_eq!(
            (text.as_str(), finish.as_deref()),
            (alone[i].0.as_str(), Some(alone[i].1.as_str())),
            "client {i}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(300));
    let h = server.health();
    assert_eq!(
        (h["running"].as_u64(), h["waiting"].as_u64()),
        (Some(0), Some(0)),
        "{h}"
    );
}

#[test]
fn clients_that_leave_free_their_rows_and_a_full_queue_answers_429() {
    let server = Server::start(&["--max-queue", "6", "--concurrency", "6"]);
    // Six long requests (min_tokens holds off the end of text) fill the queue.
    let long = json!({
        "prompt": "Once upon a time",
        "max_tokens": 480,
        "min_tokens": 480,
        "stream": true,
        "seed": 1,
    });
    let mut clients: Vec<TcpStream> = (0..6)
        .map(|_| {
            let mut s = server.connect();
            send(&mut s, "POST", "/v1/completions", Some(&long)).expect("send");
            s
        })
        .collect();
    // Each has streamed a first chunk: all six are in the batch.
    for s in &mut clients {
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        while !line.starts_with("data: ") {
            line.clear();
            assert!(reader.read_line(&mut line).expect("read") > 0);
        }
    }
    assert_eq!(server.health()["running"], 6);
    let (status, v) = server.post("/v1/completions", &json!({"prompt": "x"}));
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-queue")
    );
    // They leave: their rows are freed at the next step.
    drop(clients);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = server.health();
        if h["running"] == 0 && h["waiting"] == 0 {
            assert_eq!(h["cancelled"], 6, "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "rows not freed: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // And the server takes requests again.
    let (status, v) = server.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn chat_models_errors_and_stop_strings() {
    let server = Server::start(&[]);
    let (status, text) = server.call("GET", "/v1/models", None);
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["data"][0]["id"], "stories260K");
    // Chat on a checkpoint without a template: ChatML.
    let (status, v) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    // Errors: OpenAI's body, the param named.
    let cases = [
        (json!({"prompt": "x", "temperature": "hot"}), "temperature"),
        (json!({"prompt": "x", "top_p": 1.5}), "top_p"),
        (json!({"prompt": "x", "stop": 3}), "stop"),
        (json!({"prompt": "x ".repeat(600)}), "prompt"),
        (json!({"prompt": "Once", "max_tokens": 600}), "prompt"),
    ];
    for (b, param) in cases {
        let (status, v) = server.post("/v1/completions", &b);
        assert_eq!(status, 400, "{b}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let (status, text) = server.call("POST", "/v1/completions", None);
    assert_eq!(status, 400, "{text}");
    // A stop string spanning two tokens: greedy text, then the same request
    // stopping inside it.
    let greedy =
        json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "logprobs": 0});
    let (_, v) = server.post("/v1/completions", &greedy);
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    let tokens: Vec<String> = v["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(tokens.concat(), full);
    let k = (2..tokens.len() - 1)
        .find(|&k| tokens[k].len() >= 2 && tokens[k + 1].len() >= 2)
        .expect("two adjacent tokens of two bytes or more");
    let stop = format!(
        "{}{}",
        &tokens[k][tokens[k].len() - 1..],
        &tokens[k + 1][..1]
    );
    let cut = full.find(&stop).unwrap();
    let mut b = greedy.clone();
    b["stop"] = json!([stop]);
    let (_, v) = server.post("/v1/completions", &b);
    let c = &v["choices"][0];
    assert_eq!(c["text"], full[..cut], "stop {stop:?} in {full:?}");
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["stop_reason"], stop);
    b["include_stop_str_in_output"] = json!(true);
    b["stream"] = json!(true);
    let mut s = server.connect();
    send(&mut s, "POST", "/v1/completions", Some(&b)).expect("send");
    let (text, finish, done) = stream_text(&stream_events(&mut s));
    assert_eq!(
        (text.as_str(), finish.as_deref(), done),
        (&full[..cut + stop.len()], Some("stop"), true)
    );
}

/// `n`: several choices in one response (non-streaming and streaming, the
/// same texts per index for the same seed), usage summing their tokens.
#[test]
fn n_choices_in_one_response() {
    let server = Server::start(&[]);
    let b = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 5, "n": 3});
    let (status, v) = server.post("/v1/completions", &b);
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    assert_eq!(v["usage"]["completion_tokens"], 36, "{v}");
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let mut s = server.connect();
    send(&mut s, "POST", "/v1/completions", Some(&sb)).expect("send");
    let events = stream_events(&mut s);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut streamed = vec![String::new(); 3];
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        streamed[c["index"].as_u64().unwrap() as usize]
            .push_str(c["text"].as_str().unwrap_or_default());
    }
    assert_eq!(streamed, texts);
    let (status, v) = server.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2, "seed": 1}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(server.health()["running"], 0);
}

/// Found by trying to break the server: a client sending one request at a
/// time never meets a full queue (the finished request is counted out
/// before its client hears of the end); streamed `text_offset`s equal the
/// whole response's (counted in characters) when a possible stop holds text
/// back; a bias for a token outside the vocabulary and a bad
/// `logprob_token_ids` are 400s naming the field; unknown routes and
/// methods get OpenAI's error body; prompt and output never exceed the
/// context.
#[test]
fn findings_of_the_breaker() {
    let server = Server::start(&["--max-queue", "1"]);
    for i in 0..30 {
        let b = json!({"prompt": "b", "max_tokens": 3, "stream": i % 2 == 0});
        let (status, text) = server.call("POST", "/v1/completions", Some(&b));
        assert_eq!(status, 200, "request {i}: {text}");
        assert_eq!(server.health()["running"], 0, "after request {i}");
    }
    // text_offset, streamed and not, with a stop that holds text back.
    let b = json!({"prompt": "Once upon a time", "max_tokens": 10, "seed": 2, "temperature": 1.0, "logprobs": 0, "stop": ["little girl"]});
    let (_, whole) = server.post("/v1/completions", &b);
    let want = whole["choices"][0]["logprobs"]["text_offset"].clone();
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let mut s = server.connect();
    send(&mut s, "POST", "/v1/completions", Some(&sb)).expect("send");
    let mut offsets = Vec::new();
    for e in stream_events(&mut s).iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(o) = v["choices"][0]["logprobs"]["text_offset"].as_array() {
            offsets.extend(o.iter().cloned());
        }
    }
    assert_eq!(Value::Array(offsets), want);
    for (b, param) in [
        (
            json!({"prompt": "a", "logit_bias": {"999999": 1}}),
            "logit_bias",
        ),
        (
            json!({"prompt": "a", "logprobs": 1, "logprob_token_ids": [999999]}),
            "logprob_token_ids",
        ),
    ] {
        let (status, v) = server.post("/v1/completions", &b);
        assert_eq!((status, &v["error"]["param"]), (400, &json!(param)), "{v}");
    }
    for (method, path, status) in [
        ("GET", "/v1/foo", 404),
        ("POST", "/v1/models", 405),
        ("GET", "/v1/completions", 405),
    ] {
        let (got, text) = server.call(method, path, None);
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}: {text:?}"));
        assert_eq!(got, status);
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
    }
    // A long chat prompt without max_tokens (chat's default: the context's
    // room): prompt and output fill the context (512), never more.
    let (status, v) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x ".repeat(150)}], "min_tokens": 512}),
    );
    assert_eq!(status, 200, "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 150, "{v}");
    assert_eq!(v["usage"]["total_tokens"], 512, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

/// Ctrl-C (SIGINT): no new connections, the running stream finishes with
/// its `[DONE]`, and the process exits with status 0.
#[cfg(unix)]
#[test]
fn ctrl_c_finishes_the_running_requests_then_exits() {
    let mut server = Server::start(&[]);
    let mut s = server.connect();
    let long =
        json!({"prompt": "Once", "max_tokens": 300, "min_tokens": 300, "stream": true, "seed": 2});
    send(&mut s, "POST", "/v1/completions", Some(&long)).expect("send");
    let mut events = Vec::new();
    let mut interrupted = false;
    read_events(&mut s, |d| {
        events.push(d.to_string());
        if !interrupted {
            interrupted = true;
            let pid = server.child.id().to_string();
            let sent = Command::new("kill").args(["-INT", &pid]).status();
            assert!(sent.is_ok_and(|st| st.success()), "kill -INT {pid}");
        }
        true
    })
    .expect("read");
    let (_, finish, done) = stream_text(&events);
    assert!(done && finish.as_deref() == Some("length"), "{events:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = server.child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not exit after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

/// Structured output over HTTP: `guided_regex` with `n = 2` (each choice
/// follows its own matcher), `response_format` with a JSON schema, streamed
/// text equal to the whole response's; an invalid regex, `speculative` with
/// structured output and two constraints at once are 400s naming their
/// field.
#[test]
fn structured_output_over_http() {
    let server = Server::start(&[]);
    let re = "(, | and )(a|the) [a-z]{2,8} (was|had) [a-z]{2,10}\\.";
    let b = json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 1.0,
                   "seed": 9, "n": 2, "guided_regex": re});
    let (status, v) = server.post("/v1/completions", &b);
    assert_eq!(status, 200, "{v}");
    let full = regex::Regex::new(&format!("^(?:{re})$")).unwrap();
    for c in v["choices"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert_eq!(c["finish_reason"], "stop", "{v}");
        assert!(full.is_match(text), "{text:?}");
    }
    let schema = json!({"type": "string", "enum": ["cat", "dog", "big red ball"]});
    let b = json!({"messages": [{"role": "user", "content": "Pick one."}], "max_tokens": 20, "seed": 3,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}}});
    let (status, v) = server.post("/v1/chat/completions", &b);
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let picked: Value =
        serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?}: {e}"));
    assert!(
        schema["enum"].as_array().unwrap().contains(&picked),
        "{content}"
    );
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let mut s = server.connect();
    send(&mut s, "POST", "/v1/chat/completions", Some(&sb)).expect("send");
    let events = stream_events(&mut s);
    let streamed: String = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, content);
    for (body, says, param) in [
        (
            json!({"prompt": "x", "guided_regex": "a(b"}),
            "regex",
            "guided_regex",
        ),
        (
            json!({"prompt": "x", "guided_regex": "ab", "speculative": {}}),
            "speculative",
            "speculative",
        ),
        (
            json!({"prompt": "x", "guided_regex": "ab", "guided_choice": ["a"]}),
            "both given",
            "guided_regex",
        ),
        (
            json!({"prompt": "x", "response_format": {"type": "yaml"}}),
            "response_format.type",
            "response_format",
        ),
        (
            json!({"prompt": "x", "guided_json": {"type": "integer", "minimum": 3, "maximum": 1}}),
            "minimum",
            "guided_json",
        ),
        (
            json!({"prompt": "x", "sampler_chain": "samplers = \"dist\"\n[structured]\nregex = \"a\"\n", "guided_regex": "b"}),
            "give one",
            "guided_regex",
        ),
    ] {
        let (status, v) = server.post("/v1/completions", &body);
        assert_eq!(status, 400, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "{body}: {msg}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    // A grammar nested 20000 rules deep is compiled (on a thread with a
    // stack for it), not a crash of the server.
    let mut deep = String::from("start: r0\n");
    for i in 0..20_000 {
        deep.push_str(&format!("r{i}: r{}\n", i + 1));
    }
    deep.push_str("r20000: \" and then\"\n");
    let (status, v) = server.post(
        "/v1/completions",
        &json!({"prompt": "Once", "max_tokens": 12, "guided_grammar": deep}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], " and then", "{v}");
    assert_eq!(server.health()["running"], 0);
}
