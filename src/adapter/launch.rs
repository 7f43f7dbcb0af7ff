//! How agents are started for the session layer: [`AgentSettings`] (the environment snapshot
//! and per-family settings taken from the [`Config`] once at start) implements the session
//! layer's `Launcher`, turning each request into an [`OpenSpec`] for the family's driver.
//!
//! Environment scoping: every agent gets the spawn policy's allow-list of the host's
//! environment (HOME, PATH, locale, proxies, provider keys and base URLs, agent config dirs),
//! less the other vendors' keys for the families that only talk to one vendor (claude gets no
//! `OPENAI_*`, codex no `ANTHROPIC_*`; ACP agents can be anything, so they get all), then its
//! family's `[agents.<type>] env` from `config.toml`, which wins (and can add a key back).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::spawn::filter_env;
use super::{AdapterError, AgentSession, Native, OpenSpec};
use crate::adapter;
use crate::config::Config;
use crate::session::agent::{FileChanges, Launcher, NativeFile};

/// Variables (by prefix, or exactly) a family's agents do not get from the host environment:
/// another vendor's credentials and settings.
fn foreign(agent_type: &str) -> &'static [&'static str] {
    match agent_type {
        "claude" => &[
            "OPENAI_",
            "AZURE_OPENAI_",
            "OPENROUTER_",
            "GEMINI_",
            "CODEX_HOME",
        ],
        "codex" => &["ANTHROPIC_", "CLAUDE_CODE_", "CLAUDE_CONFIG_DIR", "GEMINI_"],
        _ => &[],
    }
}

#[derive(Debug, Clone, Default)]
struct Family {
    binary: Option<String>,
    env: Vec<(String, String)>,
}

/// Everything needed to start any family's agent, fixed at host start.
#[derive(Debug, Clone, Default)]
pub struct AgentSettings {
    base_env: Vec<(String, String)>,
    families: BTreeMap<String, Family>,
    /// How long an idle agent process is kept (`None`: for ever).
    pub idle_timeout: Option<Duration>,
}

impl AgentSettings {
    pub fn from_config(config: &Config) -> AgentSettings {
        let families = adapter::FAMILIES
            .iter()
            .map(|d| {
                let env = config
                    .agents
                    .get(d.agent_type)
                    .map(|a| a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default();
                (
                    d.agent_type.to_owned(),
                    Family {
                        binary: config.agent_binary(d.agent_type, d.binary_env),
                        env,
                    },
                )
            })
            .collect();
        AgentSettings {
            base_env: filter_env(config.env.iter().cloned()),
            families,
            idle_timeout: Some(config.agent_idle_timeout),
        }
    }

    /// The spec of one agent process for a session of `agent_type` in `cwd`.
    pub fn open_spec(
        &self,
        agent_type: &str,
        cwd: &Path,
        host_session_id: &str,
        native: Native,
    ) -> Result<OpenSpec, AdapterError> {
        let descriptor = adapter::descriptor(agent_type).ok_or_else(|| {
            AdapterError::new(
                crate::protocol::events::ErrorCategory::ProtocolIncompatible,
                format!("no adapter family {agent_type:?}"),
            )
        })?;
        let family = self.families.get(agent_type).cloned().unwrap_or_default();
        let search_path = self
            .base_env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str());
        let program = adapter::resolve_binary(
            family.binary.as_deref(),
            descriptor.default_binary,
            search_path,
            cwd,
        )?;
        let foreign = foreign(agent_type);
        let base_env = self
            .base_env
            .iter()
            .filter(|(k, _)| !foreign.iter().any(|f| k.starts_with(f)))
            .cloned()
            .collect();
        Ok(OpenSpec {
            program,
            cwd: cwd.to_owned(),
            base_env,
            extra_env: family.env,
            host_session_id: host_session_id.to_owned(),
            native,
        })
    }
}

impl Launcher for AgentSettings {
    fn runs_turns(&self, agent_type: &str) -> bool {
        adapter::descriptor(agent_type).is_some_and(|d| d.turns)
    }

    fn open(
        &self,
        agent_type: &str,
        cwd: &Path,
        host_session_id: &str,
        native: Native,
    ) -> Result<AgentSession, AdapterError> {
        let spec = self.open_spec(agent_type, cwd, host_session_id, native)?;
        super::open::open(agent_type, spec)
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
        let var = |name: &str| -> Option<String> {
            let family = self.families.get(agent_type);
            family
                .and_then(|f| f.env.iter().rev().find(|(k, _)| k == name))
                .or_else(|| self.base_env.iter().find(|(k, _)| k == name))
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        };
        let home = var("HOME").map(std::path::PathBuf::from);
        match agent_type {
            "claude" => {
                let config = var("CLAUDE_CONFIG_DIR")
                    .map(std::path::PathBuf::from)
                    .or_else(|| home.map(|h| h.join(".claude")));
                let path = config.as_ref().and_then(|c| {
                    super::claude::session_file(c, &cwd.to_string_lossy(), native_id)
                });
                NativeFile {
                    path,
                    claude_config: config,
                    entries: Some(super::claude::file_entry),
                }
            }
            "codex" => {
                let codex_home = var("CODEX_HOME")
                    .map(std::path::PathBuf::from)
                    .or_else(|| home.map(|h| h.join(".codex")));
                NativeFile {
                    path: codex_home.and_then(|c| super::codex::rollout_file(&c, native_id)),
                    claude_config: None,
                    entries: None,
                }
            }
            _ => NativeFile::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::events::ErrorCategory;

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
            .open_spec("claude", Path::new("/"), "s1", Native::New("n".into()))
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
            .open_spec("codex", Path::new("/"), "s2", Native::New("n".into()))
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
                },
            );
        }
        let settings = AgentSettings::from_config(&config);
        let open = |family: &str| {
            settings
                .open_spec(family, Path::new("/"), "s", Native::New("n".into()))
                .unwrap()
        };
        assert_eq!(names(&open("codex")), ["PATH", "OPENAI_API_KEY"]);
        assert_eq!(
            names(&open("acp")),
            ["PATH", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
        );
    }
}
