//! The loopback WebSocket transport (design §7): the server on `127.0.0.1` at `/subscribe`,
//! the grant tokens that open it, and the subscriber rows behind them.
//!
//! - [`grants`] — tokens (memory only) and the registry of live connections.
//! - [`server`] — accept, check Host / Origin / token in the handshake, then one task per
//!   connection: replay and live events out, acks and requests in.
//! - [`client`] — the client side of the same protocol (`agent-host follow`, tests).
//! - [`Subscribers`] — what `subscriber.*` commands do: rows in the store plus grants.
//!
//! `tokio-tungstenite` is imported only under this module (and later `relay/`).

pub mod client;
pub mod grants;
pub mod link;
pub mod server;

use std::sync::Arc;

use crate::protocol::envelope::{ReplayMode, SubscriberAddParams};
use crate::session::{SessionError, SessionManager};
use crate::store::{Store, StoreError, SubscriberRow, now_ms};

pub use grants::{GrantStore, TOKEN_TTL};

/// The path the server answers on.
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
}

/// The answer to `subscriber.add` and `subscriber.grant`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GrantReply {
    pub subscriber_id: String,
    pub ws_endpoint: String,
    pub ws_token: String,
    pub token_ttl_s: u64,
}

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
    sessions: SessionManager,
    grants: Arc<GrantStore>,
    endpoint: String,
}

impl Subscribers {
    pub fn new(store: Store, sessions: SessionManager, grants: Arc<GrantStore>, port: u16) -> Self {
        Subscribers {
            store,
            sessions,
            grants,
            endpoint: format!("ws://127.0.0.1:{port}{PATH}"),
        }
    }

    pub async fn add(&self, p: SubscriberAddParams) -> Result<GrantReply, SubscriberError> {
        if let Some(session_id) = &p.session_id {
            self.sessions.get(session_id).await?;
        }
        let now = now_ms();
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
        };
        let id = row.subscriber_id.clone();
        self.store.insert_subscriber(row).await?;
        tracing::info!(subscriber_id = %id, "subscriber added");
        self.grant_for(id)
    }

    pub async fn grant(&self, subscriber_id: &str) -> Result<GrantReply, SubscriberError> {
        self.store
            .get_subscriber(subscriber_id.to_owned())
            .await?
            .ok_or_else(|| SubscriberError::NotFound(subscriber_id.to_owned()))?;
        self.grant_for(subscriber_id.to_owned())
    }

    fn grant_for(&self, subscriber_id: String) -> Result<GrantReply, SubscriberError> {
        let ws_token = self.grants.mint(&subscriber_id)?;
        Ok(GrantReply {
            subscriber_id,
            ws_endpoint: self.endpoint.clone(),
            ws_token,
            token_ttl_s: TOKEN_TTL.as_secs(),
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

/// How a stored subscriber's replay mode reads.
pub fn replay_mode_of(row: &SubscriberRow) -> ReplayMode {
    ReplayMode::parse(&row.replay_mode).unwrap_or_default()
}
