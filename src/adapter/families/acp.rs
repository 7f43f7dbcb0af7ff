//! Any agent speaking the Agent Client Protocol v1 (`agent_type: "acp"` runs
//! `claude-agent-acp`; others are registered with `protocol = "acp"`). What each agent can do
//! beyond a turn (resume, load, fork) it declares in `initialize`, which the driver reads: the
//! capabilities here are `negotiated`. ACP defines no session file; the agent's own refusal of
//! `session/load` or `session/resume` is a visible `resume_rejected`.
//!
//! Session options ([`negotiated_options`], from the `initialize` answer the launcher asks
//! once per agent type): MCP servers over stdio are every ACP agent's baseline, http / sse as
//! its `mcpCapabilities` declare; images and files as its `promptCapabilities` declare (`image`,
//! `embeddedContext`). A model, a standing prompt and permission modes `initialize` cannot
//! declare (models and modes come in each session answer; ACP has no field for a standing
//! prompt), so they are taken only from the agents a test with the real CLI shows
//! ([`AgentCaps::carriers`]: claude-agent-acp, by its declared name), and refused for others.

use futures_util::future::BoxFuture;

use crate::adapter::acp::AgentCaps;
use crate::adapter::family::{AgentFamily, ProbeSpec, Probed};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, ModelSwitch, OpenSpec, OptionCaps,
    ProcessModel, ResumeKind, Support, acp_process,
};
use crate::protocol::options::PermissionMode;

pub struct Acp;

/// What every ACP agent can be trusted with before it says more in `initialize`.
pub const ACP_CAPABILITIES: Capabilities = Capabilities {
    resume: ResumeKind::Negotiated,
    permissions: true,
    cancel: true,
    // ACP has no input into a running prompt. A second `session/prompt` while one runs is
    // agent-specific: the pinned claude-agent-acp answers the first `end_turn` at once and
    // streams the rest of the turn, the answer to the new text included, as the second
    // prompt's: a queued prompt that ends the running one early, not a steer (tests/suite/steer.rs,
    // `acp_a_second_prompt_mid_turn_ends_the_first_prompt`).
    steer: false,
    fork: Support::Negotiated,
    usage: true,
    process: ProcessModel::Persistent,
    binding: false,
    options: ACP_OPTIONS,
};

/// What an ACP agent may do with the session options, before it says in `initialize`
/// ([`negotiated_options`] resolves each). The permission modes and the live model switch are
/// those of the agents known to carry them ([`AgentCaps::carriers`]).
pub const ACP_OPTIONS: OptionCaps = OptionCaps {
    model: Support::Negotiated,
    set_model: ModelSwitch::Live,
    system_prompt: Support::Negotiated,
    mcp_stdio: Support::Negotiated,
    mcp_http: Support::Negotiated,
    mcp_sse: Support::Negotiated,
    permission_modes: &[
        PermissionMode::Ask,
        PermissionMode::AcceptEdits,
        PermissionMode::Bypass,
    ],
    images: Support::Negotiated,
    files: Support::Negotiated,
    // The host sends `_meta.systemPrompt` on `session/fork` and `session/load` as on
    // `session/new` (claude-agent-acp starts its Claude Code with it on each).
    system_prompt_on_fork: true,
};

/// [`ACP_OPTIONS`] resolved by what the agent declared (`None`: it was not asked, so nothing
/// beyond a plain turn). A file attachment counts as delivered where the agent takes embedded
/// resources: a text file goes in the prompt as its text, another as a link to the host's copy
/// (`acp::attachment_block`).
pub fn negotiated_options(agent: Option<&AgentCaps>) -> OptionCaps {
    let Some(agent) = agent else {
        return OptionCaps::NONE;
    };
    let support = |yes: bool| {
        if yes {
            Support::Native
        } else {
            Support::Absent
        }
    };
    let carriers = agent.carriers();
    OptionCaps {
        model: support(carriers.model),
        set_model: if carriers.model {
            ModelSwitch::Live
        } else {
            ModelSwitch::None
        },
        system_prompt: support(carriers.system_prompt),
        mcp_stdio: Support::Native,
        mcp_http: support(agent.mcp_http),
        mcp_sse: support(agent.mcp_sse),
        permission_modes: carriers.permission_modes,
        images: support(agent.image),
        files: support(agent.embedded_context),
        system_prompt_on_fork: true,
    }
}

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

    /// `claude-agent-acp` runs Claude: Claude's provider (a registered ACP agent, which could
    /// be anything, is not asked: `launch`).
    fn provider(
        &self,
        vars: &crate::adapter::family::Vars<'_>,
    ) -> Option<crate::protocol::options::ProviderIdentity> {
        super::claude::anthropic_provider(vars)
    }

    fn default_model(&self, vars: &crate::adapter::family::Vars<'_>) -> Option<String> {
        vars.get("ANTHROPIC_MODEL")
    }

    fn probe<'a>(
        &'a self,
        spec: ProbeSpec<'a>,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Probed, AdapterError>> {
        probe_acp(spec, timeout)
    }

    fn negotiated_options(&self, agent: Option<&AgentCaps>) -> OptionCaps {
        negotiated_options(agent)
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn options_resolve_by_what_the_agent_declares() {
        let claude = AgentCaps::from_initialize(&json!({
            "agentCapabilities": {
                "promptCapabilities": {"image": true, "embeddedContext": true},
                "mcpCapabilities": {"http": true, "sse": false}
            },
            "agentInfo": {"name": crate::adapter::acp::CLAUDE_AGENT_ACP}
        }));
        let options = negotiated_options(Some(&claude));
        assert_eq!(options.model, Support::Native);
        assert_eq!(options.set_model, ModelSwitch::Live);
        assert_eq!(options.system_prompt, Support::Native);
        assert_eq!(options.mcp_stdio, Support::Native);
        assert_eq!(options.mcp_http, Support::Native);
        assert_eq!(options.mcp_sse, Support::Absent);
        assert_eq!(options.images, Support::Native);
        assert_eq!(options.files, Support::Native);
        assert!(
            options
                .permission_modes
                .contains(&PermissionMode::AcceptEdits)
        );
        // Another agent: what initialize declares, nothing it cannot.
        let other = AgentCaps::from_initialize(&json!({"agentInfo": {"name": "qwen-code"}}));
        let options = negotiated_options(Some(&other));
        assert_eq!(options.model, Support::Absent);
        assert_eq!(options.set_model, ModelSwitch::None);
        assert_eq!(options.system_prompt, Support::Absent);
        assert_eq!(options.mcp_stdio, Support::Native);
        assert_eq!(options.images, Support::Absent);
        assert_eq!(options.permission_modes, [PermissionMode::Ask]);
        assert_eq!(negotiated_options(None), OptionCaps::NONE);
        // Gemini and OpenCode declare nothing (no real-CLI test shows an option).
        for family in [
            &crate::adapter::families::gemini_acp::GeminiAcp as &dyn AgentFamily,
            &crate::adapter::families::opencode::OpenCode,
        ] {
            assert_eq!(family.descriptor().capabilities.options, OptionCaps::NONE);
            assert_eq!(family.negotiated_options(Some(&claude)), OptionCaps::NONE);
        }
    }
}
