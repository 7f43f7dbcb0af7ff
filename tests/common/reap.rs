//! Never leak a daemon: a test's host still holding its home's lock is killed by the pid it
//! wrote there (a test that fails before its shutdown leaves it running otherwise).

use std::path::Path;

use agent_host::instance::{lock_held, read_lock_info};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// SIGKILL the host holding `lock` (a home's `host.lock`), if one does.
pub fn kill_lock_holder(lock: &Path) {
    if matches!(lock_held(lock), Ok(true))
        && let Some(info) = read_lock_info(lock)
        && let Ok(raw) = i32::try_from(info.pid)
    {
        let _gone = kill(Pid::from_raw(raw), Signal::SIGKILL);
    }
}
