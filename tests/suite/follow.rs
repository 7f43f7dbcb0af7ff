//! `agent-host follow` end to end (issue 3, acceptance 7): the real binary follows a session of
//! a real host, renders what the bus publishes, rides out a host restart by reconnecting with
//! its cursor, and exits cleanly on Ctrl-C.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::process::Stdio;

use common::{TestHost, WAIT, text_delta, text_end, text_start};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");

fn spawn_follow(host: &TestHost, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(BIN)
        .arg("follow")
        .args(args)
        .env("AGENT_HOST_HOME", &host.home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// Read lines until one equals `want`; returns every line read (including it).
async fn read_until(lines: &mut Lines<BufReader<ChildStdout>>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {want:?}; saw {seen:?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("follow exited before {want:?}; saw {seen:?}"));
        let done = line == want;
        seen.push(line);
        if done {
            return seen;
        }
    }
}

async fn interrupt(mut child: Child) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_renders_the_stream_survives_a_restart_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    host.bracket(&text_end(&session, "before")).await;

    let (child, mut lines) = spawn_follow(&host, &[&session]);
    // Replayed history first.
    let mut all = read_until(&mut lines, "assistant: text of before").await;

    // A streamed block: the deltas print as they come, the end closes the line. Whether
    // the follower joined before the deltas or not, the line reads the same.
    host.bus.publish(&text_start(&session, "s1")).await.unwrap();
    host.bus
        .publish(&text_delta(&session, "s1", "Hel"))
        .await
        .unwrap();
    host.bus
        .publish(&text_delta(&session, "s1", "lo"))
        .await
        .unwrap();
    let mut end = text_end(&session, "s1");
    if let agent_host::protocol::events::EventBody::TextEnd(b) = &mut end.body {
        b.text = "Hello".into();
    }
    host.bracket(&end).await;
    all.extend(read_until(&mut lines, "assistant: Hello").await);

    // The host goes away and comes back: follow reconnects by itself, with its cursor.
    let host = host.restart().await;
    host.bracket(&text_end(&session, "after-restart")).await;
    all.extend(read_until(&mut lines, "assistant: text of after-restart").await);
    for line in ["assistant: text of before", "assistant: Hello"] {
        assert_eq!(
            all.iter().filter(|l| *l == line).count(),
            1,
            "{line:?} in {all:?}"
        );
    }

    let status = interrupt(child).await;
    assert!(status.success(), "follow exited with {status}");
    // It removed its subscriber on the way out.
    let list = host.ok("subscriber.list", json!({})).await;
    assert_eq!(list["subscribers"], json!([]));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_json_prints_canonical_events_one_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(dir.path()).await;
    let session = host.session(dir.path()).await;
    let seq = host.bracket(&text_end(&session, "j1")).await;
    let (child, mut lines) = spawn_follow(&host, &[&session, "--json"]);
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["k"], "text.end");
    assert_eq!(event["itemId"], "j1");
    assert_eq!(event["sessionId"], json!(session));
    assert!(seq > 0);
    assert!(interrupt(child).await.success());
    host.stop().await;
}

#[tokio::test]
async fn follow_without_a_host_says_so_in_one_json_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("follow")
        .env("AGENT_HOST_HOME", dir.path())
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["code"], 2002);
}
