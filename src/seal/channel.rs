//! One sealed channel after a handshake: Noise's stateless transport with **explicit
//! nonces**, so a frame says which it is and the receiver decides what to do with it.
//!
//! Each direction counts its own nonces from 0, one per sealed frame. The receiver's rule:
//! the nonce it expects opens and moves the expectation on; a lower one is a duplicate (a
//! relay redelivering after an instance died) and is dropped without a word; a higher one is
//! a gap — a frame was lost — and breaks the channel ([`SealError::Gap`]). A frame that does
//! not decrypt breaks it too ([`SealError::Decrypt`]). A broken channel refuses everything
//! after ([`SealError::Broken`]): its owner closes it and the bot handshakes again.
//!
//! An inner message (one wire frame, at most [`MAX_FRAME_BYTES`]) is cut into chunks: each
//! sealed frame's plaintext is one flag byte (0 the last chunk, 1 more follow) and at most
//! [`MAX_CHUNK`] bytes, so every Noise message stays under 65535 bytes. Reassembly holds at
//! most [`MAX_REASSEMBLY`] bytes; more breaks the channel ([`SealError::TooLarge`]).

use crate::protocol::wire::MAX_FRAME_BYTES;

use super::SealError;

/// The most bytes of an inner message one sealed frame carries.
pub const MAX_CHUNK: usize = 65000;
/// The most bytes a channel reassembles into one inner message.
pub const MAX_REASSEMBLY: usize = MAX_FRAME_BYTES + 64 * 1024;
/// Noise's authentication tag.
const TAG: usize = 16;
/// Noise's largest message.
const MAX_MESSAGE: usize = 65535;
const LAST: u8 = 0;
const MORE: u8 = 1;

/// One sealed transport frame, as the relay's `Sealed` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedFrame {
    pub nonce: u64,
    pub ciphertext: Vec<u8>,
}

/// Both directions of one channel, for one side.
pub struct Channel {
    transport: snow::StatelessTransportState,
    /// The nonce of the next frame this side seals.
    next_send: u64,
    /// The nonce of the next frame this side opens.
    expected: u64,
    /// The chunks of the inner message being received.
    partial: Vec<u8>,
    broken: bool,
}

impl Channel {
    pub(super) fn new(transport: snow::StatelessTransportState) -> Channel {
        Channel {
            transport,
            next_send: 0,
            expected: 0,
            partial: Vec::new(),
            broken: false,
        }
    }

    /// Whether an error broke this channel (it then refuses everything).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// The static public key of the other side.
    pub fn remote_static(&self) -> Option<[u8; 32]> {
        self.transport
            .get_remote_static()
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
    }

    /// Seal one inner message into its frames, in the order they must be sent. A message over
    /// [`MAX_FRAME_BYTES`] is refused and nothing is sealed (the channel stays usable).
    pub fn seal(&mut self, inner: &[u8]) -> Result<Vec<SealedFrame>, SealError> {
        if self.broken {
            return Err(SealError::Broken);
        }
        if inner.len() > MAX_FRAME_BYTES {
            return Err(SealError::TooLarge {
                bytes: inner.len(),
                limit: MAX_FRAME_BYTES,
            });
        }
        let count = inner.len().div_ceil(MAX_CHUNK).max(1);
        let mut frames = Vec::with_capacity(count);
        let mut plaintext = Vec::with_capacity(MAX_CHUNK + 1);
        for (i, chunk) in inner
            .chunks(MAX_CHUNK)
            .chain(inner.is_empty().then_some(&[][..]))
            .enumerate()
        {
            plaintext.clear();
            plaintext.push(if i + 1 == count { LAST } else { MORE });
            plaintext.extend_from_slice(chunk);
            let mut ciphertext = vec![0u8; plaintext.len() + TAG];
            let n = self
                .transport
                .write_message(self.next_send, &plaintext, &mut ciphertext)
                .map_err(|e| {
                    // A nonce cannot be used twice: whatever went wrong, stop here.
                    self.broken = true;
                    SealError::Seal(e.to_string())
                })?;
            ciphertext.truncate(n);
            frames.push(SealedFrame {
                nonce: self.next_send,
                ciphertext,
            });
            self.next_send += 1;
        }
        Ok(frames)
    }

    /// Open one frame: `Some` when it completes an inner message, `None` when it is a chunk of
    /// one still incomplete or a duplicate (dropped).
    pub fn open(&mut self, frame: &SealedFrame) -> Result<Option<Vec<u8>>, SealError> {
        if self.broken {
            return Err(SealError::Broken);
        }
        if frame.nonce < self.expected {
            return Ok(None);
        }
        if frame.nonce > self.expected {
            return Err(self.fail(SealError::Gap {
                expected: self.expected,
                got: frame.nonce,
            }));
        }
        if frame.ciphertext.len() > MAX_MESSAGE || frame.ciphertext.len() <= TAG {
            return Err(self.fail(SealError::Decrypt));
        }
        let mut plaintext = vec![0u8; frame.ciphertext.len()];
        let n = match self
            .transport
            .read_message(frame.nonce, &frame.ciphertext, &mut plaintext)
        {
            Ok(n) => n,
            Err(_) => return Err(self.fail(SealError::Decrypt)),
        };
        self.expected += 1;
        let (flag, chunk) = match plaintext[..n].split_first() {
            Some((&flag, chunk)) if flag == LAST || flag == MORE => (flag, chunk),
            other => return Err(self.fail(SealError::BadChunk(other.map(|(f, _)| *f)))),
        };
        if self.partial.len() + chunk.len() > MAX_REASSEMBLY {
            let bytes = self.partial.len() + chunk.len();
            self.partial = Vec::new();
            return Err(self.fail(SealError::TooLarge {
                bytes,
                limit: MAX_REASSEMBLY,
            }));
        }
        self.partial.extend_from_slice(chunk);
        Ok((flag == LAST).then(|| std::mem::take(&mut self.partial)))
    }

    fn fail(&mut self, e: SealError) -> SealError {
        self.broken = true;
        self.partial = Vec::new();
        e
    }
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("next_send", &self.next_send)
            .field("expected", &self.expected)
            .field("partial", &self.partial.len())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scope::Scope;
    use crate::seal::{Accepted, BotHandshake, BotKey, HandshakeKind, HostHandshake, HostKey};

    /// A connected pair: the bot's channel, then the host's.
    fn pair() -> (Channel, Channel) {
        let host = HostKey::generate().unwrap();
        let bot = BotKey::generate().unwrap();
        let (bot_side, m1) =
            BotHandshake::start(HandshakeKind::Connect, &bot, &host.public(), None, "t").unwrap();
        let (host_side, hello) =
            HostHandshake::read(HandshakeKind::Connect, &host, None, &m1).unwrap();
        let (h, m2) = host_side
            .accept(&Accepted {
                host_id: host.host_id(),
                bot_id: hello.bot_id,
                scope: Scope::default(),
            })
            .unwrap();
        let (b, _) = bot_side.finish(&m2).unwrap();
        (b, h)
    }

    #[test]
    fn a_one_mib_message_travels_in_chunks() {
        let (mut b, mut h) = pair();
        let inner: Vec<u8> = (0..MAX_FRAME_BYTES).map(|i| (i % 251) as u8).collect();
        let frames = h.seal(&inner).unwrap();
        assert_eq!(frames.len(), MAX_FRAME_BYTES.div_ceil(MAX_CHUNK));
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(f.nonce, i as u64);
            assert!(f.ciphertext.len() <= MAX_CHUNK + 1 + TAG);
        }
        let (last, rest) = frames.split_last().unwrap();
        for f in rest {
            assert_eq!(b.open(f).unwrap(), None);
        }
        assert_eq!(b.open(last).unwrap().unwrap(), inner);
        // An empty message is one frame, and the nonces go on.
        let empty = h.seal(b"").unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].nonce, frames.len() as u64);
        assert_eq!(b.open(&empty[0]).unwrap().unwrap(), b"");
        // Too large to seal: refused, and the channel goes on.
        let over = vec![0u8; MAX_FRAME_BYTES + 1];
        assert!(matches!(h.seal(&over), Err(SealError::TooLarge { .. })));
        assert!(!h.is_broken());
        let next = h.seal(b"x").unwrap();
        assert_eq!(b.open(&next[0]).unwrap().unwrap(), b"x");
    }

    #[test]
    fn duplicates_are_dropped_and_a_gap_breaks_the_channel() {
        let (mut b, mut h) = pair();
        let one = b.seal(b"one").unwrap().remove(0);
        let two = b.seal(b"two").unwrap().remove(0);
        let three = b.seal(b"three").unwrap().remove(0);
        assert_eq!(h.open(&one).unwrap().unwrap(), b"one");
        // Redelivered: dropped, again and again.
        assert_eq!(h.open(&one).unwrap(), None);
        assert_eq!(h.open(&two).unwrap().unwrap(), b"two");
        assert_eq!(h.open(&one).unwrap(), None);
        assert_eq!(h.open(&two).unwrap(), None);
        assert_eq!(h.open(&three).unwrap().unwrap(), b"three");
        // Frame 4 lost: frame 5 is a gap.
        let _lost = b.seal(b"four").unwrap();
        let five = b.seal(b"five").unwrap().remove(0);
        assert!(matches!(
            h.open(&five),
            Err(SealError::Gap {
                expected: 3,
                got: 4
            })
        ));
        assert!(h.is_broken());
        assert!(matches!(h.open(&five), Err(SealError::Broken)));
        assert!(matches!(h.seal(b"x"), Err(SealError::Broken)));
    }

    #[test]
    fn a_tampered_frame_is_refused_and_breaks_the_channel() {
        let (mut b, mut h) = pair();
        let mut frame = b.seal(b"pay 10").unwrap().remove(0);
        let genuine = frame.clone();
        frame.ciphertext[3] ^= 0x01;
        assert!(matches!(h.open(&frame), Err(SealError::Decrypt)));
        assert!(h.is_broken());
        assert!(matches!(h.open(&genuine), Err(SealError::Broken)));
        // Sealed for the other direction, or for another channel: refused as well.
        let (mut b2, mut h2) = pair();
        let mine = h2.seal(b"to the bot").unwrap().remove(0);
        let (_, mut h3) = pair();
        assert!(matches!(h3.open(&mine), Err(SealError::Decrypt)));
        assert_eq!(b2.open(&mine).unwrap().unwrap(), b"to the bot");
    }

    #[test]
    fn reassembly_is_bounded() {
        let (mut b, mut h) = pair();
        // A peer that never says "last": more than the bound breaks the channel.
        let mut received = 0;
        let chunk = vec![9u8; MAX_CHUNK];
        loop {
            let mut plaintext = vec![MORE];
            plaintext.extend_from_slice(&chunk);
            let mut ciphertext = vec![0u8; plaintext.len() + TAG];
            let n = b
                .transport
                .write_message(b.next_send, &plaintext, &mut ciphertext)
                .unwrap();
            ciphertext.truncate(n);
            let frame = SealedFrame {
                nonce: b.next_send,
                ciphertext,
            };
            b.next_send += 1;
            match h.open(&frame) {
                Ok(None) => received += MAX_CHUNK,
                Err(SealError::TooLarge { limit, .. }) => {
                    assert_eq!(limit, MAX_REASSEMBLY);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(received <= MAX_REASSEMBLY && received + MAX_CHUNK > MAX_REASSEMBLY);
        assert!(h.is_broken());
    }
}
