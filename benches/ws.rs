//! Loopback WebSocket delivery against raw baselines measured in the same run, alternating
//! raw and host (A B A B …) round after round (issue 3, acceptance 6; issue 19).
//!
//! 1. Brackets. Raw: a bare tokio-tungstenite server broadcasting the same pre-encoded frame
//!    to 100 loopback clients (one writer task per client fed by a broadcast channel).
//!    agent-host: a real host (`agent_host::run`, temp home) with 100 subscribers connected
//!    over the loopback WebSocket; the same number of brackets published through its bus (each
//!    committed to SQLite first), delivered as `EventPush` frames.
//! 2. Delta fan-out. Raw: the same raw server broadcasting one text block — its start bracket,
//!    N `text.delta` frames (each serialized and encoded as it is published, as the host does)
//!    and its end bracket — to 100 raw clients. agent-host: the same block published through
//!    the bus to 100 subscribers that asked for deltas. The rate counts delta frames delivered
//!    until every client has the end bracket; the drop rate is what the host did not send.
//! 3. Latency: brackets at 1,000 events/s to 10 subscribers, publish→receive p50/p99 over the
//!    real WebSocket, beside the fsync floor (a raw `synchronous=FULL` one-row commit's
//!    duration at the same pace, on the same disk), the two alternated in blocks of 500 events
//!    (six of each a round) so a load that drifts during the round weighs on both alike.
//!
//! Clients are identical in raw and host runs: they decode each binary message as a frame.
//! The ratio is taken per round; the summary gives its median, min and max.
//!
//! Run: `cargo bench --bench ws -- [events per client] [rounds]` (default 10000, 3).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_host::config::Config;
use agent_host::protocol::events::{BlockEnd, BlockStart, Event, EventBody, TextDelta};
use agent_host::protocol::wire::{self, CmdId, PROTOCOL_VERSION, pb};
use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};

const CLIENTS: usize = 100;
/// Latency: events per block, and blocks of the floor and of the host alternated per round.
const LATENCY_BLOCK: usize = 500;
const LATENCY_BLOCKS: usize = 6;

type WsRead = futures_util::stream::SplitStream<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
>;

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

fn block_start(session: &str) -> Event {
    Event::new(
        session,
        Some("run-0001".into()),
        EventBody::TextStart(BlockStart {
            item_id: Some("item".into()),
        }),
    )
}

fn delta(session: &str) -> Event {
    Event::new(
        session,
        Some("run-0001".into()),
        EventBody::TextDelta(TextDelta {
            item_id: Some("item".into()),
            text: "lorem ipsum ".into(),
        }),
    )
}

/// Count binary messages until `n` arrived; gives the stream back.
async fn count(mut stream: WsRead, n: usize) -> anyhow::Result<WsRead> {
    let mut got = 0;
    while got < n {
        if let Message::Binary(_) = stream.next().await.context("closed early")?? {
            got += 1;
        }
    }
    Ok(stream)
}

/// Read one block: count the delta pushes until the second bracket (the block's end).
async fn count_block(mut stream: WsRead) -> anyhow::Result<(WsRead, u64)> {
    let mut brackets = 0;
    let mut deltas = 0;
    while brackets < 2 {
        if let Message::Binary(bytes) = stream.next().await.context("closed early")?? {
            let frame = wire::decode(&bytes).map_err(|(_, e)| anyhow::anyhow!("{e}"))?;
            let push = frame.body::<pb::EventPush>()?;
            if push.is_delta {
                deltas += 1;
            } else {
                brackets += 1;
            }
        }
    }
    Ok((stream, deltas))
}

fn push_frame(e: &Event, is_delta: bool) -> anyhow::Result<bytes::Bytes> {
    Ok(wire::event_push_frame(&pb::EventPush {
        sequence_id: 1,
        message_id: uuid::Uuid::new_v4().to_string(),
        session_id: e.session_id.clone(),
        run_id: "run-0001".into(),
        is_delta,
        event_json: serde_json::to_string(e)?,
    }))
}

/// A raw tokio-tungstenite broadcast server with `CLIENTS` connected clients.
struct RawServer {
    tx: tokio::sync::broadcast::Sender<bytes::Bytes>,
    clients: Vec<WsRead>,
}

async fn raw_server(capacity: usize) -> anyhow::Result<RawServer> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, _) = tokio::sync::broadcast::channel::<bytes::Bytes>(capacity);
    let server_tx = tx.clone();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(CLIENTS);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let mut rx = server_tx.subscribe();
            let ready = ready_tx.clone();
            tokio::spawn(async move {
                let Ok(ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                let (mut sink, _read) = ws.split();
                let _ = ready.send(()).await;
                while let Ok(b) = rx.recv().await {
                    if sink.feed(Message::Binary(b)).await.is_err() {
                        return;
                    }
                    if rx.is_empty() && sink.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/")).await?;
        let (sink, stream) = ws.split();
        keep(sink);
        clients.push(stream);
    }
    for _ in 0..CLIENTS {
        ready_rx.recv().await.context("server gone")?;
    }
    Ok(RawServer { tx, clients })
}

/// Keep a connection's write half alive (and unused) for the connection's life.
fn keep<T: Send + 'static>(sink: T) {
    tokio::spawn(async move {
        let _sink = sink;
        std::future::pending::<()>().await;
    });
}

async fn raw_brackets(events: usize) -> anyhow::Result<f64> {
    let server = raw_server(events + 1).await?;
    let frame = push_frame(&event("s", "lorem ipsum ".repeat(20)), false)?;
    let started = Instant::now();
    let counters: Vec<_> = server
        .clients
        .into_iter()
        .map(|ws| tokio::spawn(count(ws, events)))
        .collect();
    for _ in 0..events {
        server.tx.send(frame.clone())?;
    }
    for c in counters {
        // Each counter hands its stream back; this one only counts.
        let _stream = c.await??;
    }
    Ok((events * CLIENTS) as f64 / started.elapsed().as_secs_f64())
}

/// The raw delta broadcast: (delta deliveries/s, deltas delivered).
async fn raw_deltas(deltas: usize) -> anyhow::Result<(f64, u64)> {
    // Room for the whole block: a raw broadcast that never lags.
    let server = raw_server(deltas + 2).await?;
    let started = Instant::now();
    let counters: Vec<_> = server
        .clients
        .into_iter()
        .map(|ws| tokio::spawn(count_block(ws)))
        .collect();
    server.tx.send(push_frame(&block_start("s"), false)?)?;
    let d = delta("s");
    for _ in 0..deltas {
        server.tx.send(push_frame(&d, true)?)?;
    }
    server
        .tx
        .send(push_frame(&event("s", "end".into()), false)?)?;
    let mut delivered = 0;
    for c in counters {
        delivered += c.await??.1;
    }
    Ok((
        delivered as f64 / started.elapsed().as_secs_f64(),
        delivered,
    ))
}

struct Host {
    home: tempfile::TempDir,
    bus: agent_host::bus::Bus,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start_host() -> anyhow::Result<Host> {
    let home = tempfile::tempdir()?;
    let config = Config::with_home(home.path())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        agent_host::run(
            config,
            async {
                let _ = stopped.await;
            },
            ready_tx,
        )
        .await?;
        anyhow::Ok(())
    });
    let ready = ready_rx.await?;
    Ok(Host {
        home,
        bus: ready.bus,
        stop,
        task,
    })
}

async fn ipc(
    host: &Host,
    command: &str,
    params: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let reply = agent_host::ipc::request(
        &host.home.path().join("host.sock"),
        &json!({"command": command, "params": params}),
        Duration::from_secs(10),
    )
    .await?;
    anyhow::ensure!(reply.is_ok(), "{command}: {}", reply.to_line());
    Ok(reply.data)
}

async fn session(host: &Host) -> anyhow::Result<String> {
    let dir = host.home.path().display().to_string();
    let session = ipc(
        host,
        "session.create",
        json!({"agent_type": "claude", "cwd": dir}),
    )
    .await?;
    Ok(session["session_id"].as_str().context("id")?.to_owned())
}

/// Connect `n` subscribers to a session; returns their streams after `HelloResp`.
async fn subscribers(
    host: &Host,
    session: &str,
    n: usize,
    forward_deltas: bool,
) -> anyhow::Result<Vec<WsRead>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let grant = ipc(
            host,
            "subscriber.add",
            json!({"type": "local", "session_id": session, "replay_mode": "none",
                   "forward_deltas": forward_deltas}),
        )
        .await?;
        let mut request = grant["ws_endpoint"]
            .as_str()
            .context("endpoint")?
            .into_client_request()?;
        request.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!(
                "Bearer {}",
                grant["ws_token"].as_str().context("token")?
            ))?,
        );
        let (ws, _) = tokio_tungstenite::connect_async(request).await?;
        let (mut sink, stream) = ws.split();
        let hello = pb::Hello {
            client_name: "bench".into(),
            cursor: None,
            protocol_version: PROTOCOL_VERSION,
        };
        sink.send(Message::Binary(wire::encode(CmdId::Hello, 1, &hello)))
            .await?;
        let stream = count(stream, 1).await?; // HelloResp
        keep(sink);
        out.push(stream);
    }
    Ok(out)
}

async fn host_brackets(
    host: &Host,
    session: &str,
    streams: Vec<WsRead>,
    events: usize,
) -> anyhow::Result<(f64, Vec<WsRead>)> {
    let e = event(session, "lorem ipsum ".repeat(20));
    let started = Instant::now();
    let counters: Vec<_> = streams
        .into_iter()
        .map(|s| tokio::spawn(count(s, events)))
        .collect();
    let mut receipts = Vec::with_capacity(events);
    for _ in 0..events {
        receipts.push(host.bus.publish(&e).await?);
    }
    for r in receipts {
        r.committed().await?;
    }
    let mut back = Vec::with_capacity(counters.len());
    for c in counters {
        back.push(c.await??);
    }
    Ok((
        (events * CLIENTS) as f64 / started.elapsed().as_secs_f64(),
        back,
    ))
}

/// The host's delta fan-out: (delta deliveries/s, deltas delivered, streams back).
async fn host_deltas(
    host: &Host,
    session: &str,
    streams: Vec<WsRead>,
    deltas: usize,
) -> anyhow::Result<(f64, u64, Vec<WsRead>)> {
    let started = Instant::now();
    let counters: Vec<_> = streams
        .into_iter()
        .map(|s| tokio::spawn(count_block(s)))
        .collect();
    host.bus.publish(&block_start(session)).await?;
    let d = delta(session);
    for _ in 0..deltas {
        host.bus.publish(&d).await?;
    }
    let end = Event::new(
        session,
        Some("run-0001".into()),
        EventBody::TextEnd(BlockEnd {
            truncated: None,
            imported: false,
            item_id: Some("item".into()),
            text: "lorem ipsum ".repeat(deltas),
        }),
    );
    host.bus.publish(&end).await?.committed().await?;
    let mut delivered = 0;
    let mut back = Vec::with_capacity(counters.len());
    for c in counters {
        let (s, got) = c.await??;
        delivered += got;
        back.push(s);
    }
    Ok((
        delivered as f64 / started.elapsed().as_secs_f64(),
        delivered,
        back,
    ))
}

/// The p-th quantile of sorted nanosecond samples, in milliseconds.
fn quantile_ms(sorted: &[u64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0) as f64
        / 1e6
}

/// A raw database for the fsync floor.
fn floor_db(path: &std::path::Path) -> anyhow::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.execute_batch(include_str!("../schema.sql"))?;
    Ok(conn)
}

/// The fsync floor: a raw one-row `synchronous=FULL` WAL commit every millisecond; the
/// commits' durations in ns. Runs on a blocking thread, like the store's writer.
fn fsync_floor(
    mut conn: rusqlite::Connection,
    events: usize,
) -> anyhow::Result<(Vec<u64>, rusqlite::Connection)> {
    let payload = serde_json::to_string(&event("raw", "lorem ipsum".into()))?;
    let mut samples = Vec::with_capacity(events);
    let mut next = Instant::now();
    for _ in 0..events {
        next += Duration::from_millis(1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let began = Instant::now();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO messages (message_id, session_id, run_id, kind, payload, created_at) \
             VALUES (?1, 'raw', 'run-0001', 'text.end', ?2, 0)",
            rusqlite::params![uuid::Uuid::new_v4().to_string(), payload],
        )?;
        tx.commit()?;
        samples.push(began.elapsed().as_nanos() as u64);
    }
    Ok((samples, conn))
}

async fn latency(
    host: &Host,
    session: &str,
    streams: Vec<WsRead>,
    events: usize,
) -> anyhow::Result<(Vec<u64>, Vec<WsRead>)> {
    let base = Instant::now();
    let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(
        events * streams.len(),
    )));
    let mut readers = Vec::new();
    for mut s in streams {
        let samples = samples.clone();
        readers.push(tokio::spawn(async move {
            let mut got = 0;
            while got < events {
                let bytes = match s.next().await {
                    Some(Ok(Message::Binary(bytes))) => bytes,
                    // Keepalive pings between rounds.
                    Some(Ok(_)) => continue,
                    None | Some(Err(_)) => break,
                };
                let Ok(frame) = wire::decode(&bytes) else {
                    continue;
                };
                let Ok(push) = frame.body::<pb::EventPush>() else {
                    continue;
                };
                let now = base.elapsed().as_nanos() as u64;
                let v: serde_json::Value =
                    serde_json::from_str(&push.event_json).unwrap_or_default();
                let sent: u64 = v["text"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(now);
                samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(now.saturating_sub(sent));
                got += 1;
            }
            s
        }));
    }
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..events {
        tick.tick().await;
        let sent = base.elapsed().as_nanos() as u64;
        host.bus.publish(&event(session, sent.to_string())).await?;
    }
    let mut back = Vec::new();
    for r in readers {
        back.push(r.await?);
    }
    let all = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok((all, back))
}

/// (median, min, max) of a list of figures.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_unstable_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
    let min = values.first().copied().unwrap_or(0.0);
    let max = values.last().copied().unwrap_or(0.0);
    (median, min, max)
}

fn main() -> anyhow::Result<()> {
    let mut numbers = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<usize>().ok());
    let events = numbers.next().unwrap_or(10_000);
    let rounds = numbers.next().unwrap_or(3).max(1);
    let deltas = 10 * events;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        println!(
            "agent-host WebSocket benchmark: {events} brackets and {deltas} deltas to each of \
             {CLIENTS} clients, {rounds} rounds of raw then host, {} cores, shared machine",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        let host = start_host().await?;
        let bracket_session = session(&host).await?;
        let mut bracket_streams = subscribers(&host, &bracket_session, CLIENTS, false).await?;
        let delta_session = session(&host).await?;
        let mut delta_streams = subscribers(&host, &delta_session, CLIENTS, true).await?;
        let latency_session = session(&host).await?;
        let mut latency_streams = subscribers(&host, &latency_session, 10, false).await?;

        let mut bracket_ratios = Vec::new();
        let mut delta_ratios = Vec::new();
        let mut drop_rates = Vec::new();
        let mut over_floor = Vec::new();
        for round in 0..rounds {
            let raw = raw_brackets(events).await?;
            let (ours, back) =
                host_brackets(&host, &bracket_session, bracket_streams, events).await?;
            bracket_streams = back;
            println!(
                "round {round} brackets: raw {raw:>10.0} deliveries/s | host {ours:>10.0} \
                 deliveries/s | ratio {:.2}",
                ours / raw
            );
            bracket_ratios.push(ours / raw);

            let (raw, raw_got) = raw_deltas(deltas).await?;
            let (ours, got, back) =
                host_deltas(&host, &delta_session, delta_streams, deltas).await?;
            delta_streams = back;
            let dropped = 1.0 - got as f64 / (deltas * CLIENTS) as f64;
            println!(
                "round {round} deltas:   raw {raw:>10.0} deliveries/s ({raw_got} delivered) | \
                 host {ours:>10.0} deliveries/s ({got} delivered, {:.1}% dropped) | ratio {:.2}",
                100.0 * dropped,
                ours / raw
            );
            delta_ratios.push(ours / raw);
            drop_rates.push(100.0 * dropped);

            // The floor and the host alternate in blocks of 500 events (A B A B …), so a
            // disk or a machine whose load drifts during the round weighs on both alike.
            let mut conn = floor_db(&host.home.path().join(format!("floor-{round}.db")))?;
            let (mut floor, mut ours) = (Vec::new(), Vec::new());
            for _block in 0..LATENCY_BLOCKS {
                let (samples, back) =
                    tokio::task::spawn_blocking(move || fsync_floor(conn, LATENCY_BLOCK)).await??;
                conn = back;
                floor.extend(samples);
                let (samples, back) =
                    latency(&host, &latency_session, latency_streams, LATENCY_BLOCK).await?;
                latency_streams = back;
                ours.extend(samples);
            }
            floor.sort_unstable();
            ours.sort_unstable();
            let [f50, f99] = [quantile_ms(&floor, 0.5), quantile_ms(&floor, 0.99)];
            let [l50, l99] = [quantile_ms(&ours, 0.5), quantile_ms(&ours, 0.99)];
            println!(
                "round {round} latency:  fsync floor (raw one-row commit at 1000/s) p50 {f50:.3} \
                 p99 {f99:.3} ms | host publish->receive, 10 subscribers at 1000/s: p50 \
                 {l50:.3} p99 {l99:.3} ms (p99 - floor p99 = {:+.3} ms)",
                l99 - f99
            );
            over_floor.push(l99 - f99);
        }
        for (label, values) in [
            ("brackets, host/raw ratio", bracket_ratios),
            ("deltas, host/raw ratio", delta_ratios),
            ("deltas dropped by the host, %", drop_rates),
            ("latency p99 minus fsync floor p99, ms", over_floor),
        ] {
            let (median, min, max) = spread(values);
            println!("{label:<40} median {median:.3}  min {min:.3}  max {max:.3}");
        }
        drop((bracket_streams, delta_streams, latency_streams));
        let _ = host.stop.send(());
        host.task.await??;
        anyhow::Ok(())
    })?;
    Ok(())
}
