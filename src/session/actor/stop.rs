//! The end of the task: queued prompts stay queued (their rows say so, with their text and
//! place: the next host runs them), a running turn is interrupted and what the agent says until
//! it ends is passed on, the agent is closed and its file read as it left it, pending requests
//! expire, and the session goes `idle` after the run's `run.end`. A quiet stop (the session is
//! being deleted) publishes nothing.

use tokio::time::Instant;

use super::{Actor, STOP_GRACE, files};
use crate::protocol::events::{EventBody, RunEnd, RunState};
use crate::protocol::states::{RunStatus, SessionState};
use crate::session::agent::AgentOutput;

impl Actor {
    /// The task ends: queued prompts wait for the next host (taken out of the actor's queue
    /// first, so the turn's end dispatches nothing), a running turn is interrupted, the agent
    /// is closed. `quiet` publishes nothing (the session's events are being deleted).
    pub(super) async fn stop(&mut self, quiet: bool) {
        let kept = std::mem::take(&mut self.queue);
        if quiet {
            for item in &kept {
                self.set_run_state(&item.run_id, RunStatus::Dropped, None, None)
                    .await;
            }
        } else if !kept.is_empty() {
            tracing::info!(
                count = kept.len(),
                "the host stops; queued prompts stay queued for its next start"
            );
        }
        if self.state.run().is_some() && !quiet {
            self.wind_down_turn().await;
        }
        let run_id = self.state.run_id();
        if let Some(live) = self.state.live_mut() {
            files::stop_watch(&self.cx, &self.binding, run_id.as_deref(), &mut live.child).await;
        }
        if let Some(live) = self.state.take_live() {
            live.session.close(files::close_grace(&live.child)).await;
            if !quiet {
                self.retire(live.child).await;
            }
        }
        if quiet {
            return;
        }
        self.expire_permissions("the host stopped").await;
        self.pending.clear();
        self.cx.set_session_state(SessionState::Idle).await;
        if let Some(run) = self.state.finish() {
            let message = "the host stopped during this run".to_owned();
            self.cx
                .publish_committed(
                    Some(&run.id),
                    EventBody::RunEnd(RunEnd {
                        state: RunState::Interrupted,
                        category: None,
                        message: Some(message.clone()),
                    }),
                )
                .await;
            self.set_run_state(&run.id, RunStatus::Interrupted, None, Some(message))
                .await;
        }
        // After the run's `run.end`.
        self.sync_state().await;
    }

    /// Interrupt the running turn and pass on what the agent says until it ends (or the grace
    /// runs out). A turn that completed keeps its `run.end`; any other becomes `interrupted`.
    async fn wind_down_turn(&mut self) {
        let Some(live) = self.state.live() else {
            return;
        };
        if live.session.cancel_turn().await.is_err() {
            return;
        }
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            let Some(live) = self.state.live_mut() else {
                return;
            };
            let output = match tokio::time::timeout_at(deadline, live.session.events.recv()).await {
                Ok(Some(output)) => output,
                Ok(None) | Err(_) => return,
            };
            match output {
                AgentOutput::Event(EventBody::RunEnd(end)) => {
                    if end.state == RunState::Completed {
                        // It finished on its own: that is how it ended.
                        self.end_run(end).await;
                    }
                    return;
                }
                AgentOutput::Exited { .. } => return,
                AgentOutput::Event(
                    body @ (EventBody::PermissionRequest(_) | EventBody::PermissionResolved(_)),
                ) => {
                    tracing::debug!(kind = body.kind(), "skipped while stopping");
                }
                output => self.on_output(output).await,
            }
        }
    }
}
