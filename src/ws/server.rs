//! The loopback WebSocket server. Binds `127.0.0.1` only (never a wildcard address).
//!
//! A connection's life (docs/protocol.md has the client's view):
//! 1. TCP accept; the peer must be a loopback address.
//! 2. HTTP upgrade on `/subscribe`, checked in the handshake callback, before any frame:
//!    wrong path → 404; `Host` not this loopback address and port → 403; an `Origin` that is
//!    neither this server's loopback origin nor configured → 403; missing, unknown or expired
//!    grant token (`Authorization: Bearer …` or a `bearer.…` subprotocol entry) → 401.
//! 3. The first frame must be `Hello`; its cursor, if any, wins over the stored one. The reply
//!    is `HelloResp`, then replay (per the subscriber's mode), then live events, as `EventPush`.
//! 4. Inbound: `Ack` advances the stored cursor (batched by the bus), `Ping` → `Pong`, requests
//!    → their responses or `ErrorResp`. A bad frame gets `ErrorResp`; an oversized message
//!    (> 1 MiB) closes the connection with code 1009 and a reason. Nothing a client sends
//!    stops the host or other connections.
//!
//! Overload: a connection's task writes its events in batches (one flush each). A client that
//! stops reading blocks that write; the task then takes nothing from its bus subscription,
//! which the hub moves to catch-up from SQLite — memory stays bounded and nobody else waits.
//! A write blocked for 60 s ends the connection.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::grants::GrantStore;
use super::{PATH, replay_mode_of};
use crate::bus::{Bus, Delivery, Replay, SubscribeOptions, Subscription};
use crate::protocol::envelope::{ErrorCode, PermissionDecision, ReplayMode};
use crate::protocol::wire::{
    self, CmdId, Decoded, MAX_FRAME_BYTES, SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX, pb,
};
use crate::session::{DEFAULT_HISTORY_LIMIT, SessionError, SessionManager};
use crate::store::{SessionFilter, Store};

/// How long a client has to finish the HTTP upgrade, and then to send `Hello`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections that may be in the upgrade or `Hello` at once; more wait for a slot.
const MAX_HANDSHAKES: usize = 64;

/// What every connection task needs.
pub struct WsContext {
    pub grants: Arc<GrantStore>,
    pub bus: Bus,
    pub sessions: SessionManager,
    pub store: Store,
    pub port: u16,
    pub allowed_origins: Vec<String>,
}

/// Bind the loopback listener. Port 0 picks a free port.
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await
}

/// Accept until `cancel`; each connection runs on `tracker` with a child token of `cancel`.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<WsContext>,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = (tokio::select! {
            () = cancel.cancelled() => break,
            permit = handshakes.clone().acquire_owned() => permit,
        }) else {
            break;
        };
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "WebSocket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if !peer.ip().is_loopback() {
            // Cannot happen while bound to 127.0.0.1; refuse anyway rather than trust it.
            tracing::warn!(%peer, "refused a non-loopback peer");
            continue;
        }
        let ctx = ctx.clone();
        let cancel = cancel.child_token();
        tracker.spawn(async move {
            if let Err(e) = connection(stream, ctx, cancel, permit).await {
                tracing::debug!(%peer, error = %e, "WebSocket connection ended with an error");
            }
        });
    }
    tracing::debug!("WebSocket listener stopped");
}

/// The outcome of checking an upgrade request.
#[derive(Debug, PartialEq)]
struct Authorized {
    subscriber_id: String,
    /// The client offered our subprotocol: the response must select it.
    select_subprotocol: bool,
}

fn header_str(req: &Request, name: header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Check path, Host, Origin and token, in that order.
fn authorize(
    req: &Request,
    grants: &GrantStore,
    port: u16,
    allowed_origins: &[String],
) -> Result<Authorized, (StatusCode, String)> {
    if req.uri().path() != PATH {
        return Err((StatusCode::NOT_FOUND, format!("only {PATH} is served")));
    }
    let host = header_str(req, header::HOST).unwrap_or_default();
    let host_ok = [format!("127.0.0.1:{port}"), format!("localhost:{port}")]
        .iter()
        .any(|h| h.eq_ignore_ascii_case(host));
    if !host_ok {
        return Err((
            StatusCode::FORBIDDEN,
            "Host must be this server's loopback address".to_owned(),
        ));
    }
    if let Some(origin) = header_str(req, header::ORIGIN) {
        let own = [
            format!("http://127.0.0.1:{port}"),
            format!("http://localhost:{port}"),
        ];
        let ok = own.iter().any(|o| o.eq_ignore_ascii_case(origin))
            || allowed_origins.iter().any(|o| o == origin);
        if !ok {
            return Err((StatusCode::FORBIDDEN, "Origin not allowed".to_owned()));
        }
    }
    let bearer = header_str(req, header::AUTHORIZATION)
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let offered: Vec<&str> = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let from_protocol = offered
        .iter()
        .find_map(|p| p.strip_prefix(TOKEN_SUBPROTOCOL_PREFIX));
    let subscriber_id = grants
        .check(bearer.or(from_protocol))
        .map_err(|e| (StatusCode::UNAUTHORIZED, e.to_string()))?;
    Ok(Authorized {
        subscriber_id,
        select_subprotocol: offered.contains(&SUBPROTOCOL),
    })
}

fn refusal(status: StatusCode, reason: String) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(reason));
    *response.status_mut() = status;
    response
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("handshake: {0}")]
    Handshake(#[from] WsError),
    #[error("handshake timed out")]
    Timeout,
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

#[expect(
    clippy::result_large_err,
    reason = "the handshake callback's signature is tungstenite's"
)]
async fn connection(
    stream: TcpStream,
    ctx: Arc<WsContext>,
    cancel: CancellationToken,
    handshake: tokio::sync::OwnedSemaphorePermit,
) -> Result<(), ConnError> {
    stream.set_nodelay(true)?;
    let mut granted: Option<String> = None;
    let callback = |req: &Request, mut response: Response| match authorize(
        req,
        &ctx.grants,
        ctx.port,
        &ctx.allowed_origins,
    ) {
        Ok(auth) => {
            if auth.select_subprotocol {
                response.headers_mut().insert(
                    header::SEC_WEBSOCKET_PROTOCOL,
                    HeaderValue::from_static(SUBPROTOCOL),
                );
            }
            granted = Some(auth.subscriber_id);
            Ok(response)
        }
        Err((status, reason)) => {
            tracing::info!(%status, %reason, "WebSocket upgrade refused");
            Err(refusal(status, reason))
        }
    };
    let upgrade =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(ws_config()));
    let ws = tokio::select! {
        () = cancel.cancelled() => return Ok(()),
        upgraded = tokio::time::timeout(HANDSHAKE_TIMEOUT, upgrade) => {
            upgraded.map_err(|_| ConnError::Timeout)??
        }
    };
    let Some(subscriber_id) = granted else {
        return Ok(());
    };
    let span = tracing::info_span!("ws", subscriber_id = %subscriber_id);
    tracing::Instrument::instrument(session(ws, ctx, subscriber_id, cancel, handshake), span).await;
    Ok(())
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

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
struct Writer {
    sink: futures_util::stream::SplitSink<Ws, Message>,
    cancel: CancellationToken,
}

impl Writer {
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

/// Everything after the upgrade. One task per connection does both directions: it waits for
/// an inbound frame or the next event, and writes what it has in batches. While a write is
/// blocked (the client does not read) nothing is taken from the subscription, which the hub
/// then moves to catch-up: memory stays bounded.
async fn session(
    ws: Ws,
    ctx: Arc<WsContext>,
    subscriber_id: String,
    cancel: CancellationToken,
    handshake: tokio::sync::OwnedSemaphorePermit,
) {
    let (sink, mut inbound) = ws.split();
    let mut writer = Writer {
        sink,
        cancel: cancel.clone(),
    };
    // Registered before anything is read, so a `subscriber.remove` from now on closes us.
    let connection = ctx.grants.connected(&subscriber_id, cancel.clone());
    let _registered = Registration {
        grants: &ctx.grants,
        subscriber_id: &subscriber_id,
        connection,
    };

    // 1. Hello.
    let hello = tokio::select! {
        () = cancel.cancelled() => return,
        first = tokio::time::timeout(HANDSHAKE_TIMEOUT, inbound.next()) => first,
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
        return;
    };

    // 2. Subscribe per the stored row; the client's cursor wins.
    let opened = tokio::select! {
        () = cancel.cancelled() => return,
        opened = open_subscription(&ctx, &subscriber_id, &hello) => opened,
    };
    let mut sub = match opened {
        Ok((sub, resp)) => {
            let frame = wire::encode(CmdId::HelloResp, hello_id, &resp);
            if !writer.write([Message::Binary(frame)]).await {
                return;
            }
            sub
        }
        Err((code, message)) => {
            if writer
                .write([Message::Binary(wire::error_frame(hello_id, code, message))])
                .await
            {
                writer.close(CloseCode::Policy, code.name()).await;
            }
            return;
        }
    };
    drop(handshake);
    tracing::info!(client = %hello.client_name, "subscriber connected");

    // 3. Events out, frames in.
    let end: Option<(CloseCode, &str)> = loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break Some((CloseCode::Away, "host shutting down or subscriber removed")),
            frame = inbound.next() => match frame {
                None | Some(Ok(Message::Close(_))) => break None,
                Some(Ok(Message::Binary(bytes))) => {
                    let replies = handle_frame(&ctx, &sub, &subscriber_id, &bytes).await;
                    if !replies.is_empty() && !writer.write(replies.into_iter().map(Message::Binary)).await {
                        break None;
                    }
                }
                Some(Ok(Message::Text(_))) => {
                    let reply = wire::error_frame(
                        0,
                        ErrorCode::InvalidFrame,
                        "text messages are not part of the protocol: send binary Frames",
                    );
                    if !writer.write([Message::Binary(reply)]).await {
                        break None;
                    }
                }
                Some(Ok(_ping_pong_or_raw)) => {}
                Some(Err(WsError::Capacity(e))) => {
                    tracing::info!(error = %e, "closing: message too large");
                    break Some((CloseCode::Size, "frame_too_large: messages are limited to 1 MiB"));
                }
                Some(Err(WsError::Protocol(e))) => {
                    tracing::info!(error = %e, "closing: WebSocket protocol violation");
                    break Some((CloseCode::Protocol, "invalid_frame: WebSocket protocol violation"));
                }
                Some(Err(_)) => break None,
            },
            next = sub.recv() => match next {
                Ok(Some(first)) => {
                    // Write whatever else is ready with it: one flush per batch.
                    let mut batch = vec![Message::Binary(first.push_frame())];
                    while batch.len() < MAX_WRITE_BATCH {
                        let Some(more) = sub.try_next() else { break };
                        batch.push(Message::Binary(more.push_frame()));
                    }
                    if !writer.write(batch).await {
                        break None;
                    }
                }
                Ok(None) => break Some((CloseCode::Away, "host shutting down")),
                Err(e) => {
                    tracing::error!(error = %e, "subscription failed");
                    break Some((CloseCode::Error, "internal: the subscription failed"));
                }
            },
        }
    };
    if let Some((code, reason)) = end {
        writer.close(code, reason).await;
    }
    tracing::info!("subscriber disconnected");
}

async fn open_subscription(
    ctx: &WsContext,
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
    ctx: &WsContext,
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
    match answer(ctx, sub, subscriber_id, &frame).await {
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
        SessionError::RunNotFound(_) => ErrorCode::RunNotFound,
        SessionError::PermissionNotFound(_) => ErrorCode::PermissionNotFound,
        SessionError::AlreadyResolved { .. } => ErrorCode::AlreadyResolved,
        SessionError::ShuttingDown => ErrorCode::ShuttingDown,
        SessionError::Store(_) => ErrorCode::StoreFailed,
    };
    (code, message)
}

fn bad_body(e: wire::WireError) -> (ErrorCode, String) {
    (e.code(), e.to_string())
}

async fn answer(
    ctx: &WsContext,
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
            if req.limit > 0 {
                rows.truncate(req.limit as usize);
            }
            let sessions = rows
                .into_iter()
                .map(|r| pb::SessionInfo {
                    session_id: r.session_id,
                    agent_type: r.agent_type,
                    cwd: r.cwd,
                    title: r.title.unwrap_or_default(),
                    state: r.state,
                    parent_session_id: r.parent_session_id.unwrap_or_default(),
                    native_session_id: r.native_session_id.unwrap_or_default(),
                    created_at_ms: r.created_at_ms,
                    updated_at_ms: r.updated_at_ms,
                })
                .collect();
            Ok(Some(wire::encode(
                CmdId::ListHistorySessionsResp,
                id,
                &pb::ListHistorySessionsResp { sessions },
            )))
        }
        CmdId::ListSessionRunsReq => {
            let req: pb::ListSessionRunsReq = frame.body().map_err(bad_body)?;
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
        | CmdId::ErrorResp => Err((
            ErrorCode::UnknownCmd,
            format!(
                "{:?} is sent by the server, not a client request",
                frame.cmd
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;

    fn request(headers: &[(&str, &str)], path: &str) -> Request {
        let mut builder = Request::builder().uri(path);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn handshake_checks_path_host_origin_and_token() {
        let grants = GrantStore::new(Clock::system());
        let token = grants.mint("sub").unwrap();
        let bearer = format!("Bearer {token}");
        let proto = format!("{SUBPROTOCOL}, {TOKEN_SUBPROTOCOL_PREFIX}{token}");
        let allowed = vec!["tauri://localhost".to_owned()];
        let check = |headers: &[(&str, &str)], path: &str| {
            authorize(&request(headers, path), &grants, 4000, &allowed).map_err(|(s, _)| s.as_u16())
        };
        let host = ("host", "127.0.0.1:4000");
        assert_eq!(
            check(&[host, ("authorization", &bearer)], "/subscribe"),
            Ok(Authorized {
                subscriber_id: "sub".into(),
                select_subprotocol: false
            })
        );
        assert_eq!(
            check(
                &[
                    ("host", "localhost:4000"),
                    ("sec-websocket-protocol", &proto)
                ],
                "/subscribe"
            ),
            Ok(Authorized {
                subscriber_id: "sub".into(),
                select_subprotocol: true
            })
        );
        assert_eq!(
            check(&[host, ("authorization", &bearer)], "/other"),
            Err(404)
        );
        assert_eq!(
            check(
                &[("host", "evil.example:4000"), ("authorization", &bearer)],
                "/subscribe"
            ),
            Err(403)
        );
        assert_eq!(
            check(
                &[("host", "127.0.0.1:4001"), ("authorization", &bearer)],
                "/subscribe"
            ),
            Err(403)
        );
        assert_eq!(check(&[("authorization", &bearer)], "/subscribe"), Err(403));
        assert_eq!(
            check(
                &[
                    host,
                    ("origin", "https://evil.example"),
                    ("authorization", &bearer)
                ],
                "/subscribe"
            ),
            Err(403)
        );
        assert!(
            check(
                &[
                    host,
                    ("origin", "http://127.0.0.1:4000"),
                    ("authorization", &bearer)
                ],
                "/subscribe"
            )
            .is_ok()
        );
        assert!(
            check(
                &[
                    host,
                    ("origin", "tauri://localhost"),
                    ("authorization", &bearer)
                ],
                "/subscribe"
            )
            .is_ok()
        );
        assert_eq!(check(&[host], "/subscribe"), Err(401));
        assert_eq!(
            check(&[host, ("authorization", "Bearer wrong")], "/subscribe"),
            Err(401)
        );
    }
}
