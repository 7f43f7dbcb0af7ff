//! A run's life on the agent: the prompt handed over (the agent opened first if needed), what
//! the agent says published with the run's id, the run's end (and the next queued prompt), a
//! resume the agent rejects continued in a fresh session, cancel with its grace and kill, the
//! agent going away mid-turn (`result_delivery_unknown` when its driver did not end the turn,
//! a prompt that never reached the driver `transport_lost`: the rule is `session::agent`'s),
//! and an idle agent closed.

use std::time::Duration;

use tokio::time::Instant;

use super::state::{Binding, Ending, NextOpen};
use super::{Actor, CANCEL_GRACE, CancelOutcome, CancelReceipt, category_name, files};
use crate::protocol::events::{ErrorCategory, ErrorNotice, EventBody, RunEnd, RunState};
use crate::protocol::states::{RunStatus, SessionState};
use crate::session::SessionError;
use crate::session::agent::{AdapterError, AgentOutput};
use crate::store::StoreError;

impl Actor {
    /// Hand the current run's prompt to the agent, opening it first if needed. A failure ends
    /// the run.
    pub(super) async fn start_turn(&mut self) {
        let Some((text, run_id, attachments)) = self
            .state
            .run()
            .map(|r| (r.text.clone(), r.id.clone(), r.attachments.clone()))
        else {
            return;
        };
        for attempt in 0..2 {
            if let Err(e) = self.ready_agent().await {
                self.fail_run(e).await;
                return;
            }
            let Some(live) = self.state.live() else {
                return;
            };
            match live.session.send_with(&text, &run_id, &attachments).await {
                Ok(()) => return,
                Err(e) if attempt == 0 => {
                    // The process went away while idle and its exit is not seen yet: a new one.
                    tracing::info!(error = %e, "the agent was gone; opening it again");
                    self.drop_agent().await;
                }
                Err(e) => {
                    self.fail_run(e).await;
                    return;
                }
            }
        }
    }

    /// Forget the agent process (its driver stops the group), expire what it left pending,
    /// and read the file as it left it.
    pub(super) async fn drop_agent(&mut self) {
        let live = self.state.take_live();
        self.expire_permissions("the agent process ended").await;
        if let Some(live) = live {
            let next = self.retire(live.child).await;
            self.state.set_next(next);
        }
    }

    /// End the current run as failed with `e`'s category.
    pub(super) async fn fail_run(&mut self, e: AdapterError) {
        tracing::warn!(error = %e.message, category = ?e.category, "the run failed");
        let (message, category) = self.with_env_hint(e.message, e.category).await;
        let e = AdapterError::new(category, message);
        let run_id = self.state.run_id();
        // A run the store outage cut short publishes nothing more (its end comes later).
        if !self.state.run().is_some_and(|r| r.is_cut()) {
            self.cx
                .publish(
                    run_id.as_deref(),
                    EventBody::Error(ErrorNotice {
                        category: e.category,
                        message: e.message.clone(),
                    }),
                )
                .await;
        }
        self.end_run(RunEnd {
            state: RunState::Failed,
            category: Some(e.category),
            message: Some(e.message),
        })
        .await;
    }

    /// An agent's error `message` with the launcher's hint when it says an environment
    /// variable is missing (`Launcher::env_hint`, which reads files: off the runtime), the
    /// agent's own words first; and its category then (a missing credential is
    /// `auth_required` rather than the catch-all `agent_failed`).
    pub(super) async fn with_env_hint(
        &self,
        message: String,
        category: ErrorCategory,
    ) -> (String, ErrorCategory) {
        if !message
            .to_ascii_lowercase()
            .contains("environment variable")
        {
            return (message, category);
        }
        let launcher = self.cx.launcher.clone();
        let agent_type = self.cx.agent_type.clone();
        let text = message.clone();
        let hint = tokio::task::spawn_blocking(move || launcher.env_hint(&agent_type, &text))
            .await
            .ok()
            .flatten();
        match hint {
            Some(hint) => {
                let category = match category {
                    ErrorCategory::AgentFailed => ErrorCategory::AuthRequired,
                    other => other,
                };
                (format!("{message} — hint: {hint}"), category)
            }
            None => (message, category),
        }
    }

    /// Publish the current run's `run.end`, save it, and dispatch the next queued prompt.
    pub(super) async fn end_run(&mut self, mut end: RunEnd) {
        let Some(run) = self.state.finish() else {
            tracing::warn!(state = ?end.state, "a run.end with no run in progress; skipped");
            return;
        };
        if let Ending::Cut { why, .. } = &run.ending {
            // Cut short by a store outage: closed, visibly, once the store is back (its
            // permissions expire then, before its end).
            self.cut_run_ended(run.id, why.clone()).await;
            return;
        }
        if self.link.is_down() {
            let why = self.health_now().error.unwrap_or_default();
            self.cut_run_ended(run.id, why).await;
            return;
        }
        if matches!(run.ending, Ending::Cancel { .. }) && end.state == RunState::Failed {
            // The turn was being cancelled and the agent died doing it: still a cancel.
            end.state = RunState::Cancelled;
            end.category = Some(ErrorCategory::Cancelled);
        }
        self.expire_permissions("the run ended").await;
        // Nothing of an ended run waits for a person any more, even if an expiry could not be
        // written (the store row is expired at the next start): the session is not `waiting`.
        self.pending.clear();
        let state = RunStatus::from(end.state);
        let category = category_name(end.category);
        if self.queue.is_empty() {
            // Before the `run.end`: whoever sees it reads the session idle. (A crash right
            // after leaves it `running`; recovery resets that.) Its `session.state` follows
            // the `run.end`.
            self.cx.set_session_state(SessionState::Idle).await;
            self.arm_idle();
        }
        let ended = end.state;
        let message = end.message.clone();
        // The event is committed before the run's row says it ended.
        if !self
            .cx
            .publish_committed(Some(&run.id), EventBody::RunEnd(end))
            .await
        {
            self.note_outage();
            // The store failed at the very end: no row says this run ended until an event
            // does; the next prompt waits for the store.
            if let Some(outage) = self.link.outage_mut() {
                outage.unclosed.push(run.id);
            }
            return;
        }
        self.set_run_state(&run.id, state, category, message).await;
        // `idle`, or `running` on (from `waiting`) when a follow-up is next.
        self.sync_state().await;
        self.turn_ended(ended).await;
        // An agent whose options changed under its run is restarted before the next prompt.
        self.close_if_outdated().await;
        self.dispatch_next().await;
    }

    /// An idle agent is closed after the launcher's idle timeout.
    pub(super) fn arm_idle(&mut self) {
        let at = self.cx.launcher.idle_timeout().map(|t| Instant::now() + t);
        self.state.set_close_at(at);
    }

    pub(super) async fn on_output(&mut self, output: AgentOutput) {
        let body = match output {
            AgentOutput::Event(body) => body,
            AgentOutput::Pid(pid) => {
                tracing::debug!(?pid, "the agent's process changed");
                if let Some(live) = self.state.live_mut() {
                    live.process(pid);
                }
                return;
            }
            AgentOutput::Exited { status } => {
                tracing::info!(%status, "agent exited");
                self.drop_agent().await;
                if self.state.run().is_some() {
                    // The driver took the prompt and did not end its turn: whether the agent
                    // had it is not known here (`session::agent`, "A turn without its result").
                    self.fail_run(AdapterError::result_unknown(format!(
                        "the agent process exited ({status})"
                    )))
                    .await;
                }
                return;
            }
        };
        let run_id = self.state.run_id();
        let cut = self.state.run().is_some_and(|r| r.is_cut());
        if cut && !matches!(body, EventBody::RunEnd(_) | EventBody::SessionBound(_)) {
            // A run the store outage cut short: nothing more of it is published.
            tracing::debug!(kind = body.kind(), "dropped: the store cannot commit");
            return;
        }
        let body = match body {
            EventBody::Error(notice) => {
                let (message, category) = self.with_env_hint(notice.message, notice.category).await;
                EventBody::Error(ErrorNotice { category, message })
            }
            EventBody::RunEnd(RunEnd {
                state,
                category: Some(category),
                message: Some(message),
            }) => {
                let (message, category) = self.with_env_hint(message, category).await;
                EventBody::RunEnd(RunEnd {
                    state,
                    category: Some(category),
                    message: Some(message),
                })
            }
            other => other,
        };
        match body {
            EventBody::RunEnd(end) => {
                // A cancelled prompt is not re-run in a fresh session: the run just ends.
                let rejected = end.category == Some(ErrorCategory::ResumeRejected)
                    && self.state.live().is_some_and(|l| l.child.opened.resuming())
                    && self
                        .state
                        .run()
                        .is_some_and(|r| !r.retried_fresh && r.ending == Ending::No);
                if rejected {
                    self.continue_fresh().await;
                } else {
                    self.end_run(end).await;
                }
            }
            EventBody::SessionBound(bound) => {
                let id = bound.native_session_id.clone();
                if let Some(live) = self.state.live_mut() {
                    live.child.opened.bound(&id);
                }
                if self.binding.id() != Some(id.as_str()) {
                    let fork_of = matches!(self.binding, Binding::ForkOf(_));
                    let saved = self.save_binding(&id, fork_of).await;
                    self.binding = Binding::Bound {
                        id,
                        unsaved: saved.is_err(),
                    };
                    if saved.is_err() {
                        // Saved once the store is back.
                        self.note_outage();
                    }
                    self.native_changed();
                }
                if !cut {
                    self.cx
                        .publish(run_id.as_deref(), EventBody::SessionBound(bound))
                        .await;
                }
            }
            EventBody::PermissionRequest(request) => {
                self.on_permission_request(request, run_id).await;
            }
            EventBody::PermissionResolved(resolved) => {
                self.on_permission_withdrawn(resolved, run_id).await;
            }
            other => self.cx.publish(run_id.as_deref(), other).await,
        }
    }

    /// Save the native id the agent bound to the row; `fork_of`: the row's fork source is
    /// cleared too (the session has a native session of its own now).
    pub(super) async fn save_binding(&self, id: &str, fork_of: bool) -> Result<(), StoreError> {
        if fork_of {
            match self.cx.store.get_session(self.cx.session_id.clone()).await {
                Ok(Some(mut row)) if row.fork_of.is_some() => {
                    row.fork_of = None;
                    if let Err(e) = self.cx.store.replace_session_lineage(row).await {
                        tracing::error!(error = %e, "clearing the fork source failed");
                        return Err(e);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "reading the session to clear its fork source failed");
                    return Err(e);
                }
            }
        }
        self.cx
            .store
            .set_native_session_id(self.cx.session_id.clone(), id.to_owned())
            .await
            .inspect_err(|e| tracing::error!(error = %e, "saving the native session id failed"))
    }

    /// The agent rejected the resume: say so, and run the prompt in a fresh native session.
    async fn continue_fresh(&mut self) {
        let rejected = match std::mem::replace(&mut self.binding, Binding::Unbound) {
            Binding::Bound { id, .. } | Binding::ForkOf(id) => id,
            Binding::Unbound => String::new(),
        };
        let run_id = self.state.run_id();
        if let Some(run) = self.state.run_mut() {
            run.retried_fresh = true;
        }
        self.drop_agent().await;
        // A fresh native session: nothing the old one's child left decides how it opens.
        self.state.set_next(NextOpen::Decide);
        tracing::warn!(native = %rejected, "the agent rejected the resume; starting fresh");
        self.cx
            .warn(
                run_id.as_deref(),
                "resume_rejected",
                format!(
                    "the agent could not resume its session {rejected}; this prompt continues in \
                     a fresh agent session, which does not remember the earlier turns"
                ),
            )
            .await;
        self.start_turn().await;
    }

    pub(super) async fn on_cancel(
        &mut self,
        run_id: Option<String>,
    ) -> Result<CancelReceipt, SessionError> {
        if let Some(wanted) = &run_id
            && let Some(index) = self.queue.iter().position(|q| &q.run_id == wanted)
            && let Some(answer) = self.remove_queued(index).await
        {
            return answer;
        }
        let (run, live) = self.state.parts_mut();
        let Some(run) = run.filter(|r| run_id.as_ref().is_none_or(|w| *w == r.id)) else {
            return Err(SessionError::RunNotFound(run_id.unwrap_or_else(|| {
                "no run is in progress in this session".to_owned()
            })));
        };
        // One interrupt per run: a repeated cancel only answers (so a burst of cancels can
        // never fill the driver's input queue while it waits for us to take its events).
        if run.cancel(Instant::now() + CANCEL_GRACE)
            && let Some(live) = live
            && let Err(e) = live.session.cancel_turn().await
        {
            tracing::info!(error = %e, "interrupt not delivered; the agent is going away");
        }
        Ok(CancelReceipt {
            run_id: run.id.clone(),
            state: CancelOutcome::Cancelling,
        })
    }

    /// Nothing ran for a while: close the agent process; the next prompt resumes the session.
    pub(super) async fn on_idle(&mut self) {
        self.state.set_close_at(None);
        if !self.queue.is_empty() {
            return;
        }
        let Some(mut live) = self.state.take_live() else {
            return;
        };
        files::stop_watch(&self.cx, &self.binding, None, &mut live.child).await;
        tracing::info!(pid = ?live.session.pid(), "closing an idle agent");
        live.session.close(files::close_grace(&live.child)).await;
        self.expire_permissions("the agent process ended").await;
        let next = self.retire(live.child).await;
        self.state.set_next(next);
    }

    /// The agent did not end an interrupted turn in time: kill it and end the run.
    pub(super) async fn on_cancel_timeout(&mut self) {
        tracing::warn!("the agent ignored the interrupt; killing its process group");
        if let Some(live) = self.state.take_live() {
            live.session.close(Duration::ZERO).await;
            self.expire_permissions("the agent process ended").await;
            let next = self.retire(live.child).await;
            self.state.set_next(next);
        } else {
            self.expire_permissions("the agent process ended").await;
        }
        self.end_run(RunEnd {
            state: RunState::Cancelled,
            category: Some(ErrorCategory::Cancelled),
            message: Some(format!(
                "the agent did not stop within {} s; its process was killed",
                CANCEL_GRACE.as_secs()
            )),
        })
        .await;
    }
}
