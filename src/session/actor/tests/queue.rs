//! The follow-up queue as users drive it — seen (`session.get`'s queue, a `queue.changed` per
//! change), edited, moved, removed, cleared, over its capacity — and kept across a host's
//! restart (a graceful stop, and the rows a crash leaves, on a real SQLite file); and
//! `session.steer` into a turn that can take it, and to one that cannot.

use super::*;
use crate::protocol::events::{Event, UserText};
use crate::protocol::replies::QueueEntry;
use crate::protocol::states::RunStatus;
use crate::store::RunRow;

/// The next prompt: its run id and text.
async fn prompt_text(agent: &mut Agent) -> (String, String) {
    match agent.input().await {
        AgentInput::Prompt { text, id, .. } => (id, text),
        other => panic!("expected a prompt, got {other:?}"),
    }
}

fn texts(queue: &[QueueEntry]) -> Vec<&str> {
    queue.iter().map(|q| q.text.as_str()).collect()
}

fn ids(queue: &[QueueEntry]) -> Vec<&str> {
    queue.iter().map(|q| q.run_id.as_str()).collect()
}

/// The `queue` of a `queue.changed`: run ids and texts.
fn event_queue(event: &Value) -> Vec<(String, String)> {
    event["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["runId"].as_str().unwrap().to_owned(),
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

/// A queue seen, edited, moved (clamped past its end), a prompt removed; what is not queued is
/// refused `not_queued` (a run in progress, a removed one), an unknown run `run_not_found`;
/// the queue then runs in its order, the edited text is what the agent gets, and each
/// dispatch's `queue.changed` follows its `run.start`.
#[tokio::test]
async fn the_queue_is_shown_edited_moved_and_removed_and_runs_in_its_order() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let r1 = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let a = world.send(&sid, "two").await.run_id;
    let b = world.send(&sid, "three").await.run_id;
    let c = world.send(&sid, "four").await.run_id;
    let added = bus.until("queue added").await;
    assert_eq!(added["runId"], a.as_str());
    assert_eq!(event_queue(&added), pairs(&[(&a, "two")]));
    let queue = world.sessions.queue(&sid).await.unwrap();
    assert_eq!(texts(&queue), ["two", "three", "four"]);

    let edited = world
        .sessions
        .queue_edit(&sid, b.clone(), "three, edited".into())
        .await
        .unwrap();
    assert_eq!(
        (edited.run_id.as_str(), edited.text.as_str()),
        (b.as_str(), "three, edited")
    );
    let event = bus.until("queue edited").await;
    assert_eq!(event["runId"], b.as_str());
    assert_eq!(
        event_queue(&event),
        pairs(&[(&a, "two"), (&b, "three, edited"), (&c, "four")])
    );

    let moved = world.sessions.queue_move(&sid, c.clone(), 0).await.unwrap();
    assert_eq!(ids(&moved), [c.as_str(), a.as_str(), b.as_str()]);
    let event = bus.until("queue moved").await;
    assert_eq!(event["runId"], c.as_str());
    let moved = world
        .sessions
        .queue_move(&sid, a.clone(), 99)
        .await
        .unwrap();
    assert_eq!(ids(&moved), [c.as_str(), b.as_str(), a.as_str()], "clamped");
    bus.until("queue moved").await;
    // To where it is already: nothing changes, nothing is published.
    let same = world.sessions.queue_move(&sid, a.clone(), 2).await.unwrap();
    assert_eq!(ids(&same), [c.as_str(), b.as_str(), a.as_str()]);

    let removed = world.sessions.queue_remove(&sid, a.clone()).await.unwrap();
    assert_eq!(
        (removed.run_id.as_str(), removed.state),
        (a.as_str(), CancelOutcome::Cancelled)
    );
    let notice = bus.until("warning followup_cancelled").await;
    assert_eq!(notice["runId"], a.as_str());
    let event = bus.until("queue removed").await;
    assert_eq!(
        event_queue(&event),
        pairs(&[(&c, "four"), (&b, "three, edited")])
    );

    match world
        .sessions
        .queue_edit(&sid, r1.clone(), "x".into())
        .await
    {
        Err(SessionError::NotQueued { run_id, state }) => {
            assert_eq!((run_id.as_str(), state), (r1.as_str(), RunStatus::Running));
        }
        other => panic!("{other:?}"),
    }
    match world.sessions.queue_move(&sid, a.clone(), 0).await {
        Err(SessionError::NotQueued { state, .. }) => assert_eq!(state, RunStatus::Cancelled),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        world.sessions.queue_remove(&sid, r1.clone()).await,
        Err(SessionError::NotQueued { .. })
    ));
    assert!(matches!(
        world
            .sessions
            .queue_remove(&sid, "no-such-run".into())
            .await,
        Err(SessionError::RunNotFound(_))
    ));
    assert!(matches!(
        world
            .sessions
            .queue_edit(&sid, b.clone(), "  ".into())
            .await,
        Err(SessionError::InvalidParams(_))
    ));

    // The store holds the queue as the actor does: its order and the edited text.
    let stored: Vec<(String, Option<String>)> = world
        .store
        .queued_runs(sid.clone())
        .await
        .unwrap()
        .into_iter()
        .map(|q| (q.run.run_id, q.prompt))
        .collect();
    assert_eq!(
        stored,
        [
            (c.clone(), Some("four".to_owned())),
            (b.clone(), Some("three, edited".to_owned()))
        ]
    );

    bus.take();
    agent.end(RunState::Completed).await;
    assert_eq!(
        prompt_text(&mut agent).await,
        (c.clone(), "four".to_owned())
    );
    let event = bus.until("queue dispatched").await;
    assert_eq!(event["runId"], c.as_str());
    assert_eq!(event_queue(&event), pairs(&[(&b, "three, edited")]));
    agent.end(RunState::Completed).await;
    assert_eq!(
        prompt_text(&mut agent).await,
        (b.clone(), "three, edited".to_owned())
    );
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "run.end",
            "user.text",
            "run.start",
            "queue dispatched",
            "run.end",
            "user.text",
            "run.start",
            "queue dispatched",
            "run.end",
            "state idle<-running",
        ]
    );
    assert!(world.sessions.queue(&sid).await.unwrap().is_empty());
    drop(agent);
    world.stop().await;
}

/// Past its capacity the queue drops its oldest prompt (not the one just sent): the warning
/// names the run and the first 60 characters of its text, and the queue's change follows.
#[tokio::test]
async fn past_its_capacity_the_queue_drops_its_oldest_and_names_it() {
    let mut world = World::start(Setup {
        capacity: 2,
        ..Setup::default()
    })
    .await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let long = format!("{}{}", "a".repeat(60), "b".repeat(40));
    let oldest = world.send(&sid, &long).await.run_id;
    let b = world.send(&sid, "three").await.run_id;
    let c = world.send(&sid, "four").await;
    assert!(c.queued);
    let dropped = bus.until("warning followup_dropped").await;
    assert_eq!(dropped["runId"], oldest.as_str());
    let message = dropped["message"].as_str().unwrap();
    assert!(message.contains(&oldest), "{message}");
    assert!(
        message.contains(&format!("\"{}…\"", "a".repeat(60))),
        "{message}"
    );
    // (The run id is hex: it may hold an "ab" of its own.)
    assert!(
        !message.replace(oldest.as_str(), "").contains("ab"),
        "only the first 60 characters: {message}"
    );
    assert!(message.contains("more than 2 prompts"), "{message}");
    let event = bus.until("queue dropped").await;
    assert_eq!(event["runId"], oldest.as_str());
    assert_eq!(
        event_queue(&event),
        pairs(&[(&b, "three"), (&c.run_id, "four")])
    );
    assert_eq!(world.run_states(&sid).await[&oldest], "dropped");
    assert_eq!(world.live(&sid).await.queued, [b, c.run_id]);
    // The stop interrupts the running turn: the agent ends it and is closed, so the stop does
    // not wait out its grace.
    let stopping = tokio::spawn(world.stop());
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    agent.end(RunState::Interrupted).await;
    agent.closed().await;
    stopping.await.unwrap();
}

/// `queue.clear` cancels every queued prompt (each with its warning) and publishes one
/// change; the turn's end then leaves the session idle. Clearing an empty queue, or the queue
/// of a session that never ran, takes nothing.
#[tokio::test]
async fn clear_takes_every_queued_prompt_out() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let idle = world.session().await;
    assert!(world.sessions.queue_clear(&idle).await.unwrap().is_empty());
    assert!(
        world.sessions.live(&idle).await.is_none(),
        "no actor was started"
    );
    assert!(matches!(
        world
            .sessions
            .queue_edit(&idle, "nope".into(), "x".into())
            .await,
        Err(SessionError::RunNotFound(_))
    ));
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let a = world.send(&sid, "two").await.run_id;
    let b = world.send(&sid, "three").await.run_id;
    bus.until("queue added").await;
    bus.until("queue added").await;
    bus.take();
    let removed = world.sessions.queue_clear(&sid).await.unwrap();
    assert_eq!(removed, [a.clone(), b.clone()]);
    let cleared = bus.until("queue cleared").await;
    assert!(cleared.get("runId").is_none(), "{cleared}");
    assert_eq!(cleared["queue"], json!([]));
    assert_eq!(
        bus.take(),
        [
            "warning followup_cancelled",
            "warning followup_cancelled",
            "queue cleared"
        ]
    );
    assert!(world.sessions.queue_clear(&sid).await.unwrap().is_empty());
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    let states = world.run_states(&sid).await;
    assert_eq!(
        (states[&a].as_str(), states[&b].as_str()),
        ("cancelled", "cancelled")
    );
    drop(agent);
    world.stop().await;
}

/// A family that cannot steer: the text becomes the head of the queue, visibly
/// (`steer_unsupported`, `queue.changed` `steered`), and runs right after the turn — before
/// what was queued earlier. With no turn running, a steer is a plain send.
#[tokio::test]
async fn a_steer_the_agent_cannot_take_runs_next_at_the_head() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let plain = world
        .sessions
        .steer(&sid, "start".into(), None)
        .await
        .unwrap();
    assert!(!plain.steered && !plain.queued);
    let mut agent = world.agent().await;
    assert_eq!(
        prompt_text(&mut agent).await,
        (plain.run_id.clone(), "start".to_owned())
    );
    let waiting = world.send(&sid, "later").await.run_id;
    let steer = world
        .sessions
        .steer(&sid, "now, instead".into(), Some("k-1".into()))
        .await
        .unwrap();
    assert!(!steer.steered && steer.queued);
    let warning = bus.until("warning steer_unsupported").await;
    assert_eq!(warning["runId"], steer.run_id.as_str());
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("cannot take input mid-turn"),
        "{warning}"
    );
    let event = bus.until("queue steered").await;
    assert_eq!(
        event_queue(&event),
        pairs(&[(&steer.run_id, "now, instead"), (&waiting, "later")])
    );
    // A retried steer is the same run.
    let again = world
        .sessions
        .steer(&sid, "now, instead".into(), Some("k-1".into()))
        .await
        .unwrap();
    assert_eq!(
        (again.run_id.as_str(), again.queued),
        (steer.run_id.as_str(), true)
    );
    agent.end(RunState::Completed).await;
    assert_eq!(
        prompt_text(&mut agent).await,
        (steer.run_id.clone(), "now, instead".to_owned())
    );
    agent.end(RunState::Completed).await;
    assert_eq!(prompt_text(&mut agent).await.0, waiting);
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    drop(agent);
    world.stop().await;
}

/// The steer `user.text`s the store holds for a session, as (run id, text).
async fn stored_steers(world: &World, sid: &str) -> Vec<(String, String)> {
    world
        .store
        .history(sid.to_owned(), 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "user.text")
        .map(|e| serde_json::from_str::<Value>(&e.payload).unwrap())
        .filter(|v| v["steer"] == true)
        .map(|v| {
            (
                v["runId"].as_str().unwrap().to_owned(),
                v["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A family that steers: the text is committed as the running run's `user.text` with `steer`
/// before the agent gets it (issue 13: nothing reaches an agent the log does not hold), and the
/// agent takes it. An agent that refuses it has a `warning` `steer_not_taken` follow that
/// `user.text` in the same run (issue 17: nothing is left claiming influence the turn did not
/// take), and the text goes to the head of the queue instead, saying why.
#[tokio::test]
async fn a_steer_goes_into_the_running_turn_where_the_agent_takes_it() {
    let mut world = World::start(Setup {
        caps: Capabilities {
            steer: true,
            ..FULL
        },
        ..Setup::default()
    })
    .await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let r1 = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;

    let sessions = world.sessions.clone();
    let id = sid.clone();
    let steering = tokio::spawn(async move { sessions.steer(&id, "also this".into(), None).await });
    match agent.input().await {
        AgentInput::Steer { text, id, reply } => {
            assert_eq!((text.as_str(), id.as_str()), ("also this", r1.as_str()));
            // Durable before the agent saw it.
            assert_eq!(
                stored_steers(&world, &sid).await,
                pairs(&[(&r1, "also this")])
            );
            reply.send(Ok(())).unwrap();
        }
        other => panic!("expected a steer, got {other:?}"),
    }
    let receipt = steering.await.unwrap().unwrap();
    assert_eq!(
        (receipt.run_id.as_str(), receipt.steered, receipt.queued),
        (r1.as_str(), true, false)
    );
    let mut user = bus.until("user.text").await;
    if user["steer"] != true {
        // The run's own prompt came first.
        user = bus.until("user.text").await;
    }
    assert_eq!(user["runId"], r1.as_str());
    assert_eq!(user["text"], "also this");
    let parsed: Event = serde_json::from_value(user.clone()).unwrap();
    assert!(matches!(
        parsed.body,
        EventBody::UserText(UserText { steer: true, .. })
    ));

    let sessions = world.sessions.clone();
    let id = sid.clone();
    let refused = tokio::spawn(async move { sessions.steer(&id, "and this".into(), None).await });
    match agent.input().await {
        AgentInput::Steer { reply, .. } => reply
            .send(Err(AdapterError::new(
                ErrorCategory::AgentFailed,
                "no active turn to steer",
            )))
            .unwrap(),
        other => panic!("expected a steer, got {other:?}"),
    }
    let receipt = refused.await.unwrap().unwrap();
    assert!(!receipt.steered && receipt.queued);
    let user = bus.until("user.text").await;
    assert_eq!(
        (&user["runId"], &user["text"], &user["steer"]),
        (&json!(r1), &json!("and this"), &json!(true))
    );
    // Said at once, in the run its `user.text` is in.
    let next = bus.next().await;
    assert_eq!(
        bus.seen.last().map(String::as_str),
        Some("warning steer_not_taken"),
        "{next}"
    );
    assert_eq!(next["runId"], r1.as_str());
    let message = next["message"].as_str().unwrap();
    assert!(
        message.contains("no active turn to steer") && message.contains("and this"),
        "{next}"
    );
    let warning = bus.until("warning steer_unsupported").await;
    assert_eq!(warning["runId"], receipt.run_id.as_str());
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("no active turn to steer"),
        "{warning}"
    );
    agent.end(RunState::Completed).await;
    assert_eq!(
        prompt_text(&mut agent).await,
        (receipt.run_id.clone(), "and this".to_owned())
    );
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    drop(agent);
    world.stop().await;
}

/// A steer whose `user.text` the store cannot commit never reaches the agent: the caller gets
/// `store_unavailable`, the log holds no steer, and nothing is queued for it.
#[tokio::test]
async fn a_steer_the_store_cannot_commit_is_refused_and_never_reaches_the_agent() {
    let mut world = World::start(steering_world()).await;
    let sid = world.session().await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.prompt().await;

    world.store.fail_writes(true).await;
    match world.sessions.steer(&sid, "lost?".into(), None).await {
        Err(SessionError::StoreUnavailable(_)) => {}
        other => panic!("expected store_unavailable, got {other:?}"),
    }
    // The actor handled the steer entirely before this answer: had it given the agent the
    // text, it would be waiting in the agent's inputs now.
    world.live(&sid).await;
    assert!(
        agent.inputs.try_recv().is_err(),
        "a steer the log does not hold reached the agent"
    );
    world.store.fail_writes(false).await;
    store_recovered(&world).await;
    assert!(stored_steers(&world, &sid).await.is_empty());
    assert!(world.live(&sid).await.queued.is_empty());
    drop(agent);
    world.stop().await;
}

/// The kinds (a warning with its code) of a session's stored events in run `run_id`, in order.
async fn stored_kinds_in(world: &World, sid: &str, run_id: &str) -> Vec<String> {
    world
        .store
        .history(sid.to_owned(), 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, serde_json::from_str::<Value>(&e.payload).unwrap()))
        .filter(|(_, v)| v["runId"] == run_id)
        .map(|(kind, v)| match v["code"].as_str() {
            Some(code) => format!("{kind} {code}"),
            None => kind,
        })
        .collect()
}

/// A steer the agent refuses while the store cannot commit: its `user.text` is in the log
/// already, so the `warning` `steer_not_taken` that undoes that claim is not left to a
/// publish that may be lost. It is held by the actor's outage state (the caller gets
/// `store_unavailable`, nothing is queued for the text) and published in the run, first, once
/// the store commits again — before the run's end.
#[tokio::test]
async fn a_steer_not_taken_the_store_cannot_commit_is_said_once_the_store_is_back() {
    let mut world = World::start(steering_world()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let r1 = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let sessions = world.sessions.clone();
    let id = sid.clone();
    let steering = tokio::spawn(async move { sessions.steer(&id, "refused".into(), None).await });
    let AgentInput::Steer { reply, .. } = agent.input().await else {
        panic!("expected a steer");
    };
    world.store.fail_writes(true).await;
    reply
        .send(Err(AdapterError::new(
            ErrorCategory::AgentFailed,
            "no active turn to steer",
        )))
        .unwrap();
    match steering.await.unwrap() {
        Err(SessionError::StoreUnavailable(_)) => {}
        other => panic!("expected store_unavailable, got {other:?}"),
    }
    // The steer is in the log; nothing says yet that the turn did not take it.
    assert_eq!(
        stored_steers(&world, &sid).await,
        pairs(&[(&r1, "refused")])
    );
    assert!(
        !stored_kinds_in(&world, &sid, &r1)
            .await
            .iter()
            .any(|k| k == "warning steer_not_taken"),
        "committed while the store could not commit"
    );

    world.store.fail_writes(false).await;
    store_recovered(&world).await;
    let warning = bus.until("warning steer_not_taken").await;
    assert_eq!(warning["runId"], r1.as_str());
    let message = warning["message"].as_str().unwrap();
    assert!(
        message.contains("refused")
            && message.contains(r1.as_str())
            && message.contains("no active turn to steer")
            && !message.contains("runs next"),
        "{warning}"
    );
    assert!(world.live(&sid).await.queued.is_empty());
    agent.end(RunState::Completed).await;
    until_status(&world, &sid, |s| s.run_id.is_none()).await;
    let kinds = stored_kinds_in(&world, &sid, &r1).await;
    let at = |kind: &str| kinds.iter().position(|k| k == kind);
    assert!(
        at("run.end").is_some() && at("warning steer_not_taken") < at("run.end"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "warning steer_not_taken")
            .count(),
        1,
        "{kinds:?}"
    );
    assert!(
        agent.inputs.try_recv().is_err(),
        "the refused steer ran as a prompt"
    );
    drop(agent);
    world.stop().await;
}

/// The host stops and starts again on the same database file: a new store, bus and session
/// manager, which recover (the follower is subscribed before they do).
pub(super) async fn restart(world: World) -> (World, Follow, String) {
    let World {
        dir,
        sessions,
        fake,
        agents,
        bus_tasks,
        threads,
        store,
        health: _,
    } = world;
    drop(sessions);
    drop(store);
    bus_tasks.shutdown().await;
    threads.shutdown().await;
    let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
    let (bus, bus_tasks) = Bus::start(store.clone()).await.unwrap();
    let (health, health_rx) = watch::channel(store.health());
    let sessions = SessionManager::with_health(store.clone(), bus, fake.clone(), health_rx);
    let world = World {
        dir,
        store,
        sessions,
        fake,
        agents,
        health,
        bus_tasks,
        threads,
    };
    let sid = world
        .store
        .list_sessions()
        .await
        .unwrap()
        .first()
        .unwrap()
        .session_id
        .clone();
    let bus = world.follow(&sid).await;
    (world, bus, sid)
}

/// A graceful stop keeps the queue — edited and reordered — in the store; the next host gives
/// it back to the session, publishes it (`restored`) and runs it in order with the edited text.
#[tokio::test]
async fn a_stopped_hosts_queue_runs_after_the_restart_in_its_order() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let r1 = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let a = world.send(&sid, "two").await.run_id;
    let b = world.send(&sid, "three").await.run_id;
    world
        .sessions
        .queue_edit(&sid, a.clone(), "two, edited".into())
        .await
        .unwrap();
    world.sessions.queue_move(&sid, b.clone(), 0).await.unwrap();
    let sessions = world.sessions.clone();
    let stopping = tokio::spawn(async move { sessions.shutdown().await });
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    agent.end(RunState::Cancelled).await;
    agent.closed().await;
    stopping.await.unwrap();
    drop(agent);

    let (mut world, mut bus, same) = restart(world).await;
    assert_eq!(same, sid);
    world.sessions.recover().await.unwrap();
    let restored = bus.until("queue restored").await;
    assert!(restored.get("runId").is_none(), "{restored}");
    assert_eq!(
        event_queue(&restored),
        pairs(&[(&b, "three"), (&a, "two, edited")])
    );
    let mut agent = world.agent().await;
    assert_eq!(
        prompt_text(&mut agent).await,
        (b.clone(), "three".to_owned())
    );
    let queue = world.sessions.queue(&sid).await.unwrap();
    assert_eq!(ids(&queue), [a.as_str()]);
    agent.end(RunState::Completed).await;
    assert_eq!(
        prompt_text(&mut agent).await,
        (a.clone(), "two, edited".to_owned())
    );
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "queue restored",
            "user.text",
            "run.start",
            "queue dispatched",
            "state running<-idle",
            "run.end",
            "user.text",
            "run.start",
            "queue dispatched",
            "run.end",
            "state idle<-running",
        ]
    );
    let states = world.run_states(&sid).await;
    assert_eq!(
        (
            states[&r1].as_str(),
            states[&b].as_str(),
            states[&a].as_str()
        ),
        ("interrupted", "completed", "completed")
    );
    drop(agent);
    world.stop().await;
}

/// What a crash (kill -9) leaves: a run the log shows started and a queue in the rows, one
/// prompt of it from a host before schema 6 (no text). Recovery ends the started run
/// `interrupted` first, drops the prompt without text, and the rest runs in its queue order
/// (by place, not by when it was sent).
#[tokio::test]
async fn after_a_crash_the_started_run_is_interrupted_and_the_queue_runs() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let row = |run_id: &str, state: RunStatus, at: i64| RunRow {
        run_id: run_id.to_owned(),
        session_id: sid.clone(),
        state,
        client_msg_id: None,
        error_category: None,
        message: None,
        created_at_ms: at,
        ended_at_ms: None,
    };
    let insert = |row: RunRow, prompt: Option<&str>, pos: Option<i64>| {
        world
            .store
            .insert_prompt_run(row, prompt.map(str::to_owned), pos)
    };
    insert(row("r-running", RunStatus::Running, 1), Some("one"), None)
        .await
        .unwrap();
    insert(
        row("r-later", RunStatus::Queued, 2),
        Some("sent first, moved back"),
        Some(5),
    )
    .await
    .unwrap();
    insert(
        row("r-sooner", RunStatus::Queued, 3),
        Some("moved to the front"),
        Some(1),
    )
    .await
    .unwrap();
    insert(row("r-old", RunStatus::Queued, 4), None, None)
        .await
        .unwrap();
    let started = Event::new(
        &sid,
        Some("r-running".into()),
        EventBody::RunStart(Default::default()),
    );
    world
        .sessions
        .bus
        .publish(&started)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    world
        .store
        .set_session_state(sid.clone(), crate::protocol::states::SessionState::Running)
        .await
        .unwrap();
    bus.until("run.start").await;
    bus.take();

    world.sessions.recover().await.unwrap();
    let mut agent = world.agent().await;
    assert_eq!(
        prompt_text(&mut agent).await,
        ("r-sooner".to_owned(), "moved to the front".to_owned())
    );
    agent.end(RunState::Completed).await;
    assert_eq!(prompt_text(&mut agent).await.0, "r-later");
    agent.end(RunState::Completed).await;
    // Recovery's `idle` first, then the queue's end.
    bus.until("state idle<-running").await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "run.end",
            "warning followup_dropped",
            "state idle<-running",
            "queue restored",
            "user.text",
            "run.start",
            "queue dispatched",
            "state running<-idle",
            "run.end",
            "user.text",
            "run.start",
            "queue dispatched",
            "run.end",
            "state idle<-running",
        ]
    );
    let states = world.run_states(&sid).await;
    assert_eq!(states["r-running"], "interrupted");
    assert_eq!(states["r-old"], "dropped");
    assert_eq!(states["r-sooner"], "completed");
    assert_eq!(states["r-later"], "completed");
    drop(agent);
    world.stop().await;
}

/// Wait until the store's own health says it commits again.
async fn store_recovered(world: &World) {
    let mut health = world.store.watch_health();
    tokio::time::timeout(Duration::from_secs(60), async {
        while !health.borrow_and_update().is_ok() {
            health.changed().await.unwrap();
        }
    })
    .await
    .expect("the store did not recover");
}

/// A removal (`queue.remove`, `queue.clear`, `session.cancel` of a queued run) the store
/// cannot commit is not made: the caller gets `store_unavailable`, the prompt stays in the
/// queue and its row stays `queued` (so a restart gives it back as the caller was told), and
/// once the store commits again the removal works and the queue runs what is left.
#[tokio::test]
async fn a_removal_the_store_cannot_commit_is_refused_and_the_prompt_stays_queued() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let a = world.send(&sid, "two").await.run_id;
    let b = world.send(&sid, "three").await.run_id;

    world.store.fail_writes(true).await;
    assert!(matches!(
        world.sessions.queue_remove(&sid, a.clone()).await,
        Err(SessionError::StoreUnavailable(_))
    ));
    assert!(matches!(
        world.sessions.queue_clear(&sid).await,
        Err(SessionError::StoreUnavailable(_))
    ));
    assert!(matches!(
        world.sessions.cancel(&sid, Some(b.clone())).await,
        Err(SessionError::StoreUnavailable(_))
    ));
    let queue = world.sessions.queue(&sid).await.unwrap();
    assert_eq!(ids(&queue), [a.as_str(), b.as_str()]);
    world.store.fail_writes(false).await;
    store_recovered(&world).await;
    let states = world.run_states(&sid).await;
    assert_eq!(
        (states[&a].as_str(), states[&b].as_str()),
        ("queued", "queued")
    );

    let removed = world.sessions.queue_remove(&sid, a.clone()).await.unwrap();
    assert_eq!(removed.state, CancelOutcome::Cancelled);
    agent.end(RunState::Completed).await;
    assert_eq!(agent.prompt().await, b);
    agent.end(RunState::Completed).await;
    until_status(&world, &sid, |s| s.run_id.is_none()).await;
    let states = world.run_states(&sid).await;
    assert_eq!(
        (states[&a].as_str(), states[&b].as_str()),
        ("cancelled", "completed")
    );
    drop(agent);
    world.stop().await;
}

/// A crash mid-dispatch leaves a row `running` with its prompt, its `user.text` in the log and
/// no `run.start`: recovery queues it again at the head (ahead of a prompt placed before it),
/// and it runs first, announced already (no second `user.text`). Every run row has its place,
/// one sent to an idle session too.
#[tokio::test]
async fn a_dispatch_a_crash_cut_short_runs_first_after_the_restart() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let row = |run_id: &str, state: RunStatus, at: i64| RunRow {
        run_id: run_id.to_owned(),
        session_id: sid.clone(),
        state,
        client_msg_id: None,
        error_category: None,
        message: None,
        created_at_ms: at,
        ended_at_ms: None,
    };
    world
        .store
        .insert_prompt_run(
            row("r-cut", RunStatus::Running, 2),
            Some("cut short".into()),
            Some(4),
        )
        .await
        .unwrap();
    world
        .store
        .insert_prompt_run(
            row("r-next", RunStatus::Queued, 1),
            Some("next".into()),
            Some(1),
        )
        .await
        .unwrap();
    let announced = Event::new(
        &sid,
        Some("r-cut".into()),
        EventBody::UserText(UserText {
            text: "cut short".into(),
            client_msg_id: None,
            steer: false,
            from: None,
            imported: false,
            attachments: Vec::new(),
        }),
    );
    world
        .sessions
        .bus
        .publish(&announced)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    bus.until("user.text").await;
    bus.take();

    world.sessions.recover().await.unwrap();
    let restored = bus.until("queue restored").await;
    assert_eq!(
        event_queue(&restored),
        pairs(&[("r-cut", "cut short"), ("r-next", "next")])
    );
    let mut agent = world.agent().await;
    assert_eq!(
        prompt_text(&mut agent).await,
        ("r-cut".to_owned(), "cut short".to_owned())
    );
    agent.end(RunState::Completed).await;
    assert_eq!(prompt_text(&mut agent).await.0, "r-next");
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "queue restored",
            "run.start",
            "queue dispatched",
            "state running<-idle",
            "run.end",
            "user.text",
            "run.start",
            "queue dispatched",
            "run.end",
            "state idle<-running",
        ]
    );
    let states = world.run_states(&sid).await;
    assert_eq!(
        (states["r-cut"].as_str(), states["r-next"].as_str()),
        ("completed", "completed")
    );

    // A prompt to the idle session has its place in its row as well.
    let idle = world.send(&sid, "idle").await.run_id;
    assert_eq!(agent.prompt().await, idle);
    assert!(world.store.requeue_run(idle.clone()).await.unwrap());
    let stored = world.store.queued_runs(sid.clone()).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert!(
        stored[0].queue_pos.is_some(),
        "no place: {:?}",
        stored[0].queue_pos
    );
    drop(agent);
    world.stop().await;
}

fn steering_world() -> Setup {
    Setup {
        caps: Capabilities {
            steer: true,
            ..FULL
        },
        ..Setup::default()
    }
}

/// A steer the agent has not answered holds nothing up: a second steer is refused
/// `steer_pending`, a permission answer and a cancel reach the agent meanwhile. Answered, it
/// is the run's; sent again (the same `client_msg_id`) it is the same receipt, `duplicate`,
/// and the agent gets nothing more.
#[tokio::test]
async fn a_pending_steer_blocks_neither_a_cancel_nor_a_permission_answer() {
    let mut world = World::start(steering_world()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let r1 = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let sessions = world.sessions.clone();
    let id = sid.clone();
    let steering =
        tokio::spawn(async move { sessions.steer(&id, "also".into(), Some("s-1".into())).await });
    let AgentInput::Steer { reply, .. } = agent.input().await else {
        panic!("expected a steer");
    };
    match world.sessions.steer(&sid, "more".into(), None).await {
        Err(SessionError::SteerPending { run_id }) => assert_eq!(run_id, r1),
        other => panic!("expected steer_pending, got {other:?}"),
    }
    agent.ask("p1").await;
    bus.until("state waiting<-running").await;
    // The answer returns once the agent acknowledged it: answer and acknowledge together.
    let (responded, (answered, allowed, _)) = tokio::join!(
        world
            .sessions
            .respond_permission(&sid, "p1".into(), Decision::Allow, None, "ipc".into()),
        agent.permission(Ok(Honoured::default()))
    );
    responded.unwrap();
    assert_eq!((answered.as_str(), allowed), ("p1", true));
    assert_eq!(world.live(&sid).await.run_id.as_deref(), Some(r1.as_str()));
    world.sessions.cancel(&sid, None).await.unwrap();
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    assert!(
        !steering.is_finished(),
        "the steer was answered before the agent's answer"
    );

    reply.send(Ok(())).unwrap();
    let receipt = steering.await.unwrap().unwrap();
    assert_eq!(
        (receipt.run_id.as_str(), receipt.steered, receipt.duplicate),
        (r1.as_str(), true, false)
    );
    let again = world
        .sessions
        .steer(&sid, "also".into(), Some("s-1".into()))
        .await
        .unwrap();
    assert_eq!(
        (
            again.run_id.as_str(),
            again.steered,
            again.queued,
            again.duplicate
        ),
        (r1.as_str(), true, false, true)
    );
    assert!(
        agent.inputs.try_recv().is_err(),
        "a retried steer went to the agent again"
    );
    agent.end(RunState::Cancelled).await;
    bus.until("state idle<-running").await;
    let steers: Vec<String> = world
        .store
        .history(sid.clone(), 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "user.text" && e.payload.contains("\"steer\":true"))
        .map(|e| e.payload)
        .collect();
    assert_eq!(steers.len(), 1, "{steers:?}");
    assert!(world.live(&sid).await.queued.is_empty());
    tokio::join!(world.stop(), agent.closed());
}

/// A steer the agent got and never answered — the driver says so, or the session's wait runs
/// out — is not queued (it may be in the turn): the caller gets `result_delivery_unknown`,
/// the run a `warning` `steer_result_unknown`, and nothing runs after the turn.
#[tokio::test]
async fn a_steer_whose_outcome_is_unknown_is_not_queued() {
    let mut world = World::start(steering_world()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let r1 = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    for timeout in [false, true] {
        let sessions = world.sessions.clone();
        let id = sid.clone();
        let steering = tokio::spawn(async move { sessions.steer(&id, "maybe".into(), None).await });
        let AgentInput::Steer { reply, .. } = agent.input().await else {
            panic!("expected a steer");
        };
        let _held = if timeout {
            skip(crate::session::agent::STEER_WAIT).await;
            Some(reply)
        } else {
            reply
                .send(Err(AdapterError::new(
                    ErrorCategory::ResultDeliveryUnknown,
                    "turn/steer went unanswered",
                )))
                .unwrap();
            None
        };
        match steering.await.unwrap() {
            Err(e @ SessionError::SteerUnknown(_)) => {
                assert!(e.to_string().contains("not queued"), "{e}");
            }
            other => panic!("{timeout}: expected an unknown outcome, got {other:?}"),
        }
        let warning = bus.until("warning steer_result_unknown").await;
        assert_eq!(warning["runId"], r1.as_str());
        assert!(world.live(&sid).await.queued.is_empty(), "{timeout}");
    }
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert!(
        agent.inputs.try_recv().is_err(),
        "an unknown steer ran as a prompt"
    );
    assert!(world.live(&sid).await.queued.is_empty());
    drop(agent);
    world.stop().await;
}
