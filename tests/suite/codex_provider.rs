//! Provider settings that just work (issue 20, acceptance 1), with the real Codex CLI (pinned
//! in agents/package.json) through the whole host: Codex's own `config.toml` names a custom
//! provider whose key, `X_KEY`, is only in the host's environment (no `[agents.codex] env`).
//! With it, two turns succeed and the model is sent the key as Codex sends it; without it, the
//! turn fails and its `error` and `run.end` (live, and in `session.history`'s reply) say
//! which variable is missing and where to set it. Each test runs inside its own loopback-only
//! network namespace against the project's mock model, behind a forwarder here that keeps the
//! head of every request (the mock keeps only bodies).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failing test should panic"
)]

use crate::common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::agents::{codex_env, ensure_codex, write_codex_config};
use common::mock_model::MockModel;
use common::world::{Family, TURN, follow, in_netns, run_end, text_of_run};
use common::{Agents, TestHost};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The key's value in the host's environment.
const KEY: &str = "x-key-from-the-hosts-env";

/// A forwarder on 127.0.0.1 in front of `mock`: the head of each request it passes on (the
/// request line and headers), in arrival order.
struct Recorder {
    url: String,
    heads: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    async fn start(mock: &MockModel) -> Recorder {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = mock.addr;
        let heads = Arc::new(Mutex::new(Vec::new()));
        let kept = heads.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let _ = forward(client, upstream, kept).await;
                });
            }
        });
        Recorder { url, heads, task }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// Read the request head, keep it, and pass the connection on to `upstream` as it is.
async fn forward(
    mut client: TcpStream,
    upstream: std::net::SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let mut read = Vec::new();
    let mut chunk = [0u8; 4096];
    while !read.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        read.extend_from_slice(&chunk[..n]);
    }
    let end = read.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    heads
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&read[..end]).into_owned());
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(&read).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

/// Codex's `config.toml` under `home/.codex`: the project's mock config, with the provider's
/// key in `X_KEY` and the model reached through `recorder`.
fn write_config(home: &Path, mock: &MockModel, recorder: &Recorder) {
    let codex_home = home.join(".codex");
    write_codex_config(&codex_home, mock);
    let path = codex_home.join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("env_key = \"MOCK_API_KEY\""), "{text}");
    let text = text
        .replace("env_key = \"MOCK_API_KEY\"", "env_key = \"X_KEY\"")
        .replace(&mock.base_url(), &recorder.url);
    std::fs::write(&path, text).unwrap();
}

/// A host whose environment is Codex's offline one, with `X_KEY` set to `key` (or not at
/// all), and no `[agents.codex] env`.
async fn host(dir: &Path, mock: &MockModel, recorder: &Recorder, key: Option<&str>) -> TestHost {
    let home = dir.join("agent-home");
    std::fs::create_dir_all(&home).unwrap();
    write_config(&home, mock, recorder);
    let mut env: Vec<(String, String)> = codex_env(&home, mock)
        .into_iter()
        .filter(|(k, _)| k != "MOCK_API_KEY")
        .collect();
    if let Some(key) = key {
        env.push(("X_KEY".to_owned(), key.to_owned()));
    }
    let agents = Agents {
        env,
        family_env: Vec::new(),
        claude: None,
        codex: Some(ensure_codex()),
    };
    let host = TestHost::start_with_agents(&dir.join("host"), agents).await;
    let host_config = dir.join("host").join("config.toml");
    assert!(
        !std::fs::read_to_string(&host_config)
            .unwrap_or_default()
            .contains("[agents"),
        "the host's config.toml sets no agent env"
    );
    host
}

#[test]
fn codex_gets_its_custom_providers_key_from_the_hosts_environment() {
    let Some(rt) = in_netns(
        Family::Codex,
        "codex_gets_its_custom_providers_key_from_the_hosts_environment",
    ) else {
        return;
    };
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let mock = MockModel::start(0).await.unwrap();
        let recorder = Recorder::start(&mock).await;
        let host = host(dir.path(), &mock, &recorder, Some(KEY)).await;
        let session = host.session_of("codex", &work).await;
        let mut ws = follow(&host, &session, false).await;
        let mut runs = Vec::new();
        for text in ["first with the host's key", "second with the host's key"] {
            let data = host
                .ok("session.send", json!({"session_id": session, "text": text}))
                .await;
            let run = data["run_id"].as_str().unwrap().to_owned();
            let end = run_end(&mut ws, &run, TURN).await;
            assert_eq!(end["state"], "completed", "{end}");
            runs.push(run);
        }
        assert_eq!(
            text_of_run(&ws, &runs[1]),
            "echo: second with the host's key [user turns seen: 2; first: first with the \
             host's key]"
        );
        // Codex sent the key as the provider's bearer token, on every model request.
        let responses: Vec<String> = recorder
            .heads()
            .into_iter()
            .filter(|h| h.starts_with("POST /v1/responses"))
            .collect();
        assert!(responses.len() >= 2, "{responses:#?}");
        for head in &responses {
            let auth = head
                .lines()
                .find_map(|l| {
                    l.split_once(':')
                        .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
                })
                .map(|(_, v)| v.trim().to_owned());
            assert_eq!(auth.as_deref(), Some(&*format!("Bearer {KEY}")), "{head}");
        }
        host.stop().await;
    });
}

#[test]
fn without_the_key_the_error_says_which_variable_and_where_to_set_it() {
    let Some(rt) = in_netns(
        Family::Codex,
        "without_the_key_the_error_says_which_variable_and_where_to_set_it",
    ) else {
        return;
    };
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let mock = MockModel::start(0).await.unwrap();
        let recorder = Recorder::start(&mock).await;
        let host = host(dir.path(), &mock, &recorder, None).await;
        let session = host.session_of("codex", &work).await;
        let mut ws = follow(&host, &session, false).await;
        let data = host
            .ok(
                "session.send",
                json!({"session_id": session, "text": "no key anywhere"}),
            )
            .await;
        let run = data["run_id"].as_str().unwrap().to_owned();
        let end = run_end(&mut ws, &run, TURN).await;
        assert_eq!(end["state"], "failed", "{end}");
        let host_config = dir.path().join("host").join("config.toml");
        let codex_config = dir.path().join("agent-home/.codex/config.toml");
        let check = |what: &str, message: &str| {
            for part in [
                // Codex's own words first.
                "Missing environment variable: `X_KEY`.".to_owned(),
                format!(
                    "hint: X_KEY (named by `env_key` of `[model_providers.mock]` in {})",
                    codex_config.display()
                ),
                "was not in agent-host's environment".to_owned(),
                "restart the host with X_KEY set in its environment".to_owned(),
                format!(
                    "{}: [agents.codex] env = {{ X_KEY = \"…\" }}",
                    host_config.display()
                ),
            ] {
                assert!(
                    message.contains(&part),
                    "{what}: {part:?} not in {message:?}"
                );
            }
            assert!(
                message.starts_with("Missing environment variable"),
                "{what}: {message}"
            );
        };
        check("run.end", end["message"].as_str().unwrap());
        assert_eq!(end["category"], "auth_required", "{end}");
        let error = ws
            .of_run(&run)
            .into_iter()
            .find(|s| s.kind() == "error")
            .unwrap_or_else(|| panic!("no error event: {:#?}", ws.kinds()))
            .event
            .clone();
        check("error", error["message"].as_str().unwrap());
        assert_eq!(error["category"], "auth_required", "{error}");
        // The same words in a command's reply: the session's history.
        let history = host
            .ok("session.history", json!({"session_id": session}))
            .await;
        let stored: Vec<&Value> = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "error" || e["kind"] == "run.end")
            .collect();
        assert_eq!(stored.len(), 2, "{history}");
        for event in stored {
            let text = event.to_string();
            assert!(
                text.contains("hint: X_KEY") && text.contains("[agents.codex] env"),
                "{text}"
            );
        }
        // Codex refused before asking the model.
        assert!(
            recorder
                .heads()
                .iter()
                .all(|h| !h.starts_with("POST /v1/responses")),
            "{:#?}",
            recorder.heads()
        );
        host.stop().await;
    });
}
