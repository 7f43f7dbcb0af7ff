//! Subscribers (design §6): durable rows in the store with their cursor and replay mode, the
//! grant tokens that open a connection for one (memory only), and the registry of live
//! connections. Shared by every wire transport: the loopback server checks tokens, and any
//! link (loopback or relay) opens its subscription here.
//!
//! - [`grants`] — tokens and the connection registry.
//! - [`Subscribers`] — what `subscriber.*` commands do, and [`Subscribers::open`], which starts
//!   a connection's subscription per its row.

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
}

/// Subscriber lifecycle: rows in the store, grants in memory.
#[derive(Clone)]
pub struct Subscribers {
    store: Store,
    bus: Bus,
    sessions: SessionManager,
    grants: Arc<GrantStore>,
    endpoint: String,
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
        }
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
        self.grant_with(subscriber_id.to_owned(), RENEWED_TOKEN_TTL)
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
            ws_token,
            token_ttl_s: ttl.as_secs(),
        })
    }

    pub async fn list(&self) -> Result<Vec<SubscriberView>, SubscriberError> {
        let rows = self.store.list_subscribers().await?;
        Ok(rows
            .into_iter()
            .map(|row| SubscriberView {
                connected: self.grants.connection_count(&row.subscriber_id) > 0,
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
