//! `agent-host doctor`: what stands between this machine and a working host, one check at a
//! time, each with a verdict (`ok`, `warn`, `fail`) and, when it is not ok, what to do.
//!
//! The checks: the home and its modes (0700; `host.sock`, `ws.sock` and `host.db` 0600), `config.toml`,
//! the lock and a live host, the store's integrity, each agent type's binary and version
//! against the versions the tests pin (`agents/package.json`, built in), the variables each
//! agent's own configuration names (present or not — names only, never a value), the relay,
//! and the free space near the database.
//!
//! Why a command of the full binary and not of the host: it must work exactly when the host
//! does not (none running, a stale or unresponsive one, a database it refuses), and it looks
//! at files the way their owner sees them. What only a live host knows — its store's health,
//! its relay connection, the agents as its environment finds them — it asks over IPC
//! (`host.status`, `agent.list`); without a host it uses this process's configuration.
//!
//! Invariants: it changes nothing. The database is checked on a read-only connection of its
//! own (`store::check_file`), never opened by the store, so a host that holds it is not
//! disturbed and a corrupt file is not written; the probes are `agent.list`'s. A check never
//! reports a variable's value. The reply is `{checks: [{name, verdict, detail, fix?}], ok}`,
//! an error (`checks_failed`) exactly when a check failed.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use crate::adapter::family::Vars;
use crate::config::{Config, ConfigError};
use crate::protocol::envelope::{ErrorCode, Reply};

/// How long the host may take to answer `host.status`.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the host may take to answer `agent.list` (its probes run in parallel, each bounded
/// by the adapter's own probe timeout).
const AGENTS_TIMEOUT: Duration = Duration::from_secs(40);
/// Below this much free space near the database, a check fails: a commit may not fit.
const DISK_FAIL_BYTES: u64 = 100 * 1024 * 1024;
/// Below this, it warns.
const DISK_WARN_BYTES: u64 = 1024 * 1024 * 1024;

/// The agent CLIs' versions the tests run, as `agents/package.json` pins them.
const PINS_JSON: &str = include_str!("../agents/package.json");

/// The npm package of each built-in agent type's CLI (the pin is read from [`PINS_JSON`]).
const PACKAGES: &[(&str, &str)] = &[
    ("claude", "@anthropic-ai/claude-code"),
    ("codex", "@openai/codex"),
    ("acp", "@agentclientprotocol/claude-agent-acp"),
    ("gemini", "@google/gemini-cli"),
    ("gemini-acp", "@google/gemini-cli"),
    ("opencode", "opencode-ai"),
];

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub detail: String,
    /// What to do about it (when not ok).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            verdict: Verdict::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(name: impl Into<String>, detail: impl Into<String>, fix: Option<String>) -> Check {
        Check {
            name: name.into(),
            verdict: Verdict::Warn,
            detail: detail.into(),
            fix,
        }
    }

    fn fail(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            verdict: Verdict::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// The report as a reply: `checks_failed` exactly when a check failed.
pub fn reply(checks: &[Check]) -> Reply {
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| c.name.as_str())
        .collect();
    let data = json!({"checks": checks, "ok": failed.is_empty()});
    if failed.is_empty() {
        Reply::ok(data)
    } else {
        Reply::error(
            ErrorCode::ChecksFailed,
            format!(
                "{} of {} checks failed: {}",
                failed.len(),
                checks.len(),
                failed.join(", ")
            ),
            data,
        )
    }
}

/// Run every check for `home`, with its configuration (or why it could not be read).
pub async fn run(home: &Path, config: Result<Config, ConfigError>) -> Reply {
    let mut checks = vec![check_home(home)];
    let config = match config {
        Ok(config) => {
            checks.push(check_config(home));
            Some(config)
        }
        Err(e) => {
            checks.push(Check::fail(
                "config",
                e.to_string(),
                format!(
                    "fix {} (agents, credentials and the relay are checked once it reads)",
                    home.join("config.toml").display()
                ),
            ));
            None
        }
    };
    let host = Host::find(home).await;
    checks.push(check_socket(home, &host));
    checks.push(private_file(
        "ws.sock",
        &home.join("ws.sock"),
        true,
        Check::ok("ws.sock", "no socket: no host running"),
    ));
    checks.push(check_db_modes(home));
    checks.push(host.check());
    checks.push(check_store(home, &host));
    if let Some(config) = &config {
        checks.extend(check_agents(config, &host).await);
        checks.extend(check_credentials(config));
        checks.push(check_relay(config, &host));
        checks.push(check_fleet(config, &host));
    }
    checks.push(check_disk(home));
    reply(&checks)
}

fn mode(meta: &std::fs::Metadata) -> u32 {
    meta.permissions().mode() & 0o7777
}

fn check_home(home: &Path) -> Check {
    let shown = home.display();
    match std::fs::metadata(home) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Check::warn(
            "home",
            format!("{shown} does not exist yet"),
            Some("`agent-host host.start` creates it (0700)".to_owned()),
        ),
        Err(e) => Check::fail(
            "home",
            format!("cannot read {shown}: {e}"),
            format!("make {shown} a directory this user owns, mode 0700"),
        ),
        Ok(meta) if !meta.is_dir() => Check::fail(
            "home",
            format!("{shown} is not a directory"),
            format!("move {shown} aside, or set AGENT_HOST_HOME to another place"),
        ),
        Ok(meta) if meta.uid() != nix::unistd::geteuid().as_raw() => Check::fail(
            "home",
            format!("{shown} belongs to uid {}, not to this user", meta.uid()),
            "chown the directory to this user, or set AGENT_HOST_HOME",
        ),
        Ok(meta) if mode(&meta) != 0o700 => Check::fail(
            "home",
            format!(
                "{shown} is {:04o}: others may reach the socket, the database and the logs",
                mode(&meta)
            ),
            format!("chmod 700 {shown}"),
        ),
        Ok(_) => Check::ok("home", format!("{shown} is 0700")),
    }
}

fn check_config(home: &Path) -> Check {
    let path = home.join("config.toml");
    match std::fs::metadata(&path) {
        Ok(meta) if mode(&meta) & 0o077 != 0 => Check::warn(
            "config",
            format!(
                "{} reads, but is {:04o}: it may hold the relay token and agents' env values",
                path.display(),
                mode(&meta)
            ),
            Some(format!("chmod 600 {}", path.display())),
        ),
        Ok(_) => Check::ok("config", format!("{} reads", path.display())),
        Err(_) => Check::ok("config", "no config.toml: the defaults"),
    }
}

/// A private file's check: missing is `missing`'s verdict; present, it must be what `kind`
/// says and mode 0600 (no bits for group or others).
fn private_file(name: &str, path: &Path, socket: bool, missing: Check) -> Check {
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing,
        Err(e) => Check::fail(
            name,
            format!("cannot read {shown}: {e}"),
            "check the home's ownership",
        ),
        Ok(meta) if socket && !meta.file_type().is_socket() => Check::fail(
            name,
            format!("{shown} is not a socket"),
            format!("stop the host, remove {shown} and start again"),
        ),
        Ok(meta) if !socket && !meta.is_file() => Check::fail(
            name,
            format!("{shown} is not a regular file"),
            format!("stop the host and move {shown} aside"),
        ),
        Ok(meta) if mode(&meta) & 0o077 != 0 => Check::fail(
            name,
            format!(
                "{shown} is {:04o}: other users may {}",
                mode(&meta),
                if socket {
                    "connect and drive the host"
                } else {
                    "read every conversation"
                }
            ),
            format!("chmod 600 {shown}"),
        ),
        Ok(meta) if meta.uid() != nix::unistd::geteuid().as_raw() => Check::fail(
            name,
            format!("{shown} belongs to uid {}, not to this user", meta.uid()),
            format!("stop the host and chown {shown} to this user"),
        ),
        Ok(meta) => Check::ok(name, format!("{shown} is {:04o}", mode(&meta))),
    }
}

fn check_socket(home: &Path, host: &Host) -> Check {
    let missing = if host.lock_held {
        Check::fail(
            "host.sock",
            "a host holds the lock but its socket is gone",
            "agent-host host.shutdown (it signals the pid), then agent-host host.start",
        )
    } else {
        Check::ok("host.sock", "no socket: no host running")
    };
    private_file(
        "host.sock",
        &crate::config::ipc_path_in(home),
        true,
        missing,
    )
}

fn check_db_modes(home: &Path) -> Check {
    let db = home.join("host.db");
    let main = private_file(
        "host.db",
        &db,
        false,
        Check::ok(
            "host.db",
            "no database yet: the first start creates it (0600)",
        ),
    );
    if main.verdict != Verdict::Ok {
        return main;
    }
    // The WAL and its index hold the newest commits: the same secrecy.
    for suffix in ["-wal", "-shm"] {
        let path = PathBuf::from(format!("{}{suffix}", db.display()));
        let side = private_file("host.db", &path, false, main.clone());
        if side.verdict != Verdict::Ok {
            return side;
        }
    }
    main
}

/// What the lock file and the socket say of a host.
struct Host {
    lock_path: PathBuf,
    lock_held: bool,
    lock_error: Option<String>,
    info: Option<crate::instance::LockInfo>,
    /// `host.status`'s data, when a host answered.
    status: Option<Value>,
    /// Why it did not answer.
    ipc_error: Option<String>,
    ipc_path: PathBuf,
}

impl Host {
    async fn find(home: &Path) -> Host {
        let lock_path = home.join("host.lock");
        let (lock_held, lock_error) = match crate::instance::lock_held(&lock_path) {
            Ok(held) => (held, None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (false, None),
            Err(e) => (false, Some(e.to_string())),
        };
        let info = crate::instance::read_lock_info(&lock_path);
        let ipc_path = crate::config::ipc_path_in(home);
        let (status, ipc_error) = match crate::ipc::request(
            &ipc_path,
            &json!({"command": "host.status"}),
            STATUS_TIMEOUT,
        )
        .await
        {
            Ok(reply) if reply.is_ok() => (Some(reply.data), None),
            Ok(reply) => (None, Some(reply.message)),
            Err(e) => (None, Some(e.to_string())),
        };
        Host {
            lock_path,
            lock_held,
            lock_error,
            info,
            status,
            ipc_error,
            ipc_path,
        }
    }

    fn check(&self) -> Check {
        let pid = self
            .info
            .as_ref()
            .map_or_else(|| "?".to_owned(), |i| i.pid.to_string());
        if let Some(e) = &self.lock_error {
            return Check::fail(
                "host",
                format!("cannot read {}: {e}", self.lock_path.display()),
                "check the home's ownership and modes",
            );
        }
        match (&self.status, self.lock_held) {
            (Some(status), _) => {
                let version = status["version"].as_str().unwrap_or("?");
                let pid = status["pid"].as_u64().map_or(pid, |p| p.to_string());
                if version != crate::VERSION {
                    return Check::warn(
                        "host",
                        format!(
                            "pid {pid} answers, but runs version {version} and this binary is {}",
                            crate::VERSION
                        ),
                        Some(
                            "restart it to run this build: agent-host host.shutdown, then \
                             agent-host host.start (or systemctl --user restart agent-host)"
                                .to_owned(),
                        ),
                    );
                }
                Check::ok(
                    "host",
                    format!(
                        "pid {pid} holds the lock and answers on {}",
                        self.ipc_path.display()
                    ),
                )
            }
            (None, true) => Check::fail(
                "host",
                format!(
                    "pid {pid} holds the lock but does not answer on {} ({})",
                    self.ipc_path.display(),
                    self.ipc_error.as_deref().unwrap_or("no answer")
                ),
                format!(
                    "agent-host host.shutdown (it signals pid {pid}); if that fails, kill {pid}"
                ),
            ),
            (None, false) => {
                let stale = self
                    .info
                    .as_ref()
                    .map(|i| {
                        format!(
                            " (a stale lock of pid {}: the next start takes it over)",
                            i.pid
                        )
                    })
                    .unwrap_or_default();
                Check::warn(
                    "host",
                    format!("no host is running{stale}"),
                    Some("agent-host host.start, or agent-host service install".to_owned()),
                )
            }
        }
    }

    fn store_health(&self) -> Option<&Value> {
        self.status.as_ref()?.get("store")
    }
}

fn check_store(home: &Path, host: &Host) -> Check {
    let db = home.join("host.db");
    if !db.exists() {
        return Check::ok("store", "no database yet");
    }
    match crate::store::check_file(&db) {
        Ok(()) => {}
        Err(crate::store::StoreError::Corrupt { detail, .. }) => {
            return Check::fail(
                "store",
                format!("{} fails SQLite's quick_check: {detail}", db.display()),
                format!(
                    "stop the host, move {0} aside (or recover it: sqlite3 {0} .recover) and \
                     start again",
                    db.display()
                ),
            );
        }
        Err(e) => {
            return Check::fail(
                "store",
                format!("cannot check {}: {e}", db.display()),
                "check the file's owner and modes",
            );
        }
    }
    match host.store_health() {
        Some(health) if health["state"] != json!("ok") => Check::warn(
            "store",
            format!(
                "the file passes quick_check, but the host cannot commit: {}",
                health["error"].as_str().unwrap_or("degraded")
            ),
            Some("free space on its disk; the host retries by itself".to_owned()),
        ),
        _ => Check::ok("store", format!("{} passes quick_check", db.display())),
    }
}

/// The version `agents/package.json` pins for `agent_type`'s CLI, with its package.
fn pinned(agent_type: &str) -> Option<(&'static str, String)> {
    let package = PACKAGES
        .iter()
        .find(|(t, _)| *t == agent_type)
        .map(|(_, p)| *p)?;
    let pins: Value = serde_json::from_str(PINS_JSON).ok()?;
    let pin = pins["dependencies"][package].as_str()?.to_owned();
    Some((package, pin))
}

/// One agent type's line from its `agent.list` entry. `configured`: the user named its binary
/// (a missing one is then a failure, not an agent simply not installed).
fn agent_check(entry: &Value, configured: bool, config_path: &Path, seen_by: &str) -> Check {
    let agent_type = entry["agent_type"].as_str().unwrap_or("?");
    let name = format!("agent {agent_type}");
    let binary = entry["binary"].as_str().unwrap_or("?");
    let version = entry["version"].as_str();
    let pin = pinned(agent_type);
    let install = pin
        .as_ref()
        .map(|(package, pin)| format!("npm install -g {package}@{pin}"));
    if entry["usable"] == json!(true) {
        return match (version, &pin) {
            (Some(v), Some((_, pin))) if v == pin => Check::ok(
                name,
                format!("{binary} {v}, the version the tests pin{seen_by}"),
            ),
            (Some(v), Some((_, pin))) => Check::warn(
                name,
                format!("{binary} {v}; the tests pin {pin}{seen_by}"),
                install.map(|i| format!("for the tested version: {i}")),
            ),
            (Some(v), None) => Check::ok(name, format!("{binary} {v}{seen_by}")),
            (None, _) => Check::ok(name, format!("{binary} runs (no version told){seen_by}")),
        };
    }
    let reason = entry["reason"].as_str().unwrap_or("not usable");
    let missing = entry["error"] == json!("binary_unavailable");
    if missing && !configured {
        return Check::warn(
            name,
            format!(
                "not installed: no {binary} on PATH; needed only for {agent_type} sessions{seen_by}"
            ),
            install,
        );
    }
    let fix = if missing {
        format!(
            "point [agents.{agent_type}] in {} at an executable (or install it there{})",
            config_path.display(),
            install.map(|i| format!(": {i}")).unwrap_or_default()
        )
    } else {
        format!(
            "run `{binary}` by hand to see why it fails{}",
            install
                .map(|i| format!("; the tested version: {i}"))
                .unwrap_or_default()
        )
    };
    Check::fail(name, format!("{reason}{seen_by}"), fix)
}

async fn check_agents(config: &Config, host: &Host) -> Vec<Check> {
    // The live host's view when there is one: its environment finds the binaries its
    // sessions will run (a service's PATH may not be this shell's).
    let from_host = if host.status.is_some() {
        match crate::ipc::request(
            &config.ipc_path(),
            &json!({"command": "agent.list"}),
            AGENTS_TIMEOUT,
        )
        .await
        {
            Ok(reply) if reply.is_ok() => Some(reply.data),
            _ => None,
        }
    } else {
        None
    };
    let (report, seen_by) = match from_host {
        Some(report) => (report, " (as the running host finds it)"),
        None => (crate::adapter::agents_report(config).await, ""),
    };
    let config_path = config.home.join("config.toml");
    let (defs, _) = crate::adapter::launch::agent_defs(config);
    let mut checks: Vec<Check> = report["agents"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|entry| {
            let configured = entry["agent_type"]
                .as_str()
                .and_then(|t| defs.get(t))
                .is_some_and(|def| def.registered || def.binary.is_some());
            agent_check(entry, configured, &config_path, seen_by)
        })
        .collect();
    for bad in report["invalid"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let agent_type = bad["agent_type"].as_str().unwrap_or("?");
        checks.push(Check::fail(
            format!("agent {agent_type}"),
            bad["reason"].as_str().unwrap_or("invalid").to_owned(),
            format!("fix [agents.{agent_type}] in {}", config_path.display()),
        ));
    }
    checks
}

/// The variables each agent's own configuration names, as this process's environment and
/// `config.toml` have them (a host run as a service has its unit's environment instead).
fn check_credentials(config: &Config) -> Vec<Check> {
    let (defs, _) = crate::adapter::launch::agent_defs(config);
    let config_path = config.home.join("config.toml");
    let mut checks = Vec::new();
    for (agent_type, def) in &defs {
        let own = |name: &str| {
            def.env
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let lookup = |name: &str| own(name).or_else(|| config.env_var(name).map(str::to_owned));
        let named = def.family.config_env(&Vars::new(&lookup));
        if named.is_empty() {
            continue;
        }
        let mut missing = Vec::new();
        let mut present = Vec::new();
        for var in &named {
            let set = |v: Option<String>| v.is_some_and(|v| !v.trim().is_empty());
            if set(own(&var.name)) {
                present.push(format!("{} (config.toml)", var.name));
            } else if set(config.env_var(&var.name).map(str::to_owned)) {
                present.push(format!("{} (environment)", var.name));
            } else {
                missing.push(format!("{} ({})", var.name, var.named_by));
            }
        }
        let name = format!("credentials {agent_type}");
        if missing.is_empty() {
            checks.push(Check::ok(name, format!("set: {}", present.join(", "))));
        } else {
            checks.push(Check::warn(
                name,
                format!(
                    "not set: {}{}",
                    missing.join(", "),
                    if present.is_empty() {
                        String::new()
                    } else {
                        format!("; set: {}", present.join(", "))
                    }
                ),
                Some(format!(
                    "export it where the host starts (a service: {}), or set it under \
                     [agents.{agent_type}] env in {}",
                    config.home.join(crate::service::ENV_FILE).display(),
                    config_path.display()
                )),
            ));
        }
    }
    if checks.is_empty() {
        checks.push(Check::ok(
            "credentials",
            "no agent's own configuration names a variable",
        ));
    }
    checks
}

fn check_relay(config: &Config, host: &Host) -> Check {
    let config_path = config.home.join("config.toml");
    let fix = format!(
        "fix [relay] in {} (or agent-host host.relay.set)",
        config_path.display()
    );
    if let Some(relay) = host.status.as_ref().and_then(|s| s.get("relay")) {
        let url = relay["url"].as_str().unwrap_or("?");
        let last = relay["last_error"]
            .as_str()
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        return match relay["state"].as_str().unwrap_or("?") {
            "disabled" => Check::ok("relay", "not configured"),
            "connected" => Check::ok("relay", format!("connected to {url}")),
            "misconfigured" => Check::fail("relay", format!("{url} cannot work{last}"), fix),
            state => Check::warn(
                "relay",
                format!(
                    "{url}: {state}, {} failed attempts{last}",
                    relay["retries"].as_u64().unwrap_or(0)
                ),
                Some(
                    "check that the relay is up and reachable from here, and its token; the \
                     host keeps retrying"
                        .to_owned(),
                ),
            ),
        };
    }
    match &config.relay {
        None => Check::ok("relay", "not configured"),
        Some(relay) => match crate::relay::client::check(relay) {
            Ok(()) => Check::ok(
                "relay",
                format!("{} configured; dialed when the host runs", relay.url),
            ),
            Err(e) => Check::fail("relay", format!("{}: {e}", relay.url), fix),
        },
    }
}

/// The sealed relay fleet (`[fleet]`): from the running host, whether a round trip came back
/// through some relay lately, and which relays did not; else whether the configuration can
/// work. A fleet that is connected but carries nothing is `degraded` in the host, a warning here.
fn check_fleet(config: &Config, host: &Host) -> Check {
    let fix = format!(
        "fix [fleet] in {}",
        config.home.join("config.toml").display()
    );
    if let Some(fleet) = host.status.as_ref().and_then(|s| s.get("fleet")) {
        let last = fleet["last_error"]
            .as_str()
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        // The relays that are not well, by URL: what a user should look at first.
        let unwell: Vec<String> = fleet["relays"]
            .as_array()
            .map(|relays| {
                relays
                    .iter()
                    .filter(|r| matches!(r["state"].as_str(), Some("degraded" | "unreachable")))
                    .map(|r| {
                        format!(
                            "{} {}",
                            r["url"].as_str().unwrap_or("?"),
                            r["state"].as_str().unwrap_or("?")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let others = if unwell.is_empty() {
            String::new()
        } else {
            format!(" ({})", unwell.join(", "))
        };
        let url = fleet["url"].as_str().unwrap_or("?");
        return match fleet["state"].as_str().unwrap_or("?") {
            "disabled" => Check::ok("fleet", "not configured"),
            "connected" => Check::ok(
                "fleet",
                format!(
                    "connected to {url}, round trip {} ms{others}",
                    fleet["round_trip_ms"].as_u64().unwrap_or(0)
                ),
            ),
            "misconfigured" => Check::fail("fleet", format!("{url} cannot work{last}"), fix),
            state => Check::warn(
                "fleet",
                format!("{state}: no round trip through a relay now{others}{last}"),
                Some(
                    "check that the relays and their NATS are up and reachable from here, and \
                     the host token; the host keeps trying each URL"
                        .to_owned(),
                ),
            ),
        };
    }
    match &config.fleet {
        None => Check::ok("fleet", "not configured"),
        Some(fleet) => match crate::relay::fleet::check(fleet) {
            Ok(()) => Check::ok(
                "fleet",
                format!(
                    "{} relay URL(s) configured; dialed when the host runs",
                    fleet.urls.len()
                ),
            ),
            Err(e) => Check::fail("fleet", e.to_string(), fix),
        },
    }
}

/// Bytes for people: `1.5 GiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn check_disk(home: &Path) -> Check {
    // The home, or the nearest directory above it that exists (where it will be made).
    let Some(dir) = home.ancestors().find(|p| p.is_dir()) else {
        return Check::warn("disk", "no directory of the home exists", None);
    };
    let stat = match nix::sys::statvfs::statvfs(dir) {
        Ok(stat) => stat,
        Err(e) => {
            return Check::warn(
                "disk",
                format!("cannot statvfs {}: {e}", dir.display()),
                None,
            );
        }
    };
    #[allow(
        clippy::useless_conversion,
        reason = "u64 on Linux, narrower types elsewhere (macOS)"
    )]
    let free = u64::from(stat.blocks_available()).saturating_mul(u64::from(stat.fragment_size()));
    let db = std::fs::metadata(home.join("host.db")).map_or(0, |m| m.len());
    let detail = format!(
        "{} free on the filesystem of {} (host.db: {})",
        size(free),
        dir.display(),
        size(db)
    );
    let fix = "free space there: the host stops taking new work when a commit does not fit \
               (`session.delete` removes old sessions)";
    if free < DISK_FAIL_BYTES {
        Check::fail("disk", detail, fix)
    } else if free < DISK_WARN_BYTES {
        Check::warn("disk", detail, Some(fix.to_owned()))
    } else {
        Check::ok("disk", detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_a_pinned_cli() {
        for family in crate::adapter::family::FAMILIES {
            let agent_type = family.descriptor().agent_type;
            let (package, pin) = pinned(agent_type)
                .unwrap_or_else(|| panic!("{agent_type}: no pin in agents/package.json"));
            assert!(!package.is_empty() && !pin.is_empty(), "{agent_type}");
        }
        assert_eq!(
            pinned("claude").map(|(p, _)| p),
            Some("@anthropic-ai/claude-code")
        );
        assert_eq!(pinned("my-registered-agent"), None);
    }

    fn entry(usable: bool, version: Option<&str>, error: Option<&str>) -> Value {
        json!({
            "agent_type": "claude", "binary": "/bin/claude", "usable": usable,
            "version": version, "error": error, "reason": "why",
        })
    }

    #[test]
    fn agent_verdicts_follow_the_pin_and_the_configuration() {
        let pin = pinned("claude").unwrap().1;
        let path = Path::new("/h/config.toml");
        let v = |e: &Value, configured| agent_check(e, configured, path, "").verdict;
        assert_eq!(v(&entry(true, Some(&pin), None), false), Verdict::Ok);
        assert_eq!(v(&entry(true, Some("0.0.1"), None), false), Verdict::Warn);
        assert_eq!(
            v(&entry(false, None, Some("binary_unavailable")), false),
            Verdict::Warn
        );
        let configured = agent_check(
            &entry(false, None, Some("binary_unavailable")),
            true,
            path,
            "",
        );
        assert_eq!(configured.verdict, Verdict::Fail);
        assert!(
            configured
                .fix
                .as_deref()
                .unwrap()
                .contains("[agents.claude]"),
            "{configured:?}"
        );
        assert_eq!(
            v(&entry(false, None, Some("agent_failed")), false),
            Verdict::Fail
        );
    }

    #[test]
    fn the_reply_fails_exactly_when_a_check_does() {
        let ok = reply(&[Check::ok("a", "fine"), Check::warn("b", "meh", None)]);
        assert!(ok.is_ok());
        assert_eq!(ok.data["ok"], json!(true));
        assert_eq!(ok.data["checks"][1]["verdict"], json!("warn"));
        assert!(ok.data["checks"][0].get("fix").is_none());
        let bad = reply(&[
            Check::ok("a", "fine"),
            Check::fail("c", "broken", "mend it"),
        ]);
        assert_eq!(bad.error_code(), Some(ErrorCode::ChecksFailed));
        assert_eq!(bad.data["ok"], json!(false));
        assert_eq!(bad.data["checks"][1]["fix"], json!("mend it"));
        assert!(
            bad.message.contains("1 of 2 checks failed: c"),
            "{}",
            bad.message
        );
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }

    #[test]
    fn a_world_readable_socket_fails_with_a_chmod() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("host.db");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let missing = Check::ok("host.db", "none");
        let c = private_file("host.db", &file, false, missing.clone());
        assert_eq!(c.verdict, Verdict::Fail);
        assert_eq!(c.fix, Some(format!("chmod 600 {}", file.display())));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            private_file("host.db", &file, false, missing.clone()).verdict,
            Verdict::Ok
        );
        assert_eq!(
            private_file("host.db", &dir.path().join("nope"), false, missing.clone()),
            missing
        );
        assert_eq!(
            private_file("host.sock", &file, true, missing).verdict,
            Verdict::Fail
        );
    }
}
