//! The event bus (design §6): persist, then publish.
//!
//! ```text
//!  publish() ──► ingest task ──append──► store writer (group commit)
//!                    │                        │ seqs
//!                    └──batch + commit rx──► hub task ──try_send──► subscriber queues (1024)
//! ```
//! - **One ordered pipeline.** Every event enters one FIFO (the ingest queue) and leaves the hub
//!   in that order, so a session's events reach every subscriber in emission order, and
//!   brackets of all sessions in `sequence_id` order. One global order (rather than one
//!   pipeline per session merged later) is what lets a single integer cursor mean "everything up
//!   to here" for a subscriber of many sessions. Each session is still serial: its actor is its
//!   only publisher.
//! - **Persist then publish.** The ingest task hands the brackets of each batch to the store
//!   without waiting for the commit, so batches pipeline; the hub awaits each batch's commit in
//!   order and only then fans it out. A delta is never stored: it carries the `sequence_id` of
//!   the latest bracket fanned out before it.
//! - **Overload policy.** `publish` awaits queue room (back-pressure on the agent); brackets are
//!   never dropped. A subscriber queue holds 1024 events: when full, deltas for it are dropped
//!   and counted; a bracket that does not fit sends the subscriber to catch up from SQLite (see
//!   [`subscription`]) and it rejoins live with no gap and no duplicate. The hub yields to the
//!   runtime every 64 events of a batch, so a subscriber that reads as it is fed keeps up with
//!   a burst larger than its queue, and the hub (hence the publisher, through the ingest queue)
//!   goes at the pace of the readers that keep up; it never waits for one that does not.
//! - **A delta skips the ingest task when nothing is ahead of it.** Ingest exists to batch
//!   brackets into commits; a delta is never stored. When no event is between `publish` and
//!   the hub (a counter of events handed to ingest and not yet passed on) and the hub's queue
//!   is empty, a delta goes straight onto the hub's queue, one task hop fewer on the way to
//!   every follower. Any event already in ingest (of any session) sends it the long way, so a
//!   session's delta never overtakes its own earlier events; so does a busy hub, so a burst of
//!   deltas is still batched.
//! - **A lone delta may skip the follower's task too** ([`direct`]). A loopback connection
//!   lends the hub its socket; while the connection's task has nothing queued, buffered or
//!   unflushed, the hub writes a delta that came alone (a batch of one, after 1 ms or more
//!   without a fan-out) to it as one whole WebSocket frame itself, for up to 16 followers per
//!   delta. Anything the hub queues for
//!   the slot, and any write of the connection, closes the lane first, so it never overtakes.
//! - **Built once.** The canonical JSON of an event is serialized once in `publish`, stored as
//!   is, and shared by every subscriber as one `Arc<Delivery>`.
//! - **Late joiners see the block so far.** The hub keeps, in memory only, the content so far
//!   of every open text, thinking, tool-input and tool-output block (see [`blocks`]), and per
//!   subscriber how much of each it has been queued. A subscriber with `forward_deltas` that
//!   goes live while a block is open — a new subscription, a reconnect from a cursor, one
//!   rejoining after it lagged — is sent, after the brackets it lacks and before any live
//!   delta, ONE delta per open block (same kind, same `itemId`/`callId`, the latest bracket's
//!   `sequence_id`) carrying the block from where it stands to now: from the start for a new
//!   subscription, only what it missed for one that lagged. The snapshot is taken by the hub
//!   task in the same step that makes the subscriber live, and the hub is the only task that
//!   fans out, so no delta falls between the snapshot and the live stream and none is sent
//!   twice: the concatenation of what a subscription gets of a block is its end bracket's
//!   text. A delta dropped for a full queue is carried likewise by the block's next delta
//!   that fits. Bounds: [`MAX_BLOCK_BYTES`] per block (past it, a subscriber that is behind on
//!   the block gets none of it any more and relies on the end bracket; one that has it all
//!   keeps getting its deltas), 64 MiB in all (the oldest blocks lose their content first) and
//!   1024 open blocks; a block is forgotten at its end bracket, its session's `run.end`, its
//!   session going `idle`, or its session's deletion ([`Bus::forget_session`]). The hub checks
//!   a subscriber's queue has room before it builds a coalesced delta for it.

mod blocks;
mod cursors;
pub mod direct;
mod hub;
pub mod subscription;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::protocol::events::Event;
use crate::protocol::wire::{self, CmdId, pb};
use crate::store::{SessionFilter, Store, StoreError, StoredEvent, now_ms};

pub use blocks::MAX_BLOCK_BYTES;
pub use direct::{Direct, DirectStream};
pub use subscription::Subscription;

/// The largest event the bus takes (its canonical JSON). Adapters cut larger tool output and
/// say so in the event; a client can then always receive any single event.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// The bound of each subscriber's live queue (design §6).
pub const SUBSCRIBER_QUEUE: usize = 1024;
/// The bound of the ingest queue: publishers wait when this many events are in flight.
const INGEST_QUEUE: usize = 8192;
/// The most events the ingest task takes into one batch.
const MAX_BATCH: usize = 4096;
/// The most payload bytes in one batch (a batch closes after the event that crosses it).
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Batches between ingest and hub whose commit is pending. With the bounds above, at most
/// about 64 MiB of events wait for commit or fan-out before publishers feel back-pressure.
const IN_FLIGHT_BATCHES: usize = 16;

/// Bus failures.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("the bus has shut down")]
    Closed,
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("event could not be encoded: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("the commit of this event failed: {0}")]
    CommitFailed(String),
    #[error("the event is {0} bytes; the limit is {MAX_EVENT_BYTES}")]
    TooLarge(usize),
}

/// One event as subscribers receive it, shared by all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// For a bracket its own `sequence_id`; for a delta the latest bracket's before it.
    pub sequence_id: i64,
    pub message_id: Arc<str>,
    pub session_id: Arc<str>,
    pub run_id: Option<Arc<str>>,
    pub kind: Arc<str>,
    pub is_delta: bool,
    /// The canonical event JSON, exactly as stored.
    pub json: Arc<str>,
    /// The encoded `EventPush` frame, built by the first transport that needs it and then
    /// shared by every other one.
    pub frame: OnceLock<Bytes>,
    /// The same frame in the JSON codec, built likewise.
    pub json_frame: OnceLock<String>,
}

impl Delivery {
    /// The `EventPush` wire frame of this event, encoded once.
    pub fn push_frame(&self) -> Bytes {
        self.frame
            .get_or_init(|| wire::event_push_frame(&self.push()))
            .clone()
    }

    /// The `EventPush` of this event in a connection's codec, encoded once per codec.
    pub fn push_message(&self, codec: wire::Codec) -> wire::WireMessage {
        match codec {
            wire::Codec::Protobuf => wire::WireMessage::Binary(self.push_frame()),
            wire::Codec::Json => wire::WireMessage::Text(
                self.json_frame
                    .get_or_init(|| {
                        match wire::encode_as(wire::Codec::Json, CmdId::EventPush, 0, &self.push())
                        {
                            wire::WireMessage::Text(text) => text,
                            wire::WireMessage::Binary(_) => String::new(),
                        }
                    })
                    .clone(),
            ),
        }
    }

    fn push(&self) -> pb::EventPush {
        pb::EventPush {
            sequence_id: self.sequence_id,
            message_id: self.message_id.to_string(),
            session_id: self.session_id.to_string(),
            run_id: self.run_id.as_deref().unwrap_or_default().to_owned(),
            is_delta: self.is_delta,
            event_json: self.json.to_string(),
        }
    }

    /// The wire form of a stored bracket (history pages carry these).
    pub fn stored_push(e: &StoredEvent) -> pb::EventPush {
        pb::EventPush {
            sequence_id: e.sequence_id,
            message_id: e.message_id.clone(),
            session_id: e.session_id.clone(),
            run_id: e.run_id.clone().unwrap_or_default(),
            is_delta: false,
            event_json: e.payload.clone(),
        }
    }

    fn from_stored(e: StoredEvent) -> Delivery {
        Delivery {
            sequence_id: e.sequence_id,
            message_id: e.message_id.into(),
            session_id: e.session_id.into(),
            run_id: e.run_id.map(Into::into),
            kind: e.kind.into(),
            is_delta: false,
            json: e.payload.into(),
            frame: OnceLock::new(),
            json_frame: OnceLock::new(),
        }
    }
}

/// Where a new subscription starts (design §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Only events published from now on.
    None,
    /// Every bracket after this cursor, then live.
    SinceCursor(i64),
    /// The newest N brackets, then live.
    MaxCount(u32),
}

/// The default N of `max_count`.
pub const DEFAULT_MAX_COUNT: u32 = 200;

/// What a subscriber wants.
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    pub filter: SessionFilter,
    pub forward_deltas: bool,
    pub replay: Replay,
    /// The `subscribers` row whose cursor [`Subscription::ack`] advances, if durable.
    pub subscriber_id: Option<String>,
}

/// An event ready for the pipeline: encoded once, with its routing fields.
struct Prepared {
    delivery: Delivery,
    kind: &'static str,
    created_at: i64,
    ack: Option<oneshot::Sender<Result<i64, BusError>>>,
    /// What the event does to its session's open blocks (late joiners, [`blocks`]).
    block: Option<blocks::BlockOp>,
}

/// Resolves when a published event has been handled: for a bracket, once it is committed
/// (and offered to subscribers) with its `sequence_id`.
pub enum Receipt {
    Delta,
    Bracket(oneshot::Receiver<Result<i64, BusError>>),
}

impl Receipt {
    /// `Some(sequence_id)` for a committed bracket, `None` for a delta.
    pub async fn committed(self) -> Result<Option<i64>, BusError> {
        match self {
            Receipt::Delta => Ok(None),
            Receipt::Bracket(rx) => rx.await.map_err(|_| BusError::Closed)?.map(Some),
        }
    }
}

/// A cloneable handle to the bus.
#[derive(Clone)]
pub struct Bus {
    ingest: mpsc::Sender<Prepared>,
    /// Events handed to the ingest task and not yet on the hub's queue.
    in_ingest: Arc<AtomicUsize>,
    hub: mpsc::Sender<hub::HubCmd>,
    cursors: mpsc::Sender<cursors::CursorCmd>,
    store: Store,
}

/// The bus's tasks; [`BusTasks::shutdown`] drains them in order.
pub struct BusTasks {
    close_ingest: oneshot::Sender<()>,
    ingest: JoinHandle<()>,
    hub: JoinHandle<()>,
    cursors: JoinHandle<()>,
    cursors_tx: mpsc::Sender<cursors::CursorCmd>,
}

impl BusTasks {
    /// Stop taking events, commit and fan out everything already queued, flush cursors.
    pub async fn shutdown(self) {
        let _already_closed = self.close_ingest.send(());
        if let Err(e) = self.ingest.await {
            tracing::error!(error = %e, "bus ingest task failed");
        }
        if let Err(e) = self.hub.await {
            tracing::error!(error = %e, "bus hub task failed");
        }
        let (done, wait) = oneshot::channel();
        if self
            .cursors_tx
            .send(cursors::CursorCmd::Stop(done))
            .await
            .is_ok()
        {
            let _stopped = wait.await;
        }
        if let Err(e) = self.cursors.await {
            tracing::error!(error = %e, "bus cursor task failed");
        }
    }
}

impl Bus {
    /// Start the bus on an open store.
    pub async fn start(store: Store) -> Result<(Bus, BusTasks), BusError> {
        let last_seq = store.max_sequence_id().await?;
        let (ingest_tx, ingest_rx) = mpsc::channel(INGEST_QUEUE);
        let (hub_tx, hub_rx) = mpsc::channel(IN_FLIGHT_BATCHES);
        let (close_tx, close_rx) = oneshot::channel();
        let (cursors_tx, cursors_rx) = mpsc::channel(1024);
        let in_ingest = Arc::new(AtomicUsize::new(0));
        let ingest = tokio::spawn(ingest_loop(
            ingest_rx,
            close_rx,
            store.clone(),
            hub_tx.clone(),
            in_ingest.clone(),
        ));
        let hub = tokio::spawn(hub::run(hub_rx, last_seq));
        let cursors = tokio::spawn(cursors::run(cursors_rx, store.clone()));
        Ok((
            Bus {
                ingest: ingest_tx,
                in_ingest,
                hub: hub_tx,
                cursors: cursors_tx.clone(),
                store,
            },
            BusTasks {
                close_ingest: close_tx,
                ingest,
                hub,
                cursors,
                cursors_tx,
            },
        ))
    }

    /// Publish one event. Awaits queue room only; await the [`Receipt`] for the commit.
    pub async fn publish(&self, event: &Event) -> Result<Receipt, BusError> {
        let json = serde_json::to_string(event)?;
        if json.len() > MAX_EVENT_BYTES {
            return Err(BusError::TooLarge(json.len()));
        }
        let json: Arc<str> = json.into();
        let is_delta = !event.is_bracket();
        let (ack, receipt) = if is_delta {
            (None, Receipt::Delta)
        } else {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Receipt::Bracket(rx))
        };
        let prepared = Prepared {
            delivery: Delivery {
                sequence_id: 0,
                message_id: message_id().to_string().into(),
                session_id: event.session_id.as_str().into(),
                run_id: event.run_id.as_deref().map(Into::into),
                kind: event.kind().into(),
                is_delta,
                json,
                frame: OnceLock::new(),
                json_frame: OnceLock::new(),
            },
            kind: event.kind(),
            created_at: now_ms(),
            ack,
            block: blocks::BlockOp::of(&event.body),
        };
        if is_delta && self.idle() {
            // Nothing is ahead of it: straight to the hub (module doc).
            self.hub
                .send(hub::HubCmd::Batch {
                    batch: vec![prepared],
                    commit: None,
                })
                .await
                .map_err(|_| BusError::Closed)?;
        } else {
            self.to_ingest(prepared).await?;
        }
        Ok(receipt)
    }

    /// Nothing in ingest and nothing on the hub's queue: a delta may skip ingest. (With the
    /// hub busy it would gain nothing and lose ingest's batching, which a burst of deltas
    /// needs.)
    fn idle(&self) -> bool {
        self.in_ingest.load(Ordering::Acquire) == 0
            && self.hub.capacity() == self.hub.max_capacity()
            && !self.ingest.is_closed()
    }

    /// Hand an event to the ingest task, counted until ingest passes it on to the hub.
    async fn to_ingest(&self, prepared: Prepared) -> Result<(), BusError> {
        self.in_ingest.fetch_add(1, Ordering::AcqRel);
        if self.ingest.send(prepared).await.is_err() {
            self.in_ingest.fetch_sub(1, Ordering::AcqRel);
            return Err(BusError::Closed);
        }
        Ok(())
    }

    /// Forget what the bus keeps of a deleted session's open blocks (and every subscriber's
    /// progress on them), after everything it published so far: a session stopped quietly
    /// never closes them. Sent down the ingest queue behind the session's last events so that
    /// none of them can reopen a block afterwards; nothing is delivered or stored.
    pub async fn forget_session(&self, session_id: &str) {
        let prepared = Prepared {
            delivery: Delivery {
                sequence_id: 0,
                message_id: "".into(),
                session_id: session_id.into(),
                run_id: None,
                kind: "".into(),
                is_delta: true,
                json: "".into(),
                frame: OnceLock::new(),
                json_frame: OnceLock::new(),
            },
            kind: "",
            created_at: 0,
            ack: None,
            block: Some(blocks::BlockOp::Forget),
        };
        // A closed bus keeps nothing to forget.
        let _bus_closed = self.to_ingest(prepared).await;
    }

    /// Attach a subscriber. It first replays per `options.replay` from SQLite, then follows
    /// live; [`Subscription::recv`] hides the switch.
    pub async fn subscribe(&self, options: SubscribeOptions) -> Result<Subscription, BusError> {
        let start = match options.replay {
            // A cursor from the future (a stale client, a reset store) would make the hub skip
            // everything up to it: start no later than what exists.
            Replay::SinceCursor(cursor) => cursor.clamp(0, self.store.max_sequence_id().await?),
            Replay::MaxCount(n) => {
                self.store
                    .cursor_before_last(options.filter.clone(), n)
                    .await?
            }
            Replay::None => self.store.max_sequence_id().await?,
        };
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE + 1);
        let (reply, registered) = oneshot::channel();
        self.hub
            .send(hub::HubCmd::Register {
                tx,
                filter: options.filter.clone(),
                forward_deltas: options.forward_deltas,
                reply,
            })
            .await
            .map_err(|_| BusError::Closed)?;
        let slot = registered.await.map_err(|_| BusError::Closed)?;
        Ok(Subscription::new(
            slot,
            rx,
            start,
            options,
            self.hub.clone(),
            self.cursors.clone(),
            self.store.clone(),
        ))
    }
}

/// Take events off the ingest queue in batches, hand each batch's brackets to the store, and
/// pass the batch on to the hub with the pending commit. Never waits for a commit itself.
async fn ingest_loop(
    mut rx: mpsc::Receiver<Prepared>,
    mut close: oneshot::Receiver<()>,
    store: Store,
    hub: mpsc::Sender<hub::HubCmd>,
    in_ingest: Arc<AtomicUsize>,
) {
    let mut closing = false;
    loop {
        let first = if closing {
            rx.recv().await
        } else {
            tokio::select! {
                biased;
                item = rx.recv() => item,
                _ = &mut close => {
                    // Refuse new events; what is queued still goes through.
                    closing = true;
                    rx.close();
                    continue;
                }
            }
        };
        let Some(first) = first else { break };
        let mut bytes = first.delivery.json.len();
        let mut batch = Vec::with_capacity(64);
        batch.push(first);
        while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(item) => {
                    bytes += item.delivery.json.len();
                    batch.push(item);
                }
                Err(_) => break,
            }
        }
        let brackets: Vec<_> = batch
            .iter()
            .filter(|p| !p.delivery.is_delta)
            .map(|p| crate::store::NewEvent {
                message_id: p.delivery.message_id.clone(),
                session_id: p.delivery.session_id.clone(),
                run_id: p.delivery.run_id.clone(),
                kind: p.kind,
                payload: p.delivery.json.clone(),
                created_at: p.created_at,
            })
            .collect();
        let commit = if brackets.is_empty() {
            None
        } else {
            Some(store.append(brackets).await)
        };
        let taken = batch.len();
        if hub
            .send(hub::HubCmd::Batch { batch, commit })
            .await
            .is_err()
        {
            tracing::error!("bus hub stopped before ingest; events dropped");
            break;
        }
        // Only now, with the batch on the hub's queue, may a delta go past ingest.
        in_ingest.fetch_sub(taken, Ordering::AcqRel);
    }
    // The hub finishes what it has and stops once it sees this.
    let _hub_gone = hub.send(hub::HubCmd::IngestClosed).await;
}

/// A fresh message id: a version-4 UUID from the thread's generator (seeded from the OS), so
/// that publishing an event costs no `getrandom` call of its own.
pub(crate) fn message_id() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid()
}
