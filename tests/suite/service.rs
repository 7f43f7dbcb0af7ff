//! `agent-host service` (issue 20, acceptance 2): the generated systemd user unit passes
//! `systemd-analyze verify` (Debian's `systemd`, installed with apt when missing and the tests
//! run as root), and `install` / `uninstall` write and remove exactly their files under a
//! temporary `XDG_CONFIG_HOME` and `HOME` — with no service manager, and with a stand-in
//! `systemctl` that records what it is asked (the machine's own user manager is never
//! touched: `AGENT_HOST_SYSTEMCTL` replaces it in every test).
//!
//! Every wait is bounded: a command is killed and the test fails after [`CLI_TIMEOUT`].

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use crate::common::apt;

use crate::common::reap;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use agent_host::protocol::envelope::ErrorCode;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const FULL_BIN: &str = env!("CARGO_BIN_EXE_agent-hostd");
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Run `command` to its end, within [`CLI_TIMEOUT`].
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

/// Debian's `systemd-analyze` (package `systemd`), installed with apt when it is missing.
fn ensure_systemd_analyze() {
    apt::ensure_package("systemd", "systemd-analyze", || {
        apt::version_runs("systemd-analyze")
    });
}

/// A temporary user: `HOME`, `XDG_CONFIG_HOME` and an `AGENT_HOST_HOME` under one directory.
struct User {
    dir: tempfile::TempDir,
    /// What `AGENT_HOST_SYSTEMCTL` is set to.
    systemctl: String,
}

impl User {
    fn new() -> User {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["home", "xdg"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        User {
            dir,
            systemctl: "none".to_owned(),
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn agent_home(&self) -> PathBuf {
        self.root().join("home/.agent-host")
    }

    fn unit(&self) -> PathBuf {
        self.root().join("xdg/systemd/user/agent-host.service")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("HOME", self.root().join("home"))
            .env("XDG_CONFIG_HOME", self.root().join("xdg"))
            .env("AGENT_HOST_HOME", self.agent_home())
            .env("AGENT_HOST_SYSTEMCTL", &self.systemctl)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin");
        cmd
    }

    /// Run the CLI: one JSON reply line, exit status 0 exactly when `code` is 0.
    fn cli(&self, args: &[&str]) -> Value {
        let out = run(self.command(args));
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            stdout.matches('\n').count(),
            1,
            "{args:?}: not one line: {stdout:?} (stderr: {})",
            String::from_utf8_lossy(&out.stderr)
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

    /// Every file and directory under the user's root, with a file's bytes.
    fn tree(&self) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.root().to_owned()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                if meta.is_dir() {
                    stack.push(path.clone());
                    out.insert(path, None);
                } else if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&path).unwrap();
                    out.insert(path, Some(target.display().to_string().into_bytes()));
                } else {
                    out.insert(path.clone(), Some(std::fs::read(&path).unwrap()));
                }
            }
        }
        out
    }
}

/// The `ExecStart=` program of a unit: the first word, unquoted.
fn exec_start_program(unit: &str) -> PathBuf {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("no ExecStart in {unit}"));
    let program = line
        .strip_prefix('"')
        .and_then(|l| l.split_once('"'))
        .map_or_else(|| line.split(' ').next().unwrap(), |(p, _)| p);
    PathBuf::from(program)
}

#[test]
fn the_generated_unit_verifies() {
    ensure_systemd_analyze();
    let user = User::new();
    let data = user.ok(&["service", "install"]);
    assert_eq!(data["platform"], json!("systemd"), "{data}");
    assert_eq!(data["path"], json!(user.unit().display().to_string()));
    assert_eq!(data["manager"]["available"], json!(false), "{data}");
    assert_eq!(data["started"], json!(false), "{data}");
    assert!(
        data["next"]
            .as_str()
            .unwrap()
            .contains("systemctl --user enable --now agent-host"),
        "{data}"
    );
    let logs = data["logs"].to_string();
    assert!(
        logs.contains("journalctl --user -u agent-host") && logs.contains("logs/host.log"),
        "{data}"
    );
    let unit = std::fs::read_to_string(user.unit()).unwrap();
    assert_eq!(
        data["content"],
        json!(unit),
        "install did not print what it wrote"
    );
    // The host in the foreground, this very binary: verify checks it is executable.
    let program = exec_start_program(&unit);
    assert_eq!(
        program.canonicalize().unwrap(),
        Path::new(FULL_BIN).canonicalize().unwrap(),
        "{unit}"
    );
    assert!(program.is_absolute() && program.is_file(), "{unit}");
    assert!(
        unit.contains(r#""host.start" "{\"foreground\":true}""#),
        "{unit}"
    );
    assert!(unit.contains("\nRestart=on-failure\n"), "{unit}");
    assert!(
        unit.contains("\nEnvironment=\"PATH=/usr/local/bin:/usr/bin:/bin\"\n"),
        "{unit}"
    );
    assert!(
        unit.contains(&format!(
            "\nEnvironment=\"AGENT_HOST_HOME={}\"\n",
            user.agent_home().display()
        )),
        "{unit}"
    );
    let verify = run({
        let mut cmd = Command::new("systemd-analyze");
        cmd.arg("verify").arg(user.unit());
        cmd
    });
    let stderr = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success(),
        "systemd-analyze verify failed: {stderr}\n{unit}"
    );
    // A key it does not know or a value it cannot parse is only a warning: none allowed.
    assert!(
        !stderr.contains("agent-host.service"),
        "systemd-analyze verify warned: {stderr}\n{unit}"
    );
    // And it can fail: the same unit with a program that is not there.
    let broken = user.root().join("broken/agent-host.service");
    std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
    std::fs::write(
        &broken,
        unit.replace(&program.display().to_string(), "/nonexistent/agent-hostd"),
    )
    .unwrap();
    let refused = run({
        let mut cmd = Command::new("systemd-analyze");
        cmd.arg("verify").arg(&broken);
        cmd
    });
    assert!(!refused.status.success(), "verify passed a missing program");
}

#[test]
fn install_and_uninstall_leave_no_file_behind() {
    let user = User::new();
    let before = user.tree();
    let first = user.ok(&["service", "install"]);
    assert_eq!(first["replaced"], json!(false), "{first}");
    assert!(user.unit().is_file());
    let mode = std::fs::metadata(user.unit()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    let written: Vec<PathBuf> = user
        .tree()
        .into_iter()
        .filter(|(path, _)| !before.contains_key(path))
        .map(|(path, _)| path)
        .collect();
    let xdg = user.root().join("xdg");
    assert_eq!(
        written,
        vec![xdg.join("systemd"), xdg.join("systemd/user"), user.unit()],
        "install wrote more than its unit"
    );
    // Installing again rewrites its own unit.
    let again = user.ok(&["service", "install"]);
    assert_eq!(again["replaced"], json!(true), "{again}");
    let status = user.ok(&["service", "status"]);
    assert_eq!(status["installed"], json!(true), "{status}");
    assert_eq!(status["ours"], json!(true), "{status}");
    assert_eq!(status["host"]["running"], json!(false), "{status}");
    assert!(
        status["exec_start"]
            .as_str()
            .unwrap()
            .contains("host.start"),
        "{status}"
    );

    let removed = user.ok(&["service", "uninstall"]);
    assert_eq!(
        removed["removed"][0],
        json!(user.unit().display().to_string()),
        "{removed}"
    );
    assert_eq!(user.tree(), before, "uninstall left something behind");
    // Nothing to remove is not an error.
    let none = user.ok(&["service", "uninstall"]);
    assert_eq!(none["removed"], json!([]), "{none}");
    let status = user.ok(&["service", "status"]);
    assert_eq!(status["installed"], json!(false), "{status}");
}

#[test]
fn a_unit_it_did_not_write_is_never_touched() {
    let user = User::new();
    std::fs::create_dir_all(user.unit().parent().unwrap()).unwrap();
    let mine = "[Service]\nExecStart=/usr/bin/my-own-agent-host\n";
    std::fs::write(user.unit(), mine).unwrap();
    for args in [["service", "install"], ["service", "uninstall"]] {
        let reply = user.cli(&args);
        assert_eq!(
            reply["code"],
            json!(ErrorCode::ServiceFailed.number()),
            "{args:?}: {reply}"
        );
        assert_eq!(
            reply["data"]["path"],
            json!(user.unit().display().to_string())
        );
        assert!(
            reply["message"]
                .as_str()
                .unwrap()
                .contains("not written by `agent-host service install`"),
            "{reply}"
        );
        assert_eq!(std::fs::read_to_string(user.unit()).unwrap(), mine);
    }
    let status = user.ok(&["service", "status"]);
    assert_eq!(status["ours"], json!(false), "{status}");
    let usage = user.cli(&["service", "start"]);
    assert_eq!(
        usage["code"],
        json!(ErrorCode::InvalidEnvelope.number()),
        "{usage}"
    );
}

/// A stand-in `systemctl` that answers like a reachable user manager and writes each call's
/// arguments, one line each, to `calls`; `enable` and `disable` make and remove the wants link
/// as the real one does.
fn fake_systemctl(dir: &Path, calls: &Path) -> PathBuf {
    let path = dir.join("systemctl");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n\
             echo \"$*\" >> '{calls}'\n\
             unit_dir=\"$XDG_CONFIG_HOME/systemd/user\"\n\
             case \"$*\" in\n\
             *' enable '*) mkdir -p \"$unit_dir/default.target.wants\" && ln -sf \"$unit_dir/agent-host.service\" \"$unit_dir/default.target.wants/agent-host.service\" ;;\n\
             *' disable '*) rm -f \"$unit_dir/default.target.wants/agent-host.service\" && rmdir \"$unit_dir/default.target.wants\" ;;\n\
             esac\n\
             exit 0\n",
            calls = calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn calls(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn with_a_user_manager_install_enables_and_uninstall_disables_first() {
    let tools = tempfile::tempdir().unwrap();
    let log = tools.path().join("calls");
    let mut user = User::new();
    user.systemctl = fake_systemctl(tools.path(), &log).display().to_string();
    let before = user.tree();

    let data = user.ok(&["service", "install"]);
    assert_eq!(data["manager"]["available"], json!(true), "{data}");
    assert_eq!(data["enabled"], json!(true), "{data}");
    assert_eq!(data["started"], json!(true), "{data}");
    assert_eq!(
        calls(&log),
        [
            "--user show-environment",
            "--user daemon-reload",
            "--user enable --now agent-host.service"
        ]
    );
    let link = user
        .root()
        .join("xdg/systemd/user/default.target.wants/agent-host.service");
    assert!(std::fs::symlink_metadata(&link).is_ok());

    std::fs::remove_file(&log).unwrap();
    let removed = user.ok(&["service", "uninstall"]);
    assert_eq!(
        calls(&log),
        [
            "--user show-environment",
            "--user disable --now agent-host.service",
            "--user daemon-reload"
        ],
        "{removed}"
    );
    assert_eq!(user.tree(), before, "uninstall left something behind");

    // Without a manager to `disable`, uninstall removes the link `enable` made itself.
    user.ok(&["service", "install"]);
    assert!(std::fs::symlink_metadata(&link).is_ok());
    user.systemctl = "none".to_owned();
    user.ok(&["service", "uninstall"]);
    assert_eq!(user.tree(), before, "uninstall left the wants link behind");
}

#[test]
fn a_host_already_running_is_left_running_and_the_service_only_enabled() {
    let tools = tempfile::tempdir().unwrap();
    let log = tools.path().join("calls");
    let mut user = User::new();
    user.systemctl = fake_systemctl(tools.path(), &log).display().to_string();
    let started = user.ok(&["host.start"]);
    let lock = user.agent_home().join("host.lock");
    // Never leak the host: it is stopped by its pid whatever happens below.
    struct Stop(PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            reap::kill_lock_holder(&self.0);
        }
    }
    let _stop = Stop(lock.clone());
    let data = user.ok(&["service", "install"]);
    assert_eq!(data["started"], json!(false), "{data}");
    assert!(
        data["next"].as_str().unwrap().contains("host.shutdown"),
        "{data}"
    );
    assert_eq!(
        calls(&log),
        [
            "--user show-environment",
            "--user daemon-reload",
            "--user enable agent-host.service"
        ]
    );
    let status = user.ok(&["service", "status"]);
    assert_eq!(status["host"]["running"], json!(true), "{status}");
    assert_eq!(status["host"]["pid"], started["pid"], "{status}");
    assert_eq!(status["manager"]["available"], json!(true), "{status}");
    user.ok(&["service", "uninstall"]);
    let stopped = user.ok(&["host.shutdown"]);
    assert_eq!(stopped["stopped"], json!(true), "{stopped}");
}
