//! Issue 18, acceptance 5, with the real `claude` CLI against the project's mock model: a
//! session started in a terminal (`claude -p`, then `claude -p --resume`) is listed by
//! `session.discover` for its cwd, `session.import` shows its earlier turns in
//! `session.history` (marked imported) and continues it, and an import under another cwd is
//! refused. Each test runs inside its own loopback-only network namespace.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::Path;
use std::process::Stdio;

use common::world::{Family, TURN, World, in_netns, run_end, run_end_of, text_of_run};
use serde_json::{Value, json};

/// `claude -p --output-format stream-json --verbose [--resume id] <prompt>` in `cwd`, as a
/// user runs it in a terminal, with the world's agent environment: the session id it
/// reported, and the text of its answer.
async fn claude_in_a_terminal(
    world: &World,
    cwd: &Path,
    resume: Option<&str>,
    prompt: &str,
) -> (String, String) {
    let agents = world.agents();
    let mut args = vec!["-p", "--output-format", "stream-json", "--verbose"];
    if let Some(id) = resume {
        args.extend(["--resume", id]);
    }
    args.push(prompt);
    let run = tokio::process::Command::new(agents.claude.unwrap())
        .args(&args)
        .env_clear()
        .envs(
            agents
                .env
                .iter()
                .filter(|(k, _)| k != "CLAUDECODE")
                .cloned(),
        )
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(TURN, run).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "claude {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let result = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "result")
        .unwrap_or_else(|| panic!("no result line: {stdout}"));
    (
        result["session_id"].as_str().unwrap().to_owned(),
        result["result"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Acceptance 5: discover, import with its history, continue, and no import elsewhere.
#[test]
fn a_terminal_session_is_discovered_and_imported_with_its_history() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_terminal_session_is_discovered_and_imported_with_its_history",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let work = std::fs::canonicalize(&world.work).unwrap();
        let (id, first) = claude_in_a_terminal(&world, &work, None, "first prompt").await;
        assert!(first.contains("echo: first prompt"), "{first}");
        let (resumed, second) =
            claude_in_a_terminal(&world, &work, Some(&id), "second prompt").await;
        assert_eq!(resumed, id, "--resume continues the same session");
        assert!(second.contains("user turns seen: 2"), "{second}");

        // Listed for its cwd, with its first prompt and both turns.
        let cwd = work.display().to_string();
        let found = world
            .host()
            .ok(
                "session.discover",
                json!({"agent_type": "claude", "cwd": cwd}),
            )
            .await;
        let sessions = found["sessions"].as_array().unwrap();
        assert_eq!(sessions.len(), 1, "{found}");
        let listed = &sessions[0];
        assert_eq!(listed["native_session_id"], id.as_str());
        assert_eq!(listed["first_prompt"], "first prompt");
        assert_eq!(listed["turns"], 2);
        assert!(listed["last_activity_ms"].as_i64().unwrap() > 0);
        assert!(listed.get("imported_as").is_none(), "{listed}");

        // Imported: its earlier turns are the session's first brackets, marked imported.
        let imported = world
            .host()
            .ok(
                "session.import",
                json!({"agent_type": "claude", "native_session_id": id, "cwd": cwd}),
            )
            .await;
        let session = imported["session_id"].as_str().unwrap().to_owned();
        let history = world
            .host()
            .ok("session.history", json!({"session_id": session}))
            .await;
        let events: Vec<&Value> = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["event"])
            .collect();
        let of = |kind: &str| -> Vec<&Value> {
            events.iter().copied().filter(|e| e["k"] == kind).collect()
        };
        let prompts: Vec<&str> = of("user.text")
            .iter()
            .map(|e| e["text"].as_str().unwrap())
            .collect();
        assert_eq!(prompts, ["first prompt", "second prompt"], "{history}");
        let answers = of("text.end");
        assert_eq!(answers.len(), 2, "{history}");
        assert!(
            answers[0]["text"]
                .as_str()
                .unwrap()
                .contains("echo: first prompt")
        );
        assert!(
            answers[1]["text"]
                .as_str()
                .unwrap()
                .contains("echo: second prompt")
        );
        for e in of("user.text").into_iter().chain(answers) {
            assert_eq!(e["imported"], true, "{e}");
            assert!(e.get("runId").is_none(), "{e}");
        }
        // Now it is the host session made from it.
        let found = world
            .host()
            .ok(
                "session.discover",
                json!({"agent_type": "claude", "cwd": cwd}),
            )
            .await;
        assert_eq!(found["sessions"][0]["imported_as"], session.as_str());
        // The session list previews its imported conversation (the last answer).
        let listed = world.host().ok("session.list", json!({})).await;
        let row = listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == session.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{session} not listed: {listed}"));
        assert!(
            row["preview"]
                .as_str()
                .is_some_and(|p| p.contains("echo: second prompt")),
            "{row}"
        );

        // It goes on from there (in a fork of it), after the imported brackets.
        let mut ws = world.follower(&session, false).await;
        let run = world.send(&session, "third prompt").await;
        run_end(&mut ws, &run, TURN).await;
        assert_eq!(run_end_of(&ws, &run)["state"], "completed");
        let text = text_of_run(&ws, &run);
        assert!(
            text.contains("user turns seen: 3; first: first prompt"),
            "{text}"
        );
        let history = world
            .host()
            .ok("session.history", json!({"session_id": session}))
            .await;
        let prompts: Vec<(bool, &str)> = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["event"])
            .filter(|e| e["k"] == "user.text")
            .map(|e| (e["imported"] == true, e["text"].as_str().unwrap()))
            .collect();
        assert_eq!(
            prompts,
            [
                (true, "first prompt"),
                (true, "second prompt"),
                (false, "third prompt")
            ]
        );

        // Another cwd lists nothing of it and cannot import it.
        let elsewhere = world.dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let other = elsewhere.display().to_string();
        let found = world
            .host()
            .ok(
                "session.discover",
                json!({"agent_type": "claude", "cwd": other}),
            )
            .await;
        assert_eq!(found["sessions"], json!([]), "{found}");
        let refused = world
            .host()
            .ipc(
                "session.import",
                json!({"agent_type": "claude", "native_session_id": id, "cwd": other}),
            )
            .await;
        assert_ne!(refused.code, 0, "{}", refused.to_line());
        assert_eq!(
            refused.data["error"],
            "binding_mismatch",
            "{}",
            refused.to_line()
        );

        // A family that keeps no files the host reads says so.
        let unsupported = world
            .host()
            .ipc("session.discover", json!({"agent_type": "acp", "cwd": cwd}))
            .await;
        assert_eq!(
            unsupported.data["error"],
            "option_unsupported",
            "{}",
            unsupported.to_line()
        );
        assert_eq!(unsupported.data["option"], "discover");
        world.host.unwrap().stop().await;
    });
}
