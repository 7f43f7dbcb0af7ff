//! The session's binding checked (`docs/architecture.md`, "Binding"): before every prompt goes
//! to an agent (and at `activate`) the binding is derived again ([`crate::session::binding`])
//! and compared with the one recorded on the row.
//!
//! - The workspace moved (the recorded git root or `origin` remote differ, or the cwd left its
//!   repository) while the session has a native session to resume or fork: the prompt is
//!   refused before it reaches any agent — `warning` `workspace_changed`, then the run fails
//!   `resume_rejected` — and a live agent is closed. Checked at every prompt, a live agent's
//!   too. Recovery: `session.fork`, a new session bound to the workspace as it is now.
//! - The provider changed (the base URL's host or the key's hash): the next open forks the
//!   bound native session instead of resuming it (the original is never written under another
//!   account): `warning` `provider_changed`, `session.forked`, then `session.configured`
//!   `provider_changed`, and the binding is recorded anew. A live agent keeps the provider its
//!   process started with, so this is found when an agent is opened.
//! - The model, the standing prompt or the runtime options changed: the agent opened runs with
//!   them (`session.configured` `reconfigured` names what changed), and the binding is recorded
//!   anew.
//!
//! A session recorded before this build (no record) is recorded as it is at its first prompt.
//! A binding is recorded only once the agent it describes has been opened.

use super::state::Binding;
use super::{Actor, files};
use crate::protocol::events::{ConfigReason, ErrorCategory};
use crate::protocol::options::BindingRecord;
use crate::session::agent::AdapterError;
use crate::session::binding::{self, Workspace};

/// The binding as the actor has it.
#[derive(Debug, Default)]
pub(super) struct BindingState {
    /// As the row records it (`None`: a session recorded before this build).
    recorded: Option<BindingRecord>,
    /// As the latest prompt's check derived it, for the open that follows.
    derived: Option<BindingRecord>,
}

impl BindingState {
    pub(super) fn of_row(recorded: Option<BindingRecord>) -> Self {
        BindingState {
            recorded,
            derived: None,
        }
    }
}

/// What an open does with the binding derived for it.
#[derive(Debug)]
pub(super) struct AtOpen {
    now: BindingRecord,
    /// The provider changed: old → new, as a message names them.
    pub provider: Option<String>,
    /// The configuration parts that changed (`model`, `system_prompt`, `options`).
    changed: Vec<&'static str>,
    /// Anything differs from the record (or there is none): it is recorded once opened.
    record: bool,
}

impl Actor {
    /// The native session the row binds (or the source a fork of it starts from).
    fn bound_id(&self) -> Option<&str> {
        match &self.binding {
            Binding::Bound { id, .. } | Binding::ForkOf(id) => Some(id),
            Binding::Unbound => None,
        }
    }

    /// Before a prompt reaches any agent: the binding derived now; a moved workspace refuses
    /// the prompt (`warning` `workspace_changed`, an error `resume_rejected`; a live agent is
    /// closed). What was derived is kept for the open that may follow.
    pub(super) async fn check_workspace(&mut self) -> Result<(), AdapterError> {
        let (workspace, mut now) = binding::derive(
            self.cx.launcher.clone(),
            &self.cx.agent_type,
            &self.cx.cwd,
            &self.options,
        )
        .await;
        let recorded = self.bound.recorded.clone();
        if let Workspace::Unknown(why) = &workspace {
            // Git could not say: nothing is compared, and the recorded workspace is kept.
            tracing::warn!(%why, "the workspace cannot be read; it is not checked");
            now.workspace = recorded.as_ref().and_then(|r| r.workspace.clone());
        }
        let moved = match (&recorded, &workspace) {
            (Some(recorded), Workspace::Known(ws)) => {
                binding::workspace_moved(recorded.workspace.as_ref(), ws.as_ref())
            }
            _ => false,
        };
        let Some(native) = self.bound_id().map(str::to_owned).filter(|_| moved) else {
            self.bound.derived = Some(now);
            return Ok(());
        };
        self.bound.derived = None;
        let old = binding::describe_workspace(recorded.as_ref().and_then(|r| r.workspace.as_ref()));
        let new = binding::describe_workspace(now.workspace.as_ref());
        tracing::warn!(%old, %new, native = %native, "the workspace changed: the prompt is refused");
        let run_id = self.state.run_id();
        self.cx
            .warn(
                run_id.as_deref(),
                "workspace_changed",
                format!(
                    "the workspace changed since this session was bound: {old} -> {new}; its \
                     agent session {native} is not resumed in another workspace. `session.fork` \
                     continues the conversation in a new session bound to the workspace as it is \
                     now"
                ),
            )
            .await;
        if let Some(mut live) = self.state.take_live() {
            files::stop_watch(&self.cx, &self.binding, None, &mut live.child).await;
            tracing::info!(pid = ?live.session.pid(), "closing the agent of a moved workspace");
            live.session.close(files::close_grace(&live.child)).await;
            self.expire_permissions("the agent process ended").await;
            let next = self.retire(live.child).await;
            self.state.set_next(next);
        }
        Err(AdapterError::new(
            ErrorCategory::ResumeRejected,
            format!(
                "the workspace changed ({old} -> {new}): the agent session {native} was not \
                 resumed and the prompt did not reach the agent; fork the session to go on here"
            ),
        ))
    }

    /// At an open: the binding derived for it (by the prompt's check, which saw to the
    /// workspace; else now) compared with the record.
    pub(super) async fn binding_at_open(&mut self) -> AtOpen {
        let now = match self.bound.derived.take() {
            Some(now) => now,
            None => {
                let (workspace, mut now) = binding::derive(
                    self.cx.launcher.clone(),
                    &self.cx.agent_type,
                    &self.cx.cwd,
                    &self.options,
                )
                .await;
                if matches!(workspace, Workspace::Unknown(_)) {
                    now.workspace = self
                        .bound
                        .recorded
                        .as_ref()
                        .and_then(|r| r.workspace.clone());
                }
                now
            }
        };
        let Some(recorded) = self.bound.recorded.as_ref() else {
            return AtOpen {
                now,
                provider: None,
                changed: Vec::new(),
                record: true,
            };
        };
        let provider = binding::provider_moved(recorded.provider.as_ref(), now.provider.as_ref())
            .then(|| {
                format!(
                    "{} -> {}",
                    binding::describe_provider(recorded.provider.as_ref()),
                    binding::describe_provider(now.provider.as_ref())
                )
            });
        let mut changed = binding::reconfigured(recorded, &now);
        if self.options.model.is_some() {
            // The session names its model: a change of it was `session.set_model`'s, which
            // said so itself. Only a family default that changed is news here.
            changed.retain(|c| *c != "model");
        }
        AtOpen {
            changed,
            record: !binding::same(recorded, &now),
            provider,
            now,
        }
    }

    /// The provider changed under a bound native session: said before the open forks it.
    pub(super) async fn warn_provider_changed(&self, from: &str, change: &str) {
        let run_id = self.state.run_id();
        tracing::warn!(native = %from, %change, "the provider changed: forking");
        self.cx
            .warn(
                run_id.as_deref(),
                "provider_changed",
                format!(
                    "the model provider changed since this session was bound ({change}); its \
                     agent session {from} is not resumed under another account: the \
                     conversation continues in a fork of it"
                ),
            )
            .await;
    }

    /// The fork a provider change decided, as `session.forked` on this session (its warning
    /// was `provider_changed`).
    pub(super) async fn announce_forked(&self, from: &str, why: &str) {
        let run_id = self.state.run_id();
        self.cx
            .publish(
                run_id.as_deref(),
                crate::protocol::events::EventBody::SessionForked(
                    crate::protocol::events::SessionForked {
                        parent_session_id: self.cx.session_id.clone(),
                        child_session_id: Some(self.cx.session_id.clone()),
                        from_native_session_id: Some(from.to_owned()),
                        reason: Some(why.to_owned()),
                    },
                ),
            )
            .await;
    }

    /// The agent of `at` opened: what changed is published (`session.configured`) and the
    /// binding recorded anew.
    pub(super) async fn binding_opened(&mut self, at: AtOpen) {
        if at.provider.is_some() || !at.changed.is_empty() {
            let mut changed: Vec<String> = Vec::new();
            if at.provider.is_some() {
                changed.push("provider".to_owned());
            }
            changed.extend(at.changed.iter().map(|c| (*c).to_owned()));
            let message = match &at.provider {
                Some(change) => format!(
                    "the model provider changed ({change}); the agent runs with it from now on"
                ),
                None => format!(
                    "the session's configuration changed since it was bound ({}); the agent \
                     runs with it from now on",
                    changed.join(", ")
                ),
            };
            let reason = if at.provider.is_some() {
                ConfigReason::ProviderChanged
            } else {
                ConfigReason::Reconfigured
            };
            let run_id = self.state.run_id();
            self.cx
                .publish(
                    run_id.as_deref(),
                    configured_event(reason, changed, at.now.model.clone(), message),
                )
                .await;
        }
        if at.record {
            self.record_binding(at.now).await;
        }
    }

    /// `session.set_model` changed the model: the binding (where one is recorded) names it
    /// from now on.
    pub(super) async fn rebind_model(&mut self, model: &str) {
        if let Some(recorded) = self.bound.recorded.clone() {
            self.record_binding(BindingRecord {
                model: Some(model.to_owned()),
                recorded_at_ms: crate::store::now_ms(),
                ..recorded
            })
            .await;
        }
    }

    /// Record the binding on the row (and as the one to compare with from now on). A record
    /// the store refuses is tried again at the next open (the comparison then finds the same).
    pub(super) async fn record_binding(&mut self, record: BindingRecord) {
        match self
            .cx
            .store
            .set_session_binding(self.cx.session_id.clone(), record.clone())
            .await
        {
            Ok(_) => self.bound.recorded = Some(record),
            Err(e) => {
                // A store that cannot write is an outage like a failed event commit: the
                // session stops taking work until it recovers.
                tracing::error!(error = %e, "recording the binding failed");
                self.note_outage();
            }
        }
    }
}

/// The `session.configured` of a binding found changed.
fn configured_event(
    reason: ConfigReason,
    changed: Vec<String>,
    model: Option<String>,
    message: String,
) -> crate::protocol::events::EventBody {
    use crate::protocol::events::{EventBody, SessionConfigured};
    EventBody::SessionConfigured(SessionConfigured {
        reason,
        changed,
        model,
        applied: None,
        message,
    })
}
