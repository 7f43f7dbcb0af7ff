//! Who else writes a session's native file (design §8): **when in doubt, fork; never write a
//! file someone else writes.**
//!
//! - [`Baseline`]: what the file looked like at the host's last clean turn end (device, inode,
//!   size, line count, last entry id, mtime).
//! - [`Tail`]: reads what was appended since a baseline, line by line: growth is the host's
//!   only if every line is its child's (where the family's lines say whose a prompt is), and a
//!   replaced, shrunk, rewritten or torn file never is.
//! - [`holders`]: the processes that have the file open right now (Linux: `/proc/*/fd`),
//!   other than the host's own children.
//! - [`OwnedPid`]: a child the host spawned, identified by pid *and* start time, so a recycled
//!   pid is never taken for ours.
//! - [`check`]: the one rule that turns those facts into resume-in-place or fork.
//!
//! Everything here reads the file system and `/proc`; nothing writes.

use std::io::BufRead;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::agent::{EntryReader, FileEntry};

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

/// The host's running record of a session file it owns: where it read up to, and what it found
/// there. Each [`Tail::scan`] reads only what was appended since, and says whether any of it
/// was someone else's: a prompt the host did not send (when the family's lines say whose a
/// prompt is), or any line at all (when they do not), or a replaced, shrunk or torn file.
#[derive(Debug, Clone)]
pub struct Tail {
    /// The file up to the last complete line read.
    seen: Baseline,
    entries: Option<EntryReader>,
    /// How many of the host's own prompts were read.
    own_prompts: u64,
    /// The CLI's turn ids of the host's prompts read so far: messages the CLI writes in a
    /// prompt's name (an interrupt marker) carry them.
    own_turns: std::collections::HashSet<String>,
}

impl Tail {
    /// Start reading a native session only the host knew of so far, from its first byte:
    /// prompts must be in `ours` (`None`: everything there is the host's — a fork's copy of
    /// its source's history). A partial last line is read with what follows it.
    pub fn arm(
        path: &Path,
        entries: Option<EntryReader>,
        ours: Option<&std::collections::HashSet<String>>,
    ) -> std::io::Result<Result<Tail, String>> {
        let mut tail = Tail::from_start(path, entries)?;
        Ok(match tail.read_appended(ours, false)? {
            None => Ok(tail),
            Some(why) => Err(why),
        })
    }

    /// Continue from a baseline recorded earlier. Before anything appended is read, the file
    /// must still be that file up to the baseline: same inode, not shorter, and the same
    /// entry just before the baseline's end.
    pub fn resume(
        base: Baseline,
        entries: Option<EntryReader>,
    ) -> std::io::Result<Result<Tail, String>> {
        let meta = std::fs::metadata(&base.path)?;
        let tail = Tail {
            seen: base,
            entries,
            own_prompts: 0,
            own_turns: std::collections::HashSet::new(),
        };
        if let Some(why) = tail.replaced(&meta) {
            return Ok(Err(why));
        }
        let last = last_line_before(&tail.seen.path, tail.seen.size)?;
        if last.as_deref().map(entry_id) != tail.seen.last_entry_id {
            return Ok(Err(
                "the session file was rewritten before the host's last record of it".to_owned(),
            ));
        }
        let mtime_ns = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
        if meta.size() == tail.seen.size && mtime_ns != tail.seen.mtime_ns {
            return Ok(Err("the session file was rewritten".to_owned()));
        }
        Ok(Ok(tail))
    }

    /// Read the file from its first byte on.
    fn from_start(path: &Path, entries: Option<EntryReader>) -> std::io::Result<Tail> {
        let meta = std::fs::metadata(path)?;
        Ok(Tail {
            seen: Baseline {
                path: path.to_owned(),
                dev: meta.dev(),
                inode: meta.ino(),
                size: 0,
                line_count: 0,
                last_entry_id: None,
                mtime_ns: 0,
            },
            entries,
            own_prompts: 0,
            own_turns: std::collections::HashSet::new(),
        })
    }

    /// The file as the host last read it.
    pub fn seen(&self) -> &Baseline {
        &self.seen
    }

    fn replaced(&self, meta: &std::fs::Metadata) -> Option<String> {
        if (meta.dev(), meta.ino()) != (self.seen.dev, self.seen.inode) {
            return Some("the session file was replaced".to_owned());
        }
        (meta.size() < self.seen.size).then(|| {
            format!(
                "the session file shrank from {} to {} bytes",
                self.seen.size,
                meta.size()
            )
        })
    }

    /// Read what was appended since the last scan. `Ok(None)`: all of it the host's child's;
    /// `Ok(Some(why))`: someone else wrote the file. `ours` holds the prompt ids the host sent.
    /// An incomplete last line is left for the next scan unless `complete` (the writer is
    /// gone, so a partial line is torn).
    pub fn scan(
        &mut self,
        ours: &std::collections::HashSet<String>,
        complete: bool,
    ) -> std::io::Result<Option<String>> {
        self.read_appended(Some(ours), complete)
    }

    /// [`Tail::scan`]; `ours` `None` takes every complete line as the host's.
    fn read_appended(
        &mut self,
        ours: Option<&std::collections::HashSet<String>>,
        complete: bool,
    ) -> std::io::Result<Option<String>> {
        use std::io::{Read, Seek};
        let mut file = std::fs::File::open(&self.seen.path)?;
        let meta = file.metadata()?;
        if let Some(why) = self.replaced(&meta) {
            return Ok(Some(why));
        }
        file.seek(std::io::SeekFrom::Start(self.seen.size))?;
        let mut appended = Vec::new();
        file.take(meta.size() - self.seen.size)
            .read_to_end(&mut appended)?;
        let whole = appended
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        if complete && whole < appended.len() {
            return Ok(Some(
                "the session file ends in a torn line the host's child did not finish".to_owned(),
            ));
        }
        for line in appended[..whole].split(|b| *b == b'\n') {
            if line.is_empty() {
                continue;
            }
            let foreign = match (ours, self.entries) {
                (None, _) => None,
                (Some(_), None) => Some(format!(
                    "the session file grew by {} bytes outside the host",
                    appended.len()
                )),
                (Some(ours), Some(read)) => match read(line) {
                    FileEntry::Other => None,
                    FileEntry::Prompt { id, turn } if ours.contains(&id) => {
                        self.own_prompts += 1;
                        self.own_turns.extend(turn);
                        None
                    }
                    FileEntry::Prompt {
                        turn: Some(turn), ..
                    } if self.own_turns.contains(&turn) => None,
                    FileEntry::Prompt { id, .. } => Some(format!(
                        "a prompt the host did not send (entry {id}) was written to the session \
                         file"
                    )),
                    FileEntry::Unreadable => {
                        Some("the session file has a line that is not an entry".to_owned())
                    }
                },
            };
            if foreign.is_some() {
                return Ok(foreign);
            }
            self.seen.line_count += 1;
            self.seen.last_entry_id = Some(entry_id(line));
        }
        self.seen.size += whole as u64;
        self.seen.mtime_ns = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
        Ok(None)
    }
}

/// The last non-empty line that ends at or before byte `end`, read backwards in chunks so a
/// long file is not read whole.
fn last_line_before(path: &Path, end: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    const CHUNK: u64 = 64 * 1024;
    let file = std::fs::File::open(path)?;
    // The line's pieces, last piece first.
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut pos = end;
    let mut in_line = false;
    while pos > 0 {
        let from = pos.saturating_sub(CHUNK);
        let mut buf = vec![0; usize::try_from(pos - from).unwrap_or(0)];
        file.read_exact_at(&mut buf, from)?;
        pos = from;
        if !in_line {
            while buf.last() == Some(&b'\n') {
                buf.pop();
            }
            if buf.is_empty() {
                continue;
            }
            in_line = true;
        }
        if let Some(i) = buf.iter().rposition(|b| *b == b'\n') {
            pieces.push(buf.split_off(i + 1));
            break;
        }
        pieces.push(buf);
    }
    if !in_line {
        return Ok(None);
    }
    pieces.reverse();
    Ok(Some(pieces.concat()))
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
pub fn start_time(pid: u32) -> Option<u64> {
    stat_field(pid, 19)
}

/// Whether `pid` is one of ours: an owned process, or in an owned process's group (agents
/// are group leaders; a CLI's launcher runs the real binary as its child).
pub fn is_ours(pid: u32, ours: &[OwnedPid]) -> bool {
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

/// What to do with a session before the host (re)opens its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody else touched it: continue the same native session.
    ResumeInPlace,
    /// Someone else has or had it: continue in a fork, for this reason.
    Fork(String),
}

/// The rule, before the host opens an agent on a native session that no child of its own has
/// open. `baseline`: the host's record of the file (`None`: the host never finished a turn in
/// it: then a family whose lines say whose a prompt is must show only the host's prompts in
/// the whole file); `path`: the file if it exists; `ours`: the prompt ids the host sent; `holders`: foreign
/// processes that have the file open or claim the session. Growth since the baseline is fine
/// when every line of it is the host's child's (a family whose lines say whose a prompt is);
/// anything else forks. On resume in place, the tail read up to the file's end comes back.
pub fn check(
    baseline: Option<Baseline>,
    path: Option<&Path>,
    entries: Option<EntryReader>,
    ours: &std::collections::HashSet<String>,
    holders: &[u32],
) -> (Verdict, Option<Tail>) {
    if let Some(pid) = holders.first() {
        return (
            Verdict::Fork(format!("another process (pid {pid}) has the session open")),
            None,
        );
    }
    // No file: nothing to protect; the agent decides (a missing session is `resume_rejected`).
    let Some(path) = path else {
        return (Verdict::ResumeInPlace, None);
    };
    // A baseline of another file (an earlier native session) says nothing here.
    let base = baseline.filter(|b| b.path == path);
    if base.is_none() && entries.is_none() {
        return (
            Verdict::Fork("the host never owned this session file".to_owned()),
            None,
        );
    }
    let unreadable = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            (Verdict::ResumeInPlace, None)
        } else {
            (
                Verdict::Fork(format!("the session file cannot be checked: {e}")),
                None,
            )
        }
    };
    // Without a baseline, the whole file must be the host's, line by line.
    let has_base = base.is_some();
    let resumed = match base {
        Some(base) => Tail::resume(base, entries),
        None => Tail::from_start(path, entries).map(Ok),
    };
    let mut tail = match resumed {
        Ok(Ok(tail)) => tail,
        Ok(Err(why)) => return (Verdict::Fork(why), None),
        Err(e) => return unreadable(e),
    };
    // No child of the host's writes it now: a partial last line is torn.
    match tail.scan(ours, true) {
        // Without a baseline, a file with none of the host's prompts is not its child's.
        Ok(None) if !has_base && tail.own_prompts == 0 => (
            Verdict::Fork("the host never owned this session file".to_owned()),
            None,
        ),
        Ok(None) => (Verdict::ResumeInPlace, Some(tail)),
        Ok(Some(why)) => (Verdict::Fork(why), None),
        Err(e) => unreadable(e),
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

    /// Lines as the Claude family reads them: a prompt by its uuid, else the CLI's own.
    fn claude_like(line: &[u8]) -> FileEntry {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            return FileEntry::Unreadable;
        };
        match (v["type"].as_str(), v["uuid"].as_str()) {
            (Some("user"), Some(id)) => FileEntry::Prompt {
                id: id.to_owned(),
                turn: v["promptId"].as_str().map(str::to_owned),
            },
            _ => FileEntry::Other,
        }
    }

    fn ids(ids: &[&str]) -> std::collections::HashSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    fn verdict_of(
        base: &Baseline,
        entries: Option<EntryReader>,
        ours: &[&str],
    ) -> (Verdict, Option<Tail>) {
        check(
            Some(base.clone()),
            Some(&base.path),
            entries,
            &ids(ours),
            &[],
        )
    }

    #[test]
    fn growth_is_fine_only_when_every_appended_line_is_the_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        append(&path, r#"{"type":"user","uuid":"u1"}"#);
        append(&path, r#"{"type":"assistant","uuid":"a1"}"#);
        let base = Baseline::read(&path).unwrap();
        assert_eq!(base.line_count, 2);
        assert_eq!(base.last_entry_id.as_deref(), Some("a1"));
        let reader = Some(claude_like as EntryReader);
        assert_eq!(
            verdict_of(&base, reader, &[]).0,
            Verdict::ResumeInPlace,
            "unchanged"
        );

        // The host's own prompt, its reply, an interrupt marker the CLI wrote in its name, and
        // metadata: still the host's.
        append(&path, r#"{"type":"user","uuid":"run-2","promptId":"p2"}"#);
        append(&path, r#"{"type":"assistant","uuid":"a2"}"#);
        append(&path, r#"{"type":"last-prompt"}"#);
        let (verdict, tail) = verdict_of(&base, reader, &["run-2"]);
        assert_eq!(verdict, Verdict::ResumeInPlace);
        let seen = tail.unwrap().seen().clone();
        assert_eq!(seen.line_count, 5);
        assert_eq!(seen, Baseline::read(&path).unwrap(), "the tail is the file");
        append(&path, r#"{"type":"user","uuid":"i1","promptId":"p2"}"#);
        assert_eq!(
            verdict_of(&base, reader, &["run-2"]).0,
            Verdict::ResumeInPlace
        );
        // Without a way to read lines, any growth is someone else's.
        assert!(matches!(
            verdict_of(&base, None, &["run-2"]).0,
            Verdict::Fork(why) if why.contains("grew")
        ));

        // No baseline (the host's child died in its first turn): the whole file is read.
        let (verdict, tail) = check(None, Some(&path), reader, &ids(&["u1", "run-2"]), &[]);
        assert_eq!(verdict, Verdict::ResumeInPlace);
        assert_eq!(tail.unwrap().seen().line_count, 6);

        // ... but only if it holds one of the host's prompts at all.
        let other = dir.path().join("other.jsonl");
        append(&other, r#"{"type":"assistant","uuid":"a9"}"#);
        assert!(matches!(
            check(None, Some(&other), reader, &ids(&["u1"]), &[]).0,
            Verdict::Fork(why) if why.contains("never owned")
        ));

        // A prompt the host never sent.
        append(&path, r#"{"type":"user","uuid":"typed-in-a-terminal"}"#);
        assert!(matches!(
            verdict_of(&base, reader, &["run-2"]).0,
            Verdict::Fork(why) if why.contains("typed-in-a-terminal")
        ));

        // A marker in the name of a prompt the host did not send is not the host's either.
        let path = dir.path().join("marker.jsonl");
        append(&path, r#"{"type":"user","uuid":"run-3","promptId":"p3"}"#);
        let base = Baseline::read(&path).unwrap();
        append(&path, r#"{"type":"user","uuid":"i2","promptId":"p-other"}"#);
        assert!(matches!(
            verdict_of(&base, reader, &["run-3"]).0,
            Verdict::Fork(why) if why.contains("entry i2")
        ));
    }

    #[test]
    fn replaced_shrunk_rewritten_and_torn_files_fork() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        append(&path, r#"{"type":"user","uuid":"u1"}"#);
        append(&path, r#"{"type":"assistant","uuid":"a1"}"#);
        let base = Baseline::read(&path).unwrap();
        let reader = Some(claude_like as EntryReader);
        let fork_why = |base: &Baseline| match verdict_of(base, reader, &["u1"]).0 {
            Verdict::Fork(why) => why,
            Verdict::ResumeInPlace => panic!("resumed in place"),
        };

        // Replaced by a copy with the same bytes: another inode.
        let copy = dir.path().join("copy");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::rename(&copy, &path).unwrap();
        assert!(fork_why(&base).contains("replaced"));

        let base = Baseline::read(&path).unwrap();
        // Rewritten in place: the entry before the baseline's end differs.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("a1", "b1")).unwrap();
        assert!(fork_why(&base).contains("rewritten"));

        let base = Baseline::read(&path).unwrap();
        std::fs::write(&path, r#"{"type":"user","uuid":"u1"}"#.to_owned() + "\n").unwrap();
        assert!(fork_why(&base).contains("shrank"));

        // A torn last line (the writer died mid-line), then a line glued to it.
        let base = Baseline::read(&path).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(br#"{"type":"assis"#)
            .unwrap();
        assert!(fork_why(&base).contains("torn"));
        append(&path, r#"{"type":"assistant","uuid":"a2"}"#);
        assert!(fork_why(&base).contains("not an entry"));

        // Never owned: fork; no file: nothing to protect; a holder: fork.
        let none = ids(&[]);
        assert!(matches!(
            check(None, Some(&path), None, &none, &[]).0,
            Verdict::Fork(why) if why.contains("never owned")
        ));
        assert!(matches!(
            check(None, Some(&path), reader, &none, &[]).0,
            Verdict::Fork(why) if why.contains("entry u1")
        ));
        assert_eq!(
            check(Some(base.clone()), None, reader, &none, &[]).0,
            Verdict::ResumeInPlace
        );
        assert!(matches!(
            check(Some(base.clone()), Some(&path), reader, &none, &[42]).0,
            Verdict::Fork(why) if why.contains("pid 42")
        ));
    }

    #[test]
    fn a_live_tail_reads_only_complete_appended_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        append(&path, r#"{"type":"user","uuid":"u1"}"#);
        let mut tail = Tail::arm(&path, Some(claude_like), None).unwrap().unwrap();
        let ours = ids(&["u1", "u2"]);
        assert_eq!(tail.scan(&ours, false).unwrap(), None);
        // Half a line: waits for the rest while the writer lives.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(br#"{"type":"user","#).unwrap();
        assert_eq!(tail.scan(&ours, false).unwrap(), None);
        assert_eq!(tail.seen().line_count, 1);
        f.write_all(b"\"uuid\":\"u2\"}\n").unwrap();
        assert_eq!(tail.scan(&ours, false).unwrap(), None);
        assert_eq!(tail.seen().line_count, 2);
        assert_eq!(tail.seen().last_entry_id.as_deref(), Some("u2"));
        append(&path, r#"{"type":"user","uuid":"x"}"#);
        assert!(
            tail.scan(&ours, false)
                .unwrap()
                .unwrap()
                .contains("entry x")
        );
    }

    #[test]
    fn the_last_line_is_found_backwards_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let long = "y".repeat(200 * 1024);
        std::fs::write(&path, format!("first\n{long}\n\n")).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            last_line_before(&path, len).unwrap().unwrap(),
            long.as_bytes()
        );
        assert_eq!(last_line_before(&path, 6).unwrap().unwrap(), b"first");
        assert_eq!(last_line_before(&path, 0).unwrap(), None);
        std::fs::write(&path, "\n\n").unwrap();
        assert_eq!(last_line_before(&path, 2).unwrap(), None);
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
}
