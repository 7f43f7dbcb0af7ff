//! The loopback WebSocket server through real sockets (issue 3): grants, fan-out, replay and
//! reconnects, a subscriber that stops reading, hostile frames. Every wait is on an event
//! (a frame, a reply, a task), bounded by a timeout.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use agent_host::protocol::wire::{CmdId, Codec, PROTOCOL_VERSION, pb};
use agent_host::ws::client::{self, ClientError, WsClient};
use common::{TestHost, WAIT, item_of, text_delta, text_end, text_start};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};

fn hello(cursor: Option<i64>) -> pb::Hello {
    pb::Hello {
        client_name: "test".into(),
        cursor,
        protocol_version: PROTOCOL_VERSION,
    }
}

async fn grant(host: &TestHost, params: Value) -> (String, String, String) {
    let data = host.ok("subscriber.add", params).await;
    (
        data["subscriber_id"].as_str().unwrap().to_owned(),
        data["ws_endpoint"].as_str().unwrap().to_owned(),
        data["ws_token"].as_str().unwrap().to_owned(),
    )
}

async fn connect(endpoint: &str, token: &str, cursor: Option<i64>) -> WsClient {
    tokio::time::timeout(WAIT, client::connect(endpoint, token, hello(cursor)))
        .await
        .unwrap()
        .unwrap()
        .0
}

async fn refused(endpoint: &str, token: &str) -> u16 {
    match tokio::time::timeout(WAIT, client::connect(endpoint, token, hello(None)))
        .await
        .unwrap()
    {
        Err(ClientError::Refused(status)) => status.as_u16(),
        Ok(_) => panic!("connected with token {token:?}"),
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
    }
}

/// The next pushed event (skipping anything else).
async fn next_push(ws: &mut WsClient) -> pb::EventPush {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next_frame())
            .await
            .expect("timed out waiting for a push")
            .unwrap()
            .expect("connection closed");
        if let Some(push) = client::event_of(&frame) {
            return push;
        }
    }
}

/// One envelope command over the connection that must succeed: its reply's data.
async fn ok(ws: &mut WsClient, command: &str, params: Value) -> Value {
    let reply = tokio::time::timeout(WAIT, ws.request(command, params))
        .await
        .unwrap_or_else(|_| panic!("no reply to {command}"))
        .unwrap();
    assert_eq!(reply.code, 0, "{command}: {}", reply.to_line());
    reply.data
}

/// The next non-push frame (a response or an error).
async fn next_reply(ws: &mut WsClient) -> agent_host::protocol::wire::Decoded {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next_frame())
            .await
            .expect("timed out waiting for a reply")
            .unwrap()
            .expect("connection closed");
        if frame.cmd != CmdId::EventPush {
            return frame;
        }
    }
}

fn local_all() -> Value {
    json!({"type": "local", "replay_mode": "since_cursor"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_decide_who_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let (_id, endpoint, token) = grant(&host, local_all()).await;

    // A valid token works, twice within its TTL (a reconnect).
    let first = connect(&endpoint, &token, None).await;
    first.close().await;
    let second = connect(&endpoint, &token, None).await;
    second.close().await;

    // Wrong and missing tokens.
    assert_eq!(refused(&endpoint, "not-a-token").await, 401);
    let mut request = endpoint.as_str().into_client_request().unwrap();
    request.headers_mut().remove(header::AUTHORIZATION);
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("missing token: {other:?}"),
    }

    // The token as a Sec-WebSocket-Protocol entry (browsers); the server selects ours.
    let mut request = endpoint.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_str(&format!("agent-host.v1, bearer.{token}")).unwrap(),
    );
    let (_ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .unwrap(),
        "agent-host.v1"
    );

    // A foreign Host (DNS rebinding) or Origin (a cross-site page) gets nothing.
    for (name, value) in [
        (header::HOST, "attacker.example:80".to_owned()),
        (header::ORIGIN, "https://attacker.example".to_owned()),
    ] {
        let mut request = endpoint.as_str().into_client_request().unwrap();
        request.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        request
            .headers_mut()
            .insert(name.clone(), HeaderValue::from_str(&value).unwrap());
        match tokio_tungstenite::connect_async(request).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                assert_eq!(r.status(), 403, "{name}: {value}")
            }
            other => panic!("{name}: {value}: {other:?}"),
        }
    }

    // Expired: move the injected clock past the 60 s TTL.
    host.clock.advance(Duration::from_secs(61));
    assert_eq!(refused(&endpoint, &token).await, 401);

    // A host restart voids every token; a fresh grant for the same subscriber works.
    let (id, endpoint, token) = grant(&host, local_all()).await;
    let host = host.restart().await;
    let new_endpoint = format!("ws://127.0.0.1:{}/subscribe", host.ws_port);
    assert_eq!(refused(&new_endpoint, &token).await, 401);
    let data = host
        .ok("subscriber.grant", json!({"subscriber_id": id}))
        .await;
    assert_eq!(data["ws_endpoint"], json!(new_endpoint));
    let ws = connect(&new_endpoint, data["ws_token"].as_str().unwrap(), None).await;
    ws.close().await;
    drop(endpoint);
    host.stop().await;
}

/// Reads `/proc/net/tcp{,6}`: every listening socket on `port` is bound to 127.0.0.1 only.
fn listeners_on(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (cols.get(1), cols.get(3)) else {
                continue;
            };
            let Some((addr, p)) = local.rsplit_once(':') else {
                continue;
            };
            if *state == "0A" && u16::from_str_radix(p, 16).ok() == Some(port) {
                found.push(addr.to_owned());
            }
        }
    }
    found
}

#[tokio::test]
async fn the_server_listens_on_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    // The kernel's own table: one listener for the port, on 127.0.0.1 (0100007F), none on a
    // wildcard or another address.
    assert_eq!(listeners_on(host.ws_port), vec!["0100007F".to_owned()]);
    // Another address of the machine (here: another loopback address, so the test sends no
    // traffic off the machine) is refused.
    let other = tokio::net::TcpStream::connect(("127.0.0.2", host.ws_port)).await;
    assert!(other.is_err(), "reachable on 127.0.0.2");
    let status = host.ok("host.status", json!({})).await;
    assert_eq!(status["ws_port"], json!(host.ws_port));
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("host.lock")).unwrap())
            .unwrap();
    assert_eq!(lock["ws_port"], json!(host.ws_port));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_subscribers_get_every_bracket_once_and_deltas_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let mut readers = Vec::new();
    for i in 0..100 {
        let deltas = i % 2 == 0;
        let (_id, endpoint, token) = grant(
            &host,
            json!({"type": "local", "session_id": session, "forward_deltas": deltas, "replay_mode": "since_cursor"}),
        )
        .await;
        let mut ws = connect(&endpoint, &token, None).await;
        readers.push(tokio::spawn(async move {
            let mut brackets = Vec::new();
            let mut deltas_seen = 0;
            let mut last_seq = 0;
            while brackets.len() < 200 {
                let push = next_push(&mut ws).await;
                assert!(push.sequence_id >= last_seq, "out of order");
                last_seq = push.sequence_id;
                if push.is_delta {
                    deltas_seen += 1;
                } else {
                    brackets.push((push.sequence_id, item_of(&push.event_json)));
                }
            }
            (deltas, brackets, deltas_seen)
        }));
    }
    let mut published = Vec::new();
    for i in 0..100 {
        let item = format!("i{i}");
        host.bus
            .publish(&text_start(&session, &item))
            .await
            .unwrap();
        host.bus
            .publish(&text_delta(&session, &item, "x"))
            .await
            .unwrap();
        let seq = host.bracket(&text_end(&session, &item)).await;
        published.push(item);
        let _ = seq;
    }
    for reader in readers {
        let (asked, brackets, deltas_seen) =
            tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
        let items: Vec<&str> = brackets.iter().map(|(_, i)| i.as_str()).collect();
        let want: Vec<&str> = published
            .iter()
            .flat_map(|i| [i.as_str(), i.as_str()])
            .collect();
        assert_eq!(items, want, "every bracket once, in order");
        let seqs: HashSet<i64> = brackets.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs.len(), 200, "no duplicate sequence ids");
        if asked {
            assert!(deltas_seen > 0, "asked for deltas, got none");
        } else {
            assert_eq!(deltas_seen, 0, "got deltas without asking");
        }
    }
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_resumes_with_its_cursor_and_replay_modes_hold_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let (id, endpoint, token) = grant(&host, local_all()).await;
    let mut ws = connect(&endpoint, &token, None).await;
    let mut seqs = Vec::new();
    for i in 0..10 {
        seqs.push(host.bracket(&text_end(&session, &format!("a{i}"))).await);
    }
    let mut last = 0;
    for i in 0..4 {
        let push = next_push(&mut ws).await;
        assert_eq!(item_of(&push.event_json), format!("a{i}"));
        last = push.sequence_id;
    }
    ws.ack(last).await.unwrap();
    // Cut mid-stream: no close handshake.
    drop(ws);
    for i in 10..15 {
        seqs.push(host.bracket(&text_end(&session, &format!("a{i}"))).await);
    }
    let mut ws = connect(&endpoint, &token, Some(last)).await;
    for i in 4..15 {
        let push = next_push(&mut ws).await;
        assert_eq!(
            item_of(&push.event_json),
            format!("a{i}"),
            "exactly what was missed"
        );
    }
    ws.ack(seqs[14]).await.unwrap();
    // The ack is saved in a batch; the cursor is visible in subscriber.list once it is.
    ws.close().await;

    // Three more subscribers, one per replay mode, then a restart.
    let (none_id, _, _) = grant(&host, json!({"type": "local", "replay_mode": "none"})).await;
    let (since_id, _, _) = grant(
        &host,
        json!({"type": "local", "replay_mode": "since_cursor"}),
    )
    .await;
    let (max_id, _, _) = grant(
        &host,
        json!({"type": "local", "replay_mode": "max_count", "max_count": 3}),
    )
    .await;
    let host = host.restart().await;
    for i in 15..18 {
        host.bracket(&text_end(&session, &format!("a{i}"))).await;
    }
    let connect_as = |id: String| {
        let host = &host;
        async move {
            let data = host
                .ok("subscriber.grant", json!({"subscriber_id": id}))
                .await;
            connect(
                data["ws_endpoint"].as_str().unwrap(),
                data["ws_token"].as_str().unwrap(),
                None,
            )
            .await
        }
    };
    let mut none = connect_as(none_id).await;
    let mut since = connect_as(since_id).await;
    let mut max = connect_as(max_id).await;
    let mut first = connect_as(id.clone()).await;
    let marker = host.bracket(&text_end(&session, "marker")).await;
    // none: only what came after it connected.
    assert_eq!(item_of(&next_push(&mut none).await.event_json), "marker");
    // since_cursor with a stored cursor of 0: everything, then the marker.
    for i in 0..18 {
        assert_eq!(
            item_of(&next_push(&mut since).await.event_json),
            format!("a{i}")
        );
    }
    assert_eq!(item_of(&next_push(&mut since).await.event_json), "marker");
    // max_count 3: the newest three before it connected, then the marker.
    for i in 15..18 {
        assert_eq!(
            item_of(&next_push(&mut max).await.event_json),
            format!("a{i}")
        );
    }
    assert_eq!(item_of(&next_push(&mut max).await.event_json), "marker");
    // The first subscriber's acked cursor (a14) survived the restart.
    for i in 15..18 {
        assert_eq!(
            item_of(&next_push(&mut first).await.event_json),
            format!("a{i}")
        );
    }
    let push = next_push(&mut first).await;
    assert_eq!(push.sequence_id, marker);
    let list = host.ok("subscriber.list", json!({})).await;
    let row = list["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["subscriber_id"] == json!(id))
        .unwrap()
        .clone();
    assert_eq!(row["most_recent_sequence_id"], json!(seqs[14]));
    assert_eq!(row["connected"], json!(true));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_get_an_error_or_a_close_and_nobody_else_notices() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let (_, endpoint, token) = grant(&host, local_all()).await;
    let mut bystander = connect(&endpoint, &token, None).await;
    let mut ws = connect(&endpoint, &token, None).await;

    let error_of = |frame: agent_host::protocol::wire::Decoded| {
        assert_eq!(frame.cmd, CmdId::ErrorResp, "{frame:?}");
        frame.body::<pb::ErrorResp>().unwrap()
    };
    // Garbage bytes.
    ws.send_raw(Message::Binary(vec![0xff, 0x00, 0x13, 0x37].into()))
        .await
        .unwrap();
    assert_eq!(error_of(next_reply(&mut ws).await).name, "invalid_frame");
    // A truncated protobuf frame.
    let good = client::raw_frame(CmdId::Ping as i32, 7, vec![8, 1]);
    ws.send_raw(Message::Binary(good[..good.len() - 1].to_vec().into()))
        .await
        .unwrap();
    assert_eq!(error_of(next_reply(&mut ws).await).name, "invalid_frame");
    // An unknown CmdId: answered, paired by request id.
    ws.send_raw(Message::Binary(client::raw_frame(999, 42, vec![]).into()))
        .await
        .unwrap();
    let reply = next_reply(&mut ws).await;
    assert_eq!(reply.request_id, 42);
    assert_eq!(error_of(reply).code, 1012);
    // The numbers of the retired per-command frames (5 to 16, 20, 21) are unknown now.
    for retired in (5..=16).chain([20, 21]) {
        let request_id = 100 + u64::try_from(retired).unwrap();
        ws.send_raw(Message::Binary(
            client::raw_frame(retired, request_id, vec![]).into(),
        ))
        .await
        .unwrap();
        let reply = next_reply(&mut ws).await;
        assert_eq!(reply.request_id, request_id, "cmd {retired}");
        let err = error_of(reply);
        assert_eq!(
            (err.code, err.name.as_str()),
            (1012, "unknown_cmd"),
            "cmd {retired}"
        );
    }
    // A known cmd whose body does not decode.
    ws.send_raw(Message::Binary(
        client::raw_frame(CmdId::Request as i32, 5, vec![0xff; 3]).into(),
    ))
    .await
    .unwrap();
    let reply = next_reply(&mut ws).await;
    assert_eq!(reply.request_id, 5);
    assert_eq!(error_of(reply).name, "invalid_frame");
    // A text message.
    ws.send_raw(Message::Text("hello?".into())).await.unwrap();
    assert_eq!(error_of(next_reply(&mut ws).await).name, "invalid_frame");
    // Frames only the server sends.
    ws.send(CmdId::EventPush, &pb::EventPush::default())
        .await
        .unwrap();
    assert_eq!(error_of(next_reply(&mut ws).await).name, "unknown_cmd");
    ws.send(CmdId::Reply, &pb::Reply::default()).await.unwrap();
    assert_eq!(error_of(next_reply(&mut ws).await).name, "unknown_cmd");
    // Requests still work on the same connection: a prompt to a session that does not exist
    // is refused with its own code in its reply (never a fake run).
    let reply = tokio::time::timeout(
        WAIT,
        ws.request(
            "session.send",
            json!({"session_id": "no-such-session", "text": "hi", "client_msg_id": "c1"}),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        (reply.code, reply.data["error"].as_str()),
        (3001, Some("session_not_found")),
        "{}",
        reply.to_line()
    );
    assert!(
        reply.message.contains("no-such-session"),
        "{}",
        reply.message
    );
    // An unknown command, and one not served over the wire, are refused the same way.
    let reply = tokio::time::timeout(WAIT, ws.request("session.nope", json!({})))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (reply.code, reply.data["error"].as_str()),
        (1004, Some("unknown_command")),
        "{}",
        reply.to_line()
    );
    let reply = tokio::time::timeout(WAIT, ws.request("subscriber.list", json!({})))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (reply.code, reply.data["error"].as_str()),
        (1010, Some("wrong_route")),
        "{}",
        reply.to_line()
    );
    ws.send(CmdId::Ping, &pb::Ping { nonce: 99 }).await.unwrap();
    let pong = next_reply(&mut ws).await;
    assert_eq!(pong.cmd, CmdId::Pong);
    assert_eq!(pong.body::<pb::Pong>().unwrap().nonce, 99);

    // A 64 MiB message: the server closes with 1009 and a reason, without reading it all.
    let mut request = endpoint.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    let (raw, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let (mut sink, mut stream) = raw.split();
    sink.send(Message::Binary(
        client::raw_frame(CmdId::Hello as i32, 1, vec![]).into(),
    ))
    .await
    .unwrap();
    let big = vec![0u8; 64 * 1024 * 1024];
    let sender = tokio::spawn(async move {
        // The server stops reading and closes: this send may fail, which is the point.
        let _ = sink.send(Message::Binary(big.into())).await;
    });
    let mut close = None;
    while let Ok(Some(msg)) = tokio::time::timeout(WAIT, stream.next()).await {
        match msg {
            Ok(Message::Close(frame)) => {
                close = frame;
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let close = close.expect("the server closed with a close frame");
    assert_eq!(u16::from(close.code), 1009);
    assert!(close.reason.contains("frame_too_large"), "{}", close.reason);
    sender.abort();

    // The host and the bystander carry on.
    let seq = host.bracket(&text_end(&session, "still-here")).await;
    let push = next_push(&mut bystander).await;
    assert_eq!(
        (push.sequence_id, item_of(&push.event_json).as_str()),
        (seq, "still-here")
    );
    let push = next_push(&mut ws).await;
    assert_eq!(push.sequence_id, seq);
    host.ok("host.status", json!({})).await;
    host.stop().await;
}

#[tokio::test]
async fn requests_over_the_socket_answer_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    for i in 0..3 {
        host.bracket(&text_end(&session, &format!("h{i}"))).await;
    }
    let (_, endpoint, token) = grant(&host, json!({"type": "local", "replay_mode": "none"})).await;
    let mut ws = connect(&endpoint, &token, None).await;
    let list = ok(&mut ws, "session.list", json!({})).await;
    let sessions = list["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{list}");
    assert_eq!(sessions[0]["session_id"], session.as_str());
    let history = json!({"session_id": session, "after_seq": 0, "limit": 2});
    let page = ok(&mut ws, "session.history", history.clone()).await;
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{page}");
    assert_eq!(page["count"], 2);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["next_after_seq"], events[1]["sequence_id"]);
    assert_eq!(events[1]["kind"], "text.end");
    assert_eq!(events[1]["event"]["itemId"], "h1");
    // The rest, from the cursor the page gave.
    let rest = ok(
        &mut ws,
        "session.history",
        json!({"session_id": session, "after_seq": page["next_after_seq"]}),
    )
    .await;
    let rest_events = rest["events"].as_array().unwrap();
    assert_eq!(rest_events.len(), 1, "{rest}");
    assert_eq!(rest_events[0]["event"]["itemId"], "h2");
    assert_eq!(rest["has_more"], false);
    let missing = tokio::time::timeout(
        WAIT,
        ws.request("session.get", json!({"session_id": "nope"})),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        (missing.code, missing.data["error"].as_str()),
        (3001, Some("session_not_found")),
        "{}",
        missing.to_line()
    );
    // The JSON codec carries the same command and the same answer.
    let hello_json = hello(None);
    let (mut json_ws, _) = tokio::time::timeout(
        WAIT,
        client::connect_with(&endpoint, &token, hello_json, Codec::Json),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(ok(&mut json_ws, "session.history", history).await, page);
    json_ws.close().await;
    // Removing the subscriber closes its connection.
    let list = host.ok("subscriber.list", json!({})).await;
    let id = list["subscribers"][0]["subscriber_id"]
        .as_str()
        .unwrap()
        .to_owned();
    host.ok("subscriber.remove", json!({"subscriber_id": id}))
        .await;
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match ws.next_frame().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await
    .unwrap();
    assert!(end.is_ok());
    assert_eq!(ws.last_close.as_ref().map(|c| c.0), Some(1001));
    host.stop().await;
}

/// An event near the size limit (4 MiB) reaches a client whole: the client side accepts what
/// the server may send.
#[tokio::test]
async fn a_large_event_reaches_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let (_, endpoint, token) = grant(&host, local_all()).await;
    let mut ws = connect(&endpoint, &token, None).await;
    let mut big = text_end(&session, "big");
    if let agent_host::protocol::events::EventBody::TextEnd(b) = &mut big.body {
        b.text = "y".repeat(3 * 1024 * 1024);
    }
    host.bracket(&big).await;
    let push = next_push(&mut ws).await;
    assert_eq!(item_of(&push.event_json), "big");
    assert!(push.event_json.len() > 3 * 1024 * 1024);
    host.stop().await;
}

/// A peer that opens a TCP connection and says nothing does not hold up shutdown (the
/// handshake waits on the host's cancellation, not only on its own 10 s limit).
#[tokio::test]
async fn an_idle_peer_does_not_delay_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let _idle = tokio::net::TcpStream::connect(("127.0.0.1", host.ws_port))
        .await
        .unwrap();
    let (_, endpoint, token) = grant(&host, local_all()).await;
    // Upgraded but no Hello yet: also waiting.
    let mut request = endpoint.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    let (_silent, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    // Well under the 5 s drain grace and the 10 s handshake limit.
    tokio::time::timeout(Duration::from_secs(3), host.stop())
        .await
        .expect("shutdown waited for idle peers");
}

/// An upgrade over the host's Unix socket with `request`'s headers: the HTTP status of a
/// refusal, or 101.
async fn unix_upgrade_status(
    socket: &std::path::Path,
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
) -> u16 {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    match tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, stream))
        .await
        .unwrap()
    {
        Ok((_ws, response)) => response.status().as_u16(),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

/// The same protocol over `ws.sock` (mode 0600): a grant names it, the token opens it, events
/// and requests flow as over TCP; a wrong token, another path or a browser's Origin are
/// refused; the file goes with the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_serves_the_same_protocol() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let data = host
        .ok(
            "subscriber.add",
            json!({"type": "local", "session_id": session, "forward_deltas": true,
                   "replay_mode": "none"}),
        )
        .await;
    let socket = std::path::PathBuf::from(data["ws_socket"].as_str().unwrap());
    assert_eq!(socket, dir.path().join("ws.sock"));
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = data["ws_token"].as_str().unwrap();

    let (mut ws, resp) =
        tokio::time::timeout(WAIT, client::connect_unix(&socket, token, hello(None)))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(resp.subscriber_id, data["subscriber_id"].as_str().unwrap());
    // A bracket first: once it is here the subscription is live. (Until its first catch-up,
    // just after `HelloResp`, a block opened and closed meanwhile would reach it as its end
    // alone, with the whole text: deltas are droppable, brackets never are.)
    let first = host.bracket(&text_end(&session, "u-first")).await;
    let push = next_push(&mut ws).await;
    assert_eq!(
        (push.sequence_id, item_of(&push.event_json)),
        (first, "u-first".to_owned())
    );
    host.bus
        .publish(&text_delta(&session, "u0", "over unix"))
        .await
        .unwrap();
    let seq = host.bracket(&text_end(&session, "u0")).await;
    let delta = next_push(&mut ws).await;
    assert!(delta.is_delta);
    assert!(
        delta.event_json.contains("over unix"),
        "{}",
        delta.event_json
    );
    let bracket = next_push(&mut ws).await;
    assert_eq!(
        (bracket.sequence_id, item_of(&bracket.event_json)),
        (seq, "u0".to_owned())
    );
    let got = ok(&mut ws, "session.get", json!({"session_id": session})).await;
    assert_eq!(got["session_id"], session.as_str());
    // The JSON codec too.
    let (mut json_ws, _) = tokio::time::timeout(
        WAIT,
        client::connect_unix_with(&socket, token, hello(None), Codec::Json),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        ok(&mut json_ws, "session.get", json!({"session_id": session})).await,
        got
    );
    json_ws.close().await;

    // Refusals: a wrong token, another path, a browser's Origin.
    match tokio::time::timeout(
        WAIT,
        client::connect_unix(&socket, "not-a-token", hello(None)),
    )
    .await
    .unwrap()
    {
        Err(ClientError::Refused(status)) => assert_eq!(status.as_u16(), 401),
        Ok(_) => panic!("connected with a wrong token"),
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
    }
    let with_token = |url: &str| {
        let mut request = url.into_client_request().unwrap();
        request.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        request
    };
    assert_eq!(
        unix_upgrade_status(&socket, with_token("ws://localhost/other")).await,
        404
    );
    let mut cross_site = with_token(client::UNIX_URL);
    cross_site.headers_mut().insert(
        header::ORIGIN,
        HeaderValue::from_static("https://attacker.example"),
    );
    assert_eq!(unix_upgrade_status(&socket, cross_site).await, 403);
    // Any Host is fine here (no address to rebind).
    assert_eq!(
        unix_upgrade_status(&socket, with_token("ws://anything.example/subscribe")).await,
        101
    );

    ws.close().await;
    host.stop().await;
    assert!(!socket.exists(), "ws.sock outlived its host");
}

/// One follower's stream, as (is it a delta, its item, a delta's text).
type Stream = Vec<(bool, String, String)>;

fn seen_of(push: &pb::EventPush) -> (bool, String, String) {
    let v: Value = serde_json::from_str(&push.event_json).unwrap();
    let text = if push.is_delta {
        v["text"].as_str().unwrap_or_default().to_owned()
    } else {
        String::new()
    };
    (push.is_delta, item_of(&push.event_json), text)
}

/// Per item, the concatenation of its deltas, checking each lies between its start and end
/// brackets, and the items' brackets in publishing order.
fn texts_per_item(name: &str, stream: &Stream, items: &[String]) -> Vec<String> {
    let brackets: Vec<&str> = stream
        .iter()
        .filter(|(delta, _, _)| !delta)
        .map(|(_, item, _)| item.as_str())
        .collect();
    let want: Vec<&str> = items
        .iter()
        .flat_map(|i| [i.as_str(), i.as_str()])
        .collect();
    assert_eq!(brackets, want, "{name}: every bracket once, in order");
    let mut texts = vec![String::new(); items.len()];
    let mut open: Option<usize> = None;
    for (delta, item, text) in stream {
        let index = items.iter().position(|i| i == item).unwrap();
        if *delta {
            assert_eq!(
                open,
                Some(index),
                "{name}: a delta of {item} outside its block"
            );
            texts[index].push_str(text);
        } else {
            open = match open {
                Some(o) if o == index => None,
                _ => Some(index),
            };
        }
    }
    texts
}

/// The direct lane: a delta that comes alone, to a hub idle for a millisecond, is written to
/// idle followers' sockets by the bus's hub itself. Over TCP and `ws.sock`, in both codecs,
/// each follower that reads gets every delta whole and in place (its text adds up to the
/// block's, between the block's brackets). Four followers, joining one every other item, do
/// not read until the end: the writes fill their sockets and (for at least one of them: a
/// follower's task that has not yet re-armed its lane takes the delta itself) the hub's
/// write is taken only in part, its tail left to the connection, which writes it before
/// anything else — each still reads whole frames, every bracket once and in order, and of
/// each block a prefix of its text (what did not fit was dropped, never torn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_deltas_written_by_the_hub_arrive_whole_and_in_order() {
    const ITEMS: usize = 8;
    const PIECES: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let (frames_before, tails_before) = agent_host::bus::direct::written();
    let params = json!({"type": "local", "session_id": session, "forward_deltas": true,
                        "replay_mode": "none"});
    let mut readers = Vec::new();
    let (probe_tx, mut probe) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
    for n in 0..8 {
        let data = host.ok("subscriber.add", params.clone()).await;
        let token = data["ws_token"].as_str().unwrap().to_owned();
        let codec = if n % 2 == 0 {
            Codec::Protobuf
        } else {
            Codec::Json
        };
        let connecting = async {
            if n % 4 < 2 {
                let endpoint = data["ws_endpoint"].as_str().unwrap();
                client::connect_with(endpoint, &token, hello(None), codec).await
            } else {
                let socket = std::path::PathBuf::from(data["ws_socket"].as_str().unwrap());
                client::connect_unix_with(&socket, &token, hello(None), codec).await
            }
        };
        let mut ws = tokio::time::timeout(WAIT, connecting)
            .await
            .unwrap()
            .unwrap()
            .0;
        let probe_tx = (n == 0).then(|| probe_tx.clone());
        readers.push(tokio::spawn(async move {
            let mut stream = Stream::new();
            while stream.iter().filter(|(d, _, _)| !d).count() < 2 * ITEMS {
                let push = next_push(&mut ws).await;
                let seen = seen_of(&push);
                if let Some(tx) = &probe_tx {
                    tx.send((seen.0, seen.2.clone())).unwrap();
                }
                stream.push(seen);
            }
            (format!("follower {n} ({codec:?})"), stream)
        }));
    }
    // Followers that do not read until the end, one joining before every other item: each
    // fills its socket within the item it joins at, and at least one of them must have its
    // lane armed when that happens for the hub to be the one whose write is taken in part.
    let mut sleepers = Vec::new();

    // Lockstep with the first follower, so that each delta finds the bus idle and comes
    // alone.
    let mut expect = async |delta: bool| {
        let (got_delta, _) = tokio::time::timeout(WAIT, probe.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got_delta, delta);
    };
    let mut items = Vec::new();
    let mut full = Vec::new();
    for i in 0..ITEMS {
        if i % 2 == 0 {
            let data = host.ok("subscriber.add", params.clone()).await;
            let socket = std::path::PathBuf::from(data["ws_socket"].as_str().unwrap());
            let token = data["ws_token"].as_str().unwrap();
            let (sleeper, _) =
                tokio::time::timeout(WAIT, client::connect_unix(&socket, token, hello(None)))
                    .await
                    .unwrap()
                    .unwrap();
            sleepers.push((i, sleeper));
        }
        let item = format!("d{i}");
        host.bracket(&text_start(&session, &item)).await;
        expect(false).await;
        let mut text = String::new();
        for k in 0..PIECES {
            // Over a Unix socket the kernel queues a write in pieces of ~36 KiB: a frame of
            // two can be taken in part.
            let piece = format!("[{i}.{k}]{}", "x".repeat(40_000));
            // The pace of an agent's stream, not a wait for anything: the hub takes the lane
            // for a delta that finds it idle for a millisecond or more.
            tokio::time::sleep(Duration::from_millis(2)).await;
            host.bus
                .publish(&text_delta(&session, &item, &piece))
                .await
                .unwrap();
            expect(true).await;
            text.push_str(&piece);
        }
        let end = agent_host::protocol::events::Event::new(
            &session,
            Some("r1".into()),
            agent_host::protocol::events::EventBody::TextEnd(
                agent_host::protocol::events::BlockEnd {
                    truncated: None,
                    item_id: Some(item.clone()),
                    text: text.clone(),
                    imported: false,
                },
            ),
        );
        host.bracket(&end).await;
        expect(false).await;
        items.push(item);
        full.push(text);
    }
    for reader in readers {
        let (name, stream) = tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
        assert_eq!(texts_per_item(&name, &stream, &items), full, "{name}");
    }
    for (first, mut sleeper) in sleepers {
        let name = format!("the follower that did not read, from item {first}");
        let mut stream = Stream::new();
        while stream.iter().filter(|(d, _, _)| !d).count() < 2 * (ITEMS - first) {
            stream.push(seen_of(&next_push(&mut sleeper).await));
        }
        // From the item it joined at on: every bracket, and of each block a prefix.
        let texts = texts_per_item(&name, &stream, &items[first..]);
        for (i, (got, whole)) in texts.iter().zip(&full[first..]).enumerate() {
            let i = first + i;
            assert!(
                whole.starts_with(got.as_str()),
                "{name}: item {i}: not a prefix"
            );
        }
        assert!(
            !texts[0].is_empty(),
            "{name}: the deltas of its first block went nowhere"
        );
    }
    let (frames, tails) = agent_host::bus::direct::written();
    assert!(
        frames - frames_before >= (ITEMS * PIECES) as u64,
        "the hub wrote {} frames itself",
        frames - frames_before
    );
    assert!(tails > tails_before, "no frame was taken in part");
    host.stop().await;
}
