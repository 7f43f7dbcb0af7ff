-- agent-host store schema: the tables of version 3.
-- Applied by src/store/schema.rs when PRAGMA user_version is below 1; the later migrations in
-- src/store/schema.rs then run on a fresh database as on an old one. Version 4 (there) adds
-- sessions.last_activity_at and sessions.preview with their list indexes, and
-- subscribers.scope.

CREATE TABLE IF NOT EXISTS sessions (
    id                TEXT PRIMARY KEY,
    agent_type        TEXT NOT NULL,
    native_session_id TEXT,
    cwd               TEXT NOT NULL,
    parent_session_id TEXT,
    title             TEXT,
    state             TEXT NOT NULL DEFAULT 'idle',
    session_file      TEXT,
    config            TEXT,            -- JSON: model and agent options
    created_at        INTEGER NOT NULL, -- unix milliseconds
    updated_at        INTEGER NOT NULL
);

-- Every durable (bracket) event. sequence_id is the global, gap-tolerant, strictly increasing
-- cursor that subscribers resume from. AUTOINCREMENT: a deleted row's id is never reused, so a
-- cursor never points at a different event later.
CREATE TABLE IF NOT EXISTS messages (
    sequence_id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id  TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    run_id      TEXT,
    kind        TEXT NOT NULL,
    payload     TEXT NOT NULL,          -- the canonical event JSON, exactly as fanned out
    created_at  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_session_seq ON messages (session_id, sequence_id);

CREATE TABLE IF NOT EXISTS runs (
    id         TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    state      TEXT NOT NULL,           -- queued | running | completed | failed | cancelled | interrupted | dropped
    client_msg_id TEXT,                 -- idempotency key of the request that started it
    error_category TEXT,
    created_at INTEGER NOT NULL,
    ended_at   INTEGER
);
CREATE INDEX IF NOT EXISTS runs_session ON runs (session_id, created_at);
CREATE UNIQUE INDEX IF NOT EXISTS runs_client_msg ON runs (session_id, client_msg_id)
    WHERE client_msg_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS subscribers (
    id                      TEXT PRIMARY KEY,
    type                    TEXT NOT NULL,       -- local | relay
    session_id              TEXT,                -- NULL: every session
    forward_deltas          INTEGER NOT NULL DEFAULT 0,
    replay_mode             TEXT NOT NULL DEFAULT 'max_count', -- none | since_cursor | max_count
    max_count               INTEGER NOT NULL DEFAULT 200,
    most_recent_sequence_id INTEGER NOT NULL DEFAULT 0,
    deltas_dropped          INTEGER NOT NULL DEFAULT 0,
    created_at              INTEGER NOT NULL,
    updated_at              INTEGER NOT NULL
);

-- What a session's native file looked like at our last clean turn end (design §8). Version 3
-- added dev and inode (a replaced file is a changed file).
CREATE TABLE IF NOT EXISTS session_baselines (
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

-- User-registered agents (design §9): a command that speaks one of the protocol families.
CREATE TABLE IF NOT EXISTS agents (
    name       TEXT PRIMARY KEY,
    family     TEXT NOT NULL,           -- claude | codex | acp
    command    TEXT NOT NULL,
    args       TEXT NOT NULL DEFAULT '[]', -- JSON array
    env        TEXT NOT NULL DEFAULT '{}', -- JSON object
    created_at INTEGER NOT NULL
);

-- Permission requests of live runs (design §8): durable, answered once. Added in version 2.
CREATE TABLE IF NOT EXISTS permissions (
    session_id  TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    run_id      TEXT,
    tool        TEXT NOT NULL,
    input       TEXT NOT NULL,          -- JSON
    state       TEXT NOT NULL,          -- pending | resolved
    decision    TEXT,                   -- allow | deny | withdrawn | expired
    resolved_by TEXT,                   -- a subscriber id, `ipc`, `agent` or `host`
    created_at  INTEGER NOT NULL,
    resolved_at INTEGER,
    PRIMARY KEY (session_id, request_id)
);
