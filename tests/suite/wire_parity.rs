//! Wire parity (issue 14): every wire-reachable command of the command table, run over IPC,
//! over the loopback WebSocket in protobuf, over it in JSON (`agenthost.v1.json`), and through
//! the reference relay, answers with the same code and the same data (ids and times aside) —
//! errors included. One scope rule: a grant for one session reaches nothing else.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use agent_host::protocol::envelope::{COMMANDS, Reply};
use agent_host::protocol::wire::{Codec, PROTOCOL_VERSION, pb};
use agent_host::relay::RelayState;
use agent_host::ws::client::{self, WsClient, event_of};
use common::{TestHost, WAIT};
use serde_json::{Value, json};

const HOST_TOKEN: &str = "parity-host-token";
const BOT_TOKEN: &str = "parity-bot-token";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake-acp.js")
}

fn write_config(home: &Path) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[agents.fake]\ncommand = [\"node\", \"{}\"]\nprotocol = \"acp\"\n\
             env = {{ FAKE_ACP_MODE = \"load-only\" }}\n",
            script().display()
        ),
    )
    .unwrap();
}

/// A host that runs the fake ACP agent (node on PATH, its files under `dir`).
async fn start_host(dir: &Path) -> TestHost {
    let home = dir.join("host");
    write_config(&home);
    let agent_home = dir.join("agent-home");
    std::fs::create_dir_all(&agent_home).unwrap();
    let agents = common::Agents {
        env: vec![
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("HOME".to_owned(), agent_home.display().to_string()),
        ],
        family_env: Vec::new(),
        claude: None,
        codex: None,
    };
    TestHost::start_with_agents(&home, agents).await
}

fn hello(name: &str) -> pb::Hello {
    pb::Hello {
        client_name: name.into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    }
}

/// A grant from IPC (`subscriber.add` with these params) and a connection with it.
async fn grant_and_connect(host: &TestHost, params: Value, codec: Codec) -> (WsClient, String) {
    let grant = host.ok("subscriber.add", params).await;
    let (ws, resp) = client::connect_with(
        grant["ws_endpoint"].as_str().unwrap(),
        grant["ws_token"].as_str().unwrap(),
        hello("parity"),
        codec,
    )
    .await
    .unwrap();
    (ws, resp.subscriber_id)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    Ipc,
    WsProtobuf,
    WsJson,
    Relay,
}

struct Clients {
    host: TestHost,
    proto: WsClient,
    proto_id: String,
    json: WsClient,
    json_id: String,
    bot: WsClient,
    /// Follows every session, to wait for a run's end.
    watcher: WsClient,
}

impl Clients {
    async fn call(&mut self, t: Transport, command: &str, params: Value) -> Reply {
        match t {
            Transport::Ipc => self.host.ipc(command, params).await,
            Transport::WsProtobuf => self.proto.request(command, params).await.unwrap(),
            Transport::WsJson => self.json.request(command, params).await.unwrap(),
            Transport::Relay => self.bot.request(command, params).await.unwrap(),
        }
    }

    /// Who a prompt sent on a transport is from (`user.text` `from`).
    fn sender(&self, t: Transport) -> Value {
        match t {
            Transport::Ipc => json!({"via": "ipc"}),
            Transport::WsProtobuf => json!({"via": "ws", "subscriberId": self.proto_id}),
            Transport::WsJson => {
                json!({"via": "ws", "subscriberId": self.json_id, "client": "parity-app"})
            }
            Transport::Relay => json!({"via": "relay"}),
        }
    }

    /// The subscriber a transport renews its grant for.
    fn own_subscriber(&self, t: Transport) -> &str {
        match t {
            Transport::Ipc | Transport::WsProtobuf => &self.proto_id,
            Transport::WsJson => &self.json_id,
            Transport::Relay => "relay",
        }
    }

    /// Wait for the `run.end` of a run (on the watcher's events, no polling); the `from` of
    /// the run's `user.text` (who sent the prompt).
    async fn run_end(&mut self, run_id: &str) -> Value {
        tokio::time::timeout(WAIT, async {
            let mut from = Value::Null;
            loop {
                let frame = self.watcher.next_frame().await.unwrap().unwrap();
                let Some(push) = event_of(&frame).filter(|p| p.run_id == run_id) else {
                    continue;
                };
                let event: Value = serde_json::from_str(&push.event_json).unwrap();
                match event["k"].as_str() {
                    Some("user.text") => from = event["from"].clone(),
                    Some("run.end") => return from,
                    _ => {}
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no run.end for {run_id}"))
    }
}

/// Ids, times, pids and the transport's own directory made comparable.
fn normalize(value: &Value, cwd: &str) -> Value {
    const VOLATILE: &[&str] = &[
        "session_id",
        "sessionId",
        "run_id",
        "runId",
        "parent_session_id",
        "parentSessionId",
        "native_session_id",
        "nativeSessionId",
        "fork_of",
        "fromNativeSessionId",
        "subscriber_id",
        "message_id",
        "messageId",
        "itemId",
        "ws_token",
        "agent_pid",
        "pid",
        "sequence_id",
        "next_after_seq",
        "next_before_seq",
        "next_cursor",
        "created_at_ms",
        "updated_at_ms",
        "last_activity_ms",
        "ended_at_ms",
        // When a session's binding was recorded.
        "recorded_at_ms",
        "since",
        "since_ms",
        "started_at",
        "deleted",
        "event",
        // Who sent a prompt names its transport (checked per transport where it is sent).
        "from",
    ];
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if VOLATILE.contains(&k.as_str()) && !v.is_null() {
                        match v {
                            // An embedded event is compared by its own normalized fields.
                            Value::Object(_) if k == "event" => normalize(v, cwd),
                            _ => json!("<volatile>"),
                        }
                    } else {
                        normalize(v, cwd)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| normalize(v, cwd)).collect()),
        Value::String(s) => Value::String(uuids(&s.replace(cwd, "<cwd>"))),
        other => other.clone(),
    }
}

fn uuids(text: &str) -> String {
    let re =
        regex::Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap();
    re.replace_all(text, "<uuid>").into_owned()
}

/// One answer as compared: the code, the message and the data, normalized.
fn seen(reply: &Reply, cwd: &str) -> Value {
    json!({
        "code": reply.code,
        "message": uuids(&reply.message.replace(cwd, "<cwd>")),
        "data": normalize(&reply.data, cwd),
    })
}

/// A successful reply reads as its typed struct, and that struct writes back the same data:
/// no field the host sends is unknown to the types clients read.
fn typed(t: Transport, command: &str, reply: &Reply) {
    use agent_host::protocol::replies as r;
    fn check<T: serde::de::DeserializeOwned + serde::Serialize>(
        t: Transport,
        command: &str,
        reply: &Reply,
    ) {
        let data: T = reply
            .data_as()
            .unwrap_or_else(|e| panic!("{t:?} {command}: {e}: {}", reply.to_line()));
        assert_eq!(
            serde_json::to_value(&data).unwrap(),
            reply.data,
            "{t:?} {command}: the typed reply drops or changes fields"
        );
    }
    if reply.code != 0 {
        return;
    }
    match command {
        "session.create" | "session.import" => check::<r::SessionCreated>(t, command, reply),
        "session.discover" => check::<r::SessionsDiscovered>(t, command, reply),
        "session.get" => check::<r::SessionDetail>(t, command, reply),
        "session.list" => check::<r::SessionPage>(t, command, reply),
        "session.rename" => check::<r::SessionRenamed>(t, command, reply),
        "session.fork" => check::<r::SessionForkedReply>(t, command, reply),
        "session.activate" => check::<r::ActivateReceipt>(t, command, reply),
        "session.send" => check::<r::SendReceipt>(t, command, reply),
        "session.cancel" | "queue.remove" => check::<r::CancelReceipt>(t, command, reply),
        "session.steer" => check::<r::SteerReceipt>(t, command, reply),
        "session.set_model" => check::<r::ModelSet>(t, command, reply),
        "queue.edit" => check::<r::QueueEdited>(t, command, reply),
        "queue.move" => check::<r::QueueOrder>(t, command, reply),
        "queue.clear" => check::<r::QueueCleared>(t, command, reply),
        "session.history" => check::<r::HistoryPage>(t, command, reply),
        "session.runs" => check::<r::RunList>(t, command, reply),
        "session.run" => check::<r::RunInfo>(t, command, reply),
        "session.delete" => check::<r::Deleted>(t, command, reply),
        "permission.list" => check::<r::PermissionList>(t, command, reply),
        "permission.respond" => check::<r::PermissionReceipt>(t, command, reply),
        "subscriber.grant" => check::<r::Grant>(t, command, reply),
        // host.status and agent.list are reports of the host's own shape.
        _ => {}
    }
}

/// The script every transport runs, on sessions of its own: every wire-reachable command, and
/// the error cases. Returns (command, normalized answer) in order.
async fn script_for(c: &mut Clients, t: Transport, cwd: &Path) -> Vec<(String, Value)> {
    let dir = cwd.display().to_string();
    let mut out: Vec<(String, Value)> = Vec::new();
    macro_rules! step {
        ($cmd:expr, $params:expr) => {{
            let reply = c.call(t, $cmd, $params).await;
            typed(t, $cmd, &reply);
            out.push(($cmd.to_owned(), seen(&reply, &dir)));
            reply
        }};
    }
    step!("host.status", json!({}));
    step!("agent.list", json!({}));
    let created = step!(
        "session.create",
        json!({"agent_type": "fake", "cwd": dir, "title": "parity"})
    );
    assert_eq!(created.code, 0, "{t:?}: {}", created.to_line());
    let s = created.data["session_id"].as_str().unwrap().to_owned();
    step!("session.get", json!({"session_id": s}));
    step!("session.list", json!({"cwd": dir, "limit": 10}));
    step!(
        "session.rename",
        json!({"session_id": s, "title": "renamed"})
    );
    let activated = step!("session.activate", json!({"session_id": s}));
    assert_eq!(activated.code, 0, "{t:?}: {}", activated.to_line());
    step!("session.activate", json!({"session_id": s}));
    let sent = step!(
        "session.send",
        json!({"session_id": s, "text": "hello", "client_msg_id": "k-1"})
    );
    assert_eq!(sent.code, 0, "{t:?}: {}", sent.to_line());
    let run = sent.data["run_id"].as_str().unwrap().to_owned();
    // The prompt says which transport (and which client) sent it.
    assert_eq!(c.run_end(&run).await, c.sender(t), "{t:?}");
    // A resent prompt is the first run, marked duplicate (no second run starts).
    let again = step!(
        "session.send",
        json!({"session_id": s, "text": "hello", "client_msg_id": "k-1"})
    );
    assert_eq!(again.data["run_id"], json!(run), "{t:?}");
    assert_eq!(again.data["duplicate"], json!(true), "{t:?}");
    step!("session.history", json!({"session_id": s}));
    step!(
        "session.history",
        json!({"session_id": s, "after_seq": 0, "limit": 2})
    );
    // The latest page, read backwards from past the end; one direction at a time.
    step!(
        "session.history",
        json!({"session_id": s, "before_seq": 9_007_199_254_740_991_i64, "limit": 2})
    );
    step!(
        "session.history",
        json!({"session_id": s, "after_seq": 0, "before_seq": 1})
    );
    step!("session.runs", json!({"session_id": s}));
    // The run a prompt became, by its key and by its id; a key never sent; no key at all.
    let asked = step!(
        "session.run",
        json!({"session_id": s, "client_msg_id": "k-1"})
    );
    assert_eq!(
        asked.data["run_id"],
        json!(run),
        "{t:?}: {}",
        asked.to_line()
    );
    step!("session.run", json!({"session_id": s, "run_id": run}));
    step!(
        "session.run",
        json!({"session_id": s, "client_msg_id": "never-sent"})
    );
    step!("session.run", json!({"session_id": s}));
    step!("permission.list", json!({"session_id": s}));
    step!("session.cancel", json!({"session_id": s}));
    // The queue: nothing waits (the session is idle), and the run that ran is not queued.
    step!("queue.clear", json!({"session_id": s}));
    step!(
        "queue.edit",
        json!({"session_id": s, "run_id": run, "text": "edited"})
    );
    step!(
        "queue.move",
        json!({"session_id": s, "run_id": "no-such-run", "position": 0})
    );
    step!("queue.remove", json!({"session_id": s, "run_id": run}));
    // A steer with no turn running is a plain send.
    let steered = step!(
        "session.steer",
        json!({"session_id": s, "text": "steer", "client_msg_id": "k-2"})
    );
    assert_eq!(steered.code, 0, "{t:?}: {}", steered.to_line());
    let steered_run = steered.data["run_id"].as_str().unwrap().to_owned();
    assert_eq!(c.run_end(&steered_run).await, c.sender(t), "{t:?}");
    // The model, between turns (whatever the agent can do with it, alike everywhere), and a
    // model name that is not one.
    step!(
        "session.set_model",
        json!({"session_id": s, "model": "model-2"})
    );
    step!(
        "session.set_model",
        json!({"session_id": s, "model": "two words"})
    );
    let forked = step!("session.fork", json!({"session_id": s}));
    let imported = step!(
        "session.import",
        json!({"agent_type": "fake", "native_session_id": "n-1", "cwd": dir})
    );
    // The fake agent keeps no files: the same refusal everywhere.
    step!(
        "session.discover",
        json!({"agent_type": "fake", "cwd": dir})
    );
    // What they made goes, so every transport starts its next step from the same state.
    for made in [forked, imported] {
        if let Some(id) = made.data["session_id"].as_str() {
            step!("session.delete", json!({"session_id": id}));
        }
    }
    step!(
        "permission.respond",
        json!({"session_id": s, "request_id": "nope", "decision": "allow"})
    );
    let own = c.own_subscriber(t).to_owned();
    if t != Transport::Relay {
        step!("subscriber.grant", json!({"subscriber_id": own}));
    }
    // Search and export: the same answers (a word no session says, a query FTS5 cannot read,
    // the empty page past a session's end, a format that is none).
    step!(
        "session.search",
        json!({"query": "nowhere-said-word", "session_id": s})
    );
    step!(
        "session.search",
        json!({"query": "NEAR(", "syntax": "fts5"})
    );
    step!(
        "session.export",
        json!({"session_id": s, "format": "jsonl", "after_seq": 9_007_199_254_740_991_i64})
    );
    step!("session.export", json!({"session_id": s, "format": "pdf"}));
    // Errors: unknown session, bad params, unknown command, a command not on the wire.
    step!("session.get", json!({"session_id": "no-such-session"}));
    step!("session.get", json!({}));
    step!("session.send", json!({"session_id": s, "text": 7}));
    step!("session.explode", json!({}));
    step!("session.delete", json!({"session_id": s}));
    step!("session.get", json!({"session_id": s}));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wire_command_answers_alike_on_every_transport() {
    let dir = tempfile::tempdir().unwrap();
    let host = start_host(dir.path()).await;

    // The relay: a bot behind it with full rights, the same as a loopback grant's.
    let (_relay, url) = common::start_reference_relay("127.0.0.1:0", HOST_TOKEN, BOT_TOKEN).await;
    host.ok(
        "host.relay.set",
        json!({
            "url": format!("{url}/host"),
            "token": HOST_TOKEN,
            "scope": {"prompt": true, "permissions": true, "create_sessions": true},
        }),
    )
    .await;
    let mut status = host.relay.watch_status();
    tokio::time::timeout(WAIT, status.wait_for(|s| s.state == RelayState::Connected))
        .await
        .unwrap()
        .unwrap();
    let (bot, _) = client::connect(&format!("{url}/bot"), BOT_TOKEN, hello("bot"))
        .await
        .unwrap();
    let grant = json!({"type": "local", "replay_mode": "none"});
    let (proto, proto_id) = grant_and_connect(&host, grant.clone(), Codec::Protobuf).await;
    let labelled = json!({"type": "local", "replay_mode": "none", "client": "parity-app"});
    let (json_ws, json_id) = grant_and_connect(&host, labelled, Codec::Json).await;
    let (watcher, _) = grant_and_connect(&host, grant, Codec::Protobuf).await;
    let mut c = Clients {
        host,
        proto,
        proto_id,
        json: json_ws,
        json_id,
        bot,
        watcher,
    };

    let mut transcripts = Vec::new();
    for t in [
        Transport::Ipc,
        Transport::WsProtobuf,
        Transport::WsJson,
        Transport::Relay,
    ] {
        let cwd = dir.path().join(format!("work-{t:?}"));
        std::fs::create_dir_all(&cwd).unwrap();
        transcripts.push((t, script_for(&mut c, t, &cwd).await));
    }

    // The script covers every wire-reachable command of the table.
    let covered: BTreeSet<&str> = transcripts[0].1.iter().map(|(c, _)| c.as_str()).collect();
    for spec in COMMANDS.iter().filter(|s| s.wire) {
        assert!(
            covered.contains(spec.name),
            "{} is not in the script",
            spec.name
        );
    }

    let (_, ipc) = &transcripts[0];
    for (t, transcript) in &transcripts[1..] {
        let ipc_steps: Vec<_> = ipc
            .iter()
            .filter(|(c, _)| *t != Transport::Relay || c != "subscriber.grant")
            .collect();
        assert_eq!(ipc_steps.len(), transcript.len(), "{t:?}");
        for ((command, want), (_, got)) in ipc_steps.iter().zip(transcript) {
            assert_eq!(got, want, "{t:?} differs from IPC on {command}");
        }
    }
    // The error cases are what they should be, not merely alike.
    let code_of = |name: &str, nth: usize| {
        ipc.iter()
            .filter(|(c, _)| c == name)
            .nth(nth)
            .map(|(_, v)| v["data"]["error"].clone())
            .unwrap()
    };
    assert_eq!(code_of("session.get", 1), json!("session_not_found"));
    assert_eq!(code_of("session.get", 2), json!("invalid_params"));
    assert_eq!(code_of("session.send", 2), json!("invalid_params"));
    assert_eq!(code_of("session.explode", 0), json!("unknown_command"));
    assert_eq!(code_of("queue.edit", 0), json!("not_queued"));
    assert_eq!(code_of("queue.move", 0), json!("run_not_found"));
    assert_eq!(code_of("queue.remove", 0), json!("not_queued"));
    assert_eq!(code_of("session.run", 2), json!("run_not_found"));
    assert_eq!(code_of("session.run", 3), json!("invalid_params"));
    assert_eq!(code_of("session.set_model", 1), json!("invalid_params"));
    assert_eq!(
        code_of("permission.respond", 0),
        json!("permission_not_found")
    );
    assert_eq!(code_of("session.get", 3), json!("session_not_found"));

    // What is not served on the wire says so, on every wire transport.
    for t in [Transport::WsProtobuf, Transport::WsJson, Transport::Relay] {
        for command in [
            "host.shutdown",
            "subscriber.add",
            "subscriber.list",
            "host.relay.set",
        ] {
            let params = if command == "subscriber.add" {
                json!({"type": "local"})
            } else {
                json!({})
            };
            let reply = c.call(t, command, params).await;
            assert_eq!(reply.data["error"], json!("wrong_route"), "{t:?} {command}");
        }
    }
    // The relay renews no loopback grant.
    let reply = c
        .call(
            Transport::Relay,
            "subscriber.grant",
            json!({"subscriber_id": c.proto_id.clone()}),
        )
        .await;
    assert_eq!(reply.data["error"], json!("out_of_scope"));
    // A loopback client renews only its own.
    let other = c.json_id.clone();
    let reply = c
        .call(
            Transport::WsProtobuf,
            "subscriber.grant",
            json!({"subscriber_id": other}),
        )
        .await;
    assert_eq!(reply.data["error"], json!("out_of_scope"));
    c.host.stop().await;
}

/// A grant scoped to session A (`subscriber.add {session_id: A}`) reads, prompts and answers
/// for A, and is refused `out_of_scope` for everything of B and for creating sessions; it
/// never receives B's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_for_one_session_reaches_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let host = start_host(dir.path()).await;
    let create = || json!({"agent_type": "fake", "cwd": work.display().to_string()});
    let a = host.ok("session.create", create()).await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b = host.ok("session.create", create()).await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();

    for codec in [Codec::Protobuf, Codec::Json] {
        let (mut ws, _) = grant_and_connect(
            &host,
            json!({"type": "local", "session_id": a, "replay_mode": "none"}),
            codec,
        )
        .await;
        // Its own session: every right of a driver.
        let got = ws
            .request("session.get", json!({"session_id": a}))
            .await
            .unwrap();
        assert_eq!(got.code, 0, "{}", got.to_line());
        let page = ws.request("session.list", json!({})).await.unwrap();
        let ids: Vec<&str> = page.data["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            vec![a.as_str()],
            "a scoped list shows its session only"
        );
        let pending = ws.request("permission.list", json!({})).await.unwrap();
        assert_eq!(pending.code, 0);
        // The host's status, without what lies outside the scope.
        let status = ws.request("host.status", json!({})).await.unwrap();
        assert_eq!(status.code, 0, "{}", status.to_line());
        assert_eq!(status.data["running"], json!(true));
        assert_eq!(status.data["sessions"], json!(1), "{}", status.to_line());
        for hidden in ["ipc_path", "pid", "relay"] {
            assert!(
                status.data.get(hidden).is_none(),
                "{hidden}: {}",
                status.to_line()
            );
        }

        // B: nothing.
        let refusals = [
            ("session.get", json!({"session_id": b})),
            ("session.history", json!({"session_id": b})),
            ("session.runs", json!({"session_id": b})),
            (
                "session.run",
                json!({"session_id": b, "client_msg_id": "k"}),
            ),
            ("session.send", json!({"session_id": b, "text": "hi"})),
            ("session.steer", json!({"session_id": b, "text": "hi"})),
            ("session.set_model", json!({"session_id": b, "model": "m"})),
            (
                "queue.edit",
                json!({"session_id": b, "run_id": "r", "text": "x"}),
            ),
            (
                "queue.move",
                json!({"session_id": b, "run_id": "r", "position": 0}),
            ),
            ("queue.remove", json!({"session_id": b, "run_id": "r"})),
            ("queue.clear", json!({"session_id": b})),
            ("session.cancel", json!({"session_id": b})),
            ("session.activate", json!({"session_id": b})),
            ("session.rename", json!({"session_id": b, "title": "x"})),
            ("session.delete", json!({"session_id": b})),
            ("session.fork", json!({"session_id": b})),
            ("permission.list", json!({"session_id": b})),
            (
                "permission.respond",
                json!({"session_id": b, "request_id": "r", "decision": "allow"}),
            ),
            (
                "session.create",
                json!({"agent_type": "fake", "cwd": work.display().to_string()}),
            ),
            (
                "session.import",
                json!({"agent_type": "fake", "native_session_id": "n", "cwd": work.display().to_string()}),
            ),
            // Nor list the agents' own sessions (any on the machine) to import from.
            (
                "session.discover",
                json!({"agent_type": "fake", "cwd": work.display().to_string()}),
            ),
            // Even its own session cannot be forked (forking creates one) or deleted.
            ("session.fork", json!({"session_id": a})),
            ("session.delete", json!({"session_id": a})),
        ];
        for (command, params) in refusals {
            let reply = ws.request(command, params).await.unwrap();
            assert_eq!(
                reply.data["error"],
                json!("out_of_scope"),
                "{codec:?} {command}: {}",
                reply.to_line()
            );
        }
        // A grant for A without `prompt`: it reads A, and neither prompts, steers nor
        // changes A's queue.
        let (mut reader, _) = grant_and_connect(
            &host,
            json!({"type": "local", "session_id": a, "prompt": false, "replay_mode": "none"}),
            codec,
        )
        .await;
        let got = reader
            .request("session.get", json!({"session_id": a}))
            .await
            .unwrap();
        assert_eq!(got.code, 0, "{}", got.to_line());
        let no_prompt = [
            ("session.send", json!({"session_id": a, "text": "hi"})),
            ("session.steer", json!({"session_id": a, "text": "hi"})),
            ("session.set_model", json!({"session_id": a, "model": "m"})),
            (
                "queue.edit",
                json!({"session_id": a, "run_id": "r", "text": "x"}),
            ),
            (
                "queue.move",
                json!({"session_id": a, "run_id": "r", "position": 0}),
            ),
            ("queue.remove", json!({"session_id": a, "run_id": "r"})),
            ("queue.clear", json!({"session_id": a})),
        ];
        for (command, params) in no_prompt {
            let reply = reader.request(command, params).await.unwrap();
            assert_eq!(
                reply.data["error"],
                json!("out_of_scope"),
                "{codec:?} {command} without prompt: {}",
                reply.to_line()
            );
        }

        // B's events never reach it; A's do. B's whole run is committed first (seen by a
        // full-scope watcher), so by A's `run.end` every B event would have come before it.
        let (mut watcher, _) = grant_and_connect(
            &host,
            json!({"type": "local", "replay_mode": "none"}),
            codec,
        )
        .await;
        let run_b = host
            .ok("session.send", json!({"session_id": b, "text": "to b"}))
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        wait_run_end(&mut watcher, &run_b, &mut BTreeSet::new()).await;
        let sent = ws
            .request("session.send", json!({"session_id": a, "text": "to a"}))
            .await
            .unwrap();
        assert_eq!(sent.code, 0, "{}", sent.to_line());
        let run_a = sent.data["run_id"].as_str().unwrap().to_owned();
        let mut seen_sessions = BTreeSet::new();
        wait_run_end(&mut ws, &run_a, &mut seen_sessions).await;
        assert_eq!(
            seen_sessions.into_iter().collect::<Vec<_>>(),
            vec![a.clone()],
            "{codec:?}: only A's events arrive"
        );
        watcher.close().await;
        ws.close().await;
    }

    // A grant that may create sessions keeps the ones it made across reconnects (they are in
    // its stored scope), and still reaches nothing else; it may not import (a scope limited
    // to some sessions does not bring in any agent session of the machine).
    let grant = host
        .ok(
            "subscriber.add",
            json!({"type": "local", "session_id": a, "create_sessions": true, "replay_mode": "none"}),
        )
        .await;
    let connect = || async {
        client::connect(
            grant["ws_endpoint"].as_str().unwrap(),
            grant["ws_token"].as_str().unwrap(),
            hello("scoped"),
        )
        .await
        .unwrap()
        .0
    };
    let mut ws = connect().await;
    let made = ws.request("session.create", create()).await.unwrap();
    assert_eq!(made.code, 0, "{}", made.to_line());
    let c = made.data["session_id"].as_str().unwrap().to_owned();
    let imported = ws
        .request(
            "session.import",
            json!({"agent_type": "fake", "native_session_id": "n", "cwd": work.display().to_string()}),
        )
        .await
        .unwrap();
    assert_eq!(
        imported.data["error"],
        json!("out_of_scope"),
        "{}",
        imported.to_line()
    );
    ws.close().await;
    let mut again = connect().await;
    for id in [&a, &c] {
        let got = again
            .request("session.get", json!({"session_id": id}))
            .await
            .unwrap();
        assert_eq!(got.code, 0, "after a reconnect: {}", got.to_line());
    }
    let refused = again
        .request("session.get", json!({"session_id": b}))
        .await
        .unwrap();
    assert_eq!(refused.data["error"], json!("out_of_scope"));
    let deleted = again
        .request("session.delete", json!({"session_id": c}))
        .await
        .unwrap();
    assert_eq!(deleted.code, 0, "{}", deleted.to_line());
    again.close().await;
    host.stop().await;
}

/// Read events until the `run.end` of `run_id`, noting the session of every event seen.
async fn wait_run_end(ws: &mut WsClient, run_id: &str, sessions: &mut BTreeSet<String>) {
    tokio::time::timeout(WAIT, async {
        loop {
            let frame = ws.next_frame().await.unwrap().unwrap();
            let Some(push) = event_of(&frame) else {
                continue;
            };
            sessions.insert(push.session_id.clone());
            if push.run_id == run_id && push.event_json.contains("\"k\":\"run.end\"") {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no run.end for {run_id}"));
}
