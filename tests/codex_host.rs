//! Runs with the real Codex CLI (`codex app-server`, pinned in agents/package.json) through the
//! whole host (issue 5, acceptance 1–4): turns streamed to WebSocket followers, approvals from
//! either side, cancel, a host restart, and the app-server killed mid-turn. Each test runs
//! inside its own loopback-only network namespace against the project's mock model (its
//! OpenAI Responses API).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

mod common;

use std::time::{Duration, Instant};

use common::agents::group_alive;
use common::world::{Family, TURN, World, in_netns, run_end, run_end_of, text_of_run};
use serde_json::{Value, json};

/// Acceptance 1: two turns streamed to two followers (one with deltas, one without); the
/// second answer proves the history; `session.bound` carries the thread id.
#[test]
fn codex_two_turns_stream_to_two_followers_alike() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_two_turns_stream_to_two_followers_alike",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut with_deltas = world.follower(&session, true).await;
        let mut without = world.follower(&session, false).await;

        let first = world.send(&session, "hello codex").await;
        run_end(&mut with_deltas, &first, TURN).await;
        let second = world.send(&session, "second turn").await;
        run_end(&mut with_deltas, &second, TURN).await;
        run_end(&mut without, &second, TURN).await;

        assert_eq!(with_deltas.brackets(), without.brackets());
        assert!(
            with_deltas.seen.iter().any(|s| s.kind() == "text.delta"),
            "{:#?}",
            with_deltas
                .seen
                .iter()
                .map(|s| s.event.clone())
                .collect::<Vec<_>>()
        );
        assert!(without.seen.iter().all(|s| !s.delta));
        for run in [&first, &second] {
            assert_eq!(run_end_of(&with_deltas, run)["state"], "completed");
            let usage = with_deltas.of_run(run).iter().any(|s| s.kind() == "usage");
            assert!(usage, "a usage for {run}");
        }
        assert_eq!(
            text_of_run(&with_deltas, &first),
            "echo: hello codex [user turns seen: 1; first: hello codex]"
        );
        assert_eq!(
            text_of_run(&without, &second),
            "echo: second turn [user turns seen: 2; first: hello codex]"
        );
        let thread = world.native_id(&session).await;
        let bound = with_deltas
            .seen
            .iter()
            .find(|s| s.kind() == "session.bound")
            .unwrap();
        assert_eq!(bound.event["nativeSessionId"], thread.as_str());
        let kinds = with_deltas.kinds();
        let bound_at = kinds.iter().position(|k| k == "session.bound").unwrap();
        let text_at = kinds.iter().position(|k| k.starts_with("text.")).unwrap();
        assert!(bound_at < text_at, "{kinds:?}");
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 2: a command that needs approval — accepted from a WebSocket client, the command
/// runs and `tool.exec.end` carries its output and exit code; declined over IPC, the turn goes
/// on; a resolved request is gone for every client (a late answer is `already_resolved`).
#[test]
fn codex_approvals_from_any_client() {
    let Some(rt) = in_netns(Family::Codex, "codex_approvals_from_any_client") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        let mut other = world.follower(&session, false).await;

        let accepted = world
            .send(
                &session,
                "TOOLCALL ESCALATE `touch accepted && echo codex-out`",
            )
            .await;
        let request = ws.until_kind("permission.request", TURN).await;
        assert_eq!(request.run_id, accepted);
        let request_id = request.event["requestId"].as_str().unwrap().to_owned();
        let receipt = ws
            .ok(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "allow"}),
            )
            .await;
        assert_eq!(receipt["decision"], "allow", "{receipt}");
        assert_eq!(
            run_end(&mut ws, &accepted, TURN).await["state"],
            "completed"
        );
        let exec = ws
            .of_run(&accepted)
            .into_iter()
            .find(|s| s.kind() == "tool.exec.end")
            .unwrap()
            .clone();
        assert!(
            exec.event["output"].as_str().unwrap().contains("codex-out"),
            "{}",
            exec.event
        );
        assert_eq!(exec.event["exitCode"], 0);
        assert!(world.work.join("accepted").exists());
        // The other follower saw the request resolved, by the first client.
        run_end(&mut other, &accepted, TURN).await;
        let resolved = other
            .of_run(&accepted)
            .into_iter()
            .find(|s| s.kind() == "permission.resolved")
            .unwrap()
            .clone();
        assert_eq!(resolved.event["requestId"], request_id.as_str());
        assert_eq!(resolved.event["by"], ws.subscriber_id.as_str());
        let late = world
            .host()
            .ipc(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "deny"}),
            )
            .await;
        assert_eq!(late.data["error"], "already_resolved", "{}", late.to_line());

        let declined = world
            .send(&session, "TOOLCALL ESCALATE `touch declined && echo never`")
            .await;
        let request = ws
            .until("the second request", TURN, |s| {
                s.kind() == "permission.request" && s.run_id == declined
            })
            .await;
        let answer = world
            .host()
            .ok(
                "permission.respond",
                json!({"session_id": session,
                       "request_id": request.event["requestId"], "decision": "deny"}),
            )
            .await;
        assert_eq!(answer["decision"], "deny");
        assert_eq!(
            run_end(&mut ws, &declined, TURN).await["state"],
            "completed"
        );
        let exec = ws
            .of_run(&declined)
            .into_iter()
            .find(|s| s.kind() == "tool.exec.end")
            .unwrap()
            .clone();
        assert_eq!(exec.event["isError"], true);
        assert!(!world.work.join("declined").exists());
        assert!(
            text_of_run(&ws, &declined).contains("tool said:"),
            "the turn went on after the decline: {}",
            text_of_run(&ws, &declined)
        );
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 3: `session.cancel` during a slow stream ends the run `cancelled`; the next prompt
/// works on the same thread.
#[test]
fn codex_cancel_ends_the_turn_and_the_thread_goes_on() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_cancel_ends_the_turn_and_the_thread_goes_on",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, true).await;
        world.turn(&mut ws, &session, "before the cancel").await;
        let thread = world.native_id(&session).await;
        let slow = world.streaming(&mut ws, &session, "stream").await;
        let asked = Instant::now();
        let cancel = world
            .host()
            .ok(
                "session.cancel",
                json!({"session_id": session, "run_id": slow}),
            )
            .await;
        assert_eq!(cancel["state"], "cancelling");
        let end = run_end(&mut ws, &slow, Duration::from_secs(2)).await;
        eprintln!("cancelled in {:?}", asked.elapsed());
        assert_eq!(end["state"], "cancelled");
        // The partial message was closed by the host (Codex never completes it).
        let texts: Vec<&str> = ws
            .of_run(&slow)
            .iter()
            .filter(|s| s.kind() == "text.end")
            .map(|s| s.event["text"].as_str().unwrap())
            .collect();
        assert!(texts.iter().any(|t| t.starts_with("slow 0")), "{texts:?}");

        let after = world.send(&session, "after the cancel").await;
        run_end(&mut ws, &after, TURN).await;
        assert_eq!(run_end_of(&ws, &after)["state"], "completed");
        assert!(text_of_run(&ws, &after).contains("first: before the cancel"));
        assert_eq!(world.native_id(&session).await, thread);
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 4: a host restart between turns resumes the same thread; the app-server killed
/// mid-turn fails the run (`result_delivery_unknown`) with nothing left of its group, and the
/// next prompt resumes the thread.
#[test]
fn codex_restart_resumes_and_a_killed_app_server_fails_the_run() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_restart_resumes_and_a_killed_app_server_fails_the_run",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "remember me").await;
        let thread = world.native_id(&session).await;
        drop(ws);

        world.restart().await;
        let mut ws = world.follower(&session, true).await;
        let resumed = world.send(&session, "do you remember").await;
        run_end(&mut ws, &resumed, TURN).await;
        assert_eq!(run_end_of(&ws, &resumed)["state"], "completed");
        assert!(
            text_of_run(&ws, &resumed).contains("first: remember me"),
            "not resumed: {}",
            text_of_run(&ws, &resumed)
        );
        assert_eq!(world.native_id(&session).await, thread);

        let slow = world.streaming(&mut ws, &session, "doomed").await;
        let pid = world.agent_pid(&session).await;
        let killed = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let end = run_end(&mut ws, &slow, Duration::from_secs(2)).await;
        eprintln!("failed in {:?}", killed.elapsed());
        assert_eq!(end["state"], "failed");
        assert_eq!(end["category"], "result_delivery_unknown");
        assert!(
            !group_alive(pid),
            "processes left in the app-server's group"
        );

        let after = world.send(&session, "after the kill").await;
        run_end(&mut ws, &after, TURN).await;
        assert_eq!(run_end_of(&ws, &after)["state"], "completed");
        assert!(text_of_run(&ws, &after).contains("first: remember me"));
        assert_eq!(world.native_id(&session).await, thread);
        let row = world
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        assert_ne!(row["live"]["agent_pid"], Value::Null);
        world.host.unwrap().stop().await;
    });
}

/// The rollout files (`$CODEX_HOME/sessions/**/rollout-*.jsonl`) of a thread.
fn rollouts_of(world: &World, thread: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![world.dir.path().join("agent-home/.codex/sessions")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(&format!("{thread}.jsonl")) {
                out.push(path);
            }
        }
    }
    out
}

/// A thread Codex no longer has ends the resume `resume_rejected`, visibly, and the prompt
/// goes on in a fresh thread; a thread another process is writing is forked, never fought
/// over (design §8), and the session goes on in the fork with a visible warning.
#[test]
fn codex_a_lost_thread_starts_fresh_and_a_busy_one_is_forked() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_a_lost_thread_starts_fresh_and_a_busy_one_is_forked",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "first words").await;
        let thread = world.native_id(&session).await;
        drop(ws);

        // Another Codex process takes the thread (and its writer lock) while the host is down.
        world.host.take().unwrap().stop().await;
        let agents = world.agents();
        let mut other = tokio::process::Command::new(agents.codex.clone().unwrap())
            .arg("app-server")
            .env_clear()
            .envs(agents.env.iter().cloned())
            .envs(agents.family_env.iter().cloned())
            .current_dir(&world.work)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = other.stdin.take().unwrap();
        let mut lines =
            tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(other.stdout.take().unwrap()));
        let handshake = [
            json!({"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "other", "title": "other", "version": "0"}, "capabilities": {"experimentalApi": false}}}),
            json!({"method": "initialized"}),
            json!({"id": 2, "method": "thread/resume", "params": {"threadId": thread}}),
        ];
        for msg in handshake {
            tokio::io::AsyncWriteExt::write_all(&mut stdin, format!("{msg}\n").as_bytes())
                .await
                .unwrap();
        }
        loop {
            let line = tokio::time::timeout(TURN, lines.next_line()).await.unwrap().unwrap().unwrap();
            let msg: Value = serde_json::from_str(&line).unwrap();
            if msg["id"] == 2 {
                assert!(msg.get("error").is_none(), "{msg}");
                break;
            }
        }
        world.host = Some(common::TestHost::start_with_agents(&world.dir.path().join("host"), world.agents()).await);
        let mut ws = world.follower(&session, false).await;
        let forked = world.send(&session, "while another writes").await;
        run_end(&mut ws, &forked, TURN).await;
        assert_eq!(run_end_of(&ws, &forked)["state"], "completed");
        let warning = ws
            .of_run(&forked)
            .into_iter()
            .find(|s| s.kind() == "warning" && s.event["code"] == "forked")
            .unwrap_or_else(|| panic!("no fork warning: {:?}", ws.kinds()))
            .clone();
        assert!(warning.event["message"].as_str().unwrap().contains(&thread));
        let fork = world.native_id(&session).await;
        assert_ne!(fork, thread);
        // The fork was opened in the session's cwd, and both rollouts record it.
        for id in [&thread, &fork] {
            let files = rollouts_of(&world, id);
            assert_eq!(files.len(), 1, "{files:?}");
            assert_eq!(
                agent_host::adapter::codex::rollout_cwd(&files[0]),
                Some(world.work.clone())
            );
        }
        assert!(
            text_of_run(&ws, &forked).contains("first: first words"),
            "the fork keeps the history: {}",
            text_of_run(&ws, &forked)
        );
        drop(stdin);
        drop(other);
        drop(ws);

        // The fork's rollout disappears while the host is down: a fresh thread, announced.
        world.host.take().unwrap().stop().await;
        for file in rollouts_of(&world, &fork) {
            std::fs::remove_file(file).unwrap();
        }
        world.host = Some(common::TestHost::start_with_agents(&world.dir.path().join("host"), world.agents()).await);
        let mut ws = world.follower(&session, false).await;
        let fresh = world.send(&session, "start over").await;
        run_end(&mut ws, &fresh, TURN).await;
        let of_run = ws.of_run(&fresh);
        let kinds: Vec<&str> = of_run.iter().map(|s| s.kind()).collect();
        let error = of_run.iter().find(|s| s.kind() == "error").unwrap_or_else(|| panic!("{kinds:?}"));
        assert_eq!(error.event["category"], "resume_rejected");
        let warned = of_run
            .iter()
            .any(|s| s.kind() == "warning" && s.event["code"] == "resume_rejected");
        assert!(warned, "{kinds:?}");
        assert_eq!(run_end_of(&ws, &fresh)["state"], "completed");
        assert_eq!(
            text_of_run(&ws, &fresh),
            "echo: start over [user turns seen: 1; first: start over]"
        );
        assert_ne!(world.native_id(&session).await, fork);
        world.host.unwrap().stop().await;
    });
}

/// A command Codex runs in its sandbox without asking, and that the sandbox denies as it
/// starts (a write outside the workspace: `Read-only file system`), never becomes an app-server
/// item; only the rollout records it. It still shows as a failed `shell` tool call — its
/// command, exit code 1 and output — to a follower, in the run, before its `run.end`, and in
/// `session.history`. The turn goes on (the model answers with what the tool said).
#[test]
fn codex_a_command_the_sandbox_denies_is_a_failed_tool_call() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_a_command_the_sandbox_denies_is_a_failed_tool_call",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        let run = world
            .send(&session, "TOOLCALL `echo denied > /agent-host-probe`")
            .await;
        assert_eq!(run_end(&mut ws, &run, TURN).await["state"], "completed");
        assert!(!std::path::Path::new("/agent-host-probe").exists());
        let of_run = ws.of_run(&run);
        let kinds: Vec<&str> = of_run.iter().map(|s| s.kind()).collect();
        let tool: Vec<&str> = kinds
            .iter()
            .copied()
            .filter(|k| k.starts_with("tool."))
            .collect();
        assert_eq!(
            tool,
            [
                "tool.call.start",
                "tool.call.end",
                "tool.exec.start",
                "tool.exec.end"
            ],
            "{kinds:?}"
        );
        let call = of_run.iter().find(|s| s.kind() == "tool.call.end").unwrap();
        assert_eq!(call.event["name"], "shell", "{}", call.event);
        assert_eq!(
            call.event["input"]["command"], "echo denied > /agent-host-probe",
            "{}",
            call.event
        );
        let end = of_run.iter().find(|s| s.kind() == "tool.exec.end").unwrap();
        assert_eq!(end.event["callId"], call.event["callId"]);
        assert_eq!(end.event["isError"], true, "{}", end.event);
        assert_eq!(end.event["exitCode"], 1, "{}", end.event);
        assert!(
            end.event["output"]
                .as_str()
                .unwrap()
                .contains("Read-only file system"),
            "{}",
            end.event
        );
        let at = |k: &str| kinds.iter().position(|x| *x == k).unwrap();
        assert!(at("tool.exec.end") < at("run.end"), "{kinds:?}");
        assert!(text_of_run(&ws, &run).contains("tool said:"));

        let page = world
            .host()
            .ok(
                "session.history",
                json!({"session_id": session, "limit": 5000}),
            )
            .await;
        let stored: Vec<&Value> = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["run_id"] == run.as_str() && e["kind"].as_str().unwrap().starts_with("tool.")
            })
            .collect();
        let stored_kinds: Vec<&str> = stored.iter().map(|e| e["kind"].as_str().unwrap()).collect();
        assert_eq!(stored_kinds, tool, "{page}");
        let stored_end = stored.last().unwrap();
        assert_eq!(stored_end["event"], end.event);
        world.host.unwrap().stop().await;
    });
}
