//! `agent.list` against the real agent CLI (issue 4, acceptance 1): the pinned
//! `@anthropic-ai/claude-code` from `agents/package.json`, installed by this test into
//! `agents/node_modules` (npm ci, reused when present), probed through the spawn policy.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::Path;
use std::process::Command;

use common::agents::ensure_claude;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");

fn pinned_version() -> String {
    let package: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/package.json"))
            .unwrap(),
    )
    .unwrap();
    package["dependencies"]["@anthropic-ai/claude-code"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn agent_list(env: &[(&str, &str)]) -> Vec<Value> {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("agent.list").env("AGENT_HOST_HOME", home.path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    reply["data"]["agents"].as_array().unwrap().clone()
}

fn family<'a>(agents: &'a [Value], agent_type: &str) -> &'a Value {
    agents
        .iter()
        .find(|a| a["agent_type"] == agent_type)
        .unwrap_or_else(|| panic!("{agent_type} missing from {agents:?}"))
}

#[test]
fn agent_list_reports_the_installed_claude_with_version_and_capabilities() {
    let claude = ensure_claude();
    let agents = agent_list(&[("AGENT_HOST_CLAUDE_BIN", claude.to_str().unwrap())]);
    let c = family(&agents, "claude");
    assert_eq!(c["usable"], true, "{c}");
    assert_eq!(c["version"], Value::from(pinned_version()));
    assert_eq!(c["binary"], Value::from(claude.display().to_string()));
    assert_eq!(c["capabilities"]["resume"], "native_id");
    assert_eq!(c["capabilities"]["permissions"], true);
    assert_eq!(c["capabilities"]["process"], "persistent");
    assert_eq!(c["error"], Value::Null);
    // Found on PATH too, when no binary is configured.
    let dir = claude.parent().unwrap().display().to_string();
    let agents = agent_list(&[("PATH", &format!("{dir}:/usr/bin:/bin"))]);
    assert_eq!(
        family(&agents, "claude")["version"],
        Value::from(pinned_version())
    );
}

#[test]
fn agent_list_says_binary_unavailable_with_the_path_tried() {
    let agents = agent_list(&[("AGENT_HOST_CLAUDE_BIN", "/nonexistent/bin/claude")]);
    let c = family(&agents, "claude");
    assert_eq!(c["usable"], false);
    assert_eq!(c["error"], "binary_unavailable");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/bin/claude"),
        "{c}"
    );
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().display().to_string();
    let agents = agent_list(&[("PATH", &path)]);
    for a in &agents {
        assert_eq!(a["error"], "binary_unavailable", "{a}");
        assert!(a["reason"].as_str().unwrap().contains(&path), "{a}");
    }
}

#[test]
fn agent_list_reports_the_installed_codex_and_that_it_runs_turns() {
    let codex = common::agents::ensure_codex();
    let agents = agent_list(&[("AGENT_HOST_CODEX_BIN", codex.to_str().unwrap())]);
    let c = family(&agents, "codex");
    assert_eq!(c["usable"], true, "{c}");
    let pinned: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/package.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(c["version"], pinned["dependencies"]["@openai/codex"]);
    assert_eq!(c["turns"], true);
    assert_eq!(c["capabilities"]["resume"], "native_id");
    // ACP agents run turns too (tests/suite/acp.rs drives one).
    assert_eq!(family(&agents, "acp")["turns"], true);
}
