//! The project's own mock model server: the Anthropic Messages API on 127.0.0.1, streaming
//! SSE, with scripted replies, for driving the real `claude` CLI offline. Stateless: each reply
//! is decided from the conversation in the request, so history continuity is checkable
//! (`[user turns seen: N; first: …]`).
//!
//! Scripts, by the text of the last user message:
//! - plain text → `echo: <text> [user turns seen: N; first: <first user text>]`;
//! - `TOOLCALL` (optionally ``TOOLCALL `cmd` ``) → a `Bash` tool call, then, once the tool
//!   result comes back, `tool said: <result>`;
//! - `THINK` → a thinking block, then the echo;
//! - `SLOW` → 40 text chunks 250 ms apart (something to cancel);
//! - `FAIL500` → HTTP 500 with an API error body;
//! - `OVERFLOW` → HTTP 400 `prompt is too long` (context exhausted).
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

/// A running mock; dropped, it stops accepting.
pub struct MockModel {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
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
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = serve(stream).await;
                });
            }
        });
        Ok(MockModel {
            addr,
            requests,
            task,
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn serve(stream: TcpStream) -> std::io::Result<()> {
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
    let mut stream = reader.into_inner();
    let request_line = head.lines().next().unwrap_or_default().to_owned();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    if method == "HEAD" || method == "GET" {
        return respond(&mut stream, 200, "application/json", "{}").await;
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
            let kind = if status == 400 {
                "invalid_request_error"
            } else {
                "api_error"
            };
            let body = json!({"type": "error", "error": {"type": kind, "message": message}});
            respond(&mut stream, status, "application/json", &body.to_string()).await
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
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Internal Server Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[derive(Debug, Clone)]
enum Block {
    Text(Vec<String>),
    Thinking(String),
    Tool { id: String, command: String },
}

impl Block {
    fn whole(&self) -> Value {
        match self {
            Block::Text(chunks) => json!({"type": "text", "text": chunks.concat()}),
            Block::Thinking(text) => {
                json!({"type": "thinking", "thinking": text, "signature": "mock"})
            }
            Block::Tool { id, command } => json!({
                "type": "tool_use", "id": id, "name": "Bash",
                "input": {"command": command, "description": "run a command"}
            }),
        }
    }
}

enum Reply {
    Blocks(Vec<Block>, Duration),
    Error(u16, String),
}

fn model_of(request: &Value) -> String {
    request["model"].as_str().unwrap_or("mock-model").to_owned()
}

/// The text of a message's content (a string, or the text blocks of an array), skipping the
/// `<system-reminder>` blocks Claude Code adds.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .filter(|t| !t.trim_start().starts_with("<system-reminder>"))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn script(request: &Value) -> Reply {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let user_texts: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| text_of(&m["content"]))
        .filter(|t| !t.is_empty())
        .collect();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    // A tool result coming back: finish the turn with what the tool said.
    if let Some(result) = last["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_result").cloned())
    {
        let said = match &result["content"] {
            Value::String(s) => s.clone(),
            other => text_of(other),
        };
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
    if text.contains("FAIL500") {
        return Reply::Error(500, "mock: internal error".into());
    }
    if text.contains("OVERFLOW") {
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
                },
            ],
            Duration::ZERO,
        );
    }
    if text.contains("SLOW") {
        let chunks = (0..40).map(|i| format!("slow {i} ")).collect();
        return Reply::Blocks(vec![Block::Text(chunks)], Duration::from_millis(250));
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
        let frame = format!("event: {event}\ndata: {data}\n\n");
        stream.write_all(frame.as_bytes()).await?;
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
            Block::Tool { id, command } => {
                send("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": "Bash", "input": {}}})).await?;
                let input = json!({"command": command, "description": "run a command"}).to_string();
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
