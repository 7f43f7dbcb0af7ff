//! Codex's `app-server` protocol (JSON-RPC over stdio, no `"jsonrpc"` field): the messages the
//! host sends, and [`Translator`], a pure, stateful translator from what the app-server sends
//! to canonical events (style 8). The driver that owns the process is `codex_process.rs`.
//!
//! Translation rules (facts in `../shared/reference/agent-protocols.md` §3):
//! - The thread id (from the `thread/start` / `thread/resume` answer) is `session.bound`.
//! - Only this thread's messages count: sub-agent threads share the pipe. `turn/started` opens
//!   a turn (notifications may precede the `turn/start` answer).
//! - Items: `agentMessage` → `text.start` / `text.delta` / `text.end` (the completed item's text
//!   is authoritative); `reasoning` → `thinking.*`; every tool item (`commandExecution`,
//!   `fileChange`, `mcpToolCall`, `dynamicToolCall`, `collabAgentToolCall`, `webSearch`,
//!   `imageView`, `imageGeneration`, `sleep`, `functionCallOutput`) → `tool.call.start` +
//!   `tool.call.end` when the item starts, `tool.exec.update` for output deltas,
//!   `tool.exec.start` + `tool.exec.end` (output, exit code, failed or declined as an error)
//!   when it completes; a tool item that only completes gets the whole bracket then.
//!   `turn/plan/updated` → an `artifact.delta` holding the plan; `userMessage` is the host's
//!   own `user.text`, skipped.
//! - Tool calls no item announces: a command the sandbox denies as it starts (it exits within
//!   Codex's start-up window with a sandbox-looking failure, e.g. `Read-only file system`) or a
//!   patch that fails verification never becomes an item, in the stream or in Codex's own
//!   history; only the rollout file records the call and its output. At `turn/completed` the
//!   driver feeds the lines the rollout gained ([`Translator::on_rollout_line`]; Codex flushes
//!   the rollout before it ends the turn), and each shell or patch call of the turn that got
//!   an output but no item becomes the same `tool.*` bracket a command item does.
//! - Approval requests (`item/commandExecution/requestApproval`, `item/fileChange/…`,
//!   `item/permissions/…`) → `permission.request` with Codex's own decisions as options
//!   ([`approval_options`]: `accept`, `acceptForSession`, an exec-policy amendment, `decline`,
//!   `cancel`, as the request's `availableDecisions` lists them), keyed by the
//!   item id; `serverRequest/resolved` → `permission.resolved` `withdrawn` by the agent (the
//!   session drops it when the request was already answered). An MCP tool call's approval
//!   (`mcpServer/elicitation/request` with `codex_approval_kind: mcp_tool_call`) →
//!   `permission.request` for `mcp__<server>__<tool>` with the call's arguments, options
//!   `accept` / `decline`, keyed by the turn and the request's number; any other
//!   elicitation (a form to fill) is declined.
//! - `thread/tokenUsage/updated` adds up per turn (`last`), one `usage` at the turn's end.
//! - `error` with `willRetry` is a `warning`; without, an `error` (the turn ends on its own).
//! - `turn/completed`: open items are closed (an interrupted message never completes), then
//!   `usage` and `run.end`: `completed`, `interrupted` → `cancelled`, `failed` with a category
//!   from `codexErrorInfo`.
//! - The process gone with a turn open (the driver says whether its `turn/start` went out):
//!   `error` + `run.end` `failed` / `result_delivery_unknown` ([`Translator::on_exit`]).
//! - Unknown methods and item types are counted and skipped, never fatal.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use super::AdapterError;
use crate::protocol::events::{
    ArtifactDelta, BlockEnd, BlockStart, ErrorCategory, ErrorNotice, EventBody, Notice,
    PermissionOption, PermissionOptionKind, PermissionRequest, PermissionResolved, RunEnd,
    RunState, SessionBound, TextDelta, ToolCallEnd, ToolCallStart, ToolExecEnd, ToolExecStart,
    ToolExecUpdate, Usage,
};
use crate::protocol::options::{
    Attachment, AttachmentKind, McpServer, PermissionMode, SessionOptions,
};

/// The `initialize` params.
pub fn initialize_params() -> Value {
    json!({
        "clientInfo": {"name": "agent_host", "title": "agent-host", "version": crate::VERSION},
        "capabilities": {"experimentalApi": false},
    })
}

/// `thread/start` params for a session in `cwd`, with its options in Codex's own carriers
/// ([`thread_options`]).
pub fn thread_start_params(cwd: &str, options: &SessionOptions) -> Value {
    let mut params = json!({"cwd": cwd});
    thread_options(&mut params, options);
    params
}

/// A session's options as `thread/start`, `thread/resume` and `thread/fork` take them (each
/// of the three carries all of them, so a resumed or forked thread runs as configured now):
/// - `model` → `model` (a resumed or forked thread recorded under another model takes it,
///   and Codex tells the model of the switch);
/// - `system_prompt` → `developerInstructions`: a developer message the model sees once, ahead
///   of the conversation, in every request of the thread. Only `thread/start` sets it: at a
///   resume or a fork Codex keeps the thread's own and takes no other (tests/suite/codex_host.rs,
///   `codex_resume_applies_a_new_model_and_mcp_servers_but_keeps_the_threads_prompt`);
/// - `mcp_servers` → the `config` override `mcp_servers.<name>` (stdio `command`, `args`,
///   `env`; streamable HTTP `url`, `http_headers`), taken at a resume and a fork too. Codex
///   shows each server's tools to the model as the namespace `mcp__<name>`, and asks before
///   it calls one (an elicitation, [`MCP_ELICITATION`]);
/// - `permission_mode`: `ask` → `approvalPolicy: on-request` + `sandbox: workspace-write`
///   (commands run in the workspace sandbox, an escalation or an MCP tool call is asked);
///   `bypass` → `never` + `danger-full-access` (nothing is asked, nothing is sandboxed).
///   `accept_edits` has no Codex equivalent of its own (edits in the workspace already run
///   unasked under `ask`): the family does not declare it, so it never gets here, and it
///   maps as `ask` if it does.
pub fn thread_options(params: &mut Value, options: &SessionOptions) {
    let (approval, sandbox) = match options.mode() {
        PermissionMode::Bypass => ("never", "danger-full-access"),
        PermissionMode::Ask | PermissionMode::AcceptEdits => ("on-request", "workspace-write"),
    };
    params["approvalPolicy"] = json!(approval);
    params["sandbox"] = json!(sandbox);
    if let Some(model) = &options.model {
        params["model"] = json!(model);
    }
    if let Some(prompt) = &options.system_prompt {
        params["developerInstructions"] = json!(prompt);
    }
    if !options.mcp_servers.is_empty() {
        params["config"] = json!({"mcp_servers": mcp_servers_config(&options.mcp_servers)});
    }
}

/// MCP servers as Codex's `mcp_servers` config table, by name. An SSE server (which Codex
/// does not take; the family does not declare it) is left out.
pub fn mcp_servers_config(servers: &[McpServer]) -> Value {
    let mut table = serde_json::Map::new();
    for server in servers {
        let entry = match server {
            McpServer::Stdio {
                command, args, env, ..
            } => {
                let mut entry = json!({"command": command, "args": args});
                if !env.is_empty() {
                    let env: serde_json::Map<String, Value> = env
                        .iter()
                        .map(|v| (v.name.clone(), json!(v.value)))
                        .collect();
                    entry["env"] = Value::Object(env);
                }
                entry
            }
            McpServer::Http { url, headers, .. } => {
                let mut entry = json!({"url": url});
                if !headers.is_empty() {
                    let headers: serde_json::Map<String, Value> = headers
                        .iter()
                        .map(|h| (h.name.clone(), json!(h.value)))
                        .collect();
                    entry["http_headers"] = Value::Object(headers);
                }
                entry
            }
            McpServer::Sse { .. } => continue,
        };
        table.insert(server.name().to_owned(), entry);
    }
    Value::Object(table)
}

/// `thread/resume` params: the session's cwd and options win over what the thread recorded,
/// as on `thread/start`.
pub fn thread_resume_params(thread_id: &str, cwd: &str, options: &SessionOptions) -> Value {
    let mut params = thread_start_params(cwd, options);
    params["threadId"] = json!(thread_id);
    params
}

/// `thread/fork` params: the fork runs in the session's cwd and options, like the thread it
/// continues.
pub fn thread_fork_params(thread_id: &str, cwd: &str, options: &SessionOptions) -> Value {
    thread_resume_params(thread_id, cwd, options)
}

/// `turn/start` params: the prompt, then each image attachment as a `localImage` input (the
/// host's copy; Codex reads it and shows the model an `input_image`). `model`: the session's
/// model since a `session.set_model`, which the turn carries (Codex keeps it for the turns
/// after too).
pub fn turn_start_params(
    thread_id: &str,
    text: &str,
    model: Option<&str>,
    attachments: &[Attachment],
) -> Value {
    let mut input = vec![json!({"type": "text", "text": text, "text_elements": []})];
    input.extend(
        attachments
            .iter()
            .filter(|a| a.kind == AttachmentKind::Image)
            .map(|a| json!({"type": "localImage", "path": a.path})),
    );
    let mut params = json!({"threadId": thread_id, "input": input});
    if let Some(model) = model {
        params["model"] = json!(model);
    }
    params
}

/// `turn/steer` params: `text` joins the running turn `turn_id` (its id is the precondition:
/// the app-server refuses the steer when that turn is no longer the active one).
pub fn turn_steer_params(thread_id: &str, turn_id: &str, text: &str) -> Value {
    json!({
        "threadId": thread_id,
        "expectedTurnId": turn_id,
        "input": [{"type": "text", "text": text, "text_elements": []}],
    })
}

/// The answer to an approval request: `option`, one of its [`approval_options`] (`None`: plain
/// `accept` or `decline`). A decision that carries data (an exec-policy amendment) is sent
/// back as the request offered it.
pub fn approval_answer(
    method: &str,
    params: &Value,
    allow: bool,
    option: Option<&PermissionOption>,
) -> Value {
    if method == "item/permissions/requestApproval" {
        // Granted permissions are listed; none listed is a denial.
        let granted = if allow {
            params.get("permissions").cloned().unwrap_or(json!({}))
        } else {
            json!({})
        };
        let scope = match option {
            Some(o) if allow && o.kind == PermissionOptionKind::AllowAlways => "session",
            _ => "turn",
        };
        return json!({"permissions": granted, "scope": scope});
    }
    if method == MCP_ELICITATION {
        // An MCP tool call's approval is an elicitation with an empty form: accepted with no
        // content, or declined.
        let accept = match option {
            Some(o) => o.id == "accept",
            None => allow,
        };
        return if accept {
            json!({"action": "accept", "content": {}})
        } else {
            json!({"action": "decline"})
        };
    }
    let decision = match option {
        Some(o) => offered_decisions(method, params)
            .into_iter()
            .find(|d| decision_id(d) == o.id)
            .unwrap_or_else(|| json!(o.id)),
        None => json!(if allow { "accept" } else { "decline" }),
    };
    json!({"decision": decision})
}

/// Whether an answer made by [`approval_answer`] carries the session-wide part Codex keeps
/// (`acceptForSession`, or a permission grant for the session).
pub fn answer_keeps_for_session(answer: &Value) -> bool {
    answer.get("decision").and_then(Value::as_str) == Some("acceptForSession")
        || answer.get("scope").and_then(Value::as_str) == Some("session")
}

/// The decisions an approval request offers: its `availableDecisions`, else what the
/// app-server takes for that kind of request. `acceptForSession` and `decline` are always
/// among them: Codex 0.171 takes both though its escalation requests leave them out of the
/// list, and `acceptForSession` is the one that makes the same command stop asking in the
/// session (`tests/suite/permission_rules.rs`; an exec-policy amendment did not, for an escalated
/// compound command).
fn offered_decisions(method: &str, params: &Value) -> Vec<Value> {
    let mut offered = match params.get("availableDecisions").and_then(Value::as_array) {
        Some(listed) if !listed.is_empty() && method == "item/commandExecution/requestApproval" => {
            listed.clone()
        }
        _ => ["accept", "acceptForSession", "decline", "cancel"]
            .map(|d| json!(d))
            .to_vec(),
    };
    if !offered.iter().any(|d| d == "acceptForSession") {
        let at = offered
            .iter()
            .position(|d| d == "accept")
            .map_or(0, |i| i + 1);
        offered.insert(at, json!("acceptForSession"));
    }
    if !offered.iter().any(|d| d == "decline") {
        let at = offered
            .iter()
            .position(|d| d == "cancel")
            .unwrap_or(offered.len());
        offered.insert(at, json!("decline"));
    }
    offered
}

/// A decision's id: the string, or the key of an object decision.
fn decision_id(decision: &Value) -> String {
    match decision {
        Value::String(s) => s.clone(),
        Value::Object(o) => o.keys().next().cloned().unwrap_or_default(),
        other => other.to_string(),
    }
}

/// The options an approval request becomes, in Codex's order.
pub fn approval_options(method: &str, params: &Value) -> Vec<PermissionOption> {
    if method == MCP_ELICITATION {
        return vec![
            PermissionOption::new("accept", "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new("decline", "Deny", PermissionOptionKind::RejectOnce),
        ];
    }
    if method == "item/permissions/requestApproval" {
        return vec![
            PermissionOption::new(
                "allow",
                "Allow for this turn",
                PermissionOptionKind::AllowOnce,
            ),
            PermissionOption::always(
                "allow_session",
                "Allow for this session",
                "always grant these permissions in this session".to_owned(),
            ),
            PermissionOption::new("deny", "Deny", PermissionOptionKind::RejectOnce),
        ];
    }
    let command = params
        .get("commandActions")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(|a| a.get("command"))
        .or_else(|| params.get("command"))
        .and_then(Value::as_str);
    let subject = match (method, command) {
        ("item/fileChange/requestApproval", _) => "these file changes".to_owned(),
        (_, Some(command)) => format!("`{command}`"),
        (_, None) => "this command".to_owned(),
    };
    offered_decisions(method, params)
        .iter()
        .map(|decision| {
            let id = decision_id(decision);
            match id.as_str() {
                "accept" => PermissionOption::new(&id, "Allow", PermissionOptionKind::AllowOnce),
                "acceptForSession" => PermissionOption::always(
                    &id,
                    "Allow for this session",
                    format!("always allow {subject} in this session"),
                ),
                "acceptWithExecpolicyAmendment" => {
                    let prefix: Vec<&str> = decision[&id]["execpolicy_amendment"]
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(Value::as_str)
                        .collect();
                    let prefix = prefix.join(" ");
                    // Allows this call; Codex saves the amendment in its exec policy, but the
                    // real CLI asked again for the same command after it, so it is no rule
                    // the session can promise (`tests/suite/permission_rules.rs`).
                    PermissionOption::new(
                        &id,
                        &format!(
                            "Allow, and ask Codex to save commands starting with `{prefix}` in \
                             its exec policy"
                        ),
                        PermissionOptionKind::AllowOnce,
                    )
                }
                "decline" => PermissionOption::new(&id, "Deny", PermissionOptionKind::RejectOnce),
                "cancel" => PermissionOption::new(
                    &id,
                    "Deny and stop the turn",
                    PermissionOptionKind::RejectOnce,
                ),
                // A decision this build does not know allows, but promises nothing more.
                other if other.starts_with("accept") || other.starts_with("apply") => {
                    PermissionOption::new(
                        other,
                        &format!("Allow ({other})"),
                        PermissionOptionKind::AllowOnce,
                    )
                }
                other => PermissionOption::new(other, other, PermissionOptionKind::RejectOnce),
            }
        })
        .collect()
}

/// The approval methods, which become `permission.request`s (an MCP elicitation only when it
/// is Codex's approval of an MCP tool call, [`is_mcp_tool_approval`]; any other is declined).
pub const APPROVALS: &[&str] = &[
    "item/commandExecution/requestApproval",
    "item/fileChange/requestApproval",
    "item/permissions/requestApproval",
    MCP_ELICITATION,
];

/// How Codex asks before it runs an MCP server's tool (under `approvalPolicy: on-request`):
/// an elicitation from that server with an empty form, `_meta.codex_approval_kind:
/// "mcp_tool_call"`, answered `{action: "accept"}` or `{action: "decline"}`.
pub const MCP_ELICITATION: &str = "mcpServer/elicitation/request";

/// Whether an elicitation is Codex's approval of an MCP tool call (not a form the server
/// wants filled, which the host cannot show).
pub fn is_mcp_tool_approval(params: &Value) -> bool {
    params
        .pointer("/_meta/codex_approval_kind")
        .and_then(Value::as_str)
        == Some("mcp_tool_call")
}

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

/// How much of a rollout file [`rollout_cwd`] reads. Its `session_meta` line comes first and
/// carries Codex's base instructions (about 22 KB in 0.171.0); a file whose first line does
/// not end within this is not read further.
const ROLLOUT_META_LIMIT: u64 = 1 << 20;

/// The cwd a Codex rollout file recorded for its thread: its first line's, which is the
/// `session_meta` (`{"type":"session_meta","payload":{"cwd":..}}`). `None` for a missing or
/// unreadable file, another first line, no cwd, or garbage. Reads at most
/// [`ROLLOUT_META_LIMIT`] bytes.
pub fn rollout_cwd(path: &Path) -> Option<PathBuf> {
    #[derive(Deserialize)]
    struct Line {
        #[serde(rename = "type")]
        kind: String,
        payload: Meta,
    }
    #[derive(Deserialize)]
    struct Meta {
        cwd: Option<String>,
    }
    let file = std::fs::File::open(path).ok()?;
    let reader = std::io::BufReader::new(file.take(ROLLOUT_META_LIMIT));
    let first = serde_json::Deserializer::from_reader(reader)
        .into_iter::<Line>()
        .next()?
        .ok()?;
    if first.kind != "session_meta" {
        return None;
    }
    let cwd = first.payload.cwd.filter(|c| !c.is_empty())?;
    Some(PathBuf::from(path_of_uri(&cwd)))
}

/// A `file://` URI's path, percent-decoded (Codex writes some cwds as URIs, e.g. in rollout
/// items); anything else as it is.
fn path_of_uri(text: &str) -> String {
    let Some(rest) = text.strip_prefix("file://") else {
        return text.to_owned();
    };
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---- Its threads as its rollouts tell them (`session.discover`, the history of an import) ----

/// At most this many rollout files (the newest by name, which starts with the time) are
/// looked at by [`discover_rollouts`]; each is read to [`ROLLOUT_DISCOVER_BYTES`].
const ROLLOUT_DISCOVER_FILES: usize = 1000;
const ROLLOUT_DISCOVER_BYTES: u64 = 8 << 20;
/// What it reads of all matching files together; past it only their first lines.
const ROLLOUT_DISCOVER_TOTAL: u64 = 64 << 20;
/// What [`rollout_history`] reads of a rollout.
const ROLLOUT_HISTORY_BYTES: u64 = 64 << 20;

/// The thread id and cwd of a rollout's first line (its `session_meta`).
fn rollout_meta(path: &Path) -> Option<(String, PathBuf)> {
    #[derive(Deserialize)]
    struct Line {
        #[serde(rename = "type")]
        kind: String,
        payload: Meta,
    }
    #[derive(Deserialize)]
    struct Meta {
        id: Option<String>,
        cwd: Option<String>,
    }
    let file = std::fs::File::open(path).ok()?;
    let reader = std::io::BufReader::new(file.take(ROLLOUT_META_LIMIT));
    let first = serde_json::Deserializer::from_reader(reader)
        .into_iter::<Line>()
        .next()?
        .ok()?;
    if first.kind != "session_meta" {
        return None;
    }
    let cwd = first.payload.cwd.filter(|c| !c.is_empty())?;
    Some((first.payload.id?, PathBuf::from(path_of_uri(&cwd))))
}

/// Text the user did not type that Codex puts in user messages of its own: the environment,
/// the instructions of `AGENTS.md`, skills and permissions.
fn injected_context(text: &str) -> bool {
    let t = text.trim_start();
    t.starts_with('<') && {
        let tag: String = t[1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
            .collect();
        [
            "environment_context",
            "user_instructions",
            "skills_instructions",
            "permissions instructions",
            "user_shell_command",
            "turn_aborted",
            "subagent",
        ]
        .iter()
        .any(|known| tag.starts_with(known))
    } || t.starts_with("# AGENTS.md instructions")
}

/// The text parts of a rollout content list (`input_text`, `output_text`, `text`, `Text`).
fn content_text(content: Option<&Value>) -> String {
    content
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|part| {
            matches!(
                part.get("type").and_then(Value::as_str),
                Some("input_text" | "output_text" | "text" | "Text")
            )
        })
        .filter_map(|part| part.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A rollout's lines as a conversation, and its last line's time. Codex records a message
/// more than once (as an item it completed, as a legacy event, as the model input): the
/// first of those sources the file has is used, in that order; tool calls come from the
/// model input (`function_call`, `custom_tool_call`, and their outputs).
fn rollout_entries(
    lines: &[Vec<u8>],
) -> (Vec<crate::session::discover::HistoryEntry>, Option<i64>) {
    use crate::session::discover::HistoryEntry;
    // (source, entry): 0 an item, 1 a legacy event, 2 the model input; tools in every list.
    let mut tagged: Vec<(Option<u8>, HistoryEntry)> = Vec::new();
    let mut last = None;
    for line in lines {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if let Some(at) = v
            .get("timestamp")
            .and_then(Value::as_str)
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
        {
            last = Some(at);
        }
        let payload = &v["payload"];
        let text_entry = |source: u8, user: bool, text: String| {
            let text = text.trim().to_owned();
            if text.is_empty() || (user && injected_context(&text)) {
                return None;
            }
            Some((
                Some(source),
                if user {
                    HistoryEntry::User { text }
                } else {
                    HistoryEntry::Assistant { text }
                },
            ))
        };
        let entry = match (str_of(&v, "type"), str_of(payload, "type")) {
            ("event_msg", "item_completed") => {
                let item = &payload["item"];
                match str_of(item, "type") {
                    "UserMessage" => text_entry(0, true, content_text(item.get("content"))),
                    "AgentMessage" => text_entry(0, false, content_text(item.get("content"))),
                    _ => None,
                }
            }
            ("event_msg", "user_message") => {
                text_entry(1, true, str_of(payload, "message").to_owned())
            }
            ("event_msg", "agent_message") => {
                text_entry(1, false, str_of(payload, "message").to_owned())
            }
            ("response_item", "message") => match str_of(payload, "role") {
                "user" => text_entry(2, true, content_text(payload.get("content"))),
                "assistant" => text_entry(2, false, content_text(payload.get("content"))),
                _ => None,
            },
            ("response_item", kind @ ("function_call" | "custom_tool_call")) => {
                let input = if kind == "function_call" {
                    let args = str_of(payload, "arguments");
                    serde_json::from_str(args).unwrap_or_else(|_| Value::String(args.to_owned()))
                } else {
                    payload.get("input").cloned().unwrap_or(Value::Null)
                };
                Some((
                    None,
                    HistoryEntry::ToolCall {
                        call_id: str_of(payload, "call_id").to_owned(),
                        name: str_of(payload, "name").to_owned(),
                        input,
                    },
                ))
            }
            ("response_item", "function_call_output" | "custom_tool_call_output") => {
                let output = match payload.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other
                        .get("content")
                        .and_then(Value::as_str)
                        .map_or_else(|| other.to_string(), str::to_owned),
                    None => String::new(),
                };
                let is_error =
                    payload.pointer("/output/success").and_then(Value::as_bool) == Some(false);
                Some((
                    None,
                    HistoryEntry::ToolResult {
                        call_id: str_of(payload, "call_id").to_owned(),
                        output,
                        is_error,
                    },
                ))
            }
            _ => None,
        };
        tagged.extend(entry);
    }
    let source = (0..3).find(|s| tagged.iter().any(|(t, _)| *t == Some(*s)));
    let entries = tagged
        .into_iter()
        .filter(|(t, _)| t.is_none() || *t == source)
        .map(|(_, e)| e)
        .collect();
    (entries, last)
}

/// Codex's own threads of `cwd`: the rollouts under `$CODEX_HOME/sessions/YYYY/MM/DD/` whose
/// `session_meta` records this cwd and that hold a prompt of the user's, with the first one,
/// the last line's time (else the file's mtime) and how many prompts. Bounded: the newest
/// [`ROLLOUT_DISCOVER_FILES`] rollouts by name, each read to [`ROLLOUT_DISCOVER_BYTES`] while
/// [`ROLLOUT_DISCOVER_TOTAL`] lasts.
pub fn discover_rollouts(
    codex_home: &Path,
    cwd: &Path,
) -> Vec<crate::session::discover::Discovered> {
    use crate::session::discover::{Discovered, HistoryEntry, MAX_FIRST_PROMPT};
    let sorted_desc = |dir: &Path| -> Vec<PathBuf> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort_by(|a, b| b.file_name().cmp(&a.file_name()));
        entries
    };
    let mut rollouts = Vec::new();
    'walk: for year in sorted_desc(&codex_home.join("sessions")) {
        for month in sorted_desc(&year) {
            for day in sorted_desc(&month) {
                for file in sorted_desc(&day) {
                    let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
                    if name.is_some_and(|n| n.starts_with("rollout-") && n.ends_with(".jsonl")) {
                        rollouts.push(file);
                        if rollouts.len() >= ROLLOUT_DISCOVER_FILES {
                            break 'walk;
                        }
                    }
                }
            }
        }
    }
    let canonical = std::fs::canonicalize(cwd).ok();
    let same = |recorded: &Path| {
        recorded == cwd
            || canonical
                .as_ref()
                .is_some_and(|c| std::fs::canonicalize(recorded).is_ok_and(|r| r == *c))
    };
    let mut spent = 0u64;
    let mut found = Vec::new();
    for path in rollouts {
        let Some((id, recorded)) = rollout_meta(&path) else {
            continue;
        };
        if !same(&recorded) {
            continue;
        }
        let limit = if spent < ROLLOUT_DISCOVER_TOTAL {
            ROLLOUT_DISCOVER_BYTES
        } else {
            ROLLOUT_META_LIMIT
        };
        let Ok((lines, _)) = super::lines::read_file_lines(&path, 0, limit) else {
            continue;
        };
        spent += lines.iter().map(|l| l.len() as u64).sum::<u64>();
        let (entries, last) = rollout_entries(&lines);
        let prompts: Vec<&String> = entries
            .iter()
            .filter_map(|e| match e {
                HistoryEntry::User { text } => Some(text),
                _ => None,
            })
            .collect();
        let Some(first) = prompts.first() else {
            continue;
        };
        let mtime = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .unwrap_or(0);
        found.push(Discovered {
            native_session_id: id,
            first_prompt: first.chars().take(MAX_FIRST_PROMPT).collect(),
            last_activity_ms: last.unwrap_or(mtime),
            turns: u32::try_from(prompts.len()).unwrap_or(u32::MAX),
        });
    }
    found
}

/// The conversation a rollout holds, oldest first ([`rollout_entries`]); a rollout longer
/// than [`ROLLOUT_HISTORY_BYTES`] is read from that far before its end.
pub fn rollout_history(
    path: &Path,
) -> std::io::Result<Vec<crate::session::discover::HistoryEntry>> {
    let len = std::fs::metadata(path)?.len();
    let (lines, _) = super::lines::read_file_lines(
        path,
        len.saturating_sub(ROLLOUT_HISTORY_BYTES),
        ROLLOUT_HISTORY_BYTES,
    )?;
    Ok(rollout_entries(&lines).0)
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
    /// The thread's rollout file and cwd, from the answer that opened it.
    rollout_path: Option<PathBuf>,
    cwd: Option<String>,
    /// The ids of this turn's tool items: their calls are bracketed already.
    tool_items: HashSet<String>,
    /// This turn's shell and patch calls the rollout recorded, by call id: (name, input).
    rollout_calls: HashMap<String, (String, Value)>,
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

    /// The thread's rollout file, once a `thread/*` answer named it (none for an ephemeral
    /// thread).
    pub fn rollout_path(&self) -> Option<&Path> {
        self.rollout_path.as_deref()
    }

    /// Whether a notification is the end of this thread's turn (the driver then feeds what
    /// the rollout gained first).
    pub fn ends_turn(&self, method: &str, params: &Value) -> bool {
        method == "turn/completed" && self.ours(params)
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
        let thread = &result["thread"];
        self.rollout_path = thread
            .get("path")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        self.cwd = [thread.get("cwd"), result.get("cwd")]
            .into_iter()
            .flatten()
            .find_map(Value::as_str)
            .map(path_of_uri);
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
        let form = method == MCP_ELICITATION && !is_mcp_tool_approval(params);
        if !APPROVALS.contains(&method) || form || !self.ours(params) {
            self.skipped += 1;
            return Vec::new();
        }
        let request_id = match method {
            // No item id: the turn's id and the request's number are unique in the thread.
            MCP_ELICITATION => format!("mcp-{}-{id}", str_of(params, "turnId")),
            _ => permission_id(params, id),
        };
        self.pending.push((id.to_string(), request_id.clone()));
        let mcp_tool = || {
            let tool = params
                .pointer("/_meta/tool_name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            format!("mcp__{}__{tool}", str_of(params, "serverName"))
        };
        let (tool, input) = match method {
            MCP_ELICITATION => (
                mcp_tool(),
                params
                    .pointer("/_meta/tool_params")
                    .cloned()
                    .unwrap_or(json!({})),
            ),
            "item/commandExecution/requestApproval" => (
                "shell".to_owned(),
                json!({"command": params.get("command").map(bare_command), "cwd": params.get("cwd"), "reason": params.get("reason")}),
            ),
            "item/fileChange/requestApproval" => (
                "apply_patch".to_owned(),
                json!({"reason": params.get("reason"), "grantRoot": params.get("grantRoot")}),
            ),
            _ => (
                "permissions".to_owned(),
                json!({"permissions": params.get("permissions"), "reason": params.get("reason")}),
            ),
        };
        vec![EventBody::PermissionRequest(PermissionRequest {
            request_id,
            tool,
            input,
            options: approval_options(method, params),
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
                self.tool_items.clear();
                self.rollout_calls.clear();
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
                            ..PermissionResolved::default()
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
                    let category = super::categories::refine(
                        category_of(params.pointer("/error/codexErrorInfo")),
                        &message,
                    );
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
                Some((name, input)) => {
                    self.tool_items.insert(id.clone());
                    (Kind::Tool, call_bracket(&id, name, input))
                }
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
            return self.on_unstarted_item(&id, item);
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
                imported: false,
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
                    imported: false,
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
                out.push(EventBody::ToolExecEnd(tool_result(&id, item)));
                out
            }
        }
    }

    /// A completed item that never started: a tool item gets its whole bracket (once, and
    /// only in a turn: a straggler after the turn closed its items is not a new call).
    fn on_unstarted_item(&mut self, id: &str, item: &Value) -> Vec<EventBody> {
        let Some((name, input)) = tool_of(str_of(item, "type"), item) else {
            return Vec::new();
        };
        if !self.in_turn() || id.is_empty() || !self.tool_items.insert(id.to_owned()) {
            return Vec::new();
        }
        let mut out = call_bracket(id, name, input);
        out.push(EventBody::ToolExecStart(ToolExecStart {
            call_id: id.to_owned(),
            name: None,
        }));
        out.push(EventBody::ToolExecEnd(tool_result(id, item)));
        out
    }

    /// One line of the thread's rollout file, fed by the driver at the end of a turn (the
    /// lines written since the thread opened or the last turn ended). A shell or patch call
    /// of this turn whose output is recorded but that no item announced becomes the
    /// `tool.call.*` + `tool.exec.*` bracket a command item gets. Everything else in the
    /// rollout is already in the stream, and skipped.
    pub fn on_rollout_line(&mut self, line: &str) -> Vec<EventBody> {
        if !self.in_turn() {
            return Vec::new();
        }
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            self.skipped += 1;
            return Vec::new();
        };
        if entry.get("type").and_then(Value::as_str) != Some("response_item") {
            return Vec::new();
        }
        let item = entry.get("payload").unwrap_or(&Value::Null);
        let turn = item
            .pointer("/internal_chat_message_metadata_passthrough/turn_id")
            .and_then(Value::as_str);
        if turn.is_some_and(|t| Some(t) != self.turn_id.as_deref()) {
            return Vec::new();
        }
        let call_id = str_of(item, "call_id").to_owned();
        if call_id.is_empty() || self.tool_items.contains(&call_id) {
            return Vec::new();
        }
        match str_of(item, "type") {
            "function_call" | "custom_tool_call" | "local_shell_call" => {
                if let Some(call) = rollout_call(item, self.cwd.as_deref()) {
                    self.rollout_calls.insert(call_id, call);
                }
                Vec::new()
            }
            "function_call_output" | "custom_tool_call_output" => {
                let Some((name, input)) = self.rollout_calls.remove(&call_id) else {
                    return Vec::new();
                };
                self.tool_items.insert(call_id.clone());
                let (output, exit_code) = call_output(item.get("output").unwrap_or(&Value::Null));
                let mut out = call_bracket(&call_id, name, input);
                out.push(EventBody::ToolExecStart(ToolExecStart {
                    call_id: call_id.clone(),
                    name: None,
                }));
                out.push(EventBody::ToolExecEnd(ToolExecEnd {
                    truncated: None,
                    call_id,
                    output,
                    // Only a call that went wrong has no item; a parsed exit code 0 says
                    // otherwise.
                    is_error: exit_code != Some(0),
                    exit_code,
                }));
                out
            }
            _ => Vec::new(),
        }
    }

    fn on_turn_completed(&mut self, turn: &Value) -> Vec<EventBody> {
        let mut out = self.close_open();
        self.pending.clear();
        self.turn_id = None;
        self.tool_items.clear();
        self.rollout_calls.clear();
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
                let message = match str_of(error, "message") {
                    "" => format!("the turn ended {}", str_of(turn, "status")),
                    m => m.to_owned(),
                };
                let category =
                    super::categories::refine(category_of(error.get("codexErrorInfo")), &message);
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
                    imported: false,
                }),
                Kind::Thinking => EventBody::ThinkingEnd(BlockEnd {
                    truncated: None,
                    item_id: Some(id),
                    text: open.text,
                    imported: false,
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

    /// The process ended. `in_turn`: a `turn/start` went out and no `turn/completed` ended
    /// it — a failed run whose outcome is unknown (`result_delivery_unknown`).
    pub fn on_exit(&mut self, in_turn: bool, status: &str) -> Vec<EventBody> {
        let mut out = self.close_open();
        self.turn_id = None;
        if in_turn {
            out.extend(
                AdapterError::result_unknown(format!(
                    "the agent process exited mid-turn ({status})"
                ))
                .run_failed(),
            );
        }
        out
    }
}

/// `tool.call.start` + `tool.call.end` of a call whose input is known whole.
fn call_bracket(id: &str, name: String, input: Value) -> Vec<EventBody> {
    vec![
        EventBody::ToolCallStart(ToolCallStart {
            call_id: id.to_owned(),
            name: name.clone(),
        }),
        EventBody::ToolCallEnd(ToolCallEnd {
            truncated: None,
            call_id: id.to_owned(),
            name,
            input,
        }),
    ]
}

/// A command item's command as the model wrote it. The app-server reports what it ran, which is
/// the model's command wrapped in the user's shell (`/bin/bash -lc '…'`), while the same call
/// seen as a raw `function_call` carries the bare command; which of the two reaches the
/// translator first depends on timing, so both are shown as the bare command. Anything that is
/// not exactly `<shell> -c|-lc <one argument>` is kept as it came.
fn bare_command(command: &Value) -> Value {
    let Some(text) = command.as_str() else {
        return command.clone();
    };
    if let Some(words) = shlex::split(text)
        && let [shell, flag, inner] = words.as_slice()
        && matches!(
            shell.rsplit('/').next(),
            Some("bash" | "sh" | "zsh" | "dash")
        )
        && matches!(flag.as_str(), "-c" | "-lc")
    {
        return Value::String(inner.clone());
    }
    command.clone()
}

/// `namespace.name`, or the name alone.
fn qualified(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}.{name}")
    }
}

/// A tool item's canonical name and input; `None` for items that are no tool call.
fn tool_of(kind: &str, item: &Value) -> Option<(String, Value)> {
    Some(match kind {
        "commandExecution" => (
            "shell".to_owned(),
            json!({"command": item.get("command").map(bare_command), "cwd": item.get("cwd")}),
        ),
        "fileChange" => (
            "apply_patch".to_owned(),
            json!({"changes": item.get("changes")}),
        ),
        "mcpToolCall" => (
            format!("{}.{}", str_of(item, "server"), str_of(item, "tool")),
            item.get("arguments").cloned().unwrap_or(Value::Null),
        ),
        "dynamicToolCall" => (
            qualified(str_of(item, "namespace"), str_of(item, "tool")),
            item.get("arguments").cloned().unwrap_or(Value::Null),
        ),
        "collabAgentToolCall" => (
            format!("agent.{}", str_of(item, "tool")),
            json!({"prompt": item.get("prompt"), "model": item.get("model"),
                   "receiverThreadIds": item.get("receiverThreadIds")}),
        ),
        "webSearch" => (
            "web_search".to_owned(),
            json!({"query": item.get("query"), "action": item.get("action")}),
        ),
        "imageView" => ("view_image".to_owned(), json!({"path": item.get("path")})),
        "imageGeneration" => (
            "image_generation".to_owned(),
            json!({"revisedPrompt": item.get("revisedPrompt")}),
        ),
        "sleep" => (
            "sleep".to_owned(),
            json!({"durationMs": item.get("durationMs")}),
        ),
        // The output of a call no other item type covers (it has no started form).
        "functionCallOutput" => (
            qualified(str_of(item, "namespace"), str_of(item, "name")),
            Value::Null,
        ),
        _ => return None,
    })
}

/// The text of content items (`[{type: "text" | "inputText" | "input_text", text}]`); other
/// JSON as JSON.
fn text_of(content: &Value) -> String {
    match content {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(parts) if parts.iter().all(|p| p.get("text").is_some()) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        other => other.to_string(),
    }
}

/// A completed tool item's `tool.exec.end`: its output, exit code, and whether it failed.
fn tool_result(id: &str, item: &Value) -> ToolExecEnd {
    let status = str_of(item, "status");
    let not_completed = status != "completed";
    let (output, exit_code, is_error) = match str_of(item, "type") {
        "commandExecution" => {
            let exit_code = item.get("exitCode").and_then(Value::as_i64);
            (
                str_of(item, "aggregatedOutput").to_owned(),
                exit_code,
                not_completed || exit_code.is_some_and(|c| c != 0),
            )
        }
        "fileChange" => {
            let changes = item
                .get("changes")
                .and_then(Value::as_array)
                .map(|c| {
                    c.iter()
                        .map(|c| {
                            let kind = c.pointer("/kind/type").and_then(Value::as_str);
                            format!("{} {}", kind.unwrap_or_default(), str_of(c, "path"))
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            (changes, None, not_completed)
        }
        "mcpToolCall" => match item.get("error").filter(|e| !e.is_null()) {
            Some(error) => (
                error
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| error.to_string(), str::to_owned),
                None,
                true,
            ),
            None => (
                text_of(item.pointer("/result/content").unwrap_or(&Value::Null)),
                None,
                not_completed,
            ),
        },
        "dynamicToolCall" => (
            text_of(item.get("contentItems").unwrap_or(&Value::Null)),
            None,
            not_completed || item.get("success").and_then(Value::as_bool) == Some(false),
        ),
        "collabAgentToolCall" => (
            item.get("agentsStates")
                .map(Value::to_string)
                .unwrap_or_default(),
            None,
            not_completed,
        ),
        "imageView" => (str_of(item, "path").to_owned(), None, false),
        "imageGeneration" => {
            let failure = item.get("failure").filter(|f| !f.is_null());
            (
                failure.map_or_else(|| str_of(item, "savedPath").to_owned(), Value::to_string),
                None,
                failure.is_some() || status == "failed",
            )
        }
        "functionCallOutput" => {
            let (output, exit_code) = call_output(item.get("output").unwrap_or(&Value::Null));
            (output, exit_code, exit_code.is_some_and(|c| c != 0))
        }
        "sleep" => (String::new(), None, false),
        // webSearch: no status; what was searched or opened.
        _ => {
            let what = match str_of(item, "query") {
                "" => item.get("action").map(Value::to_string).unwrap_or_default(),
                query => query.to_owned(),
            };
            (what, None, false)
        }
    };
    ToolExecEnd {
        truncated: None,
        call_id: id.to_owned(),
        output,
        is_error,
        exit_code,
    }
}

/// The shell tools Codex offers models (`exec_command` with unified exec, `shell`,
/// `shell_command`, `container.exec`, `local_shell`).
const SHELL_TOOLS: &[&str] = &[
    "exec_command",
    "shell",
    "shell_command",
    "container.exec",
    "local_shell",
];

/// A rollout `function_call` / `custom_tool_call` / `local_shell_call` of a shell or patch
/// tool as (name, input), in the shapes the items give: `shell` `{command, cwd}`,
/// `apply_patch` `{patch}`. Other tools are not bracketed from the rollout.
fn rollout_call(item: &Value, cwd: Option<&str>) -> Option<(String, Value)> {
    let name = str_of(item, "name");
    let args = match item.get("arguments") {
        Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(Value::Null),
        Some(other) => other.clone(),
        None => Value::Null,
    };
    let words = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        }
    };
    let shell = |command: Option<String>, dir: Option<&Value>| {
        let dir = dir
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| cwd.map(str::to_owned));
        Some((
            "shell".to_owned(),
            json!({"command": command.unwrap_or_default(), "cwd": dir}),
        ))
    };
    match str_of(item, "type") {
        "local_shell_call" => {
            let action = item.get("action").unwrap_or(&Value::Null);
            shell(
                action.get("command").and_then(words),
                action.get("working_directory"),
            )
        }
        "custom_tool_call" if name == "apply_patch" => Some((
            "apply_patch".to_owned(),
            json!({"patch": item.get("input")}),
        )),
        "function_call" if name == "apply_patch" => Some((
            "apply_patch".to_owned(),
            json!({"patch": args.get("input")}),
        )),
        "function_call" if SHELL_TOOLS.contains(&name) => {
            let command = ["cmd", "command"]
                .iter()
                .find_map(|k| args.get(*k).and_then(words));
            shell(command, args.get("workdir"))
        }
        _ => None,
    }
}

/// A function call's recorded output (a string, or content items) as (output, exit code).
/// Shell outputs carry a header — `Process exited with code N` (unified exec) or
/// `Exit code: N` — ended by an `Output:` line; older ones are JSON
/// `{output, metadata: {exit_code}}`.
fn call_output(output: &Value) -> (String, Option<i64>) {
    let text = text_of(output);
    if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(&text)
        && let Some(body) = o.get("output").and_then(Value::as_str)
    {
        let code = o.get("metadata").and_then(|m| m.get("exit_code"));
        return (body.to_owned(), code.and_then(Value::as_i64));
    }
    let Some((header, body)) = text
        .split_once("\nOutput:\n")
        .or_else(|| text.strip_prefix("Output:\n").map(|b| ("", b)))
    else {
        return (text, None);
    };
    let exit_code = header.lines().find_map(|l| {
        l.strip_prefix("Process exited with code ")
            .or_else(|| l.strip_prefix("Exit code: "))
            .and_then(|c| c.trim().parse::<i64>().ok())
    });
    (body.to_owned(), exit_code)
}

/// The shared category of a `codexErrorInfo`.
fn category_of(info: Option<&Value>) -> ErrorCategory {
    let name = match info {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => o.keys().next().map_or("", String::as_str),
        _ => "",
    };
    // A failed HTTP response names its status (`{"responseTooManyFailedAttempts":
    // {"httpStatusCode": 429}}` and the like).
    if let Some(Value::Object(o)) = info
        && let Some(category) = o
            .values()
            .find_map(|v| v.get("httpStatusCode").and_then(Value::as_u64))
            .and_then(super::categories::from_http_status)
    {
        return category;
    }
    match name {
        "responseStreamDisconnected" | "ResponseStreamDisconnected" => ErrorCategory::TransportLost,
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
    /// with the answers to the host's requests, and — just before a `turn/completed` — the
    /// rollout lines the driver feeds then) beside its expected events (`*.events.json`).
    /// `AGENT_HOST_BLESS=1` rewrites the expectations for review.
    /// An escalation request as Codex 0.171.0 sent it (reference transcript): its decisions
    /// become options (decline added), and each goes back as Codex offered it.
    #[test]
    fn a_shell_wrapped_command_is_shown_bare() {
        let of = |c: &str| bare_command(&json!(c));
        assert_eq!(
            of("/bin/bash -lc 'touch made && echo hi'"),
            json!("touch made && echo hi")
        );
        assert_eq!(of("bash -c 'ls -la'"), json!("ls -la"));
        // Not exactly a shell with one script argument: kept.
        assert_eq!(of("ls -la"), json!("ls -la"));
        assert_eq!(
            of("/bin/bash -lc 'a' extra"),
            json!("/bin/bash -lc 'a' extra")
        );
        assert_eq!(of("python -c 'print(1)'"), json!("python -c 'print(1)'"));
        assert_eq!(
            of("/bin/bash -lc 'unclosed"),
            json!("/bin/bash -lc 'unclosed")
        );
        assert_eq!(bare_command(&json!(["ls"])), json!(["ls"]));
    }

    #[test]
    fn approval_decisions_become_options_and_answers() {
        let params = json!({"itemId": "call_1", "command": "/bin/bash -lc 'touch x && echo hi'",
            "commandActions": [{"type": "unknown", "command": "touch x && echo hi"}],
            "availableDecisions": ["accept",
                {"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["touch", "x"]}},
                "cancel"]});
        let method = "item/commandExecution/requestApproval";
        let options = approval_options(method, &params);
        let ids: Vec<&str> = options.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "accept",
                "acceptForSession",
                "acceptWithExecpolicyAmendment",
                "decline",
                "cancel"
            ]
        );
        assert_eq!(
            options[1].rule.as_deref(),
            Some("always allow `touch x && echo hi` in this session")
        );
        assert_eq!(options[1].kind, PermissionOptionKind::AllowAlways);
        assert!(answer_keeps_for_session(&approval_answer(
            method,
            &params,
            true,
            Some(&options[1])
        )));
        // The exec-policy amendment did not stop Codex asking: allow-once, no rule.
        assert_eq!(options[2].kind, PermissionOptionKind::AllowOnce);
        assert_eq!(options[2].rule, None);
        assert_eq!(
            options[2].label,
            "Allow, and ask Codex to save commands starting with `touch x` in its exec policy"
        );
        let amended = approval_answer(method, &params, true, Some(&options[2]));
        assert_eq!(
            amended,
            json!({"decision": {"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["touch", "x"]}}})
        );
        assert!(!answer_keeps_for_session(&amended));
        assert!(!answer_keeps_for_session(&approval_answer(
            method, &params, true, None
        )));
        assert_eq!(
            approval_answer(method, &params, false, Some(&options[4])),
            json!({"decision": "cancel"})
        );
        assert_eq!(
            approval_answer(method, &params, false, None),
            json!({"decision": "decline"})
        );
        // Without a list: what the app-server takes, acceptForSession among it.
        let bare = json!({"itemId": "call_2", "command": "ls"});
        let options = approval_options(method, &bare);
        let ids: Vec<&str> = options.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["accept", "acceptForSession", "decline", "cancel"]);
        assert_eq!(
            options[1].rule.as_deref(),
            Some("always allow `ls` in this session")
        );
        assert_eq!(
            approval_answer(method, &bare, true, Some(&options[1])),
            json!({"decision": "acceptForSession"})
        );
        // Permission grants: the session scope for the always option.
        let grant = "item/permissions/requestApproval";
        let asked = json!({"permissions": {"network": true}});
        let options = approval_options(grant, &asked);
        let granted = approval_answer(grant, &asked, true, Some(&options[1]));
        assert_eq!(
            granted,
            json!({"permissions": {"network": true}, "scope": "session"})
        );
        assert!(answer_keeps_for_session(&granted));
        assert!(!answer_keeps_for_session(&approval_answer(
            grant,
            &asked,
            true,
            Some(&options[0])
        )));
    }

    /// A decision this build does not know allows once and keeps no rule.
    #[test]
    fn unknown_accept_decisions_allow_once() {
        let params = json!({"itemId": "call_3", "command": "ls",
            "availableDecisions": ["accept", "acceptSomehowElse", {"applyPatchForever": {}},
                "decline"]});
        let method = "item/commandExecution/requestApproval";
        let options = approval_options(method, &params);
        let kinds: Vec<(&str, PermissionOptionKind)> =
            options.iter().map(|o| (o.id.as_str(), o.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("accept", PermissionOptionKind::AllowOnce),
                ("acceptForSession", PermissionOptionKind::AllowAlways),
                ("acceptSomehowElse", PermissionOptionKind::AllowOnce),
                ("applyPatchForever", PermissionOptionKind::AllowOnce),
                ("decline", PermissionOptionKind::RejectOnce),
            ]
        );
        assert!(options[2].rule.is_none() && options[3].rule.is_none());
        let answer = approval_answer(method, &params, true, Some(&options[2]));
        assert_eq!(answer, json!({"decision": "acceptSomehowElse"}));
        assert!(!answer_keeps_for_session(&answer));
    }

    #[test]
    fn fixtures_translate_to_their_expected_events() {
        let checked = super::super::fixtures::check_all("codex", Translator::new, feed);
        assert!(checked >= 8, "only {checked} fixtures");
    }

    /// A fixture line to the translator: rollout lines (`{timestamp, type, payload}`) as the
    /// driver feeds them, the rest as app-server stdout.
    fn feed(t: &mut Translator, line: &str) -> Vec<EventBody> {
        let rollout = serde_json::from_str::<Value>(line)
            .is_ok_and(|v| v.get("payload").is_some() && v.get("timestamp").is_some());
        if rollout {
            t.on_rollout_line(line)
        } else {
            t.on_line(line)
        }
    }

    fn fixture_events(name: &str) -> Vec<EventBody> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/codex")
            .join(name);
        let text = std::fs::read_to_string(path).unwrap();
        let mut t = Translator::new();
        text.lines().flat_map(|l| feed(&mut t, l)).collect()
    }

    fn exec_end(events: &[EventBody]) -> Vec<&ToolExecEnd> {
        events
            .iter()
            .filter_map(|e| match e {
                EventBody::ToolExecEnd(end) => Some(end),
                _ => None,
            })
            .collect()
    }

    /// Recorded from the real app-server (0.171.0, workspace-write, on-request): the model
    /// runs `echo hi > /agent-host-probe`; the sandbox denies it as it starts, so no item ever
    /// names it, and the model's next message quotes the failure. The rollout lines fed at
    /// the turn's end bracket it like any command: a failed `shell` with exit code 1 and its
    /// output, before the run ends.
    #[test]
    fn a_command_the_sandbox_denies_at_start_is_a_failed_tool_call() {
        let events = fixture_events("sandbox-denied.jsonl");
        let tool: Vec<&str> = kinds(&events)
            .into_iter()
            .filter(|k| k.starts_with("tool."))
            .collect();
        assert_eq!(
            tool,
            [
                "tool.call.start",
                "tool.call.end",
                "tool.exec.start",
                "tool.exec.end"
            ]
        );
        let call = events
            .iter()
            .find_map(|e| match e {
                EventBody::ToolCallEnd(c) => Some(c),
                _ => None,
            })
            .unwrap();
        assert_eq!(call.name, "shell");
        assert_eq!(call.input["command"], "echo hi > /agent-host-probe");
        assert_eq!(call.input["cwd"], "/WORK");
        let end = exec_end(&events)[0];
        assert_eq!(end.call_id, call.call_id);
        assert!(end.is_error);
        assert_eq!(end.exit_code, Some(1));
        assert_eq!(
            end.output,
            "/bin/bash: line 1: /agent-host-probe: Read-only file system\n"
        );
        // The bracket comes before the run's end.
        let at = |k: &str| kinds(&events).iter().position(|x| *x == k).unwrap();
        assert!(at("tool.exec.end") < at("run.end"));
    }

    /// Recorded likewise: `apply_patch` (through the shell) of a file that does not exist
    /// fails verification, which no item reports either.
    #[test]
    fn a_patch_that_fails_verification_is_a_failed_tool_call() {
        let events = fixture_events("patch-verification-failed.jsonl");
        let ends = exec_end(&events);
        assert_eq!(ends.len(), 1, "{:?}", kinds(&events));
        assert!(ends[0].is_error);
        assert!(
            ends[0]
                .output
                .starts_with("apply_patch verification failed"),
            "{}",
            ends[0].output
        );
    }

    fn turn(t: &mut Translator) {
        t.on_result(&json!({"thread": {"id": "th", "cwd": "/w", "path": "/r.jsonl"}}));
        note(
            t,
            "turn/started",
            json!({"threadId": "th", "turn": {"id": "tu"}}),
        );
    }

    fn rollout(t: &mut Translator, payload: Value) -> Vec<EventBody> {
        let line = json!({"timestamp": "2026-12-01T00:00:00Z", "type": "response_item",
                          "payload": payload});
        t.on_rollout_line(&line.to_string())
    }

    #[test]
    fn rollout_calls_with_an_item_or_of_another_turn_are_not_bracketed_twice() {
        let mut t = Translator::new();
        turn(&mut t);
        assert_eq!(t.rollout_path(), Some(Path::new("/r.jsonl")));
        note(
            &mut t,
            "item/started",
            json!({"threadId": "th", "item": {"type": "commandExecution", "id": "c1",
                   "command": "ls", "cwd": "/w"}}),
        );
        note(
            &mut t,
            "item/completed",
            json!({"threadId": "th", "item": {"type": "commandExecution", "id": "c1",
                   "status": "completed", "exitCode": 0, "aggregatedOutput": "a\n"}}),
        );
        let call = |id: &str, turn: &str| {
            json!({"type": "function_call", "name": "exec_command", "call_id": id,
                   "arguments": "{\"cmd\":\"ls\",\"workdir\":\"/w/sub\"}",
                   "internal_chat_message_metadata_passthrough": {"turn_id": turn}})
        };
        let output = |id: &str| {
            json!({"type": "function_call_output", "call_id": id,
                   "output": "Exit code: 0\nWall time: 0 seconds\nOutput:\nok\n"})
        };
        // Seen as an item already.
        assert!(rollout(&mut t, call("c1", "tu")).is_empty());
        assert!(rollout(&mut t, output("c1")).is_empty());
        // Another turn's.
        assert!(rollout(&mut t, call("c2", "old")).is_empty());
        assert!(rollout(&mut t, output("c2")).is_empty());
        // Not a shell or patch tool.
        let plan = json!({"type": "function_call", "name": "update_plan", "call_id": "c3",
                          "arguments": "{}"});
        assert!(rollout(&mut t, plan).is_empty());
        assert!(rollout(&mut t, output("c3")).is_empty());
        // This turn's, with no item: bracketed once, exit code 0 is no error.
        assert!(rollout(&mut t, call("c4", "tu")).is_empty());
        let events = rollout(&mut t, output("c4"));
        assert_eq!(
            kinds(&events),
            [
                "tool.call.start",
                "tool.call.end",
                "tool.exec.start",
                "tool.exec.end"
            ]
        );
        match &events[1] {
            EventBody::ToolCallEnd(c) => {
                assert_eq!(c.input, json!({"command": "ls", "cwd": "/w/sub"}));
            }
            other => panic!("{other:?}"),
        }
        let end = exec_end(&events)[0];
        assert_eq!((end.is_error, end.exit_code), (false, Some(0)));
        assert_eq!(end.output, "ok\n");
        assert!(rollout(&mut t, output("c4")).is_empty());
        // Garbage is counted; no turn, nothing.
        let skipped = t.skipped();
        assert!(t.on_rollout_line("{not json").is_empty());
        assert_eq!(t.skipped(), skipped + 1);
        note(
            &mut t,
            "turn/completed",
            json!({"threadId": "th", "turn": {"id": "tu", "status": "completed"}}),
        );
        assert!(rollout(&mut t, call("c5", "tu")).is_empty());
        assert!(rollout(&mut t, output("c5")).is_empty());
    }

    /// Every tool item type of the 0.171.0 schema becomes a tool bracket with the right error
    /// flag, also when it only completes; items that are no tool call stay skipped.
    #[test]
    fn every_tool_item_is_a_tool_call() {
        let cases = [
            (
                json!({"type": "webSearch", "id": "w", "query": "rust"}),
                "web_search",
                false,
                "rust",
            ),
            (
                json!({"type": "fileChange", "id": "f", "status": "failed",
                       "changes": [{"path": "/w/a", "kind": {"type": "add"}, "diff": "x"}]}),
                "apply_patch",
                true,
                "add /w/a",
            ),
            (
                json!({"type": "mcpToolCall", "id": "m", "server": "s", "tool": "t",
                       "status": "failed", "arguments": {}, "error": {"message": "boom"}}),
                "s.t",
                true,
                "boom",
            ),
            (
                json!({"type": "mcpToolCall", "id": "m2", "server": "s", "tool": "t",
                       "status": "completed", "arguments": {},
                       "result": {"content": [{"type": "text", "text": "fine"}]}}),
                "s.t",
                false,
                "fine",
            ),
            (
                json!({"type": "dynamicToolCall", "id": "d", "tool": "t", "namespace": "ns",
                       "status": "completed", "success": false, "arguments": {},
                       "contentItems": [{"type": "inputText", "text": "no"}]}),
                "ns.t",
                true,
                "no",
            ),
            (
                json!({"type": "collabAgentToolCall", "id": "a", "tool": "spawnAgent",
                       "status": "completed", "senderThreadId": "th", "receiverThreadIds": [],
                       "agentsStates": {}}),
                "agent.spawnAgent",
                false,
                "{}",
            ),
            (
                json!({"type": "imageView", "id": "i", "path": "/w/p.png"}),
                "view_image",
                false,
                "/w/p.png",
            ),
            (
                json!({"type": "imageGeneration", "id": "g", "status": "failed"}),
                "image_generation",
                true,
                "",
            ),
            (
                json!({"type": "sleep", "id": "z", "durationMs": 5}),
                "sleep",
                false,
                "",
            ),
            (
                json!({"type": "functionCallOutput", "id": "o", "name": "exec",
                       "output": "Process exited with code 2\nOutput:\nbad"}),
                "exec",
                true,
                "bad",
            ),
        ];
        for (started, (item, name, is_error, output)) in [true, false]
            .into_iter()
            .flat_map(|s| cases.iter().map(move |c| (s, c)))
        {
            let mut t = Translator::new();
            turn(&mut t);
            let mut events = Vec::new();
            if started {
                events.extend(note(
                    &mut t,
                    "item/started",
                    json!({"threadId": "th", "item": item}),
                ));
            }
            events.extend(note(
                &mut t,
                "item/completed",
                json!({"threadId": "th", "item": item}),
            ));
            assert_eq!(
                kinds(&events),
                [
                    "tool.call.start",
                    "tool.call.end",
                    "tool.exec.start",
                    "tool.exec.end"
                ],
                "{item}"
            );
            match &events[1] {
                EventBody::ToolCallEnd(c) => assert_eq!(c.name, *name, "{item}"),
                other => panic!("{other:?}"),
            }
            let end = exec_end(&events)[0];
            assert_eq!(
                (end.is_error, end.output.as_str()),
                (*is_error, *output),
                "{item}"
            );
            // Completed again (a straggler): nothing new.
            if !started {
                let again = note(
                    &mut t,
                    "item/completed",
                    json!({"threadId": "th", "item": item}),
                );
                assert!(again.is_empty(), "{item}");
            }
        }
        for other in [
            "plan",
            "contextCompaction",
            "subAgentActivity",
            "hookPrompt",
        ] {
            let mut t = Translator::new();
            turn(&mut t);
            let item = json!({"threadId": "th", "item": {"type": other, "id": "x"}});
            assert!(note(&mut t, "item/started", item.clone()).is_empty());
            assert!(note(&mut t, "item/completed", item).is_empty());
        }
    }

    #[test]
    fn resume_and_fork_name_the_sessions_cwd() {
        let options = SessionOptions::default();
        for params in [
            thread_resume_params("th", "/w", &options),
            thread_fork_params("th", "/w", &options),
        ] {
            assert_eq!(params["threadId"], "th");
            assert_eq!(params["cwd"], "/w");
            assert_eq!(params["approvalPolicy"], "on-request");
            assert_eq!(params["sandbox"], "workspace-write");
        }
    }

    /// A session's options in Codex's carriers, the same on start, resume and fork: `model`,
    /// `developerInstructions`, MCP servers as the `config` override (stdio with its env, HTTP
    /// with its headers, SSE left out), and the permission mode's approval policy and sandbox.
    #[test]
    fn options_map_to_thread_params() {
        use crate::protocol::options::{EnvVar, Header};
        let options = SessionOptions {
            model: Some("gpt-x".to_owned()),
            system_prompt: Some("be brief".to_owned()),
            mcp_servers: vec![
                McpServer::Stdio {
                    name: "probe".to_owned(),
                    command: "node".to_owned(),
                    args: vec!["/t/probe.mjs".to_owned()],
                    env: vec![EnvVar {
                        name: "K".to_owned(),
                        value: "v".to_owned(),
                    }],
                },
                McpServer::Http {
                    name: "web".to_owned(),
                    url: "http://127.0.0.1:9/mcp".to_owned(),
                    headers: vec![Header {
                        name: "X-A".to_owned(),
                        value: "b".to_owned(),
                    }],
                },
                McpServer::Sse {
                    name: "old".to_owned(),
                    url: "http://127.0.0.1:9/sse".to_owned(),
                    headers: Vec::new(),
                },
            ],
            permission_mode: Some(PermissionMode::Bypass),
        };
        let start = thread_start_params("/w", &options);
        assert_eq!(
            start,
            json!({
                "cwd": "/w", "approvalPolicy": "never", "sandbox": "danger-full-access",
                "model": "gpt-x", "developerInstructions": "be brief",
                "config": {"mcp_servers": {
                    "probe": {"command": "node", "args": ["/t/probe.mjs"], "env": {"K": "v"}},
                    "web": {"url": "http://127.0.0.1:9/mcp", "http_headers": {"X-A": "b"}},
                }},
            })
        );
        for params in [
            thread_resume_params("th", "/w", &options),
            thread_fork_params("th", "/w", &options),
        ] {
            let mut expected = start.clone();
            expected["threadId"] = json!("th");
            assert_eq!(params, expected);
        }
        // No options: the policy the host always ran Codex under, nothing else.
        assert_eq!(
            thread_start_params("/w", &SessionOptions::default()),
            json!({"cwd": "/w", "approvalPolicy": "on-request", "sandbox": "workspace-write"})
        );
    }

    /// A turn carries the model a `set_model` chose, and each image attachment as a
    /// `localImage` of the host's copy; other attachments are not Codex's to take.
    #[test]
    fn a_turn_carries_the_model_and_local_images() {
        let attachment = |kind, path: &str| Attachment {
            name: "a".to_owned(),
            mime: "image/png".to_owned(),
            kind,
            bytes: 1,
            sha256: String::new(),
            path: PathBuf::from(path),
        };
        let params = turn_start_params(
            "th",
            "look",
            Some("gpt-y"),
            &[
                attachment(AttachmentKind::Image, "/h/a.png"),
                attachment(AttachmentKind::File, "/h/b.txt"),
            ],
        );
        assert_eq!(
            params,
            json!({"threadId": "th", "model": "gpt-y", "input": [
                {"type": "text", "text": "look", "text_elements": []},
                {"type": "localImage", "path": "/h/a.png"},
            ]})
        );
        let plain = turn_start_params("th", "hi", None, &[]);
        assert!(plain.get("model").is_none(), "{plain}");
    }

    /// Codex's approval of an MCP tool call (an elicitation with `codex_approval_kind:
    /// mcp_tool_call`, as 0.171.0 sent it) is a `permission.request` for `mcp__<server>__<tool>`
    /// with its arguments; allowed it is `accept`, denied `decline`. Another elicitation (a
    /// form) is no request of the client's.
    #[test]
    fn an_mcp_tool_approval_is_a_permission_request() {
        let mut t = Translator::new();
        turn(&mut t);
        let params = json!({"threadId": "th", "turnId": "tu", "serverName": "probe",
            "mode": "form", "message": "Allow the probe MCP server to run tool \"probe\"?",
            "requestedSchema": {"type": "object", "properties": {}},
            "_meta": {"codex_approval_kind": "mcp_tool_call", "persist": ["session", "always"],
                      "tool_name": "probe", "tool_params": {"text": "hello"}}});
        let events = t.on_server_request(&json!(0), MCP_ELICITATION, &params);
        let [EventBody::PermissionRequest(request)] = events.as_slice() else {
            panic!("{events:?}");
        };
        assert_eq!(request.tool, "mcp__probe__probe");
        assert_eq!(request.input, json!({"text": "hello"}));
        assert_eq!(request.request_id, "mcp-tu-0");
        let ids: Vec<&str> = request.options.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["accept", "decline"]);
        assert_eq!(
            approval_answer(MCP_ELICITATION, &params, true, None),
            json!({"action": "accept", "content": {}})
        );
        assert_eq!(
            approval_answer(MCP_ELICITATION, &params, false, None),
            json!({"action": "decline"})
        );
        assert_eq!(
            approval_answer(MCP_ELICITATION, &params, false, Some(&request.options[1])),
            json!({"action": "decline"})
        );
        let mut form = params.clone();
        form["_meta"] = json!({});
        assert!(
            t.on_server_request(&json!(1), MCP_ELICITATION, &form)
                .is_empty()
        );
        assert!(APPROVALS.contains(&MCP_ELICITATION));
    }

    /// A real rollout (0.171.0, the sandbox-denied run's, sanitized: its cwd is `/WORK`), one
    /// in another cwd, a URI cwd, garbage, a first line that is no `session_meta`, a meta line
    /// that does not end within the limit, and no file.
    #[test]
    fn a_rollouts_cwd_is_its_session_meta_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let real = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/codex/rollouts/sandbox-denied.rollout.jsonl");
        assert_eq!(rollout_cwd(&real), Some(PathBuf::from("/WORK")));
        let meta = |cwd: &str| {
            format!(
                "{}\n{}\n",
                json!({"timestamp": "t", "ordinal": 0, "type": "session_meta",
                       "payload": {"id": "th", "cwd": cwd,
                                   "base_instructions": {"text": "x".repeat(30_000)}}}),
                json!({"type": "event_msg", "payload": {"type": "task_started"}})
            )
        };
        let good = write("good.jsonl", &meta("/home/u/proj"));
        assert_eq!(rollout_cwd(&good), Some(PathBuf::from("/home/u/proj")));
        let other = write("other.jsonl", &meta("/home/u/elsewhere"));
        assert_eq!(
            rollout_cwd(&other),
            Some(PathBuf::from("/home/u/elsewhere"))
        );
        let uri = write("uri.jsonl", &meta("file:///home/u/my%20proj"));
        assert_eq!(rollout_cwd(&uri), Some(PathBuf::from("/home/u/my proj")));
        for garbage in [
            "",
            "\u{0}\u{1}binary",
            "{\"type\":\"session_meta\",\"payload\":",
            "{\"type\":\"session_meta\",\"payload\":{\"cwd\":7}}\n",
            "{\"type\":\"session_meta\",\"payload\":{\"cwd\":\"\"}}\n",
            "{\"type\":\"session_meta\",\"payload\":\"x\"}\n",
            "[1,2]\n",
            "{\"type\":\"event_msg\",\"payload\":{\"cwd\":\"/w\"}}\n",
        ] {
            let path = write("garbage.jsonl", garbage);
            assert_eq!(rollout_cwd(&path), None, "{garbage:?}");
        }
        let endless = format!(
            "{{\"type\":\"session_meta\",\"payload\":{{\"junk\":\"{}\",\"cwd\":\"/w\"}}}}\n",
            "y".repeat(usize::try_from(ROLLOUT_META_LIMIT).unwrap())
        );
        assert_eq!(rollout_cwd(&write("endless.jsonl", &endless)), None);
        assert_eq!(rollout_cwd(&dir.path().join("missing.jsonl")), None);
        assert_eq!(rollout_cwd(dir.path()), None);
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
