//! The Agent Client Protocol v1 (JSON-RPC 2.0 over stdio): the messages the host sends, and
//! [`Translator`], a pure, stateful translator from what an ACP agent sends to canonical
//! events (style 8). The driver that owns the process is `acp_process.rs`.
//!
//! Translation rules (facts in `../shared/reference/agent-protocols.md` §4):
//! - The `sessionId` of `session/new` (or `session/fork`) is `session.bound`; only updates of
//!   that session count.
//! - Updates count only inside a turn, after the host's `session/prompt` went out: a
//!   `session/load` replays the whole history as updates, which must not be published again.
//! - `agent_message_chunk` → `text.start` / `text.delta` / `text.end` (a new `messageId` starts
//!   a new block); `agent_thought_chunk` → `thinking.*`; `user_message_chunk` is the host's own
//!   prompt (or replay), skipped.
//! - `tool_call` → `tool.call.start`; the input (`rawInput`, which some agents only fill in a
//!   later `tool_call_update`) is complete at the permission request or when the tool starts:
//!   `tool.call.end`. `tool_call_update` `in_progress` → `tool.exec.start`; content while
//!   running → `tool.exec.update`; `completed` / `failed` → `tool.exec.end` (its text content,
//!   else `rawOutput`).
//! - `plan` → an `artifact.delta` (`plan`) holding the entries; `usage_update` keeps the cost;
//!   the prompt answer's `usage` is the turn's `usage`.
//! - `session/request_permission` → `permission.request` with the agent's own options (its
//!   `optionId`, `name` and `kind`; [`permission_options`]), keyed by the tool call id; the
//!   chosen `optionId` is the answer ([`permission_answer`]).
//! - The prompt answer's `stopReason` → `run.end`: `end_turn` completed, `cancelled`
//!   cancelled, `max_tokens` failed `context_exhausted`, `refusal` / `max_turn_requests`
//!   failed `agent_failed`. Open blocks and tools are closed first.
//! - The process gone before the prompt's answer: `run.end` failed `result_delivery_unknown`
//!   ([`Translator::on_exit`]); the driver ends a prompt it could not write itself.
//! - Known updates with nothing to show (`available_commands_update`, `current_mode_update`,
//!   `config_option_update`, `session_info_update`) are ignored; unknown ones are counted
//!   ([`Translator::unknown`]) and skipped, never fatal.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::protocol::events::{
    ArtifactDelta, BlockEnd, BlockStart, ErrorCategory, ErrorNotice, EventBody, PermissionOption,
    PermissionOptionKind, PermissionRequest, RunEnd, RunState, SessionBound, TextDelta,
    ToolCallEnd, ToolCallStart, ToolExecEnd, ToolExecStart, ToolExecUpdate, Usage,
};

/// The ACP version this client speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// The `initialize` params: no file-system or terminal capabilities (the host serves neither).
pub fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false},
        "clientInfo": {"name": "agent-host", "title": "agent-host", "version": crate::VERSION},
    })
}

/// What an agent said it can do, from its `initialize` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AgentCaps {
    pub load: bool,
    pub resume: bool,
    pub fork: bool,
    pub list: bool,
    pub close: bool,
    /// `authMethods` offered (ids).
    pub auth_methods: Vec<String>,
    pub name: Option<String>,
    pub version: Option<String>,
}

impl AgentCaps {
    pub fn from_initialize(result: &Value) -> AgentCaps {
        let caps = result.get("agentCapabilities").unwrap_or(&Value::Null);
        let session = caps.get("sessionCapabilities").unwrap_or(&Value::Null);
        let has = |name: &str| session.get(name).is_some_and(|v| !v.is_null());
        AgentCaps {
            load: caps.get("loadSession").and_then(Value::as_bool) == Some(true),
            resume: has("resume"),
            fork: has("fork"),
            list: has("list"),
            close: has("close"),
            auth_methods: result
                .get("authMethods")
                .and_then(Value::as_array)
                .map(|m| {
                    m.iter()
                        .filter_map(|a| a.get("id").and_then(Value::as_str).map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            name: result
                .pointer("/agentInfo/name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            version: result
                .pointer("/agentInfo/version")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }
    }
}

/// Params of `session/new`, `session/load`, `session/resume`, `session/fork`.
pub fn session_params(session_id: Option<&str>, cwd: &str) -> Value {
    let mut params = json!({"cwd": cwd, "mcpServers": []});
    if let Some(id) = session_id {
        params["sessionId"] = json!(id);
    }
    params
}

/// `session/prompt` params.
pub fn prompt_params(session_id: &str, text: &str) -> Value {
    json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})
}

/// The options of a `session/request_permission`, as the agent words them; an `allow_always`
/// one's rule is its name (the agent's own words for what it will keep allowing, e.g. Qwen's
/// "Always Allow in project: touch *"). Options of a kind this build does not know are left
/// out (they cannot be told apart from a refusal).
pub fn permission_options(params: &Value) -> Vec<PermissionOption> {
    params
        .get("options")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|o| {
            let id = o.get("optionId").and_then(Value::as_str)?;
            let kind: PermissionOptionKind =
                serde_json::from_value(o.get("kind").cloned().unwrap_or(Value::Null)).ok()?;
            let label = o.get("name").and_then(Value::as_str).unwrap_or(id);
            Some(match kind {
                PermissionOptionKind::AllowAlways => {
                    PermissionOption::always(id, label, label.to_owned())
                }
                kind => PermissionOption::new(id, label, kind),
            })
        })
        .collect()
}

/// The answer to `session/request_permission`: the chosen option when the agent offered it;
/// else the offered option of the matching kind — allow once (else allow always) or reject
/// once (else reject always). `allow_always` is only chosen by kind when it is the agent's
/// only way to allow. Nothing suitable offered: `cancelled`.
pub fn permission_answer(options: &Value, allow: bool, option: Option<&PermissionOption>) -> Value {
    let offered = options.as_array().map(Vec::as_slice).unwrap_or_default();
    if let Some(option) = option
        && offered
            .iter()
            .any(|o| o.get("optionId").and_then(Value::as_str) == Some(option.id.as_str()))
    {
        return json!({"outcome": {"outcome": "selected", "optionId": option.id}});
    }
    let kinds: &[&str] = if allow {
        &["allow_once", "allow_always"]
    } else {
        &["reject_once", "reject_always"]
    };
    let chosen = kinds.iter().find_map(|kind| {
        offered
            .iter()
            .find(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
            .and_then(|o| o.get("optionId").cloned())
    });
    match chosen {
        Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
        None => cancelled_answer(),
    }
}

/// Whether an answer made by [`permission_answer`] selects one of the `offered` options
/// whose kind is `allow_always` (the agent then keeps the rule).
pub fn answer_keeps(offered: &Value, answer: &Value) -> bool {
    let Some(id) = answer.pointer("/outcome/optionId").and_then(Value::as_str) else {
        return false;
    };
    offered
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .any(|o| {
            o.get("optionId").and_then(Value::as_str) == Some(id)
                && o.get("kind").and_then(Value::as_str) == Some("allow_always")
        })
}

/// The answer to a permission request left open by a cancel.
pub fn cancelled_answer() -> Value {
    json!({"outcome": {"outcome": "cancelled"}})
}

/// Whether a failed `session/load` / `session/resume` means the session is gone (there is no
/// standard code; agents use -32602, -32603 or -32002 with a sentence).
pub fn is_missing_session(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "not found",
        "unknown session",
        "no session",
        "invalid session",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

#[derive(Debug)]
struct Block {
    item_id: String,
    message_id: Option<String>,
    text: String,
}

#[derive(Debug, Default)]
struct Tool {
    name: String,
    input: Value,
    call_ended: bool,
    exec_started: bool,
    done: bool,
    output: String,
}

/// Translates one ACP session's messages.
#[derive(Debug, Default)]
pub struct Translator {
    session_id: Option<String>,
    in_turn: bool,
    text: Option<Block>,
    thinking: Option<Block>,
    tools: HashMap<String, Tool>,
    /// Tool call ids in the order they began.
    tool_order: Vec<String>,
    cost_usd: Option<f64>,
    blocks: u64,
    skipped: u64,
    unknown: u64,
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl Translator {
    pub fn new() -> Translator {
        Translator::default()
    }

    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    pub fn in_turn(&self) -> bool {
        self.in_turn
    }

    /// Messages skipped (not this session's, outside a turn, or not understood).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// `session/update` variants this translator does not know.
    pub fn unknown(&self) -> u64 {
        self.unknown
    }

    /// The session is `id` from now on.
    pub fn bind(&mut self, id: &str) -> Vec<EventBody> {
        if id.is_empty() || self.session_id.as_deref() == Some(id) {
            return Vec::new();
        }
        self.session_id = Some(id.to_owned());
        vec![EventBody::SessionBound(SessionBound {
            native_session_id: id.to_owned(),
        })]
    }

    /// The host's `session/prompt` went out: updates are this turn's from now on.
    pub fn start_turn(&mut self) {
        self.in_turn = true;
        self.cost_usd = None;
    }

    /// One transcript record or stdout line (fixtures replay these): a JSON-RPC message from
    /// the agent, or (in a recorded transcript) one the client sent.
    pub fn on_record(&mut self, line: &str, prompts: &mut Vec<Value>) -> Vec<EventBody> {
        let Ok(record) = serde_json::from_str::<Value>(line) else {
            self.skipped += 1;
            return Vec::new();
        };
        let Some(msg) = record.get("msg") else {
            return Vec::new();
        };
        let method = str_of(msg, "method");
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let params = msg.get("params").unwrap_or(&Value::Null);
        if record.get("dir").and_then(Value::as_str) == Some("in") {
            // What the client sent: a prompt opens a turn; remember which answers are whose.
            if method == "session/prompt" {
                prompts.push(id);
                self.start_turn();
            } else if !method.is_empty() {
                prompts
                    .push(json!({"pending": method, "id": id, "session": params.get("sessionId")}));
            }
            return Vec::new();
        }
        if !method.is_empty() && !id.is_null() {
            return self.on_permission_request(params).0;
        }
        if !method.is_empty() {
            return self.on_notification(method, params);
        }
        if prompts.contains(&id) {
            return match msg.get("error") {
                Some(error) => self.on_prompt_error(
                    ErrorCategory::AgentFailed,
                    str_of(error, "message").to_owned(),
                ),
                None => self.on_prompt_result(msg.get("result").unwrap_or(&Value::Null)),
            };
        }
        let Some(pending) = prompts.iter().find(|p| p.get("id") == Some(&id)).cloned() else {
            return Vec::new();
        };
        if msg.get("error").is_some() {
            return Vec::new();
        }
        match pending.get("pending").and_then(Value::as_str) {
            // The answer names the (new) session.
            Some("session/new" | "session/fork") => msg
                .pointer("/result/sessionId")
                .and_then(Value::as_str)
                .map(|session| self.bind(session))
                .unwrap_or_default(),
            // The session asked for is the one loaded or resumed.
            Some("session/load" | "session/resume") => pending
                .get("session")
                .and_then(Value::as_str)
                .map(|session| self.bind(session))
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    fn next_item(&mut self, prefix: &str) -> String {
        self.blocks += 1;
        format!("{prefix}{}", self.blocks)
    }

    fn close_text(&mut self, out: &mut Vec<EventBody>) {
        if let Some(block) = self.text.take() {
            out.push(EventBody::TextEnd(BlockEnd {
                truncated: None,
                item_id: Some(block.item_id),
                text: block.text,
            }));
        }
    }

    fn close_thinking(&mut self, out: &mut Vec<EventBody>) {
        if let Some(block) = self.thinking.take() {
            out.push(EventBody::ThinkingEnd(BlockEnd {
                truncated: None,
                item_id: Some(block.item_id),
                text: block.text,
            }));
        }
    }

    /// A `session/update` (or another notification).
    pub fn on_notification(&mut self, method: &str, params: &Value) -> Vec<EventBody> {
        if method != "session/update"
            || self.session_id.as_deref() != Some(str_of(params, "sessionId"))
            || !self.in_turn
        {
            self.skipped += 1;
            return Vec::new();
        }
        let update = params.get("update").unwrap_or(&Value::Null);
        let variant = update
            .get("sessionUpdate")
            .or_else(|| update.get("type"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut out = Vec::new();
        match variant {
            "agent_message_chunk" => self.on_chunk(update, false, &mut out),
            "agent_thought_chunk" => self.on_chunk(update, true, &mut out),
            "tool_call" | "tool_call_update" => self.on_tool(update, &mut out),
            "plan" => {
                out.push(EventBody::ArtifactDelta(ArtifactDelta {
                    artifact_id: "plan".to_owned(),
                    mime: Some("application/json".to_owned()),
                    data: update
                        .get("entries")
                        .cloned()
                        .unwrap_or(Value::Null)
                        .to_string(),
                }));
            }
            "usage_update" => {
                if update.pointer("/cost/currency").and_then(Value::as_str) == Some("USD") {
                    self.cost_usd = update.pointer("/cost/amount").and_then(Value::as_f64);
                }
            }
            "user_message_chunk"
            | "available_commands_update"
            | "current_mode_update"
            | "config_option_update"
            | "session_info_update" => {}
            _ => {
                self.unknown += 1;
                self.skipped += 1;
                tracing::debug!(variant, "an unknown session/update variant, skipped");
            }
        }
        out
    }

    fn on_chunk(&mut self, update: &Value, thinking: bool, out: &mut Vec<EventBody>) {
        let content = update.get("content").unwrap_or(&Value::Null);
        if str_of(content, "type") != "text" {
            self.skipped += 1;
            return;
        }
        let text = str_of(content, "text").to_owned();
        let message_id = update
            .get("messageId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if thinking {
            self.close_text(out);
        } else {
            self.close_thinking(out);
        }
        let open = if thinking { &self.thinking } else { &self.text };
        let same = open
            .as_ref()
            .is_some_and(|b| message_id.is_none() || b.message_id == message_id);
        if !same {
            if thinking {
                self.close_thinking(out);
            } else {
                self.close_text(out);
            }
            let item_id = message_id
                .clone()
                .unwrap_or_else(|| self.next_item(if thinking { "thought-" } else { "text-" }));
            let start = BlockStart {
                item_id: Some(item_id.clone()),
            };
            out.push(if thinking {
                EventBody::ThinkingStart(start)
            } else {
                EventBody::TextStart(start)
            });
            let block = Some(Block {
                item_id,
                message_id,
                text: String::new(),
            });
            if thinking {
                self.thinking = block;
            } else {
                self.text = block;
            }
        }
        if text.is_empty() {
            return;
        }
        let block = if thinking {
            self.thinking.as_mut()
        } else {
            self.text.as_mut()
        };
        if let Some(block) = block {
            block.text.push_str(&text);
            let delta = TextDelta {
                item_id: Some(block.item_id.clone()),
                text,
            };
            out.push(if thinking {
                EventBody::ThinkingDelta(delta)
            } else {
                EventBody::TextDelta(delta)
            });
        }
    }

    /// The tool's display name: the agent's own tool name if it says (Claude's `_meta`),
    /// else the title, else the kind.
    fn tool_name(update: &Value) -> Option<String> {
        update
            .pointer("/_meta/claudeCode/toolName")
            .and_then(Value::as_str)
            .or_else(|| update.get("title").and_then(Value::as_str))
            .or_else(|| update.get("kind").and_then(Value::as_str))
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    /// Open a tool call if it is new (a `tool_call`, or an update that comes first).
    fn tool_entry(&mut self, id: &str, update: &Value, out: &mut Vec<EventBody>) {
        if self.tools.contains_key(id) {
            return;
        }
        self.close_text(out);
        self.close_thinking(out);
        let name = Self::tool_name(update).unwrap_or_else(|| "tool".to_owned());
        out.push(EventBody::ToolCallStart(ToolCallStart {
            call_id: id.to_owned(),
            name: name.clone(),
        }));
        self.tools.insert(
            id.to_owned(),
            Tool {
                name,
                input: Value::Null,
                ..Tool::default()
            },
        );
        self.tool_order.push(id.to_owned());
    }

    /// The call's input is complete: `tool.call.end`, once.
    fn end_call(&mut self, id: &str, out: &mut Vec<EventBody>) {
        if let Some(tool) = self.tools.get_mut(id)
            && !tool.call_ended
        {
            tool.call_ended = true;
            out.push(EventBody::ToolCallEnd(ToolCallEnd {
                truncated: None,
                call_id: id.to_owned(),
                name: tool.name.clone(),
                input: if tool.input.is_null() {
                    json!({})
                } else {
                    tool.input.clone()
                },
            }));
        }
    }

    fn start_exec(&mut self, id: &str, out: &mut Vec<EventBody>) {
        self.end_call(id, out);
        if let Some(tool) = self.tools.get_mut(id)
            && !tool.exec_started
        {
            tool.exec_started = true;
            out.push(EventBody::ToolExecStart(ToolExecStart {
                call_id: id.to_owned(),
                name: Some(tool.name.clone()),
            }));
        }
    }

    fn end_exec(&mut self, id: &str, is_error: bool, out: &mut Vec<EventBody>) {
        self.start_exec(id, out);
        if let Some(tool) = self.tools.get_mut(id)
            && !tool.done
        {
            tool.done = true;
            out.push(EventBody::ToolExecEnd(ToolExecEnd {
                truncated: None,
                call_id: id.to_owned(),
                output: tool.output.clone(),
                is_error,
                exit_code: None,
            }));
        }
    }

    /// The text of a tool update's `content` (text blocks), else its `rawOutput`.
    fn tool_output(update: &Value) -> Option<String> {
        let texts: Vec<&str> = update
            .get("content")
            .and_then(Value::as_array)
            .map(|blocks| {
                blocks
                    .iter()
                    .filter_map(|b| {
                        (str_of(b, "type") == "content")
                            .then(|| b.pointer("/content/text").and_then(Value::as_str))
                            .flatten()
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !texts.is_empty() {
            return Some(texts.join("\n"));
        }
        match update.get("rawOutput") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Null) | None => None,
            Some(other) => Some(other.to_string()),
        }
    }

    fn on_tool(&mut self, update: &Value, out: &mut Vec<EventBody>) {
        let id = str_of(update, "toolCallId").to_owned();
        if id.is_empty() {
            self.skipped += 1;
            return;
        }
        self.tool_entry(&id, update, out);
        if let Some(tool) = self.tools.get_mut(&id) {
            if let Some(name) = Self::tool_name(update) {
                tool.name = name;
            }
            if let Some(input) = update.get("rawInput")
                && input.as_object().is_none_or(|o| !o.is_empty())
                && !tool.call_ended
            {
                tool.input = input.clone();
            }
        }
        let output = Self::tool_output(update);
        match str_of(update, "status") {
            "in_progress" => self.start_exec(&id, out),
            status @ ("completed" | "failed") => {
                if let (Some(output), Some(tool)) = (output, self.tools.get_mut(&id)) {
                    tool.output = output;
                }
                self.end_exec(&id, status == "failed", out);
            }
            _ => {
                if let Some(output) = output.filter(|o| !o.is_empty())
                    && self
                        .tools
                        .get(&id)
                        .is_some_and(|t| t.exec_started && !t.done)
                {
                    out.push(EventBody::ToolExecUpdate(ToolExecUpdate {
                        call_id: id.clone(),
                        output,
                    }));
                }
            }
        }
    }

    /// `session/request_permission`: the event, and the request id the answer goes back by.
    pub fn on_permission_request(&mut self, params: &Value) -> (Vec<EventBody>, Option<String>) {
        if self.session_id.as_deref() != Some(str_of(params, "sessionId")) {
            self.skipped += 1;
            return (Vec::new(), None);
        }
        let call = params.get("toolCall").unwrap_or(&Value::Null);
        let id = str_of(call, "toolCallId").to_owned();
        let mut out = Vec::new();
        if id.is_empty() {
            return (out, None);
        }
        self.tool_entry(&id, call, &mut out);
        if let Some(tool) = self.tools.get_mut(&id)
            && let Some(input) = call.get("rawInput")
            && input.as_object().is_none_or(|o| !o.is_empty())
            && !tool.call_ended
        {
            tool.input = input.clone();
        }
        self.end_call(&id, &mut out);
        let (tool, input) = self
            .tools
            .get(&id)
            .map(|t| (t.name.clone(), t.input.clone()))
            .unwrap_or_default();
        out.push(EventBody::PermissionRequest(PermissionRequest {
            request_id: id.clone(),
            tool,
            input,
            options: permission_options(params),
        }));
        (out, Some(id))
    }

    /// Close whatever is open (blocks, tools) at a turn's end.
    fn close_all(&mut self, cancelled: bool, out: &mut Vec<EventBody>) {
        self.close_text(out);
        self.close_thinking(out);
        for id in std::mem::take(&mut self.tool_order) {
            if self.tools.get(&id).is_some_and(|t| !t.done) {
                if cancelled && let Some(tool) = self.tools.get_mut(&id) {
                    tool.output = "cancelled".to_owned();
                }
                self.end_exec(&id, true, out);
            }
        }
        self.tools.clear();
        self.in_turn = false;
    }

    /// The `session/prompt` answer: the turn is over.
    pub fn on_prompt_result(&mut self, result: &Value) -> Vec<EventBody> {
        let stop = str_of(result, "stopReason");
        let mut out = Vec::new();
        self.close_all(stop == "cancelled", &mut out);
        if let Some(usage) = result.get("usage").filter(|u| u.is_object()) {
            let n = |key: &str| usage.get(key).and_then(Value::as_u64);
            out.push(EventBody::Usage(Usage {
                input_tokens: n("inputTokens").unwrap_or(0),
                output_tokens: n("outputTokens").unwrap_or(0),
                cached_input_tokens: n("cachedReadTokens"),
                cost_usd: self.cost_usd,
            }));
        }
        let (state, category, message) = match stop {
            "end_turn" => (RunState::Completed, None, None),
            "cancelled" => (RunState::Cancelled, Some(ErrorCategory::Cancelled), None),
            "max_tokens" => (
                RunState::Failed,
                Some(ErrorCategory::ContextExhausted),
                Some("the agent hit its token limit".to_owned()),
            ),
            other => (
                RunState::Failed,
                Some(ErrorCategory::AgentFailed),
                Some(format!("the agent stopped: {other}")),
            ),
        };
        if let (Some(category), Some(message)) = (category, message.clone()) {
            out.push(EventBody::Error(ErrorNotice { category, message }));
        }
        out.push(EventBody::RunEnd(RunEnd {
            state,
            category,
            message,
        }));
        out
    }

    /// The `session/prompt` failed: the turn ends failed.
    pub fn on_prompt_error(&mut self, category: ErrorCategory, message: String) -> Vec<EventBody> {
        let mut out = Vec::new();
        self.close_all(false, &mut out);
        out.push(EventBody::Error(ErrorNotice {
            category,
            message: message.clone(),
        }));
        out.push(EventBody::RunEnd(RunEnd {
            state: RunState::Failed,
            category: Some(category),
            message: Some(message),
        }));
        out
    }

    /// The process ended. A turn still in progress (its `session/prompt` went out and was
    /// never answered) fails, and whether the agent acted on it is unknown:
    /// `result_delivery_unknown`.
    pub fn on_exit(&mut self, status: &str) -> Vec<EventBody> {
        if !self.in_turn {
            return Vec::new();
        }
        let error = super::AdapterError::result_unknown(format!(
            "the agent process exited during the turn ({status})"
        ));
        self.on_prompt_error(error.category, error.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_translate_to_their_expected_events() {
        let checked = super::super::fixtures::check_all(
            "acp",
            || (Translator::new(), Vec::new()),
            |(t, prompts), line| t.on_record(line, prompts),
        );
        assert!(checked >= 6, "only {checked} ACP transcripts");
    }

    #[test]
    fn replay_and_other_sessions_are_not_published() {
        let mut t = Translator::new();
        t.bind("s1");
        let chunk = |session: &str| {
            json!({"sessionId": session, "update": {"sessionUpdate": "agent_message_chunk",
                   "content": {"type": "text", "text": "old"}}})
        };
        // A `session/load` replays before any prompt: nothing.
        assert!(t.on_notification("session/update", &chunk("s1")).is_empty());
        t.start_turn();
        assert!(t.on_notification("session/update", &chunk("s2")).is_empty());
        assert_eq!(t.on_notification("session/update", &chunk("s1")).len(), 2);
        let odd = json!({"sessionId": "s1", "update": {"sessionUpdate": "brand_new_variant"}});
        assert!(t.on_notification("session/update", &odd).is_empty());
        assert_eq!(t.unknown(), 1);
        let end = t.on_prompt_result(&json!({"stopReason": "cancelled"}));
        assert!(matches!(end.first(), Some(EventBody::TextEnd(_))));
        assert!(matches!(
            end.last(),
            Some(EventBody::RunEnd(RunEnd {
                state: RunState::Cancelled,
                ..
            }))
        ));
    }

    #[test]
    fn permission_answers_pick_among_the_offered_options() {
        let options = json!([
            {"kind": "allow_always", "optionId": "always"},
            {"kind": "allow_once", "optionId": "once"},
            {"kind": "reject_once", "optionId": "no"}
        ]);
        assert_eq!(
            permission_answer(&options, true, None)["outcome"]["optionId"],
            "once"
        );
        assert_eq!(
            permission_answer(&options, false, None)["outcome"]["optionId"],
            "no"
        );
        // A chosen option goes back as it is; one the agent never offered falls back by kind.
        let always = PermissionOption::always("always", "Always", "always".to_owned());
        assert_eq!(
            permission_answer(&options, true, Some(&always))["outcome"]["optionId"],
            "always"
        );
        assert!(answer_keeps(
            &options,
            &permission_answer(&options, true, Some(&always))
        ));
        let stranger = PermissionOption::always("nope", "Nope", "nope".to_owned());
        let fallback = permission_answer(&options, true, Some(&stranger));
        assert_eq!(fallback["outcome"]["optionId"], "once");
        // An always option the agent did not offer goes as allow-once: no rule kept.
        assert!(!answer_keeps(&options, &fallback));
        assert!(!answer_keeps(&options, &cancelled_answer()));
        let only_always = json!([{"kind": "allow_always", "optionId": "always"}]);
        assert_eq!(
            permission_answer(&only_always, true, None)["outcome"]["optionId"],
            "always"
        );
        assert_eq!(
            permission_answer(&only_always, false, None)["outcome"]["outcome"],
            "cancelled"
        );
        assert!(is_missing_session("Session not found"));
        assert!(is_missing_session("session/resume: unknown session abc"));
        assert!(!is_missing_session("internal error"));
    }
}
