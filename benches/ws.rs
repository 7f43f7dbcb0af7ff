//! Loopback WebSocket delivery against a raw baseline measured in the same run (issue 3,
//! acceptance 6).
//!
//! 1. Raw: a bare tokio-tungstenite server broadcasting the same pre-encoded frame to 100
//!    loopback clients (one writer task per client fed by a broadcast channel).
//! 2. agent-host: a real host (`agent_host::run`, temp home) with 100 subscribers connected over
//!    the loopback WebSocket; the same number of brackets published through its bus (each one
//!    committed to SQLite first), delivered as `EventPush` frames.
//!    Clients are identical in both: they count binary messages.
//! 3. Latency: publish→receive at 1,000 events/s to 10 subscribers, p50/p99, for brackets.
//!
//! Run: `cargo bench --bench ws` (optional arg: events per client, default 10000).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_host::config::Config;
use agent_host::protocol::events::{BlockEnd, Event, EventBody};
use agent_host::protocol::wire::{self, CmdId, PROTOCOL_VERSION, pb};
use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};

const CLIENTS: usize = 100;

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

/// Count binary messages until `n` arrived.
async fn count(
    mut stream: impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
    n: usize,
) -> anyhow::Result<()> {
    let mut got = 0;
    while got < n {
        if let Message::Binary(_) = stream.next().await.context("closed early")?? {
            got += 1;
        }
    }
    Ok(())
}

async fn raw_broadcast(events: usize) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let frame = wire::event_push_frame(&pb::EventPush {
        sequence_id: 1,
        message_id: uuid::Uuid::new_v4().to_string(),
        session_id: "s".into(),
        run_id: "run-0001".into(),
        is_delta: false,
        event_json: serde_json::to_string(&event("s", "lorem ipsum ".repeat(20)))?,
    });
    let (tx, _) = tokio::sync::broadcast::channel::<bytes::Bytes>(events + 1);
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
        clients.push(ws);
    }
    for _ in 0..CLIENTS {
        ready_rx.recv().await.context("server gone")?;
    }
    let started = Instant::now();
    let counters: Vec<_> = clients
        .into_iter()
        .map(|ws| tokio::spawn(count(ws, events)))
        .collect();
    for _ in 0..events {
        tx.send(frame.clone())?;
    }
    for c in counters {
        c.await??;
    }
    Ok((events * CLIENTS) as f64 / started.elapsed().as_secs_f64())
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

/// Connect `n` subscribers to a session; returns their streams after `HelloResp`.
async fn subscribers(
    host: &Host,
    session: &str,
    n: usize,
) -> anyhow::Result<
    Vec<
        impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin + use<>,
    >,
> {
    let mut out = Vec::new();
    for _ in 0..n {
        let grant = ipc(
            host,
            "subscriber.add",
            json!({"type": "local", "session_id": session, "replay_mode": "none"}),
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
        let (mut sink, mut stream) = ws.split();
        let hello = pb::Hello {
            client_name: "bench".into(),
            cursor: None,
            protocol_version: PROTOCOL_VERSION,
        };
        sink.send(Message::Binary(wire::encode(CmdId::Hello, 1, &hello)))
            .await?;
        count(&mut stream, 1).await?; // HelloResp
        // Keep the write half alive for the connection's life.
        tokio::spawn(async move {
            let _sink = sink;
            std::future::pending::<()>().await;
        });
        out.push(stream);
    }
    Ok(out)
}

async fn host_delivery(host: &Host, events: usize) -> anyhow::Result<f64> {
    let dir = host.home.path().display().to_string();
    let session = ipc(
        host,
        "session.create",
        json!({"agent_type": "claude", "cwd": dir}),
    )
    .await?;
    let session = session["session_id"].as_str().context("id")?.to_owned();
    let streams = subscribers(host, &session, CLIENTS).await?;
    let e = event(&session, "lorem ipsum ".repeat(20));
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
    for c in counters {
        c.await??;
    }
    Ok((events * CLIENTS) as f64 / started.elapsed().as_secs_f64())
}

async fn latency(
    host: &Host,
    events: usize,
    subscribers_n: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let dir = host.home.path().display().to_string();
    let session = ipc(
        host,
        "session.create",
        json!({"agent_type": "claude", "cwd": dir}),
    )
    .await?;
    let session = session["session_id"].as_str().context("id")?.to_owned();
    let streams = subscribers(host, &session, subscribers_n).await?;
    let base = Instant::now();
    let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(
        events * subscribers_n,
    )));
    let mut readers = Vec::new();
    for mut s in streams {
        let samples = samples.clone();
        readers.push(tokio::spawn(async move {
            let mut got = 0;
            while got < events {
                let Some(Ok(Message::Binary(bytes))) = s.next().await else {
                    break;
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
        }));
    }
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..events {
        tick.tick().await;
        let sent = base.elapsed().as_nanos() as u64;
        host.bus.publish(&event(&session, sent.to_string())).await?;
    }
    for r in readers {
        r.await?;
    }
    let mut all = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1e6
    };
    Ok((pct(0.5), pct(0.99), all.len() as f64))
}

fn main() -> anyhow::Result<()> {
    let events: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        println!(
            "agent-host WebSocket benchmark: {events} events to each of {CLIENTS} clients, {} cores",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        let raw = raw_broadcast(events).await?;
        println!("raw tokio-tungstenite broadcast:  {raw:>12.0} deliveries/s");
        let host = start_host().await?;
        let ours = host_delivery(&host, events).await?;
        println!(
            "agent-host, 100 subscribers:      {ours:>12.0} deliveries/s  ratio {:.2}",
            ours / raw
        );
        let (p50, p99, n) = latency(&host, 5000, 10).await?;
        println!(
            "publish->receive at 1000 events/s, 10 subscribers ({n} samples): p50 {p50:.3} ms, p99 {p99:.3} ms"
        );
        let _ = host.stop.send(());
        host.task.await??;
        anyhow::Ok(())
    })?;
    Ok(())
}
