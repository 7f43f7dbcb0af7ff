//! The session actor (design §8): one task per live session that owns its agent process, its
//! current run, its follow-up queue and its pending permission requests. Commands reach it
//! through a channel, so everything a session does happens in one order:
//!
//! - `send`: the run id is allocated and the run row written at once (with the prompt's text
//!   and, when it queues, its place in the queue), and the caller gets the id before anything
//!   else happens. An idle session dispatches it; a busy one queues it (at most the configured
//!   capacity; past that the oldest waiting prompt is dropped with a visible `warning`
//!   `followup_dropped` naming its run and the start of its text). Dispatch publishes
//!   `user.text` then `run.start`, after the previous run's `run.end`.
//! - the queue is durable and visible: every change to it (a prompt queued, edited, moved,
//!   removed, cleared, dropped, dispatched, restored) is written to the run rows first, then
//!   published as one `queue.changed` bracket with the whole queue. A host that stops keeps its
//!   queued prompts queued; the next one gives them back to the session's actor at its start
//!   (`restored`), and they run in order.
//! - `steer`: text for the running turn is committed as a `user.text` with `steer` in the
//!   running run and then goes to the agent, when its family can take it
//!   ([`Capabilities::steer`](super::agent::Capabilities)); otherwise it queues at the head with
//!   a `warning` `steer_unsupported`. An agent that refuses it (or never got it) has a
//!   `warning` `steer_not_taken` follow its `user.text`, and the text queues at the head as
//!   well: nothing is left claiming the turn took it. The answer is awaited as a branch of the
//!   actor's loop, never inside a handler; an answer that never comes is
//!   `result_delivery_unknown`, not queued.
//! - the agent is opened lazily on the first dispatch: a resume of the native id the session
//!   row holds (or a fork, when someone else wrote or holds it), else a new native session. A
//!   resume the agent rejects is reported (`error` `resume_rejected` and a `warning`) and the
//!   prompt goes on in a fresh native session. What the family cannot do is read from its
//!   [`Capabilities`](super::agent::Capabilities), never assumed: a family without resume or
//!   fork starts a new native session with a `warning` (`resume_unsupported`,
//!   `fork_unsupported`); a native session the family says is not this workspace's is never
//!   opened (the run fails `resume_rejected`).
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
//! - nothing reaches the agent before its `user.text` and `run.start` are committed (a steer:
//!   its `user.text`), and no run row says `running` before its `run.start` is. When the
//!   store cannot commit (its health turns `degraded`, or a write is refused), the running turn
//!   is interrupted and nothing more of it is published; queued prompts wait. Once the store is
//!   back, the cut run is closed with a committed `run.end` `interrupted` (only then does its
//!   row say so), and the queue goes on. No store failure is only logged: each one takes the
//!   actor to its outage state until the store commits again.
//!
//! The code map: [`state`] is the state machine (one enum, its transitions, no I/O); `queue`
//! takes prompts and dispatches them; `turn` runs them (agent output, ends, cancel, idle close);
//! `open` decides and makes each open (ownership, capabilities, the binding check); `steer`
//! the input injected into a running turn;
//! `permissions` the requests; `outage` the store's failures and recovery; `files` the session
//! file's ownership (watch, tail, baselines); `stop` the end of the task; `publish` the one way
//! out to the bus and the session state.

mod binding;
mod files;
mod open;
mod options;
mod outage;
mod permissions;
mod publish;
mod queue;
mod state;
mod steer;
mod stop;
#[cfg(test)]
mod tests;
mod turn;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::SessionError;
use super::agent::{AgentOutput, AgentSession, Launcher};
use crate::bus::Bus;
pub use crate::protocol::envelope::PermissionAnswer;
pub use crate::protocol::envelope::PermissionDecision as Decision;
use crate::protocol::events::ErrorCategory;
use crate::protocol::events::{PermissionOption, PromptFrom};
use crate::protocol::states::SessionState;
use crate::store::{SessionRow, Store, StoreHealth};
pub(super) use permissions::expire_permission;
use state::{Binding, Link, State};

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
    ActivateReceipt, CancelOutcome, CancelReceipt, LiveStatus, PermissionReceipt, QueueEdited,
    QueueEntry, SendReceipt, SteerReceipt,
};
pub(super) use queue::{Queued, bounded_queue};

pub(super) type Reply<T> = oneshot::Sender<Result<T, SessionError>>;

pub(super) enum Msg {
    Send {
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        /// Checked and copied (`session::attachments`).
        attachments: Vec<crate::protocol::options::Attachment>,
        reply: Reply<SendReceipt>,
    },
    Cancel {
        run_id: Option<String>,
        reply: Reply<CancelReceipt>,
    },
    /// Text for the running turn (`session.steer`).
    Steer {
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        reply: Reply<SteerReceipt>,
    },
    /// A queued prompt's new text.
    QueueEdit {
        run_id: String,
        text: String,
        reply: Reply<QueueEdited>,
    },
    /// A queued prompt to another place (0: the head; past the end: the end).
    QueueMove {
        run_id: String,
        position: usize,
        reply: Reply<Vec<QueueEntry>>,
    },
    /// A queued prompt out of the queue (never a running run).
    QueueRemove {
        run_id: String,
        reply: Reply<CancelReceipt>,
    },
    /// Every queued prompt out of the queue: their run ids.
    QueueClear {
        reply: Reply<Vec<String>>,
    },
    /// The queue, head first.
    Queue {
        reply: oneshot::Sender<Vec<QueueEntry>>,
    },
    Permission {
        request_id: String,
        answer: PermissionAnswer,
        message: Option<String>,
        by: String,
        reply: Reply<PermissionReceipt>,
    },
    /// Run on `model` from now on (`session.set_model`, checked against the family already);
    /// `switch`: how the family declares it takes a new model.
    SetModel {
        model: String,
        switch: super::agent::ModelSwitch,
        reply: Reply<super::ModelSet>,
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
        reply: oneshot::Sender<HashMap<String, Vec<PermissionOption>>>,
    },
    /// Stop the agent and end the task. `quiet`: publish nothing (the session is being
    /// deleted).
    Stop {
        quiet: bool,
        done: oneshot::Sender<()>,
    },
}

/// What every handler uses and none changes: which session this is and what it talks to.
pub(super) struct Cx {
    session_id: String,
    agent_type: String,
    cwd: PathBuf,
    store: Store,
    bus: Bus,
    launcher: Arc<dyn Launcher>,
    /// How many prompts may wait in the queue.
    capacity: usize,
    /// Whether `config.toml` allows `permission_mode: "bypass"` now (`allow_bypass`): a
    /// bypass session opens no agent without it, whenever it was created.
    allow_bypass: bool,
}

pub(super) struct Actor {
    cx: Cx,
    /// The agent × run state machine.
    state: State,
    /// The store, as this actor has seen it.
    link: Link,
    /// The native session the row binds.
    binding: Binding,
    /// What the session is bound under (workspace, provider, configuration), as recorded and
    /// as last derived (`binding`).
    bound: binding::BindingState,
    /// The session's options as stored (`session.create`, `session.set_model` since): every
    /// agent the actor opens gets them.
    options: crate::protocol::options::SessionOptions,
    queue: VecDeque<queue::Queued>,
    /// The permission requests saved as pending and not answered yet: their offered choices,
    /// by request id. Non-empty during a run: the session is `waiting`.
    pending: HashMap<String, Vec<PermissionOption>>,
    /// The session state last published (and written to the row).
    published: SessionState,
    /// The native session file and the host's prompt ids, looked up once.
    files: files::FileCache,
    /// The store's health, followed.
    health: watch::Receiver<StoreHealth>,
    /// The store's outage count last seen: a higher one means an outage came and went.
    outages_seen: u64,
    /// The steer handed to the agent whose answer has not come yet.
    steer: Option<steer::PendingSteer>,
    /// The steers taken into a turn, by `client_msg_id` (not steered again).
    steered: steer::Steered,
}

async fn next_health(health: &mut watch::Receiver<StoreHealth>) -> StoreHealth {
    if health.changed().await.is_err() {
        // The store is gone (shutdown): nothing more to follow.
        std::future::pending::<()>().await;
    }
    health.borrow_and_update().clone()
}

async fn next_output(events: Option<&mut mpsc::Receiver<AgentOutput>>) -> AgentOutput {
    match events {
        Some(events) => events.recv().await.unwrap_or(AgentOutput::Exited {
            status: "unknown (the driver ended)".to_owned(),
        }),
        None => std::future::pending().await,
    }
}

async fn next_change(changes: Option<&mut mpsc::Receiver<()>>) {
    match changes {
        Some(changes) => {
            if changes.recv().await.is_none() {
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
    /// An actor for the session `row`, following the store's health on `health` (the store's
    /// own watch, or a test's), holding at most `capacity` queued prompts. `restored`: the
    /// prompts the store says are queued (a host stopped with them waiting), head first; the
    /// actor publishes them and runs them, in order, as soon as it starts.
    pub(super) fn new(
        row: &SessionRow,
        store: Store,
        bus: Bus,
        launcher: Arc<dyn Launcher>,
        health: watch::Receiver<StoreHealth>,
        capacity: usize,
        restored: Vec<Queued>,
    ) -> Actor {
        let outages_seen = health.borrow().outages;
        Actor {
            cx: Cx {
                session_id: row.session_id.clone(),
                agent_type: row.agent_type.clone(),
                cwd: PathBuf::from(&row.cwd),
                store,
                bus,
                launcher,
                capacity: capacity.max(1),
                allow_bypass: false,
            },
            state: State::Cold {
                next: state::NextOpen::Decide,
            },
            link: Link::Up,
            binding: Binding::of_row(row.native_session_id.clone(), row.fork_of.clone()),
            bound: binding::BindingState::of_row(row.binding.clone()),
            options: row.options.clone(),
            queue: VecDeque::from(restored),
            pending: HashMap::new(),
            published: row.state,
            files: files::FileCache::default(),
            health,
            outages_seen,
            steer: None,
            steered: steer::Steered::default(),
        }
    }

    /// Whether the host allows `bypass` sessions (`allow_bypass`; without it, none opens).
    pub(super) fn allowing_bypass(mut self, allow: bool) -> Actor {
        self.cx.allow_bypass = allow;
        self
    }

    pub(super) async fn run(mut self, mut inbox: mpsc::Receiver<Msg>) {
        if !self.queue.is_empty() {
            self.restore().await;
            self.sync_state().await;
        }
        let stop = loop {
            let deadline = self.state.run().and_then(state::Run::deadline);
            let idle = self.state.close_at();
            let retry = self.link.retry_at();
            let (events, watch_at, changes) = match self.state.live_mut() {
                Some(live) => (
                    Some(&mut live.session.events),
                    live.child.watch.due(),
                    live.child.watch.changes_mut(),
                ),
                None => (None, None, None),
            };
            tokio::select! {
                biased;
                // First: an outage must be known before any more of a turn is handled.
                health = next_health(&mut self.health) => self.on_health(health).await,
                () = until(retry) => {
                    self.link.clear_retry();
                    self.on_store_back().await;
                }
                // Before the agent's output: a driver answers a steer before it ends the turn.
                answer = steer::next_answer(self.steer.as_mut()) => {
                    self.on_steer_answer(answer).await;
                }
                output = next_output(events) => self.on_output(output).await,
                msg = inbox.recv() => match msg {
                    Some(Msg::Stop { quiet, done }) => break Some((quiet, done)),
                    Some(msg) => self.on_msg(msg).await,
                    None => break None,
                },
                () = until(deadline) => self.on_cancel_timeout().await,
                () = until(idle) => self.on_idle().await,
                () = until(watch_at) => self.start_watch().await,
                () = next_change(changes) => self.on_file_change().await,
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
                from,
                attachments,
                reply,
            } => {
                self.on_send(text, client_msg_id, from, attachments, reply)
                    .await
            }
            Msg::Cancel { run_id, reply } => {
                let answer = self.on_cancel(run_id).await;
                let _caller_gone = reply.send(answer);
            }
            Msg::Steer {
                text,
                client_msg_id,
                from,
                reply,
            } => self.on_steer(text, client_msg_id, from, reply).await,
            Msg::QueueEdit {
                run_id,
                text,
                reply,
            } => {
                let answer = self.on_queue_edit(run_id, text).await;
                let _caller_gone = reply.send(answer);
            }
            Msg::QueueMove {
                run_id,
                position,
                reply,
            } => {
                let answer = self.on_queue_move(run_id, position).await;
                let _caller_gone = reply.send(answer);
            }
            Msg::QueueRemove { run_id, reply } => {
                let answer = self.on_queue_remove(run_id).await;
                let _caller_gone = reply.send(answer);
            }
            Msg::QueueClear { reply } => {
                let answer = self.on_queue_clear().await;
                let _caller_gone = reply.send(answer);
            }
            Msg::Queue { reply } => {
                let _caller_gone = reply.send(self.queue_entries());
            }
            Msg::Permission {
                request_id,
                answer,
                message,
                by,
                reply,
            } => {
                let answer = self.on_permission(request_id, answer, message, by).await;
                let _caller_gone = reply.send(answer);
            }
            Msg::SetModel {
                model,
                switch,
                reply,
            } => {
                let answer = self.on_set_model(model, switch).await;
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
                let _caller_gone = reply.send(self.status());
            }
            Msg::Stop { .. } => {}
        }
    }

    fn status(&self) -> LiveStatus {
        let live = self.state.live();
        LiveStatus {
            agent_pid: live.and_then(|l| l.session.pid()),
            run_id: self.state.run_id(),
            queued: self.queue.iter().map(|q| q.run_id.clone()).collect(),
            watching: live.is_some_and(|l| l.child.watch.watching()),
            drifted: self.state.drifted().is_some(),
        }
    }

    /// The live agent's pid, for a receipt.
    fn agent_pid(&self) -> Option<u32> {
        self.state
            .live()
            .and_then(|l| AgentSession::pid(&l.session))
    }
}
