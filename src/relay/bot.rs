//! A remote bot's side of the sealed relay fleet (issue 21): [`BotClient`] pairs with a host by
//! its pairing code ([`pair`]), then connects through any `agent-host-relay` instance, runs the
//! Noise handshake with the host and speaks the host's own wire protocol
//! (`proto/agent_host.proto`) inside the sealed channel — `Hello` with its cursor, requests and
//! their replies, events — exactly what a loopback subscriber speaks, one inner message per
//! wire frame. The relay sees host ids, channel ids, sizes and timing only.
//!
//! One task owns the relay connection, the channel and the requests in flight; the
//! [`BotClient`] handle (and its cloneable [`Requester`]) talk to it over bounded queues.
//! Recovery, from the cheapest:
//! - **the relay connection fails** (closed, an `Error` frame, nothing heard for
//!   [`BotOptions::dead_peer`]): the next URL, round robin; `BotHello` lists the channel, whose
//!   Noise state and id are kept, so what the host sent meanwhile (held by JetStream) follows
//!   `Welcome`. A probe — a wire `Ping` through the channel — then proves nothing was lost on
//!   the way: a lost frame shows as a nonce gap at one end, and the channel is renewed;
//! - **the channel breaks** (the host answers `Closed`, a gap, a frame that does not decrypt,
//!   no `Pong` to the probe in time): a new channel id and a new `Connect` handshake, then
//!   `Hello{cursor}` with the last bracket seen, so the host replays from there. Requests in
//!   flight are sent again when they are safe to repeat — reads, and prompts, which carry a
//!   `client_msg_id` (one is added to every `session.send` and `session.steer` that has none,
//!   so a retry never runs twice; docs/relay.md rule 5) — and the others fail with
//!   [`BotError::Uncertain`];
//! - **the host refuses the bot** (`unknown_bot`, `revoked`, `pairing_refused`): the end,
//!   [`BotError::Refused`].
//!
//! A channel that has sent nothing for [`BotOptions::keepalive`] sends a wire `Ping`, so the
//! host does not close a bot that only listens as idle.
//!
//! Events: a bracket at or below the last one delivered is dropped (a replay overlapping what
//! came live), so each bracket reaches [`BotClient::next_event`] once; deltas pass as they come.
//!
//! Overload: the event queue holds [`BotOptions::event_queue`] events. A delta that finds it
//! full is dropped; a bracket that finds it full stops delivery (nothing later is taken either,
//! so order holds) until the queue has drained to half, and then the channel is renewed with
//! `Hello{cursor}` the last bracket delivered: the host replays the rest from its store. Replies
//! never wait behind events. Commands wait in a queue of [`COMMAND_QUEUE`] while the channel
//! is not ready; at most [`MAX_IN_FLIGHT`] requests are in flight.
//!
//! Never logged: frame content, the bot token, keys, the pairing secret. Nothing here prints.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures_util::{SinkExt, StreamExt};
use rand::TryRng;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::protocol::envelope::Reply;
use crate::protocol::relay_wire::{self, Body, MAX_RELAY_FRAME_BYTES};
use crate::protocol::scope::Scope;
use crate::protocol::wire::{self, CmdId, MAX_FRAME_BYTES, PROTOCOL_VERSION, pb};
use crate::seal::{
    BotHandshake, BotKey, Channel, HandshakeKind, PairingCode, SealError, SealedFrame, key_id,
};

/// Commands (requests, acks) waiting for the task.
pub const COMMAND_QUEUE: usize = 64;
/// Requests sent and not answered yet, at most.
pub const MAX_IN_FLIGHT: usize = 1024;
/// The reasons of a host's `Closed` that end the bot: retrying cannot help.
pub const REFUSALS: [&str; 3] = ["unknown_bot", "revoked", "pairing_refused"];
/// Commands that only read: safe to send again after a broken channel.
const READS: [&str; 11] = [
    "host.status",
    "agent.list",
    "session.list",
    "session.get",
    "session.runs",
    "session.run",
    "session.history",
    "session.search",
    "session.export",
    "permission.list",
    "session.discover",
];
/// Commands that take an idempotency key (`client_msg_id`); the bot adds one when missing.
const KEYED: [&str; 2] = ["session.send", "session.steer"];

/// Why the bot side failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BotError {
    #[error("relay URL {url}: {why}")]
    BadUrl { url: String, why: String },
    #[error("the relay at {url} refused the bot token (HTTP {status})")]
    Unauthorized { url: String, status: u16 },
    #[error("relay {url}: {why}")]
    Relay { url: String, why: String },
    /// The relay's `Error` frame (it closes after it).
    #[error("the relay said {code}: {message}")]
    RelayError { code: String, message: String },
    /// The host's refusal: `unknown_bot`, `revoked` or `pairing_refused` (the host says
    /// nothing more, on purpose), or its refusal of `Hello`.
    #[error("the host refused this bot: {0}")]
    Refused(String),
    #[error("sealing: {0}")]
    Seal(String),
    /// A frame-level refusal of a request (`ErrorResp`), not a command's error: those are a
    /// [`Reply`] with their code.
    #[error("the host refused the request frame: {0}")]
    RequestRefused(String),
    /// The channel broke after the request went out and before its answer came; the command
    /// is not safe to repeat, so it may or may not have been done.
    #[error("{0} may or may not have been done: the channel broke before its answer")]
    Uncertain(String),
    #[error("no {0} in time")]
    Timeout(&'static str),
    #[error("too many requests in flight")]
    Overloaded,
    #[error("the bot client is closed")]
    Closed,
    #[error("{path}: {why}")]
    State { path: PathBuf, why: String },
    #[error("the pairing code expired")]
    Expired,
}

impl From<SealError> for BotError {
    fn from(e: SealError) -> BotError {
        BotError::Seal(e.to_string())
    }
}

/// What a paired bot keeps to connect again: whom it paired with, where, with which key. The
/// key file holds the private key; this holds the relay's bot token, so it is written 0600.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BotState {
    pub host_id: String,
    /// The host's static public key, base64url without padding.
    pub host_public: String,
    /// The relay instances' `/bot` endpoints, dialed in turn.
    pub bot_urls: Vec<String>,
    /// The bot's static key (64 bytes, 0600; [`BotKey::load_or_create`]).
    pub key_file: PathBuf,
    pub bot_id: String,
    pub name: String,
    /// The relay's bot token (`Authorization: Bearer`).
    #[serde(default)]
    pub token: String,
    /// What the host granted at pairing (it may change; the host enforces its current one).
    pub scope: Scope,
    pub paired_at_ms: i64,
}

impl std::fmt::Debug for BotState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotState")
            .field("host_id", &self.host_id)
            .field("bot_urls", &self.bot_urls)
            .field("key_file", &self.key_file)
            .field("bot_id", &self.bot_id)
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl BotState {
    /// Read a state file written by [`BotState::save`].
    pub fn load(path: &Path) -> Result<BotState, BotError> {
        let bad = |why: String| BotError::State {
            path: path.to_owned(),
            why,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
    }

    /// Write the state (mode 0600 from its creation, replaced whole by a rename).
    pub fn save(&self, path: &Path) -> Result<(), BotError> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let bad = |why: String| BotError::State {
            path: path.to_owned(),
            why,
        };
        let json = serde_json::to_vec_pretty(self).map_err(|e| bad(e.to_string()))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| bad(e.to_string()))?;
        // A `.tmp` left by an earlier run keeps the mode it had; the token must not be in a
        // file others can read.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| bad(e.to_string()))?;
        file.write_all(&json)
            .and_then(|()| file.sync_all())
            .map_err(|e| bad(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| bad(e.to_string()))
    }

    /// The host's public key, checked against its id.
    pub fn host_key(&self) -> Result<[u8; 32], BotError> {
        let bad = |why: &str| BotError::State {
            path: self.key_file.clone(),
            why: format!("host_public: {why}"),
        };
        let bytes = URL_SAFE_NO_PAD
            .decode(&self.host_public)
            .map_err(|_| bad("not base64url"))?;
        let key = <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| bad("not 32 bytes"))?;
        if key_id(&key) != self.host_id {
            return Err(bad("not the key of host_id"));
        }
        Ok(key)
    }
}

/// How a bot connects; the defaults suit a real network.
#[derive(Debug, Clone)]
pub struct BotOptions {
    /// The `Hello`'s client name (the host logs it).
    pub client_name: String,
    /// The first `Hello`'s cursor (`None`: the host's stored one for this bot). Later ones
    /// carry the last bracket delivered.
    pub cursor: Option<i64>,
    /// Deliver events to [`BotClient::next_event`] (`false`: a bot that only sends requests;
    /// events are read and dropped).
    pub events: bool,
    /// Events held for [`BotClient::next_event`].
    pub event_queue: usize,
    /// TCP, TLS, the upgrade and the relay's `Welcome` together.
    pub connect_timeout: Duration,
    /// From `Open` to the host's `Accept`, and from a resume to the probe's `Pong`.
    pub handshake_timeout: Duration,
    /// A relay-level `Ping` this often.
    pub ping_interval: Duration,
    /// Nothing from the relay for this long: dial the next URL.
    pub dead_peer: Duration,
    /// Nothing sent to the host for this long: a wire `Ping` through the channel, so the host
    /// does not close it as idle (`[fleet.timing] channel_idle_ms`, 10 minutes by default).
    pub keepalive: Duration,
    /// Backoff after a full round of URLs failed, and between handshakes the host closed.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// How long [`BotClient::connect`] waits for the first ready channel.
    pub ready_timeout: Duration,
}

impl Default for BotOptions {
    fn default() -> Self {
        BotOptions {
            client_name: "agent-host-bot".to_owned(),
            cursor: None,
            events: true,
            event_queue: 1024,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(5),
            dead_peer: Duration::from_secs(15),
            keepalive: Duration::from_secs(60),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// One event pushed by the host.
#[derive(Debug, Clone, PartialEq)]
pub struct BotEvent {
    pub sequence_id: i64,
    pub message_id: String,
    pub session_id: String,
    pub run_id: String,
    pub is_delta: bool,
    /// The canonical event (design §5).
    pub event: Value,
}

impl BotEvent {
    /// The event's kind (`"k"`), e.g. `permission.request`.
    pub fn kind(&self) -> &str {
        self.event["k"].as_str().unwrap_or_default()
    }

    /// Whether the session waits for its user: a permission request or the end of a run.
    pub fn needs_you(&self) -> bool {
        matches!(self.kind(), "permission.request" | "run.end")
    }
}

/// Where the client stands, for callers and tests that wait on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BotStatus {
    /// The channel is up and `Hello` answered.
    pub ready: bool,
    /// The relay URL of the current (or last) connection.
    pub url: Option<String>,
    /// The instance that said `Welcome`.
    pub instance: Option<String>,
    pub host_online: bool,
    /// The current channel id.
    pub channel: String,
    /// Relay connections made (each `Welcome`).
    pub relay_connects: u32,
    /// Channels made ready (each `HelloResp`).
    pub handshakes: u32,
    pub last_error: Option<String>,
    /// The last bracket delivered.
    pub last_sequence_id: i64,
    /// What the host granted in the last handshake.
    pub scope: Option<Scope>,
    /// Set when the client ended, with why.
    pub ended: Option<BotError>,
}

enum Command {
    Request {
        command: String,
        params: Value,
        reply: oneshot::Sender<Result<Reply, BotError>>,
    },
    Ack(i64),
    Close(oneshot::Sender<()>),
}

/// Sends requests and acks on a [`BotClient`]'s channel; cloneable, for other tasks.
#[derive(Clone)]
pub struct Requester {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<BotStatus>,
}

impl Requester {
    /// Run one command of the envelope on the host and wait for its reply (a command's error is
    /// a `Reply` with its code). Waits while the channel is being renewed; bound it with a
    /// timeout. `session.send` and `session.steer` get a `client_msg_id` when they have none.
    pub async fn request(&self, command: &str, params: Value) -> Result<Reply, BotError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Request {
                command: command.to_owned(),
                params,
                reply,
            })
            .await
            .map_err(|_| self.ended())?;
        answer.await.map_err(|_| self.ended())?
    }

    /// Tell the host everything up to `cursor` was handled (it saves it for this bot).
    pub async fn ack(&self, cursor: i64) -> Result<(), BotError> {
        self.commands
            .send(Command::Ack(cursor))
            .await
            .map_err(|_| self.ended())
    }

    fn ended(&self) -> BotError {
        self.status
            .borrow()
            .ended
            .clone()
            .unwrap_or(BotError::Closed)
    }
}

/// A bot connected to one host through the relay fleet. Dropping it closes the channel.
pub struct BotClient {
    requester: Requester,
    events: mpsc::Receiver<BotEvent>,
    status: watch::Receiver<BotStatus>,
    _stop: DropGuard,
}

impl BotClient {
    /// Connect with a paired bot's state and the default options.
    pub async fn connect(state: &BotState) -> Result<BotClient, BotError> {
        BotClient::connect_with(state, BotOptions::default()).await
    }

    /// Connect: the relay, the handshake, `Hello`; returns once the channel is ready (or the
    /// host refused the bot, or [`BotOptions::ready_timeout`] passed).
    pub async fn connect_with(
        state: &BotState,
        options: BotOptions,
    ) -> Result<BotClient, BotError> {
        let host_public = state.host_key()?;
        if state.bot_urls.is_empty() {
            return Err(BotError::BadUrl {
                url: String::new(),
                why: "the state lists no relay URL".to_owned(),
            });
        }
        for url in &state.bot_urls {
            request_of(url, &state.token)?;
        }
        if !state.key_file.exists() {
            return Err(BotError::State {
                path: state.key_file.clone(),
                why: "the bot's key file is missing (pair again)".to_owned(),
            });
        }
        let key = BotKey::load_or_create(&state.key_file)?;
        if key.bot_id() != state.bot_id {
            return Err(BotError::State {
                path: state.key_file.clone(),
                why: format!(
                    "this key is bot {}, the state says {}",
                    key.bot_id(),
                    state.bot_id
                ),
            });
        }
        let channel_id = new_channel_id()?;
        let (commands_tx, commands) = mpsc::channel(COMMAND_QUEUE);
        let (events_tx, events) = mpsc::channel(options.event_queue.max(2));
        let (status_tx, status) = watch::channel(BotStatus {
            channel: channel_id.clone(),
            last_sequence_id: options.cursor.unwrap_or(0),
            ..BotStatus::default()
        });
        let (ready_tx, ready_rx) = oneshot::channel();
        let stop = CancellationToken::new();
        let ready_timeout = options.ready_timeout;
        let task = Task {
            backoff: backoff_of(&options),
            last_seq: options.cursor.unwrap_or(0),
            state: state.clone(),
            key,
            host_public,
            options,
            status: status_tx,
            events: events_tx,
            commands,
            stop: stop.clone(),
            ready: Some(ready_tx),
            url_index: 0,
            channel_id,
            chan: None,
            phase: Phase::Idle { at: Instant::now() },
            probe: None,
            pending: HashMap::new(),
            next_request: 1,
            resync: false,
            closes: 0,
            last_sent: Instant::now(),
        };
        tokio::spawn(tracing::Instrument::instrument(
            task.run(),
            tracing::info_span!("bot", host_id = %state.host_id, bot_id = %state.bot_id),
        ));
        let client = BotClient {
            requester: Requester {
                commands: commands_tx,
                status: status.clone(),
            },
            events,
            status,
            _stop: stop.drop_guard(),
        };
        match tokio::time::timeout(ready_timeout, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(client),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(client.requester.ended()),
            Err(_) => Err(BotError::Timeout("ready channel")),
        }
    }

    /// See [`Requester::request`].
    pub async fn request(&self, command: &str, params: Value) -> Result<Reply, BotError> {
        self.requester.request(command, params).await
    }

    /// See [`Requester::ack`].
    pub async fn ack(&self, cursor: i64) -> Result<(), BotError> {
        self.requester.ack(cursor).await
    }

    /// A handle for requests from another task.
    pub fn requester(&self) -> Requester {
        self.requester.clone()
    }

    /// The next event: each bracket once, in order; deltas as they come. An error once the
    /// client ended (a refusal — `revoked` — or [`BotError::Closed`]).
    pub async fn next_event(&mut self) -> Result<BotEvent, BotError> {
        match self.events.recv().await {
            Some(event) => Ok(event),
            None => Err(self.requester.ended()),
        }
    }

    /// The status now.
    pub fn status(&self) -> BotStatus {
        self.status.borrow().clone()
    }

    /// Every status change (tests wait on it).
    pub fn watch_status(&self) -> watch::Receiver<BotStatus> {
        self.status.clone()
    }

    /// Close the channel (the host ends its side) and the relay connection.
    pub async fn close(self) {
        let (done, closed) = oneshot::channel();
        if self
            .requester
            .commands
            .send(Command::Close(done))
            .await
            .is_ok()
        {
            let _closed = tokio::time::timeout(Duration::from_secs(2), closed).await;
        }
    }
}

/// Pair with a host by its code: the pairing handshake (`Noise_IKpsk1`, the code's secret as
/// psk) through the first relay URL that answers, then the pairing channel is closed. The key
/// at `key_file` is created (0600) when there is none. A code already used or expired is
/// [`BotError::Refused`] `pairing_refused`.
pub async fn pair(
    code: &PairingCode,
    key_file: &Path,
    name: &str,
    token: &str,
    options: &BotOptions,
) -> Result<BotState, BotError> {
    if code.expires_at_ms <= crate::store::now_ms() {
        return Err(BotError::Expired);
    }
    if code.relay_urls.is_empty() {
        return Err(BotError::BadUrl {
            url: String::new(),
            why: "the pairing code lists no relay URL".to_owned(),
        });
    }
    for url in &code.relay_urls {
        request_of(url, token)?;
    }
    let key = BotKey::load_or_create(key_file)?;
    let channel = new_channel_id()?;
    let (handshake, message) = BotHandshake::start(
        HandshakeKind::Pair,
        &key,
        &code.host_public,
        Some(&code.secret),
        name,
    )?;
    let open = Body::Open(relay_wire::Open {
        channel: channel.clone(),
        kind: HandshakeKind::Pair.wire(),
        secret_id: code.secret_id.clone(),
        message,
    });
    let deadline = Instant::now() + options.handshake_timeout;
    let mut last = BotError::Timeout("answer to the pairing");
    let mut handshake = Some(handshake);
    let mut sent = false;
    let mut backoff = backoff_of(options);
    for (attempt, url) in code.relay_urls.iter().cycle().enumerate() {
        if Instant::now() >= deadline {
            break;
        }
        if attempt > 0 && attempt % code.relay_urls.len() == 0 {
            let delay = backoff.next().unwrap_or(options.backoff_max);
            tokio::time::sleep_until(deadline.min(Instant::now() + delay)).await;
        }
        // Once the Open went out, a reconnect lists the channel so the host's answer, held by
        // JetStream, still reaches us, and sends the same Open again in case the first was
        // lost: the secret is single use, so the host answers the first it reads and refuses
        // a second after that answer, which is already on its way.
        let channels = if sent {
            vec![channel.clone()]
        } else {
            Vec::new()
        };
        let connect = dial(url, token, &code.host_id, channels, options.connect_timeout);
        let mut relay = match tokio::time::timeout_at(deadline, connect).await {
            Err(_) => break,
            Ok(Err(e @ BotError::Unauthorized { .. })) => return Err(e),
            Ok(Err(e)) => {
                last = e;
                continue;
            }
            Ok(Ok((relay, _welcome))) => relay,
        };
        if let Err(e) = relay.send(open.clone()).await {
            last = e;
            continue;
        }
        sent = true;
        loop {
            let next = match tokio::time::timeout_at(deadline, relay.next()).await {
                Err(_) => break,
                Ok(Err(e)) => {
                    last = e;
                    break;
                }
                Ok(Ok(body)) => body,
            };
            match next {
                Body::Accept(accept) if accept.channel == channel => {
                    let Some(handshake) = handshake.take() else {
                        break;
                    };
                    let (_channel, accepted) = handshake.finish(&accept.message)?;
                    let _best_effort = relay
                        .send(Body::Closed(relay_wire::Closed {
                            channel: channel.clone(),
                            reason: "paired".to_owned(),
                        }))
                        .await;
                    relay.close().await;
                    tracing::info!(host_id = %code.host_id, bot_id = %accepted.bot_id, "paired");
                    return Ok(BotState {
                        host_id: code.host_id.clone(),
                        host_public: URL_SAFE_NO_PAD.encode(code.host_public),
                        bot_urls: code.relay_urls.clone(),
                        key_file: std::path::absolute(key_file)
                            .unwrap_or_else(|_| key_file.to_owned()),
                        bot_id: accepted.bot_id,
                        name: name.to_owned(),
                        token: token.to_owned(),
                        scope: accepted.scope,
                        paired_at_ms: crate::store::now_ms(),
                    });
                }
                Body::Closed(closed) if closed.channel == channel => {
                    relay.close().await;
                    return Err(BotError::Refused(closed.reason));
                }
                Body::Ping(ping) => {
                    if let Err(e) = relay
                        .send(Body::Pong(relay_wire::Pong { id: ping.id }))
                        .await
                    {
                        last = e;
                        break;
                    }
                }
                Body::Error(e) => {
                    last = BotError::RelayError {
                        code: e.code,
                        message: e.message,
                    };
                    break;
                }
                _ => {}
            }
        }
    }
    Err(last)
}

/// A fresh channel id: 128 random bits as 32 lowercase hex characters.
fn new_channel_id() -> Result<String, BotError> {
    let mut bytes = [0u8; 16];
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| BotError::Seal(format!("no randomness for a channel id: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn backoff_of(options: &BotOptions) -> ExponentialBackoff {
    let min = options.backoff_min.max(Duration::from_millis(1));
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(options.backoff_max.max(min))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Whether a URL host is a loopback address.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The upgrade request to a relay's `/bot`: `wss://`, or `ws://` to a loopback address only
/// (the token travels in it), with `Authorization: Bearer <token>`.
fn request_of(url: &str, token: &str) -> Result<Request, BotError> {
    let bad = |why: &str| BotError::BadUrl {
        url: url.to_owned(),
        why: why.to_owned(),
    };
    let mut request = url.into_client_request().map_err(|e| bad(&e.to_string()))?;
    let host = request.uri().host().unwrap_or_default().to_owned();
    if host.is_empty() {
        return Err(bad("no host"));
    }
    match request.uri().scheme_str() {
        Some("wss") => {}
        Some("ws") if is_loopback(&host) => {}
        Some("ws") => return Err(bad("ws:// is allowed only to a loopback address")),
        _ => return Err(bad("the scheme must be wss:// (or ws:// to loopback)")),
    }
    if token.is_empty() {
        return Err(bad("the relay needs a bot token"));
    }
    let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| bad("the token is not a valid header value"))?;
    request.headers_mut().insert(header::AUTHORIZATION, bearer);
    Ok(request)
}

type RelayWs = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One relay connection: frames in and out, each write bounded.
struct Relay {
    ws: RelayWs,
    url: String,
    write_timeout: Duration,
}

impl Relay {
    async fn send(&mut self, body: Body) -> Result<(), BotError> {
        let message = Message::Binary(relay_wire::encode(body));
        match tokio::time::timeout(self.write_timeout, self.ws.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.failed(e.to_string())),
            Err(_) => Err(self.failed("a write stayed blocked".to_owned())),
        }
    }

    /// The next frame from the relay (WebSocket pings are answered by the library).
    async fn next(&mut self) -> Result<Body, BotError> {
        loop {
            match self.ws.next().await {
                None | Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) => {
                    return Err(self.failed("the connection closed".to_owned()));
                }
                Some(Err(e)) => return Err(self.failed(e.to_string())),
                Some(Ok(Message::Binary(bytes))) => {
                    return relay_wire::decode(&bytes).map_err(|e| self.failed(e.to_string()));
                }
                Some(Ok(Message::Close(_))) => {
                    return Err(self.failed("the relay closed the connection".to_owned()));
                }
                Some(Ok(_)) => {}
            }
        }
    }

    async fn close(mut self) {
        let _closed = tokio::time::timeout(Duration::from_secs(1), self.ws.close(None)).await;
    }

    fn failed(&self, why: String) -> BotError {
        BotError::Relay {
            url: self.url.clone(),
            why,
        }
    }
}

/// Dial a relay's `/bot`, say `BotHello{host_id, channels}`, and wait for its `Welcome`.
async fn dial(
    url: &str,
    token: &str,
    host_id: &str,
    channels: Vec<String>,
    timeout: Duration,
) -> Result<(Relay, relay_wire::Welcome), BotError> {
    let request = request_of(url, token)?;
    let failed = |why: String| BotError::Relay {
        url: url.to_owned(),
        why,
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_RELAY_FRAME_BYTES))
        .max_frame_size(Some(MAX_RELAY_FRAME_BYTES))
        .read_buffer_size(16 * 1024);
    let greet = async {
        let connect =
            tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, None);
        let ws = match connect.await {
            Ok((ws, _response)) => ws,
            Err(WsError::Http(response)) => {
                let status = response.status().as_u16();
                return Err(if status == 401 || status == 403 {
                    BotError::Unauthorized {
                        url: url.to_owned(),
                        status,
                    }
                } else {
                    failed(format!("the upgrade was answered with HTTP {status}"))
                });
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        let mut relay = Relay {
            ws,
            url: url.to_owned(),
            write_timeout: timeout,
        };
        relay
            .send(Body::BotHello(relay_wire::BotHello {
                host_id: host_id.to_owned(),
                channels,
            }))
            .await?;
        match relay.next().await? {
            Body::Welcome(welcome) => Ok((relay, welcome)),
            Body::Error(e) => Err(BotError::RelayError {
                code: e.code,
                message: e.message,
            }),
            other => Err(failed(format!(
                "the relay answered BotHello with {}",
                relay_wire::kind(&other)
            ))),
        }
    };
    tokio::time::timeout(timeout, greet)
        .await
        .map_err(|_| failed(format!("no Welcome within {} ms", timeout.as_millis())))?
}

/// Sleep until `at`; without one, never.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Where the channel stands.
enum Phase {
    /// No channel: a handshake starts at `at`.
    Idle { at: Instant },
    /// `Open` sent; the host's `Accept` is due by `deadline`.
    /// (Boxed: Noise's handshake state is large beside the other variants.)
    Handshaking {
        handshake: Box<BotHandshake>,
        deadline: Instant,
    },
    /// The channel is up; `Hello` (request `id`) waits for its `HelloResp`.
    Greeting { id: u64 },
    /// `Hello` answered: requests flow.
    Ready,
}

/// A request sent and not answered.
struct InFlight {
    command: String,
    params: Value,
    reply: oneshot::Sender<Result<Reply, BotError>>,
    /// Safe to send again on a new channel.
    retry: bool,
    /// Sent on the current channel (else it waits for the next `HelloResp`).
    sent: bool,
}

/// What ends a relay connection.
enum Flow {
    /// Dial the next URL (the channel is kept).
    Reconnect(BotError),
    /// The end: `Ok` when the bot closed, else why it ended.
    End(Result<(), BotError>),
}

impl From<BotError> for Flow {
    fn from(e: BotError) -> Flow {
        Flow::Reconnect(e)
    }
}

/// What woke the connection loop.
enum Wake {
    Stop,
    Frame(Result<Body, BotError>),
    Command(Option<Command>),
    Tick,
    Deadline,
}

struct Task {
    state: BotState,
    key: BotKey,
    host_public: [u8; 32],
    options: BotOptions,
    status: watch::Sender<BotStatus>,
    events: mpsc::Sender<BotEvent>,
    commands: mpsc::Receiver<Command>,
    stop: CancellationToken,
    /// Told once: the first ready channel, or why there is none.
    ready: Option<oneshot::Sender<Result<(), BotError>>>,
    url_index: usize,
    backoff: ExponentialBackoff,
    channel_id: String,
    /// The sealed channel, once a handshake finished.
    chan: Option<Channel>,
    phase: Phase,
    /// After a resume: the `Ping` nonce whose `Pong` proves the channel lost nothing, and when
    /// it is due.
    probe: Option<(u64, Instant)>,
    pending: HashMap<u64, InFlight>,
    next_request: u64,
    /// The last bracket delivered.
    last_seq: i64,
    /// A bracket found the event queue full: renew the channel once it drained.
    resync: bool,
    /// Channels the host closed (or that broke) since the last ready one: paces handshakes.
    closes: u32,
    /// When the last frame went to the host through the channel.
    last_sent: Instant,
}

impl Task {
    async fn run(mut self) {
        let end = self.serve().await;
        let error = match end {
            Ok(()) => BotError::Closed,
            Err(e) => {
                tracing::info!(error = %e, "bot client ended");
                e
            }
        };
        for (_, request) in self.pending.drain() {
            let _gone = request.reply.send(Err(error.clone()));
        }
        self.status.send_modify(|s| {
            s.ready = false;
            s.ended = Some(error.clone());
        });
        if let Some(ready) = self.ready.take() {
            let _gone = ready.send(Err(error));
        }
    }

    async fn serve(&mut self) -> Result<(), BotError> {
        let urls = self.state.bot_urls.len();
        let mut failed_in_round = 0usize;
        loop {
            if failed_in_round >= urls {
                failed_in_round = 0;
                let delay = self.backoff.next().unwrap_or(self.options.backoff_max);
                tokio::select! {
                    () = self.stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
            }
            let url = self.state.bot_urls[self.url_index % urls].clone();
            // A channel that is up is resumed; a handshake under way is not (its Open may be
            // lost): the connection starts a new one.
            let channels = match self.phase {
                Phase::Greeting { .. } | Phase::Ready => vec![self.channel_id.clone()],
                Phase::Idle { .. } | Phase::Handshaking { .. } => Vec::new(),
            };
            let connect = dial(
                &url,
                &self.state.token,
                &self.state.host_id,
                channels,
                self.options.connect_timeout,
            );
            let dialed = tokio::select! {
                () = self.stop.cancelled() => return Ok(()),
                dialed = connect => dialed,
            };
            let (mut relay, welcome) = match dialed {
                Ok(dialed) => dialed,
                Err(e) => {
                    tracing::info!(url, error = %e, "relay dial failed");
                    if matches!(e, BotError::Unauthorized { .. }) && self.ready.is_some() {
                        return Err(e);
                    }
                    self.status
                        .send_modify(|s| s.last_error = Some(e.to_string()));
                    self.url_index += 1;
                    failed_in_round += 1;
                    continue;
                }
            };
            tracing::info!(
                url,
                instance = %welcome.instance,
                host_online = welcome.host_online,
                "relay connected"
            );
            self.status.send_modify(|s| {
                s.url = Some(url.clone());
                s.instance = Some(welcome.instance.clone());
                s.host_online = welcome.host_online;
                s.relay_connects += 1;
            });
            let started = Instant::now();
            match self.connection(&mut relay).await {
                Flow::End(end) => {
                    relay.close().await;
                    return end;
                }
                Flow::Reconnect(e) => {
                    tracing::info!(url, error = %e, "relay connection ended");
                    self.status.send_modify(|s| {
                        s.last_error = Some(e.to_string());
                        s.ready = false;
                    });
                    self.url_index += 1;
                    // A connection that ended at once counts as a failed dial.
                    if started.elapsed() < Duration::from_secs(2) {
                        failed_in_round += 1;
                    } else {
                        failed_in_round = 0;
                        self.backoff = backoff_of(&self.options);
                    }
                }
            }
        }
    }

    /// Serve one relay connection until it fails or the bot ends.
    async fn connection(&mut self, relay: &mut Relay) -> Flow {
        match self.phase {
            Phase::Handshaking { .. } => {
                let old = self.channel_id.clone();
                let _best_effort = self.close_channel(relay, &old, "abandoned").await;
                if let Err(e) = self.renew("the relay connection ended during the handshake") {
                    return Flow::End(Err(e));
                }
            }
            Phase::Greeting { .. } | Phase::Ready => {
                // Resumed: requests flow again at once; the probe proves nothing was lost
                // while the relay changed (or renews the channel).
                let ready = matches!(self.phase, Phase::Ready);
                self.status.send_modify(|s| s.ready = ready);
                if let Err(flow) = self.send_probe(relay).await {
                    return flow;
                }
            }
            Phase::Idle { .. } => {}
        }
        let mut last_heard = Instant::now();
        let mut ping = tokio::time::interval_at(
            Instant::now() + self.options.ping_interval,
            self.options.ping_interval,
        );
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ping_id = 0u64;
        loop {
            if let Err(flow) = self.housekeeping(relay).await {
                return flow;
            }
            let deadline = self.deadline();
            let ready = matches!(self.phase, Phase::Ready);
            let wake = tokio::select! {
                () = self.stop.cancelled() => Wake::Stop,
                frame = relay.next() => Wake::Frame(frame),
                command = self.commands.recv(), if ready => Wake::Command(command),
                _ = ping.tick() => Wake::Tick,
                () = sleep_until_some(deadline), if deadline.is_some() => Wake::Deadline,
            };
            let step = match wake {
                Wake::Stop | Wake::Command(None) => Err(self.goodbye(relay).await),
                Wake::Command(Some(Command::Close(done))) => {
                    let flow = self.goodbye(relay).await;
                    let _told = done.send(());
                    Err(flow)
                }
                Wake::Command(Some(command)) => self.command(relay, command).await,
                Wake::Frame(Err(e)) => Err(Flow::Reconnect(e)),
                Wake::Frame(Ok(body)) => {
                    last_heard = Instant::now();
                    self.frame(relay, body).await
                }
                Wake::Tick => {
                    if last_heard.elapsed() >= self.options.dead_peer {
                        Err(Flow::Reconnect(relay.failed(format!(
                            "nothing heard for {} ms",
                            self.options.dead_peer.as_millis()
                        ))))
                    } else if matches!(self.phase, Phase::Ready)
                        && self.last_sent.elapsed() >= self.options.keepalive
                    {
                        let nonce = self.next_id();
                        let ping = wire::encode(CmdId::Ping, nonce, &pb::Ping { nonce });
                        self.send_inner(relay, &ping).await
                    } else {
                        ping_id += 1;
                        relay
                            .send(Body::Ping(relay_wire::Ping {
                                id: ping_id,
                                loop_back: false,
                            }))
                            .await
                            .map_err(Flow::Reconnect)
                    }
                }
                Wake::Deadline => self.deadline_passed(),
            };
            if let Err(flow) = step {
                return flow;
            }
        }
    }

    /// What the loop does before it waits: start a handshake that is due, renew the channel
    /// after an overflow once the queue drained.
    async fn housekeeping(&mut self, relay: &mut Relay) -> Result<(), Flow> {
        if self.resync
            && matches!(self.phase, Phase::Ready)
            && self.events.capacity() * 2 >= self.events.max_capacity()
        {
            self.resync = false;
            tracing::info!(
                cursor = self.last_seq,
                "the event queue drained: renewing the channel to replay"
            );
            let old = self.channel_id.clone();
            self.renew("resync after an overflow")
                .map_err(|e| Flow::End(Err(e)))?;
            self.closes = 0;
            self.close_channel(relay, &old, "resync").await?;
        }
        if let Phase::Idle { at } = self.phase
            && at <= Instant::now()
        {
            let (handshake, message) = BotHandshake::start(
                HandshakeKind::Connect,
                &self.key,
                &self.host_public,
                None,
                &self.state.name,
            )
            .map_err(|e| Flow::End(Err(e.into())))?;
            self.phase = Phase::Handshaking {
                handshake: Box::new(handshake),
                deadline: Instant::now() + self.options.handshake_timeout,
            };
            relay
                .send(Body::Open(relay_wire::Open {
                    channel: self.channel_id.clone(),
                    kind: HandshakeKind::Connect.wire(),
                    secret_id: String::new(),
                    message,
                }))
                .await?;
            tracing::debug!(channel = %self.channel_id, "open sent");
        }
        Ok(())
    }

    /// The next timer of the channel: a handshake to start or answer, a probe to be answered,
    /// an overflow to check on.
    fn deadline(&self) -> Option<Instant> {
        let phase = match &self.phase {
            Phase::Idle { at } => Some(*at),
            Phase::Handshaking { deadline, .. } => Some(*deadline),
            Phase::Greeting { .. } | Phase::Ready => None,
        };
        let resync = self
            .resync
            .then(|| Instant::now() + Duration::from_millis(50));
        [phase, self.probe.map(|(_, at)| at), resync]
            .into_iter()
            .flatten()
            .min()
    }

    fn deadline_passed(&mut self) -> Result<(), Flow> {
        let now = Instant::now();
        if let Phase::Handshaking { deadline, .. } = self.phase
            && deadline <= now
        {
            // The host is away or the Open was lost: a new channel (the old one, if the host
            // ever reads its Open, is closed as soon as an answer to it comes).
            self.renew("no answer to the handshake in time")
                .map_err(|e| Flow::End(Err(e)))?;
            self.status.send_modify(|s| {
                s.last_error = Some("the host did not answer the handshake in time".to_owned());
            });
        }
        if let Some((_, due)) = self.probe
            && due <= now
        {
            self.renew("no answer to the probe in time")
                .map_err(|e| Flow::End(Err(e)))?;
        }
        Ok(())
    }

    /// Start over on a new channel: the old one is forgotten, requests that are safe to repeat
    /// wait for the new one, the others fail as uncertain; the next handshake is paced by the
    /// backoff when channels keep closing.
    fn renew(&mut self, why: &str) -> Result<(), BotError> {
        tracing::info!(channel = %self.channel_id, why, "renewing the channel");
        self.channel_id = new_channel_id()?;
        self.chan = None;
        self.probe = None;
        // The new channel's Hello replays from the last bracket delivered: what an overflow
        // dropped comes again (and, into a queue still full, stops delivery again).
        self.resync = false;
        let delay = if self.closes == 0 {
            Duration::ZERO
        } else {
            self.backoff.next().unwrap_or(self.options.backoff_max)
        };
        self.closes = self.closes.saturating_add(1);
        self.phase = Phase::Idle {
            at: Instant::now() + delay,
        };
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            let Some(mut request) = self.pending.remove(&id) else {
                continue;
            };
            if request.retry {
                request.sent = false;
                self.pending.insert(id, request);
            } else {
                let _gone = request
                    .reply
                    .send(Err(BotError::Uncertain(request.command.clone())));
            }
        }
        let channel = self.channel_id.clone();
        self.status.send_modify(|s| {
            s.ready = false;
            s.channel = channel;
        });
        Ok(())
    }

    /// Close the channel and end: the user closed the client.
    async fn goodbye(&mut self, relay: &mut Relay) -> Flow {
        let channel = self.channel_id.clone();
        let _best_effort = self.close_channel(relay, &channel, "bye").await;
        Flow::End(Ok(()))
    }

    async fn close_channel(
        &mut self,
        relay: &mut Relay,
        channel: &str,
        reason: &str,
    ) -> Result<(), Flow> {
        relay
            .send(Body::Closed(relay_wire::Closed {
                channel: channel.to_owned(),
                reason: reason.to_owned(),
            }))
            .await
            .map_err(Flow::Reconnect)
    }

    async fn send_probe(&mut self, relay: &mut Relay) -> Result<(), Flow> {
        let nonce = self.next_id();
        self.probe = Some((nonce, Instant::now() + self.options.handshake_timeout));
        let frame = wire::encode(CmdId::Ping, nonce, &pb::Ping { nonce });
        self.send_inner(relay, &frame).await
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_request;
        self.next_request += 1;
        id
    }

    /// Seal one wire frame and send its chunks.
    async fn send_inner(&mut self, relay: &mut Relay, frame: &[u8]) -> Result<(), Flow> {
        let Some(chan) = self.chan.as_mut() else {
            return Ok(());
        };
        let sealed = match chan.seal(frame) {
            Ok(sealed) => sealed,
            // A frame over the limit is refused before it gets here: any failure broke the
            // channel.
            Err(e) => {
                let why = e.to_string();
                self.renew(&why).map_err(|e| Flow::End(Err(e)))?;
                return Ok(());
            }
        };
        self.last_sent = Instant::now();
        for SealedFrame { nonce, ciphertext } in sealed {
            relay
                .send(Body::Sealed(relay_wire::Sealed {
                    channel: self.channel_id.clone(),
                    nonce,
                    ciphertext,
                }))
                .await?;
        }
        Ok(())
    }

    async fn command(&mut self, relay: &mut Relay, command: Command) -> Result<(), Flow> {
        match command {
            Command::Request {
                command,
                mut params,
                reply,
            } => {
                if self.pending.len() >= MAX_IN_FLIGHT {
                    let _gone = reply.send(Err(BotError::Overloaded));
                    return Ok(());
                }
                let keyed = KEYED.contains(&command.as_str());
                if keyed
                    && let Some(object) = params.as_object_mut()
                    && !object.get("client_msg_id").is_some_and(Value::is_string)
                {
                    object.insert(
                        "client_msg_id".to_owned(),
                        Value::String(uuid::Uuid::new_v4().to_string()),
                    );
                }
                let retry = keyed || READS.contains(&command.as_str());
                let id = self.next_id();
                let frame = wire::encode(CmdId::Request, id, &wire::request(&command, &params));
                if frame.len() > MAX_FRAME_BYTES {
                    let _gone = reply.send(Err(BotError::Seal(format!(
                        "a request of {} bytes is over the limit of {MAX_FRAME_BYTES}",
                        frame.len()
                    ))));
                    return Ok(());
                }
                self.pending.insert(
                    id,
                    InFlight {
                        command,
                        params,
                        reply,
                        retry,
                        sent: true,
                    },
                );
                self.send_inner(relay, &frame).await
            }
            Command::Ack(cursor) => {
                let frame = wire::encode(CmdId::Ack, 0, &pb::Ack { cursor });
                self.send_inner(relay, &frame).await
            }
            Command::Close(_) => Ok(()),
        }
    }

    async fn frame(&mut self, relay: &mut Relay, body: Body) -> Result<(), Flow> {
        match body {
            Body::Accept(accept) if accept.channel == self.channel_id => {
                let phase = std::mem::replace(&mut self.phase, Phase::Ready);
                let Phase::Handshaking { handshake, .. } = phase else {
                    self.phase = phase;
                    return Ok(());
                };
                let (chan, accepted) = handshake
                    .finish(&accept.message)
                    .map_err(|e| Flow::End(Err(e.into())))?;
                tracing::debug!(channel = %self.channel_id, "handshake finished");
                self.chan = Some(chan);
                let id = self.next_id();
                self.phase = Phase::Greeting { id };
                self.status
                    .send_modify(|s| s.scope = Some(accepted.scope.clone()));
                let cursor = (self.last_seq > 0)
                    .then_some(self.last_seq)
                    .or(self.options.cursor);
                let hello = pb::Hello {
                    client_name: self.options.client_name.clone(),
                    cursor,
                    protocol_version: PROTOCOL_VERSION,
                };
                self.send_inner(relay, &wire::encode(CmdId::Hello, id, &hello))
                    .await
            }
            Body::Accept(accept) => {
                // The answer to a handshake given up on: that channel is not used.
                self.close_channel(relay, &accept.channel, "abandoned")
                    .await
            }
            Body::Sealed(sealed) if sealed.channel == self.channel_id => {
                let Some(chan) = self.chan.as_mut() else {
                    return Ok(());
                };
                let opened = chan.open(&SealedFrame {
                    nonce: sealed.nonce,
                    ciphertext: sealed.ciphertext,
                });
                match opened {
                    Ok(None) => Ok(()),
                    Ok(Some(inner)) => self.inner(relay, &inner).await,
                    Err(e) => {
                        let old = self.channel_id.clone();
                        self.renew(&e.to_string()).map_err(|e| Flow::End(Err(e)))?;
                        self.close_channel(relay, &old, "broken").await
                    }
                }
            }
            Body::Closed(closed) if closed.channel == self.channel_id => {
                if REFUSALS.contains(&closed.reason.as_str()) {
                    return Err(Flow::End(Err(BotError::Refused(closed.reason))));
                }
                let why = format!("the host closed the channel: {}", closed.reason);
                self.status
                    .send_modify(|s| s.last_error = Some(why.clone()));
                self.renew(&why).map_err(|e| Flow::End(Err(e)))
            }
            Body::Ping(ping) => relay
                .send(Body::Pong(relay_wire::Pong { id: ping.id }))
                .await
                .map_err(Flow::Reconnect),
            Body::Error(e) => Err(Flow::Reconnect(BotError::RelayError {
                code: e.code,
                message: e.message,
            })),
            // Pongs prove the relay alive; frames of channels given up on are dropped.
            _ => Ok(()),
        }
    }

    /// One wire frame from the host.
    async fn inner(&mut self, relay: &mut Relay, bytes: &[u8]) -> Result<(), Flow> {
        let frame = match wire::decode(bytes) {
            Ok(frame) => frame,
            Err((_, e)) => {
                tracing::warn!(error = %e, "a frame from the host does not decode; skipped");
                return Ok(());
            }
        };
        match frame.cmd {
            CmdId::HelloResp => {
                if !matches!(self.phase, Phase::Greeting { id } if id == frame.request_id) {
                    return Ok(());
                }
                self.phase = Phase::Ready;
                self.closes = 0;
                self.backoff = backoff_of(&self.options);
                self.status.send_modify(|s| {
                    s.ready = true;
                    s.handshakes += 1;
                });
                if let Some(ready) = self.ready.take() {
                    let _told = ready.send(Ok(()));
                }
                self.resend(relay).await
            }
            CmdId::ErrorResp if matches!(self.phase, Phase::Greeting { id } if id == frame.request_id) =>
            {
                let refusal = frame.body::<pb::ErrorResp>().unwrap_or_default();
                Err(Flow::End(Err(BotError::Refused(format!(
                    "{} ({})",
                    refusal.name, refusal.message
                )))))
            }
            CmdId::Reply => {
                let Some(request) = self.pending.remove(&frame.request_id) else {
                    return Ok(());
                };
                let answer = frame
                    .body::<pb::Reply>()
                    .map_err(|e| BotError::RequestRefused(e.to_string()))
                    .and_then(|reply| {
                        let data = if reply.data_json.is_empty() {
                            Value::Null
                        } else {
                            serde_json::from_str(&reply.data_json)
                                .map_err(|e| BotError::RequestRefused(format!("data_json: {e}")))?
                        };
                        Ok(Reply {
                            code: reply.code,
                            message: reply.message,
                            data,
                        })
                    });
                let _gone = request.reply.send(answer);
                Ok(())
            }
            CmdId::ErrorResp => {
                let Some(request) = self.pending.remove(&frame.request_id) else {
                    return Ok(());
                };
                let refusal = frame.body::<pb::ErrorResp>().unwrap_or_default();
                let _gone = request.reply.send(Err(BotError::RequestRefused(format!(
                    "{} ({})",
                    refusal.name, refusal.message
                ))));
                Ok(())
            }
            CmdId::EventPush => {
                match frame.body::<pb::EventPush>() {
                    Ok(push) => self.deliver(push),
                    Err(e) => tracing::warn!(error = %e, "an event push does not decode; skipped"),
                }
                Ok(())
            }
            CmdId::Pong => {
                let nonce = frame.body::<pb::Pong>().map(|p| p.nonce).unwrap_or(0);
                if self.probe.is_some_and(|(n, _)| n == nonce) {
                    self.probe = None;
                }
                Ok(())
            }
            CmdId::Ping => {
                let nonce = frame.body::<pb::Ping>().map(|p| p.nonce).unwrap_or(0);
                let pong = wire::encode(CmdId::Pong, frame.request_id, &pb::Pong { nonce });
                self.send_inner(relay, &pong).await
            }
            _ => Ok(()),
        }
    }

    /// Send the requests that wait for a ready channel, under new ids.
    async fn resend(&mut self, relay: &mut Relay) -> Result<(), Flow> {
        let waiting: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, r)| !r.sent)
            .map(|(id, _)| *id)
            .collect();
        let mut waiting: Vec<(u64, InFlight)> = waiting
            .into_iter()
            .filter_map(|id| self.pending.remove(&id).map(|r| (id, r)))
            .collect();
        waiting.sort_by_key(|(id, _)| *id);
        for (_, mut request) in waiting {
            let id = self.next_id();
            tracing::debug!(command = %request.command, "request sent again on the new channel");
            let frame = wire::encode(
                CmdId::Request,
                id,
                &wire::request(&request.command, &request.params),
            );
            request.sent = true;
            self.pending.insert(id, request);
            self.send_inner(relay, &frame).await?;
        }
        Ok(())
    }

    fn deliver(&mut self, push: pb::EventPush) {
        if !push.is_delta && (push.sequence_id <= self.last_seq || self.resync) {
            return;
        }
        if !self.options.events {
            if !push.is_delta {
                self.last_seq = push.sequence_id;
            }
            return;
        }
        let event = match serde_json::from_str(&push.event_json) {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(error = %e, "an event is not JSON; skipped");
                return;
            }
        };
        let event = BotEvent {
            sequence_id: push.sequence_id,
            message_id: push.message_id,
            session_id: push.session_id,
            run_id: push.run_id,
            is_delta: push.is_delta,
            event,
        };
        let bracket = !event.is_delta;
        let seq = event.sequence_id;
        match self.events.try_send(event) {
            Ok(()) => {
                if bracket {
                    self.last_seq = seq;
                    self.status.send_modify(|s| s.last_sequence_id = seq);
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                if bracket {
                    tracing::info!(
                        cursor = self.last_seq,
                        "the event queue is full: delivery stops until it drains, then replays"
                    );
                    self.resync = true;
                }
            }
            // Nobody reads events any more (the handle is gone): the task ends with it.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(dir: &Path) -> BotState {
        let host_public = [7u8; 32];
        BotState {
            host_id: key_id(&host_public),
            host_public: URL_SAFE_NO_PAD.encode(host_public),
            bot_urls: vec!["ws://127.0.0.1:9/bot".to_owned()],
            key_file: dir.join("bot.key"),
            bot_id: "b".repeat(24),
            name: "test".to_owned(),
            token: "sekrit-bot-token".to_owned(),
            scope: Scope::default(),
            paired_at_ms: 1,
        }
    }

    #[test]
    fn the_state_round_trips_0600_and_hides_its_token() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let state = state(dir.path());
        state.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(BotState::load(&path).unwrap(), state);
        assert_eq!(state.host_key().unwrap(), [7u8; 32]);
        assert!(!format!("{state:?}").contains("sekrit"));
        let mut swapped = state.clone();
        swapped.host_id = "0".repeat(24);
        assert!(swapped.host_key().is_err());
    }

    #[test]
    fn plain_ws_only_to_loopback_and_a_token_is_needed() {
        assert!(request_of("ws://127.0.0.1:1/bot", "t").is_ok());
        assert!(request_of("ws://localhost:1/bot", "t").is_ok());
        assert!(request_of("wss://relay.example.org/bot", "t").is_ok());
        assert!(request_of("ws://relay.example.org/bot", "t").is_err());
        assert!(request_of("http://127.0.0.1/bot", "t").is_err());
        assert!(request_of("ws://127.0.0.1:1/bot", "").is_err());
        assert!(request_of("ws://127.0.0.1:1/bot", "a\nb").is_err());
        let request = request_of("ws://127.0.0.1:1/bot", "t").unwrap();
        assert_eq!(request.headers()[header::AUTHORIZATION], "Bearer t");
    }

    #[test]
    fn channel_ids_are_what_the_relay_takes() {
        let a = new_channel_id().unwrap();
        assert!(relay_wire::is_channel(&a), "{a}");
        assert_ne!(a, new_channel_id().unwrap());
    }

    #[test]
    fn needs_you_is_a_permission_request_or_a_run_end() {
        let event = |k: &str| BotEvent {
            sequence_id: 1,
            message_id: String::new(),
            session_id: String::new(),
            run_id: String::new(),
            is_delta: false,
            event: serde_json::json!({ "k": k }),
        };
        assert!(event("permission.request").needs_you());
        assert!(event("run.end").needs_you());
        assert!(!event("text.end").needs_you());
    }
}
