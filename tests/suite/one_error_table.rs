//! One mapping from errors to the stable codes (issue 14): a `match` arm on a module error
//! (`SessionError::…`, `StoreError::…`, `WireError::…`, …) that yields an `ErrorCode` appears
//! in `src/request/errors.rs` and nowhere else, and the transports build no command replies.

#![allow(clippy::unwrap_used, reason = "a failing test should panic")]

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn errors_become_codes_in_one_place() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    // An arm on an error enum whose body (the arm's line or the next three) names an ErrorCode.
    let arm = regex::Regex::new(r"\b[A-Z]\w*Error::\w+[^=]*=>").unwrap();
    let mut mappings = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !arm.is_match(line) || line.trim_start().starts_with("//") {
                continue;
            }
            let body = lines[i..lines.len().min(i + 4)].join("\n");
            // Up to the next arm: a following arm's code is its own.
            let body = match body[line.len()..].find("=>") {
                Some(next) => &body[..line.len() + next],
                None => &body[..],
            };
            if body.contains("ErrorCode::") {
                let rel = file.strip_prefix(root).unwrap().display().to_string();
                mappings.push(format!("{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    let outside: Vec<&String> = mappings
        .iter()
        .filter(|m| !m.starts_with("src/request/errors.rs:"))
        .collect();
    assert!(
        outside.is_empty(),
        "errors mapped to codes outside src/request/errors.rs:\n{}",
        outside
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        mappings.len() >= 10,
        "the scan found only {} mappings: it no longer sees the real table",
        mappings.len()
    );
    // The transports keep framing only: no history paging, no store access.
    for transport in ["src/link/mod.rs", "src/ws/server.rs", "src/relay/client.rs"] {
        let text = std::fs::read_to_string(root.join(transport)).unwrap();
        for forbidden in [
            "crate::store::Store",
            ".history(",
            "SessionError",
            "MAX_HISTORY",
        ] {
            assert!(
                !text.contains(forbidden),
                "{transport} uses {forbidden}: that is the request layer's"
            );
        }
    }
    let relay = std::fs::read_to_string(root.join("src/relay/client.rs")).unwrap();
    assert!(
        !relay.contains("crate::ws"),
        "the relay imports the loopback server"
    );
}
