//! The driver of a one-shot CLI (design §9): one process per turn, the next turn resumed by the
//! native session id, behind the generic [`AgentSession`] handle. [`open`] starts it; a family
//! says how to run one turn of its CLI by implementing [`OneShotCli`] (the Gemini CLI's
//! `gemini -o stream-json` is the first, in `gemini.rs`).
//!
//! One task owns the session's state: the native id, the turn's process (if one runs) and the
//! family's pure [`OneShotTranslator`]. Between turns no process runs: the handle starts with
//! no pid, and the driver reports each turn's process as [`AgentOutput::Pid`] — `Some` as it
//! starts (before anything it prints), `None` once it is reaped. Invariants:
//! - every turn's process goes through [`spawn::spawn`] (its own process group, parent-death
//!   signal, stderr drained to `tracing`) and is reaped before the next turn starts, so two
//!   processes never write one native session; a prompt that comes while the last turn's
//!   process is still exiting (after its `run.end`) waits for it;
//! - the native id is the one the CLI names (its first stdout frames), adopted at once, and the
//!   next turn resumes it; a turn that died before naming it starts the new session again;
//! - every turn the driver starts ends with exactly one `run.end`: from the CLI's result, or
//!   from its exit, as the family's translator reads it ([`TurnExit`]) under
//!   `session::agent`'s rule: `cancelled` after an interrupt, `transport_lost` "not sent" when
//!   the prompt could not be written to the CLI's stdin ([`TurnExit::prompt_sent`]), the
//!   family's category for what the CLI reported (a refused resume, a refusal before the turn
//!   began), else `result_delivery_unknown` (it had the prompt; nothing says what it did).
//!   A process that did not start ends the run with its spawn error. The session stays usable;
//! - an interrupt is SIGINT to the turn's group, then the spawn policy's stop (SIGTERM, grace,
//!   SIGKILL) if it is still there after [`INTERRUPT_GRACE`];
//! - events go out through a bounded channel and the task awaits room (back-pressure on the
//!   CLI's stdout, never a drop); [`AgentOutput::Exited`] comes once, when the session is
//!   closed, never between turns.
//!
//! It must not: fake a permission round trip (one-shot CLIs take their approval policy at
//! launch, so an answer is refused with an error event), fork (refused at [`open`]), or touch
//! the session layer's state.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::lines::{BoundedLines, Line};
use super::spawn::{self, SpawnSpec, Spawned, describe_exit};
use super::{AdapterError, AgentInput, AgentOutput, AgentSession, Native, OpenSpec};
use crate::protocol::events::{ErrorCategory, ErrorNotice, EventBody, RunEnd, RunState};

/// The longest stdout line read; a longer one is skipped (and counted), not fatal.
pub const MAX_LINE: usize = 32 * 1024 * 1024;
/// Events buffered between the driver and the session.
const EVENT_QUEUE: usize = 256;
/// Inputs buffered between the session and the driver.
const INPUT_QUEUE: usize = 64;
/// How long an interrupted turn's process has to exit after SIGINT before it is stopped.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How long a process whose stdout ended (after its result, or cut) has to exit by itself.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// The spawn policy's grace when the driver itself stops an overdue process.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long a driver whose session went away gives a running turn's process.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);
/// How long the rest of stdout is read once the process group is gone.
const TAIL_WAIT: Duration = Duration::from_secs(1);

/// Which native session a turn runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnSession<'a> {
    /// The first turn of a new native session. `id` is the host's choice; a CLI that names its
    /// own sessions ignores it (the id then comes from its output).
    New(&'a str),
    /// A turn of this existing native session.
    Resume(&'a str),
}

/// How one turn's process is started.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TurnCommand {
    /// Arguments after the registered command's own (`OpenSpec::args`).
    pub args: Vec<String>,
    /// Written to stdin, which is then closed (so a long prompt stays off the argv); `None`
    /// closes stdin at once.
    pub stdin: Option<String>,
}

/// How a turn's process ended, as the translator needs it to end the run.
#[derive(Debug, Clone, Copy)]
pub struct TurnExit<'a> {
    /// The exit code (`None`: killed by a signal, or not reaped).
    pub code: Option<i32>,
    /// The exit described for messages ("exit status: 1; stderr: …").
    pub status: &'a str,
    /// The host interrupted this turn.
    pub interrupted: bool,
    /// Reading stdout failed (the stream was cut, not ended).
    pub stdout_lost: bool,
    /// The prompt reached the CLI: on its argv, or written whole to its stdin (then closed).
    /// `false`: the write failed, so the CLI never had the prompt — the translator ends an
    /// open run `transport_lost` with [`AdapterError::prompt_not_sent`].
    pub prompt_sent: bool,
    /// The last stderr lines (redacted).
    pub stderr: &'a [String],
    /// The session the turn was started in.
    pub session: TurnSession<'a>,
}

/// A family's pure, stateful translator from one-shot stdout lines to canonical event bodies
/// (style 8): no I/O. One lives for the session; every turn begins with
/// [`OneShotTranslator::start_turn`].
pub trait OneShotTranslator: Send {
    /// A turn begins; `run_id` (the host's run id) makes its item ids unique.
    fn start_turn(&mut self, run_id: &str);
    /// One stdout line (without its newline). A line that is not the protocol is counted and
    /// skipped, never fatal.
    fn on_stdout_line(&mut self, line: &[u8]) -> Vec<EventBody>;
    /// The turn's process is gone: close what is open and, unless its result ended the run
    /// already, end it.
    fn on_exit(&mut self, exit: &TurnExit<'_>) -> Vec<EventBody>;
    /// The native session id the CLI last named.
    fn native_id(&self) -> Option<&str>;
    /// Lines skipped so far: not JSON, or of a type this build does not know.
    fn skipped(&self) -> u64;
}

/// What a one-shot family tells the driver.
pub trait OneShotCli: Send + Sync + 'static {
    /// A short name for logs and process labels.
    fn name(&self) -> &str;
    /// The command of one turn of `session` with `prompt`.
    fn turn(&self, session: TurnSession<'_>, prompt: &str) -> TurnCommand;
    /// A translator for a new session.
    fn translator(&self) -> Box<dyn OneShotTranslator>;
    /// Whether a [`TurnSession::New`] turn failed because the CLI has that session already (a
    /// turn died after creating it, before naming it): the driver then runs the same prompt
    /// again as a [`TurnSession::Resume`]. Only asked before the CLI printed anything.
    fn exists_already(&self, _exit: &TurnExit<'_>) -> bool {
        false
    }
}

/// Open a one-shot session: nothing runs until the first prompt. `Native::New(id)` proposes
/// `id` for the new session, `Native::Resume(id)` resumes `id` from the first turn;
/// `Native::Fork` is refused (no one-shot family forks). Must be called inside the runtime: the
/// driver is a task there, and spawns each turn's process from a runtime worker (a long-lived
/// thread, which the parent-death signal is tied to).
pub fn open<C: OneShotCli>(spec: OpenSpec, cli: C) -> Result<AgentSession, AdapterError> {
    let native = match &spec.native {
        Native::New(id) => NativeState {
            id: id.clone(),
            exists: false,
        },
        Native::Resume(id) => NativeState {
            id: id.clone(),
            exists: true,
        },
        Native::Fork(id) => {
            return Err(AdapterError::new(
                ErrorCategory::ProtocolIncompatible,
                format!(
                    "{} runs one process per turn and cannot fork a session (asked to fork \
                     {id}); resume it, or start a new session",
                    cli.name()
                ),
            ));
        }
    };
    if !spec.cwd.is_dir() {
        return Err(AdapterError::new(
            ErrorCategory::WorkspaceUnavailable,
            format!(
                "the working directory {} does not exist",
                spec.cwd.display()
            ),
        ));
    }
    if !is_executable(&spec.program) {
        return Err(AdapterError::new(
            ErrorCategory::BinaryUnavailable,
            format!("{} is not an executable file", spec.program.display()),
        ));
    }
    let (input, inputs) = mpsc::channel(INPUT_QUEUE);
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    let span = tracing::info_span!("agent", session_id = %spec.host_session_id, cli = cli.name());
    let driver = Driver {
        translator: cli.translator(),
        cli,
        spec,
        native,
        inputs,
        events: events_tx,
        turn: None,
        waiting: None,
        last_exit: None,
        last_exit_code: None,
    };
    tokio::spawn(tracing::Instrument::instrument(driver.run(), span));
    Ok(AgentSession::new(input, events, None))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The native session the next turn runs in.
#[derive(Debug)]
struct NativeState {
    id: String,
    /// The CLI has it (resumed, or named by a turn): the next turn resumes it.
    exists: bool,
}

/// A prompt waiting for the last turn's process to be gone.
struct Waiting {
    text: String,
    run_id: String,
}

/// The running turn.
struct Turn {
    run_id: String,
    prompt: String,
    /// Whether the turn was started in a new session (else resumed).
    new_session: bool,
    /// The turn was already started again as a resume (see [`OneShotCli::exists_already`]).
    retried: bool,
    child: Spawned,
    lines: BoundedLines<ChildStdout>,
    stdout_done: bool,
    stdout_lost: bool,
    /// Lines this turn's process wrote, counted to know whether it printed anything.
    lines_read: u64,
    leader: Pin<Box<dyn Future<Output = ()> + Send>>,
    leader_gone: bool,
    /// Writes the prompt to stdin, then closes it; `false` if it could not.
    writer: tokio::task::JoinHandle<bool>,
    /// The run ended (its `run.end` is out): what remains is the process exiting.
    ended: bool,
    interrupted: bool,
    /// When the process must be gone (after an interrupt, or once its stdout ended).
    deadline: Option<Instant>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

/// What happened to the running turn.
enum TurnEvent {
    Line(std::io::Result<Option<Line>>),
    LeaderGone,
    Overdue,
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The next thing the running turn's process does; never resolves without one.
async fn next_turn_event(turn: &mut Option<Turn>) -> TurnEvent {
    let Some(t) = turn else {
        return std::future::pending().await;
    };
    tokio::select! {
        line = t.lines.next_line(), if !t.stdout_done => TurnEvent::Line(line),
        () = &mut t.leader, if !t.leader_gone => TurnEvent::LeaderGone,
        () = until(t.deadline) => TurnEvent::Overdue,
    }
}

/// The session stopped taking events, or asked to close: the driver ends.
struct Gone;

struct Driver<C: OneShotCli> {
    cli: C,
    spec: OpenSpec,
    translator: Box<dyn OneShotTranslator>,
    native: NativeState,
    inputs: mpsc::Receiver<AgentInput>,
    events: mpsc::Sender<AgentOutput>,
    turn: Option<Turn>,
    waiting: Option<Waiting>,
    /// How the last turn's process ended, for the final `Exited`.
    last_exit: Option<String>,
    last_exit_code: Option<i32>,
}

impl<C: OneShotCli> Driver<C> {
    async fn run(mut self) {
        let closing = loop {
            let step = tokio::select! {
                input = self.inputs.recv() => match input {
                    Some(AgentInput::Close { grace, done }) => break Some((grace, done)),
                    Some(input) => self.on_input(input).await,
                    None => break None,
                },
                event = next_turn_event(&mut self.turn) => self.on_turn_event(event).await,
            };
            if step.is_err() {
                break None;
            }
        };
        self.shut_down(closing).await;
    }

    /// Stop what runs; answer a close, report `Exited`.
    async fn shut_down(mut self, closing: Option<(Duration, oneshot::Sender<()>)>) {
        // Nothing more is taken: a prompt sent from now on fails at once.
        self.inputs.close();
        let grace = closing.as_ref().map_or(ORPHAN_GRACE, |(grace, _)| *grace);
        if let Some(mut turn) = self.turn.take() {
            // A run still open ends as a process that went away mid-turn would (a closing
            // session discards it; a session that only dropped its inputs still sees it).
            let status = turn.child.stop(grace).await;
            if let Ok(stderr) = self.reaped(&mut turn, status).await {
                let status = self.last_exit.clone().unwrap_or_default();
                let exit = TurnExit {
                    code: self.last_exit_code,
                    status: &status,
                    interrupted: turn.interrupted,
                    stdout_lost: turn.stdout_lost,
                    prompt_sent: prompt_written(&mut turn).await,
                    stderr: &stderr,
                    session: if turn.new_session {
                        TurnSession::New(&self.native.id)
                    } else {
                        TurnSession::Resume(&self.native.id)
                    },
                };
                let events = self.translator.on_exit(&exit);
                if let Err(Gone) = emit(&self.events, events).await {
                    tracing::debug!("the session no longer takes events");
                }
            }
        }
        self.waiting = None;
        let status = self
            .last_exit
            .take()
            .unwrap_or_else(|| "closed between turns (no process was running)".to_owned());
        tracing::info!(%status, skipped = self.translator.skipped(), "one-shot session closed");
        if let Some((_, done)) = closing {
            let _caller_gone = done.send(());
        }
        // The session may be gone already (it drops its events before waiting for `done`).
        let _session_gone = self.events.send(AgentOutput::Exited { status }).await;
    }

    async fn on_input(&mut self, input: AgentInput) -> Result<(), Gone> {
        match input {
            AgentInput::Prompt { text, id, .. } => {
                let running = self.turn.as_ref().is_some_and(|t| !t.ended);
                if running || self.waiting.is_some() {
                    // The session layer queues prompts while a run is busy; one that reaches
                    // a busy driver is not run (and must not end the running one).
                    tracing::warn!(run_id = %id, "a prompt while a turn runs; not sent");
                    return emit(
                        &self.events,
                        vec![EventBody::Error(ErrorNotice {
                            category: ErrorCategory::AgentFailed,
                            message: format!(
                                "a turn is already running in this {} session; the prompt \
                                 was not sent",
                                self.cli.name()
                            ),
                        })],
                    )
                    .await;
                }
                if self.turn.is_some() {
                    // The last run is over; its process is still exiting (writing its session).
                    self.waiting = Some(Waiting { text, run_id: id });
                    return Ok(());
                }
                self.start_turn(text, id).await
            }
            AgentInput::SetModel { reply, .. } => {
                let _unwaited = reply.send(Err(AdapterError::new(
                    ErrorCategory::ProtocolIncompatible,
                    "this driver cannot change the model of a live agent",
                )));
                Ok(())
            }
            AgentInput::Interrupt => {
                if let Some(waiting) = self.waiting.take() {
                    // Its run started on the host's side, and never reached a process.
                    tracing::info!(run_id = %waiting.run_id, "interrupted before its process started");
                    return emit(&self.events, vec![EventBody::RunEnd(cancelled_end())]).await;
                }
                match self.turn.as_mut() {
                    Some(turn) if !turn.ended && !turn.interrupted => {
                        turn.interrupted = true;
                        interrupt_group(&turn.child);
                        let deadline = Instant::now() + INTERRUPT_GRACE;
                        turn.deadline = Some(turn.deadline.map_or(deadline, |d| d.min(deadline)));
                    }
                    _ => tracing::debug!("an interrupt with no turn running; ignored"),
                }
                Ok(())
            }
            AgentInput::Permission {
                request_id, ack, ..
            } => {
                // One-shot CLIs have no permission round trip: their approval policy is part
                // of the turn's command. An answer is refused, visibly, never faked.
                let error = AdapterError::new(
                    ErrorCategory::ProtocolIncompatible,
                    format!(
                        "{} runs one process per turn with its approval policy fixed at launch; \
                         it asks for no permissions, so the answer to {request_id} was not \
                         delivered",
                        self.cli.name()
                    ),
                );
                tracing::warn!(request_id, "a permission answer for a one-shot session");
                let _unwaited = ack.send(Err(error.clone()));
                emit(
                    &self.events,
                    vec![EventBody::Error(ErrorNotice {
                        category: error.category,
                        message: error.message,
                    })],
                )
                .await
            }
            AgentInput::Steer { reply, .. } => {
                // The prompt is the turn's command line: nothing reaches a running turn.
                let _unwaited = reply.send(Err(AdapterError::new(
                    ErrorCategory::ProtocolIncompatible,
                    format!(
                        "{} runs one process per turn and takes no input mid-turn",
                        self.cli.name()
                    ),
                )));
                Ok(())
            }
            AgentInput::Close { .. } => Ok(()),
        }
    }

    /// Start a turn: its process, with the prompt on stdin or argv as the family says.
    async fn start_turn(&mut self, text: String, run_id: String) -> Result<(), Gone> {
        self.translator.start_turn(&run_id);
        self.spawn_turn(text, run_id, !self.native.exists, false)
            .await
    }

    async fn spawn_turn(
        &mut self,
        text: String,
        run_id: String,
        new_session: bool,
        retried: bool,
    ) -> Result<(), Gone> {
        let session = if new_session {
            TurnSession::New(&self.native.id)
        } else {
            TurnSession::Resume(&self.native.id)
        };
        let command = self.cli.turn(session, &text);
        let spec = SpawnSpec {
            program: self.spec.program.clone(),
            args: [self.spec.args.clone(), command.args].concat(),
            cwd: self.spec.cwd.clone(),
            base_env: self.spec.base_env.clone(),
            extra_env: self.spec.extra_env.clone(),
            session_id: Some(self.spec.host_session_id.clone()),
            home: self.spec.home.clone(),
            label: format!("{}[{}]", self.cli.name(), self.spec.host_session_id),
        };
        let mut child = match spawn::spawn(&spec) {
            Ok(child) => child,
            Err(e) => {
                tracing::warn!(error = %e.message, "the turn's process did not start");
                return fail_run(&self.events, e).await;
            }
        };
        tracing::info!(pid = ?child.pid(), %run_id, new_session, "turn started");
        // The host knows its own child before anything the child says (or holds) counts.
        if self
            .events
            .send(AgentOutput::Pid(child.pid()))
            .await
            .is_err()
        {
            let _stopped = child.stop(Duration::ZERO).await;
            return Err(Gone);
        }
        let writer = tokio::spawn(write_prompt(child.stdin.take(), command.stdin));
        let Some(stdout) = child.stdout.take() else {
            let _stopped = child.stop(Duration::ZERO).await;
            let error = AdapterError::new(
                ErrorCategory::AgentFailed,
                "the turn's process has no stdout",
            );
            return fail_run(&self.events, error).await;
        };
        let leader = Box::pin(child.leader_exit());
        self.turn = Some(Turn {
            run_id,
            prompt: text,
            new_session,
            retried,
            child,
            lines: BoundedLines::new(stdout, MAX_LINE),
            stdout_done: false,
            stdout_lost: false,
            lines_read: 0,
            leader,
            leader_gone: false,
            writer,
            ended: false,
            interrupted: false,
            deadline: None,
        });
        Ok(())
    }

    async fn on_turn_event(&mut self, event: TurnEvent) -> Result<(), Gone> {
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        match event {
            TurnEvent::Line(Ok(Some(Line::Text(line)))) => {
                turn.lines_read += 1;
                let events = self.translator.on_stdout_line(line.as_bytes());
                if events.iter().any(|e| matches!(e, EventBody::RunEnd(_))) {
                    turn.ended = true;
                }
                return emit(&self.events, events).await;
            }
            TurnEvent::Line(Ok(Some(Line::TooLong))) => {
                turn.lines_read += 1;
                tracing::warn!(max = MAX_LINE, "skipped an over-long stdout line");
                return Ok(());
            }
            TurnEvent::Line(Ok(Some(Line::NotUtf8))) => {
                turn.lines_read += 1;
                tracing::debug!("skipped a stdout line that is not UTF-8");
                return Ok(());
            }
            TurnEvent::Line(Ok(None)) => {
                turn.stdout_done = true;
            }
            TurnEvent::Line(Err(e)) => {
                tracing::warn!(error = %e, "the turn's stdout broke");
                turn.stdout_done = true;
                turn.stdout_lost = true;
            }
            TurnEvent::LeaderGone => turn.leader_gone = true,
            TurnEvent::Overdue => {
                tracing::warn!(
                    interrupted = turn.interrupted,
                    "the turn's process did not exit in time; stopping its group"
                );
                let status = turn.child.stop(STOP_GRACE).await;
                return self.finish_turn(status).await;
            }
        }
        if turn.leader_gone {
            // Whatever is left of its group goes (a tool holding stdout open with it), then
            // the rest of stdout is read.
            let status = turn.child.wait().await;
            return self.finish_turn(status).await;
        }
        if turn.stdout_done && turn.deadline.is_none() {
            turn.deadline = Some(Instant::now() + EXIT_WAIT);
        }
        Ok(())
    }

    /// The turn's process is reaped: read what it left on stdout, end its run if its result
    /// did not, and go on with a prompt that waited for it.
    async fn finish_turn(
        &mut self,
        status: std::io::Result<std::process::ExitStatus>,
    ) -> Result<(), Gone> {
        let Some(mut turn) = self.turn.take() else {
            return Ok(());
        };
        let stderr = self.reaped(&mut turn, status).await?;
        let prompt_sent = prompt_written(&mut turn).await;
        let code = self.last_exit_code;
        let status_text = self.last_exit.clone().unwrap_or_default();
        let session_id = self.native.id.clone();
        let session = if turn.new_session {
            TurnSession::New(&session_id)
        } else {
            TurnSession::Resume(&session_id)
        };
        let exit = TurnExit {
            code,
            status: &status_text,
            interrupted: turn.interrupted,
            stdout_lost: turn.stdout_lost,
            prompt_sent,
            stderr: &stderr,
            session,
        };
        let retry = turn.new_session
            && !turn.retried
            && !turn.interrupted
            && turn.lines_read == 0
            && self.cli.exists_already(&exit);
        if retry {
            // The CLI has the session already (an earlier turn created it and died before
            // naming it): the same prompt, resuming it. Nothing of this attempt was published.
            tracing::info!(native = %self.native.id, "the new session exists already; resuming it");
            self.native.exists = true;
            let prompt = std::mem::take(&mut turn.prompt);
            let run_id = std::mem::take(&mut turn.run_id);
            drop(turn);
            return self.spawn_turn(prompt, run_id, false, true).await;
        }
        let events = self.translator.on_exit(&exit);
        tracing::info!(
            status = %status_text,
            ended = turn.ended,
            interrupted = turn.interrupted,
            skipped = self.translator.skipped(),
            "turn process ended"
        );
        if let Some(id) = self.translator.native_id() {
            self.native = NativeState {
                id: id.to_owned(),
                exists: true,
            };
        }
        drop(turn);
        emit(&self.events, events).await?;
        match self.waiting.take() {
            Some(next) => self.start_turn(next.text, next.run_id).await,
            None => Ok(()),
        }
    }

    /// Read the rest of a reaped turn's stdout into the translator (publishing it), note how
    /// it ended, and return its last stderr lines.
    async fn reaped(
        &mut self,
        turn: &mut Turn,
        status: std::io::Result<std::process::ExitStatus>,
    ) -> Result<Vec<String>, Gone> {
        if !turn.stdout_done {
            // The group is gone and the pipe closed (or held by a stranger, hence the bound):
            // what the CLI wrote before it died still counts.
            let translator = &mut self.translator;
            let lines = &mut turn.lines;
            let mut read = 0u64;
            let tail = tokio::time::timeout(TAIL_WAIT, async {
                let mut tail = Vec::new();
                loop {
                    match lines.next_line().await {
                        Ok(Some(Line::Text(line))) => {
                            read += 1;
                            tail.extend(translator.on_stdout_line(line.as_bytes()));
                        }
                        Ok(Some(_)) => read += 1,
                        Ok(None) => break,
                        Err(_) => break,
                    }
                }
                tail
            })
            .await;
            turn.lines_read += read;
            turn.stdout_done = true;
            let tail = tail.unwrap_or_default();
            if tail.iter().any(|e| matches!(e, EventBody::RunEnd(_))) {
                turn.ended = true;
            }
            emit(&self.events, tail).await?;
        }
        let stderr = turn.child.stderr_tail().await;
        let (code, text) = match status {
            Ok(status) => (status.code(), describe_exit(status, &stderr)),
            Err(e) => {
                tracing::warn!(error = %e, "reaping the turn's process failed");
                (None, format!("not reaped ({e})"))
            }
        };
        self.last_exit_code = code;
        self.last_exit = Some(text);
        // Between turns nothing runs.
        if self.events.send(AgentOutput::Pid(None)).await.is_err() {
            return Err(Gone);
        }
        Ok(stderr)
    }
}

/// A run that ends before a process could tell anything: `error` + `run.end` failed.
async fn fail_run(tx: &mpsc::Sender<AgentOutput>, error: AdapterError) -> Result<(), Gone> {
    emit(
        tx,
        vec![
            EventBody::Error(ErrorNotice {
                category: error.category,
                message: error.message.clone(),
            }),
            EventBody::RunEnd(RunEnd {
                state: RunState::Failed,
                category: Some(error.category),
                message: Some(error.message),
            }),
        ],
    )
    .await
}

/// Publish events in order, awaiting room (back-pressure; never a drop). A free function, so
/// the driver's future holds only the (`Sync`) sender across the await.
async fn emit(tx: &mpsc::Sender<AgentOutput>, events: Vec<EventBody>) -> Result<(), Gone> {
    for event in events {
        if tx.send(AgentOutput::Event(event)).await.is_err() {
            return Err(Gone);
        }
    }
    Ok(())
}

fn cancelled_end() -> RunEnd {
    RunEnd {
        state: RunState::Cancelled,
        category: Some(ErrorCategory::Cancelled),
        message: None,
    }
}

/// SIGINT to the turn's process group: what Ctrl-C in a terminal sends. Only while the leader
/// is unreaped (the driver reaps it itself, later), so the group id is still this turn's.
fn interrupt_group(child: &Spawned) {
    let Some(pgid) = child.pid().and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    let pgid = nix::unistd::Pid::from_raw(pgid);
    if let Err(e) = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGINT) {
        tracing::debug!(error = %e, "SIGINT to the turn's group failed; it is gone already");
    }
}

/// Write the prompt to the turn's stdin and close it (the CLI reads its input to the end);
/// `false` if it did not all go. A prompt on the argv (`text` `None`) went with the spawn.
async fn write_prompt(stdin: Option<ChildStdin>, text: Option<String>) -> bool {
    let Some(text) = text else {
        return true;
    };
    let Some(mut stdin) = stdin else {
        tracing::warn!("the turn's process has no stdin for its prompt");
        return false;
    };
    let written = async {
        stdin.write_all(text.as_bytes()).await?;
        stdin.flush().await?;
        stdin.shutdown().await
    };
    match written.await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "writing the prompt to the turn's stdin failed");
            false
        }
    }
}

/// Whether a reaped turn's prompt reached its CLI ([`TurnExit::prompt_sent`]). The writer
/// ends with the process (its pipe closes); one that does not say in time is taken to have
/// written it: uncertain is never "not sent".
async fn prompt_written(turn: &mut Turn) -> bool {
    match tokio::time::timeout(TAIL_WAIT, &mut turn.writer).await {
        Ok(Ok(written)) => written,
        Ok(Err(_)) | Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use super::*;
    use crate::adapter::gemini::{ApprovalMode, GeminiCli};
    use crate::adapter::spawn::tests::running_in_group;

    /// Every wait in these tests.
    const WAIT: Duration = Duration::from_secs(20);

    /// A stand-in for `gemini -o stream-json`: one turn per run. It records its argv, pid and
    /// stdin (the prompt), names the session it was given (or one of its own for a new one)
    /// and answers by the prompt: `WAIT` waits for a reader of a fifo nobody writes (SIGINT
    /// interrupts the `wait` and ends it with exit 0 and no result, as the real CLI does), `DIE` is killed mid-turn, anything else
    /// is echoed with a result. Ids `dup` (exists already) and `nope` (unknown) are refused
    /// as the CLI refuses them.
    const FAKE: &str = r#"#!/bin/sh
dir="$(dirname "$0")"
n=$(($(ls "$dir" | grep -c '^argv\.') + 1))
printf '%s\n' "$@" > "$dir/argv.$n"
echo $$ > "$dir/pid.$n"
prompt=$(cat)
printf '%s' "$prompt" > "$dir/prompt.$n"
mode=none; id=""
while [ $# -gt 0 ]; do
  case "$1" in
    --session-id) mode=new; id=$2; shift;;
    --resume) mode=resume; id=$2; shift;;
  esac
  shift
done
if [ "$id" = dup ] && [ $mode = new ]; then
  echo "Error starting session: Session ID \"dup\" already exists. Use --resume to resume it, or provide a different ID." >&2
  exit 42
fi
if [ "$id" = nope ]; then
  echo "Error resuming session: Invalid session identifier \"nope\"." >&2
  exit 42
fi
[ $mode = new ] && [ "$id" != dup ] && id=cli-chosen-id
echo 'Loaded cached credentials.'
printf '{"type":"init","session_id":"%s","model":"auto"}\n' "$id"
printf '{"type":"message","role":"user","content":"%s"}\n' "$prompt"
case "$prompt" in
  WAIT*)
    trap 'echo SIGINT > "$dir/signal.$n"; exit 0' INT
    [ -p "$dir/hold" ] || mkfifo "$dir/hold"
    cat "$dir/hold" &
    printf '{"type":"message","role":"assistant","content":"waiting","delta":true}\n'
    wait
    exit 0;;
  DIE*)
    printf '{"type":"message","role":"assistant","content":"dying","delta":true}\n'
    kill -9 $$;;
esac
printf '{"type":"message","role":"assistant","content":"echo: %s","delta":true}\n' "$prompt"
printf '{"type":"result","status":"success","stats":{"models":{"m":{"input_tokens":3,"output_tokens":2,"cached":1}}}}\n'
"#;

    struct Fake {
        dir: tempfile::TempDir,
    }

    impl Fake {
        fn new() -> Fake {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gemini");
            std::fs::write(&path, FAKE).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            Fake { dir }
        }

        fn spec(&self, native: Native) -> OpenSpec {
            OpenSpec {
                program: self.dir.path().join("gemini"),
                args: Vec::new(),
                cwd: self.dir.path().to_owned(),
                base_env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
                extra_env: Vec::new(),
                host_session_id: "host-1".to_owned(),
                home: None,
                native,
                options: Default::default(),
            }
        }

        fn open(&self, native: Native) -> AgentSession {
            open(self.spec(native), GeminiCli::new(ApprovalMode::Yolo)).unwrap()
        }

        /// The argv of turn process `n` (from 1), one argument a line.
        fn argv(&self, n: usize) -> Vec<String> {
            self.read(&format!("argv.{n}"))
                .lines()
                .map(str::to_owned)
                .collect()
        }

        fn read(&self, name: &str) -> String {
            std::fs::read_to_string(self.path(name)).unwrap()
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
    }

    async fn next_output(session: &mut AgentSession) -> AgentOutput {
        tokio::time::timeout(WAIT, session.events.recv())
            .await
            .expect("no output in time")
            .expect("the driver ended")
    }

    /// Outputs until (and with) the first event of kind `kind`.
    async fn outputs_until(session: &mut AgentSession, kind: &str) -> Vec<AgentOutput> {
        let mut seen = Vec::new();
        loop {
            let output = tokio::time::timeout(WAIT, session.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no {kind} in time; saw {seen:?}"))
                .expect("the driver ended");
            let done = matches!(&output, AgentOutput::Event(e) if e.kind() == kind);
            if let AgentOutput::Exited { status } = &output {
                panic!("exited ({status}); saw {seen:?}");
            }
            seen.push(output);
            if done {
                return seen;
            }
        }
    }

    /// Events until (and with) the first of kind `kind` (process reports left out).
    async fn until(session: &mut AgentSession, kind: &str) -> Vec<EventBody> {
        outputs_until(session, kind)
            .await
            .into_iter()
            .filter_map(|o| match o {
                AgentOutput::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    fn run_end(events: &[EventBody]) -> &RunEnd {
        match events.last() {
            Some(EventBody::RunEnd(end)) => end,
            other => panic!("not a run.end: {other:?}"),
        }
    }

    fn kinds(events: &[EventBody]) -> Vec<&'static str> {
        events
            .iter()
            .map(EventBody::kind)
            .filter(|k| *k != "text.delta")
            .collect()
    }

    fn has_pair(argv: &[String], flag: &str, value: &str) -> bool {
        argv.windows(2).any(|w| w[0] == flag && w[1] == value)
    }

    /// Waits (bounded) until nothing of group `pgid` runs; SIGKILL is delivered
    /// asynchronously, so the last ones may take a moment after the leader is reaped.
    async fn group_ends(pgid: i32) {
        let left = crate::adapter::reap::exited(&running_in_group(pgid), WAIT).await;
        assert!(
            left.is_empty(),
            "the turn's group outlived its session: {left:?}"
        );
        let left = running_in_group(pgid);
        assert!(
            left.is_empty(),
            "the turn's group outlived its session: {left:?}"
        );
    }

    #[tokio::test]
    async fn a_new_session_takes_the_cli_id_and_the_next_turn_resumes_it() {
        let fake = Fake::new();
        let mut session = fake.open(Native::New("host-proposed".to_owned()));
        // No process runs between turns.
        assert_eq!(session.pid(), None);
        session.send("hello", "run-1").await.unwrap();
        let outputs = outputs_until(&mut session, "run.end").await;
        // The turn's process is reported before anything it says, and gone after its end.
        let pgid = fake.read("pid.1").trim().parse::<u32>().unwrap();
        assert_eq!(outputs[0], AgentOutput::Pid(Some(pgid)));
        assert_eq!(next_output(&mut session).await, AgentOutput::Pid(None));
        let first: Vec<EventBody> = outputs
            .into_iter()
            .filter_map(|o| match o {
                AgentOutput::Event(e) => Some(e),
                _ => None,
            })
            .collect();
        assert_eq!(
            kinds(&first),
            [
                "session.bound",
                "text.start",
                "text.end",
                "usage",
                "run.end"
            ]
        );
        assert_eq!(
            first[0],
            EventBody::SessionBound(crate::protocol::events::SessionBound {
                native_session_id: "cli-chosen-id".to_owned()
            })
        );
        assert_eq!(run_end(&first).state, RunState::Completed);
        assert!(has_pair(&fake.argv(1), "--session-id", "host-proposed"));
        assert!(has_pair(&fake.argv(1), "--approval-mode", "yolo"));
        // The prompt went to stdin, not to the argv.
        assert_eq!(fake.read("prompt.1"), "hello");
        assert!(!fake.argv(1).iter().any(|a| a == "hello"));

        session.send("again", "run-2").await.unwrap();
        let second = until(&mut session, "run.end").await;
        // Same native id: not bound again.
        assert_eq!(
            kinds(&second),
            ["text.start", "text.end", "usage", "run.end"]
        );
        assert!(has_pair(&fake.argv(2), "--resume", "cli-chosen-id"));
        assert_eq!(session.pid(), None);
        session.close(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_resumed_session_resumes_from_the_first_turn_and_fork_is_refused() {
        let fake = Fake::new();
        let mut session = fake.open(Native::Resume("old-id".to_owned()));
        session.send("hi", "run-1").await.unwrap();
        let events = until(&mut session, "run.end").await;
        assert_eq!(kinds(&events)[0], "session.bound");
        assert!(has_pair(&fake.argv(1), "--resume", "old-id"));
        session.close(Duration::from_secs(1)).await;

        let err = open(
            fake.spec(Native::Fork("old-id".to_owned())),
            GeminiCli::default(),
        )
        .unwrap_err();
        assert_eq!(err.category, ErrorCategory::ProtocolIncompatible);
        assert!(err.message.contains("cannot fork"), "{}", err.message);
    }

    #[tokio::test]
    async fn an_interrupted_turn_is_cancelled_and_the_next_turn_resumes() {
        let fake = Fake::new();
        let mut session = fake.open(Native::New("n1".to_owned()));
        session.send("WAIT here", "run-1").await.unwrap();
        until(&mut session, "text.delta").await;
        // Another prompt while the turn runs is refused, and does not end the running turn.
        session.send("too early", "run-x").await.unwrap();
        let refused = until(&mut session, "error").await;
        assert_eq!(kinds(&refused), ["error"]);
        session.cancel_turn().await.unwrap();
        let cancelled = until(&mut session, "run.end").await;
        assert_eq!(kinds(&cancelled), ["text.end", "run.end"]);
        let end = run_end(&cancelled);
        assert_eq!(end.state, RunState::Cancelled);
        assert_eq!(end.category, Some(ErrorCategory::Cancelled));
        // It was the SIGINT that ended it (not the stop after the interrupt grace).
        assert_eq!(fake.read("signal.1").trim(), "SIGINT");

        session.send("after", "run-2").await.unwrap();
        let next = until(&mut session, "run.end").await;
        assert_eq!(run_end(&next).state, RunState::Completed);
        // The refused prompt started no process: the fake's second run is this turn.
        assert!(has_pair(&fake.argv(2), "--resume", "cli-chosen-id"));
        assert_eq!(fake.read("prompt.2"), "after");
        session.close(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_turn_that_dies_fails_and_the_session_goes_on() {
        let fake = Fake::new();
        let mut session = fake.open(Native::New("n1".to_owned()));
        session.send("DIE now", "run-1").await.unwrap();
        let died = until(&mut session, "run.end").await;
        assert_eq!(
            kinds(&died),
            [
                "session.bound",
                "text.start",
                "text.end",
                "error",
                "run.end"
            ]
        );
        // It had the prompt and died mid-turn: whether it acted is unknown.
        let end = run_end(&died);
        assert_eq!(end.state, RunState::Failed);
        assert_eq!(end.category, Some(ErrorCategory::ResultDeliveryUnknown));
        assert!(
            end.message
                .as_deref()
                .unwrap_or_default()
                .contains("signal"),
            "{end:?}"
        );
        session.send("hello", "run-2").await.unwrap();
        let next = until(&mut session, "run.end").await;
        assert_eq!(run_end(&next).state, RunState::Completed);
        assert!(has_pair(&fake.argv(2), "--resume", "cli-chosen-id"));
        session.close(Duration::from_secs(1)).await;
    }

    /// A CLI that exits without reading its stdin: the prompt (larger than a pipe holds) could
    /// not be written, so it never had it — `transport_lost`, "not sent", and the session goes
    /// on.
    #[tokio::test]
    async fn a_prompt_that_could_not_be_written_is_transport_lost_not_sent() {
        let fake = Fake::new();
        let real = std::fs::read_to_string(fake.path("gemini")).unwrap();
        std::fs::write(fake.path("gemini"), "#!/bin/sh\nexit 1\n").unwrap();
        let mut session = fake.open(Native::New("n1".to_owned()));
        session.send(&"x".repeat(1 << 20), "run-1").await.unwrap();
        let events = until(&mut session, "run.end").await;
        assert_eq!(kinds(&events), ["error", "run.end"]);
        let end = run_end(&events);
        assert_eq!(end.state, RunState::Failed);
        assert_eq!(end.category, Some(ErrorCategory::TransportLost));
        let message = end.message.as_deref().unwrap_or_default();
        assert!(message.contains("not sent"), "{message}");
        std::fs::write(fake.path("gemini"), real).unwrap();
        session.send("hello", "run-2").await.unwrap();
        let next = until(&mut session, "run.end").await;
        assert_eq!(run_end(&next).state, RunState::Completed);
        session.close(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_refused_resume_is_resume_rejected() {
        let fake = Fake::new();
        let mut session = fake.open(Native::Resume("nope".to_owned()));
        session.send("hi", "run-1").await.unwrap();
        let events = until(&mut session, "run.end").await;
        assert_eq!(kinds(&events), ["error", "run.end"]);
        assert_eq!(
            run_end(&events).category,
            Some(ErrorCategory::ResumeRejected)
        );
        session.close(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_new_session_the_cli_has_already_is_resumed_within_the_turn() {
        let fake = Fake::new();
        let mut session = fake.open(Native::New("dup".to_owned()));
        session.send("hi", "run-1").await.unwrap();
        let events = until(&mut session, "run.end").await;
        assert_eq!(
            kinds(&events),
            [
                "session.bound",
                "text.start",
                "text.end",
                "usage",
                "run.end"
            ]
        );
        assert!(has_pair(&fake.argv(1), "--session-id", "dup"));
        assert!(has_pair(&fake.argv(2), "--resume", "dup"));
        assert_eq!(fake.read("prompt.2"), "hi");
        session.close(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_permission_answer_is_refused_not_faked() {
        let fake = Fake::new();
        let mut session = fake.open(Native::New("n1".to_owned()));
        let refused = session
            .respond_permission("p1", true, &serde_json::Value::Null, None)
            .await
            .unwrap_err();
        assert_eq!(refused.category, ErrorCategory::ProtocolIncompatible);
        let events = until(&mut session, "error").await;
        match &events[..] {
            [EventBody::Error(e)] => {
                assert_eq!(e.category, ErrorCategory::ProtocolIncompatible);
                assert!(e.message.contains("p1"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
        // Nothing ran.
        assert!(!fake.path("argv.1").exists());
        session.close(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn close_mid_turn_reaps_the_process_group() {
        let fake = Fake::new();
        let mut session = fake.open(Native::New("n1".to_owned()));
        session.send("WAIT forever", "run-1").await.unwrap();
        until(&mut session, "text.delta").await;
        let pgid: i32 = fake.read("pid.1").trim().parse().unwrap();
        assert!(!running_in_group(pgid).is_empty());
        tokio::time::timeout(WAIT, session.close(Duration::from_millis(400)))
            .await
            .expect("close did not return");
        group_ends(pgid).await;
    }

    #[tokio::test]
    async fn a_dropped_session_ends_its_driver_and_the_turn() {
        let fake = Fake::new();
        let mut session = fake.open(Native::New("n1".to_owned()));
        session.send("WAIT forever", "run-1").await.unwrap();
        until(&mut session, "text.delta").await;
        let pgid: i32 = fake.read("pid.1").trim().parse().unwrap();
        drop(session);
        // The driver stops the group within its orphan grace.
        group_ends(pgid).await;
    }
}
