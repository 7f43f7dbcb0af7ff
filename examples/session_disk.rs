//! What a session costs on disk (issue 19): N sessions (default 10,000) created the way
//! `session.create` stores them — one `Store::insert_session` each, one commit each, with the
//! row `SessionManager::create` builds (a UUIDv7 id, a canonical cwd, no options, the binding
//! `binding::derive` records for a git workspace with a provider and a model) — then
//! `host.db` and `host.db-wal` measured right after the creates (the host still running), and
//! again once the store has shut down. Then where the bytes are: pages per table and index
//! (SQLite's `dbstat`), and the bytes of the rows themselves (`sum(pgsize - unused)`).
//!
//! With `--scoped`, each create also does what a scoped loopback client's create adds: its
//! subscriber's stored scope gains the new id (`Subscribers::extend_scope`, one
//! `set_subscriber_scope` with the whole list).
//!
//! Run: `cargo run --release --example session_disk -- [N] [--scoped]`.

#![allow(clippy::print_stdout, reason = "an example reports on stdout")]

use std::path::Path;

use agent_host::protocol::options::{BindingRecord, ProviderIdentity, WorkspaceIdentity};
use agent_host::protocol::states::SessionState;
use agent_host::store::{SessionRow, Store, now_ms};

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn row(cwd: &str) -> SessionRow {
    let now = now_ms();
    SessionRow {
        session_id: uuid::Uuid::now_v7().to_string(),
        agent_type: "claude".into(),
        native_session_id: None,
        cwd: cwd.into(),
        parent_session_id: None,
        title: None,
        state: SessionState::Idle,
        created_at_ms: now,
        updated_at_ms: now,
        fork_of: None,
        options: Default::default(),
        binding: Some(BindingRecord {
            workspace: Some(WorkspaceIdentity {
                root: cwd.into(),
                remote: Some("https://github.com/example/project.git".into()),
            }),
            provider: Some(ProviderIdentity {
                host: "api.anthropic.com".into(),
                key_sha256: Some("0123456789abcdef".into()),
            }),
            model: Some("claude-sonnet-4-5".into()),
            system_prompt_sha256: None,
            options_sha256: Some("ab".repeat(32)),
            recorded_at_ms: now,
        }),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("host.db");
    let wal = dir.path().join("host.db-wal");
    let cwd = "/home/user/src/project";
    let scoped = std::env::args().any(|a| a == "--scoped");
    let (store, threads) = Store::open(&db)?;
    if scoped {
        store
            .insert_subscriber(agent_host::store::SubscriberRow {
                subscriber_id: "web".into(),
                kind: "local".into(),
                session_id: None,
                forward_deltas: true,
                replay_mode: "none".into(),
                max_count: 200,
                most_recent_sequence_id: 0,
                deltas_dropped: 0,
                created_at_ms: now_ms(),
                updated_at_ms: now_ms(),
                scope: Some(r#"{"sessions":[]}"#.into()),
                client: Some("web".into()),
            })
            .await?;
    }
    let mut ids: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    for _ in 0..n {
        let row = row(cwd);
        let id = row.session_id.clone();
        store.insert_session(row).await?;
        if scoped {
            ids.push(id);
            let scope = serde_json::json!({ "sessions": ids }).to_string();
            store.set_subscriber_scope("web".into(), scope).await?;
        }
    }
    let took = started.elapsed();
    let (live_db, live_wal) = (size(&db), size(&wal));
    drop(store);
    threads.shutdown().await;
    let (closed_db, closed_wal) = (size(&db), size(&wal));
    println!(
        "{n} sessions created in {:.2} s{}",
        took.as_secs_f64(),
        if scoped { " (scoped client)" } else { "" }
    );
    let per = |bytes: u64| bytes as f64 / n as f64;
    println!(
        "running: host.db {live_db} B + WAL {live_wal} B = {} B, {:.0} B/session",
        live_db + live_wal,
        per(live_db + live_wal)
    );
    println!(
        "closed:  host.db {closed_db} B + WAL {closed_wal} B = {} B, {:.0} B/session",
        closed_db + closed_wal,
        per(closed_db + closed_wal)
    );

    let conn = rusqlite::Connection::open(&db)?;
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let freelist: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    println!("page_size {page_size}, free pages {freelist}");
    println!(
        "{:<28} {:>7} {:>11} {:>11} {:>9}",
        "table/index", "pages", "bytes", "used", "used/sess"
    );
    let mut stmt = conn.prepare(
        "SELECT name, count(*), sum(pgsize), sum(pgsize - unused) FROM dbstat \
         GROUP BY name ORDER BY sum(pgsize) DESC",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    for r in rows {
        let (name, pages, bytes, used) = r?;
        if pages > 1 {
            println!(
                "{name:<28} {pages:>7} {bytes:>11} {used:>11} {:>9.0}",
                used as f64 / n as f64
            );
        }
    }
    let row_bytes: f64 = conn.query_row(
        "SELECT avg(length(id) + length(agent_type) + length(cwd) + length(state) \
         + coalesce(length(config), 0) + 8 * 3) FROM sessions",
        [],
        |r| r.get(0),
    )?;
    println!("a row's own values: ~{row_bytes:.0} B (text lengths + three integers)");
    Ok(())
}
