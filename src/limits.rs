//! The process's resource limits the host depends on: the open-file limit, raised at start
//! (soft to hard) so that thousands of WebSocket subscribers, IPC clients and agents' pipes
//! fit, and reported in `host.status` (`limits`). Nothing else in the crate calls `setrlimit`.

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use serde::Serialize;

/// `RLIMIT_NOFILE` as it stands: `host.status` shows it as `limits.open_files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OpenFiles {
    pub soft: u64,
    pub hard: u64,
}

/// What `host.status` shows of the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub open_files: Option<OpenFiles>,
}

#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error("getrlimit(RLIMIT_NOFILE): {0}")]
    Read(nix::Error),
    #[error("setrlimit(RLIMIT_NOFILE, {soft} -> {hard}): {source}")]
    Raise {
        soft: u64,
        hard: u64,
        #[source]
        source: nix::Error,
    },
}

/// The open-file limit now in force.
pub fn open_files() -> Result<OpenFiles, LimitError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(LimitError::Read)?;
    Ok(OpenFiles { soft, hard })
}

/// The limits now in force, for `host.status`.
pub fn current() -> Limits {
    Limits {
        open_files: open_files().ok(),
    }
}

/// Raise this process's soft open-file limit to its hard limit (many desktops start
/// processes with a soft limit of 1024; each subscriber's connection is a descriptor).
/// Returns the limit before and after; a failure leaves the limit as it was.
pub fn raise_open_files() -> Result<(OpenFiles, OpenFiles), LimitError> {
    let before = open_files()?;
    // An unlimited (or huge) hard limit is not a soft limit the kernel takes: Linux refuses
    // one above `fs.nr_open`. Go as far as the kernel allows.
    let target = before.hard.min(kernel_cap());
    if before.soft >= target {
        return Ok((before, before));
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, before.hard).map_err(|source| {
        LimitError::Raise {
            soft: before.soft,
            hard: target,
            source,
        }
    })?;
    Ok((before, open_files()?))
}

/// The most descriptors one process may have whatever its limits say (`fs.nr_open` on
/// Linux; elsewhere, or unreadable, a conservative 10,240: macOS's `OPEN_MAX`).
pub fn kernel_cap() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(10_240)
}

/// [`raise_open_files`] at host start, logged: what it was, what it is now, or why not.
pub fn raise_open_files_logged() {
    match raise_open_files() {
        Ok((before, after)) if before != after => tracing::info!(
            from = before.soft,
            to = after.soft,
            hard = after.hard,
            "raised the soft open-files limit to the hard one"
        ),
        Ok((_, now)) => tracing::info!(
            soft = now.soft,
            hard = now.hard,
            "the open-files limit is already at its hard limit"
        ),
        Err(e) => tracing::warn!(error = %e, "the open-files limit could not be raised"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_ends_at_the_hard_limit() {
        let (before, after) = raise_open_files().unwrap();
        assert_eq!(after.soft, after.hard);
        assert_eq!(before.hard, after.hard);
        assert_eq!(current().open_files, Some(after));
    }
}
