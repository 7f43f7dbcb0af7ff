//! Issue 3, acceptance 4: a WebSocket subscriber that stops reading does not slow the others,
//! the host's memory stays bounded while it is stuck (measured), and when it reads again it
//! catches up with no gap. Alone in its test binary, so no other test's allocations count.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

mod common;

use agent_host::protocol::events::EventBody;
use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::ws::client::{self, WsClient};
use common::{TestHost, WAIT, item_of, text_end};
use serde_json::json;

/// Resident memory of this process, in MiB.
fn rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024
}

async fn connect(host: &TestHost) -> WsClient {
    let grant = host
        .ok(
            "subscriber.add",
            json!({"type": "local", "replay_mode": "since_cursor"}),
        )
        .await;
    let hello = pb::Hello {
        client_name: "memory".into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    client::connect(
        grant["ws_endpoint"].as_str().unwrap(),
        grant["ws_token"].as_str().unwrap(),
        hello,
    )
    .await
    .unwrap()
    .0
}

async fn next_item(ws: &mut WsClient) -> String {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next_frame())
            .await
            .expect("timed out")
            .unwrap()
            .expect("closed");
        if let Some(push) = client::event_of(&frame) {
            return item_of(&push.event_json);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_costs_bounded_memory_and_catches_up() {
    const HALF: usize = 40_000;
    const PAD: usize = 2000;
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let mut stuck = connect(&host).await;
    let mut reader = connect(&host).await;
    let reading = tokio::spawn(async move {
        for i in 0..2 * HALF {
            assert_eq!(next_item(&mut reader).await, format!("b{i}"));
        }
        reader
    });
    let pad = "x".repeat(PAD);
    let publish = |from: usize| {
        let bus = host.bus.clone();
        let session = session.clone();
        let pad = pad.clone();
        async move {
            let mut receipts = Vec::new();
            for i in from..from + HALF {
                let mut e = text_end(&session, &format!("b{i}"));
                if let EventBody::TextEnd(b) = &mut e.body {
                    b.text = pad.clone();
                }
                receipts.push(bus.publish(&e).await.unwrap());
            }
            for r in receipts {
                r.committed().await.unwrap();
            }
        }
    };
    // The first half fills every fixed-size buffer (the stuck subscriber's queue and socket,
    // the hub's ring, SQLite's caches); the second half shows whether anything keeps growing.
    publish(0).await;
    let after_first = rss_mib();
    publish(HALF).await;
    let after_second = rss_mib();
    let half_mib = (HALF * PAD) as u64 >> 20;
    eprintln!(
        "each half published {half_mib} MiB; RSS {after_first} MiB after the first, {after_second} MiB after the second"
    );
    assert!(
        after_second.saturating_sub(after_first) < half_mib / 4,
        "memory grew by {} MiB over the second {half_mib} MiB: the stuck subscriber is buffered",
        after_second - after_first
    );
    // The reading subscriber got everything although the other never read a byte.
    let reader = tokio::time::timeout(WAIT * 3, reading)
        .await
        .unwrap()
        .unwrap();
    // Now the stuck one reads: everything, in order, no gap, no duplicate.
    for i in 0..2 * HALF {
        assert_eq!(next_item(&mut stuck).await, format!("b{i}"));
    }
    reader.close().await;
    stuck.close().await;
    host.stop().await;
}
