//! Never write a session file another process writes (issue 6): the real `claude` CLI through
//! the host, with a second, external `claude` on the same session file — run to completion
//! while the host was down, or still running when the host's prompt comes. Each test runs in
//! its own loopback-only network namespace against the project's mock model.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;

use agent_host::adapter::claude;
use common::world::{Family, TURN, World, in_netns, run_end, run_end_of, text_of_run};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The session file of `native` under the agents' HOME.
fn session_file(world: &World, native: &str) -> PathBuf {
    let projects = world.dir.path().join("agent-home/.claude/projects");
    let name = claude::project_dir_name(&world.work.canonicalize().unwrap().to_string_lossy());
    projects.join(name).join(format!("{native}.jsonl"))
}

/// An external `claude` on the session, as a user in a terminal would run it: the same HOME,
/// resuming the same id in the same directory.
fn external_claude(world: &World, native: &str) -> tokio::process::Child {
    let agents = world.agents();
    tokio::process::Command::new(agents.claude.unwrap())
        .args(claude::launch_args(None, Some(native), false))
        .env_clear()
        .envs(
            agents
                .env
                .iter()
                .filter(|(k, _)| k != "CLAUDECODE")
                .cloned(),
        )
        .current_dir(&world.work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Start an external `claude` on the session and give it one prompt; the caller closes its
/// stdin (a finished terminal run) or keeps it (a terminal left mid-conversation).
async fn external_turn(
    world: &World,
    native: &str,
    text: &str,
) -> (tokio::process::Child, tokio::process::ChildStdin) {
    let mut external = external_claude(world, native);
    let mut stdin = external.stdin.take().unwrap();
    stdin
        .write_all((claude::user_frame(text, &uuid::Uuid::new_v4().to_string()) + "\n").as_bytes())
        .await
        .unwrap();
    (external, stdin)
}

/// Read the external CLI's stdout to its end and check it exited cleanly.
async fn finish(mut external: tokio::process::Child) {
    let mut lines = BufReader::new(external.stdout.take().unwrap()).lines();
    while tokio::time::timeout(TURN, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .is_some()
    {}
    assert!(external.wait().await.unwrap().success());
}

/// The `forked` warning of a run (which must exist).
fn fork_warning(ws: &common::world::Follower, run: &str) -> serde_json::Value {
    ws.of_run(run)
        .into_iter()
        .find(|s| s.kind() == "warning" && s.event["code"] == "forked")
        .unwrap_or_else(|| panic!("no fork: {:?}", ws.kinds()))
        .event
        .clone()
}

/// Acceptance 1 (the host stopped in between): an external `claude --resume` adds a turn to the
/// file; the host's next prompt runs in a fork (new native id, a `forked` warning), remembers
/// the conversation, and leaves the original file exactly as the external run left it.
#[test]
fn an_external_resume_makes_the_next_prompt_fork() {
    let Some(rt) = in_netns(
        Family::Claude,
        "an_external_resume_makes_the_next_prompt_fork",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "hello from the host").await;
        let native = world.native_id(&session).await;
        drop(ws);
        world.host.take().unwrap().stop().await;

        // Outside the host: one more turn on the same session, run to completion.
        let (external, stdin) = external_turn(&world, &native, "hello from the terminal").await;
        drop(stdin);
        finish(external).await;
        let left = std::fs::read(session_file(&world, &native)).unwrap();

        world.restart_from_stopped().await;
        let mut ws = world.follower(&session, false).await;
        let run = world.send(&session, "back in the host").await;
        run_end(&mut ws, &run, TURN).await;
        assert_eq!(run_end_of(&ws, &run)["state"], "completed");
        let forked = fork_warning(&ws, &run);
        assert!(forked["message"].as_str().unwrap().contains(&native));
        let lineage = ws
            .of_run(&run)
            .into_iter()
            .find(|s| s.kind() == "session.forked")
            .unwrap_or_else(|| panic!("no session.forked: {:?}", ws.kinds()))
            .clone();
        assert_eq!(lineage.event["fromNativeSessionId"], native.as_str());
        assert_eq!(lineage.event["parentSessionId"], session.as_str());
        let fork = world.native_id(&session).await;
        assert_ne!(fork, native);
        let text = text_of_run(&ws, &run);
        assert!(
            text.contains("first: hello from the host"),
            "history lost: {text}"
        );
        let now = std::fs::read(session_file(&world, &native)).unwrap();
        assert!(
            now == left,
            "the original file was written after the fork decision ({} → {} bytes)",
            left.len(),
            now.len()
        );
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 2: an external `claude` still running on the session (holding it) when the
/// host's prompt comes: the host's own live child is closed and the prompt runs in a fork.
#[test]
fn a_running_external_claude_makes_the_next_prompt_fork() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_running_external_claude_makes_the_next_prompt_fork",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "hello from the host").await;
        let native = world.native_id(&session).await;
        let host_child = world.agent_pid(&session).await;

        // A terminal user resumes the same session and leaves it open mid-conversation.
        let (mut external, stdin) = external_turn(&world, &native, "terminal turn").await;
        let mut lines = BufReader::new(external.stdout.take().unwrap()).lines();
        loop {
            let line = tokio::time::timeout(TURN, lines.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if line.contains("\"type\":\"result\"") {
                break;
            }
        }
        let registry = world.dir.path().join(format!(
            "agent-home/.claude/sessions/{}.json",
            external.id().unwrap()
        ));
        assert!(registry.exists(), "the CLI registers itself while it runs");
        // Its prompt in the file is seen first (the tail); the holder check still names it at
        // the next prompt, while it runs.
        ws.until("session_drifted", TURN, |s| {
            s.kind() == "warning" && s.event["code"] == "session_drifted"
        })
        .await;

        let run = world.send(&session, "back in the host").await;
        run_end(&mut ws, &run, TURN).await;
        assert_eq!(run_end_of(&ws, &run)["state"], "completed");
        let forked = fork_warning(&ws, &run);
        let why = forked["message"].as_str().unwrap();
        assert!(
            why.contains(&format!("another process (pid {}", external.id().unwrap())),
            "{why}"
        );
        assert_ne!(world.native_id(&session).await, native);
        assert_ne!(
            world.agent_pid(&session).await,
            host_child,
            "the old child was closed"
        );
        assert!(!common::agents::group_alive(host_child));
        drop(stdin);
        let _ = external.wait().await;
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 1 and 5 with the host's child still alive: right after the host's turn (no settle
/// time: the host's own prompts carry its run ids, so its child's late writes are told from
/// anyone else's), an external `claude --resume` run to completion marks the session drifted at
/// once, and the next prompt closes the child and runs in a fork.
#[test]
fn an_external_turn_while_the_host_is_idle_is_seen_and_forked_from() {
    let Some(rt) = in_netns(
        Family::Claude,
        "an_external_turn_while_the_host_is_idle_is_seen_and_forked_from",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "hello from the host").await;
        let native = world.native_id(&session).await;
        let host_child = world.agent_pid(&session).await;
        assert!(
            ws.seen.iter().all(|s| s.kind() != "warning"),
            "the host's own writes were taken for drift: {:?}",
            ws.kinds()
        );

        let (external, stdin) = external_turn(&world, &native, "hello from the terminal").await;
        drop(stdin);
        let drift = ws
            .until("session_drifted", TURN, |s| {
                s.kind() == "warning" && s.event["code"] == "session_drifted"
            })
            .await;
        let why = drift.event["message"].as_str().unwrap();
        assert!(why.contains(&native), "{why}");
        finish(external).await;
        let left = std::fs::read(session_file(&world, &native)).unwrap();

        let run = world.send(&session, "back in the host").await;
        run_end(&mut ws, &run, TURN).await;
        assert_eq!(run_end_of(&ws, &run)["state"], "completed");
        assert_ne!(world.native_id(&session).await, native);
        assert_ne!(world.agent_pid(&session).await, host_child);
        assert!(
            !common::agents::group_alive(host_child),
            "the drifted child lives on"
        );
        let text = text_of_run(&ws, &run);
        assert!(
            text.contains("first: hello from the host"),
            "history lost: {text}"
        );
        let now = std::fs::read(session_file(&world, &native)).unwrap();
        assert!(
            now == left,
            "the original file was written after the drift ({} → {} bytes)",
            left.len(),
            now.len()
        );
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 6: a session started by a plain `claude -p` in the terminal, imported: the
/// host's first prompt continues that conversation (the model sees it) in a fork, and the
/// terminal's file is left as it was.
#[test]
fn an_imported_terminal_session_continues_in_a_fork() {
    let Some(rt) = in_netns(
        Family::Claude,
        "an_imported_terminal_session_continues_in_a_fork",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let terminal_id = "5eed5eed-1111-4222-8333-444455556666";
        let agents = world.agents();
        let mut external = tokio::process::Command::new(agents.claude.unwrap())
            .args(claude::launch_args(Some(terminal_id), None, false))
            .env_clear()
            .envs(
                agents
                    .env
                    .iter()
                    .filter(|(k, _)| k != "CLAUDECODE")
                    .cloned(),
            )
            .current_dir(&world.work)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = external.stdin.take().unwrap();
        stdin
            .write_all(
                (claude::user_frame("hello from the terminal", &uuid::Uuid::new_v4().to_string())
                    + "\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        drop(stdin);
        let mut lines = BufReader::new(external.stdout.take().unwrap()).lines();
        while tokio::time::timeout(TURN, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .is_some()
        {}
        assert!(external.wait().await.unwrap().success());
        let left = std::fs::read(session_file(&world, terminal_id)).unwrap();

        let imported = world
            .host()
            .ok(
                "session.import",
                serde_json::json!({"agent_type": "claude", "native_session_id": terminal_id,
                                   "cwd": world.work.display().to_string()}),
            )
            .await;
        let session = imported["session_id"].as_str().unwrap().to_owned();
        assert_eq!(imported["session"]["fork_of"], terminal_id);
        let mut ws = world.follower(&session, false).await;
        let run = world.send(&session, "now in the host").await;
        run_end(&mut ws, &run, TURN).await;
        assert_eq!(run_end_of(&ws, &run)["state"], "completed");
        let text = text_of_run(&ws, &run);
        assert!(
            text.contains("first: hello from the terminal"),
            "history lost: {text}"
        );
        let native = world.native_id(&session).await;
        assert_ne!(native, terminal_id, "continued in a fork");
        let now = std::fs::read(session_file(&world, terminal_id)).unwrap();
        assert!(now == left, "the terminal's file was written");
        // A bad id is refused before anything runs.
        let bad = world
            .host()
            .ipc(
                "session.import",
                serde_json::json!({"agent_type": "claude", "native_session_id": "--evil",
                                   "cwd": world.work.display().to_string()}),
            )
            .await;
        assert_eq!(bad.data["error"], "invalid_params");
        world.host.unwrap().stop().await;
    });
}

/// `session.fork`: a new session with `parent_session_id`, `session.forked` on both, the
/// conversation continued in the child while the parent goes on on its own.
#[test]
fn a_session_forks_on_request_and_both_go_on() {
    let Some(rt) = in_netns(Family::Claude, "a_session_forks_on_request_and_both_go_on") else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let parent = world.session().await;
        let mut pws = world.follower(&parent, false).await;
        world.turn(&mut pws, &parent, "hello parent").await;
        let parent_native = world.native_id(&parent).await;

        let forked = world
            .host()
            .ok("session.fork", serde_json::json!({"session_id": parent}))
            .await;
        let child = forked["session_id"].as_str().unwrap().to_owned();
        assert_eq!(forked["parent_session_id"], parent.as_str());
        let told = pws.until_kind("session.forked", TURN).await;
        assert_eq!(told.event["childSessionId"], child.as_str());

        let mut cws = world.follower(&child, false).await;
        let run = world.send(&child, "hello child").await;
        run_end(&mut cws, &run, TURN).await;
        assert!(cws.seen.iter().any(|s| s.kind() == "session.forked"));
        let text = text_of_run(&cws, &run);
        assert!(
            text.contains("user turns seen: 2; first: hello parent"),
            "{text}"
        );
        let child_native = world.native_id(&child).await;
        assert_ne!(child_native, parent_native);

        let again = world.send(&parent, "parent again").await;
        run_end(&mut pws, &again, TURN).await;
        let text = text_of_run(&pws, &again);
        assert!(
            text.contains("user turns seen: 2; first: hello parent"),
            "{text}"
        );
        assert_eq!(world.native_id(&parent).await, parent_native);
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 4: while the host's own app-server holds the thread, `codex exec resume` from a
/// terminal is refused by Codex itself (the host never touches the writer lock); once the host
/// has let go (a restart), the same outside resume goes through, and the host's next prompt
/// runs in a `thread/fork`.
#[test]
fn an_outside_codex_resume_is_refused_while_held_and_forked_from_after() {
    let Some(rt) = in_netns(
        Family::Codex,
        "an_outside_codex_resume_is_refused_while_held_and_forked_from_after",
    ) else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start(Family::Codex).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "hello codex").await;
        let thread = world.native_id(&session).await;

        let exec = |world: &World| {
            let agents = world.agents();
            let mut cmd = tokio::process::Command::new(agents.codex.unwrap());
            cmd.args(["exec", "--json", "--skip-git-repo-check", "resume", &thread])
                .arg("hello from exec")
                .env_clear()
                .envs(agents.env.iter().cloned())
                .envs(agents.family_env.iter().cloned())
                .current_dir(&world.work)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            cmd
        };
        // The host's app-server holds the thread: Codex refuses the second writer.
        let held = tokio::time::timeout(TURN, exec(&world).output())
            .await
            .unwrap()
            .unwrap();
        let said = String::from_utf8_lossy(&held.stdout).to_string()
            + &String::from_utf8_lossy(&held.stderr);
        assert!(!held.status.success(), "a second writer was let in: {said}");
        assert!(said.contains("active writer"), "{said}");
        // The host goes on in place.
        let run = world.send(&session, "still mine").await;
        run_end(&mut ws, &run, TURN).await;
        assert_eq!(world.native_id(&session).await, thread);
        drop(ws);

        // The host lets go; the terminal resumes the thread and adds a turn.
        world.restart().await;
        let outside = tokio::time::timeout(TURN, exec(&world).output())
            .await
            .unwrap()
            .unwrap();
        assert!(
            outside.status.success(),
            "{}",
            String::from_utf8_lossy(&outside.stderr)
        );
        let mut ws = world.follower(&session, false).await;
        let run = world.send(&session, "back in the host").await;
        run_end(&mut ws, &run, TURN).await;
        assert_eq!(run_end_of(&ws, &run)["state"], "completed");
        fork_warning(&ws, &run);
        assert_ne!(world.native_id(&session).await, thread);
        let text = text_of_run(&ws, &run);
        assert!(text.contains("first: hello codex"), "history lost: {text}");
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 5: a foreign append to an idle owned session's file is marked within 1 s, and a
/// turn's own writes never are. The wait below is the host's own timer, not a guess: Claude
/// writes a new session's file only after its turn ends, so the host starts reading it
/// [`SETTLE`](agent_host::session::actor::SETTLE) after the turn when it was not there yet.
#[test]
fn a_foreign_append_while_idle_is_marked_within_a_second() {
    let Some(rt) = in_netns(
        Family::Claude,
        "a_foreign_append_while_idle_is_marked_within_a_second",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, false).await;
        world.turn(&mut ws, &session, "one").await;
        world.turn(&mut ws, &session, "two").await;
        let native = world.native_id(&session).await;
        tokio::time::sleep(
            agent_host::session::actor::SETTLE + std::time::Duration::from_millis(500),
        )
        .await;
        let live = world
            .host()
            .ok("session.get", serde_json::json!({"session_id": session}))
            .await;
        assert_eq!(live["live"]["watching"], true, "{live}");
        assert_eq!(
            live["live"]["drifted"], false,
            "our own turns were taken for drift"
        );
        assert!(
            ws.seen.iter().all(|s| s.kind() != "warning"),
            "{:?}",
            ws.kinds()
        );

        let appended = std::time::Instant::now();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(session_file(&world, &native))
            .unwrap();
        std::io::Write::write_all(&mut file, b"{\"type\":\"user\",\"uuid\":\"foreign\"}\n")
            .unwrap();
        drop(file);
        ws.until("session_drifted", std::time::Duration::from_secs(1), |s| {
            s.kind() == "warning" && s.event["code"] == "session_drifted"
        })
        .await;
        eprintln!("marked {:?} after the append", appended.elapsed());
        let live = world
            .host()
            .ok("session.get", serde_json::json!({"session_id": session}))
            .await;
        assert_eq!(live["live"]["drifted"], true);
        world.host.unwrap().stop().await;
    });
}

/// Acceptance 5, during a turn: while the host's child streams a turn, an external `claude
/// --resume` runs a turn of its own on the same file. The host's child writes the file all along,
/// yet only the other prompt counts: the session is marked drifted during the host's turn (the
/// warning carries the host's run id), the host's turn ends as it would have, and the next
/// prompt runs in a fork that remembers the conversation. The original file is not written
/// after the fork decision.
#[test]
fn an_external_prompt_during_a_host_turn_is_seen_during_it() {
    let Some(rt) = in_netns(
        Family::Claude,
        "an_external_prompt_during_a_host_turn_is_seen_during_it",
    ) else {
        return;
    };
    rt.block_on(async {
        let world = World::start(Family::Claude).await;
        let session = world.session().await;
        let mut ws = world.follower(&session, true).await;
        world.turn(&mut ws, &session, "hello from the host").await;
        let native = world.native_id(&session).await;
        let slow = world.streaming(&mut ws, &session, "long answer").await;

        let (external, stdin) =
            external_turn(&world, &native, "typed during the host's turn").await;
        drop(stdin);
        let drift = ws
            .until("session_drifted", TURN, |s| {
                s.kind() == "warning" && s.event["code"] == "session_drifted"
            })
            .await;
        assert_eq!(
            drift.run_id, slow,
            "the warning names the running turn: {:?}",
            drift.event
        );
        let why = drift.event["message"].as_str().unwrap();
        assert!(
            why.contains("did not send") && why.contains(&native),
            "{why}"
        );
        assert!(
            ws.of_run(&slow).iter().all(|s| s.kind() != "run.end"),
            "seen only after the turn: {:?}",
            ws.kinds()
        );
        finish(external).await;

        // The host's turn is not cut short: it is cancelled here only to save time.
        world
            .host()
            .ok("session.cancel", serde_json::json!({"session_id": session}))
            .await;
        run_end(&mut ws, &slow, TURN).await;
        assert_eq!(run_end_of(&ws, &slow)["state"], "cancelled");

        let next = world.send(&session, "after the drift").await;
        run_end(&mut ws, &next, TURN).await;
        assert_eq!(run_end_of(&ws, &next)["state"], "completed");
        assert_ne!(world.native_id(&session).await, native);
        let text = text_of_run(&ws, &next);
        assert!(
            text.contains("first: hello from the host"),
            "history lost: {text}"
        );
        let file = session_file(&world, &native);
        let left = std::fs::read(&file).unwrap();
        world.host.unwrap().stop().await;
        let now = std::fs::read(&file).unwrap();
        assert!(
            now == left,
            "the original file was written after the fork ({} → {} bytes)",
            left.len(),
            now.len()
        );
    });
}
