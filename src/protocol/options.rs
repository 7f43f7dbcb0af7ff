//! A session's options (`session.create`): the model, the standing prompt, MCP servers and the
//! permission mode, as the wire names them (what a family declares it can do with each is its
//! `session::agent::OptionCaps`); and a prompt's attachments (`session.send`), as
//! a client gives them ([`AttachmentParam`]) and as the host hands them to a driver once
//! checked and copied ([`Attachment`]). Pure data: checks and the mapping to each agent's own
//! carrier live in the session layer and the families.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a session is created with; every field optional (absent: the agent's own default).
/// Stored on the session row and given to every agent process the session opens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOptions {
    /// The model the agent runs (its own name for it, e.g. `claude-sonnet-4-5`, `gpt-5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Standing instructions, given once per session through the family's native carrier
    /// (never prepended to a turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// MCP servers the agent is given, in its own format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServer>,
    /// How the agent asks before it acts (absent: `ask`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<PermissionMode>,
}

impl SessionOptions {
    /// No option set: the agent runs as the host always ran it.
    pub fn is_empty(&self) -> bool {
        self == &SessionOptions::default()
    }

    /// The permission mode in effect (absent: `ask`).
    pub fn mode(&self) -> PermissionMode {
        self.permission_mode.unwrap_or_default()
    }
}

/// One MCP server definition: a command the agent starts (stdio), or a URL it connects to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum McpServer {
    /// `{type: "stdio", name, command, args?, env?}`.
    Stdio {
        name: String,
        command: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<EnvVar>,
    },
    /// `{type: "http", name, url, headers?}` (streamable HTTP).
    Http {
        name: String,
        url: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<Header>,
    },
    /// `{type: "sse", name, url, headers?}`.
    Sse {
        name: String,
        url: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<Header>,
    },
}

impl McpServer {
    pub fn name(&self) -> &str {
        match self {
            McpServer::Stdio { name, .. }
            | McpServer::Http { name, .. }
            | McpServer::Sse { name, .. } => name,
        }
    }

    /// `stdio`, `http` or `sse`.
    pub fn transport(&self) -> McpTransport {
        match self {
            McpServer::Stdio { .. } => McpTransport::Stdio,
            McpServer::Http { .. } => McpTransport::Http,
            McpServer::Sse { .. } => McpTransport::Sse,
        }
    }
}

/// An MCP server's transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpTransport {
    Stdio,
    Http,
    Sse,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// How the agent asks before it acts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionMode {
    /// Every tool the agent's own policy does not allow is asked of a client (the default).
    #[default]
    Ask,
    /// File edits in the workspace run without asking; other tools are asked.
    AcceptEdits,
    /// Nothing is asked. Needs `allow_bypass = true` in `config.toml`.
    Bypass,
}

impl PermissionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Ask => "ask",
            PermissionMode::AcceptEdits => "accept_edits",
            PermissionMode::Bypass => "bypass",
        }
    }
}

/// One attachment of `session.send`, as a client gives it: a file by path (inside the
/// session's cwd or an allow-listed directory), or the bytes themselves. Exactly one of the
/// two shapes: a field of neither (or `name` with `path`), or both `path` and `data_base64`,
/// is refused (`invalid_params`), never read as one of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawAttachmentParam")]
pub enum AttachmentParam {
    /// `{path, mime?}`: a regular file; its MIME type from `mime` or its contents and name.
    Path {
        path: String,
        #[serde(default)]
        mime: Option<String>,
    },
    /// `{data_base64, mime, name?}`.
    Data {
        data_base64: String,
        mime: String,
        #[serde(default)]
        name: Option<String>,
    },
}

/// [`AttachmentParam`] as it comes, every field of both shapes, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAttachmentParam {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    data_base64: Option<String>,
    #[serde(default)]
    mime: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

impl TryFrom<RawAttachmentParam> for AttachmentParam {
    type Error = String;

    fn try_from(raw: RawAttachmentParam) -> Result<Self, String> {
        match raw {
            RawAttachmentParam {
                path: Some(_),
                data_base64: Some(_),
                ..
            } => Err(
                "an attachment is either {path, mime?} or {data_base64, mime, name?}, \
                      not both"
                    .to_owned(),
            ),
            RawAttachmentParam {
                path: Some(_),
                name: Some(_),
                ..
            } => Err(
                "`name` is for an attachment by data_base64; one by path is named by \
                      its file"
                    .to_owned(),
            ),
            RawAttachmentParam {
                path: Some(path),
                mime,
                ..
            } => Ok(AttachmentParam::Path { path, mime }),
            RawAttachmentParam {
                data_base64: Some(data_base64),
                mime: Some(mime),
                name,
                ..
            } => Ok(AttachmentParam::Data {
                data_base64,
                mime,
                name,
            }),
            RawAttachmentParam {
                data_base64: Some(_),
                ..
            } => Err("an attachment by data_base64 needs its `mime`".to_owned()),
            _ => Err("an attachment is {path, mime?} or {data_base64, mime, name?}".to_owned()),
        }
    }
}

/// An attachment's kind: what the family must declare to take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentKind {
    Image,
    File,
}

/// A checked attachment, copied into the host's home when the prompt was taken, so a queued
/// prompt sends what was attached even if the original changed since. A driver reads `path`
/// (or passes it on, for an agent that takes image paths).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// The file's name as the user knows it (the original's file name, or `name`).
    pub name: String,
    pub mime: String,
    pub kind: AttachmentKind,
    pub bytes: u64,
    /// Hex SHA-256 of the contents.
    pub sha256: String,
    /// The host's copy.
    pub path: PathBuf,
}

/// What a session's native id was bound under, recorded on its row and compared before every
/// resume (a native id is only an index: resumed under another workspace or provider account
/// it would silently change what the agent sees). Hashes, never the secrets themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRecord {
    /// The git top-level of the cwd and its `origin` remote, when the cwd is in a repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceIdentity>,
    /// The model provider the agent talks to: its base URL's host, and a hash of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderIdentity>,
    /// The model in effect (the session's `model`, else the agent's configured default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Hex SHA-256 of the standing prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt_sha256: Option<String>,
    /// Hex SHA-256 of the runtime options (MCP servers, permission mode) as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options_sha256: Option<String>,
    /// When it was last recorded (unix milliseconds).
    #[serde(default)]
    pub recorded_at_ms: i64,
}

/// A workspace as git knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceIdentity {
    /// `git rev-parse --show-toplevel`.
    pub root: String,
    /// The `origin` remote's URL (credentials stripped), if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
}

/// A model provider account as far as the host can tell without asking it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderIdentity {
    /// The host (and port, when not the default) of the API base URL.
    pub host: String,
    /// Hex SHA-256 of the API key or token the agent is given (first 16 hex digits), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sha256: Option<String>,
}

/// An attachment as events and replies describe it (never its bytes or the host's path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentInfo {
    pub name: String,
    pub mime: String,
    pub kind: AttachmentKind,
    pub bytes: u64,
    pub sha256: String,
}

impl From<&Attachment> for AttachmentInfo {
    fn from(a: &Attachment) -> Self {
        AttachmentInfo {
            name: a.name.clone(),
            mime: a.mime.clone(),
            kind: a.kind,
            bytes: a.bytes,
            sha256: a.sha256.clone(),
        }
    }
}
