//! One `agent-host-relay` process for tests (the real binary): started on a free loopback port
//! against a NATS server with the given tokens, its own code logging at `trace` to its own
//! file, ready once it prints the URL it listens on (a bounded wait on that line).

use std::path::{Path, PathBuf};

use tokio::io::AsyncBufReadExt;

use super::WAIT;
use super::nats::NatsServer;

pub struct Relay {
    pub child: tokio::process::Child,
    /// `ws://127.0.0.1:PORT`
    pub url: String,
    pub log: PathBuf,
    pub instance: String,
}

impl Relay {
    /// Instance `instance`, its log `<dir>/<instance>.log`.
    pub async fn start(
        nats: &NatsServer,
        instance: &str,
        dir: &Path,
        host_token: &str,
        bot_token: &str,
    ) -> Relay {
        let log = dir.join(format!("{instance}.log"));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-host-relay"))
            .args(["--listen", "127.0.0.1:0", "--nats", &nats.url])
            .args(["--host-token", host_token, "--bot-token", bot_token])
            .args(["--instance", instance])
            .arg("--log-file")
            .arg(&log)
            .env("AGENT_HOST_LOG", "agent_host=trace,info")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the relay says it listens in time")
            .unwrap()
            .unwrap_or_else(|| panic!("relay exited: {}", read(&log)));
        let url = line
            .strip_prefix("relay listening on ")
            .unwrap_or_else(|| panic!("{line}"))
            .to_owned();
        Relay {
            child,
            url,
            log,
            instance: instance.to_owned(),
        }
    }

    pub fn host_url(&self) -> String {
        format!("{}/host", self.url)
    }

    pub fn bot_url(&self) -> String {
        format!("{}/bot", self.url)
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("ws://")
    }

    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        read(&self.log)
    }

    /// SIGKILL: the instance dies without a word.
    pub async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM: a clean exit, status 0, in time.
    pub async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the relay stops in time after SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}: {}", read(&self.log));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
