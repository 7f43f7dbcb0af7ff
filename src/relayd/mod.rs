//! The relay service (`agent-host-relay`, docs/relay.md "The relay service"): a fleet of
//! stateless instances behind one URL, joined by NATS JetStream. Hosts dial `/host`, bots dial
//! `/bot`; a bot on one instance reaches a host on another, and either side may come back on
//! any instance after a drop (or after the instance died) without losing frames. The frames are
//! `proto/relay.proto` ([`crate::protocol::relay_wire`]); what the endpoints seal inside them
//! is theirs: the relay routes by kind and channel and never reads, logs or keeps content
//! anywhere but in JetStream, where only sealed frames rest, for at most 30 s.
//!
//! - [`server`] — the listener, `/healthz`, the upgrade and the token check.
//! - [`host`], [`bot`] — one connection of each side: hello rules, routing, presence.
//! - [`endpoint`] — what both share: the writer, publish acks, pumps, liveness, the close.
//! - [`broker`] — NATS: streams, durable consumers, the presence bucket.
//! - [`error`] — errors and their stable `Error` frame codes.
//!
//! Overload policy, edge by edge (each queue is bounded; [`endpoint`] has the detail):
//! endpoint → relay is read only as fast as JetStream acks its publishes (64 in flight per
//! connection, then TCP back-pressure); relay → endpoint holds at most a consumer's 64 unacked
//! frames plus a 64-frame writer queue per connection, the rest stays in JetStream (bounded per
//! subject at 4096 frames and 30 s, oldest dropped first — a consumer that far behind has a gap
//! its Noise channel reports); connections beyond 16384 wait in the accept backlog.
//!
//! Shutdown ([`run`]): stop accepting, end every connection with `Error{shutting_down}` (a
//! host's presence key is deleted first), wait for them within a grace period, flush NATS.
//! Frames a connection had taken but not written stay un-acked and are redelivered.

pub mod bot;
pub mod broker;
pub mod endpoint;
pub mod error;
pub mod host;
pub mod server;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use broker::Broker;
pub use error::{BrokerError, RelayError, RunError};

/// How long an endpoint has, after the upgrade, to send its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections get to close at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What an instance is told at start. Its `Debug` leaves the tokens out.
#[derive(Clone)]
pub struct Options {
    /// `ADDR:PORT` to listen on (port 0: any free port).
    pub listen: String,
    /// The NATS server, e.g. `nats://127.0.0.1:4222`.
    pub nats_url: String,
    /// The token hosts present on `/host`. Never logged.
    pub host_token: String,
    /// The token bots present on `/bot`. Never logged.
    pub bot_token: String,
    /// This instance's id in `Welcome` and the presence bucket.
    pub instance: String,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("listen", &self.listen)
            .field("nats_url", &self.nats_url)
            .field("host_token", &"<redacted>")
            .field("bot_token", &"<redacted>")
            .field("instance", &self.instance)
            .finish()
    }
}

/// Reported once the instance serves.
#[derive(Debug, Clone)]
pub struct Ready {
    pub addr: SocketAddr,
    pub instance: String,
}

/// What every connection shares.
pub struct Shared {
    pub broker: Broker,
    pub instance: String,
    pub tokens: server::Tokens,
}

/// A random instance id, for when none is given.
pub fn random_instance() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("relay-{}", &id[..12])
}

/// Run one instance until `shutdown` resolves: connect to NATS (and create the streams and
/// the bucket), bind, report [`Ready`] on `ready`, serve, then shut down in order.
pub async fn run(
    options: Options,
    shutdown: impl Future<Output = ()>,
    ready: oneshot::Sender<Ready>,
) -> Result<(), RunError> {
    if options.host_token.is_empty() || options.bot_token.is_empty() {
        return Err(RunError::Config(
            "both a host token and a bot token are needed".to_owned(),
        ));
    }
    if options.host_token == options.bot_token {
        return Err(RunError::Config(
            "the host token and the bot token must differ".to_owned(),
        ));
    }
    let broker = Broker::connect(&options.nats_url, &options.instance).await?;
    let listener = TcpListener::bind(&options.listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: options.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| RunError::Bind {
        addr: options.listen.clone(),
        source,
    })?;
    let shared = Arc::new(Shared {
        broker: broker.clone(),
        instance: options.instance.clone(),
        tokens: server::Tokens::new(&options.host_token, &options.bot_token),
    });
    tracing::info!(%addr, instance = %options.instance, "relay serving");
    if ready
        .send(Ready {
            addr,
            instance: options.instance.clone(),
        })
        .is_err()
    {
        tracing::debug!("nobody waits for the ready report");
    }
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let serving = server::serve(listener, shared, cancel.clone(), tracker.clone());
    tokio::select! {
        () = serving => {}
        () = shutdown => {}
    }
    tracing::info!("relay stopping");
    cancel.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still closing after the grace period");
    }
    // With NATS down a flush waits for a reconnect that may never come: bounded, so a
    // SIGTERM always ends the process.
    if tokio::time::timeout(SHUTDOWN_GRACE, broker.flush())
        .await
        .is_err()
    {
        tracing::warn!("NATS did not take the last publishes within the grace period");
    }
    tracing::info!("relay stopped");
    Ok(())
}
