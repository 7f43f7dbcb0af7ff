//! The host's pairings: pending pairing secrets (in memory only), paired bots (in the store),
//! and revocations as they happen.
//!
//! One task owns the pending secrets — `secret_id` → the secret, the scope a bot paired with
//! it gets, the code's label and when it expires — and the count of each bot's open channels;
//! its inputs are the closed [`Msg`] enum, and callers hold the cloneable [`PairRegistry`].
//! The store keeps each secret's SHA-256 only (`pairing_secrets`, the audit trail and the
//! single-use mark), so a restarted host has forgotten every pending secret and refuses their
//! codes: the user makes a new one. Using a secret marks its row and stores the bot in one
//! transaction, so of two handshakes with one code exactly one pairs.
//!
//! Paired bots are read from the store on every lookup ([`PairRegistry::bot`]): a revocation
//! is a row update plus a broadcast ([`PairRegistry::revocations`]), so whoever holds a
//! revoked bot's channels closes them at once, and no cache can keep a revoked bot alive.
//!
//! The host key (`relay.key`) is loaded, or created, on first need ([`PairRegistry::host_key`]):
//! a host that never pairs never writes one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::TryRng;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::code::PairingCode;
use super::keys::{HostKey, key_id};
use super::{MAX_NAME_CHARS, SealError};
use crate::clock::Clock;
use crate::protocol::scope::Scope;
use crate::store::{PairedBotRow, PairingSecretRow, Store, StoreError};

/// How long a pairing code is valid unless `pair.create` says otherwise.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// The longest a pairing code may be valid.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// Pending secrets kept at once; a new code beyond this ends the one that expires first.
pub const MAX_PENDING: usize = 32;
/// Requests waiting for the registry task before callers wait for room.
const QUEUE: usize = 64;
/// Revocations kept for a slow listener; one that lags more gets `Lagged` and must check
/// every bot it holds.
const REVOCATIONS: usize = 64;

/// Why a pairing request failed.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// The secret is unknown (or the host restarted since the code was made), used, or
    /// expired: one reason for all three, so a prober learns nothing (`pairing_refused`).
    #[error("pairing refused: the code is unknown, used or expired; make a new one")]
    Refused,
    #[error("no paired bot {0}")]
    NotFound(String),
    /// `relay.key` cannot be read or made.
    #[error("the host key: {0}")]
    Key(#[source] SealError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("no randomness for a pairing secret: {0}")]
    Rng(String),
    /// A stored row this build cannot read (a key of the wrong length).
    #[error("paired bot {bot_id}: {why}")]
    BadRow { bot_id: String, why: String },
    /// The registry task has stopped (the host is shutting down).
    #[error("the pairing registry has stopped")]
    Closed,
}

/// What a pending pairing gives the handshake: the psk, and what the bot will be granted.
#[derive(Clone)]
pub struct Pending {
    pub psk: [u8; 32],
    pub scope: Scope,
    /// The code's label (`pair.create` `name`).
    pub name: Option<String>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("psk", &"<redacted>")
            .field("scope", &self.scope)
            .field("name", &self.name)
            .finish()
    }
}

/// A paired bot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BotRecord {
    pub bot_id: String,
    #[serde(skip)]
    pub public_key: [u8; 32],
    pub name: String,
    pub scope: Scope,
    pub paired_at_ms: i64,
    pub last_seen_at_ms: Option<i64>,
    /// Set once revoked: the bot may no longer connect.
    pub revoked_at_ms: Option<i64>,
}

impl BotRecord {
    pub fn is_revoked(&self) -> bool {
        self.revoked_at_ms.is_some()
    }

    fn from_row(row: PairedBotRow) -> Result<BotRecord, PairError> {
        let public_key =
            <[u8; 32]>::try_from(row.public_key.as_slice()).map_err(|_| PairError::BadRow {
                bot_id: row.bot_id.clone(),
                why: format!("a key of {} bytes", row.public_key.len()),
            })?;
        // A scope this build cannot read grants nothing.
        let scope = serde_json::from_str(&row.scope).unwrap_or_else(|e| {
            tracing::warn!(bot_id = %row.bot_id, error = %e, "a paired bot's scope does not read; it may do nothing");
            Scope::nothing()
        });
        Ok(BotRecord {
            bot_id: row.bot_id,
            public_key,
            name: row.name,
            scope,
            paired_at_ms: row.paired_at_ms,
            last_seen_at_ms: row.last_seen_at_ms,
            revoked_at_ms: row.revoked_at_ms,
        })
    }
}

/// One row of `pair.list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BotListing {
    #[serde(flatten)]
    pub bot: BotRecord,
    /// Whether the bot has a channel open now.
    pub connected: bool,
}

/// `pair.list`'s reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairListReply {
    pub bots: Vec<BotListing>,
}

/// `pair.revoke`'s reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairRevokeReply {
    pub bot_id: String,
    pub revoked: bool,
}

/// A code to make (`pair.create`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPairing {
    pub scope: Scope,
    /// Clamped to [`MAX_TTL`].
    pub ttl: Duration,
    pub name: Option<String>,
    /// Where bots dial the relay, written into the code.
    pub relay_urls: Vec<String>,
}

/// `pair.create`'s reply: the code (it holds the secret) and what it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairCreateReply {
    pub code: String,
    /// The code as a terminal QR (Unicode half blocks).
    pub qr: String,
    pub host_id: String,
    /// base64url, no padding.
    pub host_public: String,
    pub relay_urls: Vec<String>,
    pub secret_id: String,
    pub expires_at_ms: i64,
    pub scope: Scope,
}

/// What the registry task is asked.
enum Msg {
    Create {
        pairing: NewPairing,
        reply: oneshot::Sender<Result<PairCreateReply, PairError>>,
    },
    Begin {
        secret_id: String,
        reply: oneshot::Sender<Result<Pending, PairError>>,
    },
    Complete {
        secret_id: String,
        bot_public: [u8; 32],
        name: String,
        reply: oneshot::Sender<Result<BotRecord, PairError>>,
    },
    HostKey {
        reply: oneshot::Sender<Result<HostKey, PairError>>,
    },
    ChannelOpened {
        bot_id: String,
    },
    ChannelClosed {
        bot_id: String,
    },
    Connected {
        reply: oneshot::Sender<HashMap<String, u32>>,
    },
}

/// The cloneable handle to the host's pairings.
#[derive(Clone)]
pub struct PairRegistry {
    tx: mpsc::Sender<Msg>,
    store: Store,
    clock: Clock,
    revoked: broadcast::Sender<String>,
}

impl PairRegistry {
    /// Start the registry task; it ends at `shutdown` or when the last handle is dropped.
    /// `home` is where `relay.key` is (made on first need).
    pub fn spawn(
        store: Store,
        home: PathBuf,
        clock: Clock,
        shutdown: CancellationToken,
    ) -> PairRegistry {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (revoked, _) = broadcast::channel(REVOCATIONS);
        let task = Task {
            store: store.clone(),
            home,
            clock: clock.clone(),
            host_key: None,
            pending: HashMap::new(),
            connected: HashMap::new(),
        };
        tokio::spawn(task.run(rx, shutdown));
        PairRegistry {
            tx,
            store,
            clock,
            revoked,
        }
    }

    async fn ask<T>(&self, msg: impl FnOnce(oneshot::Sender<T>) -> Msg) -> Result<T, PairError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(msg(reply))
            .await
            .map_err(|_| PairError::Closed)?;
        answer.await.map_err(|_| PairError::Closed)
    }

    /// A new pairing code (`pair.create`).
    pub async fn create(&self, pairing: NewPairing) -> Result<PairCreateReply, PairError> {
        self.ask(|reply| Msg::Create { pairing, reply }).await?
    }

    /// The pending secret `secret_id` names (an `Open` frame of kind pair): its psk for the
    /// handshake. Unknown, used or expired: [`PairError::Refused`].
    pub async fn begin_pair(&self, secret_id: &str) -> Result<Pending, PairError> {
        let secret_id = secret_id.to_owned();
        self.ask(|reply| Msg::Begin { secret_id, reply }).await?
    }

    /// The handshake read message 1 with the secret: use it (once) and store the bot, with
    /// the pending scope, named by the code's label, else by `name` (the bot's own). A second
    /// use, or one after expiry: [`PairError::Refused`]. A bot that pairs again (the same key)
    /// takes the new scope and name and is no longer revoked.
    pub async fn complete_pair(
        &self,
        secret_id: &str,
        bot_public: [u8; 32],
        name: &str,
    ) -> Result<BotRecord, PairError> {
        let secret_id = secret_id.to_owned();
        let name = name.to_owned();
        self.ask(|reply| Msg::Complete {
            secret_id,
            bot_public,
            name,
            reply,
        })
        .await?
    }

    /// The paired bot of this static key (`None`: never paired); a revoked one has
    /// `revoked_at_ms`.
    pub async fn bot(&self, bot_public: &[u8; 32]) -> Result<Option<BotRecord>, PairError> {
        let Some(row) = self.store.paired_bot(key_id(bot_public)).await? else {
            return Ok(None);
        };
        let bot = BotRecord::from_row(row)?;
        // Ids are a hash's prefix: the whole key decides.
        Ok((bot.public_key == *bot_public).then_some(bot))
    }

    /// Every paired bot, revoked ones too, in the order they paired (`pair.list`).
    pub async fn list(&self) -> Result<Vec<BotListing>, PairError> {
        let rows = self.store.paired_bots().await?;
        let connected = self.ask(|reply| Msg::Connected { reply }).await?;
        let mut bots = Vec::with_capacity(rows.len());
        for row in rows {
            match BotRecord::from_row(row) {
                Ok(bot) => bots.push(BotListing {
                    connected: connected.get(&bot.bot_id).is_some_and(|n| *n > 0),
                    bot,
                }),
                Err(e) => tracing::warn!(error = %e, "a paired bot is left out of the list"),
            }
        }
        Ok(bots)
    }

    /// Revoke a bot (`pair.revoke`): it may no longer connect, and every listener of
    /// [`PairRegistry::revocations`] hears its id now. Revoking again keeps the first time.
    pub async fn revoke(&self, bot_id: &str) -> Result<BotRecord, PairError> {
        let row = self
            .store
            .revoke_paired_bot(bot_id.to_owned(), wall_ms(&self.clock))
            .await?
            .ok_or_else(|| PairError::NotFound(bot_id.to_owned()))?;
        if self.revoked.send(bot_id.to_owned()).is_err() {
            tracing::debug!(bot_id, "revoked a bot nobody holds a channel of");
        }
        tracing::info!(bot_id, "paired bot revoked");
        BotRecord::from_row(row)
    }

    /// The ids of bots revoked from now on, as they are revoked.
    pub fn revocations(&self) -> broadcast::Receiver<String> {
        self.revoked.subscribe()
    }

    /// The bot was seen now (a handshake, a frame).
    pub async fn touch(&self, bot_id: &str) -> Result<(), PairError> {
        if self
            .store
            .touch_paired_bot(bot_id.to_owned(), wall_ms(&self.clock))
            .await?
        {
            Ok(())
        } else {
            Err(PairError::NotFound(bot_id.to_owned()))
        }
    }

    /// A session the bot created joins its stored scope, so its later channels see it too
    /// (the channel that created it has it at once). A scope over every session, or one that
    /// does not read, is left as it is.
    pub async fn extend_scope(&self, bot_id: &str, session_id: &str) -> Result<(), PairError> {
        let session_id = session_id.to_owned();
        let found = self
            .store
            .update_paired_bot_scope(bot_id.to_owned(), move |text| {
                let mut scope: Scope = serde_json::from_str(text).ok()?;
                let sessions = scope.sessions.as_mut()?;
                if sessions.contains(&session_id) {
                    return None;
                }
                sessions.push(session_id);
                serde_json::to_string(&scope).ok()
            })
            .await?;
        if found {
            Ok(())
        } else {
            Err(PairError::NotFound(bot_id.to_owned()))
        }
    }

    /// A channel of the bot opened (`pair.list` says `connected` while one is open).
    pub async fn channel_opened(&self, bot_id: &str) -> Result<(), PairError> {
        let bot_id = bot_id.to_owned();
        self.tx
            .send(Msg::ChannelOpened { bot_id })
            .await
            .map_err(|_| PairError::Closed)
    }

    /// A channel of the bot closed.
    pub async fn channel_closed(&self, bot_id: &str) -> Result<(), PairError> {
        let bot_id = bot_id.to_owned();
        self.tx
            .send(Msg::ChannelClosed { bot_id })
            .await
            .map_err(|_| PairError::Closed)
    }

    /// The host's static key, loaded or made (`relay.key`, 0600) on first need.
    pub async fn host_key(&self) -> Result<HostKey, PairError> {
        self.ask(|reply| Msg::HostKey { reply }).await?
    }
}

/// Milliseconds since the epoch, as `clock` sees it (a manual clock's advance included).
fn wall_ms(clock: &Clock) -> i64 {
    let ahead = clock.now().saturating_duration_since(Instant::now());
    crate::store::now_ms().saturating_add(i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX))
}

/// A pending secret and when it expires.
struct Entry {
    pending: Pending,
    expires_at_ms: i64,
}

/// The state the registry task owns.
struct Task {
    store: Store,
    home: PathBuf,
    clock: Clock,
    host_key: Option<HostKey>,
    pending: HashMap<String, Entry>,
    /// Open channels per bot id.
    connected: HashMap<String, u32>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::Receiver<Msg>, shutdown: CancellationToken) {
        loop {
            let msg = tokio::select! {
                () = shutdown.cancelled() => break,
                msg = rx.recv() => match msg {
                    Some(msg) => msg,
                    None => break,
                },
            };
            self.handle(msg).await;
        }
        // Forgotten on purpose: a pending secret never outlives the process.
        self.pending.clear();
    }

    async fn handle(&mut self, msg: Msg) {
        // A caller that went away does not need its answer.
        match msg {
            Msg::Create { pairing, reply } => {
                let _gone = reply.send(self.create(pairing).await);
            }
            Msg::Begin { secret_id, reply } => {
                let _gone = reply.send(self.begin(&secret_id));
            }
            Msg::Complete {
                secret_id,
                bot_public,
                name,
                reply,
            } => {
                let _gone = reply.send(self.complete(secret_id, bot_public, name).await);
            }
            Msg::HostKey { reply } => {
                let _gone = reply.send(self.host_key().await);
            }
            Msg::ChannelOpened { bot_id } => *self.connected.entry(bot_id).or_insert(0) += 1,
            Msg::ChannelClosed { bot_id } => {
                if let Some(n) = self.connected.get_mut(&bot_id) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.connected.remove(&bot_id);
                    }
                }
            }
            Msg::Connected { reply } => {
                let _gone = reply.send(self.connected.clone());
            }
        }
    }

    async fn host_key(&mut self) -> Result<HostKey, PairError> {
        if let Some(key) = &self.host_key {
            return Ok(key.clone());
        }
        let home = self.home.clone();
        let key = tokio::task::spawn_blocking(move || HostKey::load_or_create(&home))
            .await
            .map_err(|e| PairError::Key(SealError::Seal(e.to_string())))?
            .map_err(PairError::Key)?;
        self.host_key = Some(key.clone());
        Ok(key)
    }

    /// Drop what expired; with the map still full, end the secret that expires first.
    fn make_room(&mut self, now: i64) {
        self.pending.retain(|_, e| e.expires_at_ms > now);
        while self.pending.len() >= MAX_PENDING {
            let Some(first) = self
                .pending
                .iter()
                .min_by_key(|(_, e)| e.expires_at_ms)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            tracing::warn!(secret_id = %first, "{MAX_PENDING} pairing codes pending: the one expiring first no longer works");
            self.pending.remove(&first);
        }
    }

    async fn create(&mut self, p: NewPairing) -> Result<PairCreateReply, PairError> {
        let key = self.host_key().await?;
        let mut secret = [0u8; 32];
        let mut id = [0u8; 8];
        let mut rng = rand::rngs::SysRng;
        rng.try_fill_bytes(&mut secret)
            .and_then(|()| rng.try_fill_bytes(&mut id))
            .map_err(|e| PairError::Rng(e.to_string()))?;
        let secret_id: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let now = wall_ms(&self.clock);
        let ttl_ms = i64::try_from(p.ttl.min(MAX_TTL).as_millis()).unwrap_or(i64::MAX);
        let expires_at_ms = now.saturating_add(ttl_ms);
        let scope_json = serde_json::to_string(&p.scope).map_err(|e| PairError::BadRow {
            bot_id: String::new(),
            why: e.to_string(),
        })?;
        self.store
            .insert_pairing_secret(PairingSecretRow {
                secret_id: secret_id.clone(),
                secret_hash: Sha256::digest(secret).into(),
                scope: scope_json,
                name: p.name.clone(),
                created_at_ms: now,
                expires_at_ms,
            })
            .await?;
        self.make_room(now);
        self.pending.insert(
            secret_id.clone(),
            Entry {
                pending: Pending {
                    psk: secret,
                    scope: p.scope.clone(),
                    name: p.name,
                },
                expires_at_ms,
            },
        );
        let code = PairingCode {
            relay_urls: p.relay_urls.clone(),
            host_id: key.host_id(),
            host_public: key.public(),
            secret_id: secret_id.clone(),
            secret,
            expires_at_ms,
        };
        secret.fill(0);
        let qr = code.qr().map_err(PairError::Key)?;
        tracing::info!(secret_id = %secret_id, expires_at_ms, "pairing code made");
        Ok(PairCreateReply {
            code: code.encode(),
            qr,
            host_id: code.host_id.clone(),
            host_public: URL_SAFE_NO_PAD.encode(code.host_public),
            relay_urls: p.relay_urls,
            secret_id,
            expires_at_ms,
            scope: p.scope,
        })
    }

    fn begin(&mut self, secret_id: &str) -> Result<Pending, PairError> {
        let now = wall_ms(&self.clock);
        match self.pending.get(secret_id) {
            Some(e) if e.expires_at_ms > now => Ok(e.pending.clone()),
            Some(_) => {
                self.pending.remove(secret_id);
                Err(PairError::Refused)
            }
            None => Err(PairError::Refused),
        }
    }

    async fn complete(
        &mut self,
        secret_id: String,
        bot_public: [u8; 32],
        name: String,
    ) -> Result<BotRecord, PairError> {
        let now = wall_ms(&self.clock);
        let Some(entry) = self.pending.remove(&secret_id) else {
            return Err(PairError::Refused);
        };
        if entry.expires_at_ms <= now {
            return Err(PairError::Refused);
        }
        let name: String = entry
            .pending
            .name
            .clone()
            .unwrap_or(name)
            .chars()
            .take(MAX_NAME_CHARS)
            .collect();
        let bot = BotRecord {
            bot_id: key_id(&bot_public),
            public_key: bot_public,
            name,
            scope: entry.pending.scope.clone(),
            paired_at_ms: now,
            last_seen_at_ms: None,
            revoked_at_ms: None,
        };
        let row = PairedBotRow {
            bot_id: bot.bot_id.clone(),
            public_key: bot_public.to_vec(),
            name: bot.name.clone(),
            scope: serde_json::to_string(&bot.scope).map_err(|e| PairError::BadRow {
                bot_id: bot.bot_id.clone(),
                why: e.to_string(),
            })?,
            paired_at_ms: now,
            last_seen_at_ms: None,
            revoked_at_ms: None,
        };
        let hash: [u8; 32] = Sha256::digest(entry.pending.psk).into();
        match self
            .store
            .complete_pairing(secret_id.clone(), hash, now, row)
            .await
        {
            Ok(true) => {
                tracing::info!(secret_id = %secret_id, bot_id = %bot.bot_id, "bot paired");
                Ok(bot)
            }
            Ok(false) => Err(PairError::Refused),
            Err(e) => {
                // Nothing was written: the code still works.
                self.pending.insert(secret_id, entry);
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::{Accepted, BotHandshake, BotKey, HandshakeKind, HostHandshake};

    struct World {
        registry: PairRegistry,
        clock: Clock,
        dir: tempfile::TempDir,
        _threads: crate::store::StoreThreads,
    }

    fn world() -> World {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let clock = Clock::manual();
        let registry = PairRegistry::spawn(
            store,
            dir.path().to_owned(),
            clock.clone(),
            CancellationToken::new(),
        );
        World {
            registry,
            clock,
            dir,
            _threads: threads,
        }
    }

    fn new_pairing(ttl: Duration) -> NewPairing {
        NewPairing {
            scope: Scope::one_session("s1"),
            ttl,
            name: None,
            relay_urls: vec!["wss://relay.example.org/bot".into()],
        }
    }

    /// The host's side of a pairing, as the relay client runs it: the secret by its id,
    /// message 1 with it, the bot stored, message 2.
    async fn host_pairs(
        registry: &PairRegistry,
        secret_id: &str,
        m1: &[u8],
    ) -> Result<(BotRecord, Vec<u8>), PairError> {
        let pending = registry.begin_pair(secret_id).await?;
        let host = registry.host_key().await?;
        let (handshake, hello) =
            HostHandshake::read(HandshakeKind::Pair, &host, Some(&pending.psk), m1)
                .map_err(|_| PairError::Refused)?;
        let bot = registry
            .complete_pair(secret_id, hello.bot_public, &hello.name)
            .await?;
        let (_, m2) = handshake
            .accept(&Accepted {
                host_id: host.host_id(),
                bot_id: bot.bot_id.clone(),
                scope: bot.scope.clone(),
            })
            .unwrap();
        Ok((bot, m2))
    }

    #[tokio::test]
    async fn a_code_pairs_one_bot_once_and_the_bot_connects_after() {
        let w = world();
        let made = w.registry.create(new_pairing(DEFAULT_TTL)).await.unwrap();
        let code = PairingCode::decode(&made.code).unwrap();
        let host = w.registry.host_key().await.unwrap();
        assert_eq!(code.host_id, host.host_id());
        assert_eq!(code.host_public, host.public());
        assert_eq!(code.secret_id, made.secret_id);
        assert_eq!(made.secret_id.len(), 16);
        assert_eq!(made.relay_urls, code.relay_urls);
        assert!(w.dir.path().join("relay.key").exists());

        let bot = BotKey::generate().unwrap();
        let (bot_side, m1) = BotHandshake::start(
            HandshakeKind::Pair,
            &bot,
            &code.host_public,
            Some(&code.secret),
            "laptop-bot",
        )
        .unwrap();
        let (record, m2) = host_pairs(&w.registry, &code.secret_id, &m1).await.unwrap();
        assert_eq!(record.bot_id, bot.bot_id());
        assert_eq!(record.name, "laptop-bot");
        assert_eq!(record.scope, Scope::one_session("s1"));
        let (_, accepted) = bot_side.finish(&m2).unwrap();
        assert_eq!(accepted.scope, Scope::one_session("s1"));

        // The same code again (a replayed message 1, or another bot): refused.
        let again = host_pairs(&w.registry, &code.secret_id, &m1).await;
        assert!(matches!(again, Err(PairError::Refused)), "{again:?}");

        // A connection: the bot is known by its key; an unknown key is not.
        let found = w.registry.bot(&bot.public()).await.unwrap().unwrap();
        assert_eq!(found, record);
        let stranger = BotKey::generate().unwrap();
        assert_eq!(w.registry.bot(&stranger.public()).await.unwrap(), None);
        w.registry.touch(&record.bot_id).await.unwrap();
        assert!(matches!(
            w.registry.touch(&stranger.bot_id()).await,
            Err(PairError::NotFound(_))
        ));

        // Listed, connected while a channel is open.
        w.registry.channel_opened(&record.bot_id).await.unwrap();
        let listed = w.registry.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].connected);
        assert!(listed[0].bot.last_seen_at_ms.is_some());
        w.registry.channel_closed(&record.bot_id).await.unwrap();
        assert!(!w.registry.list().await.unwrap()[0].connected);
    }

    #[tokio::test]
    async fn a_wrong_secret_an_unknown_id_or_an_expired_code_is_refused() {
        let w = world();
        let made = w
            .registry
            .create(new_pairing(Duration::from_secs(60)))
            .await
            .unwrap();
        let code = PairingCode::decode(&made.code).unwrap();
        let bot = BotKey::generate().unwrap();
        let (_, wrong) = BotHandshake::start(
            HandshakeKind::Pair,
            &bot,
            &code.host_public,
            Some(&[0; 32]),
            "b",
        )
        .unwrap();
        assert!(matches!(
            host_pairs(&w.registry, &code.secret_id, &wrong).await,
            Err(PairError::Refused)
        ));
        assert!(matches!(
            w.registry.begin_pair("0000000000000000").await,
            Err(PairError::Refused)
        ));
        // The wrong secret did not use the code up; time does.
        assert!(w.registry.begin_pair(&code.secret_id).await.is_ok());
        w.clock.advance(Duration::from_secs(61));
        assert!(matches!(
            w.registry.begin_pair(&code.secret_id).await,
            Err(PairError::Refused)
        ));
        assert!(w.registry.list().await.unwrap().is_empty());
        // A ttl over the most is held to it.
        let long = w
            .registry
            .create(new_pairing(Duration::from_secs(99_999)))
            .await
            .unwrap();
        let now = wall_ms(&w.clock);
        assert!(long.expires_at_ms <= now + 3_600_000 && long.expires_at_ms > now + 3_500_000);
    }

    #[tokio::test]
    async fn a_revocation_is_heard_at_once_and_the_bot_stays_listed() {
        let w = world();
        let made = w.registry.create(new_pairing(DEFAULT_TTL)).await.unwrap();
        let code = PairingCode::decode(&made.code).unwrap();
        let bot = BotKey::generate().unwrap();
        let (_, m1) = BotHandshake::start(
            HandshakeKind::Pair,
            &bot,
            &code.host_public,
            Some(&code.secret),
            "b",
        )
        .unwrap();
        let (record, _) = host_pairs(&w.registry, &code.secret_id, &m1).await.unwrap();
        let mut revocations = w.registry.revocations();
        let revoked = w.registry.revoke(&record.bot_id).await.unwrap();
        assert!(revoked.is_revoked());
        assert_eq!(revocations.try_recv().unwrap(), record.bot_id);
        let found = w.registry.bot(&bot.public()).await.unwrap().unwrap();
        assert_eq!(found.revoked_at_ms, revoked.revoked_at_ms);
        let listed = w.registry.list().await.unwrap();
        assert_eq!(listed[0].bot.revoked_at_ms, revoked.revoked_at_ms);
        assert!(matches!(
            w.registry.revoke("nobody").await,
            Err(PairError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn pending_codes_are_bounded_and_the_oldest_goes_first() {
        let w = world();
        let mut ids = Vec::new();
        for i in 0..=MAX_PENDING {
            let ttl = Duration::from_secs(100 + i as u64);
            ids.push(w.registry.create(new_pairing(ttl)).await.unwrap().secret_id);
        }
        assert!(matches!(
            w.registry.begin_pair(&ids[0]).await,
            Err(PairError::Refused)
        ));
        for id in &ids[1..] {
            assert!(w.registry.begin_pair(id).await.is_ok());
        }
    }
}
