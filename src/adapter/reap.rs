//! Ending what agents leave behind (design §9: no descendant of an agent outlives its close,
//! its death, or the host). Killing the agent's process group is not enough: a tool may run in
//! its own group or session (Claude Code's Bash tool does), so when the agent goes, the tool
//! and what it started in the background live on with another parent.
//!
//! Two ways find such a process, both from `/proc`:
//! - **markers**: every process [`spawn`](super::spawn) starts carries `AGENTHOST_OWNED=1`,
//!   `AGENTHOST_SPAWN_ID` (unique per agent process within this host process) and, for a
//!   session's agent, `AGENTHOST_HOME` (the canonical home, one per instance) and
//!   `AGENTHOST_SESSION_ID`. Tools inherit them. A close ends every process with its spawn id
//!   ([`kill_marked`]); a host at start ends every process with its home's marker
//!   ([`end_leftovers`]): it holds the instance lock, so the host that started them is dead.
//! - **the tree**: a walk of parent pids from the agent ([`Tree`]), taken while the agent still
//!   lives (once it died, its children have a new parent), for what cleared its environment.
//!
//! A binary host owns its whole process, so it also becomes a child subreaper
//! ([`adopt_orphans`]): orphans of its agents are re-parented to it rather than to init, it
//! reaps their zombies, and at shutdown it ends the adopted ones still running
//! ([`end_adopted`]). It never waits on a pid that `tokio::process` owns (that would steal the
//! exit status an agent's driver waits for): the agent leaders are registered from before the
//! fork until they are reaped ([`spawn_registered`]), and only unregistered zombie children are
//! waited for, by pid. An embedded host (tests, benchmarks) shares its process with code that
//! owns other children, so it does neither; the marker sweeps still run.
//!
//! `/proc` is data from outside: a process that vanished mid-read is normal and skipped, a
//! line that does not parse is skipped. Logs name pids and which marker matched, never the
//! values of an environment (they may hold secrets). Reading `/proc` is a few milliseconds of
//! synchronous file reads, done where a process is being stopped anyway.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

/// Every process a host starts carries it; tools inherit it.
pub const OWNED_VAR: &str = "AGENTHOST_OWNED";
/// The host session an agent process serves.
pub const SESSION_VAR: &str = "AGENTHOST_SESSION_ID";
/// The instance (its canonical home directory) that started the process.
pub const HOME_VAR: &str = "AGENTHOST_HOME";
/// One agent process and everything it starts: `<host pid>.<n>`.
pub const SPAWN_VAR: &str = "AGENTHOST_SPAWN_ID";

/// What marks the processes of one host home: its canonical path (the same home reached by
/// another path is the same instance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeMarker(String);

impl HomeMarker {
    /// The marker of `home` (canonical when it exists, as it does once the host started).
    pub fn of(home: &Path) -> HomeMarker {
        let path = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_owned());
        HomeMarker(path.display().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A new spawn id, unique within this process (several embedded hosts share the counter).
pub fn next_spawn_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy)]
struct Stat {
    pid: i32,
    ppid: i32,
    pgrp: i32,
    zombie: bool,
    /// Clock ticks after boot: with the pid, names one process even when pids are reused.
    start_time: u64,
}

fn stat_of(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields start after the last ')'.
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state(3) ppid(4) … starttime(22), numbered from 1 with pid first.
    Some(Stat {
        pid,
        zombie: *fields.first()? == "Z",
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// The pids `/proc` lists now.
fn pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

fn stats() -> Vec<Stat> {
    pids().into_iter().filter_map(stat_of).collect()
}

/// The entries of a process's initial environment (`NAME=value`), or nothing if it is gone,
/// a zombie, or not ours to read.
fn environ_of(pid: i32) -> Vec<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .filter(|e| !e.is_empty())
                .map(<[u8]>::to_vec)
                .collect()
        })
        .unwrap_or_default()
}

fn entry(name: &str, value: &str) -> Vec<u8> {
    format!("{name}={value}").into_bytes()
}

/// This process and its ancestors: never killed, whatever they carry (a host started from an
/// agent's tool carries that agent's markers).
fn spared() -> BTreeSet<i32> {
    let mut spared = BTreeSet::new();
    let by_pid: HashMap<i32, Stat> = stats().into_iter().map(|s| (s.pid, s)).collect();
    let mut pid = i32::try_from(std::process::id()).unwrap_or(0);
    while pid > 0 && spared.insert(pid) {
        pid = by_pid.get(&pid).map_or(0, |s| s.ppid);
    }
    spared
}

fn sigkill(pid: i32) -> bool {
    kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
}

/// The descendants of one process, with their start times, as they were when taken.
#[derive(Debug, Default)]
pub struct Tree(Vec<(i32, u64)>);

impl Tree {
    /// Every living descendant of `root` (not `root` itself), from one `/proc` snapshot.
    pub fn of(root: i32) -> Tree {
        let all = stats();
        let mut children: HashMap<i32, Vec<Stat>> = HashMap::new();
        for s in all.iter().filter(|s| !s.zombie) {
            children.entry(s.ppid).or_default().push(*s);
        }
        let mut found = Vec::new();
        let mut todo = vec![root];
        while let Some(pid) = todo.pop() {
            for child in children.remove(&pid).unwrap_or_default() {
                found.push((child.pid, child.start_time));
                todo.push(child.pid);
            }
        }
        Tree(found)
    }

    /// Add what `other` found that this does not hold yet.
    pub fn merge(&mut self, other: Tree) {
        for p in other.0 {
            if !self.0.contains(&p) {
                self.0.push(p);
            }
        }
    }

    /// SIGKILL every process of the snapshot that is still the same process (same start
    /// time: a pid reused since is left alone); the pids killed.
    pub fn kill(&self) -> Vec<i32> {
        let spared = spared();
        self.0
            .iter()
            .filter(|(pid, start)| {
                !spared.contains(pid)
                    && stat_of(*pid).is_some_and(|s| !s.zombie && s.start_time == *start)
            })
            .filter(|(pid, _)| sigkill(*pid))
            .map(|(pid, _)| *pid)
            .collect()
    }
}

/// The living (not zombie) members of process group `pgid`, from one `/proc` snapshot.
pub fn group_members(pgid: i32) -> Vec<i32> {
    stats()
        .into_iter()
        .filter(|s| s.pgrp == pgid && !s.zombie)
        .map(|s| s.pid)
        .collect()
}

/// Resolves once every process of `pids` has exited (a zombie has: it holds nothing but its
/// pid), or after `bound`, whichever is first; the pids still running then. SIGKILL is
/// delivered asynchronously: a killed node process tearing down its threads and heap may run
/// for a while after the signal, so whoever says "the agent is gone" waits for this.
pub async fn exited(pids: &[i32], bound: std::time::Duration) -> Vec<i32> {
    let waits: Vec<_> = pids.iter().map(|&pid| exit_of(pid)).collect();
    let all = futures_util::future::join_all(waits);
    if tokio::time::timeout(bound, all).await.is_ok() {
        return Vec::new();
    }
    pids.iter()
        .copied()
        .filter(|&pid| stat_of(pid).is_some_and(|s| !s.zombie))
        .collect()
}

/// Resolves when `pid` exits (its pidfd turns readable then), or at once if it is gone or
/// cannot be watched.
#[allow(
    unsafe_code,
    reason = "pidfd_open has no safe wrapper in our dependencies; the fd is owned at once"
)]
pub fn exit_of(pid: i32) -> impl std::future::Future<Output = ()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: a plain syscall with integer arguments; on success the returned fd is new and
    // owned by nobody else, so `OwnedFd` may take it.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd)
        .ok()
        .filter(|fd| *fd >= 0)
        // SAFETY: as above: a fresh fd owned by nobody else.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    // SAFETY: the fd is owned here, open, and registered with the reactor only once.
    let fd = fd.and_then(|fd| unsafe { tokio::io::unix::AsyncFd::register(fd) }.ok());
    async move {
        if let Some(fd) = fd {
            let _ready = fd.readable().await;
        }
    }
}

/// SIGKILL every living process that carries `AGENTHOST_OWNED=1` and `AGENTHOST_SPAWN_ID=id`
/// (what one agent process started); the pids killed.
pub fn kill_marked(spawn_id: &str) -> Vec<i32> {
    let wanted = [entry(OWNED_VAR, "1"), entry(SPAWN_VAR, spawn_id)];
    kill_where(|env| wanted.iter().all(|w| env.contains(w)))
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn kill_where(matches: impl Fn(&[Vec<u8>]) -> bool) -> Vec<(i32, Vec<Vec<u8>>)> {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut keep: Option<BTreeSet<i32>> = None;
    let mut killed = Vec::new();
    for pid in pids() {
        if pid == me {
            continue;
        }
        let env = environ_of(pid);
        if env.is_empty() || !matches(&env) {
            continue;
        }
        // Worked out only when something matched (rarely): a walk of all of /proc.
        if keep.get_or_insert_with(spared).contains(&pid) {
            continue;
        }
        if sigkill(pid) {
            killed.push((pid, env));
        }
    }
    killed
}

/// At host start, with the instance lock held: end every process a dead instance of the same
/// home left (its marker is this home's), saying so in the log. The pids ended.
pub fn end_leftovers(home: &HomeMarker) -> Vec<i32> {
    let wanted = [entry(OWNED_VAR, "1"), entry(HOME_VAR, home.as_str())];
    let session_prefix = format!("{SESSION_VAR}=").into_bytes();
    let ended = kill_where(|env| wanted.iter().all(|w| env.contains(w)));
    for (pid, env) in &ended {
        // The session id is the host's own identifier (it is in every log line of a
        // session), the only value of the environment logged.
        let session = env
            .iter()
            .find_map(|e| e.strip_prefix(session_prefix.as_slice()))
            .map(|s| String::from_utf8_lossy(s).into_owned());
        let command = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_owned())
            .unwrap_or_default();
        tracing::warn!(
            pid,
            session_id = session.as_deref().unwrap_or("-"),
            command,
            "ended a process a previous host of this home left running (it carries this home's AGENTHOST_HOME and AGENTHOST_OWNED markers)"
        );
    }
    ended.into_iter().map(|(pid, _)| pid).collect()
}

/// Agent leaders `tokio::process` owns: from before their fork until they are reaped. A
/// process-wide fact (children belong to the process, not to one host), hence a static.
static LEADERS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn leaders() -> MutexGuard<'static, BTreeSet<i32>> {
    LEADERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Spawn `cmd` with its pid registered as owned before anyone can wait for it: the orphan
/// reaper holds the same lock while it waits, so even a child that fails to exec (which the
/// standard library itself waits for inside `spawn`) is never taken from its owner.
pub fn spawn_registered(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let mut leaders = leaders();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        leaders.insert(pid);
    }
    Ok(child)
}

/// The leader `pid` was reaped by its owner: an orphan may get the pid from now on.
pub fn unregister(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        leaders().remove(&pid);
    }
}

/// Wait for every zombie child of this process that no one owns (an adopted orphan); the pids.
fn reap_orphans() -> Vec<i32> {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let zombies: Vec<i32> = stats()
        .into_iter()
        .filter(|s| s.ppid == me && s.zombie)
        .map(|s| s.pid)
        .collect();
    if zombies.is_empty() {
        return zombies;
    }
    let owned = leaders();
    zombies
        .into_iter()
        .filter(|pid| !owned.contains(pid))
        .filter(|pid| {
            matches!(
                waitpid(Pid::from_raw(*pid), Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
            )
        })
        .collect()
}

/// Make this process a child subreaper and reap the orphans it adopts (on every SIGCHLD) until
/// `cancel`. Only for a process that is wholly a host: see the module header.
pub fn adopt_orphans(cancel: CancellationToken) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    become_subreaper()?;
    let mut children = signal(SignalKind::child())?;
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                got = children.recv() => if got.is_none() { break },
            }
            let reaped = reap_orphans();
            if !reaped.is_empty() {
                tracing::debug!(?reaped, "reaped adopted orphans");
            }
        }
    }))
}

#[cfg(target_os = "linux")]
fn become_subreaper() -> std::io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)
}

/// Elsewhere orphans go to init, and only the marker sweeps end them.
#[cfg(not(target_os = "linux"))]
fn become_subreaper() -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// At shutdown, once every agent is closed: end the adopted orphans still running (children of
/// this process no one owns, and what they started), marked or not; the pids ended.
pub fn end_adopted() -> Vec<i32> {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let adopted: Vec<Stat> = {
        let owned = leaders();
        stats()
            .into_iter()
            .filter(|s| s.ppid == me && !s.zombie && !owned.contains(&s.pid))
            .collect()
    };
    let mut tree = Tree::default();
    for s in &adopted {
        // The descendants first (taken while their parent still lives), then the orphan.
        tree.merge(Tree::of(s.pid));
        tree.0.push((s.pid, s.start_time));
    }
    let ended = tree.kill();
    for pid in &ended {
        tracing::warn!(
            pid,
            "ended a process an agent left running, at host shutdown"
        );
    }
    // Those already gone are reaped now; the rest are the zombies of a process about to exit,
    // which init reaps.
    let _reaped = reap_orphans();
    ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::spawn::{SpawnSpec, filter_env, spawn};
    use std::time::Duration;

    fn marked(var: &str, value: &str) -> Vec<i32> {
        let wanted = entry(var, value);
        pids()
            .into_iter()
            .filter(|pid| stat_of(*pid).is_some_and(|s| !s.zombie))
            .filter(|pid| environ_of(*pid).contains(&wanted))
            .collect()
    }

    async fn until_none(var: &str, value: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let left = marked(var, value);
            if left.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "still running with {var}={value}: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn spec(script: &str, session: &str, home: &HomeMarker) -> SpawnSpec {
        SpawnSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: "/".into(),
            base_env: filter_env([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
            extra_env: Vec::new(),
            session_id: Some(session.into()),
            home: Some(home.clone()),
            label: "reap test".into(),
        }
    }

    /// `sh` starts two sleeps in a new session each (as a tool does): the group kill misses
    /// them, the marker sweep does not.
    const ESCAPING: &str = "setsid sleep 300 & setsid sleep 301 & echo started; wait";

    async fn started(child: &mut crate::adapter::spawn::Spawned, session: &str) {
        let mut out = String::new();
        let stdout = child.stdout.as_mut().unwrap();
        let mut byte = [0u8; 1];
        while !out.ends_with('\n') {
            let n = tokio::io::AsyncReadExt::read(stdout, &mut byte)
                .await
                .unwrap();
            assert_ne!(n, 0, "the script ended early");
            out.push(char::from(byte[0]));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while marked(SESSION_VAR, session).len() < 3 {
            assert!(tokio::time::Instant::now() < deadline, "sleeps not started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn stop_ends_what_left_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let home = HomeMarker::of(dir.path());
        let session = format!("reap-stop-{}", std::process::id());
        let mut child = spawn(&spec(ESCAPING, &session, &home)).unwrap();
        started(&mut child, &session).await;
        child.stop(Duration::from_millis(200)).await.unwrap();
        until_none(SESSION_VAR, &session).await;
    }

    #[tokio::test]
    async fn a_dead_agent_takes_its_escaped_tools_along() {
        let dir = tempfile::tempdir().unwrap();
        let home = HomeMarker::of(dir.path());
        let session = format!("reap-death-{}", std::process::id());
        let mut child = spawn(&spec(ESCAPING, &session, &home)).unwrap();
        started(&mut child, &session).await;
        // The agent dies by itself; its exit watch (`wait`) ends the rest.
        assert!(sigkill(child.pid().unwrap() as i32));
        child.wait().await.unwrap();
        until_none(SESSION_VAR, &session).await;
    }

    #[tokio::test]
    async fn the_start_sweep_ends_only_its_own_homes_processes() {
        let dir = tempfile::tempdir().unwrap();
        let (home, other) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let (home, other) = (HomeMarker::of(&home), HomeMarker::of(&other));
        let mine = format!("reap-mine-{}", std::process::id());
        let theirs = format!("reap-theirs-{}", std::process::id());
        let mut left = spawn(&spec(ESCAPING, &mine, &home)).unwrap();
        let mut live = spawn(&spec(ESCAPING, &theirs, &other)).unwrap();
        started(&mut left, &mine).await;
        started(&mut live, &theirs).await;
        let ended = end_leftovers(&home);
        assert_eq!(ended.len(), 3, "{ended:?}");
        until_none(SESSION_VAR, &mine).await;
        assert_eq!(marked(SESSION_VAR, &theirs).len(), 3);
        left.wait().await.unwrap();
        live.stop(Duration::ZERO).await.unwrap();
        until_none(SESSION_VAR, &theirs).await;
    }

    #[test]
    fn a_tree_is_taken_from_proc() {
        let me = i32::try_from(std::process::id()).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let tree = Tree::of(me);
        assert!(
            tree.0.iter().any(|(pid, _)| *pid == child.id() as i32),
            "{tree:?}"
        );
        // This process itself is spared, whatever the snapshot holds.
        let with_me = Tree(vec![(me, stat_of(me).unwrap().start_time)]);
        assert!(with_me.kill().is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
