//! Schema and migrations. `schema.sql` at the repository root is the whole current schema; it
//! is embedded here and applied when `PRAGMA user_version` is 0. Each later version appends a
//! step to [`MIGRATIONS`]; a database from a newer build is refused rather than guessed at.

use rusqlite::Connection;

use super::{StoreError, StoreResult};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 3;

/// Migration `i` takes a database from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[include_str!("../../schema.sql"), MIGRATION_2, MIGRATION_3];

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
        conn.pragma_update(None, "user_version", 99).unwrap();
        assert!(matches!(
            migrate(&mut conn),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn a_version_1_database_gains_the_permissions_table() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE sessions (id TEXT PRIMARY KEY); PRAGMA user_version = 1;")
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
}
