//! Codex (`codex app-server`, JSON-RPC over stdio): the family. Its rollout files live under
//! `$CODEX_HOME/sessions/…/rollout-*-<thread id>.jsonl`; Codex refuses a second writer by
//! itself, so there is no registry of live holders.

use std::path::Path;

use crate::adapter::family::{AgentFamily, Vars};
use crate::adapter::{
    AdapterError, AgentSession, Capabilities, Descriptor, OpenSpec, OptionCaps, ProcessModel,
    ResumeKind, Support, codex, codex_process,
};
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
        options: OptionCaps::NONE,
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

    fn open(&self, spec: OpenSpec) -> Result<AgentSession, AdapterError> {
        codex_process::open(spec)
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
