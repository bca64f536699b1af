//! `serve --http` driven by the official `openai` Python package
//! (`tests/openai_client.py`): completions and chat, streaming and not,
//! seeds, logprobs, stop strings, an invalid request. `.ci/run` installs the
//! package; where Python or the package is missing the test prints why it
//! skips.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn the_official_openai_client_drives_the_server() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    match Command::new(&python).args(["-c", "import openai"]).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            println!(
                "SKIP: the `openai` Python package is not installed for {python} (pip install openai; .ci/run does): {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or_default()
            );
            return;
        }
        Err(e) => {
            println!("SKIP: no Python ({python}: {e})");
            return;
        }
    }
    let mut server = Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--http", "127.0.0.1:0", "--device", "flex"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stdout(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the listening line");
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let out = Command::new(&python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/openai_client.py"
        ))
        .arg(format!("{url}/v1"))
        .output()
        .expect("python runs");
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(stdout.matches("ok: ").count() >= 18, "{stdout}");
}
