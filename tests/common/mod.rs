//! An in-process host on a temp home (the real `agent_host::run`: store, bus, IPC, WebSocket),
//! for tests that need to publish events through its bus and restart it.

#![allow(dead_code, reason = "each test file uses part of this")]

pub mod agents;
pub mod apt;
pub mod browser;
pub mod mock_model;
pub mod nats;
pub mod reap;
pub mod relay;
pub mod world;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_host::bus::Bus;
use agent_host::clock::Clock;
use agent_host::config::Config;
use agent_host::protocol::envelope::Reply;
use agent_host::protocol::events::{BlockEnd, BlockStart, Event, EventBody, TextDelta};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const WAIT: Duration = Duration::from_secs(20);

/// What a host needs to run real agents: the environment it passes on (the spawn policy
/// filters it) and the binaries of the families it runs.
#[derive(Debug, Clone)]
pub struct Agents {
    pub env: Vec<(String, String)>,
    /// Variables the spawn policy would not pass, set for the families in `config.toml`
    /// (`[agents.<type>] env`), as a user does for a custom provider's key.
    pub family_env: Vec<(String, String)>,
    pub claude: Option<PathBuf>,
    pub codex: Option<PathBuf>,
}

pub struct TestHost {
    pub home: PathBuf,
    pub clock: Clock,
    pub agents: Option<Agents>,
    pub bus: Bus,
    pub ws_port: u16,
    pub relay: agent_host::relay::RelayHandle,
    pub fleet: agent_host::relay::fleet::FleetHandle,
    pub pairs: agent_host::seal::pairs::PairRegistry,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestHost {
    pub async fn start(home: &Path) -> TestHost {
        Self::start_with(home, Clock::manual()).await
    }

    pub async fn start_with(home: &Path, clock: Clock) -> TestHost {
        Self::start_full(home, clock, None).await
    }

    /// A host that runs real agents.
    pub async fn start_with_agents(home: &Path, agents: Agents) -> TestHost {
        Self::start_full(home, Clock::system(), Some(agents)).await
    }

    async fn start_full(home: &Path, clock: Clock, agents: Option<Agents>) -> TestHost {
        let mut config = Config::with_home(home).unwrap();
        config.clock = clock.clone();
        if let Some(agents) = &agents {
            config.env = agents.env.clone();
            for (family, binary) in [("claude", &agents.claude), ("codex", &agents.codex)] {
                if let Some(binary) = binary {
                    config.agents.insert(
                        family.to_owned(),
                        agent_host::config::AgentConfig {
                            binary: Some(binary.display().to_string()),
                            env: agents.family_env.iter().cloned().collect(),
                            ..Default::default()
                        },
                    );
                }
            }
        }
        let mut host = TestHost::start_config(config).await;
        host.agents = agents;
        host
    }

    /// A host on a configuration the caller made (its home, clock and sections as given;
    /// `Config::with_home` reads the home's `config.toml`). [`TestHost::restart`] starts it
    /// again from the home alone.
    pub async fn start_config(config: Config) -> TestHost {
        let home = config.home.clone();
        let clock = config.clock.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            agent_host::run(config, shutdown, ready_tx).await.unwrap();
        });
        let ready = tokio::time::timeout(WAIT, ready_rx).await.unwrap().unwrap();
        TestHost {
            home,
            clock,
            agents: None,
            bus: ready.bus,
            ws_port: ready.info.ws_port.unwrap(),
            relay: ready.relay,
            fleet: ready.fleet,
            pairs: ready.pairs,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Graceful shutdown, waiting until the host has fully stopped.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
    }

    pub async fn restart(mut self) -> TestHost {
        let home = self.home.clone();
        let agents = self.agents.take();
        self.stop().await;
        let clock = if agents.is_some() {
            Clock::system()
        } else {
            Clock::manual()
        };
        TestHost::start_full(&home, clock, agents).await
    }

    pub async fn ipc(&self, command: &str, params: Value) -> Reply {
        agent_host::ipc::request(
            &self.home.join("host.sock"),
            &json!({"command": command, "params": params}),
            WAIT,
        )
        .await
        .unwrap()
    }

    pub async fn ok(&self, command: &str, params: Value) -> Value {
        let reply = self.ipc(command, params).await;
        assert_eq!(reply.code, 0, "{command}: {}", reply.to_line());
        reply.data
    }

    pub async fn session(&self, dir: &Path) -> String {
        self.session_of("claude", dir).await
    }

    pub async fn session_of(&self, agent_type: &str, dir: &Path) -> String {
        let data = self
            .ok(
                "session.create",
                json!({"agent_type": agent_type, "cwd": dir.display().to_string()}),
            )
            .await;
        data["session_id"].as_str().unwrap().to_owned()
    }

    /// Publish and wait for the commit; the bracket's sequence id.
    pub async fn bracket(&self, event: &Event) -> i64 {
        self.bus
            .publish(event)
            .await
            .unwrap()
            .committed()
            .await
            .unwrap()
            .unwrap()
    }
}

pub fn text_end(session: &str, item: &str) -> Event {
    Event::new(
        session,
        Some("r1".into()),
        EventBody::TextEnd(BlockEnd {
            truncated: None,
            item_id: Some(item.into()),
            text: format!("text of {item}"),
            imported: false,
        }),
    )
}

pub fn text_start(session: &str, item: &str) -> Event {
    Event::new(
        session,
        Some("r1".into()),
        EventBody::TextStart(BlockStart {
            item_id: Some(item.into()),
        }),
    )
}

pub fn text_delta(session: &str, item: &str, text: &str) -> Event {
    Event::new(
        session,
        Some("r1".into()),
        EventBody::TextDelta(TextDelta {
            item_id: Some(item.into()),
            text: text.into(),
        }),
    )
}

/// The `itemId` of an event JSON.
pub fn item_of(json: &str) -> String {
    let v: Value = serde_json::from_str(json).unwrap();
    v["itemId"].as_str().unwrap_or_default().to_owned()
}

/// The reference relay (`examples/relay.rs`), its own process, listening on `listen`
/// (`127.0.0.1:0` for any port): the child and its `ws://127.0.0.1:PORT` URL.
pub async fn start_reference_relay(
    listen: &str,
    host_token: &str,
    bot_token: &str,
) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let path = Path::new(env!("CARGO_BIN_EXE_agent-host"))
        .parent()
        .unwrap()
        .join("examples")
        .join("relay");
    assert!(path.exists(), "{} not built", path.display());
    let mut child = tokio::process::Command::new(path)
        .args(["--listen", listen, "--host-token", host_token])
        .args(["--bot-token", bot_token])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = line
        .strip_prefix("relay listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    (child, url)
}
