//! The one spawn policy for agent processes (design §9, style 7). Every agent child goes
//! through [`spawn`]:
//! - an explicit environment: only what an agent needs passes through from the host's own
//!   (HOME, PATH, locale, proxies, CA bundles, provider keys and base URLs such as
//!   `ANTHROPIC_*` / `OPENAI_*`, `CLAUDE_CONFIG_DIR`, `CODEX_HOME`, telemetry switches), plus
//!   the variables the agent's own configuration names (a Codex provider's `env_key`:
//!   [`named_by_config`]), plus the agent's own `env` from config, plus our markers
//!   `AGENTHOST_SESSION_ID`,
//!   `AGENTHOST_OWNED=1`, `AGENTHOST_SPAWN_ID` and `AGENTHOST_HOME` (see [`super::reap`]).
//!   Nesting markers of a surrounding agent (`CLAUDECODE`, …) never pass;
//! - its own process group, so stopping it reaches wrappers (`npx`, node shims) and tools;
//! - a parent-death signal, so a host that dies without cleaning up takes its children along;
//! - stdin and stdout piped for the protocol; stderr drained line by line into `tracing`;
//! - kill-on-drop as the last resort; [`Spawned::stop`] is the orderly way: SIGTERM to the
//!   group, a grace period, then SIGKILL to the group;
//! - whenever the group is killed, or the leader died by itself, whatever the agent started
//!   outside its group (a tool in its own session, what that tool put in the background) is
//!   ended too: its descendants while it lives, and every process with its spawn marker.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::AdapterError;
use super::reap::{self, HomeMarker, Tree};
use crate::protocol::events::ErrorCategory;

/// The longest stderr line logged; the rest of a longer one is dropped (still read).
const MAX_STDERR_LINE: usize = 16 * 1024;
/// The last stderr lines kept for error reports.
const STDERR_TAIL_LINES: usize = 8;
/// How long the stderr drain may take to reach the end once the group is gone.
const STDERR_DRAIN_WAIT: Duration = Duration::from_millis(500);

/// Names passed through from the host's environment as they are.
const PASS_EXACT: &[&str] = &[
    "HOME",
    "PATH",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "TERM",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "DISABLE_TELEMETRY",
    "DISABLE_ERROR_REPORTING",
    "DISABLE_AUTOUPDATER",
    "IS_SANDBOX",
    "SSH_AUTH_SOCK",
    "REQUESTS_CA_BUNDLE",
    "CLOUD_ML_REGION",
    "MAX_THINKING_TOKENS",
];

/// Prefixes passed through (provider keys and base URLs, locale).
const PASS_PREFIX: &[&str] = &[
    "LC_",
    "ANTHROPIC_",
    "OPENAI_",
    "AZURE_OPENAI_",
    "OPENROUTER_",
    "CLAUDE_CODE_",
    "GEMINI_",
    "GOOGLE_",
    "AWS_",
];

/// Never passed, even when a prefix matches: markers that tell an agent it runs inside
/// another agent (it would then refuse or change behaviour), and our own markers, which are
/// set per child.
const BLOCKED: &[&str] = &[
    "CLAUDECODE",
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_CODE_SSE_PORT",
    "CLAUDE_CODE_SESSION_ID",
    "CLAUDE_CODE_EXECPATH",
    "AGENTHOST_SESSION_ID",
    "AGENTHOST_OWNED",
    "AGENTHOST_HOME",
    "AGENTHOST_SPAWN_ID",
];

/// Whether a variable of the host's environment passes to agents: the common list, or a
/// prefix some family declares as its own ([`AgentFamily::own_env`]; `launch::scoped_env`
/// keeps it from the other families).
///
/// [`AgentFamily::own_env`]: super::family::AgentFamily::own_env
pub fn passes(name: &str) -> bool {
    !BLOCKED.contains(&name)
        && (PASS_EXACT.contains(&name)
            || PASS_PREFIX.iter().any(|p| name.starts_with(p))
            || super::family::FAMILIES
                .iter()
                .any(|f| f.own_env().iter().any(|p| name.starts_with(p))))
}

/// Whether `name` is passed by the common list alone (no family's own prefix needed).
pub fn passes_to_all(name: &str) -> bool {
    !BLOCKED.contains(&name)
        && (PASS_EXACT.contains(&name) || PASS_PREFIX.iter().any(|p| name.starts_with(p)))
}

/// The part of an environment that passes to agents (the config keeps this snapshot, taken
/// once at start).
pub fn filter_env(env: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    env.into_iter().filter(|(k, _)| passes(k)).collect()
}

/// The host's whole environment as it was at start, kept for the variables agents' own
/// configurations name ([`named_by_config`]); its `Debug` shows names only.
#[derive(Clone, Default)]
pub struct HostEnv(Arc<[(String, String)]>);

impl HostEnv {
    pub fn new(env: impl IntoIterator<Item = (String, String)>) -> HostEnv {
        HostEnv(env.into_iter().collect())
    }

    /// A variable's value, as the host has it (empty included).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl std::fmt::Debug for HostEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
}

/// Whether `name` can be a variable at all (what a configuration names is the user's text).
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The variables an agent's own configuration names (`names`, from
/// [`AgentFamily::config_env`]) that are not in `passed` already (the common list and the
/// family's prefixes), each with the host's own value exactly as the host has it: the agent
/// sees what it would in the user's terminal. Even a name another vendor's prefix covers
/// passes (the user's file names it for this agent); the variables it does not name stay
/// scoped as before. A name the host does not have, one that cannot be a variable, and the
/// nesting and host markers ([`BLOCKED`]) never pass. Logs the names passed, never a value.
///
/// [`AgentFamily::config_env`]: super::family::AgentFamily::config_env
pub fn named_by_config<'a>(
    host: &HostEnv,
    passed: &[(String, String)],
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for name in names {
        if !valid_name(name)
            || BLOCKED.contains(&name)
            || passed.iter().chain(&out).any(|(k, _)| k == name)
        {
            continue;
        }
        if let Some(value) = host.get(name) {
            out.push((name.to_owned(), value.to_owned()));
        }
    }
    if !out.is_empty() {
        tracing::debug!(
            names = ?out.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            "passing the variables the agent's own configuration names"
        );
    }
    out
}

/// Everything needed to start one agent process.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// The host environment snapshot that passes (see [`filter_env`]).
    pub base_env: Vec<(String, String)>,
    /// The agent's own variables from config; they win over `base_env`.
    pub extra_env: Vec<(String, String)>,
    /// The agent-host session this child serves, if any (`AGENTHOST_SESSION_ID`).
    pub session_id: Option<String>,
    /// The host home this child belongs to (`AGENTHOST_HOME`), so a later host of the same
    /// home can end what it leaves if this host dies.
    pub home: Option<HomeMarker>,
    /// A name for logs.
    pub label: String,
}

/// A running agent process in its own process group.
///
/// The group id is the leader's pid. It stays reserved while the leader is unreaped (a zombie
/// leader still holds it), so the group is only ever signalled before the leader is reaped:
/// [`Spawned::wait`] and [`Spawned::stop`] wait for the exit without reaping, kill what is left
/// of the group, and only then reap. Afterwards nothing signals that id again (it may belong
/// to someone else by then).
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    pgid: Option<Pid>,
    reaped: bool,
    /// `AGENTHOST_SPAWN_ID`: this process and everything it starts.
    spawn_id: String,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    /// The last lines of stderr (a `std` mutex: pushed and read without an `.await` held).
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
}

/// A live view of a process's last stderr lines (redacted), shared with its drain.
#[derive(Clone)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// The lines read so far (at most 8).
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|tail| tail.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Spawned {
    /// The stderr tail as it grows, for failure reports while the process still runs.
    pub fn stderr(&self) -> StderrTail {
        StderrTail(self.stderr_tail.clone())
    }

    /// The last lines the process wrote to stderr (at most 8, each at most 16 KiB), once its
    /// stderr has ended or half a second has passed. For error reports after the exit.
    pub async fn stderr_tail(&mut self) -> Vec<String> {
        if let Some(task) = self.stderr_task.take() {
            let _drained = tokio::time::timeout(STDERR_DRAIN_WAIT, task).await;
        }
        self.stderr_tail
            .lock()
            .map(|tail| tail.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The process (and process group) id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Wait for the leader to exit by itself; then end whatever it left in its group, and reap.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.exited().await;
        let ended = self.end_all(Tree::default());
        let status = self.reap().await;
        self.gone(&ended).await;
        status
    }

    /// Stop the whole group: close stdin (a well-behaved agent finishes and exits), wait half
    /// the grace period, SIGTERM the group, wait the other half, SIGKILL the group; reap. A
    /// zero grace kills the group first.
    pub async fn stop(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        // Its descendants while it still lives: if it exits within the grace period, they
        // have another parent by the time the rest is killed.
        let tree = self.tree();
        if grace.is_zero() {
            // No grace: killed before it can see its stdin close (and write anything more).
            self.kill_group();
        }
        drop(self.stdin.take());
        let half = grace / 2;
        if tokio::time::timeout(half, self.exited()).await.is_err() {
            if let Some(pgid) = self.pgid.filter(|_| !self.reaped) {
                let _gone = killpg(pgid, Signal::SIGTERM);
            }
            if tokio::time::timeout(half, self.exited()).await.is_err() {
                tracing::warn!(pid = ?self.pgid, "agent did not stop within the grace period; killing its group");
            }
        }
        // Whatever is left in the group (tools, MCP servers, a leader that ignored SIGTERM),
        // and what the agent started outside it.
        let ended = self.end_all(tree);
        let status = self.reap().await;
        self.gone(&ended).await;
        status
    }

    /// Waits (bounded) until the processes just killed have really exited: the signal is
    /// asynchronous, and a caller told "stopped" may check at once that nothing runs.
    async fn gone(&self, ended: &[i32]) {
        let left = reap::exited(ended, KILL_SETTLE).await;
        if !left.is_empty() {
            tracing::warn!(pid = ?self.pgid, still_running = ?left, "killed processes had not exited within {KILL_SETTLE:?}");
        }
    }

    /// Kill the whole group now (before it is reaped), and what the agent started outside it.
    pub fn kill_now(&self) {
        let _signalled = self.end_all(Tree::default());
    }

    /// A future that resolves once the leader has exited (not reaped), owning what it needs —
    /// for a driver to notice a dead agent whose stdout is still held open by a child.
    pub fn leader_exit(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let pgid = self.pgid.filter(|_| !self.reaped);
        async move {
            let Some(pgid) = pgid else {
                return;
            };
            let waited = tokio::task::spawn_blocking(move || {
                nix::sys::wait::waitid(
                    nix::sys::wait::Id::Pid(pgid),
                    nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
                )
            })
            .await;
            if !matches!(waited, Ok(Ok(_))) {
                tracing::debug!(pid = ?pgid, "waitid failed; the leader is already reaped");
            }
        }
    }

    /// Resolves once the leader has exited, without reaping it (its pid, and so the group id,
    /// stay reserved).
    async fn exited(&self) {
        self.leader_exit().await;
    }

    async fn reap(&mut self) -> std::io::Result<ExitStatus> {
        let pid = self.child.id();
        let status = self.child.wait().await;
        self.reaped = true;
        if let Some(pid) = pid {
            reap::unregister(pid);
        }
        status
    }

    /// The leader's living descendants now (none once it is reaped).
    fn tree(&self) -> Tree {
        match self.pgid.filter(|_| !self.reaped) {
            Some(pid) => Tree::of(pid.as_raw()),
            None => Tree::default(),
        }
    }

    /// Kill the group, the leader's descendants (now and in `earlier`), and every process
    /// with this spawn's marker — what left the group (a tool in its own session, what it put
    /// in the background, re-parented once the agent died). Before the leader is reaped.
    /// The pids signalled (group members, descendants, marked processes).
    fn end_all(&self, earlier: Tree) -> Vec<i32> {
        if self.reaped {
            return Vec::new();
        }
        let mut tree = self.tree();
        tree.merge(earlier);
        let members = self
            .pgid
            .map(|pgid| reap::group_members(pgid.as_raw()))
            .unwrap_or_default();
        self.kill_group();
        let killed = tree.kill();
        let marked = reap::kill_marked(&self.spawn_id);
        if !killed.is_empty() || !marked.is_empty() {
            tracing::info!(
                pid = ?self.pgid,
                descendants = ?killed,
                marked = ?marked,
                "ended what the agent started outside its process group (descendants, and processes with its AGENTHOST_SPAWN_ID)"
            );
        }
        let mut ended = members;
        ended.extend(killed);
        ended.extend(marked);
        ended.sort_unstable();
        ended.dedup();
        ended
    }

    fn kill_group(&self) {
        if self.reaped {
            return;
        }
        if let Some(pgid) = self.pgid {
            let _gone = killpg(pgid, Signal::SIGKILL);
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // Dropped without `stop` (a panic, a cancelled task): no orphans either way. Not yet
        // reaped, so the group id is still this child's. (Its pid stays registered as owned:
        // tokio reaps it, and the orphan reaper must never take it.)
        let _signalled = self.end_all(Tree::default());
    }
}

/// How long a stop waits for killed processes to have exited.
const KILL_SETTLE: Duration = Duration::from_secs(5);

/// Start an agent process under the policy above.
pub fn spawn(spec: &SpawnSpec) -> Result<Spawned, AdapterError> {
    let spawn_id = reap::next_spawn_id();
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.base_env.iter().map(|(k, v)| (k, v)))
        .envs(
            spec.extra_env
                .iter()
                .filter(|(k, _)| !BLOCKED.contains(&k.as_str()))
                .map(|(k, v)| (k, v)),
        )
        .env(reap::OWNED_VAR, "1")
        .env(reap::SPAWN_VAR, &spawn_id)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(session) = &spec.session_id {
        cmd.env(reap::SESSION_VAR, session);
    }
    if let Some(home) = &spec.home {
        cmd.env(reap::HOME_VAR, home.as_str());
    }
    set_parent_death_signal(&mut cmd);
    if !spec.cwd.is_dir() {
        return Err(AdapterError::new(
            ErrorCategory::WorkspaceUnavailable,
            format!(
                "the working directory {} does not exist",
                spec.cwd.display()
            ),
        ));
    }
    let mut child = reap::spawn_registered(&mut cmd).map_err(|e| {
        let category = if e.kind() == std::io::ErrorKind::NotFound {
            ErrorCategory::BinaryUnavailable
        } else {
            ErrorCategory::AgentFailed
        };
        AdapterError::new(
            category,
            format!(
                "cannot start {} ({}): {e}",
                spec.label,
                spec.program.display()
            ),
        )
    })?;
    let pgid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(Pid::from_raw);
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    let mut stderr_task = None;
    if let Some(stderr) = child.stderr.take() {
        let label = spec.label.clone();
        let pid = child.id();
        let tail = stderr_tail.clone();
        // stderr is log, never protocol: drained to the end whatever it holds (bytes that are
        // not UTF-8, endless lines), so the child never blocks on it or dies of SIGPIPE.
        stderr_task = Some(tokio::spawn(async move {
            let mut stderr = stderr;
            let mut chunk = [0u8; 8192];
            let mut line: Vec<u8> = Vec::new();
            let log = |line: &mut Vec<u8>| {
                // An agent may print its own key (an error quoting it, a request dump): it is
                // redacted by shape before it reaches the log, or the tail that `agent_failed`
                // messages quote (stored and published).
                let text = crate::redact::redact(&String::from_utf8_lossy(line)).into_owned();
                tracing::debug!(agent = %label, ?pid, "stderr: {text}");
                if let Ok(mut tail) = tail.lock() {
                    if tail.len() == STDERR_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(text);
                }
                line.clear();
            };
            loop {
                match stderr.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        for &byte in &chunk[..n] {
                            if byte == b'\n' {
                                log(&mut line);
                            } else if line.len() < MAX_STDERR_LINE {
                                line.push(byte);
                            }
                        }
                    }
                }
            }
            if !line.is_empty() {
                log(&mut line);
            }
        }));
    }
    Ok(Spawned {
        stdin: child.stdin.take(),
        stdout: child.stdout.take(),
        child,
        pgid,
        reaped: false,
        spawn_id,
        stderr_tail,
        stderr_task,
    })
}

/// Linux: the child gets SIGKILL when the host dies, even by SIGKILL; and SIGINT at its default
/// action, whatever the host inherited. The death signal is tied to the thread that forks, so
/// `spawn` must run on a runtime worker (long-lived), never inside `spawn_blocking` (whose
/// threads exit when idle).
#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "pre_exec is unsafe by signature; the closure only calls prctl and signal, which are async-signal-safe"
)]
fn set_parent_death_signal(cmd: &mut Command) {
    // SAFETY: runs in the forked child before exec; prctl(PR_SET_PDEATHSIG) and
    // signal(SIG_DFL) allocate nothing and take no locks.
    let parent = nix::unistd::getpid();
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // An interrupt is SIGINT to the group (Ctrl-C): a host that inherited SIGINT ignored
            // (a background job of a non-interactive shell) must not pass that on, or the agent
            // cannot even trap it. The standard library resets only SIGPIPE and the mask.
            nix::sys::signal::signal(Signal::SIGINT, nix::sys::signal::SigHandler::SigDfl)
                .map_err(std::io::Error::from)?;
            // The host died between fork and prctl: the signal will never come, so do not run.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other(
                    "the host exited while starting the agent",
                ));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

/// "exit status: 1", with the last line the process wrote to stderr, if any.
pub fn describe_exit(status: std::process::ExitStatus, stderr: &[String]) -> String {
    match stderr.iter().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => {
            let line: String = line.trim().chars().take(300).collect();
            format!("{status}; stderr: {line}")
        }
        None => status.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn only_what_agents_need_passes() {
        let env = [
            ("HOME", "/h"),
            ("PATH", "/bin"),
            ("ANTHROPIC_API_KEY", "k"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:1"),
            ("OPENAI_API_KEY", "k"),
            ("LC_ALL", "C"),
            ("CLAUDECODE", "1"),
            ("CLAUDE_CODE_ENTRYPOINT", "cli"),
            ("AGENTHOST_SESSION_ID", "outer"),
            ("AWS_PROFILE", "p"),
            ("SECRET_OF_SOMETHING_ELSE", "x"),
            ("CARGO_HOME", "/c"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let mut passed: Vec<String> = filter_env(env).into_iter().map(|(k, _)| k).collect();
        passed.sort();
        assert_eq!(
            passed,
            [
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL",
                "AWS_PROFILE",
                "HOME",
                "LC_ALL",
                "OPENAI_API_KEY",
                "PATH"
            ]
        );
    }

    #[test]
    fn what_a_config_names_passes_as_the_host_has_it() {
        let host = HostEnv::new(
            [
                ("X_KEY", "  spaced value  "),
                ("EMPTY_KEY", ""),
                ("OPENAI_API_KEY", "o"),
                ("ANTHROPIC_API_KEY", "a"),
                ("AGENTHOST_OWNED", "1"),
                ("CLAUDECODE", "1"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        let passed = vec![("OPENAI_API_KEY".to_owned(), "o".to_owned())];
        let got = named_by_config(
            &host,
            &passed,
            [
                "X_KEY",
                "X_KEY",
                "EMPTY_KEY",
                "OPENAI_API_KEY",
                "ANTHROPIC_API_KEY",
                "NOT_SET",
                "AGENTHOST_OWNED",
                "CLAUDECODE",
                "BAD=NAME",
                "1BAD",
                "",
            ],
        );
        let pairs: Vec<(&str, &str)> = got.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        assert_eq!(
            pairs,
            [
                ("X_KEY", "  spaced value  "),
                ("EMPTY_KEY", ""),
                ("ANTHROPIC_API_KEY", "a")
            ]
        );
        assert_eq!(
            format!("{host:?}"),
            "[\"X_KEY\", \"EMPTY_KEY\", \"OPENAI_API_KEY\", \"ANTHROPIC_API_KEY\", \
             \"AGENTHOST_OWNED\", \"CLAUDECODE\"]"
        );
    }

    fn spec(script: &str) -> SpawnSpec {
        SpawnSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: "/".into(),
            base_env: filter_env([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
            extra_env: vec![
                ("MY_AGENT_FLAG".into(), "on".into()),
                ("CLAUDECODE".into(), "1".into()),
            ],
            session_id: Some("sess-1".into()),
            home: Some(HomeMarker::of(std::path::Path::new("/"))),
            label: "test".into(),
        }
    }

    #[tokio::test]
    async fn the_child_sees_exactly_its_environment() {
        let mut child = spawn(&spec("env | sort")).unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(child.stdout.as_mut().unwrap(), &mut out)
            .await
            .unwrap();
        assert!(child.wait().await.unwrap().success());
        let names: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .filter(|k| *k != "PWD" && *k != "SHLVL" && *k != "_")
            .collect();
        assert_eq!(
            names,
            [
                "AGENTHOST_HOME",
                "AGENTHOST_OWNED",
                "AGENTHOST_SESSION_ID",
                "AGENTHOST_SPAWN_ID",
                "MY_AGENT_FLAG",
                "PATH"
            ]
        );
        assert!(out.contains("AGENTHOST_SESSION_ID=sess-1"));
        assert!(out.contains("AGENTHOST_HOME=/\n"));
    }

    /// Whether signal `signal` is in the `SigIgn` mask of `/proc/<pid>/status` text.
    fn ignores(status: &str, signal: Signal) -> bool {
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap();
        mask & (1 << (signal as i32 - 1)) != 0
    }

    /// A host started as a background job of a non-interactive shell inherits SIGINT ignored;
    /// its agents must not, or an interrupt (SIGINT to the group) cannot reach them at all.
    /// The test runs itself again with SIGINT ignored, and there checks what a spawned agent
    /// gets.
    #[test]
    fn an_agent_gets_sigint_at_its_default_even_when_the_host_ignores_it() {
        const MARKER: &str = "AGENT_HOST_TEST_SIGINT_IGNORED";
        if std::env::var_os(MARKER).is_none() {
            let name = std::thread::current().name().unwrap().to_owned();
            let status = std::process::Command::new("/bin/sh")
                .args(["-c", "trap '' INT; exec \"$0\" \"$@\""])
                .arg(std::env::current_exe().unwrap())
                .args([&name, "--exact", "--test-threads=1"])
                .env(MARKER, "1")
                .status()
                .unwrap();
            assert!(status.success(), "{name} failed with SIGINT ignored");
            return;
        }
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(
            ignores(&own, Signal::SIGINT),
            "the set-up did not ignore SIGINT"
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = runtime.block_on(async {
            let mut child = spawn(&spec("cat /proc/self/status")).unwrap();
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(child.stdout.as_mut().unwrap(), &mut out)
                .await
                .unwrap();
            assert!(child.wait().await.unwrap().success());
            out
        });
        assert!(!ignores(&out, Signal::SIGINT), "the agent ignores SIGINT");
    }

    #[tokio::test]
    async fn stop_takes_the_whole_group_including_grandchildren() {
        // The leader ignores SIGTERM and leaves a grandchild behind: both must go.
        let mut child = spawn(&spec("trap '' TERM; sleep 300 & echo $!; wait")).unwrap();
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().unwrap(),
        ));
        let grandchild: i32 = lines
            .next_line()
            .await
            .unwrap()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let pgid = child.pid().unwrap() as i32;
        let grandchild_exit = reap::exit_of(grandchild);
        let status = child.stop(Duration::from_millis(200)).await.unwrap();
        assert!(!status.success());
        // SIGKILL is delivered asynchronously, but `stop` waits for the killed to exit: once
        // it returns, nothing in the group still runs (a killed child whose reaper is slow may
        // linger as a zombie, which holds no resources but the pid).
        let alive = running_in_group(pgid);
        assert!(
            alive.is_empty(),
            "still running in the group: {alive:?} (grandchild {grandchild})"
        );
        tokio::time::timeout(Duration::from_secs(10), grandchild_exit)
            .await
            .expect("the grandchild outlived its group's SIGKILL");
    }

    /// Pids of processes in group `pgid` that are not zombies, from `/proc/*/stat`: the
    /// tests' own reading, independent of [`reap::group_members`] which the code under test
    /// uses.
    pub(crate) fn running_in_group(pgid: i32) -> Vec<i32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // After the command: state, ppid, pgrp.
            if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
                && fields.first() != Some(&"Z")
            {
                found.push(pid);
            }
        }
        found
    }

    #[tokio::test]
    async fn stderr_that_is_not_utf8_does_not_kill_the_child() {
        let mut child = spawn(&spec(
            "printf '\\377\\376 not utf-8\\n' >&2; head -c 100000 /dev/zero | tr '\\0' x >&2; echo >&2; echo done",
        ))
        .unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(child.stdout.as_mut().unwrap(), &mut out)
            .await
            .unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status}");
        assert_eq!(out, "done\n");
    }

    #[tokio::test]
    async fn a_missing_cwd_is_workspace_unavailable() {
        let mut s = spec("true");
        s.cwd = "/nonexistent/workspace".into();
        assert_eq!(
            spawn(&s).unwrap_err().category,
            ErrorCategory::WorkspaceUnavailable
        );
    }

    #[tokio::test]
    async fn a_missing_binary_is_binary_unavailable() {
        let mut s = spec("true");
        s.program = "/nonexistent/agent".into();
        let err = spawn(&s).unwrap_err();
        assert_eq!(err.category, ErrorCategory::BinaryUnavailable);
    }
}
