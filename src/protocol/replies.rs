//! The data of command replies, as typed structs both sides share: the host builds its replies
//! from them and clients (`follow`, tests, anyone linking the crate) read them back with
//! [`Reply::data_as`](super::envelope::Reply::data_as) instead of picking JSON keys.
//! Field names are the wire's (snake_case), the same over IPC and every wire transport.

use serde::{Deserialize, Serialize};

/// `subscriber.add` and `subscriber.grant`: a token to open a WebSocket with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub subscriber_id: String,
    pub ws_endpoint: String,
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

/// `session.history`: a page of brackets after a cursor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub session_id: String,
    pub events: Vec<HistoryEntry>,
    pub count: usize,
    /// The cursor to ask for the next page with (the last event's, or the one given).
    pub next_after_seq: i64,
    /// The page is full (by count or size): there may be more after it.
    pub has_more: bool,
}
