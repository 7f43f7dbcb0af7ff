//! Issue 2, acceptance 5: a host killed with SIGKILL while brackets are being published loses
//! none whose commit was acknowledged, stores none twice, and the next `host.start` takes over
//! its stale lock.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");

fn example(name: &str) -> PathBuf {
    let path = Path::new(BIN).parent().unwrap().join("examples").join(name);
    assert!(
        path.exists(),
        "{} not built (cargo test builds examples)",
        path.display()
    );
    path
}

fn cli(home: &Path, args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .args(args)
        .env("AGENT_HOST_HOME", home)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
}

#[tokio::test]
async fn sigkill_mid_publish_loses_no_acknowledged_bracket() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut child = Command::new(example("crash_publisher"))
        .arg(&home)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let session_id = first.strip_prefix("session ").unwrap().to_owned();

    // Let it get well into publishing, then kill it without warning.
    let mut acked: HashMap<String, i64> = HashMap::new();
    let record = |line: &str, acked: &mut HashMap<String, i64>| {
        let mut parts = line.split(' ');
        assert_eq!(parts.next(), Some("ack"), "{line}");
        let seq: i64 = parts.next().unwrap().parse().unwrap();
        let item = parts.next().unwrap().to_owned();
        assert!(acked.insert(item, seq).is_none(), "acked twice: {line}");
    };
    while acked.len() < 3000 {
        let line = lines.next().expect("publisher ended early").unwrap();
        record(&line, &mut acked);
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Acks printed before the kill are still in the pipe; a torn last line is not an ack.
    for line in lines {
        let Ok(line) = line else { break };
        if line.split(' ').count() == 3 {
            record(&line, &mut acked);
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the publisher was killed, not finished");

    // The next host takes the stale lock over and serves the history.
    let started = cli(&home, &["host.start"]);
    assert_eq!(started["code"], 0, "{started}");
    assert_ne!(started["data"]["pid"], Value::from(child.id()));
    let mut stored: HashMap<String, i64> = HashMap::new();
    let mut after = 0;
    loop {
        let params =
            serde_json::json!({"session_id": session_id, "after_seq": after, "limit": 5000});
        let page = cli(&home, &["session.history", &params.to_string()]);
        assert_eq!(page["code"], 0, "{page}");
        let events = page["data"]["events"].as_array().unwrap();
        if events.is_empty() {
            break;
        }
        for e in events {
            let item = e["event"]["itemId"].as_str().unwrap().to_owned();
            let seq = e["sequence_id"].as_i64().unwrap();
            assert!(
                stored.insert(item.clone(), seq).is_none(),
                "{item} stored twice"
            );
        }
        after = page["data"]["next_after_seq"].as_i64().unwrap();
    }
    for (item, seq) in &acked {
        assert_eq!(
            stored.get(item),
            Some(seq),
            "acknowledged {item} (seq {seq}) is missing"
        );
    }
    eprintln!(
        "acknowledged {}, stored {} (the difference was committed but not yet acknowledged)",
        acked.len(),
        stored.len()
    );

    let stopped = cli(&home, &["host.shutdown"]);
    assert_eq!(stopped["code"], 0, "{stopped}");
}
