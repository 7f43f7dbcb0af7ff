//! One wire connection, the host's side (design §7), whichever side dialed: the loopback
//! server's accepted connections and the relay client's outbound one run the same code, so a
//! renderer written for one works for the other.
//!
//! 1. The first frame must be `Hello`; its cursor, if any, wins over the stored one. The reply
//!    is `HelloResp`, then replay (per the subscriber's mode), then live events, as `EventPush`.
//! 2. Inbound: `Ack` advances the stored cursor (batched by the bus), `Ping` → `Pong`, requests
//!    → their responses or `ErrorResp`. A bad frame gets `ErrorResp`; an oversized message
//!    (> 1 MiB) closes the connection with code 1009 and a reason.
//! 3. Every request is checked against the connection's [`Scope`] (all for the loopback
//!    server's grants; the configured one for the relay), and events of sessions outside it are
//!    not sent.
//! 4. [`Keepalive`]: a WebSocket ping every interval; a peer from which nothing arrived for the
//!    dead-peer time is dropped.
//!
//! Overload: the connection's task writes its events in batches (one flush each). A peer that
//! stops reading blocks that write; the task then takes nothing from its bus subscription,
//! which the hub moves to catch-up from SQLite — memory stays bounded and nobody else waits.
//! A write blocked for 60 s ends the connection.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
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

use super::grants::GrantStore;
use super::replay_mode_of;
use crate::bus::{Bus, Delivery, Replay, SubscribeOptions, Subscription};
use crate::protocol::envelope::{ErrorCode, PermissionDecision, ReplayMode};
use crate::protocol::wire::{self, CmdId, Decoded, pb};
use crate::session::{DEFAULT_HISTORY_LIMIT, NewSession, SessionError, SessionManager};
use crate::store::{SessionFilter, SessionRow, Store};

/// How long a peer has to send `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection needs.
#[derive(Clone)]
pub struct Link {
    pub grants: Arc<GrantStore>,
    pub bus: Bus,
    pub sessions: SessionManager,
    pub store: Store,
}

/// What a connection may do. The loopback server's grants may do everything; a relay token
/// grants what its configuration declares.
#[derive(Debug, Clone)]
pub struct Scope {
    /// `None`: every session. Otherwise these, plus the ones this scope created.
    pub sessions: Option<Arc<Mutex<HashSet<String>>>>,
    /// May send prompts and cancel runs.
    pub prompt: bool,
    /// May answer permission requests.
    pub permissions: bool,
    /// May create sessions.
    pub create_sessions: bool,
}

impl Scope {
    /// Everything (a loopback grant).
    pub fn all() -> Scope {
        Scope {
            sessions: None,
            prompt: true,
            permissions: true,
            create_sessions: true,
        }
    }

    /// Whether events and requests of `session_id` are in scope.
    pub fn has_session(&self, session_id: &str) -> bool {
        match &self.sessions {
            None => true,
            Some(set) => set.lock().is_ok_and(|s| s.contains(session_id)),
        }
    }

    fn session(&self, session_id: &str) -> Result<(), (ErrorCode, String)> {
        if self.has_session(session_id) {
            Ok(())
        } else {
            Err((
                ErrorCode::OutOfScope,
                format!("session {session_id:?} is outside this connection's scope"),
            ))
        }
    }

    fn allows(&self, allowed: bool, what: &str) -> Result<(), (ErrorCode, String)> {
        if allowed {
            Ok(())
        } else {
            Err((
                ErrorCode::OutOfScope,
                format!("this connection's scope does not allow {what}"),
            ))
        }
    }
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
    async fn write(&mut self, frames: impl IntoIterator<Item = Message>) -> bool {
        let sink = &mut self.sink;
        let work = async {
            for frame in frames {
                sink.feed(frame).await?;
            }
            sink.flush().await
        };
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

/// Serve one connection until it ends. One task does both directions: it waits for an
/// inbound frame or the next event, and writes what it has in batches. While a write is
/// blocked (the peer does not read) nothing is taken from the subscription, which the hub
/// then moves to catch-up: memory stays bounded. `hello_permit` is held until `Hello` is
/// answered (the loopback server bounds connections in that phase).
pub async fn serve<S>(
    ws: WebSocketStream<S>,
    link: &Link,
    subscriber_id: &str,
    scope: &Scope,
    keepalive: Option<Keepalive>,
    cancel: CancellationToken,
    hello_permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> LinkEnd
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (sink, mut inbound) = ws.split();
    let mut writer = Writer {
        sink,
        cancel: cancel.clone(),
    };
    // Registered before anything is read, so a `subscriber.remove` from now on closes us.
    let connection = link.grants.connected(subscriber_id, cancel.clone());
    let _registered = Registration {
        grants: &link.grants,
        subscriber_id,
        connection,
    };

    // 1. Hello.
    let hello = tokio::select! {
        () = cancel.cancelled() => return LinkEnd::Cancelled,
        first = tokio::time::timeout(HELLO_TIMEOUT, inbound.next()) => first,
    };
    let hello = match hello {
        Ok(Some(Ok(Message::Binary(bytes)))) => wire::decode(&bytes)
            .ok()
            .filter(|f| f.cmd == CmdId::Hello)
            .and_then(|f| f.body::<pb::Hello>().ok().map(|h| (f.request_id, h))),
        _ => None,
    };
    let Some((hello_id, hello)) = hello else {
        let refusal = wire::error_frame(
            0,
            ErrorCode::HelloRequired,
            "the first frame must be a Hello",
        );
        if writer.write([Message::Binary(refusal)]).await {
            writer.close(CloseCode::Policy, "hello_required").await;
        }
        return LinkEnd::NoHello;
    };

    // 2. Subscribe per the stored row; the peer's cursor wins.
    let opened = tokio::select! {
        () = cancel.cancelled() => return LinkEnd::Cancelled,
        opened = open_subscription(link, subscriber_id, &hello) => opened,
    };
    let mut sub = match opened {
        Ok((sub, resp)) => {
            let frame = wire::encode(CmdId::HelloResp, hello_id, &resp);
            if !writer.write([Message::Binary(frame)]).await {
                return LinkEnd::WriteFailed;
            }
            sub
        }
        Err((code, message)) => {
            if writer
                .write([Message::Binary(wire::error_frame(hello_id, code, &message))])
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
    let (end, close): (LinkEnd, Option<(CloseCode, &str)>) = loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break (LinkEnd::Cancelled, Some((CloseCode::Away, "host shutting down or subscriber removed"))),
            frame = inbound.next() => {
                last_heard = Instant::now();
                match frame {
                    None | Some(Ok(Message::Close(_))) => break (LinkEnd::PeerClosed, None),
                    Some(Ok(Message::Binary(bytes))) => {
                        let replies = handle_frame(link, scope, &sub, subscriber_id, &bytes).await;
                        if !replies.is_empty() && !writer.write(replies.into_iter().map(Message::Binary)).await {
                            break (LinkEnd::WriteFailed, None);
                        }
                    }
                    Some(Ok(Message::Text(_))) => {
                        let reply = wire::error_frame(
                            0,
                            ErrorCode::InvalidFrame,
                            "text messages are not part of the protocol: send binary Frames",
                        );
                        if !writer.write([Message::Binary(reply)]).await {
                            break (LinkEnd::WriteFailed, None);
                        }
                    }
                    Some(Ok(_ping_pong_or_raw)) => {}
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
                    Some(Err(e)) => break (LinkEnd::Protocol(e.to_string()), None),
                }
            },
            next = sub.recv() => match next {
                Ok(Some(first)) => {
                    // Write whatever else is ready with it: one flush per batch.
                    let mut batch = Vec::new();
                    let mut next = Some(first);
                    while let Some(delivery) = next {
                        if scope.has_session(&delivery.session_id) {
                            batch.push(Message::Binary(delivery.push_frame()));
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
    if let Some((code, reason)) = close {
        writer.close(code, reason).await;
    }
    tracing::info!(%end, "subscriber disconnected");
    end
}

async fn open_subscription(
    ctx: &Link,
    subscriber_id: &str,
    hello: &pb::Hello,
) -> Result<(Subscription, pb::HelloResp), (ErrorCode, String)> {
    let store_err = |e: crate::store::StoreError| (ErrorCode::StoreFailed, e.to_string());
    let row = ctx
        .store
        .get_subscriber(subscriber_id.to_owned())
        .await
        .map_err(store_err)?
        .ok_or((
            ErrorCode::SubscriberNotFound,
            "the subscriber was removed".to_owned(),
        ))?;
    let filter = match &row.session_id {
        Some(id) => SessionFilter::One(id.as_str().into()),
        None => SessionFilter::All,
    };
    let mode = replay_mode_of(&row);
    let stored = row.most_recent_sequence_id;
    // A client-held cursor wins. Otherwise: `none` starts at the end, `since_cursor` at the
    // stored cursor, and `max_count` replays the newest N — or less, when the stored cursor
    // says the subscriber already has some of them.
    let replay = match (hello.cursor, mode) {
        (Some(cursor), _) => Replay::SinceCursor(cursor.max(0)),
        (None, ReplayMode::None) => Replay::None,
        (None, ReplayMode::SinceCursor) => Replay::SinceCursor(stored),
        (None, ReplayMode::MaxCount) => {
            let n = u32::try_from(row.max_count).unwrap_or(crate::bus::DEFAULT_MAX_COUNT);
            let newest = ctx
                .store
                .cursor_before_last(filter.clone(), n)
                .await
                .map_err(store_err)?;
            Replay::SinceCursor(newest.max(stored))
        }
    };
    let sub = ctx
        .bus
        .subscribe(SubscribeOptions {
            filter,
            forward_deltas: row.forward_deltas,
            replay,
            subscriber_id: Some(row.subscriber_id.clone()),
        })
        .await
        .map_err(|e| (ErrorCode::ShuttingDown, e.to_string()))?;
    let resp = pb::HelloResp {
        subscriber_id: row.subscriber_id,
        host_version: crate::VERSION.to_owned(),
        replay_from: sub.position(),
        replay_mode: mode.as_str().to_owned(),
        forward_deltas: row.forward_deltas,
        session_id: row.session_id.unwrap_or_default(),
    };
    Ok((sub, resp))
}

/// Answer one inbound binary frame; the replies to send, in order (none for an `Ack`).
async fn handle_frame(
    ctx: &Link,
    scope: &Scope,
    sub: &Subscription,
    subscriber_id: &str,
    bytes: &[u8],
) -> Vec<bytes::Bytes> {
    let frame = match wire::decode(bytes) {
        Ok(frame) => frame,
        Err((request_id, e)) => {
            return vec![wire::error_frame(request_id, e.code(), e.to_string())];
        }
    };
    let id = frame.request_id;
    match answer(ctx, scope, sub, subscriber_id, &frame).await {
        Ok(Some(reply)) => vec![reply],
        Ok(None) => vec![],
        Err((code, message)) => vec![wire::error_frame(id, code, message)],
    }
}

type Answer = Result<Option<bytes::Bytes>, (ErrorCode, String)>;

fn session_err(e: SessionError) -> (ErrorCode, String) {
    let message = e.to_string();
    let code = match e {
        SessionError::NotFound(_) => ErrorCode::SessionNotFound,
        SessionError::CwdNotFound { .. } => ErrorCode::CwdNotFound,
        SessionError::UnknownAgentType(_) => ErrorCode::UnknownAgentType,
        SessionError::InvalidParams(_) => ErrorCode::InvalidParams,
        SessionError::NoAgent(_) => ErrorCode::NoAgent,
        SessionError::AgentUnavailable(_) => ErrorCode::AgentUnavailable,
        SessionError::RunNotFound(_) => ErrorCode::RunNotFound,
        SessionError::PermissionNotFound(_) => ErrorCode::PermissionNotFound,
        SessionError::AlreadyResolved { .. } => ErrorCode::AlreadyResolved,
        SessionError::ShuttingDown => ErrorCode::ShuttingDown,
        SessionError::StoreUnavailable(_) => ErrorCode::StoreUnavailable,
        SessionError::Store(_) => ErrorCode::StoreFailed,
    };
    (code, message)
}

fn session_info(r: SessionRow) -> pb::SessionInfo {
    pb::SessionInfo {
        session_id: r.session_id,
        agent_type: r.agent_type,
        cwd: r.cwd,
        title: r.title.unwrap_or_default(),
        state: r.state,
        parent_session_id: r.parent_session_id.unwrap_or_default(),
        native_session_id: r.native_session_id.unwrap_or_default(),
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
    }
}

fn bad_body(e: wire::WireError) -> (ErrorCode, String) {
    (e.code(), e.to_string())
}

async fn answer(
    ctx: &Link,
    scope: &Scope,
    sub: &Subscription,
    subscriber_id: &str,
    frame: &Decoded,
) -> Answer {
    let id = frame.request_id;
    match frame.cmd {
        CmdId::Ack => {
            let ack: pb::Ack = frame.body().map_err(bad_body)?;
            // Never past what this connection was actually given.
            let cursor = ack.cursor.clamp(0, sub.position());
            sub.ack(cursor)
                .await
                .map_err(|e| (ErrorCode::ShuttingDown, e.to_string()))?;
            Ok(None)
        }
        CmdId::Ping => {
            let ping: pb::Ping = frame.body().map_err(bad_body)?;
            Ok(Some(wire::encode(
                CmdId::Pong,
                id,
                &pb::Pong { nonce: ping.nonce },
            )))
        }
        CmdId::RelayMessageReq => {
            let req: pb::RelayMessageReq = frame.body().map_err(bad_body)?;
            scope.allows(scope.prompt, "prompts")?;
            scope.session(&req.session_id)?;
            let client_msg_id = Some(req.client_msg_id).filter(|k| !k.is_empty());
            let receipt = ctx
                .sessions
                .send(&req.session_id, req.text, client_msg_id)
                .await
                .map_err(session_err)?;
            Ok(Some(wire::encode(
                CmdId::NewRoundResp,
                id,
                &pb::NewRoundResp {
                    run_id: receipt.run_id,
                    queued: receipt.queued,
                },
            )))
        }
        CmdId::CancelRunReq => {
            let req: pb::CancelRunReq = frame.body().map_err(bad_body)?;
            scope.allows(scope.prompt, "cancelling runs")?;
            scope.session(&req.session_id)?;
            let run_id = Some(req.run_id).filter(|r| !r.is_empty());
            let receipt = ctx
                .sessions
                .cancel(&req.session_id, run_id)
                .await
                .map_err(session_err)?;
            Ok(Some(wire::encode(
                CmdId::CancelRunResp,
                id,
                &pb::CancelRunResp {
                    run_id: receipt.run_id,
                    state: receipt.state.to_owned(),
                },
            )))
        }
        CmdId::PermissionDecisionReq => {
            let req: pb::PermissionDecisionReq = frame.body().map_err(bad_body)?;
            scope.allows(scope.permissions, "answering permission requests")?;
            scope.session(&req.session_id)?;
            let decision = PermissionDecision::parse(&req.decision).ok_or_else(|| {
                (
                    ErrorCode::InvalidParams,
                    format!("decision {:?} is not \"allow\" or \"deny\"", req.decision),
                )
            })?;
            let receipt = ctx
                .sessions
                .respond_permission(
                    &req.session_id,
                    req.request_id,
                    decision,
                    None,
                    subscriber_id.to_owned(),
                )
                .await
                .map_err(session_err)?;
            Ok(Some(wire::encode(
                CmdId::PermissionDecisionResp,
                id,
                &pb::PermissionDecisionResp {
                    request_id: receipt.request_id,
                },
            )))
        }
        CmdId::ListHistorySessionsReq => {
            let req: pb::ListHistorySessionsReq = frame.body().map_err(bad_body)?;
            let mut rows = ctx.sessions.list().await.map_err(session_err)?;
            rows.retain(|r| scope.has_session(&r.session_id));
            if req.limit > 0 {
                rows.truncate(req.limit as usize);
            }
            let sessions = rows.into_iter().map(session_info).collect();
            Ok(Some(wire::encode(
                CmdId::ListHistorySessionsResp,
                id,
                &pb::ListHistorySessionsResp { sessions },
            )))
        }
        CmdId::ListSessionRunsReq => {
            let req: pb::ListSessionRunsReq = frame.body().map_err(bad_body)?;
            scope.session(&req.session_id)?;
            ctx.sessions
                .get(&req.session_id)
                .await
                .map_err(session_err)?;
            let runs = ctx
                .store
                .list_runs(req.session_id)
                .await
                .map_err(|e| (ErrorCode::StoreFailed, e.to_string()))?
                .into_iter()
                .map(|r| pb::RunInfo {
                    run_id: r.run_id,
                    state: r.state,
                    client_msg_id: r.client_msg_id.unwrap_or_default(),
                    error_category: r.error_category.unwrap_or_default(),
                    created_at_ms: r.created_at_ms,
                    ended_at_ms: r.ended_at_ms.unwrap_or_default(),
                })
                .collect();
            Ok(Some(wire::encode(
                CmdId::ListSessionRunsResp,
                id,
                &pb::ListSessionRunsResp { runs },
            )))
        }
        CmdId::GetSessionHistoryReq => {
            let req: pb::GetSessionHistoryReq = frame.body().map_err(bad_body)?;
            scope.session(&req.session_id)?;
            let limit = if req.limit == 0 {
                DEFAULT_HISTORY_LIMIT
            } else {
                req.limit
            };
            let events = ctx
                .sessions
                .history(&req.session_id, req.after_seq, limit)
                .await
                .map_err(session_err)?;
            let next_after_seq = events.last().map_or(req.after_seq, |e| e.sequence_id);
            // A full page (by count, or cut by size) may have more behind it; an empty next
            // page settles it.
            let page_bytes: usize = events.iter().map(|e| e.payload.len()).sum();
            let has_more = events.len() >= limit.min(crate::session::MAX_HISTORY_LIMIT) as usize
                || page_bytes + events.last().map_or(0, |e| e.payload.len())
                    > crate::session::MAX_HISTORY_BYTES;
            Ok(Some(wire::encode(
                CmdId::GetSessionHistoryResp,
                id,
                &pb::GetSessionHistoryResp {
                    events: events.iter().map(Delivery::stored_push).collect(),
                    next_after_seq,
                    has_more,
                },
            )))
        }
        CmdId::CreateSessionReq => {
            let req: pb::CreateSessionReq = frame.body().map_err(bad_body)?;
            scope.allows(scope.create_sessions, "creating sessions")?;
            let row = ctx
                .sessions
                .create(NewSession {
                    agent_type: req.agent_type,
                    cwd: req.cwd,
                    title: Some(req.title).filter(|t| !t.is_empty()),
                })
                .await
                .map_err(session_err)?;
            if let Some(set) = &scope.sessions
                && let Ok(mut set) = set.lock()
            {
                set.insert(row.session_id.clone());
            }
            Ok(Some(wire::encode(
                CmdId::CreateSessionResp,
                id,
                &pb::CreateSessionResp {
                    session: Some(session_info(row)),
                },
            )))
        }
        CmdId::Hello => Err((
            ErrorCode::InvalidFrame,
            "Hello was already received on this connection".to_owned(),
        )),
        CmdId::CmdUnspecified
        | CmdId::HelloResp
        | CmdId::EventPush
        | CmdId::NewRoundResp
        | CmdId::CancelRunResp
        | CmdId::PermissionDecisionResp
        | CmdId::ListHistorySessionsResp
        | CmdId::ListSessionRunsResp
        | CmdId::GetSessionHistoryResp
        | CmdId::Pong
        | CmdId::CreateSessionResp
        | CmdId::ErrorResp => Err((
            ErrorCode::UnknownCmd,
            format!(
                "{:?} is sent by the server, not a client request",
                frame.cmd
            ),
        )),
    }
}
