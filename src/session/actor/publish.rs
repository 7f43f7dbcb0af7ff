//! The actor's one way out: events through the bus (a bracket counts only once committed, an
//! event over the size limit is cut or replaced by a notice), run and session rows, and the
//! published session state. A write the store refuses is never only logged: it takes the actor
//! to its outage state ([`Actor::note_outage`]), which holds new work until the store commits.

use tokio::time::Instant;

use super::state::{HeldNotice, RowUpdate};
use super::{Actor, Cx, OUTAGE_RETRY};
use crate::bus::{BusError, MAX_EVENT_BYTES, Receipt};
use crate::protocol::events::{Event, EventBody, Notice, SessionStateChange};
use crate::protocol::states::{RunStatus, SessionState};
use crate::store::StoreHealth;

impl Cx {
    pub(super) async fn publish(&self, run_id: Option<&str>, body: EventBody) {
        self.publish_receipt(run_id, body).await;
    }

    /// Publish and wait until the event is committed: a terminal event goes to disk before
    /// the row that says the run is over, so after a crash the event log is never behind the
    /// rows (recovery reads the log, see [`crate::session::SessionManager::recover`]). `false`:
    /// it was not committed (nor seen by anyone).
    pub(super) async fn publish_committed(&self, run_id: Option<&str>, body: EventBody) -> bool {
        match self.publish_receipt(run_id, body).await {
            Some(receipt) => committed(receipt).await,
            None => false,
        }
    }

    pub(super) async fn publish_receipt(
        &self,
        run_id: Option<&str>,
        body: EventBody,
    ) -> Option<Receipt> {
        let event = Event::new(&self.session_id, run_id.map(str::to_owned), body);
        match self.bus.publish(&event).await {
            Ok(receipt) => return Some(receipt),
            Err(BusError::TooLarge(size)) => {
                tracing::warn!(
                    size,
                    kind = event.kind(),
                    "an agent event is over the size limit"
                );
                // A block end is cut to fit rather than left out: every `*.start` gets its
                // `*.end`, marked `truncated` with the full size.
                if let Some(fitted) = event.body.truncated_to(size, MAX_EVENT_BYTES) {
                    let fitted = Event::new(&self.session_id, run_id.map(str::to_owned), fitted);
                    match self.bus.publish(&fitted).await {
                        Ok(receipt) => return Some(receipt),
                        Err(e) => tracing::error!(error = %e, "publishing a cut event failed"),
                    }
                }
                let notice = Event::new(
                    &self.session_id,
                    run_id.map(str::to_owned),
                    EventBody::Warning(Notice {
                        code: "event_too_large".to_owned(),
                        message: format!(
                            "a {} event of {size} bytes was over the limit and left out",
                            event.kind()
                        ),
                    }),
                );
                if let Err(e) = self.bus.publish(&notice).await {
                    tracing::error!(error = %e, "publishing failed");
                }
            }
            Err(e) => tracing::error!(error = %e, kind = event.kind(), "publishing failed"),
        }
        None
    }

    pub(super) async fn warn(&self, run_id: Option<&str>, code: &str, message: String) {
        let body = EventBody::Warning(Notice {
            code: code.to_owned(),
            message,
        });
        self.publish(run_id, body).await;
    }

    /// Write a run row's state; `false` if the store refused it.
    async fn set_run_state(
        &self,
        run_id: &str,
        state: RunStatus,
        category: Option<String>,
        message: Option<String>,
    ) -> bool {
        match self
            .store
            .set_run_state(run_id.to_owned(), state, category, message)
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, run_id, "saving the run state failed");
                false
            }
        }
    }

    pub(super) async fn set_session_state(&self, state: SessionState) -> bool {
        match self
            .store
            .set_session_state(self.session_id.clone(), state)
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "saving the session state failed");
                false
            }
        }
    }
}

/// Whether a published bracket was committed (a refused one is logged).
pub(super) async fn committed(receipt: Receipt) -> bool {
    match receipt.committed().await {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(error = %e, "an event was not committed");
            false
        }
    }
}

impl Actor {
    pub(super) fn health_now(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    /// An event or row the store refused: nothing goes on as if it were durable. The outage is
    /// remembered; if the store already says `ok` (it recovered before this was seen, or the
    /// refusal had another cause) it is looked at again shortly, never in a tight loop.
    pub(super) fn note_outage(&mut self) {
        let health = self.health_now();
        let ok = health.is_ok();
        let why = health
            .error
            .unwrap_or_else(|| "an event was not committed".to_owned());
        self.link.down(why);
        if ok
            && let Some(outage) = self.link.outage_mut()
            && outage.retry_at.is_none()
        {
            outage.retry_at = Some(Instant::now() + OUTAGE_RETRY);
        }
    }

    /// Write a run row's state, with the category and message of its end; one the store
    /// refuses is written once it is back.
    pub(super) async fn set_run_state(
        &mut self,
        run_id: &str,
        state: RunStatus,
        category: Option<String>,
        message: Option<String>,
    ) {
        if !self
            .cx
            .set_run_state(run_id, state, category.clone(), message.clone())
            .await
        {
            self.note_outage();
            if let Some(outage) = self.link.outage_mut() {
                outage.rows.push(RowUpdate {
                    run_id: run_id.to_owned(),
                    state,
                    category,
                    message,
                });
            }
        }
    }

    /// Write the rows an outage left unwritten; `false` (and an outage again) if the store
    /// still refuses one.
    pub(super) async fn write_rows(&mut self, rows: Vec<RowUpdate>) -> bool {
        let mut rows = rows.into_iter();
        while let Some(row) = rows.next() {
            if !self
                .cx
                .set_run_state(
                    &row.run_id,
                    row.state,
                    row.category.clone(),
                    row.message.clone(),
                )
                .await
            {
                self.note_outage();
                if let Some(outage) = self.link.outage_mut() {
                    outage.rows.push(row);
                    outage.rows.extend(rows);
                }
                return false;
            }
        }
        true
    }

    /// A warning that undoes a claim the log already holds (a steer's `user.text` the turn did
    /// not take), committed: one the store cannot commit now takes the actor to its outage
    /// state and is kept there, published first once the store commits again
    /// ([`Actor::publish_held`]). `false`: not committed now (it is held).
    pub(super) async fn warn_committed(
        &mut self,
        run_id: Option<&str>,
        code: &str,
        message: String,
    ) -> bool {
        let notice = Notice {
            code: code.to_owned(),
            message,
        };
        if self
            .cx
            .publish_committed(run_id, EventBody::Warning(notice.clone()))
            .await
        {
            return true;
        }
        self.note_outage();
        tracing::warn!(
            ?run_id,
            code,
            "a warning was not committed: held for the store"
        );
        if let Some(outage) = self.link.outage_mut() {
            outage.notices.push(HeldNotice {
                run_id: run_id.map(str::to_owned),
                notice,
            });
        }
        false
    }

    /// Publish, committed and in order, the warnings an outage held; `false` (and an outage
    /// again, holding this one and the rest, ahead of any newer) if the store still refuses
    /// one.
    pub(super) async fn publish_held(&mut self, notices: Vec<HeldNotice>) -> bool {
        let mut notices = notices.into_iter();
        while let Some(held) = notices.next() {
            if !self
                .cx
                .publish_committed(
                    held.run_id.as_deref(),
                    EventBody::Warning(held.notice.clone()),
                )
                .await
            {
                self.note_outage();
                if let Some(outage) = self.link.outage_mut() {
                    let left: Vec<HeldNotice> = std::iter::once(held).chain(notices).collect();
                    outage.notices.splice(0..0, left);
                }
                return false;
            }
        }
        true
    }

    /// A prompt that will never run: its warning (committed), then its row (written once the
    /// store is back if it refuses it now; recovery reads the warning either way). `false`:
    /// the warning was not committed, so nothing retired it — the caller keeps the prompt
    /// queued (its row still says so) rather than lose it in memory only.
    pub(super) async fn retire_queued(
        &mut self,
        run_id: &str,
        state: RunStatus,
        code: &str,
        message: String,
    ) -> bool {
        let body = EventBody::Warning(Notice {
            code: code.to_owned(),
            message: message.clone(),
        });
        // No row claims what no event shows.
        if self.cx.publish_committed(Some(run_id), body).await {
            self.set_run_state(run_id, state, None, Some(message)).await;
            true
        } else {
            self.note_outage();
            false
        }
    }

    /// The state the session is in now (the mapping is [`super::state::State::published`]).
    fn wanted_state(&self) -> SessionState {
        self.state
            .published(!self.queue.is_empty(), !self.pending.is_empty())
    }

    /// Bring the published state in line with [`Self::wanted_state`]: on a change, the row
    /// first, then one committed `session.state` bracket (inside a run, with its id). Nothing
    /// while the store cannot commit: the change is published once it can. A change that was
    /// not committed is tried again at the next sync.
    pub(in crate::session) async fn sync_state(&mut self) {
        if self.link.is_down() || self.state.run().is_some_and(|r| r.is_cut()) {
            return;
        }
        let state = self.wanted_state();
        let previous = self.published;
        if state == previous {
            return;
        }
        if !self.cx.set_session_state(state).await {
            self.note_outage();
            return;
        }
        let run_id = self.state.run_id();
        let body = EventBody::SessionState(SessionStateChange { state, previous });
        if self.cx.publish_committed(run_id.as_deref(), body).await {
            tracing::debug!(%previous, %state, "session state");
            self.published = state;
        } else {
            self.note_outage();
        }
    }
}
