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

use crate::config::{Config, FleetConfig, RelayConfig, RelayTiming};
use crate::instance::LockInfo;
use crate::protocol::envelope::{
    Command, ErrorCode, HistoryFrom, HostRelaySetParams, PairCreateParams, Reply,
    SessionHistoryParams, spec,
};
use crate::protocol::events::{PromptFrom, PromptVia};
use crate::protocol::replies::{
    Deleted, HistoryEntry, HistoryPage, PermissionList, QueueCleared, QueueOrder, RunList,
    SessionCreated, SessionDetail, SessionForkedReply, SessionRenamed,
};
use crate::protocol::scope::Scope;
use crate::seal::pairs::{NewPairing, PairListReply, PairRegistry, PairRevokeReply};
use crate::session::{DEFAULT_HISTORY_LIMIT, NewSession, SessionManager};
use crate::store::{DEFAULT_SESSION_PAGE, SessionQuery, StoredEvent};

use crate::subscribers::Subscribers;

pub use access::{Access, Caller, Via};
use errors::{pair_error, session_error, subscriber_error};

/// What the host's relay client offers the request layer (`host.status`, `host.relay.set`).
pub trait RelayControl: Send + Sync {
    fn status(&self) -> Value;
    fn set(&self, config: Option<RelayConfig>);
    /// Whether a configuration could be dialed at all.
    fn check(&self, config: &RelayConfig) -> Result<(), String>;
}

/// What the host's fleet client offers the request layer (`host.status`, reloads of
/// `[fleet]`).
pub trait FleetControl: Send + Sync {
    fn status(&self) -> Value;
    fn set(&self, config: Option<FleetConfig>);
    /// Whether a configuration could be dialed at all.
    fn check(&self, config: &FleetConfig) -> Result<(), String>;
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
    /// Set once the reload task runs (it needs the relay): `host.reload`, and the running
    /// configuration a reload replaces (`agent.list`).
    reloader: Arc<OnceLock<crate::reload::Reloader>>,
    /// Set once the host runs its pairing registry: `pair.*`, and for the relay client the
    /// paired bots, pending pairings and revocations ([`Handler::pairs`]).
    pairs: Arc<OnceLock<PairRegistry>>,
    /// Set once the fleet client runs: `host.status` `fleet`.
    fleet: Arc<OnceLock<Arc<dyn FleetControl>>>,
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
            reloader: Arc::new(OnceLock::new()),
            pairs: Arc::new(OnceLock::new()),
            fleet: Arc::new(OnceLock::new()),
        }
    }

    /// The fleet client, for `host.status`.
    pub fn set_fleet(&self, fleet: Arc<dyn FleetControl>) {
        let _already = self.fleet.set(fleet);
    }

    /// The pairing registry, for `pair.*` and the relay client.
    pub fn set_pairs(&self, pairs: PairRegistry) {
        let _already = self.pairs.set(pairs);
    }

    /// The host's pairings: what the relay client checks a bot's handshake against.
    pub fn pairs(&self) -> Option<&PairRegistry> {
        self.pairs.get()
    }

    fn registry(&self) -> Result<&PairRegistry, Reply> {
        self.pairs.get().ok_or_else(|| {
            Reply::error(
                ErrorCode::Internal,
                "this host keeps no pairings",
                Value::Null,
            )
        })
    }

    /// `pair.create`: a code naming where bots reach this host's relay now.
    async fn pair_create(&self, p: PairCreateParams) -> Result<Reply, Reply> {
        let registry = self.registry()?;
        let made = registry
            .create(NewPairing {
                scope: p.scope.unwrap_or_default(),
                ttl: std::time::Duration::from_secs(u64::from(p.ttl_s)),
                name: p.name,
                relay_urls: bot_relay_urls(&self.config()),
            })
            .await
            .map_err(pair_error)?;
        Ok(Reply::ok(made))
    }

    /// The reload task, for `host.reload` and the running configuration.
    pub fn set_reloader(&self, reloader: crate::reload::Reloader) {
        let _already = self.reloader.set(reloader);
    }

    /// The configuration running now: the last reload's, else the start's.
    fn config(&self) -> Arc<Config> {
        self.reloader
            .get()
            .map_or_else(|| self.config.clone(), crate::reload::Reloader::config)
    }

    /// The relay client, for `host.status` and `host.relay.set`.
    pub fn set_relay(&self, relay: Arc<dyn RelayControl>) {
        let _already = self.relay.set(relay);
    }

    /// A session the caller created joins its scope: for this connection at once, and for a
    /// loopback subscriber's or a paired bot's later connections through its stored scope.
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
        if let Via::Bot { bot_id } = &caller.via
            && caller.access.scope().sessions.is_some()
            && let Some(pairs) = self.pairs.get()
            && let Err(e) = pairs.extend_scope(bot_id, session_id).await
        {
            tracing::warn!(error = %e, bot_id, "a created session could not be saved in the bot's scope");
        }
    }

    /// Who a prompt of `caller` is from (`user.text` `from`): its transport, and for a
    /// loopback client its subscriber and the label that subscriber was added with.
    async fn sender(&self, caller: &Caller) -> PromptFrom {
        match &caller.via {
            Via::Ipc => PromptFrom {
                via: PromptVia::Ipc,
                subscriber_id: None,
                client: None,
            },
            Via::Loopback { subscriber_id } => PromptFrom {
                via: PromptVia::Ws,
                client: self.subscribers.client_of(subscriber_id).await,
                subscriber_id: Some(subscriber_id.clone()),
            },
            Via::Relay => PromptFrom {
                via: PromptVia::Relay,
                subscriber_id: None,
                client: None,
            },
            // A paired bot through the fleet: its subscriber row, labelled with its name.
            Via::Bot { bot_id } => {
                let subscriber_id = access::bot_subscriber_id(bot_id);
                PromptFrom {
                    via: PromptVia::Relay,
                    client: self.subscribers.client_of(&subscriber_id).await,
                    subscriber_id: Some(subscriber_id),
                }
            }
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
            Command::AgentList => Reply::ok(crate::adapter::agents_report(&self.config()).await),
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
                status["limits"] = json!(crate::limits::current());
                if let Some(relay) = self.relay.get() {
                    status["relay"] = relay.status();
                }
                status["fleet"] = self
                    .fleet
                    .get()
                    .map_or_else(|| json!({"state": "disabled"}), |fleet| fleet.status());
                status["log_path"] = json!(self.config.log_path().display().to_string());
                if let Some(reloader) = self.reloader.get() {
                    status["config"] = json!(reloader.status());
                }
                Reply::ok(status)
            }
            Command::HostReload => match self.reloader.get() {
                None => Reply::error(
                    ErrorCode::Internal,
                    "this host does not reload its configuration",
                    Value::Null,
                ),
                Some(reloader) => match reloader.reload().await {
                    Ok(report) => Reply::ok(report),
                    Err(message) => Reply::error(
                        ErrorCode::ConfigInvalid,
                        message,
                        json!({"path": self.config.config_path().display().to_string()}),
                    ),
                },
            },
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
                        options: p.options(),
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
                let queue = self
                    .sessions
                    .queue(&p.session_id)
                    .await
                    .map_err(session_error)?;
                let permission_rules = self
                    .sessions
                    .permission_rules(&p.session_id)
                    .await
                    .map_err(session_error)?;
                Reply::ok(SessionDetail {
                    session,
                    live,
                    queue,
                    permission_rules,
                })
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
            Command::SessionDiscover(p) => Reply::ok(
                self.sessions
                    .discover(p.agent_type, p.cwd)
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionImport(p) => {
                let options = p.options();
                let row = self
                    .sessions
                    .import_with(p.agent_type, p.native_session_id, p.cwd, p.title, options)
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
                    .send_with(
                        &p.session_id,
                        p.text,
                        p.client_msg_id,
                        Some(self.sender(caller).await),
                        p.attachments,
                    )
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionSetModel(p) => Reply::ok(
                self.sessions
                    .set_model(&p.session_id, p.model)
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionCancel(p) => Reply::ok(
                self.sessions
                    .cancel(&p.session_id, p.run_id)
                    .await
                    .map_err(session_error)?,
            ),
            Command::SessionSteer(p) if !p.attachments.is_empty() => {
                return Err(session_error(crate::session::SessionError::InvalidParams(
                    "a steer takes text only; send attachments with session.send".to_owned(),
                )));
            }
            Command::SessionSteer(p) => Reply::ok(
                self.sessions
                    .steer_from(
                        &p.session_id,
                        p.text,
                        p.client_msg_id,
                        Some(self.sender(caller).await),
                    )
                    .await
                    .map_err(session_error)?,
            ),
            Command::QueueEdit(p) => Reply::ok(
                self.sessions
                    .queue_edit(&p.session_id, p.run_id, p.text)
                    .await
                    .map_err(session_error)?,
            ),
            Command::QueueMove(p) => {
                let position = usize::try_from(p.position).unwrap_or(usize::MAX);
                let queue = self
                    .sessions
                    .queue_move(&p.session_id, p.run_id, position)
                    .await
                    .map_err(session_error)?;
                Reply::ok(QueueOrder { queue })
            }
            Command::QueueRemove(p) => Reply::ok(
                self.sessions
                    .queue_remove(&p.session_id, p.run_id)
                    .await
                    .map_err(session_error)?,
            ),
            Command::QueueClear(p) => {
                let removed = self
                    .sessions
                    .queue_clear(&p.session_id)
                    .await
                    .map_err(session_error)?;
                Reply::ok(QueueCleared { removed })
            }
            Command::PermissionRespond(p) => Reply::ok(
                self.sessions
                    .respond_permission(
                        &p.session_id,
                        p.request_id,
                        p.answer,
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
                    .renew(&p.subscriber_id)
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
            Command::SessionSearch(p) => self.search(access, p).await?,
            Command::SessionExport(p) => Reply::ok(
                crate::export::export(&self.sessions, p)
                    .await
                    .map_err(session_error)?,
            ),
            Command::PairCreate(p) => self.pair_create(p).await?,
            Command::PairList => Reply::ok(PairListReply {
                bots: self.registry()?.list().await.map_err(pair_error)?,
            }),
            Command::PairRevoke(p) => {
                let bot = self.registry()?.revoke(&p.bot).await.map_err(pair_error)?;
                Reply::ok(PairRevokeReply {
                    bot_id: bot.bot_id,
                    revoked: true,
                })
            }
        })
    }

    /// `session.search`: in the named session, else in every session the caller's scope holds.
    async fn search(
        &self,
        access: &Access,
        p: crate::protocol::envelope::SessionSearchParams,
    ) -> Result<Reply, Reply> {
        let sessions = match p.session_id {
            Some(id) => {
                self.sessions.get(&id).await.map_err(session_error)?;
                Some(vec![id])
            }
            None => access.sessions(),
        };
        let query = crate::store::SearchQuery {
            query: p.query.clone(),
            syntax: p.syntax,
            sessions,
            limit: p.limit.unwrap_or(crate::store::DEFAULT_SEARCH_LIMIT),
        };
        let hits = self
            .sessions
            .store()
            .search(query)
            .await
            .map_err(|e| match e {
                crate::store::StoreError::BadQuery(why) => {
                    session_error(crate::session::SessionError::InvalidParams(why))
                }
                other => session_error(other.into()),
            })?;
        Ok(Reply::ok(json!({"query": p.query, "hits": hits})))
    }

    async fn history(&self, p: SessionHistoryParams) -> Reply {
        let limit = p.limit.unwrap_or(DEFAULT_HISTORY_LIMIT);
        match self.sessions.history(&p.session_id, p.from, limit).await {
            Ok((events, has_more)) => {
                // Each cursor names the page's own end; an empty page hands back the one given
                // (going forwards, 0 stands for "the start": nothing is skipped from there).
                let (after, before) = match p.from {
                    HistoryFrom::After(after) => (after, None),
                    HistoryFrom::Before(before) => (0, Some(before)),
                };
                let next_after_seq = events.last().map_or(after, |e| e.sequence_id);
                let next_before_seq = events.first().map(|e| e.sequence_id).or(before);
                let count = events.len();
                Reply::ok(HistoryPage {
                    session_id: p.session_id,
                    events: events.into_iter().map(history_entry).collect(),
                    count,
                    next_after_seq,
                    next_before_seq,
                    has_more,
                })
            }
            Err(e) => session_error(e),
        }
    }
}

/// Where a bot dials the relay, for its pairing code: the fleet's bot URLs (`[fleet]
/// bot_urls`, else its URLs at `/bot`); without a fleet, the relay the host dials, at its
/// `/bot` endpoint where the host's URL ends in `/host` (the reference relay serves both,
/// `docs/relay.md`), else that URL as it is. Neither: none (the code still pairs a bot that
/// knows its relay).
fn bot_relay_urls(config: &Config) -> Vec<String> {
    if let Some(fleet) = &config.fleet {
        let urls = fleet.bot_urls();
        if !urls.is_empty() {
            return urls;
        }
    }
    config
        .relay
        .as_ref()
        .map(|r| crate::config::host_to_bot(&r.url))
        .into_iter()
        .collect()
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

/// Options that act for whoever answers permissions: a stdio MCP server runs a command of the
/// creator's choice, and a permission mode other than `ask` approves the agent's edits (or
/// everything) without asking. Either needs the `permissions` right as well as
/// `create_sessions`.
fn options_in_scope(
    access: &access::Access,
    mcp_servers: &[crate::protocol::options::McpServer],
    permission_mode: Option<crate::protocol::options::PermissionMode>,
) -> Result<(), Reply> {
    let scope = access.scope();
    if mcp_servers
        .iter()
        .any(|s| s.transport() == crate::protocol::options::McpTransport::Stdio)
    {
        access.allows(
            scope.permissions,
            "stdio MCP servers (they run commands; it needs the permissions right)",
        )?;
    }
    if permission_mode.is_some_and(|m| m != crate::protocol::options::PermissionMode::Ask) {
        access.allows(
            scope.permissions,
            "a permission mode other than ask (it approves without asking; it needs the \
             permissions right)",
        )?;
    }
    Ok(())
}

/// The scope rule, for every command: which session it touches and which right it needs. A
/// session outside the scope is refused before anyone looks it up (its existence is not told).
fn authorize(caller: &Caller, command: &Command) -> Result<(), Reply> {
    let access = &caller.access;
    let scope = access.scope();
    match command {
        Command::SessionCreate(p) => {
            access.allows(scope.create_sessions, "creating sessions")?;
            options_in_scope(access, &p.mcp_servers, p.permission_mode)
        }
        // An import brings any agent session on the machine under the host: only for a scope
        // over every session.
        // What the agents keep of a cwd (any session on the machine, prompts included), to
        // import from: as for an import.
        Command::SessionDiscover(_) => {
            access.allows(scope.create_sessions, "creating sessions")?;
            access.allows(
                scope.sessions.is_none(),
                "listing agent sessions (a scope limited to some sessions)",
            )
        }
        Command::SessionImport(p) => {
            access.allows(scope.create_sessions, "creating sessions")?;
            access.allows(
                scope.sessions.is_none(),
                "importing sessions (a scope limited to some sessions)",
            )?;
            options_in_scope(access, &p.mcp_servers, p.permission_mode)
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
        Command::SessionSteer(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "prompts")
        }
        // The model a session's prompts run on is the prompter's to choose.
        Command::SessionSetModel(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "prompts")
        }
        Command::QueueEdit(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "prompts")
        }
        Command::QueueMove(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "prompts")
        }
        Command::QueueRemove(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "prompts")
        }
        Command::QueueClear(p) => {
            access.session(&p.session_id)?;
            access.allows(scope.prompt, "prompts")
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
        // Reading, as history is: a named session must be in scope; without one, the search
        // runs over the scope's sessions only (the handler passes them).
        Command::SessionSearch(p) => p
            .session_id
            .as_deref()
            .map_or(Ok(()), |id| access.session(id)),
        Command::SessionExport(p) => access.session(&p.session_id),
        // A wire client renews its own grant only.
        Command::SubscriberGrant(p) => match &caller.via {
            Via::Ipc => Ok(()),
            Via::Loopback { subscriber_id } if *subscriber_id == p.subscriber_id => Ok(()),
            Via::Loopback { .. } | Via::Relay | Via::Bot { .. } => Err(Reply::error(
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
        | Command::HostReload
        | Command::HostShutdown
        | Command::SubscriberAdd(_)
        | Command::SubscriberList
        | Command::SubscriberRemove(_)
        | Command::PairCreate(_)
        | Command::PairList
        | Command::PairRevoke(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::Bus;
    use crate::protocol::events::{Event, EventBody, UserText};
    use crate::store::Store;

    /// A handler over a fresh store, as the host wires one (no agents).
    struct World {
        handler: Handler,
        bus: Bus,
        store: Store,
        dir: tempfile::TempDir,
        _threads: crate::store::StoreThreads,
        _tasks: crate::bus::BusTasks,
    }

    async fn world() -> World {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let (bus, tasks) = Bus::start(store.clone()).await.unwrap();
        let sessions = SessionManager::new(
            store.clone(),
            bus.clone(),
            Arc::new(crate::session::NoAgents),
        );
        let grants = Arc::new(crate::subscribers::GrantStore::new(
            crate::clock::Clock::system(),
        ));
        let subscribers = Subscribers::new(store.clone(), bus.clone(), sessions.clone(), grants, 1);
        let info = LockInfo {
            pid: 1,
            version: "t".into(),
            ipc_path: "t".into(),
            ws_port: None,
            started_at: "t".into(),
        };
        let config = Arc::new(Config::with_home("/nonexistent").unwrap());
        let handler = Handler::new(
            sessions,
            subscribers,
            info,
            config,
            CancellationToken::new(),
        );
        World {
            handler,
            bus,
            store,
            dir,
            _threads: threads,
            _tasks: tasks,
        }
    }

    impl World {
        /// One request as a transport serves it: parsed at the edge, then handled.
        async fn call(&self, command: &str, params: Value) -> Reply {
            match Command::parse_named(command, params) {
                Ok(command) => self.handler.handle(&Caller::ipc(), command).await,
                Err(refused) => refused.into_reply(),
            }
        }

        async fn session_with(&self, prompts: usize) -> (String, Vec<i64>) {
            let cwd = self.dir.path().display().to_string();
            let created = self
                .call(
                    "session.create",
                    json!({"agent_type": "claude", "cwd": cwd}),
                )
                .await;
            let session: SessionCreated = created.data_as().unwrap();
            let mut seqs = Vec::new();
            for n in 0..prompts {
                let event = Event::new(
                    &session.session_id,
                    None,
                    EventBody::UserText(UserText {
                        text: format!("prompt {n}"),
                        client_msg_id: None,
                        steer: false,
                        from: None,
                        imported: false,
                        attachments: Vec::new(),
                    }),
                );
                let seq = self
                    .bus
                    .publish(&event)
                    .await
                    .unwrap()
                    .committed()
                    .await
                    .unwrap()
                    .unwrap();
                seqs.push(seq);
            }
            (session.session_id, seqs)
        }
    }

    /// A prompt says who sent it: the transport, and for a loopback client its subscriber and
    /// the label it was added with (kept by a renewed grant).
    #[tokio::test]
    async fn a_prompts_sender_comes_from_its_caller() {
        let world = world().await;
        let added = world
            .call("subscriber.add", json!({"type": "local", "client": "web"}))
            .await;
        let web: crate::protocol::replies::Grant = added.data_as().unwrap();
        let plain: crate::protocol::replies::Grant = world
            .call("subscriber.add", json!({"type": "local"}))
            .await
            .data_as()
            .unwrap();
        let renewed = world
            .call(
                "subscriber.grant",
                json!({"subscriber_id": web.subscriber_id}),
            )
            .await;
        assert!(renewed.is_ok(), "{renewed:?}");
        let refused = world
            .call(
                "subscriber.add",
                json!({"type": "local", "client": "Web UI"}),
            )
            .await;
        assert_eq!(refused.error_code(), Some(ErrorCode::InvalidParams));
        let loopback = |id: &str| Caller {
            via: Via::Loopback {
                subscriber_id: id.to_owned(),
            },
            access: Access::new(Scope::all()),
        };
        let relay = Caller {
            via: Via::Relay,
            access: Access::new(Scope::all()),
        };
        let as_json = |from: PromptFrom| serde_json::to_value(from).unwrap();
        let h = &world.handler;
        assert_eq!(
            as_json(h.sender(&Caller::ipc()).await),
            json!({"via": "ipc"})
        );
        assert_eq!(as_json(h.sender(&relay).await), json!({"via": "relay"}));
        // A paired bot: relay, with its subscriber row (no row yet: no label).
        let bot = Caller {
            via: Via::Bot {
                bot_id: "b0".to_owned(),
            },
            access: Access::new(Scope::all()),
        };
        assert_eq!(
            as_json(h.sender(&bot).await),
            json!({"via": "relay", "subscriberId": "bot-b0"})
        );
        assert_eq!(bot.by(), "bot-b0");
        assert_eq!(
            as_json(h.sender(&loopback(&web.subscriber_id)).await),
            json!({"via": "ws", "subscriberId": web.subscriber_id, "client": "web"})
        );
        assert_eq!(
            as_json(h.sender(&loopback(&plain.subscriber_id)).await),
            json!({"via": "ws", "subscriberId": plain.subscriber_id})
        );
        assert_eq!(
            as_json(h.sender(&loopback("gone")).await),
            json!({"via": "ws", "subscriberId": "gone"})
        );
    }

    #[tokio::test]
    async fn history_refuses_after_seq_with_before_seq() {
        let w = world().await;
        let (session, _) = w.session_with(2).await;
        for sid in [session.as_str(), "no-such-session"] {
            let reply = w
                .call(
                    "session.history",
                    json!({"session_id": sid, "after_seq": 0, "before_seq": 10}),
                )
                .await;
            assert_eq!(
                reply.error_code(),
                Some(ErrorCode::InvalidParams),
                "{reply:?}"
            );
            assert!(
                reply.message.starts_with(
                    "invalid params for session.history: give after_seq or before_seq, not both"
                ),
                "{}",
                reply.message
            );
        }
    }

    #[tokio::test]
    async fn history_pages_backwards_from_the_end() {
        let w = world().await;
        let (session, seqs) = w.session_with(5).await;
        let page = |params: Value| {
            let w = &w;
            async move {
                let reply = w.call("session.history", params).await;
                assert!(reply.is_ok(), "{reply:?}");
                reply.data_as::<HistoryPage>().unwrap()
            }
        };
        let of = |p: &HistoryPage| p.events.iter().map(|e| e.sequence_id).collect::<Vec<_>>();

        // The latest page, as a client opens a long session.
        let last = page(
            json!({"session_id": session, "before_seq": 9_007_199_254_740_991_i64, "limit": 2}),
        )
        .await;
        assert_eq!(of(&last), seqs[3..].to_vec());
        assert!(last.has_more);
        assert_eq!(last.next_before_seq, Some(seqs[3]));
        assert_eq!(last.next_after_seq, seqs[4]);
        assert_eq!(last.count, 2);

        let middle = page(json!({"session_id": session, "before_seq": seqs[3], "limit": 2})).await;
        assert_eq!(of(&middle), seqs[1..3].to_vec());
        assert!(middle.has_more);
        // Exactly the rest: nothing older, and has_more says so.
        let first = page(json!({"session_id": session, "before_seq": seqs[1], "limit": 2})).await;
        assert_eq!(of(&first), vec![seqs[0]]);
        assert!(!first.has_more);
        let exact = page(json!({"session_id": session, "before_seq": seqs[2], "limit": 2})).await;
        assert_eq!(of(&exact), seqs[..2].to_vec());
        assert!(!exact.has_more, "no bracket is older than the first");
        // Past the start: an empty page hands the cursors back.
        let none = page(json!({"session_id": session, "before_seq": seqs[0], "limit": 2})).await;
        assert!(none.events.is_empty());
        assert!(!none.has_more);
        assert_eq!(none.next_before_seq, Some(seqs[0]));
        assert_eq!(none.next_after_seq, 0);

        // Forwards is as before, and names its first event for going back.
        let forward = page(json!({"session_id": session, "limit": 2})).await;
        assert_eq!(of(&forward), seqs[..2].to_vec());
        assert!(forward.has_more);
        assert_eq!(forward.next_after_seq, seqs[1]);
        assert_eq!(forward.next_before_seq, Some(seqs[0]));
        let end = page(json!({"session_id": session, "after_seq": seqs[4]})).await;
        assert!(end.events.is_empty());
        assert_eq!(end.next_after_seq, seqs[4]);
        assert_eq!(end.next_before_seq, None);
        assert!(!end.has_more);
        let wire = serde_json::to_value(&end).unwrap();
        assert_eq!(wire["next_before_seq"], Value::Null, "{wire}");

        let unknown = w
            .call(
                "session.history",
                json!({"session_id": "no-such-session", "before_seq": 10}),
            )
            .await;
        assert_eq!(unknown.error_code(), Some(ErrorCode::SessionNotFound));
    }

    /// Attachments on the wire: a refused path is `attachment_refused` with its path and
    /// reason (checked before anything is taken), an unsupported kind `option_unsupported`,
    /// and a steer takes none.
    #[tokio::test]
    async fn attachments_are_refused_with_their_codes_and_steer_takes_none() {
        let world = world().await;
        let (sid, _) = world.session_with(0).await;
        let send = |attachments: Value| {
            world.call(
                "session.send",
                json!({"session_id": sid, "text": "look", "attachments": attachments}),
            )
        };
        let refused = send(json!([{"path": "../../etc/passwd"}])).await;
        assert_eq!(refused.error_code(), Some(ErrorCode::AttachmentRefused));
        assert_eq!(refused.code, 3010);
        assert_eq!(refused.data["path"], "../../etc/passwd");
        assert_eq!(refused.data["reason"], "parent_dir");
        let outside = send(json!([{"path": "/dev/zero"}])).await;
        assert_eq!(outside.data["reason"], "outside_workspace", "{outside:?}");
        let bad = send(json!([{"data_base64": "%%%", "mime": "image/png"}])).await;
        assert_eq!(bad.error_code(), Some(ErrorCode::InvalidParams), "{bad:?}");
        // This host's agents (none) take no images.
        let image = send(json!([{"data_base64": "iVBORw0KGgo=", "mime": "image/png"}])).await;
        assert_eq!(
            image.error_code(),
            Some(ErrorCode::OptionUnsupported),
            "{image:?}"
        );
        assert_eq!(image.data["option"], "attachments.image");
        assert_eq!(image.data["agent_type"], "claude");
        let unknown = send(json!([{"url": "x"}])).await;
        assert_eq!(unknown.error_code(), Some(ErrorCode::InvalidParams));
        let steer = world
            .call(
                "session.steer",
                json!({"session_id": sid, "text": "and", "attachments": [{"path": "a.png"}]}),
            )
            .await;
        assert_eq!(steer.error_code(), Some(ErrorCode::InvalidParams));
        assert!(
            steer.message.contains("a steer takes text only"),
            "{steer:?}"
        );
    }

    /// Session options over the request layer: parsed from the wire's params, refused with
    /// their own codes (`option_unsupported` naming the option, `bypass_not_allowed`,
    /// `invalid_params` for a bad value), and nothing created.
    #[tokio::test]
    async fn session_options_are_refused_with_their_codes() {
        let w = world().await;
        let cwd = w.dir.path().display().to_string();
        let create = |extra: Value| {
            let mut params = json!({"agent_type": "claude", "cwd": cwd});
            for (k, v) in extra.as_object().unwrap() {
                params[k] = v.clone();
            }
            w.call("session.create", params)
        };
        // No family of this host takes a model (it runs no agents).
        let refused = create(json!({"model": "claude-sonnet-4-5"})).await;
        assert_eq!(refused.error_code(), Some(ErrorCode::OptionUnsupported));
        assert_eq!(refused.data["option"], "model", "{refused:?}");
        assert_eq!(refused.data["agent_type"], "claude");
        assert!(refused.data["reason"].is_string());
        let stdio = json!([{"type": "stdio", "name": "probe", "command": "node"}]);
        let refused = create(json!({"mcp_servers": stdio})).await;
        assert_eq!(refused.data["option"], "mcp_servers", "{refused:?}");
        let bypass = create(json!({"permission_mode": "bypass"})).await;
        assert_eq!(bypass.error_code(), Some(ErrorCode::BypassNotAllowed));
        for bad in [
            json!({"model": "two words"}),
            json!({"system_prompt": ""}),
            json!({"permission_mode": "yolo"}),
            json!({"mcp_servers": [{"type": "ftp", "name": "x", "url": "ftp://h"}]}),
            json!({"mcp_servers": [{"type": "stdio", "name": "x", "command": "n", "extra": 1}]}),
            json!({"mcp_servers": [{"type": "http", "name": "x", "url": "h.example"}]}),
        ] {
            let reply = create(bad.clone()).await;
            assert_eq!(
                reply.error_code(),
                Some(ErrorCode::InvalidParams),
                "{bad}: {reply:?}"
            );
        }
        let none: crate::protocol::replies::SessionPage =
            w.call("session.list", json!({})).await.data_as().unwrap();
        assert!(none.sessions.is_empty());
        // `ask` is every family's; the options are on the row.
        let made = create(json!({"permission_mode": "ask"})).await;
        let made: SessionCreated = made.data_as().unwrap();
        assert_eq!(
            made.session.options.permission_mode,
            Some(crate::protocol::options::PermissionMode::Ask)
        );
        let got = w
            .call("session.get", json!({"session_id": made.session_id}))
            .await;
        assert_eq!(got.data["options"]["permission_mode"], "ask", "{got:?}");
        let set = w
            .call(
                "session.set_model",
                json!({"session_id": made.session_id, "model": "m2"}),
            )
            .await;
        assert_eq!(
            set.error_code(),
            Some(ErrorCode::OptionUnsupported),
            "{set:?}"
        );
        let set = w
            .call(
                "session.set_model",
                json!({"session_id": made.session_id, "model": "-x"}),
            )
            .await;
        assert_eq!(set.error_code(), Some(ErrorCode::InvalidParams), "{set:?}");
    }

    /// A stdio MCP server runs a command and a permission mode other than `ask` approves
    /// without asking: creating or importing with either needs the permissions right too.
    #[test]
    fn options_that_act_for_the_permission_answerer_need_its_right() {
        let caller = |permissions: bool| Caller {
            via: Via::Relay,
            access: access::Access::new(Scope {
                sessions: None,
                prompt: true,
                permissions,
                create_sessions: true,
            }),
        };
        let create = |extra: Value| {
            let mut params = json!({"agent_type": "claude", "cwd": "/tmp"});
            if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
                p.extend(e.clone());
            }
            Command::parse_named("session.create", params.clone()).unwrap()
        };
        let import = |extra: Value| {
            let mut params =
                json!({"agent_type": "claude", "cwd": "/tmp", "native_session_id": "n"});
            if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
                p.extend(e.clone());
            }
            Command::parse_named("session.import", params.clone()).unwrap()
        };
        let stdio = json!({"mcp_servers": [{"type": "stdio", "name": "p", "command": "node"}]});
        let http =
            json!({"mcp_servers": [{"type": "http", "name": "w", "url": "http://127.0.0.1:1/"}]});
        for (extra, needs) in [
            (json!({}), false),
            (json!({"permission_mode": "ask"}), false),
            (http, false),
            (json!({"model": "m"}), false),
            (stdio, true),
            (json!({"permission_mode": "accept_edits"}), true),
            (json!({"permission_mode": "bypass"}), true),
        ] {
            for command in [create(extra.clone()), import(extra.clone())] {
                authorize(&caller(true), &command).unwrap();
                let refused = authorize(&caller(false), &command);
                if needs {
                    let reply = refused.unwrap_err();
                    assert_eq!(reply.error_code(), Some(ErrorCode::OutOfScope), "{extra}");
                } else {
                    assert!(refused.is_ok(), "{extra}");
                }
            }
        }
    }

    /// MCP env and header values are the creator's secrets: a reply names them, never shows
    /// them; the store keeps them for the agent.
    #[tokio::test]
    async fn mcp_secrets_are_redacted_in_replies_and_kept_in_the_store() {
        use crate::protocol::options::{EnvVar, Header, McpServer, SessionOptions};
        let world = world().await;
        let options = SessionOptions {
            mcp_servers: vec![
                McpServer::Stdio {
                    name: "probe".into(),
                    command: "node".into(),
                    args: vec!["probe.mjs".into()],
                    env: vec![EnvVar {
                        name: "TOKEN".into(),
                        value: "env-secret-1".into(),
                    }],
                },
                McpServer::Http {
                    name: "web".into(),
                    url: "http://127.0.0.1:1/mcp".into(),
                    headers: vec![Header {
                        name: "Authorization".into(),
                        value: "Bearer header-secret-2".into(),
                    }],
                },
            ],
            ..Default::default()
        };
        let now = crate::store::now_ms();
        world
            .store
            .insert_session(crate::store::SessionRow {
                session_id: "s-secret".into(),
                agent_type: "claude".into(),
                native_session_id: None,
                cwd: "/w".into(),
                parent_session_id: None,
                title: None,
                state: crate::protocol::states::SessionState::Idle,
                created_at_ms: now,
                updated_at_ms: now,
                fork_of: None,
                options: options.clone(),
                binding: None,
            })
            .await
            .unwrap();
        for (command, params) in [
            ("session.get", json!({"session_id": "s-secret"})),
            ("session.list", json!({})),
        ] {
            let reply = world.call(command, params).await;
            assert!(reply.is_ok(), "{reply:?}");
            let text = serde_json::to_string(&reply).unwrap();
            assert!(!text.contains("env-secret-1"), "{text}");
            assert!(!text.contains("header-secret-2"), "{text}");
            assert!(
                text.contains("TOKEN") && text.contains("Authorization"),
                "{text}"
            );
            assert!(text.contains(crate::protocol::replies::REDACTED), "{text}");
        }
        let stored = world
            .store
            .get_session("s-secret".into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.options, options);
        let updated = SessionOptions {
            model: Some("m2".into()),
            ..options.clone()
        };
        world
            .store
            .set_session_options("s-secret".into(), updated.clone())
            .await
            .unwrap();
        let stored = world
            .store
            .get_session("s-secret".into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.options, updated);
    }
}
