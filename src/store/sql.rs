//! Every SQL statement the store runs, in one place (schema migrations aside, in
//! `schema.rs`). Each is declared through [`statements!`], which also lists it in [`ALL`]; a test
//! runs `EXPLAIN QUERY PLAN` on every entry and fails on a scan of a large table, and another
//! fails on an SQL text written anywhere else in `src/store/` (so a statement cannot skip the
//! plan check by living outside this list). The session list composes its pages from the
//! fragments at the end; its test enumerates every shape they can make.
//!
//! A statement that reads one session names `session_id = ?` outright: a condition such as
//! `(?1 IS NULL OR session_id = ?1)` keeps SQLite from using the `(session_id, sequence_id)`
//! index, so a filtered and an unfiltered read are two statements.

macro_rules! statements {
    ($($(#[$attr:meta])* $name:ident = $sql:expr;)*) => {
        $($(#[$attr])* pub(super) const $name: &str = $sql;)*
        /// Every statement above by name, in the order written: what the plan test walks.
        #[cfg(test)]
        pub(super) const ALL: &[(&str, &str)] = &[$((stringify!($name), $name)),*];
    };
}

/// The columns [`super::event_from_row`] reads.
macro_rules! event_select {
    () => {
        "SELECT sequence_id, message_id, session_id, run_id, kind, payload, created_at \
         FROM messages"
    };
}

/// The columns [`super::session_from_row`] reads (the list adds two after them).
macro_rules! session_columns {
    () => {
        "id, agent_type, native_session_id, cwd, parent_session_id, title, state, created_at, \
         updated_at, config"
    };
}

/// The columns [`super::subscriber_from_row`] reads.
macro_rules! subscriber_select {
    () => {
        "SELECT id, type, session_id, forward_deltas, replay_mode, max_count, \
         most_recent_sequence_id, deltas_dropped, created_at, updated_at, scope, client \
         FROM subscribers"
    };
}

/// The columns `runs::run_from_row` reads.
macro_rules! run_columns {
    () => {
        "id, session_id, state, client_msg_id, error_category, created_at, ended_at, message"
    };
}

/// The columns `runs::permission_from_row` reads.
macro_rules! permission_select {
    () => {
        "SELECT session_id, request_id, run_id, tool, input, state, decision, resolved_by, \
         created_at, resolved_at FROM permissions"
    };
}

/// The columns `pairs::paired_bot_from_row` reads.
macro_rules! paired_bot_select {
    () => {
        "SELECT bot_id, public_key, name, scope, paired_at, last_seen_at, revoked_at \
         FROM paired_bots"
    };
}

statements! {
    // ---- events ----

    /// The largest `sequence_id` ever assigned: AUTOINCREMENT's own counter, which, unlike
    /// `max(sequence_id)`, does not go back when the newest rows are deleted with their
    /// session.
    MAX_SEQ = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0)";
    /// One bracket of a group commit.
    INSERT_MESSAGE = "INSERT INTO messages (message_id, session_id, run_id, kind, payload, \
        created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
    /// [`super::Store::history`]: one session's range of `messages_session_seq`, in order.
    HISTORY_AFTER = concat!(event_select!(),
        " WHERE session_id = ?1 AND sequence_id > ?2 ORDER BY sequence_id LIMIT ?3");
    /// [`super::Store::history_before`]: the same range, walked from its top.
    HISTORY_BEFORE = concat!(event_select!(),
        " WHERE session_id = ?1 AND sequence_id < ?2 ORDER BY sequence_id DESC LIMIT ?3");
    /// A catch-up page of one session: `?1` the session, `?2 < sequence_id <= ?3`, `?4` rows.
    PAGE_AFTER_ONE = concat!(event_select!(),
        " WHERE session_id = ?1 AND sequence_id > ?2 AND sequence_id <= ?3 \
         ORDER BY sequence_id LIMIT ?4");
    /// A catch-up page of every session: `?1 < sequence_id <= ?2`, `?3` rows.
    PAGE_AFTER_ALL = concat!(event_select!(),
        " WHERE sequence_id > ?1 AND sequence_id <= ?2 ORDER BY sequence_id LIMIT ?3");
    /// The cursor before one session's newest `?2` brackets.
    CURSOR_BEFORE_LAST_ONE = "SELECT sequence_id FROM messages WHERE session_id = ?1 \
        ORDER BY sequence_id DESC LIMIT 1 OFFSET ?2";
    /// The cursor before the newest `?1` brackets of all.
    CURSOR_BEFORE_LAST_ALL =
        "SELECT sequence_id FROM messages ORDER BY sequence_id DESC LIMIT 1 OFFSET ?1";
    /// A run's lifecycle events (`runs::run_lifecycle`), in its session's range.
    RUN_LIFECYCLE = "SELECT kind, payload FROM messages WHERE session_id = ?1 AND run_id = ?2 \
        AND kind IN ('user.text', 'run.start', 'run.end', 'warning') ORDER BY sequence_id";
    /// The newest `permission.request` event of one request, in its session's range.
    PERMISSION_REQUEST_EVENT = "SELECT payload FROM messages WHERE session_id = ?1 \
        AND kind = 'permission.request' AND json_extract(payload, '$.requestId') = ?2 \
        ORDER BY sequence_id DESC LIMIT 1";

    // ---- sessions ----

    INSERT_SESSION = "INSERT INTO sessions (id, agent_type, native_session_id, cwd, \
        parent_session_id, title, state, created_at, updated_at, config, last_activity_at) \
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
    /// The list columns of a session just inserted, from the events it may already have (an
    /// import publishes its history first): activity from its newest event, the preview from
    /// its newest `user.text` / `text.end` among its last 256 events. Nothing for a session
    /// without events.
    INSERTED_LIST_COLUMNS = "
UPDATE sessions SET
    last_activity_at = max(last_activity_at, coalesce(
        (SELECT created_at FROM messages WHERE session_id = ?1
         ORDER BY sequence_id DESC LIMIT 1), 0)),
    preview = coalesce((
        SELECT CASE WHEN json_valid(payload) AND json_type(payload, '$.text') = 'text'
                    THEN substr(json_extract(payload, '$.text'), 1, 160) END
        FROM messages
        WHERE session_id = ?1 AND kind IN ('user.text', 'text.end')
          AND sequence_id >= coalesce(
              (SELECT sequence_id FROM messages WHERE session_id = ?1
               ORDER BY sequence_id DESC LIMIT 1 OFFSET 255), 0)
        ORDER BY sequence_id DESC LIMIT 1), preview)
WHERE id = ?1";
    /// One session's list columns after a group: `?1` the id, `?2` its newest event's time,
    /// `?3` its newest preview (NULL keeps the one it has).
    TOUCH_SESSION = "UPDATE sessions SET last_activity_at = max(last_activity_at, ?2), \
        preview = coalesce(?3, preview) WHERE id = ?1";
    DELETE_SESSION = "DELETE FROM sessions WHERE id = ?1";
    DELETE_SESSION_MESSAGES = "DELETE FROM messages WHERE session_id = ?1";
    DELETE_SESSION_RUNS = "DELETE FROM runs WHERE session_id = ?1";
    DELETE_SESSION_PERMISSIONS = "DELETE FROM permissions WHERE session_id = ?1";
    DELETE_SESSION_RULES = "DELETE FROM permission_rules WHERE session_id = ?1";
    DELETE_SESSION_BASELINE = "DELETE FROM session_baselines WHERE session_id = ?1";
    GET_SESSION = concat!("SELECT ", session_columns!(), " FROM sessions WHERE id = ?1");
    /// Every session, newest first: the whole table, read at start and by `session.discover`.
    LIST_SESSIONS = concat!("SELECT ", session_columns!(),
        " FROM sessions ORDER BY created_at DESC, id DESC");
    COUNT_SESSIONS = "SELECT count(*) FROM sessions";
    BUSY_SESSIONS = "SELECT id, state FROM sessions WHERE state IN (?1, ?2)";
    SET_SESSION_STATE = "UPDATE sessions SET state = ?2, updated_at = ?3 WHERE id = ?1";
    SET_SESSION_TITLE = "UPDATE sessions SET title = ?2, updated_at = ?3 WHERE id = ?1";
    SET_NATIVE_SESSION_ID =
        "UPDATE sessions SET native_session_id = ?2, updated_at = ?3 WHERE id = ?1";
    SET_SESSION_FILE = "UPDATE sessions SET session_file = ?2 WHERE id = ?1";
    SET_SESSION_LINEAGE = "UPDATE sessions SET parent_session_id = ?2, config = CASE WHEN ?3 \
        IS NULL THEN json_remove(coalesce(config, '{}'), '$.fork_of') \
        ELSE json_set(coalesce(config, '{}'), '$.fork_of', ?3) END WHERE id = ?1";
    SET_SESSION_OPTIONS = "UPDATE sessions SET config = json_set(coalesce(config, '{}'), \
        '$.options', json(?2)), updated_at = ?3 WHERE id = ?1";
    SET_SESSION_BINDING = "UPDATE sessions SET config = json_set(coalesce(config, '{}'), \
        '$.binding', json(?2)) WHERE id = ?1";
    /// A run is dispatched: its session is running (`?2` the time, `?3` the state).
    SESSION_RUNNING = "UPDATE sessions SET state = ?3, updated_at = ?2 WHERE id = ?1";

    // ---- runs ----

    INSERT_RUN = "INSERT INTO runs (id, session_id, state, client_msg_id, error_category, \
        created_at, ended_at, message, prompt, queue_pos, sender, attachments) \
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
    GET_RUN = concat!("SELECT ", run_columns!(), " FROM runs WHERE id = ?1");
    /// A run by id, within its session.
    GET_SESSION_RUN = concat!("SELECT ", run_columns!(),
        " FROM runs WHERE id = ?1 AND session_id = ?2");
    /// A run by its `client_msg_id` (the unique index `runs_client_msg`).
    GET_RUN_BY_KEY = concat!("SELECT ", run_columns!(),
        " FROM runs WHERE session_id = ?1 AND client_msg_id = ?2");
    LIST_RUNS = concat!("SELECT ", run_columns!(),
        " FROM runs WHERE session_id = ?1 ORDER BY created_at, id");
    /// Runs that never reached a terminal state (through the `runs_state` index).
    UNFINISHED_RUNS = concat!("SELECT ", run_columns!(),
        " FROM runs WHERE state IN ('queued', 'running') ORDER BY created_at, id");
    /// A session's queued runs, with what `runs::QueuedRun` adds to the row.
    QUEUED_RUNS = concat!("SELECT ", run_columns!(),
        ", prompt, queue_pos, sender, attachments FROM runs WHERE session_id = ?1 AND state = ?2 \
         ORDER BY queue_pos IS NULL, queue_pos, created_at, id");
    SET_RUN_STATE = "UPDATE runs SET state = ?2, error_category = ?3, ended_at = ?4, \
        message = ?5 WHERE id = ?1";
    START_RUN = "UPDATE runs SET state = ?2 WHERE id = ?1";
    SET_RUN_PROMPT = "UPDATE runs SET prompt = ?2 WHERE id = ?1 AND state = ?3";
    REQUEUE_RUN = "UPDATE runs SET state = ?2, ended_at = NULL, message = NULL \
        WHERE id = ?1 AND state = ?3 AND prompt IS NOT NULL";
    SET_QUEUE_POS = "UPDATE runs SET queue_pos = ?2 WHERE id = ?1";

    // ---- permissions ----

    INSERT_PERMISSION = "INSERT OR REPLACE INTO permissions (session_id, request_id, run_id, \
        tool, input, state, decision, resolved_by, created_at, resolved_at) \
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
    GET_PERMISSION = concat!(permission_select!(), " WHERE session_id = ?1 AND request_id = ?2");
    RESOLVE_PERMISSION = "UPDATE permissions SET state = ?6, decision = ?3, resolved_by = ?4, \
        resolved_at = ?5 WHERE session_id = ?1 AND request_id = ?2 AND state = ?7";
    /// Pending requests of one session (`?1`; `?2` the pending state).
    PENDING_PERMISSIONS_ONE = concat!(permission_select!(),
        " WHERE session_id = ?1 AND state = ?2 ORDER BY created_at, rowid");
    /// Pending requests of every session (`?1` the pending state), through `permissions_state`.
    PENDING_PERMISSIONS_ALL = concat!(permission_select!(),
        " WHERE state = ?1 ORDER BY created_at, rowid");
    INSERT_PERMISSION_RULE = "INSERT OR IGNORE INTO permission_rules (session_id, request_id, \
        tool, option_id, label, description, by, created_at) \
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
    PERMISSION_RULES = "SELECT request_id, tool, option_id, label, description, by, created_at \
        FROM permission_rules WHERE session_id = ?1 ORDER BY created_at, rowid";

    // ---- baselines ----

    SAVE_BASELINE = "INSERT OR REPLACE INTO session_baselines (session_id, file_path, dev, \
        inode, size, line_count, last_entry_id, mtime_ns, recorded_at) \
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
    GET_BASELINE = "SELECT file_path, dev, inode, size, line_count, last_entry_id, mtime_ns \
        FROM session_baselines WHERE session_id = ?1";

    // ---- subscribers ----

    INSERT_SUBSCRIBER = "INSERT INTO subscribers (id, type, session_id, forward_deltas, \
        replay_mode, max_count, most_recent_sequence_id, deltas_dropped, created_at, \
        updated_at, scope, client) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
    GET_SUBSCRIBER = concat!(subscriber_select!(), " WHERE id = ?1");
    /// Every subscriber: the whole table, read at start.
    LIST_SUBSCRIBERS = concat!(subscriber_select!(), " ORDER BY created_at");
    SET_SUBSCRIBER_SCOPE = "UPDATE subscribers SET scope = ?2, updated_at = ?3 WHERE id = ?1";
    DELETE_SUBSCRIBER = "DELETE FROM subscribers WHERE id = ?1";
    /// A cursor only moves forward.
    SAVE_CURSOR = "UPDATE subscribers SET \
        most_recent_sequence_id = max(most_recent_sequence_id, ?2), \
        deltas_dropped = deltas_dropped + ?3, updated_at = ?4 WHERE id = ?1";
    /// A subscriber was seen now (`?2`): it connected, or asked for a fresh grant (migration 12).
    TOUCH_SUBSCRIBER = "UPDATE subscribers SET last_seen_at = ?2 WHERE id = ?1";
    /// Every subscriber's last sighting, for `subscriber.list` (a row never seen: `NULL`).
    LIST_SUBSCRIBERS_SEEN = "SELECT id, last_seen_at FROM subscribers";
    /// The subscribers last seen before `?1`, or never seen and added before it: two ranges of
    /// `subscribers_last_seen` (the never-seen ones are its `NULL` range).
    STALE_SUBSCRIBERS = "SELECT id FROM subscribers WHERE last_seen_at < ?1 \
        UNION ALL SELECT id FROM subscribers WHERE last_seen_at IS NULL AND created_at < ?1";

    // ---- pairing (`pairs.rs`; the tables are migration 13's) ----

    INSERT_PAIRING_SECRET = "INSERT INTO pairing_secrets (secret_id, secret_hash, scope, name, \
        created_at, expires_at, used_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)";
    /// The single-use mark: `?1` the secret's id, `?2` now, `?3` its hash. Changes no row when
    /// the secret is unknown, used or expired.
    USE_PAIRING_SECRET = "UPDATE pairing_secrets SET used_at = ?2 WHERE secret_id = ?1 \
        AND secret_hash = ?3 AND used_at IS NULL AND expires_at > ?2";
    /// A bot paired: a new row, or a bot that pairs again (its key's id is its row) takes the
    /// new name and scope and is no longer revoked.
    UPSERT_PAIRED_BOT = "INSERT INTO paired_bots (bot_id, public_key, name, scope, paired_at, \
        last_seen_at, revoked_at) VALUES (?1, ?2, ?3, ?4, ?5, NULL, NULL) \
        ON CONFLICT (bot_id) DO UPDATE SET public_key = excluded.public_key, \
        name = excluded.name, scope = excluded.scope, paired_at = excluded.paired_at, \
        revoked_at = NULL";
    GET_PAIRED_BOT = concat!(paired_bot_select!(), " WHERE bot_id = ?1");
    /// Every paired bot, revoked ones too: the whole table, for `pair.list`.
    LIST_PAIRED_BOTS = concat!(paired_bot_select!(), " ORDER BY paired_at, bot_id");
    /// A revocation keeps the first time it was revoked.
    REVOKE_PAIRED_BOT =
        "UPDATE paired_bots SET revoked_at = coalesce(revoked_at, ?2) WHERE bot_id = ?1";
    TOUCH_PAIRED_BOT = "UPDATE paired_bots SET last_seen_at = ?2 WHERE bot_id = ?1";
    /// A bot's scope, changed (a session it created joins it).
    SET_PAIRED_BOT_SCOPE = "UPDATE paired_bots SET scope = ?2 WHERE bot_id = ?1";

    // ---- upkeep ----

    /// The recovery probe's table and its one row.
    CREATE_PROBE =
        "CREATE TABLE IF NOT EXISTS store_probe (id INTEGER PRIMARY KEY, at INTEGER NOT NULL)";
    PROBE = "INSERT OR REPLACE INTO store_probe (id, at) VALUES (1, ?1)";
    QUICK_CHECK = "PRAGMA quick_check(8)";
    CHECKPOINT_PASSIVE = "PRAGMA wal_checkpoint(PASSIVE)";
    CHECKPOINT_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)";

    // ---- search (`search.rs`; the table is migration 11's) ----

    /// A searchable bracket's text, under its `sequence_id`, in the append's transaction.
    INSERT_FTS = "INSERT INTO messages_fts (rowid, text) VALUES (?1, ?2)";
    /// A session's index rows, found through its range of `messages_session_seq`; run before
    /// its messages go.
    DELETE_SESSION_FTS = "DELETE FROM messages_fts WHERE rowid IN \
        (SELECT sequence_id FROM messages WHERE session_id = ?1)";
    /// Matches of `?1` (an FTS5 query) in every session, best first (bm25): `?2`/`?3` the
    /// snippet's markers, `?4` its length in tokens, `?5` rows. The full-text index is the
    /// outer loop (CROSS JOIN keeps it there); each match reads its row by primary key.
    SEARCH_ALL = "SELECT m.session_id, m.sequence_id, m.run_id, m.kind, m.created_at, \
        snippet(messages_fts, 0, ?2, ?3, '…', ?4), bm25(messages_fts) \
        FROM messages_fts CROSS JOIN messages m ON m.sequence_id = messages_fts.rowid \
        WHERE messages_fts MATCH ?1 ORDER BY rank LIMIT ?5";
    /// [`SEARCH_ALL`] within the sessions of `?6` (a JSON array of ids).
    SEARCH_IN = "SELECT m.session_id, m.sequence_id, m.run_id, m.kind, m.created_at, \
        snippet(messages_fts, 0, ?2, ?3, '…', ?4), bm25(messages_fts) \
        FROM messages_fts CROSS JOIN messages m ON m.sequence_id = messages_fts.rowid \
        WHERE messages_fts MATCH ?1 AND m.session_id IN (SELECT value FROM json_each(?6)) \
        ORDER BY rank LIMIT ?5";
}

// ---- the session list's fragments (`sessions::page_sql` composes them) ----

/// The list's columns: [`session_columns!`]'s ten, in its order, then the two the list adds.
pub(super) const LIST_SELECT: &str = concat!(
    "SELECT ",
    session_columns!(),
    ", last_activity_at, preview FROM sessions"
);
/// `only`: the named ids (a JSON array, bound where `?N` stands).
pub(super) const LIST_ONLY_IN: &str = "id IN (SELECT value FROM json_each(?N))";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use rusqlite::Connection;
    use rusqlite::types::Value;

    /// Tables that grow with use: a statement reading one of them reads an index range.
    const LARGE: &[&str] = &[
        "messages",
        "sessions",
        "runs",
        "permissions",
        "permission_rules",
        "session_baselines",
        "subscribers",
        "pairing_secrets",
        "paired_bots",
    ];

    /// The scans allowed, each by statement and exact plan step, and why.
    const ALLOWED_SCANS: &[(&str, &str, &str)] = &[
        (
            "CURSOR_BEFORE_LAST_ALL",
            "SCAN messages",
            "walks the table from its newest row down and stops after OFFSET rows: the count a \
             subscriber asked for, not the table",
        ),
        (
            "LIST_SESSIONS",
            "SCAN sessions",
            "every session, read whole at start and by session.discover",
        ),
        (
            "COUNT_SESSIONS",
            "SCAN sessions USING COVERING INDEX sqlite_autoindex_sessions_1",
            "host.status's count: an index of ids, no row read",
        ),
        (
            "LIST_SUBSCRIBERS",
            "SCAN subscribers",
            "every subscriber, read whole at start",
        ),
        (
            "LIST_SUBSCRIBERS_SEEN",
            "SCAN subscribers",
            "subscriber.list: every subscriber, as LIST_SUBSCRIBERS",
        ),
        (
            "LIST_PAIRED_BOTS",
            "SCAN paired_bots",
            "pair.list: every paired bot, each paired by hand (a handful)",
        ),
        (
            "session list, first page, no filter",
            "SCAN sessions USING INDEX sessions_activity",
            "walks the activity index from its start and stops at the LIMIT",
        ),
    ];

    /// The plan of `sql`, one step a line; unbound parameters are NULL, except `args`.
    fn plan(conn: &Connection, sql: &str, args: Option<Vec<Value>>) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let args = args.unwrap_or_else(|| vec![Value::Null; stmt.parameter_count()]);
        stmt.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// The scans of large tables in `steps` that [`ALLOWED_SCANS`] does not allow `name`;
    /// the allowances that matched go into `used`.
    fn scans_using(
        name: &str,
        steps: &[String],
        used: &mut std::collections::HashSet<usize>,
    ) -> Vec<String> {
        let mut bad = Vec::new();
        for step in steps {
            let scan = LARGE.iter().any(|table| {
                step.strip_prefix("SCAN ")
                    .and_then(|rest| rest.strip_prefix(table))
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
            });
            if !scan {
                continue;
            }
            match ALLOWED_SCANS
                .iter()
                .position(|(n, allowed, _)| *n == name && step == allowed)
            {
                Some(i) => {
                    used.insert(i);
                }
                None => bad.push(step.clone()),
            }
        }
        bad
    }

    fn scans(name: &str, steps: &[String]) -> Vec<String> {
        scans_using(name, steps, &mut Default::default())
    }

    /// Every statement of [`ALL`], and every shape the session list composes, reads an index
    /// range of each large table it touches: no full scan but the few allowed, by name.
    #[test]
    fn every_statement_reads_an_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        conn.execute(CREATE_PROBE, []).unwrap();
        // The checker sees a scan.
        let scan = plan(&conn, "SELECT payload FROM messages WHERE kind = ?1", None);
        assert_eq!(scans("x", &scan), ["SCAN messages"]);
        // The split this module's statements make: the combined filter scans.
        let combined = plan(
            &conn,
            "SELECT payload FROM messages WHERE (?1 IS NULL OR session_id = ?1) \
             AND sequence_id > ?2 ORDER BY sequence_id LIMIT 5",
            None,
        );
        assert!(
            combined.iter().all(|s| !s.contains("messages_session_seq")),
            "{combined:?}"
        );

        let mut names = std::collections::HashSet::new();
        let mut used = std::collections::HashSet::new();
        let mut failures = Vec::new();
        for (name, sql) in ALL {
            assert!(names.insert(*name), "{name} twice");
            let steps = plan(&conn, sql, None);
            let bad = scans_using(name, &steps, &mut used);
            if !bad.is_empty() {
                failures.push(format!("{name}: {bad:?} in {steps:?}"));
            }
        }
        let shapes = super::super::sessions::every_page_shape();
        assert_eq!(shapes.len(), 32);
        for (first_unfiltered, sql, args) in shapes {
            let name = if first_unfiltered {
                "session list, first page, no filter"
            } else {
                "session list"
            };
            let steps = plan(&conn, &sql, Some(args));
            let bad = scans_using(name, &steps, &mut used);
            if !bad.is_empty() {
                failures.push(format!("{name}: {bad:?} in {sql}"));
            }
        }
        assert!(failures.is_empty(), "full scans:\n{}", failures.join("\n"));
        // Every allowance is used (a stale one would allow a scan nobody reviewed).
        for (i, (name, step, _)) in ALLOWED_SCANS.iter().enumerate() {
            assert!(used.contains(&i), "allowance unused: {name} {step}");
        }
    }

    /// The string literals of Rust source, comments and char literals skipped.
    fn literals(src: &str) -> Vec<String> {
        let b = src.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'/' if b.get(i + 1) == Some(&b'/') => {
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                }
                b'/' if b.get(i + 1) == Some(&b'*') => {
                    i += 2;
                    while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                        i += 1;
                    }
                    i += 2;
                }
                b'\'' => {
                    // A char literal ('x', '\n', '"'), else a lifetime.
                    if b.get(i + 1) == Some(&b'\\') {
                        i += 2;
                        while i < b.len() && b[i] != b'\'' {
                            i += 1;
                        }
                        i += 1;
                    } else if b.get(i + 2) == Some(&b'\'') {
                        i += 3;
                    } else {
                        i += 1;
                    }
                }
                b'r' if matches!(b.get(i + 1), Some(b'"' | b'#'))
                    && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
                {
                    let mut j = i + 1;
                    let mut hashes = 0;
                    while b.get(j) == Some(&b'#') {
                        hashes += 1;
                        j += 1;
                    }
                    if b.get(j) != Some(&b'"') {
                        i += 1;
                        continue;
                    }
                    let close = format!("\"{}", "#".repeat(hashes));
                    let start = j + 1;
                    let end = src[start..].find(&close).map_or(src.len(), |e| start + e);
                    out.push(src[start..end].to_owned());
                    i = end + close.len();
                }
                b'"' => {
                    let start = i + 1;
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        if b[i] == b'\\' {
                            i += 1;
                        }
                        i += 1;
                    }
                    out.push(src[start..i.min(src.len())].to_owned());
                    i += 1;
                }
                _ => i += 1,
            }
        }
        out
    }

    /// Whether a literal reads like an SQL statement.
    fn is_sql(literal: &str) -> bool {
        let words: Vec<String> = literal
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .map(str::to_ascii_uppercase)
            .collect();
        let has = |w: &str| words.iter().any(|x| x == w);
        (has("SELECT") && has("FROM"))
            || (has("INSERT") && has("INTO"))
            || (has("REPLACE") && has("INTO"))
            || (has("UPDATE") && has("SET"))
            || (has("DELETE") && has("FROM"))
            || words.first().is_some_and(|w| w == "PRAGMA" || w == "WITH")
            || (["CREATE", "DROP", "ALTER"].iter().any(|w| has(w))
                && ["TABLE", "INDEX", "TRIGGER", "VIEW"].iter().any(|w| has(w)))
    }

    /// No SQL text in `src/store/` outside this module (and the migrations, which run once per
    /// version at open): every statement is in [`ALL`], so the plan test sees it. Test modules
    /// are left out.
    #[test]
    fn no_sql_outside_this_module() {
        // The scanner finds SQL in each kind of literal, and not in comments or prose.
        let sample = "// SELECT a FROM t\nlet c = '\"'; f(\"UPDATE t SET a = 1\"); \
                      g(r#\"DELETE FROM t\"#); h(\"select the rows from the page\"); \
                      i(\"a message\"); j::<'a>(\"insert into x\")";
        let found: Vec<String> = literals(sample).into_iter().filter(|l| is_sql(l)).collect();
        assert_eq!(
            found,
            [
                "UPDATE t SET a = 1",
                "DELETE FROM t",
                "select the rows from the page",
                "insert into x"
            ]
        );
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
        let mut checked = 0;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() || !name.ends_with(".rs") || name == "sql.rs" || name == "schema.rs" {
                assert!(!path.is_dir(), "{name}: a directory the scan does not read");
                continue;
            }
            let src = std::fs::read_to_string(&path).unwrap();
            let code = src
                .find("#[cfg(test)]\nmod tests")
                .map_or(src.as_str(), |at| &src[..at]);
            checked += 1;
            for literal in literals(code) {
                if is_sql(&literal) {
                    found.push(format!("{name}: {literal:?}"));
                }
            }
        }
        assert!(checked >= 3, "only {checked} files read in {dir:?}");
        assert!(
            found.is_empty(),
            "SQL outside src/store/sql.rs (declare it in `statements!`):\n{}",
            found.join("\n")
        );
    }
}
