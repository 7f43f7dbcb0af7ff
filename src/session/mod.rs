//! Sessions: creation, lookup, deletion, history, and runs.
//!
//! A session is its row plus its events. Once a prompt is sent to it (or it is activated), a
//! session actor ([`actor`]) owns its live agent process, its runs, its follow-up queue, its
//! pending permission requests and its state (`idle`, `running`, `waiting`: each change
//! published as a `session.state` bracket); the [`SessionManager`] starts actors lazily and
//! routes commands to them. Every event of a session is published through the [`Bus`], never
//! written to the store directly. At start, [`SessionManager::recover`] closes what a stopped
//! host left open.

pub mod actor;
pub mod agent;
pub mod attachments;
pub mod binding;
pub mod discover;
mod listing;
pub mod options;
pub mod ownership;
#[cfg(test)]
mod scripted_tests;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

pub use crate::protocol::replies::ModelSet;
pub use actor::{
    ActivateReceipt, CancelReceipt, Decision, LiveStatus, MAX_PROMPT_BYTES, PermissionReceipt,
    QueueEdited, QueueEntry, SendReceipt, SteerReceipt,
};
pub use agent::{Launcher, NativeFile, NoAgents};

use crate::bus::Bus;
use crate::protocol::envelope::HistoryFrom;
use crate::protocol::events::{
    Event, EventBody, Notice, PermissionOption, PromptFrom, RunEnd, RunState, SessionForked,
    SessionStateChange,
};
use crate::protocol::states::{PermissionState, RunStatus, SessionState};
use crate::store::{SessionRow, Store, StoreError, StoreHealth, StoredEvent, now_ms};

/// Which end of a history page [`keep_within`] keeps when the page is too large.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// A forward page: the caller pages on from its last event.
    Oldest,
    /// A backward page: the caller pages on from its first event.
    Newest,
}

/// Cut a page (ascending) to about `max_bytes` of payload, keeping the end `keep` names and
/// always at least one event, so that a page stays within a size any client accepts and
/// paging on from the kept end loses nothing. True when something was cut.
fn keep_within(events: &mut Vec<StoredEvent>, max_bytes: usize, keep: Keep) -> bool {
    let mut bytes = 0;
    let mut fits = |e: &StoredEvent| {
        bytes += e.payload.len();
        bytes <= max_bytes
    };
    let kept = match keep {
        Keep::Oldest => events.iter().take_while(|e| fits(e)).count(),
        Keep::Newest => events.iter().rev().take_while(|e| fits(e)).count(),
    }
    .max(1);
    if kept >= events.len() {
        return false;
    }
    match keep {
        Keep::Oldest => events.truncate(kept),
        Keep::Newest => {
            events.drain(..events.len() - kept);
        }
    }
    true
}

/// The most a page of history may hold.
pub const MAX_HISTORY_LIMIT: u32 = 5000;
pub const DEFAULT_HISTORY_LIMIT: u32 = 200;
/// The most payload bytes one page of history carries (always at least one event).
pub const MAX_HISTORY_BYTES: usize = 8 * 1024 * 1024;
/// The longest session title accepted.
pub const MAX_TITLE_BYTES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no session {0:?}")]
    NotFound(String),
    #[error("cwd {path:?} is not an existing directory: {reason}")]
    CwdNotFound { path: String, reason: String },
    #[error("unknown agent type {0:?}; `agent-host agent.list` shows the known ones")]
    UnknownAgentType(String),
    #[error("invalid params: {0}")]
    InvalidParams(String),
    /// The agent's family cannot honour an option it was given (`session::options`): nothing
    /// was created or changed.
    #[error("{agent_type:?} agents cannot take {option}: {reason}; nothing was changed")]
    OptionUnsupported {
        option: String,
        agent_type: String,
        reason: String,
    },
    /// `permission_mode: "bypass"` without `allow_bypass = true` in `config.toml`.
    #[error(
        "permission_mode \"bypass\" runs every tool without asking; this host allows it only \
         with `allow_bypass = true` in its config.toml"
    )]
    BypassNotAllowed,
    /// The agent's own records say the native session is not the workspace's: it is never
    /// resumed or imported there.
    #[error(
        "the agent session {native_session_id:?} does not belong to {cwd:?}: {reason}; it is not \
         imported"
    )]
    BindingMismatch {
        native_session_id: String,
        cwd: String,
        reason: String,
    },
    /// An attachment of `session.send` that the rules refuse (`session::attachments`).
    #[error("attachment {path:?} refused ({reason}): {why}")]
    AttachmentRefused {
        path: String,
        reason: &'static str,
        why: &'static str,
    },
    /// An attachment, or a prompt's attachments together, over the limit.
    #[error(
        "{}the limit is {limit} bytes (`attachment_max_bytes` in config.toml for one; 4 times \
         that for a prompt's together)",
        bytes.map(|b| format!("the attachment is {b} bytes; ")).unwrap_or_else(|| "the attachment is too large; ".to_owned())
    )]
    AttachmentTooLarge { bytes: Option<u64>, limit: u64 },
    /// An attachment of a kind the session's agent does not take.
    #[error("{agent_type:?} agents do not take {option}")]
    AttachmentUnsupported {
        option: &'static str,
        agent_type: String,
    },
    #[error("no agent can run this session: {0}")]
    NoAgent(String),
    #[error("the agent cannot be started: {0}")]
    AgentUnavailable(String),
    #[error("run not found: {0}")]
    RunNotFound(String),
    /// The run exists but does not wait in the queue (any more): it runs, ran, or was taken
    /// out.
    #[error("run {run_id} is not queued (it is {state})")]
    NotQueued { run_id: String, state: RunStatus },
    /// A queued prompt whose `user.text` is committed already (a dispatch the store cut short
    /// after it): it runs next, as it was announced; it cannot be edited or moved.
    #[error(
        "run {run_id}'s prompt was already announced (its user.text is in the log); it runs next \
         as it is and cannot be edited or moved (queue.remove still takes it out)"
    )]
    QueueHeadAnnounced { run_id: String },
    /// A steer came while an earlier one still waits for the agent's answer.
    #[error(
        "a steer into run {run_id} still waits for the agent's answer; send this one again once \
         it is answered"
    )]
    SteerPending { run_id: String },
    /// A steer was handed to the agent and no answer came: it may or may not be in the turn,
    /// so it was not queued either.
    #[error("{0}")]
    SteerUnknown(String),
    #[error("no permission request {0:?} in this session")]
    PermissionNotFound(String),
    /// `permission.respond` named an option its request does not offer.
    #[error(
        "permission request {request_id:?} offers no option {option_id:?}; it offers: {}",
        offered.join(", ")
    )]
    UnknownOption {
        request_id: String,
        option_id: String,
        offered: Vec<String>,
    },
    #[error("permission request {request_id:?} was already resolved ({decision} by {by})")]
    AlreadyResolved {
        request_id: String,
        decision: String,
        by: String,
    },
    #[error("the host is shutting down")]
    ShuttingDown,
    #[error(
        "the store cannot commit ({0}); no new work is taken until it can (`host.status` shows \
         it), and it resumes by itself"
    )]
    StoreUnavailable(String),
    #[error("store: {0}")]
    Store(StoreError),
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(why) => SessionError::StoreUnavailable(why),
            other => SessionError::Store(other),
        }
    }
}

/// What a `session.create` asks for.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub agent_type: String,
    pub cwd: String,
    pub title: Option<String>,
    /// Checked ([`options::validate`], [`options::check_supported`]) before anything is made.
    pub options: crate::protocol::options::SessionOptions,
}

pub use crate::protocol::replies::PendingPermission;

/// Commands waiting for one session actor.
const INBOX: usize = 64;
/// How long stopping all actors may take at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

struct ActorHandle {
    inbox: mpsc::Sender<actor::Msg>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Actors {
    by_session: HashMap<String, ActorHandle>,
    /// Sessions being deleted: no actor may start for them.
    deleting: std::collections::HashSet<String>,
    closed: bool,
}

/// A cloneable handle for everything session-shaped.
#[derive(Clone)]
pub struct SessionManager {
    store: Store,
    bus: Bus,
    launcher: Arc<dyn Launcher>,
    /// The store's health as the sessions follow it (the store's own watch; a test's).
    health: tokio::sync::watch::Receiver<StoreHealth>,
    /// How many prompts may wait in one session's queue.
    queue_capacity: usize,
    /// Sessions may run with `permission_mode: "bypass"` (`allow_bypass` in `config.toml`).
    allow_bypass: bool,
    /// Where prompts' attachments are copied and which paths they may name.
    attachments: Arc<attachments::AttachmentSettings>,
    actors: Arc<Mutex<Actors>>,
}

impl SessionManager {
    pub fn new(store: Store, bus: Bus, launcher: Arc<dyn Launcher>) -> SessionManager {
        let health = store.watch_health();
        SessionManager::with_health(store, bus, launcher, health)
    }

    /// A manager whose sessions follow `health` for the store's (tests play outages with it).
    pub(crate) fn with_health(
        store: Store,
        bus: Bus,
        launcher: Arc<dyn Launcher>,
        health: tokio::sync::watch::Receiver<StoreHealth>,
    ) -> SessionManager {
        SessionManager {
            store,
            bus,
            launcher,
            health,
            queue_capacity: crate::config::DEFAULT_QUEUE_CAPACITY,
            allow_bypass: false,
            attachments: Arc::default(),
            actors: Arc::new(Mutex::new(Actors::default())),
        }
    }

    /// At most `capacity` prompts wait in one session's queue (`queue_capacity` in
    /// `config.toml`); past that the oldest is dropped, visibly.
    pub fn with_queue_capacity(mut self, capacity: usize) -> SessionManager {
        self.queue_capacity = capacity.max(1);
        self
    }

    /// Whether sessions may be created with `permission_mode: "bypass"` (`allow_bypass` in
    /// `config.toml`; off unless set).
    pub fn with_allow_bypass(mut self, allow: bool) -> SessionManager {
        self.allow_bypass = allow;
        self
    }

    /// Where prompts' attachments are copied and what they may name (`attachment_dirs`,
    /// `attachment_max_bytes` in `config.toml`). Without it a prompt with attachments is
    /// refused.
    pub fn with_attachments(mut self, settings: attachments::AttachmentSettings) -> SessionManager {
        self.attachments = Arc::new(settings);
        self
    }

    fn lock_actors(&self) -> std::sync::MutexGuard<'_, Actors> {
        // A panic while holding this lock leaves the map consistent (inserts and removes
        // only), so a poisoned lock is still usable.
        self.actors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The inbox of the session's actor, started if it is not running.
    async fn inbox(&self, session_id: &str) -> Result<mpsc::Sender<actor::Msg>, SessionError> {
        if let Some(handle) = self.lock_actors().by_session.get(session_id)
            && !handle.inbox.is_closed()
        {
            return Ok(handle.inbox.clone());
        }
        let row = self.get(session_id).await?;
        if !self.launcher.runs_turns(&row.agent_type) {
            return Err(SessionError::NoAgent(format!(
                "this build has no adapter that runs {:?} agents yet",
                row.agent_type
            )));
        }
        // What the store holds queued for the session (a host stopped with prompts waiting)
        // is the new actor's queue.
        let restored = self.stored_queue(session_id).await?;
        let mut actors = self.lock_actors();
        if actors.closed {
            return Err(SessionError::ShuttingDown);
        }
        if actors.deleting.contains(session_id) {
            return Err(SessionError::NotFound(session_id.to_owned()));
        }
        if let Some(handle) = actors.by_session.get(session_id)
            && !handle.inbox.is_closed()
        {
            return Ok(handle.inbox.clone());
        }
        let (inbox, messages) = mpsc::channel(INBOX);
        let actor = actor::Actor::new(
            &row,
            self.store.clone(),
            self.bus.clone(),
            self.launcher.clone(),
            self.health.clone(),
            self.queue_capacity,
            restored,
        )
        .allowing_bypass(self.allow_bypass);
        let span = tracing::info_span!("session", session_id = %row.session_id);
        let task = tokio::spawn(actor.run(messages).instrument(span));
        actors.by_session.insert(
            session_id.to_owned(),
            ActorHandle {
                inbox: inbox.clone(),
                task,
            },
        );
        Ok(inbox)
    }

    /// The queued runs the store holds for a session, as an actor's queue (head first; a run
    /// without its text, of a host before schema 6, is left out: recovery drops it).
    async fn stored_queue(&self, session_id: &str) -> Result<Vec<actor::Queued>, SessionError> {
        let mut queue = Vec::new();
        for stored in self.store.queued_runs(session_id.to_owned()).await? {
            let Some(text) = stored.prompt else {
                continue;
            };
            let lifecycle = self
                .store
                .run_lifecycle(session_id.to_owned(), stored.run.run_id.clone())
                .await?;
            queue.push(actor::Queued {
                announced: lifecycle.iter().any(|(kind, _)| kind == "user.text"),
                run_id: stored.run.run_id,
                text,
                client_msg_id: stored.run.client_msg_id,
                created_at_ms: stored.run.created_at_ms,
                pos: stored.queue_pos.unwrap_or(0),
                from: stored.sender,
                attachments: stored.attachments,
            });
        }
        // An announced prompt (its `user.text` committed by a dispatch cut short) runs first,
        // as it was announced; the rest keep their order.
        queue.sort_by_key(|q| !q.announced);
        Ok(queue)
    }

    /// Send a message to the session's actor and wait for its answer.
    async fn ask<T>(
        &self,
        session_id: &str,
        msg: impl FnOnce(actor::Reply<T>) -> actor::Msg,
    ) -> Result<T, SessionError> {
        let inbox = self.inbox(session_id).await?;
        let (reply, answer) = oneshot::channel();
        let answered = match inbox.send(msg(reply)).await {
            Ok(()) => answer.await.ok(),
            Err(_) => None,
        };
        match answered {
            Some(answer) => answer,
            // The actor stopped under the request: the session was deleted, or the host is
            // stopping.
            None => {
                self.get(session_id).await?;
                Err(SessionError::ShuttingDown)
            }
        }
    }

    /// The store, for the request layer's read-only queries that no session state takes part
    /// in (`session.search`).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether the store can commit now.
    pub fn store_health(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    /// New work (a prompt, a session, a permission answer) is taken only while the store can
    /// commit: nothing reaches an agent that is not durable first.
    fn writable(&self) -> Result<(), SessionError> {
        match self.store_health().error {
            None => Ok(()),
            Some(why) => Err(SessionError::StoreUnavailable(why)),
        }
    }

    fn is_live(&self, session_id: &str) -> bool {
        self.lock_actors().by_session.contains_key(session_id)
    }

    /// Start (or queue) a run with a prompt; returns its run id at once.
    pub async fn send(
        &self,
        session_id: &str,
        text: String,
        client_msg_id: Option<String>,
    ) -> Result<SendReceipt, SessionError> {
        self.send_from(session_id, text, client_msg_id, None).await
    }

    /// [`SessionManager::send`] saying who sent the prompt (its `user.text` `from`, kept with
    /// a queued run).
    pub async fn send_from(
        &self,
        session_id: &str,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
    ) -> Result<SendReceipt, SessionError> {
        self.send_with(session_id, text, client_msg_id, from, Vec::new())
            .await
    }

    /// [`SessionManager::send_from`] with attachments: each is checked and copied
    /// ([`attachments`]) before the prompt is taken, so a refused one takes nothing and a
    /// queued prompt keeps its copies.
    pub async fn send_with(
        &self,
        session_id: &str,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        attachments: Vec<crate::protocol::options::AttachmentParam>,
    ) -> Result<SendReceipt, SessionError> {
        check_prompt(&text, client_msg_id.as_deref())?;
        self.writable()?;
        let stored = self.take_attachments(session_id, attachments).await?;
        let taken = self
            .ask(session_id, |reply| actor::Msg::Send {
                text,
                client_msg_id,
                from,
                attachments: stored.attachments,
                reply,
            })
            .await;
        let not_taken = matches!(
            &taken,
            Err(_)
                | Ok(SendReceipt {
                    duplicate: true,
                    ..
                })
        );
        if not_taken && !stored.created.is_empty() {
            // Refused, or a duplicate (the first prompt's attachments are the run's): the
            // copies made for it go (a copy an earlier prompt has stays).
            let (settings, sid) = (self.attachments.clone(), session_id.to_owned());
            let created = stored.created;
            let _removed = tokio::task::spawn_blocking(move || {
                attachments::remove_copies(&settings, &sid, &created)
            })
            .await;
        }
        taken
    }

    /// Check a prompt's attachments against the rules and the session's family, then copy
    /// them into the session's attachment directory.
    async fn take_attachments(
        &self,
        session_id: &str,
        params: Vec<crate::protocol::options::AttachmentParam>,
    ) -> Result<attachments::Stored, SessionError> {
        if params.is_empty() {
            return Ok(attachments::Stored {
                attachments: Vec::new(),
                created: Vec::new(),
            });
        }
        let row = self.get(session_id).await?;
        let settings = self.attachments.clone();
        let cwd = std::path::PathBuf::from(&row.cwd);
        let blocking = |e: tokio::task::JoinError| SessionError::InvalidParams(e.to_string());
        let loaded = {
            let settings = settings.clone();
            tokio::task::spawn_blocking(move || attachments::load_all(&params, &cwd, &settings))
                .await
                .map_err(blocking)??
        };
        attachments::check_family(&loaded, self.launcher.as_ref(), &row.agent_type).await?;
        // Nothing is copied for a session being deleted (its directory is going).
        if self.lock_actors().deleting.contains(session_id) {
            return Err(SessionError::NotFound(session_id.to_owned()));
        }
        let sid = row.session_id.clone();
        let stored =
            tokio::task::spawn_blocking(move || attachments::store_all(loaded, &sid, &settings))
                .await
                .map_err(blocking)??;
        tracing::info!(
            session_id,
            count = stored.attachments.len(),
            "attachments taken"
        );
        Ok(stored)
    }

    /// Give the running turn more input (`session.steer`): into the turn where the agent's
    /// family can take it, else at the head of the queue (a `warning` `steer_unsupported`
    /// says so); with no turn running, a plain send.
    pub async fn steer(
        &self,
        session_id: &str,
        text: String,
        client_msg_id: Option<String>,
    ) -> Result<SteerReceipt, SessionError> {
        self.steer_from(session_id, text, client_msg_id, None).await
    }

    /// [`SessionManager::steer`] saying who sent the text.
    pub async fn steer_from(
        &self,
        session_id: &str,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
    ) -> Result<SteerReceipt, SessionError> {
        check_prompt(&text, client_msg_id.as_deref())?;
        self.writable()?;
        self.ask(session_id, |reply| actor::Msg::Steer {
            text,
            client_msg_id,
            from,
            reply,
        })
        .await
    }

    /// The session's queue, head first: its actor's, or what the store holds when none runs.
    pub async fn queue(&self, session_id: &str) -> Result<Vec<QueueEntry>, SessionError> {
        let inbox = self
            .lock_actors()
            .by_session
            .get(session_id)
            .map(|h| h.inbox.clone());
        if let Some(inbox) = inbox {
            let (reply, answer) = oneshot::channel();
            if inbox.send(actor::Msg::Queue { reply }).await.is_ok()
                && let Ok(queue) = answer.await
            {
                return Ok(queue);
            }
        }
        let entries = self
            .stored_queue(session_id)
            .await?
            .into_iter()
            .map(|q| QueueEntry {
                run_id: q.run_id,
                text: q.text,
                client_msg_id: q.client_msg_id,
                created_at_ms: q.created_at_ms,
                from: q.from,
                truncated: false,
            })
            .collect();
        Ok(actor::bounded_queue(entries))
    }

    /// Whether the session has a queue to change: its actor runs, or the store holds queued
    /// runs for it (its actor is then started, which takes them). An actor is never started
    /// only to answer that nothing is queued.
    async fn has_queue(&self, session_id: &str) -> Result<bool, SessionError> {
        if self.is_live(session_id) {
            return Ok(true);
        }
        self.get(session_id).await?;
        Ok(!self
            .store
            .queued_runs(session_id.to_owned())
            .await?
            .is_empty())
    }

    /// Why `run_id` is not in a session's queue, as the store says.
    async fn not_queued(&self, session_id: &str, run_id: String) -> SessionError {
        let found = self
            .store
            .find_run(
                session_id.to_owned(),
                crate::protocol::envelope::RunRef::RunId(run_id.clone()),
            )
            .await;
        match found {
            Ok(Some(row)) => SessionError::NotQueued {
                run_id,
                state: row.state,
            },
            Ok(None) => SessionError::RunNotFound(format!("no run {run_id} in this session")),
            Err(e) => e.into(),
        }
    }

    /// A queued prompt's new text (`queue.edit`).
    pub async fn queue_edit(
        &self,
        session_id: &str,
        run_id: String,
        text: String,
    ) -> Result<QueueEdited, SessionError> {
        check_prompt(&text, None)?;
        self.writable()?;
        if !self.has_queue(session_id).await? {
            return Err(self.not_queued(session_id, run_id).await);
        }
        self.ask(session_id, |reply| actor::Msg::QueueEdit {
            run_id,
            text,
            reply,
        })
        .await
    }

    /// Move a queued prompt (`queue.move`; 0 is the head, past the end the end): the queue
    /// after the move.
    pub async fn queue_move(
        &self,
        session_id: &str,
        run_id: String,
        position: usize,
    ) -> Result<Vec<QueueEntry>, SessionError> {
        self.writable()?;
        if !self.has_queue(session_id).await? {
            return Err(self.not_queued(session_id, run_id).await);
        }
        self.ask(session_id, |reply| actor::Msg::QueueMove {
            run_id,
            position,
            reply,
        })
        .await
    }

    /// Take a queued prompt out of the queue (`queue.remove`): it never runs.
    pub async fn queue_remove(
        &self,
        session_id: &str,
        run_id: String,
    ) -> Result<CancelReceipt, SessionError> {
        self.writable()?;
        if !self.has_queue(session_id).await? {
            return Err(self.not_queued(session_id, run_id).await);
        }
        self.ask(session_id, |reply| actor::Msg::QueueRemove {
            run_id,
            reply,
        })
        .await
    }

    /// Take every queued prompt out (`queue.clear`): their run ids, head first.
    pub async fn queue_clear(&self, session_id: &str) -> Result<Vec<String>, SessionError> {
        self.writable()?;
        if !self.has_queue(session_id).await? {
            return Ok(Vec::new());
        }
        self.ask(session_id, |reply| actor::Msg::QueueClear { reply })
            .await
    }

    /// Start (or resume) the session's agent now, without a prompt, so the first prompt does not
    /// wait for the CLI to start: the open (ownership check and fork decision included) a first
    /// prompt would do. An agent already open is answered at once (`already`). An agent that
    /// cannot start fails as the first prompt's run would, here as `AgentUnavailable`.
    pub async fn activate(&self, session_id: &str) -> Result<ActivateReceipt, SessionError> {
        // Opening may publish (a fork's warning, `session.bound`) and save the native id.
        self.writable()?;
        self.ask(session_id, |reply| actor::Msg::Activate { reply })
            .await
    }

    /// Cancel the running turn, or take a queued run (by id) out of the queue.
    pub async fn cancel(
        &self,
        session_id: &str,
        run_id: Option<String>,
    ) -> Result<CancelReceipt, SessionError> {
        if !self.is_live(session_id) {
            // Nothing has run since the host started: nothing to cancel (no agent is started
            // for the question).
            self.get(session_id).await?;
            return Err(SessionError::RunNotFound(run_id.unwrap_or_else(|| {
                "no run is in progress in this session".to_owned()
            })));
        }
        self.ask(session_id, |reply| actor::Msg::Cancel { run_id, reply })
            .await
    }

    /// Answer a pending permission request; `by` names who answered.
    pub async fn respond_permission(
        &self,
        session_id: &str,
        request_id: String,
        answer: impl Into<actor::PermissionAnswer>,
        message: Option<String>,
        by: String,
    ) -> Result<PermissionReceipt, SessionError> {
        let answer = answer.into();
        self.writable()?;
        // A request the host no longer tracks (e.g. after a restart) is answered from the
        // store without starting an agent for it.
        if !self.is_live(session_id) {
            self.get(session_id).await?;
            return match self
                .store
                .get_permission(session_id.to_owned(), request_id.clone())
                .await?
            {
                None => Err(SessionError::PermissionNotFound(request_id)),
                Some(row) => {
                    if row.state == PermissionState::Pending {
                        // No agent holds it any more: it expires now, visibly.
                        actor::expire_permission(&self.store, &self.bus, row.clone()).await;
                    }
                    Err(SessionError::AlreadyResolved {
                        request_id,
                        decision: row.decision.unwrap_or_else(|| "expired".to_owned()),
                        by: row.resolved_by.unwrap_or_else(|| "host".to_owned()),
                    })
                }
            };
        }
        self.ask(session_id, |reply| actor::Msg::Permission {
            request_id,
            answer,
            message,
            by,
            reply,
        })
        .await
    }

    /// What the session's actor is doing, if it runs.
    pub async fn live(&self, session_id: &str) -> Option<LiveStatus> {
        let inbox = self
            .lock_actors()
            .by_session
            .get(session_id)
            .map(|h| h.inbox.clone())?;
        let (reply, answer) = oneshot::channel();
        inbox.send(actor::Msg::Status { reply }).await.ok()?;
        answer.await.ok()
    }

    /// The pending permission requests of one session, or of all, oldest first. The store
    /// says which are pending; their choices come from the session's actor (which holds them
    /// while its agent waits), else from the request's event in the log.
    pub async fn pending_permissions(
        &self,
        session_id: Option<&str>,
    ) -> Result<Vec<PendingPermission>, SessionError> {
        if let Some(id) = session_id {
            self.get(id).await?;
        }
        let rows = self
            .store
            .pending_permissions(session_id.map(str::to_owned))
            .await?;
        let mut offered: HashMap<String, HashMap<String, Vec<PermissionOption>>> = HashMap::new();
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            if !offered.contains_key(&row.session_id) {
                let live = self.live_options(&row.session_id).await.unwrap_or_default();
                offered.insert(row.session_id.clone(), live);
            }
            let live = offered
                .get(&row.session_id)
                .and_then(|by_request| by_request.get(&row.request_id))
                .cloned();
            let options = match live {
                Some(options) => options,
                None => self
                    .store
                    .permission_options(row.session_id.clone(), row.request_id.clone())
                    .await?
                    .unwrap_or_default(),
            };
            // Saved from a JSON value, so it parses; anything else is shown as the text it is.
            let input = serde_json::from_str(&row.input)
                .unwrap_or_else(|_| serde_json::Value::String(row.input.clone()));
            pending.push(PendingPermission {
                session_id: row.session_id,
                request_id: row.request_id,
                run_id: row.run_id,
                tool: row.tool,
                input,
                options,
                created_at_ms: row.created_at_ms,
            });
        }
        Ok(pending)
    }

    /// The choices of a live session's pending requests, by request id; `None` when no actor
    /// runs for it (none is started for the question).
    async fn live_options(
        &self,
        session_id: &str,
    ) -> Option<HashMap<String, Vec<PermissionOption>>> {
        let inbox = self
            .lock_actors()
            .by_session
            .get(session_id)
            .map(|h| h.inbox.clone())?;
        let (reply, answer) = oneshot::channel();
        inbox
            .send(actor::Msg::PendingOptions { reply })
            .await
            .ok()?;
        answer.await.ok()
    }

    /// Close what a host that stopped (or crashed) left open, each visibly, and give each
    /// session back its queue: pending permission requests expire; a run the event log shows
    /// started but not ended ends `interrupted`; a prompt still queued stays queued, and its
    /// session's actor is started, which publishes the queue (`queue.changed` `restored`) and
    /// runs it in order. A queued prompt without its text (a host before schema 6 took it) or
    /// that no agent of this build can run is dropped instead, as is one that started and never
    /// got its `run.start`. The event log decides, not the row: a terminal event is committed
    /// before its row, so a crash in between leaves a row to fix and no event to repeat.
    /// Sessions still marked `running` or `waiting` go back to `idle`, each with its
    /// `session.state`, before any queue runs.
    pub async fn recover(&self) -> Result<(), SessionError> {
        for row in self.store.pending_permissions(None).await? {
            actor::expire_permission(&self.store, &self.bus, row).await;
        }
        // Per session: whether its queued prompts can run again here, and which of them have
        // their text.
        let mut runnable: HashMap<String, bool> = HashMap::new();
        let mut texts: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
        let mut restore: Vec<String> = Vec::new();
        // Per session: the runs whose dispatch was cut short, queued again at the head.
        let mut heads: HashMap<String, Vec<String>> = HashMap::new();
        for run in self.store.unfinished_runs().await? {
            let lifecycle = self
                .store
                .run_lifecycle(run.session_id.clone(), run.run_id.clone())
                .await?;
            let Recovered {
                state,
                category,
                mut message,
                mut publish,
                never_started,
            } = recovered(&lifecycle);
            if never_started {
                let sid = run.session_id.clone();
                if !runnable.contains_key(&sid) {
                    let runs = match self.store.get_session(sid.clone()).await? {
                        Some(row) => self.launcher.runs_turns(&row.agent_type),
                        None => false,
                    };
                    runnable.insert(sid.clone(), runs);
                }
                // A dispatch the host never finished (its row `running`, no `run.start`: left
                // by a host that wrote the row before the events; this one writes it after):
                // the prompt never reached the agent, so it waits again, at the head (first
                // among them if its `user.text` is in the log, see `stored_queue`).
                if run.state == RunStatus::Running
                    && runnable.get(&sid) == Some(&true)
                    && self.store.requeue_run(run.run_id.clone()).await?
                {
                    tracing::info!(run_id = %run.run_id, "a prompt whose dispatch the last host cut short waits again");
                    heads
                        .entry(sid.clone())
                        .or_default()
                        .push(run.run_id.clone());
                    if !restore.contains(&sid) {
                        restore.push(sid);
                    }
                    continue;
                }
            }
            if run.state == RunStatus::Queued && never_started {
                let sid = run.session_id.clone();
                if !texts.contains_key(&sid) {
                    let with_text = self
                        .store
                        .queued_runs(sid.clone())
                        .await?
                        .into_iter()
                        .filter(|q| q.prompt.is_some())
                        .map(|q| q.run.run_id)
                        .collect();
                    texts.insert(sid.clone(), with_text);
                }
                let has_text = texts.get(&sid).is_some_and(|t| t.contains(&run.run_id));
                if has_text && runnable.get(&sid) == Some(&true) {
                    tracing::info!(run_id = %run.run_id, "a prompt the last host left queued waits again");
                    if !restore.contains(&sid) {
                        restore.push(sid);
                    }
                    continue;
                }
                if has_text {
                    let why = "no agent of this host can run this session's prompts; this \
                               queued prompt was dropped"
                        .to_owned();
                    message = Some(why.clone());
                    publish = Some(EventBody::Warning(Notice {
                        code: "followup_dropped".to_owned(),
                        message: why,
                    }));
                }
            }
            tracing::info!(run_id = %run.run_id, %state, "closing a run the last host left open");
            if let Some(body) = publish {
                let event = Event::new(&run.session_id, Some(run.run_id.clone()), body);
                match self.bus.publish(&event).await {
                    Ok(receipt) => {
                        if let Err(e) = receipt.committed().await {
                            tracing::error!(error = %e, "a recovered run's end was not committed");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "publishing a recovered run failed"),
                }
            }
            self.store
                .set_run_state(run.run_id, state, category, message)
                .await?;
        }
        for (session_id, previous) in self.store.reset_busy_sessions().await? {
            let body = EventBody::SessionState(SessionStateChange {
                state: SessionState::Idle,
                previous,
            });
            let event = Event::new(&session_id, None, body);
            match self.bus.publish(&event).await {
                Ok(receipt) => {
                    if let Err(e) = receipt.committed().await {
                        tracing::error!(error = %e, "a recovered session state was not committed");
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "publishing a recovered session state failed")
                }
            }
        }
        for (session_id, head) in heads {
            let rest = self
                .store
                .queued_runs(session_id.clone())
                .await?
                .into_iter()
                .map(|q| q.run.run_id)
                .filter(|id| !head.contains(id));
            let order = head.iter().cloned().chain(rest).collect();
            self.store.set_queue_order(order).await?;
        }
        // Each queue goes on in its session's actor.
        for session_id in restore {
            if let Err(e) = self.inbox(&session_id).await {
                tracing::error!(error = %e, %session_id, "a restored queue has no actor; dropped");
                self.drop_stored_queue(&session_id, &e.to_string()).await?;
            }
        }
        Ok(())
    }

    /// Drop every prompt the store holds queued for a session, each with its `warning`
    /// (committed before its row).
    async fn drop_stored_queue(&self, session_id: &str, why: &str) -> Result<(), SessionError> {
        for stored in self.store.queued_runs(session_id.to_owned()).await? {
            let message = format!("this queued prompt cannot run after the restart: {why}");
            let event = Event::new(
                session_id,
                Some(stored.run.run_id.clone()),
                EventBody::Warning(Notice {
                    code: "followup_dropped".to_owned(),
                    message: message.clone(),
                }),
            );
            match self.bus.publish(&event).await {
                Ok(receipt) => {
                    if let Err(e) = receipt.committed().await {
                        tracing::error!(error = %e, "a dropped prompt's warning was not committed");
                        continue;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "publishing a dropped prompt's warning failed");
                    continue;
                }
            }
            self.store
                .set_run_state(stored.run.run_id, RunStatus::Dropped, None, Some(message))
                .await?;
        }
        Ok(())
    }

    /// Stop every actor (running turns interrupted, agents closed; queued prompts stay queued
    /// in the store, for the next start) and refuse new ones. Their last events are published before this returns.
    pub async fn shutdown(&self) {
        let handles: Vec<ActorHandle> = {
            let mut actors = self.lock_actors();
            actors.closed = true;
            actors.by_session.drain().map(|(_, h)| h).collect()
        };
        let stops = handles.into_iter().map(|handle| async move {
            let (done, stopped) = oneshot::channel();
            if handle
                .inbox
                .send(actor::Msg::Stop { quiet: false, done })
                .await
                .is_ok()
            {
                let _actor_gone = stopped.await;
            }
            if let Err(e) = handle.task.await {
                tracing::error!(error = %e, "a session actor failed");
            }
        });
        if tokio::time::timeout(SHUTDOWN_GRACE, futures_util::future::join_all(stops))
            .await
            .is_err()
        {
            tracing::warn!("session actors still stopping after the grace period");
        }
    }

    /// Stop a session's actor without publishing anything (its session is going away).
    async fn stop_quietly(&self, session_id: &str) {
        let handle = self.lock_actors().by_session.remove(session_id);
        if let Some(handle) = handle {
            let (done, stopped) = oneshot::channel();
            if handle
                .inbox
                .send(actor::Msg::Stop { quiet: true, done })
                .await
                .is_ok()
            {
                let _actor_gone = stopped.await;
            }
        }
    }

    /// Whether sessions of this type can be forked (or imported, which forks): every agent
    /// the launcher knows. Whether the fork is the agent's own is its family's capability;
    /// without one the actor starts a new native session and says so (`fork_unsupported`).
    fn forkable(&self, agent_type: &str) -> bool {
        self.launcher.knows(agent_type)
    }

    pub async fn create(&self, new: NewSession) -> Result<SessionRow, SessionError> {
        let row = self.new_row(new).await?;
        self.store.insert_session(row.clone()).await?;
        tracing::info!(session_id = %row.session_id, agent_type = %row.agent_type, "session created");
        Ok(row)
    }

    /// The row [`SessionManager::create`] inserts: everything checked, the binding derived,
    /// nothing stored yet.
    async fn new_row(&self, new: NewSession) -> Result<SessionRow, SessionError> {
        self.writable()?;
        if !self.launcher.knows(&new.agent_type) {
            return Err(SessionError::UnknownAgentType(new.agent_type));
        }
        if let Err(e) = self.launcher.check(&new.agent_type) {
            return Err(SessionError::AgentUnavailable(format!(
                "{:?}: {}",
                new.agent_type, e.message
            )));
        }
        if let Some(title) = &new.title {
            title_fits(title)?;
        }
        // Each option checked, then against what the family can do with it: an option it
        // cannot honour is refused now, never ignored at the open.
        options::validate(&new.options, self.allow_bypass)?;
        options::check_supported(&*self.launcher, &new.agent_type, &new.options).await?;
        let cwd = new.cwd.clone();
        let cwd = tokio::task::spawn_blocking(move || canonical_dir(&cwd))
            .await
            .map_err(|e| SessionError::InvalidParams(e.to_string()))??;
        let now = now_ms();
        let row = SessionRow {
            session_id: uuid::Uuid::now_v7().to_string(),
            agent_type: new.agent_type,
            native_session_id: None,
            cwd,
            parent_session_id: None,
            title: new.title,
            state: SessionState::Idle,
            created_at_ms: now,
            updated_at_ms: now,
            fork_of: None,
            options: new.options,
            binding: None,
        };
        // What the session is bound under (workspace, provider, configuration), compared
        // before every prompt from now on (`actor::binding`).
        let (_, recorded) = binding::derive(
            self.launcher.clone(),
            &row.agent_type,
            Path::new(&row.cwd),
            &row.options,
        )
        .await;
        Ok(SessionRow {
            binding: Some(recorded),
            ..row
        })
    }

    /// A new session continuing `session_id`'s conversation in a fork of its native session
    /// (the original is never written by the fork). `session.forked` is published on both.
    pub async fn fork(
        &self,
        session_id: &str,
        title: Option<String>,
    ) -> Result<SessionRow, SessionError> {
        self.writable()?;
        let parent = self.get(session_id).await?;
        let Some(native) = parent.native_session_id.clone().or(parent.fork_of.clone()) else {
            return Err(SessionError::InvalidParams(
                "this session has no agent conversation to fork yet".to_owned(),
            ));
        };
        if !self.forkable(&parent.agent_type) {
            return Err(SessionError::NoAgent(format!(
                "{:?} sessions cannot be forked in this build",
                parent.agent_type
            )));
        }
        // The fork runs as its parent does (checked again: the host's config may have changed).
        let mut child = self
            .create(NewSession {
                agent_type: parent.agent_type.clone(),
                cwd: parent.cwd.clone(),
                title: title.or(parent.title.clone()),
                options: parent.options.clone(),
            })
            .await?;
        child.parent_session_id = Some(parent.session_id.clone());
        child.fork_of = Some(native);
        self.store.replace_session_lineage(child.clone()).await?;
        let body = EventBody::SessionForked(SessionForked {
            parent_session_id: parent.session_id.clone(),
            child_session_id: Some(child.session_id.clone()),
            from_native_session_id: child.fork_of.clone(),
            reason: Some("forked on request".to_owned()),
        });
        for on in [&parent.session_id, &child.session_id] {
            let event = Event::new(on.as_str(), None, body.clone());
            if let Err(e) = self.bus.publish(&event).await {
                tracing::error!(error = %e, "publishing session.forked failed");
            }
        }
        tracing::info!(parent = %parent.session_id, child = %child.session_id, "session forked");
        Ok(child)
    }

    /// Bring a session started outside the host (in a terminal) under it: a new session whose
    /// first prompt continues that conversation in a fork — the host never owned the original.
    /// The family's own records must place the native session in `cwd`
    /// ([`Launcher::check_binding`]); one they place elsewhere is refused
    /// ([`SessionError::BindingMismatch`]) and no session is made.
    pub async fn import(
        &self,
        agent_type: String,
        native_session_id: String,
        cwd: String,
        title: Option<String>,
    ) -> Result<SessionRow, SessionError> {
        self.import_with(
            agent_type,
            native_session_id,
            cwd,
            title,
            Default::default(),
        )
        .await
    }

    /// [`SessionManager::import`] with the session's options (checked as `session.create`
    /// checks them, before the agent's records are read).
    pub async fn import_with(
        &self,
        agent_type: String,
        native_session_id: String,
        cwd: String,
        title: Option<String>,
        options: crate::protocol::options::SessionOptions,
    ) -> Result<SessionRow, SessionError> {
        self.writable()?;
        options::validate(&options, self.allow_bypass)?;
        if self.launcher.knows(&agent_type) {
            options::check_import(&*self.launcher, &agent_type, &options)?;
        }
        if !self.forkable(&agent_type) {
            return Err(SessionError::NoAgent(format!(
                "{agent_type:?} sessions cannot be imported in this build"
            )));
        }
        // It becomes an argument and part of a file name: letters, digits, `-` and `_` only.
        let plain = native_session_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if native_session_id.is_empty()
            || native_session_id.len() > 256
            || native_session_id.starts_with('-')
            || !plain
        {
            return Err(SessionError::InvalidParams(
                "native_session_id must be 1 to 256 letters, digits, '-' or '_', not starting \
                 with '-'"
                    .to_owned(),
            ));
        }
        // The family's own records must place the native session in this directory: a session
        // of another workspace is never imported (nor resumed) here.
        let dir = cwd.clone();
        let cwd = tokio::task::spawn_blocking(move || canonical_dir(&dir))
            .await
            .map_err(|e| SessionError::InvalidParams(e.to_string()))??;
        let (launcher, family, id, dir) = (
            self.launcher.clone(),
            agent_type.clone(),
            native_session_id.clone(),
            cwd.clone(),
        );
        let bound = tokio::task::spawn_blocking(move || {
            launcher.check_binding(&family, Path::new(&dir), &id)
        })
        .await
        .map_err(|e| SessionError::InvalidParams(e.to_string()))?;
        if let Err(reason) = bound {
            tracing::warn!(native = %native_session_id, %cwd, %reason, "import refused");
            return Err(SessionError::BindingMismatch {
                native_session_id,
                cwd,
                reason,
            });
        }
        let mut row = self
            .new_row(NewSession {
                agent_type,
                cwd,
                title,
                options,
            })
            .await?;
        row.fork_of = Some(native_session_id.clone());
        // The conversation the agent already had, before anything else in the session: its
        // events committed before the row exists, so no prompt (nor anything else) can come
        // between them — nobody can name the session yet.
        self.publish_imported(
            &row.session_id,
            &row.agent_type,
            &row.cwd,
            &native_session_id,
        )
        .await;
        if let Err(e) = self.store.insert_session(row.clone()).await {
            // Not left behind: the history published for a session that was not made.
            if let Err(e) = self.store.delete_session(row.session_id.clone()).await {
                tracing::error!(error = %e, "removing the history of an import that failed");
            }
            return Err(e.into());
        }
        tracing::info!(session_id = %row.session_id, agent_type = %row.agent_type, "session imported");
        Ok(row)
    }

    /// Run the session on `model` from now on (`session.set_model`): checked as
    /// `session.create` checks it and against the family's way to switch; saved on the row,
    /// then taken by the live agent, by its next turn, or by a restart of it (the reply and a
    /// `session.configured` say which).
    pub async fn set_model(
        &self,
        session_id: &str,
        model: String,
    ) -> Result<ModelSet, SessionError> {
        options::check_model(&model)?;
        self.writable()?;
        let row = self.get(session_id).await?;
        let caps = options::check_set_model(&*self.launcher, &row.agent_type, &model).await?;
        self.ask(session_id, |reply| actor::Msg::SetModel {
            model,
            switch: caps.set_model,
            reply,
        })
        .await
    }

    /// Give the session a new title (trimmed; not empty, at most [`MAX_TITLE_BYTES`]).
    pub async fn rename(
        &self,
        session_id: &str,
        title: String,
    ) -> Result<SessionRow, SessionError> {
        let title = title.trim();
        if title.is_empty() {
            return Err(SessionError::InvalidParams("title is empty".to_owned()));
        }
        title_fits(title)?;
        self.writable()?;
        if !self
            .store
            .set_session_title(session_id.to_owned(), title.to_owned())
            .await?
        {
            return Err(SessionError::NotFound(session_id.to_owned()));
        }
        tracing::info!(session_id, "session renamed");
        self.get(session_id).await
    }

    pub async fn get(&self, session_id: &str) -> Result<SessionRow, SessionError> {
        self.store
            .get_session(session_id.to_owned())
            .await?
            .ok_or_else(|| SessionError::NotFound(session_id.to_owned()))
    }

    /// The "allow always" rules accepted in a session, oldest first.
    pub async fn permission_rules(
        &self,
        session_id: &str,
    ) -> Result<Vec<crate::protocol::replies::PermissionRule>, SessionError> {
        Ok(self.store.permission_rules(session_id.to_owned()).await?)
    }

    pub async fn list(&self) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.store.list_sessions().await?)
    }

    pub async fn count(&self) -> Result<i64, SessionError> {
        Ok(self.store.count_sessions().await?)
    }

    pub async fn delete(&self, session_id: &str) -> Result<(), SessionError> {
        // No actor may start for it from now on (a prompt racing the delete gets
        // `session_not_found`), and the one running stops before the rows go.
        self.lock_actors().deleting.insert(session_id.to_owned());
        self.stop_quietly(session_id).await;
        // The quiet stop closes no block: the bus forgets the session's open ones.
        self.bus.forget_session(session_id).await;
        let deleted = self.store.delete_session(session_id.to_owned()).await;
        if matches!(deleted, Ok(true)) {
            let (settings, sid) = (self.attachments.clone(), session_id.to_owned());
            let removed =
                tokio::task::spawn_blocking(move || attachments::remove_session(&settings, &sid))
                    .await;
            match removed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, session_id, "removing the attachments failed")
                }
                Err(e) => tracing::warn!(error = %e, "removing the attachments failed"),
            }
        }
        self.lock_actors().deleting.remove(session_id);
        if deleted? {
            tracing::info!(session_id, "session deleted");
            Ok(())
        } else {
            Err(SessionError::NotFound(session_id.to_owned()))
        }
    }

    /// One page of a session's brackets, at most `limit` and about [`MAX_HISTORY_BYTES`], in
    /// ascending order; the session must exist. [`HistoryFrom::After`] reads the oldest after
    /// a cursor, and the flag says whether more may follow (the page is full, by count or
    /// size). [`HistoryFrom::Before`] reads the newest before one, and the flag says whether
    /// older brackets exist before the page's first (one more than `limit` is read to know).
    pub async fn history(
        &self,
        session_id: &str,
        from: HistoryFrom,
        limit: u32,
    ) -> Result<(Vec<StoredEvent>, bool), SessionError> {
        self.get(session_id).await?;
        let limit = limit.clamp(1, MAX_HISTORY_LIMIT);
        match from {
            HistoryFrom::After(after_seq) => {
                let mut events = self
                    .store
                    .history(session_id.to_owned(), after_seq.max(0), limit)
                    .await?;
                let full = events.len() >= limit as usize;
                let cut = keep_within(&mut events, MAX_HISTORY_BYTES, Keep::Oldest);
                Ok((events, full || cut))
            }
            HistoryFrom::Before(before_seq) => {
                let mut events = self
                    .store
                    .history_before(session_id.to_owned(), before_seq, limit + 1)
                    .await?;
                let older = events.len() > limit as usize;
                if older {
                    events.remove(0);
                }
                let cut = keep_within(&mut events, MAX_HISTORY_BYTES, Keep::Newest);
                Ok((events, older || cut))
            }
        }
    }

    /// Every run of a session, oldest first: its state and the `client_msg_id` it was sent
    /// with (a client unsure whether a prompt was taken looks it up here).
    pub async fn runs(&self, session_id: &str) -> Result<Vec<crate::store::RunRow>, SessionError> {
        self.get(session_id).await?;
        Ok(self.store.list_runs(session_id.to_owned()).await?)
    }

    /// The run a prompt became, by its run id or the `client_msg_id` it was sent with: what a
    /// client asks after an answer was lost or a run ended `result_delivery_unknown`. One
    /// indexed lookup; `RunNotFound` when the session has no such run (a prompt never taken).
    pub async fn run(
        &self,
        session_id: &str,
        key: crate::protocol::envelope::RunRef,
    ) -> Result<crate::store::RunRow, SessionError> {
        self.get(session_id).await?;
        let missing = match &key {
            crate::protocol::envelope::RunRef::RunId(id) => format!("no run {id} in this session"),
            crate::protocol::envelope::RunRef::ClientMsgId(key) => {
                format!("no run was sent with client_msg_id {key:?} in this session")
            }
        };
        self.store
            .find_run(session_id.to_owned(), key)
            .await?
            .ok_or(SessionError::RunNotFound(missing))
    }
}

/// What the event log of an unfinished run says: the row it should get, and the event to
/// publish when the log has no terminal one yet.
struct Recovered {
    state: RunStatus,
    /// The category and message of its end, as the log (or the event published now) says.
    category: Option<String>,
    message: Option<String>,
    publish: Option<EventBody>,
    /// The log shows nothing of it: no start, no end, no retirement (a queued prompt, or one
    /// whose dispatch never got its `run.start`).
    never_started: bool,
}

fn recovered(lifecycle: &[(String, String)]) -> Recovered {
    let payload_of = |kind: &str| {
        lifecycle
            .iter()
            .find(|(k, _)| k == kind)
            .and_then(|(_, p)| serde_json::from_str::<serde_json::Value>(p).ok())
    };
    let text = |v: &serde_json::Value, key: &str| v[key].as_str().map(str::to_owned);
    if let Some(end) = payload_of("run.end") {
        let state = serde_json::from_value::<RunState>(end["state"].clone())
            .map_or(RunStatus::Interrupted, RunStatus::from);
        return Recovered {
            state,
            category: text(&end, "category"),
            message: text(&end, "message"),
            publish: None,
            never_started: false,
        };
    }
    let retired = lifecycle.iter().find_map(|(k, p)| {
        let warning = serde_json::from_str::<serde_json::Value>(p).ok()?;
        let code = warning["code"].as_str()?.to_owned();
        (k == "warning" && code.starts_with("followup_")).then(|| (code, text(&warning, "message")))
    });
    if let Some((code, message)) = retired {
        let state = if code == "followup_cancelled" {
            RunStatus::Cancelled
        } else {
            RunStatus::Dropped
        };
        return Recovered {
            state,
            category: None,
            message,
            publish: None,
            never_started: false,
        };
    }
    if payload_of("run.start").is_some() {
        let message = "the host stopped during this run".to_owned();
        return Recovered {
            state: RunStatus::Interrupted,
            category: None,
            message: Some(message.clone()),
            publish: Some(EventBody::RunEnd(RunEnd {
                state: RunState::Interrupted,
                category: None,
                message: Some(message),
            })),
            never_started: false,
        };
    }
    let message = "the host stopped before this prompt ran".to_owned();
    Recovered {
        state: RunStatus::Dropped,
        category: None,
        message: Some(message.clone()),
        publish: Some(EventBody::Warning(Notice {
            code: "followup_dropped".to_owned(),
            message,
        })),
        never_started: true,
    }
}

/// A prompt's text (and its idempotency key) as every command that takes one checks it.
fn check_prompt(text: &str, client_msg_id: Option<&str>) -> Result<(), SessionError> {
    if text.trim().is_empty() {
        return Err(SessionError::InvalidParams("text is empty".to_owned()));
    }
    if text.len() > MAX_PROMPT_BYTES {
        return Err(SessionError::InvalidParams(format!(
            "text is {} bytes; the limit is {MAX_PROMPT_BYTES}",
            text.len()
        )));
    }
    if client_msg_id.is_some_and(|k| k.is_empty() || k.len() > 256) {
        return Err(SessionError::InvalidParams(
            "client_msg_id must be 1 to 256 bytes".to_owned(),
        ));
    }
    Ok(())
}

fn title_fits(title: &str) -> Result<(), SessionError> {
    if title.len() > MAX_TITLE_BYTES {
        return Err(SessionError::InvalidParams(format!(
            "title is longer than {MAX_TITLE_BYTES} bytes"
        )));
    }
    Ok(())
}

fn canonical_dir(cwd: &str) -> Result<String, SessionError> {
    let err = |reason: String| SessionError::CwdNotFound {
        path: cwd.to_owned(),
        reason,
    };
    let path = Path::new(cwd);
    if !path.is_absolute() {
        return Err(err("it must be an absolute path".to_owned()));
    }
    let canonical = path.canonicalize().map_err(|e| err(e.to_string()))?;
    if !canonical.is_dir() {
        return Err(err("it is not a directory".to_owned()));
    }
    canonical
        .into_os_string()
        .into_string()
        .map_err(|_| err("it is not valid UTF-8".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{PermissionRow, RunRow};

    /// A page too large is cut at the end the caller pages on from, keeping at least one
    /// event: the oldest going forwards, the newest going backwards.
    #[test]
    fn a_large_page_keeps_the_end_it_pages_on_from() {
        let page = |sizes: &[usize]| -> Vec<StoredEvent> {
            sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| StoredEvent {
                    sequence_id: i as i64 + 1,
                    message_id: format!("m{i}"),
                    session_id: "s".into(),
                    run_id: None,
                    kind: "text.end".into(),
                    payload: "x".repeat(n),
                    created_at: 0,
                })
                .collect()
        };
        let seqs =
            |events: &[StoredEvent]| events.iter().map(|e| e.sequence_id).collect::<Vec<_>>();
        for (sizes, max, keep, want, cut) in [
            (&[4, 4, 4][..], 12, Keep::Oldest, vec![1, 2, 3], false),
            (&[4, 4, 4][..], 12, Keep::Newest, vec![1, 2, 3], false),
            (&[4, 4, 4][..], 9, Keep::Oldest, vec![1, 2], true),
            (&[4, 4, 4][..], 9, Keep::Newest, vec![2, 3], true),
            (&[2, 20, 2][..], 10, Keep::Oldest, vec![1], true),
            (&[2, 20, 2][..], 10, Keep::Newest, vec![3], true),
            // One event over the limit still makes a page.
            (&[20, 1][..], 10, Keep::Oldest, vec![1], true),
            (&[1, 20][..], 10, Keep::Newest, vec![2], true),
            (&[][..], 10, Keep::Newest, vec![], false),
        ] {
            let mut events = page(sizes);
            assert_eq!(
                keep_within(&mut events, max, keep),
                cut,
                "{sizes:?} {max} {keep:?}"
            );
            assert_eq!(seqs(&events), want, "{sizes:?} {max} {keep:?}");
        }
    }

    /// A host that died mid-run left a running run, a queued one and a pending permission
    /// request; the next host closes each, visibly, before serving anyone.
    #[tokio::test]
    async fn recover_closes_what_a_crashed_host_left_open() {
        let dir = scripted_tests::tempdir();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let (bus, bus_tasks) = Bus::start(store.clone()).await.unwrap();
        let sessions = SessionManager::new(store.clone(), bus.clone(), Arc::new(NoAgents));
        let row = sessions
            .create(NewSession {
                agent_type: "claude".into(),
                cwd: dir.path().display().to_string(),
                title: None,
                ..Default::default()
            })
            .await
            .unwrap();
        let sid = row.session_id.clone();
        // r1 started (its run.start is in the log), r2 never did, and r0's run.end was
        // committed but the crash came before its row was updated.
        let log = |run: &str, body: EventBody| {
            let event = Event::new(&sid, Some(run.to_owned()), body);
            let bus = bus.clone();
            async move {
                bus.publish(&event)
                    .await
                    .unwrap()
                    .committed()
                    .await
                    .unwrap()
            }
        };
        log("r0-ended", EventBody::RunStart(Default::default())).await;
        log(
            "r0-ended",
            EventBody::RunEnd(RunEnd {
                state: RunState::Completed,
                category: None,
                message: None,
            }),
        )
        .await;
        let logged = log("r1-running", EventBody::RunStart(Default::default()))
            .await
            .unwrap();
        for (run_id, state) in [
            ("r0-ended", "running"),
            ("r1-running", "running"),
            ("r2-queued", "queued"),
        ] {
            store
                .insert_run(RunRow {
                    run_id: run_id.into(),
                    session_id: sid.clone(),
                    state: crate::protocol::states::RunStatus::parse(state).unwrap(),
                    client_msg_id: None,
                    error_category: None,
                    message: None,
                    created_at_ms: now_ms(),
                    ended_at_ms: None,
                })
                .await
                .unwrap();
        }
        store
            .insert_permission(PermissionRow {
                session_id: sid.clone(),
                request_id: "p1".into(),
                run_id: Some("r1-running".into()),
                tool: "Bash".into(),
                input: "{}".into(),
                state: PermissionState::Pending,
                decision: None,
                resolved_by: None,
                created_at_ms: now_ms(),
                resolved_at_ms: None,
            })
            .await
            .unwrap();

        sessions.recover().await.unwrap();
        // A late answer now learns the request expired (no agent is started for it).
        match sessions
            .respond_permission(&sid, "p1".into(), Decision::Allow, None, "ipc".into())
            .await
        {
            Err(SessionError::AlreadyResolved { decision, by, .. }) => {
                assert_eq!((decision.as_str(), by.as_str()), ("expired", "host"));
            }
            other => panic!("{other:?}"),
        }
        assert!(sessions.live(&sid).await.is_none());
        drop(sessions);
        drop(bus);
        bus_tasks.shutdown().await;

        let events = store.history(sid.clone(), logged, 100).await.unwrap();
        let got: Vec<(Option<String>, String)> = events
            .iter()
            .map(|e| (e.run_id.clone(), e.kind.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    Some("r1-running".to_owned()),
                    "permission.resolved".to_owned()
                ),
                (Some("r1-running".to_owned()), "run.end".to_owned()),
                (Some("r2-queued".to_owned()), "warning".to_owned()),
            ]
        );
        assert!(events[1].payload.contains("\"state\":\"interrupted\""));
        assert!(events[2].payload.contains("followup_dropped"));
        let runs = store.list_runs(sid).await.unwrap();
        let mut states: Vec<(&str, &str)> = runs
            .iter()
            .map(|r| (r.run_id.as_str(), r.state.as_str()))
            .collect();
        states.sort_unstable();
        assert_eq!(
            states,
            [
                ("r0-ended", "completed"),
                ("r1-running", "interrupted"),
                ("r2-queued", "dropped")
            ]
        );
        assert!(store.unfinished_runs().await.unwrap().is_empty());
        threads.shutdown().await;
    }
}
