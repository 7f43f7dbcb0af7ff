//! "Needs you" notifications: the commands of `config.toml`'s `[hooks]` (`on_permission`,
//! `on_run_end`, `on_error`), run when a session asks for a permission, ends a run, or reports
//! an error (`docs/hooks.md`).
//!
//! Owns one follower task and the hook processes it starts. The follower reads the bus's
//! committed brackets of every session (no deltas) from the moment the host started — never
//! the history, so an event fires its hooks once, and a restart does not fire them again — and
//! turns each `permission.request`, `run.end` and `error` into one job per configured command.
//!
//! Invariants:
//! - **A hook never holds anything up.** The follower hands jobs over with `try_send` into a
//!   bounded queue of [`MAX_WAITING`] jobs; at most [`MAX_RUNNING`] hooks run at once (the pool
//!   takes a job from the queue only once a place is free, so the queue's capacity is exactly
//!   how many wait); a job that finds the queue full is dropped and logged. The bus, the runs and other hooks never wait
//!   for a hook; the follower itself waits only for the bus and a read of the session row.
//! - **No shell.** A command is an argv list run as is: nothing expands `$…`, globs or `;`.
//! - **The one spawn policy.** Hooks start through [`crate::adapter::spawn`]: their own
//!   process group, a parent-death signal, the home's markers (a host that dies leaves none
//!   running past the next start), kill-on-drop. stdin is closed at once (a read sees the
//!   end), stdout lines go to the log at `info`, stderr lines at `debug` (the spawn policy's
//!   drain) and the last of them with the outcome. At the time limit the group is killed and
//!   the process reaped; when the hook exits by itself, what it left running (in its group,
//!   its descendants, what carries its spawn id) is killed too.
//! - **Nothing starts after stop.** Once the host stops, the pool takes no job and a job that
//!   has not spawned yet does not; [`Hooks::shutdown`] gives what runs a short grace
//!   ([`SHUTDOWN_GRACE`], or the time limit if shorter), then kills it and awaits the pool and
//!   every job, so no hook outlives the host's shutdown.
//! - **An explicit environment**: the host's variables a notifier needs (`PATH`, `HOME`, the
//!   locale, the desktop session's `DISPLAY` / `DBUS_SESSION_BUS_ADDRESS`, proxies and CA
//!   bundles — never the provider keys agents get), plus `AGENT_HOST_*` describing the event.
//!
//! Must not touch: sessions or runs (it only reads the bus and the session rows), and the
//! argv text in logs (an argument may be a push service's token): logs name the hook by its
//! list and index and its program.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::adapter::lines::{BoundedLines, Line};
use crate::adapter::reap::HomeMarker;
use crate::adapter::spawn::{self, SpawnSpec};
use crate::bus::{Bus, BusError, Replay, SubscribeOptions, Subscription};
use crate::config::{Config, HookCommand, HooksConfig};
use crate::protocol::events::{AnyEvent, Event, EventBody, RunState};
use crate::store::{SessionFilter, Store};

/// The most hooks running at once.
pub const MAX_RUNNING: usize = 4;
/// The most hooks waiting for one of the [`MAX_RUNNING`] places (the queue's capacity); past
/// it a hook is dropped.
pub const MAX_WAITING: usize = 32;
/// How long hooks still queued or running when the host stops may go on (at most their time
/// limit) before they are killed: short, because the shutdown's sessions already take up to
/// 10 s of the 15 s `host.shutdown` waits for the lock.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The longest stdout line logged (a longer one is skipped, and said so).
const MAX_OUTPUT_LINE: usize = 4096;
/// The most stdout lines logged per run; the rest are read and counted.
const MAX_LOGGED_LINES: usize = 100;
/// How long the stdout drain may take to reach the end once the hook's group is gone.
const OUTPUT_DRAIN_WAIT: Duration = Duration::from_millis(500);
/// Bounds on what goes into one variable (a variable's value is limited by the kernel, and a
/// notification has no use for pages of text).
const MAX_MESSAGE_CHARS: usize = 4000;
const MAX_FIELD_CHARS: usize = 500;

/// Why the hooks could not start.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("cannot follow the bus: {0}")]
    Subscribe(#[from] BusError),
}

/// Which list of `[hooks]` an event runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// A `permission.request`: `on_permission`.
    Permission,
    /// A `run.end`: `on_run_end`.
    RunEnd,
    /// An `error`: `on_error`.
    Error,
}

impl HookKind {
    /// `AGENT_HOST_EVENT`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Permission => "permission",
            HookKind::RunEnd => "run_end",
            HookKind::Error => "error",
        }
    }

    /// The `[hooks]` key.
    pub fn list_name(self) -> &'static str {
        match self {
            HookKind::Permission => "on_permission",
            HookKind::RunEnd => "on_run_end",
            HookKind::Error => "on_error",
        }
    }

    fn commands(self, config: &HooksConfig) -> &[HookCommand] {
        match self {
            HookKind::Permission => &config.on_permission,
            HookKind::RunEnd => &config.on_run_end,
            HookKind::Error => &config.on_error,
        }
    }
}

/// What an event tells its hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookEvent {
    pub kind: HookKind,
    pub session_id: String,
    pub run_id: Option<String>,
    /// `permission`: the tool asked about.
    pub tool: Option<String>,
    /// `permission`: the request's id (what `permission.respond` takes).
    pub request_id: Option<String>,
    /// `run_end`: completed, failed, cancelled or interrupted.
    pub state: Option<String>,
    /// `run_end` (failed or cancelled) and `error`: the error category.
    pub category: Option<String>,
    /// `error`, and `run_end` when it carries one.
    pub message: Option<String>,
}

impl HookEvent {
    /// The hooks' view of an event, for the three kinds that may need the user; `None` for
    /// every other kind. (A catch-all, not an exhaustive match: a kind added later needs no
    /// notification unless someone decides it does, and this list is where they would.)
    pub fn of(event: &Event) -> Option<HookEvent> {
        let mut hook = HookEvent {
            kind: HookKind::Permission,
            session_id: event.session_id.clone(),
            run_id: event.run_id.clone(),
            tool: None,
            request_id: None,
            state: None,
            category: None,
            message: None,
        };
        match &event.body {
            EventBody::PermissionRequest(request) => {
                hook.tool = Some(request.tool.clone());
                hook.request_id = Some(request.request_id.clone());
            }
            EventBody::RunEnd(end) => {
                hook.kind = HookKind::RunEnd;
                hook.state = Some(run_state(end.state).to_owned());
                hook.category = end.category.and_then(|c| wire_name(&c));
                hook.message = end.message.clone();
            }
            EventBody::Error(error) => {
                hook.kind = HookKind::Error;
                hook.category = wire_name(&error.category);
                hook.message = Some(error.message.clone());
            }
            _ => return None,
        }
        Some(hook)
    }
}

fn run_state(state: RunState) -> &'static str {
    match state {
        RunState::Completed => "completed",
        RunState::Failed => "failed",
        RunState::Cancelled => "cancelled",
        RunState::Interrupted => "interrupted",
    }
}

/// A value's name on the wire (`"rate_limited"`), from its serde form.
fn wire_name(value: &impl serde::Serialize) -> Option<String> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => Some(name),
        _ => None,
    }
}

/// What the session row says about the session (empty when it cannot be read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFacts {
    pub title: Option<String>,
    pub agent: String,
}

/// The `AGENT_HOST_*` variables of one hook run. `EVENT`, `SESSION_ID`, `SESSION_TITLE`,
/// `AGENT` and `RUN_ID` are always set (empty when unknown); the others only for the events
/// that have them.
pub fn hook_env(event: &HookEvent, session: &SessionFacts) -> Vec<(String, String)> {
    let mut env = vec![
        ("AGENT_HOST_EVENT", event.kind.as_str().to_owned()),
        ("AGENT_HOST_SESSION_ID", event.session_id.clone()),
        (
            "AGENT_HOST_SESSION_TITLE",
            session.title.clone().unwrap_or_default(),
        ),
        ("AGENT_HOST_AGENT", session.agent.clone()),
        (
            "AGENT_HOST_RUN_ID",
            event.run_id.clone().unwrap_or_default(),
        ),
    ];
    let optional = [
        ("AGENT_HOST_TOOL", &event.tool),
        ("AGENT_HOST_REQUEST_ID", &event.request_id),
        ("AGENT_HOST_STATE", &event.state),
        ("AGENT_HOST_CATEGORY", &event.category),
    ];
    env.extend(
        optional
            .into_iter()
            .filter_map(|(name, value)| Some((name, value.clone()?))),
    );
    if let Some(message) = &event.message {
        env.push(("AGENT_HOST_MESSAGE", message.clone()));
    }
    env.into_iter()
        .map(|(name, value)| {
            let limit = if name == "AGENT_HOST_MESSAGE" {
                MAX_MESSAGE_CHARS
            } else {
                MAX_FIELD_CHARS
            };
            (name.to_owned(), env_value(&value, limit))
        })
        .collect()
}

/// A value a variable can hold: no NUL (no environment entry can carry one), bounded.
fn env_value(value: &str, limit: usize) -> String {
    value.chars().filter(|c| *c != '\0').take(limit).collect()
}

/// Names passed from the host's environment to hooks as they are.
const PASS_EXACT: &[&str] = &[
    "HOME",
    "PATH",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "TERM",
    // A desktop notifier reaches the user's session through these.
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "DBUS_SESSION_BUS_ADDRESS",
    // A push service is reached over the network, maybe through a proxy.
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
];

/// Prefixes passed to hooks (locale; the XDG directories, runtime dir and desktop).
const PASS_PREFIX: &[&str] = &["LC_", "XDG_"];

/// The part of the host's environment that hooks get.
pub fn pass_env(host_env: &[(String, String)]) -> Vec<(String, String)> {
    host_env
        .iter()
        .filter(|(name, _)| {
            PASS_EXACT.contains(&name.as_str()) || PASS_PREFIX.iter().any(|p| name.starts_with(p))
        })
        .cloned()
        .collect()
}

/// One command to run for one event.
#[derive(Debug, Clone)]
pub struct HookJob {
    /// `on_permission[0]`: the list and the index, for logs.
    pub name: String,
    pub command: HookCommand,
    pub session_id: String,
    /// The `AGENT_HOST_*` variables.
    pub env: Vec<(String, String)>,
}

/// Where and how every hook runs.
#[derive(Debug, Clone)]
pub struct HookSettings {
    /// What passes from the host's environment ([`pass_env`]).
    pub base_env: Vec<(String, String)>,
    /// The working directory (the host's home: it exists while the host runs).
    pub cwd: PathBuf,
    /// The home's marker, so a host that dies leaves no hook running past the next start.
    pub home: Option<HomeMarker>,
    pub timeout: Duration,
}

/// How one hook run ended.
#[derive(Debug)]
pub enum HookOutcome {
    /// It exited by itself within its time limit (whatever it left in its group was ended).
    Exited {
        pid: Option<u32>,
        status: ExitStatus,
    },
    /// It ran past its time limit: its group was killed and it was reaped.
    TimedOut { pid: Option<u32> },
    /// The host stopped while it ran: killed likewise.
    Stopped { pid: Option<u32> },
    /// It could not be started (no such program, not executable).
    NotStarted(String),
    /// It exited, but its status could not be read.
    StatusUnknown(String),
}

/// Run one hook to its end, within its time limit or until `stop`. Logs its output and how it
/// ended; never fails.
pub async fn run_hook(
    job: &HookJob,
    settings: &HookSettings,
    stop: &CancellationToken,
) -> HookOutcome {
    let hook = job.name.as_str();
    let session_id = job.session_id.as_str();
    if stop.is_cancelled() {
        // The host stopped between the pool's hand-over and this start: nothing is started.
        tracing::debug!(hook, session_id, "the host is stopping; hook not started");
        return HookOutcome::Stopped { pid: None };
    }
    let spec = SpawnSpec {
        program: PathBuf::from(&job.command.program),
        args: job.command.args.clone(),
        cwd: settings.cwd.clone(),
        base_env: settings.base_env.clone(),
        extra_env: job.env.clone(),
        session_id: Some(job.session_id.clone()),
        home: settings.home.clone(),
        label: format!("hook {hook} (session {session_id})"),
    };
    let started = Instant::now();
    let mut child = match spawn::spawn(&spec) {
        Ok(child) => child,
        Err(e) => {
            tracing::warn!(hook, session_id, program = %job.command.program, "hook could not start: {}", e.message);
            return HookOutcome::NotStarted(e.message);
        }
    };
    // Nothing is ever written to a hook: its stdin ends at once.
    drop(child.stdin.take());
    let pid = child.pid();
    let drain = child
        .stdout
        .take()
        .map(|stdout| tokio::spawn(log_output(stdout, job.name.clone(), job.session_id.clone())));
    let exited = tokio::select! {
        // An exit that comes with the stop counts as an exit.
        biased;
        exited = tokio::time::timeout(settings.timeout, child.leader_exit()) => exited.is_ok(),
        () = stop.cancelled() => false,
    };
    if !exited {
        // No grace: the group (and what the hook started outside it) is killed at once; the
        // wait below then reaps the leader.
        child.kill_now();
    }
    // Reaps the leader once what it left in its group (and outside it) is killed.
    let status = child.wait().await;
    if let Some(mut drain) = drain
        && tokio::time::timeout(OUTPUT_DRAIN_WAIT, &mut drain)
            .await
            .is_err()
    {
        // Something that escaped the kill still holds stdout open: stop reading it.
        drain.abort();
        tracing::debug!(
            hook,
            session_id,
            "hook stdout still open after its exit; no longer read"
        );
    }
    let stderr = child.stderr_tail().await;
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let program = job.command.program.as_str();
    if !exited {
        let limit_ms = u64::try_from(settings.timeout.as_millis()).unwrap_or(u64::MAX);
        if stop.is_cancelled() {
            tracing::warn!(
                hook,
                session_id,
                program,
                ?pid,
                elapsed_ms,
                ?stderr,
                "the host is stopping; killed the hook's process group"
            );
            return HookOutcome::Stopped { pid };
        }
        tracing::warn!(
            hook,
            session_id,
            program,
            ?pid,
            limit_ms,
            ?stderr,
            "hook ran past its time limit; killed its process group"
        );
        return HookOutcome::TimedOut { pid };
    }
    match status {
        Ok(status) if status.success() => {
            tracing::info!(
                hook,
                session_id,
                program,
                ?pid,
                elapsed_ms,
                ?stderr,
                "hook ran"
            );
            HookOutcome::Exited { pid, status }
        }
        Ok(status) => {
            tracing::warn!(hook, session_id, program, ?pid, elapsed_ms, %status, ?stderr, "hook failed");
            HookOutcome::Exited { pid, status }
        }
        Err(e) => {
            // The leader exited (waitid said so) but could not be reaped: nothing to wait for.
            tracing::warn!(hook, session_id, program, ?pid, error = %e, "hook's exit status could not be read");
            HookOutcome::StatusUnknown(e.to_string())
        }
    }
}

/// The hook's stdout into the log, line by line, bounded.
async fn log_output(stdout: tokio::process::ChildStdout, hook: String, session_id: String) {
    let mut lines = BoundedLines::new(stdout, MAX_OUTPUT_LINE);
    let mut logged = 0usize;
    let mut unlogged = 0usize;
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => break,
        };
        if logged == MAX_LOGGED_LINES {
            unlogged += 1;
            continue;
        }
        logged += 1;
        match line {
            // A script may print what it was given (a token in a URL): redacted by shape.
            Line::Text(text) => {
                tracing::info!(
                    hook,
                    session_id,
                    "hook output: {}",
                    crate::redact::redact(&text)
                )
            }
            Line::TooLong => tracing::info!(
                hook,
                session_id,
                "hook output: a line longer than {MAX_OUTPUT_LINE} bytes, not logged"
            ),
            Line::NotUtf8 => {
                tracing::info!(
                    hook,
                    session_id,
                    "hook output: a line that is not UTF-8, not logged"
                )
            }
        }
    }
    if unlogged > 0 {
        tracing::info!(
            hook,
            session_id,
            unlogged,
            "hook output: more lines, not logged"
        );
    }
}

/// The running hooks: the follower of the bus, the pool that starts jobs, and the jobs.
/// [`Hooks::shutdown`] ends them in order.
pub struct Hooks {
    follower: JoinHandle<()>,
    pool: JoinHandle<()>,
    jobs: TaskTracker,
    stop: CancellationToken,
    timeout: Duration,
}

impl Hooks {
    /// Follow the bus for the hooks `config` lists, from now on. `None` when no hook is
    /// configured (the default): then nothing follows the bus at all.
    pub async fn start(
        config: &Config,
        bus: &Bus,
        store: Store,
    ) -> Result<Option<Hooks>, HookError> {
        if config.hooks.is_empty() {
            return Ok(None);
        }
        // Live only: what the store already holds was seen (and notified) by an earlier host.
        let subscription = bus
            .subscribe(SubscribeOptions {
                filter: SessionFilter::All,
                forward_deltas: false,
                replay: Replay::None,
                subscriber_id: None,
            })
            .await?;
        let hooks = Arc::new(config.hooks.clone());
        let settings = Arc::new(HookSettings {
            base_env: pass_env(&config.env),
            cwd: config.home.clone(),
            home: Some(HomeMarker::of(&config.home)),
            timeout: config.hooks.timeout,
        });
        let stop = CancellationToken::new();
        let jobs = TaskTracker::new();
        let (queue, waiting) = mpsc::channel(MAX_WAITING);
        let follower = tokio::spawn(follow(subscription, store, hooks, queue, stop.clone()));
        let pool = tokio::spawn(pool(waiting, settings, jobs.clone(), stop.clone()));
        tracing::info!(
            on_permission = config.hooks.on_permission.len(),
            on_run_end = config.hooks.on_run_end.len(),
            on_error = config.hooks.on_error.len(),
            timeout_ms = u64::try_from(config.hooks.timeout.as_millis()).unwrap_or(u64::MAX),
            "hooks configured"
        );
        Ok(Some(Hooks {
            follower,
            pool,
            jobs,
            stop,
            timeout: config.hooks.timeout,
        }))
    }

    /// Once the bus has drained (its last brackets — runs the shutdown interrupted — may still
    /// fire hooks): let what is queued and running finish within a short grace
    /// ([`SHUTDOWN_GRACE`], or the time limit if that is shorter), then kill the rest. Returns
    /// once the follower, the pool and every job have ended: nothing is left to start a hook.
    pub async fn shutdown(self) {
        let Hooks {
            follower,
            pool,
            jobs,
            stop,
            timeout,
        } = self;
        let grace = timeout.min(SHUTDOWN_GRACE);
        // Kept across the grace's end: a task not finished by then is awaited after the stop.
        let mut tasks = [("follower", Some(follower)), ("pool", Some(pool))];
        let finish = async {
            join_tasks(&mut tasks).await;
            jobs.close();
            jobs.wait().await;
        };
        if tokio::time::timeout(grace, finish).await.is_err() {
            tracing::warn!(
                grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                "hooks still running at shutdown; killing them"
            );
        }
        stop.cancel();
        // The pool first (it starts nothing once stopped), then the jobs it started.
        join_tasks(&mut tasks).await;
        jobs.close();
        jobs.wait().await;
    }
}

/// Await each task not yet awaited (cancel-safe: one still running stays in its slot).
async fn join_tasks(tasks: &mut [(&str, Option<JoinHandle<()>>)]) {
    for (name, slot) in tasks.iter_mut() {
        let Some(task) = slot.as_mut() else { continue };
        let result = task.await;
        *slot = None;
        if let Err(e) = result {
            tracing::error!(error = %e, "hooks {name} task failed");
        }
    }
}

/// Read every bracket of every session; queue the hooks of the ones that call for them.
async fn follow(
    mut subscription: Subscription,
    store: Store,
    hooks: Arc<HooksConfig>,
    queue: mpsc::Sender<HookJob>,
    stop: CancellationToken,
) {
    loop {
        let received = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            received = subscription.recv() => received,
        };
        let delivery = match received {
            Ok(Some(delivery)) => delivery,
            Ok(None) => break,
            Err(e) => {
                // A failed read of the store while catching up; the next call retries it.
                tracing::warn!(error = %e, "hooks: reading events failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if delivery.is_delta
            || !matches!(&*delivery.kind, "permission.request" | "run.end" | "error")
        {
            continue;
        }
        let event = match AnyEvent::from_json(&delivery.json) {
            Ok(AnyEvent::Known(event)) => event,
            Ok(AnyEvent::Unknown { .. }) => continue,
            Err(e) => {
                tracing::warn!(seq = delivery.sequence_id, error = %e, "hooks: an event could not be read; skipped");
                continue;
            }
        };
        let Some(hook_event) = HookEvent::of(&event) else {
            continue;
        };
        let commands = hook_event.kind.commands(&hooks);
        if commands.is_empty() {
            continue;
        }
        let facts = session_facts(&store, &hook_event.session_id).await;
        let env = hook_env(&hook_event, &facts);
        for (index, command) in commands.iter().enumerate() {
            let job = HookJob {
                name: format!("{}[{index}]", hook_event.kind.list_name()),
                command: command.clone(),
                session_id: hook_event.session_id.clone(),
                env: env.clone(),
            };
            match queue.try_send(job) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(job)) => tracing::warn!(
                    hook = job.name,
                    session_id = job.session_id,
                    "{MAX_RUNNING} hooks are running and {MAX_WAITING} waiting; this one is dropped"
                ),
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    }
}

/// Title and agent from the session row. Read for each event, not cached: a rename must show
/// in the next notification, and these events are few.
async fn session_facts(store: &Store, session_id: &str) -> SessionFacts {
    match store.get_session(session_id.to_owned()).await {
        Ok(Some(row)) => SessionFacts {
            title: row.title,
            agent: row.agent_type,
        },
        Ok(None) => SessionFacts::default(),
        Err(e) => {
            tracing::debug!(session_id, error = %e, "hooks: the session row could not be read");
            SessionFacts::default()
        }
    }
}

/// Start queued jobs as places free up (at most [`MAX_RUNNING`] at once), until the queue
/// closes or the host stops. A job is taken from the queue only once it has a place, so the
/// queue alone holds the waiting ones (at most [`MAX_WAITING`]).
async fn pool(
    mut waiting: mpsc::Receiver<HookJob>,
    settings: Arc<HookSettings>,
    jobs: TaskTracker,
    stop: CancellationToken,
) {
    let places = Arc::new(Semaphore::new(MAX_RUNNING));
    let mut dropped = 0usize;
    loop {
        // The stop first, whenever both are ready: nothing starts once the host stops.
        let place = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            place = places.clone().acquire_owned() => place,
        };
        let Ok(place) = place else { break };
        let job = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            job = waiting.recv() => job,
        };
        let Some(job) = job else { break };
        if stop.is_cancelled() {
            dropped += 1;
            break;
        }
        let settings = settings.clone();
        let stop = stop.clone();
        // On a runtime worker (not a blocking thread): the parent-death signal is tied to the
        // thread that forks.
        jobs.spawn(async move {
            let _place = place;
            run_hook(&job, &settings, &stop).await;
        });
    }
    waiting.close();
    while waiting.try_recv().is_ok() {
        dropped += 1;
    }
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "the host is stopping; hooks that had not started are dropped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::events::{ErrorCategory, ErrorNotice, PermissionRequest, RunEnd};

    fn event(run: Option<&str>, body: EventBody) -> Event {
        Event {
            session_id: "s-1".into(),
            run_id: run.map(str::to_owned),
            body,
        }
    }

    fn facts() -> SessionFacts {
        SessionFacts {
            title: Some("fix the build".into()),
            agent: "claude".into(),
        }
    }

    fn env_of(event: &Event) -> Vec<(String, String)> {
        hook_env(&HookEvent::of(event).unwrap(), &facts())
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_permission_request_gives_its_tool_and_request() {
        let request = event(
            Some("r-1"),
            EventBody::PermissionRequest(PermissionRequest {
                request_id: "req-9".into(),
                tool: "Bash".into(),
                ..PermissionRequest::default()
            }),
        );
        assert_eq!(
            env_of(&request),
            pairs(&[
                ("AGENT_HOST_EVENT", "permission"),
                ("AGENT_HOST_SESSION_ID", "s-1"),
                ("AGENT_HOST_SESSION_TITLE", "fix the build"),
                ("AGENT_HOST_AGENT", "claude"),
                ("AGENT_HOST_RUN_ID", "r-1"),
                ("AGENT_HOST_TOOL", "Bash"),
                ("AGENT_HOST_REQUEST_ID", "req-9"),
            ])
        );
    }

    #[test]
    fn a_run_end_gives_its_state_category_and_message() {
        let failed = event(
            Some("r-2"),
            EventBody::RunEnd(RunEnd {
                state: RunState::Failed,
                category: Some(ErrorCategory::RateLimited),
                message: Some("slow down".into()),
            }),
        );
        assert_eq!(
            env_of(&failed),
            pairs(&[
                ("AGENT_HOST_EVENT", "run_end"),
                ("AGENT_HOST_SESSION_ID", "s-1"),
                ("AGENT_HOST_SESSION_TITLE", "fix the build"),
                ("AGENT_HOST_AGENT", "claude"),
                ("AGENT_HOST_RUN_ID", "r-2"),
                ("AGENT_HOST_STATE", "failed"),
                ("AGENT_HOST_CATEGORY", "rate_limited"),
                ("AGENT_HOST_MESSAGE", "slow down"),
            ])
        );
        let completed = event(
            Some("r-3"),
            EventBody::RunEnd(RunEnd {
                state: RunState::Completed,
                category: None,
                message: None,
            }),
        );
        let env = env_of(&completed);
        assert!(env.contains(&("AGENT_HOST_STATE".into(), "completed".into())));
        assert!(
            !env.iter()
                .any(|(k, _)| k == "AGENT_HOST_CATEGORY" || k == "AGENT_HOST_MESSAGE")
        );
    }

    #[test]
    fn an_error_without_a_run_or_a_title_still_sets_the_common_variables() {
        let error = event(
            None,
            EventBody::Error(ErrorNotice {
                category: ErrorCategory::AuthRequired,
                message: format!("log in\0 again{}", "x".repeat(10_000)),
            }),
        );
        let env = hook_env(&HookEvent::of(&error).unwrap(), &SessionFacts::default());
        let get = |name: &str| {
            env.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{name} unset: {env:?}"))
        };
        assert_eq!(get("AGENT_HOST_EVENT"), "error");
        assert_eq!(get("AGENT_HOST_RUN_ID"), "");
        assert_eq!(get("AGENT_HOST_SESSION_TITLE"), "");
        assert_eq!(get("AGENT_HOST_AGENT"), "");
        assert_eq!(get("AGENT_HOST_CATEGORY"), "auth_required");
        let message = get("AGENT_HOST_MESSAGE");
        assert!(message.starts_with("log in again"), "{message:.40}");
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(
            !env.iter()
                .any(|(k, _)| k == "AGENT_HOST_TOOL" || k == "AGENT_HOST_STATE")
        );
    }

    #[test]
    fn other_events_call_no_hook() {
        let start = event(
            Some("r"),
            EventBody::RunStart(crate::protocol::events::RunStart::default()),
        );
        assert_eq!(HookEvent::of(&start), None);
    }

    #[test]
    fn hooks_get_what_a_notifier_needs_and_no_provider_key() {
        let host = pairs(&[
            ("PATH", "/bin"),
            ("HOME", "/h"),
            ("DISPLAY", ":0"),
            ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1/bus"),
            ("XDG_RUNTIME_DIR", "/run/user/1"),
            ("LC_ALL", "C"),
            ("ANTHROPIC_API_KEY", "sk-ant-canary"),
            ("OPENAI_API_KEY", "canary"),
            ("AGENTHOST_SESSION_ID", "outer"),
            ("CARGO_HOME", "/c"),
        ]);
        let mut names: Vec<String> = pass_env(&host).into_iter().map(|(k, _)| k).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "DBUS_SESSION_BUS_ADDRESS",
                "DISPLAY",
                "HOME",
                "LC_ALL",
                "PATH",
                "XDG_RUNTIME_DIR"
            ]
        );
    }

    fn settings(dir: &std::path::Path, timeout: Duration) -> HookSettings {
        HookSettings {
            base_env: pairs(&[("PATH", "/usr/local/bin:/usr/bin:/bin")]),
            cwd: dir.to_owned(),
            home: None,
            timeout,
        }
    }

    fn job(argv: &[&str]) -> HookJob {
        HookJob {
            name: "on_permission[0]".into(),
            command: HookCommand {
                program: argv[0].to_owned(),
                args: argv[1..].iter().map(|a| (*a).to_owned()).collect(),
            },
            session_id: "s-1".into(),
            env: pairs(&[
                ("AGENT_HOST_EVENT", "permission"),
                ("AGENT_HOST_TOOL", "Bash"),
            ]),
        }
    }

    fn is_running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().next().map(|s| s != "Z")
            })
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn a_hook_that_hangs_is_killed_at_its_time_limit_and_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let outcome = run_hook(
            &job(&["sleep", "1000"]),
            &settings(dir.path(), Duration::from_millis(300)),
            &CancellationToken::new(),
        )
        .await;
        let elapsed = started.elapsed();
        let HookOutcome::TimedOut { pid: Some(pid) } = outcome else {
            panic!("{outcome:?}");
        };
        assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
        // Reaped, not only killed: no process, not even a zombie, has the pid.
        assert!(!is_running(pid), "{pid} still runs");
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} was not reaped"
        );
    }

    /// A FIFO the test reads lines from, held open for writing too (a writer never waits for
    /// the test, and the test never sees an end between writers).
    fn fifo(
        path: &std::path::Path,
    ) -> tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::pipe::Receiver>> {
        use tokio::io::AsyncBufReadExt;
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let rx = tokio::net::unix::pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(path)
            .unwrap();
        tokio::io::BufReader::new(rx).lines()
    }

    async fn next_pid(
        lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::pipe::Receiver>>,
    ) -> u32 {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("no pid from the hook")
            .unwrap()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Says its pid in the FIFO `$1`, then hangs as that same process.
    const REPORT_AND_HANG: &str = "echo $$ > \"$1\"; exec sleep 1000";

    #[tokio::test]
    async fn a_stopping_host_kills_a_running_hook() {
        let dir = tempfile::tempdir().unwrap();
        let fifo_path = dir.path().join("pid");
        let mut pids = fifo(&fifo_path);
        let stop = CancellationToken::new();
        let hook = job(&[
            "/bin/sh",
            "-c",
            REPORT_AND_HANG,
            "sh",
            fifo_path.to_str().unwrap(),
        ]);
        let hook_settings = settings(dir.path(), Duration::from_secs(600));
        let running = tokio::spawn({
            let stop = stop.clone();
            async move { run_hook(&hook, &hook_settings, &stop).await }
        });
        // Running, as the hook itself says: the stop comes well after the spawn.
        let pid = next_pid(&mut pids).await;
        assert!(is_running(pid), "{pid} is not running");
        stop.cancel();
        let outcome = tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(outcome, HookOutcome::Stopped { pid: Some(p) } if p == pid),
            "{outcome:?}"
        );
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} was not killed and reaped"
        );
    }

    #[tokio::test]
    async fn a_hook_starts_nothing_once_the_host_stops() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("made");
        let stop = CancellationToken::new();
        stop.cancel();
        let outcome = run_hook(
            &job(&["touch", made.to_str().unwrap()]),
            &settings(dir.path(), Duration::from_secs(10)),
            &stop,
        )
        .await;
        assert!(
            matches!(outcome, HookOutcome::Stopped { pid: None }),
            "{outcome:?}"
        );
        assert!(!made.exists());
    }

    #[tokio::test]
    async fn what_a_hook_leaves_running_is_killed_when_it_exits() {
        let dir = tempfile::tempdir().unwrap();
        let fifo_path = dir.path().join("pid");
        let mut pids = fifo(&fifo_path);
        let outcome = run_hook(
            &job(&[
                "/bin/sh",
                "-c",
                "sleep 1000 & echo $! > \"$1\"",
                "sh",
                fifo_path.to_str().unwrap(),
            ]),
            &settings(dir.path(), Duration::from_secs(10)),
            &CancellationToken::new(),
        )
        .await;
        assert!(
            matches!(&outcome, HookOutcome::Exited { status, .. } if status.success()),
            "{outcome:?}"
        );
        let left = next_pid(&mut pids).await;
        assert!(
            !is_running(left),
            "the hook's `sleep &` ({left}) still runs"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_most_max_running_run_and_max_waiting_wait() {
        let dir = tempfile::tempdir().unwrap();
        let fifo_path = dir.path().join("pids");
        let mut pids = fifo(&fifo_path);
        let (queue, waiting) = mpsc::channel(MAX_WAITING);
        let stop = CancellationToken::new();
        let jobs = TaskTracker::new();
        let pool = tokio::spawn(pool(
            waiting,
            Arc::new(settings(dir.path(), Duration::from_secs(600))),
            jobs.clone(),
            stop.clone(),
        ));
        let hang = job(&[
            "/bin/sh",
            "-c",
            REPORT_AND_HANG,
            "sh",
            fifo_path.to_str().unwrap(),
        ]);
        for _ in 0..MAX_RUNNING {
            queue.try_send(hang.clone()).unwrap();
        }
        let mut running = Vec::new();
        for _ in 0..MAX_RUNNING {
            running.push(next_pid(&mut pids).await);
        }
        // Every place is taken and the pool holds no job: the queue alone holds the waiting.
        let marker = |i: usize| dir.path().join(format!("ran-{i}"));
        let later = |i: usize| job(&["touch", marker(i).to_str().unwrap()]);
        for i in 0..MAX_WAITING {
            queue.try_send(later(i)).unwrap();
        }
        assert!(
            matches!(
                queue.try_send(later(MAX_WAITING)),
                Err(mpsc::error::TrySendError::Full(_))
            ),
            "a hook past {MAX_RUNNING} running and {MAX_WAITING} waiting was taken"
        );
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), pool)
            .await
            .unwrap()
            .unwrap();
        jobs.close();
        tokio::time::timeout(Duration::from_secs(10), jobs.wait())
            .await
            .unwrap();
        for pid in running {
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "{pid} outlived the stop"
            );
        }
        // The waiting ones were dropped, never started.
        for i in 0..=MAX_WAITING {
            assert!(!marker(i).exists(), "waiting hook {i} ran after the stop");
        }
    }

    #[tokio::test]
    async fn argv_is_not_interpreted_by_a_shell() {
        let dir = tempfile::tempdir().unwrap();
        let name = "$(touch pwned); `touch pwned2` * $AGENT_HOST_TOOL";
        let target = dir.path().join(name);
        let outcome = run_hook(
            &job(&["touch", target.to_str().unwrap()]),
            &settings(dir.path(), Duration::from_secs(10)),
            &CancellationToken::new(),
        )
        .await;
        assert!(
            matches!(&outcome, HookOutcome::Exited { status, .. } if status.success()),
            "{outcome:?}"
        );
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [name]);
    }

    /// What the host's log would get, formatted, while the guard lives (this thread only:
    /// a current-thread runtime runs the stdout drain here too).
    fn capture_log() -> (
        Arc<std::sync::Mutex<Vec<u8>>>,
        tracing::subscriber::DefaultGuard,
    ) {
        #[derive(Clone)]
        struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Sink(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        (buffer, tracing::subscriber::set_default(subscriber))
    }

    #[tokio::test]
    async fn the_hook_sees_its_environment_and_an_ended_stdin() {
        let (log, _guard) = capture_log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("env");
        // The program here happens to be a shell; the hook's argv still reaches it unexpanded.
        let outcome = run_hook(
            &job(&[
                "/bin/sh",
                "-c",
                "cat > /dev/null; env > \"$1\"; echo to-the-log; echo oops >&2; exit 3",
                "sh",
                out.to_str().unwrap(),
            ]),
            &settings(dir.path(), Duration::from_secs(10)),
            &CancellationToken::new(),
        )
        .await;
        let HookOutcome::Exited { status, .. } = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(status.code(), Some(3));
        let env = std::fs::read_to_string(&out).unwrap();
        for line in [
            "AGENT_HOST_EVENT=permission",
            "AGENT_HOST_TOOL=Bash",
            "PATH=/usr/local/bin:/usr/bin:/bin",
        ] {
            assert!(env.lines().any(|l| l == line), "{line} missing: {env}");
        }
        // The child ran in the configured directory.
        assert!(
            env.lines()
                .any(|l| l == format!("PWD={}", dir.path().display())),
            "{env}"
        );
        // stdout went to the log at info, named by the hook and the session; stderr's last
        // lines came with the outcome.
        let log = String::from_utf8(log.lock().unwrap().clone()).unwrap();
        let output = log
            .lines()
            .find(|l| l.contains("hook output: to-the-log"))
            .unwrap_or_else(|| panic!("no output line in {log}"));
        assert!(
            output.contains(" INFO ")
                && output.contains("hook=\"on_permission[0]\"")
                && output.contains("session_id=\"s-1\""),
            "{output}"
        );
        let failed = log
            .lines()
            .find(|l| l.contains("hook failed"))
            .unwrap_or_else(|| panic!("no outcome in {log}"));
        assert!(
            failed.contains(" WARN ") && failed.contains("oops"),
            "{failed}"
        );
    }

    #[tokio::test]
    async fn a_missing_program_is_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let outcome = run_hook(
            &job(&["/nonexistent/notifier"]),
            &settings(dir.path(), Duration::from_secs(10)),
            &CancellationToken::new(),
        )
        .await;
        assert!(matches!(outcome, HookOutcome::NotStarted(_)), "{outcome:?}");
    }
}
