//! Opening an agent of some family: [`OpenSpec`], everything one process needs (a family's
//! `AgentFamily::open` starts its driver with it).

use std::path::PathBuf;

use super::Native;

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
    /// The session's options (model, standing prompt, MCP servers, permission mode), which
    /// the family maps to its agent's own flags, config or requests.
    pub options: crate::protocol::options::SessionOptions,
}
