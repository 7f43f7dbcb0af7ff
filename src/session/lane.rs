//! The delta lane: an agent's streamed deltas straight from its driver to the bus, past the
//! session actor, when nothing of the session is ahead of them.
//!
//! Every output of a driver goes to the session actor through [`Outputs`] (one channel, in
//! order), and the actor publishes it. A delta (`*.delta`, `tool.exec.update`: never stored)
//! needs nothing of the actor but the run it belongs to, so the lane lets the driver publish
//! it itself — one task hand-off fewer on the way of every streamed token — when, and only
//! when, this order-preserving condition holds:
//!
//! - every output the driver sent before has been handled by the actor (a counter: each send
//!   adds one, the actor takes it off once the output is published and its state updated), and
//! - the actor has the lane open on a run: a live run whose events are published (not cut by a
//!   store outage). The actor sets and clears it after each step of its loop, under the lane's
//!   lock, which the driver holds while it publishes: no delta gets past a change the actor
//!   made (a run ended, cut, or cancelled).
//!
//! The bus then takes the delta only when its own pipeline is idle ([`Bus::try_publish_delta`]),
//! so it never overtakes a bracket the actor published before. Otherwise — and for every
//! bracket — the output takes the channel, as it always did. A driver that never uses the lane
//! (a [`Outputs::plain`] one, or a test's raw channel) behaves exactly as before.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::mpsc;

use super::agent::AgentOutput;
use crate::bus::Bus;
use crate::protocol::events::{Event, EventBody};

/// Where a session's deltas may go directly; shared by the driver ([`Outputs`]) and the
/// session's actor.
#[derive(Default)]
pub struct DeltaLane {
    /// Outputs sent through the channel and not yet handled by the actor.
    in_flight: AtomicUsize,
    /// The bus and the session, once the actor took the agent.
    target: OnceLock<(Bus, String)>,
    /// The run deltas go to now; `None`: closed.
    run: Mutex<Option<String>>,
    /// Deltas published by the lane so far.
    taken: AtomicU64,
}

impl std::fmt::Debug for DeltaLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaLane")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("run", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl DeltaLane {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // Only a run id is kept under it: nothing a panic could leave half-done.
        self.run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The actor took the agent: its deltas may go to `session_id` on `bus` (once opened).
    pub(crate) fn attach(&self, bus: &Bus, session_id: &str) {
        let _already = self.target.set((bus.clone(), session_id.to_owned()));
    }

    /// Open the lane on `run`, or close it (`None`). Called by the actor after each step.
    pub(crate) fn set_run(&self, run: Option<&str>) {
        let mut current = self.lock();
        if current.as_deref() != run {
            *current = run.map(str::to_owned);
        }
    }

    /// The actor handled one output that came through the channel.
    pub(crate) fn handled(&self) {
        // Never below zero, whatever a caller does.
        let _was_zero = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Publish a delta now if nothing is ahead of it; the body back otherwise (it then takes
    /// the channel).
    fn try_publish(&self, body: EventBody) -> Option<EventBody> {
        if body.class() != crate::protocol::events::EventClass::Delta
            || self.in_flight.load(Ordering::Acquire) != 0
        {
            return Some(body);
        }
        let Some((bus, session_id)) = self.target.get() else {
            return Some(body);
        };
        let run = self.lock();
        let Some(run_id) = run.as_ref() else {
            return Some(body);
        };
        let event = Event::new(session_id, Some(run_id.clone()), body);
        if !bus.try_publish_delta(&event) {
            return Some(event.body);
        }
        self.taken.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// How many deltas took the lane.
    pub fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
}

/// A driver's sending side of its outputs: the channel to the session actor, and the lane.
#[derive(Debug, Clone)]
pub struct Outputs {
    tx: mpsc::Sender<AgentOutput>,
    lane: Option<Arc<DeltaLane>>,
}

impl Outputs {
    /// Outputs over `tx` that may take `lane` (shared with the session's handle).
    pub fn new(tx: mpsc::Sender<AgentOutput>, lane: Arc<DeltaLane>) -> Self {
        Outputs {
            tx,
            lane: Some(lane),
        }
    }

    /// Outputs over `tx` alone: everything takes the channel.
    pub fn plain(tx: mpsc::Sender<AgentOutput>) -> Self {
        Outputs { tx, lane: None }
    }

    /// Send one output through the channel, in order. An error: the session is gone.
    pub async fn send(
        &self,
        output: AgentOutput,
    ) -> Result<(), mpsc::error::SendError<AgentOutput>> {
        let Some(lane) = &self.lane else {
            return self.tx.send(output).await;
        };
        lane.in_flight.fetch_add(1, Ordering::AcqRel);
        let sent = self.tx.send(output).await;
        if sent.is_err() {
            lane.handled();
        }
        sent
    }

    /// Send an event: a delta by the lane when it is open and nothing is ahead of it, else
    /// through the channel.
    pub async fn event(&self, body: EventBody) -> Result<(), mpsc::error::SendError<AgentOutput>> {
        let body = match &self.lane {
            Some(lane) => match lane.try_publish(body) {
                None => return Ok(()),
                Some(body) => body,
            },
            None => body,
        };
        self.send(AgentOutput::Event(body)).await
    }
}
