//! Claude Code's stream-json protocol (`claude -p --input-format stream-json --output-format
//! stream-json --verbose --include-partial-messages --permission-prompt-tool stdio`):
//! the launch arguments, the input frames the host writes, and [`Translator`], a pure,
//! stateful translator from the CLI's stdout lines to canonical events (style 8). The driver
//! that owns the process and feeds it comes with the session actors.
//!
//! Translation rules (facts in `../shared/reference/agent-protocols.md` §2):
//! - `system/init` names the native session id: `session.bound`, once per id.
//! - Blocks stream as `stream_event`s: `content_block_start` → `text.start` /
//!   `thinking.start` / `tool.call.start`; deltas → `text.delta` / `thinking.delta` /
//!   `tool.call.delta`; `content_block_stop` → the `*.end` with the whole text or input.
//! - The `assistant` frame repeats a block whole. It closes a block still open (an interrupted
//!   stream ends without `content_block_stop`), is skipped for a block already closed, and
//!   stands alone for a block never streamed. A `<synthetic>` assistant message is the CLI's
//!   wording of an API error; the `result` reports that error, so it is not shown as text.
//! - A `user` frame's `tool_result` → `tool.exec.start` + `tool.exec.end` (the CLI does not say
//!   when a tool starts; it reports only the result).
//! - `control_request` `can_use_tool` → `permission.request` with the CLI's choices: `allow`,
//!   an `allow_always` option built from its `permission_suggestions` (rules and directories;
//!   a mode switch only when it suggests nothing else), `deny`. The always option answers with
//!   those suggestions as `updatedPermissions`, scoped to the session (`destination:
//!   "session"`: the CLI keeps them for the life of its process and writes no settings file),
//!   so a matching call stops asking ([`Translator::permission_frame`]).
//!   `control_cancel_request` → `permission.resolved` `withdrawn` by the agent.
//! - `result` ends a turn — except compaction notices — with `usage` (from `result`, never from
//!   `assistant` placeholders), an `error` when it failed, and `run.end`: `aborted_*` terminal
//!   reasons are `cancelled`; `is_error` is `failed` with a category (`prompt_too_long` →
//!   `context_exhausted`, HTTP 429 → `rate_limited`, 401/403 → `auth_required`, else
//!   `agent_failed`).
//! - The process gone after a prompt was written and before its `result`: `error` + `run.end`
//!   `failed` / `result_delivery_unknown` ([`Translator::on_exit`]; the driver decides whether
//!   the prompt was written, `session::agent` has the rule).
//! - A `result` whose `errors` say "No conversation found" answers a `--resume` of an id the
//!   CLI does not know: `error` + `run.end` `failed` / `resume_rejected`, and no `session.bound`.
//! - Control requests other than `can_use_tool` (hooks, SDK MCP) get an error answer
//!   ([`Translator::take_replies`]) so the CLI never waits for the host.
//! - `control_response`s answer the host's own requests (`set_model`, `interrupt`): each is
//!   kept for the driver by its request id ([`Translator::take_control_responses`]).
//! - Lines that are not JSON, and frame types this build does not know, are counted and
//!   skipped, never fatal.
//!
//! Session options map to flags, given on every process start (new, resume and fork alike)
//! ([`option_args`]): `model` → `--model`; `system_prompt` → `--append-system-prompt` (the
//! CLI puts it in each request's `system`, never in a user turn); `mcp_servers` →
//! `--mcp-config <file>` (a 0600 file the driver writes, [`mcp_config`]'s JSON: env and header
//! values stay out of argv; the servers' tools, `mcp__<name>__<tool>`, ask through the
//! permission prompt like any tool); `permission_mode` → `--permission-mode` `default` /
//! `acceptEdits` / `bypassPermissions` (as root the CLI takes the last only with `IS_SANDBOX=1`
//! in its environment, which the host never sets on its own). A model change between turns
//! is the `set_model` control request ([`set_model_frame`]; the CLI also records it in its
//! session as a `/model` command). Attachments go in the user frame as content blocks
//! ([`user_frame_with`], [`attachment_blocks`]): images as `image` blocks, PDFs and text
//! files as `document` blocks.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::AdapterError;
use crate::protocol::events::{
    BlockEnd, BlockStart, ErrorCategory, ErrorNotice, EventBody, PermissionOption,
    PermissionOptionKind, PermissionRequest, PermissionResolved, RunEnd, RunState, SessionBound,
    TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart, ToolExecEnd, ToolExecStart, Usage,
};
use crate::protocol::options::{
    Attachment, AttachmentKind, McpServer, McpTransport, PermissionMode, SessionOptions,
};

/// The arguments of a long-lived stream-json process; `resume` for a known native session,
/// otherwise `session_id` fixes the id of a new one (so it is known before the first turn).
pub fn launch_args(new_session_id: Option<&str>, resume: Option<&str>, fork: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--permission-prompt-tool",
        "stdio",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(id) = resume {
        args.push(format!("--resume={id}"));
        if fork {
            args.push("--fork-session".to_owned());
        }
    } else if let Some(id) = new_session_id {
        args.push(format!("--session-id={id}"));
    }
    args
}

/// The flags that give the CLI a session's options (module docs); `[]` for none. Given on
/// every start: `--model`, `--append-system-prompt` and `--mcp-config` are not kept by the
/// CLI across `--resume`. `mcp_config_file`: the file holding [`mcp_config`] of the options'
/// servers (the driver writes it; `None` when there are none — then no flag).
pub fn option_args(
    options: &SessionOptions,
    mcp_config_file: Option<&std::path::Path>,
) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(model) = &options.model {
        args.extend(["--model".to_owned(), model.clone()]);
    }
    if let Some(prompt) = &options.system_prompt {
        args.extend(["--append-system-prompt".to_owned(), prompt.clone()]);
    }
    if let Some(file) = mcp_config_file {
        args.extend(["--mcp-config".to_owned(), file.display().to_string()]);
    }
    if let Some(mode) = options.permission_mode {
        let native = match mode {
            PermissionMode::Ask => "default",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::Bypass => "bypassPermissions",
        };
        args.extend(["--permission-mode".to_owned(), native.to_owned()]);
    }
    args
}

/// `--mcp-config`'s JSON: `{"mcpServers": {name: {type: "stdio", command, args, env} |
/// {type: "http" | "sse", url, headers}}}`.
pub fn mcp_config(servers: &[McpServer]) -> String {
    let pairs =
        |items: &mut dyn Iterator<Item = (&String, &String)>| -> serde_json::Map<String, Value> {
            items.map(|(k, v)| (k.clone(), json!(v))).collect()
        };
    let mut all = serde_json::Map::new();
    for server in servers {
        let entry = match server {
            McpServer::Stdio {
                command, args, env, ..
            } => json!({
                "type": "stdio",
                "command": command,
                "args": args,
                "env": pairs(&mut env.iter().map(|e| (&e.name, &e.value))),
            }),
            McpServer::Http { url, headers, .. } | McpServer::Sse { url, headers, .. } => {
                let kind = match server.transport() {
                    McpTransport::Sse => "sse",
                    _ => "http",
                };
                json!({
                    "type": kind,
                    "url": url,
                    "headers": pairs(&mut headers.iter().map(|h| (&h.name, &h.value))),
                })
            }
        };
        all.insert(server.name().to_owned(), entry);
    }
    json!({ "mcpServers": all }).to_string()
}

/// The project folder name Claude uses for a cwd: every character that is not an ASCII letter
/// or digit becomes `-`; a name over 200 characters is cut to 200 plus a hash (which only the
/// CLI computes, so a long one is found by its 200-character prefix).
pub fn project_dir_name(cwd: &str) -> String {
    cwd.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The session file of `native_id` for `cwd` under Claude's config dir, if it exists.
pub fn session_file(
    config_dir: &std::path::Path,
    cwd: &str,
    native_id: &str,
) -> Option<std::path::PathBuf> {
    let projects = config_dir.join("projects");
    let name = project_dir_name(cwd);
    let file = format!("{native_id}.jsonl");
    if name.chars().count() <= 200 {
        let path = projects.join(&name).join(&file);
        return path.is_file().then_some(path);
    }
    let prefix: String = name.chars().take(200).collect();
    std::fs::read_dir(&projects)
        .ok()?
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with(&prefix))
        .map(|d| d.path().join(&file))
        .find(|p| p.is_file())
}

/// How much of a session file [`session_cwd_matches`] reads for the cwd it recorded: the
/// first entry that records one (`user`, `attachment`, `assistant`) comes within a few KB.
const SESSION_CWD_LIMIT: u64 = 256 << 10;

/// Whether `native_id`'s session file belongs to `cwd`: it lives in the project folder Claude
/// derives from that cwd (or from its canonical form, which is what the CLI runs in), and the
/// first entry in it that records a `cwd` names this directory. The folder alone can mislead:
/// distinct cwds share one (`/a/b-c` and `/a/b/c` both map to `-a-b-c`, and every long cwd is
/// found by its 200-character prefix). A file whose entries record no cwd (within
/// [`SESSION_CWD_LIMIT`]) has only its folder to go by.
pub fn session_cwd_matches(config_dir: &std::path::Path, cwd: &str, native_id: &str) -> bool {
    let canonical = std::fs::canonicalize(cwd).ok();
    let mut candidates = vec![cwd.to_owned()];
    if let Some(c) = canonical.as_ref().and_then(|c| c.to_str())
        && c != cwd
    {
        candidates.push(c.to_owned());
    }
    let same_dir = |recorded: &str| {
        recorded == cwd
            || canonical
                .as_ref()
                .is_some_and(|c| std::fs::canonicalize(recorded).is_ok_and(|r| r == *c))
    };
    candidates.iter().any(|candidate| {
        session_file(config_dir, candidate, native_id)
            .is_some_and(|file| recorded_cwd(&file).is_none_or(|r| same_dir(&r)))
    })
}

/// The `cwd` of the first entry of a session file that records one.
fn recorded_cwd(file: &std::path::Path) -> Option<String> {
    use std::io::{BufRead, Read};
    let reader = std::io::BufReader::new(std::fs::File::open(file).ok()?.take(SESSION_CWD_LIMIT));
    reader.split(b'\n').map_while(Result::ok).find_map(|line| {
        serde_json::from_slice::<Value>(&line)
            .ok()?
            .get("cwd")?
            .as_str()
            .map(str::to_owned)
    })
}

// ---- Its sessions as its files tell them (`session.discover`, the history of an import) ----

/// At most this many of a project folder's session files are read by
/// [`discover_sessions`] (the newest by mtime).
const DISCOVER_FILES: usize = 1000;
/// What [`discover_sessions`] reads of one file while its total budget lasts: the prompts are
/// counted within it.
const DISCOVER_FILE_BYTES: u64 = 8 << 20;
/// What it reads of all files together; past it each file is read only to
/// [`DISCOVER_FILE_HEAD`] (enough for the cwd and the first prompt).
const DISCOVER_TOTAL_BYTES: u64 = 64 << 20;
const DISCOVER_FILE_HEAD: u64 = 256 << 10;
/// What [`read_session_history`] reads of a session file: its end, when it is longer.
const HISTORY_FILE_BYTES: u64 = 64 << 20;

/// The text of a `user` entry that is a real prompt (a string, or its text blocks), or `None`
/// for anything else: a tool result, a meta, compaction or side-chain entry, a slash-command
/// or local-command wrapper, an interrupt marker, injected context.
fn prompt_text(entry: &Value) -> Option<String> {
    let flag = |name: &str| entry.get(name).and_then(Value::as_bool) == Some(true);
    if entry.get("type").and_then(Value::as_str) != Some("user")
        || flag("isMeta")
        || flag("isCompactSummary")
        || flag("isSidechain")
        || entry.get("toolUseResult").is_some()
    {
        return None;
    }
    let content = entry.get("message")?.get("content")?;
    let text = match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            if blocks
                .iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
            {
                return None;
            }
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .filter(|t| !injected(t))
                .collect::<Vec<_>>()
                .join("\n")
        }
        _ => return None,
    };
    let trimmed = text.trim();
    (!trimmed.is_empty() && !injected(trimmed) && !trimmed.starts_with("[Request interrupted"))
        .then(|| trimmed.to_owned())
}

/// Text the CLI writes into a `user` entry itself: command wrappers and context.
fn injected(text: &str) -> bool {
    let t = text.trim_start();
    [
        "<command-",
        "<local-command",
        "<system-reminder>",
        "<bash-input>",
        "<bash-stdout>",
        "<bash-stderr>",
        "<ide_",
        "<user-prompt-submit-hook>",
    ]
    .iter()
    .any(|p| t.starts_with(p))
}

/// An entry's `timestamp` in ms since the epoch.
fn entry_time(entry: &Value) -> Option<i64> {
    let at = humantime::parse_rfc3339_weak(entry.get("timestamp")?.as_str()?).ok()?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()
}

/// The project folders Claude may keep `cwd`'s sessions in: the one named for it, or for a
/// long cwd every folder starting with its 200-character prefix.
fn project_dirs(config_dir: &std::path::Path, cwd: &str) -> Vec<std::path::PathBuf> {
    let projects = config_dir.join("projects");
    let name = project_dir_name(cwd);
    if name.chars().count() <= 200 {
        return vec![projects.join(name)];
    }
    let prefix: String = name.chars().take(200).collect();
    std::fs::read_dir(&projects)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with(&prefix))
        .map(|d| d.path())
        .collect()
}

/// Whether a recorded cwd is `cwd` (canonical).
fn same_cwd(recorded: &str, cwd: &str) -> bool {
    recorded == cwd
        || std::fs::canonicalize(recorded)
            .is_ok_and(|r| std::fs::canonicalize(cwd).is_ok_and(|c| r == c))
}

/// Claude's own sessions of `cwd` (canonical) under its config dir: every session file of
/// the cwd's project folder whose entries record this cwd and hold a real prompt, with its
/// first prompt, its last activity (the last entry's `timestamp`, else the file's mtime) and
/// how many prompts it holds. Bounded: the newest [`DISCOVER_FILES`] files, each read to
/// [`DISCOVER_FILE_BYTES`] while [`DISCOVER_TOTAL_BYTES`] last (a longer file's prompts are
/// counted within that), then to [`DISCOVER_FILE_HEAD`].
pub fn discover_sessions(
    config_dir: &std::path::Path,
    cwd: &str,
) -> Vec<crate::session::discover::Discovered> {
    use crate::session::discover::{Discovered, MAX_FIRST_PROMPT};
    let mut files: Vec<(std::time::SystemTime, std::path::PathBuf)> = project_dirs(config_dir, cwd)
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter_map(|e| {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "jsonl") {
                return None;
            }
            let meta = e.metadata().ok().filter(std::fs::Metadata::is_file)?;
            Some((meta.modified().unwrap_or(std::time::UNIX_EPOCH), path))
        })
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    files.truncate(DISCOVER_FILES);
    let mut spent = 0u64;
    let mut found = Vec::new();
    for (modified, path) in files {
        let Some(id) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let plain = id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !plain || id.starts_with('-') || id.len() > 256 {
            continue;
        }
        let limit = if spent < DISCOVER_TOTAL_BYTES {
            DISCOVER_FILE_BYTES
        } else {
            DISCOVER_FILE_HEAD
        };
        let Ok((lines, cut)) = super::lines::read_file_lines(&path, 0, limit) else {
            continue;
        };
        spent += lines.iter().map(|l| l.len() as u64).sum::<u64>();
        let mut recorded: Option<bool> = None;
        let mut first: Option<String> = None;
        let mut turns = 0u32;
        let mut last = None;
        for line in &lines {
            let Ok(entry) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            if recorded.is_none()
                && let Some(c) = entry.get("cwd").and_then(Value::as_str)
            {
                recorded = Some(same_cwd(c, cwd));
            }
            if let Some(at) = entry_time(&entry) {
                last = Some(at);
            }
            if let Some(text) = prompt_text(&entry) {
                turns += 1;
                if first.is_none() {
                    first = Some(text.chars().take(MAX_FIRST_PROMPT).collect());
                }
            }
        }
        // Another cwd's file sharing the folder (`/a/b-c` and `/a/b/c`), or none recorded.
        if recorded != Some(true) {
            continue;
        }
        let Some(first_prompt) = first else {
            continue;
        };
        if cut {
            // The last entry's time is at the end.
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            let tail = super::lines::read_file_lines(&path, len.saturating_sub(64 << 10), 64 << 10)
                .map(|(l, _)| l)
                .unwrap_or_default();
            last = tail
                .iter()
                .rev()
                .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                .find_map(|e| entry_time(&e));
        }
        let mtime = modified
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .unwrap_or(0);
        found.push(Discovered {
            native_session_id: id.to_owned(),
            first_prompt,
            last_activity_ms: last.unwrap_or(mtime),
            turns,
        });
    }
    found
}

/// The conversation a session file holds, oldest first: real prompts, the assistant's text
/// blocks, its tool calls and their results (thinking, meta and side-chain entries, the CLI's
/// `<synthetic>` error wording and command wrappers are left out). A file longer than
/// [`HISTORY_FILE_BYTES`] is read from that far before its end.
pub fn read_session_history(
    file: &std::path::Path,
) -> std::io::Result<Vec<crate::session::discover::HistoryEntry>> {
    use crate::session::discover::HistoryEntry;
    let len = std::fs::metadata(file)?.len();
    let (lines, _) = super::lines::read_file_lines(
        file,
        len.saturating_sub(HISTORY_FILE_BYTES),
        HISTORY_FILE_BYTES,
    )?;
    let mut out = Vec::new();
    for line in lines {
        let Ok(entry) = serde_json::from_slice::<Value>(&line) else {
            continue;
        };
        if let Some(text) = prompt_text(&entry) {
            out.push(HistoryEntry::User { text });
            continue;
        }
        let flag = |name: &str| entry.get(name).and_then(Value::as_bool) == Some(true);
        if flag("isSidechain") || flag("isMeta") {
            continue;
        }
        let message = entry.get("message");
        let blocks = message
            .and_then(|m| m.get("content"))
            .and_then(Value::as_array);
        match entry.get("type").and_then(Value::as_str) {
            Some("assistant") => {
                if message.and_then(|m| m.get("model")).and_then(Value::as_str)
                    == Some("<synthetic>")
                {
                    continue;
                }
                for block in blocks.into_iter().flatten() {
                    match block.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            let text = str_of(block, "text");
                            if !text.trim().is_empty() {
                                out.push(HistoryEntry::Assistant {
                                    text: text.to_owned(),
                                });
                            }
                        }
                        Some("tool_use") => out.push(HistoryEntry::ToolCall {
                            call_id: str_of(block, "id").to_owned(),
                            name: str_of(block, "name").to_owned(),
                            input: block.get("input").cloned().unwrap_or(Value::Null),
                        }),
                        _ => {}
                    }
                }
            }
            Some("user") => {
                for block in blocks.into_iter().flatten() {
                    if block.get("type").and_then(Value::as_str) != Some("tool_result") {
                        continue;
                    }
                    let output = match block.get("content") {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Array(parts)) => parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n"),
                        _ => String::new(),
                    };
                    out.push(HistoryEntry::ToolResult {
                        call_id: str_of(block, "tool_use_id").to_owned(),
                        output,
                        is_error: block.get("is_error").and_then(Value::as_bool) == Some(true),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The stdin line for a user prompt. `uuid` (the host's run id) becomes the prompt entry's
/// `uuid` in the session file, which is how the host tells its own prompts from anyone else's.
pub fn user_frame(text: &str, uuid: &str) -> String {
    json!({
        "type": "user",
        "uuid": uuid,
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": null,
        "session_id": "",
    })
    .to_string()
}

/// The stdin line for a prompt with attachments: the text, then each attachment's content
/// block ([`attachment_blocks`]). Without attachments, [`user_frame`].
pub fn user_frame_with(text: &str, uuid: &str, attachments: &[Value]) -> String {
    if attachments.is_empty() {
        return user_frame(text, uuid);
    }
    let mut content = vec![json!({"type": "text", "text": text})];
    content.extend(attachments.iter().cloned());
    json!({
        "type": "user",
        "uuid": uuid,
        "message": {"role": "user", "content": content},
        "parent_tool_use_id": null,
        "session_id": "",
    })
    .to_string()
}

/// The Anthropic content blocks of a prompt's attachments, read from the host's copies: an
/// image is an `image` block (base64); a PDF a `document` block (base64); any other file a
/// `document` block of its text, titled with its name, when it is UTF-8 text. The prompt is
/// not sent when one cannot be read (`transport_lost`, "not sent": the copy is gone) or is
/// none of these (`protocol_incompatible`: a binary file other than a PDF, which the session
/// takes for every family that takes files and Claude cannot). Blocking (it reads the copies).
pub fn attachment_blocks(attachments: &[Attachment]) -> Result<Vec<Value>, AdapterError> {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    attachments
        .iter()
        .map(|a| {
            let bytes = std::fs::read(&a.path).map_err(|e| {
                AdapterError::prompt_not_sent(format!(
                    "reading the attachment {} failed ({e})",
                    a.name
                ))
            })?;
            Ok(match a.kind {
                AttachmentKind::Image => json!({
                    "type": "image",
                    "source": {"type": "base64", "media_type": a.mime, "data": b64(&bytes)},
                }),
                AttachmentKind::File if a.mime == "application/pdf" => json!({
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": b64(&bytes)},
                    "title": a.name,
                }),
                AttachmentKind::File => {
                    let text = String::from_utf8(bytes).map_err(|_| {
                        AdapterError::new(
                            ErrorCategory::ProtocolIncompatible,
                            format!(
                                "Claude takes images, PDFs and UTF-8 text files; {} ({}) is \
                                 none of these, so the prompt was not sent: send it without \
                                 that file, or as text or a PDF",
                                a.name, a.mime
                            ),
                        )
                    })?;
                    json!({
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": text},
                        "title": a.name,
                    })
                }
            })
        })
        .collect()
}

/// The stdin line asking the CLI to use `model` from its next request on (answered by a
/// `control_response` with this request id).
pub fn set_model_frame(request_id: &str, model: &str) -> String {
    json!({
        "type": "control_request",
        "request_id": request_id,
        "request": {"subtype": "set_model", "model": model},
    })
    .to_string()
}

/// What one line of a session file is, for telling who wrote it (design §8): a prompt (a `user`
/// entry with text — not a tool result, not a meta or compaction entry) by its `uuid` and its
/// `promptId`;
/// anything else the CLI writes on its own; or a line that is not a JSON object with a `type`
/// (torn, or not the CLI's).
pub fn file_entry(line: &[u8]) -> crate::session::agent::FileEntry {
    use crate::session::agent::FileEntry;
    let Ok(Value::Object(entry)) = serde_json::from_slice::<Value>(line) else {
        return FileEntry::Unreadable;
    };
    let flag = |name: &str| entry.get(name).and_then(Value::as_bool) == Some(true);
    let Some(kind) = entry.get("type").and_then(Value::as_str) else {
        // Every line the CLI writes says what it is.
        return FileEntry::Unreadable;
    };
    if kind != "user"
        || flag("isMeta")
        || flag("isCompactSummary")
        || flag("isSidechain")
        || entry.contains_key("toolUseResult")
    {
        return FileEntry::Other;
    }
    let content = entry.get("message").and_then(|m| m.get("content"));
    let tool_result = content.and_then(Value::as_array).is_some_and(|blocks| {
        blocks
            .iter()
            .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
    });
    if tool_result {
        return FileEntry::Other;
    }
    match entry.get("uuid").and_then(Value::as_str) {
        Some(uuid) => FileEntry::Prompt {
            id: uuid.to_owned(),
            // Entries written for a prompt (the interrupt marker `[Request interrupted by
            // user]`, tool results) share its `promptId`.
            turn: entry
                .get("promptId")
                .and_then(Value::as_str)
                .map(str::to_owned),
        },
        None => FileEntry::Unreadable,
    }
}

/// The stdin line that interrupts the current turn (enveloped; a bare one is ignored).
pub fn interrupt_frame(request_id: &str) -> String {
    json!({"type": "control_request", "request_id": request_id, "request": {"subtype": "interrupt"}})
        .to_string()
}

/// The stdin line refusing a control request.
pub fn control_error_frame(request_id: &str, error: &str) -> String {
    json!({
        "type": "control_response",
        "response": {"subtype": "error", "request_id": request_id, "error": error},
    })
    .to_string()
}

/// The stdin line answering a `can_use_tool` request; `updates`: the permission updates an
/// "always" answer makes the CLI keep.
pub fn permission_frame(
    request_id: &str,
    allow: bool,
    input: &Value,
    message: Option<&str>,
) -> String {
    permission_frame_with(request_id, allow, input, message, None)
}

fn permission_frame_with(
    request_id: &str,
    allow: bool,
    input: &Value,
    message: Option<&str>,
    updates: Option<&Value>,
) -> String {
    let response = if allow {
        let mut response = json!({"behavior": "allow", "updatedInput": input});
        if let Some(updates) = updates {
            response["updatedPermissions"] = updates.clone();
        }
        response
    } else {
        json!({
            "behavior": "deny",
            "message": message.unwrap_or("The user denied this tool use. Stop and wait for the user's instructions."),
        })
    };
    json!({
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": response},
    })
    .to_string()
}

/// The "always allow" option a `can_use_tool` request's `permission_suggestions` make, and the
/// `updatedPermissions` it answers with: the rule and directory suggestions (a mode switch
/// only when there is nothing else), each scoped to the session. `None` when nothing allows.
fn always_option(suggested: &[Value]) -> Option<(PermissionOption, Value)> {
    let rules_of = |s: &Value| -> Vec<String> {
        s.get("rules")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|r| match r.get("ruleContent").and_then(Value::as_str) {
                Some(content) => format!("{}({content})", str_of(r, "toolName")),
                None => str_of(r, "toolName").to_owned(),
            })
            .collect()
    };
    let session = |s: &Value| {
        let mut s = s.clone();
        s["destination"] = json!("session");
        s
    };
    let mut grants = Vec::new();
    let mut updates = Vec::new();
    for s in suggested {
        match str_of(s, "type") {
            "addRules" | "replaceRules" if str_of(s, "behavior") == "allow" => {
                grants.extend(rules_of(s));
                updates.push(session(s));
            }
            "addDirectories" => {
                let dirs: Vec<&str> = s
                    .get("directories")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                if !dirs.is_empty() {
                    grants.push(format!("access to {}", dirs.join(", ")));
                    updates.push(session(s));
                }
            }
            _ => {}
        }
    }
    if !grants.is_empty() {
        let what = grants.join(" and ");
        let option = PermissionOption::always(
            "allow_always",
            &format!("Always allow {what}"),
            format!("always allow {what} in this session"),
        );
        return Some((option, Value::Array(updates)));
    }
    let mode = suggested
        .iter()
        .find(|s| str_of(s, "type") == "setMode" && !str_of(s, "mode").is_empty())?;
    let name = str_of(mode, "mode");
    let option = PermissionOption::always(
        &format!("mode:{name}"),
        &format!("Allow, and switch this session to {name} mode"),
        format!("{name} mode for the rest of this session"),
    );
    Some((option, json!([session(mode)])))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Thinking,
    Tool,
}

#[derive(Debug)]
struct Block {
    kind: Kind,
    item_id: String,
    text: String,
    tool_id: String,
    name: String,
    closed: bool,
    /// An `assistant` frame has repeated this block already.
    repeated: bool,
}

/// From stdout lines to canonical event bodies; the driver adds `sessionId` and `runId`.
#[derive(Debug, Default)]
pub struct Translator {
    native_id: Option<String>,
    /// The message being streamed, per stream (the main agent, or a sub-agent by its
    /// `parent_tool_use_id`): sub-agent streams may interleave with the main one.
    current: HashMap<String, String>,
    /// Blocks of the turn by (message id, stream index), in arrival order.
    blocks: Vec<((String, u64), Block)>,
    /// Tool names by call id, until the tool's result arrives.
    tool_names: HashMap<String, String>,
    skipped: u64,
    /// Lines the driver must write back (answers to control requests we do not serve).
    replies: Vec<String>,
    /// The `updatedPermissions` each pending request's always options stand for, by request
    /// id, then option id.
    suggestions: HashMap<String, HashMap<String, Value>>,
    /// Answers to the host's own control requests, by request id: `Err` with the CLI's
    /// error for an error answer.
    control_responses: Vec<(String, Result<Value, String>)>,
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl Translator {
    pub fn new() -> Translator {
        Translator::default()
    }

    /// The native session id the CLI last named.
    pub fn native_id(&self) -> Option<&str> {
        self.native_id.as_deref()
    }

    /// The stdin line answering permission request `request_id` with `option` (one of those
    /// its `permission.request` offered; `None`: plain allow or deny): an always option sends
    /// the updates it stands for. The flag says whether the line carries them (an always
    /// option whose suggestions are gone, e.g. a request answered before, goes as a plain
    /// allow).
    pub fn permission_frame(
        &mut self,
        request_id: &str,
        allow: bool,
        option: Option<&PermissionOption>,
        input: &Value,
        message: Option<&str>,
    ) -> (String, bool) {
        let offered = self.suggestions.remove(request_id).unwrap_or_default();
        let updates = option
            .filter(|o| allow && o.kind == PermissionOptionKind::AllowAlways)
            .and_then(|o| offered.get(&o.id));
        let line = permission_frame_with(request_id, allow, input, message, updates);
        (line, updates.is_some())
    }

    /// Lines for stdin that the last frames call for: an error answer to each control request
    /// the host does not serve (`hook_callback`, `mcp_message`, …), so the CLI never waits.
    pub fn take_replies(&mut self) -> Vec<String> {
        std::mem::take(&mut self.replies)
    }

    /// The answers to the host's own control requests the last frames brought, by request
    /// id: the success `response`, or the error's text.
    pub fn take_control_responses(&mut self) -> Vec<(String, Result<Value, String>)> {
        std::mem::take(&mut self.control_responses)
    }

    /// Lines skipped: not JSON, or a frame type this build does not know.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    pub fn on_stdout_line(&mut self, line: &str) -> Vec<EventBody> {
        let Ok(frame) = serde_json::from_str::<Value>(line) else {
            self.skip(line);
            return Vec::new();
        };
        match str_of(&frame, "type") {
            "system" => self.on_system(&frame),
            "stream_event" => {
                let stream = str_of(&frame, "parent_tool_use_id").to_owned();
                self.on_stream_event(&stream, frame.get("event").unwrap_or(&Value::Null))
            }
            "assistant" => self.on_assistant(&frame),
            "user" => self.on_user(&frame),
            "control_request" => self.on_control_request(&frame),
            "control_cancel_request" => {
                let request_id = str_of(&frame, "request_id").to_owned();
                self.suggestions.remove(&request_id);
                vec![EventBody::PermissionResolved(PermissionResolved {
                    request_id,
                    decision: "withdrawn".to_owned(),
                    by: Some("agent".to_owned()),
                    ..PermissionResolved::default()
                })]
            }
            "result" => self.on_result(&frame),
            "control_response" => {
                let response = frame.get("response").unwrap_or(&Value::Null);
                let id = str_of(response, "request_id").to_owned();
                let answer = match str_of(response, "subtype") {
                    "success" => Ok(response.get("response").cloned().unwrap_or(Value::Null)),
                    _ => Err(match str_of(response, "error") {
                        "" => "the agent refused the request".to_owned(),
                        error => error.to_owned(),
                    }),
                };
                if !id.is_empty() {
                    self.control_responses.push((id, answer));
                }
                Vec::new()
            }
            // Known, and nothing for a client: rate-limit state.
            "rate_limit_event" => Vec::new(),
            _ => {
                self.skip(line);
                Vec::new()
            }
        }
    }

    /// The process ended. `in_turn`: the caller wrote a turn's prompt and no `result` ended
    /// it — a failed run whose outcome is unknown (`result_delivery_unknown`: the CLI had the
    /// prompt and may have acted on it).
    pub fn on_exit(&mut self, in_turn: bool, status: &str) -> Vec<EventBody> {
        let mut out = self.close_open_blocks();
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

    /// The CLI refused `--resume` (said so on stderr and exited): the turn ends
    /// `resume_rejected`.
    pub fn on_resume_rejected(&mut self, reason: &str) -> Vec<EventBody> {
        let mut out = self.close_open_blocks();
        let message = reason.trim().to_owned();
        out.push(EventBody::Error(ErrorNotice {
            category: ErrorCategory::ResumeRejected,
            message: message.clone(),
        }));
        out.push(EventBody::RunEnd(RunEnd {
            state: RunState::Failed,
            category: Some(ErrorCategory::ResumeRejected),
            message: Some(message),
        }));
        out
    }

    fn skip(&mut self, line: &str) {
        self.skipped += 1;
        let head: String = line.chars().take(120).collect();
        tracing::debug!(skipped = self.skipped, line = %head, "claude: skipped a stdout line");
    }

    fn on_system(&mut self, frame: &Value) -> Vec<EventBody> {
        if str_of(frame, "subtype") != "init" {
            return Vec::new();
        }
        self.adopt_session_id(frame)
    }

    /// Adopt the newest session id the CLI names (`init`, and `result` after it).
    fn adopt_session_id(&mut self, frame: &Value) -> Vec<EventBody> {
        let id = str_of(frame, "session_id");
        if id.is_empty() || self.native_id.as_deref() == Some(id) {
            return Vec::new();
        }
        self.native_id = Some(id.to_owned());
        vec![EventBody::SessionBound(SessionBound {
            native_session_id: id.to_owned(),
        })]
    }

    fn block_mut(&mut self, key: &(String, u64)) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .find(|(k, _)| k == key)
            .map(|(_, b)| b)
    }

    fn on_stream_event(&mut self, stream: &str, event: &Value) -> Vec<EventBody> {
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        let message_id = self.current.get(stream).cloned().unwrap_or_default();
        let key = (message_id.clone(), index);
        match str_of(event, "type") {
            "message_start" => {
                let id = event
                    .pointer("/message/id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                self.current.insert(stream.to_owned(), id);
                Vec::new()
            }
            "content_block_start" => {
                let block = event.get("content_block").unwrap_or(&Value::Null);
                let item_id = format!("{message_id}:{index}");
                let (kind, body) = match str_of(block, "type") {
                    "text" => (
                        Kind::Text,
                        EventBody::TextStart(BlockStart {
                            item_id: Some(item_id.clone()),
                        }),
                    ),
                    "thinking" => (
                        Kind::Thinking,
                        EventBody::ThinkingStart(BlockStart {
                            item_id: Some(item_id.clone()),
                        }),
                    ),
                    "tool_use" => {
                        let call_id = str_of(block, "id").to_owned();
                        let name = str_of(block, "name").to_owned();
                        self.tool_names.insert(call_id.clone(), name.clone());
                        (
                            Kind::Tool,
                            EventBody::ToolCallStart(ToolCallStart { call_id, name }),
                        )
                    }
                    _ => return Vec::new(),
                };
                self.blocks.push((
                    key,
                    Block {
                        kind,
                        item_id,
                        text: String::new(),
                        tool_id: str_of(block, "id").to_owned(),
                        name: str_of(block, "name").to_owned(),
                        closed: false,
                        repeated: false,
                    },
                ));
                vec![body]
            }
            "content_block_delta" => {
                let delta = event.get("delta").unwrap_or(&Value::Null);
                let Some(block) = self.block_mut(&key).filter(|b| !b.closed) else {
                    return Vec::new();
                };
                match (str_of(delta, "type"), block.kind) {
                    ("text_delta", Kind::Text) => {
                        let text = str_of(delta, "text").to_owned();
                        block.text.push_str(&text);
                        vec![EventBody::TextDelta(TextDelta {
                            item_id: Some(block.item_id.clone()),
                            text,
                        })]
                    }
                    ("thinking_delta", Kind::Thinking) => {
                        let text = str_of(delta, "thinking").to_owned();
                        block.text.push_str(&text);
                        vec![EventBody::ThinkingDelta(TextDelta {
                            item_id: Some(block.item_id.clone()),
                            text,
                        })]
                    }
                    ("input_json_delta", Kind::Tool) => {
                        let part = str_of(delta, "partial_json").to_owned();
                        block.text.push_str(&part);
                        vec![EventBody::ToolCallDelta(ToolCallDelta {
                            call_id: block.tool_id.clone(),
                            delta: part,
                        })]
                    }
                    _ => Vec::new(),
                }
            }
            "content_block_stop" => match self.block_mut(&key) {
                Some(block) if !block.closed => vec![close(block, None)],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    fn on_assistant(&mut self, frame: &Value) -> Vec<EventBody> {
        let message = frame.get("message").unwrap_or(&Value::Null);
        if str_of(message, "model") == "<synthetic>" {
            return Vec::new();
        }
        let mut out = Vec::new();
        let contents = message
            .get("content")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for content in contents {
            let kind = match str_of(&content, "type") {
                "text" => Kind::Text,
                "thinking" => Kind::Thinking,
                "tool_use" => Kind::Tool,
                _ => continue,
            };
            let tool_id = str_of(&content, "id");
            let message_id = str_of(message, "id");
            // The streamed block of this message that this repeats: the first of its kind (and
            // tool id) not repeated yet.
            let streamed = self
                .blocks
                .iter_mut()
                .filter(|((m, _), b)| {
                    m == message_id
                        && !b.repeated
                        && b.kind == kind
                        && (kind != Kind::Tool || b.tool_id == tool_id)
                })
                .map(|(_, b)| b)
                .next();
            match streamed {
                Some(block) => {
                    block.repeated = true;
                    if !block.closed {
                        out.push(close(block, Some(&content)));
                    }
                }
                None => {
                    // Never streamed: the whole block at once.
                    let index = 1000 + self.blocks.len() as u64;
                    let mut block = Block {
                        kind,
                        item_id: format!("{message_id}:{index}"),
                        text: String::new(),
                        tool_id: tool_id.to_owned(),
                        name: str_of(&content, "name").to_owned(),
                        closed: false,
                        repeated: true,
                    };
                    out.push(match kind {
                        Kind::Text => EventBody::TextStart(BlockStart {
                            item_id: Some(block.item_id.clone()),
                        }),
                        Kind::Thinking => EventBody::ThinkingStart(BlockStart {
                            item_id: Some(block.item_id.clone()),
                        }),
                        Kind::Tool => {
                            self.tool_names
                                .insert(block.tool_id.clone(), block.name.clone());
                            EventBody::ToolCallStart(ToolCallStart {
                                call_id: block.tool_id.clone(),
                                name: block.name.clone(),
                            })
                        }
                    });
                    out.push(close(&mut block, Some(&content)));
                    self.blocks.push(((message_id.to_owned(), index), block));
                }
            }
        }
        out
    }

    fn on_user(&mut self, frame: &Value) -> Vec<EventBody> {
        let contents = frame
            .pointer("/message/content")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut out = Vec::new();
        for content in contents.iter().filter(|c| c["type"] == "tool_result") {
            let call_id = str_of(content, "tool_use_id").to_owned();
            let output = match content.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            out.push(EventBody::ToolExecStart(ToolExecStart {
                call_id: call_id.clone(),
                name: self.tool_names.remove(&call_id),
            }));
            out.push(EventBody::ToolExecEnd(ToolExecEnd {
                truncated: None,
                call_id,
                output,
                is_error: content
                    .get("is_error")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                exit_code: None,
            }));
        }
        out
    }

    fn on_control_request(&mut self, frame: &Value) -> Vec<EventBody> {
        let request = frame.get("request").unwrap_or(&Value::Null);
        let subtype = str_of(request, "subtype");
        if subtype != "can_use_tool" {
            self.skipped += 1;
            tracing::debug!(
                subtype,
                "claude: refused a control request the host does not serve"
            );
            self.replies.push(control_error_frame(
                str_of(frame, "request_id"),
                &format!("agent-host does not serve {subtype:?} control requests"),
            ));
            return Vec::new();
        }
        let request_id = str_of(frame, "request_id").to_owned();
        let suggested = request
            .get("permission_suggestions")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut options = vec![PermissionOption::new(
            "allow",
            "Allow",
            PermissionOptionKind::AllowOnce,
        )];
        let mut updates = HashMap::new();
        if let Some((option, update)) = always_option(suggested) {
            updates.insert(option.id.clone(), update);
            options.push(option);
        }
        options.push(PermissionOption::new(
            "deny",
            "Deny",
            PermissionOptionKind::RejectOnce,
        ));
        if !updates.is_empty() {
            self.suggestions.insert(request_id.clone(), updates);
        }
        vec![EventBody::PermissionRequest(PermissionRequest {
            request_id,
            tool: str_of(request, "tool_name").to_owned(),
            input: request.get("input").cloned().unwrap_or(Value::Null),
            options,
        })]
    }

    fn close_open_blocks(&mut self) -> Vec<EventBody> {
        self.blocks
            .iter_mut()
            .filter(|(_, b)| !b.closed)
            .map(|(_, b)| close(b, None))
            .collect()
    }

    fn on_result(&mut self, frame: &Value) -> Vec<EventBody> {
        let subtype = str_of(frame, "subtype");
        if subtype == "compact" || subtype == "compaction" {
            // A compaction notice mid-turn, not the end of the turn.
            return Vec::new();
        }
        let errors: Vec<&str> = frame
            .get("errors")
            .and_then(Value::as_array)
            .map(|e| e.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(rejected) = errors
            .iter()
            .find(|e| e.starts_with("No conversation found"))
        {
            // `--resume` of an id the CLI has no file for: nothing ran, the id is not ours.
            let message = (*rejected).to_owned();
            return vec![
                EventBody::Error(ErrorNotice {
                    category: ErrorCategory::ResumeRejected,
                    message: message.clone(),
                }),
                EventBody::RunEnd(RunEnd {
                    state: RunState::Failed,
                    category: Some(ErrorCategory::ResumeRejected),
                    message: Some(message),
                }),
            ];
        }
        let mut out = self.adopt_session_id(frame);
        out.extend(self.close_open_blocks());
        self.blocks.clear();
        self.current.clear();
        let usage = frame.get("usage").unwrap_or(&Value::Null);
        let tokens = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
        out.push(EventBody::Usage(Usage {
            input_tokens: tokens("input_tokens")
                .saturating_add(tokens("cache_creation_input_tokens")),
            output_tokens: tokens("output_tokens"),
            cached_input_tokens: Some(tokens("cache_read_input_tokens")),
            cost_usd: frame.get("total_cost_usd").and_then(Value::as_f64),
        }));
        let terminal = str_of(frame, "terminal_reason");
        // `error_*` subtypes (max turns, budget, during execution) fail the run even where
        // `is_error` is absent or false.
        let is_error = frame
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or(false)
            || subtype.starts_with("error");
        let text = str_of(frame, "result").to_owned();
        if terminal.starts_with("aborted") {
            out.push(EventBody::RunEnd(RunEnd {
                state: RunState::Cancelled,
                category: Some(ErrorCategory::Cancelled),
                message: None,
            }));
        } else if is_error {
            let status = frame.get("api_error_status").and_then(Value::as_u64);
            let category = if terminal == "prompt_too_long"
                || text.starts_with("Prompt is too long")
            {
                ErrorCategory::ContextExhausted
            } else if let Some(category) = status.and_then(super::categories::from_http_status) {
                category
            } else {
                super::categories::refine(ErrorCategory::AgentFailed, &text)
            };
            let message = if !text.is_empty() {
                text
            } else if !errors.is_empty() {
                errors.join("; ")
            } else {
                format!("the turn ended with {subtype}")
            };
            out.push(EventBody::Error(ErrorNotice {
                category,
                message: message.clone(),
            }));
            out.push(EventBody::RunEnd(RunEnd {
                state: RunState::Failed,
                category: Some(category),
                message: Some(message),
            }));
        } else {
            out.push(EventBody::RunEnd(RunEnd {
                state: RunState::Completed,
                category: None,
                message: None,
            }));
        }
        out
    }
}

/// Close a block with its streamed text, or with the whole content the `assistant` frame gave.
fn close(block: &mut Block, whole: Option<&Value>) -> EventBody {
    block.closed = true;
    let item_id = Some(block.item_id.clone());
    match block.kind {
        Kind::Text => EventBody::TextEnd(BlockEnd {
            truncated: None,
            item_id,
            text: whole
                .and_then(|c| c.get("text").and_then(Value::as_str))
                .map_or_else(|| block.text.clone(), str::to_owned),
            imported: false,
        }),
        Kind::Thinking => EventBody::ThinkingEnd(BlockEnd {
            truncated: None,
            item_id,
            text: whole
                .and_then(|c| c.get("thinking").and_then(Value::as_str))
                .map_or_else(|| block.text.clone(), str::to_owned),
            imported: false,
        }),
        Kind::Tool => EventBody::ToolCallEnd(ToolCallEnd {
            truncated: None,
            call_id: block.tool_id.clone(),
            name: block.name.clone(),
            input: whole
                .and_then(|c| c.get("input").cloned())
                .or_else(|| serde_json::from_str(&block.text).ok())
                .unwrap_or_else(|| json!({})),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every recorded transcript in `fixtures/claude/*.jsonl` beside its expected events
    /// (`*.events.json`). `AGENT_HOST_BLESS=1` rewrites the expectations for review.
    #[test]
    fn fixtures_translate_to_their_expected_events() {
        let checked = super::super::fixtures::check_all("claude", Translator::new, |t, l| {
            t.on_stdout_line(l)
        });
        assert!(checked >= 10, "only {checked} fixtures");
    }

    fn kinds(events: &[EventBody]) -> Vec<&'static str> {
        events.iter().map(EventBody::kind).collect()
    }

    #[test]
    fn control_requests_the_host_does_not_serve_are_refused() {
        let mut t = Translator::new();
        for subtype in ["hook_callback", "mcp_message"] {
            let line = format!(
                r#"{{"type":"control_request","request_id":"r-{subtype}","request":{{"subtype":"{subtype}"}}}}"#
            );
            assert!(t.on_stdout_line(&line).is_empty());
            let replies = t.take_replies();
            assert_eq!(replies.len(), 1, "{subtype}");
            let reply: Value = serde_json::from_str(&replies[0]).unwrap();
            assert_eq!(reply["type"], "control_response");
            assert_eq!(reply["response"]["subtype"], "error");
            assert_eq!(reply["response"]["request_id"], format!("r-{subtype}"));
            assert!(t.take_replies().is_empty());
        }
        // A permission request is served, not refused.
        let out = t.on_stdout_line(
            r#"{"type":"control_request","request_id":"p1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"ls"}}}"#,
        );
        assert_eq!(kinds(&out), ["permission.request"]);
        assert!(t.take_replies().is_empty());
    }

    #[test]
    fn junk_and_unknown_frames_are_counted_not_fatal() {
        let mut t = Translator::new();
        assert!(t.on_stdout_line("not json").is_empty());
        assert!(t.on_stdout_line(r#"{"type":"hologram"}"#).is_empty());
        assert!(t.on_stdout_line("[1,2]").is_empty());
        assert_eq!(t.skipped(), 3);
    }

    #[test]
    fn unstreamed_blocks_and_interleaved_sub_agent_streams_keep_their_text() {
        let mut t = Translator::new();
        // Two text blocks in one assistant frame, never streamed: both come out whole.
        let out = t.on_stdout_line(
            r#"{"type":"assistant","message":{"id":"m1","model":"x","content":[{"type":"text","text":"A"},{"type":"text","text":"B"}]}}"#,
        );
        let texts: Vec<String> = out
            .iter()
            .filter_map(|e| match e {
                EventBody::TextEnd(b) => Some(b.text.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["A", "B"]);
        // A second unstreamed message is not mistaken for a repeat of the first.
        let out = t.on_stdout_line(
            r#"{"type":"assistant","message":{"id":"m2","model":"x","content":[{"type":"text","text":"C"}]}}"#,
        );
        assert_eq!(kinds(&out), ["text.start", "text.end"]);
        // Main and sub-agent streams interleave; each delta lands in its own block.
        let lines = [
            r#"{"type":"stream_event","parent_tool_use_id":null,"event":{"type":"message_start","message":{"id":"ma"}}}"#,
            r#"{"type":"stream_event","parent_tool_use_id":"toolu_sub","event":{"type":"message_start","message":{"id":"mb"}}}"#,
            r#"{"type":"stream_event","parent_tool_use_id":null,"event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}}"#,
            r#"{"type":"stream_event","parent_tool_use_id":"toolu_sub","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}}"#,
            r#"{"type":"stream_event","parent_tool_use_id":null,"event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"AAA"}}}"#,
            r#"{"type":"stream_event","parent_tool_use_id":"toolu_sub","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"BBB"}}}"#,
            r#"{"type":"stream_event","parent_tool_use_id":null,"event":{"type":"content_block_stop","index":0}}"#,
            r#"{"type":"stream_event","parent_tool_use_id":"toolu_sub","event":{"type":"content_block_stop","index":0}}"#,
        ];
        let ends: Vec<(String, String)> = lines
            .iter()
            .flat_map(|l| t.on_stdout_line(l))
            .filter_map(|e| match e {
                EventBody::TextEnd(b) => Some((b.item_id.unwrap_or_default(), b.text)),
                _ => None,
            })
            .collect();
        assert_eq!(
            ends,
            [
                ("ma:0".to_owned(), "AAA".to_owned()),
                ("mb:0".to_owned(), "BBB".to_owned())
            ]
        );
    }

    #[test]
    fn error_subtypes_fail_and_huge_counts_do_not_overflow() {
        let mut t = Translator::new();
        let out = t.on_stdout_line(
            r#"{"type":"result","subtype":"error_max_turns","is_error":false,"session_id":"s2","usage":{"input_tokens":18446744073709551615,"cache_creation_input_tokens":5}}"#,
        );
        assert_eq!(kinds(&out), ["session.bound", "usage", "error", "run.end"]);
        match out.last() {
            Some(EventBody::RunEnd(e)) => assert_eq!(e.state, RunState::Failed),
            other => panic!("{other:?}"),
        }
    }

    /// The CLI had the prompt and died before its `result`: whether it acted is unknown.
    #[test]
    fn a_process_that_dies_mid_turn_fails_the_run() {
        let mut t = Translator::new();
        t.on_stdout_line(
            r#"{"type":"stream_event","event":{"type":"message_start","message":{"id":"m"}}}"#,
        );
        t.on_stdout_line(r#"{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}}"#);
        t.on_stdout_line(r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"par"}}}"#);
        let out = t.on_exit(true, "signal 9");
        assert_eq!(kinds(&out), ["text.end", "error", "run.end"]);
        match &out[2] {
            EventBody::RunEnd(end) => {
                assert_eq!(end.state, RunState::Failed);
                assert_eq!(end.category, Some(ErrorCategory::ResultDeliveryUnknown));
                let message = end.message.as_deref().unwrap_or_default();
                assert!(message.contains("signal 9"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(t.on_exit(false, "exit 0").is_empty());
    }

    /// `can_use_tool` as Claude Code 2.1.197 sent it (reference transcript): the suggestions
    /// become one always option, and choosing it sends them back scoped to the session.
    #[test]
    fn permission_suggestions_become_an_always_option() {
        let mut t = Translator::new();
        let out = t.on_stdout_line(
            r#"{"type":"control_request","request_id":"p1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"touch x && echo hi"},"permission_suggestions":[{"type":"addRules","rules":[{"toolName":"Bash","ruleContent":"touch x && echo hi"}],"behavior":"allow","destination":"localSettings"},{"type":"addDirectories","directories":["/w"],"destination":"session"},{"type":"setMode","mode":"acceptEdits","destination":"session"}],"tool_use_id":"toolu_1"}}"#,
        );
        let EventBody::PermissionRequest(request) = &out[0] else {
            panic!("{out:?}");
        };
        let ids: Vec<&str> = request.options.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["allow", "allow_always", "deny"]);
        let always = &request.options[1];
        assert_eq!(always.kind, PermissionOptionKind::AllowAlways);
        assert_eq!(
            always.label,
            "Always allow Bash(touch x && echo hi) and access to /w"
        );
        assert_eq!(
            always.rule.as_deref(),
            Some("always allow Bash(touch x && echo hi) and access to /w in this session")
        );
        let (line, kept) = t.permission_frame(
            "p1",
            true,
            Some(always),
            &json!({"command": "touch x && echo hi"}),
            None,
        );
        assert!(kept);
        let frame: Value = serde_json::from_str(&line).unwrap();
        let response = &frame["response"]["response"];
        assert_eq!(response["behavior"], "allow");
        let updates = response["updatedPermissions"].as_array().unwrap();
        assert_eq!(updates.len(), 2, "{response}");
        assert!(updates.iter().all(|u| u["destination"] == "session"));
        assert_eq!(updates[0]["rules"][0]["ruleContent"], "touch x && echo hi");
        // Allow once sends none.
        t.on_stdout_line(
            r#"{"type":"control_request","request_id":"p2","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{},"permission_suggestions":[{"type":"setMode","mode":"acceptEdits","destination":"session"}]}}"#,
        );
        let once = PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce);
        let (line, kept) = t.permission_frame("p2", true, Some(&once), &json!({}), None);
        assert!(!kept);
        let frame: Value = serde_json::from_str(&line).unwrap();
        assert!(
            frame["response"]["response"]
                .get("updatedPermissions")
                .is_none()
        );
        // The always option again, its suggestions gone with the first answer: a plain allow,
        // and the driver says the always part did not go out.
        let (line, kept) = t.permission_frame("p1", true, Some(always), &json!({}), None);
        assert!(!kept);
        let frame: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(frame["response"]["response"]["behavior"], "allow");
        assert!(
            frame["response"]["response"]
                .get("updatedPermissions")
                .is_none()
        );
        // A mode switch is the always option only when nothing else is suggested.
        let out = t.on_stdout_line(
            r#"{"type":"control_request","request_id":"p3","request":{"subtype":"can_use_tool","tool_name":"Write","input":{},"permission_suggestions":[{"type":"setMode","mode":"acceptEdits","destination":"session"}]}}"#,
        );
        let EventBody::PermissionRequest(request) = &out[0] else {
            panic!("{out:?}");
        };
        assert_eq!(request.options[1].id, "mode:acceptEdits");
        // No suggestions: allow and deny only.
        let out = t.on_stdout_line(
            r#"{"type":"control_request","request_id":"p4","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{}}}"#,
        );
        let EventBody::PermissionRequest(request) = &out[0] else {
            panic!("{out:?}");
        };
        assert_eq!(request.options, PermissionOption::allow_deny());
    }

    #[test]
    fn input_frames_have_the_shapes_the_cli_reads() {
        let user: Value = serde_json::from_str(&user_frame("hi", "run-1")).unwrap();
        assert_eq!(user["message"]["content"], "hi");
        assert_eq!(user["uuid"], "run-1");
        let int: Value = serde_json::from_str(&interrupt_frame("i1")).unwrap();
        assert_eq!(int["request"]["subtype"], "interrupt");
        let allow: Value = serde_json::from_str(&permission_frame(
            "p",
            true,
            &json!({"command": "ls"}),
            None,
        ))
        .unwrap();
        assert_eq!(
            allow["response"]["response"]["updatedInput"]["command"],
            "ls"
        );
        let deny: Value =
            serde_json::from_str(&permission_frame("p", false, &Value::Null, Some("no"))).unwrap();
        assert_eq!(deny["response"]["response"]["message"], "no");
        assert_eq!(
            launch_args(Some("u"), None, false).last().unwrap(),
            "--session-id=u"
        );
        assert_eq!(
            launch_args(Some("u"), Some("n"), false).last().unwrap(),
            "--resume=n"
        );
        let fork = launch_args(None, Some("n"), true);
        assert_eq!(fork[fork.len() - 2..], ["--resume=n", "--fork-session"]);
    }

    #[test]
    fn project_folders_follow_the_cli_rule() {
        assert_eq!(project_dir_name("/home/u/my proj.v2"), "-home-u-my-proj-v2");
        assert_eq!(project_dir_name("/tmp/é"), "-tmp--");
        let dir = tempfile::tempdir().unwrap();
        let long = format!("/{}", "a".repeat(250));
        let name: String = project_dir_name(&long).chars().take(200).collect();
        let folder = dir.path().join("projects").join(format!("{name}-1x2y3z"));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("s1.jsonl"), "{}\n").unwrap();
        assert_eq!(
            session_file(dir.path(), &long, "s1"),
            Some(folder.join("s1.jsonl"))
        );
        assert_eq!(session_file(dir.path(), &long, "s2"), None);
        assert_eq!(session_file(dir.path(), "/short", "s1"), None);
    }

    /// The file is where the cwd's project folder is, and the cwd its entries record is
    /// this one: not another cwd's whose folder name is the same, not a file of another
    /// folder; a symlinked cwd is the directory it points to; garbage is only its folder.
    #[test]
    fn a_session_file_matches_the_cwd_it_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        let work = dir.path().join("a/b-c");
        let twin = dir.path().join("a/b/c");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&twin).unwrap();
        let work = work.to_str().unwrap().to_owned();
        let twin = twin.to_str().unwrap().to_owned();
        assert_eq!(project_dir_name(&work), project_dir_name(&twin));
        let folder = config.join("projects").join(project_dir_name(&work));
        std::fs::create_dir_all(&folder).unwrap();
        let entry = |cwd: &str| {
            format!(
                "{}\n{}\n",
                json!({"type": "queue-operation", "sessionId": "s"}),
                json!({"type": "user", "cwd": cwd, "message": {"content": "hi"}})
            )
        };
        std::fs::write(folder.join("mine.jsonl"), entry(&work)).unwrap();
        std::fs::write(folder.join("theirs.jsonl"), entry(&twin)).unwrap();
        std::fs::write(folder.join("bare.jsonl"), "\u{0}garbage\n[1]\n").unwrap();
        assert!(session_cwd_matches(&config, &work, "mine"));
        assert!(!session_cwd_matches(&config, &work, "theirs"));
        assert!(session_cwd_matches(&config, &twin, "theirs"));
        assert!(session_cwd_matches(&config, &work, "bare"));
        assert!(!session_cwd_matches(&config, &work, "missing"));
        assert!(!session_cwd_matches(&config, "/elsewhere", "mine"));
        // Through a symlink: the CLI ran in (and recorded) the directory it points to.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&work, &link).unwrap();
        assert!(session_cwd_matches(&config, link.to_str().unwrap(), "mine"));
        assert!(!session_cwd_matches(
            &config,
            link.to_str().unwrap(),
            "theirs"
        ));
    }

    /// A session file the real CLI wrote (2.1.197): two prompts sent with the host's ids (a
    /// thinking turn, a tool turn), then one typed in a terminal (`claude -p --resume`).
    #[test]
    fn session_file_prompts_are_told_from_everything_else() {
        use crate::session::agent::FileEntry;
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/claude/session-files/tool-and-terminal.jsonl"),
        )
        .unwrap();
        let entries: Vec<FileEntry> = text.lines().map(|l| file_entry(l.as_bytes())).collect();
        let prompts: Vec<&str> = entries
            .iter()
            .filter_map(|e| match e {
                FileEntry::Prompt { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            prompts,
            [
                "019ad2a0-0000-7000-8000-0000000000a1",
                "019ad2a0-0000-7000-8000-0000000000a2",
                "b499e0ca-af00-49b3-897c-e64d0af6c9be"
            ]
        );
        assert!(!entries.contains(&FileEntry::Unreadable));
        // The tool result is a `user` entry too, but not a prompt.
        assert!(text.contains("tool_result"));
        assert_eq!(file_entry(b"{\"type\":\"assis"), FileEntry::Unreadable);
        assert_eq!(file_entry(b"[1]"), FileEntry::Unreadable);
        assert_eq!(file_entry(br#"{"uuid":"x"}"#), FileEntry::Unreadable);
        assert_eq!(
            file_entry(br#"{"type":"user","message":{"content":"no id"}}"#),
            FileEntry::Unreadable
        );
    }

    #[test]
    fn session_options_become_flags() {
        use crate::protocol::options::{EnvVar, Header};
        assert!(option_args(&SessionOptions::default(), None).is_empty());
        let options = SessionOptions {
            model: Some("claude-x".to_owned()),
            system_prompt: Some("Be brief.".to_owned()),
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
                    url: "http://127.0.0.1:1/mcp".to_owned(),
                    headers: vec![Header {
                        name: "Authorization".to_owned(),
                        value: "Bearer t".to_owned(),
                    }],
                },
                McpServer::Sse {
                    name: "old".to_owned(),
                    url: "http://127.0.0.1:1/sse".to_owned(),
                    headers: Vec::new(),
                },
            ],
            permission_mode: Some(PermissionMode::AcceptEdits),
        };
        let file = std::path::Path::new("/h/run/claude-mcp-s1.json");
        let args = option_args(&options, Some(file));
        let value = |flag: &str| {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1].clone()
        };
        assert_eq!(value("--model"), "claude-x");
        assert_eq!(value("--append-system-prompt"), "Be brief.");
        assert_eq!(value("--permission-mode"), "acceptEdits");
        assert_eq!(value("--mcp-config"), "/h/run/claude-mcp-s1.json");
        assert!(!args.iter().any(|a| a.contains("Bearer t")), "{args:?}");
        let config: Value = serde_json::from_str(&mcp_config(&options.mcp_servers)).unwrap();
        assert_eq!(
            config,
            json!({"mcpServers": {
                "probe": {"type": "stdio", "command": "node", "args": ["/t/probe.mjs"], "env": {"K": "v"}},
                "web": {"type": "http", "url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer t"}},
                "old": {"type": "sse", "url": "http://127.0.0.1:1/sse", "headers": {}},
            }})
        );
        for (mode, native) in [
            (PermissionMode::Ask, "default"),
            (PermissionMode::Bypass, "bypassPermissions"),
        ] {
            let args = option_args(
                &SessionOptions {
                    permission_mode: Some(mode),
                    ..SessionOptions::default()
                },
                None,
            );
            assert_eq!(args, ["--permission-mode", native]);
        }
    }

    #[test]
    fn attachments_become_content_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, mime: &str, kind: AttachmentKind, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            Attachment {
                name: name.to_owned(),
                mime: mime.to_owned(),
                kind,
                bytes: bytes.len() as u64,
                sha256: String::new(),
                path,
            }
        };
        let blocks = attachment_blocks(&[
            file("a.png", "image/png", AttachmentKind::Image, b"\x89PNG"),
            file("b.pdf", "application/pdf", AttachmentKind::File, b"%PDF"),
            file(
                "c.txt",
                "text/plain",
                AttachmentKind::File,
                "héllo".as_bytes(),
            ),
        ])
        .unwrap();
        assert_eq!(
            blocks[0],
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}})
        );
        assert_eq!(blocks[1]["type"], "document");
        assert_eq!(
            blocks[1]["source"],
            json!({"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="})
        );
        assert_eq!(
            blocks[2],
            json!({"type": "document", "title": "c.txt",
                   "source": {"type": "text", "media_type": "text/plain", "data": "héllo"}})
        );
        let frame: Value =
            serde_json::from_str(&user_frame_with("look", "run-1", &blocks)).unwrap();
        assert_eq!(frame["uuid"], "run-1");
        let content = frame["message"]["content"].as_array().unwrap();
        assert_eq!(content[0], json!({"type": "text", "text": "look"}));
        assert_eq!(content.len(), 4);
        // No attachments: the plain frame.
        assert_eq!(user_frame_with("hi", "r", &[]), user_frame("hi", "r"));
        // Binary that is not a PDF, and a copy that is gone: refused, saying which.
        let zip = file(
            "d.zip",
            "application/zip",
            AttachmentKind::File,
            b"PK\x03\x04\xff",
        );
        let why = attachment_blocks(&[zip]).unwrap_err();
        assert_eq!(why.category, ErrorCategory::ProtocolIncompatible);
        assert!(
            why.message.contains("d.zip") && why.message.contains("not sent"),
            "{}",
            why.message
        );
        let mut gone = file("e.png", "image/png", AttachmentKind::Image, b"x");
        gone.path = dir.path().join("missing.png");
        let why = attachment_blocks(&[gone]).unwrap_err();
        assert_eq!(why.category, ErrorCategory::TransportLost);
        assert!(why.message.contains("e.png"), "{}", why.message);
    }

    #[test]
    fn answers_to_the_hosts_control_requests_are_kept_by_id() {
        let frame: Value = serde_json::from_str(&set_model_frame("sm-1", "claude-y")).unwrap();
        assert_eq!(
            frame,
            json!({"type": "control_request", "request_id": "sm-1",
                   "request": {"subtype": "set_model", "model": "claude-y"}})
        );
        let mut t = Translator::new();
        assert!(t.on_stdout_line(r#"{"type":"control_response","response":{"subtype":"success","request_id":"sm-1"}}"#).is_empty());
        assert!(t.on_stdout_line(r#"{"type":"control_response","response":{"subtype":"error","request_id":"sm-2","error":"no such model"}}"#).is_empty());
        assert_eq!(
            t.take_control_responses(),
            [
                ("sm-1".to_owned(), Ok(Value::Null)),
                ("sm-2".to_owned(), Err("no such model".to_owned()))
            ]
        );
        assert!(t.take_control_responses().is_empty());
        assert_eq!(t.skipped(), 0);
    }
}
