//! Output for people: the replies of the list-like commands (`session.list`, `session.get`,
//! `session.history`, `agent.list`, `host.status`, `subscriber.list`, `pair.list`, `doctor`)
//! as aligned tables and short summaries, and `pair.create`'s code as a QR to scan, printed instead of the JSON envelope when standard output is a
//! terminal and `--json` was not given.
//!
//! Invariants: the envelope is the contract and this is only a view of it — a non-terminal
//! stdout, `--json`, and every command not listed here print the reply line exactly as before,
//! and the exit status is the reply's either way (0 exactly when `code` is 0). The view reads
//! the reply as JSON, not through the typed reply structs, so a field a newer host adds (or a
//! command's reply this build does not know) never breaks it: known keys are laid out, and a
//! summary's unknown scalar keys are listed after them.
//!
//! Text from outside the process (titles, prompts, agent answers, reasons) is made safe for a
//! terminal here: control characters are shown, never interpreted, and a cell is one line.
//! Pure but for [`terminal`] and [`show`], which look at and write to the process's own stdio;
//! it links nothing heavier than `serde_json`, `unicode-width`, `humantime` and crossterm's
//! window size, so the small `agent-host` front renders with it too.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use crate::protocol::envelope::Reply;

/// The commands whose reply has a view for people (`doctor` is the host's checks).
pub const COMMANDS: &[&str] = &[
    "session.list",
    "session.get",
    "session.history",
    "agent.list",
    "host.status",
    "subscriber.list",
    "pair.list",
    "pair.create",
    "doctor",
];

/// The width used when the terminal's cannot be read.
const DEFAULT_WIDTH: usize = 100;
/// The narrowest the flexible column of a table is squeezed to.
const MIN_FLEX: usize = 8;

/// What a view is laid out for: the time "ago" is counted from and the terminal's width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screen {
    pub now_ms: i64,
    pub width: usize,
}

/// A rendered reply: what goes to stdout, and (for an error) the line for stderr.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct View {
    pub stdout: String,
    pub stderr: String,
}

/// Whether `command`'s reply has a view for people.
pub fn renders(command: &str) -> bool {
    COMMANDS.contains(&command)
}

/// The screen to show `command`'s reply on: `Some` when the command has a view and standard
/// output is a terminal (the caller has already honoured `--json`).
pub fn terminal(command: &str) -> Option<Screen> {
    if !renders(command) || !std::io::stdout().is_terminal() {
        return None;
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Some(Screen {
        now_ms,
        width: terminal_width(),
    })
}

/// The terminal's width (`COLUMNS` when it cannot be asked); a table wider than the window
/// only wraps.
fn terminal_width() -> usize {
    let asked = crossterm::terminal::size()
        .ok()
        .map(|(cols, _)| usize::from(cols));
    asked
        .or_else(|| {
            std::env::var("COLUMNS")
                .ok()
                .and_then(|c| c.trim().parse::<usize>().ok())
        })
        .filter(|w| (20..=1000).contains(w))
        .unwrap_or(DEFAULT_WIDTH)
}

/// Write `reply`'s view to stdout and stderr. A reader that went away is ignored, as for the
/// envelope line.
pub fn show(command: &str, reply: &Reply, screen: &Screen) {
    let view = render(command, reply, screen);
    if !view.stdout.is_empty() {
        let mut out = std::io::stdout().lock();
        let _gone = out
            .write_all(view.stdout.as_bytes())
            .and_then(|()| out.flush());
    }
    if !view.stderr.is_empty() {
        let mut err = std::io::stderr().lock();
        let _gone = err.write_all(view.stderr.as_bytes());
    }
}

/// `reply` as people read it. An error is one `error: <message> (<name>)` line on stderr, with
/// its details (a hint, the pid, …) indented below it.
pub fn render(command: &str, reply: &Reply, screen: &Screen) -> View {
    if !reply.is_ok() {
        // A failed check is `doctor`'s error (`checks_failed`): its report is the checks.
        if command == "doctor" && reply.data.get("checks").is_some_and(Value::is_array) {
            let name = reply
                .data
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("");
            return View {
                stdout: doctor(&reply.data, screen),
                stderr: format!("error: {} ({})\n", cell(&reply.message), cell(name)),
            };
        }
        return View {
            stdout: String::new(),
            stderr: error_lines(reply),
        };
    }
    let data = &reply.data;
    let stdout = match command {
        "session.list" => session_list(data, screen),
        "session.get" => session_get(data, screen),
        "session.history" => session_history(data, screen),
        "agent.list" => agent_list(data, screen),
        "host.status" => host_status(data, screen),
        "subscriber.list" => subscriber_list(data, screen),
        "pair.list" => pair_list(data, screen),
        "pair.create" => pair_create(data, screen),
        "doctor" => doctor(data, screen),
        _ => format!("{}\n", reply.to_line()),
    };
    View {
        stdout,
        stderr: String::new(),
    }
}

fn error_lines(reply: &Reply) -> String {
    let name = reply
        .data
        .get("error")
        .and_then(Value::as_str)
        .map_or_else(|| format!("code {}", reply.code), cell);
    let mut out = format!("error: {} ({name})\n", cell(&reply.message));
    if let Value::Object(details) = &reply.data {
        for (key, value) in details {
            if key != "error"
                && let Some(text) = scalar(value)
            {
                let _ = writeln!(out, "  {}: {text}", cell(key));
            }
        }
    }
    out
}

// ---- the views ----

fn session_list(data: &Value, screen: &Screen) -> String {
    let sessions = array(data, "sessions");
    if sessions.is_empty() {
        return "no sessions\n".to_owned();
    }
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                text(s, "session_id"),
                text(s, "agent_type"),
                text(s, "state"),
                when(s.get("last_activity_ms"), screen),
                title_of(s),
                text(s, "preview"),
            ]
        })
        .collect();
    let mut out = table(
        &[
            Column::new("SESSION"),
            Column::new("AGENT"),
            Column::new("STATE"),
            Column::new("ACTIVE"),
            Column::flex("TITLE").max(32),
            Column::flex("LAST MESSAGE"),
        ],
        &rows,
        screen.width,
    );
    let _ = writeln!(out, "{}", count(sessions.len(), "session", "sessions"));
    if let Some(cursor) = data.get("next_cursor").and_then(Value::as_str) {
        let _ = writeln!(
            out,
            "more: agent-host session.list '{{\"cursor\":{}}}'",
            Value::String(cell(cursor))
        );
    }
    out
}

/// A session's title, or where it runs when it has none.
fn title_of(session: &Value) -> String {
    match session.get("title").and_then(Value::as_str) {
        Some(title) if !title.trim().is_empty() => cell(title),
        _ => format!("({})", home_relative(&text(session, "cwd"))),
    }
}

fn session_get(data: &Value, screen: &Screen) -> String {
    let mut fields = Fields::default();
    fields.add("session", text(data, "session_id"));
    fields.add("title", title_of(data));
    let agent = match data.get("native_session_id").and_then(Value::as_str) {
        Some(native) => format!(
            "{} (its session {})",
            text(data, "agent_type"),
            cell(native)
        ),
        None => text(data, "agent_type"),
    };
    fields.add("agent", agent);
    fields.add("state", text(data, "state"));
    fields.add("cwd", text(data, "cwd"));
    if let Some(model) = data.pointer("/options/model").and_then(Value::as_str) {
        fields.add("model", cell(model));
    }
    if let Some(mode) = data
        .pointer("/options/permission_mode")
        .and_then(Value::as_str)
    {
        fields.add("permissions", cell(mode));
    }
    if let Some(parent) = data.get("parent_session_id").and_then(Value::as_str) {
        fields.add("parent", cell(parent));
    }
    if let Some(fork_of) = data.get("fork_of").and_then(Value::as_str) {
        fields.add("forks", cell(fork_of));
    }
    fields.add("created", moment(data.get("created_at_ms"), screen));
    fields.add("updated", moment(data.get("updated_at_ms"), screen));
    let live = match data.get("live") {
        Some(Value::Object(live)) => {
            let mut parts = Vec::new();
            match live.get("agent_pid").and_then(Value::as_u64) {
                Some(pid) => parts.push(format!("agent pid {pid}")),
                None => parts.push("no agent process".to_owned()),
            }
            if let Some(run) = live.get("run_id").and_then(Value::as_str) {
                parts.push(format!("running {}", cell(run)));
            }
            if live.get("drifted").and_then(Value::as_bool) == Some(true) {
                parts.push("written elsewhere: the next prompt forks".to_owned());
            }
            parts.join(", ")
        }
        _ => "not run in this host yet".to_owned(),
    };
    fields.add("live", live);
    let mut out = fields.render();
    let queue = array(data, "queue");
    if !queue.is_empty() {
        let rows: Vec<Vec<String>> = queue
            .iter()
            .enumerate()
            .map(|(i, q)| {
                vec![
                    (i + 1).to_string(),
                    text(q, "run_id"),
                    when(q.get("created_at_ms"), screen),
                    text(q, "text"),
                ]
            })
            .collect();
        let _ = writeln!(out, "\nqueued prompts, next first:");
        out.push_str(&table(
            &[
                Column::new("#").right(),
                Column::new("RUN"),
                Column::new("SENT"),
                Column::flex("TEXT"),
            ],
            &rows,
            screen.width,
        ));
    }
    let rules = array(data, "permission_rules");
    if !rules.is_empty() {
        let rows: Vec<Vec<String>> = rules
            .iter()
            .map(|r| {
                vec![
                    text(r, "tool"),
                    text(r, "by"),
                    when(r.get("at_ms"), screen),
                    text(r, "description"),
                ]
            })
            .collect();
        let _ = writeln!(out, "\nallowed always in this session:");
        out.push_str(&table(
            &[
                Column::new("TOOL").max(24),
                Column::new("BY").max(24),
                Column::new("WHEN"),
                Column::flex("RULE"),
            ],
            &rows,
            screen.width,
        ));
    }
    out
}

fn session_history(data: &Value, screen: &Screen) -> String {
    let events = array(data, "events");
    if events.is_empty() {
        return "no events in this page\n".to_owned();
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let event = e.get("event").unwrap_or(&Value::Null);
            vec![
                scalar(e.get("sequence_id").unwrap_or(&Value::Null)).unwrap_or_default(),
                e.get("created_at_ms")
                    .and_then(Value::as_i64)
                    .map(utc)
                    .unwrap_or_default(),
                text(e, "kind"),
                event_detail(event),
            ]
        })
        .collect();
    let mut out = table(
        &[
            Column::new("SEQ").right(),
            Column::new("TIME (UTC)"),
            Column::new("EVENT"),
            Column::flex("DETAIL"),
        ],
        &rows,
        screen.width,
    );
    let _ = writeln!(out, "{}", count(events.len(), "event", "events"));
    if data.get("has_more").and_then(Value::as_bool) == Some(true) {
        let session = Value::String(text(data, "session_id"));
        // A backward page (before_seq) says so by its next_before_seq; it pages on backwards.
        let next = match data.get("next_before_seq").and_then(Value::as_i64) {
            Some(before) => format!("\"before_seq\":{before}"),
            None => format!(
                "\"after_seq\":{}",
                data.get("next_after_seq")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
            ),
        };
        let _ = writeln!(
            out,
            "more: agent-host session.history '{{\"session_id\":{session},{next}}}'"
        );
    }
    out
}

/// One line saying what a stored event was about.
fn event_detail(event: &Value) -> String {
    let s = |key: &str| text(event, key);
    let kind = event.get("k").and_then(Value::as_str).unwrap_or_default();
    match kind {
        "user.text" => format!("you: {}", s("text")),
        "text.end" => s("text"),
        "thinking.end" => format!("thinking: {}", s("text")),
        "tool.call.start" | "tool.call.end" => {
            let input = event.get("input").map(compact).unwrap_or_default();
            format!("{} {input}", s("name")).trim_end().to_owned()
        }
        "tool.exec.end" => {
            let mark = if event.get("isError").and_then(Value::as_bool) == Some(true) {
                "failed: "
            } else {
                ""
            };
            format!("{mark}{}", s("output"))
        }
        "run.start" => s("runId"),
        "run.end" => {
            let why: Vec<String> = [s("category"), s("message")]
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect();
            if why.is_empty() {
                s("state")
            } else {
                format!("{} ({})", s("state"), why.join(": "))
            }
        }
        "permission.request" => {
            let input = event.get("input").map(compact).unwrap_or_default();
            format!("{} {input}", s("tool")).trim_end().to_owned()
        }
        "permission.resolved" => {
            let by = s("by");
            if by.is_empty() {
                s("decision")
            } else {
                format!("{} by {by}", s("decision"))
            }
        }
        "usage" => format!(
            "{} in, {} out",
            event
                .get("inputTokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            event
                .get("outputTokens")
                .and_then(Value::as_u64)
                .unwrap_or(0)
        ),
        "session.bound" => s("nativeSessionId"),
        "session.forked" => format!("from {}", s("parentSessionId")),
        "warning" => format!("{}: {}", s("code"), s("message")),
        "error" => format!("{}: {}", s("category"), s("message")),
        _ => ["text", "message", "state"]
            .iter()
            .map(|k| s(k))
            .find(|t| !t.is_empty())
            .unwrap_or_default(),
    }
}

fn agent_list(data: &Value, screen: &Screen) -> String {
    let agents = array(data, "agents");
    let rows: Vec<Vec<String>> = agents
        .iter()
        .map(|a| {
            let usable = a.get("usable").and_then(Value::as_bool) == Some(true);
            let note = if usable {
                text(a, "protocol")
            } else {
                let reason = text(a, "reason");
                if reason.is_empty() {
                    text(a, "error")
                } else {
                    reason
                }
            };
            vec![
                text(a, "agent_type"),
                if usable { "yes" } else { "no" }.to_owned(),
                text(a, "version"),
                text(a, "binary"),
                note,
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no agents\n".to_owned()
    } else {
        table(
            &[
                Column::new("AGENT").max(24),
                Column::new("USABLE"),
                Column::new("VERSION").max(24),
                Column::new("BINARY").max(32),
                Column::flex("PROTOCOL OR WHY NOT"),
            ],
            &rows,
            screen.width,
        )
    };
    for bad in array(data, "invalid") {
        let _ = writeln!(
            out,
            "invalid [agents.{}] in config.toml: {}",
            text(bad, "agent_type"),
            text(bad, "reason")
        );
    }
    out
}

fn host_status(data: &Value, screen: &Screen) -> String {
    let Value::Object(map) = data else {
        return "host: no status\n".to_owned();
    };
    if map.get("running").and_then(Value::as_bool) != Some(true) {
        return "host     not running (start it with: agent-host host.start)\n".to_owned();
    }
    let mut fields = Fields::default();
    let mut host = vec!["running".to_owned()];
    if let Some(pid) = map.get("pid").and_then(scalar) {
        host.push(format!("pid {pid}"));
    }
    if let Some(version) = map.get("version").and_then(scalar) {
        host.push(format!("version {version}"));
    }
    if let Some(started) = map.get("started_at").and_then(Value::as_str) {
        let since = humantime::parse_rfc3339_weak(started).ok().and_then(|t| {
            let ms = t.duration_since(UNIX_EPOCH).ok()?.as_millis();
            i64::try_from(ms).ok()
        });
        match since {
            Some(ms) => host.push(format!(
                "up {} (since {} UTC)",
                span(screen.now_ms.saturating_sub(ms)),
                utc(ms)
            )),
            None => host.push(format!("since {}", cell(started))),
        }
    }
    fields.add("host", host.join(", "));
    if let Some(n) = map.get("sessions").and_then(scalar) {
        fields.add("sessions", n);
    }
    if let Some(port) = map.get("ws_port").and_then(Value::as_u64) {
        fields.add(
            "web",
            format!("ws://127.0.0.1:{port} (agent-host open: the web UI)"),
        );
    }
    if let Some(path) = map.get("ipc_path").and_then(scalar) {
        fields.add("ipc", path);
    }
    if let Some(Value::Object(store)) = map.get("store") {
        let mut line = text_in(store, "state");
        if let Some(error) = store.get("error").and_then(scalar) {
            let _ = write!(line, ": {error}");
        }
        if let Some(outages) = store.get("outages").and_then(Value::as_u64)
            && outages > 0
        {
            let _ = write!(line, " ({outages} outages)");
        }
        fields.add("store", line);
    }
    if let Some(Value::Object(relay)) = map.get("relay") {
        let mut line = text_in(relay, "state");
        if let Some(url) = relay.get("url").and_then(scalar) {
            let _ = write!(line, " {url}");
        }
        if let Some(error) = relay.get("last_error").and_then(scalar) {
            let _ = write!(line, " (last error: {error})");
        }
        fields.add("relay", line);
    }
    if let Some(Value::Object(fleet)) = map.get("fleet") {
        let mut line = text_in(fleet, "state");
        if let Some(url) = fleet.get("url").and_then(scalar) {
            let _ = write!(line, " {url}");
        }
        if let Some(instance) = fleet.get("instance").and_then(scalar) {
            let _ = write!(line, " ({instance})");
        }
        if let Some(rtt) = fleet.get("round_trip_ms").and_then(Value::as_u64) {
            let _ = write!(line, ", round trip {rtt} ms");
        }
        if let Some(channels) = fleet.get("channels").and_then(Value::as_u64)
            && channels > 0
        {
            let _ = write!(line, ", {channels} bot channels");
        }
        if let Some(error) = fleet.get("last_error").and_then(scalar) {
            let _ = write!(line, " (last error: {error})");
        }
        fields.add("fleet", line);
    }
    if let Some(files) = data.pointer("/limits/open_files") {
        fields.add(
            "open files",
            format!(
                "{} (hard {})",
                files.get("soft").and_then(scalar).unwrap_or_default(),
                files.get("hard").and_then(scalar).unwrap_or_default()
            ),
        );
    }
    // Whatever else the host reports (a log path, say), by its own name.
    const SHOWN: &[&str] = &[
        "running",
        "pid",
        "version",
        "started_at",
        "sessions",
        "ws_port",
        "ipc_path",
        "store",
        "relay",
        "fleet",
        "limits",
    ];
    for (key, value) in map {
        if SHOWN.contains(&key.as_str()) {
            continue;
        }
        if let Some(text) = scalar(value) {
            fields.add(&key.replace('_', " "), text);
        }
    }
    fields.render()
}

fn subscriber_list(data: &Value, screen: &Screen) -> String {
    let subscribers = array(data, "subscribers");
    if subscribers.is_empty() {
        return "no subscribers\n".to_owned();
    }
    let rows: Vec<Vec<String>> = subscribers
        .iter()
        .map(|s| {
            // `last_seen_at_ms` is null for one that never connected; a host before it
            // reported none, and its row's last update stands in.
            let seen = match s.get("last_seen_at_ms") {
                Some(Value::Null) => "never".to_owned(),
                Some(at) => when(Some(at), screen),
                None => when(s.get("updated_at_ms"), screen),
            };
            let connected = s.get("connected").and_then(Value::as_bool) == Some(true);
            vec![
                text(s, "subscriber_id"),
                text(s, "client"),
                match s.get("session_id").and_then(Value::as_str) {
                    Some(id) => cell(id),
                    None => "all".to_owned(),
                },
                if connected { "now" } else { "no" }.to_owned(),
                if connected { "now".to_owned() } else { seen },
                scalar(s.get("most_recent_sequence_id").unwrap_or(&Value::Null))
                    .unwrap_or_default(),
                scalar(s.get("deltas_dropped").unwrap_or(&Value::Null)).unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            Column::new("SUBSCRIBER"),
            Column::new("CLIENT").max(16),
            Column::new("SESSIONS"),
            Column::new("CONNECTED"),
            Column::new("SEEN"),
            Column::new("CURSOR").right(),
            Column::new("DROPPED").right(),
        ],
        &rows,
        screen.width,
    );
    let _ = writeln!(
        out,
        "{}",
        count(subscribers.len(), "subscriber", "subscribers")
    );
    out
}

/// `pair.list`'s reply, `{bots: [{bot_id, name, scope, paired_at_ms, last_seen_at_ms,
/// revoked_at_ms, connected}]}`.
fn pair_list(data: &Value, screen: &Screen) -> String {
    let bots = array(data, "bots");
    if bots.is_empty() {
        return "no paired bots (`agent-host pair` makes a code for one)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = bots
        .iter()
        .map(|b| {
            let scope = b.get("scope").unwrap_or(&Value::Null);
            let sessions = match scope.get("sessions").and_then(Value::as_array) {
                None => "all".to_owned(),
                Some(ids) => count(ids.len(), "session", "sessions"),
            };
            let rights: Vec<&str> = [
                ("prompt", "prompt"),
                ("permissions", "permissions"),
                ("create_sessions", "create"),
            ]
            .iter()
            .filter(|(key, _)| scope.get(*key).and_then(Value::as_bool) == Some(true))
            .map(|(_, label)| *label)
            .collect();
            let state = if b.get("revoked_at_ms").is_some_and(|v| !v.is_null()) {
                format!("revoked {}", when(b.get("revoked_at_ms"), screen))
            } else if b.get("connected").and_then(Value::as_bool) == Some(true) {
                "connected".to_owned()
            } else {
                "paired".to_owned()
            };
            let seen = match b.get("last_seen_at_ms") {
                Some(Value::Null) | None => "never".to_owned(),
                Some(at) => when(Some(at), screen),
            };
            vec![
                text(b, "bot_id"),
                text(b, "name"),
                state,
                when(b.get("paired_at_ms"), screen),
                seen,
                sessions,
                if rights.is_empty() {
                    "read".to_owned()
                } else {
                    rights.join(", ")
                },
            ]
        })
        .collect();
    let mut out = table(
        &[
            Column::new("BOT"),
            Column::flex("NAME"),
            Column::new("STATE"),
            Column::new("PAIRED"),
            Column::new("SEEN"),
            Column::new("SESSIONS"),
            Column::new("MAY"),
        ],
        &rows,
        screen.width,
    );
    let _ = writeln!(out, "{}", count(bots.len(), "bot", "bots"));
    out
}

/// `pair.create`'s reply: the QR to scan (only its block characters are drawn), the code to
/// paste, and how long it works.
fn pair_create(data: &Value, screen: &Screen) -> String {
    let mut out = String::new();
    let qr = data.get("qr").and_then(Value::as_str).unwrap_or("");
    for line in qr.lines() {
        let drawn: String = line
            .chars()
            .filter(|c| matches!(c, ' ' | '\u{2580}' | '\u{2584}' | '\u{2588}'))
            .collect();
        let _ = writeln!(out, "{drawn}");
    }
    let _ = writeln!(out, "{}", text(data, "code"));
    if let Some(expires) = data.get("expires_at_ms").and_then(Value::as_i64) {
        let _ = writeln!(
            out,
            "valid for {} (until {} UTC): it pairs one bot, once",
            span(expires.saturating_sub(screen.now_ms)),
            utc(expires)
        );
    }
    if array(data, "relay_urls").is_empty() {
        let _ = writeln!(
            out,
            "no relay is configured: the bot must be told where to reach this host"
        );
    }
    out
}

/// `doctor`'s reply, `{checks: [{name, verdict, detail, fix?}]}` (`verdict` one of `ok`, `warn`,
/// `fail`, `skip`; `status`, `ok: bool`, `message` and `hint` are read too).
fn doctor(data: &Value, screen: &Screen) -> String {
    let checks: Vec<Check> = array(data, "checks")
        .iter()
        .map(|c| Check {
            verdict: match c.get("verdict").or_else(|| c.get("status")) {
                Some(Value::String(v)) => cell(v),
                _ => match c.get("ok").and_then(Value::as_bool) {
                    Some(true) => "ok".to_owned(),
                    Some(false) => "fail".to_owned(),
                    None => "?".to_owned(),
                },
            },
            name: text(c, "name"),
            detail: ["detail", "message"]
                .iter()
                .map(|k| text(c, k))
                .find(|t| !t.is_empty())
                .unwrap_or_default(),
            fix: ["fix", "hint"]
                .iter()
                .map(|k| text(c, k))
                .find(|t| !t.is_empty()),
        })
        .collect();
    check_lines(&checks, screen.width)
}

/// One check of a report such as `doctor`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// `ok`, `warn`, `fail`, `skip`: shown upper-cased unless `ok`, so failures stand out.
    pub verdict: String,
    pub name: String,
    pub detail: String,
    /// What to do about it, on failure.
    pub fix: Option<String>,
}

/// One aligned line per check (verdict, name, detail), and under a check that has one, what
/// to do about it; then a count of the checks that did not pass.
pub fn check_lines(checks: &[Check], width: usize) -> String {
    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| {
            let verdict = if c.verdict.eq_ignore_ascii_case("ok") {
                "ok".to_owned()
            } else {
                c.verdict.to_uppercase()
            };
            vec![verdict, cell(&c.name), cell(&c.detail)]
        })
        .collect();
    let lines = table(
        &[
            Column::new("").max(6),
            Column::new("").max(28),
            Column::flex(""),
        ],
        &rows,
        width,
    );
    let mut out = String::new();
    // The table's first line is its (empty) header: leave it out.
    for (line, check) in lines.lines().skip(1).zip(checks) {
        let _ = writeln!(out, "{line}");
        if let Some(fix) = &check.fix {
            let _ = writeln!(out, "      → {}", cell(fix));
        }
    }
    let failed = checks
        .iter()
        .filter(|c| {
            !c.verdict.eq_ignore_ascii_case("ok") && !c.verdict.eq_ignore_ascii_case("skip")
        })
        .count();
    let _ = if failed == 0 {
        writeln!(out, "all {} checks passed", checks.len())
    } else {
        writeln!(out, "{failed} of {} checks need attention", checks.len())
    };
    out
}

// ---- tables ----

/// A column of [`table`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub title: &'static str,
    /// The widest its cells are shown (longer ones end in `…`).
    pub max: usize,
    /// Shares the width the other columns leave with the other flexible ones (at least
    /// [`MIN_FLEX`]).
    pub flex: bool,
    /// Aligned to the right (numbers).
    pub right: bool,
}

impl Column {
    pub const fn new(title: &'static str) -> Column {
        Column {
            title,
            max: usize::MAX,
            flex: false,
            right: false,
        }
    }

    pub const fn flex(title: &'static str) -> Column {
        Column {
            flex: true,
            ..Column::new(title)
        }
    }

    pub const fn max(self, max: usize) -> Column {
        Column { max, ..self }
    }

    pub const fn right(self) -> Column {
        Column {
            right: true,
            ..self
        }
    }
}

/// Rows under a header, each column as wide as its widest cell (up to its `max`), two spaces
/// apart, in display width (wide characters count two); a flexible column gets what is left
/// of `width`. Cells are made [`cell`]-safe; no line ends in spaces.
pub fn table(columns: &[Column], rows: &[Vec<String>], width: usize) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| cell(c)).collect())
        .collect();
    let natural: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, col)| {
            let widest = rows
                .iter()
                .filter_map(|row| row.get(i))
                .map(|c| c.width())
                .max()
                .unwrap_or(0);
            widest.max(col.title.width()).min(col.max)
        })
        .collect();
    let gaps = 2 * columns.len().saturating_sub(1);
    let fixed: usize = columns
        .iter()
        .zip(&natural)
        .filter(|(col, _)| !col.flex)
        .map(|(_, w)| *w)
        .sum();
    // The flexible columns share what is left, the narrowest first, so one that needs less
    // than its share leaves the rest to the others.
    let mut widths = natural.clone();
    let mut flexes: Vec<usize> = (0..columns.len()).filter(|i| columns[*i].flex).collect();
    flexes.sort_by_key(|i| natural[*i]);
    let mut room = width.saturating_sub(fixed + gaps);
    for (n, i) in flexes.iter().enumerate() {
        let share = room / (flexes.len() - n);
        let w = natural[*i].min(share.max(MIN_FLEX.min(natural[*i])));
        widths[*i] = w;
        room = room.saturating_sub(w);
    }
    let mut out = String::new();
    let header: Vec<String> = columns.iter().map(|c| c.title.to_owned()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (col, w)) in columns.iter().zip(&widths).enumerate() {
            let text = fit(row.get(i).map_or("", String::as_str), *w);
            let pad = " ".repeat(w.saturating_sub(text.width()));
            if i > 0 {
                line.push_str("  ");
            }
            if col.right {
                line.push_str(&pad);
                line.push_str(&text);
            } else {
                line.push_str(&text);
                line.push_str(&pad);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `text` cut to `width` display columns, ending in `…` when it was cut.
pub fn fit(text: &str, width: usize) -> String {
    if text.width() <= width {
        return text.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        used += w;
        out.push(c);
    }
    if width > 0 {
        out.push('…');
    }
    out
}

/// Text for one line of a terminal: runs of whitespace (newlines, tabs) become one space, and
/// other control characters are shown, never interpreted (`ESC` as `^[`, DEL as `^?`, a C1
/// control as `<U+009B>`), so a title or an agent's answer cannot move the cursor or clear
/// the screen.
pub fn cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.trim().chars() {
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        match c {
            '\u{7f}' => out.push_str("^?"),
            c if u32::from(c) < 0x20 => {
                out.push('^');
                out.push(char::from(b'@' + c as u8));
            }
            c if ('\u{80}'..='\u{9f}').contains(&c) => {
                let _ = write!(out, "<U+{:04X}>", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `label  value` lines with the values aligned.
#[derive(Debug, Default)]
struct Fields(Vec<(String, String)>);

impl Fields {
    fn add(&mut self, label: &str, value: String) {
        self.0.push((label.to_owned(), value));
    }

    fn render(&self) -> String {
        let width = self.0.iter().map(|(l, _)| l.width()).max().unwrap_or(0);
        let mut out = String::new();
        for (label, value) in &self.0 {
            let line = format!("{label:<width$}  {}", cell(value));
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

// ---- values and times ----

fn array<'a>(data: &'a Value, key: &str) -> &'a [Value] {
    data.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A string or number field as one safe line; `""` when absent or null.
fn text(value: &Value, key: &str) -> String {
    value.get(key).and_then(scalar).unwrap_or_default()
}

fn text_in(map: &Map<String, Value>, key: &str) -> String {
    map.get(key).and_then(scalar).unwrap_or_default()
}

/// A string, number or bool as one safe line; `None` for null, arrays and objects.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(cell(s)),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "yes" } else { "no" }.to_owned()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// A JSON value on one line (a tool's input).
fn compact(value: &Value) -> String {
    match value {
        Value::String(s) => cell(s),
        Value::Null => String::new(),
        other => cell(&other.to_string()),
    }
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `~/…` for a path under `$HOME`.
fn home_relative(path: &str) -> String {
    match std::env::var("HOME") {
        Ok(home) if !home.is_empty() && home != "/" => match path.strip_prefix(home.as_str()) {
            Some("") => "~".to_owned(),
            Some(rest) if rest.starts_with('/') => format!("~{rest}"),
            _ => path.to_owned(),
        },
        _ => path.to_owned(),
    }
}

/// How long ago a time in ms since the epoch was: `just now`, `42 s ago`, `5 min ago`,
/// `3 h ago`, `2 d ago`; older than a week, its date.
fn when(ms: Option<&Value>, screen: &Screen) -> String {
    let Some(ms) = ms.and_then(Value::as_i64) else {
        return String::new();
    };
    ago(screen.now_ms, ms)
}

pub fn ago(now_ms: i64, then_ms: i64) -> String {
    let secs = now_ms.saturating_sub(then_ms) / 1000;
    match secs {
        i64::MIN..5 => "just now".to_owned(),
        5..60 => format!("{secs} s ago"),
        60..3600 => format!("{} min ago", secs / 60),
        3600..86_400 => format!("{} h ago", secs / 3600),
        86_400..604_800 => format!("{} d ago", secs / 86_400),
        _ => utc(then_ms).chars().take(10).collect(),
    }
}

/// A duration in ms, as an uptime: `42 s`, `5 min`, `3 h 20 min`, `2 d 4 h`.
fn span(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
        _ => format!("{} d {} h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// Relative and exact: `5 min ago (2026-12-02 06:46:31 UTC)`.
fn moment(ms: Option<&Value>, screen: &Screen) -> String {
    match ms.and_then(Value::as_i64) {
        Some(ms) => format!("{} ({} UTC)", ago(screen.now_ms, ms), utc(ms)),
        None => String::new(),
    }
}

/// `2026-12-02 06:46:31` (UTC) for a time in ms since the epoch.
pub fn utc(ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let text = humantime::format_rfc3339_seconds(time).to_string();
    text.trim_end_matches('Z').replacen('T', " ", 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// 2026-12-02 06:50:00 UTC, a few minutes after the recorded replies below.
    const NOW: i64 = 1_796_194_200_000;

    fn screen() -> Screen {
        Screen {
            now_ms: NOW,
            width: 120,
        }
    }

    fn reply(line: &str) -> Reply {
        serde_json::from_str(line).unwrap()
    }

    /// Recorded from a real host (`agent-host session.list` piped), two sessions.
    const SESSION_LIST: &str = r#"{"code":0,"message":"ok","data":{"next_cursor":null,"sessions":[{"agent_type":"codex","binding":{"provider":{"host":"api.openai.com"},"recorded_at_ms":1796193991660},"created_at_ms":1796193991649,"cwd":"/tmp/i20/human-base/w2","last_activity_ms":1796193991649,"native_session_id":null,"parent_session_id":null,"preview":null,"session_id":"01a23581-3be1-73dd-ae20-6c47b58b4f38","state":"idle","title":null,"updated_at_ms":1796193991649},{"agent_type":"claude","binding":{"provider":{"host":"api.anthropic.com"},"recorded_at_ms":1796193991630},"created_at_ms":1796193991616,"cwd":"/tmp/i20/human-base/w1","last_activity_ms":1796193991616,"native_session_id":null,"parent_session_id":null,"preview":"echo: hello\nworld \u001b[2J done","session_id":"01a23581-3bc0-7264-875f-f731ec61c60a","state":"running","title":"fix the failing test","updated_at_ms":1796193991616}]}}"#;

    #[test]
    fn session_list_is_a_table_with_a_row_per_session() {
        let view = render("session.list", &reply(SESSION_LIST), &screen());
        assert_eq!(view.stderr, "");
        let lines: Vec<&str> = view.stdout.lines().collect();
        assert_eq!(
            lines,
            [
                "SESSION                               AGENT   STATE    ACTIVE     TITLE                     LAST MESSAGE",
                "01a23581-3be1-73dd-ae20-6c47b58b4f38  codex   idle     3 min ago  (/tmp/i20/human-base/w2)",
                "01a23581-3bc0-7264-875f-f731ec61c60a  claude  running  3 min ago  fix the failing test      echo: hello world ^[[2J done",
                "2 sessions",
            ],
            "{}",
            view.stdout
        );
    }

    #[test]
    fn a_narrow_terminal_cuts_the_preview_not_the_ids() {
        let narrow = Screen {
            width: 90,
            ..screen()
        };
        let view = render("session.list", &reply(SESSION_LIST), &narrow);
        for line in view.stdout.lines() {
            assert!(line.width() <= 90, "{line:?} is wider than 90");
        }
        assert!(view.stdout.contains("01a23581-3bc0-7264-875f-f731ec61c60a"));
        assert!(view.stdout.contains("echo: hell…"), "{}", view.stdout);
    }

    #[test]
    fn a_next_page_says_how_to_get_it() {
        let mut r = reply(SESSION_LIST);
        r.data["next_cursor"] = json!("c1");
        let view = render("session.list", &r, &screen());
        assert!(
            view.stdout
                .ends_with("more: agent-host session.list '{\"cursor\":\"c1\"}'\n"),
            "{}",
            view.stdout
        );
        r.data["sessions"] = json!([]);
        r.data["next_cursor"] = Value::Null;
        assert_eq!(
            render("session.list", &r, &screen()).stdout,
            "no sessions\n"
        );
    }

    #[test]
    fn an_error_is_one_readable_line_on_stderr() {
        let r = reply(
            r#"{"code":3001,"message":"no session \"nope\"","data":{"error":"session_not_found","session_id":"nope"}}"#,
        );
        let view = render("session.get", &r, &screen());
        assert_eq!(view.stdout, "");
        assert_eq!(
            view.stderr,
            "error: no session \"nope\" (session_not_found)\n  session_id: nope\n"
        );
    }

    #[test]
    fn host_status_is_a_summary_with_what_it_does_not_know_listed_too() {
        let r = reply(
            r#"{"code":0,"message":"ok","data":{"ipc_path":"/h/host.sock","limits":{"open_files":{"hard":20000,"soft":1024}},"pid":4876,"relay":{"last_error":"refused","retries":3,"retry_in_ms":null,"since_ms":1796193991597,"state":"connecting","subscriber_id":"relay","url":"wss://relay.example"},"running":true,"sessions":2,"started_at":"2026-12-02T06:46:31.535Z","store":{"error":null,"outages":0,"since":1796193991589,"state":"ok"},"version":"0.1.0","ws_port":40543,"log_path":"/h/logs/host.log"}}"#,
        );
        let view = render("host.status", &r, &screen());
        assert_eq!(
            view.stdout,
            "host        running, pid 4876, version 0.1.0, up 3 min (since 2026-12-02 06:46:31 UTC)\n\
             sessions    2\n\
             web         ws://127.0.0.1:40543 (agent-host open: the web UI)\n\
             ipc         /h/host.sock\n\
             store       ok\n\
             relay       connecting wss://relay.example (last error: refused)\n\
             open files  1024 (hard 20000)\n\
             log path    /h/logs/host.log\n"
        );
        let down = render(
            "host.status",
            &reply(r#"{"code":0,"message":"ok","data":{"running":false}}"#),
            &screen(),
        );
        assert!(down.stdout.starts_with("host     not running"), "{down:?}");
    }

    #[test]
    fn session_get_shows_the_row_its_queue_and_its_rules() {
        let r = reply(
            r#"{"code":0,"message":"ok","data":{"agent_type":"claude","created_at_ms":1796193991616,"cwd":"/w","live":{"agent_pid":77,"run_id":"r1","queued":["r2"],"watching":false,"drifted":false},"native_session_id":"n-1","parent_session_id":null,"permission_rules":[{"request_id":"p","tool":"Bash","option_id":"allow_always","label":"Always","description":"always allow Bash(npm test) in this session","by":"web","at_ms":1796193991700}],"queue":[{"run_id":"r2","text":"then run\nthe tests","created_at_ms":1796194190000}],"session_id":"s-1","state":"running","title":"t","updated_at_ms":1796193991616,"options":{"model":"opus"}}}"#,
        );
        let out = render("session.get", &r, &screen()).stdout;
        assert!(out.starts_with("session  s-1\ntitle    t\nagent    claude (its session n-1)\nstate    running\ncwd      /w\nmodel    opus\n"), "{out}");
        assert!(
            out.contains("created  3 min ago (2026-12-02 06:46:31 UTC)"),
            "{out}"
        );
        assert!(out.contains("live     agent pid 77, running r1"), "{out}");
        assert!(
            out.contains("1  r2   10 s ago  then run the tests"),
            "{out}"
        );
        assert!(
            out.contains("Bash  web  3 min ago  always allow Bash(npm test) in this session"),
            "{out}"
        );
    }

    #[test]
    fn session_history_is_one_line_per_event() {
        let r = reply(
            r#"{"code":0,"message":"ok","data":{"count":4,"events":[
            {"sequence_id":7,"message_id":"m","run_id":"r","kind":"user.text","created_at_ms":1796193991616,"event":{"k":"user.text","sessionId":"s","runId":"r","text":"fix it"}},
            {"sequence_id":9,"message_id":"m","run_id":"r","kind":"tool.call.end","created_at_ms":1796193992616,"event":{"k":"tool.call.end","sessionId":"s","runId":"r","name":"Bash","input":{"command":"ls"}}},
            {"sequence_id":12,"message_id":"m","run_id":"r","kind":"text.end","created_at_ms":1796193993616,"event":{"k":"text.end","sessionId":"s","runId":"r","text":"done\nall good"}},
            {"sequence_id":13,"message_id":"m","run_id":"r","kind":"run.end","created_at_ms":1796193993716,"event":{"k":"run.end","sessionId":"s","runId":"r","state":"failed","category":"rate_limited","message":"slow down"}}
            ],"has_more":true,"next_after_seq":13,"next_before_seq":null,"session_id":"s"}}"#,
        );
        let out = render("session.history", &r, &screen()).stdout;
        assert_eq!(
            out,
            "SEQ  TIME (UTC)           EVENT          DETAIL\n  \
               7  2026-12-02 06:46:31  user.text      you: fix it\n  \
               9  2026-12-02 06:46:32  tool.call.end  Bash {\"command\":\"ls\"}\n \
              12  2026-12-02 06:46:33  text.end       done all good\n \
              13  2026-12-02 06:46:33  run.end        failed (rate_limited: slow down)\n\
             4 events\n\
             more: agent-host session.history '{\"session_id\":\"s\",\"after_seq\":13}'\n"
        );
    }

    #[test]
    fn agent_list_says_why_an_agent_is_not_usable() {
        let r = reply(
            r#"{"code":0,"message":"ok","data":{"agents":[{"agent_type":"claude","binary":"claude","error":"binary_unavailable","protocol":"claude-code stream-json","reason":"claude not found on PATH","usable":false,"version":null},{"agent_type":"codex","binary":"/usr/bin/codex","protocol":"codex app-server JSON-RPC","usable":true,"version":"0.98.0"}],"invalid":[{"agent_type":"mine","reason":"command is empty"}]}}"#,
        );
        let out = render("agent.list", &r, &screen()).stdout;
        assert_eq!(
            out,
            "AGENT   USABLE  VERSION  BINARY          PROTOCOL OR WHY NOT\n\
             claude  no               claude          claude not found on PATH\n\
             codex   yes     0.98.0   /usr/bin/codex  codex app-server JSON-RPC\n\
             invalid [agents.mine] in config.toml: command is empty\n"
        );
    }

    #[test]
    fn subscriber_list_shows_when_each_was_last_seen() {
        let r = reply(
            r#"{"code":0,"message":"ok","data":{"subscribers":[{"client":"web","connected":false,"created_at_ms":1796193991675,"deltas_dropped":0,"forward_deltas":false,"max_count":200,"most_recent_sequence_id":42,"replay_mode":"max_count","session_id":null,"subscriber_id":"sub-1","type":"local","updated_at_ms":1796193991675,"last_seen_at_ms":1796020000000},{"connected":true,"deltas_dropped":3,"most_recent_sequence_id":7,"session_id":"s-1","subscriber_id":"sub-2","type":"local","updated_at_ms":1796193991675},{"connected":false,"deltas_dropped":0,"most_recent_sequence_id":0,"session_id":null,"subscriber_id":"sub-3","type":"local","updated_at_ms":1796193991675,"last_seen_at_ms":null}]}}"#,
        );
        let out = render("subscriber.list", &r, &screen()).stdout;
        assert_eq!(
            out,
            "SUBSCRIBER  CLIENT  SESSIONS  CONNECTED  SEEN     CURSOR  DROPPED\n\
             sub-1       web     all       no         2 d ago      42        0\n\
             sub-2               s-1       now        now           7        3\n\
             sub-3               all       no         never         0        0\n\
             3 subscribers\n"
        );
    }

    #[test]
    fn pair_list_shows_each_bot_its_state_and_what_it_may_do() {
        let r = reply(
            r#"{"code":0,"message":"ok","data":{"bots":[{"bot_id":"a1b2c3d4e5f6a1b2c3d4e5f6","name":"phone\u001b[2J","scope":{"sessions":null,"prompt":true,"permissions":false,"create_sessions":false},"paired_at_ms":1796020000000,"last_seen_at_ms":1796194000000,"revoked_at_ms":null,"connected":true},{"bot_id":"0000aaaa0000aaaa0000aaaa","name":"old","scope":{"sessions":["s"],"prompt":false,"permissions":false,"create_sessions":false},"paired_at_ms":1796020000000,"last_seen_at_ms":null,"revoked_at_ms":1796193900000,"connected":false}]}}"#,
        );
        let out = render("pair.list", &r, &screen()).stdout;
        assert_eq!(
            out,
            "BOT                       NAME        STATE              PAIRED   SEEN       SESSIONS   MAY\n\
             a1b2c3d4e5f6a1b2c3d4e5f6  phone^[[2J  connected          2 d ago  3 min ago  all        prompt\n\
             0000aaaa0000aaaa0000aaaa  old         revoked 5 min ago  2 d ago  never      1 session  read\n\
             2 bots\n"
        );
        let none = reply(r#"{"code":0,"message":"ok","data":{"bots":[]}}"#);
        assert!(
            render("pair.list", &none, &screen())
                .stdout
                .starts_with("no paired bots")
        );
    }

    #[test]
    fn pair_create_is_the_qr_the_code_and_its_validity() {
        let r = reply(&format!(
            r#"{{"code":0,"message":"ok","data":{{"code":"ahpair1.abc","qr":"█▀▄ \u001b[31m\n▄▄▄","expires_at_ms":{},"relay_urls":[],"host_id":"h","secret_id":"i"}}}}"#,
            NOW + 600_000
        ));
        let out = render("pair.create", &r, &screen()).stdout;
        assert_eq!(
            out,
            "█▀▄ \n▄▄▄\nahpair1.abc\nvalid for 10 min (until 2026-12-02 07:00:00 UTC): it pairs one bot, once\n\
             no relay is configured: the bot must be told where to reach this host\n"
        );
    }

    #[test]
    fn doctor_checks_are_aligned_lines_with_what_to_do() {
        let r = reply(
            r#"{"code":0,"message":"ok","data":{"checks":[{"name":"home","verdict":"ok","detail":"/h is 0700"},{"name":"socket","verdict":"fail","detail":"host.sock is 0644","fix":"chmod 600 /h/host.sock"},{"name":"relay","ok":true,"message":"not configured"}]}}"#,
        );
        let out = render("doctor", &r, &screen()).stdout;
        assert_eq!(
            out,
            "ok    home    /h is 0700\n\
             FAIL  socket  host.sock is 0644\n      \
             → chmod 600 /h/host.sock\n\
             ok    relay   not configured\n\
             1 of 3 checks need attention\n"
        );
    }

    #[test]
    fn a_failed_doctor_prints_its_checks_and_the_error() {
        let r = reply(
            r#"{"code":2012,"message":"1 check failed","data":{"error":"checks_failed","ok":false,"checks":[{"name":"socket","verdict":"fail","detail":"host.sock is 0644","fix":"chmod 600 /h/host.sock"}]}}"#,
        );
        let view = render("doctor", &r, &screen());
        assert_eq!(
            view.stdout,
            "FAIL  socket  host.sock is 0644\n      → chmod 600 /h/host.sock\n1 of 1 checks need attention\n"
        );
        assert_eq!(view.stderr, "error: 1 check failed (checks_failed)\n");
    }

    #[test]
    fn cells_are_one_safe_line_and_fit_counts_display_width() {
        assert_eq!(
            cell(" a\tb\n\nc\u{1b}[31m\u{9b}\u{7f} "),
            "a b c^[[31m<U+009B>^?"
        );
        assert_eq!(fit("日本語のテキスト", 7), "日本語…");
        assert_eq!(fit("short", 7), "short");
        assert_eq!(fit("exactly", 7), "exactly");
        assert_eq!(fit("exactly!", 7), "exactl…");
    }

    #[test]
    fn times_are_relative_and_old_ones_dated() {
        assert_eq!(ago(NOW, NOW + 5_000), "just now");
        assert_eq!(ago(NOW, NOW - 42_000), "42 s ago");
        assert_eq!(ago(NOW, NOW - 3 * 3_600_000), "3 h ago");
        assert_eq!(ago(NOW, NOW - 8 * 86_400_000), "2026-11-24");
        assert_eq!(utc(1_796_193_991_616), "2026-12-02 06:46:31");
        assert_eq!(span(2 * 86_400_000 + 4 * 3_600_000), "2 d 4 h");
    }

    #[test]
    fn only_the_list_like_commands_have_a_view() {
        for name in COMMANDS {
            assert!(renders(name));
        }
        assert!(!renders("session.send"));
        assert!(!renders("version"));
    }
}
