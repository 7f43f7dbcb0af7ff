//! The relay service (issue 21, part R): two `agent-host-relay` processes (the real binary) on
//! one `nats-server -js` (Debian's, installed when missing), and fake endpoints written here —
//! a "host" and a "bot" WebSocket client speaking `RelayFrame` with opaque bytes where the real
//! ones put Noise messages. Every wait is bounded and waits on an event; the one sleep is the
//! scenario of a host that stays away for two seconds.
//!
//! The payloads carry a canary string in clear (the fake endpoints seal nothing); the relays
//! run at `trace` for their own code, and their logs must never contain it (nor a token). The
//! check of the JetStream store for plaintext belongs to the end-to-end tests, whose payloads
//! are sealed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use agent_host::protocol::relay_wire::{self, Body, codes};
use agent_host::relayd::broker::Refresh;
use common::WAIT;
use common::nats::{NatsServer, ensure_nats_server};
use common::relay::Relay;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const HOST_TOKEN: &str = "relay-service-host-token-3c1d";
const BOT_TOKEN: &str = "relay-service-bot-token-8e2a";
/// Inside every fake payload; must never reach a relay's log.
const CANARY: &str = "CANARY-plaintext-5b7e19";

/// A relay instance with this file's tokens.
async fn relay(nats: &NatsServer, instance: &str, dir: &Path) -> Relay {
    Relay::start(nats, instance, dir, HOST_TOKEN, BOT_TOKEN).await
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A relay's log names what happened but holds no payload and no token.
fn assert_clean_log(log: &Path) {
    let text = read(log);
    assert!(!text.is_empty(), "{} is empty", log.display());
    for secret in [CANARY, HOST_TOKEN, BOT_TOKEN] {
        assert!(
            !text.contains(secret),
            "{} contains {secret:?}:\n{text}",
            log.display()
        );
    }
}

fn random_hex(len: usize) -> String {
    let mut hex = uuid::Uuid::new_v4().simple().to_string();
    hex.push_str(&uuid::Uuid::new_v4().simple().to_string());
    hex.truncate(len);
    hex
}

fn host_id() -> String {
    random_hex(relay_wire::HOST_ID_LEN)
}

fn channel_id() -> String {
    random_hex(relay_wire::CHANNEL_LEN)
}

/// An opaque payload with the canary and a counter.
fn payload(counter: u64) -> Vec<u8> {
    format!("{CANARY}#{counter}").into_bytes()
}

fn counter_of(bytes: &[u8]) -> u64 {
    let text = std::str::from_utf8(bytes).unwrap();
    text.rsplit_once('#').unwrap().1.parse().unwrap()
}

fn sealed(channel: &str, counter: u64) -> Body {
    Body::Sealed(relay_wire::Sealed {
        channel: channel.to_owned(),
        nonce: counter,
        ciphertext: payload(counter),
    })
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A fake endpoint's WebSocket.
struct Peer {
    ws: Ws,
}

async fn dial(relay: &Relay, path: &str, token: &str) -> Result<Peer, WsError> {
    let mut request = format!("{}{path}", relay.url)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("the upgrade answers in time")?;
    Ok(Peer { ws })
}

impl Peer {
    /// A host on `relay`, past its `Welcome`.
    async fn host(relay: &Relay, host_id: &str) -> Peer {
        let mut peer = dial(relay, "/host", HOST_TOKEN).await.unwrap();
        peer.send(Body::HostHello(relay_wire::HostHello {
            host_id: host_id.to_owned(),
        }))
        .await;
        match peer.recv().await {
            Body::Welcome(_) => peer,
            other => panic!("expected Welcome, got {other:?}"),
        }
    }

    /// A bot on `relay` for `host_id`, resuming `channels`: the peer and its `Welcome`.
    async fn bot(relay: &Relay, host_id: &str, channels: &[&str]) -> (Peer, relay_wire::Welcome) {
        let mut peer = dial(relay, "/bot", BOT_TOKEN).await.unwrap();
        peer.send(Body::BotHello(relay_wire::BotHello {
            host_id: host_id.to_owned(),
            channels: channels.iter().map(|c| (*c).to_owned()).collect(),
        }))
        .await;
        match peer.recv().await {
            Body::Welcome(welcome) => (peer, welcome),
            other => panic!("expected Welcome, got {other:?}"),
        }
    }

    async fn send(&mut self, body: Body) {
        self.ws
            .send(Message::Binary(relay_wire::encode(body)))
            .await
            .unwrap();
    }

    async fn send_raw(&mut self, bytes: Vec<u8>) {
        self.ws.send(Message::Binary(bytes.into())).await.unwrap();
    }

    /// The next frame, or `None` when the connection ended; bounded by [`WAIT`].
    async fn next(&mut self) -> Option<Body> {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame or the end comes in time");
            match message {
                Some(Ok(Message::Binary(bytes))) => {
                    return Some(relay_wire::decode(&bytes).unwrap());
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                Some(Ok(other)) => panic!("unexpected message {other:?}"),
            }
        }
    }

    async fn recv(&mut self) -> Body {
        self.next().await.expect("the connection is still open")
    }

    /// Wait until the relay has closed the connection (frames before the end are returned).
    async fn until_closed(&mut self) -> Vec<Body> {
        let mut frames = Vec::new();
        while let Some(body) = self.next().await {
            frames.push(body);
        }
        frames
    }

    /// Close from this side and wait until the relay has finished its side of it.
    async fn close(mut self) {
        self.ws.close(None).await.unwrap();
        let _rest = self.until_closed().await;
    }
}

/// Counters of sealed frames on `channel` as the endpoint's nonce rule sees them: each must be
/// the next one or a duplicate of an earlier one. Collects until `last` has arrived.
async fn sealed_until(peer: &mut Peer, channel: &str, seen: &mut Vec<u64>, last: u64) {
    while seen.last().is_none_or(|&max| max < last) {
        match peer.recv().await {
            Body::Sealed(s) => {
                assert_eq!(s.channel, channel);
                accept_in_order(seen, counter_of(&s.ciphertext));
            }
            other => panic!("expected Sealed, got {other:?}"),
        }
    }
}

/// Record `counter`: the next one in order, or a duplicate (dropped). A gap fails the test.
fn accept_in_order(seen: &mut Vec<u64>, counter: u64) {
    let expected = seen.last().map_or(0, |max| max + 1);
    assert!(
        counter <= expected,
        "frame {counter} came before {expected}: a gap (so far {seen:?})"
    );
    if counter == expected {
        seen.push(counter);
    }
}

/// A bot opens `channel` and the host accepts: both see the other's frame unchanged.
async fn handshake(bot: &mut Peer, host: &mut Peer, channel: &str) {
    let open = relay_wire::Open {
        channel: channel.to_owned(),
        kind: relay_wire::OPEN_KIND_CONNECT,
        secret_id: String::new(),
        message: payload(1_000_000),
    };
    bot.send(Body::Open(open.clone())).await;
    assert_eq!(host.recv().await, Body::Open(open));
    let accept = relay_wire::Accept {
        channel: channel.to_owned(),
        message: payload(2_000_000),
    };
    host.send(Body::Accept(accept.clone())).await;
    assert_eq!(bot.recv().await, Body::Accept(accept));
}

struct Fleet {
    nats: NatsServer,
    a: Relay,
    b: Relay,
    dir: tempfile::TempDir,
}

async fn fleet() -> Fleet {
    let nats = tokio::task::spawn_blocking(ensure_nats_server)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = relay(&nats, "relay-a", dir.path()).await;
    let b = relay(&nats, "relay-b", dir.path()).await;
    Fleet { nats, a, b, dir }
}

impl Fleet {
    /// Stop both relays cleanly and check their logs.
    async fn finish(self) {
        let logs = [self.a.log.clone(), self.b.log.clone()];
        self.a.stop().await;
        self.b.stop().await;
        for log in &logs {
            assert_clean_log(log);
        }
        drop(self.nats);
        drop(self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_on_one_instance_reaches_a_host_on_another() {
    let fleet = fleet().await;
    let host_id = host_id();
    let channel = channel_id();
    let mut host = Peer::host(&fleet.b, &host_id).await;
    let (mut bot, welcome) = Peer::bot(&fleet.a, &host_id, &[]).await;
    assert_eq!(welcome.instance, "relay-a");
    assert!(welcome.host_online);
    handshake(&mut bot, &mut host, &channel).await;
    for counter in 0..50 {
        host.send(sealed(&channel, counter)).await;
    }
    let mut seen = Vec::new();
    sealed_until(&mut bot, &channel, &mut seen, 49).await;
    assert_eq!(seen, (0..50).collect::<Vec<_>>());
    for counter in 0..20 {
        bot.send(sealed(&channel, counter)).await;
    }
    let mut seen = Vec::new();
    sealed_until(&mut host, &channel, &mut seen, 19).await;
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    let closed = relay_wire::Closed {
        channel: channel.clone(),
        reason: "done".into(),
    };
    host.send(Body::Closed(closed.clone())).await;
    assert_eq!(bot.recv().await, Body::Closed(closed));
    // Pings: a plain one is answered by the instance.
    bot.send(Body::Ping(relay_wire::Ping {
        id: 5,
        loop_back: false,
    }))
    .await;
    assert_eq!(bot.recv().await, Body::Pong(relay_wire::Pong { id: 5 }));
    bot.close().await;
    host.close().await;
    fleet.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_back_ping_returns_through_nats() {
    let fleet = fleet().await;
    let host_id = host_id();
    let nats = async_nats::connect(&fleet.nats.url).await.unwrap();
    let mut subject = nats.subscribe(format!("ah.h.{host_id}")).await.unwrap();
    nats.flush().await.unwrap();
    let mut host = Peer::host(&fleet.a, &host_id).await;
    host.send(Body::Ping(relay_wire::Ping {
        id: 42,
        loop_back: true,
    }))
    .await;
    let passed = tokio::time::timeout(WAIT, subject.next())
        .await
        .expect("the ping is published in time")
        .unwrap();
    assert_eq!(
        relay_wire::decode(&passed.payload).unwrap(),
        Body::Ping(relay_wire::Ping {
            id: 42,
            loop_back: true
        })
    );
    assert_eq!(host.recv().await, Body::Pong(relay_wire::Pong { id: 42 }));
    host.send(Body::Ping(relay_wire::Ping {
        id: 43,
        loop_back: false,
    }))
    .await;
    assert_eq!(host.recv().await, Body::Pong(relay_wire::Pong { id: 43 }));
    host.close().await;
    fleet.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_says_whether_the_host_is_online() {
    let fleet = fleet().await;
    let host_id = host_id();
    let (bot, welcome) = Peer::bot(&fleet.a, &host_id, &[]).await;
    assert!(!welcome.host_online, "no host yet");
    bot.close().await;
    let host = Peer::host(&fleet.b, &host_id).await;
    let (bot, welcome) = Peer::bot(&fleet.a, &host_id, &[]).await;
    assert!(welcome.host_online, "the host is on the other instance");
    bot.close().await;
    // The relay deletes the key before it closes its side, so once the close is done the
    // host is offline for everyone.
    host.close().await;
    let (bot, welcome) = Peer::bot(&fleet.a, &host_id, &[]).await;
    assert!(!welcome.host_online, "the host closed");
    bot.close().await;
    // A host that goes with its instance's clean stop is offline too.
    let host = Peer::host(&fleet.b, &host_id).await;
    let Fleet { nats, a, b, dir } = fleet;
    let b_log = b.log.clone();
    b.stop().await;
    let mut host = host;
    let last = host.until_closed().await;
    assert!(
        matches!(last.as_slice(), [Body::Error(e)] if e.code == codes::SHUTTING_DOWN),
        "{last:?}"
    );
    let (bot, welcome) = Peer::bot(&a, &host_id, &[]).await;
    assert!(!welcome.host_online, "the host's instance stopped");
    bot.close().await;
    let a_log = a.log.clone();
    a.stop().await;
    assert_clean_log(&a_log);
    assert_clean_log(&b_log);
    drop((nats, dir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_get_401_before_any_frame() {
    let fleet = fleet().await;
    for (path, token) in [
        ("/host", "wrong"),
        ("/host", BOT_TOKEN),
        ("/bot", "wrong"),
        ("/bot", HOST_TOKEN),
        ("/bot", ""),
    ] {
        match dial(&fleet.a, path, token).await {
            Err(WsError::Http(response)) => {
                assert_eq!(response.status(), 401, "{path} with {token:?}");
            }
            Err(e) => panic!("{path}: {e}"),
            Ok(_) => panic!("{path} accepted {token:?}"),
        }
    }
    // No Authorization header at all.
    let request = format!("{}/host", fleet.a.url)
        .into_client_request()
        .unwrap();
    match tokio_tungstenite::connect_async(request).await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), 401),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert_eq!(http_get(fleet.a.addr(), "/healthz").await.0, 200);
    assert_eq!(http_get(fleet.b.addr(), "/healthz").await.0, 200);
    assert_eq!(http_get(fleet.a.addr(), "/other").await.0, 404);
    fleet.finish().await;
}

/// One plain HTTP GET: the status and the body.
async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{response}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_first_frame_gets_an_error_and_the_close() {
    let fleet = fleet().await;
    let error_then_close = |frames: Vec<Body>| match frames.as_slice() {
        [Body::Error(e)] => e.code.clone(),
        other => panic!("expected one Error then the close, got {other:?}"),
    };
    // A host that says BotHello.
    let mut host = dial(&fleet.a, "/host", HOST_TOKEN).await.unwrap();
    host.send(Body::BotHello(relay_wire::BotHello {
        host_id: host_id(),
        channels: vec![],
    }))
    .await;
    assert_eq!(
        error_then_close(host.until_closed().await),
        codes::BAD_HELLO
    );
    // A host id that is not one (it would end up in a NATS subject).
    let mut host = dial(&fleet.a, "/host", HOST_TOKEN).await.unwrap();
    host.send(Body::HostHello(relay_wire::HostHello {
        host_id: "ah.h.>".into(),
    }))
    .await;
    assert_eq!(
        error_then_close(host.until_closed().await),
        codes::BAD_HELLO
    );
    // A bot whose first frame is not a frame at all.
    let mut bot = dial(&fleet.b, "/bot", BOT_TOKEN).await.unwrap();
    bot.send_raw(vec![0xff, 0xff, 0xff]).await;
    assert_eq!(error_then_close(bot.until_closed().await), codes::BAD_HELLO);
    // A bot that starts with Sealed.
    let mut bot = dial(&fleet.b, "/bot", BOT_TOKEN).await.unwrap();
    bot.send(sealed(&channel_id(), 0)).await;
    assert_eq!(error_then_close(bot.until_closed().await), codes::BAD_HELLO);
    // After a good hello, a kind the host may not send.
    let mut host = Peer::host(&fleet.a, &host_id()).await;
    host.send(Body::Open(relay_wire::Open {
        channel: channel_id(),
        ..Default::default()
    }))
    .await;
    assert_eq!(
        error_then_close(host.until_closed().await),
        codes::BAD_FRAME
    );
    // A bad channel id from a bot.
    let (mut bot, _) = Peer::bot(&fleet.b, &host_id(), &[]).await;
    bot.send(sealed("not-a-channel", 0)).await;
    assert_eq!(error_then_close(bot.until_closed().await), codes::BAD_FRAME);
    // A message over the limit.
    let (mut bot, _) = Peer::bot(&fleet.b, &host_id(), &[]).await;
    bot.send_raw(vec![0; relay_wire::MAX_RELAY_FRAME_BYTES + 1])
        .await;
    assert_eq!(error_then_close(bot.until_closed().await), codes::TOO_LARGE);
    fleet.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_loses_no_frame() {
    let mut fleet = fleet().await;
    let host_id = host_id();
    let channel = channel_id();
    let mut host = Peer::host(&fleet.b, &host_id).await;
    let (mut bot, _) = Peer::bot(&fleet.a, &host_id, &[]).await;
    handshake(&mut bot, &mut host, &channel).await;
    for counter in 0..30 {
        host.send(sealed(&channel, counter)).await;
    }
    let mut seen = Vec::new();
    sealed_until(&mut bot, &channel, &mut seen, 9).await;
    fleet.a.kill().await;
    // What instance A had written before it died may still be in the socket.
    for body in bot.until_closed().await {
        match body {
            Body::Sealed(s) => accept_in_order(&mut seen, counter_of(&s.ciphertext)),
            other => panic!("expected Sealed, got {other:?}"),
        }
    }
    // The host goes on while the bot is away.
    for counter in 30..60 {
        host.send(sealed(&channel, counter)).await;
    }
    let (mut bot, welcome) = Peer::bot(&fleet.b, &host_id, &[&channel]).await;
    assert_eq!(welcome.instance, "relay-b");
    assert!(welcome.host_online);
    sealed_until(&mut bot, &channel, &mut seen, 59).await;
    assert_eq!(seen, (0..60).collect::<Vec<_>>());
    // And the other way on the new instance.
    bot.send(sealed(&channel, 0)).await;
    let mut back = Vec::new();
    sealed_until(&mut host, &channel, &mut back, 0).await;
    bot.close().await;
    host.close().await;
    let a_log = fleet.a.log.clone();
    let Fleet { nats, a, b, dir } = fleet;
    drop(a);
    let b_log = b.log.clone();
    b.stop().await;
    assert_clean_log(&a_log);
    assert_clean_log(&b_log);
    drop((nats, dir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_away_for_two_seconds_gets_what_was_sent_meanwhile() {
    let fleet = fleet().await;
    let host_id = host_id();
    let channel = channel_id();
    let mut host = Peer::host(&fleet.a, &host_id).await;
    let (mut bot, _) = Peer::bot(&fleet.b, &host_id, &[]).await;
    handshake(&mut bot, &mut host, &channel).await;
    host.close().await;
    for counter in 0..10 {
        bot.send(sealed(&channel, counter)).await;
    }
    // The scenario itself: the host stays away a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Back, through the other instance this time.
    let mut host = Peer::host(&fleet.b, &host_id).await;
    let mut seen = Vec::new();
    sealed_until(&mut host, &channel, &mut seen, 9).await;
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    bot.close().await;
    host.close().await;
    fleet.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_connection_wins() {
    let fleet = fleet().await;
    let host_id = host_id();
    let channel = channel_id();
    let mut old_host = Peer::host(&fleet.a, &host_id).await;
    let (mut old_bot, _) = Peer::bot(&fleet.a, &host_id, &[]).await;
    handshake(&mut old_bot, &mut old_host, &channel).await;
    // The same host id on the other instance: the older connection is told and closed.
    let mut host = Peer::host(&fleet.b, &host_id).await;
    let superseded = |frames: Vec<Body>| {
        assert!(
            matches!(frames.as_slice(), [Body::Error(e)] if e.code == codes::SUPERSEDED),
            "{frames:?}"
        );
    };
    superseded(old_host.until_closed().await);
    // The same channel resumed on the other instance.
    let (mut bot, welcome) = Peer::bot(&fleet.b, &host_id, &[&channel]).await;
    assert!(welcome.host_online);
    superseded(old_bot.until_closed().await);
    host.send(sealed(&channel, 0)).await;
    let mut seen = Vec::new();
    sealed_until(&mut bot, &channel, &mut seen, 0).await;
    bot.send(sealed(&channel, 0)).await;
    let mut seen = Vec::new();
    sealed_until(&mut host, &channel, &mut seen, 0).await;
    bot.close().await;
    host.close().await;
    fleet.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_claims_are_compare_and_set() {
    let nats = tokio::task::spawn_blocking(ensure_nats_server)
        .await
        .unwrap();
    let broker = agent_host::relayd::Broker::connect(&nats.url, "test")
        .await
        .unwrap();
    let host_id = host_id();
    assert!(!broker.host_online(&host_id).await.unwrap());
    let first = broker.claim(&host_id, "relay-a").await.unwrap();
    let Refresh::Held(first) = broker.refresh(&host_id, "relay-a", first).await.unwrap() else {
        panic!("a refresh of the latest claim holds");
    };
    // A newer connection claims the host: the older one's refresh and release fail.
    let second = broker.claim(&host_id, "relay-b").await.unwrap();
    assert_eq!(
        broker.refresh(&host_id, "relay-a", first).await.unwrap(),
        Refresh::Superseded
    );
    assert!(broker.release(&host_id, first).await.is_err());
    assert!(broker.host_online(&host_id).await.unwrap());
    broker.release(&host_id, second).await.unwrap();
    assert!(!broker.host_online(&host_id).await.unwrap());
    // A second instance finds the streams and the bucket as they are.
    agent_host::relayd::Broker::connect(&nats.url, "again")
        .await
        .unwrap();
}
