//! End-to-end sealing between the host and its remote bots (issue 21): what a relay carries is
//! sealed here, so the relay — and whatever stores its frames — sees sizes and timing only.
//!
//! Owns: the static X25519 keys and their ids ([`keys`]), the two Noise handshakes — pairing
//! (`Noise_IKpsk1`, the pairing secret as psk) and every later connection (`Noise_IK`) —
//! with their JSON payloads ([`handshake`]), the sealed channel with explicit nonces and
//! chunking ([`channel`]), the pairing code and its QR ([`code`]), and the registry of pending
//! pairings and paired bots ([`pairs`]).
//!
//! Invariants: a private key never leaves [`keys`] but into a Noise handshake and its 0600 file;
//! a pairing secret is held in memory only (the store keeps its hash); a channel that saw a gap,
//! a frame that does not decrypt, or too large a message is broken for good — its owner closes
//! it and the bot handshakes again. Nothing here knows relay frames, sockets or the request
//! layer: the transport (the relay client) moves the bytes.

pub mod channel;
pub mod code;
pub mod handshake;
pub mod keys;
pub mod pairs;

use std::path::PathBuf;

pub use channel::{Channel, MAX_CHUNK, MAX_REASSEMBLY, SealedFrame};
pub use code::PairingCode;
pub use handshake::{Accepted, BotHandshake, HandshakeKind, Hello, HostHandshake, MAX_NAME_CHARS};
pub use keys::{BotKey, HostKey, KEY_FILE, key_id};

/// Why sealing, opening, a handshake or a key file failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// A key file of the wrong size, a mode wider than 0600, or halves that do not match. It
    /// is never replaced silently: the user moves it aside (pairings made with it are lost).
    #[error("key file {path}: {reason}")]
    BadKeyFile { path: PathBuf, reason: String },
    #[error("key file {path}: {source}")]
    KeyIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The Noise handshake failed: a wrong key or psk, a garbled or replayed message.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// A handshake payload that is not what the contract says (JSON, version, ids, name).
    #[error("handshake payload: {0}")]
    Payload(String),
    /// A pairing handshake without the secret, or a connection handshake with one.
    #[error("a {kind} handshake {what}")]
    Psk {
        kind: &'static str,
        what: &'static str,
    },
    /// A frame arrived ahead of the one expected: one was lost. The channel is broken.
    #[error("sealed frame {got} arrived while {expected} was expected: a frame was lost")]
    Gap { expected: u64, got: u64 },
    /// A frame that does not decrypt (tampered, or of another channel). The channel is broken.
    #[error("a sealed frame does not decrypt")]
    Decrypt,
    /// A chunk whose flag byte is neither 0 nor 1, or that is empty. The channel is broken.
    #[error("a sealed frame is not a chunk (flag {0:?})")]
    BadChunk(Option<u8>),
    /// An inner message over the limit: to seal (nothing was sent), or in reassembly (the
    /// channel is broken).
    #[error("an inner message of {bytes} bytes or more is over the limit of {limit}")]
    TooLarge { bytes: usize, limit: usize },
    /// The channel broke earlier (see the error it gave then); handshake again.
    #[error("the channel is broken; the bot must handshake again")]
    Broken,
    /// Sealing failed in Noise itself (the nonce space exhausted, an RNG failure).
    #[error("sealing failed: {0}")]
    Seal(String),
    /// A pairing code that does not read.
    #[error("pairing code: {0}")]
    BadCode(String),
}
