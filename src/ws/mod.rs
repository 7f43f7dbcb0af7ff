//! The loopback WebSocket transport (design §7): the server on `127.0.0.1` at `/subscribe`,
//! the grant tokens that open it, and the subscriber rows behind them. The same port and
//! origin serve the web UI's embedded files at `/` ([`crate::web`]), so a page loaded from it
//! may open `/subscribe` as its own origin.
//!
//! - [`server`] — accept, route by path (`/subscribe` → upgrade, anything else → one
//!   [`crate::web`] response), check Host / Origin / token in the handshake, then one task per
//!   connection: replay and live events out, acks and requests in.
//! - [`client`] — the client side of the same protocol (`agent-host follow`, tests).
//!
//! What a connection does once it is open is the transport-neutral [`crate::link`]'s; the
//! grants and subscriber rows are [`crate::subscribers`]'.
//!
//! `tokio-tungstenite` is imported only under this module (and later `relay/`).

pub mod client;
pub mod server;

pub use crate::subscribers::PATH;
