//! Issue 17, acceptance 2, with the real `claude` and `codex` CLIs against the project's mock
//! model: a `permission.request` lists the agent's own options; an "allow always"-style option
//! chosen from one client (IPC) reaches the agent natively, a second client (a WebSocket
//! subscriber) sees the rule in `permission.resolved` and in `session.get`, and the next
//! matching tool call of the session runs without a new `permission.request`. Each test runs
//! inside its own loopback-only network namespace.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use common::world::{Family, Follower, TURN, World, in_netns, run_end};
use serde_json::{Value, json};

/// One turn that asks: the request's options, and the always option `pick` chooses among them.
async fn ask(
    world: &World,
    ws: &mut Follower,
    session: &str,
    prompt: &str,
    pick: impl Fn(&[Value]) -> Option<Value>,
) -> (String, String, Value) {
    let run = world.send(session, prompt).await;
    let id = run.clone();
    let request = ws
        .until("the permission request", TURN, |s| {
            s.kind() == "permission.request" && s.run_id == id
        })
        .await;
    let options = request.event["options"].as_array().cloned().unwrap();
    for option in &options {
        assert!(
            option["id"].is_string() && option["label"].is_string(),
            "{option}"
        );
        assert!(
            ["allow_once", "allow_always", "reject_once", "reject_always"]
                .contains(&option["kind"].as_str().unwrap()),
            "{option}"
        );
    }
    assert!(
        options.iter().any(|o| o["kind"] == "allow_once")
            && options.iter().any(|o| o["kind"] == "reject_once"),
        "{options:?}"
    );
    let always = pick(&options).unwrap_or_else(|| panic!("no always option in {options:?}"));
    assert_eq!(always["kind"], "allow_always");
    let request_id = request.event["requestId"].as_str().unwrap().to_owned();
    (run, request_id, always)
}

/// The whole scenario for one family: `prompt` asks, the always option `pick` chooses is taken
/// over IPC, the WebSocket follower sees the rule, and the same prompt again runs its tool with
/// no request.
async fn always_allowed(
    family: Family,
    prompt: &str,
    marker: &str,
    made: &str,
    pick: impl Fn(&[Value]) -> Option<Value>,
) {
    let world = World::start(family).await;
    let session = world.session().await;
    let mut ws = world.follower(&session, false).await;

    let (first, request_id, always) = ask(&world, &mut ws, &session, prompt, pick).await;
    let option_id = always["id"].as_str().unwrap().to_owned();
    // An option the request does not offer is refused, and the request stays pending.
    let refused = world
        .host()
        .ipc(
            "permission.respond",
            json!({"session_id": session, "request_id": request_id, "option_id": "no-such-option"}),
        )
        .await;
    assert_eq!(
        refused.data["error"],
        "invalid_params",
        "{}",
        refused.to_line()
    );
    assert_eq!(refused.data["reason"], "unknown_option");
    // Chosen from the terminal (IPC).
    let receipt = world
        .host()
        .ok(
            "permission.respond",
            json!({"session_id": session, "request_id": request_id, "option_id": option_id}),
        )
        .await;
    assert_eq!(receipt["decision"], "allow", "{receipt}");
    assert_eq!(receipt["option_id"], option_id.as_str());
    let rule = receipt["rule"]
        .as_str()
        .expect("the receipt names the rule")
        .to_owned();
    assert_eq!(run_end(&mut ws, &first, TURN).await["state"], "completed");
    let of_first = ws.of_run(&first);
    let resolved = of_first
        .iter()
        .find(|s| s.kind() == "permission.resolved")
        .unwrap();
    assert_eq!(resolved.event["by"], "ipc");
    assert_eq!(resolved.event["optionId"], option_id.as_str());
    assert_eq!(resolved.event["kind"], "allow_always");
    assert_eq!(resolved.event["rule"], rule.as_str());
    let exec = of_first
        .iter()
        .find(|s| s.kind() == "tool.exec.end")
        .unwrap();
    assert!(
        exec.event["output"].as_str().unwrap().contains(marker),
        "{}",
        exec.event
    );
    assert!(world.work.join(made).exists());
    std::fs::remove_file(world.work.join(made)).unwrap();

    // The WebSocket client sees the rule on the session.
    let detail = ws.ok("session.get", json!({"session_id": session})).await;
    let rules = detail["permission_rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{detail}");
    assert_eq!(rules[0]["option_id"], option_id.as_str());
    assert_eq!(rules[0]["request_id"], request_id.as_str());
    assert_eq!(rules[0]["description"], rule.as_str());
    assert_eq!(rules[0]["by"], "ipc");
    assert!(rules[0]["at_ms"].as_i64().unwrap() > 0);

    // The next matching tool runs without asking.
    let second = world.send(&session, prompt).await;
    assert_eq!(run_end(&mut ws, &second, TURN).await["state"], "completed");
    let of_second = ws.of_run(&second);
    let kinds: Vec<&str> = of_second.iter().map(|s| s.kind()).collect();
    assert!(
        !kinds.contains(&"permission.request"),
        "the agent asked again: {kinds:?}"
    );
    let exec = of_second
        .iter()
        .find(|s| s.kind() == "tool.exec.end")
        .unwrap_or_else(|| panic!("no tool ran: {kinds:?}"));
    assert_eq!(exec.event["isError"], false, "{}", exec.event);
    assert!(
        exec.event["output"].as_str().unwrap().contains(marker),
        "{}",
        exec.event
    );
    assert!(
        world.work.join(made).exists(),
        "the second call did not run"
    );
    // Still one rule, over IPC too.
    let detail = world
        .host()
        .ok("session.get", json!({"session_id": session}))
        .await;
    assert_eq!(detail["permission_rules"].as_array().unwrap().len(), 1);
    world.host.unwrap().stop().await;
}

/// Claude Code: `can_use_tool`'s permission suggestions become an `allow_always` option; chosen,
/// the CLI keeps the rule for the session and the same command runs next time unasked.
#[test]
fn claude_always_allow_is_honoured_and_shown() {
    let Some(rt) = in_netns(Family::Claude, "claude_always_allow_is_honoured_and_shown") else {
        return;
    };
    rt.block_on(always_allowed(
        Family::Claude,
        "TOOLCALL `touch rule-made && echo rule-out`",
        "rule-out",
        "rule-made",
        |options| {
            options
                .iter()
                .find(|o| o["kind"] == "allow_always")
                .cloned()
        },
    ));
}

/// Codex: the approval request's decisions are the options (with `acceptForSession`, which
/// Codex takes though its escalation requests do not list it); chosen, the same escalated
/// command runs next time unasked.
#[test]
fn codex_always_allow_is_honoured_and_shown() {
    let Some(rt) = in_netns(Family::Codex, "codex_always_allow_is_honoured_and_shown") else {
        return;
    };
    rt.block_on(always_allowed(
        Family::Codex,
        "TOOLCALL ESCALATE `touch rule-made && echo rule-out`",
        "rule-out",
        "rule-made",
        |options| {
            options
                .iter()
                .find(|o| o["id"] == "acceptForSession")
                .cloned()
        },
    ));
}
