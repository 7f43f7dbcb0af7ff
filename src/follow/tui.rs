//! `agent-host follow [session_id]` on a terminal: the interactive follower.
//!
//! The loop owns the terminal, the [`View`] and the input line; the [`connection`] task owns
//! the WebSocket. Each turn of the loop draws, then waits for a key, an update from the
//! connection, or SIGINT/SIGTERM. Keys become actions ([`keys`]), actions become commands
//! ([`View::act`]), replies and events change the view — the loop itself decides nothing.
//!
//! The terminal is restored (raw mode off, the alternate screen left) on every way out: a
//! normal exit, an error, and a panic (ratatui's hook restores it before the panic message
//! prints). Nothing else may write to the terminal meanwhile: `main` routes tracing to a file
//! before this starts, and a failure to start is reported by the caller after the restore.

use std::time::Duration;

use crossterm::event::{DisableBracketedPaste, EnableBracketedPaste, Event, EventStream};
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::connection::{self, Update};
use super::keys::{self, Input, KeyContext};
use super::view::{Effect, Outgoing, Tone, View};
use super::{FollowOptions, ipc_call, render, stop_signal};
use crate::config::Config;
use crate::protocol::envelope::{ErrorCode, Reply};
use crate::protocol::replies::Grant;

/// Updates applied between two draws at most (a burst of deltas is drawn once).
const BATCH: usize = 256;

/// Restores the terminal when dropped.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _unpasted = crossterm::execute!(std::io::stdout(), DisableBracketedPaste);
        let _restored = ratatui::try_restore();
    }
}

/// Follow interactively until `/quit`, Ctrl-C or a signal. Returns the reply to report (ok on
/// a clean stop); the caller prints a failure once the terminal is restored.
pub async fn run(config: &Config, options: FollowOptions) -> Reply {
    let mut params = json!({
        "type": "local",
        "forward_deltas": true,
        "replay_mode": "max_count",
        "max_count": 200,
        "client": "follow",
    });
    if let Some(id) = &options.session_id {
        params["session_id"] = json!(id);
        // `/fork` creates a session: the scope of one session allows no creation by default.
        params["create_sessions"] = json!(true);
    }
    let added = ipc_call(config, "subscriber.add", params).await;
    if !added.is_ok() {
        return added;
    }
    let grant: Grant = match added.data_as() {
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
    let outcome = interact(config, options, grant).await;
    // Leave no subscriber row behind. Best effort: the host may be gone.
    let _removed = ipc_call(
        config,
        "subscriber.remove",
        json!({"subscriber_id": subscriber_id}),
    )
    .await;
    outcome
}

async fn interact(config: &Config, options: FollowOptions, grant: Grant) -> Reply {
    let mut terminal = match ratatui::try_init() {
        Ok(terminal) => terminal,
        Err(e) => {
            let _restored = ratatui::try_restore();
            return Reply::error(
                ErrorCode::Internal,
                format!("cannot set up the terminal: {e}"),
                Value::Null,
            );
        }
    };
    let restore = Restore;
    // Bracketed paste: a paste arrives as one `Event::Paste`, typed as text, so a pasted `y`
    // or `a` never answers a permission. A terminal without it sends keys as before.
    let _pasting = crossterm::execute!(std::io::stdout(), EnableBracketedPaste);
    let subscriber_id = grant.subscriber_id.clone();
    let (commands, mut updates, task) = connection::spawn(config.ipc_path(), grant);
    let tag: String = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut view = View::new(options.session_id, &tag);
    view.set_subscriber(&subscriber_id);
    let mut input = Input::default();
    let mut events = EventStream::new();
    let stop = stop_signal();
    tokio::pin!(stop);
    let stopped = || Reply::ok(json!({"stopped": true}));
    let send = |view: &mut View, out: Outgoing| {
        if commands.try_send(out).is_err() {
            view.note(
                Tone::Warn,
                "busy: the last commands have not been answered yet",
            );
        }
    };
    let outcome = loop {
        let mut page = 0;
        if let Err(e) = terminal.draw(|frame| {
            page = render::transcript_rows(&view, frame.area().height);
            render::draw(frame, &view, &input);
        }) {
            break Reply::error(
                ErrorCode::Internal,
                format!("cannot draw: {e}"),
                Value::Null,
            );
        }
        tokio::select! {
            () = &mut stop => break stopped(),
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) => {
                    let ctx = KeyContext {
                        permission_pending: view.pending().is_some(),
                        always_offered: view.always_choice().is_some(),
                        turn_running: view.running(),
                        tool_selected: view.tool_selected(),
                        page,
                    };
                    match view.act(keys::on_key(&mut input, key, ctx)) {
                        Effect::Quit => break stopped(),
                        Effect::Request(out) => send(&mut view, out),
                        Effect::Nothing => {}
                    }
                }
                Some(Ok(Event::Paste(text))) => {
                    let _nothing_to_send = view.act(keys::on_paste(&mut input, &text));
                }
                Some(Ok(_)) => {} // a resize: the next draw fits it
                // The terminal went away: nobody to show anything to.
                Some(Err(_)) | None => break stopped(),
            },
            update = updates.recv() => {
                let mut next = update;
                let mut applied = 0;
                let fatal = loop {
                    match next {
                        None => break Some(Reply::error(
                            ErrorCode::Internal,
                            "the connection task ended",
                            Value::Null,
                        )),
                        Some(Update::Fatal(reply)) => break Some(reply),
                        Some(Update::Connected) => {
                            for out in view.on_connected() {
                                send(&mut view, out);
                            }
                        }
                        Some(Update::Event(event)) => view.on_event(&event),
                        Some(Update::Lost { reason, retry }) => view.on_lost(&reason, retry),
                        Some(Update::Reply { purpose, reply }) => view.on_reply(&purpose, &reply),
                    }
                    applied += 1;
                    if applied >= BATCH {
                        break None;
                    }
                    match updates.try_recv() {
                        Ok(update) => next = Some(update),
                        Err(_) => break None,
                    }
                };
                if let Some(reply) = fatal {
                    break reply;
                }
            }
        }
    };
    drop(commands);
    let _finished = tokio::time::timeout(Duration::from_secs(2), task).await;
    drop(terminal);
    drop(restore);
    outcome
}
