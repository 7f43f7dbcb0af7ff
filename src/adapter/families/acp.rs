//! Any agent speaking the Agent Client Protocol v1 (`agent_type: "acp"` runs
//! `claude-agent-acp`; others are registered with `protocol = "acp"`). What each agent can do
//! beyond a turn (resume, load, fork) it declares in `initialize`, which the driver reads: the
//! capabilities here are `negotiated`. ACP defines no session file; the agent's own refusal of
//! `session/load` or `session/resume` is a visible `resume_rejected`.

use futures_util::future::BoxFuture;

use crate::adapter::family::{AgentFamily, ProbeSpec, Probed};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, OpenSpec, OptionCaps, ProcessModel,
    ResumeKind, Support, acp_process,
};

pub struct Acp;

/// What every ACP agent can be trusted with before it says more in `initialize`.
pub const ACP_CAPABILITIES: Capabilities = Capabilities {
    resume: ResumeKind::Negotiated,
    permissions: true,
    cancel: true,
    // ACP has no input into a running prompt. A second `session/prompt` while one runs is
    // agent-specific: the pinned claude-agent-acp answers the first `end_turn` at once and
    // streams the rest of the turn, the answer to the new text included, as the second
    // prompt's: a queued prompt that ends the running one early, not a steer (tests/steer.rs,
    // `acp_a_second_prompt_mid_turn_ends_the_first_prompt`).
    steer: false,
    fork: Support::Negotiated,
    usage: true,
    process: ProcessModel::Persistent,
    binding: false,
    options: OptionCaps::NONE,
};

static DESCRIPTOR: Descriptor = Descriptor {
    agent_type: "acp",
    protocol: "Agent Client Protocol v1",
    default_binary: "claude-agent-acp",
    binary_env: "AGENT_HOST_ACP_BIN",
    version_args: &[],
    capabilities: ACP_CAPABILITIES,
    turns: true,
    permission_policy: None,
};

impl AgentFamily for Acp {
    fn descriptor(&self) -> &'static Descriptor {
        &DESCRIPTOR
    }

    fn protocol_name(&self) -> Option<&'static str> {
        Some("acp")
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

/// The probe of an ACP agent: its `initialize` answer.
pub fn probe_acp(
    spec: ProbeSpec<'_>,
    timeout: std::time::Duration,
) -> BoxFuture<'_, Result<Probed, AdapterError>> {
    Box::pin(async move {
        let caps = acp_process::probe(
            spec.binary,
            spec.args,
            spec.base_env,
            spec.extra_env,
            spec.cwd,
            timeout,
        )
        .await?;
        Ok(Probed {
            version: caps.version.clone(),
            agent: Some(caps),
        })
    })
}
