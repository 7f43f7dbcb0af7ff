//! The session's options changing under a live session (`session.set_model`): saved on the
//! row first (every agent opened from then on gets them), then taken by the agent as its
//! family can, and published as one `session.configured` saying how:
//!
//! - `live`: the live agent took the model at once (its driver answered
//!   `ModelSwitch::Live`);
//! - `next_turn`: the next turn carries it (the driver said so, or no agent is live: the next
//!   open has it);
//! - `restart`: the live agent cannot take it (a family that takes a model only at start, or
//!   a driver that refused it): the agent is closed at once when no run is in progress, else
//!   marked `outdated` and closed right after its run ends; the next prompt resumes the
//!   session in a new process, opened with the new options. An outdated agent is never given
//!   another prompt (`open` checks).

use super::Actor;
use super::files;
use crate::protocol::events::{Applied, ConfigReason, EventBody, SessionConfigured};
use crate::session::agent::ModelSwitch;
use crate::session::{ModelSet, SessionError};

impl Actor {
    pub(super) async fn on_set_model(
        &mut self,
        model: String,
        switch: ModelSwitch,
    ) -> Result<ModelSet, SessionError> {
        let mut options = self.options.clone();
        options.model = Some(model.clone());
        if !self
            .cx
            .store
            .set_session_options(self.cx.session_id.clone(), options.clone())
            .await?
        {
            return Err(SessionError::NotFound(self.cx.session_id.clone()));
        }
        self.options = options;
        // The binding names the model the session runs on from now on (the row says it at
        // once, and a later open compares with it).
        self.rebind_model(&model).await;
        let applied = match self.state.live() {
            None => Applied::NextTurn,
            // A family that takes a model only at start is not asked.
            Some(_) if switch == ModelSwitch::Restart => Applied::Restart,
            Some(live) => match live.session.set_model(&model).await {
                Ok(ModelSwitch::Live) => Applied::Live,
                Ok(ModelSwitch::NextTurn) => Applied::NextTurn,
                Ok(ModelSwitch::Restart | ModelSwitch::None) => Applied::Restart,
                Err(e) => {
                    tracing::info!(error = %e.message, "the agent did not take the model live; restarting it");
                    Applied::Restart
                }
            },
        };
        if applied == Applied::Restart {
            self.restart_agent().await;
        }
        tracing::info!(%model, ?applied, "the session's model changed");
        let message = match applied {
            Applied::Live => {
                format!("the session runs on {model} from now on; the agent took it at once")
            }
            Applied::NextTurn => {
                format!("the session runs on {model} from now on, from its next turn")
            }
            Applied::Restart => format!(
                "the session runs on {model} from now on; the agent takes a model only when it \
                 starts, so it is restarted (resuming its session) for the next turn"
            ),
        };
        self.cx
            .publish(
                None,
                EventBody::SessionConfigured(SessionConfigured {
                    reason: ConfigReason::SetModel,
                    changed: vec!["model".to_owned()],
                    model: Some(model.clone()),
                    applied: Some(applied),
                    message,
                }),
            )
            .await;
        Ok(ModelSet {
            session_id: self.cx.session_id.clone(),
            model,
            applied,
        })
    }

    /// The live agent was opened with options changed since: closed now if no run is in
    /// progress, else marked to be closed once its run ends.
    async fn restart_agent(&mut self) {
        if self.state.run().is_some() {
            if let Some(live) = self.state.live_mut() {
                live.child.outdated = true;
            }
            return;
        }
        self.close_outdated_now().await;
    }

    /// An outdated agent (marked by [`Actor::restart_agent`]) is closed: after its run ended,
    /// and before a prompt would be handed to it (never while it has a prompt).
    pub(super) async fn close_if_outdated(&mut self) {
        if self.state.live().is_some_and(|l| l.child.outdated) {
            self.close_outdated_now().await;
        }
    }

    /// Close the idle agent (as its idle timeout would): the next prompt resumes the session
    /// in a new process, with the session's options as they are now.
    async fn close_outdated_now(&mut self) {
        self.state.set_close_at(None);
        let run_id = self.state.run_id();
        let Some(mut live) = self.state.take_live() else {
            return;
        };
        files::stop_watch(&self.cx, &self.binding, run_id.as_deref(), &mut live.child).await;
        tracing::info!(pid = ?live.session.pid(), "closing an agent opened with other options");
        live.session.close(files::close_grace(&live.child)).await;
        self.expire_permissions("the agent process ended").await;
        let next = self.retire(live.child).await;
        self.state.set_next(next);
    }
}
