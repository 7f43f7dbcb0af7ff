//! Issue 20, acceptance 5, with the real `claude` CLI against the project's mock model, in a
//! loopback-only network namespace: `session.search` finds a word of a prompt and a word of an
//! answer across two sessions, best match first, and `session.export` of a session with a tool
//! call and a permission is readable Markdown (and JSON Lines, the stored events exactly) —
//! over IPC, over the loopback WebSocket, and through the reference relay (a separate
//! process), with the same answers; a scoped client (a grant, the relay's scope) searches and
//! exports only its sessions; a hostile query is `invalid_params` on every transport.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use common::world::{Family, Follower, TURN, World, connect_follower, in_netns, run_end};
use serde_json::{Value, json};

use agent_host::protocol::wire::{PROTOCOL_VERSION, pb};
use agent_host::ws::client;

const HOST_TOKEN: &str = "host-token-for-search";
const BOT_TOKEN: &str = "bot-token-for-search";

/// The hits of a search reply as (session, sequence id, kind), and their scores.
fn hits_of(data: &Value) -> Vec<(String, i64, String)> {
    data["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("{data}"))
        .iter()
        .map(|h| {
            (
                h["session_id"].as_str().unwrap().to_owned(),
                h["sequence_id"].as_i64().unwrap(),
                h["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn scores_of(data: &Value) -> Vec<f64> {
    data["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["score"].as_f64().unwrap())
        .collect()
}

/// Every page of an export, over IPC, joined.
async fn export_all(world: &World, session: &str, format: &str) -> String {
    let mut content = String::new();
    let mut after = 0;
    loop {
        let page = world
            .host()
            .ok(
                "session.export",
                json!({"session_id": session, "format": format, "after_seq": after}),
            )
            .await;
        content.push_str(page["content"].as_str().unwrap());
        after = page["next_after_seq"].as_i64().unwrap();
        if !page["has_more"].as_bool().unwrap() {
            return content;
        }
    }
}

/// A bot connected to the reference relay at `url`.
async fn bot(url: &str) -> Follower {
    let hello = pb::Hello {
        client_name: "search-bot".into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    let (ws, resp) = client::connect(&format!("{url}/bot"), BOT_TOKEN, hello)
        .await
        .unwrap();
    Follower {
        ws,
        subscriber_id: resp.subscriber_id,
        seen: Vec::new(),
    }
}

#[test]
fn search_and_export_work_over_every_transport() {
    let Some(rt) = in_netns(
        Family::Claude,
        "search_and_export_work_over_every_transport",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let host = world.host();
        let one = world.session().await;
        let two = world.session().await;
        let mut ws_one = world.follower(&one, false).await;
        let mut ws_two = world.follower(&two, false).await;

        // The word `quokka` three times in a short prompt of one session, once in a longer
        // prompt of the other; the mock echoes each prompt in its answer, and says `seen`,
        // which no prompt does.
        world.turn(&mut ws_one, &one, "quokka quokka quokka").await;
        world
            .turn(
                &mut ws_two,
                &two,
                "one quokka among many other ordinary words of a longer sentence here",
            )
            .await;
        // A tool call that asks first, allowed from the terminal.
        let run = world
            .send(&one, "TOOLCALL `touch wombat-made && echo wombat-output`")
            .await;
        let id = run.clone();
        let request = ws_one
            .until("the permission request", TURN, |s| {
                s.kind() == "permission.request" && s.run_id == id
            })
            .await;
        let request_id = request.event["requestId"].as_str().unwrap().to_owned();
        host.ok(
            "permission.respond",
            json!({"session_id": one, "request_id": request_id, "decision": "allow"}),
        )
        .await;
        assert_eq!(run_end(&mut ws_one, &run, TURN).await["state"], "completed");

        // ---- search over IPC ----
        let found = host.ok("session.search", json!({"query": "quokka"})).await;
        let hits = hits_of(&found);
        let sessions: Vec<&str> = hits.iter().map(|h| h.0.as_str()).collect();
        assert!(
            sessions.contains(&one.as_str()) && sessions.contains(&two.as_str()),
            "{found}"
        );
        let kinds: Vec<&str> = hits.iter().map(|h| h.2.as_str()).collect();
        assert!(
            kinds.contains(&"user.text") && kinds.contains(&"text.end"),
            "{found}"
        );
        let scores = scores_of(&found);
        assert!(
            scores.windows(2).all(|w| w[0] >= w[1]),
            "not in rank order: {scores:?}"
        );
        // Session one says it three times in three words (and its answer echoes that): every
        // hit of it ranks above session two's, where it is one word of a long sentence.
        let last_of_one = hits.iter().rposition(|h| h.0 == one).unwrap();
        let first_of_two = hits.iter().position(|h| h.0 == two).unwrap();
        assert!(last_of_one < first_of_two, "{found}");
        assert!(
            found["hits"][0]["snippet"]
                .as_str()
                .unwrap()
                .contains("**quokka**"),
            "{found}"
        );
        // A word only answers say, in both sessions.
        let answers = hits_of(&host.ok("session.search", json!({"query": "seen"})).await);
        assert!(answers.iter().all(|h| h.2 == "text.end"), "{answers:?}");
        assert!(answers.iter().any(|h| h.0 == one) && answers.iter().any(|h| h.0 == two));
        // One session only.
        let in_two = hits_of(
            &host
                .ok(
                    "session.search",
                    json!({"query": "quokka", "session_id": two}),
                )
                .await,
        );
        assert!(
            !in_two.is_empty() && in_two.iter().all(|h| h.0 == two),
            "{in_two:?}"
        );
        // The tool call's command is indexed.
        let tool = hits_of(&host.ok("session.search", json!({"query": "wombat"})).await);
        assert!(tool.iter().any(|h| h.2 == "tool.call.end"), "{tool:?}");

        // ---- export over IPC ----
        let markdown = export_all(&world, &one, "markdown").await;
        for expected in [
            "# Session",
            &format!("- Session: `{one}`"),
            "## Prompt",
            "> quokka quokka quokka",
            "### Answer",
            "### Tool call: Bash",
            "echo wombat-output",
            "**Permission asked** for `Bash`",
            "**Permission allow**",
            "by `ipc`",
            "**Tool output**",
            "wombat-output",
        ] {
            assert!(
                markdown.contains(expected),
                "no {expected:?} in\n{markdown}"
            );
        }
        let asked = markdown.find("**Permission asked**").unwrap();
        let answered = markdown.find("**Permission allow**").unwrap();
        let output = markdown.find("**Tool output**").unwrap();
        assert!(asked < answered && answered < output, "{markdown}");
        // JSON Lines: the stored events, exactly, one a line.
        let jsonl = export_all(&world, &one, "jsonl").await;
        let history = host
            .ok("session.history", json!({"session_id": one, "limit": 5000}))
            .await;
        let stored: Vec<Value> = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event"].clone())
            .collect();
        let lines: Vec<Value> = jsonl
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, stored);

        // ---- the same over the loopback WebSocket (a grant over every session) ----
        let every = host
            .ok(
                "subscriber.add",
                json!({"type": "local", "replay_mode": "none"}),
            )
            .await;
        let mut ws = connect_follower(&every, "search-all", None).await;
        assert_eq!(
            ws.ok("session.search", json!({"query": "quokka"})).await,
            found
        );
        let page = ws
            .ok(
                "session.export",
                json!({"session_id": one, "format": "markdown"}),
            )
            .await;
        assert!(!page["has_more"].as_bool().unwrap());
        assert_eq!(page["content"].as_str().unwrap(), markdown);
        // A query FTS5 cannot read is the caller's error; as words, it is text.
        ws.refused(
            "session.search",
            json!({"query": "NEAR(", "syntax": "fts5"}),
            1005,
            "invalid_params",
        )
        .await;
        ws.ok("session.search", json!({"query": "\" NEAR( OR *"}))
            .await;
        ws.refused(
            "session.search",
            json!({"query": " * \""}),
            1005,
            "invalid_params",
        )
        .await;

        // A follower of one session (its grant is for that session), and a grant listing one
        // session, search and export that one only.
        let followed = hits_of(
            &ws_one
                .ok("session.search", json!({"query": "quokka"}))
                .await,
        );
        assert!(
            !followed.is_empty() && followed.iter().all(|h| h.0 == one),
            "{followed:?}"
        );
        let grant = host
            .ok(
                "subscriber.add",
                json!({"type": "local", "sessions": [one], "replay_mode": "none"}),
            )
            .await;
        let mut scoped = connect_follower(&grant, "search-scoped", None).await;
        let mine = hits_of(
            &scoped
                .ok("session.search", json!({"query": "quokka"}))
                .await,
        );
        assert!(
            !mine.is_empty() && mine.iter().all(|h| h.0 == one),
            "{mine:?}"
        );
        scoped
            .refused(
                "session.search",
                json!({"query": "quokka", "session_id": two}),
                1015,
                "out_of_scope",
            )
            .await;
        scoped
            .refused(
                "session.export",
                json!({"session_id": two, "format": "jsonl"}),
                1015,
                "out_of_scope",
            )
            .await;

        // ---- through the relay (its scope: session one) ----
        let (mut relay, url) =
            common::start_reference_relay("127.0.0.1:0", HOST_TOKEN, BOT_TOKEN).await;
        host.ok(
            "host.relay.set",
            json!({
                "url": format!("{url}/host"),
                "token": HOST_TOKEN,
                "scope": {"sessions": [one]},
                "timing": {"connect_timeout_ms": 500, "ping_interval_ms": 200,
                           "dead_peer_ms": 1000, "backoff_min_ms": 20, "backoff_max_ms": 300,
                           "stable_after_ms": 5000}
            }),
        )
        .await;
        let mut bot = bot(&url).await;
        let through = bot.ok("session.search", json!({"query": "quokka"})).await;
        assert_eq!(hits_of(&through), mine);
        let page = bot
            .ok(
                "session.export",
                json!({"session_id": one, "format": "markdown"}),
            )
            .await;
        assert_eq!(page["content"].as_str().unwrap(), markdown);
        bot.refused(
            "session.export",
            json!({"session_id": two, "format": "markdown"}),
            1015,
            "out_of_scope",
        )
        .await;
        bot.refused(
            "session.search",
            json!({"query": "(", "syntax": "fts5"}),
            1005,
            "invalid_params",
        )
        .await;

        // Deleting a session takes its words out of the index.
        host.ok("session.delete", json!({"session_id": two})).await;
        let after = hits_of(&host.ok("session.search", json!({"query": "quokka"})).await);
        assert!(
            !after.is_empty() && after.iter().all(|h| h.0 == one),
            "{after:?}"
        );

        world.host.unwrap().stop().await;
        relay.kill().await.unwrap();
    });
}

/// A long session exports in pages: each page's content is at most 1 MiB unless one event
/// alone is larger (then it is a page of its own), pages end at event boundaries, and the pages
/// joined are the whole transcript — the JSON Lines pages exactly the stored events. The
/// events are published through a real host's bus (no agent), searched and exported over IPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_session_exports_in_pages_that_join_into_the_whole() {
    use agent_host::protocol::events::{BlockEnd, Event, EventBody};
    const MIB: usize = 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let host = common::TestHost::start(&dir.path().join("host")).await;
    let session = host.session(dir.path()).await;
    let sizes = [300_000, 300_000, 300_000, 300_000, 2 * MIB, 300_000, 10];
    for (i, size) in sizes.iter().enumerate() {
        let text = format!("part{i} {}", "x".repeat(*size));
        let event = Event::new(
            &session,
            Some("r1".into()),
            EventBody::TextEnd(BlockEnd {
                item_id: Some(format!("i{i}")),
                text,
                truncated: None,
                imported: false,
            }),
        );
        host.bracket(&event).await;
    }
    // Searchable the moment the commit was acknowledged.
    let found = host
        .ok(
            "session.search",
            json!({"query": "part5", "session_id": session}),
        )
        .await;
    assert_eq!(found["hits"].as_array().unwrap().len(), 1, "{found}");

    for format in ["markdown", "jsonl"] {
        let mut pages = Vec::new();
        let mut after = 0;
        loop {
            let page = host
                .ok(
                    "session.export",
                    json!({"session_id": session, "format": format, "after_seq": after}),
                )
                .await;
            let content = page["content"].as_str().unwrap().to_owned();
            let events = page["events"].as_u64().unwrap();
            assert!(events >= 1, "{format}: an empty page");
            assert!(
                content.len() <= MIB || events == 1,
                "{format}: {} bytes in {events} events",
                content.len()
            );
            after = page["next_after_seq"].as_i64().unwrap();
            pages.push(content);
            if !page["has_more"].as_bool().unwrap() {
                break;
            }
        }
        assert!(pages.len() >= 4, "{format}: {} pages", pages.len());
        // The big event is a page of its own.
        assert!(
            pages.iter().any(|p| p.len() > MIB && p.contains("part4 ")),
            "{format}"
        );
        let whole = pages.concat();
        for i in 0..sizes.len() {
            assert_eq!(
                whole.matches(&format!("part{i} ")).count(),
                1,
                "{format}: part{i}"
            );
        }
        if format == "markdown" {
            assert_eq!(whole.matches("# Session").count(), 1, "one header");
            assert_eq!(whole.matches("### Answer").count(), sizes.len());
        } else {
            let history = host
                .ok(
                    "session.history",
                    json!({"session_id": session, "limit": 100}),
                )
                .await;
            let stored: Vec<String> = history["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["event"].to_string())
                .collect();
            let lines: Vec<String> = whole
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap().to_string())
                .collect();
            assert_eq!(lines, stored);
        }
    }
    // An unknown session, an unknown format.
    let missing = host
        .ipc(
            "session.export",
            json!({"session_id": "nope", "format": "markdown"}),
        )
        .await;
    assert_eq!(
        missing.data["error"],
        "session_not_found",
        "{}",
        missing.to_line()
    );
    let bad = host
        .ipc(
            "session.export",
            json!({"session_id": session, "format": "pdf"}),
        )
        .await;
    assert_eq!(bad.data["error"], "invalid_params", "{}", bad.to_line());
    host.stop().await;
}
