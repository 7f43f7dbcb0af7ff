//! The session actor's state machine: what the session's agent process and its current run are
//! doing, as one enum whose variants carry the data each phase needs, and every transition
//! between them. Pure: no I/O, no publishing, no store. The handlers (`queue`, `turn`, `open`,
//! `permissions`, `outage`, `files`, `stop`) do the I/O around these transitions, in the order
//! the events must be seen.
//!
//! [`State`] is the agent × run machine:
//!
//! | state | agent process | run | published |
//! | --- | --- | --- | --- |
//! | `Cold { next }` | none; [`NextOpen`] says how the next open goes | none | `idle` (`running` while a prompt waits) |
//! | `Idle { agent, close_at }` | ours, closed at `close_at` | none | `idle` (`running` while a prompt waits) |
//! | `Running { agent, run }` | ours, the prompt is with it | [`Run`] | `running`, `waiting` while a request is pending |
//! | `Opening { run, next }` | none: one is being opened for the run, or the run is ending because its agent went | [`Run`] | `running` |
//!
//! `Opening` is only ever seen inside a handler: an open is decided and made in one go, and a
//! run whose agent went away ends in the same handler.
//!
//! Inside the agent ([`Live`], its [`Child`]): [`Opened`] is the resume/fork machine (a resume
//! or a fork not bound yet, a fork bound to its own id), [`Watch`] the file-watching one (off,
//! due, an idle watch, a tail), and `drifted` says someone else wrote the file (the next prompt
//! closes this child and forks). A [`Run`] carries its [`Ending`]: asked to cancel, or cut by a
//! store outage. [`Link`] is the store's side, kept beside the state because it is orthogonal
//! to it: the store can fail in any state and the agent side goes on (a turn is cut, an idle
//! agent keeps its timer); while it is [`Link::Down`] nothing new is dispatched and the runs the
//! outage cut wait in it to be closed. [`Binding`] is the native session the row binds.
//!
//! What the types rule out: an idle timer, a watch, a tail, an owned pid, a resume or fork under
//! way and a drift without a live agent; a decided fork with one; a cancel deadline or a cut
//! without a run; a retry or unclosed runs without an outage; an unsaved id without an id.

use std::mem;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::protocol::events::Notice;
use crate::protocol::states::{RunStatus, SessionState};
use crate::session::agent::{AgentSession, FileChanges, Native};
use crate::session::ownership::{OwnedPid, Tail};

/// The agent × run state of one session (see the module's table).
pub(super) enum State {
    /// No agent process and no run.
    Cold { next: NextOpen },
    /// Our agent process between runs; closed at `close_at` (`None`: kept).
    Idle {
        agent: Live,
        close_at: Option<Instant>,
    },
    /// A run whose prompt is with our agent.
    Running { agent: Live, run: Run },
    /// A run with no agent process (inside a handler only): one is being opened for it, or it
    /// ends because its agent went away.
    Opening { run: Run, next: NextOpen },
}

/// How the next open goes, decided while no agent runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum NextOpen {
    /// Decided at the open: the ownership check of a bound session, the source of a forked or
    /// imported one, or a new native session.
    #[default]
    Decide,
    /// A fork, for this reason: decided while our child ran (someone else holds or wrote its
    /// session), or as a fork ended before it had an id of its own.
    Fork(String),
    /// Someone else wrote the file (why; already warned) after our child ended: a fork, with
    /// whoever still holds the session named when it opens.
    Drifted(String),
}

/// A live agent: its handle and what the host knows of its process and file.
pub(super) struct Live {
    pub session: AgentSession,
    pub child: Child,
}

/// What the host knows of its live child for the session (kept apart from the handle, which
/// closing consumes: the file is read once the process is gone).
pub(super) struct Child {
    /// Our process by pid and start time: the agent's, or for a per-turn family the latest
    /// turn's (reported by [`crate::session::agent::AgentOutput::Pid`]); `None` while unknown.
    pub owned: Option<OwnedPid>,
    pub opened: Opened,
    /// Someone else wrote the file while this child had it (why, warned): it is not continued.
    pub drifted: Option<String>,
    /// It was opened with options changed since (a `session.set_model` it could not take
    /// live): closed once its run ends, and never given another prompt.
    pub outdated: bool,
    pub watch: Watch,
}

/// How the agent was opened, and how far the agent confirmed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Opened {
    /// A new native session, which nobody else knew.
    New,
    /// The bound native session, in place; `bound` once the agent confirmed it.
    Resumed { bound: bool },
    /// A fork of `from` (for `why`): its file starts as a copy of its source's history, with
    /// prompts by whoever wrote them. Until the agent binds an id of its own, the file it writes
    /// is still the source, which is not ours.
    Forked {
        from: String,
        why: String,
        bound: ForkBound,
    },
}

/// How far a fork is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ForkBound {
    /// Nothing yet: a resume (or fork) the agent may still reject.
    Not,
    /// The agent bound its source's id (it has not forked yet).
    Source,
    /// The fork has its own id.
    Own,
}

/// The watch on the session file of a live child.
pub(super) enum Watch {
    /// Not watched: our child writes it (a turn), or it cannot be watched.
    Off,
    /// To be watched from then on (our child's late writes are over).
    Due(Instant),
    /// Unattributed families, while our child is idle: any change is someone else's.
    Idle(FileChanges),
    /// Attributed families, while our child lives: what the host read of the file, and the
    /// watch that says when to read more (`None`: it cannot be watched).
    Tail(Tail, Option<FileChanges>),
}

/// The run in progress.
pub(super) struct Run {
    pub id: String,
    pub text: String,
    /// The prompt's attachments, handed to the agent with it.
    pub attachments: Vec<crate::protocol::options::Attachment>,
    /// A rejected resume already fell back to a fresh session in this run.
    pub retried_fresh: bool,
    pub ending: Ending,
}

/// Whether something asked the run to end before the agent did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ending {
    /// Nothing did.
    No,
    /// A cancel: the turn must end by `by`, else the process group is killed.
    Cancel { by: Instant },
    /// The store failed during it (`why`): it is being interrupted (by `by`), nothing more of it
    /// is published, and it is closed `interrupted` once the store is back.
    Cut { by: Instant, why: String },
}

/// The store, as this actor has seen it.
pub(super) enum Link {
    /// It commits.
    Up,
    /// It cannot commit: no new work is dispatched until it can.
    Down(Outage),
}

pub(super) struct Outage {
    pub why: String,
    /// A refusal was seen while the store's health said `ok` (it may be over already): look
    /// again then, never in a tight loop.
    pub retry_at: Option<Instant>,
    /// Runs the outage cut short, to close with `run.end` `interrupted` once it is over.
    pub unclosed: Vec<String>,
    /// Run rows that could not be written, written once it is over.
    pub rows: Vec<RowUpdate>,
    /// Warnings that undo a claim the log already holds (a steer's `user.text` the turn did
    /// not take) and could not be committed: published first once it is over.
    pub notices: Vec<HeldNotice>,
}

/// A warning the store could not commit, kept for when it can: its run (if any) and body.
pub(super) struct HeldNotice {
    pub run_id: Option<String>,
    pub notice: Notice,
}

/// A run row's end that the store refused.
pub(super) struct RowUpdate {
    pub run_id: String,
    pub state: RunStatus,
    pub category: Option<String>,
    pub message: Option<String>,
}

/// The native session the session row binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Binding {
    /// None yet: the first open starts a new one.
    Unbound,
    /// A forked or imported session before its first agent: that agent forks `source`.
    ForkOf(String),
    /// The agent's native session; `unsaved`: the row does not say so yet (the store refused
    /// it), saved once the store is back.
    Bound { id: String, unsaved: bool },
}

impl State {
    pub fn run(&self) -> Option<&Run> {
        match self {
            State::Running { run, .. } | State::Opening { run, .. } => Some(run),
            State::Cold { .. } | State::Idle { .. } => None,
        }
    }

    pub fn run_mut(&mut self) -> Option<&mut Run> {
        match self {
            State::Running { run, .. } | State::Opening { run, .. } => Some(run),
            State::Cold { .. } | State::Idle { .. } => None,
        }
    }

    pub fn run_id(&self) -> Option<String> {
        self.run().map(|r| r.id.clone())
    }

    pub fn live(&self) -> Option<&Live> {
        match self {
            State::Idle { agent, .. } | State::Running { agent, .. } => Some(agent),
            State::Cold { .. } | State::Opening { .. } => None,
        }
    }

    pub fn live_mut(&mut self) -> Option<&mut Live> {
        match self {
            State::Idle { agent, .. } | State::Running { agent, .. } => Some(agent),
            State::Cold { .. } | State::Opening { .. } => None,
        }
    }

    /// The run and the agent at once (a cancel interrupts the agent of the run it marks).
    pub fn parts_mut(&mut self) -> (Option<&mut Run>, Option<&mut Live>) {
        match self {
            State::Cold { .. } => (None, None),
            State::Idle { agent, .. } => (None, Some(agent)),
            State::Running { agent, run } => (Some(run), Some(agent)),
            State::Opening { run, .. } => (Some(run), None),
        }
    }

    /// When the idle agent is closed.
    pub fn close_at(&self) -> Option<Instant> {
        match self {
            State::Idle { close_at, .. } => *close_at,
            _ => None,
        }
    }

    /// Why the next prompt must fork because someone else wrote the file, if that was seen.
    pub fn drifted(&self) -> Option<&str> {
        match self {
            State::Idle { agent, .. } | State::Running { agent, .. } => {
                agent.child.drifted.as_deref()
            }
            State::Cold { next, .. } | State::Opening { next, .. } => match next {
                NextOpen::Drifted(why) => Some(why),
                NextOpen::Decide | NextOpen::Fork(_) => None,
            },
        }
    }

    /// The published session state: `idle` with no run and no prompt waiting, `waiting` while
    /// a run has a pending permission request, `running` otherwise (a prompt waiting at the
    /// queue's head, between two runs or for the store, keeps the session busy).
    pub fn published(&self, queued: bool, pending: bool) -> SessionState {
        match self.run() {
            None if !queued => SessionState::Idle,
            Some(_) if pending => SessionState::Waiting,
            _ => SessionState::Running,
        }
    }

    /// A run begins: `Idle` → `Running` (its timer dropped), `Cold` → `Opening`. A run in
    /// progress already refuses it (handed back).
    pub fn start(&mut self, run: Run) -> Result<(), Run> {
        match mem::replace(self, State::cold()) {
            State::Cold { next } => *self = State::Opening { run, next },
            State::Idle { agent, .. } => *self = State::Running { agent, run },
            busy @ (State::Running { .. } | State::Opening { .. }) => {
                *self = busy;
                return Err(run);
            }
        }
        Ok(())
    }

    /// The run ends: `Running` → `Idle` (no timer yet), `Opening` → `Cold`.
    pub fn finish(&mut self) -> Option<Run> {
        match mem::replace(self, State::cold()) {
            State::Running { agent, run } => {
                *self = State::Idle {
                    agent,
                    close_at: None,
                };
                Some(run)
            }
            State::Opening { run, next } => {
                *self = State::Cold { next };
                Some(run)
            }
            idle @ (State::Cold { .. } | State::Idle { .. }) => {
                *self = idle;
                None
            }
        }
    }

    /// An agent was opened: `Cold` → `Idle` (no timer yet), `Opening` → `Running`. An agent
    /// already there (never, by the handlers) is displaced and handed back.
    pub fn opened(&mut self, live: Live) -> Option<Live> {
        match mem::replace(self, State::cold()) {
            State::Cold { .. } => {
                *self = State::Idle {
                    agent: live,
                    close_at: None,
                };
                None
            }
            State::Opening { run, .. } => {
                *self = State::Running { agent: live, run };
                None
            }
            State::Idle { agent, close_at } => {
                *self = State::Idle {
                    agent: live,
                    close_at,
                };
                Some(agent)
            }
            State::Running { agent, run } => {
                *self = State::Running { agent: live, run };
                Some(agent)
            }
        }
    }

    /// The agent goes (it exited, or is being closed or killed): `Idle` → `Cold`, `Running`
    /// → `Opening`, with [`NextOpen::Decide`] until [`State::set_next`] says otherwise.
    pub fn take_live(&mut self) -> Option<Live> {
        match mem::replace(self, State::cold()) {
            State::Idle { agent, .. } => Some(agent),
            State::Running { agent, run } => {
                *self = State::Opening {
                    run,
                    next: NextOpen::Decide,
                };
                Some(agent)
            }
            cold @ (State::Cold { .. } | State::Opening { .. }) => {
                *self = cold;
                None
            }
        }
    }

    /// How the next open goes (no agent runs; ignored while one does).
    pub fn set_next(&mut self, next: NextOpen) {
        if let State::Cold { next: at } | State::Opening { next: at, .. } = self {
            *at = next;
        }
    }

    /// Take how the next open goes, for the open about to be made.
    pub fn take_next(&mut self) -> NextOpen {
        match self {
            State::Cold { next } | State::Opening { next, .. } => mem::take(next),
            State::Idle { .. } | State::Running { .. } => NextOpen::Decide,
        }
    }

    /// Arm (or disarm) the idle agent's timer; nothing without an idle agent.
    pub fn set_close_at(&mut self, at: Option<Instant>) {
        if let State::Idle { close_at, .. } = self {
            *close_at = at;
        }
    }

    fn cold() -> State {
        State::Cold {
            next: NextOpen::Decide,
        }
    }
}

impl Live {
    pub fn new(session: AgentSession, opened: Opened, watch: Watch) -> Live {
        let owned = session.pid().and_then(OwnedPid::of);
        Live {
            session,
            child: Child {
                owned,
                opened,
                drifted: None,
                outdated: false,
                watch,
            },
        }
    }

    /// The driver reports the process now running the session (`None`: none between turns).
    pub fn process(&mut self, pid: Option<u32>) {
        self.session.set_pid(pid);
        if let Some(owned) = pid.and_then(OwnedPid::of) {
            self.child.owned = Some(owned);
        }
    }
}

impl Child {
    /// Someone else wrote the file: it is not read or watched any more, and the child is not
    /// continued. True if this is news (to be warned about).
    pub fn drift(&mut self, why: String) -> bool {
        self.watch = Watch::Off;
        if self.drifted.is_some() {
            return false;
        }
        self.drifted = Some(why);
        true
    }

    /// What the next open must do once this child is gone: fork if someone else wrote its file,
    /// or if it was a fork that never had an id of its own (the file it wrote is the source's).
    pub fn next_open(&self) -> NextOpen {
        match (&self.drifted, self.opened.forking_from()) {
            (Some(why), _) => NextOpen::Drifted(why.clone()),
            (None, Some((_, why))) => NextOpen::Fork(why.to_owned()),
            (None, None) => NextOpen::Decide,
        }
    }
}

impl Opened {
    /// How `native` is opened; `why`: the reason for a fork.
    pub fn of(native: &Native, why: &str) -> Opened {
        match native {
            Native::New(_) => Opened::New,
            Native::Resume(_) => Opened::Resumed { bound: false },
            Native::Fork(from) => Opened::Forked {
                from: from.clone(),
                why: why.to_owned(),
                bound: ForkBound::Not,
            },
        }
    }

    /// Opened on an existing session that the agent has not confirmed yet (it may reject it).
    pub fn resuming(&self) -> bool {
        matches!(
            self,
            Opened::Resumed { bound: false }
                | Opened::Forked {
                    bound: ForkBound::Not,
                    ..
                }
        )
    }

    /// A fork without an id of its own yet: its source and why.
    pub fn forking_from(&self) -> Option<(&str, &str)> {
        match self {
            Opened::Forked {
                from,
                why,
                bound: ForkBound::Not | ForkBound::Source,
            } => Some((from, why)),
            _ => None,
        }
    }

    /// Opened as a fork (its file starts with someone's history).
    pub fn born_fork(&self) -> bool {
        matches!(self, Opened::Forked { .. })
    }

    /// The agent bound native session `id`.
    pub fn bound(&mut self, id: &str) {
        match self {
            Opened::New => {}
            Opened::Resumed { bound } => *bound = true,
            Opened::Forked { from, bound, .. } => {
                *bound = if from == id && *bound != ForkBound::Own {
                    ForkBound::Source
                } else {
                    ForkBound::Own
                };
            }
        }
    }
}

impl Watch {
    /// When a due watch starts.
    pub fn due(&self) -> Option<Instant> {
        match self {
            Watch::Due(at) => Some(*at),
            _ => None,
        }
    }

    /// The change tokens, while the file is watched.
    pub fn changes_mut(&mut self) -> Option<&mut mpsc::Receiver<()>> {
        match self {
            Watch::Idle(changes) | Watch::Tail(_, Some(changes)) => Some(&mut changes.changes),
            Watch::Off | Watch::Due(_) | Watch::Tail(_, None) => None,
        }
    }

    pub fn watching(&self) -> bool {
        matches!(self, Watch::Idle(_) | Watch::Tail(_, Some(_)))
    }

    pub fn has_tail(&self) -> bool {
        matches!(self, Watch::Tail(..))
    }

    /// The tail and its watch, taken out (the watch is `Off` until they are put back).
    pub fn take_tail(&mut self) -> Option<(Tail, Option<FileChanges>)> {
        match mem::replace(self, Watch::Off) {
            Watch::Tail(tail, changes) => Some((tail, changes)),
            other => {
                *self = other;
                None
            }
        }
    }
}

impl Run {
    pub fn new(id: String, text: String) -> Run {
        Run {
            id,
            text,
            attachments: Vec::new(),
            retried_fresh: false,
            ending: Ending::No,
        }
    }

    /// When the turn must have ended.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.ending {
            Ending::No => None,
            Ending::Cancel { by } | Ending::Cut { by, .. } => Some(*by),
        }
    }

    pub fn is_cut(&self) -> bool {
        matches!(self.ending, Ending::Cut { .. })
    }

    /// A cancel, to end by `by`: true if it is the first ending asked for (the agent is
    /// interrupted once per run).
    pub fn cancel(&mut self, by: Instant) -> bool {
        if self.ending != Ending::No {
            return false;
        }
        self.ending = Ending::Cancel { by };
        true
    }

    /// The store failed: the run is cut (a deadline already set stays). True if the agent is
    /// to be interrupted now (nothing had asked it to end).
    pub fn cut(&mut self, by: Instant, why: String) -> bool {
        match &self.ending {
            Ending::No => {
                self.ending = Ending::Cut { by, why };
                true
            }
            Ending::Cancel { by } => {
                self.ending = Ending::Cut { by: *by, why };
                false
            }
            Ending::Cut { .. } => false,
        }
    }
}

impl Link {
    pub fn is_down(&self) -> bool {
        matches!(self, Link::Down(_))
    }

    pub fn retry_at(&self) -> Option<Instant> {
        match self {
            Link::Down(outage) => outage.retry_at,
            Link::Up => None,
        }
    }

    pub fn clear_retry(&mut self) {
        if let Link::Down(outage) = self {
            outage.retry_at = None;
        }
    }

    /// The store cannot commit (`why`, unless an outage is already known).
    pub fn down(&mut self, why: String) {
        if let Link::Up = self {
            *self = Link::Down(Outage {
                why,
                retry_at: None,
                unclosed: Vec::new(),
                rows: Vec::new(),
                notices: Vec::new(),
            });
        }
    }

    pub fn outage_mut(&mut self) -> Option<&mut Outage> {
        match self {
            Link::Down(outage) => Some(outage),
            Link::Up => None,
        }
    }

    /// The outage is over (as far as this actor goes): what it left to do.
    pub fn up(&mut self) -> Option<Outage> {
        match mem::replace(self, Link::Up) {
            Link::Down(outage) => Some(outage),
            Link::Up => None,
        }
    }
}

impl Binding {
    pub fn of_row(native: Option<String>, fork_of: Option<String>) -> Binding {
        match (native, fork_of) {
            (Some(id), _) => Binding::Bound { id, unsaved: false },
            (None, Some(source)) => Binding::ForkOf(source),
            (None, None) => Binding::Unbound,
        }
    }

    /// The bound native id.
    pub fn id(&self) -> Option<&str> {
        match self {
            Binding::Bound { id, .. } => Some(id),
            Binding::Unbound | Binding::ForkOf(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(opened: Opened) -> Live {
        let (input, _inputs) = mpsc::channel(1);
        let (_outputs, events) = mpsc::channel(1);
        Live::new(AgentSession::new(input, events, None), opened, Watch::Off)
    }

    fn run(id: &str) -> Run {
        Run::new(id.to_owned(), "hi".to_owned())
    }

    fn name(state: &State) -> &'static str {
        match state {
            State::Cold { .. } => "cold",
            State::Idle { .. } => "idle",
            State::Running { .. } => "running",
            State::Opening { .. } => "opening",
        }
    }

    #[test]
    fn a_run_moves_between_the_agent_states() {
        let mut state = State::cold();
        // Cold: a run opens its agent.
        assert!(state.start(run("r1")).is_ok());
        assert_eq!(name(&state), "opening");
        assert!(state.start(run("r2")).is_err(), "one run at a time");
        assert!(state.opened(live(Opened::New)).is_none());
        assert_eq!(name(&state), "running");
        assert_eq!(state.run_id().as_deref(), Some("r1"));
        assert!(state.finish().is_some());
        assert_eq!(name(&state), "idle");
        // Idle: the timer belongs to the idle agent and goes with a run.
        let at = Instant::now();
        state.set_close_at(Some(at));
        assert_eq!(state.close_at(), Some(at));
        assert!(state.start(run("r2")).is_ok());
        assert_eq!((name(&state), state.close_at()), ("running", None));
        // The agent goes mid-run: opening, until the run ends or a new one opens.
        assert!(state.take_live().is_some());
        assert_eq!(name(&state), "opening");
        state.set_next(NextOpen::Fork("why".into()));
        assert_eq!(state.take_next(), NextOpen::Fork("why".into()));
        assert_eq!(state.take_next(), NextOpen::Decide);
        assert!(state.finish().is_some());
        assert_eq!(name(&state), "cold");
        assert!(state.finish().is_none());
        assert!(state.take_live().is_none());
        // Activation: cold to idle without a run.
        assert!(state.opened(live(Opened::New)).is_none());
        assert_eq!(name(&state), "idle");
        state.set_next(NextOpen::Fork("ignored while an agent runs".into()));
        assert!(state.take_live().is_some());
        assert_eq!(name(&state), "cold");
        assert_eq!(state.take_next(), NextOpen::Decide);
    }

    #[test]
    fn the_published_state_follows_the_run_the_queue_and_the_requests() {
        let mut state = State::cold();
        assert_eq!(state.published(false, false), SessionState::Idle);
        assert_eq!(state.published(true, false), SessionState::Running);
        // A request outside a run does not make the session wait.
        assert_eq!(state.published(false, true), SessionState::Idle);
        assert!(state.start(run("r1")).is_ok());
        assert_eq!(state.published(false, false), SessionState::Running);
        assert_eq!(state.published(true, true), SessionState::Waiting);
    }

    #[test]
    fn a_fork_is_ours_only_once_bound_to_its_own_id() {
        let mut opened = Opened::of(&Native::Fork("src".into()), "held");
        assert!(opened.resuming() && opened.born_fork());
        assert_eq!(opened.forking_from(), Some(("src", "held")));
        opened.bound("src");
        assert!(!opened.resuming());
        assert_eq!(opened.forking_from(), Some(("src", "held")));
        opened.bound("fork");
        assert_eq!(opened.forking_from(), None);
        opened.bound("src");
        assert_eq!(opened.forking_from(), None, "own for good");
        assert!(opened.born_fork());

        let mut resumed = Opened::of(&Native::Resume("id".into()), "");
        assert!(resumed.resuming());
        resumed.bound("id");
        assert!(!resumed.resuming() && !resumed.born_fork());
        assert!(!Opened::of(&Native::New("n".into()), "").resuming());
    }

    #[test]
    fn a_gone_child_says_how_the_next_open_goes() {
        let mut agent = live(Opened::of(&Native::Fork("src".into()), "held"));
        assert_eq!(agent.child.next_open(), NextOpen::Fork("held".into()));
        assert!(agent.child.drift("written".into()));
        assert!(!agent.child.drift("again".into()), "warned once");
        assert_eq!(agent.child.next_open(), NextOpen::Drifted("written".into()));
        let mut state = State::cold();
        assert!(state.opened(agent).is_none());
        assert_eq!(state.drifted(), Some("written"));
        assert_eq!(
            live(Opened::Resumed { bound: true }).child.next_open(),
            NextOpen::Decide
        );
    }

    #[test]
    fn a_cancel_and_a_cut_share_one_deadline() {
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(1);
        let mut r = run("r");
        assert!(r.cancel(now));
        assert!(!r.cancel(later), "one interrupt per run");
        assert!(!r.cut(later, "full".into()), "already interrupted");
        assert!(r.is_cut());
        assert_eq!(r.deadline(), Some(now));
        let mut r = run("r");
        assert!(r.cut(now, "full".into()));
        assert!(!r.cut(later, "full".into()));
        assert!(!r.cancel(later));
        assert_eq!(r.deadline(), Some(now));
    }

    #[test]
    fn an_outage_holds_its_retry_and_what_it_cut() {
        let mut link = Link::Up;
        assert_eq!(link.retry_at(), None);
        link.down("full".into());
        link.outage_mut().unwrap().unclosed.push("r1".into());
        link.down("other".into());
        link.outage_mut().unwrap().retry_at = Some(Instant::now());
        assert!(link.is_down() && link.retry_at().is_some());
        link.clear_retry();
        assert_eq!(link.retry_at(), None);
        let outage = link.up().unwrap();
        assert_eq!((outage.why.as_str(), outage.unclosed.len()), ("full", 1));
        assert!(!link.is_down() && link.up().is_none());
    }

    #[test]
    fn the_row_says_what_is_bound() {
        assert_eq!(
            Binding::of_row(Some("n".into()), Some("f".into())).id(),
            Some("n")
        );
        assert_eq!(
            Binding::of_row(None, Some("f".into())),
            Binding::ForkOf("f".into())
        );
        assert_eq!(Binding::of_row(None, None), Binding::Unbound);
    }
}
