//! The web UI in a real browser: the `agent-host` binary, started with `host.start` on a temp
//! home that already holds one big session (10,000 brackets, seeded through the store), runs
//! the real `claude` against the project's mock model, and the browser scenario
//! `web/tests/ui.mjs` (playwright-core driving Debian's headless Chromium) exercises the UI it
//! serves on its loopback port — all inside a loopback-only network namespace.
//!
//! The contract with the script, as environment variables (besides the host's own, so it can
//! run `agent-host` commands against the same home):
//! - `AH_BIN`: the `agent-host` binary; `AH_HOME`: the host's home (`AGENT_HOST_HOME`);
//! - `AH_WORKDIR`: the project directory for new sessions;
//! - `AH_BIG_SESSION`, `AH_BIG_COUNT`: the seeded session's id and its number of brackets;
//! - `AH_SHOTS`: a directory for screenshots (`<target dir>/web-ui`, created);
//! - `AH_RESULTS`: where the script writes `{"tokens": [string…], "figures": {…}}`;
//! - `AH_CHROMIUM`, `AH_CHROMIUM_ARGS`: the browser and its flags (space-separated).
//!
//! The script must exit 0. Its tokens (secrets it saw in the browser, e.g. grant tokens) must
//! be at least 20 characters and appear in no file under the host's `logs/`; its figures are
//! printed. `AH_UI_SCRIPT` runs another script in place of `web/tests/ui.mjs`; `AH_HOST_BIN`
//! another `agent-host` binary (a release build, for the figures in docs/performance.md).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failing test should panic; the figures are the test's report"
)]

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_host::protocol::events::{
    BlockEnd, BlockStart, Event, EventBody, RunEnd, RunStart, RunState, SessionStateChange,
    ToolCallEnd, ToolCallStart, ToolExecEnd, ToolExecStart, Usage, UserText,
};
use agent_host::protocol::states::SessionState;
use agent_host::store::{NewEvent, SessionRow, Store, now_ms};
use common::agents::{agent_env, ensure_claude, in_loopback_only_netns};
use common::browser::{CHROMIUM_ARGS, ensure_chromium, ensure_web};
use common::mock_model::MockModel;
use serde_json::{Value, json};

const BUILT: &str = env!("CARGO_BIN_EXE_agent-host");

/// The binary under test: this build's, or `AH_HOST_BIN` (a release build, for the figures in
/// docs/performance.md).
fn bin() -> String {
    std::env::var("AH_HOST_BIN").unwrap_or_else(|_| BUILT.to_owned())
}
/// Brackets in the seeded session.
const BIG_COUNT: usize = 10_000;
/// Bound on one `agent-host` command.
const CLI_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on the whole browser scenario.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(480);
/// How long the script gets to close its browser after a SIGTERM, before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);

#[test]
fn web_ui_in_a_real_browser() {
    let claude = ensure_claude();
    let web = ensure_web();
    let chromium = ensure_chromium();
    if !in_loopback_only_netns("web_ui_in_a_real_browser") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(scenario(&claude, &web, &chromium));
}

async fn scenario(claude: &Path, web: &Path, chromium: &Path) {
    let mock = MockModel::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let work = dir.path().join("work");
    let agent_home = dir.path().join("agent-home");
    for d in [&home, &work, &agent_home] {
        std::fs::create_dir_all(d).unwrap();
    }

    let seeded = std::time::Instant::now();
    let big = seed_big_session(&home.join("host.db"), &work, BIG_COUNT).await;
    println!(
        "seeded {BIG_COUNT} brackets into session {big} in {:.0} ms",
        seeded.elapsed().as_secs_f64() * 1000.0
    );

    let env = host_env(&home, claude, &agent_home, &mock);
    let host = Host { home: home.clone() };
    let started = host.cli(&env, &["host.start"]).await;
    assert_eq!(started["code"], 0, "host.start: {started}");
    assert_eq!(started["data"]["running"], json!(true), "{started}");

    let shots = target_dir().join("web-ui");
    std::fs::create_dir_all(&shots).unwrap();
    let results = dir.path().join("results.json");
    let script =
        std::env::var_os("AH_UI_SCRIPT").map_or_else(|| web.join("tests/ui.mjs"), PathBuf::from);
    assert!(
        script.exists(),
        "{} does not exist (the browser scenario; AH_UI_SCRIPT names another)",
        script.display()
    );
    let contract = [
        ("AH_BIN", bin()),
        ("AH_HOME", path_str(&home)),
        ("AH_WORKDIR", path_str(&work)),
        ("AH_BIG_SESSION", big.clone()),
        ("AH_BIG_COUNT", BIG_COUNT.to_string()),
        ("AH_SHOTS", path_str(&shots)),
        ("AH_RESULTS", path_str(&results)),
        ("AH_CHROMIUM", path_str(chromium)),
        ("AH_CHROMIUM_ARGS", CHROMIUM_ARGS.join(" ")),
        ("NODE_PATH", path_str(&web.join("node_modules"))),
    ];
    let ran = std::time::Instant::now();
    let status = run_script(
        &script,
        web,
        env.iter()
            .cloned()
            .chain(contract.map(|(k, v)| (k.to_owned(), v))),
    )
    .await;
    println!(
        "{} ran {:.1} s: {status}",
        script.display(),
        ran.elapsed().as_secs_f64()
    );
    assert!(status.success(), "{} failed: {status}", script.display());

    let text = std::fs::read_to_string(&results)
        .unwrap_or_else(|e| panic!("the script wrote no {}: {e}", results.display()));
    let report: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", results.display()));
    let tokens: Vec<String> = report["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens array in {report}"))
        .iter()
        .map(|t| {
            t.as_str()
                .unwrap_or_else(|| panic!("token {t} is not a string"))
                .to_owned()
        })
        .collect();
    for token in &tokens {
        assert!(
            token.len() >= 20,
            "token {token:?} is shorter than 20 characters: too short to look for in the logs"
        );
    }
    let mut logs = Vec::new();
    files_under(&home.join("logs"), &mut logs);
    for file in &logs {
        let bytes = std::fs::read(file).unwrap();
        for token in &tokens {
            assert!(
                !contains(&bytes, token.as_bytes()),
                "{} contains a token the browser held ({}…)",
                file.display(),
                &token[..8]
            );
        }
    }
    println!(
        "checked {} tokens against {} log files; figures: {}",
        tokens.len(),
        logs.len(),
        serde_json::to_string_pretty(&report["figures"]).unwrap()
    );

    // The script may have stopped the host itself; a failure here is no failure of the test.
    let stopped = host.cli(&env, &["host.shutdown"]).await;
    println!("host.shutdown: {stopped}");
}

/// The environment of the binary host (and of the script, which runs `agent-host` commands
/// against the same home): exactly what an embedded `TestHost` of `world.rs` gives its agents
/// (`agent_env`: a private HOME, `PATH`, the mock's URL, a key, telemetry and retries off, all
/// of which the spawn policy passes on), the home, and the pinned `claude` as the family's
/// binary. Nothing of the test's own environment (proxies, `AGENT_HOST_LOG`, …) leaks in.
fn host_env(
    home: &Path,
    claude: &Path,
    agent_home: &Path,
    mock: &MockModel,
) -> Vec<(String, String)> {
    let mut env = agent_env(agent_home, mock);
    env.push(("AGENT_HOST_HOME".to_owned(), path_str(home)));
    env.push(("AGENT_HOST_CLAUDE_BIN".to_owned(), path_str(claude)));
    env
}

fn path_str(path: &Path) -> String {
    path.to_str().unwrap().to_owned()
}

/// `CARGO_TARGET_DIR` (relative to the checkout if relative), else the checkout's `target/`.
fn target_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| root.join("target"), |d| root.join(d))
}

/// The binary host of one home; dropped, it kills a host still holding the home's lock (by
/// the pid in it), so a failing test leaks no daemon.
struct Host {
    home: PathBuf,
}

impl Host {
    /// One `agent-host` command with `env` (and nothing else): its JSON reply.
    async fn cli(&self, env: &[(String, String)], args: &[&str]) -> Value {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(CLI_TIMEOUT, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("agent-host {args:?} took over {CLI_TIMEOUT:?}"))
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "agent-host {args:?}: not one JSON reply ({e}): {stdout:?} (stderr: {})",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        common::reap::kill_lock_holder(&self.home.join("host.lock"));
    }
}

/// `node <script>` in `web/` with exactly `env`, its output passed through, in its own process
/// group, which is killed once the script exits; past [`SCRIPT_TIMEOUT`] the group gets
/// SIGTERM (playwright closes its browser on it), then SIGKILL, and the test fails.
async fn run_script(
    script: &Path,
    web: &Path,
    env: impl Iterator<Item = (String, String)>,
) -> std::process::ExitStatus {
    let mut child = tokio::process::Command::new("/usr/bin/node")
        .arg(script)
        .current_dir(web)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("node runs the browser scenario");
    let group = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    if let Ok(status) = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait()).await {
        // What the script left running in its group (an `agent-host follow`, say) goes too.
        let _rest = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        return status.unwrap();
    }
    let _term = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
    let status = match tokio::time::timeout(TERM_GRACE, child.wait()).await {
        Ok(status) => status.unwrap(),
        Err(_) => {
            let _kill = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            child.wait().await.unwrap()
        }
    };
    let _rest = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    panic!(
        "{} did not finish within {SCRIPT_TIMEOUT:?} (stopped: {:?})",
        script.display(),
        status
            .signal()
            .map_or_else(|| status.to_string(), |s| format!("signal {s}"))
    );
}

/// Every file under `dir`, recursively (none if it does not exist).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Seed `db` (the host's `host.db`, before any host runs on it) with one idle `claude` session
/// in `cwd`, titled "big session", holding exactly `count` brackets through the store's own
/// append path: runs of 16 canonical events each, as the host writes them, run `i` answering
/// "answer i" (run 0 is the oldest). Returns the session id.
async fn seed_big_session(db: &Path, cwd: &Path, count: usize) -> String {
    let (store, threads) = Store::open(db).unwrap();
    let session = uuid::Uuid::now_v7().to_string();
    // One bracket every 100 ms, ending now.
    let step = 100;
    let start = now_ms() - step * i64::try_from(count).unwrap();
    store
        .insert_session(SessionRow {
            session_id: session.clone(),
            agent_type: "claude".to_owned(),
            native_session_id: None,
            cwd: path_str(cwd),
            parent_session_id: None,
            title: Some("big session".to_owned()),
            state: SessionState::Idle,
            created_at_ms: start,
            updated_at_ms: start,
            fork_of: None,
            options: Default::default(),
            binding: None,
        })
        .await
        .unwrap();
    let mut events = Vec::with_capacity(count);
    let mut run = 0;
    while events.len() < count {
        events.extend(big_run(&session, cwd, run));
        run += 1;
    }
    assert_eq!(events.len(), count, "the runs do not add up to {count}");
    let mut receipts = Vec::new();
    let mut at = start;
    for chunk in events.chunks(1000) {
        let batch = chunk
            .iter()
            .map(|event| {
                at += step;
                NewEvent {
                    message_id: uuid::Uuid::new_v4().to_string().into(),
                    session_id: session.as_str().into(),
                    run_id: event.run_id.as_deref().map(Into::into),
                    kind: event.kind(),
                    payload: serde_json::to_string(event).unwrap().into(),
                    created_at: at,
                }
            })
            .collect();
        receipts.push(store.append(batch).await.unwrap());
    }
    let mut stored = 0;
    for receipt in receipts {
        stored += receipt.await.unwrap().unwrap().len();
    }
    assert_eq!(stored, count);
    threads.shutdown().await;
    drop(store);
    session
}

/// Run `i` of the big session: 16 brackets. A prompt, the run and state brackets, a first
/// text (markdown with a heading, a list and a fenced code block in every third run), a tool
/// call with its execution (`Bash {command}` in even runs, `Edit {file_path, old_string,
/// new_string}` with multi-line strings in odd ones), a text on it, the answer naming `i`
/// ("answer i"), usage, the run's end and the state back to idle.
fn big_run(session: &str, cwd: &Path, i: usize) -> Vec<Event> {
    let run = Some(uuid::Uuid::now_v7().to_string());
    let ev = |run: &Option<String>, body| Event::new(session, run.clone(), body);
    let item = |n: usize| Some(format!("msg_big_{i:04}:{n}"));
    let call = format!("toolu_big_{i:04}");
    let first = if i.is_multiple_of(3) {
        format!(
            "## Step {i}\n\nThe plan for question {i}:\n\n- read `src/lib.rs`\n- change \
             **value** to {i}\n- run the tests\n\n```rust\nfn value() -> u32 {{\n    {i}\n}}\n```\n"
        )
    } else {
        format!("Looking at question {i}; one tool call should do.")
    };
    let (name, input, output, exit_code) = if i.is_multiple_of(2) {
        (
            "Bash",
            json!({"command": format!("cargo test step_{i}"), "description": "run the test"}),
            format!("running 1 test\ntest step_{i} ... ok\n\ntest result: ok. 1 passed"),
            Some(0),
        )
    } else {
        let file = cwd.join(format!("src/mod_{}.rs", i % 7));
        (
            "Edit",
            json!({
                "file_path": path_str(&file),
                "old_string": "fn value() -> u32 {\n    1\n}\n",
                "new_string": format!("/// Step {i}.\nfn value() -> u32 {{\n    {i}\n}}\n"),
            }),
            format!("The file {} has been updated.", file.display()),
            None,
        )
    };
    let answer = if i.is_multiple_of(5) {
        format!("answer {i}\n\n1. the tool ran\n2. nothing else to do")
    } else {
        format!("answer {i}")
    };
    vec![
        ev(
            &run,
            EventBody::UserText(UserText {
                text: format!("question {i}: please do step {i}"),
                client_msg_id: None,
                steer: false,
                from: None,
                imported: false,
                attachments: Vec::new(),
            }),
        ),
        ev(
            &run,
            EventBody::RunStart(RunStart {
                agent: Some("claude".to_owned()),
                model: Some("mock-model".to_owned()),
            }),
        ),
        ev(
            &run,
            EventBody::SessionState(SessionStateChange {
                state: SessionState::Running,
                previous: SessionState::Idle,
            }),
        ),
        ev(&run, EventBody::TextStart(BlockStart { item_id: item(0) })),
        ev(
            &run,
            EventBody::TextEnd(BlockEnd {
                item_id: item(0),
                text: first,
                truncated: None,
                imported: false,
            }),
        ),
        ev(
            &run,
            EventBody::ToolCallStart(ToolCallStart {
                call_id: call.clone(),
                name: name.to_owned(),
            }),
        ),
        ev(
            &run,
            EventBody::ToolCallEnd(ToolCallEnd {
                call_id: call.clone(),
                name: name.to_owned(),
                input,
                truncated: None,
            }),
        ),
        ev(
            &run,
            EventBody::ToolExecStart(ToolExecStart {
                call_id: call.clone(),
                name: Some(name.to_owned()),
            }),
        ),
        ev(
            &run,
            EventBody::ToolExecEnd(ToolExecEnd {
                call_id: call,
                output,
                is_error: false,
                exit_code,
                truncated: None,
            }),
        ),
        ev(&run, EventBody::TextStart(BlockStart { item_id: item(1) })),
        ev(
            &run,
            EventBody::TextEnd(BlockEnd {
                item_id: item(1),
                text: format!("The {name} call of step {i} went through."),
                truncated: None,
                imported: false,
            }),
        ),
        ev(&run, EventBody::TextStart(BlockStart { item_id: item(2) })),
        ev(
            &run,
            EventBody::TextEnd(BlockEnd {
                item_id: item(2),
                text: answer,
                truncated: None,
                imported: false,
            }),
        ),
        ev(
            &run,
            EventBody::Usage(Usage {
                input_tokens: 1000 + i as u64,
                output_tokens: 50,
                cached_input_tokens: None,
                cost_usd: None,
            }),
        ),
        ev(
            &run,
            EventBody::RunEnd(RunEnd {
                state: RunState::Completed,
                category: None,
                message: None,
            }),
        ),
        ev(
            &None,
            EventBody::SessionState(SessionStateChange {
                state: SessionState::Idle,
                previous: SessionState::Running,
            }),
        ),
    ]
}
