//! Codex's `app-server` protocol (JSON-RPC over stdio, no `"jsonrpc"` field): the messages the
//! host sends, and [`Translator`], a pure, stateful translator from what the app-server sends
//! to canonical events (style 8). The driver that owns the process is `codex_process.rs`.
//!
//! Translation rules (facts in `../shared/reference/agent-protocols.md` §3):
//! - The thread id (from the `thread/start` / `thread/resume` answer) is `session.bound`.
//! - Only this thread's messages count: sub-agent threads share the pipe. `turn/started` opens
//!   a turn (notifications may precede the `turn/start` answer).
//! - Items: `agentMessage` → `text.start` / `text.delta` / `text.end` (the completed item's text
//!   is authoritative); `reasoning` → `thinking.*`; `commandExecution`, `fileChange`,
//!   `mcpToolCall`, `webSearch` → `tool.call.start` + `tool.call.end` when the item starts,
//!   `tool.exec.update` for output deltas, `tool.exec.start` + `tool.exec.end` (output, exit
//!   code, failed or declined as an error) when it completes; `turn/plan/updated` → an
//!   `artifact.delta` holding the plan; `userMessage` is the host's own `user.text`, skipped.
//! - Approval requests (`item/commandExecution/requestApproval`, `item/fileChange/…`,
//!   `item/permissions/…`) → `permission.request` (options `allow`, `deny`), keyed by the
//!   item id; `serverRequest/resolved` → `permission.resolved` `withdrawn` by the agent (the
//!   session drops it when the request was already answered).
//! - `thread/tokenUsage/updated` adds up per turn (`last`), one `usage` at the turn's end.
//! - `error` with `willRetry` is a `warning`; without, an `error` (the turn ends on its own).
//! - `turn/completed`: open items are closed (an interrupted message never completes), then
//!   `usage` and `run.end`: `completed`, `interrupted` → `cancelled`, `failed` with a category
//!   from `codexErrorInfo`.
//! - Unknown methods and item types are counted and skipped, never fatal.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::protocol::events::{
    ArtifactDelta, BlockEnd, BlockStart, ErrorCategory, ErrorNotice, EventBody, Notice,
    PermissionRequest, PermissionResolved, RunEnd, RunState, SessionBound, TextDelta, ToolCallEnd,
    ToolCallStart, ToolExecEnd, ToolExecStart, ToolExecUpdate, Usage,
};

/// The `initialize` params.
pub fn initialize_params() -> Value {
    json!({
        "clientInfo": {"name": "agent_host", "title": "agent-host", "version": crate::VERSION},
        "capabilities": {"experimentalApi": false},
    })
}

/// `thread/start` params for a session in `cwd`.
pub fn thread_start_params(cwd: &str) -> Value {
    json!({"cwd": cwd, "approvalPolicy": "on-request", "sandbox": "workspace-write"})
}

/// `turn/start` params.
pub fn turn_start_params(thread_id: &str, text: &str) -> Value {
    json!({
        "threadId": thread_id,
        "input": [{"type": "text", "text": text, "text_elements": []}],
    })
}

/// The answer to an approval request.
pub fn approval_answer(method: &str, params: &Value, allow: bool) -> Value {
    if method == "item/permissions/requestApproval" {
        // Granted permissions are listed; none listed is a denial.
        let granted = if allow {
            params.get("permissions").cloned().unwrap_or(json!({}))
        } else {
            json!({})
        };
        return json!({"permissions": granted, "scope": "turn"});
    }
    json!({"decision": if allow { "accept" } else { "decline" }})
}

/// The approval methods, which become `permission.request`s.
pub const APPROVALS: &[&str] = &[
    "item/commandExecution/requestApproval",
    "item/fileChange/requestApproval",
    "item/permissions/requestApproval",
];

/// The `permission.request` id of an approval request: its item id (unique in the thread, and
/// stable across processes, unlike the JSON-RPC id).
pub fn permission_id(params: &Value, rpc_id: &Value) -> String {
    match params.get("itemId").and_then(Value::as_str) {
        Some(item) if !item.is_empty() => item.to_owned(),
        _ => format!("rpc-{rpc_id}"),
    }
}

/// Whether a `thread/resume` error means the thread is not there to resume.
pub fn is_missing_thread(message: &str) -> bool {
    message.contains("no rollout found") || message.contains("thread not found")
}

/// Whether a `thread/resume` error means another process owns the thread.
pub fn is_foreign_writer(message: &str) -> bool {
    message.contains("active writer")
}

/// The rollout file of `thread_id` under `codex_home`: `sessions/**/rollout-*-<id>.jsonl`,
/// confirmed by its first `session_meta` line naming the thread.
pub fn rollout_file(codex_home: &std::path::Path, thread_id: &str) -> Option<std::path::PathBuf> {
    use std::io::BufRead;
    let suffix = format!("-{thread_id}.jsonl");
    let mut stack = vec![codex_home.join("sessions")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("rollout-") && name.ends_with(&suffix)) {
                continue;
            }
            let first = std::fs::File::open(&path)
                .ok()
                .and_then(|f| std::io::BufReader::new(f).lines().next())
                .and_then(Result::ok)
                .and_then(|l| serde_json::from_str::<Value>(&l).ok());
            if first.is_some_and(|v| {
                v["type"] == "session_meta" && v.pointer("/payload/id") == Some(&json!(thread_id))
            }) {
                return Some(path);
            }
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Thinking,
    Tool,
}

#[derive(Debug)]
struct Open {
    kind: Kind,
    text: String,
    exec_started: bool,
}

/// From app-server messages to canonical event bodies; the session adds ids.
#[derive(Debug, Default)]
pub struct Translator {
    thread_id: Option<String>,
    turn_id: Option<String>,
    open: HashMap<String, Open>,
    /// Item ids in the order they opened (to close them in order).
    order: Vec<String>,
    usage: Option<Usage>,
    /// Approval requests not resolved yet: (JSON-RPC id, permission id).
    pending: Vec<(String, String)>,
    skipped: u64,
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl Translator {
    pub fn new() -> Translator {
        Translator::default()
    }

    pub fn thread_id(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }

    pub fn turn_id(&self) -> Option<&str> {
        self.turn_id.as_deref()
    }

    /// Whether a turn is open.
    pub fn in_turn(&self) -> bool {
        self.turn_id.is_some()
    }

    /// Messages skipped: other threads', unknown methods or item types.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// One stdout line, whatever it holds (fixtures replay these).
    pub fn on_line(&mut self, line: &str) -> Vec<EventBody> {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            self.skipped += 1;
            return Vec::new();
        };
        let method = str_of(&msg, "method");
        let params = msg.get("params").unwrap_or(&Value::Null);
        match (method.is_empty(), msg.get("id")) {
            (false, Some(id)) if !id.is_null() => self.on_server_request(id, method, params),
            (false, _) => self.on_notification(method, params),
            (true, _) => self.on_result(msg.get("result").unwrap_or(&Value::Null)),
        }
    }

    /// An answer to one of our requests: the thread it names is ours.
    pub fn on_result(&mut self, result: &Value) -> Vec<EventBody> {
        let id = result
            .pointer("/thread/id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if id.is_empty() || self.thread_id.as_deref() == Some(id) {
            return Vec::new();
        }
        self.thread_id = Some(id.to_owned());
        vec![EventBody::SessionBound(SessionBound {
            native_session_id: id.to_owned(),
        })]
    }

    fn ours(&self, params: &Value) -> bool {
        match params.get("threadId").and_then(Value::as_str) {
            Some(thread) => self.thread_id.as_deref() == Some(thread),
            // Thread-less notifications (config warnings, rate limits) are not a turn's.
            None => false,
        }
    }

    pub fn on_server_request(
        &mut self,
        id: &Value,
        method: &str,
        params: &Value,
    ) -> Vec<EventBody> {
        if !APPROVALS.contains(&method) || !self.ours(params) {
            self.skipped += 1;
            return Vec::new();
        }
        let request_id = permission_id(params, id);
        self.pending.push((id.to_string(), request_id.clone()));
        let (tool, input) = match method {
            "item/commandExecution/requestApproval" => (
                "shell",
                json!({"command": params.get("command"), "cwd": params.get("cwd"), "reason": params.get("reason")}),
            ),
            "item/fileChange/requestApproval" => (
                "apply_patch",
                json!({"reason": params.get("reason"), "grantRoot": params.get("grantRoot")}),
            ),
            _ => (
                "permissions",
                json!({"permissions": params.get("permissions"), "reason": params.get("reason")}),
            ),
        };
        vec![EventBody::PermissionRequest(PermissionRequest {
            request_id,
            tool: tool.to_owned(),
            input,
            options: vec!["allow".to_owned(), "deny".to_owned()],
        })]
    }

    pub fn on_notification(&mut self, method: &str, params: &Value) -> Vec<EventBody> {
        if !self.ours(params) {
            self.skipped += 1;
            return Vec::new();
        }
        match method {
            "turn/started" => {
                self.turn_id = params
                    .pointer("/turn/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.usage = None;
                Vec::new()
            }
            "item/started" => self.on_item_started(params.get("item").unwrap_or(&Value::Null)),
            "item/completed" => self.on_item_completed(params.get("item").unwrap_or(&Value::Null)),
            "item/agentMessage/delta" => self.on_delta(params, Kind::Text),
            "item/reasoning/summaryTextDelta" | "item/reasoning/textDelta" => {
                self.on_delta(params, Kind::Thinking)
            }
            "item/commandExecution/outputDelta" | "item/fileChange/outputDelta" => {
                self.on_output_delta(params)
            }
            "turn/plan/updated" => vec![EventBody::ArtifactDelta(ArtifactDelta {
                artifact_id: format!("plan:{}", str_of(params, "turnId")),
                mime: Some("application/vnd.agent-host.plan+json".to_owned()),
                data: json!({"explanation": params.get("explanation"), "plan": params.get("plan")})
                    .to_string(),
            })],
            "thread/tokenUsage/updated" => {
                let last = params.pointer("/tokenUsage/last").unwrap_or(&Value::Null);
                let n = |k: &str| last.get(k).and_then(Value::as_u64).unwrap_or(0);
                let usage = self.usage.get_or_insert_with(Usage::default);
                usage.input_tokens += n("inputTokens");
                usage.output_tokens += n("outputTokens");
                *usage.cached_input_tokens.get_or_insert(0) += n("cachedInputTokens");
                Vec::new()
            }
            "serverRequest/resolved" => {
                // Our answer, or the agent withdrew the ask (turn ended, interrupted).
                let rpc_id = params
                    .get("requestId")
                    .cloned()
                    .unwrap_or(Value::Null)
                    .to_string();
                let resolved: Vec<String> = self
                    .pending
                    .iter()
                    .filter(|(rpc, _)| *rpc == rpc_id)
                    .map(|(_, perm)| perm.clone())
                    .collect();
                self.pending.retain(|(rpc, _)| *rpc != rpc_id);
                resolved
                    .into_iter()
                    .map(|request_id| {
                        EventBody::PermissionResolved(PermissionResolved {
                            request_id,
                            decision: "withdrawn".to_owned(),
                            by: Some("agent".to_owned()),
                        })
                    })
                    .collect()
            }
            "error" => {
                let message = params
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("the agent reported an error")
                    .to_owned();
                if params.get("willRetry").and_then(Value::as_bool) == Some(true) {
                    vec![EventBody::Warning(Notice {
                        code: "agent_retrying".to_owned(),
                        message,
                    })]
                } else {
                    let category = category_of(params.pointer("/error/codexErrorInfo"));
                    vec![EventBody::Error(ErrorNotice { category, message })]
                }
            }
            "warning" => vec![EventBody::Warning(Notice {
                code: "agent_warning".to_owned(),
                message: str_of(params, "message").to_owned(),
            })],
            "turn/completed" => self.on_turn_completed(params.get("turn").unwrap_or(&Value::Null)),
            "thread/started" | "thread/status/changed" | "turn/diff/updated" => Vec::new(),
            _ => {
                self.skipped += 1;
                Vec::new()
            }
        }
    }

    fn on_item_started(&mut self, item: &Value) -> Vec<EventBody> {
        let id = str_of(item, "id").to_owned();
        let (kind, out) = match str_of(item, "type") {
            "agentMessage" => (
                Kind::Text,
                vec![EventBody::TextStart(BlockStart {
                    item_id: Some(id.clone()),
                })],
            ),
            "reasoning" => (
                Kind::Thinking,
                vec![EventBody::ThinkingStart(BlockStart {
                    item_id: Some(id.clone()),
                })],
            ),
            "userMessage" => return Vec::new(),
            other => match tool_of(other, item) {
                Some((name, input)) => (
                    Kind::Tool,
                    vec![
                        EventBody::ToolCallStart(ToolCallStart {
                            call_id: id.clone(),
                            name: name.clone(),
                        }),
                        EventBody::ToolCallEnd(ToolCallEnd {
                            truncated: None,
                            call_id: id.clone(),
                            name,
                            input,
                        }),
                    ],
                ),
                None => {
                    self.skipped += 1;
                    return Vec::new();
                }
            },
        };
        self.open.insert(
            id.clone(),
            Open {
                kind,
                text: String::new(),
                exec_started: false,
            },
        );
        self.order.push(id);
        out
    }

    fn on_delta(&mut self, params: &Value, kind: Kind) -> Vec<EventBody> {
        let item_id = str_of(params, "itemId").to_owned();
        let delta = str_of(params, "delta").to_owned();
        let Some(open) = self.open.get_mut(&item_id).filter(|o| o.kind == kind) else {
            return Vec::new();
        };
        open.text.push_str(&delta);
        let body = TextDelta {
            item_id: Some(item_id),
            text: delta,
        };
        vec![match kind {
            Kind::Thinking => EventBody::ThinkingDelta(body),
            _ => EventBody::TextDelta(body),
        }]
    }

    fn on_output_delta(&mut self, params: &Value) -> Vec<EventBody> {
        let call_id = str_of(params, "itemId").to_owned();
        let Some(open) = self.open.get_mut(&call_id).filter(|o| o.kind == Kind::Tool) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if !open.exec_started {
            open.exec_started = true;
            out.push(EventBody::ToolExecStart(ToolExecStart {
                call_id: call_id.clone(),
                name: None,
            }));
        }
        out.push(EventBody::ToolExecUpdate(ToolExecUpdate {
            call_id,
            output: str_of(params, "delta").to_owned(),
        }));
        out
    }

    fn on_item_completed(&mut self, item: &Value) -> Vec<EventBody> {
        let id = str_of(item, "id").to_owned();
        let Some(open) = self.open.remove(&id) else {
            return Vec::new();
        };
        self.order.retain(|o| *o != id);
        match open.kind {
            Kind::Text => vec![EventBody::TextEnd(BlockEnd {
                truncated: None,
                item_id: Some(id),
                text: item
                    .get("text")
                    .and_then(Value::as_str)
                    .map_or(open.text, str::to_owned),
            })],
            Kind::Thinking => {
                let parts = |k: &str| -> Vec<String> {
                    item.get(k)
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|s| s.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let mut text = parts("summary");
                text.extend(parts("content"));
                let text = if text.is_empty() {
                    open.text
                } else {
                    text.join("\n")
                };
                vec![EventBody::ThinkingEnd(BlockEnd {
                    truncated: None,
                    item_id: Some(id),
                    text,
                })]
            }
            Kind::Tool => {
                let mut out = Vec::new();
                if !open.exec_started {
                    out.push(EventBody::ToolExecStart(ToolExecStart {
                        call_id: id.clone(),
                        name: None,
                    }));
                }
                let (output, exit_code) = tool_result(item);
                let status = str_of(item, "status");
                out.push(EventBody::ToolExecEnd(ToolExecEnd {
                    truncated: None,
                    call_id: id,
                    output,
                    is_error: status != "completed" || exit_code.is_some_and(|c| c != 0),
                    exit_code,
                }));
                out
            }
        }
    }

    fn on_turn_completed(&mut self, turn: &Value) -> Vec<EventBody> {
        let mut out = self.close_open();
        self.pending.clear();
        self.turn_id = None;
        if let Some(usage) = self.usage.take() {
            out.push(EventBody::Usage(usage));
        }
        let end = match str_of(turn, "status") {
            "completed" => RunEnd {
                state: RunState::Completed,
                category: None,
                message: None,
            },
            "interrupted" => RunEnd {
                state: RunState::Cancelled,
                category: Some(ErrorCategory::Cancelled),
                message: None,
            },
            _ => {
                let error = turn.get("error").unwrap_or(&Value::Null);
                let category = category_of(error.get("codexErrorInfo"));
                let message = match str_of(error, "message") {
                    "" => format!("the turn ended {}", str_of(turn, "status")),
                    m => m.to_owned(),
                };
                RunEnd {
                    state: RunState::Failed,
                    category: Some(category),
                    message: Some(message),
                }
            }
        };
        out.push(EventBody::RunEnd(end));
        out
    }

    /// Close every item still open: an interrupted message keeps its partial text.
    fn close_open(&mut self) -> Vec<EventBody> {
        let mut out = Vec::new();
        for id in std::mem::take(&mut self.order) {
            let Some(open) = self.open.remove(&id) else {
                continue;
            };
            out.push(match open.kind {
                Kind::Text => EventBody::TextEnd(BlockEnd {
                    truncated: None,
                    item_id: Some(id),
                    text: open.text,
                }),
                Kind::Thinking => EventBody::ThinkingEnd(BlockEnd {
                    truncated: None,
                    item_id: Some(id),
                    text: open.text,
                }),
                Kind::Tool => EventBody::ToolExecEnd(ToolExecEnd {
                    truncated: None,
                    call_id: id,
                    output: "the tool did not finish".to_owned(),
                    is_error: true,
                    exit_code: None,
                }),
            });
        }
        self.open.clear();
        out
    }

    /// The process ended. Mid-turn that is a failed run.
    pub fn on_exit(&mut self, in_turn: bool, status: &str) -> Vec<EventBody> {
        let mut out = self.close_open();
        self.turn_id = None;
        if in_turn {
            let message = format!("the agent process exited mid-turn ({status})");
            out.push(EventBody::Error(ErrorNotice {
                category: ErrorCategory::AgentFailed,
                message: message.clone(),
            }));
            out.push(EventBody::RunEnd(RunEnd {
                state: RunState::Failed,
                category: Some(ErrorCategory::AgentFailed),
                message: Some(message),
            }));
        }
        out
    }
}

/// A tool item's canonical name and input.
fn tool_of(kind: &str, item: &Value) -> Option<(String, Value)> {
    Some(match kind {
        "commandExecution" => (
            "shell".to_owned(),
            json!({"command": item.get("command"), "cwd": item.get("cwd")}),
        ),
        "fileChange" => (
            "apply_patch".to_owned(),
            json!({"changes": item.get("changes")}),
        ),
        "mcpToolCall" => (
            format!("{}.{}", str_of(item, "server"), str_of(item, "tool")),
            item.get("arguments").cloned().unwrap_or(Value::Null),
        ),
        "webSearch" => ("web_search".to_owned(), json!({"query": item.get("query")})),
        _ => return None,
    })
}

/// A completed tool item's output and exit code.
fn tool_result(item: &Value) -> (String, Option<i64>) {
    match str_of(item, "type") {
        "commandExecution" => (
            str_of(item, "aggregatedOutput").to_owned(),
            item.get("exitCode").and_then(Value::as_i64),
        ),
        "fileChange" => {
            let changes = item
                .get("changes")
                .and_then(Value::as_array)
                .map(|c| {
                    c.iter()
                        .map(|c| format!("{} {}", str_of(c, "kind"), str_of(c, "path")))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            (changes, None)
        }
        "mcpToolCall" => {
            let result = item
                .get("error")
                .filter(|e| !e.is_null())
                .or_else(|| item.get("result"))
                .cloned()
                .unwrap_or(Value::Null);
            (
                match result {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
                None,
            )
        }
        _ => (str_of(item, "query").to_owned(), None),
    }
}

/// The shared category of a `codexErrorInfo`.
fn category_of(info: Option<&Value>) -> ErrorCategory {
    let name = match info {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => o.keys().next().map_or("", String::as_str),
        _ => "",
    };
    match name {
        "contextWindowExceeded" | "ContextWindowExceeded" => ErrorCategory::ContextExhausted,
        "usageLimitExceeded" | "UsageLimitExceeded" => ErrorCategory::RateLimited,
        "unauthorized" | "Unauthorized" => ErrorCategory::AuthRequired,
        _ => ErrorCategory::AgentFailed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every recorded transcript in `fixtures/codex/*.jsonl` (the app-server's stdout lines,
    /// with the answers to the host's requests) beside its expected events (`*.events.json`).
    /// `AGENT_HOST_BLESS=1` rewrites the expectations for review.
    #[test]
    fn fixtures_translate_to_their_expected_events() {
        let checked =
            super::super::fixtures::check_all("codex", Translator::new, |t, l| t.on_line(l));
        assert!(checked >= 6, "only {checked} fixtures");
    }

    fn kinds(events: &[EventBody]) -> Vec<&'static str> {
        events.iter().map(EventBody::kind).collect()
    }

    fn note(t: &mut Translator, method: &str, params: Value) -> Vec<EventBody> {
        t.on_notification(method, &params)
    }

    #[test]
    fn other_threads_are_ignored_and_an_interrupted_message_is_closed() {
        let mut t = Translator::new();
        assert_eq!(
            kinds(&t.on_result(&json!({"thread": {"id": "th"}}))),
            ["session.bound"]
        );
        // A sub-agent thread's items: not ours.
        assert!(
            note(
                &mut t,
                "item/started",
                json!({"threadId": "other", "item": {"type": "agentMessage", "id": "x"}})
            )
            .is_empty()
        );
        note(
            &mut t,
            "turn/started",
            json!({"threadId": "th", "turn": {"id": "tu"}}),
        );
        assert!(t.in_turn());
        note(
            &mut t,
            "item/started",
            json!({"threadId": "th", "item": {"type": "agentMessage", "id": "m"}}),
        );
        note(
            &mut t,
            "item/agentMessage/delta",
            json!({"threadId": "th", "itemId": "m", "delta": "part"}),
        );
        note(
            &mut t,
            "error",
            json!({"threadId": "th", "willRetry": true, "error": {"message": "reconnecting"}}),
        );
        let end = note(
            &mut t,
            "turn/completed",
            json!({"threadId": "th", "turn": {"id": "tu", "status": "interrupted"}}),
        );
        assert_eq!(kinds(&end), ["text.end", "run.end"]);
        match &end[0] {
            EventBody::TextEnd(b) => assert_eq!(b.text, "part"),
            other => panic!("{other:?}"),
        }
        match &end[1] {
            EventBody::RunEnd(e) => assert_eq!(e.state, RunState::Cancelled),
            other => panic!("{other:?}"),
        }
        assert!(!t.in_turn());
        assert_eq!(t.skipped(), 1);
    }

    #[test]
    fn rollouts_are_found_by_suffix_and_confirmed_by_their_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let day = dir.path().join("sessions/2026/11/30");
        std::fs::create_dir_all(&day).unwrap();
        let real = day.join("rollout-2026-11-30T07-00-00-th1.jsonl");
        std::fs::write(
            &real,
            "{\"type\":\"session_meta\",\"payload\":{\"id\":\"th1\"}}\n",
        )
        .unwrap();
        let liar = day.join("rollout-2026-11-30T07-00-01-th2.jsonl");
        std::fs::write(
            &liar,
            "{\"type\":\"session_meta\",\"payload\":{\"id\":\"other\"}}\n",
        )
        .unwrap();
        assert_eq!(rollout_file(dir.path(), "th1"), Some(real));
        assert_eq!(rollout_file(dir.path(), "th2"), None);
        assert_eq!(rollout_file(dir.path(), "th3"), None);
    }

    #[test]
    fn a_failed_turn_carries_its_category() {
        let mut t = Translator::new();
        t.on_result(&json!({"thread": {"id": "th"}}));
        note(
            &mut t,
            "turn/started",
            json!({"threadId": "th", "turn": {"id": "tu"}}),
        );
        let end = note(
            &mut t,
            "turn/completed",
            json!({"threadId": "th", "turn": {"id": "tu", "status": "failed",
            "error": {"message": "too long", "codexErrorInfo": "contextWindowExceeded"}}}),
        );
        match end.last() {
            Some(EventBody::RunEnd(e)) => {
                assert_eq!(e.state, RunState::Failed);
                assert_eq!(e.category, Some(ErrorCategory::ContextExhausted));
                assert_eq!(e.message.as_deref(), Some("too long"));
            }
            other => panic!("{other:?}"),
        }
        assert!(is_missing_thread("no rollout found for thread id 01"));
        assert!(is_foreign_writer("thread 01 already has an active writer"));
    }
}
