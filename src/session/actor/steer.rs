//! `session.steer`: more input for the running turn. Where the family can take it
//! ([`Capabilities::steer`](crate::session::agent::Capabilities)) the text goes to the agent
//! for the current run, and only once the agent took it is it published, as a `user.text`
//! with `steer` in that run. Where it cannot — the family does not steer, the turn is already
//! ending, or the agent refused it — the text becomes a run of its own at the head of the
//! queue, with a `warning` `steer_unsupported` and a `queue.changed` `steered`: it runs next,
//! and nothing claims the turn was influenced. With no turn running it is a plain send.

use super::queue::Taken;
use super::state::Ending;
use super::{Actor, Reply, SteerReceipt};
use crate::protocol::events::{EventBody, PromptFrom, QueueReason, UserText};
use crate::session::SessionError;

impl Actor {
    pub(super) async fn on_steer(
        &mut self,
        text: String,
        client_msg_id: Option<String>,
        from: Option<PromptFrom>,
        reply: Reply<SteerReceipt>,
    ) {
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
        } else {
            let answer = match self.state.live() {
                Some(live) => live.session.steer(&text, &run_id).await,
                None => Err(crate::session::agent::AdapterError::new(
                    crate::protocol::events::ErrorCategory::TransportLost,
                    "the agent process is gone",
                )),
            };
            match answer {
                Ok(()) => {
                    tracing::info!(%run_id, "steered the running turn");
                    self.cx
                        .publish(
                            Some(&run_id),
                            EventBody::UserText(UserText {
                                text,
                                client_msg_id,
                                steer: true,
                                from,
                            }),
                        )
                        .await;
                    let _caller_gone = reply.send(Ok(SteerReceipt {
                        run_id,
                        steered: true,
                        queued: false,
                    }));
                    return;
                }
                Err(e) => {
                    tracing::info!(error = %e, "the agent did not take the steer; queued next");
                    format!(
                        "the agent did not take the input mid-turn ({e}); the prompt runs next, \
                         after this turn"
                    )
                }
            }
        };
        self.steer_to_head(text, client_msg_id, from, why, reply)
            .await;
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
                }));
                return;
            }
            Ok(Taken::New { item, busy }) => (item, busy),
        };
        let _caller_gone = reply.send(Ok(SteerReceipt {
            run_id: item.run_id.clone(),
            steered: false,
            queued: busy,
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
        }));
        self.queue.push_front(item);
        self.cx.warn(Some(&run_id), "steer_unsupported", why).await;
        self.queue_changed(QueueReason::Steered, Some(&run_id))
            .await;
        self.enforce_capacity(&run_id).await;
    }
}
