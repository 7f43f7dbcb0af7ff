//! A host's connection (`/host`): `HostHello{host_id}` first, then the relay claims the host's
//! presence key, attaches its durable consumer `h-<host_id>` and says `Welcome{instance}`.
//! From then on:
//! - frames from the consumer (a bot's `Open`, `Sealed`, `Closed`) are written to the host
//!   unchanged and acked after the write; a loop-back `Ping{id}` that comes back through the
//!   host's own subject is written as `Pong{id}` — the host's end-to-end probe;
//! - the host's `Accept`, `Sealed`, `Closed` are published, unchanged, to `ah.b.<channel>`;
//!   its `Ping{loop_back: true}` to its own `ah.h.<host_id>`; `Ping{loop_back: false}` is
//!   answered here; a `Pong` only proves it is alive; any other kind is `bad_frame`.
//! - the presence task refreshes the key every 5 s by compare-and-set; when another
//!   connection has claimed it since, this one ends with `superseded`. At the end, whatever
//!   the reason, the key is deleted if it is still this connection's — before the WebSocket
//!   closes, so an endpoint that saw the close sees the host offline.
//!
//! Two hosts with one id: the newest connection wins the key and the consumer (attaching it
//! ends the older reader, see [`super::broker`]); the older one ends within a refresh.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::broker::{PRESENCE_INTERVAL, Refresh};
use super::endpoint::{Conn, Next, report};
use super::error::RelayError;
use crate::protocol::relay_wire::{self, Body};

/// Serve one upgraded `/host` connection until it ends.
pub async fn serve<S>(ws: WebSocketStream<S>, shared: Arc<Shared>, shutdown: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut conn = Conn::start(ws, shutdown);
    let mut host_id = None;
    let outcome = session(&mut conn, &shared, &mut host_id).await;
    let host_id = host_id.unwrap_or_default();
    let received = conn.received;
    let started = conn.started;
    let code = outcome.as_ref().err().map(RelayError::code);
    if let Err(e) = &outcome {
        tracing::info!(host_id, code, error = %e, "host connection refused or ended");
    }
    let sent = conn.finish(&outcome).await;
    tracing::info!(
        host_id,
        frames_in = received.frames,
        bytes_in = received.bytes,
        frames_out = sent.frames,
        bytes_out = sent.bytes,
        ms = started.elapsed().as_millis(),
        "host disconnected"
    );
}

async fn session<S>(
    conn: &mut Conn<S>,
    shared: &Arc<Shared>,
    id: &mut Option<String>,
) -> Result<(), RelayError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    const WRONG: &str = "the first frame must be HostHello";
    let host_id = match conn.first("no HostHello in time", WRONG).await? {
        None => return Ok(()),
        Some(Body::HostHello(hello)) if relay_wire::is_host_id(&hello.host_id) => hello.host_id,
        Some(Body::HostHello(_)) => {
            return Err(RelayError::BadHello("host_id is not 24 lowercase hex"));
        }
        Some(_) => return Err(RelayError::BadHello(WRONG)),
    };
    *id = Some(host_id.clone());
    let revision = shared.broker.claim(&host_id, &shared.instance).await?;
    let presence_stop = CancellationToken::new();
    let presence = tokio::spawn(presence(
        shared.clone(),
        host_id.clone(),
        revision,
        presence_stop.clone(),
        conn.fatal(),
    ));
    let served = attached(conn, shared, &host_id).await;
    // Delete the key before the WebSocket closes (the caller closes it after this returns).
    presence_stop.cancel();
    if let Err(e) = presence.await {
        tracing::warn!(error = %e, "the presence task failed");
    }
    served
}

async fn attached<S>(conn: &mut Conn<S>, shared: &Shared, host_id: &str) -> Result<(), RelayError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let inbox = shared.broker.host_inbox(host_id).await?;
    // Welcome is queued before the pump starts, so it is the host's first frame.
    conn.send(Body::Welcome(relay_wire::Welcome {
        instance: shared.instance.clone(),
        host_online: true,
    }))
    .await;
    let _pump = conn.pump(inbox, to_host, format!("host {host_id}"));
    tracing::info!(host_id, "host connected");
    loop {
        let (bytes, body) = match conn.next().await? {
            Next::Gone(why) => {
                tracing::debug!(host_id, why, "host gone");
                return Ok(());
            }
            Next::Frame(bytes, body) => (bytes, body),
        };
        tracing::trace!(
            host_id,
            kind = relay_wire::kind(&body),
            bytes = bytes.len(),
            "from host"
        );
        match body {
            Body::Accept(relay_wire::Accept { channel, .. })
            | Body::Sealed(relay_wire::Sealed { channel, .. })
            | Body::Closed(relay_wire::Closed { channel, .. }) => {
                if !relay_wire::is_channel(&channel) {
                    return Err(RelayError::BadFrame(
                        "channel is not 32 lowercase hex".to_owned(),
                    ));
                }
                let ack = shared.broker.to_channel(&channel, bytes).await?;
                conn.published(ack).await;
            }
            Body::Ping(ping) if ping.loop_back => {
                let ack = shared.broker.to_host(host_id, bytes).await?;
                conn.published(ack).await;
            }
            Body::Ping(ping) => {
                conn.send(Body::Pong(relay_wire::Pong { id: ping.id }))
                    .await
            }
            Body::Pong(_) => {}
            other => {
                return Err(RelayError::BadFrame(format!(
                    "a host may not send {}",
                    relay_wire::kind(&other)
                )));
            }
        }
    }
}

/// A frame from the host's consumer as the host gets it: a loop-back ping becomes its pong.
fn to_host(payload: Bytes) -> Option<Bytes> {
    match relay_wire::decode(&payload).ok()? {
        Body::Ping(ping) => Some(relay_wire::encode(Body::Pong(relay_wire::Pong {
            id: ping.id,
        }))),
        _ => Some(payload),
    }
}

/// The presence key while the host is connected: refreshed every [`PRESENCE_INTERVAL`],
/// deleted at `stop` if still ours.
async fn presence(
    shared: Arc<Shared>,
    host_id: String,
    mut revision: u64,
    stop: CancellationToken,
    fatal: mpsc::Sender<RelayError>,
) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + PRESENCE_INTERVAL,
        PRESENCE_INTERVAL,
    );
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        match shared
            .broker
            .refresh(&host_id, &shared.instance, revision)
            .await
        {
            Ok(Refresh::Held(now)) => revision = now,
            Ok(Refresh::Superseded) => {
                report(&fatal, RelayError::Superseded(format!("host {host_id}")));
                // Not ours any more: nothing to delete.
                stop.cancelled().await;
                return;
            }
            // NATS may be reconnecting: try again at the next tick (the key lives 15 s).
            Err(e) => tracing::warn!(host_id, error = %e, "presence refresh failed"),
        }
    }
    if let Err(e) = shared.broker.release(&host_id, revision).await {
        tracing::debug!(host_id, error = %e, "presence not released (superseded or NATS down)");
    }
}
