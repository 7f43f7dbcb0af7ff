//! Issue 17, acceptance 1 (and the unsupported half of 3), with the real `claude` CLI against
//! the project's mock model, inside a loopback-only network namespace: three prompts queued
//! behind a slow turn; one edited, one moved to the front, one removed, each change seen by two
//! WebSocket subscribers as a `queue.changed`; a steer Claude cannot take goes to the head of
//! the queue with `steer_unsupported` (and is taken out again); the host restarts with two
//! still queued; after it both run in order — the mock model answers the edited text — and both
//! subscribers, reconnected with their cursors, saw the queue given back and each dispatch.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use common::TestHost;
use common::world::{
    Family, Follower, TURN, World, connect_follower, in_netns, run_end, text_of_run,
};
use serde_json::{Value, json};

/// The queue of a `queue.changed` (or of `session.get`): run ids and texts.
fn queue_of(items: &Value) -> Queue {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            let id = q.get("runId").or_else(|| q.get("run_id")).unwrap();
            (
                id.as_str().unwrap().to_owned(),
                q["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// A queue as (run id, text), head first.
type Queue = Vec<(String, String)>;

/// Every `queue.changed` a follower saw: (reason, runId, queue).
fn changes(f: &Follower) -> Vec<(String, String, Queue)> {
    f.seen
        .iter()
        .filter(|s| s.kind() == "queue.changed")
        .map(|s| {
            (
                s.event["reason"].as_str().unwrap().to_owned(),
                s.run_id.clone(),
                queue_of(&s.event["queue"]),
            )
        })
        .collect()
}

/// Wait until the follower has seen `n` `queue.changed`.
async fn until_changes(f: &mut Follower, n: usize) {
    while changes(f).len() < n {
        f.until_kind("queue.changed", TURN).await;
    }
}

/// The same subscriber again, on the (restarted) host, from the last bracket it saw.
async fn reconnect(host: &TestHost, f: &mut Follower) {
    let grant = host
        .ok(
            "subscriber.grant",
            json!({"subscriber_id": f.subscriber_id}),
        )
        .await;
    let cursor = f.seen.iter().filter(|s| !s.delta).map(|s| s.seq).max();
    f.ws = connect_follower(&grant, "turn-queue-test", cursor).await.ws;
}

#[test]
fn a_queue_edited_moved_and_removed_survives_a_restart_and_runs_in_order() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_queue_edited_moved_and_removed_survives_a_restart_and_runs_in_order",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut plain = world.follower(&session, false).await;
        let mut deltas = world.follower(&session, true).await;
        let slow = world.streaming(&mut deltas, &session, "long turn").await;

        let a = world.send(&session, "queued alpha").await;
        let b = world.send(&session, "queued bravo").await;
        let c = world.send(&session, "queued charlie").await;
        let host = world.host();
        // Edited over IPC, moved and removed over a WebSocket.
        let edited = host
            .ok(
                "queue.edit",
                json!({"session_id": session, "run_id": b, "text": "queued bravo, edited"}),
            )
            .await;
        assert_eq!(edited, json!({"run_id": b, "text": "queued bravo, edited"}));
        let moved = plain
            .ok(
                "queue.move",
                json!({"session_id": session, "run_id": c, "position": 0}),
            )
            .await;
        assert_eq!(
            queue_of(&moved["queue"]),
            pairs(&[
                (&c, "queued charlie"),
                (&a, "queued alpha"),
                (&b, "queued bravo, edited")
            ])
        );
        let removed = deltas
            .ok("queue.remove", json!({"session_id": session, "run_id": a}))
            .await;
        assert_eq!(removed, json!({"run_id": a, "state": "cancelled"}));
        // What is not queued is refused, and says so.
        plain
            .refused(
                "queue.edit",
                json!({"session_id": session, "run_id": slow, "text": "too late"}),
                3006,
                "not_queued",
            )
            .await;
        plain
            .refused(
                "queue.remove",
                json!({"session_id": session, "run_id": a}),
                3006,
                "not_queued",
            )
            .await;

        // A steer: Claude's descriptor says whether it takes input mid-turn.
        let agents = host.ok("agent.list", json!({})).await;
        let claude = agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["agent_type"] == "claude")
            .unwrap()
            .clone();
        let steers = claude["capabilities"]["steer"] == true;
        let steer = plain
            .ok(
                "session.steer",
                json!({"session_id": session, "text": "a steer note"}),
            )
            .await;
        let mut expected = vec![
            ("added", a.clone()),
            ("added", b.clone()),
            ("added", c.clone()),
            ("edited", b.clone()),
            ("moved", c.clone()),
            ("removed", a.clone()),
        ];
        if steers {
            assert_eq!(steer["steered"], true, "{steer}");
            assert_eq!(steer["run_id"], slow.as_str());
            plain
                .until("the steer's user.text", TURN, |s| {
                    s.kind() == "user.text" && s.event["steer"] == true
                })
                .await;
        } else {
            assert_eq!(
                (&steer["steered"], &steer["queued"]),
                (&json!(false), &json!(true)),
                "{steer}"
            );
            let s = steer["run_id"].as_str().unwrap().to_owned();
            let warning = plain
                .until("steer_unsupported", TURN, |e| {
                    e.kind() == "warning" && e.event["code"] == "steer_unsupported"
                })
                .await;
            assert_eq!(warning.run_id, s);
            let queue = host.ok("session.get", json!({"session_id": session})).await;
            assert_eq!(
                queue_of(&queue["queue"]),
                pairs(&[
                    (&s, "a steer note"),
                    (&c, "queued charlie"),
                    (&b, "queued bravo, edited")
                ]),
                "the steer waits at the head"
            );
            host.ok("queue.remove", json!({"session_id": session, "run_id": s}))
                .await;
            expected.push(("steered", s.clone()));
            expected.push(("removed", s));
        }

        // Both subscribers saw every change, with the whole queue each time.
        for f in [&mut plain, &mut deltas] {
            until_changes(f, expected.len()).await;
            let seen: Vec<(String, String)> = changes(f)
                .into_iter()
                .map(|(reason, run, _)| (reason, run))
                .collect();
            let want: Vec<(String, String)> = expected
                .iter()
                .map(|(r, id)| ((*r).to_owned(), id.clone()))
                .collect();
            assert_eq!(seen, want);
            let (_, _, last) = changes(f).pop().unwrap();
            assert_eq!(
                last,
                pairs(&[(&c, "queued charlie"), (&b, "queued bravo, edited")])
            );
        }
        let row = host.ok("session.get", json!({"session_id": session})).await;
        assert_eq!(
            queue_of(&row["queue"]),
            pairs(&[(&c, "queued charlie"), (&b, "queued bravo, edited")])
        );

        // The host restarts with two prompts queued (the slow turn is cut by the stop).
        world.restart().await;
        let host = world.host();
        reconnect(host, &mut plain).await;
        reconnect(host, &mut deltas).await;
        for f in [&mut plain, &mut deltas] {
            run_end(f, &c, TURN).await;
            run_end(f, &b, TURN).await;
            let end = f
                .seen
                .iter()
                .find(|s| s.kind() == "run.end" && s.run_id == slow)
                .expect("the slow run's end")
                .event
                .clone();
            assert_eq!(end["state"], "interrupted", "{end}");
            // Given back, then each dispatched after its run.start.
            let after: Vec<(String, String)> = changes(f)
                .into_iter()
                .skip(expected.len())
                .map(|(reason, run, _)| (reason, run))
                .collect();
            assert_eq!(
                after,
                [
                    ("restored".to_owned(), String::new()),
                    ("dispatched".to_owned(), c.clone()),
                    ("dispatched".to_owned(), b.clone()),
                ]
            );
            let restored = changes(f)[expected.len()].2.clone();
            assert_eq!(
                restored,
                pairs(&[(&c, "queued charlie"), (&b, "queued bravo, edited")])
            );
            // Old run.end → new user.text → new run.start, in the queue's order.
            let lifecycle: Vec<(String, String)> = f
                .seen
                .iter()
                .filter(|s| matches!(s.kind(), "user.text" | "run.start" | "run.end"))
                .filter(|s| s.run_id == c || s.run_id == b)
                .map(|s| (s.run_id.clone(), s.kind().to_owned()))
                .collect();
            let mut want = Vec::new();
            for run in [&c, &b] {
                for kind in ["user.text", "run.start", "run.end"] {
                    want.push((run.clone(), kind.to_owned()));
                }
            }
            assert_eq!(lifecycle, want);
            let user = f
                .seen
                .iter()
                .find(|s| s.kind() == "user.text" && s.run_id == b)
                .unwrap();
            assert_eq!(user.event["text"], "queued bravo, edited");
        }
        // The mock model was given the edited text.
        let answer = text_of_run(&plain, &b);
        assert!(answer.starts_with("echo: queued bravo, edited"), "{answer}");
        assert!(
            text_of_run(&plain, &c).starts_with("echo: queued charlie"),
            "{}",
            text_of_run(&plain, &c)
        );
        assert!(
            !plain
                .seen
                .iter()
                .any(|s| s.run_id == a && s.kind() == "user.text"),
            "the removed prompt never ran"
        );
        let row = host.ok("session.get", json!({"session_id": session})).await;
        assert_eq!(row["queue"], json!([]));
        let runs = host
            .ok("session.runs", json!({"session_id": session}))
            .await;
        let state_of = |id: &str| {
            runs["runs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["run_id"] == id)
                .unwrap()["state"]
                .clone()
        };
        assert_eq!(state_of(&a), "cancelled");
        assert_eq!(state_of(&b), "completed");
        assert_eq!(state_of(&c), "completed");
        world.host.take().unwrap().stop().await;
    });
}

/// The `agent-host` binary, run as a user runs it (a detached host), so that it can be killed.
const BIN: &str = env!("CARGO_BIN_EXE_agent-host");

/// One CLI command against `home`, with the agents' environment; its reply's data (code 0).
fn cli(home: &std::path::Path, env: &[(String, String)], args: &[&str]) -> Value {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("AGENT_HOST_HOME", home)
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(reply["code"], 0, "{args:?}: {reply}");
    reply["data"].clone()
}

/// A subscriber of `session` over the loopback WebSocket, from `cursor`.
async fn subscribe(
    home: &std::path::Path,
    env: &[(String, String)],
    subscriber_id: Option<&str>,
    session: &str,
    cursor: Option<i64>,
) -> Follower {
    let grant = match subscriber_id {
        None => cli(
            home,
            env,
            &[
                "subscriber.add",
                &json!({"type": "local", "session_id": session, "replay_mode": "since_cursor"})
                    .to_string(),
            ],
        ),
        Some(id) => cli(
            home,
            env,
            &[
                "subscriber.grant",
                &json!({"subscriber_id": id}).to_string(),
            ],
        ),
    };
    connect_follower(&grant, "turn-queue-test", cursor).await
}

/// A host killed with SIGKILL during a slow turn with two prompts queued: the next host ends
/// the cut run `interrupted` and runs the queue in its order, and the subscriber, reconnected
/// from its cursor, sees the queue given back.
#[test]
fn a_killed_hosts_queue_runs_after_the_next_start() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_killed_hosts_queue_runs_after_the_next_start",
    ) else {
        return;
    };
    rt.block_on(async {
        let mock = common::mock_model::MockModel::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let agent_home = dir.path().join("agent-home");
        let work = dir.path().join("work");
        let home = dir.path().join("host");
        for d in [&agent_home, &work, &home] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(
            home.join("config.toml"),
            format!(
                "[agents.claude]\nbinary = \"{}\"\n",
                Family::Claude.binary().display()
            ),
        )
        .unwrap();
        let env = common::agents::agent_env(&agent_home, &mock);
        let started = cli(&home, &env, &["host.start"]);
        let pid = started["pid"].as_i64().unwrap();
        let created = cli(
            &home,
            &env,
            &[
                "session.create",
                &json!({"agent_type": "claude", "cwd": work.display().to_string()}).to_string(),
            ],
        );
        let session = created["session_id"].as_str().unwrap().to_owned();
        let mut f = subscribe(&home, &env, None, &session, None).await;
        let send = |text: &str| {
            cli(
                &home,
                &env,
                &[
                    "session.send",
                    &json!({"session_id": session, "text": text}).to_string(),
                ],
            )["run_id"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        let slow = send("SLOW cut by a kill");
        let first = send("after the kill, first");
        let second = send("after the kill, second");
        let id = slow.clone();
        f.until("the slow run's text", TURN, |s| {
            s.kind() == "text.start" && s.run_id == id
        })
        .await;
        until_changes(&mut f, 2).await;

        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        // The connection ends with its host.
        while let Ok(Some(_)) = tokio::time::timeout(TURN, f.ws.next_frame())
            .await
            .expect("the connection outlived its host")
        {}

        let again = cli(&home, &env, &["host.start"]);
        assert_ne!(again["pid"].as_i64(), Some(pid));
        let cursor = f.seen.iter().filter(|s| !s.delta).map(|s| s.seq).max();
        let id = f.subscriber_id.clone();
        let seen = std::mem::take(&mut f.seen);
        f = subscribe(&home, &env, Some(&id), &session, cursor).await;
        f.seen = seen;
        run_end(&mut f, &first, TURN).await;
        run_end(&mut f, &second, TURN).await;
        let cut = f
            .seen
            .iter()
            .find(|s| s.kind() == "run.end" && s.run_id == slow)
            .expect("the cut run's end")
            .event
            .clone();
        assert_eq!(cut["state"], "interrupted", "{cut}");
        let reasons: Vec<(String, String)> = changes(&f)
            .into_iter()
            .map(|(reason, run, _)| (reason, run))
            .collect();
        assert_eq!(
            reasons,
            [
                ("added".to_owned(), first.clone()),
                ("added".to_owned(), second.clone()),
                ("restored".to_owned(), String::new()),
                ("dispatched".to_owned(), first.clone()),
                ("dispatched".to_owned(), second.clone()),
            ]
        );
        // The cut run ended before the queue went on.
        let order: Vec<(String, String)> = f
            .seen
            .iter()
            .filter(|s| matches!(s.kind(), "user.text" | "run.start" | "run.end"))
            .map(|s| (s.run_id.clone(), s.kind().to_owned()))
            .collect();
        let mut want = vec![
            (slow.clone(), "user.text".to_owned()),
            (slow.clone(), "run.start".to_owned()),
            (slow.clone(), "run.end".to_owned()),
        ];
        for run in [&first, &second] {
            for kind in ["user.text", "run.start", "run.end"] {
                want.push((run.clone(), kind.to_owned()));
            }
        }
        assert_eq!(order, want);
        assert!(text_of_run(&f, &first).starts_with("echo: after the kill, first"));
        assert!(text_of_run(&f, &second).starts_with("echo: after the kill, second"));
        cli(&home, &env, &["host.shutdown"]);
    });
}
