//! The protobuf wire (design §7): generated prost types of `proto/agent_host.proto` in [`pb`],
//! and the conversions every transport shares — encode a frame, decode and classify one,
//! build the error frame for a refused one. Pure: bytes in, bytes out.
//!
//! The loopback server and the relay client both use this module unchanged.

use bytes::Bytes;
use prost::Message;

use super::envelope::ErrorCode;

/// Generated from `proto/agent_host.proto` by `build.rs`.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    reason = "generated code is not ours to lint"
)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/agent_host.v1.rs"));
}

pub use pb::CmdId;

/// The wire protocol version carried in `Hello`.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest WebSocket message the server accepts from a client.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// The largest WebSocket message a client should accept from the server: one event is at most
/// 4 MiB of JSON and a history page at most 8 MiB of events, plus framing.
pub const MAX_PUSH_BYTES: usize = 16 * 1024 * 1024;
/// The subprotocol the server selects; browsers offer it next to `bearer.<token>`.
pub const SUBPROTOCOL: &str = "agent-host.v1";
/// The prefix of the `Sec-WebSocket-Protocol` entry that carries a grant token.
pub const TOKEN_SUBPROTOCOL_PREFIX: &str = "bearer.";

/// Why a received message was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("not a Frame: {0}")]
    NotAFrame(String),
    #[error("unknown cmd {0}")]
    UnknownCmd(i32),
    #[error("body of {cmd:?} does not decode: {reason}")]
    BadBody { cmd: CmdId, reason: String },
}

impl WireError {
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::NotAFrame(_) | WireError::BadBody { .. } => ErrorCode::InvalidFrame,
            WireError::UnknownCmd(_) => ErrorCode::UnknownCmd,
        }
    }
}

/// Encode one frame around a message.
pub fn encode<M: Message>(cmd: CmdId, request_id: u64, body: &M) -> Bytes {
    let frame = pb::Frame {
        cmd: cmd as i32,
        request_id,
        body: body.encode_to_vec(),
    };
    Bytes::from(frame.encode_to_vec())
}

/// A received frame whose `cmd` is known; the body is decoded with [`Decoded::body`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub cmd: CmdId,
    pub request_id: u64,
    body: Vec<u8>,
}

impl Decoded {
    /// The same frame under another request id (a relay passing requests and answers on).
    pub fn with_request_id(&self, request_id: u64) -> Bytes {
        let frame = pb::Frame {
            cmd: self.cmd as i32,
            request_id,
            body: self.body.clone(),
        };
        Bytes::from(frame.encode_to_vec())
    }

    pub fn body<M: Message + Default>(&self) -> Result<M, WireError> {
        M::decode(self.body.as_slice()).map_err(|e| WireError::BadBody {
            cmd: self.cmd,
            reason: e.to_string(),
        })
    }
}

/// Decode one WebSocket binary message. Returns the request id alongside a failure so that an
/// error answer can still be paired with the request.
pub fn decode(bytes: &[u8]) -> Result<Decoded, (u64, WireError)> {
    let frame = pb::Frame::decode(bytes).map_err(|e| (0, WireError::NotAFrame(e.to_string())))?;
    let cmd = CmdId::try_from(frame.cmd)
        .map_err(|_| (frame.request_id, WireError::UnknownCmd(frame.cmd)))?;
    if cmd == CmdId::CmdUnspecified {
        return Err((frame.request_id, WireError::UnknownCmd(frame.cmd)));
    }
    Ok(Decoded {
        cmd,
        request_id: frame.request_id,
        body: frame.body,
    })
}

/// The `ErrorResp` frame for a code.
pub fn error_frame(request_id: u64, code: ErrorCode, message: impl Into<String>) -> Bytes {
    encode(
        CmdId::ErrorResp,
        request_id,
        &pb::ErrorResp {
            code: code.number(),
            name: code.name().to_owned(),
            message: message.into(),
        },
    )
}

/// The push frame of one event (request id 0).
pub fn event_push_frame(push: &pb::EventPush) -> Bytes {
    encode(CmdId::EventPush, 0, push)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let hello = pb::Hello {
            client_name: "t".into(),
            cursor: Some(7),
            protocol_version: PROTOCOL_VERSION,
        };
        let bytes = encode(CmdId::Hello, 42, &hello);
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded.cmd, CmdId::Hello);
        assert_eq!(decoded.request_id, 42);
        assert_eq!(decoded.body::<pb::Hello>().unwrap(), hello);
    }

    #[test]
    fn garbage_truncation_and_unknown_cmds_are_classified() {
        assert_eq!(
            decode(&[0xff, 0xff, 0xff]).unwrap_err().1.code(),
            ErrorCode::InvalidFrame
        );
        let good = encode(CmdId::Ping, 9, &pb::Ping { nonce: u64::MAX });
        assert!(decode(&good[..good.len() - 1]).is_err());
        let unknown = pb::Frame {
            cmd: 999,
            request_id: 5,
            body: vec![],
        }
        .encode_to_vec();
        assert_eq!(
            decode(&unknown).unwrap_err(),
            (5, WireError::UnknownCmd(999))
        );
        let bad_body = pb::Frame {
            cmd: CmdId::Hello as i32,
            request_id: 1,
            body: vec![0xff; 4],
        }
        .encode_to_vec();
        let decoded = decode(&bad_body).unwrap();
        assert!(decoded.body::<pb::Hello>().is_err());
    }
}
