//! Bus throughput against baselines measured in the same run (issue 2, acceptance 6).
//!
//! 1. Raw rusqlite: rows of the same size inserted into the same schema, in transactions of
//!    `GROUP` rows (a hand-written group commit with nothing else in the way).
//! 2. The bus: `Bus::publish` of brackets of that size from one and from three publishers,
//!    until the last commit receipt; ratio against (1).
//! 3. Delta fan-out: deltas published to 1, 10 and 100 live in-process subscribers; deliveries
//!    per second and how many a subscriber had to drop.
//!
//! Run: `cargo bench --bench bus` (optional arg: number of brackets, default 200000).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::time::Instant;

use agent_host::bus::{Bus, Replay, SubscribeOptions};
use agent_host::protocol::events::{BlockEnd, Event, EventBody, TextDelta};
use agent_host::store::{SessionFilter, Store};
use rusqlite::{Connection, params};

const GROUP: usize = 1000;

fn bracket(session: &str, n: usize) -> Event {
    Event::new(
        session,
        Some("run-0001".to_owned()),
        EventBody::TextEnd(BlockEnd {
            truncated: None,
            imported: false,
            item_id: Some(format!("item-{n}")),
            text: "lorem ipsum dolor sit amet ".repeat(8),
        }),
    )
}

fn raw_sqlite(dir: &std::path::Path, rows: usize) -> anyhow::Result<f64> {
    let conn = Connection::open(dir.join("raw.db"))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(include_str!("../schema.sql"))?;
    let payloads: Vec<String> = (0..rows)
        .map(|n| serde_json::to_string(&bracket("raw-session", n)))
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    let mut conn = conn;
    for chunk in payloads.chunks(GROUP) {
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO messages (message_id, session_id, run_id, kind, payload, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for payload in chunk {
                let message_id = uuid::Uuid::new_v4().to_string();
                stmt.execute(params![
                    message_id,
                    "raw-session",
                    "run-0001",
                    "text.end",
                    payload,
                    0
                ])?;
            }
        }
        tx.commit()?;
    }
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

async fn bus_ingest(
    dir: &std::path::Path,
    name: &str,
    rows: usize,
    publishers: usize,
) -> anyhow::Result<f64> {
    let (store, threads) = Store::open(&dir.join(format!("{name}.db")))?;
    let (bus, tasks) = Bus::start(store.clone()).await?;
    // Events are built before the clock starts, as the raw baseline's payloads are.
    let per = rows / publishers;
    let scripts: Vec<Vec<Event>> = (0..publishers)
        .map(|p| {
            (0..per)
                .map(|n| bracket(&format!("session-{p}"), n))
                .collect()
        })
        .collect();
    let started = Instant::now();
    let mut handles = Vec::new();
    for events in scripts {
        let bus = bus.clone();
        handles.push(tokio::spawn(async move {
            let mut receipts = Vec::with_capacity(events.len());
            for e in &events {
                receipts.push(bus.publish(e).await?);
            }
            for r in receipts {
                r.committed().await?;
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let rate = (per * publishers) as f64 / started.elapsed().as_secs_f64();
    drop(bus);
    tasks.shutdown().await;
    drop(store);
    threads.shutdown().await;
    Ok(rate)
}

async fn delta_fanout(
    dir: &std::path::Path,
    subscribers: usize,
    deltas: usize,
) -> anyhow::Result<(f64, f64, u64)> {
    let (store, threads) = Store::open(&dir.join(format!("fanout-{subscribers}.db")))?;
    let (bus, tasks) = Bus::start(store.clone()).await?;
    let warmup = bracket("s", 0);
    let mut readers = Vec::new();
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    for _ in 0..subscribers {
        let mut sub = bus
            .subscribe(SubscribeOptions {
                filter: SessionFilter::All,
                forward_deltas: true,
                replay: Replay::None,
                subscriber_id: None,
            })
            .await?;
        let mut go = go_rx.clone();
        readers.push(tokio::spawn(async move {
            let mut received = 0u64;
            let mut ready = false;
            loop {
                let Some(d) = sub.recv().await? else { break };
                if !ready {
                    // The warm-up bracket: we are live. Wait for the start signal.
                    ready = true;
                    go.changed().await?;
                    continue;
                }
                if d.is_delta {
                    received += 1;
                } else {
                    break; // the closing bracket
                }
            }
            anyhow::Ok((received, sub.deltas_dropped()))
        }));
    }
    bus.publish(&warmup).await?.committed().await?;
    let delta = Event::new(
        "s",
        Some("run-0001".into()),
        EventBody::TextDelta(TextDelta {
            item_id: Some("item".into()),
            text: "lorem ipsum ".into(),
        }),
    );
    tokio::task::yield_now().await;
    let started = Instant::now();
    go_tx.send(true)?;
    for _ in 0..deltas {
        bus.publish(&delta).await?;
    }
    bus.publish(&bracket("s", 1)).await?.committed().await?;
    let publish_rate = deltas as f64 / started.elapsed().as_secs_f64();
    let mut delivered = 0u64;
    let mut dropped = 0u64;
    for r in readers {
        let (got, lost) = r.await??;
        delivered += got;
        dropped += lost;
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(bus);
    tasks.shutdown().await;
    drop(store);
    threads.shutdown().await;
    Ok((publish_rate, delivered as f64 / elapsed, dropped))
}

fn main() -> anyhow::Result<()> {
    let rows: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let payload_len = serde_json::to_string(&bracket("session-0", 0))?.len();
    println!(
        "agent-host bus benchmark: {rows} brackets of ~{payload_len} B, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let raw = raw_sqlite(dir.path(), rows)?;
    println!("raw rusqlite group commit ({GROUP}/tx):   {raw:>10.0} rows/s");
    let one = runtime.block_on(bus_ingest(dir.path(), "bus1", rows, 1))?;
    println!(
        "bus ingest, 1 publisher:             {one:>10.0} brackets/s  ratio {:.2}",
        one / raw
    );
    let three = runtime.block_on(bus_ingest(dir.path(), "bus3", rows, 3))?;
    println!(
        "bus ingest, 3 publishers:            {three:>10.0} brackets/s  ratio {:.2}",
        three / raw
    );

    let deltas = 100_000;
    for subs in [1usize, 10, 100] {
        let (publish, delivered, dropped) =
            runtime.block_on(delta_fanout(dir.path(), subs, deltas))?;
        println!(
            "delta fan-out to {subs:>3} subscribers:    {publish:>10.0} deltas/s published, {delivered:>11.0} deliveries/s, {dropped} dropped ({:.1}%)",
            100.0 * dropped as f64 / (deltas * subs) as f64
        );
    }
    Ok(())
}
