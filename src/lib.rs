//! agent-host: a single-instance daemon that runs coding-agent CLIs and lets many clients drive
//! and follow the same session, with every event durable in SQLite, ordered per session, and
//! resumable from a cursor.
//!
//! Code map, bottom layer first (dependencies point up this list, never down):
//! - [`protocol`] — pure contracts: the command envelope and its error codes, canonical events.
//! - [`store`] — SQLite on its own threads; group commit; the only user of `rusqlite`.
//! - [`bus`] — persist-then-publish pipeline, subscriber queues, replay and catch-up.
//! - [`session`] — sessions (and, with the adapters, one actor per live session).
//! - [`adapter`] — the agent contract, the one spawn policy, binary probing.
//! - [`request`] — the one request layer: typed command + caller → reply for every transport;
//!   the scope rule; module errors → wire codes.
//! - [`subscribers`] — subscriber rows, grant tokens and the registry of connections;
//!   [`link`] — one wire connection (Hello, replay, events, acks, requests), whichever side
//!   dialed.
//! - [`ipc`] — the Unix-socket transport; [`ws`] — the loopback WebSocket transport, which
//!   also serves [`web`] (the embedded web UI and its headers) on the same port, and the same
//!   protocol on a Unix socket; [`peer`] — which user a Unix-socket peer runs as;
//!   [`relay`] — the outbound relay connection; [`seal`] — the Noise keys, handshakes and
//!   sealed channels between the host and its remote bots, and their pairing.
//! - [`relayd`] — the relay service itself (`agent-host-relay`): instances joined by NATS
//!   JetStream that carry sealed frames between hosts and bots; its own binary.
//! - [`watch`] — file watching (`notify`), handed to the session layer through its `Launcher`.
//! - [`instance`], [`config`] — the lock file and where things live; [`limits`] — the
//!   open-file limit, raised at start; [`redact`] — secrets by
//!   shape out of text agents write (their stderr).
//! - [`daemon`] — wiring and ordered shutdown; [`run`] is its entry point.
//! - [`export`] — `session.export`: a session's transcript as Markdown or JSON Lines, in
//!   pages (the search it pairs with is the store's, `store::search`).
//! - [`client`] — the CLI's routing: local, IPC or hybrid; [`follow`] — the terminal follower;
//!   [`open`] — `agent-host open`, the web UI's link; [`human`] — replies as tables for a
//!   person at a terminal.
//! - [`service`] — `agent-host service install|uninstall|status`: the host as a systemd user
//!   unit or a launchd agent; [`doctor`] — `agent-host doctor`, the checks of a home, its host,
//!   store, agents, credentials, relay and disk.
//!
//! `docs/architecture.md` has the picture.

pub mod adapter;
pub mod bus;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod export;
pub mod follow;
/// For the fuzz targets in `fuzz/` and the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod hooks;
pub mod human;
pub mod instance;
pub mod ipc;
pub mod limits;
pub mod link;
pub mod logging;
pub mod open;
pub mod peer;
pub mod protocol;
pub mod redact;
pub mod relay;
pub mod relayd;
pub mod reload;
pub mod request;
pub mod seal;
pub mod service;
pub mod session;
pub mod store;
pub mod subscribers;
pub mod watch;
pub mod web;
pub mod ws;

pub use daemon::{Ready, run};

/// This build's version, as reported by `version`, `host.status` and the lock file.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
