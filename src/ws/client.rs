//! The client side of the wire protocol over a WebSocket: connect with a grant token, say
//! `Hello`, then read frames and send acks or requests. Used by `agent-host follow`, and by
//! tests and benchmarks as a real client.

use std::collections::VecDeque;

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::protocol::envelope::Reply;
use crate::protocol::wire::{
    self, CmdId, Codec, Decoded, MAX_PUSH_BYTES, WireBody, WireMessage, pb,
};

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
    #[error("the server refused Hello: {name} ({message})")]
    HelloRefused {
        code: i32,
        name: String,
        message: String,
    },
    #[error("the server sent a frame that does not decode: {0}")]
    Frame(String),
    #[error("the connection closed before the reply came")]
    Closed,
    #[error("the server refused the request frame: {0}")]
    RequestRefused(String),
}

/// The connection under the WebSocket: TCP (the loopback server, a relay) or the host's
/// Unix socket (`ws.sock`).
#[expect(
    clippy::large_enum_variant,
    reason = "one per client connection, moved once (into the client)"
)]
enum Stream {
    Tcp(WebSocketStream<MaybeTlsStream<TcpStream>>),
    Unix(WebSocketStream<UnixStream>),
}

impl Stream {
    async fn send(&mut self, message: Message) -> Result<(), WsError> {
        match self {
            Stream::Tcp(ws) => ws.send(message).await,
            Stream::Unix(ws) => ws.send(message).await,
        }
    }

    async fn next(&mut self) -> Option<Result<Message, WsError>> {
        match self {
            Stream::Tcp(ws) => ws.next().await,
            Stream::Unix(ws) => ws.next().await,
        }
    }

    async fn close(&mut self) -> Result<(), WsError> {
        match self {
            Stream::Tcp(ws) => ws.close(None).await,
            Stream::Unix(ws) => ws.close(None).await,
        }
    }
}

/// What a client connection reads into at a time (tungstenite's default, 128 KiB, is zero-filled
/// before every read and kept for the connection's life). Pushes and history pages can be
/// large; a larger frame still arrives whole, its buffer grown to it, in reads of this size.
pub const READ_BUFFER_BYTES: usize = 16 * 1024;

/// A client's WebSocket settings: messages up to `max_message` bytes, small buffers.
pub fn client_config(max_message: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message))
        .read_buffer_size(READ_BUFFER_BYTES)
}

/// A connected, greeted client.
pub struct WsClient {
    ws: Stream,
    codec: Codec,
    next_request: u64,
    /// Frames that arrived while [`WsClient::request`] waited for its reply.
    pending: VecDeque<Decoded>,
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
    connect_with(endpoint, token, hello, Codec::Protobuf).await
}

/// [`connect`] with a grant: over the host's Unix socket when the grant names one (this
/// machine's clients: no TCP on either side), else over its loopback endpoint.
pub async fn connect_grant(
    grant: &crate::protocol::replies::Grant,
    hello: pb::Hello,
) -> Result<(WsClient, pb::HelloResp), ClientError> {
    match &grant.ws_socket {
        Some(socket) => connect_unix(std::path::Path::new(socket), &grant.ws_token, hello).await,
        None => connect(&grant.ws_endpoint, &grant.ws_token, hello).await,
    }
}

/// [`connect`] in a codec: the JSON one is asked for with its subprotocol.
pub async fn connect_with(
    endpoint: &str,
    token: &str,
    hello: pb::Hello,
    codec: Codec,
) -> Result<(WsClient, pb::HelloResp), ClientError> {
    let request = upgrade_request(endpoint, token, codec)?;
    let config = client_config(MAX_PUSH_BYTES);
    let (ws, _response) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .map_err(refused)?;
    greet(Stream::Tcp(ws), codec, hello).await
}

/// [`connect`] over the host's Unix socket (`ws_socket` of a grant): the same upgrade, token
/// and protocol, without TCP.
pub async fn connect_unix(
    socket: &std::path::Path,
    token: &str,
    hello: pb::Hello,
) -> Result<(WsClient, pb::HelloResp), ClientError> {
    connect_unix_with(socket, token, hello, Codec::Protobuf).await
}

/// [`connect_unix`] in a codec.
pub async fn connect_unix_with(
    socket: &std::path::Path,
    token: &str,
    hello: pb::Hello,
    codec: Codec,
) -> Result<(WsClient, pb::HelloResp), ClientError> {
    let request = upgrade_request(UNIX_URL, token, codec)?;
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| ClientError::Ws(WsError::Io(e)))?;
    let config = client_config(MAX_PUSH_BYTES);
    let (ws, _response) =
        tokio_tungstenite::client_async_with_config(request, stream, Some(config))
            .await
            .map_err(refused)?;
    greet(Stream::Unix(ws), codec, hello).await
}

/// The URL a client of the Unix socket upgrades with (its `Host` is not checked there).
pub const UNIX_URL: &str = "ws://localhost/subscribe";

fn upgrade_request(
    endpoint: &str,
    token: &str,
    codec: Codec,
) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, ClientError> {
    let mut request = endpoint
        .into_client_request()
        .map_err(|e| ClientError::Request(e.to_string()))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|e| ClientError::Request(e.to_string()))?;
    request.headers_mut().insert(header::AUTHORIZATION, bearer);
    if codec == Codec::Json {
        request.headers_mut().insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(wire::JSON_SUBPROTOCOL),
        );
    }
    Ok(request)
}

fn refused(e: WsError) -> ClientError {
    match e {
        WsError::Http(response) => ClientError::Refused(response.status()),
        other => ClientError::Ws(other),
    }
}

/// Send `Hello` and wait for `HelloResp` (or the `ErrorResp` that refuses it).
async fn greet(
    ws: Stream,
    codec: Codec,
    hello: pb::Hello,
) -> Result<(WsClient, pb::HelloResp), ClientError> {
    let mut client = WsClient {
        ws,
        codec,
        next_request: 1,
        pending: VecDeque::new(),
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
                return Err(ClientError::HelloRefused {
                    code: err.code,
                    name: err.name,
                    message: err.message,
                });
            }
            _ => {}
        }
    }
}

impl WsClient {
    /// Send a frame (a request, an ack, a ping) in the connection's codec; returns the
    /// request id used.
    pub async fn send<M: WireBody>(&mut self, cmd: CmdId, body: &M) -> Result<u64, ClientError> {
        let id = self.next_request;
        self.next_request += 1;
        let message = match wire::encode_as(self.codec, cmd, id, body) {
            WireMessage::Binary(bytes) => Message::Binary(bytes),
            WireMessage::Text(text) => Message::Text(text.into()),
        };
        self.ws.send(message).await?;
        Ok(id)
    }

    /// Run one command of the envelope over the wire and wait for its reply (frames that come
    /// meanwhile, events among them, are kept for [`WsClient::next_frame`]). A command's error
    /// is a `Reply` with its code, as over IPC; `Err` only when the transport failed.
    pub async fn request(
        &mut self,
        command: &str,
        params: serde_json::Value,
    ) -> Result<Reply, ClientError> {
        let id = self
            .send(CmdId::Request, &wire::request(command, &params))
            .await?;
        loop {
            let Some(frame) = self.read_frame().await? else {
                return Err(ClientError::Closed);
            };
            if frame.request_id == id && frame.cmd == CmdId::Reply {
                let reply: pb::Reply = frame
                    .body()
                    .map_err(|e| ClientError::Frame(e.to_string()))?;
                let data = if reply.data_json.is_empty() {
                    serde_json::Value::Null
                } else {
                    serde_json::from_str(&reply.data_json)
                        .map_err(|e| ClientError::Frame(format!("data_json: {e}")))?
                };
                return Ok(Reply {
                    code: reply.code,
                    message: reply.message,
                    data,
                });
            }
            if frame.request_id == id && frame.cmd == CmdId::ErrorResp {
                let err: pb::ErrorResp = frame
                    .body()
                    .map_err(|e| ClientError::Frame(e.to_string()))?;
                return Err(ClientError::RequestRefused(format!(
                    "{} ({})",
                    err.name, err.message
                )));
            }
            self.pending.push_back(frame);
        }
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
        if let Some(frame) = self.pending.pop_front() {
            return Ok(Some(frame));
        }
        self.read_frame().await
    }

    async fn read_frame(&mut self) -> Result<Option<Decoded>, ClientError> {
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
                Some(Ok(Message::Text(text))) => {
                    return wire::decode_json(text.as_str())
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
        let _already_closed = self.ws.close().await;
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
