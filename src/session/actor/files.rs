//! The session actor's side of file ownership (design §8): finding its native session file,
//! deciding resume-in-place or fork before an agent opens, watching the file while the host's
//! child owns it, and recording baselines. The facts and the rule live in
//! [`super::super::ownership`]; this is when the actor consults them.
//!
//! Two ways to watch, by family:
//! - **Attributed** (the family's lines say whose a prompt is — Claude, whose prompt entries
//!   carry the host's run id as their `uuid`): a [`Tail`] reads every append while the child
//!   lives, during turns too, so a prompt the host did not send is seen at once. Baselines are
//!   taken at clean turn ends and at a clean exit; growth after the last one is checked line by
//!   line at the next cold open, so a child killed mid-turn, or writing late, is still the
//!   host's.
//! - **Unattributed** (Codex, whose app-server itself refuses a second writer while it holds
//!   the thread): the watch starts [`SETTLE`] after a turn and any change while idle is
//!   someone else's; the baseline is the file as the host's child left it at exit.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Actor, SETTLE, STOP_GRACE};
use crate::protocol::events::{EventBody, RunState, SessionForked};
use crate::session::agent::NativeFile;
use crate::session::ownership::{self, Baseline, OwnedPid, Tail, Verdict};

impl Actor {
    /// The native session file of `native_id`, looked up once it exists (the Codex lookup walks
    /// the rollout folders).
    pub(super) async fn native_file(&mut self, native_id: &str) -> NativeFile {
        if let Some((id, file)) = &self.file
            && id == native_id
            && file.path.is_some()
        {
            return file.clone();
        }
        let (launcher, agent_type, cwd, id) = (
            self.launcher.clone(),
            self.agent_type.clone(),
            self.cwd.clone(),
            native_id.to_owned(),
        );
        let file =
            tokio::task::spawn_blocking(move || launcher.native_file(&agent_type, &cwd, &id))
                .await
                .unwrap_or_default();
        self.file = Some((native_id.to_owned(), file.clone()));
        file
    }

    /// Whether the family's lines say whose a prompt is (as far as its file was looked up).
    pub(super) fn attributed(&self) -> bool {
        self.file.as_ref().is_some_and(|(_, f)| f.entries.is_some())
    }

    /// The prompt ids the host sent in this session (its run ids), loaded once.
    async fn our_prompts(&mut self) -> Arc<HashSet<String>> {
        if let Some(ours) = &self.ours {
            return ours.clone();
        }
        // Every run of the session: the prompts the host sent carry their ids.
        match self.store.list_runs(self.session_id.clone()).await {
            Ok(runs) => {
                let ours = Arc::new(runs.into_iter().map(|r| r.run_id).collect::<HashSet<_>>());
                self.ours = Some(ours.clone());
                ours
            }
            Err(e) => {
                // Not cached: the next check asks again. Meanwhile prompts count as foreign.
                tracing::error!(error = %e, "reading the session's run ids failed");
                Arc::default()
            }
        }
    }

    /// A prompt the host is about to send: its id is the host's from now on.
    pub(super) fn own_prompt(&mut self, run_id: &str) {
        if let Some(ours) = self.ours.as_mut() {
            Arc::make_mut(ours).insert(run_id.to_owned());
        }
    }

    /// Whether the native session may be continued in place. `live`: our child for it runs,
    /// so another holder and (attributed families) what was appended since the last read
    /// count; otherwise the file is also checked against the host's last baseline.
    pub(super) async fn verdict(&mut self, native_id: &str, live: bool) -> Verdict {
        let file = self.native_file(native_id).await;
        let ours_pids: Vec<OwnedPid> = self.owned.into_iter().collect();
        let prompts = self.our_prompts().await;
        if live {
            // On every prompt to a live child, so only the cheap checks: another CLI that
            // registered itself for the session (Claude) and the appends since the last read.
            // Codex refuses a second writer by itself. The /proc scan (milliseconds) is for
            // cold opens.
            if self.tail.is_none() && !self.born_fork {
                // Not read yet (the file came after the last turn ended): from its start.
                self.arm_tail(&file).await;
                if let Some(why) = self.drifted.take() {
                    return Verdict::Fork(why);
                }
            }
            let config = file.claude_config.clone();
            let id = native_id.to_owned();
            let mut tail = self.tail.take();
            let checked = tokio::task::spawn_blocking(move || {
                let registered = config
                    .map(|c| ownership::claude_registry_holders(&c, &id, &ours_pids))
                    .unwrap_or_default();
                if let Some(pid) = registered.first() {
                    return (
                        tail,
                        Some(format!("another process (pid {pid}) has the session open")),
                    );
                }
                let found = match tail.as_mut().map(|t| t.scan(&prompts, false)) {
                    None | Some(Ok(None)) => None,
                    Some(Ok(Some(why))) => Some(why),
                    Some(Err(e)) => Some(format!("the session file cannot be read: {e}")),
                };
                (tail, found)
            })
            .await;
            return match checked {
                Ok((tail, None)) => {
                    self.tail = tail;
                    Verdict::ResumeInPlace
                }
                Ok((_, Some(why))) => Verdict::Fork(why),
                Err(e) => Verdict::Fork(format!("the ownership check failed: {e}")),
            };
        }
        let stored = match self.store.get_baseline(self.session_id.clone()).await {
            Ok(stored) => stored.map(|s| Baseline::from_stored(&s)),
            Err(e) => {
                tracing::error!(error = %e, "reading the baseline failed; forking to be safe");
                return Verdict::Fork("the host could not read its record of the file".to_owned());
            }
        };
        let native_id = native_id.to_owned();
        // Reading the file and scanning /proc block: off the runtime.
        let checked = tokio::task::spawn_blocking(move || {
            let mut foreign = Vec::new();
            if let Some(config) = &file.claude_config {
                foreign.extend(ownership::claude_registry_holders(
                    config, &native_id, &ours_pids,
                ));
            }
            if let Some(path) = &file.path {
                foreign.extend(ownership::holders(path, &ours_pids));
            }
            let (verdict, tail) = ownership::check(
                stored,
                file.path.as_deref(),
                file.entries,
                &prompts,
                &foreign,
            );
            // Only an attributed family goes on reading the file while its child runs.
            (verdict, tail.filter(|_| file.entries.is_some()))
        })
        .await;
        match checked {
            Ok((verdict, tail)) => {
                self.tail = tail;
                verdict
            }
            Err(e) => Verdict::Fork(format!("the ownership check failed: {e}")),
        }
    }

    /// Another live CLI that registered itself for the session (Claude's registry), as a
    /// reason, if there is one.
    pub(super) async fn registered_holder(&mut self) -> Option<String> {
        let native_id = self.native.clone()?;
        let config = self.native_file(&native_id).await.claude_config?;
        let ours: Vec<OwnedPid> = self.owned.into_iter().collect();
        let pids = tokio::task::spawn_blocking(move || {
            ownership::claude_registry_holders(&config, &native_id, &ours)
        })
        .await
        .ok()?;
        pids.first()
            .map(|pid| format!("another process (pid {pid}) has the session open"))
    }

    /// Read what was appended to the file since the last read. `complete`: the child is gone,
    /// so a partial last line is torn. Returns why the file is someone else's, if it is; the
    /// tail is dropped then.
    async fn scan_tail(&mut self, complete: bool) -> Option<String> {
        let mut tail = self.tail.take()?;
        let ours = self.our_prompts().await;
        let scanned = tokio::task::spawn_blocking(move || {
            let found = tail.scan(&ours, complete);
            (tail, found)
        })
        .await;
        match scanned {
            Ok((tail, Ok(None))) => {
                self.tail = Some(tail);
                None
            }
            Ok((_, Ok(Some(why)))) => Some(why),
            Ok((_, Err(e))) => Some(format!("the session file cannot be read: {e}")),
            Err(e) => Some(format!("the ownership check failed: {e}")),
        }
    }

    /// The agent was just opened on the native session: an attributed family's file is read
    /// from here on, while the child lives.
    pub(super) fn watch_opened(&mut self) {
        if let Some(tail) = &self.tail {
            self.watch = self.launcher.watch(&tail.seen().path);
        }
    }

    /// A turn ended with our child alive: for an attributed family, read the file (taking it
    /// as ours if this is the first turn of a new or forked native session, which nobody else
    /// knew) and record a baseline if the turn completed; otherwise watch once our child's
    /// late writes are over.
    pub(super) async fn turn_ended(&mut self, state: RunState) {
        if self.agent.is_none() || self.drifted.is_some() {
            return;
        }
        let Some(native_id) = self.native.clone() else {
            return;
        };
        let file = self.native_file(&native_id).await;
        if file.entries.is_none() {
            if self.current.is_none() {
                self.watch_at = Some(Instant::now() + SETTLE);
            }
            return;
        }
        if self.tail.is_none() {
            // The first turn of a native session only the host knew: its file, once written
            // (Claude writes lazily, so maybe only after the settle time), is the host's.
            if !self.arm_tail(&file).await {
                self.watch_at = Some(Instant::now() + SETTLE);
            }
        } else if let Some(why) = self.scan_tail(false).await {
            self.mark_drifted(why).await;
            return;
        }
        if state == RunState::Completed
            && let Some(tail) = &self.tail
        {
            self.save_baseline(tail.seen().clone(), false).await;
        }
    }

    /// Start reading an attributed family's file of a native session only the host knew, and
    /// watch it. Its prompts must be the host's, unless it was born a fork (a copy of its
    /// source's history). False if there is no file yet.
    async fn arm_tail(&mut self, file: &NativeFile) -> bool {
        let (Some(path), Some(entries)) = (file.path.clone(), file.entries) else {
            return false;
        };
        let ours = (!self.born_fork).then_some(self.our_prompts().await);
        let armed =
            tokio::task::spawn_blocking(move || Tail::arm(&path, Some(entries), ours.as_deref()))
                .await;
        match armed {
            Ok(Ok(Ok(tail))) => {
                self.tail = Some(tail);
                self.watch_opened();
            }
            Ok(Ok(Err(why))) => self.mark_drifted(why).await,
            Ok(Err(e)) => tracing::warn!(error = %e, "reading the session file failed"),
            Err(e) => tracing::warn!(error = %e, "reading the session file failed"),
        }
        true
    }

    /// Save a baseline. `wait`: until it is committed (a cold open may read it next); else it
    /// is only queued, so a next prompt does not wait on an fsync after each turn.
    async fn save_baseline(&self, baseline: Baseline, wait: bool) {
        let committed = match self
            .store
            .save_baseline(self.session_id.clone(), baseline.to_stored())
            .await
        {
            Ok(committed) => committed,
            Err(e) => {
                tracing::error!(error = %e, "saving the baseline failed");
                return;
            }
        };
        let report = async move {
            if let Ok(Err(e)) = committed.await {
                tracing::error!(error = %e, "saving the baseline failed");
            }
        };
        if wait {
            report.await;
        } else {
            tokio::spawn(report);
        }
    }

    /// The native session changed (a fork or a fresh session got its own id): the old file's
    /// record says nothing about the new one.
    pub(super) fn native_changed(&mut self) {
        self.tail = None;
        self.watch = None;
        self.watch_at = None;
        self.file = None;
    }

    /// Our idle child's late writes are over: watch its session file for anyone else's
    /// (unattributed families), or start reading a file that was not there at the turn's end
    /// (attributed ones).
    pub(super) async fn start_watch(&mut self) {
        self.watch_at = None;
        if self.agent.is_none() || self.tail.is_some() || self.drifted.is_some() {
            return;
        }
        let Some(native_id) = self.native.clone() else {
            return;
        };
        let file = self.native_file(&native_id).await;
        if file.entries.is_some() {
            self.arm_tail(&file).await;
            return;
        }
        if self.current.is_some() {
            return;
        }
        self.watch = file.path.and_then(|path| self.launcher.watch(&path));
    }

    /// How long a closing child may take: none once someone else wrote its file (a CLI
    /// closing cleanly writes its session file once more).
    pub(super) fn close_grace(&self) -> Duration {
        if self.drifted.is_some() || self.fork_reason.is_some() {
            Duration::ZERO
        } else {
            STOP_GRACE
        }
    }

    /// Our child is about to write the file, or to go: stop an unattributed watch, where a
    /// change token still waiting counts as someone else's write. (An attributed tail reads
    /// everything on its own.)
    pub(super) async fn stop_watch(&mut self) {
        if self.tail.is_some() {
            return;
        }
        let pending = self
            .watch
            .as_mut()
            .is_some_and(|w| w.changes.try_recv().is_ok());
        self.watch = None;
        if pending {
            self.mark_foreign_write().await;
        }
    }

    /// The file changed: with a tail, read what came; without one (our child is idle),
    /// someone else wrote it.
    pub(super) async fn on_file_change(&mut self) {
        if self.tail.is_some() {
            if let Some(why) = self.scan_tail(false).await {
                self.watch = None;
                self.mark_drifted(why).await;
            }
            return;
        }
        self.watch = None;
        if self.current.is_some() {
            return;
        }
        self.mark_foreign_write().await;
    }

    async fn mark_foreign_write(&mut self) {
        let id = self.native.clone().unwrap_or_default();
        self.mark_drifted(format!(
            "the session file of {id} was written outside the host"
        ))
        .await;
    }

    /// Someone else wrote the file: say so now; the next prompt closes our child and forks.
    pub(super) async fn mark_drifted(&mut self, why: String) {
        self.tail = None;
        self.watch = None;
        if self.drifted.is_some() {
            return;
        }
        let id = self.native.clone().unwrap_or_default();
        tracing::warn!(native = %id, %why, "session drifted");
        let run_id = self.current.as_ref().map(|c| c.run_id.clone());
        let during = if run_id.is_some() {
            "; this turn goes on, and the next prompt continues in a fork"
        } else {
            "; the next prompt continues in a fork"
        };
        self.warn(
            run_id.as_deref(),
            "session_drifted",
            format!("{why} (native session {id}){during}"),
        )
        .await;
        self.drifted = Some(why);
    }

    /// Announce an automatic fork of `from` (its file is left to whoever else writes it).
    pub(super) async fn announce_fork(&mut self, from: &str, why: &str) {
        tracing::warn!(native = %from, %why, "forking the session");
        let run_id = self.current.as_ref().map(|c| c.run_id.clone());
        self.warn(
            run_id.as_deref(),
            "forked",
            format!(
                "{why}; this session continues in a fork of {from}, whose file the host no \
                 longer writes"
            ),
        )
        .await;
        self.publish(
            run_id.as_deref(),
            EventBody::SessionForked(SessionForked {
                parent_session_id: self.session_id.clone(),
                child_session_id: Some(self.session_id.clone()),
                from_native_session_id: Some(from.to_owned()),
                reason: Some(why.to_owned()),
            }),
        )
        .await;
    }

    /// Our child for the session has ended: the file as it left it is the baseline, unless
    /// someone else wrote it or has it open, or (attributed families) a turn was still under
    /// way — a cold open then reads the growth line by line.
    pub(super) async fn record_baseline(&mut self) {
        self.watch_at = None;
        self.stop_watch().await;
        self.watch = None;
        if let Some((_, why)) = self.forking_from.take() {
            // The fork ended before it had an id of its own: the file is still the source,
            // which is not ours; the next open forks again.
            self.fork_reason.get_or_insert(why);
            self.owned = None;
            self.tail = None;
            return;
        }
        let tail_says = if self.tail.is_some() {
            self.scan_tail(true).await
        } else {
            None
        };
        let tail = self.tail.take();
        self.owned = None;
        if self.drifted.is_some() || self.fork_reason.is_some() || tail_says.is_some() {
            // The file is not as our child left it.
            return;
        }
        let Some(native_id) = self.native.clone() else {
            return;
        };
        let file = self.native_file(&native_id).await;
        if file.entries.is_some() && self.current.is_some() {
            // Never mid-turn where the growth can be read line by line later.
            return;
        }
        let read = tokio::task::spawn_blocking(move || {
            let path = file.path?;
            let foreign = ownership::holders(&path, &[]);
            let registry = file
                .claude_config
                .map(|c| ownership::claude_registry_holders(&c, &native_id, &[]))
                .unwrap_or_default();
            if !foreign.is_empty() || !registry.is_empty() {
                return None;
            }
            match tail {
                Some(tail) => Some(tail.seen().clone()),
                None => Baseline::read(&path).ok(),
            }
        })
        .await;
        if let Ok(Some(baseline)) = read {
            self.save_baseline(baseline, true).await;
        }
    }
}
