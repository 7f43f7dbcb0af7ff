//! The driver of one long-lived `claude` stream-json process (design §9), behind the generic
//! [`AgentSession`] handle: [`open`] starts it.
//!
//! One task owns the process: it writes the host's inputs to stdin, reads stdout line by line
//! (at most [`MAX_LINE`] bytes a line, as a whole thread can arrive in one), feeds the pure
//! [`Translator`], and passes the events on through a bounded channel — when the session layer
//! is slow, the task stops reading, and the CLI blocks on its stdout (back-pressure, never a
//! drop). When stdout ends, the task reaps the process, ends a turn still open, and reports
//! [`AgentOutput::Exited`].
//!
//! A turn that ends without its `result` follows `session::agent`'s rule: a prompt whose
//! write to stdin failed, or that was still in the inputs when the process went, ends the run
//! `transport_lost` "not sent" at once (it never reached the CLI); a prompt written and
//! flushed whose `result` never came ends it `result_delivery_unknown` at the exit.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::claude::{self, Translator};
use super::lines::{BoundedLines, Line};
use super::spawn::{SpawnSpec, Spawned, describe_exit, spawn};
use super::{
    AdapterError, AgentInput, AgentOutput, AgentSession, Honoured, ModelSwitch, Native, OpenSpec,
    PermissionAck,
};
use crate::protocol::events::{ErrorCategory, EventBody};
use serde_json::Value;

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
    if let Some(why) = bypass_refused(&spec) {
        return Err(AdapterError::new(ErrorCategory::PermissionDenied, why));
    }
    let mcp_file = McpConfigFile::write(&spec)?;
    let mut child = spawn(&SpawnSpec {
        program: spec.program,
        args: [
            spec.args.clone(),
            claude::launch_args(new_id, resume, fork),
            claude::option_args(&spec.options, mcp_file.as_ref().map(McpConfigFile::path)),
        ]
        .concat(),
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
        async move {
            // The events end only once the file is gone.
            let held = events_tx.clone();
            run(child, stdin, stdout, inputs, events_tx, resuming).await;
            // The process is gone: its MCP config (secrets included) goes with it.
            drop(mcp_file);
            drop(held);
        },
        span,
    ));
    Ok(AgentSession::new(input, events, pid))
}

/// The `--mcp-config` file of one process: the servers' JSON (env and header values are
/// secrets: never in argv, where `/proc/<pid>/cmdline` shows them to every user, and a large
/// config would pass the kernel's per-argument limit). Written 0600 under the host home's
/// `run/` (0700; the system temp dir for a spec without a home), a new file per process
/// (`O_EXCL`: never through a planted symlink), removed when the process is gone.
struct McpConfigFile(std::path::PathBuf);

impl McpConfigFile {
    /// `None` when the session has no MCP servers.
    fn write(spec: &OpenSpec) -> Result<Option<McpConfigFile>, AdapterError> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        if spec.options.mcp_servers.is_empty() {
            return Ok(None);
        }
        let failed = |what: &str, e: std::io::Error| {
            AdapterError::new(
                ErrorCategory::TransportLost,
                format!("could not write the MCP config for claude ({what}): {e}"),
            )
        };
        let dir = match &spec.home {
            Some(home) => {
                let dir = std::path::Path::new(home.as_str()).join("run");
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| failed(&dir.display().to_string(), e))?;
                dir
            }
            None => std::env::temp_dir(),
        };
        let session: String = spec
            .host_session_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!(
            "claude-mcp-{session}-{}.json",
            super::reap::next_spawn_id()
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| failed(&path.display().to_string(), e))?;
        // Owned from here: removed on any failure below.
        let owned = McpConfigFile(path);
        file.write_all(claude::mcp_config(&spec.options.mcp_servers).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| failed(&owned.0.display().to_string(), e))?;
        Ok(Some(owned))
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for McpConfigFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), "could not remove an MCP config: {e}");
        }
    }
}

/// Why the CLI would refuse this spec's `bypass` mode at once: as root, Claude Code takes
/// `bypassPermissions` only with `IS_SANDBOX=1` in its environment, which the host never sets
/// on its own (a user's environment or `[agents.claude] env` carries it).
fn bypass_refused(spec: &OpenSpec) -> Option<String> {
    let sandboxed = spec
        .base_env
        .iter()
        .chain(&spec.extra_env)
        .rev()
        .find(|(name, _)| name == "IS_SANDBOX")
        .is_some_and(|(_, value)| value == "1");
    (spec.options.mode() == crate::protocol::options::PermissionMode::Bypass
        && nix::unistd::geteuid().is_root()
        && !sandboxed)
        .then(|| {
            "Claude Code refuses permission mode bypass when it runs as root unless IS_SANDBOX=1 \
             is in its environment; set it in the host's environment or in [agents.claude] env"
                .to_owned()
        })
}

/// How long a `set_model` control request waits for the CLI's answer (it answers at once;
/// shorter than the session's own wait, so the session hears why).
const SET_MODEL_WAIT: Duration = Duration::from_millis(1500);

/// A `set_model` request written to the CLI, waiting for its `control_response`.
struct PendingModel {
    request_id: String,
    reply: oneshot::Sender<Result<ModelSwitch, AdapterError>>,
    deadline: tokio::time::Instant,
}

/// A stdin line for an input: the line, whether it starts a turn, for a permission answer
/// where to acknowledge it once written (with whether it carries the always part), and for a
/// model change where to answer once the CLI did.
struct Frame {
    line: String,
    starts_turn: bool,
    ack: Option<(PermissionAck, Honoured)>,
    model: Option<PendingModel>,
}

impl Frame {
    fn plain(line: String, starts_turn: bool) -> Frame {
        Frame {
            line,
            starts_turn,
            ack: None,
            model: None,
        }
    }
}

/// What an input comes to: a line to write, nothing, or a prompt that cannot be sent (its
/// run ends with this error, the prompt never written).
enum Framed {
    Line(Frame),
    Nothing,
    Unsendable(AdapterError),
}

/// A prompt's attachment blocks ([`claude::attachment_blocks`]), read off the input loop (it
/// reads the copies: blocking); none for any other input.
async fn prompt_blocks(input: &AgentInput) -> Result<Vec<serde_json::Value>, AdapterError> {
    let AgentInput::Prompt { attachments, .. } = input else {
        return Ok(Vec::new());
    };
    if attachments.is_empty() {
        return Ok(Vec::new());
    }
    let attachments = attachments.clone();
    tokio::task::spawn_blocking(move || claude::attachment_blocks(&attachments))
        .await
        .unwrap_or_else(|e| {
            Err(AdapterError::prompt_not_sent(format!(
                "reading the attachments failed ({e})"
            )))
        })
}

/// The stdin line for an input.
/// `blocks`: a prompt's attachment blocks, [`prompt_blocks`].
fn frame_of(
    input: AgentInput,
    blocks: Result<Vec<serde_json::Value>, AdapterError>,
    counter: &mut u64,
    translator: &mut Translator,
) -> Framed {
    match input {
        AgentInput::Prompt { text, id, .. } => match blocks {
            Ok(blocks) => Framed::Line(Frame::plain(
                claude::user_frame_with(&text, &id, &blocks),
                true,
            )),
            Err(error) => Framed::Unsendable(error),
        },
        AgentInput::Permission {
            request_id,
            allow,
            option,
            input,
            message,
            ack,
        } => {
            let (line, always) = translator.permission_frame(
                &request_id,
                allow,
                option.as_ref(),
                &input,
                message.as_deref(),
            );
            Framed::Line(Frame {
                line,
                starts_turn: false,
                ack: Some((ack, Honoured { always })),
                model: None,
            })
        }
        AgentInput::Interrupt => {
            *counter += 1;
            Framed::Line(Frame::plain(
                claude::interrupt_frame(&format!("interrupt-{counter}")),
                false,
            ))
        }
        AgentInput::Steer { reply, .. } => {
            // The family does not steer (`families/claude.rs` says why): refused, never
            // written, so the session queues it.
            let _unwaited = reply.send(Err(AdapterError::new(
                crate::protocol::events::ErrorCategory::ProtocolIncompatible,
                "Claude Code takes a message mid-turn only when the turn makes another model \
                 request; the host does not steer it",
            )));
            Framed::Nothing
        }
        AgentInput::SetModel { model, reply } => {
            *counter += 1;
            let request_id = format!("set-model-{counter}");
            Framed::Line(Frame {
                line: claude::set_model_frame(&request_id, &model),
                starts_turn: false,
                ack: None,
                model: Some(PendingModel {
                    request_id,
                    reply,
                    deadline: tokio::time::Instant::now() + SET_MODEL_WAIT,
                }),
            })
        }
        AgentInput::Close { .. } => Framed::Nothing,
    }
}

/// Answer the model changes the CLI answered (`Live` on success, its error otherwise), and
/// those it left unanswered past their deadline.
fn settle_models(
    pending: &mut Vec<PendingModel>,
    answers: Vec<(String, Result<Value, String>)>,
    now: tokio::time::Instant,
) {
    for (id, answer) in answers {
        let Some(at) = pending.iter().position(|p| p.request_id == id) else {
            continue;
        };
        let waiting = pending.swap_remove(at);
        let _unwaited = waiting
            .reply
            .send(answer.map(|_| ModelSwitch::Live).map_err(|e| {
                AdapterError::new(
                    ErrorCategory::AgentFailed,
                    format!("the agent refused the model change ({e})"),
                )
            }));
    }
    let (late, waiting): (Vec<_>, Vec<_>) = pending.drain(..).partition(|p| p.deadline <= now);
    *pending = waiting;
    for p in late {
        let _unwaited = p.reply.send(Err(AdapterError::new(
            ErrorCategory::ResultDeliveryUnknown,
            "the agent did not answer the model change in time",
        )));
    }
}

/// Write one line to the CLI's stdin and flush it; the error says why it did not go.
async fn write_line(
    stdin: &mut Option<tokio::process::ChildStdin>,
    line: &str,
) -> std::io::Result<()> {
    let written = match stdin.as_mut() {
        Some(stdin) => {
            let mut bytes = Vec::with_capacity(line.len() + 1);
            bytes.extend_from_slice(line.as_bytes());
            bytes.push(b'\n');
            stdin.write_all(&bytes).await.and(stdin.flush().await)
        }
        None => Err(std::io::Error::other("stdin closed")),
    };
    if let Err(e) = &written {
        tracing::warn!(error = %e, "writing to the agent failed");
    }
    written
}

/// Send the events of a turn that ends here; `false` once the session stopped taking them.
async fn emit(events: &mpsc::Sender<AgentOutput>, bodies: Vec<EventBody>) -> bool {
    for event in bodies {
        if events.send(AgentOutput::Event(event)).await.is_err() {
            return false;
        }
    }
    true
}

/// How long a driver whose session went away gives the process to finish.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);
/// How long a failed prompt write waits for the CLI's exit, to say why it went.
const EXIT_AFTER_EPIPE: Duration = Duration::from_millis(500);

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
    let mut counter = 0u64;
    // Model changes asked of the CLI and not answered yet.
    let mut models: Vec<PendingModel> = Vec::new();
    let mut closing: Option<(Duration, oneshot::Sender<()>)> = None;
    // A prompt that never reached the CLI (its stdin closed, or the process ended first).
    let mut unsent = false;
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
            () = tokio::time::sleep_until(
                models.iter().map(|p| p.deadline).min().unwrap_or_else(tokio::time::Instant::now)
            ), if !models.is_empty() => {
                settle_models(&mut models, Vec::new(), tokio::time::Instant::now());
            }
            input = inputs.recv() => match input {
                Some(AgentInput::Close { grace, done }) => {
                    closing = Some((grace, done));
                    break;
                }
                Some(input) => {
                    let blocks = prompt_blocks(&input).await;
                    let Frame { line, starts_turn, ack, model } = match frame_of(input, blocks, &mut counter, &mut translator) {
                        Framed::Line(frame) => frame,
                        Framed::Nothing => continue,
                        Framed::Unsendable(error) => {
                            if !emit(&events, error.run_failed()).await {
                                session_gone = true;
                                break 'process;
                            }
                            continue;
                        }
                    };
                    let written = write_line(&mut stdin, &line).await;
                    if let Some(pending) = model {
                        match &written {
                            Ok(()) => models.push(pending),
                            Err(e) => {
                                let _unwaited = pending.reply.send(Err(AdapterError::new(
                                    ErrorCategory::TransportLost,
                                    format!("writing the model change failed ({e})"),
                                )));
                            }
                        }
                    }
                    if let Some((ack, honoured)) = ack {
                        let _unwaited = ack.send(match &written {
                            Ok(()) => Ok(honoured),
                            Err(e) => Err(AdapterError::new(
                                crate::protocol::events::ErrorCategory::TransportLost,
                                format!("writing the permission answer failed ({e})"),
                            )),
                        });
                    }
                    match written {
                        Ok(()) => in_turn |= starts_turn,
                        Err(e) if starts_turn => {
                            // The CLI never had it: safe to send again. Its stdin is closed, so
                            // it is most likely exiting: if it does so at once, the run ends
                            // with how it ended and what it last wrote on stderr; if not, now.
                            tracing::info!(error = %e, "writing the prompt to the agent's stdin failed");
                            if tokio::time::timeout(EXIT_AFTER_EPIPE, &mut leader).await.is_ok() {
                                leader_gone = true;
                                unsent = true;
                                break;
                            }
                            let why = format!("writing the prompt to the agent's stdin failed ({e})");
                            if !emit(&events, AdapterError::prompt_not_sent(why).run_failed()).await {
                                session_gone = true;
                                break 'process;
                            }
                        }
                        Err(_) => {}
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
                        // A CLI whose stdin is gone is going away; its exit says the rest.
                        let _written = write_line(&mut stdin, &reply).await;
                    }
                    let answers = translator.take_control_responses();
                    if !answers.is_empty() {
                        settle_models(&mut models, answers, tokio::time::Instant::now());
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
    // A prompt still waiting here never reached the CLI.
    while let Ok(input) = inputs.try_recv() {
        match input {
            AgentInput::Close { grace, done } if closing.is_none() => {
                closing = Some((grace, done));
            }
            AgentInput::Prompt { .. } => unsent = true,
            _ => {}
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
    let mut last = match rejected {
        // A CLI that reports an unknown `--resume` id only on stderr.
        Some(line) => translator.on_resume_rejected(line),
        None => translator.on_exit(in_turn, &exit),
    };
    if unsent {
        let why = format!("the agent process ended ({exit}) before the prompt was written to it");
        last.extend(AdapterError::prompt_not_sent(why).run_failed());
    }
    if !emit(&events, last).await {
        return;
    }
    let _session_gone = events.send(AgentOutput::Exited { status: exit }).await;
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::adapter::rpc_driver::test_support::{WAIT, all_outputs, file_appears, run_ends};
    use crate::protocol::events::{ErrorCategory, RunState};

    /// A stand-in for `claude` in a temporary directory: `body` is the script after `dir=`
    /// (the directory, for the files it leaves for the test).
    fn fake(body: &str) -> (tempfile::TempDir, OpenSpec) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claude");
        let script = format!("#!/bin/sh\ndir=\"$(dirname \"$0\")\"\n{body}\n");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spec = OpenSpec {
            program: path,
            args: Vec::new(),
            cwd: dir.path().to_owned(),
            base_env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
            extra_env: Vec::new(),
            host_session_id: "host-1".to_owned(),
            home: None,
            native: Native::New("11111111-2222-4333-8444-555566667777".to_owned()),
            options: Default::default(),
        };
        (dir, spec)
    }

    /// The CLI read the prompt and was killed before its `result`: it had the prompt, so the
    /// run's outcome is unknown (never "not sent").
    #[tokio::test]
    async fn a_prompt_written_then_the_agent_dies_is_result_delivery_unknown() {
        let (dir, spec) = fake("read line\nprintf '%s' \"$line\" > \"$dir/got\"\nkill -9 $$");
        let mut session = open(spec).unwrap();
        session.send("hello there", "run-1").await.unwrap();
        let outputs = all_outputs(&mut session).await;
        let ends = run_ends(&outputs);
        assert_eq!(ends.len(), 1, "{outputs:?}");
        assert_eq!(ends[0].state, RunState::Failed);
        assert_eq!(ends[0].category, Some(ErrorCategory::ResultDeliveryUnknown));
        let message = ends[0].message.as_deref().unwrap_or_default();
        assert!(message.contains("SIGKILL"), "{message}");
        assert!(message.contains("unknown"), "{message}");
        // It did have it.
        let got = std::fs::read_to_string(dir.path().join("got")).unwrap();
        assert!(got.contains("hello there"), "{got}");
    }

    /// The CLI closed its stdin before the prompt came: the write fails, so the prompt
    /// provably never reached it — `transport_lost`, "not sent", at once (before the exit).
    #[tokio::test]
    async fn a_prompt_whose_write_fails_is_transport_lost_not_sent() {
        let (dir, spec) = fake("exec 0<&-\n: > \"$dir/closed\"\nread x < \"$dir/hold\"");
        let hold = dir.path().join("hold");
        nix::unistd::mkfifo(&hold, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let mut session = open(spec).unwrap();
        file_appears(dir.path(), "closed").await;
        session.send("hello", "run-1").await.unwrap();
        let first = tokio::time::timeout(WAIT, session.events.recv())
            .await
            .unwrap()
            .unwrap();
        let second = tokio::time::timeout(WAIT, session.events.recv())
            .await
            .unwrap()
            .unwrap();
        let end = match (&first, &second) {
            (AgentOutput::Event(EventBody::Error(_)), AgentOutput::Event(EventBody::RunEnd(e))) => {
                e.clone()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(end.state, RunState::Failed);
        assert_eq!(end.category, Some(ErrorCategory::TransportLost));
        let message = end.message.unwrap_or_default();
        assert!(message.contains("not sent"), "{message}");
        // Let it go: its exit ends nothing more (no second run.end).
        std::fs::write(&hold, "go\n").unwrap();
        let rest = all_outputs(&mut session).await;
        assert!(run_ends(&rest).is_empty(), "{rest:?}");
    }

    /// The CLI closed its stdin and exits as the prompt comes (a wrapper that fails at once):
    /// whichever the driver sees first, the write's failure or the exit, the run ends "not
    /// sent" with how the process ended and what it last said on stderr.
    #[tokio::test]
    async fn a_cli_exiting_as_the_prompt_comes_is_not_sent_with_its_last_words() {
        let (dir, spec) = fake(
            "exec 0<&-\necho 'wrapper: no credentials found' >&2\n: > \"$dir/closed\"\nread x < \"$dir/hold\"\nexit 3",
        );
        let hold = dir.path().join("hold");
        nix::unistd::mkfifo(&hold, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let mut session = open(spec).unwrap();
        file_appears(dir.path(), "closed").await;
        session.send("hello", "run-1").await.unwrap();
        std::fs::write(&hold, "go\n").unwrap();
        let outputs = all_outputs(&mut session).await;
        let ends = run_ends(&outputs);
        assert_eq!(ends.len(), 1, "{outputs:?}");
        assert_eq!(ends[0].state, RunState::Failed);
        assert_eq!(ends[0].category, Some(ErrorCategory::TransportLost));
        let message = ends[0].message.as_deref().unwrap_or_default();
        assert!(message.contains("not sent"), "{message}");
        assert!(message.contains("no credentials found"), "{message}");
    }

    /// A process gone before the prompt: the handle refuses it, saying it was not sent.
    #[tokio::test]
    async fn a_prompt_to_a_gone_process_is_refused_not_sent() {
        let (_dir, spec) = fake("exit 0");
        let mut session = open(spec).unwrap();
        let outputs = all_outputs(&mut session).await;
        assert!(run_ends(&outputs).is_empty(), "{outputs:?}");
        let err = session.send("hello", "run-1").await.unwrap_err();
        assert_eq!(err.category, ErrorCategory::TransportLost);
        assert!(err.message.contains("not sent"), "{}", err.message);
    }

    /// MCP servers reach the CLI as a 0600 file under the host home's `run/`, never in argv,
    /// and the file is gone once the process is.
    #[tokio::test]
    async fn the_mcp_config_is_a_private_file_removed_with_the_process() {
        use crate::protocol::options::{EnvVar, McpServer};
        let (dir, mut spec) = fake(
            "while [ $# -gt 0 ]; do [ \"$1\" = --mcp-config ] && f=\"$2\"; printf '%s\\n' \"$1\" >> \"$dir/args\"; shift; done\n\
             cp \"$f\" \"$dir/config\"; stat -c %a \"$f\" > \"$dir/mode\"; printf '%s' \"$f\" > \"$dir/path\"\n\
             : > \"$dir/ready\"\nread line",
        );
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        spec.home = Some(crate::adapter::reap::HomeMarker::of(&home));
        spec.options.mcp_servers = vec![McpServer::Stdio {
            name: "probe".to_owned(),
            command: "node".to_owned(),
            args: Vec::new(),
            env: vec![EnvVar {
                name: "TOKEN".to_owned(),
                value: "secret-in-env".to_owned(),
            }],
        }];
        let mut session = open(spec).unwrap();
        file_appears(dir.path(), "ready").await;
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(read("mode").trim(), "600");
        assert!(
            read("config").contains("secret-in-env"),
            "{}",
            read("config")
        );
        assert!(!read("args").contains("secret-in-env"), "{}", read("args"));
        let path = std::path::PathBuf::from(read("path"));
        assert_eq!(
            path.parent(),
            Some(std::fs::canonicalize(&home).unwrap().join("run").as_path())
        );
        assert!(path.exists());
        session.send("bye", "run-1").await.unwrap();
        all_outputs(&mut session).await;
        let closed = tokio::time::timeout(WAIT, session.events.recv()).await;
        assert!(matches!(closed, Ok(None)), "{closed:?}");
        assert!(!path.exists(), "{} is left", path.display());
    }

    /// A fake CLI that answers each `set_model` request it reads with `answer` (a
    /// `control_response` body after its request id), keeping what it read in `got`.
    fn set_model_fake(answer: &str) -> (tempfile::TempDir, OpenSpec) {
        fake(&format!(
            "while read line; do\n  printf '%s\\n' \"$line\" >> \"$dir/got\"\n  id=$(printf '%s' \"$line\" | sed 's/.*\"request_id\":\"\\([^\"]*\\)\".*/\\1/')\n  {answer}\ndone"
        ))
    }

    #[tokio::test]
    async fn set_model_is_a_control_request_answered_live_or_refused() {
        let (dir, spec) = set_model_fake(
            r#"printf '{"type":"control_response","response":{"subtype":"success","request_id":"%s"}}\n' "$id""#,
        );
        let session = open(spec).unwrap();
        assert_eq!(
            session.set_model("claude-y").await.unwrap(),
            ModelSwitch::Live
        );
        let got = std::fs::read_to_string(dir.path().join("got")).unwrap();
        let line: Value = serde_json::from_str(got.lines().next().unwrap()).unwrap();
        assert_eq!(line["type"], "control_request");
        assert_eq!(line["request"]["subtype"], "set_model");
        assert_eq!(line["request"]["model"], "claude-y");

        let (_dir, spec) = set_model_fake(
            r#"printf '{"type":"control_response","response":{"subtype":"error","request_id":"%s","error":"unknown model"}}\n' "$id""#,
        );
        let session = open(spec).unwrap();
        let err = session.set_model("nope").await.unwrap_err();
        assert_eq!(err.category, ErrorCategory::AgentFailed);
        assert!(err.message.contains("unknown model"), "{}", err.message);
    }

    /// No answer: an error within the driver's own bound, before the session's wait ends.
    #[tokio::test]
    async fn a_set_model_left_unanswered_fails_in_time() {
        let (_dir, spec) = set_model_fake(":");
        let session = open(spec).unwrap();
        let started = std::time::Instant::now();
        let err = session.set_model("claude-y").await.unwrap_err();
        assert_eq!(err.category, ErrorCategory::ResultDeliveryUnknown);
        assert!(err.message.contains("did not answer"), "{}", err.message);
        assert!(started.elapsed() < crate::session::agent::PERMISSION_ACK_WAIT);
    }

    /// An attachment the CLI cannot take (its copy gone) fails the run before anything is
    /// written: "not sent".
    #[tokio::test]
    async fn a_prompt_whose_attachment_cannot_be_read_is_not_sent() {
        let (dir, spec) = fake("cat > \"$dir/got\"");
        let mut session = open(spec).unwrap();
        let attachment = crate::protocol::options::Attachment {
            name: "gone.png".to_owned(),
            mime: "image/png".to_owned(),
            kind: crate::protocol::options::AttachmentKind::Image,
            bytes: 1,
            sha256: String::new(),
            path: dir.path().join("gone.png"),
        };
        session
            .send_with("look", "run-1", &[attachment])
            .await
            .unwrap();
        let end = loop {
            let next = tokio::time::timeout(WAIT, session.events.recv())
                .await
                .unwrap()
                .unwrap();
            if let AgentOutput::Event(EventBody::RunEnd(end)) = next {
                break end;
            }
        };
        assert_eq!(end.state, RunState::Failed);
        assert_eq!(end.category, Some(ErrorCategory::TransportLost));
        let message = end.message.unwrap_or_default();
        assert!(
            message.contains("gone.png") && message.contains("not sent"),
            "{message}"
        );
        session.close(Duration::from_secs(2)).await;
        let got = std::fs::read_to_string(dir.path().join("got")).unwrap_or_default();
        assert!(got.is_empty(), "{got}");
    }

    #[test]
    fn bypass_as_root_needs_is_sandbox() {
        let (_dir, mut spec) = fake("exit 0");
        spec.options.permission_mode = Some(crate::protocol::options::PermissionMode::Bypass);
        let root = nix::unistd::geteuid().is_root();
        assert_eq!(bypass_refused(&spec).is_some(), root);
        spec.extra_env
            .push(("IS_SANDBOX".to_owned(), "1".to_owned()));
        assert_eq!(bypass_refused(&spec), None);
        spec.options.permission_mode = None;
        spec.extra_env.clear();
        assert_eq!(bypass_refused(&spec), None);
    }
}
