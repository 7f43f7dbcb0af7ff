//! `docs/agents.md`, generated from the conformance suite's results and checked by a test so
//! it cannot drift: `tests/suite/conformance.rs` runs the same cases over every agent of the registry
//! with its real CLI and writes `fixtures/conformance/<agent>.json` (what `agent.list` showed of
//! it, and each case's result); this module turns those files into the page. Nothing in the
//! page is written by hand but its introduction. `AGENT_HOST_BLESS=1 cargo test --lib
//! agents_md` rewrites it.

use std::path::Path;

use serde_json::Value;

/// The suite's cases in the order the page lists them, with what each proves.
const CASES: &[(&str, &str)] = &[
    (
        "probe_missing_binary",
        "a missing binary is `binary_unavailable`, naming the path tried",
    ),
    (
        "new_session_emits_id",
        "the first turn binds the native session id (`session.bound`)",
    ),
    (
        "multi_turn_continuity",
        "a second turn sees the first (the mock counts the turns it is sent)",
    ),
    (
        "resume_after_process_restart",
        "after a host restart the conversation goes on in the same native session",
    ),
    (
        "resume_wrong_workspace_rejected",
        "a native session is never resumed in another workspace: once the session's \
         workspace changed (another git `origin`) its prompt is refused before any agent runs \
         (`workspace_changed`, `resume_rejected`); where the agent's files say a session's \
         cwd, an import into another one is refused (`binding_mismatch`)",
    ),
    (
        "resume_rejected_fallback",
        "a native session the agent does not have (an imported id it never had where an \
         import reaches the agent, else its own files of the session deleted): a visible \
         `resume_rejected`, then the prompt runs in a fresh session",
    ),
    (
        "tool_activity_visible",
        "a command the agent runs shows as tool events, live and in the history",
    ),
    (
        "permission_roundtrip",
        "the agent asks, a client answers, the tool runs",
    ),
    (
        "cancel_keeps_session",
        "a cancelled turn ends `cancelled` and the next turn works",
    ),
    (
        "fork",
        "a fork continues the conversation without writing the parent's",
    ),
    (
        "result_exactly_once_to_caller",
        "a retried prompt (same `client_msg_id`) is one run with one result",
    ),
    (
        "rate_limited",
        "the provider's 429 ends the run `failed`, `rate_limited`; the next turn works",
    ),
    (
        "auth_required",
        "the provider's 401 ends the run `failed`, `auth_required`; the next turn works",
    ),
    (
        "transport_lost",
        "a model stream cut mid-reply ends the run `failed`, `transport_lost`",
    ),
    (
        "transport_uncertainty",
        "the agent killed mid-answer: `result_delivery_unknown`, `session.run` says so by \
         `client_msg_id`, a resend runs nothing, the next turn works",
    ),
    (
        "close_reaps_process_tree",
        "deleting a session mid-turn leaves no process of its agent",
    ),
    (
        "stdout_protocol_purity",
        "lines on the agent's stdout that are not its protocol are skipped, never published",
    ),
    (
        "unknown_event_forward_compatible",
        "event and notification types this build does not know are skipped; the turn goes on",
    ),
    (
        "redaction",
        "the agent's credential reaches no file of the host",
    ),
];

fn results_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/conformance")
}

/// Every agent's results, in the registry's order (as the suite names them).
fn results() -> Vec<Value> {
    let mut all: Vec<Value> = std::fs::read_dir(results_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    let order = |v: &Value| {
        let agent_type = v["agent_type"].as_str().unwrap_or_default();
        super::family::FAMILIES
            .iter()
            .position(|f| f.descriptor().agent_type == agent_type)
            .unwrap_or(usize::MAX)
    };
    all.sort_by_key(|v| (order(v), v["agent"].as_str().unwrap_or_default().to_owned()));
    all
}

fn resume_of(caps: &Value, declared: &Value) -> String {
    match caps["resume"].as_str() {
        Some("native_id") if caps["binding"] == true => {
            "native (by native id; the file is checked first)".to_owned()
        }
        Some("native_id") => "native (by native id)".to_owned(),
        Some("negotiated") => match (declared["resume"] == true, declared["load"] == true) {
            (true, true) => "native (`session/resume`, else `session/load`)".to_owned(),
            (true, false) => "native (`session/resume`)".to_owned(),
            (false, true) => "native (`session/load`; its replay is not republished)".to_owned(),
            _ => "degraded: a fresh session and a visible `resume_rejected` warning".to_owned(),
        },
        _ => "degraded: a fresh session and a `resume_unsupported` warning".to_owned(),
    }
}

fn fork_of(caps: &Value, declared: &Value) -> String {
    match caps["fork"].as_str() {
        Some("native") => "native".to_owned(),
        Some("negotiated") if declared["fork"] == true => "native (`session/fork`)".to_owned(),
        _ => "degraded: a new session and a `fork_unsupported` warning".to_owned(),
    }
}

fn yes(v: &Value, what: &str) -> String {
    if *v == true {
        format!("native{what}")
    } else {
        "absent".to_owned()
    }
}

/// The session options each agent takes (`capabilities.options`): `session.create`'s options,
/// `session.set_model`, and attachments. An option an agent does not take is refused
/// `option_unsupported` at create (or send), never ignored.
fn options_table(all: &[Value]) -> String {
    let mut out = String::from(
        "\n## Session options\n\n\
         What each agent does with `session.create`'s options, `session.set_model` and \
         `session.send`'s attachments (`docs/protocol.md`, \"Session options\"): *native*: \
         passed in the agent's own form; *negotiated*: as the agent declares when it starts \
         (asked before `session.create` answers); *absent*: refused `option_unsupported`.\n\n\
         | agent | model | set_model | system_prompt | MCP stdio | MCP http | MCP sse | \
         permission modes | images | files |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in all {
        let o = &r["agent_list"]["capabilities"]["options"];
        let text = |v: &Value| v.as_str().unwrap_or("absent").replace('_', " ");
        let modes = o["permission_modes"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(Value::as_str)
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        // A family that never asks lists none (an explicit `ask` is refused).
        let modes = if modes.is_empty() {
            "none (it never asks: its declared policy)".to_owned()
        } else {
            modes
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["agent"].as_str().unwrap_or_default(),
            text(&o["model"]),
            text(&o["set_model"]),
            text(&o["system_prompt"]),
            text(&o["mcp_stdio"]),
            text(&o["mcp_http"]),
            text(&o["mcp_sse"]),
            modes,
            text(&o["images"]),
            text(&o["files"]),
        ));
    }
    out
}

/// The whole of `docs/agents.md`.
pub fn agents_markdown() -> String {
    let all = results();
    let mut out = String::from(
        "# Agents: what each one can do through agent-host\n\n\
         Generated by `cargo test --lib agents_md` from the results of the conformance suite \
         (`tests/suite/conformance.rs`), which runs the same cases over every agent below with its \
         real, pinned CLI through the whole host, offline against the project's mock model. \
         *native*: the agent does it and the host uses it; *degraded*: the host does the \
         closest honest thing and says so on the session; *absent*: not available. *steer* \
         native: `session.steer` injects into the running turn (Codex `turn/steer`); for the \
         others the text is queued at the head of the session's queue with a \
         `steer_unsupported` warning (what each CLI does with input mid-turn is recorded in \
         its family's descriptor, from `tests/suite/steer.rs`).\n\n\
         | agent | `agent_type` | version | protocol | process | resume | fork | permissions | cancel | steer |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in &all {
        let listed = &r["agent_list"];
        let caps = &listed["capabilities"];
        let declared = &listed["declared"];
        let registered = if listed["registered"] == true {
            " (registered in `config.toml`)"
        } else {
            ""
        };
        let permissions = if caps["permissions"] == true {
            "native (the agent asks; any client answers)".to_owned()
        } else {
            format!(
                "a declared policy: {}",
                listed["permission_policy"].as_str().unwrap_or("none")
            )
        };
        out.push_str(&format!(
            "| {} | `{}`{} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["agent"].as_str().unwrap_or_default(),
            r["agent_type"].as_str().unwrap_or_default(),
            registered,
            r["version"].as_str().unwrap_or_default(),
            listed["protocol"].as_str().unwrap_or_default(),
            match caps["process"].as_str() {
                Some("per_turn") => "one per turn, resumed by id",
                _ => "one per session",
            },
            resume_of(caps, declared),
            fork_of(caps, declared),
            permissions,
            yes(&caps["cancel"], ""),
            yes(&caps["steer"], ""),
        ));
    }
    out.push_str(&options_table(&all));
    out.push_str("\n## Conformance\n\nEach case, for each agent: *pass*; *pass (…)* says how; ");
    out.push_str("*n/a* is a case the agent's declared capabilities, or what its real CLI does, ");
    out.push_str("rule out, with the reason below. A case that fails fails the test run, so ");
    out.push_str("none is listed here.\n\n");
    out.push_str("| case | what it proves |");
    for r in &all {
        out.push_str(&format!(" {} |", r["agent"].as_str().unwrap_or_default()));
    }
    out.push_str("\n| --- | --- |");
    for _ in &all {
        out.push_str(" --- |");
    }
    out.push('\n');
    let mut reasons: Vec<String> = Vec::new();
    for (case, what) in CASES {
        out.push_str(&format!("| `{case}` | {what} |"));
        for r in &all {
            let result = &r["cases"][case];
            let cell = match result["result"].as_str() {
                Some("pass") => match result["how"].as_str() {
                    Some(how) => format!("pass ({how})"),
                    None => "pass".to_owned(),
                },
                Some("not_applicable") => {
                    let why = format!(
                        "`{case}`: {}",
                        result["because"].as_str().unwrap_or_default()
                    );
                    let n = reasons.iter().position(|w| *w == why).unwrap_or_else(|| {
                        reasons.push(why);
                        reasons.len() - 1
                    });
                    format!("n/a ({})", n + 1)
                }
                _ => "not run".to_owned(),
            };
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    if !reasons.is_empty() {
        out.push_str("\nNot applicable:\n\n");
        for (i, why) in reasons.iter().enumerate() {
            out.push_str(&format!("{}. {why}\n", i + 1));
        }
    }
    out.push_str(
        "\nAny other ACP agent is read the same way when it starts: `agent.list` probes it with \
         `initialize` and shows what it declared. A user registers one in `config.toml`:\n\n\
         ```toml\n[agents.my-agent]\ncommand = [\"my-agent\", \"--acp\"]\nprotocol = \"acp\"   \
         # or \"claude-stream-json\", \"codex-app-server\"\nenv = { MY_AGENT_KEY = \"…\" }\n```\n\n\
         Session files: Claude's and Codex's are located and guarded (`docs/architecture.md`, \
         \"Ownership\"), and a native session is imported only in the cwd they place it in. \
         For every agent, a session whose workspace changed since it was bound is not resumed \
         there (`docs/architecture.md`, \"Binding\"). ACP defines no file format; for ACP \
         agents the host otherwise relies on the agent's own refusal (an error on \
         `session/load` or `session/resume` is a visible `resume_rejected`). \
         `docs/adding-an-agent.md` says how a family is added.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_md_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/agents.md");
        let want = agents_markdown();
        if std::env::var_os("AGENT_HOST_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/agents.md is stale: run `AGENT_HOST_BLESS=1 cargo test --lib agents_md`"
        );
    }

    #[test]
    fn every_built_in_family_has_conformance_results() {
        let all = results();
        for family in super::super::family::FAMILIES {
            let agent_type = family.descriptor().agent_type;
            let found = all.iter().find(|r| r["agent_type"] == agent_type);
            let Some(found) = found else {
                panic!("no results in fixtures/conformance for {agent_type}");
            };
            // Every case has a result: a pass, or a reason it does not apply.
            for (case, _) in CASES {
                let result = found["cases"][case]["result"].as_str();
                assert!(
                    matches!(result, Some("pass" | "not_applicable")),
                    "{agent_type} {case}: {result:?}"
                );
            }
            // What the page says it can do is what the build declares now.
            let declared = serde_json::to_value(family.descriptor().capabilities).unwrap();
            assert_eq!(
                found["agent_list"]["capabilities"], declared,
                "{agent_type}"
            );
        }
    }
}
