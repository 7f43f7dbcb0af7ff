//! Prompts in: a `send` gets its run id (and its row) at once; an idle session dispatches it, a
//! busy one queues it (at most [`MAX_QUEUE`], the oldest dropped visibly past that). Dispatch
//! publishes `user.text` then `run.start` and hands the prompt to the agent only once both are
//! committed; while the store cannot commit, the prompt waits at the queue's head.

use super::state::{Run, Watch};
use super::{Actor, MAX_QUEUE, Reply, SendReceipt, files};
use crate::protocol::events::{EventBody, RunStart, UserText};
use crate::protocol::states::RunStatus;
use crate::store::{RunInsert, RunRow, StoreError, now_ms};

/// A prompt waiting to run.
pub(super) struct Queued {
    pub run_id: String,
    pub text: String,
    pub client_msg_id: Option<String>,
    /// Its `user.text` is committed already (a dispatch the store cut short after it).
    pub announced: bool,
}

impl Actor {
    pub(super) async fn on_send(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        reply: Reply<SendReceipt>,
    ) {
        let run_id = uuid::Uuid::now_v7().to_string();
        let row = RunRow {
            run_id: run_id.clone(),
            session_id: self.cx.session_id.clone(),
            state: RunStatus::Queued,
            client_msg_id: client_msg_id.clone(),
            error_category: None,
            message: None,
            created_at_ms: now_ms(),
            ended_at_ms: None,
        };
        match self.cx.store.insert_run(row).await {
            Err(e) => {
                let _caller_gone = reply.send(Err(e.into()));
                return;
            }
            Ok(RunInsert::Duplicate(existing)) => {
                tracing::info!(run_id = %existing.run_id, "a retried prompt: same run");
                let _caller_gone = reply.send(Ok(SendReceipt {
                    queued: existing.state == RunStatus::Queued,
                    run_id: existing.run_id,
                    duplicate: true,
                }));
                return;
            }
            Ok(RunInsert::Inserted) => {}
        }
        let item = Queued {
            run_id: run_id.clone(),
            text,
            client_msg_id,
            announced: false,
        };
        let busy = self.state.run().is_some() || !self.queue.is_empty();
        // The caller has its run id before anything else happens.
        let _caller_gone = reply.send(Ok(SendReceipt {
            run_id,
            queued: busy,
            duplicate: false,
        }));
        if !busy {
            self.dispatch(item).await;
            return;
        }
        self.queue.push_back(item);
        while self.queue.len() > MAX_QUEUE {
            if let Some(dropped) = self.queue.pop_front() {
                tracing::info!(run_id = %dropped.run_id, "follow-up queue full: dropped the oldest");
                self.retire_queued(
                    &dropped.run_id,
                    RunStatus::Dropped,
                    "followup_dropped",
                    format!(
                        "more than {MAX_QUEUE} prompts were waiting; the oldest one was dropped \
                         and will not run"
                    ),
                )
                .await;
            }
        }
    }

    /// Start a run: `user.text`, `run.start`, then the prompt to the agent — only once both
    /// are committed. While the store cannot commit, the prompt waits at the queue's head.
    pub(super) async fn dispatch(&mut self, mut item: Queued) {
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
        // Queued now: in the writer's order before the events and anything this run saves.
        let saved = self
            .cx
            .store
            .start_run(self.cx.session_id.clone(), item.run_id.clone())
            .await;
        let user = if item.announced {
            None
        } else {
            self.cx
                .publish_receipt(
                    Some(&item.run_id),
                    EventBody::UserText(UserText {
                        text: item.text.clone(),
                        client_msg_id: item.client_msg_id.clone(),
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
        let saved = match saved {
            Ok(committed) => committed.await.unwrap_or(Err(StoreError::Closed)),
            Err(e) => Err(e),
        };
        if let Err(e) = &saved {
            tracing::error!(error = %e, "saving the run start failed");
        }
        let announced = match user {
            Some(receipt) => super::publish::committed(receipt).await,
            None => item.announced,
        };
        let started = match start {
            Some(receipt) => super::publish::committed(receipt).await,
            None => false,
        };
        if !(announced && started && saved.is_ok()) {
            self.note_outage();
            tracing::warn!(run_id = %item.run_id, "the store cannot commit: the prompt waits");
            item.announced = announced;
            self.queue.push_front(item);
            return;
        }
        if let Err(run) = self.state.start(Run::new(item.run_id, item.text)) {
            // Never: a dispatch comes only when no run is in progress.
            tracing::error!(run_id = %run.id, "a run was dispatched over another; it waits");
            self.queue.push_front(Queued {
                run_id: run.id,
                text: run.text,
                client_msg_id: item.client_msg_id,
                announced: true,
            });
            return;
        }
        // After its `run.start`, before anything the agent says.
        self.sync_state().await;
        self.start_turn().await;
    }
}
