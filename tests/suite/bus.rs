//! The bus against a real SQLite file: ordering, fan-out, the stuck subscriber, catch-up,
//! replay modes and cursors across a restart (issue 2, acceptance 4).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_host::bus::{Bus, BusTasks, Delivery, Replay, SubscribeOptions, Subscription};
use agent_host::protocol::events::{BlockEnd, BlockStart, Event, EventBody, TextDelta};
use agent_host::store::{SessionFilter, Store, StoreThreads, SubscriberRow};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

struct Host {
    store: Store,
    threads: StoreThreads,
    bus: Bus,
    tasks: BusTasks,
}

async fn open(dir: &Path) -> Host {
    let (store, threads) = Store::open(&dir.join("host.db")).unwrap();
    let (bus, tasks) = Bus::start(store.clone()).await.unwrap();
    Host {
        store,
        threads,
        bus,
        tasks,
    }
}

async fn close(host: Host) {
    drop(host.bus);
    host.tasks.shutdown().await;
    drop(host.store);
    host.threads.shutdown().await;
}

fn run() -> Option<String> {
    Some("run-1".to_owned())
}

fn start(session: &str, item: &str) -> Event {
    Event::new(
        session,
        run(),
        EventBody::TextStart(BlockStart {
            item_id: Some(item.to_owned()),
        }),
    )
}

fn delta(session: &str, item: &str, text: &str) -> Event {
    Event::new(
        session,
        run(),
        EventBody::TextDelta(TextDelta {
            item_id: Some(item.to_owned()),
            text: text.to_owned(),
        }),
    )
}

fn end(session: &str, item: &str) -> Event {
    Event::new(
        session,
        run(),
        EventBody::TextEnd(BlockEnd {
            truncated: None,
            item_id: Some(item.to_owned()),
            text: format!("whole text of {item}"),
            imported: false,
        }),
    )
}

/// A stable identity for an event, the same before publishing and after delivery.
fn key_of_json(json: &str) -> String {
    let v: Value = serde_json::from_str(json).unwrap();
    format!(
        "{}|{}|{}",
        v["k"].as_str().unwrap(),
        v["itemId"].as_str().unwrap_or(""),
        if v["k"] == "text.delta" {
            v["text"].as_str().unwrap_or("")
        } else {
            ""
        }
    )
}

fn key(event: &Event) -> String {
    key_of_json(&serde_json::to_string(event).unwrap())
}

async fn recv(sub: &mut Subscription) -> Arc<Delivery> {
    tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("timed out waiting for an event")
        .unwrap()
        .expect("bus closed")
}

/// Subscribe without a durable row.
async fn subscribe(
    host: &Host,
    filter: SessionFilter,
    forward_deltas: bool,
    replay: Replay,
) -> Subscription {
    host.bus
        .subscribe(subscribe_opts(filter, forward_deltas, replay))
        .await
        .unwrap()
}

fn subscribe_opts(filter: SessionFilter, forward_deltas: bool, replay: Replay) -> SubscribeOptions {
    SubscribeOptions {
        filter,
        forward_deltas,
        replay,
        subscriber_id: None,
    }
}

/// Check one subscriber's stream against what each session published:
/// `sequence_id` never decreases, no message twice, every bracket of every followed session
/// present and in order, and per block the deltas it got are exactly the block's published
/// pieces concatenated, from the first: a delta may coalesce consecutive pieces (a subscriber
/// that joined or fell behind mid-block), but nothing may be missing at the start or in the
/// middle, nothing come twice, and nothing come after the block's end. With `exact`, nothing
/// may be missing at the end either (a subscriber that never lagged nor dropped a delta);
/// otherwise a block's tail may be left to its end bracket, which carries the whole text.
fn check_stream(
    name: &str,
    got: &[Arc<Delivery>],
    published: &HashMap<String, Vec<(String, bool)>>,
    filter: &SessionFilter,
    forward_deltas: bool,
    exact: bool,
) {
    let mut last_seq = 0;
    let mut seen = HashSet::new();
    let mut per_session: HashMap<&str, Vec<(String, bool)>> = HashMap::new();
    for d in got {
        assert!(
            d.sequence_id >= last_seq,
            "{name}: sequence_id went back from {last_seq} to {}",
            d.sequence_id
        );
        last_seq = d.sequence_id;
        assert!(seen.insert(d.message_id.clone()), "{name}: duplicate {d:?}");
        assert!(
            filter.matches(&d.session_id),
            "{name}: foreign session {d:?}"
        );
        if d.is_delta {
            assert!(forward_deltas, "{name}: got a delta without forward_deltas");
        }
        per_session
            .entry(&d.session_id)
            .or_default()
            .push((key_of_json(&d.json), d.is_delta));
    }
    // (kind, item, text) of a key.
    let parts = |k: &str| -> (String, String, String) {
        let mut it = k.splitn(3, '|');
        let mut next = || it.next().unwrap_or_default().to_owned();
        (next(), next(), next())
    };
    for (session, expected) in published {
        if !filter.matches(session) {
            continue;
        }
        let received = per_session.remove(session.as_str()).unwrap_or_default();
        // Brackets: the received ones are the published ones, in order, none skipped.
        let want: Vec<&String> = expected
            .iter()
            .filter(|(_, d)| !d)
            .map(|(k, _)| k)
            .collect();
        let have: Vec<&String> = received
            .iter()
            .filter(|(_, d)| !d)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            want, have,
            "{name}/{session}: brackets missing, extra or out of order"
        );
        // Deltas, per block.
        let mut pieces: HashMap<String, String> = HashMap::new();
        for (k, is_delta) in expected {
            if *is_delta {
                let (_, item, text) = parts(k);
                pieces.entry(item).or_default().push_str(&text);
            }
        }
        let mut streamed: HashMap<String, String> = HashMap::new();
        let mut ended: HashSet<String> = HashSet::new();
        for (k, is_delta) in &received {
            let (kind, item, text) = parts(k);
            if !is_delta {
                if kind == "text.end" {
                    ended.insert(item);
                }
                continue;
            }
            assert!(
                !ended.contains(&item),
                "{name}/{session}: delta {k} after its block's end"
            );
            let so_far = streamed.entry(item.clone()).or_default();
            so_far.push_str(&text);
            let whole = pieces.get(&item).map_or("", String::as_str);
            assert!(
                whole.starts_with(so_far.as_str()),
                "{name}/{session}/{item}: got {so_far:?}, not a start of {whole:?} (a gap, \
                 a duplicate or a missing head)"
            );
        }
        if exact && forward_deltas {
            for (item, whole) in &pieces {
                let so_far = streamed.get(item).map_or("", String::as_str);
                assert_eq!(so_far, whole, "{name}/{session}/{item}: tail missing");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_sessions_reach_every_subscriber_in_order_and_the_stuck_one_catches_up() {
    const SESSIONS: usize = 3;
    const ROUNDS: usize = 400; // 2 brackets + 3 deltas per round: 2400 brackets in all
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;

    // name, filter, forward_deltas, yields per event (a slow reader keeps falling behind and
    // catching up from SQLite while the publishers are still going).
    let readers = [
        ("all+deltas", SessionFilter::All, true, 0),
        ("all", SessionFilter::All, false, 0),
        ("s1+deltas", SessionFilter::One("s1".into()), true, 0),
        ("all+deltas-2", SessionFilter::All, true, 0),
        ("slow", SessionFilter::All, true, 20),
    ];
    let mut reader_tasks = Vec::new();
    for (name, filter, deltas, yields) in readers.clone() {
        let mut sub = subscribe(&host, filter.clone(), deltas, Replay::None).await;
        let brackets = match filter {
            SessionFilter::All => SESSIONS * ROUNDS * 2 + 1, // + the warm-up
            SessionFilter::One(_) => ROUNDS * 2,
        };
        reader_tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut n = 0;
            while n < brackets {
                let d = recv(&mut sub).await;
                if !d.is_delta {
                    n += 1;
                }
                got.push(d);
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
            }
            (
                name,
                filter,
                deltas,
                got,
                sub.catch_ups(),
                sub.deltas_dropped(),
            )
        }));
    }
    // Subscribed like the others, goes live on a first event, then reads nothing more until
    // everything else is done.
    let mut stuck = subscribe(&host, SessionFilter::All, true, Replay::None).await;
    let warmup = start("warm", "warmup");
    host.bus
        .publish(&warmup)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    assert_eq!(key_of_json(&recv(&mut stuck).await.json), key(&warmup));
    assert!(stuck.is_live());

    let mut publishers = Vec::new();
    for s in 0..SESSIONS {
        let bus = host.bus.clone();
        publishers.push(tokio::spawn(async move {
            let session = format!("s{s}");
            let mut published = Vec::new();
            let mut receipts = Vec::new();
            for i in 0..ROUNDS {
                let item = format!("{session}-{i}");
                let mut events = vec![start(&session, &item)];
                for j in 0..3 {
                    events.push(delta(&session, &item, &format!("{item}-{j}")));
                }
                events.push(end(&session, &item));
                for e in events {
                    published.push((key(&e), !e.is_bracket()));
                    receipts.push(bus.publish(&e).await.unwrap());
                    // Spread publishing out so slow readers lag and catch up while it goes on.
                    tokio::task::yield_now().await;
                }
            }
            for r in receipts {
                r.committed().await.unwrap();
            }
            (session, published)
        }));
    }
    let mut published = HashMap::new();
    published.insert("warm".to_owned(), vec![(key(&warmup), false)]);
    for p in publishers {
        let (session, events) = p.await.unwrap();
        published.insert(session, events);
    }
    // Every reader finished although the stuck subscriber's queue (1024) was full the whole
    // time: the hub never waits for a subscriber.
    for task in reader_tasks {
        let (name, filter, deltas, got, catch_ups, dropped) =
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        let exact = catch_ups == 0 && dropped == 0;
        check_stream(name, &got, &published, &filter, deltas, exact);
        eprintln!(
            "{name}: {} events, {catch_ups} catch-ups, {dropped} deltas dropped",
            got.len()
        );
    }

    // Now the stuck one reads: its queue holds the first 1024 events, then the lag marker, then
    // catch-up from SQLite. It must see every bracket once, in order.
    let total_brackets = SESSIONS * ROUNDS * 2;
    let mut got = Vec::new();
    let mut n = 0;
    while n < total_brackets {
        let d = recv(&mut stuck).await;
        if !d.is_delta {
            n += 1;
        }
        got.push(d);
    }
    assert!(
        stuck.catch_ups() >= 1,
        "the stuck subscriber never overflowed"
    );
    let mut after_warmup = published.clone();
    after_warmup.remove("warm");
    check_stream(
        "stuck",
        &got,
        &after_warmup,
        &SessionFilter::All,
        true,
        false,
    );
    // Back to live after catching up: a new event arrives through the queue.
    let marker = end("s0", "after-catch-up");
    host.bus
        .publish(&marker)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    let d = recv(&mut stuck).await;
    assert_eq!(key_of_json(&d.json), key(&marker));
    assert!(stuck.is_live());
    close(host).await;
}

#[tokio::test]
async fn deltas_go_only_where_asked_and_carry_the_latest_bracket() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let mut with = subscribe(&host, SessionFilter::All, true, Replay::None).await;
    let mut without = subscribe(&host, SessionFilter::All, false, Replay::None).await;
    // Both go live before anything is published, so the deltas reach them live.
    host.bus
        .publish(&start("a", "warmup"))
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    recv(&mut with).await;
    recv(&mut without).await;

    let b1 = host.bus.publish(&start("a", "x")).await.unwrap();
    host.bus.publish(&delta("a", "x", "he")).await.unwrap();
    host.bus.publish(&delta("a", "x", "llo")).await.unwrap();
    let b2 = host.bus.publish(&end("a", "x")).await.unwrap();
    let seq1 = b1.committed().await.unwrap().unwrap();
    let seq2 = b2.committed().await.unwrap().unwrap();
    assert!(seq2 > seq1);

    let got: Vec<_> = [
        recv(&mut with).await,
        recv(&mut with).await,
        recv(&mut with).await,
        recv(&mut with).await,
    ]
    .into_iter()
    .map(|d| (d.kind.to_string(), d.sequence_id, d.is_delta))
    .collect();
    assert_eq!(
        got,
        vec![
            ("text.start".into(), seq1, false),
            ("text.delta".into(), seq1, true),
            ("text.delta".into(), seq1, true),
            ("text.end".into(), seq2, false),
        ]
    );
    let a = recv(&mut without).await;
    let b = recv(&mut without).await;
    assert_eq!((a.sequence_id, b.sequence_id), (seq1, seq2));
    assert!(!a.is_delta && !b.is_delta);

    // Deltas are never stored: history holds only the brackets.
    let stored = host.store.history("a".into(), 0, 100).await.unwrap();
    assert_eq!(
        stored.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        vec!["text.start", "text.start", "text.end"]
    );
    close(host).await;
}

#[tokio::test]
async fn replay_modes_and_cursor_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    host.store
        .insert_subscriber(SubscriberRow {
            subscriber_id: "sub-1".into(),
            kind: "local".into(),
            session_id: None,
            forward_deltas: false,
            replay_mode: "since_cursor".into(),
            max_count: 200,
            most_recent_sequence_id: 0,
            deltas_dropped: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            scope: None,
            client: None,
        })
        .await
        .unwrap();
    let mut published = Vec::new();
    let mut seqs = Vec::new();
    for i in 0..50 {
        let e = end("s", &format!("m{i}"));
        published.push(key(&e));
        seqs.push(
            host.bus
                .publish(&e)
                .await
                .unwrap()
                .committed()
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let mut sub = host
        .bus
        .subscribe(SubscribeOptions {
            subscriber_id: Some("sub-1".into()),
            ..subscribe_opts(SessionFilter::All, false, Replay::SinceCursor(0))
        })
        .await
        .unwrap();
    for (i, want) in published.iter().take(20).enumerate() {
        let d = recv(&mut sub).await;
        assert_eq!(&key_of_json(&d.json), want);
        assert_eq!(d.sequence_id, seqs[i]);
    }
    sub.ack(seqs[19]).await.unwrap();
    drop(sub);
    close(host).await;

    // A new host process on the same file: the cursor is where the ack left it.
    let host = open(dir.path()).await;
    let row = host
        .store
        .get_subscriber("sub-1".into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.most_recent_sequence_id, seqs[19]);
    let mut sub = subscribe(
        &host,
        SessionFilter::All,
        false,
        Replay::SinceCursor(row.most_recent_sequence_id),
    )
    .await;
    let mut none = subscribe(&host, SessionFilter::All, false, Replay::None).await;
    let mut last10 = subscribe(&host, SessionFilter::All, false, Replay::MaxCount(10)).await;
    let mut only_other = subscribe(
        &host,
        SessionFilter::One("other".into()),
        false,
        Replay::MaxCount(10),
    )
    .await;
    let marker = end("s", "marker");
    host.bus
        .publish(&marker)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    let other = end("other", "o1");
    host.bus
        .publish(&other)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();

    // since_cursor: exactly brackets 21..50, then the live marker, nothing in between.
    for want in &published[20..] {
        assert_eq!(&key_of_json(&recv(&mut sub).await.json), want);
    }
    assert_eq!(key_of_json(&recv(&mut sub).await.json), key(&marker));
    // none: nothing from before, the marker first.
    assert_eq!(key_of_json(&recv(&mut none).await.json), key(&marker));
    // max_count 10: the newest ten before it subscribed, then live.
    for want in &published[40..] {
        assert_eq!(&key_of_json(&recv(&mut last10).await.json), want);
    }
    assert_eq!(key_of_json(&recv(&mut last10).await.json), key(&marker));
    // A session filter: the other session had nothing, so only its live event arrives.
    assert_eq!(key_of_json(&recv(&mut only_other).await.json), key(&other));
    close(host).await;
}

/// `recv` is cancel-safe: a reader that keeps abandoning `recv` half-way (as a transport's
/// `select!` does) still gets every bracket once, in order, across lag and catch-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_survives_being_cancelled_at_any_await() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let mut sub = subscribe(&host, SessionFilter::All, true, Replay::SinceCursor(0)).await;
    // Live before the publisher starts: a block that ended before the subscription went live
    // is replayed as its brackets only (its deltas are gone, by design), which `exact` below
    // would take for a missing tail.
    let warmup = start("warm", "warmup");
    let receipt = host.bus.publish(&warmup).await.unwrap();
    receipt.committed().await.unwrap();
    assert_eq!(key_of_json(&recv(&mut sub).await.json), key(&warmup));
    assert!(sub.is_live());
    let bus = host.bus.clone();
    let publisher = tokio::spawn(async move {
        let mut published = Vec::new();
        let mut receipts = Vec::new();
        for i in 0..3000 {
            let item = format!("c{i}");
            for e in [start("c", &item), delta("c", &item, "x"), end("c", &item)] {
                published.push((key(&e), !e.is_bracket()));
                receipts.push(bus.publish(&e).await.unwrap());
            }
        }
        for r in receipts {
            r.committed().await.unwrap();
        }
        published
    });
    let mut got = Vec::new();
    let mut brackets = 0;
    let mut cancelled = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while brackets < 6000 {
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::select! {
            biased;
            d = sub.recv() => {
                let d = d.unwrap().unwrap();
                if !d.is_delta {
                    brackets += 1;
                }
                got.push(d);
            }
            () = tokio::task::yield_now() => cancelled += 1,
        }
    }
    let published = HashMap::from([("c".to_owned(), publisher.await.unwrap())]);
    let exact = sub.catch_ups() == 0 && sub.deltas_dropped() == 0;
    check_stream(
        "cancelled",
        &got,
        &published,
        &SessionFilter::All,
        true,
        exact,
    );
    assert!(cancelled > 0, "recv was never cancelled");
    close(host).await;
}

/// A failed group commit degrades the store: an event queued behind it is refused too, so a
/// session's stream never has a hole, and subscribers see neither. The store then recovers by
/// itself (its probe write commits), and the next event is stored and delivered.
#[tokio::test]
async fn a_failed_commit_refuses_what_follows_then_recovers_without_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let mut sub = subscribe(&host, SessionFilter::All, false, Replay::None).await;
    let ok = end("s", "before");
    host.bus
        .publish(&ok)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    assert_eq!(key_of_json(&recv(&mut sub).await.json), key(&ok));
    host.store
        .write(|conn| {
            conn.execute_batch(
                "CREATE TRIGGER refuse_start BEFORE INSERT ON messages \
                 WHEN NEW.kind = 'text.start' BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let mut health = host.store.watch_health();
    let failing = host.bus.publish(&start("s", "x")).await.unwrap();
    let after = host.bus.publish(&end("s", "x")).await.unwrap();
    let err = failing.committed().await.unwrap_err().to_string();
    assert!(err.contains("disk says no"), "{err}");
    let err = after.committed().await.unwrap_err().to_string();
    assert!(
        err.contains("cannot commit") || err.contains("disk says no"),
        "{err}"
    );
    let stored = host.store.history("s".into(), 0, 10).await.unwrap();
    assert_eq!(
        stored.len(),
        1,
        "only the event before the failure is stored"
    );
    // Recovered by itself: waited for on the health watch, bounded.
    tokio::time::timeout(WAIT, async {
        while !health.borrow_and_update().is_ok() {
            health.changed().await.unwrap();
        }
    })
    .await
    .unwrap();
    let later = end("s", "later");
    let seq = host
        .bus
        .publish(&later)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    let got = recv(&mut sub).await;
    assert_eq!(
        key_of_json(&got.json),
        key(&later),
        "the subscriber saw nothing else"
    );
    assert_eq!(Some(got.sequence_id), seq);
    assert_eq!(
        host.store.history("s".into(), 0, 10).await.unwrap().len(),
        2
    );
    close(host).await;
}

/// A store error surfaces as an error, and calling `recv` again is fine (no panic).
#[tokio::test]
async fn recv_after_a_store_error_can_be_called_again() {
    let dir = tempfile::tempdir().unwrap();
    // A row the bus cannot read back, written before the bus starts (so catch-up must read it
    // from SQLite rather than from the hub's ring).
    let (store, threads) = Store::open(&dir.path().join("host.db")).unwrap();
    store
        .write(|conn| {
            conn.execute(
                "INSERT INTO messages (message_id, session_id, kind, payload, created_at) \
                 VALUES ('m', 's', 'text.end', x'00ff', 0)",
                [],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    drop(store);
    threads.shutdown().await;
    let host = open(dir.path()).await;
    let mut sub = subscribe(&host, SessionFilter::All, false, Replay::SinceCursor(0)).await;
    assert!(sub.recv().await.is_err(), "a BLOB payload is not an event");
    assert!(sub.recv().await.is_err(), "still an error, and no panic");
    close(host).await;
}

/// A cursor from the future (stale client) is clamped: the subscriber still gets new events.
#[tokio::test]
async fn a_cursor_past_the_end_does_not_silence_a_subscriber() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let mut sub = subscribe(
        &host,
        SessionFilter::All,
        false,
        Replay::SinceCursor(1_000_000),
    )
    .await;
    let e = end("s", "new");
    host.bus
        .publish(&e)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    assert_eq!(key_of_json(&recv(&mut sub).await.json), key(&e));
    close(host).await;
}

/// Deleting the session that holds the newest events must not make a new subscriber spin
/// between the hub and the store (the cursor is the highest id ever assigned, not the highest
/// id still present).
#[tokio::test]
async fn deleting_the_newest_session_leaves_catch_up_sound() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    host.bus
        .publish(&end("a", "a1"))
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    host.bus
        .publish(&end("b", "b1"))
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    close(host).await;
    let host = open(dir.path()).await;
    host.store.delete_session("b".into()).await.unwrap();
    let mut sub = subscribe(&host, SessionFilter::All, false, Replay::None).await;
    // Nothing is published, so `recv` cannot return; within the bound it must have caught up
    // and gone live (before the fix it bounced between the hub and the store for ever).
    let idle = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await;
    assert!(idle.is_err(), "nothing was published");
    assert!(sub.is_live(), "the subscriber never went live");
    let marker = end("a", "marker");
    host.bus
        .publish(&marker)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    assert_eq!(key_of_json(&recv(&mut sub).await.json), key(&marker));
    // And a replay from the start skips the deleted session's row without a gap or a stall.
    let mut all = subscribe(&host, SessionFilter::All, false, Replay::SinceCursor(0)).await;
    assert_eq!(item(&*recv(&mut all).await), "a1");
    assert_eq!(item(&*recv(&mut all).await), "marker");
    close(host).await;
}

fn item(d: &Delivery) -> String {
    let v: Value = serde_json::from_str(&d.json).unwrap();
    v["itemId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_event_over_the_size_limit_is_refused_at_publish() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let mut big = end("s", "big");
    if let EventBody::TextEnd(b) = &mut big.body {
        b.text = "x".repeat(agent_host::bus::MAX_EVENT_BYTES);
    }
    let err = host.bus.publish(&big).await.err().expect("refused");
    assert!(
        matches!(err, agent_host::bus::BusError::TooLarge(_)),
        "{err}"
    );
    close(host).await;
}

/// A deleted session's open blocks are forgotten (its quiet stop closes none): a subscriber
/// joining afterwards is sent nothing of them, though another session's open block it is.
/// The forget follows the session's last events down the pipeline, so none of them, still
/// queued, reopens a block after it.
#[tokio::test]
async fn a_deleted_sessions_open_blocks_are_not_sent_to_a_joiner() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let started = host.bus.publish(&start("d", "gone")).await.unwrap();
    host.bus
        .publish(&delta("d", "gone", "stale"))
        .await
        .unwrap();
    host.bus.publish(&start("k", "kept")).await.unwrap();
    host.bus.publish(&delta("k", "kept", "live")).await.unwrap();
    // Not waiting for the commits: the forget must still come after them.
    host.bus.forget_session("d").await;
    started.committed().await.unwrap();
    let mut sub = subscribe(&host, SessionFilter::All, true, Replay::None).await;
    // It goes live on its first read: the first marker, then the open blocks so far; the
    // second marker, published after, comes live behind them.
    let first = end("k", "first");
    let second = end("k", "second");
    let commit = async |e: &Event| {
        host.bus
            .publish(e)
            .await
            .unwrap()
            .committed()
            .await
            .unwrap()
    };
    commit(&first).await;
    let mut got = vec![key_of_json(&recv(&mut sub).await.json)];
    commit(&second).await;
    loop {
        let k = key_of_json(&recv(&mut sub).await.json);
        got.push(k.clone());
        if k == key(&second) {
            break;
        }
    }
    assert!(
        !got.iter().any(|k| k.contains("gone")),
        "the deleted session's block was sent: {got:?}"
    );
    assert!(
        got.iter().any(|k| k == "text.delta|kept|live"),
        "the live session's block so far was not sent: {got:?}"
    );
    close(host).await;
}

/// A delta published right behind its session's bracket — the bracket still in the ingest
/// queue or its commit pending — never overtakes it, whichever way the delta goes to the hub
/// (past ingest when nothing is ahead of it, through it otherwise). Two sessions publish at
/// once without waiting for any commit (each stays at most 8 blocks ahead of the reader, so
/// no queue fills and nothing may be dropped); the subscriber gets, per block, start, its one
/// delta, end, in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_never_overtakes_the_bracket_before_it() {
    const BLOCKS: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let mut sub = subscribe(&host, SessionFilter::All, true, Replay::None).await;
    // Live before anything is published (what came before going live is replayed from the
    // store: brackets only).
    let warmup = start("warm", "warmup");
    let receipt = host.bus.publish(&warmup).await.unwrap();
    receipt.committed().await.unwrap();
    assert_eq!(key_of_json(&recv(&mut sub).await.json), key(&warmup));
    assert!(sub.is_live());
    // How many blocks' end brackets the reader has had.
    let (read_tx, read) = tokio::sync::watch::channel(0_usize);
    let reader = tokio::spawn(async move {
        let mut seen: std::collections::HashMap<String, Vec<String>> = Default::default();
        let mut ends = 0;
        while ends < 2 * BLOCKS {
            let d = recv(&mut sub).await;
            let v: Value = serde_json::from_str(&d.json).unwrap();
            let kind = v["k"].as_str().unwrap().to_owned();
            if kind == "text.end" {
                ends += 1;
                read_tx.send_replace(ends);
            }
            let item = v["itemId"].as_str().unwrap().to_owned();
            seen.entry(item).or_default().push(kind);
        }
        (seen, sub.deltas_dropped(), sub.catch_ups())
    });
    let mut publishers = Vec::new();
    for s in ["a", "b"] {
        let bus = host.bus.clone();
        let mut read = read.clone();
        publishers.push(tokio::spawn(async move {
            for i in 0..BLOCKS {
                // Both sessions together: at most 2 x 8 blocks not yet read.
                read.wait_for(|n| n + 16 >= 2 * i).await.unwrap();
                let item = format!("{s}{i}");
                bus.publish(&start(s, &item)).await.unwrap();
                bus.publish(&delta(s, &item, "x")).await.unwrap();
                bus.publish(&end(s, &item)).await.unwrap();
            }
        }));
    }
    for p in publishers {
        p.await.unwrap();
    }
    let (seen, dropped, catch_ups) = reader.await.unwrap();
    assert_eq!((dropped, catch_ups), (0, 0));
    assert_eq!(seen.len(), 2 * BLOCKS);
    for (item, kinds) in &seen {
        assert_eq!(kinds, &["text.start", "text.delta", "text.end"], "{item}");
    }
    close(host).await;
}
