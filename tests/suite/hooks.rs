//! Issue 17, acceptance 5: "needs you" hooks through the real `agent-host` binary running the
//! real `claude` CLI against the project's mock model, inside a loopback-only network
//! namespace. Its `config.toml` names the pinned CLI and three hooks: `on_permission` runs a
//! script that records its `AGENT_HOST_*` environment, and a second one that hangs
//! (`sleep 1000`); `on_run_end` records too. A `TOOLCALL` prompt makes Claude Code ask for
//! `Bash`: the request runs the recorder exactly once with the documented environment (and
//! no provider key), its stdout reaches the host log; the hanging hook is killed at its time
//! limit (its pid is waited on; how long it lived is read from its start time in `/proc`)
//! while the run goes on to be answered, to run the tool and to complete; `on_run_end` gets
//! the state. After a restart, nothing fires again except for the new run.
//!
//! The scripts tell the test they ran through FIFOs the test holds open, so every wait is on
//! an event (a line in a FIFO, a pid's exit, a WebSocket frame), bounded by a timeout.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_host::protocol::envelope::Reply;
use common::agents::{agent_env, ensure_claude};
use common::mock_model::MockModel;
use common::world::{Family, Follower, connect_follower, in_netns, run_end};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
/// A host start, a turn, a hook's start.
const WAIT: Duration = Duration::from_secs(60);
/// The hooks' time limit: the permission is answered, Claude Code runs the tool, asks the mock
/// again and ends the run while the hanging hook still runs — on a loaded two-core machine
/// too, hence some 30 times the ~0.3 s that takes on an idle one.
const HOOK_LIMIT: Duration = Duration::from_secs(10);
/// What the measure of the hanging hook's life may fall short of its limit: `/proc` gives the
/// start in clock ticks and the uptime in hundredths (each truncated), the limit itself runs
/// from after the fork.
const TICK_SLACK: Duration = Duration::from_millis(50);

/// Appends what fired (`$1`) and its `AGENT_HOST_*` (and any provider key) variables to `$2`,
/// says so on stdout (the host log), then in `$3`.
const RECORD: &str = r#"{ echo "--- $1"; env | grep -E '^(AGENT_HOST_|ANTHROPIC_)' | sort; } >> "$2"
echo "recorded $1"
echo "$1" > "$3"
"#;
/// Says its pid in `$1`, then hangs as that same process.
const HANG: &str = r#"echo $$ > "$1"
exec sleep 1000
"#;

/// A TOML string (a JSON string is one).
fn toml_str(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).unwrap()
}

/// A FIFO the test reads lines from; held open for writing too, so it never sees an end
/// between two writers (and a writer never waits for the test to open it).
fn fifo(path: &Path) -> Lines<BufReader<pipe::Receiver>> {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let rx = pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(path)
        .unwrap();
    BufReader::new(rx).lines()
}

async fn next_line(lines: &mut Lines<BufReader<pipe::Receiver>>, what: &str) -> String {
    tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{what}: no line in {WAIT:?}"))
        .unwrap()
        .unwrap()
}

/// The entries a recorder appended: each the variables of one run.
fn records(path: &Path) -> Vec<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split("--- ")
        .filter(|chunk| !chunk.trim().is_empty())
        .map(|chunk| {
            chunk
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

fn var<'a>(record: &'a [(String, String)], name: &str) -> Option<&'a str> {
    record
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// When `pid` started, after boot (field 22 of its `/proc` stat, in clock ticks).
fn started_after_boot(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    // Field 3 (the state) is the first after the name; field 22 is 19 further on.
    let ticks: u64 = rest.split_whitespace().nth(19).unwrap().parse().unwrap();
    let per_second: u64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100);
    Duration::from_secs(ticks / per_second)
        + Duration::from_nanos((ticks % per_second) * 1_000_000_000 / per_second)
}

/// Time since boot (`/proc/uptime`, the clock `/proc/<pid>/stat` start times count on).
fn uptime() -> Duration {
    let text = std::fs::read_to_string("/proc/uptime").unwrap();
    Duration::from_secs_f64(text.split_whitespace().next().unwrap().parse().unwrap())
}

/// Running (not a zombie) per `/proc`.
fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().next().map(|s| s != "Z")
        })
        .unwrap_or(false)
}

struct World {
    dir: tempfile::TempDir,
    mock: MockModel,
    work: PathBuf,
    permission_seen: Lines<BufReader<pipe::Receiver>>,
    run_end_seen: Lines<BufReader<pipe::Receiver>>,
    hang_pid: Lines<BufReader<pipe::Receiver>>,
}

impl World {
    async fn new() -> World {
        let mock = MockModel::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        for d in ["work", "host", "agent-home"] {
            std::fs::create_dir_all(path(d)).unwrap();
        }
        std::fs::write(path("record.sh"), RECORD).unwrap();
        std::fs::write(path("hang.sh"), HANG).unwrap();
        let config = format!(
            "[agents.claude]\nbinary = {claude}\n\n\
             [hooks]\ntimeout_ms = {limit}\n\
             on_permission = [[\"/bin/sh\", {record}, \"permission\", {plog}, {pfifo}], \
                              [\"/bin/sh\", {hang}, {hfifo}]]\n\
             on_run_end = [[\"/bin/sh\", {record}, \"run_end\", {rlog}, {rfifo}]]\n",
            claude = toml_str(&ensure_claude()),
            limit = HOOK_LIMIT.as_millis(),
            record = toml_str(&path("record.sh")),
            hang = toml_str(&path("hang.sh")),
            plog = toml_str(&path("permission.log")),
            pfifo = toml_str(&path("permission.fifo")),
            hfifo = toml_str(&path("hang.fifo")),
            rlog = toml_str(&path("run_end.log")),
            rfifo = toml_str(&path("run_end.fifo")),
        );
        std::fs::write(path("host").join("config.toml"), config).unwrap();
        World {
            permission_seen: fifo(&path("permission.fifo")),
            run_end_seen: fifo(&path("run_end.fifo")),
            hang_pid: fifo(&path("hang.fifo")),
            work: path("work"),
            mock,
            dir,
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn log(&self, name: &str) -> Vec<Vec<(String, String)>> {
        records(&self.dir.path().join(name))
    }

    /// `agent-host host.start {"foreground":true}`, once it is ready. Its environment is
    /// what Claude Code needs against the mock (a private HOME, the mock's URL and a key).
    async fn start_host(&self) -> Host {
        let mut child = Command::new(BIN)
            .args(["host.start", r#"{"foreground":true}"#])
            .env_clear()
            .envs(agent_env(&self.dir.path().join("agent-home"), &self.mock))
            .env("AGENT_HOST_HOME", self.home())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the host was not ready in time")
            .unwrap()
            .expect("the host ended before it was ready");
        let ready: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(ready["code"], 0, "{line}");
        Host {
            home: self.home(),
            child,
        }
    }
}

struct Host {
    home: PathBuf,
    child: Child,
}

impl Host {
    async fn ok(&self, command: &str, params: Value) -> Value {
        let reply: Reply = agent_host::ipc::request(
            &self.home.join("host.sock"),
            &json!({"command": command, "params": params}),
            WAIT,
        )
        .await
        .unwrap();
        assert_eq!(reply.code, 0, "{command}: {}", reply.to_line());
        reply.data
    }

    /// A WebSocket follower of one session (brackets only).
    async fn follow(&self, session: &str) -> Follower {
        let data = self
            .ok(
                "subscriber.add",
                json!({"type": "local", "session_id": session, "forward_deltas": false,
                       "replay_mode": "since_cursor"}),
            )
            .await;
        connect_follower(&data, "hooks-test", None).await
    }

    async fn send(&self, session: &str, text: &str) -> String {
        self.ok("session.send", json!({"session_id": session, "text": text}))
            .await["run_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// `host.shutdown`, and the process's exit (hooks still running are finished or killed
    /// by then, so what they wrote is final).
    async fn shutdown(mut self) {
        self.ok("host.shutdown", json!({})).await;
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the host did not stop")
            .unwrap();
        assert!(status.success(), "{status}");
    }
}

#[test]
fn a_permission_runs_its_hooks_once_and_a_hanging_hook_is_killed_at_its_limit() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_permission_runs_its_hooks_once_and_a_hanging_hook_is_killed_at_its_limit",
    ) else {
        return;
    };
    rt.block_on(permission_hooks());
}

async fn permission_hooks() {
    let mut world = World::new().await;
    let host = world.start_host().await;
    let session = host
        .ok(
            "session.create",
            json!({"agent_type": "claude", "cwd": world.work.display().to_string()}),
        )
        .await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    host.ok(
        "session.rename",
        json!({"session_id": session, "title": "hooks test"}),
    )
    .await;
    let mut f = host.follow(&session).await;

    let run = host
        .send(&session, "TOOLCALL `touch hook-made && echo hook-out`")
        .await;
    let request = f.until_kind("permission.request", WAIT).await.event;
    assert_eq!(request["tool"], "Bash", "{request}");
    assert_eq!(
        next_line(&mut world.permission_seen, "on_permission[0]").await,
        "permission"
    );
    let hang: i32 = next_line(&mut world.hang_pid, "on_permission[1]")
        .await
        .parse()
        .unwrap();
    let hang_started = started_after_boot(hang);
    let hang_exit = agent_host::adapter::reap::exit_of(hang);
    tokio::pin!(hang_exit);
    assert!(is_running(hang), "the hanging hook {hang} is not running");

    // The run goes on while that hook hangs: answered, the tool run, completed, before its
    // limit.
    host.ok(
        "permission.respond",
        json!({"session_id": session, "request_id": request["requestId"], "decision": "allow"}),
    )
    .await;
    let end = tokio::select! {
        biased;
        end = run_end(&mut f, &run, WAIT) => end,
        () = &mut hang_exit => panic!("the hanging hook ended before the run could"),
    };
    assert_eq!(end["state"], "completed", "{end}");
    assert!(
        world.work.join("hook-made").exists(),
        "the tool did not run"
    );

    // Killed at its limit (and not long after); its pid is gone.
    tokio::time::timeout(WAIT, &mut hang_exit)
        .await
        .expect("the hanging hook outlived its time limit");
    let lived = uptime().saturating_sub(hang_started);
    assert!(
        lived + TICK_SLACK >= HOOK_LIMIT,
        "killed after {lived:?}, before its limit of {HOOK_LIMIT:?}"
    );
    assert!(
        lived < HOOK_LIMIT + Duration::from_secs(10),
        "killed only after {lived:?}, its limit being {HOOK_LIMIT:?}"
    );
    assert!(!is_running(hang), "{hang} still runs");
    assert_eq!(
        next_line(&mut world.run_end_seen, "on_run_end[0]").await,
        "run_end"
    );
    host.shutdown().await;

    // Exactly once, with the documented environment.
    let permission = world.log("permission.log");
    assert_eq!(permission.len(), 1, "{permission:#?}");
    let p = &permission[0];
    let expected = [
        ("AGENT_HOST_EVENT", "permission"),
        ("AGENT_HOST_SESSION_ID", session.as_str()),
        ("AGENT_HOST_SESSION_TITLE", "hooks test"),
        ("AGENT_HOST_AGENT", "claude"),
        ("AGENT_HOST_RUN_ID", run.as_str()),
        ("AGENT_HOST_TOOL", request["tool"].as_str().unwrap()),
        (
            "AGENT_HOST_REQUEST_ID",
            request["requestId"].as_str().unwrap(),
        ),
    ];
    for (name, value) in expected {
        assert_eq!(var(p, name), Some(value), "{name} in {p:#?}");
    }
    assert_eq!(var(p, "AGENT_HOST_STATE"), None, "{p:#?}");
    // Never the provider key the agent gets.
    assert!(
        !p.iter().any(|(k, _)| k.starts_with("ANTHROPIC_")),
        "{p:#?}"
    );
    let ends = world.log("run_end.log");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert_eq!(var(&ends[0], "AGENT_HOST_EVENT"), Some("run_end"));
    assert_eq!(var(&ends[0], "AGENT_HOST_STATE"), Some("completed"));
    assert_eq!(var(&ends[0], "AGENT_HOST_RUN_ID"), Some(run.as_str()));
    assert_eq!(var(&ends[0], "AGENT_HOST_TOOL"), None);
    let log = std::fs::read_to_string(world.home().join("logs/host.log")).unwrap();
    assert!(
        log.lines().any(
            |l| l.contains("hook ran past its time limit; killed its process group")
                && l.contains("on_permission[1]")
        ),
        "{log}"
    );
    // The recorder's stdout, at info, named by its hook and session.
    assert!(
        log.lines().any(|l| l.contains(" INFO ")
            && l.contains("hook output: recorded permission")
            && l.contains("on_permission[0]")
            && l.contains(&session)),
        "{log}"
    );

    // A restart fires nothing for what the store already holds; a new run fires its own.
    let host = world.start_host().await;
    let mut f = host.follow(&session).await;
    let second = host.send(&session, "hello").await;
    let end = run_end(&mut f, &second, WAIT).await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(
        next_line(&mut world.run_end_seen, "on_run_end[0] after the restart").await,
        "run_end"
    );
    host.shutdown().await;
    assert_eq!(world.log("permission.log").len(), 1);
    let ends = world.log("run_end.log");
    assert_eq!(ends.len(), 2, "{ends:#?}");
    assert_eq!(var(&ends[1], "AGENT_HOST_RUN_ID"), Some(second.as_str()));
    assert_eq!(var(&ends[1], "AGENT_HOST_STATE"), Some("completed"));
}
