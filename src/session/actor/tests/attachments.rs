//! A prompt's attachments through the session layer: checked and copied before the prompt is
//! taken (a refused one takes nothing), handed to the driver with the prompt
//! (`AgentInput::Prompt`), described on its `user.text`, kept with a queued prompt across a
//! host restart, and removed with the session.

use super::*;
use crate::protocol::options::{Attachment, AttachmentKind, AttachmentParam};
use crate::session::agent::OptionCaps;
use crate::session::attachments::AttachmentSettings;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

/// A family that takes images and files.
const ATTACHING: Capabilities = Capabilities {
    options: OptionCaps {
        images: Support::Native,
        files: Support::Native,
        ..OptionCaps::NONE
    },
    ..FULL
};

fn home(world: &World) -> PathBuf {
    world.dir.path().join("home")
}

/// The world's sessions keep attachments under `<dir>/home/attachments`.
fn attaching(mut world: World) -> World {
    let settings = AttachmentSettings {
        store_dir: Some(home(&world).join("attachments")),
        allowed_dirs: Vec::new(),
        max_bytes: 1024,
    };
    world.sessions = world.sessions.clone().with_attachments(settings);
    world
}

fn by_path(path: &str) -> AttachmentParam {
    AttachmentParam::Path {
        path: path.into(),
        mime: None,
    }
}

async fn send_attached(
    world: &World,
    sid: &str,
    text: &str,
    attachments: Vec<AttachmentParam>,
) -> Result<SendReceipt, SessionError> {
    world
        .sessions
        .send_with(sid, text.into(), None, None, attachments)
        .await
}

/// The next input is a prompt: its id and attachments.
async fn attached_prompt(agent: &mut Agent) -> (String, Vec<Attachment>) {
    match agent.input().await {
        AgentInput::Prompt {
            id, attachments, ..
        } => (id, attachments),
        other => panic!("expected a prompt, got {other:?}"),
    }
}

#[tokio::test]
async fn attachments_reach_the_driver_with_the_prompt_and_are_on_its_user_text() {
    let mut world = attaching(
        World::start(Setup {
            caps: ATTACHING,
            ..Setup::default()
        })
        .await,
    );
    let sid = world.session().await;
    std::fs::write(world.dir.path().join("shot.png"), PNG).unwrap();
    let mut bus = world.follow(&sid).await;
    let receipt = send_attached(
        &world,
        &sid,
        "what is in it?",
        vec![
            by_path("shot.png"),
            AttachmentParam::Data {
                data_base64: "aGk=".into(),
                mime: "text/plain".into(),
                name: Some("hi.txt".into()),
            },
        ],
    )
    .await
    .unwrap();
    let user = bus.until("user.text").await;
    assert_eq!(user["runId"], receipt.run_id);
    let infos = user["attachments"].as_array().unwrap();
    assert_eq!(infos.len(), 2);
    assert_eq!(infos[0]["name"], "shot.png");
    assert_eq!(infos[0]["mime"], "image/png");
    assert_eq!(infos[0]["kind"], "image");
    assert_eq!(infos[0]["bytes"], PNG.len());
    assert_eq!(infos[1]["kind"], "file");
    // Never the host's path.
    assert!(infos[0].get("path").is_none(), "{user}");

    let mut agent = world.agent().await;
    let (id, attachments) = attached_prompt(&mut agent).await;
    assert_eq!(id, receipt.run_id);
    assert_eq!(attachments.len(), 2);
    let image = &attachments[0];
    assert_eq!(
        (image.name.as_str(), image.mime.as_str(), image.kind),
        ("shot.png", "image/png", AttachmentKind::Image)
    );
    assert!(
        image
            .path
            .starts_with(home(&world).join("attachments").join(&sid)),
        "{image:?}"
    );
    assert_eq!(std::fs::read(&image.path).unwrap(), PNG);
    assert_eq!(std::fs::read(&attachments[1].path).unwrap(), b"hi");
    // The copy is the prompt's: the original may change or go.
    std::fs::remove_file(world.dir.path().join("shot.png")).unwrap();
    assert_eq!(std::fs::read(&image.path).unwrap(), PNG);
    agent.end(RunState::Completed).await;
    bus.until("run.end").await;

    // A prompt without attachments still has none.
    world.send(&sid, "plain").await;
    let user = bus.until("user.text").await;
    assert!(user.get("attachments").is_none(), "{user}");
    let (_, none) = attached_prompt(&mut agent).await;
    assert!(none.is_empty());
    agent.end(RunState::Completed).await;
    bus.until("run.end").await;

    // Deleting the session removes its copies.
    let dir = home(&world).join("attachments").join(&sid);
    assert!(dir.is_dir());
    let (sessions, id) = (world.sessions.clone(), sid.clone());
    let deleting = tokio::spawn(async move { sessions.delete(&id).await });
    agent.closed().await;
    deleting.await.unwrap().unwrap();
    assert!(!dir.exists());
    world.stop().await;
}

/// A refused attachment takes nothing: no run, no agent, no copy.
#[tokio::test]
async fn a_refused_attachment_takes_no_run() {
    let world = attaching(World::start(Setup::default()).await);
    let sid = world.session().await;
    std::fs::write(world.dir.path().join("shot.png"), PNG).unwrap();
    match send_attached(&world, &sid, "x", vec![by_path("../../etc/passwd")]).await {
        Err(SessionError::AttachmentRefused { reason, path, .. }) => {
            assert_eq!((reason, path.as_str()), ("parent_dir", "../../etc/passwd"));
        }
        other => panic!("{other:?}"),
    }
    // The family (FULL: OptionCaps::NONE) takes no images.
    match send_attached(&world, &sid, "x", vec![by_path("shot.png")]).await {
        Err(SessionError::AttachmentUnsupported { option, agent_type }) => {
            assert_eq!((option, agent_type.as_str()), ("attachments.image", "fake"));
        }
        other => panic!("{other:?}"),
    }
    assert!(world.store.list_runs(sid.clone()).await.unwrap().is_empty());
    assert!(world.fake.opens.lock().unwrap().is_empty());
    assert!(!home(&world).join("attachments").exists());
    world.stop().await;
}

/// Copies made for a prompt the session then does not take go again: a duplicate
/// (`client_msg_id` seen before) takes back its new copies and keeps the first prompt's; a
/// session being deleted gets none.
#[tokio::test]
async fn copies_of_a_prompt_not_taken_are_taken_back() {
    let mut world = attaching(
        World::start(Setup {
            caps: ATTACHING,
            ..Setup::default()
        })
        .await,
    );
    let sid = world.session().await;
    let data = |b64: &str| AttachmentParam::Data {
        data_base64: b64.into(),
        mime: "text/plain".into(),
        name: None,
    };
    let send = |b64: &'static str| {
        world.sessions.send_with(
            &sid,
            "look".into(),
            Some("msg-1".into()),
            None,
            vec![data(b64)],
        )
    };
    let first = send("aGk=").await.unwrap();
    let dir = home(&world).join("attachments").join(&sid);
    let copies = || std::fs::read_dir(&dir).map_or(0, |d| d.count());
    assert_eq!(copies(), 1);
    let again = send("aGV5").await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.run_id, first.run_id);
    assert_eq!(copies(), 1);
    let mut agent = world.agent().await;
    let (_, attachments) = attached_prompt(&mut agent).await;
    assert_eq!(std::fs::read(&attachments[0].path).unwrap(), b"hi");
    agent.end(RunState::Completed).await;

    // Being deleted: nothing is copied.
    world.sessions.lock_actors().deleting.insert(sid.clone());
    match send_attached(&world, &sid, "x", vec![data("aG8=")]).await {
        Err(SessionError::NotFound(id)) => assert_eq!(id, sid),
        other => panic!("{other:?}"),
    }
    world.sessions.lock_actors().deleting.remove(&sid);
    assert_eq!(copies(), 1);
    // The idle agent is closed by the stop (answered at once, so no grace is waited out).
    tokio::join!(world.stop(), agent.closed());
}

/// A prompt queued with attachments when the host stops runs after the restart with them.
#[tokio::test]
async fn a_queued_prompts_attachments_survive_a_restart() {
    let mut world = attaching(
        World::start(Setup {
            caps: ATTACHING,
            ..Setup::default()
        })
        .await,
    );
    let sid = world.session().await;
    std::fs::write(world.dir.path().join("shot.png"), PNG).unwrap();
    world.send(&sid, "one").await;
    let mut agent = world.agent().await;
    agent.prompt().await;
    let queued = send_attached(&world, &sid, "two", vec![by_path("shot.png")])
        .await
        .unwrap();
    assert!(queued.queued);
    let sessions = world.sessions.clone();
    let stopping = tokio::spawn(async move { sessions.shutdown().await });
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    agent.end(RunState::Cancelled).await;
    agent.closed().await;
    stopping.await.unwrap();
    drop(agent);

    let (mut world, mut bus, same) = super::queue::restart(world).await;
    assert_eq!(same, sid);
    world.sessions.recover().await.unwrap();
    let user = bus.until("user.text").await;
    assert_eq!(user["runId"], queued.run_id);
    assert_eq!(user["attachments"][0]["name"], "shot.png");
    let mut agent = world.agent().await;
    let (id, attachments) = attached_prompt(&mut agent).await;
    assert_eq!(id, queued.run_id);
    assert_eq!(attachments.len(), 1);
    assert_eq!(attachments[0].kind, AttachmentKind::Image);
    assert_eq!(std::fs::read(&attachments[0].path).unwrap(), PNG);
    agent.end(RunState::Completed).await;
    bus.until("run.end").await;
    let stopping = tokio::spawn(world.stop());
    agent.closed().await;
    stopping.await.unwrap();
}
