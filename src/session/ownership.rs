//! Who else writes a session's native file (design §8): **when in doubt, fork; never write a
//! file someone else writes.**
//!
//! - [`Baseline`]: what the file looked like at the host's last clean turn end (device, inode,
//!   size, line count, last entry id, mtime). Any difference before a cold resume — grown,
//!   shrunk, replaced, torn — means someone else wrote it.
//! - [`holders`]: the processes that have the file open right now (Linux: `/proc/*/fd`),
//!   other than the host's own children.
//! - [`OwnedPid`]: a child the host spawned, identified by pid *and* start time, so a recycled
//!   pid is never taken for ours.
//! - [`decide`]: the one rule that turns those facts into resume-in-place or fork.
//!
//! Everything here reads the file system and `/proc`; nothing writes.

use std::io::BufRead;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The shape of a session file at a clean turn end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Baseline {
    pub path: PathBuf,
    pub dev: u64,
    pub inode: u64,
    pub size: u64,
    pub line_count: u64,
    /// The `uuid` (Claude) of the last complete entry, or its whole text's hash when it has
    /// none.
    pub last_entry_id: Option<String>,
    pub mtime_ns: i64,
}

impl Baseline {
    /// Read a file's baseline now.
    pub fn read(path: &Path) -> std::io::Result<Baseline> {
        let meta = std::fs::metadata(path)?;
        let file = std::io::BufReader::new(std::fs::File::open(path)?);
        let mut line_count = 0u64;
        let mut last = None;
        for line in file.split(b'\n') {
            let line = line?;
            if line.is_empty() {
                continue;
            }
            line_count += 1;
            last = Some(line);
        }
        let last_entry_id = last.map(|line| entry_id(&line));
        Ok(Baseline {
            path: path.to_owned(),
            dev: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            line_count,
            last_entry_id,
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        })
    }

    /// Why `now` is not this baseline, if it is not.
    pub fn changed(&self, now: &Baseline) -> Option<String> {
        if (self.dev, self.inode) != (now.dev, now.inode) {
            return Some("the session file was replaced".to_owned());
        }
        if now.size < self.size {
            return Some(format!(
                "the session file shrank from {} to {} bytes",
                self.size, now.size
            ));
        }
        if now.size > self.size || now.line_count != self.line_count {
            return Some(format!(
                "the session file grew by {} bytes ({} lines) outside the host",
                now.size - self.size,
                now.line_count.saturating_sub(self.line_count)
            ));
        }
        if now.last_entry_id != self.last_entry_id || now.mtime_ns != self.mtime_ns {
            return Some("the session file was rewritten".to_owned());
        }
        None
    }
}

impl Baseline {
    /// As the store keeps it.
    pub fn to_stored(&self) -> crate::store::StoredBaseline {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        crate::store::StoredBaseline {
            file_path: self.path.to_string_lossy().into_owned(),
            dev: int(self.dev),
            inode: int(self.inode),
            size: int(self.size),
            line_count: int(self.line_count),
            last_entry_id: self.last_entry_id.clone(),
            mtime_ns: self.mtime_ns,
        }
    }

    pub fn from_stored(s: &crate::store::StoredBaseline) -> Baseline {
        let uint = |v: i64| u64::try_from(v).unwrap_or(0);
        Baseline {
            path: PathBuf::from(&s.file_path),
            dev: uint(s.dev),
            inode: uint(s.inode),
            size: uint(s.size),
            line_count: uint(s.line_count),
            last_entry_id: s.last_entry_id.clone(),
            mtime_ns: s.mtime_ns,
        }
    }
}

/// A line's entry id: its `uuid`, else a hash of the line.
fn entry_id(line: &[u8]) -> String {
    serde_json::from_slice::<Value>(line)
        .ok()
        .and_then(|v| v.get("uuid").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| {
            // FNV-1a: stable across runs, enough to tell two lines apart.
            let hash = line.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            });
            format!("fnv:{hash:016x}")
        })
}

/// A process the host spawned: its pid and the kernel's start time of that pid (clock ticks
/// since boot), which a recycled pid does not share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedPid {
    pub pid: u32,
    pub start_time: u64,
}

impl OwnedPid {
    /// Identify a running process; `None` if it is gone.
    pub fn of(pid: u32) -> Option<OwnedPid> {
        start_time(pid).map(|start_time| OwnedPid { pid, start_time })
    }

    /// Whether the pid still names this very process.
    pub fn is_alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }
}

/// Fields of `/proc/<pid>/stat` after the command name (which may hold spaces and
/// parentheses): `n` = 0 is the state, 2 the process group, 19 the start time.
fn stat_field(pid: u32, n: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n)?.parse().ok()
}

/// When the process started (clock ticks since boot).
fn start_time(pid: u32) -> Option<u64> {
    stat_field(pid, 19)
}

/// Whether `pid` is one of ours: an owned process, or in an owned process's group (agents
/// are group leaders; a CLI's launcher runs the real binary as its child).
fn is_ours(pid: u32, ours: &[OwnedPid]) -> bool {
    let live: Vec<&OwnedPid> = ours.iter().filter(|o| o.is_alive()).collect();
    if live.iter().any(|o| o.pid == pid) {
        return true;
    }
    stat_field(pid, 2).is_some_and(|pgid| live.iter().any(|o| u64::from(o.pid) == pgid))
}

/// Processes that have `path` open, other than `ours` (and the host itself).
pub fn holders(path: &Path, ours: &[OwnedPid]) -> Vec<u32> {
    let Ok(target) = path.canonicalize() else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me || is_ours(pid, ours) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == target))
        {
            found.push(pid);
        }
    }
    found
}

/// Live CLIs that Claude's own registry (`<config>/sessions/<pid>.json`, written by each
/// running CLI) names for this session, other than `ours`.
pub fn claude_registry_holders(config_dir: &Path, native_id: &str, ours: &[OwnedPid]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(config_dir.join("sessions")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            let pid = u32::try_from(v.get("pid")?.as_u64()?).ok()?;
            (v.get("sessionId")?.as_str()? == native_id).then_some(pid)
        })
        .filter(|pid| start_time(*pid).is_some())
        .filter(|pid| !is_ours(*pid, ours))
        .collect()
}

/// What to do with a session before the host (re)opens its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody else touched it: continue the same native session.
    ResumeInPlace,
    /// Someone else has or had it: continue in a fork, for this reason.
    Fork(String),
}

/// The rule. `baseline` is the host's record at its last clean turn end (`None`: the host
/// never finished a turn in it); `now` the file as it is (`None`: no file found); `holders`
/// the foreign processes that have it open or claim it.
pub fn decide(baseline: Option<&Baseline>, now: Option<&Baseline>, holders: &[u32]) -> Verdict {
    if let Some(pid) = holders.first() {
        return Verdict::Fork(format!("another process (pid {pid}) has the session open"));
    }
    match (baseline, now) {
        (Some(base), Some(now)) => match base.changed(now) {
            Some(why) => Verdict::Fork(why),
            None => Verdict::ResumeInPlace,
        },
        // The host never finished a turn here: it cannot tell whose the file is.
        (None, Some(_)) => Verdict::Fork("the host never owned this session file".to_owned()),
        // No file: nothing to protect; the agent decides (a missing session is
        // `resume_rejected`).
        (_, None) => Verdict::ResumeInPlace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(path: &Path, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }

    #[test]
    fn a_baseline_notices_growth_shrinking_replacement_and_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        append(&path, r#"{"type":"user","uuid":"u1"}"#);
        append(&path, r#"{"type":"assistant","uuid":"a1"}"#);
        let base = Baseline::read(&path).unwrap();
        assert_eq!(base.line_count, 2);
        assert_eq!(base.last_entry_id.as_deref(), Some("a1"));
        assert_eq!(base.changed(&Baseline::read(&path).unwrap()), None);
        assert_eq!(
            decide(Some(&base), Some(&base), &[]),
            Verdict::ResumeInPlace
        );

        append(&path, r#"{"type":"user","uuid":"u2"}"#);
        let grown = Baseline::read(&path).unwrap();
        assert!(base.changed(&grown).unwrap().contains("grew"));
        assert!(matches!(
            decide(Some(&base), Some(&grown), &[]),
            Verdict::Fork(_)
        ));

        // Replaced by a copy with the same bytes: another inode.
        let copy = dir.path().join("copy");
        std::fs::copy(&path, &copy).unwrap();
        let before = Baseline::read(&path).unwrap();
        std::fs::rename(&copy, &path).unwrap();
        assert!(
            before
                .changed(&Baseline::read(&path).unwrap())
                .unwrap()
                .contains("replaced")
        );

        // A torn last line (no uuid) still has an id.
        std::fs::write(&path, "{\"uuid\":\"u1\"}\n{\"tor").unwrap();
        let torn = Baseline::read(&path).unwrap();
        assert!(torn.last_entry_id.unwrap().starts_with("fnv:"));

        // Never owned: fork; no file: nothing to protect.
        assert!(matches!(decide(None, Some(&grown), &[]), Verdict::Fork(_)));
        assert_eq!(decide(None, None, &[]), Verdict::ResumeInPlace);
        assert!(matches!(
            decide(Some(&base), Some(&base), &[42]),
            Verdict::Fork(_)
        ));
    }

    #[test]
    fn holders_are_found_through_proc_and_our_own_children_are_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("held.jsonl");
        std::fs::write(&path, "x\n").unwrap();
        // The child opens the file, then says so.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec 3<\"$0\"; echo ready; read never")
            .arg(&path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(ready.trim(), "ready");
        assert_eq!(holders(&path, &[]), [pid]);
        let ours = OwnedPid::of(pid).unwrap();
        assert!(ours.is_alive());
        assert!(holders(&path, &[ours]).is_empty(), "our own child");
        child.kill().unwrap();
        child.wait().unwrap();
        // Gone (and possibly recycled later): the same pid with another start time is not ours.
        assert!(!ours.is_alive());
        let impostor = OwnedPid {
            pid: std::process::id(),
            start_time: 1,
        };
        assert!(
            !impostor.is_alive(),
            "a pid whose start time differs is someone else"
        );
    }

    #[test]
    fn claude_registry_names_live_holders() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sessions")).unwrap();
        let me = std::process::id();
        std::fs::write(
            dir.path().join(format!("sessions/{me}.json")),
            format!(r#"{{"pid":{me},"sessionId":"s1","cwd":"/"}}"#),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("sessions/999999999.json"),
            r#"{"pid":999999999,"sessionId":"s1"}"#,
        )
        .unwrap();
        assert_eq!(claude_registry_holders(dir.path(), "s1", &[]), [me]);
        assert!(claude_registry_holders(dir.path(), "s2", &[]).is_empty());
        let ours = OwnedPid::of(me).unwrap();
        assert!(claude_registry_holders(dir.path(), "s1", &[ours]).is_empty());
    }
}
