//! The host's side of the sealed relay fleet (issue 21, part H): a real host (the real
//! `agent_host::run`, its `config.toml` naming `[fleet]`), one real `agent-host-relay` on a
//! real `nats-server -js`, and a minimal bot written here from `agent_host::seal` and the
//! relay frames over a WebSocket client — no shared bot library, so what the host does is
//! checked against the contract, not against another implementation of it.
//!
//! What it proves: the host connects and its loop-back probe round-trips through NATS
//! (`host.status` `fleet`); a bot pairs with a code from `pair.create` (whose `relay_urls` are
//! the fleet's `/bot`), sends `Hello` and gets `HelloResp` for `bot-<bot_id>`, calls
//! `session.list` through the sealed channel; a paired bot connects again (`Noise_IK`), an
//! unknown key is refused; a revoked bot's channels are closed within a second; `[fleet]` is
//! checked and reloaded; a relay whose loop-back probe never returns is left (`degraded`) for
//! the next URL; and a channel outlives the instance the host was on.
//!
//! Every wait is bounded and waits on an event (a frame, a status change, a line); nothing
//! sleeps to let time pass.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use agent_host::config::Config;
use agent_host::protocol::relay_wire::{self, Body};
use agent_host::protocol::wire::{self, CmdId, pb};
use agent_host::relay::fleet::FleetState;
use agent_host::seal::{BotHandshake, BotKey, Channel, HandshakeKind, PairingCode, SealedFrame};
use common::nats::{NatsServer, ensure_nats_server};
use common::relay::Relay;
use common::{TestHost, WAIT};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const HOST_TOKEN: &str = "fleet-host-token-71c2";
const BOT_TOKEN: &str = "fleet-bot-token-0d9e";

/// A relay instance with this file's tokens.
async fn relay(nats: &NatsServer, instance: &str, dir: &Path) -> Relay {
    Relay::start(nats, instance, dir, HOST_TOKEN, BOT_TOKEN).await
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A host in this process, started from its home's `config.toml` (with its fleet handle).
async fn host(home: &Path) -> TestHost {
    TestHost::start_config(Config::with_home(home).unwrap()).await
}

/// What these tests ask of a host's fleet client.
trait FleetWait {
    async fn fleet_reaches(&self, state: FleetState, relay: Option<&Relay>);
}

impl FleetWait for TestHost {
    /// Wait for the fleet client to reach `state` (on its status watch, bounded); the relay's
    /// log, if there is one, goes with a failure.
    async fn fleet_reaches(&self, state: FleetState, relay: Option<&Relay>) {
        let mut status = self.fleet.watch_status();
        tokio::time::timeout(WAIT, status.wait_for(|s| s.state == state))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "fleet not {state:?}: {:?}\nrelay log:\n{}",
                    self.fleet.status(),
                    relay.map(|r| read(&r.log)).unwrap_or_default()
                )
            })
            .unwrap();
    }
}

/// The minimal bot: one connection to the relay's `/bot`, frames in and out.
struct Bot {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Bot {
    async fn connect(url: &str, host_id: &str) -> (Bot, relay_wire::Welcome) {
        let mut request = url.into_client_request().unwrap();
        request.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {BOT_TOKEN}")).unwrap(),
        );
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .unwrap()
            .unwrap();
        let mut bot = Bot { ws };
        bot.send(Body::BotHello(relay_wire::BotHello {
            host_id: host_id.to_owned(),
            channels: Vec::new(),
        }))
        .await;
        match bot.recv().await {
            Body::Welcome(welcome) => (bot, welcome),
            other => panic!("{other:?}"),
        }
    }

    async fn send(&mut self, body: Body) {
        self.ws
            .send(Message::Binary(relay_wire::encode(body)))
            .await
            .unwrap();
    }

    async fn recv(&mut self) -> Body {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame from the relay in time")
                .expect("the relay keeps the connection")
                .unwrap();
            if let Message::Binary(bytes) = message {
                return relay_wire::decode(&bytes).unwrap();
            }
        }
    }

    /// Handshake message 1 on `channel`: the answer (`Accept`'s message 2 or `Closed`'s reason).
    async fn open(
        &mut self,
        channel: &str,
        kind: HandshakeKind,
        secret_id: &str,
        message: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        self.send(Body::Open(relay_wire::Open {
            channel: channel.to_owned(),
            kind: kind.wire(),
            secret_id: secret_id.to_owned(),
            message,
        }))
        .await;
        match self.recv().await {
            Body::Accept(accept) if accept.channel == channel => Ok(accept.message),
            Body::Closed(closed) if closed.channel == channel => Err(closed.reason),
            other => panic!("{other:?}"),
        }
    }

    /// Seal one inner wire frame onto `channel`.
    async fn seal(&mut self, noise: &mut Channel, channel: &str, inner: &[u8]) {
        for frame in noise.seal(inner).unwrap() {
            self.send(Body::Sealed(relay_wire::Sealed {
                channel: channel.to_owned(),
                nonce: frame.nonce,
                ciphertext: frame.ciphertext,
            }))
            .await;
        }
    }

    /// The next whole inner message of `channel`.
    async fn open_inner(&mut self, noise: &mut Channel, channel: &str) -> wire::Decoded {
        loop {
            match self.recv().await {
                Body::Sealed(sealed) if sealed.channel == channel => {
                    let frame = SealedFrame {
                        nonce: sealed.nonce,
                        ciphertext: sealed.ciphertext,
                    };
                    if let Some(inner) = noise.open(&frame).unwrap() {
                        return wire::decode(&inner).unwrap();
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// The next inner message of `channel` that is not an event (replay, live pushes).
    async fn answer(&mut self, noise: &mut Channel, channel: &str) -> wire::Decoded {
        loop {
            let frame = self.open_inner(noise, channel).await;
            if frame.cmd != CmdId::EventPush {
                return frame;
            }
        }
    }

    /// One command through the sealed channel: its reply.
    async fn request(
        &mut self,
        noise: &mut Channel,
        channel: &str,
        id: u64,
        command: &str,
        params: Value,
    ) -> pb::Reply {
        let request = pb::Request {
            command: command.to_owned(),
            params_json: params.to_string(),
        };
        let bytes = wire::encode(CmdId::Request, id, &request);
        self.seal(noise, channel, &bytes).await;
        let frame = self.answer(noise, channel).await;
        assert_eq!(frame.cmd, CmdId::Reply, "{:?}", frame.cmd);
        assert_eq!(frame.request_id, id);
        frame.body::<pb::Reply>().unwrap()
    }

    /// `Hello` on a fresh channel: its `HelloResp`.
    async fn hello(&mut self, noise: &mut Channel, channel: &str) -> pb::HelloResp {
        let hello = pb::Hello {
            client_name: "fleet-host-test".to_owned(),
            cursor: None,
            protocol_version: 1,
        };
        let bytes = wire::encode(CmdId::Hello, 1, &hello);
        self.seal(noise, channel, &bytes).await;
        let frame = self.answer(noise, channel).await;
        assert_eq!(frame.cmd, CmdId::HelloResp, "{:?}", frame.cmd);
        frame.body::<pb::HelloResp>().unwrap()
    }
}

fn channel_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bot_pairs_connects_and_is_cut_off_when_revoked() {
    let nats = ensure_nats_server();
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&nats, "relay-h", dir.path()).await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[fleet]\nurls = [\"{}/host\"]\ntoken = \"{HOST_TOKEN}\"\n\
             [fleet.timing]\nprobe_interval_ms = 200\n",
            relay.url
        ),
    )
    .unwrap();
    let host = host(&home).await;

    // 1. Connected, with a round trip through NATS, as host.status shows it.
    host.fleet_reaches(FleetState::Connected, Some(&relay))
        .await;
    let status = host.ok("host.status", json!({})).await;
    let fleet = &status["fleet"];
    assert_eq!(fleet["state"], "connected", "{status}");
    assert_eq!(fleet["url"], format!("{}/host", relay.url));
    assert_eq!(fleet["instance"], "relay-h");
    assert!(fleet["round_trip_ms"].as_u64().is_some(), "{fleet}");
    assert!(fleet["last_round_trip_at_ms"].as_i64().is_some(), "{fleet}");
    assert_eq!(fleet["channels"], 0);
    assert!(!fleet.to_string().contains(HOST_TOKEN));
    let host_id = fleet["host_id"].as_str().unwrap().to_owned();

    // 2. A code names the fleet's /bot.
    let scope = json!({"prompt": false, "permissions": false, "create_sessions": false});
    let made = host
        .ok("pair.create", json!({"name": "ci-bot", "scope": scope}))
        .await;
    assert_eq!(made["relay_urls"], json!([format!("{}/bot", relay.url)]));
    let code = PairingCode::decode(made["code"].as_str().unwrap()).unwrap();
    assert_eq!(code.host_id, host_id);

    // 3. Pair through the relay.
    let (mut bot, welcome) = Bot::connect(&code.relay_urls[0], &code.host_id).await;
    assert!(welcome.host_online);
    let key = BotKey::generate().unwrap();
    let paired_channel = channel_id();
    let (half, m1) = BotHandshake::start(
        HandshakeKind::Pair,
        &key,
        &code.host_public,
        Some(&code.secret),
        "ci-bot",
    )
    .unwrap();
    let m2 = bot
        .open(&paired_channel, HandshakeKind::Pair, &code.secret_id, m1)
        .await
        .expect("the pairing is accepted");
    let (mut paired, accepted) = half.finish(&m2).unwrap();
    assert_eq!(accepted.bot_id, key.bot_id());
    assert!(!accepted.scope.prompt && !accepted.scope.create_sessions);
    // The same code again: refused (single use).
    let again_key = BotKey::generate().unwrap();
    let (_, m1) = BotHandshake::start(
        HandshakeKind::Pair,
        &again_key,
        &code.host_public,
        Some(&code.secret),
        "other",
    )
    .unwrap();
    assert_eq!(
        bot.open(&channel_id(), HandshakeKind::Pair, &code.secret_id, m1)
            .await,
        Err("pairing_refused".to_owned())
    );

    // 4. Hello, HelloResp for the bot's own subscriber, and a request through the seal.
    let resp = bot.hello(&mut paired, &paired_channel).await;
    assert_eq!(resp.subscriber_id, format!("bot-{}", key.bot_id()));
    let listed = bot
        .request(&mut paired, &paired_channel, 2, "session.list", json!({}))
        .await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let data: Value = serde_json::from_str(&listed.data_json).unwrap();
    assert!(data["sessions"].is_array(), "{data}");
    // The scope it paired with holds: no session may be created.
    let refused = bot
        .request(
            &mut paired,
            &paired_channel,
            3,
            "session.create",
            json!({"agent_type": "claude", "cwd": "/tmp"}),
        )
        .await;
    assert_eq!(refused.code, 1015, "{refused:?}");

    // 5. A paired bot connects again on a second channel (Noise_IK); a stranger cannot.
    let connected_channel = channel_id();
    let (half, m1) = BotHandshake::start(
        HandshakeKind::Connect,
        &key,
        &code.host_public,
        None,
        "ci-bot",
    )
    .unwrap();
    let m2 = bot
        .open(&connected_channel, HandshakeKind::Connect, "", m1)
        .await
        .expect("a paired bot connects");
    let (mut connected, _) = half.finish(&m2).unwrap();
    bot.hello(&mut connected, &connected_channel).await;
    let stranger = BotKey::generate().unwrap();
    let (_, m1) = BotHandshake::start(
        HandshakeKind::Connect,
        &stranger,
        &code.host_public,
        None,
        "x",
    )
    .unwrap();
    assert_eq!(
        bot.open(&channel_id(), HandshakeKind::Connect, "", m1)
            .await,
        Err("unknown_bot".to_owned())
    );
    // Garbage as message 1 is refused, and the host carries on.
    assert_eq!(
        bot.open(&channel_id(), HandshakeKind::Connect, "", vec![1, 2, 3])
            .await,
        Err("bad_handshake".to_owned())
    );
    let listed = bot
        .request(
            &mut connected,
            &connected_channel,
            2,
            "session.list",
            json!({}),
        )
        .await;
    assert_eq!(listed.code, 0);
    let bots = host.ok("pair.list", json!({})).await;
    assert_eq!(bots["bots"][0]["connected"], true, "{bots}");
    assert_eq!(host.fleet.status().channels, 2);

    // 6. Revoked: both channels are closed within a second.
    let asked = Instant::now();
    host.ok("pair.revoke", json!({"bot": key.bot_id()})).await;
    let mut closed = Vec::new();
    while closed.len() < 2 {
        match bot.recv().await {
            Body::Closed(c) => {
                assert_eq!(c.reason, "revoked");
                closed.push(c.channel);
            }
            // Events in flight on the channels before the close.
            Body::Sealed(_) => {}
            other => panic!("{other:?}"),
        }
    }
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(1), "revocation took {took:?}");
    closed.sort();
    let mut expected = vec![paired_channel.clone(), connected_channel.clone()];
    expected.sort();
    assert_eq!(closed, expected);
    // And it cannot come back.
    let (_, m1) = BotHandshake::start(
        HandshakeKind::Connect,
        &key,
        &code.host_public,
        None,
        "ci-bot",
    )
    .unwrap();
    assert_eq!(
        bot.open(&channel_id(), HandshakeKind::Connect, "", m1)
            .await,
        Err("revoked".to_owned())
    );
    // Frames for a closed channel get one `Closed{unknown_channel}`.
    bot.seal(&mut paired, &paired_channel, b"late").await;
    match bot.recv().await {
        Body::Closed(c) => {
            assert_eq!(c.channel, paired_channel);
            assert_eq!(c.reason, "unknown_channel");
        }
        other => panic!("{other:?}"),
    }
    let mut status = host.fleet.watch_status();
    tokio::time::timeout(WAIT, status.wait_for(|s| s.channels == 0))
        .await
        .unwrap()
        .unwrap();

    host.stop().await;
}

/// A bot paired with a list of sessions and the right to create: a session it creates is in
/// its scope on that channel at once, and stays in its stored scope, so a later channel (after
/// a reconnect, a host restart) still sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_a_bot_creates_stays_in_its_scope() {
    let nats = ensure_nats_server();
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&nats, "relay-h", dir.path()).await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[fleet]\nurls = [\"{}/host\"]\ntoken = \"{HOST_TOKEN}\"\n\
             [fleet.timing]\nprobe_interval_ms = 200\n",
            relay.url
        ),
    )
    .unwrap();
    let host = host(&home).await;
    host.fleet_reaches(FleetState::Connected, Some(&relay))
        .await;
    let scope = json!({"sessions": [], "prompt": true, "create_sessions": true});
    let made = host
        .ok("pair.create", json!({"name": "maker", "scope": scope}))
        .await;
    let code = PairingCode::decode(made["code"].as_str().unwrap()).unwrap();
    let (mut bot, _) = Bot::connect(&code.relay_urls[0], &code.host_id).await;
    let key = BotKey::generate().unwrap();
    let first = channel_id();
    let (half, m1) = BotHandshake::start(
        HandshakeKind::Pair,
        &key,
        &code.host_public,
        Some(&code.secret),
        "maker",
    )
    .unwrap();
    let m2 = bot
        .open(&first, HandshakeKind::Pair, &code.secret_id, m1)
        .await
        .expect("the pairing is accepted");
    let (mut paired, _) = half.finish(&m2).unwrap();
    bot.hello(&mut paired, &first).await;
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let created = bot
        .request(
            &mut paired,
            &first,
            2,
            "session.create",
            json!({"agent_type": "claude", "cwd": cwd}),
        )
        .await;
    assert_eq!(created.code, 0, "{created:?}");
    let session: Value = serde_json::from_str(&created.data_json).unwrap();
    let session_id = session["session_id"].as_str().unwrap().to_owned();
    let ids = |reply: &pb::Reply| -> Vec<String> {
        let data: Value = serde_json::from_str(&reply.data_json).unwrap();
        data["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let listed = bot
        .request(&mut paired, &first, 3, "session.list", json!({}))
        .await;
    assert_eq!(ids(&listed), std::slice::from_ref(&session_id));

    // The stored scope has it ...
    let bots = host.ok("pair.list", json!({})).await;
    assert_eq!(
        bots["bots"][0]["scope"]["sessions"],
        json!([session_id.clone()]),
        "{bots}"
    );
    // ... so a new channel of the same bot sees it too; a session made over IPC stays out.
    host.ok(
        "session.create",
        json!({"agent_type": "claude", "cwd": cwd}),
    )
    .await;
    let second = channel_id();
    let (half, m1) = BotHandshake::start(
        HandshakeKind::Connect,
        &key,
        &code.host_public,
        None,
        "maker",
    )
    .unwrap();
    let m2 = bot
        .open(&second, HandshakeKind::Connect, "", m1)
        .await
        .expect("a paired bot connects");
    let (mut connected, _) = half.finish(&m2).unwrap();
    bot.hello(&mut connected, &second).await;
    let listed = bot
        .request(&mut connected, &second, 2, "session.list", json!({}))
        .await;
    assert_eq!(ids(&listed), [session_id]);

    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_config_is_checked_and_reloaded() {
    let nats = ensure_nats_server();
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&nats, "relay-h", dir.path()).await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // Plain ws:// to a remote address: misconfigured, never dialed.
    std::fs::write(
        home.join("config.toml"),
        "[fleet]\nurls = [\"ws://relay.example/host\"]\ntoken = \"t\"\n",
    )
    .unwrap();
    let host = host(&home).await;
    host.fleet_reaches(FleetState::Misconfigured, None).await;
    let status = host.ok("host.status", json!({})).await;
    assert!(
        status["fleet"]["last_error"]
            .as_str()
            .unwrap()
            .contains("ws:// is allowed only to a loopback"),
        "{status}"
    );
    // A reload with a refused [fleet] changes nothing and says why.
    std::fs::write(
        home.join("config.toml"),
        "[fleet]\nurls = []\ntoken = \"t\"\n",
    )
    .unwrap();
    let refused = host.ipc("host.reload", json!({})).await;
    assert_ne!(refused.code, 0);
    assert!(refused.message.contains("[fleet]"), "{}", refused.message);
    // A good one re-points the client at once.
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[fleet]\nurls = [\"{}/host\"]\ntoken = \"{HOST_TOKEN}\"\n\
             [fleet.timing]\nprobe_interval_ms = 200\n",
            relay.url
        ),
    )
    .unwrap();
    // (The home is watched: the write itself may already have applied it, so the reply
    // need not name `fleet`; the client's state says it was.)
    host.ok("host.reload", json!({})).await;
    host.fleet_reaches(FleetState::Connected, Some(&relay))
        .await;
    // Removed: disabled.
    std::fs::write(home.join("config.toml"), "").unwrap();
    host.ok("host.reload", json!({})).await;
    host.fleet_reaches(FleetState::Disabled, None).await;
    host.stop().await;
}

/// A relay that says `Welcome` and then never routes anything: the loop-back probe never
/// comes back. The host calls the fleet `degraded` and moves on to the next URL, the real one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_whose_probe_never_returns_is_left_for_the_next() {
    let nats = ensure_nats_server();
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&nats, "relay-h", dir.path()).await;
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mute_url = format!("ws://{}/host", mute.local_addr().unwrap());
    let (welcomed_tx, welcomed) = oneshot::channel::<()>();
    let mute_task = tokio::spawn(async move {
        let (tcp, _) = mute.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let first = ws.next().await.unwrap().unwrap();
        let Message::Binary(bytes) = first else {
            panic!("{first:?}")
        };
        assert!(matches!(
            relay_wire::decode(&bytes).unwrap(),
            Body::HostHello(_)
        ));
        let welcome = Body::Welcome(relay_wire::Welcome {
            instance: "mute".to_owned(),
            host_online: true,
        });
        ws.send(Message::Binary(relay_wire::encode(welcome)))
            .await
            .unwrap();
        let _ = welcomed_tx.send(());
        // Read (and so answer WebSocket pings) but route nothing, until the host leaves.
        while let Some(Ok(_)) = ws.next().await {}
    });
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[fleet]\nurls = [\"{mute_url}\", \"{}/host\"]\ntoken = \"{HOST_TOKEN}\"\n\
             [fleet.timing]\nprobe_interval_ms = 100\ndegraded_after_ms = 600\n",
            relay.url
        ),
    )
    .unwrap();
    let host = host(&home).await;
    let mut status = host.fleet.watch_status();
    tokio::time::timeout(WAIT, welcomed).await.unwrap().unwrap();
    let degraded = tokio::time::timeout(WAIT, status.wait_for(|s| s.state == FleetState::Degraded))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert!(
        degraded
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("no loop-back pong")),
        "{degraded:?}"
    );
    host.fleet_reaches(FleetState::Connected, Some(&relay))
        .await;
    let now = host.fleet.status();
    assert_eq!(
        now.url.as_deref(),
        Some(format!("{}/host", relay.url).as_str())
    );
    assert_eq!(now.instance.as_deref(), Some("relay-h"));
    assert!(now.round_trip_ms.is_some());
    // Per relay: the mute one is degraded, with why, and never had a round trip; the real one
    // is connected with its own.
    let relays = serde_json::to_value(&now.relays).unwrap();
    assert_eq!(relays[0]["url"], mute_url, "{relays}");
    assert_eq!(relays[0]["state"], "degraded", "{relays}");
    assert!(relays[0]["last_round_trip_at_ms"].is_null(), "{relays}");
    assert!(
        relays[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no loop-back pong")),
        "{relays}"
    );
    assert_eq!(relays[1]["state"], "connected", "{relays}");
    assert!(relays[1]["round_trip_ms"].as_u64().is_some(), "{relays}");
    // host.status carries the same list (its round trips move on with every probe).
    let listed = host.ok("host.status", json!({})).await["fleet"]["relays"].clone();
    assert_eq!(listed[0]["state"], "degraded", "{listed}");
    assert_eq!(listed[1]["url"], format!("{}/host", relay.url), "{listed}");
    tokio::time::timeout(WAIT, mute_task)
        .await
        .unwrap()
        .unwrap();
    host.stop().await;
}

/// The host's instance dies: the host moves to the next URL, and a bot's channel — its Noise
/// state and link live in the host — carries on through the other instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_channel_outlives_the_instance_the_host_was_on() {
    let nats = ensure_nats_server();
    let dir = tempfile::tempdir().unwrap();
    let mut a = relay(&nats, "relay-a", dir.path()).await;
    let b = relay(&nats, "relay-b", dir.path()).await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[fleet]\nurls = [\"{}/host\", \"{}/host\"]\ntoken = \"{HOST_TOKEN}\"\n\
             bot_urls = [\"{}/bot\"]\n[fleet.timing]\nprobe_interval_ms = 200\n",
            a.url, b.url, b.url
        ),
    )
    .unwrap();
    let host = host(&home).await;
    host.fleet_reaches(FleetState::Connected, Some(&a)).await;
    assert_eq!(host.fleet.status().instance.as_deref(), Some("relay-a"));
    let made = host.ok("pair.create", json!({"name": "survivor"})).await;
    let code = PairingCode::decode(made["code"].as_str().unwrap()).unwrap();
    assert_eq!(code.relay_urls, [format!("{}/bot", b.url)]);
    // The bot is on b, the host on a: every frame crosses NATS.
    let (mut bot, _) = Bot::connect(&code.relay_urls[0], &code.host_id).await;
    let key = BotKey::generate().unwrap();
    let channel = channel_id();
    let (half, m1) = BotHandshake::start(
        HandshakeKind::Pair,
        &key,
        &code.host_public,
        Some(&code.secret),
        "survivor",
    )
    .unwrap();
    let m2 = bot
        .open(&channel, HandshakeKind::Pair, &code.secret_id, m1)
        .await
        .unwrap();
    let (mut noise, _) = half.finish(&m2).unwrap();
    bot.hello(&mut noise, &channel).await;
    let listed = bot
        .request(&mut noise, &channel, 2, "session.list", json!({}))
        .await;
    assert_eq!(listed.code, 0);

    // a dies; the host finds b.
    let mut status = host.fleet.watch_status();
    a.kill().await;
    tokio::time::timeout(
        WAIT,
        status.wait_for(|s| {
            s.state == FleetState::Connected && s.instance.as_deref() == Some("relay-b")
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("{:?}", host.fleet.status()))
    .unwrap();
    assert_eq!(host.fleet.status().channels, 1);
    // The same channel, the same Noise state: the next request is answered.
    let listed = bot
        .request(&mut noise, &channel, 3, "session.list", json!({}))
        .await;
    assert_eq!(listed.code, 0, "{listed:?}");
    host.stop().await;
}

/// The relay delivers at least once: an `Open` again on a live channel (the same message 1)
/// gets the same `Accept` and the channel goes on; an `Open` that does not read on a live
/// channel id is dropped without a `Closed`; a bot's 9th channel supersedes its oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_again_keeps_a_live_channel_and_a_bots_channels_are_capped() {
    let nats = ensure_nats_server();
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&nats, "relay-h", dir.path()).await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[fleet]\nurls = [\"{}/host\"]\ntoken = \"{HOST_TOKEN}\"\n\
             [fleet.timing]\nprobe_interval_ms = 200\n",
            relay.url
        ),
    )
    .unwrap();
    let host = host(&home).await;
    host.fleet_reaches(FleetState::Connected, Some(&relay))
        .await;
    let made = host
        .ok("pair.create", json!({"name": "again-bot", "scope": {}}))
        .await;
    let code = PairingCode::decode(made["code"].as_str().unwrap()).unwrap();
    let (mut bot, _) = Bot::connect(&code.relay_urls[0], &code.host_id).await;
    let key = BotKey::generate().unwrap();

    // The pairing Open, and the same Open again (the bot re-sends it after a relay drop):
    // the same Accept, not `pairing_refused`.
    let paired = channel_id();
    let (half, m1) = BotHandshake::start(
        HandshakeKind::Pair,
        &key,
        &code.host_public,
        Some(&code.secret),
        "again-bot",
    )
    .unwrap();
    let m2 = bot
        .open(&paired, HandshakeKind::Pair, &code.secret_id, m1.clone())
        .await
        .expect("the pairing is accepted");
    let again = bot
        .open(&paired, HandshakeKind::Pair, &code.secret_id, m1.clone())
        .await
        .expect("the pairing Open again gets its Accept again");
    assert_eq!(again, m2);
    let (mut noise, _) = half.finish(&m2).unwrap();
    bot.hello(&mut noise, &paired).await;
    let listed = bot
        .request(&mut noise, &paired, 2, "session.list", json!({}))
        .await;
    assert_eq!(listed.code, 0, "{listed:?}");

    // Again on the working channel: the same Accept, and the channel still serves.
    let again = bot
        .open(&paired, HandshakeKind::Pair, &code.secret_id, m1)
        .await
        .expect("the Accept again");
    assert_eq!(again, m2);
    let listed = bot
        .request(&mut noise, &paired, 3, "session.list", json!({}))
        .await;
    assert_eq!(listed.code, 0, "{listed:?}");

    // Garbage as an Open on the live channel id: no `Closed` (the next frame is the reply).
    bot.send(Body::Open(relay_wire::Open {
        channel: paired.clone(),
        kind: HandshakeKind::Connect.wire(),
        secret_id: String::new(),
        message: vec![1, 2, 3],
    }))
    .await;
    let listed = bot
        .request(&mut noise, &paired, 4, "session.list", json!({}))
        .await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert_eq!(host.fleet.status().channels, 1);

    // Seven more channels: eight in all, none closed.
    for _ in 0..7 {
        let (_, m1) = BotHandshake::start(
            HandshakeKind::Connect,
            &key,
            &code.host_public,
            None,
            "again-bot",
        )
        .unwrap();
        bot.open(&channel_id(), HandshakeKind::Connect, "", m1)
            .await
            .expect("a paired bot connects");
    }
    assert_eq!(host.fleet.status().channels, 8);
    // A ninth: it is accepted, and the oldest (the paired one) is superseded.
    let ninth = channel_id();
    let (half, m1) = BotHandshake::start(
        HandshakeKind::Connect,
        &key,
        &code.host_public,
        None,
        "again-bot",
    )
    .unwrap();
    bot.send(Body::Open(relay_wire::Open {
        channel: ninth.clone(),
        kind: HandshakeKind::Connect.wire(),
        secret_id: String::new(),
        message: m1,
    }))
    .await;
    let mut superseded = false;
    let mut accepted = None;
    while !superseded || accepted.is_none() {
        match bot.recv().await {
            Body::Closed(c) if c.channel == paired => {
                assert_eq!(c.reason, "superseded");
                superseded = true;
            }
            Body::Accept(a) if a.channel == ninth => accepted = Some(a.message),
            // Events on the paired channel before it closed.
            Body::Sealed(s) if s.channel == paired => {}
            other => panic!("{other:?}"),
        }
    }
    let (mut noise, _) = half.finish(&accepted.unwrap()).unwrap();
    bot.hello(&mut noise, &ninth).await;
    let listed = bot
        .request(&mut noise, &ninth, 2, "session.list", json!({}))
        .await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert_eq!(host.fleet.status().channels, 8);

    host.stop().await;
}
