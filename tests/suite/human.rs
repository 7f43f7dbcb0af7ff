//! Output for people (issue 20, acceptance 6): the real `agent-host` in a pseudo-terminal
//! prints the list-like commands as tables, and piped — or with `--json` — prints the JSON
//! envelope exactly as the JSON path does; the exit status is the same either way. Also the
//! shell completions and the man page, generated from the command line and the command table.
//!
//! Every wait is bounded: a command's output is read until the terminal closes, within
//! [`CLI_TIMEOUT`].

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use crate::common::apt;

use crate::common::reap;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use agent_host::protocol::envelope::COMMANDS;
use portable_pty::{CommandBuilder, PtySize, native_pty_system};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const FULL_BIN: &str = env!("CARGO_BIN_EXE_agent-hostd");
const CLI_TIMEOUT: Duration = Duration::from_secs(25);
const COLS: u16 = 160;

/// A private home with a running host, killed by its pid if a test fails before shutdown.
struct Home {
    _dir: tempfile::TempDir,
    home: PathBuf,
    work: PathBuf,
}

impl Home {
    fn start() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let home = Home {
            _dir: dir,
            home,
            work,
        };
        let (out, ok) = home.piped(BIN, &["host.start"]);
        assert!(ok, "host.start: {out}");
        home
    }

    /// Run a binary with stdout a pipe: its stdout and whether it exited 0.
    fn piped(&self, bin: &str, args: &[&str]) -> (String, bool) {
        let out = Command::new(bin)
            .args(args)
            .env("AGENT_HOST_HOME", &self.home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        (String::from_utf8(out.stdout).unwrap(), out.status.success())
    }

    fn ok(&self, args: &[&str]) -> Value {
        let (out, ok) = self.piped(BIN, args);
        assert!(ok, "agent-host {args:?}: {out}");
        serde_json::from_str::<Value>(out.trim_end()).unwrap()["data"].clone()
    }

    fn session(&self, agent: &str, title: Option<&str>) -> String {
        let mut params = json!({"agent_type": agent, "cwd": self.work.display().to_string()});
        if let Some(title) = title {
            params["title"] = json!(title);
        }
        let data = self.ok(&["session.create", &params.to_string()]);
        data["session_id"].as_str().unwrap().to_owned()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        reap::kill_lock_holder(&self.home.join("host.lock"));
    }
}

/// What a command wrote to its terminal (stdout and stderr both; `\r\n` read as `\n`) and
/// whether it exited 0.
fn in_terminal(home: &Path, args: &[&str]) -> (String, bool) {
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: 50,
            cols: COLS,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    let mut cmd = CommandBuilder::new(BIN);
    cmd.args(args);
    cmd.env("AGENT_HOST_HOME", home);
    cmd.env("TERM", "xterm-256color");
    let mut child = pair.slave.spawn_command(cmd).unwrap();
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut buf = [0u8; 8192];
        // Until the terminal closes: EOF, or EIO once the last writer is gone.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..n]);
        }
        let _gone = tx.send(bytes);
    });
    let status = {
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _gone = done_tx.send(child.wait().unwrap());
        });
        done_rx
            .recv_timeout(CLI_TIMEOUT)
            .unwrap_or_else(|_| panic!("agent-host {args:?} did not exit in {CLI_TIMEOUT:?}"))
    };
    // The child is gone; the master is ours to close once its output is read.
    let bytes = rx
        .recv_timeout(CLI_TIMEOUT)
        .unwrap_or_else(|_| panic!("agent-host {args:?}: its terminal never closed"));
    drop(pair.master);
    let text = String::from_utf8(bytes).unwrap().replace("\r\n", "\n");
    (text, status.success())
}

#[test]
fn session_list_is_a_table_on_a_terminal_and_the_envelope_when_piped() {
    let home = Home::start();
    let first = home.session("claude", Some("fix the failing test"));
    let second = home.session("codex", None);

    // On a terminal: a header and one row per session, newest first, and a count.
    let (table, ok) = in_terminal(&home.home, &["session.list"]);
    assert!(ok, "{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for title in [
        "SESSION",
        "AGENT",
        "STATE",
        "ACTIVE",
        "TITLE",
        "LAST MESSAGE",
    ] {
        assert!(lines[0].contains(title), "{table}");
    }
    assert!(
        lines[1].starts_with(&format!("{second}  codex ")),
        "{table}"
    );
    assert!(
        lines[2].starts_with(&format!("{first}  claude ")),
        "{table}"
    );
    assert!(lines[2].contains("fix the failing test"), "{table}");
    assert!(
        lines[1].contains("idle") && lines[1].contains("just now"),
        "{table}"
    );
    assert_eq!(lines[3], "2 sessions", "{table}");
    assert!(!table.contains('{'), "a table, not JSON: {table}");

    // Piped: the envelope line, the same bytes as the full binary's JSON path and as
    // `--json` on a terminal.
    let (piped, ok) = home.piped(BIN, &["session.list"]);
    assert!(ok, "{piped}");
    assert!(
        piped.ends_with('\n') && piped.matches('\n').count() == 1,
        "{piped:?}"
    );
    let reply: Value = serde_json::from_str(piped.trim_end()).unwrap();
    assert_eq!(reply["code"], json!(0), "{reply}");
    let ids: Vec<&str> = reply["data"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [second.as_str(), first.as_str()]);
    let (full, ok) = home.piped(FULL_BIN, &["session.list"]);
    assert!(ok);
    assert_eq!(
        full, piped,
        "the front and the full binary print the same line"
    );
    let (forced, ok) = home.piped(BIN, &["session.list", "--json"]);
    assert!(ok);
    assert_eq!(forced, piped, "--json piped");
    let (on_terminal, ok) = in_terminal(&home.home, &["session.list", "--json"]);
    assert!(ok);
    assert_eq!(on_terminal, piped, "--json on a terminal");

    let (_, ok) = home.piped(BIN, &["host.shutdown"]);
    assert!(ok);
}

#[test]
fn the_other_list_like_commands_read_as_tables_and_errors_keep_their_exit_status() {
    let home = Home::start();
    let session = home.session("claude", Some("look around"));
    home.ok(&["subscriber.add", r#"{"type":"local","client":"web"}"#]);

    // host.status: answered by the front itself.
    let (status, ok) = in_terminal(&home.home, &["host.status"]);
    assert!(ok, "{status}");
    assert!(status.starts_with("host "), "{status}");
    assert!(status.contains("running, pid "), "{status}");
    assert!(status.lines().any(|l| l == "sessions    1"), "{status}");

    // session.get and session.history.
    let params = json!({"session_id": session}).to_string();
    let (detail, ok) = in_terminal(&home.home, &["session.get", &params]);
    assert!(ok, "{detail}");
    assert!(
        detail.starts_with(&format!(
            "session  {session}\ntitle    look around\nagent    claude\n"
        )),
        "{detail}"
    );
    let (history, ok) = in_terminal(&home.home, &["session.history", &params]);
    assert!(ok, "{history}");
    assert_eq!(history, "no events in this page\n");

    // subscriber.list: a row with its client label.
    let (subscribers, ok) = in_terminal(&home.home, &["subscriber.list"]);
    assert!(ok, "{subscribers}");
    assert!(subscribers.starts_with("SUBSCRIBER "), "{subscribers}");
    assert!(
        subscribers.lines().nth(1).unwrap().contains("  web "),
        "{subscribers}"
    );

    // agent.list: the full binary's (the front hands it on), one row per family.
    let (agents, ok) = in_terminal(&home.home, &["agent.list"]);
    assert!(ok, "{agents}");
    assert!(agents.starts_with("AGENT "), "{agents}");
    for family in ["claude", "codex", "acp"] {
        assert!(
            agents.lines().any(|l| l.starts_with(&format!("{family} "))),
            "{agents}"
        );
    }

    // An error: one readable line, and the exit status of the envelope's code.
    let missing = json!({"session_id": "no-such-session"}).to_string();
    let (error, ok) = in_terminal(&home.home, &["session.get", &missing]);
    assert!(!ok, "{error}");
    assert!(
        error.starts_with("error: no session \"no-such-session\" (session_not_found)\n"),
        "{error}"
    );
    let (piped, ok) = home.piped(BIN, &["session.get", &missing]);
    assert!(!ok);
    assert!(piped.starts_with(r#"{"code":3001,"#), "{piped}");

    // A command without a view prints its envelope on a terminal too.
    let (version, ok) = in_terminal(&home.home, &["version"]);
    assert!(ok);
    let reply: Value = serde_json::from_str(version.trim_end()).unwrap();
    assert_eq!(reply["data"]["version"], json!(agent_host::VERSION));

    // No host: host.status is a summary saying so (the lock-file path, in the full binary).
    let (_, ok) = home.piped(BIN, &["host.shutdown"]);
    assert!(ok);
    let (down, ok) = in_terminal(&home.home, &["host.status"]);
    assert!(ok, "{down}");
    assert!(down.starts_with("host     not running"), "{down}");
    let (listed, ok) = in_terminal(&home.home, &["session.list"]);
    assert!(!ok, "{listed}");
    assert!(
        listed.starts_with("error: ") && listed.contains("(host_not_running)"),
        "{listed}"
    );
}

/// A completion script for `shell`, checked to be a script that shell parses (zsh and fish are
/// installed with apt when missing).
fn completions(shell: &str) -> String {
    let out = Command::new(BIN)
        .args(["completions", shell])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "completions {shell}");
    let script = String::from_utf8(out.stdout).unwrap();
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), &script).unwrap();
    if shell != "bash" {
        // Not on every machine: Debian's packages, installed like Chromium.
        apt::ensure_package(shell, shell, || apt::version_runs(shell));
    }
    let check = match shell {
        "fish" => Command::new("fish")
            .arg("--no-execute")
            .arg(path.path())
            .output(),
        other => Command::new(other).arg("-n").arg(path.path()).output(),
    };
    match check {
        Ok(checked) => assert!(
            checked.status.success(),
            "{shell} does not parse its completions: {}",
            String::from_utf8_lossy(&checked.stderr)
        ),
        Err(e) => panic!("cannot run {shell}: {e}"),
    }
    script
}

#[test]
fn completions_parse_and_offer_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let script = completions(shell);
        for spec in COMMANDS {
            assert!(script.contains(spec.name), "{shell}: no {}", spec.name);
        }
        for word in ["follow", "open", "completions", "man", "--json"] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    // bash completes a command's name from its start.
    let script = completions("bash");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &script).unwrap();
    let offered = Command::new("bash")
        .arg("-c")
        .arg(
            "source \"$1\"; COMP_WORDS=(agent-host session.li); COMP_CWORD=1; \
             _agent__host agent-host session.li agent-host; echo \"${COMPREPLY[@]}\"",
        )
        .arg("bash")
        .arg(file.path())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&offered.stdout), "session.list\n");
    // An unknown shell is a usage error's reply line.
    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["data"]["error"], json!("invalid_envelope"), "{reply}");
}

#[test]
fn the_man_page_names_every_command() {
    let out = Command::new(BIN).arg("man").output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH agent-host 1"), "{page}");
    for spec in COMMANDS {
        assert!(page.contains(spec.name), "the man page lacks {}", spec.name);
    }
    // roff writes a hyphen as `\-`.
    for word in [
        "follow",
        "open",
        "completions",
        "\\-\\-json",
        "AGENT_HOST_HOME",
    ] {
        assert!(page.contains(word), "the man page lacks {word}");
    }
}
