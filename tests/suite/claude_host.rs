//! Runs with the real `claude` CLI through the whole host (issue 4, acceptance 2–7): prompts by
//! IPC and WebSocket, the answers streamed to WebSocket followers, permissions answered from
//! either side, cancel, a killed agent, a host restart, and the follow-up queue. Each test runs
//! inside its own loopback-only network namespace against the project's mock model.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::TestHost;
use common::agents::group_alive;
use common::world::{Family, TURN, World, in_netns, run_end, run_end_of, text_of_run};
use serde_json::{Value, json};

/// The claude session files under the agent's HOME.
fn session_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.join("agent-home/.claude/projects")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                out.push(path);
            }
        }
    }
    out
}

/// Acceptance 2: two turns through the host, followed by two WebSocket subscribers (one with
/// deltas, one without): the same brackets in the same order, `text.end` holds the whole text,
/// `session.bound` comes before the first text, and the second answer remembers the first.
#[test]
fn two_turns_stream_to_two_followers_alike() {
    let Some(rt) = in_netns(Family::Claude, "two_turns_stream_to_two_followers_alike") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut with_deltas = world.follower(&session, true).await;
        let mut without = world.follower(&session, false).await;

        let first = world.send(&session, "hello host").await;
        run_end(&mut with_deltas, &first, TURN).await;
        let second = world.send(&session, "second turn").await;
        run_end(&mut with_deltas, &second, TURN).await;
        run_end(&mut without, &second, TURN).await;

        assert_eq!(with_deltas.brackets(), without.brackets());
        assert!(without.seen.iter().all(|s| !s.delta));
        assert!(with_deltas.seen.iter().any(|s| s.kind() == "text.delta"));
        let kinds = with_deltas.kinds();
        let bound = kinds.iter().position(|k| k == "session.bound").unwrap();
        let text = kinds.iter().position(|k| k.starts_with("text.")).unwrap();
        assert!(bound < text, "{kinds:?}");
        for run in [&first, &second] {
            let of_run: Vec<String> = with_deltas
                .of_run(run)
                .iter()
                .filter(|s| !s.delta)
                .map(|s| s.kind().to_owned())
                .collect();
            assert_eq!(of_run.first().map(String::as_str), Some("user.text"));
            assert_eq!(of_run.get(1).map(String::as_str), Some("run.start"));
            assert_eq!(of_run.last().map(String::as_str), Some("run.end"));
            assert_eq!(run_end_of(&with_deltas, run)["state"], "completed");
        }
        // text.end holds exactly what the deltas of its block streamed.
        for end in with_deltas.seen.iter().filter(|s| s.kind() == "text.end") {
            let item = &end.event["itemId"];
            let streamed: String = with_deltas
                .seen
                .iter()
                .filter(|s| s.kind() == "text.delta" && &s.event["itemId"] == item)
                .map(|s| s.event["text"].as_str().unwrap())
                .collect();
            assert_eq!(end.event["text"].as_str().unwrap(), streamed);
        }
        assert_eq!(
            text_of_run(&with_deltas, &first),
            "echo: hello host [user turns seen: 1; first: hello host]"
        );
        assert_eq!(
            text_of_run(&without, &second),
            "echo: second turn [user turns seen: 2; first: hello host]"
        );
        let native = world.native_id(&session).await;
        let bound = with_deltas
            .seen
            .iter()
            .find(|s| s.kind() == "session.bound")
            .unwrap();
        assert_eq!(bound.event["nativeSessionId"], native.as_str());
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 3: a tool call approved from a WebSocket client runs and `tool.exec.end` carries
/// its output; one denied over IPC lets the turn go on with the denial; a second answer gets
/// `already_resolved` saying who answered first.
#[test]
fn permissions_are_answered_once_from_any_client() {
    let Some(rt) = in_netns(
        Family::Claude,
        "permissions_are_answered_once_from_any_client",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;

        let approved = world
            .send(&session, "TOOLCALL `touch approved && echo approved-out`")
            .await;
        let request = ws.until_kind("permission.request", TURN).await;
        assert_eq!(request.run_id, approved);
        assert_eq!(request.event["tool"], "Bash");
        let request_id = request.event["requestId"].as_str().unwrap().to_owned();
        let receipt = ws
            .ok(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "allow"}),
            )
            .await;
        assert_eq!(receipt["decision"], "allow", "{receipt}");
        let end = run_end(&mut ws, &approved, TURN).await;
        assert_eq!(end["state"], "completed");
        let resolved = ws
            .seen
            .iter()
            .find(|s| s.kind() == "permission.resolved")
            .unwrap();
        assert_eq!(resolved.event["decision"], "allow");
        assert_eq!(resolved.event["by"], ws.subscriber_id.as_str());
        let exec = ws
            .seen
            .iter()
            .find(|s| s.kind() == "tool.exec.end")
            .unwrap();
        assert_eq!(exec.event["output"], "approved-out");
        assert!(world.work.join("approved").exists());
        // A late second answer, from IPC this time.
        let late = world
            .host()
            .ipc(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "deny"}),
            )
            .await;
        assert_eq!(late.data["error"], "already_resolved", "{}", late.to_line());
        assert_eq!(late.code, 3005);
        assert_eq!(late.data["decision"], "allow");
        assert_eq!(late.data["by"], ws.subscriber_id.as_str());

        // Denied from IPC: the tool does not run, the turn goes on and reports the denial.
        let denied = world
            .send(&session, "TOOLCALL `touch denied && echo denied-out`")
            .await;
        let request = ws
            .until("second request", TURN, |s| {
                s.kind() == "permission.request" && s.run_id == denied
            })
            .await;
        let request_id = request.event["requestId"].as_str().unwrap().to_owned();
        let answer = world
            .host()
            .ok(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "deny",
                       "message": "not today"}),
            )
            .await;
        assert_eq!(answer["decision"], "deny");
        let end = run_end(&mut ws, &denied, TURN).await;
        assert_eq!(end["state"], "completed");
        let of_run = ws.of_run(&denied);
        let exec = of_run.iter().find(|s| s.kind() == "tool.exec.end").unwrap();
        assert_eq!(exec.event["isError"], true);
        assert!(
            exec.event["output"].as_str().unwrap().contains("not today"),
            "{}",
            exec.event
        );
        assert!(!world.work.join("denied").exists());
        let resolved = of_run
            .iter()
            .find(|s| s.kind() == "permission.resolved")
            .unwrap();
        assert_eq!(resolved.event["by"], "ipc");
        assert!(
            text_of_run(&ws, &denied).contains("tool said:"),
            "the turn went on after the denial"
        );
        // The WebSocket side answering late.
        let late = ws
            .refused(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "allow"}),
                3005,
                "already_resolved",
            )
            .await;
        assert_eq!(late.data["decision"], "deny", "{}", late.to_line());
        assert_eq!(late.data["by"], "ipc", "{}", late.to_line());
        // An id nobody asked about.
        let unknown = world
            .host()
            .ipc(
                "permission.respond",
                json!({"session_id": session, "request_id": "nope", "decision": "allow"}),
            )
            .await;
        assert_eq!(unknown.data["error"], "permission_not_found");
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 4: a cancel during a slow stream ends the run `cancelled` within 2 s, and the
/// next prompt works in the same process and native session.
#[test]
fn cancel_ends_the_turn_and_the_session_goes_on() {
    let Some(rt) = in_netns(
        Family::Claude,
        "cancel_ends_the_turn_and_the_session_goes_on",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, true).await;
        world.turn(&mut ws, &session, "before the cancel").await;
        let native = world.native_id(&session).await;
        let pid = world.agent_pid(&session).await;

        let slow = world.streaming(&mut ws, &session, "stream").await;
        let asked = Instant::now();
        let cancel = ws
            .ok(
                "session.cancel",
                json!({"session_id": session, "run_id": slow}),
            )
            .await;
        assert_eq!(
            (cancel["run_id"].as_str(), cancel["state"].as_str()),
            (Some(slow.as_str()), Some("cancelling")),
            "{cancel}"
        );
        let end = run_end(&mut ws, &slow, Duration::from_secs(2)).await;
        eprintln!("cancelled in {:?}", asked.elapsed());
        assert_eq!(end["state"], "cancelled");
        // Nothing to cancel now.
        let idle = world
            .host()
            .ipc("session.cancel", json!({"session_id": session}))
            .await;
        assert_eq!(idle.data["error"], "run_not_found");

        let after = world.send(&session, "after the cancel").await;
        run_end(&mut ws, &after, TURN).await;
        assert_eq!(run_end_of(&ws, &after)["state"], "completed");
        assert!(text_of_run(&ws, &after).contains("first: before the cancel"));
        assert_eq!(world.native_id(&session).await, native);
        assert_eq!(world.agent_pid(&session).await, pid, "the same process");
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 5: the agent killed with SIGKILL mid-turn → `run.end` failed /
/// `result_delivery_unknown` (it had the prompt; what it did is not known) within 2 s, nothing
/// left of its process group, and the next prompt resumes the session.
#[test]
fn a_killed_agent_fails_the_run_and_the_next_prompt_resumes() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_killed_agent_fails_the_run_and_the_next_prompt_resumes",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, true).await;
        world.turn(&mut ws, &session, "before the kill").await;
        let native = world.native_id(&session).await;

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
        assert!(!group_alive(pid), "processes left in the agent's group");
        let live = world
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        assert_eq!(live["live"]["agent_pid"], Value::Null);

        let after = world.send(&session, "after the kill").await;
        run_end(&mut ws, &after, TURN).await;
        assert_eq!(run_end_of(&ws, &after)["state"], "completed");
        assert!(
            text_of_run(&ws, &after).contains("first: before the kill"),
            "not resumed: {}",
            text_of_run(&ws, &after)
        );
        assert_eq!(world.native_id(&session).await, native);
        assert_ne!(world.agent_pid(&session).await, pid);
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 6: after a host restart the next prompt resumes the same native session; a
/// native session the CLI no longer has ends `resume_rejected` and goes on fresh only with a
/// visible warning. A permission request pending when the host stops is expired, visibly, and
/// a late answer says so.
#[test]
fn a_restart_resumes_and_a_rejected_resume_is_announced() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_restart_resumes_and_a_rejected_resume_is_announced",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "remember me").await;
        let native = world.native_id(&session).await;
        // Leave a permission request pending over the restart.
        let asking = world
            .send(&session, "TOOLCALL `touch never && echo never`")
            .await;
        let request = ws.until_kind("permission.request", TURN).await;
        let request_id = request.event["requestId"].as_str().unwrap().to_owned();
        drop(ws);

        world.restart().await;
        let mut ws = world.follower(&session, false).await;
        // Replayed from the store: the pending request expired and the run was interrupted.
        let expired = ws.until_kind("permission.resolved", TURN).await;
        assert_eq!(expired.event["decision"], "expired");
        assert_eq!(expired.event["by"], "host");
        let end = run_end(&mut ws, &asking, TURN).await;
        assert_eq!(end["state"], "interrupted");
        let late = world
            .host()
            .ipc(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "allow"}),
            )
            .await;
        assert_eq!(late.data["error"], "already_resolved", "{}", late.to_line());
        assert_eq!(late.data["decision"], "expired");

        let resumed = world.send(&session, "do you remember").await;
        run_end(&mut ws, &resumed, TURN).await;
        assert_eq!(run_end_of(&ws, &resumed)["state"], "completed");
        assert!(
            text_of_run(&ws, &resumed).contains("first: remember me"),
            "not resumed: {}",
            text_of_run(&ws, &resumed)
        );
        assert_eq!(world.native_id(&session).await, native);
        assert!(!world.work.join("never").exists());

        // The CLI loses the session file while the host is down.
        drop(ws);
        world.host.take().unwrap().stop().await;
        let files = session_files(world.dir.path());
        let file = files
            .iter()
            .find(|f| f.file_stem().is_some_and(|s| s == native.as_str()))
            .unwrap_or_else(|| panic!("no session file for {native} in {files:?}"));
        std::fs::remove_file(file).unwrap();
        world.host =
            Some(TestHost::start_with_agents(&world.dir.path().join("host"), world.agents()).await);
        let mut ws = world.follower(&session, false).await;
        let fresh = world.send(&session, "start over").await;
        run_end(&mut ws, &fresh, TURN).await;
        let kinds: Vec<String> = ws
            .of_run(&fresh)
            .iter()
            .map(|s| s.kind().to_owned())
            .collect();
        let of_run = ws.of_run(&fresh);
        let error = of_run.iter().find(|s| s.kind() == "error").unwrap();
        assert_eq!(error.event["category"], "resume_rejected", "{kinds:?}");
        let warning = of_run.iter().find(|s| s.kind() == "warning").unwrap();
        assert_eq!(warning.event["code"], "resume_rejected");
        let warned = kinds.iter().position(|k| k == "warning").unwrap();
        let texted = kinds.iter().position(|k| k == "text.end").unwrap();
        assert!(warned < texted, "{kinds:?}");
        assert_eq!(run_end_of(&ws, &fresh)["state"], "completed");
        assert_eq!(
            text_of_run(&ws, &fresh),
            "echo: start over [user turns seen: 1; first: start over]"
        );
        let new_native = world.native_id(&session).await;
        assert_ne!(new_native, native);
        let bound = of_run.iter().find(|s| s.kind() == "session.bound").unwrap();
        assert_eq!(bound.event["nativeSessionId"], new_native.as_str());
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 7: five prompts in a burst: the first runs, three wait, the oldest waiting one is
/// dropped with a visible warning; on the bus every run's `run.end` comes before the next
/// run's `user.text`, which comes before its `run.start`. A repeated `client_msg_id` is the
/// same run.
#[test]
fn a_burst_of_prompts_queues_three_and_keeps_the_order() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_burst_of_prompts_queues_three_and_keeps_the_order",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        let host = world.host();
        let started = Instant::now();
        let mut receipts = Vec::new();
        for i in 1..=5 {
            receipts.push(
                host.ok(
                    "session.send",
                    json!({"session_id": session, "text": format!("burst {i}"),
                           "client_msg_id": format!("k{i}")}),
                )
                .await,
            );
        }
        eprintln!("five prompts sent in {:?}", started.elapsed());
        // The same key again: the same run, nothing new queued (nothing more dropped).
        let again = host
            .ok(
                "session.send",
                json!({"session_id": session, "text": "burst 4", "client_msg_id": "k4"}),
            )
            .await;
        assert_eq!(again["run_id"], receipts[3]["run_id"]);
        assert_eq!(again["duplicate"], true);
        let runs: Vec<String> = receipts
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(receipts[0]["queued"], false);
        assert!(receipts[1..].iter().all(|r| r["queued"] == true));
        let mut unique = runs.clone();
        unique.dedup();
        assert_eq!(unique.len(), 5);

        // Everything settles: four runs end, one was dropped.
        let dropped = ws
            .until("followup_dropped", TURN, |s| {
                s.kind() == "warning" && s.event["code"] == "followup_dropped"
            })
            .await;
        assert_eq!(
            dropped.run_id, runs[1],
            "the oldest waiting prompt is dropped"
        );
        for run in [&runs[0], &runs[2], &runs[3], &runs[4]] {
            if !ws.of_run(run).iter().any(|s| s.kind() == "run.end") {
                run_end(&mut ws, run, TURN).await;
            }
            assert_eq!(run_end_of(&ws, run)["state"], "completed");
        }
        // The dropped prompt has its warning and its queue changes (queued, dropped), no run.
        assert!(
            ws.of_run(&runs[1])
                .iter()
                .all(|s| matches!(s.kind(), "warning" | "queue.changed"))
        );

        // The order rule, on what the bus delivered.
        let lifecycle: Vec<(String, String)> = ws
            .seen
            .iter()
            .filter(|s| matches!(s.kind(), "user.text" | "run.start" | "run.end"))
            .map(|s| (s.run_id.clone(), s.kind().to_owned()))
            .collect();
        let mut expected = Vec::new();
        for run in [&runs[0], &runs[2], &runs[3], &runs[4]] {
            for kind in ["user.text", "run.start", "run.end"] {
                expected.push((run.clone(), kind.to_owned()));
            }
        }
        assert_eq!(lifecycle, expected);
        // One user.text per key: the repeated k4 ran once.
        let k4 = ws
            .seen
            .iter()
            .filter(|s| s.kind() == "user.text" && s.event["clientMsgId"] == "k4")
            .count();
        assert_eq!(k4, 1);
        let texts: Vec<String> = [&runs[0], &runs[2], &runs[3], &runs[4]]
            .iter()
            .map(|r| text_of_run(&ws, r))
            .collect();
        assert!(texts[3].contains("burst 5") && texts[3].contains("first: burst 1"));
        let listed = host
            .ok(
                "session.history",
                json!({"session_id": session, "limit": 5000}),
            )
            .await;
        assert!(listed["count"].as_u64().unwrap() > 12);
        world.host.unwrap().stop().await;
    });
}

/// The tests' MCP server (`tests/mcp/probe_server.mjs`), by its absolute path.
fn probe_server() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/probe_server.mjs").to_owned()
}

/// The Messages API requests the mock was sent from the `from`-th body on.
fn model_requests(world: &World, from: usize) -> Vec<Value> {
    let bodies = world.mock.bodies.lock().unwrap();
    bodies
        .iter()
        .skip(from)
        .filter(|b| b.get("messages").is_some())
        .cloned()
        .collect()
}

fn bodies_so_far(world: &World) -> usize {
    world.mock.bodies.lock().unwrap().len()
}

/// Every content block of the user messages of a request (a string content as a text block).
fn user_blocks(request: &Value) -> Vec<Value> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| match &m["content"] {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => blocks.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// Acceptance 1 for claude: a session created with a model, a standing prompt and the stdio
/// probe MCP server. The mock sees the model in every request, the standing prompt in
/// `system` and in no user message, and the probe's tool (`mcp__probe__probe`) in `tools`;
/// the model's call of it asks permission like any tool, runs, and its answer comes back
/// through the host.
#[test]
fn session_options_reach_claude_and_its_mcp_tool_runs() {
    let Some(rt) = in_netns(
        Family::Claude,
        "session_options_reach_claude_and_its_mcp_tool_runs",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let created = world
            .host()
            .ok(
                "session.create",
                json!({
                    "agent_type": "claude",
                    "cwd": world.work.display().to_string(),
                    "model": "claude-test-model-x",
                    "system_prompt": "STANDING-PROMPT-123",
                    "mcp_servers": [{"type": "stdio", "name": "probe", "command": "node",
                                     "args": [probe_server()]}],
                }),
            )
            .await;
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut ws = world.follower(&session, false).await;

        let first = world.turn(&mut ws, &session, "hello options").await;
        assert_eq!(run_end_of(&ws, &first)["state"], "completed");
        let second = world.send(&session, "MCPCALL probe hello").await;
        let request = ws.until_kind("permission.request", TURN).await;
        assert_eq!(request.run_id, second);
        assert_eq!(request.event["tool"], "mcp__probe__probe");
        assert_eq!(request.event["input"], json!({"text": "hello"}));
        let request_id = request.event["requestId"].as_str().unwrap().to_owned();
        world
            .host()
            .ok(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "allow"}),
            )
            .await;
        let end = run_end(&mut ws, &second, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");
        let exec = ws
            .of_run(&second)
            .into_iter()
            .find(|s| s.kind() == "tool.exec.end")
            .map(|s| s.event.clone())
            .expect("no tool.exec.end");
        assert_eq!(exec["output"], "probe says: HELLO", "{exec}");
        assert_eq!(
            text_of_run(&ws, &second),
            "Calling it.tool said: probe says: HELLO"
        );

        let requests = model_requests(&world, 0);
        assert!(requests.len() >= 3, "{} requests", requests.len());
        for request in &requests {
            assert_eq!(request["model"], "claude-test-model-x");
            let system = request["system"].to_string();
            assert_eq!(
                system.matches("STANDING-PROMPT-123").count(),
                1,
                "the standing prompt once in system: {system}"
            );
            let users = Value::Array(user_blocks(request)).to_string();
            assert!(
                !users.contains("STANDING-PROMPT-123"),
                "the standing prompt in a user message: {users}"
            );
            let tools: Vec<&str> = request["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|t| t["name"].as_str())
                .collect();
            assert!(tools.contains(&"mcp__probe__probe"), "{tools:?}");
        }
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 2 for claude: `session.set_model` between two turns is taken live (the
/// `set_model` control request), and the second turn's requests carry the new model. The
/// CLI's record of the change in its session file is not taken for someone else's prompt:
/// after a host restart the session resumes, still on the new model.
#[test]
fn set_model_between_turns_reaches_the_next_requests() {
    let Some(rt) = in_netns(
        Family::Claude,
        "set_model_between_turns_reaches_the_next_requests",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Claude).await;
        let created = world
            .host()
            .ok(
                "session.create",
                json!({"agent_type": "claude", "cwd": world.work.display().to_string(),
                       "model": "claude-test-model-x"}),
            )
            .await;
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "first turn").await;
        assert!(
            model_requests(&world, 0)
                .iter()
                .all(|r| r["model"] == "claude-test-model-x")
        );

        let set = world
            .host()
            .ok(
                "session.set_model",
                json!({"session_id": session, "model": "claude-other-model-y"}),
            )
            .await;
        assert_eq!(set["applied"], "live", "{set}");
        assert_eq!(set["model"], "claude-other-model-y", "{set}");
        let from = bodies_so_far(&world);
        let second = world.turn(&mut ws, &session, "second turn").await;
        assert_eq!(run_end_of(&ws, &second)["state"], "completed");
        assert_eq!(
            text_of_run(&ws, &second),
            "echo: second turn [user turns seen: 2; first: first turn]"
        );
        let requests = model_requests(&world, from);
        assert!(!requests.is_empty());
        for request in &requests {
            assert_eq!(request["model"], "claude-other-model-y");
        }

        // A new process (after a host restart) resumes the session on the new model.
        world.restart().await;
        let mut ws = world.follower(&session, false).await;
        let from = bodies_so_far(&world);
        let third = world.turn(&mut ws, &session, "third turn").await;
        let end = run_end_of(&ws, &third);
        assert_eq!(end["state"], "completed", "{end}");
        assert_eq!(
            text_of_run(&ws, &third),
            "echo: third turn [user turns seen: 3; first: first turn]"
        );
        for request in &model_requests(&world, from) {
            assert_eq!(request["model"], "claude-other-model-y");
        }
        world.host.unwrap().stop().await;
    });
}

/// A 1x1 PNG.
const PIXEL_PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

/// Acceptance 3 for claude: an image attached by path (in the cwd) and one by its bytes reach
/// the mock as image blocks of the prompt's user message, and a text file as a document
/// block; a path out of the cwd, a symlink out of it and a device are refused over IPC with
/// `attachment_refused`.
#[test]
fn attachments_reach_claude_as_content_blocks() {
    let Some(rt) = in_netns(Family::Claude, "attachments_reach_claude_as_content_blocks") else {
        return;
    };
    rt.block_on(async {
        use base64::Engine as _;
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(PIXEL_PNG)
            .unwrap();
        std::fs::write(world.work.join("pixel.png"), &png).unwrap();

        // The last user message of the last request of a turn: the prompt's.
        let last_prompt = |from: usize| -> Vec<Value> {
            let requests = model_requests(&world, from);
            let last = requests.last().expect("no request").clone();
            let messages = last["messages"].as_array().unwrap();
            let prompt = messages.iter().rev().find(|m| m["role"] == "user").unwrap();
            prompt["content"].as_array().cloned().unwrap_or_default()
        };
        let image_of = |blocks: &[Value]| -> Vec<Value> {
            blocks
                .iter()
                .filter(|b| b["type"] == "image")
                .map(|b| b["source"].clone())
                .collect()
        };

        for (label, attachment) in [
            (
                "by path",
                json!({"path": world.work.join("pixel.png").display().to_string()}),
            ),
            (
                "by data",
                json!({"data_base64": PIXEL_PNG, "mime": "image/png", "name": "dot.png"}),
            ),
        ] {
            let from = bodies_so_far(&world);
            let sent = world
                .host()
                .ok(
                    "session.send",
                    json!({"session_id": session, "text": format!("look {label}"),
                           "attachments": [attachment]}),
                )
                .await;
            let run = sent["run_id"].as_str().unwrap().to_owned();
            let end = run_end(&mut ws, &run, TURN).await;
            assert_eq!(end["state"], "completed", "{label}: {end}");
            let blocks = last_prompt(from);
            assert_eq!(
                image_of(&blocks),
                [json!({"type": "base64", "media_type": "image/png", "data": PIXEL_PNG})],
                "{label}: {blocks:?}"
            );
            assert!(
                blocks
                    .iter()
                    .any(|b| b["type"] == "text" && b["text"] == format!("look {label}")),
                "{label}: {blocks:?}"
            );
        }

        // A text file goes as a document block of its text.
        let from = bodies_so_far(&world);
        let notes = base64::engine::general_purpose::STANDARD.encode("DOC-TEXT-CONTENT\n");
        let sent = world
            .host()
            .ok(
                "session.send",
                json!({"session_id": session, "text": "read the notes",
                       "attachments": [{"data_base64": notes, "mime": "text/plain",
                                        "name": "notes.txt"}]}),
            )
            .await;
        let run = sent["run_id"].as_str().unwrap().to_owned();
        assert_eq!(run_end(&mut ws, &run, TURN).await["state"], "completed");
        let blocks = last_prompt(from);
        let document = blocks
            .iter()
            .find(|b| b["type"] == "document")
            .unwrap_or_else(|| panic!("no document block: {blocks:?}"));
        assert_eq!(document["source"]["type"], "text");
        assert_eq!(document["source"]["data"], "DOC-TEXT-CONTENT\n");
        assert_eq!(document["title"], "notes.txt");

        // Out of the cwd, a symlink out of it, a device: refused before anything is sent.
        std::os::unix::fs::symlink("/etc/passwd", world.work.join("out.txt")).unwrap();
        let before = bodies_so_far(&world);
        for path in [
            "../../etc/passwd".to_owned(),
            world.work.join("out.txt").display().to_string(),
            "/dev/zero".to_owned(),
        ] {
            let refused = world
                .host()
                .ipc(
                    "session.send",
                    json!({"session_id": session, "text": "nope",
                           "attachments": [{"path": path}]}),
                )
                .await;
            assert_eq!(refused.code, 3010, "{path}: {}", refused.to_line());
        }
        assert_eq!(bodies_so_far(&world), before);
        world.host.unwrap().stop().await;
    });
}

/// Accept-edits through the host: a file-making command runs without asking (in `ask` mode
/// the same command asks: `permissions_are_answered_once_from_any_client`).
#[test]
fn accept_edits_runs_file_edits_without_asking() {
    let Some(rt) = in_netns(
        Family::Claude,
        "accept_edits_runs_file_edits_without_asking",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let created = world
            .host()
            .ok(
                "session.create",
                json!({"agent_type": "claude", "cwd": world.work.display().to_string(),
                       "permission_mode": "accept_edits"}),
            )
            .await;
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut ws = world.follower(&session, false).await;
        let run = world
            .turn(
                &mut ws,
                &session,
                "TOOLCALL `touch edited && echo edited-out`",
            )
            .await;
        assert_eq!(run_end_of(&ws, &run)["state"], "completed");
        let kinds: Vec<&str> = ws.of_run(&run).iter().map(|s| s.kind()).collect();
        assert!(!kinds.contains(&"permission.request"), "{kinds:?}");
        assert!(kinds.contains(&"tool.exec.end"), "{kinds:?}");
        assert!(world.work.join("edited").exists());
        world.host.unwrap().stop().await;
    });
}

/// The driver alone, with the real CLI: `bypass` (with `IS_SANDBOX=1`, which a root user's
/// environment must carry; the host never sets it) runs tools without asking, and MCP
/// servers over HTTP and SSE (the probe in `--http` mode) give the model their tools.
#[test]
fn bypass_and_http_and_sse_mcp_servers_work_in_the_driver() {
    use agent_host::adapter::spawn::filter_env;
    use agent_host::adapter::{AgentOutput, Native, OpenSpec, claude_process};
    use agent_host::protocol::events::EventBody;
    use agent_host::protocol::options::{McpServer, PermissionMode, SessionOptions};
    use tokio::io::AsyncBufReadExt;

    let Some(rt) = in_netns(
        Family::Claude,
        "bypass_and_http_and_sse_mcp_servers_work_in_the_driver",
    ) else {
        return;
    };
    rt.block_on(async {
        let mock = common::mock_model::MockModel::start(0).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        let work = home.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let mut probe = tokio::process::Command::new("node")
            .arg(probe_server())
            .arg("--http")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut out = tokio::io::BufReader::new(probe.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(TURN, out.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let port: u16 = line.strip_prefix("listening ").unwrap().parse().unwrap();
        let spec = OpenSpec {
            program: Family::Claude.binary(),
            args: Vec::new(),
            cwd: work.clone(),
            base_env: filter_env(common::agents::agent_env(home.path(), &mock)),
            extra_env: vec![("IS_SANDBOX".to_owned(), "1".to_owned())],
            host_session_id: "host-options".to_owned(),
            home: None,
            native: Native::New(uuid::Uuid::new_v4().to_string()),
            options: SessionOptions {
                mcp_servers: vec![
                    McpServer::Http {
                        name: "hp".to_owned(),
                        url: format!("http://127.0.0.1:{port}/mcp"),
                        headers: Vec::new(),
                    },
                    McpServer::Sse {
                        name: "sp".to_owned(),
                        url: format!("http://127.0.0.1:{port}/sse"),
                        headers: Vec::new(),
                    },
                ],
                permission_mode: Some(PermissionMode::Bypass),
                ..SessionOptions::default()
            },
        };
        let mut agent = tokio::spawn(async move { claude_process::open(spec) })
            .await
            .unwrap()
            .unwrap();
        let mut turn = async |text: &str| -> Vec<EventBody> {
            agent
                .send(text, &uuid::Uuid::new_v4().to_string())
                .await
                .unwrap();
            let mut events = Vec::new();
            loop {
                let next = tokio::time::timeout(TURN, agent.events.recv())
                    .await
                    .expect("the turn did not end")
                    .expect("the driver ended");
                if let AgentOutput::Event(event) = next {
                    let end = matches!(event, EventBody::RunEnd(_));
                    events.push(event);
                    if end {
                        return events;
                    }
                }
            }
        };
        for (text, said) in [
            ("MCPCALL hp__probe via-http", "probe says: VIA-HTTP"),
            ("MCPCALL sp__probe via-sse", "probe says: VIA-SSE"),
            ("TOOLCALL `touch ../bypassed && echo bypassed`", "bypassed"),
        ] {
            let events = turn(text).await;
            assert!(
                !events
                    .iter()
                    .any(|e| matches!(e, EventBody::PermissionRequest(_))),
                "{text}: {events:?}"
            );
            let output = events.iter().find_map(|e| match e {
                EventBody::ToolExecEnd(t) => Some(t.output.clone()),
                _ => None,
            });
            assert_eq!(output.as_deref(), Some(said), "{text}: {events:?}");
            assert!(
                matches!(events.last(), Some(EventBody::RunEnd(e)) if e.state == agent_host::protocol::events::RunState::Completed),
                "{text}: {events:?}"
            );
        }
        assert!(home.path().join("bypassed").exists());
        let first = mock
            .bodies
            .lock()
            .unwrap()
            .iter()
            .find(|b| b.get("tools").is_some())
            .cloned()
            .unwrap();
        let tools: Vec<String> = first["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        assert!(tools.contains(&"mcp__hp__probe".to_owned()), "{tools:?}");
        assert!(tools.contains(&"mcp__sp__probe".to_owned()), "{tools:?}");
        drop(probe.stdin.take());
    });
}
