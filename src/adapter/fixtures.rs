//! Test support: every recorded transcript `fixtures/<family>/*.jsonl` translated line by line
//! and compared, whole, with its expected events beside it (`*.events.json`).
//! `AGENT_HOST_BLESS=1` rewrites the expectations for review with `git diff`.

use std::path::PathBuf;

use crate::protocol::events::EventBody;

/// Check every fixture of `family` with a fresh translator per transcript; returns how many.
pub fn check_all<T>(
    family: &str,
    new: impl Fn() -> T,
    line: impl Fn(&mut T, &str) -> Vec<EventBody>,
) -> usize {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(family);
    let bless = std::env::var_os("AGENT_HOST_BLESS").is_some();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    names.sort();
    for transcript in &names {
        let mut t = new();
        let events: Vec<serde_json::Value> = std::fs::read_to_string(transcript)
            .unwrap()
            .lines()
            .flat_map(|l| line(&mut t, l))
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        let expected_path = transcript.with_extension("events.json");
        let got = serde_json::to_string_pretty(&events).unwrap() + "\n";
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&expected_path).unwrap_or_default();
        assert!(
            got == want,
            "{} translates differently; review with AGENT_HOST_BLESS=1 and git diff",
            transcript.display()
        );
    }
    names.len()
}
