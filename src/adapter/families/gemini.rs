//! The Gemini CLI in its one-shot mode (`gemini -o stream-json`): control mode 4, one process
//! per turn, each later turn resumed by the native id the host chose (`--session-id`, then
//! `--resume`). The driver is the generic `oneshot_process`; the CLI's argv and its
//! translator are `adapter::gemini`.
//!
//! One-shot mode has no permission round trip, so the family declares its policy instead of
//! faking one: `--approval-mode yolo`, the agent runs its tools without asking (in the other
//! modes a shell tool is not even offered to the model). A user who wants to approve each
//! tool runs Gemini over ACP instead (`gemini-acp`). Cancel is SIGINT to the turn's process
//! group; the session stays and the next turn resumes it. Gemini cannot fork a session: the
//! session layer starts a new one and says so.

use std::path::Path;

use super::gemini_acp::NOT_GEMINI;
use crate::adapter::family::{AgentFamily, Vars};
use crate::adapter::gemini::{ApprovalMode, GeminiCli};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, OpenSpec, OptionCaps, ProcessModel,
    ResumeKind, Support, oneshot_process,
};
use crate::session::agent::NativeFile;

pub struct Gemini;

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "gemini",
    protocol: "gemini-cli stream-json, one process per turn",
    default_binary: "gemini",
    binary_env: "AGENT_HOST_GEMINI_BIN",
    version_args: &["--version"],
    capabilities: Capabilities {
        resume: ResumeKind::NativeId,
        permissions: false,
        cancel: true,
        steer: false,
        fork: Support::Absent,
        usage: true,
        process: ProcessModel::PerTurn,
        binding: false,
        // It never asks (the policy below), so it lists no permission mode, not even `ask`.
        options: OptionCaps::NEVER_ASKS,
    },
    turns: true,
    permission_policy: Some(
        "yolo: the CLI runs its tools without asking (one-shot mode has no approval round \
         trip; use gemini-acp to approve each tool)",
    ),
};

impl AgentFamily for Gemini {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn protocol_name(&self) -> Option<&'static str> {
        Some("gemini-stream-json")
    }

    fn foreign_env(&self) -> &'static [&'static str] {
        NOT_GEMINI
    }

    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
        oneshot_process::open(spec, GeminiCli::new(ApprovalMode::Yolo))
    }

    /// Gemini keeps its chats under `~/.gemini/tmp/<project>/chats/`, named by the minute
    /// and the first 8 characters of the id; a resume in a later minute also leaves a
    /// header-only file of its own, so the host does not watch them as its files. The CLI
    /// looks for a `--resume` id only among the chats of the cwd's project and refuses one it
    /// does not find there (`resume_rejected`: the conformance case `resume_rejected_fallback`
    /// deletes a session's files and resumes it); a session whose workspace changed is refused
    /// by the host before the CLI runs (`resume_wrong_workspace_rejected`).
    fn native_file(&self, _vars: &Vars<'_>, _cwd: &Path, _native_id: &str) -> NativeFile {
        NativeFile::default()
    }
}
