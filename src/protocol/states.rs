//! The states a client reads: of a session, of a run, of a permission request. One enum each,
//! serialized in snake_case, so the session layer, the store rows, the replies and `follow`
//! share them instead of strings.

use serde::{Deserialize, Serialize};

/// What a session is doing, as `session.list`, `session.get` and the `session.state` bracket
/// show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// No turn runs.
    #[default]
    Idle,
    /// A turn runs.
    Running,
    /// A turn runs and waits for a person: a permission request is pending ("needs you").
    Waiting,
}

impl SessionState {
    pub const ALL: &'static [SessionState] = &[
        SessionState::Idle,
        SessionState::Running,
        SessionState::Waiting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Idle => "idle",
            SessionState::Running => "running",
            SessionState::Waiting => "waiting",
        }
    }

    pub fn parse(text: &str) -> Option<SessionState> {
        SessionState::ALL
            .iter()
            .copied()
            .find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a run is, as its `runs` row and `session.history`'s run list show it. The terminal
/// ones after `queued`/`running` are those of `run.end` ([`RunState`]), plus `dropped`: a
/// queued prompt that never ran (the queue overflowed, or the host stopped first).
///
/// [`RunState`]: super::events::RunState
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Accepted, waiting for its turn (or for the store, during an outage).
    Queued,
    /// Dispatched: its `run.start` is committed.
    Running,
    Completed,
    Failed,
    Cancelled,
    Interrupted,
    /// Never ran; a `warning` says why.
    Dropped,
}

impl RunStatus {
    pub const ALL: &'static [RunStatus] = &[
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Interrupted,
        RunStatus::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Dropped => "dropped",
        }
    }

    pub fn parse(text: &str) -> Option<RunStatus> {
        RunStatus::ALL.iter().copied().find(|s| s.as_str() == text)
    }

    /// The run is over: nothing more happens to it (its row has `ended_at`).
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunStatus::Queued | RunStatus::Running)
    }
}

impl From<super::events::RunState> for RunStatus {
    fn from(state: super::events::RunState) -> RunStatus {
        use super::events::RunState;
        match state {
            RunState::Completed => RunStatus::Completed,
            RunState::Failed => RunStatus::Failed,
            RunState::Cancelled => RunStatus::Cancelled,
            RunState::Interrupted => RunStatus::Interrupted,
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a permission request is: `pending` until the first answer (a person's, the agent
/// withdrawing it, or the host expiring it) makes it `resolved`; the row's `decision` says
/// which answer that was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionState {
    Pending,
    Resolved,
}

impl PermissionState {
    pub const ALL: &'static [PermissionState] =
        &[PermissionState::Pending, PermissionState::Resolved];

    pub fn as_str(self) -> &'static str {
        match self {
            PermissionState::Pending => "pending",
            PermissionState::Resolved => "resolved",
        }
    }

    pub fn parse(text: &str) -> Option<PermissionState> {
        PermissionState::ALL
            .iter()
            .copied()
            .find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for PermissionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_states_round_trip_their_names() {
        for state in SessionState::ALL {
            assert_eq!(SessionState::parse(state.as_str()), Some(*state));
            let json = serde_json::to_string(state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert_eq!(SessionState::parse("busy"), None);
    }

    #[test]
    fn run_statuses_round_trip_their_names() {
        for state in RunStatus::ALL {
            assert_eq!(RunStatus::parse(state.as_str()), Some(*state));
            let json = serde_json::to_string(state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert_eq!(RunStatus::parse("done"), None);
        let terminal: Vec<RunStatus> = RunStatus::ALL
            .iter()
            .copied()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(terminal.len(), RunStatus::ALL.len() - 2);
        assert!(!terminal.contains(&RunStatus::Queued));
        assert!(!terminal.contains(&RunStatus::Running));
    }

    #[test]
    fn a_run_end_state_is_the_run_status_of_the_same_name() {
        use crate::protocol::events::RunState;
        for state in [
            RunState::Completed,
            RunState::Failed,
            RunState::Cancelled,
            RunState::Interrupted,
        ] {
            let status = RunStatus::from(state);
            assert!(status.is_terminal());
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::to_value(status).unwrap()
            );
        }
    }

    #[test]
    fn permission_states_round_trip_their_names() {
        for state in PermissionState::ALL {
            assert_eq!(PermissionState::parse(state.as_str()), Some(*state));
            let json = serde_json::to_string(state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert_eq!(PermissionState::parse("open"), None);
    }
}
