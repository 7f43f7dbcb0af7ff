//! Permission requests: a request the agent makes is saved as pending before it is published
//! (the session is `waiting` while one of its run is pending); an answer names one of the
//! options the request offered (or `allow` / `deny`, the first allow-once / reject-once one),
//! is decided in the store (first answer wins), passed to the agent as that option, then
//! published as `permission.resolved` with who answered and what was chosen; an accepted
//! `allow_always` option is recorded on the session as a rule (`session.get` lists them)
//! before that event goes out, only when the driver acknowledges that it wrote the native
//! answer with the "always" part ([`crate::session::agent::Honoured`]; awaited for at most
//! [`crate::session::agent::PERMISSION_ACK_WAIT`]). A request the agent withdraws, or that outlives its run or its
//! agent, is resolved visibly (`expired` by the host).

use serde_json::Value;

use super::{Actor, Decision, PermissionAnswer, PermissionReceipt};
use crate::bus::Bus;
use crate::protocol::events::{
    Event, EventBody, PermissionOption, PermissionOptionKind, PermissionRequest, PermissionResolved,
};
use crate::protocol::replies::PermissionRule;
use crate::protocol::states::PermissionState;
use crate::session::SessionError;
use crate::store::{PermissionRow, Resolve, Store, now_ms};

/// The option an answer chooses among those a request offers. An `option_id` must be one of
/// them (and agree with a `decision` given with it); `allow` is the first allow-once option
/// (else the first that allows), `deny` the first reject-once one (else the first that
/// refuses). A request that offered nothing takes the plain pair.
fn choose(
    request_id: &str,
    offered: &[PermissionOption],
    answer: &PermissionAnswer,
) -> Result<PermissionOption, SessionError> {
    let plain = PermissionOption::allow_deny();
    let offered = if offered.is_empty() {
        plain.as_slice()
    } else {
        offered
    };
    let chosen = match (&answer.option_id, answer.decision) {
        (Some(id), decision) => {
            let option = offered.iter().find(|o| &o.id == id).ok_or_else(|| {
                SessionError::UnknownOption {
                    request_id: request_id.to_owned(),
                    option_id: id.clone(),
                    offered: offered.iter().map(|o| o.id.clone()).collect(),
                }
            })?;
            if let Some(decision) = decision
                && (decision == Decision::Allow) != option.kind.allows()
            {
                return Err(SessionError::InvalidParams(format!(
                    "option {id:?} is {}, not {}",
                    option.kind.as_str(),
                    decision.as_str()
                )));
            }
            option
        }
        (None, Some(decision)) => {
            let allow = decision == Decision::Allow;
            let once = if allow {
                PermissionOptionKind::AllowOnce
            } else {
                PermissionOptionKind::RejectOnce
            };
            offered
                .iter()
                .find(|o| o.kind == once)
                .or_else(|| offered.iter().find(|o| o.kind.allows() == allow))
                .ok_or_else(|| {
                    SessionError::InvalidParams(format!(
                        "permission request {request_id:?} offers no option to {}; it offers: {}",
                        decision.as_str(),
                        offered
                            .iter()
                            .map(|o| o.id.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?
        }
        (None, None) => {
            return Err(SessionError::InvalidParams(
                "give option_id or decision (allow or deny)".to_owned(),
            ));
        }
    };
    Ok(chosen.clone())
}

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
        answer: PermissionAnswer,
        message: Option<String>,
        by: String,
    ) -> Result<PermissionReceipt, SessionError> {
        // Checked before the store decides, so a bad option leaves the request pending.
        let option = match self.pending.get(&request_id) {
            Some(offered) => choose(&request_id, offered, &answer)?,
            None => {
                // Not held here: answered already, unknown, or (a failed save) never held.
                match self
                    .cx
                    .store
                    .get_permission(self.cx.session_id.clone(), request_id.clone())
                    .await?
                {
                    None => return Err(SessionError::PermissionNotFound(request_id)),
                    Some(row) if row.state != PermissionState::Pending => {
                        return Err(SessionError::AlreadyResolved {
                            request_id,
                            decision: row.decision.unwrap_or_default(),
                            by: row.resolved_by.unwrap_or_default(),
                        });
                    }
                    Some(_) => choose(&request_id, &[], &answer)?,
                }
            }
        };
        let decision = if option.kind.allows() {
            Decision::Allow
        } else {
            Decision::Deny
        };
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
        // Awaited here, bounded (`PERMISSION_ACK_WAIT`): the driver acknowledges right after
        // it wrote the native answer.
        let mut kept = false;
        if let Some(live) = self.state.live() {
            match live
                .session
                .choose_permission(&request_id, &option, &input, message.as_deref())
                .await
            {
                Ok(honoured) => kept = honoured.always,
                Err(e) => {
                    tracing::info!(error = %e, "the answer did not reach the agent's request");
                }
            }
        }
        // A rule only when the agent got the "always" part natively.
        let rule = match option.kind {
            PermissionOptionKind::AllowAlways if kept => {
                Some(self.record_rule(&row, &option, &by).await)
            }
            PermissionOptionKind::AllowAlways => {
                tracing::info!(
                    request_id,
                    option_id = %option.id,
                    "an always option the agent did not take as one: no rule recorded"
                );
                None
            }
            _ => None,
        };
        self.cx
            .publish(
                row.run_id.as_deref(),
                EventBody::PermissionResolved(PermissionResolved {
                    request_id: request_id.clone(),
                    decision: decision.as_str().to_owned(),
                    by: Some(by),
                    option_id: Some(option.id.clone()),
                    kind: Some(option.kind),
                    rule: rule.clone(),
                }),
            )
            .await;
        // `running` again once the last request is answered.
        self.sync_state().await;
        Ok(PermissionReceipt {
            request_id,
            decision: decision.as_str().to_owned(),
            option_id: Some(option.id),
            rule,
        })
    }

    /// Record an accepted always option on the session; returns the rule in words. A failed
    /// write is logged and counted as an outage: the agent keeps the rule either way, and the
    /// `permission.resolved` event still says so.
    async fn record_rule(
        &mut self,
        row: &PermissionRow,
        option: &PermissionOption,
        by: &str,
    ) -> String {
        let description = option
            .rule
            .clone()
            .unwrap_or_else(|| format!("{} ({})", option.label, row.tool));
        let rule = PermissionRule {
            request_id: row.request_id.clone(),
            tool: row.tool.clone(),
            option_id: option.id.clone(),
            label: option.label.clone(),
            description: description.clone(),
            by: by.to_owned(),
            at_ms: now_ms(),
        };
        if let Err(e) = self
            .cx
            .store
            .insert_permission_rule(self.cx.session_id.clone(), rule)
            .await
        {
            tracing::error!(error = %e, "saving a permission rule failed");
            self.note_outage();
        }
        tracing::info!(request_id = %row.request_id, rule = %description, "permission rule accepted");
        description
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
                    ..PermissionResolved::default()
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
