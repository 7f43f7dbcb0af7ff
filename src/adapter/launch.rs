//! How agents are started for the session layer: [`AgentSettings`] (the environment snapshot
//! and per-family settings taken from the [`Config`] once at start) implements the session
//! layer's `Launcher`, turning each request into an [`OpenSpec`] for the family's driver.
//!
//! Environment scoping: every agent gets the spawn policy's allow-list of the host's
//! environment (HOME, PATH, locale, proxies, provider keys and base URLs, agent config dirs),
//! less the other vendors' keys for the families that only talk to one vendor (claude gets no
//! `OPENAI_*`, codex no `ANTHROPIC_*`; ACP agents can be anything, so they get all), then its
//! family's `[agents.<type>] env` from `config.toml`, which wins (and can add a key back).
//! Between the two, the variables the agent's own configuration names
//! (`AgentFamily::config_env`: a Codex provider's `env_key`) pass from the host's whole
//! environment as it has them (`spawn::named_by_config`), read at each start of an agent.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::family::{AgentFamily, FAMILIES, Vars, family_of_protocol, protocol_names};
use super::reap::HomeMarker;
use super::spawn::{HostEnv, filter_env, named_by_config};
use super::{AdapterError, AgentSession, Capabilities, Native, OpenSpec, OptionCaps, Support};
use crate::adapter;
use crate::config::Config;
use crate::protocol::options::SessionOptions;
use crate::session::agent::{FileChanges, Launcher, NativeFile};
use crate::session::discover::{Discovered, HistoryEntry};

/// One agent type the host can run: a built-in family, or a registered agent.
#[derive(Clone)]
pub struct AgentDef {
    /// The protocol family (its driver, capabilities, defaults).
    pub family: &'static dyn AgentFamily,
    /// The binary configured (a path or a name on `PATH`), if any.
    pub binary: Option<String>,
    /// Arguments before the family's own (a registered agent's command).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Registered in `config.toml` (as opposed to a built-in family).
    pub registered: bool,
}

impl std::fmt::Debug for AgentDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentDef")
            .field("family", &self.family.descriptor().agent_type)
            .field("binary", &self.binary)
            .field("args", &self.args)
            .field(
                "env",
                &crate::config::EnvNames(self.env.iter().map(|(k, _)| k)),
            )
            .field("registered", &self.registered)
            .finish()
    }
}

impl AgentDef {
    /// The arguments before the family's own per-session ones: the family's, then a
    /// registered agent's command's.
    pub fn args(&self) -> Vec<String> {
        self.family
            .default_args()
            .iter()
            .map(|a| (*a).to_owned())
            .chain(self.args.iter().cloned())
            .collect()
    }
}

/// The host's (already filtered) environment less what `family` must not see: another
/// vendor's variables by its `foreign_env`, and what passed only as some other family's own
/// (`own_env`).
pub fn scoped_env(
    base_env: &[(String, String)],
    family: &dyn AgentFamily,
) -> Vec<(String, String)> {
    let foreign = family.foreign_env();
    let own = family.own_env();
    base_env
        .iter()
        .filter(|(k, _)| !foreign.iter().any(|f| k.starts_with(f)))
        .filter(|(k, _)| super::spawn::passes_to_all(k) || own.iter().any(|p| k.starts_with(p)))
        .cloned()
        .collect()
}

/// Why a registered agent in `config.toml` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadAgent {
    pub agent_type: String,
    pub reason: String,
}

/// Every agent type of a configuration: the built-in families, then the registered agents
/// (a registered entry without a usable `command` or `protocol` is left out and reported).
pub fn agent_defs(config: &Config) -> (BTreeMap<String, AgentDef>, Vec<BadAgent>) {
    let env_of = |name: &str| -> Vec<(String, String)> {
        config
            .agents
            .get(name)
            .map(|a| a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    let mut defs: BTreeMap<String, AgentDef> = FAMILIES
        .iter()
        .map(|&family| {
            let d = family.descriptor();
            (
                d.agent_type.to_owned(),
                AgentDef {
                    family,
                    binary: config.agent_binary(d.agent_type, d.binary_env),
                    args: Vec::new(),
                    env: env_of(d.agent_type),
                    registered: false,
                },
            )
        })
        .collect();
    let mut bad = Vec::new();
    for (name, agent) in &config.agents {
        let bad_agent = |reason: String| BadAgent {
            agent_type: name.clone(),
            reason,
        };
        if adapter::descriptor(name).is_some() {
            if agent.command.is_some() || agent.protocol.is_some() {
                bad.push(bad_agent(format!(
                    "{name:?} is a built-in family: its command and protocol are ignored (use \
                     `binary`, or register the agent under another name)"
                )));
            }
            continue;
        }
        let Some(family) = agent.protocol.as_deref().and_then(family_of_protocol) else {
            bad.push(bad_agent(format!(
                "protocol must be one of {:?}, not {:?}",
                protocol_names(),
                agent.protocol
            )));
            continue;
        };
        let Some((program, args)) = agent.command.as_deref().and_then(<[String]>::split_first)
        else {
            bad.push(bad_agent("a registered agent needs a command".to_owned()));
            continue;
        };
        if program.contains('/') && !program.starts_with('/') {
            bad.push(bad_agent(format!(
                "the command {program:?} must be an absolute path or a name on PATH"
            )));
            continue;
        }
        defs.insert(
            name.clone(),
            AgentDef {
                family,
                binary: Some(program.clone()),
                args: args.to_vec(),
                env: env_of(name),
                registered: true,
            },
        );
    }
    (defs, bad)
}

/// Everything needed to start any agent, fixed at host start.
#[derive(Debug, Clone, Default)]
pub struct AgentSettings {
    base_env: Vec<(String, String)>,
    /// The host's whole environment, for the variables agents' own configurations name.
    host_env: HostEnv,
    /// The host's `config.toml`, named in hints.
    config_path: std::path::PathBuf,
    /// What marks this home's agent processes (none for settings built without a home).
    home: Option<HomeMarker>,
    agents: BTreeMap<String, AgentDef>,
    /// How long an idle agent process is kept (`None`: for ever).
    pub idle_timeout: Option<Duration>,
    /// What each agent type of a negotiating family does with the session options, found by
    /// its probe once (`Launcher::negotiate`) and kept for the host's life.
    negotiated: std::sync::Arc<std::sync::Mutex<BTreeMap<String, OptionCaps>>>,
}

/// Whether a family's options wait for what its agent declares.
fn negotiates(options: &OptionCaps) -> bool {
    [
        options.model,
        options.system_prompt,
        options.mcp_stdio,
        options.mcp_http,
        options.mcp_sse,
        options.images,
        options.files,
    ]
    .contains(&Support::Negotiated)
}

impl AgentSettings {
    pub fn from_config(config: &Config) -> AgentSettings {
        let (agents, bad) = agent_defs(config);
        for b in bad {
            tracing::warn!(agent_type = %b.agent_type, reason = %b.reason, "a registered agent is not usable");
        }
        AgentSettings {
            base_env: filter_env(config.env.iter().cloned()),
            host_env: HostEnv::new(config.env.iter().cloned()),
            config_path: config.home.join("config.toml"),
            home: Some(HomeMarker::of(&config.home)),
            agents,
            idle_timeout: Some(config.agent_idle_timeout),
            negotiated: Default::default(),
        }
    }

    fn search_path(&self) -> Option<&str> {
        self.base_env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
    }

    /// The spec of one agent process for a session of `agent_type` in `cwd`.
    pub fn open_spec(
        &self,
        agent_type: &str,
        cwd: &Path,
        host_session_id: &str,
        native: Native,
        options: &SessionOptions,
    ) -> Result<OpenSpec, AdapterError> {
        let def = self.agents.get(agent_type).ok_or_else(|| {
            AdapterError::new(
                crate::protocol::events::ErrorCategory::ProtocolIncompatible,
                format!("no agent type {agent_type:?}"),
            )
        })?;
        let program = adapter::resolve_binary(
            def.binary.as_deref(),
            def.family.descriptor().default_binary,
            self.search_path(),
            cwd,
        )?;
        let base_env = self.agent_base_env(def);
        Ok(OpenSpec {
            program,
            args: def.args(),
            cwd: cwd.to_owned(),
            base_env,
            extra_env: def.env.clone(),
            host_session_id: host_session_id.to_owned(),
            home: self.home.clone(),
            native,
            options: options.clone(),
        })
    }
}

impl Launcher for AgentSettings {
    fn runs_turns(&self, agent_type: &str) -> bool {
        self.agents
            .get(agent_type)
            .is_some_and(|d| d.family.descriptor().turns)
    }

    fn knows(&self, agent_type: &str) -> bool {
        self.agents.contains_key(agent_type)
    }

    fn check(&self, agent_type: &str) -> Result<(), AdapterError> {
        match self.agents.get(agent_type) {
            // A registered agent is a promise the user made in config.toml: hold them to it.
            Some(def) if def.registered => adapter::resolve_binary(
                def.binary.as_deref(),
                def.family.descriptor().default_binary,
                self.search_path(),
                Path::new("/"),
            )
            .map(|_| ()),
            _ => Ok(()),
        }
    }

    fn open(
        &self,
        agent_type: &str,
        cwd: &Path,
        host_session_id: &str,
        native: Native,
        options: &SessionOptions,
    ) -> Result<AgentSession, AdapterError> {
        let spec = self.open_spec(agent_type, cwd, host_session_id, native, options)?;
        match self.agents.get(agent_type) {
            Some(def) => def.family.open(spec),
            None => Err(AdapterError::new(
                crate::protocol::events::ErrorCategory::ProtocolIncompatible,
                format!("no agent type {agent_type:?}"),
            )),
        }
    }

    fn capabilities(&self, agent_type: &str) -> Capabilities {
        self.agents
            .get(agent_type)
            .map_or(Capabilities::NONE, |d| d.family.descriptor().capabilities)
    }

    /// The family's probe (an ACP agent's `initialize`), run once per agent type; its
    /// answer resolves every `Negotiated` option (`AgentFamily::negotiated_options`). A probe
    /// that fails is not kept: the next create asks again.
    fn negotiate<'a>(
        &'a self,
        agent_type: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<OptionCaps, AdapterError>> {
        Box::pin(async move {
            let Some(def) = self.agents.get(agent_type) else {
                return Ok(OptionCaps::NONE);
            };
            let options = def.family.descriptor().capabilities.options;
            if !negotiates(&options) {
                return Ok(options);
            }
            let known = self
                .negotiated
                .lock()
                .ok()
                .and_then(|n| n.get(agent_type).copied());
            if let Some(known) = known {
                return Ok(known);
            }
            let report = adapter::probe(agent_type, def, &self.base_env).await;
            if !report.usable {
                return Err(AdapterError::new(
                    report
                        .error
                        .unwrap_or(crate::protocol::events::ErrorCategory::AgentFailed),
                    format!(
                        "could not ask {agent_type} what it can do: {}",
                        report.reason.unwrap_or_default()
                    ),
                ));
            }
            let resolved = def.family.negotiated_options(report.agent.as_ref());
            tracing::info!(agent_type, options = ?resolved, "negotiated the session options");
            if let Ok(mut known) = self.negotiated.lock() {
                known.insert(agent_type.to_owned(), resolved);
            }
            Ok(resolved)
        })
    }

    fn check_binding(&self, agent_type: &str, cwd: &Path, native_id: &str) -> Result<(), String> {
        let Some(def) = self.agents.get(agent_type) else {
            return Ok(());
        };
        let lookup = |name: &str| self.var(def, name);
        def.family
            .check_binding(&Vars::new(&lookup), cwd, native_id)
    }

    /// A registered agent of a family that can be any agent (ACP: it has no foreign
    /// variables) could talk to anyone: the host cannot tell its provider.
    fn provider(&self, agent_type: &str) -> Option<crate::protocol::options::ProviderIdentity> {
        let def = self.agents.get(agent_type)?;
        if def.registered && def.family.foreign_env().is_empty() {
            return None;
        }
        let vars = self.agent_env(def);
        let lookup = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        def.family.provider(&Vars::new(&lookup))
    }

    /// Which variable the message says is missing ([`adapter::env_hint::missing_variable`]),
    /// and what the host knows of it: in its environment or not, passed to this agent or
    /// not, and where the agent's own configuration names it.
    fn env_hint(&self, agent_type: &str, message: &str) -> Option<String> {
        use adapter::env_hint::{Presence, hint, missing_variable};
        let var = missing_variable(message)?;
        let def = self.agents.get(agent_type)?;
        let named = def
            .family
            .config_env(&Vars::new(&|name: &str| self.var(def, name)));
        let named_by = named
            .iter()
            .find(|n| n.name == var)
            .map(|n| &n.named_by[..]);
        let given = self
            .agent_env(def)
            .into_iter()
            .find(|(k, _)| k == var)
            .map(|(_, v)| v);
        let presence = match (given, self.host_env.get(var)) {
            (Some(v), _) if v.trim().is_empty() => Presence::Blank,
            (Some(_), _) => Presence::Passed,
            (None, Some(v)) if v.trim().is_empty() => Presence::Blank,
            (None, Some(_)) => Presence::NotPassed,
            (None, None) => Presence::Absent,
        };
        hint(var, agent_type, presence, named_by, &self.config_path)
    }

    fn default_model(&self, agent_type: &str) -> Option<String> {
        let def = self.agents.get(agent_type)?;
        if def.registered && def.family.foreign_env().is_empty() {
            return None;
        }
        let lookup = |name: &str| self.var(def, name);
        def.family.default_model(&Vars::new(&lookup))
    }

    fn discover(&self, agent_type: &str, cwd: &Path) -> Option<Result<Vec<Discovered>, String>> {
        let def = self.agents.get(agent_type)?;
        // A registered agent speaking a family's own protocol keeps that family's files.
        let lookup = |name: &str| self.var(def, name);
        def.family.discover(&Vars::new(&lookup), cwd)
    }

    fn read_history(
        &self,
        agent_type: &str,
        cwd: &Path,
        native_id: &str,
    ) -> Option<Result<Vec<HistoryEntry>, String>> {
        let def = self.agents.get(agent_type)?;
        let lookup = |name: &str| self.var(def, name);
        def.family.read_history(&Vars::new(&lookup), cwd, native_id)
    }

    fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout
    }

    fn watch(&self, path: &Path) -> Option<FileChanges> {
        match crate::watch::FileWatch::start(path) {
            Ok(watch) => {
                let (guard, changes) = watch.into_parts();
                Some(FileChanges { guard, changes })
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "cannot watch the session file");
                None
            }
        }
    }

    fn native_file(&self, agent_type: &str, cwd: &Path, native_id: &str) -> NativeFile {
        let Some(def) = self.agents.get(agent_type) else {
            return NativeFile::default();
        };
        // A registered agent speaking a family's own protocol keeps that family's files.
        let lookup = |name: &str| self.var(def, name);
        def.family.native_file(&Vars::new(&lookup), cwd, native_id)
    }
}

impl AgentSettings {
    /// The host's variables an agent of `def` starts with: the spawn policy's, scoped to its
    /// family, and those its own configuration names (read now).
    fn agent_base_env(&self, def: &AgentDef) -> Vec<(String, String)> {
        let mut env = scoped_env(&self.base_env, def.family);
        let named = def
            .family
            .config_env(&Vars::new(&|name: &str| self.var(def, name)));
        let extra = named_by_config(&self.host_env, &env, named.iter().map(|n| n.name.as_str()));
        env.extend(extra);
        env
    }

    /// Every variable an agent of `def` starts with, as it sees them: its own env over
    /// [`Self::agent_base_env`].
    fn agent_env(&self, def: &AgentDef) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = def.env.iter().rev().cloned().collect();
        env.extend(self.agent_base_env(def));
        env
    }

    /// A variable as an agent of `def` sees it: its own env over the host's snapshot.
    fn var(&self, def: &AgentDef, name: &str) -> Option<String> {
        def.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .or_else(|| self.base_env.iter().find(|(k, _)| k == name))
            .map(|(_, v)| v.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::events::ErrorCategory;

    /// A vendor's own variables (a family's `own_env`) reach that family's agents only; the
    /// common list reaches every family less its foreign prefixes.
    #[test]
    fn a_familys_own_variables_reach_only_its_agents() {
        let base = super::filter_env(
            [
                ("OPENCODE_CONFIG", "/oc.json"),
                ("PATH", "/usr/bin"),
                ("ANTHROPIC_API_KEY", "k"),
                ("UNRELATED_SECRET", "s"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        let names = |family: &str| -> Vec<String> {
            let family = crate::adapter::family::family(family).unwrap();
            scoped_env(&base, family)
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        assert_eq!(
            names("opencode"),
            ["OPENCODE_CONFIG", "PATH", "ANTHROPIC_API_KEY"]
        );
        assert_eq!(names("claude"), ["PATH", "ANTHROPIC_API_KEY"]);
        assert_eq!(names("gemini"), ["PATH"]);
    }

    #[test]
    fn binary_and_env_come_from_the_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            "[agents.claude]\nbinary = \"/bin/true\"\nenv = { CLAUDE_CONFIG_DIR = \"/cfg\" }\n",
        )
        .unwrap();
        let mut config = Config::with_home(dir.path()).unwrap();
        config.env = vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("CLAUDECODE".into(), "1".into()),
            ("SECRET_THING".into(), "x".into()),
            ("ANTHROPIC_API_KEY".into(), "a".into()),
            ("OPENAI_API_KEY".into(), "o".into()),
        ];
        let settings = AgentSettings::from_config(&config);
        let spec = settings
            .open_spec(
                "claude",
                Path::new("/"),
                "s1",
                Native::New("n".into()),
                &SessionOptions::default(),
            )
            .unwrap();
        assert_eq!(spec.program, Path::new("/bin/true"));
        let names = |spec: &OpenSpec| -> Vec<String> {
            spec.base_env.iter().map(|(k, _)| k.clone()).collect()
        };
        // Claude gets its vendor's key, not another's.
        assert_eq!(names(&spec), ["PATH", "ANTHROPIC_API_KEY"]);
        assert_eq!(
            spec.extra_env,
            [("CLAUDE_CONFIG_DIR".to_owned(), "/cfg".to_owned())]
        );
        // A family without a configured binary looks on the snapshot's PATH.
        let err = settings
            .open_spec(
                "codex",
                Path::new("/"),
                "s2",
                Native::New("n".into()),
                &SessionOptions::default(),
            )
            .unwrap_err();
        assert_eq!(err.category, ErrorCategory::BinaryUnavailable);
        assert!(err.message.contains("/usr/bin:/bin"), "{}", err.message);
        // Codex the other way round; an ACP agent may be anything, so it gets both.
        let bin = dir.path().join("agent");
        std::fs::write(&bin, "").unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        for family in ["codex", "acp"] {
            config.agents.insert(
                family.into(),
                crate::config::AgentConfig {
                    binary: Some(bin.display().to_string()),
                    env: Default::default(),
                    ..Default::default()
                },
            );
        }
        let settings = AgentSettings::from_config(&config);
        let open = |family: &str| {
            settings
                .open_spec(
                    family,
                    Path::new("/"),
                    "s",
                    Native::New("n".into()),
                    &SessionOptions::default(),
                )
                .unwrap()
        };
        assert_eq!(names(&open("codex")), ["PATH", "OPENAI_API_KEY"]);
        assert_eq!(
            names(&open("acp")),
            ["PATH", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
        );
    }

    #[test]
    fn registered_agents_become_agent_types_and_bad_entries_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            "[agents.mine]\ncommand = [\"/opt/mine\", \"--acp\"]\nprotocol = \"acp\"\n\
             [agents.old]\ncommand = [\"old-agent\"]\nprotocol = \"claude-stream-json\"\n\
             [agents.noproto]\ncommand = [\"x\"]\n\
             [agents.relative]\ncommand = [\"./bin/agent\"]\nprotocol = \"acp\"\n\
             [agents.nocommand]\nprotocol = \"acp\"\n\
             [agents.claude]\nprotocol = \"acp\"\n",
        )
        .unwrap();
        let config = Config::with_home(dir.path()).unwrap();
        let (defs, bad) = agent_defs(&config);
        let mine = &defs["mine"];
        assert_eq!(mine.family.descriptor().agent_type, "acp");
        assert_eq!(mine.binary.as_deref(), Some("/opt/mine"));
        assert_eq!(mine.args, ["--acp"]);
        assert!(mine.registered);
        assert_eq!(defs["old"].family.descriptor().agent_type, "claude");
        assert!(!defs["claude"].registered);
        let mut refused: Vec<&str> = bad.iter().map(|b| b.agent_type.as_str()).collect();
        refused.sort_unstable();
        assert_eq!(refused, ["claude", "nocommand", "noproto", "relative"]);
        for name in ["noproto", "relative", "nocommand"] {
            assert!(!defs.contains_key(name), "{name}");
        }
        // A registered agent's missing command is refused at session creation.
        let settings = AgentSettings::from_config(&config);
        let err = settings.check("mine").unwrap_err();
        assert_eq!(err.category, ErrorCategory::BinaryUnavailable);
        assert!(settings.check("claude").is_ok(), "built-ins fail lazily");
    }
}
