//! Permission requests: a request the agent makes is saved as pending before it is published
//! (the session is `waiting` while one of its run is pending); an answer is decided in the
//! store (first answer wins), passed to the agent, then published as `permission.resolved`
//! with who answered; a request the agent withdraws, or that outlives its run or its agent,
//! is resolved visibly (`expired` by the host).

use serde_json::Value;

use super::{Actor, Decision, PermissionReceipt};
use crate::bus::Bus;
use crate::protocol::events::{Event, EventBody, PermissionRequest, PermissionResolved};
use crate::protocol::states::PermissionState;
use crate::session::SessionError;
use crate::store::{PermissionRow, Resolve, Store, now_ms};

impl Actor {
    /// The agent asks: saved as pending, published, and the session is `waiting`.
    pub(super) async fn on_permission_request(
        &mut self,
        request: PermissionRequest,
        run_id: Option<String>,
    ) {
        let row = PermissionRow {
            session_id: self.cx.session_id.clone(),
            request_id: request.request_id.clone(),
            run_id: run_id.clone(),
            tool: request.tool.clone(),
            input: request.input.to_string(),
            state: PermissionState::Pending,
            decision: None,
            resolved_by: None,
            created_at_ms: now_ms(),
            resolved_at_ms: None,
        };
        match self.cx.store.insert_permission(row).await {
            Ok(()) => {
                self.pending
                    .insert(request.request_id.clone(), request.options.clone());
            }
            Err(e) => {
                tracing::error!(error = %e, "saving a permission request failed");
                self.note_outage();
            }
        }
        self.cx
            .publish(run_id.as_deref(), EventBody::PermissionRequest(request))
            .await;
        // `waiting`, after the request it waits for.
        self.sync_state().await;
    }

    /// The agent withdrew its own request.
    pub(super) async fn on_permission_withdrawn(
        &mut self,
        resolved: PermissionResolved,
        run_id: Option<String>,
    ) {
        let by = resolved.by.clone().unwrap_or_else(|| "agent".to_owned());
        match self
            .cx
            .store
            .resolve_permission(
                self.cx.session_id.clone(),
                resolved.request_id.clone(),
                resolved.decision.clone(),
                by,
            )
            .await
        {
            Ok(Resolve::Resolved(_)) => {
                self.pending.remove(&resolved.request_id);
                self.cx
                    .publish(run_id.as_deref(), EventBody::PermissionResolved(resolved))
                    .await;
                self.sync_state().await;
            }
            Ok(_) => {
                // Answered before, or never saved: not pending either way.
                self.pending.remove(&resolved.request_id);
            }
            Err(e) => {
                tracing::error!(error = %e, "saving a withdrawn permission failed");
                self.note_outage();
            }
        }
    }

    pub(super) async fn on_permission(
        &mut self,
        request_id: String,
        decision: Decision,
        message: Option<String>,
        by: String,
    ) -> Result<PermissionReceipt, SessionError> {
        let resolution = self
            .cx
            .store
            .resolve_permission(
                self.cx.session_id.clone(),
                request_id.clone(),
                decision.as_str().to_owned(),
                by.clone(),
            )
            .await?;
        let row = match resolution {
            Resolve::NotFound => return Err(SessionError::PermissionNotFound(request_id)),
            Resolve::Already(row) => {
                self.pending.remove(&request_id);
                return Err(SessionError::AlreadyResolved {
                    request_id,
                    decision: row.decision.unwrap_or_default(),
                    by: row.resolved_by.unwrap_or_default(),
                });
            }
            Resolve::Resolved(row) => row,
        };
        self.pending.remove(&request_id);
        let input = serde_json::from_str::<Value>(&row.input).unwrap_or(Value::Null);
        if let Some(live) = self.state.live()
            && let Err(e) = live
                .session
                .respond_permission(
                    &request_id,
                    decision == Decision::Allow,
                    &input,
                    message.as_deref(),
                )
                .await
        {
            tracing::info!(error = %e, "the agent is gone before the answer reached it");
        }
        self.cx
            .publish(
                row.run_id.as_deref(),
                EventBody::PermissionResolved(PermissionResolved {
                    request_id: request_id.clone(),
                    decision: decision.as_str().to_owned(),
                    by: Some(by),
                }),
            )
            .await;
        // `running` again once the last request is answered.
        self.sync_state().await;
        Ok(PermissionReceipt {
            request_id,
            decision: decision.as_str().to_owned(),
        })
    }

    /// Resolve every pending request of this session as `expired` by the host.
    pub(super) async fn expire_permissions(&mut self, why: &str) {
        let pending = match self
            .cx
            .store
            .pending_permissions(Some(self.cx.session_id.clone()))
            .await
        {
            Ok(pending) => pending,
            Err(e) => {
                // A read, not a commit: left pending in the store, where the next answer finds
                // them expired (an agent that is gone holds none) or the next host's recovery
                // expires them.
                tracing::error!(error = %e, "reading pending permissions failed");
                return;
            }
        };
        for row in pending {
            tracing::info!(request_id = %row.request_id, why, "permission request expired");
            self.pending.remove(&row.request_id);
            expire_permission(&self.cx.store, &self.cx.bus, row).await;
        }
    }
}

/// Mark a pending request expired and publish that.
pub(in crate::session) async fn expire_permission(store: &Store, bus: &Bus, row: PermissionRow) {
    match store
        .resolve_permission(
            row.session_id.clone(),
            row.request_id.clone(),
            "expired".to_owned(),
            "host".to_owned(),
        )
        .await
    {
        Ok(Resolve::Resolved(_)) => {
            let event = Event::new(
                row.session_id,
                row.run_id,
                EventBody::PermissionResolved(PermissionResolved {
                    request_id: row.request_id,
                    decision: "expired".to_owned(),
                    by: Some("host".to_owned()),
                }),
            );
            if let Err(e) = bus.publish(&event).await {
                tracing::error!(error = %e, "publishing an expired permission failed");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "expiring a permission request failed"),
    }
}
