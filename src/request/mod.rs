//! The one request layer (design §2): a typed [`Command`] from any transport — IPC, the
//! loopback WebSocket, the relay — and the [`Caller`] that sent it, in; a [`Reply`] out.
//!
//! Everything a command does is decided here once: whether it is served on the caller's
//! transport (the command table's `wire` column), whether the caller's scope allows it
//! ([`access`]), what it calls, and which stable code each failure gets ([`errors`], the only
//! error-to-code mapping in the crate). Transports keep only framing, subscriptions, acks and
//! pings; they never build a command's reply themselves.

pub mod access;
pub mod errors;

use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, RelayConfig, RelayTiming};
use crate::instance::LockInfo;
use crate::protocol::envelope::{
    Command, ErrorCode, HostRelaySetParams, Reply, SessionHistoryParams, spec,
};
use crate::protocol::replies::{
    Deleted, HistoryEntry, HistoryPage, PermissionList, RunList, SessionCreated, SessionDetail,
    SessionForkedReply, SessionRenamed,
};
use crate::protocol::scope::Scope;
use crate::session::{DEFAULT_HISTORY_LIMIT, NewSession, SessionManager};
use crate::store::{DEFAULT_SESSION_PAGE, SessionQuery, StoredEvent};

use crate::subscribers::Subscribers;

pub use access::{Access, Caller, Via};
use errors::{session_error, subscriber_error};

/// What the host's relay client offers the request layer (`host.status`, `host.relay.set`).
pub trait RelayControl: Send + Sync {
    fn status(&self) -> Value;
    fn set(&self, config: Option<RelayConfig>);
    /// Whether a configuration could be dialed at all.
    fn check(&self, config: &RelayConfig) -> Result<(), String>;
}

/// Serves every command inside the live host, for every transport.
#[derive(Clone)]
pub struct Handler {
    sessions: SessionManager,
    subscribers: Subscribers,
    info: LockInfo,
    config: Arc<Config>,
    shutdown: CancellationToken,
    /// Set once the relay client runs (it needs a handler itself, so it comes second).
    relay: Arc<OnceLock<Arc<dyn RelayControl>>>,
}

impl Handler {
    pub fn new(
        sessions: SessionManager,
        subscribers: Subscribers,
        info: LockInfo,
        config: Arc<Config>,
        shutdown: CancellationToken,
    ) -> Self {
        Handler {
            sessions,
            subscribers,
            info,
            config,
            shutdown,
            relay: Arc::new(OnceLock::new()),
        }
    }

    /// The relay client, for `host.status` and `host.relay.set`.
    pub fn set_relay(&self, relay: Arc<dyn RelayControl>) {
        let _already = self.relay.set(relay);
    }

    /// A session the caller created joins its scope: for this connection at once, and for a
    /// loopback subscriber's later connections through its stored scope.
    async fn created(&self, caller: &Caller, session_id: &str) {
        caller.access.created(session_id);
        if let Via::Loopback { subscriber_id } = &caller.via
            && caller.access.scope().sessions.is_some()
            && let Err(e) = self
                .subscribers
                .extend_scope(subscriber_id, session_id)
                .await
        {
            tracing::warn!(error = %e, "a created session could not be saved in the grant's scope");
        }
    }

    /// The subscribers (rows, grants, connections), for the transports.
    pub fn subscribers(&self) -> &Subscribers {
        &self.subscribers
    }

    fn relay_set(&self, p: HostRelaySetParams) -> Reply {
        let Some(relay) = self.relay.get() else {
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
        let scope: Scope = match p.scope.map(serde_json::from_value).transpose() {
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
        if let Err(e) = relay.check(&config) {
            return invalid(format!("relay: {e}"));
        }
        tracing::info!(url = %config.url, "relay set over IPC");
        relay.set(Some(config));
        Reply::ok(json!({"relay": relay.status()}))
    }

    /// Answer one command for one caller.
    pub async fn handle(&self, caller: &Caller, command: Command) -> Reply {
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
        if caller.on_wire() && !spec(command.name()).is_some_and(|s| s.wire) {
            return Reply::error(
                ErrorCode::WrongRoute,
                format!("{} is not served over the wire; use IPC", command.name()),
                Value::Null,
            );
        }
        if let Err(refused) = authorize(caller, &command) {
            return refused;
        }
        match self.serve(caller, command).await {
            Ok(reply) | Err(reply) => reply,
        }
    }

    async fn serve(&self, caller: &Caller, command: Command) -> Result<Reply, Reply> {
        let access = &caller.access;
        Ok(match command {
            Command::HostStart(_) => Reply::error(
                ErrorCode::AlreadyRunning,
                format!("a host is already running (pid {})", self.info.pid),
                json!({"pid": self.info.pid}),
            ),
            Command::Version => Reply::error(
                ErrorCode::WrongRoute,
                "this command runs locally in the CLI, not in the host",
                Value::Null,
            ),
            Command::AgentList => Reply::ok(crate::adapter::agents_report(&self.config).await),
            Command::HostStatus => {
                if let Some(ids) = access.sessions() {
                    // A client limited to some sessions learns the host is up and how it
                    // stands, not what else it holds or where its files and relay are.
                    let mut sessions = 0_i64;
                    for id in &ids {
                        if self.sessions.get(id).await.is_ok() {
                            sessions += 1;
                        }
                    }
                    return Ok(Reply::ok(json!({
                        "running": true,
                        "version": self.info.version,
                        "sessions": sessions,
                        "store": self.sessions.store_health(),
                    })));
                }
                let sessions = self.sessions.count().await.map_err(session_error)?;
                let mut status = status_json(&self.info, Some(sessions));
                status["store"] = json!(self.sessions.store_health());
                if let Some(relay) = self.relay.get() {
                    status["relay"] = relay.status();
                }
                Reply::ok(status)
            }
            Command::HostRelaySet(p) => self.relay_set(p),
            Command::HostShutdown => {
                tracing::info!("shutdown requested over IPC");
                self.shutdown.cancel();
                Reply::ok(json!({"stopping": true, "pid": self.info.pid}))
            }
            Command::SessionCreate(p) => {
                let row = self
                    .sessions
                    .create(NewSession {
                        agent_type: p.agent_type,
                        cwd: p.cwd,
                        title: p.title,
                    })
                    .await
                    .map_err(session_error)?;
                self.created(caller, &row.session_id).await;
                Reply::ok(SessionCreated {
                    session_id: row.session_id.clone(),
                    session: row,
                })
            }
            Command::SessionList(p) => Reply::ok(
                self.sessions
                    .list_page(SessionQuery {
                        limit: p.limit.unwrap_or(DEFAULT_SESSION_PAGE),
                        cursor: p.cursor,
                        state: p.state.map(|s| s.as_str().to_owned()),
                        agent_type: p.agent_type,
                        cwd: p.cwd,
                        only: access.sessions(),
                    })
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionGet(p) => {
                let session = self
                    .sessions
                    .get(&p.session_id)
                    .await
                    .map_err(session_error)?;
                let live = self.sessions.live(&p.session_id).await;
                Reply::ok(SessionDetail { session, live })
            }
            Command::SessionActivate(p) => Reply::ok(
                self.sessions
                    .activate(&p.session_id)
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionRuns(p) => {
                let runs = self
                    .sessions
                    .runs(&p.session_id)
                    .await
                    .map_err(session_error)?;
                Reply::ok(RunList { runs })
            }
            Command::SessionRun(p) => Reply::ok(
                self.sessions
                    .run(&p.session_id, p.run)
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionRename(p) => {
                let row = self
                    .sessions
                    .rename(&p.session_id, p.title)
                    .await
                    .map_err(session_error)?;
                Reply::ok(SessionRenamed { session: row })
            }
            Command::PermissionList(p) => {
                let mut pending = self
                    .sessions
                    .pending_permissions(p.session_id.as_deref())
                    .await
                    .map_err(session_error)?;
                pending.retain(|r| access.has_session(&r.session_id));
                Reply::ok(PermissionList {
                    permissions: pending,
                })
            }
            Command::SessionFork(p) => {
                let row = self
                    .sessions
                    .fork(&p.session_id, p.title)
                    .await
                    .map_err(session_error)?;
                self.created(caller, &row.session_id).await;
                Reply::ok(SessionForkedReply {
                    session_id: row.session_id.clone(),
                    parent_session_id: row.parent_session_id.clone(),
                    session: row,
                })
            }
            Command::SessionImport(p) => {
                let row = self
                    .sessions
                    .import(p.agent_type, p.native_session_id, p.cwd, p.title)
                    .await
                    .map_err(session_error)?;
                self.created(caller, &row.session_id).await;
                Reply::ok(SessionCreated {
                    session_id: row.session_id.clone(),
                    session: row,
                })
            }
            Command::SessionSend(p) => Reply::ok(
                self.sessions
                    .send(&p.session_id, p.text, p.client_msg_id)
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionCancel(p) => Reply::ok(
                self.sessions
                    .cancel(&p.session_id, p.run_id)
                    .await
                    .map_err(session_error)?,
            ),
            Command::PermissionRespond(p) => Reply::ok(
                self.sessions
                    .respond_permission(
                        &p.session_id,
                        p.request_id,
                        p.decision,
                        p.message,
                        caller.by(),
                    )
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionDelete(p) => {
                self.sessions
                    .delete(&p.session_id)
                    .await
                    .map_err(session_error)?;
                Reply::ok(Deleted {
                    deleted: p.session_id,
                })
            }
            Command::SessionHistory(p) => self.history(p).await,
            Command::SubscriberAdd(p) => {
                Reply::ok(self.subscribers.add(p).await.map_err(subscriber_error)?)
            }
            Command::SubscriberGrant(p) => Reply::ok(
                self.subscribers
                    .grant(&p.subscriber_id)
                    .await
                    .map_err(subscriber_error)?,
            ),
            Command::SubscriberList => {
                let rows = self.subscribers.list().await.map_err(subscriber_error)?;
                Reply::ok(json!({"subscribers": rows}))
            }
            Command::SubscriberRemove(p) => {
                self.subscribers
                    .remove(&p.subscriber_id)
                    .await
                    .map_err(subscriber_error)?;
                Reply::ok(json!({"removed": p.subscriber_id}))
            }
        })
    }

    async fn history(&self, p: SessionHistoryParams) -> Reply {
        let after = p.after_seq.unwrap_or(0);
        let limit = p.limit.unwrap_or(DEFAULT_HISTORY_LIMIT);
        match self.sessions.history(&p.session_id, after, limit).await {
            Ok((events, has_more)) => {
                let next = events.last().map_or(after, |e| e.sequence_id);
                let count = events.len();
                Reply::ok(HistoryPage {
                    session_id: p.session_id,
                    events: events.into_iter().map(history_entry).collect(),
                    count,
                    next_after_seq: next,
                    has_more,
                })
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

fn history_entry(e: StoredEvent) -> HistoryEntry {
    // The payload is the canonical JSON as published; pass it through untouched, whatever its
    // kind, so history written by a newer host still reads.
    HistoryEntry {
        event: serde_json::from_str::<Value>(&e.payload).unwrap_or(Value::Null),
        sequence_id: e.sequence_id,
        message_id: e.message_id,
        run_id: e.run_id,
        kind: e.kind,
        created_at_ms: e.created_at,
    }
}

/// The scope rule, for every command: which session it touches and which right it needs. A
/// session outside the scope is refused before anyone looks it up (its existence is not told).
fn authorize(caller: &Caller, command: &Command) -> Result<(), Reply> {
    let access = &caller.access;
    let scope = access.scope();
    match command {
        Command::SessionCreate(_) => access.allows(scope.create_sessions, "creating sessions"),
        // An import brings any agent session on the machine under the host: only for a scope
        // over every session.
        Command::SessionImport(_) => {
            access.allows(scope.create_sessions, "creating sessions")?;
            access.allows(
                scope.sessions.is_none(),
                "importing sessions (a scope limited to some sessions)",
            )
        }
        Command::SessionFork(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.create_sessions, "creating sessions")
        }
        Command::SessionGet(p) => access.session(&p.session_id),
        Command::SessionHistory(p) => access.session(&p.session_id),
        Command::SessionRuns(p) => access.session(&p.session_id),
        Command::SessionRun(p) => access.session(&p.session_id),
        Command::PermissionList(p) => p
            .session_id
            .as_deref()
            .map_or(Ok(()), |id| access.session(id)),
        Command::SessionSend(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "prompts")
        }
        Command::SessionCancel(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "cancelling runs")
        }
        Command::SessionActivate(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "driving sessions")
        }
        Command::SessionDelete(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.create_sessions, "deleting sessions")
        }
        Command::SessionRename(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "driving sessions")
        }
        Command::PermissionRespond(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.permissions, "answering permission requests")
        }
        // A wire client renews its own grant only.
        Command::SubscriberGrant(p) => match &caller.via {
            Via::Ipc => Ok(()),
            Via::Loopback { subscriber_id } if *subscriber_id == p.subscriber_id => Ok(()),
            Via::Loopback { .. } | Via::Relay => Err(Reply::error(
                ErrorCode::OutOfScope,
                "a connection may renew only its own subscriber's grant",
                json!({"subscriber_id": p.subscriber_id}),
            )),
        },
        // Filtered to the scope by the handler, or not served on the wire at all.
        Command::SessionList(_)
        | Command::HostStatus
        | Command::AgentList
        | Command::Version
        | Command::HostStart(_)
        | Command::HostRelaySet(_)
        | Command::HostShutdown
        | Command::SubscriberAdd(_)
        | Command::SubscriberList
        | Command::SubscriberRemove(_) => Ok(()),
    }
}
