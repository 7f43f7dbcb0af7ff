//! Schema and migrations. `schema.sql` at the repository root holds the tables of version 3; it
//! is embedded here and applied when `PRAGMA user_version` is 0. Each later version appends a
//! step to [`MIGRATIONS`]; a database from a newer build is refused rather than guessed at.

use rusqlite::Connection;

use super::{StoreError, StoreResult};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 13;

/// Migration `i` takes a database from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../schema.sql"),
    MIGRATION_2,
    MIGRATION_3,
    MIGRATION_4,
    MIGRATION_5,
    MIGRATION_6,
    MIGRATION_7,
    MIGRATION_8,
    MIGRATION_9,
    MIGRATION_10,
    MIGRATION_11,
    MIGRATION_12,
    MIGRATION_13,
];

/// Version 13: pairing remote bots (issue 21, `crate::seal::pairs`). `pairing_secrets` is the
/// audit trail of every `pair.create` and its single-use mark: the secret's id and SHA-256
/// (never the secret, which lives in the host's memory only until it is used or expires), the
/// scope a bot paired with it gets (JSON), the code's label, and when it was made, expires and
/// was used. `paired_bots` holds every bot that paired, by `bot_id` (the id of its static
/// key): the key, its name, its scope (JSON), when it paired, was last seen and was revoked (a
/// revoked bot keeps its row, so `pair.list` still shows it). Every read is by primary key,
/// but `pair.list`'s, which reads the few rows whole.
const MIGRATION_13: &str = "
CREATE TABLE IF NOT EXISTS pairing_secrets (
    secret_id   TEXT PRIMARY KEY,
    secret_hash BLOB NOT NULL,
    scope       TEXT NOT NULL,
    name        TEXT,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
CREATE TABLE IF NOT EXISTS paired_bots (
    bot_id       TEXT PRIMARY KEY,
    public_key   BLOB NOT NULL,
    name         TEXT NOT NULL,
    scope        TEXT NOT NULL,
    paired_at    INTEGER NOT NULL,
    last_seen_at INTEGER,
    revoked_at   INTEGER
);
";

/// Version 12: when each subscriber was last seen (`last_seen_at`, ms): its last connection or
/// `subscriber.grant`. A subscriber away longer than `subscriber_max_idle_days` is removed,
/// with its cursor (which lives in its row). Rows from before: seen at their last change (a
/// cursor save moves `updated_at`, so a subscriber that was following counts from then). The
/// index serves the pruning's range.
const MIGRATION_12: &str = "
ALTER TABLE subscribers ADD COLUMN last_seen_at INTEGER;
UPDATE subscribers SET last_seen_at = max(created_at, updated_at);
CREATE INDEX IF NOT EXISTS subscribers_last_seen ON subscribers (last_seen_at);
";

/// Version 11: full-text search (`session.search`, `store/search.rs`). `messages_fts` is an
/// FTS5 table keyed by `sequence_id` (its rowid) holding each searchable bracket's text:
/// `user.text` and `text.end` (the prompt's and the answer's `text`), and `tool.call.end` (the
/// tool's name, then every string of its input: the command, the path). It keeps its own copy
/// of the text, so `snippet()` works without reading `messages`; the append path writes its
/// row in the same transaction as the event's, and a session's rows go with the session. The
/// backfill indexes every such bracket already stored, as the append path would have (a row
/// whose payload is not JSON is skipped). `unicode61 remove_diacritics 2`: case and accents
/// fold (`cafe` finds `Café`), no stemming (code identifiers stay as written).
const MIGRATION_11: &str = "
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts
    USING fts5(text, tokenize = 'unicode61 remove_diacritics 2');
INSERT INTO messages_fts (rowid, text)
SELECT sequence_id, t FROM (
    SELECT sequence_id, CASE WHEN json_valid(payload) THEN
               CASE WHEN json_type(payload, '$.text') = 'text'
                    THEN json_extract(payload, '$.text') END
           END AS t
    FROM messages WHERE kind IN ('user.text', 'text.end'))
WHERE t IS NOT NULL AND t <> '';
INSERT INTO messages_fts (rowid, text)
SELECT sequence_id, t FROM (
    SELECT sequence_id, CASE WHEN json_valid(payload) THEN trim(
               coalesce(json_extract(payload, '$.name'), '') || ' ' ||
               coalesce((SELECT group_concat(value, ' ') FROM json_tree(payload, '$.input')
                         WHERE type = 'text'), ''))
           END AS t
    FROM messages WHERE kind = 'tool.call.end')
WHERE t IS NOT NULL AND t <> '';
";

/// Version 10: every query of the store reads an index (a test holds each statement to it).
/// `permissions_state`: the pending requests of every session are a range of it, not a scan of
/// every request ever made.
const MIGRATION_10: &str = "
CREATE INDEX IF NOT EXISTS permissions_state ON permissions (state, created_at);
";

/// Version 9: a prompt's attachments. `runs.attachments`, the attachments `session.send` took
/// with the prompt (checked and copied into the host's home) as a JSON array, written with the
/// row, so a queued prompt that runs after a restart still hands them to the agent. NULL: none
/// (every row of earlier versions).
const MIGRATION_9: &str = "
ALTER TABLE runs ADD COLUMN attachments TEXT;
";

/// Version 8: who sent a prompt. `subscribers.client`, the label a loopback client registered
/// with (`subscriber.add` `client`: `web`, `follow`, an app's own); `runs.sender`, a prompt's
/// sender as JSON (opaque to the store), so a queued prompt that runs after a restart still
/// says who sent it. Rows of earlier versions have neither.
const MIGRATION_8: &str = "
ALTER TABLE subscribers ADD COLUMN client TEXT;
ALTER TABLE runs ADD COLUMN sender TEXT;
";

/// Version 7: `permission_rules`, the "allow always" options accepted in a session (one per
/// answered request): what its agent was told to keep allowing, by whom and when, so every
/// client sees why a later matching tool ran without asking. Deleted with the session.
const MIGRATION_7: &str = "
CREATE TABLE IF NOT EXISTS permission_rules (
    session_id  TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    tool        TEXT NOT NULL,
    option_id   TEXT NOT NULL,
    label       TEXT NOT NULL,
    description TEXT NOT NULL,
    by          TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (session_id, request_id)
);
";

/// Version 6: the follow-up queue is durable. `runs.prompt` holds the prompt's text (written
/// when the run is taken, changed by `queue.edit`), `runs.queue_pos` a queued run's place in its
/// session's queue (lower first; ties in the order the runs were taken). A host that starts
/// finds every `queued` run of a session with its text and queues it again, in that order.
/// Runs of earlier versions have neither: a queued one of those is dropped at the next start,
/// as before.
const MIGRATION_6: &str = "
ALTER TABLE runs ADD COLUMN prompt TEXT;
ALTER TABLE runs ADD COLUMN queue_pos INTEGER;
CREATE INDEX IF NOT EXISTS runs_state ON runs (state);
";

/// Version 5: `runs.message`, the sentence the run's end (or its retirement from the queue)
/// said, so that `session.run` answers "did my prompt run, and how did it end" from the row
/// alone — whether a failed prompt was sent at all is in it. Earlier runs have none. A run is
/// found by its `client_msg_id` through the unique index `runs_client_msg` that version 1 has.
const MIGRATION_5: &str = "
ALTER TABLE runs ADD COLUMN message TEXT;
";

/// Version 4: what the paged session list reads without touching `messages`, and a
/// subscriber's scope.
/// - `sessions.last_activity_at`: the newest of the row's `updated_at` and its last event's
///   `created_at`, kept by the append path from now on. NOT NULL with a default, so the keyset
///   comparison never meets a NULL.
/// - `sessions.preview`: the first 160 characters of the newest `user.text` / `text.end` text.
///   The backfill looks at a session's last 256 events only (an index range, never a scan of
///   `messages`); a session whose last text is older than that starts without a preview.
/// - one index per filter the list takes, each ending in the list's order, so a filtered page
///   is an index range too.
/// - `subscribers.scope`: JSON, opaque to the store.
///
/// `schema.sql` still describes version 3; on a fresh database this step adds the columns.
const MIGRATION_4: &str = "
ALTER TABLE sessions ADD COLUMN last_activity_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN preview TEXT;
ALTER TABLE subscribers ADD COLUMN scope TEXT;
UPDATE sessions SET last_activity_at = max(updated_at, coalesce(
    (SELECT created_at FROM messages WHERE session_id = sessions.id
     ORDER BY sequence_id DESC LIMIT 1), 0));
UPDATE sessions SET preview = (
    SELECT CASE WHEN json_valid(payload) THEN
               CASE WHEN json_type(payload, '$.text') = 'text'
                    THEN substr(json_extract(payload, '$.text'), 1, 160) END
           END
    FROM messages
    WHERE session_id = sessions.id AND kind IN ('user.text', 'text.end')
      AND sequence_id >= coalesce(
          (SELECT sequence_id FROM messages WHERE session_id = sessions.id
           ORDER BY sequence_id DESC LIMIT 1 OFFSET 255), 0)
    ORDER BY sequence_id DESC LIMIT 1);
CREATE INDEX IF NOT EXISTS sessions_activity ON sessions (last_activity_at DESC, id);
CREATE INDEX IF NOT EXISTS sessions_state_activity
    ON sessions (state, last_activity_at DESC, id);
CREATE INDEX IF NOT EXISTS sessions_agent_activity
    ON sessions (agent_type, last_activity_at DESC, id);
CREATE INDEX IF NOT EXISTS sessions_cwd_activity ON sessions (cwd, last_activity_at DESC, id);
";

/// Version 3: baselines with the file's device and inode. No earlier version wrote a baseline,
/// so the table is rebuilt, not altered.
const MIGRATION_3: &str = "
DROP TABLE IF EXISTS session_baselines;
CREATE TABLE session_baselines (
    session_id    TEXT PRIMARY KEY,
    file_path     TEXT NOT NULL,
    dev           INTEGER NOT NULL,
    inode         INTEGER NOT NULL,
    size          INTEGER NOT NULL,
    line_count    INTEGER NOT NULL,
    last_entry_id TEXT,
    mtime_ns      INTEGER NOT NULL,
    recorded_at   INTEGER NOT NULL
);
";

/// Version 2: durable permission requests. `schema.sql` holds the same table, so on a fresh
/// database this step finds it there.
const MIGRATION_2: &str = "
CREATE TABLE IF NOT EXISTS permissions (
    session_id  TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    run_id      TEXT,
    tool        TEXT NOT NULL,
    input       TEXT NOT NULL,
    state       TEXT NOT NULL,
    decision    TEXT,
    resolved_by TEXT,
    created_at  INTEGER NOT NULL,
    resolved_at INTEGER,
    PRIMARY KEY (session_id, request_id)
);
";

pub(super) fn migrate(conn: &mut Connection) -> StoreResult<()> {
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, step) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(found).unwrap_or(0))
    {
        let tx = conn.transaction()?;
        tx.execute_batch(step)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)?;
        tx.commit()?;
        tracing::info!(version = index + 1, "store schema migrated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrates_once_and_refuses_newer() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        assert_eq!(MIGRATIONS.len() as i64, SCHEMA_VERSION);
        for table in [
            "sessions",
            "messages",
            "runs",
            "subscribers",
            "session_baselines",
            "agents",
            "permissions",
            "permission_rules",
            "pairing_secrets",
            "paired_bots",
        ] {
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type='table' AND name=?1",
                    [table],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n, 1, "{table}");
        }
        // Version 8: who sent a prompt.
        conn.prepare("SELECT client FROM subscribers").unwrap();
        conn.prepare("SELECT sender FROM runs").unwrap();
        // Version 9: a prompt's attachments.
        conn.prepare("SELECT attachments FROM runs").unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        assert!(matches!(
            migrate(&mut conn),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn a_version_1_database_gains_the_permissions_table() {
        let mut conn = Connection::open_in_memory().unwrap();
        // Version 1: `schema.sql` without the tables later versions added.
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.execute_batch("DROP TABLE permissions; PRAGMA user_version = 1;")
            .unwrap();
        migrate(&mut conn).unwrap();
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'permissions'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 1);
    }

    /// A version 10 database with prompts, answers and a tool call: after the upgrade every
    /// one of them is searchable (the backfill indexes what the append path would), a broken
    /// payload is skipped, and the first append after it is indexed too.
    #[tokio::test]
    async fn version_11_backfills_the_search_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = Connection::open(&path).unwrap();
            for step in &MIGRATIONS[..10] {
                conn.execute_batch(step).unwrap();
            }
            conn.execute_batch("PRAGMA user_version = 10;").unwrap();
            let add = |session: &str, kind: &str, payload: &str| {
                conn.execute(
                    "INSERT INTO messages (message_id, session_id, kind, payload, created_at) \
                     VALUES ('m', ?1, ?2, ?3, 1)",
                    rusqlite::params![session, kind, payload],
                )
                .unwrap();
            };
            add(
                "a",
                "user.text",
                r#"{"k":"user.text","text":"find the aardvark"}"#,
            );
            add(
                "a",
                "text.end",
                r#"{"k":"text.end","text":"the aardvark sleeps"}"#,
            );
            add(
                "b",
                "tool.call.end",
                r#"{"k":"tool.call.end","callId":"c","name":"Bash","input":{"command":"aardvark --version","n":3}}"#,
            );
            add(
                "b",
                "tool.exec.end",
                r#"{"k":"tool.exec.end","output":"aardvark 1.0"}"#,
            );
            add("b", "text.end", "not json aardvark");
            add("b", "text.end", r#"{"k":"text.end","text":""}"#);
        }
        let (store, threads) = crate::store::Store::open(&path).unwrap();
        let q = |query: &str| crate::store::SearchQuery {
            query: query.into(),
            syntax: crate::store::Syntax::Words,
            sessions: None,
            limit: 10,
        };
        let mut hits: Vec<(i64, String)> = store
            .search(q("aardvark"))
            .await
            .unwrap()
            .into_iter()
            .map(|h| (h.sequence_id, h.kind))
            .collect();
        hits.sort();
        assert_eq!(
            hits,
            [
                (1, "user.text".to_owned()),
                (2, "text.end".to_owned()),
                (3, "tool.call.end".to_owned())
            ]
        );
        // The backfilled text is the append path's text.
        let call = store.search(q("bash")).await.unwrap();
        assert_eq!(call.len(), 1);
        assert_eq!(call[0].snippet, "**Bash** aardvark --version");
        drop(store);
        threads.shutdown().await;
    }

    /// A version 11 database's subscribers count as seen at their last change; a subscriber
    /// added after the upgrade is never seen until it connects.
    #[test]
    fn version_12_backfills_last_seen() {
        let mut conn = Connection::open_in_memory().unwrap();
        for step in &MIGRATIONS[..11] {
            conn.execute_batch(step).unwrap();
        }
        conn.execute_batch(
            "PRAGMA user_version = 11;
             INSERT INTO subscribers (id, type, created_at, updated_at) VALUES ('s', 'local', 5, 9);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let seen: i64 = conn
            .query_row("SELECT last_seen_at FROM subscribers", [], |r| r.get(0))
            .unwrap();
        assert_eq!(seen, 9);
    }

    /// A version 12 database with sessions and subscribers gains the pairing tables, empty,
    /// and keeps what it had.
    #[test]
    fn version_13_adds_the_pairing_tables() {
        let mut conn = Connection::open_in_memory().unwrap();
        for step in &MIGRATIONS[..12] {
            conn.execute_batch(step).unwrap();
        }
        conn.execute_batch(
            "PRAGMA user_version = 12;
             INSERT INTO subscribers (id, type, created_at, updated_at) VALUES ('s', 'local', 5, 9);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        for table in ["pairing_secrets", "paired_bots"] {
            let n: i64 = conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 0, "{table}");
        }
        let subscribers: i64 = conn
            .query_row("SELECT count(*) FROM subscribers", [], |r| r.get(0))
            .unwrap();
        assert_eq!(subscribers, 1);
        conn.execute(
            "INSERT INTO paired_bots (bot_id, public_key, name, scope, paired_at) \
             VALUES ('b', x'00', 'n', '{}', 1)",
            [],
        )
        .unwrap();
        assert!(
            conn.execute(
                "INSERT INTO paired_bots (bot_id, public_key, name, scope, paired_at) \
                 VALUES ('b', x'01', 'm', '{}', 2)",
                [],
            )
            .is_err(),
            "bot_id is the key"
        );
    }

    /// A version 3 database: activity from the last event (or the row), the preview from the
    /// newest text event among a session's last 256, the subscriber scope empty.
    #[test]
    fn version_4_backfills_activity_and_previews() {
        let mut conn = Connection::open_in_memory().unwrap();
        for step in &MIGRATIONS[..3] {
            conn.execute_batch(step).unwrap();
        }
        conn.execute_batch(
            "PRAGMA user_version = 3;
             INSERT INTO sessions (id, agent_type, cwd, created_at, updated_at) VALUES
                 ('quiet', 'claude', '/', 10, 20),
                 ('talked', 'claude', '/', 10, 20),
                 ('buried', 'claude', '/', 10, 20),
                 ('broken', 'claude', '/', 10, 20);
             INSERT INTO subscribers (id, type, created_at, updated_at) VALUES ('s', 'local', 1, 1);",
        )
        .unwrap();
        let add = |conn: &Connection, session: &str, kind: &str, payload: &str, at: i64| {
            conn.execute(
                "INSERT INTO messages (message_id, session_id, kind, payload, created_at) \
                 VALUES ('m', ?1, ?2, ?3, ?4)",
                rusqlite::params![session, kind, payload, at],
            )
            .unwrap();
        };
        let long = "ü".repeat(200);
        add(&conn, "talked", "user.text", r#"{"text":"old"}"#, 30);
        add(
            &conn,
            "talked",
            "text.end",
            &serde_json::json!({"text": long}).to_string(),
            40,
        );
        add(&conn, "talked", "tool.exec.end", r#"{"output":"x"}"#, 50);
        add(
            &conn,
            "buried",
            "user.text",
            r#"{"text":"too far back"}"#,
            30,
        );
        for i in 0..256 {
            add(&conn, "buried", "tool.exec.end", "{}", 31 + i);
        }
        add(&conn, "broken", "text.end", "not json", 60);
        migrate(&mut conn).unwrap();
        let row = |id: &str| -> (i64, Option<String>) {
            conn.query_row(
                "SELECT last_activity_at, preview FROM sessions WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
        };
        assert_eq!(row("quiet"), (20, None));
        assert_eq!(row("talked"), (50, Some("ü".repeat(160))));
        assert_eq!(row("buried"), (286, None));
        assert_eq!(row("broken"), (60, None));
        let scope: Option<String> = conn
            .query_row("SELECT scope FROM subscribers", [], |r| r.get(0))
            .unwrap();
        assert_eq!(scope, None);
    }
}
