//! The relay service's errors: [`RelayError`] ends one endpoint connection and maps, in
//! [`RelayError::code`], to the stable code of the `Error` frame sent before the close
//! ([`crate::protocol::relay_wire::codes`]); [`BrokerError`] is a failed NATS operation;
//! [`RunError`] stops the service at start.
//!
//! Messages name kinds, ids and sizes only, never a frame's content: they go into `Error`
//! frames and the log.

use crate::protocol::relay_wire::{MAX_CHANNELS_PER_BOT, MAX_RELAY_FRAME_BYTES, codes};

/// A NATS operation that failed: what was being done, and the client's error.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct BrokerError {
    pub what: &'static str,
    #[source]
    pub source: async_nats::Error,
}

impl BrokerError {
    pub fn new(what: &'static str, source: impl Into<async_nats::Error>) -> BrokerError {
        BrokerError {
            what,
            source: source.into(),
        }
    }
}

/// Why the relay ends an endpoint's connection.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    BadHello(&'static str),
    #[error("{0}")]
    BadFrame(String),
    #[error("a message of {0} bytes; the limit is {MAX_RELAY_FRAME_BYTES}")]
    TooLarge(usize),
    #[error("more than {MAX_CHANNELS_PER_BOT} channels on one bot connection")]
    TooManyChannels,
    #[error("a newer connection took {0} over")]
    Superseded(String),
    #[error("broker: {0}")]
    Broker(#[from] BrokerError),
    #[error("the relay instance is stopping")]
    ShuttingDown,
}

impl RelayError {
    /// The stable code of the `Error` frame that says so.
    pub fn code(&self) -> &'static str {
        match self {
            RelayError::BadHello(_) => codes::BAD_HELLO,
            RelayError::BadFrame(_) => codes::BAD_FRAME,
            RelayError::TooLarge(_) => codes::TOO_LARGE,
            RelayError::TooManyChannels => codes::TOO_MANY_CHANNELS,
            RelayError::Superseded(_) => codes::SUPERSEDED,
            RelayError::Broker(_) => codes::BROKER_UNAVAILABLE,
            RelayError::ShuttingDown => codes::SHUTTING_DOWN,
        }
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Broker(#[from] BrokerError),
}
