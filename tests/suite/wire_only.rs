//! Issue 14, acceptance 2: over the wire alone — no IPC after the grant — a client creates a
//! session, prompts it, answers its permission request, renames it, forks it, lists the
//! pending permissions, pages `session.list` and deletes both sessions, with the real `claude`
//! against the project's mock model (inside a loopback-only network namespace).
//!
//! IPC is used once, to mint the grant (`subscriber.add`); the host's socket is then moved
//! aside for the rest of the test, so a command that went over IPC by mistake would fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use agent_host::protocol::envelope::Reply;
use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::ws::client::{self, WsClient};
use common::WAIT;
use common::world::{Family, TURN, World, in_netns};
use serde_json::{Value, json};

/// One event the connection was pushed.
#[derive(Debug, Clone)]
struct Pushed {
    session_id: String,
    run_id: String,
    event: Value,
}

impl Pushed {
    fn kind(&self) -> &str {
        self.event["k"].as_str().unwrap_or_default()
    }
}

/// The one WebSocket connection the test drives everything through, and what it was pushed.
struct Wire {
    ws: WsClient,
    seen: Vec<Pushed>,
}

impl Wire {
    /// One envelope command as a `Request` frame; its `Reply`. Events that come meanwhile are
    /// kept by the client and recorded by the next [`Wire::until`].
    async fn request(&mut self, command: &str, params: Value) -> Reply {
        tokio::time::timeout(WAIT, self.ws.request(command, params))
            .await
            .unwrap_or_else(|_| panic!("no reply to {command} in {WAIT:?}"))
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    }

    /// A command that must succeed: its data.
    async fn ok(&mut self, command: &str, params: Value) -> Value {
        let reply = self.request(command, params).await;
        assert_eq!(reply.code, 0, "{command}: {}", reply.to_line());
        assert_eq!(reply.message, "ok", "{command}: {}", reply.to_line());
        reply.data
    }

    /// Events until one matches `pred`, within a turn's time; that one.
    async fn until(&mut self, what: &str, pred: impl Fn(&Pushed) -> bool) -> Pushed {
        let deadline = tokio::time::Instant::now() + TURN;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.ws.next_frame())
                .await
                .unwrap_or_else(|_| panic!("no {what} in {TURN:?}; saw {:?}", self.kinds()))
                .unwrap()
                .unwrap_or_else(|| panic!("connection closed waiting for {what}"));
            let Some(push) = client::event_of(&frame) else {
                continue;
            };
            let pushed = Pushed {
                session_id: push.session_id,
                run_id: push.run_id,
                event: serde_json::from_str(&push.event_json).unwrap(),
            };
            self.seen.push(pushed.clone());
            if pred(&pushed) {
                return pushed;
            }
        }
    }

    /// The first event seen so far that matches `pred`, or else the next one to come.
    async fn seen_or_until(&mut self, what: &str, pred: impl Fn(&Pushed) -> bool) -> Pushed {
        match self.seen.iter().find(|p| pred(p)) {
            Some(p) => p.clone(),
            None => self.until(what, pred).await,
        }
    }

    /// The (first) `session.state` of `session` into `state`, seen already or to come.
    async fn state_becomes(&mut self, session: &str, state: &str) -> Pushed {
        self.seen_or_until(&format!("session.state {state}"), |p| {
            p.session_id == session && p.kind() == "session.state" && p.event["state"] == state
        })
        .await
    }

    fn kinds(&self) -> Vec<String> {
        self.seen.iter().map(|p| p.kind().to_owned()).collect()
    }

    /// `session.state` transitions of `session` seen so far, as `state<-previous`.
    fn transitions(&self, session: &str) -> Vec<String> {
        self.seen
            .iter()
            .filter(|p| p.session_id == session && p.kind() == "session.state")
            .map(|p| {
                format!(
                    "{}<-{}",
                    p.event["state"].as_str().unwrap(),
                    p.event["previous"].as_str().unwrap()
                )
            })
            .collect()
    }
}

fn str_of<'a>(value: &'a Value, field: &str) -> &'a str {
    value[field]
        .as_str()
        .unwrap_or_else(|| panic!("no string {field} in {value}"))
}

#[test]
fn a_wire_client_alone_drives_a_claude_session_end_to_end() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_wire_client_alone_drives_a_claude_session_end_to_end",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let cwd = world.work.display().to_string();

        // The grant: the one IPC request. A subscriber of every session, events from now on.
        let grant = world
            .host()
            .ok(
                "subscriber.add",
                json!({"type": "local", "replay_mode": "none"}),
            )
            .await;
        let subscriber_id = str_of(&grant, "subscriber_id").to_owned();
        let hello = pb::Hello {
            client_name: "wire-only-test".into(),
            cursor: None,
            protocol_version: PROTOCOL_VERSION,
        };
        let (ws, _) = client::connect(
            str_of(&grant, "ws_endpoint"),
            str_of(&grant, "ws_token"),
            hello,
        )
        .await
        .unwrap();
        let mut wire = Wire {
            ws,
            seen: Vec::new(),
        };

        // From here on IPC is out of reach: the socket is moved aside until the host stops.
        let sock = world.host().home.join("host.sock");
        let aside = world.host().home.join("host.sock.aside");
        std::fs::rename(&sock, &aside).unwrap();
        assert!(ipc_fails(&sock).await, "IPC still answers");

        // Create.
        let created = wire
            .ok(
                "session.create",
                json!({"agent_type": "claude", "cwd": cwd, "title": "wire only"}),
            )
            .await;
        let session = str_of(&created, "session_id").to_owned();
        assert_eq!(created["session"]["session_id"], session.as_str());
        assert_eq!(created["session"]["agent_type"], "claude");
        assert_eq!(created["session"]["cwd"], cwd.as_str());
        assert_eq!(created["session"]["title"], "wire only");
        assert_eq!(created["session"]["state"], "idle");
        let row = wire.ok("session.get", json!({"session_id": session})).await;
        assert_eq!(row["state"], "idle", "{row}");
        assert_eq!(row["live"], Value::Null, "{row}");

        // Activate: the agent starts before the first prompt.
        let activated = wire
            .ok("session.activate", json!({"session_id": session}))
            .await;
        assert_eq!(activated["session_id"], session.as_str(), "{activated}");
        assert_eq!(activated["already"], false, "{activated}");
        assert!(activated["agent_pid"].as_u64().is_some(), "{activated}");

        // Prompt: the mock model asks for a Bash call, which needs permission.
        let sent = wire
            .ok(
                "session.send",
                json!({"session_id": session,
                       "text": "TOOLCALL `touch wired && echo wired-out`"}),
            )
            .await;
        let run = str_of(&sent, "run_id").to_owned();
        assert_eq!(sent["queued"], false, "{sent}");
        assert_eq!(sent["duplicate"], false, "{sent}");

        let request = wire
            .until("permission.request", |p| {
                p.session_id == session && p.kind() == "permission.request"
            })
            .await;
        assert_eq!(request.run_id, run);
        assert_eq!(request.event["tool"], "Bash", "{}", request.event);
        let request_id = str_of(&request.event, "requestId").to_owned();
        let waiting = wire.state_becomes(&session, "waiting").await;
        assert_eq!(waiting.event["previous"], "running", "{}", waiting.event);
        assert_eq!(waiting.event["runId"], run.as_str(), "{}", waiting.event);

        // The pending request, as permission.list shows it, of this session and of all.
        let listed = wire
            .ok("permission.list", json!({"session_id": session}))
            .await;
        let pending = listed["permissions"].as_array().unwrap();
        assert_eq!(pending.len(), 1, "{listed}");
        let p = &pending[0];
        assert_eq!(p["session_id"], session.as_str(), "{p}");
        assert_eq!(p["request_id"], request_id.as_str(), "{p}");
        assert_eq!(p["run_id"], run.as_str(), "{p}");
        assert_eq!(p["tool"], "Bash", "{p}");
        assert_eq!(p["input"], request.event["input"], "{p}");
        assert!(
            str_of(&p["input"], "command").contains("touch wired"),
            "{p}"
        );
        // Claude's own choices: allow, allow always (its suggestions), deny.
        let kinds: Vec<&str> = p["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["allow_once", "allow_always", "reject_once"], "{p}");
        assert_eq!(p["options"], request.event["options"], "{p}");
        assert!(p["created_at_ms"].as_i64().unwrap() > 0, "{p}");
        let all = wire.ok("permission.list", json!({})).await;
        assert_eq!(all, listed);

        // The session is waiting for a person, in its row and in the list.
        let row = wire.ok("session.get", json!({"session_id": session})).await;
        assert_eq!(row["state"], "waiting", "{row}");
        assert_eq!(row["live"]["run_id"], run.as_str(), "{row}");
        let waiting_list = wire.ok("session.list", json!({"state": "waiting"})).await;
        let ids: Vec<&str> = waiting_list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| str_of(s, "session_id"))
            .collect();
        assert_eq!(ids, [session.as_str()], "{waiting_list}");
        assert_eq!(waiting_list["sessions"][0]["state"], "waiting");
        assert_eq!(waiting_list["next_cursor"], Value::Null);

        // Allow it: the tool runs and the run completes; the session goes back to idle.
        let receipt = wire
            .ok(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "allow"}),
            )
            .await;
        assert_eq!(receipt["decision"], "allow", "{receipt}");
        let end = wire
            .until("run.end", |p| p.kind() == "run.end" && p.run_id == run)
            .await;
        assert_eq!(end.event["state"], "completed", "{}", end.event);
        wire.state_becomes(&session, "idle").await;
        let resolved = wire
            .seen
            .iter()
            .find(|p| p.kind() == "permission.resolved")
            .expect("no permission.resolved");
        assert_eq!(resolved.event["requestId"], request_id.as_str());
        assert_eq!(resolved.event["decision"], "allow");
        assert_eq!(resolved.event["by"], subscriber_id.as_str());
        let exec = wire
            .seen
            .iter()
            .find(|p| p.kind() == "tool.exec.end" && p.run_id == run)
            .expect("no tool.exec.end");
        assert_eq!(exec.event["output"], "wired-out", "{}", exec.event);
        assert!(world.work.join("wired").exists());
        assert!(
            wire.seen
                .iter()
                .any(|p| p.kind() == "text.end" && p.run_id == run),
            "the turn went on after the answer: {:?}",
            wire.kinds()
        );
        assert_eq!(
            wire.transitions(&session),
            [
                "running<-idle",
                "waiting<-running",
                "running<-waiting",
                "idle<-running"
            ]
        );
        let row = wire.ok("session.get", json!({"session_id": session})).await;
        assert_eq!(row["state"], "idle", "{row}");
        assert!(row["native_session_id"].as_str().is_some(), "{row}");
        let none = wire
            .ok("permission.list", json!({"session_id": session}))
            .await;
        assert_eq!(none["permissions"], json!([]), "{none}");
        // A second answer is refused, saying who answered first.
        let late = wire
            .request(
                "permission.respond",
                json!({"session_id": session, "request_id": request_id, "decision": "deny"}),
            )
            .await;
        assert_eq!(
            (late.code, late.data["error"].as_str()),
            (3005, Some("already_resolved")),
            "{}",
            late.to_line()
        );
        assert_eq!(late.data["by"], subscriber_id.as_str());

        // Rename.
        let renamed = wire
            .ok(
                "session.rename",
                json!({"session_id": session, "title": "wire only, renamed"}),
            )
            .await;
        assert_eq!(renamed["session"]["session_id"], session.as_str());
        assert_eq!(renamed["session"]["title"], "wire only, renamed");
        let row = wire.ok("session.get", json!({"session_id": session})).await;
        assert_eq!(row["title"], "wire only, renamed", "{row}");

        // Fork: a child continuing the conversation; it keeps the (new) title.
        let forked = wire
            .ok("session.fork", json!({"session_id": session}))
            .await;
        let child = str_of(&forked, "session_id").to_owned();
        assert_ne!(child, session);
        assert_eq!(forked["parent_session_id"], session.as_str(), "{forked}");
        assert_eq!(forked["session"]["parent_session_id"], session.as_str());
        assert_eq!(forked["session"]["title"], "wire only, renamed");
        assert_eq!(forked["session"]["agent_type"], "claude");
        assert_eq!(forked["session"]["cwd"], cwd.as_str());
        for on in [&session, &child] {
            let told = wire
                .seen_or_until("session.forked", |p| {
                    p.session_id == *on
                        && p.kind() == "session.forked"
                        && p.event["childSessionId"] == child.as_str()
                })
                .await;
            assert_eq!(told.event["parentSessionId"], session.as_str());
        }
        let child_row = wire.ok("session.get", json!({"session_id": child})).await;
        assert_eq!(child_row["parent_session_id"], session.as_str());
        assert_eq!(child_row["state"], "idle");

        // Page the list one by one: both sessions, each exactly once, then the end.
        let mut visited = Vec::new();
        let mut cursor: Option<String> = None;
        for page_no in 0.. {
            assert!(page_no < 4, "the list does not end: {visited:?}");
            let mut params = json!({"limit": 1});
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let page = wire.ok("session.list", params).await;
            let rows = page["sessions"].as_array().unwrap();
            assert!(rows.len() <= 1, "{page}");
            for row in rows {
                visited.push(str_of(row, "session_id").to_owned());
                assert!(row["last_activity_ms"].as_i64().is_some(), "{row}");
                assert_eq!(row["title"], "wire only, renamed", "{row}");
            }
            match page["next_cursor"].as_str() {
                Some(next) => {
                    assert_eq!(rows.len(), 1, "a cursor after an empty page: {page}");
                    cursor = Some(next.to_owned());
                }
                None => {
                    assert_eq!(page["next_cursor"], Value::Null, "{page}");
                    break;
                }
            }
        }
        assert_eq!(visited.len(), 2, "{visited:?}");
        assert_eq!(
            visited.iter().cloned().collect::<BTreeSet<_>>(),
            [session.clone(), child.clone()].into_iter().collect(),
            "{visited:?}"
        );
        // One page without a limit holds both; the parent's preview is from its turn.
        let whole = wire.ok("session.list", json!({})).await;
        let rows = whole["sessions"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{whole}");
        assert_eq!(whole["next_cursor"], Value::Null, "{whole}");
        let parent_row = rows.iter().find(|r| r["session_id"] == session.as_str());
        assert!(parent_row.unwrap()["preview"].as_str().is_some(), "{whole}");

        // Delete both; each is gone afterwards.
        for id in [&child, &session] {
            let deleted = wire.ok("session.delete", json!({"session_id": id})).await;
            assert_eq!(deleted["deleted"], id.as_str(), "{deleted}");
            let gone = wire.request("session.get", json!({"session_id": id})).await;
            assert_eq!(
                (gone.code, gone.data["error"].as_str()),
                (3001, Some("session_not_found")),
                "{}",
                gone.to_line()
            );
        }
        let empty = wire.ok("session.list", json!({"limit": 1})).await;
        assert_eq!(empty, json!({"sessions": [], "next_cursor": null}));
        let again = wire
            .request("session.delete", json!({"session_id": session}))
            .await;
        assert_eq!(again.code, 3001, "{}", again.to_line());

        // Nothing went over IPC meanwhile: the socket was never there.
        assert!(ipc_fails(&sock).await, "IPC answered");
        wire.ws.close().await;
        std::fs::rename(&aside, &sock).unwrap();
        world.host.unwrap().stop().await;
    });
}

/// Whether an IPC request to `sock` fails to reach a host.
async fn ipc_fails(sock: &Path) -> bool {
    agent_host::ipc::request(sock, &json!({"command": "host.status", "params": {}}), WAIT)
        .await
        .is_err()
}
