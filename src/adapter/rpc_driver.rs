//! What the JSON-RPC agent drivers (`codex_process.rs`, `acp_process.rs`) share: starting the
//! process behind a [`RpcClient`], the [`Io`] a driver task owns (calls whose answer is awaited
//! while what the agent sends is kept for after, events out), opening while a close is
//! honoured ([`open_or_close`]), and how a driver decides to stop its process ([`closing`],
//! [`stop`]; a prompt still queued then ends "not sent", [`unsent_prompt`]). Each driver keeps
//! its own loop: what it listens to differs by protocol.
//!
//! Both drivers end a turn without its answer by `session::agent`'s rule: a prompt request
//! that was never written (`RpcError::NotSent`) is `transport_lost` "not sent"; one written
//! and never answered (`RpcError::NoAnswer`, a timeout, the process gone) is
//! `result_delivery_unknown`.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::jsonrpc::{Dialect, Incoming, RpcClient, RpcError};
use super::spawn::{SpawnSpec, Spawned, spawn};
use super::{AdapterError, AgentInput, AgentOutput, AgentSession, OpenSpec};
use crate::protocol::events::{ErrorCategory, EventBody};

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
        self.emit(AdapterError::new(category, message).run_failed())
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
/// `None` when the process ended by itself (it is only reaped). The `bool`: a prompt was
/// still queued, so it never reached the agent (its run ends "not sent",
/// [`AdapterError::prompt_not_sent`]).
pub(super) fn closing(
    inputs: &mut mpsc::Receiver<AgentInput>,
    asked: Option<Closing>,
    session_gone: bool,
    stdout_open: bool,
) -> (Option<Closing>, bool) {
    inputs.close();
    let mut closing = asked;
    let mut unsent = false;
    while let Ok(input) = inputs.try_recv() {
        match input {
            AgentInput::Close { grace, done } if closing.is_none() => {
                closing = Some((grace, done));
            }
            AgentInput::Prompt { .. } => unsent = true,
            _ => {}
        }
    }
    if closing.is_none() && (session_gone || stdout_open) {
        closing = Some((ORPHAN_GRACE, oneshot::channel().0));
    }
    (closing, unsent)
}

/// The events that end a prompt left in the inputs as the process went (`closing`'s `bool`).
pub(super) fn unsent_prompt(exit: &str) -> Vec<EventBody> {
    AdapterError::prompt_not_sent(format!(
        "the agent process ended ({exit}) before the prompt was written to it"
    ))
    .run_failed()
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

/// What the JSON-RPC drivers' tests share: a fake agent (a shell script in a temporary
/// directory that answers by method), and reading what a driver reports.
#[cfg(test)]
pub(super) mod test_support {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;
    use crate::adapter::Native;
    use crate::protocol::events::RunEnd;

    /// Every wait in these tests.
    pub const WAIT: Duration = Duration::from_secs(20);

    /// A fake agent: `body` runs after `dir=` (its directory) and `mode=` (the contents of
    /// `$dir/mode`, the test's choice); a `while read line` loop over `id=` (the request's
    /// id) suits most. The spec opens it in that directory.
    pub fn fake(body: &str, mode: &str) -> (tempfile::TempDir, OpenSpec) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent");
        let script = format!(
            "#!/bin/sh\ndir=\"$(dirname \"$0\")\"\nmode=\"$(cat \"$dir/mode\")\"\n{body}\n"
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("mode"), mode).unwrap();
        nix::unistd::mkfifo(&dir.path().join("hold"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let spec = OpenSpec {
            program: path,
            args: Vec::new(),
            cwd: dir.path().to_owned(),
            base_env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
            extra_env: Vec::new(),
            host_session_id: "host-1".to_owned(),
            home: None,
            native: Native::New("n1".to_owned()),
            options: Default::default(),
        };
        (dir, spec)
    }

    /// The shell line that takes the id of the request on `$line`.
    pub const ID: &str = r#"id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')"#;

    /// Everything the driver reports, through its `Exited`.
    pub async fn all_outputs(session: &mut AgentSession) -> Vec<AgentOutput> {
        let mut seen = Vec::new();
        loop {
            let output = tokio::time::timeout(WAIT, session.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no Exited in time; saw {seen:?}"));
            match output {
                Some(output @ AgentOutput::Exited { .. }) => {
                    seen.push(output);
                    return seen;
                }
                Some(output) => seen.push(output),
                None => panic!("the driver ended without Exited; saw {seen:?}"),
            }
        }
    }

    /// Outputs until (and with) the first `run.end`.
    pub async fn until_run_end(session: &mut AgentSession) -> (Vec<AgentOutput>, RunEnd) {
        let mut seen = Vec::new();
        loop {
            let output = tokio::time::timeout(WAIT, session.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no run.end in time; saw {seen:?}"))
                .unwrap_or_else(|| panic!("the driver ended; saw {seen:?}"));
            if let AgentOutput::Event(EventBody::RunEnd(end)) = &output {
                let end = end.clone();
                seen.push(output);
                return (seen, end);
            }
            seen.push(output);
        }
    }

    pub fn run_ends(outputs: &[AgentOutput]) -> Vec<&RunEnd> {
        outputs
            .iter()
            .filter_map(|o| match o {
                AgentOutput::Event(EventBody::RunEnd(end)) => Some(end),
                _ => None,
            })
            .collect()
    }

    /// Waits (bounded) until the fake leaves `name` in its directory: on the directory's
    /// change events, checked once the watch is up so that a file made before it counts.
    pub async fn file_appears(dir: &Path, name: &str) {
        let path = dir.join(name);
        let mut watch = crate::watch::FileWatch::start(&path).unwrap();
        let appears = async {
            while !path.exists() {
                assert!(watch.changed().await, "the watch of {name} ended");
            }
        };
        tokio::time::timeout(WAIT, appears)
            .await
            .unwrap_or_else(|_| panic!("the fake never wrote {name}"));
    }

    /// Let a fake blocked on `read x < "$dir/hold"` go on.
    pub fn release(dir: &Path) {
        std::fs::write(dir.join("hold"), "go\n").unwrap();
    }
}
