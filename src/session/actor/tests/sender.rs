//! Who sent a prompt: the `from` a send carries is on its `user.text`, on its queue entry and
//! `queue.changed` item, and — kept with the queued run's row — on the `user.text` it gets
//! when it runs after a host restart.

use super::*;
use crate::protocol::events::{PromptFrom, PromptVia};

fn from(via: PromptVia, subscriber: Option<&str>, client: Option<&str>) -> PromptFrom {
    PromptFrom {
        via,
        subscriber_id: subscriber.map(str::to_owned),
        client: client.map(str::to_owned),
    }
}

#[tokio::test]
async fn a_prompts_sender_is_on_its_user_text_and_survives_a_restart() {
    let web = from(PromptVia::Ws, Some("sub-web"), Some("web"));
    let web_json = serde_json::to_value(&web).unwrap();
    let mut world = World::start(Setup::default()).await;
    let sid = world.session().await;
    let mut bus = world.follow(&sid).await;
    let first = world
        .sessions
        .send_from(
            &sid,
            "one".into(),
            None,
            Some(from(PromptVia::Ipc, None, None)),
        )
        .await
        .unwrap();
    let user = bus.until("user.text").await;
    assert_eq!(user["runId"], first.run_id);
    assert_eq!(user["from"], serde_json::json!({"via": "ipc"}));
    let mut agent = world.agent().await;
    agent.prompt().await;

    // Queued behind the turn: its entry and the queue's change say who sent it.
    let queued = world
        .sessions
        .send_from(&sid, "two".into(), None, Some(web.clone()))
        .await
        .unwrap()
        .run_id;
    let added = bus.until("queue added").await;
    assert_eq!(added["queue"][0]["from"], web_json);
    let queue = world.sessions.queue(&sid).await.unwrap();
    assert_eq!(queue[0].run_id, queued);
    assert_eq!(queue[0].from.as_ref(), Some(&web));
    // A send without a sender (an in-process caller) has none.
    world.send(&sid, "three").await;
    let queue = world.sessions.queue(&sid).await.unwrap();
    assert_eq!(queue[1].from, None);

    // A graceful stop keeps the queue; the next host runs it with its sender.
    let sessions = world.sessions.clone();
    let stopping = tokio::spawn(async move { sessions.shutdown().await });
    assert!(matches!(agent.input().await, AgentInput::Interrupt));
    agent.end(RunState::Cancelled).await;
    agent.closed().await;
    stopping.await.unwrap();
    drop(agent);

    let (mut world, mut bus, same) = super::queue::restart(world).await;
    assert_eq!(same, sid);
    let stored = world.sessions.queue(&sid).await.unwrap();
    assert_eq!(stored[0].from.as_ref(), Some(&web));
    world.sessions.recover().await.unwrap();
    let restored = bus.until("queue restored").await;
    assert_eq!(restored["queue"][0]["from"], web_json);
    let user = bus.until("user.text").await;
    assert_eq!(user["runId"], queued);
    assert_eq!(user["from"], web_json);
    let mut agent = world.agent().await;
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    let user = bus.until("user.text").await;
    assert!(user.get("from").is_none(), "{user}");
    agent.prompt().await;
    agent.end(RunState::Completed).await;
    bus.until("state idle<-running").await;
    drop(agent);
    world.stop().await;
}
