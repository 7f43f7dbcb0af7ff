//! The Agent Client Protocol v1 (JSON-RPC 2.0 over stdio): the messages the host sends (the
//! session's options and a prompt's attachments in ACP's own forms: [`SessionSetup`],
//! [`SessionChoices`], [`attachment_block`]), and [`Translator`], a pure, stateful translator
//! from what an ACP agent sends to canonical events (style 8). The driver that owns the
//! process is `acp_process.rs`.
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
use crate::protocol::options::{
    Attachment, AttachmentKind, McpServer, McpTransport, PermissionMode, SessionOptions,
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
    /// `promptCapabilities`: image, audio and embedded resource content in a prompt (text and
    /// resource links are every agent's baseline).
    pub image: bool,
    pub audio: bool,
    pub embedded_context: bool,
    /// `mcpCapabilities`: MCP servers over HTTP and SSE (stdio is every agent's baseline).
    pub mcp_http: bool,
    pub mcp_sse: bool,
}

/// The npm package name claude-agent-acp gives as its `agentInfo.name`.
pub const CLAUDE_AGENT_ACP: &str = "@agentclientprotocol/claude-agent-acp";

/// What an agent carries beyond what `initialize` can declare: a model choice, a standing
/// prompt and permission modes only show in a session answer, or not at all (a standing prompt
/// has no ACP field). Known for the agents a test with the real CLI shows
/// (`tests/suite/acp.rs`); nothing for the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carriers {
    /// The model is chosen per session (`configOptions` of category `model`) and changed live.
    pub model: bool,
    /// A standing prompt appended to the agent's own (claude-agent-acp: `_meta.systemPrompt`
    /// `{append}` on `session/new`, `load`, `resume` and `fork`).
    pub system_prompt: bool,
    /// The permission modes it maps ([`mode_id`]).
    pub permission_modes: &'static [PermissionMode],
}

impl Carriers {
    pub const NONE: Carriers = Carriers {
        model: false,
        system_prompt: false,
        permission_modes: &[PermissionMode::Ask],
    };
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
            image: flag(caps, "/promptCapabilities/image"),
            audio: flag(caps, "/promptCapabilities/audio"),
            embedded_context: flag(caps, "/promptCapabilities/embeddedContext"),
            mcp_http: flag(caps, "/mcpCapabilities/http"),
            mcp_sse: flag(caps, "/mcpCapabilities/sse"),
        }
    }

    /// What this agent carries beyond `initialize` ([`Carriers`]), by its declared name.
    /// claude-agent-acp (0.49.0, read in its source and shown by `tests/suite/acp.rs`) declares none
    /// of it: it offers its models and modes in each session answer and takes a standing
    /// prompt in `_meta.systemPrompt`; `bypassPermissions` only where its Claude Code may
    /// bypass (not as root without `IS_SANDBOX`), which the open checks.
    pub fn carriers(&self) -> Carriers {
        match self.name.as_deref() {
            Some(CLAUDE_AGENT_ACP) => Carriers {
                model: true,
                system_prompt: true,
                permission_modes: &[
                    PermissionMode::Ask,
                    PermissionMode::AcceptEdits,
                    PermissionMode::Bypass,
                ],
            },
            _ => Carriers::NONE,
        }
    }
}

fn flag(caps: &Value, pointer: &str) -> bool {
    caps.pointer(pointer).and_then(Value::as_bool) == Some(true)
}

/// The ACP form of the session's MCP servers (`mcpServers`): stdio `{name, command, args,
/// env: [{name, value}]}` (no `type`: the baseline form), http / sse `{type, name, url,
/// headers: [{name, value}]}`. A transport the agent did not declare is refused (never left
/// out silently).
pub fn mcp_servers(servers: &[McpServer], caps: &AgentCaps) -> Result<Value, String> {
    let pairs = |list: Vec<(&str, &str)>| -> Value {
        list.into_iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect()
    };
    servers
        .iter()
        .map(|server| match server {
            McpServer::Stdio {
                name,
                command,
                args,
                env,
            } => Ok(json!({
                "name": name,
                "command": command,
                "args": args,
                "env": pairs(env.iter().map(|e| (e.name.as_str(), e.value.as_str())).collect()),
            })),
            McpServer::Http { name, url, headers } | McpServer::Sse { name, url, headers } => {
                let (kind, declared) = match server.transport() {
                    McpTransport::Http => ("http", caps.mcp_http),
                    _ => ("sse", caps.mcp_sse),
                };
                if !declared {
                    return Err(format!(
                        "the agent does not take {kind} MCP servers (its mcpCapabilities do \
                         not declare {kind}): {name:?}"
                    ));
                }
                Ok(json!({
                    "type": kind,
                    "name": name,
                    "url": url,
                    "headers": pairs(headers.iter().map(|h| (h.name.as_str(), h.value.as_str())).collect()),
                }))
            }
        })
        .collect::<Result<Vec<Value>, String>>()
        .map(Value::Array)
}

/// What the session's options put on `session/new`, `load`, `resume` and `fork`: the MCP
/// servers, and the standing prompt where the agent has a carrier for it
/// ([`Carriers::system_prompt`]). An option the agent cannot take: `Err`, why.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSetup {
    pub mcp_servers: Value,
    pub meta: Option<Value>,
}

impl Default for SessionSetup {
    fn default() -> Self {
        SessionSetup {
            mcp_servers: json!([]),
            meta: None,
        }
    }
}

impl SessionSetup {
    pub fn of(options: &SessionOptions, caps: &AgentCaps) -> Result<SessionSetup, String> {
        let mcp_servers = mcp_servers(&options.mcp_servers, caps)?;
        let meta = match options.system_prompt.as_deref() {
            None => None,
            Some(prompt) if caps.carriers().system_prompt => {
                Some(json!({"systemPrompt": {"append": prompt}}))
            }
            Some(_) => {
                return Err(format!(
                    "the agent {} has no carrier for a standing prompt (ACP declares none)",
                    caps.name.as_deref().unwrap_or("(unnamed)")
                ));
            }
        };
        Ok(SessionSetup { mcp_servers, meta })
    }
}

/// One single-value choice a session answer offers: its id (a `configOptions` id), the
/// current value and every value offered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Choice {
    pub config_id: Option<String>,
    pub current: Option<String>,
    pub values: Vec<String>,
}

/// What a session answer (`session/new`, `load`, `resume`, `fork`, `set_config_option`) says
/// can be chosen: the model (a `configOptions` select of category `model`, else the unstable
/// `models` {availableModels, currentModelId} of `session/set_model`) and the mode (`modes`
/// {currentModeId, availableModes}, else a `configOptions` select of category `mode`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionChoices {
    pub model: Option<Choice>,
    pub mode: Option<Choice>,
}

/// A `configOptions` select of `category`: its values, grouped or not.
fn config_select(result: &Value, category: &str) -> Option<Choice> {
    let option = result
        .get("configOptions")?
        .as_array()?
        .iter()
        .find(|o| str_of(o, "category") == category && str_of(o, "type") == "select")?;
    let mut values = Vec::new();
    for entry in option.get("options")?.as_array()? {
        match entry.get("options").and_then(Value::as_array) {
            Some(group) => values.extend(
                group
                    .iter()
                    .filter_map(|o| o.get("value").and_then(Value::as_str))
                    .map(str::to_owned),
            ),
            None => values.extend(
                entry
                    .get("value")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            ),
        }
    }
    Some(Choice {
        config_id: Some(str_of(option, "id").to_owned()).filter(|id| !id.is_empty()),
        current: option
            .get("currentValue")
            .and_then(Value::as_str)
            .map(str::to_owned),
        values,
    })
}

/// A list of `{<key>: id}` objects' ids.
fn ids(list: Option<&Value>, key: &str) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(|m| m.get(key).and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl SessionChoices {
    pub fn of(result: &Value) -> SessionChoices {
        let model = config_select(result, "model").or_else(|| {
            let models = result.get("models").filter(|m| m.is_object())?;
            Some(Choice {
                config_id: None,
                current: models
                    .get("currentModelId")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                values: ids(models.get("availableModels"), "modelId"),
            })
        });
        let mode = result
            .get("modes")
            .filter(|m| m.is_object())
            .map(|modes| Choice {
                config_id: None,
                current: modes
                    .get("currentModeId")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                values: ids(modes.get("availableModes"), "id"),
            })
            .or_else(|| config_select(result, "mode"));
        SessionChoices { model, mode }
    }

    /// Take what a later answer says (a `set_config_option` answer names every option).
    pub fn update(&mut self, result: &Value) {
        let later = SessionChoices::of(result);
        if later.model.is_some() {
            self.model = later.model;
        }
        if later.mode.is_some() {
            self.mode = later.mode;
        }
    }
}

/// The request choosing `model` for `session`: `session/set_config_option` on the model
/// select, else the unstable `session/set_model`. The agent resolves the name (claude-agent-acp
/// takes its aliases and near names, e.g. `opus` for `opus[1m]`), so a name not among the
/// values still goes to it; `Err`: the agent offers no model choice.
pub fn model_request(
    session: &str,
    choices: &SessionChoices,
    model: &str,
) -> Result<(&'static str, Value), String> {
    match &choices.model {
        Some(Choice {
            config_id: Some(id),
            ..
        }) => Ok((
            "session/set_config_option",
            json!({"sessionId": session, "configId": id, "value": model}),
        )),
        Some(_) => Ok((
            "session/set_model",
            json!({"sessionId": session, "modelId": model}),
        )),
        None => Err("the agent offers no model choice in its session".to_owned()),
    }
}

/// Why the agent did not take `model`, naming what it offers.
pub fn model_refused(model: &str, choices: &SessionChoices, why: &str) -> String {
    let offered = choices
        .model
        .as_ref()
        .map(|c| c.values.join(", "))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "none".to_owned());
    format!("the agent did not take the model {model:?} ({why}); it offers: {offered}")
}

/// The ACP mode id of a permission mode (claude-agent-acp's ids, which are Claude Code's
/// permission modes).
pub fn mode_id(mode: PermissionMode) -> &'static str {
    match mode {
        PermissionMode::Ask => "default",
        PermissionMode::AcceptEdits => "acceptEdits",
        PermissionMode::Bypass => "bypassPermissions",
    }
}

/// The request putting `session` in `mode`; `Ok(None)`: already in it (or `ask` where the
/// agent offers no `default` mode: asking is every agent's default). `Err`: the agent does not
/// offer it.
pub fn mode_request(
    session: &str,
    choices: &SessionChoices,
    mode: PermissionMode,
) -> Result<Option<(&'static str, Value)>, String> {
    let id = mode_id(mode);
    let Some(choice) = &choices.mode else {
        return if mode == PermissionMode::Ask {
            Ok(None)
        } else {
            Err(format!(
                "the agent offers no modes, so not {:?} (mode {id:?})",
                mode.as_str()
            ))
        };
    };
    if choice.current.as_deref() == Some(id) {
        return Ok(None);
    }
    if !choice.values.iter().any(|v| v == id) {
        // Asking is the agent's own default whatever it calls its modes.
        if mode == PermissionMode::Ask {
            return Ok(None);
        }
        return Err(format!(
            "the agent does not offer the permission mode {:?} (mode {id:?}) in this session; \
             it offers: {}",
            mode.as_str(),
            choice.values.join(", ")
        ));
    }
    Ok(Some(match &choice.config_id {
        Some(config) => (
            "session/set_config_option",
            json!({"sessionId": session, "configId": config, "value": id}),
        ),
        None => (
            "session/set_mode",
            json!({"sessionId": session, "modeId": id}),
        ),
    }))
}

/// An attachment in a prompt, in ACP content: an image `{type: "image", mimeType, data}`
/// (base64) where the agent declared images; a file, where it declared embedded context, as
/// an embedded `resource` with its text when it is UTF-8 text, else as a `resource_link` to the
/// host's copy (`file://` + its absolute path, with its name, MIME type and size), which the
/// agent opens with its own tools: claude-agent-acp drops embedded blobs (its `promptToClaude`
/// ignores them), so a blob would be lost silently. `Err`: the agent does not take this kind.
pub fn attachment_block(
    attachment: &Attachment,
    bytes: Vec<u8>,
    caps: &AgentCaps,
) -> Result<Value, String> {
    use base64::Engine;
    let uri = format!("file://{}", attachment.path.display());
    match attachment.kind {
        AttachmentKind::Image if caps.image => Ok(json!({
            "type": "image",
            "mimeType": attachment.mime,
            "data": base64::engine::general_purpose::STANDARD.encode(&bytes),
        })),
        AttachmentKind::Image => Err(format!(
            "the agent does not take images (its promptCapabilities do not declare image): {}",
            attachment.name
        )),
        AttachmentKind::File if caps.embedded_context => match String::from_utf8(bytes) {
            Ok(text) => Ok(json!({
                "type": "resource",
                "resource": {"uri": uri, "mimeType": attachment.mime, "text": text},
            })),
            Err(_) => Ok(json!({
                "type": "resource_link",
                "uri": uri,
                "name": attachment.name,
                "mimeType": attachment.mime,
                "size": attachment.bytes,
            })),
        },
        AttachmentKind::File => Err(format!(
            "the agent does not take files (its promptCapabilities do not declare \
             embeddedContext): {}",
            attachment.name
        )),
    }
}

/// Params of `session/new`, `session/load`, `session/resume`, `session/fork`, with what the
/// session's options put on each ([`SessionSetup`]).
pub fn session_params(session_id: Option<&str>, cwd: &str, setup: &SessionSetup) -> Value {
    let mut params = json!({"cwd": cwd, "mcpServers": setup.mcp_servers});
    if let Some(id) = session_id {
        params["sessionId"] = json!(id);
    }
    if let Some(meta) = &setup.meta {
        params["_meta"] = meta.clone();
    }
    params
}

/// `session/prompt` params: the text, then the attachments' blocks ([`attachment_block`]).
pub fn prompt_params(session_id: &str, text: &str, attachments: Vec<Value>) -> Value {
    let mut prompt = vec![json!({"type": "text", "text": text})];
    prompt.extend(attachments);
    json!({"sessionId": session_id, "prompt": prompt})
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
                imported: false,
            }));
        }
    }

    fn close_thinking(&mut self, out: &mut Vec<EventBody>) {
        if let Some(block) = self.thinking.take() {
            out.push(EventBody::ThinkingEnd(BlockEnd {
                truncated: None,
                item_id: Some(block.item_id),
                text: block.text,
                imported: false,
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
    use crate::protocol::options::{EnvVar, Header};

    /// claude-agent-acp 0.49.0's `initialize` answer (as recorded, less its auth methods).
    fn claude_agent_acp() -> AgentCaps {
        AgentCaps::from_initialize(&json!({
            "protocolVersion": 1,
            "agentCapabilities": {
                "_meta": {"claudeCode": {"promptQueueing": true}},
                "promptCapabilities": {"image": true, "embeddedContext": true},
                "mcpCapabilities": {"http": true, "sse": true},
                "loadSession": true,
                "sessionCapabilities": {"close": {}, "fork": {}, "list": {}, "resume": {}}
            },
            "agentInfo": {"name": CLAUDE_AGENT_ACP, "title": "Claude Agent", "version": "0.49.0"}
        }))
    }

    #[test]
    fn initialize_declares_prompt_and_mcp_capabilities_and_carriers_go_by_name() {
        let caps = claude_agent_acp();
        assert!(caps.image && caps.embedded_context && !caps.audio);
        assert!(caps.mcp_http && caps.mcp_sse);
        assert!(caps.carriers().model && caps.carriers().system_prompt);
        assert_eq!(caps.carriers().permission_modes.len(), 3);
        let plain = AgentCaps::from_initialize(&json!({
            "protocolVersion": 1,
            "agentCapabilities": {"promptCapabilities": {"image": false}},
            "agentInfo": {"name": "other-agent"}
        }));
        assert!(!plain.image && !plain.embedded_context && !plain.mcp_http && !plain.mcp_sse);
        assert_eq!(plain.carriers(), Carriers::NONE);
    }

    #[test]
    fn session_setup_carries_mcp_servers_and_the_standing_prompt() {
        let options = SessionOptions {
            system_prompt: Some("STANDING".to_owned()),
            mcp_servers: vec![
                McpServer::Stdio {
                    name: "probe".to_owned(),
                    command: "node".to_owned(),
                    args: vec!["/p.mjs".to_owned()],
                    env: vec![EnvVar {
                        name: "K".to_owned(),
                        value: "v".to_owned(),
                    }],
                },
                McpServer::Http {
                    name: "web".to_owned(),
                    url: "http://127.0.0.1:1/mcp".to_owned(),
                    headers: vec![Header {
                        name: "Authorization".to_owned(),
                        value: "Bearer x".to_owned(),
                    }],
                },
            ],
            ..SessionOptions::default()
        };
        let setup = SessionSetup::of(&options, &claude_agent_acp()).unwrap();
        let params = session_params(Some("s1"), "/w", &setup);
        assert_eq!(
            params,
            json!({
                "cwd": "/w",
                "sessionId": "s1",
                "mcpServers": [
                    {"name": "probe", "command": "node", "args": ["/p.mjs"],
                     "env": [{"name": "K", "value": "v"}]},
                    {"type": "http", "name": "web", "url": "http://127.0.0.1:1/mcp",
                     "headers": [{"name": "Authorization", "value": "Bearer x"}]}
                ],
                "_meta": {"systemPrompt": {"append": "STANDING"}}
            })
        );
        // Another agent: no carrier for the prompt, no http declared: refused, never dropped.
        let other = AgentCaps::default();
        let err = SessionSetup::of(&options, &other).unwrap_err();
        assert!(err.contains("http MCP servers"), "{err}");
        let prompt_only = SessionOptions {
            system_prompt: Some("S".to_owned()),
            ..SessionOptions::default()
        };
        let err = SessionSetup::of(&prompt_only, &other).unwrap_err();
        assert!(err.contains("standing prompt"), "{err}");
        let plain = SessionSetup::of(&SessionOptions::default(), &other).unwrap();
        assert_eq!(
            session_params(None, "/w", &plain),
            json!({"cwd": "/w", "mcpServers": []})
        );
    }

    #[test]
    fn models_and_modes_are_chosen_among_what_the_session_offers() {
        // claude-agent-acp's session/new answer: config options, and modes.
        let answer = json!({
            "sessionId": "s1",
            "modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "acceptEdits", "name": "Accept"},
                {"id": "plan", "name": "Plan"}]},
            "configOptions": [
                {"id": "mode", "category": "mode", "type": "select", "currentValue": "default",
                 "options": [{"value": "default", "name": "Default"}]},
                {"id": "model", "category": "model", "type": "select", "currentValue": "default",
                 "options": [{"value": "default", "name": "Default"}, {"value": "haiku", "name": "Haiku"}]}
            ]
        });
        let choices = SessionChoices::of(&answer);
        let model = choices.model.clone().unwrap();
        assert_eq!(model.config_id.as_deref(), Some("model"));
        assert_eq!(model.values, ["default", "haiku"]);
        assert_eq!(
            model_request("s1", &choices, "haiku").unwrap(),
            (
                "session/set_config_option",
                json!({"sessionId": "s1", "configId": "model", "value": "haiku"})
            )
        );
        let refused = model_refused("gpt-9", &choices, "Invalid value");
        assert!(refused.contains("default, haiku"), "{refused}");
        assert_eq!(
            mode_request("s1", &choices, PermissionMode::AcceptEdits).unwrap(),
            Some((
                "session/set_mode",
                json!({"sessionId": "s1", "modeId": "acceptEdits"})
            ))
        );
        assert_eq!(
            mode_request("s1", &choices, PermissionMode::Ask).unwrap(),
            None
        );
        let err = mode_request("s1", &choices, PermissionMode::Bypass).unwrap_err();
        assert!(
            err.contains("bypassPermissions") && err.contains("plan"),
            "{err}"
        );
        // The unstable `models` form: session/set_model; grouped config options flattened.
        let unstable = SessionChoices::of(&json!({
            "models": {"currentModelId": "a", "availableModels": [{"modelId": "a"}, {"modelId": "b"}]}
        }));
        assert_eq!(unstable.model.as_ref().unwrap().values, ["a", "b"]);
        assert_eq!(
            model_request("s1", &unstable, "b").unwrap().0,
            "session/set_model"
        );
        assert!(unstable.mode.is_none());
        assert_eq!(
            mode_request("s1", &unstable, PermissionMode::Ask).unwrap(),
            None
        );
        assert!(mode_request("s1", &unstable, PermissionMode::AcceptEdits).is_err());
        let grouped = SessionChoices::of(&json!({"configOptions": [
            {"id": "m", "category": "model", "type": "select", "currentValue": "x",
             "options": [{"group": "g", "name": "G", "options": [{"value": "x", "name": "X"}, {"value": "y", "name": "Y"}]}]}
        ]}));
        assert_eq!(grouped.model.unwrap().values, ["x", "y"]);
        assert!(model_request("s1", &SessionChoices::default(), "m").is_err());
        // A later answer (set_config_option's) updates what is current.
        let mut later = choices;
        later.update(&json!({"configOptions": [
            {"id": "model", "category": "model", "type": "select", "currentValue": "haiku",
             "options": [{"value": "default", "name": "D"}, {"value": "haiku", "name": "H"}]}
        ]}));
        assert_eq!(later.model.unwrap().current.as_deref(), Some("haiku"));
        assert!(later.mode.is_some());
    }

    #[test]
    fn attachments_become_acp_content_where_the_agent_declared_it() {
        let attachment = |kind, mime: &str| Attachment {
            name: "a.bin".to_owned(),
            mime: mime.to_owned(),
            kind,
            bytes: 3,
            sha256: String::new(),
            path: std::path::PathBuf::from("/home/h/attachments/a.bin"),
        };
        let caps = claude_agent_acp();
        let image = attachment_block(
            &attachment(AttachmentKind::Image, "image/png"),
            vec![1, 2, 3],
            &caps,
        )
        .unwrap();
        assert_eq!(
            image,
            json!({"type": "image", "mimeType": "image/png", "data": "AQID"})
        );
        let text = attachment_block(
            &attachment(AttachmentKind::File, "text/plain"),
            b"hi\n".to_vec(),
            &caps,
        )
        .unwrap();
        assert_eq!(
            text,
            json!({"type": "resource", "resource": {
                "uri": "file:///home/h/attachments/a.bin", "mimeType": "text/plain", "text": "hi\n"}})
        );
        let binary = attachment_block(
            &attachment(AttachmentKind::File, "application/octet-stream"),
            vec![0xff, 0xfe, 0],
            &caps,
        )
        .unwrap();
        assert_eq!(binary["type"], "resource_link");
        assert_eq!(binary["uri"], "file:///home/h/attachments/a.bin");
        assert_eq!(binary["name"], "a.bin");
        let none = AgentCaps::default();
        assert!(
            attachment_block(
                &attachment(AttachmentKind::Image, "image/png"),
                vec![],
                &none
            )
            .is_err()
        );
        assert!(
            attachment_block(
                &attachment(AttachmentKind::File, "text/plain"),
                vec![],
                &none
            )
            .is_err()
        );
        let prompt = prompt_params("s1", "look", vec![image]);
        assert_eq!(prompt["prompt"][0], json!({"type": "text", "text": "look"}));
        assert_eq!(prompt["prompt"][1]["type"], "image");
    }

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
