//! Crash torture (issue 13): the real host process (`host.start`, detached), a scripted ACP
//! agent that streams thousands of brackets a turn (`tests/support/torture-acp.js`, registered
//! in `config.toml` like any user's agent), and one WebSocket subscriber that records and acks
//! every bracket it is sent. Each trial kills the host with SIGKILL at a random moment — mid
//! stream, right as a prompt is being sent, or right after a restart, while recovery and replay
//! run — starts it again, reconnects the subscriber (`subscriber.grant`) with its own cursor, and
//! keeps the prompts coming; a send whose reply was lost is sent again with the same
//! `client_msg_id`. At the end the host is shut down cleanly and started once more, and the
//! whole history is checked against what the subscriber received: nothing it received is
//! missing or moved, nothing came twice, nothing is missing between reconnects, every run that
//! started has exactly one `run.end` (a run cut by a kill is closed `interrupted` by the next
//! host), a prompt that never started has its one `followup_*` warning instead, and every
//! `client_msg_id` is exactly one run.
//!
//! Knobs: `AGENT_HOST_TORTURE_TRIALS` (default 10; CI-sized — set 100 or more for a soak),
//! `AGENT_HOST_TORTURE_SEED` (replays a run; the seed is printed), `AGENT_HOST_TORTURE_BLOCKS`
//! (blocks the agent streams per prompt, default 1000, about 2.4 brackets each).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_host::adapter::reap::exit_of;
use agent_host::ipc::IpcError;
use agent_host::protocol::envelope::Reply;
use agent_host::protocol::wire::{self, CmdId, Decoded, PROTOCOL_VERSION, WireBody, pb};
use agent_host::ws::client::{self, WsClient};
use common::WAIT;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const AGENT: &str = "torture";
/// Prompts in flight at once: one running and one queued, so the queue (3) never drops one
/// and every prompt that is not cut by a kill runs.
const MAX_OUTSTANDING: usize = 2;
/// How long the last prompts may take to finish once the kills are over.
const SETTLE: Duration = Duration::from_secs(60);
/// How long the stream may stand still while prompts are waiting before that is a failure.
const STALL: Duration = Duration::from_secs(20);

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        })
        .unwrap_or(default)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/torture-acp.js")
}

// ---- the host process ----

async fn ipc(home: &Path, command: &str, params: Value) -> Result<Reply, IpcError> {
    agent_host::ipc::request(
        &home.join("host.sock"),
        &json!({"command": command, "params": params}),
        WAIT,
    )
    .await
}

async fn ok(home: &Path, command: &str, params: Value) -> Value {
    let reply = ipc(home, command, params)
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"));
    assert_eq!(reply.code, 0, "{command}: {}", reply.to_line());
    reply.data
}

/// The binary, as a user runs it.
async fn cli(home: &Path, command: &str) -> Value {
    let out = tokio::process::Command::new(BIN)
        .arg(command)
        .env("AGENT_HOST_HOME", home)
        .stdin(std::process::Stdio::null())
        .output();
    let out = timeout(WAIT, out)
        .await
        .unwrap_or_else(|_| panic!("{command} took over {WAIT:?}"))
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{command}: {e}: {stdout:?}"))
}

/// A host started with `host.start` (detached: not our child), known by the pid
/// `host.status` gives.
struct Host {
    home: PathBuf,
    pid: i32,
}

impl Host {
    async fn start(home: &Path) -> Host {
        let started = cli(home, "host.start").await;
        assert_eq!(started["code"], 0, "host.start: {started}");
        let status = ok(home, "host.status", json!({})).await;
        let pid = i32::try_from(status["pid"].as_i64().unwrap()).unwrap();
        Host {
            home: home.to_owned(),
            pid,
        }
    }

    /// SIGKILL, and wait until the process is gone.
    async fn kill(self) {
        let gone = exit_of(self.pid);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        timeout(WAIT, gone)
            .await
            .unwrap_or_else(|_| panic!("host {} still alive after SIGKILL", self.pid));
    }

    /// `host.shutdown`, which returns once the lock is released.
    async fn shutdown(self) {
        let stopped = cli(&self.home, "host.shutdown").await;
        assert_eq!(stopped["code"], 0, "host.shutdown: {stopped}");
        assert_eq!(stopped["data"]["stopped"], true, "{stopped}");
    }
}

// ---- the subscriber ----

/// One bracket as the subscriber was sent it, or as history holds it.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    seq: i64,
    message_id: String,
    run_id: String,
    event: Value,
}

impl Got {
    fn of_push(push: pb::EventPush) -> Got {
        Got {
            seq: push.sequence_id,
            message_id: push.message_id,
            run_id: push.run_id,
            event: serde_json::from_str(&push.event_json).unwrap(),
        }
    }

    fn kind(&self) -> &str {
        self.event["k"].as_str().unwrap_or_default()
    }

    /// A run's last event: its `run.end`, or the warning of a prompt that never started.
    fn is_terminal(&self) -> bool {
        self.kind() == "run.end"
            || (self.kind() == "warning"
                && self.event["code"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("followup_")))
    }
}

/// How a connection's pump ended.
struct Pumped {
    got: Vec<Got>,
    /// Still open (the pump was told to stop).
    ws: Option<WsClient>,
    close: Option<(u16, String)>,
    error: Option<String>,
}

/// Read the connection until it ends or `stop` fires: check that the first brackets are
/// `again` (those sent before, from a stored cursor behind them), then record every bracket,
/// ack every 64 and at each run's end, name each ended run on `ends`, and count brackets on
/// `progress`.
async fn pump(
    mut ws: WsClient,
    mut again: VecDeque<Got>,
    mut stop: oneshot::Receiver<()>,
    ends: mpsc::UnboundedSender<String>,
    progress: Arc<watch::Sender<usize>>,
) -> Pumped {
    let mut got: Vec<Got> = Vec::new();
    let mut unacked = 0;
    loop {
        let frame = tokio::select! {
            _ = &mut stop => return Pumped { got, close: None, ws: Some(ws), error: None },
            frame = ws.next_frame() => frame,
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                let close = ws.last_close.clone();
                return Pumped {
                    got,
                    close,
                    ws: None,
                    error: None,
                };
            }
            Err(e) => {
                let error = Some(e.to_string());
                return Pumped {
                    got,
                    close: None,
                    ws: None,
                    error,
                };
            }
        };
        let Some(push) = client::event_of(&frame) else {
            continue;
        };
        assert!(!push.is_delta, "a delta, though none were asked for");
        let g = Got::of_push(push);
        if let Some(before) = again.pop_front() {
            assert_eq!(
                g, before,
                "replayed from the stored cursor, a bracket differs"
            );
            continue;
        }
        let terminal = g.is_terminal();
        let seq = g.seq;
        if terminal {
            // The test's receiver lives as long as the test.
            ends.send(g.run_id.clone()).unwrap();
        }
        got.push(g);
        progress.send_modify(|n| *n += 1);
        unacked += 1;
        if terminal || unacked >= 64 {
            if let Err(e) = ws.ack(seq).await {
                let error = Some(format!("ack: {e}"));
                return Pumped {
                    got,
                    close: None,
                    ws: None,
                    error,
                };
            }
            unacked = 0;
        }
    }
}

/// The durable subscriber, everything it was sent over all its connections, and its live one.
struct Subscriber {
    id: String,
    got: Vec<Got>,
    ends: mpsc::UnboundedSender<String>,
    progress: Arc<watch::Sender<usize>>,
    live: Option<(oneshot::Sender<()>, JoinHandle<Pumped>)>,
    connections: u32,
    /// Brackets sent again after reconnects from the stored cursor.
    redelivered: usize,
}

impl Subscriber {
    fn cursor(&self) -> Option<i64> {
        self.got.last().map(|g| g.seq)
    }

    /// Connect with a grant and the subscriber's own cursor, and pump in the background.
    /// `stored`: connect without a cursor of its own, so replay starts after the cursor the
    /// host saved from its acks (`since_cursor`); what comes again from there must be exactly
    /// what was received before.
    async fn connect(&mut self, endpoint: &str, token: &str, stored: Option<i64>) {
        let cursor = match stored {
            Some(stored) => Some(stored),
            None => self.cursor(),
        };
        let hello = pb::Hello {
            client_name: "torture".into(),
            cursor: if stored.is_some() { None } else { cursor },
            protocol_version: PROTOCOL_VERSION,
        };
        let (ws, resp) = timeout(WAIT, client::connect(endpoint, token, hello))
            .await
            .expect("connect timed out")
            .unwrap();
        assert_eq!(resp.subscriber_id, self.id);
        assert_eq!(
            resp.replay_from,
            cursor.unwrap_or(0),
            "replay does not start at the cursor"
        );
        let again: VecDeque<Got> = self
            .got
            .iter()
            .filter(|g| Some(g.seq) > cursor)
            .cloned()
            .collect();
        self.redelivered += again.len();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(pump(
            ws,
            again,
            stopped,
            self.ends.clone(),
            self.progress.clone(),
        ));
        self.live = Some((stop, task));
        self.connections += 1;
    }

    async fn reconnect(&mut self, home: &Path, stored: Option<i64>) {
        let grant = ok(home, "subscriber.grant", json!({"subscriber_id": self.id})).await;
        self.connect(
            grant["ws_endpoint"].as_str().unwrap(),
            grant["ws_token"].as_str().unwrap(),
            stored,
        )
        .await;
    }

    /// Wait for the live connection to end by itself (the host died or closed it).
    async fn ended(&mut self) -> Pumped {
        let (_stop, task) = self.live.take().expect("not connected");
        let mut pumped = timeout(WAIT, task)
            .await
            .expect("the connection outlived its host")
            .unwrap();
        self.got.append(&mut pumped.got);
        pumped
    }

    /// Stop pumping and take the open connection back.
    async fn take(&mut self) -> WsClient {
        let (stop, task) = self.live.take().expect("not connected");
        stop.send(()).unwrap();
        let mut pumped = timeout(WAIT, task).await.unwrap().unwrap();
        self.got.append(&mut pumped.got);
        pumped
            .ws
            .unwrap_or_else(|| panic!("the connection ended: {:?}", pumped.error))
    }

    /// On a taken connection: send a request and wait for its answer, recording pushes.
    async fn request<M: WireBody>(&mut self, ws: &mut WsClient, cmd: CmdId, body: &M) -> Decoded {
        let id = ws.send(cmd, body).await.unwrap();
        loop {
            let frame = timeout(WAIT, ws.next_frame())
                .await
                .expect("no answer")
                .unwrap()
                .expect("closed before the answer");
            if let Some(push) = client::event_of(&frame) {
                self.got.push(Got::of_push(push));
            } else if frame.request_id == id {
                return frame;
            }
        }
    }
}

// ---- the prompts ----

/// The prompt stream: which `client_msg_id` got which run, which sends lost their reply, which
/// runs have ended.
struct Driver {
    session: String,
    next: u32,
    runs: BTreeMap<String, String>,
    lost: Vec<String>,
    ended: HashSet<String>,
    lost_total: u32,
    lost_inserted: u32,
    resent: u32,
    /// How long each answered `session.send` took: the window for a lost reply.
    latencies: Vec<Duration>,
}

async fn send_request(home: PathBuf, session: String, key: String) -> Result<Reply, IpcError> {
    ipc(
        &home,
        "session.send",
        json!({"session_id": session, "text": format!("prompt {key}"), "client_msg_id": key}),
    )
    .await
}

impl Driver {
    fn next_key(&mut self) -> String {
        self.next += 1;
        format!("msg-{:05}", self.next)
    }

    /// The median time a `session.send` takes to be answered.
    fn latency(&self) -> Duration {
        let mut all = self.latencies.clone();
        all.sort();
        all.get(all.len() / 2)
            .copied()
            .unwrap_or(Duration::from_millis(2))
    }

    fn outstanding(&self) -> usize {
        self.runs
            .values()
            .filter(|r| !self.ended.contains(*r))
            .count()
    }

    fn drain(&mut self, ends: &mut mpsc::UnboundedReceiver<String>) {
        while let Ok(run) = ends.try_recv() {
            self.ended.insert(run);
        }
    }

    /// Take a send's outcome: a reply (whose run must be the one this key already has, if it
    /// has one), or a lost reply (the host died), to be sent again after the restart.
    fn settle(&mut self, key: &str, result: Result<Reply, IpcError>, retry: bool) {
        let reply = match result {
            Ok(reply) => reply,
            Err(e) => {
                assert!(!retry, "a retry of {key} failed on a live host: {e}");
                self.lost.push(key.to_owned());
                self.lost_total += 1;
                return;
            }
        };
        assert_eq!(reply.code, 0, "session.send {key}: {}", reply.to_line());
        let run = reply.data["run_id"].as_str().unwrap().to_owned();
        let duplicate = reply.data["duplicate"].as_bool().unwrap();
        match self.runs.get(key) {
            Some(first) => {
                assert_eq!(first, &run, "{key} sent again started another run");
                assert!(duplicate, "{key} sent again is not marked duplicate");
            }
            None => {
                if retry && duplicate {
                    // The lost send had reached the store before the kill.
                    self.lost_inserted += 1;
                } else {
                    assert!(!duplicate, "{key} is new but marked duplicate");
                }
                self.runs.insert(key.to_owned(), run);
            }
        }
    }

    async fn send(&mut self, home: &Path) {
        let key = self.next_key();
        let began = Instant::now();
        let result = send_request(home.to_owned(), self.session.clone(), key.clone()).await;
        if result.is_ok() {
            self.latencies.push(began.elapsed());
        }
        self.settle(&key, result, false);
    }

    /// Send prompts while fewer than `MAX_OUTSTANDING` are in flight.
    async fn fill(&mut self, home: &Path, ends: &mut mpsc::UnboundedReceiver<String>) {
        self.drain(ends);
        while self.outstanding() < MAX_OUTSTANDING {
            self.send(home).await;
        }
    }

    /// Prompts until the subscriber has been sent `brackets` more brackets. A stream that
    /// stands still for `STALL` with prompts waiting is a failure.
    async fn stream_for(
        &mut self,
        home: &Path,
        ends: &mut mpsc::UnboundedReceiver<String>,
        progress: &mut watch::Receiver<usize>,
        brackets: usize,
    ) {
        let start = *progress.borrow_and_update();
        let mut deadline = Instant::now() + STALL;
        loop {
            self.fill(home, ends).await;
            let now = *progress.borrow_and_update();
            if now >= start + brackets {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => panic!(
                    "the stream stalled: {} of {brackets} brackets, {} prompts waiting",
                    now - start,
                    self.outstanding()
                ),
                run = ends.recv() => { self.ended.insert(run.unwrap()); }
                changed = progress.changed() => {
                    changed.unwrap();
                    deadline = Instant::now() + STALL;
                }
            }
        }
    }

    /// Prompts until one of the runs in flight now has ended.
    async fn stream_to_run_end(&mut self, home: &Path, ends: &mut mpsc::UnboundedReceiver<String>) {
        self.fill(home, ends).await;
        let waiting: HashSet<String> = self
            .runs
            .values()
            .filter(|r| !self.ended.contains(*r))
            .cloned()
            .collect();
        timeout(STALL, async {
            loop {
                let run = ends.recv().await.unwrap();
                let done = waiting.contains(&run);
                self.ended.insert(run);
                if done {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("none of {} runs ended in {STALL:?}", waiting.len()));
    }

    /// Prompts for `span`, keeping `MAX_OUTSTANDING` in flight.
    async fn stream(
        &mut self,
        home: &Path,
        ends: &mut mpsc::UnboundedReceiver<String>,
        span: Duration,
    ) {
        let deadline = Instant::now() + span;
        loop {
            self.drain(ends);
            while self.outstanding() < MAX_OUTSTANDING && Instant::now() < deadline {
                self.send(home).await;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                run = ends.recv() => { self.ended.insert(run.unwrap()); }
            }
        }
    }

    /// After a restart: every send whose reply was lost, again with its key; and one that was
    /// answered, which must answer with the same run.
    async fn retry(&mut self, home: &Path, rng: &mut StdRng) {
        for key in std::mem::take(&mut self.lost) {
            let result = send_request(home.to_owned(), self.session.clone(), key.clone()).await;
            self.settle(&key, result, true);
        }
        if !self.runs.is_empty() {
            let index = rng.random_range(0..self.runs.len());
            let key = self.runs.keys().nth(index).unwrap().clone();
            let result = send_request(home.to_owned(), self.session.clone(), key.clone()).await;
            self.settle(&key, result, true);
            self.resent += 1;
        }
    }
}

// ---- the test ----

/// Where each trial kills the host. Positions are counted in brackets the subscriber was
/// sent (the agent's pace varies with the machine's load; the stream's position does not),
/// then a short random delay.
#[derive(Debug, Clone, Copy)]
enum Moment {
    /// After this many more brackets and this long: mostly mid-turn, sometimes between turns.
    MidStream(usize, Duration),
    /// After this many more brackets, this many `session.send`s go out at once and the kill
    /// follows them after this fraction of as many median answered sends' time: their replies
    /// maybe unseen, their runs maybe stored.
    MidSend(usize, u32, f64),
    /// Just after one of the runs in flight ended: `run.end` committed, the run's row and the
    /// next prompt's dispatch maybe not.
    AtRunEnd(Duration),
    /// Right after the restart: during recovery's and the replay's fan-out.
    AfterRestart(Duration),
}

fn moment(rng: &mut StdRng, per_turn: usize) -> Moment {
    match rng.random_range(0..10) {
        0..=4 => Moment::MidStream(
            rng.random_range(1..per_turn * 2),
            Duration::from_millis(rng.random_range(0..30)),
        ),
        5..=7 => Moment::MidSend(
            rng.random_range(0..per_turn),
            rng.random_range(1..=3),
            rng.random_range(0.3..1.1),
        ),
        8 => Moment::AtRunEnd(Duration::from_micros(rng.random_range(0..2000))),
        _ => Moment::AfterRestart(Duration::from_millis(rng.random_range(0..20))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_duplicates_and_splits_nothing() {
    let trials = knob("AGENT_HOST_TORTURE_TRIALS", 10);
    let seed = std::env::var("AGENT_HOST_TORTURE_SEED")
        .ok()
        .map(|s| s.parse::<u64>().unwrap())
        .unwrap_or_else(|| rand::rng().random());
    let blocks = knob("AGENT_HOST_TORTURE_BLOCKS", 1000);
    // Brackets a turn: text and thinking blocks are 2, tool calls 4 (1 block in 5).
    let per_turn = usize::try_from(blocks * 12 / 5).unwrap();
    eprintln!("torture: {trials} trials, seed {seed} (AGENT_HOST_TORTURE_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("host");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[agents.{AGENT}]\ncommand = [\"node\", \"{}\"]\nprotocol = \"acp\"\n\
             env = {{ TORTURE_BLOCKS = \"{blocks}\" }}\n",
            script().display()
        ),
    )
    .unwrap();

    let mut host = Host::start(&home).await;
    let session = ok(
        &home,
        "session.create",
        json!({"agent_type": AGENT, "cwd": work.display().to_string()}),
    )
    .await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let added = ok(
        &home,
        "subscriber.add",
        json!({"type": "local", "session_id": session, "replay_mode": "since_cursor"}),
    )
    .await;
    let (ends_tx, mut ends) = mpsc::unbounded_channel();
    let (progress_tx, mut progress) = watch::channel(0);
    let mut sub = Subscriber {
        id: added["subscriber_id"].as_str().unwrap().to_owned(),
        got: Vec::new(),
        ends: ends_tx,
        progress: Arc::new(progress_tx),
        live: None,
        connections: 0,
        redelivered: 0,
    };
    sub.connect(
        added["ws_endpoint"].as_str().unwrap(),
        added["ws_token"].as_str().unwrap(),
        None,
    )
    .await;
    let mut driver = Driver {
        session: session.clone(),
        next: 0,
        runs: BTreeMap::new(),
        lost: Vec::new(),
        ended: HashSet::new(),
        lost_total: 0,
        lost_inserted: 0,
        resent: 0,
        latencies: Vec::new(),
    };

    for trial in 0..trials {
        let at = moment(&mut rng, per_turn);
        match at {
            Moment::MidStream(brackets, span) => {
                driver
                    .stream_for(&home, &mut ends, &mut progress, brackets)
                    .await;
                driver.stream(&home, &mut ends, span).await;
                host.kill().await;
            }
            Moment::MidSend(brackets, burst, fraction) => {
                driver
                    .stream_for(&home, &mut ends, &mut progress, brackets)
                    .await;
                // A burst, answered one after the other by the session's actor: each has its
                // window between the run's commit and the reply reaching us.
                let sends: Vec<(String, JoinHandle<_>)> = (0..burst)
                    .map(|_| {
                        let key = driver.next_key();
                        let send = send_request(home.clone(), session.clone(), key.clone());
                        (key, tokio::spawn(send))
                    })
                    .collect();
                let window = driver.latency().mul_f64(fraction * f64::from(burst));
                tokio::time::sleep(window).await;
                host.kill().await;
                for (key, send) in sends {
                    let result = timeout(WAIT, send).await.unwrap().unwrap();
                    driver.settle(&key, result, false);
                }
            }
            Moment::AtRunEnd(after) => {
                driver.stream_to_run_end(&home, &mut ends).await;
                tokio::time::sleep(after).await;
                host.kill().await;
            }
            Moment::AfterRestart(span) => {
                tokio::time::sleep(span).await;
                host.kill().await;
            }
        }
        let pumped = sub.ended().await;
        assert!(
            pumped.close.is_none(),
            "trial {trial}: a killed host sent a close frame: {:?}",
            pumped.close
        );

        host = Host::start(&home).await;
        // Acks are saved in batches: what the host kept may be behind, never ahead.
        let stored = stored_cursor(&home, &sub.id).await;
        assert!(
            stored <= sub.cursor().unwrap_or(0),
            "trial {trial}: the stored cursor {stored} is past what was received ({:?})",
            sub.cursor()
        );
        // A third of the reconnects resume from the host's saved cursor instead of their own.
        let from_stored = rng.random_bool(1.0 / 3.0).then_some(stored);
        sub.reconnect(&home, from_stored).await;
        driver.retry(&home, &mut rng).await;
        eprintln!(
            "trial {trial}: {at:?}; {} brackets so far, {} runs",
            sub.got.len(),
            driver.runs.len()
        );
    }

    // Let the prompts in flight finish, then stop cleanly.
    timeout(SETTLE, async {
        loop {
            driver.drain(&mut ends);
            if driver.outstanding() == 0 {
                return;
            }
            let run = ends.recv().await.unwrap();
            driver.ended.insert(run);
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} runs never ended after the last kill",
            driver.outstanding()
        )
    });
    assert!(driver.lost.is_empty());
    let mut ws = sub.take().await;
    let acked = sub.cursor().unwrap();
    ws.ack(acked).await.unwrap();
    // The connection reads in order: once the pong is back, the ack has been taken.
    let pong = sub
        .request(&mut ws, CmdId::Ping, &pb::Ping { nonce: 7 })
        .await;
    assert_eq!(pong.cmd, CmdId::Pong);
    host.shutdown().await;
    loop {
        let frame = timeout(WAIT, ws.next_frame()).await.unwrap();
        match frame {
            Ok(Some(frame)) => {
                if let Some(push) = client::event_of(&frame) {
                    sub.got.push(Got::of_push(push));
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    assert_eq!(
        ws.last_close.as_ref().map(|c| c.0),
        Some(1001),
        "a clean shutdown closes with 1001"
    );

    // Once more, to read everything back.
    let host = Host::start(&home).await;
    assert_eq!(
        stored_cursor(&home, &sub.id).await,
        acked,
        "the last ack was not saved at the clean shutdown"
    );
    let history = history(&home, &session).await;
    let last = history.last().unwrap().seq;
    sub.reconnect(&home, None).await;
    let mut ws = sub.take().await;
    while sub.cursor() < Some(last) {
        let frame = timeout(WAIT, ws.next_frame())
            .await
            .unwrap_or_else(|_| panic!("replay stopped at {:?} of {last}", sub.cursor()))
            .unwrap()
            .expect("closed during the replay");
        if let Some(push) = client::event_of(&frame) {
            sub.got.push(Got::of_push(push));
        }
    }
    // The same history read over the WebSocket (`session.history` in `Request` frames) is the
    // one IPC gave, bracket for bracket.
    let over_ws = ws_history(&mut sub, &mut ws, &session).await;
    assert_eq!(over_ws, history, "the WebSocket and IPC histories differ");
    // And the run rows (`session.runs`, over the WebSocket too), for the keys of runs that
    // never started (their events carry no key).
    let frame = sub
        .request(
            &mut ws,
            CmdId::Request,
            &wire::request("session.runs", &json!({"session_id": session})),
        )
        .await;
    let reply: pb::Reply = frame.body().unwrap();
    assert_eq!(reply.code, 0, "session.runs: {reply:?}");
    let rows: Value = serde_json::from_str(&reply.data_json).unwrap();
    let rows = rows["runs"].as_array().unwrap().clone();
    // Nothing is left running or waiting.
    let row = ok(&home, "session.get", json!({"session_id": session})).await;
    assert!(
        row["live"].is_null()
            || (row["live"]["run_id"].is_null()
                && row["live"]["queued"].as_array().is_some_and(Vec::is_empty)),
        "a run is left at the end: {row}"
    );
    ws.close().await;
    host.shutdown().await;

    check_delivery(&sub.got, &history);
    let (states, runs) = check_runs(&history, &driver);
    check_run_rows(&rows, &history, &driver);
    eprintln!(
        "torture: {trials} trials in {:?} (seed {seed}): {} brackets over {} connections, {} \
         runs {states:?}; {} brackets sent again from a stored cursor; {} sends lost their reply ({} of them had reached the store), {} \
         answered sends sent again",
        began.elapsed(),
        history.len(),
        sub.connections,
        runs,
        sub.redelivered,
        driver.lost_total,
        driver.lost_inserted,
        driver.resent,
    );
}

async fn stored_cursor(home: &Path, subscriber: &str) -> i64 {
    let list = ok(home, "subscriber.list", json!({})).await;
    list["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["subscriber_id"] == subscriber)
        .unwrap()["most_recent_sequence_id"]
        .as_i64()
        .unwrap()
}

/// The session's whole history, paged.
async fn history(home: &Path, session: &str) -> Vec<Got> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = ok(
            home,
            "session.history",
            json!({"session_id": session, "after_seq": after, "limit": 5000}),
        )
        .await;
        let events = page["events"].as_array().unwrap();
        if events.is_empty() {
            return out;
        }
        out.extend(events.iter().map(|e| Got {
            seq: e["sequence_id"].as_i64().unwrap(),
            message_id: e["message_id"].as_str().unwrap().to_owned(),
            run_id: e["run_id"].as_str().unwrap_or_default().to_owned(),
            event: e["event"].clone(),
        }));
        after = page["next_after_seq"].as_i64().unwrap();
    }
}

/// The session's whole history over a taken connection, paged (pushes that come meanwhile are
/// recorded).
async fn ws_history(sub: &mut Subscriber, ws: &mut WsClient, session: &str) -> Vec<Got> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let params = json!({"session_id": session, "after_seq": after, "limit": 5000});
        let frame = sub
            .request(
                ws,
                CmdId::Request,
                &wire::request("session.history", &params),
            )
            .await;
        assert_eq!(frame.cmd, CmdId::Reply, "{frame:?}");
        let reply: pb::Reply = frame.body().unwrap();
        assert_eq!(reply.code, 0, "session.history: {reply:?}");
        let page: Value = serde_json::from_str(&reply.data_json).unwrap();
        let events = page["events"].as_array().unwrap();
        if events.is_empty() {
            return out;
        }
        out.extend(events.iter().map(|e| Got {
            seq: e["sequence_id"].as_i64().unwrap(),
            message_id: e["message_id"].as_str().unwrap().to_owned(),
            run_id: e["run_id"].as_str().unwrap_or_default().to_owned(),
            event: e["event"].clone(),
        }));
        after = page["next_after_seq"].as_i64().unwrap();
    }
}

/// The run rows: none left queued or running, each has events, each `client_msg_id` is one
/// run — the one its sends were answered with, started or not — and rows and events name the
/// same runs.
fn check_run_rows(rows: &[Value], history: &[Got], driver: &Driver) {
    let with_events: HashSet<&str> = history
        .iter()
        .filter(|g| !g.run_id.is_empty())
        .map(|g| g.run_id.as_str())
        .collect();
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for row in rows {
        let run = row["run_id"].as_str().unwrap();
        let state = row["state"].as_str().unwrap();
        assert!(
            !matches!(state, "queued" | "running"),
            "run {run} left {state}"
        );
        assert!(with_events.contains(run), "run {run} has no events");
        by_key
            .entry(row["client_msg_id"].as_str().unwrap_or_default())
            .or_default()
            .push(run);
    }
    for (key, found) in &by_key {
        assert_eq!(found.len(), 1, "client_msg_id {key} has runs {found:?}");
    }
    for (key, run) in &driver.runs {
        let found = by_key
            .get(key.as_str())
            .unwrap_or_else(|| panic!("{key} has no run row"));
        assert_eq!(found[0], run.as_str(), "{key} answered with another run");
    }
    assert_eq!(
        with_events.len(),
        rows.len(),
        "runs in the events and in the rows differ"
    );
}

/// What the subscriber was sent, over all its connections, is the session's history: in
/// order, each bracket once, none missing, each with the sequence id it was sent with.
fn check_delivery(got: &[Got], history: &[Got]) {
    for pair in got.windows(2) {
        assert!(
            pair[0].seq < pair[1].seq,
            "sent out of order or twice: {} then {} ({} then {})",
            pair[0].seq,
            pair[1].seq,
            pair[0].kind(),
            pair[1].kind()
        );
    }
    let mut messages = HashSet::new();
    for g in got {
        assert!(
            messages.insert(g.message_id.as_str()),
            "message {} sent twice",
            g.message_id
        );
    }
    let stored: BTreeMap<i64, &Got> = history.iter().map(|g| (g.seq, g)).collect();
    for g in got {
        match stored.get(&g.seq) {
            Some(s) => assert_eq!(*s, g, "bracket {} differs from what was sent", g.seq),
            None => panic!(
                "bracket {} ({}) was sent but is not stored",
                g.seq,
                g.kind()
            ),
        }
    }
    let received: HashSet<i64> = got.iter().map(|g| g.seq).collect();
    let missing: Vec<i64> = history
        .iter()
        .map(|g| g.seq)
        .filter(|s| !received.contains(s))
        .collect();
    assert!(
        missing.is_empty(),
        "{} stored brackets never reached the subscriber (a gap), first {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(got.len(), history.len());
}

/// Every run that started has one `run.start` and one `run.end` after it; a prompt that never
/// started has no `run.end` and one `followup_*` warning; every `client_msg_id` is one run, the
/// one its sends were answered with (read from the `user.text` each started run begins with:
/// the host keeps no runs listing on the wire). Returns how many runs ended in each state, and
/// how many runs there were.
fn check_runs(history: &[Got], driver: &Driver) -> (BTreeMap<String, usize>, usize) {
    #[derive(Default)]
    struct Seen<'a> {
        starts: Vec<i64>,
        ends: Vec<&'a Got>,
        retired: usize,
        user_texts: Vec<&'a Got>,
    }
    let mut of_run: BTreeMap<&str, Seen> = BTreeMap::new();
    for g in history.iter().filter(|g| !g.run_id.is_empty()) {
        let seen = of_run.entry(g.run_id.as_str()).or_default();
        match g.kind() {
            "run.start" => seen.starts.push(g.seq),
            "run.end" => seen.ends.push(g),
            "user.text" => seen.user_texts.push(g),
            _ if g.is_terminal() => seen.retired += 1,
            _ => {}
        }
    }
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    // client_msg_id → the runs whose prompt carries it.
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (run, seen) in &of_run {
        assert!(
            seen.user_texts.len() <= 1,
            "run {run}: {} user.text",
            seen.user_texts.len()
        );
        match seen.starts.as_slice() {
            [start] => {
                assert_eq!(seen.ends.len(), 1, "run {run}: {} run.end", seen.ends.len());
                assert_eq!(seen.retired, 0, "run {run} started and was also retired");
                let end = seen.ends[0];
                assert!(end.seq > *start, "run {run}: run.end before run.start");
                let state = end.event["state"].as_str().unwrap();
                assert!(
                    matches!(state, "completed" | "interrupted"),
                    "run {run} ended {}",
                    end.event
                );
                *states.entry(state.to_owned()).or_default() += 1;
                let [prompt] = seen.user_texts.as_slice() else {
                    panic!("run {run} started without its user.text");
                };
                assert!(prompt.seq < *start, "run {run}: run.start before user.text");
                let key = prompt.event["clientMsgId"].as_str().unwrap_or_else(|| {
                    panic!("run {run}: a prompt without its key: {}", prompt.event)
                });
                by_key.entry(key).or_default().push(run);
            }
            [] => {
                assert!(seen.ends.is_empty(), "run {run}: run.end without run.start");
                assert_eq!(
                    seen.retired, 1,
                    "run {run} never started and was not retired"
                );
                *states.entry("never started".to_owned()).or_default() += 1;
            }
            more => panic!("run {run}: {} run.start", more.len()),
        }
    }
    for (key, found) in &by_key {
        assert_eq!(
            found.len(),
            1,
            "client_msg_id {key} has {} runs: {found:?}",
            found.len()
        );
    }
    for (key, run) in &driver.runs {
        let seen = of_run
            .get(run.as_str())
            .unwrap_or_else(|| panic!("{key}: run {run} has no events"));
        if !seen.starts.is_empty() {
            assert_eq!(
                by_key.get(key.as_str()).map(Vec::as_slice),
                Some([run.as_str()].as_slice()),
                "{key} answered with another run"
            );
        }
    }
    let asked: HashSet<&str> = driver.runs.values().map(String::as_str).collect();
    assert_eq!(
        asked.len(),
        driver.runs.len(),
        "two keys answered with one run"
    );
    let unasked: Vec<&&str> = of_run.keys().filter(|r| !asked.contains(**r)).collect();
    assert!(unasked.is_empty(), "runs nobody asked for: {unasked:?}");
    (states, of_run.len())
}
