//! `session.list` paging at scale: a store of N sessions (default 20,000), half of them with a
//! user message and an answer appended through the store (so their activity moved and they
//! have previews), then
//! 1. the baseline: the same keyset query, page after page of 50, on a raw rusqlite connection
//!    to the same file (no threads, no channels, no cursor encoding),
//! 2. `Store::list_sessions_page` through every page of 50 (the reader thread's round trip,
//!    cursor encoding and decoding included), with its ratio to (1),
//! 3. filtered passes: by `cwd` (1 in 20 sessions), by `state`, and `only` 100 ids,
//! 4. the old unbounded `Store::list_sessions`, for comparison.
//!
//! Each page's latency is measured; p50 / p99 / max per page and the total are printed (the
//! unfiltered figures are over three interleaved passes per side).
//! Aim: every page ≤ 10 ms at p99.
//!
//! Run: `cargo bench --bench session_list` (optional arg: number of sessions).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use agent_host::store::{NewEvent, SessionQuery, Store};
use rusqlite::{Connection, params};

const PAGE: u32 = 50;
const CWDS: usize = 20;
/// Unfiltered passes per side; the per-page figures are over all of them.
const ROUNDS: usize = 3;

/// Per-page latencies of one pass, and what it listed.
struct Pass {
    pages: Vec<Duration>,
    ids: Vec<String>,
}

impl Pass {
    fn total(&self) -> Duration {
        self.pages.iter().sum()
    }

    fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.pages.clone();
        sorted.sort();
        let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        sorted.get(i).copied().unwrap_or_default()
    }

    fn report(&self, name: &str) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{name:<34} {:>5} pages {:>6} rows/pass  p50 {:6.3} ms  p99 {:6.3} ms  max {:6.3} ms  total {:8.1} ms",
            self.pages.len(),
            self.ids.len(),
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99)),
            ms(self.quantile(1.0)),
            ms(self.total()),
        );
    }
}

async fn store_pass(store: &Store, query: SessionQuery) -> anyhow::Result<Pass> {
    let mut query = SessionQuery {
        limit: PAGE,
        ..query
    };
    let mut pass = Pass {
        pages: Vec::new(),
        ids: Vec::new(),
    };
    loop {
        let started = Instant::now();
        let page = store.list_sessions_page(query.clone()).await?;
        pass.pages.push(started.elapsed());
        pass.ids
            .extend(page.sessions.into_iter().map(|r| r.session.session_id));
        match page.next_cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => return Ok(pass),
        }
    }
}

/// The unfiltered keyset query, as the store runs it, on a plain connection.
fn raw_pass(conn: &Connection) -> anyhow::Result<Pass> {
    type Row = (
        String,
        String,
        Option<String>,
        String,
        Option<String>,
        Option<String>,
        String,
        i64,
        i64,
        Option<String>,
        i64,
        Option<String>,
    );
    const COLUMNS: &str = "SELECT id, agent_type, native_session_id, cwd, parent_session_id, \
         title, state, created_at, updated_at, config, last_activity_at, preview FROM sessions";
    let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<Row> {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
            r.get(9)?,
            r.get(10)?,
            r.get(11)?,
        ))
    };
    let first_sql = format!("{COLUMNS} ORDER BY last_activity_at DESC, id LIMIT ?1");
    let next_sql = format!(
        "{COLUMNS} WHERE last_activity_at <= ?1 AND (last_activity_at < ?1 OR id > ?2) \
         ORDER BY last_activity_at DESC, id LIMIT ?3"
    );
    let mut pass = Pass {
        pages: Vec::new(),
        ids: Vec::new(),
    };
    let mut cursor: Option<(i64, String)> = None;
    let ask = i64::from(PAGE) + 1;
    loop {
        let started = Instant::now();
        let mut rows: Vec<Row> = match &cursor {
            None => conn
                .prepare_cached(&first_sql)?
                .query_map([ask], read)?
                .collect::<Result<_, _>>()?,
            Some((ms, id)) => conn
                .prepare_cached(&next_sql)?
                .query_map(params![ms, id, ask], read)?
                .collect::<Result<_, _>>()?,
        };
        let more = rows.len() > PAGE as usize;
        rows.truncate(PAGE as usize);
        cursor = rows.last().map(|r| (r.10, r.0.clone()));
        pass.pages.push(started.elapsed());
        pass.ids.extend(rows.into_iter().map(|r| r.0));
        if !more {
            return Ok(pass);
        }
    }
}

fn text_event(session: &str, n: usize, kind: &'static str, text: &str, at: i64) -> NewEvent {
    NewEvent {
        message_id: format!("m{n}").into(),
        session_id: session.into(),
        run_id: None,
        kind,
        payload: serde_json::json!({"k": kind, "sessionId": session, "text": text})
            .to_string()
            .into(),
        created_at: at,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sessions: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("host.db");
    let (store, threads) = Store::open(&path)?;

    // The rows in one raw transaction (the store's insert is one fsynced transaction each);
    // activity as `insert_session` sets it. Ties: two sessions per millisecond.
    let base = agent_host::store::now_ms() - 10 * sessions as i64;
    let built = Instant::now();
    {
        let mut conn = Connection::open(&path)?;
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare(
                "INSERT INTO sessions (id, agent_type, cwd, state, created_at, updated_at, \
                 last_activity_at) VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?5)",
            )?;
            for i in 0..sessions {
                let at = base + (i / 2) as i64;
                let agent = ["claude", "codex", "acp"][i % 3];
                let state = if i % 10 == 0 { "running" } else { "idle" };
                stmt.execute(params![
                    format!("session-{i:06}"),
                    agent,
                    format!("/work/project-{:02}", i % CWDS),
                    state,
                    at
                ])?;
            }
        }
        tx.commit()?;
    }
    let built = built.elapsed();
    // Events through the store's append path (group commit, activity and preview upkeep):
    // every other session, in a shuffled order of activity.
    let text = "please look at the failing test in the store module and tell me why ".repeat(3);
    let appended = Instant::now();
    let mut receipts = Vec::new();
    let mut batch = Vec::new();
    let mut events = 0;
    for i in (0..sessions).step_by(2) {
        let id = format!("session-{i:06}");
        let at = base + ((i * 7919) % sessions) as i64 + 5;
        batch.push(text_event(&id, 2 * i, "user.text", &text, at));
        batch.push(text_event(&id, 2 * i + 1, "text.end", &text, at + 1));
        events += 2;
        if batch.len() >= 1000 {
            receipts.push(store.append(std::mem::take(&mut batch)).await?);
        }
    }
    receipts.push(store.append(batch).await?);
    for receipt in receipts {
        receipt.await??;
    }
    println!(
        "built {sessions} sessions in {:.0} ms; appended {events} events through the store in {:.0} ms",
        built.as_secs_f64() * 1000.0,
        appended.elapsed().as_secs_f64() * 1000.0
    );

    // Let the store's idle checkpoint run first (it would share the cores with a pass), then
    // warm both connections' caches the same way: one pass each, not counted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let raw = Connection::open(&path)?;
    raw_pass(&raw)?;
    store_pass(&store, SessionQuery::default()).await?;

    // Interleaved rounds, so a hiccup of the machine falls on both sides alike.
    let mut baseline = Pass {
        pages: Vec::new(),
        ids: Vec::new(),
    };
    let mut paged = Pass {
        pages: Vec::new(),
        ids: Vec::new(),
    };
    for _ in 0..ROUNDS {
        let raw_round = raw_pass(&raw)?;
        let store_round = store_pass(&store, SessionQuery::default()).await?;
        anyhow::ensure!(
            store_round.ids == raw_round.ids,
            "the store and the raw query disagree"
        );
        baseline.pages.extend(raw_round.pages);
        baseline.ids = raw_round.ids;
        paged.pages.extend(store_round.pages);
        paged.ids = store_round.ids;
    }
    let unique: HashSet<&String> = paged.ids.iter().collect();
    anyhow::ensure!(
        unique.len() == sessions && paged.ids.len() == sessions,
        "the pass listed {} rows, {} distinct, of {sessions}",
        paged.ids.len(),
        unique.len()
    );
    baseline.report("raw rusqlite keyset (baseline)");
    paged.report("Store::list_sessions_page");
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "  ratio to raw: p50 {:.2}x  p99 {:.2}x  total {:.2}x",
        ratio(paged.quantile(0.5), baseline.quantile(0.5)),
        ratio(paged.quantile(0.99), baseline.quantile(0.99)),
        ratio(paged.total(), baseline.total())
    );

    let by_cwd = store_pass(
        &store,
        SessionQuery {
            cwd: Some("/work/project-07".into()),
            ..Default::default()
        },
    )
    .await?;
    by_cwd.report("  filter cwd (1 in 20)");
    let by_state = store_pass(
        &store,
        SessionQuery {
            state: Some("running".into()),
            agent_type: Some("codex".into()),
            ..Default::default()
        },
    )
    .await?;
    by_state.report("  filter state + agent_type");
    let only: Vec<String> = (0..100)
        .map(|i| format!("session-{:06}", (i * 197) % sessions))
        .collect();
    let scoped = store_pass(
        &store,
        SessionQuery {
            only: Some(only),
            ..Default::default()
        },
    )
    .await?;
    scoped.report("  only 100 ids (a scoped client)");

    let mut unbounded = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let rows = store.list_sessions().await?;
        unbounded.push(started.elapsed());
        anyhow::ensure!(rows.len() == sessions, "the old list lost rows");
    }
    unbounded.sort();
    println!(
        "old Store::list_sessions (all {sessions} rows, one reply): median of 5 {:.1} ms",
        unbounded[unbounded.len() / 2].as_secs_f64() * 1000.0
    );
    let worst = [&paged, &by_cwd, &by_state, &scoped]
        .iter()
        .map(|p| p.quantile(0.99))
        .max()
        .unwrap_or_default();
    println!(
        "aim: every page <= 10 ms at p99: worst p99 {:.3} ms: {}",
        worst.as_secs_f64() * 1000.0,
        if worst <= Duration::from_millis(10) {
            "met"
        } else {
            "MISSED"
        }
    );

    drop(store);
    threads.shutdown().await;
    Ok(())
}
