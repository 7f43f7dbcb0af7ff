//! The session layer against a scripted in-memory agent: the session states a permission
//! request brings ("needs you" is `waiting`), activation before the first prompt, renaming,
//! and the list of pending requests. No process, no sleeps: every wait is on a bus event.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::agent::{AdapterError, AgentInput, AgentOutput, AgentSession, Native};
use super::*;
use crate::bus::{BusTasks, Replay, SubscribeOptions, Subscription};
use crate::protocol::events::{
    ErrorCategory, PermissionOptionKind, PermissionRequest, SessionBound,
};
use crate::store::{SessionFilter, StoreThreads};

/// The pid the scripted agent reports (no such process: nothing checks it).
const PID: u32 = 4_000_001;
const WAIT: Duration = Duration::from_secs(10);

/// Opens scripted agents: bound at once; a prompt `ASK n` asks `n` permissions and ends its
/// turn once all are answered; any other prompt ends its turn at once.
#[derive(Default)]
struct Scripted {
    opens: AtomicUsize,
    /// Every open fails, as a missing binary does.
    broken: bool,
}

impl Launcher for Scripted {
    fn runs_turns(&self, agent_type: &str) -> bool {
        agent_type == "acp"
    }

    /// Sessions of another family can be made (and not run).
    fn knows(&self, agent_type: &str) -> bool {
        matches!(agent_type, "acp" | "claude")
    }

    fn open(
        &self,
        _agent_type: &str,
        _cwd: &std::path::Path,
        _host_session_id: &str,
        native: Native,
        _options: &crate::protocol::options::SessionOptions,
    ) -> Result<AgentSession, AdapterError> {
        if self.broken {
            return Err(AdapterError::new(
                ErrorCategory::BinaryUnavailable,
                "no such agent binary",
            ));
        }
        self.opens.fetch_add(1, Ordering::SeqCst);
        let (input, inputs) = mpsc::channel(8);
        let (outputs, events) = mpsc::channel(64);
        tokio::spawn(drive(inputs, outputs, native.id().to_owned()));
        Ok(AgentSession::new(input, events, Some(PID)))
    }

    fn idle_timeout(&self) -> Option<Duration> {
        None
    }
}

async fn drive(
    mut inputs: mpsc::Receiver<AgentInput>,
    outputs: mpsc::Sender<AgentOutput>,
    native: String,
) {
    let end = |state| {
        AgentOutput::Event(EventBody::RunEnd(RunEnd {
            state,
            category: None,
            message: None,
        }))
    };
    let bound = EventBody::SessionBound(SessionBound {
        native_session_id: native,
    });
    if outputs.send(AgentOutput::Event(bound)).await.is_err() {
        return;
    }
    let mut asked = 0;
    let mut answered = 0;
    while let Some(input) = inputs.recv().await {
        let out = match input {
            AgentInput::Prompt { text, .. } => match text.strip_prefix("ASK ") {
                Some(n) => {
                    asked = n.parse().unwrap();
                    answered = 0;
                    for i in 0..asked {
                        let request = EventBody::PermissionRequest(PermissionRequest {
                            request_id: format!("p{i}"),
                            tool: "Bash".into(),
                            input: json!({"command": format!("ls {i}")}),
                            options: vec!["allow".into(), "deny".into(), "allow_always".into()],
                        });
                        if outputs.send(AgentOutput::Event(request)).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                None => end(RunState::Completed),
            },
            AgentInput::Permission { option, ack, .. } => {
                let always = option.is_some_and(|o| o.kind == PermissionOptionKind::AllowAlways);
                let _unwaited = ack.send(Ok(super::agent::Honoured { always }));
                answered += 1;
                if answered < asked {
                    continue;
                }
                end(RunState::Completed)
            }
            AgentInput::Interrupt => end(RunState::Cancelled),
            AgentInput::Steer { reply, .. } => {
                let _unwaited = reply.send(Err(AdapterError::new(
                    ErrorCategory::ProtocolIncompatible,
                    "the scripted agent cannot steer",
                )));
                continue;
            }
            AgentInput::SetModel { reply, .. } => {
                let _unwaited = reply.send(Ok(super::agent::ModelSwitch::Live));
                continue;
            }
            AgentInput::Close { done, .. } => {
                let _closed = done.send(());
                return;
            }
        };
        if outputs.send(out).await.is_err() {
            return;
        }
    }
}

/// A directory for a test's store: on a memory file system where there is one, so commits do
/// not wait on a disk's fsync (the session tests run in well under a second).
pub(super) fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

struct World {
    dir: tempfile::TempDir,
    store: Store,
    sessions: SessionManager,
    launcher: Arc<Scripted>,
    bus_tasks: BusTasks,
    threads: StoreThreads,
}

impl World {
    async fn start(launcher: Scripted) -> World {
        let dir = tempdir();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let (bus, bus_tasks) = Bus::start(store.clone()).await.unwrap();
        let launcher = Arc::new(launcher);
        let sessions = SessionManager::new(store.clone(), bus, launcher.clone());
        World {
            dir,
            store,
            sessions,
            launcher,
            bus_tasks,
            threads,
        }
    }

    async fn session(&self) -> String {
        self.sessions
            .create(NewSession {
                agent_type: "acp".into(),
                cwd: self.dir.path().display().to_string(),
                title: None,
                ..Default::default()
            })
            .await
            .unwrap()
            .session_id
    }

    async fn follow(&self, session_id: &str) -> Subscription {
        self.sessions
            .bus
            .subscribe(SubscribeOptions {
                filter: SessionFilter::One(session_id.into()),
                forward_deltas: false,
                replay: Replay::None,
                subscriber_id: None,
            })
            .await
            .unwrap()
    }

    async fn state(&self, session_id: &str) -> String {
        self.sessions
            .get(session_id)
            .await
            .unwrap()
            .state
            .as_str()
            .to_owned()
    }

    async fn stop(self) {
        self.sessions.shutdown().await;
        drop(self.sessions);
        self.bus_tasks.shutdown().await;
        self.threads.shutdown().await;
    }
}

/// Brackets until one of `kind` (its payload returned), each recorded as its kind, with the
/// state it moved to for a `session.state`.
async fn until(sub: &mut Subscription, seen: &mut Vec<String>, kind: &str) -> Value {
    loop {
        let delivery = tokio::time::timeout(WAIT, sub.recv())
            .await
            .unwrap_or_else(|_| panic!("no {kind} in time; saw {seen:?}"))
            .unwrap()
            .expect("bus closed");
        let event: Value = serde_json::from_str(&delivery.json).unwrap();
        let name = match event["k"].as_str().unwrap() {
            "session.state" => format!(
                "state {}<-{}",
                event["state"].as_str().unwrap(),
                event["previous"].as_str().unwrap()
            ),
            other => other.to_owned(),
        };
        seen.push(name);
        if event["k"] == kind {
            return event;
        }
    }
}

#[tokio::test]
async fn a_pending_permission_makes_the_session_waiting_until_the_last_is_answered() {
    let world = World::start(Scripted::default()).await;
    let sid = world.session().await;
    let mut sub = world.follow(&sid).await;
    let mut seen = Vec::new();
    let run = world
        .sessions
        .send(&sid, "ASK 2".into(), None)
        .await
        .unwrap()
        .run_id;

    let waiting = until(&mut sub, &mut seen, "session.state").await;
    assert_eq!(waiting["state"], "running", "{seen:?}");
    let waiting = loop {
        let event = until(&mut sub, &mut seen, "session.state").await;
        if event["state"] == "waiting" {
            break event;
        }
    };
    assert_eq!(waiting["previous"], "running");
    assert_eq!(waiting["runId"], run.as_str());
    // The second request comes after; it changes nothing.
    until(&mut sub, &mut seen, "permission.request").await;
    assert_eq!(world.state(&sid).await, "waiting");
    let listed = world.sessions.list().await.unwrap();
    assert_eq!(listed[0].state.as_str(), "waiting");

    // Both pending, with the choices the agent offered.
    let pending = world
        .sessions
        .pending_permissions(Some(&sid))
        .await
        .unwrap();
    let ids: Vec<&str> = pending.iter().map(|p| p.request_id.as_str()).collect();
    assert_eq!(ids, ["p0", "p1"]);
    let ids: Vec<&str> = pending[0].options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["allow", "deny", "allow_always"]);
    assert_eq!(pending[1].input, json!({"command": "ls 1"}));
    assert_eq!(pending[0].run_id.as_deref(), Some(run.as_str()));
    assert_eq!(pending[0].tool, "Bash");
    assert_eq!(
        world.sessions.pending_permissions(None).await.unwrap(),
        pending
    );
    assert!(matches!(
        world.sessions.pending_permissions(Some("nope")).await,
        Err(SessionError::NotFound(_))
    ));

    // One answer of two: still waiting.
    let answer = |request: &str| {
        world.sessions.respond_permission(
            &sid,
            request.to_owned(),
            Decision::Allow,
            None,
            "ipc".into(),
        )
    };
    answer("p0").await.unwrap();
    until(&mut sub, &mut seen, "permission.resolved").await;
    assert_eq!(world.state(&sid).await, "waiting");
    assert_eq!(
        world
            .sessions
            .pending_permissions(Some(&sid))
            .await
            .unwrap()[0]
            .request_id,
        "p1"
    );
    answer("p1").await.unwrap();
    let running = until(&mut sub, &mut seen, "session.state").await;
    assert_eq!(
        (&running["state"], &running["previous"]),
        (&json!("running"), &json!("waiting"))
    );
    let end = until(&mut sub, &mut seen, "run.end").await;
    assert_eq!(end["state"], "completed");
    let idle = until(&mut sub, &mut seen, "session.state").await;
    assert_eq!(idle["state"], "idle");
    assert!(idle.get("runId").is_none(), "{idle}");
    assert_eq!(
        seen,
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "session.bound",
            "permission.request",
            "state waiting<-running",
            "permission.request",
            "permission.resolved",
            "permission.resolved",
            "state running<-waiting",
            "run.end",
            "state idle<-running",
        ]
    );
    assert_eq!(world.state(&sid).await, "idle");
    assert!(
        world
            .sessions
            .pending_permissions(None)
            .await
            .unwrap()
            .is_empty()
    );
    world.stop().await;
}

/// A run that ends with its request unanswered (the agent is gone) expires it: `run.end` and
/// then `idle`, straight from `waiting`.
#[tokio::test]
async fn a_run_that_ends_waiting_goes_idle_after_its_end() {
    let world = World::start(Scripted::default()).await;
    let sid = world.session().await;
    let mut sub = world.follow(&sid).await;
    let mut seen = Vec::new();
    world
        .sessions
        .send(&sid, "ASK 1".into(), None)
        .await
        .unwrap();
    loop {
        if until(&mut sub, &mut seen, "session.state").await["state"] == "waiting" {
            break;
        }
    }
    world.sessions.cancel(&sid, None).await.unwrap();
    let end = until(&mut sub, &mut seen, "run.end").await;
    assert_eq!(end["state"], "cancelled");
    let idle = until(&mut sub, &mut seen, "session.state").await;
    assert_eq!(
        (&idle["state"], &idle["previous"]),
        (&json!("idle"), &json!("waiting"))
    );
    let tail: Vec<&str> = seen.iter().rev().take(3).map(String::as_str).collect();
    assert_eq!(
        tail,
        ["state idle<-waiting", "run.end", "permission.resolved"]
    );
    assert_eq!(world.state(&sid).await, "idle");
    world.stop().await;
}

#[tokio::test]
async fn activate_starts_the_agent_before_the_first_prompt() {
    let world = World::start(Scripted::default()).await;
    let sid = world.session().await;
    let mut sub = world.follow(&sid).await;
    let first = world.sessions.activate(&sid).await.unwrap();
    assert_eq!(
        first,
        ActivateReceipt {
            session_id: sid.clone(),
            agent_pid: Some(PID),
            already: false,
        }
    );
    assert_eq!(
        world.sessions.live(&sid).await.unwrap().agent_pid,
        Some(PID)
    );
    let second = world.sessions.activate(&sid).await.unwrap();
    assert!(second.already);
    assert_eq!(second.agent_pid, Some(PID));

    // The prompt goes to the agent already running; the session was idle all along.
    let mut seen = Vec::new();
    world.sessions.send(&sid, "hi".into(), None).await.unwrap();
    until(&mut sub, &mut seen, "run.end").await;
    until(&mut sub, &mut seen, "session.state").await;
    assert_eq!(
        seen,
        [
            "session.bound",
            "user.text",
            "run.start",
            "state running<-idle",
            "run.end",
            "state idle<-running"
        ]
    );
    assert_eq!(world.launcher.opens.load(Ordering::SeqCst), 1);
    assert_eq!(world.state(&sid).await, "idle");
    world.stop().await;
}

#[tokio::test]
async fn activate_reports_an_agent_that_cannot_start() {
    let world = World::start(Scripted {
        broken: true,
        ..Scripted::default()
    })
    .await;
    let sid = world.session().await;
    match world.sessions.activate(&sid).await {
        Err(SessionError::AgentUnavailable(why)) => {
            assert!(why.contains("no such agent binary"), "{why}");
            assert!(why.contains("binary_unavailable"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        world.sessions.activate("nope").await,
        Err(SessionError::NotFound(_))
    ));
    // A family this launcher does not run.
    let claude = world
        .sessions
        .create(NewSession {
            agent_type: "claude".into(),
            cwd: world.dir.path().display().to_string(),
            title: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(matches!(
        world.sessions.activate(&claude.session_id).await,
        Err(SessionError::NoAgent(_))
    ));
    assert_eq!(world.state(&sid).await, "idle");
    world.stop().await;
}

#[tokio::test]
async fn rename_validates_like_create() {
    let world = World::start(Scripted::default()).await;
    let sid = world.session().await;
    let row = world
        .sessions
        .rename(&sid, "  the new name \n".into())
        .await
        .unwrap();
    assert_eq!(row.title.as_deref(), Some("the new name"));
    assert_eq!(
        world.sessions.get(&sid).await.unwrap().title.as_deref(),
        Some("the new name")
    );
    for bad in [" \t ".to_owned(), "x".repeat(MAX_TITLE_BYTES + 1)] {
        assert!(matches!(
            world.sessions.rename(&sid, bad).await,
            Err(SessionError::InvalidParams(_))
        ));
    }
    assert!(matches!(
        world.sessions.rename("nope", "t".into()).await,
        Err(SessionError::NotFound(_))
    ));
    world.stop().await;
}

/// A host that stopped while a session was waiting: the next one resets it to `idle`, visibly.
#[tokio::test]
async fn recover_resets_a_waiting_session_to_idle() {
    let world = World::start(Scripted::default()).await;
    let sid = world.session().await;
    world
        .store
        .set_session_state(sid.clone(), SessionState::Waiting)
        .await
        .unwrap();
    world.sessions.recover().await.unwrap();
    assert_eq!(world.state(&sid).await, "idle");
    let events = world.store.history(sid.clone(), 0, 10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, "session.state");
    let change: Value = serde_json::from_str(&events[0].payload).unwrap();
    assert_eq!(
        (&change["state"], &change["previous"]),
        (&json!("idle"), &json!("waiting"))
    );
    // Idle sessions are left alone: nothing more is published.
    world.sessions.recover().await.unwrap();
    assert_eq!(world.store.history(sid, 0, 10).await.unwrap().len(), 1);
    world.stop().await;
}
