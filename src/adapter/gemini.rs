//! The Gemini CLI's one-shot stream-json mode (`gemini -o stream-json`, one process per turn,
//! the next turn resumed by id): [`GeminiCli`], the [`OneShotCli`] the driver in
//! `oneshot_process.rs` runs, and [`Translator`], a pure, stateful translator from the CLI's
//! stdout lines to canonical events (style 8). No I/O here.
//!
//! Facts (Gemini CLI 0.61.0, read in its source and confirmed by running it against a mock):
//! - A turn is `gemini --skip-trust -o stream-json --approval-mode <mode> [--model <m>]
//!   (--session-id <id> | --resume <id>)` with the prompt on stdin, which is then closed (a
//!   non-TTY stdin makes the CLI headless; it reads stdin to the end, up to 8 MiB, so a long
//!   prompt stays off the argv). `--session-id` (since 0.41) starts a new session with the
//!   host's id and refuses an id it has ("already exists", exit 42); `--resume` takes that
//!   uuid (or `latest`, or an index) and refuses an unknown one on stderr ("Error resuming
//!   session: Invalid session identifier …", exit 42) before printing anything.
//! - There is no permission round trip in this mode: a tool the policy would ask about is
//!   denied (its call fails "requires user confirmation, which is not supported in
//!   non-interactive mode", and `default` leaves such tools out of the model's list). The
//!   approval mode is the whole policy: [`ApprovalMode`]. `--skip-trust` trusts the workspace
//!   for the turn; without it every mode but `default` is overridden to `default`.
//! - SIGINT (to the group) makes the CLI run its exit cleanup and exit 0, without a `result`.
//!
//! Translation rules:
//! - `init` {session_id, model} names the native id: `session.bound`, once per id.
//! - `message` role `assistant` (`delta: true`) → `text.start` (first piece), `text.delta`;
//!   the block ends (`text.end`, the whole text) at the next tool frame, error, result or exit.
//!   The `user` echo of the prompt is the host's own `user.text` already: not repeated.
//! - `tool_use` {tool_name, tool_id, parameters} → `tool.call.start` + `tool.call.end` (the
//!   call arrives whole); `tool_result` {tool_id, status, output, error} → `tool.exec.start` +
//!   `tool.exec.end` (the CLI does not say when a tool starts, as with Claude's `Bash`).
//! - `error` {severity, message}: `warning` → `warning`; `error` → `error`.
//! - `result` `success` → `usage` (summed over `stats.models`) + `run.end` `completed`.
//!   `result` `error` → `usage` at once; its `error` + `run.end` `failed` wait for the exit,
//!   whose code carries the HTTP status for API errors (`status & 255`: 145 = 401,
//!   147 = 403, 173 = 429), which the message may not (a 429 says only "Please wait and try
//!   again later"). Categories: 429 / quota → `rate_limited`, 401 / 403 / exit 41 (no
//!   credentials) → `auth_required`, token limit → `context_exhausted`, else `agent_failed`.
//! - An exit without a `result` (`session::agent` has the rule): `run.end` `cancelled` after
//!   the host's interrupt; `transport_lost` "not sent" when the prompt could not be written to
//!   stdin; `resume_rejected` for a refused `--resume`; the category the exit or stderr names
//!   (`auth_required` for exit 41, …), or `agent_failed` for an exit before `init` (the CLI
//!   prints `init` before it calls the model: it refused the turn before it began); else — the
//!   CLI had the prompt and died or its stdout broke mid-turn — `result_delivery_unknown`,
//!   with the exit and stderr.
//! - Lines that are not JSON objects, and frame types this build does not know, are counted
//!   and skipped, never fatal.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::AdapterError;
use super::oneshot_process::{OneShotCli, OneShotTranslator, TurnCommand, TurnExit, TurnSession};
use crate::protocol::events::{
    BlockEnd, BlockStart, ErrorCategory, ErrorNotice, EventBody, Notice, RunEnd, RunState,
    SessionBound, TextDelta, ToolCallEnd, ToolCallStart, ToolExecEnd, ToolExecStart, Usage,
};

/// How the CLI treats tool calls that need approval, for the whole turn (`--approval-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApprovalMode {
    /// Only tools the policy allows without asking (reading, searching) run; shell, edits and
    /// other tools that would ask are denied.
    #[default]
    Default,
    /// Edits are approved as well; shell commands are still denied.
    AutoEdit,
    /// Every tool call is approved.
    Yolo,
    /// Read-only planning: no edits or commands outside the CLI's plan files.
    Plan,
}

impl ApprovalMode {
    /// The `--approval-mode` value.
    pub fn as_arg(self) -> &'static str {
        match self {
            ApprovalMode::Default => "default",
            ApprovalMode::AutoEdit => "auto_edit",
            ApprovalMode::Yolo => "yolo",
            ApprovalMode::Plan => "plan",
        }
    }
}

/// The Gemini CLI as a one-shot family: `oneshot_process::open(spec, GeminiCli::new(mode))`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GeminiCli {
    approval: ApprovalMode,
    model: Option<String>,
}

impl GeminiCli {
    pub fn new(approval: ApprovalMode) -> GeminiCli {
        GeminiCli {
            approval,
            model: None,
        }
    }

    /// Run every turn with this model (`--model`) instead of the CLI's `auto` routing.
    pub fn with_model(mut self, model: impl Into<String>) -> GeminiCli {
        self.model = Some(model.into());
        self
    }
}

/// The arguments of one turn (the prompt goes to stdin).
pub fn turn_args(
    approval: ApprovalMode,
    model: Option<&str>,
    session: TurnSession<'_>,
) -> Vec<String> {
    let mut args: Vec<String> = ["--skip-trust", "-o", "stream-json", "--approval-mode"]
        .map(str::to_owned)
        .to_vec();
    args.push(approval.as_arg().to_owned());
    if let Some(model) = model {
        args.push("--model".to_owned());
        args.push(model.to_owned());
    }
    match session {
        TurnSession::New(id) => {
            args.push("--session-id".to_owned());
            args.push(id.to_owned());
        }
        TurnSession::Resume(id) => {
            args.push("--resume".to_owned());
            args.push(id.to_owned());
        }
    }
    args
}

impl OneShotCli for GeminiCli {
    fn name(&self) -> &str {
        "gemini"
    }

    fn turn(&self, session: TurnSession<'_>, prompt: &str) -> TurnCommand {
        TurnCommand {
            args: turn_args(self.approval, self.model.as_deref(), session),
            stdin: Some(prompt.to_owned()),
        }
    }

    fn translator(&self) -> Box<dyn OneShotTranslator> {
        Box::new(Translator::new())
    }

    fn exists_already(&self, exit: &TurnExit<'_>) -> bool {
        exit.code == Some(EXIT_INPUT_ERROR)
            && exit
                .stderr
                .iter()
                .any(|l| l.contains("Error starting session") && l.contains("already exists"))
    }
}

/// `FATAL_AUTHENTICATION_ERROR`: no usable credentials (before the turn starts).
const EXIT_AUTH_ERROR: i32 = 41;
/// `FATAL_INPUT_ERROR`: bad input, e.g. a session id it refuses.
const EXIT_INPUT_ERROR: i32 = 42;
/// `FATAL_CANCELLATION_ERROR`.
const EXIT_CANCELLED: i32 = 130;

/// The category of a failure the CLI described: the error's type and message, and the exit
/// code when known (an API error exits with its HTTP status, modulo 256).
fn category_of(kind: &str, message: &str, code: Option<i32>) -> ErrorCategory {
    match code {
        Some(c) if c == 429 % 256 => return ErrorCategory::RateLimited,
        Some(c) if c == 401 % 256 || c == 403 % 256 || c == EXIT_AUTH_ERROR => {
            return ErrorCategory::AuthRequired;
        }
        Some(EXIT_CANCELLED) => return ErrorCategory::Cancelled,
        _ => {}
    }
    let lower = message.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
    if kind == "FatalCancellationError" {
        ErrorCategory::Cancelled
    } else if kind.contains("Quota")
        || has(&[
            "\"code\":429",
            "resource_exhausted",
            "status: 429",
            "please wait and try again later",
            "possible quota limitations",
        ])
    {
        ErrorCategory::RateLimited
    } else if matches!(
        kind,
        "UnauthorizedError"
            | "ForbiddenError"
            | "AccountSuspendedError"
            | "FatalAuthenticationError"
    ) || has(&[
        "\"code\":401",
        "\"code\":403",
        "unauthenticated",
        "permission_denied",
        "api key not valid",
    ]) {
        ErrorCategory::AuthRequired
    } else if has(&[
        "exceeds the maximum number of tokens",
        "context window",
        "prompt is too long",
    ]) {
        ErrorCategory::ContextExhausted
    } else {
        // "[API Error: terminated]": the model's stream was cut.
        super::categories::refine(ErrorCategory::AgentFailed, message)
    }
}

/// An error `result`, held until the exit says more.
#[derive(Debug)]
struct Failure {
    kind: String,
    message: String,
}

#[derive(Debug)]
struct OpenText {
    item_id: String,
    text: String,
}

/// From stdout lines to canonical event bodies; the session layer adds `sessionId` and
/// `runId`.
#[derive(Debug, Default)]
pub struct Translator {
    native_id: Option<String>,
    run_id: String,
    /// Blocks opened in this turn (for item ids).
    blocks: u64,
    text: Option<OpenText>,
    /// Tool names by call id, until the tool's result arrives.
    tool_names: HashMap<String, String>,
    /// This turn's `init` came (the CLI accepted its session).
    init_seen: bool,
    /// This turn's `run.end` is out.
    ended: bool,
    /// This turn's error `result`, ended at the exit.
    failure: Option<Failure>,
    /// The last `error` frame of this turn (what an error `result` without a message meant).
    last_error: Option<String>,
    skipped: u64,
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl Translator {
    pub fn new() -> Translator {
        Translator::default()
    }

    /// A turn begins (a new process).
    pub fn start_turn(&mut self, run_id: &str) {
        self.run_id = run_id.to_owned();
        self.blocks = 0;
        self.text = None;
        self.tool_names.clear();
        self.init_seen = false;
        self.ended = false;
        self.failure = None;
        self.last_error = None;
    }

    /// The native session id the CLI last named.
    pub fn native_id(&self) -> Option<&str> {
        self.native_id.as_deref()
    }

    /// Lines skipped: not JSON objects, or a frame type this build does not know.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    pub fn on_stdout_line(&mut self, line: &[u8]) -> Vec<EventBody> {
        let frame = match serde_json::from_slice::<Value>(line) {
            Ok(frame @ Value::Object(_)) => frame,
            _ => {
                self.skip(line);
                return Vec::new();
            }
        };
        match str_of(&frame, "type") {
            "init" => self.on_init(&frame),
            "message" => match str_of(&frame, "role") {
                "assistant" => self.on_text(str_of(&frame, "content")),
                // The prompt echoed: the host published it as `user.text`.
                "user" => Vec::new(),
                _ => {
                    self.skip(line);
                    Vec::new()
                }
            },
            "tool_use" => self.on_tool_use(&frame),
            "tool_result" => self.on_tool_result(&frame),
            "error" => self.on_error(&frame),
            "result" => self.on_result(&frame),
            _ => {
                self.skip(line);
                Vec::new()
            }
        }
    }

    /// The turn's process ended: close what is open; unless its `result` ended the run, end it
    /// as the exit says.
    pub fn on_exit(&mut self, exit: &TurnExit<'_>) -> Vec<EventBody> {
        let mut out = self.close_text();
        if self.ended {
            return out;
        }
        self.ended = true;
        if let Some(failure) = self.failure.take() {
            let category = if exit.interrupted {
                ErrorCategory::Cancelled
            } else {
                category_of(&failure.kind, &failure.message, exit.code)
            };
            let shown = self.last_error.as_deref() == Some(failure.message.as_str());
            out.extend(failed(category, failure.message, shown));
            return out;
        }
        if exit.interrupted {
            out.push(EventBody::RunEnd(RunEnd {
                state: RunState::Cancelled,
                category: Some(ErrorCategory::Cancelled),
                message: None,
            }));
            return out;
        }
        if !exit.prompt_sent {
            // The CLI never had the whole prompt: nothing of it ran.
            let why = format!(
                "the prompt could not be written to the agent's stdin ({})",
                exit.status
            );
            out.extend(AdapterError::prompt_not_sent(why).run_failed());
            return out;
        }
        let refused = matches!(exit.session, TurnSession::Resume(_)) && !self.init_seen;
        let refusal = exit
            .stderr
            .iter()
            .find(|l| l.contains("Error resuming session"))
            .filter(|_| refused);
        if let Some(line) = refusal {
            // `--resume` of an id the CLI has no session for: nothing ran, the id is not ours.
            out.extend(failed(
                ErrorCategory::ResumeRejected,
                line.trim().to_owned(),
                false,
            ));
            return out;
        }
        let stderr = exit.stderr.join("\n");
        let reported = if self.init_seen {
            // Mid-turn, words on stderr may be left from an earlier retry: only the CLI's own
            // exit codes for an API failure say it reported one.
            match exit.code {
                Some(41 | 145 | 147) => ErrorCategory::AuthRequired,
                Some(173) => ErrorCategory::RateLimited,
                _ => ErrorCategory::AgentFailed,
            }
        } else {
            match category_of("", &stderr, exit.code) {
                // A code of its own is not a category here: only what the exit shows.
                ErrorCategory::Cancelled => ErrorCategory::AgentFailed,
                other => other,
            }
        };
        if (!self.init_seen && !exit.stdout_lost) || reported != ErrorCategory::AgentFailed {
            // The CLI refused the turn before it began (it prints `init` before it calls the
            // model), or its exit or stderr names the cause: that is its report.
            let what = format!(
                "the agent process exited without a result ({})",
                exit.status
            );
            out.extend(failed(reported, what, false));
        } else {
            // It had the prompt and went away mid-turn: what it did is not known.
            let why = if exit.stdout_lost {
                format!("the agent's output broke off mid-turn ({})", exit.status)
            } else {
                format!("the agent process exited mid-turn ({})", exit.status)
            };
            let error = AdapterError::result_unknown(why);
            out.extend(failed(error.category, error.message, false));
        }
        out
    }

    fn skip(&mut self, line: &[u8]) {
        self.skipped += 1;
        let head: String = String::from_utf8_lossy(line).chars().take(120).collect();
        tracing::debug!(skipped = self.skipped, line = %head, "gemini: skipped a stdout line");
    }

    fn on_init(&mut self, frame: &Value) -> Vec<EventBody> {
        self.init_seen = true;
        let id = str_of(frame, "session_id");
        if id.is_empty() || self.native_id.as_deref() == Some(id) {
            return Vec::new();
        }
        self.native_id = Some(id.to_owned());
        vec![EventBody::SessionBound(SessionBound {
            native_session_id: id.to_owned(),
        })]
    }

    fn on_text(&mut self, piece: &str) -> Vec<EventBody> {
        if piece.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let open = match self.text.as_mut() {
            Some(open) => open,
            None => {
                self.blocks += 1;
                let item_id = format!("{}:{}", self.run_id, self.blocks);
                out.push(EventBody::TextStart(BlockStart {
                    item_id: Some(item_id.clone()),
                }));
                self.text.insert(OpenText {
                    item_id,
                    text: String::new(),
                })
            }
        };
        open.text.push_str(piece);
        out.push(EventBody::TextDelta(TextDelta {
            item_id: Some(open.item_id.clone()),
            text: piece.to_owned(),
        }));
        out
    }

    fn close_text(&mut self) -> Vec<EventBody> {
        match self.text.take() {
            Some(open) => vec![EventBody::TextEnd(BlockEnd {
                item_id: Some(open.item_id),
                text: open.text,
                truncated: None,
                imported: false,
            })],
            None => Vec::new(),
        }
    }

    fn on_tool_use(&mut self, frame: &Value) -> Vec<EventBody> {
        let mut out = self.close_text();
        let call_id = str_of(frame, "tool_id").to_owned();
        let name = str_of(frame, "tool_name").to_owned();
        self.tool_names.insert(call_id.clone(), name.clone());
        out.push(EventBody::ToolCallStart(ToolCallStart {
            call_id: call_id.clone(),
            name: name.clone(),
        }));
        out.push(EventBody::ToolCallEnd(ToolCallEnd {
            call_id,
            name,
            input: frame
                .get("parameters")
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or_else(|| json!({})),
            truncated: None,
        }));
        out
    }

    fn on_tool_result(&mut self, frame: &Value) -> Vec<EventBody> {
        let mut out = self.close_text();
        let call_id = str_of(frame, "tool_id").to_owned();
        let is_error = str_of(frame, "status") == "error";
        let output = match frame.get("output").and_then(Value::as_str) {
            Some(output) => output.to_owned(),
            None => frame
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        out.push(EventBody::ToolExecStart(ToolExecStart {
            call_id: call_id.clone(),
            name: self.tool_names.remove(&call_id),
        }));
        out.push(EventBody::ToolExecEnd(ToolExecEnd {
            call_id,
            output,
            is_error,
            // The stream gives the tool's display output only, not a command's exit code.
            exit_code: None,
            truncated: None,
        }));
        out
    }

    fn on_error(&mut self, frame: &Value) -> Vec<EventBody> {
        let mut out = self.close_text();
        let message = str_of(frame, "message").to_owned();
        if str_of(frame, "severity") == "warning" {
            out.push(EventBody::Warning(Notice {
                code: "agent_warning".to_owned(),
                message,
            }));
        } else {
            out.push(EventBody::Error(ErrorNotice {
                category: category_of("", &message, None),
                message: message.clone(),
            }));
            self.last_error = Some(message);
        }
        out
    }

    fn on_result(&mut self, frame: &Value) -> Vec<EventBody> {
        let mut out = self.close_text();
        if self.ended || self.failure.is_some() {
            // One result per turn; a second one is not the protocol.
            self.skipped += 1;
            return out;
        }
        if let Some(stats) = frame.get("stats").filter(|s| s.is_object()) {
            out.push(EventBody::Usage(usage_of(stats)));
        }
        if str_of(frame, "status") == "success" {
            self.ended = true;
            out.push(EventBody::RunEnd(RunEnd {
                state: RunState::Completed,
                category: None,
                message: None,
            }));
            return out;
        }
        let error = frame.get("error").unwrap_or(&Value::Null);
        let message = match str_of(error, "message") {
            "" => self.last_error.clone().unwrap_or_else(|| {
                format!("the turn ended with status {:?}", str_of(frame, "status"))
            }),
            message => message.to_owned(),
        };
        // Its category may need the exit code: the run ends at the exit (moments later).
        self.failure = Some(Failure {
            kind: str_of(error, "type").to_owned(),
            message,
        });
        out
    }
}

/// `error` (unless one with this message was shown already) + `run.end` failed, or only a
/// `cancelled` `run.end`.
fn failed(category: ErrorCategory, message: String, shown: bool) -> Vec<EventBody> {
    if category == ErrorCategory::Cancelled {
        return vec![EventBody::RunEnd(RunEnd {
            state: RunState::Cancelled,
            category: Some(category),
            message: Some(message),
        })];
    }
    let mut out = Vec::new();
    if !shown {
        out.push(EventBody::Error(ErrorNotice {
            category,
            message: message.clone(),
        }));
    }
    out.push(EventBody::RunEnd(RunEnd {
        state: RunState::Failed,
        category: Some(category),
        message: Some(message),
    }));
    out
}

/// Usage from `result.stats`: summed over its models (the router's calls count too), or its
/// totals when it names none. Input includes cached input, as the API counts it.
fn usage_of(stats: &Value) -> Usage {
    let n = |v: &Value, key: &str| v.get(key).and_then(Value::as_u64).unwrap_or(0);
    let models: Vec<&Value> = stats
        .get("models")
        .and_then(Value::as_object)
        .map(|m| m.values().collect())
        .unwrap_or_default();
    let sum = |key: &str| {
        if models.is_empty() {
            n(stats, key)
        } else {
            models
                .iter()
                .fold(0u64, |acc, m| acc.saturating_add(n(m, key)))
        }
    };
    Usage {
        input_tokens: sum("input_tokens"),
        output_tokens: sum("output_tokens"),
        cached_input_tokens: Some(sum("cached")),
        cost_usd: None,
    }
}

impl OneShotTranslator for Translator {
    fn start_turn(&mut self, run_id: &str) {
        Translator::start_turn(self, run_id);
    }

    fn on_stdout_line(&mut self, line: &[u8]) -> Vec<EventBody> {
        Translator::on_stdout_line(self, line)
    }

    fn on_exit(&mut self, exit: &TurnExit<'_>) -> Vec<EventBody> {
        Translator::on_exit(self, exit)
    }

    fn native_id(&self) -> Option<&str> {
        Translator::native_id(self)
    }

    fn skipped(&self) -> u64 {
        Translator::skipped(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays one recorded turn (the transcript record format) into a translator: `out`
    /// lines are its stdout, `stderr` lines its stderr, the `exited rc=N` note its exit.
    struct Replay {
        t: Translator,
        stderr: Vec<String>,
        resume: Option<String>,
        interrupted: bool,
    }

    impl Replay {
        fn new() -> Replay {
            let mut t = Translator::new();
            t.start_turn("run-1");
            Replay {
                t,
                stderr: Vec::new(),
                resume: None,
                interrupted: false,
            }
        }

        fn record(&mut self, line: &str) -> Vec<EventBody> {
            let record: Value = serde_json::from_str(line).unwrap();
            let text = record["text"].as_str().unwrap_or_default();
            match record["dir"].as_str().unwrap() {
                "out" => match record.get("msg") {
                    Some(msg) => self.t.on_stdout_line(msg.to_string().as_bytes()),
                    None => self
                        .t
                        .on_stdout_line(record["raw"].as_str().unwrap().as_bytes()),
                },
                "stderr" => {
                    self.stderr.push(text.to_owned());
                    Vec::new()
                }
                "note" if text.starts_with("spawned:") => {
                    let mut words = text.split_whitespace();
                    self.resume = words
                        .by_ref()
                        .find(|w| *w == "--resume")
                        .and_then(|_| words.next())
                        .map(str::to_owned);
                    Vec::new()
                }
                "note" if text.starts_with("sent SIGINT") => {
                    self.interrupted = true;
                    Vec::new()
                }
                "note" if text.starts_with("exited rc=") => {
                    let rc: i32 = text["exited rc=".len()..].parse().unwrap();
                    let code = (rc >= 0).then_some(rc);
                    // As the driver describes it: the exit, and the last stderr line.
                    let raw = if rc >= 0 { rc << 8 } else { -rc };
                    let status = super::super::spawn::describe_exit(
                        std::os::unix::process::ExitStatusExt::from_raw(raw),
                        &self.stderr,
                    );
                    let session = match &self.resume {
                        Some(id) => TurnSession::Resume(id),
                        None => TurnSession::New("host-chosen"),
                    };
                    let stderr = self.stderr.clone();
                    self.t.on_exit(&TurnExit {
                        code,
                        status: &status,
                        interrupted: self.interrupted,
                        stdout_lost: false,
                        prompt_sent: true,
                        stderr: &stderr,
                        session,
                    })
                }
                _ => Vec::new(),
            }
        }
    }

    /// Every transcript in `fixtures/gemini/*.jsonl` beside its expected events
    /// (`*.events.json`). `AGENT_HOST_BLESS=1` rewrites the expectations for review.
    #[test]
    fn fixtures_translate_to_their_expected_events() {
        let checked =
            super::super::fixtures::check_all("gemini", Replay::new, |r, line| r.record(line));
        assert!(checked >= 15, "only {checked} fixtures");
    }

    fn kinds(events: &[EventBody]) -> Vec<&'static str> {
        events.iter().map(EventBody::kind).collect()
    }

    fn exit<'a>(code: Option<i32>, stderr: &'a [String]) -> TurnExit<'a> {
        TurnExit {
            code,
            status: "exit status: 1",
            interrupted: false,
            stdout_lost: false,
            prompt_sent: true,
            stderr,
            session: TurnSession::New("n"),
        }
    }

    fn run_end(events: &[EventBody]) -> &RunEnd {
        match events.last() {
            Some(EventBody::RunEnd(end)) => end,
            other => panic!("not a run.end: {other:?}"),
        }
    }

    #[test]
    fn every_run_ends_once_with_the_right_category() {
        let result_error = |message: &str| {
            json!({"type": "result", "status": "error",
                   "error": {"type": "unknown", "message": message}})
            .to_string()
        };
        let cases = [
            (
                "[API Error: x]\nPlease wait and try again later.",
                None,
                ErrorCategory::RateLimited,
            ),
            (
                "[API Error: mock error]",
                Some(173),
                ErrorCategory::RateLimited,
            ),
            (
                r#"[API Error: {"error":{"code":401}}]"#,
                None,
                ErrorCategory::AuthRequired,
            ),
            (
                "[API Error: mock error]",
                Some(147),
                ErrorCategory::AuthRequired,
            ),
            (
                "The input token count (2000000) exceeds the maximum number of tokens allowed",
                Some(1),
                ErrorCategory::ContextExhausted,
            ),
            (
                r#"[API Error: {"error":{"code":500}}]"#,
                Some(244),
                ErrorCategory::AgentFailed,
            ),
        ];
        for (message, code, want) in cases {
            let mut t = Translator::new();
            t.start_turn("r");
            let out = t.on_stdout_line(result_error(message).as_bytes());
            assert!(out.is_empty(), "{out:?}");
            let out = t.on_exit(&exit(code, &[]));
            assert_eq!(kinds(&out), ["error", "run.end"], "{message}");
            assert_eq!(run_end(&out).category, Some(want), "{message}");
            assert!(t.on_exit(&exit(code, &[])).is_empty(), "a second end");
        }
    }

    #[test]
    fn an_exit_without_a_result_fails_or_is_cancelled() {
        let mut t = Translator::new();
        t.start_turn("r");
        t.on_stdout_line(br#"{"type":"message","role":"assistant","content":"par","delta":true}"#);
        // Its stdout broke after it had the prompt: what it did is unknown.
        let out = t.on_exit(&TurnExit {
            stdout_lost: true,
            ..exit(None, &[])
        });
        assert_eq!(kinds(&out), ["text.end", "error", "run.end"]);
        assert_eq!(
            run_end(&out).category,
            Some(ErrorCategory::ResultDeliveryUnknown)
        );

        // Killed after `init` (the turn began) with nothing said: unknown too.
        t.start_turn("r1");
        t.on_stdout_line(br#"{"type":"init","session_id":"s1","model":"auto"}"#);
        let out = t.on_exit(&TurnExit {
            status: "signal: 9 (SIGKILL)",
            ..exit(None, &[])
        });
        let end = run_end(&out);
        assert_eq!(end.category, Some(ErrorCategory::ResultDeliveryUnknown));
        assert!(
            end.message
                .as_deref()
                .unwrap_or_default()
                .contains("SIGKILL"),
            "{end:?}"
        );

        // The prompt never went in: not sent, safe to send again.
        t.start_turn("r1b");
        let out = t.on_exit(&TurnExit {
            prompt_sent: false,
            ..exit(Some(1), &[])
        });
        assert_eq!(kinds(&out), ["error", "run.end"]);
        let end = run_end(&out);
        assert_eq!(end.category, Some(ErrorCategory::TransportLost));
        assert!(
            end.message
                .as_deref()
                .unwrap_or_default()
                .contains("not sent"),
            "{end:?}"
        );

        t.start_turn("r2");
        let out = t.on_exit(&exit(Some(41), &["no key".to_owned()]));
        assert_eq!(run_end(&out).category, Some(ErrorCategory::AuthRequired));

        t.start_turn("r3");
        let out = t.on_exit(&TurnExit {
            interrupted: true,
            ..exit(Some(0), &[])
        });
        assert_eq!(kinds(&out), ["run.end"]);
        assert_eq!(run_end(&out).state, RunState::Cancelled);

        // A refused resume only counts when the CLI never accepted the session.
        let stderr = ["Error resuming session: Invalid session identifier \"x\".".to_owned()];
        t.start_turn("r4");
        let out = t.on_exit(&TurnExit {
            session: TurnSession::Resume("x"),
            ..exit(Some(42), &stderr)
        });
        assert_eq!(run_end(&out).category, Some(ErrorCategory::ResumeRejected));
        t.start_turn("r5");
        let out = t.on_exit(&TurnExit {
            session: TurnSession::New("x"),
            ..exit(Some(42), &stderr)
        });
        assert_eq!(run_end(&out).category, Some(ErrorCategory::AgentFailed));
    }

    #[test]
    fn session_bound_once_per_id_and_item_ids_per_run() {
        let mut t = Translator::new();
        let init = br#"{"type":"init","session_id":"s1","model":"auto"}"#;
        t.start_turn("r1");
        assert_eq!(kinds(&t.on_stdout_line(init)), ["session.bound"]);
        let text = br#"{"type":"message","role":"assistant","content":"a","delta":true}"#;
        match t.on_stdout_line(text).first() {
            Some(EventBody::TextStart(start)) => assert_eq!(start.item_id.as_deref(), Some("r1:1")),
            other => panic!("{other:?}"),
        }
        t.on_stdout_line(br#"{"type":"result","status":"success"}"#);
        t.start_turn("r2");
        assert!(t.on_stdout_line(init).is_empty());
        assert_eq!(t.native_id(), Some("s1"));
        match t.on_stdout_line(text).first() {
            Some(EventBody::TextStart(start)) => assert_eq!(start.item_id.as_deref(), Some("r2:1")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn usage_sums_the_models_and_survives_huge_counts() {
        let stats = json!({"input_tokens": 1, "models": {
            "a": {"input_tokens": 10, "output_tokens": 1, "cached": 2},
            "b": {"input_tokens": u64::MAX, "output_tokens": 2, "cached": 3}}});
        let usage = usage_of(&stats);
        assert_eq!(usage.input_tokens, u64::MAX);
        assert_eq!(usage.output_tokens, 3);
        assert_eq!(usage.cached_input_tokens, Some(5));
        let totals = usage_of(&json!({"input_tokens": 4, "output_tokens": 5, "cached": 1}));
        assert_eq!((totals.input_tokens, totals.output_tokens), (4, 5));
    }

    #[test]
    fn the_argv_carries_the_session_and_policy_and_the_prompt_goes_to_stdin() {
        let cli = GeminiCli::new(ApprovalMode::Yolo).with_model("gemini-3.8-flash");
        let new = cli.turn(TurnSession::New("u1"), "a long prompt");
        assert_eq!(
            new.args,
            [
                "--skip-trust",
                "-o",
                "stream-json",
                "--approval-mode",
                "yolo",
                "--model",
                "gemini-3.8-flash",
                "--session-id",
                "u1"
            ]
        );
        assert_eq!(new.stdin.as_deref(), Some("a long prompt"));
        let resume = GeminiCli::new(ApprovalMode::AutoEdit).turn(TurnSession::Resume("u1"), "p");
        assert_eq!(resume.args[4], "auto_edit");
        assert_eq!(resume.args[resume.args.len() - 2..], ["--resume", "u1"]);
        assert!(!resume.args.iter().any(|a| a == "p" || a == "-p"));
        let exists = ["Error starting session: Session ID \"u1\" already exists. Use --resume to resume it, or provide a different ID.".to_owned()];
        assert!(cli.exists_already(&exit(Some(42), &exists)));
        assert!(!cli.exists_already(&exit(Some(1), &exists)));
    }
}
