//! The real `claude` CLI (pinned in agents/package.json) driven through the project's spawn
//! policy and its stream-json translator, against the project's mock model server, inside a
//! network namespace that has only loopback: a turn, a tool call approved over the control
//! protocol, and a third turn that proves the conversation is remembered.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::time::Duration;

use agent_host::adapter::claude::{self, Translator};
use agent_host::adapter::claude_process;
use agent_host::adapter::spawn::{SpawnSpec, filter_env, spawn};
use agent_host::adapter::{AgentOutput, AgentSession, Native, OpenSpec};
use agent_host::protocol::events::{EventBody, RunState};
use common::agents::{agent_env, ensure_claude, group_alive, in_loopback_only_netns};
use common::mock_model::MockModel;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const SESSION: &str = "0a0b0c0d-1111-4222-8333-444455556666";

/// Read events until the first text delta of the turn.
async fn until_first_delta(s: &mut AgentSession) {
    loop {
        let next = tokio::time::timeout(Duration::from_secs(60), s.events.recv())
            .await
            .expect("no delta in time")
            .expect("event stream ended");
        if matches!(next, AgentOutput::Event(EventBody::TextDelta(_))) {
            return;
        }
    }
}

#[test]
fn real_claude_turns_translate_into_canonical_events() {
    let bin = ensure_claude();
    if !in_loopback_only_netns("real_claude_turns_translate_into_canonical_events") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mock = MockModel::start(0).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        let work = home.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let mut env = agent_env(home.path(), &mock);
        // A surrounding agent's marker must not reach the child.
        env.push(("CLAUDECODE".to_owned(), "1".to_owned()));
        let mut child = spawn(&SpawnSpec {
            program: bin,
            args: claude::launch_args(Some(SESSION), None, false),
            cwd: work.clone(),
            base_env: filter_env(env),
            extra_env: Vec::new(),
            session_id: Some("host-session".into()),
            home: None,
            label: "claude".into(),
        })
        .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut translator = Translator::new();

        // One turn: write the prompt, translate until run.end, answer permission requests.
        let mut turn = async |prompt: &str, allow: bool| -> Vec<EventBody> {
            let line = claude::user_frame(prompt, &uuid::Uuid::now_v7().to_string()) + "\n";
            stdin.write_all(line.as_bytes()).await.unwrap();
            let mut events = Vec::new();
            loop {
                let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                    .await
                    .expect("the CLI went silent")
                    .unwrap()
                    .expect("the CLI exited mid-turn");
                for event in translator.on_stdout_line(&line) {
                    if let EventBody::PermissionRequest(p) = &event {
                        let answer =
                            claude::permission_frame(&p.request_id, allow, &p.input, None) + "\n";
                        stdin.write_all(answer.as_bytes()).await.unwrap();
                    }
                    let end = matches!(event, EventBody::RunEnd(_));
                    events.push(event);
                    if end {
                        return events;
                    }
                }
            }
        };

        let first = turn("hello live", true).await;
        let kinds: Vec<&str> = first.iter().map(EventBody::kind).collect();
        assert_eq!(kinds.first(), Some(&"session.bound"), "{kinds:?}");
        match &first[0] {
            EventBody::SessionBound(b) => assert_eq!(b.native_session_id, SESSION),
            other => panic!("{other:?}"),
        }
        let text = first.iter().find_map(|e| match e {
            EventBody::TextEnd(t) => Some(t.text.clone()),
            _ => None,
        });
        assert_eq!(
            text.as_deref(),
            Some("echo: hello live [user turns seen: 1; first: hello live]")
        );
        assert!(kinds.contains(&"text.delta") && kinds.contains(&"usage"));
        assert!(
            matches!(first.last(), Some(EventBody::RunEnd(e)) if e.state == RunState::Completed)
        );

        let second = turn("TOOLCALL `touch live-made && echo live-tool`", true).await;
        let kinds: Vec<&str> = second.iter().map(EventBody::kind).collect();
        for k in [
            "tool.call.start",
            "tool.call.end",
            "permission.request",
            "tool.exec.end",
        ] {
            assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
        }
        let output = second.iter().find_map(|e| match e {
            EventBody::ToolExecEnd(t) => Some(t.output.clone()),
            _ => None,
        });
        assert_eq!(output.as_deref(), Some("live-tool"));
        assert!(
            work.join("live-made").exists(),
            "the approved tool ran in the session's cwd"
        );

        let third = turn("and again", true).await;
        let text = third.iter().find_map(|e| match e {
            EventBody::TextEnd(t) => Some(t.text.clone()),
            _ => None,
        });
        let text = text.unwrap();
        assert!(text.contains("first: hello live"), "history lost: {text}");
        assert_eq!(translator.native_id(), Some(SESSION));

        // The child got the policy's environment: our markers, not a surrounding agent's.
        let environ = std::fs::read(format!("/proc/{}/environ", child.pid().unwrap())).unwrap();
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        assert!(vars.iter().any(|v| v == "AGENTHOST_OWNED=1"), "{vars:?}");
        assert!(
            vars.iter()
                .any(|v| v == "AGENTHOST_SESSION_ID=host-session")
        );
        assert!(
            !vars.iter().any(|v| v.starts_with("CLAUDECODE=")),
            "{vars:?}"
        );
        // Closing stdin ends it cleanly (exit 0) within the grace period.
        drop(stdin);
        let status = child.stop(Duration::from_secs(10)).await.unwrap();
        assert!(status.success(), "{status}");
        assert!(mock.requests.load(std::sync::atomic::Ordering::Relaxed) >= 4);
    });
}

/// The driver: a turn, an approved tool, a cancelled slow turn followed by a working one in the
/// same process, then the process killed with SIGKILL mid-turn → `run.end` failed /
/// `result_delivery_unknown`, nothing of its process group left, and a resumed process that
/// remembers.
#[test]
fn the_claude_driver_runs_turns_cancels_and_survives_a_kill() {
    let bin = ensure_claude();
    if !in_loopback_only_netns("the_claude_driver_runs_turns_cancels_and_survives_a_kill") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mock = MockModel::start(0).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        let work = home.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let env = filter_env(agent_env(home.path(), &mock));
        let spec = |native: Native| OpenSpec {
            args: Vec::new(),
            program: bin.clone(),
            cwd: work.clone(),
            base_env: env.clone(),
            extra_env: Vec::new(),
            host_session_id: "host-1".into(),
            home: None,
            native,
            options: Default::default(),
        };
        let wait = Duration::from_secs(60);
        // Events until run.end (answering permissions with `allow`), or until the process ends.
        async fn until_end(s: &mut AgentSession, allow: bool, wait: Duration) -> Vec<AgentOutput> {
            let mut out = Vec::new();
            loop {
                let next = tokio::time::timeout(wait, s.events.recv())
                    .await
                    .expect("no event in time")
                    .expect("event stream ended");
                if let AgentOutput::Event(EventBody::PermissionRequest(p)) = &next {
                    s.respond_permission(&p.request_id, allow, &p.input, None)
                        .await
                        .unwrap();
                }
                let done = matches!(
                    next,
                    AgentOutput::Event(EventBody::RunEnd(_)) | AgentOutput::Exited { .. }
                );
                out.push(next);
                if done {
                    return out;
                }
            }
        }
        fn run_end(out: &[AgentOutput]) -> Option<&agent_host::protocol::events::RunEnd> {
            out.iter().rev().find_map(|o| match o {
                AgentOutput::Event(EventBody::RunEnd(e)) => Some(e),
                _ => None,
            })
        }

        let mut s = claude_process::open(spec(Native::New(SESSION.into()))).unwrap();
        s.send("hello driver", &uuid::Uuid::now_v7().to_string())
            .await
            .unwrap();
        let out = until_end(&mut s, true, wait).await;
        assert_eq!(run_end(&out).unwrap().state, RunState::Completed);

        s.send(
            "TOOLCALL `touch by-driver && echo driven`",
            &uuid::Uuid::now_v7().to_string(),
        )
        .await
        .unwrap();
        let out = until_end(&mut s, true, wait).await;
        assert!(work.join("by-driver").exists());
        assert_eq!(run_end(&out).unwrap().state, RunState::Completed);

        // Cancel a slow stream after its first delta: cancelled, well within 2 s.
        s.send("SLOW stream", &uuid::Uuid::now_v7().to_string())
            .await
            .unwrap();
        until_first_delta(&mut s).await;
        let asked = std::time::Instant::now();
        s.cancel_turn().await.unwrap();
        let out = until_end(&mut s, true, Duration::from_secs(2)).await;
        assert_eq!(run_end(&out).unwrap().state, RunState::Cancelled);
        eprintln!("cancel took {:?}", asked.elapsed());
        // The same process takes the next prompt.
        s.send("after cancel", &uuid::Uuid::now_v7().to_string())
            .await
            .unwrap();
        let out = until_end(&mut s, true, wait).await;
        assert_eq!(run_end(&out).unwrap().state, RunState::Completed);

        // SIGKILL mid-turn: a failed run, then the end of the stream; no process left.
        s.send("SLOW again", &uuid::Uuid::now_v7().to_string())
            .await
            .unwrap();
        until_first_delta(&mut s).await;
        let pid = s.pid().unwrap() as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let out = until_end(&mut s, true, Duration::from_secs(2)).await;
        let end = run_end(&out).expect("a run.end after the kill");
        assert_eq!(end.state, RunState::Failed);
        assert_eq!(
            end.category,
            Some(agent_host::protocol::events::ErrorCategory::ResultDeliveryUnknown)
        );
        let last = tokio::time::timeout(Duration::from_secs(2), s.events.recv())
            .await
            .unwrap();
        assert!(matches!(last, Some(AgentOutput::Exited { .. })), "{last:?}");
        assert!(
            !group_alive(pid),
            "processes left in the killed agent's group"
        );

        // Resume the same native session in a new process: the history is there.
        let mut s = claude_process::open(spec(Native::Resume(SESSION.into()))).unwrap();
        s.send("after the kill", &uuid::Uuid::now_v7().to_string())
            .await
            .unwrap();
        let out = until_end(&mut s, true, wait).await;
        let text = out.iter().find_map(|o| match o {
            AgentOutput::Event(EventBody::TextEnd(t)) => Some(t.text.clone()),
            _ => None,
        });
        assert!(text.unwrap().contains("first: hello driver"), "not resumed");
        s.close(Duration::from_secs(10)).await;
    });
}
