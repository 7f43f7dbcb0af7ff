//! The integration suite: every real-socket, real-process test of the host, one module per
//! area, in one test binary. One binary links once instead of once per file, and the harness
//! runs tests of every area side by side: a file of tests that mostly wait on a real agent CLI
//! no longer holds the whole run while the others queue behind it. Run one area with
//! `cargo test --test suite <module>::`, one test with `cargo test --test suite <name>`.
//!
//! `tests/ws_memory.rs` stays a binary of its own: it measures the memory of a host running in
//! its process, which no other test may share.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: a panic is the failure report, and a test's figures are its output"
)]

#[path = "../common/mod.rs"]
mod common;

mod acp;
mod acp_faults;
mod agent_faults;
mod agents;
mod binding;
mod bus;
mod claude_host;
mod claude_live;
mod cli;
mod codex_host;
mod codex_provider;
mod conformance;
mod crash;
mod discover;
mod doctor;
mod fleet_host;
mod follow;
mod follow_tui;
mod fuzz_corpus;
mod gemini_cli;
mod hooks;
mod human;
mod ipc_hostile;
mod late_joiner;
mod one_error_table;
mod orphans;
mod ownership;
mod pairing;
mod peer_uid;
mod permission_rules;
mod redaction;
mod relay;
mod relay_fleet;
mod relay_service;
mod reload;
mod search;
mod service;
mod session_states;
mod steer;
mod store_fault;
mod torture;
mod turn_queue;
mod web_http;
mod web_ui;
mod web_vendor;
mod wire_only;
mod wire_parity;
mod ws;
