//! `session.export`: a session's transcript, as readable Markdown or as the stored canonical
//! events (JSON Lines), in pages a reply can carry over every transport.
//!
//! **Where it goes.** Into the reply, never a file: a remote bot (through the relay) or a
//! browser cannot read the host's disk, and a terminal user redirects the reply. A page holds
//! at most [`MAX_EXPORT_BYTES`] of content, or one event when that one alone is larger (an
//! event is at most 4 MiB), so every page fits a WebSocket message a client accepts
//! (`MAX_PUSH_BYTES`, 16 MiB). A page ends at an event boundary: pages concatenated are the
//! whole transcript (the Markdown header is on the first page only). `next_after_seq` is the
//! `after_seq` of the next page; `has_more` says whether there is one.
//!
//! **Markdown** is rendered from each event's JSON as stored (so events of a newer host still
//! render, and kinds this build does not know are left out): the prompt as a quote, with who
//! sent it; the answer as the agent wrote it (it is Markdown already); each tool call with its
//! input, its output and how it ended; each permission request, its options and who answered
//! it how; warnings, errors and the end of every run that did not complete; thinking when
//! asked. Fenced blocks use a fence longer than any run of backticks inside them, so a tool's
//! output never breaks out of its block.
//!
//! Nothing here does I/O but reading history through the session layer.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use crate::protocol::envelope::{ExportFormat, HistoryFrom, SessionExportParams};
use crate::session::{SessionError, SessionManager};
use crate::store::{SessionRow, StoredEvent};

/// The most content one page carries (unless a single event is larger).
pub const MAX_EXPORT_BYTES: usize = 1024 * 1024;
/// Events read from the store at a time while a page fills.
const READ_BATCH: u32 = 500;

/// One page of an export: the `session.export` reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExportPage {
    pub session_id: String,
    pub format: ExportFormat,
    /// The transcript text of this page.
    pub content: String,
    /// How many events this page covers (some render to nothing).
    pub events: usize,
    /// The `after_seq` of the next page: the last event this page covers (the one given when
    /// it covers none).
    pub next_after_seq: i64,
    pub has_more: bool,
}

/// One page of `p.session_id`'s transcript.
pub async fn export(
    sessions: &SessionManager,
    p: SessionExportParams,
) -> Result<ExportPage, SessionError> {
    let row = sessions.get(&p.session_id).await?;
    let after = p.after_seq.unwrap_or(0).max(0);
    let mut content = String::new();
    if p.format == ExportFormat::Markdown && after == 0 {
        header(&mut content, &row);
    }
    let mut cursor = after;
    let mut events = 0;
    let mut has_more = false;
    let mut piece = String::new();
    'pages: loop {
        let (batch, more) = sessions
            .history(&p.session_id, HistoryFrom::After(cursor), READ_BATCH)
            .await?;
        for event in &batch {
            piece.clear();
            match p.format {
                ExportFormat::Jsonl => {
                    piece.push_str(&event.payload);
                    piece.push('\n');
                }
                ExportFormat::Markdown => markdown(&mut piece, event, p.thinking),
            }
            if events > 0 && content.len() + piece.len() > MAX_EXPORT_BYTES {
                has_more = true;
                break 'pages;
            }
            content.push_str(&piece);
            cursor = event.sequence_id;
            events += 1;
        }
        if !more || batch.is_empty() {
            break;
        }
    }
    Ok(ExportPage {
        session_id: p.session_id,
        format: p.format,
        content,
        events,
        next_after_seq: cursor,
        has_more,
    })
}

/// A time in ms since the epoch, as `2026-12-02T06:45:12Z`.
fn when(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// The transcript's title and the session's facts.
fn header(out: &mut String, row: &SessionRow) {
    let title = row.title.as_deref().unwrap_or("Session");
    let _ = writeln!(out, "# {}\n", one_line(title));
    let _ = writeln!(out, "- Session: `{}`", row.session_id);
    let _ = writeln!(out, "- Agent: {}", row.agent_type);
    let _ = writeln!(out, "- Working directory: `{}`", one_line(&row.cwd));
    let _ = writeln!(out, "- Created: {}", when(row.created_at_ms));
    if let Some(parent) = &row.parent_session_id {
        let _ = writeln!(out, "- Forked from: `{parent}`");
    }
    if let Some(model) = &row.options.model {
        let _ = writeln!(out, "- Model: {}", one_line(model));
    }
    out.push('\n');
}

/// `s` with line breaks as spaces, for a heading or a list item.
fn one_line(s: &str) -> String {
    s.split(['\n', '\r']).collect::<Vec<_>>().join(" ")
}

/// `text` in a fenced block of `lang`, the fence longer than any backtick run inside.
fn fenced(out: &mut String, lang: &str, text: &str) {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat((longest + 1).max(3));
    let _ = writeln!(out, "{fence}{lang}");
    out.push_str(text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(out, "{fence}\n");
}

/// `text` as a Markdown quote, every line of it.
fn quoted(out: &mut String, text: &str) {
    for line in text.lines() {
        if line.is_empty() {
            out.push_str(">\n");
        } else {
            let _ = writeln!(out, "> {line}");
        }
    }
    out.push('\n');
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn truncated_note(out: &mut String, v: &Value) {
    if let Some(t) = v.get("truncated") {
        let full = t.get("fullBytes").and_then(Value::as_u64).unwrap_or(0);
        let kept = t.get("keptBytes").and_then(Value::as_u64).unwrap_or(0);
        let _ = writeln!(out, "_(cut: {kept} of {full} bytes kept)_\n");
    }
}

/// One stored event as Markdown (nothing for kinds a transcript leaves out).
fn markdown(out: &mut String, event: &StoredEvent, thinking: bool) {
    let Ok(v) = serde_json::from_str::<Value>(&event.payload) else {
        return;
    };
    let at = when(event.created_at);
    match event.kind.as_str() {
        "user.text" => {
            let heading = if v.get("steer").and_then(Value::as_bool) == Some(true) {
                "Prompt (steered into the running turn)"
            } else {
                "Prompt"
            };
            let mut from = String::new();
            if let Some(f) = v.get("from") {
                let via = str_of(f, "via").unwrap_or("?");
                from = format!(" · from {via}");
                if let Some(client) = str_of(f, "client") {
                    let _ = write!(from, " ({client})");
                }
            }
            if v.get("imported").and_then(Value::as_bool) == Some(true) {
                from.push_str(" · imported");
            }
            let _ = writeln!(out, "## {heading} · {at}{from}\n");
            quoted(out, str_of(&v, "text").unwrap_or_default());
            if let Some(files) = v.get("attachments").and_then(Value::as_array) {
                for file in files {
                    let name = str_of(file, "name").unwrap_or("attachment");
                    let mime = str_of(file, "mime").unwrap_or("");
                    let _ = writeln!(out, "- Attached: `{}` {mime}", one_line(name));
                }
                if !files.is_empty() {
                    out.push('\n');
                }
            }
        }
        "text.end" => {
            let _ = writeln!(out, "### Answer\n");
            let text = str_of(&v, "text").unwrap_or_default();
            out.push_str(text.trim_end());
            out.push_str("\n\n");
            truncated_note(out, &v);
        }
        "thinking.end" if thinking => {
            let _ = writeln!(out, "### Thinking\n");
            quoted(out, str_of(&v, "text").unwrap_or_default());
        }
        "tool.call.end" => {
            let name = str_of(&v, "name").unwrap_or("tool");
            let id = str_of(&v, "callId").unwrap_or_default();
            let _ = writeln!(out, "### Tool call: {} (`{id}`)\n", one_line(name));
            let input = v.get("input").cloned().unwrap_or(Value::Null);
            let text = serde_json::to_string_pretty(&input).unwrap_or_default();
            fenced(out, "json", &text);
            truncated_note(out, &v);
        }
        "tool.exec.end" => {
            let id = str_of(&v, "callId").unwrap_or_default();
            let failed = v.get("isError").and_then(Value::as_bool) == Some(true);
            let mut how = if failed { "failed" } else { "done" }.to_owned();
            if let Some(code) = v.get("exitCode").and_then(Value::as_i64) {
                let _ = write!(how, ", exit code {code}");
            }
            let _ = writeln!(out, "**Tool output** (`{id}`, {how}):\n");
            fenced(out, "", str_of(&v, "output").unwrap_or_default());
            truncated_note(out, &v);
        }
        "permission.request" => {
            let tool = str_of(&v, "tool").unwrap_or("tool");
            let id = str_of(&v, "requestId").unwrap_or_default();
            let _ = writeln!(
                out,
                "**Permission asked** for `{}` (request `{id}`, {at})",
                one_line(tool)
            );
            if let Some(options) = v.get("options").and_then(Value::as_array) {
                let labels: Vec<String> = options
                    .iter()
                    .map(|o| {
                        format!(
                            "{} (`{}`)",
                            one_line(str_of(o, "label").unwrap_or("?")),
                            str_of(o, "id").unwrap_or("?")
                        )
                    })
                    .collect();
                if !labels.is_empty() {
                    let _ = writeln!(out, "- Options: {}", labels.join(", "));
                }
            }
            out.push('\n');
        }
        "permission.resolved" => {
            let id = str_of(&v, "requestId").unwrap_or_default();
            let decision = str_of(&v, "decision").unwrap_or("?");
            let by = str_of(&v, "by").unwrap_or("unknown");
            let _ = write!(
                out,
                "**Permission {decision}** (request `{id}`) by `{by}`, {at}"
            );
            if let Some(option) = str_of(&v, "optionId") {
                let _ = write!(out, ", option `{option}`");
            }
            out.push('\n');
            if let Some(rule) = str_of(&v, "rule") {
                let _ = writeln!(out, "- Rule kept: {}", one_line(rule));
            }
            out.push('\n');
        }
        "run.end" => {
            let state = str_of(&v, "state").unwrap_or("?");
            if state != "completed" {
                let _ = write!(out, "**Run {state}**");
                if let Some(category) = str_of(&v, "category") {
                    let _ = write!(out, " ({category})");
                }
                if let Some(message) = str_of(&v, "message") {
                    let _ = write!(out, ": {}", one_line(message));
                }
                let _ = writeln!(out, " · {at}\n");
            }
        }
        "error" => {
            let category = str_of(&v, "category").unwrap_or("error");
            let message = str_of(&v, "message").unwrap_or_default();
            let _ = writeln!(out, "**Error** ({category}): {}\n", one_line(message));
        }
        "warning" => {
            let code = str_of(&v, "code").unwrap_or("warning");
            let message = str_of(&v, "message").unwrap_or_default();
            let _ = writeln!(out, "_Warning ({code}): {}_\n", one_line(message));
        }
        "session.forked" => {
            if let Some(parent) = str_of(&v, "parentSessionId") {
                let _ = writeln!(out, "_Forked from session `{parent}`_\n");
            }
        }
        "session.configured" => {
            if let Some(message) = str_of(&v, "message") {
                let _ = writeln!(out, "_{}_\n", one_line(message));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(seq: i64, kind: &str, payload: Value) -> StoredEvent {
        StoredEvent {
            sequence_id: seq,
            message_id: format!("m{seq}"),
            session_id: "s".into(),
            run_id: Some("r".into()),
            kind: kind.into(),
            payload: payload.to_string(),
            created_at: 1_700_000_000_000,
        }
    }

    fn render(events: &[StoredEvent], thinking: bool) -> String {
        let mut out = String::new();
        for e in events {
            markdown(&mut out, e, thinking);
        }
        out
    }

    #[test]
    fn a_turn_with_a_tool_call_and_a_permission_reads_as_markdown() {
        let events = [
            stored(1, "run.start", serde_json::json!({"k": "run.start"})),
            stored(
                2,
                "user.text",
                serde_json::json!({"k": "user.text", "text": "list the files\n\nplease", "from": {"via": "ws", "client": "web"}}),
            ),
            stored(
                3,
                "thinking.end",
                serde_json::json!({"k": "thinking.end", "text": "hmm"}),
            ),
            stored(
                4,
                "tool.call.end",
                serde_json::json!({"k": "tool.call.end", "callId": "c1", "name": "Bash", "input": {"command": "ls ```"}}),
            ),
            stored(
                5,
                "permission.request",
                serde_json::json!({"k": "permission.request", "requestId": "p1", "tool": "Bash", "input": {}, "options": [{"id": "allow_once", "label": "Allow once", "kind": "allow_once"}, {"id": "deny", "label": "Deny", "kind": "reject_once"}]}),
            ),
            stored(
                6,
                "permission.resolved",
                serde_json::json!({"k": "permission.resolved", "requestId": "p1", "decision": "allow", "by": "ipc", "optionId": "allow_once"}),
            ),
            stored(
                7,
                "tool.exec.end",
                serde_json::json!({"k": "tool.exec.end", "callId": "c1", "output": "a\n````\nb", "isError": false, "exitCode": 0}),
            ),
            stored(
                8,
                "text.end",
                serde_json::json!({"k": "text.end", "text": "Two files."}),
            ),
            stored(
                9,
                "run.end",
                serde_json::json!({"k": "run.end", "state": "failed", "category": "agent_failed", "message": "it broke"}),
            ),
            stored(
                10,
                "some.future.kind",
                serde_json::json!({"k": "some.future.kind"}),
            ),
        ];
        let md = render(&events, false);
        let expected = "\
## Prompt · 2023-11-14T22:13:20Z · from ws (web)

> list the files
>
> please

### Tool call: Bash (`c1`)

````json
{
  \"command\": \"ls ```\"
}
````

**Permission asked** for `Bash` (request `p1`, 2023-11-14T22:13:20Z)
- Options: Allow once (`allow_once`), Deny (`deny`)

**Permission allow** (request `p1`) by `ipc`, 2023-11-14T22:13:20Z, option `allow_once`

**Tool output** (`c1`, done, exit code 0):

`````
a
````
b
`````

### Answer

Two files.

**Run failed** (agent_failed): it broke · 2023-11-14T22:13:20Z

";
        assert_eq!(md, expected);
        assert!(render(&events, true).contains("### Thinking\n\n> hmm\n"));
        // A payload that is not JSON renders to nothing.
        let mut broken = stored(1, "text.end", Value::Null);
        broken.payload = "not json".into();
        assert_eq!(render(&[broken], false), "");
    }

    #[test]
    fn the_header_names_the_session() {
        let row = SessionRow {
            session_id: "s1".into(),
            agent_type: "claude".into(),
            native_session_id: None,
            cwd: "/w".into(),
            parent_session_id: Some("p".into()),
            title: Some("Fix\nthe test".into()),
            state: crate::protocol::states::SessionState::Idle,
            created_at_ms: 1_700_000_000_000,
            updated_at_ms: 1,
            fork_of: None,
            options: Default::default(),
            binding: None,
        };
        let mut out = String::new();
        header(&mut out, &row);
        assert_eq!(
            out,
            "# Fix the test\n\n- Session: `s1`\n- Agent: claude\n- Working directory: `/w`\n\
             - Created: 2023-11-14T22:13:20Z\n- Forked from: `p`\n\n"
        );
    }
}
