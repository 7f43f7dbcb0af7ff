//! Side by side with Codex's own daemon (issue 19): 10 followers of one Codex session through
//! the host against 10 clients of `codex app-server daemon` on one thread, the same mock
//! model, in one run, alternating host and daemon legs (A B A B …).
//!
//! - **host** (A): a real `agent-host` process (`host.start {"foreground":true}`, temp home)
//!   running the pinned Codex (the native binary behind the npm launcher); one session; 10
//!   WebSocket followers over the host's Unix socket, or TCP on 127.0.0.1 (see below;
//!   `subscriber.add`, deltas forwarded); prompts go in by `session.send` over IPC.
//! - **daemon** (B): `codex app-server daemon start` (its own CODEX_HOME, same config and
//!   mock); a driver connection starts the thread and runs a first turn (a thread cannot be
//!   followed before), then 10 follower connections subscribe with `thread/resume
//!   {excludeTurns:true}` and the driver unsubscribes; the driver starts each turn.
//!   Connections are WebSocket over the daemon's Unix control socket.
//!
//! Each turn the mock streams `chunks` text chunks `delay` ms apart (`STREAM n ms tag`) and
//! keeps the instant it wrote each one; every client timestamps each delta as it is read, and
//! deltas are matched to the mock's writes by their (unique) text. All clocks are this
//! process's monotonic clock. Reported: delta latency (mock write → client) p50/p99, the
//! first-to-last follower spread per chunk, and resident memory sampled every 50 ms (the host
//! process alone, its Codex child excluded; the daemon process with its descendants and its
//! updater). Per-round ratios host/daemon are printed, and the median over rounds.
//!
//! Each side also reports its turns' first two chunks apart from the rest: on the host those
//! follow the turn's first brackets, which are sent only once committed. The processes are
//! listed (`/proc/<pid>/exe`), which shows that the host runs the native Codex binary, not
//! the node launcher. `AGENT_HOST_BENCH_WORKERS=N` sets the host runtime's worker count
//! (`TOKIO_WORKER_THREADS`), an experiment knob; unset, the host runs as it ships.
//! `AGENT_HOST_BENCH_HOST=<path>` runs another build of `agent-host` as side A (to compare two
//! commits against the same daemon, alternating invocations).
//! The host's followers connect over its Unix socket (`ws.sock`), the transport the daemon's
//! clients use over theirs, so that both sides are compared on the same transport;
//! `AGENT_HOST_BENCH_TRANSPORT=tcp` connects them over TCP on 127.0.0.1 instead (the default
//! before 2026-12-07).
//!
//! Everything runs in a loopback-only network namespace (as the tests do).
//!
//! Run: `cargo bench --bench codex_daemon -- [rounds] [turns] [chunks] [delay_ms]`
//! (default 4 5 93 30).

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

use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::ws::client;
use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

const FOLLOWERS: usize = 10;
const WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy)]
struct Params {
    rounds: usize,
    turns: usize,
    chunks: usize,
    delay_ms: u64,
}

fn main() -> anyhow::Result<()> {
    let nums: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let at = |i: usize, d: u64| nums.get(i).copied().unwrap_or(d);
    let params = Params {
        rounds: at(0, 4) as usize,
        turns: at(1, 5) as usize,
        chunks: at(2, 93) as usize,
        delay_ms: at(3, 30),
    };
    let bin = agents::ensure_codex();
    if common::reran_in_loopback_netns(&nums.iter().map(u64::to_string).collect::<Vec<_>>())? {
        return Ok(());
    }
    let base_url = common::mock_on_thread()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(bench(bin, base_url, params))
}

/// What a follower reports: a delta's text and when it was read, or the turn's end.
enum Seen {
    Delta {
        follower: usize,
        text: String,
        at: Instant,
    },
    End,
}

fn agent_env(home: &Path) -> Vec<(String, String)> {
    vec![
        ("HOME".into(), home.display().to_string()),
        ("PATH".into(), "/usr/bin:/bin".into()),
        (
            "CODEX_HOME".into(),
            home.join(".codex").display().to_string(),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// A: the host

struct Host {
    child: tokio::process::Child,
    ipc: PathBuf,
    session: String,
    seen: mpsc::UnboundedReceiver<Seen>,
}

async fn ask(ipc: &Path, command: &str, params: Value) -> anyhow::Result<Value> {
    let reply = agent_host::ipc::request(
        ipc,
        &json!({"command": command, "params": params}),
        Duration::from_secs(30),
    )
    .await?;
    anyhow::ensure!(reply.is_ok(), "{command}: {}", reply.to_line());
    Ok(reply.data)
}

impl Host {
    async fn start(dir: &Path, bin: &Path, base_url: &str, work: &Path) -> anyhow::Result<Host> {
        let home = dir.join("host");
        let agent_home = dir.join("host-agent-home");
        std::fs::create_dir_all(&home)?;
        common::write_config(&agent_home.join(".codex"), base_url)?;
        std::fs::write(
            home.join("config.toml"),
            format!(
                "[agents.codex]\nbinary = {:?}\nenv = {{ MOCK_API_KEY = \"mock-key\" }}\n",
                bin.display().to_string()
            ),
        )?;
        // An A/B knob: another build of the host (a copy kept from an earlier commit), so
        // two builds can be compared in one run of this bench; unset, this build's host.
        let host_bin = std::env::var_os("AGENT_HOST_BENCH_HOST")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_agent-host")));
        let mut child = tokio::process::Command::new(host_bin)
            .arg("host.start")
            .arg(r#"{"foreground":true}"#)
            .env_clear()
            .envs(agent_env(&agent_home))
            .env("AGENT_HOST_HOME", &home)
            .env("AGENT_HOST_LOG", "warn")
            // An experiment knob: the host runtime's worker count (tokio reads this variable
            // when the builder sets none); unset, the host runs as it ships.
            .envs(
                std::env::var("AGENT_HOST_BENCH_WORKERS")
                    .ok()
                    .map(|n| ("TOKIO_WORKER_THREADS", n)),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
        let ready = tokio::time::timeout(WAIT, lines.next_line())
            .await??
            .context("the host exited before it was ready")?;
        let ready: Value = serde_json::from_str(&ready)?;
        anyhow::ensure!(ready["code"] == 0, "host.start: {ready}");
        let ipc = home.join("host.sock");
        let session = ask(
            &ipc,
            "session.create",
            json!({"agent_type": "codex", "cwd": work.display().to_string()}),
        )
        .await?["session_id"]
            .as_str()
            .context("session_id")?
            .to_owned();
        let (tx, seen) = mpsc::unbounded_channel();
        for follower in 0..FOLLOWERS {
            let grant = ask(
                &ipc,
                "subscriber.add",
                json!({"type": "local", "session_id": session, "forward_deltas": true,
                       "replay_mode": "none"}),
            )
            .await?;
            let hello = pb::Hello {
                client_name: format!("bench-{follower}"),
                cursor: None,
                protocol_version: PROTOCOL_VERSION,
            };
            let token = grant["ws_token"].as_str().context("token")?;
            let (mut ws, _) = if unix_followers() {
                let socket = grant["ws_socket"].as_str().context("ws_socket")?;
                client::connect_unix(Path::new(socket), token, hello).await?
            } else {
                let endpoint = grant["ws_endpoint"].as_str().context("endpoint")?;
                client::connect(endpoint, token, hello).await?
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Ok(Some(frame)) = ws.next_frame().await {
                    let at = Instant::now();
                    let Some(push) = client::event_of(&frame) else {
                        continue;
                    };
                    let Ok(event) = serde_json::from_str::<Value>(&push.event_json) else {
                        continue;
                    };
                    let seen = match event["k"].as_str() {
                        Some("text.delta") => Seen::Delta {
                            follower,
                            text: event["text"].as_str().unwrap_or_default().to_owned(),
                            at,
                        },
                        Some("run.end") => Seen::End,
                        _ => continue,
                    };
                    if tx.send(seen).is_err() {
                        return;
                    }
                }
            });
        }
        Ok(Host {
            child,
            ipc,
            session,
            seen,
        })
    }

    async fn turn(&mut self, prompt: &str) -> anyhow::Result<Vec<(usize, String, Instant)>> {
        ask(
            &self.ipc,
            "session.send",
            json!({"session_id": self.session, "text": prompt}),
        )
        .await?;
        collect(&mut self.seen).await
    }

    fn pids(&self) -> Vec<i32> {
        self.child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .into_iter()
            .collect()
    }
}

/// The host's followers connect over its Unix socket (`ws.sock`), as the daemon's clients do
/// over theirs; `AGENT_HOST_BENCH_TRANSPORT=tcp`: over TCP on 127.0.0.1. Any other value is
/// a mistake worth stopping on, not a silent default.
fn unix_followers() -> bool {
    match std::env::var("AGENT_HOST_BENCH_TRANSPORT") {
        Err(_) => true,
        Ok(t) if t.trim().eq_ignore_ascii_case("unix") => true,
        Ok(t) if t.trim().eq_ignore_ascii_case("tcp") => false,
        Ok(t) => panic!("AGENT_HOST_BENCH_TRANSPORT={t:?}: expected `unix` or `tcp`"),
    }
}

/// What the followers saw of one turn, once each of them saw its end.
async fn collect(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
) -> anyhow::Result<Vec<(usize, String, Instant)>> {
    let mut ends = 0;
    let mut deltas = Vec::new();
    while ends < FOLLOWERS {
        match tokio::time::timeout(WAIT, seen.recv()).await? {
            Some(Seen::Delta { follower, text, at }) => deltas.push((follower, text, at)),
            Some(Seen::End) => ends += 1,
            None => bail!("the followers are gone"),
        }
    }
    Ok(deltas)
}

// ---------------------------------------------------------------------------------------------
// B: Codex's daemon

type UnixWs = tokio_tungstenite::WebSocketStream<tokio::net::UnixStream>;

/// One JSON-RPC connection to the daemon (WebSocket over its control socket).
async fn daemon_connect(socket: &Path, name: &str) -> anyhow::Result<UnixWs> {
    let stream = tokio::net::UnixStream::connect(socket).await?;
    let (mut ws, _) = tokio_tungstenite::client_async("ws://localhost/", stream).await?;
    let init = json!({"id": 1, "method": "initialize", "params": {
        "clientInfo": {"name": name, "title": name, "version": "0.0.1"},
        "capabilities": {"experimentalApi": true}}});
    ws.send(Message::text(init.to_string())).await?;
    answer(&mut ws, 1).await?;
    ws.send(Message::text(json!({"method": "initialized"}).to_string()))
        .await?;
    Ok(ws)
}

/// Read until the answer to request `id` (what comes before it is dropped).
async fn answer(ws: &mut UnixWs, id: u64) -> anyhow::Result<Value> {
    loop {
        let message = tokio::time::timeout(WAIT, ws.next())
            .await?
            .context("the daemon closed")??;
        let Message::Text(text) = message else {
            continue;
        };
        let value: Value = serde_json::from_str(text.as_str())?;
        if value["id"] == id && value.get("method").is_none() {
            if let Some(error) = value.get("error") {
                bail!("request {id}: {error}");
            }
            return Ok(value["result"].clone());
        }
    }
}

async fn request(ws: &mut UnixWs, id: u64, method: &str, params: Value) -> anyhow::Result<Value> {
    let message = json!({"id": id, "method": method, "params": params});
    ws.send(Message::text(message.to_string())).await?;
    answer(ws, id).await
}

/// Read until `turn/completed`.
async fn until_completed(ws: &mut UnixWs) -> anyhow::Result<()> {
    loop {
        let message = tokio::time::timeout(WAIT, ws.next())
            .await?
            .context("the daemon closed")??;
        if let Message::Text(text) = message
            && text.as_str().contains("\"turn/completed\"")
        {
            return Ok(());
        }
    }
}

struct Daemon {
    codex_home: PathBuf,
    driver: UnixWs,
    thread: String,
    next_id: u64,
    seen: mpsc::UnboundedReceiver<Seen>,
}

impl Daemon {
    async fn start(dir: &Path, bin: &Path, base_url: &str, work: &Path) -> anyhow::Result<Daemon> {
        let home = dir.join("daemon-home");
        let codex_home = home.join(".codex");
        common::write_config(&codex_home, base_url)?;
        let out = tokio::process::Command::new(bin)
            .args(["app-server", "daemon", "start"])
            .env_clear()
            .envs(agent_env(&home))
            .env("MOCK_API_KEY", "mock-key")
            .current_dir(work)
            .stdin(Stdio::null())
            .output()
            .await?;
        let started: Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "daemon start: {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        anyhow::ensure!(started["status"] == "started", "daemon start: {started}");
        let socket = codex_home.join("app-server-control/app-server-control.sock");
        let mut driver = daemon_connect(&socket, "bench-driver").await?;
        let thread = request(
            &mut driver,
            2,
            "thread/start",
            json!({"cwd": work.display().to_string(), "approvalPolicy": "on-request",
                   "sandbox": "workspace-write"}),
        )
        .await?["thread"]["id"]
            .as_str()
            .context("thread id")?
            .to_owned();
        let mut daemon = Daemon {
            codex_home,
            driver,
            thread,
            next_id: 3,
            seen: mpsc::unbounded_channel().1,
        };
        // A thread can only be followed once its first turn made its rollout.
        daemon.start_turn("warm up the thread").await?;
        until_completed(&mut daemon.driver).await?;
        let (tx, seen) = mpsc::unbounded_channel();
        for follower in 0..FOLLOWERS {
            let mut ws = daemon_connect(&socket, &format!("bench-{follower}")).await?;
            request(
                &mut ws,
                2,
                "thread/resume",
                json!({"threadId": daemon.thread, "excludeTurns": true}),
            )
            .await?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(Ok(message)) = ws.next().await {
                    let at = Instant::now();
                    let Message::Text(text) = message else {
                        continue;
                    };
                    let Ok(value) = serde_json::from_str::<Value>(text.as_str()) else {
                        continue;
                    };
                    let seen = match value["method"].as_str() {
                        Some("item/agentMessage/delta") => Seen::Delta {
                            follower,
                            text: value["params"]["delta"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                            at,
                        },
                        Some("turn/completed") => Seen::End,
                        _ => continue,
                    };
                    if tx.send(seen).is_err() {
                        return;
                    }
                }
            });
        }
        daemon.seen = seen;
        // The driver only starts turns: like the host's IPC client, it follows nothing.
        let id = daemon.id();
        let thread = daemon.thread.clone();
        request(
            &mut daemon.driver,
            id,
            "thread/unsubscribe",
            json!({"threadId": thread}),
        )
        .await?;
        Ok(daemon)
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    async fn start_turn(&mut self, prompt: &str) -> anyhow::Result<()> {
        let id = self.id();
        let params = json!({"threadId": self.thread,
            "input": [{"type": "text", "text": prompt, "text_elements": []}]});
        if let Err(e) = request(&mut self.driver, id, "turn/start", params.clone()).await {
            // An unsubscribed connection may not start turns: subscribe the driver again
            // (it then reads the turn's notifications without being measured).
            println!("turn/start from the unsubscribed driver failed ({e:#}); resubscribing it");
            let (resume, retry) = (self.id(), self.id());
            let thread = json!({"threadId": self.thread, "excludeTurns": true});
            request(&mut self.driver, resume, "thread/resume", thread).await?;
            request(&mut self.driver, retry, "turn/start", params).await?;
        }
        Ok(())
    }

    async fn turn(&mut self, prompt: &str) -> anyhow::Result<Vec<(usize, String, Instant)>> {
        self.start_turn(prompt).await?;
        collect(&mut self.seen).await
    }

    /// The daemon and its updater, from their pid files.
    fn roots(&self) -> Vec<i32> {
        ["daemon.pid", "daemon-updater.pid"]
            .iter()
            .filter_map(|f| {
                let text =
                    std::fs::read_to_string(self.codex_home.join("app-server-daemon").join(f))
                        .ok()?;
                let value: Value = serde_json::from_str(&text).ok()?;
                i32::try_from(value["pid"].as_i64()?).ok()
            })
            .collect()
    }

    /// The daemon, its updater and their descendants.
    fn pids(&self) -> Vec<i32> {
        with_descendants(&self.roots())
    }

    fn kill(&self) {
        for pid in self.pids() {
            let _gone = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn with_descendants(roots: &[i32]) -> Vec<i32> {
    let mut parents: Vec<(i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parents.push((pid, ppid));
        }
    }
    let mut all = roots.to_vec();
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        all.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    all
}

fn rss_kib(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .sum()
}

/// Sample the summed RSS of `pids()` every 50 ms until stopped; (mean, max) in KiB.
fn sample_rss(
    pids: Vec<i32>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<(u64, u64)>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                _ = tick.tick() => samples.push(rss_kib(&pids)),
                _ = &mut stopped => break,
            }
        }
        let max = samples.iter().copied().max().unwrap_or(0);
        let mean = samples.iter().sum::<u64>() / samples.len().max(1) as u64;
        (mean, max)
    });
    (stop, task)
}

// ---------------------------------------------------------------------------------------------
// Figures

#[derive(Default)]
struct Leg {
    latencies: Vec<Duration>,
    /// The latencies of each turn's first two chunks, kept apart too: those follow the
    /// turn's first brackets (the host sends a delta only after the brackets before it are
    /// committed), so a slow fsync shows there first.
    first_chunks: Vec<Duration>,
    later_chunks: Vec<Duration>,
    spreads: Vec<Duration>,
    unmatched: usize,
    incomplete: usize,
    rss_mean: u64,
    rss_max: u64,
}

impl Leg {
    /// Match a turn's deltas to the mock's writes.
    fn add(&mut self, deltas: Vec<(usize, String, Instant)>, writes: &HashMap<String, Instant>) {
        let mut by_chunk: HashMap<&str, Vec<Instant>> = HashMap::new();
        for (_, text, at) in &deltas {
            match writes.get(text) {
                Some(written) => {
                    let latency = at.saturating_duration_since(*written);
                    self.latencies.push(latency);
                    // Chunk texts are `<tag>.<i> `.
                    let index = text
                        .trim_end()
                        .rsplit_once('.')
                        .and_then(|(_, i)| i.parse::<usize>().ok());
                    if index.is_some_and(|i| i < 2) {
                        self.first_chunks.push(latency);
                    } else {
                        self.later_chunks.push(latency);
                    }
                    by_chunk.entry(text).or_default().push(*at);
                }
                None => self.unmatched += 1,
            }
        }
        for ats in by_chunk.values() {
            if ats.len() != FOLLOWERS {
                self.incomplete += 1;
                continue;
            }
            let first = ats.iter().min().unwrap();
            let last = ats.iter().max().unwrap();
            self.spreads.push(last.duration_since(*first));
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn bench(bin: PathBuf, base_url: String, params: Params) -> anyhow::Result<()> {
    // Not under /tmp: Codex refuses to put its helper binaries in a temporary directory.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work)?;
    let mut host = Host::start(dir.path(), &bin, &base_url, &work).await?;
    let mut daemon = Daemon::start(dir.path(), &bin, &base_url, &work).await;
    let result = match &mut daemon {
        Ok(daemon) => run(&mut host, daemon, params).await,
        Err(e) => Err(anyhow::anyhow!("starting the daemon: {e:#}")),
    };
    if let Ok(daemon) = &daemon {
        daemon.kill();
    }
    let _stopped = host.child.start_kill();
    result
}

async fn run(host: &mut Host, daemon: &mut Daemon, params: Params) -> anyhow::Result<()> {
    let version = std::process::Command::new(
        agent_host::adapter::codex_native::native_of(&agents::ensure_codex(), &[])
            .map_or_else(agents::ensure_codex, |n| n.binary),
    )
    .arg("--version")
    .output()?;
    let Params {
        rounds,
        turns,
        chunks,
        delay_ms,
    } = params;
    println!(
        "{} against the mock model: {rounds} rounds x {turns} turns x {chunks} chunks \
         ({delay_ms} ms apart) x {FOLLOWERS} followers, host (A) and daemon (B) alternating; \
         the host's followers over {}, the daemon's over its Unix socket",
        String::from_utf8_lossy(&version.stdout).trim(),
        if unix_followers() {
            "its Unix socket (ws.sock)"
        } else {
            "TCP on 127.0.0.1 (AGENT_HOST_BENCH_TRANSPORT=tcp)"
        }
    );
    if let Ok(n) = std::env::var("AGENT_HOST_BENCH_WORKERS") {
        println!("the host's runtime runs {n} worker thread(s) (AGENT_HOST_BENCH_WORKERS)");
    }
    // Warm-up turn on each (not measured).
    host.turn(&format!("STREAM {chunks} {delay_ms} warmhost"))
        .await?;
    daemon
        .turn(&format!("STREAM {chunks} {delay_ms} warmdaemon"))
        .await?;
    mock_model::take_chunk_writes();
    // What the host runs for its session: the native binary, not the node launcher.
    let host_pid = host.pids();
    for pid in with_descendants(&host_pid).into_iter().skip(1) {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        println!(
            "host child {pid}: {} ({:.1} MiB, not counted)",
            exe.display(),
            rss_kib(&[pid]) as f64 / 1024.0
        );
    }
    for pid in daemon.pids() {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        println!(
            "daemon process {pid}: {} ({:.1} MiB)",
            exe.display(),
            rss_kib(&[pid]) as f64 / 1024.0
        );
    }
    let (mut hosts, mut daemons) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for side in ["host", "daemon"] {
            let pids = if side == "host" {
                host.pids()
            } else {
                daemon.pids()
            };
            let (stop, sampler) = sample_rss(pids);
            let mut leg = Leg::default();
            for t in 0..turns {
                let prompt = format!("STREAM {chunks} {delay_ms} {side}{round}x{t}");
                let deltas = if side == "host" {
                    host.turn(&prompt).await?
                } else {
                    daemon.turn(&prompt).await?
                };
                let writes: HashMap<String, Instant> =
                    mock_model::take_chunk_writes().into_iter().collect();
                leg.add(deltas, &writes);
            }
            let _stopped = stop.send(());
            (leg.rss_mean, leg.rss_max) = sampler.await?;
            if side == "host" {
                hosts.push(leg);
            } else {
                daemons.push(leg);
            }
        }
    }
    println!("per round (ms; RSS MiB mean/max):");
    let (mut r50, mut r99, mut rs99, mut rrss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (round, (h, d)) in hosts.iter().zip(&daemons).enumerate() {
        let (h50, h99, d50, d99) = (
            ms(common::pct(&h.latencies, 0.5)),
            ms(common::pct(&h.latencies, 0.99)),
            ms(common::pct(&d.latencies, 0.5)),
            ms(common::pct(&d.latencies, 0.99)),
        );
        let (hs99, ds99) = (
            ms(common::pct(&h.spreads, 0.99)),
            ms(common::pct(&d.spreads, 0.99)),
        );
        r50.push(h50 / d50);
        r99.push(h99 / d99);
        rs99.push(hs99 / ds99);
        rrss.push(h.rss_mean as f64 / d.rss_mean as f64);
        println!(
            "  round {round}: host p50 {h50:.2} p99 {h99:.2} spread p99 {hs99:.2} RSS {:.1}/{:.1} \
             | daemon p50 {d50:.2} p99 {d99:.2} spread p99 {ds99:.2} RSS {:.1}/{:.1} \
             | host/daemon p50 {:.2} p99 {:.2} spread p99 {:.2} RSS {:.3}",
            h.rss_mean as f64 / 1024.0,
            h.rss_max as f64 / 1024.0,
            d.rss_mean as f64 / 1024.0,
            d.rss_max as f64 / 1024.0,
            h50 / d50,
            h99 / d99,
            hs99 / ds99,
            h.rss_mean as f64 / d.rss_mean as f64,
        );
    }
    for (name, legs) in [("host", &hosts), ("daemon", &daemons)] {
        let lat: Vec<Duration> = legs.iter().flat_map(|l| l.latencies.clone()).collect();
        let spread: Vec<Duration> = legs.iter().flat_map(|l| l.spreads.clone()).collect();
        let first: Vec<Duration> = legs.iter().flat_map(|l| l.first_chunks.clone()).collect();
        let later: Vec<Duration> = legs.iter().flat_map(|l| l.later_chunks.clone()).collect();
        let unmatched: usize = legs.iter().map(|l| l.unmatched).sum();
        let incomplete: usize = legs.iter().map(|l| l.incomplete).sum();
        let expected = rounds * turns * chunks * FOLLOWERS;
        println!(
            "{name:>6} all rounds: {} of {expected} deltas; latency p50 {:.2} p90 {:.2} p99 {:.2} \
             max {:.2} ms; spread p50 {:.2} p99 {:.2} ms; RSS max {:.1} MiB; {unmatched} \
             unmatched, {incomplete} chunks not seen by all",
            lat.len(),
            ms(common::pct(&lat, 0.5)),
            ms(common::pct(&lat, 0.9)),
            ms(common::pct(&lat, 0.99)),
            ms(common::pct(&lat, 1.0)),
            ms(common::pct(&spread, 0.5)),
            ms(common::pct(&spread, 0.99)),
            legs.iter().map(|l| l.rss_max).max().unwrap_or(0) as f64 / 1024.0,
        );
        println!(
            "{name:>6} first 2 chunks of each turn: p50 {:.2} p99 {:.2} max {:.2} ms; the other \
             chunks: p50 {:.2} p99 {:.2} max {:.2} ms",
            ms(common::pct(&first, 0.5)),
            ms(common::pct(&first, 0.99)),
            ms(common::pct(&first, 1.0)),
            ms(common::pct(&later, 0.5)),
            ms(common::pct(&later, 0.99)),
            ms(common::pct(&later, 1.0)),
        );
    }
    let range = |v: &[f64]| {
        let mut v = v.to_vec();
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        format!("median {:.2} (min {min:.2}, max {max:.2})", median(&mut v))
    };
    println!("host/daemon per round: p50 {}", range(&r50));
    println!("host/daemon per round: p99 {}", range(&r99));
    println!("host/daemon per round: spread p99 {}", range(&rs99));
    println!("host/daemon per round: RSS mean {}", range(&rrss));
    Ok(())
}
