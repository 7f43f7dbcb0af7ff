//! The interactive follower's connection: one task owns the WebSocket, reconnects it with its
//! cursor (a fresh grant each time, [`Reconnect`] between attempts), acknowledges brackets,
//! and runs the view's commands — over the connection while it is up (so the host knows the
//! answer came from this subscriber), over IPC while it is down or when the wire refuses one.
//!
//! Inputs: a closed message ([`Outgoing`]) on a bounded channel; outputs: [`Update`]s on a
//! bounded channel the terminal loop drains. Overload policy: the task awaits the loop (a slow
//! terminal back-pressures the socket, and the host drops deltas for a slow subscriber, never
//! brackets); the loop sends commands with `try_send` and says "busy" when the channel is full.

use std::collections::HashMap;
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
use crate::protocol::wire::{self, CmdId, Decoded, PROTOCOL_VERSION, pb};
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
        let (reason, up_for) = match client::connect_grant(&grant, hello).await {
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

/// Commands sent over the wire and not answered yet, at most (more wait in the channel, and
/// the terminal loop says "busy" once that is full too).
const MAX_IN_FLIGHT: usize = 8;

/// A command sent over the wire, waiting for the reply with its request id.
struct InFlight {
    out: Outgoing,
    deadline: Instant,
}

/// The reply frame to a request, as a `Reply`.
fn reply_of(frame: &Decoded) -> Reply {
    let decoded = frame
        .body::<pb::Reply>()
        .map_err(|e| e.to_string())
        .and_then(|reply| {
            let data = if reply.data_json.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&reply.data_json).map_err(|e| format!("data_json: {e}"))?
            };
            Ok(Reply {
                code: reply.code,
                message: reply.message,
                data,
            })
        });
    decoded.unwrap_or_else(|e| {
        Reply::error(
            ErrorCode::Internal,
            format!("the host's reply does not decode: {e}"),
            Value::Null,
        )
    })
}

/// A command the wire did not answer: run it over IPC instead, so a key press is not lost,
/// in its own task so the stream goes on meanwhile. Sent twice at worst, which the commands
/// bear (a prompt's client_msg_id makes the second a duplicate; a second answer is
/// already_resolved) — except a fork, which is reported instead when the connection failed
/// under it (`failed`: why).
fn over_ipc(
    ipc_path: &std::path::Path,
    out: Outgoing,
    failed: Option<&str>,
    updates: &mpsc::Sender<Update>,
) {
    let updates = updates.clone();
    let ipc_path = ipc_path.to_owned();
    let fork_lost = failed
        .filter(|_| out.command == "session.fork")
        .map(|why| {
            Reply::error(
                ErrorCode::HostNotRunning,
                format!("the connection failed during the fork ({why}): check session.list before forking again"),
                Value::Null,
            )
        });
    tokio::spawn(async move {
        let reply = match fork_lost {
            Some(reply) => reply,
            None => ipc_call(&ipc_path, out.command, out.params).await,
        };
        let _loop_gone = updates
            .send(Update::Reply {
                purpose: out.purpose,
                reply,
            })
            .await;
    });
}

/// Serve one connection: events to the loop as they come, commands sent as they come and
/// their replies matched by request id — a command waiting for its reply never holds up the
/// stream or the next command.
async fn serve(
    mut ws: WsClient,
    ipc_path: &std::path::Path,
    cursor: &mut Option<i64>,
    updates: &mpsc::Sender<Update>,
    requests: &mut mpsc::Receiver<Outgoing>,
    reconnect: &mut Reconnect,
) -> Served {
    let mut healthy = false;
    let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
    let reason = loop {
        let next_deadline = in_flight.values().map(|f| f.deadline).min();
        tokio::select! {
            frame = ws.next_frame() => {
                let frame = match frame {
                    Ok(Some(frame)) => frame,
                    Ok(None) => {
                        break ws.last_close.take().map_or(
                            "the host closed the connection".to_owned(),
                            |(code, why)| format!("the host closed the connection ({code} {why})"),
                        );
                    }
                    Err(e) => break e.to_string(),
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
                                break "the connection failed while acknowledging".to_owned();
                            }
                        }
                    }
                    CmdId::Reply => {
                        if let Some(done) = in_flight.remove(&frame.request_id) {
                            let reply = reply_of(&frame);
                            let update = Update::Reply { purpose: done.out.purpose, reply };
                            if updates.send(update).await.is_err() {
                                ws.close().await;
                                return Served::Closed;
                            }
                        }
                    }
                    CmdId::ErrorResp => {
                        if let Some(refused) = in_flight.remove(&frame.request_id) {
                            // The wire refused the frame: the same command over IPC.
                            over_ipc(ipc_path, refused.out, None, updates);
                        } else if let Ok(err) = frame.body::<pb::ErrorResp>() {
                            break format!("the host sent {} ({})", err.name, err.message);
                        }
                    }
                    _ => {}
                }
            }
            request = requests.recv(), if in_flight.len() < MAX_IN_FLIGHT => {
                let Some(out) = request else {
                    ws.close().await;
                    return Served::Closed;
                };
                let frame = wire::request(out.command, &out.params);
                match ws.send(CmdId::Request, &frame).await {
                    Ok(id) => {
                        let deadline = Instant::now() + IPC_TIMEOUT;
                        in_flight.insert(id, InFlight { out, deadline });
                    }
                    Err(e) => {
                        let why = e.to_string();
                        over_ipc(ipc_path, out, Some(&why), updates);
                        break why;
                    }
                }
            }
            () = tokio::time::sleep_until(next_deadline.unwrap_or_else(Instant::now)),
                if next_deadline.is_some() =>
            {
                // No answer in time: the command may or may not have run; say so, and
                // reconnect (the others still waiting go over IPC below).
                let now = Instant::now();
                let expired: Vec<u64> = in_flight
                    .iter()
                    .filter(|(_, f)| f.deadline <= now)
                    .map(|(id, _)| *id)
                    .collect();
                for id in expired {
                    if let Some(late) = in_flight.remove(&id) {
                        let reply = Reply::error(
                            ErrorCode::HostUnresponsive,
                            format!("no answer to {} within {IPC_TIMEOUT:?}", late.out.command),
                            Value::Null,
                        );
                        let update = Update::Reply { purpose: late.out.purpose, reply };
                        if updates.send(update).await.is_err() {
                            return Served::Closed;
                        }
                    }
                }
                break "the host did not answer a request".to_owned();
            }
        }
    };
    // The connection failed under the commands still waiting: over IPC (a fork: reported).
    for (_, waiting) in in_flight.drain() {
        over_ipc(ipc_path, waiting.out, Some(&reason), updates);
    }
    Served::Lost(reason)
}
