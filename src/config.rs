//! Paths and settings. Environment variables are read here and only here, once, when a
//! [`Config`] is built; every other module receives the values it needs.
//!
//! Variables: `AGENT_HOST_HOME`, `AGENT_HOST_LOG` (log filter), `RUST_LOG` (the same, when
//! `AGENT_HOST_LOG` is not set), `AGENT_HOST_IPC_TIMEOUT_MS`, `AGENT_HOST_WS_PORT`.
//!
//! `$AGENT_HOST_HOME` (default `~/.agent-host`) holds `host.lock`, `host.sock`, `ws.sock`, `host.db`,
//! `config.toml` and `logs/` (design §3). The directory is created with mode 0700.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::protocol::scope::Scope;

/// Why the configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot find a home directory: set AGENT_HOST_HOME or HOME")]
    NoHome,
    #[error("cannot create or secure {path}: {source}")]
    Home {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("{path} is not valid: queue_capacity must be between 1 and {max}, not {value}", max = MAX_QUEUE_CAPACITY)]
    QueueCapacity { path: PathBuf, value: i64 },
    #[error("{path} is not valid: attachment_dirs: {dir:?} {reason}")]
    AttachmentDirs {
        path: PathBuf,
        dir: PathBuf,
        reason: String,
    },
    #[error(
        "{path} is not valid: attachment_max_bytes must be between 1 and {max}, not {value}",
        max = crate::session::attachments::MAX_MAX_BYTES
    )]
    AttachmentMaxBytes { path: PathBuf, value: u64 },
    #[error("{path} is not valid: {key} {reason}")]
    Value {
        path: PathBuf,
        key: &'static str,
        reason: String,
    },
    #[error("{path} is not valid: {source}")]
    Hooks {
        path: PathBuf,
        #[source]
        source: HooksConfigError,
    },
}

/// The optional `config.toml`. Unknown keys are refused so a typo is not silently ignored.
/// Compared whole by a reload (`crate::reload`), which tells which keys changed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `tracing` filter for the host's log, e.g. `info` or `agent_host=debug`.
    #[serde(default)]
    pub log_level: Option<String>,
    /// Loopback WebSocket port; 0 (the default) picks a free one.
    #[serde(default)]
    pub ws_port: Option<u16>,
    /// Extra `Origin`s allowed on the WebSocket, e.g. a desktop shell's `tauri://localhost`.
    #[serde(default)]
    pub ws_allowed_origins: Vec<String>,
    /// Seconds an agent process may sit idle (no run, nothing queued) before it is closed; the
    /// next prompt resumes its session in a new process. Default 1800.
    #[serde(default)]
    pub agent_idle_timeout_s: Option<u64>,
    /// Per agent family: `[agents.claude] binary = "/path/to/claude"`, `env = { … }`.
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, AgentConfig>,
    /// The remote relay the host dials out to (`[relay] url = "wss://…"`, `token = "…"`).
    #[serde(default)]
    pub relay: Option<RelayConfig>,
    /// The sealed relay fleet the host dials out to (`[fleet] urls = ["wss://…/host"]`,
    /// `token = "…"`): bots paired with `pair.create` reach the host through it.
    #[serde(default)]
    pub fleet: Option<FleetConfig>,
    /// Commands run when a session needs its user (`[hooks] on_permission = [[…]]`).
    #[serde(default)]
    pub hooks: Option<HooksFile>,
    /// How many prompts may wait behind a busy run in one session (1 to 100, default 3); past
    /// that the oldest is dropped, visibly.
    #[serde(default)]
    pub queue_capacity: Option<i64>,
    /// Sessions may be created with `permission_mode: "bypass"` (every tool runs without
    /// asking). Default false: such a create is refused `bypass_not_allowed`.
    #[serde(default)]
    pub allow_bypass: bool,
    /// Directories (absolute) whose files `session.send` may attach, besides the session's
    /// cwd. Default none.
    #[serde(default)]
    pub attachment_dirs: Vec<PathBuf>,
    /// The most bytes one attachment may have (a prompt's together: 4 times that). Default
    /// 10 MiB, at most 64 MiB.
    #[serde(default)]
    pub attachment_max_bytes: Option<u64>,
    /// Days a subscriber may stay away (no connection, no `subscriber.grant`) before it is
    /// removed with its cursor. Default 30; 0 removes every subscriber not connected.
    #[serde(default)]
    pub subscriber_max_idle_days: Option<u64>,
    /// The size at which `logs/host.log` is rotated (to `host.log.1`, …). Default 10 MiB.
    #[serde(default)]
    pub log_max_bytes: Option<u64>,
    /// How many rotated logs are kept besides `host.log`. Default 7.
    #[serde(default)]
    pub log_files: Option<usize>,
}

/// How long a subscriber may stay away when `config.toml` sets nothing.
pub const DEFAULT_SUBSCRIBER_MAX_IDLE_DAYS: u64 = 30;
/// The size `logs/host.log` is rotated at by default.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// The smallest rotation size accepted (a smaller one would rotate on nearly every line).
pub const MIN_LOG_MAX_BYTES: u64 = 1024;
/// Rotated logs kept by default.
pub const DEFAULT_LOG_FILES: usize = 7;
/// The most rotated logs `log_files` may keep.
pub const MAX_LOG_FILES: usize = 100;

/// The queue capacity when `config.toml` sets none (design §8).
pub const DEFAULT_QUEUE_CAPACITY: usize = 3;
/// The largest `queue_capacity` accepted.
pub const MAX_QUEUE_CAPACITY: usize = 100;

/// `[hooks]` as written: each list holds commands, each command a list of strings (the
/// program, then its arguments). Read as raw TOML values so that a mistake gets a message
/// naming the entry and the expected shape ([`HooksConfig::from_file`]) rather than serde's
/// "invalid type".
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksFile {
    #[serde(default)]
    pub on_permission: Vec<toml::Value>,
    #[serde(default)]
    pub on_run_end: Vec<toml::Value>,
    #[serde(default)]
    pub on_error: Vec<toml::Value>,
    /// How long one hook may run before its process group is killed. Default 10000.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// One hook command: run as is, never through a shell.
#[derive(Clone, PartialEq, Eq)]
pub struct HookCommand {
    pub program: String,
    pub args: Vec<String>,
}

/// Arguments may carry a token (a push service's URL or header): `Debug` shows the program
/// and how many arguments follow, never their text.
impl std::fmt::Debug for HookCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookCommand")
            .field("program", &self.program)
            .field("args", &self.args.len())
            .finish()
    }
}

/// `[hooks]`, checked: what [`crate::hooks`] runs. Empty lists (the default) run nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HooksConfig {
    pub on_permission: Vec<HookCommand>,
    pub on_run_end: Vec<HookCommand>,
    pub on_error: Vec<HookCommand>,
    /// The time limit of one hook run.
    pub timeout: Duration,
}

/// The default time limit of a hook.
pub const HOOK_TIMEOUT_MS: u64 = 10_000;
/// The longest time limit `timeout_ms` may set (ten minutes).
pub const MAX_HOOK_TIMEOUT_MS: u64 = 600_000;
/// The most commands one hook list may hold.
pub const MAX_HOOK_COMMANDS: usize = 16;

impl Default for HooksConfig {
    fn default() -> Self {
        HooksConfig {
            on_permission: Vec::new(),
            on_run_end: Vec::new(),
            on_error: Vec::new(),
            timeout: Duration::from_millis(HOOK_TIMEOUT_MS),
        }
    }
}

/// What is wrong with a `[hooks]` section.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HooksConfigError {
    #[error(
        "hooks.{list}[{index}] must be a command: a list of strings, the program then its \
         arguments, e.g. {list} = [[\"notify-send\", \"agent-host\"]] (no shell runs it)"
    )]
    NotACommand { list: &'static str, index: usize },
    #[error("hooks.{list}[{index}] is empty: it needs at least the program")]
    Empty { list: &'static str, index: usize },
    #[error("hooks.{list}[{index}]: the program is an empty string")]
    EmptyProgram { list: &'static str, index: usize },
    #[error("hooks.{list}[{index}] holds a NUL character, which no program argument can carry")]
    Nul { list: &'static str, index: usize },
    #[error("hooks.{list} has {count} commands; at most {MAX_HOOK_COMMANDS} are allowed")]
    TooMany { list: &'static str, count: usize },
    #[error("hooks.timeout_ms must be between 1 and {MAX_HOOK_TIMEOUT_MS} (milliseconds), not {0}")]
    Timeout(u64),
}

impl HooksConfig {
    /// Check a `[hooks]` section and turn it into commands.
    pub fn from_file(file: &HooksFile) -> Result<HooksConfig, HooksConfigError> {
        let timeout_ms = file.timeout_ms.unwrap_or(HOOK_TIMEOUT_MS);
        if !(1..=MAX_HOOK_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(HooksConfigError::Timeout(timeout_ms));
        }
        Ok(HooksConfig {
            on_permission: hook_commands("on_permission", &file.on_permission)?,
            on_run_end: hook_commands("on_run_end", &file.on_run_end)?,
            on_error: hook_commands("on_error", &file.on_error)?,
            timeout: Duration::from_millis(timeout_ms),
        })
    }

    /// Whether any hook is configured (none: the host does not follow events for hooks).
    pub fn is_empty(&self) -> bool {
        self.on_permission.is_empty() && self.on_run_end.is_empty() && self.on_error.is_empty()
    }
}

fn hook_commands(
    list: &'static str,
    values: &[toml::Value],
) -> Result<Vec<HookCommand>, HooksConfigError> {
    if values.len() > MAX_HOOK_COMMANDS {
        return Err(HooksConfigError::TooMany {
            list,
            count: values.len(),
        });
    }
    values
        .iter()
        .enumerate()
        .map(|(index, value)| {
            let Some(items) = value.as_array() else {
                return Err(HooksConfigError::NotACommand { list, index });
            };
            let argv = items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or(HooksConfigError::NotACommand { list, index })?;
            let Some((program, args)) = argv.split_first() else {
                return Err(HooksConfigError::Empty { list, index });
            };
            if program.is_empty() {
                return Err(HooksConfigError::EmptyProgram { list, index });
            }
            if argv.iter().any(|a| a.contains('\0')) {
                return Err(HooksConfigError::Nul { list, index });
            }
            Ok(HookCommand {
                program: program.clone(),
                args: args.to_vec(),
            })
        })
        .collect()
}

/// `[relay]`: where the host dials out to, with what token, and what that token may do.
#[derive(Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// `wss://…`; `ws://` only to a loopback address (tests, a relay on this machine).
    pub url: String,
    /// Sent as `Authorization: Bearer …`; never logged, never shown by `host.status`.
    #[serde(skip_serializing)]
    pub token: String,
    /// What requests coming through the relay may do.
    #[serde(default)]
    pub scope: Scope,
    /// Timing, in milliseconds; the defaults suit a real network.
    #[serde(default)]
    pub timing: RelayTiming,
}

impl std::fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConfig")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .field("scope", &self.scope)
            .field("timing", &self.timing)
            .finish()
    }
}

/// Relay connection timing (milliseconds).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayTiming {
    /// TCP connect, TLS and the WebSocket upgrade together.
    pub connect_timeout_ms: u64,
    /// A WebSocket ping this often.
    pub ping_interval_ms: u64,
    /// Nothing received for this long: the relay is gone, reconnect.
    pub dead_peer_ms: u64,
    /// Reconnect backoff: first delay, and the cap (each with jitter).
    pub backoff_min_ms: u64,
    pub backoff_max_ms: u64,
    /// A connection that lasted this long resets the backoff.
    pub stable_after_ms: u64,
}

impl Default for RelayTiming {
    fn default() -> Self {
        RelayTiming {
            connect_timeout_ms: 10_000,
            ping_interval_ms: 20_000,
            dead_peer_ms: 60_000,
            backoff_min_ms: 500,
            backoff_max_ms: 60_000,
            stable_after_ms: 30_000,
        }
    }
}

/// `[fleet]`: the relay fleet (`agent-host-relay` instances) the host dials out to, sealed end
/// to end with its paired bots. Checked as `[relay]` is: every URL `wss://` (or `ws://` to a
/// loopback address), the token a valid header value.
#[derive(Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// The instances' `/host` endpoints, dialed in turn.
    pub urls: Vec<String>,
    /// The relay's host token, sent as `Authorization: Bearer …`; never logged or shown.
    #[serde(skip_serializing)]
    pub token: String,
    /// Where bots dial (written into pairing codes); absent: `urls` with `/host` → `/bot`.
    #[serde(default)]
    pub bot_urls: Option<Vec<String>>,
    /// Timing, in milliseconds; the defaults suit a real network.
    #[serde(default)]
    pub timing: FleetTiming,
}

impl FleetConfig {
    /// Where a bot dials, for its pairing code: `bot_urls` when given, else every URL with a
    /// trailing `/host` replaced by `/bot` (the relay serves both).
    pub fn bot_urls(&self) -> Vec<String> {
        match &self.bot_urls {
            Some(urls) if !urls.is_empty() => urls.clone(),
            _ => self.urls.iter().map(|url| host_to_bot(url)).collect(),
        }
    }
}

/// A relay's `/host` URL as its `/bot` one (a URL not ending in `/host` as it is).
pub fn host_to_bot(url: &str) -> String {
    let url = url.trim_end_matches('/');
    match url.strip_suffix("/host") {
        Some(base) => format!("{base}/bot"),
        None => url.to_owned(),
    }
}

impl std::fmt::Debug for FleetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetConfig")
            .field("urls", &self.urls)
            .field("token", &"<redacted>")
            .field("bot_urls", &self.bot_urls)
            .field("timing", &self.timing)
            .finish()
    }
}

/// Fleet connection timing (milliseconds).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetTiming {
    /// TCP connect, TLS, the upgrade and the relay's `Welcome` together.
    pub connect_timeout_ms: u64,
    /// A WebSocket ping this often.
    pub ping_interval_ms: u64,
    /// Nothing received for this long: the instance is gone, dial the next.
    pub dead_peer_ms: u64,
    /// A loop-back `Ping` (through NATS and back) this often.
    pub probe_interval_ms: u64,
    /// No loop-back `Pong` for this long: `degraded`, dial the next URL.
    pub degraded_after_ms: u64,
    /// Backoff between full rounds of the URLs: first delay, and the cap (with jitter).
    pub backoff_min_ms: u64,
    pub backoff_max_ms: u64,
    /// A connection proven by a round trip that lasted this long resets the backoff.
    pub stable_after_ms: u64,
    /// A channel outlives a lost fleet connection this long, then is closed (`expired`).
    pub channel_hold_ms: u64,
    /// A channel whose bot sent nothing for this long is closed (`idle`); 0: never.
    pub channel_idle_ms: u64,
}

impl Default for FleetTiming {
    fn default() -> Self {
        FleetTiming {
            connect_timeout_ms: 10_000,
            ping_interval_ms: 5_000,
            dead_peer_ms: 15_000,
            probe_interval_ms: 2_000,
            degraded_after_ms: 6_000,
            backoff_min_ms: 200,
            backoff_max_ms: 10_000,
            stable_after_ms: 10_000,
            channel_hold_ms: 60_000,
            channel_idle_ms: 600_000,
        }
    }
}

/// One agent's settings in `config.toml`: a built-in family's (`[agents.claude] binary = …`),
/// or a user-registered agent's (`[agents.my-agent] command = ["my-agent", "--acp"]`,
/// `protocol = "acp"`), which becomes an agent type of its own.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// A path, or a name looked up on `PATH`.
    #[serde(default)]
    pub binary: Option<String>,
    /// A registered agent's command: the program (a path, or a name on `PATH`) and its
    /// arguments.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// A registered agent's protocol: `acp`, `claude-stream-json` or `codex-app-server`.
    #[serde(default)]
    pub protocol: Option<String>,
    /// Variables set for this agent's processes (over the ones passed through).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// Environment values are secrets (API keys): a `Debug` of anything holding them shows only
/// the names.
pub struct EnvNames<'a, I: Iterator<Item = &'a String> + Clone>(pub I);

impl<'a, I: Iterator<Item = &'a String> + Clone> std::fmt::Debug for EnvNames<'a, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.clone().map(|k| (k, "<redacted>")))
            .finish()
    }
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("binary", &self.binary)
            .field("command", &self.command)
            .field("protocol", &self.protocol)
            .field("env", &EnvNames(self.env.keys()))
            .finish()
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("home", &self.home)
            .field("log_level", &self.log_level)
            .field("ipc_read_timeout", &self.ipc_read_timeout)
            .field("ws_port", &self.ws_port)
            .field("ws_allowed_origins", &self.ws_allowed_origins)
            .field("env", &EnvNames(self.env.iter().map(|(k, _)| k)))
            .field("agent_idle_timeout", &self.agent_idle_timeout)
            .field("agents", &self.agents)
            .field("relay", &self.relay)
            .field("fleet", &self.fleet)
            .field("queue_capacity", &self.queue_capacity)
            .field("allow_bypass", &self.allow_bypass)
            .field("attachment_dirs", &self.attachment_dirs)
            .field("attachment_max_bytes", &self.attachment_max_bytes)
            .field("adopt_orphans", &self.adopt_orphans)
            .field("log_level_env", &self.log_level_env)
            .field("subscriber_max_idle", &self.subscriber_max_idle)
            .field("log_max_bytes", &self.log_max_bytes)
            .field("log_files", &self.log_files)
            .finish_non_exhaustive()
    }
}

/// Everything the host and the CLI need to know about where things live.
#[derive(Clone)]
pub struct Config {
    pub home: PathBuf,
    pub log_level: String,
    /// How long an IPC client may take to send its request line.
    pub ipc_read_timeout: Duration,
    /// Loopback WebSocket port (0: ephemeral).
    pub ws_port: u16,
    /// `Origin`s accepted besides the server's own loopback origin.
    pub ws_allowed_origins: Vec<String>,
    /// The clock grants expire by; tests inject a manual one.
    pub clock: crate::clock::Clock,
    /// The host's environment, read once at start. The spawn policy decides what of it an
    /// agent gets; nothing else reads the environment.
    pub env: Vec<(String, String)>,
    /// How long an idle agent process is kept.
    pub agent_idle_timeout: Duration,
    /// Per-family agent settings from `config.toml`.
    pub agents: std::collections::BTreeMap<String, AgentConfig>,
    /// The remote relay, if configured.
    pub relay: Option<RelayConfig>,
    /// The sealed relay fleet, if configured.
    pub fleet: Option<FleetConfig>,
    /// `[hooks]`: commands run when a session needs its user (none by default).
    pub hooks: HooksConfig,
    /// How many prompts may wait behind a busy run in one session.
    pub queue_capacity: usize,
    /// `permission_mode: "bypass"` is allowed (`allow_bypass` in `config.toml`).
    pub allow_bypass: bool,
    /// `attachment_dirs`, canonical: directories whose files may be attached.
    pub attachment_dirs: Vec<PathBuf>,
    /// The most bytes one attachment may have.
    pub attachment_max_bytes: u64,
    /// The host owns its whole process (the binary's `host.start`), so it may become the
    /// subreaper of its agents' orphans and reap them (`adapter::reap`). Off when embedded:
    /// other code in the process owns children of its own.
    pub adopt_orphans: bool,
    /// The variable that set [`Config::log_level`] (`AGENT_HOST_LOG`, else `RUST_LOG`), which
    /// then wins over `config.toml`'s `log_level`, at start and at every reload.
    pub log_level_env: Option<&'static str>,
    /// A subscriber away longer than this is removed (`subscriber_max_idle_days`).
    pub subscriber_max_idle: Duration,
    /// `logs/host.log` is rotated at this size.
    pub log_max_bytes: u64,
    /// Rotated logs kept.
    pub log_files: usize,
}

/// The home directory the environment names: `AGENT_HOST_HOME`, else `~/.agent-host`. Reads
/// nothing from disk (the small `agent-host` front needs only this to find the socket).
pub fn home_from_env() -> Result<PathBuf, ConfigError> {
    match std::env::var_os("AGENT_HOST_HOME") {
        Some(home) if !home.is_empty() => Ok(PathBuf::from(home)),
        _ => {
            let user_home = std::env::var_os("HOME").ok_or(ConfigError::NoHome)?;
            Ok(PathBuf::from(user_home).join(".agent-host"))
        }
    }
}

/// The IPC socket of the host of `home`.
pub fn ipc_path_in(home: &Path) -> PathBuf {
    home.join("host.sock")
}

impl Config {
    /// Build from the environment: `AGENT_HOST_HOME`, else `$HOME/.agent-host`;
    /// `AGENT_HOST_LOG` overrides the log level.
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut config = Config::with_home(home_from_env()?)?;
        // Only variables that are valid UTF-8 (`vars()` would panic on the others).
        config.env = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        if let Some(port) = std::env::var("AGENT_HOST_WS_PORT")
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
        {
            config.ws_port = port;
        }
        // The environment wins over config.toml, and agent-host's own variable over the
        // generic one (a RUST_LOG meant for another program in the same shell loses to it).
        for name in ["AGENT_HOST_LOG", "RUST_LOG"] {
            if let Ok(level) = std::env::var(name)
                && !level.trim().is_empty()
            {
                config.log_level = level;
                config.log_level_env = Some(name);
                break;
            }
        }
        if let Some(ms) = std::env::var("AGENT_HOST_IPC_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            config.ipc_read_timeout = Duration::from_millis(ms.clamp(10, 600_000));
        }
        Ok(config)
    }

    /// Build for an explicit home directory (tests, embedding), reading its `config.toml`.
    pub fn with_home(home: impl Into<PathBuf>) -> Result<Config, ConfigError> {
        let home = home.into();
        let file = read_file_config(&home.join("config.toml"))?;
        Config::from_file(home, file)
    }

    /// `config.toml` of `home` as written (missing: every default).
    pub fn read_file(home: &Path) -> Result<FileConfig, ConfigError> {
        read_file_config(&home.join("config.toml"))
    }

    /// This configuration with `file` (a `config.toml` read again) in place of the one it was
    /// built from: what comes from the environment and the process stays (the environment
    /// snapshot, the clock, the IPC timeout, a log level a variable set, orphan adoption), and
    /// so does what only a restart can change here, the WebSocket port.
    pub fn reloaded(&self, file: FileConfig) -> Result<Config, ConfigError> {
        let mut next = Config::from_file(self.home.clone(), file)?;
        next.env = self.env.clone();
        next.clock = self.clock.clone();
        next.ipc_read_timeout = self.ipc_read_timeout;
        next.adopt_orphans = self.adopt_orphans;
        next.ws_port = self.ws_port;
        if self.log_level_env.is_some() {
            next.log_level = self.log_level.clone();
            next.log_level_env = self.log_level_env;
        }
        Ok(next)
    }

    /// Build from a `config.toml` already read, checking its values.
    pub fn from_file(home: PathBuf, file: FileConfig) -> Result<Config, ConfigError> {
        let path = home.join("config.toml");
        let queue_capacity = match file.queue_capacity {
            None => DEFAULT_QUEUE_CAPACITY,
            Some(n) => match usize::try_from(n) {
                Ok(n) if (1..=MAX_QUEUE_CAPACITY).contains(&n) => n,
                _ => return Err(ConfigError::QueueCapacity { path, value: n }),
            },
        };
        let attachment_dirs = file
            .attachment_dirs
            .iter()
            .map(|dir| {
                let bad = |reason: String| ConfigError::AttachmentDirs {
                    path: path.clone(),
                    dir: dir.clone(),
                    reason,
                };
                if !dir.is_absolute() {
                    return Err(bad("must be an absolute path".to_owned()));
                }
                let canonical = dir
                    .canonicalize()
                    .map_err(|e| bad(format!("cannot be resolved: {e}")))?;
                if !canonical.is_dir() {
                    return Err(bad("is not a directory".to_owned()));
                }
                Ok(canonical)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let attachment_max_bytes = match file.attachment_max_bytes {
            None => crate::session::attachments::DEFAULT_MAX_BYTES,
            Some(n) if (1..=crate::session::attachments::MAX_MAX_BYTES).contains(&n) => n,
            Some(value) => return Err(ConfigError::AttachmentMaxBytes { path, value }),
        };
        let hooks = file
            .hooks
            .as_ref()
            .map(HooksConfig::from_file)
            .transpose()
            .map_err(|source| ConfigError::Hooks {
                path: path.clone(),
                source,
            })?
            .unwrap_or_default();
        let log_max_bytes = match file.log_max_bytes {
            None => DEFAULT_LOG_MAX_BYTES,
            Some(n) if n >= MIN_LOG_MAX_BYTES => n,
            Some(n) => {
                return Err(ConfigError::Value {
                    path,
                    key: "log_max_bytes",
                    reason: format!("must be at least {MIN_LOG_MAX_BYTES}, not {n}"),
                });
            }
        };
        let log_files = match file.log_files {
            None => DEFAULT_LOG_FILES,
            Some(n) if n <= MAX_LOG_FILES => n,
            Some(n) => {
                return Err(ConfigError::Value {
                    path,
                    key: "log_files",
                    reason: format!("must be at most {MAX_LOG_FILES}, not {n}"),
                });
            }
        };
        let idle_days = file
            .subscriber_max_idle_days
            .unwrap_or(DEFAULT_SUBSCRIBER_MAX_IDLE_DAYS)
            // About 2.7 million years: past that a Duration of seconds is still fine, but no
            // one means it.
            .min(1_000_000_000);
        Ok(Config {
            home,
            log_level: file.log_level.unwrap_or_else(|| "info".to_owned()),
            ipc_read_timeout: Duration::from_secs(5),
            ws_port: file.ws_port.unwrap_or(0),
            ws_allowed_origins: file.ws_allowed_origins,
            clock: crate::clock::Clock::system(),
            env: Vec::new(),
            agent_idle_timeout: Duration::from_secs(
                file.agent_idle_timeout_s.unwrap_or(1800).max(1),
            ),
            agents: file.agents,
            relay: file.relay,
            fleet: file.fleet,
            hooks,
            queue_capacity,
            allow_bypass: file.allow_bypass,
            attachment_dirs,
            attachment_max_bytes,
            adopt_orphans: false,
            log_level_env: None,
            subscriber_max_idle: Duration::from_secs(idle_days * 86_400),
            log_max_bytes,
            log_files,
        })
    }

    /// A variable of the environment snapshot.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The binary configured for an agent family: its environment variable, else
    /// `config.toml`, else `None` (the family's default name on `PATH`).
    pub fn agent_binary(&self, agent_type: &str, env_name: &str) -> Option<String> {
        self.env_var(env_name)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .or_else(|| self.agents.get(agent_type).and_then(|a| a.binary.clone()))
    }

    pub fn lock_path(&self) -> PathBuf {
        self.home.join("host.lock")
    }

    pub fn ipc_path(&self) -> PathBuf {
        ipc_path_in(&self.home)
    }

    /// The port the last host of this home listened on (when none is configured, the next
    /// one takes it again if it is free, so the web UI's origin stays the same).
    pub fn ws_port_path(&self) -> PathBuf {
        self.home.join("ws.port")
    }

    /// The WebSocket protocol's Unix socket (mode 0600): the loopback server's `/subscribe`
    /// without TCP, for clients on this machine.
    pub fn ws_socket_path(&self) -> PathBuf {
        self.home.join("ws.sock")
    }

    pub fn db_path(&self) -> PathBuf {
        self.home.join("host.db")
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.home.join("logs")
    }

    /// The host's log (rotated beside itself: `host.log.1` is the newest older one).
    pub fn log_path(&self) -> PathBuf {
        self.logs_dir().join("host.log")
    }

    /// The optional `config.toml`.
    pub fn config_path(&self) -> PathBuf {
        self.home.join("config.toml")
    }

    /// Where prompts' attachments are copied, one directory per session.
    pub fn attachments_dir(&self) -> PathBuf {
        self.home.join("attachments")
    }

    /// Create the home (0700) and `logs/` if missing, and tighten an existing home to 0700.
    pub fn ensure_home(&self) -> Result<(), ConfigError> {
        for dir in [self.home.clone(), self.logs_dir()] {
            create_private_dir(&dir).map_err(|source| ConfigError::Home { path: dir, source })?;
        }
        Ok(())
    }
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other("exists and is not a directory"));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(FileConfig::default()),
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_an_env_value() {
        let mut config = Config::with_home("/nonexistent-home").unwrap();
        config.env = vec![("ANTHROPIC_API_KEY".into(), "sk-ant-canary-1".into())];
        config.agents.insert(
            "x".into(),
            AgentConfig {
                env: [("MY_KEY".to_owned(), "canary-2".to_owned())].into(),
                ..AgentConfig::default()
            },
        );
        let shown = format!("{config:?}");
        assert!(
            shown.contains("ANTHROPIC_API_KEY") && shown.contains("MY_KEY"),
            "{shown}"
        );
        assert!(!shown.contains("canary"), "{shown}");
    }

    #[test]
    fn home_is_created_private_and_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("h");
        fs::create_dir(&home).unwrap();
        fs::set_permissions(&home, fs::Permissions::from_mode(0o755)).unwrap();
        let config = Config::with_home(&home).unwrap();
        config.ensure_home().unwrap();
        assert_eq!(
            fs::metadata(&home).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(config.logs_dir().is_dir());
    }

    fn hooks_of(toml_text: &str) -> Result<HooksConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("config.toml"), toml_text).unwrap();
        Config::with_home(dir.path()).map(|c| c.hooks)
    }

    fn hooks_error(toml_text: &str) -> String {
        match hooks_of(toml_text) {
            Err(e) => e.to_string(),
            Ok(hooks) => panic!("accepted: {hooks:?}"),
        }
    }

    #[test]
    fn hooks_are_off_by_default_and_read_as_argv_lists() {
        let none = hooks_of("").unwrap();
        assert!(none.is_empty());
        assert_eq!(none.timeout, Duration::from_millis(10_000));
        let hooks = hooks_of(
            "[hooks]\n\
             on_permission = [[\"notify-send\", \"Agent needs you\", \"$AGENT_HOST_TOOL\"], [\"/bin/true\"]]\n\
             on_error = [[\"logger\", \"-t\", \"agent-host\"]]\n\
             timeout_ms = 2500\n",
        )
        .unwrap();
        assert!(!hooks.is_empty());
        assert_eq!(hooks.timeout, Duration::from_millis(2500));
        assert_eq!(
            hooks.on_permission,
            [
                HookCommand {
                    program: "notify-send".into(),
                    // Kept as written: nothing expands `$…`.
                    args: vec!["Agent needs you".into(), "$AGENT_HOST_TOOL".into()],
                },
                HookCommand {
                    program: "/bin/true".into(),
                    args: vec![],
                },
            ]
        );
        assert!(hooks.on_run_end.is_empty());
        assert_eq!(hooks.on_error[0].args, ["-t", "agent-host"]);
        // The arguments (a token may be among them) are not in a Debug.
        assert!(!format!("{hooks:?}").contains("Agent needs you"));
    }

    #[test]
    fn a_wrong_hooks_section_is_refused_with_a_message_naming_the_entry() {
        // One command written as the list itself: the commonest slip.
        let e = hooks_error("[hooks]\non_permission = [\"notify-send\", \"x\"]\n");
        assert!(
            e.contains("hooks.on_permission[0] must be a command"),
            "{e}"
        );
        assert!(e.contains("config.toml"), "{e}");
        let e = hooks_error("[hooks]\non_run_end = [[\"a\"], [\"b\", 3]]\n");
        assert!(e.contains("hooks.on_run_end[1] must be a command"), "{e}");
        let e = hooks_error("[hooks]\non_error = [[]]\n");
        assert!(e.contains("hooks.on_error[0] is empty"), "{e}");
        let e = hooks_error("[hooks]\non_error = [[\"\", \"x\"]]\n");
        assert!(e.contains("the program is an empty string"), "{e}");
        let e = hooks_error("[hooks]\non_error = [[\"a\", \"b\\u0000c\"]]\n");
        assert!(e.contains("NUL"), "{e}");
        for bad in [0, 600_001] {
            let e = hooks_error(&format!("[hooks]\ntimeout_ms = {bad}\n"));
            assert!(
                e.contains("hooks.timeout_ms must be between 1 and 600000"),
                "{e}"
            );
        }
        let many = vec!["[\"true\"]"; 17].join(", ");
        let e = hooks_error(&format!("[hooks]\non_permission = [{many}]\n"));
        assert!(e.contains("at most 16"), "{e}");
        // A typo in a key is refused, not ignored.
        let e = hooks_error("[hooks]\non_permision = [[\"true\"]]\n");
        assert!(e.contains("on_permision"), "{e}");
        let e = hooks_error("[hooks]\non_permission = \"notify-send x\"\n");
        assert!(e.contains("on_permission"), "{e}");
    }

    #[test]
    fn allow_bypass_is_off_unless_set() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!Config::with_home(dir.path()).unwrap().allow_bypass);
        std::fs::write(dir.path().join("config.toml"), "allow_bypass = true\n").unwrap();
        assert!(Config::with_home(dir.path()).unwrap().allow_bypass);
    }

    #[test]
    fn queue_capacity_defaults_to_3_and_is_held_to_1_to_100() {
        let dir = tempfile::tempdir().unwrap();
        let capacity = |text: &str| {
            fs::write(dir.path().join("config.toml"), text).unwrap();
            Config::with_home(dir.path()).map(|c| c.queue_capacity)
        };
        assert_eq!(capacity("").unwrap(), DEFAULT_QUEUE_CAPACITY);
        assert_eq!(capacity("queue_capacity = 1\n").unwrap(), 1);
        assert_eq!(capacity("queue_capacity = 100\n").unwrap(), 100);
        for bad in ["0", "101", "-1"] {
            match capacity(&format!("queue_capacity = {bad}\n")) {
                Err(e @ ConfigError::QueueCapacity { .. }) => assert!(
                    e.to_string().contains(&format!(
                        "queue_capacity must be between 1 and 100, not {bad}"
                    )),
                    "{e}"
                ),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn attachment_keys_default_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        fs::create_dir(&shared).unwrap();
        let read = |text: &str| {
            fs::write(dir.path().join("config.toml"), text).unwrap();
            Config::with_home(dir.path())
        };
        let config = read("").unwrap();
        assert!(config.attachment_dirs.is_empty());
        assert_eq!(config.attachment_max_bytes, 10 * 1024 * 1024);
        assert_eq!(config.attachments_dir(), dir.path().join("attachments"));
        let config = read(&format!(
            "attachment_dirs = [{:?}]\nattachment_max_bytes = 1000\n",
            shared.display().to_string()
        ))
        .unwrap();
        // Canonical, as the checks compare them.
        assert_eq!(config.attachment_dirs, [shared.canonicalize().unwrap()]);
        assert_eq!(config.attachment_max_bytes, 1000);
        for (text, says) in [
            (
                "attachment_dirs = [\"relative\"]\n",
                "must be an absolute path",
            ),
            (
                "attachment_dirs = [\"/nonexistent/dir\"]\n",
                "cannot be resolved",
            ),
            (
                "attachment_max_bytes = 0\n",
                "attachment_max_bytes must be between 1 and",
            ),
            (
                "attachment_max_bytes = 67108865\n",
                "attachment_max_bytes must be between 1 and",
            ),
        ] {
            match read(text) {
                Err(e) => assert!(e.to_string().contains(says), "{text}: {e}"),
                Ok(_) => panic!("accepted: {text}"),
            }
        }
        let file = dir.path().join("f");
        fs::write(&file, "").unwrap();
        match read(&format!(
            "attachment_dirs = [{:?}]\n",
            file.display().to_string()
        )) {
            Err(e) => assert!(e.to_string().contains("is not a directory"), "{e}"),
            Ok(_) => panic!("a file accepted as a directory"),
        }
    }

    #[test]
    fn config_toml_is_read_and_typos_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("config.toml"), "log_level = \"debug\"\n").unwrap();
        assert_eq!(Config::with_home(dir.path()).unwrap().log_level, "debug");
        fs::write(dir.path().join("config.toml"), "log_levle = \"debug\"\n").unwrap();
        assert!(matches!(
            Config::with_home(dir.path()),
            Err(ConfigError::Parse { .. })
        ));
    }
}
