//! Steering a running turn (issue 17) with the real CLIs against the project's mock model,
//! each test inside its own loopback-only network namespace:
//! - Codex through the host's driver (`AgentSession::steer` → app-server `turn/steer`): the
//!   steer reaches the running turn (the model's next request in that turn carries it) and
//!   the run ends once (`codex_a_steer_reaches_the_running_turn`).
//! - What Claude Code does with a user message written to its stream-json stdin while a
//!   turn runs (`claude_takes_a_message_mid_turn_only_at_a_tool_boundary`), and what an ACP
//!   agent (the pinned claude-agent-acp) does with a second `session/prompt` while one runs
//!   (`acp_a_second_prompt_mid_turn_ends_the_first_prompt`): the evidence behind their
//!   families' `steer` capability.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::time::Duration;

use agent_host::adapter::spawn::{SpawnSpec, filter_env, spawn};
use agent_host::adapter::{AdapterError, AgentOutput, Native, OpenSpec, codex_process};
use agent_host::protocol::events::{EventBody, RunState};
use common::agents::{
    agent_env, codex_env, ensure_claude, ensure_claude_acp, ensure_codex, in_loopback_only_netns,
    write_codex_config,
};
use common::mock_model::MockModel;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How long a real turn against the mock may take.
const TURN: Duration = Duration::from_secs(60);

/// What Claude Code puts into the next request of a running turn for a message written
/// meanwhile (a `system`-role message in `messages`).
const INJECTED: &str = "The user sent a new message while you were working:\nSTEERED two\n";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Whether a request body (Anthropic `messages`) holds Claude's injection of the steer.
fn has_injection(body: &Value) -> bool {
    body["messages"].as_array().into_iter().flatten().any(|m| {
        m["role"] == "system"
            && m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with(INJECTED))
    })
}

/// Whether a request body (Anthropic `messages`) holds `text` as a user prompt.
fn has_user_text(body: &Value, text: &str) -> bool {
    body["messages"].as_array().into_iter().flatten().any(|m| {
        m["role"] == "user"
            && match &m["content"] {
                Value::String(s) => s == text,
                Value::Array(blocks) => blocks.iter().any(|b| b["text"] == text),
                _ => false,
            }
    })
}

/// The user texts of a Responses API request (its `input` user messages' text parts).
fn responses_user_texts(body: &Value) -> Vec<String> {
    body["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["role"] == "user")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect()
}

/// What the real Codex did with a steer, through the host's driver.
struct CodexRun {
    /// A steer sent before any turn ran.
    early: Result<(), AdapterError>,
    /// The steer sent once the turn streamed its first text delta.
    steer: Result<(), AdapterError>,
    /// Every output through the run's end.
    outputs: Vec<AgentOutput>,
    /// The outputs of a marker turn started after that end, through its own end: a turn the
    /// steer started on its own would come before it.
    after: Vec<AgentOutput>,
    /// What the model was sent.
    bodies: Vec<Value>,
}

/// Open the real Codex, steer with no turn running, start a turn with `prompt`, steer it with
/// `steer` at its first text delta, and collect until its end (and a quiet while after).
async fn codex_steered(prompt: &str, steer: &str) -> CodexRun {
    let mock = MockModel::start(0).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let work = home.path().join("work");
    std::fs::create_dir(&work).unwrap();
    write_codex_config(&home.path().join(".codex"), &mock);
    let mut session = codex_process::open(OpenSpec {
        program: ensure_codex(),
        args: Vec::new(),
        cwd: work,
        // Unfiltered: the provider's key variable must reach Codex.
        base_env: codex_env(home.path(), &mock),
        extra_env: Vec::new(),
        host_session_id: "host-steer".into(),
        home: None,
        native: Native::New("n1".into()),
        options: Default::default(),
    })
    .unwrap();
    let early = session.steer("too early", "run-0").await;
    session.send(prompt, "run-1").await.unwrap();
    let mut outputs = Vec::new();
    let mut steered = None;
    loop {
        let next = tokio::time::timeout(TURN, session.events.recv())
            .await
            .expect("codex went silent")
            .expect("the driver ended");
        let delta = matches!(next, AgentOutput::Event(EventBody::TextDelta(_)));
        let end = matches!(next, AgentOutput::Event(EventBody::RunEnd(_)));
        outputs.push(next);
        if delta && steered.is_none() {
            steered = Some(session.steer(steer, "run-1").await);
        }
        if end {
            break;
        }
    }
    // A second turn of the steer's own would start at once, before the marker's.
    session.send("MARKER three", "run-2").await.unwrap();
    let mut after = Vec::new();
    loop {
        let next = tokio::time::timeout(TURN, session.events.recv())
            .await
            .expect("codex went silent")
            .expect("the driver ended");
        let end = matches!(next, AgentOutput::Event(EventBody::RunEnd(_)));
        after.push(next);
        if end {
            break;
        }
    }
    session.close(Duration::from_secs(5)).await;
    let bodies = mock.bodies.lock().unwrap().clone();
    let steer = steered.unwrap_or_else(|| panic!("no text delta before the end: {outputs:#?}"));
    CodexRun {
        early,
        steer,
        outputs,
        after,
        bodies,
    }
}

/// Acceptance 3 (adapter side): during a slow turn, a steer is taken by the running turn
/// (`turn/steer`): Codex's next model request in that turn carries it after the prompt, the
/// turn's answer is the mock's reply to it, and the run ends once, completed. A steer with
/// no turn running is refused (the session layer then queues it).
#[test]
fn codex_a_steer_reaches_the_running_turn() {
    ensure_codex();
    if !in_loopback_only_netns("codex_a_steer_reaches_the_running_turn") {
        return;
    }
    runtime().block_on(async move {
        let run = codex_steered("SLOW one", "STEERED two").await;
        let early = run
            .early
            .expect_err("a steer with no turn running was taken");
        assert!(early.message.contains("no turn"), "{early:?}");
        run.steer.expect("the running turn did not take the steer");

        let ends: Vec<_> = run
            .outputs
            .iter()
            .filter_map(|o| match o {
                AgentOutput::Event(EventBody::RunEnd(end)) => Some(end),
                _ => None,
            })
            .collect();
        assert_eq!(ends.len(), 1, "{:#?}", run.outputs);
        assert_eq!(ends[0].state, RunState::Completed);
        let texts: Vec<&str> = run
            .outputs
            .iter()
            .filter_map(|o| match o {
                AgentOutput::Event(EventBody::TextEnd(t)) => Some(t.text.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            texts.contains(&"echo: STEERED two [user turns seen: 2; first: SLOW one]"),
            "{texts:?}"
        );
        // The next turn is the marker's: nothing ran in between.
        let after: Vec<&str> = run
            .after
            .iter()
            .filter_map(|o| match o {
                AgentOutput::Event(EventBody::TextEnd(t)) => Some(t.text.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            !after.is_empty() && after.iter().all(|t| t.starts_with("echo: MARKER three")),
            "{:#?}",
            run.after
        );
        // The requests before the marker's are the first turn's: the first holds the prompt
        // only, a later one the prompt and then the steer.
        let first_turn = run
            .bodies
            .iter()
            .position(|b| responses_user_texts(b).iter().any(|t| t == "MARKER three"))
            .expect("the marker turn reached no model");
        let prompts: Vec<Vec<String>> = run.bodies[..first_turn]
            .iter()
            .map(|b| {
                responses_user_texts(b)
                    .into_iter()
                    .filter(|t| t == "SLOW one" || t == "STEERED two")
                    .collect()
            })
            .collect();
        assert_eq!(prompts.first().unwrap(), &["SLOW one"], "{prompts:?}");
        assert!(
            prompts.iter().any(|p| p == &["SLOW one", "STEERED two"]),
            "{prompts:?}"
        );
    });
}

/// One real Claude Code process: a turn with `prompt`, and "STEERED two" written to its stdin
/// as a second user message while the turn runs (at its first text delta, or as it starts a
/// tool), and a marker message once the first turn ended. Returns the `result` lines before
/// the marker's (a turn the message got of its own comes before it) and the bodies
/// the model was sent.
async fn claude_with_a_second_message(prompt: &str, at_tool: bool) -> (Vec<Value>, Vec<Value>) {
    let mock = MockModel::start(0).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let work = home.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let mut child = spawn(&SpawnSpec {
        program: ensure_claude(),
        args: agent_host::adapter::claude::launch_args(
            Some(&uuid::Uuid::new_v4().to_string()),
            None,
            false,
        ),
        cwd: work,
        base_env: filter_env(agent_env(home.path(), &mock)),
        extra_env: Vec::new(),
        session_id: Some("host-steer".into()),
        home: None,
        label: "claude".into(),
    })
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let user = |text: &str| {
        json!({"type": "user", "uuid": uuid::Uuid::new_v4().to_string(),
               "message": {"role": "user", "content": text},
               "parent_tool_use_id": null, "session_id": ""})
        .to_string()
            + "\n"
    };
    stdin.write_all(user(prompt).as_bytes()).await.unwrap();
    let mut results: Vec<Value> = Vec::new();
    let mut written = false;
    // After the first result, a second turn (if any) starts at once: a marker message written
    // then runs after it, and its result ends the reading.
    loop {
        let line = tokio::time::timeout(TURN, lines.next_line())
            .await
            .expect("claude went silent")
            .unwrap()
            .expect("claude exited");
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let now = if at_tool {
            v["type"] == "assistant" && v["message"]["content"][0]["type"] == "tool_use"
        } else {
            v["type"] == "stream_event" && v["event"]["type"] == "content_block_delta"
        };
        if now && !written {
            written = true;
            stdin
                .write_all(user("STEERED two").as_bytes())
                .await
                .unwrap();
        }
        if v["type"] == "control_request" && v["request"]["subtype"] == "can_use_tool" {
            let allow = json!({"type": "control_response", "response": {"subtype": "success",
                "request_id": v["request_id"], "response": {"behavior": "allow",
                "updatedInput": v["request"]["input"]}}});
            stdin
                .write_all((allow.to_string() + "\n").as_bytes())
                .await
                .unwrap();
        }
        if v["type"] == "result" {
            let marker = v["result"]
                .as_str()
                .is_some_and(|r| r.starts_with("echo: MARKER three"));
            if results.is_empty() {
                stdin
                    .write_all(user("MARKER three").as_bytes())
                    .await
                    .unwrap();
            }
            if marker {
                break;
            }
            results.push(v);
        }
    }
    assert!(
        written,
        "the turn ended before the second message could be written"
    );
    drop(stdin);
    let _ = child.stop(Duration::from_secs(2)).await;
    let bodies = mock.bodies.lock().unwrap().clone();
    (results, bodies)
}

/// Claude Code 2.1.197 (stream-json input): a user message written while a turn runs is
/// queued by the CLI. When the turn goes on to another model request (after a tool call), the
/// message is injected into that request (a `system`-role "The user sent a new message while
/// you were working" in `messages`) and the turn ends once with the answer to it; when the
/// turn's answer is plain streaming text, the message waits and runs as a turn of its own
/// afterwards, with its own `result`. Whether a message lands in the running turn depends on
/// what the model does next, which the host cannot know when it is asked to steer: the
/// `claude` family declares `steer: false` (the session queues the prompt, visibly).
#[test]
fn claude_takes_a_message_mid_turn_only_at_a_tool_boundary() {
    ensure_claude();
    if !in_loopback_only_netns("claude_takes_a_message_mid_turn_only_at_a_tool_boundary") {
        return;
    }
    runtime().block_on(async move {
        // Mid tool call: the same turn takes it.
        let prompt = "TOOLCALL `sleep 3 && echo slept`";
        let (results, bodies) = claude_with_a_second_message(prompt, true).await;
        assert_eq!(results.len(), 1, "{results:#?}");
        assert_eq!(
            results[0]["result"],
            "echo: STEERED two [user turns seen: 2; first: TOOLCALL `sleep 3 && echo slept`]"
        );
        assert!(bodies.iter().any(has_injection), "no request carried it");
        assert!(!bodies.iter().any(|b| has_user_text(b, "STEERED two")));

        // Mid text stream: a turn of its own after the running one.
        let (results, bodies) = claude_with_a_second_message("SLOW one", false).await;
        assert_eq!(results.len(), 2, "{results:#?}");
        assert!(
            results[0]["result"]
                .as_str()
                .unwrap()
                .starts_with("slow 0 slow 1"),
            "{results:#?}"
        );
        assert_eq!(
            results[1]["result"],
            "echo: STEERED two [user turns seen: 2; first: SLOW one]"
        );
        assert!(!bodies.iter().any(has_injection));
    });
}

/// The pinned ACP agent (claude-agent-acp 0.49.0, over Claude Code 2.1.197; it declares
/// `_meta.claudeCode.promptQueueing`): a second `session/prompt` while one runs (as the first
/// prompt's tool starts) is taken by the underlying Claude turn (the model's next request
/// carries the injected message), but over ACP the first prompt is answered `end_turn` at
/// once, before the answer to it, and the rest of the turn, the answer included, streams as
/// the second prompt's. ACP itself has no input into a running prompt: for the host this is a
/// queued prompt that ends the running one early, not a steer, and the `acp` family declares
/// `steer: false`.
#[test]
fn acp_a_second_prompt_mid_turn_ends_the_first_prompt() {
    ensure_claude_acp();
    ensure_claude();
    if !in_loopback_only_netns("acp_a_second_prompt_mid_turn_ends_the_first_prompt") {
        return;
    }
    runtime().block_on(async move {
        let mock = MockModel::start(0).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        let work = home.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let mut env = agent_env(home.path(), &mock);
        env.push(("IS_SANDBOX".into(), "1".into()));
        env.push((
            "CLAUDE_CODE_EXECUTABLE".into(),
            ensure_claude().display().to_string(),
        ));
        let mut child = spawn(&SpawnSpec {
            program: ensure_claude_acp(),
            args: Vec::new(),
            cwd: work.clone(),
            base_env: filter_env(env),
            extra_env: Vec::new(),
            session_id: Some("host-steer".into()),
            home: None,
            label: "acp".into(),
        })
        .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut send = async |v: Value| {
            stdin
                .write_all((v.to_string() + "\n").as_bytes())
                .await
                .unwrap();
        };
        send(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false},
                                   "terminal": false},
            "clientInfo": {"name": "agent-host-test", "version": "0"}}}),
        )
        .await;
        let mut session = String::new();
        let mut second_sent = false;
        // What came in order: "chunk <text>" for agent text, "answer <id> <stopReason>".
        let mut seen: Vec<String> = Vec::new();
        while !seen.iter().any(|s| s.starts_with("answer 4")) {
            let line = tokio::time::timeout(TURN, lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("the agent went silent; saw {seen:?}"))
                .unwrap()
                .expect("the agent exited");
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let update = &v["params"]["update"];
            match update["sessionUpdate"].as_str() {
                Some("agent_message_chunk") => {
                    seen.push(format!(
                        "chunk {}",
                        update["content"]["text"].as_str().unwrap()
                    ));
                }
                Some("tool_call") if !second_sent => {
                    second_sent = true;
                    seen.push("second prompt sent".into());
                    send(
                        json!({"jsonrpc": "2.0", "id": 4, "method": "session/prompt",
                        "params": {"sessionId": session,
                                   "prompt": [{"type": "text", "text": "STEERED two"}]}}),
                    )
                    .await;
                }
                _ => {}
            }
            if v["method"] == "session/request_permission" {
                let allow = v["params"]["options"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|o| o["kind"] == "allow_once")
                    .unwrap()["optionId"]
                    .clone();
                send(
                    json!({"jsonrpc": "2.0", "id": v["id"], "result": {"outcome": {
                    "outcome": "selected", "optionId": allow}}}),
                )
                .await;
            }
            match v["id"].as_i64() {
                Some(1) if v.get("result").is_some() => {
                    send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                        "params": {"cwd": work.display().to_string(), "mcpServers": []}}))
                    .await;
                }
                Some(2) => {
                    session = v["result"]["sessionId"].as_str().unwrap().to_owned();
                    send(
                        json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                        "params": {"sessionId": session, "prompt": [
                            {"type": "text", "text": "TOOLCALL `sleep 3 && echo slept`"}]}}),
                    )
                    .await;
                }
                Some(id @ (3 | 4)) => {
                    let stop = v["result"]["stopReason"].as_str().unwrap_or("error");
                    seen.push(format!("answer {id} {stop}"));
                }
                _ => {}
            }
        }
        drop(stdin);
        let _ = child.stop(Duration::from_secs(2)).await;
        let bodies = mock.bodies.lock().unwrap().clone();

        // The underlying Claude turn took it: a model request carried the injection.
        assert!(bodies.iter().any(has_injection), "{seen:?}");
        // Over ACP the first prompt ended first (end_turn), before the answer to the steer;
        // that answer came under the second prompt.
        let text = |part: &[String]| -> String {
            part.iter()
                .filter_map(|s| s.strip_prefix("chunk "))
                .collect()
        };
        let first_end = seen
            .iter()
            .position(|s| s == "answer 3 end_turn")
            .unwrap_or_else(|| panic!("{seen:?}"));
        let second_end = seen
            .iter()
            .position(|s| s == "answer 4 end_turn")
            .unwrap_or_else(|| panic!("{seen:?}"));
        assert!(first_end < second_end, "{seen:?}");
        assert!(!text(&seen[..first_end]).contains("STEERED"), "{seen:?}");
        let second = text(&seen[first_end..second_end]);
        assert!(
            second.contains("echo: STEERED two [user turns seen: 2; first: TOOLCALL"),
            "{seen:?}"
        );
    });
}

/// Acceptance 3 through the whole host: `session.steer` during a slow Codex turn is taken by
/// that turn (`steered: true`, the current run), its `user.text` (`steer: true`) is published
/// in that run, the model's answer to it is the run's text, and the run ends once, with no
/// other run started.
#[test]
fn codex_session_steer_joins_the_running_run() {
    use common::world::{Family, World, in_netns, run_end, text_of_run};
    let Some(rt) = in_netns(Family::Codex, "codex_session_steer_joins_the_running_run") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, true).await;
        let listed = world.host().ok("agent.list", json!({})).await;
        let codex = listed["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["agent_type"] == "codex")
            .unwrap_or_else(|| panic!("{listed}"))
            .clone();
        assert_eq!(codex["capabilities"]["steer"], true, "{codex}");

        let run = world.streaming(&mut ws, &session, "one").await;
        let steer = ws
            .ok(
                "session.steer",
                json!({"session_id": session, "text": "STEERED two"}),
            )
            .await;
        assert_eq!(steer["steered"], true, "{steer}");
        assert_eq!(steer["queued"], false, "{steer}");
        assert_eq!(steer["run_id"], run.as_str(), "{steer}");
        let end = run_end(&mut ws, &run, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");

        let user_texts: Vec<(String, Value)> = ws
            .of_run(&run)
            .iter()
            .filter(|s| s.kind() == "user.text")
            .map(|s| {
                (
                    s.event["text"].as_str().unwrap().to_owned(),
                    s.event["steer"].clone(),
                )
            })
            .collect();
        assert_eq!(
            user_texts,
            [
                ("SLOW one".to_owned(), Value::Null),
                ("STEERED two".to_owned(), json!(true))
            ],
            "{:#?}",
            ws.kinds()
        );
        assert!(
            text_of_run(&ws, &run)
                .contains("echo: STEERED two [user turns seen: 2; first: SLOW one]"),
            "{}",
            text_of_run(&ws, &run)
        );
        let starts = ws.seen.iter().filter(|s| s.kind() == "run.start").count();
        let ends = ws.seen.iter().filter(|s| s.kind() == "run.end").count();
        assert_eq!((starts, ends), (1, 1), "{:#?}", ws.kinds());
        world.host.unwrap().stop().await;
    });
}
