//! Who asks, and what they may do: the [`Caller`] every request carries, with its [`Access`]
//! (a [`Scope`] plus the sessions it created). The handler checks it before any work; the
//! link checks [`Access::has_session`] before sending an event.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::protocol::envelope::{ErrorCode, Reply};
use crate::protocol::scope::Scope;

/// The transport a request came by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// The Unix socket: the user's own terminal, full rights, every command.
    Ipc,
    /// A loopback WebSocket connection of this subscriber.
    Loopback { subscriber_id: String },
    /// The relay connection.
    Relay,
    /// A bot paired with this host, through the sealed relay fleet (`crate::relay::fleet`);
    /// its rights are the scope it paired with, its subscriber [`bot_subscriber_id`].
    Bot { bot_id: String },
}

/// The subscriber row of a paired bot's channels: `bot-<bot_id>`.
pub fn bot_subscriber_id(bot_id: &str) -> String {
    format!("bot-{bot_id}")
}

/// One connection's rights: its scope, and the sessions it created (which are in it too).
#[derive(Debug)]
pub struct Access {
    scope: Scope,
    listed: Option<HashSet<String>>,
    created: Mutex<HashSet<String>>,
}

impl Access {
    pub fn new(scope: Scope) -> Arc<Access> {
        Arc::new(Access {
            listed: scope.sessions.as_ref().map(|s| s.iter().cloned().collect()),
            scope,
            created: Mutex::new(HashSet::new()),
        })
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether events and requests of `session_id` are in scope.
    pub fn has_session(&self, session_id: &str) -> bool {
        match &self.listed {
            None => true,
            Some(listed) => {
                listed.contains(session_id)
                    || self
                        .created
                        .lock()
                        .is_ok_and(|created| created.contains(session_id))
            }
        }
    }

    /// The session ids in scope, or `None` for every session.
    pub fn sessions(&self) -> Option<Vec<String>> {
        let listed = self.listed.as_ref()?;
        let mut all: Vec<String> = listed.iter().cloned().collect();
        if let Ok(created) = self.created.lock() {
            all.extend(created.iter().filter(|c| !listed.contains(*c)).cloned());
        }
        Some(all)
    }

    /// A session this connection created joins its scope.
    pub fn created(&self, session_id: &str) {
        if self.listed.is_some()
            && let Ok(mut created) = self.created.lock()
        {
            created.insert(session_id.to_owned());
        }
    }

    pub(super) fn session(&self, session_id: &str) -> Result<(), Reply> {
        if self.has_session(session_id) {
            Ok(())
        } else {
            Err(Reply::error(
                ErrorCode::OutOfScope,
                format!("session {session_id:?} is outside this connection's scope"),
                json!({"session_id": session_id}),
            ))
        }
    }

    pub(super) fn allows(&self, allowed: bool, what: &str) -> Result<(), Reply> {
        if allowed {
            Ok(())
        } else {
            Err(Reply::error(
                ErrorCode::OutOfScope,
                format!("this connection's scope does not allow {what}"),
                serde_json::Value::Null,
            ))
        }
    }
}

/// Who sent a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub via: Via,
    pub access: Arc<Access>,
}

impl Caller {
    /// The user's terminal over IPC.
    pub fn ipc() -> Caller {
        Caller {
            via: Via::Ipc,
            access: Access::new(Scope::all()),
        }
    }

    pub fn on_wire(&self) -> bool {
        self.via != Via::Ipc
    }

    /// Who a permission answer is recorded as given by.
    pub fn by(&self) -> String {
        match &self.via {
            Via::Ipc => "ipc".to_owned(),
            Via::Loopback { subscriber_id } => subscriber_id.clone(),
            Via::Relay => "relay".to_owned(),
            Via::Bot { bot_id } => bot_subscriber_id(bot_id),
        }
    }
}
