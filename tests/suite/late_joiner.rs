//! A late joiner sees the turn so far (issue 17, acceptance 4), with the real `claude` CLI
//! against the project's mock model: a WebSocket subscriber that attaches while a slow text
//! block streams is sent the block's text so far as one delta, then the live deltas, and
//! what it got of the block is exactly its `text.end`; the same for a subscriber whose
//! connection is cut mid-block and that reconnects from its cursor. Runs in a loopback-only
//! network namespace; every wait is on an event.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use common::TestHost;
use common::world::{Family, Follower, Seen, TURN, World, connect_follower, in_netns};
use serde_json::json;

/// A subscriber of `session` with deltas and its own cursor, connected over the loopback
/// WebSocket from `cursor` (`None`: its stored one).
async fn connect(host: &TestHost, subscriber_id: &str, cursor: Option<i64>) -> Follower {
    let grant = host
        .ok("subscriber.grant", json!({"subscriber_id": subscriber_id}))
        .await;
    assert_eq!(grant["subscriber_id"], subscriber_id);
    connect_follower(&grant, "late-joiner-test", cursor).await
}

async fn new_subscriber(host: &TestHost, session: &str) -> String {
    let data = host
        .ok(
            "subscriber.add",
            json!({"type": "local", "session_id": session, "forward_deltas": true,
                   "replay_mode": "since_cursor"}),
        )
        .await;
    data["subscriber_id"].as_str().unwrap().to_owned()
}

fn is_text_delta_of(s: &Seen, item: &str) -> bool {
    s.kind() == "text.delta" && s.event["itemId"] == item
}

/// The text deltas of `item` a connection got, in order.
fn deltas_of<'a>(seen: &'a [Seen], item: &str) -> Vec<&'a Seen> {
    seen.iter().filter(|s| is_text_delta_of(s, item)).collect()
}

fn text_of(deltas: &[&Seen]) -> String {
    deltas
        .iter()
        .map(|s| s.event["text"].as_str().unwrap())
        .collect()
}

/// The mock's slow chunks are `slow N `: how many a text holds.
fn chunks(text: &str) -> usize {
    text.matches("slow ").count()
}

/// What one connection got of the block: its first delta is the text so far (several chunks,
/// every one `watcher` had seen when it attached, the latest bracket's `sequence_id`), and
/// all its deltas together are exactly the `text.end`.
fn check_connection(name: &str, seen: &[Seen], item: &str, before: &str, end_text: &str) {
    let deltas = deltas_of(seen, item);
    let first = deltas.first().unwrap_or_else(|| panic!("{name}: no delta"));
    let so_far = first.event["text"].as_str().unwrap();
    assert!(
        so_far.starts_with(before) && chunks(so_far) >= chunks(before) && chunks(so_far) >= 2,
        "{name}: the first delta is not the text so far: {so_far:?} (seen before: {before:?})"
    );
    let at = seen.iter().position(|s| std::ptr::eq(s, *first)).unwrap();
    let latest_bracket = seen[..at].iter().filter(|s| !s.delta).map(|s| s.seq).max();
    if let Some(latest) = latest_bracket {
        assert_eq!(first.seq, latest, "{name}: the snapshot's sequence id");
    }
    assert_eq!(
        text_of(&deltas),
        end_text,
        "{name}: deltas against text.end"
    );
    let end_at = seen
        .iter()
        .position(|s| s.kind() == "text.end" && s.event["itemId"] == item)
        .unwrap();
    assert!(at < end_at, "{name}: the snapshot came after the end");
    assert!(
        deltas.len() >= 2,
        "{name}: no live delta after the snapshot: the block was not joined mid-stream"
    );
}

/// Acceptance 4: attach mid-block, and reconnect mid-block from a cursor.
#[test]
fn a_late_joiner_and_a_reconnect_see_the_block_so_far_then_the_rest() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_late_joiner_and_a_reconnect_see_the_block_so_far_then_the_rest",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let host = world.host();
        // Followed from before the prompt: it sees every piece live.
        let mut watcher = world.follower(&session, true).await;
        let run = world.send(&session, "SLOW late joiner").await;
        let id = run.clone();
        let first = watcher
            .until("a delta of the slow run", TURN, |s| {
                s.kind() == "text.delta" && s.run_id == id
            })
            .await;
        let item = first.event["itemId"].as_str().unwrap().to_owned();
        for _ in 0..2 {
            watcher
                .until("more of the slow block", TURN, |s| {
                    is_text_delta_of(s, &item)
                })
                .await;
        }

        // 1. A subscriber attaching now: the replay (user.text … text.start), the block so far
        //    as one delta, then live.
        let seen_before_attach = text_of(&deltas_of(&watcher.seen, &item));
        let late_id = new_subscriber(host, &session).await;
        let mut late = connect(host, &late_id, None).await;
        late.until("the block so far", TURN, |s| is_text_delta_of(s, &item))
            .await;
        assert!(
            late.seen
                .iter()
                .any(|s| s.kind() == "text.start" && s.event["itemId"] == item),
            "the replay holds the block's start: {:?}",
            late.kinds()
        );
        // Two live pieces after it, then the connection is cut (no close handshake).
        for _ in 0..2 {
            late.until("a live piece", TURN, |s| is_text_delta_of(s, &item))
                .await;
        }
        let cut = late
            .seen
            .iter()
            .filter(|s| !s.delta)
            .map(|s| s.seq)
            .max()
            .unwrap();
        let first_connection = std::mem::take(&mut late.seen);
        assert!(
            !first_connection.iter().any(|s| s.kind() == "text.end"),
            "the block ended before the cut"
        );
        drop(late);

        // 2. It reconnects from its cursor: the brackets after it, the block from its start
        //    as one delta, then live.
        let seen_before_reconnect = text_of(&deltas_of(&watcher.seen, &item));
        let mut again = connect(host, &late_id, Some(cut)).await;
        let end = again
            .until("text.end of the slow block", TURN, |s| {
                s.kind() == "text.end" && s.event["itemId"] == item
            })
            .await;
        let end_text = end.event["text"].as_str().unwrap().to_owned();
        assert_eq!(chunks(&end_text), 40, "{end_text}");
        assert!(
            again.seen.iter().all(|s| s.delta || s.seq > cut),
            "a bracket at or before the cursor came again"
        );
        watcher
            .until("text.end on the watcher", TURN, |s| {
                s.kind() == "text.end" && s.event["itemId"] == item
            })
            .await;

        // The first connection: the text so far, then live pieces, all of it a prefix.
        let first_deltas = deltas_of(&first_connection, &item);
        let snapshot = first_deltas[0].event["text"].as_str().unwrap();
        assert!(
            snapshot.starts_with(&seen_before_attach) && chunks(snapshot) >= 3,
            "attach: {snapshot:?} after {seen_before_attach:?}"
        );
        assert!(first_deltas.len() >= 3);
        assert!(end_text.starts_with(&text_of(&first_deltas)));
        // The reconnection: the same, and exactly the end.
        check_connection(
            "reconnect",
            &again.seen,
            &item,
            &seen_before_reconnect,
            &end_text,
        );
        assert!(
            chunks(
                deltas_of(&again.seen, &item)[0].event["text"]
                    .as_str()
                    .unwrap()
            ) >= chunks(&text_of(&first_deltas)),
            "the reconnect's first delta holds the block from its start"
        );
        // The watcher got every piece one by one.
        let pieces = deltas_of(&watcher.seen, &item);
        assert_eq!(pieces.len(), 40);
        assert_eq!(text_of(&pieces), end_text);

        // 3. Once the block ended, a new subscriber gets no delta of it: the end has the text.
        let after_id = new_subscriber(host, &session).await;
        let mut after = connect(host, &after_id, None).await;
        after
            .until("text.end in the replay", TURN, |s| {
                s.kind() == "text.end" && s.event["itemId"] == item
            })
            .await;
        let id = run.clone();
        watcher
            .until("run.end", TURN, |s| s.kind() == "run.end" && s.run_id == id)
            .await;
        let id = run.clone();
        after
            .until("run.end", TURN, |s| s.kind() == "run.end" && s.run_id == id)
            .await;
        assert!(
            !after.seen.iter().any(|s| s.delta),
            "deltas after the block ended: {:?}",
            after.kinds()
        );
        world.host.unwrap().stop().await;
    });
}
