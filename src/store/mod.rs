//! The SQLite store: the only module that imports `rusqlite`.
//!
//! SQLite calls block, so they never run on a tokio worker. The store owns two OS threads,
//! each with its own connection to the same WAL database:
//! - the **writer** takes every mutation in FIFO order. Bracket appends are group-committed:
//!   whatever appends are queued when the writer wakes go into one transaction, and each
//!   caller's reply carries the `sequence_id`s assigned to its rows after the commit.
//! - the **reader** answers queries (history, catch-up pages, listings). WAL lets it read the
//!   last committed state while the writer writes.
//!
//! Callers hold a cloneable [`Store`] handle. Both request queues are bounded, and a caller
//! awaits room (back-pressure, never a drop). [`StoreThreads::shutdown`] lets both threads
//! finish what is queued and joins them. A failed group commit stops event appends for good
//! (fail-stop, see `writer_loop`).

mod runs;
mod schema;

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

pub use runs::{PermissionRow, Resolve, RunInsert, StoredBaseline};
pub use schema::SCHEMA_VERSION;

/// Store failures. Callers map these to `store_failed` at the edge.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the database schema version {found} is newer than this build ({supported})")]
    TooNew { found: i64, supported: i64 },
    #[error("the store has shut down")]
    Closed,
    #[error("event commit failed: {0}")]
    CommitFailed(String),
    #[error("event appends are stopped since an earlier commit failed ({0}); restart the host")]
    AppendsStopped(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// How many requests may wait for each store thread before callers are made to wait.
const QUEUE_DEPTH: usize = 1024;
/// The most rows one group commit takes; more waits for the next transaction.
const MAX_GROUP_ROWS: usize = 16 * 1024;

/// Milliseconds since the Unix epoch, the store's time format.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A bracket to append. Strings are shared with the bus, which fans the same bytes out.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub message_id: Arc<str>,
    pub session_id: Arc<str>,
    pub run_id: Option<Arc<str>>,
    pub kind: &'static str,
    pub payload: Arc<str>,
    pub created_at: i64,
}

/// A stored bracket as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub sequence_id: i64,
    pub message_id: String,
    pub session_id: String,
    pub run_id: Option<String>,
    pub kind: String,
    pub payload: String,
    pub created_at: i64,
}

/// A `sessions` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionRow {
    pub session_id: String,
    pub agent_type: String,
    pub native_session_id: Option<String>,
    pub cwd: String,
    pub parent_session_id: Option<String>,
    pub title: Option<String>,
    pub state: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// A native session this one starts as a fork of (an explicit fork, or an imported
    /// session), until its own native id is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_of: Option<String>,
}

/// Which sessions a subscriber follows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SessionFilter {
    All,
    One(Arc<str>),
}

impl SessionFilter {
    pub fn matches(&self, session_id: &str) -> bool {
        match self {
            SessionFilter::All => true,
            SessionFilter::One(id) => &**id == session_id,
        }
    }

    fn as_param(&self) -> Option<&str> {
        match self {
            SessionFilter::All => None,
            SessionFilter::One(id) => Some(id),
        }
    }
}

/// A `subscribers` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubscriberRow {
    pub subscriber_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub session_id: Option<String>,
    pub forward_deltas: bool,
    pub replay_mode: String,
    pub max_count: i64,
    pub most_recent_sequence_id: i64,
    pub deltas_dropped: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// One page of catch-up: the rows, and the largest `sequence_id` in the whole table at the
/// moment of the read, which is how far the reader has seen (for any filter).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub events: Vec<StoredEvent>,
    pub snapshot_max: i64,
}

/// The largest `sequence_id` ever assigned: AUTOINCREMENT's own counter, which, unlike
/// `max(sequence_id)`, does not go back when the newest rows are deleted with their session.
const MAX_SEQ_SQL: &str =
    "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0)";

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

enum WriteCmd {
    Append {
        events: Vec<NewEvent>,
        reply: oneshot::Sender<StoreResult<Vec<i64>>>,
    },
    Exec(Job),
    /// Finish what is queued before this, then exit.
    Stop,
}

enum ReadCmd {
    Job(Job),
    Stop,
}

/// A cloneable handle to the store threads.
#[derive(Clone)]
pub struct Store {
    writer: mpsc::Sender<WriteCmd>,
    reader: mpsc::Sender<ReadCmd>,
}

/// The store's threads. [`StoreThreads::shutdown`] stops them even while [`Store`] handles
/// are still held elsewhere; requests after that fail with [`StoreError::Closed`].
pub struct StoreThreads {
    handles: Vec<JoinHandle<()>>,
    writer: mpsc::Sender<WriteCmd>,
    reader: mpsc::Sender<ReadCmd>,
}

impl StoreThreads {
    /// Let both threads finish what is queued, commit, close their connections and exit.
    pub async fn shutdown(self) {
        let _writer_gone = self.writer.send(WriteCmd::Stop).await;
        let _reader_gone = self.reader.send(ReadCmd::Stop).await;
        let handles = self.handles;
        let joined = tokio::task::spawn_blocking(move || {
            for handle in handles {
                if handle.join().is_err() {
                    tracing::error!("a store thread panicked");
                }
            }
        })
        .await;
        if joined.is_err() {
            tracing::error!("joining the store threads failed");
        }
    }
}

fn open_connection(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open(path).map_err(|e| StoreError::Open {
        path: path.to_owned(),
        source: Box::new(e),
    })?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: a commit is fsynced, so an acknowledged bracket survives a power loss too. Group
    // commit pays that once per group, not once per event.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    Ok(conn)
}

impl Store {
    /// Open (creating with mode 0600 if missing) and migrate the database, then start the
    /// writer and reader threads.
    pub fn open(path: &Path) -> StoreResult<(Store, StoreThreads)> {
        // Create the file ourselves so its mode is 0600 from the first byte; SQLite gives the
        // -wal and -shm files the same mode as the database file.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| StoreError::Open {
                path: path.to_owned(),
                source: Box::new(e),
            })?;
        let mut write_conn = open_connection(path)?;
        schema::migrate(&mut write_conn)?;
        // Checkpoints run on their own thread, so a commit never waits for one.
        write_conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let read_conn = open_connection(path)?;
        let checkpoint_conn = open_connection(path)?;
        let (poke, pokes) = std::sync::mpsc::sync_channel::<()>(1);

        let (writer_tx, writer_rx) = mpsc::channel(QUEUE_DEPTH);
        let (reader_tx, reader_rx) = mpsc::channel(QUEUE_DEPTH);
        let spawn_err = |e: std::io::Error| StoreError::Open {
            path: path.to_owned(),
            source: Box::new(e),
        };
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer_loop(write_conn, writer_rx, poke))
            .map_err(spawn_err)?;
        let checkpointer = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpoint_conn, pokes))
            .map_err(spawn_err)?;
        let reader = std::thread::Builder::new()
            .name("store-reader".into())
            .spawn(move || reader_loop(read_conn, reader_rx))
            .map_err(spawn_err)?;
        Ok((
            Store {
                writer: writer_tx.clone(),
                reader: reader_tx.clone(),
            },
            StoreThreads {
                handles: vec![writer, reader, checkpointer],
                writer: writer_tx,
                reader: reader_tx,
            },
        ))
    }

    /// Queue brackets for the next group commit. Awaiting this waits only for queue room;
    /// the returned receiver resolves with the assigned `sequence_id`s once committed.
    pub async fn append(
        &self,
        events: Vec<NewEvent>,
    ) -> StoreResult<oneshot::Receiver<StoreResult<Vec<i64>>>> {
        let (reply, rx) = oneshot::channel();
        self.writer
            .send(WriteCmd::Append { events, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    /// Run a mutation on the writer thread, in FIFO order with appends.
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        self.write_start(f)
            .await?
            .await
            .map_err(|_| StoreError::Closed)?
    }

    /// Queue a mutation (its place in the writer's FIFO order is fixed now) and return the
    /// receiver of its result, so the caller can go on and check the outcome later.
    pub async fn write_start<T, F>(&self, f: F) -> StoreResult<oneshot::Receiver<StoreResult<T>>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // The caller may have gone away; the work is done either way.
            let _ignored = tx.send(f(conn));
        });
        self.writer
            .send(WriteCmd::Exec(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    /// Run a query on the reader thread.
    pub async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        self.read_start(f)
            .await?
            .await
            .map_err(|_| StoreError::Closed)?
    }

    /// Queue a query and return the receiver of its answer, so a caller that may be cancelled
    /// can keep the receiver and pick the answer up later.
    pub async fn read_start<T, F>(&self, f: F) -> StoreResult<oneshot::Receiver<StoreResult<T>>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ignored = tx.send(f(conn));
        });
        self.reader
            .send(ReadCmd::Job(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    // ---- sessions ----

    pub async fn insert_session(&self, row: SessionRow) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO sessions (id, agent_type, native_session_id, cwd, parent_session_id, \
                 title, state, created_at, updated_at, config) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    row.session_id,
                    row.agent_type,
                    row.native_session_id,
                    row.cwd,
                    row.parent_session_id,
                    row.title,
                    row.state,
                    row.created_at_ms,
                    row.updated_at_ms,
                    row.fork_of
                        .as_ref()
                        .map(|f| serde_json::json!({"fork_of": f}).to_string())
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// Delete a session and its events; `false` if there was no such session.
    pub async fn delete_session(&self, session_id: String) -> StoreResult<bool> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            let n = tx.execute("DELETE FROM sessions WHERE id = ?1", [&session_id])?;
            tx.execute("DELETE FROM messages WHERE session_id = ?1", [&session_id])?;
            tx.execute("DELETE FROM runs WHERE session_id = ?1", [&session_id])?;
            tx.execute(
                "DELETE FROM permissions WHERE session_id = ?1",
                [&session_id],
            )?;
            tx.execute(
                "DELETE FROM session_baselines WHERE session_id = ?1",
                [&session_id],
            )?;
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    pub async fn get_session(&self, session_id: String) -> StoreResult<Option<SessionRow>> {
        self.read(move |conn| {
            let row = conn
                .prepare_cached(&format!("{SESSION_SELECT} WHERE id = ?1"))?
                .query_row([&session_id], session_from_row)
                .optional()?;
            Ok(row)
        })
        .await
    }

    pub async fn list_sessions(&self) -> StoreResult<Vec<SessionRow>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "{SESSION_SELECT} ORDER BY created_at DESC, id DESC"
            ))?;
            let rows = stmt
                .query_map([], session_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn count_sessions(&self) -> StoreResult<i64> {
        self.read(|conn| Ok(conn.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))?))
            .await
    }

    // ---- events ----

    /// Brackets of one session after `after_seq`, oldest first, at most `limit`.
    pub async fn history(
        &self,
        session_id: String,
        after_seq: i64,
        limit: u32,
    ) -> StoreResult<Vec<StoredEvent>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "{EVENT_SELECT} WHERE session_id = ?1 AND sequence_id > ?2 \
                 ORDER BY sequence_id LIMIT ?3"
            ))?;
            let rows = stmt
                .query_map(params![session_id, after_seq, limit], event_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// One catch-up page: brackets matching `filter` with `after_seq < sequence_id <= up_to`
    /// (no upper bound if `up_to` is `None`), with the table's largest `sequence_id` read in
    /// the same transaction.
    pub async fn page_after(
        &self,
        filter: SessionFilter,
        after_seq: i64,
        up_to: Option<i64>,
        limit: u32,
    ) -> StoreResult<Page> {
        self.page_after_start(filter, after_seq, up_to, limit)
            .await?
            .await
            .map_err(|_| StoreError::Closed)?
    }

    /// [`Store::page_after`], returning the receiver of the page (see [`Store::read_start`]).
    pub async fn page_after_start(
        &self,
        filter: SessionFilter,
        after_seq: i64,
        up_to: Option<i64>,
        limit: u32,
    ) -> StoreResult<oneshot::Receiver<StoreResult<Page>>> {
        self.read_start(move |conn| {
            let tx = conn.transaction()?;
            let events = {
                let mut stmt = tx.prepare_cached(&format!(
                    "{EVENT_SELECT} WHERE (?1 IS NULL OR session_id = ?1) AND sequence_id > ?2 \
                     AND sequence_id <= ?3 ORDER BY sequence_id LIMIT ?4"
                ))?;
                let up_to = up_to.unwrap_or(i64::MAX);
                stmt.query_map(
                    params![filter.as_param(), after_seq, up_to, limit],
                    event_from_row,
                )?
                .collect::<Result<Vec<_>, _>>()?
            };
            let snapshot_max: i64 = tx.query_row(MAX_SEQ_SQL, [], |r| r.get(0))?;
            tx.commit()?;
            Ok(Page {
                events,
                snapshot_max,
            })
        })
        .await
    }

    /// The cursor from which the newest `count` brackets matching `filter` follow.
    pub async fn cursor_before_last(&self, filter: SessionFilter, count: u32) -> StoreResult<i64> {
        self.read(move |conn| {
            let nth: Option<i64> = conn
                .prepare_cached(
                    "SELECT sequence_id FROM messages WHERE (?1 IS NULL OR session_id = ?1) \
                     ORDER BY sequence_id DESC LIMIT 1 OFFSET ?2",
                )?
                .query_row(params![filter.as_param(), count], |r| r.get(0))
                .optional()?;
            Ok(nth.unwrap_or(0))
        })
        .await
    }

    /// The largest committed `sequence_id`, 0 for an empty store.
    pub async fn max_sequence_id(&self) -> StoreResult<i64> {
        self.read(|conn| Ok(conn.query_row(MAX_SEQ_SQL, [], |r| r.get(0))?))
            .await
    }

    /// A session's runs, oldest first.
    pub async fn list_runs(&self, session_id: String) -> StoreResult<Vec<RunRow>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, session_id, state, client_msg_id, error_category, created_at, ended_at \
                 FROM runs WHERE session_id = ?1 ORDER BY created_at, id",
            )?;
            let rows = stmt
                .query_map([&session_id], |r| {
                    Ok(RunRow {
                        run_id: r.get(0)?,
                        session_id: r.get(1)?,
                        state: r.get(2)?,
                        client_msg_id: r.get(3)?,
                        error_category: r.get(4)?,
                        created_at_ms: r.get(5)?,
                        ended_at_ms: r.get(6)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    // ---- subscribers ----

    pub async fn insert_subscriber(&self, row: SubscriberRow) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO subscribers (id, type, session_id, forward_deltas, replay_mode, \
                 max_count, most_recent_sequence_id, deltas_dropped, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    row.subscriber_id,
                    row.kind,
                    row.session_id,
                    row.forward_deltas,
                    row.replay_mode,
                    row.max_count,
                    row.most_recent_sequence_id,
                    row.deltas_dropped,
                    row.created_at_ms,
                    row.updated_at_ms
                ],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn get_subscriber(&self, id: String) -> StoreResult<Option<SubscriberRow>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(&format!("{SUBSCRIBER_SELECT} WHERE id = ?1"))?
                .query_row([&id], subscriber_from_row)
                .optional()?)
        })
        .await
    }

    pub async fn list_subscribers(&self) -> StoreResult<Vec<SubscriberRow>> {
        self.read(|conn| {
            let mut stmt =
                conn.prepare_cached(&format!("{SUBSCRIBER_SELECT} ORDER BY created_at"))?;
            let rows = stmt
                .query_map([], subscriber_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn delete_subscriber(&self, id: String) -> StoreResult<bool> {
        self.write(move |conn| {
            Ok(conn.execute("DELETE FROM subscribers WHERE id = ?1", [&id])? > 0)
        })
        .await
    }

    /// Save many cursors in one transaction. A cursor only moves forward.
    pub async fn save_cursors(&self, cursors: Vec<CursorUpdate>) -> StoreResult<()> {
        self.write(move |conn| {
            let now = now_ms();
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE subscribers SET \
                     most_recent_sequence_id = max(most_recent_sequence_id, ?2), \
                     deltas_dropped = deltas_dropped + ?3, updated_at = ?4 WHERE id = ?1",
                )?;
                for c in &cursors {
                    stmt.execute(params![
                        c.subscriber_id,
                        c.sequence_id,
                        c.deltas_dropped,
                        now
                    ])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

/// A `runs` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRow {
    pub run_id: String,
    pub session_id: String,
    pub state: String,
    pub client_msg_id: Option<String>,
    pub error_category: Option<String>,
    pub created_at_ms: i64,
    pub ended_at_ms: Option<i64>,
}

/// A cursor to persist for one subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct CursorUpdate {
    pub subscriber_id: String,
    pub sequence_id: i64,
    /// Deltas dropped since the previous update (added to the stored count).
    pub deltas_dropped: i64,
}

const SESSION_SELECT: &str = "SELECT id, agent_type, native_session_id, cwd, parent_session_id, \
     title, state, created_at, updated_at, config FROM sessions";

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        session_id: r.get(0)?,
        agent_type: r.get(1)?,
        native_session_id: r.get(2)?,
        cwd: r.get(3)?,
        parent_session_id: r.get(4)?,
        title: r.get(5)?,
        state: r.get(6)?,
        created_at_ms: r.get(7)?,
        updated_at_ms: r.get(8)?,
        fork_of: r
            .get::<_, Option<String>>(9)?
            .and_then(|c| serde_json::from_str::<serde_json::Value>(&c).ok())
            .and_then(|c| c.get("fork_of").and_then(|f| f.as_str()).map(str::to_owned)),
    })
}

const EVENT_SELECT: &str =
    "SELECT sequence_id, message_id, session_id, run_id, kind, payload, created_at FROM messages";

fn event_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredEvent> {
    Ok(StoredEvent {
        sequence_id: r.get(0)?,
        message_id: r.get(1)?,
        session_id: r.get(2)?,
        run_id: r.get(3)?,
        kind: r.get(4)?,
        payload: r.get(5)?,
        created_at: r.get(6)?,
    })
}

const SUBSCRIBER_SELECT: &str = "SELECT id, type, session_id, forward_deltas, replay_mode, \
     max_count, most_recent_sequence_id, deltas_dropped, created_at, updated_at FROM subscribers";

fn subscriber_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SubscriberRow> {
    Ok(SubscriberRow {
        subscriber_id: r.get(0)?,
        kind: r.get(1)?,
        session_id: r.get(2)?,
        forward_deltas: r.get(3)?,
        replay_mode: r.get(4)?,
        max_count: r.get(5)?,
        most_recent_sequence_id: r.get(6)?,
        deltas_dropped: r.get(7)?,
        created_at_ms: r.get(8)?,
        updated_at_ms: r.get(9)?,
    })
}

fn reader_loop(mut conn: Connection, mut rx: mpsc::Receiver<ReadCmd>) {
    while let Some(ReadCmd::Job(job)) = rx.blocking_recv() {
        job(&mut conn);
    }
}

/// Rows committed between two checkpoint requests (about 1000 WAL pages of typical events).
const CHECKPOINT_EVERY_ROWS: usize = 4000;

/// Copy the WAL back into the database whenever the writer says it has grown, off the commit
/// path. PASSIVE never blocks the writer or readers; the writer reuses the WAL from its start
/// once a checkpoint has caught up. Ends when the writer ends (the sender drops).
fn checkpoint_loop(conn: Connection, pokes: std::sync::mpsc::Receiver<()>) {
    while pokes.recv().is_ok() {
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "WAL checkpoint failed");
        }
    }
    // A last full checkpoint at shutdown leaves a small WAL for the next start.
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
        tracing::debug!(error = %e, "final WAL checkpoint skipped");
    }
}

fn writer_loop(
    mut conn: Connection,
    mut rx: mpsc::Receiver<WriteCmd>,
    checkpoint: std::sync::mpsc::SyncSender<()>,
) {
    let mut rows_since_checkpoint = 0usize;
    // A command taken off the queue while gathering a group that is not an append; it runs
    // after the group commits, which keeps FIFO order.
    let mut held: Option<WriteCmd> = None;
    // Set once a group commit fails. Appends are pipelined, so events queued behind a failed
    // group belong to the same sessions: storing them would leave a gap in those sessions'
    // streams. Refusing every later append keeps "brackets are never dropped" true at the
    // price of availability (fail-stop); a restart of the host clears it.
    let mut stopped: Option<String> = None;
    loop {
        let first = match held.take() {
            Some(cmd) => cmd,
            None => match rx.blocking_recv() {
                Some(cmd) => cmd,
                None => break,
            },
        };
        match first {
            WriteCmd::Stop => break,
            WriteCmd::Exec(job) => job(&mut conn),
            WriteCmd::Append { reply, .. } if stopped.is_some() => {
                let reason = stopped.clone().unwrap_or_default();
                let _ignored = reply.send(Err(StoreError::AppendsStopped(reason)));
            }
            WriteCmd::Append { events, reply } => {
                let mut group = vec![(events, reply)];
                let mut rows: usize = group[0].0.len();
                while rows < MAX_GROUP_ROWS {
                    match rx.try_recv() {
                        Ok(WriteCmd::Append { events, reply }) => {
                            rows += events.len();
                            group.push((events, reply));
                        }
                        Ok(other) => {
                            held = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if let Err(reason) = commit_group(&mut conn, group) {
                    stopped = Some(reason);
                }
                rows_since_checkpoint += rows;
                if rows_since_checkpoint >= CHECKPOINT_EVERY_ROWS {
                    rows_since_checkpoint = 0;
                    // Full means one is already pending, which covers this one too.
                    let _pending = checkpoint.try_send(());
                }
            }
        }
    }
    tracing::debug!("store writer drained and stopped");
}

type AppendReply = oneshot::Sender<StoreResult<Vec<i64>>>;

/// Commit a group; on failure every caller gets the error and the reason is returned.
fn commit_group(
    conn: &mut Connection,
    group: Vec<(Vec<NewEvent>, AppendReply)>,
) -> Result<(), String> {
    let result = (|| -> rusqlite::Result<Vec<Vec<i64>>> {
        let tx = conn.transaction()?;
        let mut all = Vec::with_capacity(group.len());
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO messages (message_id, session_id, run_id, kind, payload, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (events, _) in &group {
                let mut seqs = Vec::with_capacity(events.len());
                for e in events {
                    stmt.execute(params![
                        &*e.message_id,
                        &*e.session_id,
                        e.run_id.as_deref(),
                        e.kind,
                        &*e.payload,
                        e.created_at
                    ])?;
                    seqs.push(tx.last_insert_rowid());
                }
                all.push(seqs);
            }
        }
        tx.commit()?;
        Ok(all)
    })();
    match result {
        Ok(all) => {
            for ((_, reply), seqs) in group.into_iter().zip(all) {
                // A dropped receiver means the publisher stopped caring; the rows are durable.
                let _ignored = reply.send(Ok(seqs));
            }
            Ok(())
        }
        Err(e) => {
            // The original error (with its SQLite code) is kept in the message.
            let message = e.to_string();
            tracing::error!(error = %message, groups = group.len(), "group commit failed; nothing of it was stored; event appends stop");
            for (_, reply) in group {
                let _ignored = reply.send(Err(StoreError::CommitFailed(message.clone())));
            }
            Err(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn event(session: &str, n: usize) -> NewEvent {
        NewEvent {
            message_id: format!("m{n}").into(),
            session_id: session.into(),
            run_id: None,
            kind: "text.end",
            payload: format!(r#"{{"k":"text.end","sessionId":"{session}","text":"{n}"}}"#).into(),
            created_at: now_ms(),
        }
    }

    #[tokio::test]
    async fn appends_get_increasing_ids_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let (store, threads) = Store::open(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let a = store
            .append(vec![event("a", 1), event("b", 2)])
            .await
            .unwrap();
        let b = store.append(vec![event("a", 3)]).await.unwrap();
        let a = a.await.unwrap().unwrap();
        let b = b.await.unwrap().unwrap();
        assert_eq!(a, vec![1, 2]);
        assert_eq!(b, vec![3]);
        let hist = store.history("a".into(), 0, 10).await.unwrap();
        assert_eq!(
            hist.iter().map(|e| e.sequence_id).collect::<Vec<_>>(),
            vec![1, 3]
        );
        let page = store
            .page_after(SessionFilter::One("b".into()), 0, None, 10)
            .await
            .unwrap();
        assert_eq!(page.events.len(), 1);
        assert_eq!(page.snapshot_max, 3);
        assert_eq!(
            store
                .cursor_before_last(SessionFilter::All, 2)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            store
                .cursor_before_last(SessionFilter::All, 10)
                .await
                .unwrap(),
            0
        );
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn cursors_only_move_forward() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let row = SubscriberRow {
            subscriber_id: "s".into(),
            kind: "local".into(),
            session_id: None,
            forward_deltas: false,
            replay_mode: "since_cursor".into(),
            max_count: 200,
            most_recent_sequence_id: 0,
            deltas_dropped: 0,
            created_at_ms: 1,
            updated_at_ms: 1,
        };
        store.insert_subscriber(row).await.unwrap();
        let update = |seq| CursorUpdate {
            subscriber_id: "s".into(),
            sequence_id: seq,
            deltas_dropped: 1,
        };
        store.save_cursors(vec![update(9)]).await.unwrap();
        store.save_cursors(vec![update(4)]).await.unwrap();
        let got = store.get_subscriber("s".into()).await.unwrap().unwrap();
        assert_eq!(got.most_recent_sequence_id, 9);
        assert_eq!(got.deltas_dropped, 2);
        drop(store);
        threads.shutdown().await;
    }
}
