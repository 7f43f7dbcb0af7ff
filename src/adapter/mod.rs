//! Agent adapters (design §9): the contract every protocol family fulfils, the one spawn
//! policy ([`spawn`]), and finding and probing each family's binary.
//!
//! So far this module holds the parts every family shares: a [`Descriptor`] with explicit
//! capabilities (a capability a family lacks is declared, never faked), binary resolution
//! (config / env / `PATH`), and [`probe`] (found, version, usable or why not), which
//! `agent.list` reports. The contract's live half (the [`AgentSession`] handle, [`AdapterError`])
//! is defined by the session layer below (`session::agent`); [`launch`] implements its
//! `Launcher` and [`open`] starts a family's driver. A family without a driver yet says
//! `turns: false`.

pub mod acp;
pub mod acp_process;
pub mod categories;
pub mod claude;
pub mod claude_process;
pub mod codex;
pub mod codex_native;
pub mod codex_process;
pub mod env_hint;
pub mod families;
pub mod family;
pub mod gemini;
pub mod oneshot_process;
/// `agent.list`: each agent family and registered agent, probed at once (each may take up to
/// its timeout), and the registered agents whose configuration is invalid.
pub async fn agents_report(config: &crate::config::Config) -> serde_json::Value {
    let base_env = spawn::filter_env(config.env.iter().cloned());
    let (defs, bad) = launch::agent_defs(config);
    let probes = defs.iter().map(|(agent_type, def)| {
        let base_env = &base_env;
        async move { probe(agent_type, def, base_env).await }
    });
    let agents = futures_util::future::join_all(probes).await;
    let invalid: Vec<serde_json::Value> = bad
        .into_iter()
        .map(|b| serde_json::json!({"agent_type": b.agent_type, "reason": b.reason}))
        .collect();
    serde_json::json!({"agents": agents, "invalid": invalid})
}

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod fixtures;
pub mod jsonrpc;
pub mod launch;
pub mod lines;
pub mod open;
pub mod reap;
mod rpc_driver;
pub mod spawn;

pub use crate::session::agent::{
    AdapterError, AgentInput, AgentOutput, AgentSession, Capabilities, Honoured, ModelSwitch,
    Native, OptionCaps, PermissionAck, ProcessModel, ResumeKind, Support,
};
pub use launch::AgentSettings;
pub use open::OpenSpec;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tokio::io::AsyncReadExt;

use crate::protocol::events::ErrorCategory;

/// A protocol family's fixed facts (its [`family::AgentFamily`] gives them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Descriptor {
    pub agent_type: &'static str,
    pub protocol: &'static str,
    /// The command looked up on `PATH` when no binary is configured.
    pub default_binary: &'static str,
    /// The environment variable that names the binary (wins over `config.toml`).
    pub binary_env: &'static str,
    /// `--version` (or equivalent) arguments for the probe.
    pub version_args: &'static [&'static str],
    pub capabilities: Capabilities,
    /// Whether this build can run turns with it yet.
    pub turns: bool,
    /// For a family without a permission round trip: the policy its agents run under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission_policy: Option<&'static str>,
}

/// The descriptor of a built-in agent type.
pub fn descriptor(agent_type: &str) -> Option<&'static Descriptor> {
    family::family(agent_type).map(|f| f.descriptor())
}

/// Where a family's binary is, or the error with the path (or name) tried.
pub fn resolve_binary(
    configured: Option<&str>,
    default_name: &str,
    search_path: Option<&str>,
    cwd: &Path,
) -> Result<PathBuf, AdapterError> {
    let wanted = configured.unwrap_or(default_name);
    if wanted.contains('/') {
        let path = PathBuf::from(wanted);
        if is_executable(&path) {
            return Ok(path);
        }
        return Err(AdapterError::new(
            ErrorCategory::BinaryUnavailable,
            format!("{} is not an executable file", path.display()),
        ));
    }
    which::which_in(wanted, search_path, cwd).map_err(|_| {
        AdapterError::new(
            ErrorCategory::BinaryUnavailable,
            format!(
                "{wanted} not found on PATH ({})",
                search_path.unwrap_or("PATH is not set")
            ),
        )
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What `agent.list` reports for one family.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    pub agent_type: String,
    pub protocol: &'static str,
    /// Registered in `config.toml` rather than built in.
    pub registered: bool,
    /// What an ACP agent declared in its `initialize` answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<acp::AgentCaps>,
    pub capabilities: Capabilities,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission_policy: Option<&'static str>,
    /// The binary found (or tried).
    pub binary: String,
    pub version: Option<String>,
    pub usable: bool,
    /// Why not usable: a category from design §9 and a sentence.
    pub error: Option<ErrorCategory>,
    pub reason: Option<String>,
    /// Whether this build runs turns with this family yet.
    pub turns: bool,
}

/// How long a `--version` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Find and ask the binary for its version (an ACP agent: its `initialize` answer), under the
/// spawn policy.
pub async fn probe(
    agent_type: &str,
    def: &launch::AgentDef,
    base_env: &[(String, String)],
) -> ProbeReport {
    let family = def.family.descriptor();
    let configured = def.binary.as_deref();
    let search_path = base_env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let cwd = std::env::temp_dir();
    let mut report = ProbeReport {
        agent_type: agent_type.to_owned(),
        protocol: family.protocol,
        registered: def.registered,
        agent: None,
        capabilities: family.capabilities,
        permission_policy: family.permission_policy,
        binary: configured.unwrap_or(family.default_binary).to_owned(),
        version: None,
        usable: false,
        error: None,
        reason: None,
        turns: family.turns,
    };
    let binary = match resolve_binary(configured, family.default_binary, search_path, &cwd) {
        Ok(binary) => binary,
        Err(e) => {
            report.error = Some(e.category);
            report.reason = Some(e.message);
            return report;
        }
    };
    report.binary = binary.display().to_string();
    let args = def.args();
    // The probe runs the agent: it gets what a session's agent gets, no more.
    let base_env = launch::scoped_env(base_env, def.family);
    let base_env = base_env.as_slice();
    let probed = def
        .family
        .probe(
            family::ProbeSpec {
                binary: &binary,
                args: &args,
                base_env,
                extra_env: &def.env,
                cwd: &cwd,
            },
            PROBE_TIMEOUT,
        )
        .await
        .map(|probed| {
            report.agent = probed.agent;
            probed.version.unwrap_or_default()
        });
    match probed {
        Ok(version) => {
            report.version = Some(version).filter(|v| !v.is_empty());
            report.usable = true;
        }
        Err(e) => {
            report.error = Some(e.category);
            report.reason = Some(e.message);
        }
    }
    report
}

async fn version_of(
    binary: &Path,
    family: &Descriptor,
    spec: family::ProbeSpec<'_>,
    timeout: Duration,
) -> Result<String, AdapterError> {
    let mut child = spawn::spawn(&spawn::SpawnSpec {
        program: binary.to_owned(),
        args: family
            .version_args
            .iter()
            .map(|a| (*a).to_owned())
            .collect(),
        cwd: spec.cwd.to_owned(),
        base_env: spec.base_env.to_vec(),
        extra_env: spec.extra_env.to_vec(),
        session_id: None,
        home: None,
        label: format!("{} probe", family.agent_type),
    })?;
    drop(child.stdin.take());
    let mut out = String::new();
    let read = async {
        if let Some(stdout) = child.stdout.as_mut() {
            // A version line is short; never read an unbounded amount from a stranger.
            stdout.take(64 * 1024).read_to_string(&mut out).await?;
        }
        child.wait().await
    };
    let status = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| {
            AdapterError::new(
                ErrorCategory::AgentFailed,
                format!(
                    "{} --version did not answer within {timeout:?}",
                    binary.display()
                ),
            )
        })?
        .map_err(|e| AdapterError::new(ErrorCategory::AgentFailed, e.to_string()))?;
    if !status.success() {
        return Err(AdapterError::new(
            ErrorCategory::AgentFailed,
            format!("{} --version exited with {status}", binary.display()),
        ));
    }
    parse_version(&out).ok_or_else(|| {
        AdapterError::new(
            ErrorCategory::ProtocolIncompatible,
            format!(
                "no version in the output of {} --version: {:?}",
                binary.display(),
                out.trim()
            ),
        )
    })
}

/// The first token that looks like a version (`2.1.197 (Claude Code)`, `codex-cli 0.171.0`).
pub fn parse_version(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',')
        .map(|t| t.trim_start_matches('v'))
        .find(|t| {
            let mut parts = t.split('.');
            let numeric = |p: Option<&str>| {
                p.is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            };
            numeric(parts.next()) && numeric(parts.next())
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_found_in_the_usual_shapes() {
        assert_eq!(
            parse_version("2.1.197 (Claude Code)\n").as_deref(),
            Some("2.1.197")
        );
        assert_eq!(
            parse_version("codex-cli 0.171.0").as_deref(),
            Some("0.171.0")
        );
        assert_eq!(parse_version("tool v1.2").as_deref(), Some("1.2"));
        assert_eq!(parse_version("no version here"), None);
    }

    #[test]
    fn missing_binaries_name_what_was_tried() {
        let err = resolve_binary(
            None,
            "surely-no-such-agent",
            Some("/nonexistent"),
            Path::new("/"),
        )
        .unwrap_err();
        assert_eq!(err.category, ErrorCategory::BinaryUnavailable);
        assert!(
            err.message.contains("surely-no-such-agent") && err.message.contains("/nonexistent")
        );
        let err = resolve_binary(Some("/nonexistent/claude"), "claude", None, Path::new("/"))
            .unwrap_err();
        assert!(
            err.message.contains("/nonexistent/claude"),
            "{}",
            err.message
        );
        assert_eq!(
            resolve_binary(Some("/bin/sh"), "x", None, Path::new("/")).unwrap(),
            PathBuf::from("/bin/sh")
        );
    }

    #[test]
    fn every_family_has_its_own_agent_type_and_protocol() {
        let mut names: Vec<&str> = family::FAMILIES
            .iter()
            .map(|f| f.descriptor().agent_type)
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), family::FAMILIES.len());
        for name in family::protocol_names() {
            assert!(family::family_of_protocol(name).is_some(), "{name}");
        }
    }

    /// `agent.list` offers a permission mode only to a family that asks (`ask` always, then),
    /// and a family that never asks (it declares a policy instead) none: an explicit `ask` is
    /// refused for it.
    #[test]
    fn only_a_family_that_asks_lists_permission_modes() {
        use crate::protocol::options::PermissionMode;
        for f in family::FAMILIES {
            let d = f.descriptor();
            let modes = d.capabilities.options.permission_modes;
            if d.capabilities.permissions {
                assert!(modes.contains(&PermissionMode::Ask), "{}", d.agent_type);
            } else {
                assert!(modes.is_empty(), "{}: {modes:?}", d.agent_type);
                assert!(d.permission_policy.is_some(), "{}", d.agent_type);
            }
        }
        assert!(Capabilities::NONE.options.permission_modes.is_empty());
    }
}
