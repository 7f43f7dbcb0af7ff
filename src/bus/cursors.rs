//! The cursor book: owns the not-yet-saved cursors of durable subscribers and writes them in
//! one transaction at most every [`FLUSH_EVERY`] (and at shutdown), so acks never cost a
//! write per event. A cursor only moves forward, here and in SQL.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::store::{CursorUpdate, Store};

/// The longest an acked cursor waits before it is saved.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

pub(super) enum CursorCmd {
    Ack {
        subscriber_id: String,
        sequence_id: i64,
        deltas_dropped: i64,
    },
    /// Flush and stop; answers when the write is done.
    Stop(oneshot::Sender<()>),
}

pub(super) async fn run(mut rx: mpsc::Receiver<CursorCmd>, store: Store) {
    let mut pending: HashMap<String, CursorUpdate> = HashMap::new();
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(CursorCmd::Ack { subscriber_id, sequence_id, deltas_dropped }) => {
                    let entry = pending.entry(subscriber_id.clone()).or_insert(CursorUpdate {
                        subscriber_id,
                        sequence_id,
                        deltas_dropped: 0,
                    });
                    entry.sequence_id = entry.sequence_id.max(sequence_id);
                    entry.deltas_dropped += deltas_dropped;
                }
                Some(CursorCmd::Stop(done)) => {
                    flush(&store, &mut pending).await;
                    let _caller_gone = done.send(());
                    return;
                }
                None => {
                    flush(&store, &mut pending).await;
                    return;
                }
            },
            _ = tick.tick() => flush(&store, &mut pending).await,
        }
    }
}

async fn flush(store: &Store, pending: &mut HashMap<String, CursorUpdate>) {
    if pending.is_empty() {
        return;
    }
    let updates: Vec<CursorUpdate> = pending.drain().map(|(_, u)| u).collect();
    let count = updates.len();
    if let Err(e) = store.save_cursors(updates).await {
        // Losing a cursor update only means a replay from an older cursor, never a gap.
        tracing::warn!(error = %e, count, "saving subscriber cursors failed");
    }
}
