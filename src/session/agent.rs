//! The agent contract as the session layer sees it (design §9): what it asks of any agent,
//! whatever its protocol family. Adapters (a layer above) implement it; the daemon hands the
//! session layer a [`Launcher`] that opens them.
//!
//! - [`AgentSession`] is the handle of one running agent. Every family's driver is one task
//!   that owns its process and talks to the handle by two channels: [`AgentInput`] in
//!   (prompt, permission answer, interrupt, close) and [`AgentOutput`] out (canonical event
//!   bodies, then one `Exited`).
//! - [`AdapterError`] carries one of the shared error categories, everywhere.
//! - [`Launcher`] says which agent types can run turns and opens one (new or resumed).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::events::{ErrorCategory, EventBody};

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
    /// The process is gone; nothing follows.
    Exited {
        status: String,
    },
}

/// What the session layer asks of a driver.
#[derive(Debug)]
pub enum AgentInput {
    /// Start a turn with this prompt; `id` (the host's run id) names the prompt where the
    /// family can carry it into its session file.
    Prompt { text: String, id: String },
    /// Answer a `permission.request`.
    Permission {
        request_id: String,
        allow: bool,
        input: Value,
        message: Option<String>,
    },
    /// Interrupt the current turn; the process stays.
    Interrupt,
    /// Close stdin, let the process finish, stop its group after `grace`.
    Close {
        grace: Duration,
        done: oneshot::Sender<()>,
    },
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

    /// The process (and process group) id.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    async fn request(&self, input: AgentInput) -> Result<(), AdapterError> {
        self.input.send(input).await.map_err(|_| {
            AdapterError::new(ErrorCategory::TransportLost, "the agent process is gone")
        })
    }

    /// Start a turn with a prompt, named by the host's run id.
    pub async fn send(&self, text: &str, id: &str) -> Result<(), AdapterError> {
        self.request(AgentInput::Prompt {
            text: text.to_owned(),
            id: id.to_owned(),
        })
        .await
    }

    /// Answer a `permission.request`.
    pub async fn respond_permission(
        &self,
        request_id: &str,
        allow: bool,
        input: &Value,
        message: Option<&str>,
    ) -> Result<(), AdapterError> {
        self.request(AgentInput::Permission {
            request_id: request_id.to_owned(),
            allow,
            input: input.clone(),
            message: message.map(str::to_owned),
        })
        .await
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

    /// Whether a session of `agent_type` can be created now (a registered agent's binary must
    /// be there).
    fn check(&self, _agent_type: &str) -> Result<(), AdapterError> {
        Ok(())
    }

    /// Start an agent of `agent_type` for `host_session_id`, in `cwd`, on a new or resumed
    /// native session. Called on a runtime worker thread (a parent-death signal is tied to the
    /// thread that spawns).
    fn open(
        &self,
        agent_type: &str,
        cwd: &Path,
        host_session_id: &str,
        native: Native,
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

/// Where a native session lives on disk, as far as the family says.
#[derive(Debug, Clone, Default)]
pub struct NativeFile {
    /// The session file, if it exists.
    pub path: Option<std::path::PathBuf>,
    /// Claude's config dir, whose `sessions/` registry names live CLIs.
    pub claude_config: Option<std::path::PathBuf>,
    /// How to read who wrote a line of the file, for a family whose file names the host's
    /// prompts (Claude). Without it, any line the host's child did not write while the host
    /// watched is someone else's.
    pub entries: Option<EntryReader>,
}

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

    fn open(
        &self,
        agent_type: &str,
        _cwd: &Path,
        _host_session_id: &str,
        _native: Native,
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
