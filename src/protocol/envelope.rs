//! The command envelope (design §4): `{"command": "<noun.verb>", "params": {…}}` in, one line of
//! `{"code", "message", "data"}` out.
//!
//! Parsing happens here, once: raw bytes become a typed [`Command`] or a [`RequestError`] with
//! a stable [`ErrorCode`]. Nothing after this file matches on command strings. The command table
//! ([`COMMANDS`]) is the one place that says which commands exist, how each is routed and what
//! its params are; `--help` and `docs/commands.md` are written from it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Every non-zero reply code. Numbers are stable and grouped by the hundreds digit block:
/// 1xxx request, 2xxx host state, 3xxx session, 4xxx agent, 5xxx subscriber and paired bot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidJson,
    InvalidEnvelope,
    MissingCommand,
    UnknownCommand,
    InvalidParams,
    RequestTooLarge,
    RequestTimeout,
    EmptyRequest,
    InvalidEncoding,
    WrongRoute,
    InvalidFrame,
    UnknownCmd,
    FrameTooLarge,
    HelloRequired,
    OutOfScope,
    PeerRefused,
    AlreadyRunning,
    HostNotRunning,
    HostStartFailed,
    ShuttingDown,
    HostUnresponsive,
    StoreFailed,
    Internal,
    HomeUnusable,
    StoreUnavailable,
    StoreCorrupt,
    InstallIncomplete,
    ChecksFailed,
    ServiceFailed,
    ConfigInvalid,
    SessionNotFound,
    CwdNotFound,
    RunNotFound,
    PermissionNotFound,
    AlreadyResolved,
    NotQueued,
    SteerPending,
    OptionUnsupported,
    BypassNotAllowed,
    AttachmentRefused,
    AttachmentTooLarge,
    BindingMismatch,
    UnknownAgentType,
    NoAgent,
    AgentUnavailable,
    ResultDeliveryUnknown,
    SubscriberNotFound,
    BotNotFound,
}

impl ErrorCode {
    /// Every code, in table order.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::InvalidJson,
        ErrorCode::InvalidEnvelope,
        ErrorCode::MissingCommand,
        ErrorCode::UnknownCommand,
        ErrorCode::InvalidParams,
        ErrorCode::RequestTooLarge,
        ErrorCode::RequestTimeout,
        ErrorCode::EmptyRequest,
        ErrorCode::InvalidEncoding,
        ErrorCode::WrongRoute,
        ErrorCode::InvalidFrame,
        ErrorCode::UnknownCmd,
        ErrorCode::FrameTooLarge,
        ErrorCode::HelloRequired,
        ErrorCode::OutOfScope,
        ErrorCode::PeerRefused,
        ErrorCode::AlreadyRunning,
        ErrorCode::HostNotRunning,
        ErrorCode::HostStartFailed,
        ErrorCode::ShuttingDown,
        ErrorCode::HostUnresponsive,
        ErrorCode::StoreFailed,
        ErrorCode::Internal,
        ErrorCode::HomeUnusable,
        ErrorCode::StoreUnavailable,
        ErrorCode::StoreCorrupt,
        ErrorCode::InstallIncomplete,
        ErrorCode::ChecksFailed,
        ErrorCode::ServiceFailed,
        ErrorCode::ConfigInvalid,
        ErrorCode::SessionNotFound,
        ErrorCode::CwdNotFound,
        ErrorCode::RunNotFound,
        ErrorCode::PermissionNotFound,
        ErrorCode::AlreadyResolved,
        ErrorCode::NotQueued,
        ErrorCode::SteerPending,
        ErrorCode::OptionUnsupported,
        ErrorCode::BypassNotAllowed,
        ErrorCode::AttachmentRefused,
        ErrorCode::AttachmentTooLarge,
        ErrorCode::BindingMismatch,
        ErrorCode::UnknownAgentType,
        ErrorCode::NoAgent,
        ErrorCode::AgentUnavailable,
        ErrorCode::ResultDeliveryUnknown,
        ErrorCode::SubscriberNotFound,
        ErrorCode::BotNotFound,
    ];

    /// The stable number carried in `code`.
    pub fn number(self) -> i32 {
        match self {
            ErrorCode::InvalidJson => 1001,
            ErrorCode::InvalidEnvelope => 1002,
            ErrorCode::MissingCommand => 1003,
            ErrorCode::UnknownCommand => 1004,
            ErrorCode::InvalidParams => 1005,
            ErrorCode::RequestTooLarge => 1006,
            ErrorCode::RequestTimeout => 1007,
            ErrorCode::EmptyRequest => 1008,
            ErrorCode::InvalidEncoding => 1009,
            ErrorCode::WrongRoute => 1010,
            ErrorCode::InvalidFrame => 1011,
            ErrorCode::UnknownCmd => 1012,
            ErrorCode::FrameTooLarge => 1013,
            ErrorCode::HelloRequired => 1014,
            ErrorCode::OutOfScope => 1015,
            ErrorCode::PeerRefused => 1016,
            ErrorCode::AlreadyRunning => 2001,
            ErrorCode::HostNotRunning => 2002,
            ErrorCode::HostStartFailed => 2003,
            ErrorCode::ShuttingDown => 2004,
            ErrorCode::HostUnresponsive => 2005,
            ErrorCode::StoreFailed => 2006,
            ErrorCode::Internal => 2007,
            ErrorCode::HomeUnusable => 2008,
            ErrorCode::StoreUnavailable => 2009,
            ErrorCode::StoreCorrupt => 2010,
            ErrorCode::InstallIncomplete => 2011,
            ErrorCode::ChecksFailed => 2012,
            ErrorCode::ServiceFailed => 2013,
            ErrorCode::ConfigInvalid => 2014,
            ErrorCode::SessionNotFound => 3001,
            ErrorCode::CwdNotFound => 3002,
            ErrorCode::RunNotFound => 3003,
            ErrorCode::PermissionNotFound => 3004,
            ErrorCode::AlreadyResolved => 3005,
            ErrorCode::NotQueued => 3006,
            ErrorCode::SteerPending => 3007,
            ErrorCode::OptionUnsupported => 3008,
            ErrorCode::BypassNotAllowed => 3009,
            ErrorCode::AttachmentRefused => 3010,
            ErrorCode::AttachmentTooLarge => 3011,
            ErrorCode::BindingMismatch => 3012,
            ErrorCode::UnknownAgentType => 4001,
            ErrorCode::NoAgent => 4002,
            ErrorCode::AgentUnavailable => 4003,
            ErrorCode::ResultDeliveryUnknown => 4004,
            ErrorCode::SubscriberNotFound => 5001,
            ErrorCode::BotNotFound => 5002,
        }
    }

    /// The stable name carried in `data.error`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::InvalidEnvelope => "invalid_envelope",
            ErrorCode::MissingCommand => "missing_command",
            ErrorCode::UnknownCommand => "unknown_command",
            ErrorCode::InvalidParams => "invalid_params",
            ErrorCode::RequestTooLarge => "request_too_large",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::EmptyRequest => "empty_request",
            ErrorCode::InvalidEncoding => "invalid_encoding",
            ErrorCode::WrongRoute => "wrong_route",
            ErrorCode::InvalidFrame => "invalid_frame",
            ErrorCode::UnknownCmd => "unknown_cmd",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::HelloRequired => "hello_required",
            ErrorCode::OutOfScope => "out_of_scope",
            ErrorCode::PeerRefused => "peer_refused",
            ErrorCode::AlreadyRunning => "already_running",
            ErrorCode::HostNotRunning => "host_not_running",
            ErrorCode::HostStartFailed => "host_start_failed",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::HostUnresponsive => "host_unresponsive",
            ErrorCode::StoreFailed => "store_failed",
            ErrorCode::Internal => "internal",
            ErrorCode::HomeUnusable => "home_unusable",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::StoreCorrupt => "store_corrupt",
            ErrorCode::InstallIncomplete => "install_incomplete",
            ErrorCode::ChecksFailed => "checks_failed",
            ErrorCode::ServiceFailed => "service_failed",
            ErrorCode::ConfigInvalid => "config_invalid",
            ErrorCode::SessionNotFound => "session_not_found",
            ErrorCode::CwdNotFound => "cwd_not_found",
            ErrorCode::RunNotFound => "run_not_found",
            ErrorCode::PermissionNotFound => "permission_not_found",
            ErrorCode::AlreadyResolved => "already_resolved",
            ErrorCode::NotQueued => "not_queued",
            ErrorCode::SteerPending => "steer_pending",
            ErrorCode::OptionUnsupported => "option_unsupported",
            ErrorCode::BypassNotAllowed => "bypass_not_allowed",
            ErrorCode::AttachmentRefused => "attachment_refused",
            ErrorCode::AttachmentTooLarge => "attachment_too_large",
            ErrorCode::BindingMismatch => "binding_mismatch",
            ErrorCode::UnknownAgentType => "unknown_agent_type",
            ErrorCode::NoAgent => "no_agent",
            ErrorCode::AgentUnavailable => "agent_unavailable",
            ErrorCode::ResultDeliveryUnknown => "result_delivery_unknown",
            ErrorCode::SubscriberNotFound => "subscriber_not_found",
            ErrorCode::BotNotFound => "bot_not_found",
        }
    }

    /// One sentence for the docs table.
    pub fn meaning(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "the request is not one valid JSON value",
            ErrorCode::InvalidEnvelope => {
                "the JSON is not an object of `command` and `params` (wrong type or extra keys)"
            }
            ErrorCode::MissingCommand => "the object has no `command`",
            ErrorCode::UnknownCommand => "no command of that name",
            ErrorCode::InvalidParams => "params missing, of the wrong type, or with unknown fields",
            ErrorCode::RequestTooLarge => "the request line exceeds the size limit (1 MiB)",
            ErrorCode::RequestTimeout => "no complete request line within the time limit (5 s)",
            ErrorCode::EmptyRequest => "the connection sent an empty line or closed without one",
            ErrorCode::InvalidEncoding => "the request is not UTF-8",
            ErrorCode::WrongRoute => {
                "the command is not served on this route (e.g. `version` over IPC)"
            }
            ErrorCode::InvalidFrame => {
                "a WebSocket message that is not a valid `Frame`, or whose body does not decode"
            }
            ErrorCode::UnknownCmd => {
                "a `Frame` whose `cmd` is unknown or not one a client may send"
            }
            ErrorCode::FrameTooLarge => "a WebSocket message over 1 MiB; the connection is closed",
            ErrorCode::HelloRequired => "the first frame of a connection must be `Hello`",
            ErrorCode::OutOfScope => {
                "the connection's scope (the relay token's) does not allow this request or session"
            }
            ErrorCode::PeerRefused => {
                "the Unix socket's peer runs as another user than the host: each user's host \
                 serves that user only (the request was read and not handled; `ws.sock` \
                 answers 403 with a reason starting `peer_refused:`)"
            }
            ErrorCode::AlreadyRunning => "a host already holds the lock; `data.pid` is its pid",
            ErrorCode::HostNotRunning => "the command needs a live host and none answers",
            ErrorCode::HostStartFailed => "the host process did not come up; see `logs/`",
            ErrorCode::ShuttingDown => "the host is shutting down and takes no new work",
            ErrorCode::HostUnresponsive => "a host holds the lock but does not answer on IPC",
            ErrorCode::StoreFailed => "the SQLite store failed; nothing was half-applied",
            ErrorCode::Internal => "a bug: an invariant of the host broke",
            ErrorCode::HomeUnusable => "`$AGENT_HOST_HOME` cannot be created or used",
            ErrorCode::StoreUnavailable => {
                "the store cannot commit now (a full disk, an I/O error): no new prompt, session or \
                 permission answer is taken; `host.status` shows `store`, and it recovers by itself"
            }
            ErrorCode::StoreCorrupt => {
                "`host.db` fails SQLite's integrity check; the host refuses to start on it and \
                 never writes it: `data.path` names the file; move it aside or recover it"
            }
            ErrorCode::InstallIncomplete => {
                "`agent-hostd`, the full binary, is not beside `agent-host`: build or install both"
            }
            ErrorCode::ChecksFailed => {
                "`doctor`: at least one check failed; `data.checks` says which, and what to do"
            }
            ErrorCode::ServiceFailed => {
                "`service`: the unit could not be written or removed (a file `service install` did \
                 not write is never overwritten or removed); `data.path` names it"
            }
            ErrorCode::ConfigInvalid => {
                "`host.reload`: `config.toml` does not parse or holds a value the host refuses (the \
                 message names the file, and the line when it does not parse); nothing was \
                 applied, the running configuration stays"
            }
            ErrorCode::SessionNotFound => "no session with that id",
            ErrorCode::CwdNotFound => "the `cwd` given does not exist or is not a directory",
            ErrorCode::RunNotFound => "no run with that id in that session",
            ErrorCode::PermissionNotFound => "no permission request with that id in that session",
            ErrorCode::AlreadyResolved => {
                "the permission request was answered already; `data` says how and by whom"
            }
            ErrorCode::NotQueued => {
                "the run is not (or no longer) waiting in the queue: it runs or ran already, or \
                 was removed; `data.run_id` names it and `data.state` says where it is"
            }
            ErrorCode::SteerPending => {
                "an earlier steer of this session still waits for the agent's answer; send this \
                 one again once that one is answered (`data.run_id` names the running run)"
            }
            ErrorCode::OptionUnsupported => {
                "the agent cannot honour an option or attachment kind it was given (`data.option` \
                 names it, `data.agent_type` the agent); nothing was created or sent"
            }
            ErrorCode::BypassNotAllowed => {
                "`permission_mode: \"bypass\"` needs `allow_bypass = true` in `config.toml`"
            }
            ErrorCode::AttachmentRefused => {
                "an attachment path that is not a regular file inside the session's cwd or an \
                 allow-listed directory (`..`, a symlink out, a device); `data.reason` says which"
            }
            ErrorCode::AttachmentTooLarge => {
                "an attachment (or all of a prompt's together) over the size limit; `data.limit` \
                 is the limit in bytes"
            }
            ErrorCode::BindingMismatch => {
                "the native session is not this workspace's: the agent's own records place it \
                 under another cwd (`data.reason` `native_session_elsewhere`)"
            }
            ErrorCode::UnknownAgentType => "no adapter family or registered agent of that name",
            ErrorCode::NoAgent => "no adapter in this build can run this session's agent",
            ErrorCode::AgentUnavailable => {
                "a registered agent's command cannot be found or run (`agent.list` says why)"
            }
            ErrorCode::ResultDeliveryUnknown => {
                "the input was handed to the agent and no answer came: whether it took it is \
                 unknown, so it was not queued either (a `warning` in the run says so)"
            }
            ErrorCode::SubscriberNotFound => "no subscriber with that id",
            ErrorCode::BotNotFound => {
                "no paired bot with that id (`pair.list` lists them); `data.bot_id` names it"
            }
        }
    }

    pub fn from_number(number: i32) -> Option<ErrorCode> {
        ErrorCode::ALL
            .iter()
            .copied()
            .find(|c| c.number() == number)
    }
}

/// The one reply shape. `code` 0 is success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub code: i32,
    pub message: String,
    #[serde(default)]
    pub data: Value,
}

impl Reply {
    pub fn ok(data: impl Serialize) -> Reply {
        Reply {
            code: 0,
            message: "ok".to_owned(),
            data: serde_json::to_value(data).unwrap_or(Value::Null),
        }
    }

    /// An error reply: `data` is `{"error": <name>, …details}`.
    pub fn error(code: ErrorCode, message: impl Into<String>, details: Value) -> Reply {
        let mut data = Map::new();
        data.insert("error".to_owned(), Value::String(code.name().to_owned()));
        if let Value::Object(extra) = details {
            data.extend(extra);
        }
        Reply {
            code: code.number(),
            message: message.into(),
            data: Value::Object(data),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.code == 0
    }

    /// The data of a successful reply as its typed struct ([`super::replies`]).
    pub fn data_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.data)
    }

    /// The error code, if this is a known error reply.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_number(self.code)
    }

    /// Serialize as one line without the trailing newline.
    pub fn to_line(&self) -> String {
        // A Reply holds only strings, numbers and a Value: serializing it cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| {
            format!(
                r#"{{"code":{},"message":"reply not serializable","data":null}}"#,
                ErrorCode::Internal.number()
            )
        })
    }
}

/// A request that was refused before it reached any handler.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub code: ErrorCode,
    pub message: String,
}

impl RequestError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RequestError {
            code,
            message: message.into(),
        }
    }

    pub fn into_reply(self) -> Reply {
        Reply::error(self.code, self.message, Value::Null)
    }
}

/// Where a command runs (design §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Runs in the CLI process without a live host.
    Local,
    /// Forwarded over the Unix socket to the live host.
    Ipc,
    /// IPC when the host answers, else answered from the lock file.
    Hybrid,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Local => "local",
            Route::Ipc => "ipc",
            Route::Hybrid => "hybrid",
        }
    }
}

/// One row of the command table.
#[derive(Debug)]
pub struct CommandSpec {
    pub name: &'static str,
    pub route: Route,
    /// The params, as a short signature.
    pub params: &'static str,
    pub summary: &'static str,
    /// Served over the wire too (the loopback WebSocket and the relay), with the same params,
    /// reply data and codes.
    pub wire: bool,
}

/// The command table: every command, its route, its params. Keep in step with
/// [`Command::parse_named`] (a unit test checks both directions).
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "host.start",
        route: Route::Local,
        params: "{foreground?: bool}",
        summary: "start the host; detaches unless foreground, returns once it answers on IPC",
        wire: false,
    },
    CommandSpec {
        name: "host.status",
        route: Route::Hybrid,
        params: "{}",
        summary: "{running, pid, version, ipc_path, ws_port, started_at, sessions, store: {state, error, since}, limits: {open_files: {soft, hard}}, log_path, config: {path, reloads, last_reload_at, last_error}, relay: {state, url, since_ms, retries, last_error, retry_in_ms, subscriber_id}, fleet: {state, url, instance, host_id, since_ms, last_round_trip_at_ms, round_trip_ms, channels, retries, last_error, retry_in_ms, relays: [{url, state: untried|connected|degraded|unreachable|standby, last_round_trip_at_ms, round_trip_ms, last_error}]}}",
        wire: true,
    },
    CommandSpec {
        name: "host.relay.set",
        route: Route::Ipc,
        params: "{url?: string, token?: string, scope?: {sessions?, prompt?, permissions?, create_sessions?}, timing?: {…}}",
        summary: "dial this relay from now on (no url: none); not saved — config.toml's [relay] is what a restart uses",
        wire: false,
    },
    CommandSpec {
        name: "host.shutdown",
        route: Route::Hybrid,
        params: "{}",
        summary: "stop the host gracefully and wait until its lock is released",
        wire: false,
    },
    CommandSpec {
        name: "version",
        route: Route::Local,
        params: "{}",
        summary: "this binary's version and the store schema version",
        wire: false,
    },
    CommandSpec {
        name: "agent.list",
        route: Route::Hybrid,
        params: "{}",
        summary: "each agent family: binary, version, capabilities, usable or why not",
        wire: true,
    },
    CommandSpec {
        name: "session.create",
        route: Route::Ipc,
        params: "{agent_type: string, cwd: string, title?: string, model?: string, system_prompt?: string, mcp_servers?: [{type: \"stdio\", name, command, args?, env?: [{name, value}]} | {type: \"http\"|\"sse\", name, url, headers?: [{name, value}]}], permission_mode?: \"ask\"|\"accept_edits\"|\"bypass\"}",
        summary: "create a session; returns {session_id, session}; an option the agent cannot honour is refused (option_unsupported, naming it), bypass needs allow_bypass = true in config.toml (bypass_not_allowed)",
        wire: true,
    },
    CommandSpec {
        name: "session.list",
        route: Route::Ipc,
        params: "{limit?: int (default 50, max 200), cursor?: string, state?: \"idle\"|\"running\"|\"waiting\", agent_type?: string, cwd?: string}",
        summary: "a page of sessions, newest activity first, each with its title, state, last activity and a preview of its last message: {sessions, next_cursor} (null at the end)",
        wire: true,
    },
    CommandSpec {
        name: "session.get",
        route: Route::Ipc,
        params: "{session_id: string}",
        summary: "one session's row, its `queue` [{run_id, text, client_msg_id, created_at_ms, from?}] (head first; from: who sent it, as its user.text says), its `permission_rules` [{request_id, tool, option_id, label, description, by, at_ms}] (the allow-always options accepted in it), and `live` {agent_pid, run_id, queued} once it has run (null before)",
        wire: true,
    },
    CommandSpec {
        name: "session.delete",
        route: Route::Ipc,
        params: "{session_id: string}",
        summary: "delete a session and its stored events",
        wire: true,
    },
    CommandSpec {
        name: "session.fork",
        route: Route::Ipc,
        params: "{session_id: string, title?: string}",
        summary: "a new session continuing this one's conversation in a fork of its agent session: {session_id, parent_session_id}",
        wire: true,
    },
    CommandSpec {
        name: "session.import",
        route: Route::Ipc,
        params: "{agent_type: string, native_session_id: string, cwd: string, title?: string, model?: string, system_prompt?: string, mcp_servers?: [{type: \"stdio\", name, command, args?, env?: [{name, value}]} | {type: \"http\"|\"sse\", name, url, headers?: [{name, value}]}], permission_mode?: \"ask\"|\"accept_edits\"|\"bypass\"}",
        summary: "bring a session started outside the host under it (`session.discover` lists them): its earlier conversation is published first, marked imported, and its first prompt continues it in a fork; a native session the agent's records place in another cwd: binding_mismatch",
        wire: true,
    },
    CommandSpec {
        name: "session.discover",
        route: Route::Ipc,
        params: "{agent_type: string, cwd: string}",
        summary: "the agent's own sessions of this cwd (from its files; started in a terminal or elsewhere), to import: {sessions: [{native_session_id, first_prompt, last_activity_ms, turns, imported_as?}]}, newest first, at most 200; imported_as: the host session already made from it; an agent whose sessions cannot be listed: option_unsupported",
        wire: true,
    },
    CommandSpec {
        name: "session.send",
        route: Route::Ipc,
        params: "{session_id: string, text: string, client_msg_id?: string, attachments?: [{path: string, mime?: string} or {data_base64: string, mime: string, name?: string}] (at most 8)}",
        summary: "send a prompt; returns {run_id, queued, duplicate} at once (a busy session queues up to `queue_capacity`, 3 by default, dropping the oldest); attachments are checked and copied first (protocol.md \"Attachments\": attachment_refused, attachment_too_large, option_unsupported)",
        wire: true,
    },
    CommandSpec {
        name: "session.set_model",
        route: Route::Ipc,
        params: "{session_id: string, model: string}",
        summary: "run the session on another model from now on: {session_id, model, applied: \"live\"|\"next_turn\"|\"restart\"} (live: the running agent took it; next_turn: the next turn carries it; restart: the agent is restarted, resuming its session, once idle); a session.configured says so; option_unsupported where the agent cannot switch",
        wire: true,
    },
    CommandSpec {
        name: "session.cancel",
        route: Route::Ipc,
        params: "{session_id: string, run_id?: string}",
        summary: "interrupt the running turn, or take a queued run out of the queue: {run_id, state}",
        wire: true,
    },
    CommandSpec {
        name: "session.steer",
        route: Route::Ipc,
        params: "{session_id: string, text: string, client_msg_id?: string} (text only: attachments are refused, send them with session.send)",
        summary: "give the running turn more input: {run_id, steered, queued, duplicate}; an agent that cannot take it mid-turn (`agent.list` capabilities.steer), or refuses it, gets it at the head of the queue (warning steer_unsupported); no answer from the agent: result_delivery_unknown (not queued); another steer still waiting: steer_pending; with no turn running, a plain send",
        wire: true,
    },
    CommandSpec {
        name: "queue.edit",
        route: Route::Ipc,
        params: "{session_id: string, run_id: string, text: string}",
        summary: "change the text of a queued prompt: {run_id, text}; not_queued once it started or left the queue",
        wire: true,
    },
    CommandSpec {
        name: "queue.move",
        route: Route::Ipc,
        params: "{session_id: string, run_id: string, position: int (0 = head; clamped)}",
        summary: "move a queued prompt: {queue: [{run_id, text, client_msg_id, created_at_ms, from?}]}, head first",
        wire: true,
    },
    CommandSpec {
        name: "queue.remove",
        route: Route::Ipc,
        params: "{session_id: string, run_id: string}",
        summary: "take a queued prompt out of the queue (it never runs): {run_id, state: \"cancelled\"}; not_queued for a run in progress",
        wire: true,
    },
    CommandSpec {
        name: "queue.clear",
        route: Route::Ipc,
        params: "{session_id: string}",
        summary: "take every queued prompt out: {removed: [run_id]}",
        wire: true,
    },
    CommandSpec {
        name: "session.activate",
        route: Route::Ipc,
        params: "{session_id: string}",
        summary: "start or resume the session's agent now, so the first prompt does not wait for it: {session_id, agent_pid, already}",
        wire: true,
    },
    CommandSpec {
        name: "session.rename",
        route: Route::Ipc,
        params: "{session_id: string, title: string}",
        summary: "set a session's title: {session}",
        wire: true,
    },
    CommandSpec {
        name: "session.runs",
        route: Route::Ipc,
        params: "{session_id: string}",
        summary: "every run of the session, oldest first: {runs: [{run_id, state, client_msg_id, error_category, message, created_at_ms, ended_at_ms}]}",
        wire: true,
    },
    CommandSpec {
        name: "session.run",
        route: Route::Ipc,
        params: "{session_id: string, client_msg_id?: string, run_id?: string} (exactly one of the two)",
        summary: "the run a prompt became, by the client_msg_id it was sent with (or its run_id): {run_id, session_id, state, client_msg_id, error_category, message, created_at_ms, ended_at_ms}; run_not_found if no prompt was taken under it",
        wire: true,
    },
    CommandSpec {
        name: "permission.list",
        route: Route::Ipc,
        params: "{session_id?: string}",
        summary: "the pending permission requests (of one session, or all) with their options: {permissions}",
        wire: true,
    },
    CommandSpec {
        name: "permission.respond",
        route: Route::Ipc,
        params: "{session_id: string, request_id: string, option_id?: string, decision?: \"allow\"|\"deny\", message?: string} (at least one of option_id and decision)",
        summary: "answer a pending permission request with one of its options (decision allow/deny: its first allow-once/reject-once option); the first answer wins, later ones get already_resolved; an allow_always option is recorded on the session: {request_id, decision, option_id, rule?}",
        wire: true,
    },
    CommandSpec {
        name: "subscriber.add",
        route: Route::Ipc,
        params: "{type: \"local\", session_id?: string, forward_deltas?: bool, replay_mode?: \"none\"|\"since_cursor\"|\"max_count\", max_count?: int, sessions?: [string], prompt?: bool, permissions?: bool, create_sessions?: bool, client?: string}",
        summary: "create a durable subscriber and a WebSocket grant: {subscriber_id, ws_endpoint, ws_socket?, ws_token, token_ttl_s}; client (1-32 of a-z 0-9 _ . -, e.g. web, follow) labels the prompts it sends (user.text from.client)",
        wire: false,
    },
    CommandSpec {
        name: "subscriber.grant",
        route: Route::Ipc,
        params: "{subscriber_id: string}",
        summary: "a fresh WebSocket grant for an existing subscriber (after a host restart or TTL; over the wire, a connection renews its own), valid 600 s: {subscriber_id, ws_endpoint, ws_socket?, ws_token, token_ttl_s}",
        wire: true,
    },
    CommandSpec {
        name: "subscriber.list",
        route: Route::Ipc,
        params: "{}",
        summary: "every subscriber with its cursor, whether connected, when last seen (last_seen_at_ms: its last connection or subscriber.grant; null: never), and deltas dropped; one away longer than subscriber_max_idle_days (default 30) is removed, a connected one never",
        wire: false,
    },
    CommandSpec {
        name: "subscriber.remove",
        route: Route::Ipc,
        params: "{subscriber_id: string}",
        summary: "delete a subscriber, void its grants and close its connections",
        wire: false,
    },
    CommandSpec {
        name: "session.history",
        route: Route::Ipc,
        params: "{session_id: string, after_seq?: int, before_seq?: int (not with after_seq), limit?: int (default 200, max 5000)}",
        summary: "a page of bracket events, each with its sequence_id: the oldest after after_seq, or the newest before before_seq; {events, count, next_after_seq, next_before_seq, has_more}",
        wire: true,
    },
    CommandSpec {
        name: "session.search",
        route: Route::Ipc,
        params: "{query: string (at most 1024 bytes), session_id?: string, limit?: int (default 20, max 100), syntax?: \"words\"|\"fts5\" (default words)}",
        summary: "full-text search of prompts, answers and tool calls (docs/search.md), best match first: {query, hits: [{session_id, sequence_id, run_id, kind, created_at_ms, snippet, score}]}; words: every word must match, word* a prefix, nothing else is syntax; fts5: SQLite FTS5 query syntax as written; a query that is none or that FTS5 cannot parse: invalid_params",
        wire: true,
    },
    CommandSpec {
        name: "session.export",
        route: Route::Ipc,
        params: "{session_id: string, format: \"markdown\"|\"jsonl\", after_seq?: int, thinking?: bool (markdown; default false)}",
        summary: "a transcript, in pages of at most 1 MiB (always at least one event): {session_id, format, content, events, next_after_seq, has_more}; markdown: prompts, answers, tool calls with input and output, permissions and who answered, run ends and errors; jsonl: the stored canonical events, one a line; pass next_after_seq back as after_seq while has_more",
        wire: true,
    },
    CommandSpec {
        name: "host.reload",
        route: Route::Ipc,
        params: "{}",
        summary: "read config.toml again and apply it now (the host also does on every change of the file): {path, applied, needs_restart, overridden}; log_level, [agents.*], agent_idle_timeout_s, [hooks], [relay] and subscriber_max_idle_days apply at once (a running agent process keeps its definition; the next one started uses the new); needs_restart names the keys changed since start that only a restart applies; a file that does not parse or a value refused: config_invalid, and nothing changes",
        wire: false,
    },
    CommandSpec {
        name: "pair.create",
        route: Route::Ipc,
        params: "{scope?: {sessions?, prompt?, permissions?, create_sessions?}, ttl_s?: int (default 600, 1 to 3600), name?: string (1-64 characters)}",
        summary: "a code that pairs one remote bot, once, until it expires: {code, qr, host_id, host_public, relay_urls, secret_id, expires_at_ms, scope}; the code holds the secret, which the host keeps in memory only (a restart voids the code: make a new one); scope: what the bot may do (default: every session and prompts, no permission answers, no new sessions); name labels the bot in pair.list; `agent-host pair` prints the code as a QR",
        wire: false,
    },
    CommandSpec {
        name: "pair.list",
        route: Route::Ipc,
        params: "{}",
        summary: "every paired bot, revoked ones too, in the order they paired: {bots: [{bot_id, name, scope, paired_at_ms, last_seen_at_ms, revoked_at_ms, connected}]}",
        wire: false,
    },
    CommandSpec {
        name: "pair.revoke",
        route: Route::Ipc,
        params: "{bot: string (a bot_id)}",
        summary: "revoke a paired bot: it can no longer connect and its open channels close: {bot_id, revoked: true}; it stays in pair.list with revoked_at_ms; an unknown id: bot_not_found",
        wire: false,
    },
];

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmptyParams {}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostStartParams {
    #[serde(default)]
    pub foreground: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionCreateParams {
    pub agent_type: String,
    pub cwd: String,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub mcp_servers: Vec<super::options::McpServer>,
    #[serde(default)]
    pub permission_mode: Option<super::options::PermissionMode>,
}

impl SessionCreateParams {
    /// The session options given.
    pub fn options(&self) -> super::options::SessionOptions {
        super::options::SessionOptions {
            model: self.model.clone(),
            system_prompt: self.system_prompt.clone(),
            mcp_servers: self.mcp_servers.clone(),
            permission_mode: self.permission_mode,
        }
    }
}

/// `session.set_model`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSetModelParams {
    pub session_id: String,
    pub model: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionIdParams {
    pub session_id: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionListParams {
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub cursor: Option<String>,
    #[serde(default)]
    pub state: Option<super::states::SessionState>,
    #[serde(default)]
    pub agent_type: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRenameParams {
    pub session_id: String,
    pub title: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionListParams {
    #[serde(default)]
    pub session_id: Option<String>,
}

/// `session.history`: one session, where the page starts, and how many brackets it may hold.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "SessionHistoryFields")]
pub struct SessionHistoryParams {
    pub session_id: String,
    pub from: HistoryFrom,
    pub limit: Option<u32>,
}

/// Which way a `session.history` page reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryFrom {
    /// The oldest brackets with `sequence_id > n` (`after_seq`; 0 when neither is given).
    After(i64),
    /// The newest brackets with `sequence_id < n` (`before_seq`), still in ascending order.
    Before(i64),
}

/// The fields `session.history` takes, before the one-direction rule is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionHistoryFields {
    session_id: String,
    #[serde(default)]
    after_seq: Option<i64>,
    #[serde(default)]
    before_seq: Option<i64>,
    #[serde(default)]
    limit: Option<u32>,
}

impl TryFrom<SessionHistoryFields> for SessionHistoryParams {
    type Error = String;

    fn try_from(f: SessionHistoryFields) -> Result<Self, Self::Error> {
        let from = match (f.after_seq, f.before_seq) {
            (Some(_), Some(_)) => {
                return Err("give after_seq or before_seq, not both".to_owned());
            }
            (after, None) => HistoryFrom::After(after.unwrap_or(0)),
            (None, Some(before)) => HistoryFrom::Before(before),
        };
        Ok(SessionHistoryParams {
            session_id: f.session_id,
            from,
            limit: f.limit,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionForkParams {
    pub session_id: String,
    #[serde(default)]
    pub title: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionDiscoverParams {
    pub agent_type: String,
    pub cwd: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionImportParams {
    pub agent_type: String,
    pub native_session_id: String,
    pub cwd: String,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub mcp_servers: Vec<super::options::McpServer>,
    #[serde(default)]
    pub permission_mode: Option<super::options::PermissionMode>,
}

impl SessionImportParams {
    /// The session options given.
    pub fn options(&self) -> super::options::SessionOptions {
        super::options::SessionOptions {
            model: self.model.clone(),
            system_prompt: self.system_prompt.clone(),
            mcp_servers: self.mcp_servers.clone(),
            permission_mode: self.permission_mode,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSendParams {
    pub session_id: String,
    pub text: String,
    #[serde(default)]
    pub client_msg_id: Option<String>,
    /// Files and images the prompt carries (`session.send` only; a steer takes text only).
    #[serde(default)]
    pub attachments: Vec<crate::protocol::options::AttachmentParam>,
}

/// `session.run`: one session and exactly one way to name the run.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "SessionRunFields")]
pub struct SessionRunParams {
    pub session_id: String,
    pub run: RunRef,
}

/// How `session.run` names a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunRef {
    /// The key the prompt was sent with (`session.send`'s `client_msg_id`).
    ClientMsgId(String),
    /// The host's run id (`session.send`'s answer).
    RunId(String),
}

/// The fields `session.run` takes, before the one-of rule is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRunFields {
    session_id: String,
    #[serde(default)]
    client_msg_id: Option<String>,
    #[serde(default)]
    run_id: Option<String>,
}

impl TryFrom<SessionRunFields> for SessionRunParams {
    type Error = String;

    fn try_from(f: SessionRunFields) -> Result<Self, Self::Error> {
        let run = match (f.client_msg_id, f.run_id) {
            (Some(key), None) if !key.is_empty() => RunRef::ClientMsgId(key),
            (None, Some(id)) if !id.is_empty() => RunRef::RunId(id),
            (Some(_), Some(_)) => {
                return Err("give client_msg_id or run_id, not both".to_owned());
            }
            (None, None) => return Err("give client_msg_id or run_id".to_owned()),
            _ => return Err("client_msg_id and run_id must not be empty".to_owned()),
        };
        Ok(SessionRunParams {
            session_id: f.session_id,
            run,
        })
    }
}

/// `queue.edit`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueEditParams {
    pub session_id: String,
    pub run_id: String,
    pub text: String,
}

/// `queue.move`: `position` 0 is the head; past the end is the end.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueMoveParams {
    pub session_id: String,
    pub run_id: String,
    pub position: u32,
}

/// `queue.remove`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueRunParams {
    pub session_id: String,
    pub run_id: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionCancelParams {
    pub session_id: String,
    #[serde(default)]
    pub run_id: Option<String>,
}

/// An answer to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionDecision {
    Allow,
    Deny,
}

impl PermissionDecision {
    pub fn parse(text: &str) -> Option<PermissionDecision> {
        match text {
            "allow" => Some(PermissionDecision::Allow),
            "deny" => Some(PermissionDecision::Deny),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PermissionDecision::Allow => "allow",
            PermissionDecision::Deny => "deny",
        }
    }
}

/// `permission.respond`: one of the agent's options by `option_id`, or `decision` as a
/// shorthand (`allow`: its first allow-once option, `deny`: its first reject-once option); at
/// least one of the two. Both given: they must agree (checked against the options).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "PermissionRespondFields")]
pub struct PermissionRespondParams {
    pub session_id: String,
    pub request_id: String,
    pub answer: PermissionAnswer,
    pub message: Option<String>,
}

/// How an answer names its choice: see [`PermissionRespondParams`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionAnswer {
    pub decision: Option<PermissionDecision>,
    pub option_id: Option<String>,
}

impl From<PermissionDecision> for PermissionAnswer {
    fn from(decision: PermissionDecision) -> Self {
        PermissionAnswer {
            decision: Some(decision),
            option_id: None,
        }
    }
}

impl PermissionAnswer {
    /// Choose the agent's option `id`.
    pub fn option(id: impl Into<String>) -> Self {
        PermissionAnswer {
            decision: None,
            option_id: Some(id.into()),
        }
    }
}

/// The fields `permission.respond` takes, before the one-of rule is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionRespondFields {
    session_id: String,
    request_id: String,
    #[serde(default)]
    decision: Option<PermissionDecision>,
    #[serde(default)]
    option_id: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl TryFrom<PermissionRespondFields> for PermissionRespondParams {
    type Error = String;

    fn try_from(f: PermissionRespondFields) -> Result<Self, Self::Error> {
        match (&f.decision, &f.option_id) {
            (None, None) => return Err("give option_id or decision (allow or deny)".to_owned()),
            (_, Some(id)) if id.is_empty() => return Err("option_id must not be empty".to_owned()),
            _ => {}
        }
        Ok(PermissionRespondParams {
            session_id: f.session_id,
            request_id: f.request_id,
            answer: PermissionAnswer {
                decision: f.decision,
                option_id: f.option_id,
            },
            message: f.message,
        })
    }
}

/// How a new subscriber starts (design §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayMode {
    None,
    SinceCursor,
    #[default]
    MaxCount,
}

impl ReplayMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayMode::None => "none",
            ReplayMode::SinceCursor => "since_cursor",
            ReplayMode::MaxCount => "max_count",
        }
    }

    pub fn parse(text: &str) -> Option<ReplayMode> {
        match text {
            "none" => Some(ReplayMode::None),
            "since_cursor" => Some(ReplayMode::SinceCursor),
            "max_count" => Some(ReplayMode::MaxCount),
            _ => None,
        }
    }
}

/// The transport a subscriber uses; only loopback WebSocket subscribers exist so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscriberType {
    Local,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriberAddParams {
    #[serde(rename = "type")]
    pub kind: SubscriberType,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub forward_deltas: bool,
    #[serde(default)]
    pub replay_mode: ReplayMode,
    #[serde(default)]
    pub max_count: Option<u32>,
    /// What the grant may do; see [`super::scope::ScopeParams::resolve`].
    #[serde(default)]
    pub sessions: Option<Vec<String>>,
    #[serde(default)]
    pub prompt: Option<bool>,
    #[serde(default)]
    pub permissions: Option<bool>,
    #[serde(default)]
    pub create_sessions: Option<bool>,
    /// What kind of client this is (`web`, `follow`, an app's own name), so a prompt it sends
    /// says so (`user.text` `from.client`).
    #[serde(default)]
    pub client: Option<ClientLabel>,
}

/// A subscriber's client label: 1 to [`ClientLabel::MAX`] characters of `a-z`, `0-9`, `_`, `.`
/// and `-`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClientLabel(String);

impl ClientLabel {
    pub const MAX: usize = 32;

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ClientLabel {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        let ok = (1..=Self::MAX).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
        if ok {
            Ok(ClientLabel(text))
        } else {
            Err(format!(
                "client must be 1 to {} characters of a-z, 0-9, '_', '.' and '-', got {text:?}",
                Self::MAX
            ))
        }
    }
}

impl From<ClientLabel> for String {
    fn from(label: ClientLabel) -> String {
        label.0
    }
}

impl SubscriberAddParams {
    /// The scope the grant gets.
    pub fn scope(&self) -> super::scope::Scope {
        super::scope::ScopeParams {
            sessions: self.sessions.clone(),
            prompt: self.prompt,
            permissions: self.permissions,
            create_sessions: self.create_sessions,
        }
        .resolve(self.session_id.as_deref())
    }
}

/// `host.relay.set`. `scope` and `timing` are checked by the host against its config types.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRelaySetParams {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub scope: Option<Value>,
    #[serde(default)]
    pub timing: Option<Value>,
}

impl std::fmt::Debug for HostRelaySetParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRelaySetParams")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("scope", &self.scope)
            .field("timing", &self.timing)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriberIdParams {
    pub subscriber_id: String,
}

/// How `session.search` reads its query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchSyntax {
    /// Words, every one of which must match; `word*` is a prefix. Nothing is query syntax.
    #[default]
    Words,
    /// SQLite FTS5's query syntax, as written.
    Fts5,
}

/// `session.search`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSearchParams {
    pub query: String,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub syntax: SearchSyntax,
}

/// What `session.export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportFormat {
    Markdown,
    Jsonl,
}

/// `session.export`: one page of a session's transcript, from after `after_seq`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionExportParams {
    pub session_id: String,
    pub format: ExportFormat,
    #[serde(default)]
    pub after_seq: Option<i64>,
    #[serde(default)]
    pub thinking: bool,
}

/// `pair.create`: what a bot paired with the code may do, how long the code is valid, and the
/// bot's label.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "PairCreateFields")]
pub struct PairCreateParams {
    /// Absent: [`super::scope::Scope::default`], what a relay token grants by default.
    pub scope: Option<super::scope::Scope>,
    /// Seconds, 1 to [`PairCreateParams::MAX_TTL_S`].
    pub ttl_s: u32,
    pub name: Option<String>,
}

impl PairCreateParams {
    pub const DEFAULT_TTL_S: u32 = 600;
    pub const MAX_TTL_S: u32 = 3600;
    /// The most characters of a bot's label.
    pub const MAX_NAME_CHARS: usize = 64;
}

/// The fields `pair.create` takes, before the ranges are checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PairCreateFields {
    #[serde(default)]
    scope: Option<super::scope::Scope>,
    #[serde(default)]
    ttl_s: Option<u32>,
    #[serde(default)]
    name: Option<String>,
}

impl TryFrom<PairCreateFields> for PairCreateParams {
    type Error = String;

    fn try_from(f: PairCreateFields) -> Result<Self, Self::Error> {
        let ttl_s = f.ttl_s.unwrap_or(PairCreateParams::DEFAULT_TTL_S);
        if !(1..=PairCreateParams::MAX_TTL_S).contains(&ttl_s) {
            return Err(format!(
                "ttl_s must be 1 to {} seconds, got {ttl_s}",
                PairCreateParams::MAX_TTL_S
            ));
        }
        if let Some(name) = &f.name {
            let chars = name.chars().count();
            if !(1..=PairCreateParams::MAX_NAME_CHARS).contains(&chars) {
                return Err(format!(
                    "name must be 1 to {} characters, got {chars}",
                    PairCreateParams::MAX_NAME_CHARS
                ));
            }
        }
        Ok(PairCreateParams {
            scope: f.scope,
            ttl_s,
            name: f.name,
        })
    }
}

/// `pair.revoke`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairRevokeParams {
    /// The bot's id (`pair.list` `bot_id`).
    pub bot: String,
}

/// A parsed, typed command. After this, nothing matches on strings.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    HostStart(HostStartParams),
    HostStatus,
    HostRelaySet(HostRelaySetParams),
    HostShutdown,
    Version,
    AgentList,
    SessionCreate(SessionCreateParams),
    SessionList(SessionListParams),
    SessionGet(SessionIdParams),
    SessionActivate(SessionIdParams),
    SessionRuns(SessionIdParams),
    SessionRun(SessionRunParams),
    SessionRename(SessionRenameParams),
    PermissionList(PermissionListParams),
    SessionDelete(SessionIdParams),
    SessionHistory(SessionHistoryParams),
    SessionFork(SessionForkParams),
    SessionImport(SessionImportParams),
    SessionDiscover(SessionDiscoverParams),
    SessionSend(SessionSendParams),
    SessionSteer(SessionSendParams),
    SessionSetModel(SessionSetModelParams),
    SessionCancel(SessionCancelParams),
    QueueEdit(QueueEditParams),
    QueueMove(QueueMoveParams),
    QueueRemove(QueueRunParams),
    QueueClear(SessionIdParams),
    PermissionRespond(PermissionRespondParams),
    SubscriberAdd(SubscriberAddParams),
    SubscriberGrant(SubscriberIdParams),
    SubscriberList,
    SubscriberRemove(SubscriberIdParams),
    SessionSearch(SessionSearchParams),
    SessionExport(SessionExportParams),
    HostReload,
    PairCreate(PairCreateParams),
    PairList,
    PairRevoke(PairRevokeParams),
}

/// The most a request line may hold, for IPC and argv alike.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

impl Command {
    /// Parse a whole envelope from bytes (one IPC line or one argv JSON).
    pub fn parse_bytes(bytes: &[u8]) -> Result<Command, RequestError> {
        if bytes.len() > MAX_REQUEST_BYTES {
            return Err(RequestError::new(
                ErrorCode::RequestTooLarge,
                format!(
                    "request is {} bytes, the limit is {MAX_REQUEST_BYTES}",
                    bytes.len()
                ),
            ));
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            RequestError::new(
                ErrorCode::InvalidEncoding,
                format!("request is not UTF-8: {e}"),
            )
        })?;
        if text.trim().is_empty() {
            return Err(RequestError::new(ErrorCode::EmptyRequest, "empty request"));
        }
        let value: Value = super::strict_json::parse(text).map_err(|e| {
            RequestError::new(
                ErrorCode::InvalidJson,
                format!("request is not valid JSON: {e}"),
            )
        })?;
        Command::parse_value(value)
    }

    /// Parse an envelope that is already JSON.
    pub fn parse_value(value: Value) -> Result<Command, RequestError> {
        let Value::Object(mut object) = value else {
            return Err(RequestError::new(
                ErrorCode::InvalidEnvelope,
                format!("request must be a JSON object, got {}", json_type(&value)),
            ));
        };
        if let Some(extra) = object.keys().find(|k| *k != "command" && *k != "params") {
            return Err(RequestError::new(
                ErrorCode::InvalidEnvelope,
                format!(
                    "unknown envelope field {extra:?}: only \"command\" and \"params\" are allowed"
                ),
            ));
        }
        let name = match object.remove("command") {
            None | Some(Value::Null) => {
                return Err(RequestError::new(
                    ErrorCode::MissingCommand,
                    "request has no \"command\"",
                ));
            }
            Some(Value::String(name)) => name,
            Some(other) => {
                return Err(RequestError::new(
                    ErrorCode::InvalidEnvelope,
                    format!("\"command\" must be a string, got {}", json_type(&other)),
                ));
            }
        };
        let params = object.remove("params").unwrap_or(Value::Null);
        Command::parse_named(&name, params)
    }

    /// Parse params for a command given by name (argv form `agent-host <command> [params]`).
    pub fn parse_named(name: &str, params: Value) -> Result<Command, RequestError> {
        let params = match params {
            Value::Null => Value::Object(Map::new()),
            Value::Object(map) => Value::Object(map),
            other => {
                return Err(RequestError::new(
                    ErrorCode::InvalidParams,
                    format!("\"params\" must be an object, got {}", json_type(&other)),
                ));
            }
        };
        let command = match name {
            "host.start" => Command::HostStart(typed(name, params)?),
            "host.status" => typed::<EmptyParams>(name, params).map(|_| Command::HostStatus)?,
            "host.shutdown" => typed::<EmptyParams>(name, params).map(|_| Command::HostShutdown)?,
            "host.relay.set" => Command::HostRelaySet(typed(name, params)?),
            "version" => typed::<EmptyParams>(name, params).map(|_| Command::Version)?,
            "agent.list" => typed::<EmptyParams>(name, params).map(|_| Command::AgentList)?,
            "session.create" => Command::SessionCreate(typed(name, params)?),
            "session.list" => Command::SessionList(typed(name, params)?),
            "session.activate" => Command::SessionActivate(typed(name, params)?),
            "session.runs" => Command::SessionRuns(typed(name, params)?),
            "session.run" => Command::SessionRun(typed(name, params)?),
            "session.rename" => Command::SessionRename(typed(name, params)?),
            "permission.list" => Command::PermissionList(typed(name, params)?),
            "session.get" => Command::SessionGet(typed(name, params)?),
            "session.delete" => Command::SessionDelete(typed(name, params)?),
            "session.history" => Command::SessionHistory(typed(name, params)?),
            "session.fork" => Command::SessionFork(typed(name, params)?),
            "session.import" => Command::SessionImport(typed(name, params)?),
            "session.discover" => Command::SessionDiscover(typed(name, params)?),
            "session.send" => Command::SessionSend(typed(name, params)?),
            "session.steer" => Command::SessionSteer(typed(name, params)?),
            "session.set_model" => Command::SessionSetModel(typed(name, params)?),
            "queue.edit" => Command::QueueEdit(typed(name, params)?),
            "queue.move" => Command::QueueMove(typed(name, params)?),
            "queue.remove" => Command::QueueRemove(typed(name, params)?),
            "queue.clear" => Command::QueueClear(typed(name, params)?),
            "session.cancel" => Command::SessionCancel(typed(name, params)?),
            "permission.respond" => Command::PermissionRespond(typed(name, params)?),
            "subscriber.add" => Command::SubscriberAdd(typed(name, params)?),
            "subscriber.grant" => Command::SubscriberGrant(typed(name, params)?),
            "subscriber.list" => {
                typed::<EmptyParams>(name, params).map(|_| Command::SubscriberList)?
            }
            "subscriber.remove" => Command::SubscriberRemove(typed(name, params)?),
            "session.search" => Command::SessionSearch(typed(name, params)?),
            "session.export" => Command::SessionExport(typed(name, params)?),
            "host.reload" => typed::<EmptyParams>(name, params).map(|_| Command::HostReload)?,
            "pair.create" => Command::PairCreate(typed(name, params)?),
            "pair.list" => typed::<EmptyParams>(name, params).map(|_| Command::PairList)?,
            "pair.revoke" => Command::PairRevoke(typed(name, params)?),
            _ => {
                return Err(RequestError::new(
                    ErrorCode::UnknownCommand,
                    format!("unknown command {name:?}; `agent-host --help` lists them"),
                ));
            }
        };
        Ok(command)
    }

    /// The table name of this command.
    pub fn name(&self) -> &'static str {
        match self {
            Command::HostStart(_) => "host.start",
            Command::HostStatus => "host.status",
            Command::HostShutdown => "host.shutdown",
            Command::HostRelaySet(_) => "host.relay.set",
            Command::Version => "version",
            Command::AgentList => "agent.list",
            Command::SessionCreate(_) => "session.create",
            Command::SessionList(_) => "session.list",
            Command::SessionActivate(_) => "session.activate",
            Command::SessionRuns(_) => "session.runs",
            Command::SessionRun(_) => "session.run",
            Command::SessionRename(_) => "session.rename",
            Command::PermissionList(_) => "permission.list",
            Command::SessionGet(_) => "session.get",
            Command::SessionDelete(_) => "session.delete",
            Command::SessionHistory(_) => "session.history",
            Command::SessionFork(_) => "session.fork",
            Command::SessionImport(_) => "session.import",
            Command::SessionDiscover(_) => "session.discover",
            Command::SessionSend(_) => "session.send",
            Command::SessionSteer(_) => "session.steer",
            Command::SessionSetModel(_) => "session.set_model",
            Command::QueueEdit(_) => "queue.edit",
            Command::QueueMove(_) => "queue.move",
            Command::QueueRemove(_) => "queue.remove",
            Command::QueueClear(_) => "queue.clear",
            Command::SessionCancel(_) => "session.cancel",
            Command::PermissionRespond(_) => "permission.respond",
            Command::SubscriberAdd(_) => "subscriber.add",
            Command::SubscriberGrant(_) => "subscriber.grant",
            Command::SubscriberList => "subscriber.list",
            Command::SubscriberRemove(_) => "subscriber.remove",
            Command::SessionSearch(_) => "session.search",
            Command::SessionExport(_) => "session.export",
            Command::HostReload => "host.reload",
            Command::PairCreate(_) => "pair.create",
            Command::PairList => "pair.list",
            Command::PairRevoke(_) => "pair.revoke",
        }
    }

    pub fn route(&self) -> Route {
        spec(self.name()).map_or(Route::Ipc, |s| s.route)
    }
}

/// The table row of a command name.
pub fn spec(name: &str) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|s| s.name == name)
}

fn typed<T: DeserializeOwned>(name: &str, params: Value) -> Result<T, RequestError> {
    serde_json::from_value(params).map_err(|e| {
        let signature = spec(name).map_or("", |s| s.params);
        RequestError::new(
            ErrorCode::InvalidParams,
            format!("invalid params for {name}: {e}; expected {signature}"),
        )
    })
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Serialize a command back to its envelope, for forwarding over IPC.
pub fn envelope(name: &str, params: Value) -> Value {
    json!({"command": name, "params": params})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(input: &str) -> ErrorCode {
        Command::parse_bytes(input.as_bytes()).unwrap_err().code
    }

    #[test]
    fn parses_every_table_command_and_nothing_else() {
        for spec in COMMANDS {
            let params = match spec.name {
                "session.create" => json!({"agent_type": "claude", "cwd": "/"}),
                "session.get" | "session.delete" | "session.history" | "session.cancel"
                | "session.activate" | "session.runs" => {
                    json!({"session_id": "x"})
                }
                "session.send" | "session.steer" => json!({"session_id": "x", "text": "hi"}),
                "session.set_model" => json!({"session_id": "x", "model": "m"}),
                "queue.edit" => json!({"session_id": "x", "run_id": "r", "text": "hi"}),
                "queue.move" => json!({"session_id": "x", "run_id": "r", "position": 0}),
                "queue.remove" => json!({"session_id": "x", "run_id": "r"}),
                "queue.clear" => json!({"session_id": "x"}),
                "session.run" => json!({"session_id": "x", "client_msg_id": "k"}),
                "session.rename" => json!({"session_id": "x", "title": "t"}),
                "session.fork" => json!({"session_id": "x"}),
                "session.import" => {
                    json!({"agent_type": "claude", "native_session_id": "n", "cwd": "/"})
                }
                "session.discover" => json!({"agent_type": "claude", "cwd": "/"}),
                "permission.respond" => {
                    json!({"session_id": "x", "request_id": "r", "decision": "deny"})
                }
                "subscriber.add" => json!({"type": "local"}),
                "subscriber.grant" | "subscriber.remove" => json!({"subscriber_id": "x"}),
                "session.search" => json!({"query": "q"}),
                "session.export" => json!({"session_id": "x", "format": "jsonl"}),
                "pair.revoke" => json!({"bot": "x"}),
                _ => json!({}),
            };
            let cmd = Command::parse_named(spec.name, params).unwrap();
            assert_eq!(cmd.name(), spec.name);
            assert_eq!(cmd.route(), spec.route);
        }
        assert_eq!(
            Command::parse_named("session.explode", Value::Null)
                .unwrap_err()
                .code,
            ErrorCode::UnknownCommand
        );
    }

    /// `session.history` reads one way: after a cursor (from the start when none is given) or
    /// before one, never both.
    #[test]
    fn session_history_reads_after_or_before_not_both() {
        let parse = |params: Value| Command::parse_named("session.history", params);
        let from_of = |params: Value| match parse(params) {
            Ok(Command::SessionHistory(p)) => p.from,
            other => panic!("{other:?}"),
        };
        assert_eq!(from_of(json!({"session_id": "s"})), HistoryFrom::After(0));
        assert_eq!(
            from_of(json!({"session_id": "s", "after_seq": 7})),
            HistoryFrom::After(7)
        );
        assert_eq!(
            from_of(json!({"session_id": "s", "before_seq": 9_007_199_254_740_991_i64})),
            HistoryFrom::Before(9_007_199_254_740_991)
        );
        for bad in [
            json!({"session_id": "s", "after_seq": 0, "before_seq": 10}),
            json!({"session_id": "s", "before_seq": "10"}),
            json!({"session_id": "s", "before_seq": 1, "extra": 1}),
        ] {
            let err = parse(bad.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams, "{bad}");
        }
        let both = parse(json!({"session_id": "s", "after_seq": 0, "before_seq": 10}));
        assert!(
            both.unwrap_err()
                .message
                .contains("give after_seq or before_seq, not both"),
        );
    }

    /// `permission.respond` takes an option id, a decision, or both; never neither.
    #[test]
    fn permission_respond_takes_an_option_or_a_decision() {
        let parse = |params: Value| Command::parse_named("permission.respond", params);
        let answer_of = |params: Value| match parse(params) {
            Ok(Command::PermissionRespond(p)) => p.answer,
            other => panic!("{other:?}"),
        };
        let base = json!({"session_id": "s", "request_id": "r"});
        let with = |extra: Value| {
            let mut v = base.clone();
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            v
        };
        assert_eq!(
            answer_of(with(json!({"option_id": "acceptForSession"}))),
            PermissionAnswer::option("acceptForSession")
        );
        assert_eq!(
            answer_of(with(json!({"decision": "deny"}))),
            PermissionDecision::Deny.into()
        );
        assert_eq!(
            answer_of(with(json!({"decision": "allow", "option_id": "a"}))),
            PermissionAnswer {
                decision: Some(PermissionDecision::Allow),
                option_id: Some("a".into())
            }
        );
        for bad in [
            base.clone(),
            with(json!({"option_id": ""})),
            with(json!({"decision": "maybe"})),
            with(json!({"option_id": "a", "extra": 1})),
        ] {
            let err = parse(bad.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams, "{bad}");
        }
    }

    /// `subscriber.add` takes an optional client label of 1-32 of `a-z 0-9 _ . -`.
    #[test]
    fn subscriber_add_takes_a_client_label() {
        let parse = |params: Value| Command::parse_named("subscriber.add", params);
        let client_of = |params: Value| match parse(params) {
            Ok(Command::SubscriberAdd(p)) => p.client.map(|c| c.as_str().to_owned()),
            other => panic!("{other:?}"),
        };
        assert_eq!(client_of(json!({"type": "local"})), None);
        for good in ["web", "follow", "my-app_2.0", &"a".repeat(32)] {
            assert_eq!(
                client_of(json!({"type": "local", "client": good})).as_deref(),
                Some(good)
            );
        }
        for bad in [
            json!(""),
            json!("Web"),
            json!("my app"),
            json!("é"),
            json!("a".repeat(33)),
            json!(7),
        ] {
            let err = parse(json!({"type": "local", "client": bad})).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams, "{bad}");
            if bad.is_string() {
                assert!(err.message.contains("client must be"), "{}", err.message);
            }
        }
    }

    /// `pair.create`: a ttl of 1 to 3600 s (600 by default), a label of 1 to 64 characters,
    /// a scope of the relay's shape; `pair.revoke` names its bot.
    #[test]
    fn pair_create_checks_its_ranges() {
        let parse = |params: Value| Command::parse_named("pair.create", params);
        match parse(json!({})) {
            Ok(Command::PairCreate(p)) => {
                assert_eq!((p.ttl_s, p.scope, p.name), (600, None, None));
            }
            other => panic!("{other:?}"),
        }
        match parse(json!({"ttl_s": 3600, "name": "é".repeat(64), "scope": {"sessions": ["s"]}})) {
            Ok(Command::PairCreate(p)) => {
                assert_eq!(p.ttl_s, 3600);
                let scope = p.scope.unwrap();
                assert_eq!(scope.sessions, Some(vec!["s".to_owned()]));
                assert!(scope.prompt && !scope.permissions);
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            json!({"ttl_s": 0}),
            json!({"ttl_s": 3601}),
            json!({"ttl_s": -1}),
            json!({"name": ""}),
            json!({"name": "x".repeat(65)}),
            json!({"scope": {"admin": true}}),
            json!({"secret": "x"}),
        ] {
            let err = parse(bad.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams, "{bad}");
        }
        assert!(Command::parse_named("pair.revoke", json!({})).is_err());
        assert_eq!(ErrorCode::BotNotFound.number(), 5002);
    }

    /// `session.run` names its run exactly one way.
    #[test]
    fn session_run_takes_one_of_client_msg_id_and_run_id() {
        let parse = |params: Value| Command::parse_named("session.run", params);
        let run_of = |params: Value| match parse(params) {
            Ok(Command::SessionRun(p)) => p.run,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            run_of(json!({"session_id": "s", "client_msg_id": "k"})),
            RunRef::ClientMsgId("k".into())
        );
        assert_eq!(
            run_of(json!({"session_id": "s", "run_id": "r"})),
            RunRef::RunId("r".into())
        );
        for bad in [
            json!({"session_id": "s"}),
            json!({"session_id": "s", "client_msg_id": "k", "run_id": "r"}),
            json!({"session_id": "s", "client_msg_id": ""}),
            json!({"session_id": "s", "run_id": 7}),
            json!({"session_id": "s", "run_id": "r", "extra": 1}),
            json!({"client_msg_id": "k"}),
        ] {
            let err = parse(bad.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams, "{bad}");
            assert!(err.message.contains("session.run"), "{}", err.message);
        }
    }

    #[test]
    fn envelope_errors_have_specific_codes() {
        assert_eq!(code_of("nope"), ErrorCode::InvalidJson);
        assert_eq!(code_of("[1]"), ErrorCode::InvalidEnvelope);
        assert_eq!(code_of("{}"), ErrorCode::MissingCommand);
        assert_eq!(code_of(r#"{"command":7}"#), ErrorCode::InvalidEnvelope);
        assert_eq!(code_of(r#"{"command":"x.y"}"#), ErrorCode::UnknownCommand);
        assert_eq!(
            code_of(r#"{"command":"session.get","params":[]}"#),
            ErrorCode::InvalidParams
        );
        assert_eq!(
            code_of(r#"{"command":"session.get","params":{"session_id":1}}"#),
            ErrorCode::InvalidParams
        );
        assert_eq!(
            code_of(r#"{"command":"session.list","params":{"x":1}}"#),
            ErrorCode::InvalidParams
        );
        assert_eq!(
            code_of(r#"{"command":"session.list","extra":1}"#),
            ErrorCode::InvalidEnvelope
        );
        assert_eq!(code_of(""), ErrorCode::EmptyRequest);
        assert_eq!(
            Command::parse_bytes(&[0xff, 0xfe]).unwrap_err().code,
            ErrorCode::InvalidEncoding
        );
    }

    #[test]
    fn codes_are_unique_and_grouped() {
        let mut numbers: Vec<i32> = ErrorCode::ALL.iter().map(|c| c.number()).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), ErrorCode::ALL.len());
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_number(code.number()), Some(*code));
            assert!((1000..6000).contains(&code.number()));
        }
    }

    /// `docs/commands.md` is written from the tables in this file. Run with
    /// `AGENT_HOST_BLESS=1` to rewrite it after changing a command or a code.
    #[test]
    fn docs_commands_md_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md");
        let want = commands_markdown();
        if std::env::var_os("AGENT_HOST_BLESS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/commands.md is stale: run `AGENT_HOST_BLESS=1 cargo test --lib docs_commands_md`"
        );
    }

    fn commands_markdown() -> String {
        let mut out = String::from(DOC_HEAD);
        out.push_str(
            "| command | route | wire | params | what it does |\n| --- | --- | --- | --- | --- |\n",
        );
        for s in COMMANDS {
            out.push_str(&format!(
                "| `{}` | {} | {} | `{}` | {} |\n",
                s.name,
                s.route.name(),
                if s.wire { "yes" } else { "—" },
                s.params,
                s.summary
            ));
        }
        out.push_str(DOC_ROUTES);
        out.push_str("| code | name | meaning |\n| --- | --- | --- |\n| 0 | `ok` | success |\n");
        let mut group = 0;
        for code in ErrorCode::ALL {
            let g = code.number() / 1000;
            if g != group {
                group = g;
                let title = match g {
                    1 => "Request errors",
                    2 => "Host state",
                    3 => "Session",
                    4 => "Agent",
                    _ => "Subscriber and paired bot",
                };
                out.push_str(&format!("| | **{title}** | |\n"));
            }
            out.push_str(&format!(
                "| {} | `{}` | {} |\n",
                code.number(),
                code.name(),
                code.meaning()
            ));
        }
        out.push_str(DOC_TAIL);
        out
    }

    const DOC_HEAD: &str = "# Commands and reply codes

Every request is an envelope `{\"command\": \"<noun.verb>\", \"params\": {…}}`, given to the
binary as one JSON argument (`agent-host '<envelope>'`), as a name plus params
(`agent-host session.get '{\"session_id\":\"…\"}'`), or sent as one line over `host.sock`.
Every answer is one JSON line `{\"code\": <int>, \"message\": <string>, \"data\": <any>}`; the
process exits 0 exactly when `code` is 0. On an error, `data.error` holds the code's stable
name and any details (e.g. `data.pid` for `already_running`).

Unknown fields are refused (in the envelope and in params) so that a typo is an error, not a
silently ignored option. This page is generated from `src/protocol/envelope.rs`
(`AGENT_HOST_BLESS=1 cargo test --lib docs_commands_md` rewrites it; the test fails when it
is stale). The same codes travel in the WebSocket protocol's `ErrorResp` (docs/protocol.md).

`agent-host follow [session_id] [--json]` and `agent-host open [session_id] [--print]` are
not envelope commands: the first follows a live stream, the second prints (and opens in the
browser) the URL of the host's web UI with a fresh grant (see the README). On a terminal,
`follow` is interactive: type and Enter to send a prompt, Esc to clear the line (on an empty
line: to cancel the turn) or `/cancel`, `y` / `n` on an empty line to answer the target
session's pending permission (allow once / deny), `a` then `a` or Enter to allow always where
offered (it first says the rule; any other key takes it back; a paste is never an answer),
`/to <id-or-suffix>` or Ctrl-N / Ctrl-P to pick the target session when following all of
them (never changed implicitly), Tab then Enter to unfold a tool call's output (`/tools`: all
of them), `/steer <text>`, `/fork`, `/queue` (`/queue rm N`, `/queue clear`), `/help`, and
`/quit` or Ctrl-C to leave; its log goes to `logs/follow.log`, never onto the screen. With `--json`, or
when stdout is not a terminal, it prints lines: readable text, or one canonical event as JSON
per line.

`agent-host pair [--scope '<json>'] [--ttl <s>] [--name <label>]` is not one either: it sends
`pair.create` with those params and, on a terminal, prints the code's QR, the code and how
long it is valid; piped, or with `--json`, the reply line, as `pair.create` prints it.

On a terminal, `session.list`, `session.get`, `session.history`, `agent.list`, `host.status`,
`subscriber.list`, `pair.list`, `pair.create` (its QR) and `doctor` print a table or summary
for people (an error as one `error: <message> (<name>)` line on stderr); with `--json`, or
when stdout is not a terminal, every command prints the reply line described here, and the
exit status is the same either way. `agent-host completions bash|zsh|fish` prints shell
completions and `agent-host man` the man page, both generated from this table.

## Commands

";

    const DOC_ROUTES: &str = "
Routes: **local** runs in the CLI without a host; **ipc** is forwarded to the live host over
`$AGENT_HOST_HOME/host.sock`; **hybrid** uses IPC when the host answers and otherwise reads
`host.lock` (`host.status` then reports `running: false`, or `host_unresponsive` when a process
holds the lock but does not answer; `host.shutdown` then sends SIGTERM to the pid in the lock).
`host.shutdown` returns once the host has released its lock, so a `host.start` right after it
succeeds; with no host running it answers code 0 with `stopped: false`.

**wire**: served over the loopback WebSocket and the relay too, as a `REQUEST` frame with the
same params, reply data and codes (`docs/protocol.md`); the others answer `wrong_route` there.
A wire connection is held to its scope (`out_of_scope` outside it); `subscriber.grant` over the
wire renews only the connection's own subscriber's grant.

A relative `cwd` given to `session.create` on the command line is resolved against the
shell's working directory before it is sent; over IPC a `cwd` must be absolute.

`subscriber.add` scope: without `session_id` or `sessions` the grant may do everything; with
them it may read, prompt and answer permissions for those sessions only, and create, import
and delete none; `prompt`, `permissions` and `create_sessions` given explicitly win over those
defaults (`create_sessions` covers create, fork and delete; import and discover need it and a
scope over every session).

`subscriber.add` replay modes: `none` — only events from the moment of connecting;
`since_cursor` — every bracket after the subscriber's stored cursor; `max_count` (default,
N = `max_count`, default 200) — the newest N brackets, or fewer when the stored cursor shows
the subscriber already has some. A cursor sent in the WebSocket `Hello` wins over all three.

## Reply codes

";

    const DOC_TAIL: &str = "
## Limits

- A request line is at most 1 MiB (`request_too_large` beyond) and must arrive within 5 s
  (`request_timeout`; the variable `AGENT_HOST_IPC_TIMEOUT_MS` changes it).
- At most 64 requests are served at once; more wait for a free slot.
- `session.history` returns at most 5000 events per call (default 200) and about 8 MiB of
  them; page forwards with `after_seq` set to the previous reply's `next_after_seq`, or
  backwards from the end with `before_seq` (first 9007199254740991, 2^53 - 1) set to the
  previous reply's `next_before_seq`. A backward page is in ascending order too; its
  `has_more` says older brackets exist before its first one.
- A session title is at most 1024 bytes.
";

    #[test]
    fn error_reply_carries_name() {
        let reply = Reply::error(ErrorCode::AlreadyRunning, "busy", json!({"pid": 7}));
        assert_eq!(reply.data, json!({"error": "already_running", "pid": 7}));
        assert_eq!(reply.code, 2001);
        assert_eq!(reply.error_code(), Some(ErrorCode::AlreadyRunning));
    }
}
