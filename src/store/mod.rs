//! The SQLite store: the only module that imports `rusqlite`.
//!
//! SQLite calls block, so they never run on a tokio worker. The store owns OS threads, each
//! with its own connection to the same WAL database:
//! - the **writer** takes every mutation in FIFO order. Bracket appends are group-committed:
//!   whatever appends are queued when the writer wakes go into one transaction, and each
//!   caller's reply carries the `sequence_id`s assigned to its rows after the commit.
//! - the **readers** answer queries. WAL lets each read the last committed state while the
//!   writer writes and the other readers read. They serve two lanes, each a queue shared by its
//!   own threads: [`READERS`] take the short reads (history pages, lookups, listings), and
//!   [`REPLAY_READERS`] take catch-up pages, so one client's long catch-up never delays another
//!   client's `session.history`, and however many catch-ups run they never take every reader.
//! - the **checkpointer** copies the WAL back into the database off the commit path.
//!
//! Callers hold a cloneable [`Store`] handle. Every request queue is bounded, and a caller
//! awaits room (back-pressure, never a drop). [`StoreThreads::shutdown`] lets every thread
//! finish what is queued and joins them. Every SQL statement is in [`sql`], where a test holds
//! each to an index.
//!
//! **Health.** A failed commit (a full disk, an I/O error) makes the store *degraded*: from
//! then on every write is refused with [`StoreError::Unavailable`] without touching the
//! database, so nothing queued behind the failure can leave a gap in a session's stream. A
//! probe write is retried with capped backoff; when one commits, the store is healthy again by
//! itself. [`Store::health`] / [`Store::watch_health`] show the state (`host.status` and the
//! session layer read it). At open the database must pass SQLite's `quick_check`; one that
//! fails it is refused ([`StoreError::Corrupt`]) and never written to.

mod pairs;
mod runs;
mod schema;
mod search;
mod seen;
mod sessions;
mod sql;

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::protocol::states::SessionState;
use tokio::sync::{mpsc, oneshot};

pub use pairs::{PairedBotRow, PairingSecretRow};
pub use runs::{PermissionRow, QueuedRun, Resolve, RunInsert, StoredBaseline};
pub use schema::SCHEMA_VERSION;
pub use search::{
    DEFAULT_SEARCH_LIMIT, MAX_QUERY_BYTES, MAX_SEARCH_LIMIT, SearchHit, SearchQuery, Syntax,
};
pub use sessions::{
    DEFAULT_SESSION_PAGE, MAX_SESSION_PAGE, PREVIEW_CHARS, SessionListRow, SessionPage,
    SessionQuery,
};

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
    #[error("the store cannot commit ({0}); writes resume by themselves once it can")]
    Unavailable(String),
    #[error(
        "the database {path} is corrupt ({detail}); stop the host, move the file aside (or \
         recover it with `sqlite3 {path} .recover`) and start again"
    )]
    Corrupt { path: PathBuf, detail: String },
    /// A `session.list` cursor this store did not hand out (the caller's fault: invalid
    /// params at the edge).
    #[error("malformed cursor: {0}")]
    BadCursor(String),
    /// A `session.search` query that is none (empty, too long) or that FTS5 cannot parse (the
    /// caller's fault: invalid params at the edge).
    #[error("{0}")]
    BadQuery(String),
}

impl StoreError {
    /// A failure that says the database cannot be written now (full disk, I/O error,
    /// read-only, corrupt), as opposed to one request's own fault (a constraint, say).
    fn storage_failure(&self) -> Option<String> {
        let StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) = self else {
            return None;
        };
        use rusqlite::ErrorCode as C;
        matches!(
            e.code,
            C::DiskFull | C::SystemIoFailure | C::ReadOnly | C::DatabaseCorrupt | C::CannotOpen
        )
        .then(|| self.to_string())
    }
}

/// Whether the store can commit, for `host.status` and for refusing new work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreHealth {
    /// `ok` or `degraded`.
    pub state: &'static str,
    /// Why it is degraded: the first failed commit's error.
    pub error: Option<String>,
    /// When the current state began (ms since the epoch).
    pub since: i64,
    /// Outages since the store opened. A watcher that finds this higher than it last saw
    /// missed a whole outage (a watch keeps only the latest value: down and up again between
    /// two looks read as one change to `ok`).
    pub outages: u64,
}

impl StoreHealth {
    fn ok(outages: u64) -> StoreHealth {
        StoreHealth {
            state: "ok",
            error: None,
            since: now_ms(),
            outages,
        }
    }

    fn degraded(error: String, outages: u64) -> StoreHealth {
        StoreHealth {
            state: "degraded",
            error: Some(error),
            since: now_ms(),
            outages,
        }
    }

    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
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

/// A `sessions` row: the reply type clients read too.
pub use crate::protocol::replies::SessionInfo as SessionRow;

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
    /// What the subscriber may see, as JSON; the store keeps it without reading it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The client label it was added with (`subscriber.add` `client`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// One page of catch-up: the rows, and the largest `sequence_id` in the whole table at the
/// moment of the read, which is how far the reader has seen (for any filter).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub events: Vec<StoredEvent>,
    pub snapshot_max: i64,
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;
/// A write job gets the connection, or the reason the store takes no writes now, and a way
/// to degrade the store, which it calls for a storage failure before it replies (whoever sees
/// the refusal also sees the health say why).
type WriteJob = Box<dyn FnOnce(Result<&mut Connection, StoreError>, &dyn Fn(String)) + Send>;

enum WriteCmd {
    Append {
        events: Vec<NewEvent>,
        reply: oneshot::Sender<StoreResult<Vec<i64>>>,
    },
    Exec(WriteJob),
    /// While degraded: try one write, and be healthy again if it commits.
    Probe,
    /// A job run whatever the health (tests inject faults with it).
    #[cfg(test)]
    Unchecked(Job),
    /// Finish what is queued before this, then exit.
    Stop,
}

enum ReadCmd {
    Job(Job),
    /// Finish what is queued before this, then exit (one reader of the lane).
    Stop,
}

/// Read connections (and threads) for short reads.
const READERS: usize = 3;
/// Read connections (and threads) for catch-up pages.
const REPLAY_READERS: usize = 2;

/// Which readers a query waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// History pages, lookups, listings: what a client waits on interactively.
    Short,
    /// Catch-up pages (`page_after`), which a replay of a long history asks for one after
    /// another.
    Replay,
}

impl Lane {
    fn readers(self) -> usize {
        match self {
            Lane::Short => READERS,
            Lane::Replay => REPLAY_READERS,
        }
    }
}

/// The two read lanes' queues.
#[derive(Clone)]
struct Readers {
    short: mpsc::Sender<ReadCmd>,
    replay: mpsc::Sender<ReadCmd>,
}

impl Readers {
    fn lane(&self, lane: Lane) -> &mpsc::Sender<ReadCmd> {
        match lane {
            Lane::Short => &self.short,
            Lane::Replay => &self.replay,
        }
    }
}

/// A cloneable handle to the store threads.
#[derive(Clone)]
pub struct Store {
    writer: mpsc::Sender<WriteCmd>,
    readers: Readers,
    health: tokio::sync::watch::Receiver<StoreHealth>,
}

/// The store's threads. [`StoreThreads::shutdown`] stops them even while [`Store`] handles
/// are still held elsewhere; requests after that fail with [`StoreError::Closed`].
pub struct StoreThreads {
    handles: Vec<JoinHandle<()>>,
    writer: mpsc::Sender<WriteCmd>,
    readers: Readers,
}

impl StoreThreads {
    /// Let every thread finish what is queued, commit, close its connection and exit.
    pub async fn shutdown(self) {
        let _writer_gone = self.writer.send(WriteCmd::Stop).await;
        for lane in [Lane::Short, Lane::Replay] {
            // One stop per reader of the lane: each takes one and exits.
            for _ in 0..lane.readers() {
                let _reader_gone = self.readers.lane(lane).send(ReadCmd::Stop).await;
            }
        }
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

/// A reader connection's page cache (`PRAGMA cache_size`, negative: KiB).
const READER_CACHE_KIB: i64 = -1024;

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
        check_integrity(&write_conn, path)?;
        schema::migrate(&mut write_conn)?;
        // Checkpoints run on their own thread, so a commit never waits for one. The WAL hook
        // (set after the pragma, which would replace it) tells that thread how many pages the
        // WAL holds after every commit, appends and other writes alike.
        write_conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // A WAL reset after a checkpoint also gives its disk space back beyond this.
        write_conn.pragma_update(None, "journal_size_limit", WAL_LIMIT_BYTES)?;
        let (poke, pokes) = std::sync::mpsc::sync_channel::<i32>(1);
        write_conn.wal_hook(Some(
            move |wal: &mut rusqlite::hooks::Wal, pages: std::os::raw::c_int| {
                if pages >= WAL_HARD_PAGES {
                    // The checkpoint thread fell behind (a slow disk's fsyncs): checkpoint here,
                    // holding the write lock, so no new frame lands meanwhile and the next write
                    // starts the WAL over. This is the only back-pressure on the writer.
                    // Busy: the checkpoint thread is at it; the next commit looks again.
                    match wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE) {
                        Ok(_) => {}
                        Err(rusqlite::Error::SqliteFailure(e, _))
                            if e.code == rusqlite::ErrorCode::DatabaseBusy => {}
                        Err(e) => tracing::warn!(error = %e, "WAL checkpoint in the writer failed"),
                    }
                    return Ok(());
                }
                // Full means a poke is pending; the checkpoint thread reads the WAL size itself.
                let _pending = poke.try_send(pages);
                Ok(())
            },
        ))?;
        let checkpoint_conn = open_connection(path)?;
        // An idle-time checkpoint waits this long for a reader at most, then tries later.
        checkpoint_conn.busy_timeout(Duration::from_millis(200))?;
        // Every reader's connection is opened before any thread starts, so a failure here
        // leaves no thread behind. Each keeps a small page cache: the OS caches the file, and
        // five default caches (2 MiB each) would be most of an idle host's memory.
        let open_readers = |lane: Lane| -> StoreResult<Vec<Connection>> {
            (0..lane.readers())
                .map(|_| {
                    let conn = open_connection(path)?;
                    conn.pragma_update(None, "cache_size", READER_CACHE_KIB)?;
                    Ok(conn)
                })
                .collect()
        };
        let short_conns = open_readers(Lane::Short)?;
        let replay_conns = open_readers(Lane::Replay)?;

        let (writer_tx, writer_rx) = mpsc::channel(QUEUE_DEPTH);
        let spawn_err = |e: std::io::Error| StoreError::Open {
            path: path.to_owned(),
            source: Box::new(e),
        };
        let (health_tx, health) = tokio::sync::watch::channel(StoreHealth::ok(0));
        let probes = writer_tx.clone();
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                writer_loop(
                    write_conn,
                    writer_rx,
                    Health {
                        tx: health_tx,
                        probes,
                    },
                )
            })
            .map_err(spawn_err)?;
        let checkpointer = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpoint_conn, pokes))
            .map_err(spawn_err)?;
        let mut handles = vec![writer, checkpointer];
        let mut spawn_lane =
            |conns: Vec<Connection>, name: &str| -> StoreResult<mpsc::Sender<ReadCmd>> {
                let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
                let queue = Arc::new(std::sync::Mutex::new(rx));
                for (i, conn) in conns.into_iter().enumerate() {
                    let queue = queue.clone();
                    handles.push(
                        std::thread::Builder::new()
                            .name(format!("{name}-{i}"))
                            .spawn(move || reader_loop(conn, &queue))
                            .map_err(spawn_err)?,
                    );
                }
                Ok(tx)
            };
        let readers = Readers {
            short: spawn_lane(short_conns, "store-reader")?,
            replay: spawn_lane(replay_conns, "store-replay")?,
        };
        Ok((
            Store {
                writer: writer_tx.clone(),
                readers: readers.clone(),
                health,
            },
            StoreThreads {
                handles,
                writer: writer_tx,
                readers,
            },
        ))
    }

    /// Whether the store can commit now.
    pub fn health(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    /// Follow the store's health: changes when it becomes degraded and when it recovers.
    pub fn watch_health(&self) -> tokio::sync::watch::Receiver<StoreHealth> {
        self.health.clone()
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
        let job: WriteJob = Box::new(move |conn, degrade| {
            let mut result = conn.and_then(f);
            if let Some(why) = result.as_ref().err().and_then(StoreError::storage_failure) {
                degrade(why.clone());
                result = Err(StoreError::Unavailable(why));
            }
            // The caller may have gone away; the work is done either way.
            let _ignored = tx.send(result);
        });
        self.writer
            .send(WriteCmd::Exec(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    /// Run a query on a reader of the short lane.
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
        self.read_on(Lane::Short, f).await
    }

    /// Queue a query for a reader of `lane`.
    async fn read_on<T, F>(
        &self,
        lane: Lane,
        f: F,
    ) -> StoreResult<oneshot::Receiver<StoreResult<T>>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ignored = tx.send(f(conn));
        });
        self.readers
            .lane(lane)
            .send(ReadCmd::Job(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    // ---- sessions ----

    pub async fn insert_session(&self, row: SessionRow) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::INSERT_SESSION,
                params![
                    row.session_id,
                    row.agent_type,
                    row.native_session_id,
                    row.cwd,
                    row.parent_session_id,
                    row.title,
                    row.state.as_str(),
                    row.created_at_ms,
                    row.updated_at_ms,
                    config_json(&row),
                    row.created_at_ms.max(row.updated_at_ms)
                ],
            )?;
            // Events committed before the row existed (an import's history) touched no list
            // columns: they are read from the session's newest events (an index range).
            conn.execute(sql::INSERTED_LIST_COLUMNS, [&row.session_id])?;
            Ok(())
        })
        .await
    }

    /// Delete a session and its events; `false` if there was no such session.
    pub async fn delete_session(&self, session_id: String) -> StoreResult<bool> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            let n = tx.execute(sql::DELETE_SESSION, [&session_id])?;
            for rows in [
                // The index rows first: they are found through the session's messages.
                sql::DELETE_SESSION_FTS,
                sql::DELETE_SESSION_MESSAGES,
                sql::DELETE_SESSION_RUNS,
                sql::DELETE_SESSION_PERMISSIONS,
                sql::DELETE_SESSION_RULES,
                sql::DELETE_SESSION_BASELINE,
            ] {
                tx.execute(rows, [&session_id])?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    pub async fn get_session(&self, session_id: String) -> StoreResult<Option<SessionRow>> {
        self.read(move |conn| {
            let row = conn
                .prepare_cached(sql::GET_SESSION)?
                .query_row([&session_id], session_from_row)
                .optional()?;
            Ok(row)
        })
        .await
    }

    pub async fn list_sessions(&self) -> StoreResult<Vec<SessionRow>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(sql::LIST_SESSIONS)?;
            let rows = stmt
                .query_map([], session_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn count_sessions(&self) -> StoreResult<i64> {
        self.read(|conn| Ok(conn.query_row(sql::COUNT_SESSIONS, [], |r| r.get(0))?))
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
            let mut stmt = conn.prepare_cached(sql::HISTORY_AFTER)?;
            let rows = stmt
                .query_map(params![session_id, after_seq, limit], event_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The newest `limit` brackets of one session before `before_seq`, oldest first: a page
    /// read from the end backwards. The index is walked downwards from `before_seq` and stops
    /// at the limit, so the page costs the same at the end of a long session as at its start.
    pub async fn history_before(
        &self,
        session_id: String,
        before_seq: i64,
        limit: u32,
    ) -> StoreResult<Vec<StoredEvent>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql::HISTORY_BEFORE)?;
            let mut rows = stmt
                .query_map(params![session_id, before_seq, limit], event_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.reverse();
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
    /// Catch-up pages have readers of their own ([`Lane::Replay`]).
    pub async fn page_after_start(
        &self,
        filter: SessionFilter,
        after_seq: i64,
        up_to: Option<i64>,
        limit: u32,
    ) -> StoreResult<oneshot::Receiver<StoreResult<Page>>> {
        self.read_on(Lane::Replay, move |conn| {
            let tx = conn.transaction()?;
            let up_to = up_to.unwrap_or(i64::MAX);
            // Two statements, so a session's page is a range of its index.
            let events = match &filter {
                SessionFilter::One(session_id) => tx
                    .prepare_cached(sql::PAGE_AFTER_ONE)?
                    .query_map(
                        params![&**session_id, after_seq, up_to, limit],
                        event_from_row,
                    )?
                    .collect::<Result<Vec<_>, _>>()?,
                SessionFilter::All => tx
                    .prepare_cached(sql::PAGE_AFTER_ALL)?
                    .query_map(params![after_seq, up_to, limit], event_from_row)?
                    .collect::<Result<Vec<_>, _>>()?,
            };
            let snapshot_max: i64 = tx.query_row(sql::MAX_SEQ, [], |r| r.get(0))?;
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
            let nth: Option<i64> = match &filter {
                SessionFilter::One(session_id) => conn
                    .prepare_cached(sql::CURSOR_BEFORE_LAST_ONE)?
                    .query_row(params![&**session_id, count], |r| r.get(0)),
                SessionFilter::All => conn
                    .prepare_cached(sql::CURSOR_BEFORE_LAST_ALL)?
                    .query_row(params![count], |r| r.get(0)),
            }
            .optional()?;
            Ok(nth.unwrap_or(0))
        })
        .await
    }

    /// The largest committed `sequence_id`, 0 for an empty store.
    pub async fn max_sequence_id(&self) -> StoreResult<i64> {
        self.read(|conn| Ok(conn.query_row(sql::MAX_SEQ, [], |r| r.get(0))?))
            .await
    }

    /// A session's runs, oldest first.
    pub async fn list_runs(&self, session_id: String) -> StoreResult<Vec<RunRow>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql::LIST_RUNS)?;
            let rows = stmt
                .query_map([&session_id], runs::run_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    // ---- subscribers ----

    pub async fn insert_subscriber(&self, row: SubscriberRow) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::INSERT_SUBSCRIBER,
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
                    row.updated_at_ms,
                    row.scope,
                    row.client
                ],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn get_subscriber(&self, id: String) -> StoreResult<Option<SubscriberRow>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(sql::GET_SUBSCRIBER)?
                .query_row([&id], subscriber_from_row)
                .optional()?)
        })
        .await
    }

    pub async fn list_subscribers(&self) -> StoreResult<Vec<SubscriberRow>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(sql::LIST_SUBSCRIBERS)?;
            let rows = stmt
                .query_map([], subscriber_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// Replace a subscriber's scope (JSON text, opaque here); `false` when there is no such
    /// subscriber.
    pub async fn set_subscriber_scope(&self, id: String, scope: String) -> StoreResult<bool> {
        self.write(move |conn| {
            Ok(conn.execute(sql::SET_SUBSCRIBER_SCOPE, params![id, scope, now_ms()])? > 0)
        })
        .await
    }

    pub async fn delete_subscriber(&self, id: String) -> StoreResult<bool> {
        self.write(move |conn| Ok(conn.execute(sql::DELETE_SUBSCRIBER, [&id])? > 0))
            .await
    }

    /// Save many cursors in one transaction. A cursor only moves forward.
    pub async fn save_cursors(&self, cursors: Vec<CursorUpdate>) -> StoreResult<()> {
        self.write(move |conn| {
            let now = now_ms();
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(sql::SAVE_CURSOR)?;
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

/// A `runs` row: the reply type clients read too.
pub use crate::protocol::replies::RunInfo as RunRow;

/// A cursor to persist for one subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct CursorUpdate {
    pub subscriber_id: String,
    pub sequence_id: i64,
    /// Deltas dropped since the previous update (added to the stored count).
    pub deltas_dropped: i64,
}

/// `sessions.config`: JSON `{fork_of?, options?, binding?}` (opaque to SQL but for these
/// keys, which the updates below set one at a time). `None` when there is nothing to keep.
fn config_json(row: &SessionRow) -> Option<String> {
    let mut config = serde_json::Map::new();
    if let Some(fork_of) = &row.fork_of {
        config.insert("fork_of".into(), fork_of.clone().into());
    }
    if !row.options.is_empty()
        && let Ok(options) = serde_json::to_value(&row.options)
    {
        config.insert("options".into(), options);
    }
    if let Some(binding) = row
        .binding
        .as_ref()
        .and_then(|b| serde_json::to_value(b).ok())
    {
        config.insert("binding".into(), binding);
    }
    (!config.is_empty()).then(|| serde_json::Value::Object(config).to_string())
}

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    let config = r
        .get::<_, Option<String>>(9)?
        .and_then(|c| serde_json::from_str::<serde_json::Value>(&c).ok());
    let key = |name: &str| config.as_ref().and_then(|c| c.get(name)).cloned();
    Ok(SessionRow {
        session_id: r.get(0)?,
        agent_type: r.get(1)?,
        native_session_id: r.get(2)?,
        cwd: r.get(3)?,
        parent_session_id: r.get(4)?,
        title: r.get(5)?,
        // A state this build does not know (a newer host's) reads as idle.
        state: SessionState::parse(&r.get::<_, String>(6)?).unwrap_or_default(),
        created_at_ms: r.get(7)?,
        updated_at_ms: r.get(8)?,
        fork_of: key("fork_of").and_then(|f| f.as_str().map(str::to_owned)),
        // Options or a binding this build cannot read (a newer host's) read as none.
        options: key("options")
            .and_then(|o| serde_json::from_value(o).ok())
            .unwrap_or_default(),
        binding: key("binding").and_then(|b| serde_json::from_value(b).ok()),
    })
}

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
        scope: r.get(10)?,
        client: r.get(11)?,
    })
}

/// One reader of a lane. One idle reader waits on the lane's queue at a time (the others wait
/// for the lock); a job runs with the lock released, so the next job goes to the next idle
/// reader, never behind a running one.
fn reader_loop(mut conn: Connection, queue: &std::sync::Mutex<mpsc::Receiver<ReadCmd>>) {
    loop {
        let next = queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .blocking_recv();
        match next {
            Some(ReadCmd::Job(job)) => job(&mut conn),
            Some(ReadCmd::Stop) | None => break,
        }
    }
}

/// The WAL pages (4 KiB each) after which a checkpoint runs, whatever wrote them: a stream of
/// events and thousands of small row updates alike.
const CHECKPOINT_PAGES: i32 = 1000;
/// The WAL pages at which the writer checkpoints itself instead of leaving it to the checkpoint
/// thread (which keeps up on any ordinary disk): twice [`CHECKPOINT_PAGES`], 8 MiB.
const WAL_HARD_PAGES: i32 = 2 * CHECKPOINT_PAGES;
/// The WAL file is cut back to this after a checkpoint reset it.
const WAL_LIMIT_BYTES: i64 = 8 * 1024 * 1024;
/// A store that wrote and then went quiet this long is checkpointed and its WAL truncated.
const IDLE_CHECKPOINT: Duration = Duration::from_secs(1);

/// Copy the WAL back into the database off the commit path: when the writer's WAL hook says it
/// holds [`CHECKPOINT_PAGES`] (PASSIVE, which never blocks the writer or readers), and after
/// [`IDLE_CHECKPOINT`] without writes (TRUNCATE, which leaves an empty WAL file; it waits for
/// readers briefly and is tried again later if one is busy). Ends when the writer ends (the
/// WAL hook, and so the sender, drops with the writer's connection).
fn checkpoint_loop(conn: Connection, pokes: std::sync::mpsc::Receiver<i32>) {
    use std::sync::mpsc::RecvTimeoutError;
    // Wrote since the last complete idle checkpoint.
    let mut dirty = false;
    // The WAL size at which to checkpoint next; raised while a reader keeps one from finishing.
    let mut next_at = CHECKPOINT_PAGES;
    loop {
        match pokes.recv_timeout(IDLE_CHECKPOINT) {
            Ok(pages) => {
                dirty = true;
                if pages >= next_at {
                    next_at = match checkpoint(&conn, Checkpoint::Passive) {
                        Some((log, done)) if done < log => pages + CHECKPOINT_PAGES / 4,
                        _ => CHECKPOINT_PAGES,
                    };
                }
            }
            Err(RecvTimeoutError::Timeout) if dirty => {
                if let Some((log, done)) = checkpoint(&conn, Checkpoint::Truncate)
                    && done >= log
                {
                    dirty = false;
                    next_at = CHECKPOINT_PAGES;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // A last full checkpoint at shutdown leaves a small WAL for the next start.
    if checkpoint(&conn, Checkpoint::Truncate).is_none() {
        tracing::debug!("final WAL checkpoint skipped");
    }
}

/// Run one checkpoint: `(frames in the WAL, frames checkpointed)`, or `None` when it could not
/// run (busy, or an I/O error, which is logged).
#[derive(Debug, Clone, Copy)]
enum Checkpoint {
    Passive,
    Truncate,
}

fn checkpoint(conn: &Connection, mode: Checkpoint) -> Option<(i64, i64)> {
    let sql = match mode {
        Checkpoint::Passive => sql::CHECKPOINT_PASSIVE,
        Checkpoint::Truncate => sql::CHECKPOINT_TRUNCATE,
    };
    match conn.query_row(sql, [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    }) {
        Ok((0, log, done)) => Some((log, done)),
        Ok(_busy) => None,
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::DatabaseBusy =>
        {
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, ?mode, "WAL checkpoint failed");
            None
        }
    }
}

/// The writer's side of store health: the state it publishes, and a way to queue its own
/// recovery probes.
struct Health {
    tx: tokio::sync::watch::Sender<StoreHealth>,
    probes: mpsc::Sender<WriteCmd>,
}

/// Delays between recovery probes while degraded: from 100 ms, doubling, capped at 5 s.
fn probe_delays() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

impl Health {
    fn degraded(&self) -> Option<String> {
        self.tx.borrow().error.clone()
    }

    /// A commit failed: refuse writes from now on and start probing (once per outage).
    fn fail(&self, error: String) {
        if self.degraded().is_some() {
            return;
        }
        tracing::error!(error = %error, "the store cannot commit: degraded, writes are refused until a probe commits");
        let outage = self.tx.borrow().outages + 1;
        self.tx.send_replace(StoreHealth::degraded(error, outage));
        let probes = self.probes.clone();
        let watch = self.tx.subscribe();
        // Its own thread, so the writer never sleeps: it keeps answering (and refusing). It
        // probes for this outage only: one that ended is never probed for again.
        let spawned = std::thread::Builder::new()
            .name("store-probe".into())
            .spawn(move || {
                for delay in probe_delays() {
                    std::thread::sleep(delay);
                    let over = {
                        let now = watch.borrow();
                        now.is_ok() || now.outages != outage
                    };
                    if over || probes.blocking_send(WriteCmd::Probe).is_err() {
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "the store's recovery probe could not start");
        }
    }

    fn recovered(&self) {
        tracing::info!("a probe write committed: the store is healthy again");
        let outages = self.tx.borrow().outages;
        self.tx.send_replace(StoreHealth::ok(outages));
    }
}

/// One small write through the whole commit path (a WAL frame, an fsync).
fn probe(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    tx.execute(sql::CREATE_PROBE, [])?;
    tx.execute(sql::PROBE, [now_ms()])?;
    tx.commit()
}

/// Refuse a database that fails SQLite's `quick_check` (page structure, record formats,
/// index entry counts): writing to a broken file only spreads the damage.
fn check_integrity(conn: &Connection, path: &Path) -> StoreResult<()> {
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    let lines = conn
        .prepare(sql::QUICK_CHECK)
        .and_then(|mut stmt| {
            stmt.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| corrupt(e.to_string()))?;
    if lines.len() == 1 && lines[0] == "ok" {
        return Ok(());
    }
    Err(corrupt(lines.join("; ")))
}

/// `quick_check` of the database at `path` on a read-only connection of its own (`doctor`):
/// never creates, migrates or writes the file, so it is safe while a host holds it. A missing
/// file is [`StoreError::Open`]; one that fails the check, [`StoreError::Corrupt`] as at open.
pub fn check_file(path: &Path) -> StoreResult<()> {
    use rusqlite::OpenFlags;
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Open {
        path: path.to_owned(),
        source: Box::new(e),
    })?;
    conn.busy_timeout(Duration::from_secs(5))?;
    check_integrity(&conn, path)
}

fn writer_loop(mut conn: Connection, mut rx: mpsc::Receiver<WriteCmd>, health: Health) {
    // A command taken off the queue while gathering a group that is not an append; it runs
    // after the group commits, which keeps FIFO order.
    let mut held: Option<WriteCmd> = None;
    loop {
        let first = match held.take() {
            Some(cmd) => cmd,
            None => match rx.blocking_recv() {
                Some(cmd) => cmd,
                None => break,
            },
        };
        // While degraded nothing is written: appends are pipelined, so events queued behind a
        // failed group belong to the same sessions, and storing them would leave a gap in
        // those sessions' streams. The session layer closes what the outage cut short once
        // the store is back.
        let down = health.degraded();
        match first {
            WriteCmd::Stop => break,
            #[cfg(test)]
            WriteCmd::Unchecked(job) => job(&mut conn),
            WriteCmd::Probe => {
                if down.is_some() {
                    match probe(&mut conn) {
                        Ok(()) => health.recovered(),
                        Err(e) => tracing::debug!(error = %e, "store probe failed"),
                    }
                }
            }
            WriteCmd::Exec(job) => {
                // A write that fails for lack of space or I/O degrades the store: the next
                // commit would fail the same way.
                let degrade = |reason: String| health.fail(reason);
                match down {
                    Some(reason) => job(Err(StoreError::Unavailable(reason)), &degrade),
                    None => job(Ok(&mut conn), &degrade),
                }
                if !conn.is_autocommit() {
                    // A failed job left its transaction open: roll it back, or the next
                    // group would commit inside it.
                    if let Err(e) = conn.execute_batch("ROLLBACK") {
                        tracing::error!(error = %e, "rolling back a failed write failed");
                    }
                }
            }
            WriteCmd::Append { reply, .. } if down.is_some() => {
                let reason = down.unwrap_or_default();
                let _ignored = reply.send(Err(StoreError::Unavailable(reason)));
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
                commit_group(&mut conn, group, &health);
            }
        }
    }
    tracing::debug!("store writer drained and stopped");
}

type AppendReply = oneshot::Sender<StoreResult<Vec<i64>>>;

/// Commit a group. On failure the store is degraded first, then every caller gets the error:
/// whoever sees a refused event also sees the store's health say why.
fn commit_group(conn: &mut Connection, group: Vec<(Vec<NewEvent>, AppendReply)>, health: &Health) {
    let result = (|| -> rusqlite::Result<Vec<Vec<i64>>> {
        let tx = conn.transaction()?;
        let mut all = Vec::with_capacity(group.len());
        {
            let mut stmt = tx.prepare_cached(sql::INSERT_MESSAGE)?;
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
                // Searchable text commits with its event (`search.rs`).
                search::index_group(&tx, events.iter().zip(seqs.iter().copied()))?;
                all.push(seqs);
            }
        }
        // The list's activity order and previews commit with the events they follow from.
        sessions::touch_sessions(&tx, group.iter().flat_map(|(events, _)| events))?;
        tx.commit()?;
        Ok(all)
    })();
    match result {
        Ok(all) => {
            for ((_, reply), seqs) in group.into_iter().zip(all) {
                // A dropped receiver means the publisher stopped caring; the rows are durable.
                let _ignored = reply.send(Ok(seqs));
            }
        }
        Err(e) => {
            // The original error (with its SQLite code) is kept in the message.
            let message = e.to_string();
            tracing::error!(error = %message, groups = group.len(), "group commit failed; nothing of it was stored");
            health.fail(message.clone());
            for (_, reply) in group {
                let _ignored = reply.send(Err(StoreError::CommitFailed(message.clone())));
            }
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

    fn seqs(events: &[StoredEvent]) -> Vec<i64> {
        events.iter().map(|e| e.sequence_id).collect()
    }

    /// Paging backwards from past the end (2^53 - 1, what a JavaScript client sends) visits
    /// every bracket of the session once, newest page first, each page in ascending order,
    /// and never one of the session it is interleaved with.
    #[tokio::test]
    async fn history_before_pages_a_session_from_its_end_to_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        // 24 brackets of "a" between 16 of "b", in uneven runs.
        let mut batch = Vec::new();
        for n in 0..40 {
            batch.push(event(if n % 5 < 3 && n < 38 { "a" } else { "b" }, n));
        }
        store.append(batch).await.unwrap().await.unwrap().unwrap();
        let all_a = seqs(&store.history("a".into(), 0, 100).await.unwrap());
        assert_eq!(all_a.len(), 24);
        for limit in [1, 5, 7, 24, 25] {
            let mut before = 9_007_199_254_740_991_i64;
            let mut pages: Vec<Vec<i64>> = Vec::new();
            loop {
                let page = store
                    .history_before("a".into(), before, limit)
                    .await
                    .unwrap();
                assert!(page.iter().all(|e| e.session_id == "a"));
                let page = seqs(&page);
                assert!(page.len() <= limit as usize, "limit {limit}: {page:?}");
                assert!(page.windows(2).all(|w| w[0] < w[1]), "{page:?}");
                assert!(page.iter().all(|&s| s < before), "{page:?} before {before}");
                let Some(&first) = page.first() else { break };
                before = first;
                pages.push(page);
            }
            // Full pages, except the oldest (the start of the session).
            let (oldest, full) = pages.split_last().unwrap();
            assert!(full.iter().all(|p| p.len() == limit as usize), "{pages:?}");
            assert!(!oldest.is_empty());
            let visited: Vec<i64> = pages.iter().rev().flatten().copied().collect();
            assert_eq!(visited, all_a, "limit {limit}");
        }
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn history_before_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let ids = store
            .append(vec![
                event("a", 1),
                event("b", 2),
                event("a", 3),
                event("a", 4),
            ])
            .await
            .unwrap()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ids, vec![1, 2, 3, 4]);
        let before = |session: &str, seq: i64, limit: u32| {
            let store = store.clone();
            let session = session.to_owned();
            async move { seqs(&store.history_before(session, seq, limit).await.unwrap()) }
        };
        // The bound is exclusive, whichever session's bracket it names.
        assert_eq!(before("a", 4, 10).await, vec![1, 3]);
        assert_eq!(before("a", 3, 10).await, vec![1]);
        assert_eq!(before("a", 2, 10).await, vec![1]);
        assert_eq!(before("a", 5, 10).await, vec![1, 3, 4]);
        assert_eq!(before("a", i64::MAX, 10).await, vec![1, 3, 4]);
        // Nothing before the first bracket, at or below zero, or of another session.
        assert_eq!(before("a", 1, 10).await, Vec::<i64>::new());
        assert_eq!(before("a", 0, 10).await, Vec::<i64>::new());
        assert_eq!(before("a", -5, 10).await, Vec::<i64>::new());
        assert_eq!(before("nobody", i64::MAX, 10).await, Vec::<i64>::new());
        assert_eq!(before("b", 2, 10).await, Vec::<i64>::new());
        assert_eq!(before("b", 3, 10).await, vec![2]);
        // The limit keeps the newest, still in ascending order.
        assert_eq!(before("a", i64::MAX, 2).await, vec![3, 4]);
        assert_eq!(before("a", i64::MAX, 1).await, vec![4]);
        assert_eq!(before("a", i64::MAX, 0).await, Vec::<i64>::new());
        drop(store);
        threads.shutdown().await;
    }

    /// Both history queries read one session's range of `messages_session_seq`, in the
    /// index's order (no sort), whichever way they walk it.
    #[test]
    fn history_queries_use_the_session_sequence_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        schema::migrate(&mut conn).unwrap();
        for i in 0..500 {
            conn.execute(
                "INSERT INTO messages (message_id, session_id, kind, payload, created_at) \
                 VALUES (?1, ?2, 'text.end', '{}', 1)",
                params![format!("m{i}"), format!("s{}", i % 7)],
            )
            .unwrap();
        }
        for (filter, range) in [
            (sql::HISTORY_AFTER, "sequence_id>?"),
            (sql::HISTORY_BEFORE, "sequence_id<?"),
        ] {
            let mut stmt = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {filter}"))
                .unwrap();
            let plan: Vec<String> = stmt
                .query_map(params!["s3", 250, 10], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let plan = plan.join("\n");
            assert_eq!(
                plan,
                format!(
                    "SEARCH messages USING INDEX messages_session_seq (session_id=? AND {range})"
                ),
                "{filter}"
            );
        }
    }

    /// Hold one reader of `lane` in a read that waits until the returned sender is dropped;
    /// returns once a reader is in it, with the read's answer.
    async fn hold_reader(
        store: &Store,
        lane: Lane,
    ) -> (
        std::sync::mpsc::Sender<()>,
        oneshot::Receiver<StoreResult<()>>,
    ) {
        let (entered_tx, entered) = oneshot::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let done = store
            .read_on(lane, move |_conn| {
                entered_tx.send(()).unwrap();
                // Err once the test drops its sender: the read ends.
                let _released = released.recv();
                Ok(())
            })
            .await
            .unwrap();
        entered.await.unwrap();
        (release, done)
    }

    /// Every catch-up reader and all short readers but one are held in long reads: a short
    /// read issued after them is answered while they still run, and a catch-up page queued
    /// behind them is answered once they end. Shutdown joins every reader.
    #[tokio::test]
    async fn a_long_read_never_delays_a_short_one() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        store
            .append(vec![event("a", 1), event("b", 2)])
            .await
            .unwrap()
            .await
            .unwrap()
            .unwrap();
        let mut held = Vec::new();
        for _ in 0..REPLAY_READERS {
            held.push(hold_reader(&store, Lane::Replay).await);
        }
        for _ in 0..READERS - 1 {
            held.push(hold_reader(&store, Lane::Short).await);
        }
        let page = store
            .page_after_start(SessionFilter::One("a".into()), 0, None, 10)
            .await
            .unwrap();
        // Bounded, so a regression fails instead of hanging; nothing here is timed.
        let wait = Duration::from_secs(20);
        for _ in 0..3 {
            let hist = tokio::time::timeout(wait, store.history("a".into(), 0, 10))
                .await
                .expect("a short read waited behind the long ones")
                .unwrap();
            assert_eq!(seqs(&hist), vec![1]);
        }
        for (_, done) in &mut held {
            assert!(
                matches!(done.try_recv(), Err(oneshot::error::TryRecvError::Empty)),
                "the long reads are still running"
            );
        }
        let mut page = page;
        assert!(matches!(
            page.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        for (release, done) in held {
            drop(release);
            done.await.unwrap().unwrap();
        }
        let page = tokio::time::timeout(wait, page)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(seqs(&page.events), vec![1]);
        drop(store);
        threads.shutdown().await;
    }

    /// Cap (or uncap) the database's size on the writer's connection: a real SQLITE_FULL.
    async fn max_pages(store: &Store, pages: Option<i64>) {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let pages = pages.unwrap_or_else(|| {
                conn.query_row("PRAGMA page_count", [], |r| r.get(0))
                    .unwrap()
            });
            conn.pragma_update(None, "max_page_count", pages).unwrap();
            tx.send(()).unwrap();
        });
        store
            .writer
            .send(WriteCmd::Unchecked(job))
            .await
            .ok()
            .unwrap();
        rx.await.unwrap();
    }

    fn big(session: &str, n: usize) -> NewEvent {
        NewEvent {
            payload: format!(
                r#"{{"k":"text.end","sessionId":"{session}","text":"{}"}}"#,
                "x".repeat(64 * 1024)
            )
            .into(),
            ..event(session, n)
        }
    }

    #[tokio::test]
    async fn a_failed_commit_degrades_the_store_until_a_probe_commits() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let first = store.append(vec![event("a", 1)]).await.unwrap();
        assert_eq!(first.await.unwrap().unwrap(), vec![1]);
        assert!(store.health().is_ok());
        let mut health = store.watch_health();

        // The disk is full: no page can be added.
        max_pages(&store, None).await;
        let failed = store.append(vec![big("a", 2), big("a", 3)]).await.unwrap();
        assert!(matches!(
            failed.await.unwrap(),
            Err(StoreError::CommitFailed(_))
        ));
        let down = store.health();
        assert_eq!(down.state, "degraded");
        assert!(
            down.error.as_deref().unwrap_or_default().contains("full"),
            "{down:?}"
        );
        // Everything after is refused without touching the file, appends and rows alike.
        let refused = store.append(vec![event("a", 4)]).await.unwrap();
        assert!(matches!(
            refused.await.unwrap(),
            Err(StoreError::Unavailable(_))
        ));
        let row = store.insert_session(SessionRow {
            session_id: "s".into(),
            agent_type: "claude".into(),
            native_session_id: None,
            cwd: "/".into(),
            parent_session_id: None,
            title: None,
            state: crate::protocol::states::SessionState::Idle,
            created_at_ms: 1,
            updated_at_ms: 1,
            fork_of: None,
            options: Default::default(),
            binding: None,
        });
        assert!(matches!(row.await, Err(StoreError::Unavailable(_))));

        // Space again: a probe commits and the store is healthy by itself.
        max_pages(&store, Some(1_000_000)).await;
        let back = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                health.changed().await.unwrap();
                if health.borrow_and_update().is_ok() {
                    break;
                }
            }
        })
        .await;
        assert!(
            back.is_ok(),
            "the store did not recover: {:?}",
            store.health()
        );
        let after = store.append(vec![event("a", 5)]).await.unwrap();
        let seqs = after.await.unwrap().unwrap();
        let hist = store.history("a".into(), 0, 10).await.unwrap();
        let texts: Vec<_> = hist.iter().map(|e| e.message_id.as_str()).collect();
        assert_eq!(texts, vec!["m1", "m5"], "only what was committed is stored");
        assert_eq!(hist[1].sequence_id, seqs[0]);
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn many_small_writes_keep_the_wal_small_and_idle_truncates_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let wal = dir.path().join("t.db-wal");
        let (store, threads) = Store::open(&path).unwrap();
        let mut largest = 0;
        for i in 0..3000 {
            store
                .insert_subscriber(SubscriberRow {
                    subscriber_id: format!("s{i}"),
                    kind: "local".into(),
                    session_id: None,
                    forward_deltas: false,
                    replay_mode: "none".into(),
                    max_count: 200,
                    most_recent_sequence_id: 0,
                    deltas_dropped: 0,
                    created_at_ms: 1,
                    updated_at_ms: 1,
                    scope: None,
                    client: None,
                })
                .await
                .unwrap();
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        // 3000 transactions of a few pages each would be ~40 MiB of WAL unchecked.
        assert!(
            largest < 2 * WAL_LIMIT_BYTES as u64,
            "the WAL grew to {largest} bytes"
        );
        // Idle: the WAL is checkpointed and truncated (waited for, bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::fs::metadata(&wal).map_or(0, |m| m.len()) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle WAL was not truncated"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(store.list_subscribers().await.unwrap().len(), 3000);
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn a_corrupt_database_is_refused_and_not_written() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let (store, threads) = Store::open(&path).unwrap();
        for chunk in 0..20 {
            let events = (0..50).map(|i| big("a", chunk * 50 + i)).collect();
            store.append(events).await.unwrap().await.unwrap().unwrap();
        }
        drop(store);
        threads.shutdown().await;
        check_file(&path).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(SeekFrom::Start(len / 2)).unwrap();
        file.write_all(&[0xA5; 8192]).unwrap();
        drop(file);
        let before = std::fs::read(&path).unwrap();
        // `doctor`'s read-only check finds it too, and writes nothing either.
        assert!(
            matches!(check_file(&path), Err(StoreError::Corrupt { .. })),
            "check_file passed a corrupt file"
        );
        assert!(
            std::fs::read(&path).unwrap() == before,
            "check_file wrote the corrupt file"
        );
        assert!(matches!(
            check_file(&dir.path().join("missing.db")),
            Err(StoreError::Open { .. })
        ));
        assert!(!dir.path().join("missing.db").exists());
        match Store::open(&path) {
            Err(StoreError::Corrupt {
                path: named,
                detail,
            }) => {
                assert_eq!(named, path);
                assert!(!detail.is_empty());
            }
            Err(e) => panic!("expected Corrupt, got {e}"),
            Ok(_) => panic!("a corrupt database was opened"),
        }
        assert!(
            std::fs::read(&path).unwrap() == before,
            "the corrupt file was written"
        );
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
            scope: Some(r#"{"sessions":["a"]}"#.into()),
            client: Some("follow".into()),
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
        assert_eq!(got.scope.as_deref(), Some(r#"{"sessions":["a"]}"#));
        assert_eq!(got.client.as_deref(), Some("follow"));
        drop(store);
        threads.shutdown().await;
    }
}
