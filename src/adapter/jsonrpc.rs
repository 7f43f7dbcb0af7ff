//! A JSON-RPC client over a child's stdio, one JSON message per line — written once for every
//! family that speaks JSON-RPC (Codex `app-server`, ACP agents).
//!
//! Two halves. A writer task ([`RpcClient::start`]) owns the agent's stdin: it writes requests,
//! notifications and answers. The [`Inbox`] owns its stdout and is read by the owner itself
//! (the driver task), with no task between: each [`Inbox::recv`] reads lines (at most
//! [`MAX_LINE`] bytes each: a whole thread can arrive as one `thread/resume` answer) and
//! routes them: a response goes to the caller waiting on its id (in any order), and the first
//! notification or server→client request is returned. A [`ServerRequest`] is answered exactly
//! once: by the owner, or — if the owner drops it unanswered — with "method not found", so the
//! agent never waits on us.
//!
//! Failures are precise: [`RpcError::NotSent`] (the transport was gone before the request was
//! written: safe to retry elsewhere), [`RpcError::NoAnswer`] (written, then the transport
//! ended: its outcome is unknown), [`RpcError::Timeout`], and [`RpcError::Remote`] (the
//! agent's own error object). Lines that are not JSON, responses to unknown ids and over-long
//! lines are counted and skipped, never fatal.
//!
//! Answers arrive only while the owner reads: it must keep calling [`Inbox::recv`] while
//! anything waits for an answer (a driver's loop does; [`Inbox::answering`] does it around one
//! future). An owner that stops reading stops the agent once the pipe is full (back-pressure),
//! answers included. The end of stdout, or the inbox dropped, ends the writer too (stdin
//! closes): what is written after has no answer coming.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::lines::{BoundedLines, Line};

/// The longest line read. Codex sends a resumed thread's whole history in one answer;
/// multica had to raise its own bound to 32 MiB for that.
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// JSON-RPC error codes the client itself uses.
pub const METHOD_NOT_FOUND: i64 = -32601;

/// Whether messages carry `"jsonrpc": "2.0"` (ACP: yes; Codex app-server: no).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    JsonRpc2,
    Bare,
}

/// The most of an error's `data` quoted in [`RpcError::detail`].
const MAX_DETAIL: usize = 2048;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RpcError {
    #[error("{method}: not sent, the transport is closed")]
    NotSent { method: String },
    #[error("{method}: sent, but the transport closed before an answer")]
    NoAnswer { method: String },
    #[error("{method}: no answer within {after:?}")]
    Timeout { method: String, after: Duration },
    #[error("{method}: error {code}: {message}")]
    Remote {
        method: String,
        code: i64,
        message: String,
        data: Value,
    },
}

impl RpcError {
    /// What to tell a person: the agent's own message with its error `data` (where agents put
    /// the cause: "Internal error" says little, `data` says "process exited with code 1"),
    /// or the transport failure. Long data is cut.
    pub fn detail(&self) -> String {
        let RpcError::Remote { message, data, .. } = self else {
            return self.to_string();
        };
        let data = match data {
            Value::Null => return message.clone(),
            Value::String(text) => text.clone(),
            Value::Object(map) => {
                // The usual shapes: {details|message|error: "..."}; anything else as JSON.
                ["details", "detail", "message", "error", "cause"]
                    .iter()
                    .find_map(|k| map.get(*k).and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| data.to_string())
            }
            other => other.to_string(),
        };
        let data = crate::redact::redact(&data);
        let mut end = data.len().min(MAX_DETAIL);
        while !data.is_char_boundary(end) {
            end -= 1;
        }
        let cut = if end < data.len() { "…" } else { "" };
        if message.is_empty() {
            format!("{}{cut}", &data[..end])
        } else {
            format!("{message} ({}{cut})", &data[..end])
        }
    }

    /// The agent's error message, if it answered with one.
    pub fn remote_message(&self) -> Option<&str> {
        match self {
            RpcError::Remote { message, .. } => Some(message),
            _ => None,
        }
    }
}

/// What the agent sent that is not an answer to us.
#[derive(Debug)]
pub enum Incoming {
    Notification { method: String, params: Value },
    Request(ServerRequest),
}

/// A request from the agent. Answer it with [`ServerRequest::respond`] or
/// [`ServerRequest::reject`]; dropped unanswered, it is rejected with "method not found".
#[derive(Debug)]
pub struct ServerRequest {
    pub id: Value,
    pub method: String,
    pub params: Value,
    out: Option<mpsc::Sender<Cmd>>,
}

impl ServerRequest {
    /// Answer with a result.
    pub fn respond(mut self, result: Value) {
        self.send(Ok(result));
    }

    /// Answer with an error.
    pub fn reject(mut self, code: i64, message: &str) {
        self.send(Err((code, message.to_owned())));
    }

    fn send(&mut self, answer: Result<Value, (i64, String)>) {
        if let Some(out) = self.out.take() {
            // A full or closed queue: the transport is going away or the writer is busy with
            // thousands of lines; either way the answer is queued or moot.
            let cmd = Cmd::Answer {
                id: self.id.clone(),
                answer,
            };
            if let Err(mpsc::error::TrySendError::Full(cmd)) = out.try_send(cmd) {
                tokio::spawn(async move {
                    let _closed = out.send(cmd).await;
                });
            }
        }
    }
}

impl Drop for ServerRequest {
    fn drop(&mut self) {
        if self.out.is_some() {
            let message = format!("method not found: {}", self.method);
            self.send(Err((METHOD_NOT_FOUND, message)));
        }
    }
}

#[derive(Debug)]
enum Cmd {
    Request {
        id: u64,
        method: String,
        params: Value,
        reply: oneshot::Sender<Result<Value, RpcError>>,
    },
    Notify {
        method: String,
        params: Value,
        sent: oneshot::Sender<bool>,
    },
    Answer {
        id: Value,
        answer: Result<Value, (i64, String)>,
    },
    Forget {
        id: u64,
    },
}

/// Requests written and waiting for their answer, by id.
type Pending = HashMap<u64, (String, Reply)>;

/// The sending half; cloneable.
#[derive(Debug, Clone)]
pub struct RpcClient {
    out: mpsc::Sender<Cmd>,
    next_id: Arc<AtomicU64>,
}

/// Counters of what the reader skipped.
#[derive(Debug, Default)]
pub struct Skipped {
    pub not_json: AtomicU64,
    pub unknown_id: AtomicU64,
    pub too_long: AtomicU64,
}

/// The requests written and waiting for their answer, shared by the writer (which registers
/// each one before writing it) and the inbox (which routes answers); `None` once stdout has
/// ended or the inbox is gone, when no answer can come any more.
#[derive(Debug)]
struct Shared {
    pending: Mutex<Option<Pending>>,
    /// Cancelled with `pending` set to `None`: the writer stops.
    closed: CancellationToken,
}

type Reply = oneshot::Sender<Result<Value, RpcError>>;

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Pending>> {
        // A panic while holding it leaves the map as it was: nothing to repair.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Register `id` before it is written; the reply back when no answer can come any more.
    fn register(&self, id: u64, method: String, reply: Reply) -> Result<(), (String, Reply)> {
        match self.lock().as_mut() {
            Some(pending) => {
                pending.insert(id, (method, reply));
                Ok(())
            }
            None => Err((method, reply)),
        }
    }

    fn take(&self, id: u64) -> Option<(String, Reply)> {
        self.lock().as_mut().and_then(|pending| pending.remove(&id))
    }

    /// No answer comes any more: every request waiting gets `NoAnswer`, and the writer stops.
    fn close(&self) {
        let pending = self.lock().take();
        for (_, (method, reply)) in pending.into_iter().flatten() {
            let _caller_gone = reply.send(Err(RpcError::NoAnswer { method }));
        }
        self.closed.cancel();
    }
}

/// The agent's stdout, read by its owner: what the agent sends that is not an answer to us.
/// Dropping it closes the transport (answers awaited get `NoAnswer`, stdin closes).
pub struct Inbox {
    /// `None` once stdout has ended: the reader is dropped then, as the writer is.
    lines: Option<BoundedLines<Box<dyn AsyncRead + Unpin + Send + Sync>>>,
    shared: Arc<Shared>,
    out: mpsc::Sender<Cmd>,
    skipped: Arc<Skipped>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("ended", &self.lines.is_none())
            .finish()
    }
}

impl Inbox {
    /// The next notification or server request, routing every answer before it to its
    /// caller; `None` once stdout has ended. Cancel-safe: a line is taken whole and routed
    /// before any other await, and a partial line stays buffered.
    pub async fn recv(&mut self) -> Option<Incoming> {
        while let Some(lines) = self.lines.as_mut() {
            match lines.next_line().await {
                Ok(Some(Line::Text(line))) => {
                    if let Some(msg) = route(&line, &self.shared, &self.out, &self.skipped) {
                        return Some(msg);
                    }
                }
                Ok(Some(Line::TooLong)) => {
                    self.skipped.too_long.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(max = MAX_LINE, "skipped an over-long line from the agent");
                }
                Ok(Some(Line::NotUtf8)) => {
                    self.skipped.not_json.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => self.end(),
                Err(e) => {
                    tracing::debug!(error = %e, "agent stdout failed");
                    self.end();
                }
            }
        }
        None
    }

    /// What the agent has sent by now (already read, or in the pipe), without waiting.
    pub fn try_recv(&mut self) -> Option<Incoming> {
        self.recv().now_or_never().flatten()
    }

    /// Wait for `work` (which awaits an answer) while reading: what the agent sends
    /// meanwhile is handed to `meanwhile` (a request dropped there is refused).
    pub async fn answering<T>(
        &mut self,
        work: impl Future<Output = T>,
        mut meanwhile: impl FnMut(Incoming),
    ) -> T {
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return done,
                msg = self.recv() => match msg {
                    Some(msg) => meanwhile(msg),
                    // stdout ended: the answer will say so.
                    None => return work.await,
                },
            }
        }
    }

    fn end(&mut self) {
        self.lines = None;
        self.shared.close();
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl RpcClient {
    /// Start the writer over `writer` (the agent's stdin) and put an [`Inbox`] on `reader`
    /// (its stdout); the inbox ends when stdout does.
    pub fn start<R, W>(reader: R, writer: W, dialect: Dialect) -> (RpcClient, Inbox, Arc<Skipped>)
    where
        R: AsyncRead + Unpin + Send + Sync + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, cmds) = mpsc::channel(256);
        let skipped = Arc::new(Skipped::default());
        let shared = Arc::new(Shared {
            pending: Mutex::new(Some(Pending::new())),
            closed: CancellationToken::new(),
        });
        tokio::spawn(write_loop(writer, dialect, cmds, shared.clone()));
        let reader: Box<dyn AsyncRead + Unpin + Send + Sync> = Box::new(reader);
        let inbox = Inbox {
            lines: Some(BoundedLines::new(reader, MAX_LINE)),
            shared,
            out: out.clone(),
            skipped: skipped.clone(),
        };
        (
            RpcClient {
                out,
                next_id: Arc::new(AtomicU64::new(1)),
            },
            inbox,
            skipped,
        )
    }

    /// Call `method` and wait at most `timeout` for its answer.
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let cmd = Cmd::Request {
            id,
            method: method.to_owned(),
            params,
            reply,
        };
        if self.out.send(cmd).await.is_err() {
            return Err(RpcError::NotSent {
                method: method.to_owned(),
            });
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result,
            // The task ended with our request in it: it was written or it was not; the task
            // answers `NotSent` itself when it knows, so a dropped reply means "unknown".
            Ok(Err(_)) => Err(RpcError::NoAnswer {
                method: method.to_owned(),
            }),
            Err(_) => {
                let _closed = self.out.try_send(Cmd::Forget { id });
                Err(RpcError::Timeout {
                    method: method.to_owned(),
                    after: timeout,
                })
            }
        }
    }

    /// Hand `method` to the writer and return at once: its id and where its answer comes
    /// (the reader fills it before it passes on anything the agent sent after the answer).
    /// No timeout: the caller bounds its wait and then [`forget`](Self::forget)s the id.
    pub async fn start_request(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(u64, oneshot::Receiver<Result<Value, RpcError>>), RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let cmd = Cmd::Request {
            id,
            method: method.to_owned(),
            params,
            reply,
        };
        if self.out.send(cmd).await.is_err() {
            return Err(RpcError::NotSent {
                method: method.to_owned(),
            });
        }
        Ok((id, answer))
    }

    /// Stop waiting for request `id`'s answer (it is dropped when it comes).
    pub fn forget(&self, id: u64) {
        let _closed = self.out.try_send(Cmd::Forget { id });
    }

    /// Send a notification; `false` if it could not be written.
    pub async fn notify(&self, method: &str, params: Value) -> bool {
        let (sent, written) = oneshot::channel();
        let cmd = Cmd::Notify {
            method: method.to_owned(),
            params,
            sent,
        };
        if self.out.send(cmd).await.is_err() {
            return false;
        }
        written.await.unwrap_or(false)
    }
}

fn message(dialect: Dialect, mut fields: Map<String, Value>) -> String {
    if dialect == Dialect::JsonRpc2 {
        fields.insert("jsonrpc".to_owned(), json!("2.0"));
    }
    let mut line = Value::Object(fields).to_string();
    line.push('\n');
    line
}

fn object(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

/// The writer: every line to the agent's stdin, in the order asked. It ends when every
/// sender is gone or the transport is closed (stdout ended, the inbox dropped) and nothing is
/// queued: answers to the agent's requests queued by then are still written (a driver refuses
/// what it leaves unanswered as it closes); a request or notification is not (no answer can
/// come), nor is anything that comes after.
async fn write_loop<W>(
    mut writer: W,
    dialect: Dialect,
    mut cmds: mpsc::Receiver<Cmd>,
    shared: Arc<Shared>,
) where
    W: AsyncWrite + Unpin,
{
    let mut writable = true;
    loop {
        let cmd = tokio::select! {
            biased;
            cmd = cmds.recv() => match cmd {
                Some(cmd) => cmd,
                None => break,
            },
            () = shared.closed.cancelled() => break,
        };
        match cmd {
            Cmd::Request {
                id,
                method,
                params,
                reply,
            } => {
                if !writable {
                    let _caller_gone = reply.send(Err(RpcError::NotSent { method }));
                    continue;
                }
                let line = message(
                    dialect,
                    object(&[
                        ("id", json!(id)),
                        ("method", json!(method)),
                        ("params", params),
                    ]),
                );
                // Registered before it is written: the answer can be read at once.
                if let Err((method, reply)) = shared.register(id, method, reply) {
                    let _caller_gone = reply.send(Err(RpcError::NotSent { method }));
                    continue;
                }
                if !write(&mut writer, &line).await {
                    writable = false;
                    if let Some((method, reply)) = shared.take(id) {
                        let _caller_gone = reply.send(Err(RpcError::NotSent { method }));
                    }
                }
            }
            Cmd::Notify {
                method,
                params,
                sent,
            } => {
                if shared.closed.is_cancelled() {
                    let _caller_gone = sent.send(false);
                    continue;
                }
                let line = message(
                    dialect,
                    object(&[("method", json!(method)), ("params", params)]),
                );
                writable = writable && write(&mut writer, &line).await;
                let _caller_gone = sent.send(writable);
            }
            Cmd::Answer { id, answer } => {
                let body = match answer {
                    Ok(result) => ("result", result),
                    Err((code, text)) => ("error", json!({"code": code, "message": text})),
                };
                let line = message(dialect, object(&[("id", id), body]));
                writable = writable && write(&mut writer, &line).await;
            }
            Cmd::Forget { id } => {
                let _dropped = shared.take(id);
            }
        }
    }
    // Requests still queued were never written.
    cmds.close();
    while let Ok(cmd) = cmds.try_recv() {
        match cmd {
            Cmd::Request { method, reply, .. } => {
                let _caller_gone = reply.send(Err(RpcError::NotSent { method }));
            }
            Cmd::Notify { sent, .. } => {
                let _caller_gone = sent.send(false);
            }
            Cmd::Answer { .. } | Cmd::Forget { .. } => {}
        }
    }
}

async fn write<W: AsyncWrite + Unpin>(writer: &mut W, line: &str) -> bool {
    match writer.write_all(line.as_bytes()).await {
        Ok(()) => writer.flush().await.is_ok(),
        Err(e) => {
            tracing::debug!(error = %e, "writing to the agent failed");
            false
        }
    }
}

/// Route one line: an answer goes to its caller; a message for the owner is returned.
fn route(
    line: &str,
    shared: &Shared,
    out: &mpsc::Sender<Cmd>,
    skipped: &Skipped,
) -> Option<Incoming> {
    let Ok(Value::Object(mut msg)) = serde_json::from_str::<Value>(line) else {
        skipped.not_json.fetch_add(1, Ordering::Relaxed);
        let head: String = line.chars().take(120).collect();
        tracing::debug!(line = %head, "skipped a line that is not a JSON object");
        return None;
    };
    let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
    let id = msg.remove("id");
    let params = msg.remove("params").unwrap_or(Value::Null);
    match (method, id) {
        (Some(method), Some(id)) if !id.is_null() => Some(Incoming::Request(ServerRequest {
            id,
            method,
            params,
            out: Some(out.clone()),
        })),
        (Some(method), _) => Some(Incoming::Notification { method, params }),
        (None, Some(id)) => {
            let Some((method, reply)) = id.as_u64().and_then(|id| shared.take(id)) else {
                skipped.unknown_id.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%id, "an answer to no request of ours; skipped");
                return None;
            };
            let result = match msg.remove("error") {
                Some(error) if !error.is_null() => Err(RpcError::Remote {
                    method,
                    code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                    message: error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    data: error.get("data").cloned().unwrap_or(Value::Null),
                }),
                _ => Ok(msg.remove("result").unwrap_or(Value::Null)),
            };
            let _caller_gone = reply.send(result);
            None
        }
        (None, None) => {
            skipped.not_json.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_detail_quotes_the_agents_data() {
        let remote = |data: Value| RpcError::Remote {
            method: "session/new".into(),
            code: -32603,
            message: "Internal error".into(),
            data,
        };
        assert_eq!(remote(Value::Null).detail(), "Internal error");
        assert_eq!(
            remote(json!({"details": "Claude Code process exited with code 1"})).detail(),
            "Internal error (Claude Code process exited with code 1)"
        );
        assert_eq!(remote(json!("boom")).detail(), "Internal error (boom)");
        assert_eq!(
            remote(json!({"code": 7})).detail(),
            r#"Internal error ({"code":7})"#
        );
        let long = remote(json!("é".repeat(5000))).detail();
        assert!(long.len() < 2100 && long.ends_with("…)"), "{}", long.len());
        let not_sent = RpcError::NotSent { method: "x".into() };
        assert_eq!(not_sent.detail(), not_sent.to_string());
    }

    use super::*;
    use tokio::io::{AsyncBufReadExt, BufReader, DuplexStream};

    const T: Duration = Duration::from_secs(5);

    /// A client wired to a fake agent: what the client writes comes out of `agent_in`; what is
    /// written to `agent_out` the client reads.
    fn wired() -> (
        RpcClient,
        Inbox,
        Arc<Skipped>,
        tokio::io::Lines<BufReader<DuplexStream>>,
        DuplexStream,
    ) {
        let (client_reads, agent_out) = tokio::io::duplex(1 << 20);
        let (agent_in, client_writes) = tokio::io::duplex(1 << 20);
        let (client, incoming, skipped) =
            RpcClient::start(client_reads, client_writes, Dialect::Bare);
        (
            client,
            incoming,
            skipped,
            BufReader::new(agent_in).lines(),
            agent_out,
        )
    }

    /// The owner's reading, for tests that only wait on answers: what comes for the owner is
    /// dropped.
    fn read_on(mut inbox: Inbox) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move { while inbox.recv().await.is_some() {} })
    }

    async fn next_sent(lines: &mut tokio::io::Lines<BufReader<DuplexStream>>) -> Value {
        let line = tokio::time::timeout(T, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    }

    #[tokio::test]
    async fn answers_out_of_order_reach_their_callers() {
        let (client, inbox, skipped, mut sent, mut agent) = wired();
        let _reading = read_on(inbox);
        let a = tokio::spawn({
            let c = client.clone();
            async move { c.request("a", json!({}), T).await }
        });
        let first = next_sent(&mut sent).await;
        let b = tokio::spawn({
            let c = client.clone();
            async move { c.request("b", json!({}), T).await }
        });
        let second = next_sent(&mut sent).await;
        assert_eq!(
            (first["method"].as_str(), second["method"].as_str()),
            (Some("a"), Some("b"))
        );
        assert!(first.get("jsonrpc").is_none(), "bare dialect");
        // b answered first, then an answer to nobody, then a.
        let lines = format!(
            "{}\n{}\n{}\n",
            json!({"id": second["id"], "result": "for b"}),
            json!({"id": 999, "result": "stray"}),
            json!({"id": first["id"], "error": {"code": -32600, "message": "no rollout found"}}),
        );
        agent.write_all(lines.as_bytes()).await.unwrap();
        assert_eq!(b.await.unwrap().unwrap(), json!("for b"));
        let err = a.await.unwrap().unwrap_err();
        assert_eq!(err.remote_message(), Some("no rollout found"));
        assert!(matches!(err, RpcError::Remote { code: -32600, .. }));
        assert_eq!(skipped.unknown_id.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn server_requests_interleave_with_answers_and_are_answered_once() {
        let (client, mut incoming, _skipped, mut sent, mut agent) = wired();
        let call = tokio::spawn({
            let c = client.clone();
            async move { c.request("turn/start", json!({}), T).await }
        });
        let req = next_sent(&mut sent).await;
        let lines = format!(
            "{}\n{}\n{}\n{}\n",
            json!({"method": "turn/started", "params": {"n": 1}}),
            json!({"id": 0, "method": "item/commandExecution/requestApproval", "params": {"x": 1}}),
            json!({"id": req["id"], "result": {"turn": {"id": "t"}}}),
            json!({"id": 1, "method": "some/unknown", "params": {}}),
        );
        agent.write_all(lines.as_bytes()).await.unwrap();
        match incoming.recv().await.unwrap() {
            Incoming::Notification { method, params } => {
                assert_eq!(
                    (method.as_str(), params["n"].as_i64()),
                    ("turn/started", Some(1))
                );
            }
            other => panic!("{other:?}"),
        }
        let approval = match incoming.recv().await.unwrap() {
            Incoming::Request(r) => r,
            other => panic!("{other:?}"),
        };
        approval.respond(json!({"decision": "accept"}));
        assert_eq!(
            next_sent(&mut sent).await,
            json!({"id": 0, "result": {"decision": "accept"}})
        );
        // The answer is routed on the way to the next message, and before it is returned.
        let unknown = match incoming.recv().await.unwrap() {
            Incoming::Request(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(call.await.unwrap().unwrap()["turn"]["id"], "t");
        // Dropped unanswered: method not found, so the agent never waits.
        drop(unknown);
        let refused = next_sent(&mut sent).await;
        assert_eq!(refused["id"], 1);
        assert_eq!(refused["error"]["code"], METHOD_NOT_FOUND);
    }

    #[tokio::test]
    async fn a_forty_mib_line_is_read_whole() {
        let (client, inbox, _skipped, mut sent, mut agent) = wired();
        let _reading = read_on(inbox);
        let call = tokio::spawn({
            let c = client.clone();
            async move {
                c.request("thread/resume", json!({}), Duration::from_secs(30))
                    .await
            }
        });
        let req = next_sent(&mut sent).await;
        let history = "x".repeat(40 * 1024 * 1024);
        let line =
            json!({"id": req["id"], "result": {"thread": {"history": history}}}).to_string() + "\n";
        let writer = tokio::spawn(async move {
            agent.write_all(line.as_bytes()).await.unwrap();
            agent
        });
        let result = call.await.unwrap().unwrap();
        assert_eq!(
            result["thread"]["history"].as_str().map(str::len),
            Some(40 * 1024 * 1024)
        );
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_skipped_and_the_stream_goes_on() {
        let (client_reads, mut agent) = tokio::io::duplex(1 << 20);
        let (_agent_in, client_writes) = tokio::io::duplex(1 << 20);
        let (_client, mut incoming, skipped) =
            RpcClient::start(client_reads, client_writes, Dialect::JsonRpc2);
        let writer = tokio::spawn(async move {
            let junk = vec![b'y'; MAX_LINE + 10];
            agent.write_all(&junk).await.unwrap();
            agent
                .write_all(b"\n{\"jsonrpc\":\"2.0\",\"method\":\"after\",\"params\":null}\n")
                .await
                .unwrap();
            agent
        });
        match tokio::time::timeout(Duration::from_secs(30), incoming.recv())
            .await
            .unwrap()
            .unwrap()
        {
            Incoming::Notification { method, .. } => assert_eq!(method, "after"),
            other => panic!("{other:?}"),
        }
        assert_eq!(skipped.too_long.load(Ordering::Relaxed), 1);
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn stdout_closing_mid_line_fails_what_was_sent_and_refuses_what_comes_next() {
        let (client, mut incoming, skipped, mut sent, mut agent) = wired();
        let call = tokio::spawn({
            let c = client.clone();
            async move { c.request("turn/start", json!({}), T).await }
        });
        next_sent(&mut sent).await;
        agent
            .write_all(b"{\"id\":1,\"result\":{\"tru")
            .await
            .unwrap();
        drop(agent);
        assert!(incoming.recv().await.is_none(), "the stream ends");
        assert!(matches!(
            call.await.unwrap(),
            Err(RpcError::NoAnswer { .. })
        ));
        assert_eq!(skipped.not_json.load(Ordering::Relaxed), 1, "the torn line");
        assert!(matches!(
            client.request("again", json!({}), T).await,
            Err(RpcError::NotSent { .. })
        ));
        assert!(!client.notify("x", json!({})).await);
    }

    #[tokio::test]
    async fn a_request_nobody_answers_times_out() {
        let (client, _incoming, _skipped, mut sent, _agent) = wired();
        let call = tokio::spawn({
            let c = client.clone();
            async move {
                c.request("slow", json!({}), Duration::from_millis(50))
                    .await
            }
        });
        next_sent(&mut sent).await;
        assert!(matches!(call.await.unwrap(), Err(RpcError::Timeout { .. })));
    }

    #[tokio::test]
    async fn the_json_rpc_2_dialect_marks_every_message() {
        let (client_reads, _agent) = tokio::io::duplex(1 << 16);
        let (agent_in, client_writes) = tokio::io::duplex(1 << 16);
        let (client, _incoming, _skipped) =
            RpcClient::start(client_reads, client_writes, Dialect::JsonRpc2);
        assert!(client.notify("initialized", json!({})).await);
        let mut sent = BufReader::new(agent_in).lines();
        let msg = next_sent(&mut sent).await;
        assert_eq!(msg["jsonrpc"], "2.0");
        assert_eq!(msg["method"], "initialized");
    }
}
