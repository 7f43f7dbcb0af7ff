//! The Gemini CLI over ACP (`gemini --acp`): one long-lived process per session. It declares
//! `loadSession` and neither fork nor resume (so a fork is a new session with a warning), and
//! the host does not load its sessions in a later process either (see [`DESCRIPTOR`]: a load
//! within the minute a session was created in empties it); `--skip-trust` because the host
//! runs it only in a workspace the user chose. Gemini's own one-shot mode is the `gemini`
//! family (`families/gemini.rs`).

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
    // Never resumed, though it declares `loadSession` (0.61.0): a `session/load` from a later
    // process within the minute the session was created in is refused ("No previous sessions
    // found for this project.") and leaves the session empty for good — its file is
    // `chats/session-<minute>-<id8>.jsonl`, and the loading process first starts a record of
    // the session in the file of the current minute, which in that minute is the session's own
    // file, and appends a new header to it (`tests/suite/conformance.rs`,
    // `gemini_acp_load_within_the_sessions_minute_is_refused`). A host restart or an agent
    // crash in a session's first minute would then wipe its conversation; instead the host
    // starts a fresh session, with a `resume_unsupported` warning, and leaves Gemini's file of
    // the old one alone.
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
