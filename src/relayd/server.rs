//! The relay's listener: one port, three paths, one request head read per connection (at
//! most 16 KiB, within [`HANDSHAKE_TIMEOUT`], by the web module's bounded reader):
//! - `GET /healthz` → `200 ok` while NATS is connected, else `503`; then close.
//! - `/host`, `/bot` → the WebSocket upgrade (tungstenite gets the bytes already read replayed
//!   in front). The token is checked in the handshake callback, before any frame:
//!   `Authorization: Bearer <token>`, the host token on `/host`, the bot token on `/bot`,
//!   compared as SHA-256 digests in constant time; missing or wrong → HTTP 401 and nothing
//!   else. Messages are limited to [`MAX_RELAY_FRAME_BYTES`].
//! - anything else → `404`.
//!
//! Bounds: [`MAX_CONNECTIONS`] connections at once (past that, accepting waits for one to
//! end: new clients queue in the kernel's backlog, and those already served are unaffected).
//! Tokens are never logged; request heads are not either (only the path).

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Shared, bot, host};
use crate::protocol::relay_wire::MAX_RELAY_FRAME_BYTES;
use crate::web;

/// The request head and the upgrade must be done within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (every state).
pub const MAX_CONNECTIONS: usize = 16 * 1024;

/// Which side a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Host,
    Bot,
}

impl Role {
    fn of_path(path: &str) -> Option<Role> {
        match path {
            "/host" => Some(Role::Host),
            "/bot" => Some(Role::Bot),
            _ => None,
        }
    }
}

/// The two tokens, kept as digests.
pub struct Tokens {
    host: [u8; 32],
    bot: [u8; 32],
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    pub fn new(host: &str, bot: &str) -> Tokens {
        Tokens {
            host: digest(host),
            bot: digest(bot),
        }
    }

    /// Whether `presented` is the token of `role`. Digests of equal length are compared in
    /// constant time, so the time taken says nothing about how close a guess came.
    pub fn admits(&self, role: Role, presented: Option<&str>) -> bool {
        let Some(presented) = presented else {
            return false;
        };
        let wanted = match role {
            Role::Host => &self.host,
            Role::Bot => &self.bot,
        };
        bool::from(digest(presented).ct_eq(wanted))
    }
}

/// The bearer token of an upgrade request.
fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The endpoints' WebSocket settings.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_RELAY_FRAME_BYTES))
        .max_frame_size(Some(MAX_RELAY_FRAME_BYTES))
        .read_buffer_size(8 * 1024)
        .write_buffer_size(16 * 1024)
}

/// Accept until `cancel`; each connection runs on `tracker` with a child token of `cancel`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = (tokio::select! {
            () = cancel.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot,
        }) else {
            break;
        };
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors, typically: wait a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let shared = shared.clone();
        let cancel = cancel.child_token();
        tracker.spawn(async move {
            let _slot = slot;
            if let Err(e) = connection(stream, shared, cancel).await {
                tracing::debug!(%peer, error = %e, "connection ended before serving");
            }
        });
    }
    tracing::debug!("listener stopped");
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("handshake: {0}")]
    Handshake(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("handshake timed out")]
    Timeout,
    #[error("request head: {0}")]
    Head(#[from] web::HeadError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

#[expect(
    clippy::result_large_err,
    reason = "the handshake callback's signature is tungstenite's"
)]
async fn connection(
    mut stream: TcpStream,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) -> Result<(), ConnError> {
    stream.set_nodelay(true)?;
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let (head, read) = tokio::select! {
        () = cancel.cancelled() => return Ok(()),
        head = tokio::time::timeout_at(deadline, web::read_head(&mut stream)) => {
            head.map_err(|_| ConnError::Timeout)??
        }
    };
    if head.path == "/healthz" {
        let response = if shared.broker.connected() {
            plain(200, "OK", "ok\n")
        } else {
            plain(503, "Service Unavailable", "NATS is not connected\n")
        };
        return respond(stream, &response, deadline).await;
    }
    if Role::of_path(&head.path).is_none() {
        tracing::debug!(path = ?head.path, "not found");
        return respond(
            stream,
            &plain(404, "Not Found", "/host, /bot, /healthz\n"),
            deadline,
        )
        .await;
    }
    let stream = web::Rewind::new(read, stream);
    let mut admitted = None;
    let callback = |req: &Request, response: Response| {
        let Some(role) = Role::of_path(req.uri().path()) else {
            return Err(refusal(StatusCode::NOT_FOUND, "only /host and /bot"));
        };
        if !shared.tokens.admits(role, bearer(req)) {
            tracing::info!(?role, "upgrade refused: wrong or missing token");
            return Err(refusal(StatusCode::UNAUTHORIZED, "wrong or missing token"));
        }
        admitted = Some(role);
        Ok(response)
    };
    let upgrade =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(ws_config()));
    let ws = tokio::select! {
        () = cancel.cancelled() => return Ok(()),
        upgraded = tokio::time::timeout_at(deadline, upgrade) => {
            upgraded.map_err(|_| ConnError::Timeout)??
        }
    };
    match admitted {
        Some(Role::Host) => host::serve(ws, shared, cancel).await,
        Some(Role::Bot) => bot::serve(ws, shared, cancel).await,
        None => {}
    }
    Ok(())
}

fn refusal(status: StatusCode, reason: &str) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(reason.to_owned()));
    *response.status_mut() = status;
    response
}

/// One short plain-text HTTP response that closes the connection.
fn plain(status: u16, reason: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn respond(
    mut stream: TcpStream,
    response: &str,
    deadline: tokio::time::Instant,
) -> Result<(), ConnError> {
    let sent = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout_at(deadline, sent)
        .await
        .map_err(|_| ConnError::Timeout)??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_admit_their_own_role_only() {
        let tokens = Tokens::new("h-token", "b-token");
        assert!(tokens.admits(Role::Host, Some("h-token")));
        assert!(tokens.admits(Role::Bot, Some("b-token")));
        assert!(!tokens.admits(Role::Host, Some("b-token")));
        assert!(!tokens.admits(Role::Bot, Some("h-token")));
        assert!(!tokens.admits(Role::Bot, Some("")));
        assert!(!tokens.admits(Role::Host, None));
    }
}
