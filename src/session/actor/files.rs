//! The session actor's side of file ownership (design §8): finding its native session file,
//! deciding resume-in-place or fork before an agent opens, watching the file while the host's
//! child owns it, and recording baselines. The facts and the rule live in
//! [`crate::session::ownership`]; this is when the actor consults them. What it knows of its
//! child is the [`Child`] of the live agent (its pid, how it was opened, its watch); once the
//! child is gone, [`Actor::retire`] reads the file as it left it and says how the next open goes.
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

use super::state::{Binding, Child, NextOpen, Watch};
use super::{Actor, Cx, SETTLE, STOP_GRACE};
use crate::protocol::events::{EventBody, RunState, SessionForked};
use crate::session::agent::NativeFile;
use crate::session::ownership::{self, Baseline, OwnedPid, Tail, Verdict};

/// What the actor looked up once: the native session file (for the native id it belongs to)
/// and the host's prompt ids in this session (its run ids).
#[derive(Default)]
pub(super) struct FileCache {
    file: Option<(String, NativeFile)>,
    ours: Option<Arc<HashSet<String>>>,
}

impl FileCache {
    /// The native session file of `native_id`, looked up once it exists (the Codex lookup walks
    /// the rollout folders).
    pub(super) async fn native_file(&mut self, cx: &Cx, native_id: &str) -> NativeFile {
        if let Some((id, file)) = &self.file
            && id == native_id
            && file.path.is_some()
        {
            return file.clone();
        }
        let (launcher, agent_type, cwd, id) = (
            cx.launcher.clone(),
            cx.agent_type.clone(),
            cx.cwd.clone(),
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
    async fn our_prompts(&mut self, cx: &Cx) -> Arc<HashSet<String>> {
        if let Some(ours) = &self.ours {
            return ours.clone();
        }
        // Every run of the session: the prompts the host sent carry their ids.
        match cx.store.list_runs(cx.session_id.clone()).await {
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

    /// The native session changed (a fork or a fresh session got its own id): the old file's
    /// record says nothing about the new one.
    pub(super) fn native_changed(&mut self) {
        self.file = None;
    }
}

/// Read what was appended to the file since the last read. `complete`: the child is gone, so a
/// partial last line is torn. Returns the tail while the file is still the host's, else why it
/// is someone else's.
async fn scan(tail: Tail, ours: Arc<HashSet<String>>, complete: bool) -> Result<Tail, String> {
    let mut tail = tail;
    let scanned = tokio::task::spawn_blocking(move || {
        let found = tail.scan(&ours, complete);
        (tail, found)
    })
    .await;
    match scanned {
        Ok((tail, Ok(None))) => Ok(tail),
        Ok((_, Ok(Some(why)))) => Err(why),
        Ok((_, Err(e))) => Err(format!("the session file cannot be read: {e}")),
        Err(e) => Err(format!("the ownership check failed: {e}")),
    }
}

/// Someone else wrote the file: say so now; the next prompt closes our child and forks.
pub(super) async fn mark_drifted(
    cx: &Cx,
    binding: &Binding,
    run_id: Option<&str>,
    child: &mut Child,
    why: String,
) {
    if !child.drift(why.clone()) {
        return;
    }
    warn_drifted(cx, binding, run_id, &why).await;
}

async fn warn_drifted(cx: &Cx, binding: &Binding, run_id: Option<&str>, why: &str) {
    let id = binding.id().unwrap_or_default();
    tracing::warn!(native = %id, %why, "session drifted");
    let during = if run_id.is_some() {
        "; this turn goes on, and the next prompt continues in a fork"
    } else {
        "; the next prompt continues in a fork"
    };
    cx.warn(
        run_id,
        "session_drifted",
        format!("{why} (native session {id}){during}"),
    )
    .await;
}

fn foreign_write(binding: &Binding) -> String {
    let id = binding.id().unwrap_or_default();
    format!("the session file of {id} was written outside the host")
}

/// Our child is about to write the file, or to go: stop an unattributed watch, where a change
/// token still waiting counts as someone else's write. (An attributed tail reads everything on
/// its own; a due watch stays due.)
pub(super) async fn stop_watch(
    cx: &Cx,
    binding: &Binding,
    run_id: Option<&str>,
    child: &mut Child,
) {
    let Watch::Idle(changes) = &mut child.watch else {
        return;
    };
    let pending = changes.changes.try_recv().is_ok();
    child.watch = Watch::Off;
    if pending {
        mark_drifted(cx, binding, run_id, child, foreign_write(binding)).await;
    }
}

/// How long a closing child may take: none once someone else wrote its file (a CLI closing
/// cleanly writes its session file once more).
pub(super) fn close_grace(child: &Child) -> Duration {
    if child.drifted.is_some() {
        Duration::ZERO
    } else {
        STOP_GRACE
    }
}

impl Actor {
    /// Whether the bound native session may be continued in place by a new agent (no child of
    /// ours has it open): the file is checked against the host's last baseline, and whoever
    /// else holds it. On resume in place, an attributed family's tail read up to the file's end
    /// comes back.
    pub(super) async fn verdict_cold(&mut self, native_id: &str) -> (Verdict, Option<Tail>) {
        let file = self.files.native_file(&self.cx, native_id).await;
        let prompts = self.files.our_prompts(&self.cx).await;
        let stored = match self.cx.store.get_baseline(self.cx.session_id.clone()).await {
            Ok(stored) => stored.map(|s| Baseline::from_stored(&s)),
            Err(e) => {
                tracing::error!(error = %e, "reading the baseline failed; forking to be safe");
                return (
                    Verdict::Fork("the host could not read its record of the file".to_owned()),
                    None,
                );
            }
        };
        let native_id = native_id.to_owned();
        // Reading the file and scanning /proc block: off the runtime.
        let checked = tokio::task::spawn_blocking(move || {
            let mut foreign = file.claimed_by(&native_id, &[]);
            if let Some(path) = &file.path {
                foreign.extend(ownership::holders(path, &[]));
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
            Ok(checked) => checked,
            Err(e) => (
                Verdict::Fork(format!("the ownership check failed: {e}")),
                None,
            ),
        }
    }

    /// Whether our live child may go on with the native session: on every prompt to it, so
    /// only the cheap checks — another CLI that registered itself for the session (the
    /// family's registry; our own processes excluded) and, for attributed families, the
    /// appends since the last read. Codex refuses a second writer by itself. The /proc scan
    /// (milliseconds) is for cold opens.
    pub(super) async fn verdict_live(&mut self, native_id: &str) -> Verdict {
        let file = self.files.native_file(&self.cx, native_id).await;
        let prompts = self.files.our_prompts(&self.cx).await;
        let run_id = self.state.run_id();
        let Some(live) = self.state.live_mut() else {
            return Verdict::ResumeInPlace;
        };
        if !live.child.watch.has_tail() && !live.child.opened.born_fork() {
            // Not read yet (the file came after the last turn ended): from its start.
            arm_tail(
                &self.cx,
                &self.binding,
                &mut self.files,
                run_id.as_deref(),
                &mut live.child,
                &file,
            )
            .await;
            if let Some(why) = live.child.drifted.clone() {
                return Verdict::Fork(why);
            }
        }
        let ours_pids: Vec<OwnedPid> = live.child.owned.into_iter().collect();
        let id = native_id.to_owned();
        let mut tail = live.child.watch.take_tail();
        let checked = tokio::task::spawn_blocking(move || {
            let registered = file.claimed_by(&id, &ours_pids);
            if let Some(pid) = registered.first() {
                return (
                    tail,
                    Some(format!("another process (pid {pid}) has the session open")),
                );
            }
            let found = match tail.as_mut().map(|(t, _)| t.scan(&prompts, false)) {
                None | Some(Ok(None)) => None,
                Some(Ok(Some(why))) => Some(why),
                Some(Err(e)) => Some(format!("the session file cannot be read: {e}")),
            };
            (tail, found)
        })
        .await;
        match checked {
            Ok((tail, None)) => {
                if let Some((tail, changes)) = tail {
                    live.child.watch = Watch::Tail(tail, changes);
                }
                Verdict::ResumeInPlace
            }
            Ok((_, Some(why))) => Verdict::Fork(why),
            Err(e) => Verdict::Fork(format!("the ownership check failed: {e}")),
        }
    }

    /// Another live CLI that registered itself for the session (the family's registry), as a
    /// reason, if there is one; `ours`: our own processes, never counted.
    pub(super) async fn registered_holder(&mut self, ours: Vec<OwnedPid>) -> Option<String> {
        let native_id = self.binding.id()?.to_owned();
        let file = self.files.native_file(&self.cx, &native_id).await;
        file.claimants.as_ref()?;
        let pids = tokio::task::spawn_blocking(move || file.claimed_by(&native_id, &ours))
            .await
            .ok()?;
        pids.first()
            .map(|pid| format!("another process (pid {pid}) has the session open"))
    }

    /// A turn ended with our child alive: for an attributed family, read the file (taking it
    /// as ours if this is the first turn of a new or forked native session, which nobody else
    /// knew) and record a baseline if the turn completed; otherwise watch once our child's
    /// late writes are over.
    pub(super) async fn turn_ended(&mut self, state: RunState) {
        if self.state.live().is_none_or(|l| l.child.drifted.is_some()) {
            return;
        }
        let Some(native_id) = self.binding.id().map(str::to_owned) else {
            return;
        };
        let file = self.files.native_file(&self.cx, &native_id).await;
        let run_id = self.state.run_id();
        let idle = run_id.is_none();
        let Some(live) = self.state.live_mut() else {
            return;
        };
        let child = &mut live.child;
        if file.entries.is_none() {
            if idle {
                child.watch = Watch::Due(Instant::now() + SETTLE);
            }
            return;
        }
        if let Some((tail, changes)) = child.watch.take_tail() {
            let ours = self.files.our_prompts(&self.cx).await;
            match scan(tail, ours, false).await {
                Ok(tail) => child.watch = Watch::Tail(tail, changes),
                Err(why) => {
                    mark_drifted(&self.cx, &self.binding, run_id.as_deref(), child, why).await;
                    return;
                }
            }
        } else {
            // The first turn of a native session only the host knew: its file, once written
            // (Claude writes lazily, so maybe only after the settle time), is the host's.
            let armed = arm_tail(
                &self.cx,
                &self.binding,
                &mut self.files,
                run_id.as_deref(),
                child,
                &file,
            )
            .await;
            if !armed {
                child.watch = Watch::Due(Instant::now() + SETTLE);
            }
        }
        if state == RunState::Completed
            && let Watch::Tail(tail, _) = &child.watch
        {
            let seen = tail.seen().clone();
            self.save_baseline(seen, false).await;
        }
    }

    /// Save a baseline. `wait`: until it is committed (a cold open may read it next); else it
    /// is only queued, so a next prompt does not wait on an fsync after each turn.
    async fn save_baseline(&mut self, baseline: Baseline, wait: bool) {
        let committed = match self
            .cx
            .store
            .save_baseline(self.cx.session_id.clone(), baseline.to_stored())
            .await
        {
            Ok(committed) => committed,
            Err(e) => {
                // Without it the next cold open forks (when in doubt, fork).
                tracing::error!(error = %e, "saving the baseline failed");
                self.note_outage();
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
        if let Some(live) = self.state.live_mut() {
            live.child.watch = Watch::Off;
        }
        self.files.native_changed();
    }

    /// Our idle child's late writes are over: watch its session file for anyone else's
    /// (unattributed families), or start reading a file that was not there at the turn's end
    /// (attributed ones).
    pub(super) async fn start_watch(&mut self) {
        let Some(live) = self.state.live_mut() else {
            return;
        };
        if !matches!(live.child.watch, Watch::Due(_)) {
            return;
        }
        live.child.watch = Watch::Off;
        if live.child.drifted.is_some() {
            return;
        }
        let Some(native_id) = self.binding.id().map(str::to_owned) else {
            return;
        };
        let file = self.files.native_file(&self.cx, &native_id).await;
        let run_id = self.state.run_id();
        let Some(live) = self.state.live_mut() else {
            return;
        };
        if file.entries.is_some() {
            arm_tail(
                &self.cx,
                &self.binding,
                &mut self.files,
                run_id.as_deref(),
                &mut live.child,
                &file,
            )
            .await;
            return;
        }
        if run_id.is_some() {
            return;
        }
        if let Some(changes) = file.path.and_then(|path| self.cx.launcher.watch(&path)) {
            live.child.watch = Watch::Idle(changes);
        }
    }

    /// The file changed: with a tail, read what came; without one (our child is idle),
    /// someone else wrote it.
    pub(super) async fn on_file_change(&mut self) {
        let run_id = self.state.run_id();
        let Some(live) = self.state.live_mut() else {
            return;
        };
        let child = &mut live.child;
        if let Some((tail, changes)) = child.watch.take_tail() {
            let ours = self.files.our_prompts(&self.cx).await;
            match scan(tail, ours, false).await {
                Ok(tail) => child.watch = Watch::Tail(tail, changes),
                Err(why) => {
                    mark_drifted(&self.cx, &self.binding, run_id.as_deref(), child, why).await;
                }
            }
            return;
        }
        child.watch = Watch::Off;
        if run_id.is_some() {
            return;
        }
        let why = foreign_write(&self.binding);
        mark_drifted(&self.cx, &self.binding, None, child, why).await;
    }

    /// Announce an automatic fork of `from` (its file is left to whoever else writes it).
    pub(super) async fn announce_fork(&self, from: &str, why: &str) {
        tracing::warn!(native = %from, %why, "forking the session");
        let run_id = self.state.run_id();
        self.cx
            .warn(
                run_id.as_deref(),
                "forked",
                format!(
                    "{why}; this session continues in a fork of {from}, whose file the host no \
                     longer writes"
                ),
            )
            .await;
        self.cx
            .publish(
                run_id.as_deref(),
                EventBody::SessionForked(SessionForked {
                    parent_session_id: self.cx.session_id.clone(),
                    child_session_id: Some(self.cx.session_id.clone()),
                    from_native_session_id: Some(from.to_owned()),
                    reason: Some(why.to_owned()),
                }),
            )
            .await;
    }

    /// Our child for the session has ended (its process is gone): the file as it left it is
    /// the baseline, unless someone else wrote it or has it open, or (attributed families) a
    /// turn was still under way — a cold open then reads the growth line by line. Returns how
    /// the next open goes. The child is retired whether or not its pid was known (a per-turn
    /// family's between turns).
    pub(super) async fn retire(&mut self, mut child: Child) -> NextOpen {
        let run_id = self.state.run_id();
        stop_watch(&self.cx, &self.binding, run_id.as_deref(), &mut child).await;
        let tail = child.watch.take_tail().map(|(tail, _)| tail);
        let next = child.next_open();
        if next != NextOpen::Decide {
            // Someone else wrote the file, or a fork ended before it had an id of its own (the
            // file is still the source, which is not ours): the next open forks.
            return next;
        }
        let tail = match tail {
            Some(tail) => {
                let ours = self.files.our_prompts(&self.cx).await;
                match scan(tail, ours, true).await {
                    Ok(tail) => Some(tail),
                    // The file is not as our child left it: no baseline (the next cold open
                    // sees the growth).
                    Err(_) => return NextOpen::Decide,
                }
            }
            None => None,
        };
        let Some(native_id) = self.binding.id().map(str::to_owned) else {
            return NextOpen::Decide;
        };
        let file = self.files.native_file(&self.cx, &native_id).await;
        if file.entries.is_some() && run_id.is_some() {
            // Never mid-turn where the growth can be read line by line later.
            return NextOpen::Decide;
        }
        let read = tokio::task::spawn_blocking(move || {
            let path = file.path.clone()?;
            let foreign = ownership::holders(&path, &[]);
            let registry = file.claimed_by(&native_id, &[]);
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
        NextOpen::Decide
    }
}

/// Start reading an attributed family's file of a native session only the host knew, and
/// watch it. Its prompts must be the host's, unless it was born a fork (a copy of its source's
/// history). False if there is no file yet.
async fn arm_tail(
    cx: &Cx,
    binding: &Binding,
    files: &mut FileCache,
    run_id: Option<&str>,
    child: &mut Child,
    file: &NativeFile,
) -> bool {
    let (Some(path), Some(entries)) = (file.path.clone(), file.entries) else {
        return false;
    };
    let ours = if child.opened.born_fork() {
        None
    } else {
        Some(files.our_prompts(cx).await)
    };
    let armed =
        tokio::task::spawn_blocking(move || Tail::arm(&path, Some(entries), ours.as_deref())).await;
    match armed {
        Ok(Ok(Ok(tail))) => {
            let changes = cx.launcher.watch(&tail.seen().path);
            child.watch = Watch::Tail(tail, changes);
        }
        Ok(Ok(Err(why))) => mark_drifted(cx, binding, run_id, child, why).await,
        Ok(Err(e)) => tracing::warn!(error = %e, "reading the session file failed"),
        Err(e) => tracing::warn!(error = %e, "reading the session file failed"),
    }
    true
}
