//! The web UI on the loopback server's port, through real sockets: raw HTTP/1.1 requests over
//! `TcpStream`, each answer read to the server's close under a timeout; then the WebSocket
//! upgrade on the same port, which must be unchanged.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use agent_host::protocol::wire::PROTOCOL_VERSION;
use agent_host::protocol::wire::pb;
use agent_host::web::CONTENT_SECURITY_POLICY;
use agent_host::ws::client;
use common::{TestHost, WAIT};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};

/// A parsed response: status, headers (names lowercased), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Send `request` as is and read until the server closes.
async fn exchange(port: u16, request: &str) -> Answer {
    let mut stream = tokio::time::timeout(WAIT, TcpStream::connect(("127.0.0.1", port)))
        .await
        .unwrap()
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
        .await
        .expect("the server did not close the connection")
        .unwrap();
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(len) = response.parse(&raw).unwrap() else {
        panic!("incomplete response: {:?}", String::from_utf8_lossy(&raw));
    };
    let answer = Answer {
        status: response.code.unwrap(),
        headers: response
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8(h.value.to_vec()).unwrap(),
                )
            })
            .collect(),
        body: raw[len..].to_vec(),
    };
    assert_eq!(answer.header("connection"), Some("close"));
    answer
}

async fn get(port: u16, method: &str, path: &str, host: &str) -> Answer {
    exchange(
        port,
        &format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n"),
    )
    .await
}

/// Every response carries the security headers and announces its length.
fn assert_secure(answer: &Answer, sent_body: bool) {
    assert_eq!(
        answer.header("content-security-policy"),
        Some(CONTENT_SECURITY_POLICY)
    );
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
        ("cache-control", "no-cache"),
    ] {
        assert_eq!(answer.header(name), Some(value), "{name}");
    }
    let length: usize = answer.header("content-length").unwrap().parse().unwrap();
    assert_eq!(answer.body.len(), if sent_body { length } else { 0 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_and_the_websocket_share_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let port = host.ws_port;
    let own = format!("127.0.0.1:{port}");

    let index = get(port, "GET", "/", &own).await;
    assert_eq!(index.status, 200);
    assert_secure(&index, true);
    assert_eq!(
        index.header("content-security-policy"),
        Some(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        )
    );
    assert_eq!(
        index.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let on_disk = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/web/app/index.html"));
    assert_eq!(index.body, on_disk.unwrap());

    // A revalidation with the ETag it got costs no body.
    let etag = index.header("etag").unwrap();
    let again = exchange(
        port,
        &format!("GET /index.html HTTP/1.1\r\nHost: {own}\r\nIf-None-Match: {etag}\r\n\r\n"),
    )
    .await;
    assert_eq!(again.status, 304);
    assert_secure(&again, false);

    let script = get(
        port,
        "GET",
        "/main.js?cache=1",
        &format!("localhost:{port}"),
    )
    .await;
    assert_eq!(script.status, 200);
    assert_eq!(
        script.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_secure(&script, true);

    let head = get(port, "HEAD", "/main.js", &own).await;
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        script.header("content-length")
    );
    assert_secure(&head, false);

    let missing = get(port, "GET", "/nope", &own).await;
    assert_eq!(missing.status, 404);
    assert_secure(&missing, true);

    let post = exchange(
        port,
        &format!("POST / HTTP/1.1\r\nHost: {own}\r\nContent-Length: 2\r\n\r\n{{}}"),
    )
    .await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    assert_secure(&post, true);

    // DNS rebinding: a foreign name that resolves here reads nothing.
    let rebound = get(port, "GET", "/", &format!("evil.example:{port}")).await;
    assert_eq!(rebound.status, 403);
    assert_secure(&rebound, true);
    assert_ne!(rebound.body, index.body);

    let cross_site = exchange(
        port,
        &format!("GET /main.js HTTP/1.1\r\nHost: {own}\r\nOrigin: https://evil.example\r\n\r\n"),
    )
    .await;
    assert_eq!(cross_site.status, 403);
    assert_secure(&cross_site, true);

    // A head that never ends is cut off at 16 KiB, not buffered.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let long = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(20 * 1024));
    // The server may close before all of it is written; either way nothing comes back.
    let _ = tokio::time::timeout(WAIT, stream.write_all(long.as_bytes()))
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest))
        .await
        .expect("an oversized head must close the connection");
    assert!(read.is_err() || rest.is_empty(), "{rest:?}");

    // The WebSocket upgrade on the same port, after all of the above.
    let data = host
        .ok(
            "subscriber.add",
            json!({"type": "local", "replay_mode": "since_cursor"}),
        )
        .await;
    let endpoint = data["ws_endpoint"].as_str().unwrap().to_owned();
    let token = data["ws_token"].as_str().unwrap().to_owned();
    assert_eq!(endpoint, format!("ws://127.0.0.1:{port}/subscribe"));
    let hello = pb::Hello {
        client_name: "web-test".into(),
        cursor: None,
        protocol_version: PROTOCOL_VERSION,
    };
    let (ws, resp) = tokio::time::timeout(WAIT, client::connect(&endpoint, &token, hello))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.subscriber_id, data["subscriber_id"].as_str().unwrap());
    ws.close().await;

    let mut request = endpoint.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    request.headers_mut().insert(
        header::ORIGIN,
        HeaderValue::from_static("https://evil.example"),
    );
    match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .unwrap()
    {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 403),
        other => panic!("a foreign Origin got through: {other:?}"),
    }

    host.stop().await;
}

/// The web UI's origin survives a restart: with no port configured, the next host of the same
/// home listens on the port the last one had (a page's storage and a bookmark are per origin).
#[tokio::test]
async fn a_restarted_host_keeps_its_port() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let port = host.ws_port;
    let host = host.restart().await;
    assert_eq!(
        host.ws_port, port,
        "the restarted host moved to another port"
    );
    let index = get(port, "GET", "/", &format!("127.0.0.1:{port}")).await;
    assert_eq!(index.status, 200);
    host.stop().await;
}
