//! The sealed relay fleet end to end (issue 21, acceptance 1–5), real processes on loopback:
//! Debian's `nats-server -js` (installed when missing), two `agent-host-relay` instances (the
//! real binary), real hosts (`agent_host::run` on their own homes, `[fleet]` in their
//! `config.toml`) and bots from `agent_host::relay::bot`. The tests that drive the real `claude`
//! run inside a loopback-only network namespace against the project's mock model.
//!
//! 1 and 3. `two_bots_two_hosts_and_nothing_in_clear`: bot 1 (via instance A) drives host 1
//!    (via instance B) — a canary prompt, a permission answered — while bot 2, paired with host 2
//!    only, is refused by host 1 and sees nothing of it; the canary is then looked for in the
//!    relays' logs, every file of JetStream's store and everything a raw subscriber on `>` got.
//! 2. `an_instance_dies_mid_stream`: A is SIGKILLed while a slow answer streams; host and bot
//!    come back through B, the bot has every bracket once, the retried prompt ran once.
//! 4. `unpaired_revoked_and_replayed_bots_get_nothing`.
//! 5. `a_mute_relay_is_degraded_and_left`: a relay written here that says `Welcome` and then
//!    nothing; `host.status` `fleet` turns `degraded` in time and the host moves on.
//!
//! And the bot's own recovery, made to happen rather than hoped for:
//! `a_bot_renews_its_channel_and_replays_what_it_missed` — the host ends the channel (its
//! subscriber removed) and the bot's event queue overflows; each time the bot handshakes again
//! and resumes from its cursor, every bracket once and in order. And the reference bot
//! (`examples/bot.rs`, built by `cargo test`) as a user runs it:
//! `the_reference_bot_pairs_follows_and_answers`.
//!
//! Every wait is bounded and waits on an event (a frame, a status change, a process line).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_host::config::{AgentConfig, Config};
use agent_host::protocol::envelope::Reply;
use agent_host::protocol::relay_wire::{self, Body};
use agent_host::relay::bot::{self, BotClient, BotError, BotEvent, BotOptions, BotState};
use agent_host::relay::fleet::{FleetState, FleetStatus};
use agent_host::seal::{BotKey, PairingCode};
use common::agents::{agent_env, ensure_claude, in_loopback_only_netns};
use common::mock_model::MockModel;
use common::nats::{NatsServer, ensure_nats_server};
use common::relay::Relay;
use common::{TestHost, WAIT};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

const HOST_TOKEN: &str = "fleet-test-host-token-71c2";
const BOT_TOKEN: &str = "fleet-test-bot-token-4a9e";
/// How long a real turn against the mock may take.
const TURN: Duration = Duration::from_secs(60);
/// The host's fleet timing in these tests (ms): probes often, degraded soon.
const PROBE_MS: u64 = 250;
const DEGRADED_MS: u64 = 2000;

// ---------------------------------------------------------------------------------------------
// Processes: relays and hosts.

/// A relay instance with this file's tokens.
async fn relay(nats: &NatsServer, instance: &str, dir: &Path) -> Relay {
    Relay::start(nats, instance, dir, HOST_TOKEN, BOT_TOKEN).await
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `[fleet]` of a host's `config.toml`: these URLs in this order, timing for tests.
fn fleet_toml(urls: &[String], bot_urls: Option<&[String]>) -> String {
    let list = |urls: &[String]| {
        urls.iter()
            .map(|u| format!("{u:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let bot_urls = bot_urls
        .map(|b| format!("bot_urls = [{}]\n", list(b)))
        .unwrap_or_default();
    format!(
        "[fleet]\nurls = [{}]\ntoken = \"{HOST_TOKEN}\"\n{bot_urls}\
         [fleet.timing]\nconnect_timeout_ms = 2000\nping_interval_ms = 1000\n\
         dead_peer_ms = 4000\nprobe_interval_ms = {PROBE_MS}\ndegraded_after_ms = {DEGRADED_MS}\n\
         backoff_min_ms = 50\nbackoff_max_ms = 500\n",
        list(urls)
    )
}

/// What a host needs to run the real claude against the mock.
struct Claude {
    binary: PathBuf,
    env: Vec<(String, String)>,
}

impl Claude {
    fn new(agent_home: &Path, mock: &MockModel) -> Claude {
        std::fs::create_dir_all(agent_home).unwrap();
        let mut env = agent_env(agent_home, mock);
        env.push(("CLAUDECODE".to_owned(), "1".to_owned()));
        Claude {
            binary: ensure_claude(),
            env,
        }
    }
}

/// A real host in this process on its own home, with `config.toml` holding `toml`.
async fn host(home: &Path, toml: &str, claude: Option<&Claude>) -> TestHost {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!("log_level = \"info\"\n{toml}"),
    )
    .unwrap();
    let mut config = Config::with_home(home).unwrap();
    if let Some(claude) = claude {
        config.env = claude.env.clone();
        config.agents.insert(
            "claude".to_owned(),
            AgentConfig {
                binary: Some(claude.binary.display().to_string()),
                ..Default::default()
            },
        );
    }
    TestHost::start_config(config).await
}

/// What these tests ask of a host's fleet client and pairings.
trait FleetHost {
    async fn fleet_until(&self, what: &str, pred: impl Fn(&FleetStatus) -> bool) -> FleetStatus;
    async fn connected_to(&self, relay: &Relay) -> FleetStatus;
    async fn code(&self, scope: Value) -> PairingCode;
}

impl FleetHost for TestHost {
    /// Wait until the fleet status satisfies `pred`; returns it.
    async fn fleet_until(&self, what: &str, pred: impl Fn(&FleetStatus) -> bool) -> FleetStatus {
        let mut status = self.fleet.watch_status();
        tokio::time::timeout(WAIT, status.wait_for(|s| pred(s)))
            .await
            .unwrap_or_else(|_| panic!("fleet never {what}: {:?}", self.fleet.status()))
            .unwrap()
            .clone()
    }

    /// Connected to `relay` and proven by a loop-back round trip.
    async fn connected_to(&self, relay: &Relay) -> FleetStatus {
        let url = relay.host_url();
        self.fleet_until(&format!("connected to {url}"), |s| {
            s.state == FleetState::Connected && s.url.as_deref() == Some(url.as_str())
        })
        .await
    }

    /// A pairing code for `scope`.
    async fn code(&self, scope: Value) -> PairingCode {
        let data = self
            .ok("pair.create", json!({"scope": scope, "ttl_s": 300}))
            .await;
        PairingCode::decode(data["code"].as_str().unwrap()).unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// Bots.

fn bot_options() -> BotOptions {
    BotOptions {
        client_name: "fleet-test".to_owned(),
        connect_timeout: Duration::from_secs(3),
        handshake_timeout: Duration::from_secs(5),
        ping_interval: Duration::from_secs(1),
        dead_peer: Duration::from_secs(4),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        ready_timeout: WAIT,
        ..BotOptions::default()
    }
}

async fn pair(code: &PairingCode, key: &Path, name: &str) -> Result<BotState, BotError> {
    tokio::time::timeout(WAIT, bot::pair(code, key, name, BOT_TOKEN, &bot_options()))
        .await
        .expect("pairing answers in time")
}

/// A connected bot and every event it got.
struct Bot {
    client: BotClient,
    seen: Vec<BotEvent>,
}

impl Bot {
    async fn connect(state: &BotState) -> Bot {
        let client = BotClient::connect_with(state, bot_options()).await.unwrap();
        Bot {
            client,
            seen: Vec::new(),
        }
    }

    /// Events until one matches; returns it.
    async fn until(
        &mut self,
        what: &str,
        wait: Duration,
        pred: impl Fn(&BotEvent) -> bool,
    ) -> BotEvent {
        let deadline = Instant::now() + wait;
        loop {
            let event = tokio::time::timeout_at(deadline, self.client.next_event())
                .await
                .unwrap_or_else(|_| panic!("no {what} in {wait:?}; saw {:?}", self.kinds()))
                .unwrap_or_else(|e| panic!("no {what}: the bot ended: {e}"));
            self.seen.push(event.clone());
            if pred(&event) {
                return event;
            }
        }
    }

    async fn run_end(&mut self, run_id: &str) -> BotEvent {
        self.until("run.end", TURN, |e| {
            e.kind() == "run.end" && e.run_id == run_id
        })
        .await
    }

    async fn request(&self, command: &str, params: Value) -> Reply {
        tokio::time::timeout(WAIT, self.client.request(command, params))
            .await
            .unwrap_or_else(|_| panic!("no reply to {command}"))
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    }

    async fn ok(&self, command: &str, params: Value) -> Value {
        let reply = self.request(command, params).await;
        assert_eq!(reply.code, 0, "{command}: {}", reply.to_line());
        reply.data
    }

    fn kinds(&self) -> Vec<String> {
        self.seen.iter().map(|e| e.kind().to_owned()).collect()
    }

    /// The bracket sequence ids of `session`, in the order they came.
    fn brackets_of(&self, session: &str) -> Vec<i64> {
        self.seen
            .iter()
            .filter(|e| !e.is_delta && e.session_id == session)
            .map(|e| e.sequence_id)
            .collect()
    }

    /// Wait until the bot's status satisfies `pred`.
    async fn status_until(
        &self,
        what: &str,
        pred: impl Fn(&bot::BotStatus) -> bool,
    ) -> bot::BotStatus {
        let mut status = self.client.watch_status();
        tokio::time::timeout(WAIT, status.wait_for(|s| pred(s)))
            .await
            .unwrap_or_else(|_| panic!("the bot never {what}: {:?}", self.client.status()))
            .unwrap()
            .clone()
    }
}

/// The text the `text.end` events of a run hold.
fn text_of(bot: &Bot, run_id: &str) -> String {
    bot.seen
        .iter()
        .filter(|e| e.run_id == run_id && e.kind() == "text.end")
        .map(|e| e.event["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The bracket sequence ids of `session` in the host's history, up to `last`.
async fn history(host: &TestHost, session: &str, last: i64) -> Vec<i64> {
    let page = host
        .ok(
            "session.history",
            json!({"session_id": session, "limit": 5000}),
        )
        .await;
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["sequence_id"].as_i64().unwrap())
        .filter(|seq| *seq <= last)
        .collect()
}

/// Install what a test needs (a namespace cannot download): nats-server, and the pinned
/// claude for those that run it.
fn prepare(claude: bool) {
    common::apt::ensure_package("nats-server", "nats-server", || {
        common::apt::version_runs("nats-server")
    });
    if claude {
        ensure_claude();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    if let Ok(filter) = std::env::var("FLEET_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The canary's hiding places.

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .unwrap_or_default()
                .windows(needle.len())
                .any(|w| w == needle)
            {
                found.push(path);
            }
        }
    }
    found
}

/// Everything a raw NATS subscriber on `>` received: (subject, payload).
type Wiretap = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

async fn wiretap(nats: &NatsServer) -> (Wiretap, tokio::task::JoinHandle<()>) {
    let client = async_nats::connect(&nats.url).await.unwrap();
    let mut all = client.subscribe(">").await.unwrap();
    client.flush().await.unwrap();
    let got: Wiretap = Arc::default();
    let sink = got.clone();
    let task = tokio::spawn(async move {
        let _client = client;
        while let Some(message) = all.next().await {
            sink.lock()
                .unwrap()
                .push((message.subject.to_string(), message.payload.to_vec()));
        }
    });
    (got, task)
}

// ---------------------------------------------------------------------------------------------
// Acceptance 1 and 3.

/// Bot 1 drives host 1 across two instances (a canary prompt; a tool call it allows); bot 2,
/// paired with host 2 only, is refused by host 1 and sees none of its sessions; the canary
/// prompt and its answer are nowhere the relays or NATS hold or log.
#[test]
fn two_bots_two_hosts_and_nothing_in_clear() {
    prepare(true);
    if !in_loopback_only_netns("two_bots_two_hosts_and_nothing_in_clear") {
        return;
    }
    runtime().block_on(async {
        const CANARY: &str = "CANARY-sealed-8d41f3";
        let dir = tempfile::tempdir().unwrap();
        let mock = MockModel::start(0).await.unwrap();
        let claude = Claude::new(&dir.path().join("agent-home"), &mock);
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let nats = ensure_nats_server();
        let (tapped, tap) = wiretap(&nats).await;
        let a = relay(&nats, "a", dir.path()).await;
        let b = relay(&nats, "b", dir.path()).await;

        // Host 1 on B, its bots told to come through A first; host 2 on A.
        let host1 = host(
            &dir.path().join("host1"),
            &fleet_toml(
                &[b.host_url(), a.host_url()],
                Some(&[a.bot_url(), b.bot_url()]),
            ),
            Some(&claude),
        )
        .await;
        let host2 = host(
            &dir.path().join("host2"),
            &fleet_toml(&[a.host_url(), b.host_url()], None),
            None,
        )
        .await;
        let on_b = host1.connected_to(&b).await;
        assert_eq!(on_b.instance.as_deref(), Some("b"));
        host2.connected_to(&a).await;

        let session = host1.session_of("claude", &work).await;
        let code1 = host1
            .code(json!({"sessions": [session], "prompt": true, "permissions": true}))
            .await;
        assert_eq!(code1.relay_urls, [a.bot_url(), b.bot_url()]);
        let state1 = pair(&code1, &dir.path().join("bot1.key"), "bot-one")
            .await
            .unwrap();
        let mut bot1 = Bot::connect(&state1).await;
        let status = bot1.client.status();
        assert_eq!(status.instance.as_deref(), Some("a"), "{status:?}");
        assert_eq!(host1.fleet.status().instance.as_deref(), Some("b"));

        // The canary prompt and its answer, through A, NATS and B.
        let prompt = format!("hello {CANARY}");
        let sent = bot1
            .ok(
                "session.send",
                json!({"session_id": session, "text": prompt}),
            )
            .await;
        let run = sent["run_id"].as_str().unwrap().to_owned();
        let end = bot1.run_end(&run).await;
        assert_eq!(end.event["state"], "completed", "{:?}", end.event);
        let user = bot1
            .seen
            .iter()
            .find(|e| e.run_id == run && e.kind() == "user.text")
            .unwrap();
        assert_eq!(user.event["text"], prompt.as_str());
        assert_eq!(
            text_of(&bot1, &run),
            format!("echo: {prompt} [user turns seen: 1; first: {prompt}]")
        );

        // A permission, answered by the bot.
        let sent = bot1
            .ok(
                "session.send",
                json!({"session_id": session, "text": "TOOLCALL `touch fleet-tool && echo fleet-tool-ran`"}),
            )
            .await;
        let tool_run = sent["run_id"].as_str().unwrap().to_owned();
        let asked = bot1
            .until("permission.request", TURN, |e| {
                e.kind() == "permission.request" && e.run_id == tool_run
            })
            .await;
        assert!(asked.needs_you());
        let answer = bot1
            .ok(
                "permission.respond",
                json!({"session_id": session,
                       "request_id": asked.event["requestId"], "decision": "allow"}),
            )
            .await;
        assert_eq!(answer["decision"], "allow", "{answer}");
        let end = bot1.run_end(&tool_run).await;
        assert_eq!(end.event["state"], "completed");
        let exec = bot1
            .seen
            .iter()
            .find(|e| e.run_id == tool_run && e.kind() == "tool.exec.end")
            .unwrap();
        assert_eq!(exec.event["output"], "fleet-tool-ran");
        let resolved = bot1
            .seen
            .iter()
            .find(|e| e.run_id == tool_run && e.kind() == "permission.resolved")
            .unwrap();
        assert_eq!(
            resolved.event["by"],
            format!("bot-{}", state1.bot_id).as_str()
        );

        // Bot 2: paired with host 2 only.
        let code2 = host2.code(json!({})).await;
        let state2 = pair(&code2, &dir.path().join("bot2.key"), "bot-two")
            .await
            .unwrap();
        let bot2 = Bot::connect(&state2).await;
        let listed = bot2.ok("session.list", json!({})).await;
        assert!(!listed.to_string().contains(&session), "{listed}");
        let got = bot2
            .request("session.get", json!({"session_id": session}))
            .await;
        assert_ne!(got.code, 0, "{}", got.to_line());
        let history = bot2
            .request("session.history", json!({"session_id": session}))
            .await;
        assert!(
            history.code != 0 || !history.data.to_string().contains(CANARY),
            "{}",
            history.to_line()
        );
        // Its key at host 1 (whose id and key it could learn): refused.
        let mut at_host1 = state2.clone();
        at_host1.host_id = state1.host_id.clone();
        at_host1.host_public = state1.host_public.clone();
        at_host1.bot_urls = state1.bot_urls.clone();
        let refused = BotClient::connect_with(&at_host1, bot_options()).await;
        assert_eq!(
            refused.err(),
            Some(BotError::Refused("unknown_bot".to_owned()))
        );
        // Host 1's code replayed by bot 2: refused too.
        let replayed = pair(&code1, &dir.path().join("bot2.key"), "bot-two").await;
        assert_eq!(
            replayed.err(),
            Some(BotError::Refused("pairing_refused".to_owned()))
        );

        // The canary went through (host 1 stored it) ...
        let stored = host1
            .ok("session.history", json!({"session_id": session}))
            .await;
        assert!(stored.to_string().contains(CANARY));
        bot1.client.close().await;
        bot2.client.close().await;
        host1.stop().await;
        host2.stop().await;
        // ... and is nowhere else: the relays' logs, ...
        for relay in [&a, &b] {
            let log = read(&relay.log);
            // A served the bots and host 2, B host 1: both carried the canary's frames.
            assert!(log.contains("host connected"), "{}: {log}", relay.instance);
            for secret in [CANARY, HOST_TOKEN, BOT_TOKEN] {
                assert!(
                    !log.contains(secret),
                    "relay {}'s log holds {secret}",
                    relay.instance
                );
            }
        }
        // ... JetStream's store (which does hold the frames: their subjects are there), ...
        let store = nats.store_dir();
        let subject = format!("ah.h.{}", state1.host_id);
        assert!(
            !files_containing(store, subject.as_bytes()).is_empty(),
            "no frame of host 1 in {}",
            store.display()
        );
        let found = files_containing(store, CANARY.as_bytes());
        assert!(found.is_empty(), "the canary is in {found:?}");
        // ... and everything a raw subscriber on `>` saw.
        tap.abort();
        let tapped = tapped.lock().unwrap();
        let routed = tapped
            .iter()
            .filter(|(s, p)| s.starts_with("ah.") && !p.is_empty())
            .count();
        assert!(routed > 20, "the wiretap saw {routed} frames");
        let canary = CANARY.as_bytes();
        for (subject, payload) in tapped.iter() {
            assert!(
                !payload.windows(canary.len()).any(|w| w == canary),
                "the canary crossed NATS on {subject}"
            );
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Acceptance 2.

/// Host and bot on instance A; A is SIGKILLed while a slow answer streams: both come back
/// through B, the bot has every bracket of the session once, and the prompt it retries with
/// its key ran once.
#[test]
fn an_instance_dies_mid_stream() {
    prepare(true);
    if !in_loopback_only_netns("an_instance_dies_mid_stream") {
        return;
    }
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockModel::start(0).await.unwrap();
        let claude = Claude::new(&dir.path().join("agent-home"), &mock);
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let nats = ensure_nats_server();
        let mut a = relay(&nats, "a", dir.path()).await;
        let b = relay(&nats, "b", dir.path()).await;
        let host = host(
            &dir.path().join("host"),
            &fleet_toml(&[a.host_url(), b.host_url()], None),
            Some(&claude),
        )
        .await;
        host.connected_to(&a).await;
        let session = host.session_of("claude", &work).await;
        let code = host
            .code(json!({"sessions": [session], "prompt": true}))
            .await;
        let state = pair(&code, &dir.path().join("bot.key"), "bot-one")
            .await
            .unwrap();
        let mut bot = Bot::connect(&state).await;
        assert_eq!(bot.client.status().instance.as_deref(), Some("a"));

        let key = "prompt-key-0001";
        let params = json!({"session_id": session, "text": "STREAM 40 100 fleet",
                            "client_msg_id": key});
        let sent = bot.ok("session.send", params.clone()).await;
        let run = sent["run_id"].as_str().unwrap().to_owned();
        bot.until("the slow answer streaming", TURN, |e| {
            e.kind() == "text.delta" && e.run_id == run
        })
        .await;

        let killed = Instant::now();
        a.kill().await;
        let b_bot = b.bot_url();
        bot.status_until("came back through B", |s| {
            s.ready && s.url.as_deref() == Some(b_bot.as_str())
        })
        .await;
        let moved = host.connected_to(&b).await;
        eprintln!(
            "bot and host back through B {:?} after the kill",
            killed.elapsed()
        );
        assert_eq!(moved.instance.as_deref(), Some("b"));

        // The retry (the bot does not know whether the first went through): the same run.
        let again = bot.ok("session.send", params).await;
        assert_eq!(again["run_id"], run.as_str(), "{again}");
        assert_eq!(again["duplicate"], true, "{again}");
        let end = bot.run_end(&run).await;
        assert_eq!(end.event["state"], "completed", "{:?}", end.event);

        // Every bracket once, in order: what the host stored up to the run's end.
        let got = bot.brackets_of(&session);
        let stored = history(&host, &session, end.sequence_id).await;
        let got: Vec<i64> = got.into_iter().filter(|s| *s <= end.sequence_id).collect();
        assert_eq!(got, stored, "the bot's brackets against the host's history");
        let runs = host
            .ok("session.runs", json!({"session_id": session}))
            .await;
        let keyed: Vec<&Value> = runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["client_msg_id"] == key)
            .collect();
        assert_eq!(keyed.len(), 1, "{runs}");
        // The answer whole, though its stream crossed the kill.
        let text = text_of(&bot, &run);
        let expected: String = (0..40).map(|i| format!("fleet.{i} ")).collect();
        assert_eq!(text.trim_end(), expected.trim_end());
        bot.client.close().await;
        host.stop().await;
    });
}

// ---------------------------------------------------------------------------------------------
// Acceptance 4.

/// An unpaired bot gets nothing; a replayed pairing code is refused; a revoked bot is cut off
/// within 1 s and cannot connect again.
#[test]
fn unpaired_revoked_and_replayed_bots_get_nothing() {
    prepare(false);
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let nats = ensure_nats_server();
        let a = relay(&nats, "a", dir.path()).await;
        let b = relay(&nats, "b", dir.path()).await;
        let host = host(
            &dir.path().join("host"),
            &fleet_toml(&[a.host_url(), b.host_url()], None),
            None,
        )
        .await;
        host.connected_to(&a).await;
        let code = host.code(json!({})).await;
        let state = pair(&code, &dir.path().join("bot.key"), "bot-one")
            .await
            .unwrap();

        // An unpaired key, knowing everything else.
        let stranger = dir.path().join("stranger.key");
        let mut unpaired = state.clone();
        unpaired.key_file = stranger.clone();
        unpaired.bot_id = BotKey::load_or_create(&stranger).unwrap().bot_id();
        let refused = BotClient::connect_with(&unpaired, bot_options()).await;
        assert_eq!(
            refused.err(),
            Some(BotError::Refused("unknown_bot".to_owned()))
        );
        // The code again, by another key: the secret is spent.
        let replayed = pair(&code, &stranger, "stranger").await;
        assert_eq!(
            replayed.err(),
            Some(BotError::Refused("pairing_refused".to_owned()))
        );

        // The paired bot works, through B for a change ...
        let mut through_b = state.clone();
        through_b.bot_urls = vec![b.bot_url()];
        let mut bot = Bot::connect(&through_b).await;
        let status = bot.ok("host.status", json!({})).await;
        assert_eq!(status["fleet"]["state"], "connected", "{status}");
        // ... until it is revoked: cut off within 1 s.
        let requester = bot.client.requester();
        let cut = tokio::spawn(async move {
            let ended = loop {
                match bot.client.next_event().await {
                    Ok(_) => {}
                    Err(e) => break e,
                }
            };
            (ended, Instant::now())
        });
        let revoked_at = Instant::now();
        let revoked = host.ok("pair.revoke", json!({"bot": state.bot_id})).await;
        assert_eq!(revoked["revoked"], true);
        let (ended, at) = tokio::time::timeout(WAIT, cut).await.unwrap().unwrap();
        let took = at - revoked_at;
        assert_eq!(ended, BotError::Refused("revoked".to_owned()));
        assert!(took < Duration::from_secs(1), "cut off after {took:?}");
        eprintln!("revoked bot cut off in {took:?}");
        let late = requester.request("host.status", json!({})).await;
        assert_eq!(late.err(), Some(BotError::Refused("revoked".to_owned())));
        let again = BotClient::connect_with(&state, bot_options()).await;
        assert_eq!(
            again.err(),
            Some(BotError::Refused("revoked".to_owned())),
            "a revoked bot cannot connect again"
        );
        let listed = host.ok("pair.list", json!({})).await;
        let bots = listed["bots"].as_array().unwrap();
        assert_eq!(bots.len(), 1, "{listed}");
        assert!(bots[0]["revoked_at_ms"].is_i64(), "{listed}");
        host.stop().await;
    });
}

// ---------------------------------------------------------------------------------------------
// Acceptance 5.

/// A relay that upgrades `/host`, answers `HostHello` with `Welcome` and then never sends
/// anything again (it keeps reading). Tells when it welcomed a host.
async fn mute_relay() -> (String, tokio::sync::mpsc::Receiver<Instant>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (welcomed_tx, welcomed) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let welcomed = welcomed_tx.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let Some(Ok(Message::Binary(first))) = ws.next().await else {
                    return;
                };
                if !matches!(relay_wire::decode(&first), Ok(Body::HostHello(_))) {
                    return;
                }
                let welcome = Body::Welcome(relay_wire::Welcome {
                    instance: "mute".to_owned(),
                    host_online: false,
                });
                if ws
                    .send(Message::Binary(relay_wire::encode(welcome)))
                    .await
                    .is_err()
                {
                    return;
                }
                let _told = welcomed.send(Instant::now()).await;
                // Mute from here on: read (the library answers WebSocket pings, so the
                // connection looks alive), deliver nothing.
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    (url, welcomed)
}

/// The host's first URL is a relay that goes mute after `Welcome`: `host.status` `fleet`
/// turns `degraded` within `degraded_after_ms` (plus one probe interval), and the host moves
/// to the next URL, where a bot reaches it.
#[test]
fn a_mute_relay_is_degraded_and_left() {
    prepare(false);
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let nats = ensure_nats_server();
        let a = relay(&nats, "a", dir.path()).await;
        let (mute, mut welcomed) = mute_relay().await;
        let mute_host = format!("{mute}/host");
        let host = host(
            &dir.path().join("host"),
            &fleet_toml(&[mute_host.clone(), a.host_url()], Some(&[a.bot_url()])),
            None,
        )
        .await;
        let accepted = tokio::time::timeout(WAIT, welcomed.recv())
            .await
            .expect("the host dials the mute relay first")
            .unwrap();
        let degraded = host
            .fleet_until("degraded by the mute relay", |s| {
                // Degraded stays until another connection is proven; the URL may already be
                // the next one's.
                s.state == FleetState::Degraded
                    && s.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains(&mute_host))
            })
            .await;
        let took = Instant::now() - accepted;
        let limit = Duration::from_millis(DEGRADED_MS + PROBE_MS + 500);
        assert!(took <= limit, "degraded after {took:?} (limit {limit:?})");
        eprintln!("degraded {took:?} after the mute relay's Welcome");
        assert!(degraded.last_round_trip_at_ms.is_none(), "{degraded:?}");
        assert!(
            degraded
                .last_error
                .as_deref()
                .unwrap()
                .contains("loop-back"),
            "{degraded:?}"
        );
        let moved = host.connected_to(&a).await;
        assert_eq!(moved.instance.as_deref(), Some("a"));
        assert!(moved.round_trip_ms.is_some(), "{moved:?}");
        let status = host.ok("host.status", json!({})).await;
        assert_eq!(status["fleet"]["state"], "connected", "{status}");
        assert_eq!(status["fleet"]["url"], a.host_url().as_str(), "{status}");
        assert!(
            status["fleet"]["last_round_trip_at_ms"].is_i64(),
            "{status}"
        );

        // A bot reaches the host where it went.
        let code = host.code(json!({})).await;
        assert_eq!(code.relay_urls, [a.bot_url()]);
        let state = pair(&code, &dir.path().join("bot.key"), "bot-one")
            .await
            .unwrap();
        let bot = Bot::connect(&state).await;
        let seen = bot.ok("host.status", json!({})).await;
        assert_eq!(seen["fleet"]["instance"], "a", "{seen}");
        bot.client.close().await;
        host.stop().await;
    });
}

// ---------------------------------------------------------------------------------------------
// The bot's recovery.

/// The host ends the bot's channel (`subscriber.remove` of its row): the bot handshakes again
/// and says `Hello` with its cursor. Then its event queue (4 events) overflows while nobody
/// reads: it stops taking brackets, and once drained renews the channel and replays the rest.
/// Either way every bracket arrives once, in order.
#[test]
fn a_bot_renews_its_channel_and_replays_what_it_missed() {
    prepare(false);
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let nats = ensure_nats_server();
        let a = relay(&nats, "a", dir.path()).await;
        let host = host(
            &dir.path().join("host"),
            &fleet_toml(&[a.host_url()], None),
            None,
        )
        .await;
        host.connected_to(&a).await;
        let session = host.session_of("claude", dir.path()).await;
        let mut published = Vec::new();
        for i in 0..3 {
            published.push(
                host.bracket(&common::text_end(&session, &format!("before-{i}")))
                    .await,
            );
        }
        let code = host.code(json!({})).await;
        let state = pair(&code, &dir.path().join("bot.key"), "bot-one")
            .await
            .unwrap();
        let options = BotOptions {
            event_queue: 4,
            ..bot_options()
        };
        let mut bot = Bot {
            client: BotClient::connect_with(&state, options).await.unwrap(),
            seen: Vec::new(),
        };
        let last = *published.last().unwrap();
        bot.until("the first brackets", WAIT, |e| e.sequence_id == last)
            .await;

        // The host ends the channel.
        let row = format!("bot-{}", state.bot_id);
        host.ok("subscriber.remove", json!({"subscriber_id": row}))
            .await;
        bot.status_until("handshook again", |s| s.ready && s.handshakes == 2)
            .await;
        published.push(
            host.bracket(&common::text_end(&session, "after-renewal"))
                .await,
        );
        let last = *published.last().unwrap();
        bot.until("the bracket after the renewal", WAIT, |e| {
            e.sequence_id == last
        })
        .await;

        // Twelve brackets while nobody reads a queue of four.
        for i in 0..12 {
            published.push(
                host.bracket(&common::text_end(&session, &format!("burst-{i}")))
                    .await,
            );
        }
        let last = *published.last().unwrap();
        bot.until("the end of the burst", WAIT, |e| e.sequence_id == last)
            .await;
        let status = bot.client.status();
        assert!(
            status.handshakes >= 3,
            "no renewal after the overflow: {status:?}"
        );
        let got = bot.brackets_of(&session);
        let texts: Vec<i64> = bot
            .seen
            .iter()
            .filter(|e| e.kind() == "text.end")
            .map(|e| e.sequence_id)
            .collect();
        assert_eq!(texts, published, "every published bracket once, in order");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
        bot.client.close().await;
        host.stop().await;
    });
}

// ---------------------------------------------------------------------------------------------
// The reference bot.

/// `examples/bot.rs`, built by `cargo test` (alone: `cargo build --example bot`).
fn reference_bot() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_agent-host"))
        .parent()
        .unwrap()
        .join("examples")
        .join("bot");
    assert!(
        path.exists(),
        "{} not built: cargo build --example bot",
        path.display()
    );
    path
}

/// Run the reference bot to its end: (exit code, stdout).
async fn run_bot(args: &[&str]) -> (i32, String) {
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(reference_bot())
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the reference bot ends in time")
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The reference bot as a user runs it: `pair` with the code, `follow` prints a permission
/// request and a run's end as "needs you", `answer` and `send` go through the fleet and print
/// the host's reply line.
#[test]
fn the_reference_bot_pairs_follows_and_answers() {
    use agent_host::protocol::events::{Event, EventBody, PermissionRequest, RunEnd, RunState};
    prepare(false);
    reference_bot();
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let nats = ensure_nats_server();
        let a = relay(&nats, "a", dir.path()).await;
        let host = host(
            &dir.path().join("host"),
            &fleet_toml(&[a.host_url()], None),
            None,
        )
        .await;
        host.connected_to(&a).await;
        let session = host.session_of("claude", dir.path()).await;
        let code = host
            .code(json!({"sessions": [session], "prompt": true, "permissions": true}))
            .await;
        let key = dir.path().join("bot.key");
        let state = dir.path().join("bot.json");
        let (status, out) = run_bot(&[
            "pair",
            "--code",
            &code.encode(),
            "--key",
            key.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
            "--name",
            "reference",
            "--token",
            BOT_TOKEN,
        ])
        .await;
        assert_eq!(status, 0, "{out}");
        assert!(out.starts_with("paired with host "), "{out}");

        let mut follow = tokio::process::Command::new(reference_bot())
            .args(["follow", "--state", state.to_str().unwrap()])
            .args(["--session", &session])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(follow.stdout.take().unwrap()).lines();
        let mut line_until = async |what: &str| -> String {
            loop {
                let line = tokio::time::timeout(WAIT, lines.next_line())
                    .await
                    .unwrap_or_else(|_| panic!("follow never printed {what}"))
                    .unwrap()
                    .unwrap_or_else(|| panic!("follow ended before {what}"));
                if line.contains(what) {
                    return line;
                }
            }
        };
        line_until("following host").await;
        let asked = Event::new(
            &session,
            Some("run-ref".into()),
            EventBody::PermissionRequest(PermissionRequest {
                request_id: "perm-ref-1".into(),
                tool: "Bash".into(),
                input: json!({"command": "touch x"}),
                options: Vec::new(),
            }),
        );
        host.bus.publish(&asked).await.unwrap();
        let needs = line_until("needs you: permission perm-ref-1").await;
        assert!(
            needs.contains(&session) && needs.contains("Bash"),
            "{needs}"
        );
        let ended = Event::new(
            &session,
            Some("run-ref".into()),
            EventBody::RunEnd(RunEnd {
                state: RunState::Completed,
                category: None,
                message: None,
            }),
        );
        host.bus.publish(&ended).await.unwrap();
        let needs = line_until("needs you: run run-ref").await;
        assert!(needs.ends_with("ended completed"), "{needs}");

        // Answers go through the fleet: no agent asked this one, so the host says so.
        let (status, out) = run_bot(&[
            "answer",
            "--state",
            state.to_str().unwrap(),
            "--session",
            &session,
            "--request",
            "perm-ref-1",
            "--decision",
            "allow",
        ])
        .await;
        assert_eq!(status, 1, "{out}");
        assert!(out.contains("permission_not_found"), "{out}");
        // A prompt sent twice with one key is one run.
        let send = [
            "send",
            "--state",
            state.to_str().unwrap(),
            "--session",
            &session,
        ];
        let send = [
            &send[..],
            &["--text", "hello", "--client-msg-id", "ref-key-1"],
        ]
        .concat();
        let (first_status, first) = run_bot(&send).await;
        let (second_status, second) = run_bot(&send).await;
        assert_eq!(first_status, 0, "{first}");
        assert_eq!(second_status, 0, "{second}");
        let run_of = |line: &str| {
            let reply: Value = serde_json::from_str(line.trim()).unwrap();
            reply["data"]["run_id"].as_str().unwrap().to_owned()
        };
        assert_eq!(run_of(&first), run_of(&second));
        assert!(second.contains("\"duplicate\":true"), "{second}");
        follow.kill().await.unwrap();
        host.stop().await;
    });
}
