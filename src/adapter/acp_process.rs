//! The driver of one ACP agent process (design §9), behind the generic [`AgentSession`]
//! handle: [`open`] starts it.
//!
//! One task owns the process through the [`RpcClient`] (JSON-RPC 2.0): `initialize` (no
//! file-system or terminal capabilities: the host serves neither), then the session by what
//! the agent declared:
//! - new: `session/new`;
//! - resume: `session/resume` if offered (no replay), else `session/load` (its replay is not
//!   published: the translator takes updates only inside a turn, and the driver lets the replay
//!   settle before the first prompt), else the run ends `resume_rejected` and the session goes
//!   on fresh, visibly;
//! - fork: `session/fork` if offered, else a new session with a `warning` that the earlier
//!   turns are not in it.
//!
//! The session's options go on every one of those requests (`acp::SessionSetup`: `mcpServers`
//! of the transports the agent declared, the standing prompt in the agent's own carrier), and
//! after each answer the driver chooses among what the answer offers (`acp::SessionChoices`):
//! the model (`session/set_config_option` on the `model` select, else `session/set_model`) and
//! the permission mode (`session/set_mode`). An option the agent did not take fails every
//! prompt with the reason (a model: naming the models it offers), never silently dropped;
//! `session.set_model` is the same request, live. A prompt's attachments follow its text as
//! ACP content (`acp::attachment_block`).
//!
//! `session/prompt` stays open for the whole turn, so it runs as its own task and its answer
//! comes back to this loop; everything the agent sent before the answer is handled first. A
//! cancel is the `session/cancel` notification, and pending permission requests are answered
//! `cancelled` as the spec requires. A permission answer picks among the options the agent
//! offered ([`acp::permission_answer`]). Requests the host does not serve (`fs/*`,
//! `terminal/*`, extensions) are refused with "method not found".
//!
//! A turn without its answer follows `session::agent`'s rule: a `session/prompt` that was
//! never written (`NotSent`), or a prompt still queued when the process went, ends the run
//! `transport_lost` "not sent"; one written whose answer never came (`NoAnswer`, the turn
//! timeout, the process gone) ends it `result_delivery_unknown`. A prompt answer still on its
//! way when the process goes is awaited (briefly) after the reap, so an answer that came, or
//! a request that never went out, still says so.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::acp::{self, AgentCaps, SessionChoices, SessionSetup, Translator};
use super::jsonrpc::{self, Dialect, Incoming, RpcClient, RpcError, ServerRequest};
use super::rpc_driver::{self, Closing, Gone, Io, Opening, open_or_close};
use super::spawn::{SpawnSpec, Spawned, StderrTail, describe_exit, spawn};
use super::{AdapterError, AgentInput, AgentOutput, AgentSession, ModelSwitch, Native, OpenSpec};
use crate::protocol::events::{ErrorCategory, EventBody, Notice};
use crate::protocol::options::{Attachment, SessionOptions};

/// How long the handshake and opening a session may take (some agents take seconds).
const OPEN_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a `session.set_model` between turns waits for the agent's answer: below the
/// session's own wait (2 s), so the session hears why, and the input loop is never held long.
const SET_MODEL_WAIT: Duration = Duration::from_millis(1500);
/// The longest a turn may run.
const TURN_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// After `session/load`: the replay is over once nothing came for this long (bounded).
const REPLAY_QUIET: Duration = Duration::from_millis(300);
const REPLAY_MAX: Duration = Duration::from_secs(5);

/// Start the agent. Must run on a runtime worker thread (the parent-death signal is tied to
/// the thread that spawns).
pub fn open(spec: OpenSpec) -> Result<AgentSession, AdapterError> {
    let label = format!("acp[{}]", spec.host_session_id);
    let started = rpc_driver::start(&spec, spec.args.clone(), label, Dialect::JsonRpc2)?;
    let driver = Driver {
        io: started.io,
        translator: Translator::new(),
        caps: AgentCaps::default(),
        options: spec.options.clone(),
        setup: SessionSetup::default(),
        choices: SessionChoices::default(),
        permissions: HashMap::new(),
        prompt: None,
        open_error: None,
        refused: None,
        model_refused: None,
        stderr: started.child.stderr(),
    };
    let pid = started.session.pid();
    let cwd = spec.cwd.display().to_string();
    let span = tracing::info_span!("agent", session_id = %spec.host_session_id, pid);
    tokio::spawn(tracing::Instrument::instrument(
        driver.run(started.child, started.inputs, spec.native, cwd),
        span,
    ));
    Ok(started.session)
}

/// Why the session could not be opened; reported on the next prompt.
#[derive(Debug, Clone)]
struct OpenError {
    category: ErrorCategory,
    message: String,
}

/// A permission request waiting for the session's answer.
struct Pending {
    request: ServerRequest,
    options: Value,
}

struct Driver {
    io: Io,
    translator: Translator,
    caps: AgentCaps,
    /// The session's options (the model as last set).
    options: SessionOptions,
    /// What the options put on every session request.
    setup: SessionSetup,
    /// What the last session answer offered (models, modes).
    choices: SessionChoices,
    permissions: HashMap<String, Pending>,
    /// The answer of the running `session/prompt`.
    prompt: Option<oneshot::Receiver<Result<Value, RpcError>>>,
    open_error: Option<OpenError>,
    /// An option the agent did not take (an MCP transport, the standing prompt, the permission
    /// mode): every prompt fails with it, as the session would not run as configured.
    refused: Option<OpenError>,
    /// The model the agent did not take: every prompt fails with it until a model it takes
    /// is set (`session.set_model`).
    model_refused: Option<OpenError>,
    /// What the agent wrote to stderr so far (redacted), for failure reports.
    stderr: StderrTail,
}

/// A failure message with the agent's last stderr lines (where a CLI says why it failed).
fn with_stderr(message: String, stderr: &[String]) -> String {
    let lines: Vec<&str> = stderr
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return message;
    }
    let last = &lines[lines.len().saturating_sub(3)..];
    format!("{message}; stderr: {}", last.join(" | "))
}

/// How long a driver whose process is gone waits for the prompt answer still on its way.
const LATE_ANSWER: Duration = Duration::from_secs(1);

/// The events that end a turn by its `session/prompt` answer; `None` when the request was
/// written and no answer will come (`NoAnswer`: the process is going, its exit ends the run,
/// [`Translator::on_exit`]).
fn answer_events(
    translator: &mut Translator,
    answer: Result<Value, RpcError>,
) -> Option<Vec<EventBody>> {
    let error = match answer {
        Ok(result) => return Some(translator.on_prompt_result(&result)),
        Err(RpcError::NoAnswer { .. }) => return None,
        Err(RpcError::NotSent { .. }) => AdapterError::prompt_not_sent(
            "session/prompt could not be written: the agent's stdin is closed",
        ),
        Err(RpcError::Timeout { after, .. }) => AdapterError::result_unknown(format!(
            "the agent did not answer session/prompt within {} s",
            after.as_secs()
        )),
        Err(e @ RpcError::Remote { .. }) => {
            let message = e.detail();
            let category = match &e {
                RpcError::Remote { code: -32000, .. } => ErrorCategory::AuthRequired,
                // Agents over Claude's SDK name the kind of failure in the error's data.
                RpcError::Remote { data, .. } => match data["errorKind"].as_str() {
                    Some("rate_limit") => ErrorCategory::RateLimited,
                    Some("authentication_failed") => ErrorCategory::AuthRequired,
                    _ => super::categories::refine(ErrorCategory::AgentFailed, &message),
                },
                _ => ErrorCategory::AgentFailed,
            };
            AdapterError::new(category, message)
        }
    };
    Some(translator.on_prompt_error(error.category, error.message))
}

async fn prompt_answer(
    prompt: &mut Option<oneshot::Receiver<Result<Value, RpcError>>>,
) -> Result<Value, RpcError> {
    match prompt {
        Some(answer) => answer.await.unwrap_or(Err(RpcError::NoAnswer {
            method: "session/prompt".to_owned(),
        })),
        None => std::future::pending().await,
    }
}

impl Driver {
    async fn run(
        mut self,
        mut child: Spawned,
        mut inputs: mpsc::Receiver<AgentInput>,
        native: Native,
        cwd: String,
    ) {
        let mut closing: Option<Closing> = None;
        let leader = child.leader_exit();
        tokio::pin!(leader);
        // Opening may take long (a slow or hung agent): a close is honoured meanwhile, and
        // what else the session sends (its first prompt) waits for the session to be open.
        let mut session_gone = match open_or_close(self.open(&native, &cwd), &mut inputs).await {
            Opening::Opened(opened, early) => {
                let mut gone = opened.is_err();
                for input in early {
                    if gone || self.on_input(input, &cwd).await.is_err() {
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
                        if let Err(Gone) = self.on_input(input, &cwd).await {
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
                answer = prompt_answer(&mut self.prompt) => {
                    self.prompt = None;
                    if let Err(Gone) = self.on_prompt_answer(answer).await {
                        session_gone = true;
                    }
                }
                () = &mut leader => {
                    stdout_open = false;
                    break;
                }
            }
        }
        let (closing, unsent) =
            rpc_driver::closing(&mut inputs, closing, session_gone, stdout_open);
        // Unanswered permission requests are refused as the process goes.
        self.permissions.clear();
        let Driver {
            io,
            mut translator,
            prompt,
            ..
        } = self;
        let Io {
            rpc,
            incoming,
            events,
            ..
        } = io;
        let status = match closing {
            Some(closing) => {
                drop(incoming);
                rpc_driver::stop(&mut child, rpc, closing).await
            }
            None => {
                drop((rpc, incoming));
                child.wait().await
            }
        };
        let status = status.unwrap_or_default();
        let stderr = child.stderr_tail().await;
        let exit = describe_exit(status, &stderr);
        tracing::info!(
            %status,
            in_turn = translator.in_turn(),
            skipped = translator.skipped(),
            unknown = translator.unknown(),
            "agent ended"
        );
        if session_gone {
            return;
        }
        // The prompt's answer, if it was still on its way: with the process reaped, the
        // client has answered it (or says it was never written) within moments.
        let answered = match prompt {
            Some(answer) => tokio::time::timeout(LATE_ANSWER, answer)
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|answer| answer_events(&mut translator, answer)),
            None => None,
        };
        let mut last = answered.unwrap_or_default();
        last.extend(translator.on_exit(&exit));
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

    async fn emit(&self, events: Vec<EventBody>) -> Result<(), Gone> {
        self.io.emit(events).await
    }

    /// A call while opening. Updates outside a turn (a `session/load` replay, however long)
    /// would be dropped by the translator anyway: they are not kept, so the backlog stays
    /// small.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.call_within(method, params, OPEN_TIMEOUT).await
    }

    /// [`Self::call`] with its own bound.
    async fn call_within(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, RpcError> {
        let in_turn = self.translator.in_turn();
        self.io
            .call(method, params, timeout, |msg| {
                in_turn || !matches!(msg, Incoming::Notification { .. })
            })
            .await
    }

    async fn drain_backlog(&mut self) -> Result<(), Gone> {
        while let Some(msg) = self.io.backlog.pop_front() {
            self.on_incoming(msg).await?;
        }
        Ok(())
    }

    fn failed(&mut self, category: ErrorCategory, message: String) {
        self.open_error = Some(OpenError { category, message });
    }

    /// Handshake and session. Failures are kept for the first prompt.
    async fn open(&mut self, native: &Native, cwd: &str) -> Result<(), Gone> {
        let init = match self.call("initialize", acp::initialize_params()).await {
            Ok(init) => init,
            Err(e) => {
                self.failed(
                    ErrorCategory::AgentFailed,
                    format!("the agent did not start: {e}"),
                );
                return Ok(());
            }
        };
        let version = init.get("protocolVersion").and_then(Value::as_u64);
        if version != Some(acp::PROTOCOL_VERSION) {
            self.failed(
                ErrorCategory::ProtocolIncompatible,
                format!("the agent speaks ACP version {version:?}, this host version 1"),
            );
            return Ok(());
        }
        self.caps = AgentCaps::from_initialize(&init);
        tracing::info!(caps = ?self.caps, "ACP agent initialized");
        match SessionSetup::of(&self.options, &self.caps) {
            Ok(setup) => self.setup = setup,
            Err(message) => {
                self.refuse(message);
                return Ok(());
            }
        }
        match native {
            Native::New(_) => self.new_session(cwd, None).await,
            Native::Resume(id) => self.resume(id, cwd).await,
            Native::Fork(id) => {
                if self.caps.fork {
                    let forked = self
                        .call(
                            "session/fork",
                            acp::session_params(Some(id), cwd, &self.setup),
                        )
                        .await;
                    match forked {
                        Ok(result) => self.opened(&result, None).await,
                        Err(e) => {
                            self.failed(
                                ErrorCategory::ResumeRejected,
                                format!("the agent could not fork session {id}: {e}"),
                            );
                            Ok(())
                        }
                    }
                } else {
                    let why = format!(
                        "this agent cannot fork sessions; the conversation continues in a new \
                         agent session that does not have the turns of {id}"
                    );
                    self.new_session(cwd, Some(why)).await
                }
            }
        }
    }

    async fn new_session(&mut self, cwd: &str, warning: Option<String>) -> Result<(), Gone> {
        match self
            .call("session/new", acp::session_params(None, cwd, &self.setup))
            .await
        {
            Ok(result) => {
                if let Some(message) = warning {
                    self.emit(vec![EventBody::Warning(Notice {
                        code: "fork_unsupported".to_owned(),
                        message,
                    })])
                    .await?;
                }
                self.opened(&result, None).await
            }
            Err(e) => {
                let category = match &e {
                    RpcError::Remote { code: -32000, .. } => ErrorCategory::AuthRequired,
                    _ => ErrorCategory::AgentFailed,
                };
                let message = e.detail();
                self.failed(category, format!("session/new failed: {message}"));
                Ok(())
            }
        }
    }

    /// A session answer: bind the session it names, then apply the options it offers choices
    /// for ([`Driver::configure`]).
    async fn opened(&mut self, result: &Value, expected: Option<&str>) -> Result<(), Gone> {
        self.bind_from(result, expected).await?;
        if self.translator.session_id().is_some() {
            self.configure(result).await;
        }
        Ok(())
    }

    /// Every prompt fails with `message` from now on: the agent did not take an option.
    fn refuse(&mut self, message: String) {
        tracing::info!(%message, "the agent did not take a session option");
        self.refused = Some(OpenError {
            category: ErrorCategory::ProtocolIncompatible,
            message,
        });
    }

    /// After every open (a resumed agent starts on its own defaults again): the model, then the
    /// permission mode, by what the session answer offers.
    async fn configure(&mut self, result: &Value) {
        self.choices = SessionChoices::of(result);
        let Some(session) = self.translator.session_id().map(str::to_owned) else {
            return;
        };
        if let Some(model) = self.options.model.clone()
            && let Err(message) = self.apply_model(&session, &model, OPEN_TIMEOUT).await
        {
            tracing::info!(%message, "the agent did not take the model");
            self.model_refused = Some(OpenError {
                category: ErrorCategory::ProtocolIncompatible,
                message,
            });
        }
        let Some(mode) = self.options.permission_mode else {
            return;
        };
        match acp::mode_request(&session, &self.choices, mode) {
            Ok(None) => {}
            Ok(Some((method, params))) => match self.call(method, params).await {
                Ok(answer) => {
                    self.choices.update(&answer);
                    if let Some(choice) = self.choices.mode.as_mut() {
                        choice.current = Some(acp::mode_id(mode).to_owned());
                    }
                }
                Err(e) => self.refuse(format!(
                    "the agent did not take the permission mode {:?}: {}",
                    mode.as_str(),
                    e.detail()
                )),
            },
            Err(message) => self.refuse(message),
        }
    }

    /// Ask the agent to use `model` ([`acp::model_request`]); `Err`: why not, naming the
    /// models it offers.
    async fn apply_model(
        &mut self,
        session: &str,
        model: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let (method, params) = acp::model_request(session, &self.choices, model)
            .map_err(|why| acp::model_refused(model, &self.choices, &why))?;
        match self.call_within(method, params, timeout).await {
            Ok(answer) => {
                self.choices.update(&answer);
                if method == "session/set_model"
                    && let Some(choice) = self.choices.model.as_mut()
                {
                    choice.current = Some(model.to_owned());
                }
                tracing::info!(model, current = ?self.choices.model.as_ref().and_then(|c| c.current.as_deref()), "model set");
                Ok(())
            }
            Err(e) => Err(acp::model_refused(model, &self.choices, &e.detail())),
        }
    }

    /// Bind the session an answer names (`expected`: the one asked for, when the answer may
    /// name another — an agent that silently started a new session on resume).
    async fn bind_from(&mut self, result: &Value, expected: Option<&str>) -> Result<(), Gone> {
        let named = result.get("sessionId").and_then(Value::as_str);
        let id = match (named, expected) {
            (Some(named), Some(expected)) if named != expected => {
                self.emit(vec![EventBody::Warning(Notice {
                    code: "resume_rejected".to_owned(),
                    message: format!(
                        "the agent answered the resume of {expected} with another session, \
                         {named}: the earlier turns may be missing"
                    ),
                })])
                .await?;
                named
            }
            (Some(named), _) => named,
            (None, Some(expected)) => expected,
            (None, None) => {
                self.failed(
                    ErrorCategory::ProtocolIncompatible,
                    "the agent opened a session without naming it".to_owned(),
                );
                return Ok(());
            }
        };
        let events = self.translator.bind(id);
        self.emit(events).await
    }

    async fn resume(&mut self, id: &str, cwd: &str) -> Result<(), Gone> {
        let method = if self.caps.resume {
            "session/resume"
        } else if self.caps.load {
            "session/load"
        } else {
            self.failed(
                ErrorCategory::ResumeRejected,
                "this agent can neither resume nor load a session".to_owned(),
            );
            return Ok(());
        };
        let mut method = method;
        let mut answer = self
            .call(method, acp::session_params(Some(id), cwd, &self.setup))
            .await;
        // An agent may declare `resume` and not serve it (Qwen Code 0.15.10 answers "Method not
        // found"): then `session/load`, if it declared that.
        if method == "session/resume"
            && self.caps.load
            && matches!(&answer, Err(RpcError::Remote { code, .. }) if *code == jsonrpc::METHOD_NOT_FOUND)
        {
            tracing::info!("session/resume is not served; loading the session instead");
            self.caps.resume = false;
            method = "session/load";
            answer = self
                .call(method, acp::session_params(Some(id), cwd, &self.setup))
                .await;
        }
        match answer {
            Ok(result) => {
                if method == "session/load" {
                    self.settle_replay().await;
                }
                let result = if result.is_object() {
                    result
                } else {
                    json!({})
                };
                self.opened(&result, Some(id)).await
            }
            Err(e) => {
                let message = e.detail();
                let category = if e.remote_message().is_some() {
                    // Any refusal of a resume means the agent cannot continue it here.
                    ErrorCategory::ResumeRejected
                } else {
                    ErrorCategory::AgentFailed
                };
                tracing::info!(method, %message, missing = acp::is_missing_session(&message), "resume refused");
                self.failed(category, format!("{method} of {id} failed: {message}"));
                Ok(())
            }
        }
    }

    /// Some agents go on replaying after the `session/load` answer: take (and drop, as the
    /// translator is not in a turn) what comes until it is quiet.
    async fn settle_replay(&mut self) {
        let deadline = tokio::time::Instant::now() + REPLAY_MAX;
        loop {
            let quiet = tokio::time::Instant::now() + REPLAY_QUIET;
            let next = tokio::time::timeout_at(quiet.min(deadline), self.io.incoming.recv()).await;
            match next {
                Ok(Some(msg @ Incoming::Request(_))) => self.io.backlog.push_back(msg),
                // Replay (the translator is not in a turn): dropped.
                Ok(Some(Incoming::Notification { .. })) => {}
                Ok(None) | Err(_) => return,
            }
        }
    }

    async fn on_input(&mut self, input: AgentInput, _cwd: &str) -> Result<(), Gone> {
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
                let acked = match self.permissions.remove(&request_id) {
                    Some(pending) => {
                        let answer =
                            acp::permission_answer(&pending.options, allow, option.as_ref());
                        let always = acp::answer_keeps(&pending.options, &answer);
                        pending.request.respond(answer);
                        Ok(super::Honoured { always })
                    }
                    None => {
                        tracing::info!(request_id, "an answer to no pending permission");
                        Err(AdapterError::new(
                            ErrorCategory::AgentFailed,
                            format!("the agent has no permission request {request_id:?} pending"),
                        ))
                    }
                };
                let _unwaited = ack.send(acked);
                Ok(())
            }
            AgentInput::SetModel { model, reply } => {
                let switched = match self.translator.session_id().map(str::to_owned) {
                    None => Err(AdapterError::new(
                        ErrorCategory::AgentFailed,
                        "no session is open to change the model of",
                    )),
                    Some(session) => match self.apply_model(&session, &model, SET_MODEL_WAIT).await
                    {
                        Ok(()) => {
                            self.options.model = Some(model);
                            self.model_refused = None;
                            Ok(ModelSwitch::Live)
                        }
                        Err(message) => Err(AdapterError::new(
                            ErrorCategory::ProtocolIncompatible,
                            message,
                        )),
                    },
                };
                let _unwaited = reply.send(switched);
                Ok(())
            }
            AgentInput::Interrupt => {
                if let Some(session) = self.translator.session_id().map(str::to_owned)
                    && self.prompt.is_some()
                {
                    // Not awaited here: the driver must keep reading what the agent streams
                    // meanwhile, or a full queue would stall both sides.
                    let rpc = self.io.rpc.clone();
                    tokio::spawn(async move {
                        rpc.notify("session/cancel", json!({"sessionId": session}))
                            .await;
                    });
                    for (_, pending) in self.permissions.drain() {
                        pending.request.respond(acp::cancelled_answer());
                    }
                }
                Ok(())
            }
            AgentInput::Steer { reply, .. } => {
                // The family does not steer (`families/acp.rs` says why): refused, never sent.
                let _unwaited = reply.send(Err(AdapterError::new(
                    ErrorCategory::ProtocolIncompatible,
                    "ACP has no input into a running prompt",
                )));
                Ok(())
            }
            AgentInput::Close { .. } => Ok(()),
        }
    }

    async fn start_turn(&mut self, text: &str, attachments: &[Attachment]) -> Result<(), Gone> {
        if let Some(error) = self.open_error.take() {
            let message = with_stderr(error.message, &self.stderr.lines());
            return self.fail_turn(error.category, message).await;
        }
        if let Some(error) = self.refused.clone().or_else(|| self.model_refused.clone()) {
            return self.fail_turn(error.category, error.message).await;
        }
        let Some(session) = self.translator.session_id().map(str::to_owned) else {
            return self
                .fail_turn(ErrorCategory::AgentFailed, "no session is open".to_owned())
                .await;
        };
        if self.prompt.is_some() {
            return self
                .fail_turn(
                    ErrorCategory::AgentFailed,
                    "a turn is already running".to_owned(),
                )
                .await;
        }
        let mut blocks = Vec::with_capacity(attachments.len());
        for attachment in attachments {
            let bytes = match tokio::fs::read(&attachment.path).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    return self
                        .fail_turn(
                            ErrorCategory::AgentFailed,
                            format!("the attachment {} could not be read: {e}", attachment.name),
                        )
                        .await;
                }
            };
            match acp::attachment_block(attachment, bytes, &self.caps) {
                Ok(block) => blocks.push(block),
                Err(message) => {
                    return self
                        .fail_turn(ErrorCategory::ProtocolIncompatible, message)
                        .await;
                }
            }
        }
        // Whatever the agent sent before this prompt (a load's replay) is not this turn's.
        self.drain_backlog().await?;
        self.translator.start_turn();
        let (tx, rx) = oneshot::channel();
        let rpc = self.io.rpc.clone();
        let params = acp::prompt_params(&session, text, blocks);
        tokio::spawn(async move {
            let answer = rpc.request("session/prompt", params, TURN_TIMEOUT).await;
            let _driver_gone = tx.send(answer);
        });
        self.prompt = Some(rx);
        Ok(())
    }

    /// The turn's answer: first everything the agent sent before it, then the end.
    async fn on_prompt_answer(&mut self, answer: Result<Value, RpcError>) -> Result<(), Gone> {
        self.drain_backlog().await?;
        while let Ok(msg) = self.io.incoming.try_recv() {
            self.on_incoming(msg).await?;
        }
        for (_, pending) in self.permissions.drain() {
            pending.request.respond(acp::cancelled_answer());
        }
        match answer_events(&mut self.translator, answer) {
            Some(events) => self.emit(events).await,
            // Written, and the process is going: its exit ends the run.
            None => Ok(()),
        }
    }

    async fn fail_turn(&mut self, category: ErrorCategory, message: String) -> Result<(), Gone> {
        self.io.fail_turn(category, message).await
    }

    async fn on_incoming(&mut self, msg: Incoming) -> Result<(), Gone> {
        match msg {
            Incoming::Notification { method, params } => {
                let events = self.translator.on_notification(&method, &params);
                self.emit(events).await
            }
            Incoming::Request(request) if request.method == "session/request_permission" => {
                let (events, id) = self.translator.on_permission_request(&request.params);
                match id {
                    Some(id) if self.prompt.is_some() => {
                        let options = request
                            .params
                            .get("options")
                            .cloned()
                            .unwrap_or(Value::Null);
                        self.permissions.insert(id, Pending { request, options });
                    }
                    // Not this session's, or outside a turn: not ours to grant.
                    _ => request.respond(acp::cancelled_answer()),
                }
                self.emit(events).await
            }
            // `fs/*`, `terminal/*` and extensions: not served (method not found as it drops).
            Incoming::Request(request) => {
                tracing::debug!(method = %request.method, "refused an agent request");
                drop(request);
                Ok(())
            }
        }
    }
}

/// Start the agent only to ask `initialize`: what `agent.list` reports for an ACP agent.
pub async fn probe(
    program: &std::path::Path,
    args: &[String],
    base_env: &[(String, String)],
    extra_env: &[(String, String)],
    cwd: &std::path::Path,
    timeout: Duration,
) -> Result<AgentCaps, AdapterError> {
    let mut child = spawn(&SpawnSpec {
        program: program.to_owned(),
        args: args.to_vec(),
        cwd: cwd.to_owned(),
        base_env: base_env.to_vec(),
        extra_env: extra_env.to_vec(),
        session_id: None,
        home: None,
        label: "acp probe".to_owned(),
    })?;
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err(AdapterError::new(
            ErrorCategory::TransportLost,
            "the agent has no stdio",
        ));
    };
    let (rpc, incoming, _skipped) = RpcClient::start(stdout, stdin, Dialect::JsonRpc2);
    let answer = rpc
        .request("initialize", acp::initialize_params(), timeout)
        .await;
    drop(rpc);
    drop(incoming);
    let _status = child.stop(Duration::from_secs(1)).await;
    let init = answer.map_err(|e| {
        AdapterError::new(
            ErrorCategory::ProtocolIncompatible,
            format!("{} did not answer initialize: {e}", program.display()),
        )
    })?;
    let version = init.get("protocolVersion").and_then(Value::as_u64);
    if version != Some(acp::PROTOCOL_VERSION) {
        return Err(AdapterError::new(
            ErrorCategory::ProtocolIncompatible,
            format!("speaks ACP version {version:?}, this host version 1"),
        ));
    }
    Ok(AgentCaps::from_initialize(&init))
}

#[cfg(test)]
mod tests {
    use super::rpc_driver::test_support::{
        ID, all_outputs, fake, file_appears, release, run_ends, until_run_end,
    };
    use super::*;
    use crate::protocol::events::RunState;

    /// A stand-in ACP agent: it answers `initialize` and `session/new`; then, by `mode`:
    /// `deaf` closes its stdin and waits to be released; `die` records `session/prompt` and
    /// is killed before answering it.
    fn agent(mode: &str) -> (tempfile::TempDir, OpenSpec) {
        let body = format!(
            r#"while read line; do
  {ID}
  case "$line" in
    *'"method":"initialize"'*)
      printf '{{"jsonrpc":"2.0","id":%s,"result":{{"protocolVersion":1,"agentCapabilities":{{}}}}}}\n' "$id";;
    *'"method":"session/new"'*)
      printf '{{"jsonrpc":"2.0","id":%s,"result":{{"sessionId":"s1","models":{{"currentModelId":"m1","availableModels":[{{"modelId":"m1"}},{{"modelId":"m2"}}]}}}}}}\n' "$id"
      if [ "$mode" = deaf ]; then exec 0<&-; : > "$dir/closed"; read x < "$dir/hold"; exit 0; fi;;
    *'"method":"session/set_model"'*)
      : > "$dir/asked";;
    *'"method":"session/prompt"'*)
      printf '%s' "$line" > "$dir/got"
      kill -9 $$;;
  esac
done"#
        );
        fake(&body, mode)
    }

    /// An agent that never answers `session/set_model`: the change fails within
    /// [`SET_MODEL_WAIT`], below the session's own wait, and the driver reads on.
    #[tokio::test]
    async fn a_model_change_the_agent_never_answers_fails_in_time() {
        let (dir, spec) = agent("mute-model");
        let mut session = open(spec).unwrap();
        let started = std::time::Instant::now();
        let err = session.set_model("m2").await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_millis(1900),
            "{:?}",
            started.elapsed()
        );
        assert!(dir.path().join("asked").exists());
        assert!(err.message.contains("\"m2\""), "{}", err.message);
        // The loop is free: a prompt still goes to the agent.
        session.send("hello there", "run-1").await.unwrap();
        let outputs = all_outputs(&mut session).await;
        assert_eq!(run_ends(&outputs).len(), 1, "{outputs:?}");
        let got = std::fs::read_to_string(dir.path().join("got")).unwrap();
        assert!(got.contains("hello there"), "{got}");
    }

    /// `session/prompt` written, then the agent killed before its answer: unknown.
    #[tokio::test]
    async fn a_prompt_sent_then_the_agent_dies_is_result_delivery_unknown() {
        let (dir, spec) = agent("die");
        let mut session = open(spec).unwrap();
        session.send("hello there", "run-1").await.unwrap();
        let outputs = all_outputs(&mut session).await;
        let ends = run_ends(&outputs);
        assert_eq!(ends.len(), 1, "{outputs:?}");
        assert_eq!(ends[0].state, RunState::Failed);
        assert_eq!(
            ends[0].category,
            Some(ErrorCategory::ResultDeliveryUnknown),
            "{outputs:?}"
        );
        let got = std::fs::read_to_string(dir.path().join("got")).unwrap();
        assert!(got.contains("hello there"), "{got}");
    }

    /// The agent closed its stdin before the prompt: `session/prompt` is never written, so
    /// the run ends `transport_lost`, "not sent", before the process exits.
    #[tokio::test]
    async fn a_prompt_that_cannot_be_written_is_transport_lost_not_sent() {
        let (dir, spec) = agent("deaf");
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
