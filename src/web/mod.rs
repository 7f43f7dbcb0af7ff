//! The host's web UI over HTTP, on the loopback WebSocket server's port and origin: the files
//! of `web/app/` embedded in the binary ([`assets`]), answered by [`respond`], one request per
//! connection ([`http`]).
//!
//! Invariants:
//! - Only the paths in [`assets::ASSETS`] are served, only to `GET` and `HEAD`, and only when
//!   `Host` is this server's loopback address and any `Origin` is its own or configured — the
//!   same rule as the WebSocket handshake ([`Site`] is shared with it), so a page on another
//!   site or behind a rebinding DNS name reads nothing.
//! - Every response, errors included, carries [`SECURITY_HEADERS`]: a CSP that allows only
//!   this origin's scripts, styles and connections, no framing, no sniffing, no referrer.
//! - Nothing here knows grants, sessions or WebSockets: the files are public to anyone who
//!   may reach the port; a page gets a grant token from its user, never from this server.
//!
//! [`respond`] is pure; `ws::server` reads the head, routes `/subscribe` to the upgrade and
//! everything else here, and does the I/O.

pub mod assets;
pub mod http;

pub use http::{Head, HeadError, Response, Rewind, Status, read_head};

/// The Content-Security-Policy of every response.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; font-src 'self'; connect-src 'self'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Headers on every response, whatever its status.
pub const SECURITY_HEADERS: [(&str, &str); 7] = [
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-cache"),
];

const TEXT: &str = "text/plain; charset=utf-8";

/// Who this server is, for the `Host` and `Origin` checks of both HTTP and the WebSocket
/// upgrade.
#[derive(Debug, Clone, Copy)]
pub struct Site<'a> {
    /// The loopback port the server is bound to.
    pub port: u16,
    /// Origins besides this server's own that may connect (`ws_allowed_origins`: a desktop
    /// shell's `tauri://localhost`). Compared exactly.
    pub allowed_origins: &'a [String],
}

impl Site<'_> {
    /// `127.0.0.1:PORT` or `localhost:PORT`, case-insensitive: anything else is a name that
    /// resolved here by DNS rebinding, or a different server.
    pub fn host_ok(&self, host: &str) -> bool {
        let port = self.port;
        [format!("127.0.0.1:{port}"), format!("localhost:{port}")]
            .iter()
            .any(|h| h.eq_ignore_ascii_case(host))
    }

    /// This server's own origin (either name), or a configured one.
    pub fn origin_ok(&self, origin: &str) -> bool {
        let port = self.port;
        [
            format!("http://127.0.0.1:{port}"),
            format!("http://localhost:{port}"),
        ]
        .iter()
        .any(|o| o.eq_ignore_ascii_case(origin))
            || self.allowed_origins.iter().any(|o| o == origin)
    }
}

/// The answer to one request head: checks in the order Host, Origin, method, path.
pub fn respond(head: &Head, site: &Site<'_>) -> Response {
    let host_ok = matches!(head.hosts.as_slice(), [host] if site.host_ok(host));
    if !host_ok {
        return error(
            Status::Forbidden,
            b"Host must be this server's loopback address\n",
        );
    }
    if !head.origins.iter().all(|o| site.origin_ok(o)) {
        return error(Status::Forbidden, b"Origin not allowed\n");
    }
    let send_body = match head.method.as_str() {
        "GET" => true,
        "HEAD" => false,
        _ => {
            let mut response = error(Status::MethodNotAllowed, b"only GET and HEAD\n");
            response.headers.push(("Allow", "GET, HEAD".to_owned()));
            return response;
        }
    };
    let Some(found) = assets::lookup(&head.path) else {
        let mut response = error(Status::NotFound, b"not found\n");
        response.send_body = send_body;
        return response;
    };
    let mut response = with_security_headers(Status::Ok, found.asset.bytes);
    response.headers.push(("ETag", found.etag.to_owned()));
    if head.none_match_hits(found.etag) {
        response.status = Status::NotModified;
        response.send_body = false;
    } else {
        response
            .headers
            .push(("Content-Type", found.asset.content_type.to_owned()));
        response.send_body = send_body;
    }
    response
}

fn with_security_headers(status: Status, body: &'static [u8]) -> Response {
    Response {
        status,
        headers: SECURITY_HEADERS
            .iter()
            .map(|(name, value)| (*name, (*value).to_owned()))
            .collect(),
        body,
        send_body: true,
    }
}

fn error(status: Status, body: &'static [u8]) -> Response {
    let mut response = with_security_headers(status, body);
    response.headers.push(("Content-Type", TEXT.to_owned()));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: u16 = 4000;

    fn site() -> Site<'static> {
        static ALLOWED: [String; 0] = [];
        Site {
            port: PORT,
            allowed_origins: &ALLOWED,
        }
    }

    /// Parse a request head from its lines (the request line first), then answer it.
    fn answer(lines: &[&str]) -> Response {
        let raw = format!("{}\r\n\r\n", lines.join("\r\n"));
        let (head, _) = Head::parse(raw.as_bytes()).unwrap().unwrap();
        respond(&head, &site())
    }

    const HOST: &str = "Host: 127.0.0.1:4000";

    fn assert_secure(response: &Response) {
        for (name, value) in SECURITY_HEADERS {
            assert_eq!(response.header(name), Some(value), "{name}");
        }
        let head = String::from_utf8(response.head_bytes()).unwrap();
        assert!(head.contains(&format!("Content-Length: {}\r\n", response.body.len())));
        assert!(head.contains("Connection: close\r\n"));
        assert!(head.ends_with("\r\n\r\n"));
    }

    #[test]
    fn get_serves_the_file_with_every_security_header() {
        let response = answer(&["GET / HTTP/1.1", HOST]);
        assert_eq!(response.status, Status::Ok);
        assert_secure(&response);
        assert_eq!(
            response.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(
            response.sent_body(),
            include_bytes!("../../web/app/index.html")
        );
        let head = String::from_utf8(response.head_bytes()).unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
        let etag = response.header("etag").unwrap().to_owned();

        let js = answer(&[
            "GET /vendor/diff.min.js?v=2 HTTP/1.1",
            "host: LOCALHOST:4000",
        ]);
        assert_eq!(js.status, Status::Ok);
        assert_eq!(
            js.header("content-type"),
            Some("text/javascript; charset=utf-8")
        );

        // The page's own origin may fetch (a module script sends `Origin`).
        let own = answer(&[
            "GET /main.js HTTP/1.1",
            HOST,
            "Origin: http://127.0.0.1:4000",
        ]);
        assert_eq!(own.status, Status::Ok);
        assert_ne!(own.header("etag"), Some(etag.as_str()));
    }

    #[test]
    fn if_none_match_gets_304_without_a_body() {
        let etag = answer(&["GET /app.css HTTP/1.1", HOST])
            .header("etag")
            .unwrap()
            .to_owned();
        let inm = format!("If-None-Match: \"other\", {etag}");
        let response = answer(&["GET /app.css HTTP/1.1", HOST, &inm]);
        assert_eq!(response.status, Status::NotModified);
        assert_eq!(response.header("etag"), Some(etag.as_str()));
        assert!(response.sent_body().is_empty());
        assert_secure(&response);
        let stale = answer(&["GET /app.css HTTP/1.1", HOST, "If-None-Match: \"stale\""]);
        assert_eq!(stale.status, Status::Ok);
        assert!(!stale.sent_body().is_empty());
    }

    #[test]
    fn head_gets_the_headers_of_get_and_no_body() {
        let get = answer(&["GET /wire.js HTTP/1.1", HOST]);
        let head = answer(&["HEAD /wire.js HTTP/1.1", HOST]);
        assert_eq!(head.status, Status::Ok);
        assert_eq!(head.head_bytes(), get.head_bytes());
        assert!(head.sent_body().is_empty());
        assert!(!get.sent_body().is_empty());
        let missing = answer(&["HEAD /nope HTTP/1.1", HOST]);
        assert_eq!(missing.status, Status::NotFound);
        assert!(missing.sent_body().is_empty());
    }

    #[test]
    fn refusals_carry_the_security_headers_too() {
        let cases: &[(&[&str], Status)] = &[
            (&["POST / HTTP/1.1", HOST], Status::MethodNotAllowed),
            (
                &["DELETE /main.js HTTP/1.1", HOST],
                Status::MethodNotAllowed,
            ),
            (&["GET /nope HTTP/1.1", HOST], Status::NotFound),
            (&["GET /index.html/ HTTP/1.1", HOST], Status::NotFound),
            (
                &["GET / HTTP/1.1", "Host: evil.example:4000"],
                Status::Forbidden,
            ),
            (
                &["GET / HTTP/1.1", "Host: 127.0.0.1:4001"],
                Status::Forbidden,
            ),
            (&["GET / HTTP/1.1"], Status::Forbidden),
            (&["GET / HTTP/1.1", HOST, HOST], Status::Forbidden),
            (
                &["GET / HTTP/1.1", HOST, "Origin: https://evil.example"],
                Status::Forbidden,
            ),
            (
                &["GET / HTTP/1.1", HOST, "Origin: http://127.0.0.1:4001"],
                Status::Forbidden,
            ),
            // Host and Origin come before the method: a foreign page learns nothing.
            (
                &["POST / HTTP/1.1", HOST, "Origin: null"],
                Status::Forbidden,
            ),
        ];
        for (lines, status) in cases {
            let response = answer(lines);
            assert_eq!(response.status, *status, "{lines:?}");
            assert_secure(&response);
            assert_eq!(
                response.header("content-type"),
                Some("text/plain; charset=utf-8")
            );
            assert!(!response.sent_body().is_empty(), "{lines:?}");
            assert_eq!(
                response.header("allow").is_some(),
                *status == Status::MethodNotAllowed,
                "{lines:?}"
            );
        }
        assert_eq!(
            answer(&["POST / HTTP/1.1", HOST]).header("allow"),
            Some("GET, HEAD")
        );
    }

    #[test]
    fn configured_origins_are_allowed_exactly() {
        let allowed = ["tauri://localhost".to_owned()];
        let site = Site {
            port: PORT,
            allowed_origins: &allowed,
        };
        assert!(site.origin_ok("tauri://localhost"));
        assert!(!site.origin_ok("TAURI://localhost"));
        assert!(site.origin_ok("HTTP://LOCALHOST:4000"));
        assert!(!site.origin_ok("http://localhost"));
        assert!(site.host_ok("Localhost:4000"));
        assert!(!site.host_ok("localhost"));
    }
}
