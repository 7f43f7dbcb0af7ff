//! The host side of the command envelope: a typed [`Command`] in, a [`Reply`] out.
//!
//! This is the one place where module errors become wire codes (`SessionError::NotFound` →
//! `session_not_found`, …). Transports (IPC now, WebSocket and relay later) call
//! [`Dispatcher::handle`] and never build error replies of their own beyond request errors.

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::{RelayConfig, RelayScope, RelayTiming};
use crate::instance::LockInfo;
use crate::protocol::envelope::{
    Command, ErrorCode, HostRelaySetParams, Reply, SessionHistoryParams,
};
use crate::relay::RelayHandle;
use crate::session::{DEFAULT_HISTORY_LIMIT, NewSession, SessionError, SessionManager};
use crate::store::StoredEvent;
use crate::ws::{SubscriberError, Subscribers};

/// Serves commands inside the live host.
#[derive(Clone)]
pub struct Dispatcher {
    sessions: SessionManager,
    subscribers: Subscribers,
    info: LockInfo,
    shutdown: CancellationToken,
    relay: Option<RelayHandle>,
}

impl Dispatcher {
    pub fn new(
        sessions: SessionManager,
        subscribers: Subscribers,
        info: LockInfo,
        shutdown: CancellationToken,
    ) -> Self {
        Dispatcher {
            sessions,
            subscribers,
            info,
            shutdown,
            relay: None,
        }
    }

    /// The relay client, for `host.status` and `host.relay.set`.
    pub fn with_relay(mut self, relay: RelayHandle) -> Self {
        self.relay = Some(relay);
        self
    }

    fn relay_set(&self, p: HostRelaySetParams) -> Reply {
        let Some(relay) = &self.relay else {
            return Reply::error(
                ErrorCode::Internal,
                "this host runs no relay client",
                Value::Null,
            );
        };
        let invalid =
            |message: String| Reply::error(ErrorCode::InvalidParams, message, Value::Null);
        let Some(url) = p.url else {
            relay.set(None);
            tracing::info!("relay turned off over IPC");
            return Reply::ok(json!({"relay": relay.status()}));
        };
        let Some(token) = p.token.filter(|t| !t.is_empty()) else {
            return invalid("a relay needs a token".to_owned());
        };
        let scope: RelayScope = match p.scope.map(serde_json::from_value).transpose() {
            Ok(scope) => scope.unwrap_or_default(),
            Err(e) => return invalid(format!("scope: {e}")),
        };
        let timing: RelayTiming = match p.timing.map(serde_json::from_value).transpose() {
            Ok(timing) => timing.unwrap_or_default(),
            Err(e) => return invalid(format!("timing: {e}")),
        };
        let config = RelayConfig {
            url,
            token,
            scope,
            timing,
        };
        if let Err(e) = crate::relay::client::check(&config) {
            return invalid(format!("relay: {e}"));
        }
        tracing::info!(url = %config.url, "relay set over IPC");
        relay.set(Some(config));
        Reply::ok(json!({"relay": relay.status()}))
    }

    pub async fn handle(&self, command: Command) -> Reply {
        // Status and a repeated shutdown still answer normally while the host winds down.
        if self.shutdown.is_cancelled()
            && !matches!(command, Command::HostStatus | Command::HostShutdown)
        {
            return Reply::error(
                ErrorCode::ShuttingDown,
                "the host is shutting down",
                Value::Null,
            );
        }
        match command {
            Command::HostStart(_) => Reply::error(
                ErrorCode::AlreadyRunning,
                format!("a host is already running (pid {})", self.info.pid),
                json!({"pid": self.info.pid}),
            ),
            Command::Version | Command::AgentList => Reply::error(
                ErrorCode::WrongRoute,
                "this command runs locally in the CLI, not in the host",
                Value::Null,
            ),
            Command::HostStatus => match self.sessions.count().await {
                Ok(sessions) => {
                    let mut status = status_json(&self.info, Some(sessions));
                    status["store"] = json!(self.sessions.store_health());
                    if let Some(relay) = &self.relay {
                        status["relay"] = json!(relay.status());
                    }
                    Reply::ok(status)
                }
                Err(e) => session_error(e),
            },
            Command::HostRelaySet(p) => self.relay_set(p),
            Command::HostShutdown => {
                tracing::info!("shutdown requested over IPC");
                self.shutdown.cancel();
                Reply::ok(json!({"stopping": true, "pid": self.info.pid}))
            }
            Command::SessionCreate(p) => match self
                .sessions
                .create(NewSession {
                    agent_type: p.agent_type,
                    cwd: p.cwd,
                    title: p.title,
                })
                .await
            {
                Ok(row) => Reply::ok(json!({"session_id": row.session_id, "session": row})),
                Err(e) => session_error(e),
            },
            Command::SessionList => match self.sessions.list().await {
                Ok(rows) => Reply::ok(json!({"sessions": rows})),
                Err(e) => session_error(e),
            },
            Command::SessionGet(p) => match self.sessions.get(&p.session_id).await {
                Ok(row) => {
                    let live = self.sessions.live(&p.session_id).await;
                    let mut data = serde_json::to_value(row).unwrap_or(Value::Null);
                    if let Value::Object(map) = &mut data {
                        map.insert(
                            "live".to_owned(),
                            serde_json::to_value(live).unwrap_or(Value::Null),
                        );
                    }
                    Reply::ok(data)
                }
                Err(e) => session_error(e),
            },
            Command::SessionFork(p) => match self.sessions.fork(&p.session_id, p.title).await {
                Ok(row) => Reply::ok(json!({
                    "session_id": row.session_id,
                    "parent_session_id": row.parent_session_id,
                    "session": row,
                })),
                Err(e) => session_error(e),
            },
            Command::SessionImport(p) => match self
                .sessions
                .import(p.agent_type, p.native_session_id, p.cwd, p.title)
                .await
            {
                Ok(row) => Reply::ok(json!({"session_id": row.session_id, "session": row})),
                Err(e) => session_error(e),
            },
            Command::SessionSend(p) => match self
                .sessions
                .send(&p.session_id, p.text, p.client_msg_id)
                .await
            {
                Ok(receipt) => Reply::ok(receipt),
                Err(e) => session_error(e),
            },
            Command::SessionCancel(p) => {
                match self.sessions.cancel(&p.session_id, p.run_id).await {
                    Ok(receipt) => Reply::ok(receipt),
                    Err(e) => session_error(e),
                }
            }
            Command::PermissionRespond(p) => match self
                .sessions
                .respond_permission(
                    &p.session_id,
                    p.request_id,
                    p.decision,
                    p.message,
                    "ipc".to_owned(),
                )
                .await
            {
                Ok(receipt) => Reply::ok(receipt),
                Err(e) => session_error(e),
            },
            Command::SessionDelete(p) => match self.sessions.delete(&p.session_id).await {
                Ok(()) => Reply::ok(json!({"deleted": p.session_id})),
                Err(e) => session_error(e),
            },
            Command::SessionHistory(p) => self.history(p).await,
            Command::SubscriberAdd(p) => match self.subscribers.add(p).await {
                Ok(grant) => Reply::ok(grant),
                Err(e) => subscriber_error(e),
            },
            Command::SubscriberGrant(p) => match self.subscribers.grant(&p.subscriber_id).await {
                Ok(grant) => Reply::ok(grant),
                Err(e) => subscriber_error(e),
            },
            Command::SubscriberList => match self.subscribers.list().await {
                Ok(rows) => Reply::ok(json!({"subscribers": rows})),
                Err(e) => subscriber_error(e),
            },
            Command::SubscriberRemove(p) => match self.subscribers.remove(&p.subscriber_id).await {
                Ok(()) => Reply::ok(json!({"removed": p.subscriber_id})),
                Err(e) => subscriber_error(e),
            },
        }
    }

    async fn history(&self, p: SessionHistoryParams) -> Reply {
        let after = p.after_seq.unwrap_or(0);
        let limit = p.limit.unwrap_or(DEFAULT_HISTORY_LIMIT);
        match self.sessions.history(&p.session_id, after, limit).await {
            Ok(events) => {
                let next = events.last().map_or(after, |e| e.sequence_id);
                let count = events.len();
                let events: Vec<Value> = events.into_iter().map(history_entry).collect();
                Reply::ok(json!({
                    "session_id": p.session_id,
                    "events": events,
                    "count": count,
                    "next_after_seq": next,
                }))
            }
            Err(e) => session_error(e),
        }
    }
}

/// `host.status` data; `sessions` is absent when answered from the lock file.
pub fn status_json(info: &LockInfo, sessions: Option<i64>) -> Value {
    json!({
        "running": true,
        "pid": info.pid,
        "version": info.version,
        "ipc_path": info.ipc_path,
        "ws_port": info.ws_port,
        "started_at": info.started_at,
        "sessions": sessions,
    })
}

fn history_entry(e: StoredEvent) -> Value {
    // The payload is the canonical JSON as published; pass it through untouched, whatever its
    // kind, so history written by a newer host still reads.
    let event = serde_json::from_str::<Value>(&e.payload).unwrap_or(Value::Null);
    json!({
        "sequence_id": e.sequence_id,
        "message_id": e.message_id,
        "run_id": e.run_id,
        "kind": e.kind,
        "created_at_ms": e.created_at,
        "event": event,
    })
}

fn subscriber_error(e: SubscriberError) -> Reply {
    let message = e.to_string();
    match e {
        SubscriberError::NotFound(id) => Reply::error(
            ErrorCode::SubscriberNotFound,
            message,
            json!({"subscriber_id": id}),
        ),
        SubscriberError::Session(e) => session_error(e),
        SubscriberError::Store(_) => {
            tracing::error!(error = %message, "store failure while serving a command");
            Reply::error(ErrorCode::StoreFailed, message, Value::Null)
        }
        SubscriberError::Grant(_) => {
            tracing::error!(error = %message, "minting a grant failed");
            Reply::error(ErrorCode::Internal, message, Value::Null)
        }
    }
}

fn session_error(e: SessionError) -> Reply {
    let message = e.to_string();
    match e {
        SessionError::NotFound(id) => Reply::error(
            ErrorCode::SessionNotFound,
            message,
            json!({"session_id": id}),
        ),
        SessionError::CwdNotFound { path, .. } => {
            Reply::error(ErrorCode::CwdNotFound, message, json!({"cwd": path}))
        }
        SessionError::UnknownAgentType(agent_type) => Reply::error(
            ErrorCode::UnknownAgentType,
            message,
            json!({"agent_type": agent_type}),
        ),
        SessionError::InvalidParams(_) => {
            Reply::error(ErrorCode::InvalidParams, message, Value::Null)
        }
        SessionError::NoAgent(_) => Reply::error(ErrorCode::NoAgent, message, Value::Null),
        SessionError::AgentUnavailable(_) => {
            Reply::error(ErrorCode::AgentUnavailable, message, Value::Null)
        }
        SessionError::RunNotFound(_) => Reply::error(ErrorCode::RunNotFound, message, Value::Null),
        SessionError::PermissionNotFound(id) => Reply::error(
            ErrorCode::PermissionNotFound,
            message,
            json!({"request_id": id}),
        ),
        SessionError::AlreadyResolved {
            request_id,
            decision,
            by,
        } => Reply::error(
            ErrorCode::AlreadyResolved,
            message,
            json!({"request_id": request_id, "decision": decision, "by": by}),
        ),
        SessionError::ShuttingDown => Reply::error(ErrorCode::ShuttingDown, message, Value::Null),
        SessionError::StoreUnavailable(_) => {
            Reply::error(ErrorCode::StoreUnavailable, message, Value::Null)
        }
        SessionError::Store(_) => {
            tracing::error!(error = %message, "store failure while serving a command");
            Reply::error(ErrorCode::StoreFailed, message, Value::Null)
        }
    }
}
