//! Secrets never leave the host (issue 13, design §3): a full run of the real host process at
//! `trace` level — the real `claude` against the project's mock model, in a loopback-only
//! network namespace — with canary secrets everywhere a secret lives: the provider keys in the
//! host's environment (`ANTHROPIC_API_KEY`, `ANTHROPIC_AUTH_TOKEN`, `OPENAI_API_KEY`), a
//! registered agent's `env` in `config.toml`, the relay token (the host dials the reference
//! relay, `examples/relay.rs`, and is also given it again by `host.relay.set`), and the
//! WebSocket grant tokens. None of them may appear in `logs/`, in the database files
//! (`host.db`, `-wal`, `-shm`), or in any reply — IPC lines and WebSocket frames, loopback and
//! relayed — except the one reply that hands a grant token to its caller.
//!
//! The registered agents are wrapper scripts that print the keys they were given to stderr
//! (as an agent that dumps its request headers would) before they run `claude`, or before they
//! fail: the host logs agent stderr at `debug` and quotes its last line in `agent_failed`
//! messages, both redacted by shape (`src/redact.rs`) — the log must show the redaction.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use agent_host::protocol::wire::{self, CmdId, Decoded, PROTOCOL_VERSION, WireMessage, pb};
use agent_host::ws::client::{self, WsClient};
use common::WAIT;
use common::agents::agent_env;
use common::mock_model::MockModel;
use common::world::{Family, TURN, in_netns};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const BOT_TOKEN: &str = "bot-token-the-relay-keeps";

/// The secrets planted, by what they are.
struct Canaries(Vec<(&'static str, String)>);

impl Canaries {
    /// The names of those found in `bytes`, ignoring `allowed`.
    fn found(&self, bytes: &[u8], allowed: Option<&str>) -> Vec<&'static str> {
        self.0
            .iter()
            .filter(|(_, secret)| Some(secret.as_str()) != allowed)
            .filter(|(_, secret)| bytes.windows(secret.len()).any(|w| w == secret.as_bytes()))
            .map(|(name, _)| *name)
            .collect()
    }

    fn get(&self, name: &str) -> &str {
        &self.0.iter().find(|(n, _)| *n == name).unwrap().1
    }
}

/// Everything a client was answered, to be searched at the end.
#[derive(Default)]
struct Replies {
    /// (what, the bytes, the one secret it may carry).
    all: Vec<(String, Vec<u8>, Option<String>)>,
}

impl Replies {
    fn keep(&mut self, what: impl Into<String>, bytes: &[u8], allowed: Option<&str>) {
        self.all
            .push((what.into(), bytes.to_vec(), allowed.map(str::to_owned)));
    }
}

/// The host process and how to talk to it.
struct Host {
    home: PathBuf,
    env: Vec<(String, String)>,
}

impl Host {
    /// The binary, as a user runs it, with the host's environment.
    async fn cli(&self, replies: &mut Replies, command: &str, params: Value) -> Value {
        let out = tokio::process::Command::new(BIN)
            .arg(command)
            .arg(params.to_string())
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output();
        let out = tokio::time::timeout(TURN, out).await.unwrap().unwrap();
        replies.keep(format!("{command} (stdout)"), &out.stdout, None);
        replies.keep(format!("{command} (stderr)"), &out.stderr, None);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{command}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// An IPC request; the reply line is kept (with the one secret it may hand over).
    async fn ok(
        &self,
        replies: &mut Replies,
        command: &str,
        params: Value,
        allowed: Option<&str>,
    ) -> Value {
        let reply = agent_host::ipc::request(
            &self.home.join("host.sock"),
            &json!({"command": command, "params": params}),
            WAIT,
        )
        .await
        .unwrap();
        let line = reply.to_line();
        assert_eq!(reply.code, 0, "{command}: {line}");
        replies.keep(command, line.as_bytes(), allowed);
        reply.data
    }
}

/// A WebSocket client that keeps every frame it is sent.
struct Client {
    ws: WsClient,
    events: Vec<Value>,
    what: String,
}

impl Client {
    async fn connect(url: &str, token: &str, what: &str) -> Client {
        let hello = pb::Hello {
            client_name: "redaction".into(),
            cursor: None,
            protocol_version: PROTOCOL_VERSION,
        };
        let (ws, _) = tokio::time::timeout(WAIT, client::connect(url, token, hello))
            .await
            .unwrap()
            .unwrap();
        Client {
            ws,
            events: Vec::new(),
            what: what.to_owned(),
        }
    }

    async fn next(&mut self, replies: &mut Replies) -> Decoded {
        let frame = tokio::time::timeout(TURN, self.ws.next_frame())
            .await
            .unwrap_or_else(|_| {
                panic!("{}: nothing in {TURN:?}; saw {:?}", self.what, self.kinds())
            })
            .unwrap()
            .expect("connection closed");
        // The frame as it came (protobuf keeps strings as their UTF-8 bytes, and a `Reply`'s
        // data is JSON text inside it).
        let bytes = match frame.with_request_id(frame.request_id) {
            WireMessage::Binary(bytes) => bytes.to_vec(),
            WireMessage::Text(text) => text.into_bytes(),
        };
        replies.keep(format!("{} frame {:?}", self.what, frame.cmd), &bytes, None);
        if let Some(push) = client::event_of(&frame) {
            self.events
                .push(serde_json::from_str(&push.event_json).unwrap());
        }
        frame
    }

    fn kinds(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e["k"].as_str().unwrap_or_default())
            .collect()
    }

    /// Frames until `run`'s `run.end`; returns it.
    async fn run_end(&mut self, replies: &mut Replies, run: &str) -> Value {
        loop {
            self.next(replies).await;
            let last = self.events.last();
            if let Some(e) = last
                && e["k"] == "run.end"
                && e["runId"] == run
            {
                return e.clone();
            }
        }
    }

    /// One envelope command as a `Request` frame; every frame until its `Reply` is kept (the
    /// reply among them, as it came). The command must succeed: its data.
    async fn ok(&mut self, replies: &mut Replies, command: &str, params: Value) -> Value {
        let id = self
            .ws
            .send(CmdId::Request, &wire::request(command, &params))
            .await
            .unwrap();
        loop {
            let frame = self.next(replies).await;
            if frame.cmd != CmdId::EventPush && frame.request_id == id {
                assert_eq!(frame.cmd, CmdId::Reply, "{}: {frame:?}", self.what);
                let reply: pb::Reply = frame.body().unwrap();
                assert_eq!(reply.code, 0, "{command}: {reply:?}");
                return serde_json::from_str(&reply.data_json).unwrap();
            }
        }
    }
}

/// The reference relay, its own process.
async fn start_relay(host_token: &str) -> (tokio::process::Child, String) {
    common::start_reference_relay("127.0.0.1:0", host_token, BOT_TOKEN).await
}

/// A registered agent's script: print the keys it was given to stderr, the way an agent
/// dumping its request would, then `then` (run claude, or fail).
fn wrapper(path: &Path, then: &str) {
    let script = format!(
        "#!/bin/sh\n\
         echo \"wrapper: ANTHROPIC_API_KEY=$ANTHROPIC_API_KEY\" >&2\n\
         echo \"wrapper: using key $ANTHROPIC_API_KEY for the request\" >&2\n\
         echo \"wrapper: WRAPPER_SECRET=$WRAPPER_SECRET\" >&2\n\
         echo \"wrapper: > x-api-key: $ANTHROPIC_API_KEY\" >&2\n\
         echo \"wrapper: > Authorization: Bearer $ANTHROPIC_AUTH_TOKEN\" >&2\n\
         {then}\n"
    );
    std::fs::write(path, script).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// The logs and the database files as they are now: none may hold a canary.
fn check_files(home: &Path, canaries: &Canaries, when: &str) -> usize {
    let mut files = files_under(&home.join("logs"));
    files.extend(
        ["host.db", "host.db-wal", "host.db-shm"]
            .iter()
            .map(|name| home.join(name))
            .filter(|p| p.exists()),
    );
    assert!(files.iter().any(|f| f.ends_with("host.db")));
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let found = canaries.found(&bytes, None);
        assert!(
            found.is_empty(),
            "{when}: {} holds {found:?}",
            file.display()
        );
    }
    files.len()
}

#[test]
fn no_secret_reaches_logs_the_store_or_a_reply() {
    let Some(rt) = in_netns(
        Family::Claude,
        "no_secret_reaches_logs_the_store_or_a_reply",
    ) else {
        return;
    };
    rt.block_on(async {
        let claude = Family::Claude.binary();
        let mock = MockModel::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("host");
        let agent_home = dir.path().join("agent-home");
        let work = dir.path().join("work");
        for d in [&home, &agent_home, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let canaries = Canaries(vec![
            ("ANTHROPIC_API_KEY", format!("sk-ant-api03-canary{tag}")),
            ("ANTHROPIC_AUTH_TOKEN", format!("canary-auth-token-{tag}")),
            ("OPENAI_API_KEY", format!("sk-proj-canary{tag}")),
            ("agents env", format!("canary-agent-env-{tag}")),
            ("relay token", format!("canary-relay-token-{tag}")),
        ]);
        let (mut relay, relay_url) = start_relay(canaries.get("relay token")).await;

        let wrapped = dir.path().join("wrapped-claude.sh");
        wrapper(&wrapped, &format!("exec \"{}\" \"$@\"", claude.display()));
        let failing = dir.path().join("failing-claude.sh");
        wrapper(&failing, "exit 3");
        let agent = |name: &str, script: &Path| {
            format!(
                "[agents.{name}]\ncommand = [\"{}\"]\nprotocol = \"claude-stream-json\"\n\
                 env = {{ WRAPPER_SECRET = \"{}\" }}\n\n",
                script.display(),
                canaries.get("agents env"),
            )
        };
        std::fs::write(
            home.join("config.toml"),
            format!(
                "log_level = \"trace\"\n\n{}{}[relay]\nurl = \"{relay_url}/host\"\n\
                 token = \"{}\"\n[relay.timing]\nconnect_timeout_ms = 500\n\
                 ping_interval_ms = 200\ndead_peer_ms = 10000\nbackoff_min_ms = 20\n\
                 backoff_max_ms = 300\nstable_after_ms = 5000\n",
                agent("wrapped", &wrapped),
                agent("failing", &failing),
                canaries.get("relay token"),
            ),
        )
        .unwrap();

        // The host's environment: what claude needs against the mock, and the canaries.
        let mut env: Vec<(String, String)> = agent_env(&agent_home, &mock)
            .into_iter()
            .filter(|(k, _)| k != "ANTHROPIC_API_KEY")
            .collect();
        for name in [
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "OPENAI_API_KEY",
        ] {
            env.push((name.to_owned(), canaries.get(name).to_owned()));
        }
        env.push(("AGENT_HOST_HOME".to_owned(), home.display().to_string()));
        env.push(("AGENT_HOST_LOG".to_owned(), "trace".to_owned()));
        let host = Host {
            home: home.clone(),
            env,
        };
        let mut replies = Replies::default();

        let started = host.cli(&mut replies, "host.start", json!({})).await;
        assert_eq!(started["code"], 0, "{started}");
        let listed = host.cli(&mut replies, "agent.list", json!({})).await;
        assert_eq!(listed["code"], 0, "{listed}");
        let session = host
            .ok(
                &mut replies,
                "session.create",
                json!({"agent_type": "wrapped", "cwd": work.display().to_string()}),
                None,
            )
            .await["session_id"]
            .as_str()
            .unwrap()
            .to_owned();

        // A subscriber: the one reply that carries its grant token is the one that hands it out.
        let added = host
            .ok(
                &mut replies,
                "subscriber.add",
                json!({"type": "local", "session_id": session, "forward_deltas": true}),
                None,
            )
            .await;
        let token = added["ws_token"].as_str().unwrap().to_owned();
        let endpoint = added["ws_endpoint"].as_str().unwrap().to_owned();
        let subscriber = added["subscriber_id"].as_str().unwrap().to_owned();
        let last = replies.all.last_mut().unwrap();
        last.2 = Some(token.clone());
        let mut local = Client::connect(&endpoint, &token, "loopback").await;

        // A turn by IPC, through the wrapper that prints the keys to stderr.
        let run = host
            .ok(
                &mut replies,
                "session.send",
                json!({"session_id": session, "text": "hello", "client_msg_id": "ipc-1"}),
                None,
            )
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let end = local.run_end(&mut replies, &run).await;
        assert_eq!(end["state"], "completed", "{end}");

        // A second grant, used for a second connection.
        let granted = host
            .ok(
                &mut replies,
                "subscriber.grant",
                json!({"subscriber_id": subscriber}),
                None,
            )
            .await;
        let second_token = granted["ws_token"].as_str().unwrap().to_owned();
        replies.all.last_mut().unwrap().2 = Some(second_token.clone());
        let mut again = Client::connect(&endpoint, &second_token, "loopback 2").await;

        // The relay token given again over IPC; then a turn from a bot through the relay. The
        // configuration is config.toml's own, so the live connection stays (re-setting the
        // connected configuration never drops it: a bot request on it would be cut with
        // `host_unresponsive`). The dead-peer bound is long: this test is not about keepalive,
        // and a loaded machine can stall the relay process for seconds.
        host.ok(
            &mut replies,
            "host.relay.set",
            json!({"url": format!("{relay_url}/host"), "token": canaries.get("relay token"),
                   "timing": {"connect_timeout_ms": 500, "ping_interval_ms": 200,
                              "dead_peer_ms": 10000, "backoff_min_ms": 20,
                              "backoff_max_ms": 300, "stable_after_ms": 5000}}),
            None,
        )
        .await;
        let mut bot = Client::connect(&format!("{relay_url}/bot"), BOT_TOKEN, "bot").await;
        // Answered once the host has dialed in (the relay holds it until then).
        bot.ok(&mut replies, "session.list", json!({})).await;
        let answer = bot
            .ok(
                &mut replies,
                "session.send",
                json!({"session_id": session, "text": "and through the relay",
                       "client_msg_id": "bot-1"}),
            )
            .await;
        let relayed = answer["run_id"].as_str().unwrap().to_owned();
        let end = bot.run_end(&mut replies, &relayed).await;
        assert_eq!(end["state"], "completed", "{end}");
        local.run_end(&mut replies, &relayed).await;
        again.run_end(&mut replies, &relayed).await;

        // An agent that fails after printing the keys: its last stderr line is quoted.
        let failing_session = host
            .ok(
                &mut replies,
                "session.create",
                json!({"agent_type": "failing", "cwd": work.display().to_string()}),
                None,
            )
            .await["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut watcher = {
            let added = host
                .ok(
                    &mut replies,
                    "subscriber.add",
                    json!({"type": "local", "session_id": failing_session}),
                    None,
                )
                .await;
            let token = added["ws_token"].as_str().unwrap().to_owned();
            replies.all.last_mut().unwrap().2 = Some(token.clone());
            Client::connect(added["ws_endpoint"].as_str().unwrap(), &token, "failing").await
        };
        let failed_run = host
            .ok(
                &mut replies,
                "session.send",
                json!({"session_id": failing_session, "text": "fail"}),
                None,
            )
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let end = watcher.run_end(&mut replies, &failed_run).await;
        assert_eq!(end["state"], "failed", "{end}");
        let message = end["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("[REDACTED]"),
            "the quoted stderr line was not redacted: {end}"
        );

        // Everything a client can read back.
        for (command, params) in [
            ("host.status", json!({})),
            ("session.list", json!({})),
            ("session.get", json!({"session_id": session})),
            (
                "session.history",
                json!({"session_id": session, "limit": 5000}),
            ),
            (
                "session.history",
                json!({"session_id": failing_session, "limit": 5000}),
            ),
            ("subscriber.list", json!({})),
        ] {
            host.ok(&mut replies, command, params, None).await;
        }
        // The same over the WebSocket, loopback and relayed (what the runs listing read back
        // is in session.get and the history's run events now).
        for client in [&mut local, &mut bot] {
            let history = client
                .ok(
                    &mut replies,
                    "session.history",
                    json!({"session_id": session, "limit": 5000}),
                )
                .await;
            assert!(
                history["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["kind"] == "run.end" && e["run_id"] == relayed.as_str()),
                "{history}"
            );
            client
                .ok(&mut replies, "session.get", json!({"session_id": session}))
                .await;
            client.ok(&mut replies, "session.list", json!({})).await;
        }
        let while_running = check_files(&home, &canaries, "while running");

        let grants = Canaries(vec![
            ("grant token", token.clone()),
            ("second grant token", second_token.clone()),
        ]);

        let stopped = host.cli(&mut replies, "host.shutdown", json!({})).await;
        assert_eq!(stopped["code"], 0, "{stopped}");
        relay.kill().await.unwrap();
        let after = check_files(&home, &canaries, "after shutdown");
        check_files(&home, &grants, "after shutdown");
        for (what, bytes, allowed) in &replies.all {
            let mut found = canaries.found(bytes, None);
            // Grant tokens: each only in the reply that hands it out.
            for (name, grant) in [
                ("grant token", &token),
                ("second grant token", &second_token),
            ] {
                let here = bytes.windows(grant.len()).any(|w| w == grant.as_bytes());
                if here && allowed.as_deref() != Some(grant.as_str()) {
                    found.push(name);
                }
            }
            assert!(
                found.is_empty(),
                "the reply {what} holds {found:?}: {}",
                String::from_utf8_lossy(bytes)
            );
        }

        // The run was really at trace, and agent stderr really reached the log, redacted.
        let log = std::fs::read_to_string(home.join("logs/host.log")).unwrap();
        assert!(log.contains(" TRACE "), "the host did not log at trace");
        let stderr_lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("stderr: wrapper:"))
            .collect();
        for shown in [
            "ANTHROPIC_API_KEY=[REDACTED]",
            "using key [REDACTED] for",
            "WRAPPER_SECRET=[REDACTED]",
            "x-api-key: [REDACTED]",
            "Authorization: [REDACTED]",
        ] {
            assert!(
                stderr_lines.iter().any(|l| l.contains(shown)),
                "no agent stderr line with {shown:?} in the log: {stderr_lines:#?}"
            );
        }
        eprintln!(
            "checked {} replies and frames, {while_running} files while running, {after} after \
             the shutdown; {} redacted stderr lines logged",
            replies.all.len(),
            stderr_lines.len()
        );
    });
}
