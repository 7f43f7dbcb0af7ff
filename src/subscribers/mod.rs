//! Subscribers (design §6): durable rows in the store with their cursor and replay mode, the
//! grant tokens that open a connection for one (memory only), and the registry of live
//! connections. Shared by every wire transport: the loopback server checks tokens, and any
//! link (loopback or relay) opens its subscription here.
//!
//! - [`grants`] — tokens and the connection registry.
//! - [`Subscribers`] — what `subscriber.*` commands do, and [`Subscribers::open`], which starts
//!   a connection's subscription per its row.
//! - [`Subscribers::prune`] and [`prune_task`] — subscribers that never come back: one away
//!   longer than `subscriber_max_idle_days` (last seen = its last connection or
//!   `subscriber.grant`, and every sweep that finds it connected) is removed with its cursor,
//!   at start and hourly; one with a live connection never is.

pub mod grants;

use std::sync::Arc;

use crate::bus::{Bus, Replay, SubscribeOptions, Subscription};
use crate::protocol::envelope::{ReplayMode, SubscriberAddParams};
use crate::protocol::scope::Scope;
use crate::session::{SessionError, SessionManager};
use crate::store::{SessionFilter, Store, StoreError, SubscriberRow, now_ms};

pub use grants::{GrantStore, RENEWED_TOKEN_TTL, TOKEN_TTL};

/// The path the loopback server answers on.
pub const PATH: &str = "/subscribe";

#[derive(Debug, thiserror::Error)]
pub enum SubscriberError {
    #[error("no subscriber {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot mint a grant: {0}")]
    Grant(#[from] grants::GrantError),
    #[error("the host is shutting down")]
    ShuttingDown,
    #[error("internal: {0}")]
    Internal(String),
}

/// A subscription opened for a connection, and what its `HelloResp` says.
pub struct Opened {
    pub subscription: Subscription,
    pub subscriber_id: String,
    pub replay_from: i64,
    pub replay_mode: ReplayMode,
    pub forward_deltas: bool,
    /// The subscription's session filter, if any.
    pub session_id: Option<String>,
    /// What a connection of this subscriber may do (the relay's comes from its token instead).
    pub scope: Scope,
}

/// The answer to `subscriber.add` and `subscriber.grant`.
pub use crate::protocol::replies::Grant as GrantReply;

/// A subscriber row as `subscriber.list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SubscriberView {
    #[serde(flatten)]
    pub row: SubscriberRow,
    pub connected: bool,
    /// When it last connected or asked for a grant (ms since the epoch); `null`: not since it
    /// was added.
    pub last_seen_at_ms: Option<i64>,
}

/// How often subscribers that never come back are looked for.
pub const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Subscriber lifecycle: rows in the store, grants in memory.
#[derive(Clone)]
pub struct Subscribers {
    store: Store,
    bus: Bus,
    sessions: SessionManager,
    grants: Arc<GrantStore>,
    endpoint: String,
    /// The Unix socket of the same protocol, when the host has one.
    socket: Option<String>,
}

impl Subscribers {
    pub fn new(
        store: Store,
        bus: Bus,
        sessions: SessionManager,
        grants: Arc<GrantStore>,
        port: u16,
    ) -> Self {
        Subscribers {
            store,
            bus,
            sessions,
            grants,
            endpoint: format!("ws://127.0.0.1:{port}{PATH}"),
            socket: None,
        }
    }

    /// Grants also name the host's Unix socket for the same protocol (`ws_socket`).
    #[must_use]
    pub fn with_socket(mut self, socket: &std::path::Path) -> Self {
        self.socket = Some(socket.display().to_string());
        self
    }

    /// A session a scoped subscriber created joins its stored scope, so its next connection
    /// (a reconnect, another tab) still reaches it.
    pub async fn extend_scope(
        &self,
        subscriber_id: &str,
        session_id: &str,
    ) -> Result<(), SubscriberError> {
        let Some(row) = self.store.get_subscriber(subscriber_id.to_owned()).await? else {
            return Err(SubscriberError::NotFound(subscriber_id.to_owned()));
        };
        let mut scope = scope_of(&row);
        let Some(sessions) = scope.sessions.as_mut() else {
            return Ok(()); // every session already
        };
        if !sessions.iter().any(|s| s == session_id) {
            sessions.push(session_id.to_owned());
            let text = serde_json::to_string(&scope)
                .map_err(|e| SubscriberError::Internal(e.to_string()))?;
            self.store
                .set_subscriber_scope(subscriber_id.to_owned(), text)
                .await?;
        }
        Ok(())
    }

    /// The client label a subscriber was added with (`subscriber.add` `client`); `None` for
    /// none, or when its row cannot be read.
    pub async fn client_of(&self, subscriber_id: &str) -> Option<String> {
        match self.store.get_subscriber(subscriber_id.to_owned()).await {
            Ok(row) => row.and_then(|r| r.client),
            Err(e) => {
                tracing::warn!(error = %e, "a subscriber's client label could not be read");
                None
            }
        }
    }

    /// The token and connection registry.
    pub fn grants(&self) -> &Arc<GrantStore> {
        &self.grants
    }

    /// Make sure a subscriber row exists (the relay's, which no `subscriber.add` made).
    pub async fn ensure(&self, row: SubscriberRow) -> Result<(), SubscriberError> {
        if self
            .store
            .get_subscriber(row.subscriber_id.clone())
            .await?
            .is_none()
        {
            self.store.insert_subscriber(row).await?;
        }
        Ok(())
    }

    /// Open the subscription of a connection per its stored row; a client-held `cursor` wins.
    /// `none` starts at the end, `since_cursor` at the stored cursor, and `max_count` replays
    /// the newest N — or less, when the stored cursor says the subscriber has some of them.
    pub async fn open(
        &self,
        subscriber_id: &str,
        cursor: Option<i64>,
    ) -> Result<Opened, SubscriberError> {
        let row = self
            .store
            .get_subscriber(subscriber_id.to_owned())
            .await?
            .ok_or_else(|| SubscriberError::NotFound(subscriber_id.to_owned()))?;
        let filter = match &row.session_id {
            Some(id) => SessionFilter::One(id.as_str().into()),
            None => SessionFilter::All,
        };
        let mode = replay_mode_of(&row);
        let stored = row.most_recent_sequence_id;
        let replay = match (cursor, mode) {
            (Some(cursor), _) => Replay::SinceCursor(cursor.max(0)),
            (None, ReplayMode::None) => Replay::None,
            (None, ReplayMode::SinceCursor) => Replay::SinceCursor(stored),
            (None, ReplayMode::MaxCount) => {
                let n = u32::try_from(row.max_count).unwrap_or(crate::bus::DEFAULT_MAX_COUNT);
                let newest = self.store.cursor_before_last(filter.clone(), n).await?;
                Replay::SinceCursor(newest.max(stored))
            }
        };
        let scope = scope_of(&row);
        self.seen(&row.subscriber_id).await;
        let subscription = self
            .bus
            .subscribe(SubscribeOptions {
                filter,
                forward_deltas: row.forward_deltas,
                replay,
                subscriber_id: Some(row.subscriber_id.clone()),
            })
            .await
            .map_err(|_| SubscriberError::ShuttingDown)?;
        Ok(Opened {
            replay_from: subscription.position(),
            subscription,
            subscriber_id: row.subscriber_id,
            replay_mode: mode,
            forward_deltas: row.forward_deltas,
            session_id: row.session_id,
            scope,
        })
    }

    pub async fn add(&self, p: SubscriberAddParams) -> Result<GrantReply, SubscriberError> {
        if let Some(session_id) = &p.session_id {
            self.sessions.get(session_id).await?;
        }
        let now = now_ms();
        for id in p.sessions.iter().flatten() {
            self.sessions.get(id).await?;
        }
        let scope = p.scope();
        let row = SubscriberRow {
            subscriber_id: uuid::Uuid::now_v7().to_string(),
            kind: "local".to_owned(),
            session_id: p.session_id,
            forward_deltas: p.forward_deltas,
            replay_mode: p.replay_mode.as_str().to_owned(),
            max_count: i64::from(p.max_count.unwrap_or(crate::bus::DEFAULT_MAX_COUNT)),
            most_recent_sequence_id: 0,
            deltas_dropped: 0,
            created_at_ms: now,
            updated_at_ms: now,
            scope: serde_json::to_string(&scope).ok(),
            client: p.client.map(String::from),
        };
        let id = row.subscriber_id.clone();
        self.store.insert_subscriber(row).await?;
        tracing::info!(subscriber_id = %id, "subscriber added");
        self.grant_for(id)
    }

    /// A fresh grant for an existing subscriber (`subscriber.grant`: a reconnect after a
    /// restart, a page renewing its own): it lives [`RENEWED_TOKEN_TTL`], so a client whose
    /// timers are throttled (a hidden browser tab) still holds a valid one when it reconnects.
    pub async fn renew(&self, subscriber_id: &str) -> Result<GrantReply, SubscriberError> {
        self.store
            .get_subscriber(subscriber_id.to_owned())
            .await?
            .ok_or_else(|| SubscriberError::NotFound(subscriber_id.to_owned()))?;
        self.seen(subscriber_id).await;
        self.grant_with(subscriber_id.to_owned(), RENEWED_TOKEN_TTL)
    }

    /// Record that `subscriber_id` was seen now. A failed write costs only an earlier pruning
    /// (the subscriber has a live connection or a fresh grant, so it is asked again): logged.
    async fn seen(&self, subscriber_id: &str) {
        if let Err(e) = self
            .store
            .touch_subscriber(subscriber_id.to_owned(), now_ms())
            .await
        {
            tracing::warn!(subscriber_id, error = %e, "could not record when a subscriber was seen");
        }
    }

    /// Remove every subscriber last seen more than `max_idle` before `now_ms`, with its cursor
    /// (its row), unless it has a live connection: those are marked seen at `now_ms` instead,
    /// so a connection that lasts a month is not counted as a month away once it closes.
    /// Returns the ids removed.
    pub async fn prune(
        &self,
        now_ms: i64,
        max_idle: std::time::Duration,
    ) -> Result<Vec<String>, SubscriberError> {
        for id in self.grants.connected_ids() {
            self.store.touch_subscriber(id, now_ms).await?;
        }
        let idle_ms = i64::try_from(max_idle.as_millis()).unwrap_or(i64::MAX);
        let before = now_ms.saturating_sub(idle_ms);
        let mut removed = Vec::new();
        for id in self.store.stale_subscribers(before).await? {
            // Checked again for each: one may have connected since the sweep began.
            if self.grants.connection_count(&id) > 0 {
                continue;
            }
            if self.store.delete_subscriber(id.clone()).await? {
                self.grants.revoke(&id);
                removed.push(id);
            }
        }
        if !removed.is_empty() {
            tracing::info!(
                count = removed.len(),
                max_idle_days = max_idle.as_secs() / 86_400,
                "removed subscribers that did not come back"
            );
        }
        Ok(removed)
    }

    fn grant_for(&self, subscriber_id: String) -> Result<GrantReply, SubscriberError> {
        self.grant_with(subscriber_id, TOKEN_TTL)
    }

    fn grant_with(
        &self,
        subscriber_id: String,
        ttl: std::time::Duration,
    ) -> Result<GrantReply, SubscriberError> {
        let ws_token = self.grants.mint_for(&subscriber_id, ttl)?;
        Ok(GrantReply {
            subscriber_id,
            ws_endpoint: self.endpoint.clone(),
            ws_socket: self.socket.clone(),
            ws_token,
            token_ttl_s: ttl.as_secs(),
        })
    }

    pub async fn list(&self) -> Result<Vec<SubscriberView>, SubscriberError> {
        let rows = self.store.list_subscribers().await?;
        let seen = self.store.subscribers_last_seen().await?;
        Ok(rows
            .into_iter()
            .map(|row| SubscriberView {
                connected: self.grants.connection_count(&row.subscriber_id) > 0,
                last_seen_at_ms: seen.get(&row.subscriber_id).copied().flatten(),
                row,
            })
            .collect())
    }

    pub async fn remove(&self, subscriber_id: &str) -> Result<(), SubscriberError> {
        if !self
            .store
            .delete_subscriber(subscriber_id.to_owned())
            .await?
        {
            return Err(SubscriberError::NotFound(subscriber_id.to_owned()));
        }
        self.grants.revoke(subscriber_id);
        tracing::info!(subscriber_id, "subscriber removed");
        Ok(())
    }
}

/// Prune subscribers that never come back ([`Subscribers::prune`]) now, then every
/// [`PRUNE_EVERY`], and whenever `max_idle` changes (a `config.toml` reload), each time with
/// its value then; until `stop`.
pub async fn prune_task(
    subscribers: Subscribers,
    mut max_idle: tokio::sync::watch::Receiver<std::time::Duration>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = true;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            changed = max_idle.changed(), if watching => {
                if changed.is_err() {
                    // Its sender is gone: the last value holds, and the hourly sweep goes on.
                    watching = false;
                    continue;
                }
            }
        }
        let idle = *max_idle.borrow_and_update();
        if let Err(e) = subscribers.prune(now_ms(), idle).await {
            tracing::warn!(error = %e, "pruning subscribers that did not come back failed");
        }
    }
}

/// What a connection of a stored subscriber may do: its stored scope; a row written before
/// scopes were stored gets what its session filter implies. A stored scope that does not read
/// (damaged, or written by a newer build) grants nothing rather than everything.
pub fn scope_of(row: &SubscriberRow) -> Scope {
    match row.scope.as_deref() {
        None => match &row.session_id {
            Some(id) => Scope::one_session(id),
            None => Scope::all(),
        },
        Some(text) => serde_json::from_str(text).unwrap_or_else(|e| {
            tracing::warn!(
                subscriber_id = %row.subscriber_id,
                error = %e,
                "a subscriber's stored scope does not read; it grants nothing"
            );
            Scope::nothing()
        }),
    }
}

/// How a stored subscriber's replay mode reads.
pub fn replay_mode_of(row: &SubscriberRow) -> ReplayMode {
    ReplayMode::parse(&row.replay_mode).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DAY_MS: i64 = 86_400_000;

    /// The clock is the `now_ms` given to `prune`: days pass without waiting for them.
    #[tokio::test]
    async fn prune_removes_who_stayed_away_and_never_a_connected_one() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let (bus, tasks) = Bus::start(store.clone()).await.unwrap();
        let sessions = SessionManager::new(
            store.clone(),
            bus.clone(),
            Arc::new(crate::session::NoAgents),
        );
        let grants = Arc::new(GrantStore::new(crate::clock::Clock::system()));
        let subscribers = Subscribers::new(store.clone(), bus.clone(), sessions, grants.clone(), 1);
        let add = || async {
            let params = serde_json::from_value(serde_json::json!({"type": "local"})).unwrap();
            subscribers.add(params).await.unwrap().subscriber_id
        };
        let (seen, connected, never) = (add().await, add().await, add().await);
        subscribers.renew(&seen).await.unwrap();
        let connection = grants.connected(&connected, tokio_util::sync::CancellationToken::new());
        let listed = subscribers.list().await.unwrap();
        let last_seen = |id: &str| {
            listed
                .iter()
                .find(|v| v.row.subscriber_id == id)
                .unwrap()
                .last_seen_at_ms
        };
        assert!(last_seen(&seen).is_some());
        assert_eq!(last_seen(&never), None);

        let month = Duration::from_secs(30 * 86_400);
        let now = now_ms();
        // 29 days on: nobody is away long enough.
        assert!(
            subscribers
                .prune(now + 29 * DAY_MS, month)
                .await
                .unwrap()
                .is_empty()
        );
        // 31 days on: the two away go, with their rows (and so their cursors) and grants; the
        // connected one stays, and counts as seen then.
        let mut removed = subscribers.prune(now + 31 * DAY_MS, month).await.unwrap();
        removed.sort();
        let mut expected = vec![seen.clone(), never.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(store.get_subscriber(seen.clone()).await.unwrap().is_none());
        assert!(subscribers.renew(&never).await.is_err());
        // Disconnected: a month after it was last seen connected, it goes too.
        grants.disconnected(&connected, connection);
        assert!(
            subscribers
                .prune(now + 60 * DAY_MS, month)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            subscribers.prune(now + 62 * DAY_MS, month).await.unwrap(),
            [connected]
        );
        drop((subscribers, bus, store));
        tasks.shutdown().await;
        threads.shutdown().await;
    }
}
