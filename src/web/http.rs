//! Just enough HTTP/1.1 for the web UI: read one request head off a stream (bounded), parse it
//! with `httparse`, write one response and close. No keep-alive, no request bodies, no
//! chunking: the UI's files are small and fetched once per page load.
//!
//! [`Rewind`] hands a stream whose head has already been read on to the WebSocket handshake:
//! it replays the bytes read, then reads from the stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The most a request head may take, request line and headers together.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The most headers a request may have (tungstenite's own limit is 124).
const MAX_HEADERS: usize = 124;
/// How much of what a client sends after its head is read and dropped before closing, so the
/// close is a FIN after the response rather than a reset that could destroy it.
const MAX_DRAIN_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is larger than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("malformed request head: {0}")]
    Malformed(#[from] httparse::Error),
    #[error("the connection closed before the request head was complete")]
    Closed,
    #[error("io: {0}")]
    Io(#[from] io::Error),
}

/// The parts of a request head the server looks at. Header values that are not UTF-8 are
/// kept lossily: they then match nothing, which is what a check wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// The request target without its query string. Never log more than this: a query may
    /// carry something a page did not mean to publish.
    pub path: String,
    /// Every `Host` value (a valid request has exactly one).
    pub hosts: Vec<String>,
    /// Every `Origin` value (browsers send at most one).
    pub origins: Vec<String>,
    /// Every `If-None-Match` value, as sent (each may be a list).
    pub if_none_match: Vec<String>,
}

impl Head {
    /// Parse a head from the start of `buf`: `None` while incomplete, else the head and how
    /// many bytes it took.
    pub fn parse(buf: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        let httparse::Status::Complete(len) = request.parse(buf)? else {
            return Ok(None);
        };
        let target = request.path.unwrap_or_default();
        let path = target.split_once('?').map_or(target, |(path, _)| path);
        let mut head = Head {
            method: request.method.unwrap_or_default().to_owned(),
            path: path.to_owned(),
            hosts: Vec::new(),
            origins: Vec::new(),
            if_none_match: Vec::new(),
        };
        for header in request.headers.iter() {
            let list = if header.name.eq_ignore_ascii_case("host") {
                &mut head.hosts
            } else if header.name.eq_ignore_ascii_case("origin") {
                &mut head.origins
            } else if header.name.eq_ignore_ascii_case("if-none-match") {
                &mut head.if_none_match
            } else {
                continue;
            };
            list.push(String::from_utf8_lossy(header.value).trim().to_owned());
        }
        Ok(Some((head, len)))
    }

    /// Whether `If-None-Match` names `etag` (or is `*`). The comparison is the weak one
    /// RFC 9110 prescribes for this header, so a `W/` prefix does not matter.
    pub fn none_match_hits(&self, etag: &str) -> bool {
        self.if_none_match
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag)
    }
}

/// Read until a request head is complete, at most [`MAX_HEAD_BYTES`]. Returns the head and
/// every byte read (the head and whatever followed it), for [`Rewind`]. No timeout of its
/// own: the caller bounds it.
pub async fn read_head<S>(stream: &mut S) -> Result<(Head, Bytes), HeadError>
where
    S: AsyncRead + Unpin,
{
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let room = MAX_HEAD_BYTES.saturating_sub(buf.len()).min(chunk.len());
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let n = stream.read(&mut chunk[..room]).await?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((head, _len)) = Head::parse(&buf)? {
            return Ok((head, Bytes::from(buf)));
        }
    }
}

/// A stream that first yields `replay`, then reads from `inner`; writes go to `inner`.
#[derive(Debug)]
pub struct Rewind<S> {
    replay: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(replay: Bytes, inner: S) -> Rewind<S> {
        Rewind { replay, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replay.has_remaining() {
            let n = this.replay.len().min(buf.remaining());
            buf.put_slice(&this.replay[..n]);
            this.replay.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The statuses the web UI answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    NotModified,
    Forbidden,
    NotFound,
    MethodNotAllowed,
}

impl Status {
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::NotModified => 304,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::NotModified => "Not Modified",
            Status::Forbidden => "Forbidden",
            Status::NotFound => "Not Found",
            Status::MethodNotAllowed => "Method Not Allowed",
        }
    }
}

/// One complete response. `Content-Length` and `Connection: close` are added when it is
/// written; everything else is in `headers`.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: Status,
    pub headers: Vec<(&'static str, String)>,
    /// What `Content-Length` announces: the body a `GET` gets.
    pub body: &'static [u8],
    /// `false` for `HEAD` and 304: the headers describe the body, which is not sent.
    pub send_body: bool,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The bytes sent after the head.
    pub fn sent_body(&self) -> &'static [u8] {
        if self.send_body { self.body } else { &[] }
    }

    /// The status line and headers, through the blank line.
    pub fn head_bytes(&self) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\n",
            self.status.code(),
            self.status.reason()
        );
        for (name, value) in &self.headers {
            head.push_str(name);
            head.push_str(": ");
            head.push_str(value);
            head.push_str("\r\n");
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        head.into_bytes()
    }

    /// Write the response, then close: shut our side down and drop (a bounded amount of)
    /// whatever the client still sends until it closes too. No timeout of its own.
    pub async fn send<S>(&self, stream: &mut S) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        stream.write_all(&self.head_bytes()).await?;
        stream.write_all(self.sent_body()).await?;
        stream.flush().await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 2048];
        let mut drained = 0;
        while drained < MAX_DRAIN_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_parses_into_what_the_server_checks() {
        let raw = b"GET /main.js?token=secret HTTP/1.1\r\nHost: 127.0.0.1:4000\r\n\
            origin: http://127.0.0.1:4000\r\nIf-None-Match: \"a\", W/\"b\"\r\n\r\nextra";
        let (head, len) = Head::parse(raw).unwrap().unwrap();
        assert_eq!(len, raw.len() - b"extra".len());
        assert_eq!(head.method, "GET");
        assert_eq!(head.path, "/main.js");
        assert_eq!(head.hosts, ["127.0.0.1:4000"]);
        assert_eq!(head.origins, ["http://127.0.0.1:4000"]);
        assert!(head.none_match_hits("\"a\""));
        assert!(head.none_match_hits("\"b\""));
        assert!(!head.none_match_hits("\"c\""));
        assert!(
            Head::parse(b"GET / HTTP/1.1\r\nHost: x\r\n")
                .unwrap()
                .is_none()
        );
        assert!(Head::parse(b"\x01\x02 nonsense\r\n\r\n").is_err());
    }

    #[tokio::test]
    async fn read_head_is_bounded_and_rewind_replays_everything_read() {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client
            .write_all(b"GET /subscribe HTTP/1.1\r\nHost: h\r\n\r\nframe")
            .await
            .unwrap();
        let (head, bytes) = read_head(&mut server).await.unwrap();
        assert_eq!(head.path, "/subscribe");
        let mut rewound = Rewind::new(bytes, server);
        client.write_all(b"+more").await.unwrap();
        drop(client);
        let mut all = Vec::new();
        rewound.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GET /subscribe HTTP/1.1\r\nHost: h\r\n\r\nframe+more");

        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD_BYTES));
        client.write_all(long.as_bytes()).await.unwrap();
        assert!(matches!(
            read_head(&mut server).await,
            Err(HeadError::TooLarge)
        ));

        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"GET / HT").await.unwrap();
        drop(client);
        assert!(matches!(
            read_head(&mut server).await,
            Err(HeadError::Closed)
        ));
    }
}
