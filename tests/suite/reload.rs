//! `config.toml` changed under a running host (acceptance 4 of issue 20): a `log_level`
//! change and a newly registered agent take effect without a restart, through the file
//! watcher and through `host.reload`; a broken file is refused and the running configuration
//! stays; a subscriber that never comes back is removed, one that is connected never is.
//!
//! Every test runs the real binaries: `agent-host host.start` detaches a real host on a temp
//! home. Nothing sleeps to wait for a condition: `host.reload` returns once applied, and what
//! only the log can tell (a watched change was applied, a debug line, a pruning) is waited for
//! on the log file's change notifications, each wait with a bound.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use notify::Watcher;
use serde_json::{Value, json};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
/// Bound on one CLI invocation and on every wait for the log.
const WAIT: Duration = Duration::from_secs(20);

/// A temp home with a detached host; the host is stopped when this is dropped.
struct Host {
    _dir: TempDir,
    home: PathBuf,
    /// The file written as `config.toml`.
    config: PathBuf,
}

impl Host {
    /// Write `config` as `config.toml` of a new home and start a host on it.
    async fn start(config: &str) -> Host {
        Host::start_with(config, false).await
    }

    /// [`Host::start_with`], the host started with `env` set.
    async fn start_with_env(config: &str, linked: bool, env: &[(&str, &str)]) -> Host {
        let host = Host::create(config, linked);
        let mut start = host.command(&["host.start"]);
        start.envs(env.iter().copied());
        let out = tokio::time::timeout(WAIT, start.output())
            .await
            .expect("host.start answers in time")
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        host
    }

    /// [`Host::start`]; `linked`: `config.toml` is a symlink to a file elsewhere, whose writes
    /// the watcher (of the home directory) does not see, so only `host.reload` applies them and
    /// its reply says what changed without a race with the watcher.
    async fn start_with(config: &str, linked: bool) -> Host {
        let host = Host::create(config, linked);
        let started = host.cli(&["host.start"]).await;
        assert_eq!(started["code"], 0, "{started}");
        host
    }

    /// The home, not started.
    fn create(config: &str, linked: bool) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let file = if linked {
            let target = dir.path().join("elsewhere.toml");
            std::os::unix::fs::symlink(&target, home.join("config.toml")).unwrap();
            target
        } else {
            home.join("config.toml")
        };
        std::fs::write(&file, config).unwrap();
        Host {
            _dir: dir,
            home,
            config: file,
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .env("AGENT_HOST_HOME", &self.home)
            // The log level is config.toml's: no variable overrides it.
            .env_remove("AGENT_HOST_LOG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// One CLI command; its JSON reply.
    async fn cli(&self, args: &[&str]) -> Value {
        let out = tokio::time::timeout(WAIT, self.command(args).output())
            .await
            .expect("the CLI answers in time")
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON line ({e}): {text:?}"))
    }

    fn write_config(&self, text: &str) {
        std::fs::write(&self.config, text).unwrap();
    }

    /// Replace `config.toml` as an editor does: a new file renamed over it.
    fn rename_config(&self, text: &str) {
        let tmp = self.home.join(".config.toml.swp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.home.join("config.toml")).unwrap();
    }

    fn log_path(&self) -> PathBuf {
        self.home.join("logs").join("host.log")
    }

    /// `agent.list` asked of the running host itself over IPC: the CLI reads `config.toml`
    /// too, and refuses to run at all while it is broken.
    async fn agent_types(&self) -> Vec<String> {
        let path = self.home.join("host.sock");
        let reply = tokio::task::spawn_blocking(move || {
            agent_host::ipc::request_blocking(&path, &json!({"command": "agent.list"}), WAIT)
        })
        .await
        .unwrap()
        .unwrap();
        let list = serde_json::to_value(&reply).unwrap();
        assert_eq!(list["code"], 0, "{list}");
        list["data"]["agents"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a["agent_type"].as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _stopped = std::process::Command::new(BIN)
            .arg("host.shutdown")
            .env("AGENT_HOST_HOME", &self.home)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Wait until the log holds a line (after its first `skip` lines) on which every one of
/// `words` appears; returns that line. Woken by the log directory's change notifications.
async fn log_line(path: &Path, skip: usize, words: &[&str]) -> String {
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let mut watcher = notify::recommended_watcher(move |_event| {
        let _coalesced = tx.try_send(());
    })
    .unwrap();
    watcher
        .watch(path.parent().unwrap(), notify::RecursiveMode::NonRecursive)
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .skip(skip)
            .find(|line| words.iter().all(|w| line.contains(w)))
        {
            return line.to_owned();
        }
        if tokio::time::timeout_at(deadline, rx.recv()).await.is_err() {
            panic!("no log line with {words:?} within {WAIT:?}; the log:\n{text}");
        }
    }
}

fn log_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// An ACP agent registered under `name` whose binary does not exist: `agent.list` shows it
/// (not usable, and why) without starting anything.
fn ghost(name: &str) -> String {
    format!("[agents.{name}]\ncommand = [\"/nonexistent/{name}\", \"--acp\"]\nprotocol = \"acp\"\n")
}

/// Acceptance 4, `host.reload`: the reply comes once the change is applied, so `agent.list`
/// right after shows the new agent, a session can be created with it (the session layer's
/// definitions changed too), and a debug line appears in the log as soon as the level is
/// `debug`. A key only a restart applies is named, and so is a variable that overrides.
#[tokio::test]
async fn host_reload_applies_a_log_level_and_a_new_agent() {
    let host = Host::start_with("log_level = \"info\"\n", true).await;
    assert!(!host.agent_types().await.contains(&"ghost".to_owned()));
    let unknown = host
        .cli(&["session.create", r#"{"agent_type":"ghost","cwd":"/"}"#])
        .await;
    assert_eq!(
        unknown["message"]
            .as_str()
            .map(|m| m.contains("unknown agent type")),
        Some(true),
        "{unknown}"
    );
    let ready = log_line(&host.log_path(), 0, &["host ready"]).await;
    let text = std::fs::read_to_string(host.log_path()).unwrap();
    assert!(!text.contains(" DEBUG "), "debug lines at info: {text}");
    assert!(ready.contains("INFO"), "{ready}");

    host.write_config(&format!(
        "log_level = \"debug\"\nqueue_capacity = 5\n{}",
        ghost("ghost")
    ));
    let before = log_lines(&host.log_path());
    let reply = host.cli(&["host.reload"]).await;
    assert_eq!(reply["code"], 0, "{reply}");
    let applied: Vec<&str> = reply["data"]["applied"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(applied, ["log_level", "agents.ghost"], "{reply}");
    assert_eq!(reply["data"]["needs_restart"], json!(["queue_capacity"]));
    assert_eq!(reply["data"]["overridden"], json!([]));

    // At once: no wait between the reply and these.
    assert!(host.agent_types().await.contains(&"ghost".to_owned()));
    let known = host
        .cli(&["session.create", r#"{"agent_type":"ghost","cwd":"/"}"#])
        .await;
    assert_ne!(known["code"], 0, "{known}");
    assert!(
        !known["message"]
            .as_str()
            .unwrap()
            .contains("unknown agent type"),
        "the session layer still has the old agents: {known}"
    );
    let debug = log_line(
        &host.log_path(),
        before,
        &[" DEBUG ", "config.toml applied"],
    )
    .await;
    assert!(debug.contains("agent_host::reload"), "{debug}");

    // Back to info: later reloads write no debug line.
    host.write_config(&format!(
        "log_level = \"info\"\nqueue_capacity = 5\n{}",
        ghost("ghost")
    ));
    let reply = host.cli(&["host.reload"]).await;
    assert_eq!(reply["data"]["applied"], json!(["log_level"]), "{reply}");
    let before = log_lines(&host.log_path());
    let again = host.cli(&["host.reload"]).await;
    assert_eq!(again["data"]["applied"], json!([]), "{again}");
    // Still pending: named at every reload until a restart.
    assert_eq!(again["data"]["needs_restart"], json!(["queue_capacity"]));
    let status = host.cli(&["host.status"]).await;
    assert_eq!(status["data"]["config"]["reloads"], 3, "{status}");
    assert_eq!(
        status["data"]["log_path"],
        json!(host.log_path().display().to_string())
    );
    // An info line logged after the last reload: once it is in the file, every line before it
    // is (one writer, in order). Only the reload that went back to info read the file at debug.
    let added = host.cli(&["subscriber.add", r#"{"type":"local"}"#]).await;
    assert_eq!(added["code"], 0, "{added}");
    log_line(&host.log_path(), before, &["subscriber added"]).await;
    let text = std::fs::read_to_string(host.log_path()).unwrap();
    let reads: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" DEBUG ") && l.contains("reading config.toml"))
        .collect();
    assert_eq!(reads.len(), 1, "{reads:?}");
}

/// Acceptance 4, the watcher: an editor's atomic rename of `config.toml` is seen, and the
/// new agent is in `agent.list` once the host has logged the reload; removing it again takes
/// it out. A burst of writes is one reload; a broken file is refused, in the log, with its
/// line.
#[tokio::test]
async fn a_watched_change_registers_and_removes_an_agent() {
    let host = Host::start("").await;
    log_line(&host.log_path(), 0, &["host ready"]).await;
    assert!(!host.agent_types().await.contains(&"watched".to_owned()));

    let before = log_lines(&host.log_path());
    host.rename_config(&ghost("watched"));
    let line = log_line(&host.log_path(), before, &["config.toml changed; reloaded"]).await;
    assert!(line.contains("agents.watched"), "{line}");
    assert!(host.agent_types().await.contains(&"watched".to_owned()));

    // A broken file: refused, named with its line, and the agent stays.
    let before = log_lines(&host.log_path());
    host.write_config(&format!("{}\n[agents.watched\n", ghost("watched")));
    let line = log_line(
        &host.log_path(),
        before,
        &["refused", "config.toml", "line 5"],
    )
    .await;
    assert!(line.contains("ERROR"), "{line}");
    assert!(host.agent_types().await.contains(&"watched".to_owned()));

    // Three writes in a row: one reload, after the last.
    let before = log_lines(&host.log_path());
    host.write_config("log_level = \"info\"\n");
    host.write_config("log_level = \"warn\"\n");
    host.write_config("");
    let line = log_line(&host.log_path(), before, &["config.toml changed; reloaded"]).await;
    assert!(line.contains("agents.watched"), "{line}");
    assert!(!host.agent_types().await.contains(&"watched".to_owned()));
    let status = host.cli(&["host.status"]).await;
    // Two reloads applied (the broken file was not); a third only if the machine stalled the
    // test for longer than the debounce between two of the writes.
    let reloads = status["data"]["config"]["reloads"].as_u64().unwrap();
    assert!((2..=3).contains(&reloads), "{status}");
}

/// A file that does not parse is refused by `host.reload` with the file and the line, and the
/// running configuration stays: the agent registered before is still listed, and a later good
/// file applies. (The watcher's refusal: [`a_watched_change_registers_and_removes_an_agent`].)
#[tokio::test]
async fn a_broken_config_is_refused_and_the_old_one_stays() {
    let host = Host::start_with(&ghost("kept"), true).await;
    assert!(host.agent_types().await.contains(&"kept".to_owned()));

    host.write_config("log_level = \"debug\"\n\n[agents.kept\ncommand = [\"x\"]\n");
    let refused = host.cli(&["host.reload"]).await;
    assert_eq!(refused["code"], 2014, "{refused}");
    let message = refused["message"].as_str().unwrap();
    let config_path = host.home.join("config.toml").display().to_string();
    assert!(message.contains(&config_path), "{message}");
    assert!(message.contains("line 3"), "{message}");
    assert!(host.agent_types().await.contains(&"kept".to_owned()));
    let status = host.cli(&["host.status"]).await;
    assert!(
        status["data"]["config"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("line 3")),
        "{status}"
    );

    // A value the host refuses: the same.
    host.write_config(&format!("log_level = \"[nonsense\"\n{}", ghost("kept")));
    let refused = host.cli(&["host.reload"]).await;
    assert_eq!(refused["code"], 2014, "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("log_level"),
        "{refused}"
    );

    host.write_config(&ghost("other"));
    let reply = host.cli(&["host.reload"]).await;
    assert_eq!(reply["code"], 0, "{reply}");
    let types = host.agent_types().await;
    assert!(types.contains(&"other".to_owned()) && !types.contains(&"kept".to_owned()));
}

/// Subscribers that never come back: `subscriber.list` shows when each was last seen (a
/// connection sets it); with `subscriber_max_idle_days = 0` applied by a reload, the one not
/// connected is removed at once and the connected one stays; after a restart at 0 days the
/// other one, no longer connected, is gone too.
#[tokio::test]
async fn subscribers_that_never_come_back_are_removed_and_connected_ones_stay() {
    let host = Host::start_with("", true).await;
    let add = |client: &'static str| {
        let host = &host;
        async move {
            let params = format!(r#"{{"type":"local","client":"{client}"}}"#);
            let reply = host.cli(&["subscriber.add", &params]).await;
            assert_eq!(reply["code"], 0, "{reply}");
            reply["data"].clone()
        }
    };
    let live = add("live").await;
    let gone = add("gone").await;
    let (ws, _resp) = agent_host::ws::client::connect(
        live["ws_endpoint"].as_str().unwrap(),
        live["ws_token"].as_str().unwrap(),
        pb::Hello {
            client_name: "reload-test".into(),
            cursor: None,
            protocol_version: PROTOCOL_VERSION,
        },
    )
    .await
    .unwrap();

    let list = host.cli(&["subscriber.list"]).await;
    let rows = list["data"]["subscribers"].as_array().unwrap().clone();
    let row = |id: &Value| {
        rows.iter()
            .find(|r| r["subscriber_id"] == *id)
            .cloned()
            .unwrap()
    };
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let seen = row(&live["subscriber_id"])["last_seen_at_ms"]
        .as_i64()
        .unwrap();
    assert!((now - 60_000..=now).contains(&seen), "{seen} vs {now}");
    assert_eq!(row(&gone["subscriber_id"])["last_seen_at_ms"], json!(null));
    assert_eq!(row(&live["subscriber_id"])["connected"], true);

    let before = log_lines(&host.log_path());
    host.write_config("subscriber_max_idle_days = 0\n");
    let reply = host.cli(&["host.reload"]).await;
    assert_eq!(
        reply["data"]["applied"],
        json!(["subscriber_max_idle_days"]),
        "{reply}"
    );
    log_line(
        &host.log_path(),
        before,
        &["removed subscribers that did not come back", "count=1"],
    )
    .await;
    let list = host.cli(&["subscriber.list"]).await;
    let ids: Vec<&Value> = list["data"]["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["subscriber_id"])
        .collect();
    assert_eq!(ids, [&live["subscriber_id"]], "{list}");
    // Gone with its grants: it cannot be renewed.
    let params = format!(r#"{{"subscriber_id":{}}}"#, gone["subscriber_id"]);
    let renew = host.cli(&["subscriber.grant", &params]).await;
    assert_ne!(renew["code"], 0, "{renew}");

    // A restart at 0 days: pruned at start, now that nothing is connected.
    drop(ws);
    let stopped = host.cli(&["host.shutdown"]).await;
    assert_eq!(stopped["code"], 0, "{stopped}");
    let before = log_lines(&host.log_path());
    let started = host.cli(&["host.start"]).await;
    assert_eq!(started["code"], 0, "{started}");
    log_line(
        &host.log_path(),
        before,
        &["removed subscribers that did not come back", "count=1"],
    )
    .await;
    let list = host.cli(&["subscriber.list"]).await;
    assert_eq!(list["data"]["subscribers"], json!([]), "{list}");
}

/// `RUST_LOG` set when the host started wins over `log_level`: a reload names the key as
/// overridden and applies nothing; the host's log stays at the variable's level.
#[tokio::test]
async fn a_log_variable_wins_over_config_toml() {
    let host = Host::start_with_env("", true, &[("RUST_LOG", "warn")]).await;
    host.write_config("log_level = \"debug\"\n");
    let reply = host.cli(&["host.reload"]).await;
    assert_eq!(reply["code"], 0, "{reply}");
    assert_eq!(reply["data"]["applied"], json!([]), "{reply}");
    assert_eq!(
        reply["data"]["overridden"],
        json!(["log_level (RUST_LOG is set)"])
    );
    let text = std::fs::read_to_string(host.log_path()).unwrap_or_default();
    assert!(
        !text.contains(" INFO "),
        "RUST_LOG=warn not honoured: {text}"
    );
}
