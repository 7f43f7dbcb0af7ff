//! Opening an agent, for a prompt or `activate`: whether a live child may go on (someone else
//! wrote or holds its session: it is killed and the prompt forks), and what a new one opens —
//! decided from the session's binding and the ownership check, then fitted to what the family
//! can do ([`Capabilities`]), and checked against the family's own records before any existing
//! native session is opened.
//!
//! The degraded paths, each visible:
//! - a resume, where the family's `resume` is `None`: a new native session, `warning`
//!   `resume_unsupported`;
//! - a fork (asked for, imported, or decided by the ownership check), where its `fork` is
//!   `Absent`: a new native session, `warning` `fork_unsupported` (worded as the ACP driver
//!   words its own, for an agent that declares no fork);
//! - `Negotiated` resume or fork: asked of the driver, which degrades visibly itself;
//! - a native session the family says is not this workspace's ([`Launcher::check_binding`]):
//!   never opened; the open fails `resume_rejected`, naming why;
//! - the session's recorded binding (`binding`): a moved workspace refuses the prompt before
//!   anything is opened (`workspace_changed`, `resume_rejected`); another provider forks the
//!   bound native session instead of resuming it (`provider_changed`); a changed
//!   configuration is published (`session.configured`) and recorded once the agent opened.
//!
//! [`Launcher::check_binding`]: crate::session::agent::Launcher::check_binding

use std::time::Duration;

use super::state::{Binding, Live, NextOpen, Opened, Watch};
use super::{ActivateReceipt, Actor, category_name};
use crate::protocol::events::ErrorCategory;
use crate::session::SessionError;
use crate::session::agent::{AdapterError, Capabilities, Native, ResumeKind, Support};
use crate::session::ownership::{OwnedPid, Verdict};

/// What the family can do with the open `wanted`: the open as it is, or a new native session
/// (`fresh`) and the warning (code, message) that says why. `why`: the reason of a fork the
/// host decided on its own (someone else wrote or holds the session).
pub(super) fn degrade(
    wanted: Native,
    caps: &Capabilities,
    why: Option<&str>,
    fresh: impl FnOnce() -> String,
) -> (Native, Option<(&'static str, String)>) {
    let because = why.map(|w| format!("{w}; ")).unwrap_or_default();
    match wanted {
        Native::Resume(id) if caps.resume == ResumeKind::None => (
            Native::New(fresh()),
            Some((
                "resume_unsupported",
                format!(
                    "this agent cannot resume sessions; the conversation continues in a new \
                     agent session that does not have the turns of {id}"
                ),
            )),
        ),
        Native::Fork(id) if caps.fork == Support::Absent => (
            Native::New(fresh()),
            Some((
                "fork_unsupported",
                format!(
                    "{because}this agent cannot fork sessions; the conversation continues in a \
                     new agent session that does not have the turns of {id}"
                ),
            )),
        ),
        other => (other, None),
    }
}

fn fresh_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl Actor {
    /// An agent a prompt may go to: the live child if it may be continued, else a newly opened
    /// one (a fork when someone else wrote or holds the session). What a first prompt and
    /// `activate` share.
    pub(super) async fn ready_agent(&mut self) -> Result<(), AdapterError> {
        // A session whose workspace moved is not resumed or forked there: the prompt is
        // refused before it reaches any agent (a live one is closed).
        self.check_workspace().await?;
        // A child whose file someone else wrote is not continued: closed, and a fork.
        if let Some(why) = self.state.drifted().map(str::to_owned) {
            let ours: Vec<OwnedPid> = self
                .state
                .live()
                .and_then(|l| l.child.owned)
                .into_iter()
                .collect();
            // Someone may also still hold it: say so too.
            let why = match self.registered_holder(ours).await {
                Some(holder) => format!("{holder}; {why}"),
                None => why,
            };
            // Killed, not closed: a CLI closing cleanly writes its session file once more.
            if let Some(live) = self.state.take_live() {
                live.session.close(Duration::ZERO).await;
            }
            self.state.set_next(NextOpen::Fork(why));
        }
        // A child opened with options changed since is not given the prompt: the session is
        // resumed in a new one, opened with them.
        self.close_if_outdated().await;
        // A live child is not continued if another process has its session open now: it is
        // killed, and the prompt goes on in a fork.
        if self.state.live().is_some()
            && let Some(id) = self.binding.id().map(str::to_owned)
            && let Verdict::Fork(why) = self.verdict_live(&id).await
        {
            if let Some(live) = self.state.take_live() {
                live.session.close(Duration::ZERO).await;
            }
            self.state.set_next(NextOpen::Fork(why));
        }
        if self.state.live().is_none() {
            self.open_agent().await?;
        }
        Ok(())
    }

    /// Open the agent now, without a prompt, so the first one does not wait for the CLI to
    /// start. An agent already open (or being opened by a run) is left as it is.
    pub(super) async fn on_activate(&mut self) -> Result<ActivateReceipt, SessionError> {
        let already = self.state.live().is_some() || self.state.run().is_some();
        if !already {
            self.ready_agent().await.map_err(|e| {
                tracing::warn!(error = %e.message, category = ?e.category, "activation failed");
                SessionError::AgentUnavailable(format!(
                    "{} ({})",
                    e.message,
                    category_name(Some(e.category)).unwrap_or_default()
                ))
            })?;
            // Unused, it is closed like any idle agent.
            if self.queue.is_empty() {
                self.arm_idle();
            }
        }
        Ok(ActivateReceipt {
            session_id: self.cx.session_id.clone(),
            agent_pid: self.agent_pid(),
            already,
        })
    }

    /// Open a new agent (none runs): `Cold` → `Idle`, `Opening` → `Running`. A failed open
    /// keeps what was decided (a fork stays a fork).
    async fn open_agent(&mut self) -> Result<(), AdapterError> {
        let next = self.state.take_next();
        match self.open_native(next.clone()).await {
            Ok(live) => {
                if let Some(displaced) = self.state.opened(live) {
                    // Never: an agent is opened only where none runs.
                    tracing::error!(pid = ?displaced.session.pid(), "an agent was opened over another");
                }
                Ok(())
            }
            Err(e) => {
                self.state.set_next(next);
                Err(e)
            }
        }
    }

    async fn open_native(&mut self, next: NextOpen) -> Result<Live, AdapterError> {
        // Made when the host allowed it; it may not since (`allow_bypass` turned off).
        if self.options.mode() == crate::protocol::options::PermissionMode::Bypass
            && !self.cx.allow_bypass
        {
            return Err(AdapterError::new(
                ErrorCategory::PermissionDenied,
                "this session runs with permission_mode \"bypass\", which the host no longer \
                 allows: set allow_bypass = true in its config.toml again, or create a new \
                 session with another permission mode",
            ));
        }
        // The binding derived for this open, against the record: another provider forks.
        let at_open = self.binding_at_open().await;
        let provider = at_open.provider.clone();
        // What the session asks for.
        let (wanted, why, tail, automatic) = match self.binding.clone() {
            Binding::Bound { id, .. } => {
                let (verdict, tail) = match (next, &provider) {
                    // Never resumed under another account.
                    (_, Some(change)) => (
                        Verdict::Fork(format!("the model provider changed ({change})")),
                        None,
                    ),
                    (NextOpen::Fork(why) | NextOpen::Drifted(why), None) => {
                        (Verdict::Fork(why), None)
                    }
                    (NextOpen::Decide, None) => self.verdict_cold(&id).await,
                };
                if let Some(change) = &provider {
                    self.warn_provider_changed(&id, change).await;
                }
                match verdict {
                    Verdict::ResumeInPlace => (Native::Resume(id), String::new(), tail, false),
                    Verdict::Fork(why) => (Native::Fork(id), why, None, true),
                }
            }
            // A forked or imported session: its first agent forks the source.
            Binding::ForkOf(source) => (
                Native::Fork(source),
                "a forked or imported session".to_owned(),
                None,
                false,
            ),
            Binding::Unbound => (Native::New(fresh_id()), String::new(), None, false),
        };
        // What the family can do with it.
        let caps = self.cx.launcher.capabilities(&self.cx.agent_type);
        let (native, degraded) =
            degrade(wanted, &caps, automatic.then_some(why.as_str()), fresh_id);
        // The tail read for a resume in place is of the file that is opened, or of none.
        let tail = tail.filter(|_| matches!(native, Native::Resume(_)));
        if let Native::Resume(id) | Native::Fork(id) = &native {
            self.check_binding(id).await?;
        }
        let run_id = self.state.run_id();
        if automatic && let Native::Fork(from) = &native {
            if provider.is_some() && matches!(self.binding, Binding::Bound { .. }) {
                // Its `warning` is `provider_changed`, said already.
                self.announce_forked(from, &why).await;
            } else {
                self.announce_fork(from, &why).await;
            }
        }
        if let Some((code, message)) = degraded {
            tracing::warn!(code, %message, "the family cannot do what the session asks");
            self.cx.warn(run_id.as_deref(), code, message).await;
        }
        let opened = Opened::of(&native, &why);
        let session = self.cx.launcher.open(
            &self.cx.agent_type,
            &self.cx.cwd,
            &self.cx.session_id,
            native,
            &self.options,
        )?;
        tracing::info!(pid = ?session.pid(), resuming = opened.resuming(), "agent started");
        self.binding_opened(at_open).await;
        let watch = match tail {
            Some(tail) => {
                let changes = self.cx.launcher.watch(&tail.seen().path);
                Watch::Tail(tail, changes)
            }
            None => Watch::Off,
        };
        Ok(Live::new(session, opened, watch))
    }

    /// Whether the family's own records say `native_id` belongs to this session's directory;
    /// a session that does not is never opened.
    async fn check_binding(&self, native_id: &str) -> Result<(), AdapterError> {
        let (launcher, agent_type, cwd, id) = (
            self.cx.launcher.clone(),
            self.cx.agent_type.clone(),
            self.cx.cwd.clone(),
            native_id.to_owned(),
        );
        // The family reads its own files: off the runtime.
        let checked =
            tokio::task::spawn_blocking(move || launcher.check_binding(&agent_type, &cwd, &id))
                .await;
        let why = match checked {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(why)) => why,
            Err(e) => format!("the check failed: {e}"),
        };
        tracing::warn!(native = %native_id, %why, "refusing a native session of another workspace");
        Err(AdapterError::new(
            ErrorCategory::ResumeRejected,
            format!(
                "binding mismatch: the agent session {native_id} does not belong to {}: {why}; \
                 it was not resumed",
                self.cx.cwd.display()
            ),
        ))
    }
}
