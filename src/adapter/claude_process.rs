//! The driver of one long-lived `claude` stream-json process (design §9): [`ClaudeSession`]
//! with `send`, `respond_permission`, `cancel_turn`, `close` and an event stream.
//!
//! One task owns the process: it writes the host's inputs to stdin, reads stdout line by line
//! (at most [`MAX_LINE`] bytes a line, as a whole thread can arrive in one), feeds the pure
//! [`Translator`], and passes the events on through a bounded channel — when the session layer
//! is slow, the task stops reading, and the CLI blocks on its stdout (back-pressure, never a
//! drop). When stdout ends, the task reaps the process, turns an exit in the middle of a turn
//! into a failed run (`agent_failed`), and reports [`AgentOutput::Exited`].

use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use super::AdapterError;
use super::claude::{self, Translator};
use super::spawn::{SpawnSpec, Spawned, spawn};
use crate::protocol::events::{ErrorCategory, EventBody};

/// The longest stdout line read; a longer one is skipped (and counted), not fatal.
pub const MAX_LINE: usize = 32 * 1024 * 1024;
/// Events buffered between the process task and the session.
const EVENT_QUEUE: usize = 256;

/// Which native session to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Native {
    /// A new session with this id (chosen by the host, so it is known before the first turn).
    New(String),
    /// Resume an existing session by its id.
    Resume(String),
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

/// What the process task reports.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentOutput {
    Event(EventBody),
    /// The process is gone; nothing follows.
    Exited {
        status: String,
    },
}

enum Input {
    /// A line for stdin; `starts_turn` for a prompt.
    Line { line: String, starts_turn: bool },
    Close {
        grace: Duration,
        done: oneshot::Sender<()>,
    },
}

/// A live `claude` process. Dropping it kills the process group.
pub struct ClaudeSession {
    input: mpsc::Sender<Input>,
    pub events: mpsc::Receiver<AgentOutput>,
    pid: Option<u32>,
    interrupts: u64,
}

impl ClaudeSession {
    /// Start the process. It waits for the first prompt (Claude reports `system/init` only
    /// after it).
    pub fn open(spec: OpenSpec) -> Result<ClaudeSession, AdapterError> {
        let (new_id, resume) = match &spec.native {
            Native::New(id) => (Some(id.as_str()), None),
            Native::Resume(id) => (None, Some(id.as_str())),
        };
        let mut child = spawn(&SpawnSpec {
            program: spec.program,
            args: claude::launch_args(new_id, resume),
            cwd: spec.cwd,
            base_env: spec.base_env,
            extra_env: spec.extra_env,
            session_id: Some(spec.host_session_id.clone()),
            label: format!("claude[{}]", spec.host_session_id),
        })?;
        let pid = child.pid();
        let (input, inputs) = mpsc::channel(64);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let stdout = child.stdout.take();
        let stdin = child.stdin.take();
        let span = tracing::info_span!("agent", session_id = %spec.host_session_id, pid);
        tokio::spawn(tracing::Instrument::instrument(
            run(child, stdin, stdout, inputs, events_tx),
            span,
        ));
        Ok(ClaudeSession {
            input,
            events,
            pid,
            interrupts: 0,
        })
    }

    /// The process (and group) id.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    async fn write(&self, line: String, starts_turn: bool) -> Result<(), AdapterError> {
        self.input
            .send(Input::Line { line, starts_turn })
            .await
            .map_err(|_| {
                AdapterError::new(ErrorCategory::TransportLost, "the agent process is gone")
            })
    }

    /// Start a turn with a prompt.
    pub async fn send(&self, text: &str) -> Result<(), AdapterError> {
        self.write(claude::user_frame(text), true).await
    }

    /// Answer a `permission.request`.
    pub async fn respond_permission(
        &self,
        request_id: &str,
        allow: bool,
        input: &Value,
        message: Option<&str>,
    ) -> Result<(), AdapterError> {
        self.write(
            claude::permission_frame(request_id, allow, input, message),
            false,
        )
        .await
    }

    /// Interrupt the current turn; the process stays for the next one. The turn ends with
    /// `run.end` `cancelled`.
    pub async fn cancel_turn(&mut self) -> Result<(), AdapterError> {
        self.interrupts += 1;
        self.write(
            claude::interrupt_frame(&format!("interrupt-{}", self.interrupts)),
            false,
        )
        .await
    }

    /// Close stdin, let the process finish, stop its group after `grace`.
    pub async fn close(self, grace: Duration) {
        let (done, finished) = oneshot::channel();
        if self.input.send(Input::Close { grace, done }).await.is_ok() {
            let _stopped = finished.await;
        }
    }
}

async fn run(
    mut child: Spawned,
    mut stdin: Option<tokio::process::ChildStdin>,
    stdout: Option<tokio::process::ChildStdout>,
    mut inputs: mpsc::Receiver<Input>,
    events: mpsc::Sender<AgentOutput>,
) {
    let Some(stdout) = stdout else {
        return;
    };
    let mut lines = FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE));
    let mut translator = Translator::new();
    let mut in_turn = false;
    let mut closing: Option<(Duration, oneshot::Sender<()>)> = None;
    loop {
        tokio::select! {
            input = inputs.recv(), if closing.is_none() => match input {
                Some(Input::Line { line, starts_turn }) => {
                    if starts_turn {
                        in_turn = true;
                    }
                    let written = match stdin.as_mut() {
                        Some(stdin) => stdin.write_all(format!("{line}\n").as_bytes()).await.and(stdin.flush().await),
                        None => Err(std::io::Error::other("stdin closed")),
                    };
                    if let Err(e) = written {
                        tracing::warn!(error = %e, "writing to the agent failed");
                    }
                }
                Some(Input::Close { grace, done }) => {
                    drop(stdin.take());
                    closing = Some((grace, done));
                    break;
                }
                None => {
                    // The session was dropped: same as close with a short grace.
                    drop(stdin.take());
                    closing = Some((Duration::from_secs(2), oneshot::channel().0));
                    break;
                }
            },
            line = lines.next() => match line {
                Some(Ok(line)) => {
                    for event in translator.on_stdout_line(&line) {
                        if matches!(event, EventBody::RunEnd(_)) {
                            in_turn = false;
                        }
                        if events.send(AgentOutput::Event(event)).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                    tracing::warn!(max = MAX_LINE, "skipped an over-long stdout line");
                }
                Some(Err(LinesCodecError::Io(e))) => {
                    tracing::debug!(error = %e, "agent stdout failed");
                    break;
                }
                None => break,
            },
        }
    }
    let status = match closing {
        Some((grace, done)) => {
            let status = child.stop(grace).await;
            let _caller_gone = done.send(());
            status
        }
        None => child.wait().await,
    };
    let status = match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    tracing::info!(%status, in_turn, skipped = translator.skipped(), "agent process ended");
    for event in translator.on_exit(in_turn, &status) {
        if events.send(AgentOutput::Event(event)).await.is_err() {
            return;
        }
    }
    let _session_gone = events.send(AgentOutput::Exited { status }).await;
}
