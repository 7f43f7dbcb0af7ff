//! The remote relay (issue 7): the host dials out to the reference relay (`examples/relay.rs`,
//! its own process), and a bot connected to that relay drives the host — real sockets on
//! loopback throughout. The prompt tests run the real `claude` CLI against the project's mock
//! model in a loopback-only network namespace.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};

use agent_host::protocol::envelope::Reply;
use agent_host::protocol::wire::{CmdId, PROTOCOL_VERSION, pb};
use agent_host::relay::{RelayState, RelayStatus};
use agent_host::ws::client::{self, ClientError};
use common::world::{Family, Follower, TURN, World, in_netns, run_end};
use common::{TestHost, WAIT};
use serde_json::json;

const HOST_TOKEN: &str = "host-token-for-tests";
const BOT_TOKEN: &str = "bot-token-for-tests";

/// The reference relay, a separate process.
struct Relay {
    child: tokio::process::Child,
    /// `ws://127.0.0.1:PORT`
    url: String,
}

impl Relay {
    /// Start it on `listen` (`127.0.0.1:0` for any port).
    async fn start(listen: &str) -> Relay {
        let (child, url) = common::start_reference_relay(listen, HOST_TOKEN, BOT_TOKEN).await;
        Relay { child, url }
    }

    fn addr(&self) -> &str {
        self.url.trim_start_matches("ws://")
    }

    /// SIGKILL, and wait until it is gone.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// A bot connected to it: the same protocol as the host's loopback server.
    async fn bot(&self, cursor: Option<i64>) -> Follower {
        let hello = pb::Hello {
            client_name: "test-bot".into(),
            cursor,
            protocol_version: PROTOCOL_VERSION,
        };
        let (ws, resp) = client::connect(&format!("{}/bot", self.url), BOT_TOKEN, hello)
            .await
            .unwrap();
        Follower {
            ws,
            subscriber_id: resp.subscriber_id,
            seen: Vec::new(),
        }
    }
}

/// Fast timing so reconnects happen within a test's patience.
fn relay_params(url: &str, token: &str, scope: serde_json::Value) -> serde_json::Value {
    json!({
        "url": format!("{url}/host"),
        "token": token,
        "scope": scope,
        "timing": {
            "connect_timeout_ms": 500,
            "ping_interval_ms": 200,
            "dead_peer_ms": 1000,
            "backoff_min_ms": 20,
            "backoff_max_ms": 300,
            "stable_after_ms": 5000
        }
    })
}

/// The same, as `config.toml` (what a restarted host reads).
fn write_relay_config(home: &Path, url: &str) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[relay]\nurl = \"{url}/host\"\ntoken = \"{HOST_TOKEN}\"\n\
             [relay.timing]\nconnect_timeout_ms = 500\nping_interval_ms = 200\n\
             dead_peer_ms = 1000\nbackoff_min_ms = 20\nbackoff_max_ms = 300\n\
             stable_after_ms = 5000\n"
        ),
    )
    .unwrap();
}

/// Wait (on the status channel, no polling) until the relay status satisfies `pred`.
async fn relay_status(host: &TestHost, pred: impl Fn(&RelayStatus) -> bool) -> RelayStatus {
    let mut status = host.relay.watch_status();
    tokio::time::timeout(WAIT, status.wait_for(|s| pred(s)))
        .await
        .unwrap_or_else(|_| panic!("relay status never matched; last {:?}", host.relay.status()))
        .unwrap()
        .clone()
}

/// Ack everything the bot received (the relay acks the host only what its bots acked).
async fn ack_all(bot: &mut Follower) {
    if let Some(last) = bot.seen.iter().filter(|s| !s.delta).map(|s| s.seq).max() {
        bot.ws.ack(last).await.unwrap();
    }
}

/// The params of a keyed `session.send`.
fn prompt(session: &str, text: &str, key: &str) -> serde_json::Value {
    json!({"session_id": session, "text": text, "client_msg_id": key})
}

/// The run id of a `session.send` reply that succeeded, and whether it was a repeat of the
/// key.
fn run_id_of(reply: &Reply) -> (String, bool) {
    assert_eq!(reply.code, 0, "{}", reply.to_line());
    let run = reply.data["run_id"].as_str().unwrap().to_owned();
    (run, reply.data["duplicate"].as_bool().unwrap())
}

/// The ids of the sessions a `session.list` reply holds.
fn session_ids(listed: &serde_json::Value) -> Vec<String> {
    listed["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Brackets of a session as (sequence id, canonical JSON), from a follower.
fn brackets_of(f: &Follower, session: &str) -> Vec<(i64, String)> {
    f.seen
        .iter()
        .filter(|s| !s.delta && s.event["sessionId"] == session)
        .map(|s| (s.seq, s.event.to_string()))
        .collect()
}

/// Acceptance 1: a prompt from the bot side runs on the host (the real `claude`), and its
/// events reach the bot through the relay — the same brackets, with the same sequence ids and
/// the same canonical JSON, as a loopback subscriber gets.
#[test]
fn a_bot_prompt_runs_on_the_host_and_streams_back_through_the_relay() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_bot_prompt_runs_on_the_host_and_streams_back_through_the_relay",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let relay = Relay::start("127.0.0.1:0").await;
        let session = world.session().await;
        let mut local = world.follower(&session, true).await;
        world
            .host()
            .ok(
                "host.relay.set",
                relay_params(&relay.url, HOST_TOKEN, json!({})),
            )
            .await;
        let mut bot = relay.bot(None).await;
        // Answered once the host has dialed in (the relay holds it until then).
        let listed = bot.ok("session.list", json!({})).await;
        assert_eq!(session_ids(&listed), [session.as_str()]);
        let status = world.host().ok("host.status", json!({})).await;
        assert_eq!(status["relay"]["state"], "connected", "{status}");
        assert!(!status.to_string().contains(HOST_TOKEN), "the token shows");
        let subscribers = world.host().ok("subscriber.list", json!({})).await;
        assert!(
            subscribers.to_string().contains("\"relay\""),
            "{subscribers}"
        );

        let answer = bot
            .request(
                "session.send",
                prompt(&session, "hello through the relay", "bot-1"),
            )
            .await;
        let (run, duplicate) = run_id_of(&answer);
        assert!(!duplicate, "{}", answer.to_line());
        let end = run_end(&mut bot, &run, TURN).await;
        assert_eq!(end["state"], "completed");
        run_end(&mut local, &run, TURN).await;
        assert!(
            bot.seen.iter().any(|s| s.delta && s.kind() == "text.delta"),
            "no streaming deltas through the relay: {:?}",
            bot.kinds()
        );
        let through_relay = brackets_of(&bot, &session);
        assert_eq!(through_relay, brackets_of(&local, &session));
        assert!(
            through_relay
                .iter()
                .any(|(_, e)| e.contains("hello through the relay"))
        );
        world.host.unwrap().stop().await;
        relay.kill().await;
    });
}

/// Acceptance 2 and 3: the relay process is killed mid-stream and started again on the same
/// address. The host reconnects by itself (backoff, bounded waits only), and the bot, which
/// reconnects with its cursor, gets exactly the brackets it missed — no gap, no duplicate. The
/// same `client_msg_id` sent before, during and after the reconnect, and after a host
/// restart, is one run with one `run_id`.
#[test]
fn a_relay_restart_mid_stream_loses_nothing_and_a_retried_prompt_runs_once() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_relay_restart_mid_stream_loses_nothing_and_a_retried_prompt_runs_once",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Claude).await;
        let relay = Relay::start("127.0.0.1:0").await;
        let addr = relay.addr().to_owned();
        let session = world.session().await;
        let mut local = world.follower(&session, false).await;
        let host_home = world.dir.path().join("host");
        write_relay_config(&host_home, &relay.url);
        world
            .host()
            .ok(
                "host.relay.set",
                relay_params(&relay.url, HOST_TOKEN, json!({})),
            )
            .await;
        let mut bot = relay.bot(None).await;

        // Before: a slow turn, sent with a key.
        let first = bot
            .request(
                "session.send",
                prompt(&session, "SLOW through the relay", "key-1"),
            )
            .await;
        let (run, duplicate) = run_id_of(&first);
        assert!(!duplicate, "{}", first.to_line());
        bot.until("a text bracket of the slow run", TURN, |s| {
            s.run_id == run && s.kind() == "text.start"
        })
        .await;
        ack_all(&mut bot).await;
        let cursor = bot.seen.iter().filter(|s| !s.delta).map(|s| s.seq).max();

        // The relay dies mid-stream and comes back on the same address.
        relay.kill().await;
        relay_status(world.host(), |s| s.state != RelayState::Connected).await;
        let relay = Relay::start(&addr).await;
        let mut again = relay.bot(cursor).await;
        // During the reconnect: the same key again — held by the relay until the host is back.
        let during = again
            .request(
                "session.send",
                prompt(&session, "SLOW through the relay", "key-1"),
            )
            .await;
        assert_eq!(
            run_id_of(&during),
            (run.clone(), true),
            "a retried prompt started a second run"
        );
        let status = relay_status(world.host(), |s| s.state == RelayState::Connected).await;
        assert!(status.last_error.is_some(), "{status:?}");
        run_end(&mut again, &run, TURN).await;
        run_end(&mut local, &run, TURN).await;

        // Exactly what it missed: the bot's two connections together are the local follower's
        // brackets, each once.
        let mut combined = brackets_of(&bot, &session);
        combined.extend(brackets_of(&again, &session));
        assert_eq!(combined, brackets_of(&local, &session));

        // After: the same key once more, then after a host restart (config.toml's relay).
        let after = again
            .request(
                "session.send",
                prompt(&session, "SLOW through the relay", "key-1"),
            )
            .await;
        assert_eq!(run_id_of(&after), (run.clone(), true));
        world.restart().await;
        relay_status(world.host(), |s| s.state == RelayState::Connected).await;
        let restarted = again
            .request(
                "session.send",
                prompt(&session, "SLOW through the relay", "key-1"),
            )
            .await;
        assert_eq!(run_id_of(&restarted), (run.clone(), true));
        // One run in all, the key's: its history (read through the relay) has one prompt and
        // one run, and that prompt carries the key.
        let history = again
            .ok(
                "session.history",
                json!({"session_id": session, "limit": 5000}),
            )
            .await;
        assert_eq!(history["has_more"], false, "{history}");
        let events = history["events"].as_array().unwrap();
        let of_kind = |kind: &str| -> Vec<&serde_json::Value> {
            events.iter().filter(|e| e["kind"] == kind).collect()
        };
        let starts = of_kind("run.start");
        assert_eq!(starts.len(), 1, "{history}");
        assert_eq!(starts[0]["run_id"], run.as_str());
        assert_eq!(of_kind("run.end").len(), 1, "{history}");
        let prompts = of_kind("user.text");
        assert_eq!(prompts.len(), 1, "{history}");
        assert_eq!(prompts[0]["run_id"], run.as_str());
        assert_eq!(prompts[0]["event"]["clientMsgId"], "key-1");
        world.host.take().unwrap().stop().await;
        relay.kill().await;
    });
}

/// A host with no agents and a relay: for the scope and failure tests.
async fn bare_host(dir: &Path) -> TestHost {
    TestHost::start_with(&dir.join("host"), agent_host::clock::Clock::system()).await
}

fn session_dir(dir: &Path) -> PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    work
}

/// Acceptance 4: a token scoped to one session, without permission answers, cannot prompt or
/// list another session, cannot answer a permission, and is not sent the other session's
/// events; a bot with a wrong token is refused before any frame; a host with a wrong token is
/// refused by the relay and `host.status` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_scope_requests_are_refused_and_wrong_tokens_get_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let host = bare_host(dir.path()).await;
    let work = session_dir(dir.path());
    let mine = host.session(&work).await;
    let other = host.session(&work).await;
    let relay = Relay::start("127.0.0.1:0").await;

    // A wrong host token: refused, and the host says why.
    host.ok(
        "host.relay.set",
        relay_params(&relay.url, "wrong", json!({})),
    )
    .await;
    let refused = relay_status(&host, |s| s.last_error.is_some()).await;
    assert!(
        refused.last_error.as_deref().unwrap().contains("401"),
        "{refused:?}"
    );
    let status = host.ok("host.status", json!({})).await;
    assert!(!status.to_string().contains("wrong\""), "{status}");

    // A wrong bot token: HTTP 401, no frame, no session list.
    let hello = pb::Hello {
        client_name: "intruder".into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    match client::connect(&format!("{}/bot", relay.url), "not-the-token", hello).await {
        Err(ClientError::Refused(status)) => assert_eq!(status.as_u16(), 401),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a wrong bot token was let in"),
    }

    host.ok(
        "host.relay.set",
        relay_params(
            &relay.url,
            HOST_TOKEN,
            json!({"sessions": [mine], "prompt": true, "permissions": false}),
        ),
    )
    .await;
    let mut bot = relay.bot(None).await;
    let listed = bot.ok("session.list", json!({})).await;
    assert_eq!(session_ids(&listed), [mine.as_str()]);
    // Each refusal is the command's reply, code 1015, as over IPC.
    bot.refused(
        "session.send",
        prompt(&other, "hi", "k"),
        1015,
        "out_of_scope",
    )
    .await;
    bot.refused(
        "session.history",
        json!({"session_id": other}),
        1015,
        "out_of_scope",
    )
    .await;
    bot.refused(
        "session.get",
        json!({"session_id": other}),
        1015,
        "out_of_scope",
    )
    .await;
    let err = bot
        .refused(
            "permission.respond",
            json!({"session_id": mine, "request_id": "r1", "decision": "allow"}),
            1015,
            "out_of_scope",
        )
        .await;
    assert!(err.message.contains("permission"), "{}", err.message);
    bot.refused(
        "session.create",
        json!({"agent_type": "claude", "cwd": work.display().to_string()}),
        1015,
        "out_of_scope",
    )
    .await;
    // In scope, the same connection is served.
    let history = bot.ok("session.history", json!({"session_id": mine})).await;
    assert_eq!(history["session_id"], mine.as_str(), "{history}");

    // Events: the other session's never come through; this one's do.
    let hidden = host.bracket(&common::text_end(&other, "secret")).await;
    let shown = host.bracket(&common::text_end(&mine, "visible")).await;
    let seen = bot
        .until("the in-scope bracket", WAIT, |s| s.seq == shown)
        .await;
    assert_eq!(seen.event["sessionId"], mine.as_str());
    assert!(
        bot.seen.iter().all(|s| s.seq != hidden),
        "an out-of-scope event reached the bot"
    );
    relay.kill().await;
    host.stop().await;
}

/// What a misbehaving relay does after accepting a connection.
#[derive(Clone, Copy)]
enum Misbehaviour {
    /// Accepts TCP, then says nothing at all.
    Silent,
    /// Upgrades, then sends garbage frames instead of `Hello`.
    Garbage,
    /// Upgrades, says `Hello`, then closes after the first frame it gets.
    Hangs,
    /// Upgrades, says `Hello`, then neither reads nor writes: pings go unanswered.
    Mute,
}

/// A relay that misbehaves: each accepted connection is reported on the channel.
async fn bad_relay(how: Misbehaviour) -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (seen, accepted) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let _ = seen.send(());
            match how {
                Misbehaviour::Silent => held.push(stream),
                Misbehaviour::Garbage | Misbehaviour::Hangs | Misbehaviour::Mute => {
                    tokio::spawn(async move {
                        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                            return;
                        };
                        if matches!(how, Misbehaviour::Garbage) {
                            let _ = ws
                                .send(Message::Binary(vec![0xff, 0x00, 0x13].into()))
                                .await;
                            let _ = ws.send(Message::Text("{\"not\":\"a frame\"}".into())).await;
                            while let Some(Ok(_)) = ws.next().await {}
                        } else {
                            let hello = agent_host::protocol::wire::encode(
                                CmdId::Hello,
                                1,
                                &pb::Hello {
                                    client_name: "flaky".into(),
                                    cursor: None,
                                    protocol_version: PROTOCOL_VERSION,
                                },
                            );
                            let _ = ws.send(Message::Binary(hello)).await;
                            if matches!(how, Misbehaviour::Mute) {
                                // Held, never read: the host's pings get no pong.
                                std::future::pending::<()>().await;
                            }
                            let _ = ws.next().await;
                            drop(ws);
                        }
                    });
                }
            }
        }
    });
    (url, accepted)
}

/// Acceptance 5: a relay that never answers, one that sends garbage, one that closes after
/// every frame, and one that goes mute after `Hello` (the dead-peer rule). The host keeps retrying with growing waits, `host.status` says what is wrong,
/// and a local subscriber and IPC are served all the while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_relays_leave_the_host_healthy_and_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let host = bare_host(dir.path()).await;
    let work = session_dir(dir.path());
    let session = host.session(&work).await;
    // A local subscriber, connected throughout.
    let data = host
        .ok(
            "subscriber.add",
            json!({"type": "local", "session_id": session, "replay_mode": "since_cursor"}),
        )
        .await;
    let hello = pb::Hello {
        client_name: "local".into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    let (ws, _) = client::connect(
        data["ws_endpoint"].as_str().unwrap(),
        data["ws_token"].as_str().unwrap(),
        hello,
    )
    .await
    .unwrap();
    let mut local = Follower {
        ws,
        subscriber_id: String::new(),
        seen: Vec::new(),
    };

    // What the host may say, per relay (a relay that hangs up may be caught reading or
    // writing).
    let cases: [(Misbehaviour, &[&str]); 4] = [
        (Misbehaviour::Silent, &["no connection within"]),
        (Misbehaviour::Garbage, &["no Hello"]),
        (
            Misbehaviour::Hangs,
            &["closed", "writing to the peer failed"],
        ),
        (Misbehaviour::Mute, &["nothing arrived from the peer"]),
    ];
    for (how, expect) in cases {
        let said = |e: &str| expect.iter().any(|x| e.contains(x));
        let (url, mut accepted) = bad_relay(how).await;
        host.ok("host.relay.set", relay_params(&url, HOST_TOKEN, json!({})))
            .await;
        // Three attempts: the host keeps dialing, with waits that grow.
        for _ in 0..3 {
            tokio::time::timeout(WAIT, accepted.recv())
                .await
                .expect("the host stopped retrying")
                .unwrap();
        }
        relay_status(&host, |s| {
            s.state == RelayState::Waiting
                && s.retries >= 2
                && s.last_error.as_deref().is_some_and(said)
        })
        .await;
        let shown = host.ok("host.status", json!({})).await;
        assert!(
            said(shown["relay"]["last_error"].as_str().unwrap()),
            "{shown}"
        );

        // Local service is unaffected: an event reaches the local subscriber at once.
        let seq = host
            .bracket(&common::text_end(&session, "still here"))
            .await;
        local.until("the local event", WAIT, |s| s.seq == seq).await;
    }
    host.ok("host.relay.set", json!({})).await;
    relay_status(&host, |s| s.state == RelayState::Disabled).await;
    host.stop().await;
}

/// A `config.toml` relay that cannot work (plain `ws://` to a non-loopback address) is never
/// dialed — no packet leaves for it — and `host.status` says why; a valid one set over IPC
/// then takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_relay_is_not_dialed_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    write_relay_config(&dir.path().join("host"), "ws://203.0.113.1:9");
    let host = bare_host(dir.path()).await;
    let status = relay_status(&host, |s| s.state == RelayState::Misconfigured).await;
    assert_eq!(status.retries, 0, "{status:?}");
    let why = status.last_error.unwrap_or_default();
    assert!(
        why.contains("ws:// is allowed only to a loopback address"),
        "{why}"
    );
    let relay = Relay::start("127.0.0.1:0").await;
    let set = host
        .ipc(
            "host.relay.set",
            json!({"url": format!("{}/host", relay.url), "token": HOST_TOKEN}),
        )
        .await;
    assert_eq!(set.code, 0, "{}", set.to_line());
    relay_status(&host, |s| s.state == RelayState::Connected).await;
    host.stop().await;
}
