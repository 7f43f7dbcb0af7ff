//! The one conformance suite: the same cases over every agent in the registry, each run with
//! the agent's real, pinned CLI through the whole host (store, bus, IPC, WebSocket) against the
//! project's mock model, one loopback-only network namespace per agent.
//!
//! A case the agent's declared capabilities rule out is recorded *not applicable*, with the
//! reason; a case that fails fails the run (every case is tried, then all failures are
//! reported). Each agent's results are written to `fixtures/conformance/<agent>.json` and must
//! equal the committed file (`AGENT_HOST_BLESS=1` rewrites it), from which `docs/agents.md` is
//! generated (`cargo test --lib agents_md`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]
#![allow(
    clippy::print_stderr,
    reason = "each case's outcome is printed as it ends, for whoever reads a failing run"
)]

use crate::common;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use common::agents::{
    agent_env, codex_env, ensure_claude, ensure_claude_acp, ensure_codex, ensure_gemini,
    ensure_opencode, ensure_qwen, gemini_env, group_alive, in_loopback_only_netns, opencode_setup,
    write_codex_config, write_gemini_settings,
};
use common::mock_model::MockModel;
use common::world::{Follower, TURN, follow, run_end, text_of_run};
use common::{Agents, TestHost};
use futures_util::FutureExt;
use serde_json::{Value, json};

/// One agent of the registry, as the suite sets it up.
struct Entry {
    /// The key of its results (`fixtures/conformance/<name>.json`).
    name: &'static str,
    /// The host's agent type that runs it.
    agent_type: &'static str,
    /// The pinned npm package it comes from.
    package: &'static str,
    /// Install the CLI; the binary or command the host is configured with.
    install: fn() -> PathBuf,
    /// `config.toml` for the host: the agent's entry with `binary` (or a registered command).
    config: fn(&Setup<'_>, &Path) -> String,
    /// The environment the host passes on.
    env: fn(&Setup<'_>) -> Vec<(String, String)>,
    /// The canary the agent's credential is set to (must never reach the store or the logs).
    credential: &'static str,
    /// A prompt whose tool call the agent asks permission for (by its own rules).
    ask: &'static str,
    /// Cases this agent cannot meet by what its real CLI does (not by a host limitation),
    /// with the reason, recorded as not applicable.
    cannot_meet: &'static [(&'static str, &'static str)],
    /// The agent answers a load of a session it has no record of as if it had it (why):
    /// `resume_rejected_fallback` checks that it does exactly that (no error, an empty
    /// conversation under the same id) and records the case not applicable with this reason.
    loads_what_it_lacks: Option<&'static str>,
}

/// A shell command the claude-based agents ask before running (it writes a file).
const ASK_WRITE: &str = "TOOLCALL `touch asked-first && echo conformance-asked`";

/// What an entry's set-up functions see.
struct Setup<'a> {
    mock: &'a MockModel,
    agent_home: PathBuf,
}

const CANARY: &str = "sk-ant-api03-conformancecanary0001";

fn toml_env<K: AsRef<str>>(pairs: &[(K, String)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{} = {v:?}", k.as_ref()))
        .collect();
    format!("{{ {} }}", inner.join(", "))
}

fn claude_entry() -> Entry {
    Entry {
        name: "claude",
        agent_type: "claude",
        package: "@anthropic-ai/claude-code",
        install: ensure_claude,
        config: |_, bin| {
            format!(
                "[agents.claude]\nbinary = {:?}\n",
                bin.display().to_string()
            )
        },
        env: |s| {
            let mut env = agent_env(&s.agent_home, s.mock);
            set(&mut env, "ANTHROPIC_API_KEY", CANARY);
            env
        },
        credential: CANARY,
        ask: ASK_WRITE,
        cannot_meet: &[],
        loads_what_it_lacks: None,
    }
}

fn codex_entry() -> Entry {
    Entry {
        name: "codex",
        agent_type: "codex",
        package: "@openai/codex",
        install: ensure_codex,
        config: |s, bin| {
            write_codex_config(&s.agent_home.join(".codex"), s.mock);
            format!(
                "[agents.codex]\nbinary = {:?}\nenv = {}\n",
                bin.display().to_string(),
                toml_env(&[("MOCK_API_KEY", CANARY.to_owned())])
            )
        },
        env: |s| {
            codex_env(&s.agent_home, s.mock)
                .into_iter()
                .filter(|(k, _)| k != "MOCK_API_KEY")
                .collect()
        },
        credential: CANARY,
        // In its workspace sandbox Codex runs a write without asking; an escalation asks.
        ask: "TOOLCALL ESCALATE `touch asked-first && echo conformance-asked`",
        cannot_meet: &[],
        loads_what_it_lacks: None,
    }
}

fn claude_acp_entry() -> Entry {
    Entry {
        name: "claude-agent-acp",
        agent_type: "acp",
        package: "@agentclientprotocol/claude-agent-acp",
        install: ensure_claude_acp,
        config: |_, bin| {
            format!(
                "[agents.acp]\nbinary = {:?}\nenv = {}\n",
                bin.display().to_string(),
                toml_env(&[
                    ("IS_SANDBOX", "1".to_owned()),
                    (
                        "CLAUDE_CODE_EXECUTABLE",
                        ensure_claude().display().to_string()
                    ),
                ])
            )
        },
        env: |s| {
            let mut env = agent_env(&s.agent_home, s.mock);
            set(&mut env, "ANTHROPIC_API_KEY", CANARY);
            env
        },
        credential: CANARY,
        ask: ASK_WRITE,
        cannot_meet: &[],
        loads_what_it_lacks: None,
    }
}

fn qwen_entry() -> Entry {
    Entry {
        name: "qwen",
        agent_type: "qwen",
        package: "@qwen-code/qwen-code",
        install: ensure_qwen,
        config: |s, bin| {
            format!(
                "[agents.qwen]\ncommand = [{:?}, \"--acp\", \"--auth-type\", \"openai\"]\n\
                 protocol = \"acp\"\nenv = {}\n",
                bin.display().to_string(),
                toml_env(&[
                    ("OPENAI_API_KEY", CANARY.to_owned()),
                    ("OPENAI_BASE_URL", format!("{}/v1", s.mock.base_url())),
                    ("OPENAI_MODEL", "mock-model".to_owned()),
                ])
            )
        },
        env: |s| agent_env(&s.agent_home, s.mock),
        credential: CANARY,
        ask: ASK_WRITE,
        cannot_meet: &[(
            "rate_limited",
            "Qwen Code retries a 429 by itself (up to 10 times, 60 s apart and more) before \
             it reports anything, far longer than a turn may take here",
        )],
        // Its `loadSession`: `sessionExists` false → a new session config under that id.
        loads_what_it_lacks: Some(
            "Qwen Code answers `session/load` of a session it has no file of with success, and \
             an empty session under the same id: the host is never told the conversation is \
             gone (shown here: its files deleted, the next prompt completes without an error \
             and the model sees one turn)",
        ),
    }
}

/// `[agents.<agent_type>]` for a Gemini family: the binary, and Gemini's variables with its
/// key set to the canary (settings written into the agent's HOME).
fn gemini_config(agent_type: &str, s: &Setup<'_>, bin: &Path) -> String {
    write_gemini_settings(&s.agent_home);
    let env: Vec<(String, String)> = gemini_env(&s.agent_home, s.mock)
        .into_iter()
        .filter(|(k, _)| k != "HOME" && k != "PATH")
        .map(|(k, v)| {
            let v = if k == "GEMINI_API_KEY" {
                GEMINI_CANARY.to_owned()
            } else {
                v
            };
            (k, v)
        })
        .collect();
    format!(
        "[agents.{agent_type}]\nbinary = {:?}\nenv = {}\n",
        bin.display().to_string(),
        toml_env(&env)
    )
}

/// A Gemini key's shape (`AIza…`) is not one the redaction net knows by shape: the host must
/// never have written it anywhere in the first place.
const GEMINI_CANARY: &str = "AIzaConformanceCanary0000000000000000001";

fn gemini_entry() -> Entry {
    Entry {
        name: "gemini",
        agent_type: "gemini",
        package: "@google/gemini-cli",
        install: ensure_gemini,
        config: |s, bin| gemini_config("gemini", s, bin),
        env: |s| agent_env(&s.agent_home, s.mock),
        credential: GEMINI_CANARY,
        ask: "",
        cannot_meet: &[],
        loads_what_it_lacks: None,
    }
}

fn gemini_acp_entry() -> Entry {
    Entry {
        name: "gemini-acp",
        agent_type: "gemini-acp",
        package: "@google/gemini-cli",
        install: ensure_gemini,
        config: |s, bin| gemini_config("gemini-acp", s, bin),
        env: |s| agent_env(&s.agent_home, s.mock),
        credential: GEMINI_CANARY,
        ask: ASK_WRITE,
        // It declares `loadSession`, but its descriptor declares no resume
        // (`families/gemini_acp.rs`): why, rather than the reason `capabilities.resume: none`
        // gives.
        cannot_meet: &[(
            "resume_after_process_restart",
            "Gemini's `session/load` within the minute the session was created in is refused \
             and empties the session for good (shown by \
             `gemini_acp_load_within_the_sessions_minute_is_refused`), so the host never \
             loads one: after a restart it starts a fresh session with a `resume_unsupported` \
             warning and leaves Gemini's file alone",
        )],
        loads_what_it_lacks: None,
    }
}

fn opencode_entry() -> Entry {
    Entry {
        name: "opencode",
        agent_type: "opencode",
        package: "opencode-ai",
        install: ensure_opencode,
        config: |s, bin| {
            let env = opencode_setup(&s.agent_home, s.mock, CANARY);
            format!(
                "[agents.opencode]\nbinary = {:?}\nenv = {}\n",
                bin.display().to_string(),
                toml_env(&env)
            )
        },
        env: |s| agent_env(&s.agent_home, s.mock),
        credential: CANARY,
        ask: ASK_WRITE,
        cannot_meet: &[(
            "transport_lost",
            "OpenCode retries a cut model stream by itself, with back-off, for longer than a \
             turn may take here: the host is never told of the loss",
        )],
        loads_what_it_lacks: None,
    }
}

fn set(env: &mut Vec<(String, String)>, name: &str, value: &str) {
    env.retain(|(k, _)| k != name);
    env.push((name.to_owned(), value.to_owned()));
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Pass(Option<String>),
    NotApplicable(String),
    Fail(String),
}

impl Outcome {
    fn record(&self) -> Value {
        match self {
            Outcome::Pass(None) => json!({"result": "pass"}),
            Outcome::Pass(Some(how)) => json!({"result": "pass", "how": how}),
            Outcome::NotApplicable(why) => json!({"result": "not_applicable", "because": why}),
            Outcome::Fail(why) => json!({"result": "fail", "why": why}),
        }
    }
}

/// A case's verdict when it ran to the end.
type Verdict = Result<Option<String>, String>;
type CaseFn = for<'a> fn(&'a mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + 'a>>;

/// The running world of one agent: the mock, the host, a workspace and the session the cases
/// share (a conversation grows over them, so continuity is checked as it goes).
struct Ctx {
    entry: Entry,
    dir: tempfile::TempDir,
    mock: MockModel,
    work: PathBuf,
    host: Option<TestHost>,
    caps: Value,
    /// The agent as `agent.list` showed it (its protocol, capabilities, what it declared).
    listed: Value,
    session: Option<String>,
    ws: Option<Follower>,
    /// The turns the model has seen in the shared session, as its last answer said.
    turns: u64,
    /// Whether `fork` forked natively (an import of an unknown id then reaches the agent).
    forks_natively: bool,
    /// The session `fork` made (it ran a turn), for a case that needs one more.
    fork_child: Option<String>,
    /// Set by a case that found, by running, why it does not apply: recorded so.
    not_applicable: Option<String>,
    /// The agent's binary (or command) as installed.
    bin: PathBuf,
}

impl Ctx {
    fn setup(&self) -> Setup<'_> {
        Setup {
            mock: &self.mock,
            agent_home: self.dir.path().join("agent-home"),
        }
    }

    fn host_home(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn agents(&self) -> Agents {
        Agents {
            env: (self.entry.env)(&self.setup()),
            family_env: Vec::new(),
            claude: None,
            codex: None,
        }
    }

    fn host(&self) -> &TestHost {
        self.host.as_ref().unwrap()
    }

    async fn start(entry: Entry) -> Ctx {
        let entry_install = entry.install;
        let mock = MockModel::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(dir.path().join("agent-home")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let mut ctx = Ctx {
            entry,
            dir,
            mock,
            work,
            host: None,
            caps: Value::Null,
            listed: Value::Null,
            session: None,
            ws: None,
            turns: 0,
            forks_natively: false,
            fork_child: None,
            not_applicable: None,
            bin: (entry_install)(),
        };
        let config = (ctx.entry.config)(&ctx.setup(), &ctx.bin);
        std::fs::create_dir_all(ctx.host_home()).unwrap();
        std::fs::write(ctx.host_home().join("config.toml"), config).unwrap();
        ctx.host = Some(TestHost::start_with_agents(&ctx.host_home(), ctx.agents()).await);
        let list = ctx.host().ok("agent.list", json!({})).await;
        let me = list["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["agent_type"] == ctx.entry.agent_type)
            .unwrap_or_else(|| panic!("{} not in agent.list: {list}", ctx.entry.agent_type))
            .clone();
        assert_eq!(me["usable"], true, "{me}");
        ctx.caps = me["capabilities"].clone();
        ctx.caps["permission_policy"] = me["permission_policy"].clone();
        ctx.listed = json!({
            "protocol": me["protocol"],
            "registered": me["registered"],
            "capabilities": me["capabilities"],
            "permission_policy": me["permission_policy"],
            "declared": me["agent"],
        });
        ctx
    }

    async fn restart(&mut self) {
        self.ws = None;
        let host = self.host.take().unwrap();
        self.host = Some(host.restart().await);
    }

    async fn new_session(&self) -> String {
        self.host()
            .session_of(self.entry.agent_type, &self.work)
            .await
    }

    /// The shared session and its follower.
    async fn shared(&mut self) -> (String, &mut Follower) {
        if self.session.is_none() {
            self.session = Some(self.new_session().await);
        }
        let session = self.session.clone().unwrap();
        if self.ws.is_none() {
            self.ws = Some(follow(self.host(), &session, true).await);
        }
        (session, self.ws.as_mut().unwrap())
    }

    async fn send(&self, session: &str, text: &str) -> String {
        let data = self
            .host()
            .ok("session.send", json!({"session_id": session, "text": text}))
            .await;
        data["run_id"].as_str().unwrap().to_owned()
    }

    /// A whole turn in the shared session: its run id and its text.
    async fn turn(&mut self, text: &str) -> (String, Value, String) {
        let (session, _) = self.shared().await;
        let run = self.send(&session, text).await;
        let ws = self.ws.as_mut().unwrap();
        let end = run_end(ws, &run, TURN).await;
        let said = text_of_run(ws, &run);
        self.note(&said);
        (run, end, said)
    }

    /// The shared session's answer says how many turns the model has seen.
    fn note(&mut self, said: &str) {
        if let Some(n) = turns_seen(said) {
            self.turns = n;
        }
    }

    async fn native_id(&self, session: &str) -> Option<String> {
        let row = self
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        row["native_session_id"].as_str().map(str::to_owned)
    }
}

/// `[user turns seen: N` in an echo.
fn turns_seen(text: &str) -> Option<u64> {
    let at = text.rfind("user turns seen: ")? + "user turns seen: ".len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn check(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

fn kinds_of(ws: &Follower, run: &str) -> Vec<String> {
    ws.of_run(run).iter().map(|s| s.kind().to_owned()).collect()
}

// ---- the cases -------------------------------------------------------------------------------

fn probe_missing_binary(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        // The same agent type, its binary (or command) pointing nowhere.
        let missing = ctx.dir.path().join("missing-home");
        std::fs::create_dir_all(&missing).unwrap();
        let config = (ctx.entry.config)(&ctx.setup(), Path::new("/nonexistent/agent-cli"));
        std::fs::write(missing.join("config.toml"), config).unwrap();
        let mut config = agent_host::config::Config::with_home(&missing).unwrap();
        config.env = ctx.agents().env;
        let (defs, bad) = agent_host::adapter::launch::agent_defs(&config);
        check(bad.is_empty(), || format!("config refused: {bad:?}"))?;
        let def = &defs[ctx.entry.agent_type];
        let base = agent_host::adapter::spawn::filter_env(config.env.clone());
        let report = agent_host::adapter::probe(ctx.entry.agent_type, def, &base).await;
        check(!report.usable, || format!("usable: {report:?}"))?;
        check(
            report.error == Some(agent_host::protocol::events::ErrorCategory::BinaryUnavailable),
            || format!("{report:?}"),
        )?;
        check(
            report
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("/nonexistent/agent-cli")),
            || format!("the reason does not name the path tried: {report:?}"),
        )?;
        Ok(None)
    })
}

fn new_session_emits_id(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        let (run, end, said) = ctx.turn("hello conformance").await;
        check(end["state"] == "completed", || format!("{end}"))?;
        check(said.contains("echo: hello conformance"), || said.clone())?;
        let (session, ws) = ctx.shared().await;
        let bound = ws
            .seen
            .iter()
            .find(|s| s.kind() == "session.bound")
            .map(|s| s.event.clone());
        let bound = bound.ok_or_else(|| format!("no session.bound: {:?}", kinds_of(ws, &run)))?;
        let native = ctx.native_id(&session).await;
        check(
            native.is_some() && bound["nativeSessionId"].as_str() == native.as_deref(),
            || format!("bound {bound} vs row {native:?}"),
        )?;
        ctx.turns = turns_seen(&said).ok_or_else(|| format!("no turn count in {said:?}"))?;
        Ok(None)
    })
}

fn multi_turn_continuity(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        let before = ctx.turns;
        let (_, end, said) = ctx.turn("and a second one").await;
        check(end["state"] == "completed", || format!("{end}"))?;
        let seen = turns_seen(&said).ok_or_else(|| format!("no turn count in {said:?}"))?;
        check(seen == before + 1, || {
            format!("saw {seen} turns after {before}: {said}")
        })?;
        check(said.contains("first: hello conformance"), || said.clone())?;
        Ok(None)
    })
}

fn resume_after_process_restart(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        let (session, _) = ctx.shared().await;
        let before = ctx.native_id(&session).await;
        let turns = ctx.turns;
        // The agent's real binary again (a case before may have left a wrapper configured).
        let config = (ctx.entry.config)(&ctx.setup(), &ctx.bin);
        std::fs::write(ctx.host_home().join("config.toml"), config).unwrap();
        ctx.restart().await;
        let (run, end, said) = ctx.turn("after the restart").await;
        check(end["state"] == "completed", || format!("{end}"))?;
        let warnings: Vec<Value> = ctx
            .ws
            .as_ref()
            .unwrap()
            .of_run(&run)
            .iter()
            .filter(|s| {
                s.kind() == "error" || (s.kind() == "warning" && s.event["code"] != "agent_warning")
            })
            .map(|s| s.event.clone())
            .collect();
        check(warnings.is_empty(), || format!("{warnings:?}"))?;
        let seen = turns_seen(&said).ok_or_else(|| format!("no turn count in {said:?}"))?;
        check(seen == turns + 1, || {
            format!("not resumed: saw {seen} turns after {turns}: {said}")
        })?;
        let after = ctx.native_id(&session).await;
        check(before == after, || {
            format!("native id {before:?} → {after:?}")
        })?;
        Ok(None)
    })
}

/// A tool call, answered `allow` if the agent asks: it ran, the answer has its output, and it
/// shows as tool events to a follower and in the stored history. `must_ask`: the agent must
/// have asked first.
fn tool_call<'a>(
    ctx: &'a mut Ctx,
    prompt: &'static str,
    output: &'static str,
    must_ask: bool,
) -> Pin<Box<dyn Future<Output = Verdict> + 'a>> {
    Box::pin(async move {
        let (session, _) = ctx.shared().await;
        let run = ctx.send(&session, prompt).await;
        let ws = ctx.ws.as_mut().unwrap();
        let id = run.clone();
        // Whichever comes first: the agent asks, or the turn ends without asking.
        let first = ws
            .until("permission.request or run.end", TURN, |s| {
                (s.kind() == "permission.request" || s.kind() == "run.end") && s.run_id == id
            })
            .await;
        let asked = first.kind() == "permission.request";
        check(asked || !must_ask, || {
            format!("the agent did not ask: {:?}", kinds_of(ws, &run))
        })?;
        if asked {
            let request_id = first.event["requestId"].as_str().unwrap().to_owned();
            let host = ctx.host.as_ref().unwrap();
            host.ok(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "allow"}),
            )
            .await;
        }
        let ws = ctx.ws.as_mut().unwrap();
        let end = if asked {
            run_end(ws, &run, TURN).await
        } else {
            first.event.clone()
        };
        let said = text_of_run(ws, &run);
        let kinds = kinds_of(ws, &run);
        check(end["state"] == "completed", || format!("{end} {kinds:?}"))?;
        check(said.contains(output), || {
            format!("the tool's output is not in the answer: {said:?}")
        })?;
        // Visible as tool events to a follower, and in the stored history.
        let tools: Vec<&String> = kinds.iter().filter(|k| k.starts_with("tool.")).collect();
        check(tools.len() >= 2, || format!("no tool events: {kinds:?}"))?;
        let history = ctx
            .host()
            .ok(
                "session.history",
                json!({"session_id": session, "limit": 5000}),
            )
            .await;
        let stored = history["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["run_id"] == run.as_str())
            .filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("tool.")))
            .count();
        check(stored >= 1, || {
            format!("no tool event in the history: {history}")
        })?;
        ctx.note(&said);
        Ok(None)
    })
}

fn tool_activity_visible(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    tool_call(
        ctx,
        "TOOLCALL `echo conformance-tool-ran`",
        "conformance-tool-ran",
        false,
    )
}

fn permission_roundtrip(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    let ask = ctx.entry.ask;
    tool_call(ctx, ask, "conformance-asked", true)
}

fn cancel_keeps_session(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        let (session, _) = ctx.shared().await;
        let run = ctx.send(&session, "SLOW to be cancelled").await;
        let ws = ctx.ws.as_mut().unwrap();
        let id = run.clone();
        ws.until("a delta of the slow run", TURN, |s| {
            s.kind() == "text.delta" && s.run_id == id
        })
        .await;
        ctx.host()
            .ok("session.cancel", json!({"session_id": session}))
            .await;
        let ws = ctx.ws.as_mut().unwrap();
        let end = run_end(ws, &run, TURN).await;
        check(end["state"] == "cancelled", || format!("{end}"))?;
        let (_, end, said) = ctx.turn("still there after the cancel").await;
        check(end["state"] == "completed", || format!("{end}"))?;
        // (Some agents keep the cancelled prompt in the conversation, some drop it.)
        check(said.contains("still there after the cancel"), || {
            said.clone()
        })?;
        Ok(None)
    })
}

fn fork(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        let (session, _) = ctx.shared().await;
        let parent_native = ctx.native_id(&session).await;
        let child = ctx
            .host()
            .ok("session.fork", json!({"session_id": session}))
            .await;
        let child = child["session_id"].as_str().unwrap().to_owned();
        ctx.fork_child = Some(child.clone());
        let mut ws = follow(ctx.host(), &child, false).await;
        let run = ctx.send(&child, "in the fork").await;
        let end = run_end(&mut ws, &run, TURN).await;
        let said = text_of_run(&ws, &run);
        check(end["state"] == "completed", || format!("{end}"))?;
        let warned = ws
            .of_run(&run)
            .iter()
            .any(|s| s.kind() == "warning" && s.event["code"] == "fork_unsupported");
        let seen = turns_seen(&said).ok_or_else(|| format!("no turn count in {said:?}"))?;
        let child_native = ctx.native_id(&child).await;
        check(child_native != parent_native, || {
            format!("the fork writes the parent's native session {child_native:?}")
        })?;
        if warned {
            check(seen == 1, || format!("a new session saw {seen} turns"))?;
            return Ok(Some(
                "degraded: a new session and a `fork_unsupported` warning".to_owned(),
            ));
        }
        check(seen == ctx.turns + 1, || {
            format!(
                "the fork saw {seen} turns, the parent had {}: {said}",
                ctx.turns
            )
        })?;
        ctx.forks_natively = true;
        // The parent goes on where it was, unaffected by the fork's turn.
        let before = ctx.turns;
        let (_, _, said) = ctx.turn("back in the parent").await;
        let parent_seen = turns_seen(&said).unwrap_or_default();
        check(parent_seen == before + 1, || {
            format!("the parent saw {parent_seen} after {before}: {said}")
        })?;
        Ok(Some("native".to_owned()))
    })
}

fn resume_wrong_workspace_rejected(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        let (session, _) = ctx.shared().await;
        let native = ctx
            .native_id(&session)
            .await
            .ok_or("the shared session has no native id")?;
        let mut how = Vec::new();
        if ctx.caps["binding"] == true {
            // The family's records place the native session in its cwd: an import into
            // another workspace is refused, and nothing is opened on it.
            let elsewhere = ctx.dir.path().join("another-workspace");
            std::fs::create_dir_all(&elsewhere).unwrap();
            let reply = ctx
                .host()
                .ipc(
                    "session.import",
                    json!({"agent_type": ctx.entry.agent_type, "native_session_id": native,
                           "cwd": elsewhere.display().to_string()}),
                )
                .await;
            check(
                reply.code == 3012
                    && reply.data["error"] == "binding_mismatch"
                    && reply.data["reason"] == "native_session_elsewhere",
                || format!("imported into another workspace: {}", reply.to_line()),
            )?;
            how.push("an import the agent's files place in another cwd: `binding_mismatch`");
        }
        // Every family: a session bound in one checkout whose workspace then changed (the cwd's
        // repository has another `origin`) is never resumed or forked there — its prompt is
        // refused before it reaches the agent. Shown with the shared session's native session,
        // imported in its own cwd, which is a repository for this case only.
        let moved = moved_workspace(ctx, &native).await;
        // The workspace as it was for the cases that follow (whatever the check said).
        let repo = ctx.work.join(".git");
        if repo.exists() {
            std::fs::remove_dir_all(repo).unwrap();
        }
        moved?;
        how.push("a prompt after the workspace changed: `workspace_changed`, `resume_rejected`");
        Ok(Some(how.join("; ")))
    })
}

/// `git -C <dir> <args>`, which must succeed.
fn git(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| format!("git {args:?}: {e} (git is needed by this case)"))?;
    check(out.status.success(), || {
        format!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr))
    })
}

/// `native` imported into the (now) repository of the shared session's cwd, its `origin` then
/// changed: the next prompt is refused — a `workspace_changed` warning naming both remotes, the
/// run `failed` `resume_rejected` — and the model never sees it.
async fn moved_workspace(ctx: &mut Ctx, native: &str) -> Result<(), String> {
    let before = "https://example.com/conformance/before.git";
    let after = "https://example.com/conformance/after.git";
    git(&ctx.work, &["init", "-q"])?;
    git(&ctx.work, &["remote", "add", "origin", before])?;
    let row = ctx
        .host()
        .ok(
            "session.import",
            json!({"agent_type": ctx.entry.agent_type, "native_session_id": native,
                   "cwd": ctx.work.display().to_string()}),
        )
        .await;
    let imported = row["session_id"].as_str().unwrap().to_owned();
    let bound = ctx
        .host()
        .ok("session.get", json!({"session_id": imported}))
        .await;
    check(
        bound.to_string().contains("example.com/conformance/before"),
        || format!("the binding does not record the workspace: {bound}"),
    )?;
    git(&ctx.work, &["remote", "set-url", "origin", after])?;
    let mut ws = follow(ctx.host(), &imported, false).await;
    let prompt = "a prompt for the moved workspace";
    let run = ctx.send(&imported, prompt).await;
    let end = run_end(&mut ws, &run, TURN).await;
    let kinds = kinds_of(&ws, &run);
    let warning = ws
        .of_run(&run)
        .iter()
        .find(|s| s.kind() == "warning" && s.event["code"] == "workspace_changed")
        .map(|s| s.event["message"].as_str().unwrap_or_default().to_owned())
        .ok_or_else(|| format!("no workspace_changed warning: {kinds:?} {end}"))?;
    check(
        warning.contains("conformance/before") && warning.contains("conformance/after"),
        || warning.clone(),
    )?;
    check(
        end["state"] == "failed" && end["category"] == "resume_rejected",
        || format!("{end} {kinds:?}"),
    )?;
    let seen = ctx
        .mock
        .bodies
        .lock()
        .unwrap()
        .iter()
        .any(|b| b.to_string().contains(prompt));
    check(!seen, || "the refused prompt reached the model".to_owned())?;
    let row = ctx
        .host()
        .ok("session.get", json!({"session_id": imported}))
        .await;
    check(row["live"]["agent_pid"].is_null(), || {
        format!("an agent was started for it: {row}")
    })
}

fn resume_rejected_fallback(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        if ctx.forks_natively {
            // An import forks its native session: one the agent never had reaches the agent.
            let bogus = uuid::Uuid::new_v4().to_string();
            let row = ctx
                .host()
                .ok(
                    "session.import",
                    json!({"agent_type": ctx.entry.agent_type, "native_session_id": bogus,
                           "cwd": ctx.work.display().to_string()}),
                )
                .await;
            let session = row["session_id"].as_str().unwrap().to_owned();
            fresh_after_rejection(ctx, &session, "a fresh start").await?;
            return Ok(Some("an imported id the agent never had".to_owned()));
        }
        // The agent cannot fork, so an import never reaches it: a session that ran a turn (the
        // one `fork` made, else a new one), its agent gone and the agent's own files of it
        // deleted, is resumed at its next prompt.
        let session = match ctx.fork_child.take() {
            Some(child) => child,
            None => {
                let session = ctx.new_session().await;
                let mut ws = follow(ctx.host(), &session, true).await;
                let run = ctx.send(&session, "soon forgotten").await;
                let end = run_end(&mut ws, &run, TURN).await;
                check(end["state"] == "completed", || format!("{end}"))?;
                session
            }
        };
        let native = ctx
            .native_id(&session)
            .await
            .ok_or("the session has no native id")?;
        stop_agent_of(ctx, &session).await?;
        let forgotten = forget(&ctx.setup().agent_home, &native);
        check(!forgotten.is_empty(), || {
            format!("no file of the native session {native} under the agent's HOME")
        })?;
        if let Some(why) = ctx.entry.loads_what_it_lacks {
            silently_empty(ctx, &session, &native).await?;
            ctx.not_applicable = Some(why.to_owned());
            return Ok(None);
        }
        fresh_after_rejection(ctx, &session, "a fresh start").await?;
        let after = ctx.native_id(&session).await;
        check(after.as_deref() != Some(native.as_str()), || {
            format!("still bound to {native}")
        })?;
        Ok(Some(
            "a resume of a session whose own files were deleted".to_owned(),
        ))
    })
}

/// The next prompt of `session`, whose native session `native` the agent has no record of,
/// is answered as if it had: no error, no warning, the same native id, and a conversation of
/// one turn (what `Entry::loads_what_it_lacks` says of the agent).
async fn silently_empty(ctx: &Ctx, session: &str, native: &str) -> Result<(), String> {
    let mut ws = follow(ctx.host(), session, false).await;
    let run = ctx.send(session, "after the loss").await;
    let end = run_end(&mut ws, &run, TURN).await;
    let said = text_of_run(&ws, &run);
    let kinds = kinds_of(&ws, &run);
    check(end["state"] == "completed", || format!("{end} {kinds:?}"))?;
    let told = ws.of_run(&run).iter().any(|s| {
        s.kind() == "error" || (s.kind() == "warning" && s.event["code"] != "agent_warning")
    });
    check(!told, || {
        format!("the host was told after all (update the entry): {kinds:?}")
    })?;
    check(turns_seen(&said) == Some(1), || said.clone())?;
    let after = ctx.native_id(session).await;
    check(after.as_deref() == Some(native), || {
        format!("bound {after:?}, not {native}")
    })
}

/// The next prompt of `session` opens a native session the agent does not have: a visible
/// `resume_rejected`, and the prompt goes on in a fresh session.
async fn fresh_after_rejection(ctx: &Ctx, session: &str, text: &str) -> Result<(), String> {
    let mut ws = follow(ctx.host(), session, false).await;
    let run = ctx.send(session, text).await;
    let end = run_end(&mut ws, &run, TURN).await;
    let said = text_of_run(&ws, &run);
    let kinds = kinds_of(&ws, &run);
    let warned = ws
        .of_run(&run)
        .iter()
        .any(|s| s.kind() == "warning" && s.event["code"] == "resume_rejected");
    check(warned, || format!("no resume_rejected warning: {kinds:?}"))?;
    check(end["state"] == "completed", || format!("{end} {kinds:?}"))?;
    check(said.contains(text), || said.clone())?;
    check(turns_seen(&said) == Some(1), || {
        format!("not a fresh session: {said}")
    })
}

/// The agent of `session` gone, so its next prompt opens one: a process that outlives its
/// turns is killed (its group) and the host sees it go; for one process per turn, the host
/// is restarted (its driver keeps the session it knows open between turns).
async fn stop_agent_of(ctx: &mut Ctx, session: &str) -> Result<(), String> {
    if ctx.caps["process"] == "per_turn" {
        ctx.restart().await;
        return Ok(());
    }
    let live = |row: &Value| row["live"]["agent_pid"].as_u64();
    let row = ctx
        .host()
        .ok("session.get", json!({"session_id": session}))
        .await;
    let pid = live(&row).ok_or_else(|| format!("no live agent after a turn: {row}"))?;
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("kill {pid}: {e}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let row = ctx
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        if live(&row).is_none() {
            return Ok(());
        }
        check(std::time::Instant::now() < deadline, || {
            format!("the host did not see its agent go: {row}")
        })?;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Delete every file under `home` whose name holds the native id (or its first 8 characters,
/// as Gemini names its files): the agent's own record of the session. The files deleted.
fn forget(home: &Path, native: &str) -> Vec<PathBuf> {
    let short = &native[..native.len().min(8)];
    let mut gone = Vec::new();
    let mut stack = vec![home.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains(short))
            {
                std::fs::remove_file(&path).unwrap();
                gone.push(path);
            }
        }
    }
    gone
}

fn result_exactly_once_to_caller(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        let (session, _) = ctx.shared().await;
        let params = json!({"session_id": session, "text": "only once", "client_msg_id": "conf-1"});
        let first = ctx.host().ok("session.send", params.clone()).await;
        let again = ctx.host().ok("session.send", params.clone()).await;
        let run = first["run_id"].as_str().unwrap().to_owned();
        check(again["run_id"] == first["run_id"], || {
            format!("a retry made another run: {first} {again}")
        })?;
        let ws = ctx.ws.as_mut().unwrap();
        run_end(ws, &run, TURN).await;
        // A retry after the run ended still names it, and runs nothing.
        let late = ctx.host().ok("session.send", params).await;
        check(late["run_id"] == first["run_id"], || format!("{late}"))?;
        let runs = ctx
            .host()
            .ok("session.runs", json!({"session_id": session}))
            .await;
        let matching = runs["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["run_id"] == run.as_str())
            .count();
        check(matching == 1, || {
            format!("{matching} rows for the run: {runs}")
        })?;
        let ws = ctx.ws.as_mut().unwrap();
        let ends = ws
            .of_run(&run)
            .iter()
            .filter(|s| s.kind() == "run.end")
            .count();
        let users = ws
            .of_run(&run)
            .iter()
            .filter(|s| s.kind() == "user.text")
            .count();
        check(ends == 1 && users == 1, || {
            format!("{users} user.text and {ends} run.end for one prompt")
        })?;
        let said = text_of_run(ws, &run);
        ctx.note(&said);
        Ok(None)
    })
}

fn transport_uncertainty(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        // The agent dies mid-answer: the host cannot know what the agent did with the prompt,
        // says so, and the client can ask instead of resending blindly.
        let (session, _) = ctx.shared().await;
        let params = json!({"session_id": session, "text": "SLOW about to be lost",
                            "client_msg_id": "conf-uncertain"});
        let sent = ctx.host().ok("session.send", params.clone()).await;
        let run = sent["run_id"].as_str().unwrap().to_owned();
        let ws = ctx.ws.as_mut().unwrap();
        let id = run.clone();
        ws.until("a delta of the slow run", TURN, |s| {
            s.kind() == "text.delta" && s.run_id == id
        })
        .await;
        let row = ctx
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        let pid = row["live"]["agent_pid"]
            .as_u64()
            .ok_or_else(|| format!("no live agent pid mid-turn: {row}"))?;
        let pgid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
        nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| format!("kill {pid}: {e}"))?;
        let ws = ctx.ws.as_mut().unwrap();
        let end = run_end(ws, &run, TURN).await;
        check(end["state"] == "failed", || format!("{end}"))?;
        check(end["category"] == "result_delivery_unknown", || {
            format!("{end}")
        })?;
        // The row says the same (it may trail the event by a moment: wait for the session to
        // go idle, which comes after it).
        let sid = session.clone();
        ws.until("the session idle again", TURN, |s| {
            s.kind() == "session.state"
                && s.event["state"] == "idle"
                && s.event["sessionId"] == sid.as_str()
        })
        .await;
        let asked = ctx
            .host()
            .ok(
                "session.run",
                json!({"session_id": session, "client_msg_id": "conf-uncertain"}),
            )
            .await;
        check(asked["run_id"] == run.as_str(), || format!("{asked}"))?;
        check(asked["error_category"] == "result_delivery_unknown", || {
            format!("{asked}")
        })?;
        // A blind resend runs nothing new.
        let again = ctx.host().ok("session.send", params).await;
        check(again["run_id"] == run.as_str(), || format!("{again}"))?;
        let (_, end, said) = ctx.turn("after the loss").await;
        check(end["state"] == "completed", || format!("{end}"))?;
        check(said.contains("after the loss"), || said.clone())?;
        Ok(None)
    })
}

fn close_reaps_process_tree(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        // Mid-turn, so a per-turn process is there too.
        let session = ctx.new_session().await;
        let mut ws = follow(ctx.host(), &session, true).await;
        let run = ctx.send(&session, "SLOW about to be closed").await;
        let id = run.clone();
        ws.until("a delta of the slow run", TURN, |s| {
            s.kind() == "text.delta" && s.run_id == id
        })
        .await;
        let row = ctx
            .host()
            .ok("session.get", json!({"session_id": session}))
            .await;
        let pid = row["live"]["agent_pid"]
            .as_u64()
            .ok_or_else(|| format!("no live agent pid mid-turn: {row}"))?;
        let pgid = i32::try_from(pid).unwrap();
        check(group_alive(pgid), || {
            "the agent's group is not alive".to_owned()
        })?;
        ctx.host()
            .ok("session.delete", json!({"session_id": session}))
            .await;
        check(!group_alive(pgid), || {
            format!("process group {pgid} outlived its session")
        })?;
        Ok(None)
    })
}

/// A model failure the mock produces (`script`): the run ends `failed` with `category`, said
/// on its `run.end` or its `error`, and the next turn works.
fn model_failure<'a>(
    ctx: &'a mut Ctx,
    script: &'static str,
    category: &'static str,
) -> Pin<Box<dyn Future<Output = Verdict> + 'a>> {
    Box::pin(async move {
        let (session, _) = ctx.shared().await;
        let run = ctx.send(&session, &format!("{script} now")).await;
        let ws = ctx.ws.as_mut().unwrap();
        let end = run_end(ws, &run, TURN).await;
        let categories: Vec<String> = ws
            .of_run(&run)
            .iter()
            .filter(|s| s.kind() == "error" || s.kind() == "run.end")
            .filter_map(|s| s.event["category"].as_str().map(str::to_owned))
            .collect();
        let kinds = kinds_of(ws, &run);
        check(end["state"] == "failed", || format!("{end} {kinds:?}"))?;
        check(categories.iter().any(|c| c == category), || {
            format!("categories {categories:?}, not {category}: {end}")
        })?;
        let (_, end, said) = ctx.turn("fine again").await;
        check(end["state"] == "completed", || format!("{end}"))?;
        check(said.contains("fine again"), || said.clone())?;
        Ok(None)
    })
}

fn rate_limited(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    model_failure(ctx, "FAIL429", "rate_limited")
}

fn auth_required(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    model_failure(ctx, "FAIL401", "auth_required")
}

fn transport_lost(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    model_failure(ctx, "CUTSTREAM", "transport_lost")
}

/// Restart the host with the agent's binary behind a wrapper that first prints `lines` on
/// stdout, then runs the real CLI; a new session's turn must be whole and clean.
fn behind_noise<'a>(
    ctx: &'a mut Ctx,
    lines: &'static [&'static str],
) -> Pin<Box<dyn Future<Output = Verdict> + 'a>> {
    Box::pin(async move {
        let real = (ctx.entry.install)();
        let wrapper = ctx.dir.path().join("noisy-agent.sh");
        let mut script = String::from("#!/bin/sh\n");
        for line in lines {
            script.push_str(&format!("printf '%s\\n' '{line}'\n"));
        }
        script.push_str(&format!("exec {:?} \"$@\"\n", real.display().to_string()));
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let config = (ctx.entry.config)(&ctx.setup(), &wrapper);
        std::fs::write(ctx.host_home().join("config.toml"), config).unwrap();
        ctx.restart().await;
        let session = ctx.new_session().await;
        let mut ws = follow(ctx.host(), &session, false).await;
        let run = ctx.send(&session, "through the noise").await;
        let end = run_end(&mut ws, &run, TURN).await;
        let said = text_of_run(&ws, &run);
        let kinds = kinds_of(&ws, &run);
        check(end["state"] == "completed", || format!("{end} {kinds:?}"))?;
        check(said.contains("echo: through the noise"), || said.clone())?;
        let errors: Vec<&Value> = ws
            .seen
            .iter()
            .filter(|s| s.kind() == "error")
            .map(|s| &s.event)
            .collect();
        check(errors.is_empty(), || format!("{errors:?}"))?;
        let leaked = ws.seen.iter().any(|s| {
            let text = s.event.to_string();
            text.contains("not protocol output") || text.contains("x_future")
        });
        check(!leaked, || "the noise reached an event".to_owned())?;
        Ok(None)
    })
}

fn stdout_protocol_purity(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    behind_noise(
        ctx,
        &[
            "this is not protocol output: a banner an npm shim printed",
            "{ torn json",
        ],
    )
}

fn unknown_event_forward_compatible(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    behind_noise(
        ctx,
        &[
            r#"{"type":"x_future_event","subtype":"x_future","payload":{"a":1}}"#,
            r#"{"jsonrpc":"2.0","method":"x_future/notification","params":{"a":1}}"#,
            r#"{"method":"x_future/notification","params":{"a":1}}"#,
        ],
    )
}

fn redaction(ctx: &mut Ctx) -> Pin<Box<dyn Future<Output = Verdict> + '_>> {
    Box::pin(async move {
        // After every case so far: the agent's credential is nowhere in the host's files.
        let canary = ctx.entry.credential;
        let mut leaks = Vec::new();
        let mut stack = vec![ctx.host_home()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.file_name().is_some_and(|n| n != "config.toml")
                    && std::fs::read(&path)
                        .is_ok_and(|b| b.windows(canary.len()).any(|w| w == canary.as_bytes()))
                {
                    leaks.push(path);
                }
            }
        }
        check(leaks.is_empty(), || {
            format!("the credential is in {leaks:?}")
        })?;
        Ok(None)
    })
}

/// Every case, in the order they run (later ones build on the shared session's history).
const CASES: &[(&str, CaseFn)] = &[
    ("probe_missing_binary", probe_missing_binary),
    ("new_session_emits_id", new_session_emits_id),
    ("multi_turn_continuity", multi_turn_continuity),
    ("tool_activity_visible", tool_activity_visible),
    ("permission_roundtrip", permission_roundtrip),
    ("cancel_keeps_session", cancel_keeps_session),
    ("fork", fork),
    (
        "resume_wrong_workspace_rejected",
        resume_wrong_workspace_rejected,
    ),
    ("resume_rejected_fallback", resume_rejected_fallback),
    (
        "result_exactly_once_to_caller",
        result_exactly_once_to_caller,
    ),
    ("rate_limited", rate_limited),
    ("auth_required", auth_required),
    ("transport_lost", transport_lost),
    ("close_reaps_process_tree", close_reaps_process_tree),
    ("stdout_protocol_purity", stdout_protocol_purity),
    (
        "unknown_event_forward_compatible",
        unknown_event_forward_compatible,
    ),
    ("resume_after_process_restart", resume_after_process_restart),
    ("transport_uncertainty", transport_uncertainty),
    ("redaction", redaction),
];

/// Why a case does not apply to an agent, from its declared capabilities.
fn not_applicable(case: &str, caps: &Value) -> Option<String> {
    match case {
        "cancel_keeps_session" if caps["cancel"] != true => {
            Some("the agent declares no cancel".to_owned())
        }
        "resume_after_process_restart" if caps["resume"] == "none" => Some(
            "the host does not resume this agent's sessions in a new process; it starts a \
             fresh one with a `resume_unsupported` warning"
                .to_owned(),
        ),
        "resume_rejected_fallback" if caps["resume"] == "none" => Some(
            "the host does not resume this agent's sessions, so it never asks for one the agent \
             does not have; it starts a fresh one with a `resume_unsupported` warning"
                .to_owned(),
        ),
        "permission_roundtrip" if caps["permissions"] != true => Some(format!(
            "no permission round trip: the agent runs under a declared policy ({})",
            caps["permission_policy"].as_str().unwrap_or("unspecified")
        )),
        _ => None,
    }
}

fn results_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/conformance")
        .join(format!("{name}.json"))
}

/// Run every case over one agent; write and check its results.
fn conform(entry: fn() -> Entry, test: &str) {
    let e = entry();
    (e.install)();
    if !in_loopback_only_netns(test) {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut ctx = Ctx::start(e).await;
        let mut results = BTreeMap::new();
        for (name, case) in CASES {
            let began = std::time::Instant::now();
            let quirk = ctx
                .entry
                .cannot_meet
                .iter()
                .find(|(case, _)| case == name)
                .map(|(_, why)| (*why).to_owned());
            let outcome = match quirk.or_else(|| not_applicable(name, &ctx.caps)) {
                Some(why) => Outcome::NotApplicable(why),
                None => match std::panic::AssertUnwindSafe(case(&mut ctx))
                    .catch_unwind()
                    .await
                {
                    Ok(Ok(how)) => match ctx.not_applicable.take() {
                        Some(why) => Outcome::NotApplicable(why),
                        None => Outcome::Pass(how),
                    },
                    Ok(Err(why)) => Outcome::Fail(why),
                    Err(panic) => Outcome::Fail(
                        panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_else(|| "panicked".to_owned()),
                    ),
                },
            };
            eprintln!(
                "conformance {} {name} ({:.1} s): {outcome:?}",
                ctx.entry.name,
                began.elapsed().as_secs_f64()
            );
            results.insert((*name).to_owned(), outcome);
        }
        let failed: Vec<String> = results
            .iter()
            .filter_map(|(n, o)| match o {
                Outcome::Fail(why) => Some(format!("{n}: {why}")),
                _ => None,
            })
            .collect();
        let version = pinned(ctx.entry.package);
        let record = json!({
            "agent": ctx.entry.name,
            "agent_type": ctx.entry.agent_type,
            "package": ctx.entry.package,
            "version": version,
            "agent_list": ctx.listed,
            "cases": results.iter().map(|(n, o)| (n.clone(), o.record())).collect::<serde_json::Map<_, _>>(),
        });
        if let Some(host) = ctx.host.take() {
            host.stop().await;
        }
        assert!(
            failed.is_empty(),
            "{} failed {} case(s):\n{}",
            ctx.entry.name,
            failed.len(),
            failed.join("\n")
        );
        let path = results_path(ctx.entry.name);
        let text = serde_json::to_string_pretty(&record).unwrap() + "\n";
        if std::env::var_os("AGENT_HOST_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text,
            "{} is stale (run with AGENT_HOST_BLESS=1 and review): now\n{text}",
            path.display()
        );
    });
}

fn pinned(package: &str) -> String {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/package.json"))
            .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["dependencies"][package].as_str().unwrap().to_owned()
}

#[test]
fn conformance_claude() {
    conform(claude_entry, "conformance_claude");
}

#[test]
fn conformance_codex() {
    conform(codex_entry, "conformance_codex");
}

#[test]
fn conformance_claude_agent_acp() {
    conform(claude_acp_entry, "conformance_claude_agent_acp");
}

#[test]
fn conformance_qwen() {
    conform(qwen_entry, "conformance_qwen");
}

#[test]
fn conformance_gemini() {
    conform(gemini_entry, "conformance_gemini");
}

#[test]
fn conformance_gemini_acp() {
    conform(gemini_acp_entry, "conformance_gemini_acp");
}

#[test]
fn conformance_opencode() {
    conform(opencode_entry, "conformance_opencode");
}

/// `protocol_incompatible`, for every family of the registry: a binary that answers in another
/// protocol version (an ACP `initialize` with version 99; a `--version` without a version) is
/// refused at the probe with that category, naming what it said. No real CLI can be made to do
/// this, so a stand-in script takes the binary's place.
#[test]
fn every_family_refuses_an_agent_of_another_protocol_version() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("other-version-agent");
        std::fs::write(
            &fake,
            "#!/bin/sh\n\
             for a in \"$@\"; do [ \"$a\" = --version ] && { echo 'agent of another age'; exit 0; }; done\n\
             read -r line\n\
             id=$(printf '%s' \"$line\" | sed -n 's/.*\"id\": *\\([0-9][0-9]*\\).*/\\1/p')\n\
             printf '{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"protocolVersion\":99,\"agentCapabilities\":{}}}\\n' \"${id:-0}\"\n\
             read -r rest\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let home = dir.path().join("host");
        std::fs::create_dir_all(&home).unwrap();
        let mut toml = String::new();
        for family in agent_host::adapter::family::FAMILIES {
            let agent_type = family.descriptor().agent_type;
            toml.push_str(&format!(
                "[agents.{agent_type}]\nbinary = {:?}\n",
                fake.display().to_string()
            ));
        }
        std::fs::write(home.join("config.toml"), toml).unwrap();
        let mut config = agent_host::config::Config::with_home(&home).unwrap();
        config.env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
        let (defs, bad) = agent_host::adapter::launch::agent_defs(&config);
        assert!(bad.is_empty(), "{bad:?}");
        let base = agent_host::adapter::spawn::filter_env(config.env.clone());
        for family in agent_host::adapter::family::FAMILIES {
            let agent_type = family.descriptor().agent_type;
            let report = agent_host::adapter::probe(agent_type, &defs[agent_type], &base).await;
            assert!(!report.usable, "{agent_type}: {report:?}");
            assert_eq!(
                report.error,
                Some(agent_host::protocol::events::ErrorCategory::ProtocolIncompatible),
                "{agent_type}: {report:?}"
            );
            let reason = report.reason.unwrap_or_default();
            assert!(
                reason.contains("99") || reason.contains("agent of another age"),
                "{agent_type}: the reason does not say what the agent said: {reason}"
            );
        }
    });
}

/// Why `gemini-acp` is never resumed (what its descriptor and its `cannot_meet` of
/// `resume_after_process_restart` rest on): with the real CLI over ACP, a session made and
/// prompted in one process, then loaded by a second process within the same minute, is
/// refused ("No previous sessions found for this project."), and its file is left without its
/// conversation (a new header, and its messages reset, appended after it: the session's file
/// is named by that minute, and the loading process starts its own record of the session in
/// the file of the current minute first). So a restart in a session's first minute would
/// wipe it; the host starts a fresh session instead.
#[test]
fn gemini_acp_load_within_the_sessions_minute_is_refused() {
    let bin = ensure_gemini();
    if !in_loopback_only_netns("gemini_acp_load_within_the_sessions_minute_is_refused") {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mock = MockModel::start(0).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        write_gemini_settings(home.path());
        let work = home.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let minute = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                / 60
        };
        // Both processes within one minute: started early enough in it.
        let into = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            % 60.0;
        if into > 30.0 {
            tokio::time::sleep(std::time::Duration::from_secs_f64(60.2 - into)).await;
        }
        let started = minute();
        let spawn = || {
            tokio::process::Command::new(&bin)
                .args(["--acp", "--skip-trust"])
                .current_dir(&work)
                .env_clear()
                .envs(gemini_env(home.path(), &mock))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        };
        let cwd = work.display().to_string();
        let mut first = RawAcp::of(spawn());
        first.initialize().await;
        let new = first
            .request("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        let session = new["result"]["sessionId"].as_str().unwrap().to_owned();
        let prompt = first
            .request(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "hello"}]}),
            )
            .await;
        assert_eq!(prompt["result"]["stopReason"], "end_turn", "{prompt}");
        first.close().await;

        let mut second = RawAcp::of(spawn());
        second.initialize().await;
        let load = second
            .request(
                "session/load",
                json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
            )
            .await;
        assert_eq!(minute(), started, "not within one minute: nothing shown");
        eprintln!("session/load within the minute: {load}");
        assert!(
            load["error"]["data"]["details"]
                .as_str()
                .is_some_and(|d| d.contains("No previous sessions found for this project")),
            "{load}"
        );
        second.close().await;
        // The session's file: its conversation followed by a second header, which empties it.
        let chats = std::fs::read_dir(home.path().join(".gemini/tmp/work/chats")).unwrap();
        let file = chats
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.to_string_lossy()
                    .ends_with(&format!("-{}.jsonl", &session[..8]))
            })
            .unwrap();
        let lines: Vec<Value> = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let said = lines
            .iter()
            .position(|l| l["type"] == "user" && l["content"].to_string().contains("hello"));
        let last_header = lines.iter().rposition(|l| l["startTime"].is_string());
        assert!(
            said.is_some() && last_header > said,
            "no header after the conversation: {lines:?}"
        );
    });
}

/// A JSON-RPC 2.0 client over an ACP agent's stdio, for `gemini_acp_load_*`.
struct RawAcp {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    id: u64,
}

impl RawAcp {
    fn of(mut child: tokio::process::Child) -> RawAcp {
        use tokio::io::AsyncBufReadExt;
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        RawAcp {
            child,
            lines,
            id: 0,
        }
    }

    async fn initialize(&mut self) {
        let init = self
            .request(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities":
                    {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}}),
            )
            .await;
        assert_eq!(
            init["result"]["agentCapabilities"]["loadSession"], true,
            "{init}"
        );
    }

    /// The answer to a request (notifications and the agent's own requests skipped).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        use tokio::io::AsyncWriteExt;
        self.id += 1;
        let line = json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params});
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        loop {
            let line = tokio::time::timeout(TURN, self.lines.next_line())
                .await
                .expect("no answer in time")
                .unwrap()
                .expect("the agent's stdout ended");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == self.id && message.get("method").is_none() {
                return message;
            }
        }
    }

    /// Stdin closed: it exits.
    async fn close(mut self) {
        drop(self.child.stdin.take());
        let status = tokio::time::timeout(TURN, self.child.wait())
            .await
            .expect("gemini --acp did not exit on stdin EOF")
            .unwrap();
        assert!(status.success(), "{status}");
    }
}
