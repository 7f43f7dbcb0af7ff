//! Store outages (the reliability rules): when the store cannot commit (its health turns
//! `degraded`, or a write of this actor's is refused) the running turn is interrupted (killed
//! if it does not stop within the cancel grace) and nothing more of it is published; new work
//! is refused upstream with `store_unavailable` and queued prompts wait. The store recovers by
//! itself (its probes back off); once it commits again, what the outage left is done in order:
//! the warnings it held published (a `steer_not_taken` the store could not commit: the log is
//! not left claiming a turn took a steer it did not), the native id saved, refused run rows written, each cut run closed with a committed
//! `run.end` `interrupted` (only then does its row say so), a prompt dispatch could not start
//! says `queued` again, a drop past the capacity the outage refused is made, and the queue goes
//! on. A failure on the way is an outage again, and the rest waits for the next recovery.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::state::{Binding, Outage, RowUpdate};
use super::{Actor, CANCEL_GRACE};
use crate::protocol::events::{EventBody, RunEnd, RunState};
use crate::protocol::states::RunStatus;
use crate::store::StoreHealth;

impl Actor {
    pub(super) async fn on_health(&mut self, health: StoreHealth) {
        if health.outages > self.outages_seen {
            // Down (and perhaps up again already, between two looks): what ran meanwhile lost
            // events either way.
            self.outages_seen = health.outages;
            let why = health
                .error
                .clone()
                .unwrap_or_else(|| "a commit failed".to_owned());
            self.on_store_down(why).await;
        }
        if health.error.is_none() {
            self.on_store_back().await;
        }
    }

    /// The store cannot commit: interrupt the running turn (killed if it does not stop within
    /// the cancel grace); nothing more of it is published.
    async fn on_store_down(&mut self, why: String) {
        self.link.down(why.clone());
        let (run, live) = self.state.parts_mut();
        let Some(run) = run else {
            return;
        };
        if run.is_cut() {
            return;
        }
        tracing::warn!(run_id = %run.id, "the store cannot commit: interrupting the running turn");
        if run.cut(Instant::now() + CANCEL_GRACE, why)
            && let Some(live) = live
            && let Err(e) = live.session.cancel_turn().await
        {
            tracing::info!(error = %e, "interrupt not delivered; the agent is going away");
        }
    }

    /// A run the outage cut short ended: it is closed once the store is back (at once if it
    /// is already).
    pub(super) async fn cut_run_ended(&mut self, run_id: String, why: String) {
        self.link.down(why);
        if let Some(outage) = self.link.outage_mut() {
            outage.unclosed.push(run_id);
        }
        if self.health_now().is_ok() {
            Box::pin(self.on_store_back()).await;
        }
    }

    /// What an interrupted recovery leaves for the next one (the actor is down again).
    fn hold(&mut self, unclosed: VecDeque<String>, rows: Vec<RowUpdate>) {
        if let Some(outage) = self.link.outage_mut() {
            outage.unclosed.splice(0..0, unclosed);
            outage.rows.splice(0..0, rows);
        }
    }

    /// The store commits again: save what it refused, close the runs the outage cut short,
    /// then go on with the queue.
    pub(super) async fn on_store_back(&mut self) {
        if !self.link.is_down() {
            return;
        }
        if !self.health_now().is_ok() {
            // Not over yet: the health watch says when it is.
            return;
        }
        let Some(Outage {
            why,
            unclosed,
            rows,
            notices,
            ..
        }) = self.link.up()
        else {
            return;
        };
        let unclosed = VecDeque::from(unclosed);
        // First the warnings it held: each undoes a claim the log already holds, and one in a
        // run the outage cut short goes before that run's end.
        if !self.publish_held(notices).await {
            self.hold(unclosed, rows);
            return;
        }
        if let Binding::Bound { id, unsaved: true } = &self.binding {
            let id = id.clone();
            if self.save_binding(&id, true).await.is_err() {
                self.note_outage();
                self.hold(unclosed, rows);
                return;
            }
            self.binding = Binding::Bound { id, unsaved: false };
        }
        if !self.write_rows(rows).await {
            self.hold(unclosed, Vec::new());
            return;
        }
        let mut unclosed = unclosed;
        while let Some(run_id) = unclosed.front().cloned() {
            let end = RunEnd {
                state: RunState::Interrupted,
                category: None,
                message: Some(format!(
                    "the store could not commit this run's events ({why}); the turn was \
                     interrupted"
                )),
            };
            let message = end.message.clone();
            // Its permission requests go with it, before its end.
            self.expire_permissions("the run ended").await;
            if !self
                .cx
                .publish_committed(Some(&run_id), EventBody::RunEnd(end))
                .await
            {
                // Down again: the next recovery tries once more.
                self.note_outage();
                self.hold(unclosed, Vec::new());
                return;
            }
            self.set_run_state(&run_id, RunStatus::Interrupted, None, message)
                .await;
            unclosed.pop_front();
            tracing::info!(%run_id, "a run the store outage cut short is closed");
            if self.state.run().is_none() {
                self.turn_ended(RunState::Interrupted).await;
            }
        }
        // A drop the outage refused (the queue is over its capacity) is made now.
        self.enforce_capacity("").await;
        if self.link.is_down() {
            return;
        }
        if self.state.run().is_none() {
            if self.queue.is_empty() {
                self.sync_state().await;
                self.arm_idle();
            } else {
                self.dispatch_next().await;
            }
        }
    }
}
