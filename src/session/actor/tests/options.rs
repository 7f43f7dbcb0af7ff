//! A session's options: checked at create against the family's declared caps (nothing is made
//! when one is refused), stored on the row and given to every agent opened, inherited by a
//! fork; and `session.set_model` taken live, by the next turn, or by a restart of the agent
//! (at once when idle, after the running run otherwise), each said by a `session.configured`.

use super::*;
use crate::protocol::events::Applied;
use crate::protocol::options::{McpServer, PermissionMode, SessionOptions};
use crate::session::ModelSet;
use crate::session::agent::{ModelSwitch, OptionCaps};

const ALL: OptionCaps = OptionCaps {
    model: Support::Native,
    set_model: ModelSwitch::Live,
    system_prompt: Support::Native,
    mcp_stdio: Support::Native,
    mcp_http: Support::Native,
    mcp_sse: Support::Native,
    permission_modes: &[
        PermissionMode::Ask,
        PermissionMode::AcceptEdits,
        PermissionMode::Bypass,
    ],
    images: Support::Native,
    files: Support::Native,
    system_prompt_on_fork: true,
};

fn caps(options: OptionCaps) -> Capabilities {
    Capabilities { options, ..FULL }
}

fn everything() -> SessionOptions {
    SessionOptions {
        model: Some("m1".into()),
        system_prompt: Some("Answer in French.".into()),
        mcp_servers: vec![McpServer::Stdio {
            name: "probe".into(),
            command: "node".into(),
            args: vec!["/tmp/probe.mjs".into()],
            env: Vec::new(),
        }],
        permission_mode: Some(PermissionMode::AcceptEdits),
    }
}

impl World {
    async fn create_with(&self, options: SessionOptions) -> Result<String, SessionError> {
        self.sessions
            .create(NewSession {
                agent_type: "fake".into(),
                cwd: self.dir.path().display().to_string(),
                title: None,
                options,
            })
            .await
            .map(|row| row.session_id)
    }

    /// `session.set_model`, running while the test plays the agent.
    fn start_set_model(&self, sid: &str, model: &str) -> SetModelCall {
        let sessions = self.sessions.clone();
        let (sid, model) = (sid.to_owned(), model.to_owned());
        SetModelCall(tokio::spawn(async move {
            sessions.set_model(&sid, model).await
        }))
    }

    /// `session.set_model` to a session with no live agent, or one not asked.
    async fn set_model(&self, sid: &str, model: &str) -> Result<ModelSet, SessionError> {
        self.start_set_model(sid, model).answer().await
    }
}

struct SetModelCall(tokio::task::JoinHandle<Result<ModelSet, SessionError>>);

impl SetModelCall {
    async fn answer(self) -> Result<ModelSet, SessionError> {
        tokio::time::timeout(WAIT, self.0).await.unwrap().unwrap()
    }
}

impl Agent {
    /// The next input is a model change: answered with `answer`.
    async fn model_change(&mut self, answer: Result<ModelSwitch, AdapterError>) -> String {
        match self.input().await {
            AgentInput::SetModel { model, reply } => {
                let _ = reply.send(answer);
                model
            }
            other => panic!("expected a model change, got {other:?}"),
        }
    }
}

/// Every option is stored on the row, read back by `session.get`'s row, and given to the
/// agent the first prompt opens.
#[tokio::test]
async fn options_are_stored_and_given_to_every_agent_opened() {
    let mut world = World::start(Setup {
        caps: caps(ALL),
        ..Setup::default()
    })
    .await;
    let sid = world.create_with(everything()).await.unwrap();
    assert_eq!(world.row(&sid).await.options, everything());
    let stored = world.store.get_session(sid.clone()).await.unwrap().unwrap();
    assert_eq!(stored.options, everything());
    let json = serde_json::to_value(&stored).unwrap();
    assert_eq!(json["options"]["model"], "m1");
    assert_eq!(json["options"]["mcp_servers"][0]["type"], "stdio");
    assert_eq!(json["options"]["permission_mode"], "accept_edits");

    world.send(&sid, "one").await;
    let agent = world.agent().await;
    assert_eq!(agent.options, everything());
    drop(agent);
    world.stop().await;
}

/// A family that declares no option refuses each, by name, and nothing is created; a bypass
/// needs `allow_bypass`.
#[tokio::test]
async fn an_option_the_family_cannot_take_creates_nothing() {
    let world = World::start(Setup::default()).await;
    match world.create_with(everything()).await {
        Err(SessionError::OptionUnsupported {
            option, agent_type, ..
        }) => assert_eq!((option.as_str(), agent_type.as_str()), ("model", "fake")),
        other => panic!("{other:?}"),
    }
    let invalid = SessionOptions {
        model: Some("two words".into()),
        ..Default::default()
    };
    assert!(matches!(
        world.create_with(invalid).await,
        Err(SessionError::InvalidParams(_))
    ));
    assert!(world.sessions.list().await.unwrap().is_empty());
    world.stop().await;

    let world = World::start(Setup {
        caps: caps(ALL),
        ..Setup::default()
    })
    .await;
    let bypass = SessionOptions {
        permission_mode: Some(PermissionMode::Bypass),
        ..Default::default()
    };
    assert!(matches!(
        world.create_with(bypass.clone()).await,
        Err(SessionError::BypassNotAllowed)
    ));
    assert!(world.sessions.list().await.unwrap().is_empty());
    let allowed = world.sessions.clone().with_allow_bypass(true);
    let row = allowed
        .create(NewSession {
            agent_type: "fake".into(),
            cwd: world.dir.path().display().to_string(),
            title: None,
            options: bypass.clone(),
        })
        .await
        .unwrap();
    assert_eq!(row.options, bypass);
    world.stop().await;
}

/// A fork runs as its parent: the same options on its row and its agent.
#[tokio::test]
async fn a_fork_inherits_its_parents_options() {
    let mut world = World::start(Setup {
        caps: caps(ALL),
        ..Setup::default()
    })
    .await;
    let parent = world.create_with(everything()).await.unwrap();
    world
        .store
        .set_native_session_id(parent.clone(), "n1".into())
        .await
        .unwrap();
    let child = world.sessions.fork(&parent, None).await.unwrap();
    assert_eq!(child.options, everything());
    world.send(&child.session_id, "one").await;
    let agent = world.agent().await;
    assert_eq!(agent.native, Native::Fork("n1".into()));
    assert_eq!(agent.options, everything());
    drop(agent);
    world.stop().await;
}

/// The live agent takes the model at once, or says its next turn will: no agent is opened
/// again, the row has the new model, and `session.configured` says how.
#[tokio::test]
async fn set_model_is_taken_live_or_by_the_next_turn() {
    for (answer, applied) in [
        (ModelSwitch::Live, Applied::Live),
        (ModelSwitch::NextTurn, Applied::NextTurn),
    ] {
        let mut world = World::start(Setup {
            caps: caps(ALL),
            ..Setup::default()
        })
        .await;
        let sid = world.create_with(everything()).await.unwrap();
        let mut bus = world.follow(&sid).await;
        world.send(&sid, "one").await;
        let mut agent = world.agent().await;
        agent.bind("n1").await;
        agent.prompt().await;
        agent.end(RunState::Completed).await;
        bus.until("state idle<-running").await;

        let call = world.start_set_model(&sid, "m2");
        assert_eq!(agent.model_change(Ok(answer)).await, "m2");
        let set = call.answer().await.unwrap();
        assert_eq!(set.applied, applied);
        assert_eq!(set.model, "m2");
        let configured = bus.until("session.configured").await;
        assert_eq!(configured["reason"], "set_model");
        assert_eq!(configured["changed"], json!(["model"]));
        assert_eq!(configured["model"], "m2");
        assert_eq!(
            configured["applied"],
            serde_json::to_value(applied).unwrap()
        );
        assert!(configured.get("runId").is_none());
        let row = world.row(&sid).await;
        assert_eq!(row.options.model.as_deref(), Some("m2"));
        assert_eq!(row.options.system_prompt, everything().system_prompt);

        let two = world.send(&sid, "two").await;
        assert_eq!(agent.prompt().await, two.run_id);
        assert_eq!(world.opens().len(), 1, "the same agent took the next turn");
        drop(agent);
        world.stop().await;
    }
}

/// With no agent live, the next open has the new model.
#[tokio::test]
async fn set_model_before_any_agent_is_for_the_next_open() {
    let mut world = World::start(Setup {
        caps: caps(ALL),
        ..Setup::default()
    })
    .await;
    let sid = world.create_with(everything()).await.unwrap();
    let set = world.set_model(&sid, "m2").await.unwrap();
    assert_eq!(set.applied, Applied::NextTurn);
    world.send(&sid, "one").await;
    let agent = world.agent().await;
    assert_eq!(agent.options.model.as_deref(), Some("m2"));
    drop(agent);
    world.stop().await;
}

/// An agent that cannot take the model live is restarted: at once when idle; after its run
/// when one is running (it is never closed under its turn). The next prompt resumes the
/// session in a new agent opened with the new model.
#[tokio::test]
async fn set_model_the_agent_refuses_restarts_it() {
    for during_a_run in [false, true] {
        let mut world = World::start(Setup {
            caps: caps(ALL),
            ..Setup::default()
        })
        .await;
        let sid = world.create_with(everything()).await.unwrap();
        let mut bus = world.follow(&sid).await;
        world.send(&sid, "one").await;
        let mut agent = world.agent().await;
        agent.bind("n1").await;
        agent.prompt().await;
        if !during_a_run {
            agent.end(RunState::Completed).await;
            bus.until("state idle<-running").await;
        }
        let refused = Err(AdapterError::new(
            ErrorCategory::ProtocolIncompatible,
            "this agent takes a model only at start",
        ));
        let call = world.start_set_model(&sid, "m2");
        agent.model_change(refused).await;
        if during_a_run {
            let set = call.answer().await.unwrap();
            assert_eq!(set.applied, Applied::Restart);
            // The turn goes on in the agent it began in, which is closed once it ends.
            assert!(world.live(&sid).await.run_id.is_some());
            agent.end(RunState::Completed).await;
            agent.closed().await;
        } else {
            // Idle: closed at once, before the answer.
            agent.closed().await;
            let set = call.answer().await.unwrap();
            assert_eq!(set.applied, Applied::Restart);
        }
        let configured = bus.until("session.configured").await;
        assert_eq!(configured["applied"], "restart");
        let two = world.send(&sid, "two").await;
        let mut next = world.agent().await;
        assert_eq!(next.native, Native::Resume("n1".into()));
        assert_eq!(next.options.model.as_deref(), Some("m2"));
        assert_eq!(next.prompt().await, two.run_id);
        drop((agent, next));
        world.stop().await;
    }
}

/// A family that takes a model only at start is not asked: its idle agent is restarted.
#[tokio::test]
async fn a_restart_family_is_restarted_without_asking() {
    let mut world = World::start(Setup {
        caps: caps(OptionCaps {
            set_model: ModelSwitch::Restart,
            ..ALL
        }),
        ..Setup::default()
    })
    .await;
    let sid = world.create_with(everything()).await.unwrap();
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    let call = world.start_set_model(&sid, "m2");
    agent.closed().await;
    assert_eq!(call.answer().await.unwrap().applied, Applied::Restart);
    assert_eq!(world.opens().len(), 1);
    drop(agent);
    world.stop().await;
}

/// A family that cannot switch models refuses `session.set_model`, and nothing changes.
#[tokio::test]
async fn set_model_where_the_family_cannot_switch_changes_nothing() {
    let world = World::start(Setup {
        caps: caps(OptionCaps {
            set_model: ModelSwitch::None,
            ..ALL
        }),
        ..Setup::default()
    })
    .await;
    let sid = world.create_with(everything()).await.unwrap();
    match world.sessions.set_model(&sid, "m2".into()).await {
        Err(SessionError::OptionUnsupported { option, .. }) => assert_eq!(option, "model"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        world.sessions.set_model(&sid, "".into()).await,
        Err(SessionError::InvalidParams(_))
    ));
    assert!(matches!(
        world.sessions.set_model("nope", "m2".into()).await,
        Err(SessionError::NotFound(_))
    ));
    assert_eq!(world.row(&sid).await.options.model.as_deref(), Some("m1"));
    world.stop().await;
}

/// A bypass session made while the host allowed it opens no agent once `allow_bypass` is off:
/// its prompt fails `permission_denied`, saying why; the host that allows it opens one.
#[tokio::test]
async fn a_bypass_session_opens_no_agent_once_bypass_is_not_allowed() {
    let mut world = World::start(Setup {
        caps: caps(ALL),
        ..Setup::default()
    })
    .await;
    let bypass = SessionOptions {
        permission_mode: Some(PermissionMode::Bypass),
        ..Default::default()
    };
    let allowed = world.sessions.clone().with_allow_bypass(true);
    let new = || NewSession {
        agent_type: "fake".into(),
        cwd: world.dir.path().display().to_string(),
        title: None,
        options: bypass.clone(),
    };
    // Made while allowed; prompted by a host that no longer allows it.
    let refused = allowed.create(new()).await.unwrap().session_id;
    let mut follow = world.follow(&refused).await;
    world.send(&refused, "one").await;
    let end = follow.until("run.end").await;
    assert_eq!(end["state"], "failed", "{end}");
    assert_eq!(end["category"], "permission_denied", "{end}");
    let message = end["message"].as_str().unwrap_or_default();
    assert!(message.contains("allow_bypass"), "{message}");
    assert!(world.opens().is_empty(), "{:?}", world.opens());
    // The host that allows it opens the agent, with the mode.
    let taken = allowed.create(new()).await.unwrap().session_id;
    allowed.send(&taken, "two".to_owned(), None).await.unwrap();
    let agent = world.agent().await;
    assert_eq!(agent.options, bypass);
    drop(agent);
    world.stop().await;
}
