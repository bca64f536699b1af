//! `http_bench`: requests per second and time to first token of a running
//! `serve --http` server, at several numbers of concurrent streaming
//! clients (loopback only; every run is bounded by `--requests`).
//!
//! ```text
//! cargo run --release -p sampler-examples --bin serve -- --http 127.0.0.1:8080 &
//! cargo run --release -p sampler-examples --bin http_bench -- --url 127.0.0.1:8080 --clients 1,8,32
//! ```
//!
//! Each client sends streaming `/v1/completions` requests one after the
//! other (prompts cycled, `temperature` 0.8, `top_p` 0.95, a seed per
//! request, `min_tokens` = `max_tokens` so that every request generates
//! the same number of tokens). Time to first token: from sending the
//! request to the first chunk with text. See `docs/benchmarks.md`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use sampler_examples::http_client::{connect, read_events, send};
use serde_json::{Value, json};

const PROMPTS: [&str; 4] = [
    "Once upon a time",
    "The little dog",
    "Lily wanted to",
    "In the park",
];

/// Load a `serve --http` server with concurrent streaming clients.
#[derive(Debug, Parser)]
#[command(name = "http_bench", version, about, long_about = None)]
struct Args {
    /// The server's address (loopback), e.g. 127.0.0.1:8080.
    #[arg(long)]
    url: SocketAddr,
    /// Concurrent clients, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// Requests per run (split over the clients), 1..=100000.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    requests: u64,
    /// Tokens per request, 1..=4096.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    max_tokens: u64,
}

/// One request's time to first token and total time.
fn one(addr: SocketAddr, body: &Value) -> Result<(Duration, Duration), String> {
    let t0 = Instant::now();
    let mut s = connect(addr, Duration::from_secs(300)).map_err(|e| e.to_string())?;
    send(&mut s, "POST", "/v1/completions", Some(body)).map_err(|e| e.to_string())?;
    let mut first = None;
    let mut error = None;
    read_events(&mut s, |d| {
        if d == "[DONE]" {
            return false;
        }
        match serde_json::from_str::<Value>(d) {
            Ok(v) if v.get("error").is_some() => error = Some(v["error"].to_string()),
            Ok(v) => {
                let has_text = v["choices"][0]["text"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty());
                if has_text && first.is_none() {
                    first = Some(t0.elapsed());
                }
            }
            Err(e) => error = Some(format!("{e}: {d}")),
        }
        error.is_none()
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = error {
        return Err(e);
    }
    Ok((first.unwrap_or_else(|| t0.elapsed()), t0.elapsed()))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

fn run(a: &Args) -> Result<(), String> {
    println!(
        "| clients | requests | tokens each | requests/s | tokens/s | TTFT p50 ms | TTFT p90 ms | request p50 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &clients in &a.clients {
        let clients = clients.clamp(1, 1024);
        let n = a.requests as usize;
        let started = Instant::now();
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let (addr, max_tokens) = (a.url, a.max_tokens);
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for i in (c..n).step_by(clients) {
                        let body = json!({
                            "prompt": PROMPTS[i % PROMPTS.len()],
                            "max_tokens": max_tokens,
                            "min_tokens": max_tokens,
                            "temperature": 0.8,
                            "top_p": 0.95,
                            "seed": i,
                            "stream": true,
                        });
                        out.push(one(addr, &body));
                    }
                    out
                })
            })
            .collect();
        let mut ttft = Vec::new();
        let mut total = Vec::new();
        for h in handles {
            for r in h.join().map_err(|_| "a client thread panicked")? {
                let (f, t) = r?;
                ttft.push(f);
                total.push(t);
            }
        }
        let wall = started.elapsed().as_secs_f64();
        ttft.sort();
        total.sort();
        println!(
            "| {clients} | {n} | {} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} |",
            a.max_tokens,
            n as f64 / wall,
            (n as u64 * a.max_tokens) as f64 / wall,
            percentile(&ttft, 0.5),
            percentile(&ttft, 0.9),
            percentile(&total, 0.5),
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
