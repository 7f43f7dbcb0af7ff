//! A bot's connection (`/bot`): `BotHello{host_id, channels}` first; the relay attaches the
//! durable consumer `b-<channel>` of every channel listed (a bot that reconnected), reads the
//! host's presence and says `Welcome{instance, host_online}` — the first frame the bot gets;
//! the listed channels' frames follow it. From then on:
//! - the bot's `Open`, `Sealed`, `Closed` are published, unchanged, to `ah.h.<host_id>`; a
//!   channel's consumer is attached before its first frame is published, so the host's
//!   answer always finds it; after the bot's own `Closed` the channel's consumer is deleted;
//! - frames from the channels' consumers (`Accept`, `Sealed`, `Closed` from the host) are
//!   written unchanged and acked after the write;
//! - `Ping` is answered here (`loop_back` is the host's probe; a bot's is answered the same),
//!   a `Pong` only proves it is alive, any other kind is `bad_frame`.
//!
//! A connection holds at most [`MAX_CHANNELS_PER_BOT`] channels (`too_many_channels`). Its
//! channels' consumers outlive it (60 s without a reader), so frames the host sends while the
//! bot is away wait in JetStream for its next connection, on any instance.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::endpoint::{Conn, Next};
use super::error::RelayError;
use crate::protocol::relay_wire::{self, Body, MAX_CHANNELS_PER_BOT};

/// Serve one upgraded `/bot` connection until it ends.
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
    if let Err(e) = &outcome {
        tracing::info!(host_id, code = e.code(), error = %e, "bot connection refused or ended");
    }
    let sent = conn.finish(&outcome).await;
    tracing::info!(
        host_id,
        frames_in = received.frames,
        bytes_in = received.bytes,
        frames_out = sent.frames,
        bytes_out = sent.bytes,
        ms = started.elapsed().as_millis(),
        "bot disconnected"
    );
}

/// The channels of one bot connection: each one's pump.
type Channels = HashMap<String, CancellationToken>;

async fn session<S>(
    conn: &mut Conn<S>,
    shared: &Shared,
    id: &mut Option<String>,
) -> Result<(), RelayError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    const WRONG: &str = "the first frame must be BotHello";
    let hello = match conn.first("no BotHello in time", WRONG).await? {
        None => return Ok(()),
        Some(Body::BotHello(hello)) => hello,
        Some(_) => return Err(RelayError::BadHello(WRONG)),
    };
    if !relay_wire::is_host_id(&hello.host_id) {
        return Err(RelayError::BadHello("host_id is not 24 lowercase hex"));
    }
    if !hello.channels.iter().all(|c| relay_wire::is_channel(c)) {
        return Err(RelayError::BadHello("a channel is not 32 lowercase hex"));
    }
    let host_id = hello.host_id;
    *id = Some(host_id.clone());
    let mut resumed = Vec::new();
    for channel in hello.channels {
        if resumed.iter().any(|(c, _)| *c == channel) {
            continue;
        }
        if resumed.len() >= MAX_CHANNELS_PER_BOT {
            return Err(RelayError::TooManyChannels);
        }
        let inbox = shared.broker.channel_inbox(&channel).await?;
        resumed.push((channel, inbox));
    }
    let host_online = shared.broker.host_online(&host_id).await?;
    // Welcome is queued before the resumed channels' pumps start: it is the bot's first frame.
    conn.send(Body::Welcome(relay_wire::Welcome {
        instance: shared.instance.clone(),
        host_online,
    }))
    .await;
    let mut channels = Channels::new();
    for (channel, inbox) in resumed {
        let pump = conn.pump(inbox, to_bot, format!("channel {channel}"));
        channels.insert(channel, pump);
    }
    tracing::info!(
        host_id,
        channels = channels.len(),
        host_online,
        "bot connected"
    );
    loop {
        let (bytes, body) = match conn.next().await? {
            Next::Gone(why) => {
                tracing::debug!(host_id, why, "bot gone");
                return Ok(());
            }
            Next::Frame(bytes, body) => (bytes, body),
        };
        tracing::trace!(
            host_id,
            kind = relay_wire::kind(&body),
            bytes = bytes.len(),
            "from bot"
        );
        match &body {
            Body::Open(relay_wire::Open { channel, .. })
            | Body::Sealed(relay_wire::Sealed { channel, .. })
            | Body::Closed(relay_wire::Closed { channel, .. }) => {
                if !relay_wire::is_channel(channel) {
                    return Err(RelayError::BadFrame(
                        "channel is not 32 lowercase hex".to_owned(),
                    ));
                }
                if !channels.contains_key(channel) {
                    attach(conn, shared, &mut channels, channel.clone()).await?;
                }
                let ack = shared.broker.to_host(&host_id, bytes).await?;
                conn.published(ack).await;
                if matches!(body, Body::Closed(_)) {
                    if let Some(pump) = channels.remove(channel) {
                        pump.cancel();
                    }
                    shared.broker.drop_channel(channel).await?;
                    tracing::debug!(host_id, channel, "channel closed by the bot");
                }
            }
            Body::Ping(ping) => {
                conn.send(Body::Pong(relay_wire::Pong { id: ping.id }))
                    .await
            }
            Body::Pong(_) => {}
            other => {
                return Err(RelayError::BadFrame(format!(
                    "a bot may not send {}",
                    relay_wire::kind(other)
                )));
            }
        }
    }
}

/// Attach a channel's consumer and pump it to the bot.
async fn attach<S>(
    conn: &Conn<S>,
    shared: &Shared,
    channels: &mut Channels,
    channel: String,
) -> Result<(), RelayError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if channels.contains_key(&channel) {
        return Ok(());
    }
    if channels.len() >= MAX_CHANNELS_PER_BOT {
        return Err(RelayError::TooManyChannels);
    }
    let inbox = shared.broker.channel_inbox(&channel).await?;
    let pump = conn.pump(inbox, to_bot, format!("channel {channel}"));
    tracing::debug!(channel, "channel attached");
    channels.insert(channel, pump);
    Ok(())
}

/// Frames to a bot go out as stored.
fn to_bot(payload: Bytes) -> Option<Bytes> {
    Some(payload)
}
