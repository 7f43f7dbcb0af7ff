//! The Gemini CLI over ACP (`gemini --acp`): one long-lived process per session. It declares
//! `loadSession` and neither fork nor resume (so a fork is a new session with a warning), and
//! its load does not work across processes (so the host does not resume it either);
//! `--skip-trust` because the host runs it only in a workspace the user chose. Gemini's own
//! one-shot mode is the `gemini` family (`families/gemini.rs`).

use futures_util::future::BoxFuture;

use super::acp::{ACP_CAPABILITIES, probe_acp};
use crate::adapter::family::{AgentFamily, ProbeSpec, Probed};
use crate::adapter::{AdapterError, AgentSession, Descriptor, OpenSpec, acp_process};
use crate::adapter::{Capabilities, OptionCaps, ResumeKind};

pub struct GeminiAcp;

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "gemini-acp",
    protocol: "Agent Client Protocol v1",
    default_binary: "gemini",
    binary_env: "AGENT_HOST_GEMINI_BIN",
    version_args: &[],
    // It declares `loadSession`, but a `session/load` from a later process failed here (0.61.0:
    // "No previous sessions found for this project", and within the session's creation
    // minute "Invalid session identifier", which also resets the stored session): declared
    // only where the real CLI shows it, so a restart starts a fresh session, saying so.
    // No session option is shown with the real CLI here: none is declared.
    capabilities: Capabilities {
        resume: ResumeKind::None,
        options: OptionCaps::NONE,
        ..ACP_CAPABILITIES
    },
    turns: true,
    permission_policy: None,
};

/// Another vendor's credentials and settings, which Gemini never needs.
pub const NOT_GEMINI: &[&str] = &[
    "ANTHROPIC_",
    "CLAUDE_CODE_",
    "CLAUDE_CONFIG_DIR",
    "OPENAI_",
    "AZURE_OPENAI_",
    "OPENROUTER_",
    "CODEX_HOME",
    "AWS_",
];

impl AgentFamily for GeminiAcp {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn default_args(&self) -> &'static [&'static str] {
        &["--acp", "--skip-trust"]
    }

    fn foreign_env(&self) -> &'static [&'static str] {
        NOT_GEMINI
    }

    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
        acp_process::open(spec)
    }

    fn probe<'a>(
        &'a self,
        spec: ProbeSpec<'a>,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Probed, AdapterError>> {
        probe_acp(spec, timeout)
    }
}
