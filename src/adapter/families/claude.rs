//! Claude Code (`claude -p`, stream-json both ways plus its control protocol): the family.
//! Its session files live under the config dir's `projects/<cwd as a folder name>/`, name the
//! host's prompts by their uuid (so lines can be attributed), and each running CLI registers
//! itself in `<config>/sessions/<pid>.json`, which names the live holders of a session.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::adapter::family::{AgentFamily, Vars};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, ModelSwitch, OpenSpec, OptionCaps,
    ProcessModel, ResumeKind, Support, claude, claude_process,
};
use crate::protocol::options::PermissionMode;
use crate::session::agent::NativeFile;
use crate::session::ownership::{self, OwnedPid};

pub struct Claude;

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "claude",
    protocol: "claude-code stream-json",
    default_binary: "claude",
    binary_env: "AGENT_HOST_CLAUDE_BIN",
    version_args: &["--version"],
    capabilities: Capabilities {
        resume: ResumeKind::NativeId,
        permissions: true,
        cancel: true,
        // A user message written while a turn runs is queued by the CLI: injected into the
        // turn's next model request when there is one (after a tool call), else run as a turn
        // of its own afterwards, with its own `result`. Which one depends on what the model
        // does next, unknown when the steer is asked for, so the host does not claim it:
        // the session queues the prompt (tests/suite/steer.rs,
        // `claude_takes_a_message_mid_turn_only_at_a_tool_boundary`).
        steer: false,
        fork: Support::Native,
        usage: true,
        process: ProcessModel::Persistent,
        binding: true,
        // Each as tests/suite/claude_host.rs shows the real CLI doing it against the mock: the model
        // named in every request (`--model`), changed live between turns (the `set_model`
        // control request), the standing prompt in each request's `system`
        // (`--append-system-prompt`), stdio, HTTP and SSE MCP servers whose tools the model
        // calls (`--mcp-config`; the calls ask through the permission prompt like any tool),
        // the three permission modes (`--permission-mode`), images as image blocks, and PDFs
        // and text files as document blocks.
        options: OptionCaps {
            model: Support::Native,
            set_model: ModelSwitch::Live,
            system_prompt: Support::Native,
            mcp_stdio: Support::Native,
            mcp_http: Support::Native,
            mcp_sse: Support::Native,
            permission_modes: &[
                PermissionMode::Ask,
                PermissionMode::AcceptEdits,
                PermissionMode::Bypass,
            ],
            images: Support::Native,
            files: Support::Native,
            // `--append-system-prompt` is given on every start, a fork's too.
            system_prompt_on_fork: true,
        },
    },
    turns: true,
    permission_policy: None,
};

impl AgentFamily for Claude {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn protocol_name(&self) -> Option<&'static str> {
        Some("claude-stream-json")
    }

    fn foreign_env(&self) -> &'static [&'static str] {
        &[
            "OPENAI_",
            "AZURE_OPENAI_",
            "OPENROUTER_",
            "GEMINI_",
            // Not `GOOGLE_`: Claude on Vertex reads `GOOGLE_APPLICATION_CREDENTIALS` and
            // `GOOGLE_CLOUD_PROJECT`.
            "CODEX_HOME",
        ]
    }

    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
        claude_process::open(spec)
    }

    fn provider(&self, vars: &Vars<'_>) -> Option<crate::protocol::options::ProviderIdentity> {
        anthropic_provider(vars)
    }

    fn default_model(&self, vars: &Vars<'_>) -> Option<String> {
        vars.get("ANTHROPIC_MODEL")
    }

    fn native_file(&self, vars: &Vars<'_>, cwd: &Path, native_id: &str) -> NativeFile {
        let config = vars.dir_or_home("CLAUDE_CONFIG_DIR", ".claude");
        let path = config
            .as_ref()
            .and_then(|c| claude::session_file(c, &cwd.to_string_lossy(), native_id));
        NativeFile {
            path,
            claimants: config.map(|c| {
                Arc::new(move |id: &str, ours: &[OwnedPid]| registry_holders(&c, id, ours))
                    as crate::session::agent::Claimants
            }),
            entries: Some(claude::file_entry),
        }
    }

    /// The session files of the cwd's project folder that record this cwd
    /// ([`claude::discover_sessions`]).
    fn discover(
        &self,
        vars: &Vars<'_>,
        cwd: &Path,
    ) -> Option<Result<Vec<crate::session::discover::Discovered>, String>> {
        let Some(config) = vars.dir_or_home("CLAUDE_CONFIG_DIR", ".claude") else {
            return Some(Err(
                "neither CLAUDE_CONFIG_DIR nor HOME is set for claude".to_owned()
            ));
        };
        Some(Ok(claude::discover_sessions(
            &config,
            &cwd.to_string_lossy(),
        )))
    }

    /// The conversation of the session's file of this cwd ([`claude::read_session_history`]);
    /// no file: an empty history (the CLI decides about the id at the first prompt).
    fn read_history(
        &self,
        vars: &Vars<'_>,
        cwd: &Path,
        native_id: &str,
    ) -> Option<Result<Vec<crate::session::discover::HistoryEntry>, String>> {
        let config = vars.dir_or_home("CLAUDE_CONFIG_DIR", ".claude")?;
        let cwd_text = cwd.to_string_lossy();
        let canonical = std::fs::canonicalize(cwd).ok();
        let file = claude::session_file(&config, &cwd_text, native_id).or_else(|| {
            canonical
                .as_ref()
                .and_then(|c| claude::session_file(&config, &c.to_string_lossy(), native_id))
        });
        let Some(file) = file else {
            return Some(Ok(Vec::new()));
        };
        Some(
            claude::read_session_history(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display())),
        )
    }

    /// The session's file must be under this cwd's project folder and record this cwd; a file
    /// of that id only under another project's folder belongs to another workspace. No file
    /// anywhere: the CLI decides (it refuses an id it does not have: `resume_rejected`).
    fn check_binding(&self, vars: &Vars<'_>, cwd: &Path, native_id: &str) -> Result<(), String> {
        let Some(config) = vars.dir_or_home("CLAUDE_CONFIG_DIR", ".claude") else {
            return Ok(());
        };
        let cwd_text = cwd.to_string_lossy();
        if claude::session_cwd_matches(&config, &cwd_text, native_id) {
            return Ok(());
        }
        let file = format!("{native_id}.jsonl");
        let elsewhere = std::fs::read_dir(config.join("projects"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|project| project.path().join(&file))
            .find(|path| path.is_file());
        match elsewhere {
            None => Ok(()),
            Some(path) => Err(format!(
                "Claude session {native_id} belongs to another workspace than {} (its file is {})",
                cwd.display(),
                path.display()
            )),
        }
    }
}

/// The Anthropic API Claude talks to: `ANTHROPIC_BASE_URL` (else the public API) and the key
/// or token it is given (`ANTHROPIC_API_KEY`, else `ANTHROPIC_AUTH_TOKEN`), by its hash. Also
/// the provider of the `acp` family (`claude-agent-acp` runs Claude).
pub fn anthropic_provider(vars: &Vars<'_>) -> Option<crate::protocol::options::ProviderIdentity> {
    let key = vars
        .get("ANTHROPIC_API_KEY")
        .or_else(|| vars.get("ANTHROPIC_AUTH_TOKEN"));
    crate::session::binding::provider_identity(
        vars.get("ANTHROPIC_BASE_URL").as_deref(),
        "https://api.anthropic.com",
        key.as_deref(),
    )
}

/// Live CLIs that Claude's own registry (`<config>/sessions/<pid>.json`, written by each
/// running CLI) names for this session, other than `ours`. An entry whose recorded process
/// start time (`procStart`) is not the pid's now is stale.
pub fn registry_holders(config_dir: &Path, native_id: &str, ours: &[OwnedPid]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(config_dir.join("sessions")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            let pid = u32::try_from(v.get("pid")?.as_u64()?).ok()?;
            if v.get("sessionId")?.as_str()? != native_id {
                return None;
            }
            let started = ownership::start_time(pid)?;
            // The CLI records its own start time (as `/proc/<pid>/stat` has it): a file left by
            // a CLI that died, whose pid now names another process, does not count.
            let recorded = v.get("procStart").and_then(|s| match s {
                Value::String(s) => s.parse::<u64>().ok(),
                other => other.as_u64(),
            });
            recorded.is_none_or(|r| r == started).then_some(pid)
        })
        .filter(|pid| !ownership::is_ours(*pid, ours))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_names_live_holders() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sessions")).unwrap();
        let me = std::process::id();
        std::fs::write(
            dir.path().join(format!("sessions/{me}.json")),
            format!(r#"{{"pid":{me},"sessionId":"s1","cwd":"/"}}"#),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("sessions/999999999.json"),
            r#"{"pid":999999999,"sessionId":"s1"}"#,
        )
        .unwrap();
        assert_eq!(registry_holders(dir.path(), "s1", &[]), [me]);
        // Left by a CLI that died, its pid now someone else's (ours here): stale.
        std::fs::write(
            dir.path().join(format!("sessions/{me}.json")),
            format!(r#"{{"pid":{me},"sessionId":"s1","procStart":"1"}}"#),
        )
        .unwrap();
        assert!(registry_holders(dir.path(), "s1", &[]).is_empty());
        let started = ownership::start_time(me).unwrap();
        std::fs::write(
            dir.path().join(format!("sessions/{me}.json")),
            format!(r#"{{"pid":{me},"sessionId":"s1","procStart":"{started}"}}"#),
        )
        .unwrap();
        assert_eq!(registry_holders(dir.path(), "s1", &[]), [me]);
        assert!(registry_holders(dir.path(), "s2", &[]).is_empty());
        let ours = OwnedPid::of(me).unwrap();
        assert!(registry_holders(dir.path(), "s1", &[ours]).is_empty());
    }
}
