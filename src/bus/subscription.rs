//! The consumer side of one subscriber: replay, live delivery, and catch-up, behind one
//! [`Subscription::recv`].
//!
//! States:
//! - **catching up** from `position` (everything matching up to it has been handed out): ask
//!   the hub for what follows. If `position` is recent enough, the hub answers from its ring of
//!   recent brackets and makes the slot live in the same step — no gap, since the hub is the
//!   one sequencer, and no duplicate, since it never queues a bracket at or below the slot's
//!   floor. If `position` is older than the ring, read one SQLite page after it and ask again.
//! - **live**: read the queue. A `Lagged` marker in it means the hub stopped sending after the
//!   previous item; go back to catching up from the last bracket received.
//!
//! [`Subscription::recv`] is cancel-safe, so a transport may `select!` on it: state changes
//! only between awaits, and the answers it waits for (a page from the store, the hub's answer
//! to a catch-up) are kept in `pending_page` / `pending_catch_up` and picked up by the next
//! call, so a caller that keeps cancelling still makes progress.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::cursors::CursorCmd;
use super::direct::Direct;
use super::hub::{CatchUp, HubCmd, QueueItem, Registered, SlotId};
use super::{BusError, Delivery, SubscribeOptions};
use crate::store::{Page, SessionFilter, Store, StoreError};

/// Rows read from SQLite per catch-up page.
const PAGE: u32 = 512;

enum Mode {
    CatchingUp {
        /// Everything matching up to here has been handed out (or was never there).
        position: i64,
        /// The hub said `position` is older than its ring: read SQLite next.
        from_store: bool,
    },
    Live,
}

/// A live subscriber. Drop it to unsubscribe.
pub struct Subscription {
    slot: SlotId,
    rx: mpsc::Receiver<QueueItem>,
    mode: Mode,
    buffer: VecDeque<Arc<Delivery>>,
    /// The `sequence_id` of the last bracket handed out by `recv`.
    last_bracket: i64,
    filter: SessionFilter,
    subscriber_id: Option<String>,
    dropped: Arc<AtomicU64>,
    catch_ups: u64,
    /// A page asked of the store for the current catch-up position, not read yet.
    pending_page: Option<oneshot::Receiver<Result<Page, StoreError>>>,
    /// A catch-up request the hub has been sent, whose answer has not been read yet.
    pending_catch_up: Option<oneshot::Receiver<CatchUp>>,
    /// The hub feeds this subscription's queue (it said so, and no lag since).
    joined: bool,
    hub: mpsc::Sender<HubCmd>,
    cursors: mpsc::Sender<CursorCmd>,
    store: Store,
    /// The connection's direct lane, lent to the hub (see [`Subscription::lend`]).
    direct: Option<Arc<Direct>>,
}

impl Subscription {
    pub(super) fn new(
        registered: Registered,
        rx: mpsc::Receiver<QueueItem>,
        start: i64,
        options: SubscribeOptions,
        hub: mpsc::Sender<HubCmd>,
        cursors: mpsc::Sender<CursorCmd>,
        store: Store,
    ) -> Subscription {
        Subscription {
            slot: registered.id,
            rx,
            mode: Mode::CatchingUp {
                position: start,
                from_store: false,
            },
            buffer: VecDeque::new(),
            last_bracket: start,
            filter: options.filter,
            subscriber_id: options.subscriber_id,
            dropped: registered.dropped,
            catch_ups: 0,
            pending_page: None,
            pending_catch_up: None,
            joined: false,
            hub,
            cursors,
            store,
            direct: None,
        }
    }

    /// Lend the connection's socket to the hub for the direct lane (`bus::direct`): while
    /// [`Subscription::arm_direct`] says this subscription is idle, the hub writes a lone
    /// delta to the socket itself. Call it before the first `recv` (see the hub's `Lend`).
    /// `false` if the bus has stopped.
    pub async fn lend(&mut self, direct: Arc<Direct>) -> bool {
        let lent = self
            .hub
            .send(HubCmd::Lend {
                slot: self.slot,
                direct: direct.clone(),
            })
            .await;
        self.direct = Some(direct);
        lent.is_ok()
    }

    /// The connection has written and flushed everything it took from [`Subscription::recv`]:
    /// if nothing else waits (live, nothing buffered or queued), the hub may write to its
    /// socket directly until the next event is queued or the connection writes.
    pub fn arm_direct(&self) {
        if let Some(direct) = &self.direct
            && matches!(self.mode, Mode::Live)
            && self.buffer.is_empty()
        {
            direct.arm(|| self.rx.is_empty());
        }
    }

    /// The next event, in order. `Ok(None)` once the bus or the store has shut down; an error
    /// (a failed store read) may be retried by calling again.
    pub async fn recv(&mut self) -> Result<Option<Arc<Delivery>>, BusError> {
        loop {
            if let Some(item) = self.buffer.pop_front() {
                self.last_bracket = self.last_bracket.max(item.sequence_id);
                return Ok(Some(item));
            }
            match self.mode {
                Mode::Live => match self.rx.recv().await {
                    Some(QueueItem::Event(item)) => {
                        if !item.is_delta {
                            self.last_bracket = item.sequence_id;
                        }
                        return Ok(Some(item));
                    }
                    Some(QueueItem::Lagged) => {
                        self.catch_ups += 1;
                        self.joined = false;
                        tracing::debug!(
                            slot = self.slot,
                            from = self.last_bracket,
                            "subscriber lagged; catching up from the store"
                        );
                        self.mode = Mode::CatchingUp {
                            position: self.last_bracket,
                            from_store: false,
                        };
                    }
                    None => return Ok(None),
                },
                Mode::CatchingUp {
                    position,
                    from_store,
                } => {
                    if let Some(answer) = self.pending_catch_up.as_mut() {
                        // Clear it before looking at the result: a completed receiver must
                        // never be polled again, even after an error.
                        let answered = answer.await;
                        self.pending_catch_up = None;
                        self.mode = match answered {
                            Err(_) => return Ok(None),
                            Ok(CatchUp::Live(events)) => {
                                self.buffer.extend(events);
                                self.joined = true;
                                Mode::Live
                            }
                            Ok(CatchUp::More(events)) => {
                                let next = events.last().map_or(position, |d| d.sequence_id);
                                self.buffer.extend(events);
                                Mode::CatchingUp {
                                    position: next,
                                    from_store: false,
                                }
                            }
                            Ok(CatchUp::Store) => Mode::CatchingUp {
                                position,
                                from_store: true,
                            },
                        };
                        continue;
                    }
                    if !from_store {
                        let (reply, answer) = oneshot::channel();
                        let asked = self
                            .hub
                            .send(HubCmd::CatchUp {
                                slot: self.slot,
                                after: position,
                                reply,
                            })
                            .await;
                        if asked.is_err() {
                            return Ok(None);
                        }
                        self.pending_catch_up = Some(answer);
                        continue;
                    }
                    if self.pending_page.is_none() {
                        match self
                            .store
                            .page_after_start(self.filter.clone(), position, None, PAGE)
                            .await
                        {
                            Ok(answer) => self.pending_page = Some(answer),
                            Err(StoreError::Closed) => return Ok(None),
                            Err(e) => return Err(e.into()),
                        }
                    }
                    let Some(answer) = self.pending_page.as_mut() else {
                        continue;
                    };
                    let answered = answer.await;
                    self.pending_page = None;
                    let page = match answered {
                        Ok(Ok(page)) => page,
                        Ok(Err(StoreError::Closed)) | Err(_) => return Ok(None),
                        Ok(Err(e)) => return Err(e.into()),
                    };
                    let mut next = page.events.last().map_or(position, |e| e.sequence_id);
                    if page.events.len() < PAGE as usize {
                        // Nothing else matches up to the snapshot.
                        next = next.max(page.snapshot_max);
                    }
                    self.buffer.extend(
                        page.events
                            .into_iter()
                            .map(|e| Arc::new(Delivery::from_stored(e))),
                    );
                    // Ask the hub again: the ring may cover the rest now.
                    self.mode = Mode::CatchingUp {
                        position: next,
                        from_store: false,
                    };
                }
            }
        }
    }

    /// The next event if one is ready right now, without waiting (for batching writes). `None`
    /// when nothing is ready or the subscription has to catch up first; `recv` handles that.
    pub fn try_next(&mut self) -> Option<Arc<Delivery>> {
        if let Some(item) = self.buffer.pop_front() {
            self.last_bracket = self.last_bracket.max(item.sequence_id);
            return Some(item);
        }
        if !matches!(self.mode, Mode::Live) {
            return None;
        }
        match self.rx.try_recv() {
            Ok(QueueItem::Event(item)) => {
                if !item.is_delta {
                    self.last_bracket = item.sequence_id;
                }
                Some(item)
            }
            Ok(QueueItem::Lagged) => {
                self.catch_ups += 1;
                self.joined = false;
                self.mode = Mode::CatchingUp {
                    position: self.last_bracket,
                    from_store: false,
                };
                None
            }
            Err(_) => None,
        }
    }

    /// Record that everything up to `sequence_id` was handled; durable subscribers have their
    /// cursor saved in the next batched write (not one write per event). A cursor past what
    /// this subscription has received is clamped to it: an ack can never skip events.
    pub async fn ack(&self, sequence_id: i64) -> Result<(), BusError> {
        let Some(id) = &self.subscriber_id else {
            return Ok(());
        };
        let sequence_id = sequence_id.clamp(0, self.last_bracket);
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        self.cursors
            .send(CursorCmd::Ack {
                subscriber_id: id.clone(),
                sequence_id,
                deltas_dropped: i64::try_from(dropped).unwrap_or(i64::MAX),
            })
            .await
            .map_err(|_| BusError::Closed)
    }

    /// Deltas dropped for this subscriber because its queue was full (since the last ack).
    pub fn deltas_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// How often this subscriber fell behind and caught up from SQLite.
    pub fn catch_ups(&self) -> u64 {
        self.catch_ups
    }

    /// The `sequence_id` of the last bracket received.
    pub fn position(&self) -> i64 {
        self.last_bracket
    }

    /// Whether the hub feeds this subscription live: events published from now on reach its
    /// queue (possibly after a short gap still being read from SQLite).
    pub fn is_live(&self) -> bool {
        self.joined
    }
}
