//! The project's own mock model server on 127.0.0.1, with scripted replies, for driving the
//! real agent CLIs offline: the Anthropic Messages API (`POST /v1/messages`, for `claude`), the
//! OpenAI Responses API (`POST /v1/responses`, for `codex`), the OpenAI Chat Completions API
//! (`POST /v1/chat/completions`, for Qwen Code) and the Gemini API
//! (`POST /v1beta/models/<model>:generateContent` and `:streamGenerateContent?alt=sse`, for the
//! Gemini CLI), streaming SSE where the client asks for it. Stateless: each reply is decided
//! from the conversation in the request, so history continuity is checkable (`[user turns
//! seen: N; first: …]`; only the prompts the user typed count, not the context the CLIs add as
//! user messages, such as Codex's `<environment_context>` or Gemini's `<session_context>`).
//!
//! Scripts, by the text of the last user message:
//! - plain text → `echo: <text> [user turns seen: N; first: <first user text>]` (a message
//!   Claude Code injects into a running turn, a `system`-role "The user sent a new message
//!   while you were working" in `messages`, counts as a user text);
//! - `TOOLCALL` (optionally ``TOOLCALL `cmd` ``) → a shell tool call (Claude `Bash`, Codex
//!   `exec_command`, Qwen and Gemini `run_shell_command`), then, once the tool result comes
//!   back, `tool said: <result>`;
//!   ``TOOLCALL ESCALATE `cmd` `` has the Codex call ask for
//!   `sandbox_permissions: require_escalated` (so app-server asks the client to approve it);
//! - `MCPCALL <tool> <rest>` → a call of the first tool in the request's tool list whose name
//!   ends with `<tool>` (Claude names MCP tools `mcp__<server>__<tool>`; Codex offers them as
//!   the namespace `mcp__<server>`, read here as `mcp__<server>__<tool>` and called by
//!   `namespace` and `name`), input `{"text": "<rest>"}`, then, once the tool result comes
//!   back, `tool said: <result>`; no such tool → the text
//!   `MCPCALL: no tool named *<tool> in [<names>]` (Anthropic Messages and Responses APIs);
//! - `THINK` → a thinking block (Codex: a reasoning summary; Gemini: a thought part), then the
//!   echo;
//! - `SLOW` → 40 text chunks 250 ms apart (something to cancel);
//! - `STREAM <n> <ms> <tag>` → `n` text chunks `<tag>.<i> `, `ms` apart (Responses API: the
//!   time each chunk is written is kept once [`log_chunk_writes`] is called, for latency
//!   benchmarks that match what a client receives to when the mock wrote it);
//! - `MARKDOWN` → a markdown answer (a heading, bold text, a list, a fenced code block) in 12
//!   chunks 120 ms apart (something for a renderer to show while it streams);
//! - `FAIL500` → HTTP 500 with an API error body;
//! - `FAIL429` → HTTP 429, the vendor's rate-limit error (Anthropic `rate_limit_error`, OpenAI
//!   `rate_limit_exceeded`, Gemini `RESOURCE_EXHAUSTED`), with `retry-after: 0` and
//!   `x-should-retry: false` (the Anthropic and OpenAI SDKs then do not retry it);
//! - `FAIL401` → HTTP 401, the vendor's authentication error (Anthropic
//!   `authentication_error`, OpenAI `invalid_api_key`, Gemini `UNAUTHENTICATED`);
//! - `OVERFLOW` → HTTP 400 `prompt is too long` (context exhausted; Codex: code
//!   `context_length_exceeded`; Gemini: `INVALID_ARGUMENT`, "The input token count … exceeds
//!   the maximum …");
//! - `CUTSTREAM` → a 200 reply that starts like any other (headers, then the vendor's first
//!   events with the text `partial `), then the connection closes mid-body: the body is sent
//!   with chunked transfer encoding and its last chunk never comes, so the client sees a broken
//!   stream, not one that ended cleanly.
//!
//! JSON-mode side calls (Qwen's `response_format`, Gemini's `responseMimeType:
//! application/json`, as the Gemini CLI's `auto` model router sends) get the smallest value
//! that fits their schema, whatever their text says.
//!
//! Every request body is kept in [`MockModel::bodies`] (what the model was shown).
//!
//! Anything else: `GET /v1/models` → an empty model list, any other `GET`/`HEAD` → `{}`,
//! `POST /v1/messages/count_tokens` → 10 tokens, Gemini `:countTokens` → 10 tokens, other
//! paths → 404.
//!
//! A hand-written HTTP/1.1 responder is enough here (one request per connection, then close):
//! this is a test fixture, and keeping it free of an HTTP stack keeps the test build small.

#![allow(dead_code, reason = "each test binary uses part of this")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Message ids, unique per reply as the real API's are.
static MESSAGES: AtomicUsize = AtomicUsize::new(1);

fn message_id() -> String {
    format!("msg_mock_{:04}", MESSAGES.fetch_add(1, Ordering::Relaxed))
}
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The write time of each Responses API text chunk, by its text, once switched on.
static CHUNK_WRITES: std::sync::OnceLock<std::sync::Mutex<Vec<(String, std::time::Instant)>>> =
    std::sync::OnceLock::new();

/// Keep the time each Responses API text chunk is written from now on (taken right after
/// the write), for [`take_chunk_writes`].
pub fn log_chunk_writes() {
    CHUNK_WRITES.get_or_init(Default::default);
}

/// The chunks written since the last call, with their write times.
pub fn take_chunk_writes() -> Vec<(String, std::time::Instant)> {
    CHUNK_WRITES
        .get()
        .and_then(|log| log.lock().ok().map(|mut l| std::mem::take(&mut *l)))
        .unwrap_or_default()
}

/// A running mock; dropped, it stops accepting.
pub struct MockModel {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    /// Every request body that parsed as JSON, in arrival order (what the model was shown).
    pub bodies: Arc<std::sync::Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockModel {
    /// Serve on `127.0.0.1:port` (0: any free port).
    pub async fn start(port: u16) -> std::io::Result<MockModel> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = bodies.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::Relaxed);
                let log = log.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, log).await;
                });
            }
        });
        Ok(MockModel {
            addr,
            requests,
            bodies,
            task,
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn serve(stream: TcpStream, log: Arc<std::sync::Mutex<Vec<Value>>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            content_length = value.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
    }
    let mut body = vec![0u8; content_length.min(64 * 1024 * 1024)];
    reader.read_exact(&mut body).await?;
    if let Ok(json) = serde_json::from_slice::<Value>(&body) {
        log.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(json);
    }
    let mut stream = reader.into_inner();
    let request_line = head.lines().next().unwrap_or_default().to_owned();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    if method == "GET" && path.starts_with("/v1/models") {
        let models = r#"{"object":"list","data":[],"models":[]}"#;
        return respond(&mut stream, 200, "application/json", models).await;
    }
    if method == "HEAD" || method == "GET" {
        return respond(&mut stream, 200, "application/json", "{}").await;
    }
    if path.contains("/models/") && path.contains(':') {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        return gemini::serve(&mut stream, path, &request).await;
    }
    if path.starts_with("/v1/responses") {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        return responses::serve(&mut stream, &request).await;
    }
    if path.starts_with("/v1/chat/completions") {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        return chat::serve(&mut stream, &request).await;
    }
    if path.starts_with("/v1/messages/count_tokens") {
        return respond(
            &mut stream,
            200,
            "application/json",
            r#"{"input_tokens":10}"#,
        )
        .await;
    }
    if !path.starts_with("/v1/messages") {
        return respond(
            &mut stream,
            404,
            "application/json",
            r#"{"error":"not found"}"#,
        )
        .await;
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = script(&request);
    match reply {
        Reply::Error(status, message) => {
            let kind = match status {
                400 => "invalid_request_error",
                401 => "authentication_error",
                429 => "rate_limit_error",
                _ => "api_error",
            };
            let body = json!({"type": "error", "error": {"type": kind, "message": message}});
            respond_error(&mut stream, status, &body).await
        }
        Reply::Cut(text) => {
            let frames = [
                sse_frame(
                    "message_start",
                    &json!({"type": "message_start", "message": {
                        "id": message_id(), "type": "message", "role": "assistant",
                        "model": model_of(&request), "content": [], "stop_reason": null,
                        "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}
                    }}),
                ),
                sse_frame(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                sse_frame(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                ),
            ];
            cut_off(&mut stream, "text/event-stream", &frames.concat()).await
        }
        Reply::Blocks(blocks, delay) => {
            if request["stream"] == true {
                stream_sse(&mut stream, &request, &blocks, delay).await
            } else {
                let content: Vec<Value> = blocks.iter().map(Block::whole).collect();
                let stop = if blocks.iter().any(|b| matches!(b, Block::Tool { .. })) {
                    "tool_use"
                } else {
                    "end_turn"
                };
                let body = json!({
                    "id": message_id(), "type": "message", "role": "assistant",
                    "model": model_of(&request), "content": content,
                    "stop_reason": stop, "stop_sequence": null,
                    "usage": {"input_tokens": 10, "output_tokens": 5}
                });
                respond(&mut stream, 200, "application/json", &body.to_string()).await
            }
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    kind: &str,
    body: &str,
) -> std::io::Result<()> {
    respond_with(stream, status, kind, "", body).await
}

/// A whole reply; `extra` is more header lines, each ending in `\r\n`.
async fn respond_with(
    stream: &mut TcpStream,
    status: u16,
    kind: &str,
    extra: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        _ => "Internal Server Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// An API error reply. A 429 says to retry at once (`retry-after: 0`) and not at all
/// (`x-should-retry: false`, which the Anthropic and OpenAI SDKs obey), so a client fails fast
/// instead of backing off.
async fn respond_error(stream: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let extra = if status == 429 {
        "retry-after: 0\r\nx-should-retry: false\r\n"
    } else {
        ""
    };
    respond_with(stream, status, "application/json", extra, &body.to_string()).await
}

/// A 200 reply that is cut off: `first` goes out as the first chunk of a chunked body, then
/// the connection closes without the last chunk, so the client sees an unfinished body. There
/// is no `connection: close`: with it, Node's fetch (undici) takes the close as the end of the
/// body, and the Gemini CLI reads a stream that just stopped. The pause lets the client take
/// in the first chunk before the close.
async fn cut_off(stream: &mut TcpStream, kind: &str, first: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let chunk = format!("{:x}\r\n{first}\r\n", first.len());
    stream.write_all(chunk.as_bytes()).await?;
    stream.flush().await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.shutdown().await
}

/// One Anthropic SSE event.
fn sse_frame(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// The smallest JSON value a schema accepts: the first `enum` value (or `anyOf`/`oneOf`
/// choice), the required properties only, `minItems` items, `minLength` characters, and
/// `minimum` for numbers, else `least`. Type names are read in any case (Gemini's say
/// `OBJECT`, `INTEGER`).
fn smallest(schema: &Value, least: i64) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(first) = schema[key].as_array().and_then(|c| c.first()) {
            return smallest(first, least);
        }
    }
    let kind = match &schema["type"] {
        Value::String(kind) => kind.to_ascii_lowercase(),
        Value::Array(kinds) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|k| !k.eq_ignore_ascii_case("null"))
            .unwrap_or("null")
            .to_ascii_lowercase(),
        _ => String::new(),
    };
    let at_least = |key: &str| schema[key].as_u64().unwrap_or(0) as usize;
    match kind.as_str() {
        "object" => {
            let required: Vec<&str> = schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut out = serde_json::Map::new();
            if let Some(props) = schema["properties"].as_object() {
                for (name, prop) in props {
                    if required.contains(&name.as_str()) {
                        out.insert(name.clone(), smallest(prop, least));
                    }
                }
            }
            Value::Object(out)
        }
        "array" => json!(vec![
            smallest(&schema["items"], least);
            at_least("minItems")
        ]),
        "string" => json!("a".repeat(at_least("minLength"))),
        "number" | "integer" => schema.get("minimum").cloned().unwrap_or(json!(least)),
        "boolean" => json!(false),
        _ => Value::Null,
    }
}

/// Whether a user-role text is a whole `<tag>…</tag>` block, the shape of the context the
/// CLIs add as user messages (`<environment_context>`, `<session_context>`, …), not a prompt.
fn tag_block(text: &str) -> bool {
    let text = text.trim();
    let tag = text
        .strip_prefix('<')
        .and_then(|rest| rest.split_once('>'))
        .map_or("", |(tag, _)| tag);
    !tag.is_empty()
        && tag.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        && text.ends_with(&format!("</{tag}>"))
}

#[derive(Debug, Clone)]
enum Block {
    Text(Vec<String>),
    Thinking(String),
    /// A shell command; `escalate` asks to run it outside the sandbox (Codex only). With
    /// `call`, a call of that tool instead (`MCPCALL`).
    Tool {
        id: String,
        command: String,
        escalate: bool,
        call: Option<Call>,
    },
}

/// A call of a tool the request offered, by its name there, with these arguments.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    input: Value,
}

/// The `MCPCALL <tool> <rest>` script, given the names of the tools the request offered: a
/// call of the first whose name ends with `<tool>`, input `{"text": "<rest>"}`. `None` when
/// the text is not an MCPCALL.
fn mcp_call(tools: &[String], text: &str, id: String) -> Option<Reply> {
    let line = text.lines().rev().find(|l| l.contains("MCPCALL"))?;
    let after = line.split_once("MCPCALL")?.1.trim();
    let (tool, rest) = after.split_once(char::is_whitespace).unwrap_or((after, ""));
    let Some(name) = tools
        .iter()
        .find(|name| !tool.is_empty() && name.ends_with(tool))
    else {
        let said = format!("MCPCALL: no tool named *{tool} in [{}]", tools.join(", "));
        return Some(Reply::Blocks(vec![Block::Text(vec![said])], Duration::ZERO));
    };
    Some(Reply::Blocks(
        vec![
            Block::Text(vec!["Calling it.".into()]),
            Block::Tool {
                id,
                command: String::new(),
                escalate: false,
                call: Some(Call {
                    name: name.clone(),
                    input: json!({"text": rest.trim()}),
                }),
            },
        ],
        Duration::ZERO,
    ))
}

impl Block {
    fn whole(&self) -> Value {
        match self {
            Block::Text(chunks) => json!({"type": "text", "text": chunks.concat()}),
            Block::Thinking(text) => {
                json!({"type": "thinking", "thinking": text, "signature": "mock"})
            }
            Block::Tool {
                id, command, call, ..
            } => {
                let (name, input) = anthropic_call(command, call.as_ref());
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
        }
    }
}

enum Reply {
    Blocks(Vec<Block>, Duration),
    Error(u16, String),
    /// Start streaming this text, then cut the connection.
    Cut(String),
}

/// An Anthropic `tool_use`'s name and input: `Bash` running the command, or the call.
fn anthropic_call(command: &str, call: Option<&Call>) -> (String, Value) {
    match call {
        Some(call) => (call.name.clone(), call.input.clone()),
        None => (
            "Bash".to_owned(),
            json!({"command": command, "description": "run a command"}),
        ),
    }
}

fn model_of(request: &Value) -> String {
    request["model"].as_str().unwrap_or("mock-model").to_owned()
}

/// The text of a message's content (a string, or the text blocks of an array), skipping the
/// `<system-reminder>` blocks Claude Code adds, and the record of a `/model` command it adds
/// after a `set_model` control request (`<local-command-caveat>`, `<command-name>`,
/// `<local-command-stdout>`).
fn text_of(content: &Value) -> String {
    let added = |t: &str| {
        let t = t.trim_start();
        ["<system-reminder>", "<local-command-", "<command-name>"]
            .iter()
            .any(|tag| t.starts_with(tag))
    };
    match content {
        Value::String(s) if added(s) && !s.trim_start().starts_with("<system-reminder>") => {
            String::new()
        }
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .filter(|t| !added(t))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The text of a message Claude Code wrote while a turn ran, as it puts it into that turn's
/// next request: a `system`-role message in `messages` ("The user sent a new message while
/// you were working:\n<text>\n\nIMPORTANT: …").
fn injected_text(message: &Value) -> Option<String> {
    const HEAD: &str = "The user sent a new message while you were working:\n";
    let text = text_of(&message["content"]);
    let rest = text.strip_prefix(HEAD)?;
    let end = rest.find("\n\nIMPORTANT:").unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

fn script(request: &Value) -> Reply {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    // A message injected into the running turn counts as the user's.
    let user_texts: Vec<String> = messages
        .iter()
        .filter_map(|m| match m["role"].as_str() {
            Some("user") => Some(text_of(&m["content"])),
            Some("system") => injected_text(m),
            _ => None,
        })
        .filter(|t| !t.is_empty())
        .collect();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    let tool_result = last["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_result").cloned())
        .map(|result| match &result["content"] {
            Value::String(s) => s.clone(),
            other => text_of(other),
        });
    if tool_result.is_none() {
        let tools: Vec<String> = request["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let id = format!("toolu_mock_mcp_{}", user_texts.len());
        if let Some(reply) = mcp_call(&tools, user_texts.last().map_or("", |t| t), id) {
            return reply;
        }
    }
    decide(&user_texts, tool_result)
}

/// The reply to a conversation, from its user prompts (oldest first) and, when the last thing
/// in it is a tool result, that result. Shared by all the APIs.
fn decide(user_texts: &[String], tool_result: Option<String>) -> Reply {
    // A tool result coming back: finish the turn with what the tool said.
    if let Some(said) = tool_result {
        return Reply::Blocks(
            vec![Block::Text(vec![format!("tool said: {}", said.trim())])],
            Duration::ZERO,
        );
    }
    let text = user_texts.last().cloned().unwrap_or_default();
    let first = user_texts.first().cloned().unwrap_or_default();
    let echo = format!(
        "echo: {} [user turns seen: {}; first: {}]",
        text.trim(),
        user_texts.len(),
        first.trim()
    );
    // The failure scripts look at the last line only: a CLI that merges a prompt that got no
    // answer into the next user message (Claude does) gets the next prompt's reply.
    let last_line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    if last_line.contains("FAIL500") {
        return Reply::Error(500, "mock: internal error".into());
    }
    if last_line.contains("FAIL429") {
        return Reply::Error(429, "mock: rate limit exceeded".into());
    }
    if last_line.contains("FAIL401") {
        return Reply::Error(401, "mock: invalid API key".into());
    }
    if last_line.contains("CUTSTREAM") {
        return Reply::Cut("partial ".into());
    }
    if last_line.contains("OVERFLOW") {
        return Reply::Error(
            400,
            "prompt is too long: 250000 tokens > 200000 maximum".into(),
        );
    }
    if text.contains("TOOLCALL") {
        let command = text
            .split('`')
            .nth(1)
            .map_or_else(|| "echo hi".to_owned(), str::to_owned);
        return Reply::Blocks(
            vec![
                Block::Text(vec!["Running it.".into()]),
                Block::Tool {
                    id: format!("toolu_mock_{}", user_texts.len()),
                    command,
                    escalate: text.contains("ESCALATE"),
                    call: None,
                },
            ],
            Duration::ZERO,
        );
    }
    if let Some(rest) = last_line.trim().strip_prefix("STREAM ") {
        let mut args = rest.split_whitespace();
        let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
        let ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
        let tag = args.next().unwrap_or("c");
        let chunks = (0..n).map(|i| format!("{tag}.{i} ")).collect();
        return Reply::Blocks(vec![Block::Text(chunks)], Duration::from_millis(ms));
    }
    if text.contains("SLOW") {
        let chunks = (0..40).map(|i| format!("slow {i} ")).collect();
        return Reply::Blocks(vec![Block::Text(chunks)], Duration::from_millis(250));
    }
    if text.contains("MARKDOWN") {
        let chunks = [
            "## Result\n\n",
            "Here is ",
            "**bold** ",
            "text and ",
            "a list:\n\n",
            "- one\n",
            "- two\n\n",
            "```rust\n",
            "fn main() ",
            "{}\n",
            "```",
            "\n",
        ];
        return Reply::Blocks(
            vec![Block::Text(chunks.map(str::to_owned).to_vec())],
            Duration::from_millis(120),
        );
    }
    let words: Vec<String> = echo.split_inclusive(' ').map(str::to_owned).collect();
    if text.contains("THINK") {
        return Reply::Blocks(
            vec![
                Block::Thinking("Let me think about it.".into()),
                Block::Text(words),
            ],
            Duration::ZERO,
        );
    }
    Reply::Blocks(vec![Block::Text(words)], Duration::ZERO)
}

async fn stream_sse(
    stream: &mut TcpStream,
    request: &Value,
    blocks: &[Block],
    delay: Duration,
) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await?;
    let mut send = async |event: &str, data: Value| -> std::io::Result<()> {
        stream.write_all(sse_frame(event, &data).as_bytes()).await?;
        stream.flush().await
    };
    send(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": message_id(), "type": "message", "role": "assistant", "model": model_of(request),
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1}
        }}),
    )
    .await?;
    let mut output_tokens = 1;
    for (index, block) in blocks.iter().enumerate() {
        match block {
            Block::Text(chunks) => {
                send("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})).await?;
                for chunk in chunks {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    output_tokens += 1;
                    send("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": chunk}})).await?;
                }
            }
            Block::Thinking(text) => {
                send("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}})).await?;
                send("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": text}})).await?;
                send("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": "mock"}})).await?;
            }
            Block::Tool {
                id, command, call, ..
            } => {
                let (name, input) = anthropic_call(command, call.as_ref());
                send("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})).await?;
                let input = input.to_string();
                let middle = input
                    .char_indices()
                    .nth(input.chars().count() / 2)
                    .map_or(0, |(i, _)| i);
                let (a, b) = input.split_at(middle);
                for part in [a, b] {
                    send("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": part}})).await?;
                }
            }
        }
        send(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
        .await?;
    }
    let stop = if blocks.iter().any(|b| matches!(b, Block::Tool { .. })) {
        "tool_use"
    } else {
        "end_turn"
    };
    send("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}})).await?;
    send("message_stop", json!({"type": "message_stop"})).await?;
    stream.shutdown().await
}

/// The OpenAI Responses API (`POST /v1/responses`), as Codex (`wire_api = "responses"`) uses
/// it: the conversation is the `input` array, tool results come back as
/// `function_call_output` items, and the reply streams as `response.*` SSE events whose `type`
/// is repeated in each data object (Codex reads it from there).
mod responses {
    use super::{
        Block, Call, Reply, cut_off, decide, mcp_call, model_of, respond, respond_error, tag_block,
    };
    use serde_json::{Value, json};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    /// Response and item ids, unique per reply.
    static IDS: AtomicUsize = AtomicUsize::new(1);

    fn next_id(prefix: &str) -> String {
        format!("{prefix}_mock_{:04}", IDS.fetch_add(1, Ordering::Relaxed))
    }

    /// Codex's shell tool with fallback model metadata: `exec_command {cmd, ...}`.
    const SHELL_TOOL: &str = "exec_command";

    pub(super) async fn serve(stream: &mut TcpStream, request: &Value) -> std::io::Result<()> {
        match script(request) {
            Reply::Error(status, message) => {
                respond_error(stream, status, &error_body(status, &message)).await
            }
            Reply::Cut(text) => {
                let id = next_id("resp");
                let item = item(&Block::Text(vec![text.clone()]), request);
                let at = json!({"output_index": 0, "item_id": item["id"], "content_index": 0});
                let empty = json!({"type": "output_text", "text": "", "annotations": []});
                let created = response(request, &id, "in_progress", Vec::new());
                let frames = [
                    frame("created", &json!({}), "response", created),
                    frame(
                        "output_item.added",
                        &json!({"output_index": 0}),
                        "item",
                        started(&item),
                    ),
                    frame("content_part.added", &at, "part", empty),
                    frame("output_text.delta", &at, "delta", json!(text)),
                ];
                cut_off(stream, "text/event-stream", &frames.concat()).await
            }
            Reply::Blocks(blocks, delay) if request["stream"] == true => {
                stream_sse(stream, request, &blocks, delay).await
            }
            Reply::Blocks(blocks, _) => {
                let output: Vec<Value> = blocks.iter().map(|b| item(b, request)).collect();
                let body = response(request, &next_id("resp"), "completed", output);
                respond(stream, 200, "application/json", &body.to_string()).await
            }
        }
    }

    /// An OpenAI error body (Responses and Chat Completions alike); a 400 here is the context
    /// overflow, which Codex recognises by its code (`contextWindowExceeded`).
    pub(super) fn error_body(status: u16, message: &str) -> Value {
        let (kind, code) = match status {
            400 => ("invalid_request_error", "context_length_exceeded"),
            401 => ("invalid_request_error", "invalid_api_key"),
            429 => ("requests", "rate_limit_exceeded"),
            _ => ("server_error", "server_error"),
        };
        json!({"error": {"type": kind, "code": code, "message": message, "param": null}})
    }

    /// The reply, from the prompts the user typed and the last tool result if no prompt
    /// follows it.
    fn script(request: &Value) -> Reply {
        let input = match &request["input"] {
            Value::Array(items) => items.clone(),
            Value::String(text) => vec![json!({"role": "user", "content": text})],
            _ => Vec::new(),
        };
        let mut user_texts = Vec::new();
        let mut tool_result = None;
        for entry in &input {
            if entry["type"] == "function_call_output" {
                tool_result = Some(output_text(&entry["output"]));
            } else if entry["role"] == "user" {
                let text = prompt_text(&entry["content"]);
                if !text.is_empty() {
                    user_texts.push(text);
                    tool_result = None;
                }
            }
        }
        if tool_result.is_none() {
            let id = format!("call_mock_mcp_{}", user_texts.len());
            let last = user_texts.last().map_or("", String::as_str);
            if let Some(reply) = mcp_call(&tool_names(request), last, id) {
                return reply;
            }
        }
        decide(&user_texts, tool_result)
    }

    /// The names of the tools a request offers: a function's name, and each function of a
    /// namespace as `<namespace>__<name>` (Codex offers an MCP server's tools as the namespace
    /// `mcp__<server>`, so its tool reads `mcp__<server>__<tool>`, as Claude names it).
    fn tool_names(request: &Value) -> Vec<String> {
        let mut names = Vec::new();
        for tool in request["tools"].as_array().into_iter().flatten() {
            let name = tool["name"].as_str().unwrap_or_default();
            if tool["type"] == "namespace" {
                for inner in tool["tools"].as_array().into_iter().flatten() {
                    if let Some(inner) = inner["name"].as_str() {
                        names.push(format!("{name}__{inner}"));
                    }
                }
            } else if !name.is_empty() {
                names.push(name.to_owned());
            }
        }
        names
    }

    /// A call's `namespace` and `name` as a `function_call` item names them: a namespace's
    /// function by both (Codex finds an MCP tool only so), else the name alone.
    fn call_name(request: &Value, call: &Call) -> (Option<String>, String) {
        for tool in request["tools"].as_array().into_iter().flatten() {
            let (Some(space), true) = (tool["name"].as_str(), tool["type"] == "namespace") else {
                continue;
            };
            for inner in tool["tools"].as_array().into_iter().flatten() {
                if let Some(inner) = inner["name"].as_str()
                    && call.name == format!("{space}__{inner}")
                {
                    return (Some(space.to_owned()), inner.to_owned());
                }
            }
        }
        (None, call.name.clone())
    }

    /// The text a user typed in a user message, skipping the parts Codex adds itself (and
    /// the `<image name=…>` / `</image>` texts it puts around an attached image).
    fn prompt_text(content: &Value) -> String {
        match content {
            Value::String(s) if !codex_context(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter(|p| p["type"] == "input_text")
                .filter_map(|p| p["text"].as_str())
                .filter(|t| !codex_context(t) && !image_label(t))
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    }

    /// Whether a user-role text is context Codex adds, not a prompt: a whole `<tag>…</tag>`
    /// block (`<environment_context>`, `<turn_aborted>` after an interrupt, …) or the
    /// `# AGENTS.md instructions for <dir>` block.
    fn codex_context(text: &str) -> bool {
        text.trim().starts_with("# AGENTS.md") || tag_block(text)
    }

    /// The texts Codex puts around an image input: `<image name=[Image #1] path="…">` and
    /// `</image>`.
    fn image_label(text: &str) -> bool {
        let text = text.trim();
        text.starts_with("<image ") || text == "</image>"
    }

    /// A `function_call_output`'s output: a string, or content items with text (an MCP
    /// tool's, as Codex gives it, starts with a `Wall time: … Output:` part, left out).
    fn output_text(output: &Value) -> String {
        match output {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .filter(|t| !t.starts_with("Wall time:"))
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    }

    /// `exec_command`'s arguments; escalated, app-server asks the client before running it.
    fn arguments(command: &str, escalate: bool) -> String {
        let mut args = json!({"cmd": command});
        if escalate {
            args["sandbox_permissions"] = json!("require_escalated");
            args["justification"] = json!("The mock model asks to run this outside the sandbox.");
        }
        args.to_string()
    }

    /// A block as a finished output item.
    fn item(block: &Block, request: &Value) -> Value {
        match block {
            Block::Text(chunks) => json!({
                "type": "message", "id": next_id("msg"), "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": chunks.concat(), "annotations": []}]
            }),
            Block::Thinking(text) => json!({
                "type": "reasoning", "id": next_id("rs"),
                "summary": [{"type": "summary_text", "text": text}]
            }),
            Block::Tool {
                call: Some(call), ..
            } => {
                let (namespace, name) = call_name(request, call);
                let mut item = json!({
                    "type": "function_call", "id": next_id("fc"), "call_id": next_id("call"),
                    "name": name, "status": "completed", "arguments": call.input.to_string()
                });
                if let Some(namespace) = namespace {
                    item["namespace"] = json!(namespace);
                }
                item
            }
            Block::Tool {
                command, escalate, ..
            } => json!({
                "type": "function_call", "id": next_id("fc"), "call_id": next_id("call"),
                "name": SHELL_TOOL, "status": "completed",
                "arguments": arguments(command, *escalate)
            }),
        }
    }

    /// The item as `response.output_item.added` announces it: same ids, nothing in it yet.
    fn started(item: &Value) -> Value {
        let mut item = item.clone();
        match item["type"].as_str() {
            Some("message") => item["content"] = json!([]),
            Some("reasoning") => item["summary"] = json!([]),
            _ => item["arguments"] = json!(""),
        }
        if item.get("status").is_some() {
            item["status"] = json!("in_progress");
        }
        item
    }

    fn response(request: &Value, id: &str, status: &str, output: Vec<Value>) -> Value {
        let output_tokens = output.len() + 1;
        json!({
            "id": id, "object": "response", "created_at": 0, "status": status,
            "model": model_of(request), "output": output,
            "usage": {
                "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 10 + output_tokens
            }
        })
    }

    /// One SSE event, `response.<kind>`, at a place in the output (`at`: output index, item
    /// id, part index), carrying `value` under `key`. The event name is repeated in the data's
    /// `type`, which is what Codex reads.
    fn frame(kind: &str, at: &Value, key: &str, value: Value) -> String {
        let mut data = at.clone();
        data["type"] = json!(format!("response.{kind}"));
        data[key] = value;
        format!("event: response.{kind}\ndata: {data}\n\n")
    }

    /// Send one event (see `frame`).
    async fn emit(
        stream: &mut TcpStream,
        kind: &str,
        at: &Value,
        key: &str,
        value: Value,
    ) -> std::io::Result<()> {
        stream
            .write_all(frame(kind, at, key, value).as_bytes())
            .await?;
        stream.flush().await
    }

    async fn stream_sse(
        stream: &mut TcpStream,
        request: &Value,
        blocks: &[Block],
        delay: Duration,
    ) -> std::io::Result<()> {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
        stream.write_all(head.as_bytes()).await?;
        let id = next_id("resp");
        let created = response(request, &id, "in_progress", Vec::new());
        emit(stream, "created", &json!({}), "response", created).await?;
        let mut output = Vec::new();
        for (index, block) in blocks.iter().enumerate() {
            let item = item(block, request);
            let at = json!({"output_index": index});
            emit(stream, "output_item.added", &at, "item", started(&item)).await?;
            let at = json!({"output_index": index, "item_id": item["id"]});
            match block {
                Block::Text(chunks) => stream_text(stream, &at, &item, chunks, delay).await?,
                Block::Thinking(text) => stream_summary(stream, &at, text).await?,
                Block::Tool { .. } => stream_arguments(stream, &at, &item).await?,
            }
            emit(stream, "output_item.done", &at, "item", item.clone()).await?;
            output.push(item);
        }
        let done = response(request, &id, "completed", output);
        emit(stream, "completed", &json!({}), "response", done).await?;
        stream.shutdown().await
    }

    async fn stream_text(
        stream: &mut TcpStream,
        at: &Value,
        item: &Value,
        chunks: &[String],
        delay: Duration,
    ) -> std::io::Result<()> {
        let mut at = at.clone();
        at["content_index"] = json!(0);
        let empty = json!({"type": "output_text", "text": "", "annotations": []});
        emit(stream, "content_part.added", &at, "part", empty).await?;
        for chunk in chunks {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            emit(stream, "output_text.delta", &at, "delta", json!(chunk)).await?;
            if let Some(log) = super::CHUNK_WRITES.get() {
                let written = std::time::Instant::now();
                if let Ok(mut log) = log.lock() {
                    log.push((chunk.clone(), written));
                }
            }
        }
        let text = json!(chunks.concat());
        emit(stream, "output_text.done", &at, "text", text).await?;
        let part = item["content"][0].clone();
        emit(stream, "content_part.done", &at, "part", part).await
    }

    async fn stream_summary(stream: &mut TcpStream, at: &Value, text: &str) -> std::io::Result<()> {
        let mut at = at.clone();
        at["summary_index"] = json!(0);
        let part = |text: &str| json!({"type": "summary_text", "text": text});
        let steps = [
            ("reasoning_summary_part.added", "part", part("")),
            ("reasoning_summary_text.delta", "delta", json!(text)),
            ("reasoning_summary_text.done", "text", json!(text)),
            ("reasoning_summary_part.done", "part", part(text)),
        ];
        for (kind, key, value) in steps {
            emit(stream, kind, &at, key, value).await?;
        }
        Ok(())
    }

    /// The call's arguments in two deltas, then whole.
    async fn stream_arguments(
        stream: &mut TcpStream,
        at: &Value,
        item: &Value,
    ) -> std::io::Result<()> {
        let arguments = item["arguments"].as_str().unwrap_or_default();
        let middle = arguments
            .char_indices()
            .nth(arguments.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        let (a, b) = arguments.split_at(middle);
        let steps = [
            ("function_call_arguments.delta", "delta", a),
            ("function_call_arguments.delta", "delta", b),
            ("function_call_arguments.done", "arguments", arguments),
        ];
        for (kind, key, value) in steps {
            emit(stream, kind, at, key, json!(value)).await?;
        }
        Ok(())
    }
}

/// The OpenAI Chat Completions API (`POST /v1/chat/completions`), as Qwen Code uses it: the
/// conversation is `messages`, a tool result is a `tool` message, the reply streams as
/// `chat.completion.chunk`s and `[DONE]`. A JSON-mode side call (`response_format` with a
/// schema) gets the smallest value that fits the schema.
mod chat {
    use super::{
        Block, Reply, cut_off, decide, model_of, respond, respond_error, smallest, text_of,
    };
    use serde_json::{Value, json};
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    /// The shell tool the request offers: Qwen's `run_shell_command {command}`, OpenCode's
    /// `bash {command}`.
    fn shell_tool(request: &Value) -> &'static str {
        let offered = |name: &str| {
            request["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == name))
        };
        if !offered("run_shell_command") && offered("bash") {
            "bash"
        } else {
            "run_shell_command"
        }
    }

    pub(super) async fn serve(stream: &mut TcpStream, request: &Value) -> std::io::Result<()> {
        if let Some(schema) = request.pointer("/response_format/json_schema/schema") {
            let text = smallest(schema, 0).to_string();
            return reply(stream, request, &[Block::Text(vec![text])], Duration::ZERO).await;
        }
        if request["response_format"]["type"] == "json_object" {
            return reply(
                stream,
                request,
                &[Block::Text(vec!["{}".into()])],
                Duration::ZERO,
            )
            .await;
        }
        match script(request) {
            Reply::Error(status, message) => {
                let body = super::responses::error_body(status, &message);
                respond_error(stream, status, &body).await
            }
            Reply::Cut(text) => {
                let frames = [
                    chunk(request, json!({"role": "assistant", "content": ""}), None),
                    chunk(request, json!({"content": text}), None),
                ];
                cut_off(stream, "text/event-stream", &frames.concat()).await
            }
            Reply::Blocks(blocks, delay) => reply(stream, request, &blocks, delay).await,
        }
    }

    fn script(request: &Value) -> Reply {
        let mut user_texts = Vec::new();
        let mut tool_result = None;
        for message in request["messages"].as_array().into_iter().flatten() {
            match message["role"].as_str() {
                Some("tool") => tool_result = Some(text_of(&message["content"])),
                Some("user") => {
                    let text = text_of(&message["content"]);
                    // Qwen's first user message is its own environment context.
                    let context = text.contains("setting up the context for our chat")
                        || text.trim_start().starts_with('<');
                    if !text.trim().is_empty() && !context {
                        user_texts.push(text);
                        tool_result = None;
                    }
                }
                _ => {}
            }
        }
        decide(&user_texts, tool_result)
    }

    fn chunk(request: &Value, delta: Value, finish: Option<&str>) -> String {
        let body = json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model_of(request),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        format!("data: {body}\n\n")
    }

    async fn reply(
        stream: &mut TcpStream,
        request: &Value,
        blocks: &[Block],
        delay: Duration,
    ) -> std::io::Result<()> {
        if request["stream"] != true {
            let mut content = String::new();
            let mut calls = Vec::new();
            for block in blocks {
                match block {
                    Block::Text(chunks) => content.push_str(&chunks.concat()),
                    Block::Thinking(_) => {}
                    Block::Tool { id, command, .. } => calls.push(json!({"id": id, "type": "function",
                        "function": {"name": shell_tool(request), "arguments": json!({"command": command}).to_string()}})),
                }
            }
            let mut message = json!({"role": "assistant", "content": content});
            if !calls.is_empty() {
                message["tool_calls"] = json!(calls);
            }
            let finish = if calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            let body = json!({"id": "chatcmpl-mock", "object": "chat.completion", "created": 0,
                "model": model_of(request), "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
            return respond(stream, 200, "application/json", &body.to_string()).await;
        }
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
        stream.write_all(head.as_bytes()).await?;
        stream
            .write_all(chunk(request, json!({"role": "assistant", "content": ""}), None).as_bytes())
            .await?;
        let mut tools = 0;
        for block in blocks {
            match block {
                Block::Text(chunks) => {
                    for piece in chunks {
                        stream
                            .write_all(chunk(request, json!({"content": piece}), None).as_bytes())
                            .await?;
                        stream.flush().await?;
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                    }
                }
                Block::Thinking(text) => {
                    stream
                        .write_all(
                            chunk(request, json!({"reasoning_content": text}), None).as_bytes(),
                        )
                        .await?;
                }
                Block::Tool { id, command, .. } => {
                    let call = json!({"tool_calls": [{"index": tools, "id": id, "type": "function",
                        "function": {"name": shell_tool(request), "arguments": json!({"command": command}).to_string()}}]});
                    stream
                        .write_all(chunk(request, call, None).as_bytes())
                        .await?;
                    tools += 1;
                }
            }
        }
        let finish = if tools > 0 { "tool_calls" } else { "stop" };
        stream
            .write_all(chunk(request, json!({}), Some(finish)).as_bytes())
            .await?;
        let usage = json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
            "model": model_of(request), "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
        stream
            .write_all(format!("data: {usage}\n\ndata: [DONE]\n\n").as_bytes())
            .await?;
        stream.flush().await
    }
}

/// The Gemini API (`POST /v1beta/models/<model>:generateContent`, and
/// `:streamGenerateContent?alt=sse`), as the Gemini CLI uses it with `GOOGLE_GEMINI_BASE_URL`:
/// the conversation is `contents` (roles `user` and `model`; a tool result is a
/// `functionResponse` part in a user content), the reply is a `GenerateContentResponse`, whole
/// or as SSE `data:` chunks of one part each, the last with `finishReason` and `usageMetadata`.
/// A JSON-mode call (`generationConfig.responseMimeType: application/json`; the `auto` model
/// router's, with `responseJsonSchema`) gets the smallest value that fits its schema.
mod gemini {
    use super::{Block, Reply, cut_off, decide, respond, respond_error, smallest, tag_block};
    use serde_json::{Value, json};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    /// The Gemini CLI's shell tool: `run_shell_command {command}`.
    const SHELL_TOOL: &str = "run_shell_command";

    /// Response ids, unique per reply.
    static IDS: AtomicUsize = AtomicUsize::new(1);

    /// The sections of the shell tool's result after `Output:` (the CLI's `llmContent`).
    const SECTIONS: [&str; 5] = [
        "Error: ",
        "Exit Code: ",
        "Signal: ",
        "Background PIDs: ",
        "Process Group PGID: ",
    ];

    pub(super) async fn serve(
        stream: &mut TcpStream,
        path: &str,
        request: &Value,
    ) -> std::io::Result<()> {
        // `/v1beta/models/<model>:<method>[?alt=sse]`
        let (model, method) = path
            .split_once("/models/")
            .and_then(|(_, rest)| rest.split('?').next())
            .and_then(|rest| rest.split_once(':'))
            .unwrap_or(("mock-model", ""));
        let streaming = method == "streamGenerateContent";
        if method == "countTokens" {
            let body = r#"{"totalTokens":10}"#;
            return respond(stream, 200, "application/json", body).await;
        }
        if !matches!(method, "generateContent" | "streamGenerateContent") {
            let body = json!({"error": {"code": 404, "message": "mock: no such method", "status": "NOT_FOUND"}});
            return respond_error(stream, 404, &body).await;
        }
        let config = &request["generationConfig"];
        let json_mode = config["responseMimeType"] == "application/json"
            || config.get("responseJsonSchema").is_some()
            || config.get("responseSchema").is_some();
        if json_mode {
            let schema = config
                .get("responseJsonSchema")
                .or_else(|| config.get("responseSchema"));
            // The router checks its `complexity_score` is 1 to 100, which its schema only says
            // in words: numbers start at 1 here.
            let text = schema
                .map_or_else(|| json!({}), |s| smallest(s, 1))
                .to_string();
            let blocks = [Block::Text(vec![text])];
            return reply(stream, model, streaming, &blocks, Duration::ZERO).await;
        }
        match script(request) {
            Reply::Error(status, message) => {
                respond_error(stream, status, &error_body(status, &message)).await
            }
            Reply::Cut(text) => {
                let first = chunk(model, &[json!({"text": text})], None);
                let first = if streaming {
                    format!("data: {first}\n\n")
                } else {
                    first.to_string()
                };
                cut_off(stream, "text/event-stream", &first).await
            }
            Reply::Blocks(blocks, delay) => reply(stream, model, streaming, &blocks, delay).await,
        }
    }

    /// A Google API error body. The 400 is the context overflow, in the API's own words.
    fn error_body(status: u16, message: &str) -> Value {
        let (code, message) = match status {
            400 => (
                "INVALID_ARGUMENT",
                "The input token count (250000) exceeds the maximum number of tokens allowed (200000).",
            ),
            401 => ("UNAUTHENTICATED", message),
            404 => ("NOT_FOUND", message),
            429 => ("RESOURCE_EXHAUSTED", message),
            _ => ("INTERNAL", message),
        };
        json!({"error": {"code": status, "message": message, "status": code}})
    }

    /// The reply, from the prompts the user typed (each text part of a user content that is
    /// not context the CLI adds) and the last function response if no prompt follows it.
    fn script(request: &Value) -> Reply {
        let mut user_texts = Vec::new();
        let mut tool_result = None;
        for content in request["contents"].as_array().into_iter().flatten() {
            let parts = content["parts"].as_array().map_or(&[][..], Vec::as_slice);
            for part in parts {
                if let Some(response) = part.get("functionResponse") {
                    tool_result = Some(tool_output(&response["response"]));
                }
            }
            if content["role"] != "user" {
                continue;
            }
            // A prompt interrupted before its answer is sent again with the next one, in the
            // same content: each text part is a prompt.
            for text in parts
                .iter()
                .filter(|p| p["thought"] != true)
                .filter_map(|p| p["text"].as_str())
            {
                if !text.trim().is_empty() && !gemini_context(text) {
                    user_texts.push(text.to_owned());
                    tool_result = None;
                }
            }
        }
        decide(&user_texts, tool_result)
    }

    /// Whether a user text part is context the CLI adds: the `<session_context>` block (date,
    /// OS, workspace tree) it puts before the first prompt, or a `<hook_context>`.
    fn gemini_context(text: &str) -> bool {
        tag_block(text)
    }

    /// What a tool said, from a function response: `{output}` or `{error}`. The shell tool's
    /// output is wrapped in `<untrusted_context>` and reads `Output: …`, then more sections
    /// (`Exit Code: …`, `Process Group PGID: …`); only the output is kept.
    fn tool_output(response: &Value) -> String {
        let text = response["output"]
            .as_str()
            .or_else(|| response["error"].as_str())
            .map_or_else(|| response.to_string(), str::to_owned);
        let inner = text
            .trim()
            .strip_prefix("<untrusted_context>")
            .and_then(|t| t.strip_suffix("</untrusted_context>"))
            .unwrap_or(&text);
        match inner.split_once("Output: ") {
            Some((_, rest)) => rest
                .lines()
                .take_while(|line| !SECTIONS.iter().any(|s| line.starts_with(s)))
                .collect::<Vec<_>>()
                .join("\n"),
            None => inner.to_owned(),
        }
    }

    /// A block as content parts: text, a thought, or a call of the shell tool.
    fn part(block: &Block) -> Value {
        match block {
            Block::Text(chunks) => json!({"text": chunks.concat()}),
            Block::Thinking(text) => json!({"text": text, "thought": true}),
            Block::Tool { command, .. } => {
                json!({"functionCall": {"name": SHELL_TOOL, "args": {"command": command}}})
            }
        }
    }

    /// A `GenerateContentResponse` with these parts; with a finish reason it is the last one
    /// and carries the usage.
    fn chunk(model: &str, parts: &[Value], finish: Option<&str>) -> Value {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        let mut body = json!({
            "candidates": [],
            "modelVersion": model,
            "responseId": format!("resp_mock_{:04}", IDS.fetch_add(1, Ordering::Relaxed)),
        });
        if let Some(finish) = finish {
            candidate["finishReason"] = json!(finish);
            body["usageMetadata"] = json!({
                "promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15
            });
        }
        body["candidates"] = json!([candidate]);
        body
    }

    async fn reply(
        stream: &mut TcpStream,
        model: &str,
        streaming: bool,
        blocks: &[Block],
        delay: Duration,
    ) -> std::io::Result<()> {
        if !streaming {
            let parts: Vec<Value> = blocks.iter().map(part).collect();
            let body = chunk(model, &parts, Some("STOP"));
            return respond(stream, 200, "application/json", &body.to_string()).await;
        }
        // One part per chunk: each text chunk of a block, a thought or a call whole.
        let pieces: Vec<Value> = blocks
            .iter()
            .flat_map(|block| match block {
                Block::Text(chunks) => chunks.iter().map(|c| json!({"text": c})).collect(),
                other => vec![part(other)],
            })
            .collect();
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
        stream.write_all(head.as_bytes()).await?;
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let finish = (i + 1 == pieces.len()).then_some("STOP");
            let data = chunk(model, std::slice::from_ref(piece), finish);
            stream
                .write_all(format!("data: {data}\n\n").as_bytes())
                .await?;
            stream.flush().await?;
        }
        stream.shutdown().await
    }
}
