//! The IPC transport (design §4): a Unix socket, `host.sock`, mode 0600. One JSON request line
//! per connection, one JSON reply line, close.
//!
//! - [`serve_connection`] is generic over `AsyncRead + AsyncWrite`, so it is tested over
//!   `tokio::io::duplex` and served over the real socket alike.
//! - Every request is bounded: at most [`Limits::max_request`] bytes and [`Limits::read_timeout`]
//!   to arrive. Anything malformed gets a request-error reply, never a silent close.
//! - At most [`MAX_CONNECTIONS`] connections are open at once (more wait in the kernel
//!   backlog), and at most [`MAX_IN_FLIGHT`] requests are being handled: a connection takes a
//!   handling slot only once its whole request line has arrived, so clients that connect and
//!   say nothing (or trickle bytes) cannot keep a real request waiting. Each is timed out.
//! - The client side is [`request`] (async) and [`request_blocking`] (no runtime: a one-shot CLI
//!   command asks one thing and exits).
//! - `interprocess` is imported here only.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use interprocess::local_socket::tokio::{Listener, Stream, prelude::*};
use interprocess::local_socket::{GenericFilePath, ListenerOptions};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::peer::{self, PeerUser};
use crate::protocol::envelope::{Command, ErrorCode, MAX_REQUEST_BYTES, Reply, RequestError};
use crate::request::{Caller, Handler};

/// Connections open at once, most of them possibly idle until their read timeout.
pub const MAX_CONNECTIONS: usize = 1024;
/// Requests being handled at once (read completely, waiting for their reply).
pub const MAX_IN_FLIGHT: usize = 64;

/// Bounds on one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request: usize,
    pub read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request: MAX_REQUEST_BYTES,
            read_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("no host answers on {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("IPC with the host failed: {0}")]
    Io(#[from] io::Error),
    #[error("the host did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the host's reply is not a valid reply line: {0}")]
    BadReply(String),
}

/// Bind the socket with mode 0600. The caller holds the instance lock, so a leftover socket
/// file is a dead host's and may be removed; the listener removes its own file on drop.
pub fn bind(path: &Path) -> Result<Listener, IpcError> {
    let bind_err = |source| IpcError::Bind {
        path: path.display().to_string(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed a stale socket file"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let name = path.to_fs_name::<GenericFilePath>().map_err(bind_err)?;
    ListenerOptions::new()
        .name(name)
        .mode(0o600)
        .reclaim_name(true)
        .create_tokio()
        .map_err(bind_err)
}

/// Accept until `cancel`, serving each connection on `tracker`.
pub async fn serve(
    listener: Listener,
    dispatcher: Handler,
    limits: Limits,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let handling = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(stream) => stream,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "IPC accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Stream::UdSocket(socket) = &stream;
        let peer = PeerUser::of(socket);
        let dispatcher = dispatcher.clone();
        let handling = handling.clone();
        tracker.spawn(async move {
            if let Err(e) = serve_limited(stream, &dispatcher, limits, &handling, peer).await {
                tracing::debug!(error = %e, "IPC connection ended with an error");
            }
            drop(permit);
        });
    }
    tracing::debug!("IPC listener stopped");
    // Dropping the listener removes the socket file (name reclamation).
    drop(listener);
}

/// Serve one request on one connection: read a line, dispatch, write a line.
pub async fn serve_connection<S>(stream: S, dispatcher: &Handler, limits: Limits) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handling = Semaphore::new(MAX_IN_FLIGHT);
    serve_limited(stream, dispatcher, limits, &handling, PeerUser::Own).await
}

/// Another user's peer gets [`peer::OTHER_USER_TIMEOUT`] to send the request it is refused.
fn limits_for(peer: PeerUser, limits: Limits) -> Limits {
    if peer.is_other() {
        Limits {
            read_timeout: limits.read_timeout.min(peer::OTHER_USER_TIMEOUT),
            ..limits
        }
    } else {
        limits
    }
}

/// [`serve_connection`], taking a slot of `handling` only once the request line is read.
async fn serve_limited<S>(
    stream: S,
    dispatcher: &Handler,
    limits: Limits,
    handling: &Semaphore,
    peer: PeerUser,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (read, mut write) = tokio::io::split(stream);
    let request = read_request(read, limits_for(peer, limits)).await;
    // Another user's request is read (so that it gets its answer, not a broken pipe) and
    // never handled.
    let reply = match (request, peer.refusal()) {
        (_, Some(why)) => RequestError::new(ErrorCode::PeerRefused, why).into_reply(),
        (Ok(bytes), None) => match Command::parse_bytes(&bytes) {
            Ok(command) => {
                tracing::debug!(command = command.name(), "IPC request");
                // Held while the command runs, not while a slow client reads the reply.
                let _slot = handling.acquire().await.ok();
                dispatcher.handle(&Caller::ipc(), command).await
            }
            Err(e) => e.into_reply(),
        },
        (Err(e), None) => e.into_reply(),
    };
    let mut line = reply.to_line();
    line.push('\n');
    // A client that never reads must not hold a connection slot for ever.
    let written = tokio::time::timeout(limits.read_timeout.max(Duration::from_secs(5)), async {
        write.write_all(line.as_bytes()).await?;
        write.shutdown().await
    })
    .await;
    written.unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client did not read the reply",
        ))
    })
}

/// Read one request line (without its newline) within the limits.
pub async fn read_request<R: AsyncRead + Unpin>(
    read: R,
    limits: Limits,
) -> Result<Vec<u8>, RequestError> {
    let mut reader = BufReader::new(read.take(limits.max_request as u64 + 1));
    let mut buf = Vec::new();
    let read = tokio::time::timeout(limits.read_timeout, reader.read_until(b'\n', &mut buf)).await;
    match read {
        Err(_) => Err(RequestError::new(
            ErrorCode::RequestTimeout,
            format!("no complete request line within {:?}", limits.read_timeout),
        )),
        Ok(Err(e)) => Err(RequestError::new(
            ErrorCode::EmptyRequest,
            format!("reading the request failed: {e}"),
        )),
        Ok(Ok(_)) => {
            if buf.last() == Some(&b'\n') {
                buf.pop();
            } else if buf.len() > limits.max_request {
                return Err(RequestError::new(
                    ErrorCode::RequestTooLarge,
                    format!("request exceeds {} bytes", limits.max_request),
                ));
            }
            if buf.is_empty() {
                return Err(RequestError::new(
                    ErrorCode::EmptyRequest,
                    "the connection sent no request",
                ));
            }
            Ok(buf)
        }
    }
}

/// Client side: send one envelope, read one reply.
pub async fn request(path: &Path, envelope: &Value, timeout: Duration) -> Result<Reply, IpcError> {
    let name = path
        .to_fs_name::<GenericFilePath>()
        .map_err(|source| IpcError::Connect {
            path: path.display().to_string(),
            source,
        })?;
    let stream = Stream::connect(name)
        .await
        .map_err(|source| IpcError::Connect {
            path: path.display().to_string(),
            source,
        })?;
    let exchange = async {
        let (read, mut write) = tokio::io::split(stream);
        let mut line =
            serde_json::to_string(envelope).map_err(|e| IpcError::BadReply(e.to_string()))?;
        line.push('\n');
        write.write_all(line.as_bytes()).await?;
        let mut reader = BufReader::new(read.take(64 * 1024 * 1024));
        let mut reply = String::new();
        reader.read_line(&mut reply).await?;
        serde_json::from_str::<Reply>(reply.trim_end())
            .map_err(|e| IpcError::BadReply(e.to_string()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| IpcError::Timeout(timeout))?
}

/// Client side without a runtime: [`request`]'s exchange over a blocking socket, for a one-shot
/// CLI command (one request line, one reply line, exit), which then needs no tokio runtime.
/// The connect is non-blocking as [`request`]'s is (a full backlog is refused at once, not
/// waited on), and `timeout` bounds the whole exchange after it.
pub fn request_blocking(
    path: &Path,
    envelope: &Value,
    timeout: Duration,
) -> Result<Reply, IpcError> {
    use interprocess::ConnectWaitMode;
    use interprocess::local_socket::ConnectOptions;
    use interprocess::os::unix::uds_local_socket::Stream as UdStream;
    use std::io::{BufRead, Write};

    let connect_err = |source| IpcError::Connect {
        path: path.display().to_string(),
        source,
    };
    let name = path.to_fs_name::<GenericFilePath>().map_err(connect_err)?;
    let stream = ConnectOptions::new()
        .name(name)
        .wait_mode(ConnectWaitMode::Timeout(timeout))
        .connect_sync_as::<UdStream>()
        .map_err(connect_err)?;
    let mut deadline = Deadline {
        stream: stream.inner(),
        until: std::time::Instant::now() + timeout,
    };
    let timed_out = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => IpcError::Timeout(timeout),
        _ => IpcError::Io(e),
    };
    let mut line =
        serde_json::to_string(envelope).map_err(|e| IpcError::BadReply(e.to_string()))?;
    line.push('\n');
    deadline.write_all(line.as_bytes()).map_err(timed_out)?;
    let mut reader = io::BufReader::new(io::Read::take(deadline, 64 * 1024 * 1024));
    let mut reply = String::new();
    reader.read_line(&mut reply).map_err(timed_out)?;
    serde_json::from_str::<Reply>(reply.trim_end()).map_err(|e| IpcError::BadReply(e.to_string()))
}

/// A blocking socket whose every read and write is bounded by what is left until `until`.
struct Deadline<'s> {
    stream: &'s std::os::unix::net::UnixStream,
    until: std::time::Instant,
}

impl Deadline<'_> {
    /// The time left, or `TimedOut` once it is spent (a zero timeout would mean "none").
    fn left(&self) -> io::Result<Option<Duration>> {
        let left = self
            .until
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(Some(left))
    }
}

impl io::Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(self.left()?)?;
        io::Read::read(&mut self.stream, buf)
    }
}

impl io::Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(self.left()?)?;
        io::Write::write(&mut self.stream, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::Bus;
    use crate::instance::LockInfo;
    use crate::session::SessionManager;
    use crate::store::Store;

    /// The runtime-free client: one line out, one reply in; a host that never answers is a
    /// timeout (bounded by the deadline), and no socket is "no host".
    #[test]
    fn the_blocking_client_exchanges_one_line_and_keeps_its_deadline() {
        use std::io::{BufRead, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.sock");
        let envelope = serde_json::json!({"command": "host.status"});
        let err = request_blocking(&path, &envelope, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, IpcError::Connect { .. }), "{err}");

        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(&stream)
                .read_line(&mut line)
                .unwrap();
            let reply = Reply::ok(serde_json::json!({"echo": line.trim_end()}));
            writeln!(&stream, "{}", reply.to_line()).unwrap();
            // The next client is accepted by the kernel and never answered.
            listener
        });
        let reply = request_blocking(&path, &envelope, Duration::from_secs(5)).unwrap();
        assert_eq!(reply.data["echo"], serde_json::json!(envelope.to_string()));
        let _listener = server.join().unwrap();
        let err = request_blocking(&path, &envelope, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, IpcError::Timeout(_)), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_times_out_without_real_waiting() {
        let (_client, server) = tokio::io::duplex(64);
        let err = read_request(server, Limits::default()).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::RequestTimeout);
    }

    #[tokio::test]
    async fn oversized_and_unterminated_requests() {
        let limits = Limits {
            max_request: 16,
            read_timeout: Duration::from_secs(5),
        };
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(&[b'x'; 40]).await.unwrap();
        let err = read_request(server, limits).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::RequestTooLarge);

        // A request closed by EOF instead of a newline still counts.
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(b"{}").await.unwrap();
        drop(client);
        assert_eq!(read_request(server, limits).await.unwrap(), b"{}");
    }

    #[tokio::test]
    async fn one_line_in_one_line_out_over_a_duplex() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let (bus, tasks) = Bus::start(store.clone()).await.unwrap();
        let info = LockInfo {
            pid: 1,
            version: "t".into(),
            ipc_path: "t".into(),
            ws_port: None,
            started_at: "t".into(),
        };
        let sessions = SessionManager::new(
            store.clone(),
            bus.clone(),
            std::sync::Arc::new(crate::session::NoAgents),
        );
        let grants = std::sync::Arc::new(crate::subscribers::GrantStore::new(
            crate::clock::Clock::system(),
        ));
        let subscribers = crate::subscribers::Subscribers::new(
            store.clone(),
            bus.clone(),
            sessions.clone(),
            grants,
            1,
        );
        let config = std::sync::Arc::new(crate::config::Config::with_home("/nonexistent").unwrap());
        let dispatcher = Handler::new(
            sessions,
            subscribers,
            info,
            config,
            CancellationToken::new(),
        );
        for (request, code) in [
            (&b"{\"command\":\"session.list\"}\n"[..], 0),
            (&b"{\"command\":\"session.lst\"}\n"[..], 1004),
        ] {
            let (mut client, server) = tokio::io::duplex(4096);
            client.write_all(request).await.unwrap();
            serve_connection(server, &dispatcher, Limits::default())
                .await
                .unwrap();
            let mut out = String::new();
            client.read_to_string(&mut out).await.unwrap();
            assert!(
                out.ends_with('\n') && out.matches('\n').count() == 1,
                "{out:?}"
            );
            let reply: Reply = serde_json::from_str(out.trim_end()).unwrap();
            assert_eq!(reply.code, code, "{out}");
        }
        drop((dispatcher, bus));
        tasks.shutdown().await;
        drop(store);
        threads.shutdown().await;
    }
}
