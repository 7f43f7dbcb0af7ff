//! The canonical event vocabulary (design §5): what every adapter produces and every client
//! renders. Pure data: no I/O, no tokio.
//!
//! An [`Event`] is a flat JSON object discriminated by `"k"`, with camelCase fields, carrying
//! `sessionId` and, inside a run, `runId`. Whether a kind is a durable *bracket* or a droppable
//! *delta* is decided in exactly one place, [`EventBody::class`].
//!
//! History readers must survive kinds this build does not know (a newer host wrote them, or a
//! later issue adds them): [`AnyEvent`] parses into [`AnyEvent::Unknown`] instead of failing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One canonical event. `body` is flattened, so the JSON is `{"k":…,"sessionId":…,…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(flatten)]
    pub body: EventBody,
}

/// Durable or droppable: see design §5 and [`EventBody::class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventClass {
    /// Persisted, gets a `sequence_id`, never dropped.
    Bracket,
    /// Streamed only, carries the latest bracket's `sequence_id`, droppable.
    Delta,
}

/// Terminal state of a run, carried by `run.end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Completed,
    Failed,
    Cancelled,
    Interrupted,
}

/// The shared error taxonomy of design §9. What each one means to a user is in the event
/// reference (`event_reference.rs`, rendered into `docs/protocol.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCategory {
    BinaryUnavailable,
    AuthRequired,
    RateLimited,
    /// The connection to the agent (or the agent's own to its model) was lost. When the host
    /// lost its agent before the prompt was handed over, the message says the prompt was not
    /// sent: sending it again is safe.
    TransportLost,
    ProtocolIncompatible,
    PermissionDenied,
    Cancelled,
    ResumeRejected,
    ContextExhausted,
    WorkspaceUnavailable,
    AgentFailed,
    /// The prompt was handed to the agent, and its process or the transport to it ended (or
    /// stopped answering) before the turn's result came: the host cannot know whether the
    /// agent acted on it. Never written when the prompt provably did not reach the agent
    /// (that is `transport_lost`), nor when the agent reported a failure itself.
    ResultDeliveryUnknown,
}

/// The kind-specific part of an event, tagged by `"k"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k")]
pub enum EventBody {
    // ---- brackets ----
    /// A run began: the agent was handed the prompt of this run.
    #[serde(rename = "run.start")]
    RunStart(RunStart),
    /// A run reached a terminal state; nothing of this run follows.
    #[serde(rename = "run.end")]
    RunEnd(RunEnd),
    /// The user's prompt for a run, published when the run is dispatched (not when queued).
    #[serde(rename = "user.text")]
    UserText(UserText),
    /// The agent opened a block of assistant text.
    #[serde(rename = "text.start")]
    TextStart(BlockStart),
    /// The agent closed a block of assistant text; `text` is the whole block.
    #[serde(rename = "text.end")]
    TextEnd(BlockEnd),
    /// The agent opened a block of visible reasoning.
    #[serde(rename = "thinking.start")]
    ThinkingStart(BlockStart),
    /// The reasoning block closed; `text` is the whole block.
    #[serde(rename = "thinking.end")]
    ThinkingEnd(BlockEnd),
    /// The agent started to emit a tool call (its input may still stream).
    #[serde(rename = "tool.call.start")]
    ToolCallStart(ToolCallStart),
    /// The tool call's input is complete.
    #[serde(rename = "tool.call.end")]
    ToolCallEnd(ToolCallEnd),
    /// The tool began executing.
    #[serde(rename = "tool.exec.start")]
    ToolExecStart(ToolExecStart),
    /// The tool finished; `output` is its final output.
    #[serde(rename = "tool.exec.end")]
    ToolExecEnd(ToolExecEnd),
    /// The agent asks a human to allow or deny something.
    #[serde(rename = "permission.request")]
    PermissionRequest(PermissionRequest),
    /// A permission request stopped being pending: a client answered it, the agent withdrew it,
    /// or the host expired it.
    #[serde(rename = "permission.resolved")]
    PermissionResolved(PermissionResolved),
    /// Token usage reported by the agent, usually once per run.
    #[serde(rename = "usage")]
    Usage(Usage),
    /// The agent revealed its native session id; saved the moment it is seen.
    #[serde(rename = "session.bound")]
    SessionBound(SessionBound),
    /// This session was forked from another (design §8).
    #[serde(rename = "session.forked")]
    SessionForked(SessionForked),
    /// The session's configuration changed (`session.set_model`, or a resume that found the
    /// model, standing prompt or provider changed): what changed and how the agent takes it.
    #[serde(rename = "session.configured")]
    SessionConfigured(SessionConfigured),
    /// The session's state changed (`idle`, `running`, `waiting` for a person), so a client can
    /// badge it without polling.
    #[serde(rename = "session.state")]
    SessionState(SessionStateChange),
    /// The session's follow-up queue changed (a prompt queued, edited, moved, removed, dropped,
    /// dispatched, restored after a restart): the whole queue after the change, so a client
    /// shows it without polling. Its `runId` is the run the change concerns (none for a
    /// `cleared` queue or a `restored` one).
    #[serde(rename = "queue.changed")]
    QueueChanged(QueueChange),
    /// Something the user should see that did not stop the run.
    #[serde(rename = "warning")]
    Warning(Notice),
    /// An error the user should see; a failing run still ends with `run.end`.
    #[serde(rename = "error")]
    Error(ErrorNotice),

    // ---- deltas ----
    /// A piece of assistant text inside an open text block.
    #[serde(rename = "text.delta")]
    TextDelta(TextDelta),
    /// A piece of reasoning inside an open thinking block.
    #[serde(rename = "thinking.delta")]
    ThinkingDelta(TextDelta),
    /// A piece of a tool call's input as it streams.
    #[serde(rename = "tool.call.delta")]
    ToolCallDelta(ToolCallDelta),
    /// Progress output of an executing tool.
    #[serde(rename = "tool.exec.update")]
    ToolExecUpdate(ToolExecUpdate),
    /// A piece of an artifact (file, diff, image) being produced.
    #[serde(rename = "artifact.delta")]
    ArtifactDelta(ArtifactDelta),
}

/// The start of `text`, at most `max` bytes, cut at a character boundary.
fn head(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl EventBody {
    /// This event cut to fit in `max` bytes of canonical JSON, for a block end whose text,
    /// output or input is what makes it too large; `None` for any other kind (or if even an
    /// empty text would not fit). `size` is the event's current JSON size.
    pub fn truncated_to(&self, size: usize, max: usize) -> Option<EventBody> {
        // The same share of the field as of the whole (escapes grow a text evenly), less room
        // for the `truncated` object; halved on each try that still does not fit.
        let keep = |len: usize, attempt: u32| -> usize {
            let share = len as u128 * max.saturating_sub(1024) as u128 / size.max(1) as u128;
            usize::try_from(share).unwrap_or(len) >> attempt
        };
        for attempt in 0..16 {
            let fitted = match self {
                EventBody::TextEnd(b) | EventBody::ThinkingEnd(b) => {
                    let kept = head(&b.text, keep(b.text.len(), attempt));
                    let end = BlockEnd {
                        item_id: b.item_id.clone(),
                        text: kept.to_owned(),
                        truncated: Some(Truncated {
                            full_bytes: b.text.len() as u64,
                            kept_bytes: kept.len() as u64,
                        }),
                        imported: b.imported,
                    };
                    match self {
                        EventBody::TextEnd(_) => EventBody::TextEnd(end),
                        _ => EventBody::ThinkingEnd(end),
                    }
                }
                EventBody::ToolExecEnd(t) => {
                    let kept = head(&t.output, keep(t.output.len(), attempt));
                    EventBody::ToolExecEnd(ToolExecEnd {
                        output: kept.to_owned(),
                        truncated: Some(Truncated {
                            full_bytes: t.output.len() as u64,
                            kept_bytes: kept.len() as u64,
                        }),
                        ..t.clone()
                    })
                }
                EventBody::ToolCallEnd(t) => {
                    let json = t.input.to_string();
                    let kept = head(&json, keep(json.len(), attempt));
                    EventBody::ToolCallEnd(ToolCallEnd {
                        call_id: t.call_id.clone(),
                        name: t.name.clone(),
                        input: Value::String(kept.to_owned()),
                        truncated: Some(Truncated {
                            full_bytes: json.len() as u64,
                            kept_bytes: kept.len() as u64,
                        }),
                    })
                }
                _ => return None,
            };
            let fits = serde_json::to_string(&fitted).is_ok_and(|j| j.len() + 256 < max);
            if fits {
                return Some(fitted);
            }
        }
        None
    }

    /// The single place that decides bracket vs delta. Exhaustive on purpose: a new kind must
    /// be classified here before it compiles.
    pub fn class(&self) -> EventClass {
        match self {
            EventBody::RunStart(_)
            | EventBody::RunEnd(_)
            | EventBody::UserText(_)
            | EventBody::TextStart(_)
            | EventBody::TextEnd(_)
            | EventBody::ThinkingStart(_)
            | EventBody::ThinkingEnd(_)
            | EventBody::ToolCallStart(_)
            | EventBody::ToolCallEnd(_)
            | EventBody::ToolExecStart(_)
            | EventBody::ToolExecEnd(_)
            | EventBody::PermissionRequest(_)
            | EventBody::PermissionResolved(_)
            | EventBody::Usage(_)
            | EventBody::SessionBound(_)
            | EventBody::SessionForked(_)
            | EventBody::SessionConfigured(_)
            | EventBody::SessionState(_)
            | EventBody::QueueChanged(_)
            | EventBody::Warning(_)
            | EventBody::Error(_) => EventClass::Bracket,
            EventBody::TextDelta(_)
            | EventBody::ThinkingDelta(_)
            | EventBody::ToolCallDelta(_)
            | EventBody::ToolExecUpdate(_)
            | EventBody::ArtifactDelta(_) => EventClass::Delta,
        }
    }

    /// The `"k"` discriminator of this body.
    pub fn kind(&self) -> &'static str {
        match self {
            EventBody::RunStart(_) => "run.start",
            EventBody::RunEnd(_) => "run.end",
            EventBody::UserText(_) => "user.text",
            EventBody::TextStart(_) => "text.start",
            EventBody::TextEnd(_) => "text.end",
            EventBody::ThinkingStart(_) => "thinking.start",
            EventBody::ThinkingEnd(_) => "thinking.end",
            EventBody::ToolCallStart(_) => "tool.call.start",
            EventBody::ToolCallEnd(_) => "tool.call.end",
            EventBody::ToolExecStart(_) => "tool.exec.start",
            EventBody::ToolExecEnd(_) => "tool.exec.end",
            EventBody::PermissionRequest(_) => "permission.request",
            EventBody::PermissionResolved(_) => "permission.resolved",
            EventBody::Usage(_) => "usage",
            EventBody::SessionBound(_) => "session.bound",
            EventBody::SessionForked(_) => "session.forked",
            EventBody::SessionConfigured(_) => "session.configured",
            EventBody::SessionState(_) => "session.state",
            EventBody::QueueChanged(_) => "queue.changed",
            EventBody::Warning(_) => "warning",
            EventBody::Error(_) => "error",
            EventBody::TextDelta(_) => "text.delta",
            EventBody::ThinkingDelta(_) => "thinking.delta",
            EventBody::ToolCallDelta(_) => "tool.call.delta",
            EventBody::ToolExecUpdate(_) => "tool.exec.update",
            EventBody::ArtifactDelta(_) => "artifact.delta",
        }
    }
}

impl Event {
    pub fn new(session_id: impl Into<String>, run_id: Option<String>, body: EventBody) -> Self {
        Event {
            session_id: session_id.into(),
            run_id,
            body,
        }
    }

    pub fn class(&self) -> EventClass {
        self.body.class()
    }

    pub fn is_bracket(&self) -> bool {
        self.class() == EventClass::Bracket
    }

    pub fn kind(&self) -> &'static str {
        self.body.kind()
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStart {
    /// The agent family or registered agent name running this turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEnd {
    pub state: RunState,
    /// Present when `state` is `failed` or `cancelled` (an `interrupted` run has none: the
    /// host, not the agent, ended it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<ErrorCategory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserText {
    pub text: String,
    /// The client's idempotency key for the prompt, if it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_msg_id: Option<String>,
    /// The prompt was injected into the run's turn while it ran (`session.steer`), not
    /// started as a run of its own. Absent (false) for a run's own prompt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub steer: bool,
    /// Who sent it: the transport, and for a loopback client its subscriber and label.
    /// Absent in events of hosts that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<PromptFrom>,
    /// A prompt of the agent's own conversation from before the session was imported (read
    /// from the agent's files at `session.import`), not one sent through the host. Absent
    /// (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imported: bool,
    /// The prompt's attachments (`session.send` `attachments`), as the host checked and copied
    /// them: never their bytes or the host's path. Absent when it had none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::protocol::options::AttachmentInfo>,
}

/// Who sent a prompt (`user.text`, a queued prompt of `session.get` and `queue.changed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptFrom {
    pub via: PromptVia,
    /// The subscriber that sent it: a loopback one (`ws`), or a paired bot's `bot-<bot_id>`
    /// (`relay`, through the sealed fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriber_id: Option<String>,
    /// The label that subscriber was registered with (`subscriber.add` `client`: `web` for
    /// the browser page, `follow` for the terminal follower, or an app's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// The transport a prompt came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptVia {
    /// The Unix socket: a terminal command.
    Ipc,
    /// A loopback WebSocket client.
    Ws,
    /// The relay (a bot).
    Relay,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockStart {
    /// Identifies the block so its deltas and end can be matched to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockEnd {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// The whole text of the block, so history needs no deltas (unless `truncated`).
    pub text: String,
    /// Present when the block was too large for one event and `text` holds only its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
    /// Text of the agent's own conversation from before the session was imported (read from
    /// the agent's files at `session.import`). Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imported: bool,
}

/// A block end too large for one event (the bus takes at most 4 MiB): its text, output or
/// input was cut to fit, so the block is still closed and a renderer never waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Truncated {
    /// Bytes (UTF-8) of the whole original text, output or input JSON.
    pub full_bytes: u64,
    /// Bytes of it that the event holds.
    pub kept_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TextDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallStart {
    pub call_id: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallEnd {
    pub call_id: String,
    pub name: String,
    /// The complete tool input (when `truncated`: the start of its JSON text, as a string).
    #[serde(default)]
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallDelta {
    pub call_id: String,
    /// A fragment of the input JSON as the model streams it.
    pub delta: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolExecStart {
    pub call_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolExecUpdate {
    pub call_id: String,
    pub output: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolExecEnd {
    pub call_id: String,
    /// The tool's final output.
    pub output: String,
    #[serde(default)]
    pub is_error: bool,
    /// The exit code, for a command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Present when the output was too large for one event and `output` holds only its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionRequest {
    pub request_id: String,
    pub tool: String,
    #[serde(default)]
    pub input: Value,
    /// The choices the agent itself offers, in its order (allow once, allow always with the
    /// rule it would keep, deny, …); `permission.respond` names one by `option_id`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<PermissionOption>,
}

/// What choosing a [`PermissionOption`] does (ACP's option kinds, which every family maps to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionOptionKind {
    AllowOnce,
    /// Allow, and the agent keeps a rule so that matching calls stop asking.
    AllowAlways,
    RejectOnce,
    RejectAlways,
}

impl PermissionOptionKind {
    pub fn allows(self) -> bool {
        matches!(
            self,
            PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PermissionOptionKind::AllowOnce => "allow_once",
            PermissionOptionKind::AllowAlways => "allow_always",
            PermissionOptionKind::RejectOnce => "reject_once",
            PermissionOptionKind::RejectAlways => "reject_always",
        }
    }
}

/// One choice an agent offers for a permission request: `{"id","label","kind"}`, plus, for an
/// option that keeps a rule, `rule`: that rule in words ("always allow Bash(npm test) in this
/// session").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "OptionOnWire")]
pub struct PermissionOption {
    /// The agent's own id for the choice (ACP `optionId`, Codex decision), opaque to clients.
    pub id: String,
    pub label: String,
    pub kind: PermissionOptionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

impl PermissionOption {
    pub fn new(id: &str, label: &str, kind: PermissionOptionKind) -> Self {
        PermissionOption {
            id: id.to_owned(),
            label: label.to_owned(),
            kind,
            rule: None,
        }
    }

    /// An option that keeps a rule, described by `rule`.
    pub fn always(id: &str, label: &str, rule: String) -> Self {
        PermissionOption {
            rule: Some(rule),
            ..PermissionOption::new(id, label, PermissionOptionKind::AllowAlways)
        }
    }

    /// The plain allow-once / deny pair, for an agent that offers nothing else.
    pub fn allow_deny() -> Vec<PermissionOption> {
        vec![
            PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new("deny", "Deny", PermissionOptionKind::RejectOnce),
        ]
    }
}

/// An option as history holds it: an object, or a bare id (what builds before options had
/// kinds wrote: `"allow"`, `"deny"`, `"allow_always"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OptionOnWire {
    Full {
        id: String,
        #[serde(default)]
        label: String,
        kind: PermissionOptionKind,
        #[serde(default)]
        rule: Option<String>,
    },
    Bare(String),
}

impl From<OptionOnWire> for PermissionOption {
    fn from(wire: OptionOnWire) -> Self {
        match wire {
            OptionOnWire::Full {
                id,
                label,
                kind,
                rule,
            } => PermissionOption {
                label: if label.is_empty() { id.clone() } else { label },
                id,
                kind,
                rule,
            },
            OptionOnWire::Bare(id) => {
                let kind = match id.as_str() {
                    "allow_always" => PermissionOptionKind::AllowAlways,
                    "reject_always" => PermissionOptionKind::RejectAlways,
                    i if i.starts_with("deny") || i.starts_with("reject") => {
                        PermissionOptionKind::RejectOnce
                    }
                    _ => PermissionOptionKind::AllowOnce,
                };
                PermissionOption::new(&id, &id, kind)
            }
        }
    }
}

/// A bare id, as older history holds it: `allow` / `deny` / `allow_always` by their names, any
/// other id allows once unless it starts with `deny` or `reject`.
impl From<&str> for PermissionOption {
    fn from(id: &str) -> Self {
        OptionOnWire::Bare(id.to_owned()).into()
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionResolved {
    pub request_id: String,
    /// `allow` or `deny` for an answer (whichever option it chose); `withdrawn` (by the
    /// agent), `expired` (by the host).
    pub decision: String,
    /// Who resolved it: the answering subscriber's id (`ipc` for the terminal, `relay` for the
    /// relay), `agent` (withdrawn) or `host` (expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The agent's option the answer chose (an answer only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<PermissionOptionKind>,
    /// The rule the answer made the agent keep (an `allow_always` option), in words; it is
    /// listed in `session.get`'s `permission_rules` from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionBound {
    pub native_session_id: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStateChange {
    pub state: super::states::SessionState,
    pub previous: super::states::SessionState,
}

/// Why a session's queue changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueReason {
    /// A prompt sent to a busy session was queued at the end.
    #[default]
    Added,
    /// `queue.edit` changed a queued prompt's text.
    Edited,
    /// `queue.move` moved a queued prompt.
    Moved,
    /// A queued prompt was taken out (`queue.remove`, `session.cancel` of a queued run).
    Removed,
    /// `queue.clear` took every queued prompt out.
    Cleared,
    /// The queue was over its capacity: its oldest prompt was dropped.
    Dropped,
    /// The head of the queue started (after its `run.start`).
    Dispatched,
    /// A host that started again queued what the last one left queued.
    Restored,
    /// A `session.steer` the agent could not take went to the head of the queue.
    Steered,
}

/// `queue.changed`: why, and the whole queue after the change, head first.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueChange {
    pub reason: QueueReason,
    pub queue: Vec<QueueItem>,
}

/// One queued prompt of a `queue.changed`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueItem {
    /// The run the prompt becomes (`session.send`'s answer).
    pub run_id: String,
    /// The prompt's text (only its start when `truncated`).
    pub text: String,
    /// The texts of a long queue were too large for one event: this one holds only its start
    /// (`session.get` has the whole text).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Who sent it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<PromptFrom>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionForked {
    pub parent_session_id: String,
    /// The session the conversation continues in (published on both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_session_id: Option<String>,
    /// The agent's session that was forked (an automatic fork keeps the host session and
    /// moves it to a fork of this native session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_native_session_id: Option<String>,
    /// Why the host forked instead of resuming (foreign writer, changed file, never owned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A `session.configured`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionConfigured {
    pub reason: ConfigReason,
    /// What changed: `model`, `system_prompt`, `options` (MCP servers and permission mode,
    /// compared as one), `provider`.
    pub changed: Vec<String>,
    /// The model from now on, when it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// How the agent takes the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<Applied>,
    pub message: String,
}

/// Why a session's configuration changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigReason {
    /// As it was created.
    Created,
    /// `session.set_model`.
    SetModel,
    /// A resume found the model, standing prompt or options changed since the binding was
    /// recorded: applied as a new configuration.
    Reconfigured,
    /// A resume found the provider account changed: the session continues in a fork.
    ProviderChanged,
}

/// How an agent takes a configuration change (`session.set_model`'s `applied`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    /// The live agent took it at once.
    Live,
    /// The next turn carries it (or the next agent opened for the session).
    NextTurn,
    /// The agent is restarted (its session resumed) so that its next turn has it: at once when
    /// it is idle, else right after the running turn.
    Restart,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// A stable machine-readable code, e.g. `followup_dropped`.
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorNotice {
    pub category: ErrorCategory,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactDelta {
    pub artifact_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    pub data: String,
}

/// An event read back from history or from a peer, which may be of a kind this build does not
/// know. Unknown kinds keep their raw JSON so they can be passed on untouched.
#[derive(Debug, Clone, PartialEq)]
pub enum AnyEvent {
    Known(Event),
    Unknown { k: String, raw: Value },
}

/// Why a JSON value is not an event at all (as opposed to an event of an unknown kind).
#[derive(Debug, thiserror::Error)]
pub enum EventParseError {
    #[error("event JSON is not an object with a string \"k\"")]
    NoKind,
    #[error("event of kind {kind:?} is malformed: {source}")]
    Malformed {
        kind: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Every kind this build knows, in declaration order.
pub const KNOWN_KINDS: &[&str] = &[
    "run.start",
    "run.end",
    "user.text",
    "text.start",
    "text.end",
    "thinking.start",
    "thinking.end",
    "tool.call.start",
    "tool.call.end",
    "tool.exec.start",
    "tool.exec.end",
    "permission.request",
    "permission.resolved",
    "usage",
    "session.bound",
    "session.forked",
    "session.configured",
    "session.state",
    "queue.changed",
    "warning",
    "error",
    "text.delta",
    "thinking.delta",
    "tool.call.delta",
    "tool.exec.update",
    "artifact.delta",
];

impl AnyEvent {
    /// Parse a JSON value; a well-formed object of an unknown kind is `Unknown`, not an error.
    pub fn from_value(value: Value) -> Result<AnyEvent, EventParseError> {
        let kind = value
            .get("k")
            .and_then(Value::as_str)
            .ok_or(EventParseError::NoKind)?
            .to_owned();
        if !KNOWN_KINDS.contains(&kind.as_str()) {
            return Ok(AnyEvent::Unknown {
                k: kind,
                raw: value,
            });
        }
        serde_json::from_value(value)
            .map(AnyEvent::Known)
            .map_err(|source| EventParseError::Malformed { kind, source })
    }

    pub fn from_json(text: &str) -> Result<AnyEvent, EventParseError> {
        let value: Value =
            serde_json::from_str(text).map_err(|source| EventParseError::Malformed {
                kind: String::new(),
                source,
            })?;
        AnyEvent::from_value(value)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_block_end_over_the_limit_is_cut_to_fit_and_says_so() {
        let max = 4 * 1024 * 1024;
        // Control characters grow sixfold when escaped: the cut must still fit.
        for filler in ["x", "\u{1}", "é"] {
            let text = filler.repeat(5 * 1024 * 1024 / filler.len());
            let body = EventBody::TextEnd(BlockEnd {
                item_id: Some("i".into()),
                text: text.clone(),
                truncated: None,
                imported: false,
            });
            let size = serde_json::to_string(&body).unwrap().len();
            let EventBody::TextEnd(cut) = body.truncated_to(size, max).unwrap() else {
                panic!("not a text.end");
            };
            assert!(
                serde_json::to_string(&EventBody::TextEnd(cut.clone()))
                    .unwrap()
                    .len()
                    < max
            );
            let t = cut.truncated.unwrap();
            assert_eq!(t.full_bytes, text.len() as u64);
            assert_eq!(t.kept_bytes, cut.text.len() as u64);
            assert!(text.starts_with(&cut.text) && !cut.text.is_empty());
        }
        let input = serde_json::json!({"content": "y".repeat(5 * 1024 * 1024)});
        let call = EventBody::ToolCallEnd(ToolCallEnd {
            call_id: "c".into(),
            name: "Write".into(),
            input,
            truncated: None,
        });
        let size = serde_json::to_string(&call).unwrap().len();
        let EventBody::ToolCallEnd(cut) = call.truncated_to(size, max).unwrap() else {
            panic!("not a tool.call.end");
        };
        assert!(
            cut.input
                .as_str()
                .unwrap()
                .starts_with("{\"content\":\"yyy")
        );
        assert!(cut.truncated.is_some());
        // Kinds without a text to cut are not cut.
        let user = EventBody::UserText(UserText {
            text: "z".repeat(10),
            client_msg_id: None,
            steer: false,
            from: None,
            imported: false,
            attachments: Vec::new(),
        });
        assert!(user.truncated_to(5 * max, max).is_none());
    }

    /// A `thinking.end` over the limit is cut as a `text.end` is: still a `thinking.end`,
    /// fitting, with its item id, the start of the text, and the full and kept sizes. (A
    /// small limit: the arithmetic is the same as at 4 MiB, at a fraction of the time.)
    #[test]
    fn a_thinking_end_over_the_limit_is_cut_to_fit_and_stays_a_thinking_end() {
        let max = 64 * 1024;
        for filler in ["t", "\u{1b}", "思"] {
            let text = filler.repeat(80 * 1024 / filler.len());
            let body = EventBody::ThinkingEnd(BlockEnd {
                item_id: Some("th-1".into()),
                text: text.clone(),
                truncated: None,
                imported: false,
            });
            let size = serde_json::to_string(&body).unwrap().len();
            assert!(size > max);
            let cut = body.truncated_to(size, max).unwrap();
            assert!(
                serde_json::to_string(&cut).unwrap().len() < max,
                "{filler:?}"
            );
            let EventBody::ThinkingEnd(cut) = cut else {
                panic!("{filler:?}: not a thinking.end: {}", cut.kind());
            };
            assert_eq!(cut.item_id.as_deref(), Some("th-1"));
            let t = cut.truncated.unwrap();
            assert_eq!(t.full_bytes, text.len() as u64);
            assert_eq!(t.kept_bytes, cut.text.len() as u64);
            assert!(text.starts_with(&cut.text), "{filler:?}");
            // Most of what fits is kept (not a token start).
            assert!(
                cut.text.len() > max / 12,
                "{filler:?}: kept {}",
                cut.text.len()
            );
        }
    }

    /// A `tool.exec.end` over the limit keeps its call, its error flag and exit code, and the
    /// start of its output, marked `truncated`; it fits (a small limit, as above).
    #[test]
    fn a_tool_exec_end_over_the_limit_is_cut_to_fit_and_keeps_its_outcome() {
        let max = 64 * 1024;
        for filler in ["o", "\n", "é"] {
            let output = filler.repeat(80 * 1024 / filler.len());
            let body = EventBody::ToolExecEnd(ToolExecEnd {
                call_id: "call-9".into(),
                output: output.clone(),
                is_error: true,
                exit_code: Some(2),
                truncated: None,
            });
            let size = serde_json::to_string(&body).unwrap().len();
            assert!(size > max);
            let cut = body.truncated_to(size, max).unwrap();
            assert!(
                serde_json::to_string(&cut).unwrap().len() < max,
                "{filler:?}"
            );
            let EventBody::ToolExecEnd(cut) = cut else {
                panic!("{filler:?}: not a tool.exec.end: {}", cut.kind());
            };
            assert_eq!(
                (cut.call_id.as_str(), cut.is_error, cut.exit_code),
                ("call-9", true, Some(2))
            );
            let t = cut.truncated.unwrap();
            assert_eq!(t.full_bytes, output.len() as u64);
            assert_eq!(t.kept_bytes, cut.output.len() as u64);
            assert!(output.starts_with(&cut.output), "{filler:?}");
            assert!(
                cut.output.len() > max / 12,
                "{filler:?}: kept {}",
                cut.output.len()
            );
        }
    }

    use super::*;
    use serde_json::json;

    fn samples() -> Vec<Event> {
        let s = "s1".to_owned();
        let r = Some("r1".to_owned());
        let bodies = vec![
            EventBody::RunStart(RunStart {
                agent: Some("claude".into()),
                model: None,
            }),
            EventBody::RunEnd(RunEnd {
                state: RunState::Failed,
                category: Some(ErrorCategory::RateLimited),
                message: Some("slow down".into()),
            }),
            EventBody::UserText(UserText {
                text: "hi".into(),
                client_msg_id: Some("c1".into()),
                steer: true,
                from: Some(PromptFrom {
                    via: PromptVia::Ws,
                    subscriber_id: Some("sub-1".into()),
                    client: Some("web".into()),
                }),
                imported: false,
                attachments: Vec::new(),
            }),
            EventBody::TextStart(BlockStart::default()),
            EventBody::TextEnd(BlockEnd {
                truncated: None,
                item_id: None,
                text: "hello".into(),
                imported: false,
            }),
            EventBody::ThinkingStart(BlockStart::default()),
            EventBody::ThinkingEnd(BlockEnd::default()),
            EventBody::ToolCallStart(ToolCallStart {
                call_id: "t".into(),
                name: "Bash".into(),
            }),
            EventBody::ToolCallEnd(ToolCallEnd {
                truncated: None,
                call_id: "t".into(),
                name: "Bash".into(),
                input: json!({"command": "ls"}),
            }),
            EventBody::ToolExecStart(ToolExecStart::default()),
            EventBody::ToolExecEnd(ToolExecEnd {
                truncated: None,
                call_id: "t".into(),
                output: "a\nb".into(),
                is_error: false,
                exit_code: Some(0),
            }),
            EventBody::PermissionRequest(PermissionRequest {
                request_id: "p".into(),
                tool: "Bash".into(),
                input: json!({}),
                options: PermissionOption::allow_deny(),
            }),
            EventBody::PermissionResolved(PermissionResolved::default()),
            EventBody::Usage(Usage {
                input_tokens: 3,
                output_tokens: 4,
                cached_input_tokens: None,
                cost_usd: Some(0.5),
            }),
            EventBody::SessionBound(SessionBound {
                native_session_id: "n".into(),
            }),
            EventBody::SessionForked(SessionForked::default()),
            EventBody::SessionConfigured(SessionConfigured {
                reason: ConfigReason::SetModel,
                changed: vec!["model".into()],
                model: Some("m2".into()),
                applied: Some(Applied::NextTurn),
                message: "the next turn uses m2".into(),
            }),
            EventBody::SessionState(SessionStateChange {
                state: crate::protocol::states::SessionState::Waiting,
                previous: crate::protocol::states::SessionState::Running,
            }),
            EventBody::QueueChanged(QueueChange {
                reason: QueueReason::Moved,
                queue: vec![QueueItem {
                    run_id: "r2".into(),
                    text: "next".into(),
                    truncated: false,
                    from: None,
                }],
            }),
            EventBody::Warning(Notice::default()),
            EventBody::Error(ErrorNotice {
                category: ErrorCategory::AgentFailed,
                message: "boom".into(),
            }),
            EventBody::TextDelta(TextDelta::default()),
            EventBody::ThinkingDelta(TextDelta::default()),
            EventBody::ToolCallDelta(ToolCallDelta::default()),
            EventBody::ToolExecUpdate(ToolExecUpdate::default()),
            EventBody::ArtifactDelta(ArtifactDelta::default()),
        ];
        bodies
            .into_iter()
            .map(|b| Event::new(s.clone(), r.clone(), b))
            .collect()
    }

    #[test]
    fn every_kind_round_trips_and_is_listed() {
        let events = samples();
        assert_eq!(events.len(), KNOWN_KINDS.len());
        for (event, kind) in events.iter().zip(KNOWN_KINDS) {
            let text = serde_json::to_string(event).unwrap();
            let value: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(value["k"], *kind, "{text}");
            assert_eq!(event.kind(), *kind);
            assert_eq!(value["sessionId"], "s1");
            assert_eq!(value["runId"], "r1");
            let back: Event = serde_json::from_str(&text).unwrap();
            assert_eq!(&back, event);
            assert_eq!(AnyEvent::from_json(&text).unwrap(), AnyEvent::Known(back));
        }
    }

    /// `user.text` says who sent it in camelCase, leaves `from` out when unknown, and a
    /// stored event of an older host (no `from`) still reads.
    #[test]
    fn user_text_carries_its_sender_and_old_ones_still_read() {
        let old = r#"{"k":"user.text","sessionId":"s","runId":"r","text":"hi","clientMsgId":"c"}"#;
        let AnyEvent::Known(event) = AnyEvent::from_json(old).unwrap() else {
            panic!("not known");
        };
        let EventBody::UserText(user) = &event.body else {
            panic!("not user.text");
        };
        assert_eq!(user.from, None);
        assert!(!serde_json::to_string(&event).unwrap().contains("from"));
        let from = PromptFrom {
            via: PromptVia::Ws,
            subscriber_id: Some("sub".into()),
            client: Some("follow".into()),
        };
        assert_eq!(
            serde_json::to_value(&from).unwrap(),
            json!({"via": "ws", "subscriberId": "sub", "client": "follow"})
        );
        let ipc = PromptFrom {
            via: PromptVia::Ipc,
            subscriber_id: None,
            client: None,
        };
        assert_eq!(serde_json::to_value(&ipc).unwrap(), json!({"via": "ipc"}));
        let relay: PromptFrom = serde_json::from_value(json!({"via": "relay"})).unwrap();
        assert_eq!(relay.via, PromptVia::Relay);
    }

    #[test]
    fn exactly_five_delta_kinds() {
        let deltas: Vec<_> = samples()
            .into_iter()
            .filter(|e| e.class() == EventClass::Delta)
            .map(|e| e.kind())
            .collect();
        assert_eq!(
            deltas,
            [
                "text.delta",
                "thinking.delta",
                "tool.call.delta",
                "tool.exec.update",
                "artifact.delta"
            ]
        );
    }

    #[test]
    fn fields_are_camel_case_and_flat() {
        let e = Event::new(
            "s",
            None,
            EventBody::ToolExecEnd(ToolExecEnd {
                truncated: None,
                call_id: "c".into(),
                output: "o".into(),
                is_error: true,
                exit_code: None,
            }),
        );
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v,
            json!({"k":"tool.exec.end","sessionId":"s","callId":"c","output":"o","isError":true})
        );
    }

    #[test]
    fn unknown_kind_is_kept_not_fatal() {
        let raw = json!({"k": "hologram.start", "sessionId": "s", "beam": 3});
        match AnyEvent::from_value(raw.clone()).unwrap() {
            AnyEvent::Unknown { k, raw: kept } => {
                assert_eq!(k, "hologram.start");
                assert_eq!(kept, raw);
            }
            other => panic!("expected unknown, got {other:?}"),
        }
    }

    /// Options are `{id,label,kind}` objects; history written before they had kinds holds bare
    /// ids, which still parse.
    #[test]
    fn permission_options_parse_old_and_new_shapes() {
        let request: PermissionRequest = serde_json::from_value(json!({
            "requestId": "p", "tool": "Bash",
            "options": ["allow", "deny", "allow_always",
                        {"id": "acceptForSession", "label": "Allow for this session",
                         "kind": "allow_always", "rule": "always allow `ls` in this session"}]
        }))
        .unwrap();
        let kinds: Vec<_> = request.options.iter().map(|o| o.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["allow_once", "reject_once", "allow_always", "allow_always"]
        );
        assert_eq!(request.options[1].label, "deny");
        let back = serde_json::to_value(&request.options[3]).unwrap();
        assert_eq!(
            back,
            json!({"id": "acceptForSession", "label": "Allow for this session",
                   "kind": "allow_always", "rule": "always allow `ls` in this session"})
        );
        assert_eq!(
            serde_json::to_value(&PermissionOption::allow_deny()[0]).unwrap(),
            json!({"id": "allow", "label": "Allow", "kind": "allow_once"})
        );
    }

    #[test]
    fn not_an_event_and_malformed_known_kind_are_errors() {
        assert!(matches!(
            AnyEvent::from_value(json!([1, 2])),
            Err(EventParseError::NoKind)
        ));
        assert!(matches!(
            AnyEvent::from_value(json!({"k": "text.end", "sessionId": "s"})),
            Err(EventParseError::Malformed { .. })
        ));
    }
}
