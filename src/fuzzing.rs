//! Entry points for the `cargo fuzz` targets in `fuzz/` and for `tests/suite/fuzz_corpus.rs`, which
//! replays the committed corpus under a stable `cargo test`. Not an API: hidden from the docs,
//! free to change with the targets.
//!
//! Each function takes arbitrary bytes, runs them through the real code an untrusted peer
//! reaches (an IPC request line, a WebSocket frame, an agent's stdout, a session file), and
//! panics on a broken invariant as well as on a crash: a panic here is a finding. The
//! invariants are cheap ones the rest of the host relies on — a refused request carries a
//! request-level code, a decoded frame re-encodes to itself, every event a translator emits
//! survives the store's JSON round trip and every block it opens is closed once the agent
//! exits, a JSON-RPC answer reaches the request it names and nothing else is lost.
//!
//! Nothing here is reached by the daemon itself.

use std::collections::{BTreeSet, HashSet};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader, ReadBuf};

use crate::adapter::jsonrpc::{Dialect, Incoming, RpcClient, RpcError};
use crate::adapter::lines::{BoundedLines, Line};
use crate::adapter::{acp, claude, codex};
use crate::protocol::envelope::{Command, ErrorCode, spec};
use crate::protocol::events::{AnyEvent, Event, EventBody};
use crate::protocol::wire::{self, CmdId, pb};
use crate::session::agent::FileEntry;
use crate::session::ownership::Tail;

/// The codes [`Command::parse_bytes`] may refuse a request with: it has not reached a handler,
/// so a host-state or session code would be a lie.
const REQUEST_CODES: &[ErrorCode] = &[
    ErrorCode::RequestTooLarge,
    ErrorCode::InvalidEncoding,
    ErrorCode::EmptyRequest,
    ErrorCode::InvalidJson,
    ErrorCode::InvalidEnvelope,
    ErrorCode::MissingCommand,
    ErrorCode::UnknownCommand,
    ErrorCode::InvalidParams,
];

/// One IPC request line or argv JSON through the envelope parser.
pub fn envelope(data: &[u8]) {
    match Command::parse_bytes(data) {
        Ok(command) => {
            // Whatever parses is a row of the command table.
            let name = command.name();
            assert!(
                spec(name).is_some(),
                "{name} parsed but is not in the table"
            );
            let _route = command.route();
        }
        Err(refused) => {
            assert!(
                REQUEST_CODES.contains(&refused.code),
                "refused with {:?}, not a request-level code",
                refused.code
            );
            // The reply line is what the client reads: it must be JSON with that code.
            let line = refused.clone().into_reply().to_line();
            let reply: Value = parse_json(&line, "reply line");
            assert_eq!(reply["code"], json!(refused.code.number()), "{line}");
            assert_eq!(reply["data"]["error"], json!(refused.code.name()), "{line}");
        }
    }
}

/// One WebSocket message through the frame decoders: as a binary (protobuf) message, and — when
/// it is UTF-8 — as a text (JSON codec) message.
pub fn frame(data: &[u8]) {
    binary_frame(data);
    if let Ok(text) = std::str::from_utf8(data) {
        json_frame(text);
    }
}

/// A JSON-codec text message: refused with a frame-level code, or decoded into a frame that
/// keeps its cmd and id when passed on, and whose body, if it decodes, re-encodes to itself.
fn json_frame(text: &str) {
    let decoded = match wire::decode_json(text) {
        Ok(decoded) => decoded,
        Err((_, refused)) => {
            let code = crate::request::errors::wire_code(&refused);
            assert!(
                matches!(code, ErrorCode::InvalidFrame | ErrorCode::UnknownCmd),
                "a JSON frame refused with {code:?}"
            );
            return;
        }
    };
    let wire::WireMessage::Text(moved) = decoded.with_request_id(decoded.request_id ^ 1) else {
        panic!("a JSON frame passed on as binary");
    };
    let moved = wire::decode_json(&moved)
        .unwrap_or_else(|e| panic!("a re-encoded JSON frame does not decode: {e:?}"));
    assert_eq!(moved.cmd, decoded.cmd);
    assert_eq!(moved.request_id, decoded.request_id ^ 1);
    if let Ok(request) = decoded.body::<pb::Request>() {
        let wire::WireMessage::Text(again) =
            wire::encode_as(wire::Codec::Json, decoded.cmd, 1, &request)
        else {
            panic!("the JSON codec wrote binary");
        };
        let back: pb::Request = wire::decode_json(&again)
            .unwrap_or_else(|e| panic!("{e:?}"))
            .body()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, request);
    }
}

/// One WebSocket binary message through the frame decoder, then its body through the message
/// type its `cmd` names.
fn binary_frame(data: &[u8]) {
    let decoded = match wire::decode(data) {
        Ok(decoded) => decoded,
        Err((request_id, refused)) => {
            let code = crate::request::errors::wire_code(&refused);
            assert!(
                matches!(code, ErrorCode::InvalidFrame | ErrorCode::UnknownCmd),
                "a frame refused with {code:?}"
            );
            // The answer to a refused frame must itself decode, to the same request id.
            let answer = wire::error_frame(request_id, code, refused.to_string());
            let answer = wire::decode(&answer).unwrap_or_else(|e| panic!("error frame: {e:?}"));
            assert_eq!(answer.request_id, request_id);
            let body: pb::ErrorResp = answer
                .body()
                .unwrap_or_else(|e| panic!("error frame body: {e}"));
            assert_eq!(body.code, code.number());
            return;
        }
    };
    // Passing a frame on under another id (the relay does) keeps everything else.
    let wire::WireMessage::Binary(moved) = decoded.with_request_id(decoded.request_id ^ 1) else {
        panic!("a binary frame passed on as text");
    };
    let moved = wire::decode(&moved)
        .unwrap_or_else(|e| panic!("a re-encoded frame does not decode: {e:?}"));
    assert_eq!(moved.cmd, decoded.cmd);
    assert_eq!(moved.request_id, decoded.request_id ^ 1);
    match decoded.cmd {
        CmdId::CmdUnspecified => panic!("decode accepted CMD_UNSPECIFIED"),
        CmdId::Hello => body_round_trip::<pb::Hello>(&decoded),
        CmdId::HelloResp => body_round_trip::<pb::HelloResp>(&decoded),
        CmdId::EventPush => body_round_trip::<pb::EventPush>(&decoded),
        CmdId::Ack => body_round_trip::<pb::Ack>(&decoded),
        CmdId::Ping => body_round_trip::<pb::Ping>(&decoded),
        CmdId::Pong => body_round_trip::<pb::Pong>(&decoded),
        CmdId::ErrorResp => body_round_trip::<pb::ErrorResp>(&decoded),
        CmdId::Request => body_round_trip::<pb::Request>(&decoded),
        CmdId::Reply => body_round_trip::<pb::Reply>(&decoded),
    }
}

/// A body that decodes encodes to a frame whose body decodes to the same message.
fn body_round_trip<M>(decoded: &wire::Decoded)
where
    M: wire::WireBody + PartialEq + std::fmt::Debug,
{
    let Ok(body) = decoded.body::<M>() else {
        return;
    };
    let again = wire::decode(&wire::encode(decoded.cmd, decoded.request_id, &body))
        .unwrap_or_else(|e| panic!("a re-encoded frame does not decode: {e:?}"));
    let body_again: M = again
        .body()
        .unwrap_or_else(|e| panic!("a re-encoded body does not decode: {e}"));
    assert_eq!(body_again, body);
}

/// An agent's stdout through the bounded line reader (checked against a model of it, with a
/// small bound and reads of a few bytes, so line ends fall across buffer refills), then
/// through the JSON-RPC client with three requests waiting for answers.
pub fn jsonrpc_line(data: &[u8]) {
    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            bounded_lines(data).await;
            rpc_client(data).await;
        });
    });
}

thread_local! {
    /// One runtime per fuzzing thread: building one per input would cost more than the input.
    static RUNTIME: tokio::runtime::Runtime = runtime();
}

#[expect(
    clippy::expect_used,
    reason = "a harness without a runtime can check nothing; failing loudly is right"
)]
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

/// A reader that hands out at most `chunk` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    chunk: usize,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.chunk.min(self.data.len()).min(buf.remaining());
        let (head, rest) = self.data.split_at(n);
        buf.put_slice(head);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

/// What [`BoundedLines`] must yield: one item per `\n`-ended piece and one for a non-empty
/// tail; a piece longer than `max` (counting a trailing `\r`) is `TooLong`.
fn lines_model(data: &[u8], max: usize) -> Vec<Line> {
    let mut pieces: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    if pieces.last().is_some_and(|tail| tail.is_empty()) {
        pieces.pop();
    }
    pieces
        .into_iter()
        .map(|piece| {
            if piece.len() > max {
                return Line::TooLong;
            }
            let piece = piece.strip_suffix(b"\r").unwrap_or(piece);
            match std::str::from_utf8(piece) {
                Ok(text) => Line::Text(text.to_owned()),
                Err(_) => Line::NotUtf8,
            }
        })
        .collect()
}

async fn bounded_lines(data: &[u8]) {
    // The bound and the read size come from the input's ends, so the fuzzer can steer them.
    let max = data.first().map_or(8, |b| usize::from(*b) * 4);
    let chunk = 1 + data.last().map_or(0, |b| usize::from(*b) % 37);
    let mut lines = BoundedLines::new(Trickle { data, chunk }, max);
    let mut got = Vec::new();
    while let Some(line) = lines
        .next_line()
        .await
        .unwrap_or_else(|e| panic!("an in-memory read failed: {e}"))
    {
        got.push(line);
    }
    assert_eq!(got, lines_model(data, max), "max {max}, reads of {chunk}");
}

/// How long a request may wait: the agent's stdout ends right after the input, so an answer
/// is either in it or never coming; a wait this long is a hang.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
const METHODS: [&str; 3] = ["fuzz/a", "fuzz/b", "fuzz/c"];

async fn rpc_client(data: &[u8]) {
    let (host_end, agent_end) = tokio::io::duplex(64 * 1024);
    let (host_read, host_write) = tokio::io::split(host_end);
    let (agent_read, mut agent_write) = tokio::io::split(agent_end);
    let (client, mut incoming, skipped) =
        RpcClient::start(host_read, host_write, Dialect::JsonRpc2);
    let calls: Vec<_> = METHODS
        .iter()
        .map(|method| {
            let client = client.clone();
            tokio::spawn(async move { client.request(method, json!({}), ANSWER_WAIT).await })
        })
        .collect();
    drop(client);
    // Wait until all three are written, so the input's answers can find them.
    let mut sent = BufReader::new(agent_read);
    let mut ids = Vec::new();
    for _ in METHODS {
        let mut line = String::new();
        let n = sent
            .read_line(&mut line)
            .await
            .unwrap_or_else(|e| panic!("reading the client's request: {e}"));
        assert!(n > 0, "the client wrote fewer requests than it was asked");
        let request: Value = parse_json(&line, "request line");
        let id = request["id"].as_u64().unwrap_or_else(|| panic!("{line}"));
        let method = request["method"].as_str().unwrap_or_default().to_owned();
        ids.push((id, method));
    }
    let feed = async {
        // A closed pipe is fine: the client stops reading when its owner is gone.
        if agent_write.write_all(data).await.is_ok() {
            let _closed = agent_write.shutdown().await;
        }
        drop(agent_write);
    };
    let take = async {
        let mut notifications = 0_usize;
        let mut requests = 0_usize;
        while let Some(message) = incoming.recv().await {
            match message {
                Incoming::Notification { .. } => notifications += 1,
                // Answer every other one; the rest are refused when dropped.
                Incoming::Request(request) => {
                    requests += 1;
                    if requests.is_multiple_of(2) {
                        request.respond(json!({"ok": true}));
                    }
                }
            }
        }
        notifications + requests
    };
    let drain = async {
        let mut rest = Vec::new();
        let _closed = tokio::io::AsyncReadExt::read_to_end(&mut sent, &mut rest).await;
        rest
    };
    let ((), delivered, written) = tokio::join!(feed, take, drain);
    // Everything the client wrote after the requests is an answer line of JSON.
    for line in written.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let answer: Value = serde_json::from_slice(line)
            .unwrap_or_else(|e| panic!("the client wrote a line that is not JSON: {e}"));
        assert!(answer.get("id").is_some(), "an answer without an id");
    }

    // The model: which lines are messages for the owner, which answer which request.
    let mut expect_incoming = 0_usize;
    let mut answered: HashSet<u64> = HashSet::new();
    let mut not_json = 0_u64;
    let mut unknown_id = 0_u64;
    let waiting: HashSet<u64> = ids.iter().map(|(id, _)| *id).collect();
    for line in lines_model(data, crate::adapter::jsonrpc::MAX_LINE) {
        let Line::Text(text) = line else {
            not_json += 1;
            continue;
        };
        let Ok(Value::Object(msg)) = serde_json::from_str::<Value>(&text) else {
            not_json += 1;
            continue;
        };
        let has_method = msg.get("method").and_then(Value::as_str).is_some();
        match (has_method, msg.get("id")) {
            (true, _) => expect_incoming += 1,
            (false, Some(id)) => match id.as_u64() {
                Some(id) if waiting.contains(&id) && answered.insert(id) => {}
                _ => unknown_id += 1,
            },
            (false, None) => not_json += 1,
        }
    }
    assert_eq!(delivered, expect_incoming, "messages for the owner lost");
    assert_eq!(
        skipped.not_json.load(std::sync::atomic::Ordering::Relaxed),
        not_json
    );
    assert_eq!(
        skipped
            .unknown_id
            .load(std::sync::atomic::Ordering::Relaxed),
        unknown_id
    );
    for (call, (id, method)) in calls.into_iter().zip(ids) {
        let result = call
            .await
            .unwrap_or_else(|e| panic!("a request task failed: {e}"));
        match result {
            Ok(_) | Err(RpcError::Remote { .. }) => {
                assert!(
                    answered.contains(&id),
                    "{method} (id {id}) got an answer it was not sent"
                );
            }
            Err(RpcError::NoAnswer { .. }) => {
                assert!(
                    !answered.contains(&id),
                    "{method} (id {id}): its answer was lost"
                );
            }
            Err(other) => panic!("{method} (id {id}): {other}"),
        }
    }
}

/// The lines an agent driver hands its translator: `\n`-separated, a trailing `\r` dropped,
/// lines that are not UTF-8 skipped (as [`BoundedLines`] reports them).
fn text_lines(data: &[u8]) -> impl Iterator<Item = &str> {
    data.split(|b| *b == b'\n')
        .filter_map(|line| std::str::from_utf8(line.strip_suffix(b"\r").unwrap_or(line)).ok())
}

/// Claude Code's stdout, line by line into a fresh translator, then the process exits
/// mid-turn.
pub fn claude_translator(data: &[u8]) {
    let mut translator = claude::Translator::new();
    let mut events = Vec::new();
    for line in text_lines(data) {
        events.extend(translator.on_stdout_line(line));
        for reply in translator.take_replies() {
            // Written to the CLI's stdin: one JSON line.
            assert!(!reply.contains('\n'), "a reply spans lines: {reply}");
            let _: Value = parse_json(&reply, "control reply");
        }
    }
    events.extend(translator.on_exit(true, "fuzz"));
    check_events(&events);
}

/// Codex app-server's stdout, line by line into a fresh translator, then the process exits.
pub fn codex_translator(data: &[u8]) {
    let mut translator = codex::Translator::new();
    let mut events = Vec::new();
    for line in text_lines(data) {
        events.extend(translator.on_line(line));
    }
    let in_turn = translator.in_turn();
    events.extend(translator.on_exit(in_turn, "fuzz"));
    check_events(&events);
}

/// An ACP transcript (`{"dir", "msg"}` records, as the fixtures hold), record by record into a
/// fresh translator, then the process exits.
pub fn acp_translator(data: &[u8]) {
    let mut translator = acp::Translator::new();
    let mut prompts = Vec::new();
    let mut events = Vec::new();
    for line in text_lines(data) {
        events.extend(translator.on_record(line, &mut prompts));
    }
    events.extend(translator.on_exit("fuzz"));
    check_events(&events);
}

/// What every translator's output must satisfy: each event survives the store's round trip
/// (serialized with its `"k"`, read back by [`AnyEvent`] as the same event), and once the
/// agent has exited no block or tool call is left open.
fn check_events(events: &[EventBody]) {
    let mut open: BTreeSet<(&'static str, Option<String>)> = BTreeSet::new();
    for body in events {
        let event = Event::new("s", Some("r".to_owned()), body.clone());
        let text = serde_json::to_string(&event)
            .unwrap_or_else(|e| panic!("{} does not serialize: {e}", body.kind()));
        let value: Value = parse_json(&text, "event");
        assert_eq!(value["k"], json!(body.kind()), "{text}");
        match AnyEvent::from_value(value) {
            Ok(AnyEvent::Known(back)) => assert_eq!(back, event, "{text}"),
            Ok(AnyEvent::Unknown { k, .. }) => panic!("{k} read back as unknown"),
            Err(e) => panic!("{text} does not read back: {e}"),
        }
        match body {
            EventBody::TextStart(b) => {
                open.insert(("text", b.item_id.clone()));
            }
            EventBody::TextEnd(b) => {
                open.remove(&("text", b.item_id.clone()));
            }
            EventBody::ThinkingStart(b) => {
                open.insert(("thinking", b.item_id.clone()));
            }
            EventBody::ThinkingEnd(b) => {
                open.remove(&("thinking", b.item_id.clone()));
            }
            EventBody::ToolCallStart(c) => {
                open.insert(("tool.call", Some(c.call_id.clone())));
            }
            EventBody::ToolCallEnd(c) => {
                open.remove(&("tool.call", Some(c.call_id.clone())));
            }
            _ => {}
        }
    }
    assert!(
        open.is_empty(),
        "left open after the agent exited: {open:?}"
    );
}

/// One Claude session file: each line through the classifier the ownership check uses, then
/// the whole file through [`Tail`] — armed with every prompt in it as the host's, it finds a
/// foreign line only where a line is not an entry; its baseline resumes on the unchanged file.
pub fn session_file_line(data: &[u8]) {
    let mut ours = HashSet::new();
    let mut unreadable = false;
    let whole = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for line in data[..whole]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
    {
        match claude::file_entry(line) {
            FileEntry::Prompt { id, .. } => {
                ours.insert(id);
            }
            FileEntry::Other => {}
            FileEntry::Unreadable => unreadable = true,
        }
    }
    let path = scratch_file();
    if let Err(e) = std::fs::write(&path, data) {
        panic!("writing {}: {e}", path.display());
    }
    let armed = Tail::arm(&path, Some(claude::file_entry), Some(&ours))
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    match armed {
        Ok(tail) => {
            assert!(
                !unreadable,
                "a line that is not an entry was taken as the host's"
            );
            let seen = tail.seen().clone();
            assert_eq!(seen.size, whole as u64, "read up to the last complete line");
            let resumed = Tail::resume(seen, Some(claude::file_entry))
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            if let Err(why) = resumed {
                panic!("the unchanged file does not resume: {why}");
            }
        }
        Err(why) => assert!(unreadable, "every prompt was ours, yet: {why}"),
    }
    session_file_readers(data, &path);
    let _gone = std::fs::remove_file(&path);
}

/// The same file through the readers `session.discover` and `session.import` use: the
/// bounded line reader under them (from a start and with a limit the input's first bytes
/// choose), Claude's history, and Codex's rollout history and cwd. Every history becomes
/// imported events that survive the store's round trip.
fn session_file_readers(data: &[u8], path: &std::path::Path) {
    let len = data.len() as u64;
    let start = u64::from(data.first().copied().unwrap_or(0)) % (len + 1);
    let limit = u64::from(data.get(1).copied().unwrap_or(0)) * 64 + 1;
    let (lines, cut) = crate::adapter::lines::read_file_lines(path, start, limit)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let read: u64 = lines.iter().map(|l| l.len() as u64).sum();
    assert!(read <= limit, "read {read} bytes past the limit {limit}");
    assert_eq!(
        cut,
        len - start > limit,
        "cut short at {start}+{limit} of {len}"
    );
    if cut {
        assert!(
            lines.iter().all(|l| l.last() == Some(&b'\n')),
            "a line cut by the limit was returned"
        );
    } else {
        // Everything from `start` when a line begins there, else from the next line.
        let begin = if start == 0 || data[start as usize - 1] == b'\n' {
            start as usize
        } else {
            data[start as usize..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(data.len(), |i| start as usize + i + 1)
        };
        assert_eq!(
            lines.concat(),
            &data[begin..],
            "lines from {start} lost bytes"
        );
    }
    let claude = claude::read_session_history(path)
        .unwrap_or_else(|e| panic!("Claude history of {}: {e}", path.display()));
    let codex = codex::rollout_history(path)
        .unwrap_or_else(|e| panic!("Codex history of {}: {e}", path.display()));
    let _cwd = codex::rollout_cwd(path);
    for (agent, entries) in [("claude", claude), ("codex", codex)] {
        for body in crate::session::discover::imported_events(agent, entries) {
            let event = Event::new("s", None, body.clone());
            let text = serde_json::to_string(&event)
                .unwrap_or_else(|e| panic!("{} does not serialize: {e}", body.kind()));
            match AnyEvent::from_value(parse_json(&text, "imported event")) {
                Ok(AnyEvent::Known(back)) => assert_eq!(back, event, "{text}"),
                Ok(AnyEvent::Unknown { k, .. }) => panic!("{k} read back as unknown"),
                Err(e) => panic!("{text} does not read back: {e}"),
            }
        }
    }
}

/// A file of this thread's own under the temporary directory (the replay test runs targets on
/// several threads).
fn scratch_file() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "agent-host-fuzz-{}-{:?}.jsonl",
        std::process::id(),
        std::thread::current().id()
    ))
}

fn parse_json(text: &str, what: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what} is not JSON ({e}): {text}"))
}
