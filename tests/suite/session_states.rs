//! Session states through the whole host (issue 14): "needs you" is a state. A scripted ACP
//! agent (`tests/support/permission-acp.js`, run by node, registered in `config.toml` like any
//! user's agent) asks for permission; while a request is pending the session is `waiting` in
//! `session.get` and `session.list`, and a WebSocket follower is sent each change as one
//! `session.state` bracket. Activation, renaming and the list of pending requests through IPC.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};

use common::world::{Follower, Seen, TURN, follow, run_end, text_of_run};
use common::{Agents, TestHost};
use serde_json::{Value, json};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/permission-acp.js")
}

/// A host whose `config.toml` registers the asking agent as `asker`, and a workspace.
struct Asker {
    dir: tempfile::TempDir,
    work: PathBuf,
    host: TestHost,
}

impl Asker {
    async fn start() -> Asker {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let home = dir.path().join("host");
        std::fs::create_dir_all(&home).unwrap();
        let pids = dir.path().join("pids");
        std::fs::write(
            home.join("config.toml"),
            format!(
                "[agents.asker]\ncommand = [\"node\", \"{}\"]\nprotocol = \"acp\"\n\
                 env = {{ PERMISSION_ACP_PIDS = \"{}\" }}\n",
                script().display(),
                pids.display()
            ),
        )
        .unwrap();
        let agent_home = dir.path().join("agent-home");
        std::fs::create_dir_all(&agent_home).unwrap();
        let agents = Agents {
            env: vec![
                ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
                ("HOME".to_owned(), agent_home.display().to_string()),
            ],
            family_env: Vec::new(),
            claude: None,
            codex: None,
        };
        let host = TestHost::start_with_agents(&home, agents).await;
        Asker { dir, work, host }
    }

    async fn session(&self) -> String {
        self.host.session_of("asker", &self.work).await
    }

    async fn send(&self, session: &str, text: &str) -> String {
        self.host
            .ok("session.send", json!({"session_id": session, "text": text}))
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn state(&self, session: &str) -> String {
        let row = self
            .host
            .ok("session.get", json!({"session_id": session}))
            .await;
        row["state"].as_str().unwrap().to_owned()
    }

    async fn listed_state(&self, session: &str) -> String {
        let list = self.host.ok("session.list", json!({})).await;
        let row = list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["session_id"] == session)
            .unwrap_or_else(|| panic!("{session} not listed: {list}"))
            .clone();
        row["state"].as_str().unwrap().to_owned()
    }

    async fn answer(&self, session: &str, request: &str, decision: &str) {
        self.host
            .ok(
                "permission.respond",
                json!({"session_id": session, "request_id": request, "decision": decision}),
            )
            .await;
    }

    /// The agent processes started so far (each writes its pid when it starts).
    fn agent_pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.path().join("pids"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }
}

/// The next `session.state` bracket: (state, previous).
async fn next_state(f: &mut Follower) -> (String, String) {
    let seen = f.until_kind("session.state", TURN).await;
    (
        seen.event["state"].as_str().unwrap().to_owned(),
        seen.event["previous"].as_str().unwrap().to_owned(),
    )
}

fn states(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|s| s.kind() == "session.state")
        .map(|s| s.event["state"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_permission_makes_the_session_waiting_until_it_is_answered() {
    let asker = Asker::start().await;
    let session = asker.session().await;
    assert_eq!(asker.state(&session).await, "idle");
    let mut f = follow(&asker.host, &session, false).await;

    let run = asker.send(&session, "ASK 1").await;
    assert_eq!(
        next_state(&mut f).await,
        ("running".to_owned(), "idle".to_owned())
    );
    assert_eq!(
        next_state(&mut f).await,
        ("waiting".to_owned(), "running".to_owned())
    );
    // The change is in the row before its bracket goes out.
    assert_eq!(asker.state(&session).await, "waiting");
    assert_eq!(asker.listed_state(&session).await, "waiting");
    let request = f
        .seen
        .iter()
        .find(|s| s.kind() == "permission.request")
        .map(|s| s.event["requestId"].as_str().unwrap().to_owned())
        .expect("the request comes before the state that waits for it");

    asker.answer(&session, &request, "allow").await;
    assert_eq!(
        next_state(&mut f).await,
        ("running".to_owned(), "waiting".to_owned())
    );
    let end = run_end(&mut f, &run, TURN).await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(
        next_state(&mut f).await,
        ("idle".to_owned(), "running".to_owned())
    );
    assert_eq!(text_of_run(&f, &run), "answered: once-1");
    assert_eq!(asker.state(&session).await, "idle");
    assert_eq!(asker.listed_state(&session).await, "idle");

    // In the run's order: run.start, running, the request, waiting, its answer, running,
    // run.end, idle. Every state bracket of the run carries its id; `idle` comes after it.
    let order: Vec<&str> = f
        .seen
        .iter()
        .filter(|s| {
            matches!(
                s.kind(),
                "run.start"
                    | "run.end"
                    | "session.state"
                    | "permission.request"
                    | "permission.resolved"
            )
        })
        .map(Seen::kind)
        .collect();
    assert_eq!(
        order,
        [
            "run.start",
            "session.state",
            "permission.request",
            "session.state",
            "permission.resolved",
            "session.state",
            "run.end",
            "session.state"
        ]
    );
    assert_eq!(states(&f.seen), ["running", "waiting", "running", "idle"]);

    // History has them too: a follower that comes later replays the same brackets.
    let history = asker
        .host
        .ok(
            "session.history",
            json!({"session_id": session, "limit": 5000}),
        )
        .await;
    let replayed: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "session.state")
        .map(|e| e["event"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(replayed, ["running", "waiting", "running", "idle"]);
    asker.host.stop().await;
}

/// Two requests: the first answer leaves the session waiting, the last one ends the wait; a
/// turn without requests goes running → idle and no further.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_waits_until_its_last_request_is_answered() {
    let asker = Asker::start().await;
    let session = asker.session().await;
    let mut f = follow(&asker.host, &session, false).await;
    let run = asker.send(&session, "ASK 2").await;
    next_state(&mut f).await;
    assert_eq!(next_state(&mut f).await.0, "waiting");
    let second = f
        .until("the second request", TURN, |s| {
            s.kind() == "permission.request"
                && s.event["requestId"]
                    .as_str()
                    .is_some_and(|id| id.ends_with("-2"))
        })
        .await;
    let first = f
        .seen
        .iter()
        .find(|s| s.kind() == "permission.request")
        .map(|s| s.event["requestId"].as_str().unwrap().to_owned())
        .unwrap();
    asker.answer(&session, &first, "deny").await;
    f.until("the first answer", TURN, |s| {
        s.kind() == "permission.resolved" && s.event["requestId"] == first.as_str()
    })
    .await;
    assert_eq!(asker.state(&session).await, "waiting");
    asker
        .answer(
            &session,
            second.event["requestId"].as_str().unwrap(),
            "allow",
        )
        .await;
    assert_eq!(
        next_state(&mut f).await,
        ("running".to_owned(), "waiting".to_owned())
    );
    run_end(&mut f, &run, TURN).await;
    assert_eq!(next_state(&mut f).await.0, "idle");
    assert_eq!(text_of_run(&f, &run), "answered: no-1,once-2");

    let plain = asker.send(&session, "hello").await;
    run_end(&mut f, &plain, TURN).await;
    assert_eq!(
        next_state(&mut f).await,
        ("idle".to_owned(), "running".to_owned())
    );
    assert_eq!(
        states(&f.seen),
        ["running", "waiting", "running", "idle", "running", "idle"]
    );
    asker.host.stop().await;
}

/// `session.activate`, `session.rename` and `permission.list` over IPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activate_rename_and_the_pending_list_over_ipc() {
    let asker = Asker::start().await;
    let session = asker.session().await;
    let mut f = follow(&asker.host, &session, false).await;

    // Activation starts the agent before any prompt; a second one finds it running.
    let first = asker
        .host
        .ok("session.activate", json!({"session_id": session}))
        .await;
    assert_eq!(first["session_id"], session.as_str());
    assert_eq!(first["already"], false);
    let pid = first["agent_pid"].as_u64().expect("no agent pid") as u32;
    let row = asker
        .host
        .ok("session.get", json!({"session_id": session}))
        .await;
    assert_eq!(row["live"]["agent_pid"], pid);
    let again = asker
        .host
        .ok("session.activate", json!({"session_id": session}))
        .await;
    assert_eq!(
        (&again["already"], &again["agent_pid"]),
        (&json!(true), &json!(pid))
    );
    let missing = asker
        .host
        .ipc("session.activate", json!({"session_id": "nope"}))
        .await;
    assert_eq!(missing.data["error"], "session_not_found");

    // The prompt goes to that agent (it wrote its pid as it started, before it answered
    // anything): no second process.
    let run = asker.send(&session, "ASK 1").await;
    f.until_kind("permission.request", TURN).await;
    assert_eq!(asker.agent_pids(), [pid]);
    let listed = asker
        .host
        .ok("permission.list", json!({"session_id": session}))
        .await;
    let pending = listed["permissions"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{listed}");
    assert_eq!(pending[0]["session_id"], session.as_str());
    assert_eq!(pending[0]["run_id"], run.as_str());
    // The agent's own options, as it offered them.
    assert_eq!(
        pending[0]["options"],
        json!([{"id": "once-1", "label": "Allow once", "kind": "allow_once"},
               {"id": "no-1", "label": "Reject", "kind": "reject_once"}])
    );
    assert_eq!(pending[0]["input"], json!({"command": "ls 1"}));
    let all = asker.host.ok("permission.list", json!({})).await;
    assert_eq!(all["permissions"], listed["permissions"]);
    let request = pending[0]["request_id"].as_str().unwrap().to_owned();
    asker.answer(&session, &request, "allow").await;
    run_end(&mut f, &run, TURN).await;
    let none: Value = asker
        .host
        .ok("permission.list", json!({"session_id": session}))
        .await;
    assert_eq!(none["permissions"], json!([]));

    let renamed = asker
        .host
        .ok(
            "session.rename",
            json!({"session_id": session, "title": " a name "}),
        )
        .await;
    assert_eq!(renamed["session"]["title"], "a name");
    let empty = asker
        .host
        .ipc(
            "session.rename",
            json!({"session_id": session, "title": "  "}),
        )
        .await;
    assert_eq!(empty.data["error"], "invalid_params");
    asker.host.stop().await;
}
