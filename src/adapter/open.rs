//! Opening an agent of some family: [`OpenSpec`], everything one process needs, and [`open`],
//! which starts the driver of the family.

use std::path::PathBuf;

use super::{AdapterError, AgentSession, Native};
use crate::protocol::events::ErrorCategory;

/// Everything needed to open a session.
#[derive(Debug, Clone)]
pub struct OpenSpec {
    pub program: PathBuf,
    /// Arguments a registered agent's command gives (families build their own otherwise).
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub base_env: Vec<(String, String)>,
    pub extra_env: Vec<(String, String)>,
    /// The agent-host session this process serves.
    pub host_session_id: String,
    /// The host home its processes are marked with (see `adapter::reap`).
    pub home: Option<super::reap::HomeMarker>,
    pub native: Native,
}

/// Start the driver of a protocol family (a descriptor's `agent_type`).
pub fn open(family: &str, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
    match family {
        "claude" => super::claude_process::open(spec),
        "codex" => super::codex_process::open(spec),
        "acp" => super::acp_process::open(spec),
        other => Err(AdapterError::new(
            ErrorCategory::ProtocolIncompatible,
            format!("this build cannot run turns with {other:?} agents"),
        )),
    }
}
