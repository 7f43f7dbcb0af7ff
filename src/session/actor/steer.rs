//! `session.steer`: more input for the running turn. Where the family can take it
//! ([`Capabilities::steer`](crate::session::agent::Capabilities)) the text is committed as a
//! `user.text` with `steer` in the current run and only then given to the agent (nothing
//! reaches an agent that the log does not hold: a steer whose `user.text` the store cannot
//! commit is refused `store_unavailable` and the agent never sees it). The actor does not wait
//! for the agent's answer: the steer is kept ([`PendingSteer`]) and its answer is one more
//! branch of the actor's loop, so a cancel, a permission answer or a `session.get` meanwhile go
//! on; a second steer meanwhile is refused `steer_pending`. Where the turn cannot take it — the
//! family does not steer, or the turn is already ending — nothing is given to the agent and the
//! text becomes a run of its own at the head of the queue, with a `warning` `steer_unsupported`
//! and a `queue.changed` `steered`: it runs next, and nothing claims the turn was influenced.
//! Where the agent refused it or never got it, its `user.text` is committed already, so a
//! committed `warning` `steer_not_taken` in that run (with no `runId` once that run is over,
//! its message naming the run) says the turn did not take it (nothing is left claiming
//! influence the agent did not take), and then it runs next as above. A `steer_not_taken` the
//! store cannot commit is held by the actor's outage state and published first once the store
//! is back; the steer is refused `store_unavailable` (nothing is queued for it). Where the agent
//! got it and never answered (`result_delivery_unknown`), it is not queued (it may be in the
//! turn already): the caller gets `result_delivery_unknown` and the run a `warning`
//! `steer_result_unknown`. With no turn running it is a plain send.
//!
//! A steer taken into a turn is remembered by its `client_msg_id` (in memory, the last
//! [`STEERED_KEPT`] of them, for the actor's life): sent again, it gets the same receipt with
//! `duplicate`, and is not steered twice. A host restart forgets them (the turn they went into
//! is over by then).

use std::collections::VecDeque;

use super::queue::Taken;
use super::state::Ending;
use super::{Actor, Reply, SteerReceipt};
use crate::protocol::events::{ErrorCategory, EventBody, PromptFrom, QueueReason, UserText};
use crate::session::SessionError;
use crate::session::agent::{AdapterError, SteerAnswer};

/// How many steered `client_msg_id`s an actor remembers.
pub(super) const STEERED_KEPT: usize = 256;

/// A steer handed to the agent, its answer not come yet.
pub(super) struct PendingSteer {
    run_id: String,
    text: String,
    client_msg_id: Option<String>,
    from: Option<PromptFrom>,
    reply: Reply<SteerReceipt>,
    answer: SteerAnswer,
}

/// The pending steer's answer (a `select!` branch; never ready without one).
pub(super) async fn next_answer(pending: Option<&mut PendingSteer>) -> Result<(), AdapterError> {
    match pending {
        Some(pending) => pending.answer.wait().await,
        None => std::future::pending().await,
    }
}

/// The steers taken into a turn, by `client_msg_id`: the run each went into.
#[derive(Default)]
pub(super) struct Steered(VecDeque<(String, String)>);

impl Steered {
    fn run_of(&self, client_msg_id: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == client_msg_id)
            .map(|(_, run)| run.as_str())
    }

    fn remember(&mut self, client_msg_id: String, run_id: String) {
        if self.0.len() >= STEERED_KEPT {
            self.0.pop_front();
        }
        self.0.push_back((client_msg_id, run_id));
    }
}

/// Whether an answer means the steer never reached the turn (safe to run it as a prompt).
fn not_taken(e: &AdapterError) -> bool {
    matches!(
        e.category,
        ErrorCategory::TransportLost
            | ErrorCategory::AgentFailed
            | ErrorCategory::ProtocolIncompatible
    )
}

impl Actor {
    pub(super) async fn on_steer(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        reply: Reply<SteerReceipt>,
    ) {
        if let Some(run_id) = client_msg_id
            .as_deref()
            .and_then(|key| self.steered.run_of(key))
        {
            // Taken into that turn already: not again.
            let _caller_gone = reply.send(Ok(SteerReceipt {
                run_id: run_id.to_owned(),
                steered: true,
                queued: false,
                duplicate: true,
            }));
            return;
        }
        if let Some(pending) = &self.steer {
            let _caller_gone = reply.send(Err(SessionError::SteerPending {
                run_id: pending.run_id.clone(),
            }));
            return;
        }
        let Some((run_id, ending)) = self.state.run().map(|r| (r.id.clone(), r.ending.clone()))
        else {
            // Nothing runs: a plain send (it queues only behind a queue the store holds up).
            self.steer_as_send(text, client_msg_id, from, reply).await;
            return;
        };
        let steers = self.cx.launcher.capabilities(&self.cx.agent_type).steer;
        let why = if ending != Ending::No {
            "the running turn is ending; the prompt runs next".to_owned()
        } else if !steers {
            format!(
                "the {} agent cannot take input mid-turn; the prompt runs next, after this turn",
                self.cx.agent_type
            )
        } else if self.state.live().is_none() {
            Self::refused_why(&AdapterError::new(
                ErrorCategory::TransportLost,
                "the agent process is gone",
            ))
        } else {
            // Durable before the agent sees it: the log holds every input a turn was given.
            let user = EventBody::UserText(UserText {
                text: text.clone(),
                client_msg_id: client_msg_id.clone(),
                steer: true,
                from: from.clone(),
                imported: false,
                attachments: Vec::new(),
            });
            if !self.cx.publish_committed(Some(&run_id), user).await {
                self.note_outage();
                tracing::warn!(%run_id, "the store cannot commit: the steer is refused");
                let _caller_gone = reply.send(Err(self.store_unavailable()));
                return;
            }
            let started = match self.state.live() {
                Some(live) => live.session.start_steer(&text, &run_id).await,
                None => Err(AdapterError::new(
                    ErrorCategory::TransportLost,
                    "the agent process is gone",
                )),
            };
            match started {
                Ok(answer) => {
                    self.steer = Some(PendingSteer {
                        run_id,
                        text,
                        client_msg_id,
                        from,
                        reply,
                        answer,
                    });
                    return;
                }
                Err(e) => {
                    if !self.steer_not_taken(&run_id, &text, &e).await {
                        let _caller_gone = reply.send(Err(self.store_unavailable()));
                        return;
                    }
                    Self::refused_why(&e)
                }
            }
        };
        self.steer_to_head(text, client_msg_id, from, why, reply)
            .await;
    }

    fn refused_why(e: &AdapterError) -> String {
        tracing::info!(error = %e, "the agent did not take the steer; queued next");
        format!(
            "the agent did not take the input mid-turn ({e}); the prompt runs next, after this \
             turn"
        )
    }

    /// The agent did not take a steer whose `user.text` is committed in `run_id`: say so
    /// there (or, once that run is over, in the session, the message naming the run), so
    /// nothing claims influence the turn did not take. Committed: `false` if the store cannot
    /// commit it now — the actor is in its outage state, the warning is held and published
    /// first once the store is back, and the caller refuses the steer `store_unavailable`.
    /// What becomes of the text is not said here (it may not be queued): the receipt says,
    /// and a `steer_unsupported` once it is at the head of the queue.
    async fn steer_not_taken(&mut self, run_id: &str, text: &str, e: &AdapterError) -> bool {
        let current = self.state.run_id().as_deref() == Some(run_id);
        let message = format!(
            "the agent did not take the input \"{}\" into run {run_id} ({e}): it was not part \
             of that turn",
            preview(text)
        );
        self.warn_committed(current.then_some(run_id), "steer_not_taken", message)
            .await
    }

    /// The pending steer's answer came (or its wait ran out).
    pub(super) async fn on_steer_answer(&mut self, answer: Result<(), AdapterError>) {
        let Some(PendingSteer {
            run_id,
            text,
            client_msg_id,
            from,
            reply,
            ..
        }) = self.steer.take()
        else {
            return;
        };
        let current = self.state.run_id().as_deref() == Some(run_id.as_str());
        let unknown = match answer {
            Ok(()) if current => {
                // Its `user.text` was committed before the agent got it.
                tracing::info!(%run_id, "steered the running turn");
                if let Some(key) = &client_msg_id {
                    self.steered.remember(key.clone(), run_id.clone());
                }
                let _caller_gone = reply.send(Ok(SteerReceipt {
                    run_id,
                    steered: true,
                    queued: false,
                    duplicate: false,
                }));
                return;
            }
            // Taken as the turn ended: whether the turn used it nobody knows.
            Ok(()) => AdapterError::new(
                ErrorCategory::ResultDeliveryUnknown,
                "the agent took the steer only as its turn ended: whether the turn used it is \
                 unknown",
            ),
            Err(e) if not_taken(&e) => {
                if !self.steer_not_taken(&run_id, &text, &e).await {
                    let _caller_gone = reply.send(Err(self.store_unavailable()));
                    return;
                }
                let why = Self::refused_why(&e);
                if self.state.run().is_some() {
                    self.steer_to_head(text, client_msg_id, from, why, reply)
                        .await;
                } else {
                    self.steer_as_send(text, client_msg_id, from, reply).await;
                }
                return;
            }
            Err(e) => e,
        };
        tracing::info!(error = %unknown, %run_id, "a steer's outcome is unknown");
        let message = format!(
            "the input \"{}\" was given to the agent mid-turn and no answer came ({unknown}); \
             it may or may not be in the turn, so it was not queued: send it again if the turn \
             did not use it",
            preview(&text)
        );
        self.cx
            .warn(
                current.then_some(run_id.as_str()),
                "steer_result_unknown",
                message.clone(),
            )
            .await;
        let _caller_gone = reply.send(Err(SessionError::SteerUnknown(message)));
    }

    /// No turn runs: the text is sent as a prompt.
    async fn steer_as_send(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        reply: Reply<SteerReceipt>,
    ) {
        let (item, busy) = match self.take(text, client_msg_id, from, false).await {
            Err(e) => {
                let _caller_gone = reply.send(Err(e));
                return;
            }
            Ok(Taken::Duplicate(receipt)) => {
                let _caller_gone = reply.send(Ok(SteerReceipt {
                    run_id: receipt.run_id,
                    steered: false,
                    queued: receipt.queued,
                    duplicate: true,
                }));
                return;
            }
            Ok(Taken::New { item, busy }) => (item, busy),
        };
        let _caller_gone = reply.send(Ok(SteerReceipt {
            run_id: item.run_id.clone(),
            steered: false,
            queued: busy,
            duplicate: false,
        }));
        self.settle_taken(item, busy).await;
    }

    /// The turn cannot take it: a run of its own at the head of the queue, said so.
    async fn steer_to_head(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        why: String,
        reply: Reply<SteerReceipt>,
    ) {
        let item = match self.take(text, client_msg_id, from, true).await {
            Err(e) => {
                let _caller_gone = reply.send(Err(e));
                return;
            }
            Ok(Taken::Duplicate(receipt)) => {
                let _caller_gone = reply.send(Ok(SteerReceipt {
                    run_id: receipt.run_id,
                    steered: false,
                    queued: receipt.queued,
                    duplicate: true,
                }));
                return;
            }
            Ok(Taken::New { item, .. }) => item,
        };
        let run_id = item.run_id.clone();
        let _caller_gone = reply.send(Ok::<_, SessionError>(SteerReceipt {
            run_id: run_id.clone(),
            steered: false,
            queued: true,
            duplicate: false,
        }));
        self.push_head(item);
        self.cx.warn(Some(&run_id), "steer_unsupported", why).await;
        self.queue_changed(QueueReason::Steered, Some(&run_id))
            .await;
        self.enforce_capacity(&run_id).await;
    }
}

/// The start of a text, for a message.
fn preview(text: &str) -> String {
    let cut: String = text.chars().take(60).collect();
    if cut.len() < text.len() {
        format!("{cut}…")
    } else {
        cut
    }
}
