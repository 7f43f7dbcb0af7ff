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

use crate::common;

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
        // The app-server is the native binary the npm package ships (issue 19), not a node
        // launcher in front of it.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert!(
            exe.ends_with("bin/codex") && exe.components().any(|c| c.as_os_str() == "vendor"),
            "the agent runs {}",
            exe.display()
        );
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

/// Issue 18, through the driver (`codex_process::open` with `OpenSpec.options`, as the host
/// opens it): what the real app-server does with a session's options and attachments.
mod options {
    use std::path::Path;
    use std::time::Duration;

    use agent_host::adapter::{
        AgentOutput, AgentSession, ModelSwitch, Native, OpenSpec, codex_process,
    };
    use agent_host::protocol::events::{EventBody, PermissionRequest, RunState};
    use agent_host::protocol::options::{
        Attachment, AttachmentKind, McpServer, PermissionMode, SessionOptions,
    };
    use serde_json::Value;

    use super::common::agents::{codex_env, ensure_codex, write_codex_config};
    use super::common::mock_model::MockModel;
    use super::common::world::TURN;

    /// A 2×2 red PNG.
    pub const PNG: [u8; 73] = [
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0xfd,
        0xd4, 0x9a, 0x73, 0x00, 0x00, 0x00, 0x10, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8,
        0xcf, 0xc0, 0x00, 0x44, 0x0c, 0x10, 0x0a, 0x00, 0x1f, 0xee, 0x03, 0xfd, 0x8b, 0x5f, 0x14,
        0xd4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ];

    /// The standing prompt the tests give.
    pub const STANDING: &str = "STANDING-PROMPT-123";

    /// The tests' MCP server (`tests/mcp/probe_server.mjs`) as a stdio server named `probe`.
    pub fn probe_server() -> McpServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/probe_server.mjs");
        McpServer::Stdio {
            name: "probe".to_owned(),
            command: "node".to_owned(),
            args: vec![script.to_str().unwrap().to_owned()],
            env: Vec::new(),
        }
    }

    /// The tests' MCP server over streamable HTTP (`tests/mcp/probe_server.mjs --http`) on a
    /// free loopback port, logging what it is sent to `log`: the process (killed when
    /// dropped; it also ends when its stdin closes) and its URL.
    pub async fn http_probe(log: &Path) -> (tokio::process::Child, String) {
        use tokio::io::AsyncBufReadExt;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/probe_server.mjs");
        let mut child = tokio::process::Command::new("node")
            .arg(script)
            .arg("--http")
            .env("PROBE_LOG", log)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("the HTTP probe did not start")
        .unwrap();
        let port = line.trim().strip_prefix("listening ").unwrap().to_owned();
        (child, format!("http://127.0.0.1:{port}/mcp"))
    }

    /// The real app-server opened by the host's driver with `options`, against the mock.
    pub struct Driven {
        pub mock: MockModel,
        pub home: tempfile::TempDir,
        pub session: AgentSession,
    }

    /// One turn's outputs, and the permission requests it asked (each answered with
    /// `allow`).
    pub struct Turn {
        pub outputs: Vec<AgentOutput>,
        pub asked: Vec<PermissionRequest>,
    }

    impl Turn {
        pub fn text(&self) -> String {
            self.outputs
                .iter()
                .filter_map(|o| match o {
                    AgentOutput::Event(EventBody::TextEnd(end)) => Some(end.text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
        }

        /// The thread id `session.bound` named.
        pub fn thread(&self) -> Option<String> {
            self.outputs.iter().find_map(|o| match o {
                AgentOutput::Event(EventBody::SessionBound(b)) => Some(b.native_session_id.clone()),
                _ => None,
            })
        }

        pub fn state(&self) -> Option<RunState> {
            self.outputs.iter().find_map(|o| match o {
                AgentOutput::Event(EventBody::RunEnd(end)) => Some(end.state),
                _ => None,
            })
        }
    }

    impl Driven {
        pub async fn open(options: SessionOptions) -> Driven {
            let mock = MockModel::start(0).await.unwrap();
            let home = tempfile::tempdir().unwrap();
            std::fs::create_dir(home.path().join("work")).unwrap();
            write_codex_config(&home.path().join(".codex"), &mock);
            Driven::reopen(mock, home, Native::New("n1".into()), options)
        }

        /// A new app-server on the same home and mock, opening `native` with `options`.
        pub fn reopen(
            mock: MockModel,
            home: tempfile::TempDir,
            native: Native,
            options: SessionOptions,
        ) -> Driven {
            let session = codex_process::open(OpenSpec {
                program: ensure_codex(),
                args: Vec::new(),
                cwd: home.path().join("work"),
                // Unfiltered: the provider's key variable must reach Codex.
                base_env: codex_env(home.path(), &mock),
                extra_env: Vec::new(),
                host_session_id: "host-options".into(),
                home: None,
                native,
                options,
            })
            .unwrap();
            Driven {
                mock,
                home,
                session,
            }
        }

        /// Close the app-server; the mock and the home stay for [`Driven::reopen`].
        pub async fn closed(self) -> (MockModel, tempfile::TempDir) {
            let Driven {
                mock,
                home,
                session,
            } = self;
            session.close(Duration::from_secs(5)).await;
            (mock, home)
        }

        /// Send a prompt and collect through its run's end, answering every permission
        /// request `allow` (or `deny`, with `allow` false).
        pub async fn turn(&mut self, text: &str, attachments: &[Attachment], allow: bool) -> Turn {
            let id = format!("run-{}", self.mock.bodies.lock().unwrap().len());
            self.session
                .send_with(text, &id, attachments)
                .await
                .unwrap();
            let mut outputs = Vec::new();
            let mut asked = Vec::new();
            loop {
                let next = tokio::time::timeout(TURN, self.session.events.recv())
                    .await
                    .expect("codex went silent")
                    .expect("the driver ended");
                if let AgentOutput::Event(EventBody::PermissionRequest(request)) = &next {
                    self.session
                        .respond_permission(&request.request_id, allow, &request.input, None)
                        .await
                        .unwrap();
                    asked.push(request.clone());
                }
                let end = matches!(next, AgentOutput::Event(EventBody::RunEnd(_)));
                outputs.push(next);
                if end {
                    break;
                }
            }
            Turn { outputs, asked }
        }

        /// The Responses API requests the mock was sent.
        pub fn bodies(&self) -> Vec<Value> {
            self.mock
                .bodies
                .lock()
                .unwrap()
                .iter()
                .filter(|b| b.get("input").is_some())
                .cloned()
                .collect()
        }

        pub async fn close(self) {
            self.session.close(Duration::from_secs(5)).await;
        }
    }

    /// The texts of a request's `input` messages of `role`.
    pub fn texts_of(body: &Value, role: &str) -> Vec<String> {
        body["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["role"] == role)
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["text"].as_str().map(str::to_owned))
            .collect()
    }

    /// The image parts (`input_image`) of a request's user messages.
    pub fn images_of(body: &Value) -> Vec<Value> {
        body["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["role"] == "user")
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter(|p| p["type"] == "input_image")
            .collect()
    }

    /// The tool names a request offers, a namespace's as `<namespace>__<name>`.
    pub fn tools_of(body: &Value) -> Vec<String> {
        let mut names = Vec::new();
        for tool in body["tools"].as_array().into_iter().flatten() {
            let name = tool["name"].as_str().unwrap_or_default();
            match tool["tools"].as_array() {
                Some(inner) => names.extend(
                    inner
                        .iter()
                        .filter_map(|t| t["name"].as_str())
                        .map(|t| format!("{name}__{t}")),
                ),
                None => names.push(name.to_owned()),
            }
        }
        names
    }

    /// An image attachment as the host hands it to a driver: its copy at `path`.
    pub fn image_at(path: &Path) -> Attachment {
        std::fs::write(path, PNG).unwrap();
        Attachment {
            name: "red.png".to_owned(),
            mime: "image/png".to_owned(),
            kind: AttachmentKind::Image,
            bytes: PNG.len() as u64,
            sha256: String::new(),
            path: path.to_owned(),
        }
    }

    pub fn with_all(mode: Option<PermissionMode>) -> SessionOptions {
        SessionOptions {
            model: Some("mock-model-b".to_owned()),
            system_prompt: Some(STANDING.to_owned()),
            mcp_servers: vec![probe_server()],
            permission_mode: mode,
        }
    }

    /// The model switch the driver answered.
    pub async fn switch(driven: &Driven, model: &str) -> ModelSwitch {
        driven.session.set_model(model).await.unwrap()
    }
}

/// Acceptance 1 (driver side): the model, the standing prompt and a stdio MCP server reach
/// the model as Codex's own: every request names `mock-model-b` and offers the probe tool
/// (namespace `mcp__probe`), and holds the standing prompt once, as a developer message, in no
/// user message; the MCP call is asked (`permission.request` for `mcp__probe__probe`), runs
/// once allowed, and its result comes back in the turn's text. With the tool denied, it does
/// not run.
#[test]
fn codex_driver_maps_model_prompt_and_mcp_server() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_driver_maps_model_prompt_and_mcp_server",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut codex = options::Driven::open(options::with_all(None)).await;
        let first = codex.turn("hello", &[], true).await;
        assert_eq!(
            first.state(),
            Some(agent_host::protocol::events::RunState::Completed)
        );
        let second = codex.turn("MCPCALL probe hello", &[], true).await;
        assert_eq!(second.asked.len(), 1, "{:#?}", second.outputs);
        let asked = &second.asked[0];
        assert_eq!(asked.tool, "mcp__probe__probe", "{asked:?}");
        assert_eq!(asked.input, json!({"text": "hello"}));
        assert!(
            second.text().contains("tool said: probe says: HELLO"),
            "{}",
            second.text()
        );
        let denied = codex.turn("MCPCALL probe never", &[], false).await;
        assert_eq!(denied.asked.len(), 1, "{:#?}", denied.outputs);
        assert!(!denied.text().contains("NEVER"), "{}", denied.text());
        let bodies = codex.bodies();
        assert!(bodies.len() >= 5, "{}", bodies.len());
        for body in &bodies {
            assert_eq!(body["model"], "mock-model-b");
            let developer = options::texts_of(body, "developer");
            let standing = developer.iter().filter(|t| *t == options::STANDING).count();
            assert_eq!(standing, 1, "{developer:#?}");
            let users = options::texts_of(body, "user");
            assert!(
                users.iter().all(|t| !t.contains(options::STANDING)),
                "{users:#?}"
            );
            assert!(body.to_string().matches(options::STANDING).count() == 1);
            let tools = options::tools_of(body);
            assert!(tools.contains(&"mcp__probe__probe".to_owned()), "{tools:?}");
        }
        codex.close().await;
    });
}

/// Acceptance 2 (driver side): `set_model` between two turns is Codex's per-turn override:
/// the driver says `next_turn`, and the second turn's request (and the next one's) names the
/// new model.
#[test]
fn codex_driver_set_model_applies_to_the_next_turn() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_driver_set_model_applies_to_the_next_turn",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut codex = options::Driven::open(agent_host::protocol::options::SessionOptions {
            model: Some("mock-model-b".to_owned()),
            ..Default::default()
        })
        .await;
        codex.turn("one", &[], true).await;
        assert_eq!(
            options::switch(&codex, "mock-model-c").await,
            agent_host::adapter::ModelSwitch::NextTurn
        );
        let second = codex.turn("two", &[], true).await;
        assert!(
            second.text().contains("echo: two [user turns seen: 2"),
            "{}",
            second.text()
        );
        codex.turn("three", &[], true).await;
        let models: Vec<Value> = codex.bodies().iter().map(|b| b["model"].clone()).collect();
        assert_eq!(
            models,
            [
                json!("mock-model-b"),
                json!("mock-model-c"),
                json!("mock-model-c")
            ]
        );
        codex.close().await;
    });
}

/// Acceptance 3 (driver side): an image attachment goes with the prompt as a `localImage`
/// input, and the mock sees it as an `input_image` (a PNG data URL of the bytes) in that
/// turn's user message, next to the prompt's text.
#[test]
fn codex_driver_sends_an_image_as_input_image() {
    let Some(rt) = in_netns(Family::Codex, "codex_driver_sends_an_image_as_input_image") else {
        return;
    };
    rt.block_on(async {
        let mut codex = options::Driven::open(Default::default()).await;
        let image = options::image_at(&codex.home.path().join("red.png"));
        let turn = codex.turn("what is this", &[image], true).await;
        assert!(
            turn.text()
                .contains("echo: what is this [user turns seen: 1"),
            "{}",
            turn.text()
        );
        let bodies = codex.bodies();
        let images = options::images_of(&bodies[0]);
        assert_eq!(images.len(), 1, "{:#}", bodies[0]["input"]);
        use base64::Engine as _;
        let expected = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(options::PNG)
        );
        assert_eq!(images[0]["image_url"], expected.as_str());
        codex.close().await;
    });
}

/// `bypass` is approval `never` + sandbox `danger-full-access`: a command writing outside the
/// workspace and an MCP tool call both run with nothing asked.
#[test]
fn codex_driver_bypass_asks_nothing() {
    let Some(rt) = in_netns(Family::Codex, "codex_driver_bypass_asks_nothing") else {
        return;
    };
    rt.block_on(async {
        use agent_host::protocol::options::PermissionMode;
        let mut codex =
            options::Driven::open(options::with_all(Some(PermissionMode::Bypass))).await;
        let outside = codex.home.path().join("outside");
        let prompt = format!("TOOLCALL `touch {} && echo bypassed`", outside.display());
        let shell = codex.turn(&prompt, &[], false).await;
        assert!(shell.asked.is_empty(), "{:#?}", shell.asked);
        assert!(outside.exists(), "{:#?}", shell.outputs);
        let mcp = codex.turn("MCPCALL probe quiet", &[], false).await;
        assert!(mcp.asked.is_empty(), "{:#?}", mcp.asked);
        assert!(mcp.text().contains("probe says: QUIET"), "{}", mcp.text());
        codex.close().await;
    });
}

/// Issue 18 acceptance 1 (Codex, through the whole host): a session created with a model, a
/// standing prompt and the probe MCP server — every request the mock sees names the model,
/// holds the standing prompt once as a developer message (never in a user message), and
/// offers the probe tool; the MCP call is asked of a client (`permission.request` for
/// `mcp__probe__probe`), runs once allowed, and its result comes back in the run's text.
/// What Codex cannot honour is refused at create: `accept_edits`, an SSE MCP server.
#[test]
fn codex_session_options_reach_the_model() {
    let Some(rt) = in_netns(Family::Codex, "codex_session_options_reach_the_model") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let cwd = world.work.display().to_string();
        let probe = serde_json::to_value(options::probe_server()).unwrap();
        let created = world
            .host()
            .ok(
                "session.create",
                json!({"agent_type": "codex", "cwd": cwd, "model": "mock-model-b",
                       "system_prompt": options::STANDING, "mcp_servers": [probe]}),
            )
            .await;
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut ws = world.follower(&session, false).await;
        let first = world.send(&session, "hello").await;
        assert_eq!(run_end(&mut ws, &first, TURN).await["state"], "completed");
        let second = world.send(&session, "MCPCALL probe hello").await;
        let request = ws.until_kind("permission.request", TURN).await;
        assert_eq!(request.run_id, second);
        assert_eq!(
            request.event["tool"], "mcp__probe__probe",
            "{}",
            request.event
        );
        assert_eq!(request.event["input"], json!({"text": "hello"}));
        ws.ok(
            "permission.respond",
            json!({"session_id": session, "request_id": request.event["requestId"],
                   "decision": "allow"}),
        )
        .await;
        assert_eq!(run_end(&mut ws, &second, TURN).await["state"], "completed");
        let said = text_of_run(&ws, &second);
        assert!(said.contains("tool said: probe says: HELLO"), "{said}");

        let bodies: Vec<Value> = world.mock.bodies.lock().unwrap().clone();
        assert!(bodies.len() >= 3, "{}", bodies.len());
        for body in &bodies {
            assert_eq!(body["model"], "mock-model-b");
            let developer = options::texts_of(body, "developer");
            assert_eq!(
                developer.iter().filter(|t| *t == options::STANDING).count(),
                1,
                "{developer:#?}"
            );
            assert_eq!(body.to_string().matches(options::STANDING).count(), 1);
            let users = options::texts_of(body, "user");
            assert!(
                users.iter().all(|t| !t.contains(options::STANDING)),
                "{users:#?}"
            );
            let tools = options::tools_of(body);
            assert!(tools.contains(&"mcp__probe__probe".to_owned()), "{tools:?}");
        }

        for (option, value) in [
            ("permission_mode", json!("accept_edits")),
            (
                "mcp_servers",
                json!([{"type": "sse", "name": "s", "url": "http://127.0.0.1:9/sse"}]),
            ),
        ] {
            let mut params = json!({"agent_type": "codex", "cwd": cwd});
            params[option] = value;
            let refused = world.host().ipc("session.create", params).await;
            assert_eq!(refused.code, 3008, "{option}: {}", refused.to_line());
            assert_eq!(refused.data["error"], "option_unsupported");
        }
        world.host.unwrap().stop().await;
    });
}

/// Issue 18 acceptance 2 (Codex): `session.set_model` between two turns is applied on the
/// next turn (Codex's per-turn override): the mock sees the new model on the second turn's
/// request.
#[test]
fn codex_set_model_between_turns() {
    let Some(rt) = in_netns(Family::Codex, "codex_set_model_between_turns") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let created = world
            .host()
            .ok(
                "session.create",
                json!({"agent_type": "codex", "cwd": world.work.display().to_string(),
                       "model": "mock-model-b"}),
            )
            .await;
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "one").await;
        let switched = world
            .host()
            .ok(
                "session.set_model",
                json!({"session_id": session, "model": "mock-model-c"}),
            )
            .await;
        assert_eq!(switched["applied"], "next_turn", "{switched}");
        assert_eq!(switched["model"], "mock-model-c", "{switched}");
        let second = world.turn(&mut ws, &session, "two").await;
        assert!(
            text_of_run(&ws, &second).contains("echo: two [user turns seen: 2"),
            "{}",
            text_of_run(&ws, &second)
        );
        let models: Vec<Value> = world
            .mock
            .bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| b["model"].clone())
            .collect();
        assert_eq!(models, [json!("mock-model-b"), json!("mock-model-c")]);
        world.host.unwrap().stop().await;
    });
}

/// Issue 18 acceptance 3 (Codex): an image attached to `session.send` reaches the mock as an
/// `input_image` of its bytes in that turn's user message; `../../etc/passwd`, a symlink out
/// of the cwd and `/dev/zero` are refused (`attachment_refused`), and a file attachment is
/// not Codex's to take (`option_unsupported`).
#[test]
fn codex_image_attachment_reaches_the_model() {
    let Some(rt) = in_netns(Family::Codex, "codex_image_attachment_reaches_the_model") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        std::fs::write(world.work.join("red.png"), options::PNG).unwrap();
        let sent = world
            .host()
            .ok(
                "session.send",
                json!({"session_id": session, "text": "what is this",
                       "attachments": [{"path": "red.png"}]}),
            )
            .await;
        let run = sent["run_id"].as_str().unwrap().to_owned();
        assert_eq!(run_end(&mut ws, &run, TURN).await["state"], "completed");
        assert!(
            text_of_run(&ws, &run).contains("echo: what is this [user turns seen: 1"),
            "{}",
            text_of_run(&ws, &run)
        );
        let bodies: Vec<Value> = world.mock.bodies.lock().unwrap().clone();
        let images = options::images_of(&bodies[0]);
        assert_eq!(images.len(), 1, "{:#}", bodies[0]["input"]);
        use base64::Engine as _;
        let expected = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(options::PNG)
        );
        assert_eq!(images[0]["image_url"], expected.as_str());

        let outside = world.dir.path().join("secret.png");
        std::fs::write(&outside, options::PNG).unwrap();
        std::os::unix::fs::symlink(&outside, world.work.join("link.png")).unwrap();
        for (attachment, error) in [
            (json!({"path": "../../etc/passwd"}), "attachment_refused"),
            (json!({"path": "link.png"}), "attachment_refused"),
            (json!({"path": "/dev/zero"}), "attachment_refused"),
            (
                json!({"data_base64": "aGVsbG8=", "mime": "text/plain", "name": "a.txt"}),
                "option_unsupported",
            ),
        ] {
            let refused = world
                .host()
                .ipc(
                    "session.send",
                    json!({"session_id": session, "text": "no", "attachments": [attachment]}),
                )
                .await;
            assert_eq!(
                refused.data["error"],
                error,
                "{attachment}: {}",
                refused.to_line()
            );
        }
        assert_eq!(world.mock.bodies.lock().unwrap().len(), bodies.len());
        world.host.unwrap().stop().await;
    });
}

/// An MCP server over streamable HTTP is a `config` override with its `url` and
/// `http_headers`: Codex connects to it (the headers on every request), offers its tool
/// (namespace `mcp__<name>`), asks before calling it, and the result comes back.
#[test]
fn codex_driver_maps_an_http_mcp_server() {
    let Some(rt) = in_netns(Family::Codex, "codex_driver_maps_an_http_mcp_server") else {
        return;
    };
    rt.block_on(async {
        use agent_host::protocol::options::{Header, McpServer, SessionOptions};
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("http.log");
        let (_server, url) = options::http_probe(&log).await;
        let mut codex = options::Driven::open(SessionOptions {
            model: Some("mock-model-b".to_owned()),
            mcp_servers: vec![McpServer::Http {
                name: "web".to_owned(),
                url,
                headers: vec![Header {
                    name: "X-Probe".to_owned(),
                    value: "yes".to_owned(),
                }],
            }],
            ..Default::default()
        })
        .await;
        let turn = codex.turn("MCPCALL probe over http", &[], true).await;
        assert_eq!(turn.asked.len(), 1, "{:#?}", turn.outputs);
        assert_eq!(turn.asked[0].tool, "mcp__web__probe");
        assert!(
            turn.text().contains("tool said: probe says: OVER HTTP"),
            "{}",
            turn.text()
        );
        let tools = options::tools_of(&codex.bodies()[0]);
        assert!(tools.contains(&"mcp__web__probe".to_owned()), "{tools:?}");
        let logged: Vec<Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let methods: Vec<&str> = logged
            .iter()
            .filter_map(|l| l["message"]["method"].as_str())
            .collect();
        assert!(methods.contains(&"tools/call"), "{methods:?}");
        assert!(
            logged.iter().all(|l| l["headers"]["x-probe"] == "yes"),
            "{logged:#?}"
        );
        codex.close().await;
    });
}

/// What a resume does with changed options (evidence for the binding's "reconfigured" rule):
/// the model and the MCP servers `thread/resume` carries take effect, and so they do on
/// `thread/fork`; the developer instructions do not — Codex keeps the thread's own (the
/// first thread/start's) and the new standing prompt never reaches the model.
#[test]
fn codex_resume_applies_a_new_model_and_mcp_servers_but_keeps_the_threads_prompt() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_resume_applies_a_new_model_and_mcp_servers_but_keeps_the_threads_prompt",
    ) else {
        return;
    };
    rt.block_on(async {
        use agent_host::adapter::Native;
        use agent_host::protocol::options::SessionOptions;
        let mut first = options::Driven::open(SessionOptions {
            model: Some("mock-model-b".to_owned()),
            system_prompt: Some(options::STANDING.to_owned()),
            ..Default::default()
        })
        .await;
        let opened = first.turn("one", &[], true).await;
        let thread = opened.thread().unwrap();
        let (mut mock, mut home) = first.closed().await;
        let changed = SessionOptions {
            model: Some("mock-model-c".to_owned()),
            system_prompt: Some("NEW-PROMPT-456".to_owned()),
            mcp_servers: vec![options::probe_server()],
            permission_mode: None,
        };
        for native in [Native::Resume(thread.clone()), Native::Fork(thread.clone())] {
            let fork = matches!(native, Native::Fork(_));
            let before = mock.bodies.lock().unwrap().len();
            let mut again = options::Driven::reopen(mock, home, native, changed.clone());
            let turn = again.turn("MCPCALL probe again", &[], true).await;
            assert!(
                turn.text().contains("tool said: probe says: AGAIN"),
                "fork {fork}: {}",
                turn.text()
            );
            let bodies = again.bodies();
            for body in &bodies[before..] {
                assert_eq!(body["model"], "mock-model-c", "fork {fork}");
                let text = body.to_string();
                assert_eq!(text.matches(options::STANDING).count(), 1, "fork {fork}");
                assert_eq!(text.matches("NEW-PROMPT-456").count(), 0, "fork {fork}");
            }
            (mock, home) = again.closed().await;
        }
    });
}
