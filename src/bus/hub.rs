//! The hub task: owns every subscriber slot and fans committed batches out, in order.
//!
//! Invariants:
//! - batches are handled strictly in the order the ingest task sent them, and a batch's
//!   brackets are offered only after their commit reply arrived;
//! - `last_fanned` is the `sequence_id` of the last bracket fanned out; a delta carries it;
//! - the hub never awaits a subscriber: it uses `try_send`, and one queue slot is kept free for
//!   the `Lagged` marker, so a subscriber that falls behind is told so in band, after the last
//!   event it did get;
//! - a slot's `floor` is the highest bracket it has (or will read from SQLite): brackets at or
//!   below it are never sent to it again, which is what makes catch-up duplicate-free;
//! - `ring` holds the most recent fanned brackets (bounded by count and bytes), in order, and
//!   every bracket fanned after `evicted_upto` is in it. A subscriber catching up from a
//!   position at or after `evicted_upto` is served from the ring — the same shared events, with
//!   their frames already encoded — and is made live in the same step, which cannot leave a
//!   gap because the hub is the one sequencer. Older positions are read from SQLite first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::{BusError, Delivery, Prepared};
use crate::store::{SessionFilter, StoreResult};

pub(super) type SlotId = u64;

/// What flows through a subscriber's queue.
#[derive(Debug)]
pub(super) enum QueueItem {
    Event(Arc<Delivery>),
    /// The queue overflowed on a bracket: nothing more comes live until the subscriber has
    /// caught up (from the ring or SQLite) and asked to go live again.
    Lagged,
}

pub(super) enum HubCmd {
    Batch {
        batch: Vec<Prepared>,
        commit: Option<StoreResult<oneshot::Receiver<StoreResult<Vec<i64>>>>>,
    },
    Register {
        tx: mpsc::Sender<QueueItem>,
        filter: SessionFilter,
        forward_deltas: bool,
        reply: oneshot::Sender<Registered>,
    },
    /// The subscriber has everything matching up to `after` and wants what follows: from the
    /// ring (and then live), or word to read SQLite first.
    CatchUp {
        slot: SlotId,
        after: i64,
        reply: oneshot::Sender<CatchUp>,
    },
    IngestClosed,
}

/// The hub's answer to a catch-up request.
#[derive(Debug)]
pub(super) enum CatchUp {
    /// These are all the matching brackets after the position; the slot is live again, and
    /// everything later arrives through its queue.
    Live(Vec<Arc<Delivery>>),
    /// The first of the matching brackets after the position; ask again after the last one.
    More(Vec<Arc<Delivery>>),
    /// The position is older than the ring: read SQLite, then ask again.
    Store,
}

/// How many recent brackets the ring keeps, and how many bytes at most (payload plus its
/// encoded frame, which an entry keeps once a transport has built it).
const RING_EVENTS: usize = 16 * 1024;
const RING_BYTES: usize = 16 * 1024 * 1024;
/// The most brackets one catch-up answer carries.
const CATCH_UP_MAX: usize = 4096;

/// A new slot: its id and its dropped-delta counter, shared with the subscription.
pub(super) struct Registered {
    pub id: SlotId,
    pub dropped: Arc<AtomicU64>,
}

struct Slot {
    tx: mpsc::Sender<QueueItem>,
    filter: SessionFilter,
    forward_deltas: bool,
    live: bool,
    floor: i64,
    dropped: Arc<AtomicU64>,
}

enum Offer {
    Kept,
    Gone,
}

impl Slot {
    fn offer(&mut self, item: &Arc<Delivery>) -> Offer {
        if !self.live || !self.filter.matches(&item.session_id) {
            return Offer::Kept;
        }
        if item.is_delta {
            // A delta older than the floor precedes brackets this subscriber already has.
            if !self.forward_deltas || item.sequence_id < self.floor {
                return Offer::Kept;
            }
            if self.tx.capacity() <= 1 {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return Offer::Kept;
            }
        } else {
            if item.sequence_id <= self.floor {
                return Offer::Kept;
            }
            if self.tx.capacity() <= 1 {
                self.live = false;
                return match self.tx.try_send(QueueItem::Lagged) {
                    Err(mpsc::error::TrySendError::Closed(_)) => Offer::Gone,
                    _ => Offer::Kept,
                };
            }
            self.floor = item.sequence_id;
        }
        match self.tx.try_send(QueueItem::Event(item.clone())) {
            Ok(()) => Offer::Kept,
            Err(mpsc::error::TrySendError::Closed(_)) => Offer::Gone,
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Unreachable while the hub is the only sender, which it is; count it anyway.
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Offer::Kept
            }
        }
    }
}

struct Hub {
    slots: HashMap<SlotId, Slot>,
    next_id: SlotId,
    last_fanned: i64,
    ring: VecDeque<Arc<Delivery>>,
    ring_bytes: usize,
    /// Every bracket fanned with a larger `sequence_id` is in the ring.
    evicted_upto: i64,
}

pub(super) async fn run(mut rx: mpsc::Receiver<HubCmd>, last_seq: i64) {
    let mut hub = Hub {
        slots: HashMap::new(),
        next_id: 1,
        last_fanned: last_seq,
        ring: VecDeque::new(),
        ring_bytes: 0,
        // Brackets from before this start are only in SQLite.
        evicted_upto: last_seq,
    };
    while let Some(cmd) = rx.recv().await {
        match cmd {
            HubCmd::Batch { batch, commit } => hub.fan_out(batch, commit).await,
            HubCmd::Register {
                tx,
                filter,
                forward_deltas,
                reply,
            } => {
                hub.slots.retain(|_, s| !s.tx.is_closed());
                let id = hub.next_id;
                hub.next_id += 1;
                let dropped = Arc::new(AtomicU64::new(0));
                hub.slots.insert(
                    id,
                    Slot {
                        tx,
                        filter,
                        forward_deltas,
                        live: false,
                        floor: 0,
                        dropped: dropped.clone(),
                    },
                );
                let _subscriber_gone = reply.send(Registered { id, dropped });
            }
            HubCmd::CatchUp { slot, after, reply } => {
                let answer = hub.catch_up(slot, after);
                let _subscriber_gone = reply.send(answer);
            }
            HubCmd::IngestClosed => break,
        }
    }
    tracing::debug!(slots = hub.slots.len(), "bus hub stopped");
}

impl Hub {
    fn catch_up(&mut self, slot: SlotId, after: i64) -> CatchUp {
        if after < self.evicted_upto {
            return CatchUp::Store;
        }
        let Some(s) = self.slots.get_mut(&slot) else {
            return CatchUp::Live(Vec::new());
        };
        let start = self.ring.partition_point(|d| d.sequence_id <= after);
        let mut events = Vec::new();
        for d in self.ring.range(start..) {
            if !s.filter.matches(&d.session_id) {
                continue;
            }
            if events.len() == CATCH_UP_MAX {
                return CatchUp::More(events);
            }
            events.push(d.clone());
        }
        // Everything up to `last_fanned` is in `events` (or was read from SQLite up to
        // `after`); everything later will be queued.
        s.live = true;
        s.floor = after.max(self.last_fanned);
        CatchUp::Live(events)
    }

    /// What an entry may cost: its JSON, and about as much again for its frame.
    fn cost(item: &Delivery) -> usize {
        2 * item.json.len() + 256
    }

    fn remember(&mut self, item: &Arc<Delivery>) {
        self.ring_bytes += Self::cost(item);
        self.ring.push_back(item.clone());
        while self.ring.len() > RING_EVENTS || self.ring_bytes > RING_BYTES {
            let Some(old) = self.ring.pop_front() else {
                break;
            };
            self.ring_bytes -= Self::cost(&old);
            self.evicted_upto = old.sequence_id;
        }
    }

    async fn fan_out(
        &mut self,
        batch: Vec<Prepared>,
        commit: Option<StoreResult<oneshot::Receiver<StoreResult<Vec<i64>>>>>,
    ) {
        let seqs = match commit {
            None => Ok(Vec::new()),
            Some(Err(e)) => Err(e.to_string()),
            Some(Ok(rx)) => match rx.await {
                Ok(Ok(seqs)) => Ok(seqs),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("store stopped before replying".to_owned()),
            },
        };
        let mut seqs = match seqs {
            Ok(seqs) => seqs.into_iter(),
            Err(message) => {
                // Not durable, so not published: fail every bracket's receipt, drop the batch.
                for p in batch {
                    if let Some(ack) = p.ack {
                        let _publisher_gone =
                            ack.send(Err(BusError::CommitFailed(message.clone())));
                    }
                }
                return;
            }
        };
        let mut gone = Vec::new();
        for p in batch {
            let mut delivery = p.delivery;
            if delivery.is_delta {
                delivery.sequence_id = self.last_fanned;
            } else {
                let Some(seq) = seqs.next() else {
                    tracing::error!("store returned fewer ids than brackets; batch tail dropped");
                    if let Some(ack) = p.ack {
                        let _publisher_gone =
                            ack.send(Err(BusError::CommitFailed("missing sequence id".into())));
                    }
                    continue;
                };
                delivery.sequence_id = seq;
                self.last_fanned = seq;
            }
            let item = Arc::new(delivery);
            if !item.is_delta {
                self.remember(&item);
            }
            for (id, slot) in &mut self.slots {
                if let Offer::Gone = slot.offer(&item) {
                    gone.push(*id);
                }
            }
            if let Some(ack) = p.ack {
                let _publisher_gone = ack.send(Ok(item.sequence_id));
            }
        }
        for id in gone {
            self.slots.remove(&id);
        }
        // Subscriptions dropped while not live (or filtered away) are never offered anything:
        // drop their slots here so fan-out does not keep walking them.
        self.slots.retain(|_, s| !s.tx.is_closed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(kind: &'static str, is_delta: bool) -> Prepared {
        Prepared {
            delivery: Delivery {
                sequence_id: 0,
                message_id: format!("{kind}-{}", uuid::Uuid::new_v4()).into(),
                session_id: "s".into(),
                run_id: None,
                kind: kind.into(),
                is_delta,
                json: "{}".into(),
                frame: std::sync::OnceLock::new(),
                json_frame: std::sync::OnceLock::new(),
            },
            kind,
            created_at: 0,
            ack: None,
        }
    }

    /// A batch whose brackets were committed with the given ids.
    fn committed(batch: Vec<Prepared>, seqs: Vec<i64>) -> HubCmd {
        let (tx, rx) = oneshot::channel();
        tx.send(Ok(seqs)).unwrap();
        HubCmd::Batch {
            batch,
            commit: Some(Ok(rx)),
        }
    }

    async fn register(
        hub: &mpsc::Sender<HubCmd>,
        capacity: usize,
    ) -> (SlotId, mpsc::Receiver<QueueItem>) {
        let (tx, rx) = mpsc::channel(capacity);
        let (reply, registered) = oneshot::channel();
        hub.send(HubCmd::Register {
            tx,
            filter: SessionFilter::All,
            forward_deltas: true,
            reply,
        })
        .await
        .unwrap();
        (registered.await.unwrap().id, rx)
    }

    async fn catch_up(hub: &mpsc::Sender<HubCmd>, slot: SlotId, after: i64) -> CatchUp {
        let (reply, answer) = oneshot::channel();
        hub.send(HubCmd::CatchUp { slot, after, reply })
            .await
            .unwrap();
        answer.await.unwrap()
    }

    fn seqs(events: &[Arc<Delivery>]) -> Vec<i64> {
        events.iter().map(|d| d.sequence_id).collect()
    }

    fn drain(rx: &mut mpsc::Receiver<QueueItem>) -> Vec<(i64, bool)> {
        let mut out = Vec::new();
        while let Ok(item) = rx.try_recv() {
            match item {
                QueueItem::Event(d) => out.push((d.sequence_id, d.is_delta)),
                QueueItem::Lagged => out.push((-1, false)),
            }
        }
        out
    }

    /// The subscriber read SQLite further than the hub has fanned out (a commit landed but its
    /// batch had not reached the hub yet). Those brackets must not arrive twice, and deltas
    /// that precede them must not arrive after them.
    #[tokio::test]
    async fn rejoin_ahead_of_the_hub_skips_what_was_read() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 3));
        let (slot, mut queue) = register(&hub, 64).await;
        assert!(matches!(catch_up(&hub, slot, 5).await, CatchUp::Live(v) if v.is_empty()));
        let batch = vec![
            prepared("text.start", false),
            prepared("text.delta", true),
            prepared("text.end", false),
            prepared("text.delta", true),
            prepared("text.start", false),
            prepared("text.delta", true),
        ];
        hub.send(committed(batch, vec![4, 5, 6])).await.unwrap();
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        assert_eq!(drain(&mut queue), vec![(5, true), (6, false), (6, true)]);
    }

    #[tokio::test]
    async fn full_queue_drops_deltas_and_marks_lag_on_a_bracket() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let (slot, mut queue) = register(&hub, 4).await; // room for 3 + the marker
        catch_up(&hub, slot, 0).await;
        let batch = vec![
            prepared("text.start", false),
            prepared("text.delta", true),
            prepared("text.delta", true),
            prepared("text.delta", true), // dropped: only the marker's slot is left
            prepared("text.end", false),  // does not fit: lag marker
            prepared("text.start", false), // not sent: the slot left live delivery
        ];
        hub.send(committed(batch, vec![1, 2, 3])).await.unwrap();
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        assert_eq!(
            drain(&mut queue),
            vec![(1, false), (1, true), (1, true), (-1, false)]
        );
    }

    /// A lagging subscriber is served from the ring and made live in one step; a position
    /// older than the ring is sent to SQLite.
    #[tokio::test]
    async fn catch_up_comes_from_the_ring_until_it_is_too_old() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 100));
        let (slot, mut queue) = register(&hub, 64).await;
        assert!(
            matches!(catch_up(&hub, slot, 99).await, CatchUp::Store),
            "before the ring"
        );
        let batch = (0..5).map(|_| prepared("text.end", false)).collect();
        hub.send(committed(batch, vec![101, 102, 103, 104, 105]))
            .await
            .unwrap();
        match catch_up(&hub, slot, 102).await {
            CatchUp::Live(events) => assert_eq!(seqs(&events), vec![103, 104, 105]),
            other => panic!("{other:?}"),
        }
        // Live now: the next bracket is queued, nothing twice.
        hub.send(committed(vec![prepared("text.end", false)], vec![106]))
            .await
            .unwrap();
        // Push enough to evict the first entries from the ring.
        let many: Vec<i64> = (107..107 + RING_EVENTS as i64).collect();
        let batch = many.iter().map(|_| prepared("text.end", false)).collect();
        hub.send(committed(batch, many)).await.unwrap();
        let (slot2, _queue2) = register(&hub, 64).await;
        assert!(matches!(catch_up(&hub, slot2, 101).await, CatchUp::Store));
        match catch_up(&hub, slot2, 106 + RING_EVENTS as i64 - 10).await {
            CatchUp::Live(events) => assert_eq!(events.len(), 10),
            other => panic!("{other:?}"),
        }
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        assert_eq!(drain(&mut queue).first(), Some(&(106, false)));
    }
}
