//! The interactive follower's view model: canonical events and command replies in, styled
//! lines and command envelopes out. Pure — no terminal, no I/O, no clock: the terminal loop
//! (`tui.rs`) feeds it and draws what it says, and every behaviour here is unit-tested as data.
//!
//! What it keeps: the transcript (prompts with who sent them, streamed text and thinking
//! blocks, tool calls folded to one line, permission requests and their answers, run ends,
//! notices), and per session its state, current run, queue and pending permissions. Text from
//! the wire is made [`visible`](super::visible) before it is kept, so nothing an agent prints
//! can drive the terminal.

use std::collections::{BTreeMap, HashMap, HashSet};

use ratatui::style::{Color, Style};
use serde_json::{Value, json};

use super::keys::{Action, Answer};
use crate::protocol::envelope::Reply;

mod lines;

use lines::queue_label;
#[cfg(test)]
use lines::wrap;

/// Transcript entries kept; older ones scroll away for good.
const MAX_ENTRIES: usize = 2000;

/// The tone of a line: its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Dim,
    Good,
    Warn,
    Bad,
    Accent,
}

impl Tone {
    pub fn style(self) -> Style {
        match self {
            Tone::Dim => Style::default().fg(Color::DarkGray),
            Tone::Good => Style::default().fg(Color::Green),
            Tone::Warn => Style::default().fg(Color::Yellow),
            Tone::Bad => Style::default().fg(Color::Red),
            Tone::Accent => Style::default().fg(Color::Cyan),
        }
    }
}

/// One choice a permission request offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub id: String,
    pub label: String,
    /// `allow_once`, `allow_always`, `reject_once`, `reject_always`, or empty when the host
    /// gave bare option names.
    pub kind: String,
    /// The rule an allow-always option keeps, in words.
    pub rule: String,
}

/// A permission request waiting for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub request_id: String,
    pub tool: String,
    pub input: String,
    pub choices: Vec<Choice>,
}

/// A prompt waiting in a session's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub run_id: String,
    pub text: String,
}

/// What the follower knows of one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStatus {
    /// `idle`, `running`, `waiting` (empty until known).
    pub state: String,
    pub run_id: Option<String>,
    pub queue: Vec<Queued>,
    /// Oldest first.
    pub pending: Vec<Pending>,
    pub agent: Option<String>,
    pub title: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Entry {
    /// A run started or ended.
    Mark {
        session: String,
        text: String,
        tone: Tone,
    },
    Prompt {
        session: String,
        who: String,
        text: String,
        steer: bool,
    },
    Block {
        session: String,
        thinking: bool,
        text: String,
        open: bool,
    },
    Tool {
        session: String,
        call_id: String,
        name: String,
        input: String,
        output: String,
        done: bool,
        is_error: bool,
        exit_code: Option<i64>,
        expanded: bool,
    },
    Permission {
        session: String,
        request_id: String,
        tool: String,
        input: String,
        answer: Option<String>,
    },
    Notice {
        session: Option<String>,
        text: String,
        tone: Tone,
    },
}

impl Entry {
    fn session(&self) -> Option<&str> {
        match self {
            Entry::Mark { session, .. }
            | Entry::Prompt { session, .. }
            | Entry::Block { session, .. }
            | Entry::Tool { session, .. }
            | Entry::Permission { session, .. } => Some(session),
            Entry::Notice { session, .. } => session.as_deref(),
        }
    }
}

/// Why a command was sent: how its reply is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose {
    Send,
    Steer,
    Cancel,
    Answer,
    Fork,
    QueueRemove,
    QueueClear,
    /// `session.get` of this session: its state and queue.
    Status(String),
    /// `permission.list`: the pending requests.
    Pending,
}

/// A command for the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub command: &'static str,
    pub params: Value,
    pub purpose: Purpose,
}

/// What the loop does after an action.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Redraw (or nothing changed).
    Nothing,
    Request(Outgoing),
    Quit,
}

/// The view model.
#[derive(Debug)]
pub struct View {
    /// The session followed; `None`: every session, and each line is labelled with its own.
    followed: Option<String>,
    /// A prefix for the `client_msg_id`s of prompts sent from here (`follow-<tag>-<n>`).
    tag: String,
    sent: u64,
    entries: Vec<Entry>,
    /// Entry index of each session's open text or thinking block.
    open_block: HashMap<String, usize>,
    /// Entry index of each (session, call id) tool.
    tools: HashMap<(String, String), usize>,
    sessions: BTreeMap<String, SessionStatus>,
    /// The `client_msg_id`s this follower sent.
    mine: HashSet<String>,
    /// This follower's subscriber: a prompt `from` it is "you".
    subscriber_id: Option<String>,
    /// The tool entry selected with Tab.
    selected: Option<usize>,
    /// `/tools`: every tool unfolded.
    expand_all: bool,
    /// Lines scrolled back from the bottom (0: follow the stream).
    pub scroll_back: usize,
    /// The connection, as the status bar says it.
    pub connection: String,
    /// Following all sessions: the session commands go to, chosen by the user (`/to`,
    /// Ctrl-N / Ctrl-P) and never changed behind their back.
    chosen: Option<String>,
}

/// A JSON field as text.
fn field<'a>(event: &'a Value, key: &str) -> &'a str {
    event.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Text from the wire, safe to draw: control characters shown, tabs as spaces.
pub fn clean(text: &str) -> String {
    super::visible(text).replace('\t', "    ")
}

/// One line of `text`, at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

/// A tool input for one line: a shell command as itself, anything else as JSON.
fn input_text(input: &Value) -> String {
    match input {
        Value::Null => String::new(),
        Value::String(s) => clean(s),
        Value::Object(map) => map
            .get("command")
            .and_then(Value::as_str)
            .map_or_else(|| clean(&input.to_string()), clean),
        other => clean(&other.to_string()),
    }
}

/// Whether a choice is the request's allow-always option.
fn is_always(c: &Choice) -> bool {
    c.kind == "allow_always" || (c.kind.is_empty() && c.id == "allow_always")
}

/// The last 8 characters of an id: the host's ids are UUIDv7, whose first ones are the
/// time and the same for every id of a minute.
fn short_id(id: &str) -> &str {
    id.get(id.len().saturating_sub(8)..).unwrap_or(id)
}

/// The options of a `permission.request` (or a `permission.list` row): objects
/// `{id, label, kind}`, or bare names from a host that sends those.
pub fn choices(options: Option<&Value>) -> Vec<Choice> {
    let Some(options) = options.and_then(Value::as_array) else {
        return Vec::new();
    };
    options
        .iter()
        .filter_map(|o| match o {
            Value::String(name) => Some(Choice {
                id: name.clone(),
                label: name.clone(),
                kind: String::new(),
                rule: String::new(),
            }),
            Value::Object(_) => {
                let id = field(o, "id");
                if id.is_empty() {
                    return None;
                }
                let label = field(o, "label");
                Some(Choice {
                    id: id.to_owned(),
                    label: clean(if label.is_empty() { id } else { label }),
                    kind: field(o, "kind").to_owned(),
                    rule: clean(field(o, "rule")),
                })
            }
            _ => None,
        })
        .collect()
}

/// The queue of a `queue.changed` event (`runId`) or a `session.get` reply (`run_id`).
fn queue_of(items: &Value) -> Vec<Queued> {
    items
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| {
            let run = item
                .get("runId")
                .or_else(|| item.get("run_id"))
                .and_then(Value::as_str)?;
            Some(Queued {
                run_id: run.to_owned(),
                text: clean(field(item, "text")),
            })
        })
        .collect()
}

impl View {
    /// A view of `followed` (`None`: every session); `tag` makes this follower's prompt ids
    /// unique (a random string in the binary, a fixed one in tests).
    pub fn new(followed: Option<String>, tag: &str) -> View {
        View {
            followed,
            tag: tag.to_owned(),
            sent: 0,
            entries: Vec::new(),
            open_block: HashMap::new(),
            tools: HashMap::new(),
            sessions: BTreeMap::new(),
            mine: HashSet::new(),
            subscriber_id: None,
            selected: None,
            expand_all: false,
            scroll_back: 0,
            connection: "connecting…".to_owned(),
            chosen: None,
        }
    }

    /// The session commands go to: the followed one, else the one the user chose.
    pub fn target(&self) -> Option<&str> {
        self.followed.as_deref().or(self.chosen.as_deref())
    }

    /// The status of the target session.
    pub fn target_status(&self) -> Option<&SessionStatus> {
        self.target().and_then(|s| self.sessions.get(s))
    }

    /// The permission request `y`/`n`/`a` answer: the target session's oldest, with its
    /// session. Another session's request is never answered by a key (see [`View::elsewhere`]).
    pub fn pending(&self) -> Option<(&str, &Pending)> {
        let target = self.target()?;
        self.sessions
            .get(target)
            .and_then(|s| s.pending.first())
            .map(|p| (target, p))
    }

    /// Following all sessions: the oldest request of a session other than the target (the
    /// panel says how to answer it: make its session the target).
    pub fn elsewhere(&self) -> Option<(&str, &Pending)> {
        let target = self.target();
        self.sessions
            .iter()
            .filter(|(id, _)| Some(id.as_str()) != target)
            .find_map(|(id, s)| s.pending.first().map(|p| (id.as_str(), p)))
    }

    /// The allow-always option of the pending request, if it offers one.
    pub fn always_choice(&self) -> Option<&Choice> {
        self.pending()
            .and_then(|(_, p)| p.choices.iter().find(|c| is_always(c)))
    }

    /// Whether the target session runs a turn.
    pub fn running(&self) -> bool {
        self.target_status()
            .is_some_and(|s| s.run_id.is_some() || s.state == "running" || s.state == "waiting")
    }

    pub fn tool_selected(&self) -> bool {
        self.selected.is_some()
    }

    /// Commands to learn the state of the session(s) after (re)connecting.
    pub fn on_connected(&mut self) -> Vec<Outgoing> {
        self.connection = "connected".to_owned();
        // A (re)joined subscriber gets each still-open block's content from its start in one
        // coalesced delta (the host's "joining mid-block" rule): what was streamed before the
        // drop is dropped here, so the block is not shown twice.
        for &i in self.open_block.values() {
            if let Some(Entry::Block { text, .. }) = self.entries.get_mut(i) {
                text.clear();
            }
        }
        for entry in &mut self.entries {
            if let Entry::Tool {
                output,
                done: false,
                ..
            } = entry
            {
                output.clear();
            }
        }
        let mut out = Vec::new();
        if let Some(session) = self.followed.clone() {
            out.push(Outgoing {
                command: "session.get",
                params: json!({"session_id": session}),
                purpose: Purpose::Status(session.clone()),
            });
            out.push(Outgoing {
                command: "permission.list",
                params: json!({"session_id": session}),
                purpose: Purpose::Pending,
            });
        } else {
            out.push(Outgoing {
                command: "permission.list",
                params: json!({}),
                purpose: Purpose::Pending,
            });
        }
        out
    }

    fn status_mut(&mut self, session: &str) -> &mut SessionStatus {
        self.sessions.entry(session.to_owned()).or_default()
    }

    fn push(&mut self, entry: Entry) -> usize {
        if self.entries.len() >= MAX_ENTRIES {
            // Drop the oldest tenth, and move every index kept past them.
            let cut = MAX_ENTRIES / 10;
            self.entries.drain(..cut);
            self.open_block.retain(|_, i| *i >= cut);
            self.open_block.values_mut().for_each(|i| *i -= cut);
            self.tools.retain(|_, i| *i >= cut);
            self.tools.values_mut().for_each(|i| *i -= cut);
            self.selected = self.selected.and_then(|i| i.checked_sub(cut));
        }
        self.entries.push(entry);
        self.entries.len() - 1
    }

    /// A line of the follower's own (not of any session).
    pub fn note(&mut self, tone: Tone, text: impl Into<String>) {
        self.notice(None, tone, text);
    }

    fn notice(&mut self, session: Option<&str>, tone: Tone, text: impl Into<String>) {
        self.push(Entry::Notice {
            session: session.map(str::to_owned),
            text: text.into(),
            tone,
        });
    }

    /// The subscriber this follower connects as (its prompts' `from.subscriberId`).
    pub fn set_subscriber(&mut self, subscriber_id: &str) {
        self.subscriber_id = Some(subscriber_id.to_owned());
    }

    /// Who sent a prompt, from its `from`: this follower ("you": its own subscriber, or one of
    /// its own `client_msg_id`s sent over IPC while the wire was down), a terminal command
    /// (`ipc`), a bot (`relay`), or a WebSocket client by its label (`web`: the browser,
    /// `follow`: another follower, else the label, or "app" without one). An event of a host
    /// that did not say (no `from`) is guessed from its `client_msg_id`.
    fn who(&self, event: &Value) -> String {
        // The agent's own conversation from before an import: no one sent it through the host.
        if event.get("imported").and_then(Value::as_bool) == Some(true) {
            return "imported".to_owned();
        }
        let id = field(event, "clientMsgId");
        if let Some(from) = event.get("from").filter(|f| f.is_object()) {
            let mine = !id.is_empty() && self.mine.contains(id);
            let own = self.subscriber_id.as_deref();
            return match field(from, "via") {
                "ws" if own.is_some_and(|own| own == field(from, "subscriberId")) => "you",
                _ if mine => "you",
                "ipc" => "terminal",
                "relay" => "bot",
                "ws" => match field(from, "client") {
                    "web" => "browser",
                    "follow" => "follow",
                    "" => "app",
                    label => return clean(label),
                },
                _ => "client",
            }
            .to_owned();
        }
        if id.is_empty() {
            "user".to_owned()
        } else if self.mine.contains(id) {
            "you".to_owned()
        } else if id.starts_with("follow-") {
            "terminal".to_owned()
        } else {
            "client".to_owned()
        }
    }

    /// Close the session's open block (its end came, or its run ended).
    fn close_block(&mut self, session: &str) {
        if let Some(i) = self.open_block.remove(session)
            && let Some(Entry::Block { open, .. }) = self.entries.get_mut(i)
        {
            *open = false;
        }
    }

    /// The session's open block of this kind, opened if there is none.
    fn block_mut(&mut self, session: &str, thinking: bool) -> &mut String {
        let open = self.open_block.get(session).copied().filter(|&i| {
            matches!(self.entries.get(i), Some(Entry::Block { thinking: t, .. }) if *t == thinking)
        });
        let index = match open {
            Some(i) => i,
            None => {
                self.close_block(session);
                let i = self.push(Entry::Block {
                    session: session.to_owned(),
                    thinking,
                    text: String::new(),
                    open: true,
                });
                self.open_block.insert(session.to_owned(), i);
                i
            }
        };
        match &mut self.entries[index] {
            Entry::Block { text, .. } => text,
            _ => unreachable!("the index was just checked or pushed as a block"),
        }
    }

    fn tool_mut(&mut self, session: &str, call_id: &str, name: &str) -> &mut Entry {
        let key = (session.to_owned(), call_id.to_owned());
        let index = match self.tools.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.push(Entry::Tool {
                    session: session.to_owned(),
                    call_id: call_id.to_owned(),
                    name: clean(name),
                    input: String::new(),
                    output: String::new(),
                    done: false,
                    is_error: false,
                    exit_code: None,
                    expanded: false,
                });
                self.tools.insert(key, i);
                i
            }
        };
        &mut self.entries[index]
    }

    /// One canonical event (its JSON) as the wire delivered it.
    pub fn on_event(&mut self, event: &Value) {
        let session = field(event, "sessionId").to_owned();
        let kind = field(event, "k");
        let run = field(event, "runId").to_owned();
        if !session.is_empty() {
            // Known, so Ctrl-N / `/to` can pick it; never made the target by an event.
            self.status_mut(&session);
        }
        match kind {
            "run.start" => {
                let status = self.status_mut(&session);
                status.state = "running".to_owned();
                status.run_id = Some(run.clone());
                status.queue.retain(|q| q.run_id != run);
                let agent = field(event, "agent");
                if !agent.is_empty() {
                    status.agent = Some(clean(agent));
                }
                self.push(Entry::Mark {
                    session,
                    text: format!("── run {} started ──", short_id(&run)),
                    tone: Tone::Dim,
                });
            }
            "run.end" => {
                self.close_block(&session);
                let status = self.status_mut(&session);
                if status.run_id.as_deref() == Some(run.as_str()) || status.run_id.is_none() {
                    status.run_id = None;
                    status.state = "idle".to_owned();
                }
                status.queue.retain(|q| q.run_id != run);
                let state = field(event, "state");
                let why = [field(event, "category"), field(event, "message")]
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .map(clean)
                    .collect::<Vec<_>>()
                    .join(": ");
                let tone = match state {
                    "completed" => Tone::Good,
                    "failed" => Tone::Bad,
                    _ => Tone::Warn,
                };
                let text = if why.is_empty() {
                    format!("── run {} {state} ──", short_id(&run))
                } else {
                    format!("── run {} {state} ({why}) ──", short_id(&run))
                };
                self.push(Entry::Mark {
                    session,
                    text,
                    tone,
                });
            }
            "user.text" => {
                let who = self.who(event);
                self.status_mut(&session).queue.retain(|q| q.run_id != run);
                self.push(Entry::Prompt {
                    session,
                    who,
                    text: clean(field(event, "text")),
                    steer: event.get("steer").and_then(Value::as_bool) == Some(true),
                });
            }
            "text.start" | "thinking.start" => {
                self.close_block(&session);
                self.block_mut(&session, kind == "thinking.start");
            }
            "text.delta" | "thinking.delta" => {
                let piece = clean(field(event, "text"));
                self.block_mut(&session, kind == "thinking.delta")
                    .push_str(&piece);
            }
            "text.end" | "thinking.end" => {
                // The end carries the whole block: it wins over whatever deltas came (some
                // may have been dropped on a slow link or a reconnect).
                let full = clean(field(event, "text"));
                *self.block_mut(&session, kind == "thinking.end") = full;
                self.close_block(&session);
            }
            "tool.call.start" => {
                self.tool_mut(&session, field(event, "callId"), field(event, "name"));
            }
            "tool.call.end" => {
                let given = input_text(event.get("input").unwrap_or(&Value::Null));
                let name = clean(field(event, "name"));
                if let Entry::Tool { input, name: n, .. } =
                    self.tool_mut(&session, field(event, "callId"), &name)
                {
                    *input = given;
                    if n.is_empty() {
                        *n = name;
                    }
                }
            }
            "tool.exec.update" => {
                let piece = clean(field(event, "output"));
                if let Entry::Tool { output, .. } =
                    self.tool_mut(&session, field(event, "callId"), "")
                {
                    output.push_str(&piece);
                }
            }
            "tool.exec.end" => {
                let full = clean(field(event, "output"));
                let error = event.get("isError").and_then(Value::as_bool) == Some(true);
                let code = event.get("exitCode").and_then(Value::as_i64);
                if let Entry::Tool {
                    output,
                    done,
                    is_error,
                    exit_code,
                    ..
                } = self.tool_mut(&session, field(event, "callId"), "")
                {
                    *output = full;
                    *done = true;
                    *is_error = error;
                    *exit_code = code;
                }
            }
            "permission.request" => {
                let pending = Pending {
                    request_id: field(event, "requestId").to_owned(),
                    tool: clean(field(event, "tool")),
                    input: input_text(event.get("input").unwrap_or(&Value::Null)),
                    choices: choices(event.get("options")),
                };
                self.push(Entry::Permission {
                    session: session.clone(),
                    request_id: pending.request_id.clone(),
                    tool: pending.tool.clone(),
                    input: pending.input.clone(),
                    answer: None,
                });
                let status = self.status_mut(&session);
                if !status
                    .pending
                    .iter()
                    .any(|p| p.request_id == pending.request_id)
                {
                    status.pending.push(pending);
                }
            }
            "permission.resolved" => {
                let id = field(event, "requestId");
                self.status_mut(&session)
                    .pending
                    .retain(|p| p.request_id != id);
                let by = match field(event, "by") {
                    "" => String::new(),
                    by => format!(" by {}", clean(by)),
                };
                let rule = match field(event, "rule") {
                    "" => String::new(),
                    rule => format!(" — {}", clean(rule)),
                };
                let decision = clean(field(event, "decision"));
                let decision = match field(event, "optionId") {
                    "" => decision,
                    option if option == decision => decision,
                    option => format!("{decision} ({})", clean(option)),
                };
                let answer = format!("{decision}{by}{rule}");
                let found = self.entries.iter_mut().rev().find_map(|e| match e {
                    Entry::Permission {
                        request_id, answer, ..
                    } if request_id == id => Some(answer),
                    _ => None,
                });
                match found {
                    Some(slot) => *slot = Some(answer),
                    None => self.notice(
                        Some(&session),
                        Tone::Dim,
                        format!("permission {}: {answer}", short_id(id)),
                    ),
                }
            }
            "session.state" => {
                let state = field(event, "state").to_owned();
                let status = self.status_mut(&session);
                if state == "idle" {
                    status.run_id = None;
                }
                status.state = state;
            }
            "queue.changed" => {
                let queue = queue_of(event.get("queue").unwrap_or(&Value::Null));
                self.status_mut(&session).queue = queue;
            }
            "usage" => {
                let n = |k: &str| event.get(k).and_then(Value::as_u64).unwrap_or(0);
                self.notice(
                    Some(&session),
                    Tone::Dim,
                    format!("usage: {} in, {} out", n("inputTokens"), n("outputTokens")),
                );
            }
            "session.bound" | "tool.exec.start" | "tool.call.delta" | "artifact.delta" => {}
            "session.forked" => self.notice(
                Some(&session),
                Tone::Dim,
                format!("forked from {}", clean(field(event, "parentSessionId"))),
            ),
            "warning" => self.notice(
                Some(&session),
                Tone::Warn,
                format!(
                    "! {}: {}",
                    clean(field(event, "code")),
                    clean(field(event, "message"))
                ),
            ),
            "error" => self.notice(
                Some(&session),
                Tone::Bad,
                format!(
                    "✗ error ({}): {}",
                    clean(field(event, "category")),
                    clean(field(event, "message"))
                ),
            ),
            other => self.notice(Some(&session), Tone::Dim, format!("[{}]", clean(other))),
        }
    }

    /// The connection dropped; `retry` says when the next attempt is.
    pub fn on_lost(&mut self, reason: &str, retry: std::time::Duration) {
        self.connection = format!(
            "reconnecting in {:.1}s ({})",
            retry.as_secs_f64(),
            one_line(&clean(reason), 60)
        );
    }

    /// The reply to a command this view asked for.
    pub fn on_reply(&mut self, purpose: &Purpose, reply: &Reply) {
        let target = self.target().map(str::to_owned);
        let at = target.as_deref();
        if !reply.is_ok() {
            let name = reply
                .data
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("error");
            self.notice(
                at,
                Tone::Bad,
                format!("✗ {}: {}", clean(name), clean(&reply.message)),
            );
            return;
        }
        let data = &reply.data;
        match purpose {
            Purpose::Send => {
                if data.get("queued").and_then(Value::as_bool) == Some(true) {
                    self.notice(at, Tone::Dim, "queued: it runs after the current turn");
                }
            }
            Purpose::Steer => {
                let text = if data.get("steered").and_then(Value::as_bool) == Some(true) {
                    "steered into the running turn"
                } else if data.get("queued").and_then(Value::as_bool) == Some(true) {
                    "queued at the head (the agent cannot take input mid-turn)"
                } else {
                    "sent as a new prompt"
                };
                self.notice(at, Tone::Dim, text);
            }
            Purpose::Cancel => {
                let state = field(data, "state");
                self.notice(at, Tone::Dim, format!("cancel: {}", clean(state)));
            }
            Purpose::Answer => {}
            Purpose::Fork => {
                let id = field(data, "session_id");
                self.notice(
                    at,
                    Tone::Accent,
                    format!("forked: new session {id} (agent-host follow {id})"),
                );
            }
            Purpose::QueueRemove => self.notice(at, Tone::Dim, "removed from the queue"),
            Purpose::QueueClear => {
                let n = data
                    .get("removed")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                self.notice(at, Tone::Dim, format!("queue cleared ({n} removed)"));
            }
            Purpose::Status(session) => {
                let state = field(data, "state").to_owned();
                let agent = field(data, "agent_type").to_owned();
                let title = field(data, "title").to_owned();
                let live = data.get("live").unwrap_or(&Value::Null);
                let run = live
                    .get("run_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                // `queue` (texts) when the host has it, else `live.queued` (run ids only).
                let queue = match data.get("queue") {
                    Some(q) if q.is_array() => queue_of(q),
                    _ => live
                        .get("queued")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(|id| Queued {
                            run_id: id.to_owned(),
                            text: String::new(),
                        })
                        .collect(),
                };
                let status = self.status_mut(session);
                if !state.is_empty() {
                    status.state = state;
                }
                status.run_id = run;
                status.queue = queue;
                if !agent.is_empty() {
                    status.agent = Some(clean(&agent));
                }
                if !title.is_empty() {
                    status.title = Some(clean(&title));
                }
            }
            Purpose::Pending => {
                let rows = data
                    .get("permissions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                // The host's list replaces what was known (a request answered while the
                // connection was down is gone); events behind the reply apply after it.
                match &self.followed {
                    Some(session) => {
                        if let Some(status) = self.sessions.get_mut(session) {
                            status.pending.clear();
                        }
                    }
                    None => self.sessions.values_mut().for_each(|s| s.pending.clear()),
                }
                for row in rows {
                    let session = field(&row, "session_id").to_owned();
                    let pending = Pending {
                        request_id: field(&row, "request_id").to_owned(),
                        tool: clean(field(&row, "tool")),
                        input: input_text(row.get("input").unwrap_or(&Value::Null)),
                        choices: choices(row.get("options")),
                    };
                    let status = self.status_mut(&session);
                    if !status
                        .pending
                        .iter()
                        .any(|p| p.request_id == pending.request_id)
                    {
                        status.pending.push(pending);
                    }
                }
            }
        }
    }

    /// What a key's action does: a command for the host, a change of the view, or quit.
    pub fn act(&mut self, action: Action) -> Effect {
        match action {
            Action::None => Effect::Nothing,
            Action::Quit => Effect::Quit,
            Action::Send(text) => self.session_command(|view, session| {
                view.sent += 1;
                let id = format!("follow-{}-{}", view.tag, view.sent);
                view.mine.insert(id.clone());
                Ok(Outgoing {
                    command: "session.send",
                    params: json!({"session_id": session, "text": text, "client_msg_id": id}),
                    purpose: Purpose::Send,
                })
            }),
            Action::Steer(text) => self.session_command(|view, session| {
                view.sent += 1;
                let id = format!("follow-{}-{}", view.tag, view.sent);
                view.mine.insert(id.clone());
                Ok(Outgoing {
                    command: "session.steer",
                    params: json!({"session_id": session, "text": text, "client_msg_id": id}),
                    purpose: Purpose::Steer,
                })
            }),
            Action::Cancel => self.session_command(|view, session| {
                let running = view.sessions.get(session).and_then(|s| s.run_id.clone());
                let mut params = json!({"session_id": session});
                if let Some(run) = running {
                    params["run_id"] = json!(run);
                }
                Ok(Outgoing {
                    command: "session.cancel",
                    params,
                    purpose: Purpose::Cancel,
                })
            }),
            Action::Answer(answer) => self.answer(answer),
            Action::Fork => self.session_command(|_, session| {
                Ok(Outgoing {
                    command: "session.fork",
                    params: json!({"session_id": session}),
                    purpose: Purpose::Fork,
                })
            }),
            Action::QueueList => {
                let target = self.target().map(str::to_owned);
                let queue = self.target_status().map(|s| s.queue.clone());
                match queue {
                    Some(q) if !q.is_empty() => {
                        let mut text = format!("queue ({}):", q.len());
                        for (i, item) in q.iter().enumerate() {
                            text.push_str(&format!("\n  {}. {}", i + 1, queue_label(item)));
                        }
                        self.notice(target.as_deref(), Tone::Accent, text);
                    }
                    _ => self.notice(target.as_deref(), Tone::Accent, "the queue is empty"),
                }
                Effect::Nothing
            }
            Action::QueueRemove(n) => self.session_command(|view, session| {
                let queue = view
                    .sessions
                    .get(session)
                    .map(|s| s.queue.clone())
                    .unwrap_or_default();
                let item = n
                    .checked_sub(1)
                    .and_then(|i| queue.get(i))
                    .ok_or_else(|| format!("no queued prompt number {n} (see /queue)"))?;
                Ok(Outgoing {
                    command: "queue.remove",
                    params: json!({"session_id": session, "run_id": item.run_id}),
                    purpose: Purpose::QueueRemove,
                })
            }),
            Action::QueueClear => self.session_command(|_, session| {
                Ok(Outgoing {
                    command: "queue.clear",
                    params: json!({"session_id": session}),
                    purpose: Purpose::QueueClear,
                })
            }),
            Action::ToggleAllTools => {
                self.expand_all = !self.expand_all;
                for entry in &mut self.entries {
                    if let Entry::Tool { expanded, .. } = entry {
                        *expanded = self.expand_all;
                    }
                }
                Effect::Nothing
            }
            Action::SelectTool(forward) => {
                self.select_tool(forward);
                Effect::Nothing
            }
            Action::ToggleSelected => {
                if let Some(Entry::Tool { expanded, .. }) =
                    self.selected.and_then(|i| self.entries.get_mut(i))
                {
                    *expanded = !*expanded;
                }
                Effect::Nothing
            }
            Action::Unselect => {
                self.selected = None;
                Effect::Nothing
            }
            Action::Scroll(lines) => {
                self.scroll_back = if lines < 0 {
                    self.scroll_back
                        .saturating_add(lines.unsigned_abs() as usize)
                } else {
                    self.scroll_back.saturating_sub(lines as usize)
                };
                Effect::Nothing
            }
            Action::ScrollEnd => {
                self.scroll_back = 0;
                Effect::Nothing
            }
            Action::Help => {
                self.notice(None, Tone::Accent, HELP);
                Effect::Nothing
            }
            Action::ConfirmAlways => {
                let rule = self.always_choice().map(|c| {
                    if c.rule.is_empty() {
                        c.label.clone()
                    } else {
                        c.rule.clone()
                    }
                });
                let session = self.pending().map(|(s, _)| s.to_owned());
                match rule {
                    Some(rule) => self.notice(
                        session.as_deref(),
                        Tone::Warn,
                        format!(
                            "a lasting rule: {rule} — press a again or Enter to grant it, any other key to take it back"
                        ),
                    ),
                    None => self.notice(None, Tone::Warn, "no permission request is waiting"),
                }
                Effect::Nothing
            }
            Action::ConfirmCancelled => {
                self.notice(None, Tone::Dim, "allow always: not granted");
                Effect::Nothing
            }
            Action::CycleTarget(forward) => self.cycle_target(forward),
            Action::Target(wanted) => self.choose_target(&wanted),
            Action::Unknown(what) => {
                self.notice(
                    None,
                    Tone::Warn,
                    format!("unknown command {} (/help lists them)", clean(&what)),
                );
                Effect::Nothing
            }
        }
    }

    /// Make `session` the target (following all): say so, and ask for its state.
    fn retarget(&mut self, session: String) -> Effect {
        self.chosen = Some(session.clone());
        self.notice(
            Some(&session),
            Tone::Accent,
            format!("commands now go to session {session}"),
        );
        Effect::Request(Outgoing {
            command: "session.get",
            params: json!({"session_id": session}),
            purpose: Purpose::Status(session),
        })
    }

    /// Ctrl-N / Ctrl-P: the next / previous known session.
    fn cycle_target(&mut self, forward: bool) -> Effect {
        if let Some(followed) = &self.followed {
            let text = format!("following one session ({followed}): commands go to it");
            self.notice(None, Tone::Warn, text);
            return Effect::Nothing;
        }
        let known: Vec<String> = self.sessions.keys().cloned().collect();
        if known.is_empty() {
            self.notice(None, Tone::Warn, "no session heard from yet");
            return Effect::Nothing;
        }
        let at = self
            .chosen
            .as_ref()
            .and_then(|c| known.iter().position(|k| k == c));
        let next = match (at, forward) {
            (None, true) => 0,
            (None, false) => known.len() - 1,
            (Some(i), true) => (i + 1) % known.len(),
            (Some(i), false) => (i + known.len() - 1) % known.len(),
        };
        self.retarget(known[next].clone())
    }

    /// `/to <id-or-suffix>`: a known session whose id is, ends or starts with it (or any full
    /// id not heard from yet); `/to` alone lists the known ones.
    fn choose_target(&mut self, wanted: &str) -> Effect {
        if let Some(followed) = &self.followed {
            let text = format!("following one session ({followed}): commands go to it");
            self.notice(None, Tone::Warn, text);
            return Effect::Nothing;
        }
        let known: Vec<String> = self.sessions.keys().cloned().collect();
        if wanted.is_empty() {
            let mut text = match &self.chosen {
                Some(c) => format!("target: {c}\nsessions:"),
                None => "no target yet (/to <id> or Ctrl-N)\nsessions:".to_owned(),
            };
            for id in &known {
                text.push_str(&format!("\n  {id}"));
            }
            if known.is_empty() {
                text.push_str(" none heard from yet");
            }
            self.notice(None, Tone::Accent, text);
            return Effect::Nothing;
        }
        let matches: Vec<&String> = match known.iter().find(|k| *k == wanted) {
            Some(exact) => vec![exact],
            None => known
                .iter()
                .filter(|k| k.ends_with(wanted) || k.starts_with(wanted))
                .collect(),
        };
        match matches.as_slice() {
            [one] => {
                let one = (*one).clone();
                self.retarget(one)
            }
            [] if wanted.len() >= 32 && !wanted.chars().any(char::is_whitespace) => {
                self.retarget(wanted.to_owned())
            }
            [] => {
                let text = format!("no session matches {} (/to lists them)", clean(wanted));
                self.notice(None, Tone::Warn, text);
                Effect::Nothing
            }
            many => {
                let text = format!(
                    "{} sessions match {}: give more of the id",
                    many.len(),
                    clean(wanted)
                );
                self.notice(None, Tone::Warn, text);
                Effect::Nothing
            }
        }
    }

    /// A command for the target session, or a notice saying why there is none.
    fn session_command(
        &mut self,
        build: impl FnOnce(&mut View, &str) -> Result<Outgoing, String>,
    ) -> Effect {
        let Some(session) = self.target().map(str::to_owned) else {
            self.notice(
                None,
                Tone::Warn,
                "no target session: /to <id> or Ctrl-N picks one (commands never go to a session you did not pick)",
            );
            return Effect::Nothing;
        };
        match build(self, &session) {
            Ok(out) => Effect::Request(out),
            Err(why) => {
                self.notice(Some(&session), Tone::Warn, why);
                Effect::Nothing
            }
        }
    }

    fn answer(&mut self, answer: Answer) -> Effect {
        let Some((session, pending)) = self.pending() else {
            self.notice(None, Tone::Warn, "no permission request is waiting");
            return Effect::Nothing;
        };
        let mut params = json!({"session_id": session, "request_id": pending.request_id});
        match answer {
            // The shorthands work with every host: the first allow-once / reject-once option.
            Answer::AllowOnce => params["decision"] = json!("allow"),
            Answer::Deny => params["decision"] = json!("deny"),
            Answer::AllowAlways => {
                let always = pending.choices.iter().find(|c| is_always(c));
                match always {
                    Some(choice) => params["option_id"] = json!(choice.id),
                    None => {
                        let session = session.to_owned();
                        self.notice(
                            Some(&session),
                            Tone::Warn,
                            "this request offers no allow-always option: y allows once, n denies",
                        );
                        return Effect::Nothing;
                    }
                }
            }
        }
        Effect::Request(Outgoing {
            command: "permission.respond",
            params,
            purpose: Purpose::Answer,
        })
    }

    fn select_tool(&mut self, forward: bool) {
        let tools: Vec<usize> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Entry::Tool { .. }))
            .map(|(i, _)| i)
            .collect();
        if tools.is_empty() {
            self.selected = None;
            return;
        }
        let at = self
            .selected
            .and_then(|s| tools.iter().position(|&t| t == s));
        let next = match (at, forward) {
            // Tab starts from the newest tool, going back in time.
            (None, _) => tools.len() - 1,
            (Some(0), true) => tools.len() - 1,
            (Some(i), true) => i - 1,
            (Some(i), false) => (i + 1) % tools.len(),
        };
        self.selected = Some(tools[next]);
    }
}

/// What `/help` shows.
pub const HELP: &str = "keys: type and Enter to send · Esc clears the line, on an empty line cancels the turn · y / n answer the permission (input empty), a then a (or Enter) allows always · Ctrl-N / Ctrl-P pick the target session (following all) · Tab / Shift-Tab select a tool, Enter unfolds it · PgUp / PgDn / End scroll · Ctrl-C or /quit exits
commands: /to <id> (target session) · /steer <text> · /fork · /queue · /queue rm N · /queue clear · /tools (unfold all) · /cancel · /quit";

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::text::Line;

    const S: &str = "0193aaaa-session";

    fn ev(v: Value) -> Value {
        v
    }

    fn text(view: &View, width: u16) -> String {
        view.lines(width)
            .iter()
            .map(|l| {
                l.spans
                    .iter()
                    .map(|s| s.content.as_ref())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn turn(view: &mut View) {
        for e in [
            json!({"k":"user.text","sessionId":S,"runId":"r1","text":"hi","clientMsgId":"web-uuid"}),
            json!({"k":"run.start","sessionId":S,"runId":"r1"}),
            json!({"k":"text.start","sessionId":S,"runId":"r1"}),
            json!({"k":"text.delta","sessionId":S,"runId":"r1","text":"Here:\n```rust\nfn main"}),
            json!({"k":"text.delta","sessionId":S,"runId":"r1","text":"() {}\n```\ndone"}),
        ] {
            view.on_event(&ev(e));
        }
    }

    #[test]
    fn streamed_text_sets_code_apart_and_the_end_wins() {
        let mut view = View::new(Some(S.into()), "t");
        turn(&mut view);
        assert_eq!(
            text(&view, 80),
            "client ▸ hi\n── run r1 started ──\n● Here:\n  ╭─ rust\n  │ fn main() {}\n  ╰─\n  done▌"
        );
        assert!(view.running());
        // The end carries the whole text (a delta was dropped): it replaces the streamed one.
        view.on_event(&json!({"k":"text.end","sessionId":S,"runId":"r1","text":"Here: all"}));
        view.on_event(&json!({"k":"run.end","sessionId":S,"runId":"r1","state":"cancelled","category":"cancelled"}));
        assert_eq!(
            text(&view, 80),
            "client ▸ hi\n── run r1 started ──\n● Here: all\n── run r1 cancelled (cancelled) ──"
        );
        assert!(!view.running());
        // Colours: code is its own colour, a cancelled run warns.
        let lines = view.lines(80);
        assert_eq!(lines[3].spans[0].style.fg, Some(Color::Yellow));
    }

    #[test]
    fn tools_fold_to_one_line_and_unfold_on_demand() {
        let mut view = View::new(Some(S.into()), "t");
        for e in [
            json!({"k":"tool.call.start","sessionId":S,"runId":"r1","callId":"c1","name":"Bash"}),
            json!({"k":"tool.call.end","sessionId":S,"runId":"r1","callId":"c1","name":"Bash","input":{"command":"ls -l"}}),
            json!({"k":"tool.exec.end","sessionId":S,"runId":"r1","callId":"c1","output":"a\nb","isError":false}),
            json!({"k":"tool.call.end","sessionId":S,"runId":"r1","callId":"c2","name":"Read","input":{"path":"x"}}),
        ] {
            view.on_event(&e);
        }
        assert_eq!(
            text(&view, 80),
            "▸ ⚙ Bash ls -l ✓ 2 lines\n▸ ⚙ Read {\"path\":\"x\"} … running"
        );
        // Tab selects the newest tool, Tab again the one before; Enter unfolds it.
        view.act(Action::SelectTool(true));
        view.act(Action::SelectTool(true));
        view.act(Action::ToggleSelected);
        assert_eq!(
            text(&view, 80),
            "» ▾ ⚙ Bash ls -l ✓ 2 lines\n    │ a\n    │ b\n▸ ⚙ Read {\"path\":\"x\"} … running"
        );
        view.act(Action::Unselect);
        view.act(Action::ToggleAllTools);
        assert!(text(&view, 80).contains("▾ ⚙ Read"), "{}", text(&view, 80));
    }

    #[test]
    fn a_permission_shows_its_choices_and_y_n_a_answer_it() {
        let mut view = View::new(Some(S.into()), "t");
        view.on_event(&json!({"k":"permission.request","sessionId":S,"runId":"r1","requestId":"p1","tool":"Bash","input":{"command":"touch x"},
            "options":[{"id":"allow","label":"Allow","kind":"allow_once"},{"id":"always-bash","label":"Always allow Bash(touch x)","kind":"allow_always"},{"id":"deny","label":"Deny","kind":"reject_once"}]}));
        let panel: Vec<String> = view
            .panel_lines(5)
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect();
        assert_eq!(
            panel,
            [
                "? Bash wants to run: touch x",
                "  [y] Allow   [a] Always allow Bash(touch x)   [n] Deny"
            ]
        );
        let request = |effect: Effect| match effect {
            Effect::Request(out) => (out.command, out.params),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            request(view.act(Action::Answer(Answer::AllowOnce))),
            (
                "permission.respond",
                json!({"session_id":S,"request_id":"p1","decision":"allow"})
            )
        );
        assert_eq!(
            request(view.act(Action::Answer(Answer::Deny))).1["decision"],
            "deny"
        );
        assert_eq!(
            request(view.act(Action::Answer(Answer::AllowAlways))).1,
            json!({"session_id":S,"request_id":"p1","option_id":"always-bash"})
        );
        view.on_event(&json!({"k":"permission.resolved","sessionId":S,"requestId":"p1","decision":"allow","by":"sub-1","rule":"always allow Bash(touch x) in this session"}));
        assert!(view.pending().is_none());
        assert!(view.panel_lines(5).is_empty());
        assert_eq!(
            text(&view, 100),
            "? permission: Bash touch x\n  → allow by sub-1 — always allow Bash(touch x) in this session"
        );
        // Bare option names (an older host): no allow-always, a notice instead of a request.
        view.on_event(&json!({"k":"permission.request","sessionId":S,"requestId":"p2","tool":"Bash","input":{},"options":["allow","deny"]}));
        assert_eq!(
            view.act(Action::Answer(Answer::AllowAlways)),
            Effect::Nothing
        );
        assert!(text(&view, 100).ends_with("no allow-always option: y allows once, n denies"));
    }

    #[test]
    fn prompts_say_who_sent_them_and_sends_carry_this_followers_ids() {
        let mut view = View::new(Some(S.into()), "abc");
        let Effect::Request(out) = view.act(Action::Send("hello".into())) else {
            panic!()
        };
        assert_eq!(out.command, "session.send");
        assert_eq!(
            out.params,
            json!({"session_id":S,"text":"hello","client_msg_id":"follow-abc-1"})
        );
        for (id, text) in [
            (json!("follow-abc-1"), "mine"),
            (json!("follow-zzz-9"), "other terminal"),
            (Value::Null, "cli"),
        ] {
            let mut e = json!({"k":"user.text","sessionId":S,"runId":"r","text":text});
            if !id.is_null() {
                e["clientMsgId"] = id;
            }
            view.on_event(&e);
        }
        view.on_event(&json!({"k":"user.text","sessionId":S,"runId":"r","text":"nudge","steer":true,"clientMsgId":"follow-abc-1"}));
        // Events that say who sent them: `from` wins over any guess from the id.
        view.set_subscriber("sub-me");
        for (from, text) in [
            (json!({"via":"ipc"}), "from a terminal"),
            (json!({"via":"relay"}), "from a bot"),
            (
                json!({"via":"ws","subscriberId":"sub-me","client":"follow"}),
                "from me",
            ),
            (
                json!({"via":"ws","subscriberId":"sub-2","client":"web"}),
                "from a browser",
            ),
            (
                json!({"via":"ws","subscriberId":"sub-3","client":"follow"}),
                "from a follower",
            ),
            (
                json!({"via":"ws","subscriberId":"sub-4","client":"my-app"}),
                "from an app",
            ),
            (json!({"via":"ws","subscriberId":"sub-5"}), "from no label"),
        ] {
            view.on_event(&json!({"k":"user.text","sessionId":S,"runId":"r","text":text,"from":from,"clientMsgId":"follow-zzz-1"}));
        }
        // Its own prompt sent over IPC (the wire was down): still "you".
        view.on_event(&json!({"k":"user.text","sessionId":S,"runId":"r","text":"mine by ipc","from":{"via":"ipc"},"clientMsgId":"follow-abc-1"}));
        // The agent's own prompt from before an import: no run, no sender.
        view.on_event(&json!({"k":"user.text","sessionId":S,"text":"from before","imported":true}));
        assert_eq!(
            text(&view, 80),
            "you ▸ mine\nterminal ▸ other terminal\nuser ▸ cli\nyou (steer) ▸ nudge\n\
             terminal ▸ from a terminal\nbot ▸ from a bot\nyou ▸ from me\n\
             browser ▸ from a browser\nfollow ▸ from a follower\nmy-app ▸ from an app\n\
             app ▸ from no label\nyou ▸ mine by ipc\nimported ▸ from before"
        );
        let Effect::Request(steer) = view.act(Action::Steer("go left".into())) else {
            panic!()
        };
        assert_eq!(steer.command, "session.steer");
        assert_eq!(steer.params["text"], "go left");
    }

    #[test]
    fn the_queue_comes_from_session_get_and_queue_changed() {
        let mut view = View::new(Some(S.into()), "t");
        let asks = view.on_connected();
        assert_eq!(asks[0].command, "session.get");
        view.on_reply(
            &asks[0].purpose,
            &Reply::ok(
                json!({"session_id":S,"state":"running","agent_type":"claude",
                "live":{"run_id":"r1","queued":["r2"]},
                "queue":[{"run_id":"r2","text":"second","created_at_ms":1}]}),
            ),
        );
        assert!(view.running());
        let status = |v: &View| {
            v.status_line()
                .spans
                .iter()
                .map(|s| s.content.to_string())
                .collect::<String>()
        };
        assert!(
            status(&view).contains("● running run r1 queue 1"),
            "{}",
            status(&view)
        );
        view.on_event(
            &json!({"k":"queue.changed","sessionId":S,"reason":"added","runId":"r3",
            "queue":[{"runId":"r2","text":"second"},{"runId":"r3","text":"third"}]}),
        );
        view.act(Action::QueueList);
        assert_eq!(text(&view, 80), "queue (2):\n  1. second\n  2. third");
        let Effect::Request(rm) = view.act(Action::QueueRemove(2)) else {
            panic!()
        };
        assert_eq!(
            (rm.command, rm.params),
            ("queue.remove", json!({"session_id":S,"run_id":"r3"}))
        );
        assert_eq!(view.act(Action::QueueRemove(7)), Effect::Nothing);
        let Effect::Request(clear) = view.act(Action::QueueClear) else {
            panic!()
        };
        assert_eq!(clear.command, "queue.clear");
        // The dispatched run leaves the queue with its run.start.
        view.on_event(&json!({"k":"run.start","sessionId":S,"runId":"r2"}));
        assert_eq!(view.target_status().map(|s| s.queue.len()), Some(1));
        // Cancel names the running turn.
        let Effect::Request(cancel) = view.act(Action::Cancel) else {
            panic!()
        };
        assert_eq!(cancel.params, json!({"session_id":S,"run_id":"r2"}));
    }

    #[test]
    fn following_all_sessions_labels_every_line() {
        let mut view = View::new(None, "t");
        view.on_event(&json!({"k":"text.end","sessionId":"0193-aaaaaaaa","text":"one\ntwo"}));
        view.on_event(&json!({"k":"warning","sessionId":"0193-bbbbbbbb","code":"followup_dropped","message":"dropped r9"}));
        assert_eq!(
            text(&view, 80),
            "[aaaaaaaa] ● one\n[aaaaaaaa]   two\n[bbbbbbbb] ! followup_dropped: dropped r9"
        );
        // No target chosen: a session command is refused with a notice, never sent to the
        // session heard from last.
        assert_eq!(view.act(Action::Fork), Effect::Nothing);
        assert!(
            text(&view, 120)
                .ends_with("picks one (commands never go to a session you did not pick)")
        );
        assert!(
            status(&view).contains("all sessions → no target"),
            "{}",
            status(&view)
        );
    }

    fn status(view: &View) -> String {
        view.status_line()
            .spans
            .iter()
            .map(|s| s.content.to_string())
            .collect()
    }

    #[test]
    fn following_all_the_target_is_chosen_and_never_moves_by_itself() {
        let (a, b) = ("0193-aaaaaaaa", "0193-bbbbbbbb");
        let mut view = View::new(None, "t");
        view.on_event(&json!({"k":"run.start","sessionId":a,"runId":"ra"}));
        view.on_event(&json!({"k":"run.start","sessionId":b,"runId":"rb"}));
        // Ctrl-N: the first known session; it asks for its state.
        let Effect::Request(get) = view.act(Action::CycleTarget(true)) else {
            panic!()
        };
        assert_eq!(
            (get.command, get.params),
            ("session.get", json!({"session_id":a}))
        );
        assert!(
            status(&view).contains("all sessions → aaaaaaaa"),
            "{}",
            status(&view)
        );
        // Events of another session do not retarget.
        view.on_event(&json!({"k":"text.end","sessionId":b,"text":"hi"}));
        let Effect::Request(cancel) = view.act(Action::Cancel) else {
            panic!()
        };
        assert_eq!(cancel.params, json!({"session_id":a,"run_id":"ra"}));
        // Ctrl-N again, Ctrl-P back, and around.
        view.act(Action::CycleTarget(true));
        assert_eq!(view.target(), Some(b));
        view.act(Action::CycleTarget(true));
        assert_eq!(view.target(), Some(a));
        view.act(Action::CycleTarget(false));
        assert_eq!(view.target(), Some(b));
        // `/to` by a suffix, by a full id not heard from yet; unknown and ambiguous refused.
        view.act(Action::Target("aaaa".into()));
        assert_eq!(view.target(), Some(a));
        let full = "0193cccc-0000-7000-8000-000000000000";
        view.act(Action::Target(full.into()));
        assert_eq!(view.target(), Some(full));
        assert_eq!(view.act(Action::Target("zzzz".into())), Effect::Nothing);
        assert!(text(&view, 120).ends_with("no session matches zzzz (/to lists them)"));
        assert_eq!(view.act(Action::Target("0193-".into())), Effect::Nothing);
        assert!(
            text(&view, 120).ends_with("give more of the id"),
            "{}",
            text(&view, 120)
        );
        assert_eq!(view.target(), Some(full));
        // Following one session: no retargeting.
        let mut one = View::new(Some(S.into()), "t");
        assert_eq!(one.act(Action::CycleTarget(true)), Effect::Nothing);
        assert_eq!(one.act(Action::Target(a.into())), Effect::Nothing);
        assert_eq!(one.target(), Some(S));
    }

    #[test]
    fn keys_answer_only_the_target_sessions_request() {
        let (a, b) = ("0193-aaaaaaaa", "0193-bbbbbbbb");
        let mut view = View::new(None, "t");
        view.on_event(&json!({"k":"run.start","sessionId":a,"runId":"ra"}));
        view.on_event(&json!({"k":"permission.request","sessionId":b,"runId":"rb","requestId":"pb","tool":"Bash","input":{"command":"rm x"},"options":["allow","deny"]}));
        // No target: nothing for the keys, and the panel says how to get there.
        assert!(view.pending().is_none());
        let panel: Vec<String> = view
            .panel_lines(5)
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect();
        assert_eq!(
            panel,
            ["[bbbbbbbb] ? Bash wants to run: rm x — /to bbbbbbbb (or Ctrl-N) to answer it"]
        );
        assert_eq!(view.act(Action::Answer(Answer::AllowOnce)), Effect::Nothing);
        // Target a: still not b's request.
        view.act(Action::Target(a.into()));
        assert!(view.pending().is_none());
        // Target b: answered.
        view.act(Action::Target(b.into()));
        let Effect::Request(out) = view.act(Action::Answer(Answer::AllowOnce)) else {
            panic!()
        };
        assert_eq!(
            out.params,
            json!({"session_id":b,"request_id":"pb","decision":"allow"})
        );
    }

    #[test]
    fn allow_always_says_the_rule_before_it_is_granted() {
        let mut view = View::new(Some(S.into()), "t");
        view.on_event(&json!({"k":"permission.request","sessionId":S,"runId":"r1","requestId":"p1","tool":"Bash","input":{"command":"npm test"},
            "options":[{"id":"allow","label":"Allow","kind":"allow_once"},{"id":"always","label":"Always allow","kind":"allow_always","rule":"always allow Bash(npm test) in this session"}]}));
        assert_eq!(view.always_choice().map(|c| c.id.as_str()), Some("always"));
        assert_eq!(view.act(Action::ConfirmAlways), Effect::Nothing);
        assert!(
            text(&view, 200).ends_with(
                "a lasting rule: always allow Bash(npm test) in this session — press a again or Enter to grant it, any other key to take it back"
            ),
            "{}",
            text(&view, 200)
        );
        assert_eq!(view.act(Action::ConfirmCancelled), Effect::Nothing);
        assert!(text(&view, 200).ends_with("allow always: not granted"));
        // Bare options: none offered.
        view.on_event(
            &json!({"k":"permission.resolved","sessionId":S,"requestId":"p1","decision":"deny"}),
        );
        view.on_event(&json!({"k":"permission.request","sessionId":S,"requestId":"p2","tool":"Bash","input":{},"options":["allow","deny"]}));
        assert!(view.always_choice().is_none());
    }

    #[test]
    fn hostile_text_is_shown_not_interpreted_and_long_lines_wrap() {
        let mut view = View::new(Some(S.into()), "t");
        view.on_event(&json!({"k":"text.end","sessionId":S,"text":"a\u{1b}[2Jb\tc"}));
        assert_eq!(text(&view, 80), "● a^[[2Jb    c");
        let wrapped = wrap(Line::raw("abcdefghij"), 4);
        assert_eq!(wrapped.len(), 3);
        assert_eq!(wrapped[2].spans[0].content, "ij");
        // Wide characters count two columns.
        assert_eq!(wrap(Line::raw("日本語"), 4).len(), 2);
    }

    #[test]
    fn a_reconnect_mid_block_shows_the_block_once() {
        let mut view = View::new(Some(S.to_owned()), "follow-abc");
        view.on_connected();
        view.on_event(&ev(json!({"k":"text.start","sessionId":S,"runId":"r1"})));
        view.on_event(&ev(
            json!({"k":"text.delta","sessionId":S,"runId":"r1","text":"Hello "}),
        ));
        view.on_event(&ev(json!({"k":"tool.exec.update","sessionId":S,"runId":"r1","callId":"c1","output":"line 1\n"})));
        view.on_lost("connection reset", std::time::Duration::from_secs(1));
        view.on_connected();
        // The host sends each open block from its start, then the live rest.
        view.on_event(&ev(
            json!({"k":"text.delta","sessionId":S,"runId":"r1","text":"Hello wor"}),
        ));
        view.on_event(&ev(
            json!({"k":"text.delta","sessionId":S,"runId":"r1","text":"ld"}),
        ));
        view.on_event(&ev(json!({"k":"tool.exec.update","sessionId":S,"runId":"r1","callId":"c1","output":"line 1\nline 2\n"})));
        let blocks: Vec<&str> = view
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Block { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(blocks, ["Hello world"]);
        let outputs: Vec<&str> = view
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Tool { output, .. } => Some(output.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(outputs, ["line 1\nline 2\n"]);
    }

    #[test]
    fn a_reconnect_replaces_the_pending_requests_with_the_hosts() {
        let mut view = View::new(Some(S.into()), "t");
        view.on_event(&json!({"k":"permission.request","sessionId":S,"requestId":"old","tool":"Bash","input":{}}));
        let asks = view.on_connected();
        let list = asks
            .iter()
            .find(|o| o.command == "permission.list")
            .unwrap();
        view.on_reply(
            &list.purpose,
            &Reply::ok(
                json!({"permissions":[{"session_id":S,"request_id":"new","tool":"Edit",
                "input":{"path":"a"},"options":[{"id":"ok","label":"Allow","kind":"allow_once"}],
                "created_at_ms":1}]}),
            ),
        );
        let (_, pending) = view.pending().unwrap();
        assert_eq!(
            (pending.request_id.as_str(), pending.tool.as_str()),
            ("new", "Edit")
        );
        assert_eq!(view.target_status().map(|s| s.pending.len()), Some(1));
    }

    #[test]
    fn a_failed_command_is_a_notice() {
        let mut view = View::new(Some(S.into()), "t");
        view.on_reply(
            &Purpose::Cancel,
            &Reply::error(
                crate::protocol::envelope::ErrorCode::RunNotFound,
                "nothing runs",
                Value::Null,
            ),
        );
        assert!(
            text(&view, 80).contains("✗ run_not_found: nothing runs"),
            "{}",
            text(&view, 80)
        );
    }
}
