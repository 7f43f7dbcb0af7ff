//! The one mapping from module errors to the stable codes of the command table: every
//! transport's replies come from here (a second table anywhere else is a bug; a test greps for
//! one).

use serde_json::{Value, json};

use crate::daemon::DaemonError;
use crate::instance::InstanceError;
use crate::ipc::IpcError;
use crate::protocol::envelope::{ErrorCode, Reply};
use crate::protocol::wire::WireError;
use crate::seal::pairs::PairError;
use crate::session::SessionError;
use crate::store::StoreError;
use crate::subscribers::SubscriberError;

pub fn subscriber_error(e: SubscriberError) -> Reply {
    let message = e.to_string();
    match e {
        SubscriberError::NotFound(id) => Reply::error(
            ErrorCode::SubscriberNotFound,
            message,
            json!({"subscriber_id": id}),
        ),
        SubscriberError::Session(e) => session_error(e),
        SubscriberError::Store(_) => {
            tracing::error!(error = %message, "store failure while serving a command");
            Reply::error(ErrorCode::StoreFailed, message, Value::Null)
        }
        SubscriberError::Internal(_) => {
            tracing::error!(error = %message, "a subscriber invariant broke");
            Reply::error(ErrorCode::Internal, message, Value::Null)
        }
        SubscriberError::ShuttingDown => {
            Reply::error(ErrorCode::ShuttingDown, message, Value::Null)
        }
        SubscriberError::Grant(_) => {
            tracing::error!(error = %message, "minting a grant failed");
            Reply::error(ErrorCode::Internal, message, Value::Null)
        }
    }
}

/// A pairing command's failure (`pair.*`).
pub fn pair_error(e: PairError) -> Reply {
    let message = e.to_string();
    match e {
        PairError::NotFound(bot_id) => {
            Reply::error(ErrorCode::BotNotFound, message, json!({"bot_id": bot_id}))
        }
        // `relay.key` in the home cannot be read or made (a wider mode, a wrong size).
        PairError::Key(_) => {
            tracing::error!(error = %message, "the host key is unusable");
            Reply::error(ErrorCode::HomeUnusable, message, Value::Null)
        }
        PairError::Store(StoreError::Unavailable(_)) => {
            Reply::error(ErrorCode::StoreUnavailable, message, Value::Null)
        }
        PairError::Store(_) => {
            tracing::error!(error = %message, "store failure while serving a command");
            Reply::error(ErrorCode::StoreFailed, message, Value::Null)
        }
        PairError::Closed => Reply::error(ErrorCode::ShuttingDown, message, Value::Null),
        // A handshake's refusal travels as the relay's `Closed{pairing_refused}`, never as a
        // command's reply; reaching here is a bug, as the rest are.
        PairError::Refused | PairError::Rng(_) | PairError::BadRow { .. } => {
            tracing::error!(error = %message, "a pairing invariant broke");
            Reply::error(ErrorCode::Internal, message, Value::Null)
        }
    }
}

pub fn session_error(e: SessionError) -> Reply {
    let message = e.to_string();
    match e {
        SessionError::NotFound(id) => Reply::error(
            ErrorCode::SessionNotFound,
            message,
            json!({"session_id": id}),
        ),
        SessionError::CwdNotFound { path, .. } => {
            Reply::error(ErrorCode::CwdNotFound, message, json!({"cwd": path}))
        }
        SessionError::UnknownAgentType(agent_type) => Reply::error(
            ErrorCode::UnknownAgentType,
            message,
            json!({"agent_type": agent_type}),
        ),
        SessionError::InvalidParams(_) => {
            Reply::error(ErrorCode::InvalidParams, message, Value::Null)
        }
        // The caller named a native session the agent's own records place in another
        // workspace (`reason` tells it from the other binding refusals the code covers).
        SessionError::BindingMismatch {
            native_session_id,
            cwd,
            ..
        } => Reply::error(
            ErrorCode::BindingMismatch,
            message,
            json!({"reason": "native_session_elsewhere", "native_session_id": native_session_id, "cwd": cwd}),
        ),
        SessionError::AttachmentRefused { path, reason, .. } => Reply::error(
            ErrorCode::AttachmentRefused,
            message,
            json!({"path": path, "reason": reason}),
        ),
        SessionError::AttachmentTooLarge { bytes, limit } => Reply::error(
            ErrorCode::AttachmentTooLarge,
            message,
            match bytes {
                Some(bytes) => json!({"bytes": bytes, "limit": limit}),
                None => json!({"limit": limit}),
            },
        ),
        SessionError::AttachmentUnsupported { option, agent_type } => Reply::error(
            ErrorCode::OptionUnsupported,
            message,
            json!({"option": option, "agent_type": agent_type}),
        ),
        SessionError::OptionUnsupported {
            option,
            agent_type,
            reason,
        } => Reply::error(
            ErrorCode::OptionUnsupported,
            message,
            json!({"option": option, "agent_type": agent_type, "reason": reason}),
        ),
        SessionError::BypassNotAllowed => Reply::error(
            ErrorCode::BypassNotAllowed,
            message,
            json!({"option": "permission_mode"}),
        ),
        SessionError::NoAgent(_) => Reply::error(ErrorCode::NoAgent, message, Value::Null),
        SessionError::AgentUnavailable(_) => {
            Reply::error(ErrorCode::AgentUnavailable, message, Value::Null)
        }
        SessionError::RunNotFound(_) => Reply::error(ErrorCode::RunNotFound, message, Value::Null),
        SessionError::NotQueued { run_id, state } => Reply::error(
            ErrorCode::NotQueued,
            message,
            json!({"run_id": run_id, "state": state}),
        ),
        SessionError::QueueHeadAnnounced { run_id } => Reply::error(
            ErrorCode::NotQueued,
            message,
            json!({"run_id": run_id, "state": "queued", "reason": "announced"}),
        ),
        SessionError::SteerPending { run_id } => {
            Reply::error(ErrorCode::SteerPending, message, json!({"run_id": run_id}))
        }
        SessionError::SteerUnknown(_) => {
            Reply::error(ErrorCode::ResultDeliveryUnknown, message, Value::Null)
        }
        SessionError::PermissionNotFound(id) => Reply::error(
            ErrorCode::PermissionNotFound,
            message,
            json!({"request_id": id}),
        ),
        SessionError::UnknownOption {
            request_id,
            option_id,
            offered,
        } => Reply::error(
            ErrorCode::InvalidParams,
            message,
            json!({"reason": "unknown_option", "request_id": request_id, "option_id": option_id,
                   "options": offered}),
        ),
        SessionError::AlreadyResolved {
            request_id,
            decision,
            by,
        } => Reply::error(
            ErrorCode::AlreadyResolved,
            message,
            json!({"request_id": request_id, "decision": decision, "by": by}),
        ),
        SessionError::ShuttingDown => Reply::error(ErrorCode::ShuttingDown, message, Value::Null),
        SessionError::StoreUnavailable(_) => {
            Reply::error(ErrorCode::StoreUnavailable, message, Value::Null)
        }
        SessionError::Store(_) => {
            tracing::error!(error = %message, "store failure while serving a command");
            Reply::error(ErrorCode::StoreFailed, message, Value::Null)
        }
    }
}

/// A frame the wire refused.
pub fn wire_code(e: &WireError) -> ErrorCode {
    match e {
        WireError::NotAFrame(_) | WireError::BadBody { .. } | WireError::WrongCodec(_) => {
            ErrorCode::InvalidFrame
        }
        WireError::UnknownCmd(_) => ErrorCode::UnknownCmd,
    }
}

/// Why a host (`host.start`, foreground) did not start or stopped with an error.
pub fn start_error(e: DaemonError) -> Reply {
    match e {
        DaemonError::Instance(InstanceError::AlreadyRunning { pid }) => Reply::error(
            ErrorCode::AlreadyRunning,
            match pid {
                Some(pid) => format!("a host is already running (pid {pid})"),
                None => "a host is already running".to_owned(),
            },
            json!({"pid": pid}),
        ),
        DaemonError::Config(e) => Reply::error(ErrorCode::HomeUnusable, e.to_string(), Value::Null),
        DaemonError::Store(e @ StoreError::Corrupt { .. }) => {
            let path = match &e {
                StoreError::Corrupt { path, .. } => path.display().to_string(),
                _ => String::new(),
            };
            Reply::error(
                ErrorCode::StoreCorrupt,
                e.to_string(),
                json!({"path": path}),
            )
        }
        DaemonError::Store(e) => Reply::error(ErrorCode::StoreFailed, e.to_string(), Value::Null),
        e => Reply::error(ErrorCode::HostStartFailed, e.to_string(), Value::Null),
    }
}

/// The CLI could not get an answer from the host over IPC.
pub fn ipc_failure(e: IpcError, ipc_path: &std::path::Path) -> Reply {
    match e {
        IpcError::Connect { .. } => Reply::error(
            ErrorCode::HostNotRunning,
            format!(
                "no host answers on {}; start one with `agent-host host.start`",
                ipc_path.display()
            ),
            Value::Null,
        ),
        IpcError::Timeout(_) | IpcError::BadReply(_) | IpcError::Io(_) | IpcError::Bind { .. } => {
            Reply::error(ErrorCode::HostUnresponsive, e.to_string(), Value::Null)
        }
    }
}
