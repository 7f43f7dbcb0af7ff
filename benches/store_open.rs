//! What the integrity check at open costs (issue 13): a database of N bracket rows (default
//! 1,000,000) of the size the bus benchmark uses, built with raw rusqlite; then, each on a
//! cold connection,
//! 1. the baseline: one full scan of the events table (`SELECT sum(length(payload))`),
//! 2. `PRAGMA quick_check` (what `Store::open` runs),
//! 3. `PRAGMA integrity_check` (the full check, for comparison),
//! 4. the whole `Store::open` (quick_check, migrations, threads) and its shutdown,
//!
//! each with its ratio to (1).
//!
//! Run: `cargo bench --bench store_open` (optional arg: number of rows).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::time::{Duration, Instant};

use agent_host::store::Store;
use rusqlite::{Connection, params};

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let out = f();
    (out, started.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rows: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("host.db");
    // The schema, as the host creates it.
    let (store, threads) = Store::open(&path)?;
    drop(store);
    threads.shutdown().await;

    let (built, took) = timed(|| -> anyhow::Result<()> {
        let mut conn = Connection::open(&path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let text = "lorem ipsum dolor sit amet ".repeat(8);
        for chunk in 0..rows.div_ceil(10_000) {
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO messages (message_id, session_id, run_id, kind, payload, created_at) \
                     VALUES (?1, ?2, ?3, 'text.end', ?4, 0)",
                )?;
                for i in chunk * 10_000..((chunk + 1) * 10_000).min(rows) {
                    let session = format!("session-{:04}", i % 100);
                    let payload = format!(
                        r#"{{"k":"text.end","sessionId":"{session}","runId":"run-{:06}","itemId":"item-{i}","text":"{text}"}}"#,
                        i / 50
                    );
                    stmt.execute(params![
                        format!("m{i}"),
                        session,
                        format!("run-{:06}", i / 50),
                        payload
                    ])?;
                }
            }
            tx.commit()?;
        }
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    });
    built?;
    let size = std::fs::metadata(&path)?.len();
    println!(
        "built {rows} rows, {:.0} MiB, in {:.1} s",
        size as f64 / (1024.0 * 1024.0),
        took.as_secs_f64()
    );

    let cold = || Connection::open(&path);
    let (scan, base) = timed(|| -> rusqlite::Result<i64> {
        cold()?.query_row("SELECT sum(length(payload)) FROM messages", [], |r| {
            r.get(0)
        })
    });
    scan?;
    let (quick, quick_t) = timed(|| -> rusqlite::Result<String> {
        cold()?.query_row("PRAGMA quick_check", [], |r| r.get(0))
    });
    let (full, full_t) = timed(|| -> rusqlite::Result<String> {
        cold()?.query_row("PRAGMA integrity_check", [], |r| r.get(0))
    });
    let (opened, open_t) = timed(|| Store::open(&path));
    let (store, threads) = opened?;
    drop(store);
    threads.shutdown().await;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let ratio = |d: Duration| d.as_secs_f64() / base.as_secs_f64();
    println!("baseline full scan of messages: {:8.0} ms", ms(base));
    println!(
        "PRAGMA quick_check ({}):     {:8.0} ms  {:5.2}x the scan",
        quick?,
        ms(quick_t),
        ratio(quick_t)
    );
    println!(
        "PRAGMA integrity_check ({}): {:8.0} ms  {:5.2}x the scan",
        full?,
        ms(full_t),
        ratio(full_t)
    );
    println!(
        "Store::open (quick_check + migrate + threads): {:8.0} ms  {:5.2}x the scan",
        ms(open_t),
        ratio(open_t)
    );
    Ok(())
}
