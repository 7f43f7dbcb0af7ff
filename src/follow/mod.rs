//! `agent-host follow [session_id] [--json]`: the terminal follower every user gets.
//!
//! On a terminal (stdout and stdin both ttys, no `--json`) it is interactive: [`run_interactive`]
//! (`tui.rs`, with the pure view model in `view/`, keys in `keys.rs`, drawing in
//! `render.rs`, the connection task in `connection.rs`). Everywhere else it is the line
//! follower below, whose output scripts and tests read. Both reconnect with [`Reconnect`],
//! whose backoff starts from the bottom again after a connection that stayed up.
//!
//! It mints a grant over IPC (`subscriber.add`, with deltas, replaying the newest 200
//! brackets), connects to the loopback WebSocket, and prints the stream as it comes: text as
//! it streams, tool calls and their output, permission requests, run ends. When the connection
//! drops (the host restarted, say) it gets a fresh grant (`subscriber.grant`) and reconnects
//! with its cursor, with exponential backoff and jitter (reset once a connection proved good),
//! so nothing is shown twice or missed.
//! Ctrl-C (or SIGTERM) closes the connection, removes the subscriber, and exits 0.
//!
//! `--json` prints each canonical event as one JSON line instead, for scripts. Status lines
//! ("reconnecting…") go to the second writer (stderr), never into the event stream.

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::config::Config;
use crate::ipc;
use crate::protocol::envelope::{ErrorCode, Reply};
use crate::protocol::replies::Grant;
use crate::protocol::wire::{CmdId, PROTOCOL_VERSION, pb};
use crate::ws::client::{self, ClientError, WsClient};

mod connection;
mod keys;
mod reconnect;
mod render;
mod tui;
mod view;

pub use reconnect::Reconnect;
pub use tui::run as run_interactive;

const IPC_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default)]
pub struct FollowOptions {
    pub session_id: Option<String>,
    pub json: bool,
}

/// Why one connection ended.
enum Ended {
    /// The user asked to stop.
    Stop,
    /// The connection dropped (after `up_for` greeted; `None`: it could not be made); try
    /// again.
    Lost(String, Option<Duration>),
    /// Something retrying cannot fix.
    Fatal(Reply),
}

/// Whether `follow` should run the interactive terminal UI: stdout is a terminal and no
/// `--json` was asked for. Anything else (a pipe, a file, `--json`) gets the line output.
pub fn interactive(options: &FollowOptions) -> bool {
    use std::io::IsTerminal;
    !options.json && std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// Follow until Ctrl-C. Returns the reply to report (ok on a clean stop).
pub async fn run(
    config: &Config,
    options: FollowOptions,
    out: &mut (dyn Write + Send),
    status: &mut (dyn Write + Send),
) -> Reply {
    let mut params = json!({
        "type": "local",
        "forward_deltas": true,
        "replay_mode": "max_count",
        "max_count": 200,
        "client": "follow",
    });
    if let Some(id) = &options.session_id {
        params["session_id"] = json!(id);
    }
    let added = ipc_call(config, "subscriber.add", params).await;
    if !added.is_ok() {
        return added;
    }
    let mut grant: Grant = match added.data_as() {
        Ok(grant) => grant,
        Err(e) => {
            return Reply::error(
                ErrorCode::Internal,
                format!("subscriber.add answered no grant: {e}"),
                Value::Null,
            );
        }
    };
    let subscriber_id = grant.subscriber_id.clone();
    let mut renderer = Renderer::default();
    let mut cursor: Option<i64> = None;
    // Installed before anything of the stream is printed; not earlier, so a Ctrl-C while the
    // host has not answered `subscriber.add` still ends the command at once.
    let stop = stop_signal();
    tokio::pin!(stop);
    let mut backoff = Reconnect::default();
    let outcome = loop {
        let ended = tokio::select! {
            () = &mut stop => Ended::Stop,
            ended = follow_once(&grant, &mut cursor, &options, &mut renderer, out, &mut backoff) => ended,
        };
        match ended {
            Ended::Stop => break Reply::ok(json!({"stopped": true, "cursor": cursor})),
            Ended::Fatal(reply) => break reply,
            Ended::Lost(reason, up_for) => {
                let delay = backoff.delay_after(up_for);
                let _status = writeln!(
                    status,
                    "agent-host follow: {}; reconnecting in {delay:?}",
                    visible(&reason)
                );
                tokio::select! {
                    () = &mut stop => break Reply::ok(json!({"stopped": true, "cursor": cursor})),
                    () = tokio::time::sleep(delay) => {}
                }
                // Tokens die with the host and after their TTL: ask for a fresh one each time.
                let fresh = ipc_call(
                    config,
                    "subscriber.grant",
                    json!({"subscriber_id": subscriber_id}),
                )
                .await;
                match fresh.error_code() {
                    None if fresh.is_ok() => match fresh.data_as() {
                        Ok(fresh) => grant = fresh,
                        Err(e) => {
                            break Reply::error(
                                ErrorCode::Internal,
                                format!("subscriber.grant answered no grant: {e}"),
                                Value::Null,
                            );
                        }
                    },
                    Some(ErrorCode::SubscriberNotFound) => break fresh,
                    _ => {} // the host is not back yet: keep trying
                }
            }
        }
    };
    let _flushed = out.flush();
    // Leave no subscriber row behind. Best effort: the host may be gone.
    let _removed = ipc_call(
        config,
        "subscriber.remove",
        json!({"subscriber_id": subscriber_id}),
    )
    .await;
    outcome
}

async fn ipc_call(config: &Config, command: &str, params: Value) -> Reply {
    match ipc::request(
        &config.ipc_path(),
        &json!({"command": command, "params": params}),
        IPC_TIMEOUT,
    )
    .await
    {
        Ok(reply) => reply,
        Err(e) => Reply::error(ErrorCode::HostNotRunning, e.to_string(), Value::Null),
    }
}

async fn follow_once(
    grant: &Grant,
    cursor: &mut Option<i64>,
    options: &FollowOptions,
    renderer: &mut Renderer,
    out: &mut (dyn Write + Send),
    backoff: &mut Reconnect,
) -> Ended {
    let hello = pb::Hello {
        client_name: "agent-host follow".to_owned(),
        cursor: *cursor,
        protocol_version: PROTOCOL_VERSION,
    };
    let mut ws: WsClient = match client::connect_grant(grant, hello).await {
        Ok((ws, _resp)) => ws,
        Err(ClientError::HelloRefused {
            code,
            name,
            message,
        }) if name == "subscriber_not_found" => {
            // The host's own answer, passed on as it gave it.
            return Ended::Fatal(Reply {
                code,
                message,
                data: serde_json::json!({"error": name}),
            });
        }
        Err(e) => return Ended::Lost(e.to_string(), None),
    };
    let up = Instant::now();
    let lost = |reason: String| Ended::Lost(reason, Some(up.elapsed()));
    let mut healthy = false;
    loop {
        let frame = match ws.next_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                let reason = ws.last_close.take().map_or(
                    "the host closed the connection".to_owned(),
                    |(code, why)| format!("the host closed the connection ({code} {why})"),
                );
                return lost(reason);
            }
            Err(e) => return lost(e.to_string()),
        };
        match frame.cmd {
            CmdId::EventPush => {
                let Some(push) = client::event_of(&frame) else {
                    continue;
                };
                // What an agent printed never reaches the terminal as a control sequence.
                let text = if options.json {
                    format!("{}\n", json_visible(&push.event_json))
                } else {
                    renderer.render(&push)
                };
                if out
                    .write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    // Nobody reads our output any more (a closed pipe): stop like Ctrl-C.
                    return Ended::Stop;
                }
                if !healthy {
                    // Events flow: the next loss starts its backoff from the bottom again.
                    healthy = true;
                    backoff.reset();
                }
                if !push.is_delta {
                    *cursor = Some(push.sequence_id);
                    if ws.ack(push.sequence_id).await.is_err() {
                        return lost("the connection failed while acknowledging".to_owned());
                    }
                }
            }
            CmdId::ErrorResp => {
                if let Ok(err) = frame.body::<pb::ErrorResp>() {
                    return lost(format!("the host sent {} ({})", err.name, err.message));
                }
            }
            _ => {}
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled: a Ctrl-C that comes at once (before the first event printed,
/// or right after it) stops `follow` cleanly instead of killing it with its subscriber left
/// behind.
fn stop_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        match handlers {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            // Whichever could be installed (the other keeps its default action).
            (Ok(mut one), Err(_)) | (Err(_), Ok(mut one)) => {
                let _signalled = one.recv().await;
            }
            (Err(_), Err(_)) => std::future::pending().await,
        }
    }
}

/// Turns canonical events into readable lines. Pure: one event in, text out.
#[derive(Debug, Default)]
pub struct Renderer {
    /// A text or thinking block is open and its prefix was printed.
    open_block: bool,
    /// The text of the open block printed so far from its deltas.
    printed: String,
}

fn short(value: &Value, max: usize) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() > max {
        let cut: String = text.chars().take(max).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// Text for a terminal: control characters other than newline and tab are shown, never
/// interpreted (`ESC` as `^[`, carriage return as `^M`, DEL as `^?`, C1 controls such as the
/// one-byte CSI as `<U+009B>`), so an agent's output cannot clear the screen, move the cursor,
/// set the window title or rewrite a line already printed.
pub fn visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            '\u{7f}' => out.push_str("^?"),
            c if u32::from(c) < 0x20 => {
                out.push('^');
                out.push(char::from(b'@' + c as u8));
            }
            c if ('\u{80}'..='\u{9f}').contains(&c) => {
                out.push_str(&format!("<U+{:04X}>", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out
}

/// The same for a JSON line (`--json`): such characters become `\u` escapes, which keeps the
/// line valid JSON with the same meaning.
pub fn json_visible(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        let n = u32::from(c);
        if n < 0x20 || (0x7f..=0x9f).contains(&n) {
            out.push_str(&format!("\\u{n:04x}"));
        } else {
            out.push(c);
        }
    }
    out
}

impl Renderer {
    /// One event as terminal text, made [`visible`].
    pub fn render(&mut self, push: &pb::EventPush) -> String {
        visible(&self.render_raw(push))
    }

    fn render_raw(&mut self, push: &pb::EventPush) -> String {
        let Ok(event) = serde_json::from_str::<Value>(&push.event_json) else {
            return format!("[unreadable event {}]\n", push.sequence_id);
        };
        let s = |key: &str| {
            event
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let kind = s("k");
        let run = s("runId");
        match kind.as_str() {
            "run.start" => format!("── run {run} started ──\n"),
            "run.end" => {
                let state = s("state");
                let why = [s("category"), s("message")]
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .collect::<Vec<_>>()
                    .join(": ");
                if why.is_empty() {
                    format!("── run {run} {state} ──\n")
                } else {
                    format!("── run {run} {state} ({why}) ──\n")
                }
            }
            "user.text" => format!("you: {}\n", s("text")),
            "text.start" | "thinking.start" => {
                self.open_block = true;
                self.printed.clear();
                if kind == "text.start" {
                    "assistant: ".to_owned()
                } else {
                    "thinking: ".to_owned()
                }
            }
            "text.delta" | "thinking.delta" => {
                let text = s("text");
                let prefix = if self.open_block {
                    ""
                } else if kind == "text.delta" {
                    "assistant: "
                } else {
                    "thinking: "
                };
                self.open_block = true;
                self.printed.push_str(&text);
                format!("{prefix}{text}")
            }
            "text.end" | "thinking.end" => {
                let full = s("text");
                let prefix = if self.open_block {
                    ""
                } else if kind == "text.end" {
                    "assistant: "
                } else {
                    "thinking: "
                };
                // Deltas may have been dropped (a slow terminal, a reconnect): the end carries
                // the whole text, so print whatever the deltas did not.
                let line = match full.strip_prefix(self.printed.as_str()) {
                    Some(rest) => format!("{prefix}{rest}\n"),
                    None => format!("{prefix}\n  (in full) {full}\n"),
                };
                self.open_block = false;
                self.printed.clear();
                line
            }
            "tool.call.start" | "tool.call.delta" | "tool.exec.start" | "artifact.delta" => {
                String::new()
            }
            "tool.call.end" => format!(
                "⚙ {} {}\n",
                s("name"),
                short(event.get("input").unwrap_or(&Value::Null), 200)
            ),
            "tool.exec.update" => String::new(),
            "tool.exec.end" => {
                let mark = if event.get("isError").and_then(Value::as_bool) == Some(true) {
                    "✗"
                } else {
                    "↳"
                };
                let output = s("output");
                let mut lines: Vec<&str> = output.lines().take(20).collect();
                if output.lines().count() > 20 {
                    lines.push("…");
                }
                let body = lines.join("\n    ");
                format!("  {mark} {body}\n")
            }
            "permission.request" => {
                let options = event
                    .get("options")
                    .and_then(Value::as_array)
                    .map(|o| {
                        // `{id,label,kind}` objects; older history holds bare ids.
                        o.iter()
                            .filter_map(|o| o.as_str().or_else(|| o.get("id")?.as_str()))
                            .collect::<Vec<_>>()
                            .join("/")
                    })
                    .unwrap_or_default();
                format!(
                    "? permission requested: {} {} [request {}]{}\n",
                    s("tool"),
                    short(event.get("input").unwrap_or(&Value::Null), 200),
                    s("requestId"),
                    if options.is_empty() {
                        String::new()
                    } else {
                        format!(" options: {options}")
                    }
                )
            }
            "permission.resolved" => {
                format!("  permission {}: {}\n", s("requestId"), s("decision"))
            }
            "usage" => format!(
                "  usage: {} in, {} out\n",
                event
                    .get("inputTokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
                event
                    .get("outputTokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            ),
            "session.bound" => format!("  (agent session {})\n", s("nativeSessionId")),
            "session.forked" => format!("  (forked from {})\n", s("parentSessionId")),
            // Only "needs you" is worth a line: running and idle show in the run's own events.
            "session.state" if s("state") == "waiting" => {
                "  … waiting for you: answer the permission request above\n".to_owned()
            }
            "session.state" => String::new(),
            "warning" => format!("! {}: {}\n", s("code"), s("message")),
            "error" => format!("✗ error ({}): {}\n", s("category"), s("message")),
            other => format!("[{other}]\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(json: Value, is_delta: bool) -> pb::EventPush {
        pb::EventPush {
            sequence_id: 1,
            message_id: "m".into(),
            session_id: "s".into(),
            run_id: "r".into(),
            is_delta,
            event_json: json.to_string(),
        }
    }

    #[test]
    fn control_sequences_are_shown_not_interpreted() {
        let mut r = Renderer::default();
        let hostile = "a\u{1b}[2Jb\u{1b}]0;pwned\u{7}c\rd\u{9b}31me\u{7f}\tf\n";
        let out = r.render(&push(
            json!({"k":"text.end","sessionId":"s","text":hostile}),
            false,
        ));
        assert!(
            !out.chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{out:?}"
        );
        assert!(
            out.contains("a^[[2Jb^[]0;pwned^Gc^Md<U+009B>31me^?\tf"),
            "{out:?}"
        );
        let line = json_visible("{\"text\":\"x\u{1b}y\u{9b}z\"}");
        assert_eq!(line, r#"{"text":"x\u001by\u009bz"}"#);
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["text"], "x\u{1b}y\u{9b}z");
    }

    #[test]
    fn renders_a_streamed_turn_readably() {
        let mut r = Renderer::default();
        let events = [
            (json!({"k":"run.start","sessionId":"s","runId":"r1"}), false),
            (
                json!({"k":"user.text","sessionId":"s","runId":"r1","text":"hi"}),
                false,
            ),
            (
                json!({"k":"text.start","sessionId":"s","runId":"r1"}),
                false,
            ),
            (
                json!({"k":"text.delta","sessionId":"s","runId":"r1","text":"Hel"}),
                true,
            ),
            (
                json!({"k":"text.delta","sessionId":"s","runId":"r1","text":"lo"}),
                true,
            ),
            (
                json!({"k":"text.end","sessionId":"s","runId":"r1","text":"Hello"}),
                false,
            ),
            (
                json!({"k":"tool.call.end","sessionId":"s","runId":"r1","callId":"c","name":"Bash","input":{"command":"ls"}}),
                false,
            ),
            (
                json!({"k":"tool.exec.end","sessionId":"s","runId":"r1","callId":"c","output":"a\nb"}),
                false,
            ),
            (
                json!({"k":"permission.request","sessionId":"s","runId":"r1","requestId":"p1","tool":"Bash","input":{},"options":["allow","deny"]}),
                false,
            ),
            (
                json!({"k":"session.state","sessionId":"s","runId":"r1","state":"waiting","previous":"running"}),
                false,
            ),
            (
                json!({"k":"run.end","sessionId":"s","runId":"r1","state":"failed","category":"rate_limited"}),
                false,
            ),
            (
                json!({"k":"session.state","sessionId":"s","state":"idle","previous":"waiting"}),
                false,
            ),
            (json!({"k":"hologram","sessionId":"s"}), false),
        ];
        let text: String = events
            .iter()
            .map(|(e, d)| r.render(&push(e.clone(), *d)))
            .collect();
        assert_eq!(
            text,
            "── run r1 started ──\nyou: hi\nassistant: Hello\n⚙ Bash {\"command\":\"ls\"}\n  ↳ a\n    b\n? permission requested: Bash {} [request p1] options: allow/deny\n  … waiting for you: answer the permission request above\n── run r1 failed (rate_limited) ──\n[hologram]\n"
        );
    }

    #[test]
    fn dropped_deltas_are_made_up_from_the_end() {
        let mut r = Renderer::default();
        let parts = [
            r.render(&push(json!({"k":"text.start","sessionId":"s"}), false)),
            r.render(&push(
                json!({"k":"text.delta","sessionId":"s","text":"Hel"}),
                true,
            )),
            // "lo, world" was dropped on the way.
            r.render(&push(
                json!({"k":"text.end","sessionId":"s","text":"Hello, world"}),
                false,
            )),
        ];
        assert_eq!(parts.concat(), "assistant: Hello, world\n");
        // A delta that does not match the end: the full text is shown once more.
        let mut r = Renderer::default();
        let odd = [
            r.render(&push(
                json!({"k":"text.delta","sessionId":"s","text":"Hi"}),
                true,
            )),
            r.render(&push(
                json!({"k":"text.end","sessionId":"s","text":"Hello"}),
                false,
            )),
        ];
        assert_eq!(odd.concat(), "assistant: Hi\n  (in full) Hello\n");
    }

    #[test]
    fn a_replayed_block_without_deltas_prints_its_whole_text() {
        let mut r = Renderer::default();
        let a = r.render(&push(json!({"k":"text.start","sessionId":"s"}), false));
        let b = r.render(&push(
            json!({"k":"text.end","sessionId":"s","text":"whole"}),
            false,
        ));
        assert_eq!(format!("{a}{b}"), "assistant: whole\n");
        let c = r.render(&push(
            json!({"k":"text.end","sessionId":"s","text":"alone"}),
            false,
        ));
        assert_eq!(c, "assistant: alone\n");
    }
}
