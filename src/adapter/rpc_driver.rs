//! What the JSON-RPC agent drivers (`codex_process.rs`, `acp_process.rs`) share: starting the
//! process behind a [`RpcClient`], the [`Io`] a driver task owns (calls whose answer is awaited
//! while what the agent sends is kept for after, events out), opening while a close is
//! honoured ([`open_or_close`]), and how a driver decides to stop its process ([`closing`],
//! [`stop`]). Each driver keeps its own loop: what it listens to differs by protocol.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::jsonrpc::{Dialect, Incoming, RpcClient, RpcError};
use super::spawn::{SpawnSpec, Spawned, spawn};
use super::{AdapterError, AgentInput, AgentOutput, AgentSession, OpenSpec};
use crate::protocol::events::{ErrorCategory, ErrorNotice, EventBody, RunEnd, RunState};

/// Events buffered between the process task and the session.
const EVENT_QUEUE: usize = 256;
/// How long a driver whose session went away gives the process to finish.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);

/// The session stopped taking events.
pub(super) struct Gone;

/// How to close the process, and whom to tell when it is done.
pub(super) type Closing = (Duration, oneshot::Sender<()>);

/// The driver's side of the process: the client, what the agent sends, what arrived while a
/// call waited (in order), and the events going to the session.
pub(super) struct Io {
    pub rpc: RpcClient,
    pub incoming: mpsc::Receiver<Incoming>,
    pub backlog: VecDeque<Incoming>,
    pub events: mpsc::Sender<AgentOutput>,
}

/// A started process: its handle, the driver's `Io`, the session's inputs, and the session
/// handle to give back.
pub(super) struct Started {
    pub child: Spawned,
    pub io: Io,
    pub inputs: mpsc::Receiver<AgentInput>,
    pub session: AgentSession,
}

/// Spawn `spec.program` with `args` under the spawn policy and put a JSON-RPC client on its
/// stdio. Must run on a runtime worker thread (the parent-death signal is tied to the thread
/// that spawns).
pub(super) fn start(
    spec: &OpenSpec,
    args: Vec<String>,
    label: String,
    dialect: Dialect,
) -> Result<Started, AdapterError> {
    let mut child = spawn(&SpawnSpec {
        program: spec.program.clone(),
        args,
        cwd: spec.cwd.clone(),
        base_env: spec.base_env.clone(),
        extra_env: spec.extra_env.clone(),
        session_id: Some(spec.host_session_id.clone()),
        home: spec.home.clone(),
        label,
    })?;
    let pid = child.pid();
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err(AdapterError::new(
            ErrorCategory::TransportLost,
            "the agent has no stdio",
        ));
    };
    let (rpc, incoming, _skipped) = RpcClient::start(stdout, stdin, dialect);
    let (input, inputs) = mpsc::channel(64);
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    Ok(Started {
        child,
        io: Io {
            rpc,
            incoming,
            backlog: VecDeque::new(),
            events: events_tx,
        },
        inputs,
        session: AgentSession::new(input, events, pid),
    })
}

impl Io {
    pub async fn emit(&self, events: Vec<EventBody>) -> Result<(), Gone> {
        for event in events {
            if self.events.send(AgentOutput::Event(event)).await.is_err() {
                return Err(Gone);
            }
        }
        Ok(())
    }

    /// A request whose answer is awaited while what the agent sends is kept for after (those
    /// messages `keep` accepts; the others are dropped), so a full queue can never stall the
    /// answer.
    pub async fn call(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
        keep: impl Fn(&Incoming) -> bool,
    ) -> Result<Value, RpcError> {
        let rpc = self.rpc.clone();
        let call = rpc.request(method, params, timeout);
        tokio::pin!(call);
        loop {
            tokio::select! {
                answer = &mut call => return answer,
                msg = self.incoming.recv() => match msg {
                    Some(msg) if keep(&msg) => self.backlog.push_back(msg),
                    Some(_) => {}
                    // stdout ended: the answer will say so.
                    None => return call.await,
                },
            }
        }
    }

    /// A run that could not start: `error` and `run.end` failed.
    pub async fn fail_turn(&self, category: ErrorCategory, message: String) -> Result<(), Gone> {
        self.emit(vec![
            EventBody::Error(ErrorNotice {
                category,
                message: message.clone(),
            }),
            EventBody::RunEnd(RunEnd {
                state: RunState::Failed,
                category: Some(category),
                message: Some(message),
            }),
        ])
        .await
    }
}

/// How opening ended.
pub(super) enum Opening<T> {
    /// Opened (or failed in a way the first prompt reports); the inputs that came meanwhile.
    Opened(T, VecDeque<AgentInput>),
    /// The session closed the agent while it was opening.
    Closed(Closing),
    /// The session went away.
    Gone,
}

/// Run `open` while a close is honoured; other inputs (the first prompt) wait for it.
pub(super) async fn open_or_close<T>(
    open: impl Future<Output = T>,
    inputs: &mut mpsc::Receiver<AgentInput>,
) -> Opening<T> {
    tokio::pin!(open);
    let mut early = VecDeque::new();
    loop {
        tokio::select! {
            opened = &mut open => return Opening::Opened(opened, early),
            input = inputs.recv() => match input {
                Some(AgentInput::Close { grace, done }) => return Opening::Closed((grace, done)),
                Some(input) => early.push_back(input),
                None => return Opening::Gone,
            },
        }
    }
}

/// After a driver's loop: how to stop the process. A close the session asked for (also one
/// still queued); else a short grace when the session is gone or the process still talks;
/// `None` when the process ended by itself (it is only reaped).
pub(super) fn closing(
    inputs: &mut mpsc::Receiver<AgentInput>,
    asked: Option<Closing>,
    session_gone: bool,
    stdout_open: bool,
) -> Option<Closing> {
    inputs.close();
    let mut closing = asked;
    if closing.is_none() {
        while let Ok(input) = inputs.try_recv() {
            if let AgentInput::Close { grace, done } = input {
                closing = Some((grace, done));
                break;
            }
        }
    }
    if closing.is_none() && (session_gone || stdout_open) {
        closing = Some((ORPHAN_GRACE, oneshot::channel().0));
    }
    closing
}

/// Stop the process as `closing` says (no grace: killed before it sees its stdin close and
/// writes anything more), with the client dropped so stdin closes; the caller is told when
/// it is done.
pub(super) async fn stop(
    child: &mut Spawned,
    rpc: RpcClient,
    (grace, done): Closing,
) -> std::io::Result<std::process::ExitStatus> {
    if grace.is_zero() {
        child.kill_now();
    }
    drop(rpc);
    let status = child.stop(grace).await;
    let _caller_gone = done.send(());
    status
}
