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
//! - `blocks` holds the content so far of every open block (text, thinking, tool input, tool
//!   output), updated as each event is fanned out; each slot's `progress` says how many bytes
//!   of each open block it has been queued. A delta is queued to a slot as is when the slot
//!   has everything before it; a slot that is behind on the block (it just went live, it
//!   lagged, deltas were dropped for it) is queued instead ONE delta carrying the block from
//!   its progress to now. When a slot goes live the catch-up answer ends with such a delta per
//!   open block it follows — computed in the same step that makes it live, by the task that
//!   alone fans out, so no delta can fall between the snapshot and the live stream, and none
//!   is sent twice.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::blocks::{Appended, Applied, BlockOp, BlockUid, Blocks, Progress};
use super::direct::{Direct, Sent};
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
    /// The subscription's connection lends its socket for the direct lane (`direct`).
    Lend {
        slot: SlotId,
        direct: Arc<Direct>,
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
/// The hub yields to the runtime after fanning out this many events of a batch, so that the
/// tasks draining the subscriber queues (a connection's writer) run in between. A batch holds
/// up to 4096 events, four times a queue: fanned out in one poll, a burst of deltas filled the
/// queue of a subscriber that reads at once and dropped the rest (on a 2-worker runtime the
/// reader often shares the hub's worker and cannot run at all meanwhile). Slices well under the
/// queue's bound let every ready reader keep up, and pace the hub — and through the ingest
/// queue the publisher — to the readers; one that does not read still only loses its own
/// deltas, as the hub never waits for a queue.
const FAN_OUT_SLICE: usize = 64;
/// At most this many followers of one delta are written by the hub itself (the direct
/// lane); the others are queued, so one delta to many followers does not hold the hub for
/// a write to each.
const DIRECT_PER_EVENT: usize = 16;
/// The hub writes a lone delta itself only after this long without a fan-out (see
/// `fan_out`).
const LANE_AFTER_IDLE: Duration = Duration::from_millis(1);

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
    /// How much of each open block this slot has been queued (absent: nothing), sorted by
    /// block (uids only grow, so an entry is almost always appended).
    progress: Vec<(BlockUid, Progress)>,
    /// It went live at a `floor` the hub had not fanned out yet: it is sent the open blocks
    /// once the hub gets there.
    resync: bool,
    /// Its connection's socket, lent for the direct lane.
    direct: Option<Arc<Direct>>,
}

enum Offer {
    Kept,
    Gone,
}

impl Slot {
    /// Queue `item`; with a direct lane, disarmed in the same step, so the lane never
    /// overtakes what is queued.
    fn push(&self, item: QueueItem) -> Result<(), mpsc::error::TrySendError<QueueItem>> {
        match &self.direct {
            Some(direct) => direct.disarmed(|| self.tx.try_send(item)),
            None => self.tx.try_send(item),
        }
    }

    /// A delta: through the direct lane if `lane` allows one more write and the lane is
    /// armed, else queued.
    fn push_delta(
        &self,
        item: Arc<Delivery>,
        lane: &mut usize,
    ) -> Result<(), mpsc::error::TrySendError<QueueItem>> {
        if *lane > 0
            && let Some(direct) = &self.direct
        {
            let queue_empty = || self.tx.capacity() == self.tx.max_capacity();
            match direct.send(&item, queue_empty) {
                Sent::Done => {
                    *lane -= 1;
                    return Ok(());
                }
                Sent::Filtered => return Ok(()),
                Sent::Queue => {}
            }
        }
        self.push(QueueItem::Event(item))
    }

    fn progress(&self, uid: BlockUid) -> Progress {
        match self.progress.binary_search_by_key(&uid, |(u, _)| *u) {
            Ok(i) => self.progress[i].1,
            Err(_) => Progress::Sent(0),
        }
    }

    fn set_progress(&mut self, uid: BlockUid, progress: Progress) {
        match self.progress.last_mut() {
            Some(last) if last.0 == uid => last.1 = progress,
            Some(last) if last.0 > uid => {
                match self.progress.binary_search_by_key(&uid, |(u, _)| *u) {
                    Ok(i) => self.progress[i].1 = progress,
                    Err(i) => self.progress.insert(i, (uid, progress)),
                }
            }
            _ => self.progress.push((uid, progress)),
        }
    }

    fn forget(&mut self, uids: &[BlockUid]) {
        for uid in uids {
            if let Ok(i) = self.progress.binary_search_by_key(uid, |(u, _)| *u) {
                self.progress.remove(i);
            }
        }
    }

    /// The open blocks this slot follows that it is behind on: (uid, its progress, length).
    /// One walk over the open blocks and the progress together, both in block order.
    fn behind(&self, blocks: &Blocks) -> Vec<(BlockUid, usize, usize)> {
        if !self.forward_deltas {
            return Vec::new();
        }
        let mut progress = self.progress.iter().peekable();
        blocks
            .open()
            .filter_map(|(uid, session, len)| {
                while progress.next_if(|(u, _)| *u < uid).is_some() {}
                let sent = match progress.peek() {
                    Some((u, p)) if *u == uid => *p,
                    _ => Progress::Sent(0),
                };
                match sent {
                    Progress::Sent(n) if n < len && self.filter.matches(session) => {
                        Some((uid, n, len))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// What it is behind on of the open blocks, as one delta each (from its progress to now),
    /// its progress moved to their end. Blocks past their bound are muted instead.
    fn catch_up_blocks(&mut self, blocks: &mut Blocks, sequence_id: i64) -> Vec<Arc<Delivery>> {
        let mut out = Vec::new();
        for (uid, from, len) in self.behind(blocks) {
            match blocks.coalesced(uid, from, sequence_id) {
                Some(delta) => {
                    out.push(delta);
                    self.set_progress(uid, Progress::Sent(len));
                }
                None => self.set_progress(uid, Progress::Muted),
            }
        }
        out
    }

    /// Offer a delta of a tracked block: as is, or coalesced with what this slot missed of
    /// the block.
    fn offer_block_delta(
        &mut self,
        item: &Arc<Delivery>,
        appended: Appended,
        blocks: &mut Blocks,
        lane: &mut usize,
    ) -> Offer {
        if !self.live
            || !self.forward_deltas
            || !self.filter.matches(&item.session_id)
            || item.sequence_id < self.floor
        {
            return Offer::Kept;
        }
        let from = match self.progress(appended.uid) {
            Progress::Muted => return Offer::Kept,
            Progress::Sent(n) if n > appended.before => return Offer::Kept,
            Progress::Sent(n) => n,
        };
        // Room first: a subscriber whose queue is full costs the hub no coalescing.
        if self.tx.capacity() <= 1 {
            // Dropped: the next delta of the block that fits carries what it missed.
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Offer::Kept;
        }
        let send = if from == appended.before {
            item.clone()
        } else {
            match blocks.coalesced(appended.uid, from, item.sequence_id) {
                Some(delta) => delta,
                None => {
                    self.set_progress(appended.uid, Progress::Muted);
                    return Offer::Kept;
                }
            }
        };
        match self.push_delta(send, lane) {
            Ok(()) => {
                self.set_progress(appended.uid, Progress::Sent(appended.after));
                Offer::Kept
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Offer::Gone,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Offer::Kept
            }
        }
    }

    /// Queue what it is behind on of the open blocks, as room allows (what does not fit is
    /// carried by the block's next delta).
    fn resync(&mut self, blocks: &mut Blocks, sequence_id: i64) -> Offer {
        self.resync = false;
        for (uid, from, len) in self.behind(blocks) {
            // Room first, as in `offer_block_delta`.
            if self.tx.capacity() <= 1 {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Some(delta) = blocks.coalesced(uid, from, sequence_id) else {
                self.set_progress(uid, Progress::Muted);
                continue;
            };
            match self.push(QueueItem::Event(delta)) {
                Ok(()) => self.set_progress(uid, Progress::Sent(len)),
                Err(mpsc::error::TrySendError::Closed(_)) => return Offer::Gone,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Offer::Kept
    }

    fn offer(&mut self, item: &Arc<Delivery>, lane: &mut usize) -> Offer {
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
                return match self.push(QueueItem::Lagged) {
                    Err(mpsc::error::TrySendError::Closed(_)) => Offer::Gone,
                    _ => Offer::Kept,
                };
            }
            self.floor = item.sequence_id;
        }
        let pushed = if item.is_delta {
            self.push_delta(item.clone(), lane)
        } else {
            self.push(QueueItem::Event(item.clone()))
        };
        match pushed {
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
    /// The open blocks and their content so far.
    blocks: Blocks,
    /// When the last fan-out ended: the direct lane is for a delta that finds the hub idle.
    last_fan_out: Option<Instant>,
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
        blocks: Blocks::default(),
        last_fan_out: None,
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
                        progress: Vec::new(),
                        resync: false,
                        direct: None,
                    },
                );
                let _subscriber_gone = reply.send(Registered { id, dropped });
            }
            // Safe to lend at any time only because a subscription is not live before its
            // first `CatchUp`, which it sends after `Lend` on this same queue: nothing is
            // queued to the slot unlocked while its connection could arm the lane.
            HubCmd::Lend { slot, direct } => {
                if let Some(s) = hub.slots.get_mut(&slot) {
                    s.direct = Some(direct);
                }
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
        let Hub {
            slots,
            blocks,
            ring,
            last_fanned,
            ..
        } = self;
        let Some(s) = slots.get_mut(&slot) else {
            return CatchUp::Live(Vec::new());
        };
        let start = ring.partition_point(|d| d.sequence_id <= after);
        let mut events = Vec::new();
        for d in ring.range(start..) {
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
        s.floor = after.max(*last_fanned);
        // Then what it is behind on of the open blocks, as of the last event fanned out: every
        // later delta is offered to it live. Ahead of the hub (it read brackets from SQLite the
        // hub has not fanned out yet), the blocks as of now are not what it has: they are sent
        // once the hub gets to its floor.
        if s.floor == *last_fanned {
            s.resync = false;
            events.extend(s.catch_up_blocks(blocks, *last_fanned));
        } else {
            s.resync = s.forward_deltas;
        }
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
        // Only a delta that came alone to an idle hub takes the direct lane: a stream of
        // deltas (even one at a time) is left to the connections' tasks, which are awake then
        // and write many frames per `write`, on both workers.
        let alone = batch.len() == 1
            && self
                .last_fan_out
                .is_none_or(|at| at.elapsed() >= LANE_AFTER_IDLE);
        for (n, p) in batch.into_iter().enumerate() {
            if n > 0 && n % FAN_OUT_SLICE == 0 {
                // Let the tasks that drain the queues run (see `FAN_OUT_SLICE`).
                tokio::task::yield_now().await;
            }
            if let Some(BlockOp::Forget) = p.block {
                // A deleted session: its blocks and every slot's progress on them go; nothing
                // is delivered.
                let forgotten = self.blocks.apply(p.block, &p.delivery).forgotten;
                if !forgotten.is_empty() {
                    for slot in self.slots.values_mut() {
                        slot.forget(&forgotten);
                    }
                }
                continue;
            }
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
            let Applied {
                appended,
                forgotten,
            } = self.blocks.apply(p.block, &item);
            let mut lane = if alone && item.is_delta {
                DIRECT_PER_EVENT
            } else {
                0
            };
            for (id, slot) in &mut self.slots {
                let offer = match appended {
                    Some(appended) => {
                        slot.offer_block_delta(&item, appended, &mut self.blocks, &mut lane)
                    }
                    None => slot.offer(&item, &mut lane),
                };
                if let Offer::Gone = offer {
                    gone.push(*id);
                }
                if !forgotten.is_empty() {
                    slot.forget(&forgotten);
                }
            }
            if let Some(ack) = p.ack {
                let _publisher_gone = ack.send(Ok(item.sequence_id));
            }
        }
        // Slots that went live ahead of the hub and are now reached get the open blocks.
        for (id, slot) in &mut self.slots {
            if slot.resync
                && slot.live
                && slot.floor <= self.last_fanned
                && let Offer::Gone = slot.resync(&mut self.blocks, self.last_fanned)
            {
                gone.push(*id);
            }
        }
        for id in gone {
            self.slots.remove(&id);
        }
        // Subscriptions dropped while not live (or filtered away) are never offered anything:
        // drop their slots here so fan-out does not keep walking them.
        self.slots.retain(|_, s| !s.tx.is_closed());
        self.last_fan_out = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(kind: &'static str, is_delta: bool) -> Prepared {
        Prepared {
            delivery: Delivery {
                sequence_id: 0,
                message_id: format!("{kind}-{}", crate::bus::message_id()).into(),
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
            block: None,
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

    // ---- late joiners: the open blocks so far, then live ----

    use crate::protocol::events::{
        BlockEnd, BlockStart, Event, EventBody, RunEnd, RunState, SessionStateChange, TextDelta,
        ToolExecStart, ToolExecUpdate, Usage,
    };
    use crate::protocol::states::SessionState;

    /// A real event of session `s`, run `r`, as `publish` prepares it.
    fn event(body: EventBody) -> Prepared {
        let event = Event::new("s", Some("r".into()), body);
        let is_delta = !event.is_bracket();
        Prepared {
            delivery: Delivery {
                sequence_id: 0,
                message_id: crate::bus::message_id().to_string().into(),
                session_id: "s".into(),
                run_id: Some("r".into()),
                kind: event.kind().into(),
                is_delta,
                json: serde_json::to_string(&event).unwrap().into(),
                frame: std::sync::OnceLock::new(),
                json_frame: std::sync::OnceLock::new(),
            },
            kind: event.kind(),
            created_at: 0,
            ack: None,
            block: super::super::blocks::BlockOp::of(&event.body),
        }
    }

    fn start(item: &str) -> Prepared {
        event(EventBody::TextStart(BlockStart {
            item_id: Some(item.into()),
        }))
    }

    fn piece(item: &str, text: &str) -> Prepared {
        event(EventBody::TextDelta(TextDelta {
            item_id: Some(item.into()),
            text: text.into(),
        }))
    }

    fn end(item: &str, text: &str) -> Prepared {
        event(EventBody::TextEnd(BlockEnd {
            item_id: Some(item.into()),
            text: text.into(),
            truncated: None,
            imported: false,
        }))
    }

    fn other_bracket() -> Prepared {
        event(EventBody::Usage(Usage::default()))
    }

    /// One batch, committed with the next ids from `next`.
    fn batch(events: Vec<Prepared>, next: &mut i64) -> HubCmd {
        let brackets = events.iter().filter(|p| !p.delivery.is_delta).count() as i64;
        let seqs = (*next..*next + brackets).collect();
        *next += brackets;
        committed(events, seqs)
    }

    /// What a subscriber made of its stream: (kind, item, text) per event, text for deltas.
    fn shown(events: &[Arc<Delivery>]) -> Vec<(String, String, String)> {
        events
            .iter()
            .map(|d| {
                let v: serde_json::Value = serde_json::from_str(&d.json).unwrap();
                let text = if d.is_delta {
                    v["text"]
                        .as_str()
                        .or(v["output"].as_str())
                        .unwrap_or_default()
                        .to_owned()
                } else {
                    String::new()
                };
                (
                    d.kind.to_string(),
                    v["itemId"]
                        .as_str()
                        .or(v["callId"].as_str())
                        .unwrap_or_default()
                        .to_owned(),
                    text,
                )
            })
            .collect()
    }

    /// The concatenated deltas of `item`.
    fn streamed(events: &[Arc<Delivery>], item: &str) -> String {
        shown(events)
            .into_iter()
            .filter(|(k, _, _)| k.ends_with(".delta") || k == "tool.exec.update")
            .filter(|(_, i, _)| i == item)
            .map(|(_, _, t)| t)
            .collect()
    }

    fn events_of(rx: &mut mpsc::Receiver<QueueItem>) -> Vec<Arc<Delivery>> {
        let mut out = Vec::new();
        while let Ok(item) = rx.try_recv() {
            match item {
                QueueItem::Event(d) => out.push(d),
                QueueItem::Lagged => panic!("lagged"),
            }
        }
        out
    }

    /// Returns once the hub has handled everything sent before it.
    async fn barrier(hub: &mpsc::Sender<HubCmd>) {
        let (reply, answer) = oneshot::channel();
        hub.send(HubCmd::CatchUp {
            slot: SlotId::MAX,
            after: i64::MAX,
            reply,
        })
        .await
        .unwrap();
        answer.await.unwrap();
    }

    fn live(answer: CatchUp) -> Vec<Arc<Delivery>> {
        match answer {
            CatchUp::Live(events) => events,
            other => panic!("not live: {other:?}"),
        }
    }

    /// A subscriber going live mid-block is answered with the brackets it lacks and then ONE
    /// delta holding the block so far (the latest bracket's sequence id, the block's id);
    /// live deltas follow, and the whole equals the end's text. One live from the start got
    /// the pieces as they came.
    #[tokio::test]
    async fn a_late_joiner_gets_the_block_so_far_then_the_rest() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let mut next = 1;
        let (early, mut early_q) = register(&hub, 64).await;
        live(catch_up(&hub, early, 0).await);
        hub.send(batch(
            vec![start("i"), piece("i", "Hel"), piece("i", "lo, ")],
            &mut next,
        ))
        .await
        .unwrap();
        let (late, mut late_q) = register(&hub, 64).await;
        let answer = live(catch_up(&hub, late, 0).await);
        assert_eq!(
            shown(&answer),
            vec![
                ("text.start".into(), "i".into(), String::new()),
                ("text.delta".into(), "i".into(), "Hello, ".into()),
            ]
        );
        assert_eq!(seqs(&answer), vec![1, 1]);
        hub.send(batch(
            vec![piece("i", "world"), end("i", "Hello, world")],
            &mut next,
        ))
        .await
        .unwrap();
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        let mut late_all = answer;
        late_all.extend(events_of(&mut late_q));
        assert_eq!(streamed(&late_all, "i"), "Hello, world");
        assert_eq!(late_all.iter().filter(|d| d.is_delta).count(), 2);
        let early_all = events_of(&mut early_q);
        assert_eq!(early_all.iter().filter(|d| d.is_delta).count(), 3);
        assert_eq!(streamed(&early_all, "i"), "Hello, world");
        assert_eq!(late_all.last().map(|d| &*d.kind), Some("text.end"));
    }

    /// The race: deltas stream one batch at a time while subscribers keep joining at
    /// moments of their own. Whenever each joined, what it got of the block is exactly the
    /// block: nothing missing between the snapshot and the live stream, nothing twice. (The
    /// stream waits once, halfway, for the first half of the joiners, so that some surely join
    /// mid-block; the others race it freely, and the end waits for all of them.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn joiners_racing_the_stream_get_the_block_exactly_once() {
        const PIECES: usize = 300;
        const JOINERS: usize = 24;
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let (published_tx, published) = tokio::sync::watch::channel(0_usize);
        let (joined_tx, mut joined) = tokio::sync::watch::channel(0_usize);
        let publisher = {
            let hub = hub.clone();
            tokio::spawn(async move {
                let mut next = 1;
                hub.send(batch(vec![start("i")], &mut next)).await.unwrap();
                let mut whole = String::new();
                for n in 0..PIECES {
                    if n == PIECES / 2 {
                        joined.wait_for(|j| *j >= JOINERS / 2).await.unwrap();
                    }
                    let text = format!("{n},");
                    whole.push_str(&text);
                    hub.send(batch(vec![piece("i", &text)], &mut next))
                        .await
                        .unwrap();
                    published_tx.send_replace(n + 1);
                    if n % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                // Every joiner is in before the block ends: one that came after the end
                // would get the end bracket alone (rightly: it carries the whole text), not
                // a join into a streaming block, which is what is tested here.
                joined.wait_for(|j| *j >= JOINERS).await.unwrap();
                hub.send(batch(vec![end("i", &whole)], &mut next))
                    .await
                    .unwrap();
                whole
            })
        };
        let mut joiners = Vec::new();
        for j in 0..JOINERS {
            let hub = hub.clone();
            let mut published = published.clone();
            let joined_tx = joined_tx.clone();
            joiners.push(tokio::spawn(async move {
                let when = j * PIECES / JOINERS;
                published.wait_for(|n| *n >= when).await.unwrap();
                let (slot, mut queue) = register(&hub, 2 * PIECES).await;
                let mut got = live(catch_up(&hub, slot, 0).await);
                joined_tx.send_modify(|n| *n += 1);
                while !got.iter().any(|d| &*d.kind == "text.end") {
                    match queue.recv().await {
                        Some(QueueItem::Event(d)) => got.push(d),
                        other => panic!("{other:?}"),
                    }
                }
                got
            }));
        }
        let whole = publisher.await.unwrap();
        let mut joined_mid_block = 0;
        for joiner in joiners {
            let got = joiner.await.unwrap();
            assert_eq!(streamed(&got, "i"), whole);
            let kinds: Vec<&str> = got.iter().map(|d| &*d.kind).collect();
            assert_eq!(kinds.first(), Some(&"text.start"), "{kinds:?}");
            // One that came mid-block has a first delta of several pieces.
            if got.get(1).is_some_and(|d| d.is_delta)
                && shown(&got[1..2])[0].2.matches(',').count() > 1
            {
                joined_mid_block += 1;
            }
        }
        assert!(joined_mid_block >= JOINERS / 2 - 1, "{joined_mid_block}");
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
    }

    /// A subscriber whose queue filled: deltas dropped, then a bracket that does not fit (it
    /// lagged). It rejoins with what it missed of the open block as one delta — not the whole
    /// block again — and the stream goes on; without lagging, a dropped delta is carried by
    /// the next one that fits.
    #[tokio::test]
    async fn a_lagging_subscriber_gets_what_it_missed_once() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let mut next = 1;
        let (slot, mut queue) = register(&hub, 4).await; // room for 3 + the marker
        live(catch_up(&hub, slot, 0).await);
        let first = vec![
            start("i"),
            piece("i", "a"),
            piece("i", "b"),
            piece("i", "c"), // dropped
            piece("i", "d"), // dropped
            other_bracket(), // does not fit: lagged
            piece("i", "e"), // not live
        ];
        hub.send(batch(first, &mut next)).await.unwrap();
        barrier(&hub).await;
        let mut got = Vec::new();
        loop {
            match queue.try_recv() {
                Ok(QueueItem::Event(d)) => got.push(d),
                Ok(QueueItem::Lagged) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(streamed(&got, "i"), "ab");
        let answer = live(catch_up(&hub, slot, 1).await);
        assert_eq!(
            shown(&answer),
            vec![
                ("usage".into(), String::new(), String::new()),
                ("text.delta".into(), "i".into(), "cde".into()),
            ]
        );
        got.extend(answer);
        // Live again with a queue that fills: a dropped delta rides with the next one.
        hub.send(batch(
            vec![piece("i", "f"), piece("i", "g"), piece("i", "h")],
            &mut next,
        ))
        .await
        .unwrap();
        hub.send(batch(vec![piece("i", "i")], &mut next))
            .await
            .unwrap(); // dropped
        barrier(&hub).await;
        got.extend(events_of(&mut queue));
        hub.send(batch(
            vec![piece("i", "j"), end("i", "abcdefghij")],
            &mut next,
        ))
        .await
        .unwrap();
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        let tail = events_of(&mut queue);
        assert_eq!(shown(&tail)[0].2, "ij");
        got.extend(tail);
        assert_eq!(streamed(&got, "i"), "abcdefghij");
    }

    /// A subscriber that reads as it is fed loses nothing of a burst of deltas several times
    /// its queue, sent as one batch: the hub lets it run between slices of the batch. (On
    /// this single-threaded test runtime, a hub fanning the batch out in one poll would run
    /// the reader only after it, dropping all but the queue's worth.)
    #[tokio::test]
    async fn a_reading_subscriber_drops_nothing_of_a_burst() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let mut next = 1;
        let (slot, mut queue) = register(&hub, 2 * FAN_OUT_SLICE).await;
        live(catch_up(&hub, slot, 0).await);
        let burst = 32 * FAN_OUT_SLICE;
        let reader = tokio::spawn(async move {
            let (mut deltas, mut brackets) = (0, 0);
            while let Some(item) = queue.recv().await {
                match item {
                    QueueItem::Event(d) if d.is_delta => deltas += 1,
                    QueueItem::Event(_) => brackets += 1,
                    QueueItem::Lagged => panic!("lagged"),
                }
            }
            (deltas, brackets)
        });
        let mut events = vec![start("i")];
        events.extend((0..burst).map(|_| piece("i", "x")));
        events.push(other_bracket());
        hub.send(batch(events, &mut next)).await.unwrap();
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        // The hub is gone, so is the queue's sender: the reader ends.
        assert_eq!(reader.await.unwrap(), (burst, 2));
    }

    /// Past its bound a block is not sent to a joiner (it relies on the end bracket), nor its
    /// later deltas; one that had it all keeps getting them. Tool output is kept like text.
    #[tokio::test]
    async fn a_block_past_its_bound_is_left_to_its_end_bracket() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let mut next = 1;
        let (early, mut early_q) = register(&hub, 64).await;
        live(catch_up(&hub, early, 0).await);
        let big = "x".repeat(crate::bus::MAX_BLOCK_BYTES / 2 + 1);
        let exec = |output: &str| {
            event(EventBody::ToolExecUpdate(ToolExecUpdate {
                call_id: "c".into(),
                output: output.into(),
            }))
        };
        hub.send(batch(
            vec![
                event(EventBody::ToolExecStart(ToolExecStart {
                    call_id: "c".into(),
                    name: None,
                })),
                exec("small "),
            ],
            &mut next,
        ))
        .await
        .unwrap();
        let (under, _under_q) = register(&hub, 64).await;
        let answer = live(catch_up(&hub, under, 0).await);
        assert_eq!(streamed(&answer, "c"), "small ");
        assert_eq!(&*answer[1].kind, "tool.exec.update");
        hub.send(batch(vec![exec(&big), exec(&big)], &mut next))
            .await
            .unwrap();
        let (over, mut over_q) = register(&hub, 64).await;
        let answer = live(catch_up(&hub, over, 0).await);
        assert_eq!(
            shown(&answer),
            vec![("tool.exec.start".into(), "c".into(), String::new())]
        );
        hub.send(batch(
            vec![
                exec("tail"),
                event(EventBody::ToolExecEnd(
                    crate::protocol::events::ToolExecEnd {
                        call_id: "c".into(),
                        output: "…".into(),
                        ..Default::default()
                    },
                )),
            ],
            &mut next,
        ))
        .await
        .unwrap();
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        let over_got = events_of(&mut over_q);
        assert_eq!(
            over_got.iter().map(|d| &*d.kind).collect::<Vec<_>>(),
            vec!["tool.exec.end"]
        );
        let early_got = events_of(&mut early_q);
        assert_eq!(streamed(&early_got, "c"), format!("small {big}{big}tail"));
    }

    /// Nothing is kept once a block ends, once its run ends (a block left open), or once its
    /// session goes idle.
    #[tokio::test]
    async fn nothing_is_sent_for_a_block_after_its_end() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let mut next = 1;
        let joiner = async |hub: &mpsc::Sender<HubCmd>| {
            let (slot, queue) = register(hub, 64).await;
            let answer = live(catch_up(hub, slot, 0).await);
            drop(queue);
            answer.into_iter().filter(|d| d.is_delta).count()
        };
        hub.send(batch(
            vec![start("a"), piece("a", "x"), end("a", "x")],
            &mut next,
        ))
        .await
        .unwrap();
        assert_eq!(joiner(&hub).await, 0);
        hub.send(batch(vec![start("b"), piece("b", "y")], &mut next))
            .await
            .unwrap();
        assert_eq!(joiner(&hub).await, 1);
        hub.send(batch(
            vec![event(EventBody::RunEnd(RunEnd {
                state: RunState::Interrupted,
                category: None,
                message: None,
            }))],
            &mut next,
        ))
        .await
        .unwrap();
        assert_eq!(joiner(&hub).await, 0);
        hub.send(batch(vec![start("c"), piece("c", "z")], &mut next))
            .await
            .unwrap();
        assert_eq!(joiner(&hub).await, 1);
        hub.send(batch(
            vec![event(EventBody::SessionState(SessionStateChange {
                state: SessionState::Idle,
                previous: SessionState::Running,
            }))],
            &mut next,
        ))
        .await
        .unwrap();
        assert_eq!(joiner(&hub).await, 0);
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
    }

    /// A live slot, as the hub registers one, on a queue of `capacity`.
    fn slot(capacity: usize) -> (Slot, mpsc::Receiver<QueueItem>) {
        let (tx, rx) = mpsc::channel(capacity);
        let slot = Slot {
            tx,
            filter: SessionFilter::All,
            forward_deltas: true,
            live: true,
            floor: 0,
            dropped: Arc::new(AtomicU64::new(0)),
            progress: Vec::new(),
            resync: false,
            direct: None,
        };
        (slot, rx)
    }

    /// Apply one prepared event to the blocks, as fan-out does (sequence id 1).
    fn apply(blocks: &mut Blocks, p: Prepared) -> (Arc<Delivery>, Applied) {
        let mut delivery = p.delivery;
        delivery.sequence_id = 1;
        let item = Arc::new(delivery);
        let applied = blocks.apply(p.block, &item);
        (item, applied)
    }

    /// The direct lane never overtakes the queue: queuing a bracket disarms it, so the next
    /// lone delta is queued behind the bracket even once the connection has taken the bracket
    /// off its queue and not yet written it. Armed again (all written), the next one goes
    /// direct; the hub writes at most its budget of followers per delta.
    #[test]
    fn the_direct_lane_never_overtakes_the_queue() {
        let (socket, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let lane = Direct::over(&socket);
        lane.route(crate::protocol::wire::Codec::Protobuf, Box::new(|_| true));
        let (mut slot, mut rx) = slot(8);
        slot.direct = Some(lane.clone());
        let delta = Arc::new(prepared("text.delta", true).delivery);
        let bracket = Arc::new(prepared("text.end", false).delivery);

        lane.arm(|| rx.is_empty());
        let mut budget = 1;
        slot.push_delta(delta.clone(), &mut budget).unwrap();
        assert_eq!(budget, 0, "an armed lane takes a lone delta");
        assert!(rx.try_recv().is_err());
        let mut none = 0;
        lane.arm(|| rx.is_empty());
        slot.push_delta(delta.clone(), &mut none).unwrap();
        assert!(rx.try_recv().is_ok(), "past the budget it is queued");

        lane.arm(|| rx.is_empty());
        slot.push(QueueItem::Event(bracket)).unwrap();
        assert!(matches!(rx.try_recv(), Ok(QueueItem::Event(b)) if !b.is_delta));
        let mut budget = 1;
        slot.push_delta(delta.clone(), &mut budget).unwrap();
        assert_eq!(budget, 1, "the delta went ahead of the bracket");
        assert!(matches!(rx.try_recv(), Ok(QueueItem::Event(d)) if d.is_delta));

        lane.arm(|| rx.is_empty());
        slot.push_delta(delta.clone(), &mut budget).unwrap();
        assert_eq!(budget, 0);
        // Two whole frames came through the socket.
        use std::io::Read;
        peer.set_nonblocking(true).unwrap();
        let mut got = vec![0u8; 4096];
        let n = peer.read(&mut got).unwrap();
        let payload = delta.push_frame();
        let head = if payload.len() < 126 { 2 } else { 4 };
        let frame = head + payload.len();
        assert_eq!(n, 2 * frame);
        assert_eq!(got[0], 0x82);
        assert_eq!(got[head..frame], payload[..]);
        assert_eq!(got[frame + head..2 * frame], payload[..]);
    }

    /// A subscriber whose queue is full costs the hub nothing per delta: no coalesced delta
    /// is built for it (however far behind it is on a big block), the drops are counted, and
    /// once it has room ONE delta carries everything it missed. Resync likewise.
    #[test]
    fn a_full_subscriber_costs_no_coalescing() {
        let mut blocks = Blocks::default();
        let (mut full, mut full_q) = slot(2);
        let (mut reader, mut reader_q) = slot(4096);
        let (open, _) = apply(&mut blocks, start("i"));
        assert!(matches!(full.offer(&open, &mut 0), Offer::Kept));
        assert!(matches!(reader.offer(&open, &mut 0), Offer::Kept));
        // `full` has one slot left, the marker's: every delta from here is dropped for it.
        let piece_text = "p".repeat(1000);
        let mut whole = String::new();
        for _ in 0..1000 {
            whole.push_str(&piece_text);
            let (item, applied) = apply(&mut blocks, piece("i", &piece_text));
            let appended = applied.appended.unwrap();
            assert!(matches!(
                full.offer_block_delta(&item, appended, &mut blocks, &mut 0),
                Offer::Kept
            ));
            assert!(matches!(
                reader.offer_block_delta(&item, appended, &mut blocks, &mut 0),
                Offer::Kept
            ));
            // The reader keeps up: its deltas go as they are.
            while reader_q.try_recv().is_ok() {}
        }
        assert_eq!(
            blocks.builds(),
            0,
            "a coalesced delta was built for a full queue"
        );
        assert_eq!(full.dropped.load(Ordering::Relaxed), 1000);
        assert_eq!(reader.dropped.load(Ordering::Relaxed), 0);
        // A resync with no room builds nothing either.
        full.resync = true;
        assert!(matches!(full.resync(&mut blocks, 1), Offer::Kept));
        assert_eq!(blocks.builds(), 0);
        assert_eq!(full.dropped.load(Ordering::Relaxed), 1001);
        // Room again: the next delta carries all it missed, built once.
        let Ok(QueueItem::Event(first)) = full_q.try_recv() else {
            panic!("the start bracket");
        };
        assert_eq!(&*first.kind, "text.start");
        whole.push_str("end");
        let (item, applied) = apply(&mut blocks, piece("i", "end"));
        full.offer_block_delta(&item, applied.appended.unwrap(), &mut blocks, &mut 0);
        assert_eq!(blocks.builds(), 1);
        let Ok(QueueItem::Event(caught_up)) = full_q.try_recv() else {
            panic!("no catch-up delta");
        };
        assert_eq!(streamed(&[caught_up], "i"), whole);
    }

    /// Progress is kept sorted by block whatever the order it is set in, found by binary
    /// search, and `behind` walks it with the open blocks in one pass.
    #[test]
    fn progress_is_sorted_and_behind_is_one_walk() {
        let mut blocks = Blocks::default();
        let (mut s, _q) = slot(8);
        let mut uids = Vec::new();
        for i in 0..6 {
            let item = format!("b{i}");
            apply(&mut blocks, start(&item));
            let (_, applied) = apply(&mut blocks, piece(&item, "xy"));
            uids.push(applied.appended.unwrap().uid);
        }
        for &i in &[4, 1, 5, 0] {
            s.set_progress(uids[i], Progress::Sent(2));
        }
        s.set_progress(uids[1], Progress::Sent(1));
        s.set_progress(uids[3], Progress::Muted);
        let order: Vec<BlockUid> = s.progress.iter().map(|(u, _)| *u).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted);
        assert_eq!(s.progress(uids[1]), Progress::Sent(1));
        assert_eq!(s.progress(uids[2]), Progress::Sent(0));
        assert_eq!(s.behind(&blocks), vec![(uids[1], 1, 2), (uids[2], 0, 2)]);
        s.forget(&[uids[1], uids[4], 999]);
        assert_eq!(s.progress(uids[1]), Progress::Sent(0));
        assert_eq!(s.progress.len(), 3);
    }

    /// A deleted session's blocks and every slot's progress on them are forgotten, in order
    /// behind its last events; a joiner after gets nothing of it, another session's block
    /// stays.
    #[tokio::test]
    async fn a_deleted_sessions_blocks_are_forgotten() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let mut next = 1;
        let (early, mut early_q) = register(&hub, 64).await;
        live(catch_up(&hub, early, 0).await);
        let other = |mut p: Prepared| {
            p.delivery.session_id = "other".into();
            p
        };
        let forget = Prepared {
            block: Some(BlockOp::Forget),
            ..prepared("", true)
        };
        hub.send(batch(
            vec![
                start("i"),
                piece("i", "gone"),
                other(start("k")),
                other(piece("k", "kept")),
                forget,
            ],
            &mut next,
        ))
        .await
        .unwrap();
        barrier(&hub).await;
        let got = events_of(&mut early_q);
        assert_eq!(
            got.len(),
            4,
            "the forget is not delivered: {:?}",
            shown(&got)
        );
        let (late, _late_q) = register(&hub, 64).await;
        let answer = live(catch_up(&hub, late, 0).await);
        let deltas: Vec<_> = shown(&answer)
            .into_iter()
            .filter(|(k, _, _)| k == "text.delta")
            .collect();
        assert_eq!(
            deltas,
            vec![("text.delta".into(), "k".into(), "kept".into())]
        );
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
    }

    /// A subscriber that read SQLite past what the hub has fanned out goes live "ahead": the
    /// open blocks are sent once the hub reaches its floor — built from everything before it,
    /// though the deltas before the floor are not sent to it one by one.
    #[tokio::test]
    async fn a_joiner_ahead_of_the_hub_gets_the_block_when_the_hub_catches_up() {
        let (hub, rx) = mpsc::channel(16);
        let task = tokio::spawn(run(rx, 0));
        let mut next = 1;
        let (slot, mut queue) = register(&hub, 64).await;
        // It has read brackets 1 and 2 (text.start, usage) from SQLite already.
        assert!(live(catch_up(&hub, slot, 2).await).is_empty());
        hub.send(batch(
            vec![start("i"), piece("i", "x"), other_bracket()],
            &mut next,
        ))
        .await
        .unwrap();
        // The block, open with no delta after the floor, is sent at the end of that batch.
        hub.send(batch(
            vec![piece("i", "y"), start("j"), piece("j", "p")],
            &mut next,
        ))
        .await
        .unwrap();
        hub.send(batch(vec![piece("i", "z"), other_bracket()], &mut next))
            .await
            .unwrap();
        hub.send(HubCmd::IngestClosed).await.unwrap();
        task.await.unwrap();
        let got = events_of(&mut queue);
        assert_eq!(
            shown(&got),
            vec![
                ("text.delta".into(), "i".into(), "x".into()),
                ("text.delta".into(), "i".into(), "y".into()),
                ("text.start".into(), "j".into(), String::new()),
                ("text.delta".into(), "j".into(), "p".into()),
                ("text.delta".into(), "i".into(), "z".into()),
                ("usage".into(), String::new(), String::new()),
            ]
        );
    }
}
