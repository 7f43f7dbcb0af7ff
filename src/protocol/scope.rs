//! What a wire client may do: one type for the relay token's scope (`config.toml`,
//! `host.relay.set`) and the loopback grant's (`subscriber.add`). The request layer checks it
//! on every request; the link checks it on every event it sends.

use serde::{Deserialize, Serialize};

/// A scope. Absent fields take the conservative defaults of [`Scope::default`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scope {
    /// The session ids it may see and drive (plus those it creates); absent: every session.
    pub sessions: Option<Vec<String>>,
    /// May send prompts, cancel, activate and rename sessions.
    pub prompt: bool,
    /// May answer permission requests.
    pub permissions: bool,
    /// May create and delete sessions (create, fork, import — import only without a session
    /// list — and delete).
    pub create_sessions: bool,
}

impl Default for Scope {
    /// Every session, prompts yes, permission answers and new sessions no: what a relay token
    /// grants unless its configuration says more.
    fn default() -> Self {
        Scope {
            sessions: None,
            prompt: true,
            permissions: false,
            create_sessions: false,
        }
    }
}

impl Scope {
    /// Everything: IPC, and a loopback grant without a session filter.
    pub fn all() -> Scope {
        Scope {
            sessions: None,
            prompt: true,
            permissions: true,
            create_sessions: true,
        }
    }

    /// No session and no right (what a scope that cannot be read grants).
    pub fn nothing() -> Scope {
        Scope {
            sessions: Some(Vec::new()),
            prompt: false,
            permissions: false,
            create_sessions: false,
        }
    }

    /// A loopback grant for one session: it reads, prompts and answers for that session only,
    /// and creates none.
    pub fn one_session(session_id: &str) -> Scope {
        Scope {
            sessions: Some(vec![session_id.to_owned()]),
            prompt: true,
            permissions: true,
            create_sessions: false,
        }
    }
}

/// The scope fields `subscriber.add` takes (each optional; see [`ScopeParams::resolve`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeParams {
    #[serde(default)]
    pub sessions: Option<Vec<String>>,
    #[serde(default)]
    pub prompt: Option<bool>,
    #[serde(default)]
    pub permissions: Option<bool>,
    #[serde(default)]
    pub create_sessions: Option<bool>,
}

impl ScopeParams {
    /// The grant's scope: without a session filter (neither `session_id` nor `sessions`) full
    /// rights; with one, [`Scope::one_session`]'s rights over those sessions. Each flag given
    /// wins over its default.
    pub fn resolve(&self, session_id: Option<&str>) -> Scope {
        let mut sessions = self.sessions.clone();
        if let Some(id) = session_id {
            let list = sessions.get_or_insert_with(Vec::new);
            if !list.iter().any(|s| s == id) {
                list.push(id.to_owned());
            }
        }
        let base = match sessions {
            None => Scope::all(),
            Some(sessions) => Scope {
                sessions: Some(sessions),
                ..Scope::one_session("")
            },
        };
        Scope {
            prompt: self.prompt.unwrap_or(base.prompt),
            permissions: self.permissions.unwrap_or(base.permissions),
            create_sessions: self.create_sessions.unwrap_or(base.create_sessions),
            sessions: base.sessions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_filter_narrows_a_grant_and_flags_override() {
        let none = ScopeParams::default();
        assert_eq!(none.resolve(None), Scope::all());
        let one = none.resolve(Some("a"));
        assert_eq!(one.sessions, Some(vec!["a".to_owned()]));
        assert!(one.prompt && one.permissions && !one.create_sessions);
        let read_only = ScopeParams {
            prompt: Some(false),
            permissions: Some(false),
            ..ScopeParams::default()
        };
        let scope = read_only.resolve(Some("a"));
        assert!(!scope.prompt && !scope.permissions);
        let both = ScopeParams {
            sessions: Some(vec!["b".into()]),
            ..ScopeParams::default()
        }
        .resolve(Some("a"));
        assert_eq!(both.sessions, Some(vec!["b".to_owned(), "a".to_owned()]));
    }

    #[test]
    fn the_relay_default_is_conservative() {
        let scope: Scope = serde_json::from_str(r#"{"sessions": ["x"]}"#).unwrap();
        assert!(scope.prompt && !scope.permissions && !scope.create_sessions);
        assert!(serde_json::from_str::<Scope>(r#"{"admin": true}"#).is_err());
    }
}
