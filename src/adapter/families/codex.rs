//! Codex (`codex app-server`, JSON-RPC over stdio): the family. Its rollout files live under
//! `$CODEX_HOME/sessions/…/rollout-*-<thread id>.jsonl`; Codex refuses a second writer by
//! itself, so there is no registry of live holders.

use std::path::Path;

use crate::adapter::family::{AgentFamily, Vars};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, ModelSwitch, OpenSpec, OptionCaps,
    ProcessModel, ResumeKind, Support, codex, codex_native, codex_process,
};
use crate::protocol::options::PermissionMode;
use crate::session::agent::NativeFile;

pub struct Codex;

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "codex",
    protocol: "codex app-server JSON-RPC",
    default_binary: "codex",
    binary_env: "AGENT_HOST_CODEX_BIN",
    version_args: &["--version"],
    capabilities: Capabilities {
        resume: ResumeKind::NativeId,
        permissions: true,
        cancel: true,
        // `turn/steer` into the running turn: the model's next request in that turn carries the
        // text, and the turn ends once (tests/steer.rs,
        // `codex_a_steer_reaches_the_running_turn`).
        steer: true,
        fork: Support::Native,
        usage: true,
        process: ProcessModel::Persistent,
        binding: true,
        // Each as the real app-server showed it against the mock (tests/codex_host.rs, the
        // `codex_driver_*` tests and `codex_session_options_reach_the_model`,
        // `codex_set_model_between_turns`, `codex_image_attachment_reaches_the_model`):
        // `model` and the standing prompt (developer instructions) on
        // `thread/start`/`resume`/`fork`, MCP servers over stdio and streamable HTTP as
        // `config` overrides, `bypass` as approval `never` + sandbox `danger-full-access`,
        // `set_model` as the per-turn override, images as `localImage` inputs. Not declared:
        // MCP over SSE (Codex has no SSE transport), `accept_edits` (no Codex mode of its
        // own: edits in the workspace already run unasked under `ask`), file attachments (no
        // Codex input for them).
        options: OptionCaps {
            model: Support::Native,
            set_model: ModelSwitch::NextTurn,
            system_prompt: Support::Native,
            mcp_stdio: Support::Native,
            mcp_http: Support::Native,
            mcp_sse: Support::Absent,
            permission_modes: &[PermissionMode::Ask, PermissionMode::Bypass],
            images: Support::Native,
            files: Support::Absent,
            // `thread/fork` keeps the thread's original developer instructions.
            system_prompt_on_fork: false,
        },
    },
    turns: true,
    permission_policy: None,
};

impl AgentFamily for Codex {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn protocol_name(&self) -> Option<&'static str> {
        Some("codex-app-server")
    }

    fn foreign_env(&self) -> &'static [&'static str] {
        &[
            "ANTHROPIC_",
            "CLAUDE_CODE_",
            "CLAUDE_CONFIG_DIR",
            "GEMINI_",
            "GOOGLE_",
        ]
    }

    /// The native binary behind an npm launcher ([`codex_native`]), else the program found.
    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
        codex_process::open(prefer_native(spec))
    }

    /// `$CODEX_HOME/config.toml`'s `model_provider` (its `[model_providers.<name>]`
    /// `base_url`, and the value of its `env_key` variable); else OpenAI's
    /// (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
    fn provider(&self, vars: &Vars<'_>) -> Option<crate::protocol::options::ProviderIdentity> {
        codex_provider(vars, codex_config(vars).as_ref())
    }

    /// `$CODEX_HOME/config.toml`'s `model`.
    fn default_model(&self, vars: &Vars<'_>) -> Option<String> {
        codex_config(vars)?
            .get("model")?
            .as_str()
            .map(str::to_owned)
    }

    fn native_file(&self, vars: &Vars<'_>, _cwd: &Path, native_id: &str) -> NativeFile {
        NativeFile {
            path: vars
                .dir_or_home("CODEX_HOME", ".codex")
                .and_then(|c| codex::rollout_file(&c, native_id)),
            claimants: None,
            entries: None,
        }
    }

    /// The rollouts that record this cwd ([`codex::discover_rollouts`]).
    fn discover(
        &self,
        vars: &Vars<'_>,
        cwd: &Path,
    ) -> Option<Result<Vec<crate::session::discover::Discovered>, String>> {
        let Some(home) = vars.dir_or_home("CODEX_HOME", ".codex") else {
            return Some(Err(
                "neither CODEX_HOME nor HOME is set for codex".to_owned()
            ));
        };
        Some(Ok(codex::discover_rollouts(&home, cwd)))
    }

    /// The conversation of the thread's rollout ([`codex::rollout_history`]); no rollout: an
    /// empty history (Codex decides about the id at the first prompt).
    fn read_history(
        &self,
        vars: &Vars<'_>,
        _cwd: &Path,
        native_id: &str,
    ) -> Option<Result<Vec<crate::session::discover::HistoryEntry>, String>> {
        let home = vars.dir_or_home("CODEX_HOME", ".codex")?;
        let Some(rollout) = codex::rollout_file(&home, native_id) else {
            return Some(Ok(Vec::new()));
        };
        Some(
            codex::rollout_history(&rollout)
                .map_err(|e| format!("cannot read {}: {e}", rollout.display())),
        )
    }

    /// The thread's rollout records the cwd it was started in; another one is another
    /// workspace's, and an unreadable one is refused. No rollout: Codex decides
    /// (`resume_rejected`).
    fn check_binding(&self, vars: &Vars<'_>, cwd: &Path, native_id: &str) -> Result<(), String> {
        let Some(rollout) = vars
            .dir_or_home("CODEX_HOME", ".codex")
            .and_then(|c| codex::rollout_file(&c, native_id))
        else {
            return Ok(());
        };
        // Codex does not scope threads by workspace: a rollout whose cwd cannot be read is
        // refused rather than resumed anywhere.
        let Some(recorded) = codex::rollout_cwd(&rollout) else {
            return Err(format!(
                "the cwd Codex thread {native_id} was started in cannot be read from {}",
                rollout.display()
            ));
        };
        let same = |a: &Path, b: &Path| {
            a == b
                || std::fs::canonicalize(a)
                    .is_ok_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
        };
        if same(&recorded, cwd) {
            Ok(())
        } else {
            Err(format!(
                "Codex thread {native_id} was started in {}, not {}",
                recorded.display(),
                cwd.display()
            ))
        }
    }
}

/// `spec` with the native binary an npm launcher would start, and the launcher's variables
/// (the host's scoping is kept: the launcher passes its environment on as it is, plus its
/// own); the program itself when it is no launcher or its binary is missing. Says which.
fn prefer_native(mut spec: OpenSpec) -> OpenSpec {
    let env: Vec<(String, String)> = spec
        .base_env
        .iter()
        .chain(&spec.extra_env)
        .cloned()
        .collect();
    match codex_native::native_of(&spec.program, &env) {
        Some(native) => {
            tracing::info!(
                launcher = %spec.program.display(),
                binary = %native.binary.display(),
                "starting the native Codex binary the npm package ships"
            );
            native.scrub(&mut spec.base_env);
            native.scrub(&mut spec.extra_env);
            spec.extra_env.extend(native.env);
            spec.program = native.binary;
        }
        None => tracing::info!(
            binary = %spec.program.display(),
            "starting Codex as found (no npm launcher with a native binary)"
        ),
    }
    spec
}

/// `$CODEX_HOME/config.toml`, parsed; `None` if there is none or it does not parse (Codex
/// itself then refuses to start, which is said where it runs).
fn codex_config(vars: &Vars<'_>) -> Option<toml::Table> {
    let path = vars
        .dir_or_home("CODEX_HOME", ".codex")?
        .join("config.toml");
    let text = std::fs::read_to_string(path).ok()?;
    text.parse::<toml::Table>().ok()
}

/// The provider a Codex configuration names.
fn codex_provider(
    vars: &Vars<'_>,
    config: Option<&toml::Table>,
) -> Option<crate::protocol::options::ProviderIdentity> {
    let openai = || {
        crate::session::binding::provider_identity(
            vars.get("OPENAI_BASE_URL").as_deref(),
            "https://api.openai.com/v1",
            vars.get("OPENAI_API_KEY").as_deref(),
        )
    };
    let Some(name) = config
        .and_then(|c| c.get("model_provider"))
        .and_then(toml::Value::as_str)
    else {
        return openai();
    };
    let entry = config
        .and_then(|c| c.get("model_providers"))
        .and_then(|p| p.get(name));
    let Some(entry) = entry else {
        if name == "openai" {
            return openai();
        }
        // One of Codex's built-in providers other than OpenAI's: known by its name.
        return Some(crate::protocol::options::ProviderIdentity {
            host: name.to_owned(),
            key_sha256: None,
        });
    };
    let key = entry
        .get("env_key")
        .and_then(toml::Value::as_str)
        .and_then(|k| vars.get(k));
    let base_url = entry.get("base_url").and_then(toml::Value::as_str);
    crate::session::binding::provider_identity(base_url, name, key.as_deref())
}

#[cfg(test)]
mod binding_tests {
    use super::*;

    #[test]
    fn the_provider_is_the_configured_one_else_openai() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().display().to_string();
        let vars_of = |extra: &'static [(&'static str, &'static str)]| {
            let home = home.clone();
            move |name: &str| {
                if name == "CODEX_HOME" {
                    return Some(home.clone());
                }
                extra
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let lookup = vars_of(&[("OPENAI_API_KEY", "sk-o")]);
        let vars = Vars::new(&lookup);
        let p = Codex.provider(&vars).unwrap();
        assert_eq!(p.host, "api.openai.com");
        assert_eq!(
            p.key_sha256.as_deref(),
            Some(&crate::session::binding::key_hash("sk-o")[..])
        );
        assert_eq!(Codex.default_model(&vars), None);
        std::fs::write(
            dir.path().join("config.toml"),
            "model = \"gpt-mock\"\nmodel_provider = \"mock\"\n\
             [model_providers.mock]\nname = \"mock\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             env_key = \"MOCK_API_KEY\"\n",
        )
        .unwrap();
        let lookup = vars_of(&[("OPENAI_API_KEY", "sk-o"), ("MOCK_API_KEY", "mock-secret")]);
        let vars = Vars::new(&lookup);
        let p = Codex.provider(&vars).unwrap();
        assert_eq!(p.host, "127.0.0.1:9");
        assert_eq!(
            p.key_sha256.as_deref(),
            Some(&crate::session::binding::key_hash("mock-secret")[..])
        );
        assert_eq!(Codex.default_model(&vars).as_deref(), Some("gpt-mock"));
    }
}
