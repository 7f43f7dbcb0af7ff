//! The paged session list (`session.list`): the store's keyset page, with its one caller's
//! fault (a cursor the host never handed out) turned into `invalid_params`. Scoping is the
//! caller's: a scoped client passes its sessions as [`SessionQuery::only`]. Reads only; no
//! actor is involved, so listing never waits behind a running turn.

use super::{SessionError, SessionManager};
use crate::store::{SessionPage, SessionQuery, StoreError};

impl SessionManager {
    /// One page of sessions, newest activity first; pass the reply's `next_cursor` back as
    /// `query.cursor` for the next page.
    pub async fn list_page(&self, query: SessionQuery) -> Result<SessionPage, SessionError> {
        self.store
            .list_sessions_page(query)
            .await
            .map_err(|e| match e {
                StoreError::BadCursor(why) => {
                    SessionError::InvalidParams(format!("cursor is malformed ({why})"))
                }
                other => SessionError::from(other),
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::bus::Bus;
    use crate::session::NoAgents;
    use crate::store::{SessionRow, Store};

    #[tokio::test]
    async fn pages_through_the_store_and_refuses_a_bad_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let (store, threads) = Store::open(&dir.path().join("t.db")).unwrap();
        let (bus, bus_tasks) = Bus::start(store.clone()).await.unwrap();
        let sessions = SessionManager::new(store.clone(), bus.clone(), Arc::new(NoAgents));
        for i in 0..3 {
            store
                .insert_session(SessionRow {
                    session_id: format!("s{i}"),
                    agent_type: "claude".into(),
                    native_session_id: None,
                    cwd: "/".into(),
                    parent_session_id: None,
                    title: None,
                    state: crate::protocol::states::SessionState::Idle,
                    created_at_ms: 100 + i,
                    updated_at_ms: 100 + i,
                    fork_of: None,
                    options: Default::default(),
                    binding: None,
                })
                .await
                .unwrap();
        }
        let first = sessions
            .list_page(SessionQuery {
                limit: 2,
                ..Default::default()
            })
            .await
            .unwrap();
        let ids: Vec<_> = first
            .sessions
            .iter()
            .map(|r| r.session.session_id.as_str())
            .collect();
        assert_eq!(ids, ["s2", "s1"]);
        let rest = sessions
            .list_page(SessionQuery {
                limit: 2,
                cursor: first.next_cursor,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(rest.sessions.len(), 1);
        assert_eq!(rest.sessions[0].session.session_id, "s0");
        assert_eq!(rest.next_cursor, None);
        let bad = sessions
            .list_page(SessionQuery {
                cursor: Some("%%%".into()),
                ..Default::default()
            })
            .await;
        assert!(
            matches!(bad, Err(SessionError::InvalidParams(_))),
            "{bad:?}"
        );
        drop((sessions, bus));
        bus_tasks.shutdown().await;
        drop(store);
        threads.shutdown().await;
    }
}
