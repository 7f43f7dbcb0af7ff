//! The reference relay (docs/relay.md): what a user runs on a reachable machine so a remote
//! bot can drive the agent-host on a laptop behind NAT. The host dials in; bots connect too;
//! the relay passes frames between them.
//!
//! Usage: `cargo run --example relay -- --listen 127.0.0.1:8787 --host-token H --bot-token B`
//! (or the tokens in `RELAY_HOST_TOKEN` / `RELAY_BOT_TOKEN`). It prints one line,
//! `relay listening on ws://ADDR`, then serves until killed:
//!
//! - `/host` — the agent-host connects here with `Authorization: Bearer <host token>`
//!   (`[relay] url = "ws://ADDR/host"` in its `config.toml`; `wss://` behind a TLS proxy in
//!   real use). One host at a time; a new one replaces the old. The relay says `Hello` with
//!   the highest bracket it has, so the host replays exactly what it missed.
//! - `/bot` — bots connect with `Authorization: Bearer <bot token>` and speak the same protocol
//!   as to the host's loopback server: `Hello {cursor}`, then replay and live `EventPush`,
//!   requests and their answers. A wrong token gets HTTP 401 and nothing else.
//!
//! Guarantees it keeps (the contract of docs/relay.md):
//! - each bot gets every bracket after its cursor once, in order, across host reconnects and
//!   bot reconnects (brackets are kept in a ring; each bot's position is tracked);
//! - a request made while no host is connected waits for one; a prompt with a `client_msg_id`
//!   whose answer has not come back is sent again when the host reconnects — safe because the
//!   host deduplicates on the key; any other request lost that way is answered with an error
//!   saying it may or may not have been done;
//! - the host's cursor is acked only up to what every connected bot acked, so a relay that
//!   dies loses nothing a bot has not confirmed.

#![allow(clippy::print_stdout, reason = "prints its address for the caller")]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use agent_host::protocol::envelope::ErrorCode;
use agent_host::protocol::wire::{self, CmdId, PROTOCOL_VERSION, pb};
use anyhow::Context as _;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{StatusCode, header};

/// Brackets kept for bots that reconnect.
const RING: usize = 10_000;

struct Bot {
    out: mpsc::UnboundedSender<Message>,
    /// The last bracket this bot was given.
    delivered: i64,
    /// What it acked.
    acked: i64,
}

struct Pending {
    bot: u64,
    bot_request_id: u64,
    frame: Bytes,
    /// A prompt with a `client_msg_id`: the host runs it once however often it is sent.
    resendable: bool,
    /// It went out on a host connection (so its fate is uncertain if that one dropped).
    sent: bool,
}

#[derive(Default)]
struct State {
    host: Option<(u64, mpsc::UnboundedSender<Message>)>,
    next_host: u64,
    /// The highest bracket received from the host.
    last_seq: i64,
    ring: VecDeque<(i64, Bytes)>,
    bots: HashMap<u64, Bot>,
    next_bot: u64,
    /// Requests forwarded to the host and not answered yet, by the relay's request id.
    pending: BTreeMap<u64, Pending>,
    next_request: u64,
    /// The cursor last acked to the host.
    host_acked: i64,
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl State {
    /// Ack to the host what every connected bot acked.
    fn ack_host(&mut self) {
        let Some(min) = self.bots.values().map(|b| b.acked).min() else {
            return;
        };
        if min > self.host_acked
            && let Some((_, host)) = &self.host
        {
            self.host_acked = min;
            let frame = wire::encode(CmdId::Ack, 0, &pb::Ack { cursor: min });
            let _gone = host.send(Message::Binary(frame));
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:0".to_owned();
    let mut host_token = std::env::var("RELAY_HOST_TOKEN").ok();
    let mut bot_token = std::env::var("RELAY_BOT_TOKEN").ok();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().context("--listen needs an address")?,
            "--host-token" => host_token = args.next(),
            "--bot-token" => bot_token = args.next(),
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let host_token = host_token.context("a host token is needed (--host-token)")?;
    let bot_token = bot_token.context("a bot token is needed (--bot-token)")?;
    let listener = TcpListener::bind(&listen).await?;
    println!("relay listening on ws://{}", listener.local_addr()?);
    let state: Shared = Arc::default();
    let tokens = Arc::new((host_token, bot_token));
    loop {
        let (stream, _) = listener.accept().await?;
        // Frames are small and latency matters more than packet count.
        let _ = stream.set_nodelay(true);
        let (state, tokens) = (state.clone(), tokens.clone());
        tokio::spawn(async move {
            let _ended = connection(stream, state, tokens).await;
        });
    }
}

enum Role {
    Host,
    Bot,
}

#[expect(
    clippy::result_large_err,
    reason = "the handshake callback's signature is tungstenite's"
)]
async fn connection(
    stream: TcpStream,
    state: Shared,
    tokens: Arc<(String, String)>,
) -> anyhow::Result<()> {
    let mut role = None;
    let callback = |req: &Request, response: Response| {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let (wanted, which) = match req.uri().path() {
            "/host" => (&tokens.0, Role::Host),
            "/bot" => (&tokens.1, Role::Bot),
            _ => return Err(refuse(StatusCode::NOT_FOUND, "only /host and /bot")),
        };
        if bearer != Some(wanted.as_str()) {
            return Err(refuse(StatusCode::UNAUTHORIZED, "wrong or missing token"));
        }
        role = Some(which);
        Ok(response)
    };
    let ws = tokio_tungstenite::accept_hdr_async(stream, callback).await?;
    match role {
        Some(Role::Host) => host_connection(ws, state).await,
        Some(Role::Bot) => bot_connection(ws, state).await,
        None => Ok(()),
    }
}

fn refuse(status: StatusCode, why: &str) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(why.to_owned()));
    *response.status_mut() = status;
    response
}

async fn host_connection(
    ws: tokio_tungstenite::WebSocketStream<TcpStream>,
    state: Shared,
) -> anyhow::Result<()> {
    let (mut sink, mut inbound) = ws.split();
    let (out, mut queue) = mpsc::unbounded_channel::<Message>();
    let id = {
        let mut s = lock(&state);
        s.next_host += 1;
        let id = s.next_host;
        // A new host connection replaces the old one (its writer ends with its channel).
        s.host = Some((id, out.clone()));
        let cursor = (s.last_seq > 0).then_some(s.last_seq);
        let hello = pb::Hello {
            client_name: "reference-relay".to_owned(),
            cursor,
            protocol_version: PROTOCOL_VERSION,
        };
        let _ = out.send(Message::Binary(wire::encode(CmdId::Hello, 0, &hello)));
        // Requests whose answer was lost: a keyed prompt is sent again (the host runs it once);
        // anything else may or may not have happened, and the bot is told so.
        let pending = std::mem::take(&mut s.pending);
        for (id, mut p) in pending {
            if p.resendable || !p.sent {
                let _ = out.send(Message::Binary(p.frame.clone()));
                p.sent = true;
                s.pending.insert(id, p);
            } else if let Some(bot) = s.bots.get(&p.bot) {
                let lost = wire::error_frame(
                    p.bot_request_id,
                    ErrorCode::HostUnresponsive,
                    "the host connection dropped before the answer; not sent again (it may or may not have been done)",
                );
                let _ = bot.out.send(Message::Binary(lost));
            }
        }
        s.host_acked = 0;
        s.ack_host();
        id
    };
    let writer = tokio::spawn(async move {
        while let Some(message) = queue.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    drop(out);
    while let Some(message) = inbound.next().await {
        let Ok(Message::Binary(bytes)) = message else {
            if matches!(message, Ok(Message::Close(_)) | Err(_)) {
                break;
            }
            continue;
        };
        let Ok(frame) = wire::decode(&bytes) else {
            continue;
        };
        let mut s = lock(&state);
        if s.host.as_ref().map(|(h, _)| *h) != Some(id) {
            break;
        }
        match frame.cmd {
            CmdId::EventPush => {
                let Ok(push) = frame.body::<pb::EventPush>() else {
                    continue;
                };
                if push.is_delta {
                    for bot in s.bots.values() {
                        if bot.delivered >= push.sequence_id {
                            let _ = bot.out.send(Message::Binary(bytes.clone()));
                        }
                    }
                    continue;
                }
                if push.sequence_id <= s.last_seq {
                    continue;
                }
                s.last_seq = push.sequence_id;
                s.ring.push_back((push.sequence_id, bytes.clone()));
                if s.ring.len() > RING {
                    s.ring.pop_front();
                }
                for bot in s.bots.values_mut() {
                    if push.sequence_id > bot.delivered {
                        bot.delivered = push.sequence_id;
                        let _ = bot.out.send(Message::Binary(bytes.clone()));
                    }
                }
            }
            CmdId::HelloResp => {}
            _ if frame.request_id != 0 => {
                // An answer: back to the bot that asked, under its own request id.
                if let Some(pending) = s.pending.remove(&frame.request_id)
                    && let Some(bot) = s.bots.get(&pending.bot)
                {
                    let answer = binary(frame.with_request_id(pending.bot_request_id));
                    let _ = bot.out.send(Message::Binary(answer));
                }
            }
            _ => {}
        }
    }
    {
        let mut s = lock(&state);
        if s.host.as_ref().map(|(h, _)| *h) == Some(id) {
            s.host = None;
        }
    }
    writer.abort();
    Ok(())
}

async fn bot_connection(
    ws: tokio_tungstenite::WebSocketStream<TcpStream>,
    state: Shared,
) -> anyhow::Result<()> {
    let (mut sink, mut inbound) = ws.split();
    // 1. Hello.
    let hello = match inbound.next().await {
        Some(Ok(Message::Binary(bytes))) => wire::decode(&bytes)
            .ok()
            .filter(|f| f.cmd == CmdId::Hello)
            .and_then(|f| f.body::<pb::Hello>().ok().map(|h| (f.request_id, h))),
        _ => None,
    };
    let Some((hello_id, hello)) = hello else {
        let refusal =
            wire::error_frame(0, ErrorCode::HelloRequired, "the first frame must be Hello");
        let _ = sink.send(Message::Binary(refusal)).await;
        return Ok(());
    };
    let (out, mut queue) = mpsc::unbounded_channel::<Message>();
    let bot_id = {
        let mut s = lock(&state);
        s.next_bot += 1;
        let bot_id = s.next_bot;
        let cursor = hello.cursor.unwrap_or(0).max(0);
        let resp = pb::HelloResp {
            subscriber_id: format!("bot-{bot_id}"),
            host_version: String::new(),
            replay_from: cursor,
            replay_mode: "since_cursor".to_owned(),
            forward_deltas: true,
            session_id: String::new(),
        };
        let _ = out.send(Message::Binary(wire::encode(
            CmdId::HelloResp,
            hello_id,
            &resp,
        )));
        // Replay from the ring, then live: under one lock, so nothing falls between.
        let mut delivered = cursor;
        for (seq, frame) in &s.ring {
            if *seq > cursor {
                let _ = out.send(Message::Binary(frame.clone()));
                delivered = *seq;
            }
        }
        s.bots.insert(
            bot_id,
            Bot {
                out: out.clone(),
                delivered,
                acked: cursor,
            },
        );
        bot_id
    };
    let writer = tokio::spawn(async move {
        while let Some(message) = queue.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
    });
    while let Some(message) = inbound.next().await {
        let Ok(Message::Binary(bytes)) = message else {
            if matches!(message, Ok(Message::Close(_)) | Err(_)) {
                break;
            }
            continue;
        };
        let frame = match wire::decode(&bytes) {
            Ok(frame) => frame,
            Err((id, e)) => {
                let _ = out.send(Message::Binary(wire::error_frame(
                    id,
                    agent_host::request::errors::wire_code(&e),
                    e.to_string(),
                )));
                continue;
            }
        };
        let mut s = lock(&state);
        match frame.cmd {
            CmdId::Ack => {
                if let Ok(ack) = frame.body::<pb::Ack>()
                    && let Some(bot) = s.bots.get_mut(&bot_id)
                {
                    bot.acked = bot.acked.max(ack.cursor.min(bot.delivered));
                }
                s.ack_host();
            }
            CmdId::Ping => {
                let nonce = frame.body::<pb::Ping>().map(|p| p.nonce).unwrap_or(0);
                let pong = wire::encode(CmdId::Pong, frame.request_id, &pb::Pong { nonce });
                let _ = out.send(Message::Binary(pong));
            }
            _ => {
                // A request: forwarded under the relay's own id, kept until answered.
                s.next_request += 1;
                let id = s.next_request;
                let forwarded = binary(frame.with_request_id(id));
                let sent = match &s.host {
                    Some((_, host)) => host.send(Message::Binary(forwarded.clone())).is_ok(),
                    None => false,
                };
                // A prompt with an idempotency key may be sent again after a host reconnect:
                // the host answers a repeat with the first run.
                let resendable = frame.cmd == CmdId::Request
                    && frame.body::<pb::Request>().is_ok_and(|r| {
                        r.command == "session.send"
                            && serde_json::from_str::<serde_json::Value>(&r.params_json).is_ok_and(
                                |p| p.get("client_msg_id").is_some_and(|k| k.is_string()),
                            )
                    });
                s.pending.insert(
                    id,
                    Pending {
                        bot: bot_id,
                        bot_request_id: frame.request_id,
                        frame: forwarded,
                        resendable,
                        sent,
                    },
                );
            }
        }
    }
    {
        let mut s = lock(&state);
        s.bots.remove(&bot_id);
        s.pending.retain(|_, p| p.bot != bot_id);
    }
    drop(out);
    let _ = writer.await;
    Ok(())
}

/// The bytes of a frame this relay passes on (it speaks only the protobuf codec).
fn binary(message: wire::WireMessage) -> bytes::Bytes {
    match message {
        wire::WireMessage::Binary(bytes) => bytes,
        wire::WireMessage::Text(text) => bytes::Bytes::from(text.into_bytes()),
    }
}
