//! The binding checked before every prompt, with the real `claude` against the project's mock
//! model (issue 18, acceptance 4): a workspace whose git remote changed between two prompts
//! refuses the second one before it reaches the agent; a host restarted with another base URL
//! forks the session at its next prompt, and the turn is answered there with the history. Each
//! test runs inside its own loopback-only network namespace.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::Path;

use common::mock_model::MockModel;
use common::world::{Family, TURN, World, in_netns, run_end, text_of_run};

/// `git -C <dir> <args>` in a test's own directory (never the repository's), without the
/// user's configuration. Git is wherever this repository was cloned; a machine without it
/// fails here, saying so (the test installs nothing).
fn git(dir: &Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("git is needed by this test (`which git` finds none)");
    assert!(status.success(), "git {args:?} in {}", dir.display());
}

fn need_git() {
    assert!(
        which::which("git").is_ok(),
        "git is needed by this test (`which git` finds none); it installs nothing"
    );
}

/// Whether any request the model was shown mentions `text`.
fn model_saw(mock: &MockModel, text: &str) -> bool {
    mock.bodies
        .lock()
        .unwrap()
        .iter()
        .any(|b| b.to_string().contains(text))
}

/// Acceptance 4, the workspace: a session in a repository whose `origin` is A, a turn, the
/// remote set to B, and the next prompt is refused — `warning` `workspace_changed` naming A and
/// B and `session.fork`, `run.end` failed `resume_rejected` — and nothing of it reached the
/// model. A fork then goes on in the workspace as it is.
#[test]
fn a_changed_remote_refuses_the_next_prompt() {
    need_git();
    let Some(rt) = in_netns(Family::Claude, "a_changed_remote_refuses_the_next_prompt") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        git(&world.work, &["init", "-q"]);
        git(
            &world.work,
            &[
                "remote",
                "add",
                "origin",
                "https://user:secret@example.com/team/a.git",
            ],
        );
        let session = world.session().await;
        let row = world
            .host()
            .ok("session.get", serde_json::json!({"session_id": session}))
            .await;
        assert!(!row.to_string().contains("secret"), "{row}");
        let mut ws = world.follower(&session, false).await;
        let first = world.turn(&mut ws, &session, "hello host").await;
        assert_eq!(
            text_of_run(&ws, &first),
            "echo: hello host [user turns seen: 1; first: hello host]"
        );
        let seen_before = world.mock.bodies.lock().unwrap().len();

        git(
            &world.work,
            &[
                "remote",
                "set-url",
                "origin",
                "https://example.com/team/b.git",
            ],
        );
        let second = world.send(&session, "moved prompt").await;
        let id = second.clone();
        let warning = ws
            .until("workspace_changed", TURN, |s| {
                s.kind() == "warning" && s.run_id == id
            })
            .await;
        assert_eq!(warning.event["code"], "workspace_changed");
        let message = warning.event["message"].as_str().unwrap();
        assert!(
            message.contains("https://example.com/team/a.git")
                && message.contains("https://example.com/team/b.git")
                && message.contains("session.fork"),
            "{message}"
        );
        let end = run_end(&mut ws, &second, TURN).await;
        assert_eq!(end["state"], "failed", "{end}");
        assert_eq!(end["category"], "resume_rejected", "{end}");
        assert!(!model_saw(&world.mock, "moved prompt"));
        assert_eq!(world.mock.bodies.lock().unwrap().len(), seen_before);

        // The way on: a fork, bound to the workspace as it is now, with the conversation.
        let child = world
            .host()
            .ok("session.fork", serde_json::json!({"session_id": session}))
            .await;
        let child = child["session_id"].as_str().unwrap().to_owned();
        let mut cws = world.follower(&child, false).await;
        let third = world.turn(&mut cws, &child, "after the fork").await;
        assert_eq!(
            text_of_run(&cws, &third),
            "echo: after the fork [user turns seen: 2; first: hello host]"
        );
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 4, the provider: a turn against one mock, the host restarted with
/// `ANTHROPIC_BASE_URL` on a second mock, and the next prompt forks the native session
/// (`warning` `provider_changed`, `session.forked`, `session.configured` `provider_changed`);
/// the second mock answers it with the history, and the first one sees nothing more.
#[test]
fn another_base_url_forks_at_the_next_prompt() {
    let Some(rt) = in_netns(Family::Claude, "another_base_url_forks_at_the_next_prompt") else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "hello host").await;
        let native = world.native_id(&session).await;
        drop(ws);

        world.host.take().unwrap().stop().await;
        let second = MockModel::start(0).await.unwrap();
        let first = std::mem::replace(&mut world.mock, second);
        let seen_by_first = first.bodies.lock().unwrap().len();
        world.restart_from_stopped().await;

        let mut ws = world.follower(&session, false).await;
        let run = world.send(&session, "after the move").await;
        let id = run.clone();
        let warning = ws
            .until("provider_changed", TURN, |s| {
                s.kind() == "warning" && s.run_id == id
            })
            .await;
        assert_eq!(
            warning.event["code"], "provider_changed",
            "{}",
            warning.event
        );
        let message = warning.event["message"].as_str().unwrap();
        assert!(
            message.contains(&first.addr.to_string())
                && message.contains(&world.mock.addr.to_string()),
            "{message}"
        );
        assert!(!message.contains("mock-key"), "{message}");
        let forked = ws.until_kind("session.forked", TURN).await;
        assert_eq!(forked.event["fromNativeSessionId"], native.as_str());
        let configured = ws.until_kind("session.configured", TURN).await;
        assert_eq!(configured.event["reason"], "provider_changed");
        let end = run_end(&mut ws, &run, TURN).await;
        assert_eq!(end["state"], "completed", "{end}");
        assert_eq!(
            text_of_run(&ws, &run),
            "echo: after the move [user turns seen: 2; first: hello host]"
        );
        assert!(model_saw(&world.mock, "after the move"));
        assert_eq!(first.bodies.lock().unwrap().len(), seen_by_first);
        // The session goes on in its fork, bound to the new provider.
        assert_ne!(world.native_id(&session).await, native);
        let row = world
            .host()
            .ok("session.get", serde_json::json!({"session_id": session}))
            .await;
        let host = row["binding"]["provider"]["host"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(host, world.mock.addr.to_string(), "{row}");
        world.host.unwrap().stop().await;
    });
}
