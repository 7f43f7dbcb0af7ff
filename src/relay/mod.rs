//! The relay client (design §7): the host dials **out** to a remote relay the user runs, so a
//! remote bot reaches the laptop through NAT and firewalls. Over that connection the host
//! serves the same protocol as the loopback server ([`crate::ws::link`]): the relay sends
//! `Hello` with its cursor, gets replay and live events, and sends requests — every one of
//! them checked against the scope the relay token was granted in `config.toml`.
//!
//! - [`client`]: the dial loop — TLS (`ws://` only to loopback), the token, pings and a
//!   dead-peer timeout, capped exponential backoff with jitter, and the status it reports.
//! - [`bot`]: the other end of the sealed relay fleet, a remote bot's client (pairing, the
//!   Noise channel, requests and events, reconnects), shared by tests and `examples/bot.rs`.
//! - [`fleet`] (with [`channel`]): the host's client of the sealed relay fleet
//!   (`agent-host-relay`, `[fleet]`): one connection to an instance, its loop-back health
//!   probe, and a channel per paired bot, sealed end to end and served by the same link.
//!   The `[relay]` client above stays as it is: one relay, unsealed (legacy).
//! - [`RelayHandle`]: what the rest of the host holds: the live status (`host.status`) and the
//!   configuration it can change (`host.relay.set`).
//!
//! The relay is one subscriber, [`SUBSCRIBER_ID`], a row like any other: its cursor and
//! replay mode survive restarts, and `subscriber.list` shows it.

pub mod bot;
pub mod channel;
pub mod client;
pub mod fleet;

use serde::Serialize;
use tokio::sync::watch;

use crate::config::RelayConfig;

/// The relay's subscriber row.
pub const SUBSCRIBER_ID: &str = "relay";

/// Where the relay connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RelayState {
    /// No relay configured.
    Disabled,
    /// Dialing (TCP, TLS, upgrade).
    Connecting,
    /// Connected and serving.
    Connected,
    /// Waiting out the backoff after a failure.
    Waiting,
    /// The configuration cannot work (a bad URL, plain `ws://` to a remote host, a token that
    /// is not a header value): not dialed, not retried until it changes; `last_error` says why.
    Misconfigured,
}

/// What `host.status` shows of the relay. The token never appears here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RelayStatus {
    pub state: RelayState,
    pub url: Option<String>,
    /// When the current state began (ms since the epoch).
    pub since_ms: i64,
    /// Failed attempts since the last stable connection.
    pub retries: u32,
    /// Why the last connection failed or ended.
    pub last_error: Option<String>,
    /// How long the current backoff wait is.
    pub retry_in_ms: Option<u64>,
    pub subscriber_id: &'static str,
}

impl RelayStatus {
    fn disabled() -> RelayStatus {
        RelayStatus {
            state: RelayState::Disabled,
            url: None,
            since_ms: crate::store::now_ms(),
            retries: 0,
            last_error: None,
            retry_in_ms: None,
            subscriber_id: SUBSCRIBER_ID,
        }
    }
}

/// The host's handle on its relay client.
#[derive(Clone)]
pub struct RelayHandle {
    config: watch::Sender<Option<RelayConfig>>,
    status: watch::Receiver<RelayStatus>,
}

impl RelayHandle {
    /// The status now.
    pub fn status(&self) -> RelayStatus {
        self.status.borrow().clone()
    }

    /// A receiver of every status change (tests wait on it instead of polling).
    pub fn watch_status(&self) -> watch::Receiver<RelayStatus> {
        self.status.clone()
    }

    /// Use this relay from now on (`None`: none). The current connection, if any, is closed
    /// and the new one dialed at once — except when the configuration is the one already
    /// connected: a live connection is then left alone (a bot's request in flight on it is
    /// answered), while the same configuration given to a client in any other state (waiting
    /// out its backoff, dialing, misconfigured) dials again at once. `true` when the client was
    /// re-pointed.
    pub fn set(&self, config: Option<RelayConfig>) -> bool {
        let connected = self.status.borrow().state == RelayState::Connected;
        self.config.send_if_modified(|current| {
            if connected && *current == config {
                return false;
            }
            *current = config;
            true
        })
    }
}

impl crate::request::RelayControl for RelayHandle {
    fn status(&self) -> serde_json::Value {
        serde_json::to_value(RelayHandle::status(self)).unwrap_or(serde_json::Value::Null)
    }

    fn set(&self, config: Option<RelayConfig>) {
        let _repointed = RelayHandle::set(self, config);
    }

    fn check(&self, config: &RelayConfig) -> Result<(), String> {
        client::check(config).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RelayTiming;

    fn config(url: &str) -> RelayConfig {
        RelayConfig {
            url: url.to_owned(),
            token: "t".to_owned(),
            scope: crate::config::Scope::default(),
            timing: RelayTiming::default(),
        }
    }

    fn handle(
        state: RelayState,
        current: Option<RelayConfig>,
    ) -> (RelayHandle, watch::Receiver<Option<RelayConfig>>) {
        let (config_tx, mut config_rx) = watch::channel(current);
        config_rx.mark_unchanged();
        let mut status = RelayStatus::disabled();
        status.state = state;
        let (_status_tx, status_rx) = watch::channel(status);
        (
            RelayHandle {
                config: config_tx,
                status: status_rx,
            },
            config_rx,
        )
    }

    #[test]
    fn the_connected_configuration_set_again_keeps_the_connection() {
        let (relay, rx) = handle(RelayState::Connected, Some(config("ws://127.0.0.1:1/host")));
        assert!(!relay.set(Some(config("ws://127.0.0.1:1/host"))));
        assert!(!rx.has_changed().unwrap(), "the client would redial");
        // Anything else re-points it.
        assert!(relay.set(Some(config("ws://127.0.0.1:2/host"))));
        assert!(rx.has_changed().unwrap());
    }

    #[test]
    fn the_same_configuration_redials_a_client_that_is_not_connected() {
        for state in [
            RelayState::Waiting,
            RelayState::Connecting,
            RelayState::Misconfigured,
        ] {
            let (relay, rx) = handle(state, Some(config("ws://127.0.0.1:1/host")));
            assert!(
                relay.set(Some(config("ws://127.0.0.1:1/host"))),
                "{state:?}"
            );
            assert!(rx.has_changed().unwrap(), "{state:?}");
        }
    }
}
