//! A minimal HTTP/1.1 client over `TcpStream` for the tests and the load
//! benchmark of `serve --http` (JSON bodies, `Connection: close`, chunked
//! or sized responses, server-sent events): enough to drive the server
//! from many threads without a client crate.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// Connect with a read timeout.
///
/// # Errors
/// The connection's.
pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    Ok(s)
}

/// Send a request with an optional JSON body.
///
/// # Errors
/// The write's.
pub fn send(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<()> {
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The `Content-Length` of a response head, if it gives one.
fn content_length(head: &[u8]) -> Option<usize> {
    String::from_utf8_lossy(head).lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

/// Read a whole response: its status and body (de-chunked). A sized body
/// is read to its `Content-Length` (a server that keeps the connection
/// open despite `Connection: close` does not stall the read); otherwise
/// to the end of the stream.
///
/// # Errors
/// The read's; `InvalidData` for a response that is not HTTP/1.1 text.
pub fn read_response(s: &mut TcpStream) -> std::io::Result<(u16, String)> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n")
            && let Some(len) = content_length(&raw[..end])
            && raw.len() >= end + 4 + len
        {
            raw.truncate(end + 4 + len);
            break;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
    }
    let raw = String::from_utf8(raw).map_err(|_| bad("a response that is not UTF-8"))?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body).ok_or_else(|| bad("bad chunked body"))?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// A chunked body's data.
fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        if n == 0 {
            break;
        }
        out.push_str(rest.get(..n)?);
        body = rest.get(n + 2..)?;
    }
    Some(out)
}

/// One request and its whole response.
///
/// # Errors
/// As [`connect`], [`send`], [`read_response`].
pub fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, String)> {
    let mut s = connect(addr, Duration::from_secs(120))?;
    send(&mut s, method, path, body)?;
    read_response(&mut s)
}

/// Server-sent events of a streaming response, one `data:` payload at a
/// time, until `[DONE]` (included) or the end of the stream; `on_event`
/// returns false to stop reading.
///
/// # Errors
/// The read's.
pub fn read_events(
    s: &mut TcpStream,
    mut on_event: impl FnMut(&str) -> bool,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        // Chunked framing lines and blank lines carry no `data:`.
        if let Some(d) = line.trim_end().strip_prefix("data: ")
            && (!on_event(d) || d == "[DONE]")
        {
            return Ok(());
        }
    }
}
