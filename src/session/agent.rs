//! The agent contract as the session layer sees it (design §9): what it asks of any agent,
//! whatever its protocol family. Adapters (a layer above) implement it; the daemon hands the
//! session layer a [`Launcher`] that opens them.
//!
//! - [`AgentSession`] is the handle of one running agent. Every family's driver is one task
//!   that owns its process and talks to the handle by two channels: [`AgentInput`] in
//!   (prompt, permission answer, interrupt, steer, close) and [`AgentOutput`] out (canonical event
//!   bodies, then one `Exited`).
//! - [`AdapterError`] carries one of the shared error categories, everywhere.
//! - [`AdapterError::prompt_not_sent`] and [`AdapterError::result_unknown`] are the one rule for
//!   a turn that ends without the agent's result (below); every driver and the session layer
//!   end such a turn through them.
//! - [`Launcher`] says which agent types can run turns, what each can do ([`Capabilities`],
//!   which the session layer reads before it promises anything), and opens one.
//! - [`NativeFile`] is where a native session lives and the ownership hooks its family gives
//!   (who wrote a line, which other live CLIs claim it). The session layer knows no family.
//!
//! ## A turn without its result: was the prompt delivered?
//!
//! Every prompt a driver takes ends in exactly one `run.end`. When the agent's own result
//! (a success, or a failure the agent reports: an error result, a JSON-RPC error answer, a
//! failure its exit code or stderr names) never comes, the category says what the host knows
//! about the prompt, never more:
//! - **not delivered** — the write to the agent's stdin failed, the JSON-RPC request was never
//!   written (`RpcError::NotSent`), the process or driver was gone before the prompt was
//!   written, or the prompt was still in the driver's inputs when it stopped: `failed` with
//!   `transport_lost`, and the message says the prompt was not sent (sending it again is
//!   safe). A prompt the session could not hand to the driver at all is the same.
//! - **delivered, no result** — the prompt was written and flushed (the request written, the
//!   one-shot process started with it), then the process exited, its stdout or transport
//!   ended, or the request went unanswered (`RpcError::NoAnswer`, a timeout): `failed` with
//!   `result_delivery_unknown`. The agent may have acted on it; nothing says it did not.
//! - **unknown to the host** — the session layer sees the process exit with a run open that
//!   its driver did not end: it cannot know either, so `result_delivery_unknown` too.
//!
//! What the agent said itself keeps its category (`agent_failed`, `rate_limited`, …), and so
//! do a family's refusals before the turn began (a rejected resume, missing credentials); a
//! turn being cancelled still ends `cancelled`.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::events::{
    ErrorCategory, ErrorNotice, EventBody, PermissionOption, RunEnd, RunState,
};
use crate::protocol::options::{Attachment, PermissionMode, SessionOptions};

/// An adapter failure, always with one of the shared categories.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct AdapterError {
    pub category: ErrorCategory,
    pub message: String,
}

impl AdapterError {
    pub fn new(category: ErrorCategory, message: impl Into<String>) -> Self {
        AdapterError {
            category,
            message: message.into(),
        }
    }

    /// The prompt provably did not reach the agent (module docs): `transport_lost`, and the
    /// message says so. `why` says what happened ("the agent's stdin is closed").
    pub fn prompt_not_sent(why: impl std::fmt::Display) -> Self {
        AdapterError::new(
            ErrorCategory::TransportLost,
            format!("{why}; the prompt was not sent to the agent, so sending it again is safe"),
        )
    }

    /// The prompt was handed to the agent and the turn's result never came (module docs):
    /// `result_delivery_unknown`. `why` says what happened ("the agent process exited
    /// mid-turn (signal: 9)").
    pub fn result_unknown(why: impl std::fmt::Display) -> Self {
        AdapterError::new(
            ErrorCategory::ResultDeliveryUnknown,
            format!(
                "{why}, after it was given the prompt and before the turn's result: whether it \
                 acted on the prompt is unknown"
            ),
        )
    }

    /// The events that end a turn with this error: `error`, then `run.end` `failed`.
    pub fn run_failed(self) -> Vec<EventBody> {
        vec![
            EventBody::Error(ErrorNotice {
                category: self.category,
                message: self.message.clone(),
            }),
            EventBody::RunEnd(RunEnd {
                state: RunState::Failed,
                category: Some(self.category),
                message: Some(self.message),
            }),
        ]
    }
}

/// How a family resumes a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeKind {
    /// By the agent's native session id, in a new process.
    NativeId,
    /// As the agent declares when it starts (an ACP agent's `initialize`); without it the
    /// driver starts a fresh session and says so (`resume_rejected`).
    Negotiated,
    /// Not at all: the session layer starts a fresh native session with a `warning`.
    None,
}

/// Whether a family does something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    /// The agent does it and the host uses it.
    Native,
    /// As the agent declares when it starts; the driver degrades visibly when it does not.
    Negotiated,
    /// Not available: the session layer takes the degraded path itself.
    Absent,
}

/// How a family's agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessModel {
    /// One process for many turns.
    Persistent,
    /// One process per turn, the next resumed by the native id (control mode 4).
    PerTurn,
}

/// What a family can do. Read by the session layer to decide each degraded path; a capability
/// is declared only where a test with the real CLI shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    pub resume: ResumeKind,
    /// A tool permission round trip with the client (`false`: the family runs under a declared
    /// policy, e.g. the agent's own approval mode, and never asks).
    pub permissions: bool,
    pub cancel: bool,
    /// Input injected into a running turn.
    pub steer: bool,
    pub fork: Support,
    pub usage: bool,
    pub process: ProcessModel,
    /// The family's own records say which workspace a native session belongs to, and the host
    /// checks it before a resume or an import (`Launcher::check_binding`).
    pub binding: bool,
    /// What it does with each session option and attachment kind.
    pub options: OptionCaps,
}

impl Capabilities {
    /// What an agent type nobody describes can be trusted with: nothing beyond a turn.
    pub const NONE: Capabilities = Capabilities {
        resume: ResumeKind::None,
        permissions: false,
        cancel: false,
        steer: false,
        fork: Support::Absent,
        usage: false,
        process: ProcessModel::PerTurn,
        binding: false,
        options: OptionCaps::NEVER_ASKS,
    };
}

/// How a session's model changes between turns (`session.set_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSwitch {
    /// The live agent takes it at once (Claude's `set_model` control request, ACP
    /// `session/set_model` where the agent offers models).
    Live,
    /// The next turn carries it (Codex's per-turn override, a process per turn).
    NextTurn,
    /// The agent takes a model only at start: it is restarted (resumed) for the next turn.
    Restart,
    /// The family takes no model.
    None,
}

/// What a family does with each option and attachment kind. `Negotiated`: as the agent
/// declares when it starts (an ACP agent's `initialize`), found out before `session.create`
/// answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct OptionCaps {
    pub model: Support,
    pub set_model: ModelSwitch,
    pub system_prompt: Support,
    pub mcp_stdio: Support,
    pub mcp_http: Support,
    pub mcp_sse: Support,
    /// The permission modes it maps: `ask` is always one for a family that asks, and a family
    /// that never asks ([`Capabilities::permissions`] `false`: it declares a policy instead)
    /// lists none, so `agent.list` offers it no mode (an explicit `ask` is refused).
    pub permission_modes: &'static [PermissionMode],
    /// Image attachments.
    pub images: Support,
    /// Other file attachments.
    pub files: Support,
    /// Whether a fork of a native session takes a standing prompt of its own (`session.import`
    /// with `system_prompt`); `false` where the agent keeps the one its session started with.
    /// Host-internal (not in `agent.list`): an import that needs it is refused by name.
    #[serde(skip)]
    pub system_prompt_on_fork: bool,
}

impl OptionCaps {
    /// A family that takes none of them.
    pub const NONE: OptionCaps = OptionCaps {
        model: Support::Absent,
        set_model: ModelSwitch::None,
        system_prompt: Support::Absent,
        mcp_stdio: Support::Absent,
        mcp_http: Support::Absent,
        mcp_sse: Support::Absent,
        permission_modes: &[PermissionMode::Ask],
        images: Support::Absent,
        files: Support::Absent,
        system_prompt_on_fork: false,
    };

    /// A family that takes none of them and never asks before its tools: not even `ask`.
    pub const NEVER_ASKS: OptionCaps = OptionCaps {
        permission_modes: &[],
        ..OptionCaps::NONE
    };
}

/// Which native session to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Native {
    /// A new session with this id (chosen by the host, so it is known before the first turn).
    New(String),
    /// Resume an existing session by its id.
    Resume(String),
    /// Continue an existing session in a fork of it (a new native id; the original is never
    /// written again).
    Fork(String),
}

impl Native {
    pub fn id(&self) -> &str {
        match self {
            Native::New(id) | Native::Resume(id) | Native::Fork(id) => id,
        }
    }
}

/// What a driver reports.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentOutput {
    Event(EventBody),
    /// The process that now runs the session, for a family whose process changes under one
    /// handle ([`ProcessModel::PerTurn`]: each turn's process as it starts, `None` once it is
    /// gone between turns). Sent before anything that process says, so the host knows its own
    /// child before it checks who else holds the session. A persistent family need not send
    /// it: the pid given to [`AgentSession::new`] stands.
    Pid(Option<u32>),
    /// The process is gone; nothing follows.
    Exited {
        status: String,
    },
}

/// What a driver did with a permission answer it wrote (`AgentInput::Permission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Honoured {
    /// The native answer included the "always" part, so the agent keeps the rule.
    pub always: bool,
}

/// Where a driver acknowledges a permission answer.
pub type PermissionAck = oneshot::Sender<Result<Honoured, AdapterError>>;

/// How long [`AgentSession::choose_permission`] waits for the driver's acknowledgement (a
/// driver answers right after the write; one that cannot take its input meanwhile, e.g. stuck
/// on a full event queue, counts as not honouring the always part).
pub const PERMISSION_ACK_WAIT: Duration = Duration::from_secs(2);

/// What the session layer asks of a driver.
#[derive(Debug)]
pub enum AgentInput {
    /// Start a turn with this prompt; `id` (the host's run id) names the prompt where the
    /// family can carry it into its session file. `attachments`: checked and copied by the
    /// session layer, of the kinds the family declares ([`OptionCaps`]); the driver passes
    /// each in the agent's own form (an image block, a local image path, ACP content).
    Prompt {
        text: String,
        id: String,
        attachments: Vec<Attachment>,
    },
    /// Use `model` from now on (`session.set_model`). `reply`: `Ok(ModelSwitch::Live)` the
    /// live agent took it; `Ok(ModelSwitch::NextTurn)` the next turn carries it; an error:
    /// it did not (the session layer then restarts the agent for the next turn, which opens
    /// with the session's new options).
    SetModel {
        model: String,
        reply: oneshot::Sender<Result<ModelSwitch, AdapterError>>,
    },
    /// Answer a `permission.request`: `option` is the one of the agent's own options that was
    /// chosen (`None`: a plain yes/no, `allow`), which the driver passes on natively (Claude:
    /// an allow with the suggested permission updates; Codex: its decision; ACP: the
    /// `optionId`). `ack` is answered once the driver wrote the native answer to a request
    /// the agent has pending: [`Honoured`] says whether that answer carried the "always" part
    /// (Claude: the permission updates; Codex: `acceptForSession` / the session scope; ACP: an
    /// `allow_always` option), the only case the session records a rule for. An answer that
    /// went nowhere (no such request pending, the writer gone) is an error.
    Permission {
        request_id: String,
        allow: bool,
        option: Option<PermissionOption>,
        input: Value,
        message: Option<String>,
        ack: PermissionAck,
    },
    /// Interrupt the current turn; the process stays.
    Interrupt,
    /// Inject `text` into the running turn (the family's `Capabilities::steer`); `id` is the
    /// run it joins. `reply` says whether the agent took it: `Ok`, taken into that turn; an
    /// error whose category is `transport_lost`, `agent_failed` or `protocol_incompatible`
    /// means it was not sent or was refused (no turn running, a family that cannot steer, the
    /// agent said no), and the session layer then queues the text; `result_delivery_unknown`
    /// means it was sent and no answer came (the session layer then does not queue it). A
    /// driver answers within its own bound, shorter than [`STEER_WAIT`], and never blocks its
    /// other inputs meanwhile; a turn that ends before the agent's answer answers it too. A
    /// driver that cannot steer answers an error at once; a reply dropped unanswered means
    /// not sent.
    Steer {
        text: String,
        id: String,
        reply: oneshot::Sender<Result<(), AdapterError>>,
    },
    /// Close stdin, let the process finish, stop its group after `grace`.
    Close {
        grace: Duration,
        done: oneshot::Sender<()>,
    },
}

/// How long the session layer waits for a steer's answer ([`SteerAnswer`]). Every driver's
/// own bound is shorter, so an accept that comes late is never taken for a refusal.
pub const STEER_WAIT: Duration = Duration::from_secs(15);

/// The driver's answer to one steer, awaited for at most [`STEER_WAIT`] from when it was
/// handed over.
#[derive(Debug)]
pub struct SteerAnswer {
    answer: oneshot::Receiver<Result<(), AdapterError>>,
    deadline: tokio::time::Instant,
}

impl SteerAnswer {
    /// The answer: `Ok`, the agent took it into the turn; an error says why not, or
    /// (`result_delivery_unknown`) that nobody knows. Cancel-safe (it can be a `select!`
    /// branch); not to be awaited again once it returned.
    pub async fn wait(&mut self) -> Result<(), AdapterError> {
        match tokio::time::timeout_at(self.deadline, &mut self.answer).await {
            Ok(Ok(taken)) => taken,
            // The driver dropped it unanswered: it never wrote it (drivers answer what they
            // wrote, whatever happens next).
            Ok(Err(_)) => Err(AdapterError::new(
                ErrorCategory::TransportLost,
                "the agent process went before it took the steer; the steer was not sent",
            )),
            Err(_) => Err(AdapterError::new(
                ErrorCategory::ResultDeliveryUnknown,
                format!(
                    "the agent did not answer the steer within {} s: whether the turn took it \
                     is unknown",
                    STEER_WAIT.as_secs()
                ),
            )),
        }
    }
}

/// A live agent. Dropping it closes the process (its driver stops the group after a short
/// grace).
#[derive(Debug)]
pub struct AgentSession {
    input: mpsc::Sender<AgentInput>,
    pub events: mpsc::Receiver<AgentOutput>,
    pid: Option<u32>,
}

impl AgentSession {
    /// A handle over a driver's channels.
    pub fn new(
        input: mpsc::Sender<AgentInput>,
        events: mpsc::Receiver<AgentOutput>,
        pid: Option<u32>,
    ) -> Self {
        AgentSession { input, events, pid }
    }

    /// The process (and process group) id: the one given at the start, or the latest a driver
    /// reported ([`AgentOutput::Pid`]); `None` while none runs.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Record the process a driver reported ([`AgentOutput::Pid`]).
    pub fn set_pid(&mut self, pid: Option<u32>) {
        self.pid = pid;
    }

    async fn request(&self, input: AgentInput) -> Result<(), AdapterError> {
        self.input.send(input).await.map_err(|_| {
            AdapterError::new(ErrorCategory::TransportLost, "the agent process is gone")
        })
    }

    /// Start a turn with a prompt, named by the host's run id. `Ok` means the driver took it
    /// (it then ends the turn itself); an error means it never reached the driver, so not
    /// the agent either.
    pub async fn send(&self, text: &str, id: &str) -> Result<(), AdapterError> {
        self.send_with(text, id, &[]).await
    }

    /// [`AgentSession::send`] with attachments (checked and copied by the session layer).
    pub async fn send_with(
        &self,
        text: &str,
        id: &str,
        attachments: &[Attachment],
    ) -> Result<(), AdapterError> {
        self.input
            .send(AgentInput::Prompt {
                text: text.to_owned(),
                id: id.to_owned(),
                attachments: attachments.to_vec(),
            })
            .await
            .map_err(|_| AdapterError::prompt_not_sent("the agent process is gone"))
    }

    /// Answer a `permission.request` yes or no (the driver picks the agent's plain option).
    pub async fn respond_permission(
        &self,
        request_id: &str,
        allow: bool,
        input: &Value,
        message: Option<&str>,
    ) -> Result<Honoured, AdapterError> {
        self.permission(request_id, allow, None, input, message)
            .await
    }

    /// Answer a `permission.request` with one of the options it offered. `Ok` once the driver
    /// wrote the answer to the pending request, saying whether the agent got the "always"
    /// part; an error: it did not (no such request pending, the process gone) or did not say
    /// within [`PERMISSION_ACK_WAIT`].
    pub async fn choose_permission(
        &self,
        request_id: &str,
        option: &PermissionOption,
        input: &Value,
        message: Option<&str>,
    ) -> Result<Honoured, AdapterError> {
        self.permission(
            request_id,
            option.kind.allows(),
            Some(option.clone()),
            input,
            message,
        )
        .await
    }

    async fn permission(
        &self,
        request_id: &str,
        allow: bool,
        option: Option<PermissionOption>,
        input: &Value,
        message: Option<&str>,
    ) -> Result<Honoured, AdapterError> {
        let (ack, acked) = oneshot::channel();
        self.request(AgentInput::Permission {
            request_id: request_id.to_owned(),
            allow,
            option,
            input: input.clone(),
            message: message.map(str::to_owned),
            ack,
        })
        .await?;
        match tokio::time::timeout(PERMISSION_ACK_WAIT, acked).await {
            Ok(Ok(honoured)) => honoured,
            Ok(Err(_)) => Err(AdapterError::new(
                ErrorCategory::TransportLost,
                "the agent's driver dropped the permission answer unsaid",
            )),
            Err(_) => Err(AdapterError::new(
                ErrorCategory::ResultDeliveryUnknown,
                "the agent's driver did not confirm the permission answer in time",
            )),
        }
    }

    /// Inject `text` into the running turn, named by its run id (`AgentInput::Steer`), and
    /// wait for the agent's answer ([`SteerAnswer::wait`]).
    pub async fn steer(&self, text: &str, id: &str) -> Result<(), AdapterError> {
        self.start_steer(text, id).await?.wait().await
    }

    /// Hand a steer to the driver and return at once: its answer comes on the returned
    /// [`SteerAnswer`] (a caller that must go on taking events and commands waits for it
    /// alongside them). An error: it never reached the driver.
    pub async fn start_steer(&self, text: &str, id: &str) -> Result<SteerAnswer, AdapterError> {
        let (reply, answer) = oneshot::channel();
        self.request(AgentInput::Steer {
            text: text.to_owned(),
            id: id.to_owned(),
            reply,
        })
        .await
        .map_err(|_| {
            AdapterError::new(
                ErrorCategory::TransportLost,
                "the agent process is gone; the steer was not sent",
            )
        })?;
        Ok(SteerAnswer {
            answer,
            deadline: tokio::time::Instant::now() + STEER_WAIT,
        })
    }

    /// Ask the live agent to use `model` from now on ([`AgentInput::SetModel`]); waits for
    /// its answer for at most [`PERMISSION_ACK_WAIT`]. An error: it did not take it (or never
    /// got it).
    pub async fn set_model(&self, model: &str) -> Result<ModelSwitch, AdapterError> {
        let (reply, answer) = oneshot::channel();
        self.request(AgentInput::SetModel {
            model: model.to_owned(),
            reply,
        })
        .await?;
        match tokio::time::timeout(PERMISSION_ACK_WAIT, answer).await {
            Ok(Ok(taken)) => taken,
            Ok(Err(_)) => Err(AdapterError::new(
                ErrorCategory::TransportLost,
                "the agent's driver dropped the model change unanswered",
            )),
            Err(_) => Err(AdapterError::new(
                ErrorCategory::ResultDeliveryUnknown,
                "the agent did not confirm the model change in time",
            )),
        }
    }

    /// Interrupt the current turn; the process stays for the next one. The turn ends with
    /// `run.end` `cancelled`.
    pub async fn cancel_turn(&self) -> Result<(), AdapterError> {
        self.request(AgentInput::Interrupt).await
    }

    /// Close stdin, let the process finish, stop its group after `grace`; returns once the
    /// process is reaped. Events not taken yet are discarded (the driver never waits for a
    /// reader that is closing it).
    pub async fn close(self, grace: Duration) {
        let AgentSession { input, events, .. } = self;
        let (done, finished) = oneshot::channel();
        // The request goes in before the events stop being taken, so the driver (perhaps
        // blocked on a full event queue) finds it as soon as its next send fails.
        match input.try_send(AgentInput::Close { grace, done }) {
            Ok(()) => drop(events),
            Err(mpsc::error::TrySendError::Full(close)) => {
                drop(events);
                if input.send(close).await.is_err() {
                    return;
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
        let _stopped = finished.await;
    }
}

/// Opens agents for the session layer.
pub trait Launcher: Send + Sync {
    /// Whether agents of this type can run turns in this build.
    fn runs_turns(&self, agent_type: &str) -> bool;

    /// Whether `agent_type` names an agent this host knows (a family or a registered agent).
    fn knows(&self, agent_type: &str) -> bool {
        self.runs_turns(agent_type)
    }

    /// What agents of this type can do (an unknown type: [`Capabilities::NONE`]).
    fn capabilities(&self, _agent_type: &str) -> Capabilities {
        Capabilities::NONE
    }

    /// What agents of this type do with each option, with every `Negotiated` one resolved to
    /// `Native` or `Absent` by asking the agent (an ACP agent's `initialize` answer, found
    /// once and kept). Called by `session.create` only when an option it was given is
    /// negotiated. An error: the agent could not be asked.
    fn negotiate<'a>(
        &'a self,
        agent_type: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<OptionCaps, AdapterError>> {
        let options = self.capabilities(agent_type).options;
        Box::pin(async move { Ok(options) })
    }

    /// Whether the native session `native_id` belongs to `cwd`, as far as the family's own
    /// records say (checked before a resume or an import): `Err` says why not.
    fn check_binding(
        &self,
        _agent_type: &str,
        _cwd: &Path,
        _native_id: &str,
    ) -> Result<(), String> {
        Ok(())
    }

    /// The model provider an agent of this type would talk to now (its base URL's host and a
    /// hash of its key, as the family reads them from the agent's variables and files), for
    /// the session's binding; `None`: the host cannot tell. Reads files: call off the runtime.
    fn provider(&self, _agent_type: &str) -> Option<crate::protocol::options::ProviderIdentity> {
        None
    }

    /// The model an agent of this type runs when the session names none (its configured
    /// default), if the host can tell. Reads files: call off the runtime.
    fn default_model(&self, _agent_type: &str) -> Option<String> {
        None
    }

    /// A hint for an agent's error `message` when it says an environment variable is
    /// missing: which one, whether the host had it, and how to supply it (never a value).
    /// `None`: no such words, or nothing to add. Reads files: call off the runtime.
    fn env_hint(&self, _agent_type: &str, _message: &str) -> Option<String> {
        None
    }

    /// The agent's own sessions of `cwd`, as its files tell them (`session.discover`), in any
    /// order; `None`: this family's sessions cannot be listed. Blocking (files): called off the
    /// runtime.
    fn discover(
        &self,
        _agent_type: &str,
        _cwd: &Path,
    ) -> Option<Result<Vec<super::discover::Discovered>, String>> {
        None
    }

    /// The conversation of the agent's own session `native_id` of `cwd`, oldest first, as its
    /// files tell it (shown at `session.import`); `None`: this family's history cannot be read.
    /// Blocking (files): called off the runtime.
    fn read_history(
        &self,
        _agent_type: &str,
        _cwd: &Path,
        _native_id: &str,
    ) -> Option<Result<Vec<super::discover::HistoryEntry>, String>> {
        None
    }

    /// Whether a session of `agent_type` can be created now (a registered agent's binary must
    /// be there).
    fn check(&self, _agent_type: &str) -> Result<(), AdapterError> {
        Ok(())
    }

    /// Start an agent of `agent_type` for `host_session_id`, in `cwd`, on a new or resumed
    /// native session, with the session's `options` (checked at create against
    /// [`Capabilities::options`]). Called on a runtime worker thread (a parent-death signal
    /// is tied to the thread that spawns).
    fn open(
        &self,
        agent_type: &str,
        cwd: &Path,
        host_session_id: &str,
        native: Native,
        options: &SessionOptions,
    ) -> Result<AgentSession, AdapterError>;

    /// How long an idle agent process is kept (`None`: for ever).
    fn idle_timeout(&self) -> Option<Duration>;

    /// Where an agent of this type keeps the native session `native_id` of `cwd`.
    fn native_file(&self, _agent_type: &str, _cwd: &Path, _native_id: &str) -> NativeFile {
        NativeFile::default()
    }

    /// Watch a session file for changes; `None` if it cannot be watched.
    fn watch(&self, _path: &Path) -> Option<FileChanges> {
        None
    }
}

/// Changes of a watched file: a token per change (coalesced) for as long as this lives.
pub struct FileChanges {
    pub guard: Box<dyn std::any::Any + Send + Sync>,
    pub changes: mpsc::Receiver<()>,
}

impl std::fmt::Debug for FileChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileChanges")
    }
}

/// Where a native session lives on disk, and the family's ownership hooks.
#[derive(Clone, Default)]
pub struct NativeFile {
    /// The session file, if it exists.
    pub path: Option<std::path::PathBuf>,
    /// The live processes, other than ours, that the family's own registry says hold the
    /// session (a family whose CLIs register themselves); `None`: it keeps no such registry.
    pub claimants: Option<Claimants>,
    /// How to read who wrote a line of the file, for a family whose file names the host's
    /// prompts. Without it, any line the host's child did not write while the host watched is
    /// someone else's.
    pub entries: Option<EntryReader>,
}

impl NativeFile {
    /// The live processes the family's registry names for `native_id`, other than `ours`.
    /// Reads files: call off the runtime.
    pub fn claimed_by(&self, native_id: &str, ours: &[super::ownership::OwnedPid]) -> Vec<u32> {
        self.claimants
            .as_ref()
            .map(|c| c(native_id, ours))
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for NativeFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeFile")
            .field("path", &self.path)
            .field("claimants", &self.claimants.is_some())
            .field("entries", &self.entries.is_some())
            .finish()
    }
}

/// A family's registry of live CLIs: the pids, other than ours, that claim a native session.
pub type Claimants =
    std::sync::Arc<dyn Fn(&str, &[super::ownership::OwnedPid]) -> Vec<u32> + Send + Sync>;

/// Reads one complete line of a session file.
pub type EntryReader = fn(&[u8]) -> FileEntry;

/// Who wrote a session-file line, as far as the line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileEntry {
    /// A prompt by its entry id (the host's when the id is one of its run ids), or a message
    /// the CLI wrote in a prompt's name (an interrupt marker). `turn`: the CLI's id for the
    /// prompt the entry belongs to, which such messages share with their prompt.
    Prompt { id: String, turn: Option<String> },
    /// Whatever the CLI writes on its own in a turn (replies, tool results, metadata).
    Other,
    /// Not an entry (torn or garbage): nobody's to vouch for.
    Unreadable,
}

/// A launcher for a host that runs no agents (tests, tools that only read history).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAgents;

impl Launcher for NoAgents {
    fn runs_turns(&self, _agent_type: &str) -> bool {
        false
    }

    /// Holds sessions of any type (their history can be read); runs none.
    fn knows(&self, _agent_type: &str) -> bool {
        true
    }

    fn open(
        &self,
        agent_type: &str,
        _cwd: &Path,
        _host_session_id: &str,
        _native: Native,
        _options: &SessionOptions,
    ) -> Result<AgentSession, AdapterError> {
        Err(AdapterError::new(
            ErrorCategory::ProtocolIncompatible,
            format!("this host runs no {agent_type:?} agents"),
        ))
    }

    fn idle_timeout(&self) -> Option<Duration> {
        None
    }
}
