//! The event reference for users of the wire: one row per event kind — its class, when it is
//! emitted, its fields with their JSON types, and an example — rendered into the "Event
//! reference" section of `docs/protocol.md`. Pure data plus a renderer.
//!
//! The tests hold the table to the code: every `EventBody` variant has a row (an exhaustive
//! match), the documented fields are exactly the serde fields of the kind's payload, every
//! example parses as an [`Event`](super::events::Event) and serializes back to the same keys,
//! and the section in `docs/protocol.md` is the rendered text (`AGENT_HOST_BLESS=1 cargo test
//! --lib event_reference` rewrites it).

use std::fmt::Write as _;

use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::events::{ErrorCategory, EventClass, QueueReason, RunState};
use super::states::SessionState;

/// The marker lines around the generated section in `docs/protocol.md`.
pub const BEGIN: &str = "<!-- events:begin -->";
pub const END: &str = "<!-- events:end -->";

/// The JSON type of a field, as a client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonType {
    String,
    Integer,
    Number,
    Boolean,
    /// Any JSON value.
    Any,
    StringList,
    /// The `{fullBytes, keptBytes}` object of a cut block end.
    Truncated,
    RunState,
    ErrorCategory,
    SessionState,
    /// The reason of a `queue.changed`.
    QueueReason,
    /// The queue of a `queue.changed`: `[{runId, text, truncated?, from?}]`.
    QueueList,
    /// Who sent a prompt: `{via, subscriberId?, client?}`.
    PromptFrom,
    /// The options of a `permission.request`: `[{id, label, kind, rule?}]`.
    PermissionOptions,
    /// What a permission option does: `allow_once`, `allow_always`, `reject_once`,
    /// `reject_always`.
    OptionKind,
    /// A prompt's attachments: `[{name, mime, kind, bytes, sha256}]`.
    Attachments,
}

impl JsonType {
    /// How the reference names the type.
    pub fn label(self) -> &'static str {
        match self {
            JsonType::String => "string",
            JsonType::Integer => "integer",
            JsonType::Number => "number",
            JsonType::Boolean => "boolean",
            JsonType::Any => "any JSON",
            JsonType::StringList => "array of strings",
            JsonType::Truncated => "object `{fullBytes, keptBytes}` (integers)",
            JsonType::RunState => "string: a [run state](#run-states)",
            JsonType::ErrorCategory => "string: an [error category](#error-categories)",
            JsonType::SessionState => "string: a [session state](#session-states)",
            JsonType::QueueReason => "string: a [queue reason](#queue-reasons)",
            JsonType::QueueList => {
                "array of objects `{runId, text, truncated?, from?}` (strings; `truncated` a \
                 boolean; `from` as in `user.text`)"
            }
            JsonType::PromptFrom => {
                "object `{via, subscriberId?, client?}` (strings; `via` one of `ipc`, `ws`, \
                 `relay`)"
            }
            JsonType::PermissionOptions => {
                "array of objects `{id, label, kind, rule?}` (strings; `kind` an option kind)"
            }
            JsonType::OptionKind => {
                "string: `allow_once`, `allow_always`, `reject_once` or `reject_always`"
            }
            JsonType::Attachments => {
                "array of objects `{name, mime, kind, bytes, sha256}` (`kind` `image` or \
                 `file`, `bytes` an integer, `sha256` hex; the others strings)"
            }
        }
    }
}

/// One field of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The JSON key (camelCase, as serde writes it).
    pub name: &'static str,
    pub ty: JsonType,
    /// Left out of the JSON when it has no value (never written as `null`).
    pub optional: bool,
    pub meaning: &'static str,
}

const fn req(name: &'static str, ty: JsonType, meaning: &'static str) -> Field {
    Field {
        name,
        ty,
        optional: false,
        meaning,
    }
}

const fn opt(name: &'static str, ty: JsonType, meaning: &'static str) -> Field {
    Field {
        name,
        ty,
        optional: true,
        meaning,
    }
}

/// One event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventDoc {
    /// The `"k"` discriminator.
    pub kind: &'static str,
    pub class: EventClass,
    /// When it is emitted, in one or two sentences.
    pub when: &'static str,
    /// The kind's own fields (not `k`, `sessionId`, `runId`: see [`COMMON`]).
    pub fields: &'static [Field],
    /// One whole event as it appears in `event_json`.
    pub example: &'static str,
}

/// The fields every event has, whatever its kind.
pub const COMMON: &[Field] = &[
    req(
        "k",
        JsonType::String,
        "The kind: one of the kinds below. A client skips kinds it does not know (a newer host \
         writes them).",
    ),
    req(
        "sessionId",
        JsonType::String,
        "The host session the event belongs to (the `session_id` of `session.create`), not the \
         agent's own session id.",
    ),
    opt(
        "runId",
        JsonType::String,
        "The run (one prompt and the agent's turn on it) the event belongs to: the `run_id` that \
         `session.send` answered. Absent outside a run, e.g. on the `session.forked` of \
         `session.fork`, a `warning` between runs, or the `session.state` `idle` after a run.",
    ),
];

/// The `EventPush` fields around `event_json`: (name, protobuf type, meaning).
pub const PUSH: &[(&str, &str, &str)] = &[
    (
        "sequence_id",
        "int64",
        "A bracket's own position: increasing across the whole host, the same live, on replay and \
         in history pages; the cursor of `Hello`, `ACK` and `after_seq`. A delta carries the \
         `sequence_id` of the latest bracket before it (of any session), so acking it is always \
         safe.",
    ),
    (
        "message_id",
        "string",
        "A unique id of this event (a UUID); a bracket's is stored with it, so a replayed \
         bracket has the same one.",
    ),
    (
        "session_id",
        "string",
        "The event's `sessionId`, to route without parsing the JSON.",
    ),
    (
        "run_id",
        "string",
        "The event's `runId`; empty outside a run.",
    ),
    (
        "is_delta",
        "bool",
        "Whether the kind is a delta (see the class of each kind).",
    ),
    (
        "event_json",
        "string",
        "The canonical event, exactly as stored: a flat JSON object described below.",
    ),
];

/// The `code`s of `warning` events this build writes, with what each means.
pub const WARNING_CODES: &[(&str, &str)] = &[
    (
        "imported_history_cut",
        "An imported session's earlier conversation was longer than the host shows: only its \
         last 500 entries (prompts, answers, tool calls, tool results) were published, after \
         this warning. The agent still has all of it. No `runId`.",
    ),
    (
        "imported_history_unavailable",
        "The earlier conversation of an imported session is not shown: the host cannot read \
         that agent's history (ACP and one-shot agents), or its file could not be read (the \
         `message` says why). The import stands and the agent still has it. No `runId`.",
    ),
    (
        "followup_dropped",
        "A queued prompt will never run: more were waiting than the queue holds \
         (`queue_capacity` in `config.toml`, 3 by default) and it was the oldest, or no agent \
         could run it after a restart. It carries the prompt's `runId` (its `message` names the \
         run and the start of its text) and stands in for its `run.start` and `run.end`.",
    ),
    (
        "steer_unsupported",
        "A `session.steer` to a turn the agent cannot take input into (its family does not \
         steer, or the agent refused it): the prompt was not given to the running turn; it \
         waits at the head of the queue and runs next. It carries the queued prompt's `runId`.",
    ),
    (
        "steer_not_taken",
        "The agent refused (or never got) a `session.steer` whose `user.text` (`steer: true`) \
         is already in the running run, committed before the agent was given it: that text \
         was not part of the turn. It carries that run's `runId` (none once the run has \
         ended; its `message` names the run). The text then runs as a prompt of its own: a \
         `warning` `steer_unsupported` and a `queue.changed` `steered` follow (a plain send \
         when no turn runs any more). If the store cannot commit this warning, the steer is \
         refused `store_unavailable` (nothing is queued) and the warning is published first \
         once the store commits again.",
    ),
    (
        "steer_result_unknown",
        "A `session.steer` was handed to the agent but no answer said whether it took the text          (the agent did not answer in time, or the turn ended first): it may or may not have          reached the running turn, and it was not queued, so it never runs twice. It carries the          running run's `runId`; the command's answer is `result_delivery_unknown`.",
    ),
    (
        "followup_cancelled",
        "A queued prompt was cancelled before it ran (it carries the prompt's `runId`).",
    ),
    (
        "forked",
        "Another process wrote or holds the agent's session: the conversation goes on in a fork \
         of it (a `session.forked` or, with Codex, a `session.bound` of the fork follows).",
    ),
    (
        "session_drifted",
        "Someone else wrote the agent's session file: the next prompt continues in a fork (a \
         turn in progress goes on, and the warning carries its `runId`).",
    ),
    (
        "resume_rejected",
        "The agent could not resume its session: the prompt continues in a fresh agent session \
         that does not remember the earlier turns (or an ACP agent answered the resume with \
         another session).",
    ),
    (
        "fork_unsupported",
        "The agent cannot fork sessions: the conversation continues in a new agent session \
         without the earlier turns.",
    ),
    (
        "resume_unsupported",
        "The agent cannot resume a session in a new process (its family declares no resume): \
         the prompt continues in a fresh agent session that does not remember the earlier \
         turns.",
    ),
    (
        "event_too_large",
        "An event over 4 MiB that could not be cut to fit was left out (block ends are cut and \
         marked `truncated` instead).",
    ),
    (
        "agent_retrying",
        "The agent reported an error it retries by itself (Codex).",
    ),
    ("agent_warning", "A warning the agent reported (Codex)."),
];

const ITEM_ID: Field = opt(
    "itemId",
    JsonType::String,
    "Identifies the block: its `*.start`, deltas and `*.end` carry the same id. Set by every \
     built-in adapter.",
);
const TRUNCATED: Field = opt(
    "truncated",
    JsonType::Truncated,
    "Present only when the event would have been over 4 MiB: the block is still closed, and \
     the text holds the first `keptBytes` of the original's `fullBytes` bytes (UTF-8). An event \
     without it is whole.",
);
const CALL_ID: Field = req(
    "callId",
    JsonType::String,
    "Identifies the tool call: all its `tool.*` events carry the same id.",
);
const REQUEST_ID: Field = req(
    "requestId",
    JsonType::String,
    "The permission request's id, to answer with; with Codex and ACP agents it is the tool \
     call's `callId`.",
);

/// One row per event kind, brackets first, in the order of `EventBody`.
pub const EVENTS: &[EventDoc] = &[
    EventDoc {
        kind: "run.start",
        class: EventClass::Bracket,
        when: "When the session hands a prompt to the agent (not when the prompt is queued): \
               right after the run's `user.text`, and only once both are committed. One per run.",
        fields: &[
            opt(
                "agent",
                JsonType::String,
                "The session's agent type: `claude`, `codex`, or a registered agent's name.",
            ),
            opt(
                "model",
                JsonType::String,
                "The model, when the host knows it (the built-in adapters do not set it yet).",
            ),
        ],
        example: r#"{"k":"run.start","sessionId":"s1","runId":"r1","agent":"claude"}"#,
    },
    EventDoc {
        kind: "run.end",
        class: EventClass::Bracket,
        when: "Exactly once per started run, and last: the agent ended its turn, the run could \
               not start or the agent process died (`failed`: `transport_lost` when the prompt \
               never reached the agent, `result_delivery_unknown` when it had the prompt and \
               went away before the result), a cancel took effect \
               (`cancelled`, within 3 s: an agent that ignores the interrupt is killed), or the \
               host stopped or could not store the run's events (`interrupted`, also written at \
               the next start for a run a crash left open). Permission requests still pending \
               are resolved `expired` just before it.",
        fields: &[
            req("state", JsonType::RunState, "How the run ended."),
            opt(
                "category",
                JsonType::ErrorCategory,
                "Why it did not complete: set for `failed` (and `cancelled` for `cancelled`); \
                 absent for `completed` and `interrupted`.",
            ),
            opt(
                "message",
                JsonType::String,
                "A sentence for a person saying what happened; absent for a plain completion.",
            ),
        ],
        example: r#"{"k":"run.end","sessionId":"s1","runId":"r1","state":"failed","category":"rate_limited","message":"API Error: 429 rate limited"}"#,
    },
    EventDoc {
        kind: "user.text",
        class: EventClass::Bracket,
        when: "When a prompt is dispatched to the agent (not when it is queued): before its \
               `run.start`, the first event of its run apart from the `queue.changed` and \
               `warning`s published about it while it waited (once per prompt: a dispatch the \
               store cut short after it is not announced again). A prompt dropped or cancelled \
               while queued has a \
               `warning` instead. A steer given to the running turn (`session.steer`) is a \
               `user.text` with `steer` inside the running run, committed before the agent gets \
               it; if the agent does not take it, a `warning` `steer_not_taken` follows. At `session.import`, each prompt of the agent's \
               earlier conversation is a `user.text` with `imported` and no `runId`, before \
               anything else in the session.",
        fields: &[
            req(
                "text",
                JsonType::String,
                "The prompt as the client sent it.",
            ),
            opt(
                "clientMsgId",
                JsonType::String,
                "The client's idempotency key of the prompt, if it sent one.",
            ),
            opt(
                "steer",
                JsonType::Boolean,
                "`true`: a `session.steer` given to this run's turn while it ran (the run's own \
                 prompt came before it); the turn took it unless a `warning` `steer_not_taken` \
                 follows: in the run, or, when the run ended before the agent's answer came, \
                 with no `runId`, its `message` naming the run (one the store could not commit \
                 at once is published first when it commits again); absent otherwise.",
            ),
            opt(
                "from",
                JsonType::PromptFrom,
                "Who sent the prompt: `via` `ipc` (a terminal command over the host's socket), \
                 `ws` (a loopback WebSocket client: `subscriberId` is its subscriber, `client` \
                 the label it was added with — `web` for the browser page of `agent-host open`, \
                 `follow` for `agent-host follow`, or an app's own) or `relay` (a bot: through \
                 the sealed fleet, `subscriberId` is `bot-<bot_id>` and `client` the bot's \
                 name; through a `[relay]`, neither). Kept with a queued prompt across a host \
                 restart; absent in events of older hosts.",
            ),
            opt(
                "attachments",
                JsonType::Attachments,
                "The files and images the prompt carried (`session.send` `attachments`), as \
                 the host checked and copied them: their name, MIME type, kind (`image` or \
                 `file`), size and SHA-256, never their bytes or where the host keeps them. \
                 Absent when it had none.",
            ),
            opt(
                "imported",
                JsonType::Boolean,
                "`true`: a prompt of the agent's own conversation from before the session was \
                 imported (`session.import` reads it from the agent's files and publishes it \
                 first, with no `runId`); absent for a prompt sent through the host.",
            ),
        ],
        example: r#"{"k":"user.text","sessionId":"s1","runId":"r1","text":"Fix the failing test","clientMsgId":"c-42","from":{"via":"ws","subscriberId":"0190a6f2-7c1e-7d3a-9f10-2b4c6d8e0a1f","client":"web"}}"#,
    },
    EventDoc {
        kind: "text.start",
        class: EventClass::Bracket,
        when: "The agent opened a block of assistant text (Claude's text block, a Codex \
               `agentMessage` item, an ACP message chunk with a new `messageId`). A block the \
               agent reports only whole gets its `text.start` and `text.end` back to back.",
        fields: &[ITEM_ID],
        example: r#"{"k":"text.start","sessionId":"s1","runId":"r1","itemId":"msg_01:1"}"#,
    },
    EventDoc {
        kind: "text.end",
        class: EventClass::Bracket,
        when: "The text block closed: the agent finished it, or the turn ended with it still \
               open (an interrupted block keeps what it had). Every `text.start` gets one, and \
               it carries the whole text, so history and late joiners need no deltas.",
        fields: &[
            ITEM_ID,
            req(
                "text",
                JsonType::String,
                "The whole text of the block, as the agent finally reported it (unless \
                 `truncated`).",
            ),
            TRUNCATED,
            opt(
                "imported",
                JsonType::Boolean,
                "`true`: an answer of the agent's own conversation from before the session was \
                 imported (read from the agent's files at `session.import`, with no `runId`; its \
                 `text.start` comes right before it); absent otherwise.",
            ),
        ],
        example: r#"{"k":"text.end","sessionId":"s1","runId":"r1","itemId":"msg_01:1","text":"The test fails because its fixture is stale."}"#,
    },
    EventDoc {
        kind: "thinking.start",
        class: EventClass::Bracket,
        when: "The agent opened a block of visible reasoning (Claude's thinking block, a Codex \
               `reasoning` item, an ACP thought chunk with a new `messageId`).",
        fields: &[ITEM_ID],
        example: r#"{"k":"thinking.start","sessionId":"s1","runId":"r1","itemId":"msg_01:0"}"#,
    },
    EventDoc {
        kind: "thinking.end",
        class: EventClass::Bracket,
        when: "The reasoning block closed, or the turn ended with it open. It carries the whole \
               text (for Codex the item's summary and content parts, one per line).",
        fields: &[
            ITEM_ID,
            req(
                "text",
                JsonType::String,
                "The whole reasoning text of the block (unless `truncated`).",
            ),
            TRUNCATED,
            opt(
                "imported",
                JsonType::Boolean,
                "Shared with `text.end`; always absent here: an import shows the agent's earlier \
                 prompts, answers and tool calls, not its reasoning.",
            ),
        ],
        example: r#"{"k":"thinking.end","sessionId":"s1","runId":"r1","itemId":"msg_01:0","text":"Let me run the test first."}"#,
    },
    EventDoc {
        kind: "tool.call.start",
        class: EventClass::Bracket,
        when: "The agent began a tool call: Claude's `tool_use` block, a Codex command, file \
               change, MCP tool call or web search item, an ACP `tool_call`. With Claude its \
               input may still stream as `tool.call.delta`.",
        fields: &[
            CALL_ID,
            req(
                "name",
                JsonType::String,
                "The tool: Claude's own name (`Bash`, `Edit`, …); for Codex `shell`, \
                 `apply_patch`, `web_search` or `server.tool` (MCP); for ACP the agent's tool \
                 name, else the call's title or kind.",
            ),
        ],
        example: r#"{"k":"tool.call.start","sessionId":"s1","runId":"r1","callId":"call_7","name":"Bash"}"#,
    },
    EventDoc {
        kind: "tool.call.end",
        class: EventClass::Bracket,
        when: "The call's input is complete: at the end of Claude's block, right after \
               `tool.call.start` for Codex (its items start complete), and for ACP at the \
               permission request or when the tool starts. Every `tool.call.start` gets one.",
        fields: &[
            CALL_ID,
            req(
                "name",
                JsonType::String,
                "The tool, as in `tool.call.start`.",
            ),
            req(
                "input",
                JsonType::Any,
                "The complete input, usually an object (Codex `shell`: `{command, cwd}`); when \
                 `truncated`, a string holding the start of the input's JSON text.",
            ),
            TRUNCATED,
        ],
        example: r#"{"k":"tool.call.end","sessionId":"s1","runId":"r1","callId":"call_7","name":"Bash","input":{"command":"cargo test"}}"#,
    },
    EventDoc {
        kind: "tool.exec.start",
        class: EventClass::Bracket,
        when: "The tool began to run: a Codex item's first output (or its completion), an ACP \
               `tool_call_update` `in_progress`. Claude reports only results, so its \
               `tool.exec.start` comes right before its `tool.exec.end`.",
        fields: &[
            CALL_ID,
            opt(
                "name",
                JsonType::String,
                "The tool's name, when the adapter knows it here (Claude, ACP).",
            ),
        ],
        example: r#"{"k":"tool.exec.start","sessionId":"s1","runId":"r1","callId":"call_7","name":"Bash"}"#,
    },
    EventDoc {
        kind: "tool.exec.end",
        class: EventClass::Bracket,
        when: "The tool finished: Claude's `tool_result`, a completed Codex item, an ACP \
               `completed` / `failed` update. A tool still open when the turn ends is closed \
               here with `isError: true`.",
        fields: &[
            CALL_ID,
            req(
                "output",
                JsonType::String,
                "The tool's final output as text (Codex file changes: one `kind path` line per \
                 change), unless `truncated`.",
            ),
            req(
                "isError",
                JsonType::Boolean,
                "The tool failed or was declined, or (a command) exited non-zero.",
            ),
            opt(
                "exitCode",
                JsonType::Integer,
                "A command's exit code, when the agent reports it (Codex).",
            ),
            TRUNCATED,
        ],
        example: r#"{"k":"tool.exec.end","sessionId":"s1","runId":"r1","callId":"call_7","output":"test result: ok. 12 passed","isError":false,"exitCode":0}"#,
    },
    EventDoc {
        kind: "permission.request",
        class: EventClass::Bracket,
        when: "The agent asks a person before it goes on: Claude's `can_use_tool`, a Codex \
               approval request, an ACP `session/request_permission`. It stays pending (the \
               session `waiting`) until a `permission.resolved`; answer it with \
               `permission.respond` (`permission.list` lists the pending ones).",
        fields: &[
            REQUEST_ID,
            req(
                "tool",
                JsonType::String,
                "What asks: the tool's name (Codex: `shell`, `apply_patch` or `permissions`).",
            ),
            req(
                "input",
                JsonType::Any,
                "What it would do: the tool's input (Codex: `{command, cwd, reason}`, \
                 `{reason, grantRoot}` or `{permissions, reason}`).",
            ),
            opt(
                "options",
                JsonType::PermissionOptions,
                "The agent's own choices, in its order; answer with one's `id` as \
                 `permission.respond`'s `option_id` (`decision` `allow` / `deny` pick the first \
                 `allow_once` / `reject_once`). `kind` says what it does; an `allow_always` \
                 option's `rule` says, in words, what the agent will stop asking about. Claude: \
                 `allow`, `allow_always` (its suggested permission updates, kept for the session) \
                 or `mode:<mode>`, `deny`. Codex: its decisions (`accept`, `acceptForSession`, \
                 `acceptWithExecpolicyAmendment`, `decline`, `cancel`). ACP: the agent's \
                 `optionId`s. History written by earlier builds holds bare ids (`\"allow\"`).",
            ),
        ],
        example: r#"{"k":"permission.request","sessionId":"s1","runId":"r1","requestId":"perm_3","tool":"Bash","input":{"command":"npm test"},"options":[{"id":"allow","label":"Allow","kind":"allow_once"},{"id":"allow_always","label":"Always allow Bash(npm test)","kind":"allow_always","rule":"always allow Bash(npm test) in this session"},{"id":"deny","label":"Deny","kind":"reject_once"}]}"#,
    },
    EventDoc {
        kind: "permission.resolved",
        class: EventClass::Bracket,
        when: "A permission request stopped being pending: a client answered it (only the first \
               answer counts), the agent withdrew it, or the host expired it because its run or \
               the agent process ended or the host stopped.",
        fields: &[
            req(
                "requestId",
                JsonType::String,
                "The `requestId` of the `permission.request`.",
            ),
            req(
                "decision",
                JsonType::String,
                "`allow` or `deny` (a client's answer), `withdrawn` (the agent took the request \
                 back) or `expired` (the host).",
            ),
            opt(
                "by",
                JsonType::String,
                "Who resolved it: the answering subscriber's id (`ipc` for the IPC command), \
                 `agent` or `host`.",
            ),
            opt(
                "optionId",
                JsonType::String,
                "The `id` of the request's option the answer chose (an answer only).",
            ),
            opt("kind", JsonType::OptionKind, "That option's kind."),
            opt(
                "rule",
                JsonType::String,
                "Set when the chosen option was `allow_always` and, once the agent's driver \
                 wrote the answer, it took effect: the rule it \
                 keeps, in words; `session.get` lists it in `permission_rules` from then on.",
            ),
        ],
        example: r#"{"k":"permission.resolved","sessionId":"s1","runId":"r1","requestId":"perm_3","decision":"allow","by":"sub_9","optionId":"allow_always","kind":"allow_always","rule":"always allow Bash(npm test) in this session"}"#,
    },
    EventDoc {
        kind: "usage",
        class: EventClass::Bracket,
        when: "The turn's token usage, just before its `run.end`: from Claude's `result`, \
               Codex's counts added up over the turn, or the ACP prompt answer. A turn whose \
               agent reports no counts has none.",
        fields: &[
            req(
                "inputTokens",
                JsonType::Integer,
                "Input tokens of the turn (Claude: including cache writes).",
            ),
            req(
                "outputTokens",
                JsonType::Integer,
                "Output tokens of the turn.",
            ),
            opt(
                "cachedInputTokens",
                JsonType::Integer,
                "Input tokens read from the prompt cache, when reported.",
            ),
            opt(
                "costUsd",
                JsonType::Number,
                "The cost in US dollars, when the agent reports it (Claude, ACP agents that \
                 report a USD cost).",
            ),
        ],
        example: r#"{"k":"usage","sessionId":"s1","runId":"r1","inputTokens":1200,"outputTokens":340,"cachedInputTokens":5000,"costUsd":0.0123}"#,
    },
    EventDoc {
        kind: "session.bound",
        class: EventClass::Bracket,
        when: "The agent named its own session id (Claude's `system/init`, Codex's thread, the \
               ACP session of `session/new`, `session/fork` or the one loaded): once per new id, \
               so again after a fork or a fresh start. The host saves it at once, to resume the \
               session later.",
        fields: &[req(
            "nativeSessionId",
            JsonType::String,
            "The agent's session id (Claude session id, Codex thread id, ACP `sessionId`).",
        )],
        example: r#"{"k":"session.bound","sessionId":"s1","runId":"r1","nativeSessionId":"3f0c2d1e-8a77-4c1a-9a51-7b1e01968f0e"}"#,
    },
    EventDoc {
        kind: "session.forked",
        class: EventClass::Bracket,
        when: "The conversation continues in a fork: after `session.fork`, on both the parent \
               and the new session (outside any run); after an automatic fork (another process \
               wrote or holds the agent's session), on this session, following a `warning` \
               `forked`.",
        fields: &[
            req(
                "parentSessionId",
                JsonType::String,
                "The host session forked from.",
            ),
            opt(
                "childSessionId",
                JsonType::String,
                "The host session the conversation continues in (for an automatic fork, the \
                 same session).",
            ),
            opt(
                "fromNativeSessionId",
                JsonType::String,
                "The agent's session that was forked.",
            ),
            opt(
                "reason",
                JsonType::String,
                "Why: `forked on request`, or what made the host fork.",
            ),
        ],
        example: r#"{"k":"session.forked","sessionId":"s2","parentSessionId":"s1","childSessionId":"s2","fromNativeSessionId":"3f0c2d1e-8a77-4c1a-9a51-7b1e01968f0e","reason":"forked on request"}"#,
    },
    EventDoc {
        kind: "session.configured",
        class: EventClass::Bracket,
        when: "The session's configuration changed: after `session.set_model` (outside any run), \
               or when a resume found the model, standing prompt, options or provider changed \
               since the session was bound (in the run that found it).",
        fields: &[
            req(
                "reason",
                JsonType::String,
                "Why: `set_model`, `reconfigured` (a resume found the model, standing prompt or \
                 options changed: applied as a new configuration), `provider_changed` (the \
                 provider account changed: the session continues in a fork) or `created`.",
            ),
            req(
                "changed",
                JsonType::StringList,
                "What changed: `model`, `system_prompt`, `options` (the runtime options, MCP \
                 servers and permission mode, compared as one), `provider` (more may come).",
            ),
            opt(
                "model",
                JsonType::String,
                "The model from now on, when known.",
            ),
            opt(
                "applied",
                JsonType::String,
                "How the agent takes it: `live` (the running agent took it at once), \
                 `next_turn` (the next turn, or the next agent opened, carries it) or `restart` \
                 (the agent is restarted, resuming its session, at once when idle, else right \
                 after the running turn).",
            ),
            req("message", JsonType::String, "A sentence for a person."),
        ],
        example: r#"{"k":"session.configured","sessionId":"s1","reason":"set_model","changed":["model"],"model":"claude-opus-4-1","applied":"live","message":"the session runs on claude-opus-4-1 from now on; the agent took it at once"}"#,
    },
    EventDoc {
        kind: "session.state",
        class: EventClass::Bracket,
        when: "Emitted by the session when its state changes, so a client can badge it without \
               polling: `running` right after a run's `run.start`, `waiting` after the \
               `permission.request` it waits on (the session needs a person), `running` again \
               after the last `permission.resolved`, `idle` after the last `run.end`. At start \
               the host sets a session a crash left busy back to `idle` with one.",
        fields: &[
            req("state", JsonType::SessionState, "The state from now on."),
            req("previous", JsonType::SessionState, "The state before."),
        ],
        example: r#"{"k":"session.state","sessionId":"s1","runId":"r1","state":"waiting","previous":"running"}"#,
    },
    EventDoc {
        kind: "queue.changed",
        class: EventClass::Bracket,
        when: "Emitted by the session whenever its follow-up queue changes, with the whole queue \
               after the change (head first), so every client shows it without polling: a prompt \
               sent to a busy session (`added`), `queue.edit` (`edited`), `queue.move` \
               (`moved`), `queue.remove` or `session.cancel` of a queued run (`removed`), \
               `queue.clear` (`cleared`), a prompt over the capacity (`dropped`, after its \
               `warning` `followup_dropped`), the head starting (`dispatched`, right after its \
               `run.start`), a host start queuing what the last host left queued (`restored`), \
               a steer that went to the head (`steered`). Its `runId` is the prompt's the change \
               concerns (absent for `cleared` and `restored`): that run has no `run.start` yet \
               (except for `dispatched`).",
        fields: &[
            req("reason", JsonType::QueueReason, "What changed the queue."),
            req(
                "queue",
                JsonType::QueueList,
                "Every prompt still queued, head (the next to run) first: its run's `runId`, \
                 its text and who sent it (`from`, as in `user.text`, when known). A queue whose texts would be over 2 MiB together carries the start of \
                 each, marked `truncated` (`session.get` has them whole).",
            ),
        ],
        example: r#"{"k":"queue.changed","sessionId":"s1","runId":"r3","reason":"moved","queue":[{"runId":"r3","text":"Then run the linter","from":{"via":"ipc"}},{"runId":"r2","text":"Add a test for it"}]}"#,
    },
    EventDoc {
        kind: "warning",
        class: EventClass::Bracket,
        when: "Something a person should know that did not stop the run, or that happened \
               between runs; `code` says what (see [warning codes](#warning-codes)).",
        fields: &[
            req(
                "code",
                JsonType::String,
                "A stable machine-readable code: one of the [warning codes](#warning-codes) \
                 (more may come; show `message` for one you do not know).",
            ),
            req("message", JsonType::String, "A sentence for a person."),
        ],
        example: r#"{"k":"warning","sessionId":"s1","runId":"r4","code":"followup_dropped","message":"more than 3 prompts were waiting; the oldest one was dropped and will not run"}"#,
    },
    EventDoc {
        kind: "error",
        class: EventClass::Bracket,
        when: "An error a person should see: mostly just before a `run.end` `failed` with the \
               same category and message (the agent reported a failed turn, its process died, \
               the run could not start). A `resume_rejected` error is followed by a `warning` \
               `resume_rejected` when the prompt goes on in a fresh agent session.",
        fields: &[
            req("category", JsonType::ErrorCategory, "What kind of failure."),
            req(
                "message",
                JsonType::String,
                "What the agent or the host said.",
            ),
        ],
        example: r#"{"k":"error","sessionId":"s1","runId":"r1","category":"context_exhausted","message":"Prompt is too long"}"#,
    },
    EventDoc {
        kind: "text.delta",
        class: EventClass::Delta,
        when: "A piece of assistant text as it streams, between its block's `text.start` and \
               `text.end`. Append the pieces to show the text live; `text.end` has the whole \
               text anyway.",
        fields: &[
            ITEM_ID,
            req("text", JsonType::String, "The new piece of text."),
        ],
        example: r#"{"k":"text.delta","sessionId":"s1","runId":"r1","itemId":"msg_01:1","text":"The test fails because"}"#,
    },
    EventDoc {
        kind: "thinking.delta",
        class: EventClass::Delta,
        when: "A piece of reasoning as it streams, inside an open thinking block.",
        fields: &[
            ITEM_ID,
            req("text", JsonType::String, "The new piece of reasoning."),
        ],
        example: r#"{"k":"thinking.delta","sessionId":"s1","runId":"r1","itemId":"msg_01:0","text":"Let me run"}"#,
    },
    EventDoc {
        kind: "tool.call.delta",
        class: EventClass::Delta,
        when: "A fragment of a tool call's input as the model streams it (Claude), between \
               `tool.call.start` and `tool.call.end`.",
        fields: &[
            CALL_ID,
            req(
                "delta",
                JsonType::String,
                "The next fragment of the input's JSON text; `tool.call.end` has the whole \
                 input, parsed.",
            ),
        ],
        example: r#"{"k":"tool.call.delta","sessionId":"s1","runId":"r1","callId":"call_7","delta":"{\"command\": \"cargo te"}"#,
    },
    EventDoc {
        kind: "tool.exec.update",
        class: EventClass::Delta,
        when: "Output of a running tool as it is produced: Codex's command and file-change \
               output, the content of a running ACP tool.",
        fields: &[
            CALL_ID,
            req("output", JsonType::String, "The new piece of output."),
        ],
        example: r#"{"k":"tool.exec.update","sessionId":"s1","runId":"r1","callId":"call_7","output":"running 12 tests\n"}"#,
    },
    EventDoc {
        kind: "artifact.delta",
        class: EventClass::Delta,
        when: "A piece of an artifact the agent produces; today its plan: Codex's \
               `turn/plan/updated`, an ACP `plan` update. Each holds the whole current plan, and \
               no bracket repeats it.",
        fields: &[
            req(
                "artifactId",
                JsonType::String,
                "Which artifact: `plan:<turn id>` (Codex) or `plan` (ACP).",
            ),
            opt(
                "mime",
                JsonType::String,
                "The type of `data`: `application/vnd.agent-host.plan+json` (Codex: \
                 `{explanation, plan}`) or `application/json` (ACP: the plan's entries).",
            ),
            req(
                "data",
                JsonType::String,
                "The content (for a plan, JSON text).",
            ),
        ],
        example: r#"{"k":"artifact.delta","sessionId":"s1","runId":"r1","artifactId":"plan:turn_5","mime":"application/vnd.agent-host.plan+json","data":"{\"explanation\":null,\"plan\":[{\"step\":\"Run the tests\",\"status\":\"in_progress\"}]}"}"#,
    },
];

/// What each run state means. Exhaustive: a new state must be described here.
fn run_state_meaning(state: RunState) -> &'static str {
    match state {
        RunState::Completed => "The agent finished the turn.",
        RunState::Failed => {
            "The turn failed; `category` says why (an `error` usually comes just before)."
        }
        RunState::Cancelled => "A cancel took effect, or the agent aborted the turn.",
        RunState::Interrupted => {
            "The host stopped during the run or could not store its events; a run a crash left \
             open is closed this way when the host starts again."
        }
    }
}

/// What each error category means. Exhaustive: a new category must be described here.
fn error_category_meaning(category: ErrorCategory) -> &'static str {
    match category {
        ErrorCategory::BinaryUnavailable => {
            "The agent's binary is not found on PATH or is not executable."
        }
        ErrorCategory::AuthRequired => "The agent needs a login, or its credentials were refused.",
        ErrorCategory::RateLimited => "The provider's rate or usage limit was hit.",
        ErrorCategory::TransportLost => {
            "The connection to the agent process (or the agent's own to its model) was lost. \
             When the host lost the agent before it handed over the prompt, the message says \
             the prompt was not sent: sending it again is safe."
        }
        ErrorCategory::ProtocolIncompatible => {
            "The agent speaks no protocol (version) this build can drive."
        }
        ErrorCategory::PermissionDenied => "Reserved; not written by this build.",
        ErrorCategory::Cancelled => "The run was cancelled.",
        ErrorCategory::ResumeRejected => {
            "The agent no longer has the session it was asked to resume."
        }
        ErrorCategory::ContextExhausted => {
            "The conversation no longer fits the model's context or token limit."
        }
        ErrorCategory::WorkspaceUnavailable => "The session's working directory does not exist.",
        ErrorCategory::AgentFailed => "Any other failure the agent reported.",
        ErrorCategory::ResultDeliveryUnknown => {
            "The agent had the prompt, and its process or the connection to it ended (or stopped \
             answering) before the turn's result: whether the agent acted on the prompt is \
             unknown. Look at the workspace (and `session.run`) before sending it again."
        }
    }
}

/// What each session state means. Exhaustive: a new state must be described here.
fn session_state_meaning(state: SessionState) -> &'static str {
    match state {
        SessionState::Idle => "No run is in progress.",
        SessionState::Running => "A run is in progress.",
        SessionState::Waiting => {
            "A run is in progress and waits for a person: a permission request is pending."
        }
    }
}

/// What each queue reason means. Exhaustive: a new reason must be described here.
fn queue_reason_meaning(reason: QueueReason) -> &'static str {
    match reason {
        QueueReason::Added => "A prompt sent to a busy session was queued at the end.",
        QueueReason::Edited => "`queue.edit` changed a queued prompt's text.",
        QueueReason::Moved => "`queue.move` moved a queued prompt.",
        QueueReason::Removed => {
            "A queued prompt was taken out (`queue.remove`, or `session.cancel` of its run)."
        }
        QueueReason::Cleared => "`queue.clear` took every queued prompt out.",
        QueueReason::Dropped => {
            "The queue was over its capacity: its oldest prompt was dropped (the `warning` \
             `followup_dropped` before it names it)."
        }
        QueueReason::Dispatched => "The prompt at the head started (after its `run.start`).",
        QueueReason::Restored => {
            "The host started again and queued, in their order, the prompts the last host left \
             queued (they run one after the other)."
        }
        QueueReason::Steered => {
            "A `session.steer` the agent could not take into its turn went to the head of the \
             queue (after its `warning` `steer_unsupported`)."
        }
    }
}

// ---- serde names, read from the derives themselves ----

/// The list of names a derived `Deserialize` hands its deserializer (a struct's fields, an
/// enum's variants), or that it expected when a variant was unknown.
#[derive(Debug)]
struct Names(&'static [&'static str]);

impl std::fmt::Display for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for Names {}

impl de::Error for Names {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Names(&[])
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        Names(expected)
    }
}

/// A deserializer that only asks: it answers a struct with its fields, an enum with its
/// variants, and anything else with nothing.
struct Probe;

impl<'de> Deserializer<'de> for Probe {
    type Error = Names;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Names> {
        Err(Names(&[]))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Names> {
        Err(Names(fields))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Names> {
        Err(Names(variants))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map identifier ignored_any
    }
}

/// The serde names of a struct's fields or a plain enum's variants.
pub fn serde_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    match T::deserialize(Probe) {
        Err(Names(names)) => names,
        Ok(_) => &[],
    }
}

/// Every `"k"` the `EventBody` derive knows: its answer to a tag it does not know.
pub fn serde_kinds() -> &'static [&'static str] {
    let map = de::value::MapDeserializer::<_, Names>::new(std::iter::once(("k", "\u{0}")));
    match super::events::EventBody::deserialize(map) {
        Err(Names(names)) => names,
        Ok(_) => &[],
    }
}

/// The serde names of an enum's variants with their meanings.
fn values<T>(meaning: fn(T) -> &'static str) -> Vec<(&'static str, &'static str)>
where
    T: for<'de> Deserialize<'de>,
{
    serde_names::<T>()
        .iter()
        .map(|name| {
            let text =
                serde_json::from_value::<T>(serde_json::Value::from(*name)).map_or("", meaning);
            (*name, text)
        })
        .collect()
}

// ---- rendering ----

/// A table cell: a `|` would end it.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn class_name(class: EventClass) -> &'static str {
    match class {
        EventClass::Bracket => "bracket",
        EventClass::Delta => "delta",
    }
}

fn field_table(out: &mut String, fields: &[Field]) {
    out.push_str("| field | type | | meaning |\n| --- | --- | --- | --- |\n");
    for f in fields {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            f.name,
            cell(f.ty.label()),
            if f.optional { "optional" } else { "always" },
            cell(f.meaning)
        );
    }
}

fn value_table(out: &mut String, title: &str, intro: &str, rows: &[(&str, &str)]) {
    let _ = writeln!(out, "### {title}\n\n{intro}\n");
    out.push_str("| value | meaning |\n| --- | --- |\n");
    for (value, meaning) in rows {
        let _ = writeln!(out, "| `{value}` | {} |", cell(meaning));
    }
    out.push('\n');
}

/// The whole section of `docs/protocol.md`, markers included.
pub fn markdown() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{BEGIN}");
    out.push_str(INTRO);
    out.push_str("| field | protobuf type | meaning |\n| --- | --- | --- |\n");
    for (name, ty, meaning) in PUSH {
        let _ = writeln!(out, "| `{name}` | {ty} | {} |", cell(meaning));
    }
    out.push_str(COMMON_INTRO);
    field_table(&mut out, COMMON);
    out.push_str("\n### Kinds\n\n| `k` | class | fields (`?`: optional) |\n| --- | --- | --- |\n");
    for e in EVENTS {
        let fields: Vec<String> = e
            .fields
            .iter()
            .map(|f| format!("`{}{}`", f.name, if f.optional { "?" } else { "" }))
            .collect();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            e.kind,
            class_name(e.class),
            fields.join(", ")
        );
    }
    out.push('\n');
    for e in EVENTS {
        let _ = writeln!(
            out,
            "### `{}` ({})\n\n{}\n",
            e.kind,
            class_name(e.class),
            e.when
        );
        field_table(&mut out, e.fields);
        let _ = writeln!(out, "\n```json\n{}\n```\n", e.example);
    }
    value_table(
        &mut out,
        "Run states",
        "The `state` of `run.end`.",
        &values(run_state_meaning),
    );
    value_table(
        &mut out,
        "Error categories",
        "The `category` of `error` and `run.end`: the shared taxonomy.",
        &values(error_category_meaning),
    );
    value_table(
        &mut out,
        "Session states",
        "The `state` and `previous` of `session.state` (and the `state` of `session.list` and \
         `session.get`).",
        &values(session_state_meaning),
    );
    value_table(
        &mut out,
        "Queue reasons",
        "The `reason` of `queue.changed`.",
        &values(queue_reason_meaning),
    );
    value_table(
        &mut out,
        "Warning codes",
        "The `code` of `warning` events this build writes.",
        WARNING_CODES,
    );
    let _ = writeln!(out, "{END}");
    out
}

const INTRO: &str = "## Event reference

This section is generated from `src/protocol/event_reference.rs`: `AGENT_HOST_BLESS=1 cargo
test --lib event_reference` rewrites it, and the test fails when it is stale, when a kind or a
field of `src/protocol/events.rs` is missing from it, or when an example does not parse.

Every event is one flat JSON object: `k` names its kind, the kind's fields sit next to it in
camelCase, and every event carries `sessionId` and, inside a run, `runId`. An optional field is
left out when it has no value, never written as `null`. A client skips kinds it does not know
and ignores fields it does not know: that is how the vocabulary grows. The host's ids in the
examples (`sessionId`, `runId`) are shortened; real ones are UUIDs.

Each kind has a class. A **bracket** is stored before anyone sees it, has its own
`sequence_id`, is replayed and listed by history, and is never dropped. A **delta** is only
streamed: sent live to subscribers with `forward_deltas`, never stored or replayed, and dropped
when a client falls behind. The bracket that closes a block repeats it whole (`text.end`,
`thinking.end`, `tool.call.end`; `tool.exec.end` has the tool's final output), so history needs
no deltas; only `artifact.delta` is repeated by nothing.

### Around every event

The event itself has no sequence number or message id: those are in the frame around it,
`EventPush` (live and replayed pushes, and the `events` of history pages).

";

const COMMON_INTRO: &str = "
### Fields of every event

";

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;
    use crate::protocol::events::*;
    use crate::protocol::wire::pb;

    /// The kind and the payload's serde fields of a body. Exhaustive on purpose (no wildcard
    /// arm): a new variant does not compile until it is mapped here, and then needs a row.
    fn documented(body: &EventBody) -> (&'static str, &'static [&'static str]) {
        match body {
            EventBody::RunStart(_) => ("run.start", serde_names::<RunStart>()),
            EventBody::RunEnd(_) => ("run.end", serde_names::<RunEnd>()),
            EventBody::UserText(_) => ("user.text", serde_names::<UserText>()),
            EventBody::TextStart(_) => ("text.start", serde_names::<BlockStart>()),
            EventBody::TextEnd(_) => ("text.end", serde_names::<BlockEnd>()),
            EventBody::ThinkingStart(_) => ("thinking.start", serde_names::<BlockStart>()),
            EventBody::ThinkingEnd(_) => ("thinking.end", serde_names::<BlockEnd>()),
            EventBody::ToolCallStart(_) => ("tool.call.start", serde_names::<ToolCallStart>()),
            EventBody::ToolCallEnd(_) => ("tool.call.end", serde_names::<ToolCallEnd>()),
            EventBody::ToolExecStart(_) => ("tool.exec.start", serde_names::<ToolExecStart>()),
            EventBody::ToolExecEnd(_) => ("tool.exec.end", serde_names::<ToolExecEnd>()),
            EventBody::PermissionRequest(_) => {
                ("permission.request", serde_names::<PermissionRequest>())
            }
            EventBody::PermissionResolved(_) => {
                ("permission.resolved", serde_names::<PermissionResolved>())
            }
            EventBody::Usage(_) => ("usage", serde_names::<Usage>()),
            EventBody::SessionBound(_) => ("session.bound", serde_names::<SessionBound>()),
            EventBody::SessionForked(_) => ("session.forked", serde_names::<SessionForked>()),
            EventBody::SessionConfigured(_) => {
                ("session.configured", serde_names::<SessionConfigured>())
            }
            EventBody::SessionState(_) => ("session.state", serde_names::<SessionStateChange>()),
            EventBody::QueueChanged(_) => ("queue.changed", serde_names::<QueueChange>()),
            EventBody::Warning(_) => ("warning", serde_names::<Notice>()),
            EventBody::Error(_) => ("error", serde_names::<ErrorNotice>()),
            EventBody::TextDelta(_) => ("text.delta", serde_names::<TextDelta>()),
            EventBody::ThinkingDelta(_) => ("thinking.delta", serde_names::<TextDelta>()),
            EventBody::ToolCallDelta(_) => ("tool.call.delta", serde_names::<ToolCallDelta>()),
            EventBody::ToolExecUpdate(_) => ("tool.exec.update", serde_names::<ToolExecUpdate>()),
            EventBody::ArtifactDelta(_) => ("artifact.delta", serde_names::<ArtifactDelta>()),
        }
    }

    fn keys(value: &Value) -> BTreeSet<String> {
        value
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// A value of the type, for a documented field an example leaves out.
    fn sample(ty: JsonType) -> Value {
        match ty {
            JsonType::String => "x".into(),
            JsonType::Integer => 7.into(),
            JsonType::Number => 0.5.into(),
            JsonType::Boolean => true.into(),
            JsonType::Any => serde_json::json!({"a": [1]}),
            JsonType::StringList => serde_json::json!(["allow"]),
            JsonType::Truncated => serde_json::json!({"fullBytes": 9, "keptBytes": 3}),
            JsonType::RunState => "failed".into(),
            JsonType::ErrorCategory => "agent_failed".into(),
            JsonType::SessionState => "running".into(),
            JsonType::QueueReason => "moved".into(),
            JsonType::QueueList => serde_json::json!([{"runId": "r", "text": "t"}]),
            JsonType::PromptFrom => serde_json::json!({"via": "ipc"}),
            JsonType::PermissionOptions => {
                serde_json::json!([{"id": "allow", "label": "Allow", "kind": "allow_once"}])
            }
            JsonType::OptionKind => "allow_always".into(),
            JsonType::Attachments => serde_json::json!([{"name": "shot.png", "mime": "image/png",
                "kind": "image", "bytes": 68, "sha256": "ab"}]),
        }
    }

    fn has_type(ty: JsonType, v: &Value) -> bool {
        match ty {
            JsonType::String
            | JsonType::RunState
            | JsonType::ErrorCategory
            | JsonType::SessionState
            | JsonType::QueueReason => v.is_string(),
            JsonType::OptionKind => v.as_str().is_some_and(|k| {
                ["allow_once", "allow_always", "reject_once", "reject_always"].contains(&k)
            }),
            JsonType::PermissionOptions => v.as_array().is_some_and(|a| {
                a.iter().all(|o| {
                    o["id"].is_string()
                        && o["label"].is_string()
                        && has_type(JsonType::OptionKind, &o["kind"])
                })
            }),
            JsonType::QueueList => v.as_array().is_some_and(|a| {
                a.iter().all(|i| {
                    i["runId"].is_string()
                        && i["text"].is_string()
                        && i.get("from")
                            .is_none_or(|f| has_type(JsonType::PromptFrom, f))
                })
            }),
            JsonType::Attachments => v.as_array().is_some_and(|a| {
                a.iter().all(|i| {
                    i["name"].is_string()
                        && i["mime"].is_string()
                        && i["kind"]
                            .as_str()
                            .is_some_and(|k| k == "image" || k == "file")
                        && i["bytes"].is_u64()
                        && i["sha256"].is_string()
                })
            }),
            JsonType::PromptFrom => v["via"]
                .as_str()
                .is_some_and(|via| ["ipc", "ws", "relay"].contains(&via)),
            JsonType::Integer => v.is_i64() || v.is_u64(),
            JsonType::Number => v.is_number(),
            JsonType::Boolean => v.is_boolean(),
            JsonType::Any => true,
            JsonType::StringList => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
            JsonType::Truncated => v.is_object(),
        }
    }

    #[test]
    fn every_variant_has_exactly_one_row_of_its_class() {
        let table: Vec<&str> = EVENTS.iter().map(|e| e.kind).collect();
        let unique: BTreeSet<&str> = table.iter().copied().collect();
        assert_eq!(unique.len(), table.len(), "a kind has two rows");
        let derived: BTreeSet<&str> = serde_kinds().iter().copied().collect();
        assert!(
            !derived.is_empty(),
            "could not read the kinds from the derive"
        );
        assert_eq!(unique, derived, "the table's kinds and EventBody's differ");
        for row in EVENTS {
            let event: Event = serde_json::from_str(row.example)
                .unwrap_or_else(|e| panic!("{}: the example does not parse: {e}", row.kind));
            let (kind, fields) = documented(&event.body);
            assert_eq!(kind, row.kind, "the example of {} is a {kind}", row.kind);
            assert_eq!(event.kind(), row.kind);
            assert_eq!(event.class(), row.class, "{}: wrong class", row.kind);
            let named: BTreeSet<&str> = row.fields.iter().map(|f| f.name).collect();
            assert_eq!(named.len(), row.fields.len(), "{}: a field twice", row.kind);
            let derived: BTreeSet<&str> = fields.iter().copied().collect();
            assert_eq!(named, derived, "{}: documented vs serde fields", row.kind);
        }
    }

    #[test]
    fn examples_parse_and_use_only_documented_fields() {
        let common: BTreeSet<String> = COMMON.iter().map(|f| f.name.to_owned()).collect();
        for row in EVENTS {
            let example: Value = serde_json::from_str(row.example).unwrap();
            let mut allowed = common.clone();
            allowed.extend(row.fields.iter().map(|f| f.name.to_owned()));
            let have = keys(&example);
            assert!(
                have.is_subset(&allowed),
                "{}: undocumented keys {:?}",
                row.kind,
                have.difference(&allowed).collect::<Vec<_>>()
            );
            for f in COMMON.iter().chain(row.fields) {
                match example.get(f.name) {
                    Some(v) => assert!(
                        has_type(f.ty, v),
                        "{}.{}: not a {:?}",
                        row.kind,
                        f.name,
                        f.ty
                    ),
                    None => assert!(f.optional, "{}: the example lacks {}", row.kind, f.name),
                }
            }
            let event: Event = serde_json::from_value(example.clone()).unwrap();
            assert_eq!(event.kind(), row.kind);
            let back = serde_json::to_value(&event).unwrap();
            assert_eq!(keys(&back), have, "{}: re-serialized keys differ", row.kind);
            assert_eq!(back, example, "{}: the example is not canonical", row.kind);

            // Each optional field the example leaves out round-trips under its name and type.
            for f in row.fields.iter().filter(|f| example.get(f.name).is_none()) {
                let mut fuller = example.clone();
                fuller[f.name] = sample(f.ty);
                let event: Event = serde_json::from_value(fuller.clone())
                    .unwrap_or_else(|e| panic!("{}.{}: {e}", row.kind, f.name));
                let back = serde_json::to_value(&event).unwrap();
                assert_eq!(
                    back.get(f.name),
                    fuller.get(f.name),
                    "{}.{}",
                    row.kind,
                    f.name
                );
            }
        }
    }

    #[test]
    fn value_lists_come_from_the_enums() {
        let names = |rows: Vec<(&str, &str)>| -> Vec<String> {
            for (value, meaning) in &rows {
                assert!(!meaning.is_empty(), "{value} has no meaning");
            }
            rows.into_iter().map(|(v, _)| v.to_owned()).collect()
        };
        let states = names(values(session_state_meaning));
        let expected: Vec<String> = SessionState::ALL
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        assert_eq!(states, expected);
        assert_eq!(
            names(values(run_state_meaning)),
            ["completed", "failed", "cancelled", "interrupted"]
        );
        assert_eq!(names(values(error_category_meaning)).len(), 12);
        assert_eq!(serde_names::<Truncated>(), ["fullBytes", "keptBytes"]);
    }

    #[test]
    fn push_fields_are_the_protos() {
        // A struct literal without `..`: a new proto field does not compile until listed.
        let push = pb::EventPush {
            sequence_id: 1,
            message_id: "m".into(),
            session_id: "s".into(),
            run_id: "r".into(),
            is_delta: true,
            event_json: "{}".into(),
        };
        let proto = keys(&serde_json::to_value(&push).unwrap());
        let documented: BTreeSet<String> = PUSH
            .iter()
            .map(|(name, _, _)| {
                let mut camel = String::new();
                let mut upper = false;
                for c in name.chars() {
                    if c == '_' {
                        upper = true;
                    } else if upper {
                        camel.extend(c.to_uppercase());
                        upper = false;
                    } else {
                        camel.push(c);
                    }
                }
                camel
            })
            .collect();
        assert_eq!(documented, proto);
    }

    /// Every documented warning code is still written somewhere in `src/`.
    #[test]
    fn warning_codes_exist_in_the_source() {
        fn sources(dir: &std::path::Path, out: &mut String) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("event_reference.rs")
                {
                    out.push_str(&std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        let mut all = String::new();
        sources(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
            &mut all,
        );
        for (code, _) in WARNING_CODES {
            assert!(
                all.contains(&format!("\"{code}\"")),
                "warning code {code} is written nowhere in src/"
            );
        }
    }

    /// `docs/protocol.md`'s event section is rendered from this file. Run with
    /// `AGENT_HOST_BLESS=1` to rewrite it (only the part between the markers; the section is
    /// appended when the markers are missing).
    #[test]
    fn docs_protocol_md_event_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/protocol.md");
        let want = markdown();
        let section = |text: &str| -> Option<(usize, usize)> {
            let start = text.find(BEGIN)?;
            let end = text[start..].find(END)? + start + END.len();
            let end = if text[end..].starts_with('\n') {
                end + 1
            } else {
                end
            };
            Some((start, end))
        };
        let have = std::fs::read_to_string(path).unwrap_or_default();
        if std::env::var_os("AGENT_HOST_BLESS").is_some() {
            let updated = match section(&have) {
                Some((start, end)) => format!("{}{want}{}", &have[..start], &have[end..]),
                None => format!("{}\n\n{want}", have.trim_end_matches('\n')),
            };
            if updated != have {
                std::fs::write(path, &updated).unwrap();
            }
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        let current = section(&have).map(|(start, end)| &have[start..end]);
        assert!(
            current == Some(want.as_str()),
            "docs/protocol.md's event reference is stale: run \
             `AGENT_HOST_BLESS=1 cargo test --lib event_reference`"
        );
    }
}
