//! The two Noise handshakes between a bot (the initiator, which knows the host's static key)
//! and the host (the responder, which learns the bot's from message 1), and their payloads.
//!
//! - **Pair** — `Noise_IKpsk1_25519_ChaChaPoly_BLAKE2s`, psk = the 32-byte pairing secret.
//!   The psk is mixed in at the end of message 1, so the host opens message 1 only if the bot
//!   holds the secret: whoever reads the unsealed `secret_id` on its way (the relay) cannot
//!   pair a key of its own with it. (With `psk2`, the host would learn that only from the
//!   bot's first transport frame.)
//! - **Connect** — `Noise_IK_25519_ChaChaPoly_BLAKE2s`, every later connection of a paired
//!   bot: message 1 proves the bot holds its paired key, message 2 that the host holds its.
//!
//! Message 1's payload is `{"v":1,"name":"<≤64 chars>"}`, message 2's
//! `{"v":1,"host_id","bot_id","scope"}`. Both sides check the ids against the keys they hold.
//! A refusal is not a message of this module: the host sends no message 2 but the transport's
//! `Closed{reason}`. Pure: no I/O.

use serde::{Deserialize, Serialize};

use super::SealError;
use super::channel::Channel;
use super::keys::{BotKey, HostKey, key_id};
use crate::protocol::scope::Scope;

/// The pairing handshake's Noise pattern.
pub const PAIR_PATTERN: &str = "Noise_IKpsk1_25519_ChaChaPoly_BLAKE2s";
/// Every later connection's Noise pattern.
pub const CONNECT_PATTERN: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
/// The most characters a bot's name may have.
pub const MAX_NAME_CHARS: usize = 64;
/// Hashed into both handshakes, so a transcript of another protocol never passes for one.
const PROLOGUE: &[u8] = b"agenthost.seal.v1";
/// The payloads' version.
const VERSION: u32 = 1;
/// Noise's largest message.
const MAX_MESSAGE: usize = 65535;

/// Which handshake a channel opens with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeKind {
    /// The first connection of a new bot, with a pairing secret.
    Pair,
    /// A paired bot's connection.
    Connect,
}

impl HandshakeKind {
    pub fn pattern(self) -> &'static str {
        match self {
            HandshakeKind::Pair => PAIR_PATTERN,
            HandshakeKind::Connect => CONNECT_PATTERN,
        }
    }

    /// The relay frame's `Open.kind`: 0 connect, 1 pair.
    pub fn wire(self) -> u32 {
        match self {
            HandshakeKind::Connect => 0,
            HandshakeKind::Pair => 1,
        }
    }

    pub fn from_wire(kind: u32) -> Option<HandshakeKind> {
        match kind {
            0 => Some(HandshakeKind::Connect),
            1 => Some(HandshakeKind::Pair),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            HandshakeKind::Pair => "pair",
            HandshakeKind::Connect => "connect",
        }
    }

    /// A pairing needs the secret; a connection takes none.
    fn check_psk(self, psk: Option<&[u8; 32]>) -> Result<(), SealError> {
        match (self, psk) {
            (HandshakeKind::Pair, None) => Err(SealError::Psk {
                kind: self.name(),
                what: "needs the pairing secret",
            }),
            (HandshakeKind::Connect, Some(_)) => Err(SealError::Psk {
                kind: self.name(),
                what: "takes no pairing secret",
            }),
            _ => Ok(()),
        }
    }
}

/// What the host learns from message 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub bot_public: [u8; 32],
    /// [`key_id`] of `bot_public`.
    pub bot_id: String,
    /// The name the bot gives itself (at most [`MAX_NAME_CHARS`] characters).
    pub name: String,
}

/// What the host's message 2 says: who it is, who it took the bot for, and what the bot may
/// do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub host_id: String,
    pub bot_id: String,
    pub scope: Scope,
}

#[derive(Serialize, Deserialize)]
struct HelloPayload {
    v: u32,
    name: String,
}

#[derive(Serialize, Deserialize)]
struct AcceptPayload {
    v: u32,
    host_id: String,
    bot_id: String,
    scope: Scope,
}

fn noise(e: snow::Error) -> SealError {
    SealError::Handshake(e.to_string())
}

fn state(
    kind: HandshakeKind,
    private: &[u8; 32],
    remote: Option<&[u8; 32]>,
    psk: Option<&[u8; 32]>,
    initiator: bool,
) -> Result<snow::HandshakeState, SealError> {
    let params = kind.pattern().parse().map_err(noise)?;
    let mut builder = snow::Builder::new(params)
        .prologue(PROLOGUE)
        .map_err(noise)?
        .local_private_key(private)
        .map_err(noise)?;
    if let Some(remote) = remote {
        builder = builder.remote_public_key(remote).map_err(noise)?;
    }
    if let Some(psk) = psk {
        builder = builder.psk(1, psk).map_err(noise)?;
    }
    if initiator {
        builder.build_initiator().map_err(noise)
    } else {
        builder.build_responder().map_err(noise)
    }
}

fn check_name(name: &str) -> Result<(), SealError> {
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(SealError::Payload(format!(
            "a bot name has at most {MAX_NAME_CHARS} characters, this one {chars}"
        )));
    }
    Ok(())
}

fn check_version(v: u32) -> Result<(), SealError> {
    if v == VERSION {
        Ok(())
    } else {
        Err(SealError::Payload(format!(
            "payload version {v}; this build speaks {VERSION}"
        )))
    }
}

/// The bot's half of a handshake, between its message 1 and the host's message 2.
pub struct BotHandshake {
    state: snow::HandshakeState,
    host_id: String,
    bot_id: String,
}

impl BotHandshake {
    /// Message 1 to the host whose static key is `host_public`; `psk` is the pairing secret
    /// for [`HandshakeKind::Pair`] and `None` for [`HandshakeKind::Connect`].
    pub fn start(
        kind: HandshakeKind,
        bot: &BotKey,
        host_public: &[u8; 32],
        psk: Option<&[u8; 32]>,
        name: &str,
    ) -> Result<(BotHandshake, Vec<u8>), SealError> {
        kind.check_psk(psk)?;
        check_name(name)?;
        let mut state = state(kind, bot.private(), Some(host_public), psk, true)?;
        let payload = serde_json::to_vec(&HelloPayload {
            v: VERSION,
            name: name.to_owned(),
        })
        .map_err(|e| SealError::Payload(e.to_string()))?;
        let mut message = vec![0u8; MAX_MESSAGE];
        let n = state.write_message(&payload, &mut message).map_err(noise)?;
        message.truncate(n);
        Ok((
            BotHandshake {
                state,
                host_id: key_id(host_public),
                bot_id: bot.bot_id(),
            },
            message,
        ))
    }

    /// Read the host's message 2: the channel, and what the host granted.
    pub fn finish(mut self, message2: &[u8]) -> Result<(Channel, Accepted), SealError> {
        let mut payload = vec![0u8; MAX_MESSAGE];
        let n = self
            .state
            .read_message(message2, &mut payload)
            .map_err(noise)?;
        let reply: AcceptPayload =
            serde_json::from_slice(&payload[..n]).map_err(|e| SealError::Payload(e.to_string()))?;
        check_version(reply.v)?;
        if reply.host_id != self.host_id || reply.bot_id != self.bot_id {
            return Err(SealError::Payload(format!(
                "the host answered as {} for bot {}; expected {} for {}",
                reply.host_id, reply.bot_id, self.host_id, self.bot_id
            )));
        }
        let transport = self.state.into_stateless_transport_mode().map_err(noise)?;
        Ok((
            Channel::new(transport),
            Accepted {
                host_id: reply.host_id,
                bot_id: reply.bot_id,
                scope: reply.scope,
            },
        ))
    }
}

/// The host's half of a handshake, between reading message 1 and answering it.
pub struct HostHandshake {
    state: snow::HandshakeState,
    host_id: String,
    bot_id: String,
}

impl HostHandshake {
    /// Read a bot's message 1. For [`HandshakeKind::Pair`], `psk` is the secret the `Open`
    /// frame's `secret_id` names; a bot without it fails here.
    pub fn read(
        kind: HandshakeKind,
        host: &HostKey,
        psk: Option<&[u8; 32]>,
        message1: &[u8],
    ) -> Result<(HostHandshake, Hello), SealError> {
        kind.check_psk(psk)?;
        if message1.len() > MAX_MESSAGE {
            return Err(SealError::Handshake(format!(
                "message 1 of {} bytes is over Noise's {MAX_MESSAGE}",
                message1.len()
            )));
        }
        let mut state = state(kind, host.private(), None, psk, false)?;
        let mut payload = vec![0u8; MAX_MESSAGE];
        let n = state.read_message(message1, &mut payload).map_err(noise)?;
        let bot_public = state
            .get_remote_static()
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .ok_or_else(|| SealError::Handshake("message 1 carries no static key".to_owned()))?;
        let hello: HelloPayload =
            serde_json::from_slice(&payload[..n]).map_err(|e| SealError::Payload(e.to_string()))?;
        check_version(hello.v)?;
        check_name(&hello.name)?;
        let bot_id = key_id(&bot_public);
        Ok((
            HostHandshake {
                state,
                host_id: host.host_id(),
                bot_id: bot_id.clone(),
            },
            Hello {
                bot_public,
                bot_id,
                name: hello.name,
            },
        ))
    }

    /// Answer with message 2 and open the channel. `accepted` must name this host and the
    /// bot of message 1.
    pub fn accept(mut self, accepted: &Accepted) -> Result<(Channel, Vec<u8>), SealError> {
        if accepted.host_id != self.host_id || accepted.bot_id != self.bot_id {
            return Err(SealError::Payload(format!(
                "an answer for host {} and bot {}; this handshake is {} with {}",
                accepted.host_id, accepted.bot_id, self.host_id, self.bot_id
            )));
        }
        let payload = serde_json::to_vec(&AcceptPayload {
            v: VERSION,
            host_id: accepted.host_id.clone(),
            bot_id: accepted.bot_id.clone(),
            scope: accepted.scope.clone(),
        })
        .map_err(|e| SealError::Payload(e.to_string()))?;
        let mut message = vec![0u8; MAX_MESSAGE];
        let n = self
            .state
            .write_message(&payload, &mut message)
            .map_err(noise)?;
        message.truncate(n);
        let transport = self.state.into_stateless_transport_mode().map_err(noise)?;
        Ok((Channel::new(transport), message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(host: &HostKey, hello: &Hello) -> Accepted {
        Accepted {
            host_id: host.host_id(),
            bot_id: hello.bot_id.clone(),
            scope: Scope::default(),
        }
    }

    /// Both halves of one handshake: the bot's channel, the host's, and what each learned.
    fn handshake(
        kind: HandshakeKind,
        host: &HostKey,
        bot: &BotKey,
        psk: Option<&[u8; 32]>,
    ) -> Result<(Channel, Channel, Hello, Accepted), SealError> {
        let (bot_side, m1) = BotHandshake::start(kind, bot, &host.public(), psk, "phone")?;
        let (host_side, hello) = HostHandshake::read(kind, host, psk, &m1)?;
        let (host_channel, m2) = host_side.accept(&accepted(host, &hello))?;
        let (bot_channel, granted) = bot_side.finish(&m2)?;
        Ok((bot_channel, host_channel, hello, granted))
    }

    #[test]
    fn a_pairing_then_a_connection_open_channels_both_ways() {
        let host = HostKey::generate().unwrap();
        let bot = BotKey::generate().unwrap();
        let secret = [7u8; 32];
        let (mut b, mut h, hello, granted) =
            handshake(HandshakeKind::Pair, &host, &bot, Some(&secret)).unwrap();
        assert_eq!(hello.bot_public, bot.public());
        assert_eq!(hello.bot_id, bot.bot_id());
        assert_eq!(hello.name, "phone");
        assert_eq!(granted.host_id, host.host_id());
        assert_eq!(granted.scope, Scope::default());
        let frames = b.seal(b"from the bot").unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(h.open(&frames[0]).unwrap().unwrap(), b"from the bot");
        // The connection after it: no secret, the same keys.
        let (mut b, mut h, hello, _) =
            handshake(HandshakeKind::Connect, &host, &bot, None).unwrap();
        assert_eq!(hello.bot_public, bot.public());
        let frames = h.seal(b"from the host").unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].nonce, 0);
        assert_eq!(b.open(&frames[0]).unwrap().unwrap(), b"from the host");
        let frames = b.seal(b"again").unwrap();
        assert_eq!(h.open(&frames[0]).unwrap().unwrap(), b"again");
    }

    #[test]
    fn a_wrong_secret_is_refused_by_the_host_at_message_1() {
        let host = HostKey::generate().unwrap();
        let bot = BotKey::generate().unwrap();
        let (_, m1) = BotHandshake::start(
            HandshakeKind::Pair,
            &bot,
            &host.public(),
            Some(&[1; 32]),
            "x",
        )
        .unwrap();
        let refused = HostHandshake::read(HandshakeKind::Pair, &host, Some(&[2; 32]), &m1);
        assert!(matches!(refused, Err(SealError::Handshake(_))));
        // A pairing message is not a connection's, nor the other way round.
        assert!(HostHandshake::read(HandshakeKind::Connect, &host, None, &m1).is_err());
        let (_, connect) =
            BotHandshake::start(HandshakeKind::Connect, &bot, &host.public(), None, "x").unwrap();
        assert!(HostHandshake::read(HandshakeKind::Pair, &host, Some(&[1; 32]), &connect).is_err());
        // The secret goes with a pairing only.
        assert!(matches!(
            BotHandshake::start(HandshakeKind::Pair, &bot, &host.public(), None, "x"),
            Err(SealError::Psk { .. })
        ));
        assert!(matches!(
            HostHandshake::read(HandshakeKind::Connect, &host, Some(&[1; 32]), &connect),
            Err(SealError::Psk { .. })
        ));
    }

    #[test]
    fn a_bot_refuses_a_host_of_another_key() {
        let host = HostKey::generate().unwrap();
        let impostor = HostKey::generate().unwrap();
        let bot = BotKey::generate().unwrap();
        // Message 1 sealed to `host` does not open for anyone else.
        let (_, m1) =
            BotHandshake::start(HandshakeKind::Connect, &bot, &host.public(), None, "b").unwrap();
        assert!(HostHandshake::read(HandshakeKind::Connect, &impostor, None, &m1).is_err());
        // An answer for another bot is refused by the host before it is sent.
        let (_, hello) = HostHandshake::read(HandshakeKind::Connect, &host, None, &m1).unwrap();
        let (host_side, _) = HostHandshake::read(HandshakeKind::Connect, &host, None, &m1).unwrap();
        let wrong = Accepted {
            bot_id: "0".repeat(24),
            ..accepted(&host, &hello)
        };
        assert!(matches!(
            host_side.accept(&wrong),
            Err(SealError::Payload(_))
        ));
    }

    #[test]
    fn names_are_bounded() {
        let host = HostKey::generate().unwrap();
        let bot = BotKey::generate().unwrap();
        let long = "é".repeat(MAX_NAME_CHARS + 1);
        assert!(matches!(
            BotHandshake::start(HandshakeKind::Connect, &bot, &host.public(), None, &long),
            Err(SealError::Payload(_))
        ));
        let most = "é".repeat(MAX_NAME_CHARS);
        let (_, m1) =
            BotHandshake::start(HandshakeKind::Connect, &bot, &host.public(), None, &most).unwrap();
        let (_, hello) = HostHandshake::read(HandshakeKind::Connect, &host, None, &m1).unwrap();
        assert_eq!(hello.name, most);
    }

    #[test]
    fn kinds_round_trip_on_the_wire_and_handshakes_are_send() {
        for kind in [HandshakeKind::Pair, HandshakeKind::Connect] {
            assert_eq!(HandshakeKind::from_wire(kind.wire()), Some(kind));
        }
        assert_eq!(HandshakeKind::from_wire(2), None);
        fn send<T: Send>() {}
        send::<BotHandshake>();
        send::<HostHandshake>();
        send::<Channel>();
    }
}
