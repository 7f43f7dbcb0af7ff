//! Agents that misbehave, through the whole host: a binary that is not there, one that prints
//! junk and dies mid-turn, one that ignores the interrupt. Each is a real child process (a
//! shell script standing in for `claude`); none touches the network. Every run still ends with
//! a clear `run.end`, the session takes the next prompt, and nothing accepted is lost.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_host::adapter::reap::exit_of;
use agent_host::bus::{Replay, SubscribeOptions};
use agent_host::store::SessionFilter;
use common::agents::group_alive;
use common::{Agents, TestHost, WAIT};
use serde_json::{Value, json};

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

async fn host_with(dir: &Path, claude: PathBuf) -> TestHost {
    let agents = Agents {
        env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
        family_env: Vec::new(),
        claude: Some(claude),
        codex: None,
    };
    TestHost::start_with_agents(&dir.join("host"), agents).await
}

/// The events of `session` from the bus, until `run_id`'s `run.end`.
async fn until_run_end(
    sub: &mut agent_host::bus::Subscription,
    run_id: &str,
) -> (Vec<Value>, Value) {
    let mut seen = Vec::new();
    loop {
        let delivery = tokio::time::timeout(WAIT, sub.recv())
            .await
            .expect("no run.end in time")
            .unwrap()
            .expect("bus closed");
        let event: Value = serde_json::from_str(&delivery.json).unwrap();
        let done = event["k"] == "run.end" && event["runId"] == run_id;
        seen.push(event.clone());
        if done {
            return (seen, event);
        }
    }
}

async fn subscribe(host: &TestHost, session: &str) -> agent_host::bus::Subscription {
    host.bus
        .subscribe(SubscribeOptions {
            filter: SessionFilter::One(session.into()),
            forward_deltas: true,
            replay: Replay::None,
            subscriber_id: None,
        })
        .await
        .unwrap()
}

async fn send(host: &TestHost, session: &str, text: &str) -> String {
    host.ok("session.send", json!({"session_id": session, "text": text}))
        .await["run_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_binary_fails_the_run_with_binary_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with(dir.path(), dir.path().join("no-such-claude")).await;
    let session = host.session(dir.path()).await;
    let mut sub = subscribe(&host, &session).await;
    let run = send(&host, &session, "hello?").await;
    let (seen, end) = until_run_end(&mut sub, &run).await;
    assert_eq!(end["state"], "failed");
    assert_eq!(end["category"], "binary_unavailable");
    assert!(
        end["message"].as_str().unwrap().contains("no-such-claude"),
        "{end}"
    );
    let kinds: Vec<&str> = seen.iter().map(|e| e["k"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "user.text",
            "run.start",
            "session.state",
            "error",
            "run.end"
        ]
    );
    // The session is still usable: the next prompt gets its own run and its own clear end.
    let again = send(&host, &session, "again").await;
    let (_, end) = until_run_end(&mut sub, &again).await;
    assert_eq!(end["category"], "binary_unavailable");
    let runs = host.ok("session.get", json!({"session_id": session})).await;
    assert_eq!(runs["state"], "idle");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_prints_junk_and_dies_mid_turn_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let claude = script(
        dir.path(),
        "junk-claude",
        "read line\necho 'this is not json'\necho '{\"type\":\"hologram\"}'\necho '[1,2'\nexit 3",
    );
    let host = host_with(dir.path(), claude).await;
    let session = host.session(dir.path()).await;
    let mut sub = subscribe(&host, &session).await;
    let run = send(&host, &session, "hello?").await;
    let (_, end) = until_run_end(&mut sub, &run).await;
    assert_eq!(end["state"], "failed");
    // It read the prompt and died before a result: whether it acted is unknown.
    assert_eq!(end["category"], "result_delivery_unknown");
    assert!(
        end["message"].as_str().unwrap().contains("exit status: 3"),
        "{end}"
    );
    // The prompt was accepted and is in history; the next one starts a new process.
    let history = host
        .ok("session.history", json!({"session_id": session}))
        .await;
    let kinds: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        // The session's own state changes (`running`, then `idle` just after the `run.end`,
        // maybe after this read) are tests/suite/session_states.rs's.
        .filter(|k| *k != "session.state")
        .collect();
    assert_eq!(kinds, ["user.text", "run.start", "error", "run.end"]);
    let again = send(&host, &session, "again").await;
    let (_, end) = until_run_end(&mut sub, &again).await;
    assert_eq!(end["category"], "result_delivery_unknown");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_ignores_the_interrupt_is_killed_and_the_run_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    // Reads the prompt, then reads (and ignores) everything else, never answering.
    let claude = script(
        dir.path(),
        "deaf-claude",
        "trap '' INT TERM\nwhile read line; do :; done\nsleep 600",
    );
    let host = host_with(dir.path(), claude).await;
    let session = host.session(dir.path()).await;
    let mut sub = subscribe(&host, &session).await;
    let run = send(&host, &session, "hello?").await;
    let row = host.ok("session.get", json!({"session_id": session})).await;
    let pid = row["live"]["agent_pid"].as_u64().unwrap();
    assert_eq!(row["live"]["run_id"], run.as_str());
    let asked = Instant::now();
    let cancel = host
        .ok(
            "session.cancel",
            json!({"session_id": session, "run_id": run}),
        )
        .await;
    assert_eq!(cancel["state"], "cancelling");
    // Asking again changes nothing: still the same run, still cancelling.
    for _ in 0..3 {
        let again = host
            .ok("session.cancel", json!({"session_id": session}))
            .await;
        assert_eq!(
            (again["run_id"].as_str(), again["state"].as_str()),
            (Some(run.as_str()), Some("cancelling"))
        );
    }
    let (_, end) = until_run_end(&mut sub, &run).await;
    let took = asked.elapsed();
    assert_eq!(end["state"], "cancelled");
    assert!(end["message"].as_str().unwrap().contains("killed"), "{end}");
    assert!(
        took >= Duration::from_secs(2),
        "killed before the grace: {took:?}"
    );
    // Nothing of its process group runs (a killed grandchild may linger as a zombie until
    // init reaps it).
    assert!(
        !group_alive(i32::try_from(pid).unwrap()),
        "its process group lives on"
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_are_checked_before_any_run_exists() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with(dir.path(), dir.path().join("unused")).await;
    let session = host.session(dir.path()).await;
    let codes = [
        (
            json!({"session_id": session, "text": "  "}),
            "invalid_params",
        ),
        (
            json!({"session_id": session, "text": "x".repeat(300 * 1024)}),
            "invalid_params",
        ),
        (
            json!({"session_id": "nope", "text": "hi"}),
            "session_not_found",
        ),
        (json!({"session_id": session}), "invalid_params"),
        (
            json!({"session_id": session, "text": "hi", "client_msg_id": ""}),
            "invalid_params",
        ),
    ];
    for (params, code) in codes {
        let reply = host.ipc("session.send", params).await;
        assert_eq!(reply.data["error"], code, "{}", reply.to_line());
    }
    let reply = host
        .ipc(
            "permission.respond",
            json!({"session_id": session, "request_id": "r", "decision": "maybe"}),
        )
        .await;
    assert_eq!(reply.data["error"], "invalid_params");
    let reply = host
        .ipc("session.cancel", json!({"session_id": session}))
        .await;
    assert_eq!(reply.data["error"], "run_not_found");
    let runs = host
        .ok("session.history", json!({"session_id": session}))
        .await;
    assert_eq!(runs["count"], 0, "nothing was started");
    host.stop().await;
}

/// An agent that answers every prompt at once, the way the CLI frames a finished turn.
const QUICK_AGENT: &str = r#"while read line; do
  echo '{"type":"system","subtype":"init","session_id":"11111111-2222-4333-8444-555566667777"}'
  echo '{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"11111111-2222-4333-8444-555566667777","usage":{"input_tokens":1,"output_tokens":1}}'
done"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_is_closed_and_the_next_prompt_starts_it_again() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("host")).unwrap();
    std::fs::write(
        dir.path().join("host/config.toml"),
        "agent_idle_timeout_s = 1\n",
    )
    .unwrap();
    let claude = script(dir.path(), "quick-claude", QUICK_AGENT);
    let host = host_with(dir.path(), claude).await;
    let session = host.session(dir.path()).await;
    let mut sub = subscribe(&host, &session).await;
    let run = send(&host, &session, "hello").await;
    let (_, end) = until_run_end(&mut sub, &run).await;
    assert_eq!(end["state"], "completed");
    let row = host.ok("session.get", json!({"session_id": session})).await;
    let pid = i32::try_from(row["live"]["agent_pid"].as_u64().unwrap()).unwrap();
    assert_eq!(
        row["native_session_id"],
        "11111111-2222-4333-8444-555566667777"
    );
    // Idle for a second: the process is closed (well before the test's patience runs out).
    tokio::time::timeout(WAIT, exit_of(pid)).await.unwrap();
    let row = host.ok("session.get", json!({"session_id": session})).await;
    assert_eq!(row["live"]["agent_pid"], Value::Null);
    // The next prompt starts a new process that resumes the same native session.
    let again = send(&host, &session, "again").await;
    let (_, end) = until_run_end(&mut sub, &again).await;
    assert_eq!(end["state"], "completed");
    let row = host.ok("session.get", json!({"session_id": session})).await;
    assert_ne!(
        row["live"]["agent_pid"].as_u64(),
        Some(u64::try_from(pid).unwrap())
    );
    host.stop().await;
}

/// A stand-in for claude that answers prompts at once in a new session (naming the id it was
/// given), and refuses every `--resume` on stderr only (as some CLI versions do) — after
/// reading one more stdin line first when `mode` says `cancel` (the interrupt).
fn forgetful_agent(dir: &Path) -> PathBuf {
    let d = dir.display();
    script(
        dir,
        "forgetful-claude",
        &format!(
            r#"echo "$*" >> {d}/starts
case "$*" in
  *--resume=*)
    read prompt
    if [ "$(cat {d}/mode)" = cancel ]; then read interrupt; fi
    echo "No conversation found with session ID: the-old-one" >&2
    exit 1;;
esac
id=$(echo "$*" | sed -n 's/.*--session-id=\([^ ]*\).*/\1/p')
while read line; do
  echo '{{"type":"system","subtype":"init","session_id":"'$id'"}}'
  echo '{{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"'$id'","usage":{{"input_tokens":1,"output_tokens":1}}}}'
done"#
        ),
    )
}

async fn kinds_of_run(sub: &mut agent_host::bus::Subscription, run: &str) -> (Vec<Value>, Value) {
    let (seen, end) = until_run_end(sub, run).await;
    let of_run = seen
        .into_iter()
        .filter(|e| e["runId"] == run)
        .collect::<Vec<_>>();
    (of_run, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_refused_on_stderr_goes_on_fresh_and_a_cancelled_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mode"), "plain").unwrap();
    let claude = forgetful_agent(dir.path());
    let host = host_with(dir.path(), claude.clone()).await;
    let session = host.session(dir.path()).await;
    let mut sub = subscribe(&host, &session).await;
    let first = send(&host, &session, "one").await;
    let (_, end) = until_run_end(&mut sub, &first).await;
    assert_eq!(end["state"], "completed");
    let row = host.ok("session.get", json!({"session_id": session})).await;
    let native = row["native_session_id"].as_str().unwrap().to_owned();

    // After a restart the session resumes; the CLI refuses (stderr only): announced, then fresh.
    let host = host.restart().await;
    let mut sub = subscribe(&host, &session).await;
    let second = send(&host, &session, "two").await;
    let (events, end) = kinds_of_run(&mut sub, &second).await;
    assert_eq!(end["state"], "completed", "{events:#?}");
    let error = events.iter().find(|e| e["k"] == "error").unwrap();
    assert_eq!(error["category"], "resume_rejected");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("No conversation found")
    );
    let warning = events.iter().find(|e| e["k"] == "warning").unwrap();
    assert_eq!(warning["code"], "resume_rejected");
    let row = host.ok("session.get", json!({"session_id": session})).await;
    let fresh = row["native_session_id"].as_str().unwrap().to_owned();
    assert_ne!(fresh, native);

    // Again, but the prompt is cancelled while the resume is pending: it ends cancelled and is
    // not run again in a fresh session.
    std::fs::write(dir.path().join("mode"), "cancel").unwrap();
    let host = host.restart().await;
    let mut sub = subscribe(&host, &session).await;
    let third = send(&host, &session, "three").await;
    let cancel = host
        .ok(
            "session.cancel",
            json!({"session_id": session, "run_id": third}),
        )
        .await;
    assert_eq!(cancel["state"], "cancelling");
    let (events, end) = kinds_of_run(&mut sub, &third).await;
    assert_eq!(end["state"], "cancelled", "{events:#?}");
    assert!(events.iter().all(|e| e["code"] != "resume_rejected"));
    let starts = std::fs::read_to_string(dir.path().join("starts")).unwrap();
    let resumes = starts.lines().filter(|l| l.contains("--resume=")).count();
    let news = starts
        .lines()
        .filter(|l| l.contains("--session-id="))
        .count();
    assert_eq!((news, resumes), (2, 2), "{starts}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_racing_a_delete_finds_no_session() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("closing.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Takes the prompt, says when its stdin closes (the delete is under way), then lingers
    // deaf to SIGTERM until the group is killed.
    let claude = script(
        dir.path(),
        "slow-to-die",
        &format!(
            "trap '' TERM\nwhile read line; do :; done\necho closing > {}\nsleep 600",
            fifo.display()
        ),
    );
    let host = host_with(dir.path(), claude).await;
    let session = host.session(dir.path()).await;
    send(&host, &session, "hello").await;
    let closing = tokio::task::spawn_blocking({
        let fifo = fifo.clone();
        move || std::fs::read_to_string(fifo).unwrap()
    });
    let ipc = host.home.join("host.sock");
    let delete = tokio::spawn({
        let session = session.clone();
        async move {
            agent_host::ipc::request(
                &ipc,
                &json!({"command": "session.delete", "params": {"session_id": session}}),
                WAIT,
            )
            .await
            .unwrap()
        }
    });
    assert_eq!(closing.await.unwrap().trim(), "closing");
    let raced = host
        .ipc(
            "session.send",
            json!({"session_id": session, "text": "late"}),
        )
        .await;
    assert_eq!(
        raced.data["error"],
        "session_not_found",
        "{}",
        raced.to_line()
    );
    assert!(delete.await.unwrap().is_ok());
    let gone = host
        .ipc("session.get", json!({"session_id": session}))
        .await;
    assert_eq!(gone.data["error"], "session_not_found");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_dies_while_a_child_holds_its_stdout_still_ends_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // The child inherits stdout and outlives the agent: no end of file ever comes by itself.
    let claude = script(dir.path(), "leaky-claude", "read line\nsleep 600 &\nexit 3");
    let host = host_with(dir.path(), claude).await;
    let session = host.session(dir.path()).await;
    let mut sub = subscribe(&host, &session).await;
    let run = send(&host, &session, "hello?").await;
    let row = host.ok("session.get", json!({"session_id": session})).await;
    let pid = i32::try_from(row["live"]["agent_pid"].as_u64().unwrap()).unwrap();
    let (_, end) = until_run_end(&mut sub, &run).await;
    assert_eq!(end["state"], "failed");
    // It read the prompt and died before a result: whether it acted is unknown.
    assert_eq!(end["category"], "result_delivery_unknown");
    assert!(
        end["message"].as_str().unwrap().contains("exit status: 3"),
        "{end}"
    );
    assert!(!group_alive(pid), "the child holding stdout lives on");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_that_dies_before_it_has_an_id_is_tried_again_never_resumed_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("agent-home");
    std::fs::create_dir_all(&home).unwrap();
    let d = dir.path().display();
    // Answers in a new session; refuses to fork (dies at once); records how it was started.
    let claude = script(
        dir.path(),
        "unforkable-claude",
        &format!(
            r#"echo "$*" >> {d}/starts
case "$*" in *--fork-session*) exit 1;; esac
id=$(echo "$*" | sed -n 's/.*--session-id=\([^ ]*\).*/\1/p')
while read line; do
  echo '{{"type":"system","subtype":"init","session_id":"'$id'"}}'
  echo '{{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"'$id'","usage":{{"input_tokens":1,"output_tokens":1}}}}'
done"#
        ),
    );
    let agents = Agents {
        env: vec![
            ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
            ("HOME".to_owned(), home.display().to_string()),
        ],
        family_env: Vec::new(),
        claude: Some(claude),
        codex: None,
    };
    let host = TestHost::start_with_agents(&dir.path().join("host"), agents.clone()).await;
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let session = host.session(&work).await;
    let mut sub = subscribe(&host, &session).await;
    let first = send(&host, &session, "one").await;
    assert_eq!(
        until_run_end(&mut sub, &first).await.1["state"],
        "completed"
    );
    let native = host.ok("session.get", json!({"session_id": session})).await["native_session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    host.stop().await;
    // Someone else writes a transcript for that session while the host is down.
    let cwd = work.canonicalize().unwrap().display().to_string();
    let project = home
        .join(".claude/projects")
        .join(agent_host::adapter::claude::project_dir_name(&cwd));
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join(format!("{native}.jsonl")),
        "{\"uuid\":\"foreign\"}\n",
    )
    .unwrap();

    let host = TestHost::start_with_agents(&dir.path().join("host"), agents).await;
    let mut sub = subscribe(&host, &session).await;
    for text in ["two", "three"] {
        let run = send(&host, &session, text).await;
        let (_, end) = until_run_end(&mut sub, &run).await;
        assert_eq!(end["state"], "failed", "the fork cannot start here");
    }
    let starts = std::fs::read_to_string(dir.path().join("starts")).unwrap();
    let after_restart: Vec<&str> = starts.lines().skip(1).collect();
    assert_eq!(after_restart.len(), 2, "{starts}");
    assert!(
        after_restart.iter().all(|l| l.contains("--fork-session")),
        "a prompt resumed the foreign-written session in place: {starts}"
    );
    host.stop().await;
}

/// Transport uncertainty, end to end: the agent reads the prompt and is killed before any
/// result. The run ends `result_delivery_unknown` (it had the prompt: whether it acted is not
/// known), `session.run` answers what became of the prompt by its `client_msg_id` (and by its
/// run id), and sending the same `client_msg_id` again is the same run and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_dies_mid_turn_is_result_delivery_unknown_and_the_client_can_ask() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let claude = script(
        dir.path(),
        "doomed-claude",
        &format!("echo start >> {d}/starts\nread line\necho \"$line\" >> {d}/prompts\nkill -9 $$"),
    );
    let host = host_with(dir.path(), claude).await;
    let session = host.session(dir.path()).await;
    let mut sub = subscribe(&host, &session).await;
    let sent = host
        .ok(
            "session.send",
            json!({"session_id": session, "text": "rewrite the parser", "client_msg_id": "c-1"}),
        )
        .await;
    let run = sent["run_id"].as_str().unwrap().to_owned();
    let (_, end) = until_run_end(&mut sub, &run).await;
    assert_eq!(end["state"], "failed");
    assert_eq!(end["category"], "result_delivery_unknown", "{end}");
    let said = end["message"].as_str().unwrap();
    assert!(
        said.contains("SIGKILL") && said.contains("unknown"),
        "{said}"
    );
    // The run's row says it ended just after its `run.end` is committed (the event first, so
    // a crash in between is closed from the log), and before the session's `idle` follows.
    tokio::time::timeout(WAIT, async {
        loop {
            let delivery = sub.recv().await.unwrap().expect("bus closed");
            let event: Value = serde_json::from_str(&delivery.json).unwrap();
            if event["k"] == "session.state" && event["state"] == "idle" {
                return;
            }
        }
    })
    .await
    .expect("the session did not go idle");

    // What became of it: by the client's key, and by the run id, the same row.
    let by_key = host
        .ok(
            "session.run",
            json!({"session_id": session, "client_msg_id": "c-1"}),
        )
        .await;
    assert_eq!(by_key["run_id"], run.as_str());
    assert_eq!(by_key["session_id"], session.as_str());
    assert_eq!(by_key["client_msg_id"], "c-1");
    assert_eq!(by_key["state"], "failed");
    assert_eq!(by_key["error_category"], "result_delivery_unknown");
    assert_eq!(by_key["message"], end["message"]);
    assert!(by_key["created_at_ms"].is_i64() && by_key["ended_at_ms"].is_i64());
    let by_id = host
        .ok("session.run", json!({"session_id": session, "run_id": run}))
        .await;
    assert_eq!(by_id, by_key);

    // A retry of the send is that run, marked duplicate: nothing new starts.
    let again = host
        .ok(
            "session.send",
            json!({"session_id": session, "text": "rewrite the parser", "client_msg_id": "c-1"}),
        )
        .await;
    assert_eq!(again["run_id"], run.as_str());
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["queued"], false);
    let runs = host
        .ok("session.runs", json!({"session_id": session}))
        .await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
    let after = host
        .ok(
            "session.run",
            json!({"session_id": session, "client_msg_id": "c-1"}),
        )
        .await;
    assert_eq!(after, by_key, "the retry changed the run");

    // A key the host never took: not found (so sending it is safe); one way to name it only.
    let unknown = host
        .ipc(
            "session.run",
            json!({"session_id": session, "client_msg_id": "c-2"}),
        )
        .await;
    assert_eq!(
        unknown.data["error"],
        "run_not_found",
        "{}",
        unknown.to_line()
    );
    assert_eq!(unknown.code, 3003);
    let both = host
        .ipc(
            "session.run",
            json!({"session_id": session, "client_msg_id": "c-1", "run_id": run}),
        )
        .await;
    assert_eq!(both.data["error"], "invalid_params", "{}", both.to_line());
    let nowhere = host
        .ipc(
            "session.run",
            json!({"session_id": "no-such-session", "client_msg_id": "c-1"}),
        )
        .await;
    assert_eq!(nowhere.data["error"], "session_not_found");

    // The agent had the prompt exactly once, in one process.
    let prompts = std::fs::read_to_string(dir.path().join("prompts")).unwrap();
    assert_eq!(prompts.lines().count(), 1, "{prompts}");
    assert!(prompts.contains("rewrite the parser"), "{prompts}");
    let starts = std::fs::read_to_string(dir.path().join("starts")).unwrap();
    assert_eq!(starts.lines().count(), 1, "{starts}");
    host.stop().await;
}
