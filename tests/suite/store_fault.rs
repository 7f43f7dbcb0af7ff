//! The store fault of issue 13, end to end: `$AGENT_HOST_HOME` on a real 3 MiB tmpfs (mounted
//! in a private mount namespace) filled while an agent streams, then grown again without a
//! restart.
//!
//! While the store cannot commit: `host.status` says `store: degraded` with the error;
//! `session.send`, `session.create` and `permission.respond` are refused with
//! `store_unavailable`; the running turn is interrupted; a prompt queued behind it does not
//! reach the agent; nothing uncommitted reaches a subscriber. When the tmpfs grows, the store
//! recovers by itself, the interrupted run is closed with one committed `run.end`
//! `interrupted` (and only then does its row say so), the queued prompt runs, and every event a
//! subscriber saw is in the history with the same `sequence_id`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::world::{follow, run_end};
use common::{Agents, TestHost};
use serde_json::{Value, json};

const MARKER: &str = "AGENT_HOST_TEST_MOUNTNS";
const TURN: Duration = Duration::from_secs(60);

/// Run `test_name` again in a private mount namespace (`unshare -m`, root; `-rm` otherwise).
/// `true` in the child, `false` in the parent once the child passed.
fn in_private_mount_ns(test_name: &str) -> bool {
    if std::env::var_os(MARKER).is_some() {
        return true;
    }
    let test_name = common::agents::full_test_name(test_name);
    let root = nix::unistd::geteuid().is_root();
    let status = Command::new("unshare")
        .arg(if root { "-m" } else { "-rm" })
        .args(["--propagation", "private"])
        .arg(std::env::current_exe().unwrap())
        .args([&test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(MARKER, "1")
        .status()
        .expect("unshare (util-linux) gives the test a private mount namespace");
    assert!(
        status.success(),
        "{test_name} failed in its mount namespace"
    );
    false
}

fn mount_tmpfs(dir: &Path, size: &str) {
    let status = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "mount tmpfs");
}

fn resize_tmpfs(dir: &Path, size: &str) {
    let status = Command::new("mount")
        .args(["-o", &format!("remount,size={size}")])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "remount tmpfs");
}

/// Write zeros into `path` until the file system is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        if let Err(e) = file.write_all(&block).and_then(|()| file.sync_all()) {
            assert_eq!(e.raw_os_error(), Some(28), "expected ENOSPC: {e}");
            // A last partial block.
            let _ = file.write(&block[..512]);
            return;
        }
    }
}

/// Poll `host.status` (bounded) until its store state is `want`.
async fn store_state(host: &TestHost, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = host.ok("host.status", json!({})).await;
        if status["store"]["state"] == want {
            return status["store"].clone();
        }
        assert!(Instant::now() < deadline, "store never {want}: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_full_disk_degrades_the_host_and_it_recovers_by_itself() {
    if !in_private_mount_ns("a_full_disk_degrades_the_host_and_it_recovers_by_itself") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(full_disk());
}

async fn full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    mount_tmpfs(&disk, "3m");
    let home = disk.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let prompts = dir.path().join("prompts.log");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake-acp.js");
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[agents.stream]\ncommand = [\"node\", \"{}\"]\nprotocol = \"acp\"\n\
             env = {{ FAKE_ACP_MODE = \"stream\", FAKE_ACP_PROMPTS = \"{}\" }}\n",
            script.display(),
            prompts.display()
        ),
    )
    .unwrap();
    let agent_home: PathBuf = dir.path().join("agent-home");
    std::fs::create_dir_all(&agent_home).unwrap();
    let agents = Agents {
        env: vec![
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("HOME".to_owned(), agent_home.display().to_string()),
        ],
        family_env: Vec::new(),
        claude: None,
        codex: None,
    };
    let host = TestHost::start_with_agents(&home, agents).await;
    let session = host.session_of("stream", &work).await;
    let mut f = follow(&host, &session, false).await;

    let send = |text: &str| json!({"session_id": session, "text": text});
    let a = host.ok("session.send", send("first")).await["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.until_kind("text.end", TURN).await;
    let b = host.ok("session.send", send("second")).await;
    assert_eq!(b["queued"], true, "{b}");
    let b = b["run_id"].as_str().unwrap().to_owned();

    // The disk fills mid-stream.
    fill(&disk.join("filler"));
    let down = store_state(&host, "degraded").await;
    assert!(
        down["error"].as_str().unwrap().contains("full"),
        "the error says why: {down}"
    );
    assert!(down["since"].as_i64().unwrap() > 0);
    for (command, params) in [
        ("session.send", send("third")),
        (
            "session.create",
            json!({"agent_type": "stream", "cwd": work.display().to_string()}),
        ),
        (
            "permission.respond",
            json!({"session_id": session, "request_id": "r", "decision": "allow"}),
        ),
    ] {
        let reply = host.ipc(command, params).await;
        assert_eq!(reply.code, 2009, "{command}: {}", reply.to_line());
        assert_eq!(reply.data["error"], "store_unavailable");
    }
    // The running turn is interrupted (the agent was told to cancel and ended its prompt):
    // the session has no run in progress, and the queued prompt has not reached the agent.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = host.ok("session.get", json!({"session_id": session})).await["live"].clone();
        if live["run_id"].is_null() {
            assert_eq!(live["queued"], json!([b]), "{live}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the turn was not interrupted: {live}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = std::fs::read_to_string(&prompts).unwrap();
    assert_eq!(
        received, "first\n",
        "nothing reaches the agent while the store is down"
    );

    // More room: the store recovers by itself, closes the cut run and goes on.
    resize_tmpfs(&disk, "64m");
    let end = run_end(&mut f, &a, TURN).await;
    assert_eq!(end["state"], "interrupted", "{end}");
    assert!(end["message"].as_str().unwrap().contains("store"), "{end}");
    store_state(&host, "ok").await;
    // The queued prompt runs now: cancel its stream once it started, and it ends.
    f.until("run.start of the queued run", TURN, |s| {
        s.kind() == "run.start" && s.run_id == b
    })
    .await;
    host.ok("session.cancel", json!({"session_id": session}))
        .await;
    let end_b = run_end(&mut f, &b, TURN).await;
    assert_eq!(end_b["state"], "cancelled", "{end_b}");
    assert_eq!(
        std::fs::read_to_string(&prompts).unwrap(),
        "first\nsecond\n"
    );

    // Every bracket the follower saw is in the history with the same sequence_id, and each
    // run has exactly one run.end.
    let mut history: HashMap<i64, Value> = HashMap::new();
    let mut after = 0;
    loop {
        let page = host
            .ok(
                "session.history",
                json!({"session_id": session, "after_seq": after, "limit": 5000}),
            )
            .await;
        let events = page["events"].as_array().unwrap().clone();
        if events.is_empty() {
            break;
        }
        for e in events {
            history.insert(e["sequence_id"].as_i64().unwrap(), e["event"].clone());
        }
        after = page["next_after_seq"].as_i64().unwrap();
    }
    for (seq, kind) in f.brackets() {
        let stored = history
            .get(&seq)
            .unwrap_or_else(|| panic!("{kind} at {seq} was seen but never committed"));
        assert_eq!(stored["k"], json!(kind));
    }
    for run in [&a, &b] {
        let ends = history
            .values()
            .filter(|e| e["k"] == "run.end" && e["runId"] == json!(run))
            .count();
        assert_eq!(ends, 1, "run {run}: {ends} run.end");
    }
    host.stop().await;
    // The rows agree with the events: the cut run is interrupted, the next one cancelled.
    let db = rusqlite::Connection::open(home.join("host.db")).unwrap();
    let state = |run: &str| -> String {
        db.query_row("SELECT state FROM runs WHERE id = ?1", [run], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(state(&a), "interrupted");
    assert_eq!(state(&b), "cancelled");
}
