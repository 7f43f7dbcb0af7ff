//! Codex's own two transports, one client each, the same mock model, alternating (A B A B …):
//! `codex app-server` on stdio (JSON Lines, what the host runs today) against `codex
//! app-server --listen unix://PATH` (WebSocket over a Unix socket, what its daemon serves).
//! No host in between: this measures what Codex's writer costs on each transport, from the
//! mock's chunk write to the client's read of the matching `item/agentMessage/delta`.
//!
//! Run: `cargo bench --bench codex_transport -- [rounds] [turns] [chunks] [delay_ms]`
//! (default 4 5 93 30). Runs in a loopback-only network namespace, as the tests do.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark reports on stdout and panics on a broken setup"
)]

#[path = "../tests/common/mock_model.rs"]
mod mock_model;

#[path = "common/codex.rs"]
mod common;

#[path = "../tests/common/agents.rs"]
#[allow(dead_code, reason = "the benchmark uses part of the test helpers")]
mod agents;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(120);

fn main() -> anyhow::Result<()> {
    let nums: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let at = |i: usize, d: u64| nums.get(i).copied().unwrap_or(d);
    let params = (at(0, 4), at(1, 5), at(2, 93), at(3, 30));
    let launcher = agents::ensure_codex();
    if common::reran_in_loopback_netns(&nums.iter().map(u64::to_string).collect::<Vec<_>>())? {
        return Ok(());
    }
    let native = agent_host::adapter::codex_native::native_of(&launcher, &[])
        .context("the native Codex binary")?;
    let base_url = common::mock_on_thread()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(bench(native.binary, native.env, base_url, params))
}

/// One JSON-RPC connection to a Codex app-server, over either transport.
enum Conn {
    Stdio {
        _child: tokio::process::Child,
        stdin: tokio::process::ChildStdin,
        lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    },
    Socket {
        _child: tokio::process::Child,
        ws: tokio_tungstenite::WebSocketStream<tokio::net::UnixStream>,
    },
}

impl Conn {
    async fn send(&mut self, message: Value) -> anyhow::Result<()> {
        match self {
            Conn::Stdio { stdin, .. } => {
                let mut line = message.to_string();
                line.push('\n');
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await?;
            }
            Conn::Socket { ws, .. } => ws.send(Message::text(message.to_string())).await?,
        }
        Ok(())
    }

    /// The next message and when it was read.
    async fn next(&mut self) -> anyhow::Result<(Value, Instant)> {
        loop {
            let text = match self {
                Conn::Stdio { lines, .. } => tokio::time::timeout(WAIT, lines.next_line())
                    .await??
                    .context("stdout closed")?,
                Conn::Socket { ws, .. } => {
                    match tokio::time::timeout(WAIT, ws.next())
                        .await?
                        .context("socket closed")??
                    {
                        Message::Text(t) => t.as_str().to_owned(),
                        _ => continue,
                    }
                }
            };
            let at = Instant::now();
            return Ok((serde_json::from_str(&text)?, at));
        }
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) -> anyhow::Result<Value> {
        self.send(json!({"id": id, "method": method, "params": params}))
            .await?;
        loop {
            let (value, _) = self.next().await?;
            if value["id"] == id && value.get("method").is_none() {
                if let Some(error) = value.get("error") {
                    bail!("{method}: {error}");
                }
                return Ok(value["result"].clone());
            }
        }
    }
}

async fn open(
    socket: bool,
    dir: &Path,
    bin: &Path,
    env: &[(String, String)],
    base_url: &str,
    work: &Path,
) -> anyhow::Result<(Conn, String)> {
    let name = if socket { "socket" } else { "stdio" };
    let home = dir.join(name);
    common::write_config(&home.join(".codex"), base_url)?;
    let mut command = tokio::process::Command::new(bin);
    command
        .arg("app-server")
        .env_clear()
        .envs(env.iter().cloned())
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .env("CODEX_HOME", home.join(".codex"))
        .env("MOCK_API_KEY", "mock-key")
        .current_dir(work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let path = dir.join(format!("{name}.sock"));
    if socket {
        command
            .arg("--listen")
            .arg(format!("unix://{}", path.display()));
    }
    let mut child = command.spawn()?;
    let mut conn = if socket {
        let started = Instant::now();
        let stream = loop {
            match tokio::net::UnixStream::connect(&path).await {
                Ok(s) => break s,
                Err(e) if started.elapsed() > WAIT => bail!("{}: {e}", path.display()),
                // Polling for the socket file: the server says nothing when it listens.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let (ws, _) = tokio_tungstenite::client_async("ws://localhost/", stream).await?;
        Conn::Socket { _child: child, ws }
    } else {
        Conn::Stdio {
            stdin: child.stdin.take().context("stdin")?,
            lines: tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines(),
            _child: child,
        }
    };
    conn.request(
        1,
        "initialize",
        json!({"clientInfo": {"name": name, "title": name, "version": "0.0.1"},
               "capabilities": {"experimentalApi": true}}),
    )
    .await?;
    conn.send(json!({"method": "initialized"})).await?;
    let thread = conn
        .request(
            2,
            "thread/start",
            json!({"cwd": work.display().to_string(), "approvalPolicy": "on-request",
                   "sandbox": "workspace-write"}),
        )
        .await?["thread"]["id"]
        .as_str()
        .context("thread id")?
        .to_owned();
    Ok((conn, thread))
}

/// Run one turn; the deltas' texts with their read times.
async fn turn(
    conn: &mut Conn,
    thread: &str,
    id: u64,
    prompt: &str,
) -> anyhow::Result<Vec<(String, Instant)>> {
    conn.send(
        json!({"id": id, "method": "turn/start", "params": {"threadId": thread,
        "input": [{"type": "text", "text": prompt, "text_elements": []}]}}),
    )
    .await?;
    let mut deltas = Vec::new();
    loop {
        let (value, at) = conn.next().await?;
        match value["method"].as_str() {
            Some("item/agentMessage/delta") => deltas.push((
                value["params"]["delta"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                at,
            )),
            Some("turn/completed") => return Ok(deltas),
            _ => {}
        }
    }
}

fn pct(values: &[Duration], p: f64) -> f64 {
    common::pct(values, p).as_secs_f64() * 1000.0
}

async fn bench(
    bin: PathBuf,
    env: Vec<(String, String)>,
    base_url: String,
    (rounds, turns, chunks, delay): (u64, u64, u64, u64),
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work)?;
    let mut sides = [
        open(false, dir.path(), &bin, &env, &base_url, &work).await?,
        open(true, dir.path(), &bin, &env, &base_url, &work).await?,
    ];
    let names = ["stdio", "socket"];
    println!(
        "{}: {rounds} rounds x {turns} turns x {chunks} chunks ({delay} ms apart), one client \
         each, stdio (A) and unix socket (B) alternating",
        bin.display()
    );
    let mut id = 10;
    for (conn, thread) in &mut sides {
        id += 1;
        turn(
            conn,
            thread,
            id,
            &format!("STREAM {chunks} {delay} warm{id}"),
        )
        .await?;
    }
    mock_model::take_chunk_writes();
    let mut all: [Vec<Duration>; 2] = Default::default();
    let mut ratios = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut legs: [Vec<Duration>; 2] = Default::default();
        for (side, (conn, thread)) in sides.iter_mut().enumerate() {
            for t in 0..turns {
                id += 1;
                let prompt = format!("STREAM {chunks} {delay} {}{round}x{t}", names[side]);
                let deltas = turn(conn, thread, id, &prompt).await?;
                let writes: HashMap<String, Instant> =
                    mock_model::take_chunk_writes().into_iter().collect();
                for (text, at) in deltas {
                    if let Some(written) = writes.get(&text) {
                        legs[side].push(at.saturating_duration_since(*written));
                    }
                }
            }
        }
        let [s, u] = &legs;
        println!(
            "  round {round}: stdio p50 {:.3} p99 {:.3} | socket p50 {:.3} p99 {:.3} ms ({} / {} deltas)",
            pct(s, 0.5),
            pct(s, 0.99),
            pct(u, 0.5),
            pct(u, 0.99),
            s.len(),
            u.len()
        );
        ratios.0.push(pct(s, 0.5) / pct(u, 0.5));
        ratios.1.push(pct(s, 0.99) / pct(u, 0.99));
        for (all, leg) in all.iter_mut().zip(legs.iter_mut()) {
            all.append(leg);
        }
    }
    for (side, name) in names.iter().enumerate() {
        println!(
            "{name:>6} all rounds: {} deltas; p50 {:.3} p90 {:.3} p99 {:.3} max {:.3} ms",
            all[side].len(),
            pct(&all[side], 0.5),
            pct(&all[side], 0.9),
            pct(&all[side], 0.99),
            pct(&all[side], 1.0)
        );
    }
    let range = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!(
            "median {:.2} (min {:.2}, max {:.2})",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1]
        )
    };
    println!("stdio/socket per round: p50 {}", range(&mut ratios.0));
    println!("stdio/socket per round: p99 {}", range(&mut ratios.1));
    Ok(())
}
