//! One wire connection, the host's side (design §7), whichever side dialed: the loopback
//! server's accepted connections and the relay client's outbound one run the same code, so a
//! renderer written for one works for the other.
//!
//! 1. The first frame must be `Hello`; its cursor, if any, wins over the stored one. The reply
//!    is `HelloResp`, then replay (per the subscriber's mode), then live events, as `EventPush`.
//! 2. Inbound: `Ack` advances the stored cursor (batched by the bus), `Ping` → `Pong`, and a
//!    `Request` (one command of the envelope) → the request layer → its `Reply`. A bad frame
//!    gets `ErrorResp`; an oversized message (> 1 MiB) closes the connection with code 1009 and
//!    a reason.
//! 3. The connection's [`Access`] (the subscriber's stored scope for a loopback grant; the
//!    token's for the relay) goes with every request to the request layer, which checks it;
//!    events of sessions outside it are not sent.
//! 5. Frames are protobuf binary messages, or JSON text messages for a client that chose the
//!    JSON codec (`agenthost.v1.json`): the same messages either way.
//!
//! Transport-neutral: the loopback server (`ws/`) and the relay client (`relay/`) both call
//! [`serve`] with a WebSocket they opened; neither imports the other.
//! 4. [`Keepalive`]: a WebSocket ping every interval; a peer from which nothing arrived for the
//!    dead-peer time is dropped.
//!
//! Overload: the connection's task writes its events in batches (one flush each). A peer that
//! stops reading blocks that write; the task then takes nothing from its bus subscription,
//! which the hub moves to catch-up from SQLite — memory stays bounded and nobody else waits.
//! A write blocked for 60 s ends the connection.
//!
//! Direct lane: a loopback connection's stream is a [`crate::bus::DirectStream`], and its
//! socket is lent to the hub (`bus::direct`). Each time round the loop, with everything taken
//! written and flushed, the task arms the lane; the hub may then write a lone delta to the
//! socket itself, and wakes the task if the socket took only part of it. An inbound frame
//! disarms it until its reply is written; the lane is closed when the loop ends.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use crate::bus::{Direct, Subscription};
use crate::protocol::envelope::{Command, ErrorCode, Reply};
use crate::protocol::wire::{self, CmdId, Codec, Decoded, WireMessage, pb};
use crate::request::errors::{subscriber_error, wire_code};
use crate::request::{Access, Caller, Handler, Via};
use crate::subscribers::GrantStore;

/// How long a peer has to send `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection needs: the one request layer (which holds the subscribers).
#[derive(Clone)]
pub struct Link {
    pub handler: Handler,
}

impl Link {
    fn grants(&self) -> &GrantStore {
        self.handler.subscribers().grants()
    }
}

/// Who is at the other end of one connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub via: Via,
    pub codec: Codec,
    /// `None`: what the subscriber's stored scope allows (a loopback grant). The relay gives
    /// its token's.
    pub access: Option<Arc<Access>>,
    /// The connection's socket, lent to the bus's direct lane (`bus::direct`): the loopback
    /// server's connections, whose stream is a [`crate::bus::DirectStream`] over it.
    pub lane: Option<Arc<Direct>>,
}

/// Pings and the dead-peer rule.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    pub interval: Duration,
    /// Nothing received for this long (no frame, no pong): the peer is gone.
    pub dead_after: Duration,
}

/// How a connection ended, for logs and the relay's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEnd {
    /// The peer closed, or the stream ended.
    PeerClosed,
    /// The host is stopping, or the subscriber was removed.
    Cancelled,
    /// No `Hello` in time, or something else first.
    NoHello,
    /// The subscription could not be opened.
    Refused(String),
    /// Nothing arrived for the dead-peer time.
    DeadPeer,
    /// A write failed or stayed blocked too long.
    WriteFailed,
    /// The peer broke the protocol (oversized or malformed WebSocket frames).
    Protocol(String),
}

impl std::fmt::Display for LinkEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkEnd::PeerClosed => f.write_str("the peer closed the connection"),
            LinkEnd::Cancelled => f.write_str("closed by the host"),
            LinkEnd::NoHello => f.write_str("the peer sent no Hello"),
            LinkEnd::Refused(why) => write!(f, "the subscription was refused: {why}"),
            LinkEnd::DeadPeer => f.write_str("nothing arrived from the peer in time"),
            LinkEnd::WriteFailed => f.write_str("writing to the peer failed or timed out"),
            LinkEnd::Protocol(why) => write!(f, "the peer broke the protocol: {why}"),
        }
    }
}

fn close(code: CloseCode, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Unregisters a connection however the session ends.
struct Registration<'a> {
    grants: &'a GrantStore,
    subscriber_id: &'a str,
    connection: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.grants
            .disconnected(self.subscriber_id, self.connection);
    }
}

/// Bound on writing one batch or one reply: a client that stops reading for this long while
/// the host has something for it is dropped (its subscriber catches up on reconnect).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Frames written per flush at most.
const MAX_WRITE_BATCH: usize = 256;

/// The connection's writing side: every frame goes out through here, and every write is
/// bounded by the connection's cancellation and [`WRITE_TIMEOUT`].
struct Writer<S> {
    sink: futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    cancel: CancellationToken,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Writer<S> {
    /// Write frames and flush once. `false` when the connection is finished.
    ///
    /// A socket with room takes the frames at the first poll: that write arms neither the
    /// timeout nor the cancellation (a timer entry and a waiter per push, on the way of every
    /// delta to every follower); only a write that has to wait is bounded by them.
    async fn write(&mut self, frames: impl IntoIterator<Item = Message>) -> bool {
        let sink = &mut self.sink;
        let work = async {
            for frame in frames {
                sink.feed(frame).await?;
            }
            sink.flush().await
        };
        let mut work = std::pin::pin!(work);
        if let Poll::Ready(done) = futures_util::poll!(work.as_mut()) {
            return done.is_ok();
        }
        tokio::select! {
            () = self.cancel.cancelled() => false,
            done = tokio::time::timeout(WRITE_TIMEOUT, work) => matches!(done, Ok(Ok(()))),
        }
    }

    /// Send a close frame (bounded) and end the connection.
    async fn close(mut self, code: CloseCode, reason: &str) {
        let frame = close(code, reason);
        let _sent = tokio::time::timeout(Duration::from_secs(2), async {
            self.sink.send(frame).await?;
            self.sink.close().await
        })
        .await;
    }
}

fn to_ws(message: WireMessage) -> Message {
    match message {
        WireMessage::Binary(bytes) => Message::Binary(bytes),
        WireMessage::Text(text) => Message::Text(text.into()),
    }
}

/// Decode one inbound WebSocket message in the connection's codec; `None` for control frames.
fn decode_in(codec: Codec, message: &Message) -> Option<Result<Decoded, (u64, wire::WireError)>> {
    match (codec, message) {
        (Codec::Protobuf, Message::Binary(bytes)) => Some(wire::decode(bytes)),
        (Codec::Json, Message::Text(text)) => Some(wire::decode_json(text.as_str())),
        (Codec::Protobuf, Message::Text(_)) => Some(Err((
            0,
            wire::WireError::WrongCodec(
                "text messages are not part of the protobuf codec: send binary Frames (or \
                 connect with the agenthost.v1.json subprotocol)",
            ),
        ))),
        (Codec::Json, Message::Binary(_)) => Some(Err((
            0,
            wire::WireError::WrongCodec(
                "this connection chose the JSON codec: send JSON text frames",
            ),
        ))),
        _ => None,
    }
}

/// Serve one connection until it ends. One task does both directions: it waits for an
/// inbound frame or the next event, and writes what it has in batches. While a write is
/// blocked (the peer does not read) nothing is taken from the subscription, which the hub
/// then moves to catch-up: memory stays bounded. `hello_permit` is held until `Hello` is
/// answered (the loopback server bounds connections in that phase).
pub async fn serve<S>(
    ws: WebSocketStream<S>,
    link: &Link,
    subscriber_id: &str,
    peer: Peer,
    keepalive: Option<Keepalive>,
    cancel: CancellationToken,
    hello_permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> LinkEnd
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let codec = peer.codec;
    let lane = peer.lane.clone();
    let (sink, mut inbound) = ws.split();
    let mut writer = Writer {
        sink,
        cancel: cancel.clone(),
    };
    // Registered before anything is read, so a `subscriber.remove` from now on closes us.
    let connection = link.grants().connected(subscriber_id, cancel.clone());
    let _registered = Registration {
        grants: link.grants(),
        subscriber_id,
        connection,
    };

    // 1. Hello.
    let hello = tokio::select! {
        () = cancel.cancelled() => return LinkEnd::Cancelled,
        first = tokio::time::timeout(HELLO_TIMEOUT, inbound.next()) => first,
    };
    let hello = match hello {
        Ok(Some(Ok(message))) => decode_in(codec, &message)
            .and_then(Result::ok)
            .filter(|f| f.cmd == CmdId::Hello)
            .and_then(|f| f.body::<pb::Hello>().ok().map(|h| (f.request_id, h))),
        _ => None,
    };
    let Some((hello_id, hello)) = hello else {
        let refusal = wire::error_message(
            codec,
            0,
            ErrorCode::HelloRequired,
            "the first frame must be a Hello",
        );
        if writer.write([to_ws(refusal)]).await {
            writer.close(CloseCode::Policy, "hello_required").await;
        }
        return LinkEnd::NoHello;
    };

    // 2. Subscribe per the stored row; the peer's cursor wins.
    let opened = tokio::select! {
        () = cancel.cancelled() => return LinkEnd::Cancelled,
        opened = link.handler.subscribers().open(subscriber_id, hello.cursor) => opened,
    };
    let (mut sub, caller) = match opened {
        Ok(opened) => {
            let resp = pb::HelloResp {
                subscriber_id: opened.subscriber_id,
                host_version: crate::VERSION.to_owned(),
                replay_from: opened.replay_from,
                replay_mode: opened.replay_mode.as_str().to_owned(),
                forward_deltas: opened.forward_deltas,
                session_id: opened.session_id.unwrap_or_default(),
            };
            let caller = Caller {
                via: peer.via,
                access: peer.access.unwrap_or_else(|| Access::new(opened.scope)),
            };
            let mut sub = opened.subscription;
            // The socket is lent before the peer hears it is subscribed, so that nothing of the
            // lane's set-up stands between its `HelloResp` and its first catch-up (which makes
            // the subscription live).
            if let Some(lane) = &lane {
                let access = caller.access.clone();
                lane.route(codec, Box::new(move |session| access.has_session(session)));
                if !sub.lend(lane.clone()).await {
                    return LinkEnd::Cancelled;
                }
            }
            let frame = wire::encode_as(codec, CmdId::HelloResp, hello_id, &resp);
            if !writer.write([to_ws(frame)]).await {
                return LinkEnd::WriteFailed;
            }
            (sub, caller)
        }
        Err(e) => {
            let refused = subscriber_error(e);
            let code = refused.error_code().unwrap_or(ErrorCode::Internal);
            let message = refused.message;
            if writer
                .write([to_ws(wire::error_message(codec, hello_id, code, &message))])
                .await
            {
                writer.close(CloseCode::Policy, code.name()).await;
            }
            return LinkEnd::Refused(message);
        }
    };
    drop(hello_permit);
    tracing::info!(client = %hello.client_name, "subscriber connected");

    // 3. Events out, frames in, pings.
    let mut last_heard = Instant::now();
    let mut pings = keepalive.map(|k| {
        let mut every = tokio::time::interval_at(Instant::now() + k.interval, k.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        (every, k.dead_after)
    });
    // Armed once for the connection's life, not once per event.
    let mut cancelled = std::pin::pin!(cancel.cancelled());
    let (end, close): (LinkEnd, Option<(CloseCode, &str)>) = loop {
        // Everything taken is written and flushed: an idle connection lets the hub write a
        // lone delta to it directly.
        sub.arm_direct();
        tokio::select! {
            biased;
            () = &mut cancelled => break (LinkEnd::Cancelled, Some((CloseCode::Away, "host shutting down or subscriber removed"))),
            frame = inbound.next() => {
                last_heard = Instant::now();
                match frame {
                    None | Some(Ok(Message::Close(_))) => break (LinkEnd::PeerClosed, None),
                    Some(Ok(message)) => {
                        // A reply comes before any delta published while it is worked out,
                        // as through the queue: no lane until it is written.
                        if let Some(lane) = &lane {
                            lane.disarm();
                        }
                        let Some(decoded) = decode_in(codec, &message) else {
                            continue;
                        };
                        let reply = match decoded {
                            Ok(frame) => handle_frame(link, &caller, &sub, codec, frame).await,
                            Err((request_id, e)) => {
                                Some(wire::error_message(codec, request_id, wire_code(&e), e.to_string()))
                            }
                        };
                        if let Some(reply) = reply
                            && !writer.write([to_ws(reply)]).await
                        {
                            break (LinkEnd::WriteFailed, None);
                        }
                    }
                    Some(Err(WsError::Capacity(e))) => {
                        tracing::info!(error = %e, "closing: message too large");
                        break (LinkEnd::Protocol("a message over 1 MiB".to_owned()), Some((CloseCode::Size, "frame_too_large: messages are limited to 1 MiB")));
                    }
                    Some(Err(WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake))) => {
                        break (LinkEnd::PeerClosed, None);
                    }
                    Some(Err(WsError::Protocol(e))) => {
                        tracing::info!(error = %e, "closing: WebSocket protocol violation");
                        break (LinkEnd::Protocol(e.to_string()), Some((CloseCode::Protocol, "invalid_frame: WebSocket protocol violation")));
                    }
                    Some(Err(WsError::Utf8(e))) => {
                        tracing::info!(error = %e, "closing: a text message that is not UTF-8");
                        break (LinkEnd::Protocol(e.to_string()), Some((CloseCode::Invalid, "invalid_frame: a text message that is not UTF-8")));
                    }
                    Some(Err(e)) => break (LinkEnd::Protocol(e.to_string()), None),
                }
            },
            next = sub.recv() => match next {
                Ok(Some(first)) => {
                    // Write whatever else is ready with it: one flush per batch.
                    let mut batch = Vec::new();
                    let mut next = Some(first);
                    while let Some(delivery) = next {
                        if caller.access.has_session(&delivery.session_id) {
                            batch.push(to_ws(delivery.push_message(codec)));
                        }
                        if batch.len() >= MAX_WRITE_BATCH {
                            break;
                        }
                        next = sub.try_next();
                    }
                    if !batch.is_empty() && !writer.write(batch).await {
                        break (LinkEnd::WriteFailed, None);
                    }
                }
                Ok(None) => break (LinkEnd::Cancelled, Some((CloseCode::Away, "host shutting down"))),
                Err(e) => {
                    tracing::error!(error = %e, "subscription failed");
                    break (LinkEnd::Cancelled, Some((CloseCode::Error, "internal: the subscription failed")));
                }
            },
            () = async {
                match &lane {
                    Some(lane) => lane.woken().await,
                    None => std::future::pending().await,
                }
            } => {
                // The hub wrote part of a frame: the stream writes its tail first.
                if !writer.write([]).await {
                    break (LinkEnd::WriteFailed, None);
                }
            },
            _ = async {
                match pings.as_mut() {
                    Some((every, _)) => every.tick().await,
                    None => std::future::pending().await,
                }
            } => {
                let dead_after = pings.as_ref().map_or(Duration::MAX, |(_, d)| *d);
                if last_heard.elapsed() >= dead_after {
                    tracing::info!("closing: nothing heard from the peer");
                    break (LinkEnd::DeadPeer, Some((CloseCode::Away, "no answer to pings")));
                }
                if !writer.write([Message::Ping(bytes::Bytes::new())]).await {
                    break (LinkEnd::WriteFailed, None);
                }
            },
        }
    };
    // Nothing more from the hub once the loop has ended (a peer's close, an error, a
    // cancellation), before any close frame.
    if let Some(lane) = &lane {
        lane.close();
    }
    if let Some((code, reason)) = close {
        writer.close(code, reason).await;
    }
    tracing::info!(%end, "subscriber disconnected");
    end
}

/// Answer one inbound frame: the reply to send, if any (none for an `Ack`).
async fn handle_frame(
    link: &Link,
    caller: &Caller,
    sub: &Subscription,
    codec: Codec,
    frame: Decoded,
) -> Option<WireMessage> {
    let id = frame.request_id;
    let refuse =
        |code: ErrorCode, message: String| Some(wire::error_message(codec, id, code, message));
    match frame.cmd {
        CmdId::Ack => {
            let ack: pb::Ack = match frame.body() {
                Ok(ack) => ack,
                Err(e) => return refuse(wire_code(&e), e.to_string()),
            };
            // Never past what this connection was actually given.
            let cursor = ack.cursor.clamp(0, sub.position());
            match sub.ack(cursor).await {
                Ok(()) => None,
                Err(e) => refuse(ErrorCode::ShuttingDown, e.to_string()),
            }
        }
        CmdId::Ping => match frame.body::<pb::Ping>() {
            Ok(ping) => Some(wire::encode_as(
                codec,
                CmdId::Pong,
                id,
                &pb::Pong { nonce: ping.nonce },
            )),
            Err(e) => refuse(wire_code(&e), e.to_string()),
        },
        CmdId::Request => {
            let request: pb::Request = match frame.body() {
                Ok(request) => request,
                Err(e) => return refuse(wire_code(&e), e.to_string()),
            };
            let reply = answer(link, caller, request).await;
            let data_json = if reply.data.is_null() {
                String::new()
            } else {
                reply.data.to_string()
            };
            Some(wire::encode_as(
                codec,
                CmdId::Reply,
                id,
                &pb::Reply {
                    code: reply.code,
                    message: reply.message,
                    data_json,
                },
            ))
        }
        CmdId::Hello => refuse(
            ErrorCode::InvalidFrame,
            "Hello was already received on this connection".to_owned(),
        ),
        CmdId::CmdUnspecified
        | CmdId::HelloResp
        | CmdId::EventPush
        | CmdId::Pong
        | CmdId::Reply
        | CmdId::ErrorResp => refuse(
            ErrorCode::UnknownCmd,
            format!(
                "{} is sent by the server, not a client request",
                frame.cmd.as_str_name()
            ),
        ),
    }
}

/// One envelope command through the request layer, exactly as IPC parses it.
async fn answer(link: &Link, caller: &Caller, request: pb::Request) -> Reply {
    let params = if request.params_json.trim().is_empty() {
        serde_json::Value::Null
    } else {
        match crate::protocol::strict_json::parse(&request.params_json) {
            Ok(params) => params,
            Err(e) => {
                return Reply::error(
                    ErrorCode::InvalidJson,
                    format!("params_json is not valid JSON: {e}"),
                    serde_json::Value::Null,
                );
            }
        }
    };
    match Command::parse_named(&request.command, params) {
        Ok(command) => link.handler.handle(caller, command).await,
        Err(refused) => refused.into_reply(),
    }
}
