//! The data of command replies, as typed structs both sides share: the host builds its replies
//! from them and clients (`follow`, tests, anyone linking the crate) read them back with
//! [`Reply::data_as`](super::envelope::Reply::data_as) instead of picking JSON keys.
//! Field names are the wire's (snake_case), the same over IPC and every wire transport.

use serde::{Deserialize, Serialize};

use super::states::{RunStatus, SessionState};

/// `subscriber.add` and `subscriber.grant`: a token to open a WebSocket with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub subscriber_id: String,
    pub ws_endpoint: String,
    /// The same protocol over the host's Unix socket (`ws.sock`, this user only), for clients
    /// on this machine; absent from a host that has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ws_socket: Option<String>,
    pub ws_token: String,
    pub token_ttl_s: u64,
}

/// One stored bracket of `session.history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub sequence_id: i64,
    pub message_id: String,
    pub run_id: Option<String>,
    pub kind: String,
    pub created_at_ms: i64,
    /// The canonical event, as published (a kind this build does not know passes through).
    pub event: serde_json::Value,
}

/// `session.history`: a page of brackets, in ascending order, after a cursor (`after_seq`)
/// or before one (`before_seq`, paging from the end backwards).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub session_id: String,
    pub events: Vec<HistoryEntry>,
    pub count: usize,
    /// The cursor to ask for the next page forwards with: the last event's; on an empty page
    /// the `after_seq` given (0 for a backward page).
    pub next_after_seq: i64,
    /// The cursor to ask for the next page backwards with: the first event's; on an empty
    /// page the `before_seq` given (`null` for a forward page).
    pub next_before_seq: Option<i64>,
    /// Forwards: the page is full (by count or size), there may be more after it.
    /// Backwards: older brackets exist before the page's first.
    pub has_more: bool,
}

/// A session: its stored row (`session.create`, `session.get`, `session.rename`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub agent_type: String,
    pub native_session_id: Option<String>,
    pub cwd: String,
    pub parent_session_id: Option<String>,
    pub title: Option<String>,
    pub state: SessionState,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// A native session this one starts as a fork of (an explicit fork, or an imported
    /// session), until its own native id is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_of: Option<String>,
    /// What it was created with (`session.create`'s options, `session.set_model` since).
    /// On the wire its MCP servers' env and header values read [`REDACTED`] (names kept):
    /// they are secrets of the creator's, and a session is read by every subscriber in scope.
    /// The store keeps the real values (it writes the options itself, not this form).
    #[serde(
        default,
        skip_serializing_if = "super::options::SessionOptions::is_empty",
        serialize_with = "redacted_options"
    )]
    pub options: super::options::SessionOptions,
    /// What its native session was bound under, once known; compared before every resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<super::options::BindingRecord>,
}

/// What an MCP server's env or header value reads as in a reply.
pub const REDACTED: &str = "<redacted>";

/// `options` with every MCP env and header value replaced by [`REDACTED`].
pub fn redacted(options: &super::options::SessionOptions) -> super::options::SessionOptions {
    use super::options::McpServer;
    let mut copy = options.clone();
    for server in &mut copy.mcp_servers {
        match server {
            McpServer::Stdio { env, .. } => {
                for var in env {
                    var.value = REDACTED.to_owned();
                }
            }
            McpServer::Http { headers, .. } | McpServer::Sse { headers, .. } => {
                for header in headers {
                    header.value = REDACTED.to_owned();
                }
            }
        }
    }
    copy
}

fn redacted_options<S: serde::Serializer>(
    options: &super::options::SessionOptions,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    redacted(options).serialize(serializer)
}

/// `session.create`, `session.import`: the new session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionCreated {
    pub session_id: String,
    pub session: SessionInfo,
}

/// `session.fork`: the new session, continuing its parent's conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionForkedReply {
    pub session_id: String,
    pub parent_session_id: Option<String>,
    pub session: SessionInfo,
}

/// `session.rename`: the row as it is now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRenamed {
    pub session: SessionInfo,
}

/// `session.get`: the row, and what the live session is doing (`null` before it first ran
/// in this host).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub session: SessionInfo,
    pub live: Option<LiveStatus>,
    /// The prompts waiting in the session's queue, head (the next to run) first.
    #[serde(default)]
    pub queue: Vec<QueueEntry>,
    /// The "allow always" rules answers in this session made its agent keep, oldest first:
    /// why a later matching tool ran without asking.
    #[serde(default)]
    pub permission_rules: Vec<PermissionRule>,
}

/// An accepted `allow_always` option, recorded on its session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionRule {
    /// The request it answered.
    pub request_id: String,
    pub tool: String,
    /// The agent's option that was chosen, and its label.
    pub option_id: String,
    pub label: String,
    /// The rule in words ("always allow Bash(npm test) in this session").
    pub description: String,
    /// Who chose it (as `permission.resolved`'s `by`).
    pub by: String,
    pub at_ms: i64,
}

/// A prompt waiting in a session's queue (`session.get`, `queue.move`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueEntry {
    /// The run it becomes when it starts.
    pub run_id: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_msg_id: Option<String>,
    /// When it was sent (ms since the epoch).
    pub created_at_ms: i64,
    /// Who sent it, when known (as its `user.text` will say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<crate::protocol::events::PromptFrom>,
    /// `text` is only the start of the prompt: a reply carries at most 2 MiB of queued text
    /// in all, as `queue.changed` does (`queue.edit` sets the whole text).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// `queue.edit`: the queued prompt's text as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueEdited {
    pub run_id: String,
    pub text: String,
}

/// `queue.move`: the queue after the move, head first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueOrder {
    pub queue: Vec<QueueEntry>,
}

/// `queue.clear`: the runs taken out of the queue, as they were ordered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueCleared {
    pub removed: Vec<String>,
}

/// `session.steer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteerReceipt {
    /// The run the text went into (`steered`), or the run it became (a queued prompt, or a
    /// plain send when nothing ran).
    pub run_id: String,
    /// The agent took it into the running turn.
    pub steered: bool,
    /// It waits in the queue: at its head when the agent could not take it mid-turn.
    pub queued: bool,
    /// The `client_msg_id` was seen before: this is that earlier steer's receipt (nothing
    /// was sent or queued again).
    #[serde(default)]
    pub duplicate: bool,
}

/// What a live session is doing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveStatus {
    /// The agent process (and process group) id, while one runs.
    pub agent_pid: Option<u32>,
    pub run_id: Option<String>,
    pub queued: Vec<String>,
    /// The session file is watched for other writers (the host's child is idle).
    pub watching: bool,
    /// Someone else wrote the session file: the next prompt forks.
    pub drifted: bool,
}

/// One row of `session.list`: the session and its activity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSummary {
    #[serde(flatten)]
    pub session: SessionInfo,
    /// The newest of the row's creation, its last update and its last event (ms since the
    /// epoch): the list's order.
    pub last_activity_ms: i64,
    /// The start (at most 160 characters) of the newest `user.text` or `text.end` text.
    pub preview: Option<String>,
}

/// `session.list`: one page, and the cursor of the next one (`None`: this is the last page).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionPage {
    pub sessions: Vec<SessionSummary>,
    pub next_cursor: Option<String>,
}

/// One run: a row of `session.runs`, and the reply of `session.run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    pub session_id: String,
    pub state: RunStatus,
    pub client_msg_id: Option<String>,
    /// The error category of a run that did not complete (`transport_lost` with a `message`
    /// saying the prompt was not sent; `result_delivery_unknown` when the agent had it and no
    /// result came).
    pub error_category: Option<String>,
    /// What the run's `run.end` said (or the warning of a queued prompt that never ran);
    /// `None` for a plain completion, a run still going, and runs of hosts before schema 5.
    #[serde(default)]
    pub message: Option<String>,
    pub created_at_ms: i64,
    pub ended_at_ms: Option<i64>,
}

/// `session.runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunList {
    pub runs: Vec<RunInfo>,
}

/// `session.send`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendReceipt {
    pub run_id: String,
    /// It waits behind a busy run.
    pub queued: bool,
    /// The `client_msg_id` was seen before: this is that earlier run (nothing new started).
    pub duplicate: bool,
}

/// `session.set_model`: the model the session runs from now on, and how the agent takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSet {
    pub session_id: String,
    pub model: String,
    pub applied: super::events::Applied,
}

/// What `session.cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// The running turn was interrupted; its `run.end` follows.
    Cancelling,
    /// A queued run was taken out of the queue.
    Cancelled,
}

/// `session.cancel`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelReceipt {
    pub run_id: String,
    pub state: CancelOutcome,
}

/// `permission.respond`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionReceipt {
    pub request_id: String,
    /// `allow` or `deny`.
    pub decision: String,
    /// The agent's option the answer chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_id: Option<String>,
    /// The rule recorded on the session, when the option keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// `session.activate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivateReceipt {
    pub session_id: String,
    /// The agent process (and process group) id, when the adapter runs one.
    pub agent_pid: Option<u32>,
    /// The agent was open already (or a run is opening it): nothing was started.
    pub already: bool,
}

/// One pending permission request of `permission.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingPermission {
    pub session_id: String,
    pub request_id: String,
    /// The run that asked (none for a request outside a run).
    pub run_id: Option<String>,
    pub tool: String,
    /// The tool input the agent asks to run with.
    pub input: serde_json::Value,
    /// The choices the agent offers (those of its `permission.request`).
    pub options: Vec<crate::protocol::events::PermissionOption>,
    pub created_at_ms: i64,
}

/// `permission.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionList {
    pub permissions: Vec<PendingPermission>,
}

/// `session.delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: String,
}

/// One session of an agent's own, as `session.discover` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveredSession {
    pub native_session_id: String,
    /// Its first real prompt (at most 500 characters).
    pub first_prompt: String,
    /// When it was last written (its last entry's time, else its file's mtime), ms.
    pub last_activity_ms: i64,
    /// How many prompts it holds.
    pub turns: u32,
    /// The host session already made from it (imported, or the host's own), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_as: Option<String>,
}

/// `session.discover`: newest first, at most 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionsDiscovered {
    pub sessions: Vec<DiscoveredSession>,
}
