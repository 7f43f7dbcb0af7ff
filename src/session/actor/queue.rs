//! Prompts in, and the follow-up queue: a `send` gets its run id (and its row, with the prompt's
//! text) at once; an idle session dispatches it, a busy one queues it (at most the configured
//! capacity, the oldest dropped visibly past that). The queue is the store's as much as the
//! actor's: a queued run's row holds its text and its place (`queue_pos`, lower first), every
//! change is written there before it is published as a `queue.changed` bracket carrying the
//! whole queue, and a host that starts again gives the queue back ([`Actor::restore`]).
//! Dispatch publishes `user.text` then `run.start` (then `queue.changed` `dispatched` for a
//! queued prompt); only once both are committed does the run's row say `running`, and only
//! once that is committed does the prompt go to the agent; while the store cannot commit, the
//! prompt waits at the queue's head, its row `queued`.

use super::files;
use super::state::{Run, Watch};
use super::{Actor, CancelOutcome, CancelReceipt, QueueEdited, QueueEntry, Reply, SendReceipt};
use crate::protocol::events::{
    EventBody, PromptFrom, QueueChange, QueueItem, QueueReason, RunStart, UserText,
};
use crate::protocol::options::{Attachment, AttachmentInfo};
use crate::protocol::states::RunStatus;
use crate::session::SessionError;
use crate::store::{RunInsert, RunRow, StoreError, now_ms};

/// How many bytes of prompt text one `queue.changed` carries at most; past that each text is
/// cut to its share (and marked `truncated`), so a long queue of long prompts stays one event.
const QUEUE_EVENT_TEXT_BYTES: usize = 2 * 1024 * 1024;
/// How many characters of a dropped prompt its `followup_dropped` quotes.
const DROPPED_HEAD_CHARS: usize = 60;

/// A prompt waiting to run.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::session) struct Queued {
    pub run_id: String,
    pub text: String,
    pub client_msg_id: Option<String>,
    /// Its `user.text` is committed already (a dispatch the store cut short after it).
    pub announced: bool,
    /// When it was sent (ms since the epoch): the oldest is dropped first.
    pub created_at_ms: i64,
    /// Its place as its row says (lower first; only the order matters).
    pub pos: i64,
    /// Who sent it (its `user.text` says so).
    pub from: Option<PromptFrom>,
    /// Its attachments, checked and copied when it was taken (kept in its row).
    pub attachments: Vec<Attachment>,
}

impl Queued {
    fn entry(&self) -> QueueEntry {
        QueueEntry {
            run_id: self.run_id.clone(),
            text: self.text.clone(),
            client_msg_id: self.client_msg_id.clone(),
            created_at_ms: self.created_at_ms,
            from: self.from.clone(),
            truncated: false,
        }
    }
}

/// How many bytes of text each of `lens` may keep so that all of them fit in
/// [`QUEUE_EVENT_TEXT_BYTES`] (no limit when they fit whole).
fn text_share(lens: impl Iterator<Item = usize>) -> usize {
    let (count, total) = lens.fold((0usize, 0usize), |(n, t), len| (n + 1, t + len));
    if total > QUEUE_EVENT_TEXT_BYTES {
        QUEUE_EVENT_TEXT_BYTES / count.max(1)
    } else {
        usize::MAX
    }
}

/// A queue as a reply shows it (`session.get`, `queue.move`): bounded as `queue.changed` is,
/// each text cut to its share of 2 MiB (and marked `truncated`) when they do not fit whole.
pub(in crate::session) fn bounded_queue(mut entries: Vec<QueueEntry>) -> Vec<QueueEntry> {
    let share = text_share(entries.iter().map(|e| e.text.len()));
    for entry in &mut entries {
        let kept = cut(&entry.text, share).len();
        if kept < entry.text.len() {
            entry.text.truncate(kept);
            entry.truncated = true;
        }
    }
    entries
}

/// What taking a prompt came to.
pub(super) enum Taken {
    /// Its `client_msg_id` was seen before: that earlier run.
    Duplicate(SendReceipt),
    /// A new run, its row written: `busy` says it queues (the session runs or holds a queue).
    New { item: Queued, busy: bool },
}

/// The start of a prompt for a notice: its first characters, on one line.
pub(super) fn text_head(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = flat.trim();
    let mut head: String = flat.chars().take(DROPPED_HEAD_CHARS).collect();
    if flat.chars().nth(DROPPED_HEAD_CHARS).is_some() {
        head.push('…');
    }
    head
}

/// The start of `text`, at most `max` bytes, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Actor {
    pub(super) async fn on_send(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        attachments: Vec<Attachment>,
        reply: Reply<SendReceipt>,
    ) {
        let taken = self
            .take_with(text, client_msg_id, from, false, attachments)
            .await;
        let (item, busy) = match taken {
            Err(e) => {
                let _caller_gone = reply.send(Err(e));
                return;
            }
            Ok(Taken::Duplicate(receipt)) => {
                let _caller_gone = reply.send(Ok(receipt));
                return;
            }
            Ok(Taken::New { item, busy }) => (item, busy),
        };
        // The caller has its run id before anything else happens.
        let _caller_gone = reply.send(Ok(SendReceipt {
            run_id: item.run_id.clone(),
            queued: busy,
            duplicate: false,
        }));
        self.settle_taken(item, busy).await;
    }

    /// A new prompt goes on: dispatched when nothing runs and nothing waits, else queued at the
    /// end (the oldest dropped past the capacity).
    pub(super) async fn settle_taken(&mut self, item: Queued, busy: bool) {
        if !busy {
            self.dispatch(item, false).await;
            return;
        }
        let run_id = item.run_id.clone();
        self.queue.push_back(item);
        self.queue_changed(QueueReason::Added, Some(&run_id)).await;
        self.enforce_capacity(&run_id).await;
    }

    /// Allocate a run for a prompt and write its row (with the text and, when it queues, its
    /// place: after the last, or before the head with `head`).
    pub(super) async fn take(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        head: bool,
    ) -> Result<Taken, SessionError> {
        self.take_with(text, client_msg_id, from, head, Vec::new())
            .await
    }

    /// [`Actor::take`] with the prompt's attachments (kept in its row).
    pub(super) async fn take_with(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        head: bool,
        attachments: Vec<Attachment>,
    ) -> Result<Taken, SessionError> {
        let busy = self.state.run().is_some() || !self.queue.is_empty();
        // Every row gets its place, an idle one too (its dispatch may be put back): ahead of
        // the queue with `head`, yet never ahead of an announced prompt (see `push_head`; a tie
        // is broken by age, and recovery puts announced prompts first).
        let after_back = self.queue.back().map_or(0, |q| q.pos + 1);
        let pos = if head {
            self.queue
                .iter()
                .find(|q| !q.announced)
                .map_or(after_back, |q| q.pos - 1)
        } else {
            after_back
        };
        let run_id = uuid::Uuid::now_v7().to_string();
        let created_at_ms = now_ms();
        let row = RunRow {
            run_id: run_id.clone(),
            session_id: self.cx.session_id.clone(),
            state: RunStatus::Queued,
            client_msg_id: client_msg_id.clone(),
            error_category: None,
            message: None,
            created_at_ms,
            ended_at_ms: None,
        };
        match self
            .cx
            .store
            .insert_attached_run(
                row,
                Some(text.clone()),
                Some(pos),
                from.clone(),
                attachments.clone(),
            )
            .await?
        {
            RunInsert::Duplicate(existing) => {
                tracing::info!(run_id = %existing.run_id, "a retried prompt: same run");
                Ok(Taken::Duplicate(SendReceipt {
                    queued: existing.state == RunStatus::Queued,
                    run_id: existing.run_id,
                    duplicate: true,
                }))
            }
            RunInsert::Inserted => Ok(Taken::New {
                item: Queued {
                    run_id,
                    text,
                    client_msg_id,
                    announced: false,
                    created_at_ms,
                    pos,
                    from,
                    attachments,
                },
                busy,
            }),
        }
    }

    /// A prompt that runs next: at the head, behind any announced prompt (whose `user.text`
    /// is committed: nothing goes ahead of it).
    pub(super) fn push_head(&mut self, item: Queued) {
        let pinned = self.pinned();
        self.queue.insert(pinned, item);
    }

    /// How many prompts at the head are announced already (pinned there).
    fn pinned(&self) -> usize {
        self.queue.iter().take_while(|q| q.announced).count()
    }

    /// The error for a change the store could not make durable.
    pub(super) fn store_unavailable(&self) -> SessionError {
        let why = match &self.link {
            super::state::Link::Down(outage) => outage.why.clone(),
            super::state::Link::Up => self
                .health_now()
                .error
                .unwrap_or_else(|| "an event was not committed".to_owned()),
        };
        SessionError::StoreUnavailable(why)
    }

    /// Past the capacity, the oldest waiting prompt (never `keep`, the one just taken) is
    /// dropped: its `warning` names it and the start of its text, then the queue's change. A
    /// drop the store cannot commit is not made: the prompt stays queued (over the capacity)
    /// and the drop is tried again once the store is back.
    pub(super) async fn enforce_capacity(&mut self, keep: &str) {
        while self.queue.len() > self.cx.capacity {
            let oldest = self
                .queue
                .iter()
                .enumerate()
                .filter(|(_, q)| q.run_id != keep)
                // Sent in the same millisecond: the one nearer the head.
                .min_by_key(|(index, q)| (q.created_at_ms, *index))
                .map(|(index, _)| index);
            let Some((index, dropped)) =
                oldest.and_then(|index| Some((index, self.queue.remove(index)?)))
            else {
                return;
            };
            tracing::info!(run_id = %dropped.run_id, "follow-up queue full: dropped the oldest");
            let message = format!(
                "more than {} prompts were waiting; the oldest one, run {} (\"{}\"), was \
                 dropped and will not run",
                self.cx.capacity,
                dropped.run_id,
                text_head(&dropped.text)
            );
            if !self
                .retire_queued(
                    &dropped.run_id,
                    RunStatus::Dropped,
                    "followup_dropped",
                    message,
                )
                .await
            {
                tracing::warn!(run_id = %dropped.run_id, "the drop was not committed; it stays queued");
                self.queue.insert(index, dropped);
                return;
            }
            self.queue_changed(QueueReason::Dropped, Some(&dropped.run_id))
                .await;
        }
    }

    /// The queue as `session.get` shows it, head first.
    pub(super) fn queue_entries(&self) -> Vec<QueueEntry> {
        bounded_queue(self.queue.iter().map(Queued::entry).collect())
    }

    /// Publish the whole queue after a change, `run_id` naming the prompt it concerns.
    pub(super) async fn queue_changed(&self, reason: QueueReason, run_id: Option<&str>) {
        let share = text_share(self.queue.iter().map(|q| q.text.len()));
        let queue = self
            .queue
            .iter()
            .map(|q| {
                let text = cut(&q.text, share);
                QueueItem {
                    run_id: q.run_id.clone(),
                    truncated: text.len() < q.text.len(),
                    text: text.to_owned(),
                    from: q.from.clone(),
                }
            })
            .collect();
        self.cx
            .publish(
                run_id,
                EventBody::QueueChanged(QueueChange { reason, queue }),
            )
            .await;
    }

    /// The actor starts with the queue a stopped host left: it is published (`restored`) and
    /// its head dispatched.
    pub(super) async fn restore(&mut self) {
        tracing::info!(count = self.queue.len(), "queued prompts restored");
        self.queue_changed(QueueReason::Restored, None).await;
        if self.state.run().is_none() {
            self.dispatch_next().await;
        }
    }

    /// Why `run_id` cannot be changed as a queued prompt: it is not queued (it runs, ran, or
    /// was taken out), or this session has no such run.
    pub(super) async fn not_queued(&self, run_id: String) -> SessionError {
        match self.cx.store.get_run(run_id.clone()).await {
            Ok(Some(row)) if row.session_id == self.cx.session_id => SessionError::NotQueued {
                run_id,
                state: row.state,
            },
            Ok(_) => SessionError::RunNotFound(format!("no run {run_id} in this session")),
            Err(e) => e.into(),
        }
    }

    fn queued_index(&self, run_id: &str) -> Option<usize> {
        self.queue.iter().position(|q| q.run_id == run_id)
    }

    /// `queue.edit`: the text is saved in the run's row, then the queue's change published.
    pub(super) async fn on_queue_edit(
        &mut self,
        run_id: String,
        text: String,
    ) -> Result<QueueEdited, SessionError> {
        let Some(index) = self.queued_index(&run_id) else {
            return Err(self.not_queued(run_id).await);
        };
        if self.queue.get(index).is_some_and(|q| q.announced) {
            // Its `user.text` (a dispatch the store cut short after it) said this text: it
            // runs as announced, never with a second `user.text`.
            return Err(SessionError::QueueHeadAnnounced { run_id });
        }
        if !self
            .cx
            .store
            .set_run_prompt(run_id.clone(), text.clone())
            .await?
        {
            if self.link.is_down() {
                // A dispatch the store cut short: its row goes back to `queued` once the
                // store is back.
                return Err(self.store_unavailable());
            }
            // The row is not queued while the actor holds it so: never, by the writes here.
            tracing::error!(%run_id, "a queued prompt's row is not queued");
            return Err(self.not_queued(run_id).await);
        }
        if let Some(item) = self.queue.get_mut(index) {
            item.text = text.clone();
        }
        self.queue_changed(QueueReason::Edited, Some(&run_id)).await;
        Ok(QueueEdited { run_id, text })
    }

    /// `queue.move`: the new order is saved, then published; a move to where it is already
    /// changes nothing.
    pub(super) async fn on_queue_move(
        &mut self,
        run_id: String,
        position: usize,
    ) -> Result<Vec<QueueEntry>, SessionError> {
        let Some(from) = self.queued_index(&run_id) else {
            return Err(self.not_queued(run_id).await);
        };
        // An announced prompt stays at the head: it is not moved, nothing goes ahead of it.
        let pinned = self.pinned();
        let to = position.min(self.queue.len() - 1).max(pinned);
        if from < pinned {
            if position == from {
                return Ok(self.queue_entries());
            }
            return Err(SessionError::QueueHeadAnnounced { run_id });
        }
        if to == from {
            return Ok(self.queue_entries());
        }
        let mut order: Vec<Queued> = self.queue.iter().cloned().collect();
        let item = order.remove(from);
        order.insert(to, item);
        self.cx
            .store
            .set_queue_order(order.iter().map(|q| q.run_id.clone()).collect())
            .await?;
        for (pos, item) in order.iter_mut().enumerate() {
            item.pos = pos as i64;
        }
        self.queue = order.into();
        self.queue_changed(QueueReason::Moved, Some(&run_id)).await;
        Ok(self.queue_entries())
    }

    /// Take the queued prompt at `index` out (it never runs): its `warning`
    /// `followup_cancelled`, its row, then the queue's change. A removal the store cannot
    /// commit is not made: the prompt stays queued and the caller gets `store_unavailable`.
    pub(super) async fn remove_queued(
        &mut self,
        index: usize,
    ) -> Option<Result<CancelReceipt, SessionError>> {
        let item = self.queue.remove(index)?;
        if !self
            .retire_queued(
                &item.run_id,
                RunStatus::Cancelled,
                "followup_cancelled",
                "this queued prompt was cancelled before it ran".to_owned(),
            )
            .await
        {
            self.queue.insert(index, item);
            return Some(Err(self.store_unavailable()));
        }
        self.queue_changed(QueueReason::Removed, Some(&item.run_id))
            .await;
        Some(Ok(CancelReceipt {
            run_id: item.run_id,
            state: CancelOutcome::Cancelled,
        }))
    }

    /// `queue.remove`: a queued prompt only (a running turn is `session.cancel`'s).
    pub(super) async fn on_queue_remove(
        &mut self,
        run_id: String,
    ) -> Result<CancelReceipt, SessionError> {
        let Some(index) = self.queued_index(&run_id) else {
            return Err(self.not_queued(run_id).await);
        };
        match self.remove_queued(index).await {
            Some(answer) => answer,
            None => Err(self.not_queued(run_id).await),
        }
    }

    /// `queue.clear`: every queued prompt cancelled, then one change. Once the store cannot
    /// commit a removal, the prompts not yet removed stay queued (the change says which went)
    /// and the caller gets `store_unavailable`.
    pub(super) async fn on_queue_clear(&mut self) -> Result<Vec<String>, SessionError> {
        let mut removed = Vec::with_capacity(self.queue.len());
        let mut failed = false;
        while let Some(item) = self.queue.pop_front() {
            if !self
                .retire_queued(
                    &item.run_id,
                    RunStatus::Cancelled,
                    "followup_cancelled",
                    "this queued prompt was cancelled before it ran (the queue was cleared)"
                        .to_owned(),
                )
                .await
            {
                self.queue.push_front(item);
                failed = true;
                break;
            }
            removed.push(item.run_id);
        }
        if !removed.is_empty() {
            self.queue_changed(QueueReason::Cleared, None).await;
        }
        if failed {
            return Err(self.store_unavailable());
        }
        Ok(removed)
    }

    /// Dispatch the queue's head, if any.
    pub(super) async fn dispatch_next(&mut self) {
        if let Some(next) = self.queue.pop_front() {
            Box::pin(self.dispatch(next, true)).await;
        }
    }

    /// Start a run: `user.text`, `run.start`, then its row `running`, then the prompt to the
    /// agent — each only once the one before is committed, so the row never says `running`
    /// for a run whose `run.start` the log does not hold. While the store cannot commit, the
    /// prompt waits at the queue's head (its row still `queued`). `queued`: it comes from the
    /// queue (its start is a change of the queue).
    pub(super) async fn dispatch(&mut self, mut item: Queued, queued: bool) {
        if self.link.is_down() {
            self.queue.push_front(item);
            return;
        }
        tracing::info!(run_id = %item.run_id, "run dispatched");
        self.state.set_close_at(None);
        let attributed = self.files.attributed();
        if let Some(live) = self.state.live_mut() {
            // Our child writes the file from now on; a change already waiting is someone
            // else's (unattributed families: their watch is for idle times only).
            if !attributed && matches!(live.child.watch, Watch::Due(_)) {
                live.child.watch = Watch::Off;
            }
            files::stop_watch(&self.cx, &self.binding, None, &mut live.child).await;
        }
        self.files.own_prompt(&item.run_id);
        let user = if item.announced {
            None
        } else {
            self.cx
                .publish_receipt(
                    Some(&item.run_id),
                    EventBody::UserText(UserText {
                        text: item.text.clone(),
                        client_msg_id: item.client_msg_id.clone(),
                        steer: false,
                        from: item.from.clone(),
                        imported: false,
                        attachments: item.attachments.iter().map(AttachmentInfo::from).collect(),
                    }),
                )
                .await
        };
        let start = self
            .cx
            .publish_receipt(
                Some(&item.run_id),
                EventBody::RunStart(RunStart {
                    agent: Some(self.cx.agent_type.clone()),
                    model: None,
                }),
            )
            .await;
        let announced = match user {
            Some(receipt) => super::publish::committed(receipt).await,
            None => item.announced,
        };
        let started = match start {
            Some(receipt) => super::publish::committed(receipt).await,
            None => false,
        };
        if !(announced && started) {
            self.note_outage();
            tracing::warn!(run_id = %item.run_id, "the store cannot commit: the prompt waits");
            // Nothing wrote its row: it still says `queued`, its place kept.
            item.announced = announced;
            self.queue.push_front(item);
            return;
        }
        // Its `run.start` is durable: now the row (and the session's) may say `running`, in
        // the writer's order before anything this run saves later.
        let saved = match self
            .cx
            .store
            .start_run(self.cx.session_id.clone(), item.run_id.clone())
            .await
        {
            Ok(committed) => committed.await.unwrap_or(Err(StoreError::Closed)),
            Err(e) => Err(e),
        };
        if let Err(e) = saved {
            tracing::error!(error = %e, run_id = %item.run_id, "saving the run start failed");
            // Started as far as the log goes, and the prompt never reached the agent: it is
            // closed `interrupted` once the store is back (as a restart would close it), its
            // row `queued` until then.
            self.note_outage();
            self.cut_run_ended(item.run_id, e.to_string()).await;
            return;
        }
        let run_id = item.run_id.clone();
        let mut run = Run::new(item.run_id, item.text);
        run.attachments = item.attachments;
        if let Err(run) = self.state.start(run) {
            // Never: a dispatch comes only when no run is in progress.
            tracing::error!(run_id = %run.id, "a run was dispatched over another; it waits");
            self.queue.push_front(Queued {
                run_id: run.id,
                text: run.text,
                client_msg_id: item.client_msg_id,
                announced: true,
                created_at_ms: item.created_at_ms,
                pos: item.pos,
                from: item.from,
                attachments: run.attachments,
            });
            return;
        }
        if queued {
            // After its `run.start`: the queue lost its head.
            self.queue_changed(QueueReason::Dispatched, Some(&run_id))
                .await;
        }
        // After its `run.start`, before anything the agent says.
        self.sync_state().await;
        self.start_turn().await;
    }
}
