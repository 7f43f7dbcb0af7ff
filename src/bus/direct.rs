//! The direct lane: a loopback WebSocket connection lends its socket to the hub while the
//! connection's own task has nothing to write, so that a delta reaches an idle follower in
//! the hub's own `send`, with no wake-up of the connection's task on the way.
//!
//! Why: a delta that finds the host idle crosses every task on its way cold; the last of
//! those hops, the hub waking one task per follower to write one frame each, was most of the
//! way from Codex's stdout to the tenth follower (`docs/performance.md`).
//!
//! Who writes a connection's socket, and when:
//! - the connection's task, through [`DirectStream`] (everything tungstenite writes: replies,
//!   brackets, queued deltas, pings, pongs, the close frame);
//! - the hub, one whole WebSocket frame per delta, only while the lane is **armed**. The
//!   connection's task arms it (under the lane's lock) only when its subscription is live,
//!   its queue and buffer are empty and everything it wrote is flushed. Any write of the
//!   task disarms it first, and the hub disarms it whenever it queues anything for the slot
//!   (under the same lock, so an arm can never follow a queued item it did not see). Hence a
//!   frame the hub writes is never inside another frame and never ahead of an earlier event.
//! - A frame the socket takes only in part leaves its tail in `pending`, the lane disarmed
//!   and the task woken: [`DirectStream`] writes the tail before anything else.
//! - A socket with no room at all (`EAGAIN`) or in error: the hub queues the delta the normal
//!   way instead, and the task meets the error itself.
//!
//! Only the hub's single-event batches after a millisecond or more without a fan-out use the
//! lane (a delta that found the host idle); a stream of deltas keeps going through the queues,
//! whose writers are awake then, run on every worker and batch many frames per `write`.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, UnixAddr, sendmsg};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::Delivery;
use crate::protocol::wire::{self, Codec};

/// Frames the hub wrote through a lane, whole or in part, and of those the ones taken only in
/// part (their tail left to the connection), since the process started: for tests and
/// benchmarks.
static FRAMES: AtomicU64 = AtomicU64::new(0);
static TAILS: AtomicU64 = AtomicU64::new(0);

/// How many frames every lane of this process has written, and how many of those in part.
pub fn written() -> (u64, u64) {
    (
        FRAMES.load(Ordering::Relaxed),
        TAILS.load(Ordering::Relaxed),
    )
}

/// Which sessions' events the connection may be sent (its access scope); the connection's
/// task filters its queue the same way.
pub type Allow = Box<dyn Fn(&str) -> bool + Send + Sync>;

#[derive(Default)]
struct State {
    /// The connection's socket (owned by its [`DirectStream`]); `None` once that is gone.
    fd: Option<RawFd>,
    armed: bool,
    /// The connection's stream holds bytes not yet flushed (tungstenite may keep part of a
    /// frame): never arm then.
    dirty: bool,
    /// The tail of a frame the hub wrote in part.
    pending: Bytes,
    /// Set by the connection once it knows its codec and access.
    route: Option<(Codec, Allow)>,
}

/// One connection's lane, shared by its stream, its subscription and its hub slot.
#[derive(Default)]
pub struct Direct {
    state: Mutex<State>,
    /// Wakes the connection's task to write a `pending` tail.
    wake: Notify,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Direct")
            .field("open", &st.fd.is_some())
            .field("armed", &st.armed)
            .field("pending", &st.pending.len())
            .finish()
    }
}

/// What the hub's attempt came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// The frame went (whole, or its tail is pending).
    Done,
    /// The connection may not see this session's events: nothing to write or queue.
    Filtered,
    /// Not armed, no room, or an error: queue it.
    Queue,
}

impl Direct {
    /// A lane over the connection's socket, which the [`DirectStream`] built with this lane
    /// must own: the stream closes the lane (under its lock) before the socket is closed,
    /// and the hub only writes under that lock, so it never writes to a closed (or reused)
    /// descriptor. No descriptor is duplicated: a connection costs one, as before.
    pub fn over(socket: &impl AsRawFd) -> Arc<Direct> {
        Arc::new(Direct {
            state: Mutex::new(State {
                fd: Some(socket.as_raw_fd()),
                ..State::default()
            }),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the state torn (plain flags and
        // buffers); go on with it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Which codec frames are built in, and which sessions may be sent. Until this is set
    /// the lane is never used.
    pub fn route(&self, codec: Codec, allow: Allow) {
        self.lock().route = Some((codec, allow));
    }

    /// Resolves when the hub left a frame's tail to write.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Arm the lane if `idle()` still holds under the lock (the caller's queue is empty).
    pub(super) fn arm(&self, idle: impl FnOnce() -> bool) {
        let mut st = self.lock();
        if st.fd.is_some() && st.route.is_some() && !st.dirty && st.pending.is_empty() && idle() {
            st.armed = true;
        }
    }

    /// The connection is busy with something that may write (an inbound request, a close):
    /// the hub queues until the connection arms the lane again.
    pub fn disarm(&self) {
        self.lock().armed = false;
    }

    /// The connection is ending: the hub writes nothing more to it (a tail already left is
    /// still written by the stream, before its close frame).
    pub fn close(&self) {
        let mut st = self.lock();
        st.armed = false;
        st.fd = None;
    }

    /// The hub queues something for this slot (`queue` runs under the lock, the lane
    /// disarmed): the lane must not overtake it.
    pub(super) fn disarmed<T>(&self, queue: impl FnOnce() -> T) -> T {
        let mut st = self.lock();
        st.armed = false;
        queue()
    }

    /// The hub's attempt to write `item` straight to the socket; `queue_empty` is checked
    /// under the lock.
    pub(super) fn send(&self, item: &Delivery, queue_empty: impl FnOnce() -> bool) -> Sent {
        let mut st = self.lock();
        if !st.armed || !queue_empty() {
            st.armed = false;
            return Sent::Queue;
        }
        let (codec, allowed) = match &st.route {
            Some((codec, allow)) => (*codec, allow(&item.session_id)),
            None => return Sent::Queue,
        };
        if !allowed {
            return Sent::Filtered;
        }
        let Some(fd) = st.fd else {
            st.armed = false;
            return Sent::Queue;
        };
        let payload: Bytes = match item.push_message(codec) {
            wire::WireMessage::Binary(bytes) => bytes,
            wire::WireMessage::Text(text) => Bytes::from(text),
        };
        let (header, header_len) = frame_header(codec, payload.len());
        let head = &header[..header_len];
        let iov = [io::IoSlice::new(head), io::IoSlice::new(&payload)];
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        let total = head.len() + payload.len();
        let written = loop {
            match sendmsg::<UnixAddr>(fd, &iov, &[], flags, None) {
                Err(Errno::EINTR) => continue,
                other => break other,
            }
        };
        match written {
            Ok(n) if n == total => {
                FRAMES.fetch_add(1, Ordering::Relaxed);
                Sent::Done
            }
            Ok(n) => {
                FRAMES.fetch_add(1, Ordering::Relaxed);
                TAILS.fetch_add(1, Ordering::Relaxed);
                // The socket took part of the frame: its task writes the rest first.
                let mut tail = BytesMut::with_capacity(total - n);
                if n < head.len() {
                    tail.extend_from_slice(&head[n..]);
                    tail.extend_from_slice(&payload);
                } else {
                    tail.extend_from_slice(&payload[n - head.len()..]);
                }
                st.pending = tail.freeze();
                st.armed = false;
                drop(st);
                self.wake.notify_one();
                Sent::Done
            }
            Err(_) => {
                // No room (`EAGAIN`) or a broken connection: the task's own write finds out.
                st.armed = false;
                Sent::Queue
            }
        }
    }
}

/// A server-to-client WebSocket frame's header (FIN, no mask): binary for protobuf, text
/// for JSON. Returns the bytes and how many of them are used.
fn frame_header(codec: Codec, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = match codec {
        Codec::Protobuf => 0x82,
        Codec::Json => 0x81,
    };
    if len < 126 {
        h[1] = len as u8;
        (h, 2)
    } else if let Ok(short) = u16::try_from(len) {
        h[1] = 126;
        h[2..4].copy_from_slice(&short.to_be_bytes());
        (h, 4)
    } else {
        h[1] = 127;
        h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        (h, 10)
    }
}

/// A connection's stream with the lane beside it: every write disarms the lane and first
/// writes any tail the hub left; a flush that completes marks it clean again. Dropping it
/// closes the lane (the hub never writes to a connection that is gone).
pub struct DirectStream<S> {
    inner: S,
    lane: Arc<Direct>,
}

impl<S> DirectStream<S> {
    pub fn new(inner: S, lane: Arc<Direct>) -> DirectStream<S> {
        DirectStream { inner, lane }
    }
}

impl<S> Drop for DirectStream<S> {
    fn drop(&mut self) {
        self.lane.close();
    }
}

impl<S: AsyncWrite + Unpin> DirectStream<S> {
    /// Disarm, mark dirty, and write what the hub left: `Ready(Ok)` once nothing is left.
    fn settle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.lane.lock();
        st.armed = false;
        st.dirty = true;
        while !st.pending.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &st.pending) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => st.pending.advance(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for DirectStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for DirectStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.settle(cx))?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.settle(cx))?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.settle(cx))?;
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        // Flushed through: tungstenite holds nothing half-written now.
        this.lane.lock().dirty = false;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.settle(cx))?;
        this.lane.close();
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;
    use std::time::Duration;

    use futures_util::{SinkExt, StreamExt};
    use tokio::net::UnixStream;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::Role;

    use super::*;

    fn delta(text: &str, session: &str) -> Delivery {
        Delivery {
            sequence_id: 7,
            message_id: format!("m-{text}").into(),
            session_id: session.into(),
            run_id: None,
            kind: "text.delta".into(),
            is_delta: true,
            json: format!(r#"{{"text":"{text}"}}"#).into(),
            frame: OnceLock::new(),
            json_frame: OnceLock::new(),
        }
    }

    /// A server stream with its lane, routed in `codec` for session "s" only, and the
    /// client's end.
    async fn pair(
        codec: Codec,
    ) -> (
        WebSocketStream<DirectStream<UnixStream>>,
        Arc<Direct>,
        WebSocketStream<UnixStream>,
    ) {
        let (a, b) = UnixStream::pair().unwrap();
        let lane = Direct::over(&a);
        lane.route(codec, Box::new(|s| s == "s"));
        let server = WebSocketStream::from_raw_socket(
            DirectStream::new(a, lane.clone()),
            Role::Server,
            None,
        )
        .await;
        let client = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
        (server, lane, client)
    }

    fn own(codec: Codec, text: &str) -> Message {
        match delta(text, "s").push_message(codec) {
            wire::WireMessage::Binary(bytes) => Message::Binary(bytes),
            wire::WireMessage::Text(text) => Message::Text(text.into()),
        }
    }

    fn text_of(message: Message) -> String {
        match message {
            Message::Binary(bytes) => {
                let decoded = wire::decode(&bytes).unwrap();
                let push: wire::pb::EventPush = decoded.body().unwrap();
                push.event_json
            }
            Message::Text(text) => {
                let decoded = wire::decode_json(text.as_str()).unwrap();
                let push: wire::pb::EventPush = decoded.body().unwrap();
                push.event_json
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn headers_use_the_shortest_length_form() {
        for (len, head) in [
            (0, vec![0x82, 0]),
            (125, vec![0x82, 125]),
            (126, vec![0x82, 126, 0, 126]),
            (65_535, vec![0x82, 126, 0xff, 0xff]),
            (65_536, vec![0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0]),
        ] {
            let (h, n) = frame_header(Codec::Protobuf, len);
            assert_eq!(h[..n], head[..], "length {len}");
        }
        assert_eq!(frame_header(Codec::Json, 3).0[0], 0x81);
    }

    /// Armed, the lane writes frames a WebSocket client reads as the connection's own, in
    /// either codec; what the connection writes next comes after them. Unarmed, or for a
    /// session outside the connection's access, nothing is written by the lane.
    #[tokio::test]
    async fn an_armed_lane_writes_whole_frames_in_order() {
        for codec in [Codec::Protobuf, Codec::Json] {
            let (mut server, lane, mut client) = pair(codec).await;
            assert_eq!(
                lane.send(&delta("early", "s"), || true),
                Sent::Queue,
                "unarmed"
            );
            lane.arm(|| false);
            assert_eq!(lane.send(&delta("queued", "s"), || true), Sent::Queue);
            lane.arm(|| true);
            assert_eq!(lane.send(&delta("a", "s"), || true), Sent::Done);
            assert_eq!(
                lane.send(&delta("hidden", "other"), || true),
                Sent::Filtered
            );
            assert_eq!(lane.send(&delta("b", "s"), || true), Sent::Done);
            // Something queued ahead disarms it.
            assert_eq!(lane.send(&delta("c", "s"), || false), Sent::Queue);
            assert_eq!(lane.send(&delta("d", "s"), || true), Sent::Queue);
            // The connection's own write comes after the lane's.
            lane.arm(|| true);
            server.send(own(codec, "own")).await.unwrap();
            assert_eq!(
                lane.send(&delta("e", "s"), || true),
                Sent::Queue,
                "a write disarms"
            );
            let mut got = Vec::new();
            for _ in 0..3 {
                got.push(text_of(client.next().await.unwrap().unwrap()));
            }
            assert_eq!(
                got,
                [r#"{"text":"a"}"#, r#"{"text":"b"}"#, r#"{"text":"own"}"#],
                "{codec:?}"
            );
        }
    }

    /// A socket that takes a frame only in part: its tail is kept, the lane disarmed and the
    /// connection woken; the connection's next flush writes the tail before anything else, and
    /// the client reads every frame whole, in order. A closed connection's lane writes nothing.
    #[tokio::test]
    async fn a_partial_write_is_finished_by_the_connection_first() {
        let (mut server, lane, mut client) = pair(Codec::Protobuf).await;
        let big = "x".repeat(40_000);
        let mut sent = Vec::new();
        let mut partial = false;
        for i in 0..200 {
            lane.arm(|| true);
            let text = format!("{i}-{big}");
            match lane.send(&delta(&text, "s"), || true) {
                Sent::Done => sent.push(text),
                Sent::Queue | Sent::Filtered => break,
            }
            if !lane.lock().pending.is_empty() {
                partial = true;
                break;
            }
        }
        assert!(partial, "the socket never took a frame in part");
        assert!(!lane.lock().armed);
        // The connection is woken for the tail, and writes it before its own message.
        tokio::time::timeout(Duration::from_secs(5), lane.woken())
            .await
            .unwrap();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(Ok(message)) = client.next().await {
                if message.is_close() {
                    break;
                }
                got.push(text_of(message));
            }
            got
        });
        server.send(own(Codec::Protobuf, "last")).await.unwrap();
        assert!(lane.lock().pending.is_empty());
        server.close(None).await.unwrap();
        drop(server);
        assert!(lane.lock().fd.is_none(), "a dropped stream closes the lane");
        lane.arm(|| true);
        assert_eq!(lane.send(&delta("gone", "s"), || true), Sent::Queue);
        let got = reading.await.unwrap();
        let mut want: Vec<String> = sent
            .iter()
            .map(|t| format!(r#"{{"text":"{t}"}}"#))
            .collect();
        want.push(r#"{"text":"last"}"#.to_owned());
        assert_eq!(got.len(), want.len());
        assert!(got == want, "frames arrived torn or out of order");
    }
}
