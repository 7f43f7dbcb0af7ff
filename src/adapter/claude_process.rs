//! The driver of one long-lived `claude` stream-json process (design §9), behind the generic
//! [`AgentSession`] handle: [`open`] starts it.
//!
//! One task owns the process: it writes the host's inputs to stdin, reads stdout line by line
//! (at most [`MAX_LINE`] bytes a line, as a whole thread can arrive in one), feeds the pure
//! [`Translator`], and passes the events on through a bounded channel — when the session layer
//! is slow, the task stops reading, and the CLI blocks on its stdout (back-pressure, never a
//! drop). When stdout ends, the task reaps the process, turns an exit in the middle of a turn
//! into a failed run (`agent_failed`), and reports [`AgentOutput::Exited`].

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::claude::{self, Translator};
use super::lines::{BoundedLines, Line};
use super::spawn::{SpawnSpec, Spawned, describe_exit, spawn};
use super::{AdapterError, AgentInput, AgentOutput, AgentSession, Native, OpenSpec};
use crate::protocol::events::EventBody;

/// The longest stdout line read; a longer one is skipped (and counted), not fatal.
pub const MAX_LINE: usize = 32 * 1024 * 1024;
/// Events buffered between the process task and the session.
const EVENT_QUEUE: usize = 256;

/// Start a `claude` process. It waits for the first prompt (Claude reports `system/init` only
/// after it). Must run on a runtime worker thread: the parent-death signal is tied to the
/// thread that spawns.
pub fn open(spec: OpenSpec) -> Result<AgentSession, AdapterError> {
    let (new_id, resume, fork) = match &spec.native {
        Native::New(id) => (Some(id.as_str()), None, false),
        Native::Resume(id) => (None, Some(id.as_str()), false),
        Native::Fork(id) => (None, Some(id.as_str()), true),
    };
    let mut child = spawn(&SpawnSpec {
        program: spec.program,
        args: [spec.args.clone(), claude::launch_args(new_id, resume, fork)].concat(),
        cwd: spec.cwd,
        base_env: spec.base_env,
        extra_env: spec.extra_env,
        session_id: Some(spec.host_session_id.clone()),
        home: spec.home,
        label: format!("claude[{}]", spec.host_session_id),
    })?;
    let pid = child.pid();
    let resuming = resume.map(str::to_owned);
    let (input, inputs) = mpsc::channel(64);
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    let stdout = child.stdout.take();
    let stdin = child.stdin.take();
    let span = tracing::info_span!("agent", session_id = %spec.host_session_id, pid);
    tokio::spawn(tracing::Instrument::instrument(
        run(child, stdin, stdout, inputs, events_tx, resuming),
        span,
    ));
    Ok(AgentSession::new(input, events, pid))
}

/// The stdin line for an input, and whether it starts a turn.
fn frame_of(input: AgentInput, interrupts: &mut u64) -> Option<(String, bool)> {
    match input {
        AgentInput::Prompt { text, id } => Some((claude::user_frame(&text, &id), true)),
        AgentInput::Permission {
            request_id,
            allow,
            input,
            message,
        } => Some((
            claude::permission_frame(&request_id, allow, &input, message.as_deref()),
            false,
        )),
        AgentInput::Interrupt => {
            *interrupts += 1;
            Some((
                claude::interrupt_frame(&format!("interrupt-{interrupts}")),
                false,
            ))
        }
        AgentInput::Close { .. } => None,
    }
}

async fn write_line(stdin: &mut Option<tokio::process::ChildStdin>, line: &str) {
    let written = match stdin.as_mut() {
        Some(stdin) => {
            let mut bytes = Vec::with_capacity(line.len() + 1);
            bytes.extend_from_slice(line.as_bytes());
            bytes.push(b'\n');
            stdin.write_all(&bytes).await.and(stdin.flush().await)
        }
        None => Err(std::io::Error::other("stdin closed")),
    };
    if let Err(e) = written {
        tracing::warn!(error = %e, "writing to the agent failed");
    }
}

/// How long a driver whose session went away gives the process to finish.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);

async fn run(
    mut child: Spawned,
    mut stdin: Option<tokio::process::ChildStdin>,
    stdout: Option<tokio::process::ChildStdout>,
    mut inputs: mpsc::Receiver<AgentInput>,
    events: mpsc::Sender<AgentOutput>,
    resuming: Option<String>,
) {
    let Some(stdout) = stdout else {
        return;
    };
    let mut lines = BoundedLines::new(stdout, MAX_LINE);
    let mut translator = Translator::new();
    let mut in_turn = false;
    let mut interrupts = 0u64;
    let mut closing: Option<(Duration, oneshot::Sender<()>)> = None;
    // The session stopped taking events (it is closing us, or it is gone).
    let mut session_gone = false;
    // A dead CLI whose stdout a child of it still holds never sends EOF: its exit is watched
    // too.
    let leader = child.leader_exit();
    tokio::pin!(leader);
    let mut leader_gone = false;
    'process: loop {
        tokio::select! {
            () = &mut leader, if !leader_gone => {
                leader_gone = true;
                break;
            }
            input = inputs.recv() => match input {
                Some(AgentInput::Close { grace, done }) => {
                    closing = Some((grace, done));
                    break;
                }
                Some(input) => {
                    if let Some((line, starts_turn)) = frame_of(input, &mut interrupts) {
                        in_turn |= starts_turn;
                        write_line(&mut stdin, &line).await;
                    }
                }
                None => {
                    session_gone = true;
                    break;
                }
            },
            line = lines.next_line() => match line {
                Ok(Some(Line::Text(line))) => {
                    let events_of_line = translator.on_stdout_line(&line);
                    // Control requests we do not serve (hooks, SDK MCP) get an error answer,
                    // so the CLI never waits on us.
                    for reply in translator.take_replies() {
                        write_line(&mut stdin, &reply).await;
                    }
                    for event in events_of_line {
                        if matches!(event, EventBody::RunEnd(_)) {
                            in_turn = false;
                        }
                        if events.send(AgentOutput::Event(event)).await.is_err() {
                            session_gone = true;
                            break 'process;
                        }
                    }
                }
                Ok(Some(Line::TooLong)) => {
                    tracing::warn!(max = MAX_LINE, "skipped an over-long stdout line");
                }
                Ok(Some(Line::NotUtf8)) => {
                    tracing::debug!("skipped a stdout line that is not UTF-8");
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "agent stdout failed");
                    break;
                }
            },
        }
    }
    // Nothing more is taken: a prompt sent from now on fails at once (the session then opens
    // a new process) instead of vanishing into a process that is going away.
    inputs.close();
    if closing.is_none() {
        while let Ok(input) = inputs.try_recv() {
            if let AgentInput::Close { grace, done } = input {
                closing = Some((grace, done));
                break;
            }
        }
    }
    if closing.is_none() && session_gone {
        closing = Some((ORPHAN_GRACE, oneshot::channel().0));
    }
    if closing.as_ref().is_some_and(|(grace, _)| grace.is_zero()) {
        // No grace: killed before it sees its stdin close (and writes anything more).
        child.kill_now();
    }
    drop(stdin.take());
    let status = match closing {
        Some((grace, done)) => {
            let status = child.stop(grace).await;
            let _caller_gone = done.send(());
            status
        }
        None => {
            let status = child.wait().await;
            if leader_gone {
                // The group is gone now and the pipe closed: what the CLI wrote before it
                // died still counts.
                let tail = tokio::time::timeout(Duration::from_secs(1), async {
                    let mut tail = Vec::new();
                    while let Ok(Some(line)) = lines.next_line().await {
                        if let Line::Text(line) = line {
                            tail.extend(translator.on_stdout_line(&line));
                        }
                    }
                    tail
                })
                .await
                .unwrap_or_default();
                for event in tail {
                    if matches!(event, EventBody::RunEnd(_)) {
                        in_turn = false;
                    }
                    if events.send(AgentOutput::Event(event)).await.is_err() {
                        return;
                    }
                }
            }
            status
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(e) => {
            tracing::warn!(error = %e, "reaping the agent failed");
            std::process::ExitStatus::default()
        }
    };
    let stderr = child.stderr_tail().await;
    tracing::info!(%status, in_turn, skipped = translator.skipped(), "agent process ended");
    if session_gone {
        return;
    }
    let exit = describe_exit(status, &stderr);
    let rejected = stderr
        .iter()
        .find(|l| l.contains("No conversation found"))
        .filter(|_| resuming.is_some() && translator.native_id().is_none() && in_turn);
    let last = match rejected {
        // A CLI that reports an unknown `--resume` id only on stderr.
        Some(line) => translator.on_resume_rejected(line),
        None => translator.on_exit(in_turn, &exit),
    };
    for event in last {
        if events.send(AgentOutput::Event(event)).await.is_err() {
            return;
        }
    }
    let _session_gone = events.send(AgentOutput::Exited { status: exit }).await;
}
