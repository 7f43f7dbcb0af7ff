//! ACP cases the real agents do not show on demand, with a scripted ACP agent
//! (`tests/support/fake-acp.js`, run by node) registered in `config.toml` like any user's agent:
//! an agent that can only `session/load` (and replays part of the history after its answer), one
//! that answers a resume with another session, and one that prints junk and dies mid-turn.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};

use common::world::{Follower, TURN, follow, run_end, text_of_run};
use common::{Agents, TestHost};
use serde_json::{Value, json};

struct Fake {
    dir: tempfile::TempDir,
    work: PathBuf,
    host: Option<TestHost>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake-acp.js")
}

impl Fake {
    async fn start() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let home = dir.path().join("host");
        std::fs::create_dir_all(&home).unwrap();
        let agent = |name: &str, mode: &str| {
            format!(
                "[agents.{name}]\ncommand = [\"node\", \"{}\"]\nprotocol = \"acp\"\n\
                 env = {{ FAKE_ACP_MODE = \"{mode}\" }}\n",
                script().display()
            )
        };
        std::fs::write(
            home.join("config.toml"),
            [
                agent("fake-load", "load-only"),
                agent("fake-newid", "new-on-resume"),
                agent("fake-junk", "junk-and-die"),
                agent("fake-hang", "hang-on-new"),
                agent("fake-huge", "huge-block"),
                agent("fake-failnew", "fail-new"),
            ]
            .concat(),
        )
        .unwrap();
        let mut fake = Fake {
            dir,
            work,
            host: None,
        };
        fake.host = Some(TestHost::start_with_agents(&home, fake.agents()).await);
        fake
    }

    fn agents(&self) -> Agents {
        let home = self.dir.path().join("agent-home");
        std::fs::create_dir_all(&home).unwrap();
        Agents {
            env: vec![
                ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
                ("HOME".to_owned(), home.display().to_string()),
            ],
            family_env: Vec::new(),
            claude: None,
            codex: None,
        }
    }

    fn host(&self) -> &TestHost {
        self.host.as_ref().unwrap()
    }

    async fn restart(&mut self) {
        let host = self.host.take().unwrap();
        self.host = Some(host.restart().await);
    }

    async fn turn(&self, f: &mut Follower, session: &str, text: &str) -> (String, Value) {
        let run = self
            .host()
            .ok("session.send", json!({"session_id": session, "text": text}))
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let end = run_end(f, &run, TURN).await;
        (run, end)
    }

    async fn history(&self, session: &str) -> Vec<Value> {
        self.host()
            .ok(
                "session.history",
                json!({"session_id": session, "limit": 5000}),
            )
            .await["events"]
            .as_array()
            .unwrap()
            .clone()
    }
}

/// An agent that can only `session/load`: after a restart the session is loaded (the history
/// is there: three turns seen), and the replay — part of it after the load answer — is not
/// published again: the stored events of the earlier runs are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_only_agent_resumes_by_load_without_republishing_its_replay() {
    let mut fake = Fake::start().await;
    let session = fake.host().session_of("fake-load", &fake.work).await;
    let mut f = follow(fake.host(), &session, false).await;
    fake.turn(&mut f, &session, "one").await;
    let (second, _) = fake.turn(&mut f, &session, "two").await;
    assert!(text_of_run(&f, &second).contains("[turns: 2]"));
    let before = fake.history(&session).await;

    fake.restart().await;
    let mut g = follow(fake.host(), &session, false).await;
    let (third, end) = fake.turn(&mut g, &session, "three").await;
    assert_eq!(end["state"], "completed", "{end}");
    let text = text_of_run(&g, &third);
    assert_eq!(text, "echo: three [turns: 3]", "the session was not loaded");
    let after = fake.history(&session).await;
    // The session's own state changes are left out: the `idle` after a run's `run.end` may
    // land after the first read (tests/suite/session_states.rs covers them).
    let not_state = |e: &Value| e["kind"] != "session.state";
    let before: Vec<Value> = before.into_iter().filter(not_state).collect();
    let (old, new): (Vec<Value>, Vec<Value>) = after
        .into_iter()
        .filter(not_state)
        .partition(|e| e["run_id"] != third.as_str());
    assert_eq!(old, before, "the replay was published again");
    let texts: Vec<&Value> = new.iter().filter(|e| e["kind"] == "text.end").collect();
    assert_eq!(texts.len(), 1, "{new:?}");
    fake.host.unwrap().stop().await;
}

/// An agent that answers a resume with another session: the host says so (a `warning`
/// `resume_rejected` naming both) and binds the session it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_resumes_into_another_session_is_reported() {
    let mut fake = Fake::start().await;
    let session = fake.host().session_of("fake-newid", &fake.work).await;
    let mut f = follow(fake.host(), &session, false).await;
    fake.turn(&mut f, &session, "one").await;
    let native = fake
        .host()
        .ok("session.get", json!({"session_id": session}))
        .await["native_session_id"]
        .as_str()
        .unwrap()
        .to_owned();

    fake.restart().await;
    let mut g = follow(fake.host(), &session, false).await;
    let (run, end) = fake.turn(&mut g, &session, "two").await;
    assert_eq!(end["state"], "completed", "{end}");
    let warning = g
        .of_run(&run)
        .iter()
        .find(|s| s.kind() == "warning" && s.event["code"] == "resume_rejected")
        .map(|s| s.event.clone())
        .unwrap_or_else(|| panic!("no warning: {:?}", g.kinds()));
    let message = warning["message"].as_str().unwrap();
    assert!(message.contains(&native), "{message}");
    let row = fake
        .host()
        .ok("session.get", json!({"session_id": session}))
        .await;
    let now = row["native_session_id"].as_str().unwrap();
    assert!(now.starts_with("fake-other-"), "{row}");
    assert!(message.contains(now), "{message}");
    fake.host.unwrap().stop().await;
}

/// An agent that prints junk and dies mid-turn (its `session/prompt` went out, no answer came):
/// the run ends `failed` / `result_delivery_unknown` with the exit status, and the host goes on
/// serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_agent_that_prints_junk_and_dies_fails_the_run() {
    let fake = Fake::start().await;
    let session = fake.host().session_of("fake-junk", &fake.work).await;
    let mut f = follow(fake.host(), &session, false).await;
    let (_, end) = fake.turn(&mut f, &session, "hello?").await;
    assert_eq!(end["state"], "failed", "{end}");
    assert_eq!(end["category"], "result_delivery_unknown");
    assert!(
        end["message"].as_str().unwrap().contains("exit status: 3"),
        "{end}"
    );
    // Again, in a new process: the same honest failure, and the host answers throughout.
    let (_, again) = fake.turn(&mut f, &session, "still?").await;
    assert_eq!(again["state"], "failed");
    fake.host()
        .ok("session.get", json!({"session_id": session}))
        .await;
    fake.host.unwrap().stop().await;
}

/// An agent that never answers `session/new`: the prompt waits, and when the host stops, the
/// driver honours the close while still opening — the agent's process group is gone when the
/// host has stopped, instead of living on until the open timeout (90 s) — and the run ends
/// `interrupted`, as any run the host stops under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_is_stopped_with_the_host() {
    let fake = Fake::start().await;
    let session = fake.host().session_of("fake-hang", &fake.work).await;
    let mut f = follow(fake.host(), &session, false).await;
    let run = fake
        .host()
        .ok(
            "session.send",
            json!({"session_id": session, "text": "anyone?"}),
        )
        .await["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.until("the run's start", TURN, |s| {
        s.kind() == "run.start" && s.run_id == run
    })
    .await;
    let live = fake
        .host()
        .ok("session.get", json!({"session_id": session}))
        .await;
    let pid = i32::try_from(live["live"]["agent_pid"].as_u64().unwrap()).unwrap();
    assert!(common::agents::group_alive(pid));
    let home = fake.host().home.clone();
    fake.host.unwrap().stop().await;
    assert!(
        !common::agents::group_alive(pid),
        "the hung agent outlived the host's stop"
    );
    let host = TestHost::start(&home).await;
    let history = host
        .ok(
            "session.history",
            json!({"session_id": session, "limit": 5000}),
        )
        .await;
    let end = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "run.end" && e["run_id"] == run.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no run.end: {history}"));
    assert!(end.to_string().contains("interrupted"), "{end}");
    host.stop().await;
}

/// Defect: a 5 MiB text block became an `event_too_large` warning and its `text.start` was
/// never closed. Now every `*.start` gets its `*.end`: the end holds the start of the text,
/// marked `truncated` with the full size, and fits the 4 MiB event limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_over_the_event_limit_is_closed_truncated() {
    let fake = Fake::start().await;
    let session = fake.host().session_of("fake-huge", &fake.work).await;
    let mut f = follow(fake.host(), &session, false).await;
    let (run, end) = fake.turn(&mut f, &session, "big one").await;
    assert_eq!(end["state"], "completed", "{end}");
    let history = fake.history(&session).await;
    let of_run: Vec<&Value> = history
        .iter()
        .filter(|e| e["run_id"] == json!(run))
        .map(|e| &e["event"])
        .collect();
    let starts = of_run.iter().filter(|e| e["k"] == "text.start").count();
    let ends: Vec<&&Value> = of_run.iter().filter(|e| e["k"] == "text.end").collect();
    assert_eq!(starts, 1, "{of_run:?}");
    assert_eq!(ends.len(), 1, "the text.start was not closed");
    let end = ends[0];
    let full = 6 + 5 * 1024 * 1024;
    assert_eq!(
        end["truncated"]["fullBytes"],
        json!(full),
        "{}",
        end["truncated"]
    );
    let kept = end["text"].as_str().unwrap();
    assert!(kept.starts_with("start xxx"));
    assert_eq!(end["truncated"]["keptBytes"], json!(kept.len()));
    assert!(kept.len() < agent_host::bus::MAX_EVENT_BYTES);
    assert!(
        kept.len() > 3 * 1024 * 1024,
        "kept only {} bytes",
        kept.len()
    );
    fake.host.unwrap().stop().await;
}

/// Defect: an ACP agent failed with only `session/new failed: Internal error`, while its
/// JSON-RPC error `data` said why. The run's `error` event and `run.end` carry the agent's own
/// detail (the error data and its last stderr lines, with secrets redacted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_failure_carries_the_agents_own_detail() {
    let fake = Fake::start().await;
    let session = fake.host().session_of("fake-failnew", &fake.work).await;
    let mut f = follow(fake.host(), &session, false).await;
    let (run, end) = fake.turn(&mut f, &session, "hello?").await;
    assert_eq!(end["state"], "failed", "{end}");
    let message = end["message"].as_str().unwrap();
    assert!(message.contains("Internal error"), "{message}");
    assert!(
        message.contains("Claude Code process exited with code 1"),
        "{message}"
    );
    assert!(
        message.contains("invalid configuration at line 3"),
        "{message}"
    );
    assert!(
        !message.contains("fakefakefake"),
        "a secret reached the event: {message}"
    );
    assert!(
        message.contains("ANTHROPIC_API_KEY=[REDACTED]"),
        "{message}"
    );
    let history = fake.history(&session).await;
    let error = history
        .iter()
        .find(|e| e["run_id"] == json!(run) && e["event"]["k"] == "error")
        .unwrap();
    assert!(
        error["event"]["message"]
            .as_str()
            .unwrap()
            .contains("Claude Code process exited with code 1"),
        "{error}"
    );
    fake.host.unwrap().stop().await;
}
