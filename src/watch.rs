//! File watching (design §2): a `notify` watcher on a file's directory (so a replaced or
//! renamed file is still seen) that only sends a token to the task that owns the file's
//! session when that file changes. Reads do not count. Tokens coalesce: one waiting token
//! stands for any number of changes.

use std::path::{Path, PathBuf};

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// A live watch; dropping it stops it.
pub struct FileWatch {
    _watcher: notify::RecommendedWatcher,
    pub path: PathBuf,
    changes: mpsc::Receiver<()>,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch")
            .field("path", &self.path)
            .finish()
    }
}

impl FileWatch {
    /// Watch `path` (which must be in an existing directory).
    pub fn start(path: &Path) -> notify::Result<FileWatch> {
        let (tx, changes) = mpsc::channel(1);
        let file = path.to_owned();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else {
                    return;
                };
                if matches!(event.kind, EventKind::Access(_)) {
                    return;
                }
                if event.paths.contains(&file) {
                    // Full: a change is already waiting to be noticed.
                    let _coalesced = tx.try_send(());
                }
            })?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
        Ok(FileWatch {
            _watcher: watcher,
            path: path.to_owned(),
            changes,
        })
    }

    /// The next change (cancel-safe).
    pub async fn changed(&mut self) -> bool {
        self.changes.recv().await.is_some()
    }

    /// The watcher (keep it alive) and the receiver of its change tokens.
    pub fn into_parts(self) -> (Box<dyn std::any::Any + Send + Sync>, mpsc::Receiver<()>) {
        (Box::new(self._watcher), self.changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    #[tokio::test]
    async fn appends_and_replacements_are_seen_and_reads_and_neighbours_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        std::fs::write(&path, "a\n").unwrap();
        let mut watch = FileWatch::start(&path).unwrap();
        let _read = std::fs::read(&path).unwrap();
        std::fs::write(dir.path().join("other.jsonl"), "x\n").unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        writeln!(f, "b").unwrap();
        drop(f);
        let seen = tokio::time::timeout(Duration::from_secs(5), watch.changed()).await;
        assert_eq!(seen, Ok(true));
        // Replaced by rename: seen by a fresh watch that sees nothing but the replacement.
        let copy = dir.path().join("copy");
        std::fs::write(&copy, "c\n").unwrap();
        drop(watch);
        let mut watch = FileWatch::start(&path).unwrap();
        std::fs::rename(&copy, &path).unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), watch.changed()).await;
        assert_eq!(seen, Ok(true));
    }
}
