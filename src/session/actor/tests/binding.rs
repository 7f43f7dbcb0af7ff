//! The binding checked before every prompt (`actor::binding`): a moved workspace refuses the
//! prompt (a live agent's too), another provider forks the bound native session, a changed
//! default model is applied and recorded; an unbound session just records where it is.

use super::*;
use crate::protocol::options::ProviderIdentity;

fn git(dir: &std::path::Path, args: &[&str]) {
    assert!(
        which::which("git").is_ok(),
        "git is needed by this test (it is wherever the repository was cloned)"
    );
    let status = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

fn provider(host: &str, key: &str) -> Option<ProviderIdentity> {
    Some(ProviderIdentity {
        host: host.to_owned(),
        key_sha256: Some(crate::session::binding::key_hash(key)),
    })
}

#[tokio::test]
async fn a_moved_workspace_refuses_the_prompt_and_closes_the_live_agent() {
    let mut world = World::start(Setup::default()).await;
    let dir = world.dir.path().to_owned();
    git(&dir, &["init", "-q"]);
    git(
        &dir,
        &["remote", "add", "origin", "https://u:pw@example.com/a.git"],
    );
    let sid = world.session().await;
    let recorded = world.row(&sid).await.binding.unwrap();
    let ws = recorded.workspace.unwrap();
    assert_eq!(ws.remote.as_deref(), Some("https://example.com/a.git"));
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("run.end").await;
    bus.until("state idle<-running").await;

    git(
        &dir,
        &["remote", "set-url", "origin", "https://example.com/b.git"],
    );
    bus.take();
    world.send(&sid, "two").await;
    let warning = bus.until("warning workspace_changed").await;
    let message = warning["message"].as_str().unwrap();
    assert!(
        message.contains("https://example.com/a.git")
            && message.contains("https://example.com/b.git")
            && message.contains("session.fork")
            && message.contains("n1"),
        "{message}"
    );
    // The live agent is closed; the prompt never reached it.
    agent.closed().await;
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
            "warning workspace_changed",
            "error",
            "run.end",
            "state idle<-running"
        ]
    );
    // Every prompt is refused while the workspace stays moved; nothing is opened.
    world.send(&sid, "three").await;
    bus.until("warning workspace_changed").await;
    bus.until("run.end").await;
    assert_eq!(world.opens().len(), 1, "{:?}", world.opens());
    // The record is the workspace as it was bound.
    let still = world.row(&sid).await.binding.unwrap().workspace.unwrap();
    assert_eq!(still.remote.as_deref(), Some("https://example.com/a.git"));

    // A fork is bound to the workspace as it is, and goes on there (forking n1).
    let child = world.sessions.fork(&sid, None).await.unwrap();
    let bound = child.binding.clone().unwrap().workspace.unwrap();
    assert_eq!(bound.remote.as_deref(), Some("https://example.com/b.git"));
    let mut bus = world.follow(&child.session_id).await;
    world.send(&child.session_id, "four").await;
    let mut forked = world.agent().await;
    assert_eq!(forked.native, Native::Fork("n1".into()));
    forked.prompt().await;
    forked.end(RunState::Completed).await;
    assert_eq!(bus.until("run.end").await["state"], "completed");
    assert!(
        !bus.seen.iter().any(|s| s.starts_with("warning")),
        "{:?}",
        bus.seen
    );
}

#[tokio::test]
async fn an_unbound_session_in_a_moved_workspace_just_records_it() {
    let mut world = World::start(Setup::default()).await;
    let dir = world.dir.path().to_owned();
    git(&dir, &["init", "-q"]);
    git(
        &dir,
        &["remote", "add", "origin", "https://example.com/a.git"],
    );
    let sid = world.session().await;
    git(
        &dir,
        &["remote", "set-url", "origin", "https://example.com/b.git"],
    );
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    assert!(matches!(agent.native, Native::New(_)), "{:?}", agent.native);
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    assert_eq!(bus.until("run.end").await["state"], "completed");
    assert!(
        !bus.seen.iter().any(|s| s.starts_with("warning")),
        "{:?}",
        bus.seen
    );
    let ws = world.row(&sid).await.binding.unwrap().workspace.unwrap();
    assert_eq!(ws.remote.as_deref(), Some("https://example.com/b.git"));
}

#[tokio::test]
async fn another_provider_forks_the_bound_session_and_is_recorded() {
    let mut world = World::start(Setup::default()).await;
    *world.fake.provider.lock().unwrap() = provider("127.0.0.1:1", "key-a");
    let sid = world.bound_session("n1").await;
    assert_eq!(
        world.row(&sid).await.binding.unwrap().provider,
        provider("127.0.0.1:1", "key-a")
    );
    // The host restarted with another base URL (and key).
    *world.fake.provider.lock().unwrap() = provider("127.0.0.1:2", "key-b");
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    assert_eq!(agent.native, Native::Fork("n1".into()));
    let warning = bus.until("warning provider_changed").await;
    let message = warning["message"].as_str().unwrap();
    assert!(
        message.contains("127.0.0.1:1") && message.contains("127.0.0.1:2"),
        "{message}"
    );
    assert!(!message.contains("key-a") && !message.contains("key-b"));
    let forked = bus.until("session.forked").await;
    assert_eq!(forked["fromNativeSessionId"], "n1");
    let configured = bus.until("session.configured").await;
    assert_eq!(configured["reason"], "provider_changed");
    assert_eq!(configured["changed"], json!(["provider"]));
    agent.bind("n2").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    assert_eq!(bus.until("run.end").await["state"], "completed");
    // One warning: the provider's (not a second `forked`).
    let warnings: Vec<&String> = bus
        .seen
        .iter()
        .filter(|s| s.starts_with("warning"))
        .collect();
    assert_eq!(warnings, ["warning provider_changed"]);
    let row = world.row(&sid).await;
    assert_eq!(row.native_session_id.as_deref(), Some("n2"));
    assert_eq!(
        row.binding.unwrap().provider,
        provider("127.0.0.1:2", "key-b")
    );
}

#[tokio::test]
async fn a_changed_default_model_is_applied_as_a_new_configuration() {
    let mut world = World::start(Setup::default()).await;
    *world.fake.default_model.lock().unwrap() = Some("model-1".into());
    let sid = world.bound_session("n1").await;
    assert_eq!(
        world.row(&sid).await.binding.unwrap().model.as_deref(),
        Some("model-1")
    );
    *world.fake.default_model.lock().unwrap() = Some("model-2".into());
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    // Resumed in place: a configuration is no reason to fork.
    assert_eq!(agent.native, Native::Resume("n1".into()));
    let configured = bus.until("session.configured").await;
    assert_eq!(configured["reason"], "reconfigured");
    assert_eq!(configured["changed"], json!(["model"]));
    assert_eq!(configured["model"], "model-2");
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    assert_eq!(bus.until("run.end").await["state"], "completed");
    assert!(
        !bus.seen.iter().any(|s| s.starts_with("warning")),
        "{:?}",
        bus.seen
    );
    assert_eq!(
        world.row(&sid).await.binding.unwrap().model.as_deref(),
        Some("model-2")
    );
    // Persisted: the history has it.
    let (events, _) = world
        .sessions
        .history(&sid, crate::protocol::envelope::HistoryFrom::After(0), 100)
        .await
        .unwrap();
    let kinds: Vec<String> = events.into_iter().map(|e| e.kind).collect();
    assert!(kinds.iter().any(|k| k == "session.configured"), "{kinds:?}");
}

/// A model the live agent took (`session.set_model`, `live`) is the binding's model at once
/// (the row says what the session runs on, not only after the next open).
#[tokio::test]
async fn a_live_set_model_is_recorded_in_the_binding() {
    use crate::session::agent::{ModelSwitch, OptionCaps};
    let mut world = World::start(Setup {
        caps: Capabilities {
            options: OptionCaps {
                model: Support::Native,
                set_model: ModelSwitch::Live,
                ..OptionCaps::NONE
            },
            ..FULL
        },
        ..Setup::default()
    })
    .await;
    *world.fake.default_model.lock().unwrap() = Some("model-1".into());
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.bind("n1").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    let before = world.row(&sid).await.binding.unwrap();
    assert_eq!(before.model.as_deref(), Some("model-1"));

    let sessions = world.sessions.clone();
    let call = {
        let sid = sid.clone();
        tokio::spawn(async move { sessions.set_model(&sid, "model-2".into()).await })
    };
    match agent.input().await {
        AgentInput::SetModel { model, reply } => {
            assert_eq!(model, "model-2");
            let _ = reply.send(Ok(ModelSwitch::Live));
        }
        other => panic!("expected a model change, got {other:?}"),
    }
    let set = tokio::time::timeout(WAIT, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(set.applied, crate::protocol::events::Applied::Live);
    let after = world.row(&sid).await.binding.unwrap();
    assert_eq!(after.model.as_deref(), Some("model-2"));
    assert!(after.recorded_at_ms >= before.recorded_at_ms);
    assert_eq!(
        (after.workspace, after.provider),
        (before.workspace, before.provider)
    );
    bus.until("session.configured").await;
}

/// An import's earlier conversation (here: the warning that it cannot be read) is committed
/// before the row exists, so it is the session's first event, before any prompt; the row is
/// stored whole (its `fork_of` and binding), and its first prompt forks the imported session.
#[tokio::test]
async fn an_import_publishes_its_history_before_the_session_exists() {
    let mut world = World::start(Setup::default()).await;
    let before = world.sessions.count().await.unwrap();
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
    let sid = imported.session_id.clone();
    assert_eq!(world.sessions.count().await.unwrap(), before + 1);
    let row = world.row(&sid).await;
    assert_eq!(row.fork_of.as_deref(), Some("terminal-1"));
    assert!(row.binding.is_some());
    let mut bus = world.follow(&sid).await;
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    assert_eq!(agent.native, Native::Fork("terminal-1".into()));
    agent.bind("n2").await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("run.end").await;
    let (events, _) = world
        .sessions
        .history(&sid, crate::protocol::envelope::HistoryFrom::After(0), 100)
        .await
        .unwrap();
    let kinds: Vec<String> = events.into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("warning"),
        "{kinds:?}"
    );
    let prompt = kinds.iter().position(|k| k == "user.text").unwrap();
    assert!(prompt > 0, "{kinds:?}");
}
