//! The host's added latency to the first text delta (issue 4, acceptance 9), against running
//! the same `claude` against the same mock model directly, in one run.
//!
//! - **direct** (the baseline): the pinned `claude` started by hand with the same stream-json
//!   flags and environment; a prompt line written to its stdin; the clock stops at the first
//!   stdout line that is a `text_delta`.
//! - **host**: a real host (`agent_host::run`, temp home) running the same binary; the prompt
//!   goes in by `session.send` over the Unix socket and the clock stops when the first
//!   `text.delta` of that run arrives at a WebSocket subscriber (so it includes IPC, the
//!   session actor, the driver, the translator, the bus and the WebSocket push).
//!
//! The first turn of each includes starting the process ("cold"); the others reuse it
//! ("warm"). Turns alternate between the two so drift hits both alike. Everything runs in a
//! loopback-only network namespace (as the tests do) against the project's mock model.
//!
//! Run: `cargo bench --bench claude` (optional arg: warm turns, default 30).

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark reports on stdout and panics on a broken setup"
)]

#[path = "common/codex.rs"]
mod common;

#[path = "../tests/common/mock_model.rs"]
mod mock_model;

#[path = "../tests/common/agents.rs"]
#[allow(dead_code, reason = "the benchmark uses part of the test helpers")]
mod agents;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_host::adapter::claude;
use agent_host::config::{AgentConfig, Config};
use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::ws::client::{self, WsClient};
use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};

fn main() -> anyhow::Result<()> {
    let turns: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let bin = agents::ensure_claude();
    // Re-run inside a namespace that has only loopback.
    if common::reran_in_loopback_netns(&[turns.to_string()])? {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench(bin, turns))
}

/// A claude process driven by hand.
struct Direct {
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    _child: tokio::process::Child,
}

impl Direct {
    fn start(bin: &Path, env: &[(String, String)], cwd: &Path) -> anyhow::Result<Direct> {
        let id = uuid::Uuid::new_v4().to_string();
        let mut child = tokio::process::Command::new(bin)
            .args(claude::launch_args(Some(&id), None, false))
            .env_clear()
            .envs(env.iter().cloned())
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        Ok(Direct {
            stdin: child.stdin.take().context("stdin")?,
            lines: BufReader::new(child.stdout.take().context("stdout")?).lines(),
            _child: child,
        })
    }

    /// One turn; the time to the first text delta.
    async fn turn(&mut self, text: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let line = claude::user_frame(text, &uuid::Uuid::new_v4().to_string()) + "\n";
        self.stdin.write_all(line.as_bytes()).await?;
        let mut first = None;
        loop {
            let line = self.lines.next_line().await?.context("claude exited")?;
            let frame: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if first.is_none()
                && frame["type"] == "stream_event"
                && frame["event"]["delta"]["type"] == "text_delta"
            {
                first = Some(started.elapsed());
            }
            if frame["type"] == "result" {
                return first.context("a turn without text");
            }
        }
    }
}

/// The same through a host.
struct Hosted {
    ipc: PathBuf,
    session: String,
    ws: WsClient,
}

impl Hosted {
    /// One turn; the time to the first text delta, and to the `session.send` reply.
    async fn turn(&mut self, text: &str) -> anyhow::Result<(Duration, Duration)> {
        let started = Instant::now();
        let reply = agent_host::ipc::request(
            &self.ipc,
            &json!({"command": "session.send", "params": {"session_id": self.session, "text": text}}),
            Duration::from_secs(10),
        )
        .await?;
        anyhow::ensure!(reply.is_ok(), "session.send: {}", reply.to_line());
        let replied = started.elapsed();
        let run_id = reply.data["run_id"].as_str().context("run_id")?.to_owned();
        let mut first = None;
        loop {
            let frame = self.ws.next_frame().await?.context("closed")?;
            let Some(push) = client::event_of(&frame) else {
                continue;
            };
            if push.run_id != run_id {
                continue;
            }
            let event: Value = serde_json::from_str(&push.event_json)?;
            if first.is_none() && event["k"] == "text.delta" {
                first = Some(started.elapsed());
            }
            if event["k"] == "run.end" {
                anyhow::ensure!(event["state"] == "completed", "run ended {event}");
                return Ok((first.context("a run without text")?, replied));
            }
        }
    }
}

async fn start_host(
    home: &Path,
    bin: &Path,
    env: &[(String, String)],
    cwd: &Path,
) -> anyhow::Result<Hosted> {
    let mut config = Config::with_home(home)?;
    config.env = env.to_vec();
    config.log_level = "warn".to_owned();
    config.agents.insert(
        "claude".to_owned(),
        AgentConfig {
            binary: Some(bin.display().to_string()),
            ..Default::default()
        },
    );
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if let Err(e) = agent_host::run(config, std::future::pending(), ready_tx).await {
            println!("host failed: {e}");
        }
    });
    let ready = ready_rx.await?;
    let ask = |command: &'static str, params: Value| {
        let ipc = ready.ipc_path.clone();
        async move {
            let reply = agent_host::ipc::request(
                &ipc,
                &json!({"command": command, "params": params}),
                Duration::from_secs(10),
            )
            .await?;
            anyhow::ensure!(reply.is_ok(), "{command}: {}", reply.to_line());
            Ok::<Value, anyhow::Error>(reply.data)
        }
    };
    let session = ask(
        "session.create",
        json!({"agent_type": "claude", "cwd": cwd.display().to_string()}),
    )
    .await?["session_id"]
        .as_str()
        .context("session_id")?
        .to_owned();
    let grant = ask(
        "subscriber.add",
        json!({"type": "local", "session_id": session, "forward_deltas": true, "replay_mode": "none"}),
    )
    .await?;
    let hello = pb::Hello {
        client_name: "bench".into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    let (ws, _) = client::connect(
        grant["ws_endpoint"].as_str().context("endpoint")?,
        grant["ws_token"].as_str().context("token")?,
        hello,
    )
    .await?;
    Ok(Hosted {
        ipc: ready.ipc_path,
        session,
        ws,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn bench(bin: PathBuf, turns: usize) -> anyhow::Result<()> {
    let mock = mock_model::MockModel::start(0).await?;
    let dir = tempfile::tempdir()?;
    let (direct_home, host_home, work) = (
        dir.path().join("direct"),
        dir.path().join("hosted"),
        dir.path().join("work"),
    );
    for d in [&direct_home, &host_home, &work] {
        std::fs::create_dir_all(d)?;
    }
    let direct_env = agents::agent_env(&direct_home, &mock);
    let host_env = agents::agent_env(&host_home, &mock);
    let mut direct = Direct::start(&bin, &direct_env, &work)?;
    let mut hosted = start_host(&dir.path().join("host"), &bin, &host_env, &work).await?;

    let mut direct_times = Vec::new();
    let mut host_times = Vec::new();
    let mut replies = Vec::new();
    for i in 0..=turns {
        let prompt = format!("turn {i} of the latency benchmark");
        direct_times.push(direct.turn(&prompt).await?);
        let (first, replied) = hosted.turn(&prompt).await?;
        host_times.push(first);
        replies.push(replied);
    }
    let version = std::process::Command::new(&bin).arg("--version").output()?;
    println!(
        "claude {} against the mock model, {turns} warm turns (+1 cold), first text delta:",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    println!(
        "  cold (process start + turn): direct {:>7.1} ms   host {:>7.1} ms   added {:>+6.1} ms",
        ms(direct_times[0]),
        ms(host_times[0]),
        ms(host_times[0]) - ms(direct_times[0])
    );
    let mut d: Vec<Duration> = direct_times[1..].to_vec();
    let mut h: Vec<Duration> = host_times[1..].to_vec();
    d.sort_unstable();
    h.sort_unstable();
    for (name, p) in [("p50", 0.5), ("p90", 0.9)] {
        let (dp, hp) = (percentile(&d, p), percentile(&h, p));
        println!(
            "  warm {name}:                    direct {:>7.1} ms   host {:>7.1} ms   added {:>+6.1} ms   ratio {:.2}",
            ms(dp),
            ms(hp),
            ms(hp) - ms(dp),
            hp.as_secs_f64() / dp.as_secs_f64()
        );
    }
    let mut r = replies[1..].to_vec();
    r.sort_unstable();
    println!(
        "  of which the session.send reply (IPC round trip, run row committed): p50 {:.1} ms",
        ms(percentile(&r, 0.5))
    );
    let mean = |v: &[Duration]| v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64;
    println!(
        "  warm mean:                   direct {:>7.1} ms   host {:>7.1} ms   added {:>+6.1} ms",
        mean(&d),
        mean(&h),
        mean(&h) - mean(&d)
    );
    Ok(())
}
