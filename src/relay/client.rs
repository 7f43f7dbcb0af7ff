//! The relay dial loop: one task owns the connection and its status.
//!
//! 1. No relay configured: `disabled`, until `host.relay.set` gives one.
//! 2. `connecting`: TCP, TLS (rustls with the webpki roots; `ws://` only to a loopback
//!    address), the WebSocket upgrade with `Authorization: Bearer <token>` — all within the
//!    connect timeout. The relay subscriber row is made sure of first.
//! 3. `connected`: [`link::serve`] with the token's scope and pings; the relay sends `Hello`
//!    with its cursor and the host replays from there (or per the row's mode).
//! 4. The connection fails or ends: `waiting` for a capped exponential backoff with jitter
//!    (reset only by a connection that lasted [`RelayTiming::stable_after_ms`], so a relay that
//!    closes after every frame is not hammered), then 2 again. A configuration change or the
//!    host's shutdown cuts any phase short.
//!
//! A relay that misbehaves — never answers, sends garbage, closes at once — only ever costs
//! this task a reconnect; local subscribers and sessions do not notice. `host.status` says
//! what went wrong (`last_error`), never the token.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{RelayHandle, RelayState, RelayStatus, SUBSCRIBER_ID};
use crate::config::{RelayConfig, RelayTiming, Scope};
use crate::link::{self, Keepalive, Link, Peer};
use crate::protocol::wire::Codec;
use crate::protocol::wire::MAX_FRAME_BYTES;
use crate::request::{Access, Via};
use crate::store::{SubscriberRow, now_ms};
use crate::subscribers::Subscribers;

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("the relay URL is not valid: {0}")]
    BadUrl(String),
    #[error("ws:// is allowed only to a loopback address; use wss:// for {0}")]
    PlainToRemote(String),
    #[error("the relay refused the token (HTTP {0})")]
    Unauthorized(u16),
    #[error("the relay answered the upgrade with HTTP {0}")]
    Http(u16),
    #[error("no connection within {0} ms")]
    Timeout(u64),
    #[error("{0}")]
    Ws(String),
    #[error("the relay subscriber could not be stored: {0}")]
    Store(String),
}

type RelayWs = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Start the relay client. It runs until `cancel`.
pub fn spawn(
    link: Link,
    initial: Option<RelayConfig>,
    cancel: CancellationToken,
    tracker: &TaskTracker,
) -> RelayHandle {
    let (config_tx, config_rx) = watch::channel(initial);
    let (status_tx, status_rx) = watch::channel(RelayStatus::disabled());
    tracker.spawn(tracing::Instrument::instrument(
        run(link, config_rx, status_tx, cancel),
        tracing::info_span!("relay"),
    ));
    RelayHandle {
        config: config_tx,
        status: status_rx,
    }
}

fn backoff_of(timing: &RelayTiming) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(timing.backoff_min_ms.max(1)))
        .with_max_delay(Duration::from_millis(
            timing.backoff_max_ms.max(timing.backoff_min_ms.max(1)),
        ))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The token's scope as the connection enforces it.
pub fn scope_of(scope: &Scope) -> Arc<Access> {
    Access::new(scope.clone())
}

async fn run(
    link: Link,
    mut config: watch::Receiver<Option<RelayConfig>>,
    status: watch::Sender<RelayStatus>,
    cancel: CancellationToken,
) {
    let set = |state: RelayState, f: &dyn Fn(&mut RelayStatus)| {
        status.send_modify(|s| {
            s.state = state;
            s.since_ms = now_ms();
            f(s);
        });
    };
    'configs: loop {
        let current = config.borrow_and_update().clone();
        let Some(cfg) = current else {
            set(RelayState::Disabled, &|s| {
                s.url = None;
                s.retries = 0;
                s.retry_in_ms = None;
            });
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = config.changed() => if changed.is_err() { return },
            }
            continue;
        };
        if let Err(e) = check(&cfg) {
            // Retrying cannot help: say why and wait for another configuration.
            tracing::warn!(error = %e, "the relay configuration cannot work; not dialing");
            let why = e.to_string();
            set(RelayState::Misconfigured, &|s| {
                s.url = Some(cfg.url.clone());
                s.retries = 0;
                s.last_error = Some(why.clone());
                s.retry_in_ms = None;
            });
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = config.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let mut backoff = backoff_of(&cfg.timing);
        let mut retries: u32 = 0;
        // One scope per configuration: sessions created through the relay stay in it across
        // reconnects.
        let access = scope_of(&cfg.scope);
        set(RelayState::Connecting, &|s| {
            s.url = Some(cfg.url.clone());
            s.retries = 0;
            s.last_error = None;
            s.retry_in_ms = None;
        });
        loop {
            set(RelayState::Connecting, &|s| s.retry_in_ms = None);
            let dialed = tokio::select! {
                () = cancel.cancelled() => return,
                changed = config.changed() => {
                    if changed.is_err() { return }
                    continue 'configs;
                }
                dialed = dial(link.handler.subscribers(), &cfg) => dialed,
            };
            let failure = match dialed {
                Ok(ws) => {
                    tracing::info!(url = %cfg.url, "relay connected");
                    set(RelayState::Connected, &|s| s.retry_in_ms = None);
                    let started = Instant::now();
                    let conn_cancel = cancel.child_token();
                    let keepalive = Keepalive {
                        interval: Duration::from_millis(cfg.timing.ping_interval_ms.max(1)),
                        dead_after: Duration::from_millis(cfg.timing.dead_peer_ms.max(1)),
                    };
                    let serving = link::serve(
                        ws,
                        &link,
                        SUBSCRIBER_ID,
                        Peer {
                            via: Via::Relay,
                            codec: Codec::Protobuf,
                            access: Some(access.clone()),
                            lane: None,
                        },
                        Some(keepalive),
                        conn_cancel.clone(),
                        None,
                    );
                    tokio::pin!(serving);
                    let end = tokio::select! {
                        end = &mut serving => end,
                        changed = config.changed() => {
                            // Closed properly (a close frame), briefly waited for.
                            conn_cancel.cancel();
                            let _closed = tokio::time::timeout(Duration::from_secs(2), serving).await;
                            if changed.is_err() { return }
                            continue 'configs;
                        }
                    };
                    if cancel.is_cancelled() {
                        return;
                    }
                    if started.elapsed() >= Duration::from_millis(cfg.timing.stable_after_ms) {
                        backoff = backoff_of(&cfg.timing);
                        retries = 0;
                    }
                    tracing::info!(%end, "relay connection ended");
                    end.to_string()
                }
                Err(e) => {
                    tracing::info!(error = %e, "relay dial failed");
                    e.to_string()
                }
            };
            retries = retries.saturating_add(1);
            let delay = backoff
                .next()
                .unwrap_or(Duration::from_millis(cfg.timing.backoff_max_ms));
            let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            set(RelayState::Waiting, &|s| {
                s.retries = retries;
                s.last_error = Some(failure.clone());
                s.retry_in_ms = Some(millis);
            });
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = config.changed() => {
                    if changed.is_err() { return }
                    continue 'configs;
                }
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// Whether a URL host is a loopback address.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Check a relay configuration without dialing: the URL parses as a WebSocket URL with a
/// host, its scheme is `wss://` (or `ws://` to a loopback address), and the token can be sent
/// as a header. `config.toml`'s `[relay]` and `host.relay.set` are both held to this; a
/// configuration that fails it is never dialed.
pub fn check(cfg: &RelayConfig) -> Result<(), DialError> {
    request_of(cfg).map(|_| ())
}

pub(super) fn request_of(
    cfg: &RelayConfig,
) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, DialError> {
    let mut request = cfg
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| DialError::BadUrl(e.to_string()))?;
    let uri = request.uri().clone();
    let host = uri.host().unwrap_or_default().to_owned();
    if host.is_empty() {
        return Err(DialError::BadUrl("the URL has no host".to_owned()));
    }
    match uri.scheme_str() {
        Some("wss") => {}
        Some("ws") if is_loopback(&host) => {}
        Some("ws") => return Err(DialError::PlainToRemote(host)),
        other => {
            return Err(DialError::BadUrl(format!(
                "the scheme must be wss:// (or ws:// to loopback), not {other:?}"
            )));
        }
    }
    if cfg.token.is_empty() {
        return Err(DialError::BadUrl("a relay needs a token".to_owned()));
    }
    let bearer = HeaderValue::from_str(&format!("Bearer {}", cfg.token))
        .map_err(|_| DialError::BadUrl("the token is not a valid header value".to_owned()))?;
    request.headers_mut().insert(header::AUTHORIZATION, bearer);
    Ok(request)
}

/// The relay connection's read and write buffers (it carries every session's events, so
/// larger than one loopback subscriber's).
const RELAY_READ_BUFFER_BYTES: usize = 16 * 1024;
const RELAY_WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// Dial the relay: check the URL, make sure of the subscriber row, connect within the timeout.
async fn dial(subscribers: &Subscribers, cfg: &RelayConfig) -> Result<RelayWs, DialError> {
    let request = request_of(cfg)?;
    ensure_subscriber(subscribers).await?;
    // Small per-connection buffers (tungstenite's 128 KiB read buffer is zero-filled before
    // every read and kept for the connection's life); a larger frame still arrives whole.
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
        .read_buffer_size(RELAY_READ_BUFFER_BYTES)
        .write_buffer_size(RELAY_WRITE_BUFFER_BYTES);
    let connect =
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, None);
    let timeout = cfg.timing.connect_timeout_ms;
    match tokio::time::timeout(Duration::from_millis(timeout.max(1)), connect).await {
        Err(_) => Err(DialError::Timeout(timeout)),
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) => {
            let status = response.status().as_u16();
            if status == 401 || status == 403 {
                Err(DialError::Unauthorized(status))
            } else {
                Err(DialError::Http(status))
            }
        }
        Ok(Err(e)) => Err(DialError::Ws(e.to_string())),
    }
}

/// The relay's subscriber row: created on first use (events with deltas, `max_count` replay
/// when the relay brings no cursor), kept afterwards with its cursor.
async fn ensure_subscriber(subscribers: &Subscribers) -> Result<(), DialError> {
    let now = now_ms();
    let row = SubscriberRow {
        subscriber_id: SUBSCRIBER_ID.to_owned(),
        kind: "relay".to_owned(),
        session_id: None,
        forward_deltas: true,
        replay_mode: crate::protocol::envelope::ReplayMode::MaxCount
            .as_str()
            .to_owned(),
        max_count: i64::from(crate::bus::DEFAULT_MAX_COUNT),
        most_recent_sequence_id: 0,
        deltas_dropped: 0,
        created_at_ms: now,
        updated_at_ms: now,
        // The relay's scope is its token's, from the configuration, not this row's.
        scope: None,
        client: None,
    };
    subscribers
        .ensure(row)
        .await
        .map_err(|e| DialError::Store(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_may_use_plain_ws() {
        for host in ["127.0.0.1", "localhost", "[::1]", "127.8.9.10"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["example.com", "10.0.0.1", "192.168.1.2", ""] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn the_scope_of_a_token_is_what_its_config_declares() {
        let all = scope_of(&Scope::default());
        assert!(all.has_session("any") && all.scope().prompt && !all.scope().permissions);
        let some = scope_of(&Scope {
            sessions: Some(vec!["s1".to_owned()]),
            prompt: false,
            permissions: true,
            create_sessions: false,
        });
        assert!(some.has_session("s1") && !some.has_session("s2"));
        let rights = some.scope();
        assert!(!rights.prompt && rights.permissions && !rights.create_sessions);
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let cfg = RelayConfig {
            url: "wss://relay.example/host".to_owned(),
            token: "sekrit-token".to_owned(),
            scope: Scope::default(),
            timing: RelayTiming::default(),
        };
        assert!(!format!("{cfg:?}").contains("sekrit"));
        assert!(!serde_json::to_string(&cfg).unwrap().contains("sekrit"));
    }
}
