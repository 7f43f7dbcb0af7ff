//! Sessions the agents keep themselves, for `session.import`: [`SessionManager::discover`]
//! lists a family's own sessions of a cwd (`session.discover`), and
//! [`SessionManager::publish_imported`] makes an imported session's history whole, publishing
//! the conversation the agent already had (read from its own files) as brackets marked
//! `imported`, before anything else happens in the session.
//!
//! What a family reads is its own business (`AgentFamily::discover` and
//! `AgentFamily::read_history`); here is what the host does with it: the listing is newest
//! first and at most [`MAX_DISCOVERED`] long, each with the host session already made from it;
//! an import shows at most the last [`MAX_IMPORTED_ENTRIES`] entries (a `warning` says when
//! older ones were left out), with no `runId` (no run of the host's produced them).

use std::path::Path;

use serde_json::Value;

use super::{SessionError, SessionManager, canonical_dir};
use crate::protocol::events::{
    BlockEnd, BlockStart, Event, EventBody, Notice, ToolCallEnd, ToolCallStart, ToolExecEnd,
    ToolExecStart, Truncated, UserText,
};
pub use crate::protocol::replies::{DiscoveredSession, SessionsDiscovered};

/// The most sessions `session.discover` lists.
pub const MAX_DISCOVERED: usize = 200;
/// The most entries (prompts, answers, tool calls, tool results) of an agent's own history an
/// import shows: the last ones.
pub const MAX_IMPORTED_ENTRIES: usize = 500;
/// The longest text one imported entry keeps (a longer one is cut, and says so).
pub const MAX_IMPORTED_TEXT: usize = 256 * 1024;
/// The longest tool output or input JSON one imported tool call keeps.
pub const MAX_IMPORTED_TOOL_BYTES: usize = 64 * 1024;
/// The longest first prompt a listing shows.
pub const MAX_FIRST_PROMPT: usize = 500;

/// One session of an agent's own, as its files tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub native_session_id: String,
    /// Its first real prompt (not a command wrapper, an interrupt marker or injected context),
    /// at most [`MAX_FIRST_PROMPT`] characters.
    pub first_prompt: String,
    /// When it was last written: its last entry's timestamp, else the file's mtime.
    pub last_activity_ms: i64,
    /// How many real prompts it holds.
    pub turns: u32,
}

/// One entry of an agent's own conversation, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryEntry {
    /// A prompt of the user's.
    User { text: String },
    /// Text the agent answered.
    Assistant { text: String },
    /// A tool the agent called.
    ToolCall {
        call_id: String,
        name: String,
        input: Value,
    },
    /// What a tool call gave back.
    ToolResult {
        call_id: String,
        output: String,
        is_error: bool,
    },
}

/// The start of `text`, at most `max` bytes, cut at a character boundary.
fn head(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to at most `max` bytes, and what was cut (if anything).
fn cut(text: String, max: usize) -> (String, Option<Truncated>) {
    if text.len() <= max {
        return (text, None);
    }
    let kept = head(&text, max).to_owned();
    let truncated = Truncated {
        full_bytes: text.len() as u64,
        kept_bytes: kept.len() as u64,
    };
    (kept, Some(truncated))
}

/// The brackets that show `entries` (the last [`MAX_IMPORTED_ENTRIES`] of them) in a session:
/// a `warning` first when older ones were left out, then per entry `user.text` (imported),
/// `text.start` + `text.end` (imported), `tool.call.start` + `tool.call.end`, or
/// `tool.exec.start` + `tool.exec.end`.
pub fn imported_events(agent_type: &str, entries: Vec<HistoryEntry>) -> Vec<EventBody> {
    let total = entries.len();
    let skip = total.saturating_sub(MAX_IMPORTED_ENTRIES);
    let mut out = Vec::new();
    if skip > 0 {
        out.push(EventBody::Warning(Notice {
            code: "imported_history_cut".to_owned(),
            message: format!(
                "the {agent_type} session's history has {total} entries; only the last \
                 {MAX_IMPORTED_ENTRIES} are shown here (the agent still has all of them)"
            ),
        }));
    }
    for (n, entry) in entries.into_iter().skip(skip).enumerate() {
        match entry {
            HistoryEntry::User { text } => {
                let (text, _) = cut(text, MAX_IMPORTED_TEXT);
                out.push(EventBody::UserText(UserText {
                    text,
                    imported: true,
                    ..UserText::default()
                }));
            }
            HistoryEntry::Assistant { text } => {
                let item_id = Some(format!("imported-{n}"));
                let (text, truncated) = cut(text, MAX_IMPORTED_TEXT);
                out.push(EventBody::TextStart(BlockStart {
                    item_id: item_id.clone(),
                }));
                out.push(EventBody::TextEnd(BlockEnd {
                    item_id,
                    text,
                    truncated,
                    imported: true,
                }));
            }
            HistoryEntry::ToolCall {
                call_id,
                name,
                input,
            } => {
                let json = input.to_string();
                let (input, truncated) = if json.len() > MAX_IMPORTED_TOOL_BYTES {
                    let (kept, truncated) = cut(json, MAX_IMPORTED_TOOL_BYTES);
                    (Value::String(kept), truncated)
                } else {
                    (input, None)
                };
                out.push(EventBody::ToolCallStart(ToolCallStart {
                    call_id: call_id.clone(),
                    name: name.clone(),
                }));
                out.push(EventBody::ToolCallEnd(ToolCallEnd {
                    call_id,
                    name,
                    input,
                    truncated,
                }));
            }
            HistoryEntry::ToolResult {
                call_id,
                output,
                is_error,
            } => {
                let (output, truncated) = cut(output, MAX_IMPORTED_TOOL_BYTES);
                out.push(EventBody::ToolExecStart(ToolExecStart {
                    call_id: call_id.clone(),
                    name: None,
                }));
                out.push(EventBody::ToolExecEnd(ToolExecEnd {
                    call_id,
                    output,
                    is_error,
                    exit_code: None,
                    truncated,
                }));
            }
        }
    }
    out
}

impl SessionManager {
    /// The agent's own sessions of `cwd` (`session.discover`), newest first, at most
    /// [`MAX_DISCOVERED`], each with the host session already made from it (one whose
    /// `fork_of` or native id it is, of the same agent type). A family that cannot list its
    /// sessions: `option_unsupported` (`option: "discover"`).
    pub async fn discover(
        &self,
        agent_type: String,
        cwd: String,
    ) -> Result<SessionsDiscovered, SessionError> {
        if !self.launcher.knows(&agent_type) {
            return Err(SessionError::UnknownAgentType(agent_type));
        }
        let cwd = tokio::task::spawn_blocking(move || canonical_dir(&cwd))
            .await
            .map_err(|e| SessionError::InvalidParams(e.to_string()))??;
        let (launcher, family, dir) = (self.launcher.clone(), agent_type.clone(), cwd.clone());
        let found =
            tokio::task::spawn_blocking(move || launcher.discover(&family, Path::new(&dir)))
                .await
                .map_err(|e| SessionError::InvalidParams(e.to_string()))?;
        let mut found = match found {
            None => {
                return Err(SessionError::OptionUnsupported {
                    option: "discover".to_owned(),
                    agent_type,
                    reason: "this agent's sessions cannot be listed by the host (it keeps no \
                             files the host reads)"
                        .to_owned(),
                });
            }
            Some(Err(reason)) => {
                return Err(SessionError::AgentUnavailable(format!(
                    "{agent_type:?} sessions of {cwd} cannot be listed: {reason}"
                )));
            }
            Some(Ok(found)) => found,
        };
        found.sort_by(|a, b| {
            b.last_activity_ms
                .cmp(&a.last_activity_ms)
                .then_with(|| a.native_session_id.cmp(&b.native_session_id))
        });
        found.truncate(MAX_DISCOVERED);
        let rows = self.store.list_sessions().await?;
        let made_from = |native: &str| {
            rows.iter()
                .filter(|r| r.agent_type == agent_type)
                .filter(|r| {
                    r.fork_of.as_deref() == Some(native)
                        || r.native_session_id.as_deref() == Some(native)
                })
                // The oldest one made from it: the import, not a later fork of that.
                .min_by_key(|r| r.created_at_ms)
                .map(|r| r.session_id.clone())
        };
        let sessions = found
            .into_iter()
            .map(|d| DiscoveredSession {
                imported_as: made_from(&d.native_session_id),
                native_session_id: d.native_session_id,
                first_prompt: d.first_prompt,
                last_activity_ms: d.last_activity_ms,
                turns: d.turns,
            })
            .collect();
        Ok(SessionsDiscovered { sessions })
    }

    /// Publish the agent's own conversation of `native_id` in the session `session_id` being
    /// imported, before anything else happens in it (the import calls it before the row is
    /// inserted, and waits for the events to commit): read from the family's files (off the
    /// runtime) and shown as brackets marked `imported`. A history that cannot be
    /// read is a `warning` (`imported_history_unavailable`); the import stands either way.
    pub(super) async fn publish_imported(
        &self,
        session_id: &str,
        agent_type: &str,
        cwd: &str,
        native_id: &str,
    ) {
        let (launcher, family, dir, id) = (
            self.launcher.clone(),
            agent_type.to_owned(),
            cwd.to_owned(),
            native_id.to_owned(),
        );
        let read = tokio::task::spawn_blocking(move || {
            launcher.read_history(&family, Path::new(&dir), &id)
        })
        .await;
        let bodies = match read {
            Ok(Some(Ok(entries))) => imported_events(agent_type, entries),
            Ok(None) => vec![EventBody::Warning(Notice {
                code: "imported_history_unavailable".to_owned(),
                message: format!(
                    "the earlier conversation of {agent_type} session {native_id} is not shown: \
                     the host cannot read this agent's history (the agent still has it)"
                ),
            })],
            Ok(Some(Err(reason))) => vec![EventBody::Warning(Notice {
                code: "imported_history_unavailable".to_owned(),
                message: format!(
                    "the earlier conversation of {agent_type} session {native_id} is not shown: \
                     {reason}"
                ),
            })],
            Err(e) => vec![EventBody::Warning(Notice {
                code: "imported_history_unavailable".to_owned(),
                message: format!("reading the earlier conversation failed: {e}"),
            })],
        };
        let mut receipts = Vec::with_capacity(bodies.len());
        for body in bodies {
            match self.bus.publish(&Event::new(session_id, None, body)).await {
                Ok(receipt) => receipts.push(receipt),
                Err(e) => {
                    tracing::error!(error = %e, session_id, "publishing the imported history failed");
                    break;
                }
            }
        }
        let shown = receipts.len();
        for receipt in receipts {
            if let Err(e) = receipt.committed().await {
                tracing::error!(error = %e, session_id, "committing the imported history failed");
                return;
            }
        }
        tracing::info!(session_id, events = shown, "imported history published");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_become_imported_brackets_and_a_long_history_is_cut() {
        let entries = vec![
            HistoryEntry::User { text: "hi".into() },
            HistoryEntry::Assistant {
                text: "hello".into(),
            },
            HistoryEntry::ToolCall {
                call_id: "t1".into(),
                name: "Bash".into(),
                input: serde_json::json!({"command": "ls"}),
            },
            HistoryEntry::ToolResult {
                call_id: "t1".into(),
                output: "x".repeat(MAX_IMPORTED_TOOL_BYTES + 10),
                is_error: false,
            },
        ];
        let events = imported_events("claude", entries);
        let kinds: Vec<&str> = events.iter().map(EventBody::kind).collect();
        assert_eq!(
            kinds,
            [
                "user.text",
                "text.start",
                "text.end",
                "tool.call.start",
                "tool.call.end",
                "tool.exec.start",
                "tool.exec.end"
            ]
        );
        let json = |b: &EventBody| serde_json::to_value(Event::new("s", None, b.clone())).unwrap();
        assert_eq!(json(&events[0])["imported"], true);
        assert_eq!(json(&events[2])["imported"], true);
        assert_eq!(json(&events[2])["itemId"], json(&events[1])["itemId"]);
        assert!(json(&events[0]).get("runId").is_none());
        let EventBody::ToolExecEnd(end) = &events[6] else {
            panic!("{:?}", events[6]);
        };
        assert_eq!(end.output.len(), MAX_IMPORTED_TOOL_BYTES);
        assert!(end.truncated.is_some());

        let many = (0..MAX_IMPORTED_ENTRIES + 3)
            .map(|i| HistoryEntry::User {
                text: format!("p{i}"),
            })
            .collect();
        let events = imported_events("claude", many);
        assert_eq!(events.len(), MAX_IMPORTED_ENTRIES + 1);
        assert!(matches!(&events[0], EventBody::Warning(n) if n.code == "imported_history_cut"));
        assert!(matches!(&events[1], EventBody::UserText(u) if u.text == "p3"));
    }

    mod claude_files {
        use std::path::Path;

        use serde_json::{Value, json};

        use super::super::HistoryEntry;
        use crate::adapter::claude::{discover_sessions, project_dir_name, read_session_history};

        const FIXTURE: &str = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/claude/session-files/tool-and-terminal.jsonl"
        );

        /// A config dir holding the fixture as a session of `cwd`, a file of another cwd
        /// sharing its project folder, and one of commands only.
        fn config_with_fixture(cwd: &str) -> tempfile::TempDir {
            let config = tempfile::tempdir().unwrap();
            let dir = config.path().join("projects").join(project_dir_name(cwd));
            std::fs::create_dir_all(&dir).unwrap();
            let text = std::fs::read_to_string(FIXTURE)
                .unwrap()
                .replace("/tmp/exp2/w", cwd);
            std::fs::write(
                dir.join("22222222-2222-4333-8444-555555555555.jsonl"),
                &text,
            )
            .unwrap();
            let other = text.replace(&format!("\"cwd\":\"{cwd}\""), "\"cwd\":\"/elsewhere\"");
            std::fs::write(
                dir.join("33333333-2222-4333-8444-555555555555.jsonl"),
                other,
            )
            .unwrap();
            let line = |content: Value| {
                json!({"type": "user", "cwd": cwd, "message": {"role": "user", "content": content}})
                    .to_string()
            };
            std::fs::write(
                dir.join("44444444-2222-4333-8444-555555555555.jsonl"),
                [
                    line(json!("<command-name>/clear</command-name>")),
                    line(json!("<local-command-stdout>x</local-command-stdout>")),
                    line(json!("[Request interrupted by user]")),
                    line(json!([{"type": "tool_result", "tool_use_id": "t", "content": "x"}])),
                    json!({"type": "user", "isMeta": true, "cwd": cwd,
                           "message": {"content": "Caveat: ..."}})
                    .to_string(),
                ]
                .join("\n")
                    + "\n",
            )
            .unwrap();
            config
        }

        #[test]
        fn a_cwd_lists_its_own_sessions_with_their_first_prompt() {
            let config = config_with_fixture("/work/proj");
            let found = discover_sessions(config.path(), "/work/proj");
            assert_eq!(found.len(), 1, "{found:?}");
            let d = &found[0];
            assert_eq!(d.native_session_id, "22222222-2222-4333-8444-555555555555");
            assert_eq!(d.first_prompt, "THINK first");
            assert_eq!(d.turns, 3);
            // The last entry with a time: 2026-11-30T08:25:33.672Z.
            assert_eq!(d.last_activity_ms, 1_796_027_133_672);
            assert!(discover_sessions(config.path(), "/work/other").is_empty());
        }

        #[test]
        fn a_prompt_is_a_string_or_its_text_blocks_without_injected_context() {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("s.jsonl");
            let user = |content: Value| {
                json!({"type": "user", "message": {"role": "user", "content": content}}).to_string()
            };
            std::fs::write(
                &file,
                [
                    user(
                        json!([{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                {"type": "text", "text": "look"}]),
                    ),
                    user(json!("<command-name>/model</command-name>")),
                    json!({"type": "assistant", "message": {"model": "<synthetic>",
                           "content": [{"type": "text", "text": "API Error"}]}})
                    .to_string(),
                    json!({"type": "assistant", "isSidechain": true,
                           "message": {"content": [{"type": "text", "text": "sub-agent"}]}})
                    .to_string(),
                    "torn {".to_owned(),
                ]
                .join("\n"),
            )
            .unwrap();
            assert_eq!(
                read_session_history(&file).unwrap(),
                [HistoryEntry::User {
                    text: "look".into()
                }]
            );
        }

        #[test]
        fn the_history_holds_prompts_answers_and_tool_calls() {
            let history = read_session_history(Path::new(FIXTURE)).unwrap();
            let user = |t: &str| HistoryEntry::User { text: t.into() };
            let said = |t: &str| HistoryEntry::Assistant { text: t.into() };
            assert_eq!(
                history,
                [
                    user("THINK first"),
                    said("echo: THINK first [user turns seen: 1; first: THINK first]"),
                    user("TOOLCALL `echo hi`"),
                    said("Running it."),
                    HistoryEntry::ToolCall {
                        call_id: "toolu_mock_2".into(),
                        name: "Bash".into(),
                        input: json!({"command": "echo hi", "description": "run a command"}),
                    },
                    HistoryEntry::ToolResult {
                        call_id: "toolu_mock_2".into(),
                        output: "hi".into(),
                        is_error: false,
                    },
                    said("tool said: hi"),
                    user("typed in a terminal"),
                    said("echo: typed in a terminal [user turns seen: 3; first: THINK first]"),
                ]
            );
        }
    }

    mod codex_rollouts {
        use std::path::Path;

        use super::super::HistoryEntry;
        use crate::adapter::codex::{discover_rollouts, rollout_history};

        const FIXTURE: &str = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/codex/rollouts/sandbox-denied.rollout.jsonl"
        );
        const THREAD: &str = "01a2322b-976e-7551-81bf-80f0cec0ca2d";

        #[test]
        fn a_recorded_rollout_is_listed_for_its_cwd_with_its_history() {
            let home = tempfile::tempdir().unwrap();
            let day = home.path().join("sessions/2026/12/01");
            std::fs::create_dir_all(&day).unwrap();
            let work = tempfile::tempdir().unwrap();
            let cwd = work.path().to_str().unwrap();
            let text = std::fs::read_to_string(FIXTURE).unwrap().replace(
                "\"cwd\":\"/WORK\"",
                &format!("\"cwd\":{}", serde_json::json!(cwd)),
            );
            std::fs::write(
                day.join(format!("rollout-2026-12-01T15-14-07-{THREAD}.jsonl")),
                text,
            )
            .unwrap();
            let found = discover_rollouts(home.path(), work.path());
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(found[0].native_session_id, THREAD);
            // The user's prompt, not the environment context Codex put before it.
            assert_eq!(
                found[0].first_prompt,
                "TOOLCALL `echo hi > /agent-host-probe`"
            );
            assert_eq!(found[0].turns, 1);
            assert!(found[0].last_activity_ms > 1_796_138_047_000);
            assert!(discover_rollouts(home.path(), Path::new("/elsewhere")).is_empty());

            let history = rollout_history(Path::new(FIXTURE)).unwrap();
            let kinds: Vec<&str> = history
                .iter()
                .map(|e| match e {
                    HistoryEntry::User { .. } => "user",
                    HistoryEntry::Assistant { .. } => "assistant",
                    HistoryEntry::ToolCall { .. } => "call",
                    HistoryEntry::ToolResult { .. } => "result",
                })
                .collect();
            assert_eq!(kinds, ["user", "assistant", "call", "result", "assistant"]);
            assert!(
                matches!(&history[2], HistoryEntry::ToolCall { name, input, .. }
                if name == "exec_command" && input["cmd"] == "echo hi > /agent-host-probe")
            );
        }
    }
}
