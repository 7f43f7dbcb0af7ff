//! The driver of one `codex app-server` process (design §9), behind the generic
//! [`AgentSession`] handle: [`open`] starts it.
//!
//! One task owns the process through the [`RpcClient`]: it shakes hands (`initialize`,
//! `initialized`), opens the thread (`thread/start`, or `thread/resume` — a fresh app-server
//! must load a thread before `turn/start`), then serves the session: a prompt is a
//! `turn/start`, a cancel a `turn/interrupt` (held until `turn/started` names the turn), a
//! steer a `turn/steer` into the running turn (written without waiting: its answer, its
//! timeout [`STEER_TIMEOUT`] or the turn's end answers the session, taken or not), a
//! permission answer goes back to the approval request it answers. Everything the app-server
//! sends goes through the pure [`Translator`]. While it waits for an answer the task keeps
//! taking what the app-server sends (buffered, then handled in order), so a full queue can
//! never stall the answer it waits for.
//!
//! `thread/resume` and `thread/fork` pass the session's cwd and options as `thread/start` does
//! (model, developer instructions, MCP servers, approval policy and sandbox:
//! `codex::thread_options`): a thread runs where and as its session does, whatever it
//! recorded. A `session.set_model` is Codex's per-turn override: every `turn/start` after it
//! names the model. Image attachments go with the prompt as `localImage` inputs.
//!
//! Some tool calls never become items (a command the sandbox denies as it starts, a patch
//! that fails verification): only the rollout records them. The driver keeps reading the
//! thread's rollout file where it left off, at each `turn/completed` of the thread and before
//! translating it (Codex flushes the rollout before it ends a turn), and feeds the new lines
//! to the translator, which brackets those calls as tools (`codex.rs`). A read is bounded
//! ([`ROLLOUT_READ_LIMIT`]); a rollout that cannot be read costs only those brackets.
//!
//! A turn the app-server does not end follows `session::agent`'s rule: a `turn/start` that was
//! never written (`NotSent`), or a prompt still queued when the process went, ends the run
//! `transport_lost` "not sent" at once; a `turn/start` written (answered or not) whose
//! `turn/completed` never came ends it `result_delivery_unknown` — at the exit, or at once
//! when `turn/start` goes unanswered for [`CALL_TIMEOUT`].
//!
//! Opening failures are reported on the first prompt: a thread Codex cannot find
//! (`no rollout found`, `thread not found`) ends that run `resume_rejected` (the session then
//! starts a fresh thread, visibly); a thread another process writes (`active writer`) is
//! forked instead (design §8: never fight for the lock), with a `warning`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::codex::{self, Translator};
use super::jsonrpc::{Dialect, Incoming, RpcError, ServerRequest};
use super::rpc_driver::{self, Closing, Gone, Io, Opening, open_or_close};
use super::spawn::{Spawned, describe_exit};
use super::{AdapterError, AgentInput, AgentOutput, AgentSession, Native, OpenSpec};
use crate::protocol::events::{ErrorCategory, EventBody, Notice};
use crate::protocol::options::{Attachment, SessionOptions};
use crate::session::agent::ModelSwitch;
/// How long the handshake and opening a thread may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `turn/start` and `turn/interrupt` may take to be answered.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `turn/steer` may take to be answered: shorter than the session's own wait, so
/// the session always hears this driver's answer (an accept that comes late is never taken
/// for a refusal there).
const STEER_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(STEER_TIMEOUT.as_secs() < crate::session::agent::STEER_WAIT.as_secs());
/// The most of the rollout one turn's end reads; the rest waits for the next turn's end.
const ROLLOUT_READ_LIMIT: u64 = 16 << 20;

/// Start `codex app-server`. Must run on a runtime worker thread (the parent-death signal is
/// tied to the thread that spawns).
pub fn open(spec: OpenSpec) -> Result<AgentSession, AdapterError> {
    let args = [spec.args.clone(), vec!["app-server".to_owned()]].concat();
    let label = format!("codex[{}]", spec.host_session_id);
    let started = rpc_driver::start(&spec, args, label, Dialect::Bare)?;
    let driver = Driver {
        io: started.io,
        translator: Translator::new(),
        approvals: HashMap::new(),
        steering: None,
        interrupt_pending: false,
        prompt_sent: false,
        started_turn: None,
        open_error: None,
        cwd: spec.cwd.display().to_string(),
        options: spec.options.clone(),
        model: None,
        rollout: None,
    };
    let pid = started.session.pid();
    let span = tracing::info_span!("agent", session_id = %spec.host_session_id, pid);
    tokio::spawn(tracing::Instrument::instrument(
        driver.run(started.child, started.inputs, spec.native),
        span,
    ));
    Ok(started.session)
}

/// Why the thread could not be opened; reported on the next prompt.
struct OpenError {
    category: ErrorCategory,
    message: String,
}

/// Where the driver is in the thread's rollout file: what it has fed the translator.
struct RolloutTail {
    path: PathBuf,
    offset: u64,
    /// The last read stopped inside a line longer than a whole read: the rest of that line
    /// is skipped.
    in_long_line: bool,
}

impl RolloutTail {
    /// From the file's current end: what the thread recorded before it opened here is the
    /// stream's past, not this process's turns.
    async fn at_end(path: PathBuf) -> RolloutTail {
        let offset = tokio::fs::metadata(&path).await.map_or(0, |m| m.len());
        RolloutTail {
            path,
            offset,
            in_long_line: false,
        }
    }

    /// The complete lines written since the last read (at most [`ROLLOUT_READ_LIMIT`] bytes
    /// of them). A missing or unreadable file has none.
    async fn new_lines(&mut self) -> Vec<String> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let Ok(mut file) = tokio::fs::File::open(&self.path).await else {
            return Vec::new();
        };
        let len = file.metadata().await.map_or(0, |m| m.len());
        if len < self.offset {
            // Replaced or cut: nothing of it is this turn's.
            self.offset = len;
            return Vec::new();
        }
        if file
            .seek(std::io::SeekFrom::Start(self.offset))
            .await
            .is_err()
        {
            return Vec::new();
        }
        let mut buf = Vec::new();
        if let Err(e) = file.take(ROLLOUT_READ_LIMIT).read_to_end(&mut buf).await {
            tracing::info!(error = %e, path = %self.path.display(), "reading the rollout failed");
            return Vec::new();
        }
        let Some(last) = buf.iter().rposition(|b| *b == b'\n') else {
            if buf.len() as u64 == ROLLOUT_READ_LIMIT {
                self.offset += ROLLOUT_READ_LIMIT;
                self.in_long_line = true;
            }
            return Vec::new();
        };
        self.offset += last as u64 + 1;
        let mut lines = buf[..last].split(|b| *b == b'\n');
        if std::mem::take(&mut self.in_long_line) {
            lines.next();
        }
        lines
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect()
    }
}

/// A `turn/steer` written and not answered yet: the session's reply waits for its answer,
/// while the driver goes on with everything else.
struct Steering {
    id: u64,
    answer: oneshot::Receiver<Result<Value, RpcError>>,
    reply: oneshot::Sender<Result<(), AdapterError>>,
    deadline: tokio::time::Instant,
}

impl Steering {
    /// The answer, or the timeout's (cancel-safe).
    async fn wait(&mut self) -> Result<Value, RpcError> {
        match tokio::time::timeout_at(self.deadline, &mut self.answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(RpcError::NoAnswer {
                method: "turn/steer".to_owned(),
            }),
            Err(_) => Err(RpcError::Timeout {
                method: "turn/steer".to_owned(),
                after: STEER_TIMEOUT,
            }),
        }
    }

    /// The answer if it came already.
    fn answered(&mut self) -> Option<Result<Value, RpcError>> {
        match self.answer.try_recv() {
            Ok(answer) => Some(answer),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(RpcError::NoAnswer {
                method: "turn/steer".to_owned(),
            })),
        }
    }
}

async fn next_steer_answer(steering: Option<&mut Steering>) -> Result<Value, RpcError> {
    match steering {
        Some(steering) => steering.wait().await,
        None => std::future::pending().await,
    }
}

/// The session's answer for a `turn/steer`'s.
fn steer_taken(answer: Result<Value, RpcError>) -> Result<(), AdapterError> {
    match answer {
        Ok(_) => Ok(()),
        Err(RpcError::NotSent { .. }) => Err(AdapterError::new(
            ErrorCategory::TransportLost,
            "turn/steer could not be written: the app-server's stdin is closed; the steer was \
             not sent",
        )),
        Err(e @ RpcError::Remote { .. }) => Err(AdapterError::new(
            ErrorCategory::AgentFailed,
            format!("the app-server refused the steer: {}", e.detail()),
        )),
        Err(e) => Err(AdapterError::new(
            ErrorCategory::ResultDeliveryUnknown,
            format!("turn/steer went unanswered ({e}): whether the turn took it is unknown"),
        )),
    }
}

struct Driver {
    io: Io,
    translator: Translator,
    /// Approval requests waiting for the session's answer, by permission id.
    approvals: HashMap<String, ServerRequest>,
    /// The `turn/steer` waiting for its answer.
    steering: Option<Steering>,
    /// A cancel came before the turn had an id.
    interrupt_pending: bool,
    /// The open turn's `turn/start` was written and no `run.end` ended the turn yet (the
    /// translator is in a turn only from `turn/started` on).
    prompt_sent: bool,
    /// The open turn's id as the `turn/start` answer gave it (`turn/started` may come after
    /// the answer): what a steer names before the translator knows the turn.
    started_turn: Option<String>,
    open_error: Option<OpenError>,
    /// The session's cwd, which every `thread/*` request names.
    cwd: String,
    /// The session's options, which every `thread/*` request carries (`codex::thread_options`).
    options: SessionOptions,
    /// The model a `session.set_model` chose, which every `turn/start` from then on carries.
    model: Option<String>,
    rollout: Option<RolloutTail>,
}

impl Driver {
    async fn run(
        mut self,
        mut child: Spawned,
        mut inputs: mpsc::Receiver<AgentInput>,
        native: Native,
    ) {
        let mut closing: Option<Closing> = None;
        // A dead app-server whose stdout a child of it still holds never sends EOF: its
        // exit is watched too.
        let leader = child.leader_exit();
        tokio::pin!(leader);
        // Opening may take long (a slow or hung app-server): a close is honoured meanwhile,
        // and what else the session sends (its first prompt) waits for the thread.
        let mut session_gone = match open_or_close(self.open(&native), &mut inputs).await {
            Opening::Opened(opened, early) => {
                let mut gone = opened.is_err();
                for input in early {
                    if gone || self.on_input(input).await.is_err() {
                        gone = true;
                    }
                }
                gone
            }
            Opening::Closed(close) => {
                closing = Some(close);
                false
            }
            Opening::Gone => true,
        };
        let mut stdout_open = true;
        while !session_gone && closing.is_none() {
            if let Err(Gone) = self.drain_backlog().await {
                session_gone = true;
                break;
            }
            tokio::select! {
                input = inputs.recv() => match input {
                    Some(AgentInput::Close { grace, done }) => {
                        closing = Some((grace, done));
                        break;
                    }
                    Some(input) => {
                        if let Err(Gone) = self.on_input(input).await {
                            session_gone = true;
                        }
                    }
                    None => session_gone = true,
                },
                msg = self.io.incoming.recv() => match msg {
                    Some(msg) => {
                        if let Err(Gone) = self.on_incoming(msg).await {
                            session_gone = true;
                        }
                    }
                    None => {
                        stdout_open = false;
                        break;
                    }
                },
                answer = next_steer_answer(self.steering.as_mut()) => {
                    self.steer_answered(answer);
                }
                () = &mut leader => {
                    stdout_open = false;
                    break;
                }
            }
        }
        // A steer still unanswered as the process goes: it was written, so nobody knows.
        self.steer_ends("the app-server went before it answered turn/steer");
        let (closing, unsent) =
            rpc_driver::closing(&mut inputs, closing, session_gone, stdout_open);
        // Unanswered approvals are refused as the process goes; then stdin closes (the
        // app-server exits cleanly on EOF) with the last handle to the client.
        self.approvals.clear();
        let Driver {
            io,
            mut translator,
            mut prompt_sent,
            ..
        } = self;
        let Io {
            rpc,
            mut incoming,
            events,
            ..
        } = io;
        let status = match closing {
            Some(closing) => {
                drop(incoming);
                rpc_driver::stop(&mut child, rpc, closing).await
            }
            None => {
                drop(rpc);
                // The leader is gone; the group is killed as it is reaped, which closes the
                // pipe. What the app-server wrote before it died still counts.
                let status = child.wait().await;
                let drained = tokio::time::timeout(Duration::from_secs(1), async {
                    let mut last = Vec::new();
                    while let Some(msg) = incoming.recv().await {
                        if let Incoming::Notification { method, params } = msg {
                            last.extend(translator.on_notification(&method, &params));
                        }
                    }
                    last
                })
                .await
                .unwrap_or_default();
                for event in drained {
                    if matches!(event, EventBody::RunEnd(_)) {
                        prompt_sent = false;
                    }
                    if events.send(AgentOutput::Event(event)).await.is_err() {
                        return;
                    }
                }
                status
            }
        };
        let status = status.unwrap_or_default();
        let stderr = child.stderr_tail().await;
        let exit = describe_exit(status, &stderr);
        let in_turn = translator.in_turn() || prompt_sent;
        tracing::info!(%status, in_turn, skipped = translator.skipped(), "app-server ended");
        if session_gone {
            return;
        }
        let mut last = translator.on_exit(in_turn, &exit);
        if unsent {
            last.extend(rpc_driver::unsent_prompt(&exit));
        }
        for event in last {
            if events.send(AgentOutput::Event(event)).await.is_err() {
                return;
            }
        }
        let _session_gone = events.send(AgentOutput::Exited { status: exit }).await;
    }

    async fn emit(&mut self, events: Vec<EventBody>) -> Result<(), Gone> {
        if events.iter().any(|e| matches!(e, EventBody::RunEnd(_))) {
            self.prompt_sent = false;
            self.started_turn = None;
            // Answered before the session sees the turn end.
            self.steer_ends("the turn ended before the app-server answered turn/steer");
        }
        self.io.emit(events).await
    }

    /// The pending steer's answer came (or its time ran out): the session hears it.
    fn steer_answered(&mut self, answer: Result<Value, RpcError>) {
        let Some(steering) = self.steering.take() else {
            return;
        };
        if matches!(answer, Err(RpcError::Timeout { .. })) {
            self.io.rpc.forget(steering.id);
        }
        let taken = steer_taken(answer);
        if let Err(e) = &taken {
            tracing::info!(error = %e, "turn/steer failed");
        }
        let _unwaited = steering.reply.send(taken);
    }

    /// The turn or the process ends with a steer pending: its answer if it came already (the
    /// reader fills it before it passes on what came after it), else unknown.
    fn steer_ends(&mut self, why: &str) {
        let Some(mut steering) = self.steering.take() else {
            return;
        };
        let answer = steering.answered().unwrap_or_else(|| {
            self.io.rpc.forget(steering.id);
            Err(RpcError::NoAnswer {
                method: format!("turn/steer ({why})"),
            })
        });
        self.steering = Some(steering);
        self.steer_answered(answer);
    }

    /// A request whose answer is awaited while everything the app-server sends is kept.
    async fn call(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, RpcError> {
        self.io.call(method, params, timeout, |_| true).await
    }

    async fn drain_backlog(&mut self) -> Result<(), Gone> {
        while let Some(msg) = self.io.backlog.pop_front() {
            self.on_incoming(msg).await?;
        }
        Ok(())
    }

    /// Handshake and thread. Failures are kept for the first prompt.
    async fn open(&mut self, native: &Native) -> Result<(), Gone> {
        let cwd = self.cwd.clone();
        if let Err(e) = self
            .call("initialize", codex::initialize_params(), OPEN_TIMEOUT)
            .await
        {
            self.open_error = Some(OpenError {
                category: ErrorCategory::AgentFailed,
                message: format!("the app-server did not start: {e}"),
            });
            return Ok(());
        }
        self.io.rpc.notify("initialized", json!({})).await;
        let opened = match native {
            Native::New(_) => {
                self.call(
                    "thread/start",
                    codex::thread_start_params(&cwd, &self.options),
                    OPEN_TIMEOUT,
                )
                .await
            }
            Native::Resume(id) => {
                let resumed = self
                    .call(
                        "thread/resume",
                        codex::thread_resume_params(id, &cwd, &self.options),
                        OPEN_TIMEOUT,
                    )
                    .await;
                match resumed {
                    Err(e) if e.remote_message().is_some_and(codex::is_foreign_writer) => {
                        let why = format!(
                            "thread {id} is being written by another process ({})",
                            e.remote_message().unwrap_or_default()
                        );
                        self.fork(id, Some(why)).await
                    }
                    other => other,
                }
            }
            // The session decided to fork (and says why itself).
            Native::Fork(id) => self.fork(id, None).await,
        };
        match opened {
            Ok(result) => {
                let events = self.translator.on_result(&result);
                if let Some(path) = self.translator.rollout_path() {
                    self.rollout = Some(RolloutTail::at_end(path.to_owned()).await);
                }
                self.emit(events).await
            }
            Err(e) => {
                let rejected = matches!(native, Native::Resume(_) | Native::Fork(_))
                    && e.remote_message().is_some_and(codex::is_missing_thread);
                self.open_error = Some(OpenError {
                    category: if rejected {
                        ErrorCategory::ResumeRejected
                    } else {
                        ErrorCategory::AgentFailed
                    },
                    message: e.detail(),
                });
                Ok(())
            }
        }
    }

    /// Continue in a fork of the thread; `why`, when the driver decided it, is published.
    async fn fork(&mut self, id: &str, why: Option<String>) -> Result<Value, RpcError> {
        let params = codex::thread_fork_params(id, &self.cwd, &self.options);
        let forked = self.call("thread/fork", params, OPEN_TIMEOUT).await?;
        let new_id = forked
            .pointer("/thread/id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        tracing::info!(thread = id, fork = new_id, "forked the thread");
        if let Some(why) = why {
            let notice = EventBody::Warning(Notice {
                code: "forked".to_owned(),
                message: format!("{why}; this session continues in a fork of it, {new_id}"),
            });
            // The session learns the new id from `session.bound` right after.
            let _gone = self.emit(vec![notice]).await;
        }
        Ok(forked)
    }

    async fn on_input(&mut self, input: AgentInput) -> Result<(), Gone> {
        match input {
            AgentInput::Prompt {
                text, attachments, ..
            } => self.start_turn(&text, &attachments).await,
            AgentInput::Permission {
                request_id,
                allow,
                option,
                ack,
                ..
            } => {
                let acked = match self.approvals.remove(&request_id) {
                    Some(request) => {
                        let answer = codex::approval_answer(
                            &request.method,
                            &request.params,
                            allow,
                            option.as_ref(),
                        );
                        let always = codex::answer_keeps_for_session(&answer);
                        request.respond(answer);
                        Ok(super::Honoured { always })
                    }
                    None => {
                        tracing::info!(request_id, "an answer to no pending approval");
                        Err(AdapterError::new(
                            ErrorCategory::AgentFailed,
                            format!("Codex has no approval {request_id:?} pending"),
                        ))
                    }
                };
                let _unwaited = ack.send(acked);
                Ok(())
            }
            AgentInput::SetModel { model, reply } => {
                // Codex's per-turn override: the next `turn/start` carries it (a running turn
                // keeps its model).
                self.model = Some(model);
                let _unwaited = reply.send(Ok(ModelSwitch::NextTurn));
                Ok(())
            }
            AgentInput::Interrupt => {
                match self.translator.turn_id().map(str::to_owned) {
                    Some(turn) => self.interrupt(&turn).await,
                    None => self.interrupt_pending = true,
                }
                Ok(())
            }
            AgentInput::Steer { text, reply, .. } => {
                self.steer(&text, reply).await;
                Ok(())
            }
            AgentInput::Close { .. } => Ok(()),
        }
    }

    /// `turn/steer` into the running turn, written and left to its answer (`steering`): the
    /// session is told whether the app-server took it when the answer comes, when
    /// [`STEER_TIMEOUT`] passes, or when the turn ends first. A steer whose caller stopped
    /// waiting is dropped unsent.
    async fn steer(&mut self, text: &str, reply: oneshot::Sender<Result<(), AdapterError>>) {
        if reply.is_closed() {
            tracing::info!("a steer nobody waits for any more, not sent");
            return;
        }
        if self.steering.is_some() {
            let _unwaited = reply.send(Err(AdapterError::new(
                ErrorCategory::AgentFailed,
                "another steer is waiting for the app-server's answer; this one was not sent",
            )));
            return;
        }
        let thread = self.translator.thread_id().map(str::to_owned);
        let turn = match self.translator.turn_id() {
            Some(turn) => Some(turn.to_owned()),
            None if self.prompt_sent => self.started_turn.clone(),
            None => None,
        };
        let (Some(thread), Some(turn)) = (thread, turn) else {
            let _unwaited = reply.send(Err(AdapterError::new(
                ErrorCategory::AgentFailed,
                "no turn is running to steer",
            )));
            return;
        };
        let params = codex::turn_steer_params(&thread, &turn, text);
        match self.io.rpc.start_request("turn/steer", params).await {
            Ok((id, answer)) => {
                self.steering = Some(Steering {
                    id,
                    answer,
                    reply,
                    deadline: tokio::time::Instant::now() + STEER_TIMEOUT,
                });
            }
            Err(e) => {
                let _unwaited = reply.send(steer_taken(Err(e)));
            }
        }
    }

    async fn start_turn(&mut self, text: &str, attachments: &[Attachment]) -> Result<(), Gone> {
        if let Some(error) = self.open_error.take() {
            return self.fail_turn(error.category, error.message).await;
        }
        let Some(thread) = self.translator.thread_id().map(str::to_owned) else {
            return self
                .fail_turn(ErrorCategory::AgentFailed, "no thread is open".to_owned())
                .await;
        };
        self.interrupt_pending = false;
        let started = self
            .call(
                "turn/start",
                codex::turn_start_params(&thread, text, self.model.as_deref(), attachments),
                CALL_TIMEOUT,
            )
            .await;
        match started {
            Ok(answer) => {
                // What came meanwhile waits in the backlog: its `run.end` clears this.
                self.prompt_sent = true;
                self.started_turn = answer
                    .pointer("/turn/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                Ok(())
            }
            Err(RpcError::NoAnswer { .. }) => {
                // Written, and the process is going: its exit ends the run, outcome unknown.
                self.prompt_sent = true;
                Ok(())
            }
            Err(RpcError::NotSent { .. }) => {
                let why = "turn/start could not be written: the app-server's stdin is closed";
                self.emit(AdapterError::prompt_not_sent(why).run_failed())
                    .await
            }
            Err(RpcError::Timeout { after, .. }) => {
                let why = format!(
                    "the app-server did not answer turn/start within {} s",
                    after.as_secs()
                );
                self.emit(AdapterError::result_unknown(why).run_failed())
                    .await
            }
            Err(e @ RpcError::Remote { .. }) => {
                let message = e.detail();
                self.fail_turn(ErrorCategory::AgentFailed, message).await
            }
        }
    }

    async fn fail_turn(&mut self, category: ErrorCategory, message: String) -> Result<(), Gone> {
        self.io.fail_turn(category, message).await
    }

    async fn interrupt(&mut self, turn: &str) {
        let Some(thread) = self.translator.thread_id().map(str::to_owned) else {
            return;
        };
        self.interrupt_pending = false;
        if let Err(e) = self
            .call(
                "turn/interrupt",
                json!({"threadId": thread, "turnId": turn}),
                CALL_TIMEOUT,
            )
            .await
        {
            // The turn may have ended meanwhile; the session's cancel deadline covers the rest.
            tracing::info!(error = %e, "turn/interrupt failed");
        }
    }

    /// What the rollout gained, through the translator (tool calls no item announced).
    async fn feed_rollout(&mut self) -> Result<(), Gone> {
        let Some(tail) = self.rollout.as_mut() else {
            return Ok(());
        };
        let lines = tail.new_lines().await;
        let events: Vec<EventBody> = lines
            .iter()
            .flat_map(|line| self.translator.on_rollout_line(line))
            .collect();
        self.emit(events).await
    }

    async fn on_incoming(&mut self, msg: Incoming) -> Result<(), Gone> {
        match msg {
            Incoming::Notification { method, params } => {
                if self.translator.ends_turn(&method, &params) {
                    self.feed_rollout().await?;
                }
                let events = self.translator.on_notification(&method, &params);
                self.emit(events).await?;
                if method == "turn/started"
                    && self.interrupt_pending
                    && let Some(turn) = self.translator.turn_id().map(str::to_owned)
                {
                    self.interrupt(&turn).await;
                }
                Ok(())
            }
            Incoming::Request(request) => {
                let events = self.translator.on_server_request(
                    &request.id,
                    &request.method,
                    &request.params,
                );
                let asks = events.iter().find_map(|e| match e {
                    EventBody::PermissionRequest(p) => Some(p.request_id.clone()),
                    _ => None,
                });
                match asks {
                    Some(id) => {
                        self.approvals.insert(id, request);
                    }
                    None if codex::APPROVALS.contains(&request.method.as_str()) => {
                        // Another thread's approval, not ours to grant, or an MCP server's
                        // form, which no client is shown: declined.
                        let answer =
                            codex::approval_answer(&request.method, &request.params, false, None);
                        request.respond(answer);
                    }
                    // Anything else is refused (method not found) as it drops.
                    None => drop(request),
                }
                self.emit(events).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rpc_driver::test_support::{
        ID, all_outputs, fake, file_appears, release, run_ends, until_run_end,
    };
    use super::*;
    use crate::protocol::events::RunState;

    /// A stand-in for `codex app-server`: it answers the handshake and `thread/start`; then, by
    /// `mode`: `deaf` closes its stdin and waits to be released; `die` records `turn/start`
    /// and is killed before answering it; `answer-then-die` answers it first (no
    /// `turn/started`, no `turn/completed`).
    fn app_server(mode: &str) -> (tempfile::TempDir, OpenSpec) {
        let body = format!(
            r#"while read line; do
  {ID}
  case "$line" in
    *'"method":"initialize"'*) printf '{{"id":%s,"result":{{}}}}\n' "$id";;
    *'"method":"thread/start"'*)
      printf '{{"id":%s,"result":{{"thread":{{"id":"t1"}}}}}}\n' "$id"
      if [ "$mode" = deaf ]; then exec 0<&-; : > "$dir/closed"; read x < "$dir/hold"; exit 0; fi;;
    *'"method":"turn/start"'*)
      printf '%s' "$line" > "$dir/got"
      if [ "$mode" = answer-then-die ]; then printf '{{"id":%s,"result":{{"turn":{{"id":"u1"}}}}}}\n' "$id"; fi
      kill -9 $$;;
  esac
done"#
        );
        fake(&body, mode)
    }

    /// `turn/start` written, then the app-server killed before any answer (or after only the
    /// answer to `turn/start`): the run's outcome is unknown.
    #[tokio::test]
    async fn a_turn_start_sent_then_the_app_server_dies_is_result_delivery_unknown() {
        for mode in ["die", "answer-then-die"] {
            let (dir, spec) = app_server(mode);
            let mut session = open(spec).unwrap();
            session.send("hello there", "run-1").await.unwrap();
            let outputs = all_outputs(&mut session).await;
            let ends = run_ends(&outputs);
            assert_eq!(ends.len(), 1, "{mode}: {outputs:?}");
            assert_eq!(ends[0].state, RunState::Failed, "{mode}");
            assert_eq!(
                ends[0].category,
                Some(ErrorCategory::ResultDeliveryUnknown),
                "{mode}: {outputs:?}"
            );
            let got = std::fs::read_to_string(dir.path().join("got")).unwrap();
            assert!(got.contains("hello there"), "{got}");
        }
    }

    /// A stand-in that answers the handshake, `thread/start` and `turn/start` (turn `u1`, no
    /// `turn/started` yet), records `turn/steer` in `$dir/steer` and answers it, or, in mode
    /// `refuse`, refuses it as the app-server does when the turn is not the active one.
    fn steerable(mode: &str) -> (tempfile::TempDir, OpenSpec) {
        let body = format!(
            r#"while read line; do
  {ID}
  case "$line" in
    *'"method":"initialize"'*) printf '{{"id":%s,"result":{{}}}}\n' "$id";;
    *'"method":"thread/start"'*) printf '{{"id":%s,"result":{{"thread":{{"id":"t1"}}}}}}\n' "$id";;
    *'"method":"turn/start"'*) printf '{{"id":%s,"result":{{"turn":{{"id":"u1"}}}}}}\n' "$id";;
    *'"method":"turn/steer"'*)
      printf '%s' "$line" > "$dir/steer"
      if [ "$mode" = refuse ]; then
        printf '{{"id":%s,"error":{{"code":-32600,"message":"expected active turn id u1 but found none"}}}}\n' "$id"
      else
        printf '{{"id":%s,"result":{{"turnId":"u1"}}}}\n' "$id"
      fi;;
  esac
done"#
        );
        fake(&body, mode)
    }

    /// A steer goes to the running turn as `turn/steer`, named by the id the `turn/start`
    /// answer gave (before any `turn/started`); the app-server's answer is the session's.
    /// With no turn running it is refused without a request.
    #[tokio::test]
    async fn a_steer_is_turn_steer_into_the_running_turn() {
        for mode in ["take", "refuse"] {
            let (dir, spec) = steerable(mode);
            let session = open(spec).unwrap();
            let early = session.steer("too early", "run-0").await.unwrap_err();
            assert!(early.message.contains("no turn"), "{early:?}");
            session.send("hello", "run-1").await.unwrap();
            let taken = session.steer("go left", "run-1").await;
            let got: Value =
                serde_json::from_str(&std::fs::read_to_string(dir.path().join("steer")).unwrap())
                    .unwrap();
            assert_eq!(
                got["params"],
                json!({"threadId": "t1", "expectedTurnId": "u1",
                       "input": [{"type": "text", "text": "go left", "text_elements": []}]})
            );
            match mode {
                "take" => taken.unwrap(),
                _ => {
                    let e = taken.unwrap_err();
                    assert_eq!(e.category, ErrorCategory::AgentFailed, "{e:?}");
                    assert!(e.message.contains("expected active turn"), "{e:?}");
                }
            }
            session.close(Duration::ZERO).await;
        }
    }

    /// The app-server closed its stdin before the prompt: `turn/start` is never written, so
    /// the run ends `transport_lost`, "not sent", before the process exits.
    #[tokio::test]
    async fn a_turn_start_that_cannot_be_written_is_transport_lost_not_sent() {
        let (dir, spec) = app_server("deaf");
        let mut session = open(spec).unwrap();
        file_appears(dir.path(), "closed").await;
        session.send("hello", "run-1").await.unwrap();
        let (_, end) = until_run_end(&mut session).await;
        assert_eq!(end.state, RunState::Failed);
        assert_eq!(end.category, Some(ErrorCategory::TransportLost));
        let message = end.message.unwrap_or_default();
        assert!(message.contains("not sent"), "{message}");
        release(dir.path());
        let rest = all_outputs(&mut session).await;
        assert!(run_ends(&rest).is_empty(), "a second end: {rest:?}");
    }
}
