//! Many idle WebSocket subscribers of one real host (issue 19): the `agent-host` binary in its
//! own process on a temp home, N subscribers each with its own grant (`subscriber.add` over
//! IPC) connected and greeted (`HelloResp`). Prints, per round and as min/median/max over the
//! rounds: the time to grant and connect all, the host's resident memory with one and with all
//! connected, and the cost per subscriber.
//!
//! Run: `cargo build --release && cargo run --release --example subscribers -- [N] [ROUNDS]
//! [--bin PATH]` (N default 10000, ROUNDS default 3; the binary defaults to the `agent-host`
//! next to this example's directory, i.e. `target/release/agent-host`).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example reports on stdout"
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::ws::client::{self, WsClient};
use anyhow::Context;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const WAIT: Duration = Duration::from_secs(30);
/// Grants and connections in flight at once.
const IN_FLIGHT: usize = 64;

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")
}

struct Host {
    _dir: tempfile::TempDir,
    home: PathBuf,
    pid: u32,
    child: tokio::process::Child,
}

impl Host {
    async fn start(bin: &PathBuf) -> anyhow::Result<Host> {
        let dir = tempfile::tempdir()?;
        let home = dir.path().join("home");
        let mut child = tokio::process::Command::new(bin)
            .args(["host.start", r#"{"foreground":true}"#])
            .env("AGENT_HOST_HOME", &home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let line = tokio::time::timeout(WAIT, BufReader::new(stdout).lines().next_line())
            .await??
            .context("the host ended before it was ready")?;
        let ready: Value = serde_json::from_str(&line)?;
        anyhow::ensure!(ready["code"] == 0, "{line}");
        let pid = u32::try_from(ready["data"]["pid"].as_u64().context("pid")?)?;
        Ok(Host {
            _dir: dir,
            home,
            pid,
            child,
        })
    }

    async fn ok(&self, command: &str, params: Value) -> anyhow::Result<Value> {
        let reply = agent_host::ipc::request(
            &self.home.join("host.sock"),
            &json!({"command": command, "params": params}),
            WAIT,
        )
        .await?;
        anyhow::ensure!(reply.is_ok(), "{command}: {}", reply.to_line());
        Ok(reply.data)
    }

    async fn subscriber(&self) -> anyhow::Result<WsClient> {
        let grant = self
            .ok(
                "subscriber.add",
                json!({"type": "local", "replay_mode": "none"}),
            )
            .await?;
        let hello = pb::Hello {
            client_name: "idle".into(),
            cursor: None,
            protocol_version: PROTOCOL_VERSION,
        };
        let (ws, _) = client::connect(
            grant["ws_endpoint"].as_str().context("endpoint")?,
            grant["ws_token"].as_str().context("token")?,
            hello,
        )
        .await?;
        Ok(ws)
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.ok("host.shutdown", json!({})).await?;
        tokio::time::timeout(WAIT, self.child.wait()).await??;
        Ok(())
    }
}

struct Round {
    connect_s: f64,
    before_kib: u64,
    connected_kib: u64,
}

async fn round(bin: &PathBuf, n: usize) -> anyhow::Result<Round> {
    let host = Host::start(bin).await?;
    // One first: what a host allocates on its first connection is not a subscriber's cost.
    let first = host.subscriber().await?;
    let before_kib = rss_kib(host.pid)?;
    let started = Instant::now();
    let results: Vec<anyhow::Result<WsClient>> = futures_util::stream::iter(1..n)
        .map(|_| host.subscriber())
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let connect_s = started.elapsed().as_secs_f64();
    let mut clients: Vec<WsClient> = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    clients.push(first);
    let connected_kib = rss_kib(host.pid)?;
    drop(clients);
    host.stop().await?;
    Ok(Round {
        connect_s,
        before_kib,
        connected_kib,
    })
}

fn min_med_max(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let med = v[v.len() / 2];
    format!(
        "min {:.1} / median {med:.1} / max {:.1}",
        v[0],
        v[v.len() - 1]
    )
}

fn main() -> anyhow::Result<()> {
    let mut n = 10_000_usize;
    let mut rounds = 3_usize;
    let mut bin = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .context("no target directory")?
        .join("agent-host");
    let mut numbers = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--bin" {
            bin = PathBuf::from(args.next().context("--bin PATH")?);
        } else if let Ok(v) = arg.parse::<usize>() {
            match numbers {
                0 => n = v,
                _ => rounds = v,
            }
            numbers += 1;
        } else {
            anyhow::bail!("usage: subscribers [N] [ROUNDS] [--bin PATH]");
        }
    }
    anyhow::ensure!(n >= 2 && rounds >= 1, "N >= 2, ROUNDS >= 1");
    // This process holds the client end of every connection.
    let (_, limit) = agent_host::limits::raise_open_files()?;
    anyhow::ensure!(
        limit.soft > 2 * n as u64,
        "the open-file limit ({}) is too low for {n} clients",
        limit.soft
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "{n} idle subscribers of {} ({} cores; the machine is shared, figures are noisy)",
        bin.display(),
        std::thread::available_parallelism().map_or(1, |c| c.get())
    );
    let mut all = Vec::new();
    for r in 0..rounds {
        let got = runtime.block_on(round(&bin, n))?;
        let per = |kib: u64| kib.saturating_sub(got.before_kib) as f64 / (n - 1) as f64;
        println!(
            "round {}: granted+connected in {:.2} s ({:.0} µs each); host RSS {:.1} MiB with one, \
             {:.1} MiB with all ({:.1} KiB each)",
            r + 1,
            got.connect_s,
            got.connect_s * 1e6 / n as f64,
            got.before_kib as f64 / 1024.0,
            got.connected_kib as f64 / 1024.0,
            per(got.connected_kib),
        );
        all.push(got);
    }
    let per = |f: fn(&Round) -> u64| -> Vec<f64> {
        all.iter()
            .map(|r| f(r).saturating_sub(r.before_kib) as f64 / (n - 1) as f64)
            .collect()
    };
    println!(
        "time to grant+connect all (s): {}",
        min_med_max(all.iter().map(|r| r.connect_s).collect())
    );
    println!(
        "host RSS with all connected (MiB): {}",
        min_med_max(
            all.iter()
                .map(|r| r.connected_kib as f64 / 1024.0)
                .collect()
        )
    );
    println!(
        "KiB per idle subscriber: {}",
        min_med_max(per(|r| r.connected_kib))
    );
    Ok(())
}
