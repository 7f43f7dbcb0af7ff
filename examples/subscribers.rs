//! Many idle WebSocket subscribers of one real host (issue 19): the `agent-host` binary in its
//! own process on a temp home, N subscribers each with its own grant (`subscriber.add` over
//! IPC) connected and greeted (`HelloResp`), 64 in flight at a time. Prints, per round and as
//! min/median/max over the rounds: the time to grant and connect all, each grant's and each
//! connect's p50 / p99 / max, the host's resident memory with one, with 1,000 and with all
//! connected, the cost per subscriber, and the host's open-file limit (`host.status`
//! `limits.open_files`). A round fails unless the host lists all N as connected.
//!
//! This process holds one socket per subscriber: it raises its own soft open-file limit to
//! the hard one (`agent_host::limits::raise_open_files`, as the host does), and refuses an N
//! that does not fit under it.
//!
//! Run: `cargo build --release && cargo run --release --example subscribers -- [N] [ROUNDS]
//! [--bin PATH]` (N default 10000, ROUNDS default 3; the binary defaults to the `agent-host`
//! next to this example's directory, i.e. `target/release/agent-host`, which runs the
//! `agent-hostd` beside it).

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
            .await
            .context("the host's ready line")??
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
        .await
        .with_context(|| format!("{command} over IPC"))?;
        anyhow::ensure!(reply.is_ok(), "{command}: {}", reply.to_line());
        Ok(reply.data)
    }

    /// A granted, connected and greeted subscriber, with how long its grant (`subscriber.add`
    /// over IPC) and its connection (upgrade, `Hello`, `HelloResp`) took.
    async fn subscriber(&self) -> anyhow::Result<(WsClient, Duration, Duration)> {
        let started = Instant::now();
        let grant = self
            .ok(
                "subscriber.add",
                json!({"type": "local", "replay_mode": "none"}),
            )
            .await?;
        let granted = started.elapsed();
        let hello = pb::Hello {
            client_name: "idle".into(),
            cursor: None,
            protocol_version: PROTOCOL_VERSION,
        };
        let started = Instant::now();
        let (ws, _) = tokio::time::timeout(
            WAIT,
            client::connect(
                grant["ws_endpoint"].as_str().context("endpoint")?,
                grant["ws_token"].as_str().context("token")?,
                hello,
            ),
        )
        .await
        .context("the WebSocket connect and Hello")??;
        Ok((ws, granted, started.elapsed()))
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.ok("host.shutdown", json!({})).await?;
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .context("the host's exit after host.shutdown")??;
        Ok(())
    }
}

struct Round {
    connect_s: f64,
    /// From the clients' close to the host's exit after `host.shutdown`.
    stop_s: f64,
    before_kib: u64,
    /// Host RSS once [`CHECKPOINT`] subscribers were connected (when `n` is larger).
    checkpoint_kib: Option<u64>,
    connected_kib: u64,
    open_files_soft: u64,
    /// Per subscriber: its grant over IPC, its WebSocket connect and greeting.
    grants: Vec<Duration>,
    connects: Vec<Duration>,
}

/// The subscriber count at which a round also reads the host's RSS.
const CHECKPOINT: usize = 1000;

async fn round(bin: &PathBuf, n: usize) -> anyhow::Result<Round> {
    let host = Host::start(bin).await?;
    let status = host.ok("host.status", json!({})).await?;
    let open_files_soft = status["limits"]["open_files"]["soft"]
        .as_u64()
        .context("host.status has no limits.open_files.soft")?;
    anyhow::ensure!(
        open_files_soft > n as u64,
        "the host's open-file limit ({open_files_soft}) is too low for {n} subscribers"
    );
    // One first: what a host allocates on its first connection is not a subscriber's cost.
    let (first, _, _) = host.subscriber().await?;
    let before_kib = rss_kib(host.pid)?;
    let started = Instant::now();
    let mut clients = vec![first];
    let (mut grants, mut connects) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut checkpoint_kib = None;
    let mut connecting = futures_util::stream::iter(1..n)
        .map(|_| host.subscriber())
        .buffer_unordered(IN_FLIGHT);
    while let Some(got) = connecting.next().await {
        let (client, granted, connected) =
            got.with_context(|| format!("subscriber {} of {n}", clients.len() + 1))?;
        clients.push(client);
        grants.push(granted);
        connects.push(connected);
        if clients.len() == CHECKPOINT && n > CHECKPOINT {
            checkpoint_kib = Some(rss_kib(host.pid)?);
        }
    }
    drop(connecting);
    let connect_s = started.elapsed().as_secs_f64();
    let connected_kib = rss_kib(host.pid)?;
    // The host's own view, after its RSS was read (the listing allocates): every subscriber
    // still connected. The clients do not read, so they answer no ping: a round that took
    // longer than the host's keepalive (a minute) would lose its first ones here.
    let listed = host.ok("subscriber.list", json!({})).await?;
    let seen = listed["subscribers"]
        .as_array()
        .context("subscriber.list has no subscribers")?
        .iter()
        .filter(|s| s["connected"] == true)
        .count();
    anyhow::ensure!(
        seen == n,
        "the host sees {seen} of {n} subscribers connected"
    );
    drop(clients);
    let stopping = Instant::now();
    host.stop().await?;
    let stop_s = stopping.elapsed().as_secs_f64();
    Ok(Round {
        connect_s,
        stop_s,
        before_kib,
        checkpoint_kib,
        connected_kib,
        open_files_soft,
        grants,
        connects,
    })
}

/// p50 / p99 / max of one round's per-subscriber times, in ms.
fn latencies(samples: &[Duration]) -> String {
    let mut v = samples.to_vec();
    v.sort_unstable();
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    format!(
        "p50 {:.2} / p99 {:.2} / max {:.2} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

fn min_med_max(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let med = v[v.len() / 2];
    format!(
        "min {:.2} / median {med:.2} / max {:.2}",
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
    // This process holds the client end of every connection (one descriptor each), and a few
    // IPC sockets and its own files besides: raise its soft limit as the host raises its own.
    let (_, limit) = agent_host::limits::raise_open_files()?;
    anyhow::ensure!(
        limit.soft >= (n + IN_FLIGHT + 64) as u64,
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
        let checkpoint = got.checkpoint_kib.map_or(String::new(), |kib| {
            format!(
                ", {:.1} MiB with {CHECKPOINT} ({:.1} KiB each)",
                kib as f64 / 1024.0,
                kib.saturating_sub(got.before_kib) as f64 / (CHECKPOINT - 1) as f64
            )
        });
        println!(
            "round {}: granted+connected in {:.2} s ({:.0} µs each); host RSS {:.1} MiB with \
             one{checkpoint}, {:.1} MiB with all ({:.1} KiB each); host open-file limit {}",
            r + 1,
            got.connect_s,
            got.connect_s * 1e6 / n as f64,
            got.before_kib as f64 / 1024.0,
            got.connected_kib as f64 / 1024.0,
            per(got.connected_kib),
            got.open_files_soft,
        );
        println!(
            "  each grant (subscriber.add over IPC, {IN_FLIGHT} in flight): {}; each connect \
             (upgrade + Hello): {}",
            latencies(&got.grants),
            latencies(&got.connects)
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
    if all.iter().all(|r| r.checkpoint_kib.is_some()) {
        println!(
            "host RSS with {CHECKPOINT} connected (MiB): {}",
            min_med_max(
                all.iter()
                    .map(|r| r.checkpoint_kib.unwrap_or(0) as f64 / 1024.0)
                    .collect()
            )
        );
    }
    println!(
        "clients closed to host exited (s): {}",
        min_med_max(all.iter().map(|r| r.stop_s).collect())
    );
    println!(
        "host RSS with one connected (MiB): {}",
        min_med_max(all.iter().map(|r| r.before_kib as f64 / 1024.0).collect())
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
