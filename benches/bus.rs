//! Bus throughput and latency against baselines measured in the same run (issue 2,
//! acceptance 6; issue 19).
//!
//! 1. Raw rusqlite, two ways, rows of the same size into the same schema:
//!    - **host policy** (the baseline the ratios use): a writer thread fed row by row through a
//!      bounded channel, committing whatever is queued, up to 16k rows per transaction (the
//!      store's `MAX_GROUP_ROWS`), `synchronous=FULL` in WAL mode, automatic checkpoints off and
//!      PASSIVE checkpoints on their own thread every 1000 WAL pages — the store's own batching
//!      and checkpoint policy with nothing else in the way;
//!    - **naive** (printed beside it, labelled): 1,000 rows per transaction with SQLite's
//!      automatic checkpoints inside the commit.
//! 2. The bus: `Bus::publish` of brackets of that size from one and from three publishers,
//!    until the last commit receipt. Raw and bus alternate, round after round; the ratio is
//!    per round, reported as median, min and max.
//! 3. Delta fan-out: deltas of one open text block published to 1, 10 and 100 live in-process
//!    subscribers; deliveries per second and how many a subscriber had dropped.
//! 4. Latency: brackets published at 1,000 events/s to 10 in-process subscribers,
//!    publish→receive p50/p99, beside the **fsync floor**: a raw `synchronous=FULL` one-row
//!    commit's duration at the same pace on the same disk, p50/p99; alternating, per round.
//!
//! Run: `cargo bench --bench bus -- [brackets] [rounds]` (default 200000 brackets, 3 rounds).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_host::bus::{Bus, Replay, SubscribeOptions};
use agent_host::protocol::events::{BlockEnd, BlockStart, Event, EventBody, TextDelta};
use agent_host::store::{SessionFilter, Store};
use rusqlite::{Connection, params};

/// The naive baseline's rows per transaction.
const NAIVE_GROUP: usize = 1000;
/// The store's `MAX_GROUP_ROWS`.
const HOST_GROUP: usize = 16 * 1024;
/// The store's `CHECKPOINT_PAGES` and `WAL_HARD_PAGES`.
const CHECKPOINT_PAGES: i32 = 1000;
const WAL_HARD_PAGES: i32 = 2 * CHECKPOINT_PAGES;

const INSERT: &str = "INSERT INTO messages (message_id, session_id, run_id, kind, payload, created_at) \
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

fn bracket(session: &str, n: usize) -> Event {
    bracket_text(session, n, "lorem ipsum dolor sit amet ".repeat(8))
}

fn bracket_text(session: &str, n: usize, text: String) -> Event {
    Event::new(
        session,
        Some("run-0001".to_owned()),
        EventBody::TextEnd(BlockEnd {
            truncated: None,
            imported: false,
            item_id: Some(format!("item-{n}")),
            text,
        }),
    )
}

fn raw_connection(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(include_str!("../schema.sql"))?;
    Ok(conn)
}

fn payloads(rows: usize) -> anyhow::Result<Vec<Arc<str>>> {
    (0..rows)
        .map(|n| Ok(serde_json::to_string(&bracket("raw-session", n))?.into()))
        .collect()
}

/// The naive baseline: 1,000 rows per transaction, SQLite's checkpoints in the commit.
fn raw_naive(path: &Path, rows: usize) -> anyhow::Result<f64> {
    let mut conn = raw_connection(path)?;
    let payloads = payloads(rows)?;
    let started = Instant::now();
    for chunk in payloads.chunks(NAIVE_GROUP) {
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(INSERT)?;
            for payload in chunk {
                let message_id = uuid::Uuid::new_v4().to_string();
                stmt.execute(params![
                    message_id,
                    "raw-session",
                    "run-0001",
                    "text.end",
                    &**payload,
                    0
                ])?;
            }
        }
        tx.commit()?;
    }
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

/// One row for the raw group-commit writer, with the time it was handed over.
struct RawRow {
    message_id: String,
    payload: Arc<str>,
    sent: Instant,
}

/// What the raw writer saw: per row, hand-over → commit; per transaction, its duration.
struct RawStats {
    latencies: Vec<Duration>,
    commits: Vec<Duration>,
    transactions: usize,
}

/// A raw writer thread with the store's policy: group commit of whatever is queued (up to
/// [`HOST_GROUP`] rows), automatic checkpoints off, a checkpoint thread poked by the WAL hook.
fn raw_writer(
    path: &Path,
    group_max: usize,
) -> anyhow::Result<(
    std::sync::mpsc::SyncSender<RawRow>,
    std::thread::JoinHandle<anyhow::Result<RawStats>>,
)> {
    let mut conn = raw_connection(path)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", 8 * 1024 * 1024)?;
    let (poke, pokes) = std::sync::mpsc::sync_channel::<i32>(1);
    conn.wal_hook(Some(
        move |wal: &mut rusqlite::hooks::Wal, pages: std::os::raw::c_int| {
            if pages >= WAL_HARD_PAGES {
                let _busy = wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE);
                return Ok(());
            }
            let _pending = poke.try_send(pages);
            Ok(())
        },
    ))?;
    let checkpointer = Connection::open(path)?;
    std::thread::spawn(move || {
        while let Ok(pages) = pokes.recv() {
            if pages >= CHECKPOINT_PAGES {
                let _ = checkpointer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
            }
        }
    });
    // The store's ingest queue bound.
    let (tx, rx) = std::sync::mpsc::sync_channel::<RawRow>(8192);
    let writer = std::thread::spawn(move || {
        let mut stats = RawStats {
            latencies: Vec::new(),
            commits: Vec::new(),
            transactions: 0,
        };
        let mut group = Vec::with_capacity(group_max);
        while let Ok(first) = rx.recv() {
            group.push(first);
            while group.len() < group_max {
                match rx.try_recv() {
                    Ok(row) => group.push(row),
                    Err(_) => break,
                }
            }
            let began = Instant::now();
            let db = conn.transaction()?;
            {
                let mut stmt = db.prepare_cached(INSERT)?;
                for row in &group {
                    stmt.execute(params![
                        row.message_id,
                        "raw-session",
                        "run-0001",
                        "text.end",
                        &*row.payload,
                        0
                    ])?;
                }
            }
            db.commit()?;
            let done = Instant::now();
            stats.commits.push(done - began);
            stats.transactions += 1;
            stats
                .latencies
                .extend(group.drain(..).map(|row| done - row.sent));
        }
        // Dropping the connection drops the WAL hook's sender: the checkpointer ends.
        drop(conn);
        Ok(stats)
    });
    Ok((tx, writer))
}

/// The host-policy baseline: rows handed over one by one, as fast as they come.
fn raw_host_policy(path: &Path, rows: usize) -> anyhow::Result<(f64, f64)> {
    let payloads = payloads(rows)?;
    let (tx, writer) = raw_writer(path, HOST_GROUP)?;
    let started = Instant::now();
    for payload in payloads {
        tx.send(RawRow {
            message_id: uuid::Uuid::new_v4().to_string(),
            payload,
            sent: Instant::now(),
        })?;
    }
    drop(tx);
    let stats = writer
        .join()
        .map_err(|_| anyhow::anyhow!("raw writer panicked"))??;
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    Ok((rate, rows as f64 / stats.transactions.max(1) as f64))
}

async fn bus_ingest(dir: &Path, name: &str, rows: usize, publishers: usize) -> anyhow::Result<f64> {
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

/// Deltas of one open text block to `subscribers` live subscribers: (published/s,
/// deliveries/s, dropped).
async fn delta_fanout(
    dir: &Path,
    subscribers: usize,
    deltas: usize,
) -> anyhow::Result<(f64, f64, u64)> {
    let (store, threads) = Store::open(&dir.join(format!("fanout-{subscribers}.db")))?;
    let (bus, tasks) = Bus::start(store.clone()).await?;
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
                    // The block's start bracket: we are live. Wait for the start signal.
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
    let start = Event::new(
        "s",
        Some("run-0001".into()),
        EventBody::TextStart(BlockStart {
            item_id: Some("item".into()),
        }),
    );
    bus.publish(&start).await?.committed().await?;
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
    let end = Event::new(
        "s",
        Some("run-0001".into()),
        EventBody::TextEnd(BlockEnd {
            truncated: None,
            imported: false,
            item_id: Some("item".into()),
            text: "lorem ipsum ".repeat(deltas),
        }),
    );
    bus.publish(&end).await?.committed().await?;
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

/// The p-th quantile of sorted samples, in milliseconds.
fn quantile_ms(sorted: &[Duration], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The fsync floor: a raw one-row `synchronous=FULL` commit every millisecond (the pace of
/// the latency run), through the same writer thread as the host-policy baseline. (commit
/// duration p50/p99, hand-over→commit p50/p99) in ms.
fn raw_latency(path: &Path, events: usize) -> anyhow::Result<[f64; 4]> {
    let (tx, writer) = raw_writer(path, HOST_GROUP)?;
    let payload: Arc<str> = serde_json::to_string(&bracket("raw-session", 0))?.into();
    let mut next = Instant::now();
    for _ in 0..events {
        next += Duration::from_millis(1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        tx.send(RawRow {
            message_id: uuid::Uuid::new_v4().to_string(),
            payload: payload.clone(),
            sent: Instant::now(),
        })?;
    }
    drop(tx);
    let mut stats = writer
        .join()
        .map_err(|_| anyhow::anyhow!("raw writer panicked"))??;
    stats.commits.sort_unstable();
    stats.latencies.sort_unstable();
    Ok([
        quantile_ms(&stats.commits, 0.5),
        quantile_ms(&stats.commits, 0.99),
        quantile_ms(&stats.latencies, 0.5),
        quantile_ms(&stats.latencies, 0.99),
    ])
}

/// Brackets at 1,000 events/s to `subscribers` in-process subscribers: publish→receive
/// p50/p99 in ms over every delivery.
async fn bus_latency(
    dir: &Path,
    name: &str,
    events: usize,
    subscribers: usize,
) -> anyhow::Result<[f64; 2]> {
    let (store, threads) = Store::open(&dir.join(format!("{name}.db")))?;
    let (bus, tasks) = Bus::start(store.clone()).await?;
    let base = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..subscribers {
        let mut sub = bus
            .subscribe(SubscribeOptions {
                filter: SessionFilter::All,
                forward_deltas: true,
                replay: Replay::None,
                subscriber_id: None,
            })
            .await?;
        readers.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(events);
            while samples.len() < events {
                let Some(d) = sub.recv().await? else { break };
                let now = base.elapsed();
                let v: serde_json::Value = serde_json::from_str(&d.json)?;
                let sent: u64 = v["text"].as_str().and_then(|t| t.parse().ok()).unwrap_or(0);
                samples.push(now.saturating_sub(Duration::from_nanos(sent)));
            }
            anyhow::Ok(samples)
        }));
    }
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut last = None;
    for n in 0..events {
        tick.tick().await;
        let sent = base.elapsed().as_nanos().to_string();
        last = Some(bus.publish(&bracket_text("s", n, sent)).await?);
    }
    if let Some(last) = last {
        last.committed().await?;
    }
    let mut all = Vec::with_capacity(events * subscribers);
    for r in readers {
        all.extend(r.await??);
    }
    all.sort_unstable();
    drop(bus);
    tasks.shutdown().await;
    drop(store);
    threads.shutdown().await;
    Ok([quantile_ms(&all, 0.5), quantile_ms(&all, 0.99)])
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
    let rows = numbers.next().unwrap_or(200_000);
    let rounds = numbers.next().unwrap_or(3).max(1);
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let payload_len = serde_json::to_string(&bracket("session-0", 0))?.len();
    println!(
        "agent-host bus benchmark: {rows} brackets of ~{payload_len} B, {rounds} rounds \
         (raw and bus alternate), {} cores, shared machine",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let mut ratio1 = Vec::new();
    let mut ratio3 = Vec::new();
    let mut naive_ratio1 = Vec::new();
    for round in 0..rounds {
        let (raw, group) = raw_host_policy(&dir.path().join(format!("raw-{round}.db")), rows)?;
        let one = runtime.block_on(bus_ingest(dir.path(), &format!("bus1-{round}"), rows, 1))?;
        let naive = raw_naive(&dir.path().join(format!("naive-{round}.db")), rows)?;
        let three = runtime.block_on(bus_ingest(dir.path(), &format!("bus3-{round}"), rows, 3))?;
        println!(
            "round {round}: raw (host policy, {group:.0} rows/tx) {raw:>8.0} rows/s | naive \
             ({NAIVE_GROUP}/tx, checkpoints in commit) {naive:>8.0} rows/s | bus 1 publisher \
             {one:>8.0}/s ({:.2}) | bus 3 publishers {three:>8.0}/s ({:.2})",
            one / raw,
            three / raw
        );
        ratio1.push(one / raw);
        ratio3.push(three / raw);
        naive_ratio1.push(one / naive);
    }
    for (label, values) in [
        ("bus ingest, 1 publisher / raw (host policy)", ratio1),
        ("bus ingest, 3 publishers / raw (host policy)", ratio3),
        (
            "bus ingest, 1 publisher / raw (naive, flatters)",
            naive_ratio1,
        ),
    ] {
        let (median, min, max) = spread(values);
        println!("{label:<50} median {median:.2}  min {min:.2}  max {max:.2}");
    }

    let deltas = 100_000;
    for subs in [1usize, 10, 100] {
        let (publish, delivered, dropped) =
            runtime.block_on(delta_fanout(dir.path(), subs, deltas))?;
        println!(
            "delta fan-out to {subs:>3} subscribers: {publish:>10.0} deltas/s published, \
             {delivered:>11.0} deliveries/s, {dropped} dropped ({:.1}%)",
            100.0 * dropped as f64 / (deltas * subs) as f64
        );
    }

    let events = 3000;
    let subscribers = 10;
    println!(
        "latency: {events} brackets at 1000/s to {subscribers} in-process subscribers \
         (publish->receive) vs the fsync floor (a raw synchronous=FULL one-row commit at the \
         same pace), ms"
    );
    let mut over = Vec::new();
    for round in 0..rounds {
        let [c50, c99, l50, l99] =
            raw_latency(&dir.path().join(format!("floor-{round}.db")), events)?;
        let [b50, b99] = runtime.block_on(bus_latency(
            dir.path(),
            &format!("lat-{round}"),
            events,
            subscribers,
        ))?;
        println!(
            "round {round}: floor commit p50 {c50:.3} p99 {c99:.3} | raw hand-over->commit p50 \
             {l50:.3} p99 {l99:.3} | bus publish->receive p50 {b50:.3} p99 {b99:.3} \
             (p99 - floor p99 = {:+.3})",
            b99 - c99
        );
        over.push(b99 - c99);
    }
    let (median, min, max) = spread(over);
    println!(
        "bus p99 minus fsync-floor p99 (goal <= 1 ms): median {median:+.3}  min {min:+.3}  \
         max {max:+.3}"
    );
    Ok(())
}
