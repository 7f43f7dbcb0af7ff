//! The relay fleet's frames (`proto/relay.proto`, package `agenthost.relay.v1`): the generated
//! prost types in [`pb`], the identifier rules both ends and the relay apply, the stable
//! `Error` codes, and encode/decode of one WebSocket message. Pure: bytes in, bytes out.
//!
//! Used by the relay service ([`crate::relayd`]), the host's fleet client and bots. The relay
//! routes on a frame's kind and `channel` only; `message` and `ciphertext` are the endpoints'
//! Noise messages and nothing here looks into them.

use bytes::Bytes;
use prost::Message;

/// Generated from `proto/relay.proto` by `build.rs`.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    reason = "generated code is not ours to lint"
)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/agenthost.relay.v1.rs"));
}

pub use pb::relay_frame::Body;
pub use pb::{
    Accept, BotHello, Closed, Error, HostHello, Open, Ping, Pong, RelayFrame, Sealed, Welcome,
};

/// The largest WebSocket message the relay takes or gives: a Noise message is at most 65535
/// bytes, plus the frame's own fields with room to spare.
pub const MAX_RELAY_FRAME_BYTES: usize = 96 * 1024;
/// The most channels one bot connection may hold (listed in `BotHello` or opened later).
pub const MAX_CHANNELS_PER_BOT: usize = 64;
/// `Open.kind` of a connection handshake (`Noise_IK`).
pub const OPEN_KIND_CONNECT: u32 = 0;
/// `Open.kind` of a pairing handshake (`Noise_IKpsk1_25519_ChaChaPoly_BLAKE2s`, the psk the
/// 32-byte pairing secret; `Open.secret_id` says which secret).
pub const OPEN_KIND_PAIR: u32 = 1;
/// Characters in a host id: the lowercase hex of 12 bytes.
pub const HOST_ID_LEN: usize = 24;
/// Characters in a channel id: the lowercase hex of 16 random bytes.
pub const CHANNEL_LEN: usize = 32;

/// The stable codes of `Error` frames. The relay closes the connection after sending one.
pub mod codes {
    /// The first frame was not the hello this path expects (`HostHello` on `/host`,
    /// `BotHello` on `/bot`), had a malformed id, or did not come in time.
    pub const BAD_HELLO: &str = "bad_hello";
    /// A frame that does not decode, of a kind this side may not send, or with a malformed
    /// channel id.
    pub const BAD_FRAME: &str = "bad_frame";
    /// A message larger than [`super::MAX_RELAY_FRAME_BYTES`].
    pub const TOO_LARGE: &str = "too_large";
    /// A bot connection asked for more than [`super::MAX_CHANNELS_PER_BOT`] channels.
    pub const TOO_MANY_CHANNELS: &str = "too_many_channels";
    /// A newer connection took this host id (or this bot channel) over, here or on another
    /// instance.
    pub const SUPERSEDED: &str = "superseded";
    /// The relay lost its broker (NATS): nothing can be routed; reconnect, maybe elsewhere.
    pub const BROKER_UNAVAILABLE: &str = "broker_unavailable";
    /// The instance is stopping; reconnect (any instance will do).
    pub const SHUTTING_DOWN: &str = "shutting_down";
}

/// Whether `id` is a host id: exactly [`HOST_ID_LEN`] lowercase hex characters.
pub fn is_host_id(id: &str) -> bool {
    is_lower_hex(id, HOST_ID_LEN)
}

/// Whether `id` is a channel id: exactly [`CHANNEL_LEN`] lowercase hex characters.
pub fn is_channel(id: &str) -> bool {
    is_lower_hex(id, CHANNEL_LEN)
}

fn is_lower_hex(id: &str, len: usize) -> bool {
    id.len() == len && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// One frame as a WebSocket binary message.
pub fn encode(body: Body) -> Bytes {
    Bytes::from(RelayFrame { body: Some(body) }.encode_to_vec())
}

/// Why a message is not a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("not a relay frame: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("a relay frame without a body")]
    Empty,
}

/// The body of one WebSocket binary message.
pub fn decode(bytes: &[u8]) -> Result<Body, FrameError> {
    RelayFrame::decode(bytes)?.body.ok_or(FrameError::Empty)
}

/// The name of a frame's kind, for logs (never its content).
pub fn kind(body: &Body) -> &'static str {
    match body {
        Body::HostHello(_) => "host_hello",
        Body::BotHello(_) => "bot_hello",
        Body::Welcome(_) => "welcome",
        Body::Open(_) => "open",
        Body::Accept(_) => "accept",
        Body::Sealed(_) => "sealed",
        Body::Closed(_) => "closed",
        Body::Ping(_) => "ping",
        Body::Pong(_) => "pong",
        Body::Error(_) => "error",
    }
}

/// The channel a frame belongs to, for the kinds that have one.
pub fn channel(body: &Body) -> Option<&str> {
    match body {
        Body::Open(f) => Some(&f.channel),
        Body::Accept(f) => Some(&f.channel),
        Body::Sealed(f) => Some(&f.channel),
        Body::Closed(f) => Some(&f.channel),
        Body::HostHello(_)
        | Body::BotHello(_)
        | Body::Welcome(_)
        | Body::Ping(_)
        | Body::Pong(_)
        | Body::Error(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_lowercase_hex_of_their_length() {
        assert!(is_host_id("0123456789abcdef01234567"));
        assert!(!is_host_id("0123456789ABCDEF01234567"));
        assert!(!is_host_id("0123456789abcdef0123456"));
        assert!(!is_host_id("0123456789abcdef0123456>"));
        assert!(is_channel("0123456789abcdef0123456789abcdef"));
        assert!(!is_channel("0123456789abcdef0123456789abcde."));
        assert!(!is_channel(""));
    }

    #[test]
    fn frames_round_trip_and_empty_is_refused() {
        let sealed = Body::Sealed(Sealed {
            channel: "c".repeat(CHANNEL_LEN),
            nonce: 7,
            ciphertext: vec![1, 2, 3],
        });
        let bytes = encode(sealed.clone());
        assert_eq!(decode(&bytes).unwrap(), sealed);
        assert_eq!(channel(&sealed), Some("c".repeat(CHANNEL_LEN).as_str()));
        assert!(matches!(decode(&[]), Err(FrameError::Empty)));
        assert!(matches!(decode(&[0xff, 0xff]), Err(FrameError::Decode(_))));
    }
}
