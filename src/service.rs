//! `agent-host service install | uninstall | status`: the host as a per-user service that starts
//! at login and comes back when it fails — a systemd user unit on Linux, a launchd agent on
//! macOS.
//!
//! What it writes: one file, the unit (`$XDG_CONFIG_HOME/systemd/user/agent-host.service`,
//! default `~/.config/…`) or the plist (`~/Library/LaunchAgents/dev.agent-host.plist`). It runs
//! `agent-hostd host.start {"foreground":true}` (the host in the service manager's foreground,
//! its stderr log in the journal), restarts it on failure, and gives it the environment a
//! service does not inherit from a login shell: `PATH` as the installing shell has it (so the
//! agent CLIs are found where that shell finds them; install again after changing it),
//! `AGENT_HOST_HOME` when it is set, and on Linux the optional `EnvironmentFile`
//! `$AGENT_HOST_HOME/service.env` for provider keys — secrets are never copied into the unit.
//!
//! Invariants: the file starts with [`MARKER`]; a file without it is the user's, never
//! overwritten or removed. `uninstall` removes exactly what `install` left: the file, the
//! `default.target.wants` link `systemctl enable` made (itself when `systemctl --user` cannot),
//! and the directories that hold them when they are left empty. Without a user service manager
//! (no user bus in a container, say) the file is written all the same and the reply says how to
//! enable it. The service manager's programs can be replaced (`AGENT_HOST_SYSTEMCTL`,
//! `AGENT_HOST_LAUNCHCTL`; `none`: act as if it is absent) — the tests' way to keep the
//! machine's own manager out of it. Nothing here prints: replies only.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Config;
use crate::protocol::envelope::{ErrorCode, Reply};

/// The first line of every file `install` writes (after the XML declaration of a plist).
pub const MARKER: &str =
    "Written by `agent-host service install`; `agent-host service uninstall` removes it.";
/// The systemd unit's name.
pub const UNIT_NAME: &str = "agent-host.service";
/// The launchd agent's label (and its plist's name).
pub const LAUNCHD_LABEL: &str = "dev.agent-host";
/// The optional file of extra variables (provider keys) the systemd unit reads, in the home.
pub const ENV_FILE: &str = "service.env";
/// How long one `systemctl` / `launchctl` call may take.
const MANAGER_TIMEOUT: Duration = Duration::from_secs(30);

/// The words after `service`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Install,
    Uninstall,
    Status,
}

impl Action {
    pub fn parse(word: Option<&str>) -> Result<Action, String> {
        match word {
            Some("install") => Ok(Action::Install),
            Some("uninstall") => Ok(Action::Uninstall),
            Some("status") => Ok(Action::Status),
            Some(other) => Err(format!(
                "service takes install, uninstall or status, not {other:?}"
            )),
            None => Err("service needs install, uninstall or status".to_owned()),
        }
    }
}

/// Which service manager this machine has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Systemd,
    Launchd,
}

impl Platform {
    pub fn current() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::Launchd
        } else {
            Platform::Systemd
        }
    }

    fn name(self) -> &'static str {
        match self {
            Platform::Systemd => "systemd",
            Platform::Launchd => "launchd",
        }
    }
}

/// What the service runs, and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// `agent-hostd`, absolute.
    pub exe: PathBuf,
    /// The host's home (its logs, the env file).
    pub home: PathBuf,
    /// `AGENT_HOST_HOME`, when the installing shell sets it.
    pub home_env: Option<PathBuf>,
    /// The installing shell's `PATH`.
    pub path_env: Option<String>,
}

impl Spec {
    /// The variables the service sets, name and value, in the order written.
    fn environment(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(path) = &self.path_env {
            env.push(("PATH", path.clone()));
        }
        if let Some(home) = &self.home_env {
            env.push(("AGENT_HOST_HOME", home.display().to_string()));
        }
        env
    }

    fn env_file(&self) -> PathBuf {
        self.home.join(ENV_FILE)
    }
}

/// The arguments after the binary: the host in the foreground.
const HOST_ARGS: [&str; 2] = ["host.start", r#"{"foreground":true}"#];

/// A word of a systemd unit's command line or assignment, double-quoted: `\` and `"` escaped,
/// `%` (a specifier) doubled, and — `command` — `$` (a variable) doubled.
fn systemd_quote(word: &str, command: bool) -> String {
    let mut out = String::from("\"");
    for c in word.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' if command => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether `text` can stand in a unit file at all (one line, no control characters).
fn unit_safe(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// The systemd user unit. `Restart=on-failure` brings a crashed host back (a clean
/// `host.shutdown` exits 0 and stays down); `KillMode=mixed` lets the host stop its agents
/// itself, in order, on `systemctl stop`, before anything left is killed.
pub fn systemd_unit(spec: &Spec) -> Result<String, String> {
    let exe = spec.exe.display().to_string();
    let mut words = vec![systemd_quote(&exe, true)];
    words.extend(HOST_ARGS.iter().map(|a| systemd_quote(a, true)));
    let mut unit = format!(
        "# {MARKER}\n\
         [Unit]\n\
         Description=agent-host: runs coding-agent CLIs for many clients\n\
         \n\
         [Service]\n\
         Type=exec\n\
         ExecStart={}\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         KillMode=mixed\n\
         TimeoutStopSec=30\n",
        words.join(" ")
    );
    for (name, value) in spec.environment() {
        if !unit_safe(&value) {
            return Err(format!(
                "{name} holds a control character: it cannot go in a unit"
            ));
        }
        unit.push_str(&format!(
            "Environment={}\n",
            systemd_quote(&format!("{name}={value}"), false)
        ));
    }
    let env_file = spec.env_file().display().to_string();
    if !unit_safe(&exe) || !unit_safe(&env_file) {
        return Err("a path holds a control character: it cannot go in a unit".to_owned());
    }
    // `-`: the file is optional. Only a path without blanks can be written there.
    if !env_file.contains(char::is_whitespace) {
        unit.push_str(&format!(
            "EnvironmentFile=-{}\n",
            env_file.replace('%', "%%")
        ));
    }
    unit.push_str("\n[Install]\nWantedBy=default.target\n");
    Ok(unit)
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The launchd agent. `KeepAlive.SuccessfulExit = false` is launchd's restart-on-failure; its
/// stdout and stderr go to `logs/launchd.log` in the home.
pub fn launchd_plist(spec: &Spec) -> String {
    let string = |s: &str| format!("<string>{}</string>", xml_escape(s));
    let mut args = vec![string(&spec.exe.display().to_string())];
    args.extend(HOST_ARGS.iter().map(|a| string(a)));
    let env: String = spec
        .environment()
        .into_iter()
        .map(|(k, v)| format!("\t\t<key>{k}</key>\n\t\t{}\n", string(&v)))
        .collect();
    let log = spec
        .home
        .join("logs")
        .join("launchd.log")
        .display()
        .to_string();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!-- {} -->\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n\
         <dict>\n\
         \t<key>Label</key>\n\t{}\n\
         \t<key>ProgramArguments</key>\n\t<array>\n\t\t{}\n\t</array>\n\
         \t<key>EnvironmentVariables</key>\n\t<dict>\n{}\t</dict>\n\
         \t<key>RunAtLoad</key>\n\t<true/>\n\
         \t<key>KeepAlive</key>\n\t<dict>\n\t\t<key>SuccessfulExit</key>\n\t\t<false/>\n\t</dict>\n\
         \t<key>ProcessType</key>\n\t<string>Background</string>\n\
         \t<key>StandardOutPath</key>\n\t{}\n\
         \t<key>StandardErrorPath</key>\n\t{}\n\
         </dict>\n\
         </plist>\n",
        xml_escape(MARKER).replace("--", "- -"),
        string(LAUNCHD_LABEL),
        args.join("\n\t\t"),
        env,
        string(&log),
        string(&log),
    )
}

/// Where the service's file goes, from the environment snapshot.
pub fn unit_path(platform: Platform, config: &Config) -> Result<PathBuf, String> {
    let var = |name: &str| config.env_var(name).filter(|v| !v.is_empty());
    let home = var("HOME").map(PathBuf::from);
    match platform {
        Platform::Systemd => {
            let base = var("XDG_CONFIG_HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .or_else(|| home.map(|h| h.join(".config")))
                .ok_or("neither XDG_CONFIG_HOME nor HOME is set: no place for the unit")?;
            Ok(base.join("systemd").join("user").join(UNIT_NAME))
        }
        Platform::Launchd => {
            let home = home.ok_or("HOME is not set: no place for the launchd agent")?;
            Ok(home
                .join("Library")
                .join("LaunchAgents")
                .join(format!("{LAUNCHD_LABEL}.plist")))
        }
    }
}

/// What a file at the unit's path is to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Missing,
    Ours,
    /// Someone else's: never touched.
    Foreign,
}

fn found(path: &Path) -> std::io::Result<Found> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            // The marker is on the first line (the second in a plist, after the declaration).
            let ours = text.lines().take(2).any(|line| line.contains(MARKER))
                || text
                    .lines()
                    .take(2)
                    .any(|line| line.contains(&xml_escape(MARKER).replace("--", "- -")));
            Ok(if ours { Found::Ours } else { Found::Foreign })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Found::Missing),
        Err(e) => Err(e),
    }
}

/// One run of the service manager's program, as the reply shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ran {
    command: String,
    ok: bool,
    output: String,
}

impl Ran {
    fn json(&self) -> Value {
        json!({"command": self.command, "ok": self.ok, "output": self.output})
    }
}

/// `systemctl --user` or `launchctl`, as configured; `None`: absent (or `none`).
struct Manager {
    program: Option<String>,
    platform: Platform,
}

impl Manager {
    fn of(platform: Platform, config: &Config) -> Manager {
        let (var, default) = match platform {
            Platform::Systemd => ("AGENT_HOST_SYSTEMCTL", "systemctl"),
            Platform::Launchd => ("AGENT_HOST_LAUNCHCTL", "launchctl"),
        };
        let program = match config.env_var(var).filter(|v| !v.is_empty()) {
            Some("none") => None,
            Some(program) => Some(program.to_owned()),
            None => Some(default.to_owned()),
        };
        Manager { program, platform }
    }

    /// Run it with `args` (after `--user` for systemctl), within [`MANAGER_TIMEOUT`].
    fn run(&self, args: &[&str]) -> Ran {
        let program = self.program.as_deref().unwrap_or("systemctl");
        let mut all: Vec<&str> = Vec::new();
        if self.platform == Platform::Systemd {
            all.push("--user");
        }
        all.extend_from_slice(args);
        let command = format!("{} {}", program, all.join(" "));
        let child = Command::new(program)
            .args(&all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                return Ran {
                    command,
                    ok: false,
                    output: format!("cannot run {program}: {e}"),
                };
            }
        };
        // Bounded: a manager that hangs (a bus that never answers) is killed, not waited for.
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let waiter = std::thread::Builder::new()
            .name("service-manager".into())
            .spawn(move || {
                let _gone = tx.send(child.wait_with_output());
            });
        if let Err(e) = waiter {
            return Ran {
                command,
                ok: false,
                output: format!("cannot wait for {program}: {e}"),
            };
        }
        let output = match rx.recv_timeout(MANAGER_TIMEOUT) {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => {
                return Ran {
                    command,
                    ok: false,
                    output: e.to_string(),
                };
            }
            Err(_) => {
                if let Ok(raw) = i32::try_from(pid) {
                    let _gone = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(raw),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                return Ran {
                    command,
                    ok: false,
                    output: format!("{program} did not finish within {MANAGER_TIMEOUT:?}"),
                };
            }
        };
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        // A line or two is what a person needs; never carry an unbounded amount.
        let mut text = text.trim().to_owned();
        if text.len() > 4096 {
            let mut cut = 4096;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        Ran {
            command,
            ok: output.status.success(),
            output: text,
        }
    }

    /// Whether the user's service manager answers: `None` if so, else why not.
    fn unavailable(&self) -> Option<String> {
        if self.program.is_none() {
            return Some("the service manager is turned off (AGENT_HOST_*CTL=none)".to_owned());
        }
        if self.platform == Platform::Launchd && !cfg!(target_os = "macos") {
            return Some("launchctl runs on macOS only".to_owned());
        }
        let probe = match self.platform {
            // Answers exactly when the user manager is reachable over its bus.
            Platform::Systemd => self.run(&["show-environment"]),
            Platform::Launchd => self.run(&["print", &gui_domain()]),
        };
        if probe.ok {
            None
        } else {
            Some(format!("{}: {}", probe.command, first_line(&probe.output)))
        }
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("failed")
}

fn gui_domain() -> String {
    format!("gui/{}", nix::unistd::getuid())
}

fn failed(message: String, path: &Path, details: Value) -> Reply {
    let mut data = json!({"path": path.display().to_string()});
    if let (Value::Object(data), Value::Object(extra)) = (&mut data, details) {
        data.extend(extra);
    }
    Reply::error(ErrorCode::ServiceFailed, message, data)
}

/// Write `text` to `path` through a temporary file beside it (never a half-written unit).
fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

/// The commands that show the service's logs.
fn logs(platform: Platform, config: &Config) -> Vec<String> {
    let host_log = config.logs_dir().join("host.log").display().to_string();
    match platform {
        Platform::Systemd => vec!["journalctl --user -u agent-host".to_owned(), host_log],
        Platform::Launchd => vec![
            config.logs_dir().join("launchd.log").display().to_string(),
            host_log,
        ],
    }
}

/// The spec for this process: `exe` is `agent-hostd` (the running binary).
pub fn spec_of(config: &Config, exe: PathBuf) -> Spec {
    // The service does not start in this shell's directory: a relative home would be another.
    let absolute = |path: PathBuf| match std::env::current_dir() {
        Ok(here) if path.is_relative() => here.join(path),
        _ => path,
    };
    Spec {
        exe: absolute(exe),
        home: absolute(config.home.clone()),
        home_env: config
            .env_var("AGENT_HOST_HOME")
            .filter(|v| !v.is_empty())
            .map(|v| absolute(PathBuf::from(v))),
        path_env: config.env_var("PATH").map(str::to_owned),
    }
}

/// `service install`.
pub fn install(config: &Config, spec: &Spec) -> Reply {
    install_on(Platform::current(), config, spec)
}

/// `service uninstall`.
pub fn uninstall(config: &Config) -> Reply {
    uninstall_on(Platform::current(), config)
}

/// `service status`.
pub fn status(config: &Config) -> Reply {
    status_on(Platform::current(), config)
}

fn install_on(platform: Platform, config: &Config, spec: &Spec) -> Reply {
    let path = match unit_path(platform, config) {
        Ok(path) => path,
        Err(e) => return failed(e, Path::new(""), Value::Null),
    };
    if !spec.exe.is_absolute() || !spec.exe.is_file() {
        return failed(
            format!(
                "{} is not an absolute path to agent-hostd",
                spec.exe.display()
            ),
            &path,
            Value::Null,
        );
    }
    let text = match platform {
        Platform::Systemd => systemd_unit(spec),
        Platform::Launchd => Ok(launchd_plist(spec)),
    };
    let text = match text {
        Ok(text) => text,
        Err(e) => return failed(e, &path, Value::Null),
    };
    let replaced = match found(&path) {
        Ok(Found::Missing) => false,
        Ok(Found::Ours) => true,
        Ok(Found::Foreign) => {
            return failed(
                format!(
                    "{} exists and was not written by `agent-host service install`: it is left \
                     as it is; move it aside to install",
                    path.display()
                ),
                &path,
                Value::Null,
            );
        }
        Err(e) => {
            return failed(
                format!("cannot read {}: {e}", path.display()),
                &path,
                Value::Null,
            );
        }
    };
    if platform == Platform::Launchd {
        // launchd opens the log file itself: its directory must be there first.
        if let Err(e) = config.ensure_home() {
            return failed(e.to_string(), &path, Value::Null);
        }
    }
    if let Err(e) = write_file(&path, &text) {
        return failed(
            format!("cannot write {}: {e}", path.display()),
            &path,
            Value::Null,
        );
    }
    tracing::info!(path = %path.display(), "service file written");
    let manager = Manager::of(platform, config);
    let mut ran: Vec<Ran> = Vec::new();
    let unavailable = manager.unavailable();
    // A host already running (started by hand) keeps the lock: starting the service now would
    // only fail and retry. It is enabled for the next login instead.
    let running = crate::instance::lock_held(&config.lock_path()).unwrap_or(false);
    let (enabled, started, next) = match (&unavailable, platform) {
        (Some(why), Platform::Systemd) => (
            false,
            false,
            format!(
                "systemctl --user is not available ({why}); where a user manager runs, enable \
                 it with `systemctl --user daemon-reload && systemctl --user enable --now \
                 agent-host`"
            ),
        ),
        (Some(why), Platform::Launchd) => (
            false,
            false,
            format!(
                "launchctl is not available ({why}); load it with `launchctl bootstrap {} {}`",
                gui_domain(),
                path.display()
            ),
        ),
        (None, Platform::Systemd) => {
            ran.push(manager.run(&["daemon-reload"]));
            let enable: &[&str] = if running {
                &["enable", UNIT_NAME]
            } else if replaced {
                // The new unit's settings take effect: restart what ran under the old one.
                ran.push(manager.run(&["enable", UNIT_NAME]));
                &["restart", UNIT_NAME]
            } else {
                &["enable", "--now", UNIT_NAME]
            };
            ran.push(manager.run(enable));
            let ok = ran.iter().all(|r| r.ok);
            (
                ok,
                ok && !running,
                if running {
                    "a host is already running, not under the service: it keeps running; the \
                     service starts it at the next login, or now after `agent-host \
                     host.shutdown && systemctl --user start agent-host`"
                        .to_owned()
                } else {
                    "systemctl --user status agent-host".to_owned()
                },
            )
        }
        (None, Platform::Launchd) => {
            let domain = gui_domain();
            if replaced {
                // Not loaded is fine here: the new file is loaded next.
                let _unloaded = manager.run(&["bootout", &format!("{domain}/{LAUNCHD_LABEL}")]);
            }
            let path_text = path.display().to_string();
            ran.push(manager.run(&["bootstrap", &domain, &path_text]));
            let ok = ran.iter().all(|r| r.ok);
            (
                ok,
                ok && !running,
                "launchctl print ".to_owned() + &domain + "/" + LAUNCHD_LABEL,
            )
        }
    };
    let data = json!({
        "platform": platform.name(),
        "path": path.display().to_string(),
        "replaced": replaced,
        "content": text,
        "exec": spec.exe.display().to_string(),
        "args": HOST_ARGS,
        "environment": spec.environment().iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        "env_file": (platform == Platform::Systemd).then(|| spec.env_file().display().to_string()),
        "manager": {
            "available": unavailable.is_none(),
            "reason": unavailable,
            "ran": ran.iter().map(Ran::json).collect::<Vec<_>>(),
        },
        "enabled": enabled,
        "started": started,
        "next": next,
        "logs": logs(platform, config),
    });
    if unavailable.is_none() && !enabled {
        let failure = ran
            .iter()
            .find(|r| !r.ok)
            .map_or("failed", |r| first_line(&r.output));
        return failed(
            format!(
                "wrote {} but the service manager refused it: {failure}",
                path.display()
            ),
            &path,
            data,
        );
    }
    Reply::ok(data)
}

/// `default.target.wants/agent-host.service` beside the unit: `systemctl enable`'s link.
fn wants_link(unit: &Path) -> Option<PathBuf> {
    Some(unit.parent()?.join("default.target.wants").join(UNIT_NAME))
}

fn uninstall_on(platform: Platform, config: &Config) -> Reply {
    let path = match unit_path(platform, config) {
        Ok(path) => path,
        Err(e) => return failed(e, Path::new(""), Value::Null),
    };
    match found(&path) {
        Ok(Found::Ours) => {}
        Ok(Found::Missing) => {
            return Reply::ok(json!({
                "platform": platform.name(),
                "path": path.display().to_string(),
                "installed": false,
                "removed": [],
            }));
        }
        Ok(Found::Foreign) => {
            return failed(
                format!(
                    "{} was not written by `agent-host service install`: it is left as it is",
                    path.display()
                ),
                &path,
                Value::Null,
            );
        }
        Err(e) => {
            return failed(
                format!("cannot read {}: {e}", path.display()),
                &path,
                Value::Null,
            );
        }
    }
    let manager = Manager::of(platform, config);
    let unavailable = manager.unavailable();
    let mut ran = Vec::new();
    if unavailable.is_none() {
        // Stop and disable first, so the manager forgets it before its file goes.
        ran.push(match platform {
            Platform::Systemd => manager.run(&["disable", "--now", UNIT_NAME]),
            Platform::Launchd => {
                manager.run(&["bootout", &format!("{}/{LAUNCHD_LABEL}", gui_domain())])
            }
        });
    }
    let mut removed = Vec::new();
    let mut remove = |file: &Path| -> Result<(), Reply> {
        match std::fs::remove_file(file) {
            Ok(()) => {
                removed.push(file.display().to_string());
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed(
                format!("cannot remove {}: {e}", file.display()),
                file,
                Value::Null,
            )),
        }
    };
    if platform == Platform::Systemd
        && let Some(link) = wants_link(&path)
        // `enable`'s link, when no manager was there to `disable` it: ours only if it points
        // at our unit.
        && std::fs::read_link(&link).is_ok_and(|target| target == path)
        && let Err(reply) = remove(&link)
    {
        return reply;
    }
    if let Err(reply) = remove(&path) {
        return reply;
    }
    if platform == Platform::Systemd {
        // The directories install made (or that held only our files), when empty now:
        // `remove_dir` removes nothing else.
        let unit_dir = path.parent();
        let dirs = [
            wants_link(&path)
                .as_deref()
                .and_then(Path::parent)
                .map(Path::to_owned),
            unit_dir.map(Path::to_owned),
            unit_dir.and_then(Path::parent).map(Path::to_owned),
        ];
        for dir in dirs.into_iter().flatten() {
            if std::fs::remove_dir(&dir).is_ok() {
                removed.push(format!("{}/", dir.display()));
            }
        }
        if unavailable.is_none() {
            ran.push(manager.run(&["daemon-reload"]));
        }
    }
    tracing::info!(path = %path.display(), "service file removed");
    Reply::ok(json!({
        "platform": platform.name(),
        "path": path.display().to_string(),
        "installed": false,
        "removed": removed,
        "manager": {
            "available": unavailable.is_none(),
            "reason": unavailable,
            "ran": ran.iter().map(Ran::json).collect::<Vec<_>>(),
        },
    }))
}

/// The value of `Key=` on a line of the unit (the first), for `status`.
fn unit_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
}

fn status_on(platform: Platform, config: &Config) -> Reply {
    let path = match unit_path(platform, config) {
        Ok(path) => path,
        Err(e) => return failed(e, Path::new(""), Value::Null),
    };
    let text = std::fs::read_to_string(&path).ok();
    let ours = matches!(found(&path), Ok(Found::Ours));
    let manager = Manager::of(platform, config);
    let unavailable = manager.unavailable();
    let manager_state = match (&unavailable, platform) {
        (Some(_), _) => Value::Null,
        (None, Platform::Systemd) => {
            let word = |args: &[&str]| {
                let ran = manager.run(args);
                first_line(&ran.output).to_owned()
            };
            let show = manager.run(&[
                "show",
                UNIT_NAME,
                "--property=ActiveState,SubState,MainPID,NRestarts,Result",
            ]);
            let props: serde_json::Map<String, Value> = show
                .output
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
                .collect();
            json!({
                "enabled": word(&["is-enabled", UNIT_NAME]),
                "active": word(&["is-active", UNIT_NAME]),
                "properties": props,
            })
        }
        (None, Platform::Launchd) => {
            let ran = manager.run(&["print", &format!("{}/{LAUNCHD_LABEL}", gui_domain())]);
            json!({"loaded": ran.ok})
        }
    };
    let host = match crate::ipc::request_blocking(
        &config.ipc_path(),
        &json!({"command": "host.status"}),
        Duration::from_secs(10),
    ) {
        Ok(reply) if reply.is_ok() => reply.data,
        Ok(reply) => json!({"running": false, "error": reply.message}),
        Err(_) => {
            let held = crate::instance::lock_held(&config.lock_path()).unwrap_or(false);
            json!({"running": held, "responsive": false})
        }
    };
    Reply::ok(json!({
        "platform": platform.name(),
        "path": path.display().to_string(),
        "installed": text.is_some(),
        "ours": ours,
        "exec_start": text.as_deref().and_then(|t| unit_value(t, "ExecStart")),
        "manager": {
            "available": unavailable.is_none(),
            "reason": unavailable,
            "state": manager_state,
        },
        "host": host,
        "logs": logs(platform, config),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            exe: PathBuf::from("/opt/agent host/bin/agent-hostd"),
            home: PathBuf::from("/home/u/.agent-host"),
            home_env: Some(PathBuf::from("/home/u/.agent-host")),
            path_env: Some("/home/u/.npm/bin:/usr/bin:/bin:/odd%dir".to_owned()),
        }
    }

    #[test]
    fn the_unit_runs_the_host_in_the_foreground_with_the_shells_path() {
        let unit = systemd_unit(&spec()).unwrap();
        assert!(unit.starts_with(&format!("# {MARKER}\n")), "{unit}");
        assert!(
            unit.contains(
                "ExecStart=\"/opt/agent host/bin/agent-hostd\" \"host.start\" \
                 \"{\\\"foreground\\\":true}\"\n"
            ),
            "{unit}"
        );
        assert!(unit.contains("Restart=on-failure\n"), "{unit}");
        assert!(
            unit.contains("Environment=\"PATH=/home/u/.npm/bin:/usr/bin:/bin:/odd%%dir\"\n"),
            "{unit}"
        );
        assert!(
            unit.contains("Environment=\"AGENT_HOST_HOME=/home/u/.agent-host\"\n"),
            "{unit}"
        );
        assert!(
            unit.contains("EnvironmentFile=-/home/u/.agent-host/service.env\n"),
            "{unit}"
        );
        assert!(
            unit.ends_with("[Install]\nWantedBy=default.target\n"),
            "{unit}"
        );
        let bare = Spec {
            home_env: None,
            path_env: None,
            ..spec()
        };
        let unit = systemd_unit(&bare).unwrap();
        assert!(!unit.contains("Environment=\""), "{unit}");
        let bad = Spec {
            path_env: Some("/a\n[Service]".to_owned()),
            ..spec()
        };
        assert!(systemd_unit(&bad).is_err());
    }

    #[test]
    fn the_plist_is_escaped_and_restarts_on_failure() {
        let mut s = spec();
        s.path_env = Some("/a&b:/<c>".to_owned());
        let plist = launchd_plist(&s);
        assert!(plist.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!-- Written"));
        assert!(plist.contains("<string>dev.agent-host</string>"), "{plist}");
        assert!(
            plist.contains(
                "<string>/opt/agent host/bin/agent-hostd</string>\n\t\t<string>host.start</string>\n\t\t<string>{&quot;foreground&quot;:true}</string>"
            ),
            "{plist}"
        );
        assert!(
            plist.contains("<key>PATH</key>\n\t\t<string>/a&amp;b:/&lt;c&gt;</string>"),
            "{plist}"
        );
        assert!(
            plist.contains("<key>SuccessfulExit</key>\n\t\t<false/>"),
            "{plist}"
        );
        assert!(
            plist.contains("<string>/home/u/.agent-host/logs/launchd.log</string>"),
            "{plist}"
        );
        // A comment may not hold `--`; the marker is still found in it.
        let comment = plist.lines().nth(1).unwrap();
        assert!(!comment[4..comment.len() - 3].contains("--"), "{comment}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.plist");
        std::fs::write(&file, &plist).unwrap();
        assert_eq!(found(&file).unwrap(), Found::Ours);
        std::fs::write(&file, "<plist/>").unwrap();
        assert_eq!(found(&file).unwrap(), Found::Foreign);
        assert_eq!(found(&dir.path().join("none")).unwrap(), Found::Missing);
    }

    #[test]
    fn actions_are_three_words() {
        assert_eq!(Action::parse(Some("install")), Ok(Action::Install));
        assert_eq!(Action::parse(Some("status")), Ok(Action::Status));
        assert!(Action::parse(Some("start")).is_err());
        assert!(Action::parse(None).is_err());
    }
}
