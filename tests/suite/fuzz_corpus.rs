//! The committed fuzz corpus (`fuzz/corpus/<target>/`) replayed under a stable `cargo test`:
//! every input goes through the same `agent_host::fuzzing` function its fuzz target calls, so
//! a crash or a broken invariant the fuzzers once found (and every input they kept for
//! coverage) fails here, without a nightly toolchain. `scripts/fuzz.sh` grows the corpus.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use std::path::{Path, PathBuf};

use agent_host::fuzzing;

/// Every target; each has a test below that replays its corpus.
const TARGETS: &[&str] = &[
    "envelope",
    "frame",
    "jsonrpc_line",
    "claude_translator",
    "codex_translator",
    "acp_translator",
    "session_file_line",
];

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    let files = corpus(target);
    assert!(!files.is_empty(), "fuzz/corpus/{target} is empty");
    for file in &files {
        let data = std::fs::read(file).unwrap();
        // Name the input that fails: the panic alone would not say which one.
        if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            panic!("{target}: {} fails: {why}", file.display());
        }
    }
}

#[test]
fn every_target_has_a_corpus_and_a_fuzz_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for target in TARGETS {
        assert!(
            root.join("fuzz_targets")
                .join(format!("{target}.rs"))
                .is_file(),
            "no fuzz target {target}"
        );
        assert!(!corpus(target).is_empty(), "fuzz/corpus/{target} is empty");
    }
}

#[test]
fn envelope() {
    replay("envelope", fuzzing::envelope);
}

#[test]
fn frame() {
    replay("frame", fuzzing::frame);
}

#[test]
fn jsonrpc_line() {
    replay("jsonrpc_line", fuzzing::jsonrpc_line);
}

#[test]
fn claude_translator() {
    replay("claude_translator", fuzzing::claude_translator);
}

#[test]
fn codex_translator() {
    replay("codex_translator", fuzzing::codex_translator);
}

#[test]
fn acp_translator() {
    replay("acp_translator", fuzzing::acp_translator);
}

#[test]
fn session_file_line() {
    replay("session_file_line", fuzzing::session_file_line);
}
