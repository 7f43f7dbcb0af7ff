//! The driver of one `codex app-server` process (design §9), behind the generic
//! [`AgentSession`] handle: [`open`] starts it.
//!
//! One task owns the process through the [`RpcClient`]: it shakes hands (`initialize`,
//! `initialized`), opens the thread (`thread/start`, or `thread/resume` — a fresh app-server
//! must load a thread before `turn/start`), then serves the session: a prompt is a
//! `turn/start`, a cancel a `turn/interrupt` (held until `turn/started` names the turn), a
//! permission answer goes back to the approval request it answers. Everything the app-server
//! sends goes through the pure [`Translator`]. While it waits for an answer the task keeps
//! taking what the app-server sends (buffered, then handled in order), so a full queue can
//! never stall the answer it waits for.
//!
//! Opening failures are reported on the first prompt: a thread Codex cannot find
//! (`no rollout found`, `thread not found`) ends that run `resume_rejected` (the session then
//! starts a fresh thread, visibly); a thread another process writes (`active writer`) is
//! forked instead (design §8: never fight for the lock), with a `warning`.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::codex::{self, Translator};
use super::jsonrpc::{Dialect, Incoming, RpcError, ServerRequest};
use super::rpc_driver::{self, Closing, Gone, Io, Opening, open_or_close};
use super::spawn::{Spawned, describe_exit};
use super::{AdapterError, AgentInput, AgentOutput, AgentSession, Native, OpenSpec};
use crate::protocol::events::{ErrorCategory, EventBody, Notice};
/// How long the handshake and opening a thread may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `turn/start` and `turn/interrupt` may take to be answered.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

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
        interrupt_pending: false,
        open_error: None,
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

/// Why the thread could not be opened; reported on the next prompt.
struct OpenError {
    category: ErrorCategory,
    message: String,
}

struct Driver {
    io: Io,
    translator: Translator,
    /// Approval requests waiting for the session's answer, by permission id.
    approvals: HashMap<String, ServerRequest>,
    /// A cancel came before the turn had an id.
    interrupt_pending: bool,
    open_error: Option<OpenError>,
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
        // A dead app-server whose stdout a child of it still holds never sends EOF: its
        // exit is watched too.
        let leader = child.leader_exit();
        tokio::pin!(leader);
        // Opening may take long (a slow or hung app-server): a close is honoured meanwhile,
        // and what else the session sends (its first prompt) waits for the thread.
        let mut session_gone = match open_or_close(self.open(&native, &cwd), &mut inputs).await {
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
                () = &mut leader => {
                    stdout_open = false;
                    break;
                }
            }
        }
        let closing = rpc_driver::closing(&mut inputs, closing, session_gone, stdout_open);
        // Unanswered approvals are refused as the process goes; then stdin closes (the
        // app-server exits cleanly on EOF) with the last handle to the client.
        self.approvals.clear();
        let Driver {
            io, mut translator, ..
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
        let in_turn = translator.in_turn();
        tracing::info!(%status, in_turn, skipped = translator.skipped(), "app-server ended");
        if session_gone {
            return;
        }
        for event in translator.on_exit(in_turn, &exit) {
            if events.send(AgentOutput::Event(event)).await.is_err() {
                return;
            }
        }
        let _session_gone = events.send(AgentOutput::Exited { status: exit }).await;
    }

    async fn emit(&self, events: Vec<EventBody>) -> Result<(), Gone> {
        self.io.emit(events).await
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
    async fn open(&mut self, native: &Native, cwd: &str) -> Result<(), Gone> {
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
                    codex::thread_start_params(cwd),
                    OPEN_TIMEOUT,
                )
                .await
            }
            Native::Resume(id) => {
                let resumed = self
                    .call("thread/resume", json!({"threadId": id}), OPEN_TIMEOUT)
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
        let forked = self
            .call("thread/fork", json!({"threadId": id}), OPEN_TIMEOUT)
            .await?;
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
            AgentInput::Prompt { text, .. } => self.start_turn(&text).await,
            AgentInput::Permission {
                request_id, allow, ..
            } => {
                match self.approvals.remove(&request_id) {
                    Some(request) => {
                        let answer =
                            codex::approval_answer(&request.method, &request.params, allow);
                        request.respond(answer);
                    }
                    None => tracing::info!(request_id, "an answer to no pending approval"),
                }
                Ok(())
            }
            AgentInput::Interrupt => {
                match self.translator.turn_id().map(str::to_owned) {
                    Some(turn) => self.interrupt(&turn).await,
                    None => self.interrupt_pending = true,
                }
                Ok(())
            }
            AgentInput::Close { .. } => Ok(()),
        }
    }

    async fn start_turn(&mut self, text: &str) -> Result<(), Gone> {
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
                codex::turn_start_params(&thread, text),
                CALL_TIMEOUT,
            )
            .await;
        match started {
            Ok(_) => Ok(()),
            Err(RpcError::NoAnswer { .. } | RpcError::NotSent { .. }) => {
                // The process is going: its exit ends the run.
                Ok(())
            }
            Err(e) => {
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

    async fn on_incoming(&mut self, msg: Incoming) -> Result<(), Gone> {
        match msg {
            Incoming::Notification { method, params } => {
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
                        // Another thread's approval: not ours to grant.
                        let answer =
                            codex::approval_answer(&request.method, &request.params, false);
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
