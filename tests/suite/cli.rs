//! End-to-end tests of the `agent-host` binary: every test runs the real compiled CLI, which
//! starts a real detached host talking over a real Unix socket, each in its own temp home.
//!
//! Nothing here sleeps to wait for a condition: a start is over when the CLI has printed its
//! line and exited, a host is gone exactly when its `flock` is released (`wait_released`).
//! Every wait has a bound. A [`Home`] kills a host still holding its lock when dropped, so a
//! failing test never leaks a daemon.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report (clippy's allow-*-in-tests does not reach helpers of an integration test)"
)]

use crate::common::reap;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use agent_host::instance::{lock_held, read_lock_info, wait_released};
use agent_host::protocol::envelope::{COMMANDS, ErrorCode, MAX_REQUEST_BYTES};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
/// The full binary the `agent-host` front hands every other command to.
const FULL_BIN: &str = env!("CARGO_BIN_EXE_agent-hostd");
/// Bound on one CLI invocation (the CLI's own waits are shorter than this).
const CLI_TIMEOUT: Duration = Duration::from_secs(25);
/// Bound on a host letting go of its lock after a signal.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// A private `AGENT_HOST_HOME` that does not exist yet (so the host is the one creating it).
struct Home {
    _dir: TempDir,
    home: PathBuf,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        Home { _dir: dir, home }
    }

    fn lock_path(&self) -> PathBuf {
        self.home.join("host.lock")
    }

    fn sock_path(&self) -> PathBuf {
        self.home.join("host.sock")
    }

    fn db_path(&self) -> PathBuf {
        self.home.join("host.db")
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .env("AGENT_HOST_HOME", &self.home)
            .env_remove("AGENT_HOST_IPC_TIMEOUT_MS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Run the CLI once and check the output contract: exactly one JSON reply line on stdout,
    /// exit status 0 exactly when `code` is 0.
    async fn cli(&self, args: &[&str]) -> Out {
        self.cli_cmd(self.command(args), args).await
    }

    /// As [`Home::cli`], with the CLI's working directory set.
    async fn cli_in(&self, cwd: &Path, args: &[&str]) -> Out {
        let mut cmd = self.command(args);
        cmd.current_dir(cwd);
        self.cli_cmd(cmd, args).await
    }

    async fn cli_cmd(&self, mut cmd: tokio::process::Command, args: &[&str]) -> Out {
        let output = tokio::time::timeout(CLI_TIMEOUT, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("agent-host {args:?} did not finish within {CLI_TIMEOUT:?}"))
            .unwrap();
        Out::check(args, output.status, &output.stdout, &output.stderr)
    }

    /// Run the CLI and require code 0.
    async fn ok(&self, args: &[&str]) -> Value {
        let out = self.cli(args).await;
        assert_eq!(out.code, 0, "agent-host {args:?}: {}", out.describe());
        out.data()
    }

    async fn start(&self) -> u32 {
        let data = self.ok(&["host.start"]).await;
        assert_eq!(data["running"], json!(true), "{data}");
        let pid = pid_of(&data);
        assert_ne!(pid, std::process::id());
        assert!(
            lock_held(&self.lock_path()).unwrap(),
            "host.start returned but nobody holds the lock"
        );
        pid
    }

    /// `host.shutdown`, which returns only once the host has released its lock.
    async fn shutdown(&self) {
        let data = self.ok(&["host.shutdown"]).await;
        assert_eq!(data["stopped"], json!(true), "{data}");
        assert!(
            !lock_held(&self.lock_path()).unwrap(),
            "host.shutdown returned but the lock is held"
        );
    }
}

impl Drop for Home {
    /// Never leak a daemon: a host still holding the lock is killed by the pid it wrote there.
    fn drop(&mut self) {
        reap::kill_lock_holder(&self.lock_path());
    }
}

/// One CLI run, already checked against the output contract.
struct Out {
    code: i64,
    reply: Value,
    success: bool,
    stderr: String,
}

impl Out {
    fn check(args: &[&str], status: ExitStatus, stdout: &[u8], stderr: &[u8]) -> Out {
        let stdout = String::from_utf8(stdout.to_vec()).unwrap();
        let stderr = String::from_utf8_lossy(stderr).into_owned();
        assert!(
            stdout.ends_with('\n') && stdout.matches('\n').count() == 1,
            "agent-host {args:?}: stdout is not exactly one line: {stdout:?} (stderr: {stderr})"
        );
        let reply: Value = serde_json::from_str(stdout.trim_end()).unwrap_or_else(|e| {
            panic!("agent-host {args:?}: stdout is not JSON ({e}): {stdout:?}")
        });
        let code = reply["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("agent-host {args:?}: reply has no numeric code: {reply}"));
        assert!(
            reply["message"].is_string(),
            "agent-host {args:?}: no message: {reply}"
        );
        assert!(
            reply.get("data").is_some(),
            "agent-host {args:?}: no data: {reply}"
        );
        assert_eq!(
            status.success(),
            code == 0,
            "agent-host {args:?}: exit status {status} does not match code {code}: {reply}"
        );
        if code != 0 {
            let known = ErrorCode::from_number(i32::try_from(code).unwrap())
                .unwrap_or_else(|| panic!("agent-host {args:?}: unknown code {code}: {reply}"));
            assert_eq!(
                reply["data"]["error"],
                json!(known.name()),
                "agent-host {args:?}: {reply}"
            );
        }
        Out {
            code,
            success: status.success(),
            reply,
            stderr,
        }
    }

    fn data(&self) -> Value {
        self.reply["data"].clone()
    }

    fn describe(&self) -> String {
        format!("reply {} (stderr: {})", self.reply, self.stderr)
    }
}

fn pid_of(data: &Value) -> u32 {
    let pid = data["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in {data}"));
    u32::try_from(pid).unwrap()
}

fn signal(pid: u32, signal: Signal) {
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), signal).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn session_ids(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions array in {list}"))
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_owned())
        .collect()
}

fn create_envelope(cwd: &str) -> String {
    json!({"command": "session.create", "params": {"agent_type": "claude", "cwd": cwd}}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_flow() {
    let home = Home::new();
    let work = tempfile::tempdir().unwrap();
    let work_dir = work.path().canonicalize().unwrap();

    let pid = home.start().await;

    // Everything the host creates is private to the user.
    assert_eq!(mode(&home.home), 0o700, "home");
    assert_eq!(mode(&home.sock_path()), 0o600, "host.sock");
    assert_eq!(mode(&home.db_path()), 0o600, "host.db");
    assert_eq!(mode(&home.lock_path()), 0o600, "host.lock");
    assert!(
        std::fs::metadata(home.sock_path())
            .unwrap()
            .file_type()
            .is_socket()
    );
    assert_eq!(read_lock_info(&home.lock_path()).unwrap().pid, pid);

    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["running"], json!(true), "{status}");
    assert_eq!(pid_of(&status), pid);
    assert_eq!(status["version"], json!(agent_host::VERSION));
    assert_eq!(status["sessions"], json!(0));
    assert_eq!(
        status["ipc_path"],
        json!(home.sock_path().display().to_string())
    );

    let created = home
        .ok(&[&create_envelope(&work_dir.display().to_string())])
        .await;
    let id = created["session_id"].as_str().unwrap().to_owned();
    assert!(!id.is_empty());
    assert_eq!(created["session"]["session_id"], json!(id));
    assert_eq!(created["session"]["agent_type"], json!("claude"));
    assert_eq!(
        created["session"]["cwd"],
        json!(work_dir.display().to_string())
    );

    // A relative cwd is relative to the shell the CLI runs in, not to the host's.
    let relative = home.cli_in(&work_dir, &[&create_envelope(".")]).await;
    assert_eq!(relative.code, 0, "{}", relative.describe());
    let relative = relative.data();
    assert_eq!(
        relative["session"]["cwd"],
        json!(work_dir.display().to_string())
    );
    let relative_id = relative["session_id"].as_str().unwrap().to_owned();
    assert_ne!(relative_id, id);

    let ids = session_ids(&home.ok(&["session.list"]).await);
    assert!(ids.contains(&id) && ids.contains(&relative_id), "{ids:?}");
    assert_eq!(ids.len(), 2);

    let by_id = json!({"session_id": id}).to_string();
    let row = home.ok(&["session.get", &by_id]).await;
    assert_eq!(row["session_id"], json!(id));
    assert_eq!(row["agent_type"], json!("claude"));
    assert_eq!(row["state"], json!("idle"));

    let history = home.ok(&["session.history", &by_id]).await;
    assert_eq!(history["session_id"], json!(id));
    assert_eq!(history["events"], json!([]), "{history}");
    assert_eq!(history["count"], json!(0));

    let deleted = home.ok(&["session.delete", &by_id]).await;
    assert_eq!(deleted["deleted"], json!(id));

    let gone = home.cli(&["session.get", &by_id]).await;
    assert_eq!(gone.code, 3001, "{}", gone.describe());
    assert!(!gone.success);
    assert_eq!(gone.data()["session_id"], json!(id));
    let again = home.cli(&["session.delete", &by_id]).await;
    assert_eq!(again.code, 3001, "{}", again.describe());
    assert_eq!(
        session_ids(&home.ok(&["session.list"]).await),
        vec![relative_id]
    );
    assert_eq!(home.ok(&["host.status"]).await["sessions"], json!(1));

    let stopped = home.ok(&["host.shutdown"]).await;
    assert_eq!(stopped["stopped"], json!(true), "{stopped}");
    assert_eq!(pid_of(&stopped), pid);
    assert!(!lock_held(&home.lock_path()).unwrap());

    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["running"], json!(false), "{status}");
    assert!(
        !home.sock_path().exists(),
        "host.sock outlived a graceful shutdown"
    );
    assert_eq!(
        read_lock_info(&home.lock_path()),
        None,
        "host.lock still names a stopped host"
    );
    // A second shutdown has nothing to stop and says so.
    let twice = home.ok(&["host.shutdown"]).await;
    assert_eq!(twice["stopped"], json!(false), "{twice}");
}

#[tokio::test]
async fn help_and_version() {
    let home = Home::new();

    let help = home.command(&["--help"]).output().await.unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    for spec in COMMANDS {
        assert!(
            text.contains(spec.name),
            "--help does not mention {}:\n{text}",
            spec.name
        );
    }
    assert!(text.contains("AGENT_HOST_HOME"), "{text}");

    let version = home.command(&["--version"]).output().await.unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8(version.stdout).unwrap(),
        format!("agent-host {}\n", env!("CARGO_PKG_VERSION"))
    );

    let data = home.ok(&["version"]).await;
    assert_eq!(data["version"], json!(agent_host::VERSION));
    assert_eq!(data["version"], json!(env!("CARGO_PKG_VERSION")));
    assert!(data["schema_version"].is_number(), "{data}");

    let agents = home.ok(&["agent.list"]).await;
    let names: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["agent_type"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"claude"), "{agents}");

    // Local commands need no host and leave no trace of one.
    assert!(!home.home.exists(), "a local command created the home");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_one_wins() {
    for round in 0..3 {
        let home = Home::new();
        let spawn = || home.command(&["host.start"]).spawn().unwrap();
        let (a, b) = (spawn(), spawn());
        let (a, b) = tokio::time::timeout(CLI_TIMEOUT, async {
            tokio::join!(a.wait_with_output(), b.wait_with_output())
        })
        .await
        .unwrap_or_else(|_| panic!("round {round}: racing host.start did not finish"));
        let (a, b) = (a.unwrap(), b.unwrap());
        let args = ["host.start"];
        let a = Out::check(&args, a.status, &a.stdout, &a.stderr);
        let b = Out::check(&args, b.status, &b.stdout, &b.stderr);
        let (winner, loser) = match (a.code, b.code) {
            (0, _) => (a, b),
            (_, 0) => (b, a),
            _ => panic!(
                "round {round}: nobody won: {} / {}",
                a.describe(),
                b.describe()
            ),
        };
        assert_eq!(
            loser.code,
            2001,
            "round {round}: winner {}, loser {}",
            winner.describe(),
            loser.describe()
        );
        let pid = pid_of(&winner.data());
        assert_eq!(
            pid_of(&loser.data()),
            pid,
            "round {round}: loser names another pid: {}",
            loser.describe()
        );

        let status = home.ok(&["host.status"]).await;
        assert_eq!(pid_of(&status), pid, "round {round}");
        assert_eq!(read_lock_info(&home.lock_path()).unwrap().pid, pid);
        home.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_start_takes_over() {
    let home = Home::new();
    let first = home.start().await;

    signal(first, Signal::SIGKILL);
    assert!(
        wait_released(&home.lock_path(), RELEASE_TIMEOUT).await,
        "the lock was not released after SIGKILL"
    );
    // A killed host cleans nothing up: its socket file and its lock contents stay behind.
    assert!(
        home.sock_path().exists(),
        "a SIGKILLed host cannot have removed host.sock"
    );
    assert_eq!(read_lock_info(&home.lock_path()).unwrap().pid, first);

    // Dead host, stale files: status reads the lock, not the pid, and says not running.
    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["running"], json!(false), "{status}");
    let list = home.cli(&["session.list"]).await;
    assert_eq!(list.code, 2002, "{}", list.describe());

    let second = home.start().await;
    assert_ne!(second, first);
    assert_eq!(read_lock_info(&home.lock_path()).unwrap().pid, second);
    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["running"], json!(true), "{status}");
    assert_eq!(pid_of(&status), second);
    home.ok(&["session.list"]).await;
    home.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_graceful() {
    let home = Home::new();
    let work = tempfile::tempdir().unwrap();
    let first = home.start().await;
    let created = home
        .ok(&[&create_envelope(&work.path().display().to_string())])
        .await;
    let id = created["session_id"].as_str().unwrap().to_owned();

    signal(first, Signal::SIGTERM);
    assert!(
        wait_released(&home.lock_path(), RELEASE_TIMEOUT).await,
        "the lock was not released after SIGTERM"
    );
    assert!(
        !home.sock_path().exists(),
        "host.sock outlived a graceful SIGTERM"
    );
    match std::fs::read_to_string(home.lock_path()) {
        Ok(text) => assert_eq!(text, "", "host.lock was not emptied"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
    }
    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["running"], json!(false), "{status}");

    let second = home.start().await;
    assert_ne!(second, first);
    let ids = session_ids(&home.ok(&["session.list"]).await);
    assert_eq!(ids, vec![id.clone()]);
    let row = home
        .ok(&["session.get", &json!({"session_id": id}).to_string()])
        .await;
    assert_eq!(row["session_id"], json!(id));
    home.shutdown().await;
}

#[tokio::test]
async fn no_host() {
    let home = Home::new();

    let list = home.cli(&["session.list"]).await;
    assert_eq!(list.code, 2002, "{}", list.describe());
    assert!(!list.success);

    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["running"], json!(false), "{status}");

    let stop = home.ok(&["host.shutdown"]).await;
    assert_eq!(stop["stopped"], json!(false), "{stop}");
    assert_eq!(stop["running"], json!(false), "{stop}");

    // None of that started a host behind our back.
    assert!(!home.sock_path().exists());
    assert!(!matches!(lock_held(&home.lock_path()), Ok(true)));
}

#[tokio::test]
async fn argv_errors() {
    let home = Home::new();
    let cases: &[(&[&str], i64)] = &[
        (&["session.get", "not json"], 1001),
        (&["nope.cmd"], 1004),
        (&["{not json"], 1001),
        (&[r#"{"command":"session.list"}"#, "{}"], 1002),
        (&[r#"{"command":7}"#], 1002),
        (&[r#"{"params":{}}"#], 1003),
        (&["session.get", "{}"], 1005),
        (&["session.list", "[]"], 1005),
        (&["session.get", r#"{"session_id":"x","extra":1}"#], 1005),
        (&[r#"["host.status"]"#], 1002),
        (&[r#""host.status""#], 1002),
        // A usage error is still one JSON line, not clap's text.
        (&["session.get", "{}", "extra-arg"], 1002),
    ];
    for (args, code) in cases {
        let out = home.cli(args).await;
        assert_eq!(out.code, *code, "agent-host {args:?}: {}", out.describe());
        assert!(!out.success);
    }
    // Refused before any routing: no home was needed or made.
    assert!(!home.home.exists());
}

/// Runs `bin args` (stdin `input`) on `home`; stdout and whether it exited 0.
async fn run_bin(bin: &Path, home: &Home, args: &[&str], input: &str) -> (String, bool) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(bin)
        .args(args)
        .env("AGENT_HOST_HOME", &home.home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(CLI_TIMEOUT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    (
        String::from_utf8(output.stdout).unwrap(),
        output.status.success(),
    )
}

/// Issue 19: `agent-host` is a small front that answers `version`, the `ipc` commands and a
/// live host's `host.status` itself and runs `agent-hostd` for the rest. What it prints must be
/// what the full binary prints, byte for byte, for both kinds; a command it hands on keeps
/// what it read from standard input; alone, it says what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_answers_as_the_full_binary_does_and_hands_it_the_rest() {
    let home = Home::new();
    let (front, full) = (Path::new(BIN), Path::new(FULL_BIN));
    let alike = |args: &'static [&'static str], input: &'static str| {
        let home = &home;
        async move {
            let a = run_bin(front, home, args, input).await;
            let b = run_bin(full, home, args, input).await;
            assert_eq!(a, b, "agent-host and agent-hostd differ on {args:?}");
            assert!(
                a.0.ends_with('\n') && a.0.matches('\n').count() == 1,
                "{args:?}: {a:?}"
            );
            a
        }
    };
    // No host: answered by the front (version, an ipc command's refusal), handed on (host.status
    // reads the lock file), refused before routing (argv errors), parsed by the full binary.
    alike(&["version"], "").await;
    assert!(!alike(&["session.list"], "").await.1);
    assert!(
        alike(&["host.status"], "")
            .await
            .0
            .contains(r#""running":false"#)
    );
    alike(&["nope.cmd"], "").await;
    alike(&["session.get", "{}"], "").await;
    alike(&["session.get", "{}", "extra"], "").await;
    alike(&["--version"], "").await;
    alike(&["follow", "--print"], "").await;
    alike(&["-"], r#"{"command":"version"}"#).await;
    assert!(!home.home.exists(), "a local command created the home");

    let pid = home.start().await;
    let listed = alike(&["session.list"], "").await;
    assert!(listed.1, "{listed:?}");
    alike(&["session.get", r#"{"session_id":"nope"}"#], "").await;
    alike(&["session.list", "-"], r#"{"limit":1}"#).await;
    // host.status answered by the front: the same host.
    let (status, ok) = run_bin(front, &home, &["host.status"], "").await;
    assert!(ok, "{status}");
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(pid_of(&status["data"]), pid, "{status}");
    // A command the front hands on, with its params read from standard input: `host.start`
    // with a host running is refused by the full binary, which got the params.
    let again = alike(&["host.start", "-"], r#"{"foreground":false}"#).await;
    assert!(again.0.contains("already_running"), "{again:?}");
    let bad = alike(&["host.start", "-"], r#"{"foreground":"yes"}"#).await;
    assert!(bad.0.contains("invalid_params"), "{bad:?}");

    // The front alone: what it answers still works, the rest names the binary it lacks.
    let alone = tempfile::tempdir().unwrap();
    let lonely = alone.path().join("agent-host");
    std::fs::copy(front, &lonely).unwrap();
    let (version, ok) = run_bin(&lonely, &home, &["version"], "").await;
    assert!(ok && version.contains(agent_host::VERSION), "{version}");
    let (listed_alone, ok) = run_bin(&lonely, &home, &["session.list"], "").await;
    assert!(ok, "{listed_alone}");
    assert_eq!(listed_alone, listed.0);
    for args in [&["host.start"][..], &["--help"], &["follow"]] {
        let (out, ok) = run_bin(&lonely, &home, args, "").await;
        assert!(!ok, "{args:?}: {out}");
        let reply: Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(
            reply["data"]["error"],
            json!("install_incomplete"),
            "{args:?}: {reply}"
        );
        let message = reply["message"].as_str().unwrap();
        assert!(message.contains("agent-hostd"), "{args:?}: {message}");
    }

    // The front links a small part of the crate: that is what makes it fast to start (release:
    // 2.1 MB against 24 MB; a debug build keeps more of both, about 1 to 3).
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(
        size(front) * 2 < size(full),
        "the front is {} bytes, the full binary {}: something heavy is linked into the front",
        size(front),
        size(full)
    );
    home.shutdown().await;
}

/// Defect: the CLI could not send a prompt over ~128 KiB (the kernel's limit on one argument).
/// `-` reads the params (or, in place of the envelope, the whole envelope) from stdin.
#[tokio::test]
async fn params_from_stdin_carry_a_prompt_larger_than_an_argument() {
    use tokio::io::AsyncWriteExt;
    let home = Home::new();
    let work = tempfile::tempdir().unwrap();
    home.start().await;
    let created = home
        .ok(&[&create_envelope(&work.path().display().to_string())])
        .await;
    let id = created["session_id"].as_str().unwrap().to_owned();
    let text = "long prompt ".repeat(200 * 1024 / 12);
    let params = json!({"session_id": id, "text": text}).to_string();
    assert!(params.len() > 200 * 1024);
    // As an argument it cannot even be passed to the program.
    let too_big = home.command(&["session.send", &params]).output().await;
    assert_eq!(
        too_big.err().and_then(|e| e.raw_os_error()),
        Some(libc::E2BIG),
        "the kernel took a {} byte argument",
        params.len()
    );
    let stdin_call = |args: &[&str], input: String| {
        let mut cmd = home.command(args);
        cmd.stdin(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        async move {
            stdin.write_all(input.as_bytes()).await.unwrap();
            drop(stdin);
            let output = tokio::time::timeout(CLI_TIMEOUT, child.wait_with_output())
                .await
                .unwrap()
                .unwrap();
            Out::check(&["(stdin)"], output.status, &output.stdout, &output.stderr)
        }
    };
    let sent = stdin_call(&["session.send", "-"], params).await;
    assert_eq!(sent.code, 0, "{}", sent.describe());
    let run = sent.data()["run_id"].as_str().unwrap().to_owned();
    // The whole prompt is what the run's user.text holds (published at dispatch).
    let deadline = std::time::Instant::now() + CLI_TIMEOUT;
    loop {
        let history = home
            .ok(&["session.history", &json!({"session_id": id}).to_string()])
            .await;
        let user = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["run_id"] == json!(run) && e["kind"] == "user.text")
            .cloned();
        if let Some(user) = user {
            assert_eq!(user["event"]["text"], json!(text));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no user.text: {history}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A whole envelope from stdin, and the refusals.
    let status = stdin_call(&["-"], r#"{"command":"host.status"}"#.to_owned()).await;
    assert_eq!(status.code, 0, "{}", status.describe());
    assert_eq!(status.data()["store"]["state"], json!("ok"));
    let empty = stdin_call(&["session.send", "-"], String::new()).await;
    assert_eq!(empty.code, i64::from(ErrorCode::EmptyRequest.number()));
    let huge = stdin_call(&["session.list", "-"], " ".repeat(MAX_REQUEST_BYTES + 10)).await;
    assert_eq!(huge.code, i64::from(ErrorCode::RequestTooLarge.number()));
    home.shutdown().await;
}

/// Defect: `host.relay.set` took any URL (retried for ever) and logged it raw, so a newline in
/// it forged a log line. Now it is checked as the relay client checks a configuration, and
/// nothing untrusted reaches the log unescaped.
#[tokio::test]
async fn host_relay_set_checks_the_url_and_the_log_cannot_be_forged() {
    let home = Home::new();
    home.start().await;
    for url in [
        "ws://203.0.113.1/relay",
        "\u{0}://",
        "http://127.0.0.1:1/",
        "wss://",
        "wss://relay.example\n2026-12-01T00:00:00Z ERROR forged line",
    ] {
        let params = json!({"url": url, "token": "t"}).to_string();
        let out = home.cli(&["host.relay.set", &params]).await;
        assert_eq!(
            out.code,
            i64::from(ErrorCode::InvalidParams.number()),
            "{url:?}: {}",
            out.describe()
        );
    }
    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["relay"]["state"], json!("disabled"), "{status}");
    let off = home.ok(&["host.relay.set", "{}"]).await;
    assert_eq!(off["relay"]["state"], json!("disabled"));
    home.shutdown().await;
    let log = std::fs::read_to_string(home.home.join("logs/host.log")).unwrap();
    assert!(!log.contains("forged line"), "{log}");
    assert!(!log.contains('\u{1b}'), "a raw ESC reached the log");
    for line in log.lines() {
        assert!(
            line.starts_with("20") || line.trim().is_empty(),
            "a line that is not a log record: {line:?}"
        );
    }
}

/// An ACP agent (a shell script registered in `config.toml`) that answers `initialize` and
/// fails `session/new`, after a stderr line with a carriage return and ESC in it.
const HOSTILE_AGENT: &str = r#"#!/bin/sh
while read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')
  case "$line" in
    *'"method":"initialize"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":1,"agentCapabilities":{}}}\n' "$id";;
    *'"method":"session/new"'*)
      printf 'starting\r1999-01-01T00:00:00Z ERROR forged by stderr \033[2J\n' >&2
      printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"Internal error"}}\n' "$id";;
  esac
done
"#;

/// Text that would forge a record of its own and drive the terminal of whoever reads the log.
const FORGED: &str = "\n1999-01-01T00:00:00Z ERROR forged line \u{1b}[2J\u{1b}]0;pwned\u{7}";

/// Poll a run's `run.end` out of its session's history (bounded).
async fn run_end_of(home: &Home, session_id: &str, run_id: &str) -> Value {
    let deadline = std::time::Instant::now() + CLI_TIMEOUT;
    loop {
        let history = home
            .ok(&[
                "session.history",
                &json!({"session_id": session_id}).to_string(),
            ])
            .await;
        let end = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["run_id"] == json!(run_id) && e["kind"] == "run.end")
            .cloned();
        if let Some(end) = end {
            return end;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no run.end: {history}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The log-injection check through the real host, with text from outside that the host does
/// log: a client's `cwd` (a directory named with a newline starting a forged record and ESC
/// sequences that clear a terminal and set its title; gone when the prompt is sent, so the
/// failed run is logged with it) and an agent's stderr (a carriage return and ESC, logged at
/// `debug`). The hostile text reaches `logs/host.log` escaped (`\n`, `\x1b`), yet no line of
/// the log is a forged record and no raw control character (ESC, BEL, CR) is in it.
#[tokio::test]
async fn hostile_text_from_a_client_or_an_agent_cannot_forge_a_log_line() {
    use std::os::unix::fs::DirBuilderExt;
    let home = Home::new();
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("hostile-agent.sh");
    std::fs::write(&script, HOSTILE_AGENT).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&home.home)
        .unwrap();
    std::fs::write(
        home.home.join("config.toml"),
        format!(
            "log_level = \"debug\"\n[agents.hostile]\ncommand = [\"{}\"]\nprotocol = \"acp\"\n",
            script.display()
        ),
    )
    .unwrap();
    let hostile_dir = work.path().join(format!("w{FORGED}"));
    std::fs::create_dir(&hostile_dir).unwrap();
    home.start().await;
    let mut ends = Vec::new();
    for cwd in [work.path(), hostile_dir.as_path()] {
        let created = home
            .ok(&[
                "session.create",
                &json!({"agent_type": "hostile", "cwd": cwd.display().to_string()}).to_string(),
            ])
            .await;
        let id = created["session_id"].as_str().unwrap().to_owned();
        if cwd == hostile_dir {
            std::fs::remove_dir(&hostile_dir).unwrap();
        }
        let sent = home
            .ok(&[
                "session.send",
                &json!({"session_id": id, "text": "hello"}).to_string(),
            ])
            .await;
        let run = sent["run_id"].as_str().unwrap().to_owned();
        ends.push(run_end_of(&home, &id, &run).await);
    }
    for end in &ends {
        assert_eq!(end["event"]["state"], json!("failed"), "{end}");
    }
    home.shutdown().await;
    let log = std::fs::read_to_string(home.home.join("logs/host.log")).unwrap();
    // The hostile text did reach the log, escaped: not a check that passes because nothing
    // was logged.
    let escaped = r"\n1999-01-01T00:00:00Z ERROR forged line \x1b[2J\x1b]0;pwned\x07";
    assert!(
        log.contains(escaped),
        "the hostile cwd was not logged: {log}"
    );
    assert!(
        log.contains(r"starting\r1999-01-01T00:00:00Z ERROR forged by stderr \x1b[2J"),
        "the agent's stderr was not logged: {log}"
    );
    for forbidden in ['\u{1b}', '\u{7}', '\r'] {
        assert!(
            !log.contains(forbidden),
            "a raw {forbidden:?} reached the log"
        );
    }
    for line in log.lines() {
        assert!(
            line.starts_with("20") && !line.starts_with("1999-"),
            "a line that is not one of the host's records: {line:?}"
        );
    }
}

/// Defect: with 8 KiB of garbage in the middle of `host.db`, `host.start` answered 0 and a
/// prompt was appended to the broken file. Now the start is refused with `store_corrupt`
/// naming the file, and the file is not written.
#[tokio::test]
async fn a_corrupt_database_is_refused_at_start_and_never_written() {
    use std::io::{Seek, SeekFrom, Write};
    let home = Home::new();
    home.start().await;
    home.shutdown().await;
    {
        // A store of some size, as months of use leave it.
        let mut db = rusqlite::Connection::open(home.db_path()).unwrap();
        let tx = db.transaction().unwrap();
        for i in 0..5000 {
            tx.execute(
                "INSERT INTO messages (message_id, session_id, run_id, kind, payload, created_at) \
                 VALUES (?1, 's', 'r', 'text.end', ?2, 0)",
                rusqlite::params![format!("m{i}"), "p".repeat(300)],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    let len = std::fs::metadata(home.db_path()).unwrap().len();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(home.db_path())
        .unwrap();
    file.seek(SeekFrom::Start(len / 2)).unwrap();
    file.write_all(&[0x5a; 8192]).unwrap();
    drop(file);
    let before = std::fs::read(home.db_path()).unwrap();

    let refused = home.cli(&["host.start"]).await;
    assert_eq!(
        refused.code,
        i64::from(ErrorCode::StoreCorrupt.number()),
        "{}",
        refused.describe()
    );
    assert_eq!(
        refused.data()["path"],
        json!(home.db_path().display().to_string())
    );
    assert!(
        refused.reply["message"]
            .as_str()
            .unwrap()
            .contains("move the file aside"),
        "{}",
        refused.describe()
    );
    assert!(
        std::fs::read(home.db_path()).unwrap() == before,
        "the corrupt file was written"
    );
    let status = home.ok(&["host.status"]).await;
    assert_eq!(status["running"], json!(false), "{status}");
}

/// `agent-host open [session_id] --print` run once: its stdout must be exactly one line.
async fn open_print(home: &Home, args: &[&str]) -> (String, String) {
    let mut all = vec!["open"];
    all.extend_from_slice(args);
    all.push("--print");
    let output = tokio::time::timeout(CLI_TIMEOUT, home.command(&all).output())
        .await
        .unwrap_or_else(|_| panic!("agent-host {all:?} did not finish within {CLI_TIMEOUT:?}"))
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{all:?}: {stdout} (stderr: {stderr})"
    );
    assert!(
        stdout.ends_with('\n') && stdout.matches('\n').count() == 1,
        "{all:?}: stdout is not exactly one line: {stdout:?}"
    );
    (stdout.trim_end().to_owned(), stderr)
}

/// The `(key, value)` pairs of a URL's fragment, in order.
fn fragment(url: &str) -> Vec<(String, String)> {
    let (_, fragment) = url
        .split_once('#')
        .unwrap_or_else(|| panic!("no fragment: {url}"));
    fragment
        .split('&')
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("{pair} in {url}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// The token of an `open` URL opens the host's WebSocket, full-scope whether or not the URL
/// names a session.
async fn connect_with_token(port: u64, token: &str) -> agent_host::ws::client::WsClient {
    use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
    let hello = pb::Hello {
        client_name: "cli test".to_owned(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    let endpoint = format!("ws://127.0.0.1:{port}/subscribe");
    let (ws, _resp) = tokio::time::timeout(
        CLI_TIMEOUT,
        agent_host::ws::client::connect(&endpoint, token, hello),
    )
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("the token of the URL does not open {endpoint}: {e}"));
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_prints_a_url_whose_token_opens_the_websocket() {
    let home = Home::new();
    let work = tempfile::tempdir().unwrap();
    let work_dir = work.path().canonicalize().unwrap();
    home.start().await;
    let port = home.ok(&["host.status"]).await["ws_port"]
        .as_u64()
        .expect("host.status has a ws_port");
    let created = home
        .ok(&[&create_envelope(&work_dir.display().to_string())])
        .await;
    let id = created["session_id"].as_str().unwrap().to_owned();

    let base = format!("http://127.0.0.1:{port}/#token=");
    let base64url = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };

    // No session: the session list.
    let (url, stderr) = open_print(&home, &[]).await;
    assert!(url.starts_with(&base), "{url}");
    let pairs = fragment(&url);
    assert_eq!(pairs.len(), 1, "{url}");
    assert_eq!(pairs[0].0, "token");
    let token = pairs[0].1.clone();
    assert!(base64url(&token), "{url}");
    assert!(stderr.contains("60 s"), "{stderr}");
    assert!(stderr.contains("renews its own grant"), "{stderr}");
    assert!(
        !stderr.contains(&token),
        "the token leaked to stderr: {stderr}"
    );
    assert!(
        !stderr.contains("could not open a browser"),
        "--print tried a browser: {stderr}"
    );

    // A session: the same shape, the id after the token.
    let (with_session, stderr) = open_print(&home, &[&id]).await;
    assert!(with_session.starts_with(&base), "{with_session}");
    let pairs = fragment(&with_session);
    assert_eq!(pairs.len(), 2, "{with_session}");
    assert_eq!(pairs[0].0, "token");
    assert!(base64url(&pairs[0].1), "{with_session}");
    assert_ne!(pairs[0].1, token, "each open mints its own grant");
    assert_eq!(pairs[1], ("session".to_owned(), id.clone()));
    assert_eq!(
        with_session,
        format!("{base}{}&session={id}", pairs[0].1),
        "{stderr}"
    );

    // Both tokens open the WebSocket, and either grant may do everything: the session in the
    // URL only picks the page's first view.
    for token in [token, pairs[0].1.clone()] {
        let mut ws = connect_with_token(port, &token).await;
        let list = tokio::time::timeout(CLI_TIMEOUT, ws.request("session.list", json!({})))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(list.code, 0, "{}", list.to_line());
        assert!(session_ids(&list.data).contains(&id), "{}", list.to_line());
        let made = tokio::time::timeout(
            CLI_TIMEOUT,
            ws.request(
                "session.create",
                json!({"agent_type": "claude", "cwd": work_dir.display().to_string()}),
            ),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            made.code,
            0,
            "a full-scope grant creates: {}",
            made.to_line()
        );
        ws.close().await;
    }
    home.shutdown().await;

    // The host gone: the usual one-line refusal, and a failing exit.
    let gone = home.cli(&["open", "--print"]).await;
    assert_eq!(gone.code, 2002, "{}", gone.describe());
    assert_eq!(gone.data()["error"], json!("host_not_running"));
    assert!(!gone.success);
    let gone = home.cli(&["open", &id, "--print"]).await;
    assert_eq!(gone.code, 2002, "{}", gone.describe());
}

#[tokio::test]
async fn open_without_a_host_and_print_elsewhere_are_refused() {
    let home = Home::new();
    let out = home.cli(&["open", "--print"]).await;
    assert_eq!(out.code, 2002, "{}", out.describe());
    assert_eq!(out.data()["error"], json!("host_not_running"));
    assert!(!out.success);
    // Without --print it fails the same way, before any browser is tried.
    let out = home.cli(&["open"]).await;
    assert_eq!(out.code, 2002, "{}", out.describe());
    assert!(!out.stderr.contains("browser"), "{}", out.stderr);
    // --print belongs to open.
    let out = home.cli(&["session.list", "--print"]).await;
    assert_eq!(out.code, 1002, "{}", out.describe());
    assert!(out.reply["message"].as_str().unwrap().contains("--print"));
}
