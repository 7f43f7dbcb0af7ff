//! Hostile and malformed requests sent as raw bytes to a real host's `host.sock`.
//!
//! The host is the real binary, started by `agent-host host.start` in its own temp home with
//! `AGENT_HOST_IPC_TIMEOUT_MS=300`, so a silent client is timed out fast. Every case must get
//! its specific reply code (and `data.error` naming it), and the host must keep answering
//! `host.status` after each one.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report (clippy's allow-*-in-tests does not reach helpers of an integration test)"
)]

use crate::common::reap;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use agent_host::instance::read_lock_info;
use agent_host::protocol::envelope::{ErrorCode, MAX_REQUEST_BYTES};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const CLI_TIMEOUT: Duration = Duration::from_secs(25);
/// Bound on one request/reply exchange (the host's own read timeout is 300 ms).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// A host running in its own temp home; killed on drop if a test left it running.
struct Host {
    _dir: TempDir,
    home: PathBuf,
    pid: u32,
    /// `AGENT_HOST_IPC_TIMEOUT_MS`, or the host's default (5 s).
    ipc_timeout_ms: Option<&'static str>,
}

impl Host {
    async fn start() -> Host {
        Self::start_with(Some("300")).await
    }

    async fn start_with(ipc_timeout_ms: Option<&'static str>) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let mut host = Host {
            _dir: dir,
            home,
            pid: 0,
            ipc_timeout_ms,
        };
        let data = host.cli_ok("host.start").await;
        host.pid = u32::try_from(data["pid"].as_u64().unwrap()).unwrap();
        host
    }

    fn sock(&self) -> PathBuf {
        self.home.join("host.sock")
    }

    async fn cli_ok(&self, command: &str) -> Value {
        self.cli_ok_with(command, None).await
    }

    async fn cli_ok_with(&self, command: &str, params: Option<&str>) -> Value {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.arg(command)
            .args(params)
            .env("AGENT_HOST_HOME", &self.home);
        if let Some(ms) = self.ipc_timeout_ms {
            cmd.env("AGENT_HOST_IPC_TIMEOUT_MS", ms);
        }
        let output = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(CLI_TIMEOUT, output)
            .await
            .unwrap_or_else(|_| panic!("agent-host {command} did not finish"))
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        let reply: Value = serde_json::from_str(stdout.trim_end()).unwrap();
        assert_eq!(
            reply["code"],
            json!(0),
            "agent-host {command}: {reply} (stderr: {})",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success());
        reply["data"].clone()
    }

    async fn shutdown(&self) {
        let data = self.cli_ok("host.shutdown").await;
        assert_eq!(data["stopped"], json!(true), "{data}");
        assert!(!self.sock().exists());
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        reap::kill_lock_holder(&self.home.join("host.lock"));
    }
}

/// What a case sends.
enum Payload {
    /// These bytes, then keep the write half open until the reply.
    Bytes(Vec<u8>),
    /// These bytes, then shut the write half (EOF instead of a newline).
    BytesThenEof(Vec<u8>),
    /// These bytes from a separate task, ignoring write errors: the host replies and closes
    /// before reading all of it.
    Flood(Vec<u8>),
    /// Connect and send nothing, keeping the connection open.
    Silence,
}

fn line(text: &str) -> Payload {
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(b'\n');
    Payload::Bytes(bytes)
}

/// A valid `host.status` padded with spaces to exactly `len` bytes before the newline.
fn padded_status(len: usize) -> Vec<u8> {
    let mut bytes = br#"{"command":"host.status"}"#.to_vec();
    bytes.resize(len, b' ');
    bytes.push(b'\n');
    bytes
}

/// Send one request on a fresh connection and return the one reply line, parsed. Also checks
/// that the host closes the connection after that line (one request, one reply).
async fn exchange(sock: &Path, send: Payload) -> Value {
    let stream = UnixStream::connect(sock).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut flood = None;
    let mut flooded = false;
    let mut keep_open = None;
    match send {
        Payload::Bytes(bytes) => {
            write.write_all(&bytes).await.unwrap();
            keep_open = Some(write);
        }
        Payload::BytesThenEof(bytes) => {
            write.write_all(&bytes).await.unwrap();
            write.shutdown().await.unwrap();
        }
        Payload::Flood(bytes) => {
            flooded = true;
            flood = Some(tokio::spawn(async move {
                // EPIPE / ECONNRESET once the host has replied and closed: expected.
                let _refused = write.write_all(&bytes).await;
            }));
        }
        Payload::Silence => keep_open = Some(write),
    }
    let mut reader = BufReader::new(read);
    let mut reply = Vec::new();
    tokio::time::timeout(EXCHANGE_TIMEOUT, reader.read_until(b'\n', &mut reply))
        .await
        .expect("no reply line within the exchange timeout")
        .unwrap();
    assert_eq!(
        reply.last(),
        Some(&b'\n'),
        "reply is not a whole line: {reply:?}"
    );
    if !flooded {
        // One reply, then the host closes its side.
        let mut rest = Vec::new();
        tokio::time::timeout(EXCHANGE_TIMEOUT, reader.read_to_end(&mut rest))
            .await
            .expect("the host did not close the connection after replying")
            .unwrap();
        assert!(rest.is_empty(), "bytes after the reply line: {rest:?}");
    }
    drop(keep_open);
    if let Some(task) = flood {
        tokio::time::timeout(EXCHANGE_TIMEOUT, task)
            .await
            .expect("the flooding writer did not stop after the host closed")
            .unwrap();
    }
    serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("reply is not JSON ({e}): {reply:?}"))
}

/// Check the reply shape and that an error reply's `data.error` names its code.
fn check_shape(case: &str, reply: &Value) -> i64 {
    let code = reply["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("{case}: no numeric code in {reply}"));
    assert!(reply["message"].is_string(), "{case}: {reply}");
    if code != 0 {
        let known = ErrorCode::from_number(i32::try_from(code).unwrap())
            .unwrap_or_else(|| panic!("{case}: unknown code {code} in {reply}"));
        assert_eq!(
            reply["data"]["error"],
            json!(known.name()),
            "{case}: {reply}"
        );
    }
    code
}

async fn assert_alive(host: &Host, after: &str) {
    let reply = exchange(&host.sock(), line(r#"{"command":"host.status"}"#)).await;
    assert_eq!(
        reply["code"],
        json!(0),
        "host.status after {after}: {reply}"
    );
    assert_eq!(
        reply["data"]["pid"],
        json!(host.pid),
        "after {after}: {reply}"
    );
    assert_eq!(
        reply["data"]["running"],
        json!(true),
        "after {after}: {reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_requests_get_specific_codes() {
    let host = Host::start().await;
    let work = tempfile::tempdir().unwrap();
    let not_a_dir = work.path().join("file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let missing_dir = work.path().join("does-not-exist");
    let create = |agent_type: &str, cwd: &str| {
        json!({"command": "session.create", "params": {"agent_type": agent_type, "cwd": cwd}})
            .to_string()
    };

    let mut deep = "[".repeat(100_000).into_bytes();
    deep.push(b'\n');
    let mut invalid_utf8 = br#"{"command":"host.status","params":{"x":""#.to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xc0]);
    invalid_utf8.extend_from_slice(b"\"}}\n");

    let cases: Vec<(&str, Payload, i64)> = vec![
        ("not JSON", line("not json"), 1001),
        ("truncated JSON", line(r#"{"command":"host.status""#), 1001),
        ("JSON array", line(r#"["host.status"]"#), 1002),
        ("JSON string", line(r#""host.status""#), 1002),
        ("JSON number", line("42"), 1002),
        ("missing command", line("{}"), 1003),
        ("null command", line(r#"{"command":null}"#), 1003),
        ("command not a string", line(r#"{"command":7}"#), 1002),
        ("unknown command", line(r#"{"command":"nope.cmd"}"#), 1004),
        (
            "params a string",
            line(r#"{"command":"session.list","params":"x"}"#),
            1005,
        ),
        (
            "params an array",
            line(r#"{"command":"host.status","params":[]}"#),
            1005,
        ),
        (
            "param of wrong type",
            line(r#"{"command":"session.get","params":{"session_id":1}}"#),
            1005,
        ),
        (
            "negative limit",
            line(r#"{"command":"session.history","params":{"session_id":"x","limit":-1}}"#),
            1005,
        ),
        (
            "missing required param",
            line(r#"{"command":"session.get","params":{}}"#),
            1005,
        ),
        (
            "unknown param field",
            line(r#"{"command":"session.list","params":{"x":1}}"#),
            1005,
        ),
        (
            "extra envelope field",
            line(r#"{"command":"session.list","extra":1}"#),
            1002,
        ),
        (
            "10 MiB line",
            Payload::Flood(vec![b'a'; 10 * 1024 * 1024]),
            1006,
        ),
        (
            "limit + 1 bytes",
            Payload::Flood(padded_status(MAX_REQUEST_BYTES + 1)),
            1006,
        ),
        (
            "exactly the limit",
            Payload::Flood(padded_status(MAX_REQUEST_BYTES)),
            0,
        ),
        ("silent client", Payload::Silence, 1007),
        (
            "partial line then silence",
            Payload::Bytes(br#"{"command":"#.to_vec()),
            1007,
        ),
        ("empty line", line(""), 1008),
        ("whitespace line", line(" \t "), 1008),
        ("EOF without bytes", Payload::BytesThenEof(Vec::new()), 1008),
        (
            "valid request then EOF, no newline",
            Payload::BytesThenEof(br#"{"command":"host.status"}"#.to_vec()),
            0,
        ),
        (
            "CRLF line ending",
            Payload::Bytes(b"{\"command\":\"host.status\"}\r\n".to_vec()),
            0,
        ),
        ("invalid UTF-8", Payload::Bytes(invalid_utf8), 1009),
        (
            "bare invalid UTF-8",
            Payload::Bytes(vec![0xff, 0xfe, b'\n']),
            1009,
        ),
        ("100000-deep nesting", Payload::Bytes(deep), 1001),
        (
            "trailing garbage",
            line(r#"{"command":"host.status"} garbage"#),
            1001,
        ),
        (
            "two envelopes on one line",
            line(r#"{"command":"host.status"}{"command":"host.status"}"#),
            1001,
        ),
        ("version over IPC", line(r#"{"command":"version"}"#), 1010),
        (
            "host.start over IPC",
            line(r#"{"command":"host.start"}"#),
            2001,
        ),
        (
            "unknown session id",
            line(r#"{"command":"session.get","params":{"session_id":"no-such-session"}}"#),
            3001,
        ),
        (
            "history of unknown session",
            line(r#"{"command":"session.history","params":{"session_id":"no-such-session"}}"#),
            3001,
        ),
        (
            "delete of unknown session",
            line(r#"{"command":"session.delete","params":{"session_id":"no-such-session"}}"#),
            3001,
        ),
        (
            "cwd that does not exist",
            line(&create("claude", &missing_dir.display().to_string())),
            3002,
        ),
        (
            "cwd that is a file",
            line(&create("claude", &not_a_dir.display().to_string())),
            3002,
        ),
        (
            "relative cwd over IPC",
            line(&create("claude", "relative/dir")),
            3002,
        ),
        (
            "unknown agent_type",
            line(&create("gpt-9000", &work.path().display().to_string())),
            4001,
        ),
    ];
    assert!(cases.len() >= 18);

    for (case, send, expected) in cases {
        let reply = exchange(&host.sock(), send).await;
        let code = check_shape(case, &reply);
        assert_eq!(code, expected, "{case}: {reply}");
        match code {
            2001 => assert_eq!(reply["data"]["pid"], json!(host.pid), "{case}: {reply}"),
            3001 => assert_eq!(
                reply["data"]["session_id"],
                json!("no-such-session"),
                "{case}: {reply}"
            ),
            3002 => assert!(reply["data"]["cwd"].is_string(), "{case}: {reply}"),
            4001 => assert_eq!(
                reply["data"]["agent_type"],
                json!("gpt-9000"),
                "{case}: {reply}"
            ),
            0 => assert_eq!(reply["data"]["pid"], json!(host.pid), "{case}: {reply}"),
            _ => {}
        }
        assert_alive(&host, case).await;
    }

    // The host answers agent.list itself (its own configuration, as the wire gets it).
    let agents = exchange(&host.sock(), line(r#"{"command":"agent.list"}"#)).await;
    assert_eq!(agents["code"], json!(0), "{agents}");
    assert!(agents["data"]["agents"].is_array(), "{agents}");

    // None of the refused creates left a session behind.
    let list = exchange(&host.sock(), line(r#"{"command":"session.list"}"#)).await;
    assert_eq!(list["code"], json!(0), "{list}");
    assert_eq!(list["data"]["sessions"], json!([]), "{list}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_clients() {
    const CLIENTS: usize = 50;
    let host = Host::start().await;
    let work = tempfile::tempdir().unwrap();
    let create = json!({
        "command": "session.create",
        "params": {"agent_type": "codex", "cwd": work.path().display().to_string()},
    })
    .to_string();
    let created = exchange(&host.sock(), line(&create)).await;
    assert_eq!(created["code"], json!(0), "{created}");
    let id = created["data"]["session_id"].clone();

    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let barrier = barrier.clone();
            let sock = host.sock();
            tokio::spawn(async move {
                barrier.wait().await;
                exchange(&sock, line(r#"{"command":"session.list"}"#)).await
            })
        })
        .collect();
    for (i, client) in clients.into_iter().enumerate() {
        let reply = tokio::time::timeout(EXCHANGE_TIMEOUT * 2, client)
            .await
            .unwrap_or_else(|_| panic!("client {i} got no reply"))
            .unwrap();
        assert_eq!(reply["code"], json!(0), "client {i}: {reply}");
        let sessions = reply["data"]["sessions"].as_array().unwrap();
        assert_eq!(sessions.len(), 1, "client {i}: {reply}");
        assert_eq!(sessions[0]["session_id"], id, "client {i}: {reply}");
    }
    assert_alive(&host, "50 concurrent clients").await;
    host.shutdown().await;
}

/// Defect: 300 idle IPC connections delayed a real request by 20 s, and 70 half-finished
/// WebSocket upgrades made a good handshake wait 10 s. With the host's default timeouts (5 s
/// for a request line, 10 s for an upgrade), 300 idle IPC connections and 200 half-open
/// upgrades held open, a real request and a real handshake each complete within 1 s.
#[tokio::test]
async fn idle_connections_do_not_starve_real_clients() {
    let host = Host::start_with(None).await;
    let info = read_lock_info(&host.home.join("host.lock")).unwrap();
    let port = info.ws_port.unwrap();
    let grant = host
        .cli_ok_with("subscriber.add", Some(r#"{"type":"local"}"#))
        .await;

    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(UnixStream::connect(host.sock()).await.unwrap());
    }
    let mut half_open = Vec::new();
    for _ in 0..200 {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        // The start of an upgrade request, never finished.
        tcp.write_all(b"GET /subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        half_open.push(tcp);
    }

    let started = std::time::Instant::now();
    let status = tokio::time::timeout(
        EXCHANGE_TIMEOUT,
        agent_host::ipc::request(
            &host.sock(),
            &json!({"command": "host.status"}),
            EXCHANGE_TIMEOUT,
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let request_took = started.elapsed();
    assert_eq!(status.code, 0, "{status:?}");

    let started = std::time::Instant::now();
    let hello = agent_host::protocol::wire::pb::Hello::default();
    let connected = tokio::time::timeout(
        EXCHANGE_TIMEOUT,
        agent_host::ws::client::connect(
            grant["ws_endpoint"].as_str().unwrap(),
            grant["ws_token"].as_str().unwrap(),
            hello,
        ),
    )
    .await
    .unwrap();
    let handshake_took = started.elapsed();
    assert!(connected.is_ok(), "{:?}", connected.err());
    eprintln!(
        "with 300 idle IPC and 200 half-open upgrades: request {request_took:?}, handshake {handshake_took:?}"
    );
    assert!(
        request_took < Duration::from_secs(1),
        "request took {request_took:?}"
    );
    assert!(
        handshake_took < Duration::from_secs(1),
        "handshake took {handshake_took:?}"
    );
    drop((idle, half_open, connected));
    host.shutdown().await;
}

/// Defect: `{"command":"host.status","command":"session.list"}` ran `session.list`. A
/// duplicate key anywhere in a request is refused, over IPC and on the command line.
#[tokio::test]
async fn duplicate_keys_are_refused() {
    let host = Host::start().await;
    for request in [
        r#"{"command":"host.status","command":"session.list"}"#,
        r#"{"command":"session.list","params":{},"params":{}}"#,
        r#"{"command":"session.send","params":{"session_id":"x","text":"a","text":"b"}}"#,
    ] {
        let reply = exchange(&host.sock(), line(request)).await;
        assert_eq!(
            reply["code"],
            json!(ErrorCode::InvalidJson.number()),
            "{request}: {reply}"
        );
        assert!(
            reply["message"].as_str().unwrap().contains("duplicate key"),
            "{reply}"
        );
    }
    let output = tokio::process::Command::new(BIN)
        .args(["session.get", r#"{"session_id":"a","session_id":"b"}"#])
        .env("AGENT_HOST_HOME", &host.home)
        .output()
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        reply["code"],
        json!(ErrorCode::InvalidJson.number()),
        "{reply}"
    );
    host.shutdown().await;
}
