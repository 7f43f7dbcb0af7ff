//! The adapter contract's live half (design §9): [`AgentSession`], the handle the session layer
//! holds for one running agent, whatever its protocol family.
//!
//! Every family's driver is one task that owns its process and talks to the handle by two
//! channels: [`AgentInput`] in (prompt, permission answer, interrupt, close) and
//! [`AgentOutput`] out (canonical event bodies, then one `Exited`). [`open`] starts the driver
//! of a family; the handle's methods are the same for all of them.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::AdapterError;
use crate::protocol::events::{ErrorCategory, EventBody};

/// Which native session to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Native {
    /// A new session with this id (chosen by the host, so it is known before the first turn).
    New(String),
    /// Resume an existing session by its id.
    Resume(String),
}

impl Native {
    pub fn id(&self) -> &str {
        match self {
            Native::New(id) | Native::Resume(id) => id,
        }
    }
}

/// Everything needed to open a session.
#[derive(Debug, Clone)]
pub struct OpenSpec {
    pub program: PathBuf,
    pub cwd: PathBuf,
    pub base_env: Vec<(String, String)>,
    pub extra_env: Vec<(String, String)>,
    /// The agent-host session this process serves.
    pub host_session_id: String,
    pub native: Native,
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
    /// Start a turn with this prompt.
    Prompt(String),
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

    /// Start a turn with a prompt.
    pub async fn send(&self, text: &str) -> Result<(), AdapterError> {
        self.request(AgentInput::Prompt(text.to_owned())).await
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
    /// process is reaped.
    pub async fn close(self, grace: Duration) {
        let (done, finished) = oneshot::channel();
        if self
            .request(AgentInput::Close { grace, done })
            .await
            .is_ok()
        {
            let _stopped = finished.await;
        }
    }
}

/// Start the driver of `agent_type`'s family. Only families whose descriptor says `turns`
/// have one.
pub fn open(agent_type: &str, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
    match agent_type {
        "claude" => super::claude_process::open(spec),
        other => Err(AdapterError::new(
            ErrorCategory::ProtocolIncompatible,
            format!("this build cannot run turns with {other:?} agents yet"),
        )),
    }
}
