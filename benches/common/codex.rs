//! What the agent benches share: re-running inside a loopback-only network namespace, the
//! mock model on a thread of its own, the Codex config both Codex benches write, and a
//! percentile.

#![allow(dead_code, reason = "each bench uses part of this")]

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

const MARKER: &str = "AGENT_HOST_BENCH_NETNS";

/// Outside the namespace: run this bench again inside one that has only loopback, with
/// `args`, and return `true` (the caller returns). Inside: `false`.
pub fn reran_in_loopback_netns(args: &[String]) -> anyhow::Result<bool> {
    if std::env::var_os(MARKER).is_some() {
        return Ok(false);
    }
    let flags = if nix::unistd::geteuid().is_root() {
        "-n"
    } else {
        "-rn"
    };
    let status = std::process::Command::new("unshare")
        .args([flags, "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(std::env::current_exe()?)
        .args(args)
        .env(MARKER, "1")
        .status()
        .context("unshare (util-linux) is needed")?;
    anyhow::ensure!(status.success(), "the benchmark failed in its namespace");
    Ok(true)
}

/// Start the mock (logging its chunk writes) on a thread of its own, so the clients' work
/// never delays its writes; its base URL.
pub fn mock_on_thread() -> anyhow::Result<String> {
    super::mock_model::log_chunk_writes();
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mock = super::mock_model::MockModel::start(0).await.unwrap();
            url_tx.send(mock.base_url()).unwrap();
            std::future::pending::<()>().await;
        });
    });
    Ok(url_rx.recv()?)
}

/// The config the Codex benches use (as `tests/common/agents.rs` writes it).
pub fn write_config(codex_home: &Path, base_url: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(codex_home)?;
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            r#"model = "mock-model"
model_provider = "mock"
approval_policy = "on-request"
sandbox_mode = "workspace-write"
check_for_update_on_startup = false

[model_providers.mock]
name = "Mock LLM"
base_url = "{base_url}/v1"
env_key = "MOCK_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 60000

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"#
        ),
    )?;
    Ok(())
}

/// The `p` quantile of `values` (nearest rank); zero when empty.
pub fn pct(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}
