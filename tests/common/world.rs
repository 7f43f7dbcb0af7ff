//! A world for tests that drive a real agent CLI through the whole host: the project's mock
//! model, a host running the pinned CLI against it, a workspace, and WebSocket followers that
//! record what they are sent.

use std::path::PathBuf;
use std::time::Duration;

use agent_host::protocol::envelope::Reply;
use agent_host::protocol::wire::{Decoded, PROTOCOL_VERSION, pb};
use agent_host::ws::client::{self, WsClient};
use serde_json::{Value, json};

use super::agents::{
    agent_env, codex_env, ensure_claude, ensure_codex, in_loopback_only_netns, write_codex_config,
};
use super::mock_model::MockModel;
use super::{Agents, TestHost};

/// How long a real turn against the mock may take.
pub const TURN: Duration = Duration::from_secs(60);

/// The agent family a test drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Claude,
    Codex,
}

impl Family {
    pub fn agent_type(self) -> &'static str {
        match self {
            Family::Claude => "claude",
            Family::Codex => "codex",
        }
    }

    /// The pinned CLI, installed if missing.
    pub fn binary(self) -> PathBuf {
        match self {
            Family::Claude => ensure_claude(),
            Family::Codex => ensure_codex(),
        }
    }
}

/// In the namespace child: a runtime to run the test on. In the parent: `None` (the child ran
/// it, and passed).
pub fn in_netns(family: Family, test: &str) -> Option<tokio::runtime::Runtime> {
    family.binary();
    if !in_loopback_only_netns(test) {
        return None;
    }
    Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    )
}

/// A mock model, a host that runs one family's real CLI against it, and a workspace.
pub struct World {
    pub family: Family,
    pub dir: tempfile::TempDir,
    pub mock: MockModel,
    pub work: PathBuf,
    pub host: Option<TestHost>,
}

impl World {
    pub async fn start(family: Family) -> World {
        let mock = MockModel::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(dir.path().join("agent-home")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let mut world = World {
            family,
            dir,
            mock,
            work,
            host: None,
        };
        let host =
            TestHost::start_with_agents(&world.dir.path().join("host"), world.agents()).await;
        world.host = Some(host);
        world
    }

    /// The agents' environment and binary: a private HOME (and CODEX_HOME with a config that
    /// points at the mock), and a surrounding agent's marker that must not reach the children.
    pub fn agents(&self) -> Agents {
        let home = self.dir.path().join("agent-home");
        let (mut env, family_env) = match self.family {
            Family::Claude => (agent_env(&home, &self.mock), Vec::new()),
            Family::Codex => {
                write_codex_config(&home.join(".codex"), &self.mock);
                // The mock provider's key goes in `[agents.codex] env`: this world's host
                // shares the test process's environment, which must not carry it. (A host
                // also passes a key Codex's config.toml names from its own environment:
                // tests/suite/codex_provider.rs.)
                codex_env(&home, &self.mock)
                    .into_iter()
                    .partition(|(k, _)| k != "MOCK_API_KEY")
            }
        };
        env.push(("CLAUDECODE".to_owned(), "1".to_owned()));
        let binary = self.family.binary();
        match self.family {
            Family::Claude => Agents {
                env,
                family_env,
                claude: Some(binary),
                codex: None,
            },
            Family::Codex => Agents {
                env,
                family_env,
                claude: None,
                codex: Some(binary),
            },
        }
    }

    pub fn host(&self) -> &TestHost {
        self.host.as_ref().unwrap()
    }

    pub async fn restart(&mut self) {
        let host = self.host.take().unwrap();
        self.host = Some(host.restart().await);
    }

    pub async fn session(&self) -> String {
        self.host()
            .session_of(self.family.agent_type(), &self.work)
            .await
    }

    /// Start the host again after `host.take().stop()`.
    pub async fn restart_from_stopped(&mut self) {
        let host = TestHost::start_with_agents(&self.dir.path().join("host"), self.agents()).await;
        self.host = Some(host);
    }

    pub async fn send(&self, session: &str, text: &str) -> String {
        let data = self
            .host()
            .ok("session.send", json!({"session_id": session, "text": text}))
            .await;
        data["run_id"].as_str().unwrap().to_owned()
    }

    /// A whole turn: send, and wait for its `run.end` on `ws`.
    pub async fn turn(&self, ws: &mut Follower, session: &str, text: &str) -> String {
        let run = self.send(session, text).await;
        run_end(ws, &run, TURN).await;
        run
    }

    /// Send a `SLOW` prompt and wait until its text streams.
    pub async fn streaming(&self, ws: &mut Follower, session: &str, text: &str) -> String {
        let run = self.send(session, &format!("SLOW {text}")).await;
        let id = run.clone();
        ws.until("a delta of the slow run", TURN, |s| {
            s.kind() == "text.delta" && s.run_id == id
        })
        .await;
        run
    }

    pub async fn native_id(&self, session: &str) -> String {
        let row = self
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        row["native_session_id"].as_str().unwrap().to_owned()
    }

    pub async fn agent_pid(&self, session: &str) -> i32 {
        let row = self
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        i32::try_from(row["live"]["agent_pid"].as_u64().expect("no live agent")).unwrap()
    }

    pub async fn follower(&self, session: &str, deltas: bool) -> Follower {
        follow(self.host(), session, deltas).await
    }
}

/// A new local subscriber of `session` on `host`, connected over the loopback WebSocket.
pub async fn follow(host: &TestHost, session: &str, deltas: bool) -> Follower {
    let data = host
        .ok(
            "subscriber.add",
            json!({"type": "local", "session_id": session, "forward_deltas": deltas,
                   "replay_mode": "since_cursor"}),
        )
        .await;
    connect_follower(&data, "world-test", None).await
}

/// Connect the subscriber a `subscriber.add` or `subscriber.grant` answer (`data`) describes
/// over the loopback WebSocket, from `cursor` (`None`: its stored one).
pub async fn connect_follower(data: &Value, client_name: &str, cursor: Option<i64>) -> Follower {
    let hello = pb::Hello {
        client_name: client_name.into(),
        cursor,
        protocol_version: PROTOCOL_VERSION,
    };
    let (ws, _) = client::connect(
        data["ws_endpoint"].as_str().unwrap(),
        data["ws_token"].as_str().unwrap(),
        hello,
    )
    .await
    .unwrap();
    Follower {
        ws,
        subscriber_id: data["subscriber_id"].as_str().unwrap().to_owned(),
        seen: Vec::new(),
    }
}

/// One event a follower received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub seq: i64,
    pub run_id: String,
    pub delta: bool,
    pub event: Value,
}

impl Seen {
    pub fn kind(&self) -> &str {
        self.event["k"].as_str().unwrap_or_default()
    }
}

pub struct Follower {
    pub ws: WsClient,
    pub subscriber_id: String,
    pub seen: Vec<Seen>,
}

impl Follower {
    pub fn record(&mut self, frame: &Decoded) -> Option<Seen> {
        let push = client::event_of(frame)?;
        let seen = Seen {
            seq: push.sequence_id,
            run_id: push.run_id,
            delta: push.is_delta,
            event: serde_json::from_str(&push.event_json).unwrap(),
        };
        self.seen.push(seen.clone());
        Some(seen)
    }

    /// Events until one matches; returns it.
    pub async fn until(
        &mut self,
        what: &str,
        wait: Duration,
        pred: impl Fn(&Seen) -> bool,
    ) -> Seen {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.ws.next_frame())
                .await
                .unwrap_or_else(|_| panic!("no {what} in {wait:?}; saw {:#?}", self.kinds()))
                .unwrap()
                .expect("connection closed");
            if let Some(seen) = self.record(&frame)
                && pred(&seen)
            {
                return seen;
            }
        }
    }

    pub async fn until_kind(&mut self, kind: &str, wait: Duration) -> Seen {
        self.until(kind, wait, |s| s.kind() == kind).await
    }

    /// Run one envelope command over the connection (a `Request` frame) and wait for its
    /// `Reply`. Pushes that arrive meanwhile are kept by the client, in order, and recorded by
    /// the next [`Follower::until`]. A frame-level refusal (`ErrorResp`) fails the test.
    pub async fn request(&mut self, command: &str, params: Value) -> Reply {
        tokio::time::timeout(super::WAIT, self.ws.request(command, params))
            .await
            .unwrap_or_else(|_| panic!("no reply to {command}"))
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    }

    /// [`Follower::request`] for a command that must succeed: its reply's data.
    pub async fn ok(&mut self, command: &str, params: Value) -> Value {
        let reply = self.request(command, params).await;
        assert_eq!(reply.code, 0, "{command}: {}", reply.to_line());
        reply.data
    }

    /// [`Follower::request`] for a command that must fail with `code` (whose name is in
    /// `data.error`, as over IPC): the reply.
    pub async fn refused(&mut self, command: &str, params: Value, code: i32, name: &str) -> Reply {
        let reply = self.request(command, params).await;
        assert_eq!(
            (reply.code, reply.data["error"].as_str()),
            (code, Some(name)),
            "{command}: {}",
            reply.to_line()
        );
        reply
    }

    pub fn kinds(&self) -> Vec<String> {
        self.seen.iter().map(|s| s.kind().to_owned()).collect()
    }

    /// Brackets only, as (sequence id, kind).
    pub fn brackets(&self) -> Vec<(i64, String)> {
        self.seen
            .iter()
            .filter(|s| !s.delta)
            .map(|s| (s.seq, s.kind().to_owned()))
            .collect()
    }

    pub fn of_run(&self, run_id: &str) -> Vec<&Seen> {
        self.seen.iter().filter(|s| s.run_id == run_id).collect()
    }
}

pub fn text_of_run(follower: &Follower, run_id: &str) -> String {
    follower
        .of_run(run_id)
        .iter()
        .filter(|s| s.kind() == "text.end")
        .map(|s| s.event["text"].as_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join("")
}

pub fn run_end_of(follower: &Follower, run_id: &str) -> Value {
    follower
        .of_run(run_id)
        .iter()
        .find(|s| s.kind() == "run.end")
        .map(|s| s.event.clone())
        .unwrap_or_else(|| panic!("no run.end for {run_id}"))
}

/// Wait for `run_id`'s `run.end`.
pub async fn run_end(f: &mut Follower, run_id: &str, wait: Duration) -> Value {
    let id = run_id.to_owned();
    f.until("run.end", wait, |s| s.kind() == "run.end" && s.run_id == id)
        .await
        .event
}
