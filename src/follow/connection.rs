//! The interactive follower's connection: one task owns the WebSocket, reconnects it with its
//! cursor (a fresh grant each time, [`Reconnect`] between attempts), acknowledges brackets,
//! and runs the view's commands — over the connection while it is up (so the host knows the
//! answer came from this subscriber), over IPC while it is down or when the wire refuses one.
//!
//! Inputs: a closed message ([`Outgoing`]) on a bounded channel; outputs: [`Update`]s on a
//! bounded channel the terminal loop drains. Overload policy: the task awaits the loop (a slow
//! terminal back-pressures the socket, and the host drops deltas for a slow subscriber, never
//! brackets); the loop sends commands with `try_send` and says "busy" when the channel is full.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Reconnect;
use super::view::{Outgoing, Purpose};
use crate::ipc;
use crate::protocol::envelope::{ErrorCode, Reply};
use crate::protocol::replies::Grant;
use crate::protocol::wire::{CmdId, PROTOCOL_VERSION, pb};
use crate::ws::client::{self, ClientError, WsClient};

const IPC_TIMEOUT: Duration = Duration::from_secs(10);

/// What the connection tells the terminal loop.
#[derive(Debug)]
pub enum Update {
    /// Greeted (again): the view asks for the session's state.
    Connected,
    /// One canonical event (its JSON).
    Event(Value),
    /// The connection dropped; the next attempt is in `retry`.
    Lost { reason: String, retry: Duration },
    /// Retrying cannot help (the subscriber is gone): the loop stops with this reply.
    Fatal(Reply),
    /// The reply to a command.
    Reply { purpose: Purpose, reply: Reply },
}

/// Start the task. Dropping the command sender stops it (closing the connection).
pub fn spawn(
    ipc_path: PathBuf,
    grant: Grant,
) -> (
    mpsc::Sender<Outgoing>,
    mpsc::Receiver<Update>,
    tokio::task::JoinHandle<()>,
) {
    let (commands, requests) = mpsc::channel(16);
    let (updates, received) = mpsc::channel(1024);
    let task = tokio::spawn(run(ipc_path, grant, updates, requests));
    (commands, received, task)
}

async fn ipc_call(ipc_path: &std::path::Path, command: &str, params: Value) -> Reply {
    match ipc::request(
        ipc_path,
        &json!({"command": command, "params": params}),
        IPC_TIMEOUT,
    )
    .await
    {
        Ok(reply) => reply,
        Err(e) => Reply::error(ErrorCode::HostNotRunning, e.to_string(), Value::Null),
    }
}

/// How serving one connection ended.
enum Served {
    /// The terminal loop is gone.
    Closed,
    Lost(String),
}

async fn run(
    ipc_path: PathBuf,
    mut grant: Grant,
    updates: mpsc::Sender<Update>,
    mut requests: mpsc::Receiver<Outgoing>,
) {
    let subscriber_id = grant.subscriber_id.clone();
    let mut cursor: Option<i64> = None;
    let mut reconnect = Reconnect::default();
    loop {
        let hello = pb::Hello {
            client_name: "agent-host follow (interactive)".to_owned(),
            cursor,
            protocol_version: PROTOCOL_VERSION,
        };
        let (reason, up_for) =
            match client::connect(&grant.ws_endpoint, &grant.ws_token, hello).await {
                Ok((ws, _)) => {
                    if updates.send(Update::Connected).await.is_err() {
                        return;
                    }
                    let up = Instant::now();
                    let served = serve(
                        ws,
                        &ipc_path,
                        &mut cursor,
                        &updates,
                        &mut requests,
                        &mut reconnect,
                    )
                    .await;
                    match served {
                        Served::Closed => return,
                        Served::Lost(reason) => (reason, Some(up.elapsed())),
                    }
                }
                Err(ClientError::HelloRefused {
                    code,
                    name,
                    message,
                }) if name == "subscriber_not_found" => {
                    let reply = Reply {
                        code,
                        message,
                        data: json!({"error": name}),
                    };
                    let _gone = updates.send(Update::Fatal(reply)).await;
                    return;
                }
                Err(e) => (e.to_string(), None),
            };
        let retry = reconnect.delay_after(up_for);
        if updates.send(Update::Lost { reason, retry }).await.is_err() {
            return;
        }
        // Wait out the delay; commands meanwhile go over IPC.
        let wait = tokio::time::sleep(retry);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = &mut wait => break,
                request = requests.recv() => {
                    let Some(out) = request else { return };
                    let reply = ipc_call(&ipc_path, out.command, out.params).await;
                    if updates.send(Update::Reply { purpose: out.purpose, reply }).await.is_err() {
                        return;
                    }
                }
            }
        }
        // Tokens die with the host and after their TTL: a fresh one for each attempt.
        let fresh = ipc_call(
            &ipc_path,
            "subscriber.grant",
            json!({"subscriber_id": subscriber_id}),
        )
        .await;
        match fresh.error_code() {
            None if fresh.is_ok() => {
                if let Ok(g) = fresh.data_as::<Grant>() {
                    grant = g;
                }
            }
            Some(ErrorCode::SubscriberNotFound) => {
                let _gone = updates.send(Update::Fatal(fresh)).await;
                return;
            }
            _ => {} // the host is not back yet: keep trying
        }
    }
}

async fn serve(
    mut ws: WsClient,
    ipc_path: &std::path::Path,
    cursor: &mut Option<i64>,
    updates: &mpsc::Sender<Update>,
    requests: &mut mpsc::Receiver<Outgoing>,
    reconnect: &mut Reconnect,
) -> Served {
    let mut healthy = false;
    loop {
        tokio::select! {
            frame = ws.next_frame() => {
                let frame = match frame {
                    Ok(Some(frame)) => frame,
                    Ok(None) => {
                        let reason = ws.last_close.take().map_or(
                            "the host closed the connection".to_owned(),
                            |(code, why)| format!("the host closed the connection ({code} {why})"),
                        );
                        return Served::Lost(reason);
                    }
                    Err(e) => return Served::Lost(e.to_string()),
                };
                match frame.cmd {
                    CmdId::EventPush => {
                        let Some(push) = client::event_of(&frame) else { continue };
                        // A bad event is skipped (and its cursor still acknowledged).
                        if let Ok(event) = serde_json::from_str::<Value>(&push.event_json)
                            && updates.send(Update::Event(event)).await.is_err()
                        {
                            ws.close().await;
                            return Served::Closed;
                        }
                        if !healthy {
                            healthy = true;
                            reconnect.reset();
                        }
                        if !push.is_delta {
                            *cursor = Some(push.sequence_id);
                            if ws.ack(push.sequence_id).await.is_err() {
                                return Served::Lost(
                                    "the connection failed while acknowledging".to_owned(),
                                );
                            }
                        }
                    }
                    CmdId::ErrorResp => {
                        if let Ok(err) = frame.body::<pb::ErrorResp>() {
                            return Served::Lost(format!(
                                "the host sent {} ({})",
                                err.name, err.message
                            ));
                        }
                    }
                    _ => {}
                }
            }
            request = requests.recv() => {
                let Some(out) = request else {
                    ws.close().await;
                    return Served::Closed;
                };
                let over_wire = tokio::time::timeout(
                    IPC_TIMEOUT,
                    ws.request(out.command, out.params.clone()),
                )
                .await;
                let (reply, lost) = match over_wire {
                    Ok(Ok(reply)) => (reply, None),
                    // The wire refused the frame, or the connection failed under it: the same
                    // command over IPC, so a key press is not lost. Sent twice at worst, which
                    // the commands bear (a prompt's client_msg_id makes the second a
                    // duplicate; a second answer is already_resolved) — except a fork.
                    Ok(Err(e)) => {
                        let lost = !matches!(e, ClientError::RequestRefused(_));
                        let reply = if lost && out.command == "session.fork" {
                            Reply::error(
                                ErrorCode::HostNotRunning,
                                format!("the connection failed during the fork ({e}): check session.list before forking again"),
                                Value::Null,
                            )
                        } else {
                            ipc_call(ipc_path, out.command, out.params).await
                        };
                        (reply, lost.then(|| e.to_string()))
                    }
                    // No answer: the command may or may not have run; say so, and reconnect.
                    Err(_) => (
                        Reply::error(
                            ErrorCode::HostUnresponsive,
                            format!("no answer to {} within {IPC_TIMEOUT:?}", out.command),
                            Value::Null,
                        ),
                        Some("the host did not answer a request".to_owned()),
                    ),
                };
                if updates.send(Update::Reply { purpose: out.purpose, reply }).await.is_err() {
                    return Served::Closed;
                }
                if let Some(reason) = lost {
                    return Served::Lost(reason);
                }
            }
        }
    }
}
