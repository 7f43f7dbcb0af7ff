//! A real host (`agent_host::run`, IPC and all) that publishes brackets as fast as it can into
//! one session and prints `ack <sequence_id> <item>` for each bracket whose commit the bus
//! acknowledged. `tests/suite/crash.rs` kills it with SIGKILL mid-stream and checks that every
//! acknowledged bracket is in SQLite exactly once.
//!
//! Usage: `crash_publisher <home-dir>`

use std::io::Write;
use std::time::Duration;

use agent_host::config::Config;
use agent_host::protocol::events::{BlockEnd, Event, EventBody};
use anyhow::{Context, bail};
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let home = std::env::args()
        .nth(1)
        .context("usage: crash_publisher <home-dir>")?;
    let config = Config::with_home(home)?;
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let host = tokio::spawn(agent_host::run(config, std::future::pending(), ready_tx));
    let ready = ready_rx.await.context("host did not start")?;
    let reply = agent_host::ipc::request(
        &ready.ipc_path,
        &json!({"command": "session.create", "params": {"agent_type": "claude", "cwd": "/"}}),
        Duration::from_secs(10),
    )
    .await?;
    if !reply.is_ok() {
        bail!("session.create failed: {}", reply.to_line());
    }
    let session_id = reply.data["session_id"]
        .as_str()
        .context("no session_id")?
        .to_owned();
    let mut out = std::io::stdout().lock();
    writeln!(out, "session {session_id}")?;
    out.flush()?;
    let mut n: u64 = 0;
    loop {
        let mut receipts = Vec::with_capacity(64);
        for _ in 0..64 {
            let item = format!("e{n}");
            n += 1;
            let event = Event::new(
                session_id.as_str(),
                Some("run".to_owned()),
                EventBody::TextEnd(BlockEnd {
                    truncated: None,
                    imported: false,
                    item_id: Some(item.clone()),
                    text: "x".repeat(200),
                }),
            );
            receipts.push((item, ready.bus.publish(&event).await?));
        }
        for (item, receipt) in receipts {
            let seq = receipt
                .committed()
                .await?
                .context("a bracket has a sequence id")?;
            writeln!(out, "ack {seq} {item}")?;
        }
        out.flush()?;
        if host.is_finished() {
            bail!("host stopped");
        }
    }
}
