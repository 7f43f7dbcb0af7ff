//! Runs, permission requests (and the rules accepted answers keep) and the session fields a live agent updates: the durable state
//! of the session actors (design §8). Every mutation here is one writer-thread job, so two
//! answers to one permission request are decided in one place, in order.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::{RunRow, Store, StoreResult, now_ms, sql};
use crate::protocol::envelope::RunRef;
use crate::protocol::events::{PermissionOption, PromptFrom};
use crate::protocol::options::Attachment;
use crate::protocol::replies::PermissionRule;
use crate::protocol::states::{PermissionState, RunStatus, SessionState};

/// What inserting a run found.
#[derive(Debug, Clone, PartialEq)]
pub enum RunInsert {
    Inserted,
    /// A run with the same `client_msg_id` exists in this session: the request is a retry.
    Duplicate(RunRow),
}

/// A `permissions` row: one `permission.request` and how it was answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PermissionRow {
    pub session_id: String,
    pub request_id: String,
    pub run_id: Option<String>,
    pub tool: String,
    /// The tool input as JSON text.
    pub input: String,
    pub state: PermissionState,
    /// `allow`, `deny`, `withdrawn` or `expired` once resolved.
    pub decision: Option<String>,
    pub resolved_by: Option<String>,
    pub created_at_ms: i64,
    pub resolved_at_ms: Option<i64>,
}

/// A `session_baselines` row (integers as SQLite stores them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBaseline {
    pub file_path: String,
    pub dev: i64,
    pub inode: i64,
    pub size: i64,
    pub line_count: i64,
    pub last_entry_id: Option<String>,
    pub mtime_ns: i64,
}

/// What an attempt to resolve a permission request found.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolve {
    /// This answer won.
    Resolved(PermissionRow),
    /// An earlier answer won; the row says which.
    Already(PermissionRow),
    NotFound,
}

/// A column holding one of the state names of [`crate::protocol::states`].
pub(super) fn state_column<T>(
    r: &rusqlite::Row<'_>,
    index: usize,
    parse: fn(&str) -> Option<T>,
) -> rusqlite::Result<T> {
    let text: String = r.get(index)?;
    parse(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            index,
            rusqlite::types::Type::Text,
            format!("unknown state {text:?}").into(),
        )
    })
}

pub(super) fn run_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        run_id: r.get(0)?,
        session_id: r.get(1)?,
        state: state_column(r, 2, RunStatus::parse)?,
        client_msg_id: r.get(3)?,
        error_category: r.get(4)?,
        created_at_ms: r.get(5)?,
        ended_at_ms: r.get(6)?,
        message: r.get(7)?,
    })
}

fn permission_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PermissionRow> {
    Ok(PermissionRow {
        session_id: r.get(0)?,
        request_id: r.get(1)?,
        run_id: r.get(2)?,
        tool: r.get(3)?,
        input: r.get(4)?,
        state: state_column(r, 5, PermissionState::parse)?,
        decision: r.get(6)?,
        resolved_by: r.get(7)?,
        created_at_ms: r.get(8)?,
        resolved_at_ms: r.get(9)?,
    })
}

/// A `queued` run as the store keeps it: its row, the prompt's text (`None` for a run of a host
/// before schema 6) and its place in the queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedRun {
    pub run: RunRow,
    pub prompt: Option<String>,
    pub queue_pos: Option<i64>,
    /// Who sent the prompt (`None` before schema 8, or a sender that does not read).
    pub sender: Option<PromptFrom>,
    /// The prompt's attachments, as checked and copied when it was taken (none before schema
    /// 9).
    pub attachments: Vec<Attachment>,
}

impl Store {
    /// Insert a run, unless its `client_msg_id` was seen in this session before.
    pub async fn insert_run(&self, row: RunRow) -> StoreResult<RunInsert> {
        self.insert_prompt_run(row, None, None).await
    }

    /// Insert a run with its prompt's text and, for a queued one, its place in the queue
    /// (lower first), unless its `client_msg_id` was seen in this session before.
    pub async fn insert_prompt_run(
        &self,
        row: RunRow,
        prompt: Option<String>,
        queue_pos: Option<i64>,
    ) -> StoreResult<RunInsert> {
        self.insert_sent_run(row, prompt, queue_pos, None).await
    }

    /// [`Store::insert_prompt_run`] with who sent the prompt (kept as JSON in `runs.sender`).
    pub async fn insert_sent_run(
        &self,
        row: RunRow,
        prompt: Option<String>,
        queue_pos: Option<i64>,
        sender: Option<PromptFrom>,
    ) -> StoreResult<RunInsert> {
        self.insert_attached_run(row, prompt, queue_pos, sender, Vec::new())
            .await
    }

    /// [`Store::insert_sent_run`] with the prompt's attachments (kept as JSON in
    /// `runs.attachments`, none: NULL), so a queued prompt restored after a restart keeps them.
    pub async fn insert_attached_run(
        &self,
        row: RunRow,
        prompt: Option<String>,
        queue_pos: Option<i64>,
        sender: Option<PromptFrom>,
        attachments: Vec<Attachment>,
    ) -> StoreResult<RunInsert> {
        let sender = sender.and_then(|s| serde_json::to_string(&s).ok());
        let attachments = if attachments.is_empty() {
            None
        } else {
            // Only a path that is not UTF-8 fails, and the host makes none.
            Some(serde_json::to_string(&attachments).map_err(|e| {
                super::StoreError::CommitFailed(format!("the run's attachments: {e}"))
            })?)
        };
        self.write(move |conn| {
            let tx = conn.transaction()?;
            if let Some(key) = &row.client_msg_id {
                let existing = tx
                    .prepare_cached(sql::GET_RUN_BY_KEY)?
                    .query_row(params![row.session_id, key], run_from_row)
                    .optional()?;
                if let Some(existing) = existing {
                    return Ok(RunInsert::Duplicate(existing));
                }
            }
            tx.execute(
                sql::INSERT_RUN,
                params![
                    row.run_id,
                    row.session_id,
                    row.state.as_str(),
                    row.client_msg_id,
                    row.error_category,
                    row.created_at_ms,
                    row.ended_at_ms,
                    row.message,
                    prompt,
                    queue_pos,
                    sender,
                    attachments
                ],
            )?;
            tx.commit()?;
            Ok(RunInsert::Inserted)
        })
        .await
    }

    /// Move a run to `state`, with the category and message of its end; a terminal state
    /// stamps `ended_at`.
    pub async fn set_run_state(
        &self,
        run_id: String,
        state: RunStatus,
        error_category: Option<String>,
        message: Option<String>,
    ) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::SET_RUN_STATE,
                params![
                    run_id,
                    state.as_str(),
                    error_category,
                    state.is_terminal().then(now_ms),
                    message
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// A queued run's new prompt text; `false` when the run is not (or no longer) queued.
    pub async fn set_run_prompt(&self, run_id: String, prompt: String) -> StoreResult<bool> {
        self.write(move |conn| {
            let changed = conn.execute(
                sql::SET_RUN_PROMPT,
                params![run_id, prompt, RunStatus::Queued.as_str()],
            )?;
            Ok(changed > 0)
        })
        .await
    }

    /// A run whose dispatch the host never finished (left `running` with its prompt and no
    /// `run.start`) waits again: `queued`, its place kept. `false` when it is not such a row.
    pub async fn requeue_run(&self, run_id: String) -> StoreResult<bool> {
        self.write(move |conn| {
            let changed = conn.execute(
                sql::REQUEUE_RUN,
                params![
                    run_id,
                    RunStatus::Queued.as_str(),
                    RunStatus::Running.as_str()
                ],
            )?;
            Ok(changed > 0)
        })
        .await
    }

    /// Tests: every write of the writer's connection fails (`PRAGMA query_only`, a real
    /// SQLITE_READONLY) until turned off again; the store degrades and recovers by itself.
    #[cfg(test)]
    pub(crate) async fn fail_writes(&self, on: bool) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: super::Job = Box::new(move |conn| {
            let set = conn.pragma_update(None, "query_only", on);
            let _test_gone = tx.send(set);
        });
        if self
            .writer
            .send(super::WriteCmd::Unchecked(job))
            .await
            .is_ok()
        {
            let _set = rx.await;
        }
    }

    /// The queue of a session, head first: each listed run's `queue_pos` becomes its index
    /// (one transaction).
    pub async fn set_queue_order(&self, run_ids: Vec<String>) -> StoreResult<()> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            for (pos, run_id) in run_ids.iter().enumerate() {
                tx.execute(sql::SET_QUEUE_POS, params![run_id, pos as i64])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The `queued` runs of a session in queue order: by `queue_pos`, then in the order they
    /// were taken.
    pub async fn queued_runs(&self, session_id: String) -> StoreResult<Vec<QueuedRun>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql::QUEUED_RUNS)?;
            let rows = stmt
                .query_map(params![session_id, RunStatus::Queued.as_str()], |r| {
                    Ok(QueuedRun {
                        run: run_from_row(r)?,
                        prompt: r.get(8)?,
                        queue_pos: r.get(9)?,
                        sender: r
                            .get::<_, Option<String>>(10)?
                            .and_then(|text| serde_json::from_str(&text).ok()),
                        attachments: r
                            .get::<_, Option<String>>(11)?
                            .and_then(|text| serde_json::from_str(&text).ok())
                            .unwrap_or_default(),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The run of `session_id` that `key` names: by its id (the primary key) or by its
    /// `client_msg_id` (the unique index `runs_client_msg`), never a scan.
    pub async fn find_run(&self, session_id: String, key: RunRef) -> StoreResult<Option<RunRow>> {
        self.read(move |conn| {
            let found = match &key {
                RunRef::RunId(id) => conn
                    .prepare_cached(sql::GET_SESSION_RUN)?
                    .query_row(params![id, session_id], run_from_row)
                    .optional()?,
                RunRef::ClientMsgId(key) => conn
                    .prepare_cached(sql::GET_RUN_BY_KEY)?
                    .query_row(params![session_id, key], run_from_row)
                    .optional()?,
            };
            Ok(found)
        })
        .await
    }

    /// A run is dispatched: it and its session are `running`, in one transaction. Queued
    /// only: the receiver resolves once committed.
    pub async fn start_run(
        &self,
        session_id: String,
        run_id: String,
    ) -> StoreResult<tokio::sync::oneshot::Receiver<StoreResult<()>>> {
        self.write_start(move |conn| {
            let tx = conn.transaction()?;
            let now = now_ms();
            tx.execute(sql::START_RUN, params![run_id, RunStatus::Running.as_str()])?;
            tx.execute(
                sql::SESSION_RUNNING,
                params![session_id, now, SessionState::Running.as_str()],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn get_run(&self, run_id: String) -> StoreResult<Option<RunRow>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(sql::GET_RUN)?
                .query_row([&run_id], run_from_row)
                .optional()?)
        })
        .await
    }

    /// Runs that never reached a terminal state (the host stopped under them).
    pub async fn unfinished_runs(&self) -> StoreResult<Vec<RunRow>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(sql::UNFINISHED_RUNS)?;
            let rows = stmt
                .query_map([], run_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The lifecycle events of one run — `user.text`, `run.start`, `run.end` and `warning` —
    /// as (kind, payload), oldest first: what the event log says happened to it.
    pub async fn run_lifecycle(
        &self,
        session_id: String,
        run_id: String,
    ) -> StoreResult<Vec<(String, String)>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql::RUN_LIFECYCLE)?;
            let rows = stmt
                .query_map(params![session_id, run_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// Every session marked `running` or `waiting` back to `idle` (at start, nothing runs
    /// yet): the sessions reset and the state each had, so the change can be published.
    pub async fn reset_busy_sessions(&self) -> StoreResult<Vec<(String, SessionState)>> {
        self.write(|conn| {
            let tx = conn.transaction()?;
            let busy = tx
                .prepare_cached(sql::BUSY_SESSIONS)?
                .query_map(
                    params![
                        SessionState::Running.as_str(),
                        SessionState::Waiting.as_str()
                    ],
                    |r| Ok((r.get(0)?, state_column(r, 1, SessionState::parse)?)),
                )?
                .collect::<Result<Vec<(String, SessionState)>, _>>()?;
            let now = now_ms();
            for (session_id, _) in &busy {
                tx.execute(
                    sql::SET_SESSION_STATE,
                    params![session_id, SessionState::Idle.as_str(), now],
                )?;
            }
            tx.commit()?;
            Ok(busy)
        })
        .await
    }

    /// Record the baseline of a session's native file (replacing the previous one), and its
    /// path in the session row. Queued only: the receiver resolves once committed (the
    /// writer's order keeps a later baseline after an earlier one).
    pub async fn save_baseline(
        &self,
        session_id: String,
        b: StoredBaseline,
    ) -> StoreResult<tokio::sync::oneshot::Receiver<StoreResult<()>>> {
        self.write_start(move |conn| {
            conn.execute(
                sql::SAVE_BASELINE,
                params![
                    session_id,
                    b.file_path,
                    b.dev,
                    b.inode,
                    b.size,
                    b.line_count,
                    b.last_entry_id,
                    b.mtime_ns,
                    now_ms()
                ],
            )?;
            conn.execute(sql::SET_SESSION_FILE, params![session_id, b.file_path])?;
            Ok(())
        })
        .await
    }

    pub async fn get_baseline(&self, session_id: String) -> StoreResult<Option<StoredBaseline>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(sql::GET_BASELINE)?
                .query_row([&session_id], |r| {
                    Ok(StoredBaseline {
                        file_path: r.get(0)?,
                        dev: r.get(1)?,
                        inode: r.get(2)?,
                        size: r.get(3)?,
                        line_count: r.get(4)?,
                        last_entry_id: r.get(5)?,
                        mtime_ns: r.get(6)?,
                    })
                })
                .optional()?)
        })
        .await
    }

    /// Set a session's parent and the native session it starts as a fork of.
    pub async fn replace_session_lineage(&self, row: super::SessionRow) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::SET_SESSION_LINEAGE,
                params![row.session_id, row.parent_session_id, row.fork_of],
            )?;
            Ok(())
        })
        .await
    }

    /// Record a session's options (`session.set_model` changed them); the rest of its config
    /// stays. `false`: no such session.
    pub async fn set_session_options(
        &self,
        session_id: String,
        options: crate::protocol::options::SessionOptions,
    ) -> StoreResult<bool> {
        let json = serde_json::to_string(&options).unwrap_or_else(|_| "{}".to_owned());
        self.write(move |conn| {
            let n = conn.execute(
                sql::SET_SESSION_OPTIONS,
                params![session_id, json, now_ms()],
            )?;
            Ok(n > 0)
        })
        .await
    }

    /// Record what a session's native session is bound under; the rest of its config stays.
    /// `false`: no such session.
    pub async fn set_session_binding(
        &self,
        session_id: String,
        binding: crate::protocol::options::BindingRecord,
    ) -> StoreResult<bool> {
        let json = serde_json::to_string(&binding).unwrap_or_else(|_| "{}".to_owned());
        self.write(move |conn| {
            let n = conn.execute(sql::SET_SESSION_BINDING, params![session_id, json])?;
            Ok(n > 0)
        })
        .await
    }

    /// Record the agent's native session id (and that the session was touched).
    pub async fn set_native_session_id(
        &self,
        session_id: String,
        native_session_id: String,
    ) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::SET_NATIVE_SESSION_ID,
                params![session_id, native_session_id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// What the session is doing, as its row shows it.
    pub async fn set_session_state(
        &self,
        session_id: String,
        state: SessionState,
    ) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::SET_SESSION_STATE,
                params![session_id, state.as_str(), now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// Give a session a new title; `false` if there is no such session.
    pub async fn set_session_title(&self, session_id: String, title: String) -> StoreResult<bool> {
        self.write(move |conn| {
            let changed =
                conn.execute(sql::SET_SESSION_TITLE, params![session_id, title, now_ms()])?;
            Ok(changed > 0)
        })
        .await
    }

    /// Record a pending permission request (a repeated id replaces the earlier row).
    pub async fn insert_permission(&self, row: PermissionRow) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::INSERT_PERMISSION,
                params![
                    row.session_id,
                    row.request_id,
                    row.run_id,
                    row.tool,
                    row.input,
                    row.state.as_str(),
                    row.decision,
                    row.resolved_by,
                    row.created_at_ms,
                    row.resolved_at_ms
                ],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn get_permission(
        &self,
        session_id: String,
        request_id: String,
    ) -> StoreResult<Option<PermissionRow>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(sql::GET_PERMISSION)?
                .query_row(params![session_id, request_id], permission_from_row)
                .optional()?)
        })
        .await
    }

    /// Resolve a pending request; the first call wins, later ones get [`Resolve::Already`].
    pub async fn resolve_permission(
        &self,
        session_id: String,
        request_id: String,
        decision: String,
        by: String,
    ) -> StoreResult<Resolve> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            let changed = tx.execute(
                sql::RESOLVE_PERMISSION,
                params![
                    session_id,
                    request_id,
                    decision,
                    by,
                    now_ms(),
                    PermissionState::Resolved.as_str(),
                    PermissionState::Pending.as_str()
                ],
            )?;
            let row = tx
                .prepare_cached(sql::GET_PERMISSION)?
                .query_row(params![session_id, request_id], permission_from_row)
                .optional()?;
            tx.commit()?;
            Ok(match row {
                None => Resolve::NotFound,
                Some(row) if changed > 0 => Resolve::Resolved(row),
                Some(row) => Resolve::Already(row),
            })
        })
        .await
    }

    /// Pending requests, of one session or of all.
    pub async fn pending_permissions(
        &self,
        session_id: Option<String>,
    ) -> StoreResult<Vec<PermissionRow>> {
        self.read(move |conn| {
            let pending = PermissionState::Pending.as_str();
            // Two statements, so each reads an index (one session's key range, or the state's).
            let rows = match &session_id {
                Some(session_id) => conn
                    .prepare_cached(sql::PENDING_PERMISSIONS_ONE)?
                    .query_map(params![session_id, pending], permission_from_row)?
                    .collect::<Result<Vec<_>, _>>()?,
                None => conn
                    .prepare_cached(sql::PENDING_PERMISSIONS_ALL)?
                    .query_map(params![pending], permission_from_row)?
                    .collect::<Result<Vec<_>, _>>()?,
            };
            Ok(rows)
        })
        .await
    }

    /// Record an accepted "allow always" option on its session (again for the same request:
    /// kept as first written).
    pub async fn insert_permission_rule(
        &self,
        session_id: String,
        rule: PermissionRule,
    ) -> StoreResult<()> {
        self.write(move |conn| {
            conn.execute(
                sql::INSERT_PERMISSION_RULE,
                params![
                    session_id,
                    rule.request_id,
                    rule.tool,
                    rule.option_id,
                    rule.label,
                    rule.description,
                    rule.by,
                    rule.at_ms
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// The rules accepted in a session, oldest first.
    pub async fn permission_rules(&self, session_id: String) -> StoreResult<Vec<PermissionRule>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql::PERMISSION_RULES)?;
            let rules = stmt
                .query_map([session_id], |r| {
                    Ok(PermissionRule {
                        request_id: r.get(0)?,
                        tool: r.get(1)?,
                        option_id: r.get(2)?,
                        label: r.get(3)?,
                        description: r.get(4)?,
                        by: r.get(5)?,
                        at_ms: r.get(6)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rules)
        })
        .await
    }

    /// The choices a permission request offered, from its `permission.request` event in the
    /// log (the `permissions` row does not keep them): `None` if no such event is committed.
    pub async fn permission_options(
        &self,
        session_id: String,
        request_id: String,
    ) -> StoreResult<Option<Vec<PermissionOption>>> {
        self.read(move |conn| {
            let payload: Option<String> = conn
                .prepare_cached(sql::PERMISSION_REQUEST_EVENT)?
                .query_row(params![session_id, request_id], |r| r.get(0))
                .optional()?;
            Ok(payload.map(|p| {
                // Bare ids from older builds parse too; an option that does not is left out.
                serde_json::from_str::<serde_json::Value>(&p)
                    .ok()
                    .and_then(|v| {
                        v.get("options")?.as_array().map(|options| {
                            options
                                .iter()
                                .filter_map(|o| serde_json::from_value(o.clone()).ok())
                                .collect()
                        })
                    })
                    .unwrap_or_default()
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SessionRow;

    async fn store_with_session() -> (tempfile::TempDir, Store, super::super::StoreThreads) {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        store
            .insert_session(SessionRow {
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
            })
            .await
            .unwrap();
        (dir, store, threads)
    }

    fn run(id: &str, key: Option<&str>) -> RunRow {
        RunRow {
            run_id: id.into(),
            session_id: "s".into(),
            state: crate::protocol::states::RunStatus::Queued,
            client_msg_id: key.map(str::to_owned),
            error_category: None,
            message: None,
            created_at_ms: 1,
            ended_at_ms: None,
        }
    }

    #[tokio::test]
    async fn a_client_msg_id_names_one_run_per_session() {
        let (_dir, store, threads) = store_with_session().await;
        assert_eq!(
            store.insert_run(run("r1", Some("k"))).await.unwrap(),
            RunInsert::Inserted
        );
        match store.insert_run(run("r2", Some("k"))).await.unwrap() {
            RunInsert::Duplicate(row) => assert_eq!(row.run_id, "r1"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            store.insert_run(run("r3", None)).await.unwrap(),
            RunInsert::Inserted
        );
        assert_eq!(
            store.insert_run(run("r4", None)).await.unwrap(),
            RunInsert::Inserted
        );
        store
            .set_run_state("r1".into(), RunStatus::Running, None, None)
            .await
            .unwrap();
        store
            .set_run_state(
                "r3".into(),
                RunStatus::Failed,
                Some("agent_failed".into()),
                Some("it broke".into()),
            )
            .await
            .unwrap();
        let unfinished: Vec<String> = store
            .unfinished_runs()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(unfinished, ["r1", "r4"]);
        let r3 = store.get_run("r3".into()).await.unwrap().unwrap();
        assert_eq!(r3.error_category.as_deref(), Some("agent_failed"));
        assert_eq!(r3.message.as_deref(), Some("it broke"));
        assert!(r3.ended_at_ms.is_some());
        threads.shutdown().await;
    }

    /// `session.run`'s lookup: by run id or by client key, within the one session only.
    /// A queued prompt's sender is kept with its run and read back after the store reopens;
    /// a run without one (or with one that does not read) has none.
    #[tokio::test]
    async fn a_queued_runs_sender_survives_a_reopen() {
        let (dir, store, threads) = store_with_session().await;
        let from = PromptFrom {
            via: crate::protocol::events::PromptVia::Ws,
            subscriber_id: Some("sub".into()),
            client: Some("web".into()),
        };
        store
            .insert_sent_run(
                run("r1", None),
                Some("one".into()),
                Some(0),
                Some(from.clone()),
            )
            .await
            .unwrap();
        store
            .insert_prompt_run(run("r2", None), Some("two".into()), Some(1))
            .await
            .unwrap();
        store
            .insert_prompt_run(run("r3", None), Some("three".into()), Some(2))
            .await
            .unwrap();
        store
            .write(|conn| {
                conn.execute("UPDATE runs SET sender = 'nope' WHERE id = 'r3'", [])?;
                Ok(())
            })
            .await
            .unwrap();
        drop(store);
        threads.shutdown().await;
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let queued = store.queued_runs("s".into()).await.unwrap();
        let senders: Vec<_> = queued
            .iter()
            .map(|q| (q.run.run_id.as_str(), q.sender.clone()))
            .collect();
        assert_eq!(
            senders,
            vec![("r1", Some(from)), ("r2", None), ("r3", None)]
        );
        drop(store);
        threads.shutdown().await;
    }

    /// A queued prompt's attachments are kept with its run (schema 9) and read back, in order,
    /// after the store reopens: what the restored queue hands the agent. A run without any has
    /// none, and a value that does not read is none too.
    #[tokio::test]
    async fn a_queued_runs_attachments_survive_a_reopen() {
        use crate::protocol::options::{Attachment, AttachmentKind};
        let (dir, store, threads) = store_with_session().await;
        let attached = vec![
            Attachment {
                name: "shot.png".into(),
                mime: "image/png".into(),
                kind: AttachmentKind::Image,
                bytes: 68,
                sha256: "ab".repeat(32),
                path: "/h/attachments/s/abab.png".into(),
            },
            Attachment {
                name: "notes.md".into(),
                mime: "text/markdown".into(),
                kind: AttachmentKind::File,
                bytes: 5,
                sha256: "cd".repeat(32),
                path: "/h/attachments/s/cdcd.md".into(),
            },
        ];
        store
            .insert_attached_run(
                run("r1", None),
                Some("one".into()),
                Some(0),
                None,
                attached.clone(),
            )
            .await
            .unwrap();
        store
            .insert_prompt_run(run("r2", None), Some("two".into()), Some(1))
            .await
            .unwrap();
        store
            .insert_attached_run(run("r3", None), Some("three".into()), Some(2), None, vec![])
            .await
            .unwrap();
        let stored: Option<String> = store
            .read(|conn| {
                Ok(
                    conn.query_row("SELECT attachments FROM runs WHERE id = 'r3'", [], |r| {
                        r.get(0)
                    })?,
                )
            })
            .await
            .unwrap();
        assert_eq!(stored, None, "no attachments: NULL");
        drop(store);
        threads.shutdown().await;
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let queued = store.queued_runs("s".into()).await.unwrap();
        let got: Vec<_> = queued
            .iter()
            .map(|q| (q.run.run_id.as_str(), q.attachments.clone()))
            .collect();
        assert_eq!(got, vec![("r1", attached), ("r2", vec![]), ("r3", vec![])]);
        drop(store);
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn a_run_is_found_by_its_id_or_its_client_msg_id_in_its_session() {
        let (_dir, store, threads) = store_with_session().await;
        store.insert_run(run("r1", Some("k"))).await.unwrap();
        store.insert_run(run("r2", None)).await.unwrap();
        let find = |session: &str, key: RunRef| store.find_run(session.to_owned(), key);
        let by_key = find("s", RunRef::ClientMsgId("k".into())).await.unwrap();
        assert_eq!(by_key.map(|r| r.run_id).as_deref(), Some("r1"));
        let by_id = find("s", RunRef::RunId("r2".into())).await.unwrap();
        assert_eq!(by_id.map(|r| r.run_id).as_deref(), Some("r2"));
        assert_eq!(
            find("s", RunRef::ClientMsgId("nope".into())).await.unwrap(),
            None
        );
        assert_eq!(
            find("other", RunRef::RunId("r1".into())).await.unwrap(),
            None
        );
        assert_eq!(
            find("other", RunRef::ClientMsgId("k".into()))
                .await
                .unwrap(),
            None
        );
        // The key lookup is the unique index, not a scan of the table.
        let plan = store
            .read(|conn| {
                let mut stmt =
                    conn.prepare(&format!("EXPLAIN QUERY PLAN {}", sql::GET_RUN_BY_KEY))?;
                let rows = stmt
                    .query_map(params!["s", "k"], |r| r.get::<_, String>(3))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows.join("; "))
            })
            .await
            .unwrap();
        assert!(plan.contains("USING INDEX runs_client_msg"), "{plan}");
        threads.shutdown().await;
    }

    /// Rules are kept per session, oldest first, once per request, and go with the session.
    #[tokio::test]
    async fn permission_rules_are_listed_and_deleted_with_their_session() {
        let (_dir, store, threads) = store_with_session().await;
        let rule = |request: &str, at: i64| PermissionRule {
            request_id: request.into(),
            tool: "Bash".into(),
            option_id: "allow_always".into(),
            label: "Always allow Bash(ls)".into(),
            description: format!("rule {request}"),
            by: "ipc".into(),
            at_ms: at,
        };
        store
            .insert_permission_rule("s".into(), rule("p2", 20))
            .await
            .unwrap();
        store
            .insert_permission_rule("s".into(), rule("p1", 10))
            .await
            .unwrap();
        let mut again = rule("p1", 30);
        again.by = "late".into();
        store
            .insert_permission_rule("s".into(), again)
            .await
            .unwrap();
        let rules = store.permission_rules("s".into()).await.unwrap();
        assert_eq!(rules, [rule("p1", 10), rule("p2", 20)]);
        assert!(
            store
                .permission_rules("other".into())
                .await
                .unwrap()
                .is_empty()
        );
        assert!(store.delete_session("s".into()).await.unwrap());
        assert!(store.permission_rules("s".into()).await.unwrap().is_empty());
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn the_first_answer_to_a_permission_wins() {
        let (_dir, store, threads) = store_with_session().await;
        store
            .insert_permission(PermissionRow {
                session_id: "s".into(),
                request_id: "p".into(),
                run_id: Some("r".into()),
                tool: "Bash".into(),
                input: "{}".into(),
                state: PermissionState::Pending,
                decision: None,
                resolved_by: None,
                created_at_ms: 1,
                resolved_at_ms: None,
            })
            .await
            .unwrap();
        assert_eq!(store.pending_permissions(None).await.unwrap().len(), 1);
        let resolve =
            |by: &str| store.resolve_permission("s".into(), "p".into(), "deny".into(), by.into());
        match resolve("ws:a").await.unwrap() {
            Resolve::Resolved(row) => assert_eq!(row.resolved_by.as_deref(), Some("ws:a")),
            other => panic!("{other:?}"),
        }
        match resolve("ipc").await.unwrap() {
            Resolve::Already(row) => {
                assert_eq!(row.resolved_by.as_deref(), Some("ws:a"));
                assert_eq!(row.decision.as_deref(), Some("deny"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            store
                .pending_permissions(Some("s".into()))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            store
                .resolve_permission("s".into(), "nope".into(), "allow".into(), "ipc".into())
                .await
                .unwrap(),
            Resolve::NotFound
        );
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn busy_sessions_are_reset_to_idle_with_what_they_were() {
        let (_dir, store, threads) = store_with_session().await;
        store
            .set_session_state("s".into(), SessionState::Waiting)
            .await
            .unwrap();
        assert_eq!(
            store.reset_busy_sessions().await.unwrap(),
            [("s".to_owned(), SessionState::Waiting)]
        );
        let row = store.get_session("s".into()).await.unwrap().unwrap();
        assert_eq!(row.state, crate::protocol::states::SessionState::Idle);
        assert!(store.reset_busy_sessions().await.unwrap().is_empty());
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn a_title_is_set_on_an_existing_session_only() {
        let (_dir, store, threads) = store_with_session().await;
        assert!(
            store
                .set_session_title("s".into(), "named".into())
                .await
                .unwrap()
        );
        let row = store.get_session("s".into()).await.unwrap().unwrap();
        assert_eq!(row.title.as_deref(), Some("named"));
        assert!(
            !store
                .set_session_title("nope".into(), "named".into())
                .await
                .unwrap()
        );
        threads.shutdown().await;
    }

    #[tokio::test]
    async fn a_requests_options_come_from_its_event() {
        let (_dir, store, threads) = store_with_session().await;
        store
            .write(|conn| {
                for (request, options) in [("p", r#"["allow","deny"]"#), ("q", "[]")] {
                    conn.execute(
                        "INSERT INTO messages (message_id, session_id, run_id, kind, payload, \
                         created_at) VALUES (?1, 's', 'r', 'permission.request', ?2, 1)",
                        params![
                            format!("m-{request}"),
                            format!(
                                r#"{{"k":"permission.request","sessionId":"s","requestId":"{request}","tool":"Bash","options":{options}}}"#
                            )
                        ],
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
        let options = |request: &str| store.permission_options("s".into(), request.into());
        assert_eq!(
            options("p").await.unwrap(),
            Some(vec!["allow".into(), "deny".into()])
        );
        assert_eq!(options("q").await.unwrap(), Some(Vec::new()));
        assert_eq!(options("none").await.unwrap(), None);
        threads.shutdown().await;
    }
}
