//! The one abstraction of an agent family ([`AgentFamily`]) and the registry of every family
//! this build knows ([`FAMILIES`]). A family owns everything that differs between agents: its
//! descriptor and capabilities, which of the host's variables it must not see, how its driver
//! is opened (new / resume / fork), how it is probed, where its native session file lives and
//! the ownership hooks over it (line attribution, the registry of live CLIs), and the check
//! that a native session belongs to a workspace. Everything above (`launch`, `agent.list`, the
//! session layer) goes through this trait; no other module matches on a family's name.
//!
//! Adding a family is one file in `families/` and one line in [`FAMILIES`]
//! (`docs/adding-an-agent.md`).

use std::path::{Path, PathBuf};

use futures_util::future::BoxFuture;

use super::families;
use super::{AdapterError, AgentSession, Descriptor, OpenSpec};
use crate::session::agent::NativeFile;
use crate::session::discover::{Discovered, HistoryEntry};

/// The variables an agent of a session runs with (its `[agents.<type>] env` over the host's
/// snapshot), for a family that looks up its files.
pub struct Vars<'a> {
    lookup: &'a (dyn Fn(&str) -> Option<String> + Sync),
}

impl<'a> Vars<'a> {
    pub fn new(lookup: &'a (dyn Fn(&str) -> Option<String> + Sync)) -> Self {
        Vars { lookup }
    }

    /// A variable's value, if set and not empty.
    pub fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.is_empty())
    }

    /// A directory named by `name`, else `$HOME/<fallback>`.
    pub fn dir_or_home(&self, name: &str, fallback: &str) -> Option<PathBuf> {
        self.get(name)
            .map(PathBuf::from)
            .or_else(|| self.get("HOME").map(|h| Path::new(&h).join(fallback)))
    }
}

/// A variable an agent's own configuration names ([`AgentFamily::config_env`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedVar {
    pub name: String,
    /// Where it is named, for people: "`env_key` of `[model_providers.mock]` in
    /// /home/u/.codex/config.toml".
    pub named_by: String,
}

/// What a probe needs: the binary found, the arguments the agent type adds, the environment.
pub struct ProbeSpec<'a> {
    pub binary: &'a Path,
    pub args: &'a [String],
    pub base_env: &'a [(String, String)],
    pub extra_env: &'a [(String, String)],
    pub cwd: &'a Path,
}

/// What a probe learned.
#[derive(Debug, Default)]
pub struct Probed {
    pub version: Option<String>,
    /// What an ACP agent declared in its `initialize` answer.
    pub agent: Option<super::acp::AgentCaps>,
}

/// One protocol family: an agent CLI and how the host drives it.
pub trait AgentFamily: Send + Sync + 'static {
    /// Its name, protocol, binary defaults and capabilities.
    fn descriptor(&self) -> &'static Descriptor;

    /// The `protocol` a registered agent (`[agents.<name>] protocol = …`) names to be driven
    /// by this family; `None`: not for registered agents.
    fn protocol_name(&self) -> Option<&'static str> {
        None
    }

    /// Arguments the family puts before an agent type's own (e.g. `--acp`).
    fn default_args(&self) -> &'static [&'static str] {
        &[]
    }

    /// Variables (by prefix) its agents do not get from the host environment: another
    /// vendor's credentials and settings.
    fn foreign_env(&self) -> &'static [&'static str] {
        &[]
    }

    /// Variables (by prefix) of its own vendor that its agents get from the host environment
    /// beyond the spawn policy's common list (`spawn::passes`), and that no other family's
    /// agents get. A new vendor's keys are declared here, not in the spawn policy.
    fn own_env(&self) -> &'static [&'static str] {
        &[]
    }

    /// Variables the agent's own configuration names as ones it reads from its environment
    /// (Codex's `env_key` of a model provider, say), as that configuration says now (`vars`:
    /// what the agent runs with, to find its files). The host passes each from its own
    /// environment though no prefix of the spawn policy covers it (`spawn::named_by_config`).
    /// Only the user's own configuration counts, never a workspace's: a repository must not
    /// be able to name the host's variables. A file that is missing or does not parse names
    /// nothing.
    fn config_env(&self, _vars: &Vars<'_>) -> Vec<NamedVar> {
        Vec::new()
    }

    /// Start its driver on a new, resumed or forked native session.
    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError>;

    /// Find out the binary's version (and what else the agent declares), under the spawn
    /// policy and within `timeout`.
    fn probe<'a>(
        &'a self,
        spec: ProbeSpec<'a>,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Probed, AdapterError>> {
        Box::pin(async move {
            let version = super::version_of(spec.binary, self.descriptor(), spec, timeout).await?;
            Ok(Probed {
                version: Some(version),
                agent: None,
            })
        })
    }

    /// What the family does with each session option once its agent said what it can do
    /// (`agent`: an ACP agent's `initialize` answer; `None`: not asked): every `Negotiated`
    /// entry of the descriptor's [`OptionCaps`](super::OptionCaps) resolved to `Native` or
    /// `Absent`. By default the descriptor's own.
    fn negotiated_options(&self, _agent: Option<&super::acp::AgentCaps>) -> super::OptionCaps {
        self.descriptor().capabilities.options
    }

    /// Where the native session `native_id` of `cwd` lives, and the ownership hooks over it.
    fn native_file(&self, _vars: &Vars<'_>, _cwd: &Path, _native_id: &str) -> NativeFile {
        NativeFile::default()
    }

    /// Whether the native session `native_id` belongs to `cwd` as far as the family's own
    /// records say; `Err` says why not (the session is then never resumed or imported there).
    fn check_binding(&self, _vars: &Vars<'_>, _cwd: &Path, _native_id: &str) -> Result<(), String> {
        Ok(())
    }

    /// The family's own sessions of `cwd`, as its files tell them (`session.discover`), in any
    /// order and bounded (the files read, and how much of each); `None`: not supported (the
    /// command answers `option_unsupported`). `cwd` is canonical.
    fn discover(&self, _vars: &Vars<'_>, _cwd: &Path) -> Option<Result<Vec<Discovered>, String>> {
        None
    }

    /// The conversation of the native session `native_id` of `cwd`, oldest first, as the
    /// family's files tell it (shown at `session.import`, marked imported); `None`: not
    /// supported. `Err`: the history is there but cannot be read.
    fn read_history(
        &self,
        _vars: &Vars<'_>,
        _cwd: &Path,
        _native_id: &str,
    ) -> Option<Result<Vec<HistoryEntry>, String>> {
        None
    }

    /// The model provider its agent talks to with these variables (and the files they name):
    /// the base URL's host and a hash of the key (`session::binding::provider_identity`), for
    /// the session's binding. `None`: the family cannot tell.
    fn provider(&self, _vars: &Vars<'_>) -> Option<crate::protocol::options::ProviderIdentity> {
        None
    }

    /// The model its agent runs when the session names none, as its configuration says.
    fn default_model(&self, _vars: &Vars<'_>) -> Option<String> {
        None
    }
}

/// Every family this build knows, in the order `agent.list` shows them.
pub static FAMILIES: &[&dyn AgentFamily] = &[
    &families::claude::Claude,
    &families::codex::Codex,
    &families::acp::Acp,
    &families::gemini::Gemini,
    &families::gemini_acp::GeminiAcp,
    &families::opencode::OpenCode,
];

/// The family of a built-in agent type.
pub fn family(agent_type: &str) -> Option<&'static dyn AgentFamily> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.descriptor().agent_type == agent_type)
}

/// The family a registered agent's `protocol` names.
pub fn family_of_protocol(protocol: &str) -> Option<&'static dyn AgentFamily> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.protocol_name() == Some(protocol))
}

/// The protocol names registered agents may use, for an error message.
pub fn protocol_names() -> Vec<&'static str> {
    FAMILIES.iter().filter_map(|f| f.protocol_name()).collect()
}
