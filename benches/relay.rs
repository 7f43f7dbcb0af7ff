//! The relay path against the loopback path, measured in the same run (issue 7).
//!
//! A real host (`agent_host::run`, temp home) publishes brackets through its bus (each one
//! committed to SQLite first) to two readers at once:
//! - **loopback** — a subscriber on the host's own WebSocket (the baseline);
//! - **relay** — a bot connected to the reference relay (`examples/relay.rs`, its own process)
//!   that the host dialed out to: host → relay → bot, two WebSocket hops.
//!
//! Printed: throughput for a burst (events/s each reader receives, and the ratio relay /
//! loopback), and publish→receive latency at 1,000 events/s (p50, p99) for both.
//!
//! Run: `cargo build --release --example relay && cargo bench --bench relay` (optional arg:
//! events, default 20000).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agent_host::config::Config;
use agent_host::protocol::events::{BlockEnd, Event, EventBody};
use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::ws::client::{self, WsClient};
use anyhow::Context;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const HOST_TOKEN: &str = "bench-host-token";
const BOT_TOKEN: &str = "bench-bot-token";

fn event(session: &str, text: String) -> Event {
    Event::new(
        session,
        Some("run-0001".into()),
        EventBody::TextEnd(BlockEnd {
            truncated: None,
            imported: false,
            item_id: Some("item".into()),
            text,
        }),
    )
}

fn relay_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let target = exe
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .context("no target dir")?
        .to_owned();
    ["release", "debug"]
        .iter()
        .map(|profile| target.join(profile).join("examples/relay"))
        .find(|p| p.exists())
        .context("build the relay first: cargo build --release --example relay")
}

/// Receive `n` event pushes; the publish time each carries (ns since `base`) → latency samples.
async fn receive(
    mut ws: WsClient,
    n: usize,
    base: Instant,
) -> anyhow::Result<(WsClient, Vec<u64>)> {
    let mut samples = Vec::with_capacity(n);
    while samples.len() < n {
        let frame = ws.next_frame().await?.context("closed")?;
        let Some(push) = client::event_of(&frame) else {
            continue;
        };
        let now = base.elapsed().as_nanos() as u64;
        let v: serde_json::Value = serde_json::from_str(&push.event_json)?;
        let sent: u64 = v["text"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or(now);
        samples.push(now.saturating_sub(sent));
    }
    Ok((ws, samples))
}

fn pct(samples: &mut [u64], p: f64) -> f64 {
    samples.sort_unstable();
    samples
        .get(((samples.len() as f64 - 1.0) * p) as usize)
        .copied()
        .unwrap_or(0) as f64
        / 1e6
}

fn main() -> anyhow::Result<()> {
    let events: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(events))
}

async fn run(events: usize) -> anyhow::Result<()> {
    let mut relay = tokio::process::Command::new(relay_binary()?)
        .args(["--listen", "127.0.0.1:0", "--host-token", HOST_TOKEN])
        .args(["--bot-token", BOT_TOKEN])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let line = BufReader::new(relay.stdout.take().context("stdout")?)
        .lines()
        .next_line()
        .await?
        .context("relay said nothing")?;
    let url = line
        .strip_prefix("relay listening on ")
        .context("relay line")?
        .to_owned();

    let home = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        format!("log_level = \"warn\"\n[relay]\nurl = \"{url}/host\"\ntoken = \"{HOST_TOKEN}\"\n"),
    )?;
    let config = Config::with_home(home.path())?;
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let host = tokio::spawn(agent_host::run(
        config,
        async {
            let _ = stopped.await;
        },
        ready_tx,
    ));
    let ready = ready_rx.await?;
    let ipc = |command: &'static str, params: serde_json::Value| {
        let path = home.path().join("host.sock");
        async move {
            let reply = agent_host::ipc::request(
                &path,
                &json!({"command": command, "params": params}),
                Duration::from_secs(10),
            )
            .await?;
            anyhow::ensure!(reply.is_ok(), "{command}: {}", reply.to_line());
            anyhow::Ok(reply.data)
        }
    };
    let dir = home.path().display().to_string();
    let session = ipc(
        "session.create",
        json!({"agent_type": "claude", "cwd": dir}),
    )
    .await?["session_id"]
        .as_str()
        .context("id")?
        .to_owned();
    let grant = ipc(
        "subscriber.add",
        json!({"type": "local", "session_id": session, "replay_mode": "none"}),
    )
    .await?;
    let hello = || pb::Hello {
        client_name: "bench".into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    let (local, _) = client::connect(
        grant["ws_endpoint"].as_str().context("endpoint")?,
        grant["ws_token"].as_str().context("token")?,
        hello(),
    )
    .await?;
    let (mut bot, _) = client::connect(&format!("{url}/bot"), BOT_TOKEN, hello()).await?;
    // The host has dialed in once this is answered.
    let listed = bot.request("session.list", json!({})).await?;
    anyhow::ensure!(listed.is_ok(), "session.list: {}", listed.to_line());
    println!(
        "agent-host relay benchmark: {events} brackets, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    // Burst throughput.
    let base = Instant::now();
    let started = Instant::now();
    let l = tokio::spawn(receive(local, events, base));
    let r = tokio::spawn(receive(bot, events, base));
    let text = "lorem ipsum ".repeat(20);
    for _ in 0..events {
        ready.bus.publish(&event(&session, text.clone())).await?;
    }
    let (local, _) = l.await??;
    let local_rate = events as f64 / started.elapsed().as_secs_f64();
    let (bot, _) = r.await??;
    let relay_rate = events as f64 / started.elapsed().as_secs_f64();
    println!("loopback subscriber: {local_rate:>10.0} events/s");
    println!(
        "through the relay:   {relay_rate:>10.0} events/s  ratio {:.2}",
        relay_rate / local_rate
    );

    // Latency at 1,000 events/s.
    let paced = 3000;
    let l = tokio::spawn(receive(local, paced, base));
    let r = tokio::spawn(receive(bot, paced, base));
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    for _ in 0..paced {
        tick.tick().await;
        let sent = base.elapsed().as_nanos() as u64;
        ready
            .bus
            .publish(&event(&session, sent.to_string()))
            .await?;
    }
    let (_, mut ls) = l.await??;
    let (_, mut rs) = r.await??;
    println!(
        "publish->receive at 1000/s: loopback p50 {:.3} ms p99 {:.3} ms; relay p50 {:.3} ms p99 {:.3} ms",
        pct(&mut ls, 0.5),
        pct(&mut ls, 0.99),
        pct(&mut rs, 0.5),
        pct(&mut rs, 0.99)
    );
    let _ = stop.send(());
    host.await??;
    relay.kill().await?;
    Ok(())
}
