//! A JSON-RPC client over a child's stdio, one JSON message per line — written once for every
//! family that speaks JSON-RPC (Codex `app-server`, ACP agents).
//!
//! One task ([`RpcClient::start`]) owns both pipes. It writes requests, notifications and
//! answers; it reads lines (at most [`MAX_LINE`] bytes each: a whole thread can arrive as one
//! `thread/resume` answer) and routes them: a response goes to the caller waiting on its id
//! (in any order), a notification or a server→client request goes to the owner through
//! [`Incoming`]. A [`ServerRequest`] is answered exactly once: by the owner, or — if the owner
//! drops it unanswered — with "method not found", so the agent never waits on us.
//!
//! Failures are precise: [`RpcError::NotSent`] (the transport was gone before the request was
//! written: safe to retry elsewhere), [`RpcError::NoAnswer`] (written, then the transport
//! ended: its outcome is unknown), [`RpcError::Timeout`], and [`RpcError::Remote`] (the
//! agent's own error object). Lines that are not JSON, responses to unknown ids and over-long
//! lines are counted and skipped, never fatal.
//!
//! The owner must keep taking [`Incoming`] while it waits for answers: the queue is bounded,
//! and a full queue stops the reader (back-pressure on the agent), answers included.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::lines::{BoundedLines, Line};

/// The longest line read. Codex sends a resumed thread's whole history in one answer;
/// multica had to raise its own bound to 32 MiB for that.
pub const MAX_LINE: usize = 64 * 1024 * 1024;
/// Notifications and server requests waiting for the owner.
const INCOMING_QUEUE: usize = 256;

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
type Pending = HashMap<u64, (String, oneshot::Sender<Result<Value, RpcError>>)>;

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

impl RpcClient {
    /// Start the task over `reader` (the agent's stdout) and `writer` (its stdin). The
    /// receiver yields what the agent sends, and ends when its stdout does.
    pub fn start<R, W>(
        reader: R,
        writer: W,
        dialect: Dialect,
    ) -> (RpcClient, mpsc::Receiver<Incoming>, Arc<Skipped>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, cmds) = mpsc::channel(256);
        let (incoming_tx, incoming) = mpsc::channel(INCOMING_QUEUE);
        let skipped = Arc::new(Skipped::default());
        tokio::spawn(run(
            reader,
            writer,
            dialect,
            cmds,
            out.clone(),
            incoming_tx,
            skipped.clone(),
        ));
        (
            RpcClient {
                out,
                next_id: Arc::new(AtomicU64::new(1)),
            },
            incoming,
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

async fn run<R, W>(
    reader: R,
    mut writer: W,
    dialect: Dialect,
    mut cmds: mpsc::Receiver<Cmd>,
    out: mpsc::Sender<Cmd>,
    incoming: mpsc::Sender<Incoming>,
    skipped: Arc<Skipped>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = BoundedLines::new(reader, MAX_LINE);
    let mut pending = Pending::new();
    let mut writable = true;
    loop {
        tokio::select! {
            cmd = cmds.recv() => {
                let Some(cmd) = cmd else { break };
                match cmd {
                    Cmd::Request { id, method, params, reply } => {
                        let line = message(dialect, object(&[("id", json!(id)), ("method", json!(method)), ("params", params)]));
                        if writable && write(&mut writer, &line).await {
                            pending.insert(id, (method, reply));
                        } else {
                            writable = false;
                            let _caller_gone = reply.send(Err(RpcError::NotSent { method }));
                        }
                    }
                    Cmd::Notify { method, params, sent } => {
                        let line = message(dialect, object(&[("method", json!(method)), ("params", params)]));
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
                        pending.remove(&id);
                    }
                }
            }
            line = lines.next_line() => match line {
                Ok(Some(Line::Text(line))) => {
                    if !route(&line, &mut pending, &out, &incoming, &skipped).await {
                        break;
                    }
                }
                Ok(Some(Line::TooLong)) => {
                    skipped.too_long.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(max = MAX_LINE, "skipped an over-long line from the agent");
                }
                Ok(Some(Line::NotUtf8)) => {
                    skipped.not_json.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "agent stdout failed");
                    break;
                }
            },
        }
    }
    // The agent's stdout ended: whatever was sent has no answer coming.
    for (_, (method, reply)) in pending.drain() {
        let _caller_gone = reply.send(Err(RpcError::NoAnswer { method }));
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

/// Route one line; `false` when the owner is gone (stop reading).
async fn route(
    line: &str,
    pending: &mut Pending,
    out: &mpsc::Sender<Cmd>,
    incoming: &mpsc::Sender<Incoming>,
    skipped: &Skipped,
) -> bool {
    let Ok(Value::Object(mut msg)) = serde_json::from_str::<Value>(line) else {
        skipped.not_json.fetch_add(1, Ordering::Relaxed);
        let head: String = line.chars().take(120).collect();
        tracing::debug!(line = %head, "skipped a line that is not a JSON object");
        return true;
    };
    let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
    let id = msg.remove("id");
    let params = msg.remove("params").unwrap_or(Value::Null);
    match (method, id) {
        (Some(method), Some(id)) if !id.is_null() => incoming
            .send(Incoming::Request(ServerRequest {
                id,
                method,
                params,
                out: Some(out.clone()),
            }))
            .await
            .is_ok(),
        (Some(method), _) => incoming
            .send(Incoming::Notification { method, params })
            .await
            .is_ok(),
        (None, Some(id)) => {
            let Some((method, reply)) = id.as_u64().and_then(|id| pending.remove(&id)) else {
                skipped.unknown_id.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%id, "an answer to no request of ours; skipped");
                return true;
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
            true
        }
        (None, None) => {
            skipped.not_json.fetch_add(1, Ordering::Relaxed);
            true
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
        mpsc::Receiver<Incoming>,
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
        let (client, _incoming, skipped, mut sent, mut agent) = wired();
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
        assert_eq!(call.await.unwrap().unwrap()["turn"]["id"], "t");
        approval.respond(json!({"decision": "accept"}));
        assert_eq!(
            next_sent(&mut sent).await,
            json!({"id": 0, "result": {"decision": "accept"}})
        );
        // Dropped unanswered: method not found, so the agent never waits.
        match incoming.recv().await.unwrap() {
            Incoming::Request(r) => drop(r),
            other => panic!("{other:?}"),
        }
        let refused = next_sent(&mut sent).await;
        assert_eq!(refused["id"], 1);
        assert_eq!(refused["error"]["code"], METHOD_NOT_FOUND);
    }

    #[tokio::test]
    async fn a_forty_mib_line_is_read_whole() {
        let (client, _incoming, _skipped, mut sent, mut agent) = wired();
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
        assert!(matches!(
            call.await.unwrap(),
            Err(RpcError::NoAnswer { .. })
        ));
        assert!(incoming.recv().await.is_none(), "the stream ends");
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
