//! `agent-host doctor` (issue 20, acceptance 3): the real binary against a real host in a
//! private home — healthy, with a 0644 socket, with an agent pointed at a binary that is not
//! there, and on a corrupt database — and each check's verdict asserted.
//!
//! The agents are stand-ins on a `PATH` of the test's own: a `claude` that says the version
//! `agents/package.json` pins (ok), a `codex` that says another (warn), and no other family
//! (not installed: warn). A Codex `config.toml` names a provider's `env_key`, so the
//! credentials check has a variable to find (and must never print its value).
//!
//! Every wait is bounded: a command is killed and the test fails after [`CLI_TIMEOUT`].

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use crate::common::reap;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use agent_host::protocol::envelope::ErrorCode;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const CLI_TIMEOUT: Duration = Duration::from_secs(60);
/// The value of the provider key: it must never appear in doctor's output.
const SECRET: &str = "sk-doctor-never-shown-4711";

fn run(mut command: Command) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(CLI_TIMEOUT) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _gone = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{command:?} did not finish within {CLI_TIMEOUT:?}");
        }
    }
}

/// The version `agents/package.json` pins for a package.
fn pin(package: &str) -> String {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/package.json"))
            .unwrap();
    let pins: Value = serde_json::from_str(&text).unwrap();
    pins["dependencies"][package].as_str().unwrap().to_owned()
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A private home, stand-in agents on the test's own `PATH`, and a Codex home whose
/// `config.toml` names `DOCTOR_TEST_KEY`. A host still holding the lock is killed by its pid
/// when dropped.
struct Home {
    dir: tempfile::TempDir,
    /// Whether the provider key is in the environment.
    with_key: bool,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        script(
            &bin.join("claude"),
            &format!("echo '{} (Claude Code)'", pin("@anthropic-ai/claude-code")),
        );
        script(&bin.join("codex"), "echo 'codex-cli 0.0.1'");
        let codex_home = dir.path().join("codex");
        std::fs::create_dir(&codex_home).unwrap();
        std::fs::write(
            codex_home.join("config.toml"),
            "model_provider = \"mock\"\n\n[model_providers.mock]\nname = \"mock\"\n\
             base_url = \"http://127.0.0.1:9/v1\"\nenv_key = \"DOCTOR_TEST_KEY\"\n",
        )
        .unwrap();
        Home {
            dir,
            with_key: true,
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("AGENT_HOST_HOME", self.home())
            .env("CODEX_HOME", self.dir.path().join("codex"))
            .env("PATH", self.dir.path().join("bin"));
        if self.with_key {
            cmd.env("DOCTOR_TEST_KEY", SECRET);
        }
        cmd
    }

    /// Run the CLI: one JSON reply line, exit status 0 exactly when `code` is 0.
    fn cli(&self, args: &[&str]) -> Value {
        let out = run(self.command(args));
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stdout.matches('\n').count(),
            1,
            "{args:?}: not one line: {stdout:?} (stderr: {stderr})"
        );
        assert!(
            !stdout.contains(SECRET) && !stderr.contains(SECRET),
            "{args:?} printed the key's value: {stdout} {stderr}"
        );
        let reply: Value = serde_json::from_str(stdout.trim_end()).unwrap();
        assert_eq!(
            out.status.success(),
            reply["code"] == json!(0),
            "{args:?}: exit status {} for {reply}",
            out.status
        );
        reply
    }

    fn ok(&self, args: &[&str]) -> Value {
        let reply = self.cli(args);
        assert_eq!(reply["code"], json!(0), "{args:?}: {reply}");
        reply["data"].clone()
    }

    fn start(&self) {
        let data = self.ok(&["host.start"]);
        assert_eq!(data["running"], json!(true), "{data}");
    }

    fn shutdown(&self) {
        let data = self.ok(&["host.shutdown"]);
        assert_eq!(data["stopped"], json!(true), "{data}");
    }

    /// `doctor`'s reply, checked for its shape: `ok` is false exactly when a check failed,
    /// and exactly then the code is `checks_failed`.
    fn doctor(&self) -> Doctor {
        let reply = self.cli(&["doctor"]);
        let checks = reply["data"]["checks"].as_array().unwrap().clone();
        let failed = checks.iter().any(|c| c["verdict"] == json!("fail"));
        assert_eq!(reply["data"]["ok"], json!(!failed), "{reply}");
        let code = if failed {
            ErrorCode::ChecksFailed.number()
        } else {
            0
        };
        assert_eq!(reply["code"], json!(code), "{reply}");
        for c in &checks {
            let verdict = c["verdict"].as_str().unwrap();
            assert!(["ok", "warn", "fail"].contains(&verdict), "{c}");
            assert!(c["detail"].is_string(), "{c}");
            if verdict == "fail" {
                assert!(c["fix"].as_str().is_some_and(|f| !f.is_empty()), "{c}");
            }
        }
        Doctor { reply, checks }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        reap::kill_lock_holder(&self.home().join("host.lock"));
    }
}

struct Doctor {
    reply: Value,
    checks: Vec<Value>,
}

impl Doctor {
    fn check(&self, name: &str) -> &Value {
        self.checks
            .iter()
            .find(|c| c["name"] == json!(name))
            .unwrap_or_else(|| panic!("no check {name:?} in {}", self.reply))
    }

    fn verdict(&self, name: &str) -> &str {
        self.check(name)["verdict"].as_str().unwrap()
    }

    /// Every check but `except` has the verdict a healthy home with a live host has.
    fn healthy_but(&self, except: &[&str]) {
        let expected = [
            ("home", "ok"),
            ("config", "ok"),
            ("host.sock", "ok"),
            ("ws.sock", "ok"),
            ("host.db", "ok"),
            ("host", "ok"),
            ("store", "ok"),
            ("agent claude", "ok"),
            ("agent codex", "warn"),
            ("agent acp", "warn"),
            ("agent gemini", "warn"),
            ("agent gemini-acp", "warn"),
            ("agent opencode", "warn"),
            ("credentials codex", "ok"),
            ("relay", "ok"),
            ("fleet", "ok"),
        ];
        for (name, verdict) in expected {
            if !except.contains(&name) {
                assert_eq!(self.verdict(name), verdict, "{name}: {}", self.check(name));
            }
        }
        // Free space is the machine's: never a failure on a machine that runs these tests.
        assert_ne!(self.verdict("disk"), "fail", "{}", self.check("disk"));
        assert!(
            self.check("disk")["detail"]
                .as_str()
                .unwrap()
                .contains("free"),
            "{}",
            self.check("disk")
        );
    }
}

#[test]
fn a_healthy_home_passes_every_check() {
    let home = Home::new();
    home.start();
    let report = home.doctor();
    assert_eq!(report.reply["code"], json!(0), "{}", report.reply);
    report.healthy_but(&[]);
    let claude = report.check("agent claude");
    assert!(
        claude["detail"]
            .as_str()
            .unwrap()
            .contains(&pin("@anthropic-ai/claude-code")),
        "{claude}"
    );
    let codex = report.check("agent codex");
    assert!(
        codex["detail"].as_str().unwrap().contains("0.0.1")
            && codex["fix"]
                .as_str()
                .unwrap()
                .contains(&format!("@openai/codex@{}", pin("@openai/codex"))),
        "{codex}"
    );
    let credentials = report.check("credentials codex");
    assert!(
        credentials["detail"]
            .as_str()
            .unwrap()
            .contains("DOCTOR_TEST_KEY (environment)"),
        "{credentials}"
    );
    home.shutdown();

    // No host: said, not failed; the key missing: named, with where it is named.
    let mut home = home;
    home.with_key = false;
    let report = home.doctor();
    assert_eq!(report.reply["code"], json!(0), "{}", report.reply);
    report.healthy_but(&["host", "host.sock", "credentials codex"]);
    assert_eq!(report.verdict("host"), "warn");
    assert_eq!(report.verdict("host.sock"), "ok");
    let credentials = report.check("credentials codex");
    assert_eq!(credentials["verdict"], json!("warn"), "{credentials}");
    let detail = credentials["detail"].as_str().unwrap();
    assert!(
        detail.contains("DOCTOR_TEST_KEY") && detail.contains("model_providers.mock"),
        "{credentials}"
    );
}

#[test]
fn a_socket_others_can_open_fails_with_a_chmod() {
    let home = Home::new();
    home.start();
    let socket = home.home().join("host.sock");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o644)).unwrap();
    let report = home.doctor();
    let check = report.check("host.sock");
    assert_eq!(check["verdict"], json!("fail"), "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("0644"),
        "{check}"
    );
    assert_eq!(
        check["fix"],
        json!(format!("chmod 600 {}", socket.display()))
    );
    assert!(
        report.reply["message"]
            .as_str()
            .unwrap()
            .contains("host.sock"),
        "{}",
        report.reply
    );
    report.healthy_but(&["host.sock"]);
    // Done as told, it passes.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    let report = home.doctor();
    assert_eq!(report.reply["code"], json!(0), "{}", report.reply);
    // The WebSocket protocol's socket the same way.
    let ws_socket = home.home().join("ws.sock");
    std::fs::set_permissions(&ws_socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let report = home.doctor();
    let check = report.check("ws.sock");
    assert_eq!(check["verdict"], json!("fail"), "{check}");
    assert_eq!(
        check["fix"],
        json!(format!("chmod 600 {}", ws_socket.display()))
    );
    report.healthy_but(&["ws.sock"]);
    std::fs::set_permissions(&ws_socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    let report = home.doctor();
    assert_eq!(report.reply["code"], json!(0), "{}", report.reply);
    home.shutdown();
}

#[test]
fn an_agent_pointed_at_a_missing_binary_fails() {
    let home = Home::new();
    std::fs::create_dir_all(home.home()).unwrap();
    std::fs::set_permissions(home.home(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        home.home().join("config.toml"),
        "[agents.claude]\nbinary = \"/nonexistent/claude\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        home.home().join("config.toml"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    home.start();
    // As the running host finds it, and as this process does without a host.
    for live in [true, false] {
        let report = home.doctor();
        let check = report.check("agent claude");
        assert_eq!(check["verdict"], json!("fail"), "live {live}: {check}");
        assert!(
            check["detail"]
                .as_str()
                .unwrap()
                .contains("/nonexistent/claude"),
            "{check}"
        );
        assert!(
            check["fix"].as_str().unwrap().contains("[agents.claude]"),
            "{check}"
        );
        assert_eq!(
            report.reply["code"],
            json!(ErrorCode::ChecksFailed.number())
        );
        if live {
            report.healthy_but(&["agent claude"]);
            home.shutdown();
        } else {
            report.healthy_but(&["agent claude", "host"]);
            assert_eq!(report.verdict("host"), "warn");
        }
    }
}

#[test]
fn a_corrupt_database_fails_the_store_check_and_is_not_written() {
    use std::io::{Seek, SeekFrom, Write};
    let home = Home::new();
    home.start();
    home.shutdown();
    let db = home.home().join("host.db");
    {
        // A store of some size, as months of use leave it (as tests/suite/cli.rs makes one).
        let mut conn = rusqlite::Connection::open(&db).unwrap();
        let tx = conn.transaction().unwrap();
        for i in 0..5000 {
            tx.execute(
                "INSERT INTO messages (message_id, session_id, run_id, kind, payload, created_at) \
                 VALUES (?1, 's', 'r', 'text.end', ?2, 0)",
                rusqlite::params![format!("m{i}"), "p".repeat(300)],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    let healthy = home.doctor();
    assert_eq!(healthy.verdict("store"), "ok", "{}", healthy.check("store"));
    let len = std::fs::metadata(&db).unwrap().len();
    let mut file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    file.seek(SeekFrom::Start(len / 2)).unwrap();
    file.write_all(&[0x5a; 8192]).unwrap();
    drop(file);
    let before = std::fs::read(&db).unwrap();

    let report = home.doctor();
    let store = report.check("store");
    assert_eq!(store["verdict"], json!("fail"), "{store}");
    assert!(
        store["detail"].as_str().unwrap().contains("quick_check"),
        "{store}"
    );
    assert!(store["fix"].as_str().unwrap().contains("move"), "{store}");
    assert_eq!(
        report.reply["code"],
        json!(ErrorCode::ChecksFailed.number())
    );
    report.healthy_but(&["store", "host", "host.sock"]);
    assert_eq!(report.verdict("host"), "warn");
    assert_eq!(report.verdict("host.db"), "ok");
    assert!(
        std::fs::read(&db).unwrap() == before,
        "doctor wrote the corrupt database"
    );
}

/// A `[fleet]` whose relay is not there: the live host's fleet has no round trip (a warning,
/// the host keeps trying); one that cannot work fails, with where to fix it, host or not.
#[test]
fn a_fleet_without_a_round_trip_warns_and_a_bad_one_fails() {
    let home = Home::new();
    std::fs::create_dir_all(home.home()).unwrap();
    std::fs::set_permissions(home.home(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}/host", closed.local_addr().unwrap());
    drop(closed);
    let config = home.home().join("config.toml");
    std::fs::write(
        &config,
        format!("[fleet]\nurls = [\"{url}\"]\ntoken = \"t\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    home.start();
    let report = home.doctor();
    let check = report.check("fleet");
    assert_eq!(check["verdict"], json!("warn"), "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("no round trip"),
        "{check}"
    );
    assert!(check["fix"].as_str().unwrap().contains("NATS"), "{check}");
    report.healthy_but(&["fleet"]);
    home.shutdown();

    std::fs::write(
        &config,
        "[fleet]\nurls = [\"ws://relay.example/host\"]\ntoken = \"t\"\n",
    )
    .unwrap();
    let report = home.doctor();
    let check = report.check("fleet");
    assert_eq!(check["verdict"], json!("fail"), "{check}");
    assert!(
        check["fix"].as_str().unwrap().contains("[fleet]"),
        "{check}"
    );
    assert_eq!(
        report.reply["code"],
        json!(ErrorCode::ChecksFailed.number())
    );
}
