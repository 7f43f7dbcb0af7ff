//! `config.toml` read again while the host runs, on a change of the file (watched) or on
//! `host.reload`: one task owns the running configuration and is the only one to replace it.
//!
//! What a reload changes at once: `log_level` (the log's reload layer), `[agents.*]` and
//! `agent_idle_timeout_s` (new, changed and removed agent definitions: `agent.list` and every
//! agent process started from then on — a new session, a turn that resumes a closed one — use
//! them; a process already running keeps the definition it was started with, until it ends),
//! `[hooks]` (the new hooks follow the bus from then on; the old ones stop as at a shutdown,
//! with its short grace, so an event in the moment of the swap may run both),
//! `[relay]` (the relay client is re-pointed as `host.relay.set` does; a reload whose `[relay]`
//! did not change leaves a relay set over IPC alone), `[fleet]` (the fleet client dials the new
//! URLs; its open channels are kept, as across any lost connection) and
//! `subscriber_max_idle_days`.
//! What it cannot: [`NEEDS_RESTART`], each named in the reply and kept at its running value
//! until the next start (a key changed since the host started is named at every reload).
//!
//! A file that does not parse, or holds a value the host refuses, changes nothing: the reply
//! (or, for a watched change, the log) says which file and line, and the running
//! configuration stays. Checks come first, then every change is applied: a reload is not
//! applied half.
//!
//! Watching: the home directory, so an editor's atomic rename over `config.toml` is seen
//! like a write; a burst of writes is one reload, [`DEBOUNCE`] after the last.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::task::TaskTracker;

use crate::adapter::{AdapterError, AgentSession, AgentSettings, Capabilities, Native, OptionCaps};
use crate::bus::Bus;
use crate::config::{Config, FileConfig};
use crate::hooks::Hooks;
use crate::protocol::options::SessionOptions;
use crate::request::{FleetControl, RelayControl};
use crate::session::agent::{FileChanges, Launcher, NativeFile};
use crate::session::discover::{Discovered, HistoryEntry};
use crate::store::Store;

/// How long the file must stay quiet after a change before it is read.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// The keys only a restart applies, as `config.toml` names them.
pub const NEEDS_RESTART: &[&str] = &[
    "ws_port",
    "ws_allowed_origins",
    "queue_capacity",
    "allow_bypass",
    "attachment_dirs",
    "attachment_max_bytes",
    "log_max_bytes",
    "log_files",
];

/// What a reload did: `host.reload`'s reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// The file read.
    pub path: String,
    /// Keys whose change is in effect now (`agents.<name>` for each agent added, changed or
    /// removed).
    pub applied: Vec<String>,
    /// Keys changed since the host started that only a restart applies.
    pub needs_restart: Vec<String>,
    /// Keys changed but overridden by the environment (`log_level` when `AGENT_HOST_LOG` or
    /// `RUST_LOG` is set), with the variable.
    pub overridden: Vec<String>,
}

/// How reloads have gone, for `host.status` (`config`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadStatus {
    pub path: String,
    /// Reloads applied since start (one that changed nothing counts).
    pub reloads: u64,
    /// The last reload applied, RFC 3339.
    pub last_reload_at: Option<String>,
    /// Why the last attempt was refused, if it was (cleared by the next one applied).
    pub last_error: Option<String>,
}

/// An agent [`Launcher`] whose agent definitions a reload replaces: every call asks the
/// definitions current at that moment. What a family's probe found (`negotiate`) belongs to
/// one set of definitions and is asked again after a reload changes them.
pub struct LiveLauncher {
    current: watch::Receiver<Arc<AgentSettings>>,
}

impl LiveLauncher {
    /// The launcher, and the sender a reload replaces its definitions through.
    pub fn new(settings: AgentSettings) -> (LiveLauncher, watch::Sender<Arc<AgentSettings>>) {
        let (tx, current) = watch::channel(Arc::new(settings));
        (LiveLauncher { current }, tx)
    }

    fn now(&self) -> Arc<AgentSettings> {
        self.current.borrow().clone()
    }
}

impl Launcher for LiveLauncher {
    fn runs_turns(&self, agent_type: &str) -> bool {
        self.now().runs_turns(agent_type)
    }

    fn knows(&self, agent_type: &str) -> bool {
        self.now().knows(agent_type)
    }

    fn capabilities(&self, agent_type: &str) -> Capabilities {
        self.now().capabilities(agent_type)
    }

    fn negotiate<'a>(
        &'a self,
        agent_type: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<OptionCaps, AdapterError>> {
        let settings = self.now();
        Box::pin(async move { settings.negotiate(agent_type).await })
    }

    fn check_binding(&self, agent_type: &str, cwd: &Path, native_id: &str) -> Result<(), String> {
        self.now().check_binding(agent_type, cwd, native_id)
    }

    fn provider(&self, agent_type: &str) -> Option<crate::protocol::options::ProviderIdentity> {
        self.now().provider(agent_type)
    }

    fn default_model(&self, agent_type: &str) -> Option<String> {
        self.now().default_model(agent_type)
    }

    fn env_hint(&self, agent_type: &str, message: &str) -> Option<String> {
        self.now().env_hint(agent_type, message)
    }

    fn discover(&self, agent_type: &str, cwd: &Path) -> Option<Result<Vec<Discovered>, String>> {
        self.now().discover(agent_type, cwd)
    }

    fn read_history(
        &self,
        agent_type: &str,
        cwd: &Path,
        native_id: &str,
    ) -> Option<Result<Vec<HistoryEntry>, String>> {
        self.now().read_history(agent_type, cwd, native_id)
    }

    fn check(&self, agent_type: &str) -> Result<(), AdapterError> {
        self.now().check(agent_type)
    }

    fn open(
        &self,
        agent_type: &str,
        cwd: &Path,
        host_session_id: &str,
        native: Native,
        options: &SessionOptions,
    ) -> Result<AgentSession, AdapterError> {
        self.now()
            .open(agent_type, cwd, host_session_id, native, options)
    }

    fn idle_timeout(&self) -> Option<Duration> {
        self.now().idle_timeout()
    }

    fn native_file(&self, agent_type: &str, cwd: &Path, native_id: &str) -> NativeFile {
        self.now().native_file(agent_type, cwd, native_id)
    }

    fn watch(&self, path: &Path) -> Option<FileChanges> {
        self.now().watch(path)
    }
}

enum Msg {
    Reload(oneshot::Sender<Result<ReloadReport, String>>),
    /// Stop, handing back the hooks running now (the daemon ends them after the bus drains).
    Stop(oneshot::Sender<Option<Hooks>>),
}

/// The handle of the reload task: ask for a reload, read the running configuration.
#[derive(Clone)]
pub struct Reloader {
    tx: mpsc::Sender<Msg>,
    config: watch::Receiver<Arc<Config>>,
    status: watch::Receiver<ReloadStatus>,
}

/// What the reload task is given to change.
pub struct Parts {
    pub config: Arc<Config>,
    pub agents: watch::Sender<Arc<AgentSettings>>,
    pub subscriber_max_idle: watch::Sender<Duration>,
    pub hooks: Option<Hooks>,
    pub bus: Bus,
    pub store: Store,
    pub relay: Arc<dyn RelayControl>,
    pub fleet: Arc<dyn FleetControl>,
}

impl Reloader {
    /// Start the task, watching `config.toml` (a home that cannot be watched still reloads
    /// on `host.reload`).
    pub fn spawn(parts: Parts) -> Reloader {
        let home = parts.config.home.clone();
        let path = parts.config.config_path();
        // What the host started with: what restart-only keys are compared against. A file
        // that does not read now was read at start (else the host would not run): compare
        // against the defaults, and the first good reload names what differs.
        let started = Config::read_file(&home).unwrap_or_default();
        let (config_tx, config) = watch::channel(parts.config.clone());
        let (status_tx, status) = watch::channel(ReloadStatus {
            path: path.display().to_string(),
            ..ReloadStatus::default()
        });
        let watch = match crate::watch::FileWatch::start(&path) {
            Ok(watch) => Some(watch),
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "cannot watch config.toml; host.reload still reloads it");
                None
            }
        };
        let (tx, rx) = mpsc::channel(8);
        let task = ReloadTask {
            config: parts.config,
            applied: started.clone(),
            started,
            config_tx,
            status_tx,
            agents: parts.agents,
            subscriber_max_idle: parts.subscriber_max_idle,
            hooks: parts.hooks,
            retiring: TaskTracker::new(),
            bus: parts.bus,
            store: parts.store,
            relay: parts.relay,
            fleet: parts.fleet,
        };
        tokio::spawn(task.run(rx, watch));
        Reloader { tx, config, status }
    }

    /// Read `config.toml` now and apply it; returns once applied (or refused).
    pub async fn reload(&self) -> Result<ReloadReport, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Reload(reply))
            .await
            .map_err(|_| "the host is shutting down".to_owned())?;
        answer
            .await
            .map_err(|_| "the host is shutting down".to_owned())?
    }

    /// The configuration running now.
    pub fn config(&self) -> Arc<Config> {
        self.config.borrow().clone()
    }

    pub fn status(&self) -> ReloadStatus {
        self.status.borrow().clone()
    }

    /// Stop reloading; the hooks running now come back, for the daemon to end in its order
    /// (hooks a reload replaced have finished by then).
    pub async fn stop(&self) -> Option<Hooks> {
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Msg::Stop(reply)).await.is_err() {
            return None;
        }
        answer.await.ok().flatten()
    }
}

struct ReloadTask {
    config: Arc<Config>,
    /// `config.toml` as the host started with it.
    started: FileConfig,
    /// `config.toml` as last applied.
    applied: FileConfig,
    config_tx: watch::Sender<Arc<Config>>,
    status_tx: watch::Sender<ReloadStatus>,
    agents: watch::Sender<Arc<AgentSettings>>,
    subscriber_max_idle: watch::Sender<Duration>,
    hooks: Option<Hooks>,
    /// Hooks a reload replaced, finishing.
    retiring: TaskTracker,
    bus: Bus,
    store: Store,
    relay: Arc<dyn RelayControl>,
    fleet: Arc<dyn FleetControl>,
}

impl ReloadTask {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Msg>,
        mut watch: Option<crate::watch::FileWatch>,
    ) {
        loop {
            let changed = async {
                match watch.as_mut() {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(Msg::Reload(reply)) => {
                        let result = self.reload().await;
                        // The asker may have gone (its IPC client closed); the reload stands.
                        let _asker_gone = reply.send(result);
                    }
                    Some(Msg::Stop(reply)) => {
                        self.retiring.close();
                        self.retiring.wait().await;
                        let _daemon_gone = reply.send(self.hooks.take());
                        return;
                    }
                    None => return,
                },
                seen = changed => {
                    if !seen {
                        watch = None;
                        continue;
                    }
                    // Quiet for DEBOUNCE: an editor's burst (write, rename, chmod) is one.
                    if let Some(w) = watch.as_mut() {
                        while tokio::time::timeout(DEBOUNCE, w.changed()).await.is_ok() {}
                    }
                    match self.reload().await {
                        Ok(report) => tracing::info!(
                            applied = ?report.applied,
                            needs_restart = ?report.needs_restart,
                            overridden = ?report.overridden,
                            "config.toml changed; reloaded"
                        ),
                        Err(e) => tracing::error!(
                            error = %e,
                            "config.toml changed but is refused; the running configuration stays"
                        ),
                    }
                }
            }
        }
    }

    async fn reload(&mut self) -> Result<ReloadReport, String> {
        let result = self.try_reload().await;
        self.status_tx.send_modify(|status| match &result {
            Ok(_) => {
                status.reloads += 1;
                status.last_reload_at = Some(
                    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
                );
                status.last_error = None;
            }
            Err(e) => status.last_error = Some(e.clone()),
        });
        result
    }

    async fn try_reload(&mut self) -> Result<ReloadReport, String> {
        let path = self.config.config_path();
        tracing::debug!(path = %path.display(), "reading config.toml");
        let file = Config::read_file(&self.config.home).map_err(|e| e.to_string())?;
        let mut next = self
            .config
            .reloaded(file.clone())
            .map_err(|e| e.to_string())?;
        keep_restart_only(&mut next, &self.config);
        let mut report = ReloadReport {
            path: path.display().to_string(),
            ..ReloadReport::default()
        };
        let old = &self.applied.clone();
        // 1. Checks: nothing is applied unless everything can be.
        let log_level = file.log_level != old.log_level;
        if log_level {
            match self.config.log_level_env {
                Some(var) => report.overridden.push(format!("log_level ({var} is set)")),
                None => crate::logging::check_filter(&next.log_level).map_err(|e| {
                    format!(
                        "{} is not valid: log_level {:?} is not a filter: {e}",
                        path.display(),
                        next.log_level
                    )
                })?,
            }
        }
        let relay = file.relay != old.relay;
        if relay && let Some(relay_config) = &next.relay {
            self.relay
                .check(relay_config)
                .map_err(|e| format!("{} is not valid: [relay]: {e}", path.display()))?;
        }
        let fleet = file.fleet != old.fleet;
        if fleet && let Some(fleet_config) = &next.fleet {
            self.fleet
                .check(fleet_config)
                .map_err(|e| format!("{} is not valid: [fleet]: {e}", path.display()))?;
        }
        // 2. Apply.
        if log_level && self.config.log_level_env.is_none() {
            match crate::logging::set_host_filter(&next.log_level) {
                Ok(_applied_or_embedded) => report.applied.push("log_level".to_owned()),
                Err(e) => return Err(format!("log_level: {e}")),
            }
        }
        let agents = agent_changes(old, &file);
        let idle = file.agent_idle_timeout_s != old.agent_idle_timeout_s;
        if !agents.is_empty() || idle {
            let settings = AgentSettings::from_config(&next);
            self.agents.send_replace(Arc::new(settings));
            report.applied.extend(agents);
            if idle {
                report.applied.push("agent_idle_timeout_s".to_owned());
            }
        }
        if file.hooks != old.hooks {
            self.replace_hooks(&next).await?;
            report.applied.push("hooks".to_owned());
        }
        if relay {
            self.relay.set(next.relay.clone());
            report.applied.push("relay".to_owned());
        }
        if fleet {
            self.fleet.set(next.fleet.clone());
            report.applied.push("fleet".to_owned());
        }
        if file.subscriber_max_idle_days != old.subscriber_max_idle_days {
            self.subscriber_max_idle
                .send_replace(next.subscriber_max_idle);
            report.applied.push("subscriber_max_idle_days".to_owned());
        }
        report.needs_restart = restart_changes(&self.started, &file);
        let next = Arc::new(next);
        self.config = next.clone();
        self.config_tx.send_replace(next);
        self.applied = file;
        tracing::debug!(?report, "config.toml applied");
        Ok(report)
    }

    /// The new `[hooks]` follow the bus from now on; the old ones stop in the background as at
    /// a shutdown (`Hooks::shutdown`: a short grace, then what still runs is killed).
    async fn replace_hooks(&mut self, next: &Config) -> Result<(), String> {
        let fresh = Hooks::start(next, &self.bus, self.store.clone())
            .await
            .map_err(|e| format!("hooks cannot run: {e}"))?;
        if let Some(old) = std::mem::replace(&mut self.hooks, fresh) {
            self.retiring.spawn(old.shutdown());
        }
        Ok(())
    }
}

/// What only a restart changes keeps its running value, so the running configuration never
/// claims one it does not use.
fn keep_restart_only(next: &mut Config, running: &Config) {
    next.ws_port = running.ws_port;
    next.ws_allowed_origins = running.ws_allowed_origins.clone();
    next.queue_capacity = running.queue_capacity;
    next.allow_bypass = running.allow_bypass;
    next.attachment_dirs = running.attachment_dirs.clone();
    next.attachment_max_bytes = running.attachment_max_bytes;
    next.log_max_bytes = running.log_max_bytes;
    next.log_files = running.log_files;
}

/// `agents.<name>` for every agent added, changed or removed.
fn agent_changes(old: &FileConfig, new: &FileConfig) -> Vec<String> {
    let mut names: Vec<&String> = old.agents.keys().chain(new.agents.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| old.agents.get(*name) != new.agents.get(*name))
        .map(|name| format!("agents.{name}"))
        .collect()
}

/// The [`NEEDS_RESTART`] keys whose value differs from the one the host started with.
fn restart_changes(started: &FileConfig, new: &FileConfig) -> Vec<String> {
    let differs = [
        started.ws_port != new.ws_port,
        started.ws_allowed_origins != new.ws_allowed_origins,
        started.queue_capacity != new.queue_capacity,
        started.allow_bypass != new.allow_bypass,
        started.attachment_dirs != new.attachment_dirs,
        started.attachment_max_bytes != new.attachment_max_bytes,
        started.log_max_bytes != new.log_max_bytes,
        started.log_files != new.log_files,
    ];
    NEEDS_RESTART
        .iter()
        .zip(differs)
        .filter(|(_, d)| *d)
        .map(|(k, _)| (*k).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn changes_are_named_by_key_and_agent() {
        let old = file(
            "queue_capacity = 3\n[agents.a]\ncommand = [\"a\"]\nprotocol = \"acp\"\n\
             [agents.b]\ncommand = [\"b\"]\nprotocol = \"acp\"\n",
        );
        let new = file(
            "queue_capacity = 5\nws_port = 9\n[agents.a]\ncommand = [\"a\", \"-v\"]\n\
             protocol = \"acp\"\n[agents.c]\ncommand = [\"c\"]\nprotocol = \"acp\"\n",
        );
        assert_eq!(
            agent_changes(&old, &new),
            ["agents.a", "agents.b", "agents.c"]
        );
        assert_eq!(restart_changes(&old, &new), ["ws_port", "queue_capacity"]);
        assert!(restart_changes(&new, &new).is_empty());
        assert!(agent_changes(&new, &new).is_empty());
    }

    #[test]
    fn every_restart_key_is_a_config_key() {
        // A key renamed in FileConfig but not here would be refused by deny_unknown_fields.
        for key in NEEDS_RESTART {
            let text = match *key {
                "ws_allowed_origins" | "attachment_dirs" => format!("{key} = []\n"),
                "allow_bypass" => format!("{key} = false\n"),
                _ => format!("{key} = 2000\n"),
            };
            assert!(toml::from_str::<FileConfig>(&text).is_ok(), "{key}");
        }
    }
}
