//! Sessions: creation, lookup, deletion and history.
//!
//! For now a session is its row plus its events; the per-session actor that owns a live agent
//! process, its runs and its follow-up queue arrives with the adapters (design §8) and will
//! live here, behind the same [`SessionManager`] handle. Every event of a session is published
//! through the [`Bus`], never written to the store directly.

use std::path::Path;

use crate::bus::Bus;
use crate::store::{SessionRow, Store, StoreError, StoredEvent, now_ms};

/// The adapter families this build knows the names of (design §9). A session of any of these
/// can be created and followed; running a turn needs the family's adapter.
pub const AGENT_FAMILIES: &[AgentFamily] = &[
    AgentFamily {
        agent_type: "claude",
        protocol: "claude-code stream-json",
    },
    AgentFamily {
        agent_type: "codex",
        protocol: "codex app-server JSON-RPC",
    },
    AgentFamily {
        agent_type: "acp",
        protocol: "Agent Client Protocol v1",
    },
];

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct AgentFamily {
    pub agent_type: &'static str,
    pub protocol: &'static str,
}

/// The most a page of history may hold.
pub const MAX_HISTORY_LIMIT: u32 = 5000;
pub const DEFAULT_HISTORY_LIMIT: u32 = 200;
/// The most payload bytes one page of history carries (always at least one event).
pub const MAX_HISTORY_BYTES: usize = 8 * 1024 * 1024;
/// The longest session title accepted.
pub const MAX_TITLE_BYTES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no session {0:?}")]
    NotFound(String),
    #[error("cwd {path:?} is not an existing directory: {reason}")]
    CwdNotFound { path: String, reason: String },
    #[error("unknown agent type {0:?}; `agent-host agent.list` shows the known ones")]
    UnknownAgentType(String),
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// What a `session.create` asks for.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub agent_type: String,
    pub cwd: String,
    pub title: Option<String>,
}

/// A cloneable handle for everything session-shaped.
#[derive(Clone)]
pub struct SessionManager {
    store: Store,
    #[expect(
        dead_code,
        reason = "session actors publish through it once adapters exist"
    )]
    bus: Bus,
}

impl SessionManager {
    pub fn new(store: Store, bus: Bus) -> SessionManager {
        SessionManager { store, bus }
    }

    pub async fn create(&self, new: NewSession) -> Result<SessionRow, SessionError> {
        if !AGENT_FAMILIES
            .iter()
            .any(|f| f.agent_type == new.agent_type)
        {
            return Err(SessionError::UnknownAgentType(new.agent_type));
        }
        if new
            .title
            .as_ref()
            .is_some_and(|t| t.len() > MAX_TITLE_BYTES)
        {
            return Err(SessionError::InvalidParams(format!(
                "title is longer than {MAX_TITLE_BYTES} bytes"
            )));
        }
        let cwd = new.cwd.clone();
        let cwd = tokio::task::spawn_blocking(move || canonical_dir(&cwd))
            .await
            .map_err(|e| SessionError::InvalidParams(e.to_string()))??;
        let now = now_ms();
        let row = SessionRow {
            session_id: uuid::Uuid::now_v7().to_string(),
            agent_type: new.agent_type,
            native_session_id: None,
            cwd,
            parent_session_id: None,
            title: new.title,
            state: "idle".to_owned(),
            created_at_ms: now,
            updated_at_ms: now,
        };
        self.store.insert_session(row.clone()).await?;
        tracing::info!(session_id = %row.session_id, agent_type = %row.agent_type, "session created");
        Ok(row)
    }

    pub async fn get(&self, session_id: &str) -> Result<SessionRow, SessionError> {
        self.store
            .get_session(session_id.to_owned())
            .await?
            .ok_or_else(|| SessionError::NotFound(session_id.to_owned()))
    }

    pub async fn list(&self) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.store.list_sessions().await?)
    }

    pub async fn count(&self) -> Result<i64, SessionError> {
        Ok(self.store.count_sessions().await?)
    }

    pub async fn delete(&self, session_id: &str) -> Result<(), SessionError> {
        if self.store.delete_session(session_id.to_owned()).await? {
            tracing::info!(session_id, "session deleted");
            Ok(())
        } else {
            Err(SessionError::NotFound(session_id.to_owned()))
        }
    }

    /// Brackets after `after_seq`, at most `limit` and about [`MAX_HISTORY_BYTES`]; the session
    /// must exist.
    pub async fn history(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, SessionError> {
        self.get(session_id).await?;
        let limit = limit.clamp(1, MAX_HISTORY_LIMIT);
        let mut events = self
            .store
            .history(session_id.to_owned(), after_seq.max(0), limit)
            .await?;
        // Keep a page within a size any client accepts; the caller pages on from the last one.
        let mut bytes = 0;
        let keep = events
            .iter()
            .take_while(|e| {
                bytes += e.payload.len();
                bytes <= MAX_HISTORY_BYTES
            })
            .count()
            .max(1);
        events.truncate(keep);
        Ok(events)
    }
}

fn canonical_dir(cwd: &str) -> Result<String, SessionError> {
    let err = |reason: String| SessionError::CwdNotFound {
        path: cwd.to_owned(),
        reason,
    };
    let path = Path::new(cwd);
    if !path.is_absolute() {
        return Err(err("it must be an absolute path".to_owned()));
    }
    let canonical = path.canonicalize().map_err(|e| err(e.to_string()))?;
    if !canonical.is_dir() {
        return Err(err("it is not a directory".to_owned()));
    }
    canonical
        .into_os_string()
        .into_string()
        .map_err(|_| err("it is not valid UTF-8".to_owned()))
}
