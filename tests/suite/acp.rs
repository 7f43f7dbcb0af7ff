//! ACP agents end to end (issue 8): the real `@agentclientprotocol/claude-agent-acp` (pinned in
//! `agents/package.json`, running the pinned Claude Code) driven through the whole host against
//! the project's mock model, each test in its own loopback-only network namespace; and agents
//! registered in `config.toml` by command and protocol.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};

use common::agents::{agent_env, ensure_claude, ensure_claude_acp, ensure_qwen};
use common::mock_model::MockModel;
use common::world::{Family, Follower, TURN, follow, in_netns, run_end, run_end_of, text_of_run};
use common::{Agents, TestHost};
use serde_json::{Value, json};

/// A mock model, a host whose `config.toml` registers the ACP agents, and a workspace.
struct AcpWorld {
    dir: tempfile::TempDir,
    mock: MockModel,
    work: PathBuf,
    host: Option<TestHost>,
}

/// `config.toml` for the host (`allow_bypass`, for the permission mode test): the built-in `acp`
/// family pointed at claude-agent-acp (running the pinned Claude Code; `IS_SANDBOX` because
/// tests may run as root), Qwen Code registered as
/// an ACP agent (another vendor, against the mock's OpenAI Chat Completions API), a registered
/// agent that reaches claude-agent-acp through a wrapper script, and one whose command does not
/// exist.
fn write_config(home: &Path, wrapper: &Path, mock: &MockModel) {
    let acp = ensure_claude_acp();
    let claude = ensure_claude();
    let env = format!(
        "{{ IS_SANDBOX = \"1\", CLAUDE_CODE_EXECUTABLE = \"{}\" }}",
        claude.display()
    );
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "allow_bypass = true\n\n[agents.acp]\nbinary = \"{}\"\nenv = {env}\n\n\
             [agents.wrapped-acp]\ncommand = [\"{}\", \"--via-wrapper\"]\nprotocol = \"acp\"\nenv = {env}\n\n\
             [agents.ghost]\ncommand = [\"/nonexistent/ghost-agent\", \"--acp\"]\nprotocol = \"acp\"\n\n\
             [agents.qwen]\ncommand = [\"{}\", \"--acp\", \"--auth-type\", \"openai\"]\nprotocol = \"acp\"\n\
             env = {{ OPENAI_API_KEY = \"mock-key\", OPENAI_BASE_URL = \"{}/v1\", OPENAI_MODEL = \"mock-model\" }}\n",
            acp.display(),
            wrapper.display(),
            ensure_qwen().display(),
            mock.base_url()
        ),
    )
    .unwrap();
}

impl AcpWorld {
    async fn start() -> AcpWorld {
        let mock = MockModel::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(dir.path().join("agent-home")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        // A user's in-house wrapper: drops its own flag, then runs the real agent.
        let wrapper = dir.path().join("wrapped-acp.sh");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n[ \"$1\" = --via-wrapper ] && shift\nexec \"{}\" \"$@\"\n",
                ensure_claude_acp().display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        write_config(&dir.path().join("host"), &wrapper, &mock);
        let mut world = AcpWorld {
            dir,
            mock,
            work,
            host: None,
        };
        world.host = Some(TestHost::start_with_agents(&world.host_home(), world.agents()).await);
        world
    }

    fn host_home(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn agents(&self) -> Agents {
        Agents {
            env: agent_env(&self.dir.path().join("agent-home"), &self.mock),
            family_env: Vec::new(),
            claude: None,
            codex: None,
        }
    }

    fn host(&self) -> &TestHost {
        self.host.as_ref().unwrap()
    }

    async fn session(&self, agent_type: &str) -> String {
        self.host().session_of(agent_type, &self.work).await
    }

    async fn send(&self, session: &str, text: &str) -> String {
        let data = self
            .host()
            .ok("session.send", json!({"session_id": session, "text": text}))
            .await;
        data["run_id"].as_str().unwrap().to_owned()
    }

    async fn restart(&mut self) {
        let host = self.host.take().unwrap();
        host.stop().await;
        self.host = Some(TestHost::start_with_agents(&self.host_home(), self.agents()).await);
    }
}

/// Every stored event of a session, oldest first.
async fn history(world: &AcpWorld, session: &str) -> Vec<Value> {
    let page = world
        .host()
        .ok(
            "session.history",
            json!({"session_id": session, "limit": 5000}),
        )
        .await;
    page["events"].as_array().unwrap().clone()
}

fn bracket_kinds(f: &Follower, run: &str) -> Vec<String> {
    f.of_run(run)
        .iter()
        .filter(|s| !s.delta)
        .map(|s| s.kind().to_owned())
        .collect()
}

async fn decide(f: &mut Follower, session: &str, request_id: &str, decision: &str) {
    let receipt = f
        .ok(
            "permission.respond",
            json!({"session_id": session, "request_id": request_id, "decision": decision}),
        )
        .await;
    assert_eq!(receipt["decision"], decision, "{receipt}");
}

/// Acceptance 1, the scenario each real ACP agent goes through: two turns with history,
/// streamed alike to two WebSocket subscribers; a tool call whose permission one client allows
/// (the command runs), then one another client denies (it does not run, and the turn is not
/// aborted: the agent goes on after the refusal).
async fn turns_history_and_permissions(world: &AcpWorld, agent_type: &str) {
    let session = world.session(agent_type).await;
    let mut a = follow(world.host(), &session, true).await;
    let mut b = follow(world.host(), &session, false).await;

    let first = world.send(&session, "hello acp").await;
    assert_eq!(run_end(&mut a, &first, TURN).await["state"], "completed");
    run_end(&mut b, &first, TURN).await;
    assert!(
        a.of_run(&first).iter().any(|s| s.kind() == "text.delta"),
        "no streaming: {:?}",
        a.kinds()
    );
    let second = world.send(&session, "do you remember").await;
    run_end(&mut a, &second, TURN).await;
    run_end(&mut b, &second, TURN).await;
    let text = text_of_run(&a, &second);
    assert!(
        text.contains("turns seen: 2") && text.contains("first: hello acp"),
        "no history: {text}"
    );
    assert_eq!(text, text_of_run(&b, &second));
    assert_eq!(bracket_kinds(&a, &second), bracket_kinds(&b, &second));
    let bound: Vec<_> = a
        .seen
        .iter()
        .filter(|s| s.kind() == "session.bound")
        .collect();
    assert_eq!(bound.len(), 1, "{:?}", a.kinds());

    // Allowed by client a: the command runs.
    let allowed = world
        .send(&session, "TOOLCALL `touch acp-allowed && echo ran`")
        .await;
    let ask = a.until_kind("permission.request", TURN).await;
    assert_eq!(ask.run_id, allowed);
    let request = ask.event["requestId"].as_str().unwrap().to_owned();
    decide(&mut a, &session, &request, "allow").await;
    run_end(&mut b, &allowed, TURN).await;
    let resolved = b
        .of_run(&allowed)
        .iter()
        .find(|s| s.kind() == "permission.resolved")
        .map(|s| s.event.clone())
        .unwrap();
    assert_eq!(resolved["decision"], "allow");
    assert_eq!(resolved["by"].as_str(), Some(a.subscriber_id.as_str()));
    let exec = b
        .of_run(&allowed)
        .iter()
        .find(|s| s.kind() == "tool.exec.end")
        .map(|s| s.event.clone())
        .unwrap();
    assert!(exec["output"].as_str().unwrap().contains("ran"), "{exec}");
    assert!(world.work.join("acp-allowed").exists());
    assert_eq!(run_end_of(&b, &allowed)["state"], "completed");

    // Denied by client b: it does not run; the turn still ends normally.
    let denied = world
        .send(&session, "TOOLCALL `touch acp-denied && echo ran`")
        .await;
    let ask = b.until_kind("permission.request", TURN).await;
    let request = ask.event["requestId"].as_str().unwrap().to_owned();
    decide(&mut b, &session, &request, "deny").await;
    let end = run_end(&mut a, &denied, TURN).await;
    assert_eq!(end["state"], "completed", "{end}");
    assert!(!world.work.join("acp-denied").exists());
}

/// Acceptance 1 with claude-agent-acp.
#[test]
fn claude_agent_acp_runs_turns_with_history_and_permissions_from_two_clients() {
    let Some(rt) = in_netns(
        Family::Claude,
        "claude_agent_acp_runs_turns_with_history_and_permissions_from_two_clients",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = AcpWorld::start().await;
        turns_history_and_permissions(&world, "acp").await;
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 1 with a second vendor's agent: Qwen Code over ACP (`qwen --acp`), registered
/// in `config.toml` by command and protocol.
#[test]
fn qwen_over_acp_runs_turns_with_history_and_permissions_from_two_clients() {
    let Some(rt) = in_netns(
        Family::Claude,
        "qwen_over_acp_runs_turns_with_history_and_permissions_from_two_clients",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = AcpWorld::start().await;
        turns_history_and_permissions(&world, "qwen").await;
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 2: cancel mid-stream ends the run `cancelled` and the next prompt works; after
/// a host restart the next prompt resumes the agent's session (history kept), and nothing of
/// the earlier turns is published again.
#[test]
fn an_acp_turn_cancels_and_the_session_resumes_after_a_restart() {
    let Some(rt) = in_netns(
        Family::Claude,
        "an_acp_turn_cancels_and_the_session_resumes_after_a_restart",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = AcpWorld::start().await;
        let session = world.session("acp").await;
        let mut f = follow(world.host(), &session, true).await;
        let first = world.send(&session, "remember acp").await;
        run_end(&mut f, &first, TURN).await;

        let slow = world.send(&session, "SLOW stream to cancel").await;
        let id = slow.clone();
        f.until("a delta of the slow run", TURN, |s| {
            s.kind() == "text.delta" && s.run_id == id
        })
        .await;
        world
            .host()
            .ok("session.cancel", json!({"session_id": session}))
            .await;
        let end = run_end(&mut f, &slow, TURN).await;
        assert_eq!(end["state"], "cancelled", "{end}");
        let after = world.send(&session, "after the cancel").await;
        assert_eq!(run_end(&mut f, &after, TURN).await["state"], "completed");
        let native = world
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await["native_session_id"]
            .clone();

        let before = history(&world, &session).await;

        world.restart().await;
        let mut g = follow(world.host(), &session, false).await;
        let resumed = world.send(&session, "still there").await;
        run_end(&mut g, &resumed, TURN).await;
        assert_eq!(run_end_of(&g, &resumed)["state"], "completed");
        let text = text_of_run(&g, &resumed);
        assert!(text.contains("first: remember acp"), "not resumed: {text}");
        let row = world
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        assert_eq!(row["native_session_id"], native, "{row}");
        // The store holds the earlier turns once: a resume published nothing of them again,
        // and the new run has one prompt.
        // Everything stored since belongs to the new run, but for the run-less
        // `session.state` brackets the session's state changes publish once no run is current
        // (its return to `idle` after the new run).
        let after = history(&world, &session).await;
        let last_before = before.last().unwrap()["sequence_id"].as_i64().unwrap();
        let (old, new): (Vec<Value>, Vec<Value>) = after
            .into_iter()
            .partition(|e| e["sequence_id"].as_i64().unwrap() <= last_before);
        assert_eq!(old, before, "earlier turns changed in the store");
        let strays: Vec<&Value> = new
            .iter()
            .filter(|e| {
                e["run_id"] != resumed.as_str()
                    && !(e["kind"] == "session.state" && e["run_id"].is_null())
            })
            .collect();
        assert!(
            strays.is_empty(),
            "earlier turns were published again: {strays:?}"
        );
        let prompts = new.iter().filter(|e| e["kind"] == "user.text").count();
        assert_eq!(prompts, 1, "{new:?}");
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 3: an agent registered in `config.toml` (`protocol = "acp"`, a wrapper script)
/// works end to end and is listed as usable by `agent.list` (probed with `initialize`); one
/// whose command is missing is listed `binary_unavailable`, and `session.create` for it is
/// refused with `agent_unavailable`.
#[test]
fn registered_agents_run_or_say_clearly_why_not() {
    let Some(rt) = in_netns(
        Family::Claude,
        "registered_agents_run_or_say_clearly_why_not",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = AcpWorld::start().await;
        let session = world.session("wrapped-acp").await;
        let mut f = follow(world.host(), &session, false).await;
        let run = world.send(&session, "through the wrapper").await;
        assert_eq!(run_end(&mut f, &run, TURN).await["state"], "completed");
        assert!(text_of_run(&f, &run).contains("through the wrapper"));

        let refused = world
            .host()
            .ipc(
                "session.create",
                json!({"agent_type": "ghost", "cwd": world.work.display().to_string()}),
            )
            .await;
        assert_eq!(
            refused.data["error"],
            "agent_unavailable",
            "{}",
            refused.to_line()
        );
        assert!(
            refused.message.contains("/nonexistent/ghost-agent"),
            "{}",
            refused.message
        );

        // agent.list runs in the CLI process, from the same home and environment.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-host"))
            .arg("agent.list")
            .env_clear()
            .envs(world.agents().env)
            .env("AGENT_HOST_HOME", world.host_home())
            .output()
            .await
            .unwrap();
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        let agents = reply["data"]["agents"].as_array().unwrap();
        let of = |name: &str| {
            agents
                .iter()
                .find(|a| a["agent_type"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} not listed: {reply}"))
        };
        let wrapped = of("wrapped-acp");
        assert_eq!(wrapped["usable"], true, "{wrapped}");
        assert_eq!(wrapped["registered"], true);
        assert_eq!(
            wrapped["agent"]["name"], "@agentclientprotocol/claude-agent-acp",
            "{wrapped}"
        );
        assert_eq!(wrapped["agent"]["resume"], true);
        let ghost = of("ghost");
        assert_eq!(ghost["usable"], false);
        assert_eq!(ghost["error"], "binary_unavailable");
        assert!(
            ghost["reason"]
                .as_str()
                .unwrap()
                .contains("/nonexistent/ghost-agent")
        );
        world.host.unwrap().stop().await;
    });
}

/// The absolute path of `node` on the test's PATH (the probe MCP server runs under it).
fn node() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|dir| Path::new(dir).join("node"))
        .find(|p| p.is_file())
        .map_or_else(|| "node".to_owned(), |p| p.display().to_string())
}

/// The probe MCP server the tests ship (`tests/mcp/probe_server.mjs`), as a stdio definition.
fn probe_server() -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/probe_server.mjs");
    json!({"type": "stdio", "name": "probe", "command": node(), "args": [script.display().to_string()]})
}

/// The requests of the agent's own loop (those offering its shell tool), not its side calls
/// (titles, summaries), from `from` on.
fn main_requests(mock: &MockModel, from: usize) -> Vec<Value> {
    mock.bodies.lock().unwrap()[from..]
        .iter()
        .filter(|b| tool_names(b).iter().any(|t| t == "Bash"))
        .cloned()
        .collect()
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Every text of a `system` (a string, or text blocks).
fn system_text(body: &Value) -> String {
    match &body["system"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Every text of the request's messages, with their roles.
fn message_texts(body: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or_default().to_owned();
        match &message["content"] {
            Value::String(s) => out.push((role, s.clone())),
            Value::Array(blocks) => {
                for block in blocks {
                    if let Some(text) = block["text"].as_str() {
                        out.push((role.clone(), text.to_owned()));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Acceptance 1 and 2 for claude-agent-acp: a session created with a model it offers, a
/// standing prompt and the probe MCP server (stdio). The model sees that model, the standing
/// prompt in `system` and in no message, and the MCP tool; the tool runs (its permission
/// answered through the host) and its result comes back. Then `session.set_model` between two
/// turns (live, `session/set_config_option`): the next turn's requests carry the new model,
/// and so do those of the agent resumed after a host restart.
#[test]
fn claude_agent_acp_takes_the_session_options_and_a_live_model_switch() {
    let Some(rt) = in_netns(
        Family::Claude,
        "claude_agent_acp_takes_the_session_options_and_a_live_model_switch",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = AcpWorld::start().await;
        let created = world
            .host()
            .ok(
                "session.create",
                json!({
                    "agent_type": "acp",
                    "cwd": world.work.display().to_string(),
                    "model": "sonnet",
                    "system_prompt": "STANDING-PROMPT-123",
                    "mcp_servers": [probe_server()],
                }),
            )
            .await;
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut f = follow(world.host(), &session, false).await;

        let first = world.send(&session, "hello options").await;
        let end = run_end(&mut f, &first, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");
        let turn1 = main_requests(&world.mock, 0);
        assert!(!turn1.is_empty(), "no request of the agent's loop");
        for body in &turn1 {
            let model = body["model"].as_str().unwrap_or_default();
            assert!(model.contains("sonnet"), "model {model:?}, not sonnet");
            assert!(
                system_text(body).contains("STANDING-PROMPT-123"),
                "no standing prompt in system: {}",
                body["system"]
            );
            let tools = tool_names(body);
            assert!(
                tools.iter().any(|t| t.ends_with("probe")),
                "no MCP tool in {tools:?}"
            );
        }
        for body in world.mock.bodies.lock().unwrap().iter() {
            for (role, text) in message_texts(body) {
                assert!(
                    !text.contains("STANDING-PROMPT-123"),
                    "the standing prompt in a {role} message: {text}"
                );
            }
        }

        // The model changes live between turns.
        let switched = world
            .host()
            .ok(
                "session.set_model",
                json!({"session_id": session, "model": "haiku"}),
            )
            .await;
        assert_eq!(switched["applied"], "live", "{switched}");
        let before = world.mock.bodies.lock().unwrap().len();

        // The MCP tool runs, asked through the host, and its result comes back.
        let second = world.send(&session, "MCPCALL probe hello").await;
        let ask = f.until_kind("permission.request", TURN).await;
        assert_eq!(ask.run_id, second);
        assert!(
            ask.event["tool"]
                .as_str()
                .unwrap_or_default()
                .contains("probe"),
            "{}",
            ask.event
        );
        let request = ask.event["requestId"].as_str().unwrap().to_owned();
        decide(&mut f, &session, &request, "allow").await;
        let end = run_end(&mut f, &second, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");
        let exec = f
            .of_run(&second)
            .iter()
            .find(|s| s.kind() == "tool.exec.end")
            .map(|s| s.event.clone())
            .unwrap_or_else(|| panic!("no tool.exec.end: {:?}", f.kinds()));
        assert!(
            exec["output"]
                .as_str()
                .unwrap_or_default()
                .contains("probe says: HELLO"),
            "{exec}"
        );
        let text = text_of_run(&f, &second);
        assert!(text.contains("tool said: probe says: HELLO"), "{text}");
        let turn2 = main_requests(&world.mock, before);
        assert!(!turn2.is_empty(), "no request of the second turn");
        for body in &turn2 {
            let model = body["model"].as_str().unwrap_or_default();
            assert!(
                model.contains("haiku"),
                "model {model:?} after set_model haiku"
            );
        }

        // A new agent process (the host restarted) resumes the session with the same
        // options: the model set last, the standing prompt, the MCP server.
        world.restart().await;
        let mut g = follow(world.host(), &session, false).await;
        let before = world.mock.bodies.lock().unwrap().len();
        let third = world.send(&session, "MCPCALL probe again").await;
        let id = third.clone();
        let ask = g
            .until("the resumed turn's permission request", TURN, |s| {
                s.kind() == "permission.request" && s.run_id == id
            })
            .await;
        let request = ask.event["requestId"].as_str().unwrap().to_owned();
        decide(&mut g, &session, &request, "allow").await;
        let end = run_end(&mut g, &third, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");
        let text = text_of_run(&g, &third);
        assert!(text.contains("tool said: probe says: AGAIN"), "{text}");
        let turn3 = main_requests(&world.mock, before);
        assert!(!turn3.is_empty(), "no request of the resumed turn");
        for body in &turn3 {
            let model = body["model"].as_str().unwrap_or_default();
            assert!(model.contains("haiku"), "model {model:?} after the resume");
            assert!(system_text(body).contains("STANDING-PROMPT-123"));
        }
        world.host.unwrap().stop().await;
    });
}

/// A 1x1 PNG.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// Acceptance 3 for claude-agent-acp (it declares `promptCapabilities.image`): an image
/// attachment reaches the model as an image block with the same bytes; a path out of the cwd,
/// a symlink out of it and a device file are refused with their codes.
#[test]
fn claude_agent_acp_passes_an_image_attachment_to_the_model() {
    let Some(rt) = in_netns(
        Family::Claude,
        "claude_agent_acp_passes_an_image_attachment_to_the_model",
    ) else {
        return;
    };
    rt.block_on(async {
        use base64::Engine;
        let world = AcpWorld::start().await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(PNG_1X1)
            .unwrap();
        std::fs::write(world.work.join("dot.png"), &png).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", world.work.join("out-link")).unwrap();
        let session = world.session("acp").await;
        let mut f = follow(world.host(), &session, false).await;
        let sent = world
            .host()
            .ok(
                "session.send",
                json!({"session_id": session, "text": "what is in this image",
                       "attachments": [{"path": "dot.png"}]}),
            )
            .await;
        let run = sent["run_id"].as_str().unwrap().to_owned();
        let end = run_end(&mut f, &run, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");
        let images: Vec<Value> = world
            .mock
            .bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| b["messages"].as_array().cloned().unwrap_or_default())
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|block| block["type"] == "image")
            .collect();
        assert!(!images.is_empty(), "no image block reached the model");
        assert_eq!(images[0]["source"]["type"], "base64", "{}", images[0]);
        assert_eq!(images[0]["source"]["media_type"], "image/png");
        let data = images[0]["source"]["data"].as_str().unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
            png
        );

        for (path, code) in [
            ("../../etc/passwd", "attachment_refused"),
            ("out-link", "attachment_refused"),
            ("/dev/zero", "attachment_refused"),
        ] {
            let refused = world
                .host()
                .ipc(
                    "session.send",
                    json!({"session_id": session, "text": "x", "attachments": [{"path": path}]}),
                )
                .await;
            assert_eq!(refused.data["error"], code, "{path}: {}", refused.to_line());
        }
        world.host.unwrap().stop().await;
    });
}

/// `permission_mode: "bypass"` (allowed by the host's `config.toml`) becomes claude-agent-acp's
/// `bypassPermissions` mode (`session/set_mode`): a shell command runs without a permission
/// request. A model it does not offer fails the session's prompts, saying which it offers.
#[test]
fn claude_agent_acp_takes_the_permission_mode_and_refuses_a_model_it_lacks() {
    let Some(rt) = in_netns(
        Family::Claude,
        "claude_agent_acp_takes_the_permission_mode_and_refuses_a_model_it_lacks",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = AcpWorld::start().await;
        let created = world
            .host()
            .ok(
                "session.create",
                json!({"agent_type": "acp", "cwd": world.work.display().to_string(),
                       "permission_mode": "bypass"}),
            )
            .await;
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut f = follow(world.host(), &session, false).await;
        let run = world
            .send(&session, "TOOLCALL `touch acp-bypassed && echo ran`")
            .await;
        let end = run_end(&mut f, &run, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");
        assert!(
            !f.of_run(&run)
                .iter()
                .any(|s| s.kind() == "permission.request"),
            "asked in bypass mode: {:?}",
            f.kinds()
        );
        assert!(world.work.join("acp-bypassed").exists());

        // A model the agent does not offer: the open fails, every prompt says why, naming
        // the models it offers.
        let created = world
            .host()
            .ok(
                "session.create",
                json!({"agent_type": "acp", "cwd": world.work.display().to_string(),
                       "model": "no-such-model-9"}),
            )
            .await;
        let other = created["session_id"].as_str().unwrap().to_owned();
        let mut g = follow(world.host(), &other, false).await;
        let run = world.send(&other, "hello").await;
        let end = run_end(&mut g, &run, TURN).await;
        assert_eq!(end["state"], "failed", "{end}");
        let message = end["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("no-such-model-9")
                && message.contains("offers:")
                && message.contains("haiku"),
            "{end}"
        );
        world.host.unwrap().stop().await;
    });
}
