//! One paired bot's channel on the host: the Noise [`Channel`] of its handshake, the existing
//! [`link::serve`] serving it, and the pump between them.
//!
//! The link runs over an in-memory WebSocket (`tokio::io::duplex`, [`Role::Server`] on the
//! link's end, [`Role::Client`] on the pump's), so a bot gets exactly what a loopback client
//! gets — `Hello`/`HelloResp`, replay, events, requests and their replies — through its own
//! subscriber row (`bot-<bot_id>`) and with its own rights (the scope it paired with,
//! [`Via::Bot`]). The pump opens the bot's `Sealed` frames into whole inner messages for the
//! link, and seals what the link writes into `Sealed` frames for the fleet connection.
//!
//! Owns: the Noise state (behind a mutex held only around one `seal` or `open`, never across
//! an await, so the two directions run at once and neither can wait on the other) and the
//! link task of this channel. It must not touch the fleet connection: everything it sends goes
//! through its bounded outbound queue ([`Out`]), which the fleet task drains, in order.
//!
//! Overload, edge by edge:
//! - fleet → channel (`inbound`, [`INBOUND_FRAMES`]): the fleet task never waits on one
//!   channel; a bot whose frames come faster than the host serves them overflows it and loses
//!   the channel (`Closed{overflow}`, `crate::relay::fleet`). The bot handshakes again.
//! - channel → fleet (`out`, [`OUTBOUND_FRAMES`]): the pump waits for room. While the fleet
//!   connection is down nothing drains it, the pump stops reading the duplex, the link's
//!   writes block and its bus subscription falls back to catch-up from SQLite — memory stays
//!   bounded and nothing is lost. A queue that takes nothing for [`STALL`] ends the channel
//!   (`overflow`).
//! - A message the link writes that cannot be sealed (over `MAX_FRAME_BYTES`) is logged and
//!   dropped; the channel goes on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Semaphore, broadcast, mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;

use super::fleet::reasons;
use crate::link::{self, Link, Peer};
use crate::protocol::relay_wire::{Body, Sealed};
use crate::protocol::wire::{Codec, MAX_FRAME_BYTES};
use crate::request::access::bot_subscriber_id;
use crate::request::{Access, Via};
use crate::seal::pairs::{BotRecord, PairRegistry};
use crate::seal::{Channel, SealError, SealedFrame};

/// Sealed frames from the bot waiting for the pump.
pub const INBOUND_FRAMES: usize = 64;
/// Frames of this channel waiting for the fleet connection.
pub const OUTBOUND_FRAMES: usize = 64;
/// How long the outbound queue may take nothing before the channel is closed.
pub const STALL: Duration = Duration::from_secs(60);
/// Each direction of the in-memory WebSocket buffers this much.
const DUPLEX_BYTES: usize = 64 * 1024;
/// Once the link has ended, how long the pump has to seal and queue what it wrote last.
const FLUSH_AFTER_LINK: Duration = Duration::from_secs(5);
/// How long the link has to close once the channel ends.
const LINK_CLOSE: Duration = Duration::from_secs(2);
/// The bot's `last_seen_at` is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// What a channel hands the fleet connection, in the order it must be sent.
#[derive(Debug)]
pub enum Out {
    /// An `Accept` (always first) or a `Sealed` frame.
    Frame(Body),
    /// The channel ended on its own: the fleet sends `Closed{reason}` after what came before.
    End(&'static str),
}

/// Why a channel's pump stopped.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// A gap, a frame that does not decrypt, too large a message: the Noise channel is broken.
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("the bot sent nothing for {0} ms")]
    Idle(u64),
    #[error("the fleet connection took no frame for {} s", STALL.as_secs())]
    Stalled,
    /// The link (the host's side) ended: it closed the in-memory WebSocket.
    #[error("the host's side of the channel ended")]
    LinkClosed,
    /// The fleet task let go of the channel.
    #[error("closed by the host")]
    Cancelled,
}

impl ChannelError {
    /// The `Closed` reason a bot is told.
    pub fn reason(&self) -> &'static str {
        match self {
            ChannelError::Seal(SealError::Gap { .. }) => reasons::GAP,
            ChannelError::Seal(SealError::Decrypt | SealError::BadChunk(_)) => reasons::DECRYPT,
            ChannelError::Seal(SealError::TooLarge { .. }) => reasons::TOO_LARGE,
            ChannelError::Seal(_) => reasons::BROKEN,
            ChannelError::Idle(_) => reasons::IDLE,
            ChannelError::Stalled => reasons::OVERFLOW,
            ChannelError::LinkClosed => reasons::ENDED,
            ChannelError::Cancelled => reasons::HOST_STOPPING,
        }
    }
}

/// The in-memory WebSocket as the link reads it: the limits of a loopback connection.
fn link_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
        .read_buffer_size(16 * 1024)
        .write_buffer_size(64 * 1024)
}

/// The pump's end reads what the host's own link wrote: no size limit of its own (a message
/// too large to seal is dropped by the pump, not a broken stream).
fn pump_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(None)
        .max_frame_size(None)
        .read_buffer_size(16 * 1024)
        .write_buffer_size(64 * 1024)
}

/// The in-memory WebSocket pair: the link's end and the pump's.
pub async fn duplex_pair() -> (
    WebSocketStream<tokio::io::DuplexStream>,
    WebSocketStream<tokio::io::DuplexStream>,
) {
    let (link_io, pump_io) = tokio::io::duplex(DUPLEX_BYTES);
    let link_ws =
        WebSocketStream::from_raw_socket(link_io, Role::Server, Some(link_config())).await;
    let pump_ws =
        WebSocketStream::from_raw_socket(pump_io, Role::Client, Some(pump_config())).await;
    (link_ws, pump_ws)
}

/// Move frames between the bot (sealed, through `inbound` and `out`) and the link (inner
/// messages, over `ws`) until something ends the channel. `heard` is told of every frame from
/// the bot; `idle` ends a channel whose bot is silent that long.
pub async fn pump<S>(
    ws: WebSocketStream<S>,
    noise: Channel,
    channel: &str,
    mut inbound: mpsc::Receiver<SealedFrame>,
    out: &mpsc::Sender<Out>,
    idle: Option<Duration>,
    heard: &watch::Sender<()>,
) -> ChannelError
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let noise = Mutex::new(noise);
    let from_bot = async {
        loop {
            let frame = match idle {
                Some(limit) => match tokio::time::timeout(limit, inbound.recv()).await {
                    Ok(frame) => frame,
                    Err(_) => {
                        return ChannelError::Idle(u64::try_from(limit.as_millis()).unwrap_or(0));
                    }
                },
                None => inbound.recv().await,
            };
            let Some(frame) = frame else {
                return ChannelError::Cancelled;
            };
            heard.send_replace(());
            let opened = match noise.lock() {
                Ok(mut noise) => noise.open(&frame),
                Err(_) => Err(SealError::Broken),
            };
            match opened {
                Ok(Some(inner)) => {
                    if sink.send(Message::Binary(inner.into())).await.is_err() {
                        return ChannelError::LinkClosed;
                    }
                }
                // A chunk of a message still incomplete, or a duplicate (dropped).
                Ok(None) => {}
                Err(e) => return ChannelError::Seal(e),
            }
        }
    };
    let to_bot = async {
        loop {
            let inner = match stream.next().await {
                Some(Ok(Message::Binary(bytes))) => bytes,
                Some(Ok(Message::Close(_)) | Err(_)) | None => return ChannelError::LinkClosed,
                // The link speaks protobuf (binary) and sends no pings over this socket.
                Some(Ok(_)) => continue,
            };
            let sealed = match noise.lock() {
                Ok(mut noise) => noise.seal(&inner),
                Err(_) => Err(SealError::Broken),
            };
            let frames = match sealed {
                Ok(frames) => frames,
                Err(SealError::TooLarge { bytes, limit }) => {
                    tracing::warn!(
                        bytes,
                        limit,
                        "a message for the bot is too large to seal; dropped"
                    );
                    continue;
                }
                Err(e) => return ChannelError::Seal(e),
            };
            for frame in frames {
                let item = Out::Frame(Body::Sealed(Sealed {
                    channel: channel.to_owned(),
                    nonce: frame.nonce,
                    ciphertext: frame.ciphertext,
                }));
                match tokio::time::timeout(STALL, out.send(item)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return ChannelError::Cancelled,
                    Err(_) => return ChannelError::Stalled,
                }
            }
        }
    };
    tokio::select! {
        end = from_bot => end,
        end = to_bot => end,
    }
}

/// Everything one channel task needs.
pub struct ChannelTask {
    pub channel: String,
    pub bot: BotRecord,
    pub noise: Channel,
    pub inbound: mpsc::Receiver<SealedFrame>,
    pub out: mpsc::Sender<Out>,
    /// Cancelled by the fleet task when it closes the channel itself (it tells the bot why).
    pub cancel: CancellationToken,
    pub link: Link,
    pub pairs: PairRegistry,
    pub idle: Option<Duration>,
    /// Links waiting for their bot's `Hello`: a permit is taken before the link starts and
    /// held until `Hello` (`link::serve`'s `hello_permit`).
    pub before_hello: Arc<Semaphore>,
}

/// Run one channel until it ends: the link and the pump side by side; at the end, unless the
/// fleet task closed it, `Out::End` with the reason after everything queued before it.
pub async fn run(task: ChannelTask) {
    let ChannelTask {
        channel,
        bot,
        noise,
        inbound,
        out,
        cancel,
        link,
        pairs,
        idle,
        before_hello,
    } = task;
    // Subscribed before anything runs: a revocation from now on ends the channel here at
    // once, whatever the fleet task is busy with.
    let revocations = pairs.revocations();
    let hello_permit = tokio::select! {
        () = cancel.cancelled() => return,
        permit = before_hello.acquire_owned() => match permit {
            Ok(permit) => permit,
            Err(_) => return,
        },
    };
    if let Err(e) = pairs.channel_opened(&bot.bot_id).await {
        tracing::debug!(error = %e, "the channel's opening was not counted");
    }
    let subscriber_id = bot_subscriber_id(&bot.bot_id);
    let (link_ws, pump_ws) = duplex_pair().await;
    let link_cancel = cancel.child_token();
    let peer = Peer {
        via: Via::Bot {
            bot_id: bot.bot_id.clone(),
        },
        codec: Codec::Protobuf,
        access: Some(Access::new(bot.scope.clone())),
        lane: None,
    };
    let serving = link::serve(
        link_ws,
        &link,
        &subscriber_id,
        peer,
        None,
        link_cancel.clone(),
        Some(hello_permit),
    );
    let (heard, heard_rx) = watch::channel(());
    let pumping = pump(pump_ws, noise, &channel, inbound, &out, idle, &heard);
    let touching = touch_while_heard(&pairs, &bot.bot_id, heard_rx);
    let revoked = until_revoked(&pairs, &bot, revocations);
    tokio::pin!(serving, pumping, touching, revoked);
    let mut link_ended = false;
    let end = tokio::select! {
        () = cancel.cancelled() => None,
        link_end = &mut serving => {
            link_ended = true;
            tracing::info!(%link_end, "the channel's link ended");
            // What the link wrote last (a refusal, a reply) still reaches the bot.
            if let Ok(pump_end) = tokio::time::timeout(FLUSH_AFTER_LINK, &mut pumping).await {
                tracing::debug!(%pump_end, "the pump finished after the link");
            }
            Some(reasons::ENDED)
        }
        pump_end = &mut pumping => {
            tracing::info!(reason = pump_end.reason(), error = %pump_end, "the channel ended");
            Some(pump_end.reason())
        }
        () = &mut touching => None,
        () = &mut revoked => {
            tracing::info!("the bot was revoked; the channel ends at once");
            // The fleet task tells the bot (`Closed{revoked}`) when it handles the revocation.
            None
        }
    };
    link_cancel.cancel();
    if !link_ended
        && tokio::time::timeout(LINK_CLOSE, &mut serving)
            .await
            .is_err()
    {
        tracing::debug!("the channel's link did not close in time");
    }
    if let Some(reason) = end {
        tokio::select! {
            () = cancel.cancelled() => {}
            sent = tokio::time::timeout(STALL, out.send(Out::End(reason))) => {
                if !matches!(sent, Ok(Ok(()))) {
                    tracing::debug!(reason, "the channel's end could not be queued");
                }
            }
        }
    }
    if let Err(e) = pairs.channel_closed(&bot.bot_id).await {
        tracing::debug!(error = %e, "the channel's closing was not counted");
    }
}

/// Returns once `bot` is revoked (or gone); a lagging receiver looks the bot up again.
async fn until_revoked(
    pairs: &PairRegistry,
    bot: &BotRecord,
    mut revocations: broadcast::Receiver<String>,
) {
    loop {
        match revocations.recv().await {
            Ok(bot_id) if bot_id == bot.bot_id => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => match pairs.bot(&bot.public_key).await {
                Ok(Some(record)) if !record.is_revoked() => {}
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "the channel's bot could not be checked again")
                }
            },
            Err(RecvError::Closed) => return std::future::pending().await,
        }
    }
}

/// The bot's `last_seen_at`, written when it is heard from, at most every [`TOUCH_EVERY`].
async fn touch_while_heard(pairs: &PairRegistry, bot_id: &str, mut heard: watch::Receiver<()>) {
    loop {
        if heard.changed().await.is_err() {
            // The pump is gone; the channel is ending.
            return std::future::pending().await;
        }
        if let Err(e) = pairs.touch(bot_id).await {
            tracing::debug!(error = %e, "the bot's last-seen time was not written");
        }
        tokio::time::sleep(TOUCH_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scope::Scope;
    use crate::seal::{Accepted, BotHandshake, BotKey, HandshakeKind, HostHandshake, HostKey};

    const CHANNEL: &str = "0123456789abcdef0123456789abcdef";

    /// A connected pair of Noise channels: the bot's, then the host's.
    fn noise_pair() -> (Channel, Channel) {
        let host = HostKey::generate().unwrap();
        let bot = BotKey::generate().unwrap();
        let (bot_side, m1) =
            BotHandshake::start(HandshakeKind::Connect, &bot, &host.public(), None, "t").unwrap();
        let (host_side, hello) =
            HostHandshake::read(HandshakeKind::Connect, &host, None, &m1).unwrap();
        let (h, m2) = host_side
            .accept(&Accepted {
                host_id: host.host_id(),
                bot_id: hello.bot_id,
                scope: Scope::default(),
            })
            .unwrap();
        let (b, _) = bot_side.finish(&m2).unwrap();
        (b, h)
    }

    struct Rig {
        /// The link's end of the duplex, driven by the test.
        link: WebSocketStream<tokio::io::DuplexStream>,
        bot: Channel,
        inbound: mpsc::Sender<SealedFrame>,
        out: mpsc::Receiver<Out>,
        pump: tokio::task::JoinHandle<ChannelError>,
    }

    async fn rig() -> Rig {
        let (bot, host) = noise_pair();
        let (link, pump_ws) = duplex_pair().await;
        let (inbound, inbound_rx) = mpsc::channel(INBOUND_FRAMES);
        let (out_tx, out) = mpsc::channel(OUTBOUND_FRAMES);
        let pump = tokio::spawn(async move {
            let (heard, _) = watch::channel(());
            super::pump(pump_ws, host, CHANNEL, inbound_rx, &out_tx, None, &heard).await
        });
        Rig {
            link,
            bot,
            inbound,
            out,
            pump,
        }
    }

    /// The inner message the bot opens from the pump's next frames.
    async fn bot_reads(rig: &mut Rig) -> Vec<u8> {
        loop {
            let item = tokio::time::timeout(Duration::from_secs(10), rig.out.recv())
                .await
                .unwrap()
                .unwrap();
            let Out::Frame(Body::Sealed(sealed)) = item else {
                panic!("not a sealed frame: {item:?}");
            };
            assert_eq!(sealed.channel, CHANNEL);
            let frame = SealedFrame {
                nonce: sealed.nonce,
                ciphertext: sealed.ciphertext,
            };
            if let Some(inner) = rig.bot.open(&frame).unwrap() {
                return inner;
            }
        }
    }

    async fn link_reads(rig: &mut Rig) -> Vec<u8> {
        match tokio::time::timeout(Duration::from_secs(10), rig.link.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Binary(bytes))) => bytes.to_vec(),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn sealed_frames_become_the_links_messages_and_back() {
        let mut rig = rig().await;
        for frame in rig.bot.seal(b"hello from the bot").unwrap() {
            rig.inbound.send(frame).await.unwrap();
        }
        assert_eq!(link_reads(&mut rig).await, b"hello from the bot");
        rig.link
            .send(Message::Binary(b"hello from the host".to_vec().into()))
            .await
            .unwrap();
        assert_eq!(bot_reads(&mut rig).await, b"hello from the host");
        // A duplicate (a relay redelivering) is dropped without a word.
        let again = rig.bot.seal(b"second").unwrap();
        for frame in again.iter().chain(again.iter()) {
            rig.inbound.send(frame.clone()).await.unwrap();
        }
        assert_eq!(link_reads(&mut rig).await, b"second");
        // The link closing ends the pump.
        rig.link.close(None).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), rig.pump)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(end, ChannelError::LinkClosed), "{end:?}");
        assert_eq!(end.reason(), "ended");
    }

    #[tokio::test]
    async fn a_one_mib_message_goes_both_ways_in_chunks() {
        let mut rig = rig().await;
        let big: Vec<u8> = (0..MAX_FRAME_BYTES).map(|i| (i % 251) as u8).collect();
        let frames = rig.bot.seal(&big).unwrap();
        assert!(frames.len() > 1, "chunked: {}", frames.len());
        let inbound = rig.inbound.clone();
        let sender = tokio::spawn(async move {
            for frame in frames {
                inbound.send(frame).await.unwrap();
            }
        });
        assert_eq!(link_reads(&mut rig).await, big);
        sender.await.unwrap();
        // The other way: the pump seals while the link still writes (the duplex holds 64 KiB),
        // so the bot reads at the same time.
        let Rig {
            mut link,
            mut bot,
            mut out,
            ..
        } = rig;
        let reversed: Vec<u8> = big.iter().rev().copied().collect();
        let (written, read) =
            tokio::join!(link.send(Message::Binary(reversed.clone().into())), async {
                loop {
                    let item = out.recv().await.unwrap();
                    let Out::Frame(Body::Sealed(sealed)) = item else {
                        panic!("{item:?}")
                    };
                    let frame = SealedFrame {
                        nonce: sealed.nonce,
                        ciphertext: sealed.ciphertext,
                    };
                    if let Some(inner) = bot.open(&frame).unwrap() {
                        return inner;
                    }
                }
            });
        written.unwrap();
        assert_eq!(read, reversed);
    }

    #[tokio::test]
    async fn a_gap_breaks_the_channel() {
        let mut rig = rig().await;
        let first = rig.bot.seal(b"one").unwrap();
        let _lost = rig.bot.seal(b"two").unwrap();
        let third = rig.bot.seal(b"three").unwrap();
        rig.inbound.send(first[0].clone()).await.unwrap();
        assert_eq!(link_reads(&mut rig).await, b"one");
        rig.inbound.send(third[0].clone()).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), rig.pump)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(
                end,
                ChannelError::Seal(SealError::Gap {
                    expected: 1,
                    got: 2
                })
            ),
            "{end:?}"
        );
        assert_eq!(end.reason(), "gap");
    }

    #[tokio::test]
    async fn garbage_breaks_the_channel_and_says_decrypt() {
        let rig = rig().await;
        rig.inbound
            .send(SealedFrame {
                nonce: 0,
                ciphertext: vec![7; 40],
            })
            .await
            .unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), rig.pump)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(end.reason(), "decrypt", "{end:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_bot_is_idle() {
        let (_bot, host) = noise_pair();
        let (_link, pump_ws) = duplex_pair().await;
        let (_inbound, inbound_rx) = mpsc::channel(INBOUND_FRAMES);
        let (out_tx, _out) = mpsc::channel(OUTBOUND_FRAMES);
        let (heard, _) = watch::channel(());
        let end = pump(
            pump_ws,
            host,
            CHANNEL,
            inbound_rx,
            &out_tx,
            Some(Duration::from_secs(30)),
            &heard,
        )
        .await;
        assert!(matches!(end, ChannelError::Idle(30_000)), "{end:?}");
        assert_eq!(end.reason(), "idle");
    }
}
