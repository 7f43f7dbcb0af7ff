//! One endpoint's WebSocket, host or bot alike: [`Conn`] owns the read half and the tasks
//! around it — the writer, the publish-ack pipeline and the pumps from durable consumers —
//! and ends them in order. Generic over the byte stream, so it serves a TCP socket or a
//! test's in-memory duplex the same way.
//!
//! Tasks and the queues between them, each bounded, with what happens when one fills:
//! - **pump → writer** ([`OUT_QUEUE`] frames): one pump per consumer takes frames from NATS and
//!   queues them for the writer, which writes each and only then acks it. An endpoint that
//!   stops reading blocks the writer, the queue fills, the pumps wait, and the frames stay in
//!   JetStream (at most [`super::broker::MAX_ACK_PENDING`] handed out per consumer). Past
//!   `ack_wait` the server redelivers them; the duplicates are dropped by the endpoints'
//!   nonce rule. A single write blocked for [`WRITE_TIMEOUT`] ends the connection.
//! - **reader → NATS** ([`PUBLISH_PIPELINE`] un-acked publishes): frames from the endpoint
//!   are published in order and their JetStream acks awaited in order by the acker task; when
//!   that many are outstanding the reader waits, so a fast endpoint is slowed to what NATS
//!   stores (TCP back-pressure), never buffered here. A failed ack ends the connection with
//!   `broker_unavailable`.
//! - **reader → writer** (the same [`OUT_QUEUE`]): the relay's own frames (`Welcome`,
//!   `Pong`) wait for room like deliveries do; an endpoint that never reads stops being read.
//! - **fatal** (capacity 1): a task that hits an error that must end the connection reports
//!   it here; the first one wins and the later ones, which the close makes moot, are logged.
//!
//! Liveness: the writer sends a WebSocket ping every [`PING_INTERVAL`]; a connection that
//! gives nothing at all (frame, pong) for [`DEAD_AFTER`] is dropped.
//!
//! Never logged: frame content. The log gets kinds, ids, sizes and timing.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::pull::MessagesErrorKind;
use async_nats::jetstream::context::PublishAckFuture;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use super::broker::Inbox;
use super::error::{BrokerError, RelayError};
use crate::protocol::relay_wire::{self, Body};

/// Frames queued for one endpoint's writer.
pub const OUT_QUEUE: usize = 64;
/// Publishes from one endpoint whose JetStream ack has not come back yet.
pub const PUBLISH_PIPELINE: usize = 64;
/// How often the relay pings an endpoint.
pub const PING_INTERVAL: Duration = Duration::from_secs(20);
/// An endpoint silent this long is dropped.
pub const DEAD_AFTER: Duration = Duration::from_secs(60);
/// One WebSocket write may take this long.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// What a close may take: the last queued frames, the `Error` frame, the close handshake and
/// the last publish acks.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What the writer is given.
enum Out {
    /// A frame of the relay's own (`Welcome`, `Pong`).
    Frame(Bytes),
    /// A frame from a consumer: written, then acked — so a frame an instance took but did not
    /// write before it died is redelivered to whichever instance the endpoint comes back to.
    /// Boxed: a JetStream message is large beside the other variants.
    Delivery(Bytes, Box<jetstream::Message>),
    /// The end: an optional `Error` frame, then the close handshake.
    Close(Option<Bytes>),
}

/// Frames and bytes, for the log line at the end of a connection.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub frames: u64,
    pub bytes: u64,
}

impl Counts {
    fn add(&mut self, len: usize) {
        self.frames += 1;
        self.bytes += u64::try_from(len).unwrap_or(u64::MAX);
    }
}

/// What the endpoint sent next.
pub enum Next {
    /// One frame: the message as received (published unchanged) and its decoded body.
    Frame(Bytes, Body),
    /// The endpoint is gone: closed, silent too long, or its socket failed. Why, for the log.
    Gone(&'static str),
}

/// A pump turns a consumer's payload into the frame to write (`None`: not a frame, drop it).
pub type Translate = fn(Bytes) -> Option<Bytes>;

/// One endpoint connection and the tasks serving it.
pub struct Conn<S> {
    inbound: SplitStream<WebSocketStream<S>>,
    out: mpsc::Sender<Out>,
    writer: JoinHandle<Counts>,
    publishes: mpsc::Sender<PublishAckFuture>,
    acker: JoinHandle<()>,
    fatal_tx: mpsc::Sender<RelayError>,
    fatal_rx: mpsc::Receiver<RelayError>,
    /// Cancelled at instance shutdown.
    shutdown: CancellationToken,
    /// Cancelled by the writer when a write fails: the endpoint is gone.
    write_failed: CancellationToken,
    /// Parent of every pump's token.
    pumps: CancellationToken,
    last_seen: Instant,
    pub received: Counts,
    pub started: Instant,
}

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Start the writer and the acker around an upgraded WebSocket.
    pub fn start(ws: WebSocketStream<S>, shutdown: CancellationToken) -> Conn<S> {
        let (sink, inbound) = ws.split();
        let (out, queue) = mpsc::channel(OUT_QUEUE);
        let write_failed = CancellationToken::new();
        let writer = tokio::spawn(writer(sink, queue, write_failed.clone()));
        let (fatal_tx, fatal_rx) = mpsc::channel(1);
        let (publishes, pending) = mpsc::channel(PUBLISH_PIPELINE);
        let acker = tokio::spawn(acker(pending, fatal_tx.clone()));
        let now = Instant::now();
        Conn {
            inbound,
            out,
            writer,
            publishes,
            acker,
            fatal_tx,
            fatal_rx,
            shutdown,
            write_failed,
            pumps: CancellationToken::new(),
            last_seen: now,
            received: Counts::default(),
            started: now,
        }
    }

    /// The next frame, or why there is none. An error ends the connection with an `Error`
    /// frame ([`Conn::finish`]); `Gone` ends it without one.
    pub async fn next(&mut self) -> Result<Next, RelayError> {
        loop {
            let deadline = self.last_seen + DEAD_AFTER;
            let message = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return Err(RelayError::ShuttingDown),
                Some(e) = self.fatal_rx.recv() => return Err(e),
                () = self.write_failed.cancelled() => return Ok(Next::Gone("a write failed")),
                read = tokio::time::timeout_at(deadline, self.inbound.next()) => match read {
                    Err(_) => return Ok(Next::Gone("silent too long")),
                    Ok(None) => return Ok(Next::Gone("the stream ended")),
                    Ok(Some(Err(WsError::Capacity(CapacityError::MessageTooLong { size, .. })))) => {
                        return Err(RelayError::TooLarge(size));
                    }
                    Ok(Some(Err(e))) => {
                        tracing::debug!(error = %e, "WebSocket read failed");
                        return Ok(Next::Gone("a read failed"));
                    }
                    Ok(Some(Ok(message))) => message,
                },
            };
            self.last_seen = Instant::now();
            match message {
                Message::Binary(bytes) => {
                    self.received.add(bytes.len());
                    let body = relay_wire::decode(&bytes)
                        .map_err(|e| RelayError::BadFrame(e.to_string()))?;
                    return Ok(Next::Frame(bytes, body));
                }
                Message::Text(_) => {
                    return Err(RelayError::BadFrame(
                        "a text message; relay frames are binary".to_owned(),
                    ));
                }
                // tungstenite answers pings itself; either kind proves the peer is there.
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                Message::Close(_) => return Ok(Next::Gone("closed by the endpoint")),
            }
        }
    }

    /// The first frame, which must be the endpoint's hello: `None` if the endpoint left first.
    /// No frame within [`super::HELLO_TIMEOUT`] is `late`; a first message that is not even a
    /// frame is `wrong`, as is a frame of another kind (which the caller checks).
    pub async fn first(
        &mut self,
        late: &'static str,
        wrong: &'static str,
    ) -> Result<Option<Body>, RelayError> {
        match tokio::time::timeout(super::HELLO_TIMEOUT, self.next()).await {
            Err(_) => Err(RelayError::BadHello(late)),
            Ok(Err(RelayError::BadFrame(_))) => Err(RelayError::BadHello(wrong)),
            Ok(Err(e)) => Err(e),
            Ok(Ok(Next::Gone(_))) => Ok(None),
            Ok(Ok(Next::Frame(_, body))) => Ok(Some(body)),
        }
    }

    /// Queue a frame of the relay's own. If the writer is gone the frame has nowhere to go:
    /// the writer said so on `write_failed`, which the next [`Conn::next`] returns.
    pub async fn send(&self, body: Body) {
        if self
            .out
            .send(Out::Frame(relay_wire::encode(body)))
            .await
            .is_err()
        {
            tracing::debug!("the writer is gone; a relay frame was not sent");
        }
    }

    /// Hand a publish's ack to the pipeline (waiting while it is full). If the acker is gone
    /// it failed and reported why on `fatal`, which the next [`Conn::next`] returns.
    pub async fn published(&self, ack: PublishAckFuture) {
        if self.publishes.send(ack).await.is_err() {
            tracing::debug!("the publish pipeline is gone");
        }
    }

    /// A way for other tasks to end this connection with an error.
    pub fn fatal(&self) -> mpsc::Sender<RelayError> {
        self.fatal_tx.clone()
    }

    /// Start pumping `inbox` to the endpoint; cancel the returned token to stop (the frames
    /// it had not written stay un-acked and come again to the next reader).
    pub fn pump(&self, inbox: Inbox, translate: Translate, what: String) -> CancellationToken {
        let stop = self.pumps.child_token();
        tokio::spawn(pump(
            inbox,
            self.out.clone(),
            translate,
            stop.clone(),
            self.fatal_tx.clone(),
            what,
        ));
        stop
    }

    /// End the connection: stop the pumps, send `Error` if `outcome` is one, close, let the
    /// last publishes be acked — all within [`CLOSE_GRACE`]. The frames written.
    pub async fn finish(self, outcome: &Result<(), RelayError>) -> Counts {
        self.pumps.cancel();
        let error = outcome.as_ref().err().map(|e| {
            relay_wire::encode(Body::Error(relay_wire::Error {
                code: e.code().to_owned(),
                message: e.to_string(),
            }))
        });
        let deadline = Instant::now() + CLOSE_GRACE;
        if tokio::time::timeout_at(deadline, self.out.send(Out::Close(error)))
            .await
            .is_err()
        {
            tracing::debug!("the writer did not take the close in time");
        }
        drop(self.out);
        drop(self.publishes);
        drop(self.inbound);
        let mut writer = self.writer;
        let written = match tokio::time::timeout_at(deadline, &mut writer).await {
            Ok(Ok(counts)) => counts,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the writer task failed");
                Counts::default()
            }
            Err(_) => {
                writer.abort();
                Counts::default()
            }
        };
        let mut acker = self.acker;
        if tokio::time::timeout_at(deadline, &mut acker).await.is_err() {
            tracing::debug!("publish acks still pending at close");
            acker.abort();
        }
        written
    }
}

/// Report an error that ends the connection; the first one wins.
pub fn report(fatal: &mpsc::Sender<RelayError>, error: RelayError) {
    if let Err(mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e)) =
        fatal.try_send(error)
    {
        tracing::debug!(error = %e, "a further error while the connection ends");
    }
}

async fn write<S>(
    sink: &mut SplitSink<WebSocketStream<S>, Message>,
    message: Message,
) -> Result<(), &'static str>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(WRITE_TIMEOUT, sink.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "WebSocket write failed");
            Err("a write failed")
        }
        Err(_) => Err("a write blocked too long"),
    }
}

/// The one task that writes to the endpoint: queued frames in order (acking deliveries after
/// their write), pings, and the close.
async fn writer<S>(
    mut sink: SplitSink<WebSocketStream<S>, Message>,
    mut queue: mpsc::Receiver<Out>,
    failed: CancellationToken,
) -> Counts
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut counts = Counts::default();
    let mut ping = tokio::time::interval_at(Instant::now() + PING_INTERVAL, PING_INTERVAL);
    loop {
        let item = tokio::select! {
            biased;
            item = queue.recv() => item,
            _ = ping.tick() => {
                if let Err(why) = write(&mut sink, Message::Ping(Bytes::new())).await {
                    tracing::debug!(why, "ping not sent");
                    failed.cancel();
                    return counts;
                }
                continue;
            }
        };
        let (frame, delivery) = match item {
            None => return counts,
            Some(Out::Frame(frame)) => (frame, None),
            Some(Out::Delivery(frame, message)) => (frame, Some(message)),
            Some(Out::Close(error)) => {
                if let Some(error) = error {
                    counts.add(error.len());
                    let _best_effort = write(&mut sink, Message::Binary(error)).await;
                }
                let close = Message::Close(Some(CloseFrame {
                    code: CloseCode::Normal,
                    reason: "".into(),
                }));
                // The endpoint may have closed first or be gone: nothing left to tell it.
                let _best_effort = write(&mut sink, close).await;
                return counts;
            }
        };
        let len = frame.len();
        if let Err(why) = write(&mut sink, Message::Binary(frame)).await {
            tracing::debug!(why, "frame not written");
            failed.cancel();
            return counts;
        }
        counts.add(len);
        if let Some(message) = delivery
            && let Err(e) = message.ack().await
        {
            // It will come again after ack_wait; the endpoint drops the duplicate.
            tracing::warn!(error = %e, "ack failed after a write");
        }
    }
}

/// Await publish acks in order; the first failure ends the connection.
async fn acker(mut pending: mpsc::Receiver<PublishAckFuture>, fatal: mpsc::Sender<RelayError>) {
    while let Some(ack) = pending.recv().await {
        if let Err(e) = ack.await {
            report(
                &fatal,
                RelayError::Broker(BrokerError::new("a publish was not acked", e)),
            );
            return;
        }
    }
}

/// Move one consumer's frames to the writer until stopped or the consumer fails.
async fn pump(
    mut inbox: Inbox,
    out: mpsc::Sender<Out>,
    translate: Translate,
    stop: CancellationToken,
    fatal: mpsc::Sender<RelayError>,
    what: String,
) {
    loop {
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            next = inbox.next() => next,
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                let error = if e.kind() == MessagesErrorKind::ConsumerDeleted {
                    RelayError::Superseded(what)
                } else {
                    RelayError::Broker(BrokerError::new("reading a consumer", e))
                };
                report(&fatal, error);
                return;
            }
            None => {
                let e = BrokerError::new("reading a consumer", "the pull stream ended");
                report(&fatal, RelayError::Broker(e));
                return;
            }
        };
        let len = message.payload.len();
        let Some(frame) = translate(message.payload.clone()) else {
            tracing::warn!(bytes = len, %what, "not a relay frame in a consumer; dropped");
            if let Err(e) = message.ack().await {
                tracing::debug!(error = %e, "ack of a dropped message failed");
            }
            continue;
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            sent = out.send(Out::Delivery(frame, Box::new(message))) => if sent.is_err() {
                return;
            },
        }
    }
}
