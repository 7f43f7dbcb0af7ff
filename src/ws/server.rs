//! The loopback server: the WebSocket transport and the web UI, on one port and one origin.
//! Binds `127.0.0.1` only (never a wildcard address).
//!
//! A connection's life (docs/protocol.md has the client's view):
//! 1. TCP accept; the peer must be a loopback address.
//! 2. The request head is read here (at most 16 KiB, within `HANDSHAKE_TIMEOUT`, else the
//!    connection is closed) and routed by path, query string aside:
//!    - `/subscribe` → the WebSocket upgrade: tungstenite gets the stream with the bytes
//!      already read replayed in front ([`web::Rewind`]) — step 3;
//!    - anything else → one HTTP response from [`web::respond`] (the embedded web UI at `/`,
//!      or 403 / 404 / 405 with the same security headers), then close. No keep-alive.
//! 3. HTTP upgrade on `/subscribe`, checked in the handshake callback, before any frame:
//!    wrong path → 404; `Host` not this loopback address and port → 403; an `Origin` that is
//!    neither this server's loopback origin nor configured → 403; missing, unknown or expired
//!    grant token (`Authorization: Bearer …` or a `bearer.…` subprotocol entry) → 401. The
//!    Host and Origin rule is [`web::Site`]'s, the same as for the web UI.
//! 4. The first frame must be `Hello`; its cursor, if any, wins over the stored one. The reply
//!    is `HelloResp`, then replay (per the subscriber's mode), then live events, as `EventPush`.
//! 5. Inbound: `Ack` advances the stored cursor (batched by the bus), `Ping` → `Pong`, requests
//!    → their responses or `ErrorResp`. A bad frame gets `ErrorResp`; an oversized message
//!    (> 1 MiB) closes the connection with code 1009 and a reason. Nothing a client sends
//!    stops the host or other connections.
//!
//! Steps 2 and 3 (and, for the web UI, the whole exchange) hold one of `MAX_HANDSHAKES`
//! permits and share one `HANDSHAKE_TIMEOUT` deadline.
//!
//! Overload: a connection's task writes its events in batches (one flush each). A client that
//! stops reading blocks that write; the task then takes nothing from its bus subscription,
//! which the hub moves to catch-up from SQLite — memory stays bounded and nobody else waits.
//! A write blocked for 60 s ends the connection.
//!
//! Memory: an idle connection holds its task, its bus subscription and tungstenite's buffers,
//! kept small ([`READ_BUFFER_BYTES`], [`WRITE_BUFFER_BYTES`]); `tests/ws_memory.rs` measures
//! 1,000 idle subscribers in a real host process.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::PATH;
use crate::bus::{Direct, DirectStream};
use crate::link::{self, Keepalive, Link, Peer};
use crate::peer::{self, PeerUser};
use crate::protocol::wire::{Codec, MAX_FRAME_BYTES, TOKEN_SUBPROTOCOL_PREFIX};
use crate::request::Via;
use crate::subscribers::GrantStore;
use crate::web::{self, Site};

/// How long a client has to finish the HTTP upgrade, and then to send `Hello`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections that may be in the upgrade or `Hello` at once; more wait for a slot. Large, so
/// that clients which open a connection and never finish the upgrade (each timed out after
/// [`HANDSHAKE_TIMEOUT`]) cannot make a real client wait: a slot costs one socket and a small
/// task.
const MAX_HANDSHAKES: usize = 1024;

/// Loopback connections are pinged this often and dropped when silent for a minute (a
/// desktop client that went to sleep, a half-open TCP connection).
pub const KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(20),
    dead_after: Duration::from_secs(60),
};

/// What every connection task needs.
pub struct WsContext {
    pub link: Link,
    pub port: u16,
    pub allowed_origins: Vec<String>,
    pub keepalive: Keepalive,
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
    while let Some((permit, (stream, peer))) =
        admit(&handshakes, &cancel, "WebSocket", || listener.accept()).await
    {
        if !peer.ip().is_loopback() {
            // Cannot happen while bound to 127.0.0.1; refuse anyway rather than trust it.
            tracing::warn!(%peer, "refused a non-loopback peer");
            continue;
        }
        let ctx = ctx.clone();
        let cancel = cancel.child_token();
        tracker.spawn(async move {
            if let Err(e) = connection(stream, ctx, cancel, permit).await {
                tracing::debug!(%peer, error = %e, "loopback connection ended with an error");
            }
        });
    }
    tracing::debug!("WebSocket listener stopped");
}

/// The next connection of either listener, with one of `handshakes`' permits (a failed
/// accept, e.g. out of file descriptors, backs off instead of spinning); `None` once `cancel`
/// fires.
async fn admit<T, F, Fut>(
    handshakes: &Arc<tokio::sync::Semaphore>,
    cancel: &CancellationToken,
    listener_name: &str,
    mut accept: F,
) -> Option<(tokio::sync::OwnedSemaphorePermit, T)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<T>>,
{
    loop {
        let permit = tokio::select! {
            () = cancel.cancelled() => return None,
            permit = handshakes.clone().acquire_owned() => permit.ok()?,
        };
        tokio::select! {
            () = cancel.cancelled() => return None,
            accepted = accept() => match accepted {
                Ok(connection) => return Some((permit, connection)),
                Err(e) => {
                    tracing::warn!(error = %e, "{listener_name} accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// The outcome of checking an upgrade request.
#[derive(Debug, PartialEq)]
struct Authorized {
    subscriber_id: String,
    /// The codec the client chose by the subprotocols it offered.
    codec: Codec,
    /// The subprotocol the response must select, if the client offered one of ours.
    select_subprotocol: Option<&'static str>,
}

fn header_str(req: &Request, name: header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Where an upgrade request came in, which decides the Host and Origin rule.
#[derive(Debug, Clone, Copy)]
enum Door<'a> {
    /// The TCP listener on this port: Host must name it, Origin (if any) be its own or allowed.
    Tcp {
        port: u16,
        allowed_origins: &'a [String],
    },
    /// The Unix socket (mode 0600, the host's own user only): a `peer` of another user is
    /// refused with 403; Host is not checked (there is no address to rebind); a request with
    /// an `Origin` (a browser's, through some bridge) is refused unless that origin is
    /// configured.
    Unix {
        allowed_origins: &'a [String],
        peer: PeerUser,
    },
}

/// Check the peer's user (Unix socket), path, Host, Origin and token, in that order.
fn authorize(
    req: &Request,
    grants: &GrantStore,
    door: Door<'_>,
) -> Result<Authorized, (StatusCode, String)> {
    if let Door::Unix { peer, .. } = door
        && let Some(why) = peer.refusal()
    {
        return Err((StatusCode::FORBIDDEN, format!("peer_refused: {why}")));
    }
    if req.uri().path() != PATH {
        return Err((StatusCode::NOT_FOUND, format!("only {PATH} is served")));
    }
    let origin = header_str(req, header::ORIGIN);
    match door {
        Door::Tcp {
            port,
            allowed_origins,
        } => {
            let site = Site {
                port,
                allowed_origins,
            };
            let host = header_str(req, header::HOST).unwrap_or_default();
            if !site.host_ok(host) {
                return Err((
                    StatusCode::FORBIDDEN,
                    "Host must be this server's loopback address".to_owned(),
                ));
            }
            if let Some(origin) = origin
                && !site.origin_ok(origin)
            {
                return Err((StatusCode::FORBIDDEN, "Origin not allowed".to_owned()));
            }
        }
        Door::Unix {
            allowed_origins, ..
        } => {
            if let Some(origin) = origin
                && !allowed_origins.iter().any(|o| o == origin)
            {
                return Err((StatusCode::FORBIDDEN, "Origin not allowed".to_owned()));
            }
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
    let (codec, select_subprotocol) = Codec::from_offered(offered.iter().copied());
    Ok(Authorized {
        subscriber_id,
        codec,
        select_subprotocol,
    })
}

fn refusal(status: StatusCode, reason: String) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(reason));
    *response.status_mut() = status;
    response
}

/// What one connection reads into at a time. tungstenite zero-fills this much before every
/// read and keeps it for the connection's life: its default (128 KiB) made an idle subscriber
/// cost ~141 KiB of resident memory. Clients send small frames (`Hello`, `Ack`, requests); a
/// larger one still arrives whole (its buffer grows to the frame, up to the 1 MiB limit), in
/// reads of this size.
pub const READ_BUFFER_BYTES: usize = 4 * 1024;
/// Frames are gathered up to this much before a write (a batch's flush writes the rest). The
/// gathering buffer keeps its largest size, so after a burst each connection holds about
/// twice this; 16 KiB writes still move a batch in few syscalls.
pub const WRITE_BUFFER_BYTES: usize = 16 * 1024;

/// The server side's WebSocket settings: message limits and per-connection buffers.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("handshake: {0}")]
    Handshake(#[from] WsError),
    #[error("handshake timed out")]
    Timeout,
    #[error("request head: {0}")]
    Head(#[from] web::HeadError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

async fn connection(
    mut stream: TcpStream,
    ctx: Arc<WsContext>,
    cancel: CancellationToken,
    handshake: tokio::sync::OwnedSemaphorePermit,
) -> Result<(), ConnError> {
    stream.set_nodelay(true)?;
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let (head, read) = tokio::select! {
        () = cancel.cancelled() => return Ok(()),
        head = tokio::time::timeout_at(deadline, web::read_head(&mut stream)) => {
            head.map_err(|_| ConnError::Timeout)??
        }
    };
    if head.path != PATH {
        let site = Site {
            port: ctx.port,
            allowed_origins: &ctx.allowed_origins,
        };
        return web_request(stream, &head, &site, deadline, &cancel).await;
    }
    let lane = Direct::over(&stream);
    let stream = DirectStream::new(web::Rewind::new(read, stream), lane.clone());
    let door = Door::Tcp {
        port: ctx.port,
        allowed_origins: &ctx.allowed_origins,
    };
    upgrade_and_serve(stream, lane, &ctx, door, deadline, cancel, handshake).await
}

/// The WebSocket upgrade (checked by [`authorize`] at `door`), then the connection's life in
/// [`link::serve`].
#[expect(
    clippy::result_large_err,
    reason = "the handshake callback's signature is tungstenite's"
)]
async fn upgrade_and_serve<S>(
    stream: S,
    lane: Arc<Direct>,
    ctx: &WsContext,
    door: Door<'_>,
    deadline: tokio::time::Instant,
    cancel: CancellationToken,
    handshake: tokio::sync::OwnedSemaphorePermit,
) -> Result<(), ConnError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut granted: Option<(String, Codec)> = None;
    let callback = |req: &Request, mut response: Response| match authorize(
        req,
        ctx.link.handler.subscribers().grants(),
        door,
    ) {
        Ok(auth) => {
            if let Some(selected) = auth.select_subprotocol {
                response.headers_mut().insert(
                    header::SEC_WEBSOCKET_PROTOCOL,
                    HeaderValue::from_static(selected),
                );
            }
            granted = Some((auth.subscriber_id, auth.codec));
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
        upgraded = tokio::time::timeout_at(deadline, upgrade) => {
            upgraded.map_err(|_| ConnError::Timeout)??
        }
    };
    let Some((subscriber_id, codec)) = granted else {
        return Ok(());
    };
    let span = tracing::info_span!("ws", subscriber_id = %subscriber_id);
    let peer = Peer {
        via: Via::Loopback {
            subscriber_id: subscriber_id.clone(),
        },
        codec,
        access: None,
        lane: Some(lane),
    };
    let serving = link::serve(
        ws,
        &ctx.link,
        &subscriber_id,
        peer,
        Some(ctx.keepalive),
        cancel,
        Some(handshake),
    );
    tracing::Instrument::instrument(serving, span).await;
    Ok(())
}

/// Bind the Unix socket (`ws.sock`) with mode 0600. The caller holds the instance lock, so a
/// leftover file is a dead host's and is removed first. [`UnixSocket`]'s drop removes it again.
pub fn bind_unix(path: &Path) -> std::io::Result<UnixSocket> {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed a stale socket file"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    let socket = UnixSocket {
        listener,
        path: path.to_owned(),
    };
    // The home is 0700, so nobody else could reach the file in between; and every accepted
    // peer's uid is checked anyway.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(socket)
}

/// The bound Unix socket; its file goes when this is dropped.
pub struct UnixSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        let _gone_already = std::fs::remove_file(&self.path);
    }
}

/// Accept on the Unix socket until `cancel`: the same upgrade, token, protocol and limits as
/// the TCP listener's `/subscribe`, for clients on this machine that would rather not use TCP
/// (lower latency; the socket's mode and a peer-uid check instead of a port anyone local can
/// dial). No web UI here: any other path is refused with 404 in the upgrade.
pub async fn serve_unix(
    socket: UnixSocket,
    ctx: Arc<WsContext>,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    while let Some((permit, (stream, _))) = admit(&handshakes, &cancel, "WebSocket (Unix)", || {
        socket.listener.accept()
    })
    .await
    {
        // Another user's peer gets its 403 through the handshake, so it reads why instead of
        // a reset, and a second for it, not a handshake's time.
        let peer = PeerUser::of(&stream);
        let ctx = ctx.clone();
        let cancel = cancel.child_token();
        tracker.spawn(async move {
            let timeout = if peer.is_other() {
                peer::OTHER_USER_TIMEOUT
            } else {
                HANDSHAKE_TIMEOUT
            };
            let deadline = tokio::time::Instant::now() + timeout;
            let door = Door::Unix {
                allowed_origins: &ctx.allowed_origins,
                peer,
            };
            let lane = Direct::over(&stream);
            let stream = DirectStream::new(stream, lane.clone());
            if let Err(e) =
                upgrade_and_serve(stream, lane, &ctx, door, deadline, cancel, permit).await
            {
                tracing::debug!(error = %e, "Unix-socket WebSocket connection ended with an error");
            }
        });
    }
    tracing::debug!("WebSocket (Unix) listener stopped");
    drop(socket);
}

/// Answer one web UI request and close. The caller's handshake permit is held until this
/// returns, so the exchange counts like an upgrade.
async fn web_request(
    mut stream: TcpStream,
    head: &web::Head,
    site: &Site<'_>,
    deadline: tokio::time::Instant,
    cancel: &CancellationToken,
) -> Result<(), ConnError> {
    let response = web::respond(head, site);
    let status = response.status.code();
    // The path only: a query string is the page's business, not the log's.
    if matches!(response.status, web::Status::Ok | web::Status::NotModified) {
        tracing::debug!(status, method = %head.method, path = ?head.path, "web request");
    } else {
        tracing::info!(status, method = %head.method, path = ?head.path, "web request refused");
    }
    tokio::select! {
        () = cancel.cancelled() => Ok(()),
        sent = tokio::time::timeout_at(deadline, response.send(&mut stream)) => {
            Ok(sent.map_err(|_| ConnError::Timeout)??)
        }
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
        use crate::protocol::wire::{JSON_SUBPROTOCOL, SUBPROTOCOL};
        let grants = GrantStore::new(Clock::system());
        let token = grants.mint("sub").unwrap();
        let bearer = format!("Bearer {token}");
        let proto = format!("{SUBPROTOCOL}, {TOKEN_SUBPROTOCOL_PREFIX}{token}");
        let allowed = vec!["tauri://localhost".to_owned()];
        let check = |headers: &[(&str, &str)], path: &str| {
            let door = Door::Tcp {
                port: 4000,
                allowed_origins: &allowed,
            };
            authorize(&request(headers, path), &grants, door).map_err(|(s, _)| s.as_u16())
        };
        let host = ("host", "127.0.0.1:4000");
        assert_eq!(
            check(&[host, ("authorization", &bearer)], "/subscribe"),
            Ok(Authorized {
                subscriber_id: "sub".into(),
                codec: Codec::Protobuf,
                select_subprotocol: None
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
                codec: Codec::Protobuf,
                select_subprotocol: Some(SUBPROTOCOL)
            })
        );
        let json = format!("{JSON_SUBPROTOCOL}, {TOKEN_SUBPROTOCOL_PREFIX}{token}");
        assert_eq!(
            check(&[host, ("sec-websocket-protocol", &json)], "/subscribe"),
            Ok(Authorized {
                subscriber_id: "sub".into(),
                codec: Codec::Json,
                select_subprotocol: Some(JSON_SUBPROTOCOL)
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

    #[test]
    fn the_unix_door_refuses_another_users_peer_before_anything_else() {
        let grants = GrantStore::new(Clock::system());
        let token = grants.mint("sub").unwrap();
        let bearer = format!("Bearer {token}");
        let allowed: Vec<String> = Vec::new();
        let check = |peer: PeerUser, path: &str| {
            let door = Door::Unix {
                allowed_origins: &allowed,
                peer,
            };
            authorize(&request(&[("authorization", &bearer)], path), &grants, door)
                .map(|a| a.subscriber_id)
                .map_err(|(s, reason)| (s.as_u16(), reason))
        };
        assert_eq!(check(PeerUser::Own, "/subscribe"), Ok("sub".to_owned()));
        for (peer, path) in [
            (PeerUser::Other(Some(65534)), "/subscribe"),
            (PeerUser::Other(None), "/subscribe"),
            (PeerUser::Other(Some(65534)), "/other"),
        ] {
            let (status, reason) = check(peer, path).unwrap_err();
            assert_eq!(status, 403, "{peer:?} {path}");
            assert!(reason.starts_with("peer_refused: "), "{reason}");
        }
        let (_, reason) = check(PeerUser::Other(Some(65534)), "/subscribe").unwrap_err();
        assert!(reason.ends_with("the peer's uid is 65534"), "{reason}");
    }
}
