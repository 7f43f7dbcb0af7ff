//! The host's client of the sealed relay fleet (`[fleet]`, docs/relay.md "The host's fleet
//! client"): one task owns the connection to an `agent-host-relay` instance, the table of the
//! bots' channels, and the status `host.status` shows as `fleet`.
//!
//! 1. Dial the URLs in turn (`Authorization: Bearer <token>`, `wss://` or `ws://` to
//!    loopback), send `HostHello{host_id}` (the host key, `relay.key`, made on first need),
//!    expect `Welcome{instance}` — all within `connect_timeout_ms`. A failure tries the next
//!    URL; after a full round of failures, a capped exponential backoff with jitter.
//! 2. Connected: every `probe_interval_ms` a `Ping{id, loop_back: true}`, which the relay
//!    sends through NATS and back as `Pong{id}`: the state is `connected` once one came back
//!    (with `round_trip_ms`), `degraded` when none came back for `degraded_after_ms` — and
//!    the client moves to the next URL. WebSocket pings every `ping_interval_ms`; nothing at
//!    all for `dead_peer_ms` drops the connection.
//! 3. A bot's `Open{channel, kind, …}` is a handshake ([`handshake`], in its own task, at most
//!    [`MAX_HANDSHAKES`] at once): pairing (`PairRegistry::begin_pair` → Noise with the
//!    secret → `complete_pair`) or connecting (Noise → `PairRegistry::bot`). A refusal is
//!    `Closed{reason}` ([`reasons`]). Accepted, the channel runs in its own task
//!    ([`super::channel`]): the existing link over an in-memory WebSocket, subscriber
//!    `bot-<bot_id>`, the bot's paired scope. On a live channel id, an `Open` with the same
//!    message 1 gets the stored `Accept` again (at-least-once delivery); another replaces it
//!    only if its handshake succeeds for the same bot, else it is dropped with no `Closed`
//!    (which would reach the live bot). A message 1 whose ephemeral key was seen lately is a
//!    replay, dropped. At most [`MAX_CHANNELS_PER_BOT`] per bot (a new one supersedes the
//!    oldest) and [`MAX_CHANNELS`] in all (then `busy`).
//! 4. Channels outlive the connection: their Noise state and link are in the host, what they
//!    send meanwhile waits in their bounded queues, and they are closed (`expired`) once
//!    there has been no connection for `channel_hold_ms`. `Closed` frames the host owes
//!    while disconnected are sent first on the next connection.
//! 5. Revocation (`PairRegistry::revocations`) closes the bot's channels at once
//!    (`Closed{revoked}`, the link cancelled); a lagging receiver re-checks every live bot.
//!
//! Overload: the fleet task never waits on one channel — a bot's frames go to its channel
//! with `try_send`, and a full inbound queue closes that channel (`overflow`); the channels'
//! outbound queues are drained round-robin in batches while connected, and are the only place
//! frames wait ([`super::channel`] has the detail). Handshakes beyond [`MAX_HANDSHAKES`] are
//! refused (`busy`); `Closed` frames owed while disconnected are kept up to
//! [`MAX_PENDING_CLOSES`], oldest dropped first.
//!
//! A relay that sends garbage — frames that do not decode, of kinds a host never gets, for
//! channels it does not have — costs a log line and the frame; nothing here panics on outside
//! data. Logs name URLs, instances, channel and bot ids and sizes, never a token or content.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, SelectAll, SplitSink, SplitStream};
use futures_util::{FutureExt, SinkExt, StreamExt};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Semaphore, broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::channel::{self, ChannelTask, INBOUND_FRAMES, OUTBOUND_FRAMES, Out};
use super::client::{DialError, request_of};
use crate::config::{FleetConfig, FleetTiming, RelayConfig, RelayTiming, Scope};
use crate::link::Link;
use crate::protocol::relay_wire::{
    self, Accept, Body, Closed, FrameError, HostHello, MAX_RELAY_FRAME_BYTES, Ping, Pong,
};
use crate::request::access::bot_subscriber_id;
use crate::seal::pairs::{BotRecord, PairError, PairRegistry};
use crate::seal::{Accepted, Channel, HandshakeKind, HostHandshake, HostKey, SealedFrame};
use crate::store::{SubscriberRow, now_ms};
use crate::subscribers::Subscribers;

/// The `Closed{reason}` a host sends. The first three are the contract's handshake refusals.
pub mod reasons {
    /// A connect handshake from a key that never paired.
    pub const UNKNOWN_BOT: &str = "unknown_bot";
    /// The bot was revoked (at the handshake, or later: its channels close at once).
    pub const REVOKED: &str = "revoked";
    /// A pairing with a secret that is unknown, used, expired or wrong: one reason for all.
    pub const PAIRING_REFUSED: &str = "pairing_refused";
    /// Message 1 does not read, or `Open.kind` is neither 0 nor 1.
    pub const BAD_HANDSHAKE: &str = "bad_handshake";
    /// Too many handshakes at once; try again.
    pub const BUSY: &str = "busy";
    /// A `Sealed` frame for a channel the host does not have (closed, or the host restarted):
    /// handshake again.
    pub const UNKNOWN_CHANNEL: &str = "unknown_channel";
    /// A sealed frame arrived ahead of the one expected (one was lost).
    pub const GAP: &str = "gap";
    /// A sealed frame that does not decrypt.
    pub const DECRYPT: &str = "decrypt";
    /// An inner message over the reassembly limit.
    pub const TOO_LARGE: &str = "too_large";
    /// The Noise channel failed otherwise.
    pub const BROKEN: &str = "broken";
    /// The bot sent faster than the host serves it, or its frames found no way out.
    pub const OVERFLOW: &str = "overflow";
    /// The bot sent nothing for `channel_idle_ms`.
    pub const IDLE: &str = "idle";
    /// No fleet connection for `channel_hold_ms`.
    pub const EXPIRED: &str = "expired";
    /// The host's side ended the conversation (no `Hello` in time, a protocol error, the
    /// subscriber removed); the link said why in a sealed error first when it could.
    pub const ENDED: &str = "ended";
    /// The host is stopping, or `[fleet]` was removed.
    pub const HOST_STOPPING: &str = "host_stopping";
    /// Something on the host failed (the store); try again.
    pub const INTERNAL: &str = "internal";
    /// The bot opened more than [`super::MAX_CHANNELS_PER_BOT`] channels: its oldest is closed.
    pub const SUPERSEDED: &str = "superseded";
}

/// Handshakes in flight at once; more are refused `busy`.
pub const MAX_HANDSHAKES: usize = 16;
/// `Closed` frames kept for the next connection.
pub const MAX_PENDING_CLOSES: usize = 1024;
/// How long one handshake may take (store lookups included).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Frames written per flush at most.
const WRITE_BATCH: usize = 64;
/// Probes remembered per connection (older ones count as lost).
const MAX_PROBES: usize = 64;
/// Unknown channels already answered, so a burst of frames gets one `Closed`.
const RECENT_UNKNOWN: usize = 64;
/// Results of handshakes and re-checks waiting for the fleet task.
const EVENTS: usize = 64;
/// The most URLs `[fleet] urls` may list.
pub const MAX_URLS: usize = 32;
/// How long revocations are remembered against handshakes still in flight.
const REVOKED_MEMORY: Duration = Duration::from_secs(60);
/// Channels one bot may hold; opening one more closes its oldest (`superseded`).
pub const MAX_CHANNELS_PER_BOT: usize = 8;
/// Channels in all; past it a new channel is refused (`busy`).
pub const MAX_CHANNELS: usize = 1024;
/// Channels whose link is waiting for the bot's `Hello` at once (more wait their turn).
pub const MAX_BEFORE_HELLO: usize = 64;
/// Message-1 ephemeral keys remembered against replays, and for how long.
const SEEN_EPHEMERALS: usize = 4096;
const EPHEMERAL_MEMORY: Duration = Duration::from_secs(600);
/// The largest value a `[fleet.timing]` key may have (a day).
pub const MAX_TIMING_MS: u64 = 86_400_000;

/// Why the fleet configuration cannot work, or a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("[fleet] needs at least one URL in urls")]
    NoUrls,
    #[error("[fleet] lists {0} URLs; at most {MAX_URLS} are allowed")]
    TooManyUrls(usize),
    #[error("{url}: {source}")]
    Url {
        url: String,
        #[source]
        source: DialError,
    },
    #[error("bot_urls: {url}: {source}")]
    BotUrl {
        url: String,
        #[source]
        source: DialError,
    },
    #[error(
        "[fleet.timing] degraded_after_ms ({degraded}) must be longer than probe_interval_ms \
         ({probe}): a probe must have time to come back"
    )]
    Timing { probe: u64, degraded: u64 },
    #[error("[fleet.timing] {key} ({value}) is larger than {MAX_TIMING_MS} ms (a day)")]
    TimingTooLarge { key: &'static str, value: u64 },
    #[error("the host key: {0}")]
    HostKey(#[source] PairError),
    #[error("no Welcome within {0} ms")]
    Timeout(u64),
    #[error("the relay refused the token (HTTP {0})")]
    Unauthorized(u16),
    #[error("the relay answered the upgrade with HTTP {0}")]
    Http(u16),
    #[error("{0}")]
    Ws(String),
    #[error("the relay closed before its Welcome")]
    NoWelcome,
    #[error("the relay sent {0} before its Welcome")]
    Unexpected(&'static str),
    #[error("the relay said {code}: {message}")]
    Relay { code: String, message: String },
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Where the fleet connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetState {
    /// No `[fleet]` configured.
    Disabled,
    /// Dialing, or connected but no loop-back round trip yet.
    Connecting,
    /// Connected, and a loop-back ping came back through NATS.
    Connected,
    /// No loop-back pong for `degraded_after_ms`: moving to the next URL.
    Degraded,
    /// Waiting out the backoff after a full round of failures.
    Waiting,
    /// The configuration cannot work (see `last_error`): not dialed until it changes.
    Misconfigured,
}

/// How one configured relay URL last fared (`fleet.relays`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RelayHealthState {
    /// Not dialed yet under this configuration.
    Untried,
    /// The fleet connection now, and a loop-back ping came back through it.
    Connected,
    /// Its last connection was accepted but carried no loop-back round trip in time.
    Degraded,
    /// Its last attempt failed (no connection, refused, dropped before a round trip).
    Unreachable,
    /// It worked when last used; the fleet is on another URL now.
    Standby,
}

/// One configured relay URL as the host last saw it: a relay that "shows green" while nothing
/// flows is told apart by its round trip, not its connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RelayHealth {
    pub url: String,
    pub state: RelayHealthState,
    /// When a loop-back ping last came back through this relay (ms since the epoch).
    pub last_round_trip_at_ms: Option<i64>,
    /// How long that one took.
    pub round_trip_ms: Option<u64>,
    /// Why its last attempt or connection failed.
    pub last_error: Option<String>,
}

impl RelayHealth {
    fn untried(url: &str) -> RelayHealth {
        RelayHealth {
            url: url.to_owned(),
            state: RelayHealthState::Untried,
            last_round_trip_at_ms: None,
            round_trip_ms: None,
            last_error: None,
        }
    }
}

/// The entry of `url` in `relays`.
fn relay_of<'a>(relays: &'a mut [RelayHealth], url: &str) -> Option<&'a mut RelayHealth> {
    relays.iter_mut().find(|r| r.url == url)
}

/// What `host.status` shows as `fleet`. The token never appears here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetStatus {
    pub state: FleetState,
    /// The URL dialed or connected.
    pub url: Option<String>,
    /// The relay instance connected (its `Welcome`).
    pub instance: Option<String>,
    /// This host's id on the fleet (known once the host key is loaded).
    pub host_id: Option<String>,
    /// When the current state began (ms since the epoch).
    pub since_ms: i64,
    /// When a loop-back ping last came back (ms since the epoch).
    pub last_round_trip_at_ms: Option<i64>,
    /// How long it took.
    pub round_trip_ms: Option<u64>,
    /// Bot channels open now.
    pub channels: usize,
    /// Failed attempts since the last stable connection.
    pub retries: u32,
    /// Why the last attempt failed or the last connection ended.
    pub last_error: Option<String>,
    /// How long the current backoff wait is.
    pub retry_in_ms: Option<u64>,
    /// Every configured URL, in order, with its own last round trip and error.
    pub relays: Vec<RelayHealth>,
}

impl FleetStatus {
    fn disabled() -> FleetStatus {
        FleetStatus {
            state: FleetState::Disabled,
            url: None,
            instance: None,
            host_id: None,
            since_ms: now_ms(),
            last_round_trip_at_ms: None,
            round_trip_ms: None,
            channels: 0,
            retries: 0,
            last_error: None,
            retry_in_ms: None,
            relays: Vec::new(),
        }
    }
}

/// The host's handle on its fleet client.
#[derive(Clone)]
pub struct FleetHandle {
    config: watch::Sender<Option<FleetConfig>>,
    status: watch::Receiver<FleetStatus>,
}

impl FleetHandle {
    /// The status now.
    pub fn status(&self) -> FleetStatus {
        self.status.borrow().clone()
    }

    /// A receiver of every status change (tests wait on it instead of polling).
    pub fn watch_status(&self) -> watch::Receiver<FleetStatus> {
        self.status.clone()
    }

    /// Use this fleet from now on (`None`: none, and every channel is closed). The current
    /// connection is closed and the new URLs dialed at once; open channels are kept.
    pub fn set(&self, config: Option<FleetConfig>) {
        self.config.send_replace(config);
    }
}

impl crate::request::FleetControl for FleetHandle {
    fn status(&self) -> serde_json::Value {
        serde_json::to_value(FleetHandle::status(self)).unwrap_or(serde_json::Value::Null)
    }

    fn set(&self, config: Option<FleetConfig>) {
        FleetHandle::set(self, config);
    }

    fn check(&self, config: &FleetConfig) -> Result<(), String> {
        check(config).map_err(|e| e.to_string())
    }
}

/// Check a fleet configuration without dialing: at least one URL, each a WebSocket URL with a
/// host and `wss://` (or `ws://` to a loopback address), the token a non-empty header value;
/// `bot_urls`, when given, held to the same URL rule; a probe interval shorter than the time
/// after which a missing pong degrades the connection.
pub fn check(cfg: &FleetConfig) -> Result<(), FleetError> {
    if cfg.urls.is_empty() {
        return Err(FleetError::NoUrls);
    }
    if cfg.urls.len() > MAX_URLS {
        return Err(FleetError::TooManyUrls(cfg.urls.len()));
    }
    let t = &cfg.timing;
    for (key, value) in [
        ("connect_timeout_ms", t.connect_timeout_ms),
        ("ping_interval_ms", t.ping_interval_ms),
        ("dead_peer_ms", t.dead_peer_ms),
        ("probe_interval_ms", t.probe_interval_ms),
        ("degraded_after_ms", t.degraded_after_ms),
        ("backoff_min_ms", t.backoff_min_ms),
        ("backoff_max_ms", t.backoff_max_ms),
        ("stable_after_ms", t.stable_after_ms),
        ("channel_hold_ms", t.channel_hold_ms),
        ("channel_idle_ms", t.channel_idle_ms),
    ] {
        if value > MAX_TIMING_MS {
            return Err(FleetError::TimingTooLarge { key, value });
        }
    }
    if cfg.timing.degraded_after_ms <= cfg.timing.probe_interval_ms {
        return Err(FleetError::Timing {
            probe: cfg.timing.probe_interval_ms,
            degraded: cfg.timing.degraded_after_ms,
        });
    }
    for url in &cfg.urls {
        request_for(cfg, url)?;
    }
    for url in cfg.bot_urls.iter().flatten() {
        // The bots' token is theirs: only the URL is checked here.
        request_of(&as_relay(url, "t")).map_err(|source| FleetError::BotUrl {
            url: url.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The single-relay client's URL and token rules, applied to one fleet URL.
fn as_relay(url: &str, token: &str) -> RelayConfig {
    RelayConfig {
        url: url.to_owned(),
        token: token.to_owned(),
        scope: Scope::default(),
        timing: RelayTiming::default(),
    }
}

fn request_for(cfg: &FleetConfig, url: &str) -> Result<Request, FleetError> {
    request_of(&as_relay(url, &cfg.token)).map_err(|source| FleetError::Url {
        url: url.to_owned(),
        source,
    })
}

/// Start the fleet client. It runs until `cancel`; it and its channels are on `tracker`.
pub fn spawn(
    link: Link,
    pairs: PairRegistry,
    initial: Option<FleetConfig>,
    cancel: CancellationToken,
    tracker: &TaskTracker,
) -> FleetHandle {
    let (config_tx, config_rx) = watch::channel(initial);
    let (status_tx, status_rx) = watch::channel(FleetStatus::disabled());
    let (events_tx, events_rx) = mpsc::channel(EVENTS);
    let fleet = Fleet {
        revocations: pairs.revocations(),
        revocations_open: true,
        link,
        pairs,
        config_rx,
        config: None,
        timing: FleetTiming::default(),
        status: status_tx,
        cancel,
        tracker: tracker.clone(),
        phase: Phase::Off,
        cursor: 0,
        failures_in_round: 0,
        backoff: backoff_of(&FleetTiming::default()),
        retries: 0,
        hold_until: None,
        host: None,
        channels: HashMap::new(),
        outs: SelectAll::new(),
        next_generation: 0,
        events_tx,
        events_rx,
        handshakes: 0,
        pending_closes: VecDeque::new(),
        recent_unknown: VecDeque::new(),
        revoked_seen: HashMap::new(),
        lagged_at: None,
        seen_ephemerals: SeenEphemerals::default(),
        before_hello: Arc::new(Semaphore::new(MAX_BEFORE_HELLO)),
        next_probe: uuid::Uuid::new_v4().as_u64_pair().0,
    };
    tracker.spawn(fleet.run().instrument(tracing::info_span!("fleet")));
    FleetHandle {
        config: config_tx,
        status: status_rx,
    }
}

fn backoff_of(timing: &FleetTiming) -> ExponentialBackoff {
    let min = timing.backoff_min_ms.max(1);
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(min))
        .with_max_delay(Duration::from_millis(timing.backoff_max_ms.max(min)))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn millis(n: u64) -> Duration {
    Duration::from_millis(n.max(1))
}

type FleetWs = WebSocketStream<MaybeTlsStream<TcpStream>>;
type OutItem = (Arc<str>, u64, Out);

/// A connection that said `Welcome`.
struct Dialed {
    sink: SplitSink<FleetWs, Message>,
    stream: SplitStream<FleetWs>,
    instance: String,
    host: HostKey,
}

/// One live connection.
struct Conn {
    sink: SplitSink<FleetWs, Message>,
    stream: SplitStream<FleetWs>,
    url: String,
    started: Instant,
    last_heard: Instant,
    /// When a loop-back pong last came back (none yet: not proven).
    last_pong: Option<Instant>,
    /// A round trip came back after `stable_after_ms`: the backoff was reset.
    stable: bool,
    /// Probes sent and not answered, oldest first.
    probes: VecDeque<(u64, Instant)>,
    ping: tokio::time::Interval,
    probe: tokio::time::Interval,
}

enum Phase {
    /// Disabled or misconfigured: nothing to do until the configuration changes.
    Off,
    Dialing {
        url: String,
        attempt: BoxFuture<'static, Result<Dialed, FleetError>>,
    },
    Up(Box<Conn>),
    Waiting {
        sleep: Pin<Box<tokio::time::Sleep>>,
    },
}

/// What the connection phase has to report.
enum PhaseEvent {
    Dialed(Result<Dialed, FleetError>),
    Inbound(Option<Result<Message, WsError>>),
    PingDue,
    ProbeDue,
    Degraded,
    DeadPeer,
    WaitOver,
}

/// What other tasks tell the fleet task.
enum Event {
    Handshake {
        channel: String,
        /// The `Open`'s message 1, kept with the channel it makes.
        message1: Vec<u8>,
        result: Result<Box<Admitted>, &'static str>,
    },
    /// A re-check found the bot revoked (or gone).
    Revoked { bot_id: String },
}

/// A bot the handshake let in.
struct Admitted {
    noise: Channel,
    message2: Vec<u8>,
    bot: BotRecord,
    /// When the bot's record was read: a revocation seen after it may not be in it.
    looked_up_at: Instant,
}

/// A live channel, as the fleet task keeps it.
struct Entry {
    /// Which channel of this id (a replaced one's frames still queued are dropped).
    generation: u64,
    bot_id: String,
    bot_public: [u8; 32],
    inbound: mpsc::Sender<SealedFrame>,
    cancel: CancellationToken,
    /// The `Open` message 1 that made it, and the `Accept` message 2 it was answered: an
    /// identical `Open` (redelivered, re-sent) gets the same `Accept` again.
    message1: Vec<u8>,
    message2: Vec<u8>,
}

/// The ephemeral keys of message 1s seen lately (the first 32 bytes of a Noise IK message 1,
/// in clear): an `Open` that repeats one is a replay. Bounded in count and age.
#[derive(Default)]
struct SeenEphemerals {
    order: VecDeque<([u8; 32], Instant)>,
    keys: HashSet<[u8; 32]>,
}

impl SeenEphemerals {
    fn ephemeral(message1: &[u8]) -> Option<[u8; 32]> {
        message1.get(..32).and_then(|b| b.try_into().ok())
    }

    fn forget_old(&mut self, now: Instant) {
        while let Some((key, at)) = self.order.front().copied() {
            if now.saturating_duration_since(at) < EPHEMERAL_MEMORY
                && self.order.len() < SEEN_EPHEMERALS
            {
                break;
            }
            self.order.pop_front();
            self.keys.remove(&key);
        }
    }

    /// Whether `message1`'s ephemeral key was seen already; remembered from now on.
    fn seen(&mut self, message1: &[u8]) -> bool {
        let Some(key) = Self::ephemeral(message1) else {
            return false;
        };
        let now = Instant::now();
        self.forget_old(now);
        if self.keys.contains(&key) {
            return true;
        }
        self.keys.insert(key);
        self.order.push_back((key, now));
        false
    }
}

/// The state the fleet task owns.
struct Fleet {
    link: Link,
    pairs: PairRegistry,
    config_rx: watch::Receiver<Option<FleetConfig>>,
    config: Option<FleetConfig>,
    /// The configuration's timing (the defaults while there is none).
    timing: FleetTiming,
    status: watch::Sender<FleetStatus>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    phase: Phase,
    /// The URL to dial next (an index into `urls`, modulo their count).
    cursor: usize,
    failures_in_round: usize,
    backoff: ExponentialBackoff,
    retries: u32,
    /// Set while there is no connection: when the channels are closed (`expired`).
    hold_until: Option<Instant>,
    host: Option<HostKey>,
    channels: HashMap<String, Entry>,
    outs: SelectAll<BoxStream<'static, OutItem>>,
    next_generation: u64,
    events_tx: mpsc::Sender<Event>,
    events_rx: mpsc::Receiver<Event>,
    handshakes: usize,
    pending_closes: VecDeque<Closed>,
    recent_unknown: VecDeque<String>,
    revocations: broadcast::Receiver<String>,
    revocations_open: bool,
    revoked_seen: HashMap<String, Instant>,
    lagged_at: Option<Instant>,
    seen_ephemerals: SeenEphemerals,
    /// Links waiting for their bot's `Hello` ([`MAX_BEFORE_HELLO`]).
    before_hello: Arc<Semaphore>,
    next_probe: u64,
}

async fn phase_event(phase: &mut Phase, timing: &FleetTiming) -> PhaseEvent {
    match phase {
        Phase::Off => std::future::pending().await,
        Phase::Dialing { attempt, .. } => PhaseEvent::Dialed(attempt.await),
        Phase::Waiting { sleep } => {
            sleep.as_mut().await;
            PhaseEvent::WaitOver
        }
        Phase::Up(conn) => {
            let degrade_at =
                conn.last_pong.unwrap_or(conn.started) + millis(timing.degraded_after_ms);
            let dead_at = conn.last_heard + millis(timing.dead_peer_ms);
            tokio::select! {
                frame = conn.stream.next() => PhaseEvent::Inbound(frame),
                _ = conn.probe.tick() => PhaseEvent::ProbeDue,
                _ = conn.ping.tick() => PhaseEvent::PingDue,
                () = tokio::time::sleep_until(degrade_at) => PhaseEvent::Degraded,
                () = tokio::time::sleep_until(dead_at) => PhaseEvent::DeadPeer,
            }
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_RELAY_FRAME_BYTES))
        .max_frame_size(Some(MAX_RELAY_FRAME_BYTES))
        .read_buffer_size(16 * 1024)
        .write_buffer_size(64 * 1024)
}

/// Connect, say `HostHello`, wait for `Welcome` — all within the connect timeout.
async fn dial(
    pairs: PairRegistry,
    request: Request,
    timeout_ms: u64,
) -> Result<Dialed, FleetError> {
    let host = pairs.host_key().await.map_err(FleetError::HostKey)?;
    let host_id = host.host_id();
    let work = async {
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            request,
            Some(ws_config()),
            true,
            None,
        );
        let ws = match connect.await {
            Ok((ws, _response)) => ws,
            Err(WsError::Http(response)) => {
                let status = response.status().as_u16();
                return Err(if status == 401 || status == 403 {
                    FleetError::Unauthorized(status)
                } else {
                    FleetError::Http(status)
                });
            }
            Err(e) => return Err(FleetError::Ws(e.to_string())),
        };
        let (mut sink, mut stream) = ws.split();
        let hello = relay_wire::encode(Body::HostHello(HostHello { host_id }));
        sink.send(Message::Binary(hello))
            .await
            .map_err(|e| FleetError::Ws(e.to_string()))?;
        loop {
            match stream.next().await {
                None | Some(Ok(Message::Close(_))) => return Err(FleetError::NoWelcome),
                Some(Err(e)) => return Err(FleetError::Ws(e.to_string())),
                Some(Ok(Message::Binary(bytes))) => match relay_wire::decode(&bytes)? {
                    Body::Welcome(welcome) => return Ok((sink, stream, welcome.instance)),
                    Body::Error(e) => {
                        return Err(FleetError::Relay {
                            code: clip(&e.code),
                            message: clip(&e.message),
                        });
                    }
                    other => return Err(FleetError::Unexpected(relay_wire::kind(&other))),
                },
                Some(Ok(_)) => {}
            }
        }
    };
    match tokio::time::timeout(millis(timeout_ms), work).await {
        Err(_) => Err(FleetError::Timeout(timeout_ms)),
        Ok(Err(e)) => Err(e),
        Ok(Ok((sink, stream, instance))) => Ok(Dialed {
            sink,
            stream,
            instance: clip(&instance),
            host,
        }),
    }
}

/// Text from the relay, kept short for the status and the log.
fn clip(text: &str) -> String {
    text.chars().take(200).collect()
}

impl Fleet {
    async fn run(mut self) {
        self.apply_config().await;
        loop {
            let up = matches!(self.phase, Phase::Up(_));
            let drain = up && !self.outs.is_empty();
            let hold = self.hold_until;
            tokio::select! {
                () = self.cancel.cancelled() => break,
                changed = self.config_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.apply_config().await;
                }
                revoked = self.revocations.recv(), if self.revocations_open => {
                    self.on_revocation(revoked).await;
                }
                Some(event) = self.events_rx.recv() => self.on_event(event).await,
                () = sleep_until_some(hold) => self.expire_channels(),
                Some(item) = self.outs.next(), if drain => self.on_out(item).await,
                event = phase_event(&mut self.phase, &self.timing) => {
                    self.on_phase(event).await;
                }
            }
        }
        self.shutdown().await;
    }

    /// Change a field or more of the status; a change of state restarts `since_ms`.
    fn set_status(&self, state: FleetState, f: impl FnOnce(&mut FleetStatus)) {
        self.status.send_if_modified(|s| {
            let before = s.clone();
            if s.state != state {
                s.state = state;
                s.since_ms = now_ms();
            }
            f(s);
            *s != before
        });
    }

    fn count_channels(&self) {
        let n = self.channels.len();
        self.status.send_if_modified(|s| {
            let changed = s.channels != n;
            s.channels = n;
            changed
        });
    }

    fn state(&self) -> FleetState {
        self.status.borrow().state
    }

    /// Take the configuration now in the watch: end the connection, and dial the new one.
    async fn apply_config(&mut self) {
        let next = self.config_rx.borrow_and_update().clone();
        if next.is_none() {
            // No fleet any more: the bots are told, while there is a connection to tell them.
            self.close_all(reasons::HOST_STOPPING).await;
        }
        self.end_connection().await;
        self.timing = next.as_ref().map(|c| c.timing.clone()).unwrap_or_default();
        self.config = next;
        self.cursor = 0;
        self.failures_in_round = 0;
        self.retries = 0;
        let relays: Vec<RelayHealth> = self
            .config
            .as_ref()
            .map(|c| c.urls.iter().map(|u| RelayHealth::untried(u)).collect())
            .unwrap_or_default();
        self.status.send_modify(|s| s.relays = relays);
        let Some(cfg) = self.config.clone() else {
            self.phase = Phase::Off;
            self.set_status(FleetState::Disabled, |s| {
                s.url = None;
                s.instance = None;
                s.retries = 0;
                s.last_error = None;
                s.retry_in_ms = None;
            });
            return;
        };
        self.backoff = backoff_of(&cfg.timing);
        if let Err(e) = check(&cfg) {
            // Retrying cannot help: say why and wait for another configuration.
            tracing::warn!(error = %e, "the fleet configuration cannot work; not dialing");
            self.phase = Phase::Off;
            let why = e.to_string();
            self.set_status(FleetState::Misconfigured, |s| {
                s.url = cfg.urls.first().cloned();
                s.instance = None;
                s.retries = 0;
                s.last_error = Some(why);
                s.retry_in_ms = None;
            });
            return;
        }
        self.set_status(FleetState::Connecting, |s| {
            s.retries = 0;
            s.last_error = None;
        });
        self.dial_next();
    }

    /// Dial the URL at the cursor.
    fn dial_next(&mut self) {
        let Some(cfg) = &self.config else {
            self.phase = Phase::Off;
            return;
        };
        let Some(url) = cfg.urls.get(self.cursor % cfg.urls.len().max(1)).cloned() else {
            self.phase = Phase::Off;
            return;
        };
        let request = match request_for(cfg, &url) {
            Ok(request) => request,
            Err(e) => {
                // `check` passed for this configuration, so this does not happen; if it did,
                // waiting for another configuration is all that can help.
                tracing::error!(error = %e, "a fleet URL cannot be dialed");
                self.phase = Phase::Off;
                return;
            }
        };
        let attempt = dial(self.pairs.clone(), request, cfg.timing.connect_timeout_ms).boxed();
        tracing::debug!(%url, "dialing the fleet");
        self.phase = Phase::Dialing {
            url: url.clone(),
            attempt,
        };
        // After a degraded connection the fleet stays `degraded` until another one is proven.
        let state = match self.state() {
            FleetState::Degraded => FleetState::Degraded,
            _ => FleetState::Connecting,
        };
        self.set_status(state, |s| {
            s.url = Some(url);
            s.instance = None;
            s.retry_in_ms = None;
        });
    }

    /// An attempt failed (a dial, a connection never proven, a degraded one): the next URL,
    /// or the backoff after a full round.
    fn failed(&mut self, why: String) {
        if let Some(url) = self
            .config
            .as_ref()
            .and_then(|c| c.urls.get(self.cursor % c.urls.len().max(1)).cloned())
        {
            let why = why.clone();
            self.status.send_modify(|s| {
                if let Some(relay) = relay_of(&mut s.relays, &url) {
                    relay.state = RelayHealthState::Unreachable;
                    relay.last_error = Some(why);
                }
            });
        }
        self.retries = self.retries.saturating_add(1);
        self.failures_in_round += 1;
        self.cursor = self.cursor.wrapping_add(1);
        let urls = self.config.as_ref().map_or(1, |c| c.urls.len().max(1));
        let retries = self.retries;
        if self.failures_in_round < urls {
            self.set_status(self.state(), |s| {
                s.retries = retries;
                s.last_error = Some(why);
            });
            self.dial_next();
            return;
        }
        self.failures_in_round = 0;
        let delay = self
            .backoff
            .next()
            .unwrap_or(millis(self.timing.backoff_max_ms));
        self.phase = Phase::Waiting {
            sleep: Box::pin(tokio::time::sleep(delay)),
        };
        self.set_status(FleetState::Waiting, |s| {
            s.retries = retries;
            s.last_error = Some(why);
            s.retry_in_ms = Some(ms(delay));
            s.instance = None;
        });
    }

    /// The connection is gone (or being let go): start holding the channels.
    fn take_connection(&mut self) -> Option<Box<Conn>> {
        let Phase::Up(conn) = std::mem::replace(&mut self.phase, Phase::Off) else {
            return None;
        };
        self.hold_until = Some(Instant::now() + millis(self.timing.channel_hold_ms));
        Some(conn)
    }

    /// Close the connection properly (a close frame, briefly waited for).
    async fn end_connection(&mut self) {
        if let Some(mut conn) = self.take_connection() {
            let _closed = tokio::time::timeout(Duration::from_secs(1), conn.sink.close()).await;
        }
        if !matches!(self.phase, Phase::Up(_)) {
            self.phase = Phase::Off;
        }
    }

    /// The connection ended by itself (the relay closed, a write failed, nothing heard).
    fn lost(&mut self, why: String) {
        let Some(conn) = self.take_connection() else {
            return;
        };
        tracing::info!(url = %conn.url, error = %why, "fleet connection ended");
        if conn.stable {
            // It worked for a while: the same URL first, at once.
            self.failures_in_round = 0;
            self.set_status(FleetState::Connecting, |s| s.last_error = Some(why));
            self.dial_next();
        } else {
            self.failed(why);
        }
    }

    async fn on_phase(&mut self, event: PhaseEvent) {
        match event {
            PhaseEvent::Dialed(Ok(dialed)) => self.connected(dialed).await,
            PhaseEvent::Dialed(Err(e)) => {
                let url = match &self.phase {
                    Phase::Dialing { url, .. } => url.clone(),
                    _ => String::new(),
                };
                tracing::info!(%url, error = %e, "fleet dial failed");
                self.phase = Phase::Off;
                self.failed(format!("{url}: {e}"));
            }
            PhaseEvent::Inbound(Some(Ok(message))) => self.on_message(message).await,
            PhaseEvent::Inbound(Some(Err(e))) => self.lost(format!("reading from the relay: {e}")),
            PhaseEvent::Inbound(None) => self.lost("the relay closed the connection".to_owned()),
            PhaseEvent::PingDue => self.write_raw(Message::Ping(bytes::Bytes::new())).await,
            PhaseEvent::ProbeDue => self.probe().await,
            PhaseEvent::Degraded => self.degraded().await,
            PhaseEvent::DeadPeer => {
                let after = self.timing.dead_peer_ms;
                self.lost(format!("nothing from the relay for {after} ms"));
            }
            PhaseEvent::WaitOver => self.dial_next(),
        }
    }

    async fn connected(&mut self, dialed: Dialed) {
        let url = match &self.phase {
            Phase::Dialing { url, .. } => url.clone(),
            _ => String::new(),
        };
        let timing = self.timing.clone();
        let now = Instant::now();
        let mut ping = tokio::time::interval_at(
            now + millis(timing.ping_interval_ms),
            millis(timing.ping_interval_ms),
        );
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first probe goes at once: the state is `connected` after its round trip.
        let mut probe = tokio::time::interval(millis(timing.probe_interval_ms));
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let host_id = dialed.host.host_id();
        self.host = Some(dialed.host);
        tracing::info!(%url, instance = %dialed.instance, host_id, "fleet connected");
        self.phase = Phase::Up(Box::new(Conn {
            sink: dialed.sink,
            stream: dialed.stream,
            url: url.clone(),
            started: now,
            last_heard: now,
            last_pong: None,
            stable: false,
            probes: VecDeque::new(),
            ping,
            probe,
        }));
        self.hold_until = None;
        self.set_status(self.state(), |s| {
            s.url = Some(url);
            s.instance = Some(dialed.instance);
            s.host_id = Some(host_id);
            s.retry_in_ms = None;
        });
        // What the host owed the bots while it was away goes first.
        let owed: Vec<Body> = self.pending_closes.drain(..).map(Body::Closed).collect();
        if !owed.is_empty() {
            self.write(owed).await;
        }
    }

    async fn probe(&mut self) {
        let id = self.next_probe;
        self.next_probe = self.next_probe.wrapping_add(1);
        let Phase::Up(conn) = &mut self.phase else {
            return;
        };
        conn.probes.push_back((id, Instant::now()));
        while conn.probes.len() > MAX_PROBES {
            conn.probes.pop_front();
        }
        self.write(vec![Body::Ping(Ping {
            id,
            loop_back: true,
        })])
        .await;
    }

    fn on_pong(&mut self, id: u64) {
        let stable_after = millis(self.timing.stable_after_ms);
        let Phase::Up(conn) = &mut self.phase else {
            return;
        };
        let Some(at) = conn.probes.iter().position(|(probe, _)| *probe == id) else {
            // A pong of an earlier connection (redelivered), or the instance's own answer.
            tracing::debug!(id, "a pong for no probe of this connection");
            return;
        };
        let mut sent = Instant::now();
        for _ in 0..=at {
            if let Some((_, when)) = conn.probes.pop_front() {
                sent = when;
            }
        }
        let round_trip = ms(sent.elapsed());
        let first = conn.last_pong.is_none();
        conn.last_pong = Some(Instant::now());
        let became_stable = !conn.stable && conn.started.elapsed() >= stable_after;
        if became_stable {
            conn.stable = true;
        }
        if first {
            tracing::info!(url = %conn.url, round_trip_ms = round_trip, "fleet round trip proven");
        }
        if became_stable {
            self.retries = 0;
            self.failures_in_round = 0;
            self.backoff = backoff_of(&self.timing);
        }
        let retries = self.retries;
        let url = conn.url.clone();
        self.set_status(FleetState::Connected, |s| {
            let at = now_ms();
            s.last_round_trip_at_ms = Some(at);
            s.round_trip_ms = Some(round_trip);
            s.retries = retries;
            for relay in &mut s.relays {
                if relay.url == url {
                    relay.state = RelayHealthState::Connected;
                    relay.last_round_trip_at_ms = Some(at);
                    relay.round_trip_ms = Some(round_trip);
                } else if relay.state == RelayHealthState::Connected {
                    relay.state = RelayHealthState::Standby;
                }
            }
        });
    }

    async fn degraded(&mut self) {
        let after = self.timing.degraded_after_ms;
        let url = match &self.phase {
            Phase::Up(conn) => conn.url.clone(),
            _ => String::new(),
        };
        let why = format!("{url}: no loop-back pong through the relay for {after} ms");
        tracing::warn!(%url, after_ms = after, "fleet degraded; trying the next URL");
        self.set_status(FleetState::Degraded, |s| s.last_error = Some(why.clone()));
        if let Some(mut conn) = self.take_connection() {
            let _closed = tokio::time::timeout(Duration::from_secs(1), conn.sink.close()).await;
        }
        self.failed(why.clone());
        self.status.send_modify(|s| {
            if let Some(relay) = relay_of(&mut s.relays, &url) {
                relay.state = RelayHealthState::Degraded;
                relay.last_error = Some(why);
            }
        });
    }

    async fn on_message(&mut self, message: Message) {
        if let Phase::Up(conn) = &mut self.phase {
            conn.last_heard = Instant::now();
        }
        match message {
            Message::Binary(bytes) => match relay_wire::decode(&bytes) {
                Ok(body) => self.on_frame(body).await,
                Err(e) => tracing::warn!(
                    error = %e,
                    bytes = bytes.len(),
                    "a message from the relay that is not a frame; dropped"
                ),
            },
            Message::Text(text) => {
                tracing::warn!(bytes = text.len(), "a text message from the relay; dropped")
            }
            Message::Close(_) => self.lost("the relay closed the connection".to_owned()),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }

    async fn on_frame(&mut self, body: Body) {
        match body {
            Body::Open(open) => self.on_open(open).await,
            Body::Sealed(sealed) => self.on_sealed(sealed).await,
            Body::Closed(closed) => {
                if let Some(entry) = self.channels.remove(&closed.channel) {
                    entry.cancel.cancel();
                    self.count_channels();
                    tracing::info!(
                        channel = %closed.channel,
                        bot_id = %entry.bot_id,
                        reason = ?clip(&closed.reason),
                        "the bot closed its channel"
                    );
                }
            }
            Body::Pong(pong) => self.on_pong(pong.id),
            Body::Ping(ping) => self.write(vec![Body::Pong(Pong { id: ping.id })]).await,
            Body::Error(e) => {
                let why = format!("the relay said {}: {}", clip(&e.code), clip(&e.message));
                self.lost(why);
            }
            other @ (Body::Welcome(_)
            | Body::Accept(_)
            | Body::HostHello(_)
            | Body::BotHello(_)) => {
                tracing::warn!(
                    kind = relay_wire::kind(&other),
                    "a frame a host never gets; dropped"
                );
            }
        }
    }

    async fn on_open(&mut self, open: relay_wire::Open) {
        if !relay_wire::is_channel(&open.channel) {
            tracing::warn!("an Open with a malformed channel id; dropped");
            return;
        }
        if let Some(live) = self.channels.get(&open.channel)
            && live.message1 == open.message
        {
            // Delivered again (at least once), or re-sent by a bot that lost the answer:
            // the same Accept again, and the channel goes on.
            tracing::info!(channel = %open.channel, bot_id = %live.bot_id, "an Open again; the Accept again");
            let accept = Body::Accept(Accept {
                channel: open.channel,
                message: live.message2.clone(),
            });
            self.write(vec![accept]).await;
            return;
        }
        let live = self.channels.contains_key(&open.channel);
        if self.seen_ephemerals.seen(&open.message) {
            tracing::warn!(channel = %open.channel, "an Open replaying a message 1 already seen; dropped");
            return;
        }
        let Some(kind) = HandshakeKind::from_wire(open.kind) else {
            if live {
                tracing::warn!(channel = %open.channel, "an Open of no known kind on a live channel; dropped");
            } else {
                self.send_closed(open.channel, reasons::BAD_HANDSHAKE).await;
            }
            return;
        };
        if self.handshakes >= MAX_HANDSHAKES {
            tracing::warn!(channel = %open.channel, "too many handshakes at once; refused");
            self.send_closed(open.channel, reasons::BUSY).await;
            return;
        }
        let Some(host) = self.host.clone() else {
            self.send_closed(open.channel, reasons::INTERNAL).await;
            return;
        };
        self.handshakes += 1;
        let pairs = self.pairs.clone();
        let subscribers = self.link.handler.subscribers().clone();
        let events = self.events_tx.clone();
        let channel = open.channel;
        let message1 = open.message;
        let span = tracing::info_span!("handshake", %channel);
        self.tracker.spawn(
            async move {
                let work = handshake(
                    pairs,
                    subscribers,
                    host,
                    kind,
                    open.secret_id,
                    message1.clone(),
                );
                let result = match tokio::time::timeout(HANDSHAKE_TIMEOUT, work).await {
                    Ok(result) => result.map(Box::new),
                    Err(_) => {
                        tracing::warn!("the handshake took too long");
                        Err(reasons::INTERNAL)
                    }
                };
                if events
                    .send(Event::Handshake {
                        channel,
                        message1,
                        result,
                    })
                    .await
                    .is_err()
                {
                    tracing::debug!("the fleet task is gone; the handshake is dropped");
                }
            }
            .instrument(span),
        );
    }

    async fn on_sealed(&mut self, sealed: relay_wire::Sealed) {
        let Some(entry) = self.channels.get(&sealed.channel) else {
            if !relay_wire::is_channel(&sealed.channel) {
                tracing::warn!("a Sealed frame with a malformed channel id; dropped");
                return;
            }
            if self.recent_unknown.contains(&sealed.channel) {
                return;
            }
            tracing::info!(channel = %sealed.channel, "a sealed frame for no channel of this host");
            self.recent_unknown.push_back(sealed.channel.clone());
            while self.recent_unknown.len() > RECENT_UNKNOWN {
                self.recent_unknown.pop_front();
            }
            self.send_closed(sealed.channel, reasons::UNKNOWN_CHANNEL)
                .await;
            return;
        };
        let frame = SealedFrame {
            nonce: sealed.nonce,
            ciphertext: sealed.ciphertext,
        };
        match entry.inbound.try_send(frame) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::warn!(
                    channel = %sealed.channel,
                    bot_id = %entry.bot_id,
                    queued = INBOUND_FRAMES,
                    "the bot sends faster than its channel is served; closing it"
                );
                self.close_channel(&sealed.channel, reasons::OVERFLOW).await;
            }
            // The channel is ending: its own `Closed` follows.
            Err(TrySendError::Closed(_)) => {}
        }
    }

    async fn on_event(&mut self, event: Event) {
        match event {
            Event::Handshake {
                channel,
                message1,
                result,
            } => {
                self.handshakes = self.handshakes.saturating_sub(1);
                let live_bot = self.channels.get(&channel).map(|e| e.bot_public);
                match result {
                    Err(reason) if live_bot.is_some() => {
                        // A `Closed` would reach the live channel's bot: the live one stays.
                        tracing::warn!(%channel, reason, "a handshake on a live channel failed; dropped");
                    }
                    Ok(admitted) if live_bot.is_some_and(|key| key != admitted.bot.public_key) => {
                        tracing::warn!(%channel, "a handshake from another bot on a live channel; dropped");
                    }
                    Err(reason) => {
                        tracing::info!(%channel, reason, "handshake refused");
                        self.send_closed(channel, reason).await;
                    }
                    Ok(admitted) => {
                        let revoked_since = self
                            .revoked_seen
                            .get(&admitted.bot.bot_id)
                            .is_some_and(|at| *at >= admitted.looked_up_at);
                        if revoked_since {
                            tracing::info!(%channel, bot_id = %admitted.bot.bot_id, "revoked during its handshake");
                            self.drop_channel(&channel);
                            self.send_closed(channel, reasons::REVOKED).await;
                            return;
                        }
                        let recheck = self
                            .lagged_at
                            .is_some_and(|at| at >= admitted.looked_up_at)
                            .then(|| (admitted.bot.bot_id.clone(), admitted.bot.public_key));
                        self.admit(channel, message1, *admitted).await;
                        if let Some(bot) = recheck {
                            self.recheck(vec![bot]);
                        }
                    }
                }
            }
            Event::Revoked { bot_id } => self.close_bot(&bot_id, reasons::REVOKED).await,
        }
    }

    /// Start an accepted channel. Its `Accept` is the first frame of its own queue, so it goes
    /// out before anything the channel seals.
    async fn admit(&mut self, channel: String, message1: Vec<u8>, admitted: Admitted) {
        let Admitted {
            noise,
            message2,
            bot,
            ..
        } = admitted;
        if !self.channels.contains_key(&channel) {
            let mine: Vec<(u64, String)> = self
                .channels
                .iter()
                .filter(|(_, e)| e.bot_id == bot.bot_id)
                .map(|(id, e)| (e.generation, id.clone()))
                .collect();
            if mine.len() >= MAX_CHANNELS_PER_BOT {
                // A bot renewing its channels is never locked out: its oldest one goes.
                if let Some((_, oldest)) = mine.into_iter().min() {
                    tracing::info!(channel = %oldest, bot_id = %bot.bot_id, "the bot's oldest channel is superseded");
                    self.close_channel(&oldest, reasons::SUPERSEDED).await;
                }
            } else if self.channels.len() >= MAX_CHANNELS {
                tracing::warn!(%channel, channels = MAX_CHANNELS, "too many channels; refused");
                self.send_closed(channel, reasons::BUSY).await;
                return;
            }
        }
        if let Some(old) = self.channels.remove(&channel) {
            old.cancel.cancel();
            tracing::info!(%channel, bot_id = %old.bot_id, "channel replaced by a new handshake");
        }
        self.recent_unknown.retain(|c| *c != channel);
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_FRAMES);
        let (out_tx, out_rx) = mpsc::channel(OUTBOUND_FRAMES);
        let accept = Out::Frame(Body::Accept(Accept {
            channel: channel.clone(),
            message: message2.clone(),
        }));
        if out_tx.try_send(accept).is_err() {
            // A new queue has room; nothing to send the bot if it had not.
            tracing::error!(%channel, "a new channel's queue refused its Accept");
            return;
        }
        let key: Arc<str> = Arc::from(channel.as_str());
        self.outs.push(
            futures_util::stream::unfold(out_rx, move |mut rx| {
                let key = key.clone();
                async move { rx.recv().await.map(|out| ((key, generation, out), rx)) }
            })
            .boxed(),
        );
        let cancel = self.cancel.child_token();
        tracing::info!(%channel, bot_id = %bot.bot_id, name = %bot.name, "channel open");
        self.channels.insert(
            channel.clone(),
            Entry {
                generation,
                bot_id: bot.bot_id.clone(),
                bot_public: bot.public_key,
                inbound: inbound_tx,
                cancel: cancel.clone(),
                message1,
                message2,
            },
        );
        self.count_channels();
        if !matches!(self.phase, Phase::Up(_)) && self.hold_until.is_none() {
            self.hold_until = Some(Instant::now() + millis(self.timing.channel_hold_ms));
        }
        let idle = Some(self.timing.channel_idle_ms)
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        let span = tracing::info_span!("channel", %channel, bot_id = %bot.bot_id);
        self.tracker.spawn(
            channel::run(ChannelTask {
                channel,
                bot,
                noise,
                inbound: inbound_rx,
                out: out_tx,
                cancel,
                link: self.link.clone(),
                pairs: self.pairs.clone(),
                idle,
                before_hello: self.before_hello.clone(),
            })
            .instrument(span),
        );
    }

    /// A frame from a channel's queue: written if that channel is still the live one.
    async fn on_out(&mut self, first: OutItem) {
        let mut frames = Vec::new();
        self.take_out(first, &mut frames);
        while frames.len() < WRITE_BATCH {
            match self.outs.next().now_or_never() {
                Some(Some(item)) => self.take_out(item, &mut frames),
                _ => break,
            }
        }
        if !frames.is_empty() {
            self.write(frames).await;
        }
    }

    fn take_out(&mut self, (channel, generation, out): OutItem, frames: &mut Vec<Body>) {
        let live = self
            .channels
            .get(&*channel)
            .is_some_and(|entry| entry.generation == generation);
        if !live {
            // A channel the host closed itself (it told the bot): what it still had is dropped.
            return;
        }
        match out {
            Out::Frame(body) => frames.push(body),
            Out::End(reason) => {
                self.channels.remove(&*channel);
                self.count_channels();
                frames.push(Body::Closed(Closed {
                    channel: channel.to_string(),
                    reason: reason.to_owned(),
                }));
            }
        }
    }

    async fn on_revocation(&mut self, revoked: Result<String, RecvError>) {
        match revoked {
            Ok(bot_id) => {
                let now = Instant::now();
                self.revoked_seen
                    .retain(|_, at| now.saturating_duration_since(*at) < REVOKED_MEMORY);
                self.revoked_seen.insert(bot_id.clone(), now);
                self.close_bot(&bot_id, reasons::REVOKED).await;
            }
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "revocations were missed; checking every connected bot"
                );
                self.lagged_at = Some(Instant::now());
                let mut bots: Vec<(String, [u8; 32])> = self
                    .channels
                    .values()
                    .map(|e| (e.bot_id.clone(), e.bot_public))
                    .collect();
                bots.sort();
                bots.dedup();
                self.recheck(bots);
            }
            Err(RecvError::Closed) => {
                // The registry stopped: the host is shutting down.
                self.revocations_open = false;
            }
        }
    }

    /// Look the bots up again (after missed revocations); the revoked ones come back as
    /// [`Event::Revoked`].
    fn recheck(&self, bots: Vec<(String, [u8; 32])>) {
        let pairs = self.pairs.clone();
        let events = self.events_tx.clone();
        self.tracker.spawn(async move {
            for (bot_id, public) in bots {
                let revoked = match pairs.bot(&public).await {
                    Ok(Some(bot)) => bot.is_revoked(),
                    Ok(None) => true,
                    Err(e) => {
                        tracing::warn!(%bot_id, error = %e, "a bot could not be checked again");
                        false
                    }
                };
                if revoked && events.send(Event::Revoked { bot_id }).await.is_err() {
                    return;
                }
            }
        });
    }

    /// Forget a channel without telling its bot (it closed, or is told otherwise).
    fn drop_channel(&mut self, channel: &str) {
        if let Some(entry) = self.channels.remove(channel) {
            entry.cancel.cancel();
            self.count_channels();
        }
    }

    /// Close a channel and tell its bot why.
    async fn close_channel(&mut self, channel: &str, reason: &'static str) {
        self.drop_channel(channel);
        self.send_closed(channel.to_owned(), reason).await;
    }

    /// Close every channel of one bot at once (a revocation).
    async fn close_bot(&mut self, bot_id: &str, reason: &'static str) {
        let ids: Vec<String> = self
            .channels
            .iter()
            .filter(|(_, e)| e.bot_id == bot_id)
            .map(|(id, _)| id.clone())
            .collect();
        if ids.is_empty() {
            return;
        }
        tracing::info!(
            bot_id,
            channels = ids.len(),
            reason,
            "closing the bot's channels"
        );
        let mut frames = Vec::with_capacity(ids.len());
        for id in ids {
            self.drop_channel(&id);
            frames.push(Closed {
                channel: id,
                reason: reason.to_owned(),
            });
        }
        self.send_closes(frames).await;
    }

    /// Close every channel (the fleet is going away).
    async fn close_all(&mut self, reason: &'static str) {
        let frames: Vec<Closed> = self
            .channels
            .drain()
            .map(|(id, entry)| {
                entry.cancel.cancel();
                Closed {
                    channel: id,
                    reason: reason.to_owned(),
                }
            })
            .collect();
        self.count_channels();
        self.send_closes(frames).await;
    }

    /// No connection for `channel_hold_ms`: the channels are closed, and their bots told on the
    /// next connection.
    fn expire_channels(&mut self) {
        self.hold_until = None;
        if matches!(self.phase, Phase::Up(_)) || self.channels.is_empty() {
            return;
        }
        tracing::info!(
            channels = self.channels.len(),
            "no fleet connection for the hold time; closing the channels"
        );
        let ids: Vec<String> = self.channels.keys().cloned().collect();
        for id in ids {
            self.drop_channel(&id);
            self.owe(Closed {
                channel: id,
                reason: reasons::EXPIRED.to_owned(),
            });
        }
    }

    async fn send_closed(&mut self, channel: String, reason: &'static str) {
        self.send_closes(vec![Closed {
            channel,
            reason: reason.to_owned(),
        }])
        .await;
    }

    /// `Closed` frames: written now when connected, else owed to the next connection.
    async fn send_closes(&mut self, frames: Vec<Closed>) {
        if frames.is_empty() {
            return;
        }
        if matches!(self.phase, Phase::Up(_)) {
            self.write(frames.into_iter().map(Body::Closed).collect())
                .await;
        } else {
            for frame in frames {
                self.owe(frame);
            }
        }
    }

    fn owe(&mut self, frame: Closed) {
        self.pending_closes.push_back(frame);
        while self.pending_closes.len() > MAX_PENDING_CLOSES {
            if let Some(dropped) = self.pending_closes.pop_front() {
                tracing::warn!(channel = %dropped.channel, "too many Closed frames owed; the oldest is dropped");
            }
        }
    }

    /// Write frames and flush once, bounded by the dead-peer time; a failure ends the
    /// connection (what was not written is lost, and the bots' nonce rule sees the gap).
    async fn write(&mut self, frames: Vec<Body>) {
        let messages: Vec<Message> = frames
            .into_iter()
            .map(|body| Message::Binary(relay_wire::encode(body)))
            .collect();
        self.write_messages(messages).await;
    }

    async fn write_raw(&mut self, message: Message) {
        self.write_messages(vec![message]).await;
    }

    async fn write_messages(&mut self, messages: Vec<Message>) {
        let limit = millis(self.timing.dead_peer_ms);
        let Phase::Up(conn) = &mut self.phase else {
            tracing::debug!(frames = messages.len(), "not connected; frames dropped");
            return;
        };
        let sink = &mut conn.sink;
        let work = async {
            for message in messages {
                sink.feed(message).await?;
            }
            sink.flush().await
        };
        match tokio::time::timeout(limit, work).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.lost(format!("writing to the relay: {e}")),
            Err(_) => self.lost(format!("a write to the relay took over {} ms", ms(limit))),
        }
    }

    /// The host stops: every bot is told, the connection closed, the channels cancelled.
    async fn shutdown(&mut self) {
        let up = matches!(self.phase, Phase::Up(_));
        let frames: Vec<Body> = self
            .channels
            .drain()
            .map(|(id, entry)| {
                entry.cancel.cancel();
                Body::Closed(Closed {
                    channel: id,
                    reason: reasons::HOST_STOPPING.to_owned(),
                })
            })
            .collect();
        if up && !frames.is_empty() {
            let _told = tokio::time::timeout(Duration::from_secs(2), self.write(frames)).await;
        }
        self.end_connection().await;
        self.count_channels();
    }
}

/// The host's half of one handshake: who the bot is, whether it may in, message 2.
async fn handshake(
    pairs: PairRegistry,
    subscribers: Subscribers,
    host: HostKey,
    kind: HandshakeKind,
    secret_id: String,
    message1: Vec<u8>,
) -> Result<Admitted, &'static str> {
    let (half, bot, looked_up_at) = match kind {
        HandshakeKind::Pair => {
            let pending = pairs.begin_pair(&secret_id).await.map_err(refusal)?;
            let (half, hello) = HostHandshake::read(kind, &host, Some(&pending.psk), &message1)
                .map_err(|e| {
                    tracing::info!(error = %e, "a pairing handshake does not read");
                    reasons::PAIRING_REFUSED
                })?;
            let looked_up_at = Instant::now();
            let bot = pairs
                .complete_pair(&secret_id, hello.bot_public, &hello.name)
                .await
                .map_err(refusal)?;
            (half, bot, looked_up_at)
        }
        HandshakeKind::Connect => {
            let (half, hello) = HostHandshake::read(kind, &host, None, &message1).map_err(|e| {
                tracing::info!(error = %e, "a connection handshake does not read");
                reasons::BAD_HANDSHAKE
            })?;
            let looked_up_at = Instant::now();
            let bot = match pairs.bot(&hello.bot_public).await {
                Ok(Some(bot)) if !bot.is_revoked() => bot,
                Ok(Some(_)) => return Err(reasons::REVOKED),
                Ok(None) => return Err(reasons::UNKNOWN_BOT),
                Err(e) => {
                    tracing::warn!(error = %e, "a bot could not be looked up");
                    return Err(reasons::INTERNAL);
                }
            };
            (half, bot, looked_up_at)
        }
    };
    ensure_subscriber(&subscribers, &bot).await.map_err(|e| {
        tracing::warn!(error = %e, "the bot's subscriber row could not be stored");
        reasons::INTERNAL
    })?;
    let (noise, message2) = half
        .accept(&Accepted {
            host_id: host.host_id(),
            bot_id: bot.bot_id.clone(),
            scope: bot.scope.clone(),
        })
        .map_err(|e| {
            tracing::warn!(error = %e, "message 2 could not be written");
            reasons::INTERNAL
        })?;
    if let Err(e) = pairs.touch(&bot.bot_id).await {
        tracing::debug!(error = %e, "the bot's last-seen time was not written");
    }
    Ok(Admitted {
        noise,
        message2,
        bot,
        looked_up_at,
    })
}

fn refusal(e: PairError) -> &'static str {
    match e {
        PairError::Refused => reasons::PAIRING_REFUSED,
        other => {
            tracing::warn!(error = %other, "a pairing could not be completed");
            reasons::INTERNAL
        }
    }
}

/// The bot's subscriber row, `bot-<bot_id>`: made at its first channel (events with deltas,
/// labelled with the bot's name), kept afterwards with its cursor. A bot that brings no cursor
/// in `Hello` gets the `max_count` replay (the newest 200 brackets at most, less what it acked)
/// as the relay subscriber does, never the host's whole history.
async fn ensure_subscriber(
    subscribers: &Subscribers,
    bot: &BotRecord,
) -> Result<(), crate::subscribers::SubscriberError> {
    let now = now_ms();
    subscribers
        .ensure(SubscriberRow {
            subscriber_id: bot_subscriber_id(&bot.bot_id),
            kind: "bot".to_owned(),
            session_id: None,
            forward_deltas: true,
            replay_mode: crate::protocol::envelope::ReplayMode::MaxCount
                .as_str()
                .to_owned(),
            max_count: i64::from(crate::bus::DEFAULT_MAX_COUNT),
            most_recent_sequence_id: 0,
            deltas_dropped: 0,
            created_at_ms: now,
            updated_at_ms: now,
            // The channel's rights are the paired scope (`Via::Bot`); the row says the same,
            // for a loopback grant of this row made over IPC.
            scope: serde_json::to_string(&bot.scope).ok(),
            client: Some(bot.name.clone()),
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    fn fleet(text: &str) -> FleetConfig {
        toml::from_str::<FileConfig>(text).unwrap().fleet.unwrap()
    }

    #[test]
    fn fleet_config_reads_with_defaults_and_refuses_typos() {
        let cfg = fleet(
            "[fleet]\nurls = [\"wss://a.example/host\", \"ws://127.0.0.1:7002/host/\"]\n\
             token = \"tok\"\n[fleet.timing]\nprobe_interval_ms = 500\n",
        );
        assert_eq!(cfg.timing.probe_interval_ms, 500);
        assert_eq!(cfg.timing.degraded_after_ms, 6000);
        assert_eq!(cfg.timing.ping_interval_ms, 5000);
        assert_eq!(cfg.timing.dead_peer_ms, 15000);
        assert_eq!(cfg.timing.backoff_min_ms, 200);
        assert_eq!(cfg.timing.backoff_max_ms, 10000);
        assert!(check(&cfg).is_ok());
        assert_eq!(
            cfg.bot_urls(),
            ["wss://a.example/bot", "ws://127.0.0.1:7002/bot"]
        );
        let given = fleet(
            "[fleet]\nurls = [\"wss://a.example/host\"]\ntoken = \"t\"\n\
             bot_urls = [\"wss://bots.example/b\"]\n",
        );
        assert_eq!(given.bot_urls(), ["wss://bots.example/b"]);
        assert!(
            toml::from_str::<FileConfig>("[fleet]\nurls = []\ntoken = \"t\"\nurl = \"x\"\n")
                .is_err()
        );
        assert!(
            toml::from_str::<FileConfig>(
                "[fleet]\nurls = []\ntoken = \"t\"\n[fleet.timing]\nprobe_ms = 1\n"
            )
            .is_err()
        );
        // The token is neither shown nor serialized.
        let secret = fleet("[fleet]\nurls = [\"wss://a/host\"]\ntoken = \"sekrit-9\"\n");
        assert!(!format!("{secret:?}").contains("sekrit"));
        assert!(!serde_json::to_string(&secret).unwrap().contains("sekrit"));
    }

    #[test]
    fn huge_timing_values_are_refused() {
        let base = "[fleet]\nurls = [\"wss://a.example/host\"]\ntoken = \"t\"\n[fleet.timing]\n";
        assert!(check(&fleet(&format!("{base}channel_hold_ms = 86400000\n"))).is_ok());
        for key in [
            "channel_hold_ms",
            "dead_peer_ms",
            "connect_timeout_ms",
            "backoff_max_ms",
        ] {
            let cfg = fleet(&format!("{base}{key} = 9223372036854775807\n"));
            let e = check(&cfg).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("86400000"), "{e}");
        }
    }

    #[test]
    fn ephemerals_seen_are_replays() {
        let mut seen = SeenEphemerals::default();
        let m1 = [7u8; 48];
        assert!(!seen.seen(&m1));
        assert!(seen.seen(&m1));
        // Too short to carry a key: never a replay.
        assert!(!seen.seen(&[1, 2, 3]));
        assert!(!seen.seen(&[1, 2, 3]));
        for i in 0..SEEN_EPHEMERALS as u32 + 1 {
            let mut m = [0u8; 32];
            m[..4].copy_from_slice(&i.to_be_bytes());
            m[4] = 1;
            seen.seen(&m);
        }
        assert!(seen.keys.len() <= SEEN_EPHEMERALS && seen.order.len() <= SEEN_EPHEMERALS);
        // The oldest was forgotten to make room.
        assert!(!seen.seen(&m1));
    }

    #[test]
    fn fleet_urls_are_held_to_the_relay_rules() {
        let with = |urls: &str, token: &str, bots: &str| {
            fleet(&format!(
                "[fleet]\nurls = [{urls}]\ntoken = {token:?}\n{bots}"
            ))
        };
        let refused = |cfg: FleetConfig| check(&cfg).unwrap_err().to_string();
        assert!(refused(with("", "t", "")).contains("at least one URL"));
        assert!(
            refused(with("\"ws://relay.example/host\"", "t", ""))
                .contains("ws:// is allowed only to a loopback")
        );
        assert!(refused(with("\"http://127.0.0.1/host\"", "t", "")).contains("not valid"));
        assert!(refused(with("\"wss://a/host\"", "", "")).contains("needs a token"));
        assert!(refused(with("\"wss://a/host\"", "bad\ntoken", "")).contains("header value"));
        assert!(
            refused(with(
                "\"wss://a/host\"",
                "t",
                "bot_urls = [\"ws://remote.example/bot\"]\n"
            ))
            .starts_with("bot_urls: ")
        );
        assert!(
            check(&with(
                "\"ws://[::1]:9/host\", \"wss://b.example/host\"",
                "t",
                ""
            ))
            .is_ok()
        );
        let slow = with(
            "\"wss://a/host\"",
            "t",
            "[fleet.timing]\nprobe_interval_ms = 6000\n",
        );
        assert!(refused(slow).contains("must be longer than probe_interval_ms"));
    }

    #[test]
    fn the_status_reads_as_documented() {
        let status = serde_json::to_value(FleetStatus::disabled()).unwrap();
        for key in [
            "state",
            "url",
            "instance",
            "host_id",
            "since_ms",
            "last_round_trip_at_ms",
            "round_trip_ms",
            "channels",
            "retries",
            "last_error",
            "retry_in_ms",
            "relays",
        ] {
            assert!(status.get(key).is_some(), "{key}: {status}");
        }
        assert_eq!(status["state"], "disabled");
        assert_eq!(
            serde_json::to_value(FleetState::Degraded).unwrap(),
            "degraded"
        );
    }
}
