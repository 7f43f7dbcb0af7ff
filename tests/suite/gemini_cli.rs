//! The real Gemini CLI (`@google/gemini-cli`, pinned in agents/package.json) run on its own,
//! not through agent-host, against the Gemini API of the project's mock model, each test in a
//! network namespace that has only loopback: one-shot `-p` with `-o stream-json` (a turn, a
//! resume by session id, a session id given up front, a tool call with and without `--yolo`),
//! ACP (`--acp`: initialize, a session, a prompt), what the model's errors look like, and what
//! SIGINT and SIGTERM do to a turn. What these show is what a driver of the CLI can rely on.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::agents::{ensure_gemini, gemini_env, in_loopback_only_netns, write_gemini_settings};
use common::mock_model::MockModel;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The longest any one CLI process or reply may take.
const WAIT: Duration = Duration::from_secs(60);

/// A mock model, a HOME with the CLI's settings and a workspace, on a runtime of their own.
struct Lab {
    bin: PathBuf,
    mock: MockModel,
    home: tempfile::TempDir,
    work: PathBuf,
}

/// A finished one-shot run: stdout's JSON lines, stderr, the exit code.
struct Run {
    lines: Vec<Value>,
    stderr: String,
    code: Option<i32>,
    took: Duration,
}

impl Run {
    fn of_type(&self, kind: &str) -> Vec<&Value> {
        self.lines.iter().filter(|l| l["type"] == kind).collect()
    }

    /// The assistant's text: its `message` deltas, joined.
    fn text(&self) -> String {
        self.of_type("message")
            .iter()
            .filter(|m| m["role"] == "assistant")
            .filter_map(|m| m["content"].as_str())
            .collect()
    }

    fn session_id(&self) -> String {
        let init = &self.lines[0];
        assert_eq!(init["type"], "init", "{:?}", self.lines);
        init["session_id"].as_str().unwrap().to_owned()
    }

    fn result(&self) -> &Value {
        let result = self.lines.last().unwrap();
        assert_eq!(result["type"], "result", "{:?}", self.lines);
        result
    }
}

impl Lab {
    async fn start(bin: PathBuf) -> Lab {
        let mock = MockModel::start(0).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        write_gemini_settings(home.path());
        let work = home.path().join("work");
        std::fs::create_dir(&work).unwrap();
        Lab {
            bin,
            mock,
            home,
            work,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command
            .args(args)
            .current_dir(&self.work)
            .env_clear()
            .envs(gemini_env(self.home.path(), &self.mock))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// `gemini --skip-trust -o stream-json <args>` to its exit, stdin closed. What it printed
    /// goes to the test's log: the record of what the CLI does.
    #[expect(
        clippy::print_stderr,
        reason = "the run's output is the test's evidence"
    )]
    async fn one_shot(&self, args: &[&str]) -> Run {
        let mut all = vec!["--skip-trust", "-o", "stream-json"];
        all.extend_from_slice(args);
        let started = Instant::now();
        let child = self.command(&all).spawn().unwrap();
        let output = tokio::time::timeout(WAIT, child.wait_with_output())
            .await
            .expect("gemini did not exit in time")
            .unwrap();
        let took = started.elapsed();
        let lines = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let run = Run {
            lines,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code(),
            took,
        };
        eprintln!(
            "gemini {args:?}: exit {:?} after {took:?}\n{}\nstderr: {}",
            run.code,
            run.lines
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            run.stderr
        );
        run
    }

    /// The session's file: `~/.gemini/tmp/<project slug>/chats/session-<minute>-<id8>.jsonl`,
    /// the one whose first line names the session (a resume in a later minute adds a second
    /// file of the same id, holding only a header).
    fn session_file(&self, session_id: &str) -> PathBuf {
        let tmp = self.home.path().join(".gemini/tmp");
        let suffix = format!("-{}.jsonl", &session_id[..8]);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .flat_map(|project| std::fs::read_dir(project.path().join("chats")).into_iter())
            .flatten()
            .flatten()
            .map(|f| f.path())
            .filter(|p| p.to_string_lossy().ends_with(&suffix))
            .collect();
        files.sort();
        let file = files
            .first()
            .unwrap_or_else(|| panic!("no {suffix} in {tmp:?}"));
        let first = std::fs::read_to_string(file).unwrap();
        let header: Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
        assert_eq!(header["sessionId"], session_id);
        file.clone()
    }
}

/// Run `body` on a fresh lab inside this test's own loopback-only namespace.
fn in_lab<F: AsyncFnOnce(Lab)>(test: &str, body: F) {
    let bin = ensure_gemini();
    if !in_loopback_only_netns(test) {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move { body(Lab::start(bin).await).await });
}

#[test]
fn one_shot_turns_resume_by_id_and_run_tools_with_yolo() {
    in_lab(
        "one_shot_turns_resume_by_id_and_run_tools_with_yolo",
        async |lab| {
            // A turn: `init` (with the session id) first, the prompt echoed as a user
            // message, the answer in assistant deltas, `result` last.
            let first = lab.one_shot(&["-p", "hello"]).await;
            assert_eq!(first.code, Some(0), "{}", first.stderr);
            let session = first.session_id();
            assert!(uuid::Uuid::parse_str(&session).is_ok(), "{session}");
            assert_eq!(first.lines[0]["model"], "auto");
            let user = first.of_type("message")[0];
            assert_eq!(
                (&user["role"], &user["content"]),
                (&json!("user"), &json!("hello"))
            );
            assert_eq!(
                first.text(),
                "echo: hello [user turns seen: 1; first: hello]"
            );
            assert_eq!(first.result()["status"], "success");
            assert!(first.result()["stats"]["total_tokens"].as_u64().unwrap() > 0);
            // The router's JSON-mode call, then the turn: two requests.
            assert_eq!(
                lab.mock.requests.load(std::sync::atomic::Ordering::Relaxed),
                2
            );
            let file = lab.session_file(&session);
            let slug = file
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .file_name()
                .unwrap();
            assert_eq!(slug, "work", "the project's slug is its directory's name");

            // Another process resumes it by id: the same session, the history sent again.
            let second = lab.one_shot(&["--resume", &session, "-p", "again"]).await;
            assert_eq!(second.code, Some(0), "{}", second.stderr);
            assert_eq!(second.session_id(), session);
            assert_eq!(
                second.text(),
                "echo: again [user turns seen: 2; first: hello]"
            );
            assert_eq!(
                lab.session_file(&session),
                file,
                "appended to the same file"
            );

            // A new session under an id chosen up front.
            let chosen = uuid::Uuid::new_v4().to_string();
            let third = lab
                .one_shot(&["--session-id", &chosen, "-p", "chosen"])
                .await;
            assert_eq!(third.session_id(), chosen);
            assert!(third.text().contains("[user turns seen: 1; first: chosen]"));

            // A shell tool call with --yolo: it runs, and the model gets its output.
            let tool = lab
                .one_shot(&[
                    "--yolo",
                    "-p",
                    "TOOLCALL `touch gemini-made && echo gemini-tool`",
                ])
                .await;
            assert_eq!(tool.code, Some(0), "{}", tool.stderr);
            let used = tool.of_type("tool_use");
            assert_eq!(used.len(), 1, "{:?}", tool.lines);
            assert_eq!(used[0]["tool_name"], "run_shell_command");
            assert_eq!(
                used[0]["parameters"],
                json!({"command": "touch gemini-made && echo gemini-tool"})
            );
            let result = tool.of_type("tool_result")[0];
            assert_eq!(result["tool_id"], used[0]["tool_id"]);
            assert_eq!(
                (&result["status"], &result["output"]),
                (&json!("success"), &json!("gemini-tool"))
            );
            // The mock says something first, then calls the tool.
            assert_eq!(tool.text(), "Running it.tool said: gemini-tool");
            assert!(lab.work.join("gemini-made").exists());
            assert_eq!(tool.result()["stats"]["tool_calls"], 1);

            // Without --yolo (approval mode `default`) a one-shot run has no shell tool: the
            // call fails as unregistered and the turn goes on.
            let refused = lab
                .one_shot(&["-p", "TOOLCALL `touch not-made && echo no`"])
                .await;
            assert_eq!(refused.code, Some(0), "{}", refused.stderr);
            let result = refused.of_type("tool_result")[0];
            assert_eq!(result["status"], "error");
            assert_eq!(result["error"]["type"], "tool_not_registered");
            assert!(
                refused
                    .text()
                    .starts_with("Running it.tool said: Tool \"run_shell_command\" not found")
            );
            assert!(!lab.work.join("not-made").exists());
            assert_eq!(refused.result()["status"], "success");

            // A thought part is not printed; the answer is.
            let think = lab.one_shot(&["-p", "THINK about it"]).await;
            assert_eq!(
                think.text(),
                "echo: THINK about it [user turns seen: 1; first: THINK about it]"
            );
        },
    );
}

#[test]
fn the_models_errors_in_one_shot_mode() {
    in_lab("the_models_errors_in_one_shot_mode", async |lab| {
        // An API error ends the run at once (one attempt, see the settings): a `result` with
        // status `error` and the API's message, and the HTTP status as the exit code (mod 256).
        for (prompt, code, message) in [
            (
                "FAIL429",
                429 % 256,
                "[API Error: mock: rate limit exceeded]",
            ),
            (
                "FAIL401",
                401 % 256,
                r#"[API Error: {"error":{"code":401,"message":"mock: invalid API key","status":"UNAUTHENTICATED"}}]"#,
            ),
            (
                "FAIL500",
                500 % 256,
                r#"[API Error: {"error":{"code":500,"message":"mock: internal error","status":"INTERNAL"}}]"#,
            ),
        ] {
            let run = lab.one_shot(&["-p", prompt]).await;
            assert_eq!(run.code, Some(code), "{prompt}: {}", run.stderr);
            assert_eq!(run.lines[0]["type"], "init");
            let result = run.result();
            assert_eq!(result["status"], "error", "{prompt}");
            let said = result["error"]["message"].as_str().unwrap();
            assert!(said.starts_with(message), "{prompt}: {said}");
            assert!(run.took < Duration::from_secs(20), "{prompt} retried");
            assert!(
                run.stderr.contains("Error when talking to Gemini API"),
                "{prompt}: {}",
                run.stderr
            );
        }
        // A stream cut mid-way: the partial text, then a failed result, exit 1.
        let cut = lab.one_shot(&["-p", "CUTSTREAM"]).await;
        assert_eq!(cut.code, Some(1), "{}", cut.stderr);
        assert_eq!(cut.text(), "partial ");
        assert_eq!(cut.result()["status"], "error");
        assert_eq!(cut.result()["error"]["message"], "[API Error: terminated]");
    });
}

/// Read stdout lines until one matches, bounded.
async fn until_line(lines: &mut Lines<BufReader<ChildStdout>>, want: impl Fn(&Value) -> bool) {
    loop {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("gemini went silent")
            .unwrap()
            .expect("gemini's stdout ended");
        if want(&serde_json::from_str(&line).unwrap()) {
            return;
        }
    }
}

#[test]
fn sigint_and_sigterm_end_a_turn_and_keep_its_prompt() {
    in_lab(
        "sigint_and_sigterm_end_a_turn_and_keep_its_prompt",
        async |lab| {
            for signal in [nix::sys::signal::SIGINT, nix::sys::signal::SIGTERM] {
                let session = uuid::Uuid::new_v4().to_string();
                let args = [
                    "--skip-trust",
                    "-o",
                    "stream-json",
                    "--session-id",
                    &session,
                    "-p",
                    "SLOW please",
                ];
                let mut child = lab.command(&args).spawn().unwrap();
                let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
                until_line(&mut lines, |l| l["role"] == "assistant").await;
                let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
                nix::sys::signal::kill(pid, signal).unwrap();
                let sent = Instant::now();
                let status = tokio::time::timeout(WAIT, child.wait())
                    .await
                    .expect("gemini did not exit on the signal")
                    .unwrap();
                eprintln!("{signal}: {status} after {:?}", sent.elapsed());
                // A clean exit 0, and no `result`: only its absence tells it from a success.
                assert_eq!(status.code(), Some(0), "{signal}");
                let mut rest = Vec::new();
                while let Some(line) = lines.next_line().await.unwrap() {
                    rest.push(line);
                }
                assert!(
                    rest.iter().all(|l| !l.contains(r#""type":"result""#)),
                    "{signal}: {rest:?}"
                );
                let mut stderr = String::new();
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr)
                    .await
                    .unwrap();
                eprintln!("{signal} stderr: {stderr}");
                // The prompt was saved before the model was called; the partial answer is
                // lost. Resumed, the next prompt comes after the cut one, in the same content.
                let saved = std::fs::read_to_string(lab.session_file(&session)).unwrap();
                assert!(saved.contains("SLOW please"), "{saved}");
                assert!(!saved.contains(r#""type":"gemini""#), "{saved}");
                let after = lab
                    .one_shot(&["--resume", &session, "-p", "after the signal"])
                    .await;
                assert_eq!(after.session_id(), session);
                assert_eq!(
                    after.text(),
                    "echo: after the signal [user turns seen: 2; first: SLOW please]"
                );
            }
        },
    );
}

/// A JSON-RPC 2.0 peer over the child's stdio.
struct Acp {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    updates: Vec<Value>,
}

impl Acp {
    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        loop {
            let line = tokio::time::timeout(WAIT, self.lines.next_line())
                .await
                .expect("no answer in time")
                .unwrap()
                .expect("the agent's stdout ended");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id && message.get("method").is_none() {
                return message;
            }
            if message["method"] == "session/update" {
                self.updates.push(message["params"].clone());
            }
        }
    }
}

#[test]
fn acp_initialize_new_session_and_a_prompt() {
    in_lab("acp_initialize_new_session_and_a_prompt", async |lab| {
        let mut child = lab.command(&["--acp", "--skip-trust"]);
        let mut child = child.stdin(Stdio::piped()).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acp = Acp {
            child,
            lines,
            updates: Vec::new(),
        };
        let started = Instant::now();
        let init = acp
            .request(
                1,
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities":
                    {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false},
                    "clientInfo": {"name": "agent-host-test", "version": "0"}}),
            )
            .await;
        eprintln!("initialize after {:?}: {init}", started.elapsed());
        let result = &init["result"];
        assert_eq!(result["protocolVersion"], 1);
        assert_eq!(result["agentInfo"]["version"], "0.61.0");
        let capabilities = &result["agentCapabilities"];
        assert_eq!(capabilities["loadSession"], true, "{capabilities}");
        assert!(
            capabilities.get("sessionCapabilities").is_none(),
            "{capabilities}"
        );

        let cwd = lab.work.display().to_string();
        let new = acp
            .request(2, "session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        let session = new["result"]["sessionId"].as_str().unwrap().to_owned();
        assert_eq!(new["result"]["modes"]["currentModeId"], "default", "{new}");
        assert_eq!(new["result"]["models"]["currentModelId"], "auto", "{new}");

        let prompt = acp
            .request(
                3,
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "hello"}]}),
            )
            .await;
        eprintln!("prompt answered after {:?}: {prompt}", started.elapsed());
        assert_eq!(prompt["result"]["stopReason"], "end_turn", "{prompt}");
        let text: String = acp
            .updates
            .iter()
            .filter(|u| u["sessionId"] == session.as_str())
            .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|u| u["update"]["content"]["text"].as_str())
            .collect();
        assert_eq!(text, "echo: hello [user turns seen: 1; first: hello]");

        // Stdin closed: it exits, 0.
        drop(acp.child.stdin.take());
        let status = tokio::time::timeout(WAIT, acp.child.wait())
            .await
            .expect("gemini --acp did not exit on stdin EOF")
            .unwrap();
        assert!(status.success(), "{status}");
        assert!(Path::new(&lab.session_file(&session)).exists());
    });
}
