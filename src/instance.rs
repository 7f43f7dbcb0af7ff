//! The single-instance rule (design §3): `host.lock` holds `{pid, version, ipc_path, ws_port,
//! started_at}` and an exclusive advisory lock (`flock`) for the host's whole life.
//!
//! - The kernel drops the lock when its holder dies, so a file left by a killed host is
//!   "stale" exactly when its lock is free; the next host takes it over and rewrites it.
//! - A loser of the race reads the winner's pid from the file; the winner writes it right after
//!   locking, so the loser retries its read briefly rather than report a pid it has not seen.
//! - Only the lock holder may remove a leftover socket file ([`InstanceLock`] is proof of that).
//! - Nothing here decides liveness by pid alone: a pid is only reported, the lock is the truth.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// The contents of `host.lock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub pid: u32,
    pub version: String,
    pub ipc_path: String,
    pub ws_port: Option<u16>,
    /// RFC 3339, UTC.
    pub started_at: String,
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("a host is already running (pid {pid:?})")]
    AlreadyRunning { pid: Option<u32> },
    #[error("lock file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How long a loser waits for the winner to write its pid (or a prober to let go).
const CONTENTION_WINDOW: Duration = Duration::from_secs(2);

/// Proof that this process is the one host. Dropping it empties the file and releases the lock.
#[derive(Debug)]
pub struct InstanceLock {
    lock: Option<Flock<File>>,
    path: PathBuf,
    info: LockInfo,
}

impl InstanceLock {
    /// Take the lock or report who holds it.
    pub fn acquire(path: &Path, info: LockInfo) -> Result<InstanceLock, InstanceError> {
        let io_err = |source| InstanceError::Io {
            path: path.to_owned(),
            source,
        };
        let deadline = Instant::now() + CONTENTION_WINDOW;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(io_err)?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    let mut me = InstanceLock {
                        lock: Some(lock),
                        path: path.to_owned(),
                        info,
                    };
                    me.write_info().map_err(io_err)?;
                    return Ok(me);
                }
                Err((file, Errno::EWOULDBLOCK)) => {
                    // Busy. A host holds it exclusively; a prober (`lock_held`,
                    // `wait_released`) only ever holds it shared, for an instant.
                    let exclusive = matches!(
                        Flock::lock(file, FlockArg::LockSharedNonblock),
                        Err((_, Errno::EWOULDBLOCK))
                    );
                    let named = read_lock_info(path).map(|i| i.pid);
                    let live = named.filter(|pid| pid_alive(*pid) && *pid != std::process::id());
                    if exclusive && live.is_some() {
                        return Err(InstanceError::AlreadyRunning { pid: live });
                    }
                    if Instant::now() >= deadline {
                        return Err(InstanceError::AlreadyRunning {
                            pid: live.or(named),
                        });
                    }
                    // A winner that has not written its pid yet, or a prober: look again.
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err((_, errno)) => return Err(io_err(io::Error::from(errno))),
            }
        }
    }

    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// Rewrite the file, e.g. once the WebSocket port is known.
    pub fn update(&mut self, info: LockInfo) -> io::Result<()> {
        self.info = info;
        self.write_info()
    }

    fn write_info(&mut self) -> io::Result<()> {
        let Some(lock) = self.lock.as_mut() else {
            return Err(io::Error::other("lock already released"));
        };
        let text = serde_json::to_string(&self.info).map_err(io::Error::other)?;
        let file: &mut File = lock;
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(text.as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_data()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            // Empty the file while still holding the lock, so nobody reads a dead host's pid.
            let file: &File = &lock;
            if let Err(e) = file.set_len(0) {
                tracing::warn!(error = %e, "could not empty host.lock");
            }
            if let Err((_, e)) = lock.unlock() {
                tracing::warn!(error = %e, "could not release host.lock");
            }
        }
    }
}

/// Read `host.lock` without locking; `None` if missing, empty or not ours.
pub fn read_lock_info(path: &Path) -> Option<LockInfo> {
    let mut text = String::new();
    File::open(path).ok()?.read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}

/// Whether a process with this pid exists and has not exited (signal 0 probes without
/// sending; a zombie, dead but not yet reaped, does not count).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    let exists = match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) | Err(Errno::EPERM) => true,
        Err(_) => false,
    };
    exists && !is_zombie(pid)
}

/// `/proc/<pid>/stat` names the state after the parenthesised command: `Z` for a zombie.
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|state| state == "Z")
        })
        .unwrap_or(false)
}

/// Whether some process holds the lock right now. Takes a *shared* lock for an instant, so it
/// never looks like a competing host to one that is starting (that one wants exclusive and
/// retries within its contention window).
pub fn lock_held(path: &Path) -> io::Result<bool> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_released_on_drop) => Ok(false),
        Err((_, Errno::EWOULDBLOCK)) => Ok(true),
        Err((_, errno)) => Err(io::Error::from(errno)),
    }
}

/// Block (on a helper thread) until the lock is free or `timeout` passes; `true` if free.
pub async fn wait_released(path: &Path, timeout: Duration) -> bool {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(_) => return true,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A blocking flock wakes exactly when the holder lets go; no polling. If we time out the
    // thread stays parked until the lock is released, which is harmless in the CLI.
    std::thread::spawn(move || {
        let freed = Flock::lock(file, FlockArg::LockShared).is_ok();
        let _caller_gone = tx.send(freed);
    });
    matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32) -> LockInfo {
        LockInfo {
            pid,
            version: "t".into(),
            ipc_path: "/x".into(),
            ws_port: None,
            started_at: "now".into(),
        }
    }

    #[test]
    fn second_acquire_in_same_process_is_refused_then_free_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.lock");
        // A pid of a live process that is not us: our parent.
        let parent = std::os::unix::process::parent_id();
        let first = InstanceLock::acquire(&path, info(parent)).unwrap();
        assert_eq!(read_lock_info(&path), Some(info(parent)));
        assert!(lock_held(&path).unwrap());
        match InstanceLock::acquire(&path, info(1)) {
            Err(InstanceError::AlreadyRunning { pid }) => assert_eq!(pid, Some(parent)),
            other => panic!("expected already_running, got {other:?}"),
        }
        drop(first);
        assert!(!lock_held(&path).unwrap());
        assert_eq!(read_lock_info(&path), None);
        let again = InstanceLock::acquire(&path, info(std::process::id())).unwrap();
        assert_eq!(again.info().pid, std::process::id());
    }

    #[test]
    fn a_shared_prober_does_not_make_a_start_fail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.lock");
        // The file names a live process (our parent) but nobody holds it exclusively.
        std::fs::write(
            &path,
            serde_json::to_string(&info(std::os::unix::process::parent_id())).unwrap(),
        )
        .unwrap();
        let prober = Flock::lock(File::open(&path).unwrap(), FlockArg::LockSharedNonblock).unwrap();
        let releaser = std::thread::spawn(move || {
            // Hold the shared lock across the starter's first attempts, then let go.
            std::thread::sleep(Duration::from_millis(100));
            drop(prober);
        });
        let lock = InstanceLock::acquire(&path, info(std::process::id())).unwrap();
        assert_eq!(read_lock_info(&path).unwrap().pid, std::process::id());
        releaser.join().unwrap();
        drop(lock);
    }

    #[test]
    fn own_process_is_alive_and_not_a_zombie() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(u32::MAX));
    }

    #[test]
    fn stale_file_without_lock_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.lock");
        std::fs::write(&path, serde_json::to_string(&info(999_999)).unwrap()).unwrap();
        let lock = InstanceLock::acquire(&path, info(std::process::id())).unwrap();
        assert_eq!(read_lock_info(&path).unwrap().pid, std::process::id());
        drop(lock);
    }
}
