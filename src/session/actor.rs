//! The session actor (design §8): one task per live session that owns its agent process, its
//! current run, its follow-up queue and its pending permission requests. Commands reach it
//! through a channel, so everything a session does happens in one order:
//!
//! - `send`: the run id is allocated and the run row written at once, and the caller gets the
//!   id before anything else happens. An idle session dispatches it; a busy one queues it
//!   (at most [`MAX_QUEUE`]; past that the oldest waiting prompt is dropped with a visible
//!   `warning` `followup_dropped` carrying its run id). Dispatch publishes `user.text` then
//!   `run.start`, after the previous run's `run.end`.
//! - the agent is opened lazily on the first dispatch: `--resume` of the native id the session
//!   row holds, else a new native session. A resume the agent rejects is reported (`error`
//!   `resume_rejected` and a `warning`) and the prompt goes on in a fresh native session.
//! - agent events are published with the current run id; `session.bound` is saved to the row
//!   first, a `permission.request` is saved as pending first.
//! - `cancel` interrupts the running turn (a queued run is just taken out of the queue); if the
//!   agent has not ended the turn within [`CANCEL_GRACE`], its process group is killed.
//! - permission answers are decided in the store (first answer wins), then passed to the
//!   agent and published as `permission.resolved` with who answered.
//! - when the agent process goes, its pending permission requests are expired.
//! - the session's state (`idle`, `running`, `waiting` while a permission request is pending)
//!   is this actor's to change: each change is written to the row, then published as one
//!   committed `session.state` bracket (`Actor::sync_state`). `run.start` comes before
//!   `running`, `run.end` before `idle`.
//! - `activate` opens the agent without a prompt (the same open, ownership check and fork
//!   decision as a first prompt), so the first prompt does not wait for the CLI to start.
//! - nothing reaches the agent before its `user.text` and `run.start` are committed. When the
//!   store cannot commit (its health turns `degraded`), the running turn is interrupted and
//!   nothing more of it is published; queued prompts wait. Once the store is back, the cut
//!   run is closed with a committed `run.end` `interrupted` (only then does its row say so),
//!   and the queue goes on.

mod files;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::SessionError;
use super::agent::{
    AdapterError, AgentOutput, AgentSession, FileChanges, Launcher, Native, NativeFile,
};
use super::ownership::{OwnedPid, Tail, Verdict};
use crate::bus::{Bus, BusError, MAX_EVENT_BYTES, Receipt};
pub use crate::protocol::envelope::PermissionDecision as Decision;
use crate::protocol::events::{
    ErrorCategory, ErrorNotice, Event, EventBody, Notice, PermissionResolved, RunEnd, RunStart,
    RunState, SessionStateChange, UserText,
};
use crate::protocol::states::{PermissionState, RunStatus, SessionState};
use crate::store::{
    PermissionRow, Resolve, RunInsert, RunRow, SessionRow, Store, StoreError, StoreHealth, now_ms,
};

/// Follow-ups waiting behind a busy run (design §8).
pub const MAX_QUEUE: usize = 3;
/// How long an interrupted turn may take to end before the agent's process group is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(3);
/// How long a turn may take to wind down when the host stops.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long after a turn ends the agent's own writes to its session file may still come (Claude
/// writes its transcript lazily, within about 1.5 s of the turn's end, and once more at exit);
/// only after it does the host watch the file for other writers.
pub const SETTLE: Duration = Duration::from_secs(3);
/// How soon a refused write is looked at again when the store's health already says `ok`.
const OUTAGE_RETRY: Duration = Duration::from_millis(200);
/// The longest prompt accepted.
pub const MAX_PROMPT_BYTES: usize = 256 * 1024;

pub use crate::protocol::replies::{
    ActivateReceipt, CancelOutcome, CancelReceipt, LiveStatus, PermissionReceipt, SendReceipt,
};

pub(super) type Reply<T> = oneshot::Sender<Result<T, SessionError>>;

pub(super) enum Msg {
    Send {
        text: String,
        client_msg_id: Option<String>,
        reply: Reply<SendReceipt>,
    },
    Cancel {
        run_id: Option<String>,
        reply: Reply<CancelReceipt>,
    },
    Permission {
        request_id: String,
        decision: Decision,
        message: Option<String>,
        by: String,
        reply: Reply<PermissionReceipt>,
    },
    /// Open the agent now, without a prompt.
    Activate {
        reply: Reply<ActivateReceipt>,
    },
    Status {
        reply: oneshot::Sender<LiveStatus>,
    },
    /// The choices each pending permission request offers, by request id.
    PendingOptions {
        reply: oneshot::Sender<HashMap<String, Vec<String>>>,
    },
    /// Stop the agent and end the task. `quiet`: publish nothing (the session is being
    /// deleted).
    Stop {
        quiet: bool,
        done: oneshot::Sender<()>,
    },
}

struct Current {
    run_id: String,
    text: String,
    /// When a cancel was asked for: the turn must end by then.
    cancel_deadline: Option<Instant>,
    /// A rejected resume already fell back to a fresh session in this run.
    retried_fresh: bool,
    /// The store failed during this run: it is being interrupted, and nothing more of it is
    /// published; it is closed once the store is back.
    lost: bool,
}

struct Queued {
    run_id: String,
    text: String,
    client_msg_id: Option<String>,
    /// Its `user.text` is committed already (a dispatch the store cut short after it).
    announced: bool,
}

pub(super) struct Actor {
    session_id: String,
    agent_type: String,
    cwd: PathBuf,
    /// The agent's native session id, once known (from the row or `session.bound`).
    native: Option<String>,
    store: Store,
    bus: Bus,
    launcher: Arc<dyn Launcher>,
    agent: Option<AgentSession>,
    /// The agent was opened with a resume that it has not confirmed yet.
    resuming: bool,
    current: Option<Current>,
    queue: VecDeque<Queued>,
    /// When an idle agent process is closed.
    idle_deadline: Option<Instant>,
    /// The child the host runs for this session, by pid and start time.
    owned: Option<OwnedPid>,
    /// Why the next open must fork (decided while a child was still running).
    fork_reason: Option<String>,
    /// The native session this one starts as a fork of (explicit fork, import).
    fork_of: Option<String>,
    /// When to start watching the session file (our child's own late writes are over).
    watch_at: Option<Instant>,
    /// The watch on the session file while our child is idle.
    watch: Option<FileChanges>,
    /// Someone else wrote the file while the host's child was idle.
    drifted: Option<String>,
    /// A fork under way: the source native id and why, until the fork's own id is bound. Its
    /// source is never baselined as ours, and a fork that dies early is tried again.
    forking_from: Option<(String, String)>,
    /// The native session file, once found, for the native id it belongs to.
    file: Option<(String, NativeFile)>,
    /// What the host has read of its file while its child runs (attributed families).
    tail: Option<Tail>,
    /// The host's prompt ids in this session (its run ids), once loaded.
    ours: Option<Arc<HashSet<String>>>,
    /// The running child was opened as a fork: its file starts with a copy of its source's
    /// history, prompts by whoever wrote them.
    born_fork: bool,
    /// The store's health, followed.
    health: tokio::sync::watch::Receiver<StoreHealth>,
    /// The store cannot commit (as this actor has seen): why.
    outage: Option<String>,
    /// Runs the outage cut short, to close with `run.end` `interrupted` once it is over.
    unclosed: Vec<String>,
    /// The store's outage count last seen: a higher one means an outage came and went.
    outages_seen: u64,
    /// A refused event was seen while the store's health said `ok` (its outage may already be
    /// over): look again then.
    outage_retry: Option<Instant>,
    /// The native session id could not be saved during an outage: saved once it is over.
    native_unsaved: bool,
    /// The session state last published (and written to the row).
    state: SessionState,
    /// The permission requests saved as pending and not answered yet: their offered choices,
    /// by request id. Non-empty during a run: the session is `waiting`.
    pending: HashMap<String, Vec<String>>,
}

async fn next_health(health: &mut tokio::sync::watch::Receiver<StoreHealth>) -> StoreHealth {
    if health.changed().await.is_err() {
        // The store is gone (shutdown): nothing more to follow.
        std::future::pending::<()>().await;
    }
    health.borrow_and_update().clone()
}

async fn next_output(agent: &mut Option<AgentSession>) -> AgentOutput {
    match agent {
        Some(agent) => agent.events.recv().await.unwrap_or(AgentOutput::Exited {
            status: "unknown (the driver ended)".to_owned(),
        }),
        None => std::future::pending().await,
    }
}

async fn next_change(watch: &mut Option<FileChanges>) {
    match watch {
        Some(watch) => {
            if watch.changes.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn category_name(category: Option<ErrorCategory>) -> Option<String> {
    category.and_then(|c| {
        serde_json::to_value(c)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
    })
}

impl Actor {
    pub(super) fn new(
        row: &SessionRow,
        store: Store,
        bus: Bus,
        launcher: Arc<dyn Launcher>,
    ) -> Actor {
        Actor {
            session_id: row.session_id.clone(),
            agent_type: row.agent_type.clone(),
            cwd: PathBuf::from(&row.cwd),
            native: row.native_session_id.clone(),
            health: store.watch_health(),
            outage: None,
            unclosed: Vec::new(),
            outages_seen: store.health().outages,
            outage_retry: None,
            native_unsaved: false,
            state: row.state,
            pending: HashMap::new(),
            store,
            bus,
            launcher,
            agent: None,
            resuming: false,
            current: None,
            queue: VecDeque::new(),
            idle_deadline: None,
            owned: None,
            fork_reason: None,
            fork_of: row.fork_of.clone(),
            watch_at: None,
            watch: None,
            drifted: None,
            forking_from: None,
            file: None,
            tail: None,
            ours: None,
            born_fork: false,
        }
    }

    pub(super) async fn run(mut self, mut inbox: mpsc::Receiver<Msg>) {
        let stop = loop {
            let deadline = self.current.as_ref().and_then(|c| c.cancel_deadline);
            let idle = self.idle_deadline.filter(|_| self.agent.is_some());
            tokio::select! {
                biased;
                // First: an outage must be known before any more of a turn is handled.
                health = next_health(&mut self.health) => self.on_health(health).await,
                () = until(self.outage_retry) => {
                    self.outage_retry = None;
                    self.on_store_back().await;
                }
                output = next_output(&mut self.agent) => self.on_output(output).await,
                msg = inbox.recv() => match msg {
                    Some(Msg::Stop { quiet, done }) => break Some((quiet, done)),
                    Some(msg) => self.on_msg(msg).await,
                    None => break None,
                },
                () = until(deadline) => self.on_cancel_timeout().await,
                () = until(idle) => self.on_idle().await,
                () = until(self.watch_at) => self.start_watch().await,
                () = next_change(&mut self.watch) => self.on_file_change().await,
            }
            // Whatever happened, the published state follows (each handler syncs where the
            // order of its events needs it; this catches the rest).
            self.sync_state().await;
        };
        let quiet = stop.as_ref().is_some_and(|(quiet, _)| *quiet);
        self.stop(quiet).await;
        if let Some((_, done)) = stop {
            let _caller_gone = done.send(());
        }
    }

    async fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Send {
                text,
                client_msg_id,
                reply,
            } => self.on_send(text, client_msg_id, reply).await,
            Msg::Cancel { run_id, reply } => {
                let answer = self.on_cancel(run_id).await;
                let _caller_gone = reply.send(answer);
            }
            Msg::Permission {
                request_id,
                decision,
                message,
                by,
                reply,
            } => {
                let answer = self.on_permission(request_id, decision, message, by).await;
                let _caller_gone = reply.send(answer);
            }
            Msg::Activate { reply } => {
                let answer = self.on_activate().await;
                let _caller_gone = reply.send(answer);
            }
            Msg::PendingOptions { reply } => {
                let _caller_gone = reply.send(self.pending.clone());
            }
            Msg::Status { reply } => {
                let _caller_gone = reply.send(LiveStatus {
                    agent_pid: self.agent.as_ref().and_then(AgentSession::pid),
                    run_id: self.current.as_ref().map(|c| c.run_id.clone()),
                    queued: self.queue.iter().map(|q| q.run_id.clone()).collect(),
                    watching: self.watch.is_some(),
                    drifted: self.drifted.is_some(),
                });
            }
            Msg::Stop { .. } => {}
        }
    }

    // ---- publishing ----

    async fn publish(&self, run_id: Option<&str>, body: EventBody) {
        self.publish_receipt(run_id, body).await;
    }

    /// Publish and wait until the event is committed: a terminal event goes to disk before
    /// the row that says the run is over, so after a crash the event log is never behind the
    /// rows (recovery reads the log, see [`super::SessionManager::recover`]). `false`: it was
    /// not committed (nor seen by anyone).
    async fn publish_committed(&self, run_id: Option<&str>, body: EventBody) -> bool {
        match self.publish_receipt(run_id, body).await {
            Some(receipt) => committed(receipt).await,
            None => false,
        }
    }

    async fn publish_receipt(&self, run_id: Option<&str>, body: EventBody) -> Option<Receipt> {
        let event = Event::new(&self.session_id, run_id.map(str::to_owned), body);
        match self.bus.publish(&event).await {
            Ok(receipt) => return Some(receipt),
            Err(BusError::TooLarge(size)) => {
                tracing::warn!(
                    size,
                    kind = event.kind(),
                    "an agent event is over the size limit"
                );
                // A block end is cut to fit rather than left out: every `*.start` gets its
                // `*.end`, marked `truncated` with the full size.
                if let Some(fitted) = event.body.truncated_to(size, MAX_EVENT_BYTES) {
                    let fitted = Event::new(&self.session_id, run_id.map(str::to_owned), fitted);
                    match self.bus.publish(&fitted).await {
                        Ok(receipt) => return Some(receipt),
                        Err(e) => tracing::error!(error = %e, "publishing a cut event failed"),
                    }
                }
                let notice = Event::new(
                    &self.session_id,
                    run_id.map(str::to_owned),
                    EventBody::Warning(Notice {
                        code: "event_too_large".to_owned(),
                        message: format!(
                            "a {} event of {size} bytes was over the limit and left out",
                            event.kind()
                        ),
                    }),
                );
                if let Err(e) = self.bus.publish(&notice).await {
                    tracing::error!(error = %e, "publishing failed");
                }
            }
            Err(e) => tracing::error!(error = %e, kind = event.kind(), "publishing failed"),
        }
        None
    }

    /// An event or row the store refused: nothing goes on as if it were durable. The outage is
    /// remembered; if the store already says `ok` (it recovered before this was seen, or the
    /// refusal had another cause) it is looked at again shortly, never in a tight loop.
    fn note_outage(&mut self) {
        let health = self.store.health();
        let ok = health.is_ok();
        let why = health
            .error
            .unwrap_or_else(|| "an event was not committed".to_owned());
        self.outage.get_or_insert(why);
        if ok && self.outage_retry.is_none() {
            self.outage_retry = Some(Instant::now() + OUTAGE_RETRY);
        }
    }

    async fn warn(&self, run_id: Option<&str>, code: &str, message: String) {
        let body = EventBody::Warning(Notice {
            code: code.to_owned(),
            message,
        });
        self.publish(run_id, body).await;
    }

    /// A prompt that will never run: its warning (committed), then its row.
    async fn retire_queued(&self, run_id: &str, state: RunStatus, code: &str, message: String) {
        let body = EventBody::Warning(Notice {
            code: code.to_owned(),
            message,
        });
        // No row claims what no event shows: a failed warning leaves the row for recovery.
        if self.publish_committed(Some(run_id), body).await {
            self.set_run_state(run_id, state, None).await;
        }
    }

    async fn set_run_state(&self, run_id: &str, state: RunStatus, category: Option<String>) {
        if let Err(e) = self
            .store
            .set_run_state(run_id.to_owned(), state, category)
            .await
        {
            tracing::error!(error = %e, run_id, "saving the run state failed");
        }
    }

    async fn set_session_state(&self, state: SessionState) -> bool {
        match self
            .store
            .set_session_state(self.session_id.clone(), state)
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "saving the session state failed");
                false
            }
        }
    }

    /// The state the session is in now: `idle` with no run, `waiting` while a run has a
    /// pending permission request, `running` otherwise. A prompt waiting at the queue's head
    /// (between two runs, or for the store) keeps it busy.
    fn wanted_state(&self) -> SessionState {
        if self.current.is_none() && self.queue.is_empty() {
            SessionState::Idle
        } else if self.current.is_some() && !self.pending.is_empty() {
            SessionState::Waiting
        } else {
            SessionState::Running
        }
    }

    /// Bring the published state in line with [`Self::wanted_state`]: on a change, the row
    /// first, then one committed `session.state` bracket (inside a run, with its id). Nothing
    /// while the store cannot commit: the change is published once it can. A change that was
    /// not committed is tried again at the next sync.
    pub(super) async fn sync_state(&mut self) {
        if self.outage.is_some() || self.current.as_ref().is_some_and(|c| c.lost) {
            return;
        }
        let state = self.wanted_state();
        let previous = self.state;
        if state == previous {
            return;
        }
        if !self.set_session_state(state).await {
            self.note_outage();
            return;
        }
        let run_id = self.current.as_ref().map(|c| c.run_id.clone());
        let body = EventBody::SessionState(SessionStateChange { state, previous });
        if self.publish_committed(run_id.as_deref(), body).await {
            tracing::debug!(%previous, %state, "session state");
            self.state = state;
        } else {
            self.note_outage();
        }
    }

    // ---- runs ----

    async fn on_send(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        reply: Reply<SendReceipt>,
    ) {
        let run_id = uuid::Uuid::now_v7().to_string();
        let row = RunRow {
            run_id: run_id.clone(),
            session_id: self.session_id.clone(),
            state: RunStatus::Queued,
            client_msg_id: client_msg_id.clone(),
            error_category: None,
            created_at_ms: now_ms(),
            ended_at_ms: None,
        };
        match self.store.insert_run(row).await {
            Err(e) => {
                let _caller_gone = reply.send(Err(e.into()));
                return;
            }
            Ok(RunInsert::Duplicate(existing)) => {
                tracing::info!(run_id = %existing.run_id, "a retried prompt: same run");
                let _caller_gone = reply.send(Ok(SendReceipt {
                    queued: existing.state == RunStatus::Queued,
                    run_id: existing.run_id,
                    duplicate: true,
                }));
                return;
            }
            Ok(RunInsert::Inserted) => {}
        }
        let item = Queued {
            run_id: run_id.clone(),
            text,
            client_msg_id,
            announced: false,
        };
        let busy = self.current.is_some() || !self.queue.is_empty();
        // The caller has its run id before anything else happens.
        let _caller_gone = reply.send(Ok(SendReceipt {
            run_id,
            queued: busy,
            duplicate: false,
        }));
        if !busy {
            self.dispatch(item).await;
            return;
        }
        self.queue.push_back(item);
        while self.queue.len() > MAX_QUEUE {
            if let Some(dropped) = self.queue.pop_front() {
                tracing::info!(run_id = %dropped.run_id, "follow-up queue full: dropped the oldest");
                self.retire_queued(
                    &dropped.run_id,
                    RunStatus::Dropped,
                    "followup_dropped",
                    format!(
                        "more than {MAX_QUEUE} prompts were waiting; the oldest one was dropped \
                         and will not run"
                    ),
                )
                .await;
            }
        }
    }

    /// Start a run: `user.text`, `run.start`, then the prompt to the agent — only once both
    /// are committed. While the store cannot commit, the prompt waits at the queue's head.
    async fn dispatch(&mut self, mut item: Queued) {
        if self.outage.is_some() {
            self.queue.push_front(item);
            return;
        }
        tracing::info!(run_id = %item.run_id, "run dispatched");
        self.idle_deadline = None;
        // Our child writes the file from now on; a change already waiting is someone else's
        // (unattributed families: their watch is for idle times only).
        if !self.attributed() {
            self.watch_at = None;
        }
        self.stop_watch().await;
        self.own_prompt(&item.run_id);
        // Queued now: in the writer's order before the events and anything this run saves.
        let saved = self
            .store
            .start_run(self.session_id.clone(), item.run_id.clone())
            .await;
        let user = if item.announced {
            None
        } else {
            self.publish_receipt(
                Some(&item.run_id),
                EventBody::UserText(UserText {
                    text: item.text.clone(),
                    client_msg_id: item.client_msg_id.clone(),
                }),
            )
            .await
        };
        let start = self
            .publish_receipt(
                Some(&item.run_id),
                EventBody::RunStart(RunStart {
                    agent: Some(self.agent_type.clone()),
                    model: None,
                }),
            )
            .await;
        let saved = match saved {
            Ok(committed) => committed.await.unwrap_or(Err(StoreError::Closed)),
            Err(e) => Err(e),
        };
        if let Err(e) = &saved {
            tracing::error!(error = %e, "saving the run start failed");
        }
        let announced = match user {
            Some(receipt) => committed(receipt).await,
            None => item.announced,
        };
        let started = match start {
            Some(receipt) => committed(receipt).await,
            None => false,
        };
        if !(announced && started && saved.is_ok()) {
            self.note_outage();
            tracing::warn!(run_id = %item.run_id, "the store cannot commit: the prompt waits");
            item.announced = announced;
            self.queue.push_front(item);
            return;
        }
        self.current = Some(Current {
            run_id: item.run_id,
            text: item.text,
            cancel_deadline: None,
            retried_fresh: false,
            lost: false,
        });
        // After its `run.start`, before anything the agent says.
        self.sync_state().await;
        self.start_turn().await;
    }

    // ---- store outages ----

    async fn on_health(&mut self, health: StoreHealth) {
        if health.outages > self.outages_seen {
            // Down (and perhaps up again already, between two looks): what ran meanwhile lost
            // events either way.
            self.outages_seen = health.outages;
            let why = health
                .error
                .clone()
                .unwrap_or_else(|| "a commit failed".to_owned());
            self.on_store_down(why).await;
        }
        if health.error.is_none() {
            self.on_store_back().await;
        }
    }

    /// The store cannot commit: interrupt the running turn (killed if it does not stop within
    /// the cancel grace); nothing more of it is published.
    async fn on_store_down(&mut self, why: String) {
        self.outage.get_or_insert(why);
        let Some(current) = self.current.as_mut() else {
            return;
        };
        if current.lost {
            return;
        }
        current.lost = true;
        tracing::warn!(run_id = %current.run_id, "the store cannot commit: interrupting the running turn");
        if current.cancel_deadline.is_none() {
            current.cancel_deadline = Some(Instant::now() + CANCEL_GRACE);
            if let Some(agent) = self.agent.as_ref()
                && let Err(e) = agent.cancel_turn().await
            {
                tracing::info!(error = %e, "interrupt not delivered; the agent is going away");
            }
        }
    }

    /// The store commits again: close the runs the outage cut short, then go on with the
    /// queue.
    async fn on_store_back(&mut self) {
        if self.outage.is_none() && self.unclosed.is_empty() {
            return;
        }
        if !self.store.health().is_ok() {
            // Not over yet: the health watch says when it is.
            return;
        }
        let why = self.outage.take().unwrap_or_default();
        if self.native_unsaved
            && let Some(native) = self.native.clone()
        {
            match self
                .store
                .set_native_session_id(self.session_id.clone(), native)
                .await
            {
                Ok(()) => self.native_unsaved = false,
                Err(e) => {
                    tracing::error!(error = %e, "saving the native session id failed");
                    self.note_outage();
                    return;
                }
            }
        }
        while let Some(run_id) = self.unclosed.first().cloned() {
            let end = RunEnd {
                state: RunState::Interrupted,
                category: None,
                message: Some(format!(
                    "the store could not commit this run's events ({why}); the turn was \
                     interrupted"
                )),
            };
            // Its permission requests go with it, before its end.
            self.expire_permissions("the run ended").await;
            if !self
                .publish_committed(Some(&run_id), EventBody::RunEnd(end))
                .await
            {
                // Down again: the next recovery tries once more.
                self.note_outage();
                return;
            }
            self.set_run_state(&run_id, RunStatus::Interrupted, None)
                .await;
            self.unclosed.remove(0);
            tracing::info!(%run_id, "a run the store outage cut short is closed");
            if self.current.is_none() {
                self.turn_ended(RunState::Interrupted).await;
            }
        }
        if self.current.is_none() {
            match self.queue.pop_front() {
                Some(next) => Box::pin(self.dispatch(next)).await,
                None => {
                    self.sync_state().await;
                    self.idle_deadline = self.launcher.idle_timeout().map(|t| Instant::now() + t);
                }
            }
        }
    }

    /// Hand the current run's prompt to the agent, opening it first if needed. A failure ends
    /// the run.
    async fn start_turn(&mut self) {
        let Some((text, run_id)) = self
            .current
            .as_ref()
            .map(|c| (c.text.clone(), c.run_id.clone()))
        else {
            return;
        };
        for attempt in 0..2 {
            if let Err(e) = self.ready_agent().await {
                self.fail_run(e).await;
                return;
            }
            let Some(agent) = self.agent.as_ref() else {
                return;
            };
            match agent.send(&text, &run_id).await {
                Ok(()) => return,
                Err(e) if attempt == 0 => {
                    // The process went away while idle and its exit is not seen yet: a new one.
                    tracing::info!(error = %e, "the agent was gone; opening it again");
                    self.drop_agent().await;
                }
                Err(e) => {
                    self.fail_run(e).await;
                    return;
                }
            }
        }
    }

    /// An agent a prompt may go to: the live child if it may be continued, else a newly opened
    /// one (a fork when someone else wrote or holds the session). What a first prompt and
    /// `activate` share.
    async fn ready_agent(&mut self) -> Result<(), AdapterError> {
        // A child whose file someone else wrote is not continued: closed, and a fork.
        if let Some(why) = self.drifted.take() {
            // Someone may also still hold it: say so too.
            let why = match self.registered_holder().await {
                Some(holder) => format!("{holder}; {why}"),
                None => why,
            };
            // Killed, not closed: a CLI closing cleanly writes its session file once more.
            if let Some(agent) = self.agent.take() {
                agent.close(Duration::ZERO).await;
            }
            self.resuming = false;
            self.fork_reason = Some(why);
        }
        // A live child is not continued if another process has its session open now: it is
        // closed, and the prompt goes on in a fork.
        if self.agent.is_some()
            && let Some(id) = self.native.clone()
            && let Verdict::Fork(why) = self.verdict(&id, true).await
        {
            if let Some(agent) = self.agent.take() {
                agent.close(Duration::ZERO).await;
            }
            self.agent = None;
            self.resuming = false;
            self.fork_reason = Some(why);
        }
        if self.agent.is_none() {
            self.open_agent().await?;
        }
        Ok(())
    }

    /// Open the agent now, without a prompt, so the first one does not wait for the CLI to
    /// start. An agent already open (or being opened by a run) is left as it is.
    async fn on_activate(&mut self) -> Result<ActivateReceipt, SessionError> {
        let already = self.agent.is_some() || self.current.is_some();
        if !already {
            self.ready_agent().await.map_err(|e| {
                tracing::warn!(error = %e.message, category = ?e.category, "activation failed");
                SessionError::AgentUnavailable(format!(
                    "{} ({})",
                    e.message,
                    category_name(Some(e.category)).unwrap_or_default()
                ))
            })?;
            // Unused, it is closed like any idle agent.
            if self.queue.is_empty() {
                self.idle_deadline = self.launcher.idle_timeout().map(|t| Instant::now() + t);
            }
        }
        Ok(ActivateReceipt {
            session_id: self.session_id.clone(),
            agent_pid: self.agent.as_ref().and_then(AgentSession::pid),
            already,
        })
    }

    async fn open_agent(&mut self) -> Result<(), AdapterError> {
        let native = match self.native.clone() {
            Some(id) => {
                let verdict = match self.fork_reason.take() {
                    Some(why) => Verdict::Fork(why),
                    None => self.verdict(&id, false).await,
                };
                match verdict {
                    Verdict::ResumeInPlace => Native::Resume(id),
                    Verdict::Fork(why) => {
                        self.tail = None;
                        self.announce_fork(&id, &why).await;
                        self.forking_from = Some((id.clone(), why));
                        Native::Fork(id)
                    }
                }
            }
            // A forked or imported session: its first agent forks the source.
            None => match self.fork_of.clone() {
                Some(source) => {
                    self.forking_from =
                        Some((source.clone(), "a forked or imported session".to_owned()));
                    Native::Fork(source)
                }
                None => Native::New(uuid::Uuid::new_v4().to_string()),
            },
        };
        self.resuming = !matches!(native, Native::New(_));
        self.born_fork = matches!(native, Native::Fork(_));
        let agent = match self
            .launcher
            .open(&self.agent_type, &self.cwd, &self.session_id, native)
        {
            Ok(agent) => agent,
            Err(e) => {
                self.tail = None;
                return Err(e);
            }
        };
        tracing::info!(pid = ?agent.pid(), resuming = self.resuming, "agent started");
        self.owned = agent.pid().and_then(OwnedPid::of);
        self.agent = Some(agent);
        self.watch_opened();
        Ok(())
    }

    /// Forget the agent process (its driver stops the group) and expire what it left pending.
    async fn drop_agent(&mut self) {
        let had_agent = self.agent.take().is_some() || self.owned.is_some();
        self.resuming = false;
        self.expire_permissions("the agent process ended").await;
        if had_agent {
            self.record_baseline().await;
        }
    }

    /// End the current run as failed with `e`'s category.
    async fn fail_run(&mut self, e: AdapterError) {
        tracing::warn!(error = %e.message, category = ?e.category, "the run failed");
        let run_id = self.current.as_ref().map(|c| c.run_id.clone());
        // A run the store outage cut short publishes nothing more (its end comes later).
        if !self.current.as_ref().is_some_and(|c| c.lost) {
            self.publish(
                run_id.as_deref(),
                EventBody::Error(ErrorNotice {
                    category: e.category,
                    message: e.message.clone(),
                }),
            )
            .await;
        }
        self.end_run(RunEnd {
            state: RunState::Failed,
            category: Some(e.category),
            message: Some(e.message),
        })
        .await;
    }

    /// Publish the current run's `run.end`, save it, and dispatch the next queued prompt.
    async fn end_run(&mut self, mut end: RunEnd) {
        let Some(current) = self.current.take() else {
            tracing::warn!(state = ?end.state, "a run.end with no run in progress; skipped");
            return;
        };
        if current.lost || self.outage.is_some() {
            // Cut short by a store outage: closed, visibly, once the store is back (its
            // permissions expire then, before its end).
            self.unclosed.push(current.run_id);
            if self.store.health().is_ok() {
                Box::pin(self.on_store_back()).await;
            }
            return;
        }
        if current.cancel_deadline.is_some() && end.state == RunState::Failed {
            // The turn was being cancelled and the agent died doing it: still a cancel.
            end.state = RunState::Cancelled;
            end.category = Some(ErrorCategory::Cancelled);
        }
        self.expire_permissions("the run ended").await;
        // Nothing of an ended run waits for a person any more, even if an expiry could not be
        // written (the store row is expired at the next start): the session is not `waiting`.
        self.pending.clear();
        let state = RunStatus::from(end.state);
        let category = category_name(end.category);
        if self.queue.is_empty() {
            // Before the `run.end`: whoever sees it reads the session idle. (A crash right
            // after leaves it `running`; recovery resets that.) Its `session.state` follows
            // the `run.end`.
            self.set_session_state(SessionState::Idle).await;
            self.idle_deadline = self.launcher.idle_timeout().map(|t| Instant::now() + t);
        }
        let ended = end.state;
        // The event is committed before the run's row says it ended.
        if !self
            .publish_committed(Some(&current.run_id), EventBody::RunEnd(end))
            .await
        {
            self.note_outage();
            // The store failed at the very end: no row says this run ended until an event
            // does; the next prompt waits for the store.
            self.unclosed.push(current.run_id);
            return;
        }
        self.set_run_state(&current.run_id, state, category).await;
        // `idle`, or `running` on (from `waiting`) when a follow-up is next.
        self.sync_state().await;
        self.turn_ended(ended).await;
        if let Some(next) = self.queue.pop_front() {
            Box::pin(self.dispatch(next)).await;
        }
    }

    async fn on_output(&mut self, output: AgentOutput) {
        let body = match output {
            AgentOutput::Event(body) => body,
            AgentOutput::Exited { status } => {
                tracing::info!(%status, "agent exited");
                self.drop_agent().await;
                if self.current.is_some() {
                    self.fail_run(AdapterError::new(
                        ErrorCategory::AgentFailed,
                        format!("the agent process exited ({status})"),
                    ))
                    .await;
                }
                return;
            }
        };
        let run_id = self.current.as_ref().map(|c| c.run_id.clone());
        let lost = self.current.as_ref().is_some_and(|c| c.lost);
        if lost && !matches!(body, EventBody::RunEnd(_) | EventBody::SessionBound(_)) {
            // A run the store outage cut short: nothing more of it is published.
            tracing::debug!(kind = body.kind(), "dropped: the store cannot commit");
            return;
        }
        match body {
            EventBody::RunEnd(end) => {
                // A cancelled prompt is not re-run in a fresh session: the run just ends.
                let rejected = end.category == Some(ErrorCategory::ResumeRejected)
                    && self.resuming
                    && self
                        .current
                        .as_ref()
                        .is_some_and(|c| !c.retried_fresh && c.cancel_deadline.is_none());
                if rejected {
                    self.continue_fresh().await;
                } else {
                    self.end_run(end).await;
                }
            }
            EventBody::SessionBound(bound) => {
                self.resuming = false;
                if self
                    .forking_from
                    .as_ref()
                    .is_some_and(|(source, _)| *source != bound.native_session_id)
                {
                    self.forking_from = None;
                }
                if self.fork_of.take().is_some()
                    && let Ok(Some(mut row)) = self.store.get_session(self.session_id.clone()).await
                {
                    row.fork_of = None;
                    if let Err(e) = self.store.replace_session_lineage(row).await {
                        tracing::error!(error = %e, "clearing the fork source failed");
                    }
                }
                if self.native.as_deref() != Some(bound.native_session_id.as_str()) {
                    if let Err(e) = self
                        .store
                        .set_native_session_id(
                            self.session_id.clone(),
                            bound.native_session_id.clone(),
                        )
                        .await
                    {
                        // Saved once the store is back (if that is why).
                        tracing::error!(error = %e, "saving the native session id failed");
                        self.native_unsaved = true;
                    }
                    self.native = Some(bound.native_session_id.clone());
                    self.native_changed();
                }
                if !lost {
                    self.publish(run_id.as_deref(), EventBody::SessionBound(bound))
                        .await;
                }
            }
            EventBody::PermissionRequest(request) => {
                let row = PermissionRow {
                    session_id: self.session_id.clone(),
                    request_id: request.request_id.clone(),
                    run_id: run_id.clone(),
                    tool: request.tool.clone(),
                    input: request.input.to_string(),
                    state: PermissionState::Pending,
                    decision: None,
                    resolved_by: None,
                    created_at_ms: now_ms(),
                    resolved_at_ms: None,
                };
                match self.store.insert_permission(row).await {
                    Ok(()) => {
                        self.pending
                            .insert(request.request_id.clone(), request.options.clone());
                    }
                    Err(e) => tracing::error!(error = %e, "saving a permission request failed"),
                }
                self.publish(run_id.as_deref(), EventBody::PermissionRequest(request))
                    .await;
                // `waiting`, after the request it waits for.
                self.sync_state().await;
            }
            EventBody::PermissionResolved(resolved) => {
                // The agent withdrew its own request.
                let by = resolved.by.clone().unwrap_or_else(|| "agent".to_owned());
                match self
                    .store
                    .resolve_permission(
                        self.session_id.clone(),
                        resolved.request_id.clone(),
                        resolved.decision.clone(),
                        by,
                    )
                    .await
                {
                    Ok(Resolve::Resolved(_)) => {
                        self.pending.remove(&resolved.request_id);
                        self.publish(run_id.as_deref(), EventBody::PermissionResolved(resolved))
                            .await;
                        self.sync_state().await;
                    }
                    Ok(_) => {
                        // Answered before, or never saved: not pending either way.
                        self.pending.remove(&resolved.request_id);
                    }
                    Err(e) => tracing::error!(error = %e, "saving a withdrawn permission failed"),
                }
            }
            other => self.publish(run_id.as_deref(), other).await,
        }
    }

    /// The agent rejected the resume: say so, and run the prompt in a fresh native session.
    async fn continue_fresh(&mut self) {
        let rejected = self
            .native
            .take()
            .or_else(|| self.fork_of.take())
            .unwrap_or_default();
        self.fork_of = None;
        let run_id = self.current.as_ref().map(|c| c.run_id.clone());
        if let Some(current) = self.current.as_mut() {
            current.retried_fresh = true;
        }
        self.drop_agent().await;
        tracing::warn!(native = %rejected, "the agent rejected the resume; starting fresh");
        self.warn(
            run_id.as_deref(),
            "resume_rejected",
            format!(
                "the agent could not resume its session {rejected}; this prompt continues in a \
                 fresh agent session, which does not remember the earlier turns"
            ),
        )
        .await;
        self.start_turn().await;
    }

    async fn on_cancel(&mut self, run_id: Option<String>) -> Result<CancelReceipt, SessionError> {
        if let Some(wanted) = &run_id
            && let Some(index) = self.queue.iter().position(|q| &q.run_id == wanted)
            && let Some(item) = self.queue.remove(index)
        {
            self.retire_queued(
                &item.run_id,
                RunStatus::Cancelled,
                "followup_cancelled",
                "this queued prompt was cancelled before it ran".to_owned(),
            )
            .await;
            return Ok(CancelReceipt {
                run_id: item.run_id,
                state: CancelOutcome::Cancelled,
            });
        }
        let current_id = self.current.as_ref().map(|c| c.run_id.clone());
        let Some(current_id) = current_id.filter(|id| run_id.as_ref().is_none_or(|w| w == id))
        else {
            return Err(SessionError::RunNotFound(run_id.unwrap_or_else(|| {
                "no run is in progress in this session".to_owned()
            })));
        };
        // One interrupt per run: a repeated cancel only answers (so a burst of cancels can
        // never fill the driver's input queue while it waits for us to take its events).
        let first_cancel = self
            .current
            .as_ref()
            .is_some_and(|c| c.cancel_deadline.is_none());
        if first_cancel {
            if let Some(current) = self.current.as_mut() {
                current.cancel_deadline = Some(Instant::now() + CANCEL_GRACE);
            }
            if let Some(agent) = self.agent.as_ref()
                && let Err(e) = agent.cancel_turn().await
            {
                tracing::info!(error = %e, "interrupt not delivered; the agent is going away");
            }
        }
        Ok(CancelReceipt {
            run_id: current_id,
            state: CancelOutcome::Cancelling,
        })
    }

    /// Nothing ran for a while: close the agent process; the next prompt resumes the session.
    async fn on_idle(&mut self) {
        self.idle_deadline = None;
        if self.current.is_some() || !self.queue.is_empty() {
            return;
        }
        self.stop_watch().await;
        if let Some(agent) = self.agent.take() {
            tracing::info!(pid = ?agent.pid(), "closing an idle agent");
            agent.close(self.close_grace()).await;
        }
        self.drop_agent().await;
    }

    /// The agent did not end an interrupted turn in time: kill it and end the run.
    async fn on_cancel_timeout(&mut self) {
        tracing::warn!("the agent ignored the interrupt; killing its process group");
        if let Some(agent) = self.agent.take() {
            agent.close(Duration::ZERO).await;
        }
        self.drop_agent().await;
        self.end_run(RunEnd {
            state: RunState::Cancelled,
            category: Some(ErrorCategory::Cancelled),
            message: Some(format!(
                "the agent did not stop within {} s; its process was killed",
                CANCEL_GRACE.as_secs()
            )),
        })
        .await;
    }

    async fn on_permission(
        &mut self,
        request_id: String,
        decision: Decision,
        message: Option<String>,
        by: String,
    ) -> Result<PermissionReceipt, SessionError> {
        let resolution = self
            .store
            .resolve_permission(
                self.session_id.clone(),
                request_id.clone(),
                decision.as_str().to_owned(),
                by.clone(),
            )
            .await?;
        let row = match resolution {
            Resolve::NotFound => return Err(SessionError::PermissionNotFound(request_id)),
            Resolve::Already(row) => {
                self.pending.remove(&request_id);
                return Err(SessionError::AlreadyResolved {
                    request_id,
                    decision: row.decision.unwrap_or_default(),
                    by: row.resolved_by.unwrap_or_default(),
                });
            }
            Resolve::Resolved(row) => row,
        };
        self.pending.remove(&request_id);
        let input = serde_json::from_str::<Value>(&row.input).unwrap_or(Value::Null);
        if let Some(agent) = self.agent.as_ref()
            && let Err(e) = agent
                .respond_permission(
                    &request_id,
                    decision == Decision::Allow,
                    &input,
                    message.as_deref(),
                )
                .await
        {
            tracing::info!(error = %e, "the agent is gone before the answer reached it");
        }
        self.publish(
            row.run_id.as_deref(),
            EventBody::PermissionResolved(PermissionResolved {
                request_id: request_id.clone(),
                decision: decision.as_str().to_owned(),
                by: Some(by),
            }),
        )
        .await;
        // `running` again once the last request is answered.
        self.sync_state().await;
        Ok(PermissionReceipt {
            request_id,
            decision: decision.as_str().to_owned(),
        })
    }

    /// Resolve every pending request of this session as `expired` by the host.
    async fn expire_permissions(&mut self, why: &str) {
        let pending = match self
            .store
            .pending_permissions(Some(self.session_id.clone()))
            .await
        {
            Ok(pending) => pending,
            Err(e) => {
                tracing::error!(error = %e, "reading pending permissions failed");
                return;
            }
        };
        for row in pending {
            tracing::info!(request_id = %row.request_id, why, "permission request expired");
            self.pending.remove(&row.request_id);
            expire_permission(&self.store, &self.bus, row).await;
        }
    }

    /// The task ends: queued prompts will not run, a running turn is interrupted, the agent
    /// is closed. `quiet` publishes nothing (the session's events are being deleted).
    async fn stop(&mut self, quiet: bool) {
        for item in std::mem::take(&mut self.queue) {
            if quiet {
                self.set_run_state(&item.run_id, RunStatus::Dropped, None)
                    .await;
            } else {
                self.retire_queued(
                    &item.run_id,
                    RunStatus::Dropped,
                    "followup_dropped",
                    "the host stopped before this prompt ran".to_owned(),
                )
                .await;
            }
        }
        if self.current.is_some() && !quiet {
            self.wind_down_turn().await;
        }
        self.stop_watch().await;
        if let Some(agent) = self.agent.take() {
            agent.close(self.close_grace()).await;
            if !quiet {
                self.record_baseline().await;
            }
        }
        if quiet {
            return;
        }
        self.expire_permissions("the host stopped").await;
        self.pending.clear();
        self.set_session_state(SessionState::Idle).await;
        if let Some(current) = self.current.take() {
            self.publish_committed(
                Some(&current.run_id),
                EventBody::RunEnd(RunEnd {
                    state: RunState::Interrupted,
                    category: None,
                    message: Some("the host stopped during this run".to_owned()),
                }),
            )
            .await;
            self.set_run_state(&current.run_id, RunStatus::Interrupted, None)
                .await;
        }
        // After the run's `run.end`.
        self.sync_state().await;
    }

    /// Interrupt the running turn and pass on what the agent says until it ends (or the grace
    /// runs out). A turn that completed keeps its `run.end`; any other becomes `interrupted`.
    async fn wind_down_turn(&mut self) {
        let Some(agent) = self.agent.as_mut() else {
            return;
        };
        if agent.cancel_turn().await.is_err() {
            return;
        }
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            let Some(agent) = self.agent.as_mut() else {
                return;
            };
            let output = match tokio::time::timeout_at(deadline, agent.events.recv()).await {
                Ok(Some(output)) => output,
                Ok(None) | Err(_) => return,
            };
            match output {
                AgentOutput::Event(EventBody::RunEnd(end)) => {
                    if end.state == RunState::Completed {
                        // It finished on its own: that is how it ended.
                        self.end_run(end).await;
                    }
                    return;
                }
                AgentOutput::Exited { .. } => return,
                AgentOutput::Event(
                    body @ (EventBody::PermissionRequest(_) | EventBody::PermissionResolved(_)),
                ) => {
                    tracing::debug!(kind = body.kind(), "skipped while stopping");
                }
                output => self.on_output(output).await,
            }
        }
    }
}

/// Whether a published bracket was committed (a refused one is logged).
async fn committed(receipt: Receipt) -> bool {
    match receipt.committed().await {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(error = %e, "an event was not committed");
            false
        }
    }
}

/// Mark a pending request expired and publish that.
pub(super) async fn expire_permission(store: &Store, bus: &Bus, row: PermissionRow) {
    match store
        .resolve_permission(
            row.session_id.clone(),
            row.request_id.clone(),
            "expired".to_owned(),
            "host".to_owned(),
        )
        .await
    {
        Ok(Resolve::Resolved(_)) => {
            let event = Event::new(
                row.session_id,
                row.run_id,
                EventBody::PermissionResolved(PermissionResolved {
                    request_id: row.request_id,
                    decision: "expired".to_owned(),
                    by: Some("host".to_owned()),
                }),
            );
            if let Err(e) = bus.publish(&event).await {
                tracing::error!(error = %e, "publishing an expired permission failed");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "expiring a permission request failed"),
    }
}
