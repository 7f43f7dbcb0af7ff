//! The session actor driven through every transition of its state machine, against an
//! in-process fake agent whose side of the handle (its two channels) the test plays: what the
//! agent says and when is the test's, so every order is exact. No process is spawned and
//! nothing sleeps: each wait is on a bus event or on what the actor sends the agent (bounded by
//! a timeout only to fail instead of hang); the actor's timers (cancel grace, settle, idle
//! close) are moved with `tokio::time::advance` in a short pause.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::{CANCEL_GRACE, Decision, SETTLE, STOP_GRACE};
use crate::bus::{Bus, BusTasks, Replay, SubscribeOptions, Subscription};
use crate::protocol::events::{
    ErrorCategory, EventBody, PermissionRequest, PermissionResolved, RunEnd, RunState, SessionBound,
};
use crate::protocol::replies::{CancelOutcome, LiveStatus, SendReceipt};
use crate::session::agent::{
    AdapterError, AgentInput, AgentOutput, AgentSession, Capabilities, FileChanges, Honoured,
    Launcher, Native, NativeFile, ProcessModel, ResumeKind, Support,
};
use crate::session::ownership::{self, OwnedPid};
use crate::session::scripted_tests::tempdir;
use crate::session::{NewSession, SessionError, SessionManager};
use crate::store::{SessionFilter, Store, StoreHealth, StoreThreads};

/// The pid the fake agent reports at open (no such process: it is never "ours" by /proc).
const PID: u32 = 4_000_001;
/// Only to fail instead of hanging: nothing waits this long when all is well.
const WAIT: Duration = Duration::from_secs(5);

/// A family with everything the host uses, as Claude and Codex declare.
const FULL: Capabilities = Capabilities {
    resume: ResumeKind::NativeId,
    permissions: true,
    cancel: true,
    steer: false,
    fork: Support::Native,
    usage: true,
    process: ProcessModel::Persistent,
    binding: true,
    options: crate::session::agent::OptionCaps::NONE,
};

/// The launcher of fake agents: each open hands the test the agent's side of the handle.
struct Fake {
    caps: Capabilities,
    idle: Option<Duration>,
    /// What the family's records say of any native session here.
    binding: Mutex<Result<(), String>>,
    /// The family's registry of live CLIs: pids that claim every native session.
    claims: Arc<Mutex<Vec<u32>>>,
    /// The native session file, for every native id.
    file: Option<PathBuf>,
    /// The watches the actor started, to play a write.
    watches: Mutex<Vec<mpsc::Sender<()>>>,
    opens: Mutex<Vec<Native>>,
    /// The pid each open reports.
    pid: Option<u32>,
    /// Every open fails, as a missing binary does.
    broken: Mutex<bool>,
    agents: mpsc::UnboundedSender<Agent>,
    /// The provider and default model the family reads (the binding's).
    provider: Mutex<Option<crate::protocol::options::ProviderIdentity>>,
    default_model: Mutex<Option<String>>,
}

impl Launcher for Fake {
    fn runs_turns(&self, agent_type: &str) -> bool {
        agent_type == "fake"
    }

    fn capabilities(&self, _agent_type: &str) -> Capabilities {
        self.caps
    }

    fn check_binding(
        &self,
        _agent_type: &str,
        _cwd: &std::path::Path,
        _native_id: &str,
    ) -> Result<(), String> {
        self.binding.lock().unwrap().clone()
    }

    fn open(
        &self,
        _agent_type: &str,
        _cwd: &std::path::Path,
        _host_session_id: &str,
        native: Native,
        options: &crate::protocol::options::SessionOptions,
    ) -> Result<AgentSession, AdapterError> {
        if *self.broken.lock().unwrap() {
            return Err(AdapterError::new(
                ErrorCategory::BinaryUnavailable,
                "no such agent binary",
            ));
        }
        self.opens.lock().unwrap().push(native.clone());
        let (input, inputs) = mpsc::channel(8);
        let (outputs, events) = mpsc::channel(64);
        let _test_gone = self.agents.send(Agent {
            native,
            options: options.clone(),
            inputs,
            outputs,
        });
        Ok(AgentSession::new(input, events, self.pid))
    }

    fn idle_timeout(&self) -> Option<Duration> {
        self.idle
    }

    fn provider(&self, _agent_type: &str) -> Option<crate::protocol::options::ProviderIdentity> {
        self.provider.lock().unwrap().clone()
    }

    fn default_model(&self, _agent_type: &str) -> Option<String> {
        self.default_model.lock().unwrap().clone()
    }

    fn native_file(&self, _agent_type: &str, _cwd: &std::path::Path, _id: &str) -> NativeFile {
        let claims = self.claims.clone();
        NativeFile {
            path: self.file.clone(),
            claimants: Some(Arc::new(move |_id: &str, ours: &[OwnedPid]| {
                claims
                    .lock()
                    .unwrap()
                    .iter()
                    .copied()
                    .filter(|pid| !ownership::is_ours(*pid, ours))
                    .collect()
            })),
            entries: None,
        }
    }

    fn watch(&self, _path: &std::path::Path) -> Option<FileChanges> {
        let (tx, changes) = mpsc::channel(8);
        self.watches.lock().unwrap().push(tx);
        Some(FileChanges {
            guard: Box::new(()),
            changes,
        })
    }
}

/// The test's side of one opened agent.
struct Agent {
    native: Native,
    /// The session options it was opened with.
    options: crate::protocol::options::SessionOptions,
    inputs: mpsc::Receiver<AgentInput>,
    outputs: mpsc::Sender<AgentOutput>,
}

impl Agent {
    async fn input(&mut self) -> AgentInput {
        tokio::time::timeout(WAIT, self.inputs.recv())
            .await
            .expect("the actor sent the agent nothing")
            .expect("the actor dropped the agent")
    }

    /// The next prompt; its id (the run's).
    async fn prompt(&mut self) -> String {
        match self.input().await {
            AgentInput::Prompt { id, .. } => id,
            other => panic!("expected a prompt, got {other:?}"),
        }
    }

    /// The next input is a close: its grace (the close is done at once).
    async fn closed(&mut self) -> Duration {
        match self.input().await {
            AgentInput::Close { grace, done } => {
                let _ = done.send(());
                grace
            }
            other => panic!("expected a close, got {other:?}"),
        }
    }

    async fn say(&self, body: EventBody) {
        self.outputs.send(AgentOutput::Event(body)).await.unwrap();
    }

    async fn bind(&self, id: &str) {
        self.say(EventBody::SessionBound(SessionBound {
            native_session_id: id.to_owned(),
        }))
        .await;
    }

    async fn end(&self, state: RunState) {
        self.say(EventBody::RunEnd(RunEnd {
            state,
            category: None,
            message: None,
        }))
        .await;
    }

    /// The next input is a permission answer: acknowledged with `ack` (as a driver does once
    /// it wrote the answer); its request id, yes or no, and option.
    async fn permission(
        &mut self,
        ack: Result<Honoured, AdapterError>,
    ) -> (
        String,
        bool,
        Option<crate::protocol::events::PermissionOption>,
    ) {
        match self.input().await {
            AgentInput::Permission {
                request_id,
                allow,
                option,
                ack: acked,
                ..
            } => {
                let _ = acked.send(ack);
                (request_id, allow, option)
            }
            other => panic!("expected a permission answer, got {other:?}"),
        }
    }

    async fn ask(&self, request_id: &str) {
        self.say(EventBody::PermissionRequest(PermissionRequest {
            request_id: request_id.to_owned(),
            tool: "Bash".into(),
            input: json!({"command": "ls"}),
            options: vec!["allow".into(), "deny".into()],
        }))
        .await;
    }

    async fn pid(&self, pid: Option<u32>) {
        self.outputs.send(AgentOutput::Pid(pid)).await.unwrap();
    }

    async fn exit(self) {
        let _ = self
            .outputs
            .send(AgentOutput::Exited {
                status: "signal 9".into(),
            })
            .await;
    }
}

/// The session's brackets as they arrive, each named by its kind (a `session.state` by its
/// move, a `warning` by its code).
struct Follow {
    sub: Subscription,
    seen: Vec<String>,
}

impl Follow {
    async fn next(&mut self) -> Value {
        let delivery = tokio::time::timeout(WAIT, self.sub.recv())
            .await
            .unwrap_or_else(|_| panic!("nothing more came; saw {:?}", self.seen))
            .unwrap()
            .expect("bus closed");
        let event: Value = serde_json::from_str(&delivery.json).unwrap();
        let name = match event["k"].as_str().unwrap() {
            "session.state" => format!(
                "state {}<-{}",
                event["state"].as_str().unwrap(),
                event["previous"].as_str().unwrap()
            ),
            "warning" => format!("warning {}", event["code"].as_str().unwrap()),
            "queue.changed" => format!("queue {}", event["reason"].as_str().unwrap()),
            other => other.to_owned(),
        };
        self.seen.push(name);
        event
    }

    /// Brackets until one named `name` (as [`Follow::seen`] names them); its payload.
    async fn until(&mut self, name: &str) -> Value {
        loop {
            let event = self.next().await;
            if self.seen.last().is_some_and(|n| n == name) {
                return event;
            }
        }
    }

    /// What was seen since the last look.
    fn take(&mut self) -> Vec<String> {
        std::mem::take(&mut self.seen)
    }
}

struct World {
    dir: tempfile::TempDir,
    store: Store,
    sessions: SessionManager,
    fake: Arc<Fake>,
    agents: mpsc::UnboundedReceiver<Agent>,
    health: watch::Sender<StoreHealth>,
    bus_tasks: BusTasks,
    threads: StoreThreads,
}

struct Setup {
    caps: Capabilities,
    idle: Option<Duration>,
    /// A native session file (unattributed, as Codex's), created.
    file: bool,
    pid: Option<u32>,
    /// The queue's capacity.
    capacity: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            caps: FULL,
            idle: None,
            file: false,
            pid: Some(PID),
            capacity: crate::config::DEFAULT_QUEUE_CAPACITY,
        }
    }
}

impl World {
    async fn start(setup: Setup) -> World {
        let dir = tempdir();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let (bus, bus_tasks) = Bus::start(store.clone()).await.unwrap();
        let file = setup.file.then(|| {
            let path = dir.path().join("native.jsonl");
            std::fs::write(&path, "{\"line\":1}\n").unwrap();
            path
        });
        let (agents_tx, agents) = mpsc::unbounded_channel();
        let fake = Arc::new(Fake {
            caps: setup.caps,
            idle: setup.idle,
            binding: Mutex::new(Ok(())),
            claims: Arc::default(),
            file,
            watches: Mutex::default(),
            opens: Mutex::default(),
            pid: setup.pid,
            broken: Mutex::new(false),
            agents: agents_tx,
            provider: Mutex::default(),
            default_model: Mutex::default(),
        });
        let (health, health_rx) = watch::channel(store.health());
        let sessions = SessionManager::with_health(store.clone(), bus, fake.clone(), health_rx)
            .with_queue_capacity(setup.capacity);
        World {
            dir,
            store,
            sessions,
            fake,
            agents,
            health,
            bus_tasks,
            threads,
        }
    }

    async fn session(&self) -> String {
        self.sessions
            .create(NewSession {
                agent_type: "fake".into(),
                cwd: self.dir.path().display().to_string(),
                title: None,
                ..Default::default()
            })
            .await
            .unwrap()
            .session_id
    }

    /// A session whose row binds `native` already (a session the host ran before).
    async fn bound_session(&self, native: &str) -> String {
        let sid = self.session().await;
        self.store
            .set_native_session_id(sid.clone(), native.to_owned())
            .await
            .unwrap();
        sid
    }

    async fn follow(&self, session_id: &str) -> Follow {
        let sub = self
            .sessions
            .bus
            .subscribe(SubscribeOptions {
                filter: SessionFilter::One(session_id.into()),
                forward_deltas: false,
                replay: Replay::None,
                subscriber_id: None,
            })
            .await
            .unwrap();
        Follow {
            sub,
            seen: Vec::new(),
        }
    }

    /// The next agent the actor opens.
    async fn agent(&mut self) -> Agent {
        tokio::time::timeout(WAIT, self.agents.recv())
            .await
            .expect("no agent was opened")
            .unwrap()
    }

    async fn send(&self, session_id: &str, text: &str) -> SendReceipt {
        self.sessions
            .send(session_id, text.to_owned(), None)
            .await
            .unwrap()
    }

    /// What the actor says it is doing, once it handled everything before.
    async fn live(&self, session_id: &str) -> LiveStatus {
        self.sessions.live(session_id).await.unwrap()
    }

    fn opens(&self) -> Vec<Native> {
        self.fake.opens.lock().unwrap().clone()
    }

    fn claim(&self, pid: u32) {
        self.fake.claims.lock().unwrap().push(pid);
    }

    /// Someone writes the native session file (as the watch reports it).
    async fn write_file(&self) {
        let watch = self.fake.watches.lock().unwrap().last().cloned();
        watch
            .expect("the file is not watched")
            .send(())
            .await
            .unwrap();
    }

    /// The store's health turns `degraded` (as after a failed commit) or `ok` again.
    fn store_down(&self, why: &str) {
        let outages = self.health.borrow().outages + 1;
        self.health.send_replace(StoreHealth {
            state: "degraded",
            error: Some(why.to_owned()),
            since: 0,
            outages,
        });
    }

    fn store_up(&self) {
        let outages = self.health.borrow().outages;
        self.health.send_replace(StoreHealth {
            state: "ok",
            error: None,
            since: 0,
            outages,
        });
    }

    async fn row(&self, session_id: &str) -> crate::store::SessionRow {
        self.sessions.get(session_id).await.unwrap()
    }

    async fn run_states(&self, session_id: &str) -> HashMap<String, String> {
        self.sessions
            .runs(session_id)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.run_id, r.state.as_str().to_owned()))
            .collect()
    }

    async fn stop(self) {
        self.sessions.shutdown().await;
        drop(self.sessions);
        self.bus_tasks.shutdown().await;
        self.threads.shutdown().await;
    }
}

/// Let the actor's clock run `by` at once (its timers fire), then go on in real time.
async fn skip(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by + Duration::from_millis(1)).await;
    tokio::time::resume();
}

/// Wait (without sleeping) until the actor's status says `what`.
async fn until_status(
    world: &World,
    session_id: &str,
    what: impl Fn(&LiveStatus) -> bool,
) -> LiveStatus {
    for _ in 0..1000 {
        let status = world.live(session_id).await;
        if what(&status) {
            return status;
        }
        tokio::task::yield_now().await;
    }
    panic!("the actor's status never changed");
}

/// Cold → Opening → Running → Idle, then Idle → Running → Idle on the same agent.
#[tokio::test]
async fn a_first_prompt_opens_a_new_session_and_the_agent_stays_for_the_next() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let first = world.send(&sid, "one").await;
    assert!(!first.queued);
    let mut agent = world.agent().await;
    assert!(matches!(agent.native, Native::New(_)), "{:?}", agent.native);
    agent.bind("n1").await;
    assert_eq!(agent.prompt().await, first.run_id);
    let live = world.live(&sid).await;
    assert_eq!(live.run_id.as_deref(), Some(first.run_id.as_str()));
    assert_eq!(live.agent_pid, Some(PID));
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;

    let second = world.send(&sid, "two").await;
    assert_eq!(agent.prompt().await, second.run_id);
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "session.bound",
            "run.end",
            "state idle<-running",
            "user.text",
            "run.start",
            "state running<-idle",
            "run.end",
            "state idle<-running",
        ]
    );
    assert_eq!(
        world.opens().len(),
        1,
        "the live agent took the second prompt"
    );
    let row = world.row(&sid).await;
    assert_eq!(row.native_session_id.as_deref(), Some("n1"));
    assert_eq!(row.state.as_str(), "idle");
    assert!(world.live(&sid).await.run_id.is_none());
    drop(agent);
    world.stop().await;
}

/// Busy: follow-ups queue (the oldest dropped past three, a queued one cancelled) and run in
/// order, each `user.text` after the previous `run.end`.
#[tokio::test]
async fn follow_ups_queue_drop_the_oldest_and_run_in_order() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let r1 = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let mut queued = Vec::new();
    for text in ["two", "three", "four", "five"] {
        let receipt = world.send(&sid, text).await;
        assert!(receipt.queued);
        queued.push(receipt.run_id);
    }
    let dropped = bus.until("warning followup_dropped").await;
    assert_eq!(dropped["runId"], queued[0].as_str());
    // The notice names the run and the start of its text.
    let message = dropped["message"].as_str().unwrap();
    assert!(
        message.contains(queued[0].as_str()) && message.contains("\"two\""),
        "{message}"
    );
    let cancelled = world
        .sessions
        .cancel(&sid, Some(queued[1].clone()))
        .await
        .unwrap();
    assert_eq!(cancelled.state, CancelOutcome::Cancelled);
    let notice = bus.until("warning followup_cancelled").await;
    assert_eq!(notice["runId"], queued[1].as_str());
    assert_eq!(world.live(&sid).await.queued, &queued[2..]);

    agent.end(RunState::Completed).await;
    assert_eq!(agent.prompt().await, queued[2]);
    agent.end(RunState::Completed).await;
    assert_eq!(agent.prompt().await, queued[3]);
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "queue added",
            "queue added",
            "queue added",
            "queue added",
            "warning followup_dropped",
            "queue dropped",
            "warning followup_cancelled",
            "queue removed",
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
    let states = world.run_states(&sid).await;
    assert_eq!(states[&r1], "completed");
    assert_eq!(states[&queued[0]], "dropped");
    assert_eq!(states[&queued[1]], "cancelled");
    assert_eq!(states[&queued[3]], "completed");
    drop(agent);
    world.stop().await;
}

/// Running → Waiting → Running: a request the agent withdraws, one answered, and one its run
/// ends with (expired, then `idle` straight from `waiting`).
#[tokio::test]
async fn permission_requests_make_the_run_wait_until_none_is_pending() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "go").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    agent.ask("p1").await;
    bus.until("state waiting<-running").await;
    assert_eq!(world.row(&sid).await.state.as_str(), "waiting");
    agent
        .say(EventBody::PermissionResolved(PermissionResolved {
            request_id: "p1".into(),
            decision: "cancelled".into(),
            by: None,
            ..PermissionResolved::default()
        }))
        .await;
    bus.until("state running<-waiting").await;
    agent.ask("p2").await;
    bus.until("state waiting<-running").await;
    let options = world
        .sessions
        .pending_permissions(Some(&sid))
        .await
        .unwrap();
    assert_eq!(options.len(), 1);
    let ids: Vec<&str> = options[0].options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["allow", "deny"]);
    let (receipt, (request_id, allow, _)) = tokio::join!(
        world
            .sessions
            .respond_permission(&sid, "p2".into(), Decision::Allow, None, "ipc".into()),
        agent.permission(Ok(Honoured::default())),
    );
    receipt.unwrap();
    assert_eq!((request_id.as_str(), allow), ("p2", true));
    let resolved = bus.until("permission.resolved").await;
    assert_eq!(resolved["by"], "ipc");
    bus.until("state running<-waiting").await;
    assert!(matches!(
        world
            .sessions
            .respond_permission(&sid, "p2".into(), Decision::Deny, None, "ws".into())
            .await,
        Err(SessionError::AlreadyResolved { .. })
    ));
    agent.ask("p3").await;
    bus.until("state waiting<-running").await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-waiting").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "permission.request",
            "state waiting<-running",
            "permission.resolved",
            "state running<-waiting",
            "permission.request",
            "state waiting<-running",
            "permission.resolved",
            "state running<-waiting",
            "permission.request",
            "state waiting<-running",
            "permission.resolved",
            "run.end",
            "state idle<-waiting",
        ]
    );
    assert!(
        world
            .sessions
            .pending_permissions(None)
            .await
            .unwrap()
            .is_empty()
    );
    drop(agent);
    world.stop().await;
}

/// An answer names one of the request's own options: an unknown id or a contradicting
/// decision is refused and leaves it pending; the chosen `allow_always` option reaches the
/// agent as that option, is recorded on the session, and `permission.resolved` says which
/// option and what rule.
#[tokio::test]
async fn an_allow_always_option_reaches_the_agent_and_is_recorded_on_the_session() {
    use crate::protocol::envelope::PermissionAnswer;
    use crate::protocol::events::{PermissionOption, PermissionOptionKind};
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "go").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    agent
        .say(EventBody::PermissionRequest(PermissionRequest {
            request_id: "p1".into(),
            tool: "Bash".into(),
            input: json!({"command": "npm test"}),
            options: vec![
                PermissionOption::new("once", "Allow", PermissionOptionKind::AllowOnce),
                PermissionOption::always(
                    "always",
                    "Always allow Bash(npm test)",
                    "always allow Bash(npm test) in this session".into(),
                ),
                PermissionOption::new("no", "Deny", PermissionOptionKind::RejectOnce),
            ],
        }))
        .await;
    bus.until("state waiting<-running").await;
    let refused = world
        .sessions
        .respond_permission(
            &sid,
            "p1".into(),
            PermissionAnswer::option("sometimes"),
            None,
            "ipc".into(),
        )
        .await;
    match refused {
        Err(SessionError::UnknownOption { offered, .. }) => {
            assert_eq!(offered, ["once", "always", "no"]);
        }
        other => panic!("{other:?}"),
    }
    let contradicting = PermissionAnswer {
        decision: Some(Decision::Deny),
        option_id: Some("always".into()),
    };
    assert!(matches!(
        world
            .sessions
            .respond_permission(&sid, "p1".into(), contradicting, None, "ipc".into())
            .await,
        Err(SessionError::InvalidParams(_))
    ));
    assert_eq!(
        world
            .sessions
            .pending_permissions(Some(&sid))
            .await
            .unwrap()
            .len(),
        1
    );
    let (receipt, (_, allow, option)) = tokio::join!(
        world.sessions.respond_permission(
            &sid,
            "p1".into(),
            PermissionAnswer::option("always"),
            None,
            "sub-1".into(),
        ),
        agent.permission(Ok(Honoured { always: true })),
    );
    let receipt = receipt.unwrap();
    assert_eq!(receipt.decision, "allow");
    assert_eq!(receipt.option_id.as_deref(), Some("always"));
    assert!(allow);
    assert_eq!(option.map(|o| o.id), Some("always".to_owned()));
    let resolved = bus.until("permission.resolved").await;
    assert_eq!(resolved["optionId"], "always");
    assert_eq!(resolved["kind"], "allow_always");
    assert_eq!(
        resolved["rule"],
        "always allow Bash(npm test) in this session"
    );
    let rules = world.sessions.permission_rules(&sid).await.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (
            rules[0].option_id.as_str(),
            rules[0].by.as_str(),
            rules[0].tool.as_str()
        ),
        ("always", "sub-1", "Bash")
    );
    // The shorthand picks the plain option, and keeps no rule.
    agent.ask("p2").await;
    bus.until("state waiting<-running").await;
    let (receipt, (_, allow, option)) = tokio::join!(
        world
            .sessions
            .respond_permission(&sid, "p2".into(), Decision::Deny, None, "ipc".into()),
        agent.permission(Ok(Honoured::default())),
    );
    receipt.unwrap();
    assert!(!allow);
    assert_eq!(option.map(|o| o.id), Some("deny".to_owned()));
    let resolved = bus.until("permission.resolved").await;
    assert_eq!(resolved["kind"], "reject_once");
    assert!(resolved.get("rule").is_none());
    assert_eq!(
        world.sessions.permission_rules(&sid).await.unwrap().len(),
        1
    );
    agent.end(RunState::Completed).await;
    bus.until("run.end").await;
    drop(agent);
    world.stop().await;
}

/// An always option keeps a rule only when the driver wrote the always part natively: one it
/// answered without it (e.g. Claude's suggestions gone), or one it could not deliver (no such
/// request pending), is resolved but records nothing.
#[tokio::test]
async fn an_always_answer_the_agent_did_not_take_as_one_records_no_rule() {
    use crate::protocol::envelope::PermissionAnswer;
    use crate::protocol::events::{PermissionOption, PermissionOptionKind};
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "go").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let acks = [
        Ok(Honoured { always: false }),
        Err(AdapterError::new(
            ErrorCategory::AgentFailed,
            "no such request pending",
        )),
    ];
    for (n, ack) in acks.into_iter().enumerate() {
        let request_id = format!("p{n}");
        agent
            .say(EventBody::PermissionRequest(PermissionRequest {
                request_id: request_id.clone(),
                tool: "Bash".into(),
                input: json!({"command": "npm test"}),
                options: vec![
                    PermissionOption::new("once", "Allow", PermissionOptionKind::AllowOnce),
                    PermissionOption::always(
                        "always",
                        "Always allow Bash(npm test)",
                        "always allow Bash(npm test) in this session".into(),
                    ),
                ],
            }))
            .await;
        bus.until("state waiting<-running").await;
        let (receipt, (asked, allow, _)) = tokio::join!(
            world.sessions.respond_permission(
                &sid,
                request_id.clone(),
                PermissionAnswer::option("always"),
                None,
                "ipc".into(),
            ),
            agent.permission(ack),
        );
        let receipt = receipt.unwrap();
        assert_eq!((asked.as_str(), allow), (request_id.as_str(), true));
        assert_eq!(receipt.rule, None);
        let resolved = bus.until("permission.resolved").await;
        assert_eq!(resolved["kind"], "allow_always");
        assert!(resolved.get("rule").is_none(), "{resolved}");
        bus.until("state running<-waiting").await;
    }
    assert!(
        world
            .sessions
            .permission_rules(&sid)
            .await
            .unwrap()
            .is_empty()
    );
    agent.end(RunState::Completed).await;
    bus.until("run.end").await;
    drop(agent);
    world.stop().await;
}

/// Cancel interrupts once per run; an agent that ignores it is killed after the grace (the
/// run ends `cancelled`, the session has no agent any more).
#[tokio::test]
async fn a_cancel_interrupts_once_and_a_deaf_agent_is_killed_after_the_grace() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let run = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let receipt = world.sessions.cancel(&sid, None).await.unwrap();
    assert_eq!(
        (receipt.run_id.as_str(), receipt.state),
        (run.as_str(), CancelOutcome::Cancelling)
    );
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    // A second cancel answers without a second interrupt.
    world.sessions.cancel(&sid, None).await.unwrap();
    agent.end(RunState::Cancelled).await;
    let end = bus.until("run.end").await;
    assert_eq!(end["state"], "cancelled");
    assert!(matches!(
        world.sessions.cancel(&sid, None).await,
        Err(SessionError::RunNotFound(_))
    ));

    let deaf = world.send(&sid, "two").await.run_id;
    assert_eq!(agent.prompt().await, deaf, "no interrupt was left over");
    world.sessions.cancel(&sid, None).await.unwrap();
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    skip(CANCEL_GRACE).await;
    assert_eq!(agent.closed().await, Duration::ZERO, "killed, not closed");
    let end = bus.until("run.end").await;
    assert_eq!(end["runId"], deaf.as_str());
    assert_eq!(end["state"], "cancelled");
    assert!(
        end["message"].as_str().unwrap().contains("did not stop"),
        "{end}"
    );
    bus.until("state idle<-running").await;
    assert_eq!(world.live(&sid).await.agent_pid, None);
    // The next prompt opens a new agent on the same native session.
    world.send(&sid, "three").await;
    let mut next = world.agent().await;
    next.prompt().await;
    assert_eq!(world.opens().len(), 2);
    drop((agent, next));
    world.stop().await;
}

/// The agent goes mid-turn (it took the prompt; its driver did not end the turn): its requests
/// expire, the run fails `result_delivery_unknown` (a run being cancelled still ends
/// `cancelled`), and the next prompt resumes in a new agent.
#[tokio::test]
async fn an_agent_that_exits_mid_turn_fails_the_run_and_the_next_prompt_resumes() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.ask("p1").await;
    bus.until("state waiting<-running").await;
    agent.exit().await;
    let end = bus.until("run.end").await;
    assert_eq!(
        (&end["state"], &end["category"]),
        (&json!("failed"), &json!("result_delivery_unknown"))
    );
    bus.until("state idle<-waiting").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "session.bound",
            "permission.request",
            "state waiting<-running",
            "permission.resolved",
            "error",
            "run.end",
            "state idle<-waiting",
        ]
    );
    assert_eq!(world.live(&sid).await.agent_pid, None);

    world.send(&sid, "two").await;
    let mut agent = world.agent().await;
    assert_eq!(agent.native, Native::Resume("n1".into()));
    agent.prompt().await;
    world.sessions.cancel(&sid, None).await.unwrap();
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    agent.exit().await;
    let end = bus.until("run.end").await;
    assert_eq!(
        (&end["state"], &end["category"]),
        (&json!("cancelled"), &json!("cancelled"))
    );
    world.stop().await;
}

/// A prompt to an agent whose process went while idle (its exit not seen yet) goes to a new
/// agent.
#[tokio::test]
async fn a_prompt_to_an_agent_gone_while_idle_opens_a_new_one() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    // The driver is gone (its input closed); its events channel is not closed yet.
    let Agent {
        inputs, outputs, ..
    } = agent;
    drop(inputs);
    let run = world.send(&sid, "two").await.run_id;
    let mut next = world.agent().await;
    assert_eq!(next.native, Native::Resume("n1".into()));
    assert_eq!(next.prompt().await, run);
    next.end(RunState::Completed).await;
    let end = bus.until("run.end").await;
    assert_eq!(end["state"], "completed");
    drop((outputs, next));
    world.stop().await;
}

/// Cold → Idle by `activate`, Idle → Cold after the idle timeout (closed with its grace), and
/// the next prompt resumes the bound native session.
#[tokio::test]
async fn activate_opens_the_agent_and_an_idle_one_is_closed_then_resumed() {
    let mut world = World::start(Setup {
        idle: Some(Duration::from_secs(60)),
        ..Setup::default()
    })
    .await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let receipt = world.sessions.activate(&sid).await.unwrap();
    assert!(!receipt.already);
    assert_eq!(receipt.agent_pid, Some(PID));
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    bus.until("session.bound").await;
    assert!(world.sessions.activate(&sid).await.unwrap().already);
    world.live(&sid).await;
    skip(Duration::from_secs(60)).await;
    assert_eq!(agent.closed().await, STOP_GRACE);
    assert_eq!(world.live(&sid).await.agent_pid, None);

    world.send(&sid, "hi").await;
    let mut agent = world.agent().await;
    assert_eq!(agent.native, Native::Resume("n1".into()));
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "session.bound",
            "user.text",
            "run.start",
            "state running<-idle",
            "run.end",
            "state idle<-running",
        ]
    );
    drop(agent);
    world.stop().await;
}

/// An agent that cannot start fails the run (Opening → Cold) and the activation.
#[tokio::test]
async fn an_agent_that_cannot_start_fails_the_run() {
    let mut world = World::start(Setup::default()).await;
    *world.fake.broken.lock().unwrap() = true;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let end = bus.until("run.end").await;
    assert_eq!(
        (&end["state"], &end["category"]),
        (&json!("failed"), &json!("binary_unavailable"))
    );
    bus.until("state idle<-running").await;
    assert!(matches!(
        world.sessions.activate(&sid).await,
        Err(SessionError::AgentUnavailable(_))
    ));
    *world.fake.broken.lock().unwrap() = false;
    world.send(&sid, "two").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    drop(agent);
    world.stop().await;
}

/// A resume the agent rejects: `resume_rejected`, and the same prompt in a fresh session.
#[tokio::test]
async fn a_rejected_resume_continues_in_a_fresh_session() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.bound_session("gone").await;
    let mut bus = world.follow(&sid).await;
    let run = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    assert_eq!(agent.native, Native::Resume("gone".into()));
    assert_eq!(agent.prompt().await, run);
    agent
        .say(EventBody::RunEnd(RunEnd {
            state: RunState::Failed,
            category: Some(ErrorCategory::ResumeRejected),
            message: Some("no such session".into()),
        }))
        .await;
    let mut fresh = world.agent().await;
    assert!(matches!(fresh.native, Native::New(_)));
    assert_eq!(fresh.prompt().await, run);
    fresh.bind("n2").await;
    fresh.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "warning resume_rejected",
            "session.bound",
            "run.end",
            "state idle<-running",
        ]
    );
    assert_eq!(
        world.row(&sid).await.native_session_id.as_deref(),
        Some("n2")
    );
    drop((agent, fresh));
    world.stop().await;
}

/// Idle with a watched file (unattributed): someone writes it → drifted (warned at once); the
/// next prompt kills the child and forks.
#[tokio::test]
async fn a_file_written_under_an_idle_child_makes_the_next_prompt_fork() {
    let mut world = World::start(Setup {
        file: true,
        ..Setup::default()
    })
    .await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    // The watch starts once the child's late writes are over.
    assert!(!world.live(&sid).await.watching);
    skip(SETTLE).await;
    until_status(&world, &sid, |s| s.watching).await;
    world.write_file().await;
    let drifted = bus.until("warning session_drifted").await;
    assert!(
        drifted["message"]
            .as_str()
            .unwrap()
            .contains("written outside the host"),
        "{drifted}"
    );
    let live = world.live(&sid).await;
    assert!(live.drifted && !live.watching);

    world.send(&sid, "two").await;
    assert_eq!(agent.closed().await, Duration::ZERO, "killed, not closed");
    let mut fork = world.agent().await;
    assert_eq!(fork.native, Native::Fork("n1".into()));
    fork.bind("f1").await;
    fork.prompt().await;
    fork.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    let seen = bus.take();
    assert_eq!(
        seen[seen.len() - 8..],
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "warning forked",
            "session.forked",
            "session.bound",
            "run.end",
            "state idle<-running",
        ]
    );
    assert_eq!(
        world.row(&sid).await.native_session_id.as_deref(),
        Some("f1")
    );
    assert!(!world.live(&sid).await.drifted);
    drop((agent, fork));
    world.stop().await;
}

/// A live child whose session another process claims (the family's registry) is not
/// continued: the prompt forks (or, for a family without fork, starts a new session).
async fn a_claimed_session(caps: Capabilities) -> (Vec<String>, Native, Value) {
    let mut world = World::start(Setup {
        caps,
        ..Setup::default()
    })
    .await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    bus.take();
    world.claim(4242);
    world.send(&sid, "two").await;
    assert_eq!(agent.closed().await, Duration::ZERO);
    let mut next = world.agent().await;
    next.prompt().await;
    next.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    let seen = bus.take();
    let history = world.store.history(sid, 0, 100).await.unwrap();
    let warning = history
        .iter()
        .rev()
        .find(|e| e.kind == "warning")
        .map(|e| serde_json::from_str(&e.payload).unwrap())
        .unwrap();
    let native = next.native.clone();
    drop((agent, next));
    world.stop().await;
    (seen, native, warning)
}

#[tokio::test]
async fn a_foreign_claimant_makes_the_next_prompt_fork() {
    let (seen, native, warning) = a_claimed_session(FULL).await;
    assert_eq!(native, Native::Fork("n1".into()));
    assert_eq!(
        seen,
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "warning forked",
            "session.forked",
            "run.end",
            "state idle<-running",
        ]
    );
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .starts_with("another process (pid 4242) has the session open"),
        "{warning}"
    );
}

/// The same decision for a family whose `fork` is `Absent`: a new session, `fork_unsupported`.
#[tokio::test]
async fn an_automatic_fork_without_fork_support_starts_a_new_session() {
    let caps = Capabilities {
        fork: Support::Absent,
        ..FULL
    };
    let (seen, native, warning) = a_claimed_session(caps).await;
    assert!(matches!(native, Native::New(_)), "{native:?}");
    assert_eq!(
        seen,
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "warning fork_unsupported",
            "run.end",
            "state idle<-running",
        ]
    );
    assert_eq!(
        warning["message"],
        "another process (pid 4242) has the session open; this agent cannot fork sessions; the \
         conversation continues in a new agent session that does not have the turns of n1"
    );
}

/// A forked session of a family without fork: its first agent is a new session, with the
/// warning the ACP driver gives for an agent that declares no fork.
#[tokio::test]
async fn a_fork_of_a_family_without_fork_opens_a_new_session_with_a_warning() {
    let mut world = World::start(Setup {
        caps: Capabilities {
            fork: Support::Absent,
            ..FULL
        },
        ..Setup::default()
    })
    .await;
    let parent = world.bound_session("p1").await;
    let child = world.sessions.fork(&parent, None).await.unwrap();
    assert_eq!(child.fork_of.as_deref(), Some("p1"));
    let sid = child.session_id;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "hi").await;
    let mut agent = world.agent().await;
    assert!(matches!(agent.native, Native::New(_)), "{:?}", agent.native);
    let warning = bus.until("warning fork_unsupported").await;
    assert_eq!(
        warning["message"],
        "this agent cannot fork sessions; the conversation continues in a new agent session \
         that does not have the turns of p1"
    );
    agent.bind("c1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    let row = world.row(&sid).await;
    assert_eq!(
        (row.native_session_id.as_deref(), row.fork_of.as_deref()),
        (Some("c1"), None)
    );
    drop(agent);
    world.stop().await;
}

/// A session of a family whose `resume` is `None`: a fresh session, `resume_unsupported`.
#[tokio::test]
async fn a_resume_of_a_family_without_resume_starts_fresh_with_a_warning() {
    let mut world = World::start(Setup {
        caps: Capabilities {
            resume: ResumeKind::None,
            ..FULL
        },
        ..Setup::default()
    })
    .await;
    let sid = world.bound_session("n1").await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "hi").await;
    let mut agent = world.agent().await;
    assert!(matches!(agent.native, Native::New(_)), "{:?}", agent.native);
    let warning = bus.until("warning resume_unsupported").await;
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .ends_with("does not have the turns of n1"),
        "{warning}"
    );
    agent.prompt().await;
    drop(agent);
    world.stop().await;
}

/// A native session the family's records place elsewhere is never opened: the run fails
/// `resume_rejected` naming why, for a resume and for a fork alike; an import is refused.
#[tokio::test]
async fn a_binding_mismatch_is_refused_and_never_opened() {
    let world = World::start(Setup::default()).await;
    *world.fake.binding.lock().unwrap() = Err("it was started in /elsewhere".to_owned());
    let sid = world.bound_session("n1").await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "hi").await;
    let error = bus.until("error").await;
    assert_eq!(error["category"], "resume_rejected");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("n1") && message.contains("/elsewhere"),
        "{message}"
    );
    let end = bus.until("run.end").await;
    assert_eq!(
        (&end["state"], &end["category"]),
        (&json!("failed"), &json!("resume_rejected"))
    );
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "error",
            "run.end",
            "state idle<-running"
        ]
    );
    match world.sessions.activate(&sid).await {
        Err(SessionError::AgentUnavailable(why)) => assert!(why.contains("resume_rejected")),
        other => panic!("{other:?}"),
    }
    // A fork of it is refused the same way.
    let child = world.sessions.fork(&sid, None).await.unwrap();
    let mut bus = world.follow(&child.session_id).await;
    world.send(&child.session_id, "hi").await;
    assert_eq!(bus.until("error").await["category"], "resume_rejected");
    assert!(world.opens().is_empty(), "{:?}", world.opens());

    // An import is refused before any session is made.
    let before = world.sessions.count().await.unwrap();
    let refused = world
        .sessions
        .import(
            "fake".into(),
            "terminal-1".into(),
            world.dir.path().display().to_string(),
            None,
        )
        .await;
    let Err(e @ SessionError::BindingMismatch { .. }) = refused else {
        panic!("{refused:?}");
    };
    let reply = crate::request::errors::session_error(e);
    assert_eq!(reply.code, 3012);
    assert_eq!(reply.data["error"], "binding_mismatch");
    assert_eq!(reply.data["reason"], "native_session_elsewhere");
    assert_eq!(reply.data["native_session_id"], "terminal-1");
    assert_eq!(world.sessions.count().await.unwrap(), before);
    *world.fake.binding.lock().unwrap() = Ok(());
    let imported = world
        .sessions
        .import(
            "fake".into(),
            "terminal-1".into(),
            world.dir.path().display().to_string(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(imported.fork_of.as_deref(), Some("terminal-1"));
    world.stop().await;
}

/// The store fails mid-turn: the turn is interrupted, nothing more of it is published, new
/// prompts are refused and a queued one waits; once it commits, the cut run is closed
/// `interrupted` and the queue goes on.
#[tokio::test]
async fn a_store_outage_cuts_the_turn_and_the_queue_waits_for_the_store() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let cut = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let waiting = world.send(&sid, "two").await.run_id;
    world.store_down("disk full");
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    assert!(matches!(
        world.sessions.send(&sid, "three".into(), None).await,
        Err(SessionError::StoreUnavailable(_))
    ));
    agent
        .say(EventBody::TextEnd(crate::protocol::events::BlockEnd {
            item_id: None,
            text: "never seen".into(),
            truncated: None,
            imported: false,
        }))
        .await;
    agent.end(RunState::Cancelled).await;
    let live = until_status(&world, &sid, |s| s.run_id.is_none()).await;
    assert_eq!(live.queued, std::slice::from_ref(&waiting));
    assert_eq!(world.run_states(&sid).await[&cut], "running");

    world.store_up();
    let end = bus.until("run.end").await;
    assert_eq!(end["runId"], cut.as_str());
    assert_eq!(end["state"], "interrupted");
    assert!(
        end["message"].as_str().unwrap().contains("disk full"),
        "{end}"
    );
    assert_eq!(agent.prompt().await, waiting);
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "queue added",
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
        (states[&cut].as_str(), states[&waiting].as_str()),
        ("interrupted", "completed")
    );
    drop(agent);
    world.stop().await;
}

/// Issue 13: no run row says `running` while its events do not. The commit of a dispatch's
/// `run.start` fails (a real SQLite failure: a trigger the test adds to the database file
/// refuses it, and the store degrades): the row stays `queued`, as the log shows it, rather
/// than `running` until the store is back. Once it commits again the prompt runs, announced
/// once.
#[tokio::test]
async fn a_dispatch_whose_run_start_cannot_commit_leaves_its_row_queued() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let db = rusqlite::Connection::open(world.dir.path().join("t.db")).unwrap();
    db.busy_timeout(WAIT).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_run_start BEFORE INSERT ON messages \
         WHEN NEW.kind = 'run.start' BEGIN SELECT RAISE(ABORT, 'injected fault'); END;",
    )
    .unwrap();
    let run = world.send(&sid, "one").await.run_id;
    // The actor is serial: this is answered after the dispatch was tried.
    let live = world.live(&sid).await;
    assert_eq!(
        (live.run_id.as_deref(), live.queued.as_slice()),
        (None, std::slice::from_ref(&run))
    );
    assert_eq!(world.run_states(&sid).await[&run], "queued");
    assert_ne!(
        world.row(&sid).await.state,
        crate::protocol::states::SessionState::Running
    );

    db.execute_batch("DROP TRIGGER refuse_run_start").unwrap();
    let mut agent = world.agent().await;
    assert_eq!(agent.prompt().await, run);
    assert_eq!(world.run_states(&sid).await[&run], "running");
    let kinds: Vec<String> = world
        .store
        .run_lifecycle(sid.clone(), run.clone())
        .await
        .unwrap()
        .into_iter()
        .map(|(kind, _)| kind)
        .collect();
    assert_eq!(kinds, ["user.text", "run.start"]);
    agent.end(RunState::Completed).await;
    until_status(&world, &sid, |s| s.run_id.is_none()).await;
    drop(agent);
    world.stop().await;
}

/// A block end over the event limit reaches the log cut to fit, as its own kind (here a
/// `thinking.end`; the cut of each kind is `protocol::events`'s), never replaced by a notice:
/// its `*.start` is closed.
#[tokio::test]
async fn a_block_end_over_the_event_limit_is_published_cut() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let big = "z".repeat(crate::bus::MAX_EVENT_BYTES + 1024);
    agent
        .say(EventBody::ThinkingEnd(crate::protocol::events::BlockEnd {
            item_id: Some("th".into()),
            text: big.clone(),
            truncated: None,
            imported: false,
        }))
        .await;
    agent.end(RunState::Completed).await;
    let thinking = bus.until("thinking.end").await;
    assert_eq!(thinking["itemId"], "th");
    assert_eq!(thinking["truncated"]["fullBytes"], big.len());
    bus.until("run.end").await;
    assert!(
        !bus.take().iter().any(|k| k == "warning event_too_large"),
        "the block end was left out"
    );
    drop(agent);
    world.stop().await;
}

/// An outage while idle holds the next prompt's dispatch until the store commits.
#[tokio::test]
async fn a_store_outage_while_idle_holds_the_queue() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    // A prompt queued behind the run, then the store fails as the run ends.
    let next = world.send(&sid, "two").await.run_id;
    world.store_down("read-only");
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    agent.end(RunState::Cancelled).await;
    until_status(&world, &sid, |s| s.run_id.is_none()).await;
    // Idle, with the prompt waiting: it is not dispatched while the store is down.
    assert_eq!(world.live(&sid).await.queued, std::slice::from_ref(&next));
    world.store_up();
    assert_eq!(agent.prompt().await, next);
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    drop(agent);
    world.stop().await;
}

/// The host stops: the queue stays queued (for the next start), the turn is interrupted and
/// ends `interrupted`, the agent closed with its grace, and the session is `idle`.
#[tokio::test]
async fn a_stop_keeps_the_queue_and_interrupts_the_turn() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let run = world.send(&sid, "one").await.run_id;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let queued = world.send(&sid, "two").await.run_id;
    let sessions = world.sessions.clone();
    let stopping = tokio::spawn(async move { sessions.shutdown().await });
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    agent.end(RunState::Cancelled).await;
    assert_eq!(agent.closed().await, STOP_GRACE);
    stopping.await.unwrap();
    bus.until("state idle<-running").await;
    assert_eq!(
        bus.take(),
        [
            "user.text",
            "run.start",
            "state running<-idle",
            "queue added",
            "run.end",
            "state idle<-running",
        ]
    );
    let states = world.run_states(&sid).await;
    assert_eq!(
        (states[&run].as_str(), states[&queued].as_str()),
        ("interrupted", "queued")
    );
    let stored = world.store.queued_runs(sid.clone()).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].prompt.as_deref(), Some("two"));
    assert!(matches!(
        world.sessions.send(&sid, "late".into(), None).await,
        Err(SessionError::ShuttingDown)
    ));
    drop(agent);
    world.stop().await;
}

/// A per-turn family: the pid changes every turn (and is `None` between turns). The process a
/// driver reports is the host's own, so the family's registry naming it is not a claimant;
/// without the report, the same registry entry would be taken for someone else's.
#[tokio::test]
async fn a_per_turn_familys_processes_are_known_as_ours() {
    let me = std::process::id();
    let mut world = World::start(Setup {
        caps: Capabilities {
            process: ProcessModel::PerTurn,
            ..FULL
        },
        pid: None,
        ..Setup::default()
    })
    .await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    assert_eq!(world.sessions.activate(&sid).await.unwrap().agent_pid, None);
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    world.send(&sid, "one").await;
    agent.prompt().await;
    agent.pid(Some(me)).await;
    until_status(&world, &sid, |s| s.agent_pid == Some(me)).await;
    // The turn's process registers itself for the session (this very process plays it), and
    // may outlive the turn for a moment.
    world.claim(me);
    agent.end(RunState::Completed).await;
    agent.pid(None).await;
    bus.until("state idle<-running").await;
    until_status(&world, &sid, |s| s.agent_pid.is_none()).await;
    world.send(&sid, "two").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    assert_eq!(
        world.opens().len(),
        1,
        "our own process did not fork the session"
    );
    assert!(!bus.take().iter().any(|k| k.starts_with("warning")));

    // A driver that never reports its process: the registry's entry is someone else's.
    let other = world.session().await;
    world.send(&other, "one").await;
    let mut silent = world.agent().await;
    silent.bind("n2").await;
    silent.prompt().await;
    silent.end(RunState::Completed).await;
    let mut bus = world.follow(&other).await;
    world.send(&other, "two").await;
    assert_eq!(silent.closed().await, Duration::ZERO);
    let fork = world.agent().await;
    assert_eq!(fork.native, Native::Fork("n2".into()));
    bus.until("warning forked").await;
    drop((agent, silent, fork));
    world.stop().await;
}

/// A per-turn agent with no pid (between turns) closed while idle still leaves its baseline:
/// the next open resumes in place instead of taking the file for someone else's.
#[tokio::test]
async fn a_child_without_a_pid_still_leaves_a_baseline() {
    let mut world = World::start(Setup {
        caps: Capabilities {
            process: ProcessModel::PerTurn,
            ..FULL
        },
        pid: None,
        idle: Some(Duration::from_secs(60)),
        file: true,
        ..Setup::default()
    })
    .await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    world.live(&sid).await;
    skip(Duration::from_secs(60)).await;
    assert_eq!(agent.closed().await, STOP_GRACE);
    until_status(&world, &sid, |s| s.agent_pid.is_none() && !s.watching).await;
    assert!(
        world
            .store
            .get_baseline(sid.clone())
            .await
            .unwrap()
            .is_some()
    );
    world.send(&sid, "two").await;
    let next = world.agent().await;
    assert_eq!(next.native, Native::Resume("n1".into()));
    drop((agent, next));
    world.stop().await;
}

/// A fork that ends before it has an id of its own leaves the file still its source's: the
/// next open forks again instead of resuming a file someone else writes.
#[tokio::test]
async fn a_fork_that_dies_before_its_own_id_forks_again() {
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    world.claim(4242);
    world.send(&sid, "two").await;
    agent.closed().await;
    let mut fork = world.agent().await;
    assert_eq!(fork.native, Native::Fork("n1".into()));
    fork.prompt().await;
    fork.exit().await;
    bus.until("run.end").await;
    // Whoever held it is gone; the file is still not ours.
    world.fake.claims.lock().unwrap().clear();
    world.send(&sid, "three").await;
    let again = world.agent().await;
    assert_eq!(again.native, Native::Fork("n1".into()));
    drop((agent, again));
    world.stop().await;
}

mod attachments;
mod binding;
mod options;
/// The durable, visible, editable queue and `session.steer`.
mod queue;
mod sender;
