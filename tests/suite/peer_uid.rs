//! A peer of another user on the host's Unix sockets (`host.sock`, `ws.sock`) is refused by
//! its credentials, even when the home's and the sockets' modes were loosened so that it can
//! connect at all.
//!
//! The host is the real binary (`agent-host host.start`, temp home). The other user is
//! `nobody` (uid 65534): a copy of the real CLI runs as it for `host.sock`, and `node` (which
//! the agents need anyway) speaks a raw WebSocket upgrade as it for `ws.sock`. The same two
//! clients run as the host's own user beside them, so what refuses is the uid and nothing
//! else. Switching to another uid needs root (as CI runs); as another user the test says so
//! and checks nothing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    reason = "test code: a panic is the failure report (clippy's allow-*-in-tests does not reach helpers of an integration test)"
)]

use crate::common::reap;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-host");
const NOBODY: u32 = 65534;

/// A raw WebSocket upgrade over a Unix socket: prints the response head's first line, then
/// the body (a refusal's reason), or `101` alone once upgraded.
const UPGRADE_JS: &str = r#"
const [socket, token] = process.argv.slice(1);
const conn = require('net').connect(socket);
let got = '';
conn.on('connect', () => conn.write(
  'GET /subscribe HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n' +
  'Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n' +
  'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n' +
  'Authorization: Bearer ' + token + '\r\n\r\n'));
conn.on('data', (d) => {
  got += d.toString();
  if (got.startsWith('HTTP/1.1 101') && got.includes('\r\n\r\n')) {
    process.stdout.write('101', () => process.exit(0));
  }
});
conn.on('error', (e) => { process.stdout.write(got + '\nerror: ' + e.message); process.exit(0); });
conn.on('close', () => process.stdout.write(got, () => process.exit(0)));
setTimeout(() => { process.stdout.write(got + '\ntimeout'); process.exit(0); }, 10000);
"#;

/// The real host in a temp home, killed on drop if the test left it running.
struct Host {
    _dir: tempfile::TempDir,
    home: PathBuf,
}

impl Host {
    fn start() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let host = Host { _dir: dir, home };
        host.cli_ok("host.start", None);
        host
    }

    /// The CLI as the host's own user; `code` 0 expected.
    fn cli_ok(&self, command: &str, params: Option<&str>) -> Value {
        let output = Command::new(BIN)
            .arg(command)
            .args(params)
            .env("AGENT_HOST_HOME", &self.home)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let reply = reply_of(&output);
        assert_eq!(reply["code"], json!(0), "agent-host {command}: {reply}");
        reply["data"].clone()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        reap::kill_lock_holder(&self.home.join("host.lock"));
    }
}

fn reply_of(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim_end()).unwrap_or_else(|e| {
        panic!(
            "not a reply line ({e}): {stdout} (stderr: {})",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `program` as `uid` (its own group too), or as this process's user when `None`.
fn run_as(uid: Option<u32>, program: &Path, args: &[&str], home: &Path) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("AGENT_HOST_HOME", home)
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::null());
    if let Some(uid) = uid {
        // As root, std drops the supplementary groups too.
        cmd.uid(uid).gid(uid);
    }
    cmd.output().unwrap()
}

#[test]
fn another_users_peer_is_refused_on_both_sockets() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "another_users_peer_is_refused_on_both_sockets needs root to act as uid {NOBODY}"
        );
        return;
    }
    let host = Host::start();
    let subscriber = host.cli_ok(
        "subscriber.add",
        Some(r#"{"type":"local","forward_deltas":true,"replay_mode":"none"}"#),
    );
    let token = subscriber["ws_token"].as_str().unwrap().to_owned();
    let ws_socket = subscriber["ws_socket"].as_str().unwrap().to_owned();
    assert_eq!(Path::new(&ws_socket), host.home.join("ws.sock"));

    // Loosen what normally keeps another user out: the home (0700) and both sockets (0600),
    // and the temp directory above the home (whatever the umask made it).
    chmod(host.home.parent().unwrap(), 0o755);
    chmod(&host.home, 0o755);
    chmod(&host.home.join("host.sock"), 0o666);
    chmod(&host.home.join("ws.sock"), 0o666);
    // A copy of the CLI where the other user may run it (the build tree may be under /root).
    let bin_dir = tempfile::tempdir().unwrap();
    chmod(bin_dir.path(), 0o755);
    let cli = bin_dir.path().join("agent-host");
    std::fs::copy(BIN, &cli).unwrap();
    chmod(&cli, 0o755);

    // host.sock: the other user's request is read and answered `peer_refused`, not handled.
    let refused = run_as(Some(NOBODY), &cli, &["host.status"], &host.home);
    let reply = reply_of(&refused);
    assert_eq!(reply["code"], json!(1016), "{reply}");
    assert_eq!(reply["data"]["error"], json!("peer_refused"), "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .ends_with(&format!("the peer's uid is {NOBODY}")),
        "{reply}"
    );
    assert!(!refused.status.success());
    // Nor is a command that would change something: a grant of its own.
    let grant = r#"{"type":"local","forward_deltas":true,"replay_mode":"none"}"#;
    let added = reply_of(&run_as(
        Some(NOBODY),
        &cli,
        &["subscriber.add", grant],
        &host.home,
    ));
    assert_eq!(added["data"]["error"], json!("peer_refused"), "{added}");
    // The same copy, as the host's own user, through the same loosened socket.
    let own = reply_of(&run_as(None, &cli, &["host.status"], &host.home));
    assert_eq!(own["code"], json!(0), "{own}");
    assert_eq!(own["data"]["running"], json!(true), "{own}");

    // ws.sock: a valid token does not help another user; it reads a 403 that says why.
    let node = Path::new("node");
    let upgrade = |uid| {
        let out = run_as(
            uid,
            node,
            &["-e", UPGRADE_JS, &ws_socket, &token],
            &host.home,
        );
        assert!(
            out.status.success(),
            "node: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let refused = upgrade(Some(NOBODY));
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(
        refused.contains(&format!(
            "peer_refused: this host serves its own user (uid 0) only; the peer's uid is {NOBODY}"
        )),
        "{refused}"
    );
    assert_eq!(upgrade(None), "101");

    // Nothing the other user sent was taken: the host answers, and it still has its one
    // subscriber (no grant for the other user).
    let status = host.cli_ok("host.status", None);
    assert_eq!(status["running"], json!(true), "{status}");
    let subscribers = host.cli_ok("subscriber.list", None);
    assert_eq!(
        subscribers["subscribers"].as_array().map(Vec::len),
        Some(1),
        "{subscribers}"
    );
    host.cli_ok("host.shutdown", None);
}
