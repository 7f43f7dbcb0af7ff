//! Grant tokens for the loopback WebSocket (design §7) and the registry of live connections.
//!
//! - A token is 256 bits from the OS RNG, given out once (base64url) and kept only as its
//!   SHA-256 in memory: a host restart voids every token, and the map never holds a secret.
//! - A token is bound to one subscriber, valid for [`TOKEN_TTL`] by the injected [`Clock`],
//!   and usable any number of times until then (reconnects).
//! - Checking hashes the presented token, looks the hash up, and compares in constant time.
//!
//! The handshake callback of the WebSocket server is synchronous, so this state sits behind a
//! `std::sync::Mutex` that is never held across an `.await` (every method is synchronous).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::TryRng;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;

/// How long a grant token can be used to connect.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// How long a token a connected client renewed for itself can be used to reconnect: long
/// enough that a page whose timers the browser throttles (a hidden tab renews about once a
/// minute) still holds a valid one when its connection drops.
pub const RENEWED_TOKEN_TTL: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("no grant token was presented")]
    Missing,
    #[error("the grant token is not valid")]
    Unknown,
    #[error("the grant token has expired")]
    Expired,
    #[error("the OS random number generator failed: {0}")]
    Rng(String),
}

struct Grant {
    hash: [u8; 32],
    subscriber_id: String,
    expires: Instant,
}

/// Tokens by hash, plus the cancellation token of every live connection by subscriber.
pub struct GrantStore {
    clock: Clock,
    grants: Mutex<HashMap<[u8; 32], Grant>>,
    connections: Mutex<HashMap<String, HashMap<u64, CancellationToken>>>,
    next_connection: std::sync::atomic::AtomicU64,
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl GrantStore {
    pub fn new(clock: Clock) -> GrantStore {
        GrantStore {
            clock,
            grants: Mutex::new(HashMap::new()),
            connections: Mutex::new(HashMap::new()),
            next_connection: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// A new token for `subscriber_id`, valid for [`TOKEN_TTL`].
    pub fn mint(&self, subscriber_id: &str) -> Result<String, GrantError> {
        self.mint_for(subscriber_id, TOKEN_TTL)
    }

    /// A new token for `subscriber_id`, valid for `ttl`.
    pub fn mint_for(&self, subscriber_id: &str, ttl: Duration) -> Result<String, GrantError> {
        let mut secret = [0u8; 32];
        rand::rngs::SysRng
            .try_fill_bytes(&mut secret)
            .map_err(|e| GrantError::Rng(e.to_string()))?;
        let token = URL_SAFE_NO_PAD.encode(secret);
        let now = self.clock.now();
        let grant = Grant {
            hash: hash(&token),
            subscriber_id: subscriber_id.to_owned(),
            expires: now + ttl,
        };
        let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        grants.retain(|_, g| g.expires > now);
        grants.insert(grant.hash, grant);
        Ok(token)
    }

    /// The subscriber a presented token grants, if it is valid now.
    pub fn check(&self, token: Option<&str>) -> Result<String, GrantError> {
        let token = token.ok_or(GrantError::Missing)?;
        let presented = hash(token);
        let grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        // Compared in constant time against each live grant (few: they expire after 60 s), so
        // the time taken says nothing about how close a guess came.
        let grant = grants
            .values()
            .find(|g| bool::from(g.hash.ct_eq(&presented)))
            .ok_or(GrantError::Unknown)?;
        if self.clock.now() >= grant.expires {
            return Err(GrantError::Expired);
        }
        Ok(grant.subscriber_id.clone())
    }

    /// Void every token of a subscriber and close its connections.
    pub fn revoke(&self, subscriber_id: &str) {
        self.grants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, g| g.subscriber_id != subscriber_id);
        let closed = self
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(subscriber_id);
        for token in closed.into_iter().flat_map(HashMap::into_values) {
            token.cancel();
        }
    }

    /// Record a live connection; it ends when `cancel` fires. Returns its id for
    /// [`GrantStore::disconnected`].
    pub fn connected(&self, subscriber_id: &str, cancel: CancellationToken) -> u64 {
        let id = self
            .next_connection
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(subscriber_id.to_owned())
            .or_default()
            .insert(id, cancel);
        id
    }

    pub fn disconnected(&self, subscriber_id: &str, connection: u64) {
        let mut connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = connections.get_mut(subscriber_id) {
            set.remove(&connection);
            if set.is_empty() {
                connections.remove(subscriber_id);
            }
        }
    }

    /// The subscribers with a connection open now.
    pub fn connected_ids(&self) -> Vec<String> {
        self.connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// How many connections a subscriber has open now.
    pub fn connection_count(&self, subscriber_id: &str) -> usize {
        self.connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(subscriber_id)
            .map_or(0, HashMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bound_reusable_and_expire() {
        let clock = Clock::manual();
        let store = GrantStore::new(clock.clone());
        let token = store.mint("sub-a").unwrap();
        assert_eq!(token.len(), 43, "256 bits in base64url");
        assert_eq!(store.check(Some(&token)).unwrap(), "sub-a");
        assert_eq!(store.check(Some(&token)).unwrap(), "sub-a");
        assert_eq!(store.check(None), Err(GrantError::Missing));
        assert_eq!(store.check(Some("nope")), Err(GrantError::Unknown));
        clock.advance(TOKEN_TTL);
        assert_eq!(store.check(Some(&token)), Err(GrantError::Expired));
        let other = store.mint("sub-b").unwrap();
        assert_ne!(other, token);
        // Minting pruned the expired grant.
        assert_eq!(store.check(Some(&token)), Err(GrantError::Unknown));
    }

    #[test]
    fn revoke_voids_tokens_and_cancels_connections() {
        let store = GrantStore::new(Clock::system());
        let token = store.mint("s").unwrap();
        let cancel = CancellationToken::new();
        let id = store.connected("s", cancel.clone());
        assert_eq!(store.connection_count("s"), 1);
        store.revoke("s");
        assert!(cancel.is_cancelled());
        assert_eq!(store.check(Some(&token)), Err(GrantError::Unknown));
        assert_eq!(store.connection_count("s"), 0);
        store.disconnected("s", id);
    }
}
