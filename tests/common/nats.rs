//! A NATS server for tests: Debian's `nats-server` (2.9), installed through [`super::apt`] when
//! it does not run, started with JetStream on a free loopback port and its own store
//! directory, and killed when the handle drops. Waits for the server's "Server is ready" line
//! (bounded), not for time to pass.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a server may take to say it is ready.
const READY_WAIT: Duration = Duration::from_secs(20);

/// A running `nats-server -js`; killed on drop.
pub struct NatsServer {
    child: Child,
    /// `nats://127.0.0.1:PORT`
    pub url: String,
    pub port: u16,
    /// Where its log (stderr) is copied.
    pub log: PathBuf,
    store: tempfile::TempDir,
}

impl NatsServer {
    /// The JetStream store directory (`-sd`).
    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _gone = self.child.kill();
        let _reaped = self.child.wait();
    }
}

/// Install `nats-server` when missing, start one and wait until it accepts.
pub fn ensure_nats_server() -> NatsServer {
    super::apt::ensure_package("nats-server", "nats-server", || {
        super::apt::version_runs("nats-server")
    });
    // A free port is found by binding it and letting go; another process may take it in
    // between, so a server that fails to start is tried again on another one.
    let mut last = String::new();
    for _ in 0..3 {
        match start() {
            Ok(server) => return server,
            Err(e) => last = e,
        }
    }
    panic!("nats-server did not start: {last}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start() -> Result<NatsServer, String> {
    let store = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = store.path().join("nats-server.log");
    let mut child = Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store.path().join("js"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nats-server: {e}"))?;
    let stderr = child.stderr.take().unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut copy = std::fs::File::create(&log).unwrap();
    // Drains stderr for the server's whole life (a full pipe would stall it), copying it to
    // the log and saying when the ready line went by.
    std::thread::spawn(move || {
        let mut ready = Some(ready_tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _copied = writeln!(copy, "{line}");
            if line.contains("Server is ready")
                && let Some(tx) = ready.take()
            {
                let _told = tx.send(());
            }
        }
    });
    match ready_rx.recv_timeout(READY_WAIT) {
        Ok(()) => Ok(NatsServer {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            port,
            log,
            store,
        }),
        Err(_) => {
            let _gone = child.kill();
            let _reaped = child.wait();
            Err(std::fs::read_to_string(&log).unwrap_or_default())
        }
    }
}
