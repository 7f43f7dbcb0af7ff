//! The sealed relay fleet against the loopback path, measured in one run (issue 21,
//! acceptance 6).
//!
//! A real host (`agent_host::run`, temp home, `[fleet]` pointing at instance A) publishes
//! `text.end` brackets through its bus (each committed to SQLite first) to one reader at a
//! time, over three paths:
//! - **loopback** — a subscriber on the host's own WebSocket (the baseline);
//! - **one instance** — a paired bot (`agent_host::relay::bot::BotClient`) on instance A, where
//!   the host is: host → A → NATS JetStream → A → bot, every event sealed by the host and
//!   opened by the bot (Noise);
//! - **two instances** — a bot on instance B: host → A → NATS → B → bot.
//!
//! The relays are the real `agent-host-relay` binary on one `nats-server -js` (Debian's,
//! installed when missing). Each path gets a burst (events/s as the reader receives them) and
//! then brackets at 1,000/s, each carrying its publish time (publish→receive p50 and p99). The
//! paths take turns, round after round, and the figures are the min / median / max over the
//! rounds, with the ratio of the medians against loopback.
//!
//! Run: `cargo bench --bench relay_fleet` (optional args: burst events, default 5000; rounds,
//! default 3).

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark reports on stdout and panics on a broken setup"
)]

// The tests' nats-server helper (it installs the Debian package through `apt`, its sibling).
#[path = "../tests/common/apt.rs"]
mod apt;
#[path = "../tests/common/nats.rs"]
#[allow(dead_code, reason = "the benchmark uses part of the test helpers")]
mod nats;

use std::path::Path;
use std::time::{Duration, Instant};

use agent_host::config::Config;
use agent_host::protocol::events::{BlockEnd, Event, EventBody};
use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::relay::bot::{self, BotClient, BotOptions, BotState};
use agent_host::relay::fleet::FleetState;
use agent_host::seal::PairingCode;
use agent_host::ws::client::{self, WsClient};
use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

const HOST_TOKEN: &str = "bench-fleet-host-token";
const BOT_TOKEN: &str = "bench-fleet-bot-token";
/// Brackets at 1,000/s for the latency figures, per path and round.
const PACED: usize = 2000;
const WAIT: Duration = Duration::from_secs(60);

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

/// One `agent-host-relay` process and its `ws://` URL.
async fn relay(nats: &nats::NatsServer, instance: &str) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-host-relay"))
        .args(["--listen", "127.0.0.1:0", "--nats", &nats.url])
        .args(["--host-token", HOST_TOKEN, "--bot-token", BOT_TOKEN])
        .args(["--instance", instance])
        .env("AGENT_HOST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let line = tokio::io::BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next_line()
        .await
        .unwrap()
        .expect("the relay says where it listens");
    let url = line
        .strip_prefix("relay listening on ")
        .expect("the relay's first line")
        .to_owned();
    (child, url)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path3 {
    Loopback,
    OneInstance,
    TwoInstances,
}

impl Path3 {
    const ALL: [Path3; 3] = [Path3::Loopback, Path3::OneInstance, Path3::TwoInstances];

    fn name(self) -> &'static str {
        match self {
            Path3::Loopback => "loopback WebSocket",
            Path3::OneInstance => "one relay instance",
            Path3::TwoInstances => "two instances, NATS",
        }
    }
}

/// What reads the events: a loopback subscriber or a bot.
enum Reader {
    Ws(Box<WsClient>),
    Bot(BotClient),
}

impl Reader {
    /// The next bracket's text.
    async fn next_text(&mut self) -> anyhow::Result<String> {
        loop {
            match self {
                Reader::Ws(ws) => {
                    let frame = ws.next_frame().await?.context("the host closed")?;
                    if let Some(push) = client::event_of(&frame)
                        && !push.is_delta
                    {
                        let v: Value = serde_json::from_str(&push.event_json)?;
                        return Ok(v["text"].as_str().unwrap_or_default().to_owned());
                    }
                }
                Reader::Bot(bot) => {
                    let event = bot.next_event().await?;
                    if !event.is_delta {
                        return Ok(event.event["text"].as_str().unwrap_or_default().to_owned());
                    }
                }
            }
        }
    }

    async fn close(self) -> Option<u32> {
        match self {
            Reader::Ws(ws) => {
                ws.close().await;
                None
            }
            Reader::Bot(bot) => {
                let handshakes = bot.status().handshakes;
                bot.close().await;
                Some(handshakes)
            }
        }
    }
}

/// One path's figures in one round.
#[derive(Debug, Clone, Copy)]
struct Figures {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn pct(samples: &mut [u64], p: f64) -> f64 {
    samples.sort_unstable();
    samples
        .get(((samples.len() as f64 - 1.0) * p) as usize)
        .copied()
        .unwrap_or(0) as f64
        / 1e6
}

struct Bench {
    home: tempfile::TempDir,
    bus: agent_host::bus::Bus,
    session: String,
    bot_a: BotState,
    bot_b: BotState,
    /// The last bracket published: a new reader starts after it.
    last_seq: i64,
    base: Instant,
}

async fn ipc(home: &Path, command: &str, params: Value) -> anyhow::Result<Value> {
    let reply = agent_host::ipc::request(
        &home.join("host.sock"),
        &json!({"command": command, "params": params}),
        Duration::from_secs(10),
    )
    .await?;
    anyhow::ensure!(reply.is_ok(), "{command}: {}", reply.to_line());
    Ok(reply.data)
}

impl Bench {
    async fn reader(&self, path: Path3) -> anyhow::Result<Reader> {
        let options = BotOptions {
            cursor: Some(self.last_seq),
            event_queue: 16_384,
            ..BotOptions::default()
        };
        Ok(match path {
            Path3::Loopback => {
                let grant = ipc(
                    self.home.path(),
                    "subscriber.add",
                    json!({"type": "local", "session_id": self.session,
                               "replay_mode": "none"}),
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
                Reader::Ws(Box::new(ws))
            }
            Path3::OneInstance => Reader::Bot(BotClient::connect_with(&self.bot_a, options).await?),
            Path3::TwoInstances => {
                Reader::Bot(BotClient::connect_with(&self.bot_b, options).await?)
            }
        })
    }

    /// Publish `text` and wait for its commit; remembers its sequence id.
    async fn publish_committed(&mut self, text: String) -> anyhow::Result<()> {
        let receipt = self.bus.publish(&event(&self.session, text)).await?;
        if let Some(seq) = receipt.committed().await? {
            self.last_seq = seq;
        }
        Ok(())
    }

    async fn measure(
        &mut self,
        path: Path3,
        burst: usize,
    ) -> anyhow::Result<(Figures, Option<u32>)> {
        let mut reader = self.reader(path).await?;
        // Warm up, and prove the reader is live: a first bracket through.
        self.publish_committed("warm".to_owned()).await?;
        tokio::time::timeout(WAIT, reader.next_text())
            .await
            .context("the warm-up bracket")??;

        // Burst: publish as fast as the bus takes them; the rate is what the reader receives.
        let receive = tokio::spawn(async move {
            for _ in 0..burst {
                reader.next_text().await?;
            }
            anyhow::Ok(reader)
        });
        let started = Instant::now();
        let text = "lorem ipsum ".repeat(20);
        let mut last = None;
        for _ in 0..burst {
            last = Some(
                self.bus
                    .publish(&event(&self.session, text.clone()))
                    .await?,
            );
        }
        if let Some(seq) = last.context("no burst")?.committed().await? {
            self.last_seq = seq;
        }
        let mut reader = tokio::time::timeout(WAIT, receive)
            .await
            .context("the burst in time")???;
        let rate = burst as f64 / started.elapsed().as_secs_f64();

        // Paced: 1,000/s, each bracket carrying its publish time.
        let base = self.base;
        let receive = tokio::spawn(async move {
            let mut samples = Vec::with_capacity(PACED);
            while samples.len() < PACED {
                let text = reader.next_text().await?;
                let now = base.elapsed().as_nanos() as u64;
                let sent: u64 = text.parse().unwrap_or(now);
                samples.push(now.saturating_sub(sent));
            }
            anyhow::Ok((reader, samples))
        });
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut last = None;
        for _ in 0..PACED {
            tick.tick().await;
            let sent = self.base.elapsed().as_nanos() as u64;
            last = Some(
                self.bus
                    .publish(&event(&self.session, sent.to_string()))
                    .await?,
            );
        }
        if let Some(seq) = last.context("no paced events")?.committed().await? {
            self.last_seq = seq;
        }
        let (reader, mut samples) = tokio::time::timeout(WAIT, receive)
            .await
            .context("the paced events in time")???;
        let handshakes = reader.close().await;
        Ok((
            Figures {
                rate,
                p50_ms: pct(&mut samples, 0.5),
                p99_ms: pct(&mut samples, 0.99),
            },
            handshakes,
        ))
    }
}

fn main() -> anyhow::Result<()> {
    let mut numbers = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<usize>().ok());
    let burst = numbers.next().unwrap_or(5000);
    let rounds = numbers.next().unwrap_or(3).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(burst, rounds))
}

async fn pair(
    home: &Path,
    code: &PairingCode,
    name: &str,
    url: String,
) -> anyhow::Result<BotState> {
    let key = home.join(format!("{name}.key"));
    let mut state = bot::pair(code, &key, name, BOT_TOKEN, &BotOptions::default()).await?;
    state.bot_urls = vec![url];
    Ok(state)
}

async fn run(burst: usize, rounds: usize) -> anyhow::Result<()> {
    let nats = nats::ensure_nats_server();
    let (_a, a) = relay(&nats, "a").await;
    let (_b, b) = relay(&nats, "b").await;
    let home = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        format!("log_level = \"warn\"\n[fleet]\nurls = [\"{a}/host\"]\ntoken = \"{HOST_TOKEN}\"\n"),
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
    let mut fleet = ready.fleet.watch_status();
    tokio::time::timeout(WAIT, fleet.wait_for(|s| s.state == FleetState::Connected))
        .await
        .context("the host reaches the fleet")??;

    let dir = home.path().display().to_string();
    let session = ipc(
        home.path(),
        "session.create",
        json!({"agent_type": "claude", "cwd": dir}),
    )
    .await?["session_id"]
        .as_str()
        .context("session id")?
        .to_owned();
    let mut bots = Vec::new();
    for (name, url) in [("bot-a", format!("{a}/bot")), ("bot-b", format!("{b}/bot"))] {
        let data = ipc(home.path(), "pair.create", json!({})).await?;
        let code = PairingCode::decode(data["code"].as_str().context("code")?)?;
        bots.push(pair(home.path(), &code, name, url).await?);
    }
    let bot_b = bots.pop().context("bot b")?;
    let bot_a = bots.pop().context("bot a")?;
    let mut bench = Bench {
        home,
        bus: ready.bus.clone(),
        session,
        bot_a,
        bot_b,
        last_seq: 0,
        base: Instant::now(),
    };

    println!(
        "agent-host relay fleet benchmark: bursts of {burst} brackets, {PACED} at 1000/s, {rounds} rounds, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut figures: Vec<Vec<Figures>> = vec![Vec::new(); 3];
    for round in 1..=rounds {
        for (i, path) in Path3::ALL.into_iter().enumerate() {
            let (f, handshakes) = bench.measure(path, burst).await?;
            println!(
                "round {round}: {:<20} {:>8.0} events/s  p50 {:.3} ms  p99 {:.3} ms{}",
                path.name(),
                f.rate,
                f.p50_ms,
                f.p99_ms,
                handshakes.map_or(String::new(), |h| format!("  (handshakes {h})"))
            );
            figures[i].push(f);
        }
    }
    let stats = |values: Vec<f64>| {
        let mut v = values;
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2], v[v.len() - 1])
    };
    let medians: Vec<(f64, f64, f64)> = figures
        .iter()
        .map(|f| {
            (
                stats(f.iter().map(|x| x.rate).collect()).1,
                stats(f.iter().map(|x| x.p50_ms).collect()).1,
                stats(f.iter().map(|x| x.p99_ms).collect()).1,
            )
        })
        .collect();
    println!("\nmin / median / max over {rounds} rounds (ratio of medians against loopback):");
    for (i, path) in Path3::ALL.into_iter().enumerate() {
        let (r0, r1, r2) = stats(figures[i].iter().map(|x| x.rate).collect());
        let (p0, p1, p2) = stats(figures[i].iter().map(|x| x.p50_ms).collect());
        let (q0, q1, q2) = stats(figures[i].iter().map(|x| x.p99_ms).collect());
        println!(
            "{:<20} events/s {r0:.0} / {r1:.0} / {r2:.0} ({:.2})  p50 ms {p0:.3} / {p1:.3} / {p2:.3} ({:.2})  p99 ms {q0:.3} / {q1:.3} / {q2:.3} ({:.2})",
            path.name(),
            r1 / medians[0].0,
            p1 / medians[0].1,
            q1 / medians[0].2,
        );
    }
    let _ = stop.send(());
    host.await??;
    Ok(())
}
