//! OpenCode (`opencode acp`): an ACP agent of any provider its own `opencode.json` names, so it
//! is given every provider's variables. It keeps its sessions in its own SQLite database
//! (`$XDG_DATA_HOME/opencode/opencode.db`), not in a file per session: the host relies on the
//! agent's own refusal of `session/load` / `session/resume` (a visible `resume_rejected`).

use futures_util::future::BoxFuture;

use super::acp::{ACP_CAPABILITIES, probe_acp};
use crate::adapter::family::{AgentFamily, ProbeSpec, Probed};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, OpenSpec, OptionCaps, acp_process,
};

pub struct OpenCode;

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "opencode",
    protocol: "Agent Client Protocol v1",
    default_binary: "opencode",
    binary_env: "AGENT_HOST_OPENCODE_BIN",
    version_args: &[],
    // No session option is shown with the real CLI here: none is declared.
    capabilities: Capabilities {
        options: OptionCaps::NONE,
        ..ACP_CAPABILITIES
    },
    turns: true,
    permission_policy: None,
};

impl AgentFamily for OpenCode {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn default_args(&self) -> &'static [&'static str] {
        &["acp"]
    }

    /// OpenCode's own settings (`OPENCODE_CONFIG`, `OPENCODE_CONFIG_DIR`, …).
    fn own_env(&self) -> &'static [&'static str] {
        &["OPENCODE_"]
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
