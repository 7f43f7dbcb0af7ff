//! The client side of the wire protocol over a WebSocket: connect with a grant token, say
//! `Hello`, then read frames and send acks or requests. Used by `agent-host follow`, and by
//! tests and benchmarks as a real client.

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::protocol::wire::{self, CmdId, Decoded, MAX_PUSH_BYTES, pb};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the server refused the upgrade: HTTP {0}")]
    Refused(StatusCode),
    #[error("WebSocket: {0}")]
    Ws(#[from] WsError),
    #[error("bad endpoint or token: {0}")]
    Request(String),
    #[error("the server answered Hello with {0}")]
    HelloFailed(String),
    #[error("the server sent a frame that does not decode: {0}")]
    Frame(String),
}

type Stream = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A connected, greeted client.
pub struct WsClient {
    ws: Stream,
    next_request: u64,
    /// The code and reason of the server's close frame, once it came.
    pub last_close: Option<(u16, String)>,
}

/// Open a connection: upgrade with `Authorization: Bearer <token>`, send `Hello`, and wait for
/// `HelloResp` (or the `ErrorResp` that refuses it).
pub async fn connect(
    endpoint: &str,
    token: &str,
    hello: pb::Hello,
) -> Result<(WsClient, pb::HelloResp), ClientError> {
    let mut request = endpoint
        .into_client_request()
        .map_err(|e| ClientError::Request(e.to_string()))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|e| ClientError::Request(e.to_string()))?;
    request.headers_mut().insert(header::AUTHORIZATION, bearer);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_PUSH_BYTES))
        .max_frame_size(Some(MAX_PUSH_BYTES));
    let (ws, _response) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .map_err(|e| match e {
            WsError::Http(response) => ClientError::Refused(response.status()),
            other => ClientError::Ws(other),
        })?;
    let mut client = WsClient {
        ws,
        next_request: 1,
        last_close: None,
    };
    let id = client.send(CmdId::Hello, &hello).await?;
    loop {
        let Some(frame) = client.next_frame().await? else {
            return Err(ClientError::HelloFailed("a closed connection".to_owned()));
        };
        match frame.cmd {
            CmdId::HelloResp if frame.request_id == id => {
                let resp = frame
                    .body::<pb::HelloResp>()
                    .map_err(|e| ClientError::Frame(e.to_string()))?;
                return Ok((client, resp));
            }
            CmdId::ErrorResp => {
                let err = frame
                    .body::<pb::ErrorResp>()
                    .map_err(|e| ClientError::Frame(e.to_string()))?;
                return Err(ClientError::HelloFailed(format!(
                    "{} ({})",
                    err.name, err.message
                )));
            }
            _ => {}
        }
    }
}

impl WsClient {
    /// Send a request or an ack; returns the request id used.
    pub async fn send<M: prost::Message>(
        &mut self,
        cmd: CmdId,
        body: &M,
    ) -> Result<u64, ClientError> {
        let id = self.next_request;
        self.next_request += 1;
        self.ws
            .send(Message::Binary(wire::encode(cmd, id, body)))
            .await?;
        Ok(id)
    }

    /// Send raw bytes as one binary message (tests use this for hostile frames).
    pub async fn send_raw(&mut self, message: Message) -> Result<(), ClientError> {
        self.ws.send(message).await?;
        Ok(())
    }

    /// Acknowledge everything up to `cursor`.
    pub async fn ack(&mut self, cursor: i64) -> Result<(), ClientError> {
        self.send(CmdId::Ack, &pb::Ack { cursor }).await.map(|_| ())
    }

    /// The next frame, or `None` once the server closed. The close frame's reason, if any, is
    /// returned as [`ClientError::Frame`] only when it is not a normal close.
    pub async fn next_frame(&mut self) -> Result<Option<Decoded>, ClientError> {
        loop {
            match self.ws.next().await {
                None => return Ok(None),
                Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) => return Ok(None),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(Message::Binary(bytes))) => {
                    return wire::decode(&bytes)
                        .map(Some)
                        .map_err(|(_, e)| ClientError::Frame(e.to_string()));
                }
                Some(Ok(Message::Close(frame))) => {
                    self.last_close = frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                    return Ok(None);
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Close politely.
    pub async fn close(mut self) {
        let _already_closed = self.ws.close(None).await;
    }
}

/// Decode an `EventPush` body.
pub fn event_of(frame: &Decoded) -> Option<pb::EventPush> {
    (frame.cmd == CmdId::EventPush)
        .then(|| frame.body::<pb::EventPush>().ok())
        .flatten()
}

/// Encode a message for tests that build frames by hand.
pub fn raw_frame(cmd: i32, request_id: u64, body: Vec<u8>) -> Vec<u8> {
    pb::Frame {
        cmd,
        request_id,
        body,
    }
    .encode_to_vec()
}
